package bus_test

import (
	"encoding/json"
	"errors"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/internal/testnats"
	"github.com/loopbus/loopbus/schemas"
	"github.com/nats-io/nats.go"
)

// fullEvent is a realistic job.requested event with every attribute set.
func fullEvent() schemas.Event {
	ref := schemas.ArtifactRef{
		Name: "brief.md", Object: "s1/input/brief.md",
		Digest: schemas.Digest([]byte("# brief\n")), Size: 8, ContentType: "text/markdown",
	}
	return schemas.Event{
		ID:          "0123456789abcdef0123456789abcdef",
		Source:      "orchestrator/host-1",
		Type:        schemas.TypeJobRequested,
		Session:     "s1",
		Step:        "outline",
		Job:         "job-outline-2",
		Causation:   "cause-id",
		Correlation: "corr-id",
		Time:        time.Date(2025, 3, 14, 15, 9, 26, 535897932, time.FixedZone("CET", 3600)),
		Data: &schemas.JobRequested{
			JobID:     "job-outline-2",
			Step:      "outline",
			Iteration: 2,
			Attempt:   1,
			Agent: schemas.AgentSpec{
				Backend: "exec",
				Command: []string{"./agent.sh", "--fast"},
				Env:     map[string]string{"MODE": "test"},
			},
			Prompt: "Write an outline.\nUse the brief.",
			Inputs: []schemas.ArtifactRef{ref},
			Outputs: []schemas.Output{{
				Name: "outline.json", SchemaPath: "schemas/outline.json",
				Schema: json.RawMessage(`{"type":"object"}`), SchemaVersion: "v3",
			}},
			Validate:          []string{"./check.sh"},
			TimeoutMs:         60000,
			ValidateTimeoutMs: 5000,
			Dir:               "/srv/pipelines",
			Feedback: []schemas.Feedback{{
				Iteration: 1, Kind: "validation", Message: "missing title",
				Errors:    []schemas.ValidationError{{Artifact: "outline.json", Pointer: "/title", Message: "required", Source: "schema"}},
				RetryHint: "add a title",
			}},
		},
	}
}

func TestEncodeDecodeRoundTrip(t *testing.T) {
	t.Parallel()
	b, _ := testnats.Bus(t)
	want := fullEvent()
	m, err := b.Encode(want)
	if err != nil {
		t.Fatalf("Encode: %v", err)
	}
	if m.Subject != "loopbus.evt.s1.job.requested" {
		t.Errorf("subject %q", m.Subject)
	}
	got, err := b.Decode(m.Subject, m.Header, m.Data)
	if err != nil {
		t.Fatalf("Decode: %v", err)
	}
	if !got.Time.Equal(want.Time) {
		t.Errorf("time %v, want %v", got.Time, want.Time)
	}
	got.Time, want.Time = time.Time{}, time.Time{}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("round trip:\n got %+v\nwant %+v", got, want)
	}
	if !reflect.DeepEqual(got.Data, want.Data) {
		gj, _ := json.Marshal(got.Data)
		wj, _ := json.Marshal(want.Data)
		t.Errorf("data:\n got %s\nwant %s", gj, wj)
	}
}

