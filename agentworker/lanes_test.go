package agentworker_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/loopbus/loopbus/agentworker"
	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/internal/testnats"
	"github.com/loopbus/loopbus/schemas"
)

// countingBus is a real bus that counts the deliveries its consumer hands
// to the worker.
type countingBus struct {
	*bus.Bus
	deliveries atomic.Int64
}

func (c *countingBus) Consume(ctx context.Context, cfg bus.ConsumerConfig, h bus.Handler) error {
	return c.Bus.Consume(ctx, cfg, func(ctx context.Context, d bus.Delivery) error {
		c.deliveries.Add(1)
		return h(ctx, d)
	})
}

// lingeringCLI returns the command (and its environment) of a claude or
// codex job that records its arguments, one a line, in the returned file,
// runs the fake CLI with them, then lingers for ten minutes: the job ends
// in time only if the worker kills it.
func lingeringCLI(t *testing.T, backend string) ([]string, map[string]string, string) {
	t.Helper()
	args := filepath.Join(t.TempDir(), "args")
	cmd := []string{"sh", "-c", `printf '%s\n' "$@" > "$ARGS_FILE"; "$FAKE_CLI" "$@"; exec sleep 600`, "fake-" + backend}
	return cmd, map[string]string{"ARGS_FILE": args, "FAKE_CLI": fakeCLI(t, "fake-"+backend)}, args
}

// TestLaneRefusedJobGoesToAnotherWorker: a worker without the heavy lane
// does not take a claude job allowed to use Bash: it hands it back, again
// and again, logging why once, until a worker with the lane takes it. The
// hand-backs do not count as attempts.
func TestLaneRefusedJobGoesToAnotherWorker(t *testing.T) {
	t.Parallel()
	b, _ := testnats.Bus(t)
	light := &countingBus{Bus: b}
	logs := startLoggedWorker(t, light, agentworker.Config{ID: "light", Lanes: []string{"no-net", "net"}, Env: baseEnv()})
	jr := request("s1.step.1", "step", 1, nil, "out.txt")
	jr.Agent = schemas.AgentSpec{Backend: schemas.BackendClaude, Command: []string{fakeCLI(t, "fake-claude")}, AllowedTools: []string{"Read", "Bash(ls:*)"}}
	publishRequest(t, b, jr)

	deadline := time.Now().Add(waitTimeout)
	for light.deliveries.Load() < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("the light worker was handed the job %d time(s), want 2", light.deliveries.Load())
		}
		time.Sleep(20 * time.Millisecond)
	}
	// MaxAttempts 1: the light worker's hand-backs must not make the job
	// look abandoned.
	startWorker(t, b, agentworker.Config{ID: "heavy", MaxAttempts: 1})
	all, res := waitResult(t, b, jr.JobID)
	waitAcked(t, b)
	evs := ofJob(sessionEvents(t, b), jr.JobID)
	jc, ok := res.Data.(*schemas.JobCompleted)
	if !ok || jc.Worker != "heavy" {
		t.Fatalf("result %s %+v, want job.completed by the heavy worker:%s", res.Type, res.Data, describe(ofJob(all, jr.JobID)))
	}
	started := ofType(evs, schemas.TypeJobStarted)
	if len(started) != 1 {
		t.Fatalf("%d job.started, want 1 (the heavy worker's):%s", len(started), describe(evs))
	}
	if js := started[0].Data.(*schemas.JobStarted); js.Worker != "heavy" || js.Delivery < 3 {
		t.Errorf("job.started %+v, want the heavy worker's, at delivery 3 or later", *js)
	}
	out := logs.String()
	if n := strings.Count(out, "leaving the job to another worker"); n != 1 {
		t.Errorf("the light worker logged its refusal %d times over %d deliveries, want once:\n%s", n, light.deliveries.Load(), out)
	}
	if !strings.Contains(out, `"tool":"Bash"`) || !strings.Contains(out, `"lane":"heavy"`) || !strings.Contains(out, `"job":"s1.step.1"`) {
		t.Errorf("the refusal does not name the job, tool and lane:\n%s", out)
	}
}

