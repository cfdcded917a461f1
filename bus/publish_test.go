package bus_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/internal/testnats"
	"github.com/loopbus/loopbus/schemas"
)

func TestPublishSequencesAndDuplicates(t *testing.T) {
	t.Parallel()
	b, _ := testnats.Bus(t)
	ctx := ctxT(t)

	var last uint64
	for i := range 5 {
		res, err := b.Publish(ctx, jobStarted("s1", fmt.Sprintf("e%d", i)))
		if err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
		if res.Duplicate || res.Seq <= last {
			t.Fatalf("publish %d = %+v after seq %d; want a new, higher seq", i, res, last)
		}
		last = res.Seq
	}

	// The same id again: acknowledged as a duplicate of the stored event,
	// nothing new written, even when the rest of the event differs.
	again := jobStarted("s1", "e2")
	again.Data = &schemas.JobStarted{JobID: "other", Worker: "w9", Delivery: 3}
	res, err := b.Publish(ctx, again)
	if err != nil {
		t.Fatalf("re-publish: %v", err)
	}
	if !res.Duplicate {
		t.Errorf("re-publish of e2 = %+v, want Duplicate", res)
	}
	if res.Seq != 3 {
		t.Errorf("duplicate reports seq %d, want the stored event's seq 3", res.Seq)
	}
	if n := msgCount(t, b); n != 5 {
		t.Errorf("stream holds %d events, want 5", n)
	}
	ev, err := b.GetEvent(ctx, 3)
	if err != nil || ev.Data.(*schemas.JobStarted).JobID != "job-e2" {
		t.Errorf("stored e2 = %+v, %v; the duplicate must not replace it", ev.Data, err)
	}
}

func TestPublishExpect(t *testing.T) {
	t.Parallel()
	b, _ := testnats.Bus(t)
	ctx := ctxT(t)

	r1, err := b.PublishExpect(ctx, jobRequested("s1", "a1"), 0)
	if err != nil {
		t.Fatalf("expect 0 on a new session: %v", err)
	}
	if _, err := b.PublishExpect(ctx, jobRequested("s1", "a2"), 0); !errors.Is(err, bus.ErrStale) {
		t.Fatalf("second expect-0 = %v, want ErrStale", err)
	}

	// Events of other sessions in between do not move s1's expectation.
	publish(t, b, jobStarted("s2", "b1"))
	if _, err := b.PublishExpect(ctx, jobStarted("s3", "c1"), 0); err != nil {
		t.Fatalf("expect 0 on s3 while s1 and s2 have events: %v", err)
	}
	// Neither does an event of a session whose id has s1 as a prefix.
	publish(t, b, jobStarted("s1x", "d1"))

	r2, err := b.PublishExpect(ctx, jobStarted("s1", "a3"), r1.Seq)
	if err != nil {
		t.Fatalf("expecting s1's last seq %d: %v", r1.Seq, err)
	}
	if r2.Seq != 5 {
		t.Errorf("seq %d, want 5", r2.Seq)
	}
	// The stream's last seq is not the session's.
	if _, err := b.PublishExpect(ctx, jobStarted("s1", "a4"), r2.Seq-1); !errors.Is(err, bus.ErrStale) {
		t.Errorf("expecting an older seq = %v, want ErrStale", err)
	}
	// On a stream of one replica a future expectation is refused at once
	// (a replicated stream's leader may only be behind: see
	// TestClusterGuardedPublishAfterRead), naming the
	// session's last sequence.
	var stale *bus.StaleError
	if _, err := b.PublishExpect(ctx, jobStarted("s1", "a5"), r2.Seq+100); !errors.Is(err, bus.ErrStale) || !errors.As(err, &stale) || !stale.Known || stale.Last != r2.Seq {
		t.Errorf("expecting a future seq = %v (%+v), want ErrStale naming %d", err, stale, r2.Seq)
	}
	if _, err := b.PublishExpect(ctx, jobStarted("s1", "a6"), r2.Seq); err != nil {
		t.Errorf("expecting the right seq again: %v", err)
	}
	if n := msgCount(t, b); n != 6 {
		t.Errorf("stream holds %d events, want 6", n)
	}
}

