package projections

import (
	"slices"
	"strings"
	"testing"

	"github.com/loopbus/loopbus/schemas"
)

const forkOrigin = "talk-20261120-9f3e"

// forkedSession is a fork (session sessionID) of forkOrigin: the origin
// completed summary and had ideas' job in flight at the fork point; the
// fork's pipeline changes ideas' prompt; its copied history is followed by
// session.forked, and the fork runs ideas and writing-kit to completion.
// It returns the origin's events too (first), as the stream holds them.
func forkedSession() (origin, fork []schemas.Event) {
	var o builder
	o.start(forkOrigin)
	job := o.request(forkOrigin, "summary", 1)
	o.jobStarted(forkOrigin, "summary", job, "worker-a")
	sum := artifact(forkOrigin, "summary", 1, "summary.json", summaryJSON)
	o.jobCompleted(forkOrigin, "summary", job, "worker-a", 1, sum)
	o.passed(forkOrigin, "summary", job, 1, sum)
	o.stepCompleted(forkOrigin, "summary", job, 1, "summary-v1", sum)
	ideas := o.request(forkOrigin, "ideas", 1)
	o.jobStarted(forkOrigin, "ideas", ideas, "worker-b")
	point := o.evs[len(o.evs)-1]

	b := builder{seq: o.seq + 10} // other sessions' events in between
	for _, ev := range o.evs {
		c := ev
		b.seq++
		c.Seq, c.Session, c.ForkOf, c.ID = b.seq, sessionID, ev.ID, testID(sessionID, "copy", ev.ID)
		b.evs = append(b.evs, c)
	}
	p := writingKitPipeline()
	p.Steps = slices.Clone(p.Steps)
	p.Steps[1].Prompt = "From summary.json, propose five sharper article ideas in ideas.json."
	in := inputRef(forkOrigin)
	b.add(sessionID, schemas.TypeSessionForked, "", "", &schemas.SessionForked{Origin: forkOrigin, Seq: point.Seq, Event: point.ID, Copied: len(o.evs),
		Pipeline: p, Input: in, SourceHash: shortHash(in.Digest), Changed: []string{"ideas"}, Reason: "sharper ideas"})
	b.runStep(sessionID, "ideas", "worker-b", 1, "ideas.json", ideasJSON, "ideas-v1")
	kit := b.runStep(sessionID, "writing-kit", "worker-a", 1, "writing-kit.md", kitMD, "")
	b.sessionCompleted(sessionID, kit...)
	return o.evs, b.evs
}

func forkedGolden() []schemas.Event {
	_, fork := forkedSession()
	return fork
}

