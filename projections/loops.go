package projections

import (
	"slices"
	"strings"

	"github.com/loopbus/loopbus/backlog"
	"github.com/loopbus/loopbus/schemas"
)

// The manifest of a loops session: its loop tree and target branch,
// folded from loop.* events and from the steps its loops run as.

// startLoops sets up a loops session from its session.started.
func (m *Manifest) startLoops(session string, d *schemas.SessionStarted) {
	m.Kind = schemas.KindLoops
	for _, lv := range d.Pipeline.Loops.Levels {
		if lv.Name == "" || m.loopLevel(lv.Name) != nil {
			continue // malformed: keep the first of duplicate names
		}
		m.LoopLevels = append(m.LoopLevels, LoopLevelView{Name: lv.Name, MaxIterations: max(lv.MaxIterations, 1), Worktree: lv.Worktree})
	}
	m.startTarget(session, d)
}

// startTarget sets up the target branch of a session that works on a
// repository (a loops session, a backlog with workdir: repo).
func (m *Manifest) startTarget(session string, d *schemas.SessionStarted) {
	st := d.Loops
	if st == nil {
		return
	}
	t := &TargetView{Branch: st.Target, Base: st.Base, BaseCommit: st.BaseCommit, Head: st.BaseCommit,
		Repo: st.Repo, Task: paragraph(firstLine(st.Task))}
	if t.Branch == "" && d.Pipeline.Loops != nil && d.Pipeline.Loops.NeedsRepo() {
		t.Branch = "loopbus/" + session
	}
	if st.Bundle != nil && st.Bundle.Object != "" {
		t.Bundles = []schemas.ArtifactRef{*st.Bundle}
	}
	m.Target = t
}

// loopSpawned adds a loop and its step, or, for a loop spawned again,
// starts both over in their places.
func (m *Manifest) loopSpawned(d *schemas.LoopSpawned) {
	lv := m.loopLevel(d.Level)
	if m.Kind != schemas.KindLoops || d.Loop == "" || lv == nil {
		return
	}
	v := LoopView{ID: d.Loop, Parent: d.Parent, Level: d.Level, Index: d.Index, Title: paragraph(d.Title),
		Status: LoopStatusRunning, Generation: d.Generation}
	if lv.Worktree {
		v.Branch = "loopbus/" + m.ContentID + "/" + d.Loop
	}
	if lp := m.loop(d.Loop); lp != nil {
		*lp = v
	} else {
		m.Loops = append(m.Loops, v)
	}
	sv := m.runStep(d.Loop, lv.MaxIterations)
	// What an earlier generation produced no longer stands; a hold does.
	sv.ContentHash, sv.SchemaVersion, sv.LastFeedback = "", "", ""
	sv.CompletedAt, sv.Artifacts = nil, nil
	m.settle(sv)
}

// loopMerged records a loop's merge into the target branch.
func (m *Manifest) loopMerged(d *schemas.LoopMerged) {
	// A backlog's task runs are merged without being loops of a tree.
	if lp := m.loop(d.Loop); lp != nil {
		lp.Status, lp.MergeCommit = LoopStatusCompleted, d.Head
	}
	m.dropUnmerged(d.Loop)
	if t := m.Target; t != nil {
		t.Head = orElse(d.Head, t.Head)
		t.Merges++
		if d.Bundle.Object != "" {
			t.Bundles = append(t.Bundles, d.Bundle)
		}
	}
}

// loopRebase records a rebase; one after a conflicting merge runs the
// loop again: its step is unfinished, with the conflict as feedback.
func (m *Manifest) loopRebase(d *schemas.LoopRebase) {
	if len(d.Conflict) == 0 {
		return
	}
	m.dropUnmerged(d.Loop) // its next job leaves changes anew
	// A backlog's task run is no loop of a tree: only its step runs again.
	if lp := m.loop(d.Loop); lp != nil {
		lp.Status, lp.Commit = LoopStatusRunning, ""
		lp.Rebases++
	}
	sv := m.Steps[d.Loop]
	if sv == nil {
		return
	}
	if sv.Status == StepStatusCompleted {
		sv.Status = StepStatusInProgress
		sv.ContentHash, sv.SchemaVersion = "", ""
		sv.CompletedAt, sv.Artifacts = nil, nil
		m.settle(sv)
	}
	if r := paragraph(d.Reason); r != "" {
		sv.LastFeedback = r
	}
}

// loopCommit records the commit a loop's current job left.
func (m *Manifest) loopCommit(jobID string, g *schemas.GitResult) {
	j := m.Jobs[jobID]
	if j == nil || j.Merge || j.Status == JobStatusCancelled {
		return
	}
	lp, sv := m.loop(j.Step), m.Steps[j.Step]
	if lp == nil || sv == nil || sv.JobID != jobID || sv.Status == StepStatusCompleted || sv.Status == StepStatusFailed {
		return
	}
	lp.Commit = ""
	if g.Changed {
		lp.Commit = g.Commit
	}
}

