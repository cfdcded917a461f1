package bus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/loopbus/loopbus/schemas"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
)

// Publish errors callers act on.
var (
	// ErrStale: the session gained events after the sequence the publisher
	// expected, so nothing was written. Deciders re-read and decide again.
	ErrStale = errors.New("stale: session has newer events")
	// ErrDuplicate: an event id in the batch is already in the stream (within
	// the de-duplication window), so the batch was written before; nothing
	// new was written.
	ErrDuplicate = errors.New("duplicate event id")
	// ErrRejected: the server refused the publish for another reason.
	ErrRejected = errors.New("publish rejected")
)

// JetStream API error codes mapped above.
const (
	codeWrongLastSeq      = 10071
	codeWrongLastSeqConst = 10164
	codeBatchDuplicate    = 10201
	// codeMsgIDInProcess: a message of the same id is being replicated
	// (an earlier attempt of this very publish): retried, it is stored
	// or recognised as a duplicate once that attempt settles.
	codeMsgIDInProcess = 10158
)

// errMsgIDInProcess: the server is still replicating an earlier attempt of
// the same message (codeMsgIDInProcess); the publish is retried.
var errMsgIDInProcess = errors.New("a message with the same id is being stored")

// StaleError is the server's refusal of a write guarded on a session's
// newest event (see PublishExpect); it wraps ErrStale. Last is the
// sequence of the session's newest event as the server saw it, when the
// server said (Known).
//
// On a replicated stream the leader checks the guard against the events
// it has applied, which can be fewer than a reader has already been
// given: a follower (where the reader's consumer may be placed) can
// apply an event before the leader does, and the leader answers a
// publish before it forgets the guard of the event it has just applied
// (the refusal then names no sequence). Either refusal is a moment's:
// the bus retries it for up to staleRetryFor (see Bus.unsettled), and
// returns it only after that.
type StaleError struct {
	Last   uint64
	Known  bool
	Reason string
}

func (e *StaleError) Error() string { return fmt.Sprintf("%v (%s)", ErrStale, e.Reason) }

// Unwrap returns ErrStale.
func (e *StaleError) Unwrap() error { return ErrStale }

// staleError makes a StaleError of the server's description of a
// refused guard, "wrong last sequence[: N]".
func staleError(desc string) *StaleError {
	e := &StaleError{Reason: desc}
	if _, n, ok := strings.Cut(desc, "wrong last sequence: "); ok {
		if last, err := strconv.ParseUint(strings.TrimSpace(n), 10, 64); err == nil {
			e.Last, e.Known = last, true
		}
	}
	return e
}

// staleRetryFor bounds how long a guarded publish refused by a leader
// that has not yet applied the event it is guarded on is retried (see
// StaleError). It takes a millisecond on a healthy cluster, longer just
// after a leader change; a refusal that lasts longer is returned.
const staleRetryFor = 10 * time.Second

// hdrExpectedLastSubjSeq guards a write on the newest event on a subject
// (hdrExpectedLastSubjSeqSubj, when set) being at a sequence.
const (
	hdrExpectedLastSubjSeq     = "Nats-Expected-Last-Subject-Sequence"
	hdrExpectedLastSubjSeqSubj = "Nats-Expected-Last-Subject-Sequence-Subject"
)

// unsettled reports whether err, the refusal of guard's expected last
// sequence, may only mean that the stream's leader has not applied yet
// what the publisher read (see StaleError), so that the publish is worth
// retrying: the stream is replicated, the refusal names no sequence or
// one before the expected one, and staleRetryFor has not passed since
// start. On a stream of one replica every refusal is final.
func (b *Bus) unsettled(err error, guard *nats.Msg, start time.Time) bool {
	var se *StaleError
	if !errors.As(err, &se) || guard == nil || time.Since(start) >= staleRetryFor ||
		(!b.replicated && b.nc.ConnectedClusterName() == "") {
		return false
	}
	if !se.Known {
		return true
	}
	expect, perr := strconv.ParseUint(guard.Header.Get(hdrExpectedLastSubjSeq), 10, 64)
	return perr == nil && se.Last < expect
}

