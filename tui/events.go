package tui

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/loopbus/loopbus/projections"
	"github.com/loopbus/loopbus/schemas"
)

// EventLine is the line `loopbus watch` prints for ev when its output is
// not a terminal: the event's local time, a space, then Describe, e.g.
// "15:04:05 outline#2 tool Bash started: ls -la". m is the manifest after
// ev was folded into it. The line has no newline and no escape sequences.
func EventLine(ev schemas.Event, m *projections.Manifest) string {
	return ev.Time.Local().Format("15:04:05") + " " + Describe(ev, m)
}

// Describe says what ev means for people, in one line: "a#2 queued (round
// 1, with 1 hint)", "step a completed after 2 iterations, $0.105". Jobs
// are named "step#iteration" as m knows them; m is the manifest after ev
// was folded into it and must not be nil for step and session results.
// Types it does not know show as the type without "loopbus.".
func Describe(ev schemas.Event, m *projections.Manifest) string {
	if ev.ForkOf != "" {
		// A copy in a fork's history: what the original said.
		ev.ForkOf = ""
		return "copied: " + Describe(ev, m)
	}
	tag := func(job string) string { return jobTag(m, job, ev.Step) }
	if s, ok := describeLoop(ev, m); ok {
		return s
	}
	switch d := ev.Data.(type) {
	case *schemas.SessionStarted:
		s := fmt.Sprintf("session %s started: pipeline %s, %s", ev.Session, d.Pipeline.Name, Plural(len(d.Pipeline.Steps), "step"))
		if l := d.Pipeline.Loops; d.Pipeline.Kind == schemas.KindLoops && l != nil {
			s = fmt.Sprintf("session %s started: loops %s, %s", ev.Session, d.Pipeline.Name, Plural(len(l.Levels), "level"))
		}
		if b := budgetText(m); b != "" {
			s += ", budget " + b
		}
		return s
	case *schemas.JobRequested:
		if d.Worktree != nil && d.Worktree.Merge {
			return "merge of " + d.Step + " into " + targetBranch(m, ev.Session) + " queued"
		}
		s := d.Step + "#" + strconv.Itoa(d.Iteration) + " queued"
		var notes []string
		if d.Round > 0 {
			notes = append(notes, "round "+strconv.Itoa(d.Round))
		}
		if len(d.Hints) > 0 {
			notes = append(notes, "with "+Plural(len(d.Hints), "hint"))
		}
		if len(d.Feedback) > 0 {
			notes = append(notes, "with feedback")
		}
		if len(notes) > 0 {
			s += " (" + strings.Join(notes, ", ") + ")"
		}
		return s
	case *schemas.JobStarted:
		s := tag(d.JobID) + " running on " + d.Worker
		if d.Delivery > 1 {
			s += fmt.Sprintf(" (delivery %d: an earlier worker did not finish)", d.Delivery)
		}
		return s
	case *schemas.JobHeartbeat:
		return tag(d.JobID) + " still running on " + d.Worker
	case *schemas.JobReleased:
		s := tag(d.JobID) + " handed back by " + d.Worker
		if d.Reason != "" {
			s += ": " + OneLine(d.Reason, 200)
		}
		return s
	case *schemas.ToolStarted:
		s := tag(d.JobID) + " tool " + d.Name + " started"
		if in := OneLine(toolInput(d.Input), 100); in != "" {
			s += ": " + in
		}
		return s
	case *schemas.ToolCompleted:
		s := tag(d.JobID) + " tool " + d.Name + " " + d.Status
		if d.Status != "ok" && d.ExitCode != 0 {
			s += fmt.Sprintf(" (exit %d)", d.ExitCode)
		}
		s += " after " + Duration(time.Duration(d.DurationMs)*time.Millisecond)
		if msg := d.Error; msg != "" || d.Status != "ok" {
			if msg == "" {
				msg = d.Output
			}
			if msg = OneLine(msg, 100); msg != "" {
				s += ": " + msg
			}
		}
		return s
	case *schemas.AgentMessage:
		return tag(d.JobID) + " says: " + OneLine(d.Text, 160)
	case *schemas.ArtifactStored:
		return fmt.Sprintf("%s stored %s (%d bytes)", tag(d.JobID), d.Artifact.Name, d.Artifact.Size)
	case *schemas.JobCompleted:
		took := Duration(time.Duration(d.DurationMs) * time.Millisecond)
		if isMerge(m, d.JobID) {
			s := tag(d.JobID) + " done after " + took
			if d.Git != nil {
				s += ": head " + ShortCommit(d.Git.Commit)
			}
			return s
		}
		s := tag(d.JobID) + " agent done after " + took + usageText(d.Usage)
		switch g := d.Git; {
		case g == nil:
		case g.Changed:
			s += ", commit " + ShortCommit(g.Commit)
		default:
			s += ", no change"
		}
		return s
	case *schemas.JobFailed:
		switch {
		case len(d.Conflict) > 0:
			return tag(d.JobID) + " conflicted on " + OneLine(strings.Join(d.Conflict, ", "), 120)
		case d.Cancelled:
			return tag(d.JobID) + " agent killed: the job was cancelled" + usageText(d.Usage)
		case d.RateLimited:
			s := tag(d.JobID) + " agent hit a usage or rate limit"
			if d.ResetAt != nil {
				s += " (lifts at " + Clock(*d.ResetAt, ev.Time) + ")"
			}
			// The worker's message says so too.
			msg := strings.TrimPrefix(d.Error, "the agent hit a usage or rate limit: ")
			return s + ": " + OneLine(msg, 120) + usageText(d.Usage)
		}
		return fmt.Sprintf("%s agent failed (exit %d): %s", tag(d.JobID), d.ExitCode, OneLine(d.Error, 120)) + usageText(d.Usage)
	case *schemas.JobCancelled:
		return tag(d.JobID) + " job cancelled: " + OneLine(d.Reason, 120)
	case *schemas.Verdict:
		if ev.Type == schemas.TypeValidationPassed {
			return tag(d.JobID) + " validation passed"
		}
		msgs := make([]string, 0, len(d.Errors))
		for _, e := range d.Errors {
			msgs = append(msgs, e.String())
		}
		return tag(d.JobID) + " validation failed: " + OneLine(strings.Join(msgs, "; "), 160)
	case *schemas.StepCompleted:
		s := "step " + d.Step + " completed after " + Plural(d.Iterations, "iteration")
		if st := m.Steps[d.Step]; st != nil && st.Usage != nil && st.Usage.CostUSD != 0 {
			s += ", " + Money(st.Usage.CostUSD)
		}
		return s
	case *schemas.StepImported:
		return "step " + d.Step + " imported from " + d.Source + " (hash " + d.ContentHash + "): its agent does not run"
	case *schemas.StepFailed:
		return "step " + d.Step + " failed after " + Plural(d.Iterations, "iteration") + ": " + OneLine(d.Error, 160)
	case *schemas.StepWaiting:
		st := projections.StepView{Status: projections.StepStatusWaiting, Wait: &projections.Wait{Until: d.Until, Reason: d.Reason}}
		return "step " + d.Step + " " + StepState(&st, ev.Time)
	case *schemas.StepPaused:
		st := projections.StepView{Status: projections.StepStatusPaused, Hold: &projections.Hold{Kind: d.Kind, Reason: d.Reason}}
		switch d.Kind {
		case schemas.PauseStop:
			st.Status = projections.StepStatusStopped
		case schemas.PauseBreaker:
			st.Status = projections.StepStatusBreaker
		}
		return "step " + d.Step + " " + OneLine(StepState(&st, ev.Time), 200)
	case *schemas.StepResumed:
		return "step " + d.Step + " resumed" + reasonText(d.Reason)
	case *schemas.StepInvalidated:
		s := "step " + d.Step + " invalidated"
		if d.Cause != "" && d.Cause != d.Step {
			s += " (by " + d.Cause + ")"
		}
		return s + reasonText(d.Reason) + "; it runs again from iteration 1"
	case *schemas.SessionPaused, *schemas.SessionStopped:
		return "session " + SessionState(m)
	case *schemas.SessionResumed:
		return "session resumed" + reasonText(d.Reason)
	case *schemas.ApprovalRequested:
		st := projections.StepView{Status: projections.StepStatusAwaitingApproval, Approval: &projections.ApprovalWait{Until: d.Until, OnTimeout: d.OnTimeout}}
		return "step " + d.Step + " " + StepState(&st, ev.Time) + ": loopbus approve|reject " + ev.Session + "/" + d.Step
	case *schemas.ApprovalExpired:
		return "step " + d.Step + " approval timed out (" + d.OnTimeout + "): " + OneLine(d.Reason, 120)
	case *schemas.Signal:
		s := "signal " + schemas.SignalName(strings.TrimPrefix(ev.Type, "loopbus.signal."))
		if d.Step != "" {
			s += " for " + d.Step
		}
		if d.By != "" {
			s += " by " + OneLine(d.By, 60)
		}
		if t := signalText(projections.SignalView{Reason: d.Reason, Message: d.Message}); t != "" {
			s += ": " + OneLine(t, 120)
		}
		return s
	case *schemas.SignalAcknowledged:
		s := "signal " + schemas.SignalName(d.Signal)
		if d.Step != "" {
			s += " for " + d.Step
		}
		return s + " " + signalAnswer(projections.SignalView{Result: d.Result, Detail: d.Detail})
	case *schemas.SessionCompleted:
		s := fmt.Sprintf("session %s completed in %s", ev.Session, Duration(ev.Time.Sub(m.CreatedAt)))
		if c := costLine(m); c != "" {
			s += ", " + c
		}
		return s
	case *schemas.SessionFailed:
		return fmt.Sprintf("session %s failed: %s", ev.Session, OneLine(d.Reason, 200))
	case *schemas.SessionForked:
		s := fmt.Sprintf("session %s forked from %s at stream seq %d: pipeline %s", ev.Session, d.Origin, d.Seq, d.Pipeline.Name)
		if m != nil && m.ForkedFrom != nil {
			again := 0
			for _, sv := range m.Steps {
				if sv.Status != projections.StepStatusCompleted {
					again++
				}
			}
			s += fmt.Sprintf(", %s kept, %d to run", Plural(len(m.Steps)-again, "step"), again)
		}
		return s
	}
	return strings.TrimPrefix(ev.Type, "loopbus.")
}

