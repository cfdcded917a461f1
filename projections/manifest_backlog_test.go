package projections

import (
	"testing"

	"github.com/loopbus/loopbus/schemas"
)

// backlogRuns is a backlog session: T1 runs twice (blocked, then done after
// T2), then the review; each run is a step of the manifest.
func backlogRuns() []schemas.Event {
	b := &builder{}
	in := inputRef(sessionID)
	b.add(sessionID, schemas.TypeSessionStarted, "", "", &schemas.SessionStarted{
		Pipeline: schemas.Pipeline{Name: "demo", Kind: schemas.KindBacklog, Backlog: &schemas.Backlog{
			Agents: map[string]schemas.AgentSpec{"a": agentSpec("a")}, Roles: map[string][]string{"iterate": {"a"}},
			Schedule: "single", MaxParallel: 1, MaxSummaryIterations: 2, TimeoutMs: 60000,
		}},
		Input: in, SourceHash: shortHash(in.Digest),
		Backlog: &schemas.BacklogStart{Tasks: []schemas.Task{{ID: "T1", Title: "one", Status: "todo"}, {ID: "T2", Title: "two", Status: "todo"}}},
	})
	for _, id := range []string{"T1", "T2"} {
		b.add(sessionID, schemas.TypeTaskAdded, "", "", &schemas.TaskAdded{Task: schemas.Task{ID: id, Title: id, Status: "todo"}, By: "import"})
	}
	b.add(sessionID, schemas.TypeBacklogPhase, "", "", &schemas.BacklogPhase{Phase: "iterate", Reason: "imported 2 task(s)"})
	run := func(step, job string, iteration int, status string) {
		b.add(sessionID, schemas.TypeJobRequested, step, job, &schemas.JobRequested{JobID: job, Step: step, Iteration: iteration, Attempt: 1, Agent: agentSpec("a"), Prompt: "p", Inputs: []schemas.ArtifactRef{in}, TimeoutMs: 60000})
		b.jobStarted(sessionID, step, job, "w1")
		arts := []schemas.ArtifactRef{artifact(sessionID, step, iteration, "summary.json", step+job)}
		b.jobCompleted(sessionID, step, job, "w1", iteration, arts...)
		b.passed(sessionID, step, job, iteration, arts...)
		if status != "" {
			blockers := []string{}
			if status == "blocked" {
				blockers = []string{"needs T2"}
			}
			b.add(sessionID, schemas.TypeTaskUpdated, step, "", &schemas.TaskUpdated{ID: step, Status: status, Blockers: &blockers, By: job})
		}
		b.stepCompleted(sessionID, step, job, iteration, "task-summary/1", arts...)
	}
	b.add(sessionID, schemas.TypeTaskSelected, "T1", "", &schemas.TaskSelected{ID: "T1", Run: 1, Agent: "a"})
	run("T1", sessionID+".T1.1", 1, "blocked")
	b.add(sessionID, schemas.TypeTaskSelected, "T2", "", &schemas.TaskSelected{ID: "T2", Run: 1, Agent: "a"})
	run("T2", sessionID+".T2.1", 1, "done")
	b.add(sessionID, schemas.TypeTaskSelected, "T1", "", &schemas.TaskSelected{ID: "T1", Run: 2, Agent: "a"})
	b.add(sessionID, schemas.TypeJobRequested, "T1", sessionID+".T1.1.r1", &schemas.JobRequested{JobID: sessionID + ".T1.1.r1", Step: "T1", Iteration: 1, Attempt: 1, Round: 1, Agent: agentSpec("a"), Prompt: "p", TimeoutMs: 60000})
	b.add(sessionID, schemas.TypeBacklogPhase, "", "", &schemas.BacklogPhase{Phase: "review", Reason: "no runnable task left"})
	b.add(sessionID, schemas.TypeHookCompleted, "", "", &schemas.HookRun{Hook: "h", EventID: "x", EventType: schemas.TypeTaskUpdated, EventSeq: 3, Runner: "hooks"})
	return b.evs
}

func TestBacklogManifestAddsRunsAsSteps(t *testing.T) {
	m := foldAll(backlogRuns())
	if m.Kind != schemas.KindBacklog || m.Phase != "review" {
		t.Errorf("kind %q phase %q, want backlog review", m.Kind, m.Phase)
	}
	if got, want := m.StepOrder, []string{"T1", "T2", "review"}; len(got) != len(want) || got[0] != want[0] || got[1] != want[1] || got[2] != want[2] {
		t.Errorf("steps %v, want %v", got, want)
	}
	tests := []struct {
		name, status string
		iterations   int
	}{
		{"T1", StepStatusInProgress, 1}, // its second run
		{"T2", StepStatusCompleted, 1},
		{"review", StepStatusPending, 0},
	}
	for _, tc := range tests {
		sv := m.Steps[tc.name]
		if sv == nil || sv.Status != tc.status || sv.Iterations != tc.iterations || sv.MaxIterations != 2 {
			t.Errorf("step %s: %+v, want status %s, iterations %d, max 2", tc.name, sv, tc.status, tc.iterations)
		}
	}
	if len(m.Jobs) != 3 {
		t.Errorf("%d jobs, want 3", len(m.Jobs))
	}
}