// Published is the outcome of a publish.
type Published struct {
	// Seq is the stream sequence of the (last) event written.
	Seq uint64
	// Duplicate is true when the server recognised the id and stored nothing.
	Duplicate bool
}

type pubAck struct {
	Stream    string `json:"stream"`
	Seq       uint64 `json:"seq"`
	Duplicate bool   `json:"duplicate"`
	Error     *struct {
		Code        int    `json:"code"`
		ErrCode     int    `json:"err_code"`
		Description string `json:"description"`
	} `json:"error"`
}

// Publish writes one event. A re-publish of an id already stored inside the
// duplicate window is not an error: it reports Duplicate. It retries while
// the server is unreachable, until ctx ends or the connection is given up
// (then the error wraps ErrConnectionLost).
func (b *Bus) Publish(ctx context.Context, ev schemas.Event) (Published, error) {
	m, err := b.Encode(ev)
	if err != nil {
		return Published{}, err
	}
	return b.request(ctx, m)
}

// PublishExpect writes one event only if the session's newest event is at
// stream sequence expectLast (0: the session has no events yet). A
// mismatch returns an error wrapping ErrStale.
func (b *Bus) PublishExpect(ctx context.Context, ev schemas.Event, expectLast uint64) (Published, error) {
	m, err := b.Encode(ev)
	if err != nil {
		return Published{}, err
	}
	expectLastOfSession(m, ev.Session, expectLast)
	return b.request(ctx, m)
}

// expectLastOfSession makes m's write conditional on the newest event of
// session being at stream sequence last (0: the session has none).
func expectLastOfSession(m *nats.Msg, session string, last uint64) {
	m.Header.Set(hdrExpectedLastSubjSeq, strconv.FormatUint(last, 10))
	m.Header.Set(hdrExpectedLastSubjSeqSubj, schemas.SessionSubjects(session))
}

// PublishChain writes evs, all of one session, in order, each only if the
// session's newest event is the one written just before it (the first:
// at expectLast), so no other event can come between them. An event whose
// id is already stored (within the de-duplication window) is skipped: it
// was written by an earlier attempt at the same chain, which this one
// completes. Unlike PublishBatch it is not atomic: it stops at the first
// event refused (ErrStale) or failed, having written the events before
// it. Published.Seq is the sequence of the last event written, with an
// error too; when every event was already stored, nothing is written and
// the error wraps ErrDuplicate. It is for writers that make the rest of a
// chain again from what was written, as the orchestrator's
// level-triggered decisions are made again from the session's events.
//
// On a server outside a cluster, with a stream of one replica, the events
// go out together, without a round trip each (elsewhere one at a time,
// each guarded on the session's last event being the one before it, see
// chainsTogether): every one after the first is guarded on the stream's
// last message being the one before it. One that another writer's
// message came in front of is refused by that guard and written again
// once the one before it is acknowledged, guarded as above. The guard
// also holds for a copy stored earlier of the one before: an event right
// after such a copy is written even if an event before them in evs was
// refused, which only a chain that orders events stored before
// differently from their first attempt can meet; Published.Seq then
// names it. An atomic batch costs the server a staging store of its
// own, synced to disk; a chain, no more than its messages.
func (b *Bus) PublishChain(ctx context.Context, session string, expectLast uint64, evs []schemas.Event) (Published, error) {
	// Every event is encoded (and checked) before the first is written:
	// an event that cannot be written does not leave the others half done.
	msgs := make([]*nats.Msg, len(evs))
	for i, ev := range evs {
		if ev.Session != session {
			return Published{}, fmt.Errorf("chain for session %s holds an event of session %s", session, ev.Session)
		}
		m, err := b.Encode(ev)
		if err != nil {
			return Published{}, err
		}
		msgs[i] = m
	}
	var sent []jetstream.PubAckFuture
	if len(msgs) > 1 && b.chainsTogether() {
		for i, m := range msgs {
			if i == 0 {
				expectLastOfSession(m, session, expectLast)
			} else {
				m.Header.Set(hdrExpectedLastMsgID, evs[i-1].ID)
			}
			f, err := b.eventsJS.PublishMsgAsync(m)
			if err != nil {
				break // the rest one by one
			}
			sent = append(sent, f)
		}
	}
	var res Published
	written := false
	for i, m := range msgs {
		var p Published
		var err error
		stored := false
		if i < len(sent) {
			p, err = b.waitAck(ctx, m, sent[i])
			if (i == 0 && errors.Is(err, ErrStale)) || (err != nil && ctx.Err() != nil) {
				return b.drainChained(ctx, msgs, sent, i+1, res), err
			}
			stored = err == nil
		}
		if !stored {
			// Not written with the others: on its own, guarded on what
			// was written before it.
			m.Header.Del(hdrExpectedLastMsgID)
			expectLastOfSession(m, session, expectLast)
			if p, err = b.request(ctx, m); err != nil {
				return b.drainChained(ctx, msgs, sent, i+1, res), err
			}
		}
		if p.Duplicate {
			continue // the session's newest event is still expectLast
		}
		res.Seq, expectLast, written = p.Seq, p.Seq, true
	}
	if !written {
		return res, fmt.Errorf("%w (%s…): every event of the chain was stored before", ErrDuplicate, evs[0].ID)
	}
	return res, nil
}

