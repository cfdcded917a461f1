package agentworker

import (
	"context"
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/loopbus/loopbus/agent"
	"github.com/loopbus/loopbus/schemas"
	"github.com/loopbus/loopbus/workspace"
	"github.com/loopbus/loopbus/workspace/procrun"
)

// outcome is what an agent's events said about its run.
type outcome struct {
	usage    schemas.Usage
	hasUsage bool
	// failure is the agent's own error report (codex turn.failed, a claude
	// error result), empty when it reported none.
	failure string
	// rateLimit is the agent's usage- or rate-limit message, empty when
	// none was hit; resetAt is when it lifts, if it said.
	rateLimit string
	resetAt   time.Time
	// ignored counts lines of types loopbus does not know.
	ignored int
	// retries counts the API requests the agent's client retried;
	// stopReason is the agent's word on how its run ended.
	retries    int
	stopReason string
	// publishErr is the first event that could not be published.
	publishErr error
}

// runAgent runs jr's agent with backend b under run, in dir with env (a
// model-API backend's tools confined to root, the workspace). Each
// event it reports is published as it comes (with ctx): tool calls →
// tool.started/tool.completed with the lane from the lane table, text →
// agent.message; usage, failures and limits go into the outcome. Every
// text is masked with sec. The events are not waited for one by one, but
// all are stored when runAgent returns; the first publish that fails is
// kept in the outcome (the caller hands the job back). A tool of a lane
// this worker lacks ends run through stop with a *laneError; backends
// that can are told not to use those tools in the first place. The error
// is the backend's: the agent could not be started.
func (s *Service) runAgent(ctx, run context.Context, stop context.CancelCauseFunc, b agent.Backend, req schemas.Event, jr *schemas.JobRequested, root, dir string, env []string, sec *workspace.Secrets, delivery uint64) (agent.Result, *outcome, error) {
	out := &outcome{}
	d := strconv.FormatUint(delivery, 10)
	// The agent does not wait for its events to be stored: they are all
	// waited for once it is done, before anything of its result.
	events := s.bus.Async()
	publish := func(ctx context.Context, typ string, data any, idParts ...string) {
		if out.publishErr != nil {
			return
		}
		if err := events.Publish(ctx, s.event(req, typ, data, append([]string{jr.JobID, d}, idParts...)...)); err != nil {
			out.publishErr = err
		}
	}
	names := map[string]string{} // tool id → masked name, for the end
	messages := 0
	stopped := false
	emit := func(o agent.Event) {
		switch o.Kind {
		case agent.KindToolStart:
			name := nonEmpty(sec.Mask(o.Name), "tool")
			names[o.ToolID] = name
			lane := s.lanes.Lane(o.Name, o.Category)
			publish(ctx, schemas.TypeToolStarted, &schemas.ToolStarted{
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
			switch {
			case o.TimedOut:
				status = "timeout"
			case o.IsError:
				status = "error"
			}
			// Published even while the worker shuts down, so that the
			// tool.started has its end (and waited for so, below).
			publish(context.WithoutCancel(ctx), schemas.TypeToolCompleted, &schemas.ToolCompleted{
				JobID: jr.JobID, ToolID: toolID(jr.JobID, d, o.ToolID), Name: name, Lane: s.lanes.Lane(o.Name, o.Category), Status: status,
				ExitCode: o.ExitCode, DurationMs: o.Duration.Milliseconds(), Error: sec.Mask(o.Error),
				// An output may be the end of the agent's output (exec's):
				// masked as a tail, cut by a secret or not.
				Output: sec.MaskTail(o.Output, procrun.DefaultTailBytes),
			}, "tool", o.ToolID, "completed")
		case agent.KindMessage:
			messages++
			publish(ctx, schemas.TypeAgentMessage, &schemas.AgentMessage{JobID: jr.JobID, Text: sec.Mask(o.Text)}, "message", strconv.Itoa(messages))
		case agent.KindUsage:
			out.hasUsage = true
			addUsage(&out.usage, o.Usage)
			for _, name := range slices.Sorted(maps.Keys(o.Models)) {
				if out.usage.Models == nil {
					out.usage.Models = map[string]schemas.Usage{}
				}
				if _, ok := out.usage.Models[name]; !ok && len(out.usage.Models) >= maxModels {
					continue // the agent's names, bounded
				}
				m := out.usage.Models[name]
				addUsage(&m, o.Models[name])
				out.usage.Models[name] = m
			}
		case agent.KindRetry:
			out.retries++
		case agent.KindStop:
			out.stopReason = cutRunes(sec.Mask(o.Text), maxStopReason)
		case agent.KindRateLimit:
			out.rateLimit = nonEmpty(sec.Mask(o.Text), "usage or rate limit reached")
			if !o.ResetAt.IsZero() {
				out.resetAt = o.ResetAt
			}
		case agent.KindFailure:
			out.failure = nonEmpty(sec.Mask(o.Text), "the agent reported an error")
		case agent.KindUnknown:
			out.ignored++
		}
	}
	var forbidden []string
	if len(s.lacks) > 0 {
		forbidden = s.lanes.Keys(s.lacks...)
	}
	res, err := b.Run(run, agent.Job{
		Spec:    jr.Agent,
		Dir:     dir,
		Root:    root,
		Env:     env,
		Prompt:  jr.Prompt,
		Timeout: time.Duration(jr.TimeoutMs) * time.Millisecond,
		// Room for a secret cut by the tail's start: mask first, then cut.
		TailBytes: procrun.DefaultTailBytes + sec.MaxLen(),
		Forbidden: forbidden,
	}, emit)
	// Waited for even while the worker shuts down (tool.completed is
	// published so too, that a tool.started has its end): then for at
	// most shutdownWait, as long as announcing a job handed back may
	// take. Else for up to eventsWait: the agent's work is done, and
	// giving up on its events (while a cluster elects a new leader, say)
	// would hand the job back, to run the agent again.
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), eventsWait)
	stopping := context.AfterFunc(ctx, func() { time.AfterFunc(shutdownWait, cancel) })
	werr := events.Wait(wctx)
	stopping()
	cancel()
	if werr != nil && out.publishErr == nil {
		out.publishErr = werr
	}
	res.Tail = sec.MaskTail(res.Tail, procrun.DefaultTailBytes)
	if out.ignored > 0 {
		s.log.Debug().Str("job", jr.JobID).Int("lines", out.ignored).Msg("ignored agent event lines of unknown types")
	}
	return res, out, err
}