func TestEncodeStructuredCloudEvent(t *testing.T) {
	t.Parallel()
	b, _ := testnats.Bus(t)
	ev := fullEvent()
	m, err := b.Encode(ev)
	if err != nil {
		t.Fatalf("Encode: %v", err)
	}
	if got := m.Header.Get(nats.MsgIdHdr); got != ev.ID {
		t.Errorf("Nats-Msg-Id %q, want %q", got, ev.ID)
	}
	if got := m.Header.Get("Content-Type"); got != "application/cloudevents+json" {
		t.Errorf("Content-Type %q", got)
	}
	var ce map[string]any
	if err := json.Unmarshal(m.Data, &ce); err != nil {
		t.Fatalf("body is not JSON: %v", err)
	}
	wantAttrs := map[string]string{
		"specversion":     "1.0",
		"id":              ev.ID,
		"source":          ev.Source,
		"type":            schemas.TypeJobRequested,
		"subject":         "s1/outline",
		"datacontenttype": "application/json",
		"dataschema":      "urn:loopbus:schema:v1:job.requested",
		"session":         "s1",
		"step":            "outline",
		"job":             "job-outline-2",
		"causation":       "cause-id",
		"correlation":     "corr-id",
		// job-outline-2 is not an orchestrator job id: its own iteration.
		"traceparent": "00-" + schemas.DeterministicID("loopbus.trace", "s1") + "-" +
			schemas.DeterministicID("loopbus.span", "iteration", "s1", "outline", "job-outline-2")[:16] + "-01",
	}
	for k, want := range wantAttrs {
		if got, _ := ce[k].(string); got != want {
			t.Errorf("attribute %s = %#v, want %q", k, ce[k], want)
		}
	}
	ts, _ := ce["time"].(string)
	tm, err := time.Parse(time.RFC3339Nano, ts)
	if err != nil || !tm.Equal(ev.Time) {
		t.Errorf("time %q (%v), want %v", ts, err, ev.Time)
	}
	data, ok := ce["data"].(map[string]any)
	if !ok {
		t.Fatalf("data is %T, want a JSON object", ce["data"])
	}
	if data["jobId"] != "job-outline-2" || data["prompt"] != "Write an outline.\nUse the brief." {
		t.Errorf("data %v", data)
	}
	var keys []string
	for k := range ce {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	wantKeys := []string{"causation", "correlation", "data", "datacontenttype", "dataschema", "id", "job", "session", "source", "specversion", "step", "subject", "time", "traceparent", "type"}
	if !reflect.DeepEqual(keys, wantKeys) {
		t.Errorf("members %v, want %v", keys, wantKeys)
	}
}

func TestEncodeOmitsEmptyExtensionsAndFillsDefaults(t *testing.T) {
	t.Parallel()
	b, _ := testnats.Bus(t)
	ev := jobStarted("s1", "e1")
	ev.Step, ev.Job = "", ""
	before := time.Now()
	m, err := b.Encode(ev)
	if err != nil {
		t.Fatalf("Encode: %v", err)
	}
	var ce map[string]any
	if err := json.Unmarshal(m.Data, &ce); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"step", "job", "causation", "correlation"} {
		if _, ok := ce[k]; ok {
			t.Errorf("empty extension %s was encoded", k)
		}
	}
	if ce["subject"] != "s1" {
		t.Errorf("subject %v, want s1", ce["subject"])
	}
	if ce["source"] != b.Source() {
		t.Errorf("source %v, want the bus source %q", ce["source"], b.Source())
	}
	got, err := b.Decode(m.Subject, m.Header, m.Data)
	if err != nil {
		t.Fatalf("Decode: %v", err)
	}
	if got.Time.Before(before.Add(-time.Second)) || got.Time.After(time.Now().Add(time.Second)) {
		t.Errorf("filled time %v is not now", got.Time)
	}
	if got.Source != b.Source() {
		t.Errorf("decoded source %q", got.Source)
	}
}

