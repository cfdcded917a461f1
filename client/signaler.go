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
// returns a short result: "pause s1/b: applied — step b paused", "stop
// s1: ignored — session already stopped", or "pause s1: recorded at
// stream sequence 42 — no answer yet; takes effect when the orchestrator
// runs". Errors wrap ErrBadInput for a bad kind, target or message and
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
	if kind == "info" {
		req.Message = message
	} else {
		req.Reason = message
	}
	if err := req.Check(); err != nil {
		return "", err
	}
	dests, err := ResolveSignalTarget(ctx, s.Bus, t)
	if err != nil {
		return "", err
	}
	now := time.Now
	if s.Now != nil {
		now = s.Now
	}
	sent, err := SendSignal(ctx, s.Bus, req, dests, now())
	if err != nil {
		return "", err
	}
	if len(sent) == 0 {
		return "", fmt.Errorf("%s %s: nothing sent", kind, target)
	}
	var ack *schemas.SignalAcknowledged
	if s.Wait > 0 {
		wctx, cancel := context.WithTimeout(ctx, s.Wait)
		acks, err := AwaitSignalAcks(wctx, s.Bus, sent, nil)
		cancel()
		if err != nil {
			return "", err
		}
		ack = acks[sent[0].Event.ID]
	}
	if ack == nil {
		return fmt.Sprintf("%s %s: recorded at stream sequence %d — no answer yet; takes effect when the orchestrator runs", kind, target, sent[0].Seq), nil
	}
	if ack.Detail == "" {
		return fmt.Sprintf("%s %s: %s", kind, target, ack.Result), nil
	}
	return fmt.Sprintf("%s %s: %s — %s", kind, target, ack.Result, ack.Detail), nil
}