// eventsWait bounds the wait for an agent's events to be stored once it
// has finished, far above the seconds a cluster takes to elect a new
// leader; shutdownWait bounds it, and the other writes of a job handed
// back, once the worker shuts down.
const (
	eventsWait   = time.Minute
	shutdownWait = 5 * time.Second
)

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
// maxStopReason bounds a job's stopReason (the schema's maxLength): the
// text comes from the agent.
const maxStopReason = 200

// cutRunes returns s cut to at most n runes.
func cutRunes(s string, n int) string {
	for i := range s {
		if n == 0 {
			return s[:i]
		}
		n--
	}
	return s
}

// maxModels bounds the models a job's usage is given by (the schema's
// maxProperties): the names come from the agent.
const maxModels = 16

// addUsage adds what an agent reported to a job's usage, whose input
// tokens count the cached ones (read and written) too.
func addUsage(u *schemas.Usage, a agent.Usage) {
	u.InputTokens += a.InputTokens + a.CacheReadTokens + a.CacheWriteTokens
	u.CachedTokens += a.CacheReadTokens
	u.CacheWriteTokens += a.CacheWriteTokens
	u.OutputTokens += a.OutputTokens
	u.ReasoningTokens += a.ReasoningTokens
	u.Turns += a.Turns
	u.CostUSD += a.CostUSD
}

func (o *outcome) usageRef() *schemas.Usage {
	if o == nil || !o.hasUsage {
		return nil
	}
	u := o.usage
	return &u
}

func (o *outcome) ignoredLines() int {
	if o == nil {
		return 0
	}
	return o.ignored
}