// TestManifestFork: the fork's manifest is the origin's at the fork point
// (folded from the copies), then session.forked keeps the completed step,
// makes the changed one pending from scratch, and shows the origin's job
// in flight as not the fork's; the origin's manifest is untouched.
func TestManifestFork(t *testing.T) {
	origin, fork := forkedSession()
	forkedAt := slices.IndexFunc(fork, func(ev schemas.Event) bool { return ev.Type == schemas.TypeSessionForked })
	before := foldAll(fork[:forkedAt])
	if before.ContentID != sessionID || before.ForkedFrom != nil || before.Steps["ideas"].Status != StepStatusInProgress || before.Steps["summary"].Status != StepStatusCompleted {
		t.Fatalf("the copied history folds to %+v", before)
	}
	m := foldAll(fork[:forkedAt+1])
	if f := m.ForkedFrom; f == nil || f.Session != forkOrigin || f.Seq != origin[len(origin)-1].Seq || f.Event != origin[len(origin)-1].ID || f.Reason != "sharper ideas" {
		t.Errorf("forkedFrom %+v", m.ForkedFrom)
	}
	if m.Status != StatusRunning || !m.CreatedAt.Equal(fork[forkedAt].Time) {
		t.Errorf("status %s, created %v", m.Status, m.CreatedAt)
	}
	if sv := m.Steps["summary"]; sv.Status != StepStatusCompleted || len(sv.Artifacts) != 1 {
		t.Errorf("summary %+v, want kept", sv)
	}
	if sv := m.Steps["ideas"]; sv.Status != StepStatusPending || sv.JobID != "" || sv.Iterations != 0 {
		t.Errorf("ideas %+v, want pending from scratch", sv)
	}
	originJob := jobID(forkOrigin, "ideas", 1)
	if j := m.Jobs[originJob]; j == nil || j.Status != JobStatusCancelled {
		t.Errorf("the origin's ideas job in the fork: %+v, want cancelled", j)
	}
	if done := foldAll(fork); done.Status != StatusCompleted || done.Steps["ideas"].Status != StepStatusCompleted {
		t.Errorf("after the fork's jobs: %s", done.Status)
	}
	// The origin is untouched: its own events fold as before, with no
	// trace of the fork.
	stream := append(append([]schemas.Event{}, origin...), fork...)
	o := BuildManifest(forkOrigin, stream)
	if o.ForkedFrom != nil || o.Steps["ideas"].Status != StepStatusInProgress || o.Status != StatusRunning || o.LastSeq != origin[len(origin)-1].Seq {
		t.Errorf("origin after the fork: %+v", o)
	}
	// A fork with the same pipeline and nothing changed keeps summary and
	// runs ideas again (it had not completed).
	same := slices.Clone(fork[:forkedAt+1])
	d := *same[forkedAt].Data.(*schemas.SessionForked)
	d.Changed, d.Pipeline = nil, writingKitPipeline()
	same[forkedAt].Data = &d
	if m := foldAll(same); m.Steps["summary"].Status != StepStatusCompleted || m.Steps["ideas"].Status != StepStatusPending || m.Steps["writing-kit"].Status != StepStatusPending {
		t.Errorf("unchanged fork: summary %s, ideas %s, kit %s", m.Steps["summary"].Status, m.Steps["ideas"].Status, m.Steps["writing-kit"].Status)
	}
	// A fork after the origin's close changes nothing (the orchestrator
	// refuses it).
	closed := slices.Clone(same[:forkedAt])
	closed = append(closed, schemas.Event{ID: "closed", Type: schemas.TypeSessionClosed, Session: sessionID, Seq: same[forkedAt].Seq, Time: same[forkedAt].Time,
		Data: &schemas.SessionClosed{Reason: "done"}}, same[forkedAt])
	closed[len(closed)-1].Seq++
	if m := foldAll(closed); m.Status != StatusClosed || m.ForkedFrom != nil {
		t.Errorf("fork after a close: %s, forkedFrom %+v", m.Status, m.ForkedFrom)
	}
	// Changing summary runs every step again (the others require it).
	d.Changed = []string{"summary"}
	if m := foldAll(same); m.Steps["summary"].Status != StepStatusPending || len(m.Steps["summary"].Artifacts) != 0 {
		t.Errorf("summary changed: %+v", m.Steps["summary"])
	}
}

// TestManifestForkLoops: a loops session's fork keeps the completed loops
// of unchanged levels with their subtrees; a loop that had not completed,
// or whose level changed, starts over, and the loops under it go.
func TestManifestForkLoops(t *testing.T) {
	all := loopsSession()
	// The point: plan and plan-001 completed, plan-001's code loops just
	// spawned, plan-002 not run yet.
	point := 1 + slices.IndexFunc(all, func(ev schemas.Event) bool {
		d, ok := ev.Data.(*schemas.LoopSpawned)
		return ok && d.Loop == "plan-001-002"
	})
	for _, tc := range []struct {
		name    string
		changed []string
		loops   string
		steps   string
	}{
		{"nothing changed", nil,
			"plan:completed plan-001:completed plan-002:running plan-001-001:running plan-001-002:running",
			"plan:completed plan-001:completed plan-002:pending plan-001-001:pending plan-001-002:pending"},
		{"the spec level changed", []string{"spec"},
			"plan:completed plan-001:running plan-002:running",
			"plan:completed plan-001:pending plan-002:pending"},
		{"the plan level changed", []string{"plan"},
			"plan:running",
			"plan:pending"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			evs := slices.Clone(all[:point])
			for i := range evs {
				evs[i].ForkOf = evs[i].ID
			}
			last := evs[len(evs)-1]
			in := inputRef(sessionID)
			b := builder{seq: last.Seq}
			b.add(sessionID, schemas.TypeSessionForked, "", "", &schemas.SessionForked{Origin: forkOrigin, Seq: 7, Event: "e", Copied: len(evs),
				Pipeline: loopsPipeline(), Input: in, SourceHash: shortHash(in.Digest), Changed: tc.changed})
			m := foldAll(append(evs, b.evs...))
			var loops, steps []string
			for _, lp := range m.Loops {
				loops = append(loops, lp.ID+":"+lp.Status)
				if sv := m.Steps[lp.ID]; sv != nil {
					steps = append(steps, lp.ID+":"+sv.Status)
				}
			}
			if got := strings.Join(loops, " "); got != tc.loops {
				t.Errorf("loops %s, want %s", got, tc.loops)
			}
			if got := strings.Join(steps, " "); got != tc.steps || len(m.Steps) != len(m.Loops) || len(m.StepOrder) != len(m.Loops) {
				t.Errorf("steps %s (%d, order %v), want %s", got, len(m.Steps), m.StepOrder, tc.steps)
			}
			if m.Status != StatusRunning || m.ForkedFrom == nil || (m.Steps["plan"].ContentHash == "") != slices.Contains(tc.changed, "plan") {
				t.Errorf("status %s, forkedFrom %+v, plan %+v", m.Status, m.ForkedFrom, m.Steps["plan"])
			}
		})
	}
}

