// Package metrics serves Prometheus metrics (the text format on /metrics)
// fed from the event stream: a Service follows the stream from its start
// and counts events, jobs, durations, tokens, cost, rate limits and breaker
// opens; at each scrape it asks JetStream for the pending and redelivered
// counts of the services' durable consumers and for the number of dead
// letters. Every metric is named loopbus_…; docs/OBSERVABILITY.md
// lists them.
//
// Label values taken from event data (agent backends, event types) are
// bounded (see Config.MaxLabelValues), and so is the state kept to measure
// durations (Config.MaxTracked), so a hostile stream cannot make the
// registry or the service grow without bound.
package metrics

import (
	"context"
	"errors"
	"fmt"
	stdlog "log"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/schemas"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/rs/zerolog"
)

// Path is where the metrics are served.
const Path = "/metrics"

// Defaults for Config's zero values.
const (
	DefaultScrapeTimeout  = 2 * time.Second
	DefaultMaxLabelValues = 16
	DefaultMaxTracked     = 10_000
)

// MaxConsumers bounds the consumers reported by name; the counts of the
// others (by name order) are summed as consumer "other".
const MaxConsumers = 32

// Label values that stand for many.
const (
	// Other replaces a label value once the bound on distinct values is
	// reached, and any value too long or not valid UTF-8.
	Other = "other"
	// Unknown is the backend of a job whose job.requested was not seen
	// (or no longer tracked, see Config.MaxTracked).
	Unknown = "unknown"
)

// maxLabelBytes bounds the length of a label value taken from event data.
const maxLabelBytes = 64

// Config of the metrics service. The zero value serves no HTTP (mount
// Handler elsewhere) and uses the defaults below.
type Config struct {
	// Listen is the host:port /metrics is served on while Run runs; empty
	// serves nothing (Handler can be mounted on another server). Port 0
	// picks a free port (see OnListen). A non-loopback address is allowed
	// (the metrics are read-only) and logged as such.
	Listen string
	// OnListen, if set, is called once with the listener's address when
	// Run starts serving /metrics.
	OnListen func(addr string)
	// ScrapeTimeout bounds the JetStream requests of one scrape (consumer
	// and dead-letter counts); 0 means DefaultScrapeTimeout. Counts not
	// fetched in time are left out and loopbus_jetstream_up is 0.
	ScrapeTimeout time.Duration
	// MaxLabelValues bounds the distinct values of a label taken from
	// event data (the backend label), beyond the known backends; later
	// values count as "other". 0 means DefaultMaxLabelValues.
	MaxLabelValues int
	// MaxTracked bounds the jobs and steps whose start is remembered to
	// measure step and validation durations; beyond it the oldest are
	// forgotten (their durations are not observed). 0 means
	// DefaultMaxTracked.
	MaxTracked int
	// Consumers names the durable consumers of the event stream whose
	// counts are reported; empty means every durable consumer (listing
	// them needs the $JS.API.CONSUMER.LIST permission); see MaxConsumers.
	Consumers []string
	// DLQStream is the dead-letter stream's name; empty means
	// bus.DefaultDLQStream.
	DLQStream string
	// Collectors are registered beside the stream-fed metrics: those of
	// services in this process that are not in the stream (e.g.
	// metrics.Orchestrator).
	Collectors []prometheus.Collector
}

// ErrInvalidConfig: a Config value is out of range.
var ErrInvalidConfig = errors.New("metrics: invalid configuration")

// Validate reports the first invalid value, wrapping ErrInvalidConfig.
func (c Config) Validate() error {
	if c.Listen != "" {
		if _, _, err := net.SplitHostPort(c.Listen); err != nil {
			return fmt.Errorf("%w: listen address %q: want host:port (e.g. 127.0.0.1:9464 or :9464)", ErrInvalidConfig, c.Listen)
		}
	}
	if c.ScrapeTimeout < 0 || c.MaxLabelValues < 0 || c.MaxTracked < 0 {
		return fmt.Errorf("%w: negative scrape timeout or bound", ErrInvalidConfig)
	}
	for _, name := range c.Consumers {
		if name == "" {
			return fmt.Errorf("%w: empty consumer name", ErrInvalidConfig)
		}
	}
	for _, col := range c.Collectors {
		if col == nil {
			return fmt.Errorf("%w: nil collector", ErrInvalidConfig)
		}
	}
	return nil
}

func (c Config) withDefaults() Config {
	if c.ScrapeTimeout == 0 {
		c.ScrapeTimeout = DefaultScrapeTimeout
	}
	if c.MaxLabelValues == 0 {
		c.MaxLabelValues = DefaultMaxLabelValues
	}
	if c.MaxTracked == 0 {
		c.MaxTracked = DefaultMaxTracked
	}
	if c.DLQStream == "" {
		c.DLQStream = bus.DefaultDLQStream
	}
	return c
}

