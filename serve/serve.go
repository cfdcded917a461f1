// Package serve runs loopbus services in one process: any set of the
// orchestrator, validator, projector and agent workers on one bus, with
// Prometheus metrics beside them if asked, and, with Start, an embedded
// NATS server beside them.
//
// It is what `loopbus serve`, the single-service commands and an embedded
// `loopbus run` are built from, and what a Go program uses to run the whole
// of loopbus in-process (see the client package's example).
package serve

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/loopbus/loopbus/agentworker"
	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/metrics"
	"github.com/loopbus/loopbus/orchestrator"
	"github.com/loopbus/loopbus/projections/projector"
	"github.com/loopbus/loopbus/schemas"
	"github.com/loopbus/loopbus/tracing"
	"github.com/loopbus/loopbus/validator"
	"github.com/oklog/run"
	"github.com/rs/zerolog"
)

// Services is the set of services one process runs. The zero value runs
// none; All returns every service with Workers job slots.
type Services struct {
	Orchestrator, Validator, Projector bool
	// RebuildViews makes the projector recompute every view from the whole
	// stream before it keeps them current.
	RebuildViews bool
	// Workers is the number of jobs the agent worker runs at once; 0 runs
	// no agent worker.
	Workers int
	// Worker configures the agent worker; its Concurrency is Workers.
	Worker agentworker.Config
	// SecretEnv is added to the worker's and the validator's SecretEnv.
	SecretEnv []string
	// ValidatorAckWait: see validator.Config.AckWait.
	ValidatorAckWait time.Duration
	// ValidatorReuseWorkspaces: see validator.Config.ReuseWorkspaces.
	ValidatorReuseWorkspaces bool
	// Metrics, when its Listen address is set, adds a metrics service
	// (named "metrics") that follows the stream from this process and
	// serves /metrics there; the zero value serves none.
	Metrics metrics.Config
	// StallAfter: see orchestrator.Config.StallAfter.
	StallAfter time.Duration
	// OrchestratorMetrics are the orchestrator's own metrics (the
	// decisions its watchdog makes, how far it lags the stream); nil makes
	// them when Metrics are served here, and serves them with them. Set
	// it to serve them from a metrics service of its own (register it in
	// that one's Config.Collectors).
	OrchestratorMetrics *metrics.Orchestrator
	// Traces, when set, adds the tracing service (named "tracing"): it
	// follows the stream and exports spans over OTLP. One process of a
	// deployment should run it (serve, or the orchestrator's).
	Traces *tracing.Config
}

// All returns every service, with an agent worker of workers job slots.
func All(workers int) Services {
	return Services{Orchestrator: true, Validator: true, Projector: true, Workers: workers}
}

// Validate reports a set that cannot run.
func (s Services) Validate() error {
	if s.Workers < 0 {
		return fmt.Errorf("serve: workers must be >= 0, got %d", s.Workers)
	}
	if s.StallAfter < 0 {
		return fmt.Errorf("serve: stall bound must be >= 0, got %v", s.StallAfter)
	}
	if err := s.Metrics.Validate(); err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	if s.Traces != nil {
		if err := s.Traces.Validate(); err != nil {
			return fmt.Errorf("serve: %w", err)
		}
	}
	return nil
}

// SourceName is the CloudEvents source of a service in this process:
// loopbus/<service>/<host>-<pid>.
func SourceName(service string) string {
	host, _ := os.Hostname()
	return fmt.Sprintf("loopbus/%s/%s-%d", service, host, os.Getpid())
}

// Runner is one service: it runs until ctx ends.
type Runner interface {
	Run(ctx context.Context) error
}

// Named is a service with its name, as Build returns it.
type Named struct {
	Name string
	Runner
}

// Build constructs the services of s on b, each publishing under its own
// source name and logging with a "service" field.
func (s Services) Build(b *bus.Bus, log zerolog.Logger, now func() time.Time) ([]Named, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	var out []Named
	sub := func(name string) zerolog.Logger { return log.With().Str("service", name).Logger() }
	if s.Orchestrator {
		ocfg := orchestrator.Config{StallAfter: s.StallAfter}
		stalls := s.OrchestratorMetrics
		if stalls == nil && s.Metrics.Listen != "" {
			stalls = metrics.NewOrchestrator()
			s.Metrics.Collectors = append(slices.Clip(s.Metrics.Collectors), stalls)
		}
		if stalls != nil {
			ocfg.OnStall = stalls.Observe
		}
		o, err := orchestrator.New(ocfg, b.WithSource(SourceName("orchestrator")), sub("orchestrator"), now)
		if err != nil {
			return nil, err
		}
		if stalls != nil {
			stalls.Track(o.ReadSeq, b.LastSeq)
		}
		out = append(out, Named{"orchestrator", o})
	}
	if s.Validator {
		v, err := validator.New(validator.Config{SecretEnv: s.SecretEnv, AckWait: s.ValidatorAckWait, ReuseWorkspaces: s.ValidatorReuseWorkspaces}, b.WithSource(SourceName("validator")), sub("validator"), now)
		if err != nil {
			return nil, err
		}
		out = append(out, Named{"validator", v})
	}
	if s.Projector {
		p, err := projector.New(projector.Config{}, b.WithSource(SourceName("projector")), sub("projector"))
		if err != nil {
			return nil, err
		}
		var r Runner = p
		if s.RebuildViews {
			r = rebuildFirst{p}
		}
		out = append(out, Named{"projector", r})
	}
	if s.Workers > 0 {
		wc := s.Worker
		wc.Concurrency = s.Workers
		wc.SecretEnv = append(append([]string(nil), wc.SecretEnv...), s.SecretEnv...)
		w, err := agentworker.New(wc, b.WithSource(SourceName("agentworker")), sub("agentworker"), now)
		if err != nil {
			return nil, err
		}
		out = append(out, Named{"agentworker", w})
	}
	if s.Metrics.Listen != "" {
		m, err := metrics.New(s.Metrics, b, sub("metrics"))
		if err != nil {
			return nil, err
		}
		out = append(out, Named{"metrics", m})
	}
	if s.Traces != nil {
		tr, err := tracing.New(*s.Traces, b, sub("tracing"), now)
		if err != nil {
			return nil, err
		}
		out = append(out, Named{"tracing", tr})
	}
	return out, nil
}

