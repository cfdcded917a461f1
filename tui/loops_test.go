package tui

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/loopbus/loopbus/projections"
	"github.com/loopbus/loopbus/schemas"
)

const (
	loopsBase = "0000000aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
	head1     = "3f2a1bc00000000000000000000000000000000a"
	head2     = "9c1e2d400000000000000000000000000000000b"
)

// loopsEvents is a loops session (plan → spec → code, code in worktrees):
// plan-001-001 merged, plan-001-002 merged after a conflict, plan-002
// paused with its code loop merging.
func loopsEvents() *events {
	e := &events{}
	e.add(schemas.TypeSessionStarted, "", &schemas.SessionStarted{
		Pipeline: schemas.Pipeline{Name: "feature", Kind: schemas.KindLoops, Loops: &schemas.Loops{Levels: []schemas.LoopLevel{
			{Name: "plan", MaxIterations: 2}, {Name: "spec", MaxIterations: 2}, {Name: "code", MaxIterations: 3, Worktree: true},
		}}},
		Loops: &schemas.LoopsStart{Task: "Add a cache", Repo: "fetcher", Base: "main", BaseCommit: loopsBase, Target: "loopbus/" + testSession},
	})
	spawn := func(loop, parent, level string, index int, title string) {
		e.add(schemas.TypeLoopSpawned, loop, &schemas.LoopSpawned{Loop: loop, Parent: parent, Level: level, Index: index, Title: title})
	}
	run := func(loop string, iteration int, git *schemas.GitResult) {
		job := loop + "." + string(rune('0'+iteration))
		e.add(schemas.TypeJobRequested, loop, &schemas.JobRequested{JobID: job, Step: loop, Iteration: iteration})
		e.add(schemas.TypeJobCompleted, loop, &schemas.JobCompleted{JobID: job, Step: loop, Iteration: iteration, Git: git})
		e.add(schemas.TypeValidationPassed, loop, &schemas.Verdict{JobID: job, Step: loop, Iteration: iteration})
		e.add(schemas.TypeStepCompleted, loop, &schemas.StepCompleted{Step: loop, JobID: job, Iterations: iteration})
	}
	merge := func(loop, job, head string, position int) {
		e.add(schemas.TypeJobRequested, loop, &schemas.JobRequested{JobID: job, Step: loop, Iteration: 1, Worktree: &schemas.WorktreeSpec{Merge: true}})
		e.add(schemas.TypeJobCompleted, loop, &schemas.JobCompleted{JobID: job, Step: loop, Git: &schemas.GitResult{Commit: head, Changed: true}})
		e.add(schemas.TypeLoopMerged, loop, &schemas.LoopMerged{Loop: loop, JobID: job, Head: head, Position: position})
	}
	spawn("plan", "", "plan", 0, "Add a cache")
	run("plan", 1, nil)
	spawn("plan-001", "plan", "spec", 1, "Cache layer")
	spawn("plan-002", "plan", "spec", 2, "")
	run("plan-001", 1, nil)
	spawn("plan-001-001", "plan-001", "code", 1, "The store")
	spawn("plan-001-002", "plan-001", "code", 2, "")
	run("plan-001-001", 2, &schemas.GitResult{Commit: "c1c1c1c1", Changed: true})
	merge("plan-001-001", "m1", head1, 1)
	run("plan-001-002", 1, &schemas.GitResult{Commit: "c2c2c2c2", Changed: true})
	e.add(schemas.TypeJobRequested, "plan-001-002", &schemas.JobRequested{JobID: "m2", Step: "plan-001-002", Iteration: 1, Worktree: &schemas.WorktreeSpec{Merge: true}})
	e.add(schemas.TypeJobFailed, "plan-001-002", &schemas.JobFailed{JobID: "m2", Step: "plan-001-002", Error: "conflict", Conflict: []string{"a.txt"}})
	e.add(schemas.TypeLoopRebase, "plan-001-002", &schemas.LoopRebase{Loop: "plan-001-002", Head: head1, Cause: "plan-001-002", Conflict: []string{"a.txt"}})
	run("plan-001-002", 2, &schemas.GitResult{Commit: "c3c3c3c3", Changed: true})
	merge("plan-001-002", "m3", head2, 2)
	run("plan-002", 1, nil)
	spawn("plan-002-001", "plan-002", "code", 1, "Expiry")
	run("plan-002-001", 1, &schemas.GitResult{Commit: "5e5e5e5e9", Changed: true})
	spawn("plan-002-002", "plan-002", "code", 2, "")
	e.add(schemas.TypeStepPaused, "plan-002-002", &schemas.StepPaused{Step: "plan-002-002", Kind: schemas.PauseSignal, Reason: "look first"})
	return e
}

