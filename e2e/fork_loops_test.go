package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// finishedLoops is a finished loops session, lf-1 (a plan loop spawning
// two spec loops), run with loops.yaml in dir; loops2.yaml changes its
// spec level's prompt, p.yaml is a pipeline. Each agent run logs the
// first line of its prompt to runs.log. It returns the dir, the global
// flags, lf-1's manifest and its events.
func finishedLoops(t *testing.T) (dir string, global []string, manifest string, evs []cloudEvent) {
	t.Helper()
	dir = t.TempDir()
	runs := filepath.Join(dir, "runs.log")
	logRun := `echo "$(head -n 1)" >> ` + runs + "\n"
	loops := func(specPrompt string) string {
		return `kind: loops
name: tree
levels:
  plan:
    agent: {backend: exec, command: [sh, plan.sh]}
    prompt: plan.tmpl
    outputs: [{name: plan.md}]
    children: {level: spec, from: plan.md, split: headings}
  spec:
    agent: {backend: exec, command: [sh, spec.sh]}
    prompt: ` + specPrompt + `
    outputs: [{name: spec.md}]
`
	}
	writeFiles(t, dir, map[string]string{
		"plan.sh":     logRun + `printf '# plan\n## one\n## two\n' > "$LOOPBUS_OUTPUT_DIR/plan.md"` + "\n",
		"spec.sh":     logRun + `echo spec > "$LOOPBUS_OUTPUT_DIR/spec.md"` + "\n",
		"plan.tmpl":   "plan {{.Loop}}\n",
		"spec.tmpl":   "spec {{.Loop}}\n",
		"spec2.tmpl":  "better spec {{.Loop}}\n",
		"loops.yaml":  loops("spec.tmpl"),
		"loops2.yaml": loops("spec2.tmpl"),
		"p.yaml":      "name: p\nsteps:\n  one:\n    agent: {backend: exec, command: [sh, spec.sh]}\n    prompt: x\n    outputs: [{name: spec.md}]\n",
	})
	global = []string{"--data", filepath.Join(dir, "data")}
	r := loopbus(t, append([]string{"run", filepath.Join(dir, "loops.yaml"), "--task", "Write two specs", "--session", "lf-1"}, global...)...)
	if r.code != 0 {
		t.Fatalf("run: exit %d\n%s", r.code, r.stderr)
	}
	return dir, global, loopbus(t, append([]string{"status", "lf-1", "--json"}, global...)...).stdout, events(t, global, "lf-1")
}

// agentRuns returns the first lines of the prompts runs.log in dir
// logged: the origin's first n runs, then the rest (the fork's), each
// sorted.
func agentRuns(t *testing.T, dir string, n int) (origin, fork []string) {
	t.Helper()
	log, err := os.ReadFile(filepath.Join(dir, "runs.log"))
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Split(strings.TrimSpace(string(log)), "\n")
	if len(got) < n {
		t.Fatalf("agent runs: %q, want at least %d", got, n)
	}
	origin, fork = slices.Clone(got[:n]), slices.Clone(got[n:])
	slices.Sort(origin)
	slices.Sort(fork)
	return origin, fork
}

