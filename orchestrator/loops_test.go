package orchestrator

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/loopbus/loopbus/schemas"
)

// The specification of loops sessions: a simulated world answers every job
// the decider requests (agents write their outputs, worktree jobs leave a
// commit, merge jobs merge or conflict), and the table compares the
// decisions that matter, one line each.

// loopsPipeline is plan → spec (headings) → code (headings, worktree).
func loopsPipeline(codeIterations int) schemas.Pipeline {
	return schemas.Pipeline{Name: "add-feature", Kind: schemas.KindLoops, Loops: &schemas.Loops{Levels: []schemas.LoopLevel{
		{Name: "plan", Agent: agent("a.sh"), Outputs: []schemas.Output{{Name: "plan.md", Report: true, ReportText: true}}, MaxIterations: 2,
			Children: &schemas.LoopChildren{Level: "spec", From: "plan.md", Split: schemas.SplitHeadings}},
		{Name: "spec", Agent: agent("a.sh"), Outputs: []schemas.Output{{Name: "spec.md", Report: true, ReportText: true}}, MaxIterations: 2,
			Children: &schemas.LoopChildren{Level: "code", From: "spec.md", Split: schemas.SplitHeadings}},
		{Name: "code", Agent: agent("a.sh"), Worktree: true, Validate: []string{"sh", "test.sh"}, MaxIterations: codeIterations},
	}}}
}

const baseCommit = "b000000000000000000000000000000000000000"

func loopsStarted(p schemas.Pipeline) schemas.Event {
	ev := started(p)
	bundle := art("", "base.bundle")
	ev.Data.(*schemas.SessionStarted).Loops = &schemas.LoopsStart{Task: "Add greetings", Repo: "demo", Base: "main", BaseCommit: baseCommit,
		Bundle: &bundle, Target: TargetOf(sess)}
	return ev
}

// loopWorld scripts the simulated agents and merges. agent returns the
// report of a job's first output and whether its validation passes; merge
// returns the files a merge job conflicts on (none: it merges).
type loopWorld struct {
	agent func(jr *schemas.JobRequested) (report string, pass bool)
	merge func(jr *schemas.JobRequested) []string
	// during injects events (signals) when a job is requested.
	during map[string][]schemas.Event
	// record, when set, gets every event applied, in order.
	record func(schemas.Event)
	// summary, when set, is the agent of a backlog's runs (in place of
	// agent): its report is validated as simulate's are.
	summary agentScript
}

// twoSections writes two "## " sections for plan and spec loops.
func twoSections(jr *schemas.JobRequested) (string, bool) {
	return fmt.Sprintf("# %s\n## first part of %s\ntext\n## second part of %s\ntext\n", jr.Step, jr.Step, jr.Step), true
}

func commitOf(id string) string { return fmt.Sprintf("%x", schemas.Digest([]byte(id)))[7:47] }

func simulateLoops(t *testing.T, start schemas.Event, w loopWorld) (lines []string, reqs map[string]*schemas.JobRequested) {
	t.Helper()
	lines, reqs, _ = runLoops(t, start, w)
	return lines, reqs
}

// runLoops is simulateLoops that also returns the state it ends in. An
// approval gate reached (approval.requested of job J) is answered by
// during["gate J"].
func runLoops(t *testing.T, start schemas.Event, w loopWorld) (lines []string, reqs map[string]*schemas.JobRequested, st *State) {
	t.Helper()
	st = NewState()
	lines, reqs = driveLoops(t, st, sess, []schemas.Event{start}, w)
	return lines, reqs, st
}

