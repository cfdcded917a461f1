package bus

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/loopbus/loopbus/schemas"
	"github.com/nats-io/nats.go"
)

// ErrMalformed: a message on the event stream is not a valid loopbus event.
// The wrapped text says why; consumers dead-letter such messages.
var ErrMalformed = errors.New("malformed event")

// MaxEventBytes bounds one encoded event. Artifacts belong in the object
// store; events carry references. It is half of NATS's default max_payload
// (1 MiB), so an oversized event published by hand is still stored, and
// then dead-lettered with the reason, rather than refused unseen.
const MaxEventBytes = 512 << 10

// ContentType is the structured-mode CloudEvents content type.
const ContentType = "application/cloudevents+json"

// Extension attribute names.
const (
	extSession     = "session"
	extStep        = "step"
	extJob         = "job"
	extCausation   = "causation"
	extCorrelation = "correlation"
	// extForkOf marks a copy in a fork's history (schemas.Event.ForkOf).
	extForkOf = "forkof"
	// ExtTraceparent is the CloudEvents distributed-tracing extension:
	// the W3C trace context of the span the event belongs to (see SpanOf).
	ExtTraceparent = "traceparent"
)

// Encode validates ev and returns the NATS message that carries it: the
// whole CloudEvent as structured JSON on the event's subject, with
// Nats-Msg-Id set to the event id. Empty Source and zero Time are filled
// with the bus's source and the current time.
func (b *Bus) Encode(ev schemas.Event) (*nats.Msg, error) {
	if ev.Source == "" {
		ev.Source = b.source
	}
	if ev.Time.IsZero() {
		ev.Time = time.Now()
	}
	m, err := encodeEvent(b.cat, ev)
	if err == nil && b.signer != nil {
		err = b.signer.sign(m)
	}
	return m, err
}

func encodeEvent(cat *schemas.Catalogue, ev schemas.Event) (*nats.Msg, error) {
	if ev.ID == "" {
		return nil, fmt.Errorf("event %s: empty id", ev.Type)
	}
	subject, err := ev.StreamSubject()
	if err != nil {
		return nil, err
	}
	raw, err := cat.Encode(ev.Type, ev.Data)
	if err != nil {
		return nil, err
	}
	source, ok := uriReference(ev.Source)
	if !ok {
		return nil, fmt.Errorf("event %s: source %q is not a URI reference", ev.Type, ev.Source)
	}
	// The traceparent is derived from the attributes alone, never taken
	// from the caller: see SpanOf. Decode does not need it (events of
	// other publishers may lack it or carry their own); it is for tracers
	// and subscribers.
	ext := [7][2]string{
		{extSession, ev.Session}, {extStep, ev.Step}, {extJob, ev.Job},
		{extCausation, ev.Causation}, {extCorrelation, ev.Correlation}, {extForkOf, ev.ForkOf},
		{ExtTraceparent, SpanOf(ev).Traceparent()},
	}
	body := appendEvent(make([]byte, 0, len(raw)+512), ev.ID, source, ev.Type, ev.Subject(), schemas.DataSchemaURI(ev.Type), ev.Time, ext, raw)
	if len(body) > MaxEventBytes {
		return nil, fmt.Errorf("event %s: %d bytes exceeds the %d-byte limit", ev.Type, len(body), MaxEventBytes)
	}
	m := nats.NewMsg(subject)
	m.Header.Set(nats.MsgIdHdr, ev.ID)
	m.Header.Set("Content-Type", ContentType)
	m.Data = body
	return m, nil
}

// subjectIs reports whether subject is the subject attribute of an event
// of session and step: session, or session/step.
func subjectIs(subject []byte, session, step string) bool {
	if step == "" {
		return string(subject) == session
	}
	return len(subject) == len(session)+1+len(step) && string(subject[:len(session)]) == session &&
		subject[len(session)] == '/' && string(subject[len(session)+1:]) == step
}

// Decode parses a message from the event stream into an Event, checking
// everything a consumer relies on: structured CloudEvents JSON, spec
// version 1.0, required attributes, a known type whose data satisfies its
// schema, a subject that matches the event's session and type, and a
// Nats-Msg-Id header equal to the event id (which Encode sets), and, with
// a trust file, a signature by a key trusted to state the event's type
// (ErrUntrusted). Every failure wraps ErrMalformed.
func (b *Bus) Decode(subject string, header nats.Header, data []byte) (schemas.Event, error) {
	return b.decode(subject, header, data, true)
}