// toolInput is what a tool was given, for people: an agent's JSON tool
// input shows its command, path, pattern, URL or query when it has one
// ({"command":"ls -la"} shows as ls -la); other input as it is.
func toolInput(in string) string {
	var fields map[string]any
	if !strings.HasPrefix(strings.TrimSpace(in), "{") || json.Unmarshal([]byte(in), &fields) != nil {
		return in
	}
	for _, k := range []string{"command", "cmd", "file_path", "path", "pattern", "url", "query", "prompt", "description"} {
		switch v := fields[k].(type) {
		case string:
			if v != "" {
				return v
			}
		case []any: // codex gives argv
			parts := make([]string, 0, len(v))
			for _, p := range v {
				parts = append(parts, fmt.Sprint(p))
			}
			return strings.Join(parts, " ")
		}
	}
	return in
}

// reasonText is ": reason", or nothing for no reason.
func reasonText(reason string) string {
	if reason = OneLine(reason, 120); reason != "" {
		return ": " + reason
	}
	return ""
}

// usageText is ", 5.1k in / 830 out tokens, $0.0312", or nothing.
func usageText(u *schemas.Usage) string {
	if u == nil || u.IsZero() {
		return ""
	}
	s := ", " + ShortTokens(u.InputTokens) + " in / " + ShortTokens(u.OutputTokens) + " out tokens"
	if u.CostUSD != 0 {
		s += ", " + Money(u.CostUSD)
	}
	return s
}

