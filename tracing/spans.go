package tracing

import (
	"container/list"
	"context"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/schemas"
	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// maxAttrBytes bounds a string attribute taken from event data.
const maxAttrBytes = 256

// maxAttempts bounds the job attempts an iteration span remembers for its
// jobs' spans.
const maxAttempts = 16

// spanKey identifies a span.
type spanKey struct {
	trace trace.TraceID
	span  trace.SpanID
}

func keyOf(ref bus.SpanRef) spanKey { return spanKey{trace: ref.TraceID(), span: ref.SpanID()} }

// openSpan is a span between its first event and its closing one: nothing
// of it reaches the SDK before it ends, so a span that never ends costs
// no export and a span that ended before the service started is not
// exported again.
type openSpan struct {
	ref   bus.SpanRef
	key   spanKey
	start time.Time
	// name: the pipeline of a root span, the tool of a tool span.
	name    string
	attrs   []attribute.KeyValue
	events  []spanEvent
	dropped int
	status  codes.Code
	desc    string
	// backend and attempts (by job id) of an iteration, for its jobs.
	backend  string
	attempts map[string]int
	elem     *list.Element
}

type spanEvent struct {
	name  string
	at    time.Time
	attrs []attribute.KeyValue
}

// set sets attribute kv, replacing an earlier value of its key.
func (sp *openSpan) set(kvs ...attribute.KeyValue) {
next:
	for _, kv := range kvs {
		for i := range sp.attrs {
			if sp.attrs[i].Key == kv.Key {
				sp.attrs[i] = kv
				continue next
			}
		}
		sp.attrs = append(sp.attrs, kv)
	}
}

func (sp *openSpan) fail(desc string) {
	sp.status, sp.desc = codes.Error, clip(desc)
}

// spans turns events into spans. Only the goroutine reading the stream
// uses it.
type spans struct {
	cfg    Config
	tracer trace.Tracer
	// start: spans whose closing event was stored before it are not
	// exported.
	start time.Time
	log   zerolog.Logger
	now   func() time.Time

	open map[spanKey]*openSpan
	// age holds the open spans, oldest first.
	age *list.List
	// sessions: the open spans of each session.
	sessions map[string]map[spanKey]*openSpan
	// ended remembers spans that ended (or were dropped), the newest
	// len(endedRing) of them, so a late event does not open them again.
	ended     map[spanKey]struct{}
	endedRing []spanKey
	endedNext int

	drops       int64
	lastDropLog time.Time
}

func newSpans(cfg Config, tracer trace.Tracer, start time.Time, log zerolog.Logger, now func() time.Time) *spans {
	return &spans{
		cfg: cfg, tracer: tracer, start: start, log: log, now: now,
		open: map[spanKey]*openSpan{}, age: list.New(), sessions: map[string]map[spanKey]*openSpan{},
		ended: map[spanKey]struct{}{}, endedRing: make([]spanKey, 0, min(4*cfg.MaxOpenSpans, 1024)),
	}
}

// handle applies one event: it ends the spans the event ends, opens or
// updates the span it belongs to, and ends that span on its closing
// event.
func (s *spans) handle(ev schemas.Event) {
	ref := bus.SpanOf(ev)
	at := ev.Time
	if at.IsZero() {
		at = ev.Stored
	}
	switch d := ev.Data.(type) {
	case *schemas.JobRequested:
		// The step moved on to another iteration, or a new round.
		if ref.Kind == bus.SpanIteration {
			s.endIterations(ev, at, ref.Step, ref.Iteration, "")
		}
	case *schemas.StepFailed:
		s.endIterations(ev, at, or(ev.Step, d.Step), "", "step failed: "+d.Error)
	case *schemas.StepInvalidated:
		s.endIterations(ev, at, or(ev.Step, d.Step), "", "")
	}
	if sp := s.span(ref, at); sp != nil {
		s.record(sp, ev, at)
		if closes(ref.Kind, ev.Type) {
			s.end(sp, ev, at)
		}
	}
	if sessionEnds(ev.Type) {
		s.endSession(ev, at)
	}
}

func or(s, otherwise string) string {
	if s == "" {
		return otherwise
	}
	return s
}

// sessionEnds reports whether an event of type typ ends its session's
// trace: it completed, failed, stopped or was closed for good.
func sessionEnds(typ string) bool {
	switch typ {
	case schemas.TypeSessionCompleted, schemas.TypeSessionFailed, schemas.TypeSessionStopped, schemas.TypeSessionClosed:
		return true
	}
	return false
}

// closes reports whether an event of type typ ends the span of kind it
// belongs to.
func closes(kind bus.SpanKind, typ string) bool {
	switch kind {
	case bus.SpanSession:
		return sessionEnds(typ)
	case bus.SpanIteration:
		return typ == schemas.TypeStepCompleted
	case bus.SpanJob:
		return typ == schemas.TypeJobCompleted || typ == schemas.TypeJobFailed
	case bus.SpanTool:
		return typ == schemas.TypeToolCompleted
	}
	return false
}

// span returns ref's open span, opening it at at; nil if it has ended.
func (s *spans) span(ref bus.SpanRef, at time.Time) *openSpan {
	key := keyOf(ref)
	if sp := s.open[key]; sp != nil {
		return sp
	}
	if _, ok := s.ended[key]; ok {
		return nil
	}
	for len(s.open) >= s.cfg.MaxOpenSpans {
		s.dropOldest()
	}
	sp := &openSpan{ref: ref, key: key, start: at}
	sp.set(attribute.String("loopbus.session", ref.Session))
	if ref.Kind != bus.SpanSession {
		sp.set(attribute.String("loopbus.step", clip(ref.Step)), attribute.String("loopbus.iteration", clip(ref.Iteration)))
	}
	if ref.Kind == bus.SpanJob || ref.Kind == bus.SpanTool {
		sp.set(attribute.String("loopbus.job", clip(ref.Job)))
	}
	if ref.Kind == bus.SpanTool {
		sp.set(attribute.String("loopbus.tool.id", clip(ref.Tool)))
	}
	if ref.Kind == bus.SpanJob {
		// What the job's request said, if its iteration is open.
		if p, ok := ref.Parent(); ok {
			if it := s.open[keyOf(p)]; it != nil {
				if it.backend != "" {
					sp.set(attribute.String("loopbus.backend", it.backend))
				}
				if a := it.attempts[ref.Job]; a > 0 {
					sp.set(attribute.Int("loopbus.attempt", a))
				}
			}
		}
	}
	sp.elem = s.age.PushBack(sp)
	s.open[key] = sp
	bySession := s.sessions[ref.Session]
	if bySession == nil {
		bySession = map[spanKey]*openSpan{}
		s.sessions[ref.Session] = bySession
	}
	bySession[key] = sp
	return sp
}

// dropOldest forgets the oldest open span, unexported.
func (s *spans) dropOldest() {
	sp := s.age.Front().Value.(*openSpan)
	s.forget(sp)
	s.drops++
	if now := s.now(); s.drops == 1 || now.Sub(s.lastDropLog) >= 10*time.Second {
		s.lastDropLog = now
		s.log.Warn().Int("max_open_spans", s.cfg.MaxOpenSpans).Int64("dropped", s.drops).
			Str("session", sp.ref.Session).Str("span", sp.ref.Kind.String()).
			Msg("tracing: too many open spans; dropping the oldest unexported")
	}
}

// forget removes sp from the open spans and remembers it as ended.
func (s *spans) forget(sp *openSpan) {
	s.age.Remove(sp.elem)
	delete(s.open, sp.key)
	if bySession := s.sessions[sp.ref.Session]; bySession != nil {
		delete(bySession, sp.key)
		if len(bySession) == 0 {
			delete(s.sessions, sp.ref.Session)
		}
	}
	if len(s.endedRing) < 4*s.cfg.MaxOpenSpans {
		s.endedRing = append(s.endedRing, sp.key)
	} else {
		delete(s.ended, s.endedRing[s.endedNext])
		s.endedRing[s.endedNext] = sp.key
		s.endedNext = (s.endedNext + 1) % len(s.endedRing)
	}
	s.ended[sp.key] = struct{}{}
}

// endIterations ends the open iteration spans of the step of ev's session
// except the one named keep, failing them with failure if it is not
// empty.
func (s *spans) endIterations(ev schemas.Event, at time.Time, step, keep, failure string) {
	for _, sp := range s.sessions[ev.Session] {
		if sp.ref.Kind == bus.SpanIteration && sp.ref.Step == step && sp.ref.Iteration != keep {
			if failure != "" {
				sp.fail(failure)
			}
			s.end(sp, ev, at)
		}
	}
}

// endSession ends every span of ev's session still open, children first.
func (s *spans) endSession(ev schemas.Event, at time.Time) {
	for _, kind := range []bus.SpanKind{bus.SpanTool, bus.SpanJob, bus.SpanIteration, bus.SpanSession} {
		for _, sp := range s.sessions[ev.Session] {
			if sp.ref.Kind == kind {
				sp.set(attribute.Bool("loopbus.unfinished", true))
				s.end(sp, ev, at)
			}
		}
	}
}

// end ends sp at at, the time of ev, and exports it unless ev was stored
// before the service started.
func (s *spans) end(sp *openSpan, ev schemas.Event, at time.Time) {
	s.forget(sp)
	if !ev.Stored.IsZero() && ev.Stored.Before(s.start) {
		return // an earlier run exported it
	}
	ctx := context.WithValue(context.Background(), idsKey{}, wantIDs{trace: sp.key.trace, span: sp.key.span})
	if p, ok := sp.ref.Parent(); ok {
		ctx = trace.ContextWithRemoteSpanContext(ctx, spanContext(p))
	}
	if at.Before(sp.start) {
		at = sp.start
	}
	_, span := s.tracer.Start(ctx, spanName(sp), trace.WithTimestamp(sp.start),
		trace.WithSpanKind(trace.SpanKindInternal), trace.WithAttributes(sp.attrs...))
	for _, e := range sp.events {
		span.AddEvent(e.name, trace.WithTimestamp(e.at), trace.WithAttributes(e.attrs...))
	}
	if sp.dropped > 0 {
		span.SetAttributes(attribute.Int("loopbus.events_dropped", sp.dropped))
	}
	if sp.status != codes.Unset {
		span.SetStatus(sp.status, sp.desc)
	}
	span.End(trace.WithTimestamp(at))
}

// spanName is low in cardinality: the kind and the pipeline, step or
// tool name.
func spanName(sp *openSpan) string {
	switch sp.ref.Kind {
	case bus.SpanIteration:
		return "step " + clip(sp.ref.Step)
	case bus.SpanJob:
		return "job " + clip(sp.ref.Step)
	case bus.SpanTool:
		return "tool " + or(sp.name, "?")
	}
	return strings.TrimSpace("session " + sp.name)
}

// record adds what ev says to sp: attributes, status, and ev as a span
// event.
func (s *spans) record(sp *openSpan, ev schemas.Event, at time.Time) {
	var extra []attribute.KeyValue
	switch d := ev.Data.(type) {
	case *schemas.SessionStarted:
		sp.name = clip(d.Pipeline.Name)
		sp.set(attribute.String("loopbus.pipeline", sp.name), attribute.String("loopbus.pipeline.kind", clip(or(d.Pipeline.Kind, "pipeline"))))
	case *schemas.SessionCompleted:
		sp.set(attribute.String("loopbus.status", "completed"))
	case *schemas.SessionFailed:
		sp.set(attribute.String("loopbus.status", "failed"))
		sp.fail(d.Reason)
	case *schemas.SessionStopped:
		sp.set(attribute.String("loopbus.status", "stopped"), attribute.String("loopbus.stop.kind", clip(d.Kind)))
		extra = append(extra, attribute.String("loopbus.reason", clip(d.Reason)))
	case *schemas.StepFailed:
		extra = append(extra, attribute.String("loopbus.step", clip(d.Step)), attribute.String("loopbus.error", clip(d.Error)))
	case *schemas.JobRequested:
		sp.backend = clip(d.Agent.Backend)
		sp.set(attribute.Int("loopbus.iteration.number", d.Iteration), attribute.Int("loopbus.round", d.Round),
			attribute.String("loopbus.backend", sp.backend))
		if sp.attempts == nil {
			sp.attempts = map[string]int{}
		}
		if len(sp.attempts) < maxAttempts {
			sp.attempts[d.JobID] = d.Attempt
		}
		extra = append(extra, attribute.String("loopbus.job", clip(d.JobID)), attribute.Int("loopbus.attempt", d.Attempt))
	case *schemas.JobCancelled:
		extra = append(extra, attribute.String("loopbus.job", clip(d.JobID)), attribute.String("loopbus.reason", clip(d.Reason)))
	case *schemas.Verdict:
		result := "passed"
		if ev.Type == schemas.TypeValidationFailed {
			result = "failed"
			first := "validation failed"
			if len(d.Errors) > 0 {
				first += ": " + d.Errors[0].String()
			}
			sp.fail(first)
		} else {
			sp.status, sp.desc = codes.Unset, ""
		}
		sp.set(attribute.String("loopbus.validation", result), attribute.Int("loopbus.validation.errors", len(d.Errors)))
	case *schemas.StepWaiting:
		extra = append(extra, attribute.String("loopbus.until", d.Until.UTC().Format(time.RFC3339)), attribute.String("loopbus.reason", clip(d.Reason)))
	case *schemas.StepCompleted:
		sp.status, sp.desc = codes.Unset, ""
		sp.set(attribute.String("loopbus.status", "completed"), attribute.Int("loopbus.iterations", d.Iterations))
	case *schemas.JobStarted:
		sp.set(attribute.String("loopbus.worker", clip(d.Worker)), attribute.Int("loopbus.delivery", d.Delivery))
	case *schemas.JobHeartbeat:
		extra = append(extra, attribute.String("loopbus.worker", clip(d.Worker)))
	case *schemas.JobReleased:
		extra = append(extra, attribute.String("loopbus.worker", clip(d.Worker)), attribute.String("loopbus.reason", clip(d.Reason)))
	case *schemas.ArtifactStored:
		extra = append(extra, attribute.String("loopbus.artifact", clip(d.Artifact.Name)), attribute.Int64("loopbus.artifact.size", d.Artifact.Size))
	case *schemas.JobCompleted:
		sp.set(attribute.String("loopbus.status", "completed"), attribute.String("loopbus.worker", clip(d.Worker)),
			attribute.Int("loopbus.exit_code", d.ExitCode), attribute.Int64("loopbus.duration_ms", d.DurationMs),
			attribute.Int("loopbus.artifacts", len(d.Artifacts)))
		setUsage(sp, d.Usage)
	case *schemas.JobFailed:
		sp.set(attribute.String("loopbus.status", "failed"), attribute.String("loopbus.worker", clip(d.Worker)),
			attribute.Int("loopbus.exit_code", d.ExitCode), attribute.Int64("loopbus.duration_ms", d.DurationMs),
			attribute.Bool("loopbus.retryable", d.Retryable), attribute.Bool("loopbus.rate_limited", d.RateLimited),
			attribute.Bool("loopbus.cancelled", d.Cancelled))
		setUsage(sp, d.Usage)
		sp.fail(d.Error)
	case *schemas.ToolStarted:
		sp.name = clip(d.Name)
		sp.set(attribute.String("loopbus.tool.name", sp.name), attribute.String("loopbus.tool.lane", clip(d.Lane)))
	case *schemas.ToolCompleted:
		sp.name = or(sp.name, clip(d.Name))
		sp.set(attribute.String("loopbus.tool.name", sp.name), attribute.String("loopbus.tool.lane", clip(d.Lane)),
			attribute.String("loopbus.status", clip(d.Status)), attribute.Int("loopbus.exit_code", d.ExitCode),
			attribute.Int64("loopbus.duration_ms", d.DurationMs))
		if d.Status != "ok" {
			sp.fail(or(d.Error, d.Status))
		}
	}
	if len(sp.events) >= s.cfg.MaxEventsPerSpan {
		sp.dropped++
		return
	}
	attrs := append([]attribute.KeyValue{attribute.String("loopbus.event.id", clip(ev.ID)), attribute.Int64("loopbus.event.seq", int64(ev.Seq))}, extra...)
	sp.events = append(sp.events, spanEvent{name: strings.TrimPrefix(ev.Type, "loopbus."), at: at, attrs: attrs})
}

// setUsage sets a job's token and cost attributes.
func setUsage(sp *openSpan, u *schemas.Usage) {
	if u == nil {
		return
	}
	sp.set(attribute.Int64("gen_ai.usage.input_tokens", u.InputTokens), attribute.Int64("gen_ai.usage.output_tokens", u.OutputTokens),
		attribute.Int64("loopbus.usage.cached_tokens", u.CachedTokens), attribute.Float64("loopbus.usage.cost_usd", u.CostUSD))
}

// clip bounds a string taken from event data: valid UTF-8, at most
// maxAttrBytes bytes.
func clip(s string) string {
	if !utf8.ValidString(s) {
		s = strings.ToValidUTF8(s, "\uFFFD")
	}
	if len(s) <= maxAttrBytes {
		return s
	}
	cut := maxAttrBytes
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}
