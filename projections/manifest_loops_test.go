package projections

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strconv"
	"testing"

	"github.com/loopbus/loopbus/schemas"
)

// The loops session of these tests: levels plan → spec → code, the code
// level working in git worktrees merged into loopbus/<session>.

const (
	baseCommit = "a1b2c3d4e5f60718293a4b5c6d7e8f9012345678"
	loopTarget = "loopbus/" + sessionID
)

// commit is a fake 40-hex commit id named by s.
func commit(s string) string { return testID("commit", s) + testID("commit2", s)[:8] }

func loopsPipeline() schemas.Pipeline {
	return schemas.Pipeline{
		Name: "feature", Kind: schemas.KindLoops, Source: "pipelines/feature.yaml", Dir: "/srv/loopbus/pipelines",
		Loops: &schemas.Loops{Base: "main", Levels: []schemas.LoopLevel{
			{Name: "plan", Agent: agentSpec("planner"), Prompt: "Plan the task.", MaxIterations: 2, TimeoutMs: 600000,
				Outputs:  []schemas.Output{{Name: "plan.md", Report: true, ReportText: true}},
				Children: &schemas.LoopChildren{Level: "spec", From: "plan.md", Split: schemas.SplitHeadings}},
			{Name: "spec", Agent: agentSpec("specifier"), Prompt: "Specify your part.", MaxIterations: 3, TimeoutMs: 600000,
				Outputs:  []schemas.Output{{Name: "spec.json", Report: true}},
				Children: &schemas.LoopChildren{Level: "code", From: "spec.json", Split: schemas.SplitJSON, Path: "/changes"}},
			{Name: "code", Agent: agentSpec("coder"), Prompt: "Make the change.", MaxIterations: 2, TimeoutMs: 900000, Worktree: true},
		}},
	}
}

func bundleRef(name string) schemas.ArtifactRef {
	return schemas.ArtifactRef{Name: name, Object: sessionID + "/git/" + name, Digest: digest([]byte(name)), Size: 1024,
		ContentType: "application/x-git-bundle"}
}

// loopJob is the job id of a loop's iteration in round (generation) round.
func loopJob(loop string, iteration, round int) string {
	if round == 0 {
		return jobID(sessionID, loop, iteration)
	}
	return testID(sessionID, "job", loop, strconv.Itoa(iteration), "round", strconv.Itoa(round))
}

// loopsBuilder adds the events of a loops session.
type loopsBuilder struct{ *builder }

func (b loopsBuilder) spawn(loop, parent, level string, index, generation int, title string) {
	b.add(sessionID, schemas.TypeLoopSpawned, loop, "", &schemas.LoopSpawned{Loop: loop, Parent: parent, Level: level, Index: index,
		Input: "## " + title + "\n", InputName: "part.md", InputDigest: digest([]byte(title)), Title: title, Generation: generation})
}

// request asks for an iteration of loop; worktree loops start from base.
func (b loopsBuilder) request(loop string, iteration, round int, base string) string {
	id := loopJob(loop, iteration, round)
	jr := &schemas.JobRequested{JobID: id, Step: loop, Iteration: iteration, Attempt: 1, Round: round, Agent: agentSpec("x"),
		Prompt: "p", Inputs: []schemas.ArtifactRef{inputRef(sessionID)}, TimeoutMs: 600000}
	if base != "" {
		jr.Worktree = &schemas.WorktreeSpec{Bundles: []schemas.ArtifactRef{bundleRef("base.bundle")}, Base: base,
			Branch: loopTarget + "/" + loop}
	}
	b.add(sessionID, schemas.TypeJobRequested, loop, id, jr)
	b.jobStarted(sessionID, loop, id, "w1")
	return id
}

// done completes job (with git, for worktree loops) and gives its verdict.
func (b loopsBuilder) done(loop, job string, iteration int, git *schemas.GitResult, pass bool, arts ...schemas.ArtifactRef) {
	b.add(sessionID, schemas.TypeJobCompleted, loop, job, &schemas.JobCompleted{JobID: job, Step: loop, Iteration: iteration,
		Worker: "w1", DurationMs: 30000, Artifacts: arts, Usage: &schemas.Usage{InputTokens: 1000, OutputTokens: 200, CostUSD: 0.01}, Git: git})
	if pass {
		b.passed(sessionID, loop, job, iteration, arts...)
		return
	}
	b.failedValidation(sessionID, loop, job, iteration, "Fix it.", []schemas.ValidationError{{Artifact: "spec.json", Pointer: "/changes", Message: "minItems: got 0, want 1", Source: "schema"}}, arts...)
}

