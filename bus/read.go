package bus

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
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
	// SkipSchema decodes each event's data into its Go type without
	// checking it against its JSON Schema; every other check of Decode
	// stays (the envelope, size, ids, subject, the signature with a trust
	// file). It is for readers that only show or fold history
	// (projections, status, dashboards, metrics, traces): schemas are
	// checked where events enter, by Encode for every loopbus publisher
	// and again by the consumers that act on events (the orchestrator,
	// validator, workers, hooks), which dead-letter what fails. Such a
	// reader must take any value of the Go type (fuzzed folds); what it
	// trusts is who may publish, as it already does for valid events.
	// Consumers that act on what they read keep the check, so that what
	// they fold from history is what they accepted live.
	SkipSchema bool
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
// A read that waits Config.ReadStall while the stream holds an event it
// has not delivered replaces its consumer with one that starts after the
// last event delivered: the client library's own recovery can wait
// forever, e.g. on a consumer the cluster placed on a node that died.
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
	caughtUp := false
	markCaughtUp := func() {
		if !caughtUp {
			caughtUp = true
			if opts.OnCaughtUp != nil {
				opts.OnCaughtUp()
			}
		}
	}
	// cursor is the stream sequence of the last message handled (delivered
	// or skipped): a replacement consumer starts after it, so fn sees no
	// event twice and none out of order.
	var cursor atomic.Uint64
	// target is the newest event on subjects the stream's leader held when
	// the read started. The server may place a read's consumer on any
	// replica, and a replica may lag (its store is full, say): its
	// consumer then says there is nothing more while the leader holds more.
	// So the read is caught up (and, without Follow, done) only once it is
	// past target. A stream of one replica has none to lag.
	var target uint64
	if b.replicated {
		var err error
		if target, err = b.readTarget(lctx, subjects); err != nil {
			return fail(err)
		}
	}
	reached := func() bool { return cursor.Load() >= target }
	// lagWait is how long a consumer that has delivered all its replica
	// holds, short of target, may take to deliver more before it is
	// replaced by one that may be placed on another replica.
	lagWait := readLagWait
	lagged := 0 // consumers replaced for that
	// Every source has ended and deleted its consumer when Read returns.
	var sources sync.WaitGroup
	defer sources.Wait()
	for replaced := 0; ; replaced++ {
		src, info, err := b.openReadSource(lctx, oc, replaced > 0)
		if err != nil {
			return fail(err)
		}
		if replaced == 0 {
			// The sequence before the first one the consumer delivers,
			// whichever the start option.
			cursor.Store(info.Delivered.Stream)
		}
		// atHead: the consumer has nothing more to deliver from its replica.
		atHead := info.NumPending == 0
		var server string // where the consumer is
		if info.Cluster != nil {
			server = info.Cluster.Leader
		}
		if atHead && reached() {
			markCaughtUp()
			if !opts.Follow {
				src.release()
				return nil
			}
		}
		sctx, scancel := context.WithCancel(lctx)
		next, err := src.start(sctx, &sources)
		if err != nil {
			scancel()
			return fail(err)
		}
		// waiting: since when Read waits for this source's next message, in
		// Unix nanoseconds; 0 while fn runs.
		var waiting atomic.Int64
		stalled := make(chan struct{})
		sources.Add(1)
		go func() {
			defer sources.Done()
			b.watchRead(sctx, subjects, &cursor, &waiting, stalled)
		}()
		stop, lags, err := func() (bool, bool, error) {
			defer scancel()
			for {
				// The replica lags the leader: wait lagWait for it, unless
				// it was found lagging a moment ago.
				var lag *time.Timer
				var lagC <-chan time.Time
				if atHead && !caughtUp && !reached() {
					wait := lagWait
					if b.conn.knownLaggard(server) {
						wait = 0
					}
					lag = time.NewTimer(wait)
					lagC = lag.C
				}
				waiting.Store(time.Now().UnixNano())
				var n readNext
				select {
				case n = <-next:
				case <-lagC:
					owed, err := b.leaderNextSeq(sctx, subjects, cursor.Load())
					if sctx.Err() != nil {
						return true, false, fail(nil)
					}
					if err == nil && (owed == 0 || owed > target) && b.removedBefore(sctx, target) {
						// The leader holds nothing the read still owes
						// (retention removed it): caught up after all.
						target = cursor.Load()
						markCaughtUp()
						if !opts.Follow {
							return true, false, nil
						}
						continue
					}
					return false, true, nil
				case <-stalled:
					return false, false, nil
				case <-sctx.Done():
					return true, false, fail(nil)
				}
				if lag != nil {
					lag.Stop()
				}
				waiting.Store(0)
				if n.err != nil {
					if errors.Is(n.err, jetstream.ErrMsgIteratorClosed) {
						return true, false, fail(nil)
					}
					return true, false, fail(n.err)
				}
				msg := n.msg
				meta, err := msg.Metadata()
				if err != nil {
					continue
				}
				cursor.Store(meta.Sequence.Stream)
				ev, derr := b.decode(msg.Subject(), msg.Headers(), msg.Data(), !opts.SkipSchema)
				if derr == nil {
					ev.Seq = meta.Sequence.Stream
					ev.Stored = meta.Timestamp.UTC()
					if err := b.containedRead(fn, ev); err != nil {
						switch {
						case errors.Is(err, ErrStop):
							return true, false, nil
						case errors.Is(err, ErrMalformed):
							derr = err
						default:
							return true, false, err
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
				atHead = meta.NumPending == 0
				if atHead && reached() {
					markCaughtUp()
					if !opts.Follow {
						return true, false, nil
					}
				}
			}
		}()
		if stop {
			return err
		}
		if lags {
			ev := b.log.Debug()
			if b.conn.markLaggard(server) {
				ev = b.log.Warn()
				lagWait = min(2*lagWait, b.cfg.ReadStall)
			}
			ev.Strs("subjects", subjects).Uint64("after", cursor.Load()).Uint64("leader_holds", target).Str("server", server).
				Msg("read's consumer is on a replica that lags the stream leader; replacing its consumer")
			// The server places the next one: it may pick the same
			// replica again, but not in a tight loop.
			if lagged++; lagged > 2 {
				sleep(lctx, backoffDelay(lagged-3))
			}
		} else {
			b.log.Warn().Strs("subjects", subjects).Uint64("after", cursor.Load()).
				Msg("read stalled with events to deliver; replacing its consumer")
		}
		oc = jetstream.OrderedConsumerConfig{
			FilterSubjects: subjects,
			DeliverPolicy:  jetstream.DeliverByStartSequencePolicy,
			OptStartSeq:    cursor.Load() + 1,
		}
	}
}

// readLagWait is how long a read first waits for a consumer that has
// delivered everything its replica holds while the stream leader holds
// more (a replica applies what the leader commits a moment later),
// before replacing it; doubled on each replacement, up to
// Config.ReadStall.
const readLagWait = 250 * time.Millisecond

// removedBefore reports whether the event stream's leader no longer
// holds seq because retention removed it (its first sequence is past
// seq). A leader that says it holds no event a read still owes, up to a
// target a leader acknowledged, is believed only then: a leader once
// lacked what its predecessor acknowledged (after a cluster with a full
// store on one node lost its quorum and elected again), and a read that
// ended on its word would have missed events. Otherwise the read waits
// for the stream as it waits for a lagging replica.
func (b *Bus) removedBefore(ctx context.Context, seq uint64) bool {
	info, err := b.stream.Info(ctx)
	if err != nil {
		return false
	}
	if info.State.FirstSeq > seq {
		return true
	}
	b.log.Warn().Uint64("first", info.State.FirstSeq).Uint64("last", info.State.LastSeq).Uint64("acknowledged", seq).
		Msg("the event stream's leader lacks events it acknowledged (elected while its store lagged?); the read waits for them")
	return false
}

// readTarget is the newest event on subjects as the event stream's leader
// knows it. It waits while the stream has no leader (leaderLastSeqWaiting).
// A user that may not ask the leader (a permission missing) reads without
// the check: 0, with a warning the first time.
func (b *Bus) readTarget(ctx context.Context, subjects []string) (uint64, error) {
	if _, refused := b.conn.leaderRefused.Load(b.cfg.Stream); refused {
		return 0, nil
	}
	last, err := b.leaderLastSeqWaiting(ctx, subjects, true)
	if errors.Is(err, ErrPermissionDenied) {
		if _, seen := b.conn.leaderRefused.LoadOrStore(b.cfg.Stream, true); !seen {
			b.log.Warn().Err(err).Str("stream", b.cfg.Stream).
				Msg("cannot ask the stream leader how far a read must go: a replica that lags may end reads early (grant the permission)")
		}
		return 0, nil
	}
	return last, err
}

// leaderLastSeqWaiting is leaderLastSeq asked again while the event stream
// has no leader (ErrNoLeader): with Config.AnswerTimeout set (a command),
// until that has passed, then failing with an error wrapping ErrNoAnswer;
// else until ctx ends if wait is set, or not again if not.
func (b *Bus) leaderLastSeqWaiting(ctx context.Context, subjects []string, wait bool) (uint64, error) {
	start := time.Now()
	limit := b.cfg.AnswerTimeout
	for attempt := 0; ; attempt++ {
		last, err := b.leaderLastSeq(ctx, subjects)
		switch {
		case err == nil || ctx.Err() != nil || !errors.Is(err, ErrNoLeader):
			return last, err
		case limit > 0 && time.Since(start) > limit:
			return 0, b.noAnswer("stream "+b.cfg.Stream, time.Since(start), err)
		case limit <= 0 && !wait:
			return 0, err
		}
		if attempt == 0 {
			b.log.Warn().Err(err).Strs("subjects", subjects).Msg("the event stream has no leader to say where its events end; waiting for one")
		}
	}
}

// readSource is one ordered consumer of a Read.
type readSource struct {
	cons    jetstream.Consumer
	release func()
}

// readNext is a message of a readSource, or the error that ended it.
type readNext struct {
	msg jetstream.Msg
	err error
}

// openReadSource creates an ordered consumer for a read and fetches its
// info. A replacement (retry) is retried while the error may pass, until
// ctx ends; so is a first one, unless the server refused the request.
func (b *Bus) openReadSource(ctx context.Context, oc jetstream.OrderedConsumerConfig, retry bool) (*readSource, *jetstream.ConsumerInfo, error) {
	start := time.Now()
	for attempt := 0; ; attempt++ {
		src, info, err := b.tryReadSource(ctx, oc)
		if err == nil {
			return src, info, nil
		}
		if ctx.Err() != nil || !transientAPI(err) || b.closedErr() != nil ||
			(!retry && b.conn.refusedUnderSince("$JS.API.CONSUMER.", start)) {
			return nil, nil, err
		}
		if limit := b.cfg.AnswerTimeout; !retry && limit > 0 && time.Since(start) > limit {
			return nil, nil, b.noAnswer("stream "+b.cfg.Stream, time.Since(start), err)
		}
		// A consumer the cluster placed on a node that is down (and not yet
		// known to be) times out; the next one has a new name and place.
		if attempt%10 == 3 {
			b.log.Warn().Err(err).Msg("cannot create a consumer to read the stream yet; retrying")
		}
		sleep(ctx, backoffDelay(attempt))
	}
}

// readSourceTimeout bounds one attempt to create a read's consumer, so
// that one placed on a dead node is given up for another.
const readSourceTimeout = 10 * time.Second

// tryReadSource makes one attempt at openReadSource's work.
func (b *Bus) tryReadSource(ctx context.Context, oc jetstream.OrderedConsumerConfig) (*readSource, *jetstream.ConsumerInfo, error) {
	ctx, cancel := context.WithTimeout(ctx, readSourceTimeout)
	defer cancel()
	cons, release, err := b.orderedConsumer(ctx, b.cfg.Stream, oc)
	if err != nil {
		return nil, nil, err
	}
	info, err := cons.Info(ctx)
	if err != nil {
		release()
		return nil, nil, err
	}
	return &readSource{cons: cons, release: release}, info, nil
}

// readPull and readAhead bound what a read holds: about
// readPull+readAhead messages (the 512 it always held) besides the one
// its callback has. readPull are pulled from the server into the
// iterator, readAhead taken from it and handed over ahead of the
// callback, and one more may wait to be handed over. Handing each message
// over alone woke a goroutine per message, a cost of its own in a long
// read (the fold of a stream ran 10-20 % slower; docs/PERFORMANCE.md).
const (
	readPull  = 448
	readAhead = 64
)

// start iterates the source's messages in a goroutine, which hands them
// over (in order, up to readAhead ahead of the reader) until ctx ends or
// the iterator fails, then stops the iterator and deletes the consumer.
// The goroutine is counted in wg. Ending ctx abandons the source at once,
// even while the iterator is stuck in the client library's recovery:
// stopping it can take that long. Messages handed over but not read are
// dropped with the source; a replacement starts after the last one read.
func (s *readSource) start(ctx context.Context, wg *sync.WaitGroup) (<-chan readNext, error) {
	it, err := s.cons.Messages(jetstream.PullMaxMessages(readPull))
	if err != nil {
		s.release()
		return nil, err
	}
	next := make(chan readNext, readAhead)
	stopIt := context.AfterFunc(ctx, it.Stop)
	wg.Add(1)
	go func() {
		defer wg.Done()
		// Deferred first, so it runs after the iterator has stopped.
		defer s.release()
		defer it.Stop()
		defer stopIt()
		for {
			msg, err := it.Next()
			select {
			case next <- readNext{msg: msg, err: err}:
			case <-ctx.Done():
				return
			}
			if err != nil {
				return
			}
		}
	}()
	return next, nil
}

// watchRead closes stalled when the read has waited Config.ReadStall for
// its source, and still waits (for the same message) one probe later,
// while the stream holds an event on subjects after cursor. It returns
// when ctx ends.
func (b *Bus) watchRead(ctx context.Context, subjects []string, cursor *atomic.Uint64, waiting *atomic.Int64, stalled chan<- struct{}) {
	t := time.NewTicker(b.cfg.ReadStall / 2)
	defer t.Stop()
	var suspect int64
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		since := waiting.Load()
		if since == 0 || time.Since(time.Unix(0, since)) < b.cfg.ReadStall || !b.holdsAfter(ctx, subjects, cursor.Load()) {
			suspect = 0
			continue
		}
		// Two probes in a row: a healthy consumer would have delivered
		// what the first one found.
		if suspect == since {
			close(stalled)
			return
		}
		suspect = since
	}
}

// holdsAfter reports whether the stream holds an event on subjects after
// seq, as its leader says. An unanswered probe (no stream leader yet, say)
// counts as no.
func (b *Bus) holdsAfter(ctx context.Context, subjects []string, seq uint64) bool {
	for _, subj := range subjects {
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		m, err := b.leaderMsgOnce(pctx, b.cfg.Stream, msgGetRequest{Seq: seq + 1, NextFor: subj})
		cancel()
		if err == nil && m.Sequence > seq {
			return true
		}
	}
	return false
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