// mutated returns the encoded body of ev after f changed its JSON members.
func mutated(t *testing.T, b *bus.Bus, ev schemas.Event, f func(map[string]any)) []byte {
	t.Helper()
	m, err := b.Encode(ev)
	if err != nil {
		t.Fatalf("Encode: %v", err)
	}
	var ce map[string]any
	if err := json.Unmarshal(m.Data, &ce); err != nil {
		t.Fatal(err)
	}
	f(ce)
	out, err := json.Marshal(ce)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestDecodeRejects(t *testing.T) {
	t.Parallel()
	b, _ := testnats.Bus(t)
	base := jobStarted("s1", "e1")
	const subj = "loopbus.evt.s1.job.started"
	set := func(k string, v any) func(map[string]any) { return func(m map[string]any) { m[k] = v } }
	del := func(k string) func(map[string]any) { return func(m map[string]any) { delete(m, k) } }
	body := func(f func(map[string]any)) []byte { return mutated(t, b, base, f) }

	tests := []struct {
		name    string
		subject string
		header  nats.Header // nil means the header Encode sets
		data    []byte
		wantErr bool
	}{
		{name: "valid", subject: subj, data: body(func(map[string]any) {})},
		{name: "no Nats-Msg-Id header (a replay or hand-published copy)", subject: subj, header: nats.Header{}, data: body(func(map[string]any) {}), wantErr: true},
		{name: "Nats-Msg-Id of another event", subject: subj, header: nats.Header{nats.MsgIdHdr: {"e2"}}, data: body(func(map[string]any) {}), wantErr: true},
		{name: "not JSON", subject: subj, data: []byte("garbage{"), wantErr: true},
		{name: "empty", subject: subj, data: nil, wantErr: true},
		{name: "JSON array", subject: subj, data: []byte(`[1,2]`), wantErr: true},
		{name: "JSON but not a CloudEvent", subject: subj, data: []byte(`{"hello":"world"}`), wantErr: true},
		{name: "specversion 0.3", subject: subj, data: body(set("specversion", "0.3")), wantErr: true},
		{name: "specversion a number", subject: subj, data: body(set("specversion", 1.0)), wantErr: true},
		{name: "missing id", subject: subj, data: body(del("id")), wantErr: true},
		{name: "empty id", subject: subj, data: body(set("id", "")), wantErr: true},
		{name: "missing source", subject: subj, data: body(del("source")), wantErr: true},
		{name: "missing type", subject: subj, data: body(del("type")), wantErr: true},
		{name: "missing subject", subject: subj, data: body(del("subject")), wantErr: true},
		{name: "missing time", subject: subj, data: body(del("time")), wantErr: true},
		{name: "unparsable time", subject: subj, data: body(set("time", "yesterday")), wantErr: true},
		{name: "unknown type", subject: "loopbus.evt.s1.job.exploded", data: body(set("type", "loopbus.job.exploded")), wantErr: true},
		{name: "foreign type", subject: subj, data: body(set("type", "com.example.thing")), wantErr: true},
		{name: "wrong dataschema", subject: subj, data: body(set("dataschema", "urn:loopbus:schema:v2:job.started")), wantErr: true},
		{name: "dataschema of another type", subject: subj, data: body(set("dataschema", "urn:loopbus:schema:v1:job.completed")), wantErr: true},
		{name: "missing dataschema", subject: subj, data: body(del("dataschema")), wantErr: true},
		{name: "datacontenttype text/plain", subject: subj, data: body(set("datacontenttype", "text/plain")), wantErr: true},
		{name: "data failing its schema", subject: subj, data: body(set("data", map[string]any{"jobId": "", "worker": "w1", "delivery": 1})), wantErr: true},
		{name: "data missing a required member", subject: subj, data: body(set("data", map[string]any{"jobId": "j", "worker": "w1"})), wantErr: true},
		{name: "data with a duplicate member", subject: subj, data: []byte(strings.Replace(string(body(func(map[string]any) {})), `"jobId":"job-e1"`, `"jobId":"job-e1","jobId":"job-e2"`, 1)), wantErr: true},
		{name: "data a string", subject: subj, data: body(set("data", "hello")), wantErr: true},
		{name: "data missing", subject: subj, data: body(del("data")), wantErr: true},
		{name: "payload over MaxEventBytes", subject: subj, data: body(set("padding", strings.Repeat("x", bus.MaxEventBytes))), wantErr: true},
		{name: "published on another session's subject", subject: "loopbus.evt.other.job.started", data: body(func(map[string]any) {}), wantErr: true},
		{name: "published under another entity", subject: "loopbus.evt.s1.tool.started", data: body(func(map[string]any) {}), wantErr: true},
		{name: "published under another verb", subject: "loopbus.evt.s1.job.completed", data: body(func(map[string]any) {}), wantErr: true},
		{name: "published outside the event subjects", subject: "other.s1.job.started", data: body(func(map[string]any) {}), wantErr: true},
		{name: "session extension missing", subject: subj, data: body(del("session")), wantErr: true},
		{name: "session extension invalid", subject: "loopbus.evt.s*1.job.started", data: body(func(m map[string]any) { m["session"] = "s*1"; m["subject"] = "s*1/plan" }), wantErr: true},
		{name: "session extension not a string", subject: subj, data: body(set("session", 7)), wantErr: true},
		{name: "subject attribute of another session", subject: subj, data: body(set("subject", "s2/plan")), wantErr: true},
		{name: "subject attribute without the step", subject: subj, data: body(set("subject", "s1")), wantErr: true},
		{name: "step extension missing", subject: subj, data: body(del("step")), wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			hdr := tt.header
			if hdr == nil {
				hdr = nats.Header{nats.MsgIdHdr: {base.ID}}
			}
			ev, err := b.Decode(tt.subject, hdr, tt.data)
			if (err != nil) != tt.wantErr {
				t.Fatalf("Decode() error = %v, wantErr %v (event %+v)", err, tt.wantErr, ev)
			}
			if err != nil && !errors.Is(err, bus.ErrMalformed) {
				t.Errorf("error %v does not wrap ErrMalformed", err)
			}
		})
	}
}

