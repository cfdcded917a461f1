package schemas

import "time"

// Event types of loops under control: signals sent by people and tools,
// and the facts the orchestrator records when it acts on them, on budgets,
// rate limits and its circuit breaker.
const (
	TypeSignalStop         = "loopbus.signal.stop"
	TypeSignalPause        = "loopbus.signal.pause"
	TypeSignalResume       = "loopbus.signal.resume"
	TypeSignalInfo         = "loopbus.signal.info"
	TypeSignalInvalidate   = "loopbus.signal.invalidate"
	TypeSignalAcknowledged = "loopbus.signal.acknowledged"
	TypeJobCancelled       = "loopbus.job.cancelled"
	TypeStepWaiting        = "loopbus.step.waiting"
	TypeStepPaused         = "loopbus.step.paused"
	TypeStepResumed        = "loopbus.step.resumed"
	TypeStepInvalidated    = "loopbus.step.invalidated"
	TypeSessionPaused      = "loopbus.session.paused"
	TypeSessionStopped     = "loopbus.session.stopped"
	TypeSessionResumed     = "loopbus.session.resumed"
)

// HintVerb is the name people give the info signal (loopbus.signal.info):
// a hint for a step's next iteration. Commands and pages say hint; the
// event and its data keep info.
const HintVerb = "hint"

// SignalVerb is the verb of SignalTypes a name people use stands for:
// info for HintVerb, the name itself otherwise.
func SignalVerb(name string) string {
	if name == HintVerb {
		return "info"
	}
	return name
}

// SignalName is the name people know a signal's verb by: HintVerb for
// info, the verb itself otherwise.
func SignalName(verb string) string {
	if verb == "info" {
		return HintVerb
	}
	return verb
}

// SignalTypes are the signal event types, by verb.
func SignalTypes() map[string]string {
	return map[string]string{
		"stop":       TypeSignalStop,
		"pause":      TypeSignalPause,
		"resume":     TypeSignalResume,
		"info":       TypeSignalInfo,
		"invalidate": TypeSignalInvalidate,
		"approve":    TypeSignalApprove,
		"reject":     TypeSignalReject,
	}
}

// Signal is the data of every signal.* event: a request to the services
// acting on a session (or one step of it), sent by the CLI or any tool.
// The session is the event's; the orchestrator answers with
// signal.acknowledged.
type Signal struct {
	// Target is the selector as the sender gave it: a session, SESSION/STEP,
	// or "all" (fanned out to one signal per session).
	Target string `json:"target"`
	// Step limits the signal to one step; empty for the whole session.
	Step string `json:"step,omitempty"`
	// Reason says why, for people reading the history.
	Reason string `json:"reason,omitempty"`
	// Message is the hint of an info signal.
	Message string `json:"message,omitempty"`
	// By names who sent an approve or reject signal (the sender's user
	// name, as the sender gave it).
	By string `json:"by,omitempty"`
}

// MaxHintBytes bounds an info signal's message.
const MaxHintBytes = 4 << 10

// Results of an acknowledged signal.
const (
	SignalApplied = "applied"
	SignalIgnored = "ignored"
)

// SignalAcknowledged records that the orchestrator acted on a signal, or
// why it did not.
type SignalAcknowledged struct {
	SignalID string `json:"signalId"`
	// Signal is the verb: stop, pause, resume, info or invalidate.
	Signal string `json:"signal"`
	Step   string `json:"step,omitempty"`
	// Result is "applied" or "ignored".
	Result string `json:"result"`
	// Detail says what was done (or why nothing was).
	Detail string `json:"detail,omitempty"`
}

// JobCancelled tells workers to kill a job's agent: its result no longer
// counts. Emitted by the orchestrator.
type JobCancelled struct {
	JobID     string `json:"jobId"`
	Step      string `json:"step"`
	Iteration int    `json:"iteration"`
	Reason    string `json:"reason"`
}

// StepWaiting records that a step waits until a time before its next
// attempt (an agent's usage or rate limit lifts then).
type StepWaiting struct {
	Step   string    `json:"step"`
	JobID  string    `json:"jobId"`
	Until  time.Time `json:"until"`
	Reason string    `json:"reason"`
}

// Kinds of step.paused.
const (
	PauseSignal  = "pause"   // a pause signal
	PauseStop    = "stop"    // a stop signal for the step: its job was cancelled
	PauseBreaker = "breaker" // the circuit breaker opened
)

// StepPaused records that nothing more is dispatched for a step until it is
// resumed.
type StepPaused struct {
	Step string `json:"step"`
	// Kind is pause, stop or breaker.
	Kind   string `json:"kind"`
	Reason string `json:"reason"`
}

// StepResumed records that a paused step may run again.
type StepResumed struct {
	Step   string `json:"step"`
	Reason string `json:"reason,omitempty"`
}

// StepInvalidated records that a step's result no longer stands: the step
// runs again from its first iteration.
type StepInvalidated struct {
	Step string `json:"step"`
	// Cause is the step the invalidation named (Step itself, or a step it
	// depends on).
	Cause  string `json:"cause"`
	Reason string `json:"reason,omitempty"`
}

// SessionPaused records that nothing new is dispatched for a session;
// running jobs finish.
type SessionPaused struct {
	Reason string `json:"reason,omitempty"`
}

// Kinds of session.stopped.
const (
	StopSignal = "signal" // a stop signal
	StopBudget = "budget" // a budget was reached
)

// SessionStopped records that a session's running jobs were cancelled and
// nothing more is dispatched until it is resumed.
type SessionStopped struct {
	// Kind is signal or budget.
	Kind   string `json:"kind"`
	Reason string `json:"reason"`
}

// SessionResumed records that a paused or stopped session runs again.
type SessionResumed struct {
	Reason string `json:"reason,omitempty"`
}

// Budget bounds what a session may spend; a zero field is no bound.
type Budget struct {
	MaxCostUSD float64 `json:"maxCostUsd,omitempty"`
	MaxTokens  int64   `json:"maxTokens,omitempty"`
	// MaxIterations bounds the agent runs of the whole session.
	MaxIterations int `json:"maxIterations,omitempty"`
}

// Tighter returns the bound of both budgets: for each field, the smaller
// non-zero value.
func (b Budget) Tighter(o Budget) Budget {
	return Budget{
		MaxCostUSD:    tighter(b.MaxCostUSD, o.MaxCostUSD),
		MaxTokens:     tighter(b.MaxTokens, o.MaxTokens),
		MaxIterations: tighter(b.MaxIterations, o.MaxIterations),
	}
}

// tighter returns the smaller of x and y, where zero means no bound.
func tighter[T int | int64 | float64](x, y T) T {
	switch {
	case x == 0:
		return y
	case y == 0:
		return x
	}
	return min(x, y)
}

// Breaker sets the circuit breaker's thresholds; zero fields take the
// defaults, DefaultNoProgress and DefaultIdenticalFailures.
type Breaker struct {
	// NoProgress: iterations in a row whose verdict has the same errors
	// while the outputs did not change.
	NoProgress int `json:"noProgress,omitempty"`
	// IdenticalFailures: job failures in a row with the same error.
	IdenticalFailures int `json:"identicalFailures,omitempty"`
}

// Default circuit breaker thresholds.
const (
	DefaultNoProgress        = 3
	DefaultIdenticalFailures = 3
)

// Or returns b with its zero fields taken from o.
func (b Breaker) Or(o Breaker) Breaker {
	if b.NoProgress == 0 {
		b.NoProgress = o.NoProgress
	}
	if b.IdenticalFailures == 0 {
		b.IdenticalFailures = o.IdenticalFailures
	}
	return b
}
