package tracing_test

import (
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/loopbus/loopbus/internal/testnats"
	"github.com/loopbus/loopbus/schemas"
	"github.com/loopbus/loopbus/tracing"
	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
)

// TestServiceExportsSpans runs the service against a real bus and an OTLP
// HTTP endpoint, publishes two sessions, and checks the exported spans'
// parent links: tool → job → step iteration → session, all in the
// session's trace, with the ids a subscriber computes from each event.
func TestServiceExportsSpans(t *testing.T) {
	t.Parallel()
	b, _ := testnats.Bus(t)
	col := newCollector(t)
	t0 := time.Now() // the service's start: the events come after it
	svc, err := tracing.New(tracing.Config{Endpoint: col.URL + "/v1/traces", BatchTimeout: 20 * time.Millisecond, ServiceName: "loopbus-test"},
		b, testnats.Logger(t), func() time.Time { return t0 })
	if err != nil {
		t.Fatal(err)
	}
	testnats.Run(t, "tracing", svc.Run)

	sb := newBuilder(t, b)
	sb.passingSession("s-pass")
	sb.failingSession("s-fail")

	// The spans a subscriber expects, from the events alone.
	type want struct {
		trace, parent string
		first, last   schemas.Event
	}
	wants := map[string]*want{}
	for _, ev := range sb.evs {
		sc, parent := tracing.SpanOf(ev)
		id := sc.SpanID().String()
		w := wants[id]
		if w == nil {
			w = &want{trace: sc.TraceID().String(), first: ev}
			if parent.IsValid() {
				w.parent = parent.String()
			}
			wants[id] = w
		}
		w.last = ev
	}
	// s-pass: root, 2 iterations, 2 jobs, 3 tool calls; s-fail: root, 1
	// iteration (2 attempts), 2 jobs, 1 tool call.
	if len(wants) != 13 {
		t.Fatalf("the events name %d spans, want 13", len(wants))
	}
	var got map[string]*tracepb.Span
	await(t, 10*time.Second, func() error {
		got = col.exported(t)
		if len(got) < len(wants) {
			return fmt.Errorf("%d of %d spans exported", len(got), len(wants))
		}
		return nil
	})
	if len(got) != len(wants) {
		t.Errorf("%d spans exported, want %d", len(got), len(wants))
	}
	for id, w := range wants {
		sp := got[id]
		if sp == nil {
			t.Errorf("span %s (of %s) not exported", id, w.first.Type)
			continue
		}
		if tid := hex.EncodeToString(sp.GetTraceId()); tid != w.trace {
			t.Errorf("span %s %q: trace %s, want %s", id, sp.GetName(), tid, w.trace)
		}
		if pid := hex.EncodeToString(sp.GetParentSpanId()); pid != w.parent {
			t.Errorf("span %s %q: parent %q, want %q", id, sp.GetName(), pid, w.parent)
		}
		if start := time.Unix(0, int64(sp.GetStartTimeUnixNano())); !start.Equal(w.first.Time) {
			t.Errorf("span %s %q starts %v, want its first event's time %v (%s)", id, sp.GetName(), start, w.first.Time, w.first.Type)
		}
	}

	// The links by event type, checked without SpanOf's help for the
	// parents: each span's parent is the span of the event that opened
	// the level above.
	spanOf := func(ev schemas.Event) *tracepb.Span {
		t.Helper()
		sc, _ := tracing.SpanOf(ev)
		sp := got[sc.SpanID().String()]
		if sp == nil {
			t.Fatalf("no span for %s %s", ev.Type, ev.Job)
		}
		return sp
	}
	byType := func(session, typ string) []schemas.Event {
		var out []schemas.Event
		for _, ev := range sb.evs {
			if ev.Session == session && ev.Type == typ {
				out = append(out, ev)
			}
		}
		return out
	}
	for _, session := range []string{"s-pass", "s-fail"} {
		root := spanOf(byType(session, schemas.TypeSessionStarted)[0])
		if len(root.GetParentSpanId()) != 0 {
			t.Errorf("%s: root span has a parent", session)
		}
		for _, ev := range sb.evs {
			if ev.Session != session {
				continue
			}
			sp := spanOf(ev)
			if !bytes.Equal(sp.GetTraceId(), root.GetTraceId()) {
				t.Errorf("%s: %s is in trace %x, the session in %x", session, ev.Type, sp.GetTraceId(), root.GetTraceId())
			}
			var parent *tracepb.Span
			switch ev.Type {
			case schemas.TypeJobRequested:
				parent = root
			case schemas.TypeJobStarted:
				parent = spanOf(requestOf(t, sb.evs, ev.Job))
			case schemas.TypeToolStarted:
				parent = spanOf(startedOf(t, sb.evs, ev.Job))
			default:
				continue
			}
			if !bytes.Equal(sp.GetParentSpanId(), parent.GetSpanId()) {
				t.Errorf("%s: span %q of %s %s has parent %x, want %q %x", session, sp.GetName(), ev.Type, ev.Job,
					sp.GetParentSpanId(), parent.GetName(), parent.GetSpanId())
			}
		}
	}

	// What the spans say.
	pass := func(typ string, i int) *tracepb.Span { return spanOf(byType("s-pass", typ)[i]) }
	fail := func(typ string, i int) *tracepb.Span { return spanOf(byType("s-fail", typ)[i]) }
	checks := []struct {
		what string
		sp   *tracepb.Span
		name string
		code tracepb.Status_StatusCode
		attr map[string]string
	}{
		{"s-pass root", pass(schemas.TypeSessionStarted, 0), "session demo", tracepb.Status_STATUS_CODE_UNSET,
			map[string]string{"loopbus.session": "s-pass", "loopbus.pipeline": "demo", "loopbus.status": "completed"}},
		{"s-pass iteration 1", pass(schemas.TypeJobRequested, 0), "step draft", tracepb.Status_STATUS_CODE_ERROR,
			map[string]string{"loopbus.step": "draft", "loopbus.iteration": "1", "loopbus.iteration.number": "1", "loopbus.validation": "failed", "loopbus.backend": "exec"}},
		{"s-pass iteration 2", pass(schemas.TypeJobRequested, 1), "step draft", tracepb.Status_STATUS_CODE_UNSET,
			map[string]string{"loopbus.iteration": "2", "loopbus.validation": "passed", "loopbus.status": "completed", "loopbus.iterations": "2"}},
		{"s-pass job 1", pass(schemas.TypeJobStarted, 0), "job draft", tracepb.Status_STATUS_CODE_UNSET,
			map[string]string{"loopbus.job": "s-pass.draft.1", "loopbus.worker": "w1", "loopbus.backend": "exec", "loopbus.attempt": "1",
				"loopbus.exit_code": "0", "loopbus.status": "completed", "gen_ai.usage.input_tokens": "100", "gen_ai.usage.output_tokens": "20",
				"loopbus.usage.cost_usd": "0.01"}},
		{"s-pass tool", pass(schemas.TypeToolStarted, 1), "tool run", tracepb.Status_STATUS_CODE_UNSET,
			map[string]string{"loopbus.tool.id": "t2", "loopbus.tool.name": "run", "loopbus.tool.lane": "shell", "loopbus.status": "ok"}},
		{"s-fail root", fail(schemas.TypeSessionStarted, 0), "session demo", tracepb.Status_STATUS_CODE_ERROR,
			map[string]string{"loopbus.status": "failed"}},
		{"s-fail iteration", fail(schemas.TypeJobRequested, 1), "step draft", tracepb.Status_STATUS_CODE_ERROR,
			map[string]string{"loopbus.iteration": "1"}},
		{"s-fail job attempt 2", fail(schemas.TypeJobStarted, 1), "job draft", tracepb.Status_STATUS_CODE_ERROR,
			map[string]string{"loopbus.job": "s-fail.draft.1.a2", "loopbus.attempt": "2", "loopbus.exit_code": "3", "loopbus.retryable": "false"}},
	}
	for _, c := range checks {
		if c.sp.GetName() != c.name {
			t.Errorf("%s: name %q, want %q", c.what, c.sp.GetName(), c.name)
		}
		if code := c.sp.GetStatus().GetCode(); code != c.code {
			t.Errorf("%s: status %v (%q), want %v", c.what, code, c.sp.GetStatus().GetMessage(), c.code)
		}
		for k, v := range c.attr {
			if got := attr(c.sp, k); got != v {
				t.Errorf("%s: %s = %q, want %q", c.what, k, got, v)
			}
		}
	}
	// The attempts of one iteration share its span.
	if a, b := fail(schemas.TypeJobRequested, 0), fail(schemas.TypeJobRequested, 1); !bytes.Equal(a.GetSpanId(), b.GetSpanId()) {
		t.Error("the two attempts of s-fail's iteration 1 have two spans")
	}
	if msg := fail(schemas.TypeJobRequested, 0).GetStatus().GetMessage(); !strings.Contains(msg, "agent exited 3") {
		t.Errorf("s-fail iteration status %q does not say why the step failed", msg)
	}
	// Spans end at their closing event.
	root := pass(schemas.TypeSessionStarted, 0)
	if end, want := time.Unix(0, int64(root.GetEndTimeUnixNano())), byType("s-pass", schemas.TypeSessionCompleted)[0].Time; !end.Equal(want) {
		t.Errorf("root ends %v, want session.completed's %v", end, want)
	}
	// Events are span events of their span.
	var names []string
	for _, e := range pass(schemas.TypeJobStarted, 0).GetEvents() {
		names = append(names, e.GetName())
	}
	if want := "job.started artifact.stored job.completed"; !containsInOrder(names, strings.Fields(want)) {
		t.Errorf("job span events %v, want %s among them", names, want)
	}
	col.mu.Lock()
	services := col.services
	col.mu.Unlock()
	for _, s := range services {
		if s != "loopbus-test" {
			t.Errorf("resource service.name %q", s)
		}
	}
}

