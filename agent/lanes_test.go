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
		{name: "empty", entries: nil},
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

// testDefaults stand for backends' default lanes.
var testDefaults = map[string]string{
	"Bash": LaneHeavy, "BashOutput": LaneHeavy, "Task": LaneHeavy, "Read": LaneNoNet, "Edit": LaneNoNet,
	"WebFetch": LaneNet, "mcp__*": LaneNet, "shell": LaneHeavy, "file_change": LaneNoNet, "web_search": LaneNet,
}

func TestLaneTableLane(t *testing.T) {
	tab, err := NewLaneTable(testDefaults, map[string]string{
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
		{"SomethingNew", "other", LaneHeavy},
		{"read_notes", "read", LaneNoNet},
		{"run.sh", "exec", LaneNoNet},
	}
	for _, tt := range tests {
		if got := tab.Lane(tt.tool, tt.category); got != tt.want {
			t.Errorf("Lane(%q, %q) = %q, want %q", tt.tool, tt.category, got, tt.want)
		}
	}
}

func TestNewLaneTableLaterTableWins(t *testing.T) {
	tab, err := NewLaneTable(map[string]string{"a": LaneHeavy, "b": LaneNet}, nil, map[string]string{"a": LaneNoNet})
	if err != nil {
		t.Fatal(err)
	}
	if got := tab.Lane("a", "shell"); got != LaneNoNet {
		t.Errorf("Lane(a) = %s, want the later table's no-net", got)
	}
	if got := tab.Lane("b", "other"); got != LaneNet {
		t.Errorf("Lane(b) = %s, want net", got)
	}
	if _, err := NewLaneTable(map[string]string{"ok": LaneNet}, map[string]string{"bad key": LaneNet}); err == nil {
		t.Error("a bad key of a later table was accepted")
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

func TestLaneTableKeys(t *testing.T) {
	tab, err := NewLaneTable(map[string]string{"Bash": LaneHeavy, "mcp__github__*": LaneHeavy, "Read": LaneNoNet, "mcp__*": LaneNet, "shell": LaneHeavy})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		lanes []string
		want  []string
	}{
		{lanes: []string{LaneHeavy}, want: []string{"Bash", "mcp__github__*", "shell"}},
		{lanes: []string{LaneNet, LaneNoNet}, want: []string{"Read", "mcp__*"}},
		{lanes: nil, want: nil},
	}
	for _, tt := range tests {
		if got := tab.Keys(tt.lanes...); !reflect.DeepEqual(got, tt.want) {
			t.Errorf("Keys(%q) = %q, want %q", tt.lanes, got, tt.want)
		}
	}
}
