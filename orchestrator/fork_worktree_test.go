package orchestrator

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/loopbus/loopbus/schemas"
)

// The specification of forking a loops session whose code loops work in
// git worktrees: the fork's target branch is its own and starts at the
// origin's target head at the fork point; loops merged there are kept,
// the others run again on that head and merge into the fork's target
// (given events → then events).

// worktreeRun is the events of a loopsPipeline session run to its end,
// and the first loop.merged among them.
func worktreeRun(t *testing.T, p schemas.Pipeline) (evs []schemas.Event, merged schemas.Event) {
	t.Helper()
	runLoops(t, loopsStarted(p), loopWorld{agent: twoSections, record: func(ev schemas.Event) { evs = append(evs, ev) }})
	if last := evs[len(evs)-1]; last.Type != schemas.TypeSessionCompleted {
		t.Fatalf("the origin ended with %s", last.Type)
	}
	i := slices.IndexFunc(evs, func(ev schemas.Event) bool { return ev.Type == schemas.TypeLoopMerged })
	if i < 0 {
		t.Fatal("the origin merged nothing")
	}
	return evs, evs[i]
}

func TestForkWorktreeLoops(t *testing.T) {
	done, first := worktreeRun(t, loopsPipeline(1))
	m := first.Data.(*schemas.LoopMerged)
	s := (&stream{}).add(done...)
	s.add(s.forkLoops(t, first.ID, nil)...)
	st, refused := foldStream(t, s)
	if len(refused) > 0 {
		t.Fatalf("refused: %v", refused)
	}
	f := st.Sessions[forkSess]
	if f == nil || f.Loops == nil {
		t.Fatalf("fork %+v", f)
	}
	// The fork's target starts at the origin's head at the point, with
	// the bundles that bring a worker there.
	l := f.Loops
	if l.Head != m.Head || l.Start.Target != TargetOf(forkSess) || l.Start.BaseCommit != baseCommit || l.Merges != 1 {
		t.Errorf("the fork's target: head %s (want %s), target %s, base %s, merges %d", l.Head, m.Head, l.Start.Target, l.Start.BaseCommit, l.Merges)
	}
	if len(l.Bundles) != 2 || l.Bundles[0].Name != "base.bundle" || l.Bundles[1] != m.Bundle {
		t.Errorf("the fork's bundles: %+v", l.Bundles)
	}
	// The merged loop is kept; the other code loops (running, or passed
	// and queued at the point) run again.
	var tree []string
	for _, id := range sortedLoopIDs(l) {
		lp := l.Loops[id]
		tree = append(tree, id+":"+lp.Status)
		if lp.Level == "code" && lp.Status == LoopRunning && lp.Base != m.Head {
			t.Errorf("loop %s runs again on %s, want the head at the point %s", id, lp.Base, m.Head)
		}
	}
	want := "plan:completed plan-001:completed plan-001-001:completed plan-001-002:running plan-002:completed plan-002-001:running plan-002-002:running"
	if m.Loop != "plan-001-001" || strings.Join(tree, " ") != want {
		t.Errorf("first merged %s; the fork's tree:\n  %s\nwant:\n  %s", m.Loop, strings.Join(tree, " "), want)
	}
	if l.Loops["plan-001-001"].MergeCommit != m.Head {
		t.Errorf("the kept loop's merge: %+v", l.Loops["plan-001-001"])
	}

	// Then: the fork reruns the unmerged loops on its head, merges them
	// into its own target, one at a time, and completes.
	forked := s.evs[len(s.evs)-1]
	lines, reqs := driveLoops(t, st, forkSess, []schemas.Event{forked}, loopWorld{agent: twoSections})
	wantLines := []string{
		"job.requested f1.plan-001-002.1.r1", "job.requested f1.plan-002-001.1.r1", "job.requested f1.plan-002-002.1.r1",
		"job.requested f1.plan-001-002.merge1", "loop.merged plan-001-002 #2",
		"job.requested f1.plan-002-001.merge2", "loop.merged plan-002-001 #3",
		"job.requested f1.plan-002-002.merge3", "loop.merged plan-002-002 #4",
		"session.completed",
	}
	if strings.Join(lines, "\n") != strings.Join(wantLines, "\n") {
		t.Errorf("the fork ran:\n  %s\nwant:\n  %s", strings.Join(lines, "\n  "), strings.Join(wantLines, "\n  "))
	}
	for id, jr := range reqs {
		wt := jr.Worktree
		switch {
		case wt == nil:
			t.Errorf("job %s without a worktree", id)
		case !strings.HasPrefix(wt.Branch, TargetOf(forkSess)):
			t.Errorf("job %s works on branch %s, not the fork's", id, wt.Branch)
		case !wt.Merge && wt.Base != m.Head:
			t.Errorf("job %s starts from %s, want the head at the point %s", id, wt.Base, m.Head)
		case len(wt.Bundles) < 2 || wt.Bundles[1] != m.Bundle:
			t.Errorf("job %s fetches %+v, without the origin's merge at the point", id, wt.Bundles)
		}
	}
	if jr := reqs["f1.plan-001-002.merge1"]; jr == nil || jr.Worktree.Base != m.Head || jr.Worktree.Branch != TargetOf(forkSess) {
		t.Errorf("the fork's first merge: %+v", jr)
	}
	if reqs["f1.plan-001-001.1.r1"] != nil {
		t.Error("the merged loop ran again")
	}
}

