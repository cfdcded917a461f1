package orchestrator

import (
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/loopbus/loopbus/schemas"
)

// The specification of forking a loops session: the fork's loop tree is
// the origin's at the fork point, where completed loops of unchanged
// levels keep their results and their subtrees, and the others run again
// with their subtrees dropped (given events → then events).

// treePipeline is plan → spec → note, two children each (headings), no
// worktree.
func treePipeline() schemas.Pipeline {
	level := func(name, out, child string) schemas.LoopLevel {
		lv := schemas.LoopLevel{Name: name, Agent: agent("a.sh"), Prompt: name + " it", Outputs: []schemas.Output{{Name: out, Report: true, ReportText: true}}, MaxIterations: 2}
		if child != "" {
			lv.Children = &schemas.LoopChildren{Level: child, From: out, Split: schemas.SplitHeadings}
		}
		return lv
	}
	return schemas.Pipeline{Name: "tree", Kind: schemas.KindLoops, Loops: &schemas.Loops{Levels: []schemas.LoopLevel{
		level("plan", "plan.md", "spec"), level("spec", "spec.md", "note"), level("note", "note.md", ""),
	}}}
}

// treeWith is treePipeline with another prompt for level name.
func treeWith(name string) schemas.Pipeline {
	p := treePipeline()
	p.Loops.Levels = slices.Clone(p.Loops.Levels)
	p.Loops.Levels[slices.IndexFunc(p.Loops.Levels, func(l schemas.LoopLevel) bool { return l.Name == name })].Prompt = "better " + name
	return p
}

// treeRun is the events of a treePipeline session run to its end.
func treeRun(t *testing.T, p schemas.Pipeline) []schemas.Event {
	t.Helper()
	start := started(p)
	start.Data.(*schemas.SessionStarted).Loops = &schemas.LoopsStart{Task: "Write a tree"}
	var evs []schemas.Event
	runLoops(t, start, loopWorld{agent: twoSections, record: func(ev schemas.Event) { evs = append(evs, ev) }})
	if last := evs[len(evs)-1]; last.Type != schemas.TypeSessionCompleted {
		t.Fatalf("the origin ended with %s", last.Type)
	}
	return evs
}

// forkLoops is stream.fork with a loops pipeline (the origin's when nil)
// and the changed levels as loopbus fork computes them.
func (s *stream) forkLoops(t *testing.T, point string, p *schemas.Pipeline) []schemas.Event {
	t.Helper()
	evs := s.fork(t, sess, point, forkSess, schemas.Pipeline{})
	d := evs[len(evs)-1].Data.(*schemas.SessionForked)
	if p != nil {
		d.Changed = schemas.ChangedLevels(d.Pipeline, *p, nil, nil, false)
		d.Pipeline = *p
	}
	return evs
}

// after is the id of the first event of typ for step in evs (the last
// one when last is set).
func after(t *testing.T, evs []schemas.Event, typ, step string, last bool) string {
	t.Helper()
	id := ""
	for _, ev := range evs {
		if ev.Type == typ && ev.Step == step {
			id = ev.ID
			if !last {
				break
			}
		}
	}
	if id == "" {
		t.Fatalf("no %s of %s", typ, step)
	}
	return id
}

// beforeDecision is the id of the last event before the decision that
// holds the event with id (its events are in a row, caused by its
// trigger): where loopbus fork moves a point back to.
func beforeDecision(t *testing.T, evs []schemas.Event, id string) string {
	t.Helper()
	i := slices.IndexFunc(evs, func(ev schemas.Event) bool { return ev.ID == id })
	if i < 0 {
		t.Fatalf("no event %s", id)
	}
	for ev := evs[i]; i > 0 && evs[i-1].Causation == ev.Causation && evs[i-1].Correlation == ev.Correlation; {
		i--
	}
	if i == 0 {
		t.Fatalf("no event before the decision of %s", id)
	}
	return evs[i-1].ID
}

