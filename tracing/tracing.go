// Package tracing turns loopbus's event stream into OpenTelemetry traces:
// one trace per session, a span per step iteration and per job, tool
// calls as child spans of their job.
//
// Every event carries the CloudEvents distributed-tracing extension
// traceparent (bus.Encode sets it), naming the span the event belongs to.
// Its ids are pure functions of the event's own attributes (bus.SpanOf),
// so a subscriber joins the trace from the event alone: SpanOf here gives
// the span of an event and its parent as OpenTelemetry span contexts.
//
// A Service follows the stream and exports the spans over OTLP/HTTP,
// configured by the standard OTEL_EXPORTER_OTLP_* environment variables.
// Only one process of a deployment should run it: spans have
// deterministic ids, and a second exporter would send each span twice.
package tracing

import (
	"strings"

	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/schemas"
	"go.opentelemetry.io/otel/trace"
)

// SpanOf returns the span ev belongs to as a remote, sampled span context,
// and the id of that span's parent (invalid for a session's root span).
// A subscriber that wants its own work in the session's trace starts a
// span under sc:
//
//	ctx = trace.ContextWithRemoteSpanContext(ctx, sc)
//	ctx, span := tracer.Start(ctx, "my-reaction")
//
// It is the traceparent the event carries, computed instead of parsed:
// events published by other tools may carry none, or their own.
func SpanOf(ev schemas.Event) (sc trace.SpanContext, parent trace.SpanID) {
	ref := bus.SpanOf(ev)
	if p, ok := ref.Parent(); ok {
		parent = p.SpanID()
	}
	return spanContext(ref), parent
}

// spanContext is ref's span as a remote, sampled span context.
func spanContext(ref bus.SpanRef) trace.SpanContext {
	return trace.NewSpanContext(trace.SpanContextConfig{
		TraceID:    ref.TraceID(),
		SpanID:     ref.SpanID(),
		TraceFlags: trace.FlagsSampled,
		Remote:     true,
	})
}

// Environment variables of the OTLP exporter that Enabled reads; the
// exporter reads the others of the OpenTelemetry specification
// (OTEL_EXPORTER_OTLP_HEADERS, _TIMEOUT, _COMPRESSION, _CERTIFICATE, …,
// and their _TRACES_ forms) itself.
const (
	EnvEndpoint       = "OTEL_EXPORTER_OTLP_ENDPOINT"
	EnvTracesEndpoint = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
	EnvProtocol       = "OTEL_EXPORTER_OTLP_PROTOCOL"
	EnvTracesProtocol = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
	EnvTracesExporter = "OTEL_TRACES_EXPORTER"
	EnvSDKDisabled    = "OTEL_SDK_DISABLED"
)

// Enabled reports whether the environment (getenv, e.g. os.Getenv) asks
// for span export: an OTLP endpoint is set (OTEL_EXPORTER_OTLP_ENDPOINT
// or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT), and neither OTEL_SDK_DISABLED=true
// nor OTEL_TRACES_EXPORTER=none turns it off.
func Enabled(getenv func(string) string) bool {
	if strings.EqualFold(strings.TrimSpace(getenv(EnvSDKDisabled)), "true") ||
		strings.EqualFold(strings.TrimSpace(getenv(EnvTracesExporter)), "none") {
		return false
	}
	return strings.TrimSpace(getenv(EnvEndpoint)) != "" || strings.TrimSpace(getenv(EnvTracesEndpoint)) != ""
}
