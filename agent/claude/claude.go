// Package claude is the agent backend for Claude Code: it runs `claude -p`
// headless with the prompt on stdin and turns its stream-json output into
// agent events.
package claude

import (
	"context"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/loopbus/loopbus/agent"
	"github.com/loopbus/loopbus/schemas"
)

// Backend runs Claude Code. The zero value is ready to use.
type Backend struct {
	// Now is the clock that times tool calls and resolves limit reset
	// texts; nil means time.Now.
	Now func() time.Time
}

var (
	_ agent.Backend       = Backend{}
	_ agent.ToolPlanner   = Backend{}
	_ agent.LaneDefaulter = Backend{}
)

// Run implements agent.Backend: it runs Argv (its program replaced by
// job.Spec.Command when set), told not to use the Claude Code tools among
// job.Forbidden (see rules).
func (b Backend) Run(ctx context.Context, job agent.Job, emit func(agent.Event)) (agent.Result, error) {
	s := job.Spec
	argv := Argv(s.Model, s.PermissionMode, s.AllowedTools, rules(job.Forbidden), s.Args)
	if len(s.Command) > 0 { // another program in place of "claude"
		argv = append(slices.Clone(s.Command), argv[1:]...)
	}
	return agent.RunProcess(ctx, job, argv, NewParser(b.Now), emit)
}

// Argv returns the command line for a headless Claude Code run whose
// prompt is written to stdin: claude -p --output-format stream-json --verbose
// [--model M] [--permission-mode P] [--allowedTools a,b]
// [--disallowedTools c,d] extra...
// The tool lists are passed as one comma-separated value each because the
// flags are variadic and would otherwise swallow following positional
// arguments.
func Argv(model, permissionMode string, allowedTools, disallowedTools, extraArgs []string) []string {
	argv := []string{"claude", "-p", "--output-format", "stream-json", "--verbose"}
	if model != "" {
		argv = append(argv, "--model", model)
	}
	if permissionMode != "" {
		argv = append(argv, "--permission-mode", permissionMode)
	}
	if len(allowedTools) > 0 {
		argv = append(argv, "--allowedTools", strings.Join(allowedTools, ","))
	}
	if len(disallowedTools) > 0 {
		argv = append(argv, "--disallowedTools", strings.Join(disallowedTools, ","))
	}
	return append(argv, extraArgs...)
}

// DefaultLanes implements agent.LaneDefaulter: Claude Code's built-in
// tools by category (see category): shell commands and subagents heavy,
// web tools and every MCP tool net, the rest no-net. A tool missing from
// the table goes by its category "other": heavy.
func (Backend) DefaultLanes() map[string]string {
	lanes := map[string]string{"mcp__*": agent.LaneNet}
	for name, c := range claudeCategories {
		lanes[name] = agent.CategoryLane(c)
	}
	return lanes
}

// PlannedTools implements agent.ToolPlanner: the tools spec.AllowedTools
// names.
func (Backend) PlannedTools(spec schemas.AgentSpec) []agent.Tool {
	tools := make([]agent.Tool, 0, len(spec.AllowedTools))
	for _, rule := range spec.AllowedTools {
		name := ruleTool(rule)
		tools = append(tools, agent.Tool{Name: name, Category: category(name)})
	}
	return tools
}

// rules returns the Claude Code permission rules, sorted, for the lane
// table keys (agent.LaneTable.Keys) that can name Claude Code tools: the
// names such tools can have (capitalised built-in names, mcp__ tools), and
// "mcp__SERVER" for a key "mcp__SERVER__*" (Claude Code's rule for every
// tool of a server). Other prefixes, such as mcp__*, have no rule Claude
// Code honours; tools they match are only caught when used.
func rules(keys []string) []string {
	var out []string
	for _, k := range keys {
		prefix, isPrefix := strings.CutSuffix(k, "*")
		if !isPrefix {
			if strings.HasPrefix(k, "mcp__") || (k != "" && k[0] >= 'A' && k[0] <= 'Z') {
				out = append(out, k)
			}
			continue
		}
		server, ok := strings.CutPrefix(prefix, "mcp__")
		if !ok {
			continue
		}
		if server, ok = strings.CutSuffix(server, "__"); ok && server != "" && !strings.Contains(server, "__") {
			out = append(out, "mcp__"+server)
		}
	}
	sort.Strings(out)
	return slices.Compact(out)
}

// ruleTool returns the tool a Claude Code permission rule names: "Bash"
// for "Bash(git log:*)", the rule itself when it has no specifier.
func ruleTool(rule string) string {
	name, _, _ := strings.Cut(strings.TrimSpace(rule), "(")
	return strings.TrimSpace(name)
}
