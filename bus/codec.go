package bus

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	cloudevents "github.com/cloudevents/sdk-go/v2/event"
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
	subject, err := schemas.SubjectFor(ev.Session, ev.Type)
	if err != nil {
		return nil, err
	}
	raw, err := cat.Encode(ev.Type, ev.Data)
	if err != nil {
		return nil, err
	}
	ce := cloudevents.New(cloudevents.CloudEventsVersionV1)
	ce.SetID(ev.ID)
	ce.SetSource(ev.Source)
	ce.SetType(ev.Type)
	ce.SetSubject(ev.Subject())
	ce.SetTime(ev.Time.UTC())
	ce.SetDataSchema(schemas.DataSchemaURI(ev.Type))
	if err := ce.SetData(cloudevents.ApplicationJSON, json.RawMessage(raw)); err != nil {
		return nil, fmt.Errorf("event %s: %w", ev.Type, err)
	}
	for name, val := range map[string]string{
		extSession: ev.Session, extStep: ev.Step, extJob: ev.Job,
		extCausation: ev.Causation, extCorrelation: ev.Correlation,
	} {
		if val != "" {
			ce.SetExtension(name, val)
		}
	}
	if err := ce.Validate(); err != nil {
		return nil, fmt.Errorf("event %s: %w", ev.Type, err)
	}
	body, err := json.Marshal(ce)
	if err != nil {
		return nil, fmt.Errorf("event %s: %w", ev.Type, err)
	}
	if len(body) > MaxEventBytes {
		return nil, fmt.Errorf("event %s: %d bytes exceeds the %d-byte limit", ev.Type, len(body), MaxEventBytes)
	}
	m := nats.NewMsg(subject)
	m.Header.Set(nats.MsgIdHdr, ev.ID)
	m.Header.Set("Content-Type", ContentType)
	m.Data = body
	return m, nil
}

// Decode parses a message from the event stream into an Event, checking
// everything a consumer relies on: structured CloudEvents JSON, spec
// version 1.0, required attributes, a known type whose data satisfies its
// schema, a subject that matches the event's session and type, and a
// Nats-Msg-Id header equal to the event id (which Encode sets), and, with
// a trust file, a signature by a key trusted to state the event's type
// (ErrUntrusted). Every failure wraps ErrMalformed.
func (b *Bus) Decode(subject string, header nats.Header, data []byte) (schemas.Event, error) {
	return b.decode(subject, header, data)
}

func (b *Bus) decode(subject string, header nats.Header, data []byte) (schemas.Event, error) {
	bad := func(format string, a ...any) (schemas.Event, error) {
		return schemas.Event{}, fmt.Errorf("%w: %s", ErrMalformed, fmt.Sprintf(format, a...))
	}
	if len(data) > MaxEventBytes {
		return bad("%d bytes exceeds the %d-byte limit", len(data), MaxEventBytes)
	}
	var probe struct {
		SpecVersion *string `json:"specversion"`
	}
	if err := json.Unmarshal(data, &probe); err != nil {
		return bad("not JSON: %v", err)
	}
	if probe.SpecVersion == nil {
		return bad("not a CloudEvent: no specversion")
	}
	if *probe.SpecVersion != cloudevents.CloudEventsVersionV1 {
		return bad("specversion %q, want %q", *probe.SpecVersion, cloudevents.CloudEventsVersionV1)
	}
	var ce cloudevents.Event
	if err := json.Unmarshal(data, &ce); err != nil {
		return bad("not a CloudEvent: %v", err)
	}
	if err := ce.Validate(); err != nil {
		return bad("invalid CloudEvent: %v", err)
	}
	if ce.Subject() == "" {
		return bad("missing attribute subject")
	}
	if ce.Time().IsZero() {
		return bad("missing attribute time")
	}
	if ce.DataContentType() != cloudevents.ApplicationJSON {
		return bad("datacontenttype %q, want %q", ce.DataContentType(), cloudevents.ApplicationJSON)
	}
	if !b.cat.Known(ce.Type()) {
		return bad("unknown type %q", ce.Type())
	}
	if want := schemas.DataSchemaURI(ce.Type()); ce.DataSchema() != want {
		return bad("dataschema %q, want %q", ce.DataSchema(), want)
	}
	ext := func(name string) string {
		v, _ := ce.Extensions()[name].(string)
		return v
	}
	ev := schemas.Event{
		ID:          ce.ID(),
		Source:      ce.Source(),
		Type:        ce.Type(),
		Session:     ext(extSession),
		Step:        ext(extStep),
		Job:         ext(extJob),
		Causation:   ext(extCausation),
		Correlation: ext(extCorrelation),
		Time:        ce.Time(),
	}
	if ev.Session == "" {
		return bad("missing extension attribute session")
	}
	if err := schemas.ValidateSessionID(ev.Session); err != nil {
		return bad("%v", err)
	}
	if ce.Subject() != ev.Subject() {
		return bad("subject attribute %q does not match session/step %q", ce.Subject(), ev.Subject())
	}
	if want, _ := schemas.SubjectFor(ev.Session, ev.Type); subject != want {
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
		signer, err := b.trust.verify(ev.Type, subject, header, data)
		if err != nil {
			return schemas.Event{}, fmt.Errorf("%w: %w", ErrMalformed, err)
		}
		ev.Signer = signer
	}
	d, err := b.cat.Decode(ev.Type, ce.Data())
	if err != nil {
		return bad("%v", err)
	}
	ev.Data = d
	return ev, nil
}