func TestDecideForkLoops(t *testing.T) {
	done := treeRun(t, treePipeline())
	planDone := after(t, done, schemas.TypeStepCompleted, "plan", false)
	specDone := after(t, done, schemas.TypeStepCompleted, "plan-001", false)
	lastNote := after(t, done, schemas.TypeStepCompleted, "plan-002-002", false)
	for _, tc := range []struct {
		name     string
		point    string
		pipeline *schemas.Pipeline
		// want are the fork's first decisions; loops its loop tree
		// (id:status:round of its step).
		want  []string
		loops string
	}{
		{"after the plan completed, nothing changed: it spawns its children as the origin did", planDone, nil,
			[]string{"loop.spawned plan-001", "loop.spawned plan-002", "job.requested f1.plan-001.1", "job.requested f1.plan-002.1"},
			"plan:completed:0"},
		{"after the plan completed, the spec level changed: the same, the specs run with the new level", planDone, ptr(treeWith("spec")),
			[]string{"loop.spawned plan-001", "loop.spawned plan-002", "job.requested f1.plan-001.1", "job.requested f1.plan-002.1"},
			"plan:completed:0"},
		{"after the first spec completed, its level changed: the plan is kept, both specs run again, the notes spawned go", specDone, ptr(treeWith("spec")),
			[]string{"job.requested f1.plan-001.1.r1", "job.requested f1.plan-002.1.r1"},
			"plan:completed:0 plan-001:running:1 plan-002:running:1"},
		{"after the first spec completed, nothing changed: it spawns its notes; the second spec, in flight, runs again", specDone, nil,
			[]string{"job.requested f1.plan-002.1.r1", "loop.spawned plan-001-001", "loop.spawned plan-001-002", "job.requested f1.plan-001-001.1", "job.requested f1.plan-001-002.1"},
			"plan:completed:0 plan-001:completed:0 plan-002:running:1"},
		{"at the last note, the note level changed: plan and specs are kept, every note runs again", lastNote, ptr(treeWith("note")),
			[]string{"job.requested f1.plan-001-001.1.r1", "job.requested f1.plan-001-002.1.r1", "job.requested f1.plan-002-001.1.r1", "job.requested f1.plan-002-002.1.r1"},
			"plan:completed:0 plan-001:completed:0 plan-001-001:running:1 plan-001-002:running:1 plan-002:completed:0 plan-002-001:running:1 plan-002-002:running:1"},
		{"at the last note, the plan level changed: the plan runs again, alone", lastNote, ptr(treeWith("plan")),
			[]string{"job.requested f1.plan.1.r1"},
			"plan:running:1"},
		{"at the last note, nothing changed: every loop is kept and the fork completes", lastNote, nil,
			[]string{"session.completed"},
			"plan:completed:0 plan-001:completed:0 plan-001-001:completed:0 plan-001-002:completed:0 plan-002:completed:0 plan-002-001:completed:0 plan-002-002:completed:0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := (&stream{}).add(done...)
			s.add(s.forkLoops(t, tc.point, tc.pipeline)...)
			st, refused := foldStream(t, s)
			if len(refused) > 0 {
				t.Fatalf("refused: %v", refused)
			}
			f := st.Sessions[forkSess]
			if f == nil || f.Loops == nil {
				t.Fatalf("fork %+v", f)
			}
			var tree []string
			for _, id := range sortedLoopIDs(f.Loops) {
				st := f.Steps[id]
				if st == nil {
					t.Fatalf("loop %s without its step", id)
				}
				tree = append(tree, id+":"+f.Loops.Loops[id].Status+":"+strconv.Itoa(st.Round))
			}
			if got := strings.Join(tree, " "); got != tc.loops {
				t.Errorf("loops:\n  %s\nwant:\n  %s", got, tc.loops)
			}
			if tc.pipeline != nil {
				for id, lp := range f.Loops.Loops {
					if lv := tc.pipeline.Loops.Level(lp.Level); f.Steps[id].Def.Prompt != lv.Prompt {
						t.Errorf("loop %s runs the prompt %q, want the fork's %q", id, f.Steps[id].Def.Prompt, lv.Prompt)
					}
				}
			}
			var lines []string
			for _, ev := range Decide(st, s.evs[len(s.evs)-1], fixedNow) {
				if ev.Session != forkSess {
					t.Errorf("%s of session %s; want the fork's", ev.Type, ev.Session)
				}
				if l := loopLine(ev); l != "" {
					lines = append(lines, l)
				}
				if jr, ok := ev.Data.(*schemas.JobRequested); ok && tc.pipeline != nil {
					// A job runs its level's prompt as the fork's file has it.
					level := tc.pipeline.Loops.Levels[strings.Count(jr.Step, "-")]
					if !strings.HasPrefix(jr.Prompt, level.Prompt) {
						t.Errorf("job %s runs %q, want the fork's %q", jr.JobID, jr.Prompt, level.Prompt)
					}
				}
			}
			if strings.Join(lines, "\n") != strings.Join(tc.want, "\n") {
				t.Errorf("got:\n  %s\nwant:\n  %s", strings.Join(lines, "\n  "), strings.Join(tc.want, "\n  "))
			}
		})
	}
}

