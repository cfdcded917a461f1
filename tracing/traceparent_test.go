package tracing_test

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"regexp"
	"sync"
	"testing"
	"time"

	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/client"
	"github.com/loopbus/loopbus/definition"
	"github.com/loopbus/loopbus/internal/testnats"
	"github.com/loopbus/loopbus/projections"
	"github.com/loopbus/loopbus/schemas"
	"github.com/loopbus/loopbus/serve"
	"github.com/loopbus/loopbus/tracing"
)

var traceparentRE = regexp.MustCompile(`^00-([0-9a-f]{32})-([0-9a-f]{16})-01$`)

// rawEvent is one message of the stream as any CloudEvents subscriber
// sees it, and the event the bus decodes from it.
type rawEvent struct {
	seq         uint64
	traceparent string
	trace, span string
	ce          map[string]any
	ev          schemas.Event
}

// readRaw reads every message of the event stream by sequence, as stored.
func readRaw(t *testing.T, b *bus.Bus) []rawEvent {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := b.JetStream().Stream(ctx, b.StreamName())
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var out []rawEvent
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq; seq++ {
		msg, err := st.GetMsg(ctx, seq)
		if err != nil {
			t.Fatalf("get %d: %v", seq, err)
		}
		r := rawEvent{seq: seq}
		if err := json.Unmarshal(msg.Data, &r.ce); err != nil {
			t.Fatalf("message %d is not JSON: %v", seq, err)
		}
		r.traceparent, _ = r.ce["traceparent"].(string)
		if m := traceparentRE.FindStringSubmatch(r.traceparent); m != nil {
			r.trace, r.span = m[1], m[2]
		} else {
			t.Errorf("message %d (%v): traceparent %q is not 00-<32 hex>-<16 hex>-01", seq, r.ce["type"], r.traceparent)
		}
		if r.ev, err = b.Decode(msg.Subject, msg.Header, msg.Data); err != nil {
			t.Fatalf("message %d: %v", seq, err)
		}
		out = append(out, r)
	}
	return out
}

