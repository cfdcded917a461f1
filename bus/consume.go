package bus

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/loopbus/loopbus/schemas"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// ErrPermanent marks a Handler error that retrying cannot fix: the message
// is terminated and copied to the dead-letter stream with the error as
// reason. A Handler returns nil to ack, an error wrapping ErrPermanent to
// terminate, Release to hand the message back, or any other error to have
// the message redelivered after a back-off; the context's error after the
// consumer is stopped naks without delay so another replica takes over.
var ErrPermanent = errors.New("permanent failure")

// Release returns a Handler error that hands the message back without
// counting it as a failure: it is redelivered, to this or another replica,
// after delay, and nothing is logged above debug level. JetStream still
// counts the delivery, so it counts toward ConsumerConfig.MaxDeliver.
func Release(delay time.Duration) error { return &releaseError{delay: delay} }

type releaseError struct{ delay time.Duration }

func (e *releaseError) Error() string { return fmt.Sprintf("released for redelivery in %s", e.delay) }

// Delivery is one event handed to a Handler.
type Delivery struct {
	Event schemas.Event
	// NumDelivered is 1 on first delivery.
	NumDelivered uint64
}

// Handler processes one delivery. It may run concurrently with others (see
// ConsumerConfig.Concurrency). While it runs, the bus sends in-progress
// heartbeats, so a handler may take longer than AckWait.
type Handler func(ctx context.Context, d Delivery) error

// ConsumerConfig shapes a durable pull consumer shared by every replica that
// uses the same Durable name.
type ConsumerConfig struct {
	Durable string
	// Subjects filters the event stream (e.g. loopbus.evt.*.job.requested).
	Subjects []string
	// AckWait before an unacknowledged message is redelivered when no
	// heartbeat arrives; 0 means 30s. Heartbeats go every AckWait/3.
	AckWait time.Duration
	// MaxDeliver attempts before the message is dead-lettered; 0 means 5.
	MaxDeliver int
	// Concurrency is the number of handlers running at once; 0 means 1.
	Concurrency int
	// DeliverNew starts a newly created consumer at new events instead of the
	// whole history.
	DeliverNew bool
	// OnReady, if set, is called once the durable consumer exists (events
	// stored from then on reach it, whatever DeliverNew says).
	OnReady func()
	// MaxAckPending bounds the messages delivered and not yet acknowledged;
	// 0 means no bound. 1 keeps stream order even across redeliveries: the
	// next message waits until a crashed handler's times out and comes back.
	MaxAckPending int
}

func (c ConsumerConfig) withDefaults() ConsumerConfig {
	if c.AckWait == 0 {
		c.AckWait = 30 * time.Second
	}
	if c.MaxDeliver == 0 {
		c.MaxDeliver = 5
	}
	if c.Concurrency == 0 {
		c.Concurrency = 1
	}
	return c
}

// Validate reports the first invalid value.
func (c ConsumerConfig) Validate() error {
	if c.Durable == "" || len(c.Subjects) == 0 {
		return fmt.Errorf("%w: consumer needs a durable name and subjects", ErrConfig)
	}
	for _, s := range c.Subjects {
		if !strings.HasPrefix(s, schemas.SubjectPrefix+".") {
			return fmt.Errorf("%w: consumer %s: subject %q is not under %s.>", ErrConfig, c.Durable, s, schemas.SubjectPrefix)
		}
	}
	if c.Concurrency < 0 || c.MaxDeliver < 0 || c.AckWait < 0 {
		return fmt.Errorf("%w: consumer %s: negative setting", ErrConfig, c.Durable)
	}
	return nil
}

