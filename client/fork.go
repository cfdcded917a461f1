package client

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/loopbus/loopbus/backlog"
	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/projections"
	"github.com/loopbus/loopbus/schemas"
)

// ForkBus is what Fork needs from the bus: a fork's history and its
// session.forked are committed in one atomic batch.
type ForkBus interface {
	Bus
	PublishBatch(ctx context.Context, session string, expectLast uint64, evs []schemas.Event) (bus.Published, error)
}

// ForkRequest says what to fork and how.
type ForkRequest struct {
	// Origin is the session forked.
	Origin string
	// At is the fork point: a stream sequence (e.g. "42") or an event id
	// of Origin; the fork's history is Origin's up to it, included.
	At string
	// As is the fork's session id; "" gives <origin>-fork-<4 hex>.
	As string
	// Pipeline replaces the origin's (nil: the origin's, with its files).
	Pipeline *schemas.Pipeline
	// Input is a file replacing the origin's input ("": the origin's).
	Input  string
	Reason string
}

// Forked is a fork written to the stream.
type Forked struct {
	// Session is the fork's id; Event its session.forked, stored at Seq.
	Session string
	Event   schemas.Event
	Seq     uint64
	// Point is the origin's event at the fork point; Requested the one
	// asked for. They differ when Requested is at or after the end of a
	// loops or backlog origin, or the fork's pipeline runs again work
	// done before Requested that later work was built on: Point is then
	// the last event before the decision that ended the session or did
	// the first of that work, and Redo what each step back moved before,
	// the first of it last (see Fork); nil when Point is Requested.
	Point, Requested schemas.Event
	Redo             []ForkRedo
	// Kept are the steps that keep the origin's results; Again the steps
	// that run again (changed, not completed at the point, or requiring
	// one that runs again).
	Kept, Again []string
}

// MovedBack says in one line why the fork point moved back from the one
// asked for, e.g. "fork point moved back from stream sequence 57 to 41:
// loop plan-002 (level code, changed) merged at 44, and later work was
// built on it", or "fork point moved back from stream sequence 57 to 55:
// session lp-1 completed at 57, and a fork starts from a running
// session"; "" when it did not.
func (f Forked) MovedBack() string {
	if len(f.Redo) == 0 {
		return ""
	}
	var redo, why []string
	end := ""
	for _, r := range slices.Backward(f.Redo) {
		if r.Kind == forkRedoEnd {
			end = r.String() + ", and a fork starts from a running session"
		} else {
			redo = append(redo, r.String())
		}
	}
	if len(redo) > 0 {
		on := "it"
		if len(redo) > 1 {
			on = "them"
		}
		why = append(why, strings.Join(redo, ", ")+", and later work was built on "+on)
	}
	if end != "" {
		why = append(why, end)
	}
	return fmt.Sprintf("fork point moved back from stream sequence %d to %d: %s", f.Requested.Seq, f.Point.Seq, strings.Join(why, "; "))
}

// NewForkID returns "<origin>-fork-<4 hex>", shortened to fit the
// 64-character limit.
func NewForkID(origin string) string {
	var b [2]byte
	_, _ = rand.Read(b[:])
	suffix := "-fork-" + hex.EncodeToString(b[:])
	if max := schemas.MaxIDLen - len(suffix); len(origin) > max {
		origin = origin[:max]
	}
	return origin + suffix
}