// Bus is what the metrics service needs from the event bus (*bus.Bus).
type Bus interface {
	Read(ctx context.Context, opts bus.ReadOptions, fn func(schemas.Event) error) error
	JetStream() jetstream.JetStream
	StreamName() string
	Catalogue() *schemas.Catalogue
}

// Service counts the event stream into a private Prometheus registry and
// serves it. Create it with New and call Run once.
type Service struct {
	cfg     Config
	bus     Bus
	log     zerolog.Logger
	handler http.Handler
	// counts is only touched by the goroutine reading the stream.
	counts *streamCounts
	ran    atomic.Bool
}

// New returns a metrics service on b. It registers its metrics, the Go
// runtime's and the process's in a registry of its own (never the global
// default one).
func New(cfg Config, b Bus, log zerolog.Logger) (*Service, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if b == nil {
		return nil, errors.New("metrics: bus is required")
	}
	cfg = cfg.withDefaults()
	reg := prometheus.NewRegistry()
	counts := newStreamCounts(b.Catalogue(), cfg)
	js := newJetStreamCollector(b.JetStream(), b.StreamName(), cfg, log)
	for _, c := range append([]prometheus.Collector{
		counts, js,
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	}, cfg.Collectors...) {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("metrics: %w", err)
		}
	}
	h := promhttp.HandlerFor(reg, promhttp.HandlerOpts{
		ErrorLog:            stdlog.New(log.With().Str("component", "promhttp").Logger(), "", 0),
		ErrorHandling:       promhttp.ContinueOnError,
		Registry:            reg,
		MaxRequestsInFlight: 4,
		Timeout:             cfg.ScrapeTimeout + 5*time.Second,
	})
	return &Service{cfg: cfg, bus: b, log: log, handler: h, counts: counts}, nil
}

// Handler serves the metrics in the Prometheus text format (or another
// format the scraper asks for). It can be mounted on any server, whether
// or not Config.Listen is set; the stream-fed metrics move only while Run
// runs.
func (s *Service) Handler() http.Handler { return s.handler }

// Run follows the event stream from its start, counting every event the
// bus delivers, and, with Config.Listen, serves /metrics there, until ctx
// ends; then it shuts the HTTP server down and returns nil. It returns an
// error if the address cannot be listened on, the server fails or the
// stream cannot be read. Malformed events are skipped (the services
// dead-letter them) and counted in loopbus_malformed_events_total. Run may
// be called only once.
func (s *Service) Run(ctx context.Context) error {
	if !s.ran.CompareAndSwap(false, true) {
		return errors.New("metrics: Run called twice")
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := func() error { return nil }
	if s.cfg.Listen != "" {
		var err error
		if stop, err = s.serve(cancel); err != nil {
			return err
		}
	}
	err := s.bus.Read(rctx, bus.ReadOptions{
		Follow: true,
		OnSkip: func(_ string, seq uint64) { s.counts.skipped(seq) },
	}, func(ev schemas.Event) error {
		s.counts.count(ev)
		return nil
	})
	cancel()
	if serr := stop(); serr != nil {
		return serr
	}
	if err != nil && ctx.Err() == nil {
		return fmt.Errorf("metrics: %w", err)
	}
	return nil
}

// serve listens on Config.Listen and serves /metrics in a goroutine. If
// the server fails it calls failed. stop shuts the server down, waits for
// it and returns its failure, if any.
func (s *Service) serve(failed func()) (stop func() error, err error) {
	ln, err := net.Listen("tcp", s.cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	addr := ln.Addr().String()
	if loopback(ln.Addr()) {
		s.log.Info().Str("addr", addr).Msg("serving " + Path)
	} else {
		s.log.Warn().Str("addr", addr).Msg("serving " + Path + " on a non-loopback address: whoever reaches it can read the metrics")
	}
	mux := http.NewServeMux()
	mux.Handle(Path, s.handler)
	srv := &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          stdlog.New(s.log.With().Str("component", "http").Logger(), "", 0),
	}
	done := make(chan error, 1)
	go func() {
		err := srv.Serve(ln)
		if errors.Is(err, http.ErrServerClosed) {
			err = nil
		} else {
			err = fmt.Errorf("metrics: serve %s: %w", addr, err)
			failed()
		}
		done <- err
	}()
	if s.cfg.OnListen != nil {
		s.cfg.OnListen(addr)
	}
	return func() error {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := srv.Shutdown(sctx); err != nil {
			_ = srv.Close()
		}
		return <-done
	}, nil
}

// loopback reports whether addr is a loopback address.
func loopback(addr net.Addr) bool {
	ta, ok := addr.(*net.TCPAddr)
	return ok && ta.IP.IsLoopback()
}
