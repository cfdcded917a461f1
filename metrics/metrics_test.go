package metrics_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/client"
	"github.com/loopbus/loopbus/definition"
	"github.com/loopbus/loopbus/internal/testnats"
	"github.com/loopbus/loopbus/metrics"
	"github.com/loopbus/loopbus/projections"
	"github.com/loopbus/loopbus/schemas"
	"github.com/loopbus/loopbus/serve"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// families is one scrape, parsed.
type families map[string]*dto.MetricFamily

// scrape gets url and parses it with the Prometheus text parser.
func scrape(url string) (families, error) {
	resp, err := http.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
		return nil, fmt.Errorf("GET %s: content type %q, want the text format", url, ct)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	return p.TextToMetricFamilies(resp.Body)
}

// await scrapes url until cond accepts the scrape, for at most 10 s.
func await(t *testing.T, url string, cond func(families) error) families {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		fams, err := scrape(url)
		if err == nil {
			if err = cond(fams); err == nil {
				return fams
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("metrics at %s: %v", url, err)
		}
		<-tick.C
	}
}

// labels is a metric's label set.
type labels map[string]string

// find returns the metric of family name whose labels include want.
func (f families) find(name string, want labels) (*dto.Metric, bool) {
	fam, ok := f[name]
	if !ok {
		return nil, false
	}
	for _, m := range fam.GetMetric() {
		got := labels{}
		for _, lp := range m.GetLabel() {
			got[lp.GetName()] = lp.GetValue()
		}
		match := len(got) == len(want)
		for k, v := range want {
			if got[k] != v {
				match = false
			}
		}
		if match {
			return m, true
		}
	}
	return nil, false
}

// value is a counter's or gauge's value; NaN if there is no such series.
func (f families) value(name string, l labels) float64 {
	m, ok := f.find(name, l)
	switch {
	case !ok:
		return math.NaN()
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	}
	return math.NaN()
}

// histogram is a histogram's sample count and sum; -1 if there is none.
func (f families) histogram(name string, l labels) (uint64, float64) {
	m, ok := f.find(name, l)
	if !ok || m.Histogram == nil {
		return 0, -1
	}
	return m.Histogram.GetSampleCount(), m.Histogram.GetSampleSum()
}

// want checks a counter's or gauge's value.
func want(t *testing.T, f families, name string, l labels, v float64) {
	t.Helper()
	if got := f.value(name, l); math.Abs(got-v) > 1e-9 || math.IsNaN(got) {
		t.Errorf("%s%v = %v, want %v", name, l, got, v)
	}
}

// wantHistogram checks a histogram's count and sum (sum < 0: unchecked).
func wantHistogram(t *testing.T, f families, name string, l labels, count uint64, sum float64) {
	t.Helper()
	gotCount, gotSum := f.histogram(name, l)
	if gotCount != count || (sum >= 0 && math.Abs(gotSum-sum) > 1e-9) {
		t.Errorf("%s%v: count %d sum %v, want count %d sum %v", name, l, gotCount, gotSum, count, sum)
	}
}

