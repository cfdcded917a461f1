package e2e

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestForkBacklogAfterTheFirstTask (issue 18, "Fork and rerun":
// backlogs): a finished backlog of two tasks is forked after its first
// task run completed, with a file whose review prompt changed: in the fork
// the first task is not run again, the second and the review are (the
// review with its new prompt), the task list goes on from the fork point,
// and the original is unchanged. A changed iterate role, whose run had
// completed, is refused.
func TestForkBacklogAfterTheFirstTask(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	runs := filepath.Join(dir, "runs.log")
	backlog := func(prompts string) string {
		return `kind: backlog
name: bk
agents:
  a: {backend: exec, command: [sh, agent.sh]}
roles:
  iterate: a
source_files: [spec.md]
` + prompts
	}
	writeFiles(t, dir, map[string]string{
		// Each run logs its step and its prompt's first line.
		"agent.sh": `echo "$LOOPBUS_STEP: $(head -n 1 "$LOOPBUS_PROMPT_FILE")" >> ` + runs + `
printf '{"task_id": "%s", "status": "done", "summary": "%s done"}\n' "$LOOPBUS_STEP" "$LOOPBUS_STEP" > "$LOOPBUS_OUTPUT_DIR/summary.json"
`,
		"spec.md":      "# Spec\n",
		"to-do.json":   `{"schema_version": 1, "tasks": [{"id": "T001", "title": "First", "status": "todo", "priority": 1}, {"id": "T002", "title": "Second", "status": "todo", "priority": 2, "depends_on": ["T001"]}]}`,
		"bk.yaml":      backlog(""),
		"review.yaml":  backlog("prompts: {review: \"Review it again, harder.\"}\n"),
		"iterate.yaml": backlog("prompts: {iterate: \"Do {{.Task.ID}} better.\"}\n"),
	})
	global := []string{"--data", filepath.Join(dir, "data")}
	r := loopbus(t, append([]string{"run", filepath.Join(dir, "bk.yaml"), "--tasks", filepath.Join(dir, "to-do.json"), "--session", "bf-1"}, global...)...)
	if r.code != 0 {
		t.Fatalf("run: exit %d\n%s", r.code, r.stderr)
	}
	before := loopbus(t, append([]string{"status", "bf-1", "--json"}, global...)...)
	evs := events(t, global, "bf-1")
	point := 1 + slices.IndexFunc(evs, func(e cloudEvent) bool { return e.Type == "loopbus.step.completed" && e.Step == "T001" })
	if point == 0 {
		t.Fatal("no step.completed of T001")
	}
	at := strconv.Itoa(point) // the stream holds only this session

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"fork", "bf-1", "--at", at, "--pipeline", filepath.Join(dir, "iterate.yaml")},
			"role iterate changed, and runs of it had completed in bf-1 at the fork point (T001): running them again is not supported yet"},
		{[]string{"fork", "bf-1", "--at", strconv.Itoa(len(evs))}, "backlog session bf-1 had ended at or before stream sequence"},
	} {
		if r := loopbus(t, append(tc.args, global...)...); r.code != 2 || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("%v: exit %d, want 2 with %q\n%s", tc.args, r.code, tc.want, r.stderr)
		}
	}

	r = loopbus(t, append([]string{"fork", "bf-1", "--at", at, "--as", "bf-2", "--pipeline", filepath.Join(dir, "review.yaml")}, global...)...)
	if r.code != 0 {
		t.Fatalf("fork: exit %d, want 0 (completed)\n%s", r.code, r.stderr)
	}
	if want := "session bf-2 forked from bf-1 at stream sequence " + at + " (step.completed); " + at + " events copied; kept: T001"; !strings.Contains(r.stderr, want) {
		t.Errorf("fork stderr does not say %q:\n%s", want, r.stderr)
	}
	log, err := os.ReadFile(runs)
	if err != nil {
		t.Fatal(err)
	}
	var steps []string
	for _, l := range strings.Split(strings.TrimSpace(string(log)), "\n") {
		steps = append(steps, strings.SplitN(l, ":", 2)[0])
	}
	if strings.Join(steps, " ") != "T001 T002 review T002 review" {
		t.Errorf("agent runs: %v, want T001 T002 review T002 review (T001 not run again in the fork)", steps)
	}
	if !strings.HasSuffix(strings.TrimSpace(string(log)), "review: Review it again, harder.") {
		t.Errorf("the fork's review did not run with its new prompt:\n%s", log)
	}
	st := parseManifest(t, loopbus(t, append([]string{"status", "bf-2", "--json"}, global...)...).stdout)
	if st.Status != "completed" || st.Steps["T001"].ContentHash != parseManifest(t, before.stdout).Steps["T001"].ContentHash {
		t.Errorf("fork status: %+v", st)
	}
	if r := loopbus(t, append([]string{"tasks", "bf-2"}, global...)...); r.code != 0 || !strings.Contains(r.stdout, "T001") || !strings.Contains(r.stdout, "T002") {
		t.Errorf("tasks bf-2: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}

	// The original is untouched.
	if after := loopbus(t, append([]string{"status", "bf-1", "--json"}, global...)...); after.stdout != before.stdout {
		t.Errorf("the original's manifest changed:\n--- before\n%s\n--- after\n%s", before.stdout, after.stdout)
	}
	if n := len(events(t, global, "bf-1")); n != len(evs) {
		t.Errorf("the original has %d events, had %d", n, len(evs))
	}
}
