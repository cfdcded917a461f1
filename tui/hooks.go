package tui

import (
	"fmt"
	"io"
	"strings"
	"sync"
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

// HookLog writes what a hook runner does on w: a line per run (see
// WriteHookRun) and one when it waits for events. It is safe for
// concurrent use.
type HookLog struct {
	mu sync.Mutex
	w  io.Writer
}

// NewHookLog returns a HookLog writing to w.
func NewHookLog(w io.Writer) *HookLog { return &HookLog{w: w} }

// Run writes one run, stamped now.
func (l *HookLog) Run(r hooks.Run) {
	l.mu.Lock()
	defer l.mu.Unlock()
	WriteHookRun(l.w, time.Now(), r)
}

// Ready says the runner's consumer exists and which subjects it reads:
// events stored before it (with start new) run no hooks.
func (l *HookLog) Ready(durable string, hookCount int, subjects []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	fmt.Fprintf(l.w, "hooks: waiting for events (consumer %s, %d hook(s), subjects %s)\n", durable, hookCount, strings.Join(subjects, " "))
}