// Fork starts a new session whose history is req.Origin's up to the fork
// point, then goes on live (see schemas.SessionForked): it copies the
// origin's events up to the point, each with a new id and ForkOf naming
// the event it copies, and publishes them with session.forked in one
// atomic batch, so a fork exists whole or not at all. The origin is not
// written to. Ids derive from the fork's session, the origin's events and
// what the fork runs, so a publish retried after a lost acknowledgement
// is not doubled (and a fork command run again finds its session exists).
// The fork runs under the origin's budget at the point (raises by
// loopbus budget included), tightened by a changed pipeline's budget.
//
// Changed work runs again with its dependents, and so does work built on
// it: when req.Pipeline runs again (or drops) a loop merged into the
// origin's target branch before the requested point (its level, or one
// above it, changed), or a backlog run of a changed role that had
// completed there, every later merge or run of the origin was built on
// it (on a target holding its commits, on the task list it left). Then
// the fork point moves back to the last event before the orchestrator's
// decision that merged the first such loop or completed the first such
// run, where it was not done yet, and again until no such work is left
// (see forkPoint): the fork is an ordinary fork at that point, and
// Forked says where it moved and why.
//
// A loops or backlog session forks from a running session: the
// orchestrator keeps nothing of a finished one's loop tree or runs. So a
// point at or after its end (its own session.completed or session.failed
// is in the history up to it) moves back first, to the last event before
// the orchestrator's decision that ended it, where it was still running;
// the checks above go on from there. Forked at its end, a completed
// session then runs again the loops or runs its last decision completed
// (their results had come in) and what the fork's pipeline changed; a
// failed one runs again, from its first iteration, the loop or run whose
// failure ended it.
//
// Errors: ErrNoSession for an unknown origin; ErrSessionExists for a
// fork id in use; ErrBadInput (with what to do) for an unsafe id, a fork
// point that is no event of the origin (an unknown sequence or id, an
// event of another session, a point beyond the origin's end, a point in
// the history the origin copied from its own origin, or one moved back
// there or before the origin's start), an origin with more than
// schemas.MaxForkCopies events up to the point, an origin at the end of
// a chain of schemas.MaxForkDepth forks, a backlog fork that switches
// between workdir: repo and not, a session forked at or after its
// session.closed, a pipeline of another kind, or an unusable input file.
//
// A fork of a session that works on a repository (loops in git
// worktrees, a backlog with workdir: repo) has a target branch of its
// own, loopbus/<fork>, that starts at the origin's target head at the
// point: what was merged there stays (those loops and runs are kept);
// what was not runs again on that head (see loopbus pull).
func Fork(ctx context.Context, b ForkBus, req ForkRequest) (Forked, error) {
	if err := schemas.ValidateSessionID(req.Origin); err != nil {
		return Forked{}, fmt.Errorf("%w: %v", ErrBadInput, err)
	}
	if err := checkReason(req.Reason); err != nil {
		return Forked{}, err
	}
	as := req.As
	if as == "" {
		as = NewForkID(req.Origin)
	} else if err := schemas.ValidateSessionID(as); err != nil {
		return Forked{}, fmt.Errorf("%w: --as: %v", ErrBadInput, err)
	}
	if as == req.Origin {
		return Forked{}, fmt.Errorf("%w: a fork is a new session: give it another id than %s", ErrBadInput, req.Origin)
	}
	history, err := readToPoint(ctx, b, req.Origin, req.At)
	if err != nil {
		return Forked{}, err
	}
	point := history[len(history)-1]
	start := ownStart(history)
	switch {
	case start == nil:
		origin, err := forkOrigin(ctx, b, req.Origin)
		if err != nil {
			return Forked{}, err
		}
		return Forked{}, fmt.Errorf("%w: the event at stream sequence %d is in the history %s copied from its origin; fork that session instead (loopbus fork %s --at %s)",
			ErrBadInput, point.Seq, req.Origin, origin, point.ForkOf)
	case slices.ContainsFunc(history, func(ev schemas.Event) bool { return ev.Type == schemas.TypeSessionClosed && ev.ForkOf == "" }):
		return Forked{}, fmt.Errorf("%w: %s was closed for good at or before stream sequence %d; fork it at an event before its session.closed", ErrBadInput, req.Origin, point.Seq)
	case req.Pipeline != nil && orElse(req.Pipeline.Kind, schemas.KindPipeline) != orElse(start.Pipeline.Kind, schemas.KindPipeline):
		return Forked{}, fmt.Errorf("%w: --pipeline %s is of kind %s, %s is a %s session: a fork keeps its origin's kind", ErrBadInput, req.Pipeline.Source,
			orElse(req.Pipeline.Kind, schemas.KindPipeline), req.Origin, orElse(start.Pipeline.Kind, schemas.KindPipeline))
	}
	if start.Pipeline.Kind == schemas.KindLoops || start.Pipeline.Kind == schemas.KindBacklog {
		if err := forkableTree(req, start, history); err != nil {
			return Forked{}, err
		}
	}
	if err := checkForkDepth(ctx, b, req.Origin); err != nil {
		return Forked{}, err
	}
	if last, err := b.SessionLastSeq(ctx, as); err != nil {
		return Forked{}, err
	} else if last != 0 {
		return Forked{}, fmt.Errorf("%w: %s (a fork is a new session: pick another --as)", ErrSessionExists, as)
	}

	data := &schemas.SessionForked{Origin: req.Origin, Pipeline: start.Pipeline, Input: start.Input, SourceHash: start.SourceHash,
		DefinitionFiles: start.DefinitionFiles, Reason: req.Reason}
	if req.Pipeline != nil {
		data.Pipeline = *req.Pipeline
		if req.Input == "" {
			for _, st := range data.Pipeline.Steps {
				if slices.ContainsFunc(st.Outputs, func(o schemas.Output) bool { return o.Name == data.Input.Name }) {
					return Forked{}, fmt.Errorf("%w: the input %s of %s has the name of step %s's output in %s; give the fork another input (--input)",
						ErrBadInput, data.Input.Name, req.Origin, st.Name, data.Pipeline.Source)
				}
			}
		}
		if data.DefinitionFiles, err = storeDefinition(ctx, b, as, data.Pipeline); err != nil {
			return Forked{}, err
		}
	}
	if req.Input != "" {
		f, name, err := openInput(data.Pipeline, req.Input)
		if err != nil {
			return Forked{}, err
		}
		ref, err := b.PutArtifact(ctx, as+"/input/"+name, name, f)
		_ = f.Close()
		if err != nil {
			return Forked{}, err
		}
		data.Input, data.SourceHash = ref, schemas.ShortHash(ref.Digest)
	}
	inputChanged := data.Input.Digest != start.Input.Digest
	switch data.Pipeline.Kind {
	case schemas.KindLoops:
		data.Changed = schemas.ChangedLevels(start.Pipeline, data.Pipeline, start.DefinitionFiles, data.DefinitionFiles, inputChanged)
	case schemas.KindBacklog:
		data.Changed = schemas.ChangedRoles(start.Pipeline, data.Pipeline, start.DefinitionFiles, data.DefinitionFiles, inputChanged)
	default:
		data.Changed = schemas.ChangedSteps(start.Pipeline, data.Pipeline, start.DefinitionFiles, data.DefinitionFiles, inputChanged)
	}
	requested := point
	n, redo, err := forkPoint(history, req.Origin, data)
	if err != nil {
		return Forked{}, err
	}
	history, point = history[:n], history[n-1]

	// The fork runs under the origin's budget at the point, raises by
	// loopbus budget included (its usage carries over).
	if m := projections.BuildManifest(req.Origin, history); m != nil {
		data.Budget = m.Budget
	}
	if req.Pipeline != nil {
		if nb := req.Pipeline.Budget; nb != nil && (start.Pipeline.Budget == nil || *nb != *start.Pipeline.Budget) {
			// A changed pipeline's budget tightens the fork's (the
			// origin's unchanged one is in it already).
			tight := nb.Tighter(orElseBudget(data.Budget))
			data.Budget = &tight
		}
	}
	data.Seq, data.Event, data.Copied = point.Seq, point.ID, len(history)

	batch := copyHistory(history, as)
	what, _ := json.Marshal(data)
	forked := schemas.Event{
		ID:   schemas.DeterministicID(as, schemas.TypeSessionForked, req.Origin, strconv.FormatUint(data.Seq, 10), data.Event, schemas.Digest(what)),
		Type: schemas.TypeSessionForked, Session: as, Time: time.Now().UTC(), Data: data,
	}
	forked.Correlation = forked.ID
	batch = append(batch, forked)
	p, err := b.PublishBatch(ctx, as, 0, batch)
	switch {
	case errors.Is(err, bus.ErrDuplicate) || errors.Is(err, bus.ErrStale):
		// A retry after a lost ack is refused although the first attempt
		// landed: then the stored session.forked is this one.
		mine := false
		rerr := b.Read(ctx, bus.ReadOptions{Subjects: []string{lifecycleSubject(as, schemas.TypeSessionForked)}}, func(ev schemas.Event) error {
			mine, p.Seq = ev.ID == forked.ID, ev.Seq
			return bus.ErrStop
		})
		if rerr != nil || !mine {
			return Forked{}, fmt.Errorf("%w: %s (a fork is a new session: pick another --as)", ErrSessionExists, as)
		}
	case err != nil:
		return Forked{}, err
	}
	forked.Seq = p.Seq
	out := Forked{Session: as, Event: forked, Seq: p.Seq, Point: point, Requested: requested, Redo: redo}
	if m := projections.BuildManifest(as, batch); m != nil {
		for _, name := range m.StepOrder {
			if m.Steps[name].Status == projections.StepStatusCompleted {
				out.Kept = append(out.Kept, name)
			} else {
				out.Again = append(out.Again, name)
			}
		}
	}
	return out, nil
}

