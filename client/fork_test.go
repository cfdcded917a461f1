package client_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/loopbus/loopbus/client"
	"github.com/loopbus/loopbus/definition"
	"github.com/loopbus/loopbus/internal/testnats"
	"github.com/loopbus/loopbus/projections"
	"github.com/loopbus/loopbus/schemas"
)

// TestFork: the fork point is a stream sequence or an event id of the
// origin, and every other point is refused saying why; a fork of a fork
// runs (its origin read back through the chain), but not from the history
// it copied; another input runs every step again; the sessions list has
// the forks.
func TestFork(t *testing.T) {
	ctx, c := rig(t)
	dir := t.TempDir()
	pipeline := filepath.Join(dir, "chain.yaml")
	if err := os.WriteFile(pipeline, []byte(`name: chain
steps:
  first:
    agent: {backend: exec, command: [sh, -c, "echo 1 > \"$LOOPBUS_OUTPUT_DIR/first.txt\""]}
    prompt: one
    outputs: [{name: first.txt}]
  second:
    requires: [first]
    agent: {backend: exec, command: [sh, -c, "echo 2 > \"$LOOPBUS_OUTPUT_DIR/second.txt\""]}
    prompt: two
    outputs: [{name: second.txt}]
`), 0o644); err != nil {
		t.Fatal(err)
	}
	input := filepath.Join(dir, "in.txt")
	other := filepath.Join(dir, "other.txt")
	for path, body := range map[string]string{input: "x\n", other: "y\n"} {
		if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, s := range []string{"o-1", "o-2"} {
		if m := runSession(t, ctx, c, pipeline, input, s); m.Status != projections.StatusCompleted {
			t.Fatalf("%s: %s %s", s, m.Status, m.Error)
		}
	}
	evs, err := client.Events(ctx, c.Bus(), "o-1", client.Until{})
	if err != nil {
		t.Fatal(err)
	}
	others, err := client.Events(ctx, c.Bus(), "o-2", client.Until{})
	if err != nil {
		t.Fatal(err)
	}
	last := evs[len(evs)-1]
	seq := func(n uint64) string { return strconv.FormatUint(n, 10) }
	for _, tc := range []struct {
		name string
		req  client.ForkRequest
		want error
		says string
	}{
		{"no point", client.ForkRequest{Origin: "o-1"}, client.ErrBadInput, "give the fork point"},
		{"an event of another session", client.ForkRequest{Origin: "o-1", At: seq(others[0].Seq)}, client.ErrBadInput, "is an event of session o-2, not of o-1"},
		{"beyond the end", client.ForkRequest{Origin: "o-1", At: seq(others[len(others)-1].Seq + 50)}, client.ErrBadInput, "beyond the end of session o-1: its last event is at " + seq(last.Seq)},
		{"an unknown id", client.ForkRequest{Origin: "o-1", At: "nope"}, client.ErrBadInput, `no event with id "nope"`},
		{"an unknown session", client.ForkRequest{Origin: "nosuch", At: "1"}, client.ErrNoSession, "nosuch"},
		{"an unsafe id", client.ForkRequest{Origin: "o-1", At: "1", As: "a/b"}, client.ErrBadInput, "--as"},
		{"an id in use", client.ForkRequest{Origin: "o-1", At: "1", As: "o-2"}, client.ErrSessionExists, "o-2"},
		{"into itself", client.ForkRequest{Origin: "o-1", At: "1", As: "o-1"}, client.ErrBadInput, "another id"},
	} {
		if _, err := c.Fork(ctx, tc.req); !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%s: %v, want %v saying %q", tc.name, err, tc.want, tc.says)
		}
	}

	// A pipeline with an output named as the origin's input, without
	// another input.
	clash, err := definition.Load(pipeline)
	if err != nil {
		t.Fatal(err)
	}
	clash.Steps[1].Outputs[0].Name = "in.txt"
	if _, err := c.Fork(ctx, client.ForkRequest{Origin: "o-1", At: "1", As: "f-0", Pipeline: &clash}); !errors.Is(err, client.ErrBadInput) ||
		!strings.Contains(err.Error(), "has the name of step second's output") {
		t.Errorf("fork with an output named as the input: %v", err)
	}

	// At its end by event id, unchanged: everything kept, done at once.
	f, err := c.Fork(ctx, client.ForkRequest{Origin: "o-1", At: last.ID, As: "f-1"})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(f.Kept, []string{"first", "second"}) || len(f.Again) != 0 || f.Seq == 0 || f.Point.Seq != last.Seq {
		t.Errorf("fork: %+v", f)
	}
	if m, err := c.Follow(ctx, "f-1", nil); err != nil || m.Status != projections.StatusCompleted || m.ForkedFrom == nil || m.ForkedFrom.Session != "o-1" {
		t.Fatalf("f-1: %v %+v", err, m)
	}
	// A fork of the fork, with another input: every step runs again.
	fevs, err := client.Events(ctx, c.Bus(), "f-1", client.Until{})
	if err != nil {
		t.Fatal(err)
	}
	forked := slices.IndexFunc(fevs, func(ev schemas.Event) bool { return ev.Type == schemas.TypeSessionForked && ev.ForkOf == "" })
	if forked != len(evs) {
		t.Fatalf("f-1's session.forked at %d, want after its %d copies", forked, len(evs))
	}
	f2, err := c.Fork(ctx, client.ForkRequest{Origin: "f-1", At: seq(fevs[len(fevs)-1].Seq), As: "f-2", Input: other})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(f2.Again, []string{"first", "second"}) {
		t.Errorf("with another input, runs %v", f2.Again)
	}
	m, err := c.Follow(ctx, "f-2", nil)
	if err != nil || m.Status != projections.StatusCompleted || m.Input == nil || m.Input.Name != "other.txt" {
		t.Fatalf("f-2: %v %+v", err, m)
	}
	if j := m.Steps["first"].JobID; j != "f-2.first.1.r1" {
		t.Errorf("f-2 ran first as job %s, want f-2.first.1.r1 (its own, a new round)", j)
	}
	// Not from the history f-1 copied from o-1.
	if _, err := c.Fork(ctx, client.ForkRequest{Origin: "f-1", At: seq(fevs[1].Seq), As: "f-3"}); !errors.Is(err, client.ErrBadInput) ||
		!strings.Contains(err.Error(), "loopbus fork o-1 --at "+evs[1].ID) {
		t.Errorf("fork at a copy: %v", err)
	}
	list, err := c.Sessions(ctx, client.SessionFilter{})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, s := range list {
		ids = append(ids, s.ID)
	}
	if !slices.Contains(ids, "f-1") || !slices.Contains(ids, "f-2") || slices.Contains(ids, "f-3") {
		t.Errorf("sessions: %v", ids)
	}
	forks, err := c.Forks(ctx, "o-1")
	if err != nil || len(forks) != 1 || forks[0].Session != "f-1" || forks[0].Event != last.ID {
		t.Errorf("forks of o-1: %+v, %v", forks, err)
	}
}