// drainChained waits for the acknowledgements of the chain's events sent
// with the others from index from on, after the chain stopped before
// them, so that res names the last one written all the same (see
// PublishChain for when one is).
func (b *Bus) drainChained(ctx context.Context, msgs []*nats.Msg, sent []jetstream.PubAckFuture, from int, res Published) Published {
	for j := from; j < len(sent); j++ {
		if p, err := b.waitAck(ctx, msgs[j], sent[j]); err == nil && !p.Duplicate && p.Seq > res.Seq {
			res.Seq = p.Seq
		}
	}
	return res
}

// chainsTogether reports whether PublishChain may send a chain's events
// together, guarded by hdrExpectedLastMsgID: only to a stream of one
// replica on a server outside a cluster. A replicated stream checks that
// guard only as each replica applies the message, and a refusal there
// stops the replica for good (nats-server reports a critical write error
// and the stream loses its quorum); a cluster may replicate a stream of
// one replica later.
func (b *Bus) chainsTogether() bool {
	return !b.replicated && b.nc.ConnectedClusterName() == ""
}

// hdrExpectedLastMsgID makes a write conditional on the stream's last
// message having the given id.
const hdrExpectedLastMsgID = "Nats-Expected-Last-Msg-Id"

// waitAck waits for the acknowledgement of m, an event sent without a
// wait. A refusal of a guard gives ErrStale; any other failure (another
// refusal, no acknowledgement in time) is returned as it is, for the
// caller to publish m again; so are the ends of ctx and of the connection.
func (b *Bus) waitAck(ctx context.Context, m *nats.Msg, f jetstream.PubAckFuture) (Published, error) {
	select {
	case ack := <-f.Ok():
		return Published{Seq: ack.Sequence, Duplicate: ack.Duplicate}, nil
	case err := <-f.Err():
		var apiErr *jetstream.APIError
		if errors.As(err, &apiErr) && (apiErr.ErrorCode == codeWrongLastSeq || apiErr.ErrorCode == codeWrongLastSeqConst) {
			return Published{}, staleError(apiErr.Description)
		}
		return Published{}, err
	case <-ctx.Done():
		return Published{}, fmt.Errorf("publish %s: %w", m.Subject, ctx.Err())
	case <-b.conn.closed:
		return Published{}, fmt.Errorf("publish %s: %w", m.Subject, b.closedErr())
	}
}