func containsInOrder(have, want []string) bool {
	i := 0
	for _, h := range have {
		if i < len(want) && h == want[i] {
			i++
		}
	}
	return i == len(want)
}

func requestOf(t *testing.T, evs []schemas.Event, job string) schemas.Event {
	t.Helper()
	for _, ev := range evs {
		if ev.Type == schemas.TypeJobRequested && ev.Job == job {
			return ev
		}
	}
	t.Fatalf("no job.requested for %s", job)
	return schemas.Event{}
}

func startedOf(t *testing.T, evs []schemas.Event, job string) schemas.Event {
	t.Helper()
	for _, ev := range evs {
		if ev.Type == schemas.TypeJobStarted && ev.Job == job {
			return ev
		}
	}
	t.Fatalf("no job.started for %s", job)
	return schemas.Event{}
}

// memExport runs a service exporting to memory.
func memExport(t *testing.T, cfg tracing.Config, b tracing.Bus, log zerolog.Logger) *tracetest.InMemoryExporter {
	t.Helper()
	exp := tracetest.NewInMemoryExporter()
	cfg.Exporter, cfg.BatchTimeout = exp, 10*time.Millisecond
	t0 := time.Now() // the service's start, whenever Run gets to run
	svc, err := tracing.New(cfg, b, log, func() time.Time { return t0 })
	if err != nil {
		t.Fatal(err)
	}
	testnats.Run(t, "tracing", svc.Run)
	return exp
}

