// Package orchestrator folds the event stream into state and decides what
// happens next. Its core is pure: evolve applies one event to State, decide
// returns the events that should follow. Service runs them against the bus.
package orchestrator

import (
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/loopbus/loopbus/schemas"
)

// Session and step statuses in the orchestrator's state.
const (
	StatusRunning   = "running"
	StatusCompleted = "completed"
	StatusFailed    = "failed"
	StepPending     = "pending"
	StepRunning     = "running"
	StepCompleted   = "completed"
	StepFailed      = "failed"
)

// Outcomes of a step's current job.
const (
	outcomeNone   = ""
	outcomePassed = "passed"
	outcomeFailed = "failed"
)

// State is everything the orchestrator knows: one Session per session id.
type State struct {
	Sessions map[string]*Session
}

// NewState returns an empty state.
func NewState() *State { return &State{Sessions: map[string]*Session{}} }

// Session is one session's state.
type Session struct {
	ID       string
	Pipeline schemas.Pipeline
	Input    schemas.ArtifactRef
	// StartID is the id of session.started, the correlation of every event.
	StartID string
	Status  string
	// LastSeq and LastID identify the newest event of the session.
	LastSeq uint64
	LastID  string
	Steps   map[string]*Step
	// seen holds the ids of the session's events while it runs, to refuse
	// a replayed copy that the server's duplicate window no longer
	// catches. A finished session drops it, with its pipeline and steps:
	// its later events change nothing.
	seen map[string]struct{}
}

// Step is one step's state.
type Step struct {
	Def       schemas.Step
	Status    string
	Iteration int
	// Attempt counts requests of the same iteration after failures that
	// were not the agent's fault (retryable job failures); 1 at first.
	Attempt int
	JobID   string
	// Outcome of the current job: passed, failed, or none yet.
	Outcome string
	// Passed holds the artifacts of a passed verdict until step.completed.
	Passed []schemas.ArtifactRef
	// Failure describes a failed current job until it is retried.
	Failure *schemas.Feedback
	// Retryable marks a Failure that was not the agent's fault.
	Retryable bool
	// Feedback accumulates the failures of earlier iterations.
	Feedback  []schemas.Feedback
	Artifacts []schemas.ArtifactRef
}

func (s *Session) clone() *Session {
	c := *s
	c.seen = nil // Decide never reads it
	c.Steps = make(map[string]*Step, len(s.Steps))
	for k, v := range s.Steps {
		sc := *v
		sc.Feedback = slices.Clone(v.Feedback)
		c.Steps[k] = &sc
	}
	return &c
}

// terminal reports whether the session has ended.
func (s *Session) terminal() bool { return s.Status != StatusRunning }

// ErrReplayed: an event repeats the id of an earlier event of its running
// session, or starts a session that has already started.
var ErrReplayed = errors.New("replayed event")

// Check reports whether ev may be applied: it returns an error wrapping
// ErrReplayed for a copy of an event the running session already has, and
// for a second session.started of a session. Such events are not facts
// but replays (or forgeries); the service dead-letters them.
func Check(st *State, ev schemas.Event) error {
	s := st.Sessions[ev.Session]
	switch {
	case s == nil:
		return nil
	case ev.Type == schemas.TypeSessionStarted && ev.ID != s.StartID:
		return fmt.Errorf("%w: session %s was already started by event %s", ErrReplayed, ev.Session, s.StartID)
	case s.seen == nil:
		return nil
	}
	if _, dup := s.seen[ev.ID]; dup {
		return fmt.Errorf("%w: session %s already has an event with id %s", ErrReplayed, ev.Session, ev.ID)
	}
	return nil
}

