package bus_test

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	cloudevents "github.com/cloudevents/sdk-go/v2/event"
	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/internal/testnats"
	"github.com/loopbus/loopbus/schemas"
	"github.com/nats-io/nats.go"
)

// conformanceEvents are events whose attributes and data exercise the
// encoder: every extension, escapes, non-ASCII text, control characters.
func conformanceEvents() []schemas.Event {
	full := fullEvent()
	odd := jobStarted("s-2", `e"2\ü`)
	odd.Source = "loopbus/worker ü" // read back as loopbus/worker%20%C3%BC, as the SDK does
	odd.Data = &schemas.JobStarted{JobID: "s-2.x.1", Worker: "w \"1\"\n\u2028<&>", Delivery: 3}
	odd.Time = time.Date(2025, 12, 31, 23, 59, 59, 123456789, time.FixedZone("x", 3600))
	evs := []schemas.Event{full, jobStarted("s1", "e1"), jobRequested("s-2", "e2"), odd}
	for i := range evs {
		if evs[i].Source == "" {
			evs[i].Source = "loopbus/test"
		}
		if evs[i].Time.IsZero() {
			evs[i].Time = time.Date(2025, 1, 2, 3, 4, 5, 6000, time.UTC)
		}
	}
	return evs
}

// TestEncodedEventsReadByTheSDK: what Encode writes is a CloudEvent the
// CloudEvents SDK reads, with the same attributes and data.
func TestEncodedEventsReadByTheSDK(t *testing.T) {
	t.Parallel()
	b, _ := testnats.Bus(t)
	for _, ev := range conformanceEvents() {
		m, err := b.Encode(ev)
		if err != nil {
			t.Fatalf("Encode %s: %v", ev.ID, err)
		}
		var ce cloudevents.Event
		if err := json.Unmarshal(m.Data, &ce); err != nil {
			t.Fatalf("%s: the SDK cannot read %s: %v", ev.ID, m.Data, err)
		}
		if err := ce.Validate(); err != nil {
			t.Errorf("%s: the SDK finds it invalid: %v", ev.ID, err)
		}
		ext := func(name string) string { v, _ := ce.Extensions()[name].(string); return v }
		got := []string{ce.SpecVersion(), ce.ID(), ce.Source(), ce.Type(), ce.Subject(), ce.DataContentType(), ce.DataSchema(),
			ext("session"), ext("step"), ext("job"), ext("causation"), ext("correlation"), ext("traceparent")}
		want := []string{"1.0", ev.ID, sourceRead(ev.Source), ev.Type, ev.Subject(), "application/json", schemas.DataSchemaURI(ev.Type),
			ev.Session, ev.Step, ev.Job, ev.Causation, ev.Correlation, bus.SpanOf(ev).Traceparent()}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s: the SDK reads attributes\n%q\nwant\n%q", ev.ID, got, want)
		}
		if !ce.Time().Equal(ev.Time) {
			t.Errorf("%s: time %v, want %v", ev.ID, ce.Time(), ev.Time)
		}
		wantData, _ := json.Marshal(ev.Data)
		if !jsonEqual(t, ce.Data(), wantData) {
			t.Errorf("%s: data %s, want %s", ev.ID, ce.Data(), wantData)
		}
	}
}

// TestSDKEventsDecoded: a CloudEvent made and written by the SDK, as a
// subscriber's own tool would publish it, decodes to the same event.
func TestSDKEventsDecoded(t *testing.T) {
	t.Parallel()
	b, _ := testnats.Bus(t)
	for _, ev := range conformanceEvents() {
		ce := cloudevents.New(cloudevents.CloudEventsVersionV1)
		ce.SetID(ev.ID)
		ce.SetSource(ev.Source)
		ce.SetType(ev.Type)
		ce.SetSubject(ev.Subject())
		ce.SetTime(ev.Time)
		ce.SetDataSchema(schemas.DataSchemaURI(ev.Type))
		if err := ce.SetData(cloudevents.ApplicationJSON, ev.Data); err != nil {
			t.Fatal(err)
		}
		for name, v := range map[string]string{"session": ev.Session, "step": ev.Step, "job": ev.Job, "causation": ev.Causation, "correlation": ev.Correlation} {
			if v != "" {
				ce.SetExtension(name, v)
			}
		}
		ce.SetExtension("vendorflag", true) // an extension loopbus does not know
		ce.SetExtension("vendorcount", 7)
		data, err := json.Marshal(ce)
		if err != nil {
			t.Fatal(err)
		}
		subject, err := schemas.SubjectFor(ev.Session, ev.Type)
		if err != nil {
			t.Fatal(err)
		}
		got, err := b.Decode(subject, nats.Header{nats.MsgIdHdr: {ev.ID}}, data)
		if err != nil {
			t.Fatalf("%s: Decode of the SDK's %s: %v", ev.ID, data, err)
		}
		want := ev
		want.Source = sourceRead(ev.Source)
		want.Time = ev.Time.UTC().Truncate(0)
		got.Time = got.Time.UTC()
		if !got.Time.Equal(want.Time) {
			t.Errorf("%s: time %v, want %v", ev.ID, got.Time, want.Time)
		}
		got.Time, want.Time = time.Time{}, time.Time{}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s: decoded\n%+v\nwant\n%+v", ev.ID, got, want)
		}
	}
}