func TestPublishBatch(t *testing.T) {
	t.Parallel()
	b, _ := testnats.Bus(t)
	ctx := ctxT(t)

	seed := publish(t, b, jobRequested("s1", "r0"))
	publish(t, b, jobStarted("s2", "other")) // another session between

	batch := []schemas.Event{jobStarted("s1", "b1"), jobRequested("s1", "b2"), jobStarted("s1", "b3")}
	res, err := b.PublishBatch(ctx, "s1", seed, batch)
	if err != nil {
		t.Fatalf("batch: %v", err)
	}
	if res.Seq != 5 || res.Duplicate {
		t.Fatalf("batch = %+v, want Seq 5 (the last event's)", res)
	}
	for i, id := range []string{"b1", "b2", "b3"} {
		ev, err := b.GetEvent(ctx, uint64(3+i))
		if err != nil || ev.ID != id {
			t.Errorf("event %d = %q, %v; want %s", 3+i, ev.ID, err, id)
		}
	}
	if last, err := b.SessionLastSeq(ctx, "s1"); err != nil || last != 5 {
		t.Errorf("SessionLastSeq(s1) = %d, %v; want 5", last, err)
	}

	tests := []struct {
		name    string
		session string
		expect  uint64
		evs     []schemas.Event
		wantErr error
	}{
		{
			name: "stale expectation", session: "s1", expect: seed,
			evs:     []schemas.Event{jobStarted("s1", "c1"), jobStarted("s1", "c2")},
			wantErr: bus.ErrStale,
		},
		{
			name: "expectation zero on a started session", session: "s1", expect: 0,
			evs:     []schemas.Event{jobStarted("s1", "c3"), jobStarted("s1", "c4")},
			wantErr: bus.ErrStale,
		},
		{
			name: "holds an id already stored", session: "s1", expect: 5,
			evs:     []schemas.Event{jobStarted("s1", "c5"), jobStarted("s1", "b2"), jobStarted("s1", "c6")},
			wantErr: bus.ErrDuplicate,
		},
		{
			name: "the same batch again", session: "s1", expect: seed,
			evs:     batch,
			wantErr: bus.ErrDuplicate,
		},
		{
			name: "holds one id twice", session: "s1", expect: 5,
			evs:     []schemas.Event{jobStarted("s1", "c7"), jobStarted("s1", "c7")},
			wantErr: bus.ErrDuplicate,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := msgCount(t, b)
			_, err := b.PublishBatch(ctx, tt.session, tt.expect, tt.evs)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("PublishBatch = %v, want %v", err, tt.wantErr)
			}
			if n := msgCount(t, b); n != before {
				t.Errorf("stream grew from %d to %d events; a refused batch must write nothing", before, n)
			}
		})
	}

	// The session is unchanged and still accepts a batch at 5.
	res, err = b.PublishBatch(ctx, "s1", 5, []schemas.Event{jobStarted("s1", "d1"), jobStarted("s1", "d2")})
	if err != nil || res.Seq != 7 {
		t.Fatalf("batch after refusals = %+v, %v; want seq 7", res, err)
	}
}

