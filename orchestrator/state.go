// Package orchestrator folds the event stream into state and decides what
// happens next. Its core is pure: evolve applies one event to State, decide
// returns the events that should follow. Service runs them against the bus.
package orchestrator

import (
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"reflect"
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
	// StatusClosed: session.closed ended the session for good.
	StatusClosed  = "closed"
	StepPending   = "pending"
	StepRunning   = "running"
	StepCompleted = "completed"
	StepFailed    = "failed"
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
	// Retain keeps a finished pipeline session's pipeline and steps, which
	// session.rerun reopens. Without it (the service's state) a finished
	// session keeps only what identifies it, so memory grows with the
	// running sessions, not the history; the service folds a session's
	// history again, retained, when a rerun comes (Service.rehydrate).
	Retain bool
	// forks holds, by event id, what PrepareFork found for a
	// session.forked not applied yet.
	forks map[string]forkPrep
	// defs holds one copy of each definition (pipeline and definition
	// files) that sessions of the state hold, by digest: the sessions
	// started from one file share it instead of each keeping its own
	// decoded copy (see intern).
	defs map[string]*sharedDef
	// Prompts, when set, keeps the prompt templates Decide parses for
	// the next decision that renders the same text. It is a memo: what
	// Decide returns does not depend on it, and nil parses at each use.
	// The service sets it; a state Decide must leave untouched to the
	// byte (the tables' checks) leaves it nil.
	Prompts *PromptCache
}

// sharedDef is one definition that sessions share. Nothing changes it,
// nor what it points to: a session that runs with another definition (a
// fork) holds another.
type sharedDef struct {
	key      string
	pipeline schemas.Pipeline
	// refs counts the sessions holding it; at zero it leaves State.defs.
	refs int
}

// intern returns the state's copy of the pipeline p, made from it when
// the state has none, and counts one more holder of it. It returns nil
// (the caller keeps its own copy) when p cannot be encoded, or when a
// different one has the same digest. The definition files are not shared:
// each session stores its own (under its id), and they are small.
func (st *State) intern(p schemas.Pipeline) *sharedDef {
	b, err := json.Marshal(p)
	if err != nil {
		return nil
	}
	sum := sha256.Sum256(b)
	key := string(sum[:])
	if d := st.defs[key]; d != nil {
		// The digest is of the JSON form; sharing needs the same values
		// (a nil and an empty list encode alike).
		if !reflect.DeepEqual(d.pipeline, p) {
			return nil
		}
		d.refs++
		return d
	}
	if st.defs == nil {
		st.defs = map[string]*sharedDef{}
	}
	d := &sharedDef{key: key, pipeline: p, refs: 1}
	st.defs[key] = d
	return d
}

// release counts one holder of d fewer; the last one removes d from the
// state. A definition of another state (a session folded apart and put
// into this one, see Service.rehydrate) is not this state's to remove.
func (st *State) release(d *sharedDef) {
	if d == nil {
		return
	}
	if d.refs--; d.refs <= 0 && st.defs[d.key] == d {
		delete(st.defs, d.key)
	}
}

// NewState returns an empty state.
func NewState() *State { return &State{Sessions: map[string]*Session{}} }

// Session is one session's state.
type Session struct {
	ID string
	// Pipeline is the session's pipeline, shared with the other sessions
	// of the same definition (see State.intern): it is replaced, never
	// written in place, nor are the lists and maps it holds.
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
	// Budget is the pipeline's budget tightened by the session's, with
	// the bounds of session.budget events replacing it field by field.
	Budget schemas.Budget
	// BudgetID is the id of the newest session.budget applied ("" when
	// none): a session its budget stopped answers each raise, resuming
	// when it lets it go on, else recording the stop again.
	BudgetID string
	// StopBudgetID is BudgetID when the session last stopped: a newer
	// session.budget is still to be answered (resumed or stopped again).
	StopBudgetID string
	// Orphans are the jobs in flight when session.closed (or a rerun)
	// arrived: they are cancelled first (a closed session then keeps
	// nothing else).
	Orphans []schemas.JobCancelled
	// Usage holds each job's reported usage: a job reporting twice counts
	// once.
	Usage map[string]schemas.Usage
	// Requests counts the jobs requested (agent runs) of the session.
	Requests int
	// Resumes counts session.resumed events (it keeps ids unique).
	Resumes int
	// Kind is the pipeline's kind ("" for a pipeline of steps): it stays
	// when a finished session drops its pipeline.
	Kind string
	// Reruns counts session.rerun events applied: the session's own
	// events (completed, failed, stopped) of a later run get ids of their
	// own. RerunIDs are their ids, so that a replayed copy is refused.
	Reruns   int
	RerunIDs []string
	// Import is set for a session loopbus import made (see
	// schemas.ImportStart): it starts paused, and step.imported events
	// complete steps before its first job.
	Import *schemas.ImportStart
	// Backlog is the state of a backlog session (nil for pipelines).
	Backlog *BacklogState
	// Loops is the state of a loops session (nil otherwise).
	Loops *LoopsState
	// DefinitionFiles travel with every job (see schemas.SessionStarted);
	// shared as Pipeline is.
	DefinitionFiles []schemas.DefinitionFile
	// Pending holds signals not acknowledged yet, oldest first. Finished
	// sessions keep them too: they are acknowledged as ignored.
	Pending []PendingSignal
	// seen holds the ids of the session's events while it runs (as
	// eventKey digests: a fixed 16 bytes whatever an id's length), to
	// refuse a replayed copy that the server's duplicate window no longer
	// catches. A finished session drops it, with its pipeline and steps:
	// its later events change nothing.
	seen map[eventKey]struct{}
	// def is the shared definition Pipeline and DefinitionFiles come from
	// (nil when the session holds its own), released when the session
	// drops them.
	def *sharedDef
	// facts are what the running session's history established, for
	// Check; nil once it finished.
	facts *facts
}