func TestWriteStatusLoops(t *testing.T) {
	m := loopsEvents().manifest(t)
	var b bytes.Buffer
	if err := WriteStatus(&b, m, false, base.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	i := strings.Index(out, "\nloops\n")
	if i < 0 {
		t.Fatalf("no loop tree:\n%s", out)
	}
	// The tree, depth first, in columns.
	want := []string{
		"  plan  plan  completed  1 iteration  Add a cache",
		"    plan-001  spec  completed  1 iteration  Cache layer",
		"      plan-001-001  code  merged 3f2a1bc  2 iterations  The store",
		"      plan-001-002  code  merged 9c1e2d4  2 iterations  redone after 1 merge conflict",
		"    plan-002  spec  completed  1 iteration",
		"      plan-002-001  code  merging 5e5e5e5  1 iteration  Expiry",
		"      plan-002-002  code  paused: look first  0 iterations",
		"target loopbus/s1 at 9c1e2d4 (2 merged)",
	}
	lines := strings.Split(strings.TrimRight(out[i+len("\nloops\n"):], "\n"), "\n")
	if len(lines) != len(want) {
		t.Fatalf("loop lines:\n%s\nwant %d lines", strings.Join(lines, "\n"), len(want))
	}
	for j, w := range want {
		if got := strings.TrimRight(spaces.ReplaceAllString(lines[j], " "), " "); got != spaces.ReplaceAllString(w, " ") {
			t.Errorf("line %d: %q, want %q", j, got, w)
		}
		if lead := len(lines[j]) - len(strings.TrimLeft(lines[j], " ")); lead != len(w)-len(strings.TrimLeft(w, " ")) {
			t.Errorf("line %d indented by %d: %q", j, lead, lines[j])
		}
	}
	// The JSON has the loops list.
	b.Reset()
	if err := WriteStatus(&b, m, true, base); err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{`"loops": [`, `"id": "plan-001-002"`, `"parent": "plan-001"`, `"level": "code"`, `"status": "completed"`,
		`"iterations": 2`, `"branch": "loopbus/s1/plan-001-002"`, `"mergeCommit": "` + head2 + `"`} {
		if !strings.Contains(b.String(), w) {
			t.Errorf("JSON lacks %s", w)
		}
	}
}

func TestDescribeLoops(t *testing.T) {
	e := loopsEvents()
	m := e.manifest(t)
	tests := []struct {
		name string
		typ  string
		step string
		data any
		want string
	}{
		{"spawned", schemas.TypeLoopSpawned, "plan-001", &schemas.LoopSpawned{Loop: "plan-001", Parent: "plan", Level: "spec", Index: 1, Title: "Cache\nlayer"}, "spawned plan-001 (spec): Cache layer"},
		{"spawned again", schemas.TypeLoopSpawned, "plan-001", &schemas.LoopSpawned{Loop: "plan-001", Level: "spec", Generation: 1}, "spawned plan-001 again (spec)"},
		{"merged", schemas.TypeLoopMerged, "plan-001-001", &schemas.LoopMerged{Loop: "plan-001-001", Head: head1, Position: 2}, "merged plan-001-001 into loopbus/s1 at 3f2a1bc (#2)"},
		{"rebase after a conflict", schemas.TypeLoopRebase, "plan-001-002", &schemas.LoopRebase{Loop: "plan-001-002", Head: head1, Cause: "plan-001-002", Conflict: []string{"a.txt", "b.go"}}, "rebase plan-001-002 onto 3f2a1bc: conflict on a.txt, b.go"},
		{"rebase after a merge", schemas.TypeLoopRebase, "plan-001-002", &schemas.LoopRebase{Loop: "plan-001-002", Head: head1, Cause: "plan-001-001"}, "rebase plan-001-002 onto 3f2a1bc after plan-001-001 merged"},
		{"invalidated", schemas.TypeLoopInvalidated, "plan-001-002", &schemas.LoopInvalidated{Loop: "plan-001-002", Cause: "plan-001", Reason: "the spec changed"}, "invalidated plan-001-002 (by plan-001): the spec changed"},
		{"merge queued", schemas.TypeJobRequested, "plan-001-001", &schemas.JobRequested{JobID: "m1", Step: "plan-001-001", Iteration: 1, Worktree: &schemas.WorktreeSpec{Merge: true}}, "merge of plan-001-001 into loopbus/s1 queued"},
		{"merge done", schemas.TypeJobCompleted, "plan-001-001", &schemas.JobCompleted{JobID: "m1", DurationMs: 900, Git: &schemas.GitResult{Commit: head1, Changed: true}}, "plan-001-001 merge done after 900ms: head 3f2a1bc"},
		{"merge conflict", schemas.TypeJobFailed, "plan-001-002", &schemas.JobFailed{JobID: "m2", Conflict: []string{"a.txt"}}, "plan-001-002 merge conflicted on a.txt"},
		{"iteration commit", schemas.TypeJobCompleted, "plan-001-001", &schemas.JobCompleted{JobID: "plan-001-001.2", DurationMs: 2000, Git: &schemas.GitResult{Commit: "c1c1c1c1", Changed: true}}, "plan-001-001#2 agent done after 2s, commit c1c1c1c"},
		{"no change", schemas.TypeJobCompleted, "plan-001-001", &schemas.JobCompleted{JobID: "plan-001-001.2", DurationMs: 2000, Git: &schemas.GitResult{Commit: "c1c1c1c1"}}, "plan-001-001#2 agent done after 2s, no change"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ev := schemas.Event{Type: tc.typ, Session: testSession, Step: tc.step, Time: base, Data: tc.data}
			if got := Describe(ev, m); got != tc.want {
				t.Errorf("Describe = %q, want %q", got, tc.want)
			}
			if got, want := EventLine(ev, m), base.Local().Format("15:04:05")+" "+tc.want; got != want {
				t.Errorf("EventLine = %q, want %q", got, want)
			}
		})
	}
	if got, want := Describe(e.evs[0], m), "session s1 started: loops feature, 3 levels"; got != want {
		t.Errorf("Describe = %q, want %q", got, want)
	}
}

