package client

import (
	"context"
	"fmt"
	"unicode/utf8"

	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/schemas"
)

// Bounds of JobOutcomes' answer: the newest jobs only, each tail cut.
const (
	// MaxOutcomes is how many jobs JobOutcomes answers for (the newest).
	MaxOutcomes = 300
	// MaxOutcomeTail bounds JobOutcome.OutputTail (its last bytes).
	MaxOutcomeTail = 4000
	// maxOutcomeProblems bounds JobOutcome.Problems.
	maxOutcomeProblems = 20
)

// JobOutcome is how one job ended, in its own words and the validator's:
// what a job's line in a manifest has no room for.
type JobOutcome struct {
	Job       string `json:"job"`
	Step      string `json:"step"`
	Iteration int    `json:"iteration,omitempty"`
	// Status is "completed" (the agent exited 0) or "failed".
	Status     string `json:"status"`
	ExitCode   int    `json:"exitCode"`
	DurationMs int64  `json:"durationMs,omitempty"`
	// Error is why the job failed (job.failed).
	Error string `json:"error,omitempty"`
	// OutputTail is the end of the agent's combined stdout and stderr, at
	// most MaxOutcomeTail bytes, cut at the front.
	OutputTail string `json:"outputTail,omitempty"`
	StopReason string `json:"stopReason,omitempty"`
	APIRetries int    `json:"apiRetries,omitempty"`
	// Verdict is "passed" or "failed" once the validator judged the
	// job's outputs; Problems are what it found (at most 20, each as
	// schemas.ValidationError.String renders it) and RetryHint what it
	// told the next iteration.
	Verdict   string   `json:"verdict,omitempty"`
	Problems  []string `json:"problems,omitempty"`
	RetryHint string   `json:"retryHint,omitempty"`
	// MoreProblems counts problems beyond those listed.
	MoreProblems int `json:"moreProblems,omitempty"`
}

// JobOutcomes returns how the session's jobs ended (job.completed,
// job.failed and the validator's verdicts), the newest MaxOutcomes jobs
// in the order their first such event came; jobs not ended yet are not
// in it. It reads only those events of the session (the copies in a
// fork's history included). Errors wrap ErrBadInput for an invalid id.
func JobOutcomes(ctx context.Context, b Bus, session string) ([]JobOutcome, error) {
	var subjects []string
	for _, typ := range []string{schemas.TypeJobCompleted, schemas.TypeJobFailed, schemas.TypeValidationPassed, schemas.TypeValidationFailed} {
		live, err := schemas.SubjectFor(session, typ)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrBadInput, err)
		}
		copied, err := schemas.HistorySubjectFor(session, typ)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrBadInput, err)
		}
		subjects = append(subjects, live, copied)
	}
	var order []string
	byJob := map[string]*JobOutcome{}
	get := func(id, step string, iteration int) *JobOutcome {
		if id == "" {
			return &JobOutcome{} // no job's: kept nowhere
		}
		o := byJob[id]
		if o == nil {
			o = &JobOutcome{Job: id}
			byJob[id] = o
			order = append(order, id)
			if len(order) > 2*MaxOutcomes {
				// Keep the newest: drop the oldest half's entries.
				for _, old := range order[:len(order)-MaxOutcomes] {
					delete(byJob, old)
				}
				order = append([]string(nil), order[len(order)-MaxOutcomes:]...)
			}
		}
		if step != "" {
			o.Step = step
		}
		if iteration != 0 {
			o.Iteration = iteration
		}
		return o
	}
	err := b.Read(ctx, bus.ReadOptions{Subjects: subjects, SkipSchema: true}, func(ev schemas.Event) error {
		switch d := ev.Data.(type) {
		case *schemas.JobCompleted:
			o := get(orElse(d.JobID, ev.Job), d.Step, d.Iteration)
			o.Status, o.ExitCode, o.DurationMs, o.Error = "completed", d.ExitCode, d.DurationMs, ""
			o.OutputTail, o.StopReason, o.APIRetries = cutFront(d.OutputTail, MaxOutcomeTail), d.StopReason, d.APIRetries
		case *schemas.JobFailed:
			o := get(orElse(d.JobID, ev.Job), d.Step, d.Iteration)
			o.Status, o.ExitCode, o.DurationMs, o.Error = "failed", d.ExitCode, d.DurationMs, d.Error
			o.OutputTail, o.StopReason, o.APIRetries = cutFront(d.OutputTail, MaxOutcomeTail), d.StopReason, d.APIRetries
		case *schemas.Verdict:
			o := get(orElse(d.JobID, ev.Job), d.Step, d.Iteration)
			o.Verdict, o.RetryHint, o.Problems, o.MoreProblems = "passed", d.RetryHint, nil, 0
			if ev.Type == schemas.TypeValidationFailed {
				o.Verdict = "failed"
			}
			for i, e := range d.Errors {
				if i == maxOutcomeProblems {
					o.MoreProblems = len(d.Errors) - i
					break
				}
				o.Problems = append(o.Problems, e.String())
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if len(order) > MaxOutcomes {
		order = order[len(order)-MaxOutcomes:]
	}
	out := make([]JobOutcome, 0, len(order))
	for _, id := range order {
		out = append(out, *byJob[id])
	}
	return out, nil
}

// cutFront keeps the last n bytes of s, on a rune boundary, marked with
// "…" when cut.
func cutFront(s string, n int) string {
	if len(s) <= n {
		return s
	}
	s = s[len(s)-n+len("…"):]
	for len(s) > 0 && !utf8.RuneStart(s[0]) {
		s = s[1:]
	}
	return "…" + s
}

// JobOutcomes is JobOutcomes on the client's bus.
func (c *Client) JobOutcomes(ctx context.Context, session string) ([]JobOutcome, error) {
	if err := c.exists(ctx, session); err != nil {
		return nil, err
	}
	return JobOutcomes(ctx, c.b, session)
}