// decode is Decode; without checkSchema, the data is decoded into its Go
// type but not checked against its schema (ReadOptions.SkipSchema).
func (b *Bus) decode(subject string, header nats.Header, data []byte, checkSchema bool) (schemas.Event, error) {
	bad := func(format string, a ...any) (schemas.Event, error) {
		return schemas.Event{}, fmt.Errorf("%w: %s", ErrMalformed, fmt.Sprintf(format, a...))
	}
	if len(data) > MaxEventBytes {
		return bad("%d bytes exceeds the %d-byte limit", len(data), MaxEventBytes)
	}
	e, err := parseEnvelope(data)
	if errors.Is(err, errSyntax) {
		return bad("%v", err)
	}
	if err != nil {
		return bad("not a CloudEvent: %v", err)
	}
	if !e.has(attrSpecVersion) {
		return bad("not a CloudEvent: no specversion")
	}
	for i := attrID; i <= attrDataSchema; i++ {
		if !e.has(i) {
			return bad("missing attribute %s", attrNames[i])
		}
	}
	if v := e.attrs[attrSpecVersion]; string(v) != specVersion {
		return bad("specversion %q, want %q", v, specVersion)
	}
	switch {
	case len(e.attrs[attrID]) == 0:
		return bad("empty attribute id")
	}
	// Strings only of the attributes the event keeps, each of its own:
	// readers keep some for long (a session's id) and others not.
	var attrs [numAttrs]string
	for _, i := range [...]int{attrID, attrSource, attrSession, attrStep, attrJob, attrCausation, attrCorrelation, attrForkOf} {
		if len(e.attrs[i]) > 0 {
			attrs[i] = string(e.attrs[i])
		}
	}
	source, ok := uriReference(attrs[attrSource])
	switch {
	case !ok:
		return bad("attribute source %q is not a URI reference", attrs[attrSource])
	case len(e.attrs[attrType]) == 0:
		return bad("empty attribute type")
	case len(e.attrs[attrSubject]) == 0:
		return bad("empty attribute subject")
	}
	t, err := time.Parse(time.RFC3339Nano, string(e.attrs[attrTime]))
	if err != nil || t.IsZero() {
		return bad("attribute time %q is not an RFC 3339 time", e.attrs[attrTime])
	}
	if v := e.attrs[attrDataContentType]; string(v) != dataContentType {
		return bad("datacontenttype %q, want %q", v, dataContentType)
	}
	typ, dataSchema, known := b.cat.Lookup(e.attrs[attrType])
	if !known {
		return bad("unknown type %q", e.attrs[attrType])
	}
	if v := e.attrs[attrDataSchema]; string(v) != dataSchema {
		return bad("dataschema %q, want %q", v, dataSchema)
	}
	if e.data == nil {
		return bad("no data")
	}
	ev := schemas.Event{
		ID:          attrs[attrID],
		Source:      source,
		Type:        typ,
		Session:     attrs[attrSession],
		Step:        attrs[attrStep],
		Job:         attrs[attrJob],
		Causation:   attrs[attrCausation],
		Correlation: attrs[attrCorrelation],
		ForkOf:      attrs[attrForkOf],
		Time:        t,
	}
	if ev.Session == "" {
		return bad("missing extension attribute session")
	}
	if err := schemas.ValidateSessionID(ev.Session); err != nil {
		return bad("%v", err)
	}
	if v := e.attrs[attrSubject]; !subjectIs(v, ev.Session, ev.Step) {
		return bad("subject attribute %q does not match session/step %q", v, ev.Subject())
	}
	if !ev.OnStreamSubject(subject) {
		want, _ := ev.StreamSubject()
		if ev.ForkOf != "" {
			return bad("published on %q but a copy of a %s event in the history of session %s belongs on %q", subject, ev.Type, ev.Session, want)
		}
		return bad("published on %q but a %s event of session %s belongs on %q", subject, ev.Type, ev.Session, want)
	}
	// The de-duplication id is what makes a replayed copy harmless: the
	// server drops it within the duplicate window. A copy without it (or
	// with another) would be stored again.
	switch msgID := header.Get(nats.MsgIdHdr); {
	case msgID == "":
		return bad("no %s header: events are published with their id as de-duplication id; a copy without it is a replay or was published by hand", nats.MsgIdHdr)
	case msgID != ev.ID:
		return bad("%s %q is not the event id %q: a replayed or altered copy", nats.MsgIdHdr, msgID, ev.ID)
	}
	if b.trust != nil {
		// A copy in a fork's history is stated by whoever forked (see
		// schemas.SessionForked): the roles that may fork may copy.
		stated := ev.Type
		if ev.ForkOf != "" {
			stated = schemas.TypeSessionForked
		}
		signer, err := b.trust.verify(stated, subject, header, data)
		if err != nil {
			return schemas.Event{}, fmt.Errorf("%w: %w", ErrMalformed, err)
		}
		ev.Signer = signer
	}
	decode := b.cat.Decode
	if !checkSchema {
		decode = b.cat.DecodeUnchecked
	}
	d, err := decode(ev.Type, e.data)
	if err != nil {
		return bad("%v", err)
	}
	ev.Data = d
	return ev, nil
}

