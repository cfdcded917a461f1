package orchestrator

import (
	"errors"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/loopbus/loopbus/schemas"
)

// The specification of forking a backlog with workdir: repo: the fork's
// target branch is its own and starts at the origin's target head at the
// fork point; runs merged there are kept, runs not finished there
// (running, passed and waiting to merge, their merge in flight) run again
// on that head, in jobs of the fork, and merge into the fork's target
// (given events → then events).

// repoBacklog is backlogPipeline(1, "") with workdir: repo.
func repoBacklog() schemas.Pipeline {
	p := backlogPipeline(1, "")
	b := *p.Backlog
	b.Workdir = schemas.WorkdirRepo
	p.Backlog = &b
	return p
}

// repoBacklogRun is a repoBacklog session of three imported tasks, on the
// repository loopsStarted gives, run to its end: each task run leaves a
// commit, merged into the session's target.
func repoBacklogRun(t *testing.T) []schemas.Event {
	t.Helper()
	start := backlogStarted(repoBacklog(), &schemas.BacklogStart{Tasks: []schemas.Task{task("T1", 1, "todo"), task("T2", 2, "todo"), task("T3", 3, "todo")}})
	start.Data.(*schemas.SessionStarted).Loops = loopsStarted(repoBacklog()).Data.(*schemas.SessionStarted).Loops
	var evs []schemas.Event
	driveLoops(t, NewState(), sess, []schemas.Event{start}, loopWorld{summary: doneAll(), record: func(ev schemas.Event) { evs = append(evs, ev) }})
	if last := evs[len(evs)-1]; last.Type != schemas.TypeSessionCompleted {
		t.Fatalf("the origin ended with %s", last.Type)
	}
	if n := count(evs, schemas.TypeLoopMerged); n != 3 {
		t.Fatalf("the origin merged %d runs, want 3", n)
	}
	return evs
}

func count(evs []schemas.Event, typ string) int {
	n := 0
	for _, ev := range evs {
		if ev.Type == typ {
			n++
		}
	}
	return n
}

// repoLine is a decision of a repo backlog, one line (simLine's and
// loopLine's).
func repoLine(ev schemas.Event) string {
	switch ev.Data.(type) {
	case *schemas.TaskSelected, *schemas.BacklogPhase, *schemas.TaskUpdated:
		return simLine(ev)
	}
	return loopLine(ev)
}

// mergeRequested is the id of the merge job.requested of step in evs.
func mergeRequested(t *testing.T, evs []schemas.Event, step string) string {
	t.Helper()
	for _, ev := range evs {
		if jr, ok := ev.Data.(*schemas.JobRequested); ok && jr.Step == step && jr.Worktree != nil && jr.Worktree.Merge {
			return ev.ID
		}
	}
	t.Fatalf("no merge of %s", step)
	return ""
}

