package tracing

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/schemas"
	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// Defaults for Config's zero values.
const (
	DefaultServiceName      = "loopbus"
	DefaultLookback         = 24 * time.Hour
	DefaultMaxOpenSpans     = 10_000
	DefaultMaxEventsPerSpan = 32
	DefaultBatchTimeout     = 5 * time.Second
)

// TracerName is the instrumentation scope of the exported spans.
const TracerName = "github.com/loopbus/loopbus/tracing"

// Config of the tracing service. The zero value exports over OTLP/HTTP as
// the OTEL_EXPORTER_OTLP_* environment variables say, with the defaults
// below.
type Config struct {
	// Endpoint is the OTLP/HTTP traces URL, used as it is (e.g.
	// http://127.0.0.1:4318/v1/traces); empty means the environment's
	// (OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, or OTEL_EXPORTER_OTLP_ENDPOINT
	// with /v1/traces appended; the exporter's default is
	// http://localhost:4318/v1/traces). The exporter's other settings
	// (headers, timeout, compression, TLS) come from the environment.
	Endpoint string
	// Exporter, if set, receives the spans instead of an OTLP exporter
	// (another protocol, a file, a test); Run shuts it down.
	Exporter sdktrace.SpanExporter
	// ServiceName is the resource's service.name unless OTEL_SERVICE_NAME
	// (or service.name in OTEL_RESOURCE_ATTRIBUTES) says otherwise; empty
	// means DefaultServiceName.
	ServiceName string
	// Lookback is how far back in the stream Run starts reading, to find
	// the spans still open when it starts (a session started an hour ago
	// gets its whole root span). Spans that ended before Run started are
	// not exported again (an earlier run did). 0 means DefaultLookback.
	Lookback time.Duration
	// MaxOpenSpans bounds the spans held between their first and their
	// closing event; beyond it the oldest is dropped, unexported, with a
	// log line. 0 means DefaultMaxOpenSpans.
	MaxOpenSpans int
	// MaxEventsPerSpan bounds the events recorded on one span (each event
	// of the stream is a span event of its span); later ones are counted
	// in loopbus.events_dropped. 0 means DefaultMaxEventsPerSpan.
	MaxEventsPerSpan int
	// BatchTimeout is the longest an ended span waits before it is
	// exported. 0 means DefaultBatchTimeout.
	BatchTimeout time.Duration
	// Getenv reads the environment for the protocol check; nil means
	// os.Getenv.
	Getenv func(string) string
}

// ErrInvalidConfig: a Config value is out of range.
var ErrInvalidConfig = errors.New("tracing: invalid configuration")

// Validate reports the first invalid value, wrapping ErrInvalidConfig.
func (c Config) Validate() error {
	if c.Endpoint != "" {
		u, err := url.Parse(c.Endpoint)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("%w: endpoint %q: want an http or https URL, e.g. http://127.0.0.1:4318/v1/traces", ErrInvalidConfig, c.Endpoint)
		}
	}
	if c.Lookback < 0 || c.MaxOpenSpans < 0 || c.MaxEventsPerSpan < 0 || c.BatchTimeout < 0 {
		return fmt.Errorf("%w: negative lookback, bound or batch timeout", ErrInvalidConfig)
	}
	return nil
}

func (c Config) withDefaults() Config {
	if c.ServiceName == "" {
		c.ServiceName = DefaultServiceName
	}
	if c.Lookback == 0 {
		c.Lookback = DefaultLookback
	}
	if c.MaxOpenSpans == 0 {
		c.MaxOpenSpans = DefaultMaxOpenSpans
	}
	if c.MaxEventsPerSpan == 0 {
		c.MaxEventsPerSpan = DefaultMaxEventsPerSpan
	}
	if c.BatchTimeout == 0 {
		c.BatchTimeout = DefaultBatchTimeout
	}
	if c.Getenv == nil {
		c.Getenv = os.Getenv
	}
	return c
}

// Bus is what the tracing service needs from the event bus (*bus.Bus).
type Bus interface {
	Read(ctx context.Context, opts bus.ReadOptions, fn func(schemas.Event) error) error
}

// Service follows the event stream and exports its spans. Create it with
// New and call Run once.
type Service struct {
	cfg Config
	bus Bus
	log zerolog.Logger
	now func() time.Time
	ran atomic.Bool
}

// New returns a tracing service on b. now is the clock (nil means
// time.Now): spans that ended before Run started are not exported.
func New(cfg Config, b Bus, log zerolog.Logger, now func() time.Time) (*Service, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if b == nil {
		return nil, errors.New("tracing: bus is required")
	}
	cfg = cfg.withDefaults()
	if cfg.Exporter == nil {
		for _, name := range []string{EnvTracesProtocol, EnvProtocol} {
			switch p := strings.TrimSpace(cfg.Getenv(name)); p {
			case "", "http/protobuf", "http/json":
			default:
				return nil, fmt.Errorf("%w: %s=%s: loopbus exports over OTLP/HTTP only (http/protobuf, port 4318, or http/json)", ErrInvalidConfig, name, p)
			}
			if strings.TrimSpace(cfg.Getenv(name)) != "" {
				break // the traces-specific setting wins
			}
		}
	}
	if now == nil {
		now = time.Now
	}
	return &Service{cfg: cfg, bus: b, log: log, now: now}, nil
}