// Consume runs h for every message of a durable consumer until ctx ends,
// then waits for running handlers. It pulls only as many messages as it
// has free handler slots, so no message waits in a local buffer while its
// ack timer runs. Malformed events are dead-lettered and terminated without
// reaching h. Ack semantics: see Handler and ErrPermanent; a transiently
// failing message is dead-lettered after MaxDeliver deliveries. If the
// connection is given up (Config.GiveUpAfter) or closed, Consume returns an
// error wrapping ErrConnectionLost (or nats.ErrConnectionClosed).
func (b *Bus) Consume(ctx context.Context, cfg ConsumerConfig, h Handler) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	cfg = cfg.withDefaults()
	if err := b.closedErr(); err != nil {
		return fmt.Errorf("consumer %s: %w", cfg.Durable, err)
	}
	cc := jetstream.ConsumerConfig{
		Durable:        cfg.Durable,
		FilterSubjects: cfg.Subjects,
		AckPolicy:      jetstream.AckExplicitPolicy,
		AckWait:        cfg.AckWait,
		// One more than ours: deliveries that end by ack timeout (a crashed
		// handler) count too, and the last one must reach handle to be
		// dead-lettered rather than dropped by the server.
		MaxDeliver:    cfg.MaxDeliver + 1,
		MaxAckPending: -1,
		Replicas:      0,
	}
	if cfg.DeliverNew {
		cc.DeliverPolicy = jetstream.DeliverNewPolicy
	}
	if cfg.MaxAckPending > 0 {
		cc.MaxAckPending = cfg.MaxAckPending
	}
	cons, err := b.ensureConsumer(ctx, cc)
	if err != nil || cons == nil {
		return err
	}
	if cfg.OnReady != nil {
		cfg.OnReady()
	}
	// lctx also ends when the connection is closed for good; handlers get
	// ctx, whose end means "stop and hand over".
	lctx, lcancel := b.untilClosed(ctx)
	defer lcancel()
	slots := make(chan struct{}, cfg.Concurrency)
	var wg sync.WaitGroup
	defer wg.Wait()
	fails := 0
	for ctx.Err() == nil {
		if err := b.closedErr(); err != nil {
			return fmt.Errorf("consumer %s: %w", cfg.Durable, err)
		}
		// Wait for at least one free slot, then take all free ones.
		select {
		case slots <- struct{}{}:
		case <-lctx.Done():
			continue
		}
		n := 1
	fill:
		for n < cfg.Concurrency {
			select {
			case slots <- struct{}{}:
				n++
			default:
				break fill
			}
		}
		// The fetch context ends the pull as soon as we stop, rather than
		// after its expiry, so shutdown is prompt.
		fctx, fcancel := context.WithTimeout(lctx, 5*time.Second)
		batch, err := cons.Fetch(n, jetstream.FetchContext(fctx))
		if err != nil {
			fcancel()
			for range n {
				<-slots
			}
			if lctx.Err() == nil {
				b.log.Debug().Err(err).Str("consumer", cfg.Durable).Msg("fetch failed; retrying")
				sleep(lctx, backoffDelay(fails))
				fails++
			}
			continue
		}
		got := 0
		msgs := batch.Messages()
		for msg := range msgs {
			got++
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer func() { <-slots }()
				b.handle(ctx, cfg, msg, h)
			}()
		}
		fcancel()
		for range n - got {
			<-slots
		}
		berr := batch.Error()
		if got > 0 || berr == nil {
			fails = 0
		}
		if berr != nil && lctx.Err() == nil && !errors.Is(berr, context.DeadlineExceeded) && !errors.Is(berr, context.Canceled) {
			if errors.Is(berr, nats.ErrNoResponders) || errors.Is(berr, jetstream.ErrConsumerNotFound) || errors.Is(berr, jetstream.ErrConsumerDeleted) {
				// The durable is gone (deleted by an operator?): create it again.
				b.log.Warn().Err(berr).Str("consumer", cfg.Durable).Msg("consumer lost; re-creating it")
				if cons, err = b.ensureConsumer(ctx, cc); err != nil || cons == nil {
					return err
				}
				continue
			}
			b.log.Debug().Err(berr).Str("consumer", cfg.Durable).Msg("pull ended with an error")
			sleep(lctx, backoffDelay(fails))
			fails++
		}
	}
	return nil
}

// ensureConsumer creates or updates a durable, retrying while the server is
// unreachable. A configuration the server refuses or a closed connection
// is returned as an error; (nil, nil) means ctx ended.
func (b *Bus) ensureConsumer(ctx context.Context, cc jetstream.ConsumerConfig) (jetstream.Consumer, error) {
	lctx, cancel := b.untilClosed(ctx)
	defer cancel()
	for attempt := 0; ; attempt++ {
		cons, err := b.js.CreateConsumer(lctx, b.cfg.Stream, cc)
		if errors.Is(err, jetstream.ErrConsumerExists) {
			// Replicas sharing a durable must share its settings: JetStream
			// keeps one ack wait, so a replica whose heartbeats are slower
			// than another's ack wait sees its work handed to others while
			// it still runs it.
			b.log.Warn().Str("consumer", cc.Durable).Dur("ack_wait", cc.AckWait).
				Msg("this process changes the settings of a consumer it shares (after an upgrade, or another --ack-wait): give every process that uses it the same --ack-wait")
			cons, err = b.js.UpdateConsumer(lctx, b.cfg.Stream, cc)
		}
		if err == nil {
			return cons, nil
		}
		if ctx.Err() != nil {
			return nil, nil
		}
		if cerr := b.closedErr(); cerr != nil {
			return nil, fmt.Errorf("consumer %s: %w", cc.Durable, cerr)
		}
		var apiErr *jetstream.APIError
		if errors.As(err, &apiErr) && !consumerRaceOrUnavailable(apiErr) {
			return nil, fmt.Errorf("consumer %s: %w", cc.Durable, err)
		}
		if attempt == 3 {
			b.log.Warn().Err(err).Str("consumer", cc.Durable).Msg("cannot create consumer yet; retrying")
		}
		sleep(lctx, backoffDelay(attempt))
	}
}

