package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// The tests of coding loops run loop hierarchies on real git repositories
// made in the test's directory, with scripted exec agents. Workers and
// validators keep their own repository caches: the repository the test
// makes is only read by the CLI (bundled at the start, fetched into at the
// end).

// git runs git in dir and returns its trimmed output; it fails the test on
// an error.
func git(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", append([]string{"-C", dir}, args...)...)
	cmd.Env = append(testEnv(t), "GIT_CONFIG_NOSYSTEM=1", "HOME="+t.TempDir())
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git %v: %v\n%s", args, err, out)
	}
	return strings.TrimSpace(string(out))
}

// commitAll makes dir (holding the test's files) a repository on branch
// main with one commit.
func commitAll(t *testing.T, dir string) {
	t.Helper()
	git(t, dir, "init", "-q", "-b", "main")
	git(t, dir, "add", "-A")
	git(t, dir, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "start")
}

// repoState is what a run must leave untouched in the user's repository.
func repoState(t *testing.T, dir string) string {
	t.Helper()
	return git(t, dir, "rev-parse", "HEAD") + " " + git(t, dir, "symbolic-ref", "HEAD") + "\n" + git(t, dir, "status", "--porcelain", "--untracked-files=all")
}

// loopView is the part of status --json's loops list the tests read.
type loopView struct {
	ID          string `json:"id"`
	Parent      string `json:"parent"`
	Level       string `json:"level"`
	Status      string `json:"status"`
	Iterations  int    `json:"iterations"`
	Branch      string `json:"branch"`
	MergeCommit string `json:"mergeCommit"`
}

func loopsOf(t *testing.T, statusJSON string) []loopView {
	t.Helper()
	var m struct {
		Status string     `json:"status"`
		Loops  []loopView `json:"loops"`
	}
	if err := json.Unmarshal([]byte(statusJSON), &m); err != nil {
		t.Fatalf("status --json: %v\n%s", err, statusJSON)
	}
	return m.Loops
}

// checkTarget checks out the target branch in a fresh clone and runs its
// tests there; it returns the clone.
func checkTarget(t *testing.T, repo, branch string) string {
	t.Helper()
	clone := filepath.Join(t.TempDir(), "clone")
	git(t, filepath.Dir(clone), "clone", "-q", "--branch", branch, repo, clone)
	cmd := exec.Command("sh", "test.sh")
	cmd.Dir = clone
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("sh test.sh on %s: %v\n%s", branch, err, out)
	}
	return clone
}

func TestCodingExample(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	repo := filepath.Join(dir, "repo")
	if out, err := exec.Command("sh", "../examples/coding/make-repo.sh", repo).CombinedOutput(); err != nil {
		t.Fatalf("make-repo.sh: %v\n%s", err, out)
	}
	before := repoState(t, repo)
	data := filepath.Join(dir, "data")
	res := loopbus(t, "run", "../examples/coding/loops.yaml", "--repo", repo, "--task", "Add the four functions the tests ask for",
		"--session", "greet", "--data", data, "--json")
	if res.code != 0 {
		t.Fatalf("run: exit %d\n%s", res.code, res.stderr)
	}
	if !strings.Contains(res.stderr, repo+": branch loopbus/greet now points at") {
		t.Errorf("run does not say where the code is:\n%s", res.stderr)
	}
	if after := repoState(t, repo); after != before {
		t.Errorf("the user's branch, index or working tree changed:\nbefore %s\nafter  %s", before, after)
	}
	checkTarget(t, repo, "loopbus/greet")
	// One commit per code loop, each naming its loop, on top of main.
	log := git(t, repo, "log", "--format=%H %(trailers:key=Loopbus-Loop,valueonly,separator=)", "main..loopbus/greet")
	lines := strings.Split(log, "\n")
	if len(lines) != 4 {
		t.Fatalf("loopbus/greet has %d commits over main, want 4 (one per code loop):\n%s", len(lines), log)
	}
	var loops []string
	for _, l := range lines {
		_, loop, _ := strings.Cut(l, " ")
		loops = append(loops, loop)
	}
	slices.Sort(loops)
	if want := []string{"plan-001-001", "plan-001-002", "plan-002-001", "plan-002-002"}; !slices.Equal(loops, want) {
		t.Errorf("commits name loops %v, want %v", loops, want)
	}
	views := loopsOf(t, res.stdout)
	if len(views) != 7 {
		t.Fatalf("status --json lists %d loops, want 7: %+v", len(views), views)
	}
	merged := map[string]bool{}
	for _, v := range views {
		if v.Status != "completed" {
			t.Errorf("loop %s is %s, want completed", v.ID, v.Status)
		}
		if v.Level == "code" {
			if v.MergeCommit == "" || v.Branch != "loopbus/greet/"+v.ID {
				t.Errorf("code loop %s: merge commit %q, branch %q", v.ID, v.MergeCommit, v.Branch)
			}
			merged[v.MergeCommit] = true
		}
	}
	if len(merged) != 4 {
		t.Errorf("code loops name %d merge commits, want 4 distinct", len(merged))
	}
	// repeat's first try is wrong: it passes on its second iteration, whose
	// prompt carries the first verdict.
	var repeat loopView
	for _, v := range views {
		if v.ID == "plan-002-002" {
			repeat = v
		}
	}
	if repeat.Iterations != 2 {
		t.Errorf("the repeat loop took %d iterations, want 2", repeat.Iterations)
	}
	second := jobRequest(t, events(t, []string{"--data", data}, "greet"), "greet.plan-002-002.2")
	if !strings.Contains(second, "tests/repeat.sh") || !strings.Contains(second, "exited with code") {
		t.Errorf("the second iteration's prompt lacks the first verdict:\n%s", second)
	}
}

