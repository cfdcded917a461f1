package tui

import (
	"bytes"
	"testing"
	"time"

	"github.com/loopbus/loopbus/hooks"
	"github.com/loopbus/loopbus/schemas"
)

func TestWriteHookRun(t *testing.T) {
	at := time.Date(2026, 11, 22, 11, 32, 59, 0, time.UTC)
	ev := schemas.Event{Session: "demo-1"}
	res := schemas.HookRun{Hook: "chat", EventType: schemas.TypeSessionCompleted, EventSeq: 28, DurationMs: 120}
	failed := res
	failed.ExitCode, failed.Error, failed.OutputTail = 3, "exited with code 3", "posting\ncurl: (7) Failed to connect\n"
	tests := []struct {
		name string
		run  hooks.Run
		want string
	}{
		{"completed", hooks.Run{Event: ev, Type: schemas.TypeHookCompleted, Result: res},
			"11:32:59 hook chat for loopbus.session.completed #28 (session demo-1): exit 0 in 120ms\n"},
		{"failed", hooks.Run{Event: ev, Type: schemas.TypeHookFailed, Result: failed},
			"11:32:59 hook chat for loopbus.session.completed #28 (session demo-1): FAILED in 120ms: exited with code 3: curl: (7) Failed to connect\n"},
		{"skipped", hooks.Run{Event: ev, Result: schemas.HookRun{Hook: "chat", EventType: schemas.TypeSessionCompleted, EventSeq: 28}, Skipped: true},
			"11:32:59 hook chat for loopbus.session.completed #28 (session demo-1): already ran before a restart, skipped\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b bytes.Buffer
			WriteHookRun(&b, at, tt.run)
			if b.String() != tt.want {
				t.Errorf("got  %q\nwant %q", b.String(), tt.want)
			}
		})
	}
}