// TestForkLoopsKeepsResults: a kept loop carries the origin's artifacts;
// a spec that runs again gets its part of the kept plan.
func TestForkLoopsKeepsResults(t *testing.T) {
	done := treeRun(t, treePipeline())
	s := (&stream{}).add(done...)
	s.add(s.forkLoops(t, after(t, done, schemas.TypeStepCompleted, "plan-001", false), ptr(treeWith("spec")))...)
	st, _ := foldStream(t, s)
	f := st.Sessions[forkSess]
	if plan := f.Steps["plan"]; plan.Status != StepCompleted || len(plan.Artifacts) != 1 || plan.Artifacts[0].Name != "plan.md" {
		t.Errorf("plan in the fork: %+v", plan)
	}
	got := Decide(st, s.evs[len(s.evs)-1], fixedNow)
	if len(got) == 0 {
		t.Fatal("nothing decided")
	}
	jr := got[0].Data.(*schemas.JobRequested)
	if !strings.Contains(jr.Prompt, "better spec") || len(jr.Files) != 1 || !strings.Contains(jr.Files[0].Content, "first part of plan") {
		t.Errorf("the fork's spec job: prompt %q, files %+v", jr.Prompt, jr.Files)
	}
}

func TestCheckForkLoops(t *testing.T) {
	done := treeRun(t, treePipeline())
	planDone := after(t, done, schemas.TypeStepCompleted, "plan", false)
	worktree := treePipeline()
	worktree.Loops.Levels = slices.Clone(worktree.Loops.Levels)
	worktree.Loops.Levels[2].Worktree = true
	for _, tc := range []struct {
		name   string
		point  string
		edit   func(d *schemas.SessionForked)
		reason string
	}{
		{"at its end", done[len(done)-1].ID, nil, "it had ended at the fork point (completed): fork it at an event before its end"},
		{"into a pipeline", planDone, func(d *schemas.SessionForked) { d.Pipeline = chainPipeline() }, "forks loops session s1 into a pipeline session: a fork keeps its origin's kind"},
		{"with a worktree level, of an origin without a repository", planDone, func(d *schemas.SessionForked) { d.Pipeline = worktree },
			"the fork's file has levels that work in git worktrees, and the origin works on no repository"},
		{"without levels", planDone, func(d *schemas.SessionForked) { d.Pipeline.Loops = &schemas.Loops{} }, "the fork's file has no levels"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := (&stream{}).add(done...)
			evs := s.forkLoops(t, tc.point, nil)
			if tc.edit != nil {
				tc.edit(evs[len(evs)-1].Data.(*schemas.SessionForked))
			}
			s.add(evs...)
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

// TestChangedLevels: what a fork with another loops file runs again.
func TestChangedLevels(t *testing.T) {
	old := treePipeline()
	noNote := treePipeline()
	noNote.Loops.Levels = noNote.Loops.Levels[:2]
	for _, tc := range []struct {
		name  string
		next  schemas.Pipeline
		input bool
		want  string
	}{
		{"same", old, false, ""},
		{"a prompt changed", treeWith("spec"), false, "spec"},
		{"a level removed (its parent's children still name it)", noNote, false, ""},
		{"the input changed", old, true, "plan spec note"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := strings.Join(schemas.ChangedLevels(old, tc.next, nil, nil, tc.input), " "); got != tc.want {
				t.Errorf("ChangedLevels = %q, want %q", got, tc.want)
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }
