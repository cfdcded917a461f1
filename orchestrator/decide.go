package orchestrator

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"text/template"
	"time"

	"github.com/loopbus/loopbus/definition"
	"github.com/loopbus/loopbus/schemas"
)

// Decide returns the events that should follow, given st with trigger
// already applied. It is level-triggered: it looks at the whole session, not
// only at the trigger, so a decision lost to a crash or to a concurrent
// writer is made again on the next event. It does not change st. Event ids
// are derived from the session's logical position (step, round, iteration,
// attempt, or the signal answered), so a repeated decision de-duplicates.
// trigger supplies causation; now supplies the event time and ends
// rate-limit waits.
//
// Signals are answered first, in order, each with signal.acknowledged
// (a finished session acknowledges them as ignored). Then steps are
// advanced; nothing is dispatched for a paused or stopped session or a held
// step, and a request beyond the budget stops the session instead.
func Decide(st *State, trigger schemas.Event, now time.Time) []schemas.Event {
	orig := st.Sessions[trigger.Session]
	if orig == nil || orig.terminal() && len(orig.Pending) == 0 && len(orig.Orphans) == 0 {
		return nil
	}
	d := &decider{s: orig.clone(), trigger: trigger, now: now, prompts: st.Prompts}
	d.decide()
	return d.out
}

// decider accumulates one decision; emit applies each event to its copy of
// the session so later choices see earlier ones.
type decider struct {
	s       *Session
	trigger schemas.Event
	now     time.Time
	out     []schemas.Event
	prompts *PromptCache
}

func (d *decider) emit(typ, step string, data any, idParts ...string) {
	s := d.s
	idParts = rerunParts(s, typ, idParts...)
	ev := schemas.Event{
		ID:          schemas.DeterministicID(append([]string{s.ID, typ}, idParts...)...),
		Type:        typ,
		Session:     s.ID,
		Step:        step,
		Causation:   d.trigger.ID,
		Correlation: s.StartID,
		Time:        d.now,
		Data:        data,
	}
	switch x := data.(type) {
	case *schemas.JobRequested:
		ev.Job = x.JobID
	case *schemas.JobCancelled:
		ev.Job = x.JobID
	}
	evolveSession(s, ev)
	d.out = append(d.out, ev)
}

// rerunParts adds the session's rerun count to the id of a session-level
// event (completed, failed, stopped, resumed, paused) once session.rerun
// reopened it: the new run ends with events of its own, not copies the
// stream de-duplicates. Step-level ids differ by their round.
func rerunParts(s *Session, typ string, parts ...string) []string {
	switch typ {
	case schemas.TypeSessionCompleted, schemas.TypeSessionFailed, schemas.TypeSessionStopped, schemas.TypeSessionResumed, schemas.TypeSessionPaused:
		if s.Reruns > 0 {
			parts = append(slices.Clone(parts), "rerun", strconv.Itoa(s.Reruns))
		}
	}
	return parts
}

// freeParts adds the count of free iterations (after conflicting merges)
// to an id when there were any: the step passes again.
func freeParts(st *Step, parts ...string) []string {
	if st.Free > 0 {
		parts = append(parts, "free", strconv.Itoa(st.Free))
	}
	return parts
}

// roundParts adds the round to an id when it is not the first.
func roundParts(st *Step, parts ...string) []string {
	if st.Round > 0 {
		parts = append(parts, "round", strconv.Itoa(st.Round))
	}
	return parts
}

func (d *decider) fail(step string, iterations int, reason string) {
	parts := []string{step}
	if st := d.s.Steps[step]; st != nil {
		parts = roundParts(st, step)
	}
	d.emit(schemas.TypeStepFailed, step, &schemas.StepFailed{Step: step, Iterations: iterations, Error: reason}, parts...)
	d.emit(schemas.TypeSessionFailed, "", &schemas.SessionFailed{Step: step, Reason: fmt.Sprintf("step %s failed: %s", step, reason)})
}

// request dispatches a job, unless the budget forbids it: then the session
// stops. It reports whether the decision goes on.
func (d *decider) request(st *Step, iteration, attempt int, feedback []schemas.Feedback) bool {
	s := d.s
	if reason := s.overBudget(true); reason != "" {
		d.stopForBudget(reason)
		return false
	}
	jobRequestOf := jobRequest
	switch {
	case s.Backlog != nil:
		jobRequestOf = backlogJobRequest
	case s.Loops != nil:
		jobRequestOf = loopJobRequest
	}
	jr, err := jobRequestOf(d.prompts, s, st, iteration, attempt, feedback)
	if err != nil {
		d.fail(st.Def.Name, st.Iteration, err.Error())
		return false
	}
	jr.DefinitionFiles = s.DefinitionFiles
	idParts := []string{st.Def.Name, strconv.Itoa(iteration)}
	if attempt > 1 {
		idParts = append(idParts, "attempt", strconv.Itoa(attempt))
	}
	if jr.Round > 0 {
		idParts = append(idParts, "round", strconv.Itoa(jr.Round))
	}
	d.emit(schemas.TypeJobRequested, st.Def.Name, jr, idParts...)
	return true
}

