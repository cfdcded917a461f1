package bus_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/internal/testnats"
	"github.com/loopbus/loopbus/schemas"
	"github.com/nats-io/nats.go"
)

// readAll runs a Read without Follow and returns the ids and seqs it saw
// and how often OnCaughtUp ran. It fails the test if Read does not return.
func readAll(t *testing.T, b *bus.Bus, opts bus.ReadOptions) (ids []string, seqs []uint64, caughtUp int) {
	t.Helper()
	var n atomic.Int32
	opts.OnCaughtUp = func() { n.Add(1) }
	done := make(chan error, 1)
	go func() {
		done <- b.Read(ctxT(t), opts, func(ev schemas.Event) error {
			ids = append(ids, ev.ID)
			seqs = append(seqs, ev.Seq)
			return nil
		})
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Read: %v", err)
		}
	case <-time.After(testTimeout):
		t.Fatal("Read without Follow did not stop at the head")
	}
	return ids, seqs, int(n.Load())
}

func TestReadStopsAtHead(t *testing.T) {
	t.Parallel()
	b, _ := testnats.Bus(t)

	ids, _, caughtUp := readAll(t, b, bus.ReadOptions{})
	if len(ids) != 0 || caughtUp != 1 {
		t.Errorf("empty stream: read %v, OnCaughtUp %d times; want nothing, once", ids, caughtUp)
	}

	var want []string
	var wantSeqs []uint64
	for i := range 5 {
		id := fmt.Sprintf("e%d", i)
		want = append(want, id)
		wantSeqs = append(wantSeqs, publish(t, b, jobStarted(fmt.Sprintf("s%d", i%2), id)))
	}
	ids, seqs, caughtUp := readAll(t, b, bus.ReadOptions{})
	if !reflect.DeepEqual(ids, want) || !reflect.DeepEqual(seqs, wantSeqs) {
		t.Errorf("read %v at %v, want %v at %v", ids, seqs, want, wantSeqs)
	}
	if caughtUp != 1 {
		t.Errorf("OnCaughtUp ran %d times, want 1", caughtUp)
	}
}

func TestReadFilters(t *testing.T) {
	t.Parallel()
	b, _ := testnats.Bus(t)
	var seqs []uint64
	for i := range 6 {
		seqs = append(seqs, publish(t, b, jobStarted(fmt.Sprintf("s%d", i%2+1), fmt.Sprintf("e%d", i))))
	}
	s, err := b.JetStream().Stream(ctxT(t), bus.DefaultStream)
	if err != nil {
		t.Fatal(err)
	}
	stored, err := s.GetMsg(ctxT(t), seqs[3])
	if err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name string
		opts bus.ReadOptions
		want []string
	}{
		{name: "everything", opts: bus.ReadOptions{}, want: []string{"e0", "e1", "e2", "e3", "e4", "e5"}},
		{name: "one session", opts: bus.ReadOptions{Subjects: []string{schemas.SessionSubjects("s2")}}, want: []string{"e1", "e3", "e5"}},
		{name: "two subjects", opts: bus.ReadOptions{Subjects: []string{"loopbus.evt.s1.job.started", "loopbus.evt.s2.job.started"}}, want: []string{"e0", "e1", "e2", "e3", "e4", "e5"}},
		{name: "unknown session", opts: bus.ReadOptions{Subjects: []string{schemas.SessionSubjects("nobody")}}, want: nil},
		{name: "start seq", opts: bus.ReadOptions{StartSeq: seqs[4]}, want: []string{"e4", "e5"}},
		{name: "start seq and session", opts: bus.ReadOptions{StartSeq: seqs[2], Subjects: []string{schemas.SessionSubjects("s1")}}, want: []string{"e2", "e4"}},
		{name: "start seq past the head", opts: bus.ReadOptions{StartSeq: seqs[5] + 10}, want: nil},
		{name: "start time", opts: bus.ReadOptions{StartTime: stored.Time}, want: []string{"e3", "e4", "e5"}},
		{name: "start time in the future", opts: bus.ReadOptions{StartTime: time.Now().Add(time.Hour)}, want: nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ids, _, caughtUp := readAll(t, b, tt.opts)
			if !reflect.DeepEqual(ids, tt.want) {
				t.Errorf("read %v, want %v", ids, tt.want)
			}
			if caughtUp != 1 {
				t.Errorf("OnCaughtUp ran %d times, want 1", caughtUp)
			}
		})
	}
}

