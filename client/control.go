package client

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/loopbus/loopbus/projections"
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

// Rerun publishes session.rerun: a completed, failed or stopped pipeline
// session runs again in the same session: step and every step that
// requires it, directly or not (every step when step is ""), and steps
// that had not completed. A running or paused session is refused (it
// wraps ErrBadInput: use signal invalidate or resume), as are a closed
// one (ErrSessionEnded: closed is final), a backlog or loops session and
// an unknown step (ErrBadInput). The orchestrator checks the same.
func Rerun(ctx context.Context, b Bus, session, step, reason string) (Published, error) {
	if err := checkReason(reason); err != nil {
		return Published{}, err
	}
	if step != "" {
		if err := schemas.ValidateStepName(step); err != nil {
			return Published{}, fmt.Errorf("%w: %v", ErrBadInput, err)
		}
	}
	m, err := Status(ctx, b, session)
	if err != nil {
		return Published{}, err
	}
	switch {
	case m.Status == projections.StatusClosed:
		return Published{}, fmt.Errorf("%w: %s was closed for good; nothing reopens it (start a new session)", ErrSessionEnded, session)
	case m.Status == projections.StatusRunning || m.Status == projections.StatusPaused:
		return Published{}, fmt.Errorf("%w: %s is %s; rerun reopens a completed, failed or stopped session (to redo a step of a running one: loopbus signal invalidate %s/STEP)", ErrBadInput, session, m.Status, session)
	case m.Kind != "":
		return Published{}, fmt.Errorf("%w: %s is a %s session; rerun is for pipeline sessions", ErrBadInput, session, m.Kind)
	case step != "" && m.Steps[step] == nil:
		return Published{}, fmt.Errorf("%w: session %s has no step %s (steps: %s)", ErrBadInput, session, step, strings.Join(m.StepOrder, ", "))
	}
	dests, err := ResolveSignalTarget(ctx, b, SignalTarget{Session: session})
	if err != nil {
		return Published{}, err
	}
	ev := schemas.Event{ID: NewSignalID(), Type: schemas.TypeSessionRerun, Session: session, Correlation: dests[0].StartedID, Time: time.Now().UTC(),
		Data: &schemas.SessionRerun{Step: step, Reason: reason}}
	p, err := b.Publish(ctx, ev)
	if err != nil {
		return Published{}, err
	}
	ev.Seq = p.Seq
	return Published{Event: ev, Seq: p.Seq}, nil
}