// TestForkLoopsSessionAfterThePlan (issue 18, "Fork and rerun": loop
// trees): a finished loops session (a plan loop spawning two spec loops)
// is forked after its plan completed, with a file whose spec level
// changed: in the fork the plan is not run again, both specs are, with
// the new level, the fork completes, and the original's manifest is
// unchanged. Forking it into a pipeline is refused.
func TestForkLoopsSessionAfterThePlan(t *testing.T) {
	t.Parallel()
	dir, global, before, evs := finishedLoops(t)
	point := 1 + slices.IndexFunc(evs, func(e cloudEvent) bool { return e.Type == "loopbus.step.completed" && e.Step == "plan" })
	if point == 0 {
		t.Fatal("no step.completed of plan")
	}
	at := strconv.Itoa(point) // the stream holds only this session

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"fork", "lf-1", "--at", at, "--pipeline", filepath.Join(dir, "p.yaml")}, "is of kind pipeline, lf-1 is a loops session: a fork keeps its origin's kind"},
	} {
		if r := loopbus(t, append(tc.args, global...)...); r.code != 2 || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("%v: exit %d, want 2 with %q\n%s", tc.args, r.code, tc.want, r.stderr)
		}
	}

	r := loopbus(t, append([]string{"fork", "lf-1", "--at", at, "--as", "lf-2", "--pipeline", filepath.Join(dir, "loops2.yaml")}, global...)...)
	if r.code != 0 {
		t.Fatalf("fork: exit %d, want 0 (completed)\n%s", r.code, r.stderr)
	}
	if want := "session lf-2 forked from lf-1 at stream sequence " + at + " (step.completed); " + at + " events copied; kept: plan"; !strings.Contains(r.stderr, want) {
		t.Errorf("fork stderr does not say %q:\n%s", want, r.stderr)
	}
	origin, fork := agentRuns(t, dir, 3)
	if len(fork) != 2 {
		t.Fatalf("the fork's agent runs: %q, want 2 (two specs)", fork)
	}
	if strings.Join(origin, ", ") != "plan plan, spec plan-001, spec plan-002" {
		t.Errorf("the original's runs: %q", origin)
	}
	if strings.Join(fork, ", ") != "better spec plan-001, better spec plan-002" {
		t.Errorf("the fork's runs: %q, want both specs with the new level and no plan", fork)
	}

	st := parseManifest(t, loopbus(t, append([]string{"status", "lf-2", "--json"}, global...)...).stdout)
	if st.Status != "completed" || st.Steps["plan"].Status != "completed" || st.Steps["plan-001"].Status != "completed" || st.Steps["plan-002"].Status != "completed" {
		t.Errorf("fork status: %+v", st)
	}
	if st.Steps["plan"].ContentHash != parseManifest(t, before).Steps["plan"].ContentHash {
		t.Errorf("the plan's result in the fork is not the original's")
	}
	live := events(t, global, "lf-2")[point+1:]
	for step, want := range map[string]int{"plan": 0, "plan-001": 1, "plan-002": 1} {
		if n := count(live, "loopbus.job.requested", step); n != want {
			t.Errorf("the fork requested %d jobs of %s, want %d", n, step, want)
		}
	}

	// The original is untouched.
	if after := loopbus(t, append([]string{"status", "lf-1", "--json"}, global...)...); after.stdout != before {
		t.Errorf("the original's manifest changed:\n--- before\n%s\n--- after\n%s", before, after.stdout)
	}
	if n := len(events(t, global, "lf-1")); n != len(evs) {
		t.Errorf("the original has %d events, had %d", n, len(evs))
	}
}

