package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestForkCodingLoopsAfterAMerge (issue 18, "Fork and rerun": coding
// loops): a finished coding session whose plan spawned two code loops is
// forked at the first loop.merged, where alpha had merged and beta had
// not: the fork runs beta again (not alpha, nor the plan) on the origin's
// head at that point, merges it into its own target branch, and
// 'loopbus pull FORK --repo DIR' brings a branch holding alpha's commit
// (the origin's) and the fork's beta; the origin's branch and pull are
// unchanged.
func TestForkCodingLoopsAfterAMerge(t *testing.T) {
	t.Parallel()
	// Each code loop writes <part>.txt naming its session, and logs its
	// job.
	runs := filepath.Join(t.TempDir(), "runs.log")
	r := newCodingRig(t, []string{"alpha", "beta"}, `name=$(sed -n 's/^## //p' "$LOOPBUS_INPUT_DIR/plan.md")
echo "$name by $LOOPBUS_SESSION" > "$name.txt"
echo "$LOOPBUS_JOB" >> `+runs+`
`)
	global := []string{"--data", filepath.Join(r.dir, "data")}
	res := loopbus(t, append([]string{"run", r.file, "--repo", r.repo, "--task", "two files", "--session", "cf-1"}, global...)...)
	if res.code != 0 {
		t.Fatalf("run: exit %d\n%s", res.code, res.stderr)
	}
	originHead := git(t, r.repo, "rev-parse", "loopbus/cf-1")
	before := loopbus(t, append([]string{"status", "cf-1", "--json"}, global...)...)
	evs := events(t, global, "cf-1")
	first := slices.IndexFunc(evs, func(e cloudEvent) bool { return e.Type == "loopbus.loop.merged" })
	if first < 0 || count(evs, "loopbus.loop.merged", "") != 2 {
		t.Fatalf("the origin merged %d loops, want 2", count(evs, "loopbus.loop.merged", ""))
	}
	merged, other := "plan-001", "plan-002" // alpha, beta
	if evs[first].Step != merged {
		merged, other = other, merged
	}
	at := strconv.Itoa(first + 1) // the stream holds only this session
	mergedHead := git(t, r.repo, "rev-parse", "loopbus/cf-1~1")
	if !strings.Contains(string(evs[first].Data), mergedHead) {
		t.Fatalf("the first merge made %s, not the target's first parent %s:\n%s", evs[first].Data, mergedHead, evs[first].Data)
	}

	res = loopbus(t, append([]string{"fork", "cf-1", "--at", at, "--as", "cf-2"}, global...)...)
	if res.code != 0 {
		t.Fatalf("fork: exit %d, want 0 (completed)\n%s", res.code, res.stderr)
	}
	if want := "kept: plan, " + merged + "; to run: " + other; !strings.Contains(res.stderr, want) {
		t.Errorf("fork stderr does not say %q:\n%s", want, res.stderr)
	}
	log := strings.Fields(mustRead(t, runs))
	if want := []string{"cf-1.plan-001.1", "cf-1.plan-002.1", "cf-2." + other + ".1.r1"}; !slices.Equal(slices.Sorted(slices.Values(log)), want) {
		t.Errorf("code runs %q, want %q (the fork runs only %s)", log, want, other)
	}

	pull := loopbus(t, append([]string{"pull", "cf-2", "--repo", r.repo}, global...)...)
	if pull.code != 0 || !strings.Contains(pull.stdout+pull.stderr, "branch loopbus/cf-2 now points at") {
		t.Fatalf("pull cf-2: exit %d\n%s%s", pull.code, pull.stdout, pull.stderr)
	}
	clone := checkTarget(t, r.repo, "loopbus/cf-2")
	names := map[string]string{"plan-001": "alpha", "plan-002": "beta"}
	if got := mustRead(t, filepath.Join(clone, names[merged]+".txt")); got != names[merged]+" by cf-1\n" {
		t.Errorf("the fork's %s.txt: %q, want the origin's", names[merged], got)
	}
	if got := mustRead(t, filepath.Join(clone, names[other]+".txt")); got != names[other]+" by cf-2\n" {
		t.Errorf("the fork's %s.txt: %q, want the fork's", names[other], got)
	}
	var st struct {
		Target struct {
			Branch string `json:"branch"`
			Head   string `json:"head"`
			Merges int    `json:"merges"`
		} `json:"target"`
	}
	if err := json.Unmarshal([]byte(loopbus(t, append([]string{"status", "cf-2", "--json"}, global...)...).stdout), &st); err != nil {
		t.Fatal(err)
	}
	if tg := st.Target; tg.Branch != "loopbus/cf-2" || tg.Head != git(t, r.repo, "rev-parse", "loopbus/cf-2") || tg.Merges != 2 {
		t.Errorf("the fork's status names its target %+v", tg)
	}
	// The fork's branch grows from the origin's head at the fork point.
	if git(t, r.repo, "rev-parse", "loopbus/cf-2~1") != mergedHead {
		t.Errorf("loopbus/cf-2 does not build on the origin's head at the fork point %s:\n%s", mergedHead, git(t, r.repo, "log", "--oneline", "loopbus/cf-2"))
	}
	for _, e := range events(t, global, "cf-2")[first+2:] {
		if e.Type == "loopbus.job.requested" && strings.Contains(string(e.Data), `"loopbus/cf-1`) {
			t.Errorf("the fork's job works on the origin's branch: %s", e.Data)
		}
	}

	// The origin is untouched: its branch, its pull, its manifest.
	if h := git(t, r.repo, "rev-parse", "loopbus/cf-1"); h != originHead {
		t.Errorf("loopbus/cf-1 moved: %s, was %s", h, originHead)
	}
	if p := loopbus(t, append([]string{"pull", "cf-1", "--repo", r.repo}, global...)...); p.code != 0 || !strings.Contains(p.stdout+p.stderr, "branch loopbus/cf-1 was already at") {
		t.Errorf("pull cf-1: exit %d\n%s%s", p.code, p.stdout, p.stderr)
	}
	if after := loopbus(t, append([]string{"status", "cf-1", "--json"}, global...)...); after.stdout != before.stdout {
		t.Errorf("the original's manifest changed:\n--- before\n%s\n--- after\n%s", before.stdout, after.stdout)
	}
	if _, err := os.Stat(filepath.Join(r.repo, names[other]+".txt")); err == nil {
		t.Error("the user's working tree changed")
	}
}

// beforeDecision is the index in evs of the last event before the
// orchestrator's decision holding evs[i] (its events are in a row, with
// its trigger as causation): where a fork point moves back to.
func beforeDecision(evs []cloudEvent, i int) int {
	for ev := evs[i]; i > 0 && evs[i-1].Source == ev.Source && evs[i-1].Causation == ev.Causation && evs[i-1].Correlation == ev.Correlation; {
		i--
	}
	return i - 1
}

// TestForkLoopsWithAChangedMergedLevel (fork: dependents run again): a
// coding session is forked after its first loop.merged with a file whose
// code level changed: the merged loop would run again while the other
// loop's merge was rebased on its commits, so the fork point moves back
// to the last event before the decision that merged it (fork says so);
// the fork runs both code loops again with the new level, and 'loopbus
// pull FORK' brings a branch with the new work and without the origin's
// loop commit. The origin is untouched.
func TestForkLoopsWithAChangedMergedLevel(t *testing.T) {
	t.Parallel()
	runs := filepath.Join(t.TempDir(), "runs.log")
	r := newCodingRig(t, []string{"alpha", "beta"}, `name=$(sed -n 's/^## //p' "$LOOPBUS_INPUT_DIR/plan.md")
echo "$name by $LOOPBUS_SESSION" > "$name.txt"
echo "$LOOPBUS_JOB" >> `+runs+`
`)
	writeFiles(t, r.dir, map[string]string{
		"code2.sh": `name=$(sed -n 's/^## //p' "$LOOPBUS_INPUT_DIR/plan.md")
echo "$name v2 by $LOOPBUS_SESSION" > "$name.txt"
echo "$LOOPBUS_JOB v2" >> ` + runs + `
`,
		"loops2.yaml": strings.Replace(mustRead(t, r.file), "command: [sh, code.sh]", "command: [sh, code2.sh]", 1),
	})
	global := []string{"--data", filepath.Join(r.dir, "data")}
	if res := loopbus(t, append([]string{"run", r.file, "--repo", r.repo, "--task", "two files", "--session", "cm-1"}, global...)...); res.code != 0 {
		t.Fatalf("run: exit %d\n%s", res.code, res.stderr)
	}
	originHead := git(t, r.repo, "rev-parse", "loopbus/cm-1")
	before := loopbus(t, append([]string{"status", "cm-1", "--json"}, global...)...)
	evs := events(t, global, "cm-1")
	first := slices.IndexFunc(evs, func(e cloudEvent) bool { return e.Type == "loopbus.loop.merged" })
	if first < 0 || count(evs, "loopbus.loop.merged", "") != 2 {
		t.Fatalf("the origin merged %d loops, want 2", count(evs, "loopbus.loop.merged", ""))
	}
	merged := evs[first].Step
	firstMerge := git(t, r.repo, "rev-parse", "loopbus/cm-1~1") // the target after the first merge
	// Forked after the first merge (at the event after it), the point
	// moves back to before the decision that merged it; the stream holds
	// only this session, so sequences are positions.
	at, point := first+2, beforeDecision(evs, first)+1
	if point >= first+1 || point < 1 {
		t.Fatalf("the event before the merge's decision is at %d, the merge at %d", point, first+1)
	}

	res := loopbus(t, append([]string{"fork", "cm-1", "--at", strconv.Itoa(at), "--as", "cm-2", "--pipeline", filepath.Join(r.dir, "loops2.yaml")}, global...)...)
	if res.code != 0 {
		t.Fatalf("fork: exit %d, want 0 (completed)\n%s", res.code, res.stderr)
	}
	want := fmt.Sprintf("fork point moved back from stream sequence %d to %d: loop %s (level code, changed) merged at %d, and later work was built on it", at, point, merged, first+1)
	if !strings.Contains(res.stderr, want) {
		t.Errorf("fork stderr does not say %q:\n%s", want, res.stderr)
	}
	if want := fmt.Sprintf("session cm-2 forked from cm-1 at stream sequence %d", point); !strings.Contains(res.stderr, want) {
		t.Errorf("fork stderr does not say %q:\n%s", want, res.stderr)
	}
	var v2 []string
	for _, l := range strings.Split(strings.TrimSpace(mustRead(t, runs)), "\n") {
		if strings.HasSuffix(l, " v2") {
			v2 = append(v2, strings.TrimSuffix(l, " v2"))
		}
	}
	if slices.Sort(v2); !slices.Equal(v2, []string{"cm-2.plan-001.1.r1", "cm-2.plan-002.1.r1"}) {
		t.Errorf("the fork's code runs with the new level: %q, want both loops', in the fork\n%s", v2, mustRead(t, runs))
	}

	pull := loopbus(t, append([]string{"pull", "cm-2", "--repo", r.repo}, global...)...)
	if pull.code != 0 || !strings.Contains(pull.stdout+pull.stderr, "branch loopbus/cm-2 now points at") {
		t.Fatalf("pull cm-2: exit %d\n%s%s", pull.code, pull.stdout, pull.stderr)
	}
	clone := checkTarget(t, r.repo, "loopbus/cm-2")
	for _, name := range []string{"alpha", "beta"} {
		if got := mustRead(t, filepath.Join(clone, name+".txt")); got != name+" v2 by cm-2\n" {
			t.Errorf("the fork's %s.txt: %q, want the fork's new work", name, got)
		}
	}
	if out, err := exec.Command("git", "-C", r.repo, "merge-base", "--is-ancestor", firstMerge, "loopbus/cm-2").CombinedOutput(); err == nil {
		t.Errorf("loopbus/cm-2 holds the origin's merge of %s (%s):\n%s%s", merged, firstMerge, out, git(t, r.repo, "log", "--oneline", "loopbus/cm-2"))
	}
	base := git(t, r.repo, "merge-base", "loopbus/cm-1", "loopbus/cm-2")
	if base != git(t, r.repo, "rev-parse", "main") {
		t.Errorf("loopbus/cm-2 branches from %s, want the session's base (main)", base)
	}

	// The origin is untouched: its branch, its pull, its manifest, its events.
	if h := git(t, r.repo, "rev-parse", "loopbus/cm-1"); h != originHead {
		t.Errorf("loopbus/cm-1 moved: %s, was %s", h, originHead)
	}
	if p := loopbus(t, append([]string{"pull", "cm-1", "--repo", r.repo}, global...)...); p.code != 0 || !strings.Contains(p.stdout+p.stderr, "branch loopbus/cm-1 was already at") {
		t.Errorf("pull cm-1: exit %d\n%s%s", p.code, p.stdout, p.stderr)
	}
	if after := loopbus(t, append([]string{"status", "cm-1", "--json"}, global...)...); after.stdout != before.stdout {
		t.Errorf("the original's manifest changed:\n--- before\n%s\n--- after\n%s", before.stdout, after.stdout)
	}
	if n := len(events(t, global, "cm-1")); n != len(evs) {
		t.Errorf("the original has %d events, had %d", n, len(evs))
	}
}
