package schemas

import "slices"

// Role names who may state an event: the service (or the person, for
// client) that publishes it. A trust file (see bus.Trust) lists the
// public keys of each role.
type Role string

// The roles. Admin may publish every event type (repairs by hand).
const (
	RoleOrchestrator Role = "orchestrator"
	RoleAgentworker  Role = "agentworker"
	RoleValidator    Role = "validator"
	RoleClient       Role = "client"
	RoleAdmin        Role = "admin"
)

// Roles lists every role.
func Roles() []Role {
	return []Role{RoleOrchestrator, RoleAgentworker, RoleValidator, RoleClient, RoleAdmin}
}

// Publishers returns the roles that may publish events of type t (admin
// excepted, which may publish any); nil for an unknown type. It is the
// event half of examples/secure/nats-server.conf.
func Publishers(t string) []Role {
	switch t {
	case TypeSessionStarted, TypeSignalStop, TypeSignalPause, TypeSignalResume, TypeSignalInfo, TypeSignalInvalidate, TypeHookCompleted, TypeHookFailed:
		return []Role{RoleClient}
	case TypeSignalApprove, TypeSignalReject:
		return []Role{RoleClient}
	case TypeApprovalRequested, TypeApprovalExpired:
		return []Role{RoleOrchestrator}
	case TypeSessionBudget, TypeSessionClosed, TypeSessionRerun, TypeStepImported, TypeSessionForked:
		return []Role{RoleClient}
	case TypeTaskAdded, TypeTaskUpdated:
		return []Role{RoleClient, RoleOrchestrator}
	case TypeJobStarted, TypeJobHeartbeat, TypeJobReleased, TypeJobCompleted, TypeJobFailed, TypeToolStarted, TypeToolCompleted, TypeAgentMessage, TypeArtifactStored:
		return []Role{RoleAgentworker}
	case TypeValidationPassed, TypeValidationFailed:
		return []Role{RoleValidator}
	case TypeJobRequested, TypeJobCancelled, TypeStepCompleted, TypeStepFailed, TypeStepWaiting, TypeStepPaused, TypeStepResumed, TypeStepInvalidated, TypeSessionCompleted, TypeSessionFailed, TypeSessionPaused, TypeSessionStopped, TypeSessionResumed, TypeSignalAcknowledged, TypeTaskSelected, TypeBacklogPhase, TypeLoopSpawned, TypeLoopMerged, TypeLoopRebase, TypeLoopInvalidated:
		return []Role{RoleOrchestrator}
	}
	return nil
}

// MayPublish reports whether role r may state an event of type t.
func MayPublish(r Role, t string) bool {
	ps := Publishers(t)
	return ps != nil && (r == RoleAdmin || slices.Contains(ps, r))
}
