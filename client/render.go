package client

import (
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/loopbus/loopbus/projections"
	"github.com/loopbus/loopbus/schemas"
)

func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

// Summarize is the one-line description of an event for `events`.
func Summarize(e schemas.Event) string {
	switch d := e.Data.(type) {
	case *schemas.SessionStarted:
		return fmt.Sprintf("pipeline=%s input=%s steps=%d", d.Pipeline.Name, d.Input.Name, len(d.Pipeline.Steps))
	case *schemas.JobRequested:
		return fmt.Sprintf("job=%s iteration=%d", d.JobID, d.Iteration)
	case *schemas.JobStarted:
		return fmt.Sprintf("job=%s worker=%s delivery=%d", d.JobID, d.Worker, d.Delivery)
	case *schemas.ToolStarted:
		return fmt.Sprintf("tool=%s %s", d.Name, oneLine(d.Input, 60))
	case *schemas.ToolCompleted:
		return fmt.Sprintf("tool=%s status=%s exit=%d %dms", d.Name, d.Status, d.ExitCode, d.DurationMs)
	case *schemas.AgentMessage:
		return fmt.Sprintf("job=%s %s", d.JobID, oneLine(d.Text, 80))
	case *schemas.ArtifactStored:
		return fmt.Sprintf("%s %d bytes %s", d.Artifact.Name, d.Artifact.Size, schemas.ShortHash(d.Artifact.Digest))
	case *schemas.JobCompleted:
		s := fmt.Sprintf("job=%s exit=%d %dms artifacts=%d", d.JobID, d.ExitCode, d.DurationMs, len(d.Artifacts))
		if d.Usage != nil {
			s += fmt.Sprintf(" tokens=%d/%d cost=$%.4f", d.Usage.InputTokens, d.Usage.OutputTokens, d.Usage.CostUSD)
		}
		return s
	case *schemas.JobFailed:
		return fmt.Sprintf("job=%s %s", d.JobID, oneLine(d.Error, 80))
	case *schemas.Verdict:
		if len(d.Errors) == 0 {
			return fmt.Sprintf("job=%s", d.JobID)
		}
		return fmt.Sprintf("job=%s errors=%d first: %s", d.JobID, len(d.Errors), oneLine(d.Errors[0].Pointer+" "+d.Errors[0].Message, 60))
	case *schemas.StepCompleted:
		return fmt.Sprintf("iterations=%d hash=%s", d.Iterations, d.ContentHash)
	case *schemas.StepFailed:
		return oneLine(d.Error, 80)
	case *schemas.SessionCompleted:
		return fmt.Sprintf("final=%d artifacts", len(d.Final))
	case *schemas.SessionFailed:
		return oneLine(d.Reason, 80)
	case *schemas.Signal:
		s := "target=" + d.Target
		if d.Reason != "" {
			s += " reason=" + d.Reason
		}
		if d.Message != "" {
			s += " message=" + d.Message
		}
		return oneLine(s, 100)
	case *schemas.SignalAcknowledged:
		return oneLine(strings.TrimSpace(fmt.Sprintf("%s %s: %s (signal %s)", d.Signal, d.Result, d.Detail, d.SignalID)), 120)
	case *schemas.TaskAdded:
		return oneLine(fmt.Sprintf("%s [%s] %s by=%s", d.Task.ID, d.Task.Status, d.Task.Title, d.By), 120)
	case *schemas.TaskUpdated:
		return oneLine(strings.TrimSpace(fmt.Sprintf("%s %s by=%s %s", d.ID, d.Status, d.By, d.Note)), 120)
	case *schemas.TaskSelected:
		return oneLine(fmt.Sprintf("%s run=%d agent=%s %s", d.ID, d.Run, d.Agent, d.Reason), 120)
	case *schemas.BacklogPhase:
		return oneLine(d.Phase+": "+d.Reason, 120)
	case *schemas.HookRun:
		return oneLine(fmt.Sprintf("hook=%s event=%s exit=%d %dms %s", d.Hook, d.EventType, d.ExitCode, d.DurationMs, d.Error), 120)
	}
	return ""
}

// Progress prints a line per meaningful event while `run`/`wait` follow a
// session. It is safe for concurrent use.
type Progress struct {
	mu    sync.Mutex
	w     io.Writer
	start map[string]time.Time
}

// NewProgress returns a Progress writing to w.
func NewProgress(w io.Writer) *Progress { return &Progress{w: w, start: map[string]time.Time{}} }

// Event prints the line for ev, if it deserves one; m is the manifest so far.
func (p *Progress) Event(ev schemas.Event, m *projections.Manifest) {
	p.mu.Lock()
	defer p.mu.Unlock()
	ts := ev.Time.Local().Format("15:04:05")
	switch d := ev.Data.(type) {
	case *schemas.JobRequested:
		p.start[d.JobID] = ev.Time
		fmt.Fprintf(p.w, "%s  → %s: iteration %d queued\n", ts, d.Step, d.Iteration)
	case *schemas.JobStarted:
		fmt.Fprintf(p.w, "%s    %s: running on %s%s\n", ts, ev.Step, d.Worker, redelivery(d.Delivery))
	case *schemas.JobFailed:
		fmt.Fprintf(p.w, "%s  ✗ %s: iteration %d failed: %s\n", ts, d.Step, d.Iteration, oneLine(d.Error, 120))
	case *schemas.Verdict:
		if ev.Type == schemas.TypeValidationFailed {
			msgs := make([]string, 0, len(d.Errors))
			for _, e := range d.Errors {
				msgs = append(msgs, strings.TrimSpace(e.Artifact+" "+e.Pointer+" "+e.Message))
			}
			fmt.Fprintf(p.w, "%s  ✗ %s: iteration %d failed validation: %s\n", ts, d.Step, d.Iteration, oneLine(strings.Join(msgs, "; "), 160))
		}
	case *schemas.StepCompleted:
		took := ""
		if t, ok := p.start[d.JobID]; ok {
			took = fmt.Sprintf(" in %s", ev.Time.Sub(t).Round(time.Millisecond))
		}
		fmt.Fprintf(p.w, "%s  ✓ %s completed%s (iterations %d, hash %s)\n", ts, d.Step, took, d.Iterations, d.ContentHash)
	case *schemas.StepFailed:
		fmt.Fprintf(p.w, "%s  ✗ %s failed: %s\n", ts, d.Step, oneLine(d.Error, 200))
	case *schemas.SessionCompleted:
		fmt.Fprintf(p.w, "%s  ✓ session %s completed in %s\n", ts, ev.Session, ev.Time.Sub(m.CreatedAt).Round(time.Millisecond))
	case *schemas.BacklogPhase:
		fmt.Fprintf(p.w, "%s  ▸ %s: %s%s\n", ts, d.Phase, oneLine(d.Reason, 160), counts(d.Counts))
	case *schemas.TaskSelected:
		fmt.Fprintf(p.w, "%s  ▸ %s selected (run %d, agent %s): %s\n", ts, d.ID, d.Run, d.Agent, d.Reason)
	case *schemas.TaskAdded:
		fmt.Fprintf(p.w, "%s  + %s added by %s: %s\n", ts, d.Task.ID, d.By, oneLine(d.Task.Title, 100))
	case *schemas.TaskUpdated:
		if d.Status != "" {
			fmt.Fprintf(p.w, "%s  ▸ %s is %s: %s\n", ts, d.ID, d.Status, oneLine(d.Note+" "+strings.Join(derefList(d.Blockers), "; "), 140))
		}
	}
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
