package client

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

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
	// Point is the origin's event at the fork point.
	Point schemas.Event
	// Kept are the steps that keep the origin's results; Again the steps
	// that run again (changed, not completed at the point, or requiring
	// one that runs again).
	Kept, Again []string
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
// what changed, so a retried fork that landed before is not doubled.
//
// Errors: ErrNoSession for an unknown origin; ErrSessionExists for a
// fork id in use; ErrBadInput (with what to do) for an unsafe id, a fork
// point that is no event of the origin (an unknown sequence or id, an
// event of another session, a point beyond the origin's end, a point in
// the history the origin copied from its own origin), an origin with
// more than schemas.MaxForkCopies events up to the point, a backlog or
// loops session, or an unusable input file.
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
	evs, err := Events(ctx, b, req.Origin, Until{})
	if err != nil {
		return Forked{}, err
	}
	if len(evs) == 0 {
		return Forked{}, fmt.Errorf("%w: %s", ErrNoSession, req.Origin)
	}
	i, err := forkPoint(ctx, b, req.Origin, req.At, evs)
	if err != nil {
		return Forked{}, err
	}
	history := evs[:i+1]
	start := ownStart(history)
	switch {
	case start == nil:
		return Forked{}, fmt.Errorf("%w: the event at stream sequence %d is in the history %s copied from its origin; fork that session instead (loopbus fork %s --at %s)",
			ErrBadInput, evs[i].Seq, req.Origin, forkOrigin(evs), evs[i].ForkOf)
	case start.Pipeline.Kind != "" && start.Pipeline.Kind != schemas.KindPipeline:
		return Forked{}, fmt.Errorf("%w: %s is a %s session: fork of a backlog/loops session is not supported yet", ErrBadInput, req.Origin, start.Pipeline.Kind)
	case req.Pipeline != nil && req.Pipeline.Kind != "" && req.Pipeline.Kind != schemas.KindPipeline:
		return Forked{}, fmt.Errorf("%w: --pipeline %s is of kind %s: fork of a backlog/loops session is not supported yet", ErrBadInput, req.Pipeline.Source, req.Pipeline.Kind)
	case len(history) > schemas.MaxForkCopies:
		return Forked{}, fmt.Errorf("%w: %s has %d events up to stream sequence %d; a fork copies at most %d (fork at an earlier point)",
			ErrBadInput, req.Origin, len(history), evs[i].Seq, schemas.MaxForkCopies)
	}
	if last, err := b.SessionLastSeq(ctx, as); err != nil {
		return Forked{}, err
	} else if last != 0 {
		return Forked{}, fmt.Errorf("%w: %s (a fork is a new session: pick another --as)", ErrSessionExists, as)
	}

	data := &schemas.SessionForked{Origin: req.Origin, Seq: evs[i].Seq, Event: evs[i].ID, Copied: len(history), Pipeline: start.Pipeline,
		Input: start.Input, SourceHash: start.SourceHash, Budget: start.Budget, DefinitionFiles: start.DefinitionFiles, Reason: req.Reason}
	if req.Pipeline != nil {
		data.Pipeline = *req.Pipeline
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
	data.Changed = schemas.ChangedSteps(start.Pipeline, data.Pipeline, start.DefinitionFiles, data.DefinitionFiles, data.Input.Digest != start.Input.Digest)

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
	out := Forked{Session: as, Event: forked, Seq: p.Seq, Point: evs[i]}
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

// forkPoint returns the index in evs (the origin's events) of the fork
// point at: a stream sequence or an event id.
func forkPoint(ctx context.Context, b Bus, origin, at string, evs []schemas.Event) (int, error) {
	if at == "" {
		return 0, fmt.Errorf("%w: give the fork point: --at SEQ or --at EVENT-ID (see loopbus events %s)", ErrBadInput, origin)
	}
	first, last := evs[0].Seq, evs[len(evs)-1].Seq
	seq, err := strconv.ParseUint(at, 10, 64)
	if err != nil {
		if i := slices.IndexFunc(evs, func(ev schemas.Event) bool { return ev.ID == at }); i >= 0 {
			return i, nil
		}
		return 0, fmt.Errorf("%w: session %s has no event with id %q (--at takes a stream sequence or an event id of the session: see loopbus events %s)", ErrBadInput, origin, at, origin)
	}
	if i := slices.IndexFunc(evs, func(ev schemas.Event) bool { return ev.Seq == seq }); i >= 0 {
		return i, nil
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
			return 0, err
		}
	}
	switch {
	case other != nil:
		return 0, fmt.Errorf("%w: stream sequence %d is an event of session %s, not of %s (whose events are at %d…%d)", ErrBadInput, seq, other.Session, origin, first, last)
	case seq > last:
		return 0, fmt.Errorf("%w: stream sequence %d is beyond the end of session %s: its last event is at %d", ErrBadInput, seq, origin, last)
	}
	return 0, fmt.Errorf("%w: stream sequence %d holds no event of session %s (whose events are at %d…%d)", ErrBadInput, seq, origin, first, last)
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

// forkOrigin returns the origin of the fork whose events are evs ("" when
// it is no fork).
func forkOrigin(evs []schemas.Event) string {
	for _, ev := range evs {
		if d, ok := ev.Data.(*schemas.SessionForked); ok && ev.ForkOf == "" {
			return d.Origin
		}
	}
	return ""
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