func TestReadFollow(t *testing.T) {
	t.Parallel()
	b, _ := testnats.Bus(t)
	publish(t, b, jobStarted("s1", "old"))

	ctx, cancel := context.WithCancel(ctxT(t))
	defer cancel()
	var mu sync.Mutex
	var ids []string
	caughtUp := make(chan struct{})
	var caughtUpCalls atomic.Int32
	done := make(chan error, 1)
	go func() {
		done <- b.Read(ctx, bus.ReadOptions{
			Follow:     true,
			Subjects:   []string{schemas.SessionSubjects("s1")},
			OnCaughtUp: func() { caughtUpCalls.Add(1); close(caughtUp) },
		}, func(ev schemas.Event) error {
			mu.Lock()
			defer mu.Unlock()
			ids = append(ids, ev.ID)
			return nil
		})
	}()
	select {
	case <-caughtUp:
	case <-time.After(testTimeout):
		t.Fatal("OnCaughtUp never ran")
	}
	publish(t, b, jobStarted("s2", "elsewhere"))
	publish(t, b, jobStarted("s1", "new1"))
	publish(t, b, jobStarted("s1", "new2"))
	waitFor(t, testTimeout, "the followed events", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(ids) == 3
	})
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Read after cancel = %v, want nil", err)
		}
	case <-time.After(testTimeout):
		t.Fatal("Read with Follow did not return after cancel")
	}
	mu.Lock()
	defer mu.Unlock()
	if want := []string{"old", "new1", "new2"}; !reflect.DeepEqual(ids, want) {
		t.Errorf("followed %v, want %v", ids, want)
	}
	if n := caughtUpCalls.Load(); n != 1 {
		t.Errorf("OnCaughtUp ran %d times, want 1", n)
	}
}

func TestReadFollowEmpty(t *testing.T) {
	t.Parallel()
	b, _ := testnats.Bus(t)
	ctx, cancel := context.WithCancel(ctxT(t))
	defer cancel()
	caughtUp := make(chan struct{})
	got := make(chan string, 1)
	done := make(chan error, 1)
	go func() {
		done <- b.Read(ctx, bus.ReadOptions{Follow: true, OnCaughtUp: func() { close(caughtUp) }},
			func(ev schemas.Event) error { got <- ev.ID; return bus.ErrStop })
	}()
	select {
	case <-caughtUp:
	case <-time.After(testTimeout):
		t.Fatal("OnCaughtUp not called on an empty stream")
	}
	publish(t, b, jobStarted("s1", "first"))
	select {
	case id := <-got:
		if id != "first" {
			t.Errorf("read %q", id)
		}
	case <-time.After(testTimeout):
		t.Fatal("Follow did not deliver an event published later")
	}
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Read after ErrStop = %v, want nil", err)
		}
	case <-time.After(testTimeout):
		t.Fatal("Read did not end on ErrStop")
	}
}

func TestReadCallbackErrors(t *testing.T) {
	t.Parallel()
	b, _ := testnats.Bus(t)
	for i := range 4 {
		publish(t, b, jobStarted("s1", fmt.Sprintf("e%d", i)))
	}
	boom := errors.New("boom")
	tests := []struct {
		name      string
		ret       error
		wantErr   error
		wantCalls int
	}{
		{name: "ErrStop ends without error", ret: bus.ErrStop, wantCalls: 2},
		{name: "wrapped ErrStop ends without error", ret: fmt.Errorf("done: %w", bus.ErrStop), wantCalls: 2},
		{name: "other error is returned", ret: boom, wantErr: boom, wantCalls: 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			calls := 0
			err := b.Read(ctxT(t), bus.ReadOptions{Follow: true}, func(ev schemas.Event) error {
				calls++
				if calls == 2 {
					return tt.ret
				}
				return nil
			})
			if !errors.Is(err, tt.wantErr) || (tt.wantErr == nil && err != nil) {
				t.Errorf("Read = %v, want %v", err, tt.wantErr)
			}
			if calls != tt.wantCalls {
				t.Errorf("callback ran %d times, want %d", calls, tt.wantCalls)
			}
		})
	}
}