// spanIDs returns the exported spans by id.
func spanIDs(exp *tracetest.InMemoryExporter) map[trace.SpanID]tracetest.SpanStub {
	out := map[trace.SpanID]tracetest.SpanStub{}
	for _, s := range exp.GetSpans() {
		out[s.SpanContext.SpanID()] = s
	}
	return out
}

// TestServiceExportsOnlyNewEnds: spans that ended before the service
// started were exported by an earlier run; a span open then is exported
// when it ends, from its first event (within the lookback).
func TestServiceExportsOnlyNewEnds(t *testing.T) {
	t.Parallel()
	b, _ := testnats.Bus(t)
	sb := newBuilder(t, b)
	sb.passingSession("old")
	sb.start("open")
	openStart := sb.evs[len(sb.evs)-1]
	exp := memExport(t, tracing.Config{}, b, testnats.Logger(t))

	sb.at = time.Now().UTC() // after the service's start
	sb.add("open", schemas.TypeSessionCompleted, "", "", &schemas.SessionCompleted{Final: []schemas.ArtifactRef{}})
	sb.passingSession("new")
	rootOf := func(session string) trace.SpanID {
		sc, _ := tracing.SpanOf(schemas.Event{Type: schemas.TypeSessionStarted, Session: session})
		return sc.SpanID()
	}
	await(t, 10*time.Second, func() error {
		if n := len(exp.GetSpans()); n < 9 {
			return fmt.Errorf("%d of 9 spans exported", n)
		}
		return nil
	})
	got := spanIDs(exp)
	if len(got) != 9 || len(exp.GetSpans()) != 9 {
		t.Errorf("%d spans exported (%d distinct), want new's 8 and open's root", len(exp.GetSpans()), len(got))
	}
	for _, s := range got {
		if sess := attrOf(s, "loopbus.session"); sess == "old" {
			t.Errorf("span %q of session old, which ended before the service started, exported", s.Name)
		}
	}
	open, ok := got[rootOf("open")]
	if !ok {
		t.Fatal("the root span of session open, open when the service started, not exported")
	}
	if !open.StartTime.Equal(openStart.Time) {
		t.Errorf("open's root starts %v, want its session.started's %v", open.StartTime, openStart.Time)
	}
}