// start runs a metrics service on b serving on a free loopback port and
// returns its URL and the stop of its Run.
func start(t *testing.T, b metrics.Bus, cfg metrics.Config) (string, func()) {
	t.Helper()
	addrs := make(chan string, 1)
	cfg.Listen = "127.0.0.1:0"
	cfg.OnListen = func(a string) { addrs <- a }
	svc, err := metrics.New(cfg, b, testnats.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	stop := testnats.Run(t, "metrics", svc.Run)
	select {
	case a := <-addrs:
		return "http://" + a + metrics.Path, stop
	case <-time.After(10 * time.Second):
		t.Fatal("the metrics service did not listen")
	}
	return "", nil
}

// caughtUp accepts a scrape once the service has read the stream up to
// b's last event.
func caughtUp(ctx context.Context, b *bus.Bus) func(families) error {
	return func(f families) error {
		last, err := b.LastSeq(ctx)
		if err != nil {
			return err
		}
		if got := f.value("loopbus_metrics_sequence", labels{}); got != float64(last) {
			return fmt.Errorf("read up to %v, the stream holds %d", got, last)
		}
		return nil
	}
}

// wantEventsByType checks loopbus_events_total against the events in the
// stream: one series per known type, equal to the count of that type.
func wantEventsByType(t *testing.T, f families, evs []schemas.Event) {
	t.Helper()
	byType := map[string]float64{}
	for _, ev := range evs {
		byType[ev.Type]++
	}
	cat, err := schemas.NewCatalogue()
	if err != nil {
		t.Fatal(err)
	}
	for _, typ := range cat.Types() {
		want(t, f, "loopbus_events_total", labels{"type": typ}, byType[typ])
	}
	if n := len(f["loopbus_events_total"].GetMetric()); n != len(cat.Types()) {
		t.Errorf("loopbus_events_total has %d series, want one per known type (%d)", n, len(cat.Types()))
	}
}

func TestCountsTheStream(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, _ := testnats.Bus(t)

	// A durable consumer that exists but takes nothing: what reaches its
	// subjects stays pending.
	idleConsumer(t, ctx, b, "idle", "loopbus.evt.*.tool.started")
	// A durable consumer that hands its event back once, then holds the
	// redelivery until the test ends.
	redelivered := make(chan struct{})
	testnats.Run(t, "redeliver", func(ctx context.Context) error {
		return b.Consume(ctx, bus.ConsumerConfig{Durable: "redeliver", Subjects: []string{"loopbus.evt.*.agent.message"}},
			func(ctx context.Context, d bus.Delivery) error {
				if d.NumDelivered == 1 {
					return bus.Release(time.Millisecond)
				}
				close(redelivered)
				<-ctx.Done()
				return ctx.Err()
			})
	})

	url, stop := start(t, b, metrics.Config{MaxLabelValues: 1})

	at := time.Now()
	n := 0
	publish := func(typ string, data any) {
		t.Helper()
		n++
		ev := schemas.Event{ID: fmt.Sprintf("ev-%d", n), Type: typ, Session: "s1", Time: at, Data: data}
		if _, err := b.Publish(ctx, ev); err != nil {
			t.Fatalf("publish %s: %v", typ, err)
		}
	}
	request := func(job, step, backend string) {
		publish(schemas.TypeJobRequested, &schemas.JobRequested{JobID: job, Step: step, Iteration: 1,
			Agent: schemas.AgentSpec{Backend: backend}, Prompt: "p", TimeoutMs: 1000})
	}
	request("j1", "a", schemas.BackendExec)
	request("j2", "b", schemas.BackendClaude)
	request("j3", "c", "weird-1") // the one value beyond the known backends MaxLabelValues allows
	request("j4", "d", "weird-2") // one too many: "other"
	request("j5", "e", schemas.BackendExec)
	for _, job := range []string{"j1", "j2", "j5"} {
		publish(schemas.TypeJobStarted, &schemas.JobStarted{JobID: job, Worker: "w", Delivery: 1})
	}
	publish(schemas.TypeJobCompleted, &schemas.JobCompleted{JobID: "j1", Step: "a", Iteration: 1, Worker: "w", DurationMs: 1500,
		Usage: &schemas.Usage{InputTokens: 100, CachedTokens: 40, OutputTokens: 20, CostUSD: 0.25}})
	publish(schemas.TypeValidationPassed, &schemas.Verdict{JobID: "j1", Step: "a", Iteration: 1})
	publish(schemas.TypeStepCompleted, &schemas.StepCompleted{Step: "a", JobID: "j1", Iterations: 1, ContentHash: "0123456789abcdef"})
	publish(schemas.TypeJobFailed, &schemas.JobFailed{JobID: "j2", Step: "b", Iteration: 1, Worker: "w", DurationMs: 500,
		Error: "usage limit", RateLimited: true, Usage: &schemas.Usage{InputTokens: 10, CostUSD: 0.5}})
	publish(schemas.TypeStepWaiting, &schemas.StepWaiting{Step: "b", JobID: "j2", Until: at.Add(time.Hour), Reason: "usage limit"})
	publish(schemas.TypeJobFailed, &schemas.JobFailed{JobID: "j3", Step: "c", Iteration: 1, Worker: "w", ExitCode: -1, Error: "cancelled", Cancelled: true})
	publish(schemas.TypeJobFailed, &schemas.JobFailed{JobID: "j4", Step: "d", Iteration: 1, Worker: "w", ExitCode: 1, DurationMs: 2000, Error: "exit 1"})
	publish(schemas.TypeStepPaused, &schemas.StepPaused{Step: "c", Kind: schemas.PauseBreaker, Reason: "3 identical failures"})
	publish(schemas.TypeStepFailed, &schemas.StepFailed{Step: "d", Iterations: 1, Error: "exit 1"})
	publish(schemas.TypeToolStarted, &schemas.ToolStarted{JobID: "j1", ToolID: "t1", Name: "run"})
	publish(schemas.TypeToolStarted, &schemas.ToolStarted{JobID: "j1", ToolID: "t2", Name: "run"})
	publish(schemas.TypeAgentMessage, &schemas.AgentMessage{JobID: "j1", Text: "hello"})
	// A malformed message, dead-lettered by a reader as the services do.
	if _, err := b.JetStream().Publish(ctx, "loopbus.evt.s1.job.completed", []byte("not a cloudevent")); err != nil {
		t.Fatal(err)
	}
	if err := b.Read(ctx, bus.ReadOptions{DeadLetter: "test"}, func(schemas.Event) error { return nil }); err != nil {
		t.Fatal(err)
	}
	select {
	case <-redelivered:
	case <-ctx.Done():
		t.Fatal("no redelivery")
	}

	f := await(t, url, caughtUp(ctx, b))
	wantEventsByType(t, f, testnats.Events(t, b))
	want(t, f, "loopbus_malformed_events_total", labels{}, 1)

	want(t, f, "loopbus_jobs_total", labels{"backend": "exec", "outcome": "completed"}, 1)
	want(t, f, "loopbus_jobs_total", labels{"backend": "claude", "outcome": "failed"}, 1)
	want(t, f, "loopbus_jobs_total", labels{"backend": "weird-1", "outcome": "cancelled"}, 1)
	want(t, f, "loopbus_jobs_total", labels{"backend": "other", "outcome": "failed"}, 1)
	// Each known backend's three outcomes from the start, and the two
	// series beyond them.
	if n := len(f["loopbus_jobs_total"].GetMetric()); n != 5*3+2 {
		t.Errorf("loopbus_jobs_total has %d series, want 17", n)
	}
	want(t, f, "loopbus_jobs_total", labels{"backend": "codex", "outcome": "completed"}, 0)
	wantHistogram(t, f, "loopbus_job_duration_seconds", labels{"backend": "exec", "outcome": "completed"}, 1, 1.5)
	wantHistogram(t, f, "loopbus_job_duration_seconds", labels{"backend": "claude", "outcome": "failed"}, 1, 0.5)
	wantHistogram(t, f, "loopbus_job_duration_seconds", labels{"backend": "other", "outcome": "failed"}, 1, 2)

	want(t, f, "loopbus_tokens_total", labels{"backend": "exec", "kind": "input"}, 100)
	want(t, f, "loopbus_tokens_total", labels{"backend": "exec", "kind": "cached"}, 40)
	want(t, f, "loopbus_tokens_total", labels{"backend": "exec", "kind": "output"}, 20)
	want(t, f, "loopbus_tokens_total", labels{"backend": "claude", "kind": "input"}, 10)
	want(t, f, "loopbus_cost_usd_total", labels{"backend": "exec"}, 0.25)
	want(t, f, "loopbus_cost_usd_total", labels{"backend": "claude"}, 0.5)

	// j1 and j2 ended; j5 runs (j3 and j4 ended without being started).
	want(t, f, "loopbus_jobs_running", labels{}, 1)
	want(t, f, "loopbus_rate_limited_jobs_total", labels{"backend": "claude"}, 1)
	want(t, f, "loopbus_rate_limit_waits_total", labels{}, 1)
	want(t, f, "loopbus_breaker_opens_total", labels{}, 1)
	wantHistogram(t, f, "loopbus_step_duration_seconds", labels{"outcome": "completed"}, 1, -1)
	wantHistogram(t, f, "loopbus_step_duration_seconds", labels{"outcome": "failed"}, 1, -1)
	wantHistogram(t, f, "loopbus_validation_duration_seconds", labels{"result": "passed"}, 1, -1)

	// Scrape-time counts from JetStream.
	want(t, f, "loopbus_jetstream_up", labels{}, 1)
	want(t, f, "loopbus_dead_letters_total", labels{}, 1)
	want(t, f, "loopbus_consumer_pending_messages", labels{"consumer": "idle"}, 2)
	want(t, f, "loopbus_consumer_ack_pending_messages", labels{"consumer": "idle"}, 0)
	want(t, f, "loopbus_consumer_pending_messages", labels{"consumer": "redeliver"}, 0)
	want(t, f, "loopbus_consumer_ack_pending_messages", labels{"consumer": "redeliver"}, 1)
	want(t, f, "loopbus_consumer_redelivered_messages", labels{"consumer": "redeliver"}, 1)
	if n := len(f["loopbus_consumer_pending_messages"].GetMetric()); n != 2 {
		t.Errorf("pending counts of %d consumers, want the 2 durable ones (readers' ordered consumers are not services')", n)
	}
	// The registry is the service's own: the Go runtime's metrics, not the
	// global registry's.
	if _, ok := f["go_goroutines"]; !ok {
		t.Error("no go_goroutines")
	}

	// The server stops with Run's context.
	stop()
	if _, err := scrape(url); err == nil {
		t.Error("/metrics still served after Run returned")
	}
}

// serveMetrics starts serve (embedded NATS, every service, an agent
// worker of workers slots) with metrics on a free loopback port, and
// returns it and its /metrics URL.
func serveMetrics(t *testing.T, ctx context.Context, workers int) (*serve.Node, string) {
	t.Helper()
	addrs := make(chan string, 1)
	set := serve.All(workers)
	set.Metrics = metrics.Config{Listen: "127.0.0.1:0", OnListen: func(a string) { addrs <- a }}
	node, err := serve.Start(ctx, serve.Config{Embedded: bus.EmbeddedConfig{DataDir: t.TempDir()}, Services: set}, testnats.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := node.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	select {
	case a := <-addrs:
		return node, "http://" + a + metrics.Path
	case <-ctx.Done():
		t.Fatal("serve did not serve /metrics")
	}
	return nil, ""
}

// TestServedSessionMetrics runs a real session (the writing-kit example,
// its agents shell scripts) through serve with metrics on, and checks the
// scrape against the events of the stream.
func TestServedSessionMetrics(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	node, url := serveMetrics(t, ctx, 2)
	c, err := client.Dial(ctx, bus.Config{URL: node.URL()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	p, err := definition.Load("../examples/writing-kit/pipeline.yaml")
	if err != nil {
		t.Fatal(err)
	}
	session, err := c.Submit(ctx, p, "../examples/writing-kit/article.md", client.SubmitOptions{Session: "kit-metrics"})
	if err != nil {
		t.Fatal(err)
	}
	m, err := c.Follow(ctx, session, func(schemas.Event, *projections.Manifest) {})
	if err != nil {
		t.Fatal(err)
	}
	if m.Status != projections.StatusCompleted {
		t.Fatalf("session %s", m.Status)
	}

	b := testnats.Connect(t, node.URL(), "test")
	evs := testnats.Events(t, b)
	f := await(t, url, caughtUp(ctx, b))
	wantEventsByType(t, f, evs)
	var completed, passed, failed uint64
	var seconds float64
	for _, ev := range evs {
		switch ev.Type {
		case schemas.TypeJobCompleted:
			completed++
			seconds += float64(ev.Data.(*schemas.JobCompleted).DurationMs) / 1000
		case schemas.TypeValidationPassed:
			passed++
		case schemas.TypeValidationFailed:
			failed++
		}
	}
	if completed < 3 {
		t.Fatalf("%d jobs completed, want at least one per step", completed)
	}
	want(t, f, "loopbus_jobs_total", labels{"backend": "exec", "outcome": "completed"}, float64(completed))
	wantHistogram(t, f, "loopbus_job_duration_seconds", labels{"backend": "exec", "outcome": "completed"}, completed, seconds)
	wantHistogram(t, f, "loopbus_step_duration_seconds", labels{"outcome": "completed"}, 3, -1)
	wantHistogram(t, f, "loopbus_validation_duration_seconds", labels{"result": "passed"}, passed, -1)
	if failed > 0 {
		wantHistogram(t, f, "loopbus_validation_duration_seconds", labels{"result": "failed"}, failed, -1)
	}
	want(t, f, "loopbus_malformed_events_total", labels{}, 0)
	want(t, f, "loopbus_dead_letters_total", labels{}, 0)
	want(t, f, "loopbus_jetstream_up", labels{}, 1)
	for _, consumer := range []string{"agentworker", "validator"} {
		want(t, f, "loopbus_consumer_pending_messages", labels{"consumer": consumer}, 0)
	}
	// The orchestrator runs beside the metrics: its watchdog's count is
	// served, and it lost no decision.
	want(t, f, "loopbus_orchestrator_stalled_decisions_total", labels{}, 0)
}

// TestOrchestratorMetricsServed: collectors of Config.Collectors are
// served beside the stream's metrics; Orchestrator counts the stalls it
// observes, and serves the lag once tracked: the stream's last sequence
// minus the orchestrator's.
func TestOrchestratorMetricsServed(t *testing.T) {
	b, _ := testnats.Bus(t)
	stalls := metrics.NewOrchestrator()
	addrs := make(chan string, 1)
	m, err := metrics.New(metrics.Config{Listen: "127.0.0.1:0", OnListen: func(a string) { addrs <- a }, Collectors: []prometheus.Collector{stalls}}, b, testnats.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	url := "http://" + <-addrs + metrics.Path
	stalls.Observe("s1")
	stalls.Observe("s2")
	f := await(t, url, func(f families) error {
		if m, ok := f.find("loopbus_orchestrator_stalled_decisions_total", labels{}); !ok || m.GetCounter().GetValue() != 2 {
			return fmt.Errorf("stalled decisions %v, want 2", m)
		}
		return nil
	})
	if _, ok := f.find("loopbus_orchestrator_lag_events", labels{}); ok {
		t.Error("a lag served before Track: nothing says what the orchestrator read")
	}
	for i := range 5 {
		ev := schemas.Event{ID: fmt.Sprintf("ev-%d", i), Type: schemas.TypeAgentMessage, Session: "s1", Time: time.Now(),
			Data: &schemas.AgentMessage{JobID: "j1", Text: "hello"}}
		if _, err := b.Publish(t.Context(), ev); err != nil {
			t.Fatal(err)
		}
	}
	var read atomic.Uint64
	read.Store(2)
	stalls.Track(read.Load, b.LastSeq)
	await(t, url, func(f families) error {
		if got := f.value("loopbus_orchestrator_lag_events", labels{}); got != 3 {
			return fmt.Errorf("lag %v, want 3 (5 events, 2 read)", got)
		}
		return nil
	})
	read.Store(5)
	await(t, url, func(f families) error {
		if got := f.value("loopbus_orchestrator_lag_events", labels{}); got != 0 {
			return fmt.Errorf("lag %v once every event is read, want 0", got)
		}
		return nil
	})
}

// idleConsumer creates a durable consumer on subject that takes nothing.
func idleConsumer(t *testing.T, ctx context.Context, b *bus.Bus, name, subject string) {
	t.Helper()
	cctx, stop := context.WithCancel(ctx)
	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- b.Consume(cctx, bus.ConsumerConfig{Durable: name, Subjects: []string{subject}, OnReady: func() { close(ready) }},
			func(context.Context, bus.Delivery) error { return nil })
	}()
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("consumer %s: %v", name, err)
	}
	stop()
	if err := <-done; err != nil {
		t.Fatalf("consumer %s: %v", name, err)
	}
}

func TestNamedConsumers(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, _ := testnats.Bus(t)
	idleConsumer(t, ctx, b, "named", "loopbus.evt.*.tool.started")
	idleConsumer(t, ctx, b, "unnamed", "loopbus.evt.*.tool.started")
	if _, err := b.Publish(ctx, schemas.Event{ID: "e1", Type: schemas.TypeToolStarted, Session: "s1",
		Data: &schemas.ToolStarted{JobID: "j1", ToolID: "t1", Name: "run"}}); err != nil {
		t.Fatal(err)
	}
	url, _ := start(t, b, metrics.Config{Consumers: []string{"named", "not-created-yet"}})
	f := await(t, url, caughtUp(ctx, b))
	want(t, f, "loopbus_consumer_pending_messages", labels{"consumer": "named"}, 1)
	if n := len(f["loopbus_consumer_pending_messages"].GetMetric()); n != 1 {
		t.Errorf("pending counts of %d consumers, want the one named that exists", n)
	}
	want(t, f, "loopbus_jetstream_up", labels{}, 1)
	want(t, f, "loopbus_dead_letters_total", labels{}, 0)
}

func TestRunFailsOnABusyAddress(t *testing.T) {
	b, _ := testnats.Bus(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	svc, err := metrics.New(metrics.Config{Listen: ln.Addr().String()}, b, testnats.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := svc.Run(ctx); err == nil || ctx.Err() != nil {
		t.Fatalf("Run on a busy address = %v, want an error at once", err)
	}
	if err := svc.Run(ctx); err == nil {
		t.Error("a second Run was accepted")
	}
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  metrics.Config
		ok   bool
	}{
		{"zero", metrics.Config{}, true},
		{"loopback", metrics.Config{Listen: "127.0.0.1:9464"}, true},
		{"every interface", metrics.Config{Listen: ":9464"}, true},
		{"no port", metrics.Config{Listen: "localhost"}, false},
		{"negative timeout", metrics.Config{ScrapeTimeout: -time.Second}, false},
		{"negative bound", metrics.Config{MaxTracked: -1}, false},
		{"empty consumer", metrics.Config{Consumers: []string{""}}, false},
		{"nil collector", metrics.Config{Collectors: []prometheus.Collector{nil}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			if (err == nil) != tc.ok || (err != nil && !errors.Is(err, metrics.ErrInvalidConfig)) {
				t.Errorf("Validate = %v, want ok %v", err, tc.ok)
			}
		})
	}
}

// TestIdleServeAndRunningGauges: an idle serve already serves every gauge
// at 0 (running sessions, running jobs, the orchestrator's lag) and the
// counters of each known backend at 0; while a session's agent runs, one
// session and one job run; once it is done, none, and the orchestrator
// has read the whole stream.
func TestIdleServeAndRunningGauges(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	node, url := serveMetrics(t, ctx, 1)
	idle, err := scrape(url)
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range []string{"loopbus_sessions_running", "loopbus_jobs_running", "loopbus_orchestrator_lag_events",
		"loopbus_rate_limit_waits_total", "loopbus_breaker_opens_total", "loopbus_malformed_events_total"} {
		want(t, idle, g, labels{}, 0)
	}
	for _, backend := range []string{"exec", "claude", "codex", "openai", "anthropic"} {
		want(t, idle, "loopbus_jobs_total", labels{"backend": backend, "outcome": "failed"}, 0)
		want(t, idle, "loopbus_tokens_total", labels{"backend": backend, "kind": "output"}, 0)
		want(t, idle, "loopbus_cost_usd_total", labels{"backend": backend}, 0)
		want(t, idle, "loopbus_rate_limited_jobs_total", labels{"backend": backend}, 0)
		wantHistogram(t, idle, "loopbus_job_duration_seconds", labels{"backend": backend, "outcome": "completed"}, 0, 0)
	}
	wantHistogram(t, idle, "loopbus_step_duration_seconds", labels{"outcome": "failed"}, 0, 0)
	wantHistogram(t, idle, "loopbus_validation_duration_seconds", labels{"result": "failed"}, 0, 0)

	// A one-step session whose agent waits for a file.
	dir := t.TempDir()
	gate := filepath.Join(dir, "open")
	files := map[string]string{
		"pipeline.yaml": "name: gated\nsteps:\n  a:\n    agent: {backend: exec, command: [sh, agent.sh]}\n    prompt: write a\n    outputs: [{name: a.txt}]\n",
		"agent.sh":      "while [ ! -e '" + gate + "' ]; do sleep 0.05; done\necho done > \"$LOOPBUS_OUTPUT_DIR/a.txt\"\n",
		"in.txt":        "input\n",
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	c, err := client.Dial(ctx, bus.Config{URL: node.URL()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	p, err := definition.Load(filepath.Join(dir, "pipeline.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	session, err := c.Submit(ctx, p, filepath.Join(dir, "in.txt"), client.SubmitOptions{Session: "gauges-1"})
	if err != nil {
		t.Fatal(err)
	}
	await(t, url, func(f families) error {
		if s, j := f.value("loopbus_sessions_running", labels{}), f.value("loopbus_jobs_running", labels{}); s != 1 || j != 1 {
			return fmt.Errorf("%v sessions and %v jobs running, want 1 and 1", s, j)
		}
		return nil
	})
	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	m, err := c.Follow(ctx, session, func(schemas.Event, *projections.Manifest) {})
	if err != nil {
		t.Fatal(err)
	}
	if m.Status != projections.StatusCompleted {
		t.Fatalf("session %s", m.Status)
	}
	b := testnats.Connect(t, node.URL(), "test")
	f := await(t, url, func(f families) error {
		if err := caughtUp(ctx, b)(f); err != nil {
			return err
		}
		if lag := f.value("loopbus_orchestrator_lag_events", labels{}); lag != 0 {
			return fmt.Errorf("the orchestrator lags %v events", lag)
		}
		return nil
	})
	want(t, f, "loopbus_sessions_running", labels{}, 0)
	want(t, f, "loopbus_jobs_running", labels{}, 0)
	want(t, f, "loopbus_jobs_total", labels{"backend": "exec", "outcome": "completed"}, 1)
}
