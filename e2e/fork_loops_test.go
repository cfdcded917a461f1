package e2e

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestForkLoopsSessionAfterThePlan (issue 18, "Fork and rerun": loop
// trees): a finished loops session (a plan loop spawning two spec loops)
// is forked after its plan completed, with a file whose spec level
// changed: in the fork the plan is not run again, both specs are, with
// the new level, the fork completes, and the original's manifest is
// unchanged. Forking it at its end, or into a pipeline, is refused.
func TestForkLoopsSessionAfterThePlan(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	runs := filepath.Join(dir, "runs.log")
	// Each run logs the first line of its prompt (stdin).
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
	global := []string{"--data", filepath.Join(dir, "data")}
	r := loopbus(t, append([]string{"run", filepath.Join(dir, "loops.yaml"), "--task", "Write two specs", "--session", "lf-1"}, global...)...)
	if r.code != 0 {
		t.Fatalf("run: exit %d\n%s", r.code, r.stderr)
	}
	before := loopbus(t, append([]string{"status", "lf-1", "--json"}, global...)...)
	evs := events(t, global, "lf-1")
	point := 1 + slices.IndexFunc(evs, func(e cloudEvent) bool { return e.Type == "loopbus.step.completed" && e.Step == "plan" })
	if point == 0 {
		t.Fatal("no step.completed of plan")
	}
	at := strconv.Itoa(point) // the stream holds only this session

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"fork", "lf-1", "--at", strconv.Itoa(len(evs))}, "loops session lf-1 had ended at or before stream sequence " + strconv.Itoa(len(evs)) + "; fork it at an event before its end"},
		{[]string{"fork", "lf-1", "--at", at, "--pipeline", filepath.Join(dir, "p.yaml")}, "is of kind pipeline, lf-1 is a loops session: a fork keeps its origin's kind"},
	} {
		if r := loopbus(t, append(tc.args, global...)...); r.code != 2 || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("%v: exit %d, want 2 with %q\n%s", tc.args, r.code, tc.want, r.stderr)
		}
	}

	r = loopbus(t, append([]string{"fork", "lf-1", "--at", at, "--as", "lf-2", "--pipeline", filepath.Join(dir, "loops2.yaml")}, global...)...)
	if r.code != 0 {
		t.Fatalf("fork: exit %d, want 0 (completed)\n%s", r.code, r.stderr)
	}
	if want := "session lf-2 forked from lf-1 at stream sequence " + at + " (step.completed); " + at + " events copied; kept: plan"; !strings.Contains(r.stderr, want) {
		t.Errorf("fork stderr does not say %q:\n%s", want, r.stderr)
	}
	log, err := os.ReadFile(runs)
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Split(strings.TrimSpace(string(log)), "\n")
	if len(got) != 5 {
		t.Fatalf("agent runs: %q, want 5 (plan and two specs, then two specs)", got)
	}
	origin, fork := slices.Clone(got[:3]), slices.Clone(got[3:])
	slices.Sort(origin)
	slices.Sort(fork)
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
	if st.Steps["plan"].ContentHash != parseManifest(t, before.stdout).Steps["plan"].ContentHash {
		t.Errorf("the plan's result in the fork is not the original's")
	}
	live := events(t, global, "lf-2")[point+1:]
	for step, want := range map[string]int{"plan": 0, "plan-001": 1, "plan-002": 1} {
		if n := count(live, "loopbus.job.requested", step); n != want {
			t.Errorf("the fork requested %d jobs of %s, want %d", n, step, want)
		}
	}

	// The original is untouched.
	if after := loopbus(t, append([]string{"status", "lf-1", "--json"}, global...)...); after.stdout != before.stdout {
		t.Errorf("the original's manifest changed:\n--- before\n%s\n--- after\n%s", before.stdout, after.stdout)
	}
	if n := len(events(t, global, "lf-1")); n != len(evs) {
		t.Errorf("the original has %d events, had %d", n, len(evs))
	}
}
