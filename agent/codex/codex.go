// Package codex is the agent backend for OpenAI's Codex CLI: it runs
// `codex exec --json` with the prompt on stdin and turns its JSONL event
// stream into agent events.
package codex

import (
	"context"
	"slices"
	"strings"
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
//
// Unless extraArgs say otherwise, Codex may write in its workspace
// (--sandbox workspace-write; its default, read-only, leaves an agent
// unable to write its outputs, and --full-auto, which said so before,
// is gone from Codex 0.171) and runs in a directory that is not a git
// repository (--skip-git-repo-check; without it Codex refuses one, and a
// job's workspace is one unless it is a worktree).
func Argv(model string, extraArgs []string) []string {
	argv := []string{"codex", "exec", "--json"}
	if model != "" {
		argv = append(argv, "--model", model)
	}
	if !hasFlag(extraArgs, "-s", "--sandbox", "--dangerously-bypass-approvals-and-sandbox", "--full-auto") {
		argv = append(argv, "--sandbox", "workspace-write")
	}
	if !hasFlag(extraArgs, "--skip-git-repo-check") {
		argv = append(argv, "--skip-git-repo-check")
	}
	argv = append(argv, extraArgs...)
	return append(argv, "-")
}

// hasFlag reports whether args hold any of flags, alone or as
// "--flag=value".
func hasFlag(args []string, flags ...string) bool {
	for _, a := range args {
		name, _, _ := strings.Cut(a, "=")
		if slices.Contains(flags, name) {
			return true
		}
	}
	return false
}

// DefaultLanes implements agent.LaneDefaulter: Codex's built-in tools (see
// NewParser for their names); its MCP tools ("server/tool") go by category.
func (Backend) DefaultLanes() map[string]string {
	return map[string]string{"shell": agent.LaneHeavy, "file_change": agent.LaneNoNet, "web_search": agent.LaneNet}
}