// jobRequest returns the prompt of the job requested with id.
func jobRequest(t *testing.T, evs []cloudEvent, id string) string {
	t.Helper()
	for _, e := range evs {
		if e.Type != "loopbus.job.requested" {
			continue
		}
		var jr struct {
			JobID  string `json:"jobId"`
			Prompt string `json:"prompt"`
		}
		if err := json.Unmarshal(e.Data, &jr); err != nil {
			t.Fatal(err)
		}
		if jr.JobID == id {
			return jr.Prompt
		}
	}
	t.Fatalf("no job %s requested", id)
	return ""
}

// codingRig is a repository and a loops file whose plan writes one "## "
// section per name in PARTS, each worked by a code loop running code.sh.
type codingRig struct {
	dir, repo, file string
}

func newCodingRig(t *testing.T, parts []string, codeScript string) *codingRig {
	t.Helper()
	dir := t.TempDir()
	r := &codingRig{dir: dir, repo: filepath.Join(dir, "repo"), file: filepath.Join(dir, "loops.yaml")}
	writeFiles(t, r.repo, map[string]string{"NOTES.md": "# notes\n", "test.sh": "test -s NOTES.md\n"})
	commitAll(t, r.repo)
	var plan strings.Builder
	for _, p := range parts {
		fmt.Fprintf(&plan, "## %s\\n", p)
	}
	writeFiles(t, dir, map[string]string{
		"plan.sh": fmt.Sprintf("printf '# plan\\n%s' > \"$LOOPBUS_OUTPUT_DIR/plan.md\"\n", plan.String()),
		"code.sh": codeScript,
		"loops.yaml": `kind: loops
name: rig
levels:
  plan:
    agent: {backend: exec, command: [sh, plan.sh]}
    outputs: [{name: plan.md}]
    children: {level: code, from: plan.md, split: headings}
  code:
    agent: {backend: exec, command: [sh, code.sh]}
    worktree: true
    validate: [sh, test.sh]
    max_iterations: 2
`,
	})
	return r
}

func TestCodingSiblingsConflictThenBothMerge(t *testing.T) {
	t.Parallel()
	// Both loops append their name to NOTES.md: the second merge conflicts
	// and its loop gets an iteration on the new head.
	r := newCodingRig(t, []string{"alpha", "beta"}, `name=$(sed -n 's/^## //p' "$LOOPBUS_INPUT_DIR/plan.md")
echo "$name was here" >> NOTES.md
`)
	data := filepath.Join(r.dir, "data")
	res := loopbus(t, "run", r.file, "--repo", r.repo, "--task", "note", "--session", "clash", "--data", data, "--json")
	if res.code != 0 {
		t.Fatalf("run: exit %d\n%s", res.code, res.stderr)
	}
	clone := checkTarget(t, r.repo, "loopbus/clash")
	notes := mustRead(t, filepath.Join(clone, "NOTES.md"))
	if !strings.Contains(notes, "alpha was here") || !strings.Contains(notes, "beta was here") {
		t.Errorf("NOTES.md on the target lacks a loop's line:\n%s", notes)
	}
	evs := events(t, []string{"--data", data}, "clash")
	conflicts := 0
	for _, e := range evs {
		if e.Type == "loopbus.loop.rebase" && strings.Contains(string(e.Data), `"conflict":["NOTES.md"]`) {
			conflicts++
		}
	}
	if conflicts != 1 || count(evs, "loopbus.loop.merged", "") != 2 {
		t.Errorf("%d conflict rebases and %d merges, want 1 and 2", conflicts, count(evs, "loopbus.loop.merged", ""))
	}
	for _, v := range loopsOf(t, res.stdout) {
		if v.Status != "completed" {
			t.Errorf("loop %s is %s", v.ID, v.Status)
		}
	}
}

