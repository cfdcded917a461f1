package client

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/internal/testnats"
	"github.com/loopbus/loopbus/schemas"
)

func TestSignaler(t *testing.T) {
	b, srv := testnats.Bus(t)
	ctx := context.Background()
	startSession(t, b, "s1", nil)

	// Without waiting: recorded.
	got, err := Signaler{Bus: b}.Signal(ctx, "pause", "s1/draft", "lunch")
	if err != nil || !strings.HasPrefix(got, "pause s1/draft: recorded at stream sequence ") {
		t.Fatalf("Signal = %q, %v", got, err)
	}
	evs := testnats.Events(t, b, "loopbus.evt.s1.signal.pause")
	if len(evs) != 1 || evs[0].Step != "draft" || !reflect.DeepEqual(evs[0].Data, &schemas.Signal{Target: "s1/draft", Step: "draft", Reason: "lunch"}) {
		t.Fatalf("events %+v", evs)
	}

	// An orchestrator answers the info signal.
	orch := testnats.Connect(t, srv.URL(), "test/orchestrator")
	octx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		_ = orch.Read(octx, bus.ReadOptions{Subjects: []string{"loopbus.evt.s1.signal.info"}, Follow: true}, func(ev schemas.Event) error {
			_, err := orch.Publish(octx, schemas.Event{ID: NewSignalID(), Type: schemas.TypeSignalAcknowledged, Session: "s1",
				Data: &schemas.SignalAcknowledged{SignalID: ev.ID, Signal: "info", Result: schemas.SignalApplied, Detail: "hint queued"}})
			return err
		})
	}()
	got, err = Signaler{Bus: b, Wait: 30 * time.Second}.Signal(ctx, "info", "s1", "prefer tables")
	if want := "info s1: applied — hint queued"; err != nil || got != want {
		t.Fatalf("Signal = %q, %v; want %q", got, err, want)
	}
	if evs := testnats.Events(t, b, "loopbus.evt.s1.signal.info"); len(evs) != 1 || evs[0].Data.(*schemas.Signal).Message != "prefer tables" {
		t.Fatalf("events %+v", evs)
	}

	for _, tc := range []struct {
		kind, target, message string
		want                  error
	}{
		{"stop", "all", "", ErrBadInput},
		{"stop", "nope", "", ErrNoSession},
		{"info", "s1", " ", ErrBadInput},
		{"explode", "s1", "", ErrBadInput},
		{"pause", "s1/nope", "", ErrBadInput},
	} {
		if got, err := (Signaler{Bus: b}).Signal(ctx, tc.kind, tc.target, tc.message); !errors.Is(err, tc.want) {
			t.Errorf("Signal(%s, %s) = %q, %v; want %v", tc.kind, tc.target, got, err, tc.want)
		}
	}
}