// driveLoops runs session on st from queue (events to apply, each then
// decided on) as runLoops does; a first event already applied to st (a
// session.forked, prepared and folded) is marked by its Seq, which is
// not 0: it is only decided on.
func driveLoops(t *testing.T, st *State, session string, queue []schemas.Event, w loopWorld) (lines []string, reqs map[string]*schemas.JobRequested) {
	t.Helper()
	reqs = map[string]*schemas.JobRequested{}
	cat, err := schemas.NewCatalogue()
	if err != nil {
		t.Fatal(err)
	}
	seq := uint64(0)
	if len(queue) > 0 {
		seq = queue[0].Seq
	}
	apply := func(ev schemas.Event) {
		if ev.Seq != 0 && ev.Seq == seq {
			return // applied already
		}
		seq++
		ev.Seq = seq
		if err := Check(st, ev); err != nil {
			t.Fatalf("event %s: %v", ev.Type, err)
		}
		Evolve(st, ev)
		if w.record != nil {
			w.record(ev)
		}
	}
	runs := map[string]int{}
	answer := func(jr *schemas.JobRequested) []schemas.Event {
		mk := func(typ string, data any) schemas.Event {
			return schemas.Event{ID: typ + "-" + jr.JobID, Type: typ, Session: session, Step: jr.Step, Job: jr.JobID, Data: data}
		}
		if wt := jr.Worktree; wt != nil && wt.Merge {
			if w.merge != nil {
				if files := w.merge(jr); len(files) > 0 {
					return []schemas.Event{mk(schemas.TypeJobFailed, &schemas.JobFailed{JobID: jr.JobID, Step: jr.Step, Iteration: jr.Iteration, Worker: "w",
						Error: "conflict", Conflict: files})}
				}
			}
			head := commitOf("merge " + jr.JobID)
			return []schemas.Event{mk(schemas.TypeJobCompleted, &schemas.JobCompleted{JobID: jr.JobID, Step: jr.Step, Iteration: jr.Iteration, Worker: "w",
				Git: &schemas.GitResult{Commit: head, Base: wt.Base, Bundle: ref(art("", "merge.bundle")), Changed: true}})}
		}
		jc := &schemas.JobCompleted{JobID: jr.JobID, Step: jr.Step, Iteration: jr.Iteration, Worker: "w"}
		if wt := jr.Worktree; wt != nil {
			jc.Git = &schemas.GitResult{Commit: commitOf(jr.JobID), Base: wt.Base, Bundle: ref(art(jr.Step, "loop.bundle")), Changed: true}
		}
		if w.summary != nil {
			runs[jr.Step]++
			v := simVerdict(t, jr, w.summary(jr, runs[jr.Step]))
			v.Session = session
			jc.Artifacts = v.Data.(*schemas.Verdict).Artifacts
			return []schemas.Event{mk(schemas.TypeArtifactStored, &schemas.ArtifactStored{JobID: jr.JobID, Artifact: jc.Artifacts[0]}), mk(schemas.TypeJobCompleted, jc), v}
		}
		report, pass := w.agent(jr)
		v := &schemas.Verdict{JobID: jr.JobID, Step: jr.Step, Iteration: jr.Iteration}
		typ := schemas.TypeValidationPassed
		if !pass {
			typ = schemas.TypeValidationFailed
			v.Errors = []schemas.ValidationError{{Message: "test.sh failed in " + jr.JobID, Source: "command"}}
		} else if len(jr.Outputs) > 0 {
			raw, _ := json.Marshal(report)
			v.Reports = []schemas.Report{{Name: jr.Outputs[0].Name, Content: raw}}
			v.Artifacts = []schemas.ArtifactRef{art(jr.Step, jr.Outputs[0].Name)}
		}
		// As the worker and the validator do: the artifacts are stored,
		// then named by the result, then by the verdict.
		jc.Artifacts = v.Artifacts
		var evs []schemas.Event
		for _, a := range jc.Artifacts {
			evs = append(evs, mk(schemas.TypeArtifactStored, &schemas.ArtifactStored{JobID: jr.JobID, Artifact: a}))
		}
		return append(evs, mk(schemas.TypeJobCompleted, jc), mk(typ, v))
	}
	for n := 0; len(queue) > 0 && n < 600; n++ {
		trigger := queue[0]
		queue = queue[1:]
		apply(trigger)
		for out := written(Decide(st, trigger, fixedNow)); len(out) > 0; out = written(Decide(st, trigger, fixedNow)) {
			for _, o := range out {
				// Every decision must be recordable: its data fits the
				// catalogue's schema.
				if _, err := cat.Encode(o.Type, o.Data); err != nil {
					t.Fatalf("decided %s: %v", o.Type, err)
				}
				if l := loopLine(o); l != "" {
					lines = append(lines, l)
				}
				apply(o)
				if jr, ok := o.Data.(*schemas.JobRequested); ok {
					reqs[jr.JobID] = jr
					queue = append(queue, w.during[jr.JobID]...)
					queue = append(queue, answer(jr)...)
				}
				if ar, ok := o.Data.(*schemas.ApprovalRequested); ok {
					queue = append(queue, w.during["gate "+ar.JobID]...)
				}
			}
			trigger = out[len(out)-1]
		}
	}
	return lines, reqs
}