func TestEventRowLoops(t *testing.T) {
	at := time.Date(2026, 11, 25, 10, 0, 0, 5e6, time.UTC)
	for _, tt := range []struct {
		typ, step string
		data      any
		want      string
	}{
		{schemas.TypeLoopSpawned, "plan-001", &schemas.LoopSpawned{Loop: "plan-001", Parent: "plan", Level: "spec", Index: 1, Title: "Cache layer"},
			"loop=plan-001 level=spec parent=plan index=1 Cache layer"},
		{schemas.TypeLoopMerged, "plan-001", &schemas.LoopMerged{Loop: "plan-001", Head: head2, Previous: head1, Position: 2},
			"loop=plan-001 head=9c1e2d4 previous=3f2a1bc position=2"},
		{schemas.TypeLoopRebase, "plan-002", &schemas.LoopRebase{Loop: "plan-002", Head: head1, Cause: "plan-002", Conflict: []string{"a.txt", "b.go"}},
			"loop=plan-002 head=3f2a1bc cause=plan-002 conflict=a.txt,b.go"},
		{schemas.TypeLoopInvalidated, "plan-002", &schemas.LoopInvalidated{Loop: "plan-002", Cause: "plan", Reason: "re-planned"},
			"loop=plan-002 cause=plan re-planned"},
		{schemas.TypeJobRequested, "plan-002", &schemas.JobRequested{JobID: "m1", Iteration: 1, Worktree: &schemas.WorktreeSpec{Merge: true}},
			"job=m1 iteration=1 merge"},
		{schemas.TypeJobFailed, "plan-002", &schemas.JobFailed{JobID: "m1", Conflict: []string{"a.txt"}}, "job=m1 conflict=a.txt"},
	} {
		ev := schemas.Event{Seq: 7, Time: at, Type: tt.typ, Session: "s1", Step: tt.step, Data: tt.data}
		row := EventRow(ev)
		if !strings.HasSuffix(row, " "+tt.want) || !strings.Contains(row, strings.TrimPrefix(tt.typ, "loopbus.")) {
			t.Errorf("EventRow = %q, want it to end with %q", row, tt.want)
		}
	}
}

