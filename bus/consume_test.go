package bus_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/internal/testnats"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
)

const requested = "loopbus.evt.*.job.requested"

func TestConsumerConfigValidate(t *testing.T) {
	t.Parallel()
	subj := []string{requested}
	tests := []struct {
		name    string
		cfg     bus.ConsumerConfig
		wantErr bool
	}{
		{name: "minimal", cfg: bus.ConsumerConfig{Durable: "d", Subjects: subj}},
		{name: "all set", cfg: bus.ConsumerConfig{Durable: "d", Subjects: subj, AckWait: time.Second, MaxDeliver: 3, Concurrency: 4, DeliverNew: true}},
		{name: "no durable", cfg: bus.ConsumerConfig{Subjects: subj}, wantErr: true},
		{name: "no subjects", cfg: bus.ConsumerConfig{Durable: "d"}, wantErr: true},
		{name: "negative concurrency", cfg: bus.ConsumerConfig{Durable: "d", Subjects: subj, Concurrency: -1}, wantErr: true},
		{name: "negative max deliver", cfg: bus.ConsumerConfig{Durable: "d", Subjects: subj, MaxDeliver: -1}, wantErr: true},
		{name: "negative ack wait", cfg: bus.ConsumerConfig{Durable: "d", Subjects: subj, AckWait: -time.Second}, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			if (err != nil) != tt.wantErr {
				t.Fatalf("Validate() = %v, wantErr %v", err, tt.wantErr)
			}
			if err != nil && !errors.Is(err, bus.ErrConfig) {
				t.Errorf("error %v does not wrap ErrConfig", err)
			}
		})
	}
}

func TestConsumeRefusesInvalidConfig(t *testing.T) {
	t.Parallel()
	b, _ := testnats.Bus(t)
	err := b.Consume(ctxT(t), bus.ConsumerConfig{Durable: "d"}, func(context.Context, bus.Delivery) error { return nil })
	if !errors.Is(err, bus.ErrConfig) {
		t.Fatalf("Consume without subjects = %v, want ErrConfig", err)
	}
}

// A durable the server refuses to update (its deliver policy cannot change)
// must be reported, not retried silently until ctx ends.
func TestConsumeReportsImpossibleConsumer(t *testing.T) {
	t.Parallel()
	b, _ := testnats.Bus(t)
	cfg := bus.ConsumerConfig{Durable: "policy", Subjects: []string{requested}}
	first := startConsume(t, b, cfg, func(context.Context, bus.Delivery) error { return nil })
	waitFor(t, testTimeout, "consumer created", func() bool {
		_, err := tryConsumerInfo(t, b, "policy")
		return err == nil
	})
	first.stop(t)

	cfg.DeliverNew = true
	// A generous bound: Consume must return the refusal at once, and only
	// a Consume that retried until ctx ended would take all of it.
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	defer cancel()
	err := b.Consume(ctx, cfg, func(context.Context, bus.Delivery) error { return nil })
	if err == nil {
		t.Fatal("Consume with a deliver policy the server cannot update returned nil (it retried until ctx ended)")
	}
}

func TestConsumeAck(t *testing.T) {
	t.Parallel()
	b, _ := testnats.Bus(t)
	seq := publish(t, b, jobRequested("s1", "e1"))
	publish(t, b, jobStarted("s1", "ignored")) // outside the filter

	calls := newCounter()
	got := make(chan bus.Delivery, 10)
	startConsume(t, b, bus.ConsumerConfig{Durable: "acker", Subjects: []string{requested}},
		func(_ context.Context, d bus.Delivery) error {
			calls.add(d.Event.ID)
			got <- d
			return nil
		})

	var d bus.Delivery
	select {
	case d = <-got:
	case <-time.After(testTimeout):
		t.Fatal("handler not called")
	}
	if d.Event.ID != "e1" || d.Event.Seq != seq || d.NumDelivered != 1 {
		t.Errorf("delivery %+v (seq %d), want e1 at seq %d, first delivery", d, d.Event.Seq, seq)
	}
	if d.Event.Type != "loopbus.job.requested" || d.Event.Session != "s1" {
		t.Errorf("decoded event %+v", d.Event)
	}
	info := waitSettled(t, b, "acker", seq)
	if info.NumRedelivered != 0 || info.NumPending != 0 {
		t.Errorf("consumer info: redelivered %d pending %d", info.NumRedelivered, info.NumPending)
	}
	if calls.distinct() != 1 || calls.get("e1") != 1 {
		t.Errorf("handler calls %v, want e1 once", calls)
	}
	if b.DeadLettered() != 0 {
		t.Errorf("DeadLettered = %d", b.DeadLettered())
	}
}

func TestConsumeTransientErrorRedelivers(t *testing.T) {
	t.Parallel()
	b, _ := testnats.Bus(t)
	seq := publish(t, b, jobRequested("s1", "e1"))

	var deliveries []uint64
	var mu sync.Mutex
	startConsume(t, b, bus.ConsumerConfig{Durable: "retry", Subjects: []string{requested}},
		func(_ context.Context, d bus.Delivery) error {
			mu.Lock()
			defer mu.Unlock()
			deliveries = append(deliveries, d.NumDelivered)
			if d.NumDelivered == 1 {
				return errors.New("flaky backend")
			}
			return nil
		})
	waitSettled(t, b, "retry", seq)
	mu.Lock()
	defer mu.Unlock()
	if fmt.Sprint(deliveries) != "[1 2]" {
		t.Errorf("NumDelivered seen %v, want [1 2]", deliveries)
	}
	if b.DeadLettered() != 0 || dlqCount(t, b, "retry") != 0 {
		t.Errorf("a transient failure was dead-lettered")
	}
}

func TestConsumePermanentErrorDeadLetters(t *testing.T) {
	t.Parallel()
	b, _ := testnats.Bus(t)
	seq := publish(t, b, jobRequested("s1", "e1"))

	calls := newCounter()
	startConsume(t, b, bus.ConsumerConfig{Durable: "perm", Subjects: []string{requested}},
		func(_ context.Context, d bus.Delivery) error {
			calls.add(d.Event.ID)
			return fmt.Errorf("prompt is empty: %w", bus.ErrPermanent)
		})
	m := waitDeadLetter(t, b, "perm")
	if m.Subject != "loopbus.dlq.perm."+strconv.FormatUint(seq, 10) {
		t.Errorf("dead letter subject %q", m.Subject)
	}
	if r := m.Header.Get(bus.HeaderDLQReason); !strings.Contains(r, "prompt is empty") {
		t.Errorf("%s = %q, want the handler's error", bus.HeaderDLQReason, r)
	}
	if s := m.Header.Get(bus.HeaderDLQSubject); s != "loopbus.evt.s1.job.requested" {
		t.Errorf("%s = %q", bus.HeaderDLQSubject, s)
	}
	if s := m.Header.Get(bus.HeaderDLQSeq); s != strconv.FormatUint(seq, 10) {
		t.Errorf("%s = %q, want %d", bus.HeaderDLQSeq, s, seq)
	}
	if s := m.Header.Get(bus.HeaderDLQConsumer); s != "perm" {
		t.Errorf("%s = %q", bus.HeaderDLQConsumer, s)
	}
	if ct := m.Header.Get("Content-Type"); ct != bus.ContentType {
		t.Errorf("original Content-Type not kept: %q", ct)
	}
	if ev, err := b.Decode("loopbus.evt.s1.job.requested", nats.Header{nats.MsgIdHdr: {"e1"}}, m.Data); err != nil || ev.ID != "e1" {
		t.Errorf("dead letter body does not decode to the event: %v", err)
	}
	info := waitSettled(t, b, "perm", seq)
	if info.NumRedelivered != 0 {
		t.Errorf("terminated message was redelivered (%d)", info.NumRedelivered)
	}
	if calls.get("e1") != 1 {
		t.Errorf("handler called %d times, want 1", calls.get("e1"))
	}
	if got := b.DeadLettered(); got != 1 {
		t.Errorf("DeadLettered = %d, want 1", got)
	}
	if n := dlqCount(t, b, "perm"); n != 1 {
		t.Errorf("%d dead letters, want 1", n)
	}
}

