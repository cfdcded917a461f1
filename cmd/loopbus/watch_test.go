package main

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/loopbus/loopbus/projections"
	"github.com/loopbus/loopbus/schemas"
	"github.com/loopbus/loopbus/tui"
)

// watched is a session of one step that ends with end (nil: it runs on).
func watched(t *testing.T, end ...schemas.Event) ([]schemas.Event, *projections.Manifest) {
	t.Helper()
	at := time.Date(2026, 11, 22, 10, 0, 0, 0, time.Local)
	evs := []schemas.Event{
		{ID: "e1", Type: schemas.TypeSessionStarted, Session: "s1", Seq: 1, Time: at, Data: &schemas.SessionStarted{
			Pipeline: schemas.Pipeline{Name: "p", Steps: []schemas.Step{{Name: "a", MaxIterations: 1}}},
		}},
		{ID: "e2", Type: schemas.TypeJobRequested, Session: "s1", Step: "a", Seq: 2, Time: at.Add(time.Second), Data: &schemas.JobRequested{JobID: "ja1", Step: "a", Iteration: 1}},
	}
	for i, ev := range end {
		ev.Session, ev.Seq, ev.Time = "s1", uint64(3+i), at.Add(time.Duration(2+i)*time.Second)
		evs = append(evs, ev)
	}
	m := projections.BuildManifest("s1", evs)
	if m == nil {
		t.Fatal("no manifest")
	}
	return evs, m
}

func TestSessionEnd(t *testing.T) {
	tests := []struct {
		name    string
		end     []schemas.Event
		want    error
		message string
	}{
		{"completed", []schemas.Event{{ID: "e3", Type: schemas.TypeSessionCompleted, Data: &schemas.SessionCompleted{}}}, nil, ""},
		{"failed", []schemas.Event{{ID: "e3", Type: schemas.TypeSessionFailed, Data: &schemas.SessionFailed{Reason: "step a failed"}}}, errFailed, "session s1 failed: step a failed\n"},
		{"budget", []schemas.Event{{ID: "e3", Type: schemas.TypeSessionStopped, Data: &schemas.SessionStopped{Kind: schemas.StopBudget, Reason: "cost reached the budget"}}}, errStopped, "session s1 stopped: cost reached the budget\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, m := watched(t, tc.end...)
			var b bytes.Buffer
			if err := sessionEnd(&b, m, "loopbus"); !errors.Is(err, tc.want) || (tc.want == nil && err != nil) {
				t.Errorf("sessionEnd = %v, want %v", err, tc.want)
			}
			if b.String() != tc.message {
				t.Errorf("sessionEnd wrote %q, want %q", b.String(), tc.message)
			}
		})
	}
}

// TestViewsWithoutTerminal checks what watch, run and wait print when
// their output is not a terminal: watch a line per event, run and wait
// progress lines.
func TestViewsWithoutTerminal(t *testing.T) {
	evs, _ := watched(t)
	var m *projections.Manifest
	var watch, follow bytes.Buffer
	onWatch, stopWatch := tui.NewView(&watch, tui.Options{})
	onFollow, stopFollow := followView(&follow, nil)
	for _, ev := range evs {
		m = projections.FoldManifest(m, ev)
		onWatch(ev, m)
		onFollow(ev, m)
	}
	stopWatch()
	stopFollow()
	ts := evs[1].Time.Local().Format("15:04:05")
	if got, want := watch.String(), evs[0].Time.Local().Format("15:04:05")+" session s1 started: pipeline p, 1 step\n"+ts+" a#1 queued\n"; got != want {
		t.Errorf("watch printed %q, want %q", got, want)
	}
	if got, want := follow.String(), ts+"  → a: iteration 1 queued\n"; got != want {
		t.Errorf("run printed %q, want %q", got, want)
	}
	if strings.Contains(watch.String()+follow.String(), "\x1b[") {
		t.Error("escape sequences without a terminal")
	}
}
