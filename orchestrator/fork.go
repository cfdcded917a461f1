package orchestrator

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/loopbus/loopbus/schemas"
)

// The orchestrator's part of loopbus fork (schemas.SessionForked).
//
// A fork's history begins with copies of the origin's events, published
// by whoever forked (the client role), and then session.forked. The
// copies are history for people and projections: the orchestrator takes
// no fact from them, since a client could write any history there.
// Instead, before it checks session.forked, it reads the origin's own
// history up to the fork point (PrepareFork), events it verified as the
// origin's when they came, and folds it as it folded it then; the fork
// starts from that state, renamed, with its pipeline and input, and the
// steps that do not keep their results pending (in a new round when they
// had run). Jobs the
// origin had in flight at the fork point stay the origin's: the fork's
// jobs have ids of their own (JobID includes the session), so a late
// result of the origin's job can never be taken for the fork's.

// HistoryReader calls fn with the events of session, in stream order, up
// to stream sequence until (every event when until is 0), copies included;
// an error of fn stops the read and is returned.
type HistoryReader func(session string, until uint64, fn func(schemas.Event) error) error

// errStopRead ends a HistoryReader's read early without an error.
var errStopRead = errors.New("stop reading")

// errTooMany ends PrepareFork's read of an origin that has more events
// up to the fork point than a fork copies.
var errTooMany = errors.New("more events than a fork copies")

// forkPrep is what PrepareFork found for a session.forked: the fork's
// first state, or why the event cannot fork (refusal).
type forkPrep struct {
	base    *Session
	refusal error
}

// PrepareFork reads, through read, the origin's history up to the fork
// point of session.forked ev and keeps, for Check and Evolve, the state
// the fork starts from, or why it cannot start (an unknown origin or
// fork point, a point inside the origin's own copied history, an origin
// that is not a pipeline session, a count of copies that does not match).
// It does nothing when ev's session exists (Check refuses ev). The
// returned function forgets what it kept, for an ev that is not applied.
// An error is one of read: nothing is kept.
func PrepareFork(st *State, ev schemas.Event, read HistoryReader) (forget func(), err error) {
	return prepareFork(st, ev, read, 0)
}

func prepareFork(st *State, ev schemas.Event, read HistoryReader, depth int) (forget func(), err error) {
	forget = func() {}
	d, ok := ev.Data.(*schemas.SessionForked)
	if !ok || st.Sessions[ev.Session] != nil {
		return forget, nil
	}
	keep := func(p forkPrep) (func(), error) {
		if st.forks == nil {
			st.forks = map[string]forkPrep{}
		}
		st.forks[ev.ID] = p
		return func() { delete(st.forks, ev.ID) }, nil
	}
	refuse := func(kind error, format string, a ...any) (func(), error) {
		return keep(forkPrep{refusal: fmt.Errorf("%w: %s %s", kind, ev.Type, fmt.Sprintf(format, a...))})
	}
	switch {
	case d.Origin == ev.Session:
		return refuse(ErrInconsistent, "forks session %s into itself", ev.Session)
	case depth >= schemas.MaxForkDepth:
		return refuse(ErrInconsistent, "forks session %s, a fork more than %d forks deep", d.Origin, schemas.MaxForkDepth)
	case d.Copied > schemas.MaxForkCopies:
		// Refused before reading: the read holds the service up.
		return refuse(ErrInconsistent, "says it copied %d events of session %s; a fork copies at most %d", d.Copied, d.Origin, schemas.MaxForkCopies)
	}
	tmp := NewState()
	tmp.Retain = true
	var point *schemas.Event
	events := 0
	err = foldHistory(tmp, d.Origin, d.Seq, read, depth+1, func(o schemas.Event) error {
		if events++; events > schemas.MaxForkCopies {
			return errTooMany
		}
		if o.Seq == d.Seq {
			point = &o
		}
		return nil
	})
	if errors.Is(err, errTooMany) {
		return refuse(ErrInconsistent, "forks session %s at stream sequence %d, after more than %d of its events; a fork copies at most %d", d.Origin, d.Seq, schemas.MaxForkCopies, schemas.MaxForkCopies)
	}
	if err != nil {
		return forget, err
	}
	origin := tmp.Sessions[d.Origin]
	switch {
	case events == 0:
		return refuse(ErrNoSession, "forks session %s, which has no events (never started, or no longer in the stream)", d.Origin)
	case point == nil:
		return refuse(ErrInconsistent, "forks session %s at stream sequence %d, which holds no event of it", d.Origin, d.Seq)
	case point.ID != d.Event:
		return refuse(ErrInconsistent, "forks session %s at event %s, but its event at stream sequence %d is %s", d.Origin, d.Event, d.Seq, point.ID)
	case origin == nil:
		return refuse(ErrInconsistent, "forks session %s at stream sequence %d, before the session started (in the history it copied from its own origin)", d.Origin, d.Seq)
	case origin.Status == StatusClosed:
		// A closed session keeps nothing of its steps (see Evolve).
		return refuse(ErrInconsistent, "forks session %s after it was closed for good: fork it at an event before its session.closed", d.Origin)
	case orElse(origin.Kind, schemas.KindPipeline) != orElse(d.Pipeline.Kind, schemas.KindPipeline):
		return refuse(ErrInconsistent, "forks %s session %s into a %s session: a fork keeps its origin's kind", orElse(origin.Kind, schemas.KindPipeline), d.Origin, orElse(d.Pipeline.Kind, schemas.KindPipeline))
	case d.Copied != events:
		return refuse(ErrInconsistent, "says it copied %d events of session %s, but the session has %d up to stream sequence %d", d.Copied, d.Origin, events, d.Seq)
	case origin.Kind == schemas.KindBacklog:
		if reason := backlogForkRefusal(origin, d); reason != "" {
			return refuse(ErrInconsistent, "forks backlog session %s: %s", d.Origin, reason)
		}
		return keep(forkPrep{base: origin.forkBacklogAs(ev, d)})
	case origin.Kind == schemas.KindLoops:
		if reason := loopsForkRefusal(origin, d); reason != "" {
			return refuse(ErrInconsistent, "forks loops session %s: %s", d.Origin, reason)
		}
		return keep(forkPrep{base: origin.forkLoopsAs(ev, d)})
	case len(d.Pipeline.Steps) == 0:
		return refuse(ErrInconsistent, "gives the fork a pipeline without steps")
	}
	return keep(forkPrep{base: origin.forkAs(ev, d)})
}