// SpanKind says what a span of a session's trace stands for.
type SpanKind uint8

// The spans of a session's trace, from the root down: the session, each
// iteration of a step, each job (one agent run of an iteration), each tool
// call of a job.
const (
	SpanSession SpanKind = iota
	SpanIteration
	SpanJob
	SpanTool
)

func (k SpanKind) String() string {
	switch k {
	case SpanSession:
		return "session"
	case SpanIteration:
		return "iteration"
	case SpanJob:
		return "job"
	case SpanTool:
		return "tool"
	}
	return "SpanKind(" + strconv.Itoa(int(k)) + ")"
}

// SpanRef names a span of a session's trace by what identifies it. Its
// trace and span ids are pure functions of these parts (TraceID, SpanID),
// so anyone holding an event can compute the span it belongs to, and that
// span's parents, without any state.
type SpanRef struct {
	Kind    SpanKind
	Session string
	// Step and Iteration identify an iteration span, and the iteration
	// of a job or tool span. Iteration is the job id's part after
	// "<session>.<step>." without the attempt: "3", "3.r1" (iteration 3
	// of the step's second round), "merge2" (a loop's merge job); the
	// whole job id when it is not of that form.
	Step, Iteration string
	// Job identifies a job span and a tool span's job; Tool a tool span.
	Job, Tool string
}

// SpanOf returns the span ev belongs to, from its attributes and the ids
// its data carries:
//
//   - tool.started, tool.completed: the tool call's span (job and tool id);
//   - job.started, job.heartbeat, job.released, agent.message,
//     artifact.stored, job.completed, job.failed: the job's span;
//   - job.requested, job.cancelled, validation.passed, validation.failed,
//     step.waiting, step.completed: the span of the step iteration the
//     job id names;
//   - every other event (session.*, signal.*, step.failed, which does not
//     say which round of the step failed, step.paused, task.*, loop.*, …):
//     the session's root span.
//
// An event of those kinds without a job id belongs to the root span, a
// tool event without a tool id to its job's span. The job id is the job
// extension, else the data's jobId.
func SpanOf(ev schemas.Event) SpanRef {
	root := SpanRef{Kind: SpanSession, Session: ev.Session}
	job := ev.Job
	tool := ""
	kind := SpanSession
	switch d := ev.Data.(type) {
	case *schemas.ToolStarted:
		job, tool, kind = orElse(job, d.JobID), d.ToolID, SpanTool
	case *schemas.ToolCompleted:
		job, tool, kind = orElse(job, d.JobID), d.ToolID, SpanTool
	case *schemas.JobStarted:
		job, kind = orElse(job, d.JobID), SpanJob
	case *schemas.JobHeartbeat:
		job, kind = orElse(job, d.JobID), SpanJob
	case *schemas.JobReleased:
		job, kind = orElse(job, d.JobID), SpanJob
	case *schemas.AgentMessage:
		job, kind = orElse(job, d.JobID), SpanJob
	case *schemas.ArtifactStored:
		job, kind = orElse(job, d.JobID), SpanJob
	case *schemas.JobCompleted:
		job, kind = orElse(job, d.JobID), SpanJob
	case *schemas.JobFailed:
		job, kind = orElse(job, d.JobID), SpanJob
	case *schemas.JobRequested:
		job, kind = orElse(job, d.JobID), SpanIteration
	case *schemas.JobCancelled:
		job, kind = orElse(job, d.JobID), SpanIteration
	case *schemas.Verdict:
		job, kind = orElse(job, d.JobID), SpanIteration
	case *schemas.StepWaiting:
		job, kind = orElse(job, d.JobID), SpanIteration
	case *schemas.StepCompleted:
		job, kind = orElse(job, d.JobID), SpanIteration
	}
	if job == "" || kind == SpanSession {
		return root
	}
	r := SpanRef{Kind: kind, Session: ev.Session, Step: ev.Step, Job: job, Tool: tool}
	r.Iteration = iterationKey(ev.Session, ev.Step, job)
	switch {
	case kind == SpanTool && tool == "":
		r.Kind = SpanJob
	case kind == SpanIteration:
		r.Job = ""
		if r.Iteration == "" {
			return root
		}
	}
	return r
}

func orElse(s, otherwise string) string {
	if s == "" {
		return otherwise
	}
	return s
}