// cancel cancels the step's job if it has not reported yet.
func (d *decider) cancel(st *Step, reason string) (jobID string, ok bool) {
	if !st.inFlight() {
		return "", false
	}
	jobID = st.JobID
	d.emit(schemas.TypeJobCancelled, st.Def.Name, &schemas.JobCancelled{JobID: jobID, Step: st.Def.Name, Iteration: st.Iteration, Reason: reason}, jobID)
	return jobID, true
}

// cancelAll cancels every job in flight.
func (d *decider) cancelAll(reason string) []string {
	var ids []string
	for _, name := range d.s.stepNames() {
		if id, ok := d.cancel(d.s.Steps[name], reason); ok {
			ids = append(ids, id)
		}
	}
	return ids
}

func (d *decider) stopForBudget(reason string) {
	d.cancelAll("budget: " + reason)
	d.emit(schemas.TypeSessionStopped, "", &schemas.SessionStopped{Kind: schemas.StopBudget, Reason: "budget: " + reason},
		"budget", strconv.Itoa(d.s.Resumes))
}

func (d *decider) decide() {
	s := d.s
	for len(s.Pending) > 0 {
		d.answer(s.Pending[0])
	}
	// Jobs still running that a close or a rerun left behind: workers
	// kill them. Each is cancelled once (a snapshot: a cancellation the
	// fold did not take must not loop).
	for _, o := range slices.Clone(s.Orphans) {
		d.emit(schemas.TypeJobCancelled, o.Step, &o, o.JobID)
	}
	if s.terminal() {
		return
	}
	if s.Status == StatusStopped && s.StopKind == schemas.StopBudget && s.BudgetID != s.StopBudgetID {
		// session.budget set the bounds again since the budget stopped
		// the session: go on if they allow it, else say it still holds.
		if reason := s.overBudget(true); reason != "" {
			d.emit(schemas.TypeSessionStopped, "", &schemas.SessionStopped{Kind: schemas.StopBudget, Reason: "budget: still spent after the new budget: " + reason},
				"budget", "raise", s.BudgetID)
		} else {
			d.emit(schemas.TypeSessionResumed, "", &schemas.SessionResumed{Reason: "budget raised"}, "budget", s.BudgetID)
		}
	}
	if s.Backlog != nil && s.Backlog.Phase == "" {
		d.backlogStart()
	}
	if d.dispatchTimeouts() {
		return
	}
	dispatchable := func(st *Step) bool { return s.Status == StatusRunning && st.Hold == "" }
	// Each pass changes some step; the bound only guards against a bug
	// spinning the orchestrator for ever.
	for pass, changed := 0, true; changed && !s.terminal() && pass < 8*len(s.Steps)+8; pass++ {
		changed = false
		for _, name := range s.stepNames() {
			st := s.Steps[name]
			switch {
			case st.Status == StepRunning && st.Outcome == outcomePassed && s.gated(st) && !st.Approved:
				// An approval gate: the step waits for approve or reject
				// (signals), or for its timeout.
				if st.AwaitJob != st.JobID {
					d.awaitApproval(st)
					changed = true
				} else if !st.AwaitUntil.IsZero() && s.Status == StatusRunning && !d.now.Before(st.AwaitUntil) {
					if d.approvalExpired(st); s.terminal() {
						return
					}
					changed = true
				}
			case st.Status == StepRunning && st.Outcome == outcomeFailed && st.Failure != nil && st.Failure.Kind == schemas.FeedbackRejected &&
				st.Iteration-st.Free < st.Def.MaxIterations:
				// Rejected at its approval gate: the next iteration runs
				// with the reason as feedback (a person's rejection is
				// free; one by the gate's timeout counts, and once
				// max_iterations are spent the step fails below).
				if dispatchable(st) {
					fb := schemas.BoundFeedback(slices.Concat(st.Feedback, []schemas.Feedback{*st.Failure}))
					if !d.request(st, st.Iteration+1, 1, fb) {
						return
					}
					changed = true
				}
			case st.Status == StepRunning && st.Outcome == outcomePassed && s.Backlog != nil:
				d.finishRun(st)
				changed = true
			case st.Status == StepRunning && st.Outcome == outcomePassed:
				parts := freeParts(st, roundParts(st, name)...)
				d.emit(schemas.TypeStepCompleted, name, &schemas.StepCompleted{
					Step: name, JobID: st.JobID, Iterations: st.Iteration, Artifacts: st.Passed,
					ContentHash: schemas.ContentHash(st.Passed), SchemaVersion: schemas.StepSchemaVersion(*st.Def),
				}, parts...)
				changed = true
			case st.Status == StepRunning && st.Outcome == outcomeFailed && st.RateLimited:
				if st.WaitJob != st.JobID {
					until := d.now.Add(DefaultRateLimitWait)
					if st.ResetAt != nil {
						// A reset already past (clock skew, a stale
						// message) must not retry at once, again and
						// again: the wait floor doubles with each
						// rate-limited attempt in a row.
						until = *st.ResetAt
						if floor := d.now.Add(rateLimitFloor(st.RateLimits)); until.Before(floor) {
							until = floor
						}
					}
					d.emit(schemas.TypeStepWaiting, name, &schemas.StepWaiting{Step: name, JobID: st.JobID, Until: until.UTC(),
						Reason: firstLine(st.Failure.Message)}, st.JobID)
					changed = true
				}
				if dispatchable(st) && !d.now.Before(st.WaitUntil) {
					// Not the agent's fault and not bounded by MaxAttempts:
					// the limit lifts.
					if !d.request(st, st.Iteration, st.Attempt+1, st.Feedback) {
						return
					}
					changed = true
				}
			case st.Status == StepRunning && st.Outcome == outcomeFailed && st.Retryable && st.Attempt < MaxAttempts:
				// Not the agent's fault (an input could not be fetched, its
				// workers kept dying): run the same iteration again.
				if dispatchable(st) {
					if !d.request(st, st.Iteration, st.Attempt+1, st.Feedback) {
						return
					}
					changed = true
				}
			case st.Status == StepRunning && st.Outcome == outcomeFailed:
				if st.Iteration-st.Free >= st.Def.MaxIterations {
					if s.Backlog != nil && !slices.Contains(roleSteps, name) {
						d.blockTask(st, exhausted(st))
						changed = true
						continue
					}
					if s.Loops != nil {
						if d.loopFailed(st, exhausted(st)); s.terminal() {
							return
						}
						changed = true
						continue
					}
					d.fail(name, st.Iteration, exhausted(st))
					return
				}
				if reason := s.breakerOpen(st); reason != "" && st.Hold == "" {
					d.emit(schemas.TypeStepPaused, name, &schemas.StepPaused{Step: name, Kind: schemas.PauseBreaker, Reason: reason},
						roundParts(st, name, "breaker", strconv.Itoa(st.Iteration))...)
					changed = true
					continue
				}
				if dispatchable(st) {
					fb := schemas.BoundFeedback(slices.Concat(st.Feedback, []schemas.Feedback{*st.Failure}))
					if !d.request(st, st.Iteration+1, 1, fb) {
						return
					}
					changed = true
				}
			case st.Status == StepPending && s.ready(st) && dispatchable(st):
				// A step cut short by a stop runs its iteration again.
				if !d.request(st, max(st.Iteration, 1), 1, st.Feedback) {
					return
				}
				changed = true
			}
		}
		switch {
		case s.Backlog != nil:
			if !s.terminal() && d.backlogFill() {
				changed = true
			}
			if s.Loops != nil && !s.terminal() && d.mergeQueue() {
				changed = true
			}
		case s.Loops != nil:
			if !s.terminal() && d.loopsFill() {
				changed = true
			}
		case !changed && s.canComplete():
			d.emit(schemas.TypeSessionCompleted, "", &schemas.SessionCompleted{Final: s.finalArtifacts()})
		}
	}
	if s.Status == StatusRunning && s.anyInFlight() {
		// Jobs in flight spend on: stop them once the budget is gone. With
		// none, the next request stops the session (a verdict still due
		// may complete it).
		if reason := s.overBudget(false); reason != "" {
			d.stopForBudget(reason)
		}
	}
}