// TestManifestForkBacklog: a backlog session's fork keeps its finished
// runs and its phase; a run not finished starts over.
func TestManifestForkBacklog(t *testing.T) {
	var o builder
	o.startBacklog(forkOrigin, importedTasks())
	o.phase(forkOrigin, schemas.PhaseIterate, "imported")
	o.taskSelected(forkOrigin, "T001", 1, "first")
	o.runStep(forkOrigin, "T001", "w1", 1, "summary.json", `{"task_id": "T001", "status": "done", "summary": "ok"}`, "")
	o.taskUpdated(forkOrigin, schemas.TaskUpdated{ID: "T001", Status: schemas.TaskDone, By: "orchestrator"})
	o.taskSelected(forkOrigin, "T002", 1, "next")
	job := o.request(forkOrigin, "T002", 1)
	o.jobStarted(forkOrigin, "T002", job, "w1")
	b := builder{seq: o.seq}
	for _, ev := range o.evs {
		c := ev
		b.seq++
		c.Seq, c.Session, c.ForkOf, c.ID = b.seq, sessionID, ev.ID, testID(sessionID, "copy", ev.ID)
		b.evs = append(b.evs, c)
	}
	in := inputRef(forkOrigin)
	last := o.evs[len(o.evs)-1]
	b.add(sessionID, schemas.TypeSessionForked, "", "", &schemas.SessionForked{Origin: forkOrigin, Seq: last.Seq, Event: last.ID, Copied: len(o.evs),
		Pipeline: backlogPipeline(), Input: in, SourceHash: shortHash(in.Digest)})
	m := foldAll(b.evs)
	if m.Kind != schemas.KindBacklog || m.Phase != schemas.PhaseIterate || m.Status != StatusRunning || m.ForkedFrom == nil {
		t.Fatalf("fork: kind %s, phase %s, status %s, forkedFrom %+v", m.Kind, m.Phase, m.Status, m.ForkedFrom)
	}
	if sv := m.Steps["T001"]; sv == nil || sv.Status != StepStatusCompleted || sv.ContentHash == "" {
		t.Errorf("T001 %+v, want kept", sv)
	}
	if sv := m.Steps["T002"]; sv == nil || sv.Status != StepStatusPending || sv.JobID != "" {
		t.Errorf("T002 %+v, want pending from scratch", sv)
	}
	if j := m.Jobs[job]; j == nil || j.Status != JobStatusCancelled {
		t.Errorf("the origin's T002 job in the fork: %+v, want cancelled", j)
	}
}

// forkOf returns the copies, into session into, of evs (sequences go on
// after evs) and the session.forked that follows them with data d.
func forkOf(evs []schemas.Event, into string, d schemas.SessionForked) []schemas.Event {
	b := builder{seq: evs[len(evs)-1].Seq}
	for _, ev := range evs {
		c := ev
		b.seq++
		c.Seq, c.Session, c.ForkOf, c.ID = b.seq, into, ev.ID, testID(into, "copy", ev.ID)
		b.evs = append(b.evs, c)
	}
	point := evs[len(evs)-1]
	d.Seq, d.Event, d.Copied = point.Seq, point.ID, len(evs)
	b.add(into, schemas.TypeSessionForked, "", "", &d)
	return b.evs
}