// TestEventsCarryTraceparent runs two real sessions (the writing-kit
// example, its agents shell scripts) through serve and reads every
// message of the stream back raw: each carries a traceparent; a session
// has one trace id, its own; a job's events share the job's span; tool
// calls have spans of their own; and the ids are those a subscriber
// computes from the event alone. A tracing service follows the same
// stream meanwhile: each span it exports has the parent the events imply,
// in its session's trace.
func TestEventsCarryTraceparent(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	node, err := serve.Start(ctx, serve.Config{Embedded: bus.EmbeddedConfig{DataDir: t.TempDir()}, Services: serve.All(2)}, testnats.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := node.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	b := testnats.Connect(t, node.URL(), "test")
	col := newCollector(t)
	t0 := time.Now()
	svc, err := tracing.New(tracing.Config{Endpoint: col.URL + "/v1/traces", BatchTimeout: 20 * time.Millisecond}, b, testnats.Logger(t),
		func() time.Time { return t0 })
	if err != nil {
		t.Fatal(err)
	}
	testnats.Run(t, "tracing", svc.Run)

	c, err := client.Dial(ctx, bus.Config{URL: node.URL()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	p, err := definition.Load("../examples/writing-kit/pipeline.yaml")
	if err != nil {
		t.Fatal(err)
	}
	sessions := []string{"kit-trace-a", "kit-trace-b"}
	var wg sync.WaitGroup
	errs := make(chan error, len(sessions))
	for _, s := range sessions {
		wg.Go(func() {
			session, err := c.Submit(ctx, p, "../examples/writing-kit/article.md", client.SubmitOptions{Session: s})
			if err != nil {
				errs <- err
				return
			}
			m, err := c.Follow(ctx, session, func(schemas.Event, *projections.Manifest) {})
			if err == nil && m.Status != projections.StatusCompleted {
				err = fmt.Errorf("session %s %s", session, m.Status)
			}
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	raw := readRaw(t, b)
	distinct := checkRaw(t, raw, sessions)
	kitTools := 0
	for _, r := range raw {
		if r.ev.Type == schemas.TypeToolStarted {
			kitTools++
		}
	}
	if kitTools < 6 {
		t.Errorf("%d tool calls: want the exec runs of both kits' steps", kitTools)
	}

	// The service's spans: every span the events name, each in its
	// session's trace, under the parent the events imply.
	want := map[string]string{} // span → parent ("" for roots)
	for _, r := range raw {
		_, parent := tracing.SpanOf(r.ev)
		p := ""
		if parent.IsValid() {
			p = parent.String()
		}
		want[r.span] = p
	}
	await(t, 10*time.Second, func() error {
		got := col.exported(t)
		for id := range want {
			if got[id] == nil {
				return fmt.Errorf("%d of %d spans exported; not yet %s", len(got), len(want), id)
			}
		}
		return nil
	})
	got := col.exported(t)
	t.Logf("%d events of %d sessions, %d tool calls; %d spans exported", len(raw), len(sessions), kitTools, len(got))
	byTrace := map[string]map[string]bool{}
	for id, sp := range got {
		tid := hex.EncodeToString(sp.GetTraceId())
		if byTrace[tid] == nil {
			byTrace[tid] = map[string]bool{}
		}
		byTrace[tid][id] = true
		if p := hex.EncodeToString(sp.GetParentSpanId()); p != want[id] {
			t.Errorf("span %s %q: parent %q, want %q", id, sp.GetName(), p, want[id])
		}
	}
	for tid, ids := range byTrace {
		if _, ok := distinct[tid]; !ok {
			t.Errorf("spans in trace %s, of no session", tid)
		}
		// Every parent is a span of the same trace.
		for id := range ids {
			if p := want[id]; p != "" && !ids[p] {
				t.Errorf("span %s of trace %s has parent %s outside it", id, tid, p)
			}
		}
	}
}

// checkRaw checks the traceparent of every raw event of sessions, and
// returns the sessions by trace id.
func checkRaw(t *testing.T, raw []rawEvent, sessions []string) map[string]string {
	t.Helper()
	traces := map[string]string{}   // session → trace id
	jobSpans := map[string]string{} // job → span id of its job-level events
	toolSpans := map[string]string{}
	counts := map[string]int{}
	for _, r := range raw {
		ev := r.ev
		counts[ev.Session]++
		// What a subscriber computes from the event alone.
		sc, _ := tracing.SpanOf(ev)
		if r.trace != sc.TraceID().String() || r.span != sc.SpanID().String() {
			t.Errorf("%d %s: traceparent %s, but the event's attributes give %s", r.seq, ev.Type, r.traceparent,
				"00-"+sc.TraceID().String()+"-"+sc.SpanID().String()+"-01")
		}
		if want := schemas.DeterministicID("loopbus.trace", ev.Session); r.trace != want {
			t.Errorf("%d %s: trace %s, want the hash of session %s: %s", r.seq, ev.Type, r.trace, ev.Session, want)
		}
		if tr, ok := traces[ev.Session]; ok && tr != r.trace {
			t.Errorf("session %s has two trace ids: %s and %s", ev.Session, tr, r.trace)
		}
		traces[ev.Session] = r.trace
		switch ev.Type {
		case schemas.TypeJobStarted, schemas.TypeJobHeartbeat, schemas.TypeArtifactStored, schemas.TypeAgentMessage,
			schemas.TypeJobCompleted, schemas.TypeJobFailed:
			if ev.Job == "" {
				t.Fatalf("%d %s has no job attribute", r.seq, ev.Type)
			}
			if s, ok := jobSpans[ev.Job]; ok && s != r.span {
				t.Errorf("job %s: %s has span %s, its other events %s", ev.Job, ev.Type, r.span, s)
			}
			jobSpans[ev.Job] = r.span
		case schemas.TypeToolStarted, schemas.TypeToolCompleted:
			var tool string
			switch d := ev.Data.(type) {
			case *schemas.ToolStarted:
				tool = d.ToolID
			case *schemas.ToolCompleted:
				tool = d.ToolID
			}
			key := ev.Job + "/" + tool
			if s, ok := toolSpans[key]; ok && s != r.span {
				t.Errorf("tool %s: %s has span %s, its start %s", key, ev.Type, r.span, s)
			}
			toolSpans[key] = r.span
		}
	}
	for _, s := range sessions {
		if counts[s] == 0 {
			t.Fatalf("no events of session %s", s)
		}
	}
	if len(traces) != len(sessions) {
		t.Errorf("trace ids of %d sessions, want %d", len(traces), len(sessions))
	}
	distinct := map[string]string{}
	for s, tr := range traces {
		if other, ok := distinct[tr]; ok {
			t.Errorf("sessions %s and %s share trace %s", s, other, tr)
		}
		distinct[tr] = s
	}
	// Tool calls: one span each, none a job's.
	seen := map[string]string{}
	for job, s := range jobSpans {
		seen[s] = "job " + job
	}
	for key, s := range toolSpans {
		if other, ok := seen[s]; ok {
			t.Errorf("tool %s has the span of %s", key, other)
		}
		seen[s] = "tool " + key
	}
	return distinct
}

// TestToolEventsCarryTheirSpans publishes made-up sessions whose jobs call
// several tools and retry, and reads them back raw.
func TestToolEventsCarryTheirSpans(t *testing.T) {
	t.Parallel()
	b, _ := testnats.Bus(t)
	sb := newBuilder(t, b)
	sb.passingSession("s-pass")
	sb.failingSession("s-fail")
	raw := readRaw(t, b)
	checkRaw(t, raw, []string{"s-pass", "s-fail"})
	spans := map[string]map[string]bool{} // job → tool spans
	for _, r := range raw {
		if r.ev.Type == schemas.TypeToolStarted {
			if spans[r.ev.Job] == nil {
				spans[r.ev.Job] = map[string]bool{}
			}
			spans[r.ev.Job][r.span] = true
		}
	}
	if n := len(spans["s-pass.draft.1"]); n != 2 {
		t.Errorf("job s-pass.draft.1 calls 2 tools, whose events have %d spans", n)
	}
	all := map[string]bool{}
	for _, byTool := range spans {
		for s := range byTool {
			if all[s] {
				t.Errorf("tool span %s in two jobs", s)
			}
			all[s] = true
		}
	}
	if len(all) != 4 {
		t.Errorf("%d tool spans, want 4", len(all))
	}
}