// dispatchTimeouts fails the first step (in file order) whose job no
// worker started within the pipeline's job_dispatch_timeout: the job is
// cancelled (a worker that takes it later drops it) and the step and the
// session fail, naming the job's lanes' likely cause. It reports whether
// the session ended.
func (d *decider) dispatchTimeouts() bool {
	s := d.s
	for _, name := range s.stepNames() {
		st := s.Steps[name]
		at, has := s.dispatchDeadline(st)
		if !has || d.now.Before(at) {
			continue
		}
		timeout := time.Duration(s.Pipeline.JobDispatchTimeoutMs) * time.Millisecond
		reason := fmt.Sprintf("job %s was not started within job_dispatch_timeout %s: no worker took it (does a worker run its tool lanes? see agentworker --lanes)", st.JobID, timeout)
		d.cancel(st, "job_dispatch_timeout")
		d.fail(name, st.Iteration, reason)
		return true
	}
	return false
}

func (s *Session) anyInFlight() bool {
	for _, st := range s.Steps {
		if st.inFlight() {
			return true
		}
	}
	return false
}

// rateLimitFloor is the least wait after the n-th rate-limited attempt in
// a row: 5s, doubling, at most 30 minutes.
func rateLimitFloor(n int) time.Duration {
	d := 5 * time.Second
	for i := 1; i < n && d < 30*time.Minute; i++ {
		d *= 2
	}
	return min(d, 30*time.Minute)
}

// DefaultRateLimitWait is how long a step waits after an agent hit a usage
// or rate limit without saying when it lifts.
const DefaultRateLimitWait = 5 * time.Minute

