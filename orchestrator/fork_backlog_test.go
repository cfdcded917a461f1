package orchestrator

import (
	"errors"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/loopbus/loopbus/schemas"
)

// The specification of forking a backlog session: the task list, phase
// and runs are the origin's at the fork point; runs that had finished are
// kept, runs that had not run again in jobs of the fork (given events →
// then events).

// threeTasksRun is a backlog of three imported tasks, run one at a time to
// its end.
func threeTasksRun(t *testing.T) []schemas.Event {
	t.Helper()
	start := backlogStarted(backlogPipeline(1, ""), &schemas.BacklogStart{Tasks: []schemas.Task{task("T1", 1, "todo"), task("T2", 2, "todo"), task("T3", 3, "todo")}})
	res := simulate(t, start, doneAll())
	if last := res.events[len(res.events)-1]; last.Type != schemas.TypeSessionCompleted {
		t.Fatalf("the origin ended with %s", last.Type)
	}
	return res.events
}

// withPrompt is backlogPipeline(1, "") with a prompt of its own for role.
func withPrompt(role string) schemas.Pipeline {
	p := backlogPipeline(1, "")
	b := *p.Backlog
	b.Prompts = map[string]string{role: "Do it well: {{.Role}}"}
	p.Backlog = &b
	return p
}

// forkBacklog is stream.fork with a backlog pipeline (the origin's when
// nil) and the changed roles as loopbus fork computes them.
func (s *stream) forkBacklog(t *testing.T, point string, p *schemas.Pipeline) []schemas.Event {
	t.Helper()
	evs := s.fork(t, sess, point, forkSess, schemas.Pipeline{})
	d := evs[len(evs)-1].Data.(*schemas.SessionForked)
	if p != nil {
		d.Changed = schemas.ChangedRoles(d.Pipeline, *p, nil, nil, false)
		d.Pipeline = *p
	}
	return evs
}

func TestDecideForkBacklog(t *testing.T) {
	done := threeTasksRun(t)
	t1Done := after(t, done, schemas.TypeStepCompleted, "T1", false)
	t2Asked := after(t, done, schemas.TypeJobRequested, "T2", false)
	reviewAsked := after(t, done, schemas.TypeJobRequested, schemas.PhaseReview, false)
	beforeT1Done := beforeDecision(t, done, t1Done)
	for _, tc := range []struct {
		name     string
		point    string
		pipeline *schemas.Pipeline
		// want are the fork's first decisions; tasks its task list
		// (id:status) and steps its runs (name:status).
		want         []string
		tasks, steps string
	}{
		{"after T1 completed: T1 is kept, the next task is selected", t1Done, nil,
			[]string{"task.selected T2 run 1 by a", "job.requested f1.T2.1"},
			"T1:done T2:todo T3:todo", "T1:completed"},
		{"while T2's job was in flight: T2 runs again in a job of the fork", t2Asked, nil,
			[]string{"job.requested f1.T2.1"},
			"T1:done T2:doing T3:todo", "T1:completed T2:pending"},
		{"while T2's job was in flight, the review role changed: the same, and the review will run with it", t2Asked, ptr(withPrompt(schemas.RoleReview)),
			[]string{"job.requested f1.T2.1"},
			"T1:done T2:doing T3:todo", "T1:completed T2:pending"},
		{"before the decision that completed T1 (where loopbus fork moves a point after it), the iterate role changed: T1 runs again with it", beforeT1Done, ptr(withPrompt(schemas.RoleIterate)),
			[]string{"job.requested f1.T1.1"},
			"T1:doing T2:todo T3:todo", "T1:pending"},
		{"while the review ran, its role changed: it runs again with the new prompt; the tasks are kept", reviewAsked, ptr(withPrompt(schemas.RoleReview)),
			[]string{"job.requested f1.review.1"},
			"T1:done T2:done T3:done", "T1:completed T2:completed T3:completed review:pending"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := (&stream{}).add(done...)
			s.add(s.forkBacklog(t, tc.point, tc.pipeline)...)
			st, refused := foldStream(t, s)
			if len(refused) > 0 {
				t.Fatalf("refused: %v", refused)
			}
			f := st.Sessions[forkSess]
			if f == nil || f.Backlog == nil {
				t.Fatalf("fork %+v", f)
			}
			var tasks, steps []string
			for _, tk := range f.Backlog.Tasks.Sorted() {
				tasks = append(tasks, tk.ID+":"+tk.Status)
			}
			for _, name := range slices.Sorted(maps.Keys(f.Steps)) {
				steps = append(steps, name+":"+f.Steps[name].Status)
			}
			if got := strings.Join(tasks, " "); got != tc.tasks {
				t.Errorf("tasks %s, want %s", got, tc.tasks)
			}
			if got := strings.Join(steps, " "); got != tc.steps {
				t.Errorf("runs %s, want %s", got, tc.steps)
			}
			var lines []string
			for _, ev := range Decide(st, s.evs[len(s.evs)-1], fixedNow) {
				if ev.Session != forkSess {
					t.Errorf("%s of session %s; want the fork's", ev.Type, ev.Session)
				}
				if l := simLine(ev); l != "" {
					lines = append(lines, l)
				}
				if jr, ok := ev.Data.(*schemas.JobRequested); ok && tc.pipeline != nil && tc.pipeline.Backlog.Prompts[roleOf(jr.Step)] != "" && !strings.HasPrefix(jr.Prompt, "Do it well: "+roleOf(jr.Step)) {
					t.Errorf("%s runs %q, want the fork's prompt", jr.Step, jr.Prompt)
				}
			}
			if strings.Join(lines, "\n") != strings.Join(tc.want, "\n") {
				t.Errorf("got:\n  %s\nwant:\n  %s", strings.Join(lines, "\n  "), strings.Join(tc.want, "\n  "))
			}
		})
	}
}

