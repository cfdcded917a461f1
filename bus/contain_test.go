package bus_test

import (
	"context"
	"strings"
	"testing"

	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/internal/testnats"
	"github.com/loopbus/loopbus/schemas"
)

// deadLetters returns the dead letters' reasons by source sequence.
func deadLetters(t *testing.T, b *bus.Bus) map[uint64]string {
	t.Helper()
	got := map[uint64]string{}
	if err := b.DeadLetters(ctxT(t), func(dl bus.DeadLetter) error {
		got[dl.SourceSeq] = dl.Reason
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return got
}

// TestHandlerPanicsAreContained: a handler that panics on one event gets
// that event dead-lettered with the panic as its reason; the process, and
// the events after it, carry on.
func TestHandlerPanicsAreContained(t *testing.T) {
	t.Parallel()
	b, _ := testnats.Bus(t)
	bad := publish(t, b, jobRequested("s1", "boom"))
	good := publish(t, b, jobRequested("s1", "fine"))
	handled := make(chan string, 4)
	startConsume(t, b, bus.ConsumerConfig{Durable: "panicky", Subjects: []string{requested}},
		func(_ context.Context, d bus.Delivery) error {
			if d.Event.ID == "boom" {
				panic("a bug met a strange event")
			}
			handled <- d.Event.ID
			return nil
		})
	select {
	case id := <-handled:
		if id != "fine" {
			t.Fatalf("handled %s, want fine", id)
		}
	case <-ctxT(t).Done():
		t.Fatal("the event after the panicking one was never handled")
	}
	waitSettled(t, b, "panicky", good)
	if r := deadLetters(t, b)[bad]; !strings.Contains(r, "panicked: a bug met a strange event") {
		t.Errorf("dead letter of the panicking event: %q", r)
	}

	// Read: the panicking event is skipped (and dead-lettered), the next read.
	var read []string
	var skipped []uint64
	err := b.Read(ctxT(t), bus.ReadOptions{Subjects: []string{"loopbus.evt.s1.>"}, DeadLetter: "reader",
		OnSkip: func(_ string, seq uint64) { skipped = append(skipped, seq) }}, func(ev schemas.Event) error {
		if ev.ID == "boom" {
			var m map[string]int
			m["x"]++ // a nil map write: a runtime panic
		}
		read = append(read, ev.ID)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(read) != 1 || read[0] != "fine" || len(skipped) != 1 || skipped[0] != bad {
		t.Errorf("read %v, skipped %v; want [fine] and [%d]", read, skipped, bad)
	}
}