// PublishBatch commits evs, all of one session, atomically (all or none)
// and only if the session's newest event is at expectLast. The events'
// ids de-duplicate: if any was already stored the whole batch is refused
// with ErrDuplicate. A stale expectation gives ErrStale.
func (b *Bus) PublishBatch(ctx context.Context, session string, expectLast uint64, evs []schemas.Event) (Published, error) {
	if len(evs) == 0 {
		return Published{}, nil
	}
	msgs := make([]*nats.Msg, len(evs))
	for i, ev := range evs {
		if ev.Session != session {
			return Published{}, fmt.Errorf("batch for session %s holds an event of session %s", session, ev.Session)
		}
		m, err := b.Encode(ev)
		if err != nil {
			return Published{}, err
		}
		msgs[i] = m
	}
	if len(msgs) == 1 {
		expectLastOfSession(msgs[0], session, expectLast)
		res, err := b.request(ctx, msgs[0])
		if err == nil && res.Duplicate {
			return res, fmt.Errorf("%w (%s)", ErrDuplicate, evs[0].ID)
		}
		return res, err
	}
	start := time.Now()
	for attempt := 0; ; attempt++ {
		id := nuid.Next()
		for i, m := range msgs {
			m.Header.Set("Nats-Batch-Id", id)
			m.Header.Set("Nats-Batch-Sequence", strconv.Itoa(i+1))
			if i == 0 {
				expectLastOfSession(m, session, expectLast)
			}
		}
		last := msgs[len(msgs)-1]
		last.Header.Set("Nats-Batch-Commit", "1")
		var err error
		for _, m := range msgs[:len(msgs)-1] {
			if err = b.nc.PublishMsg(m); err != nil {
				break
			}
		}
		var res Published
		if err == nil {
			res, err = b.requestOnce(ctx, last)
		}
		if err == nil || !retryable(err) && !b.unsettled(err, msgs[0], start) {
			return res, b.connErr(err)
		}
		if b.conn.refusedSince(last.Subject, start) {
			return Published{}, fmt.Errorf("publish %s: %w (the user lacks the permission to publish there)", last.Subject, ErrPermissionDenied)
		}
		// A lost commit is retried under a new batch id; if the first
		// attempt did land, the event ids make the retry ErrDuplicate.
		if werr := b.backoff(ctx, attempt, err); werr != nil {
			return Published{}, werr
		}
	}
}

// request publishes m and waits for the stream's ack, retrying while the
// server is unreachable (the message id makes a retry of a write that did
// land a duplicate, not a second copy), and while a refusal of m's guard
// may only mean the stream's leader is behind (see Bus.unsettled).
func (b *Bus) request(ctx context.Context, m *nats.Msg) (Published, error) {
	start := time.Now()
	for attempt := 0; ; attempt++ {
		res, err := b.requestOnce(ctx, m)
		if err == nil || !retryable(err) && !b.unsettled(err, m, start) {
			return res, b.connErr(err)
		}
		// A refused publish gets no reply, only an asynchronous error:
		// retrying would wait for ever.
		if b.conn.refusedSince(m.Subject, start) {
			return Published{}, fmt.Errorf("publish %s: %w (the user lacks the permission to publish there)", m.Subject, ErrPermissionDenied)
		}
		if werr := b.backoff(ctx, attempt, err); werr != nil {
			return Published{}, werr
		}
	}
}

// backoff waits before retry number attempt of a publish. It returns an
// error when ctx ends or the connection is closed for good.
func (b *Bus) backoff(ctx context.Context, attempt int, cause error) error {
	if attempt == 3 {
		msg := "publish not acknowledged; retrying"
		if errors.Is(cause, ErrStale) {
			msg = "guarded publish refused: the stream's leader has not applied the event it is guarded on yet; retrying"
		}
		b.log.Warn().Err(cause).Msg(msg)
	}
	t := time.NewTimer(backoffDelay(attempt))
	defer t.Stop()
	select {
	case <-ctx.Done():
		return fmt.Errorf("publish: %w (last error: %v)", ctx.Err(), cause)
	case <-b.conn.closed:
		return fmt.Errorf("publish: %w (last error: %v)", b.closedErr(), cause)
	case <-t.C:
		return nil
	}
}

func retryable(err error) bool {
	return errors.Is(err, nats.ErrNoResponders) || errors.Is(err, nats.ErrTimeout) ||
		errors.Is(err, nats.ErrConnectionReconnecting) || errors.Is(err, errMsgIDInProcess)
}