func TestPublishBatchRefusedBeforeSending(t *testing.T) {
	t.Parallel()
	b, _ := testnats.Bus(t)
	ctx := ctxT(t)
	bad := jobStarted("s1", "bad")
	bad.Data = &schemas.JobStarted{} // fails its schema

	tests := []struct {
		name string
		evs  []schemas.Event
	}{
		{name: "event of another session", evs: []schemas.Event{jobStarted("s1", "a"), jobStarted("s2", "b")}},
		{name: "single event of another session", evs: []schemas.Event{jobStarted("s2", "c")}},
		{name: "invalid event", evs: []schemas.Event{jobStarted("s1", "d"), bad}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := b.PublishBatch(ctx, "s1", 0, tt.evs); err == nil {
				t.Fatal("PublishBatch succeeded")
			} else if errors.Is(err, bus.ErrStale) || errors.Is(err, bus.ErrDuplicate) {
				t.Errorf("PublishBatch = %v; want a local refusal, not a server verdict", err)
			}
		})
	}
	if n := msgCount(t, b); n != 0 {
		t.Errorf("stream holds %d events, want 0", n)
	}

	// An empty batch is a no-op.
	res, err := b.PublishBatch(ctx, "s1", 12345, nil)
	if err != nil || res != (bus.Published{}) {
		t.Errorf("empty batch = %+v, %v; want a no-op", res, err)
	}
	if n := msgCount(t, b); n != 0 {
		t.Errorf("stream holds %d events after an empty batch", n)
	}
}

func TestPublishBatchSingleEvent(t *testing.T) {
	t.Parallel()
	b, _ := testnats.Bus(t)
	ctx := ctxT(t)

	res, err := b.PublishBatch(ctx, "s1", 0, []schemas.Event{jobRequested("s1", "one")})
	if err != nil || res.Seq != 1 {
		t.Fatalf("single-event batch = %+v, %v; want seq 1", res, err)
	}
	if _, err := b.PublishBatch(ctx, "s1", 0, []schemas.Event{jobStarted("s1", "two")}); !errors.Is(err, bus.ErrStale) {
		t.Fatalf("single-event batch with a stale expectation = %v, want ErrStale", err)
	}
	if n := msgCount(t, b); n != 1 {
		t.Fatalf("stream holds %d events, want 1", n)
	}
	res, err = b.PublishBatch(ctx, "s1", 1, []schemas.Event{jobStarted("s1", "two")})
	if err != nil || res.Seq != 2 {
		t.Fatalf("single-event batch with the right expectation = %+v, %v; want seq 2", res, err)
	}

	// Re-sending the newest event with its own expectation writes nothing.
	// (The doc promises ErrDuplicate; the server acknowledges a duplicate.)
	res, err = b.PublishBatch(ctx, "s1", 2, []schemas.Event{jobStarted("s1", "two")})
	if err != nil && !errors.Is(err, bus.ErrDuplicate) && !errors.Is(err, bus.ErrStale) {
		t.Errorf("re-sent single-event batch = %v", err)
	}
	if err == nil && !res.Duplicate {
		t.Errorf("re-sent single-event batch = %+v, want Duplicate or ErrDuplicate", res)
	}
	if n := msgCount(t, b); n != 2 {
		t.Errorf("stream holds %d events, want 2", n)
	}
}

// Deciders racing on one session: exactly one batch per expectation wins.
func TestPublishBatchConcurrentDeciders(t *testing.T) {
	t.Parallel()
	b, _ := testnats.Bus(t)
	ctx := ctxT(t)
	seed := publish(t, b, jobRequested("s1", "seed"))

	const n = 8
	errs := make(chan error, n)
	for i := range n {
		go func() {
			_, err := b.PublishBatch(ctx, "s1", seed, []schemas.Event{
				jobStarted("s1", fmt.Sprintf("x%d-1", i)), jobStarted("s1", fmt.Sprintf("x%d-2", i)),
			})
			errs <- err
		}()
	}
	won := 0
	for range n {
		err := <-errs
		switch {
		case err == nil:
			won++
		case errors.Is(err, bus.ErrStale):
		default:
			t.Errorf("racing batch: %v, want nil or ErrStale", err)
		}
	}
	if won != 1 {
		t.Errorf("%d racing batches won, want exactly 1", won)
	}
	if got := msgCount(t, b); got != 3 {
		t.Errorf("stream holds %d events, want 3", got)
	}
}

