// Package exec is the agent backend that runs a configured program as the
// agent: the program is one tool call, from its start to its exit.
package exec

import (
	"context"
	"errors"
	"path/filepath"
	"strings"

	"github.com/loopbus/loopbus/agent"
	"github.com/loopbus/loopbus/schemas"
)

// Category is the tool category (agent.Event.Category) of the program: it
// has no lane of its own, so a program no lane table entry names is
// no-net.
const Category = "exec"

// ToolID is the agent.Event.ToolID of the program's tool call.
const ToolID = "exec"

// Backend runs job.Spec.Command as the agent, the prompt on its stdin. Its
// output is not parsed: it reports one tool call, named after the program,
// whose KindToolEnd carries the exit code and output tail. The zero value
// is ready to use.
type Backend struct{}

var (
	_ agent.Backend     = Backend{}
	_ agent.ToolPlanner = Backend{}
)

// Run implements agent.Backend. A job without a command is an error; a
// program that cannot start is an error too, after its tool call was
// reported failed.
func (Backend) Run(ctx context.Context, job agent.Job, emit func(agent.Event)) (agent.Result, error) {
	argv := job.Spec.Command
	if len(argv) == 0 {
		return agent.Result{ExitCode: -1}, errors.New("agent command is empty")
	}
	name := filepath.Base(argv[0])
	emit(agent.Event{Kind: agent.KindToolStart, ToolID: ToolID, Name: name, Category: Category, Input: agent.Truncate(strings.Join(argv, " "))})
	res, err := agent.RunProcess(ctx, job, argv, nil, nil)
	end := agent.Event{Kind: agent.KindToolEnd, ToolID: ToolID, Name: name, Category: Category,
		Output: res.Tail, Duration: res.Duration, ExitCode: max(res.ExitCode, -1), TimedOut: res.TimedOut}
	switch {
	case err != nil:
		end.IsError, end.Error = true, err.Error()
	case res.TimedOut:
		end.IsError, end.Error = true, "timed out"
	case res.Canceled:
		end.IsError, end.Error = true, "killed: "+context.Cause(ctx).Error()
	case res.ExitCode != 0:
		end.IsError = true
	}
	emit(end)
	return res, err
}

// PlannedTools implements agent.ToolPlanner: the program.
func (Backend) PlannedTools(spec schemas.AgentSpec) []agent.Tool {
	if len(spec.Command) == 0 {
		return nil
	}
	return []agent.Tool{{Name: filepath.Base(spec.Command[0]), Category: Category}}
}
