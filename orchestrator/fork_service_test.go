package orchestrator_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/internal/testnats"
	"github.com/loopbus/loopbus/projections"
	"github.com/loopbus/loopbus/schemas"
)

// TestRunnerDeadLettersCopiesIntoALiveSession: a copy of a fork's history
// (forkof) published into a session that runs, here a forged copy of
// session.failed, is dead-lettered with the reason; the session runs on,
// and its manifest does not fail.
func TestRunnerDeadLettersCopiesIntoALiveSession(t *testing.T) {
	b, _ := testnats.Bus(t)
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	startRunner(t, b, "o1")
	const session = "live"
	start := startSession(t, b, session, twoSteps())
	waitEvents(t, b, session, "job.requested for draft", has(schemas.TypeJobRequested, "draft"))
	forged := schemas.Event{ID: "forged-fail", Type: schemas.TypeSessionFailed, Session: session, ForkOf: "x", Correlation: start.ID, Time: time.Now(),
		Data: &schemas.SessionFailed{Reason: "forged"}}
	if _, err := b.Publish(ctx, forged); err != nil {
		t.Fatal(err)
	}
	var reasons []string
	for len(reasons) == 0 {
		if err := b.DeadLetters(ctx, func(dl bus.DeadLetter) error {
			reasons = append(reasons, dl.Reason)
			return nil
		}); err != nil {
			t.Fatalf("DeadLetters: %v", err)
		}
		if ctx.Err() != nil {
			t.Fatal("the forged copy was not dead-lettered")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if len(reasons) != 1 || !strings.Contains(reasons[0], "copies event x into session live, which exists") {
		t.Errorf("dead letters %q", reasons)
	}
	if m := projections.BuildManifest(session, sessionEvents(t, b, session)); m.Status != projections.StatusRunning {
		t.Errorf("manifest after a forged copy: %s, want running", m.Status)
	}
}
