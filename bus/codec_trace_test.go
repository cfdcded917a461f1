package bus_test

import (
	"encoding/hex"
	"encoding/json"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/binding/format"
	cloudevents "github.com/cloudevents/sdk-go/v2/event"
	"github.com/cloudevents/sdk-go/v2/extensions"
	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/internal/testnats"
	"github.com/loopbus/loopbus/schemas"
	"github.com/nats-io/nats.go"
)

var traceparentRE = regexp.MustCompile(`^00-[0-9a-f]{32}-[0-9a-f]{16}-01$`)

// traceEvents are events of every span kind of session "s1": orchestrator
// job ids ("s1.draft.2", a second attempt, a later round), a loop's merge
// job, a job id of another tool.
func traceEvents() map[string]schemas.Event {
	ev := func(typ, step, job string, data any) schemas.Event {
		return schemas.Event{ID: "id-" + typ + job, Type: typ, Session: "s1", Step: step, Job: job, Data: data,
			Time: time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)}
	}
	req := func(job string, it int) *schemas.JobRequested {
		return &schemas.JobRequested{JobID: job, Step: "draft", Iteration: it, Attempt: 1,
			Agent: schemas.AgentSpec{Backend: "exec", Command: []string{"true"}}, Prompt: "p", TimeoutMs: 1000}
	}
	return map[string]schemas.Event{
		"session.started": ev(schemas.TypeSessionStarted, "", "", &schemas.SessionStarted{
			Pipeline:   schemas.Pipeline{Name: "p", Steps: []schemas.Step{}},
			Input:      schemas.ArtifactRef{Name: "in.md", Object: "s1/input/in.md", Digest: schemas.Digest(nil), Size: 0},
			SourceHash: "0123456789abcdef",
		}),
		"job.requested":         ev(schemas.TypeJobRequested, "draft", "s1.draft.2", req("s1.draft.2", 2)),
		"job.requested attempt": ev(schemas.TypeJobRequested, "draft", "s1.draft.2.a2", req("s1.draft.2.a2", 2)),
		"job.requested round":   ev(schemas.TypeJobRequested, "draft", "s1.draft.2.a3.r1", req("s1.draft.2.a3.r1", 2)),
		"job.requested foreign": ev(schemas.TypeJobRequested, "draft", "job-x", req("job-x", 1)),
		"job.requested merge":   ev(schemas.TypeJobRequested, "draft", "s1.draft.merge2.a2", req("s1.draft.merge2.a2", 1)),
		"job.started":           ev(schemas.TypeJobStarted, "draft", "s1.draft.2", &schemas.JobStarted{JobID: "s1.draft.2", Worker: "w", Delivery: 1}),
		"job.started no job attr": ev(schemas.TypeJobStarted, "draft", "",
			&schemas.JobStarted{JobID: "s1.draft.2", Worker: "w", Delivery: 1}),
		"tool.started": ev(schemas.TypeToolStarted, "draft", "s1.draft.2", &schemas.ToolStarted{JobID: "s1.draft.2", ToolID: "t1", Name: "run"}),
		"tool.completed": ev(schemas.TypeToolCompleted, "draft", "s1.draft.2",
			&schemas.ToolCompleted{JobID: "s1.draft.2", ToolID: "t1", Name: "run", Status: "ok"}),
		"tool.started t2": ev(schemas.TypeToolStarted, "draft", "s1.draft.2", &schemas.ToolStarted{JobID: "s1.draft.2", ToolID: "t2", Name: "run"}),
		"job.completed": ev(schemas.TypeJobCompleted, "draft", "s1.draft.2", &schemas.JobCompleted{JobID: "s1.draft.2", Step: "draft", Iteration: 2,
			Worker: "w", Artifacts: []schemas.ArtifactRef{}}),
		"validation.failed": ev(schemas.TypeValidationFailed, "draft", "s1.draft.2", &schemas.Verdict{JobID: "s1.draft.2", Step: "draft", Iteration: 2,
			Artifacts: []schemas.ArtifactRef{}, Errors: []schemas.ValidationError{{Message: "no"}}}),
		"step.completed": ev(schemas.TypeStepCompleted, "draft", "", &schemas.StepCompleted{Step: "draft", JobID: "s1.draft.2.a2", Iterations: 2,
			Artifacts: []schemas.ArtifactRef{}, ContentHash: "0123456789abcdef"}),
		"step.failed":       ev(schemas.TypeStepFailed, "draft", "", &schemas.StepFailed{Step: "draft", Iterations: 2, Error: "used up"}),
		"session.completed": ev(schemas.TypeSessionCompleted, "", "", &schemas.SessionCompleted{Final: []schemas.ArtifactRef{}}),
	}
}

