package client_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/loopbus/loopbus/agent"
	"github.com/loopbus/loopbus/agentworker"
	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/client"
	"github.com/loopbus/loopbus/internal/testnats"
	"github.com/loopbus/loopbus/schemas"
)

// A job's lanes are decided as a worker would: claude's allowed tools
// through the lane table (defaults and configuration); exec's program
// is no-net unless listed.
func TestPlannedLanes(t *testing.T) {
	t.Parallel()
	reg := agentworker.Builtin()
	lt, err := agent.NewLaneTable(reg.DefaultLanes(), map[string]string{"Read": "no-net"})
	if err != nil {
		t.Fatal(err)
	}
	lanes := client.PlannedLanes(reg, lt)
	for _, tt := range []struct {
		spec schemas.AgentSpec
		want []string
	}{
		{schemas.AgentSpec{Backend: "claude", AllowedTools: []string{"Bash", "Read", "WebFetch"}}, []string{"no-net", "net", "heavy"}},
		{schemas.AgentSpec{Backend: "claude", AllowedTools: []string{"Read"}}, []string{"no-net"}},
		{schemas.AgentSpec{Backend: "exec", Command: []string{"sh", "agent.sh"}}, []string{"no-net"}},
		{schemas.AgentSpec{Backend: "nope"}, nil},
	} {
		if got := lanes(tt.spec); !slices.Equal(got, tt.want) {
			t.Errorf("lanes of %+v = %v, want %v", tt.spec, got, tt.want)
		}
	}
}

// Doctor's workers check lists the workers present with their lanes and
// warns (without failing) when no worker serves a lane, or none runs.
func TestWorkersCheck(t *testing.T) {
	t.Parallel()
	b, _ := testnats.Bus(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if c := client.WorkersCheck(ctx, b); !c.OK || !c.Warn || !strings.Contains(c.Detail, "no agent worker is running") {
		t.Errorf("no worker: %+v", c)
	}
	if err := b.PutWorker(ctx, bus.WorkerInfo{ID: "laptop", Lanes: []string{"no-net", "net"}}); err != nil {
		t.Fatal(err)
	}
	if c := client.WorkersCheck(ctx, b); !c.OK || !c.Warn || !strings.Contains(c.Detail, "laptop [no-net,net]; no worker for lane heavy") {
		t.Errorf("a no-net,net worker: %+v", c)
	}
	if err := b.PutWorker(ctx, bus.WorkerInfo{ID: "box", Lanes: []string{"heavy"}}); err != nil {
		t.Fatal(err)
	}
	if c := client.WorkersCheck(ctx, b); !c.OK || c.Warn || c.Detail != "2 present: box [heavy]; laptop [no-net,net]" {
		t.Errorf("every lane served: %+v", c)
	}
	ws, _ := b.Workers(ctx)
	if got := client.ServedLanes(ws); !slices.Equal(got["heavy"], []string{"box"}) || !slices.Equal(got["net"], []string{"laptop"}) {
		t.Errorf("ServedLanes = %v", got)
	}
	if un := client.UnservedLanes(ws[:1]); !slices.Equal(un, []string{"no-net", "net"}) {
		t.Errorf("UnservedLanes(box) = %v", un)
	}
}