// overBudget returns why the session may not spend more ("" when it may).
// Cost and tokens count what jobs reported; with dispatching, the
// iterations bound counts the request about to be made.
func (s *Session) overBudget(dispatching bool) string {
	b, u := s.Budget, s.Spent()
	switch {
	case b.MaxCostUSD > 0 && u.CostUSD >= b.MaxCostUSD:
		return fmt.Sprintf("cost $%.4f reached max_cost_usd $%.4f", u.CostUSD, b.MaxCostUSD)
	case b.MaxTokens > 0 && u.InputTokens+u.OutputTokens >= b.MaxTokens:
		return fmt.Sprintf("%d tokens reached max_tokens %d", u.InputTokens+u.OutputTokens, b.MaxTokens)
	case dispatching && b.MaxIterations > 0 && s.Requests >= b.MaxIterations:
		return fmt.Sprintf("%d agent runs reached max_iterations %d", s.Requests, b.MaxIterations)
	}
	return ""
}

// breakerOpen returns why the circuit breaker stops st ("" when it does
// not): too many iterations in a row without progress, or identical
// failures.
func (s *Session) breakerOpen(st *Step) string {
	b := schemas.Breaker{NoProgress: schemas.DefaultNoProgress, IdenticalFailures: schemas.DefaultIdenticalFailures}
	if s.Pipeline.Breaker != nil {
		b = s.Pipeline.Breaker.Or(b)
	}
	if st.Def.Breaker != nil {
		b = st.Def.Breaker.Or(b)
	}
	if st.Failure == nil {
		return ""
	}
	switch {
	case st.Failure.Kind == "validation" && st.Repeats >= b.NoProgress:
		return fmt.Sprintf("circuit breaker: %d iterations in a row without progress (same verdict errors, unchanged outputs); resume the step to go on", st.Repeats)
	case st.Failure.Kind == "job" && st.Repeats >= b.IdenticalFailures:
		return fmt.Sprintf("circuit breaker: %d identical job failures in a row (%s); resume the step to go on", st.Repeats, firstLine(st.Failure.Message))
	}
	return ""
}

// answer acts on one pending signal and acknowledges it.
func (d *decider) answer(p PendingSignal) {
	s := d.s
	ack := func(result, detail string) {
		d.emit(schemas.TypeSignalAcknowledged, p.Step, &schemas.SignalAcknowledged{SignalID: p.ID, Signal: p.Verb, Step: p.Step, Result: result, Detail: detail}, p.ID)
	}
	ignore := func(format string, args ...any) { ack(schemas.SignalIgnored, fmt.Sprintf(format, args...)) }
	if s.terminal() {
		ignore("session %s already %s", s.ID, s.Status)
		return
	}
	var st *Step
	if p.Step != "" {
		if st = s.Steps[p.Step]; st == nil {
			ignore("session %s has no step %s", s.ID, p.Step)
			return
		}
	}
	why := func(what string) string {
		if p.Reason != "" {
			return what + ": " + p.Reason
		}
		return what
	}
	switch {
	case p.Verb == "stop" && st == nil:
		if s.Status == StatusStopped {
			ignore("session already stopped")
			return
		}
		ids := d.cancelAll(why("stop signal"))
		d.emit(schemas.TypeSessionStopped, "", &schemas.SessionStopped{Kind: schemas.StopSignal, Reason: why("stopped by signal")}, p.ID)
		ack(schemas.SignalApplied, "session stopped; "+cancelled(ids))
	case p.Verb == "stop":
		targets := s.subtree(st, func(t *Step) bool { return t.Status != StepCompleted })
		if len(targets) == 0 {
			ignore("step %s already completed", st.Def.Name)
			return
		}
		var ids, names []string
		for _, t := range targets {
			if id, ok := d.cancel(t, why("stop signal")); ok {
				ids = append(ids, id)
			}
			d.emit(schemas.TypeStepPaused, t.Def.Name, &schemas.StepPaused{Step: t.Def.Name, Kind: schemas.PauseStop, Reason: why("stopped by signal")}, t.Def.Name, p.ID)
			names = append(names, t.Def.Name)
		}
		ack(schemas.SignalApplied, "step "+strings.Join(names, ", ")+" stopped; "+cancelled(ids))
	case p.Verb == "pause" && st == nil:
		if s.Status != StatusRunning {
			ignore("session already %s", s.Status)
			return
		}
		d.emit(schemas.TypeSessionPaused, "", &schemas.SessionPaused{Reason: why("paused by signal")}, p.ID)
		ack(schemas.SignalApplied, "session paused; running jobs finish, nothing new is dispatched")
	case p.Verb == "pause":
		targets := s.subtree(st, func(t *Step) bool { return t.Status != StepCompleted && t.Hold == "" })
		if len(targets) == 0 {
			ignore("step %s is %s", st.Def.Name, stepState(st))
			return
		}
		var names []string
		for _, t := range targets {
			d.emit(schemas.TypeStepPaused, t.Def.Name, &schemas.StepPaused{Step: t.Def.Name, Kind: schemas.PauseSignal, Reason: why("paused by signal")}, t.Def.Name, p.ID)
			names = append(names, t.Def.Name)
		}
		ack(schemas.SignalApplied, "step "+strings.Join(names, ", ")+" paused")
	case p.Verb == "resume":
		d.resume(p, st, ack, ignore)
	case p.Verb == "info":
		if p.Message == "" {
			ignore("an info signal needs a message")
			return
		}
		if s.Backlog != nil && p.Step == "" {
			ack(schemas.SignalApplied, "added to the next agent run's prompt")
			return
		}
		var names []string
		for _, t := range s.hintTargets(p.Step) {
			names = append(names, t.Def.Name)
		}
		if len(names) == 0 {
			ignore("no step left to run")
			return
		}
		ack(schemas.SignalApplied, "added to the next prompt of step "+strings.Join(names, ", "))
	case p.Verb == "approve" || p.Verb == "reject":
		d.answerApproval(p, st, ack, ignore)
	case p.Verb == "invalidate" && s.Loops != nil && s.Backlog == nil:
		if st == nil {
			ignore("invalidate names a loop: SESSION/LOOP")
			return
		}
		if lp := s.Loops.Loops[p.Step]; lp == nil || lp.Status == LoopInvalidated {
			ignore("loop %s no longer stands (an ancestor was invalidated); invalidate a running loop", p.Step)
			return
		}
		names := d.invalidateLoop(p.Step, p.Step, p.Reason, p.ID)
		ack(schemas.SignalApplied, "runs again: "+names[0]+cancelledLoops(names[1:]))
	case p.Verb == "invalidate" && s.Backlog != nil:
		ignore("invalidate is for pipeline steps; in a backlog, set a task's status with loopbus tasks set-status")
	case p.Verb == "invalidate":
		if st == nil {
			ignore("invalidate names a step: SESSION/STEP")
			return
		}
		var names []string
		for _, name := range s.stepNames() {
			if name != p.Step && !s.dependsOn(name, p.Step) {
				continue
			}
			t := s.Steps[name]
			d.cancel(t, why("step "+p.Step+" invalidated"))
			d.emit(schemas.TypeStepInvalidated, name, &schemas.StepInvalidated{Step: name, Cause: p.Step, Reason: p.Reason}, name, p.ID)
			names = append(names, name)
		}
		ack(schemas.SignalApplied, "runs again: "+strings.Join(names, ", "))
	default:
		ignore("unknown signal %q", p.Verb)
	}
}