// forkableTree refuses (ErrBadInput) the fork of a loops or backlog
// session that is not supported: a loops fork whose file works in git
// worktrees while the origin has no repository; a backlog fork that
// would switch between working on a repository (workdir: repo) and not,
// either way (a fork keeps its origin's workdir: the runs' changes are in
// the origin's target branch, which the fork's starts from, or in none).
// A point at or after the session's end moves back (see forkPoint).
func forkableTree(req ForkRequest, start *schemas.SessionForked, history []schemas.Event) error {
	file := &start.Pipeline
	if req.Pipeline != nil {
		file = req.Pipeline
	}
	backlogRepo := file.Backlog != nil && file.Backlog.Workdir == schemas.WorkdirRepo
	// As the orchestrator holds it: a backlog works on a repository when
	// its file says workdir: repo and its start carries one.
	originRepo := start.Pipeline.Backlog != nil && start.Pipeline.Backlog.Workdir == schemas.WorkdirRepo && startedOnRepo(history) != nil
	// A loops session works on a repository when its start brought one.
	hasRepo := func() bool { rs := startedOnRepo(history); return rs != nil && rs.Bundle != nil }
	worktrees := func(p *schemas.Pipeline) bool { return p != nil && p.Loops != nil && p.Loops.NeedsRepo() }
	switch {
	case start.Pipeline.Kind == schemas.KindBacklog && backlogRepo && !originRepo:
		return fmt.Errorf("%w: %s: the fork's file %s has workdir: repo, and %s works on no repository: a fork keeps its origin's workdir",
			ErrBadInput, req.Origin, orElse(file.Source, file.Name), req.Origin)
	case start.Pipeline.Kind == schemas.KindBacklog && !backlogRepo && originRepo:
		return fmt.Errorf("%w: %s: %s works on a repository (workdir: repo, target loopbus/%s), and the fork's file %s has no workdir: repo: a fork keeps its origin's workdir",
			ErrBadInput, req.Origin, req.Origin, req.Origin, orElse(file.Source, file.Name))
	case start.Pipeline.Kind == schemas.KindLoops && (req.Pipeline == nil && worktrees(&start.Pipeline) || worktrees(req.Pipeline)) && !hasRepo():
		return fmt.Errorf("%w: %s: the fork's levels work in git worktrees, and %s works on no repository", ErrBadInput, req.Origin, req.Origin)
	}
	return nil
}

