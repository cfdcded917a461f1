package tracing_test

import (
	"compress/gzip"
	"context"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/schemas"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// collector is an OTLP/HTTP trace receiver: it decodes each export
// request (protobuf) and keeps the spans.
type collector struct {
	*httptest.Server
	mu       sync.Mutex
	spans    []*tracepb.Span
	services []string
	requests int
	bad      []string
}

func newCollector(t *testing.T) *collector {
	c := &collector{}
	c.Server = httptest.NewServer(http.HandlerFunc(c.serve))
	t.Cleanup(c.Close)
	return c
}

func (c *collector) serve(w http.ResponseWriter, r *http.Request) {
	fail := func(why string) {
		c.mu.Lock()
		c.bad = append(c.bad, why)
		c.mu.Unlock()
		http.Error(w, why, http.StatusBadRequest)
	}
	if r.Method != http.MethodPost || r.URL.Path != "/v1/traces" {
		fail(r.Method + " " + r.URL.Path)
		return
	}
	if ct := r.Header.Get("Content-Type"); ct != "application/x-protobuf" {
		fail("content type " + ct)
		return
	}
	var body io.Reader = r.Body
	if r.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			fail(err.Error())
			return
		}
		body = zr
	}
	raw, err := io.ReadAll(body)
	if err != nil {
		fail(err.Error())
		return
	}
	var req coltracepb.ExportTraceServiceRequest
	if err := proto.Unmarshal(raw, &req); err != nil {
		fail("not an ExportTraceServiceRequest: " + err.Error())
		return
	}
	c.mu.Lock()
	c.requests++
	for _, rs := range req.GetResourceSpans() {
		for _, kv := range rs.GetResource().GetAttributes() {
			if kv.GetKey() == "service.name" {
				c.services = append(c.services, kv.GetValue().GetStringValue())
			}
		}
		for _, ss := range rs.GetScopeSpans() {
			c.spans = append(c.spans, ss.GetSpans()...)
		}
	}
	c.mu.Unlock()
	out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
}

// exported returns the spans received so far, by hex span id, failing
// the test on a span received twice or a bad request.
func (c *collector) exported(t *testing.T) map[string]*tracepb.Span {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.bad) > 0 {
		t.Fatalf("collector got bad requests: %v", c.bad)
	}
	out := map[string]*tracepb.Span{}
	for _, sp := range c.spans {
		id := hex.EncodeToString(sp.GetSpanId())
		if _, dup := out[id]; dup {
			t.Fatalf("span %s (%s) exported twice", id, sp.GetName())
		}
		out[id] = sp
	}
	return out
}

// await polls cond every 20 ms until it returns nil, failing the test
// with cond's last error after timeout.
func await(t *testing.T, timeout time.Duration, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s: %v", timeout, err)
		}
		<-tick.C
	}
}

// attr returns span attribute key as a string ("" when absent).
func attr(sp *tracepb.Span, key string) string {
	return attrIn(sp.GetAttributes(), key)
}

func attrIn(kvs []*commonpb.KeyValue, key string) string {
	for _, kv := range kvs {
		if kv.GetKey() != key {
			continue
		}
		switch v := kv.GetValue().GetValue().(type) {
		case *commonpb.AnyValue_StringValue:
			return v.StringValue
		case *commonpb.AnyValue_IntValue:
			return strconv.FormatInt(v.IntValue, 10)
		case *commonpb.AnyValue_BoolValue:
			return strconv.FormatBool(v.BoolValue)
		case *commonpb.AnyValue_DoubleValue:
			return strconv.FormatFloat(v.DoubleValue, 'g', -1, 64)
		}
	}
	return ""
}

// sessionBuilder writes the events of made-up sessions, as the services
// would, with orchestrator job ids.
type sessionBuilder struct {
	t   *testing.T
	b   *bus.Bus
	n   int
	at  time.Time
	evs []schemas.Event
}

func newBuilder(t *testing.T, b *bus.Bus) *sessionBuilder {
	return &sessionBuilder{t: t, b: b, at: time.Now().UTC().Truncate(time.Millisecond)}
}

