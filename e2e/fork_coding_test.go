package e2e

import (
	"encoding/json"
	"os"
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
// unchanged. A fork whose changed code level would run alpha again is
// refused.
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

	// A changed code level would run the merged loop again: refused.
	writeFiles(t, r.dir, map[string]string{"loops2.yaml": strings.Replace(mustRead(t, r.file), "max_iterations: 2", "max_iterations: 3", 1)})
	refused := loopbus(t, append([]string{"fork", "cf-1", "--at", at, "--as", "cf-3", "--pipeline", filepath.Join(r.dir, "loops2.yaml")}, global...)...)
	if want := "loops merged into loopbus/cf-1 at the fork point would run again or go (" + merged; refused.code != 2 || !strings.Contains(refused.stderr, want) {
		t.Errorf("fork with a changed code level: exit %d, want 2 with %q\n%s", refused.code, want, refused.stderr)
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
