package bus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Reads a lagging replica must not decide.
//
// The artifact stream and the KV buckets allow direct gets, which any
// replica answers, and any replica may fall behind the others: a follower
// whose JetStream store is full drops what the leader sends it and keeps
// answering from what it holds (docs/CLUSTER.md), one that restarted
// answers once it is nearly caught up. So on a replicated stream a direct
// get that finds nothing proves nothing. The readers of this package keep
// the direct get for what it finds (what is stored is never replaced: an
// artifact's subjects take one message each, and a view found is checked
// against the sequence it carries) and ask the stream leader when a
// direct get finds nothing: a JetStream API message get
// ($JS.API.STREAM.MSG.GET.<stream>), which in a cluster only the stream's
// leader answers. The leader holds every acknowledged write. Reads of the
// event stream's sequences, which other reads are checked against, always
// go to the leader.

// ErrNoLeader: a read that only the stream's leader may answer (what a
// replica did not hold, a stream's last sequence) got no answer within
// leaderWait: the cluster is electing a leader, or has lost its quorum.
// What was asked for may exist: this is no ErrNotFound, and a retry later
// may find it.
var ErrNoLeader = errors.New("the stream leader did not answer")

// leaderWait bounds how long a read waits for a stream leader that does
// not answer (each request waits up to leaderRequestWait).
const (
	leaderWait        = 10 * time.Second
	leaderRequestWait = 5 * time.Second
)

// msgGetRequest is a JetStream API message get: by sequence, the newest
// on a subject (LastFor) or the first at or after Seq on a subject
// (NextFor). Subjects may hold wildcards.
type msgGetRequest struct {
	Seq     uint64 `json:"seq,omitempty"`
	LastFor string `json:"last_by_subj,omitempty"`
	NextFor string `json:"next_by_subj,omitempty"`
}

type msgGetResponse struct {
	Error *struct {
		Code        int    `json:"code"`
		ErrCode     int    `json:"err_code"`
		Description string `json:"description"`
	} `json:"error"`
	Message *struct {
		Subject  string    `json:"subject"`
		Sequence uint64    `json:"seq"`
		Header   []byte    `json:"hdrs,omitempty"`
		Data     []byte    `json:"data,omitempty"`
		Time     time.Time `json:"time"`
	} `json:"message"`
}

// codeNoMessage: the stream holds no message that matches the request.
const codeNoMessage = 10037

// leaderMsg asks stream's leader for a message. Nothing found is an error
// wrapping jetstream.ErrMsgNotFound. While no leader answers (timeouts,
// 503) it retries for leaderWait, then fails with an error wrapping
// ErrNoLeader; a user without the permission to ask gets an error wrapping
// ErrPermissionDenied.
func (b *Bus) leaderMsg(ctx context.Context, stream string, req msgGetRequest) (*jetstream.RawStreamMsg, error) {
	subject := "$JS.API.STREAM.MSG.GET." + stream
	start := time.Now()
	for attempt := 0; ; attempt++ {
		m, err := b.leaderMsgOnce(ctx, stream, req)
		if err == nil || !retryable(err) {
			return m, b.connErr(err)
		}
		if b.conn.refusedSince(subject, start) {
			return nil, fmt.Errorf("%s: %w (the user lacks the permission to publish there)", subject, ErrPermissionDenied)
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if cerr := b.closedErr(); cerr != nil {
			return nil, cerr
		}
		if time.Since(start) >= leaderWait {
			if !b.nc.IsConnected() {
				return nil, fmt.Errorf("stream %s: %w", stream, err)
			}
			return nil, fmt.Errorf("stream %s: %w in %s (%v)", stream, ErrNoLeader, leaderWait.Round(time.Second), err)
		}
		sleep(ctx, backoffDelay(attempt))
	}
}

// leaderMsgOnce makes one attempt of leaderMsg; an unanswered one fails
// with nats.ErrTimeout, one refused for want of a leader with
// nats.ErrNoResponders.
func (b *Bus) leaderMsgOnce(ctx context.Context, stream string, req msgGetRequest) (*jetstream.RawStreamMsg, error) {
	subject := "$JS.API.STREAM.MSG.GET." + stream
	data, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	rctx, cancel := context.WithTimeout(ctx, leaderRequestWait)
	defer cancel()
	resp, err := b.nc.RequestWithContext(rctx, subject, data)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
			return nil, nats.ErrTimeout
		}
		return nil, err
	}
	var r msgGetResponse
	if err := json.Unmarshal(resp.Data, &r); err != nil {
		return nil, fmt.Errorf("%s: unreadable reply %.200q", subject, resp.Data)
	}
	switch {
	case r.Error != nil && r.Error.ErrCode == codeNoMessage:
		return nil, jetstream.ErrMsgNotFound
	case r.Error != nil && r.Error.Code == 503: // no leader (yet)
		return nil, nats.ErrNoResponders
	case r.Error != nil:
		return nil, fmt.Errorf("%s: %s (code %d)", subject, r.Error.Description, r.Error.ErrCode)
	case r.Message == nil:
		return nil, fmt.Errorf("%s: a reply without a message", subject)
	}
	var hdr nats.Header
	if len(r.Message.Header) > 0 {
		if hdr, err = nats.DecodeHeadersMsg(r.Message.Header); err != nil {
			return nil, fmt.Errorf("%s: headers: %w", subject, err)
		}
	}
	return &jetstream.RawStreamMsg{Subject: r.Message.Subject, Sequence: r.Message.Sequence, Header: hdr, Data: r.Message.Data, Time: r.Message.Time}, nil
}

