package projections

import (
	"testing"

	"github.com/loopbus/loopbus/schemas"
)

// TestManifestRerun: a failed session rerun from its failed step is
// running again, that step and its dependents pending, the step before
// kept; the fold up to the failure still shows it failed; the rerun's
// jobs complete it.
func TestManifestRerun(t *testing.T) {
	evs := stepExhausted()
	failedAt := len(evs)
	b := builder{evs: evs, seq: evs[len(evs)-1].Seq}
	b.add(sessionID, schemas.TypeSessionRerun, "", "", &schemas.SessionRerun{Step: "ideas", Reason: "agent fixed"})
	m := foldAll(b.evs)
	if m.Status != StatusRunning || m.Terminal() || m.Error != "" || m.FailedStep != "" || m.Reruns != 1 || m.LastRerun == nil || m.LastRerun.Step != "ideas" {
		t.Fatalf("after the rerun: status %s, error %q, failed step %q, reruns %d, last %+v", m.Status, m.Error, m.FailedStep, m.Reruns, m.LastRerun)
	}
	if sv := m.Steps["summary"]; sv.Status != StepStatusCompleted || len(sv.Artifacts) == 0 {
		t.Errorf("summary: %s with %d artifacts, want completed, kept", sv.Status, len(sv.Artifacts))
	}
	for _, name := range []string{"ideas", "writing-kit"} {
		if sv := m.Steps[name]; sv.Status != StepStatusPending || sv.Iterations != 0 || sv.ErrorMessage != "" {
			t.Errorf("%s: %s, %d iterations, error %q; want pending from scratch", name, sv.Status, sv.Iterations, sv.ErrorMessage)
		}
	}
	// Replay: every earlier state stands.
	if old := foldAll(b.evs[:failedAt]); old.Status != StatusFailed || old.Steps["ideas"].Status != StepStatusFailed {
		t.Errorf("fold up to the failure: %s, ideas %s; want failed", old.Status, old.Steps["ideas"].Status)
	}
	// The rerun's jobs (a new round) complete the session.
	for _, step := range []string{"ideas", "writing-kit"} {
		job := b.requestRound(sessionID, step, 1, 1, nil)
		a := artifact(sessionID, step, 1, step+".json", ideasJSON)
		b.jobCompleted(sessionID, step, job, "worker-a", 1, a)
		b.passed(sessionID, step, job, 1, a)
		b.stepCompleted(sessionID, step, job, 1, "", a)
	}
	b.sessionCompleted(sessionID)
	if m = foldAll(b.evs); m.Status != StatusCompleted {
		t.Fatalf("after the rerun's jobs: %s, want completed", m.Status)
	}
	// A rerun of a running session changes nothing (the orchestrator
	// refuses it).
	running := builder{evs: append([]schemas.Event{}, b.evs[:failedAt+1]...), seq: b.evs[failedAt].Seq}
	running.add(sessionID, schemas.TypeSessionRerun, "", "", &schemas.SessionRerun{})
	if m = foldAll(running.evs); m.Status != StatusRunning || m.Reruns != 1 || m.Steps["summary"].Status != StepStatusCompleted {
		t.Errorf("a running session's rerun: %s, reruns %d, summary %s", m.Status, m.Reruns, m.Steps["summary"].Status)
	}
}
