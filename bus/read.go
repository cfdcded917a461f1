package bus

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/loopbus/loopbus/schemas"
	"github.com/nats-io/nats.go/jetstream"
)

// ReadOptions select events for Read.
type ReadOptions struct {
	// Subjects filter the stream; empty means every event.
	Subjects []string
	// StartSeq starts at this stream sequence; 0 means the first event.
	StartSeq uint64
	// StartTime starts at the first event stored at or after this time.
	StartTime time.Time
	// Follow keeps reading new events until ctx ends. Without it Read stops
	// at the newest matching event that existed when it started.
	Follow bool
	// OnCaughtUp, if set, is called once when Read has delivered every event
	// that existed when it started (immediately if there were none).
	OnCaughtUp func()
	// DeadLetter names the reader when it copies malformed events to the
	// dead-letter stream; empty means malformed events are only logged and
	// skipped (read-only tools must not write).
	DeadLetter string
	// OnSkip, if set, is called for every message skipped (malformed, or
	// rejected by fn with ErrMalformed), with its subject and stream
	// sequence. Writers that guard on a session's
	// last sequence need it: the server counts those messages too.
	OnSkip func(subject string, seq uint64)
}

// ErrStop may be returned by a Read callback to end the read without error.
var ErrStop = errors.New("stop reading")

// Read delivers events in stream order to fn through an ordered (ephemeral,
// flow-controlled, self-healing) consumer, which it deletes when it
// returns. Malformed events are skipped (see
// ReadOptions.DeadLetter), and so are events fn rejects by returning an
// error wrapping ErrMalformed (e.g. a replayed id). It returns nil when ctx
// ends, when fn returns ErrStop, or (without Follow) at the head; any other
// fn error is returned.
// If the connection is given up (Config.GiveUpAfter) or closed, Read
// returns an error wrapping ErrConnectionLost (or nats.ErrConnectionClosed).
func (b *Bus) Read(ctx context.Context, opts ReadOptions, fn func(schemas.Event) error) error {
	subjects := opts.Subjects
	if len(subjects) == 0 {
		subjects = []string{schemas.SubjectPrefix + ".>"}
	}
	if err := b.closedErr(); err != nil {
		return fmt.Errorf("read %v: %w", subjects, err)
	}
	// lctx also ends when the connection is closed for good, so the ordered
	// consumer (which otherwise keeps trying to heal) stops.
	lctx, lcancel := b.untilClosed(ctx)
	defer lcancel()
	fail := func(err error) error {
		if ctx.Err() != nil {
			return nil
		}
		if cerr := b.closedErr(); cerr != nil {
			return fmt.Errorf("read %v: %w", subjects, cerr)
		}
		if err == nil {
			return nil
		}
		return fmt.Errorf("read %v: %w", subjects, err)
	}
	oc := jetstream.OrderedConsumerConfig{FilterSubjects: subjects}
	switch {
	case opts.StartSeq > 0:
		oc.DeliverPolicy = jetstream.DeliverByStartSequencePolicy
		oc.OptStartSeq = opts.StartSeq
	case !opts.StartTime.IsZero():
		oc.DeliverPolicy = jetstream.DeliverByStartTimePolicy
		t := opts.StartTime
		oc.OptStartTime = &t
	}
	cons, release, err := b.orderedConsumer(lctx, b.cfg.Stream, oc)
	if err != nil {
		return fail(err)
	}
	// Deferred first, so it runs after the iterator has stopped.
	defer release()
	info, err := cons.Info(lctx)
	if err != nil {
		return fail(err)
	}
	caughtUp := false
	markCaughtUp := func() {
		if !caughtUp {
			caughtUp = true
			if opts.OnCaughtUp != nil {
				opts.OnCaughtUp()
			}
		}
	}
	if info.NumPending == 0 {
		markCaughtUp()
		if !opts.Follow {
			return nil
		}
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(512))
	if err != nil {
		return fail(err)
	}
	stop := context.AfterFunc(lctx, it.Stop)
	defer stop()
	defer it.Stop()
	for {
		msg, err := it.Next()
		if err != nil {
			if errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				return fail(nil)
			}
			return fail(err)
		}
		meta, err := msg.Metadata()
		if err != nil {
			continue
		}
		ev, derr := b.decode(msg.Subject(), msg.Headers(), msg.Data())
		if derr == nil {
			ev.Seq = meta.Sequence.Stream
			ev.Stored = meta.Timestamp.UTC()
			if err := fn(ev); err != nil {
				switch {
				case errors.Is(err, ErrStop):
					return nil
				case errors.Is(err, ErrMalformed):
					derr = err
				default:
					return err
				}
			}
		}
		if derr != nil {
			if opts.DeadLetter != "" {
				b.deadLetter(ctx, opts.DeadLetter, msg.Subject(), meta.Sequence.Stream, msg.Headers(), msg.Data(), derr.Error())
			} else {
				b.log.Debug().Err(derr).Uint64("seq", meta.Sequence.Stream).Msg("skipping malformed event")
			}
			if opts.OnSkip != nil {
				opts.OnSkip(msg.Subject(), meta.Sequence.Stream)
			}
		}
		if meta.NumPending == 0 {
			markCaughtUp()
			if !opts.Follow {
				return nil
			}
		}
	}
}

// orderedConsumer creates an ordered consumer on stream for one read. The
// returned release deletes its server-side consumer; call it once the
// read's iterator has stopped.
func (b *Bus) orderedConsumer(ctx context.Context, stream string, oc jetstream.OrderedConsumerConfig) (jetstream.Consumer, func(), error) {
	cons, err := b.js.OrderedConsumer(ctx, stream, oc)
	if err != nil {
		return nil, nil, err
	}
	return cons, func() { b.deleteReader(ctx, stream, cons) }, nil
}

// deleteReader deletes the server-side consumer an ordered consumer uses
// now (those it replaced when resetting, it deleted itself). It does not
// wait for a connection that is down: the server drops the consumer once
// inactive then (the client library's inactive threshold, 5 minutes, long
// enough that a reader survives a cluster failover or a slow callback).
func (b *Bus) deleteReader(ctx context.Context, stream string, cons jetstream.Consumer) {
	if !b.nc.IsConnected() {
		return
	}
	info := cons.CachedInfo()
	if info == nil || info.Name == "" {
		return
	}
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := b.js.DeleteConsumer(dctx, stream, info.Name); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
		b.log.Debug().Err(err).Str("stream", stream).Str("consumer", info.Name).
			Msg("could not delete a reader's consumer; the server drops it once inactive")
	}
}