// TestDecodeRefusesWhatTheSDKRefuses: envelopes the SDK cannot read, or
// that CloudEvents 1.0 forbids, are malformed for loopbus too, with a
// reason.
func TestDecodeRefusesWhatTheSDKRefuses(t *testing.T) {
	t.Parallel()
	b, _ := testnats.Bus(t)
	ev := jobStarted("s1", "e1")
	m, err := b.Encode(ev)
	if err != nil {
		t.Fatal(err)
	}
	good := string(m.Data)
	body := strings.TrimSuffix(strings.TrimPrefix(good, "{"), "}")
	for name, tc := range map[string]struct{ data, reason string }{
		"trailing data":         {good + "x", "data after the JSON object"},
		"two objects":           {good + good, "data after the JSON object"},
		"duplicate id":          {`{"id":"e1",` + body + `}`, `attribute "id" appears twice`},
		"duplicate data":        {`{` + body + `,"data":{}}`, `member "data" appears twice`},
		"duplicate extension":   {`{"x1":1,"x1":2,` + body + `}`, `attribute "x1" appears twice`},
		"upper-case name":       {`{"Vendor":1,` + body + `}`, `lower-case letters and digits`},
		"name with underscore":  {`{"data_base64":"AA==",` + body + `}`, `lower-case letters and digits`},
		"id not a string":       {strings.Replace(good, `"id":"e1"`, `"id":1`, 1), "attribute id is not a string"},
		"session not a string":  {strings.Replace(good, `"session":"s1"`, `"session":true`, 1), "attribute session is not a string"},
		"bad time":              {strings.Replace(good, `"time":"`, `"time":"x`, 1), "not an RFC 3339 time"},
		"unterminated":          {good[:len(good)-1], "not JSON"},
		"bad escape":            {strings.Replace(good, `"source":"`, `"source":"\q`, 1), "not JSON"},
		"control character":     {strings.Replace(good, `"source":"`, "\"source\":\"\x01", 1), "not JSON"},
		"bad number in data":    {strings.Replace(good, `"delivery":1`, `"delivery":01`, 1), "not JSON"},
		"array":                 {`[` + good + `]`, "not a JSON object"},
		"no source":             {strings.Replace(good, `"source":`, `"sourcex":`, 1), "missing attribute source"},
		"source not a URI":      {strings.Replace(good, `"source":"`, `"source":"%zz`, 1), "not a URI reference"},
		"deep nesting in data":  {strings.Replace(good, `"data":{`, `"data":{"x":`+strings.Repeat("[", 10001)+strings.Repeat("]", 10001)+`,`, 1), "nested more than"},
		"unknown extension bad": {`{"vendor":[1,},` + body + `}`, "not JSON"},
	} {
		var ce cloudevents.Event
		sdkErr := json.Unmarshal([]byte(tc.data), &ce)
		if sdkErr == nil {
			sdkErr = ce.Validate()
		}
		_, err := b.Decode(m.Subject, m.Header, []byte(tc.data))
		if !errors.Is(err, bus.ErrMalformed) || !strings.Contains(err.Error(), tc.reason) {
			t.Errorf("%s: Decode error %v, want ErrMalformed saying %q (the SDK says %v)", name, err, tc.reason, sdkErr)
		}
	}
}

// FuzzEnvelopeAgreesWithTheSDK: whatever the decoder accepts, the
// CloudEvents SDK reads too, with the same attributes and data.
func FuzzEnvelopeAgreesWithTheSDK(f *testing.F) {
	b, _ := testnats.Bus(f)
	for _, ev := range conformanceEvents() {
		m, err := b.Encode(ev)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(m.Data)
	}
	f.Add([]byte(`{"specversion":"1.0","id":"\u0065\u0031"}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		ev, err := b.Decode("", nil, data)
		if err == nil {
			t.Fatalf("accepted without subject and id header: %+v", ev)
		}
		var probe struct {
			ID      string `json:"id"`
			Session string `json:"session"`
			Type    string `json:"type"`
		}
		if json.Unmarshal(data, &probe) != nil {
			return
		}
		subject, err := schemas.SubjectFor(probe.Session, probe.Type)
		if err != nil {
			return
		}
		ev, err = b.Decode(subject, nats.Header{nats.MsgIdHdr: {probe.ID}}, data)
		if err != nil {
			return
		}
		var ce cloudevents.Event
		if err := json.Unmarshal(data, &ce); err != nil {
			t.Fatalf("accepted what the SDK cannot read: %v\n%s", err, data)
		}
		if err := ce.Validate(); err != nil {
			t.Fatalf("accepted what the SDK finds invalid: %v\n%s", err, data)
		}
		if !utf8.Valid(data) {
			return // the SDK keeps invalid bytes that encoding/json replaces
		}
		ext := func(name string) string { v, _ := ce.Extensions()[name].(string); return v }
		got := []string{ev.ID, ev.Source, ev.Type, ev.Subject(), ev.Session, ev.Step, ev.Job, ev.Causation, ev.Correlation}
		want := []string{ce.ID(), ce.Source(), ce.Type(), ce.Subject(), ext("session"), ext("step"), ext("job"), ext("causation"), ext("correlation")}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("attributes %q, the SDK reads %q\n%s", got, want, data)
		}
		if !ev.Time.Equal(ce.Time()) {
			t.Fatalf("time %v, the SDK reads %v", ev.Time, ce.Time())
		}
	})
}

// sourceRead is the source attribute as readers see it.
func sourceRead(s string) string {
	if s == "loopbus/worker ü" {
		return "loopbus/worker%20%C3%BC"
	}
	return s
}

func jsonEqual(t *testing.T, a, b []byte) bool {
	t.Helper()
	var x, y any
	if err := json.Unmarshal(a, &x); err != nil {
		t.Fatalf("not JSON: %s", a)
	}
	if err := json.Unmarshal(b, &y); err != nil {
		t.Fatalf("not JSON: %s", b)
	}
	return reflect.DeepEqual(x, y)
}