// TestManifestForkForgeries: once a session has an event of its own,
// copies and session.forked into it are ignored: a forged copy of
// session.failed does not fail a live session, forged copies of
// step.completed and session.completed do not complete it, a forged
// session.forked does not reset it; nor do late copies into a fork.
func TestManifestForkForgeries(t *testing.T) {
	origin, fork := forkedSession()
	var f builder
	f.seq = fork[len(fork)-1].Seq + 100
	f.stepCompleted(forkOrigin, "ideas", jobID(forkOrigin, "ideas", 1), 1, "ideas-v1", artifact(forkOrigin, "ideas", 1, "ideas.json", ideasJSON))
	f.sessionCompleted(forkOrigin, artifact(forkOrigin, "evil", 1, "evil.md", "evil"))
	f.sessionFailed(forkOrigin, "ideas", "forged")
	for i := range f.evs {
		f.evs[i].ForkOf = testID("forged", f.evs[i].ID)
	}
	in := inputRef(forkOrigin)
	f.add(forkOrigin, schemas.TypeSessionForked, "", "", &schemas.SessionForked{Origin: "other", Seq: 1, Event: "x", Copied: 1,
		Pipeline: writingKitPipeline(), Input: in, SourceHash: shortHash(in.Digest)})
	want := foldAll(origin)
	for n := 1; n <= len(f.evs); n++ {
		got := foldAll(append(slices.Clone(origin), f.evs[:n]...))
		if got.Status != StatusRunning || got.Final != nil || got.ForkedFrom != nil || got.Steps["ideas"].Status != want.Steps["ideas"].Status || got.LastSeq != want.LastSeq {
			t.Errorf("live session after forged %s: status %s, final %v, forkedFrom %+v, ideas %s",
				f.evs[n-1].Type, got.Status, got.Final, got.ForkedFrom, got.Steps["ideas"].Status)
		}
	}
	// The same forgeries into the fork, after its session.forked.
	forkedAt := slices.IndexFunc(fork, func(ev schemas.Event) bool { return ev.Type == schemas.TypeSessionForked })
	late := slices.Clone(fork[:forkedAt+1])
	for _, ev := range f.evs {
		ev.Session = sessionID
		late = append(late, ev)
	}
	for n := forkedAt + 2; n <= len(late); n++ {
		if m := foldAll(late[:n]); m.Status != StatusRunning || m.Final != nil || m.ForkedFrom == nil || m.ForkedFrom.Session != forkOrigin {
			t.Errorf("fork after forged %s: status %s, final %v, forkedFrom %+v", late[n-1].Type, m.Status, m.Final, m.ForkedFrom)
		}
	}
}

// TestManifestForkBudget: a fork runs under its origin's budget at the
// fork point, raises by session.budget included, tightened by its own.
func TestManifestForkBudget(t *testing.T) {
	var o builder
	in := inputRef(forkOrigin)
	p := writingKitPipeline()
	p.Budget = &schemas.Budget{MaxCostUSD: 1, MaxIterations: 10}
	o.add(forkOrigin, schemas.TypeSessionStarted, "", "", &schemas.SessionStarted{Pipeline: p, Input: in, SourceHash: shortHash(in.Digest),
		Budget: &schemas.Budget{MaxTokens: 1000}})
	o.add(forkOrigin, schemas.TypeSessionBudget, "", "", &schemas.SessionBudget{Budget: schemas.Budget{MaxCostUSD: 5, MaxTokens: 9000}})
	evs := forkOf(o.evs, sessionID, schemas.SessionForked{Origin: forkOrigin, Pipeline: p, Input: in, SourceHash: shortHash(in.Digest),
		Budget: &schemas.Budget{MaxIterations: 4}})
	m := foldAll(evs)
	if want := (schemas.Budget{MaxCostUSD: 5, MaxTokens: 9000, MaxIterations: 4}); m.Budget == nil || *m.Budget != want {
		t.Errorf("fork's budget %+v, want %+v", m.Budget, want)
	}
}

