package bus_test

import (
	"context"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/internal/testnats"
	"github.com/loopbus/loopbus/schemas"
	"github.com/nats-io/nats.go/jetstream"
)

// testTimeout bounds every wait in these tests: only a failing test
// waits that long. Megabytes of artifacts through a server under the race
// detector, beside the package's other tests on a loaded 2-core machine,
// took more than 15 s.
const testTimeout = 60 * time.Second

// ctxT returns a context that ends with the test (or after testTimeout).
func ctxT(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	t.Cleanup(cancel)
	return ctx
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// jobStarted returns a valid job.started event of session with the given id.
func jobStarted(session, id string) schemas.Event {
	return schemas.Event{
		ID:      id,
		Type:    schemas.TypeJobStarted,
		Session: session,
		Step:    "plan",
		Job:     "job-" + id,
		Data:    &schemas.JobStarted{JobID: "job-" + id, Worker: "w1", Delivery: 1},
	}
}

// jobRequested returns a valid job.requested event of session with the given id.
func jobRequested(session, id string) schemas.Event {
	return schemas.Event{
		ID:      id,
		Type:    schemas.TypeJobRequested,
		Session: session,
		Step:    "plan",
		Job:     "job-" + id,
		Data: &schemas.JobRequested{
			JobID: "job-" + id, Step: "plan", Iteration: 1,
			Agent:  schemas.AgentSpec{Backend: "exec", Command: []string{"true"}},
			Prompt: "plan it", TimeoutMs: 1000,
		},
	}
}

// publish writes ev and returns its sequence.
func publish(t *testing.T, b *bus.Bus, ev schemas.Event) uint64 {
	t.Helper()
	res, err := b.Publish(ctxT(t), ev)
	if err != nil {
		t.Fatalf("publish %s: %v", ev.ID, err)
	}
	if res.Duplicate {
		t.Fatalf("publish %s: unexpected duplicate", ev.ID)
	}
	return res.Seq
}

// publishRaw publishes arbitrary bytes on subject through JetStream and
// returns the stored sequence.
func publishRaw(t *testing.T, b *bus.Bus, subject string, data []byte) uint64 {
	t.Helper()
	ack, err := b.JetStream().Publish(ctxT(t), subject, data)
	if err != nil {
		t.Fatalf("raw publish on %s: %v", subject, err)
	}
	return ack.Sequence
}

// streamState returns the state of a stream.
func streamState(t *testing.T, b *bus.Bus, name string) jetstream.StreamState {
	t.Helper()
	s, err := b.JetStream().Stream(ctxT(t), name)
	if err != nil {
		t.Fatalf("stream %s: %v", name, err)
	}
	info, err := s.Info(ctxT(t))
	if err != nil {
		t.Fatalf("stream %s info: %v", name, err)
	}
	return info.State
}

// msgCount is the number of messages in the event stream.
func msgCount(t *testing.T, b *bus.Bus) uint64 {
	t.Helper()
	return streamState(t, b, bus.DefaultStream).Msgs
}

// consumerInfo returns the info of a durable on the event stream.
func consumerInfo(t *testing.T, b *bus.Bus, durable string) *jetstream.ConsumerInfo {
	t.Helper()
	info, err := tryConsumerInfo(t, b, durable)
	if err != nil {
		t.Fatalf("consumer %s: %v", durable, err)
	}
	return info
}

func tryConsumerInfo(t *testing.T, b *bus.Bus, durable string) (*jetstream.ConsumerInfo, error) {
	t.Helper()
	c, err := b.JetStream().Consumer(ctxT(t), bus.DefaultStream, durable)
	if err != nil {
		return nil, err
	}
	return c.Info(ctxT(t))
}

// waitSettled waits until the durable has acknowledged (acked or terminated)
// everything up to seq and nothing is pending.
func waitSettled(t *testing.T, b *bus.Bus, durable string, seq uint64) *jetstream.ConsumerInfo {
	t.Helper()
	var info *jetstream.ConsumerInfo
	waitFor(t, testTimeout, fmt.Sprintf("consumer %s to settle at %d", durable, seq), func() bool {
		var err error
		info, err = tryConsumerInfo(t, b, durable)
		return err == nil && info.NumAckPending == 0 && info.AckFloor.Stream >= seq
	})
	return info
}

// dlqCount is the number of dead letters of one consumer or reader.
func dlqCount(t *testing.T, b *bus.Bus, name string) uint64 {
	t.Helper()
	s, err := b.JetStream().Stream(ctxT(t), bus.DefaultDLQStream)
	if err != nil {
		t.Fatalf("DLQ stream: %v", err)
	}
	subj := bus.DLQSubjectPrefix + "." + name + ".*"
	info, err := s.Info(ctxT(t), jetstream.WithSubjectFilter(subj))
	if err != nil {
		t.Fatalf("DLQ stream info: %v", err)
	}
	var n uint64
	for _, c := range info.State.Subjects {
		n += c
	}
	return n
}

// waitDeadLetter waits for the newest dead letter of name and returns it.
func waitDeadLetter(t *testing.T, b *bus.Bus, name string) *jetstream.RawStreamMsg {
	t.Helper()
	s, err := b.JetStream().Stream(ctxT(t), bus.DefaultDLQStream)
	if err != nil {
		t.Fatalf("DLQ stream: %v", err)
	}
	var m *jetstream.RawStreamMsg
	waitFor(t, testTimeout, "a dead letter on "+bus.DLQSubjectPrefix+"."+name, func() bool {
		m, err = s.GetLastMsgForSubject(ctxT(t), bus.DLQSubjectPrefix+"."+name+".*")
		return err == nil
	})
	return m
}

// consumer runs Consume in the background until the returned stop function
// (also registered as cleanup) cancels it; stop fails the test if Consume
// does not return promptly or returns an error.
type consumer struct {
	cancel context.CancelFunc
	done   chan struct{}
	err    error
	once   sync.Once
}

func startConsume(t *testing.T, b *bus.Bus, cfg bus.ConsumerConfig, h bus.Handler) *consumer {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	c := &consumer{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(c.done)
		c.err = b.Consume(ctx, cfg, h)
	}()
	t.Cleanup(func() { c.stop(t) })
	return c
}

// stop cancels the consumer and waits for Consume to return.
func (c *consumer) stop(t *testing.T) {
	t.Helper()
	c.once.Do(func() {
		c.cancel()
		select {
		case <-c.done:
		case <-time.After(testTimeout):
			t.Errorf("Consume did not return within %v of cancellation", testTimeout)
			return
		}
		if c.err != nil {
			t.Errorf("Consume returned %v", c.err)
		}
	})
}

// counter counts handler invocations per event id.
type counter struct {
	mu sync.Mutex
	n  map[string]int
}

func newCounter() *counter { return &counter{n: map[string]int{}} }

func (c *counter) add(id string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n[id]++
	return c.n[id]
}

func (c *counter) get(id string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[id]
}

func (c *counter) distinct() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.n)
}