// startedOnRepo returns the repository start of the session whose history
// (its own or copied) is evs, as its first session.started carries it
// (nil: none).
func startedOnRepo(evs []schemas.Event) *schemas.LoopsStart {
	for _, ev := range evs {
		if d, ok := ev.Data.(*schemas.SessionStarted); ok {
			return d.Loops
		}
	}
	return nil
}

// ForkRedo is what the fork point moved back before (see Fork): work done
// before the requested point that the fork's pipeline runs again (or
// drops) while later work of the origin was built on it, a loop merged
// into the target branch (later merges were rebased on a target holding
// its commits) or a completed backlog run (later runs worked on the task
// list it left); or the end of a loops or backlog origin (a fork starts
// from a running session).
type ForkRedo struct {
	// Kind is "loop" (a loops session's loop), "run" (a backlog's task
	// run or role step) or "session" (the origin's end); ID names it.
	Kind, ID string
	// Def is its level or role. Changed says Def's definition changed;
	// otherwise the loop goes or runs again because the loop above it
	// does, or the fork's file has no level Def.
	Def     string
	Changed bool
	// Gone says the fork's file has no level Def.
	Gone bool
	// Event is its loop.merged or step.completed (the first, when there
	// were more), or the session.completed or session.failed that ended
	// the origin, at stream sequence Event.Seq of the origin.
	Event schemas.Event
}