// iterationKey is the part of a job id naming its step iteration: the
// job id is "<session>.<step>.<iteration>[.a<attempt>][.r<round>]"
// (orchestrator.JobID; a loop's merge job has "merge<n>" for the
// iteration), and the attempts of one iteration share its span. A job id
// not of that form (a job requested by another tool) is its own
// iteration.
func iterationKey(session, step, job string) string {
	if step == "" || len(job) <= len(session)+len(step)+2 ||
		job[:len(session)] != session || job[len(session)] != '.' ||
		job[len(session)+1:len(session)+1+len(step)] != step || job[len(session)+1+len(step)] != '.' {
		return job
	}
	rest := job[len(session)+len(step)+2:]
	first, tail, _ := strings.Cut(rest, ".")
	if tail == "" {
		return first
	}
	var b strings.Builder
	b.WriteString(first)
	for part := range strings.SplitSeq(tail, ".") {
		if isAttempt(part) {
			continue
		}
		b.WriteByte('.')
		b.WriteString(part)
	}
	return b.String()
}

// isAttempt reports whether a job id part is "a" and digits.
func isAttempt(part string) bool {
	if len(part) < 2 || part[0] != 'a' {
		return false
	}
	for i := 1; i < len(part); i++ {
		if part[i] < '0' || part[i] > '9' {
			return false
		}
	}
	return true
}

// Parent returns the span r's span is a child of: a tool call's job, a
// job's step iteration, an iteration's session. The session's root span
// has none (ok false).
func (r SpanRef) Parent() (SpanRef, bool) {
	switch r.Kind {
	case SpanTool:
		return SpanRef{Kind: SpanJob, Session: r.Session, Step: r.Step, Iteration: r.Iteration, Job: r.Job}, true
	case SpanJob:
		if r.Iteration != "" {
			return SpanRef{Kind: SpanIteration, Session: r.Session, Step: r.Step, Iteration: r.Iteration}, true
		}
		return SpanRef{Kind: SpanSession, Session: r.Session}, true
	case SpanIteration:
		return SpanRef{Kind: SpanSession, Session: r.Session}, true
	}
	return SpanRef{}, false
}

// TraceID is the trace of r's session: the first 16 bytes of
// SHA-256 over the parts "loopbus.trace" and the session id, each written
// as its decimal byte length, ":" and the part (the hex of it is
// schemas.DeterministicID("loopbus.trace", session)).
func (r SpanRef) TraceID() [16]byte {
	sum := traceHash("loopbus.trace", r.Session)
	var id [16]byte
	copy(id[:], sum[:16])
	if id == [16]byte{} {
		id[15] = 1 // all zeros is not a valid trace id
	}
	return id
}

// SpanID is the first 8 bytes of the same hash over "loopbus.span", the
// kind's name and the parts that identify the span:
//
//	session:   "loopbus.span", "session", <session>
//	iteration: "loopbus.span", "iteration", <session>, <step>, <iteration>
//	job:       "loopbus.span", "job", <session>, <job id>
//	tool:      "loopbus.span", "tool", <session>, <job id>, <tool id>
func (r SpanRef) SpanID() [8]byte {
	var sum [32]byte
	switch r.Kind {
	case SpanIteration:
		sum = traceHash("loopbus.span", "iteration", r.Session, r.Step, r.Iteration)
	case SpanJob:
		sum = traceHash("loopbus.span", "job", r.Session, r.Job)
	case SpanTool:
		sum = traceHash("loopbus.span", "tool", r.Session, r.Job, r.Tool)
	default:
		sum = traceHash("loopbus.span", "session", r.Session)
	}
	var id [8]byte
	copy(id[:], sum[:8])
	if id == [8]byte{} {
		id[7] = 1 // all zeros is not a valid span id
	}
	return id
}

// Traceparent is the W3C traceparent of r's span, as every event carries
// it: "00-<trace id>-<span id>-01" in lowercase hex (version 0, sampled).
func (r SpanRef) Traceparent() string {
	tid, sid := r.TraceID(), r.SpanID()
	var b [55]byte
	copy(b[:], "00-")
	hex.Encode(b[3:35], tid[:])
	b[35] = '-'
	hex.Encode(b[36:52], sid[:])
	copy(b[52:], "-01")
	return string(b[:])
}

// traceHash is SHA-256 over parts, each written as its decimal byte
// length, ":" and the part: the input of schemas.DeterministicID, without
// its allocations.
func traceHash(parts ...string) [32]byte {
	var buf [192]byte
	b := buf[:0]
	for _, p := range parts {
		b = strconv.AppendInt(b, int64(len(p)), 10)
		b = append(b, ':')
		b = append(b, p...)
	}
	return sha256.Sum256(b)
}