func TestSpanOf(t *testing.T) {
	t.Parallel()
	evs := traceEvents()
	root := bus.SpanRef{Kind: bus.SpanSession, Session: "s1"}
	iter2 := bus.SpanRef{Kind: bus.SpanIteration, Session: "s1", Step: "draft", Iteration: "2"}
	job2 := bus.SpanRef{Kind: bus.SpanJob, Session: "s1", Step: "draft", Iteration: "2", Job: "s1.draft.2"}
	tool1 := bus.SpanRef{Kind: bus.SpanTool, Session: "s1", Step: "draft", Iteration: "2", Job: "s1.draft.2", Tool: "t1"}
	want := map[string]bus.SpanRef{
		"session.started":         root,
		"job.requested":           iter2,
		"job.requested attempt":   iter2, // attempts share their iteration
		"job.requested round":     {Kind: bus.SpanIteration, Session: "s1", Step: "draft", Iteration: "2.r1"},
		"job.requested foreign":   {Kind: bus.SpanIteration, Session: "s1", Step: "draft", Iteration: "job-x"},
		"job.requested merge":     {Kind: bus.SpanIteration, Session: "s1", Step: "draft", Iteration: "merge2"},
		"job.started":             job2,
		"job.started no job attr": job2, // the data's job id
		"tool.started":            tool1,
		"tool.completed":          tool1,
		"tool.started t2":         {Kind: bus.SpanTool, Session: "s1", Step: "draft", Iteration: "2", Job: "s1.draft.2", Tool: "t2"},
		"job.completed":           job2,
		"validation.failed":       iter2,
		"step.completed":          iter2,
		"step.failed":             root, // it does not say which round failed
		"session.completed":       root,
	}
	for name, w := range want {
		if got := bus.SpanOf(evs[name]); got != w {
			t.Errorf("%s: SpanOf = %+v, want %+v", name, got, w)
		}
	}
	if len(want) != len(evs) {
		t.Errorf("%d events, %d expectations", len(evs), len(want))
	}

	// Parents: tool → job → iteration → session → none.
	for _, c := range []struct{ child, parent bus.SpanRef }{{tool1, job2}, {job2, iter2}, {iter2, root}} {
		if p, ok := c.child.Parent(); !ok || p != c.parent {
			t.Errorf("Parent(%+v) = %+v, %v; want %+v", c.child, p, ok, c.parent)
		}
	}
	if _, ok := root.Parent(); ok {
		t.Error("the session's root span has a parent")
	}
	// A foreign job is the child of its own iteration.
	foreign := bus.SpanOf(schemas.Event{Type: schemas.TypeJobStarted, Session: "s1", Step: "draft", Job: "job-x",
		Data: &schemas.JobStarted{JobID: "job-x", Worker: "w", Delivery: 1}})
	if p, _ := foreign.Parent(); p != bus.SpanOf(evs["job.requested foreign"]) {
		t.Errorf("foreign job's parent %+v", p)
	}
}

