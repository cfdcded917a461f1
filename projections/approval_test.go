package projections

import (
	"testing"
	"time"

	"github.com/loopbus/loopbus/schemas"
)

// A step waiting at its approval gate shows awaiting_approval, with its
// deadline, until its next job or its end.
func TestFoldApproval(t *testing.T) {
	const s = "gate-1"
	var b builder
	b.start(s)
	job := b.request(s, "summary", 1)
	a := artifact(s, "summary", 1, "summary.json", `{}`)
	b.jobCompleted(s, "summary", job, "w1", 1, a)
	b.passed(s, "summary", job, 1, a)
	until := t0.Add(time.Hour)
	b.add(s, schemas.TypeApprovalRequested, "summary", job, &schemas.ApprovalRequested{Step: "summary", JobID: job, Iteration: 1,
		Artifacts: []schemas.ArtifactRef{a}, Until: &until, OnTimeout: schemas.OnTimeoutReject})
	m := BuildManifest(s, b.evs)
	sv := m.Steps["summary"]
	if sv.Status != StepStatusAwaitingApproval || sv.Approval == nil || sv.Approval.JobID != job || !sv.Approval.Until.Equal(until) ||
		sv.Approval.OnTimeout != schemas.OnTimeoutReject {
		t.Fatalf("step %+v approval %+v, want awaiting_approval until %s", sv, sv.Approval, until)
	}
	// Who rejected, and why, is in the manifest's signals.
	b.add(s, schemas.TypeSignalReject, "summary", "", &schemas.Signal{Target: s + "/summary", Step: "summary", Reason: "too long", By: "bob"})
	m = BuildManifest(s, b.evs)
	if n := len(m.Signals); n != 1 || m.Signals[0].Signal != "reject" || m.Signals[0].By != "bob" || m.Signals[0].Reason != "too long" {
		t.Fatalf("signals %+v, want bob's reject with its reason", m.Signals)
	}
	// Once the orchestrator applied it, the step no longer awaits approval,
	// even before its next iteration is requested (a paused session).
	b.add(s, schemas.TypeSignalAcknowledged, "summary", "", &schemas.SignalAcknowledged{SignalID: m.Signals[0].ID, Signal: "reject", Step: "summary", Result: schemas.SignalApplied})
	m = BuildManifest(s, b.evs)
	if sv := m.Steps["summary"]; sv.Status == StepStatusAwaitingApproval || sv.Approval != nil {
		t.Fatalf("after an applied reject: %s, approval %+v", sv.Status, sv.Approval)
	}
	// Rejected: the next iteration runs.
	b.request(s, "summary", 2, schemas.Feedback{Iteration: 1, Kind: schemas.FeedbackRejected, Message: "too long"})
	m = BuildManifest(s, b.evs)
	if sv := m.Steps["summary"]; sv.Status != StepStatusInProgress || sv.Approval != nil {
		t.Fatalf("after the next request: %s, approval %+v", sv.Status, sv.Approval)
	}
}

// A loop waiting at its level's gate shows awaiting_approval in the
// manifest (status, watch and the dashboard's loop tree read it), and so
// does the loop once approved and completed no longer.
func TestFoldLoopApproval(t *testing.T) {
	b := loopsBuilder{&builder{}}
	in := inputRef(sessionID)
	p := loopsPipeline()
	p.Loops.Levels[0].Approval = &schemas.Approval{}
	b.add(sessionID, schemas.TypeSessionStarted, "", "", &schemas.SessionStarted{Pipeline: p, Input: in, SourceHash: shortHash(in.Digest),
		Loops: &schemas.LoopsStart{Task: "Add a cache", Base: "main", BaseCommit: baseCommit, Target: loopTarget}})
	b.spawn("plan", "", "plan", 0, 0, "Add a cache")
	job := b.request("plan", 1, 0, "")
	plan := artifact(sessionID, "plan", 1, "plan.md", "## Cache layer\n")
	b.done("plan", job, 1, nil, true, plan)
	b.add(sessionID, schemas.TypeApprovalRequested, "plan", job, &schemas.ApprovalRequested{Step: "plan", JobID: job, Iteration: 1, Artifacts: []schemas.ArtifactRef{plan}})
	m := BuildManifest(sessionID, b.evs)
	if sv := m.Steps["plan"]; sv == nil || sv.Status != StepStatusAwaitingApproval || sv.Approval == nil {
		t.Fatalf("loop plan: %+v, want awaiting_approval", sv)
	}
	sig := b.signal(sessionID, "approve", "plan", "", "")
	b.ack(sessionID, sig, "approve", "plan", schemas.SignalApplied, "loop plan approved")
	b.stepCompleted(sessionID, "plan", job, 1, "", plan)
	m = BuildManifest(sessionID, b.evs)
	if sv := m.Steps["plan"]; sv.Status != StepStatusCompleted || sv.Approval != nil {
		t.Fatalf("loop plan after approval: %s, approval %+v", sv.Status, sv.Approval)
	}
}
