// Package orchestrator folds the event stream into state and decides what
// happens next. Its core is pure: evolve applies one event to State, decide
// returns the events that should follow. Service runs them against the bus.
package orchestrator

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/loopbus/loopbus/backlog"
	"github.com/loopbus/loopbus/schemas"
)

// Session and step statuses in the orchestrator's state.
const (
	StatusRunning   = "running"
	StatusPaused    = "paused"
	StatusStopped   = "stopped"
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
	// StopKind is the kind of session.stopped of a stopped session (resume
	// is refused while a budget stop still holds).
	StopKind string
	// Budget is the pipeline's budget tightened by the session's.
	Budget schemas.Budget
	// Usage holds each job's reported usage: a job reporting twice counts
	// once.
	Usage map[string]schemas.Usage
	// Requests counts the jobs requested (agent runs) of the session.
	Requests int
	// Resumes counts session.resumed events (it keeps ids unique).
	Resumes int
	// Backlog is the state of a backlog session (nil for pipelines).
	Backlog *BacklogState
	// Loops is the state of a loops session (nil otherwise).
	Loops *LoopsState
	// DefinitionFiles travel with every job (see schemas.SessionStarted).
	DefinitionFiles []schemas.DefinitionFile
	// Pending holds signals not acknowledged yet, oldest first. Finished
	// sessions keep them too: they are acknowledged as ignored.
	Pending []PendingSignal
	// seen holds the ids of the session's events while it runs, to refuse
	// a replayed copy that the server's duplicate window no longer
	// catches. A finished session drops it, with its pipeline and steps:
	// its later events change nothing.
	seen map[string]struct{}
	// facts are what the running session's history established, for
	// Check; nil once it finished.
	facts *facts
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
	// Round counts runs cut short by job.cancelled or step.invalidated.
	Round int
	// Hold is the kind of step.paused holding the step ("" when none).
	Hold string
	// RateLimited marks a Failure caused by a usage or rate limit; ResetAt
	// is when it lifts, if the agent said.
	RateLimited bool
	ResetAt     *time.Time
	// WaitJob is the job whose rate-limit wait step.waiting recorded, and
	// WaitUntil its end.
	WaitJob   string
	WaitUntil time.Time
	// Hints are info messages for the step's next job; JobHints those the
	// current job carries, given back to Hints when it is cut short or
	// retried.
	Hints, JobHints []string
	// Reported marks a current job that sent its result (the verdict may
	// still be due): it is no longer cancelled.
	Reported bool
	// RateLimits counts rate-limited attempts in a row; the wait floor
	// doubles with each.
	RateLimits int
	// Repeats counts failures in a row with signature LastSig, for the
	// circuit breaker.
	LastSig string
	Repeats int
	// Summary and FileTasks hold a backlog run's passed report until it is
	// applied: a task or review summary, or a bootstrap or repair task
	// file's tasks.
	Summary   *backlog.Summary
	FileTasks []schemas.Task
	// Free counts iterations that do not count against MaxIterations (a
	// loop's iterations after conflicting merges).
	Free int
}

// PendingSignal is a signal the orchestrator has not acknowledged yet.
type PendingSignal struct {
	ID, Verb, Step, Reason, Message string
}

func (s *Session) clone() *Session {
	c := *s
	c.seen, c.facts = nil, nil // Decide never reads them
	c.Steps = make(map[string]*Step, len(s.Steps))
	for k, v := range s.Steps {
		sc := *v
		sc.Feedback = slices.Clone(v.Feedback)
		sc.Hints, sc.JobHints = slices.Clone(v.Hints), slices.Clone(v.JobHints)
		c.Steps[k] = &sc
	}
	c.Usage = maps.Clone(s.Usage)
	c.Pending = slices.Clone(s.Pending)
	if s.Backlog != nil {
		c.Backlog = s.Backlog.clone()
	}
	if s.Loops != nil {
		c.Loops = s.Loops.clone()
	}
	return &c
}

// terminal reports whether the session has ended.
func (s *Session) terminal() bool { return s.Status == StatusCompleted || s.Status == StatusFailed }