// String says what r is and where it was done, e.g. "loop plan-001
// (level code, changed) merged at 44", or "session lp-1 completed at 57".
func (r ForkRedo) String() string {
	if r.Kind == forkRedoEnd {
		did := "completed"
		if r.Event.Type == schemas.TypeSessionFailed {
			did = "failed"
		}
		return fmt.Sprintf("session %s %s at %d", r.ID, did, r.Event.Seq)
	}
	kind, did := "level", "merged"
	if r.Kind == forkRedoRun {
		kind, did = "role", "completed"
	}
	why := "changed"
	switch {
	case r.Gone:
		why = "not in the fork's file"
	case !r.Changed:
		why = "under a loop that runs again"
	}
	return fmt.Sprintf("%s %s (%s %s, %s) %s at %d", r.Kind, r.ID, kind, r.Def, why, did, r.Event.Seq)
}

// What a ForkRedo is.
const (
	forkRedoLoop = "loop"
	forkRedoRun  = "run"
	forkRedoEnd  = "session"
)

// forkPoint returns how many events of history (the origin's, up to the
// requested fork point) a fork as d keeps, and the work that made it keep
// fewer (in the order the point moved back before it; none when the
// point stays). Work the fork runs again while later work was built on
// it (mergedLoopsRedone, completedRunsRedone) is not taken out of what
// came after: instead the point moves back to the last event before the
// decision that holds the first of it, where that work was not done yet
// (so the fork runs it again, and what came after, as at any point), and
// the check repeats there until nothing is redone. It moves back only,
// so it ends. Before that, a loops or backlog point at or after the
// origin's own end moves back to the last event before the decision that
// ended it, where it was running (the orchestrator forks no finished
// loops or backlog session). Errors (ErrBadInput): the point would fall
// before the session's own start (in the history it copied from its
// origin).
func forkPoint(history []schemas.Event, origin string, d *schemas.SessionForked) (int, []ForkRedo, error) {
	n := len(history)
	var moved []ForkRedo
	if k := d.Pipeline.Kind; k == schemas.KindLoops || k == schemas.KindBacklog {
		if i := slices.IndexFunc(history, func(ev schemas.Event) bool {
			return ev.ForkOf == "" && (ev.Type == schemas.TypeSessionCompleted || ev.Type == schemas.TypeSessionFailed)
		}); i >= 0 {
			if n = decisionStart(history, i); n == 0 || ownStart(history[:n]) == nil {
				// A guard: a session's decisions follow its start.
				return 0, nil, fmt.Errorf("%w: %s session %s had ended at or before stream sequence %d; fork it at an event before its end",
					ErrBadInput, k, origin, history[len(history)-1].Seq)
			}
			moved = append(moved, ForkRedo{Kind: forkRedoEnd, ID: origin, Event: history[i]})
		}
	}
	for {
		var redo []ForkRedo
		switch d.Pipeline.Kind {
		case schemas.KindLoops:
			redo = mergedLoopsRedone(d, history[:n], origin)
		case schemas.KindBacklog:
			redo = completedRunsRedone(d.Changed, history[:n])
		}
		if len(redo) == 0 {
			return n, moved, nil
		}
		first := slices.MinFunc(redo, func(a, b ForkRedo) int { return cmp.Compare(a.Event.Seq, b.Event.Seq) })
		moved = append(moved, first)
		i := slices.IndexFunc(history[:n], func(ev schemas.Event) bool { return ev.ID == first.Event.ID })
		n = decisionStart(history, i)
		if n == 0 || ownStart(history[:n]) == nil {
			if up := ownStart(history); n > 0 && up != nil && up.Origin != "" {
				return 0, nil, fmt.Errorf("%w: the fork runs again %s, and later work was built on it; the fork point would move back before it, into the history %s copied from its origin: fork %s instead (loopbus fork %s --at %s)",
					ErrBadInput, first, origin, up.Origin, up.Origin, history[n-1].ForkOf)
			}
			return 0, nil, fmt.Errorf("%w: the fork runs again %s, and later work was built on it; the fork point would move back before %s started", ErrBadInput, first, origin)
		}
	}
}

