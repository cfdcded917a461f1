package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/schemas"
	"github.com/rs/zerolog"
)

// Bus is what the orchestrator needs from the event bus.
type Bus interface {
	Read(ctx context.Context, opts bus.ReadOptions, fn func(schemas.Event) error) error
	PublishBatch(ctx context.Context, session string, expectLast uint64, evs []schemas.Event) (bus.Published, error)
	PublishChain(ctx context.Context, session string, expectLast uint64, evs []schemas.Event) (bus.Published, error)
	// OwnID makes a decision's id unguessable to other keys (see
	// bus.Bus.OwnID), so no one can store something under it first.
	OwnID(id string) string
}

// Config of the orchestrator service. The zero value is usable.
type Config struct {
	// Name identifies this replica in logs and dead letters; default "orchestrator".
	Name string
	// Tick is how often rate-limit waits are checked for their end, and
	// the watchdog looks for sessions left without a decision; default 1s.
	Tick time.Duration
	// StallAfter is how long the watchdog lets a session go without an
	// event, and without a decision being committed, before it asks
	// Decide whether the session is owed one: if so, a decision was lost
	// (a refused or dropped commit), and the watchdog makes it, logs an
	// error and calls OnStall. Default DefaultStallAfter.
	StallAfter time.Duration
	// OnStall, if set, is called with the session's id for each decision
	// the watchdog makes (e.g. to count them: metrics.Orchestrator).
	// It is called with the service's lock held and must not block.
	OnStall func(session string)
}

// DefaultStallAfter is Config.StallAfter's default: far above the time a
// decision takes, even while a cluster elects a new leader.
const DefaultStallAfter = 30 * time.Second

// Validate reports the first invalid value: Name must be one subject token
// (it names dead letters, loopbus.dlq.<name>.<seq>).
func (c Config) Validate() error {
	if c.Name != "" {
		if err := schemas.ValidateSessionID(c.Name); err != nil {
			return fmt.Errorf("orchestrator: name: %w", err)
		}
	}
	if c.Tick < 0 {
		return fmt.Errorf("orchestrator: tick %v is negative", c.Tick)
	}
	if c.StallAfter < 0 {
		return fmt.Errorf("orchestrator: stall bound %v is negative", c.StallAfter)
	}
	return nil
}

// Service reads the whole stream in order, folds it into State and, once
// caught up with the head, publishes each decision as one atomic batch
// guarded by the session's expected last sequence. Several replicas may run:
// the guard and the deterministic ids make a losing replica's decision a
// no-op. Batches are committed in the background, at most one per session
// at a time, so the read loop never waits for a round trip. Run is not safe
// to call twice concurrently.
type Service struct {
	cfg Config
	bus Bus
	log zerolog.Logger
	now func() time.Time

	// mu guards state and inflight: the read loop folds and decides, the
	// committers settle their batches.
	mu    sync.Mutex
	state *State
	// inflight: for a session with a batch being committed, committing;
	// after a commit, the sequence the batch ended at. No new decision for
	// the session until the state has seen that far.
	inflight map[string]uint64
	// waits holds the sessions with a rate-limit wait; the ticker decides
	// for them when it ends. Rebuilt from the stream on start, so a wait
	// survives a restart.
	waits map[string]struct{}
	// still holds the sessions the watchdog watches (not finished), each
	// with when it last changed: an event folded or a commit ended. The
	// watchdog drops a session once it has looked at it; the session's
	// next change puts it back.
	still    map[string]time.Time
	caughtUp bool
	// readSeq is the stream sequence of the last message read (folded,
	// or skipped as malformed): see ReadSeq.
	readSeq atomic.Uint64
	// commits runs the background commits; slots bounds how many at once.
	commits sync.WaitGroup
	slots   chan struct{}
}

// committing marks a session whose batch is being committed.
const committing = math.MaxUint64

// maxCommits bounds the batches committed at once (e.g. when thousands of
// sessions are decided on catching up).
const maxCommits = 64

