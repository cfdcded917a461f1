package schemas

import (
	"fmt"
	"strings"
)

// MaxFeedbackBytes bounds the feedback text given to an agent; the newest
// iterations are kept when it is longer.
const MaxFeedbackBytes = 16 << 10

// Bounds of the feedback carried in job requests, which must stay far below
// the event size limit however many iterations a step runs.
const (
	MaxFeedbackEntries = 10
	maxFeedbackMessage = 4 << 10
	maxFeedbackErrors  = 50
	maxErrorMessage    = 512
)

// BoundFeedback keeps the newest MaxFeedbackEntries entries, at most 50
// errors each, and shortens long messages (keeping their ends, where
// output tails put the useful lines). It returns a new slice.
func BoundFeedback(fb []Feedback) []Feedback {
	if len(fb) > MaxFeedbackEntries {
		fb = fb[len(fb)-MaxFeedbackEntries:]
	}
	out := make([]Feedback, len(fb))
	for i, f := range fb {
		if len(f.Message) > maxFeedbackMessage {
			f.Message = "…" + f.Message[len(f.Message)-maxFeedbackMessage:]
		}
		if len(f.RetryHint) > maxFeedbackMessage {
			f.RetryHint = f.RetryHint[:maxFeedbackMessage] + "…"
		}
		errs := f.Errors
		if len(errs) > maxFeedbackErrors {
			errs = errs[:maxFeedbackErrors]
		}
		f.Errors = nil
		if errs != nil {
			f.Errors = make([]ValidationError, len(errs))
		}
		for j, e := range errs {
			if len(e.Message) > maxErrorMessage {
				e.Message = e.Message[:maxErrorMessage] + "…"
			}
			f.Errors[j] = e
		}
		if n := len(fb[i].Errors) - len(errs); n > 0 {
			f.Message = strings.TrimSpace(f.Message + fmt.Sprintf("\n(%d more errors not shown)", n))
		}
		out[i] = f
	}
	return out
}

// FormatFeedback renders earlier failed iterations for an agent's prompt,
// oldest first, newest last, keeping the newest when over MaxFeedbackBytes.
// It returns "" when there is no feedback.
func FormatFeedback(fb []Feedback) string {
	parts := make([]string, 0, len(fb))
	for _, f := range fb {
		var b strings.Builder
		switch f.Kind {
		case "job":
			fmt.Fprintf(&b, "Iteration %d: the agent run failed.\n", f.Iteration)
		case "merge":
			fmt.Fprintf(&b, "Iteration %d: the outputs passed, but merging them conflicted.\n", f.Iteration)
		case "child":
			fmt.Fprintf(&b, "Iteration %d: a loop spawned from the outputs could not pass.\n", f.Iteration)
		case FeedbackRejected:
			fmt.Fprintf(&b, "Iteration %d: a reviewer rejected the outputs.\n", f.Iteration)
		default:
			fmt.Fprintf(&b, "Iteration %d: the outputs failed validation.\n", f.Iteration)
		}
		for _, e := range f.Errors {
			fmt.Fprintf(&b, "- %s\n", e)
		}
		if f.Message != "" {
			fmt.Fprintf(&b, "%s\n", strings.TrimSpace(f.Message))
		}
		if f.RetryHint != "" {
			fmt.Fprintf(&b, "Hint: %s\n", f.RetryHint)
		}
		parts = append(parts, b.String())
	}
	// Keep the newest parts that fit.
	total, start := 0, len(parts)
	for start > 0 && total+len(parts[start-1]) <= MaxFeedbackBytes {
		start--
		total += len(parts[start])
	}
	if start == len(parts) && len(parts) > 0 {
		last := parts[len(parts)-1]
		return "…" + last[len(last)-MaxFeedbackBytes+3:]
	}
	out := strings.Join(parts[start:], "\n")
	if start > 0 {
		out = fmt.Sprintf("(%d earlier iterations omitted)\n\n", start) + out
	}
	return out
}
