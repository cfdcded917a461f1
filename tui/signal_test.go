package tui

import (
	"bytes"
	"testing"

	"github.com/loopbus/loopbus/client"
	"github.com/loopbus/loopbus/schemas"
)

func TestWriteSignalResult(t *testing.T) {
	sent := client.SentSignal{Seq: 42, Event: schemas.Event{ID: "abc", Session: "s1", Step: "b", Data: &schemas.Signal{Target: "s1/b", Step: "b"}}}
	for _, tt := range []struct {
		name string
		r    client.SignalResult
		json bool
		want string
	}{
		{"applied", client.ResultOf(sent, "pause", &schemas.SignalAcknowledged{Result: "applied", Detail: "step b paused"}, ""), false, "pause s1/b: applied — step b paused\n"},
		{"ignored without detail", client.ResultOf(sent, "stop", &schemas.SignalAcknowledged{Result: "ignored"}, ""), false, "stop s1/b: ignored\n"},
		{"recorded", client.ResultOf(sent, "pause", nil, "not waiting"), false, "pause s1/b: recorded at stream sequence 42 — takes effect when the orchestrator runs (not waiting)\n"},
		{"json", client.ResultOf(sent, "pause", nil, "x"), true, `{"signal":"pause","target":"s1/b","session":"s1","step":"b","id":"abc","seq":42,"result":"recorded","detail":"takes effect when the orchestrator runs (x)"}` + "\n"},
	} {
		var b bytes.Buffer
		if err := WriteSignalResult(&b, tt.r, tt.json); err != nil || b.String() != tt.want {
			t.Errorf("%s: got %q, %v\nwant %q", tt.name, b.String(), err, tt.want)
		}
	}
}
