package client

import (
	"context"
	"fmt"
	"time"

	"github.com/loopbus/loopbus/schemas"
)

// Signaler sends signals one at a time for interactive tools such as the
// live terminal screen, and answers in one line what became of each. It is
// safe for concurrent use when Bus is.
type Signaler struct {
	Bus Bus
	// Wait bounds the wait for the orchestrator's acknowledgement; 0 does
	// not wait (use it when no orchestrator can answer).
	Wait time.Duration
	// Now is the signal's clock; nil means time.Now.
	Now func() time.Time
}

// Signal sends the signal kind (stop, pause, resume, info or invalidate)
// to target, "SESSION" or "SESSION/STEP" ("all" is refused: one session
// at a time). message is an info signal's hint, else the reason (may be
// empty). It resolves the target as `loopbus signal` does, sends the
// signal, waits up to Wait (or until ctx ends) for the acknowledgement and
// returns a short result (SignalResult.String): "pause s1/b: applied —
// step b paused", "stop s1: ignored — session already stopped", or "pause
// s1: recorded at stream sequence 42 — takes effect when the orchestrator
// runs (…)". Errors wrap ErrBadInput for a bad kind, target or message and
// ErrNoSession for an unknown session.
func (s Signaler) Signal(ctx context.Context, kind, target, message string) (string, error) {
	t, err := ParseSignalTarget(target)
	if err != nil {
		return "", err
	}
	if t.All {
		return "", fmt.Errorf("%w: target %q: name one session (SESSION or SESSION/STEP)", ErrBadInput, target)
	}
	req := SignalRequest{Verb: kind, Target: t}
	if schemas.SignalVerb(kind) == "info" {
		req.Message = message
	} else {
		req.Reason = message
	}
	if err := req.Check(); err != nil {
		return "", err
	}
	now := time.Now
	if s.Now != nil {
		now = s.Now
	}
	var last SignalResult
	why := func([]SignalDest) string { return "not waiting for an answer" }
	if s.Wait > 0 {
		why = nil
	}
	err = Report(ctx, s.Bus, req, SignalReport{Wait: s.Wait, NoAnswer: why, Now: now()}, func(r SignalResult) { last = r })
	if err != nil {
		return "", err
	}
	return last.String(), nil
}