// TestForkWorktreeLoopsRefused: a fork that would run again (or drop) a
// loop merged at the fork point is refused: its commits are in the head
// the fork starts from.
func TestForkWorktreeLoopsRefused(t *testing.T) {
	done, first := worktreeRun(t, loopsPipeline(1))
	changed := func(level string) *schemas.Pipeline {
		p := loopsPipeline(1)
		p.Loops.Levels[slices.IndexFunc(p.Loops.Levels, func(l schemas.LoopLevel) bool { return l.Name == level })].Prompt = "better " + level
		return &p
	}
	for _, tc := range []struct {
		name   string
		point  string
		p      *schemas.Pipeline
		reason string
	}{
		{"the code level changed after a merge", first.ID, changed("code"),
			"loops merged into loopbus/s1 at the fork point would run again or go (plan-001-001: their level, or one above them, changed)"},
		{"the spec level changed after a merge", first.ID, changed("spec"),
			"loops merged into loopbus/s1 at the fork point would run again or go (plan-001-001: their level"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := (&stream{}).add(done...)
			s.add(s.forkLoops(t, tc.point, tc.p)...)
			st, refused := foldStream(t, s)
			if err := refused["forked-"+forkSess]; !errors.Is(err, ErrInconsistent) || !strings.Contains(err.Error(), tc.reason) {
				t.Errorf("Check = %v, want %q", err, tc.reason)
			}
			if st.Sessions[forkSess] != nil {
				t.Errorf("the refused fork started")
			}
		})
	}
	// Before the decision that merged the first loop (where loopbus fork
	// moves the point), a changed code level is fine: the loop had
	// passed and its merge job had reported, but it was not merged; it
	// runs again, with the others, on the origin's head before its merge.
	t.Run("before the first merge's decision", func(t *testing.T) {
		s := (&stream{}).add(done...)
		s.add(s.forkLoops(t, beforeDecision(t, done, first.ID), changed("code"))...)
		st, refused := foldStream(t, s)
		f := st.Sessions[forkSess]
		if len(refused) > 0 || f == nil {
			t.Fatalf("refused: %v", refused)
		}
		m := first.Data.(*schemas.LoopMerged)
		if lp := f.Loops.Loops[m.Loop]; lp == nil || lp.Status != LoopRunning || lp.MergeCommit != "" || lp.Base != m.Previous || f.Loops.Head != m.Previous {
			t.Errorf("the loop merged next in the origin: %+v; the fork's head %s, want %s", lp, f.Loops.Head, m.Previous)
		}
		if f.Loops.Merging != "" || len(f.Loops.Queue) > 0 || f.Loops.Merges != m.Position-1 {
			t.Errorf("the fork merges %q (queue %v, %d merges), want nothing of the origin's", f.Loops.Merging, f.Loops.Queue, f.Loops.Merges)
		}
		var lines []string
		for _, ev := range Decide(st, s.evs[len(s.evs)-1], fixedNow) {
			if jr, ok := ev.Data.(*schemas.JobRequested); ok && jr.Step == m.Loop && !strings.HasPrefix(jr.Prompt, "better code") {
				t.Errorf("%s runs %q, want the fork's level", m.Loop, jr.Prompt)
			}
			lines = append(lines, simLine(ev))
		}
		if !slices.Contains(lines, "job.requested f1."+m.Loop+".1.r1") {
			t.Errorf("the fork does not run %s again:\n  %s", m.Loop, strings.Join(lines, "\n  "))
		}
	})

	// Before any merge, a changed code level is fine: every code loop
	// runs again on the origin's base.
	i := slices.IndexFunc(done, func(ev schemas.Event) bool {
		jr, ok := ev.Data.(*schemas.JobRequested)
		return ok && jr.Worktree != nil
	})
	s := (&stream{}).add(done...)
	s.add(s.forkLoops(t, done[i].ID, changed("code"))...)
	st, refused := foldStream(t, s)
	if len(refused) > 0 || st.Sessions[forkSess] == nil || st.Sessions[forkSess].Loops.Head != baseCommit {
		t.Fatalf("fork before any merge: refused %v", refused)
	}
}