// TestSpanIDs pins the derivation docs/OBSERVABILITY.md documents: a subscriber in
// any language computes the same ids.
func TestSpanIDs(t *testing.T) {
	t.Parallel()
	det := func(parts ...string) string { return schemas.DeterministicID(parts...) }
	cases := []struct {
		ref       bus.SpanRef
		spanParts []string
	}{
		{bus.SpanRef{Kind: bus.SpanSession, Session: "s1"}, []string{"loopbus.span", "session", "s1"}},
		{bus.SpanRef{Kind: bus.SpanIteration, Session: "s1", Step: "draft", Iteration: "2.r1"}, []string{"loopbus.span", "iteration", "s1", "draft", "2.r1"}},
		{bus.SpanRef{Kind: bus.SpanJob, Session: "s1", Step: "draft", Iteration: "2", Job: "s1.draft.2.a2"}, []string{"loopbus.span", "job", "s1", "s1.draft.2.a2"}},
		{bus.SpanRef{Kind: bus.SpanTool, Session: "s1", Job: "s1.draft.2", Tool: "toolu_01"}, []string{"loopbus.span", "tool", "s1", "s1.draft.2", "toolu_01"}},
	}
	seen := map[[8]byte]bool{}
	for _, c := range cases {
		tid, sid := c.ref.TraceID(), c.ref.SpanID()
		if got, want := hex.EncodeToString(tid[:]), det("loopbus.trace", "s1"); got != want {
			t.Errorf("%v: trace id %s, want %s", c.ref.Kind, got, want)
		}
		if got, want := hex.EncodeToString(sid[:]), det(c.spanParts...)[:16]; got != want {
			t.Errorf("%v: span id %s, want %s", c.ref.Kind, got, want)
		}
		if tp, want := c.ref.Traceparent(), "00-"+det("loopbus.trace", "s1")+"-"+det(c.spanParts...)[:16]+"-01"; tp != want {
			t.Errorf("%v: traceparent %s, want %s", c.ref.Kind, tp, want)
		}
		if seen[sid] {
			t.Errorf("%v: span id %x repeats", c.ref.Kind, sid)
		}
		seen[sid] = true
	}
	// Long parts (beyond the hash's stack buffer) hash the same way.
	long := bus.SpanRef{Kind: bus.SpanIteration, Session: "s1", Step: string(make([]byte, 300)), Iteration: "1"}
	sid := long.SpanID()
	if got, want := hex.EncodeToString(sid[:]), det("loopbus.span", "iteration", "s1", long.Step, "1")[:16]; got != want {
		t.Errorf("long step: span id %s, want %s", got, want)
	}
	a, b := bus.SpanRef{Session: "s1"}.TraceID(), bus.SpanRef{Session: "s2"}.TraceID()
	if a == b {
		t.Error("two sessions share a trace id")
	}
}

// TestCloudEventsSDKReadsTraceparent decodes the bytes Encode writes with
// the CloudEvents SDK's structured JSON format: every event is a valid
// CloudEvent 1.0 whose distributed-tracing extension is the derived
// traceparent.
func TestCloudEventsSDKReadsTraceparent(t *testing.T) {
	t.Parallel()
	b, _ := testnats.Bus(t)
	evs := traceEvents()
	evs["full"] = fullEvent()
	for name, ev := range evs {
		m, err := b.Encode(ev)
		if err != nil {
			t.Fatalf("%s: Encode: %v", name, err)
		}
		var ce cloudevents.Event
		if err := format.JSON.Unmarshal(m.Data, &ce); err != nil {
			t.Fatalf("%s: the SDK cannot read %s: %v", name, m.Data, err)
		}
		if err := ce.Validate(); err != nil {
			t.Errorf("%s: the SDK finds the event invalid: %v", name, err)
		}
		if ce.SpecVersion() != "1.0" || ce.ID() != ev.ID || ce.Type() != ev.Type || ce.Subject() != ev.Subject() {
			t.Errorf("%s: SDK reads %s", name, ce.String())
		}
		dt, ok := extensions.GetDistributedTracingExtension(ce)
		if !ok {
			t.Fatalf("%s: the SDK sees no distributed-tracing extension in %s", name, m.Data)
		}
		if want := bus.SpanOf(ev).Traceparent(); dt.TraceParent != want || dt.TraceState != "" {
			t.Errorf("%s: traceparent %q (tracestate %q), want %q", name, dt.TraceParent, dt.TraceState, want)
		}
		if !traceparentRE.MatchString(dt.TraceParent) {
			t.Errorf("%s: traceparent %q is not W3C version 00, sampled", name, dt.TraceParent)
		}
		var data, want any
		if err := json.Unmarshal(ce.Data(), &data); err != nil {
			t.Fatalf("%s: data: %v", name, err)
		}
		raw, _ := json.Marshal(ev.Data)
		_ = json.Unmarshal(raw, &want)
		if !reflect.DeepEqual(data, want) {
			t.Errorf("%s: SDK data %v, want %v", name, data, want)
		}
	}
}

