package schemas

// Event types that keep no session hanging: a budget raised (or set) on a
// running or stopped session, and a session closed for good. Both are
// stated by people and tools (the client role); the orchestrator acts on
// them.
const (
	TypeSessionBudget = "loopbus.session.budget"
	TypeSessionClosed = "loopbus.session.closed"
	// TypeSessionRerun reopens an ended (completed or failed) or stopped
	// session: a step and its dependents, or every step, run again.
	TypeSessionRerun = "loopbus.session.rerun"
)

// SessionRerun reopens a completed, failed or stopped pipeline session
// (never a closed one, nor one that runs): Step and every step that
// requires it, directly or not, run again (with Step empty, every step),
// in a new round, so their jobs get new ids; steps that had not completed
// run again too. The session is running again until it ends anew.
type SessionRerun struct {
	Step string `json:"step,omitempty"`
	// Reason says why, for people reading the history.
	Reason string `json:"reason,omitempty"`
}

// SessionBudget sets the session's budget: each non-zero field replaces
// the bound in force (the pipeline's, tightened by the session's own); a
// zero field keeps it. A session stopped by its budget that the new bound
// allows to go on resumes.
type SessionBudget struct {
	Budget Budget `json:"budget"`
	// Reason says why, for people reading the history.
	Reason string `json:"reason,omitempty"`
}

// SessionClosed ends a session for good: nothing more is dispatched, jobs
// still running are cancelled, and no signal or budget reopens it.
type SessionClosed struct {
	Reason string `json:"reason,omitempty"`
}

// With returns b with each non-zero bound of o replacing b's.
func (b Budget) With(o Budget) Budget {
	if o.MaxCostUSD != 0 {
		b.MaxCostUSD = o.MaxCostUSD
	}
	if o.MaxTokens != 0 {
		b.MaxTokens = o.MaxTokens
	}
	if o.MaxIterations != 0 {
		b.MaxIterations = o.MaxIterations
	}
	return b
}