// Run reads the stream from Config.Lookback before now on, following it,
// and exports every span whose closing event the stream stored after Run
// started, until ctx ends; then it flushes the exporter (within 10 s) and
// returns nil.
// Spans still open then are not exported: the next run finds them again
// (within its lookback). It returns an error if the stream cannot be
// read. Export failures are logged, not returned. Run may be called only
// once.
func (s *Service) Run(ctx context.Context) error {
	if !s.ran.CompareAndSwap(false, true) {
		return errors.New("tracing: Run called twice")
	}
	start := s.now()
	exp, err := s.exporter(ctx)
	if err != nil {
		return err
	}
	res, err := resource.New(ctx,
		resource.WithTelemetrySDK(),
		resource.WithAttributes(attribute.String("service.name", s.cfg.ServiceName)),
		resource.WithFromEnv(), // OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES win
	)
	if err != nil {
		// A malformed OTEL_RESOURCE_ATTRIBUTES: res holds what parsed.
		s.log.Warn().Err(err).Msg("tracing: resource attributes from the environment")
	}
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(loggedExporter{exp: exp, log: s.log}, sdktrace.WithBatchTimeout(s.cfg.BatchTimeout)),
		sdktrace.WithIDGenerator(idGenerator{}),
		sdktrace.WithSampler(sdktrace.AlwaysSample()),
		sdktrace.WithResource(res),
	)
	defer func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		if err := tp.Shutdown(sctx); err != nil {
			s.log.Warn().Err(err).Msg("tracing: flushing spans at shutdown")
		}
	}()
	st := newSpans(s.cfg, tp.Tracer(TracerName), start, s.log, s.now)
	err = s.bus.Read(ctx, bus.ReadOptions{Follow: true, StartTime: start.Add(-s.cfg.Lookback), SkipSchema: true}, func(ev schemas.Event) error {
		if ev.ForkOf == "" { // a copy in a fork's history: the original's span
			st.handle(ev)
		}
		return nil
	})
	if err != nil && ctx.Err() == nil {
		return fmt.Errorf("tracing: %w", err)
	}
	return nil
}

func (s *Service) exporter(ctx context.Context) (sdktrace.SpanExporter, error) {
	if s.cfg.Exporter != nil {
		return s.cfg.Exporter, nil
	}
	var opts []otlptracehttp.Option
	if s.cfg.Endpoint != "" {
		opts = append(opts, otlptracehttp.WithEndpointURL(s.cfg.Endpoint))
	}
	exp, err := otlptracehttp.New(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("tracing: OTLP exporter: %w", err)
	}
	return exp, nil
}

// loggedExporter logs export failures itself rather than leaving them to
// OpenTelemetry's global error handler (this package sets no global).
type loggedExporter struct {
	exp sdktrace.SpanExporter
	log zerolog.Logger
}

func (e loggedExporter) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	if err := e.exp.ExportSpans(ctx, spans); err != nil {
		e.log.Warn().Err(err).Int("spans", len(spans)).Msg("tracing: exporting spans failed; they are dropped")
	}
	return nil
}

func (e loggedExporter) Shutdown(ctx context.Context) error { return e.exp.Shutdown(ctx) }

// idGenerator gives the SDK the ids the stream derives (bus.SpanOf),
// carried in the context of each span's start. Every span of the service
// starts with them; the random ids are a fallback that never serves.
type idGenerator struct{}

type idsKey struct{}

type wantIDs struct {
	trace trace.TraceID
	span  trace.SpanID
}

func (idGenerator) NewIDs(ctx context.Context) (trace.TraceID, trace.SpanID) {
	if w, ok := ctx.Value(idsKey{}).(wantIDs); ok {
		return w.trace, w.span
	}
	var tid trace.TraceID
	for !tid.IsValid() {
		for i := range tid {
			tid[i] = byte(rand.Uint32())
		}
	}
	return tid, randomSpanID()
}

func (idGenerator) NewSpanID(ctx context.Context, _ trace.TraceID) trace.SpanID {
	if w, ok := ctx.Value(idsKey{}).(wantIDs); ok {
		return w.span
	}
	return randomSpanID()
}

func randomSpanID() trace.SpanID {
	var sid trace.SpanID
	for !sid.IsValid() {
		for i := range sid {
			sid[i] = byte(rand.Uint32())
		}
	}
	return sid
}