// TestDecodeDoesNotNeedTraceparent: events of other publishers may lack
// the extension or carry their own (of another trace, or malformed); they
// decode the same, and the span is still derived from the attributes.
func TestDecodeDoesNotNeedTraceparent(t *testing.T) {
	t.Parallel()
	b, _ := testnats.Bus(t)
	ev := jobStarted("s1", "e1")
	ev.Time = time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	m, err := b.Encode(ev)
	if err != nil {
		t.Fatal(err)
	}
	want, err := b.Decode(m.Subject, m.Header, m.Data)
	if err != nil {
		t.Fatal(err)
	}
	hdr := nats.Header{nats.MsgIdHdr: {ev.ID}}
	for name, f := range map[string]func(map[string]any){
		"none":         func(m map[string]any) { delete(m, "traceparent") },
		"another":      func(m map[string]any) { m["traceparent"] = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01" },
		"with state":   func(m map[string]any) { m["tracestate"] = "vendor=x" },
		"malformed":    func(m map[string]any) { m["traceparent"] = "not a trace" },
		"not a string": func(m map[string]any) { m["traceparent"] = 42 },
	} {
		got, err := b.Decode(m.Subject, hdr, mutated(t, b, ev, f))
		if err != nil {
			t.Errorf("%s: Decode: %v", name, err)
			continue
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s: decoded %+v, want %+v", name, got, want)
		}
		if bus.SpanOf(got) != bus.SpanOf(ev) {
			t.Errorf("%s: span %+v, want %+v", name, bus.SpanOf(got), bus.SpanOf(ev))
		}
	}
}

// BenchmarkTraceparent is what tracing adds to Encode: the span an event
// belongs to and its traceparent.
func BenchmarkTraceparent(b *testing.B) {
	ev := schemas.Event{Type: schemas.TypeToolStarted, Session: "kit-20251122-a1b2", Step: "outline", Job: "kit-20251122-a1b2.outline.1",
		Data: &schemas.ToolStarted{JobID: "kit-20251122-a1b2.outline.1", ToolID: "0123456789abcdef0123456789abcdef", Name: "run"}}
	b.ReportAllocs()
	for range b.N {
		if len(bus.SpanOf(ev).Traceparent()) != 55 {
			b.Fatal("bad traceparent")
		}
	}
}

// BenchmarkEncodeJobRequested encodes a job.requested with a 64 KiB
// prompt: the size where the body's passes over the data show.
func BenchmarkEncodeJobRequested(b *testing.B) {
	bs, _ := testnats.Bus(b)
	ev := fullEvent()
	ev.Data.(*schemas.JobRequested).Prompt = strings.Repeat("Write an outline of the brief. ", 64<<10/31)
	b.ReportAllocs()
	for range b.N {
		if _, err := bs.Encode(ev); err != nil {
			b.Fatal(err)
		}
	}
}