func TestConsumeMalformedDeadLetters(t *testing.T) {
	t.Parallel()
	b, _ := testnats.Bus(t)
	// Garbage and a valid event published on a subject it does not belong to.
	bad1 := publishRaw(t, b, "loopbus.evt.s1.job.requested", []byte("definitely not an event"))
	m, err := b.Encode(jobRequested("s2", "wrong-session"))
	if err != nil {
		t.Fatal(err)
	}
	bad2 := publishRaw(t, b, "loopbus.evt.s1.job.requested", m.Data)
	good := publish(t, b, jobRequested("s1", "good"))

	calls := newCounter()
	startConsume(t, b, bus.ConsumerConfig{Durable: "strict", Subjects: []string{requested}},
		func(_ context.Context, d bus.Delivery) error {
			calls.add(d.Event.ID)
			return nil
		})
	waitSettled(t, b, "strict", good)
	waitFor(t, testTimeout, "two dead letters", func() bool { return dlqCount(t, b, "strict") == 2 })

	if calls.distinct() != 1 || calls.get("good") != 1 {
		t.Errorf("handler saw %v, want only the good event", calls)
	}
	if got := b.DeadLettered(); got != 2 {
		t.Errorf("DeadLettered = %d, want 2", got)
	}
	s, err := b.JetStream().Stream(ctxT(t), bus.DefaultDLQStream)
	if err != nil {
		t.Fatal(err)
	}
	seqs := map[string]bool{}
	for seq := uint64(1); seq <= 2; seq++ {
		dl, err := s.GetMsg(ctxT(t), seq)
		if err != nil {
			t.Fatalf("dead letter %d: %v", seq, err)
		}
		seqs[dl.Header.Get(bus.HeaderDLQSeq)] = true
		if r := dl.Header.Get(bus.HeaderDLQReason); !strings.Contains(r, bus.ErrMalformed.Error()) {
			t.Errorf("reason %q does not say the event is malformed", r)
		}
		if dl.Header.Get(bus.HeaderDLQSubject) != "loopbus.evt.s1.job.requested" {
			t.Errorf("subject header %q", dl.Header.Get(bus.HeaderDLQSubject))
		}
	}
	if !seqs[strconv.FormatUint(bad1, 10)] || !seqs[strconv.FormatUint(bad2, 10)] {
		t.Errorf("dead-lettered seqs %v, want %d and %d", seqs, bad1, bad2)
	}
	if info := consumerInfo(t, b, "strict"); info.NumRedelivered != 0 {
		t.Errorf("malformed messages were redelivered (%d)", info.NumRedelivered)
	}
}

func TestConsumeGivesUpAfterMaxDeliver(t *testing.T) {
	t.Parallel()
	b, _ := testnats.Bus(t)
	seq := publish(t, b, jobRequested("s1", "e1"))

	calls := newCounter()
	startConsume(t, b, bus.ConsumerConfig{Durable: "giveup", Subjects: []string{requested}, MaxDeliver: 3},
		func(_ context.Context, d bus.Delivery) error {
			calls.add(d.Event.ID)
			return errors.New("backend down")
		})
	m := waitDeadLetter(t, b, "giveup")
	r := m.Header.Get(bus.HeaderDLQReason)
	if !strings.Contains(r, "gave up after 3 deliveries") || !strings.Contains(r, "backend down") {
		t.Errorf("reason %q", r)
	}
	waitSettled(t, b, "giveup", seq)
	if n := calls.get("e1"); n != 3 {
		t.Errorf("handler called %d times, want MaxDeliver = 3", n)
	}
	if got := b.DeadLettered(); got != 1 {
		t.Errorf("DeadLettered = %d, want 1", got)
	}
}

func TestConsumeHeartbeatsKeepLongHandler(t *testing.T) {
	t.Parallel()
	b, _ := testnats.Bus(t)
	seq := publish(t, b, jobRequested("s1", "slow"))

	calls := newCounter()
	// Concurrency 2 keeps a pull request open that would receive a
	// redelivery while the handler runs.
	startConsume(t, b, bus.ConsumerConfig{Durable: "slow", Subjects: []string{requested}, AckWait: time.Second, Concurrency: 2},
		func(ctx context.Context, d bus.Delivery) error {
			calls.add(d.Event.ID)
			select {
			case <-time.After(3 * time.Second):
			case <-ctx.Done():
				return ctx.Err()
			}
			return nil
		})
	info := waitSettled(t, b, "slow", seq)
	if n := calls.get("slow"); n != 1 {
		t.Errorf("a handler running 3x AckWait was invoked %d times, want 1", n)
	}
	if info.NumRedelivered != 0 {
		t.Errorf("NumRedelivered = %d, want 0", info.NumRedelivered)
	}
}