// TestForkFinishedLoopsSessionAtItsEnd: a completed loops session forked
// at its session.completed, with a file whose spec level changed, forks
// from before the decision that completed it (fork says so): the specs
// run again in jobs of the fork with the new level, the plan is kept, the
// fork completes, and the original is untouched.
func TestForkFinishedLoopsSessionAtItsEnd(t *testing.T) {
	t.Parallel()
	dir, global, before, evs := finishedLoops(t)
	end, start, again := completingDecision(t, evs)

	r := loopbus(t, append([]string{"fork", "lf-1", "--at", strconv.Itoa(end + 1), "--as", "lf-2", "--pipeline", filepath.Join(dir, "loops2.yaml")}, global...)...)
	if r.code != 0 {
		t.Fatalf("fork: exit %d, want 0 (completed)\n%s", r.code, r.stderr)
	}
	moved := fmt.Sprintf("fork point moved back from stream sequence %d to %d: session lf-1 completed at %d, and a fork starts from a running session", end+1, start, end+1)
	if !strings.Contains(r.stderr, moved) {
		t.Errorf("fork stderr does not say %q:\n%s", moved, r.stderr)
	}
	if want := fmt.Sprintf("session lf-2 forked from lf-1 at stream sequence %d (%s); %d events copied; kept: plan", start,
		strings.TrimPrefix(evs[start-1].Type, "loopbus."), start); !strings.Contains(r.stderr, want) {
		t.Errorf("fork stderr does not say %q:\n%s", want, r.stderr)
	}
	origin, fork := agentRuns(t, dir, 3)
	if strings.Join(origin, ", ") != "plan plan, spec plan-001, spec plan-002" {
		t.Errorf("the original's runs: %q", origin)
	}
	if strings.Join(fork, ", ") != "better spec plan-001, better spec plan-002" {
		t.Errorf("the fork's runs: %q, want both specs with the new level and no plan", fork)
	}

	st := parseManifest(t, loopbus(t, append([]string{"status", "lf-2", "--json"}, global...)...).stdout)
	if st.Status != "completed" || st.Steps["plan-001"].Status != "completed" || st.Steps["plan-002"].Status != "completed" {
		t.Errorf("fork status: %+v", st)
	}
	if st.Steps["plan"].ContentHash != parseManifest(t, before).Steps["plan"].ContentHash {
		t.Errorf("the plan's result in the fork is not the original's")
	}
	live := events(t, global, "lf-2")[start+1:]
	for step, want := range map[string]int{"plan": 0, "plan-001": 1, "plan-002": 1} {
		if n := count(live, "loopbus.job.requested", step); n != want {
			t.Errorf("the fork requested %d jobs of %s, want %d", n, step, want)
		}
	}
	for _, e := range live {
		var d struct {
			JobID string `json:"jobId"`
		}
		if e.Type == "loopbus.job.requested" && (json.Unmarshal(e.Data, &d) != nil || !strings.HasPrefix(d.JobID, "lf-2.")) {
			t.Errorf("the fork's job of %s is %q, not one of lf-2", e.Step, d.JobID)
		}
	}
	if n := count(live, "loopbus.session.completed", ""); n != 1 {
		t.Errorf("the fork completed %d times", n)
	}

	// Without --pipeline, only the loops the ending decision completed
	// run again (their results had come in; their completion had not).
	r = loopbus(t, append([]string{"fork", "lf-1", "--at", strconv.Itoa(end + 1), "--as", "lf-3"}, global...)...)
	if r.code != 0 || !strings.Contains(r.stderr, "session lf-1 completed at "+strconv.Itoa(end+1)+", and a fork starts from a running session") {
		t.Fatalf("fork at the end without --pipeline: exit %d, want 0 with the point moved back\n%s", r.code, r.stderr)
	}
	var want []string
	for _, loop := range again {
		want = append(want, "spec "+loop)
	}
	slices.Sort(want)
	if _, fork := agentRuns(t, dir, 5); !slices.Equal(fork, want) {
		t.Errorf("the fork without --pipeline ran %q, want %q (the loops its origin's last decision completed)", fork, want)
	}
	live = events(t, global, "lf-3")[start+1:]
	if n := count(live, "loopbus.job.requested", "plan"); n != 0 || count(live, "loopbus.session.completed", "") != 1 {
		t.Errorf("the fork without --pipeline ran the plan again (%d) or did not complete:\n%s", n, r.stderr)
	}

	// The original is untouched.
	if after := loopbus(t, append([]string{"status", "lf-1", "--json"}, global...)...); after.stdout != before {
		t.Errorf("the original's manifest changed:\n--- before\n%s\n--- after\n%s", before, after.stdout)
	}
	if n := len(events(t, global, "lf-1")); n != len(evs) {
		t.Errorf("the original has %d events, had %d", n, len(evs))
	}
}

// endingDecision returns where the orchestrator's decision holding evs[end]
// (an end event) begins, as a stream sequence of the last event before
// it (the events before it from the orchestrator, caused by the same
// trigger, are in it), and the steps that decision completed.
func endingDecision(evs []cloudEvent, end int) (seq int, completed []string) {
	start := beforeDecision(evs, end) + 1
	for _, e := range evs[start:end] {
		if e.Type == "loopbus.step.completed" {
			completed = append(completed, e.Step)
		}
	}
	return start, completed
}

// completingDecision finds the session.completed of evs (end, its index)
// and the decision that holds it (start, as endingDecision gives it, and
// the steps it completed), which must complete something: else nothing
// would show a fork at the end running them again.
func completingDecision(t *testing.T, evs []cloudEvent) (end, start int, again []string) {
	t.Helper()
	end = slices.IndexFunc(evs, func(e cloudEvent) bool { return e.Type == "loopbus.session.completed" })
	if end < 0 {
		t.Fatal("no session.completed")
	}
	start, again = endingDecision(evs, end)
	if len(again) == 0 {
		t.Fatalf("the origin's ending decision (events %d to %d) completed no loop or run: nothing would show the fork runs them again", start+1, end+1)
	}
	return end, start, again
}