// add publishes one event (a millisecond after the previous one).
func (sb *sessionBuilder) add(session, typ, step, job string, data any) schemas.Event {
	sb.t.Helper()
	sb.n++
	sb.at = sb.at.Add(time.Millisecond)
	ev := schemas.Event{
		ID: schemas.DeterministicID(session, typ, strconv.Itoa(sb.n)), Type: typ, Session: session, Step: step, Job: job,
		Time: sb.at, Data: data,
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := sb.b.Publish(ctx, ev); err != nil {
		sb.t.Fatalf("publish %s: %v", typ, err)
	}
	sb.evs = append(sb.evs, ev)
	return ev
}

func (sb *sessionBuilder) start(session string) {
	in := schemas.ArtifactRef{Name: "in.md", Object: session + "/input/in.md", Digest: schemas.Digest([]byte("in")), Size: 2}
	sb.add(session, schemas.TypeSessionStarted, "", "", &schemas.SessionStarted{
		Pipeline: schemas.Pipeline{Name: "demo", Steps: []schemas.Step{{
			Name: "draft", Agent: schemas.AgentSpec{Backend: "exec", Command: []string{"./agent.sh"}},
			Prompt: "write", MaxIterations: 3, TimeoutMs: 60000,
		}}},
		Input: in, SourceHash: schemas.ShortHash(in.Digest),
	})
}

// request asks for a job of step draft and returns its id.
func (sb *sessionBuilder) request(session string, iteration, attempt, round int) string {
	job := session + ".draft." + strconv.Itoa(iteration)
	if attempt > 1 {
		job += ".a" + strconv.Itoa(attempt)
	}
	if round > 0 {
		job += ".r" + strconv.Itoa(round)
	}
	sb.add(session, schemas.TypeJobRequested, "draft", job, &schemas.JobRequested{
		JobID: job, Step: "draft", Iteration: iteration, Attempt: attempt, Round: round,
		Agent: schemas.AgentSpec{Backend: "exec", Command: []string{"./agent.sh"}}, Prompt: "write", TimeoutMs: 60000,
		Inputs: []schemas.ArtifactRef{},
	})
	return job
}

func (sb *sessionBuilder) started(session, job, worker string) {
	sb.add(session, schemas.TypeJobStarted, "draft", job, &schemas.JobStarted{JobID: job, Worker: worker, Delivery: 1})
}

func (sb *sessionBuilder) tool(session, job, tool string) {
	sb.add(session, schemas.TypeToolStarted, "draft", job, &schemas.ToolStarted{JobID: job, ToolID: tool, Name: "run", Lane: "shell"})
	sb.add(session, schemas.TypeToolCompleted, "draft", job, &schemas.ToolCompleted{JobID: job, ToolID: tool, Name: "run", Lane: "shell",
		Status: "ok", DurationMs: 1})
}

func (sb *sessionBuilder) artifact(session, job string) schemas.ArtifactRef {
	ref := schemas.ArtifactRef{Name: "draft.md", Object: job + "/draft.md", Digest: schemas.Digest([]byte(job)), Size: int64(len(job)), Step: "draft"}
	sb.add(session, schemas.TypeArtifactStored, "draft", job, &schemas.ArtifactStored{JobID: job, Artifact: ref})
	return ref
}

func (sb *sessionBuilder) completed(session, job string, iteration int, ref schemas.ArtifactRef) {
	sb.add(session, schemas.TypeJobCompleted, "draft", job, &schemas.JobCompleted{JobID: job, Step: "draft", Iteration: iteration,
		Worker: "w1", DurationMs: 5, Artifacts: []schemas.ArtifactRef{ref},
		Usage: &schemas.Usage{InputTokens: 100, OutputTokens: 20, CostUSD: 0.01}})
}

func (sb *sessionBuilder) failed(session, job string, iteration int, retryable bool) {
	sb.add(session, schemas.TypeJobFailed, "draft", job, &schemas.JobFailed{JobID: job, Step: "draft", Iteration: iteration,
		Worker: "w1", ExitCode: 3, DurationMs: 5, Error: "agent exited 3", Retryable: retryable})
}

func (sb *sessionBuilder) verdict(session, job string, iteration int, ref schemas.ArtifactRef, pass bool) {
	typ := schemas.TypeValidationPassed
	v := &schemas.Verdict{JobID: job, Step: "draft", Iteration: iteration, Artifacts: []schemas.ArtifactRef{ref}}
	if !pass {
		typ = schemas.TypeValidationFailed
		v.Errors = []schemas.ValidationError{{Artifact: "draft.md", Message: "too short", Source: "command"}}
	}
	sb.add(session, typ, "draft", job, v)
}

// passingSession is a session whose step draft fails validation once,
// then passes; each job calls two tools.
func (sb *sessionBuilder) passingSession(session string) {
	sb.start(session)
	job := sb.request(session, 1, 1, 0)
	sb.started(session, job, "w1")
	sb.tool(session, job, "t1")
	sb.tool(session, job, "t2")
	ref := sb.artifact(session, job)
	sb.completed(session, job, 1, ref)
	sb.verdict(session, job, 1, ref, false)
	job = sb.request(session, 2, 1, 0)
	sb.started(session, job, "w2")
	sb.tool(session, job, "t1")
	ref = sb.artifact(session, job)
	sb.completed(session, job, 2, ref)
	sb.verdict(session, job, 2, ref, true)
	sb.add(session, schemas.TypeStepCompleted, "draft", "", &schemas.StepCompleted{Step: "draft", JobID: job, Iterations: 2,
		Artifacts: []schemas.ArtifactRef{ref}, ContentHash: schemas.ShortHash(ref.Digest)})
	sb.add(session, schemas.TypeSessionCompleted, "", "", &schemas.SessionCompleted{Final: []schemas.ArtifactRef{ref}})
}

// failingSession is a session whose job fails retryably (a second
// attempt of the same iteration), then fails for good.
func (sb *sessionBuilder) failingSession(session string) {
	sb.start(session)
	job := sb.request(session, 1, 1, 0)
	sb.started(session, job, "w1")
	sb.failed(session, job, 1, true)
	job = sb.request(session, 1, 2, 0)
	sb.started(session, job, "w1")
	sb.tool(session, job, "t1")
	sb.failed(session, job, 1, false)
	sb.add(session, schemas.TypeStepFailed, "draft", "", &schemas.StepFailed{Step: "draft", Iterations: 1, Error: "agent exited 3"})
	sb.add(session, schemas.TypeSessionFailed, "", "", &schemas.SessionFailed{Step: "draft", Reason: "step draft failed"})
}