func TestReadSkipsMalformed(t *testing.T) {
	t.Parallel()
	b, _ := testnats.Bus(t)
	publish(t, b, jobStarted("s1", "e1"))
	firstBad := publishRaw(t, b, "loopbus.evt.s1.job.requested", []byte("not an event"))
	publish(t, b, jobStarted("s1", "e2"))
	lastBad := publishRaw(t, b, "loopbus.evt.s1.job.started", []byte(`{"specversion":"0.3"}`)) // malformed last event

	tests := []struct {
		name        string
		deadLetter  string
		wantLetters uint64
	}{
		{name: "read-only reader only skips", deadLetter: "", wantLetters: 0},
		{name: "named reader dead-letters", deadLetter: "projector", wantLetters: 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := b.DeadLettered()
			var skipped []string
			ids, _, caughtUp := readAll(t, b, bus.ReadOptions{
				DeadLetter: tt.deadLetter,
				OnSkip:     func(subject string, seq uint64) { skipped = append(skipped, fmt.Sprintf("%s@%d", subject, seq)) },
			})
			wantSkipped := []string{
				fmt.Sprintf("loopbus.evt.s1.job.requested@%d", firstBad),
				fmt.Sprintf("loopbus.evt.s1.job.started@%d", lastBad),
			}
			if !reflect.DeepEqual(skipped, wantSkipped) {
				t.Errorf("OnSkip saw %v, want %v", skipped, wantSkipped)
			}
			if want := []string{"e1", "e2"}; !reflect.DeepEqual(ids, want) {
				t.Errorf("read %v, want %v", ids, want)
			}
			if caughtUp != 1 {
				t.Errorf("OnCaughtUp ran %d times, want 1", caughtUp)
			}
			if got := uint64(b.DeadLettered() - before); got != tt.wantLetters {
				t.Errorf("DeadLettered grew by %d, want %d", got, tt.wantLetters)
			}
			if tt.deadLetter != "" {
				if n := dlqCount(t, b, tt.deadLetter); n != tt.wantLetters {
					t.Errorf("%d dead letters for %s, want %d", n, tt.deadLetter, tt.wantLetters)
				}
			}
		})
	}
	if st := streamState(t, b, bus.DefaultDLQStream); st.Msgs != 2 {
		t.Errorf("DLQ holds %d messages, want only the named reader's 2", st.Msgs)
	}
	// Reading again with the same name stores no second copy.
	readAll(t, b, bus.ReadOptions{DeadLetter: "projector"})
	if n := dlqCount(t, b, "projector"); n != 2 {
		t.Errorf("after a second read the DLQ holds %d copies, want 2 (de-duplicated)", n)
	}
	m := waitDeadLetter(t, b, "projector")
	if got := m.Header.Get(bus.HeaderDLQSeq); got != fmt.Sprint(lastBad) {
		t.Errorf("newest dead letter is of seq %s, want %d", got, lastBad)
	}
}

// TestReadCallbackRejects: an event fn rejects with ErrMalformed (e.g. a
// replayed id) is skipped like a malformed one: dead-lettered with fn's
// reason and reported through OnSkip, and reading goes on.
func TestReadCallbackRejects(t *testing.T) {
	t.Parallel()
	b, _ := testnats.Bus(t)
	publish(t, b, jobStarted("s1", "e1"))
	replay := publish(t, b, jobStarted("s1", "e2"))
	publish(t, b, jobStarted("s1", "e3"))
	var skipped []uint64
	var got []string
	err := b.Read(ctxT(t), bus.ReadOptions{
		DeadLetter: "orchestrator",
		OnSkip:     func(_ string, seq uint64) { skipped = append(skipped, seq) },
	}, func(ev schemas.Event) error {
		if ev.ID == "e2" {
			return fmt.Errorf("%w: replayed id e2", bus.ErrMalformed)
		}
		got = append(got, ev.ID)
		return nil
	})
	if err != nil {
		t.Fatalf("Read = %v, want nil", err)
	}
	if want := []string{"e1", "e3"}; !reflect.DeepEqual(got, want) {
		t.Errorf("accepted %v, want %v", got, want)
	}
	if want := []uint64{replay}; !reflect.DeepEqual(skipped, want) {
		t.Errorf("OnSkip saw %v, want %v", skipped, want)
	}
	m := waitDeadLetter(t, b, "orchestrator")
	if r := m.Header.Get(bus.HeaderDLQReason); !strings.Contains(r, "replayed id e2") {
		t.Errorf("reason %q, want the callback's", r)
	}
}