// decisionStart returns the index in evs of the first event of the
// decision evs[i] is part of. The orchestrator writes a decision's events
// in a row (one atomic batch, or a chain guarded on the session's last
// event), all with its source, the decision's trigger as causation and
// the session's start as correlation: the state before that row is one
// the orchestrator had, the state inside it is not.
func decisionStart(evs []schemas.Event, i int) int {
	ev := evs[i]
	for i > 0 && ev.Causation != "" && evs[i-1].Source == ev.Source && evs[i-1].Causation == ev.Causation && evs[i-1].Correlation == ev.Correlation {
		i--
	}
	return i
}

// mergedLoopsRedone returns the loops merged into the origin's target
// branch at the fork point (history: the origin's events up to it) that a
// loops fork as d would run again or drop, because their level or one
// above it changed (or the fork's file has no such level), each with its
// first loop.merged: their commits are in the head the fork would start
// from, and later merges were rebased on them. The loops stand as the
// orchestrator forks them; it refuses a fork at a point with such loops.
func mergedLoopsRedone(d *schemas.SessionForked, history []schemas.Event, origin string) []ForkRedo {
	m := projections.BuildManifest(origin, history)
	if m == nil || d.Pipeline.Loops == nil {
		return nil
	}
	stands := map[string]bool{}
	var out []ForkRedo
	for _, lp := range m.Loops {
		// The manifest lists a parent before its children.
		gone := d.Pipeline.Loops.Level(lp.Level) == nil
		goes := lp.Parent != "" && !stands[lp.Parent] || gone
		changed := slices.Contains(d.Changed, lp.Level)
		kept := !goes && lp.Status == projections.LoopStatusCompleted && !changed
		stands[lp.ID] = kept || !goes && lp.Status == projections.LoopStatusInvalidated
		if lp.Status != projections.LoopStatusCompleted || lp.MergeCommit == "" || kept {
			continue
		}
		i := slices.IndexFunc(history, func(ev schemas.Event) bool {
			md, ok := ev.Data.(*schemas.LoopMerged)
			return ok && md.Loop == lp.ID
		})
		if i >= 0 {
			out = append(out, ForkRedo{Kind: forkRedoLoop, ID: lp.ID, Def: lp.Level, Changed: changed && !gone, Gone: gone, Event: history[i]})
		}
	}
	return out
}