// gated reports whether st has an approval gate: a pipeline step, a loop
// of a level or a backlog run of a role with approval set (its Def carries
// the gate).
func (s *Session) gated(st *Step) bool { return st.Def.Approval != nil }

// awaitApproval records that st's passed outputs wait for approval, until
// its timeout if it has one.
func (d *decider) awaitApproval(st *Step) {
	a := st.Def.Approval
	data := &schemas.ApprovalRequested{Step: st.Def.Name, JobID: st.JobID, Iteration: st.Iteration, Artifacts: st.Passed}
	if a.Timeout() > 0 {
		until := d.now.Add(a.Timeout()).UTC()
		data.Until, data.OnTimeout = &until, a.Action()
	}
	d.emit(schemas.TypeApprovalRequested, st.Def.Name, data, st.Def.Name, st.JobID)
}

// approvalExpired applies st's on_timeout: the step is rejected (another
// iteration runs), is approved (it completes on the next pass) or fails
// as if it had used up its iterations: a pipeline step or a backlog's
// role run fails the session, a loop fails as a loop does (its parent
// iterates again, see loopFailed), and a backlog's task run blocks its
// task while the backlog goes on.
func (d *decider) approvalExpired(st *Step) {
	a := st.Def.Approval
	action := a.Action()
	reason := fmt.Sprintf("no approval within %s", a.Timeout())
	if action == schemas.OnTimeoutReject {
		reason = fmt.Sprintf("rejected: no approval within %s", a.Timeout())
	}
	d.emit(schemas.TypeApprovalExpired, st.Def.Name, &schemas.ApprovalExpired{Step: st.Def.Name, JobID: st.JobID, Iteration: st.Iteration,
		OnTimeout: action, Reason: reason}, st.Def.Name, st.JobID)
	if action != schemas.OnTimeoutFail {
		return
	}
	// As the step's iterations running out would (see Decide).
	why := fmt.Sprintf("approval timed out: no approval within %s (on_timeout: fail)", a.Timeout())
	switch s := d.s; {
	case s.Backlog != nil && !slices.Contains(roleSteps, st.Def.Name):
		d.blockTask(st, why)
	case s.Loops != nil:
		d.loopFailed(st, why)
	default:
		d.fail(st.Def.Name, st.Iteration, why)
	}
}

