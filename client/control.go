package client

import (
	"context"
	"fmt"
	"time"

	"github.com/loopbus/loopbus/schemas"
)

// Published is an event a command wrote to the stream.
type Published struct {
	Event schemas.Event
	// Seq is the stream sequence it was stored at.
	Seq uint64
}

// SetBudget publishes session.budget: each non-zero bound of budget
// replaces the session's (a session its budget stopped resumes when the
// new bound lets it go on; the orchestrator decides). The session must
// exist and not have ended. Errors wrap ErrBadInput, ErrNoSession or
// ErrSessionEnded.
func SetBudget(ctx context.Context, b Bus, session string, budget schemas.Budget, reason string) (Published, error) {
	if budget == (schemas.Budget{}) {
		return Published{}, fmt.Errorf("%w: give at least one of --max-cost-usd, --max-tokens, --max-iterations", ErrBadInput)
	}
	if err := CheckBudget(budget); err != nil {
		return Published{}, err
	}
	return publishControl(ctx, b, session, reason, schemas.TypeSessionBudget, &schemas.SessionBudget{Budget: budget, Reason: reason})
}

// CloseSession publishes session.closed: the session ends for good (the
// orchestrator cancels its running jobs; no signal or budget reopens
// it). The session must exist and not have ended. Errors wrap
// ErrBadInput, ErrNoSession or ErrSessionEnded.
func CloseSession(ctx context.Context, b Bus, session, reason string) (Published, error) {
	return publishControl(ctx, b, session, reason, schemas.TypeSessionClosed, &schemas.SessionClosed{Reason: reason})
}

func publishControl(ctx context.Context, b Bus, session, reason, typ string, data any) (Published, error) {
	if err := checkReason(reason); err != nil {
		return Published{}, err
	}
	m, err := Status(ctx, b, session)
	if err != nil {
		return Published{}, err
	}
	if m.Terminal() {
		return Published{}, fmt.Errorf("%w: %s is %s", ErrSessionEnded, session, m.Status)
	}
	dests, err := ResolveSignalTarget(ctx, b, SignalTarget{Session: session})
	if err != nil {
		return Published{}, err
	}
	ev := schemas.Event{ID: NewSignalID(), Type: typ, Session: session, Correlation: dests[0].StartedID, Time: time.Now().UTC(), Data: data}
	p, err := b.Publish(ctx, ev)
	if err != nil {
		return Published{}, err
	}
	ev.Seq = p.Seq
	return Published{Event: ev, Seq: p.Seq}, nil
}
