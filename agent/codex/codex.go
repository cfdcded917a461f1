// Package codex is the agent backend for OpenAI's Codex CLI: it runs
// `codex exec --json` with the prompt on stdin and turns its JSONL event
// stream into agent events.
package codex

import (
	"context"
	"slices"
	"time"

	"github.com/loopbus/loopbus/agent"
)

// Backend runs Codex. The zero value is ready to use.
type Backend struct {
	// Now is the clock that times tool calls and resolves limit reset
	// times; nil means time.Now.
	Now func() time.Time
}

var (
	_ agent.Backend       = Backend{}
	_ agent.LaneDefaulter = Backend{}
)

// Run implements agent.Backend: it runs Argv, its program replaced by
// job.Spec.Command when set. Codex cannot be told which tools to avoid:
// job.Forbidden is left to the caller, and Codex does not say in advance
// which tools it will use.
func (b Backend) Run(ctx context.Context, job agent.Job, emit func(agent.Event)) (agent.Result, error) {
	argv := Argv(job.Spec.Model, job.Spec.Args)
	if len(job.Spec.Command) > 0 { // another program in place of "codex"
		argv = append(slices.Clone(job.Spec.Command), argv[1:]...)
	}
	return agent.RunProcess(ctx, job, argv, NewParser(b.Now), emit)
}

// Argv returns the command line that runs Codex non-interactively with
// a JSONL event stream on stdout, the prompt read from stdin ("-"), model
// (when not empty) and extraArgs before the prompt argument.
func Argv(model string, extraArgs []string) []string {
	argv := []string{"codex", "exec", "--json"}
	if model != "" {
		argv = append(argv, "--model", model)
	}
	argv = append(argv, extraArgs...)
	return append(argv, "-")
}

// DefaultLanes implements agent.LaneDefaulter: Codex's built-in tools (see
// NewParser for their names); its MCP tools ("server/tool") go by category.
func (Backend) DefaultLanes() map[string]string {
	return map[string]string{"shell": agent.LaneHeavy, "file_change": agent.LaneNoNet, "web_search": agent.LaneNet}
}
