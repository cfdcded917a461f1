package agentworker

import (
	"context"
	"slices"
	"strconv"
	"time"

	"github.com/loopbus/loopbus/agent"
	"github.com/loopbus/loopbus/schemas"
	"github.com/loopbus/loopbus/workspace"
	"github.com/loopbus/loopbus/workspace/procrun"
)

// cliOutcome is what an agent CLI's event stream said about its run.
type cliOutcome struct {
	usage    schemas.Usage
	hasUsage bool
	// failure is the CLI's own error report (codex turn.failed, a claude
	// error result), empty when it reported none.
	failure string
	// rateLimit is the CLI's usage- or rate-limit message, empty when none
	// was hit; resetAt is when it lifts, if it said.
	rateLimit string
	resetAt   time.Time
	// ignored counts lines of types loopbus does not know.
	ignored int
	// publishErr is the first event that could not be published.
	publishErr error
}

// runCLI runs the claude or codex backend under run: the CLI with its JSON
// event stream on stdout, the prompt on stdin. Each line becomes events as
// it arrives (published with ctx): tool calls → tool.started/tool.completed
// with the lane from the lane table, text → agent.message; usage, failures
// and limits go into the outcome. Every text is masked with sec. The first
// publish that fails is kept in the outcome (the caller hands the job
// back). A tool of a lane this worker lacks ends run through stop with a
// *laneError; claude is told not to use those tools in the first place.
// The error is procrun's: the CLI could not be started.
func (s *Service) runCLI(ctx, run context.Context, stop context.CancelCauseFunc, req schemas.Event, jr *schemas.JobRequested, ws *workspace.Workspace, env []string, sec *workspace.Secrets, delivery uint64) (procrun.Result, *cliOutcome, error) {
	var argv []string
	var parser agent.Parser
	a := jr.Agent
	if a.Backend == schemas.BackendClaude {
		var disallowed []string
		if len(s.lacks) > 0 {
			disallowed = s.lanes.ClaudeRules(s.lacks...)
		}
		argv, parser = agent.ClaudeArgv(a.Model, a.PermissionMode, a.AllowedTools, disallowed, a.Args), agent.NewClaude()
	} else {
		argv, parser = agent.CodexArgv(a.Model, a.Args), agent.NewCodex()
	}
	if len(a.Command) > 0 { // another program in place of "claude"/"codex"
		argv = append(slices.Clone(a.Command), argv[1:]...)
	}
	out := &cliOutcome{}
	d := strconv.FormatUint(delivery, 10)
	publish := func(typ string, data any, idParts ...string) {
		if out.publishErr != nil {
			return
		}
		if _, err := s.bus.Publish(ctx, s.event(req, typ, data, append([]string{jr.JobID, d}, idParts...)...)); err != nil {
			out.publishErr = err
		}
	}
	names := map[string]string{} // tool id → masked name, for the end
	messages := 0
	stopped := false
	onLine := func(line []byte) {
		for _, o := range parser.Line(line) {
			switch o.Kind {
			case agent.KindToolStart:
				name := nonEmpty(sec.Mask(o.Name), "tool")
				names[o.ToolID] = name
				lane := s.lanes.Lane(o.Name, o.Category)
				publish(schemas.TypeToolStarted, &schemas.ToolStarted{
					JobID: jr.JobID, ToolID: toolID(jr.JobID, d, o.ToolID), Name: name, Lane: lane, Input: sec.Mask(o.Input),
				}, "tool", o.ToolID, "started")
				if !s.has[lane] && !stopped {
					stopped = true
					s.log.Warn().Str("session", req.Session).Str("job", jr.JobID).Str("tool", name).Str("lane", lane).
						Msg("the agent used a tool of a lane this worker does not run: killing it")
					stop(&laneError{tool: name, lane: lane, has: s.cfg.Lanes})
				}
			case agent.KindToolEnd:
				name := nonEmpty(names[o.ToolID], nonEmpty(sec.Mask(o.Name), "tool"))
				status := "ok"
				if o.IsError {
					status = "error"
				}
				publish(schemas.TypeToolCompleted, &schemas.ToolCompleted{
					JobID: jr.JobID, ToolID: toolID(jr.JobID, d, o.ToolID), Name: name, Lane: s.lanes.Lane(o.Name, o.Category), Status: status,
					DurationMs: o.Duration.Milliseconds(), Output: sec.Mask(o.Output),
				}, "tool", o.ToolID, "completed")
			case agent.KindMessage:
				messages++
				publish(schemas.TypeAgentMessage, &schemas.AgentMessage{JobID: jr.JobID, Text: sec.Mask(o.Text)}, "message", strconv.Itoa(messages))
			case agent.KindUsage:
				out.hasUsage = true
				out.usage.InputTokens += o.Usage.InputTokens + o.Usage.CacheReadTokens + o.Usage.CacheWriteTokens
				out.usage.OutputTokens += o.Usage.OutputTokens
				out.usage.CostUSD += o.Usage.CostUSD
			case agent.KindRateLimit:
				out.rateLimit = nonEmpty(sec.Mask(o.Text), "usage or rate limit reached")
				if !o.ResetAt.IsZero() {
					out.resetAt = o.ResetAt
				}
			case agent.KindFailure:
				out.failure = sec.Mask(o.Text)
			case agent.KindResult:
				if o.IsError && out.failure == "" {
					out.failure = nonEmpty(sec.Mask(o.Text), "the agent reported an error")
				}
			case agent.KindUnknown:
				out.ignored++
			}
		}
	}
	res, err := procrun.Run(run, procrun.Spec{
		Argv:         argv,
		Dir:          ws.Root,
		Env:          env,
		Stdin:        []byte(jr.Prompt),
		Timeout:      time.Duration(jr.TimeoutMs) * time.Millisecond,
		TailBytes:    procrun.DefaultTailBytes + sec.MaxLen(),
		OnStdoutLine: onLine,
	})
	res.Tail = sec.MaskTail(res.Tail, procrun.DefaultTailBytes)
	if out.ignored > 0 {
		s.log.Debug().Str("job", jr.JobID).Int("lines", out.ignored).Msg("ignored agent event lines of unknown types")
	}
	return res, out, err
}

// toolID names a tool call of one delivery of a job.
func toolID(job, delivery, id string) string {
	return schemas.DeterministicID(job, delivery, "tool", id)
}

func nonEmpty(s, otherwise string) string {
	if s == "" {
		return otherwise
	}
	return s
}

// usageRef is the reported usage, nil when none was (or o is nil).
func (o *cliOutcome) usageRef() *schemas.Usage {
	if o == nil || !o.hasUsage {
		return nil
	}
	u := o.usage
	return &u
}

func (o *cliOutcome) ignoredLines() int {
	if o == nil {
		return 0
	}
	return o.ignored
}
