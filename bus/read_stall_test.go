package bus_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/internal/testnats"
	"github.com/loopbus/loopbus/schemas"
	"github.com/nats-io/nats.go/jetstream"
)

// stallBus connects to a new server with a short Config.ReadStall.
func stallBus(t *testing.T, stall time.Duration) *bus.Bus {
	t.Helper()
	srv := testnats.Server(t)
	cat, err := schemas.NewCatalogue()
	if err != nil {
		t.Fatal(err)
	}
	b, err := bus.Connect(ctxT(t), bus.Config{URL: srv.URL(), Name: "stall", ReadStall: stall}, "test/"+t.Name(), cat, testnats.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	return b
}

// follow runs a following Read until the test ends, handing each event's
// id to the returned channel.
func follow(t *testing.T, b *bus.Bus, fn func(schemas.Event)) <-chan string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ids := make(chan string, 100)
	done := make(chan error, 1)
	go func() {
		done <- b.Read(ctx, bus.ReadOptions{Follow: true}, func(ev schemas.Event) error {
			if fn != nil {
				fn(ev)
			}
			ids <- ev.ID
			return nil
		})
	}()
	t.Cleanup(func() {
		cancel()
		if err := waitErr(t, done, "Read", 30*time.Second); err != nil {
			t.Errorf("Read: %v", err)
		}
	})
	return ids
}

// readers lists the names of the stream's ephemeral consumers.
func readers(t *testing.T, b *bus.Bus) []string {
	t.Helper()
	s, err := b.JetStream().Stream(ctxT(t), b.StreamName())
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	l := s.ListConsumers(ctxT(t))
	for ci := range l.Info() {
		if ci.Config.Durable == "" {
			names = append(names, ci.Name)
		}
	}
	if err := l.Err(); err != nil {
		t.Fatal(err)
	}
	return names
}

// next is the next id from ids, failing the test if none comes within.
func next(t *testing.T, ids <-chan string, within time.Duration) string {
	t.Helper()
	select {
	case id := <-ids:
		return id
	case <-time.After(within):
		t.Fatalf("no event in %v", within)
		return ""
	}
}

// An ordered consumer whose recovery never succeeds (here: the name it
// re-creates its consumer under is taken by one it cannot update; in a
// cluster, the consumer was placed on a node that died) stops delivering
// without an error. Read notices an event it should have delivered and
// resumes on a new consumer after the last event delivered: nothing is
// lost, repeated or reordered, and no consumer of the read is left.
func TestReadResumesAfterStalledConsumer(t *testing.T) {
	t.Parallel()
	b := stallBus(t, time.Second)
	publish(t, b, jobStarted("s1", "e1"))
	ids := follow(t, b, nil)
	if id := next(t, ids, testTimeout); id != "e1" {
		t.Fatalf("first event %s, want e1", id)
	}
	rs := readers(t, b)
	if len(rs) != 1 || !strings.HasSuffix(rs[0], "_1") {
		t.Fatalf("readers %v, want one ordered consumer", rs)
	}
	prefix := strings.TrimSuffix(rs[0], "_1")
	// The name the ordered consumer re-creates itself under, taken with an
	// ack policy it cannot change.
	ctx := ctxT(t)
	if _, err := b.JetStream().CreateConsumer(ctx, b.StreamName(), jetstream.ConsumerConfig{
		Name: prefix + "_2", AckPolicy: jetstream.AckExplicitPolicy, InactiveThreshold: time.Minute,
	}); err != nil {
		t.Fatal(err)
	}
	if err := b.JetStream().DeleteConsumer(ctx, b.StreamName(), rs[0]); err != nil {
		t.Fatal(err)
	}
	publish(t, b, jobStarted("s1", "e2"))
	publish(t, b, jobStarted("s2", "e3"))
	for _, want := range []string{"e2", "e3"} {
		if id := next(t, ids, testTimeout); id != want {
			t.Fatalf("event %s, want %s", id, want)
		}
	}
	publish(t, b, jobStarted("s1", "e4"))
	if id := next(t, ids, testTimeout); id != "e4" {
		t.Fatalf("event %s after resuming, want e4", id)
	}
	select {
	case id := <-ids:
		t.Fatalf("extra event %s", id)
	case <-time.After(time.Second):
	}
	if err := b.JetStream().DeleteConsumer(ctx, b.StreamName(), prefix+"_2"); err != nil {
		t.Fatal(err)
	}
	if rs := readers(t, b); len(rs) != 1 || strings.HasPrefix(rs[0], prefix) {
		t.Errorf("readers %v, want only the replacement", rs)
	}
}

// A read that waits with nothing to deliver, or whose callback is slow,
// keeps its consumer.
func TestReadKeepsIdleOrBusyConsumer(t *testing.T) {
	t.Parallel()
	b := stallBus(t, 200*time.Millisecond)
	slow := make(chan struct{})
	ids := follow(t, b, func(ev schemas.Event) {
		if ev.ID == "slow" {
			<-slow
		}
	})
	waitFor(t, testTimeout, "the read's consumer", func() bool { return len(readers(t, b)) == 1 })
	before := readers(t, b)
	publish(t, b, jobStarted("s1", "slow"))
	publish(t, b, jobStarted("s1", "after"))
	// Ten stall periods with an event the callback has not taken yet.
	time.Sleep(2 * time.Second)
	close(slow)
	for _, want := range []string{"slow", "after"} {
		if id := next(t, ids, testTimeout); id != want {
			t.Fatalf("event %s, want %s", id, want)
		}
	}
	// Ten stall periods with nothing to deliver.
	time.Sleep(2 * time.Second)
	if after := readers(t, b); len(after) != 1 || after[0] != before[0] {
		t.Errorf("readers %v, then %v: want the same consumer throughout", before, after)
	}
}