// Step is one step's state.
type Step struct {
	// Def is the step's definition. It is never changed in place (a fork
	// gives a step another): a pipeline session's steps point into its
	// pipeline, which sessions of the same definition share (see
	// State.intern).
	Def       *schemas.Step
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
	// RequestedAt is when the current job was requested (its event's
	// time) and Started whether a worker announced starting it: with the
	// pipeline's job_dispatch_timeout, a job not started in time fails.
	RequestedAt time.Time
	Started     bool
	// Free counts iterations that do not count against MaxIterations (a
	// loop's iterations after conflicting merges, a gated step's
	// iterations after a rejection).
	Free int
	// AwaitJob is the current job whose passed outputs wait for approval
	// (approval.requested recorded it), and AwaitUntil when the wait's
	// timeout elapses (zero: no timeout). Approved marks the current job
	// approved (by a signal or its timeout): the step completes.
	AwaitJob   string
	AwaitUntil time.Time
	Approved   bool
	// Imported marks a step step.imported completed: its outputs were
	// produced outside loopbus, and its agent never ran.
	Imported bool
}

// PendingSignal is a signal the orchestrator has not acknowledged yet.
type PendingSignal struct {
	ID, Verb, Step, Reason, Message string
	// By is who sent an approve or reject.
	By string
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
	c.Orphans = slices.Clone(s.Orphans)
	c.RerunIDs = slices.Clone(s.RerunIDs)
	if s.Backlog != nil {
		c.Backlog = s.Backlog.clone()
	}
	if s.Loops != nil {
		c.Loops = s.Loops.clone()
	}
	return &c
}

// terminal reports whether the session has ended: completed, failed or
// closed.
func (s *Session) terminal() bool {
	return s.Status == StatusCompleted || s.Status == StatusFailed || s.Status == StatusClosed
}

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
		// A job no worker started fails at its dispatch deadline.
		if dl, has := s.dispatchDeadline(st); has && (!ok || dl.Before(at)) {
			at, ok = dl, true
		}
		// An approval gate's timeout: the service decides again then.
		if st.awaitingApproval() && !st.AwaitUntil.IsZero() && (!ok || st.AwaitUntil.Before(at)) {
			at, ok = st.AwaitUntil, true
		}
	}
	return at, ok
}

// dispatchDeadline returns when the step's current job fails unless a
// worker starts it (the pipeline's job_dispatch_timeout after its
// request); has is false when no such deadline applies.
func (s *Session) dispatchDeadline(st *Step) (at time.Time, has bool) {
	if s.Pipeline.JobDispatchTimeoutMs <= 0 || !st.inFlight() || st.Started || st.RequestedAt.IsZero() {
		return time.Time{}, false
	}
	return st.RequestedAt.Add(time.Duration(s.Pipeline.JobDispatchTimeoutMs) * time.Millisecond), true
}

// waiting reports whether the step's current job hit a rate limit whose
// wait step.waiting recorded.
func (st *Step) waiting() bool {
	return st.Status == StepRunning && st.Outcome == outcomeFailed && st.RateLimited && st.WaitJob == st.JobID
}

// awaitingApproval reports whether the step's current job passed and
// waits for approval (approval.requested recorded it).
func (st *Step) awaitingApproval() bool {
	return st.Status == StepRunning && st.Outcome == outcomePassed && st.Def.Approval != nil && st.AwaitJob != "" &&
		st.AwaitJob == st.JobID && !st.Approved
}