// TestForkFailedLoopsSessionAtItsEnd: a loops session whose root loop
// used up its iterations, forked at its session.failed, forks from
// before the decision that failed it: with an unchanged file the loop
// runs again in the fork, from its first iteration, and fails the fork
// as it failed its origin; with a file whose agent is fixed, it runs
// again with that agent and the fork completes.
func TestForkFailedLoopsSessionAtItsEnd(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	runs := filepath.Join(dir, "runs.log")
	loops := func(script string) string {
		return `kind: loops
name: one
levels:
  plan:
    agent: {backend: exec, command: [sh, ` + script + `]}
    prompt: plan.tmpl
    outputs: [{name: plan.md}]
    max_iterations: 2
`
	}
	writeFiles(t, dir, map[string]string{
		"fail.sh":    `echo "fail $LOOPBUS_JOB" >> ` + runs + "\nexit 1\n",
		"ok.sh":      `echo "ok $LOOPBUS_JOB" >> ` + runs + "\n" + `echo plan > "$LOOPBUS_OUTPUT_DIR/plan.md"` + "\n",
		"plan.tmpl":  "plan {{.Loop}}\n",
		"fail.yaml":  loops("fail.sh"),
		"fixed.yaml": loops("ok.sh"),
	})
	global := []string{"--data", filepath.Join(dir, "data")}
	if r := loopbus(t, append([]string{"run", filepath.Join(dir, "fail.yaml"), "--task", "Plan", "--session", "ff-1"}, global...)...); r.code != 1 {
		t.Fatalf("run: exit %d, want 1 (failed)\n%s", r.code, r.stderr)
	}
	before := loopbus(t, append([]string{"status", "ff-1", "--json"}, global...)...).stdout
	evs := events(t, global, "ff-1")
	end := slices.IndexFunc(evs, func(e cloudEvent) bool { return e.Type == "loopbus.session.failed" })
	if end < 0 {
		t.Fatal("no session.failed")
	}
	start, _ := endingDecision(evs, end)
	if evs[start].Type != "loopbus.step.failed" {
		t.Errorf("the decision that failed the session begins with %s, want step.failed", evs[start].Type)
	}
	moved := fmt.Sprintf("fork point moved back from stream sequence %d to %d: session ff-1 failed at %d, and a fork starts from a running session", end+1, start, end+1)
	jobs := func() []string {
		log, err := os.ReadFile(runs)
		if err != nil {
			t.Fatal(err)
		}
		return strings.Split(strings.TrimSpace(string(log)), "\n")
	}
	if got := jobs(); len(got) != 2 {
		t.Fatalf("the origin's runs: %q, want 2 (its iterations)", got)
	}

	r := loopbus(t, append([]string{"fork", "ff-1", "--at", strconv.Itoa(end + 1), "--as", "ff-2"}, global...)...)
	if r.code != 1 || !strings.Contains(r.stderr, moved) {
		t.Errorf("fork with the same file: exit %d, want 1 (failed again) with %q\n%s", r.code, moved, r.stderr)
	}
	if got := jobs(); len(got) != 4 || got[2] != "fail ff-2.plan.1.r1" || got[3] != "fail ff-2.plan.2.r1" {
		t.Errorf("runs: %q, want the origin's two, then the fork's two iterations", got)
	}

	r = loopbus(t, append([]string{"fork", "ff-1", "--at", strconv.Itoa(end + 1), "--as", "ff-3", "--pipeline", filepath.Join(dir, "fixed.yaml")}, global...)...)
	if r.code != 0 || !strings.Contains(r.stderr, moved) {
		t.Errorf("fork with the agent fixed: exit %d, want 0 (completed) with %q\n%s", r.code, moved, r.stderr)
	}
	if got := jobs(); len(got) != 5 || got[4] != "ok ff-3.plan.1.r1" {
		t.Errorf("runs: %q, want the fixed agent's run in the fork last", got)
	}

	// The original is untouched.
	if after := loopbus(t, append([]string{"status", "ff-1", "--json"}, global...)...); after.stdout != before {
		t.Errorf("the original's manifest changed:\n--- before\n%s\n--- after\n%s", before, after.stdout)
	}
	if n := len(events(t, global, "ff-1")); n != len(evs) {
		t.Errorf("the original has %d events, had %d", n, len(evs))
	}
}