// loopsForkRefusal says why a loops session o cannot fork as d says
// ("" when it can): its state at the point is gone (it had ended: a
// finished loops session keeps nothing of its loops; loopbus fork moves
// such a point back before the decision that ended it), the fork's file has
// no levels, works in git worktrees while the origin has no repository,
// or would run again (or drop) a loop whose commits were merged into the
// target branch at the fork point: the fork's target starts at the
// origin's head there, which holds them, and later merges were built on
// them (loopbus fork moves such a point back before the decision that
// merged the first of them, where this accepts it).
func loopsForkRefusal(o *Session, d *schemas.SessionForked) string {
	switch {
	case o.Loops == nil || o.terminal():
		return "it had ended at the fork point (" + o.Status + "): fork it at an event before its end"
	case d.Pipeline.Loops == nil || len(d.Pipeline.Loops.Levels) == 0:
		return "the fork's file has no levels"
	case d.Pipeline.Loops.NeedsRepo() && o.Loops.Start.Bundle == nil:
		return "the fork's file has levels that work in git worktrees, and the origin works on no repository"
	}
	fate := o.loopFates(d)
	var merged []string
	for _, id := range sortedLoopIDs(o.Loops) {
		if lp := o.Loops.Loops[id]; lp.Status == LoopCompleted && lp.MergeCommit != "" && fate[id] != forkKept {
			merged = append(merged, id)
		}
	}
	if len(merged) > 0 {
		return fmt.Sprintf("loops merged into %s at the fork point would run again or go (%s: their level, or one above them, changed): "+
			"their commits are in the target branch the fork starts from, and later work was built on them; fork at an event before their merge, or keep their levels",
			TargetOf(o.ID), strings.Join(merged, ", "))
	}
	return ""
}

// loopFates says what a fork of o as d does with each loop of o at the
// fork point (by loop id): a loop is kept (forkKept; its subtree stands)
// when it had completed and its level is not in d.Changed nor differs
// from the origin's; an invalidated loop under a kept one stays so
// (forkStale) until it is spawned anew; a loop under one that does not
// stand, or whose level the fork's file no longer has, is dropped; every
// other loop runs again (forkAgain).
func (o *Session) loopFates(d *schemas.SessionForked) map[string]string {
	changed := slices.Concat(d.Changed, schemas.ChangedLevels(o.Pipeline, d.Pipeline, o.DefinitionFiles, d.DefinitionFiles, o.Input.Digest != d.Input.Digest))
	fate := map[string]string{}
	for _, id := range sortedLoopIDs(o.Loops) {
		// Sorted ids put a parent before its children.
		old := o.Loops.Loops[id]
		switch parent := fate[old.Parent]; {
		case old.Parent != "" && parent != forkKept && parent != forkStale, d.Pipeline.Loops.Level(old.Level) == nil:
			fate[id] = forkDropped
		case old.Status == LoopCompleted && !slices.Contains(changed, old.Level) && o.Steps[id] != nil:
			fate[id] = forkKept
		case old.Status == LoopInvalidated && o.Steps[id] != nil:
			fate[id] = forkStale
		default:
			fate[id] = forkAgain
		}
	}
	return fate
}