// reject turns the current job's passed outcome into a rejection: the
// next iteration runs with reason as feedback. A person's rejection
// (byPerson) does not count against max_iterations; one by a gate's
// timeout does, so that a gate nobody answers cannot run agents forever.
// (A loop's children cut from the rejected outputs stay in its Parts
// until the next passed verdict replaces them: only a completed loop
// spawns.)
func (st *Step) reject(reason string, byPerson bool) {
	st.Outcome, st.Passed = outcomeFailed, nil
	if byPerson {
		st.Free++
	}
	st.Failure = &schemas.Feedback{Iteration: st.Iteration, Kind: schemas.FeedbackRejected, Message: reason}
	st.LastSig, st.Repeats = "", 0
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
// never completed, an artifact never stored, a step completed without its
// job's passed verdict, a session completed before its time, or (when the
// bus verifies signatures) a job's result or progress signed by another
// than the worker that started it.
var ErrInconsistent = errors.New("inconsistent with the session's history")

// Check reports whether ev may be applied: it returns an error wrapping
// ErrReplayed for a copy of an event the running session already has, for
// a copy of a fork's history (Event.ForkOf) or a session.forked into a
// session that exists, and for a second session.started of a session, and one wrapping ErrNoSession
// for an event of a session that has no session.started before it. Such
// events are not facts but replays (or forgeries); the service
// dead-letters them. An event of a running session that states a fact its
// history contradicts (see facts.check) gets one wrapping ErrInconsistent,
// whoever sent it: the orchestrator reads its own decisions back through
// Check too.
func Check(st *State, ev schemas.Event) error {
	s := st.Sessions[ev.Session]
	switch {
	case ev.ForkOf != "" && s != nil:
		// A fork's copies come before its session.forked, in one batch:
		// a copy into a session that exists is a forgery.
		return fmt.Errorf("%w: %s copies event %s into session %s, which exists (started by event %s): a fork's history is copied before its session.forked",
			ErrReplayed, ev.Type, ev.ForkOf, ev.Session, s.StartID)
	case ev.ForkOf != "":
		// A copy in a fork's history: no fact for the orchestrator (see
		// PrepareFork), whatever it says.
		return nil
	case ev.Type == schemas.TypeSessionForked:
		return checkForked(st, ev)
	case s == nil && ev.Type == schemas.TypeSessionStarted:
		return nil
	case s == nil:
		return fmt.Errorf("%w: %s is an event of session %s, which was never started (or whose start is no longer in the stream)", ErrNoSession, ev.Type, ev.Session)
	case ev.Type == schemas.TypeSessionStarted && ev.ID != s.StartID:
		return fmt.Errorf("%w: session %s was already started by event %s", ErrReplayed, ev.Session, s.StartID)
	case ev.Type == schemas.TypeSessionRerun:
		return s.checkRerun(ev)
	case ev.Type == schemas.TypeStepImported:
		return s.checkImport(ev)
	case s.seen == nil:
		return nil
	}
	if _, dup := s.seen[keyOf(ev.ID)]; dup {
		return fmt.Errorf("%w: session %s already has an event with id %s", ErrReplayed, ev.Session, ev.ID)
	}
	return s.facts.check(s, ev)
}

// checkRerun refuses a session.rerun its session cannot take: a copy of
// one applied before, one for a session that runs (or is paused) or was
// closed for good, one for a backlog or loops session, or one naming a
// step the pipeline does not have.
func (s *Session) checkRerun(ev schemas.Event) error {
	if slices.Contains(s.RerunIDs, ev.ID) {
		return fmt.Errorf("%w: session %s already has an event with id %s", ErrReplayed, ev.Session, ev.ID)
	}
	if _, dup := s.seen[keyOf(ev.ID)]; dup {
		return fmt.Errorf("%w: session %s already has an event with id %s", ErrReplayed, ev.Session, ev.ID)
	}
	if err := s.rerunnable(ev); err != "" {
		return fmt.Errorf("%w: %s %s", ErrInconsistent, ev.Type, err)
	}
	return nil
}

// rerunnable says why session.rerun ev cannot reopen the session ("" when
// it can): only a completed, failed or stopped pipeline session is
// reopened, and only for a step it has.
func (s *Session) rerunnable(ev schemas.Event) string {
	d, _ := ev.Data.(*schemas.SessionRerun)
	switch {
	case d == nil:
		return "has no rerun data"
	case s.Status == StatusClosed:
		return fmt.Sprintf("reopens session %s, which was closed for good", s.ID)
	case s.Status == StatusRunning || s.Status == StatusPaused:
		return fmt.Sprintf("reopens session %s, which is %s: rerun takes a completed, failed or stopped session", s.ID, s.Status)
	case s.Kind != "":
		return fmt.Sprintf("reopens %s session %s: rerun is for pipeline sessions", s.Kind, s.ID)
	case len(s.Pipeline.Steps) == 0:
		return fmt.Sprintf("reopens session %s, whose steps are not known (its history could not be read back)", s.ID)
	case d.Step != "" && s.Steps[d.Step] == nil:
		return fmt.Sprintf("names step %s, which session %s does not have", d.Step, s.ID)
	}
	return ""
}

// rerun applies session.rerun: the session runs again; the step named and
// its dependents (every step without one), and any step that had not
// completed, start over in a new round, as step.invalidated makes them.
func (s *Session) rerun(ev schemas.Event) {
	if s.rerunnable(ev) != "" {
		return
	}
	d := ev.Data.(*schemas.SessionRerun)
	for _, name := range s.stepNames() {
		st := s.Steps[name]
		if d.Step == "" || name == d.Step || s.dependsOn(name, d.Step) || st.Status != StepCompleted {
			if st.inFlight() {
				// A job of the run before may still run (a parallel
				// step when the session failed): workers kill it, so
				// that it does not run beside the step's new job.
				s.Orphans = append(s.Orphans, schemas.JobCancelled{JobID: st.JobID, Step: name, Iteration: st.Iteration, Reason: "session rerun"})
			}
			st.startOver(true)
		}
	}
	s.Status, s.StopKind = StatusRunning, ""
	s.Reruns++
	s.RerunIDs = append(s.RerunIDs, ev.ID)
	if s.seen == nil {
		// A finished session dropped what Check knows of its run: the
		// new run starts afresh (results of earlier jobs are stale).
		s.seen, s.facts = map[eventKey]struct{}{}, newFacts()
	}
}

// checkImport refuses a step.imported its session cannot take: a copy of
// one applied before, or one importable refuses.
func (s *Session) checkImport(ev schemas.Event) error {
	if _, dup := s.seen[keyOf(ev.ID)]; dup {
		return fmt.Errorf("%w: session %s already has an event with id %s", ErrReplayed, ev.Session, ev.ID)
	}
	if why := s.importable(ev); why != "" {
		return fmt.Errorf("%w: %s %s", ErrInconsistent, ev.Type, why)
	}
	return nil
}

// importable says why step.imported ev cannot complete its step ("" when
// it can). Imports are valid only in a pipeline session loopbus import
// started, before its first job: for a step of the pipeline not completed
// yet, whose required steps are completed (imported), with exactly the
// step's declared outputs and their content hash.
func (s *Session) importable(ev schemas.Event) string {
	d, _ := ev.Data.(*schemas.StepImported)
	if d == nil {
		return "has no import data"
	}
	st := s.Steps[d.Step]
	switch {
	case s.Kind != "":
		return fmt.Sprintf("imports into %s session %s: imports are for pipeline sessions", s.Kind, s.ID)
	case s.Import == nil:
		return fmt.Sprintf("imports into session %s, which loopbus import did not start", s.ID)
	case s.terminal():
		return fmt.Sprintf("imports into session %s, which is %s", s.ID, s.Status)
	case s.Requests > 0:
		return fmt.Sprintf("imports into session %s, which has run jobs: imports come before the first job", s.ID)
	case st == nil:
		return fmt.Sprintf("names step %s, which session %s does not have", d.Step, s.ID)
	case st.Status != StepPending:
		return fmt.Sprintf("imports step %s, which is %s", d.Step, st.Status)
	}
	for _, r := range st.Def.Requires {
		if dep := s.Steps[r]; dep == nil || dep.Status != StepCompleted {
			return fmt.Sprintf("imports step %s before step %s, which it requires", d.Step, r)
		}
	}
	want := make([]string, 0, len(st.Def.Outputs))
	for _, o := range st.Def.Outputs {
		want = append(want, o.Name)
	}
	got := make([]string, 0, len(d.Artifacts))
	for _, a := range d.Artifacts {
		got = append(got, a.Name)
	}
	slices.Sort(want)
	slices.Sort(got)
	switch {
	case len(want) == 0 || !slices.Equal(want, got):
		return fmt.Sprintf("imports artifacts [%s] for step %s, whose declared outputs are [%s]", strings.Join(got, ", "), d.Step, strings.Join(want, ", "))
	case d.ContentHash != schemas.ContentHash(d.Artifacts):
		return fmt.Sprintf("imports step %s with content hash %s, but its artifacts hash to %s", d.Step, d.ContentHash, schemas.ContentHash(d.Artifacts))
	}
	return ""
}

// startOver makes the step pending in a new round: what it produced no
// longer stands, and its next job has a new id. Hints stay; the hold
// stays unless clear.
func (st *Step) startOver(clearHold bool) {
	hold := st.Hold
	if clearHold {
		hold = ""
	}
	*st = Step{Def: st.Def, Status: StepPending, Round: st.Round + 1, Hold: hold, Hints: st.Hints}
}

// endedIgnores reports whether a completed or failed session ignores ev:
// everything but signals (acknowledged as ignored) and session.rerun.
func endedIgnores(ev schemas.Event) bool {
	switch ev.Data.(type) {
	case *schemas.Signal, *schemas.SignalAcknowledged, *schemas.SessionRerun:
		return false
	}
	return true
}

// facts are what a running session's history established, for Check: the
// jobs requested, the jobs that completed with their artifacts, the
// artifacts stored (by job, name and digest: a job run again stores the
// same bytes under another object, and its artifact.stored has the id of
// the first run's), the jobs cancelled, and who holds each job a signed
// job.started announced.
type facts struct {
	requested map[string]bool
	completed map[string][]schemas.ArtifactRef
	stored    map[storedKey]bool
	cancelled map[string]bool
	// holders maps a requested job to the signer of its latest job.started
	// (only signed ones: with no trust configured nobody holds a job).
	holders map[string]holder
	// results maps a job to the id of its accepted signed result, which
	// a signed verdict must answer (its causation).
	results map[string]string
}

type storedKey struct{ job, name, digest string }

// holder is the worker a signed job.started announced: only it states the
// job's progress and result.
type holder struct {
	signer string
	// at is when it started the job (the stream's time, else the
	// worker's), or the event's id when neither is known.
	at string
	// delivery is JetStream's delivery count of the job it started.
	delivery int
	// lease is how long the holder may stay silent about the job before
	// another worker may take it over; zero when its job.started named
	// none (then a higher delivery alone hands the job over).
	lease time.Duration
	// last is when the stream stored the holder's latest event about the
	// job; zero when unknown.
	last time.Time
	// released: the holder handed the job back (job.released).
	released bool
}

// takeoverMargin is the share of a lease that must pass in silence before
// another worker may take a job over. JetStream redelivers a job a whole
// ack wait (the lease) after the worker's last heartbeat, and the worker
// states a sign of life on a tick of its own, every third of it: a real
// takeover follows at least two thirds of silence, while a live holder is
// never silent much beyond a third. Half sits between, a sixth from each.
const takeoverMargin = 0.5

// maxLease bounds the lease a job.started may state: a key that claims a
// longer one cannot pin a job beyond it by falling silent.
const maxLease = time.Hour

func newFacts() *facts {
	// Every map is made when first written (reading a nil map is
	// reading an empty one): a session waiting for its first job has
	// completed nothing, most sessions cancel nothing, and with no trust
	// configured nobody holds a job.
	return &facts{}
}

// record adds what ev establishes. Only requested jobs are tracked, so the
// facts grow with the session's requests, not with what others publish.
func (f *facts) record(ev schemas.Event) {
	if f == nil { // a finished session: its later events change nothing
		return
	}
	switch d := ev.Data.(type) {
	case *schemas.JobRequested:
		if f.requested == nil {
			f.requested = map[string]bool{}
		}
		f.requested[d.JobID] = true
	case *schemas.JobCompleted:
		if f.completed == nil {
			f.completed = map[string][]schemas.ArtifactRef{}
		}
		f.completed[d.JobID] = d.Artifacts
		if ev.Signer != "" {
			if f.results == nil {
				f.results = map[string]string{}
			}
			f.results[d.JobID] = ev.ID
		}
	case *schemas.ArtifactStored:
		if f.stored == nil {
			f.stored = map[storedKey]bool{}
		}
		f.stored[storedKey{d.JobID, d.Artifact.Name, d.Artifact.Digest}] = true
	case *schemas.JobCancelled:
		if f.requested[d.JobID] {
			if f.cancelled == nil {
				f.cancelled = map[string]bool{}
			}
			f.cancelled[d.JobID] = true
		}
	case *schemas.JobStarted:
		// A later start of the job (a redelivery taken over after a
		// worker stopped or crashed) replaces the holder.
		if ev.Signer != "" && f.requested[d.JobID] {
			at := ev.Stored
			if at.IsZero() {
				at = ev.Time
			}
			h := holder{signer: ev.Signer, at: "event " + ev.ID, delivery: d.Delivery,
				lease: min(time.Duration(d.LeaseMs)*time.Millisecond, maxLease), last: ev.Stored}
			if !at.IsZero() {
				h.at = at.UTC().Format(time.RFC3339)
			}
			if f.holders == nil {
				f.holders = map[string]holder{}
			}
			f.holders[d.JobID] = h
		}
	case *schemas.JobReleased:
		f.heard(ev, d.JobID, true)
	case *schemas.JobHeartbeat:
		f.heard(ev, d.JobID, false)
	case *schemas.ToolStarted:
		f.heard(ev, d.JobID, false)
	case *schemas.ToolCompleted:
		f.heard(ev, d.JobID, false)
	case *schemas.AgentMessage:
		f.heard(ev, d.JobID, false)
	}
	if d, ok := ev.Data.(*schemas.ArtifactStored); ok {
		f.heard(ev, d.JobID, false)
	}
}

// heard notes a sign of life (or, with released, the hand-back) that a
// job's holder signed.
func (f *facts) heard(ev schemas.Event, job string, released bool) {
	h, ok := f.holders[job]
	if !ok || ev.Signer != h.signer {
		return
	}
	if ev.Stored.After(h.last) {
		h.last = ev.Stored
	}
	h.released = h.released || released
	f.holders[job] = h
}

// check refuses a fact the history of session s contradicts. Every job
// result, verdict and artifact list follows what it answers in the
// stream: a worker reads the request, a validator the result, and
// artifacts are stored before the result naming them. A step completes on
// its current job's passed verdict, with that verdict's artifacts; a
// session completes by its kind's rule (canComplete). When the bus
// verified signatures, a job's progress and result are stated by the
// worker holding it: the signer of its latest job.started.
func (f *facts) check(s *Session, ev schemas.Event) error {
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
		if err := f.checkHolder(ev, d.JobID, true, bad); err != nil {
			return err
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
		// A worker that finds the job cancelled before it starts it says
		// so without starting it: no holder, no usage.
		notStarted := d.Cancelled && d.Usage == nil && f.cancelled[d.JobID]
		if err := f.checkHolder(ev, d.JobID, !notStarted, bad); err != nil {
			return err
		}
	case *schemas.JobStarted:
		return f.checkTakeover(ev, d, bad)
	case *schemas.JobHeartbeat:
		return f.checkProgress(ev, d.JobID, bad)
	case *schemas.JobReleased:
		return f.checkProgress(ev, d.JobID, bad)
	case *schemas.ArtifactStored:
		return f.checkProgress(ev, d.JobID, bad)
	case *schemas.ToolStarted:
		return f.checkProgress(ev, d.JobID, bad)
	case *schemas.ToolCompleted:
		return f.checkProgress(ev, d.JobID, bad)
	case *schemas.AgentMessage:
		return f.checkProgress(ev, d.JobID, bad)
	case *schemas.Verdict:
		arts, ok := f.completed[d.JobID]
		if !ok {
			return bad("judges job %s, which never completed", d.JobID)
		}
		// A signed verdict answers the job's accepted result, not a
		// result refused as another worker's (the validator judges every
		// result it is given).
		if want, signed := f.results[d.JobID]; ev.Signer != "" && signed && ev.Causation != want {
			return bad("judges result %s of job %s, but the job's accepted result is %s", ev.Causation, d.JobID, want)
		}
		// A verdict passes on the job's artifacts, not others.
		for _, a := range d.Artifacts {
			if !slices.ContainsFunc(arts, func(b schemas.ArtifactRef) bool {
				return b.Name == a.Name && b.Digest == a.Digest && b.Object == a.Object
			}) {
				return bad("names artifact %s (%s), which job %s did not produce", a.Name, a.Object, d.JobID)
			}
		}
	case *schemas.StepCompleted:
		st := s.Steps[d.Step]
		switch {
		case st == nil:
			return bad("completes step %s, which session %s does not have", d.Step, s.ID)
		case st.Status != StepRunning:
			return bad("completes step %s, which is %s", d.Step, st.Status)
		case st.JobID != d.JobID:
			return bad("completes step %s with job %s, but the step's current job is %s", d.Step, d.JobID, st.JobID)
		case st.Outcome == outcomeFailed:
			return bad("completes step %s with job %s, whose run or validation failed", d.Step, d.JobID)
		case st.Outcome != outcomePassed:
			return bad("completes step %s with job %s, whose validation has not passed", d.Step, d.JobID)
		case s.gated(st) && !st.Approved:
			return bad("completes step %s with job %s, which was not approved (the step has an approval gate)", d.Step, d.JobID)
		case !sameArtifacts(d.Artifacts, st.Passed):
			return bad("completes step %s with artifacts %s, but the passed verdict on job %s names %s", d.Step, artifactList(d.Artifacts), d.JobID, artifactList(st.Passed))
		case d.ContentHash != schemas.ContentHash(st.Passed):
			return bad("completes step %s with content hash %s, but its artifacts hash to %s", d.Step, d.ContentHash, schemas.ContentHash(st.Passed))
		}
	case *schemas.ApprovalRequested:
		// A gate is reached by the current job's passed verdict.
		if st := s.Steps[d.Step]; st == nil || !s.gated(st) || st.Status != StepRunning || st.JobID != d.JobID || st.Outcome != outcomePassed {
			return bad("names step %s and job %s, which is not a gated step's current job with a passed verdict", d.Step, d.JobID)
		}
	case *schemas.ApprovalExpired:
		// Only a gate with a timeout expires, and as its definition says.
		st := s.Steps[d.Step]
		switch {
		case st == nil || st.JobID != d.JobID || !st.awaitingApproval():
			return bad("names step %s and job %s, which is not awaiting approval", d.Step, d.JobID)
		case st.AwaitUntil.IsZero():
			return bad("expires the approval of step %s, which has no timeout", d.Step)
		case d.OnTimeout != st.Def.Approval.Action():
			return bad("applies on_timeout %s to step %s, whose on_timeout is %s", d.OnTimeout, d.Step, st.Def.Approval.Action())
		}
	case *schemas.SessionCompleted:
		if b, blocked := s.blocker(); blocked {
			return bad("completes session %s, but %s", s.ID, b)
		}
	}
	return nil
}

// checkTakeover refuses a job.started by which another key than the
// holder's would take a job over, unless JetStream can have delivered the
// job again: at a higher delivery, and once the holder released the job or
// (with a lease) stayed silent about it for most of its lease, by the
// stream's clock. A worker's own word on its delivery is not enough: any
// key could claim one.
func (f *facts) checkTakeover(ev schemas.Event, d *schemas.JobStarted, bad func(string, ...any) error) error {
	h, ok := f.holders[d.JobID]
	if !ok || ev.Signer == "" || h.signer == ev.Signer {
		return nil
	}
	if d.Delivery <= h.delivery {
		return bad("is signed by %s and starts job %s at delivery %d, but %s holds it since delivery %d (started it at %s): a job changes hands only when it is delivered again",
			shortKey(ev.Signer), d.JobID, d.Delivery, shortKey(h.signer), h.delivery, h.at)
	}
	if h.released || h.lease == 0 {
		return nil
	}
	need := time.Duration(float64(h.lease) * takeoverMargin)
	if ev.Stored.IsZero() || h.last.IsZero() {
		return bad("is signed by %s and takes job %s over from %s, whose lease of %s cannot be checked (no stream time)",
			shortKey(ev.Signer), d.JobID, shortKey(h.signer), h.lease)
	}
	if silent := ev.Stored.Sub(h.last); silent < need {
		return bad("is signed by %s and takes job %s over from %s, which was heard from %s before (its lease is %s): a job changes hands only when its holder released it or was silent for %s",
			shortKey(ev.Signer), d.JobID, shortKey(h.signer), silent.Round(time.Millisecond), h.lease, need.Round(time.Millisecond))
	}
	return nil
}

// checkProgress refuses an event of a job's progress (an artifact, a
// tool call, a message) for a job never requested, or (signed) not by its
// holder.
func (f *facts) checkProgress(ev schemas.Event, job string, bad func(string, ...any) error) error {
	if !f.requested[job] {
		return bad("belongs to job %s, which was never requested", job)
	}
	return f.checkHolder(ev, job, false, bad)
}

// checkHolder refuses a signed event about job that its holder did not
// sign, and (with needHolder) one about a job no signed job.started
// announced. Unsigned events (no trust configured) pass.
func (f *facts) checkHolder(ev schemas.Event, job string, needHolder bool, bad func(string, ...any) error) error {
	if ev.Signer == "" {
		return nil
	}
	h, ok := f.holders[job]
	switch {
	case ok && h.signer != ev.Signer:
		return bad("is signed by %s, but job %s is held by %s (started it at %s)", shortKey(ev.Signer), job, shortKey(h.signer), h.at)
	case !ok && needHolder:
		return bad("is signed by %s, but no worker announced starting job %s (no signed job.started)", shortKey(ev.Signer), job)
	}
	return nil
}

// shortKey shortens a public key for messages: 12 characters identify it.
func shortKey(k string) string {
	if len(k) <= 12 {
		return k
	}
	return k[:12] + "…"
}

// sameArtifacts reports whether a and b name the same artifacts (name,
// object and digest), in the same order.
func sameArtifacts(a, b []schemas.ArtifactRef) bool {
	return slices.EqualFunc(a, b, func(x, y schemas.ArtifactRef) bool {
		return x.Name == y.Name && x.Object == y.Object && x.Digest == y.Digest
	})
}

// artifactList names artifacts for messages, the first few of them.
func artifactList(arts []schemas.ArtifactRef) string {
	const shown = 4
	if len(arts) == 0 {
		return "none"
	}
	parts := make([]string, 0, shown+1)
	for _, a := range arts[:min(len(arts), shown)] {
		parts = append(parts, a.Name+" ("+a.Object+")")
	}
	if len(arts) > shown {
		parts = append(parts, fmt.Sprintf("and %d more", len(arts)-shown))
	}
	return strings.Join(parts, ", ")
}

// canComplete reports whether the session is complete by its kind's rule;
// Decide completes it then, and Check accepts session.completed only then.
func (s *Session) canComplete() bool {
	_, blocked := s.blocker()
	return !blocked
}

// blocker is what keeps a session from completing: its status, its
// backlog's phase, a step (a backlog's run, a loop) and its state, or
// merges waiting.
type blocker struct{ kind, name, state string }

const (
	blockStatus  = "status"
	blockPhase   = "phase"
	blockStep    = "step"
	blockRun     = "run"
	blockLoop    = "loop"
	blockParts   = "parts"
	blockMerges  = "merges"
	blockNoLoops = "no loops"
	blockNoSteps = "no steps"
)

func (b blocker) String() string {
	switch b.kind {
	case blockStatus:
		return "it is " + b.state
	case blockPhase:
		return fmt.Sprintf("the backlog is in phase %q, not %q", b.name, schemas.PhaseDone)
	case blockParts:
		return "loop " + b.name + " has children to spawn"
	case blockMerges:
		return "passed " + b.name + " wait to be merged"
	case blockNoLoops:
		return "no loop was spawned"
	case blockNoSteps:
		return "it has no steps"
	}
	return b.kind + " " + b.name + " is " + b.state
}

// blocker returns what keeps the session from being complete, if
// anything: for a pipeline, a step not completed; for a backlog, a phase
// other than done, a run still due or running, or a merge waiting; for
// loops, a loop not done (completed or invalidated, its children
// spawned) or a merge waiting. Backlogs and loops complete only while
// running. It allocates nothing: Decide asks on every decision. Of
// several steps or loops, it names the first (a pipeline's in file order,
// others by name).
func (s *Session) blocker() (blocker, bool) {
	switch {
	case s.Backlog != nil:
		b := s.Backlog
		switch {
		case s.Status != StatusRunning:
			return blocker{kind: blockStatus, state: s.Status}, true
		case b.Phase != schemas.PhaseDone:
			return blocker{kind: blockPhase, name: b.Phase}, true
		}
		var first string
		for name, st := range s.Steps {
			if st.active() && (first == "" || name < first) {
				first = name
			}
		}
		if first != "" {
			return blocker{kind: blockRun, name: first, state: s.Steps[first].Status}, true
		}
		if s.Loops != nil && !s.Loops.idle() {
			return blocker{kind: blockMerges, name: "runs"}, true
		}
	case s.Loops != nil:
		l := s.Loops
		switch {
		case s.Status != StatusRunning:
			return blocker{kind: blockStatus, state: s.Status}, true
		case len(l.Loops) == 0:
			return blocker{kind: blockNoLoops}, true
		case !l.idle():
			return blocker{kind: blockMerges, name: "loops"}, true
		}
		var first string
		for id, lp := range l.Loops {
			if (lp.Status != LoopCompleted && lp.Status != LoopInvalidated || len(lp.Parts) > 0) && (first == "" || id < first) {
				first = id
			}
		}
		switch lp := l.Loops[first]; {
		case first == "":
		case lp.Status != LoopCompleted && lp.Status != LoopInvalidated:
			return blocker{kind: blockLoop, name: first, state: lp.Status}, true
		default:
			return blocker{kind: blockParts, name: first}, true
		}
	default:
		if len(s.Steps) == 0 {
			return blocker{kind: blockNoSteps}, true
		}
		// A pipeline session's steps are its pipeline's (newSession).
		for _, d := range s.Pipeline.Steps {
			if st := s.Steps[d.Name]; st != nil && st.Status != StepCompleted {
				return blocker{kind: blockStep, name: d.Name, state: st.Status}, true
			}
		}
	}
	return blocker{}, false
}

// Evolve applies ev to st. It never fails: events that do not fit the
// state (unknown session, stale job) change nothing but LastSeq. With Skip,
// it is the only function that changes State. Callers that read untrusted streams
// call Check first.
func Evolve(st *State, ev schemas.Event) {
	if ev.Type == schemas.TypeSessionStarted && ev.ForkOf == "" {
		if _, ok := st.Sessions[ev.Session]; !ok {
			st.Sessions[ev.Session] = newSession(st, ev)
		}
	}
	if ev.Type == schemas.TypeSessionForked && ev.ForkOf == "" {
		// The state PrepareFork read from the origin starts the fork.
		if p, ok := st.forks[ev.ID]; ok {
			delete(st.forks, ev.ID)
			if _, exists := st.Sessions[ev.Session]; !exists && p.base != nil {
				st.Sessions[ev.Session] = p.base
			}
		}
	}
	s := st.Sessions[ev.Session]
	if s == nil {
		return
	}
	if ev.Seq > s.LastSeq {
		s.LastSeq, s.LastID = ev.Seq, ev.ID
	}
	if ev.ForkOf != "" {
		// A copy is history: it moves only the session's sequence.
		return
	}
	evolveSession(s, ev)
	s.facts.record(ev)
	if s.terminal() && (s.Status == StatusClosed || s.Kind != "" || !st.Retain) {
		// Nothing is decided for a finished session again (but signals
		// are acknowledged, and a rerun reopens a completed or failed
		// pipeline session, see Retain): keep only what identifies it
		// (Check, LastSeq), so memory grows with the running sessions,
		// not the history.
		s.seen, s.facts, s.Pipeline, s.Input, s.Steps, s.Usage, s.Backlog, s.Loops, s.DefinitionFiles = nil, nil, schemas.Pipeline{}, schemas.ArtifactRef{}, nil, nil, nil, nil, nil
		st.release(s.def)
		s.def = nil
	} else if s.terminal() {
		// A completed or failed pipeline session keeps its pipeline and
		// steps, which session.rerun reopens; Check's record of its run
		// goes.
		s.seen, s.facts = nil, nil
	} else if ev.ID != "" {
		s.seen[keyOf(ev.ID)] = struct{}{}
	}
}

// eventKey stands for an event id in a running session's replay guard:
// the first 16 bytes of its SHA-256. Two ids share a key with
// probability 2⁻¹²⁸, and nobody can make an id that takes another's.
type eventKey [16]byte

func keyOf(id string) eventKey {
	sum := sha256.Sum256([]byte(id))
	return eventKey(sum[:16])
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

// newSession is the state of the session ev starts. Its definition is the
// state's copy when one is there (intern): the sessions of a busy
// orchestrator mostly run a few files, and their pipelines, prompts and
// agent specs are most of what a running session holds. Usage and the
// facts' maps are made when first written.
func newSession(st *State, ev schemas.Event) *Session {
	d := ev.Data.(*schemas.SessionStarted)
	def := st.intern(d.Pipeline)
	if def != nil {
		shared := *d
		shared.Pipeline = def.pipeline
		d = &shared
	}
	s := &Session{ID: ev.Session, Pipeline: d.Pipeline, Input: d.Input, StartID: ev.ID, Status: StatusRunning, Steps: make(map[string]*Step, len(d.Pipeline.Steps)),
		seen: map[eventKey]struct{}{}, facts: newFacts(), DefinitionFiles: d.DefinitionFiles, def: def}
	if d.Pipeline.Kind != schemas.KindPipeline {
		s.Kind = d.Pipeline.Kind
	}
	if d.Pipeline.Budget != nil {
		s.Budget = *d.Pipeline.Budget
	}
	if d.Budget != nil {
		s.Budget = s.Budget.Tighter(*d.Budget)
	}
	if d.Import != nil && s.Kind == "" {
		// An imported session waits for its step.imported events and the
		// user's resume: nothing is dispatched before.
		imp := *d.Import
		s.Import, s.Status = &imp, StatusPaused
	}
	for i := range s.Pipeline.Steps {
		def := &s.Pipeline.Steps[i]
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
	if s.Status == StatusClosed && closedIgnores(s, ev) {
		return
	}
	if (s.Status == StatusCompleted || s.Status == StatusFailed) && endedIgnores(ev) {
		return
	}
	switch d := ev.Data.(type) {
	case *schemas.Signal:
		verb := strings.TrimPrefix(ev.Type, "loopbus.signal.")
		s.Pending = append(s.Pending, PendingSignal{ID: ev.ID, Verb: verb, Step: d.Step, Reason: d.Reason, Message: d.Message, By: d.By})
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
		} else if st := s.Steps[p.Step]; st != nil && d.Result == schemas.SignalApplied && st.awaitingApproval() {
			switch p.Verb {
			case "approve":
				st.Approved = true
			case "reject":
				st.reject(p.Reason, true)
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
			st.RequestedAt, st.Started = ev.Time, false
			st.AwaitJob, st.AwaitUntil, st.Approved = "", time.Time{}, false
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
	case *schemas.JobStarted:
		if st := s.Steps[ev.Step]; st != nil && st.JobID == d.JobID {
			st.Started = true
		}
	case *schemas.JobCompleted:
		if d.Usage != nil {
			s.addUsage(d.JobID, *d.Usage)
		}
		if st := current(d.Step, d.JobID); st != nil {
			st.Reported = true
		}
	case *schemas.JobFailed:
		if d.Usage != nil {
			s.addUsage(d.JobID, *d.Usage)
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
		// A job a rerun left behind is cancelled once.
		s.Orphans = slices.DeleteFunc(s.Orphans, func(o schemas.JobCancelled) bool { return o.JobID == d.JobID })
		if st := s.Steps[d.Step]; st != nil && st.Status == StepRunning && st.JobID == d.JobID {
			// The same iteration runs again, in a new round.
			st.Status, st.Round, st.Outcome, st.Passed, st.Failure = StepPending, st.Round+1, outcomeNone, nil, nil
			st.giveBackHints()
		}
	case *schemas.StepWaiting:
		if st := s.Steps[d.Step]; st != nil && st.JobID == d.JobID {
			st.WaitJob, st.WaitUntil = d.JobID, d.Until
		}
	case *schemas.ApprovalRequested:
		if st := s.Steps[d.Step]; st != nil && st.Status == StepRunning && st.JobID == d.JobID && st.Outcome == outcomePassed {
			st.AwaitJob, st.AwaitUntil = d.JobID, time.Time{}
			if d.Until != nil {
				st.AwaitUntil = *d.Until
			}
		}
	case *schemas.ApprovalExpired:
		if st := s.Steps[d.Step]; st != nil && st.JobID == d.JobID && st.awaitingApproval() {
			switch d.OnTimeout {
			case schemas.OnTimeoutApprove:
				st.Approved = true
			case schemas.OnTimeoutReject:
				st.reject(d.Reason, false)
			}
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
			st.startOver(false)
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
		s.StopBudgetID = s.BudgetID
	case *schemas.SessionResumed:
		s.Status, s.StopKind = StatusRunning, ""
		s.Resumes++
	case *schemas.SessionBudget:
		if !s.terminal() {
			s.Budget = s.Budget.With(d.Budget)
			s.BudgetID = ev.ID
		}
	case *schemas.SessionRerun:
		s.rerun(ev)
	case *schemas.StepImported:
		if s.importable(ev) == "" {
			st := s.Steps[d.Step]
			st.Status, st.Artifacts, st.Imported = StepCompleted, slices.Clone(d.Artifacts), true
		}
	case *schemas.SessionClosed:
		if !s.terminal() {
			for _, name := range s.stepNames() {
				if st := s.Steps[name]; st.inFlight() {
					s.Orphans = append(s.Orphans, schemas.JobCancelled{JobID: st.JobID, Step: name, Iteration: st.Iteration, Reason: "session closed"})
				}
			}
			s.Status, s.StopKind = StatusClosed, ""
		}
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

// addUsage records a job's reported usage. Only a running (or paused,
// stopped) session's jobs count: a finished session ignores them.
func (s *Session) addUsage(job string, u schemas.Usage) {
	if s.terminal() {
		return
	}
	if s.Usage == nil {
		s.Usage = map[string]schemas.Usage{}
	}
	s.Usage[job] = u
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

// closedIgnores reports whether a closed session ignores ev: everything
// but signals (acknowledged as ignored) and the cancellations of the jobs
// it left in flight. No later event reopens, completes or fails it.
func closedIgnores(s *Session, ev schemas.Event) bool {
	switch d := ev.Data.(type) {
	case *schemas.Signal, *schemas.SignalAcknowledged:
		return false
	case *schemas.JobCancelled:
		s.Orphans = slices.DeleteFunc(s.Orphans, func(o schemas.JobCancelled) bool { return o.JobID == d.JobID })
	}
	return true
}
