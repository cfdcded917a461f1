package bus_test

import (
	"errors"
	"reflect"
	"testing"

	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/internal/testnats"
	"github.com/loopbus/loopbus/schemas"
	"github.com/nats-io/nats.go"
)

// FuzzDecode feeds arbitrary subjects, de-duplication ids and bodies to the
// decoder every consumer uses. It must never panic; it either refuses with
// ErrMalformed or returns an event that is consistent with where it was
// stored and that survives Encode → Decode unchanged (so nothing a consumer
// accepts is something loopbus itself could not have published). Seed
// corpus: the f.Add calls below plus testdata/fuzz/FuzzDecode.
func FuzzDecode(f *testing.F) {
	b, _ := testnats.Bus(f)
	for _, ev := range []schemas.Event{fullEvent(), jobStarted("s1", "e1"), jobRequested("s-2", "e2")} {
		m, err := b.Encode(ev)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(m.Subject, ev.ID, m.Data)
	}
	f.Add("loopbus.evt.s1.job.started", "e1", []byte(`{"specversion":"1.0"}`))
	f.Add("loopbus.evt.s1.job.started", "", []byte("not json"))
	f.Add("loopbus.evt", "x", []byte(`[]`))

	f.Fuzz(func(t *testing.T, subject, msgID string, data []byte) {
		hdr := nats.Header{}
		if msgID != "" {
			hdr.Set(nats.MsgIdHdr, msgID)
		}
		ev, err := b.Decode(subject, hdr, data)
		if err != nil {
			if !errors.Is(err, bus.ErrMalformed) {
				t.Fatalf("Decode error %v does not wrap ErrMalformed", err)
			}
			return
		}
		if ev.ID != msgID {
			t.Fatalf("accepted id %q with %s %q", ev.ID, nats.MsgIdHdr, msgID)
		}
		if want, err := schemas.SubjectFor(ev.Session, ev.Type); err != nil || want != subject {
			t.Fatalf("accepted a %s event of session %q on subject %q (want %q, %v)", ev.Type, ev.Session, subject, want, err)
		}
		m, err := b.Encode(ev)
		if err != nil {
			t.Fatalf("Decode accepted an event Encode refuses: %v", err)
		}
		again, err := b.Decode(m.Subject, m.Header, m.Data)
		if err != nil {
			t.Fatalf("re-encoded event does not decode: %v", err)
		}
		if !again.Time.Equal(ev.Time) {
			t.Fatalf("time changed: %v → %v", ev.Time, again.Time)
		}
		again.Time = ev.Time
		if !reflect.DeepEqual(again, ev) {
			t.Fatalf("round trip changed the event:\n%#v\n%#v", ev, again)
		}
	})
}