// TestPublishChain: the events are written in order, each guarded on the
// one before; a stale expectation writes nothing; events stored before
// are skipped and the rest written (a chain completed), and a chain
// stored whole before is ErrDuplicate; an event that cannot be encoded
// writes none; an event sent with the others but refused because another
// session's event came first is written again on its own.
func TestPublishChain(t *testing.T) {
	t.Parallel()
	b, _ := testnats.Bus(t)
	ctx := ctxT(t)
	seed := publish(t, b, jobRequested("s1", "r0"))
	publish(t, b, jobStarted("s2", "other"))

	res, err := b.PublishChain(ctx, "s1", seed, []schemas.Event{jobStarted("s1", "c1"), jobRequested("s1", "c2")})
	if err != nil || res.Seq != 4 {
		t.Fatalf("chain = %+v, %v; want Seq 4", res, err)
	}
	for seq, id := range map[uint64]string{3: "c1", 4: "c2"} {
		if ev, err := b.GetEvent(ctx, seq); err != nil || ev.ID != id {
			t.Errorf("event %d = %q, %v; want %s", seq, ev.ID, err, id)
		}
	}
	if _, err := b.PublishChain(ctx, "s1", seed, []schemas.Event{jobStarted("s1", "c3")}); !errors.Is(err, bus.ErrStale) {
		t.Errorf("stale chain: %v, want ErrStale", err)
	}
	res, err = b.PublishChain(ctx, "s1", 4, []schemas.Event{jobStarted("s1", "c1"), jobStarted("s1", "c2"), jobStarted("s1", "c4"), jobStarted("s1", "c5")})
	if err != nil || res.Seq != 6 {
		t.Errorf("chain completing an earlier one = %+v, %v; want Seq 6", res, err)
	}
	for seq, id := range map[uint64]string{5: "c4", 6: "c5"} {
		if ev, err := b.GetEvent(ctx, seq); err != nil || ev.ID != id {
			t.Errorf("event %d = %q, %v; want %s", seq, ev.ID, err, id)
		}
	}
	if _, err := b.PublishChain(ctx, "s1", 6, []schemas.Event{jobStarted("s1", "c4"), jobStarted("s1", "c5")}); !errors.Is(err, bus.ErrDuplicate) {
		t.Errorf("a chain stored before: %v, want ErrDuplicate", err)
	}
	bad := jobStarted("s1", "c6")
	bad.Data = &schemas.JobStarted{}
	if _, err := b.PublishChain(ctx, "s1", 6, []schemas.Event{jobStarted("s1", "c7"), bad}); err == nil {
		t.Error("a chain with an invalid event was written")
	}
	if _, err := b.PublishChain(ctx, "s1", 6, []schemas.Event{jobStarted("s2", "c8")}); err == nil {
		t.Error("a chain with another session's event was written")
	}
	if last, err := b.SessionLastSeq(ctx, "s1"); err != nil || last != 6 {
		t.Errorf("SessionLastSeq(s1) = %d, %v; want 6", last, err)
	}

	// c5 is stored but no longer the stream's last message: c9, sent
	// with it, is refused as not right after it, and written on its own,
	// after s2's event, the session's own events still in a row.
	publish(t, b, jobStarted("s2", "other2"))
	res, err = b.PublishChain(ctx, "s1", 6, []schemas.Event{jobStarted("s1", "c5"), jobStarted("s1", "c9")})
	if err != nil || res.Seq != 8 {
		t.Fatalf("chain after another session's event = %+v, %v; want Seq 8", res, err)
	}
	if ev, err := b.GetEvent(ctx, 8); err != nil || ev.ID != "c9" {
		t.Errorf("event 8 = %q, %v; want c9", ev.ID, err)
	}
	// A stale chain of two writes neither.
	if _, err := b.PublishChain(ctx, "s1", 6, []schemas.Event{jobStarted("s1", "c10"), jobStarted("s1", "c11")}); !errors.Is(err, bus.ErrStale) {
		t.Errorf("stale chain of two: %v, want ErrStale", err)
	}
	if got := msgCount(t, b); got != 8 {
		t.Errorf("stream holds %d events, want 8", got)
	}

	// A chain that orders events stored before differently: d3 cannot
	// come between d1 and d2 any more and is refused; d4, sent with it,
	// follows d2 and is written, and the result says so.
	if res, err := b.PublishChain(ctx, "s4", 0, []schemas.Event{jobStarted("s4", "d1"), jobStarted("s4", "d2")}); err != nil || res.Seq != 10 {
		t.Fatalf("chain of s4 = %+v, %v; want Seq 10", res, err)
	}
	res, err = b.PublishChain(ctx, "s4", 10, []schemas.Event{jobStarted("s4", "d1"), jobStarted("s4", "d3"), jobStarted("s4", "d2"), jobStarted("s4", "d4")})
	if !errors.Is(err, bus.ErrStale) || res.Seq != 11 {
		t.Errorf("reordered chain = %+v, %v; want Seq 11 and ErrStale", res, err)
	}
	if ev, err := b.GetEvent(ctx, 11); err != nil || ev.ID != "d4" {
		t.Errorf("event 11 = %q, %v; want d4", ev.ID, err)
	}
}

