package schemas

import "time"

// Event types of approval gates: a person approves or rejects a step that
// waits for it (signals), and the orchestrator records that the step waits
// and, when its approval timeout elapses, what it did.
const (
	TypeSignalApprove     = "loopbus.signal.approve"
	TypeSignalReject      = "loopbus.signal.reject"
	TypeApprovalRequested = "loopbus.approval.requested"
	TypeApprovalExpired   = "loopbus.approval.expired"
)

// What an approval gate does when its timeout elapses (Approval.OnTimeout).
const (
	OnTimeoutFail    = "fail"
	OnTimeoutReject  = "reject"
	OnTimeoutApprove = "approve"
)

// FeedbackRejected is the Feedback kind of an iteration a person (or an
// approval timeout) rejected; its Message is the reason.
const FeedbackRejected = "rejected"

// Approval makes a step stop after its validation passed until a person
// approves it (the step completes) or rejects it (another iteration runs
// with the reason as feedback).
type Approval struct {
	// TimeoutMs, when set, bounds the wait; then OnTimeout applies.
	TimeoutMs int64 `json:"timeoutMs,omitempty"`
	// OnTimeout is fail (the default), reject or approve.
	OnTimeout string `json:"onTimeout,omitempty"`
}

// Timeout returns how long the gate waits; zero for no bound.
func (a Approval) Timeout() time.Duration { return time.Duration(a.TimeoutMs) * time.Millisecond }

// Action returns what happens on timeout: OnTimeout, or fail when unset.
func (a Approval) Action() string {
	if a.OnTimeout == "" {
		return OnTimeoutFail
	}
	return a.OnTimeout
}

// ApprovalRequested records that a step's outputs passed validation and
// the step waits for loopbus approve or reject. Emitted by the orchestrator.
type ApprovalRequested struct {
	Step      string        `json:"step"`
	JobID     string        `json:"jobId"`
	Iteration int           `json:"iteration"`
	Artifacts []ArtifactRef `json:"artifacts,omitempty"`
	// Until is when the wait's timeout elapses; nil without a timeout.
	Until *time.Time `json:"until,omitempty"`
	// OnTimeout is what happens then: fail, reject or approve.
	OnTimeout string `json:"onTimeout,omitempty"`
}

// ApprovalExpired records that a step's approval timeout elapsed and
// what the orchestrator did: fail (step.failed follows), reject (another
// iteration runs) or approve (step.completed follows).
type ApprovalExpired struct {
	Step      string `json:"step"`
	JobID     string `json:"jobId"`
	Iteration int    `json:"iteration"`
	OnTimeout string `json:"onTimeout"`
	Reason    string `json:"reason"`
}
