package orchestrator_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/internal/testnats"
	"github.com/loopbus/loopbus/orchestrator"
	"github.com/loopbus/loopbus/schemas"
	"github.com/rs/zerolog"
)

// refuseFirst is the bus, but its first decision is refused as stale
// without being written, naming no sequence: what a replicated stream's
// leader answered while it was still settling the session's previous
// event (bus.StaleError). Nothing newer exists: the decision is lost
// unless the orchestrator makes it again.
type refuseFirst struct {
	*bus.Bus
	// refused gets the session of the refused decision.
	refused chan string
	once    sync.Once
}

func (r *refuseFirst) refuse(session string) bool {
	refuse := false
	r.once.Do(func() {
		refuse = true
		r.refused <- session
	})
	return refuse
}

func (r *refuseFirst) PublishChain(ctx context.Context, session string, expectLast uint64, evs []schemas.Event) (bus.Published, error) {
	if r.refuse(session) {
		return bus.Published{}, &bus.StaleError{Reason: "wrong last sequence"}
	}
	return r.Bus.PublishChain(ctx, session, expectLast, evs)
}

func (r *refuseFirst) PublishBatch(ctx context.Context, session string, expectLast uint64, evs []schemas.Event) (bus.Published, error) {
	if r.refuse(session) {
		return bus.Published{}, &bus.StaleError{Reason: "wrong last sequence"}
	}
	return r.Bus.PublishBatch(ctx, session, expectLast, evs)
}

// TestWatchdogMakesTheDecisionARefusedCommitLost: the first decision of a
// session (its first job.requested) is refused as stale although the
// session has no newer event. Nothing else makes it again: the session
// would wait for ever (as sessions did on a 3-node cluster, until the
// orchestrator was restarted). Once the session has been still for
// Config.StallAfter the watchdog makes the decision, logs an error and
// calls OnStall; a session that only waits for its worker is looked at
// too, and left alone.
func TestWatchdogMakesTheDecisionARefusedCommitLost(t *testing.T) {
	b, _ := testnats.Bus(t)
	rb := &refuseFirst{Bus: b, refused: make(chan string, 1)}
	t0 := time.Date(2026, 11, 22, 9, 0, 0, 0, time.UTC)
	clk := &clock{now: t0}
	stalls := make(chan string, 10)
	sink := newLogSink(t)
	const stallAfter = time.Minute
	o, err := orchestrator.New(orchestrator.Config{Tick: 20 * time.Millisecond, StallAfter: stallAfter, OnStall: func(s string) { stalls <- s }},
		rb, zerolog.New(sink).Level(zerolog.DebugLevel), clk.Now)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- o.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})

	const session = "refused"
	startSession(t, b, session, twoSteps())
	select {
	case s := <-rb.refused:
		if s != session {
			t.Fatalf("refused a decision of %s, want %s", s, session)
		}
	case <-time.After(waitTimeout):
		t.Fatal("the orchestrator made no decision to refuse")
	}
	// The clock has not moved: nothing may have decided again.
	if evs := sessionEvents(t, b, session); len(evs) != 1 {
		t.Fatalf("before the stall bound: events\n%s\nwant session.started alone", describe(evs))
	}

	clk.Set(t0.Add(stallAfter))
	evs := waitEvents(t, b, session, "job.requested for draft from the watchdog", has(schemas.TypeJobRequested, "draft"))
	select {
	case s := <-stalls:
		if s != session {
			t.Errorf("OnStall(%s), want %s", s, session)
		}
	case <-time.After(waitTimeout):
		t.Fatal("the watchdog decided without calling OnStall")
	}
	waitFor(t, "the watchdog's error", func() bool { return sink.count("owed a decision that was never made") == 1 })

	// Now the session waits for its worker: the watchdog looks at it
	// once it has been still that long, and decides nothing.
	clk.Set(t0.Add(3 * stallAfter))
	waitFor(t, "the watchdog to look at the waiting session", func() bool { return sink.count("no decision owed") > 0 })
	select {
	case s := <-stalls:
		t.Errorf("OnStall(%s) for a session waiting for its worker", s)
	default:
	}
	// The job passes: the session goes on and completes, with each
	// decision once.
	jr := mustFind(t, evs, schemas.TypeJobRequested, "draft")
	pass(t, b, jr)
	evs = waitEvents(t, b, session, "job.requested for review", has(schemas.TypeJobRequested, "review"))
	pass(t, b, mustFind(t, evs, schemas.TypeJobRequested, "review"))
	evs = waitEvents(t, b, session, "session.completed", has(schemas.TypeSessionCompleted, ""))
	assertDecisionsOnce(t, evs,
		typeStep{schemas.TypeJobRequested, "draft"}, typeStep{schemas.TypeStepCompleted, "draft"},
		typeStep{schemas.TypeJobRequested, "review"}, typeStep{schemas.TypeStepCompleted, "review"},
		typeStep{schemas.TypeSessionCompleted, ""})
	if n := len(stalls); n != 0 {
		t.Errorf("%d more OnStall calls, want none", n)
	}
}

// waitFor polls cond until it holds, failing the test after waitTimeout.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("no %s within %v", what, waitTimeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestOwed: a session just started is owed its first job; once that is
// in its history it is owed nothing (it waits for the worker); a session
// with no events is owed nothing.
func TestOwed(t *testing.T) {
	const session = "owed"
	in := inputRef(session)
	start := schemas.Event{
		ID: schemas.DeterministicID(session, schemas.TypeSessionStarted), Type: schemas.TypeSessionStarted, Session: session, Seq: 1,
		Time: time.Now(), Data: &schemas.SessionStarted{Pipeline: twoSteps(), Input: in, SourceHash: schemas.ShortHash(in.Digest)},
	}
	history := []schemas.Event{start}
	read := func(s string, until uint64, fn func(schemas.Event) error) error {
		for _, ev := range history {
			if ev.Session == s && (until == 0 || ev.Seq <= until) {
				if err := fn(ev); err != nil {
					return err
				}
			}
		}
		return nil
	}
	now := time.Now()
	evs, err := orchestrator.Owed(session, read, now)
	if err != nil {
		t.Fatalf("Owed: %v", err)
	}
	if len(evs) != 1 || evs[0].Type != schemas.TypeJobRequested || evs[0].Step != "draft" {
		t.Fatalf("owed after session.started: %s, want job.requested for draft", describe(evs))
	}
	jr := evs[0]
	jr.Seq = 2
	history = append(history, jr)
	if evs, err := orchestrator.Owed(session, read, now); err != nil || len(evs) != 0 {
		t.Errorf("owed with the job requested: %s, %v; want nothing", describe(evs), err)
	}
	if evs, err := orchestrator.Owed("none", read, now); err != nil || len(evs) != 0 {
		t.Errorf("owed to a session without events: %s, %v; want nothing", describe(evs), err)
	}
}
