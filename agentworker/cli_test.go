package agentworker_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/loopbus/loopbus/agentworker"
	"github.com/loopbus/loopbus/internal/testnats"
	"github.com/loopbus/loopbus/schemas"
)

// fakeCLI is the path of a fake agent CLI that prints the real event
// stream format ("fake-claude" is agent/claude/testdata/fake-claude).
func fakeCLI(t *testing.T, name string) string {
	t.Helper()
	p, err := filepath.Abs(filepath.Join("..", "agent", strings.TrimPrefix(name, "fake-"), "testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestAgentCLIBackends runs the claude and codex backends against fake
// CLIs: their tool calls become tool.started/tool.completed, their text
// agent.message, their usage the result's usage; failures and usage limits
// fail the job with the CLI's message; unknown lines are counted.
func TestAgentCLIBackends(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name        string
		backend     string
		scenario    string
		wantResult  string
		wantErr     string
		wantTools   int
		wantMessage bool
		wantUsage   bool
		wantLimited bool
		wantIgnored bool
	}{
		{name: "claude succeeds", backend: "claude", scenario: "success", wantResult: schemas.TypeJobCompleted, wantTools: 2, wantMessage: true, wantUsage: true},
		{name: "claude hits its usage limit", backend: "claude", scenario: "rate_limit", wantResult: schemas.TypeJobFailed, wantErr: "usage or rate limit", wantLimited: true},
		{name: "claude reports an error", backend: "claude", scenario: "error", wantResult: schemas.TypeJobFailed, wantErr: "failure"},
		{name: "claude with unknown lines", backend: "claude", scenario: "unknown", wantResult: schemas.TypeJobCompleted, wantIgnored: true},
		{name: "codex succeeds", backend: "codex", scenario: "success", wantResult: schemas.TypeJobCompleted, wantTools: 2, wantMessage: true, wantUsage: true},
		{name: "codex turn fails", backend: "codex", scenario: "failed", wantResult: schemas.TypeJobFailed, wantErr: "failure"},
		{name: "codex hits its usage limit", backend: "codex", scenario: "rate_limit", wantResult: schemas.TypeJobFailed, wantErr: "usage or rate limit", wantLimited: true},
		{name: "codex with unknown lines", backend: "codex", scenario: "unknown", wantResult: schemas.TypeJobCompleted, wantIgnored: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b, _ := testnats.Bus(t)
			env := "FAKE_CLAUDE_SCENARIO"
			if tt.backend == "codex" {
				env = "FAKE_CODEX_SCENARIO"
			}
			startWorker(t, b, agentworker.Config{Env: baseEnv(env + "=" + tt.scenario)})
			jr := request("s1.step.1", "step", 1, nil)
			jr.Agent = schemas.AgentSpec{Backend: tt.backend, Command: []string{fakeCLI(t, "fake-"+tt.backend)}, Model: "m1"}
			if tt.wantResult == schemas.TypeJobCompleted && tt.scenario == "success" {
				jr.Outputs = []schemas.Output{{Name: "out.txt"}}
			}
			publishRequest(t, b, jr)
			evs, res := waitResult(t, b, jr.JobID)
			if res.Type != tt.wantResult {
				t.Fatalf("result %s, want %s: %+v\n%s", res.Type, tt.wantResult, res.Data, describe(evs))
			}
			job := ofJob(evs, jr.JobID)
			starts, ends := ofType(job, schemas.TypeToolStarted), ofType(job, schemas.TypeToolCompleted)
			if len(starts) < tt.wantTools || len(ends) < tt.wantTools {
				t.Errorf("%d tool.started, %d tool.completed, want at least %d each:\n%s", len(starts), len(ends), tt.wantTools, describe(job))
			}
			for _, e := range starts {
				if ts := e.Data.(*schemas.ToolStarted); ts.Lane == "" || ts.Name == "" {
					t.Errorf("tool.started without lane or name: %+v", ts)
				}
			}
			if got := len(ofType(job, schemas.TypeAgentMessage)) > 0; got != tt.wantMessage && tt.wantMessage {
				t.Errorf("agent.message published = %v, want %v", got, tt.wantMessage)
			}
			var usage *schemas.Usage
			ignored := 0
			switch d := res.Data.(type) {
			case *schemas.JobCompleted:
				usage, ignored = d.Usage, d.IgnoredLines
			case *schemas.JobFailed:
				usage, ignored = d.Usage, d.IgnoredLines
				if !strings.Contains(d.Error, tt.wantErr) {
					t.Errorf("error %q, want it to contain %q", d.Error, tt.wantErr)
				}
				if d.RateLimited != tt.wantLimited {
					t.Errorf("rateLimited = %v, want %v (%+v)", d.RateLimited, tt.wantLimited, d)
				}
			}
			if tt.wantUsage && (usage == nil || usage.InputTokens == 0 || usage.OutputTokens == 0) {
				t.Errorf("usage %+v, want tokens reported", usage)
			}
			if tt.backend == "claude" && tt.wantUsage && usage.CostUSD == 0 {
				t.Errorf("usage %+v, want claude's total_cost_usd", usage)
			}
			if (ignored > 0) != tt.wantIgnored {
				t.Errorf("ignoredLines = %d, want some: %v", ignored, tt.wantIgnored)
			}
		})
	}
}
