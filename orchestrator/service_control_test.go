package orchestrator_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/internal/testnats"
	"github.com/loopbus/loopbus/orchestrator"
	"github.com/loopbus/loopbus/schemas"
	"github.com/rs/zerolog"
)

// clock is a settable clock for the orchestrator's waits.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time  { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *clock) Set(t time.Time) { c.mu.Lock(); c.now = t; c.mu.Unlock() }

// runWithClock runs an orchestrator with clk and a fast tick until the
// returned stop function is called.
func runWithClock(t *testing.T, b orchestrator.Bus, clk *clock) (stop func()) {
	t.Helper()
	o, err := orchestrator.New(orchestrator.Config{Tick: 20 * time.Millisecond}, b, zerolog.New(newLogSink(t)), clk.Now)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- o.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

func publish(t *testing.T, b *bus.Bus, ev schemas.Event) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	if _, err := b.Publish(ctx, ev); err != nil {
		t.Fatalf("publish %s: %v", ev.Type, err)
	}
}

// TestRunnerRateLimitWaitSurvivesRestart: the wait for a usage limit's
// reset is state, rebuilt from the stream: an orchestrator started during
// the wait retries at the reset time, not before.
func TestRunnerRateLimitWaitSurvivesRestart(t *testing.T) {
	b, _ := testnats.Bus(t)
	t0 := time.Date(2026, 11, 22, 9, 0, 0, 0, time.UTC)
	clk := &clock{now: t0}
	stop := runWithClock(t, b, clk)
	const session = "limited"
	startSession(t, b, session, twoSteps())
	evs := waitEvents(t, b, session, "job.requested for draft", has(schemas.TypeJobRequested, "draft"))
	jr := mustFind(t, evs, schemas.TypeJobRequested, "draft").Data.(*schemas.JobRequested)
	reset := t0.Add(3 * time.Hour)
	publish(t, b, schemas.Event{
		ID: "limited-failure", Type: schemas.TypeJobFailed, Session: session, Step: "draft", Job: jr.JobID, Time: t0,
		Data: &schemas.JobFailed{JobID: jr.JobID, Step: "draft", Iteration: 1, Worker: "w", ExitCode: 1, Error: "usage limit", RateLimited: true, ResetAt: &reset},
	})
	evs = waitEvents(t, b, session, "step.waiting", has(schemas.TypeStepWaiting, "draft"))
	if w := mustFind(t, evs, schemas.TypeStepWaiting, "draft").Data.(*schemas.StepWaiting); !w.Until.Equal(reset) {
		t.Errorf("waiting until %v, want %v", w.Until, reset)
	}
	stop()

	clk.Set(reset.Add(-time.Minute))
	runWithClock(t, b, clk)
	time.Sleep(300 * time.Millisecond) // many ticks before the reset
	if n := countType(sessionEvents(t, b, session), schemas.TypeJobRequested); n != 1 {
		t.Fatalf("%d job.requested before the reset", n)
	}
	clk.Set(reset)
	evs = waitEvents(t, b, session, "the retry", func(evs []schemas.Event) bool { return countType(evs, schemas.TypeJobRequested) == 2 })
	var retry *schemas.JobRequested
	for _, ev := range evs {
		if d, ok := ev.Data.(*schemas.JobRequested); ok && d.Attempt == 2 {
			retry = d
		}
	}
	if retry == nil || retry.Iteration != 1 || len(retry.Feedback) != 0 {
		t.Errorf("retry: %+v", retry)
	}
}

// TestRunnerSignalWhileDown: a signal sent while no orchestrator runs is
// acknowledged and acted on when one starts.
func TestRunnerSignalWhileDown(t *testing.T) {
	b, _ := testnats.Bus(t)
	clk := &clock{now: time.Now()}
	stop := runWithClock(t, b, clk)
	const session = "signalled"
	startSession(t, b, session, twoSteps())
	evs := waitEvents(t, b, session, "job.requested for draft", has(schemas.TypeJobRequested, "draft"))
	stop()
	publish(t, b, schemas.Event{ID: "stop-1", Type: schemas.TypeSignalStop, Session: session, Time: time.Now(),
		Data: &schemas.Signal{Target: session, Reason: "enough"}})
	runWithClock(t, b, clk)
	evs = waitEvents(t, b, session, "signal.acknowledged", has(schemas.TypeSignalAcknowledged, ""))
	ack := mustFind(t, evs, schemas.TypeSignalAcknowledged, "").Data.(*schemas.SignalAcknowledged)
	jr := mustFind(t, evs, schemas.TypeJobRequested, "draft").Data.(*schemas.JobRequested)
	if ack.SignalID != "stop-1" || ack.Result != schemas.SignalApplied || !strings.Contains(ack.Detail, jr.JobID) {
		t.Errorf("ack: %+v", ack)
	}
	if _, ok := find(evs, schemas.TypeJobCancelled, "draft"); !ok {
		t.Errorf("no job.cancelled:\n%s", describe(evs))
	}
	if _, ok := find(evs, schemas.TypeSessionStopped, ""); !ok {
		t.Errorf("no session.stopped:\n%s", describe(evs))
	}
}

func countType(evs []schemas.Event, typ string) int {
	n := 0
	for _, ev := range evs {
		if ev.Type == typ {
			n++
		}
	}
	return n
}
