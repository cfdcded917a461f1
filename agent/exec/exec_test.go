package exec

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/loopbus/loopbus/agent"
	"github.com/loopbus/loopbus/agent/agenttest"
	"github.com/loopbus/loopbus/schemas"
)

func fakeAgent(t *testing.T) string {
	t.Helper()
	p, err := filepath.Abs(filepath.Join("testdata", "fake-agent"))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestConformance runs the agent.Backend conformance suite against
// testdata/fake-agent. exec reads no event stream: it has no fixtures for
// usage, rate limits or unknown lines.
func TestConformance(t *testing.T) {
	fake := fakeAgent(t)
	fixture := func(scenario string, want ...agent.Kind) agenttest.Fixture {
		return agenttest.Fixture{
			Spec: schemas.AgentSpec{Backend: schemas.BackendExec, Command: []string{fake, "--flag"}},
			Env:  []string{"FAKE_AGENT_SCENARIO=" + scenario},
			Want: want,
		}
	}
	tool := []agent.Kind{agent.KindToolStart, agent.KindToolEnd}
	agenttest.RunConformance(t, func() agent.Backend { return Backend{} }, agenttest.Fixtures{
		Success: fixture("success", tool...),
		Failure: fixture("failure", tool...),
		Large:   fixture("large", tool...),
		Hang:    fixture("hang"),
	})
}

// TestToolEvents: the program is one tool call, named after it, whose end
// carries exit code, output tail and, when killed or timed out, why.
func TestToolEvents(t *testing.T) {
	fake := fakeAgent(t)
	tests := []struct {
		scenario string
		edit     func(*agent.Job)
		cancel   bool
		wantExit int
		wantErr  string
		wantOut  string
	}{
		{scenario: "success", wantOut: "agent done"},
		{scenario: "failure", wantExit: 3, wantOut: "model refused"},
		{scenario: "hang", edit: func(j *agent.Job) { j.Timeout = 200 * 1e6 }, wantExit: -1, wantErr: "timed out", wantOut: "started"},
		{scenario: "hang", cancel: true, wantExit: -1, wantErr: "killed: stop now"},
	}
	for _, tt := range tests {
		t.Run(tt.wantErr+tt.scenario, func(t *testing.T) {
			t.Parallel()
			job := agent.Job{
				Spec:   schemas.AgentSpec{Backend: schemas.BackendExec, Command: []string{fake, "a b"}},
				Dir:    t.TempDir(),
				Env:    []string{"PATH=/usr/bin:/bin", "FAKE_AGENT_SCENARIO=" + tt.scenario, "LOOPBUS_OUTPUT_DIR=" + t.TempDir(), "AGENTTEST_PIDFILE=" + filepath.Join(t.TempDir(), "pid")},
				Prompt: "hello",
			}
			if tt.edit != nil {
				tt.edit(&job)
			}
			ctx, cancel := context.WithCancelCause(context.Background())
			defer cancel(nil)
			var evs []agent.Event
			emit := func(ev agent.Event) {
				evs = append(evs, ev)
				if tt.cancel && ev.Kind == agent.KindToolStart {
					cancel(stopErr{})
				}
			}
			res, err := Backend{}.Run(ctx, job, emit)
			if err != nil {
				t.Fatal(err)
			}
			if len(evs) != 2 {
				t.Fatalf("%d events, want a start and an end: %+v", len(evs), evs)
			}
			start, end := evs[0], evs[1]
			if start.Name != "fake-agent" || start.Category != Category || start.Input != fake+" a b" {
				t.Errorf("start %+v", start)
			}
			if end.ToolID != start.ToolID || end.ExitCode != tt.wantExit || end.Error != tt.wantErr || end.IsError != (tt.wantExit != 0) ||
				!strings.Contains(end.Output, tt.wantOut) || end.Output != res.Tail || end.TimedOut != (tt.wantErr == "timed out") {
				t.Errorf("end %+v, want exit %d, error %q, output with %q", end, tt.wantExit, tt.wantErr, tt.wantOut)
			}
		})
	}
}

type stopErr struct{}

func (stopErr) Error() string { return "stop now" }

func TestEmptyCommand(t *testing.T) {
	_, err := Backend{}.Run(context.Background(), agent.Job{Spec: schemas.AgentSpec{Backend: "exec"}}, func(agent.Event) { t.Error("an event for an empty command") })
	if err == nil || !strings.Contains(err.Error(), "empty") {
		t.Errorf("error %v, want the command is empty", err)
	}
}

func TestPlannedTools(t *testing.T) {
	if got := (Backend{}).PlannedTools(schemas.AgentSpec{Command: []string{"/usr/bin/build.sh", "-x"}}); len(got) != 1 || got[0] != (agent.Tool{Name: "build.sh", Category: Category}) {
		t.Errorf("PlannedTools = %+v", got)
	}
	if got := (Backend{}).PlannedTools(schemas.AgentSpec{}); got != nil {
		t.Errorf("PlannedTools of no command = %+v", got)
	}
}
