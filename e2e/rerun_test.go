package e2e

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestRerunFailedStepAfterFixingItsAgent (issue 18, "Fork and rerun"): a
// three-step session whose second step's agent fails fails; the agent is
// fixed and `loopbus rerun SESSION/two` runs steps two and three again in
// the same session (step one is not re-run) to completion; replay up to
// the first session.failed still shows the session failed.
func TestRerunFailedStepAfterFixingItsAgent(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	marker := filepath.Join(dir, "fixed")
	runs := filepath.Join(dir, "runs.log")
	agent := func(step, extra string) string {
		return "echo " + step + " >> " + runs + "\n" + extra + "echo " + step + " > \"$LOOPBUS_OUTPUT_DIR/" + step + ".txt\"\n"
	}
	writeFiles(t, dir, map[string]string{
		"in.txt":   "x\n",
		"one.sh":   agent("one", ""),
		"two.sh":   agent("two", "[ -f "+marker+" ] || { echo 'not fixed yet' >&2; exit 1; }\n"),
		"three.sh": agent("three", ""),
		"p.yaml": `name: rerun
steps:
  one:
    agent: {backend: exec, command: [sh, one.sh]}
    prompt: go
    outputs: [{name: one.txt}]
  two:
    requires: [one]
    agent: {backend: exec, command: [sh, two.sh]}
    prompt: go
    outputs: [{name: two.txt}]
    max_iterations: 1
  three:
    requires: [two]
    agent: {backend: exec, command: [sh, three.sh]}
    prompt: go
    outputs: [{name: three.txt}]
`,
	})
	global := []string{"--data", filepath.Join(dir, "data")}
	r := loopbus(t, append([]string{"run", filepath.Join(dir, "p.yaml"), "--input", filepath.Join(dir, "in.txt"), "--session", "rr-1"}, global...)...)
	if r.code != 1 {
		t.Fatalf("run: exit %d, want 1 (step two fails)\n%s", r.code, r.stderr)
	}
	// Refusals: an unknown step, a running session (none here), all.
	if r := loopbus(t, append([]string{"rerun", "rr-1/nope"}, global...)...); r.code != 2 || !strings.Contains(r.stderr, "no step nope") {
		t.Errorf("rerun of an unknown step: exit %d\n%s", r.code, r.stderr)
	}
	if r := loopbus(t, append([]string{"rerun", "nosuch"}, global...)...); r.code != 2 {
		t.Errorf("rerun of an unknown session: exit %d\n%s", r.code, r.stderr)
	}
	evs := events(t, global, "rr-1")
	failedSeq := 0
	for i, e := range evs {
		if e.Type == "loopbus.session.failed" {
			failedSeq = i + 1 // the data dir holds only this session
			break
		}
	}
	if failedSeq == 0 {
		t.Fatalf("no session.failed")
	}

	// Fix the agent, rerun from step two.
	if err := os.WriteFile(marker, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	r = loopbus(t, append([]string{"rerun", "rr-1/two", "--reason", "agent fixed"}, global...)...)
	if r.code != 0 {
		t.Fatalf("rerun: exit %d, want 0 (completed)\n%s", r.code, r.stderr)
	}
	if !strings.Contains(r.stderr, "session rr-1 reopened: step two and the steps after it run again") {
		t.Errorf("rerun stderr does not say what runs again:\n%s", r.stderr)
	}
	log, err := os.ReadFile(runs)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Fields(string(log)); strings.Join(got, " ") != "one two two three" {
		t.Errorf("agent runs: %v, want one two two three (one not re-run)", got)
	}
	st := parseManifest(t, loopbus(t, append([]string{"status", "rr-1", "--json"}, global...)...).stdout)
	if st.Status != "completed" || st.Steps["one"].Status != "completed" || st.Steps["three"].Status != "completed" {
		t.Errorf("status after the rerun: %+v", st)
	}
	evs = events(t, global, "rr-1")
	if n := count(evs, "loopbus.job.requested", "one"); n != 1 {
		t.Errorf("step one requested %d times, want 1", n)
	}
	if n := count(evs, "loopbus.job.requested", "two"); n != 2 {
		t.Errorf("step two requested %d times, want 2", n)
	}
	if n := count(evs, "loopbus.session.rerun", ""); n != 1 {
		t.Errorf("%d session.rerun events, want 1", n)
	}
	// Every earlier state stands: replay up to the first failure.
	at := parseManifest(t, loopbus(t, append([]string{"replay", "rr-1", "--until", strconv.Itoa(failedSeq), "--json"}, global...)...).stdout)
	if at.Status != "failed" || at.FailedStep != "two" || at.Steps["two"].Status != "failed" {
		t.Errorf("replay --until %d: %+v, want failed at two", failedSeq, at)
	}
	// A completed session may be rerun (detached needs a server); a
	// closed one may not.
	if r := loopbus(t, append([]string{"rerun", "rr-1", "--detach"}, global...)...); r.code != 2 || !strings.Contains(r.stderr, "--detach") {
		t.Errorf("rerun --detach without a server: exit %d\n%s", r.code, r.stderr)
	}
}