// confirmMiss is what to answer for a read of stream that a replica may
// have answered and that found nothing (err wraps
// jetstream.ErrMsgNotFound), or that no replica answered: the leader's
// answer to req. If the user may not ask the leader, err stands, with a
// warning the first time.
func (b *Bus) confirmMiss(ctx context.Context, stream string, req msgGetRequest, err error) (*jetstream.RawStreamMsg, error) {
	if _, refused := b.conn.leaderRefused.Load(stream); refused {
		return nil, err
	}
	m, lerr := b.leaderMsg(ctx, stream, req)
	if errors.Is(lerr, ErrPermissionDenied) {
		if _, seen := b.conn.leaderRefused.LoadOrStore(stream, true); !seen {
			b.log.Warn().Err(lerr).Str("stream", stream).
				Msg("cannot ask the stream leader for what a replica did not hold: a replica that lags may make reads miss (grant the permission)")
		}
		return nil, err
	}
	return m, lerr
}

// lastMsg reads the newest message on subject of s, by direct get when the
// stream allows it, and from the stream leader if that finds nothing (or,
// on a replicated stream, if no replica answers: see directGet).
func (b *Bus) lastMsg(ctx context.Context, s jetstream.Stream, subject string) (*jetstream.RawStreamMsg, error) {
	return b.directGet(ctx, s, msgGetRequest{LastFor: subject}, func(ctx context.Context) (*jetstream.RawStreamMsg, error) {
		return s.GetLastMsgForSubject(ctx, subject)
	})
}

// msgAt reads the message at seq of s, by direct get when the stream
// allows it, and from the stream leader if that finds nothing (or, on a
// replicated stream, if no replica answers: see directGet).
func (b *Bus) msgAt(ctx context.Context, s jetstream.Stream, seq uint64) (*jetstream.RawStreamMsg, error) {
	return b.directGet(ctx, s, msgGetRequest{Seq: seq}, func(ctx context.Context) (*jetstream.RawStreamMsg, error) {
		return s.GetMsg(ctx, seq)
	})
}

// Direct gets on a replicated stream are tried directTries times, each
// for at most directTry, before the stream leader is asked. A replica on
// a node that is frozen (or cut off) stays subscribed to direct gets
// until the cluster notices, minutes later, and a request handed to it
// goes unanswered; the next may reach a live replica, and the leader the
// cluster elects without that node answers in any case. A direct get
// takes milliseconds when it is answered at all.
const (
	directTry   = 2 * time.Second
	directTries = 3
)

// directGet runs get, a read of s by direct get when the stream allows
// it (req is the same read asked of the leader). A message not found is
// asked of the leader (a replica may lag: confirmMiss). On a replicated
// stream, an unanswered get is tried again, then asked of the leader.
func (b *Bus) directGet(ctx context.Context, s jetstream.Stream, req msgGetRequest, get func(context.Context) (*jetstream.RawStreamMsg, error)) (*jetstream.RawStreamMsg, error) {
	info := s.CachedInfo()
	if info == nil || !info.Config.AllowDirect {
		return get(ctx)
	}
	stream := info.Config.Name
	tries := 1
	if info.Config.Replicas > 1 {
		tries = directTries
	}
	var err error
	for range tries {
		var m *jetstream.RawStreamMsg
		if tries == 1 {
			m, err = get(ctx)
		} else {
			tctx, cancel := context.WithTimeout(ctx, directTry)
			m, err = get(tctx)
			cancel()
		}
		switch {
		case errors.Is(err, jetstream.ErrMsgNotFound):
			return b.confirmMiss(ctx, stream, req, err)
		case err == nil || ctx.Err() != nil || !unanswered(err):
			return m, err
		}
	}
	if tries == 1 {
		return nil, err
	}
	return b.confirmMiss(ctx, stream, req, err)
}

// unanswered reports whether err says a request got no answer in time
// (or found no one to answer it), as opposed to an answer that refused.
func unanswered(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) || errors.Is(err, nats.ErrNoResponders)
}

// leaderLastSeq is the stream sequence of the newest message on any of
// subjects (which may hold wildcards) as the event stream's leader knows
// it; 0 if there is none.
func (b *Bus) leaderLastSeq(ctx context.Context, subjects []string) (uint64, error) {
	var last uint64
	for _, subj := range subjects {
		m, err := b.leaderMsg(ctx, b.cfg.Stream, msgGetRequest{LastFor: subj})
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			return 0, fmt.Errorf("last event on %s: %w", subj, err)
		}
		last = max(last, m.Sequence)
	}
	return last, nil
}

// leaderNextSeq is the stream sequence of the first message after seq on
// any of subjects as the event stream's leader knows it; 0 if there is
// none.
func (b *Bus) leaderNextSeq(ctx context.Context, subjects []string, seq uint64) (uint64, error) {
	var next uint64
	for _, subj := range subjects {
		m, err := b.leaderMsg(ctx, b.cfg.Stream, msgGetRequest{Seq: seq + 1, NextFor: subj})
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			return 0, fmt.Errorf("next event on %s: %w", subj, err)
		}
		if next == 0 || m.Sequence < next {
			next = m.Sequence
		}
	}
	return next, nil
}
