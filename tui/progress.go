package tui

import (
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/loopbus/loopbus/projections"
	"github.com/loopbus/loopbus/schemas"
)

// Progress prints a line per meaningful event while `run` and `wait`
// follow a session without a terminal: steps queued, started, failed,
// failing validation and completed, the session's completion, a
// backlog's phases and tasks, and a loops session's loops and merges. It
// is safe for concurrent use.
type Progress struct {
	mu    sync.Mutex
	w     io.Writer
	start map[string]time.Time
}

// NewProgress returns a Progress writing to w.
func NewProgress(w io.Writer) *Progress { return &Progress{w: w, start: map[string]time.Time{}} }

// Event prints the line for ev, if it deserves one; m is the manifest
// after ev.
func (p *Progress) Event(ev schemas.Event, m *projections.Manifest) {
	p.mu.Lock()
	defer p.mu.Unlock()
	ts := ev.Time.Local().Format("15:04:05")
	switch d := ev.Data.(type) {
	case *schemas.JobRequested:
		if d.Worktree != nil && d.Worktree.Merge {
			fmt.Fprintf(p.w, "%s  → %s: merge into %s queued\n", ts, d.Step, targetBranch(m, ev.Session))
			return
		}
		p.start[d.JobID] = ev.Time
		fmt.Fprintf(p.w, "%s  → %s: iteration %d queued\n", ts, d.Step, d.Iteration)
	case *schemas.JobStarted:
		fmt.Fprintf(p.w, "%s    %s: running on %s%s\n", ts, ev.Step, d.Worker, redelivery(d.Delivery))
	case *schemas.JobFailed:
		if len(d.Conflict) > 0 {
			fmt.Fprintf(p.w, "%s  ✗ %s: merge conflicted on %s\n", ts, d.Step, clip(strings.Join(d.Conflict, ", "), 120))
			return
		}
		fmt.Fprintf(p.w, "%s  ✗ %s: iteration %d failed: %s\n", ts, d.Step, d.Iteration, clip(d.Error, 120))
	case *schemas.Verdict:
		if ev.Type == schemas.TypeValidationFailed {
			msgs := make([]string, 0, len(d.Errors))
			for _, e := range d.Errors {
				msgs = append(msgs, strings.TrimSpace(e.Artifact+" "+e.Pointer+" "+e.Message))
			}
			fmt.Fprintf(p.w, "%s  ✗ %s: iteration %d failed validation: %s\n", ts, d.Step, d.Iteration, clip(strings.Join(msgs, "; "), 160))
		}
	case *schemas.StepCompleted:
		took := ""
		if t, ok := p.start[d.JobID]; ok {
			took = fmt.Sprintf(" in %s", ev.Time.Sub(t).Round(time.Millisecond))
		}
		fmt.Fprintf(p.w, "%s  ✓ %s completed%s (iterations %d, hash %s)\n", ts, d.Step, took, d.Iterations, d.ContentHash)
	case *schemas.StepImported:
		fmt.Fprintf(p.w, "%s  ✓ %s imported from %s (hash %s)\n", ts, d.Step, d.Source, d.ContentHash)
	case *schemas.StepFailed:
		fmt.Fprintf(p.w, "%s  ✗ %s failed: %s\n", ts, d.Step, clip(d.Error, 200))
	case *schemas.ApprovalRequested:
		until := ""
		if d.Until != nil {
			until = fmt.Sprintf(" until %s (then %s)", d.Until.Local().Format("15:04:05"), d.OnTimeout)
		}
		fmt.Fprintf(p.w, "%s  ? %s: iteration %d awaits approval%s: loopbus approve %s/%s, or loopbus reject %s/%s --reason R\n",
			ts, d.Step, d.Iteration, until, ev.Session, d.Step, ev.Session, d.Step)
	case *schemas.ApprovalExpired:
		fmt.Fprintf(p.w, "%s  ? %s: approval timed out (%s): %s\n", ts, d.Step, d.OnTimeout, clip(d.Reason, 160))
	case *schemas.SessionCompleted:
		fmt.Fprintf(p.w, "%s  ✓ session %s completed in %s\n", ts, ev.Session, ev.Time.Sub(m.CreatedAt).Round(time.Millisecond))
	case *schemas.BacklogPhase:
		fmt.Fprintf(p.w, "%s  ▸ %s: %s%s\n", ts, d.Phase, clip(d.Reason, 160), counts(d.Counts))
	case *schemas.LoopSpawned, *schemas.LoopMerged, *schemas.LoopRebase, *schemas.LoopInvalidated:
		s, _ := describeLoop(ev, m)
		fmt.Fprintf(p.w, "%s  ▸ %s\n", ts, s)
	case *schemas.TaskSelected:
		fmt.Fprintf(p.w, "%s  ▸ %s selected (run %d, agent %s): %s\n", ts, d.ID, d.Run, d.Agent, d.Reason)
	case *schemas.TaskAdded:
		fmt.Fprintf(p.w, "%s  + %s added by %s: %s\n", ts, d.Task.ID, d.By, clip(d.Task.Title, 100))
	case *schemas.TaskUpdated:
		if d.Status != "" {
			fmt.Fprintf(p.w, "%s  ▸ %s is %s: %s\n", ts, d.ID, d.Status, clip(d.Note+" "+strings.Join(derefList(d.Blockers), "; "), 140))
		}
	}
}

// clip folds s into one line and keeps its first n bytes, then "…" (the
// progress lines' own, older rule; OneLine counts runes).
func clip(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

func redelivery(n int) string {
	if n > 1 {
		return fmt.Sprintf(" (delivery %d: an earlier worker did not finish)", n)
	}
	return ""
}

// counts renders task counts as " (2 todo, 1 done)", in status order.
func counts(c map[string]int) string {
	var parts []string
	for _, st := range schemas.TaskStatuses() {
		if c[st] > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", c[st], st))
		}
	}
	if len(parts) == 0 {
		return ""
	}
	return " (" + strings.Join(parts, ", ") + ")"
}

func derefList(p *[]string) []string {
	if p == nil {
		return nil
	}
	return *p
}
