package agent

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
)

// Lanes group tools by what they need from the machine that runs them, so
// that a worker can refuse the tools it must not run.
const (
	// LaneNoNet: tools that work on the job's files only (read, search,
	// edit, to-do lists).
	LaneNoNet = "no-net"
	// LaneNet: tools that reach the network (web fetch and search, MCP
	// servers).
	LaneNet = "net"
	// LaneHeavy: tools that run arbitrary programs or further agents (shell
	// commands, subagents): they may use the network, CPU and memory at will.
	LaneHeavy = "heavy"
)

// AllLanes returns every lane, in a fixed order.
func AllLanes() []string { return []string{LaneNoNet, LaneNet, LaneHeavy} }

// ErrUnknownLane: a lane name that is not one of AllLanes.
var ErrUnknownLane = errors.New("unknown lane")

// CheckLane returns an error wrapping ErrUnknownLane unless lane is one of
// AllLanes.
func CheckLane(lane string) error {
	if slices.Contains(AllLanes(), lane) {
		return nil
	}
	return fmt.Errorf("%w %q (lanes: %s)", ErrUnknownLane, lane, strings.Join(AllLanes(), ", "))
}

// ParseLaneList parses a comma-separated list of lanes ("no-net,net"),
// ignoring blanks and repeats. An empty list gives nil; an unknown lane is
// an error wrapping ErrUnknownLane.
func ParseLaneList(s string) ([]string, error) {
	var lanes []string
	for _, l := range strings.Split(s, ",") {
		l = strings.TrimSpace(l)
		if l == "" || slices.Contains(lanes, l) {
			continue
		}
		if err := CheckLane(l); err != nil {
			return nil, err
		}
		lanes = append(lanes, l)
	}
	return lanes, nil
}

// CategoryLane is the lane of a tool that no table entry names, by its
// category (Event.Category). A tool of category "other" (one its backend
// does not know, such as a tool newer than it) may do anything: heavy.
func CategoryLane(category string) string {
	switch category {
	case "shell", "agent", "other":
		return LaneHeavy
	case "web", "mcp":
		return LaneNet
	}
	return LaneNoNet
}

// LaneTable maps tool names to lanes. A key is a tool name as the agent
// reports it (Claude Code's Bash, mcp__github__get_issue, Codex's shell), or a
// prefix ending in "*" (mcp__github__*, docs/*). An exact name wins over a
// prefix, a longer prefix over a shorter one. A tool no key matches gets
// the lane of its category: shell commands, subagents and tools of no
// known kind heavy, web and MCP tools net, everything else no-net. The zero value is not usable; see
// NewLaneTable. A LaneTable is immutable and safe for concurrent use.
type LaneTable struct {
	exact map[string]string
	// prefixes are sorted longest first.
	prefixes []lanePrefix
}

type lanePrefix struct{ prefix, lane string }

// LaneKeyError reports a bad entry of a lane table.
type LaneKeyError struct {
	Key string
	Err error
}

func (e *LaneKeyError) Error() string { return fmt.Sprintf("lanes.%s: %v", e.Key, e.Err) }
func (e *LaneKeyError) Unwrap() error { return e.Err }

// CheckLaneKey reports whether key can name tools in a lane table: not
// empty, no spaces, commas or parentheses (a permission rule such as
// "Bash(git:*)" is not a tool name), "*" only at the end.
func CheckLaneKey(key string) error {
	switch {
	case key == "":
		return errors.New("empty tool name")
	case strings.ContainsAny(key, " \t\n,()"):
		return fmt.Errorf("%q is not a tool name (no spaces, commas or parentheses)", key)
	case strings.Contains(strings.TrimSuffix(key, "*"), "*"):
		return fmt.Errorf("%q: \"*\" may only end a key", key)
	}
	return nil
}

// NewLaneTable returns the table of tables' entries (tool name or prefix
// → lane), a later table's entry overriding an earlier one's: typically a
// Registry's DefaultLanes, then the configured lanes. A bad key or an
// unknown lane is a *LaneKeyError naming the key.
func NewLaneTable(tables ...map[string]string) (*LaneTable, error) {
	all := map[string]string{}
	for _, entries := range tables {
		// Sorted, so that the first error is the same every time.
		for _, k := range slices.Sorted(maps.Keys(entries)) {
			if err := CheckLaneKey(k); err != nil {
				return nil, &LaneKeyError{Key: k, Err: err}
			}
			if err := CheckLane(entries[k]); err != nil {
				return nil, &LaneKeyError{Key: k, Err: err}
			}
			all[k] = entries[k]
		}
	}
	t := &LaneTable{exact: map[string]string{}}
	for k, lane := range all {
		if p, ok := strings.CutSuffix(k, "*"); ok {
			t.prefixes = append(t.prefixes, lanePrefix{p, lane})
		} else {
			t.exact[k] = lane
		}
	}
	sort.Slice(t.prefixes, func(i, j int) bool {
		a, b := t.prefixes[i].prefix, t.prefixes[j].prefix
		if len(a) != len(b) {
			return len(a) > len(b)
		}
		return a < b
	})
	return t, nil
}

// Lane returns the lane of tool, whose category (Event.Category) is
// used when no key matches.
func (t *LaneTable) Lane(tool, category string) string {
	if l, ok := t.exact[tool]; ok {
		return l
	}
	for _, p := range t.prefixes {
		if strings.HasPrefix(tool, p.prefix) {
			return p.lane
		}
	}
	return CategoryLane(category)
}

// Keys returns the keys of the table's entries in lanes, sorted: tool names
// and prefixes ending in "*", as given to NewLaneTable. Tools that only
// their category puts in one of lanes are not among them.
func (t *LaneTable) Keys(lanes ...string) []string {
	var keys []string
	for name, l := range t.exact {
		if slices.Contains(lanes, l) {
			keys = append(keys, name)
		}
	}
	for _, p := range t.prefixes {
		if slices.Contains(lanes, p.lane) {
			keys = append(keys, p.prefix+"*")
		}
	}
	sort.Strings(keys)
	return keys
}
