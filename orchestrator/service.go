package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/schemas"
	"github.com/rs/zerolog"
)

// Bus is what the orchestrator needs from the event bus.
type Bus interface {
	Read(ctx context.Context, opts bus.ReadOptions, fn func(schemas.Event) error) error
	PublishBatch(ctx context.Context, session string, expectLast uint64, evs []schemas.Event) (bus.Published, error)
}

// Config of the orchestrator service. The zero value is usable.
type Config struct {
	// Name identifies this replica in logs and dead letters; default "orchestrator".
	Name string
}

// Validate reports the first invalid value.
func (c Config) Validate() error { return nil }

// Service reads the whole stream in order, folds it into State and, once
// caught up with the head, publishes each decision as one atomic batch
// guarded by the session's expected last sequence. Several replicas may run:
// the guard and the deterministic ids make a losing replica's decision a
// no-op. Run is not safe to call twice concurrently.
type Service struct {
	cfg   Config
	bus   Bus
	log   zerolog.Logger
	now   func() time.Time
	state *State
	// inflight: the sequence our last batch for a session ended at; no new
	// decision for it until the state has seen that far.
	inflight map[string]uint64
	caughtUp bool
}

// New returns a Service. now is the clock for event times.
func New(cfg Config, b Bus, log zerolog.Logger, now func() time.Time) (*Service, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Name == "" {
		cfg.Name = "orchestrator"
	}
	if b == nil || now == nil {
		return nil, errors.New("orchestrator: bus and clock are required")
	}
	return &Service{cfg: cfg, bus: b, log: log, now: now, state: NewState(), inflight: map[string]uint64{}}, nil
}

// Run folds and decides until ctx ends. It returns nil on cancellation and
// an error only when the stream cannot be read.
func (s *Service) Run(ctx context.Context) error {
	start := time.Now()
	err := s.bus.Read(ctx, bus.ReadOptions{
		Follow:     true,
		DeadLetter: s.cfg.Name,
		OnSkip: func(subject string, seq uint64) {
			session, ok := schemas.SessionOfSubject(subject)
			if !ok {
				return
			}
			Skip(s.state, session, seq)
			if sess := s.state.Sessions[session]; s.caughtUp && sess != nil {
				// A decision refused because of this message is made again.
				s.decide(ctx, schemas.Event{ID: sess.LastID, Session: session})
			}
		},
		OnCaughtUp: func() {
			s.caughtUp = true
			s.log.Info().Int("sessions", len(s.state.Sessions)).Dur("took", time.Since(start)).Msg("caught up with the stream")
			// Decisions a crash may have lost: make them now.
			for id, sess := range s.state.Sessions {
				if !sess.terminal() {
					s.decide(ctx, schemas.Event{ID: sess.LastID, Session: id})
				}
			}
		},
	}, func(ev schemas.Event) error {
		if err := Check(s.state, ev); err != nil {
			// Read dead-letters it and reports it through OnSkip.
			return fmt.Errorf("%w: %w", bus.ErrMalformed, err)
		}
		Evolve(s.state, ev)
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

func (s *Service) decide(ctx context.Context, trigger schemas.Event) {
	sess := s.state.Sessions[trigger.Session]
	if sess == nil || sess.terminal() || s.inflight[sess.ID] > sess.LastSeq {
		return
	}
	evs := Decide(s.state, trigger, s.now())
	if len(evs) == 0 {
		return
	}
	log := s.log.With().Str("session", sess.ID).Str("trigger", trigger.Type).Int("events", len(evs)).Logger()
	res, err := s.bus.PublishBatch(ctx, sess.ID, sess.LastSeq, evs)
	switch {
	case err == nil:
		s.inflight[sess.ID] = res.Seq
		for _, ev := range evs {
			log.Debug().Str("type", ev.Type).Str("step", ev.Step).Msg("decided")
		}
	case errors.Is(err, bus.ErrStale), errors.Is(err, bus.ErrDuplicate):
		// Newer events exist that we have not read yet; we decide again
		// when they arrive.
		log.Debug().Err(err).Msg("decision superseded")
	case ctx.Err() != nil, errors.Is(err, bus.ErrConnectionLost):
		// Not ours to judge: a restarted orchestrator decides again.
	default:
		// The bus retries transient failures itself; what is left will not
		// pass on a retry. Fail the session rather than leave it waiting.
		log.Error().Err(err).Msg("could not publish decision; failing the session")
		fallback := Unrecordable(s.state, trigger, evs, err, s.now())
		if res, ferr := s.bus.PublishBatch(ctx, sess.ID, sess.LastSeq, fallback); ferr == nil {
			s.inflight[sess.ID] = res.Seq
		} else if !errors.Is(ferr, bus.ErrStale) && !errors.Is(ferr, bus.ErrDuplicate) {
			log.Error().Err(ferr).Msg("could not record the session's failure either")
		}
	}
}