// consumerRaceOrUnavailable reports the errors of creating a consumer that
// pass: no JetStream yet (503), and the server still removing a consumer
// of the same name that was just deleted: "consumer does not exist" on the
// update path, "consumer closed", or the old consumer's directory being
// removed under the new one's files. The server logs the file error (e.g.
// renaming meta.sum.tmp: no such file or directory) but answers only
// "error creating store for consumer" (code 500, err_code 10012).
// Everything else is a configuration the server refuses.
func consumerRaceOrUnavailable(e *jetstream.APIError) bool {
	if e.Code == 503 || e.ErrorCode == jetstream.JSErrCodeConsumerDoesNotExist {
		return true
	}
	if e.Code != 500 {
		return false
	}
	d := strings.ToLower(e.Description)
	return strings.Contains(d, "error creating store for consumer") ||
		strings.Contains(d, "consumer closed") ||
		strings.Contains(d, "no such file or directory")
}

func (b *Bus) handle(ctx context.Context, cfg ConsumerConfig, msg jetstream.Msg, h Handler) {
	meta, err := msg.Metadata()
	if err != nil {
		b.log.Error().Err(err).Str("subject", msg.Subject()).Msg("message without metadata; terminating")
		_ = msg.Term()
		return
	}
	if int(meta.NumDelivered) > cfg.MaxDeliver {
		reason := fmt.Sprintf("gave up after %d deliveries: no handler finished it (crashed or stopped)", meta.NumDelivered-1)
		b.deadLetter(ctx, cfg.Durable, msg.Subject(), meta.Sequence.Stream, msg.Headers(), msg.Data(), reason)
		_ = msg.TermWithReason(truncate(reason, 200))
		return
	}
	ev, err := b.decode(msg.Subject(), msg.Headers(), msg.Data(), true)
	if err != nil {
		b.deadLetter(ctx, cfg.Durable, msg.Subject(), meta.Sequence.Stream, msg.Headers(), msg.Data(), err.Error())
		_ = msg.TermWithReason(truncate(err.Error(), 200))
		return
	}
	ev.Seq = meta.Sequence.Stream
	ev.Stored = meta.Timestamp.UTC()

	// Heartbeats keep the message ours while the handler runs.
	hbCtx, stopHB := context.WithCancel(context.Background())
	defer stopHB()
	go func() {
		t := time.NewTicker(cfg.AckWait / 3)
		defer t.Stop()
		for {
			select {
			case <-hbCtx.Done():
				return
			case <-t.C:
				if err := msg.InProgress(); err != nil {
					b.log.Debug().Err(err).Msg("in-progress heartbeat failed")
				}
			}
		}
	}()

	herr := b.contained(ErrPermanent, ev, func() error { return h(ctx, Delivery{Event: ev, NumDelivered: meta.NumDelivered}) })
	stopHB()
	log := b.log.With().Str("consumer", cfg.Durable).Str("type", ev.Type).Str("id", ev.ID).Uint64("seq", ev.Seq).Logger()
	var rel *releaseError
	switch {
	case herr == nil:
		if err := msg.DoubleAck(context.WithoutCancel(ctx)); err != nil {
			log.Warn().Err(err).Msg("ack not confirmed; the event may be delivered again")
		}
	case errors.Is(herr, ErrPermanent):
		log.Error().Err(herr).Msg("event failed permanently; dead-lettered")
		b.deadLetter(ctx, cfg.Durable, msg.Subject(), meta.Sequence.Stream, msg.Headers(), msg.Data(), herr.Error())
		_ = msg.TermWithReason(truncate(herr.Error(), 200))
	case errors.As(herr, &rel) && int(meta.NumDelivered) < cfg.MaxDeliver:
		// On the last delivery a release is dead-lettered below: the
		// server would not deliver it again, so it must not vanish.
		log.Debug().Dur("redeliver_in", rel.delay).Msg("event released")
		_ = msg.NakWithDelay(rel.delay)
	case ctx.Err() != nil:
		_ = msg.Nak()
	case int(meta.NumDelivered) >= cfg.MaxDeliver:
		reason := fmt.Sprintf("gave up after %d deliveries: %v", meta.NumDelivered, herr)
		log.Error().Err(herr).Msg("event keeps failing; dead-lettered")
		b.deadLetter(ctx, cfg.Durable, msg.Subject(), meta.Sequence.Stream, msg.Headers(), msg.Data(), reason)
		_ = msg.TermWithReason(truncate(reason, 200))
	default:
		delay := time.Duration(1<<min(meta.NumDelivered, 6)) * 250 * time.Millisecond
		log.Warn().Err(herr).Dur("retry_in", delay).Msg("event failed; will be redelivered")
		_ = msg.NakWithDelay(delay)
	}
}