func TestCheckForkBacklog(t *testing.T) {
	done := threeTasksRun(t)
	t1Done := after(t, done, schemas.TypeStepCompleted, "T1", false)
	repo := backlogPipeline(1, "")
	rb := *repo.Backlog
	rb.Workdir = schemas.WorkdirRepo
	repo.Backlog = &rb
	for _, tc := range []struct {
		name     string
		point    string
		pipeline *schemas.Pipeline
		reason   string
	}{
		{"at its end", done[len(done)-1].ID, nil, "it had ended at the fork point (completed): fork it at an event before its end"},
		{"the iterate role changed after a task run completed", t1Done, ptr(withPrompt(schemas.RoleIterate)),
			"role iterate changed, and runs of it had completed at the fork point (T1): their changes are in the task list the fork keeps"},
		{"a file with workdir: repo, of an origin on no repository", t1Done, ptr(repo), "the fork's file has workdir: repo, and the origin works on no repository: a fork keeps its origin's workdir"},
		{"into loops", t1Done, ptr(treePipeline()), "forks backlog session s1 into a loops session: a fork keeps its origin's kind"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := (&stream{}).add(done...)
			s.add(s.forkBacklog(t, tc.point, tc.pipeline)...)
			st, refused := foldStream(t, s)
			if err := refused["forked-"+forkSess]; !errors.Is(err, ErrInconsistent) || !strings.Contains(err.Error(), tc.reason) {
				t.Errorf("Check = %v, want %q", err, tc.reason)
			}
			if st.Sessions[forkSess] != nil {
				t.Errorf("the refused fork started")
			}
		})
	}
}

// TestChangedRoles: what a fork with another backlog file runs with
// another definition.
func TestChangedRoles(t *testing.T) {
	old := backlogPipeline(1, "")
	other := func(edit func(b *schemas.Backlog)) schemas.Pipeline {
		p := backlogPipeline(1, "")
		b := *p.Backlog
		b.Agents, b.Roles = maps.Clone(b.Agents), maps.Clone(b.Roles)
		edit(&b)
		p.Backlog = &b
		return p
	}
	all := "bootstrap iterate repair review"
	for _, tc := range []struct {
		name  string
		next  schemas.Pipeline
		input bool
		want  string
	}{
		{"same", old, false, ""},
		{"the review prompt", withPrompt(schemas.RoleReview), false, "review"},
		{"the iterate agent's command (every role runs it)", other(func(b *schemas.Backlog) { b.Agents["a"] = agent("a2.sh") }), false, all},
		{"a review agent of its own", other(func(b *schemas.Backlog) { b.Roles[schemas.RoleReview] = []string{"b"} }), false, "review"},
		{"an unused agent", other(func(b *schemas.Backlog) { b.Agents["b"] = agent("b2.sh") }), false, ""},
		{"a bound every role shares", other(func(b *schemas.Backlog) { b.TimeoutMs = 1 }), false, all},
		{"the input", old, true, all},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := strings.Join(schemas.ChangedRoles(old, tc.next, nil, nil, tc.input), " "); got != tc.want {
				t.Errorf("ChangedRoles = %q, want %q", got, tc.want)
			}
		})
	}
}