func TestCodingDirtyOrMissingRepository(t *testing.T) {
	t.Parallel()
	r := newCodingRig(t, []string{"a"}, "echo x >> NOTES.md\n")
	data := filepath.Join(r.dir, "data")
	if err := os.WriteFile(filepath.Join(r.repo, "NOTES.md"), []byte("edited\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, repo, want string
	}{
		{"dirty", r.repo, "uncommitted changes"},
		{"missing", filepath.Join(r.dir, "nowhere"), "--repo " + filepath.Join(r.dir, "nowhere")},
		{"no repo flag", "", "name the repository with --repo DIR"},
	} {
		args := []string{"run", r.file, "--task", "x", "--data", data}
		if tc.repo != "" {
			args = append(args, "--repo", tc.repo)
		}
		res := loopbus(t, args...)
		if res.code != 2 || !strings.Contains(res.stderr, tc.want) {
			t.Errorf("%s: exit %d, want 2 with %q:\n%s", tc.name, res.code, tc.want, res.stderr)
		}
	}
}

func TestCodingInvalidateSpecRespawnsSubtree(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	c.all(1, 4, 10*time.Second)
	dir := c.dir
	release := filepath.Join(dir, "release", "go")
	repo := filepath.Join(dir, "repo")
	writeFiles(t, repo, map[string]string{"test.sh": "test -s done.txt\n"})
	commitAll(t, repo)
	writeFiles(t, dir, map[string]string{
		"plan.sh": `printf '# plan\n## one\n## two\n' > "$LOOPBUS_OUTPUT_DIR/plan.md"` + "\n",
		"spec.sh": `printf "# spec\n## a\n## b\n" > "$LOOPBUS_OUTPUT_DIR/spec.md"` + "\n",
		// Code loops wait for the release file, so the spec is invalidated
		// while they run.
		"code.sh": fmt.Sprintf("while [ ! -e %s ]; do sleep 0.05; done\necho \"$LOOPBUS_STEP\" >> done.txt\n", release),
		"loops.yaml": `kind: loops
name: inv
levels:
  plan:
    agent: {backend: exec, command: [sh, plan.sh]}
    outputs: [{name: plan.md}]
    children: {level: spec, from: plan.md, split: headings}
  spec:
    agent: {backend: exec, command: [sh, spec.sh]}
    outputs: [{name: spec.md}]
    children: {level: code, from: spec.md, split: headings}
  code:
    agent: {backend: exec, command: [sh, code.sh]}
    worktree: true
    validate: [sh, test.sh]
`,
	})
	res := loopbus(t, append([]string{"run", filepath.Join(dir, "loops.yaml"), "--repo", repo, "--task", "t", "--session", "inv", "--detach"}, c.global()...)...)
	if res.code != 0 {
		t.Fatalf("run --detach: exit %d\n%s", res.code, res.stderr)
	}
	eventually(t, 60*time.Second, "four code loops to start", func() bool {
		return count(events(t, c.global(), "inv"), "loopbus.job.started", "") >= 3+4
	})
	c.signalInvalidate("inv/plan-001")
	eventually(t, 60*time.Second, "the subtree of plan-001 to be invalidated and spawned again", func() bool {
		evs := events(t, c.global(), "inv")
		return count(evs, "loopbus.loop.invalidated", "plan-001-001") == 1 && count(evs, "loopbus.loop.invalidated", "plan-001-002") == 1 &&
			count(evs, "loopbus.loop.spawned", "plan-001-001") == 2
	})
	if err := os.WriteFile(release, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	m := c.waitTerminal(2*time.Minute, "inv")["inv"]
	if last := m[len(m)-1]; last.Type != "loopbus.session.completed" {
		t.Fatalf("session ended with %s", last.Type)
	}
	evs := events(t, c.global(), "inv")
	if n := count(evs, "loopbus.job.cancelled", ""); n != 2 {
		t.Errorf("%d jobs cancelled, want the 2 code loops of plan-001", n)
	}
	// Every code loop merged once: the invalidated generation never.
	for _, l := range []string{"plan-001-001", "plan-001-002", "plan-002-001", "plan-002-002"} {
		if n := count(evs, "loopbus.loop.merged", l); n != 1 {
			t.Errorf("loop %s merged %d times, want 1", l, n)
		}
	}
	res = loopbus(t, append([]string{"pull", "inv", "--repo", repo}, c.global()...)...)
	if res.code != 0 {
		t.Fatalf("pull: exit %d\n%s", res.code, res.stderr)
	}
	clone := checkTarget(t, repo, "loopbus/inv")
	if got := strings.Count(mustRead(t, filepath.Join(clone, "done.txt")), "\n"); got != 4 {
		t.Errorf("done.txt on the target has %d lines, want 4", got)
	}
}

// signalInvalidate sends `loopbus signal invalidate target`.
func (c *cluster) signalInvalidate(target string) {
	c.t.Helper()
	res := loopbus(c.t, append([]string{"signal", "invalidate", target, "--reason", "spec changed"}, c.global()...)...)
	if res.code != 0 {
		c.t.Fatalf("signal invalidate %s: exit %d\n%s%s", target, res.code, res.stdout, res.stderr)
	}
}

// TestCodingKillMidMerge kills the worker running a merge and the
// orchestrator while the merge runs (a git shim makes rebases slow), then
// restarts both: every code loop is merged exactly once. Two workers with
// their own repository caches share the work.
func TestCodingKillMidMerge(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	realGit, err := exec.LookPath("git")
	if err != nil {
		t.Fatal(err)
	}
	shim := filepath.Join(c.dir, "shim")
	writeFiles(t, shim, map[string]string{"git": fmt.Sprintf("#!/bin/sh\ncase \" $* \" in *\" rebase \"*) sleep 3 ;; esac\nexec %s \"$@\"\n", realGit)})
	if err := os.Chmod(filepath.Join(shim, "git"), 0o755); err != nil {
		t.Fatal(err)
	}
	c.env = append(c.env, "PATH="+shim+string(os.PathListSeparator)+os.Getenv("PATH"))
	procs := c.all(2, 2, 3*time.Second)
	// Four code loops writing files of their own; each takes a second, so
	// both workers (two jobs each) run them.
	r := newCodingRig(t, []string{"a", "b", "c", "d"}, `name=$(sed -n 's/^## //p' "$LOOPBUS_INPUT_DIR/plan.md")
sleep 1
echo "$name" > "$name.txt"
`)
	res := loopbus(t, append([]string{"run", r.file, "--repo", r.repo, "--task", "t", "--session", "kill", "--detach"}, c.global()...)...)
	if res.code != 0 {
		t.Fatalf("run --detach: exit %d\n%s", res.code, res.stderr)
	}
	// The second merge rebases (the first fast-forwards): wait until a
	// worker has started it.
	var merge chaosEvent
	eventually(t, 90*time.Second, "a merge that rebases to start", func() bool {
		for _, e := range c.events()["kill"] {
			if e.Type == "loopbus.job.started" && strings.HasSuffix(e.jobID(), ".merge2") {
				merge = e
				return true
			}
		}
		return false
	})
	if err := procs[merge.Data.Worker].kill(); err != nil {
		t.Fatal(err)
	}
	if err := procs["orchestrator"].kill(); err != nil {
		t.Fatal(err)
	}
	for _, e := range c.events()["kill"] {
		if (e.Type == "loopbus.job.completed" || e.Type == "loopbus.job.failed") && e.jobID() == merge.jobID() {
			t.Fatalf("merge %s finished before the kill: the test did not kill mid-merge", merge.jobID())
		}
	}
	for _, p := range []string{merge.Data.Worker, "orchestrator"} {
		if err := procs[p].start(); err != nil {
			t.Fatal(err)
		}
	}
	evs := c.waitTerminal(2*time.Minute, "kill")["kill"]
	if last := evs[len(evs)-1]; last.Type != "loopbus.session.completed" {
		t.Fatalf("session ended with %s", last.Type)
	}
	merged := map[string]int{}
	workers := map[string]bool{}
	starts := 0
	for _, e := range evs {
		switch {
		case e.Type == "loopbus.loop.merged":
			merged[e.Step]++
		case e.Type == "loopbus.job.started" && strings.HasPrefix(e.Step, "plan-"):
			workers[e.Data.Worker] = true
			if e.jobID() == merge.jobID() {
				starts++
			}
		}
	}
	for _, l := range []string{"plan-001", "plan-002", "plan-003", "plan-004"} {
		if merged[l] != 1 {
			t.Errorf("loop %s merged %d times, want exactly once", l, merged[l])
		}
	}
	if starts < 2 {
		t.Errorf("the killed merge started %d time(s), want it run again", starts)
	}
	if !workers["worker-a"] || !workers["worker-b"] {
		t.Errorf("worktree jobs ran on %v, want both workers", workers)
	}
	for _, w := range []string{"worker-a", "worker-b"} {
		if _, err := os.Stat(filepath.Join(c.dir, "work-"+w, "repos", "kill.git")); err != nil {
			t.Errorf("%s has no repository cache of its own: %v", w, err)
		}
	}
	res = loopbus(t, append([]string{"pull", "kill", "--repo", r.repo}, c.global()...)...)
	if res.code != 0 {
		t.Fatalf("pull: exit %d\n%s", res.code, res.stderr)
	}
	checkTarget(t, r.repo, "loopbus/kill")
	if n := git(t, r.repo, "rev-list", "--count", "main..loopbus/kill"); n != "4" {
		t.Errorf("loopbus/kill has %s commits over main, want 4", n)
	}
}

// TestBacklogInRepository works a backlog with workdir: repo: each task's
// agent writes a file in a worktree of the repository, and each passed
// task run is merged into the session's branch.
func TestBacklogInRepository(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	repo := filepath.Join(dir, "repo")
	writeFiles(t, repo, map[string]string{"test.sh": "ls *.txt >/dev/null 2>&1 || [ \"$LOOPBUS_STEP\" = review ]\n"})
	commitAll(t, repo)
	before := repoState(t, repo)
	writeFiles(t, dir, map[string]string{
		"agent.sh": `set -eu
case $LOOPBUS_STEP in
review) printf '{"task_id": "review", "status": "done", "summary": "all done"}\n' > "$LOOPBUS_OUTPUT_DIR/summary.json" ;;
*)
	echo "$LOOPBUS_STEP" > "$LOOPBUS_STEP.txt"
	printf '{"task_id": "%s", "status": "done", "summary": "wrote %s.txt"}\n' "$LOOPBUS_STEP" "$LOOPBUS_STEP" > "$LOOPBUS_OUTPUT_DIR/summary.json"
	;;
esac
`,
		"backlog.yaml": `kind: backlog
name: inrepo
agents:
  a: {backend: exec, command: [sh, agent.sh]}
roles: {iterate: a}
workdir: repo
target: {base: main}
max_parallel: 2
validate: [sh, test.sh]
`,
		"to-do.json": `{"schema_version": 1, "tasks": [{"id": "T1", "title": "one", "status": "todo"}, {"id": "T2", "title": "two", "status": "todo"}]}`,
	})
	data := filepath.Join(dir, "data")
	res := loopbus(t, "run", filepath.Join(dir, "backlog.yaml"), "--tasks", filepath.Join(dir, "to-do.json"), "--repo", repo, "--session", "inrepo", "--data", data)
	if res.code != 0 {
		t.Fatalf("run: exit %d\n%s", res.code, res.stderr)
	}
	if after := repoState(t, repo); after != before {
		t.Errorf("the user's branch, index or working tree changed:\nbefore %s\nafter  %s", before, after)
	}
	clone := filepath.Join(t.TempDir(), "clone")
	git(t, filepath.Dir(clone), "clone", "-q", "--branch", "loopbus/inrepo", repo, clone)
	for _, f := range []string{"T1.txt", "T2.txt"} {
		if _, err := os.Stat(filepath.Join(clone, f)); err != nil {
			t.Errorf("loopbus/inrepo lacks %s: %v", f, err)
		}
	}
	if n := git(t, repo, "rev-list", "--count", "main..loopbus/inrepo"); n != "2" {
		t.Errorf("loopbus/inrepo has %s commits over main, want 2 (one per task)", n)
	}
	// Both tasks passed at once from the same head: the second merge
	// rebased onto the first.
	if n := count(events(t, []string{"--data", data}, "inrepo"), "loopbus.loop.merged", ""); n != 2 {
		t.Errorf("%d merges, want 2", n)
	}
	st := loopbus(t, "status", "inrepo", "--data", data, "--json")
	var m struct {
		Target struct {
			Branch string `json:"branch"`
			Head   string `json:"head"`
			Merges int    `json:"merges"`
		} `json:"target"`
	}
	if err := json.Unmarshal([]byte(st.stdout), &m); err != nil {
		t.Fatalf("status --json: %v\n%s", err, st.stdout)
	}
	if tip := git(t, repo, "rev-parse", "loopbus/inrepo"); m.Target.Branch != "loopbus/inrepo" || m.Target.Head != tip || m.Target.Merges != 2 {
		t.Errorf("status target = %+v, want loopbus/inrepo at %s with 2 merges", m.Target, tip)
	}
}