// completedRunsRedone returns the runs of the changed roles that had
// completed in history (the origin's, up to the fork point), each with its
// first step.completed: the fork would run them again with their role's
// new definition, while their changes are in the task list it keeps and
// later runs worked on that list. The orchestrator, reading the origin's
// own history, refuses a fork at a point with such runs.
func completedRunsRedone(roles []string, history []schemas.Event) []ForkRedo {
	var out []ForkRedo
	for _, ev := range history {
		d, ok := ev.Data.(*schemas.StepCompleted)
		if !ok || slices.ContainsFunc(out, func(r ForkRedo) bool { return r.ID == d.Step }) {
			continue
		}
		for _, role := range roles {
			if r := d.Step; r == role || role == schemas.RoleIterate && !slices.Contains(backlog.ReservedIDs(), r) {
				out = append(out, ForkRedo{Kind: forkRedoRun, ID: d.Step, Def: role, Changed: true, Event: ev})
				break
			}
		}
	}
	return out
}

// readToPoint returns the events of origin up to the fork point at (a
// stream sequence or an event id), the point included, at most
// schemas.MaxForkCopies of them (more is refused: ErrBadInput).
func readToPoint(ctx context.Context, b Bus, origin, at string) ([]schemas.Event, error) {
	if at == "" {
		return nil, fmt.Errorf("%w: give the fork point: --at SEQ or --at EVENT-ID (see loopbus events %s)", ErrBadInput, origin)
	}
	last, err := lastOf(ctx, b, origin)
	if err != nil {
		return nil, err
	}
	seq, bySeq := uint64(0), false
	if n, err := strconv.ParseUint(at, 10, 64); err == nil {
		seq, bySeq = n, true
	}
	var evs []schemas.Event
	var first uint64
	found, more := false, 0
	err = b.Read(ctx, bus.ReadOptions{Subjects: []string{schemas.SessionSubjects(origin)}}, func(ev schemas.Event) error {
		if first == 0 {
			first = ev.Seq
		}
		if bySeq && ev.Seq > seq {
			return bus.ErrStop
		}
		if len(evs) == schemas.MaxForkCopies {
			// Read on (without keeping) only to tell a point too far
			// from one that is not there.
			more++
		} else {
			evs = append(evs, ev)
		}
		if found = bySeq && ev.Seq == seq || !bySeq && ev.ID == at; found {
			return bus.ErrStop
		}
		return nil
	})
	switch {
	case err != nil:
		return nil, err
	case found && more > 0:
		return nil, fmt.Errorf("%w: %s has %d events up to that point; a fork copies at most %d (fork at an earlier point)",
			ErrBadInput, origin, len(evs)+more, schemas.MaxForkCopies)
	case found:
		return evs, nil
	case !bySeq:
		return nil, fmt.Errorf("%w: session %s has no event with id %q (--at takes a stream sequence or an event id of the session: see loopbus events %s)", ErrBadInput, origin, at, origin)
	}
	var other *schemas.Event
	if seq > 0 {
		err = b.Read(ctx, bus.ReadOptions{StartSeq: seq}, func(ev schemas.Event) error {
			if ev.Seq == seq {
				other = &ev
			}
			return bus.ErrStop
		})
		if err != nil {
			return nil, err
		}
	}
	switch {
	case other != nil:
		return nil, fmt.Errorf("%w: stream sequence %d is an event of session %s, not of %s (whose events are at %d…%d)", ErrBadInput, seq, other.Session, origin, first, last)
	case seq > last:
		return nil, fmt.Errorf("%w: stream sequence %d is beyond the end of session %s: its last event is at %d", ErrBadInput, seq, origin, last)
	}
	return nil, fmt.Errorf("%w: stream sequence %d holds no event of session %s (whose events are at %d…%d)", ErrBadInput, seq, origin, first, last)
}

// ownStart returns what a session's own start (its session.started, or
// the session.forked of a fork) in evs says it runs, as session.forked
// carries it; nil when evs hold only copies.
func ownStart(evs []schemas.Event) *schemas.SessionForked {
	for _, ev := range evs {
		if ev.ForkOf != "" {
			continue
		}
		switch d := ev.Data.(type) {
		case *schemas.SessionStarted:
			return &schemas.SessionForked{Pipeline: d.Pipeline, Input: d.Input, SourceHash: d.SourceHash, Budget: d.Budget, DefinitionFiles: d.DefinitionFiles}
		case *schemas.SessionForked:
			return d
		}
	}
	return nil
}