// forkLoopsAs is forkAs for a loops session: the fork's loop tree is the
// origin's at the fork point, each loop as loopFates says: a kept or
// stale loop keeps its results; a loop that runs again does so in a new
// round with the fork's level, and the loops under it are dropped: it
// spawns them anew when it passes. When the root goes, the fork spawns
// the new root.
//
// The fork's target branch is its own (TargetOf its session, as are its
// loops' branches and its jobs), and starts at the origin's target head
// at the fork point: the bundles of the origin's start and merges up to
// there, shared write-once artifacts, bring a worker to it. Loops that
// had not merged there (running, or passed and queued) run again on that
// head; the origin's merge in flight stays the origin's.
func (o *Session) forkLoopsAs(ev schemas.Event, d *schemas.SessionForked) *Session {
	fate := o.loopFates(d)
	s := o.forkBase(ev, d)
	s.Kind = schemas.KindLoops
	l := o.Loops.forkTarget(ev.Session, *d.Pipeline.Loops)
	s.Loops = l
	for _, id := range sortedLoopIDs(o.Loops) {
		old := o.Loops.Loops[id]
		lv := l.Def.Level(old.Level)
		switch fate[id] {
		case forkDropped:
			continue
		case forkKept, forkStale:
			lp := *old
			lp.Parts = slices.Clone(old.Parts)
			l.Loops[id] = &lp
			st := *o.Steps[id]
			st.Def = loopStepDef(id, lv)
			s.Steps[id] = &st
			continue
		}
		lp := *old
		lp.startOver(l.Head)
		l.Loops[id] = &lp
		st := &Step{Def: loopStepDef(id, lv), Status: StepPending}
		if prev := o.Steps[id]; prev != nil {
			st.Round = prev.Round
			if prev.JobID != "" {
				st.Round++
			}
		}
		s.Steps[id] = st
	}
	return s
}

// forkTarget is the repository part of a fork (session) of l's session,
// whose loops run def: its target branch is its own (TargetOf session,
// when l's session has one) and starts at l's head, which l's bundles (the
// origin's start and merges, shared write-once artifacts) bring a worker
// to; the merge count goes on. It has no loops yet, and no merge queue:
// the origin's merge in flight stays the origin's.
func (l *LoopsState) forkTarget(session string, def schemas.Loops) *LoopsState {
	f := &LoopsState{Def: def, Start: l.Start, Loops: map[string]*Loop{}, Head: l.Head, Bundles: slices.Clone(l.Bundles), Merges: l.Merges}
	if f.Start.Target != "" {
		f.Start.Target = TargetOf(session)
	}
	return f
}

// startOver makes a loop of an origin one that runs again in a fork, on
// the fork's target head: what it had done, passed or merged is the
// origin's.
func (lp *Loop) startOver(head string) {
	lp.Status, lp.Candidate, lp.Passed, lp.Parts, lp.Base, lp.MergeCommit, lp.Rebases, lp.ChildErrors = LoopRunning, nil, nil, nil, head, "", 0, 0
}

// What a fork does with a loop of its origin.
const (
	forkKept    = "kept"
	forkAgain   = "again"
	forkDropped = "dropped"
	forkStale   = "stale"
)

// foldHistory folds session's history up to stream sequence until (all
// of it when 0) into st as the service folded it: copies are skipped, a
// session.forked is prepared (reading its own origin), and events Check
// refuses are skipped. Each event read, copies included, is passed to
// seen when it is not nil; an error of seen stops the read and is
// returned.
func foldHistory(st *State, session string, until uint64, read HistoryReader, depth int, seen func(schemas.Event) error) error {
	err := read(session, until, func(ev schemas.Event) error {
		if until != 0 && ev.Seq > until {
			return errStopRead
		}
		if seen != nil {
			if err := seen(ev); err != nil {
				return err
			}
		}
		if ev.ForkOf != "" || ev.Session != session {
			return nil
		}
		forget := func() {}
		if ev.Type == schemas.TypeSessionForked {
			var err error
			if forget, err = prepareFork(st, ev, read, depth); err != nil {
				return err
			}
		}
		if Check(st, ev) != nil {
			forget()
			return nil
		}
		_ = safeEvolve(st, ev) // one that crashed the fold was dead-lettered then
		return nil
	})
	if errors.Is(err, errStopRead) {
		err = nil
	}
	return err
}

