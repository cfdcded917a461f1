// Package projector keeps the projections' views current in the views
// bucket: it folds the event stream with the pure folds of package
// projections (session manifests, and the task lists of backlog sessions)
// and writes the results, each tagged with the stream sequence it
// reflects.
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

// checkpointKey holds the stream sequence up to which every view is
// materialized.
const checkpointKey = "_projector.manifests"

// Bus is what the projector needs from the event bus.
type Bus interface {
	Read(ctx context.Context, opts bus.ReadOptions, fn func(schemas.Event) error) error
	PutView(ctx context.Context, key string, v any) error
	// GetViewFromLeader, not GetView: the projector folds events onto
	// what it reads, so it must read the newest view, which a replica
	// that lags may not hold.
	GetViewFromLeader(ctx context.Context, key string, v any) error
}

// Config of the projector service. The zero value is usable.
type Config struct {
	// CheckpointEvery is how many events pass between checkpoint writes;
	// default 100. After a crash up to this many events are folded again,
	// which is harmless: each manifest carries the sequence it reflects.
	CheckpointEvery int
	// CatchUpBatch is how many events pass between view writes while the
	// projector catches up with a backlog (and while rebuilding): each
	// changed manifest is then written once per batch instead of once per
	// event; default 10,000. Once caught up, every event is written at once.
	CatchUpBatch int
}

// ErrInvalidConfig: a Config value is out of range.
var ErrInvalidConfig = errors.New("projector: invalid configuration")

// Validate reports the first invalid value, wrapping ErrInvalidConfig.
func (c Config) Validate() error {
	if c.CheckpointEvery < 0 || c.CatchUpBatch < 0 {
		return fmt.Errorf("%w: negative checkpoint or catch-up interval", ErrInvalidConfig)
	}
	return nil
}

// Service keeps every session manifest, and the task list of every backlog
// session, in the views bucket current with the stream. Views are derived
// data: Rebuild (or deleting the checkpoint) recomputes them from the
// stream.
type Service struct {
	cfg Config
	bus Bus
	log zerolog.Logger
	// live caches the views of running sessions; terminal ones are dropped
	// after they are written.
	live map[string]*views
	// dirty: sessions whose views changed since the last flush while
	// catching up.
	dirty map[string]bool
}

// views are one session's views: its manifest and, for a backlog session,
// its task list (nil otherwise).
type views struct {
	m     *projections.Manifest
	tasks *projections.TaskList
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
	if cfg.CatchUpBatch == 0 {
		cfg.CatchUpBatch = 10_000
	}
	return &Service{cfg: cfg, bus: b, log: log, live: map[string]*views{}, dirty: map[string]bool{}}, nil
}

type checkpoint struct {
	Seq uint64 `json:"seq"`
	// Version is the manifest format the views were written in; Tasks the
	// task list format (0: written before task lists were projected).
	Version int `json:"version"`
	Tasks   int `json:"tasks,omitempty"`
}

// current reports whether the views were written in the formats of this
// projector.
func (cp checkpoint) current() bool {
	return cp.Version == projections.ManifestVersion && cp.Tasks == projections.TaskListVersion
}

// Run materializes the views from the checkpoint on until ctx ends. Views
// written in another manifest or task list format are recomputed from the
// start of the stream.
func (p *Service) Run(ctx context.Context) error {
	var cp checkpoint
	if err := p.bus.GetViewFromLeader(ctx, checkpointKey, &cp); err != nil && !errors.Is(err, bus.ErrNotFound) {
		return fmt.Errorf("projector: %w", err)
	}
	if cp.Seq > 0 && !cp.current() {
		p.log.Info().Int("from", cp.Version).Int("to", projections.ManifestVersion).
			Int("tasks_from", cp.Tasks).Int("tasks_to", projections.TaskListVersion).
			Msg("views are of another format; recomputing them from the stream")
		cp.Seq = 0
	}
	return p.run(ctx, cp.Seq, true)
}

// Rebuild recomputes every view from the start of the stream, then returns
// (it does not follow).
func (p *Service) Rebuild(ctx context.Context) error {
	p.live, p.dirty = map[string]*views{}, map[string]bool{}
	defer func() { p.live, p.dirty = map[string]*views{}, map[string]bool{} }()
	return p.run(ctx, 0, false)
}