func TestForkRepoBacklog(t *testing.T) {
	done := repoBacklogRun(t)
	merged := func(step string) *schemas.LoopMerged {
		for _, ev := range done {
			if m, ok := ev.Data.(*schemas.LoopMerged); ok && m.Loop == step {
				return m
			}
		}
		t.Fatalf("no merge of %s", step)
		return nil
	}
	m1, m2, m3 := merged("T1"), merged("T2"), merged("T3")
	base := done[0].Data.(*schemas.SessionStarted).Loops.Bundle
	// t2Again is the fork's course when T1 is kept and T2 runs again.
	t2Again := []string{
		"job.requested f1.T2.1", "task.updated T2 done", "task.selected T3 run 1 by a", "job.requested f1.T2.merge1", "job.requested f1.T3.1",
		"loop.merged T2 #2", "loop.rebase T3 after T2", "task.updated T3 done", "job.requested f1.T3.merge2", "loop.merged T3 #3",
		"backlog.phase review", "job.requested f1.review.1", "backlog.phase done", "session.completed",
	}
	for _, tc := range []struct {
		name  string
		point string
		// head, merges and bundles are the fork's target at the start;
		// steps its runs (name:status), loops its loops (id:status).
		head    string
		merges  int
		bundles []schemas.ArtifactRef
		steps   string
		loops   string
		// want are the fork's decisions to its end.
		want []string
	}{
		{"after T1 merged, while T2 ran: T1 is kept, T2 runs again on T1's merge", after(t, done, schemas.TypeLoopMerged, "T1", false),
			m1.Head, 1, []schemas.ArtifactRef{*base, m1.Bundle},
			"T1:completed T2:pending", "T1:completed T2:running", t2Again},
		{"after T2 passed, its merge queued: T2 runs again on T1's merge, as its task stands", after(t, done, schemas.TypeStepCompleted, "T2", false),
			m1.Head, 1, []schemas.ArtifactRef{*base, m1.Bundle},
			"T1:completed T2:pending", "T1:completed T2:running", t2Again},
		{"while T1's merge was in flight: the merge stays the origin's, T1 and T2 run again on the base", mergeRequested(t, done, "T1"),
			baseCommit, 0, []schemas.ArtifactRef{*base},
			"T1:pending T2:pending", "T1:running T2:running",
			[]string{
				"job.requested f1.T1.1", "job.requested f1.T2.1", "task.updated T1 done", "job.requested f1.T1.merge1", "task.updated T2 done",
				"task.selected T3 run 1 by a", "job.requested f1.T3.1", "loop.merged T1 #1", "loop.rebase T3 after T1", "job.requested f1.T2.merge2",
				"task.updated T3 done", "loop.merged T2 #2", "job.requested f1.T3.merge3", "loop.merged T3 #3",
				"backlog.phase review", "job.requested f1.review.1", "backlog.phase done", "session.completed",
			}},
		{"while the review ran: every task is kept, the review runs again on the last merge", after(t, done, schemas.TypeJobRequested, schemas.PhaseReview, false),
			m3.Head, 3, []schemas.ArtifactRef{*base, m1.Bundle, m2.Bundle, m3.Bundle},
			"T1:completed T2:completed T3:completed review:pending", "T1:completed T2:completed T3:completed review:running",
			[]string{"job.requested f1.review.1", "backlog.phase done", "session.completed"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := (&stream{}).add(done...)
			s.add(s.forkBacklog(t, tc.point, nil)...)
			st, refused := foldStream(t, s)
			if len(refused) > 0 {
				t.Fatalf("refused: %v", refused)
			}
			f := st.Sessions[forkSess]
			if f == nil || f.Backlog == nil || f.Loops == nil {
				t.Fatalf("fork %+v", f)
			}
			l := f.Loops
			if l.Start.Target != TargetOf(forkSess) || l.Head != tc.head || l.Merges != tc.merges || !slices.Equal(l.Bundles, tc.bundles) || !l.idle() {
				t.Errorf("the fork's target: %s at %s, %d merges, bundles %+v, queue %v merging %q; want %s at %s, %d merges, bundles %+v, idle",
					l.Start.Target, l.Head, l.Merges, l.Bundles, l.Queue, l.Merging, TargetOf(forkSess), tc.head, tc.merges, tc.bundles)
			}
			var steps, loops []string
			for _, name := range slices.Sorted(maps.Keys(f.Steps)) {
				steps = append(steps, name+":"+f.Steps[name].Status)
			}
			for _, id := range sortedLoopIDs(l) {
				lp := l.Loops[id]
				loops = append(loops, id+":"+lp.Status)
				if lp.Status == LoopRunning && (lp.Base != tc.head || lp.Candidate != nil || lp.MergeCommit != "") {
					t.Errorf("loop %s runs again from %s (candidate %+v, merge %q), want from %s afresh", id, lp.Base, lp.Candidate, lp.MergeCommit, tc.head)
				}
			}
			if got := strings.Join(steps, " "); got != tc.steps {
				t.Errorf("runs %s, want %s", got, tc.steps)
			}
			if got := strings.Join(loops, " "); got != tc.loops {
				t.Errorf("loops %s, want %s", got, tc.loops)
			}

			// Then: the fork runs what did not stand on its head, in jobs
			// of its own, merging into its own target, and completes.
			var lines []string
			_, reqs := driveLoops(t, st, forkSess, []schemas.Event{s.evs[len(s.evs)-1]}, loopWorld{summary: doneAll(), record: func(ev schemas.Event) {
				if ev.Session != forkSess {
					t.Errorf("%s of session %s; want the fork's", ev.Type, ev.Session)
				}
				if l := repoLine(ev); l != "" {
					lines = append(lines, l)
				}
			}})
			if strings.Join(lines, "\n") != strings.Join(tc.want, "\n") {
				t.Errorf("the fork ran:\n  %s\nwant:\n  %s", strings.Join(lines, "\n  "), strings.Join(tc.want, "\n  "))
			}
			for id, jr := range reqs {
				wt := jr.Worktree
				switch {
				case wt == nil:
					t.Errorf("job %s without a worktree", id)
				case !strings.HasPrefix(wt.Branch, TargetOf(forkSess)+"/") && wt.Branch != TargetOf(forkSess):
					t.Errorf("job %s works on branch %s, not the fork's", id, wt.Branch)
				case !slices.Equal(wt.Bundles[:len(tc.bundles)], tc.bundles):
					t.Errorf("job %s fetches %+v, want the origin's bundles at the point %+v first", id, wt.Bundles, tc.bundles)
				}
			}
			if tc.merges == 1 {
				if jr := reqs["f1.T2.1"]; jr == nil || jr.Worktree.Base != m1.Head {
					t.Errorf("T2 runs again on %+v, want T1's merge %s", jr, m1.Head)
				}
				if jr := reqs["f1.T2.merge1"]; jr == nil || jr.Worktree.Base != m1.Head || jr.Worktree.Branch != TargetOf(forkSess) {
					t.Errorf("the fork's first merge: %+v", jr)
				}
			}
		})
	}
}

// TestForkRepoBacklogRefused: a fork that would switch between working on
// a repository and not is refused, naming both sides (the other way:
// TestCheckForkBacklog); a changed role with completed runs is refused as
// for other backlogs.
func TestForkRepoBacklogRefused(t *testing.T) {
	repoDone := repoBacklogRun(t)
	plain := backlogPipeline(1, "")
	for _, tc := range []struct {
		name     string
		origin   []schemas.Event
		pipeline *schemas.Pipeline
		reason   string
	}{
		{"a repo backlog with a file without workdir: repo", repoDone, &plain,
			"forks backlog session s1: the origin works on a repository (workdir: repo, target loopbus/s1), and the fork's file has no workdir: repo: a fork keeps its origin's workdir"},
		{"a repo backlog whose iterate role changed after T1 merged", repoDone, ptr(func() schemas.Pipeline {
			p := repoBacklog()
			p.Backlog.Prompts = map[string]string{schemas.RoleIterate: "Do it well: {{.Role}}"}
			return p
		}()), "role iterate changed, and runs of it had completed at the fork point (T1, T2): their changes are in the task list the fork keeps"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			point := after(t, tc.origin, schemas.TypeStepCompleted, "T2", false)
			s := (&stream{}).add(tc.origin...)
			s.add(s.forkBacklog(t, point, tc.pipeline)...)
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