// answerApproval acts on an approve or reject signal: only a step (a
// loop, a backlog run) awaiting approval takes one; any other is
// acknowledged as ignored, saying why.
func (d *decider) answerApproval(p PendingSignal, st *Step, ack func(result, detail string), ignore func(string, ...any)) {
	switch {
	case st == nil:
		ignore("%s names a step awaiting approval: SESSION/STEP", p.Verb)
		return
	case !d.s.gated(st):
		ignore("%s has no approval gate", d.s.gateName(st))
		return
	case !st.awaitingApproval():
		state := st.Status
		switch {
		case st.Status == StepRunning && st.Outcome == outcomeNone:
			state = "running"
		case st.Status == StepRunning && st.Outcome == outcomePassed && st.Approved:
			state = "approved"
		case st.Status == StepRunning && st.Outcome == outcomeFailed:
			state = "running again"
		}
		ignore("%s is not awaiting approval (it is %s)", d.s.gateName(st), state)
		return
	case p.Verb == "reject" && strings.TrimSpace(p.Reason) == "":
		ignore("a reject needs a reason: it is the next iteration's feedback")
		return
	}
	by := ""
	if p.By != "" {
		by = " by " + p.By
	}
	if p.Verb == "approve" {
		then := "it completes"
		if lp := d.s.loopOf(st); lp != nil {
			if lv := d.s.Loops.Def.Level(lp.Level); lv != nil && lv.Children != nil {
				then = "it completes and spawns its children"
			}
		}
		ack(schemas.SignalApplied, fmt.Sprintf("%s approved%s; %s", d.s.gateName(st), by, then))
		return
	}
	ack(schemas.SignalApplied, fmt.Sprintf("%s rejected%s; iteration %d runs with the reason as feedback", d.s.gateName(st), by, st.Iteration+1))
}

// gateName names st for messages about its gate: step NAME, loop ID, task
// ID (a backlog's task run) or the NAME run (a backlog's role run).
func (s *Session) gateName(st *Step) string {
	name := st.Def.Name
	switch {
	case s.Backlog != nil && slices.Contains(roleSteps, name):
		return "the " + name + " run"
	case s.Backlog != nil:
		return "task " + name
	case s.Loops != nil:
		return "loop " + name
	}
	return "step " + name
}

// loopOf returns the loop st runs in a loops session, nil otherwise.
func (s *Session) loopOf(st *Step) *Loop {
	if s.Loops == nil || s.Backlog != nil {
		return nil
	}
	return s.Loops.Loops[st.Def.Name]
}

// resume resumes the session (and every held or waiting step) or one step.
func (d *decider) resume(p PendingSignal, st *Step, ack func(result, detail string), ignore func(string, ...any)) {
	s := d.s
	var steps []*Step
	if st != nil {
		steps = s.subtree(st, func(*Step) bool { return true })
	} else {
		for _, name := range s.stepNames() {
			steps = append(steps, s.Steps[name])
		}
	}
	var resumed []string
	// Resuming a running session or a named step also ends rate-limit
	// waits early: the user says the limit has lifted.
	endWaits := st != nil || s.Status == StatusRunning
	if st == nil && s.Status != StatusRunning {
		if s.StopKind == schemas.StopBudget {
			if reason := s.overBudget(true); reason != "" {
				ignore("the budget is still exhausted (%s); raise it with loopbus budget %s, or close the session with loopbus close %s", reason, s.ID, s.ID)
				return
			}
		}
		d.emit(schemas.TypeSessionResumed, "", &schemas.SessionResumed{Reason: p.Reason}, p.ID)
		resumed = append(resumed, "session")
	}
	for _, t := range steps {
		if t.Hold != "" || endWaits && t.waiting() && d.now.Before(t.WaitUntil) {
			d.emit(schemas.TypeStepResumed, t.Def.Name, &schemas.StepResumed{Step: t.Def.Name, Reason: p.Reason}, t.Def.Name, p.ID)
			resumed = append(resumed, "step "+t.Def.Name)
		}
	}
	if len(resumed) == 0 {
		if st != nil {
			ignore("step %s is %s", st.Def.Name, stepState(st))
		} else {
			ignore("session is %s and no step is paused", s.Status)
		}
		return
	}
	ack(schemas.SignalApplied, "resumed "+strings.Join(resumed, ", "))
}

func cancelled(ids []string) string {
	if len(ids) == 0 {
		return "no job was running"
	}
	return "cancelled job " + strings.Join(ids, ", ")
}

// stepState describes a step for acknowledgements.
func stepState(st *Step) string {
	switch {
	case st.Hold == schemas.PauseBreaker:
		return "held by its circuit breaker"
	case st.Hold != "":
		return "already paused"
	case st.waiting():
		return "waiting until " + st.WaitUntil.Format(time.RFC3339)
	case st.awaitingApproval():
		return "awaiting approval"
	case st.Status == StepCompleted:
		return "completed"
	}
	return "not paused"
}