// orElseBudget is *b, or no bound when b is nil.
func orElseBudget(b *schemas.Budget) schemas.Budget {
	if b == nil {
		return schemas.Budget{}
	}
	return *b
}

// checkForkDepth refuses (ErrBadInput) to fork origin when it ends a chain
// of schemas.MaxForkDepth forks (a fork of a fork of …): the orchestrator
// reads a fork's origins back to build its first state, and refuses a
// fork deeper than that, so the fork would never run. It reads at most
// MaxForkDepth origins.
func checkForkDepth(ctx context.Context, b Bus, origin string) error {
	cur := origin
	for forks := 1; ; forks++ {
		up, err := forkOrigin(ctx, b, cur)
		if err != nil || up == "" {
			return err
		}
		if forks >= schemas.MaxForkDepth {
			return fmt.Errorf("%w: %s is the end of a chain of %d forks (a fork of a fork of …); a fork is at most %d deep: fork a session higher up the chain",
				ErrBadInput, origin, forks, schemas.MaxForkDepth)
		}
		cur = up
	}
}

// forkOrigin returns the origin of session, a fork ("" when it is none).
func forkOrigin(ctx context.Context, b Bus, session string) (string, error) {
	origin := ""
	err := b.Read(ctx, bus.ReadOptions{Subjects: []string{lifecycleSubject(session, schemas.TypeSessionForked)}}, func(ev schemas.Event) error {
		if d, ok := ev.Data.(*schemas.SessionForked); ok {
			origin = d.Origin
		}
		return bus.ErrStop
	})
	return origin, err
}

// copyHistory returns the copies of evs in session as: new ids derived
// from the originals (causation and correlation follow them), ForkOf the
// id copied; source and time stay the original's, so the history says who
// stated what when. Whoever forks signs the copies (see bus: a copy is
// trusted as the roles that may fork are).
func copyHistory(evs []schemas.Event, as string) []schemas.Event {
	ids := make(map[string]string, len(evs))
	for _, ev := range evs {
		ids[ev.ID] = schemas.DeterministicID(as, "fork-copy", ev.ID)
	}
	remap := func(id string) string {
		if n, ok := ids[id]; ok {
			return n
		}
		return id
	}
	out := make([]schemas.Event, len(evs))
	for i, ev := range evs {
		ev.ForkOf, ev.ID, ev.Session = ev.ID, ids[ev.ID], as
		ev.Causation, ev.Correlation = remap(ev.Causation), remap(ev.Correlation)
		ev.Seq, ev.Stored, ev.Signer = 0, time.Time{}, ""
		out[i] = ev
	}
	return out
}

// ForkRef is a fork of a session: its id, and the origin's stream
// sequence and event it forked at.
type ForkRef struct {
	Session string    `json:"session"`
	Seq     uint64    `json:"seq"`
	Event   string    `json:"event"`
	At      time.Time `json:"at"`
}

// Forks lists the forks of session, in the order they were made, from the
// session.forked events of the stream (the origin itself records none:
// it stays untouched).
func Forks(ctx context.Context, b Bus, session string) ([]ForkRef, error) {
	var out []ForkRef
	err := b.Read(ctx, bus.ReadOptions{Subjects: []string{lifecycleSubject("*", schemas.TypeSessionForked)}}, func(ev schemas.Event) error {
		if d, ok := ev.Data.(*schemas.SessionForked); ok && d.Origin == session && !slices.ContainsFunc(out, func(f ForkRef) bool { return f.Session == ev.Session }) {
			out = append(out, ForkRef{Session: ev.Session, Seq: d.Seq, Event: d.Event, At: ev.Time})
		}
		return nil
	})
	return out, err
}