func loopLine(ev schemas.Event) string {
	typ := strings.TrimPrefix(ev.Type, "loopbus.")
	switch d := ev.Data.(type) {
	case *schemas.LoopSpawned:
		return fmt.Sprintf("%s %s", typ, d.Loop)
	case *schemas.JobRequested:
		s := typ + " " + d.JobID
		if wt := d.Worktree; wt != nil && !wt.Merge && wt.From != "" {
			s += " carry"
		}
		if len(d.Feedback) > 0 {
			s += fmt.Sprintf(" feedback=%d", len(d.Feedback))
		}
		return s
	case *schemas.LoopMerged:
		return fmt.Sprintf("%s %s #%d", typ, d.Loop, d.Position)
	case *schemas.LoopRebase:
		if len(d.Conflict) > 0 {
			return fmt.Sprintf("%s %s conflict=%s", typ, d.Loop, strings.Join(d.Conflict, ","))
		}
		return fmt.Sprintf("%s %s after %s", typ, d.Loop, d.Cause)
	case *schemas.LoopInvalidated:
		return fmt.Sprintf("%s %s", typ, d.Loop)
	case *schemas.JobCancelled:
		return typ + " " + d.JobID
	case *schemas.StepInvalidated:
		return fmt.Sprintf("%s %s", typ, d.Step)
	case *schemas.StepPaused:
		return fmt.Sprintf("%s %s %s", typ, d.Step, d.Kind)
	case *schemas.SessionCompleted, *schemas.SessionFailed, *schemas.StepFailed:
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

func TestLoopsDecisions(t *testing.T) {
	spawned := func(ids ...string) []string {
		var out []string
		for _, id := range ids {
			out = append(out, "loop.spawned "+id)
		}
		return out
	}
	tests := []struct {
		name     string
		pipeline schemas.Pipeline
		world    loopWorld
		want     []string
	}{
		{
			name:     "plan, two specs, two code loops each, merged in pass order",
			pipeline: loopsPipeline(3),
			world:    loopWorld{agent: twoSections},
			want: slices.Concat(
				spawned("plan"), []string{"job.requested s1.plan.1"},
				spawned("plan-001", "plan-002"), []string{"job.requested s1.plan-001.1", "job.requested s1.plan-002.1"},
				spawned("plan-001-001", "plan-001-002"), []string{"job.requested s1.plan-001-001.1", "job.requested s1.plan-001-002.1"},
				spawned("plan-002-001", "plan-002-002"), []string{"job.requested s1.plan-002-001.1", "job.requested s1.plan-002-002.1",
					"job.requested s1.plan-001-001.merge1",
					"loop.merged plan-001-001 #1",
					"job.requested s1.plan-001-002.merge2", "loop.merged plan-001-002 #2",
					"job.requested s1.plan-002-001.merge3", "loop.merged plan-002-001 #3",
					"job.requested s1.plan-002-002.merge4", "loop.merged plan-002-002 #4",
					"session.completed",
				}),
		},
		{
			name:     "a code loop passes on its second iteration with the first verdict, carrying its work",
			pipeline: loopsPipeline(3),
			world: loopWorld{agent: func(jr *schemas.JobRequested) (string, bool) {
				if jr.Step == "plan" || jr.Step == "plan-001" {
					return fmt.Sprintf("## only part of %s\n", jr.Step), true
				}
				return "", jr.Iteration == 2
			}},
			want: slices.Concat(
				spawned("plan"), []string{"job.requested s1.plan.1"},
				spawned("plan-001"), []string{"job.requested s1.plan-001.1"},
				spawned("plan-001-001"), []string{"job.requested s1.plan-001-001.1",
					"job.requested s1.plan-001-001.2 carry feedback=1",
					"job.requested s1.plan-001-001.merge1", "loop.merged plan-001-001 #1", "session.completed"}),
		},
		{
			name:     "a conflicting merge gives the loop a free iteration on the new head",
			pipeline: loopsPipeline(1),
			world: loopWorld{
				agent: func(jr *schemas.JobRequested) (string, bool) {
					if jr.Step == "plan" {
						return "## one\n", true
					}
					return twoSections(jr)
				},
				merge: func(jr *schemas.JobRequested) []string {
					if jr.JobID == "s1.plan-001-002.merge2" {
						return []string{"greet.txt"}
					}
					return nil
				},
			},
			want: slices.Concat(
				spawned("plan"), []string{"job.requested s1.plan.1"},
				spawned("plan-001"), []string{"job.requested s1.plan-001.1"},
				spawned("plan-001-001", "plan-001-002"), []string{"job.requested s1.plan-001-001.1", "job.requested s1.plan-001-002.1",
					"job.requested s1.plan-001-001.merge1", "loop.merged plan-001-001 #1",
					"job.requested s1.plan-001-002.merge2", "loop.rebase plan-001-002 conflict=greet.txt",
					"job.requested s1.plan-001-002.2 feedback=1",
					"job.requested s1.plan-001-002.merge3", "loop.merged plan-001-002 #2", "session.completed"}),
		},
		{
			name:     "invalidating a spec mid-run cancels and respawns its subtree",
			pipeline: loopsPipeline(3),
			world: loopWorld{
				agent: func(jr *schemas.JobRequested) (string, bool) {
					if jr.Step == "plan" {
						return "## one\n", true
					}
					return twoSections(jr)
				},
				during: map[string][]schemas.Event{"s1.plan-001-002.1": {signal(1, "invalidate", "plan-001")}},
			},
			want: slices.Concat(
				spawned("plan"), []string{"job.requested s1.plan.1"},
				spawned("plan-001"), []string{"job.requested s1.plan-001.1"},
				spawned("plan-001-001", "plan-001-002"), []string{"job.requested s1.plan-001-001.1", "job.requested s1.plan-001-002.1",
					// plan-001-001 passed and waits for its merge: the merge's
					// result no longer counts.
					"job.requested s1.plan-001-001.merge1",
					"loop.invalidated plan-001-001", "job.cancelled s1.plan-001-002.1", "loop.invalidated plan-001-002", "step.invalidated plan-001",
					"job.requested s1.plan-001.1.r1"},
				spawned("plan-001-001", "plan-001-002"), []string{"job.requested s1.plan-001-001.1.r1", "job.requested s1.plan-001-002.1.r2",
					"job.requested s1.plan-001-001.merge2", "loop.merged plan-001-001 #1",
					"job.requested s1.plan-001-002.merge3", "loop.merged plan-001-002 #2", "session.completed"}),
		},
		{
			name:     "stopping a spec stops its subtree",
			pipeline: loopsPipeline(3),
			world: loopWorld{
				agent: func(jr *schemas.JobRequested) (string, bool) {
					if jr.Step == "plan" {
						return "## one\n", true
					}
					return twoSections(jr)
				},
				during: map[string][]schemas.Event{"s1.plan-001-001.1": {signal(1, "stop", "plan-001")}},
			},
			want: slices.Concat(
				spawned("plan"), []string{"job.requested s1.plan.1"},
				spawned("plan-001"), []string{"job.requested s1.plan-001.1"},
				spawned("plan-001-001", "plan-001-002"), []string{"job.requested s1.plan-001-001.1", "job.requested s1.plan-001-002.1",
					// plan-001 itself passed: its loops still running stop.
					"job.cancelled s1.plan-001-001.1", "step.paused plan-001-001 stop",
					"job.cancelled s1.plan-001-002.1", "step.paused plan-001-002 stop"}),
		},
		{
			name:     "a child that uses up its iterations sends its parent round again, then fails the session",
			pipeline: loopsPipeline(1),
			world: loopWorld{agent: func(jr *schemas.JobRequested) (string, bool) {
				if jr.Step == "plan" || jr.Step == "plan-001" {
					return fmt.Sprintf("## only part of %s\n", jr.Step), true
				}
				return "", false
			}},
			want: slices.Concat(
				spawned("plan"), []string{"job.requested s1.plan.1"},
				spawned("plan-001"), []string{"job.requested s1.plan-001.1"},
				spawned("plan-001-001"), []string{"job.requested s1.plan-001-001.1",
					"step.failed plan-001-001: no valid output after 1 of 1 iterations; last error: test.sh failed in s1.plan-001-001.1",
					"loop.invalidated plan-001-001", "step.invalidated plan-001", "job.requested s1.plan-001.1.r1 feedback=1"},
				spawned("plan-001-001"), []string{"job.requested s1.plan-001-001.1.r1",
					"step.failed plan-001-001: no valid output after 1 of 1 iterations; last error: test.sh failed in s1.plan-001-001.1.r1",
					"loop.invalidated plan-001-001", "step.invalidated plan-001", "job.requested s1.plan-001.1.r2 feedback=1"},
				spawned("plan-001-001"), []string{"job.requested s1.plan-001-001.1.r2",
					"step.failed plan-001-001: no valid output after 1 of 1 iterations; last error: test.sh failed in s1.plan-001-001.1.r2",
					"session.failed"}),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, _ := simulateLoops(t, loopsStarted(tt.pipeline), tt.world)
			if !slices.Equal(got, tt.want) {
				t.Errorf("decisions:\n  got  %s\n  want %s", strings.Join(got, "\n       "), strings.Join(tt.want, "\n       "))
			}
		})
	}
}

func TestLoopsJobRequests(t *testing.T) {
	fails := loopWorld{
		agent: func(jr *schemas.JobRequested) (string, bool) {
			if jr.Step == "plan" || jr.Step == "plan-001" {
				return "intro\n## Add greet\nsay hello\n", true
			}
			return "", jr.Iteration == 2
		},
	}
	_, reqs := simulateLoops(t, loopsStarted(loopsPipeline(3)), fails)
	spec := reqs["s1.plan-001.1"]
	if len(spec.Files) != 1 || spec.Files[0].Name != "plan.md" || spec.Files[0].Content != "## Add greet\nsay hello\n" {
		t.Errorf("spec's inline input = %+v, want its section of plan.md", spec.Files)
	}
	if !strings.Contains(spec.Prompt, "Add greetings") || !strings.Contains(spec.Prompt, "## Add greet") {
		t.Errorf("spec's prompt lacks the task or its part:\n%s", spec.Prompt)
	}
	first, second := reqs["s1.plan-001-001.1"], reqs["s1.plan-001-001.2"]
	if first.Worktree == nil || first.Worktree.Base != baseCommit || first.Worktree.From != "" || first.Worktree.Branch != "loopbus/s1/plan-001-001" {
		t.Fatalf("first code job's worktree = %+v", first.Worktree)
	}
	if w := second.Worktree; w.From != commitOf(first.JobID) || w.FromBase != baseCommit || len(w.Bundles) != 2 {
		t.Errorf("second code job's worktree = %+v, want it to carry the first's commit", w)
	}
	if !strings.Contains(second.Prompt, "test.sh failed in s1.plan-001-001.1") {
		t.Errorf("second code job's prompt lacks the first verdict:\n%s", second.Prompt)
	}
	merge := reqs["s1.plan-001-001.merge1"]
	if w := merge.Worktree; !w.Merge || w.Base != baseCommit || w.From != commitOf(second.JobID) || w.Branch != "loopbus/s1" {
		t.Errorf("merge job's worktree = %+v", w)
	}
}

func TestSplitArtifact(t *testing.T) {
	str := func(s string) json.RawMessage { b, _ := json.Marshal(s); return b }
	tests := []struct {
		name    string
		raw     json.RawMessage
		c       schemas.LoopChildren
		want    []string
		wantErr string
	}{
		{name: "headings", raw: str("# T\nintro\n## a\nx\n```\n## not a heading\n```\n## b\ny\n"), c: schemas.LoopChildren{From: "p.md", Split: schemas.SplitHeadings},
			want: []string{"## a\nx\n```\n## not a heading\n```\n", "## b\ny\n"}},
		{name: "no heading", raw: str("just text"), c: schemas.LoopChildren{From: "p.md", Split: schemas.SplitHeadings}, wantErr: "no \"## \" heading"},
		{name: "whole", raw: str("all of it"), c: schemas.LoopChildren{From: "p.md"}, want: []string{"all of it"}},
		{name: "json", raw: json.RawMessage(`{"items":[{"a":1},"b"]}`), c: schemas.LoopChildren{From: "p.json", Split: schemas.SplitJSON, Path: "/items"},
			want: []string{"{\n  \"a\": 1\n}\n", "\"b\"\n"}},
		{name: "json empty", raw: json.RawMessage(`[]`), c: schemas.LoopChildren{From: "p.json", Split: schemas.SplitJSON}, wantErr: "empty"},
		{name: "json no array", raw: json.RawMessage(`{"items":3}`), c: schemas.LoopChildren{From: "p.json", Split: schemas.SplitJSON, Path: "/items"}, wantErr: "no JSON array at /items"},
		{name: "missing", c: schemas.LoopChildren{From: "p.md"}, wantErr: "no content of p.md"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := SplitArtifact(tt.raw, &tt.c)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil || !slices.Equal(got, tt.want) {
				t.Errorf("got %q, %v; want %q", got, err, tt.want)
			}
		})
	}
}

func ref(a schemas.ArtifactRef) *schemas.ArtifactRef { return &a }