// merge runs loop's n-th merge job from candidate onto head; it reports
// the job id.
func (b loopsBuilder) merge(loop string, n, iteration int, candidate *schemas.GitResult, head string) string {
	id := sessionID + "." + loop + ".merge" + strconv.Itoa(n)
	b.add(sessionID, schemas.TypeJobRequested, loop, id, &schemas.JobRequested{JobID: id, Step: loop, Iteration: iteration, Attempt: 1,
		Agent: agentSpec("x"), Prompt: "merge " + loop + " into " + loopTarget, Inputs: []schemas.ArtifactRef{}, TimeoutMs: 900000,
		Worktree: &schemas.WorktreeSpec{Base: head, From: candidate.Commit, FromBase: candidate.Base, Branch: loopTarget, Merge: true}})
	b.jobStarted(sessionID, loop, id, "w2")
	return id
}

// loopsSession is a loops session: plan spawns two specs; plan-001's two
// code loops are merged (plan-001-002 after its first merge conflicted);
// plan-002 is invalidated by a signal while its code loop runs, runs
// again and spawns it again, and that code loop changes nothing.
func loopsSession() []schemas.Event {
	b := loopsBuilder{&builder{}}
	in := inputRef(sessionID)
	base := bundleRef("base.bundle")
	b.add(sessionID, schemas.TypeSessionStarted, "", "", &schemas.SessionStarted{
		Pipeline: loopsPipeline(), Input: in, SourceHash: shortHash(in.Digest),
		Loops: &schemas.LoopsStart{Task: "\n  Add a cache to the fetcher  \n\nKeep it small.\n", Repo: "fetcher", Base: "main",
			BaseCommit: baseCommit, Bundle: &base, Target: loopTarget, Identity: &schemas.GitIdentity{Name: "Ada", Email: "ada@example.com"}},
	})

	b.spawn("plan", "", "plan", 0, 0, "Add a cache to the fetcher")
	job := b.request("plan", 1, 0, "")
	plan := artifact(sessionID, "plan", 1, "plan.md", "## Cache layer\n## Invalidation\n")
	b.done("plan", job, 1, nil, true, plan)
	b.stepCompleted(sessionID, "plan", job, 1, "", plan)
	b.spawn("plan-001", "plan", "spec", 1, 0, "Cache layer")
	b.spawn("plan-002", "plan", "spec", 2, 0, "Invalidation")

	// plan-001 passes at its second iteration and spawns two code loops.
	job = b.request("plan-001", 1, 0, "")
	b.done("plan-001", job, 1, nil, false, artifact(sessionID, "plan-001", 1, "spec.json", `{"changes":[]}`))
	job = b.request("plan-001", 2, 0, "")
	spec := artifact(sessionID, "plan-001", 2, "spec.json", `{"changes":["a","b"]}`)
	b.done("plan-001", job, 2, nil, true, spec)
	b.stepCompleted(sessionID, "plan-001", job, 2, "", spec)
	b.spawn("plan-001-001", "plan-001", "code", 1, 0, `"a"`)
	b.spawn("plan-001-002", "plan-001", "code", 2, 0, `"b"`)

	// Both code loops run on the base; plan-001-001 passes and is merged.
	c1 := &schemas.GitResult{Commit: commit("c1"), Base: baseCommit, Bundle: &schemas.ArtifactRef{Name: "c1.bundle", Object: sessionID + "/git/c1.bundle", Digest: digest([]byte("c1"))}, Changed: true}
	job1 := b.request("plan-001-001", 1, 0, baseCommit)
	job2 := b.request("plan-001-002", 1, 0, baseCommit)
	b.done("plan-001-001", job1, 1, c1, true)
	b.stepCompleted(sessionID, "plan-001-001", job1, 1, "")
	h1 := commit("h1")
	mj := b.merge("plan-001-001", 1, 1, c1, baseCommit)
	b.add(sessionID, schemas.TypeJobCompleted, "plan-001-001", mj, &schemas.JobCompleted{JobID: mj, Step: "plan-001-001", Iteration: 1,
		Worker: "w2", DurationMs: 900, Git: &schemas.GitResult{Commit: h1, Base: baseCommit, Bundle: ptr(bundleRef("merge1.bundle")), Changed: true}})
	b.add(sessionID, schemas.TypeLoopMerged, "plan-001-001", "", &schemas.LoopMerged{Loop: "plan-001-001", JobID: mj, Head: h1, Previous: baseCommit,
		Bundle: bundleRef("merge1.bundle"), Position: 1})
	b.add(sessionID, schemas.TypeLoopRebase, "plan-001-002", "", &schemas.LoopRebase{Loop: "plan-001-002", Head: h1, Cause: "plan-001-001",
		Reason: "plan-001-001 was merged into " + loopTarget})

	// plan-001-002 passes on the base, but its merge conflicts: it
	// iterates again on the new head, passes and is merged.
	c2 := &schemas.GitResult{Commit: commit("c2"), Base: baseCommit, Changed: true}
	b.done("plan-001-002", job2, 1, c2, true)
	b.stepCompleted(sessionID, "plan-001-002", job2, 1, "")
	mj = b.merge("plan-001-002", 2, 1, c2, h1)
	b.add(sessionID, schemas.TypeJobFailed, "plan-001-002", mj, &schemas.JobFailed{JobID: mj, Step: "plan-001-002", Iteration: 1, Worker: "w2",
		ExitCode: 1, Error: "merge conflict in a.txt", Conflict: []string{"a.txt"}})
	b.add(sessionID, schemas.TypeLoopRebase, "plan-001-002", "", &schemas.LoopRebase{Loop: "plan-001-002", Head: h1, Cause: "plan-001-002",
		Conflict: []string{"a.txt"}, Reason: "Merging this loop's commits into " + loopTarget + " conflicted on a.txt (changes merged meanwhile). The next iteration starts from the new head."})
	job2 = b.request("plan-001-002", 2, 0, h1)
	c3 := &schemas.GitResult{Commit: commit("c3"), Base: h1, Changed: true}
	b.done("plan-001-002", job2, 2, c3, true)
	b.stepCompleted(sessionID, "plan-001-002", job2, 2, "")
	h2 := commit("h2")
	mj = b.merge("plan-001-002", 3, 2, c3, h1)
	b.add(sessionID, schemas.TypeJobCompleted, "plan-001-002", mj, &schemas.JobCompleted{JobID: mj, Step: "plan-001-002", Iteration: 2,
		Worker: "w2", DurationMs: 800, Git: &schemas.GitResult{Commit: h2, Base: h1, Bundle: ptr(bundleRef("merge2.bundle")), Changed: true}})
	b.add(sessionID, schemas.TypeLoopMerged, "plan-001-002", "", &schemas.LoopMerged{Loop: "plan-001-002", JobID: mj, Head: h2, Previous: h1,
		Bundle: bundleRef("merge2.bundle"), Position: 2})

	// plan-002 passes and spawns its code loop, then is invalidated.
	job = b.request("plan-002", 1, 0, "")
	spec2 := artifact(sessionID, "plan-002", 1, "spec.json", `{"changes":["c"]}`)
	b.done("plan-002", job, 1, nil, true, spec2)
	b.stepCompleted(sessionID, "plan-002", job, 1, "", spec2)
	b.spawn("plan-002-001", "plan-002", "code", 1, 0, `"c"`)
	job3 := b.request("plan-002-001", 1, 0, h2)
	sig := b.signal(sessionID, "invalidate", "plan-002", "the plan changed", "")
	b.cancel(sessionID, "plan-002-001", job3, 1, "loop plan-002 invalidated")
	b.add(sessionID, schemas.TypeLoopInvalidated, "plan-002-001", "", &schemas.LoopInvalidated{Loop: "plan-002-001", Cause: "plan-002", Reason: "the plan changed"})
	b.add(sessionID, schemas.TypeStepInvalidated, "plan-002", "", &schemas.StepInvalidated{Step: "plan-002", Cause: "plan-002", Reason: "the plan changed"})
	b.ack(sessionID, sig, "invalidate", "plan-002", schemas.SignalApplied, "runs again: plan-002; invalidated (spawned again when it passes): plan-002-001")
	b.killed(sessionID, "plan-002-001", job3, "w1", 1, nil)

	// It runs again and spawns its code loop again, which changes nothing.
	job = b.request("plan-002", 1, 1, "")
	spec2 = artifact(sessionID, "plan-002", 1, "spec.json", `{"changes":["c2"]}`)
	b.done("plan-002", job, 1, nil, true, spec2)
	b.stepCompleted(sessionID, "plan-002", job, 1, "", spec2)
	b.spawn("plan-002-001", "plan-002", "code", 1, 1, `"c2"`)
	job3 = b.request("plan-002-001", 1, 1, h2)
	b.done("plan-002-001", job3, 1, &schemas.GitResult{Commit: h2, Base: h2}, true)
	b.stepCompleted(sessionID, "plan-002-001", job3, 1, "")
	b.sessionCompleted(sessionID)
	return b.evs
}

