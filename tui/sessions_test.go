package tui

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/loopbus/loopbus/client"
)

func TestWriteSessions(t *testing.T) {
	now := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	list := []client.SessionSummary{
		{ID: "kit-2", Status: "running", Pipeline: "writing-kit", Steps: 3, StepsDone: 1, CostUSD: 0.126, Started: now.Add(-90 * time.Second)},
		{ID: "backlog-1", Status: "failed", Pipeline: "todo", Steps: 12, StepsDone: 12, Started: now.Add(-50 * time.Hour)},
	}
	var b bytes.Buffer
	if err := WriteSessions(&b, list, false, now); err != nil {
		t.Fatal(err)
	}
	want := "SESSION    STATUS   PIPELINE     STEPS  COST   AGE\n" +
		"kit-2      running  writing-kit  1/3    $0.13  1m\n" +
		"backlog-1  failed   todo         12/12  -      2d\n"
	if b.String() != want {
		t.Errorf("table:\n%q\nwant\n%q", b.String(), want)
	}

	b.Reset()
	if err := WriteSessions(&b, nil, false, now); err != nil || b.String() != "no sessions\n" {
		t.Errorf("empty table %q, %v", b.String(), err)
	}
	b.Reset()
	if err := WriteSessions(&b, nil, true, now); err != nil || strings.TrimSpace(b.String()) != "[]" {
		t.Errorf("empty JSON %q, %v", b.String(), err)
	}
	b.Reset()
	if err := WriteSessions(&b, list, true, now); err != nil {
		t.Fatal(err)
	}
	var back []client.SessionSummary
	if err := json.Unmarshal(b.Bytes(), &back); err != nil || len(back) != 2 || back[0].ID != "kit-2" || back[0].CostUSD != 0.126 {
		t.Errorf("JSON round trip %+v, %v", back, err)
	}
}

func TestSessionsAge(t *testing.T) {
	for d, want := range map[time.Duration]string{-time.Second: "0s", 59 * time.Second: "59s", time.Hour - 1: "59m", 47 * time.Hour: "47h", 72 * time.Hour: "3d"} {
		if got := sessionsAge(d); got != want {
			t.Errorf("age(%s) = %s, want %s", d, got, want)
		}
	}
}
