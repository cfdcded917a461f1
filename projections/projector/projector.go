// Package projector keeps the projections' views current in the views
// bucket: it folds the event stream with the pure folds of package
// projections and writes the results, each tagged with the stream sequence
// it reflects.
package projector

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/projections"
	"github.com/loopbus/loopbus/schemas"
	"github.com/rs/zerolog"
)

// checkpointKey holds the stream sequence up to which every manifest is
// materialized.
const checkpointKey = "_projector.manifests"

// Bus is what the projector needs from the event bus.
type Bus interface {
	Read(ctx context.Context, opts bus.ReadOptions, fn func(schemas.Event) error) error
	PutView(ctx context.Context, key string, v any) error
	GetView(ctx context.Context, key string, v any) error
}

// Config of the projector service. The zero value is usable.
type Config struct {
	// CheckpointEvery is how many events pass between checkpoint writes;
	// default 100. After a crash up to this many events are folded again,
	// which is harmless: each manifest carries the sequence it reflects.
	CheckpointEvery int
}

// ErrInvalidConfig: a Config value is out of range.
var ErrInvalidConfig = errors.New("projector: invalid configuration")

// Validate reports the first invalid value, wrapping ErrInvalidConfig.
func (c Config) Validate() error {
	if c.CheckpointEvery < 0 {
		return fmt.Errorf("%w: negative checkpoint interval", ErrInvalidConfig)
	}
	return nil
}

// Service keeps every session manifest in the views bucket current with
// the stream. Views are derived data: Rebuild (or deleting the checkpoint)
// recomputes them from the stream.
type Service struct {
	cfg Config
	bus Bus
	log zerolog.Logger
	// live caches manifests of running sessions; terminal ones are dropped
	// after they are written.
	live map[string]*projections.Manifest
}

// New returns a projector.
func New(cfg Config, b Bus, log zerolog.Logger) (*Service, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if b == nil {
		return nil, errors.New("projector: bus is required")
	}
	if cfg.CheckpointEvery == 0 {
		cfg.CheckpointEvery = 100
	}
	return &Service{cfg: cfg, bus: b, log: log, live: map[string]*projections.Manifest{}}, nil
}

type checkpoint struct {
	Seq uint64 `json:"seq"`
}

// Run materializes manifests from the checkpoint on until ctx ends.
func (p *Service) Run(ctx context.Context) error {
	var cp checkpoint
	if err := p.bus.GetView(ctx, checkpointKey, &cp); err != nil && !errors.Is(err, bus.ErrNotFound) {
		return fmt.Errorf("projector: %w", err)
	}
	return p.run(ctx, cp.Seq, true)
}

// Rebuild recomputes every manifest from the start of the stream, then
// returns (it does not follow).
func (p *Service) Rebuild(ctx context.Context) error {
	p.live = map[string]*projections.Manifest{}
	defer func() { p.live = map[string]*projections.Manifest{} }()
	return p.run(ctx, 0, false)
}

func (p *Service) run(ctx context.Context, from uint64, follow bool) error {
	n := 0
	var last uint64
	save := func() {
		if last == 0 {
			return
		}
		// Saved also while stopping, so a restart resumes where this ended.
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := p.bus.PutView(sctx, checkpointKey, checkpoint{Seq: last}); err != nil {
			p.log.Warn().Err(err).Msg("could not save projector checkpoint")
		}
	}
	err := p.bus.Read(ctx, bus.ReadOptions{
		StartSeq:   from + 1,
		Follow:     follow,
		DeadLetter: "projector",
		OnCaughtUp: func() { p.log.Info().Uint64("seq", max(last, from)).Msg("views caught up") },
	}, func(ev schemas.Event) error {
		// A view write that fails (the server is restarting, say) is
		// retried: skipping it would leave the view wrong until rebuilt.
		for attempt := 0; ; attempt++ {
			err := p.apply(ctx, ev, !follow)
			if err == nil {
				break
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if attempt == 0 {
				p.log.Warn().Err(err).Uint64("seq", ev.Seq).Msg("could not update a view; retrying")
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(min(time.Duration(attempt+1)*200*time.Millisecond, 5*time.Second)):
			}
		}
		last = ev.Seq
		if n++; n%p.cfg.CheckpointEvery == 0 {
			save()
		}
		return nil
	})
	save()
	if err != nil && ctx.Err() == nil {
		return fmt.Errorf("projector: %w", err)
	}
	return nil
}

func (p *Service) apply(ctx context.Context, ev schemas.Event, rebuilding bool) error {
	m := p.live[ev.Session]
	if m == nil && !rebuilding && ev.Type != schemas.TypeSessionStarted {
		var stored projections.Manifest
		err := p.bus.GetView(ctx, projections.ManifestKey(ev.Session), &stored)
		switch {
		case err == nil:
			m = &stored
		case errors.Is(err, bus.ErrNotFound):
		default:
			return err
		}
	}
	before := uint64(0)
	if m != nil {
		before = m.LastSeq
	}
	m = projections.FoldManifest(m, ev)
	if m == nil || m.LastSeq == before {
		return nil
	}
	if err := p.bus.PutView(ctx, projections.ManifestKey(ev.Session), m); err != nil {
		return err
	}
	// While rebuilding there is no stored view to fall back on, so ended
	// sessions stay cached (events may follow their end).
	if m.Terminal() && !rebuilding {
		delete(p.live, ev.Session)
	} else {
		p.live[ev.Session] = m
	}
	return nil
}