// oneStepStart is the session.started (id "start") of session running
// pipeline name: one step, "only", of one run of `true`, under budget.
func oneStepStart(session, name string, budget *schemas.Budget) schemas.Event {
	in := schemas.ArtifactRef{Name: "in.txt", Object: session + "/input/in.txt", Digest: schemas.Digest([]byte("x")), Size: 1}
	p := schemas.Pipeline{Name: name, Kind: schemas.KindPipeline, Budget: budget, Steps: []schemas.Step{{Name: "only",
		Agent: schemas.AgentSpec{Backend: "exec", Command: []string{"true"}}, Prompt: "p", Outputs: []schemas.Output{{Name: "o.txt"}}, MaxIterations: 1}}}
	return schemas.Event{ID: "start", Type: schemas.TypeSessionStarted, Session: session, Data: &schemas.SessionStarted{Pipeline: p, Input: in, SourceHash: schemas.ShortHash(in.Digest)}}
}

// TestForkCopiesAtMost999: a fork copies at most schemas.MaxForkCopies
// events (they go in one atomic batch with session.forked); a point past
// them is refused, one at the limit forks.
func TestForkCopiesAtMost999(t *testing.T) {
	t.Parallel()
	b, _ := testnats.Bus(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	evs := []schemas.Event{oneStepStart("big", "big", nil)}
	for i := 1; i < schemas.MaxForkCopies+1; i++ {
		evs = append(evs, schemas.Event{ID: "info-" + strconv.Itoa(i), Type: schemas.TypeSignalInfo, Session: "big", Data: &schemas.Signal{Target: "big", Message: "note"}})
	}
	last := uint64(0)
	for i := 0; i < len(evs); i += 500 {
		res, err := b.PublishBatch(ctx, "big", last, evs[i:min(i+500, len(evs))])
		if err != nil {
			t.Fatal(err)
		}
		last = res.Seq
	}
	if _, err := client.Fork(ctx, b, client.ForkRequest{Origin: "big", At: "info-999", As: "big-2"}); !errors.Is(err, client.ErrBadInput) ||
		!strings.Contains(err.Error(), "big has 1000 events up to that point; a fork copies at most 999") {
		t.Errorf("fork after 1000 events: %v", err)
	}
	f, err := client.Fork(ctx, b, client.ForkRequest{Origin: "big", At: "info-998", As: "big-3"})
	if err != nil {
		t.Fatal(err)
	}
	if d := f.Event.Data.(*schemas.SessionForked); d.Copied != schemas.MaxForkCopies || f.Point.Seq != last-1 || f.Seq != last+schemas.MaxForkCopies+1 {
		t.Errorf("fork at the 999th event: %d copied, point %d (want %d), session.forked at %d", d.Copied, f.Point.Seq, last-1, f.Seq)
	}
	got, err := client.Events(ctx, b, "big-3", client.Until{})
	if err != nil || len(got) != schemas.MaxForkCopies+1 || got[len(got)-1].Type != schemas.TypeSessionForked {
		t.Errorf("big-3 holds %d events (%v), want 999 copies and session.forked", len(got), err)
	}
}

// TestForkOfAClosedSession: a session closed for good is forked only at
// an event before its close.
func TestForkOfAClosedSession(t *testing.T) {
	ctx, c := rig(t)
	dir := t.TempDir()
	pipeline := filepath.Join(dir, "one.yaml")
	input := filepath.Join(dir, "in.txt")
	gate := filepath.Join(dir, "gate")
	agent := "while [ ! -e " + gate + " ]; do sleep 0.05; done; echo 1 > \\\"$LOOPBUS_OUTPUT_DIR/o.txt\\\""
	if err := os.WriteFile(pipeline, []byte("name: one\nsteps:\n  only:\n    agent: {backend: exec, command: [sh, -c, \""+agent+"\"]}\n    prompt: p\n    outputs: [{name: o.txt}]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(input, []byte("x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	p, err := definition.Load(pipeline)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Submit(ctx, p, input, client.SubmitOptions{Session: "cl-1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.CloseSession(ctx, c.Bus(), "cl-1", "done with it"); err != nil {
		t.Fatal(err)
	}
	if m, err := c.Follow(ctx, "cl-1", nil); err != nil || m.Status != projections.StatusClosed {
		t.Fatalf("cl-1: %v %+v", err, m)
	}
	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	evs, err := client.Events(ctx, c.Bus(), "cl-1", client.Until{})
	if err != nil {
		t.Fatal(err)
	}
	closed := slices.IndexFunc(evs, func(ev schemas.Event) bool { return ev.Type == schemas.TypeSessionClosed })
	if closed < 1 {
		t.Fatalf("no session.closed in cl-1")
	}
	if _, err := c.Fork(ctx, client.ForkRequest{Origin: "cl-1", At: evs[closed].ID, As: "cl-2"}); !errors.Is(err, client.ErrBadInput) || !strings.Contains(err.Error(), "closed for good") {
		t.Errorf("fork after the close: %v", err)
	}
	if _, err := c.Fork(ctx, client.ForkRequest{Origin: "cl-1", At: evs[closed-1].ID, As: "cl-3"}); err != nil {
		t.Fatal(err)
	}
	if m, err := c.Follow(ctx, "cl-3", nil); err != nil || m.Status != projections.StatusCompleted {
		t.Errorf("fork before the close: %v %+v", err, m)
	}
}

// TestForkOfALoopsSession: a loops fork whose levels work in git
// worktrees is not made of a session without a repository (a worktree
// session forks as e2e's tests show), nor a backlog fork that switches
// between workdir: repo and not, nor a session into another kind.
func TestForkOfALoopsSession(t *testing.T) {
	ctx, c := rig(t)
	loops := func(worktree bool) schemas.Pipeline {
		return schemas.Pipeline{Name: "tree", Kind: schemas.KindLoops, Source: "tree.yaml", Loops: &schemas.Loops{Levels: []schemas.LoopLevel{
			{Name: "plan", Agent: schemas.AgentSpec{Backend: "exec", Command: []string{"false"}}, Prompt: "p", MaxIterations: 1, TimeoutMs: 1000,
				Outputs: []schemas.Output{{Name: "plan.md"}}, Worktree: worktree},
		}}}
	}
	start := func(session string, p schemas.Pipeline) string {
		in := schemas.ArtifactRef{Name: "task.md", Object: session + "/input/task.md", Digest: schemas.Digest([]byte("t")), Size: 1}
		d := &schemas.SessionStarted{Pipeline: p, Input: in, SourceHash: schemas.ShortHash(in.Digest)}
		if p.Kind == schemas.KindLoops {
			d.Loops = &schemas.LoopsStart{Task: "t"}
		}
		ev := schemas.Event{ID: schemas.DeterministicID(session, "start"), Type: schemas.TypeSessionStarted, Session: session, Time: time.Now().UTC(), Data: d}
		ev.Correlation = ev.ID
		pub, err := c.Bus().Publish(ctx, ev)
		if err != nil {
			t.Fatal(err)
		}
		return strconv.FormatUint(pub.Seq, 10)
	}
	wt := start("lw-1", loops(true))
	plain := start("lp-1", loops(false))
	changed := loops(true)
	backlog := func(workdir string) schemas.Pipeline {
		source := "bk-dir.yaml"
		if workdir == schemas.WorkdirRepo {
			source = "bk-repo.yaml"
		}
		return schemas.Pipeline{Name: "bk", Kind: schemas.KindBacklog, Source: source, Backlog: &schemas.Backlog{
			Agents: map[string]schemas.AgentSpec{"a": {Backend: "exec", Command: []string{"false"}}}, Roles: map[string][]string{schemas.RoleIterate: {"a"}},
			Schedule: schemas.ScheduleSingle, MaxParallel: 1, MaxSummaryIterations: 1, TimeoutMs: 1000, Workdir: workdir}}
	}
	repo := start("br-1", backlog(schemas.WorkdirRepo))
	plainBacklog := start("bp-1", backlog(""))
	inRepo := func() string {
		// A backlog with workdir: repo, on a repository.
		in := schemas.ArtifactRef{Name: "task.md", Object: "bg-1/input/task.md", Digest: schemas.Digest([]byte("t")), Size: 1}
		bundle := schemas.ArtifactRef{Name: "base.bundle", Object: "bg-1/base.bundle", Digest: schemas.Digest([]byte("b")), Size: 1}
		d := &schemas.SessionStarted{Pipeline: backlog(schemas.WorkdirRepo), Input: in, SourceHash: schemas.ShortHash(in.Digest),
			Loops: &schemas.LoopsStart{Repo: "demo", Base: "main", BaseCommit: strings.Repeat("b", 40), Bundle: &bundle, Target: "loopbus/bg-1"}}
		ev := schemas.Event{ID: schemas.DeterministicID("bg-1", "start"), Type: schemas.TypeSessionStarted, Session: "bg-1", Time: time.Now().UTC(), Data: d}
		ev.Correlation = ev.ID
		pub, err := c.Bus().Publish(ctx, ev)
		if err != nil {
			t.Fatal(err)
		}
		return strconv.FormatUint(pub.Seq, 10)
	}()
	plainFile, repoFile := backlog(""), backlog(schemas.WorkdirRepo)
	for _, tc := range []struct {
		name string
		req  client.ForkRequest
		says string
	}{
		{"worktree levels without a repository", client.ForkRequest{Origin: "lw-1", At: wt, As: "lw-2"}, "lw-1: the fork's levels work in git worktrees, and lw-1 works on no repository"},
		{"a file with worktree levels", client.ForkRequest{Origin: "lp-1", At: plain, As: "lp-2", Pipeline: &changed}, "lp-1: the fork's levels work in git worktrees, and lp-1 works on no repository"},
		{"a file of another kind", client.ForkRequest{Origin: "lp-1", At: plain, As: "lp-3", Pipeline: &schemas.Pipeline{Name: "x", Source: "x.yaml", Steps: []schemas.Step{{Name: "a"}}}},
			"x.yaml is of kind pipeline, lp-1 is a loops session: a fork keeps its origin's kind"},
		{"a backlog with workdir: repo on no repository", client.ForkRequest{Origin: "br-1", At: repo, As: "br-2"},
			"br-1: the fork's file bk-repo.yaml has workdir: repo, and br-1 works on no repository: a fork keeps its origin's workdir"},
		{"a backlog on no repository, with a file with workdir: repo", client.ForkRequest{Origin: "bp-1", At: plainBacklog, As: "bp-2", Pipeline: &repoFile},
			"bp-1: the fork's file bk-repo.yaml has workdir: repo, and bp-1 works on no repository: a fork keeps its origin's workdir"},
		{"a backlog on a repository, with a file without workdir: repo", client.ForkRequest{Origin: "bg-1", At: inRepo, As: "bg-2", Pipeline: &plainFile},
			"bg-1: bg-1 works on a repository (workdir: repo, target loopbus/bg-1), and the fork's file bk-dir.yaml has no workdir: repo: a fork keeps its origin's workdir"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := c.Fork(ctx, tc.req); !errors.Is(err, client.ErrBadInput) || !strings.Contains(err.Error(), tc.says) {
				t.Errorf("Fork = %v, want %q", err, tc.says)
			}
		})
	}
}

// TestForkAtMostMaxForkDepth: a chain of schemas.MaxForkDepth forks (a
// fork of a fork of …) is as deep as the orchestrator forks: forking its
// last fork is refused, saying why; forking higher up the chain is not.
func TestForkAtMostMaxForkDepth(t *testing.T) {
	t.Parallel()
	b, _ := testnats.Bus(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := b.PublishBatch(ctx, "d-0", 0, []schemas.Event{oneStepStart("d-0", "deep", nil)}); err != nil {
		t.Fatal(err)
	}
	at := "start"
	for i := 1; i <= schemas.MaxForkDepth; i++ {
		f, err := client.Fork(ctx, b, client.ForkRequest{Origin: "d-" + strconv.Itoa(i-1), At: at, As: "d-" + strconv.Itoa(i)})
		if err != nil {
			t.Fatalf("fork %d: %v", i, err)
		}
		at = strconv.FormatUint(f.Seq, 10)
	}
	last := "d-" + strconv.Itoa(schemas.MaxForkDepth)
	if _, err := client.Fork(ctx, b, client.ForkRequest{Origin: last, At: at, As: "too-deep"}); !errors.Is(err, client.ErrBadInput) ||
		!strings.Contains(err.Error(), "a fork is at most 16 deep") {
		t.Errorf("fork %d: %v, want refused", schemas.MaxForkDepth+1, err)
	}
	if _, err := client.Fork(ctx, b, client.ForkRequest{Origin: "d-1", At: "start", As: "shallow"}); err == nil || strings.Contains(err.Error(), "deep") {
		// d-1's start is a copy: refused, but not for its depth.
		t.Errorf("fork of d-1 at a copy: %v", err)
	}
}

// TestForkKeepsBudgetRaises: session.forked carries the origin's budget
// at the fork point, raises by loopbus budget included; a changed
// pipeline's budget tightens it, the origin's unchanged one does not.
func TestForkKeepsBudgetRaises(t *testing.T) {
	t.Parallel()
	b, _ := testnats.Bus(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	start := oneStepStart("b-0", "budgeted", &schemas.Budget{MaxCostUSD: 1, MaxIterations: 10})
	p := start.Data.(*schemas.SessionStarted).Pipeline
	evs := []schemas.Event{
		start,
		{ID: "raise", Type: schemas.TypeSessionBudget, Session: "b-0", Data: &schemas.SessionBudget{Budget: schemas.Budget{MaxCostUSD: 5}, Reason: "more"}},
	}
	if _, err := b.PublishBatch(ctx, "b-0", 0, evs); err != nil {
		t.Fatal(err)
	}
	f, err := client.Fork(ctx, b, client.ForkRequest{Origin: "b-0", At: "raise", As: "b-1"})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := f.Event.Data.(*schemas.SessionForked).Budget, (schemas.Budget{MaxCostUSD: 5, MaxIterations: 10}); got == nil || *got != want {
		t.Errorf("fork's budget %+v, want %+v", got, want)
	}
	changed := p
	changed.Budget = &schemas.Budget{MaxCostUSD: 3, MaxIterations: 20}
	f, err = client.Fork(ctx, b, client.ForkRequest{Origin: "b-0", At: "raise", As: "b-2", Pipeline: &changed})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := f.Event.Data.(*schemas.SessionForked).Budget, (schemas.Budget{MaxCostUSD: 3, MaxIterations: 10}); got == nil || *got != want {
		t.Errorf("fork's budget with a changed pipeline %+v, want %+v", got, want)
	}
	m, err := client.Status(ctx, b, "b-1")
	if err != nil {
		t.Fatal(err)
	}
	if m.Budget == nil || m.Budget.MaxCostUSD != 5 {
		t.Errorf("b-1's manifest budget %+v", m.Budget)
	}
}
