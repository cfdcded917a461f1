package tui

import (
	"fmt"
	"io"
	"strings"

	"github.com/loopbus/loopbus/backlog"
	"github.com/loopbus/loopbus/client"
	"github.com/loopbus/loopbus/projections"
	"github.com/loopbus/loopbus/schemas"
)

// Started says in one line (two or more for a backlog whose task file
// needs repair) what a submission started: the session of pipeline p over
// input, or, when sub is not nil, the session of backlog p over its task
// file input and how it begins.
func Started(p schemas.Pipeline, session, input string, sub *client.BacklogSubmission) string {
	if p.Kind == schemas.KindLoops && p.Loops != nil {
		s := fmt.Sprintf("session %s: loops %s, %d levels", session, p.Name, len(p.Loops.Levels))
		if input != "" {
			s += fmt.Sprintf(", merged into branch loopbus/%s of %s", session, input)
		}
		return s
	}
	if sub == nil {
		return fmt.Sprintf("session %s: pipeline %s, %d steps", session, p.Name, len(p.Steps))
	}
	head := fmt.Sprintf("session %s: backlog %s", session, p.Name)
	switch sub.Phase {
	case schemas.PhaseIterate:
		return fmt.Sprintf("%s, %d tasks imported from %s", head, sub.Tasks, input)
	case schemas.PhaseRepair:
		return fmt.Sprintf("%s: %s is invalid, a repair run fixes it first:\n  %s", head, input,
			strings.ReplaceAll(backlog.FormatErrors(sub.Problems), "\n", "\n  "))
	}
	return head + ": no tasks yet, a bootstrap run proposes them"
}

// End is how a followed session ended.
type End int

const (
	// Completed: the session completed.
	Completed End = iota
	// Failed: the session failed.
	Failed
	// StoppedByBudget: the session's budget stopped it.
	StoppedByBudget
	// CompletedBlocked: a backlog session completed with tasks blocked.
	CompletedBlocked
	// Closed: the session was closed (loopbus close).
	Closed
)

// WriteEnd writes why a followed session did not complete (nothing when
// it did) and says how it ended; program is the binary as invoked, for
// the command it suggests.
func WriteEnd(w io.Writer, m *projections.Manifest, program string) End {
	switch {
	case m.Status == projections.StatusFailed:
		fmt.Fprintf(w, "session %s failed: %s\n", m.ContentID, m.Error)
		return Failed
	case m.Status == projections.StatusClosed:
		fmt.Fprintf(w, "session %s closed: %s\n", m.ContentID, m.Error)
		return Closed
	case m.StoppedByBudget():
		fmt.Fprintf(w, "session %s stopped: %s\n", m.ContentID, m.Hold.Reason)
		return StoppedByBudget
	case m.Status == projections.StatusCompleted && m.BlockedTasks > 0:
		fmt.Fprintf(w, "session %s completed with %s blocked: see %s tasks %s --status blocked\n", m.ContentID, Plural(m.BlockedTasks, "task"), program, m.ContentID)
		return CompletedBlocked
	}
	return Completed
}

// WriteFinal tells where a completed session's results are: the paths
// written when its final artifacts went to a directory (written), else
// their names and sizes and the export command that fetches them (program
// is the binary as invoked, e.g. bin/loopbus; global the connection flags
// that command needs, e.g. " --data DIR").
// For a completed loops session, it tells where the code is: its target
// branch and head. Nothing for a session that did not complete or has no
// final artifacts.
func WriteFinal(w io.Writer, m *projections.Manifest, written []string, program, global string) {
	switch {
	case m.Status == projections.StatusCompleted && m.Target != nil && m.Target.Branch != "":
		fmt.Fprintf(w, "target branch %s at %s: %s merged\n", m.Target.Branch, OrDash(ShortCommit(m.Target.Head)), Plural(m.Target.Merges, "loop"))
	case m.Status != projections.StatusCompleted || len(m.Final) == 0:
	case written != nil:
		fmt.Fprintf(w, "final artifacts written: %s\n", strings.Join(written, ", "))
	default:
		names := make([]string, len(m.Final))
		for i, a := range m.Final {
			names[i] = fmt.Sprintf("%s (%d bytes)", a.Name, a.Size)
		}
		fmt.Fprintf(w, "final artifacts: %s\nget them with: %s export %s --dir DIR%s   (or next time: run --out DIR)\n", strings.Join(names, ", "), program, m.ContentID, global)
	}
}

// WriteChecks writes doctor's checks, one line each ("ok  " or "FAIL",
// the name, the detail), and reports whether all passed.
func WriteChecks(w io.Writer, checks []client.Check) bool {
	ok := true
	for _, c := range checks {
		status := "ok  "
		if c.Warn {
			status = "warn"
		}
		if !c.OK {
			status, ok = "FAIL", false
		}
		fmt.Fprintf(w, "%s  %-22s %s\n", status, c.Name, c.Detail)
	}
	return ok
}