// jobTag names a job's run for people: "step#iteration", or "loop merge"
// for a loop's merge job.
func jobTag(m *projections.Manifest, job, step string) string {
	if m != nil {
		if j := m.Jobs[job]; j != nil {
			if j.Merge {
				return j.Step + " merge"
			}
			return j.Step + "#" + strconv.Itoa(j.Iteration)
		}
	}
	if step != "" {
		return step
	}
	return "job " + job[:min(len(job), 8)]
}

// live is what the screen shows beyond the manifest, folded from the same
// events: tools started and not completed, and the agents' latest message.
type live struct {
	m *projections.Manifest
	// tools are the running tools by job and tool id, in start order.
	tools []tool
	// message is the newest agent.message.
	message struct {
		tag  string
		text string
		at   time.Time
	}
}

type tool struct {
	job, id, tag, name, input string
	started                   time.Time
}

// fold takes in ev, after m (the manifest so far) folded it; it keeps m.
func (l *live) fold(ev schemas.Event, m *projections.Manifest) {
	l.m = m
	switch d := ev.Data.(type) {
	case *schemas.ToolStarted:
		l.tools = append(l.tools, tool{job: d.JobID, id: d.ToolID, tag: jobTag(m, d.JobID, ev.Step), name: d.Name, input: d.Input, started: ev.Time})
	case *schemas.ToolCompleted:
		l.tools = slices.DeleteFunc(l.tools, func(t tool) bool { return t.job == d.JobID && t.id == d.ToolID })
	case *schemas.AgentMessage:
		l.message.tag, l.message.text, l.message.at = jobTag(m, d.JobID, ev.Step), d.Text, ev.Time
	case *schemas.JobCompleted:
		l.dropTools(d.JobID)
	case *schemas.JobFailed:
		l.dropTools(d.JobID)
	case *schemas.JobCancelled:
		l.dropTools(d.JobID)
	}
	if m != nil && m.Terminal() {
		l.tools = nil
	}
}

// dropTools forgets a finished job's tools: a killed agent reports no end.
func (l *live) dropTools(job string) {
	l.tools = slices.DeleteFunc(l.tools, func(t tool) bool { return t.job == job })
}