// Spent returns the session's usage so far, summed over its jobs.
// The sum runs in job id order and rounds cost to a billionth of a dollar
// (as the manifest does), so every replica decides the same at a bound.
func (s *Session) Spent() schemas.Usage {
	var u schemas.Usage
	for _, id := range slices.Sorted(maps.Keys(s.Usage)) {
		j := s.Usage[id]
		u.InputTokens += j.InputTokens
		u.CachedTokens += j.CachedTokens
		u.OutputTokens += j.OutputTokens
		u.CostUSD = math.Round((u.CostUSD+j.CostUSD)*1e9) / 1e9
	}
	return u
}

// WakeAt returns the earliest end of a rate-limit wait of a step that may
// run: the service decides again then. ok is false when nothing waits.
func (s *Session) WakeAt() (at time.Time, ok bool) {
	if s.Status != StatusRunning {
		return time.Time{}, false
	}
	for _, st := range s.Steps {
		if st.waiting() && st.Hold == "" && (!ok || st.WaitUntil.Before(at)) {
			at, ok = st.WaitUntil, true
		}
	}
	return at, ok
}

// waiting reports whether the step's current job hit a rate limit whose
// wait step.waiting recorded.
func (st *Step) waiting() bool {
	return st.Status == StepRunning && st.Outcome == outcomeFailed && st.RateLimited && st.WaitJob == st.JobID
}

// inFlight reports whether the step's current job has not reported yet.
func (st *Step) inFlight() bool {
	return st.Status == StepRunning && st.Outcome == outcomeNone && !st.Reported
}

// giveBackHints returns the current job's hints to the pending ones: the
// job was cut short or is retried, so they have not reached an agent that
// finished.
func (st *Step) giveBackHints() {
	st.Hints, st.JobHints = boundHints(slices.Concat(st.JobHints, st.Hints)), nil
}

// MaxHints bounds the info messages a step keeps for its next job; the
// newest are kept, so operator notes can never push a prompt over its
// limit.
const MaxHints = 8

func boundHints(h []string) []string {
	if len(h) > MaxHints {
		h = h[len(h)-MaxHints:]
	}
	return h
}

// ErrReplayed: an event repeats the id of an earlier event of its running
// session, or starts a session that has already started.
var ErrReplayed = errors.New("replayed event")

// ErrNoSession: an event names a session that was never started.
var ErrNoSession = errors.New("no such session")

// ErrInconsistent: an event states a fact its session's history
// contradicts: a result of a job never requested, a verdict on a job that
// never completed, an artifact never stored.
var ErrInconsistent = errors.New("inconsistent with the session's history")

// Check reports whether ev may be applied: it returns an error wrapping
// ErrReplayed for a copy of an event the running session already has, and
// for a second session.started of a session, and one wrapping ErrNoSession
// for an event of a session that has no session.started before it. Such
// events are not facts but replays (or forgeries); the service
// dead-letters them.
func Check(st *State, ev schemas.Event) error {
	s := st.Sessions[ev.Session]
	switch {
	case s == nil && ev.Type == schemas.TypeSessionStarted:
		return nil
	case s == nil:
		return fmt.Errorf("%w: %s is an event of session %s, which was never started (or whose start is no longer in the stream)", ErrNoSession, ev.Type, ev.Session)
	case ev.Type == schemas.TypeSessionStarted && ev.ID != s.StartID:
		return fmt.Errorf("%w: session %s was already started by event %s", ErrReplayed, ev.Session, s.StartID)
	case s.seen == nil:
		return nil
	}
	if _, dup := s.seen[ev.ID]; dup {
		return fmt.Errorf("%w: session %s already has an event with id %s", ErrReplayed, ev.Session, ev.ID)
	}
	return s.facts.check(ev)
}

// facts are what a running session's history established, for Check: the
// jobs requested, the jobs that completed with their artifacts, the
// artifacts stored (by job, name and digest: a job run again stores the
// same bytes under another object, and its artifact.stored has the id of
// the first run's).
type facts struct {
	requested map[string]bool
	completed map[string][]schemas.ArtifactRef
	stored    map[storedKey]bool
}

type storedKey struct{ job, name, digest string }