// String lists the counts (for messages).
func (c *counter) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return fmt.Sprint(c.n)
}

// hangGuard is the only kind of time limit on behaviour in these tests: a
// generous upper bound that turns a hang into a failure. Never a lower
// bound, never a tight one.
const hangGuard = 10 * time.Second

// connectWithin runs bus.Connect and returns its error, failing the test if
// Connect does not return within guard. A Bus it returns is closed.
func connectWithin(t *testing.T, ctx context.Context, cfg bus.Config, guard time.Duration) error {
	t.Helper()
	cat, log := catalogue(t), testnats.Logger(t)
	done := make(chan error, 1)
	go func() {
		b, err := bus.Connect(ctx, cfg, "test/connect", cat, log)
		if err == nil {
			b.Close()
		}
		done <- err
	}()
	select {
	case err := <-done:
		return err
	case <-time.After(guard):
		t.Fatalf("Connect to %s did not return within %v", cfg.URL, guard)
		return nil
	}
}

// closedPort returns a loopback URL nothing listens on.
func closedPort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return "nats://" + addr
}

// waitErr waits for an error from done, failing the test after guard.
func waitErr(t *testing.T, done <-chan error, what string, guard time.Duration) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(guard):
		t.Fatalf("%s did not return within %v", what, guard)
		return nil
	}
}