// TestServiceEndsClosedSessions: a session closed for good ends its trace:
// the root span and what was open of it are exported.
func TestServiceEndsClosedSessions(t *testing.T) {
	t.Parallel()
	b, _ := testnats.Bus(t)
	exp := memExport(t, tracing.Config{}, b, testnats.Logger(t))
	sb := newBuilder(t, b)
	sb.start("closing")
	job := sb.request("closing", 1, 1, 0)
	sb.started("closing", job, "w1")
	sb.add("closing", schemas.TypeSessionClosed, "", "", &schemas.SessionClosed{Reason: "not needed"})
	await(t, 10*time.Second, func() error {
		if n := len(exp.GetSpans()); n < 3 {
			return fmt.Errorf("%d of 3 spans exported", n)
		}
		return nil
	})
	root, _ := tracing.SpanOf(schemas.Event{Type: schemas.TypeSessionStarted, Session: "closing"})
	if _, ok := spanIDs(exp)[root.SpanID()]; !ok {
		t.Error("the closed session's root span was not exported")
	}
}

func attrOf(s tracetest.SpanStub, key string) string {
	for _, kv := range s.Attributes {
		if string(kv.Key) == key {
			return kv.Value.Emit()
		}
	}
	return ""
}

// TestServiceBoundsOpenSpans: beyond MaxOpenSpans the oldest open span is
// dropped with a log line, and its later events open nothing again; a
// late event of an ended span does not export it twice.
func TestServiceBoundsOpenSpans(t *testing.T) {
	t.Parallel()
	b, _ := testnats.Bus(t)
	var logs testnats.SyncBuffer
	exp := memExport(t, tracing.Config{MaxOpenSpans: 2}, b, zerolog.New(&logs))
	sb := newBuilder(t, b)
	for _, s := range []string{"s1", "s2", "s3"} {
		sb.start(s)
	}
	for _, s := range []string{"s1", "s2", "s3"} {
		sb.add(s, schemas.TypeSessionCompleted, "", "", &schemas.SessionCompleted{Final: []schemas.ArtifactRef{}})
	}
	// A late event of s3's ended root, then a job of s3 in full.
	sb.add("s3", schemas.TypeSessionResumed, "", "", &schemas.SessionResumed{Reason: "late"})
	job := sb.request("s3", 1, 1, 0)
	sb.started("s3", job, "w1")
	sb.failed("s3", job, 1, false)
	sb.add("s3", schemas.TypeJobHeartbeat, "draft", job, &schemas.JobHeartbeat{JobID: job, Worker: "w1", Delivery: 1})
	sb.add("s3", schemas.TypeSessionFailed, "", "", &schemas.SessionFailed{Reason: "done"})

	await(t, 10*time.Second, func() error {
		if n := len(exp.GetSpans()); n < 4 {
			return fmt.Errorf("%d of 4 spans exported", n)
		}
		return nil
	})
	// s2 and s3's roots, s3's iteration (ended, unfinished, by
	// session.failed) and job; never s1's.
	stubs := exp.GetSpans()
	var names []string
	for _, s := range stubs {
		names = append(names, attrOf(s, "loopbus.session")+":"+s.Name)
	}
	if len(stubs) != 4 || len(spanIDs(exp)) != 4 {
		t.Errorf("exported %v, want s2's and s3's roots, s3's iteration and job, once each", names)
	}
	for _, n := range names {
		if strings.HasPrefix(n, "s1:") {
			t.Errorf("s1's dropped span exported: %v", names)
		}
	}
	if !strings.Contains(logs.String(), "too many open spans") {
		t.Errorf("no log line for the dropped span; logs:\n%s", logs.String())
	}
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	for _, c := range []tracing.Config{
		{Endpoint: "collector:4318"},
		{Endpoint: "grpc://collector:4317"},
		{Endpoint: "http://"},
		{Lookback: -time.Second},
		{MaxOpenSpans: -1},
		{MaxEventsPerSpan: -1},
		{BatchTimeout: -1},
	} {
		if err := c.Validate(); !errors.Is(err, tracing.ErrInvalidConfig) {
			t.Errorf("Validate(%+v) = %v, want ErrInvalidConfig", c, err)
		}
	}
	for _, c := range []tracing.Config{{}, {Endpoint: "https://collector.example:4318/v1/traces", Lookback: time.Hour, MaxOpenSpans: 5}} {
		if err := c.Validate(); err != nil {
			t.Errorf("Validate(%+v) = %v", c, err)
		}
	}
}

