package orchestrator

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/loopbus/loopbus/backlog"
	"github.com/loopbus/loopbus/schemas"
)

// The specification of backlog sessions: a simulated world (workers and a
// validator that checks each output against its declared schema, as the
// real one does) answers every job the decider requests, and the table
// compares the decisions that matter, one line each.

func backlogPipeline(maxParallel int, schedule string, iterate ...string) schemas.Pipeline {
	if len(iterate) == 0 {
		iterate = []string{"a"}
	}
	return schemas.Pipeline{Name: "demo", Kind: schemas.KindBacklog, Budget: &schemas.Budget{MaxIterations: 40}, Backlog: &schemas.Backlog{
		Agents:   map[string]schemas.AgentSpec{"a": agent("a.sh"), "b": agent("b.sh")},
		Roles:    map[string][]string{schemas.RoleIterate: iterate},
		Schedule: schedule, MaxParallel: maxParallel, MaxSummaryIterations: 2, TimeoutMs: 60_000,
	}}
}

func backlogStarted(p schemas.Pipeline, start *schemas.BacklogStart) schemas.Event {
	ev := started(p)
	ev.Data.(*schemas.SessionStarted).Backlog = start
	return ev
}

func task(id string, prio int, status string, deps ...string) schemas.Task {
	return schemas.Task{ID: id, Title: "task " + id, Priority: prio, Status: status, DependsOn: deps}
}

// agentResult is what the simulated agent does for one job: report is the
// content of its one output (nil: the job fails).
type agentScript func(jr *schemas.JobRequested, run int) any

// doneAll marks every task done, reviews add nothing, bootstrap and repair
// write files of the given tasks.
func doneAll(files ...[]schemas.Task) agentScript {
	return func(jr *schemas.JobRequested, run int) any {
		switch jr.Step {
		case schemas.PhaseBootstrap, schemas.PhaseRepair:
			return string(backlog.Format(&backlog.File{SchemaVersion: 1, Tasks: files[0]}))
		case schemas.PhaseReview:
			return backlog.Summary{TaskID: "review", Status: "done", Summary: "all covered"}
		}
		return backlog.Summary{TaskID: jr.Step, Status: "done", Summary: "did " + jr.Step}
	}
}

type simResult struct {
	lines       []string
	maxInFlight int
	prompts     map[string]string
	// state is the state the session ends in.
	state *State
	// events are every event applied, in order.
	events []schemas.Event
}

// simulate runs a session to its end (or 200 events) with script as every
// agent, returning the decisions as lines. An approval gate reached
// (approval.requested of job J) is answered by during[0]["gate J"].
func simulate(t *testing.T, start schemas.Event, script agentScript, during ...map[string][]schemas.Event) simResult {
	t.Helper()
	st := NewState()
	queue := []schemas.Event{start}
	res := simResult{prompts: map[string]string{}}
	inFlight := 0
	runs := map[string]int{}
	seq := uint64(0)
	apply := func(ev schemas.Event) {
		seq++
		ev.Seq = seq
		if err := Check(st, ev); err != nil {
			t.Fatalf("event %s: %v", ev.Type, err)
		}
		Evolve(st, ev)
		res.events = append(res.events, ev)
		if _, ok := ev.Data.(*schemas.Verdict); ok {
			inFlight--
		}
	}
	// As the service does: a decision's batch is folded before the next
	// decision; the simulated workers answer jobs later, in order.
	for n := 0; len(queue) > 0 && n < 400; n++ {
		trigger := queue[0]
		queue = queue[1:]
		apply(trigger)
		for out := written(Decide(st, trigger, fixedNow)); len(out) > 0; out = written(Decide(st, trigger, fixedNow)) {
			for _, o := range out {
				if l := simLine(o); l != "" {
					res.lines = append(res.lines, l)
				}
				apply(o)
				if jr, ok := o.Data.(*schemas.JobRequested); ok {
					inFlight++
					res.maxInFlight = max(res.maxInFlight, inFlight)
					res.prompts[jr.JobID] = jr.Prompt
					runs[jr.Step]++
					if len(during) > 0 {
						// Events of other writers (the CLI) while the job runs.
						queue = append(queue, during[0][jr.JobID]...)
					}
					// As the worker does before the verdict: the output stored,
					// then the result naming it.
					out := art(jr.Step, jr.Outputs[0].Name)
					queue = append(queue,
						schemas.Event{ID: "stored-" + jr.JobID, Type: schemas.TypeArtifactStored, Session: sess, Step: jr.Step, Job: jr.JobID,
							Data: &schemas.ArtifactStored{JobID: jr.JobID, Artifact: out}},
						schemas.Event{ID: "done-" + jr.JobID, Type: schemas.TypeJobCompleted, Session: sess, Step: jr.Step, Job: jr.JobID,
							Data: &schemas.JobCompleted{JobID: jr.JobID, Step: jr.Step, Iteration: jr.Iteration, Worker: "w", Artifacts: []schemas.ArtifactRef{out}}},
						simVerdict(t, jr, script(jr, runs[jr.Step])))
				}
				if ar, ok := o.Data.(*schemas.ApprovalRequested); ok && len(during) > 0 {
					queue = append(queue, during[0]["gate "+ar.JobID]...)
				}
			}
			trigger = out[len(out)-1]
		}
	}
	res.state = st
	return res
}