func ptr[T any](v T) *T { return &v }

func TestLoopsManifest(t *testing.T) {
	evs := loopsSession()
	m := foldAll(evs)
	if m.Kind != schemas.KindLoops || m.Status != StatusCompleted {
		t.Fatalf("kind %q status %q, want loops completed", m.Kind, m.Status)
	}
	type loopWant struct {
		id, parent, level, status string
		iterations                int
		branch, mergeCommit       string
		rebases, generation       int
	}
	wants := []loopWant{
		{"plan", "", "plan", LoopStatusCompleted, 1, "", "", 0, 0},
		{"plan-001", "plan", "spec", LoopStatusCompleted, 2, "", "", 0, 0},
		{"plan-002", "plan", "spec", LoopStatusCompleted, 1, "", "", 0, 0},
		{"plan-001-001", "plan-001", "code", LoopStatusCompleted, 1, loopTarget + "/plan-001-001", commit("h1"), 0, 0},
		{"plan-001-002", "plan-001", "code", LoopStatusCompleted, 2, loopTarget + "/plan-001-002", commit("h2"), 1, 0},
		{"plan-002-001", "plan-002", "code", LoopStatusCompleted, 1, loopTarget + "/plan-002-001", "", 0, 1},
	}
	if len(m.Loops) != len(wants) {
		t.Fatalf("%d loops, want %d: %+v", len(m.Loops), len(wants), m.Loops)
	}
	for i, w := range wants {
		l := m.Loops[i]
		got := loopWant{l.ID, l.Parent, l.Level, l.Status, l.Iterations, l.Branch, l.MergeCommit, l.Rebases, l.Generation}
		if got != w {
			t.Errorf("loop %d: %+v\nwant %+v", i, got, w)
		}
	}
	if got, want := m.StepOrder, []string{"plan", "plan-001", "plan-002", "plan-001-001", "plan-001-002", "plan-002-001"}; !reflect.DeepEqual(got, want) {
		t.Errorf("steps %v, want %v", got, want)
	}
	// Steps take their level's max iterations; merge jobs are jobs but
	// not iterations.
	for name, max := range map[string]int{"plan": 2, "plan-001": 3, "plan-001-002": 2} {
		if sv := m.Steps[name]; sv == nil || sv.MaxIterations != max || sv.Status != StepStatusCompleted {
			t.Errorf("step %s: %+v, want completed with max %d", name, sv, max)
		}
	}
	if sv := m.Steps["plan-001-002"]; sv.Iterations != 2 || sv.JobID != loopJob("plan-001-002", 2, 0) || sv.CancelledJobs != 0 {
		t.Errorf("plan-001-002: iterations %d job %s", sv.Iterations, sv.JobID)
	}
	merges := 0
	for id, j := range m.Jobs {
		if j.Merge {
			merges++
			if j.Step == "" || j.Status == JobStatusRequested {
				t.Errorf("merge job %s: %+v", id, j)
			}
		}
	}
	if j := m.Jobs[sessionID+".plan-001-002.merge2"]; merges != 3 || j == nil || j.Status != JobStatusFailed {
		t.Errorf("%d merge jobs (want 3), the conflicting one %+v", merges, j)
	}
	want := &TargetView{Branch: loopTarget, Base: "main", BaseCommit: baseCommit, Head: commit("h2"), Merges: 2,
		Bundles: []schemas.ArtifactRef{bundleRef("base.bundle"), bundleRef("merge1.bundle"), bundleRef("merge2.bundle")},
		Repo:    "fetcher", Task: "Add a cache to the fetcher"}
	if !reflect.DeepEqual(m.Target, want) {
		t.Errorf("target %+v\nwant %+v", m.Target, want)
	}

	// The statuses on the way.
	at := func(typ, loop string, nth int) *Manifest {
		t.Helper()
		for i, ev := range evs {
			if ev.Type == typ && ev.Step == loop {
				if nth--; nth == 0 {
					return foldAll(evs[:i+1])
				}
			}
		}
		t.Fatalf("no %s of %s", typ, loop)
		return nil
	}
	steps := []struct {
		name   string
		m      *Manifest
		loop   string
		status string
		check  func(t *testing.T, l *LoopView, m *Manifest)
	}{
		{"spawned", at(schemas.TypeLoopSpawned, "plan-001-001", 1), "plan-001-001", LoopStatusRunning, nil},
		{"passed with changes", at(schemas.TypeStepCompleted, "plan-001-001", 1), "plan-001-001", LoopStatusMerging, func(t *testing.T, l *LoopView, m *Manifest) {
			if l.Commit != commit("c1") || l.MergeCommit != "" {
				t.Errorf("commit %s merge commit %s", l.Commit, l.MergeCommit)
			}
		}},
		{"merge job running", at(schemas.TypeJobStarted, "plan-001-001", 2), "plan-001-001", LoopStatusMerging, func(t *testing.T, l *LoopView, m *Manifest) {
			sv := m.Steps["plan-001-001"]
			if sv.Status != StepStatusCompleted || sv.JobID != loopJob("plan-001-001", 1, 0) || sv.Iterations != 1 || sv.Worker != "w1" {
				t.Errorf("the merge job changed the step: %+v", sv)
			}
			if j := m.Jobs[sessionID+".plan-001-001.merge1"]; j == nil || !j.Merge || j.Status != JobStatusRunning || j.Worker != "w2" {
				t.Errorf("merge job %+v", j)
			}
		}},
		{"merged", at(schemas.TypeLoopMerged, "plan-001-001", 1), "plan-001-001", LoopStatusCompleted, func(t *testing.T, l *LoopView, m *Manifest) {
			if l.MergeCommit != commit("h1") || m.Target.Head != commit("h1") || m.Target.Merges != 1 || len(m.Target.Bundles) != 2 {
				t.Errorf("merge commit %s, target %+v", l.MergeCommit, m.Target)
			}
		}},
		{"a rebase without conflict changes nothing", at(schemas.TypeLoopRebase, "plan-001-002", 1), "plan-001-002", LoopStatusRunning, func(t *testing.T, l *LoopView, m *Manifest) {
			if l.Rebases != 0 {
				t.Errorf("rebases %d", l.Rebases)
			}
		}},
		{"merge conflicted: still merging", at(schemas.TypeJobFailed, "plan-001-002", 1), "plan-001-002", LoopStatusMerging, func(t *testing.T, l *LoopView, m *Manifest) {
			if sv := m.Steps["plan-001-002"]; sv.Status != StepStatusCompleted || sv.LastFeedback != "" {
				t.Errorf("the failed merge job changed the step: %+v", sv)
			}
		}},
		{"rebased after the conflict", at(schemas.TypeLoopRebase, "plan-001-002", 2), "plan-001-002", LoopStatusRunning, func(t *testing.T, l *LoopView, m *Manifest) {
			sv := m.Steps["plan-001-002"]
			if l.Rebases != 1 || l.Commit != "" || sv.Status != StepStatusInProgress || sv.CompletedAt != nil || sv.Iterations != 1 ||
				!bytes.Contains([]byte(sv.LastFeedback), []byte("conflicted on a.txt")) {
				t.Errorf("loop %+v step %+v", l, sv)
			}
		}},
		{"next iteration", at(schemas.TypeJobRequested, "plan-001-002", 3), "plan-001-002", LoopStatusRunning, func(t *testing.T, l *LoopView, m *Manifest) {
			if l.Iterations != 2 {
				t.Errorf("iterations %d", l.Iterations)
			}
		}},
		{"invalidated", at(schemas.TypeLoopInvalidated, "plan-002-001", 1), "plan-002-001", LoopStatusInvalidated, func(t *testing.T, l *LoopView, m *Manifest) {
			if j := m.Jobs[loopJob("plan-002-001", 1, 0)]; j.Status != JobStatusCancelled {
				t.Errorf("job %+v", j)
			}
		}},
		{"its parent runs again", at(schemas.TypeStepInvalidated, "plan-002", 1), "plan-002", LoopStatusRunning, func(t *testing.T, l *LoopView, m *Manifest) {
			if sv := m.Steps["plan-002"]; sv.Status != StepStatusPending || l.Iterations != 0 {
				t.Errorf("step %+v, loop %+v", sv, l)
			}
		}},
		{"spawned again", at(schemas.TypeLoopSpawned, "plan-002-001", 2), "plan-002-001", LoopStatusRunning, func(t *testing.T, l *LoopView, m *Manifest) {
			if l.Generation != 1 || l.Title != `"c2"` || m.Loops[len(m.Loops)-1].ID != "plan-002-001" || m.Steps["plan-002-001"].Status != StepStatusPending {
				t.Errorf("loop %+v, loops %+v", l, m.Loops)
			}
		}},
		{"passed without changes", at(schemas.TypeStepCompleted, "plan-002-001", 1), "plan-002-001", LoopStatusCompleted, func(t *testing.T, l *LoopView, m *Manifest) {
			if l.Commit != "" || l.MergeCommit != "" {
				t.Errorf("loop %+v", l)
			}
		}},
	}
	for _, tc := range steps {
		t.Run(tc.name, func(t *testing.T) {
			l := tc.m.loop(tc.loop)
			if l == nil || l.Status != tc.status {
				t.Fatalf("loop %s: %+v, want status %s", tc.loop, l, tc.status)
			}
			if tc.check != nil {
				tc.check(t, l, tc.m)
			}
		})
	}
}