func (b *Bus) requestOnce(ctx context.Context, m *nats.Msg) (Published, error) {
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	resp, err := b.nc.RequestMsgWithContext(rctx, m)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
			return Published{}, nats.ErrTimeout
		}
		return Published{}, err
	}
	var ack pubAck
	if err := json.Unmarshal(resp.Data, &ack); err != nil {
		return Published{}, fmt.Errorf("%w: unreadable ack %q", ErrRejected, resp.Data)
	}
	if ack.Error != nil {
		switch ack.Error.ErrCode {
		case codeWrongLastSeq, codeWrongLastSeqConst:
			return Published{}, staleError(ack.Error.Description)
		case codeMsgIDInProcess:
			return Published{}, fmt.Errorf("%w: %s", errMsgIDInProcess, ack.Error.Description)
		case codeBatchDuplicate:
			return Published{}, fmt.Errorf("%w (%s)", ErrDuplicate, ack.Error.Description)
		}
		if ack.Error.Code == 503 {
			return Published{}, nats.ErrNoResponders
		}
		return Published{}, fmt.Errorf("%w: %s (code %d)", ErrRejected, ack.Error.Description, ack.Error.ErrCode)
	}
	return Published{Seq: ack.Seq, Duplicate: ack.Duplicate}, nil
}

// asyncWindow bounds the events an Async has in flight: past it, Publish
// waits for the oldest acknowledgement first.
const asyncWindow = 64

// asyncAckWait is how long an Async waits for one acknowledgement before
// it publishes the event again and waits as Publish does.
const asyncAckWait = 5 * time.Second

// Async publishes events without waiting for each acknowledgement; Wait
// waits for all of them. It is for the events within a job (tool calls,
// messages) that nothing acts on before the job's result, which is
// published after Wait, so that a tool call does not wait for a round trip
// to the server. The events go out in order on the bus's connection and
// are stored in that order, but for one that fails and is published again
// (a lost connection, a server that did not answer): it may land after
// those sent behind it. Not safe for concurrent use.
type Async struct {
	b       *Bus
	pending []pendingEvent
}

type pendingEvent struct {
	m *nats.Msg
	f jetstream.PubAckFuture
}

// Async returns a publisher of events without a wait for each.
func (b *Bus) Async() *Async { return &Async{b: b} }

// Publish encodes ev and sends it. An event that cannot be encoded is
// refused at once; a failed write or acknowledgement surfaces in a later
// Publish or in Wait.
func (a *Async) Publish(ctx context.Context, ev schemas.Event) error {
	m, err := a.b.Encode(ev)
	if err != nil {
		return err
	}
	for len(a.pending) >= asyncWindow {
		if err := a.waitOldest(ctx); err != nil {
			return err
		}
	}
	f, err := a.b.eventsJS.PublishMsgAsync(m)
	if err != nil {
		// Not sent: what is in flight first, then this one, in order.
		if err := a.Wait(ctx); err != nil {
			return err
		}
		_, err = a.b.request(ctx, m)
		return err
	}
	a.pending = append(a.pending, pendingEvent{m: m, f: f})
	return nil
}

// Wait waits until every event published so far is stored. An event the
// server refused, or did not acknowledge within asyncAckWait, is published
// again and waited for as Publish does (retrying while the server is
// unreachable; its id makes a copy already stored a duplicate, not a
// second event). After an error the events still in flight are not
// waited for.
func (a *Async) Wait(ctx context.Context) error {
	for len(a.pending) > 0 {
		if err := a.waitOldest(ctx); err != nil {
			a.pending = nil
			return err
		}
	}
	return nil
}

// waitOldest waits for the acknowledgement of the oldest event in flight.
func (a *Async) waitOldest(ctx context.Context) error {
	p := a.pending[0]
	a.pending[0] = pendingEvent{}
	a.pending = a.pending[1:]
	_, err := a.b.waitAck(ctx, p.m, p.f)
	if err == nil || ctx.Err() != nil {
		return err
	}
	select {
	case <-a.b.conn.closed:
		return err
	default: // refused, lost, or not acknowledged in time
	}
	_, err = a.b.request(ctx, p.m)
	return err
}