// runCommit records, for a backlog with workdir: repo, whether the
// current job of a task run left changes (to merge once the run passes),
// as the orchestrator keeps its candidate. Role runs (bootstrap, repair,
// review) are never merged.
func (m *Manifest) runCommit(jobID string, g *schemas.GitResult) {
	j := m.Jobs[jobID]
	if m.Kind != schemas.KindBacklog || m.Target == nil || j == nil || j.Merge || j.Status == JobStatusCancelled ||
		slices.Contains(backlog.ReservedIDs(), j.Step) {
		return
	}
	if sv := m.Steps[j.Step]; sv == nil || sv.JobID != jobID || sv.Status == StepStatusCompleted || sv.Status == StepStatusFailed {
		return
	}
	m.dropUnmerged(j.Step)
	if g.Changed {
		m.Target.Unmerged = append(m.Target.Unmerged, j.Step)
	}
}

// dropUnmerged takes run name out of the target's unmerged runs.
func (m *Manifest) dropUnmerged(name string) {
	if t := m.Target; t != nil && slices.Contains(t.Unmerged, name) {
		if t.Unmerged = slices.DeleteFunc(t.Unmerged, func(n string) bool { return n == name }); len(t.Unmerged) == 0 {
			t.Unmerged = nil
		}
	}
}

// syncLoop copies the iterations of step name to its loop, if it is one.
func (m *Manifest) syncLoop(name string) {
	if lp, sv := m.loop(name), m.Steps[name]; lp != nil && sv != nil {
		lp.Iterations = sv.Iterations
	}
}

// loop returns the loop id, or nil.
func (m *Manifest) loop(id string) *LoopView {
	if id == "" {
		return nil
	}
	for i := range m.Loops {
		if m.Loops[i].ID == id {
			return &m.Loops[i]
		}
	}
	return nil
}

// loopLevel returns the level named name, or nil.
func (m *Manifest) loopLevel(name string) *LoopLevelView {
	for i := range m.LoopLevels {
		if m.LoopLevels[i].Name == name {
			return &m.LoopLevels[i]
		}
	}
	return nil
}

// firstLine is s's first line that is not blank, trimmed.
func firstLine(s string) string {
	for line := range strings.Lines(s) {
		if t := strings.TrimSpace(line); t != "" {
			return t
		}
	}
	return ""
}

// forkLoops forks a loops session's loop tree as the orchestrator does:
// a loop keeps its results (and its subtree stands) when it had completed
// and its level is not in d.Changed; an invalidated loop under a kept one
// stays so; a loop under one that does not stand, or of a level d's file
// no longer has, goes with its step; every other loop runs again from
// scratch (its step pending). The fork's target branch is its own.
func (m *Manifest) forkLoops(d *schemas.SessionForked) {
	m.LoopLevels = nil
	for _, lv := range d.Pipeline.Loops.Levels {
		if lv.Name != "" && m.loopLevel(lv.Name) == nil {
			m.LoopLevels = append(m.LoopLevels, LoopLevelView{Name: lv.Name, MaxIterations: max(lv.MaxIterations, 1), Worktree: lv.Worktree})
		}
	}
	stands := map[string]bool{}
	loops := m.Loops[:0:0]
	for _, lp := range m.Loops {
		lv := m.loopLevel(lp.Level)
		if lp.Parent != "" && !stands[lp.Parent] || lv == nil {
			delete(m.Steps, lp.ID)
			m.StepOrder = slices.DeleteFunc(m.StepOrder, func(n string) bool { return n == lp.ID })
			continue
		}
		switch {
		case lp.Status == LoopStatusCompleted && !slices.Contains(d.Changed, lp.Level), lp.Status == LoopStatusInvalidated:
			stands[lp.ID] = true
		default:
			lp.Status, lp.Commit, lp.MergeCommit, lp.Rebases, lp.Iterations = LoopStatusRunning, "", "", 0, 0
			if sv := m.Steps[lp.ID]; sv != nil {
				sv.startOver()
				sv.MaxIterations = lv.MaxIterations
			}
		}
		loops = append(loops, lp)
	}
	m.Loops = loops
	m.forkTarget()
}

// forkTarget makes the target branch of a fork its own: it starts at the
// origin's head at the fork point; the runs not merged there run again.
func (m *Manifest) forkTarget() {
	if m.Target != nil && m.Target.Branch != "" {
		m.Target.Branch = "loopbus/" + m.ContentID
	}
	if m.Target != nil {
		m.Target.Unmerged = nil
	}
}
