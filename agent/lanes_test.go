package agent

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

func TestNewLaneTable(t *testing.T) {
	tests := []struct {
		name    string
		entries map[string]string
		wantErr string // substring; "" means no error
		wantKey string // the key the error names
	}{
		{name: "defaults only", entries: nil},
		{name: "overrides and additions", entries: map[string]string{"Bash": LaneNoNet, "mcp__github__*": LaneHeavy, "build.sh": LaneHeavy}},
		{name: "unknown lane", entries: map[string]string{"Bash": "hevy"}, wantErr: `unknown lane "hevy" (lanes: no-net, net, heavy)`, wantKey: "Bash"},
		{name: "empty lane", entries: map[string]string{"Read": ""}, wantErr: "unknown lane", wantKey: "Read"},
		{name: "empty key", entries: map[string]string{"": LaneNet}, wantErr: "empty tool name", wantKey: ""},
		{name: "permission rule as key", entries: map[string]string{"Bash(git:*)": LaneNet}, wantErr: "not a tool name", wantKey: "Bash(git:*)"},
		{name: "star inside key", entries: map[string]string{"mcp__*__x": LaneNet}, wantErr: `"*" may only end a key`, wantKey: "mcp__*__x"},
		{name: "first bad key in order", entries: map[string]string{"b": "x", "a": "y"}, wantErr: "unknown lane", wantKey: "a"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tab, err := NewLaneTable(tt.entries)
			if tt.wantErr == "" {
				if err != nil || tab == nil {
					t.Fatalf("NewLaneTable: %v", err)
				}
				return
			}
			var ke *LaneKeyError
			if !errors.As(err, &ke) {
				t.Fatalf("error %v, want a *LaneKeyError", err)
			}
			if ke.Key != tt.wantKey || !strings.Contains(err.Error(), tt.wantErr) || !strings.HasPrefix(err.Error(), "lanes."+tt.wantKey+": ") {
				t.Errorf("error %q (key %q), want key %q and %q", err, ke.Key, tt.wantKey, tt.wantErr)
			}
		})
	}
}

func TestLaneTableLane(t *testing.T) {
	tab, err := NewLaneTable(map[string]string{
		"Bash":                   LaneNoNet, // an override of a default
		"mcp__github__*":         LaneHeavy, // a longer prefix than mcp__*
		"mcp__github__get_issue": LaneNet,
		"docs/*":                 LaneNoNet,
	})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		tool, category, want string
	}{
		{"Bash", "shell", LaneNoNet},
		{"BashOutput", "shell", LaneHeavy},
		{"Read", "read", LaneNoNet},
		{"Edit", "edit", LaneNoNet},
		{"WebFetch", "web", LaneNet},
		{"Task", "agent", LaneHeavy},
		{"mcp__slack__post", "mcp", LaneNet},
		{"mcp__github__create_issue", "mcp", LaneHeavy},
		{"mcp__github__get_issue", "mcp", LaneNet},
		{"shell", "shell", LaneHeavy},
		{"file_change", "edit", LaneNoNet},
		{"web_search", "web", LaneNet},
		{"docs/search", "mcp", LaneNoNet},
		{"db/query", "mcp", LaneNet},
		{"spawn_agent", "agent", LaneHeavy},
		{"SomethingNew", "other", LaneNoNet},
		{"run.sh", "exec", LaneNoNet},
	}
	for _, tt := range tests {
		if got := tab.Lane(tt.tool, tt.category); got != tt.want {
			t.Errorf("Lane(%q, %q) = %q, want %q", tt.tool, tt.category, got, tt.want)
		}
	}
}

func TestDefaultLanesCoverClaudeCategories(t *testing.T) {
	tab, err := NewLaneTable(nil)
	if err != nil {
		t.Fatal(err)
	}
	// Every default entry is a valid lane, and a Claude tool's default lane
	// agrees with its category's.
	for name, lane := range DefaultLanes() {
		if err := CheckLane(lane); err != nil {
			t.Errorf("default %s: %v", name, err)
		}
		if strings.HasSuffix(name, "*") || name[0] < 'A' || name[0] > 'Z' {
			continue
		}
		if want := categoryLane(ClaudeCategory(name)); lane != want {
			t.Errorf("default lane of %s = %s, its category %s gives %s", name, lane, ClaudeCategory(name), want)
		}
		if got := tab.Lane(name, "other"); got != lane {
			t.Errorf("Lane(%s) = %s, want the default %s", name, got, lane)
		}
	}
}

func TestParseLaneList(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    []string
		wantErr bool
	}{
		{name: "empty", in: "", want: nil},
		{name: "two", in: "no-net,net", want: []string{LaneNoNet, LaneNet}},
		{name: "spaces and repeats", in: " heavy , net,heavy,", want: []string{LaneHeavy, LaneNet}},
		{name: "all", in: "no-net,net,heavy", want: AllLanes()},
		{name: "unknown", in: "no-net,gpu", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseLaneList(tt.in)
			if (err != nil) != tt.wantErr {
				t.Fatalf("ParseLaneList(%q) error %v, wantErr %v", tt.in, err, tt.wantErr)
			}
			if err != nil {
				if !errors.Is(err, ErrUnknownLane) || !strings.Contains(err.Error(), `"gpu"`) {
					t.Errorf("error %v, want ErrUnknownLane naming gpu", err)
				}
				return
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("ParseLaneList(%q) = %q, want %q", tt.in, got, tt.want)
			}
		})
	}
}

func TestClaudeRules(t *testing.T) {
	tab, err := NewLaneTable(map[string]string{"mcp__github__*": LaneHeavy, "mcp__jira__search": LaneHeavy, "docs/*": LaneHeavy, "mcp__a__b__*": LaneHeavy})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		lanes []string
		want  []string
	}{
		{name: "heavy", lanes: []string{LaneHeavy}, want: []string{"Agent", "Bash", "BashOutput", "KillBash", "KillShell", "Task", "mcp__github", "mcp__jira__search"}},
		{name: "net: mcp__* has no rule", lanes: []string{LaneNet}, want: []string{"WebFetch", "WebSearch"}},
		{name: "none", lanes: nil, want: nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tab.ClaudeRules(tt.lanes...); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("ClaudeRules(%q) = %q, want %q", tt.lanes, got, tt.want)
			}
		})
	}
}

func TestRuleTool(t *testing.T) {
	tests := []struct{ rule, want string }{
		{"Bash", "Bash"}, {"Bash(git log:*)", "Bash"}, {" Read ", "Read"}, {"mcp__github", "mcp__github"}, {"WebFetch(domain:x.org)", "WebFetch"},
	}
	for _, tt := range tests {
		if got := RuleTool(tt.rule); got != tt.want {
			t.Errorf("RuleTool(%q) = %q, want %q", tt.rule, got, tt.want)
		}
	}
}