// Add builds the services of s and puts one actor per service into g. An
// actor that returns before ctx ends (with or without an error) ends the
// group; errors of services stopped with the group are dropped.
func (s Services) Add(g *run.Group, ctx context.Context, b *bus.Bus, log zerolog.Logger, now func() time.Time) error {
	services, err := s.Build(b, log, now)
	if err != nil {
		return err
	}
	for _, sv := range services {
		actx, cancel := context.WithCancel(ctx)
		g.Add(func() error {
			// An error once the group stops is the stop, not a failure.
			if err := sv.Run(actx); err != nil && actx.Err() == nil {
				return fmt.Errorf("%s: %w", sv.Name, err)
			}
			if actx.Err() == nil {
				return fmt.Errorf("%s stopped", sv.Name)
			}
			return nil
		}, func(error) { cancel() })
	}
	return nil
}

// Run runs the services of s on b until ctx ends or one of them stops;
// with fn, until fn returns, fn's error being Run's. Services stop when Run
// returns. A service that fails or stops before ctx ends is an error.
func (s Services) Run(ctx context.Context, b *bus.Bus, log zerolog.Logger, fn func(ctx context.Context) error) error {
	var g run.Group
	if err := s.Add(&g, ctx, b, log, time.Now); err != nil {
		return err
	}
	if fn == nil {
		fn = func(ctx context.Context) error { <-ctx.Done(); return nil }
	}
	fctx, cancel := context.WithCancel(ctx)
	g.Add(func() error { return fn(fctx) }, func(error) { cancel() })
	return g.Run()
}

// rebuildFirst rebuilds every view, then keeps them current.
type rebuildFirst struct{ p *projector.Service }

func (r rebuildFirst) Run(ctx context.Context) error {
	if err := r.p.Rebuild(ctx); err != nil {
		return err
	}
	return r.p.Run(ctx)
}

// Config shapes Start: an embedded NATS server on DataDir and the services.
type Config struct {
	// Embedded is the embedded server; its DataDir is required.
	Embedded bus.EmbeddedConfig
	// Bus is the connection of the services; its URL is the embedded
	// server's, and it goes to it through memory (bus.Config.InProcess).
	Bus bus.Config
	// Services run beside the server; a set that runs no service at all
	// (metrics aside) means every service, with 4 job slots, and the
	// metrics asked for.
	Services Services
}

// Node is an embedded NATS server with loopbus's services running on it,
// as Start returns it.
type Node struct {
	srv    *bus.Embedded
	bus    *bus.Bus
	cancel context.CancelFunc
	done   chan struct{}
	err    error
}

// Start starts an embedded NATS server and every service of cfg.Services
// in this process, and returns once the server is ready; the services go
// on until Close. Use URL to connect clients.
func Start(ctx context.Context, cfg Config, log zerolog.Logger) (*Node, error) {
	if s := cfg.Services; !s.Orchestrator && !s.Validator && !s.Projector && s.Workers == 0 {
		w, m, tr := cfg.Services.Worker, cfg.Services.Metrics, cfg.Services.Traces
		cfg.Services = All(4)
		cfg.Services.Worker, cfg.Services.Metrics, cfg.Services.Traces = w, m, tr
	}
	srv, err := bus.StartEmbedded(cfg.Embedded, log)
	if err != nil {
		return nil, err
	}
	bc := cfg.Bus
	bc.URL, bc.InProcess = srv.URL(), srv.InProcess()
	if bc.Name == "" {
		bc.Name = "serve"
	}
	cat, err := schemas.NewCatalogue()
	if err != nil {
		srv.Shutdown()
		return nil, err
	}
	b, err := bus.Connect(ctx, bc, SourceName("serve"), cat, log)
	if err != nil {
		srv.Shutdown()
		return nil, err
	}
	rctx, cancel := context.WithCancel(context.Background())
	n := &Node{srv: srv, bus: b, cancel: cancel, done: make(chan struct{})}
	var g run.Group
	if err := cfg.Services.Add(&g, rctx, b, log, time.Now); err != nil {
		cancel()
		b.Close()
		srv.Shutdown()
		return nil, err
	}
	g.Add(func() error { <-rctx.Done(); return nil }, func(error) { cancel() })
	go func() {
		defer close(n.done)
		n.err = g.Run()
	}()
	return n, nil
}

// URL is the embedded server's client URL.
func (n *Node) URL() string { return n.srv.URL() }

// Close stops the services, then the server; it returns the first error
// a service ended with. It may be called more than once.
func (n *Node) Close() error {
	n.cancel()
	<-n.done
	n.bus.Close()
	n.srv.Shutdown()
	if errors.Is(n.err, context.Canceled) {
		return nil
	}
	return n.err
}