// dependsOn reports whether step name requires dep, directly or not.
func (s *Session) dependsOn(name, dep string) bool {
	seen := map[string]bool{}
	var walk func(string) bool
	walk = func(n string) bool {
		if seen[n] {
			return false
		}
		seen[n] = true
		st := s.Steps[n]
		if st == nil {
			return false
		}
		for _, r := range st.Def.Requires {
			if r == dep || walk(r) {
				return true
			}
		}
		return false
	}
	return walk(name)
}

func (s *Session) ready(st *Step) bool {
	for _, r := range st.Def.Requires {
		if dep := s.Steps[r]; dep == nil || dep.Status != StepCompleted {
			return false
		}
	}
	return true
}

func (s *Session) finalArtifacts() []schemas.ArtifactRef {
	for _, d := range s.Pipeline.Steps {
		if d.Final {
			return s.Steps[d.Name].Artifacts
		}
	}
	last := s.Pipeline.Steps[len(s.Pipeline.Steps)-1].Name
	return s.Steps[last].Artifacts
}

func exhausted(st *Step) string {
	f := st.Failure
	var detail string
	switch {
	case f == nil:
	case len(f.Errors) > 0:
		parts := make([]string, 0, len(f.Errors))
		for _, e := range f.Errors {
			parts = append(parts, e.String())
		}
		detail = strings.Join(parts, "; ")
	default:
		detail = firstLine(f.Message)
	}
	return fmt.Sprintf("no valid output after %d of %d iterations; last error: %s", st.Iteration, st.Def.MaxIterations, detail)
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

// MaxAttempts bounds how often one iteration is requested after retryable
// job failures.
const MaxAttempts = 3

// MaxPromptBytes bounds a rendered prompt; the job.requested carrying it,
// JSON-escaped, with bounded feedback, must stay under bus.MaxEventBytes
// (512 KiB). A prompt with many characters JSON escapes six-fold can still
// exceed it: the session then fails with the reason (see Unrecordable).
const MaxPromptBytes = definition.MaxPromptBytes

// JobID names a job: session, step and iteration, then the attempt and the
// round when they are not the first.
func JobID(session, step string, iteration, attempt, round int) string {
	id := session + "." + step + "." + strconv.Itoa(iteration)
	if attempt > 1 {
		id += ".a" + strconv.Itoa(attempt)
	}
	if round > 0 {
		id += ".r" + strconv.Itoa(round)
	}
	return id
}

// PromptData is what a step's prompt template sees.
type PromptData struct {
	Input     schemas.ArtifactRef
	Artifacts map[string]schemas.ArtifactRef
	// Feedback is the formatted failures of earlier iterations ("" at first).
	Feedback  string
	Iteration int
	Session   string
	Step      string
	// Hints is the formatted messages of info signals ("" when none).
	Hints string
}

func jobRequest(prompts *PromptCache, s *Session, st *Step, iteration, attempt int, feedback []schemas.Feedback) (*schemas.JobRequested, error) {
	inputs := []schemas.ArtifactRef{s.Input}
	arts := map[string]schemas.ArtifactRef{}
	for _, r := range st.Def.Requires {
		for _, a := range s.Steps[r].Artifacts {
			inputs = append(inputs, a)
			arts[a.Name] = a
		}
	}
	data := PromptData{Input: s.Input, Artifacts: arts, Feedback: schemas.FormatFeedback(feedback), Iteration: iteration, Session: s.ID, Step: st.Def.Name,
		Hints: formatHints(st.Hints)}
	prompt, err := renderPrompt(prompts, st.Def.Prompt, data, data.Feedback, data.Hints)
	if err != nil {
		return nil, err
	}
	if len(prompt) > MaxPromptBytes {
		return nil, fmt.Errorf("the rendered prompt is %d bytes, over the %d-byte limit; pass large content as artifacts (files in in/) instead", len(prompt), MaxPromptBytes)
	}
	return &schemas.JobRequested{
		JobID: JobID(s.ID, st.Def.Name, iteration, attempt, st.Round), Step: st.Def.Name, Iteration: iteration, Attempt: attempt,
		Agent: st.Def.Agent, Prompt: prompt, Inputs: inputs, Outputs: st.Def.Outputs,
		Validate: st.Def.Validate, TimeoutMs: st.Def.TimeoutMs, ValidateTimeoutMs: st.Def.ValidateTimeoutMs,
		Dir: s.Pipeline.Dir, Feedback: feedback, Round: st.Round, Hints: slices.Clone(st.Hints),
	}, nil
}

// formatHints renders info messages for a prompt, oldest first.
func formatHints(hints []string) string {
	var b strings.Builder
	for _, h := range hints {
		b.WriteString("- ")
		b.WriteString(strings.ReplaceAll(strings.TrimSpace(h), "\n", "\n  "))
		b.WriteString("\n")
	}
	return b.String()
}

// RenderPrompt executes a prompt template. When the template does not use
// .Feedback and there is feedback, it is appended under its own heading, so
// an agent always learns why its previous iteration failed; so are .Hints,
// the operator's info messages.
func RenderPrompt(text string, data PromptData) (string, error) {
	return renderPrompt(nil, text, data, data.Feedback, data.Hints)
}

// renderPrompt is RenderPrompt with the template from prompts.
func renderPrompt(prompts *PromptCache, text string, data any, feedback, hints string) (string, error) {
	t, err := prompts.parse(text)
	if err != nil {
		return "", err
	}
	return renderTemplate(t, text, data, feedback, hints)
}

// parsePrompt parses a prompt template as every prompt is parsed.
func parsePrompt(text string) (*template.Template, error) {
	t, err := definition.ParsePrompt("prompt", text)
	if err != nil {
		return nil, fmt.Errorf("prompt template: %w", err)
	}
	return t, nil
}

// renderTemplate renders t, parsed from text.
func renderTemplate(t *template.Template, text string, data any, feedback, hints string) (string, error) {
	// Bounded: a template that would render without end (huge printf
	// widths, nested loops, long output) fails its step here instead of
	// exhausting the orchestrator, on every replay alike.
	out, err := definition.RenderPrompt(t, data, MaxPromptBytes)
	if err != nil {
		return "", fmt.Errorf("prompt template: %w", err)
	}
	var b strings.Builder
	b.WriteString(out)
	if feedback != "" && !strings.Contains(text, ".Feedback") {
		b.WriteString("\n\n## Feedback from earlier iterations\n\n")
		b.WriteString(feedback)
	}
	if hints != "" && !strings.Contains(text, ".Hints") {
		b.WriteString("\n\n## Notes from the operator\n\n")
		b.WriteString(hints)
	}
	return b.String(), nil
}

// SafeDecide is Decide, except that a panic while deciding (a bug, or a
// session's events the decider cannot handle) does not escape: the
// session fails with the panic as its reason (see Crashed), so one session
// can never take the orchestrator down, nor hit it again on a restart.
func SafeDecide(st *State, trigger schemas.Event, now time.Time) (evs []schemas.Event) {
	defer func() {
		if r := recover(); r != nil {
			evs = Crashed(st, trigger, fmt.Errorf("panic: %v", r), now)
		}
	}()
	return Decide(st, trigger, now)
}

// Crashed returns the event that ends a session the decider failed on:
// session.failed naming the event and the cause, under the id of the
// session's ordinary failure. It reads only the session's id and start.
func Crashed(st *State, trigger schemas.Event, cause error, now time.Time) []schemas.Event {
	s := st.Sessions[trigger.Session]
	if s == nil || s.Status == StatusCompleted || s.Status == StatusFailed {
		return nil
	}
	return []schemas.Event{{
		ID: schemas.DeterministicID(append([]string{s.ID, schemas.TypeSessionFailed}, rerunParts(s, schemas.TypeSessionFailed)...)...), Type: schemas.TypeSessionFailed, Session: s.ID,
		Causation: trigger.ID, Correlation: s.StartID, Time: now,
		Data: &schemas.SessionFailed{Reason: fmt.Sprintf("the orchestrator could not decide after event %s (%s): %v", trigger.ID, trigger.Type, cause)},
	}}
}

// Unrecordable returns the events that end a session whose decision evs
// could not be written for a reason retrying cannot fix (the server refused
// it, or it does not encode): the step it concerned fails, and the session
// with it, so nobody waits for a decision that will never come. Like Decide
// it is pure and its ids are those of the ordinary failure events.
func Unrecordable(st *State, trigger schemas.Event, evs []schemas.Event, cause error, now time.Time) []schemas.Event {
	s := st.Sessions[trigger.Session]
	if s == nil || s.terminal() {
		return nil
	}
	step := ""
	types := make([]string, 0, len(evs))
	for _, ev := range evs {
		types = append(types, strings.TrimPrefix(ev.Type, "loopbus."))
		if step == "" && ev.Step != "" {
			step = ev.Step
		}
	}
	reason := fmt.Sprintf("the orchestrator could not record its decision (%s): %v", strings.Join(types, ", "), cause)
	mk := func(typ, stepName string, data any, idParts ...string) schemas.Event {
		return schemas.Event{
			ID: schemas.DeterministicID(append([]string{s.ID, typ}, rerunParts(s, typ, idParts...)...)...), Type: typ, Session: s.ID, Step: stepName,
			Causation: trigger.ID, Correlation: s.StartID, Time: now, Data: data,
		}
	}
	var out []schemas.Event
	if st := s.Steps[step]; st != nil && st.Status != StepCompleted && st.Status != StepFailed {
		out = append(out, mk(schemas.TypeStepFailed, step, &schemas.StepFailed{Step: step, Iterations: st.Iteration, Error: reason}, roundParts(st, step)...))
		reason = fmt.Sprintf("step %s failed: %s", step, reason)
	}
	return append(out, mk(schemas.TypeSessionFailed, "", &schemas.SessionFailed{Step: step, Reason: reason}))
}