// TestLaneViolationStopsAgent: an agent that uses a tool of a lane its
// worker lacks anyway (codex, or claude with a tool it was not told to
// avoid) is killed and its job failed for good, naming tool and lane;
// claude is told the tools of the lanes the worker lacks.
func TestLaneViolationStopsAgent(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, backend, wantTool string
		wantDisallowed          string // the --disallowedTools value; "" for codex
	}{
		{name: "claude uses Bash", backend: schemas.BackendClaude, wantTool: "Bash", wantDisallowed: "Agent,Bash,BashOutput,KillBash,KillShell,Monitor,PowerShell,SendMessage,Task,TaskStop,Workflow"},
		{name: "codex runs a command", backend: schemas.BackendCodex, wantTool: "shell"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b, _ := testnats.Bus(t)
			startWorker(t, b, agentworker.Config{ID: "light", Lanes: []string{"no-net", "net"}})
			cmd, env, argsFile := lingeringCLI(t, tt.backend)
			jr := request("s1.step.1", "step", 1, nil, "out.txt")
			jr.Agent = schemas.AgentSpec{Backend: tt.backend, Command: cmd, Env: env}
			publishRequest(t, b, jr)
			all, res := waitResult(t, b, jr.JobID)
			jf, ok := res.Data.(*schemas.JobFailed)
			if !ok {
				t.Fatalf("result %s, want job.failed:%s", res.Type, describe(ofJob(all, jr.JobID)))
			}
			if jf.Retryable || jf.Cancelled || !strings.Contains(jf.Error, "tool "+tt.wantTool+", which is in lane heavy") || !strings.Contains(jf.Error, "only lanes no-net, net") {
				t.Errorf("job.failed = %+v, want a final failure naming tool %s and lane heavy", *jf, tt.wantTool)
			}
			args, err := os.ReadFile(argsFile)
			if err != nil {
				t.Fatal(err)
			}
			lines := strings.Split(string(args), "\n")
			got := ""
			for i, a := range lines {
				if a == "--disallowedTools" && i+1 < len(lines) {
					got = lines[i+1]
				}
			}
			if got != tt.wantDisallowed {
				t.Errorf("--disallowedTools %q, want %q; args:\n%s", got, tt.wantDisallowed, args)
			}
		})
	}
}

// TestToolEventsCarryLanes: tool.started and tool.completed carry the lane
// the lane table gives the tool, overrides included.
func TestToolEventsCarryLanes(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		table map[string]string
		want  map[string]string // tool name → lane
	}{
		{name: "defaults", want: map[string]string{"Bash": "heavy", "Edit": "no-net"}},
		{name: "override", table: map[string]string{"Edit": "net", "Bash": "no-net"}, want: map[string]string{"Bash": "no-net", "Edit": "net"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b, _ := testnats.Bus(t)
			startWorker(t, b, agentworker.Config{ID: "w", LaneTable: tt.table})
			jr := request("s1.step.1", "step", 1, nil, "out.txt")
			jr.Agent = schemas.AgentSpec{Backend: schemas.BackendClaude, Command: []string{fakeCLI(t, "fake-claude")}}
			publishRequest(t, b, jr)
			all, res := waitResult(t, b, jr.JobID)
			if res.Type != schemas.TypeJobCompleted {
				t.Fatalf("result %s, want job.completed:%s", res.Type, describe(ofJob(all, jr.JobID)))
			}
			got := map[string]string{}
			for _, ev := range ofJob(all, jr.JobID) {
				switch d := ev.Data.(type) {
				case *schemas.ToolStarted:
					got[d.Name] = d.Lane
				case *schemas.ToolCompleted:
					if got[d.Name] != d.Lane {
						t.Errorf("tool.completed of %s in lane %q, its tool.started in %q", d.Name, d.Lane, got[d.Name])
					}
				}
			}
			for tool, lane := range tt.want {
				if got[tool] != lane {
					t.Errorf("tool %s in lane %q, want %q (all: %v)", tool, got[tool], lane, got)
				}
			}
		})
	}
}