func newFacts() *facts {
	return &facts{requested: map[string]bool{}, completed: map[string][]schemas.ArtifactRef{}, stored: map[storedKey]bool{}}
}

// record adds what ev establishes.
func (f *facts) record(ev schemas.Event) {
	switch d := ev.Data.(type) {
	case *schemas.JobRequested:
		f.requested[d.JobID] = true
	case *schemas.JobCompleted:
		f.completed[d.JobID] = d.Artifacts
	case *schemas.ArtifactStored:
		f.stored[storedKey{d.JobID, d.Artifact.Name, d.Artifact.Digest}] = true
	}
}

// check refuses a result, verdict or artifact list the history
// contradicts. Every one of them follows what it answers in the stream:
// a worker reads the request, a validator the result, and artifacts are
// stored before the result naming them.
func (f *facts) check(ev schemas.Event) error {
	if f == nil {
		return nil
	}
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: %s %s", ErrInconsistent, ev.Type, fmt.Sprintf(format, a...))
	}
	switch d := ev.Data.(type) {
	case *schemas.JobCompleted:
		if !f.requested[d.JobID] {
			return bad("answers job %s, which was never requested", d.JobID)
		}
		for _, a := range d.Artifacts {
			if !f.stored[storedKey{d.JobID, a.Name, a.Digest}] {
				return bad("names artifact %s (%s), which the job never stored with that digest", a.Name, a.Object)
			}
		}
	case *schemas.JobFailed:
		if !f.requested[d.JobID] {
			return bad("answers job %s, which was never requested", d.JobID)
		}
	case *schemas.Verdict:
		arts, ok := f.completed[d.JobID]
		if !ok {
			return bad("judges job %s, which never completed", d.JobID)
		}
		// A verdict passes on the job's artifacts, not others.
		for _, a := range d.Artifacts {
			if !slices.ContainsFunc(arts, func(b schemas.ArtifactRef) bool {
				return b.Name == a.Name && b.Digest == a.Digest && b.Object == a.Object
			}) {
				return bad("names artifact %s (%s), which job %s did not produce", a.Name, a.Object, d.JobID)
			}
		}
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
	s.facts.record(ev)
	if s.terminal() {
		// Nothing is decided for a finished session again (but signals
		// are acknowledged): keep only what identifies it (Check, LastSeq),
		// so memory grows with the running sessions, not the history.
		s.seen, s.facts, s.Pipeline, s.Input, s.Steps, s.Usage, s.Backlog, s.Loops, s.DefinitionFiles = nil, nil, schemas.Pipeline{}, schemas.ArtifactRef{}, nil, nil, nil, nil, nil
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
	s := &Session{ID: ev.Session, Pipeline: d.Pipeline, Input: d.Input, StartID: ev.ID, Status: StatusRunning, Steps: map[string]*Step{},
		Usage: map[string]schemas.Usage{}, seen: map[string]struct{}{}, facts: newFacts(), DefinitionFiles: d.DefinitionFiles}
	if d.Pipeline.Budget != nil {
		s.Budget = *d.Pipeline.Budget
	}
	if d.Budget != nil {
		s.Budget = s.Budget.Tighter(*d.Budget)
	}
	for _, def := range d.Pipeline.Steps {
		s.Steps[def.Name] = &Step{Def: def, Status: StepPending}
	}
	if d.Pipeline.Kind == schemas.KindBacklog && d.Pipeline.Backlog != nil {
		s.Backlog = newBacklogState(d)
	}
	if d.Pipeline.Kind == schemas.KindLoops && d.Pipeline.Loops != nil && len(d.Pipeline.Loops.Levels) > 0 {
		s.Loops = newLoopsState(*d.Pipeline.Loops, d)
	}
	if s.Backlog != nil && s.Backlog.Def.Workdir == schemas.WorkdirRepo && d.Loops != nil {
		s.Loops = newLoopsState(backlogLoops(), d)
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
	case *schemas.Signal:
		verb := strings.TrimPrefix(ev.Type, "loopbus.signal.")
		s.Pending = append(s.Pending, PendingSignal{ID: ev.ID, Verb: verb, Step: d.Step, Reason: d.Reason, Message: d.Message})
	case *schemas.SignalAcknowledged:
		i := slices.IndexFunc(s.Pending, func(p PendingSignal) bool { return p.ID == d.SignalID })
		if i < 0 {
			return
		}
		p := s.Pending[i]
		s.Pending = slices.Delete(s.Pending, i, i+1)
		if p.Verb == "info" && d.Result == schemas.SignalApplied && s.Backlog != nil && p.Step == "" {
			// A backlog's later runs are steps that do not exist yet: the
			// hint goes to the next job requested.
			s.Backlog.Hints = boundHints(append(s.Backlog.Hints, p.Message))
		} else if p.Verb == "info" && d.Result == schemas.SignalApplied {
			for _, st := range s.hintTargets(p.Step) {
				st.Hints = boundHints(append(st.Hints, p.Message))
			}
		}
	case *schemas.JobRequested:
		if d.Worktree != nil && d.Worktree.Merge {
			break // a merge job: the loop state follows it
		}
		attempt := max(d.Attempt, 1)
		if st := s.Steps[d.Step]; st != nil && st.Status != StepCompleted &&
			(st.Status == StepPending && d.Round >= st.Round || newer(d.Round, d.Iteration, attempt, st)) {
			st.Status, st.Iteration, st.Attempt, st.JobID, st.Round = StepRunning, d.Iteration, attempt, d.JobID, d.Round
			st.Outcome, st.Passed, st.Failure, st.Retryable = outcomeNone, nil, nil, false
			st.Summary, st.FileTasks = nil, nil
			st.RateLimited, st.ResetAt, st.WaitJob, st.WaitUntil = false, nil, "", time.Time{}
			st.Hints, st.JobHints, st.Reported = nil, slices.Clone(d.Hints), false
			st.Feedback = slices.Clone(d.Feedback)
			s.Requests++
			if s.Backlog != nil {
				s.Backlog.Hints = nil // they went with this job
			}
		}
	case *schemas.Verdict:
		st := current(d.Step, d.JobID)
		if st == nil {
			return
		}
		st.RateLimits = 0
		if ev.Type == schemas.TypeValidationPassed {
			st.Outcome, st.Passed = outcomePassed, d.Artifacts
			if s.Backlog != nil {
				s.Backlog.checkReport(st, d)
			}
			if s.Loops != nil {
				s.Loops.checkParts(st, d)
			}
		} else {
			st.Outcome = outcomeFailed
			st.Failure = &schemas.Feedback{Iteration: d.Iteration, Kind: "validation", Errors: d.Errors, RetryHint: d.RetryHint}
			st.repeat(verdictSignature(d))
		}
	case *schemas.JobCompleted:
		if d.Usage != nil {
			s.Usage[d.JobID] = *d.Usage
		}
		if st := current(d.Step, d.JobID); st != nil {
			st.Reported = true
		}
	case *schemas.JobFailed:
		if d.Usage != nil {
			s.Usage[d.JobID] = *d.Usage
		}
		if st := current(d.Step, d.JobID); st != nil {
			msg := d.Error
			if d.OutputTail != "" {
				msg += "\nLast output:\n" + d.OutputTail
			}
			st.Outcome, st.Retryable = outcomeFailed, d.Retryable && !d.RateLimited
			st.RateLimited, st.ResetAt = d.RateLimited, d.ResetAt
			st.Failure = &schemas.Feedback{Iteration: d.Iteration, Kind: "job", Message: msg}
			switch {
			case d.RateLimited:
				st.RateLimits++
				st.giveBackHints()
			case d.Retryable:
				st.giveBackHints()
			default:
				st.RateLimits = 0
				st.repeat("job\x00" + d.Error)
			}
		}
	case *schemas.JobCancelled:
		if st := s.Steps[d.Step]; st != nil && st.Status == StepRunning && st.JobID == d.JobID {
			// The same iteration runs again, in a new round.
			st.Status, st.Round, st.Outcome, st.Passed, st.Failure = StepPending, st.Round+1, outcomeNone, nil, nil
			st.giveBackHints()
		}
	case *schemas.StepWaiting:
		if st := s.Steps[d.Step]; st != nil && st.JobID == d.JobID {
			st.WaitJob, st.WaitUntil = d.JobID, d.Until
		}
	case *schemas.StepPaused:
		if st := s.Steps[d.Step]; st != nil {
			st.Hold = d.Kind
		}
	case *schemas.StepResumed:
		if st := s.Steps[d.Step]; st != nil {
			st.Hold, st.LastSig, st.Repeats = "", "", 0
			if st.waiting() {
				st.WaitUntil = time.Time{} // resuming ends a wait early
			}
		}
	case *schemas.StepInvalidated:
		if st := s.Steps[d.Step]; st != nil && st.Status != StepFailed {
			round := st.Round + 1
			*st = Step{Def: st.Def, Status: StepPending, Round: round, Hold: st.Hold, Hints: st.Hints}
		}
	case *schemas.StepCompleted:
		if st := s.Steps[d.Step]; st != nil {
			st.Status, st.Artifacts, st.Outcome = StepCompleted, d.Artifacts, outcomeNone
			st.Hold, st.Hints = "", nil
		}
	case *schemas.StepFailed:
		if st := s.Steps[d.Step]; st != nil {
			st.Status = StepFailed
		}
	case *schemas.SessionPaused:
		s.Status, s.StopKind = StatusPaused, ""
	case *schemas.SessionStopped:
		s.Status, s.StopKind = StatusStopped, d.Kind
	case *schemas.SessionResumed:
		s.Status, s.StopKind = StatusRunning, ""
		s.Resumes++
	case *schemas.TaskAdded, *schemas.TaskUpdated, *schemas.TaskSelected, *schemas.BacklogPhase:
		if s.Backlog != nil {
			s.Backlog.evolve(s, ev)
		}
	case *schemas.SessionCompleted:
		s.Status = StatusCompleted
	case *schemas.SessionFailed:
		s.Status = StatusFailed
	}
	if s.Loops != nil {
		s.Loops.evolve(s, ev)
	}
}

// newer reports whether a job request at (round, iteration, attempt) comes
// after the step's current one.
func newer(round, iteration, attempt int, st *Step) bool {
	switch {
	case round != st.Round:
		return round > st.Round
	case iteration != st.Iteration:
		return iteration > st.Iteration
	}
	return attempt > st.Attempt
}

// repeat counts a failure with signature sig for the circuit breaker.
func (st *Step) repeat(sig string) {
	if sig == st.LastSig {
		st.Repeats++
		return
	}
	st.LastSig, st.Repeats = sig, 1
}

// verdictSignature identifies a failed verdict by its errors and the
// digests of the outputs it judged: equal signatures mean no progress.
func verdictSignature(d *schemas.Verdict) string {
	parts := make([]string, 0, len(d.Errors)+len(d.Artifacts))
	for _, e := range d.Errors {
		parts = append(parts, "e\x00"+e.String())
	}
	for _, a := range d.Artifacts {
		parts = append(parts, "a\x00"+a.Name+"\x00"+a.Digest)
	}
	sort.Strings(parts)
	return "validation\x00" + strings.Join(parts, "\x01")
}

// hintTargets returns the steps an info signal for step ("" for all)
// reaches: those not completed (in a loops session, the loop's subtree).
func (s *Session) hintTargets(step string) []*Step {
	var out []*Step
	for _, name := range s.stepNames() {
		st := s.Steps[name]
		if (step == "" || step == name || s.Loops != nil && s.Backlog == nil && strings.HasPrefix(name, step+"-")) && st.Status != StepCompleted && st.Status != StepFailed && st.Status != StepInvalidatedLoop {
			out = append(out, st)
		}
	}
	return out
}

// subtree returns st and, in a loops session, the steps of the loops under
// it that still stand, each only if keep says so: a signal for a loop acts
// on its subtree.
func (s *Session) subtree(st *Step, keep func(*Step) bool) []*Step {
	var out []*Step
	if keep(st) {
		out = append(out, st)
	}
	if s.Loops == nil || s.Backlog != nil {
		return out
	}
	for _, id := range s.Loops.descendants(st.Def.Name) {
		if t := s.Steps[id]; t != nil && t.Status != StepInvalidatedLoop && keep(t) {
			out = append(out, t)
		}
	}
	return out
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
