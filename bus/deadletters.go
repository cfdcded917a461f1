package bus

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// DeadLetter is one message copied to the dead-letter stream.
type DeadLetter struct {
	// Seq is the dead letter's own sequence in the dead-letter stream.
	Seq    uint64    `json:"seq"`
	Stored time.Time `json:"stored"`
	// Consumer is the reader that gave up on the message (the first one, if
	// several found it malformed).
	Consumer string `json:"consumer"`
	// Subject and SourceSeq locate the original message in the event stream.
	Subject   string `json:"subject"`
	SourceSeq uint64 `json:"sourceSeq"`
	Reason    string `json:"reason"`
	// Data is the original message body, as published; for an original
	// over MaxEventBytes only its beginning, and Size is its full size.
	Data []byte `json:"data"`
	Size int    `json:"size"`
}

// DeadLetters calls fn for every dead letter, oldest first, until fn returns
// an error (ErrStop ends without error) or the stream's head is reached.
// It only reads.
func (b *Bus) DeadLetters(ctx context.Context, fn func(DeadLetter) error) error {
	if err := b.closedErr(); err != nil {
		return fmt.Errorf("dead letters: %w", err)
	}
	cons, release, err := b.orderedConsumer(ctx, b.cfg.DLQStream, jetstream.OrderedConsumerConfig{})
	if err != nil {
		return fmt.Errorf("dead letters: %w", b.connErr(err))
	}
	// Deferred first, so it runs after the iterator has stopped.
	defer release()
	info, err := cons.Info(ctx)
	if err != nil {
		return fmt.Errorf("dead letters: %w", b.connErr(err))
	}
	if info.NumPending == 0 {
		return nil
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(256))
	if err != nil {
		return fmt.Errorf("dead letters: %w", b.connErr(err))
	}
	defer it.Stop()
	stop := context.AfterFunc(ctx, it.Stop)
	defer stop()
	for {
		msg, err := it.Next()
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("dead letters: %w", b.connErr(err))
		}
		meta, err := msg.Metadata()
		if err != nil {
			return fmt.Errorf("dead letters: %w", err)
		}
		if err := fn(letterOf(msg, meta)); err != nil {
			if errors.Is(err, ErrStop) {
				return nil
			}
			return err
		}
		if meta.NumPending == 0 {
			return nil
		}
	}
}

// letterOf reads a dead letter from its message in the dead-letter stream.
func letterOf(msg jetstream.Msg, meta *jetstream.MsgMetadata) DeadLetter {
	h := msg.Headers()
	src, _ := strconv.ParseUint(h.Get(HeaderDLQSeq), 10, 64)
	size := len(msg.Data())
	if n, err := strconv.Atoi(h.Get(HeaderDLQSize)); err == nil {
		size = n
	}
	return DeadLetter{
		Seq: meta.Sequence.Stream, Stored: meta.Timestamp.UTC(),
		Consumer: h.Get(HeaderDLQConsumer), Subject: h.Get(HeaderDLQSubject), SourceSeq: src,
		Reason: h.Get(HeaderDLQReason), Data: msg.Data(), Size: size,
	}
}

// AwaitDeadLetter returns the dead letter of the event at stream sequence
// seq of the event stream (a reader found it malformed, or refused it):
// at once when there is one, else as soon as one is written. It returns
// ctx's error when ctx ends first. It only reads.
func (b *Bus) AwaitDeadLetter(ctx context.Context, seq uint64) (DeadLetter, error) {
	if err := b.closedErr(); err != nil {
		return DeadLetter{}, fmt.Errorf("dead letter of %d: %w", seq, err)
	}
	lctx, lcancel := b.untilClosed(ctx)
	defer lcancel()
	// The stream holds at most one letter per event (see deadLetter),
	// whichever reader wrote it.
	filter := DLQSubjectPrefix + ".*." + strconv.FormatUint(seq, 10)
	cons, release, err := b.orderedConsumer(lctx, b.cfg.DLQStream, jetstream.OrderedConsumerConfig{FilterSubjects: []string{filter}})
	if err != nil {
		return DeadLetter{}, fmt.Errorf("dead letter of %d: %w", seq, b.connErr(err))
	}
	defer release()
	it, err := cons.Messages(jetstream.PullMaxMessages(1))
	if err != nil {
		return DeadLetter{}, fmt.Errorf("dead letter of %d: %w", seq, b.connErr(err))
	}
	defer it.Stop()
	stop := context.AfterFunc(lctx, it.Stop)
	defer stop()
	msg, err := it.Next()
	if err != nil {
		if ctx.Err() != nil {
			return DeadLetter{}, ctx.Err()
		}
		if cerr := b.closedErr(); cerr != nil {
			return DeadLetter{}, fmt.Errorf("dead letter of %d: %w", seq, cerr)
		}
		return DeadLetter{}, fmt.Errorf("dead letter of %d: %w", seq, b.connErr(err))
	}
	meta, err := msg.Metadata()
	if err != nil {
		return DeadLetter{}, fmt.Errorf("dead letter of %d: %w", seq, err)
	}
	return letterOf(msg, meta), nil
}
