package claude

import (
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/loopbus/loopbus/agent"
	"github.com/loopbus/loopbus/agent/agenttest"
	"github.com/loopbus/loopbus/schemas"
)

// TestConformance runs the agent.Backend conformance suite against
// testdata/fake-claude.
func TestConformance(t *testing.T) {
	fake, err := filepath.Abs(filepath.Join("testdata", "fake-claude"))
	if err != nil {
		t.Fatal(err)
	}
	fixture := func(scenario string, want ...agent.Kind) agenttest.Fixture {
		return agenttest.Fixture{
			Spec: schemas.AgentSpec{Backend: schemas.BackendClaude, Command: []string{fake}, Model: "sonnet"},
			Env:  []string{"FAKE_CLAUDE_SCENARIO=" + scenario},
			Want: want,
		}
	}
	const (
		start, end, msg, usage = agent.KindToolStart, agent.KindToolEnd, agent.KindMessage, agent.KindUsage
		limit, failure, unk    = agent.KindRateLimit, agent.KindFailure, agent.KindUnknown
	)
	agenttest.RunConformance(t, func() agent.Backend { return Backend{} }, agenttest.Fixtures{
		Success:   fixture("success", msg, start, end, start, end, msg, usage),
		Usage:     fixture("success"),
		RateLimit: fixture("rate_limit", limit, msg, usage, limit, failure),
		Failure:   fixture("error", start, end, usage, failure),
		Unknown:   fixture("unknown", unk, unk, msg, usage),
		Large:     fixture("large", msg, start, end, usage),
		Hang:      fixture("hang"),
	})
}

func TestDefaultLanesAgreeWithCategories(t *testing.T) {
	tab, err := agent.NewLaneTable(Backend{}.DefaultLanes())
	if err != nil {
		t.Fatal(err)
	}
	// A built-in tool's default lane is its category's, so that a table
	// without the entry would give the same lane.
	for name, lane := range (Backend{}).DefaultLanes() {
		if strings.HasSuffix(name, "*") {
			continue
		}
		if got := tab.Lane(name, "other"); got != lane {
			t.Errorf("Lane(%s) = %s, want the default %s", name, got, lane)
		}
		if got := tab.Lane("unlisted", category(name)); got != lane {
			t.Errorf("default lane of %s = %s, its category %s gives %s", name, lane, category(name), got)
		}
	}
	if got := tab.Lane("mcp__github__get_issue", "mcp"); got != agent.LaneNet {
		t.Errorf("MCP tool in lane %s, want net", got)
	}
}

func TestRules(t *testing.T) {
	tab, err := agent.NewLaneTable(Backend{}.DefaultLanes(),
		map[string]string{"mcp__github__*": agent.LaneHeavy, "mcp__jira__search": agent.LaneHeavy, "docs/*": agent.LaneHeavy, "mcp__a__b__*": agent.LaneHeavy, "shell": agent.LaneHeavy})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		lanes []string
		want  []string
	}{
		{name: "heavy", lanes: []string{agent.LaneHeavy}, want: []string{"Agent", "Bash", "BashOutput", "KillBash", "KillShell", "Monitor", "PowerShell", "SendMessage", "Task", "TaskStop", "Workflow", "mcp__github", "mcp__jira__search"}},
		{name: "net: mcp__* has no rule", lanes: []string{agent.LaneNet}, want: []string{"WebFetch", "WebSearch"}},
		{name: "none", lanes: nil, want: nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := rules(tab.Keys(tt.lanes...)); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("rules(%q) = %q, want %q", tt.lanes, got, tt.want)
			}
		})
	}
}

func TestPlannedTools(t *testing.T) {
	got := Backend{}.PlannedTools(schemas.AgentSpec{AllowedTools: []string{"Bash(git log:*)", " Read ", "mcp__github", "WebFetch(domain:x.org)"}})
	want := []agent.Tool{{Name: "Bash", Category: "shell"}, {Name: "Read", Category: "read"}, {Name: "mcp__github", Category: "mcp"}, {Name: "WebFetch", Category: "web"}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("PlannedTools = %+v, want %+v", got, want)
	}
}
