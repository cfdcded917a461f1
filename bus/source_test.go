package bus_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/internal/testnats"
	"github.com/loopbus/loopbus/schemas"
)

// A Bus derived with WithSource publishes with its own source over the same
// connection; the original keeps its source.
func TestWithSource(t *testing.T) {
	t.Parallel()
	b, _ := testnats.Bus(t)
	orch := b.WithSource("loopbus/orchestrator/host-1")
	worker := b.WithSource("loopbus/agentworker/host-1")
	if orch.Conn() != b.Conn() || orch.StreamName() != b.StreamName() || orch.Catalogue() != b.Catalogue() {
		t.Error("a derived Bus does not share the connection, stream and catalogue")
	}
	tests := []struct {
		name   string
		via    *bus.Bus
		source string // set on the event; "" lets the Bus fill it
		want   string
	}{
		{name: "derived", via: orch, want: "loopbus/orchestrator/host-1"},
		{name: "another derived", via: worker, want: "loopbus/agentworker/host-1"},
		{name: "original unchanged", via: b, want: b.Source()},
		{name: "explicit source wins", via: orch, source: "elsewhere/1", want: "elsewhere/1"},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ev := jobStarted("s1", fmt.Sprintf("e%d", i))
			ev.Source = tt.source
			seq := publish(t, tt.via, ev)
			got, err := b.GetEvent(ctxT(t), seq)
			if err != nil {
				t.Fatal(err)
			}
			if got.Source != tt.want {
				t.Errorf("stored source %q, want %q", got.Source, tt.want)
			}
		})
	}
	if orch.Source() != "loopbus/orchestrator/host-1" || b.Source() == orch.Source() {
		t.Errorf("Source(): original %q derived %q", b.Source(), orch.Source())
	}
}

// Dead letters written through any Bus sharing a connection are counted
// once, on all of them.
func TestWithSourceSharesDeadLetterCount(t *testing.T) {
	t.Parallel()
	b, _ := testnats.Bus(t)
	d := b.WithSource("loopbus/validator/host-1")
	seq := publish(t, b, jobRequested("s1", "bad"))
	startConsume(t, d, bus.ConsumerConfig{Durable: "shared", Subjects: []string{requested}}, func(context.Context, bus.Delivery) error {
		return fmt.Errorf("cannot: %w", bus.ErrPermanent)
	})
	waitSettled(t, b, "shared", seq)
	waitDeadLetter(t, b, "shared")
	tests := []struct {
		name string
		bus  *bus.Bus
		want int64
	}{
		{name: "derived", bus: d, want: 1},
		{name: "original", bus: b, want: 1},
		{name: "derived later", bus: b.WithSource("x/y"), want: 1},
	}
	for _, tt := range tests {
		if got := tt.bus.DeadLettered(); got != tt.want {
			t.Errorf("%s: DeadLettered() = %d, want %d", tt.name, got, tt.want)
		}
	}
}

// Every event the bus hands out carries the time the stream stored it, in
// UTC, the same whichever way it was read.
func TestEventStored(t *testing.T) {
	t.Parallel()
	b, _ := testnats.Bus(t)
	seq := publish(t, b, jobRequested("s1", "e1"))
	published := time.Now()

	tests := []struct {
		name string
		get  func(t *testing.T) schemas.Event
	}{
		{name: "GetEvent", get: func(t *testing.T) schemas.Event {
			ev, err := b.GetEvent(ctxT(t), seq)
			if err != nil {
				t.Fatal(err)
			}
			return ev
		}},
		{name: "Read", get: func(t *testing.T) schemas.Event {
			var got []schemas.Event
			if err := b.Read(ctxT(t), bus.ReadOptions{}, func(ev schemas.Event) error {
				got = append(got, ev)
				return nil
			}); err != nil || len(got) != 1 {
				t.Fatalf("Read = %d events, %v; want 1", len(got), err)
			}
			return got[0]
		}},
		{name: "Read with Follow", get: func(t *testing.T) schemas.Event {
			var got schemas.Event
			if err := b.Read(ctxT(t), bus.ReadOptions{Follow: true}, func(ev schemas.Event) error {
				got = ev
				return bus.ErrStop
			}); err != nil {
				t.Fatalf("Read: %v", err)
			}
			return got
		}},
		{name: "Consume", get: func(t *testing.T) schemas.Event {
			got := make(chan schemas.Event, 1)
			c := startConsume(t, b, bus.ConsumerConfig{Durable: "stored", Subjects: []string{requested}}, func(_ context.Context, d bus.Delivery) error {
				select {
				case got <- d.Event:
				default:
				}
				return nil
			})
			defer c.stop(t)
			select {
			case ev := <-got:
				return ev
			case <-time.After(testTimeout):
				t.Fatal("Consume delivered nothing")
				return schemas.Event{}
			}
		}},
	}
	var first time.Time
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ev := tt.get(t)
			if ev.Seq != seq || ev.ID != "e1" {
				t.Fatalf("got %s at %d, want e1 at %d", ev.ID, ev.Seq, seq)
			}
			if ev.Stored.IsZero() || ev.Stored.Location() != time.UTC {
				t.Fatalf("Stored = %v, want a UTC time", ev.Stored)
			}
			if d := published.Sub(ev.Stored).Abs(); d > time.Minute {
				t.Errorf("Stored = %v is %v from the publish at %v", ev.Stored, d, published)
			}
			if first.IsZero() {
				first = ev.Stored
			} else if !ev.Stored.Equal(first) {
				t.Errorf("Stored = %v, but another read gave %v for the same event", ev.Stored, first)
			}
		})
	}

	// Events that were never stored have none.
	m, err := b.Encode(jobStarted("s1", "local"))
	if err != nil {
		t.Fatal(err)
	}
	ev, err := b.Decode(m.Subject, m.Header, m.Data)
	if err != nil || !ev.Stored.IsZero() {
		t.Errorf("decoded local event: Stored %v, %v; want zero", ev.Stored, err)
	}
}