// checkForked refuses a session.forked that does not start its session:
// one whose session exists (a copy of the event that started it is a
// replay), or whose origin PrepareFork could not fork.
func checkForked(st *State, ev schemas.Event) error {
	if s := st.Sessions[ev.Session]; s != nil {
		if s.StartID == ev.ID {
			return fmt.Errorf("%w: session %s was already started by this event", ErrReplayed, ev.Session)
		}
		return fmt.Errorf("%w: %s forks into session %s, which exists (started by event %s)", ErrReplayed, ev.Type, ev.Session, s.StartID)
	}
	p, ok := st.forks[ev.ID]
	switch {
	case !ok:
		return fmt.Errorf("%w: %s: the origin's history was not read (PrepareFork)", ErrInconsistent, ev.Type)
	case p.refusal != nil:
		return p.refusal
	}
	return nil
}

// forkAs turns the origin's state at the fork point into the fork's
// first state: the session of ev, started by it, running d's pipeline on
// d's input. A step keeps its results when it completed at the fork
// point, its definition is not in d.Changed nor differs from the
// origin's, and it requires no step that runs again; every other step
// starts over in a new round (so its jobs are new). Usage and agent runs
// so far are the fork's history, and count against its budget.
func (o *Session) forkAs(ev schemas.Event, d *schemas.SessionForked) *Session {
	changed := slices.Concat(d.Changed, schemas.ChangedSteps(o.Pipeline, d.Pipeline, o.DefinitionFiles, d.DefinitionFiles, o.Input.Digest != d.Input.Digest))
	again := map[string]bool{}
	for _, def := range d.Pipeline.Steps {
		old := o.Steps[def.Name]
		again[def.Name] = old == nil || old.Status != StepCompleted || slices.Contains(changed, def.Name)
	}
	for grew := true; grew; {
		grew = false
		for _, def := range d.Pipeline.Steps {
			if !again[def.Name] && slices.ContainsFunc(def.Requires, func(r string) bool { return again[r] }) {
				again[def.Name], grew = true, true
			}
		}
	}
	s := o.forkBase(ev, d)
	for i := range s.Pipeline.Steps {
		def := &s.Pipeline.Steps[i] // the definition is the pipeline's, shared
		old := o.Steps[def.Name]
		switch {
		case old == nil:
			s.Steps[def.Name] = &Step{Def: def, Status: StepPending}
		case again[def.Name]:
			// A step that ran starts over in a new round, with the
			// fork's definition: what it left for its next job
			// (feedback of failed iterations) was the origin's run's.
			round := old.Round
			if old.JobID != "" {
				round++
			}
			s.Steps[def.Name] = &Step{Def: def, Status: StepPending, Round: round}
		default:
			kept := *old
			kept.Def = def
			s.Steps[def.Name] = &kept
		}
	}
	return s
}

// forkBase is the fork's session without steps: the session of ev,
// started by it, running d's pipeline on d's input under the origin's
// budget at the fork point (raises by session.budget included: usage
// carries over, so the pipeline's budget alone could stop the fork at
// once) tightened by d.Budget; usage and agent runs so far are the
// fork's history, and count against its budget.
func (o *Session) forkBase(ev schemas.Event, d *schemas.SessionForked) *Session {
	s := &Session{ID: ev.Session, Pipeline: d.Pipeline, Input: d.Input, StartID: ev.ID, Status: StatusRunning, Steps: map[string]*Step{},
		Usage: o.Usage, Requests: o.Requests, seen: map[eventKey]struct{}{}, facts: newFacts(), DefinitionFiles: d.DefinitionFiles, Budget: o.Budget}
	if d.Budget != nil {
		s.Budget = s.Budget.Tighter(*d.Budget)
	}
	return s
}