// simVerdict is the validator's verdict on an agent's report: checked
// against the declared schema, carried when it passes.
func simVerdict(t *testing.T, jr *schemas.JobRequested, report any) schemas.Event {
	t.Helper()
	out := jr.Outputs[0]
	raw, err := json.Marshal(report)
	if err != nil {
		t.Fatal(err)
	}
	if s, ok := report.(string); ok {
		raw = []byte(s)
	}
	sch, err := schemas.CompileArtifactSchema(out.Name, out.Schema)
	if err != nil {
		t.Fatalf("schema of %s: %v", out.Name, err)
	}
	v := &schemas.Verdict{JobID: jr.JobID, Step: jr.Step, Iteration: jr.Iteration,
		Artifacts: []schemas.ArtifactRef{art(jr.Step, out.Name)}, Errors: sch.Validate(out.Name, raw)}
	typ := schemas.TypeValidationFailed
	if len(v.Errors) == 0 {
		typ = schemas.TypeValidationPassed
		v.Reports = []schemas.Report{{Name: out.Name, Content: raw}}
	} else {
		v.RetryHint = "fix it"
	}
	return schemas.Event{ID: "verdict-" + jr.JobID, Type: typ, Session: sess, Step: jr.Step, Job: jr.JobID, Data: v}
}

func simLine(ev schemas.Event) string {
	typ := strings.TrimPrefix(ev.Type, "loopbus.")
	switch d := ev.Data.(type) {
	case *schemas.TaskSelected:
		return fmt.Sprintf("%s %s run %d by %s", typ, d.ID, d.Run, d.Agent)
	case *schemas.TaskAdded:
		return fmt.Sprintf("%s %s [%s] by %s", typ, d.Task.ID, d.Task.Status, d.By)
	case *schemas.TaskUpdated:
		s := fmt.Sprintf("%s %s %s", typ, d.ID, d.Status)
		if d.Blockers != nil {
			s += fmt.Sprintf(" blockers=%q", *d.Blockers)
		}
		return s
	case *schemas.BacklogPhase:
		return typ + " " + d.Phase
	case *schemas.JobRequested:
		s := typ + " " + d.JobID
		if len(d.Feedback) > 0 {
			s += fmt.Sprintf(" feedback=%d", len(d.Feedback))
		}
		return s
	case *schemas.SessionCompleted, *schemas.SessionFailed, *schemas.SessionStopped:
		return line(ev)
	case *schemas.StepFailed:
		return line(ev)
	case *schemas.ApprovalRequested, *schemas.ApprovalExpired:
		return approvalLine(ev)
	case *schemas.SignalAcknowledged:
		if d.Signal == "approve" || d.Signal == "reject" {
			return line(ev)
		}
	}
	return ""
}