// DLQ headers on dead-lettered copies.
const (
	HeaderDLQReason   = "Loopbus-Dlq-Reason"
	HeaderDLQSubject  = "Loopbus-Dlq-Subject"
	HeaderDLQSeq      = "Loopbus-Dlq-Seq"
	HeaderDLQConsumer = "Loopbus-Dlq-Consumer"
	// HeaderDLQSize is set when the copy holds only the first MaxEventBytes
	// bytes of the original: the original's size.
	HeaderDLQSize = "Loopbus-Dlq-Size"
)

// deadLetter copies a message with the reason to loopbus.dlq.<consumer>.<seq>
// (seq: its sequence in the event stream). The dead-letter stream holds at
// most one letter per event: every reader finds a malformed message
// malformed, and a restarted reader meets it again when it re-reads the
// history, so the copy is written only if no loopbus.dlq.*.<seq> exists
// yet. The letter count is thus the number of bad events.
func (b *Bus) deadLetter(ctx context.Context, consumer, subject string, seq uint64, hdr nats.Header, data []byte, reason string) {
	sseq := strconv.FormatUint(seq, 10)
	m := nats.NewMsg(DLQSubjectPrefix + "." + consumer + "." + sseq)
	for k, v := range hdr {
		if len(k) >= 5 && k[:5] == "Nats-" {
			continue
		}
		m.Header[k] = v
	}
	m.Header.Set(HeaderDLQReason, truncate(reason, 2000))
	m.Header.Set(HeaderDLQSubject, subject)
	m.Header.Set(HeaderDLQSeq, sseq)
	m.Header.Set(HeaderDLQConsumer, consumer)
	m.Header.Set(hdrExpectedLastSubjSeq, "0")
	m.Header.Set(hdrExpectedLastSubjSeqSubj, DLQSubjectPrefix+".*."+sseq)
	m.Data = data
	if len(data) > MaxEventBytes {
		// The original may be as large as the server allows; the copy
		// must still fit beside the headers.
		m.Data = data[:MaxEventBytes]
		m.Header.Set(HeaderDLQSize, strconv.Itoa(len(data)))
	}
	log := b.log.With().Str("consumer", consumer).Str("subject", subject).Uint64("seq", seq).Str("reason", reason).Logger()
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	_, err := b.request(dctx, m)
	switch {
	case errors.Is(err, ErrStale):
		log.Debug().Msg("already dead-lettered")
	case err != nil:
		log.Error().Err(err).Msg("could not write dead letter")
	default:
		b.deadLettered.Add(1)
		log.Warn().Msg("dead-lettered")
	}
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// contained calls f, turning a panic into an error wrapping kind, so that
// one event a handler cannot handle (a bug, or hostile content) is
// dead-lettered with the panic as its reason instead of taking the process
// down, again on every restart.
func (b *Bus) contained(kind error, ev schemas.Event, f func() error) (err error) {
	defer b.recovered(kind, &ev, &err)
	return f()
}

// containedRead is contained for a Read callback, without a closure: it
// runs for every event read.
func (b *Bus) containedRead(fn func(schemas.Event) error, ev schemas.Event) (err error) {
	defer b.recovered(ErrMalformed, &ev, &err)
	return fn(ev)
}

// recovered turns a panic into *err (wrapping kind) and logs it.
func (b *Bus) recovered(kind error, ev *schemas.Event, err *error) {
	r := recover()
	if r == nil {
		return
	}
	b.log.Error().Str("session", ev.Session).Str("type", ev.Type).Str("id", ev.ID).Uint64("seq", ev.Seq).
		Str("stack", string(debug.Stack())).Msgf("handling the event panicked: %v", r)
	*err = fmt.Errorf("%w: handling %s %s panicked: %v", kind, ev.Type, ev.ID, r)
}