func TestNewRefusesGRPC(t *testing.T) {
	t.Parallel()
	b, _ := testnats.Bus(t)
	env := func(kv ...string) func(string) string {
		return func(k string) string {
			for i := 0; i+1 < len(kv); i += 2 {
				if kv[i] == k {
					return kv[i+1]
				}
			}
			return ""
		}
	}
	if _, err := tracing.New(tracing.Config{Getenv: env(tracing.EnvProtocol, "grpc")}, b, zerolog.Nop(), nil); !errors.Is(err, tracing.ErrInvalidConfig) {
		t.Errorf("OTEL_EXPORTER_OTLP_PROTOCOL=grpc: New = %v, want ErrInvalidConfig", err)
	}
	// The traces-specific setting wins.
	if _, err := tracing.New(tracing.Config{Getenv: env(tracing.EnvProtocol, "grpc", tracing.EnvTracesProtocol, "http/protobuf")}, b, zerolog.Nop(), nil); err != nil {
		t.Errorf("traces protocol http/protobuf over grpc: New = %v", err)
	}
	if _, err := tracing.New(tracing.Config{}, nil, zerolog.Nop(), nil); err == nil {
		t.Error("New without a bus succeeded")
	}
}

func TestEnabled(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		env  map[string]string
		want bool
	}{
		{map[string]string{}, false},
		{map[string]string{tracing.EnvEndpoint: "http://127.0.0.1:4318"}, true},
		{map[string]string{tracing.EnvTracesEndpoint: "http://127.0.0.1:4318/v1/traces"}, true},
		{map[string]string{tracing.EnvEndpoint: " "}, false},
		{map[string]string{tracing.EnvEndpoint: "http://127.0.0.1:4318", tracing.EnvSDKDisabled: "true"}, false},
		{map[string]string{tracing.EnvEndpoint: "http://127.0.0.1:4318", tracing.EnvTracesExporter: "none"}, false},
		{map[string]string{tracing.EnvEndpoint: "http://127.0.0.1:4318", tracing.EnvTracesExporter: "otlp"}, true},
	} {
		if got := tracing.Enabled(func(k string) string { return c.env[k] }); got != c.want {
			t.Errorf("Enabled(%v) = %v, want %v", c.env, got, c.want)
		}
	}
}
