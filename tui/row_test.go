package tui

import (
	"testing"
	"time"

	"github.com/loopbus/loopbus/schemas"
)

func TestEventRow(t *testing.T) {
	at := time.Date(2026, 11, 25, 10, 0, 0, 5e6, time.UTC)
	for _, tt := range []struct {
		ev   schemas.Event
		want string
	}{
		{schemas.Event{Seq: 7, Time: at, Type: schemas.TypeJobStarted, Session: "s1", Step: "a", Data: &schemas.JobStarted{JobID: "s1.a.1", Worker: "w1", Delivery: 2}},
			"     7  2026-11-25T10:00:00.005Z  job.started                s1/a                             job=s1.a.1 worker=w1 delivery=2"},
		{schemas.Event{Seq: 8, Time: at, Type: schemas.TypeToolStarted, Session: "s1", Step: "a", Data: &schemas.ToolStarted{Name: "Bash", Input: "ls   -la\n" + string(make([]byte, 0)) + "  /tmp"}},
			"     8  2026-11-25T10:00:00.005Z  tool.started               s1/a                             tool=Bash ls -la /tmp"},
	} {
		if got := EventRow(tt.ev); got != tt.want {
			t.Errorf("got  %q\nwant %q", got, tt.want)
		}
	}
}
