package codex

import (
	"path/filepath"
	"testing"

	"github.com/loopbus/loopbus/agent"
	"github.com/loopbus/loopbus/agent/agenttest"
	"github.com/loopbus/loopbus/schemas"
)

// TestConformance runs the agent.Backend conformance suite against
// testdata/fake-codex.
func TestConformance(t *testing.T) {
	fake, err := filepath.Abs(filepath.Join("testdata", "fake-codex"))
	if err != nil {
		t.Fatal(err)
	}
	fixture := func(scenario string, want ...agent.Kind) agenttest.Fixture {
		return agenttest.Fixture{
			Spec: schemas.AgentSpec{Backend: schemas.BackendCodex, Command: []string{fake}, Model: "gpt-5-codex"},
			Env:  []string{"FAKE_CODEX_SCENARIO=" + scenario},
			Want: want,
		}
	}
	const (
		start, end, msg, usage = agent.KindToolStart, agent.KindToolEnd, agent.KindMessage, agent.KindUsage
		limit, failure, unk    = agent.KindRateLimit, agent.KindFailure, agent.KindUnknown
	)
	agenttest.RunConformance(t, func() agent.Backend { return Backend{} }, agenttest.Fixtures{
		Success:   fixture("success", start, end, start, end, msg, usage),
		Usage:     fixture("success"),
		RateLimit: fixture("rate_limit", agent.KindRetry, failure, limit),
		Failure:   fixture("failed", start, end, failure),
		Unknown:   fixture("unknown", unk, unk, unk, msg, usage),
		Large:     fixture("large", start, end, msg, usage),
		Hang:      fixture("hang"),
	})
}

func TestDefaultLanes(t *testing.T) {
	tab, err := agent.NewLaneTable(Backend{}.DefaultLanes())
	if err != nil {
		t.Fatal(err)
	}
	for tool, want := range map[string]string{"shell": agent.LaneHeavy, "file_change": agent.LaneNoNet, "web_search": agent.LaneNet} {
		if got := tab.Lane(tool, "other"); got != want {
			t.Errorf("Lane(%s) = %s, want %s", tool, got, want)
		}
	}
	if got := tab.Lane("docs/search", "mcp"); got != agent.LaneNet {
		t.Errorf("an MCP tool in lane %s, want net by its category", got)
	}
}