// backlogForkRefusal says why a backlog session o cannot fork as d says
// ("" when it can): its state at the point is gone (it had ended;
// loopbus fork moves such a point back before the decision that ended
// it), the fork's file is no backlog, one of the two works on a repository
// (workdir: repo) and the other does not (a fork keeps its origin's
// workdir: its runs' changes are in the target branch, or in none), or a
// role whose definition changed had completed runs at the fork point:
// their changes are in the task list, which a fork keeps as it was, and
// later runs worked on it (loopbus fork moves such a point back before
// the decision that completed the first of them, where this accepts it).
func backlogForkRefusal(o *Session, d *schemas.SessionForked) string {
	repo := d.Pipeline.Backlog != nil && d.Pipeline.Backlog.Workdir == schemas.WorkdirRepo
	switch {
	case o.Backlog == nil || o.terminal():
		return "it had ended at the fork point (" + o.Status + "): fork it at an event before its end"
	case d.Pipeline.Backlog == nil:
		return "the fork's file is no backlog"
	case repo && o.Loops == nil:
		return "the fork's file has workdir: repo, and the origin works on no repository: a fork keeps its origin's workdir"
	case !repo && o.Loops != nil:
		return "the origin works on a repository (workdir: repo, target " + TargetOf(o.ID) + "), and the fork's file has no workdir: repo: a fork keeps its origin's workdir"
	}
	changed := slices.Concat(d.Changed, schemas.ChangedRoles(o.Pipeline, d.Pipeline, o.DefinitionFiles, d.DefinitionFiles, o.Input.Digest != d.Input.Digest))
	for _, role := range changed {
		var done []string
		for _, name := range slices.Sorted(maps.Keys(o.Steps)) {
			if st := o.Steps[name]; st.Status == StepCompleted && roleOf(name) == role {
				done = append(done, name)
			}
		}
		if len(done) > 0 {
			return fmt.Sprintf("role %s changed, and runs of it had completed at the fork point (%s): their changes are in the task list the fork keeps, and later runs worked on it; fork at an event before them, or keep the role",
				role, strings.Join(done, ", "))
		}
	}
	return ""
}

// roleOf is the backlog role a step runs: its name for role steps, else
// iterate (a task run).
func roleOf(step string) string {
	if slices.Contains(roleSteps, step) {
		return step
	}
	return schemas.RoleIterate
}

// forkBacklogAs is forkAs for a backlog session: the fork's task list,
// phase and run counts are the origin's at the fork point; runs that had
// completed or failed keep their results (their changes are in the task
// list); runs not finished (due, running, waiting for approval) run again
// from their first iteration, in jobs of the fork, with the fork's
// definition of their role. backlogForkRefusal refused the rest.
//
// With workdir: repo, the fork's target branch is its own and starts at
// the origin's target head at the fork point (see forkTarget): runs merged
// there are kept, their commits in it. A run whose work had passed but
// was not merged there (queued, or its merge in flight) is not finished
// either: it runs again on that head, and its task's entry stays as its
// summary left it until its run in the fork passes (as after a
// conflicting merge); the origin's merge in flight stays the origin's.
func (o *Session) forkBacklogAs(ev schemas.Event, d *schemas.SessionForked) *Session {
	s := o.forkBase(ev, d)
	s.Kind = schemas.KindBacklog
	b := o.Backlog.clone()
	b.Def = *d.Pipeline.Backlog
	s.Backlog = b
	again := func(name string) bool { return o.Steps[name].active() }
	if o.Loops != nil {
		s.Loops = o.Loops.forkTarget(ev.Session, o.Loops.Def)
		again = func(name string) bool { return o.Steps[name].active() || o.busyTask(name) }
		for id, old := range o.Loops.Loops {
			lp := *old
			lp.Parts = slices.Clone(old.Parts)
			if o.Steps[id] == nil || again(id) {
				lp.startOver(s.Loops.Head)
			}
			s.Loops.Loops[id] = &lp
		}
	}
	for name, old := range o.Steps {
		if !again(name) {
			kept := *old
			s.Steps[name] = &kept
			continue
		}
		agent := b.roleAgent(name)
		if roleOf(name) == schemas.RoleIterate {
			agent = agentNamed(o.Backlog.Def, old.Def.Agent, b.iterateAgent(1))
		}
		// The round stays: the fork's job ids are its own (they hold its
		// session), and a later selection of the task counts its rounds
		// from its runs.
		s.Steps[name] = &Step{Def: b.stepDef(name, agent, s), Status: StepPending, Round: old.Round, Hints: slices.Clone(old.Hints)}
	}
	return s
}

// agentNamed returns the name def gives spec, or otherwise when none.
func agentNamed(def schemas.Backlog, spec schemas.AgentSpec, otherwise string) string {
	want, _ := json.Marshal(spec)
	for _, name := range slices.Sorted(maps.Keys(def.Agents)) {
		if got, _ := json.Marshal(def.Agents[name]); string(got) == string(want) {
			return name
		}
	}
	return otherwise
}