func TestConsumeConcurrency(t *testing.T) {
	t.Parallel()
	b, _ := testnats.Bus(t)
	var last uint64
	for i := range 6 {
		last = publish(t, b, jobRequested("s1", fmt.Sprintf("e%d", i)))
	}

	var inFlight, maxInFlight, started atomic.Int32
	release := make(chan struct{})
	startConsume(t, b, bus.ConsumerConfig{Durable: "par", Subjects: []string{requested}, Concurrency: 3},
		func(ctx context.Context, d bus.Delivery) error {
			started.Add(1)
			n := inFlight.Add(1)
			defer inFlight.Add(-1)
			for {
				m := maxInFlight.Load()
				if n <= m || maxInFlight.CompareAndSwap(m, n) {
					break
				}
			}
			select {
			case <-release:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		})
	waitFor(t, testTimeout, "3 handlers in flight", func() bool { return inFlight.Load() == 3 })
	// Give a fourth handler the chance to start (it must not).
	time.Sleep(300 * time.Millisecond)
	if n := started.Load(); n != 3 {
		t.Errorf("%d handlers started while 3 were blocked, want 3", n)
	}
	if info := consumerInfo(t, b, "par"); info.NumAckPending != 3 {
		t.Errorf("NumAckPending = %d with 3 blocked handlers; nothing may wait in a local buffer", info.NumAckPending)
	}
	close(release)
	waitSettled(t, b, "par", last)
	if n := started.Load(); n != 6 {
		t.Errorf("%d handlers ran, want 6", n)
	}
	if m := maxInFlight.Load(); m != 3 {
		t.Errorf("max in flight %d, want 3", m)
	}
}

func TestConsumeReplicasShareWork(t *testing.T) {
	t.Parallel()
	b1, srv := testnats.Bus(t)
	b2 := testnats.Connect(t, srv.URL(), "test/replica2")

	calls := newCounter()
	var byReplica [2]atomic.Int32
	handler := func(i int) bus.Handler {
		return func(_ context.Context, d bus.Delivery) error {
			calls.add(d.Event.ID)
			byReplica[i].Add(1)
			time.Sleep(50 * time.Millisecond)
			return nil
		}
	}
	cfg := bus.ConsumerConfig{Durable: "shared", Subjects: []string{requested}}
	startConsume(t, b1, cfg, handler(0))
	startConsume(t, b2, cfg, handler(1))
	// Both replicas are pulling before the work arrives.
	waitFor(t, testTimeout, "both replicas pulling", func() bool {
		info, err := tryConsumerInfo(t, b1, "shared")
		return err == nil && info.NumWaiting >= 2
	})

	const n = 20
	var last uint64
	for i := range n {
		last = publish(t, b1, jobRequested(fmt.Sprintf("s%d", i), "e"+strconv.Itoa(i)))
	}
	waitSettled(t, b1, "shared", last)
	if calls.distinct() != n {
		t.Errorf("%d distinct events handled, want %d", calls.distinct(), n)
	}
	for i := range n {
		if c := calls.get("e" + strconv.Itoa(i)); c != 1 {
			t.Errorf("event e%d handled %d times, want once", i, c)
		}
	}
	if byReplica[0].Load() == 0 || byReplica[1].Load() == 0 {
		t.Errorf("work split %d/%d; want both replicas to take some", byReplica[0].Load(), byReplica[1].Load())
	}
}

// Stopping a replica mid-handler: Consume returns once the handler does,
// and the message goes promptly (not after AckWait) to another replica.
func TestConsumeCancelHandsOver(t *testing.T) {
	t.Parallel()
	b1, srv := testnats.Bus(t)
	b2 := testnats.Connect(t, srv.URL(), "test/replica2")
	seq := publish(t, b1, jobRequested("s1", "handover"))
	cfg := bus.ConsumerConfig{Durable: "handover", Subjects: []string{requested}, AckWait: 30 * time.Second}

	inHandler := make(chan struct{})
	var once sync.Once
	first := startConsume(t, b1, cfg, func(ctx context.Context, d bus.Delivery) error {
		once.Do(func() { close(inHandler) })
		<-ctx.Done()
		return ctx.Err()
	})
	select {
	case <-inHandler:
	case <-time.After(testTimeout):
		t.Fatal("first replica never got the message")
	}

	got := make(chan bus.Delivery, 1)
	startConsume(t, b2, cfg, func(_ context.Context, d bus.Delivery) error {
		got <- d
		return nil
	})

	// stop fails the test if Consume does not return (hang guard).
	first.stop(t)
	// AckWait is 30s, so a hand-over within the 10s guard can only come from
	// the nak of the cancelled handler.
	select {
	case d := <-got:
		if d.Event.ID != "handover" || d.NumDelivered != 2 {
			t.Errorf("second replica got %s delivery %d, want handover delivery 2", d.Event.ID, d.NumDelivered)
		}
	case <-time.After(hangGuard):
		t.Fatalf("the message was not handed over to the other replica within %v (AckWait is 30s): the nak must not wait for AckWait", hangGuard)
	}
	waitSettled(t, b2, "handover", seq)
	if b1.DeadLettered()+b2.DeadLettered() != 0 {
		t.Error("a cancelled handler's message was dead-lettered")
	}
}

func TestConsumeDeliverNew(t *testing.T) {
	t.Parallel()
	b, _ := testnats.Bus(t)
	publish(t, b, jobRequested("s1", "old"))
	calls := newCounter()
	startConsume(t, b, bus.ConsumerConfig{Durable: "fresh", Subjects: []string{requested}, DeliverNew: true},
		func(_ context.Context, d bus.Delivery) error {
			calls.add(d.Event.ID)
			return nil
		})
	// Wait until the consumer exists before publishing the new event.
	waitFor(t, testTimeout, "consumer created", func() bool {
		_, err := b.JetStream().Consumer(ctxT(t), bus.DefaultStream, "fresh")
		return err == nil
	})
	seq := publish(t, b, jobRequested("s1", "new"))
	waitSettled(t, b, "fresh", seq)
	if calls.get("old") != 0 || calls.get("new") != 1 {
		t.Errorf("handler saw %v, want only the new event", calls)
	}
}

// MaxDeliver counts deliveries whose worker died (no ack, no nak, the ack
// timer ran out) too. Once they are used up the message must still be
// dead-lettered rather than silently never delivered again.
func TestConsumeDeadLettersAfterCrashedDeliveries(t *testing.T) {
	t.Parallel()
	b, _ := testnats.Bus(t)
	ctx := ctxT(t)
	seq := publish(t, b, jobRequested("s1", "crashy"))
	cfg := bus.ConsumerConfig{Durable: "crashy", Subjects: []string{requested}, AckWait: time.Second, MaxDeliver: 2}

	// Two workers take the message and die without answering.
	cons, err := b.JetStream().CreateOrUpdateConsumer(ctx, bus.DefaultStream, jetstream.ConsumerConfig{
		Durable: cfg.Durable, FilterSubjects: cfg.Subjects, AckPolicy: jetstream.AckExplicitPolicy,
		AckWait: cfg.AckWait, MaxDeliver: cfg.MaxDeliver, MaxAckPending: -1,
	})
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 2; i++ {
		batch, err := cons.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		got := 0
		for m := range batch.Messages() {
			got++
			if meta, _ := m.Metadata(); meta == nil || meta.NumDelivered != uint64(i) {
				t.Fatalf("crashed delivery %d: metadata %+v", i, meta)
			}
		}
		if got != 1 {
			t.Fatalf("crashed delivery %d: got %d messages", i, got)
		}
	}

	// A healthy replica starts: the message must not be lost.
	calls := newCounter()
	startConsume(t, b, cfg, func(_ context.Context, d bus.Delivery) error {
		calls.add(d.Event.ID)
		return nil
	})
	deadline := time.Now().Add(testTimeout)
	for calls.get("crashy") == 0 && dlqCount(t, b, "crashy") == 0 {
		if time.Now().After(deadline) {
			info := consumerInfo(t, b, "crashy")
			t.Fatalf("after MaxDeliver crashed deliveries the message (seq %d) was neither handled nor dead-lettered "+
				"(consumer: delivered %d, ack floor %d, pending acks %d, redelivered %d)",
				seq, info.Delivered.Stream, info.AckFloor.Stream, info.NumAckPending, info.NumRedelivered)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// If the durable disappears (an operator deleted it, a stream restore), a
// running Consume must notice and re-create it rather than go deaf. The
// server removes the old consumer's directory after answering the delete,
// so the re-creation may race with it and fail with "error creating store
// for consumer" (its log names e.g. meta.sum.tmp): Consume must retry that.
// Not parallel: a consumer that busy-loops would disturb timing-sensitive
// tests.
func TestConsumeRecreatesDeletedDurable(t *testing.T) {
	b, srv := testnats.Bus(t)
	handled := make(chan string, 10)
	c := startConsume(t, b, bus.ConsumerConfig{Durable: "phoenix", Subjects: []string{requested}},
		func(_ context.Context, d bus.Delivery) error {
			handled <- d.Event.ID
			return nil
		})
	await := func(id string) {
		t.Helper()
		for {
			select {
			case got := <-handled:
				if got == id {
					return
				}
			case <-c.done:
				t.Fatalf("Consume returned (%v) before %s was handled", c.err, id)
			case <-time.After(testTimeout):
				t.Fatalf("%s was never handled: Consume does not re-create its consumer", id)
			}
		}
	}
	first := publish(t, b, jobRequested("s1", "before"))
	await("before")
	created := waitSettled(t, b, "phoenix", first).Created

	if err := b.JetStream().DeleteConsumer(ctxT(t), bus.DefaultStream, "phoenix"); err != nil {
		t.Fatal(err)
	}
	v0, err := srv.Server().Varz(nil)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, testTimeout, "the durable re-created", func() bool {
		info, err := tryConsumerInfo(t, b, "phoenix")
		return err == nil && info.Created.After(created)
	})
	// Watch the request rate over at least half a second from the deletion
	// (an upper bound: load only lowers it).
	time.Sleep(time.Until(v0.Now.Add(500 * time.Millisecond)))
	v1, err := srv.Server().Varz(nil)
	if err != nil {
		t.Fatal(err)
	}
	if rate := float64(v1.InMsgs-v0.InMsgs) / v1.Now.Sub(v0.Now).Seconds(); rate > 1000 {
		t.Errorf("with its durable gone Consume sends %.0f requests/s to the server (busy loop)", rate)
	}

	publish(t, b, jobRequested("s1", "after"))
	await("after")
}

// TestConsumerSettingsChangeIsLogged: a process that starts a shared
// durable with the settings it already has changes nothing and says
// nothing; one with another ack wait says that it changes them (workers
// sharing a consumer must share its ack wait).
func TestConsumerSettingsChangeIsLogged(t *testing.T) {
	t.Parallel()
	srv := testnats.Server(t)
	consume := func(ackWait time.Duration) string {
		t.Helper()
		var logs testnats.SyncBuffer
		b := testnats.ConnectLogged(t, srv.URL(), "test/consumer", zerolog.New(&logs))
		ctx, cancel := context.WithCancel(ctxT(t))
		done := make(chan error, 1)
		go func() {
			done <- b.Consume(ctx, bus.ConsumerConfig{Durable: "shared", Subjects: []string{requested}, AckWait: ackWait},
				func(context.Context, bus.Delivery) error { return nil })
		}()
		waitFor(t, 10*time.Second, "the consumer", func() bool {
			info, err := tryConsumerInfo(t, b, "shared")
			return err == nil && info.Config.AckWait == ackWait
		})
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("Consume: %v", err)
		}
		return logs.String()
	}
	if log := consume(time.Second); strings.Contains(log, "changes the settings") {
		t.Errorf("creating the consumer logged a change: %s", log)
	}
	if log := consume(time.Second); strings.Contains(log, "changes the settings") {
		t.Errorf("the same settings logged a change: %s", log)
	}
	if log := consume(2 * time.Second); !strings.Contains(log, "changes the settings") {
		t.Errorf("another ack wait was not logged: %s", log)
	}
}