// TestAsyncPublish: events published without a wait for each are all
// stored, in order, once Wait returns, more of them than are let in
// flight at once; an id already stored stays one event; an event that
// cannot be encoded is refused at once; and an event the server refuses
// fails Wait with the server's reason, after it was tried again as
// Publish tries.
func TestAsyncPublish(t *testing.T) {
	t.Parallel()
	b, _ := testnats.Bus(t)
	ctx := ctxT(t)

	const n = 150 // past the window of events in flight
	a := b.Async()
	for i := range n {
		if err := a.Publish(ctx, jobStarted("s1", fmt.Sprintf("e%03d", i))); err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
	}
	if err := a.Publish(ctx, jobStarted("s1", "e007")); err != nil {
		t.Fatalf("publish e007 again: %v", err)
	}
	if err := a.Wait(ctx); err != nil {
		t.Fatalf("wait: %v", err)
	}
	if got := msgCount(t, b); got != n {
		t.Fatalf("stream holds %d events, want %d", got, n)
	}
	for seq := uint64(1); seq <= n; seq++ {
		ev, err := b.GetEvent(ctx, seq)
		if want := fmt.Sprintf("e%03d", seq-1); err != nil || ev.ID != want {
			t.Fatalf("event at seq %d: %v %v, want id %s: published in order, stored in order", seq, ev.ID, err, want)
		}
	}

	bad := jobStarted("s1", "bad")
	bad.Data = &schemas.JobStarted{Worker: "w1", Delivery: 1} // no job id
	if err := a.Publish(ctx, bad); err == nil {
		t.Error("an event its schema refuses was accepted")
	}

	// The server refuses events larger than the stream allows.
	js := b.JetStream()
	st, err := js.Stream(ctx, b.StreamName())
	if err != nil {
		t.Fatal(err)
	}
	cfg := st.CachedInfo().Config
	cfg.MaxMsgSize = 64
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	if err := a.Publish(ctx, jobStarted("s1", "big")); err != nil {
		t.Fatalf("publish: %v (the refusal comes with the acknowledgement)", err)
	}
	if err := a.Wait(ctx); !errors.Is(err, bus.ErrRejected) {
		t.Errorf("wait after a refused event: %v, want ErrRejected", err)
	}
	if got := msgCount(t, b); got != n {
		t.Errorf("stream holds %d events, want %d", got, n)
	}
	if err := a.Wait(ctx); err != nil {
		t.Errorf("wait with nothing in flight: %v", err)
	}
}