func TestEncodeRejects(t *testing.T) {
	t.Parallel()
	b, _ := testnats.Bus(t)
	with := func(f func(*schemas.Event)) schemas.Event {
		ev := jobStarted("s1", "e1")
		f(&ev)
		return ev
	}
	big := jobRequested("s1", "big")
	big.Data.(*schemas.JobRequested).Prompt = strings.Repeat("p", bus.MaxEventBytes)

	tests := []struct {
		name    string
		ev      schemas.Event
		wantErr error // nil: any error
	}{
		{name: "empty id", ev: with(func(e *schemas.Event) { e.ID = "" })},
		{name: "empty session", ev: with(func(e *schemas.Event) { e.Session = "" }), wantErr: schemas.ErrBadSessionID},
		{name: "session with a dot", ev: with(func(e *schemas.Event) { e.Session = "a.b" }), wantErr: schemas.ErrBadSessionID},
		{name: "session with a wildcard", ev: with(func(e *schemas.Event) { e.Session = "s>" }), wantErr: schemas.ErrBadSessionID},
		{name: "session too long", ev: with(func(e *schemas.Event) { e.Session = strings.Repeat("s", 65) }), wantErr: schemas.ErrBadSessionID},
		{name: "malformed type", ev: with(func(e *schemas.Event) { e.Type = "job.started" }), wantErr: schemas.ErrBadType},
		{name: "unknown type", ev: with(func(e *schemas.Event) { e.Type = "loopbus.job.exploded" }), wantErr: schemas.ErrUnknownType},
		{name: "data a value, not a pointer", ev: with(func(e *schemas.Event) { e.Data = schemas.JobStarted{JobID: "j", Worker: "w", Delivery: 1} }), wantErr: schemas.ErrInvalidData},
		{name: "data of another type", ev: with(func(e *schemas.Event) { e.Data = &schemas.JobFailed{JobID: "j"} }), wantErr: schemas.ErrInvalidData},
		{name: "nil data", ev: with(func(e *schemas.Event) { e.Data = nil }), wantErr: schemas.ErrInvalidData},
		{name: "data failing its schema", ev: with(func(e *schemas.Event) { e.Data = &schemas.JobStarted{JobID: "j", Worker: "w"} }), wantErr: schemas.ErrInvalidData},
		{name: "over MaxEventBytes", ev: big},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := b.Encode(tt.ev)
			if err == nil {
				t.Fatalf("Encode succeeded: %s %s", m.Subject, m.Data)
			}
			if tt.wantErr != nil && !errors.Is(err, tt.wantErr) {
				t.Errorf("Encode() = %v, want %v", err, tt.wantErr)
			}
		})
	}
	// Publish refuses the same events without writing anything.
	for _, tt := range tests {
		if _, err := b.Publish(ctxT(t), tt.ev); err == nil {
			t.Errorf("Publish of %q succeeded", tt.name)
		}
	}
	if n := msgCount(t, b); n != 0 {
		t.Errorf("stream holds %d events after refused publishes", n)
	}
}

// TestDecodeMatchesMembersExactly: a member whose name differs from a
// field's only in case is another member, as for every case-sensitive
// reader of the event: it neither fills nor overwrites the field.
func TestDecodeMatchesMembersExactly(t *testing.T) {
	t.Parallel()
	b, _ := testnats.Bus(t)
	ev := jobStarted("s1", "e1")
	m, err := b.Encode(ev)
	if err != nil {
		t.Fatal(err)
	}
	data := strings.Replace(string(m.Data), `"jobId":"job-e1"`, `"jobId":"job-e1","JOBID":"","WORKER":"x"`, 1)
	got, err := b.Decode(m.Subject, m.Header, []byte(data))
	if err != nil {
		t.Fatalf("Decode: %v", err)
	}
	if d := got.Data.(*schemas.JobStarted); d.JobID != "job-e1" || d.Worker != "w1" {
		t.Errorf("decoded %+v, want jobId job-e1 and worker w1", d)
	}
}
