package tui

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/loopbus/loopbus/hooks"
	"github.com/loopbus/loopbus/schemas"
)

// WriteHookRun writes one run of a hook as a line: when (at), which hook
// for which event, and how it ended (with the last line of a failed run's
// output).
func WriteHookRun(w io.Writer, at time.Time, r hooks.Run) {
	res := r.Result
	what := fmt.Sprintf("%s hook %s for %s #%d (session %s)", at.Format("15:04:05"), res.Hook, res.EventType, res.EventSeq, r.Event.Session)
	dur := (time.Duration(res.DurationMs) * time.Millisecond).String()
	switch {
	case r.Skipped:
		fmt.Fprintf(w, "%s: already ran before a restart, skipped\n", what)
	case r.Type == schemas.TypeHookCompleted:
		fmt.Fprintf(w, "%s: exit 0 in %s\n", what, dur)
	default:
		line := fmt.Sprintf("%s: FAILED in %s: %s", what, dur, res.Error)
		if tail := hookTailLine(res.OutputTail); tail != "" {
			line += ": " + tail
		}
		fmt.Fprintln(w, line)
	}
}

// hookTailLine returns the last non-empty line of text, trimmed.
func hookTailLine(text string) string {
	lines := strings.Split(strings.TrimSpace(text), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}