// New returns a Service. now is the clock for event times.
func New(cfg Config, b Bus, log zerolog.Logger, now func() time.Time) (*Service, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Name == "" {
		cfg.Name = "orchestrator"
	}
	if cfg.Tick == 0 {
		cfg.Tick = time.Second
	}
	if cfg.StallAfter == 0 {
		cfg.StallAfter = DefaultStallAfter
	}
	if b == nil || now == nil {
		return nil, errors.New("orchestrator: bus and clock are required")
	}
	st := NewState()
	st.Prompts = NewPromptCache()
	return &Service{cfg: cfg, bus: b, log: log, now: now, state: st, inflight: map[string]uint64{}, waits: map[string]struct{}{},
		still: map[string]time.Time{}, slots: make(chan struct{}, maxCommits)}, nil
}

// Run folds and decides until ctx ends, then waits for the commits under
// way. It returns nil on cancellation and an error only when the stream
// cannot be read.
func (s *Service) Run(ctx context.Context) error {
	start := time.Now()
	defer s.commits.Wait()
	// Commits end with the read: if it fails, Run must not wait for a
	// commit that retries until its context ends.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s.commits.Add(1)
	go func() {
		defer s.commits.Done()
		s.tick(ctx)
	}()
	err := s.bus.Read(ctx, bus.ReadOptions{
		Follow:     true,
		DeadLetter: s.cfg.Name,
		OnSkip: func(subject string, seq uint64) {
			defer s.readSeq.Store(seq)
			session, ok := schemas.SessionOfSubject(subject)
			if !ok {
				return
			}
			s.mu.Lock()
			defer s.mu.Unlock()
			Skip(s.state, session, seq)
			s.touch(session)
			if sess := s.state.Sessions[session]; s.caughtUp && sess != nil {
				// A decision refused because of this message is made again.
				s.decide(ctx, schemas.Event{ID: sess.LastID, Session: session})
			}
		},
		OnCaughtUp: func() {
			s.mu.Lock()
			defer s.mu.Unlock()
			s.caughtUp = true
			s.log.Info().Int("sessions", len(s.state.Sessions)).Dur("took", time.Since(start)).Msg("caught up with the stream")
			// Decisions a crash may have lost: make them now.
			for id, sess := range s.state.Sessions {
				if !sess.terminal() || len(sess.Pending) > 0 || len(sess.Orphans) > 0 {
					s.decide(ctx, schemas.Event{ID: sess.LastID, Session: id})
				}
			}
		},
	}, func(ev schemas.Event) error {
		s.mu.Lock()
		defer s.mu.Unlock()
		defer s.readSeq.Store(ev.Seq)
		restore := func() {}
		switch {
		case ev.ForkOf != "":
			// A copy in a fork's history: nothing to decide (PrepareFork).
			if err := Check(s.state, ev); err != nil {
				return fmt.Errorf("%w: %w", bus.ErrMalformed, err)
			}
			Evolve(s.state, ev)
			return nil
		case ev.Type == schemas.TypeSessionRerun:
			var err error
			if restore, err = s.rehydrate(ctx, ev); err != nil {
				return err
			}
		case ev.Type == schemas.TypeSessionForked:
			var err error
			if restore, err = PrepareFork(s.state, ev, s.history(ctx)); err != nil {
				return fmt.Errorf("orchestrator: read the origin of fork %s: %w", ev.Session, err)
			}
		}
		if err := Check(s.state, ev); err != nil {
			restore() // a refused rerun leaves the session compacted
			// Read dead-letters it and reports it through OnSkip.
			return fmt.Errorf("%w: %w", bus.ErrMalformed, err)
		}
		if err := safeEvolve(s.state, ev); err != nil {
			s.log.Error().Err(err).Str("session", ev.Session).Str("type", ev.Type).Msg("an event crashed the fold; dead-lettering it")
			return fmt.Errorf("%w: %w", bus.ErrMalformed, err)
		}
		s.trackWait(ev.Session)
		s.touch(ev.Session)
		if s.caughtUp {
			s.decide(ctx, ev)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("orchestrator: %w", err)
	}
	return nil
}

// ReadSeq returns the stream sequence of the last message Run has read
// and acted on (folded and decided, or skipped as malformed); 0 before
// the first. The stream's last sequence minus it is how far the
// orchestrator lags (metrics.Orchestrator).
func (s *Service) ReadSeq() uint64 { return s.readSeq.Load() }

// rehydrate gives a finished session, which the state keeps compacted to
// what identifies it, its pipeline and steps back before the session.rerun
// rerun reopens it: the session's history before it is read and folded
// again, retained, as it was folded the first time (events Check refuses
// are skipped). Only a rerun needs them, so finished sessions cost no
// memory the rest of the time. s.mu is held.
// The returned function puts the compacted session back (for a rerun
// Check refuses). Reruns Check refuses anyway (a closed, backlog or loops
// session, a copy of an applied one) read nothing.
func (s *Service) rehydrate(ctx context.Context, rerun schemas.Event) (restore func(), err error) {
	restore = func() {}
	sess := s.state.Sessions[rerun.Session]
	if sess == nil || !sess.terminal() || sess.Steps != nil || sess.Status == StatusClosed || sess.Kind != "" || slices.Contains(sess.RerunIDs, rerun.ID) {
		return restore, nil
	}
	tmp := NewState()
	tmp.Retain = true
	if err = foldHistory(tmp, rerun.Session, rerun.Seq-min(rerun.Seq, 1), s.history(ctx), 0, nil); err != nil {
		return restore, fmt.Errorf("orchestrator: read session %s again to rerun it: %w", rerun.Session, err)
	}
	if t := tmp.Sessions[rerun.Session]; t != nil && t.Steps != nil {
		// Messages skipped as malformed move the session's sequence too.
		if sess.LastSeq > t.LastSeq {
			t.LastSeq, t.LastID = sess.LastSeq, sess.LastID
		}
		s.state.Sessions[rerun.Session] = t
		restore = func() { s.state.Sessions[rerun.Session] = sess }
	}
	return restore, nil
}

// history reads a session's events from the stream (see HistoryOf).
func (s *Service) history(ctx context.Context) HistoryReader { return HistoryOf(ctx, s.bus) }

// trackWait notes whether session has a rate-limit wait. s.mu is held.
func (s *Service) trackWait(session string) {
	if sess := s.state.Sessions[session]; sess != nil {
		if _, ok := sess.WakeAt(); ok {
			s.waits[session] = struct{}{}
			return
		}
	}
	delete(s.waits, session)
}

// tick decides again, every cfg.Tick, for the sessions whose rate-limit
// wait has ended, then runs the watchdog (watch), until ctx ends.
func (s *Service) tick(ctx context.Context) {
	t := time.NewTicker(s.cfg.Tick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		s.mu.Lock()
		if s.caughtUp {
			now := s.now()
			for id := range s.waits {
				sess := s.state.Sessions[id]
				if sess == nil {
					continue
				}
				if at, ok := sess.WakeAt(); ok && !now.Before(at) {
					s.decide(ctx, schemas.Event{ID: sess.LastID, Session: id})
				}
			}
			s.watch(ctx, now)
		}
		s.mu.Unlock()
	}
}

// touch notes that session changed (an event folded, a commit ended),
// for the watchdog: a finished session is no longer watched. s.mu is
// held.
func (s *Service) touch(session string) {
	if sess := s.state.Sessions[session]; sess == nil || sess.terminal() && len(sess.Pending) == 0 && len(sess.Orphans) == 0 {
		delete(s.still, session)
		return
	}
	s.still[session] = s.now()
}

// watch is the watchdog. Every decision Decide owes a session is made
// when the event that calls for it is folded, or when a commit ends; one
// can still be lost (a commit refused for a reason that was not, or
// dropped), and nothing would make it again but a restart, the session
// waiting for ever. So a session still for cfg.StallAfter, with no
// commit under way, is decided for again: a decision made then was
// owed, and is logged as an error and passed to cfg.OnStall. A session
// with events the orchestrator knows of (its own decision, or newer
// events a refusal named) and has not read for that long is logged: the
// read lags, or lost events. s.mu is held.
func (s *Service) watch(ctx context.Context, now time.Time) {
	for id, since := range s.still {
		quiet := now.Sub(since)
		if quiet < s.cfg.StallAfter {
			continue
		}
		sess := s.state.Sessions[id]
		if sess == nil {
			delete(s.still, id)
			continue
		}
		switch mark := s.inflight[id]; {
		case mark == committing:
			continue // the commit's end touches the session
		case mark > sess.LastSeq:
			delete(s.still, id)
			s.log.Warn().Str("session", id).Uint64("stored", mark).Uint64("read", sess.LastSeq).Dur("for", quiet).
				Msg("watchdog: the session has events stored that the orchestrator has not read yet; it decides again once it has")
			continue
		}
		delete(s.still, id)
		evs := s.decide(ctx, schemas.Event{ID: sess.LastID, Session: id})
		if len(evs) == 0 {
			s.log.Debug().Str("session", id).Dur("still_for", quiet).Msg("watchdog: the session waits for others; no decision owed")
			continue
		}
		types := make([]string, len(evs))
		for i, ev := range evs {
			types[i] = ev.Type
		}
		s.log.Error().Str("session", id).Uint64("last_seq", sess.LastSeq).Dur("still_for", quiet).Strs("decided", types).
			Msg("watchdog: the session was owed a decision that was never made; deciding now")
		if s.cfg.OnStall != nil {
			s.cfg.OnStall(id)
		}
	}
}

// decide makes the decision trigger calls for and commits it in the
// background; it returns the decision (nil when there is none to make,
// or one is being committed). s.mu is held.
func (s *Service) decide(ctx context.Context, trigger schemas.Event) []schemas.Event {
	sess := s.state.Sessions[trigger.Session]
	switch {
	case sess == nil:
		return nil
	case sess.terminal() && len(sess.Pending) == 0 && len(sess.Orphans) == 0:
		if s.inflight[sess.ID] != committing {
			delete(s.inflight, sess.ID) // nothing more to decide
		}
		return nil
	case s.inflight[sess.ID] > sess.LastSeq:
		return nil
	}
	evs := SafeDecide(s.state, trigger, s.now())
	if len(evs) == 0 {
		return nil
	}
	id, expect := sess.ID, sess.LastSeq
	// The commit gives the events ids of its own (own): a copy of their
	// slice, as evs is returned.
	commit := slices.Clone(evs)
	s.inflight[id] = committing
	s.commits.Add(1)
	go func() {
		defer s.commits.Done()
		select {
		case s.slots <- struct{}{}:
		case <-ctx.Done():
			return // stopping: a restarted orchestrator decides again
		}
		defer func() { <-s.slots }()
		if ctx.Err() != nil {
			return // both were ready: do not start a batch while stopping
		}
		s.commit(ctx, trigger, id, expect, commit)
	}()
	return evs
}

// commit publishes one decision and settles the session's inflight mark.
func (s *Service) commit(ctx context.Context, trigger schemas.Event, id string, expect uint64, evs []schemas.Event) {
	log := s.log.With().Str("session", id).Str("trigger", trigger.Type).Int("events", len(evs)).Logger()
	res, err := s.publish(ctx, id, expect, s.own(evs))
	switch {
	case err == nil:
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, ev := range evs {
			log.Debug().Str("type", ev.Type).Str("step", ev.Step).Msg("decided")
		}
		s.settled(ctx, id, res.Seq)
	case errors.Is(err, bus.ErrStale), errors.Is(err, bus.ErrDuplicate):
		log.Debug().Err(err).Msg("decision superseded")
		s.mu.Lock()
		defer s.mu.Unlock()
		s.superseded(ctx, id, expect, err)
	case ctx.Err() != nil, errors.Is(err, bus.ErrConnectionLost):
		// Not ours to judge: a restarted orchestrator decides again.
	default:
		// The bus retries transient failures itself; what is left will not
		// pass on a retry. Fail the session rather than leave it waiting.
		log.Error().Err(err).Msg("could not publish decision; failing the session")
		s.mu.Lock()
		fallback := Unrecordable(s.state, trigger, evs, err, s.now())
		s.mu.Unlock()
		fres, ferr := s.publish(ctx, id, expect, s.own(fallback))
		s.mu.Lock()
		defer s.mu.Unlock()
		switch {
		case ferr == nil:
			s.settled(ctx, id, fres.Seq)
		case errors.Is(ferr, bus.ErrStale), errors.Is(ferr, bus.ErrDuplicate):
			s.superseded(ctx, id, expect, ferr)
		default:
			// The next event of the session (or the watchdog, or a
			// restart) tries again.
			log.Error().Err(ferr).Msg("could not record the session's failure either")
			delete(s.inflight, id)
			s.touch(id)
		}
	}
}

// publish writes one decision, guarded on the session's last event being
// expect: as a chain (bus.PublishChain) when it is chainable, else as one
// atomic batch. A chain's events go out together; for every batch the
// server syncs a staging store of its own to disk.
func (s *Service) publish(ctx context.Context, id string, expect uint64, evs []schemas.Event) (bus.Published, error) {
	if chainable(evs) {
		return s.bus.PublishChain(ctx, id, expect, evs)
	}
	return s.bus.PublishBatch(ctx, id, expect, evs)
}

// chainable reports whether every event of a decision is of a kind that
// Decide, being level-triggered, makes again from any part of the
// decision written, so that a chain cut short is completed by the next
// decision: job requests, a step's and the session's completion, a
// rate-limit wait, a gate opening. Anything else (a signal's answer,
// failures, cancellations, spawned loops, merges and rebases, task list
// and backlog phase changes, expired gates) is worked out once from what
// triggered it, and a part of it would be lost or made differently: it is
// written all or nothing.
func chainable(evs []schemas.Event) bool {
	for _, ev := range evs {
		switch ev.Type {
		case schemas.TypeJobRequested, schemas.TypeStepCompleted, schemas.TypeSessionCompleted,
			schemas.TypeStepWaiting, schemas.TypeApprovalRequested:
		default:
			return false
		}
	}
	return true
}

// own gives decided events ids only this orchestrator's key can compute
// (unchanged without one). Decide derives ids from the session's logical
// position so that a decision made twice de-duplicates; anyone could store
// a message under such an id first and have the decision dropped.
func (s *Service) own(evs []schemas.Event) []schemas.Event {
	for i := range evs {
		evs[i].ID = s.bus.OwnID(evs[i].ID)
	}
	return evs
}

// superseded: newer events than expect exist (err says so, and may say
// up to where: bus.StaleError). Those read while the batch was committed
// found the session busy; decide again now if there were any, else when
// they arrive: when the server named a sequence, not before the read has
// reached it. A refusal without newer events read nor named is logged:
// the watchdog decides again if none arrive. s.mu is held.
func (s *Service) superseded(ctx context.Context, id string, expect uint64, err error) {
	delete(s.inflight, id)
	s.touch(id)
	sess := s.state.Sessions[id]
	if sess == nil {
		return
	}
	var stale *bus.StaleError
	named := errors.As(err, &stale) && stale.Known
	switch {
	case named && stale.Last > sess.LastSeq:
		s.inflight[id] = stale.Last
	case sess.LastSeq > expect:
		s.decide(ctx, schemas.Event{ID: sess.LastID, Session: id})
	case errors.Is(err, bus.ErrStale) && !named || named && stale.Last < expect:
		s.log.Warn().Err(err).Str("session", id).Uint64("expected", expect).Dur("watchdog_after", s.cfg.StallAfter).
			Msg("decision refused as stale, but no newer event of the session is known; the watchdog decides again unless one arrives")
	}
}

// settled records that a session's batch ended at seq. Events read while
// it was committed found the session busy: if the read is already past
// the batch, decide again now (Decide is level-triggered, so a decision
// with nothing to do is none). s.mu is held.
func (s *Service) settled(ctx context.Context, id string, seq uint64) {
	s.inflight[id] = seq
	s.touch(id)
	if sess := s.state.Sessions[id]; sess != nil && sess.LastSeq >= seq {
		s.decide(ctx, schemas.Event{ID: sess.LastID, Session: id})
	}
}

// safeEvolve is Evolve with a panic returned as an error: the event is
// dead-lettered with the reason and the service goes on.
func safeEvolve(st *State, ev schemas.Event) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("folding event %s (%s) panicked: %v", ev.ID, ev.Type, r)
		}
	}()
	Evolve(st, ev)
	return nil
}