func (p *Service) run(ctx context.Context, from uint64, follow bool) error {
	rebuilding := !follow
	catchingUp := true // until the read reaches the head: write views in batches
	n := 0
	var last uint64
	start := time.Now()
	save := func() error {
		if last == 0 {
			return nil
		}
		// Views first: the checkpoint promises they reflect the stream up
		// to it. Saved also while stopping, so a restart resumes here.
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if err := p.flush(sctx, rebuilding); err != nil {
			return err
		}
		if err := p.bus.PutView(sctx, checkpointKey, checkpoint{Seq: last, Version: projections.ManifestVersion, Tasks: projections.TaskListVersion}); err != nil {
			p.log.Warn().Err(err).Msg("could not save projector checkpoint")
		}
		return nil
	}
	err := p.bus.Read(ctx, bus.ReadOptions{
		StartSeq:   from + 1,
		Follow:     follow,
		DeadLetter: "projector",
		SkipSchema: true,
		OnCaughtUp: func() {
			catchingUp = false
			if err := retry(ctx, p.log, "write the views", save); err != nil {
				return // ctx ended; the checkpoint says where to resume
			}
			p.log.Info().Uint64("seq", max(last, from)).Int("events", n).Dur("took", time.Since(start)).Msg("views caught up")
		},
	}, func(ev schemas.Event) error {
		batch := catchingUp || rebuilding
		// The event is folded once; a failed read of a stored view or a
		// failed write (the server is restarting, say) is retried:
		// skipping it would leave the view wrong until rebuilt.
		if err := retry(ctx, p.log, "read a view", func() error { return p.apply(ctx, ev, rebuilding) }); err != nil {
			return err
		}
		if !batch {
			if err := retry(ctx, p.log, "write a view", func() error { return p.flush(ctx, rebuilding) }); err != nil {
				return err
			}
		}
		last = ev.Seq
		n++
		every := p.cfg.CheckpointEvery
		if batch {
			every = p.cfg.CatchUpBatch
		}
		if n%every == 0 {
			if batch {
				p.log.Info().Int("events", n).Uint64("seq", last).Dur("took", time.Since(start)).Msg("catching up")
			}
			return retry(ctx, p.log, "write the views", save)
		}
		return nil
	})
	serr := save()
	if err != nil && ctx.Err() == nil {
		return fmt.Errorf("projector: %w", err)
	}
	if serr != nil && ctx.Err() == nil {
		return fmt.Errorf("projector: %w", serr)
	}
	return nil
}

// retry runs fn until it succeeds or ctx ends, backing off up to 5s.
func retry(ctx context.Context, log zerolog.Logger, what string, fn func() error) error {
	for attempt := 0; ; attempt++ {
		err := fn()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if attempt == 0 {
			log.Warn().Err(err).Msgf("could not %s; retrying", what)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(min(time.Duration(attempt+1)*200*time.Millisecond, 5*time.Second)):
		}
	}
}

// flush writes the changed views (one session's, once caught up; a
// batch's while catching up). A session stays marked until its views are
// written; the task list is written after the manifest, so a retry writes
// both again.
func (p *Service) flush(ctx context.Context, rebuilding bool) error {
	for session := range p.dirty {
		v := p.live[session]
		if v.m != nil {
			if err := p.bus.PutView(ctx, projections.ManifestKey(session), v.m); err != nil {
				return err
			}
		}
		if v.tasks != nil {
			if err := p.bus.PutView(ctx, projections.TasksKey(session), v.tasks); err != nil {
				return err
			}
		}
		delete(p.dirty, session)
		// While rebuilding there is no stored view to fall back on, so
		// ended sessions stay cached (events may follow their end).
		if v.m.Terminal() && !rebuilding {
			delete(p.live, session)
		}
	}
	return nil
}

// apply folds ev into its session's views and marks them for the next
// flush. It fails only before folding (reading stored views), so a retry
// never folds an event twice.
func (p *Service) apply(ctx context.Context, ev schemas.Event, rebuilding bool) error {
	v := p.live[ev.Session]
	if v == nil {
		v = &views{}
		// A session.started too: one of a session that ended (and is no
		// longer cached), forged or a fork's copy, folds into its stored
		// view (which ignores it) rather than starting one over it.
		if !rebuilding {
			var err error
			if v.m, err = getView[projections.Manifest](ctx, p.bus, projections.ManifestKey(ev.Session)); err != nil {
				return err
			}
			// Only a backlog session has a task list to read back.
			if v.m != nil && v.m.Kind == schemas.KindBacklog {
				if v.tasks, err = getView[projections.TaskList](ctx, p.bus, projections.TasksKey(ev.Session)); err != nil {
					return err
				}
			}
			// Views of another format are computed anew from the start.
			if start := ev.Type == schemas.TypeSessionStarted; start && v.m != nil && v.m.Version != projections.ManifestVersion {
				v.m, v.tasks = nil, nil
			} else if start && v.tasks != nil && v.tasks.Version != projections.TaskListVersion {
				v.tasks = nil
			}
		}
	}
	var before, tasksBefore uint64
	if v.m != nil {
		before = v.m.LastSeq
	}
	if v.tasks != nil {
		tasksBefore = v.tasks.LastSeq
	}
	v.m = projections.FoldManifest(v.m, ev)
	v.tasks = projections.FoldTasks(v.tasks, ev)
	changed := v.m != nil && v.m.LastSeq != before || v.tasks != nil && v.tasks.LastSeq != tasksBefore
	if !changed {
		return nil
	}
	p.live[ev.Session] = v
	p.dirty[ev.Session] = true
	return nil
}

// getView reads the stored view under key, as the bucket's leader holds
// it: nil when there is none.
func getView[T any](ctx context.Context, b Bus, key string) (*T, error) {
	var v T
	err := b.GetViewFromLeader(ctx, key, &v)
	switch {
	case err == nil:
		return &v, nil
	case errors.Is(err, bus.ErrNotFound):
		return nil, nil
	}
	return nil, err
}