func TestBacklogDecisions(t *testing.T) {
	imported := func(tasks ...schemas.Task) *schemas.BacklogStart { return &schemas.BacklogStart{Tasks: tasks} }
	tests := []struct {
		name        string
		pipeline    schemas.Pipeline
		start       *schemas.BacklogStart
		script      agentScript
		want        []string
		maxInFlight int
		during      map[string][]schemas.Event
	}{
		{
			name:     "dependency and priority order",
			pipeline: backlogPipeline(1, ""),
			// T2 has the highest priority but waits for T3; T4 is done.
			start:  imported(task("T1", 2, "todo"), task("T2", 1, "todo", "T3"), task("T3", 3, "todo"), task("T4", 1, "done")),
			script: doneAll(),
			want: []string{
				"task.added T1 [todo] by import", "task.added T2 [todo] by import", "task.added T3 [todo] by import", "task.added T4 [done] by import",
				"backlog.phase iterate",
				"task.selected T1 run 1 by a", "job.requested s1.T1.1",
				"task.updated T1 done", "task.selected T3 run 1 by a", "job.requested s1.T3.1",
				"task.updated T3 done", "task.selected T2 run 1 by a", "job.requested s1.T2.1",
				"task.updated T2 done", "backlog.phase review", "job.requested s1.review.1",
				"backlog.phase done", "session.completed",
			},
			maxInFlight: 1,
		},
		{
			name:     "doing first, then blocked after progress",
			pipeline: backlogPipeline(1, ""),
			start:    imported(task("T1", 1, "todo"), task("T2", 0, "doing"), task("T3", 1, "blocked")),
			script:   doneAll(),
			want: []string{
				"task.added T1 [todo] by import", "task.added T2 [doing] by import", "task.added T3 [blocked] by import",
				"backlog.phase iterate",
				"task.selected T2 run 1 by a", "job.requested s1.T2.1",
				"task.updated T2 done", "task.selected T1 run 1 by a", "job.requested s1.T1.1",
				"task.updated T1 done", "task.selected T3 run 1 by a", "job.requested s1.T3.1",
				"task.updated T3 done", "backlog.phase review", "job.requested s1.review.1",
				"backlog.phase done", "session.completed",
			},
			maxInFlight: 1,
		},
		{
			name:     "an agent adds a task that runs first",
			pipeline: backlogPipeline(1, ""),
			start:    imported(task("T001", 2, "todo"), task("T002", 3, "todo")),
			script: func(jr *schemas.JobRequested, run int) any {
				if jr.Step == "T001" {
					return `{"task_id": "T001", "status": "done", "summary": "found more", "new_tasks": [{"title": "urgent", "priority": 1}]}`
				}
				return doneAll()(jr, run)
			},
			want: []string{
				"task.added T001 [todo] by import", "task.added T002 [todo] by import", "backlog.phase iterate",
				"task.selected T001 run 1 by a", "job.requested s1.T001.1",
				"task.updated T001 done", "task.added T003 [todo] by s1.T001.1", "task.selected T003 run 1 by a", "job.requested s1.T003.1",
				"task.updated T003 done", "task.selected T002 run 1 by a", "job.requested s1.T002.1",
				"task.updated T002 done", "backlog.phase review", "job.requested s1.review.1",
				"backlog.phase done", "session.completed",
			},
			maxInFlight: 1,
		},
		{
			name:     "bootstrap from an empty backlog",
			pipeline: backlogPipeline(1, ""),
			script:   doneAll([]schemas.Task{task("T1", 1, "todo"), task("T2", 1, "todo", "T1")}),
			want: []string{
				"backlog.phase bootstrap", "job.requested s1.bootstrap.1",
				"task.added T1 [todo] by s1.bootstrap.1", "task.added T2 [todo] by s1.bootstrap.1", "backlog.phase iterate",
				"task.selected T1 run 1 by a", "job.requested s1.T1.1",
				"task.updated T1 done", "task.selected T2 run 1 by a", "job.requested s1.T2.1",
				"task.updated T2 done", "backlog.phase review", "job.requested s1.review.1",
				"backlog.phase done", "session.completed",
			},
			maxInFlight: 1,
		},
		{
			name:     "repair: a fixed file with a cycle is fed back, the next is accepted",
			pipeline: backlogPipeline(1, ""),
			start:    &schemas.BacklogStart{ImportErrors: []schemas.ValidationError{{Artifact: "to-do.json", Pointer: "/tasks/0/status", Message: "bad"}}},
			script: func(jr *schemas.JobRequested, run int) any {
				if jr.Step == schemas.PhaseRepair && run == 1 {
					return string(backlog.Format(&backlog.File{SchemaVersion: 1, Tasks: []schemas.Task{task("T1", 1, "todo", "T2"), task("T2", 1, "todo", "T1")}}))
				}
				return doneAll([]schemas.Task{task("T1", 1, "todo")})(jr, run)
			},
			want: []string{
				"backlog.phase repair", "job.requested s1.repair.1",
				"job.requested s1.repair.2 feedback=1",
				"task.added T1 [todo] by s1.repair.2", "backlog.phase iterate",
				"task.selected T1 run 1 by a", "job.requested s1.T1.1",
				"task.updated T1 done", "backlog.phase review", "job.requested s1.review.1",
				"backlog.phase done", "session.completed",
			},
			maxInFlight: 1,
		},
		{
			name:     "a review pass adds a task, the next review agrees",
			pipeline: backlogPipeline(1, ""),
			start:    imported(task("T1", 1, "todo")),
			script: func(jr *schemas.JobRequested, run int) any {
				if jr.Step == schemas.PhaseReview && run == 1 {
					return `{"task_id": "review", "status": "done", "summary": "docs missing", "new_tasks": [{"id": "T9", "title": "write docs", "priority": 1, "depends_on": ["T1"]}]}`
				}
				return doneAll()(jr, run)
			},
			want: []string{
				"task.added T1 [todo] by import", "backlog.phase iterate",
				"task.selected T1 run 1 by a", "job.requested s1.T1.1",
				"task.updated T1 done", "backlog.phase review", "job.requested s1.review.1",
				"task.added T9 [todo] by s1.review.1", "backlog.phase iterate", "task.selected T9 run 1 by a", "job.requested s1.T9.1",
				"task.updated T9 done", "backlog.phase review", "job.requested s1.review.1.r1",
				"backlog.phase done", "session.completed",
			},
			maxInFlight: 1,
		},
		{
			name:     "two independent tasks at once, the dependent one after",
			pipeline: backlogPipeline(2, schemas.ScheduleOddEven, "a", "b"),
			start:    imported(task("T1", 1, "todo"), task("T2", 1, "todo"), task("T3", 1, "todo", "T1", "T2")),
			script:   doneAll(),
			want: []string{
				"task.added T1 [todo] by import", "task.added T2 [todo] by import", "task.added T3 [todo] by import", "backlog.phase iterate",
				"task.selected T1 run 1 by a", "task.selected T2 run 1 by b", "job.requested s1.T1.1", "job.requested s1.T2.1",
				"task.updated T1 done",
				"task.updated T2 done", "task.selected T3 run 1 by a", "job.requested s1.T3.1",
				"task.updated T3 done", "backlog.phase review", "job.requested s1.review.1",
				"backlog.phase done", "session.completed",
			},
			maxInFlight: 2,
		},
		{
			name:     "a bad summary is fed back; a task without a valid one is blocked and the backlog goes on",
			pipeline: backlogPipeline(1, ""),
			start:    imported(task("T1", 1, "todo"), task("T2", 2, "todo")),
			script: func(jr *schemas.JobRequested, run int) any {
				switch {
				case jr.Step == "T1" && run == 1:
					return `{"task_id": "T2", "status": "done", "summary": "wrong task"}`
				case jr.Step == "T1":
					return `{"task_id": "T1", "status": "done", "summary": "x", "new_tasks": [{"title": "y", "depends_on": ["T404"]}]}`
				}
				return doneAll()(jr, run)
			},
			want: []string{
				"task.added T1 [todo] by import", "task.added T2 [todo] by import", "backlog.phase iterate",
				"task.selected T1 run 1 by a", "job.requested s1.T1.1",
				"job.requested s1.T1.2 feedback=1",
				"task.updated T1 blocked blockers=[\"no valid output after 2 of 2 iterations; last error: summary.json /new_tasks/0/depends_on/0: task T003 depends on T404, which does not exist\"]",
				"step.failed T1: no valid output after 2 of 2 iterations; last error: summary.json /new_tasks/0/depends_on/0: task T003 depends on T404, which does not exist",
				"task.selected T2 run 1 by a", "job.requested s1.T2.1",
				// T2 done is progress: the blocked T1 is tried again.
				"task.updated T2 done", "task.selected T1 run 2 by a", "job.requested s1.T1.1.r1",
				"job.requested s1.T1.2.r1 feedback=1",
				"task.updated T1 blocked blockers=[\"no valid output after 2 of 2 iterations; last error: summary.json /new_tasks/0/depends_on/0: task T003 depends on T404, which does not exist\"]",
				"step.failed T1: no valid output after 2 of 2 iterations; last error: summary.json /new_tasks/0/depends_on/0: task T003 depends on T404, which does not exist",
				"backlog.phase review", "job.requested s1.review.1",
				"backlog.phase done", "session.completed",
			},
			maxInFlight: 1,
		},
		{
			name:     "an agent that stays blocked is not retried without progress",
			pipeline: backlogPipeline(1, schemas.ScheduleRoundRobin, "a", "b"),
			start:    imported(task("T1", 1, "todo"), task("T2", 1, "todo")),
			script: func(jr *schemas.JobRequested, run int) any {
				if jr.Step == "T1" {
					return backlog.Summary{TaskID: "T1", Status: "blocked", Summary: "needs a key", Blockers: []string{"no API key"}}
				}
				return doneAll()(jr, run)
			},
			want: []string{
				"task.added T1 [todo] by import", "task.added T2 [todo] by import", "backlog.phase iterate",
				"task.selected T1 run 1 by a", "job.requested s1.T1.1",
				"task.updated T1 blocked blockers=[\"no API key\"]", "task.selected T2 run 1 by b", "job.requested s1.T2.1",
				"task.updated T2 done", "task.selected T1 run 2 by a", "job.requested s1.T1.1.r1",
				"task.updated T1 blocked blockers=[\"no API key\"]", "backlog.phase review", "job.requested s1.review.1",
				"backlog.phase done", "session.completed",
			},
			maxInFlight: 1,
		},
		{
			name:     "a task added by hand while the review runs is run before done",
			pipeline: backlogPipeline(1, ""),
			start:    imported(task("T1", 1, "todo")),
			script:   doneAll(),
			during: map[string][]schemas.Event{"s1.review.1": {{ID: "cli-add", Type: schemas.TypeTaskAdded, Session: sess,
				Data: &schemas.TaskAdded{Task: task("T2", 1, "todo", "T1"), By: "cli"}}}},
			want: []string{
				"task.added T1 [todo] by import", "backlog.phase iterate",
				"task.selected T1 run 1 by a", "job.requested s1.T1.1",
				"task.updated T1 done", "backlog.phase review", "job.requested s1.review.1",
				"backlog.phase iterate", "task.selected T2 run 1 by a", "job.requested s1.T2.1",
				"task.updated T2 done", "backlog.phase review", "job.requested s1.review.1.r1",
				"backlog.phase done", "session.completed",
			},
			maxInFlight: 1,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			res := simulate(t, backlogStarted(tc.pipeline, tc.start), tc.script, tc.during)
			if strings.Join(res.lines, "\n") != strings.Join(tc.want, "\n") {
				t.Errorf("got:\n  %s\nwant:\n  %s", strings.Join(res.lines, "\n  "), strings.Join(tc.want, "\n  "))
			}
			if res.maxInFlight != tc.maxInFlight {
				t.Errorf("at most %d jobs in flight, want %d", res.maxInFlight, tc.maxInFlight)
			}
		})
	}
}