func TestWriteFinalLoops(t *testing.T) {
	e := loopsEvents()
	m := e.manifest(t)
	var b bytes.Buffer
	WriteFinal(&b, m, nil, "loopbus", "")
	if b.Len() != 0 {
		t.Errorf("a running session: %q", b.String())
	}
	e.add(schemas.TypeSessionCompleted, "", &schemas.SessionCompleted{Final: []schemas.ArtifactRef{}})
	m = e.manifest(t)
	WriteFinal(&b, m, nil, "loopbus", "")
	if got, want := b.String(), "target branch loopbus/s1 at 9c1e2d4: 2 loops merged\n"; got != want {
		t.Errorf("WriteFinal = %q, want %q", got, want)
	}
	b.Reset()
	m.Target.Merges = 1
	WriteFinal(&b, m, nil, "loopbus", "")
	if got, want := b.String(), "target branch loopbus/s1 at 9c1e2d4: 1 loop merged\n"; got != want {
		t.Errorf("WriteFinal = %q, want %q", got, want)
	}
	// A loops session without a repository has no target branch.
	b.Reset()
	WriteFinal(&b, &projections.Manifest{Status: projections.StatusCompleted, Kind: schemas.KindLoops, Target: &projections.TargetView{Task: "t"}}, nil, "loopbus", "")
	if b.Len() != 0 {
		t.Errorf("no target branch: %q", b.String())
	}
}

func TestProgressLoops(t *testing.T) {
	e := loopsEvents()
	var b strings.Builder
	p := NewProgress(&b)
	for i, ev := range e.evs {
		p.Event(ev, projections.BuildManifest(testSession, e.evs[:i+1]))
	}
	for _, w := range []string{
		"  ▸ spawned plan-001 (spec): Cache layer\n",
		"  → plan-001-001: merge into loopbus/s1 queued\n",
		"  ▸ merged plan-001-001 into loopbus/s1 at 3f2a1bc (#1)\n",
		"  ✗ plan-001-002: merge conflicted on a.txt\n",
		"  ▸ rebase plan-001-002 onto 3f2a1bc: conflict on a.txt\n",
	} {
		if !strings.Contains(b.String(), w) {
			t.Errorf("progress lacks %q:\n%s", w, b.String())
		}
	}
}

// A loop waiting at its level's approval gate says so in the tree.
func TestWriteStatusLoopAwaitingApproval(t *testing.T) {
	e := &events{}
	e.add(schemas.TypeSessionStarted, "", &schemas.SessionStarted{
		Pipeline: schemas.Pipeline{Name: "feature", Kind: schemas.KindLoops, Loops: &schemas.Loops{Levels: []schemas.LoopLevel{
			{Name: "plan", MaxIterations: 2, Approval: &schemas.Approval{}},
		}}},
		Loops: &schemas.LoopsStart{Task: "Add a cache"},
	})
	e.add(schemas.TypeLoopSpawned, "plan", &schemas.LoopSpawned{Loop: "plan", Level: "plan", Title: "Add a cache"})
	e.add(schemas.TypeJobRequested, "plan", &schemas.JobRequested{JobID: "plan.1", Step: "plan", Iteration: 1})
	e.add(schemas.TypeJobCompleted, "plan", &schemas.JobCompleted{JobID: "plan.1", Step: "plan", Iteration: 1})
	e.add(schemas.TypeValidationPassed, "plan", &schemas.Verdict{JobID: "plan.1", Step: "plan", Iteration: 1})
	e.add(schemas.TypeApprovalRequested, "plan", &schemas.ApprovalRequested{Step: "plan", JobID: "plan.1", Iteration: 1})
	var b bytes.Buffer
	if err := WriteStatus(&b, e.manifest(t), false, base.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if got := spaces.ReplaceAllString(b.String(), " "); !strings.Contains(got, "plan plan awaiting approval 1 iteration Add a cache") {
		t.Errorf("the tree does not show the gate:\n%s", b.String())
	}
}