// TestMalformedIsDeadLetteredOnce: every reader finds a malformed message
// malformed; the dead-letter stream keeps one copy, so its count is the
// number of bad messages, not bad messages times readers.
func TestMalformedIsDeadLetteredOnce(t *testing.T) {
	t.Parallel()
	b, _ := testnats.Bus(t)
	bad := publishRaw(t, b, "loopbus.evt.s1.job.requested", []byte("garbage"))
	publish(t, b, jobStarted("s1", "e1"))
	for _, reader := range []string{"orchestrator", "projector", "orchestrator-2"} {
		readAll(t, b, bus.ReadOptions{DeadLetter: reader})
	}
	var letters []bus.DeadLetter
	if err := b.DeadLetters(ctxT(t), func(dl bus.DeadLetter) error {
		letters = append(letters, dl)
		return nil
	}); err != nil {
		t.Fatalf("DeadLetters: %v", err)
	}
	if len(letters) != 1 {
		t.Fatalf("%d dead letters, want 1: %+v", len(letters), letters)
	}
	dl := letters[0]
	if dl.Consumer != "orchestrator" || dl.SourceSeq != bad || dl.Subject != "loopbus.evt.s1.job.requested" ||
		string(dl.Data) != "garbage" || !strings.Contains(dl.Reason, "not JSON") {
		t.Errorf("dead letter %+v", dl)
	}
}

func TestDeadLettersEmpty(t *testing.T) {
	t.Parallel()
	b, _ := testnats.Bus(t)
	calls := 0
	if err := b.DeadLetters(ctxT(t), func(bus.DeadLetter) error { calls++; return nil }); err != nil || calls != 0 {
		t.Errorf("DeadLetters on an empty stream: %d calls, %v", calls, err)
	}
}

// TestReadSkipSchema: an event whose envelope is sound but whose data
// fails its schema (delivery 0, worker missing) is skipped by a checking
// reader and delivered, as its Go value, to one that skips the schema;
// a broken envelope is skipped by both.
func TestReadSkipSchema(t *testing.T) {
	t.Parallel()
	b, _ := testnats.Bus(t)
	ev := jobStarted("s1", "e1")
	off := mutated(t, b, ev, func(m map[string]any) { m["data"] = map[string]any{"jobId": "j", "delivery": 0} })
	seq := publishRawID(t, b, "loopbus.evt.s1.job.started", ev.ID, off)
	publishRawID(t, b, "loopbus.evt.s1.job.started", "e2", []byte(`{"specversion":"1.0",`))
	publish(t, b, jobStarted("s1", "e3"))

	var skipped []uint64
	ids, _, _ := readAll(t, b, bus.ReadOptions{OnSkip: func(_ string, s uint64) { skipped = append(skipped, s) }})
	if !reflect.DeepEqual(ids, []string{"e3"}) || len(skipped) != 2 || skipped[0] != seq {
		t.Errorf("checking reader: delivered %v, skipped %v; want e3 only, %d and the next skipped", ids, skipped, seq)
	}
	var got []schemas.Event
	err := b.Read(ctxT(t), bus.ReadOptions{SkipSchema: true}, func(ev schemas.Event) error {
		got = append(got, ev)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].ID != "e1" || got[1].ID != "e3" {
		t.Fatalf("SkipSchema reader delivered %+v, want e1 and e3", got)
	}
	if d, ok := got[0].Data.(*schemas.JobStarted); !ok || d.JobID != "j" || d.Delivery != 0 || d.Worker != "" {
		t.Errorf("SkipSchema reader decoded %#v", got[0].Data)
	}
}

// publishRawID stores data on subject as it is, with id as de-duplication id.
func publishRawID(t *testing.T, b *bus.Bus, subject, id string, data []byte) uint64 {
	t.Helper()
	m := nats.NewMsg(subject)
	m.Header.Set(nats.MsgIdHdr, id)
	m.Data = data
	ack, err := b.JetStream().PublishMsg(ctxT(t), m)
	if err != nil {
		t.Fatal(err)
	}
	return ack.Sequence
}
