package bus_test

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/internal/testnats"
	"github.com/loopbus/loopbus/schemas"
	"github.com/rs/zerolog"
)

// syncBuffer is a bytes.Buffer safe for the logger's concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// A released message comes back after the handler's delay, as often as it
// is released, without a warning and without being dead-lettered.
func TestConsumeRelease(t *testing.T) {
	t.Parallel()
	srv := testnats.Server(t)
	var logs syncBuffer
	b, err := bus.Connect(ctxT(t), bus.Config{URL: srv.URL()}, "test/release", catalogue(t), zerolog.New(&logs).Level(zerolog.WarnLevel))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	seq := publish(t, b, jobRequested("s1", "r1"))

	const delay = 500 * time.Millisecond
	var mu sync.Mutex
	var at []time.Time
	startConsume(t, b, bus.ConsumerConfig{Durable: "releaser", Subjects: []string{requested}, MaxDeliver: 5},
		func(_ context.Context, d bus.Delivery) error {
			mu.Lock()
			defer mu.Unlock()
			at = append(at, time.Now())
			if d.NumDelivered < 3 {
				return bus.Release(delay)
			}
			return nil
		})
	waitSettled(t, b, "releaser", seq)
	mu.Lock()
	defer mu.Unlock()
	if len(at) != 3 {
		t.Fatalf("handled %d times, want 3: released twice, then acked", len(at))
	}
	for i := 1; i < len(at); i++ {
		// A lower bound the server guarantees, not a timing measurement.
		if gap := at[i].Sub(at[i-1]); gap < delay {
			t.Errorf("delivery %d came %v after the release, before the %v asked for", i+1, gap, delay)
		}
	}
	if n := dlqCount(t, b, "releaser"); n != 0 {
		t.Errorf("%d dead letters, want none", n)
	}
	if out := logs.String(); strings.Contains(out, "redelivered") || strings.Contains(out, "warn") {
		t.Errorf("a release logged a warning:\n%s", out)
	}
}

func TestSubjectLastSeq(t *testing.T) {
	t.Parallel()
	b, _ := testnats.Bus(t)
	ctx := ctxT(t)
	cancelled := "loopbus.evt.s1.job.cancelled"
	if seq, err := b.SubjectLastSeq(ctx, cancelled); err != nil || seq != 0 {
		t.Fatalf("SubjectLastSeq on an empty stream = %d, %v; want 0, nil", seq, err)
	}
	first := publish(t, b, jobStarted("s1", "a"))
	second := publish(t, b, jobStarted("s2", "b"))
	publish(t, b, jobRequested("s1", "c"))
	tests := []struct {
		name    string
		subject string
		want    uint64
	}{
		{name: "one subject", subject: "loopbus.evt.s1.job.started", want: first},
		{name: "wildcard", subject: "loopbus.evt.*.job.started", want: second},
		{name: "nothing there", subject: cancelled, want: 0},
		{name: "session", subject: schemas.SessionSubjects("s2"), want: second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := b.SubjectLastSeq(ctx, tt.subject)
			if err != nil || got != tt.want {
				t.Errorf("SubjectLastSeq(%s) = %d, %v; want %d", tt.subject, got, err, tt.want)
			}
		})
	}
}