// TestLoopFailsAndMergeJobCancelled: a loop whose step fails is failed; a
// cancelled merge job leaves the step alone.
func TestLoopFailsAndMergeJobCancelled(t *testing.T) {
	b := loopsBuilder{&builder{}}
	b.add(sessionID, schemas.TypeSessionStarted, "", "", &schemas.SessionStarted{Pipeline: loopsPipeline(),
		Loops: &schemas.LoopsStart{Task: "t", BaseCommit: baseCommit, Target: loopTarget}})
	b.spawn("plan", "", "plan", 0, 0, "t")
	b.spawn("plan-001", "plan", "code", 1, 0, "x") // as if plan had passed
	job := b.request("plan-001", 1, 0, baseCommit)
	c := &schemas.GitResult{Commit: commit("c"), Base: baseCommit, Changed: true}
	b.done("plan-001", job, 1, c, true)
	b.stepCompleted(sessionID, "plan-001", job, 1, "")
	mj := b.merge("plan-001", 1, 1, c, baseCommit)
	b.cancel(sessionID, "plan-001", mj, 1, "session stopped")
	m := foldAll(b.evs)
	if sv := m.Steps["plan-001"]; sv.Status != StepStatusCompleted || sv.CancelledJobs != 0 || sv.Iterations != 1 {
		t.Errorf("a cancelled merge job changed the step: %+v", sv)
	}
	if l := m.loop("plan-001"); l.Status != LoopStatusMerging {
		t.Errorf("loop %+v", l)
	}
	job = b.request("plan", 1, 0, "")
	b.stepFailed(sessionID, "plan", 2, "no valid plan")
	m = foldAll(b.evs)
	if l := m.loop("plan"); l.Status != LoopStatusFailed || l.Iterations != 2 || l.Branch != "" {
		t.Errorf("loop %+v", l)
	}
	// No target branch without worktree levels and a loops start.
	p := loopsPipeline()
	p.Loops.Levels[2].Worktree = false
	m = BuildManifest(sessionID, []schemas.Event{{Type: schemas.TypeSessionStarted, Session: sessionID, Seq: 1, Data: &schemas.SessionStarted{Pipeline: p,
		Loops: &schemas.LoopsStart{Task: "t"}}}})
	if m.Target == nil || m.Target.Branch != "" || m.Kind != schemas.KindLoops || len(m.LoopLevels) != 3 {
		t.Errorf("manifest %+v target %+v", m, m.Target)
	}
	// The JSON names are an interface.
	b2, _ := json.Marshal(LoopView{ID: "a", Parent: "p", Level: "l", Status: "running", Iterations: 1, Branch: "b", MergeCommit: "m"})
	if got := string(b2); got != `{"id":"a","parent":"p","level":"l","index":0,"status":"running","iterations":1,"branch":"b","mergeCommit":"m"}` {
		t.Errorf("LoopView JSON %s", got)
	}
}
