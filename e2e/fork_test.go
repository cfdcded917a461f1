package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestForkFinishedSessionAfterStepOne (issue 18, "Fork and rerun"): a
// finished three-step session is forked after step one with a pipeline
// whose step two changed: in the fork step one is not run again, steps two
// and three are (two with its new definition), the fork completes, and
// the original's manifest is unchanged. Replay and status show the fork's
// origin and point, and the original's forks.
func TestForkFinishedSessionAfterStepOne(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	runs := filepath.Join(dir, "runs.log")
	agent := func(step string) string {
		// Each run says which step ran with which prompt (on stdin).
		return "echo \"" + step + ":$(cat | tr '\\n' ' ')\" >> " + runs + "\necho " + step + " > \"$LOOPBUS_OUTPUT_DIR/" + step + ".txt\"\n"
	}
	pipeline := func(twoPrompt string) string {
		return `name: fork
steps:
  one:
    agent: {backend: exec, command: [sh, one.sh]}
    prompt: first
    outputs: [{name: one.txt}]
  two:
    requires: [one]
    agent: {backend: exec, command: [sh, two.sh]}
    prompt: ` + twoPrompt + `
    outputs: [{name: two.txt}]
  three:
    requires: [two]
    agent: {backend: exec, command: [sh, three.sh]}
    prompt: third
    outputs: [{name: three.txt}]
`
	}
	writeFiles(t, dir, map[string]string{
		"in.txt":   "x\n",
		"one.sh":   agent("one"),
		"two.sh":   agent("two"),
		"three.sh": agent("three"),
		"p.yaml":   pipeline("second"),
		"p2.yaml":  pipeline("second, better"),
	})
	global := []string{"--data", filepath.Join(dir, "data")}
	r := loopbus(t, append([]string{"run", filepath.Join(dir, "p.yaml"), "--input", filepath.Join(dir, "in.txt"), "--session", "fk-1"}, global...)...)
	if r.code != 0 {
		t.Fatalf("run: exit %d\n%s", r.code, r.stderr)
	}
	before := loopbus(t, append([]string{"status", "fk-1", "--json"}, global...)...)
	evs := events(t, global, "fk-1")
	point := 0 // the stream holds only this session: sequence = index + 1
	for i, e := range evs {
		if e.Type == "loopbus.step.completed" && e.Step == "one" {
			point = i + 1
		}
	}
	if point == 0 {
		t.Fatal("no step.completed of one")
	}
	at := strconv.Itoa(point)

	// Refusals, each with exit 2 and what is wrong.
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"fork", "fk-1", "--at", strconv.Itoa(len(evs) + 5)}, "beyond the end of session fk-1"},
		{[]string{"fork", "fk-1", "--at", "nosuchid"}, `has no event with id "nosuchid"`},
		{[]string{"fork", "fk-1", "--at", at, "--as", "fk-1"}, "give it another id"},
		{[]string{"fork", "fk-1", "--at", at, "--as", "bad.id"}, "bad.id"},
		{[]string{"fork", "nosuch", "--at", "1"}, "no such session"},
		{[]string{"fork", "fk-1"}, "--at SEQ|EVENT-ID is required"},
	} {
		if r := loopbus(t, append(tc.args, global...)...); r.code != 2 || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("%v: exit %d, want 2 with %q\n%s", tc.args, r.code, tc.want, r.stderr)
		}
	}

	r = loopbus(t, append([]string{"fork", "fk-1", "--at", at, "--as", "fk-2", "--pipeline", filepath.Join(dir, "p2.yaml"), "--reason", "better two"}, global...)...)
	if r.code != 0 {
		t.Fatalf("fork: exit %d, want 0 (completed)\n%s", r.code, r.stderr)
	}
	if want := "session fk-2 forked from fk-1 at stream sequence " + at + " (step.completed); " + at + " events copied; kept: one; to run: two, three"; !strings.Contains(r.stderr, want) {
		t.Errorf("fork stderr does not say %q:\n%s", want, r.stderr)
	}
	log, err := os.ReadFile(runs)
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Split(strings.TrimSpace(string(log)), "\n")
	var steps []string
	for _, l := range got {
		steps = append(steps, strings.SplitN(l, ":", 2)[0])
	}
	if strings.Join(steps, " ") != "one two three two three" {
		t.Errorf("agent runs: %v, want one two three two three (one not run again in the fork)", steps)
	}
	if len(got) == 5 && !strings.Contains(got[3], "second, better") {
		t.Errorf("the fork's step two ran with %q, want its new prompt", got[3])
	}

	// The fork completed, keeping one; it knows where it comes from.
	var fork struct {
		manifest
		ForkedFrom *struct {
			Session string `json:"session"`
			Seq     int    `json:"seq"`
			Event   string `json:"event"`
			Reason  string `json:"reason"`
		} `json:"forkedFrom"`
	}
	st := loopbus(t, append([]string{"status", "fk-2", "--json"}, global...)...)
	if err := json.Unmarshal([]byte(st.stdout), &fork); err != nil {
		t.Fatalf("status fk-2: %v\n%s", err, st.stdout)
	}
	if fork.Status != "completed" || fork.Steps["one"].Status != "completed" || fork.Steps["three"].Status != "completed" {
		t.Errorf("fork status: %+v", fork.manifest)
	}
	if f := fork.ForkedFrom; f == nil || f.Session != "fk-1" || f.Seq != point || f.Event != evs[point-1].ID || f.Reason != "better two" {
		t.Errorf("forkedFrom %+v, want fk-1 at %d (%s)", fork.ForkedFrom, point, evs[point-1].ID)
	}
	if fork.Steps["one"].ContentHash != parseManifest(t, before.stdout).Steps["one"].ContentHash {
		t.Errorf("step one's result in the fork is not the original's")
	}

	// Its history: the copies (the original's events up to the point),
	// session.forked, then its own jobs for two and three only.
	fevs := events(t, global, "fk-2")
	copies := 0
	for i, e := range fevs {
		if e.ForkOf == "" {
			break
		}
		if e.ForkOf != evs[i].ID || e.Type != evs[i].Type || e.ID == evs[i].ID {
			t.Errorf("copy %d: %s of %s (id %s), want a copy of %s %s", i, e.Type, e.ForkOf, e.ID, evs[i].Type, evs[i].ID)
		}
		copies++
	}
	if copies != point || len(fevs) <= point || fevs[point].Type != "loopbus.session.forked" {
		t.Fatalf("the fork's history begins with %d copies (want %d), then %v", copies, point, fevs[min(copies, len(fevs)-1)].Type)
	}
	live := fevs[point+1:]
	for step, want := range map[string]int{"one": 0, "two": 1, "three": 1} {
		if n := count(live, "loopbus.job.requested", step); n != want {
			t.Errorf("the fork requested %d jobs of %s, want %d", n, step, want)
		}
	}

	// The original is untouched.
	if after := loopbus(t, append([]string{"status", "fk-1", "--json"}, global...)...); after.stdout != before.stdout {
		t.Errorf("the original's manifest changed:\n--- before\n%s\n--- after\n%s", before.stdout, after.stdout)
	}
	if n := len(events(t, global, "fk-1")); n != len(evs) {
		t.Errorf("the original has %d events, had %d", n, len(evs))
	}

	// replay shows the tree: the fork's origin and point, the original's
	// forks.
	if r := loopbus(t, append([]string{"replay", "fk-2"}, global...)...); r.code != 0 || !strings.Contains(r.stdout, "forked    from fk-1 at stream seq "+at) {
		t.Errorf("replay fk-2: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r := loopbus(t, append([]string{"replay", "fk-1"}, global...)...); r.code != 0 || !strings.Contains(r.stdout, "forks\n  fk-2\tat stream seq "+at) {
		t.Errorf("replay fk-1: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	// Forked at its end, nothing changed: every step keeps its result
	// and the fork completes without running an agent; with step two
	// changed, two and three (which requires it) run again, one does not.
	last := strconv.Itoa(len(evs))
	if r := loopbus(t, append([]string{"fork", "fk-1", "--at", last, "--as", "fk-3"}, global...)...); r.code != 0 || !strings.Contains(r.stderr, "kept: one, two, three") {
		t.Errorf("fork at the end: exit %d\n%s", r.code, r.stderr)
	}
	if r := loopbus(t, append([]string{"fork", "fk-1", "--at", last, "--as", "fk-4", "--pipeline", filepath.Join(dir, "p2.yaml")}, global...)...); r.code != 0 || !strings.Contains(r.stderr, "kept: one; to run: two, three") {
		t.Errorf("fork at the end with two changed: exit %d\n%s", r.code, r.stderr)
	}
	if log, err = os.ReadFile(runs); err != nil {
		t.Fatal(err)
	}
	steps = steps[:0]
	for _, l := range strings.Split(strings.TrimSpace(string(log)), "\n") {
		steps = append(steps, strings.SplitN(l, ":", 2)[0])
	}
	if strings.Join(steps, " ") != "one two three two three two three" {
		t.Errorf("agent runs after the forks at the end: %v, want one two three two three two three", steps)
	}
	if r := loopbus(t, append([]string{"replay", "fk-1"}, global...)...); !strings.Contains(r.stdout, "fk-3\tat stream seq "+last) || !strings.Contains(r.stdout, "fk-4\tat stream seq "+last) {
		t.Errorf("replay fk-1 does not list every fork:\n%s", r.stdout)
	}

	// A finished fork is rerun like any session (its state is read back
	// through its origin's history).
	if r := loopbus(t, append([]string{"rerun", "fk-2/three"}, global...)...); r.code != 0 {
		t.Errorf("rerun fk-2/three: exit %d\n%s", r.code, r.stderr)
	}
	if log, err = os.ReadFile(runs); err != nil || !strings.HasPrefix(strings.TrimSpace(string(log))[strings.LastIndex(strings.TrimSpace(string(log)), "\n")+1:], "three:") {
		t.Errorf("the rerun of the fork's step three did not run it: %v\n%s", err, log)
	}

	// An id in use is refused.
	if r := loopbus(t, append([]string{"fork", "fk-1", "--at", evs[point-1].ID, "--as", "fk-2"}, global...)...); r.code != 2 || !strings.Contains(r.stderr, "session already exists: fk-2") {
		t.Errorf("fork into fk-2 again: exit %d\n%s", r.code, r.stderr)
	}
}

// TestForkDetachedAcrossAnOrchestratorRestart: with the services as
// processes, `fork --detach` prints the new session and returns; the
// fork was published while the orchestrator was down, and the restarted
// orchestrator (catching up, it reads the origin's history back) runs
// it; `wait` follows it to its end.
func TestForkDetachedAcrossAnOrchestratorRestart(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	writeFiles(t, c.dir, map[string]string{"input.txt": "x\n", "pipeline.yaml": `name: pair
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
`})
	ps := c.all(1, 1, 30*time.Second)
	if r := loopbus(t, append([]string{"run", filepath.Join(c.dir, "pipeline.yaml"), "--input", filepath.Join(c.dir, "input.txt"), "--session", "cf-1", "--detach"}, c.global()...)...); r.code != 0 {
		t.Fatalf("run --detach: exit %d\n%s", r.code, r.stderr)
	}
	if r := loopbus(t, append([]string{"wait", "cf-1"}, c.global()...)...); r.code != 0 {
		t.Fatalf("wait cf-1: exit %d\n%s", r.code, r.stderr)
	}
	evs := events(t, c.global(), "cf-1")
	point := ""
	for _, e := range evs {
		if e.Type == "loopbus.step.completed" && e.Step == "first" {
			point = e.ID
		}
	}
	if err := ps["orchestrator"].kill(); err != nil {
		t.Fatal(err)
	}
	r := loopbus(t, append([]string{"fork", "cf-1", "--at", point, "--as", "cf-2", "--detach"}, c.global()...)...)
	if r.code != 0 || strings.TrimSpace(r.stdout) != "cf-2" {
		t.Fatalf("fork --detach: exit %d, stdout %q\n%s", r.code, r.stdout, r.stderr)
	}
	if err := ps["orchestrator"].start(); err != nil {
		t.Fatal(err)
	}
	if r := loopbus(t, append([]string{"wait", "cf-2", "--json"}, c.global()...)...); r.code != 0 {
		t.Fatalf("wait cf-2: exit %d\n%s\norchestrator:\n%s", r.code, r.stderr, ps["orchestrator"].logTail(40))
	} else if m := parseManifest(t, r.stdout); m.Status != "completed" || m.Steps["second"].Status != "completed" {
		t.Errorf("cf-2 after wait: %+v", m)
	}
	fevs := events(t, c.global(), "cf-2")
	if n := count(fevs, "loopbus.job.requested", "first"); n != 1 || fevs[0].ForkOf == "" {
		t.Errorf("cf-2 has %d job requests of first (want 1: the copy)", n)
	}
	c.checkAlive()
}
