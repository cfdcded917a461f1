package orchestrator

import (
	"context"
	"time"

	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/schemas"
)

// Owed returns the decision the orchestrator owes session at time at:
// what Decide makes from the session's history, folded as the service
// folds it (copies skipped, forks prepared, events Check refuses
// skipped), triggered by its newest event. It is nil when the session
// waits for others (a worker, a verdict, a person), is finished, or has
// no events. It is the service's watchdog's question, for tools that
// look from outside (loopbus doctor): a session owed a decision since
// long before now, with nothing stored since, lost it.
func Owed(session string, read HistoryReader, at time.Time) ([]schemas.Event, error) {
	st := NewState()
	st.Prompts = NewPromptCache()
	if err := foldHistory(st, session, 0, read, 0, nil); err != nil {
		return nil, err
	}
	sess := st.Sessions[session]
	if sess == nil {
		return nil, nil
	}
	return SafeDecide(st, schemas.Event{ID: sess.LastID, Session: session}, at), nil
}

// HistoryOf returns a HistoryReader of the sessions' events on r (the
// bus) until ctx ends. Read ends without an error when ctx does: that is
// an error here, or a history cut short would be taken for the whole.
func HistoryOf(ctx context.Context, r interface {
	Read(ctx context.Context, opts bus.ReadOptions, fn func(schemas.Event) error) error
}) HistoryReader {
	return func(session string, until uint64, fn func(schemas.Event) error) error {
		err := r.Read(ctx, bus.ReadOptions{Subjects: []string{schemas.SessionSubjects(session)}}, func(ev schemas.Event) error {
			if until != 0 && ev.Seq > until {
				return bus.ErrStop
			}
			return fn(ev)
		})
		if err == nil {
			err = ctx.Err()
		}
		return err
	}
}
