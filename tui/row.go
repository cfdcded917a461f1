package tui

import (
	"fmt"
	"strings"

	"github.com/loopbus/loopbus/schemas"
)

// clipFields joins s's words with single spaces and cuts it at n bytes.
func clipFields(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

// EventRow is the line `loopbus events` prints for an event: stream
// sequence, time, type, subject and a summary of its data.
func EventRow(e schemas.Event) string {
	return fmt.Sprintf("%6d  %s  %-26s %-32s %s", e.Seq, e.Time.UTC().Format("2006-01-02T15:04:05.000Z"), strings.TrimPrefix(e.Type, "loopbus."), e.Subject(), summarize(e))
}

// summarize is the one-line description of an event's data in EventRow.
func summarize(e schemas.Event) string {
	switch d := e.Data.(type) {
	case *schemas.SessionStarted:
		if l := d.Pipeline.Loops; d.Pipeline.Kind == schemas.KindLoops && l != nil {
			return fmt.Sprintf("pipeline=%s kind=loops levels=%d", d.Pipeline.Name, len(l.Levels))
		}
		return fmt.Sprintf("pipeline=%s input=%s steps=%d", d.Pipeline.Name, d.Input.Name, len(d.Pipeline.Steps))
	case *schemas.JobRequested:
		if d.Worktree != nil && d.Worktree.Merge {
			return fmt.Sprintf("job=%s iteration=%d merge", d.JobID, d.Iteration)
		}
		return fmt.Sprintf("job=%s iteration=%d", d.JobID, d.Iteration)
	case *schemas.JobStarted:
		return fmt.Sprintf("job=%s worker=%s delivery=%d", d.JobID, d.Worker, d.Delivery)
	case *schemas.JobHeartbeat:
		return fmt.Sprintf("job=%s worker=%s delivery=%d", d.JobID, d.Worker, d.Delivery)
	case *schemas.JobReleased:
		return fmt.Sprintf("job=%s worker=%s delivery=%d %s", d.JobID, d.Worker, d.Delivery, clipFields(d.Reason, 60))
	case *schemas.ToolStarted:
		return fmt.Sprintf("tool=%s %s", d.Name, clipFields(d.Input, 60))
	case *schemas.ToolCompleted:
		return fmt.Sprintf("tool=%s status=%s exit=%d %dms", d.Name, d.Status, d.ExitCode, d.DurationMs)
	case *schemas.AgentMessage:
		return fmt.Sprintf("job=%s %s", d.JobID, clipFields(d.Text, 80))
	case *schemas.ArtifactStored:
		return fmt.Sprintf("%s %d bytes %s", d.Artifact.Name, d.Artifact.Size, schemas.ShortHash(d.Artifact.Digest))
	case *schemas.JobCompleted:
		s := fmt.Sprintf("job=%s exit=%d %dms artifacts=%d", d.JobID, d.ExitCode, d.DurationMs, len(d.Artifacts))
		if d.Usage != nil {
			s += fmt.Sprintf(" tokens=%d/%d cost=$%.4f", d.Usage.InputTokens, d.Usage.OutputTokens, d.Usage.CostUSD)
		}
		if g := d.Git; g != nil {
			s += " commit=" + ShortCommit(g.Commit)
			if !g.Changed {
				s += " unchanged"
			}
		}
		return s
	case *schemas.JobFailed:
		if len(d.Conflict) > 0 {
			return clipFields(fmt.Sprintf("job=%s conflict=%s", d.JobID, strings.Join(d.Conflict, ",")), 120)
		}
		return fmt.Sprintf("job=%s %s", d.JobID, clipFields(d.Error, 80))
	case *schemas.Verdict:
		if len(d.Errors) == 0 {
			return fmt.Sprintf("job=%s", d.JobID)
		}
		return fmt.Sprintf("job=%s errors=%d first: %s", d.JobID, len(d.Errors), clipFields(d.Errors[0].Pointer+" "+d.Errors[0].Message, 60))
	case *schemas.StepCompleted:
		return fmt.Sprintf("iterations=%d hash=%s", d.Iterations, d.ContentHash)
	case *schemas.StepImported:
		return fmt.Sprintf("source=%s hash=%s", d.Source, d.ContentHash)
	case *schemas.StepFailed:
		return clipFields(d.Error, 80)
	case *schemas.SessionCompleted:
		return fmt.Sprintf("final=%d artifacts", len(d.Final))
	case *schemas.SessionFailed:
		return clipFields(d.Reason, 80)
	case *schemas.Signal:
		s := "target=" + d.Target
		if d.Reason != "" {
			s += " reason=" + d.Reason
		}
		if d.Message != "" {
			s += " message=" + d.Message
		}
		return clipFields(s, 100)
	case *schemas.SignalAcknowledged:
		return clipFields(strings.TrimSpace(fmt.Sprintf("%s %s: %s (signal %s)", d.Signal, d.Result, d.Detail, d.SignalID)), 120)
	case *schemas.TaskAdded:
		return clipFields(fmt.Sprintf("%s [%s] %s by=%s", d.Task.ID, d.Task.Status, d.Task.Title, d.By), 120)
	case *schemas.TaskUpdated:
		return clipFields(strings.TrimSpace(fmt.Sprintf("%s %s by=%s %s", d.ID, d.Status, d.By, d.Note)), 120)
	case *schemas.TaskSelected:
		return clipFields(fmt.Sprintf("%s run=%d agent=%s %s", d.ID, d.Run, d.Agent, d.Reason), 120)
	case *schemas.BacklogPhase:
		return clipFields(d.Phase+": "+d.Reason, 120)
	case *schemas.LoopSpawned:
		s := "loop=" + d.Loop + " level=" + d.Level
		if d.Parent != "" {
			s += fmt.Sprintf(" parent=%s index=%d", d.Parent, d.Index)
		}
		if d.Generation > 0 {
			s += fmt.Sprintf(" generation=%d", d.Generation)
		}
		return clipFields(s+" "+d.Title, 120)
	case *schemas.LoopMerged:
		return fmt.Sprintf("loop=%s head=%s previous=%s position=%d", d.Loop, ShortCommit(d.Head), ShortCommit(d.Previous), d.Position)
	case *schemas.LoopRebase:
		s := fmt.Sprintf("loop=%s head=%s cause=%s", d.Loop, ShortCommit(d.Head), d.Cause)
		if len(d.Conflict) > 0 {
			s += " conflict=" + strings.Join(d.Conflict, ",")
		}
		return clipFields(s, 120)
	case *schemas.LoopInvalidated:
		return clipFields(fmt.Sprintf("loop=%s cause=%s %s", d.Loop, d.Cause, d.Reason), 120)
	case *schemas.HookRun:
		return clipFields(fmt.Sprintf("hook=%s event=%s exit=%d %dms %s", d.Hook, d.EventType, d.ExitCode, d.DurationMs, d.Error), 120)
	}
	return ""
}
