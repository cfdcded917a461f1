package tui

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/loopbus/loopbus/bus"
)

func TestDeadLetters(t *testing.T) {
	at := time.Date(2026, 11, 25, 10, 0, 0, 0, time.UTC)
	letters := []bus.DeadLetter{
		{Seq: 1, Stored: at, SourceSeq: 17, Subject: "loopbus.evt.s1.job.completed", Consumer: "validator", Reason: "data fails its schema"},
		{Seq: 2, Stored: at, SourceSeq: 18, Subject: "loopbus.evt.s1.bogus.thing", Consumer: "orchestrator", Reason: "unknown type"},
		{Seq: 3, Stored: at, SourceSeq: 19, Subject: "loopbus.evt.s2.job.completed", Consumer: "validator", Reason: "malformed JSON"},
	}
	var out, total bytes.Buffer
	d := NewDeadLetters(&out, false)
	for _, dl := range letters {
		if err := d.Add(dl); err != nil {
			t.Fatal(err)
		}
	}
	d.Total(&total)
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	if len(lines) != 3 || !strings.Contains(lines[0], "event seq 17") || !strings.HasSuffix(lines[1], "unknown type") || !strings.Contains(lines[2], "2026-11-25T10:00:00.000Z") {
		t.Errorf("lines:\n%s", out.String())
	}
	if want := "3 dead letter(s), 1 by orchestrator, 2 by validator\n"; total.String() != want {
		t.Errorf("total %q, want %q", total.String(), want)
	}

	out.Reset()
	d = NewDeadLetters(&out, true)
	if err := d.Add(letters[0]); err != nil {
		t.Fatal(err)
	}
	var back bus.DeadLetter
	if err := json.Unmarshal(out.Bytes(), &back); err != nil || back.Reason != letters[0].Reason || back.SourceSeq != 17 {
		t.Errorf("JSON line %q: %+v %v", out.String(), back, err)
	}
}