// TestManifestForkOfAnImport: a fork of an imported session is no
// import: step.imported does not apply to it.
func TestManifestForkOfAnImport(t *testing.T) {
	var o builder
	o.importStart(forkOrigin)
	in := inputRef(forkOrigin)
	evs := forkOf(o.evs, sessionID, schemas.SessionForked{Origin: forkOrigin, Pipeline: writingKitPipeline(), Input: in, SourceHash: shortHash(in.Digest)})
	b := builder{seq: evs[len(evs)-1].Seq}
	b.importStep(sessionID, "summary", "summary.json", summaryJSON, nil)
	m := foldAll(append(evs, b.evs...))
	if m.Import != nil || m.Steps["summary"].Status != StepStatusPending || m.Status != StatusRunning {
		t.Errorf("fork of an import: import %+v, summary %s, status %s", m.Import, m.Steps["summary"].Status, m.Status)
	}
}

// TestManifestForkRepoBacklog: a backlog with workdir: repo forked after
// T001 merged and T002 passed (its merge still to come): T001 is kept,
// T002, whose changes were not merged, starts over; the fork's target is
// its own branch, at the origin's head at the point.
func TestManifestForkRepoBacklog(t *testing.T) {
	var o builder
	in := inputRef(forkOrigin)
	base := bundleRef("base.bundle")
	p := backlogPipeline()
	bk := *p.Backlog
	bk.Workdir = schemas.WorkdirRepo
	p.Backlog = &bk
	o.add(forkOrigin, schemas.TypeSessionStarted, "", "", &schemas.SessionStarted{Pipeline: p, Input: in, SourceHash: shortHash(in.Digest),
		Backlog: &schemas.BacklogStart{Tasks: importedTasks()},
		Loops:   &schemas.LoopsStart{Repo: "docs", Base: "main", BaseCommit: baseCommit, Bundle: &base, Target: "loopbus/" + forkOrigin}})
	o.phase(forkOrigin, schemas.PhaseIterate, "imported")
	run := func(id string, git *schemas.GitResult) {
		job := o.request(forkOrigin, id, 1)
		o.jobStarted(forkOrigin, id, job, "w1")
		a := artifact(forkOrigin, id, 1, "summary.json", `{"task_id": "`+id+`", "status": "done", "summary": "ok"}`)
		o.add(forkOrigin, schemas.TypeArtifactStored, id, job, &schemas.ArtifactStored{JobID: job, Artifact: a})
		o.add(forkOrigin, schemas.TypeJobCompleted, id, job, &schemas.JobCompleted{JobID: job, Step: id, Iteration: 1, Worker: "w1", Artifacts: []schemas.ArtifactRef{a}, Git: git})
		o.passed(forkOrigin, id, job, 1, a)
		o.taskUpdated(forkOrigin, schemas.TaskUpdated{ID: id, Status: schemas.TaskDone, By: job})
		o.stepCompleted(forkOrigin, id, job, 1, "task-summary/1", a)
	}
	o.taskSelected(forkOrigin, "T001", 1, "first")
	c1 := &schemas.GitResult{Commit: commit("c1"), Base: baseCommit, Bundle: ptr(bundleRef("c1.bundle")), Changed: true}
	run("T001", c1)
	o.taskSelected(forkOrigin, "T002", 1, "next")
	mj := forkOrigin + ".T001.merge1"
	o.add(forkOrigin, schemas.TypeJobRequested, "T001", mj, &schemas.JobRequested{JobID: mj, Step: "T001", Iteration: 1, Attempt: 1, Agent: agentSpec("x"),
		Prompt: "merge", Inputs: []schemas.ArtifactRef{}, Worktree: &schemas.WorktreeSpec{Base: baseCommit, From: c1.Commit, Branch: "loopbus/" + forkOrigin, Merge: true}})
	h1 := commit("h1")
	o.add(forkOrigin, schemas.TypeJobCompleted, "T001", mj, &schemas.JobCompleted{JobID: mj, Step: "T001", Iteration: 1, Worker: "w2",
		Git: &schemas.GitResult{Commit: h1, Base: baseCommit, Bundle: ptr(bundleRef("merge1.bundle")), Changed: true}})
	o.add(forkOrigin, schemas.TypeLoopMerged, "T001", "", &schemas.LoopMerged{Loop: "T001", JobID: mj, Head: h1, Previous: baseCommit, Bundle: bundleRef("merge1.bundle"), Position: 1})
	run("T002", &schemas.GitResult{Commit: commit("c2"), Base: h1, Bundle: ptr(bundleRef("c2.bundle")), Changed: true})

	if tg := foldAll(o.evs).Target; tg == nil || !slices.Equal(tg.Unmerged, []string{"T002"}) || tg.Head != h1 {
		t.Fatalf("the origin's target at the point: %+v, want T002 unmerged at %s", tg, h1)
	}
	m := foldAll(forkOf(o.evs, sessionID, schemas.SessionForked{Origin: forkOrigin, Pipeline: p, Input: in, SourceHash: shortHash(in.Digest)}))
	if sv := m.Steps["T001"]; sv == nil || sv.Status != StepStatusCompleted || sv.ContentHash == "" {
		t.Errorf("T001 %+v, want kept (merged)", sv)
	}
	if sv := m.Steps["T002"]; sv == nil || sv.Status != StepStatusPending || sv.JobID != "" || sv.ContentHash != "" {
		t.Errorf("T002 %+v, want pending from scratch (not merged)", sv)
	}
	if tg := m.Target; tg == nil || tg.Branch != "loopbus/"+sessionID || tg.Head != h1 || tg.Merges != 1 || len(tg.Bundles) != 2 || tg.Unmerged != nil {
		t.Errorf("the fork's target %+v, want loopbus/%s at %s", m.Target, sessionID, h1)
	}
	// A conflicting merge of T002 runs it again: not completed, not
	// unmerged (its next job leaves changes anew).
	c := o
	c.evs = slices.Clone(o.evs)
	c.add(forkOrigin, schemas.TypeLoopRebase, "T002", "", &schemas.LoopRebase{Loop: "T002", Head: h1, Cause: "merge", Conflict: []string{"a.txt"}, Reason: "merging T002 conflicted in a.txt"})
	if m := foldAll(c.evs); m.Steps["T002"].Status != StepStatusInProgress || m.Steps["T002"].ContentHash != "" || m.Target.Unmerged != nil ||
		m.Steps["T002"].LastFeedback == "" {
		t.Errorf("T002 after a conflicting merge: %+v, unmerged %v; want in progress with the conflict as feedback", m.Steps["T002"], m.Target.Unmerged)
	}
	// The origin's merge of T002 empties its unmerged runs.
	mj = forkOrigin + ".T002.merge2"
	o.add(forkOrigin, schemas.TypeLoopMerged, "T002", "", &schemas.LoopMerged{Loop: "T002", JobID: mj, Head: commit("h2"), Previous: h1, Bundle: bundleRef("merge2.bundle"), Position: 2})
	if tg := foldAll(o.evs).Target; tg.Unmerged != nil || tg.Merges != 2 {
		t.Errorf("the origin's target after T002's merge: %+v", tg)
	}
	// A role run that leaves changes is never merged: it is no unmerged
	// run, and a fork keeps it.
	o.phase(forkOrigin, schemas.PhaseReview, "all done")
	job := o.request(forkOrigin, "review", 1)
	o.jobStarted(forkOrigin, "review", job, "w1")
	a := artifact(forkOrigin, "review", 1, "summary.json", `{"task_id": "review", "status": "done", "summary": "ok"}`)
	o.add(forkOrigin, schemas.TypeArtifactStored, "review", job, &schemas.ArtifactStored{JobID: job, Artifact: a})
	o.add(forkOrigin, schemas.TypeJobCompleted, "review", job, &schemas.JobCompleted{JobID: job, Step: "review", Iteration: 1, Worker: "w1", Artifacts: []schemas.ArtifactRef{a},
		Git: &schemas.GitResult{Commit: commit("r1"), Base: commit("h2"), Bundle: ptr(bundleRef("r1.bundle")), Changed: true}})
	o.passed(forkOrigin, "review", job, 1, a)
	o.stepCompleted(forkOrigin, "review", job, 1, "task-summary/1", a)
	if tg := foldAll(o.evs).Target; tg.Unmerged != nil {
		t.Errorf("the origin's unmerged runs after its review: %v, want none", tg.Unmerged)
	}
	m = foldAll(forkOf(o.evs, sessionID, schemas.SessionForked{Origin: forkOrigin, Pipeline: p, Input: in, SourceHash: shortHash(in.Digest)}))
	if sv := m.Steps["review"]; sv == nil || sv.Status != StepStatusCompleted {
		t.Errorf("the fork's review %+v, want kept", sv)
	}
}