// Evolve applies ev to st. It never fails: events that do not fit the
// state (unknown session, stale job) change nothing but LastSeq. With Skip,
// it is the only function that changes State. Callers that read untrusted streams
// call Check first.
func Evolve(st *State, ev schemas.Event) {
	if ev.Type == schemas.TypeSessionStarted {
		if _, ok := st.Sessions[ev.Session]; !ok {
			st.Sessions[ev.Session] = newSession(ev)
		}
	}
	s := st.Sessions[ev.Session]
	if s == nil {
		return
	}
	if ev.Seq > s.LastSeq {
		s.LastSeq, s.LastID = ev.Seq, ev.ID
	}
	evolveSession(s, ev)
	if s.terminal() {
		// Nothing is decided for a finished session again: keep only what
		// identifies it (Check, LastSeq), so memory grows with the running
		// sessions, not the history.
		s.seen, s.Pipeline, s.Input, s.Steps = nil, schemas.Pipeline{}, schemas.ArtifactRef{}, nil
	} else if ev.ID != "" {
		s.seen[ev.ID] = struct{}{}
	}
}

// Skip records that a message which is not a valid event was stored at seq
// on a subject of session. It changes only LastSeq: the stream's
// per-session sequence counts such messages, and decisions are guarded by
// it.
func Skip(st *State, session string, seq uint64) {
	if s := st.Sessions[session]; s != nil && seq > s.LastSeq {
		s.LastSeq = seq
	}
}

func newSession(ev schemas.Event) *Session {
	d := ev.Data.(*schemas.SessionStarted)
	s := &Session{ID: ev.Session, Pipeline: d.Pipeline, Input: d.Input, StartID: ev.ID, Status: StatusRunning, Steps: map[string]*Step{}, seen: map[string]struct{}{}}
	for _, def := range d.Pipeline.Steps {
		s.Steps[def.Name] = &Step{Def: def, Status: StepPending}
	}
	return s
}

func evolveSession(s *Session, ev schemas.Event) {
	current := func(step, job string) *Step {
		st := s.Steps[step]
		if st == nil || st.Status != StepRunning || st.JobID != job || st.Outcome != outcomeNone {
			return nil
		}
		return st
	}
	switch d := ev.Data.(type) {
	case *schemas.JobRequested:
		attempt := max(d.Attempt, 1)
		if st := s.Steps[d.Step]; st != nil && st.Status != StepCompleted &&
			(d.Iteration > st.Iteration || d.Iteration == st.Iteration && attempt > st.Attempt) {
			st.Status, st.Iteration, st.Attempt, st.JobID = StepRunning, d.Iteration, attempt, d.JobID
			st.Outcome, st.Passed, st.Failure, st.Retryable = outcomeNone, nil, nil, false
			st.Feedback = slices.Clone(d.Feedback)
		}
	case *schemas.Verdict:
		st := current(d.Step, d.JobID)
		if st == nil {
			return
		}
		if ev.Type == schemas.TypeValidationPassed {
			st.Outcome, st.Passed = outcomePassed, d.Artifacts
		} else {
			st.Outcome = outcomeFailed
			st.Failure = &schemas.Feedback{Iteration: d.Iteration, Kind: "validation", Errors: d.Errors, RetryHint: d.RetryHint}
		}
	case *schemas.JobFailed:
		if st := current(d.Step, d.JobID); st != nil {
			msg := d.Error
			if d.OutputTail != "" {
				msg += "\nLast output:\n" + d.OutputTail
			}
			st.Outcome, st.Retryable = outcomeFailed, d.Retryable
			st.Failure = &schemas.Feedback{Iteration: d.Iteration, Kind: "job", Message: msg}
		}
	case *schemas.StepCompleted:
		if st := s.Steps[d.Step]; st != nil {
			st.Status, st.Artifacts, st.Outcome = StepCompleted, d.Artifacts, outcomeNone
		}
	case *schemas.StepFailed:
		if st := s.Steps[d.Step]; st != nil {
			st.Status = StepFailed
		}
	case *schemas.SessionCompleted:
		s.Status = StatusCompleted
	case *schemas.SessionFailed:
		s.Status = StatusFailed
	}
}

// stepNames returns the pipeline's steps in file order.
func (s *Session) stepNames() []string {
	out := make([]string, 0, len(s.Pipeline.Steps))
	for _, d := range s.Pipeline.Steps {
		out = append(out, d.Name)
	}
	if len(out) != len(s.Steps) { // defensive: never for a normalized pipeline
		out = slices.Sorted(maps.Keys(s.Steps))
	}
	return out
}
