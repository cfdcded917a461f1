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

// twoTaskBacklog is the backlog file of the fork tests: one exec agent
// (agent.sh) for every role, spec.md as source, and extra (its prompts).
func twoTaskBacklog(extra string) string {
	return `kind: backlog
name: bk
agents:
  a: {backend: exec, command: [sh, agent.sh]}
roles:
  iterate: a
source_files: [spec.md]
` + extra
}

// twoTasks is the task file of the fork tests: T002 depends on T001.
const twoTasks = `{"schema_version": 1, "tasks": [{"id": "T001", "title": "First", "status": "todo", "priority": 1}, {"id": "T002", "title": "Second", "status": "todo", "priority": 2, "depends_on": ["T001"]}]}`

// TestForkBacklogAfterTheFirstTask (issue 18, "Fork and rerun":
// backlogs): a finished backlog of two tasks is forked after its first
// task run completed, with a file whose review prompt changed: in the fork
// the first task is not run again, the second and the review are (the
// review with its new prompt), the task list goes on from the fork point,
// and the original is unchanged. Forked at its end, it forks from before
// the decision that completed it, and runs again only the runs that
// decision completed.
func TestForkBacklogAfterTheFirstTask(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	runs := filepath.Join(dir, "runs.log")
	writeFiles(t, dir, map[string]string{
		// Each run logs its step and its prompt's first line.
		"agent.sh": `echo "$LOOPBUS_STEP: $(head -n 1 "$LOOPBUS_PROMPT_FILE")" >> ` + runs + `
printf '{"task_id": "%s", "status": "done", "summary": "%s done"}\n' "$LOOPBUS_STEP" "$LOOPBUS_STEP" > "$LOOPBUS_OUTPUT_DIR/summary.json"
`,
		"spec.md":     "# Spec\n",
		"to-do.json":  twoTasks,
		"bk.yaml":     twoTaskBacklog(""),
		"review.yaml": twoTaskBacklog("prompts: {review: \"Review it again, harder.\"}\n"),
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

	end, start, again := completingDecision(t, evs)
	r = loopbus(t, append([]string{"fork", "bf-1", "--at", strconv.Itoa(end + 1), "--as", "bf-3"}, global...)...)
	moved := fmt.Sprintf("fork point moved back from stream sequence %d to %d: session bf-1 completed at %d, and a fork starts from a running session", end+1, start, end+1)
	if r.code != 0 || !strings.Contains(r.stderr, moved) {
		t.Fatalf("fork at the end: exit %d, want 0 with %q\n%s", r.code, moved, r.stderr)
	}
	log, err = os.ReadFile(runs)
	if err != nil {
		t.Fatal(err)
	}
	var fork []string
	for _, l := range strings.Split(strings.TrimSpace(string(log)), "\n")[5:] {
		fork = append(fork, strings.SplitN(l, ":", 2)[0])
	}
	slices.Sort(fork)
	slices.Sort(again)
	if !slices.Equal(fork, again) {
		t.Errorf("the fork at the end ran %q, want %q (the runs its origin's last decision completed)", fork, again)
	}
	if st := parseManifest(t, loopbus(t, append([]string{"status", "bf-3", "--json"}, global...)...).stdout); st.Status != "completed" {
		t.Errorf("the fork at the end: %+v", st)
	}
}

// TestForkRepoBacklogAfterTheFirstTask: a finished backlog with workdir:
// repo, of two tasks, is forked at T001's loop.merged, where T002 had not
// merged: the fork keeps T001 (done, not run again), runs T002 again on
// the origin's head at that point in a job of its own, merges it into its
// own branch, and 'loopbus pull FORK --repo DIR' brings a branch holding
// T001's commit (the origin's) and the fork's T002; the origin's branch,
// pull and manifest are unchanged. A fork file without workdir: repo is
// refused.
func TestForkRepoBacklogAfterTheFirstTask(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	repo := filepath.Join(dir, "repo")
	runs := filepath.Join(dir, "runs.log")
	writeFiles(t, repo, map[string]string{"test.sh": "ls *.txt >/dev/null 2>&1 || [ \"$LOOPBUS_STEP\" = review ]\n"})
	commitAll(t, repo)
	userRepo := repoState(t, repo)
	backlog := func(workdir string) string {
		return `kind: backlog
name: rb
agents:
  a: {backend: exec, command: [sh, agent.sh]}
roles: {iterate: a}
max_parallel: 1
validate: [sh, test.sh]
` + workdir
	}
	writeFiles(t, dir, map[string]string{
		// Each task run writes <task>.txt naming its session, and logs
		// its job.
		"agent.sh": `set -eu
case $LOOPBUS_STEP in
review) printf '{"task_id": "review", "status": "done", "summary": "all done"}\n' > "$LOOPBUS_OUTPUT_DIR/summary.json" ;;
*)
	echo "$LOOPBUS_STEP by $LOOPBUS_SESSION" > "$LOOPBUS_STEP.txt"
	echo "$LOOPBUS_JOB" >> ` + runs + `
	printf '{"task_id": "%s", "status": "done", "summary": "wrote %s.txt"}\n' "$LOOPBUS_STEP" "$LOOPBUS_STEP" > "$LOOPBUS_OUTPUT_DIR/summary.json"
	;;
esac
`,
		"rb.yaml":    backlog("workdir: repo\ntarget: {base: main}\n"),
		"plain.yaml": backlog(""),
		"to-do.json": twoTasks,
	})
	global := []string{"--data", filepath.Join(dir, "data")}
	r := loopbus(t, append([]string{"run", filepath.Join(dir, "rb.yaml"), "--tasks", filepath.Join(dir, "to-do.json"), "--repo", repo, "--session", "rb-1"}, global...)...)
	if r.code != 0 {
		t.Fatalf("run: exit %d\n%s", r.code, r.stderr)
	}
	originHead := git(t, repo, "rev-parse", "loopbus/rb-1")
	before := loopbus(t, append([]string{"status", "rb-1", "--json"}, global...)...)
	evs := events(t, global, "rb-1")
	first := slices.IndexFunc(evs, func(e cloudEvent) bool { return e.Type == "loopbus.loop.merged" })
	if first < 0 || evs[first].Step != "T001" || count(evs, "loopbus.loop.merged", "") != 2 {
		t.Fatalf("the origin merged %d runs, T001 not first", count(evs, "loopbus.loop.merged", ""))
	}
	at := strconv.Itoa(first + 1) // the stream holds only this session
	mergedHead := git(t, repo, "rev-parse", "loopbus/rb-1~1")
	if !strings.Contains(string(evs[first].Data), mergedHead) {
		t.Fatalf("T001's merge made %s, not the target's first parent %s", evs[first].Data, mergedHead)
	}

	// A fork that would leave the repository is refused.
	refused := loopbus(t, append([]string{"fork", "rb-1", "--at", at, "--as", "rb-3", "--pipeline", filepath.Join(dir, "plain.yaml")}, global...)...)
	if want := "rb-1 works on a repository (workdir: repo, target loopbus/rb-1), and the fork's file " + filepath.Join(dir, "plain.yaml") + " has no workdir: repo"; refused.code != 2 || !strings.Contains(refused.stderr, want) {
		t.Errorf("fork without workdir: repo: exit %d, want 2 with %q\n%s", refused.code, want, refused.stderr)
	}

	r = loopbus(t, append([]string{"fork", "rb-1", "--at", at, "--as", "rb-2"}, global...)...)
	if r.code != 0 {
		t.Fatalf("fork: exit %d, want 0 (completed)\n%s", r.code, r.stderr)
	}
	if want := "kept: T001; to run: T002"; !strings.Contains(r.stderr, want) {
		t.Errorf("fork stderr does not say %q:\n%s", want, r.stderr)
	}
	log := strings.Fields(mustRead(t, runs))
	if want := []string{"rb-1.T001.1", "rb-1.T002.1", "rb-2.T002.1"}; !slices.Equal(slices.Sorted(slices.Values(log)), want) {
		t.Errorf("task runs %q, want %q (the fork runs only T002)", log, want)
	}

	pull := loopbus(t, append([]string{"pull", "rb-2", "--repo", repo}, global...)...)
	if pull.code != 0 || !strings.Contains(pull.stdout+pull.stderr, "branch loopbus/rb-2 now points at") {
		t.Fatalf("pull rb-2: exit %d\n%s%s", pull.code, pull.stdout, pull.stderr)
	}
	clone := checkTarget(t, repo, "loopbus/rb-2")
	if got := mustRead(t, filepath.Join(clone, "T001.txt")); got != "T001 by rb-1\n" {
		t.Errorf("the fork's T001.txt: %q, want the origin's", got)
	}
	if got := mustRead(t, filepath.Join(clone, "T002.txt")); got != "T002 by rb-2\n" {
		t.Errorf("the fork's T002.txt: %q, want the fork's", got)
	}
	// The fork's branch grows from the origin's head at the fork point.
	if git(t, repo, "rev-parse", "loopbus/rb-2~1") != mergedHead {
		t.Errorf("loopbus/rb-2 does not build on the origin's head at the fork point %s:\n%s", mergedHead, git(t, repo, "log", "--oneline", "loopbus/rb-2"))
	}
	var st struct {
		Status string `json:"status"`
		Steps  map[string]struct {
			Status      string `json:"status"`
			ContentHash string `json:"contentHash"`
		} `json:"steps"`
		Target struct {
			Branch string `json:"branch"`
			Head   string `json:"head"`
			Merges int    `json:"merges"`
		} `json:"target"`
	}
	if err := json.Unmarshal([]byte(loopbus(t, append([]string{"status", "rb-2", "--json"}, global...)...).stdout), &st); err != nil {
		t.Fatal(err)
	}
	if tg := st.Target; st.Status != "completed" || tg.Branch != "loopbus/rb-2" || tg.Head != git(t, repo, "rev-parse", "loopbus/rb-2") || tg.Merges != 2 {
		t.Errorf("the fork's status %s, target %+v", st.Status, tg)
	}
	if st.Steps["T001"].ContentHash != parseManifest(t, before.stdout).Steps["T001"].ContentHash {
		t.Errorf("the fork's T001 %+v, want the origin's result", st.Steps["T001"])
	}
	if tasks := loopbus(t, append([]string{"tasks", "rb-2", "--json"}, global...)...); tasks.code != 0 || strings.Count(tasks.stdout, `"done"`) < 2 {
		t.Errorf("tasks rb-2: exit %d\n%s%s", tasks.code, tasks.stdout, tasks.stderr)
	}
	for _, e := range events(t, global, "rb-2")[first+2:] {
		if e.Type == "loopbus.job.requested" && strings.Contains(string(e.Data), `"loopbus/rb-1`) {
			t.Errorf("the fork's job works on the origin's branch: %s", e.Data)
		}
	}

	// The origin is untouched: its branch, its pull, its manifest, and
	// the user's branch, index and working tree.
	if h := git(t, repo, "rev-parse", "loopbus/rb-1"); h != originHead {
		t.Errorf("loopbus/rb-1 moved: %s, was %s", h, originHead)
	}
	if p := loopbus(t, append([]string{"pull", "rb-1", "--repo", repo}, global...)...); p.code != 0 || !strings.Contains(p.stdout+p.stderr, "branch loopbus/rb-1 was already at") {
		t.Errorf("pull rb-1: exit %d\n%s%s", p.code, p.stdout, p.stderr)
	}
	if after := loopbus(t, append([]string{"status", "rb-1", "--json"}, global...)...); after.stdout != before.stdout {
		t.Errorf("the original's manifest changed:\n--- before\n%s\n--- after\n%s", before.stdout, after.stdout)
	}
	if n := len(events(t, global, "rb-1")); n != len(evs) {
		t.Errorf("the original has %d events, had %d", n, len(evs))
	}
	if after := repoState(t, repo); after != userRepo {
		t.Errorf("the user's branch, index or working tree changed:\nbefore %s\nafter  %s", userRepo, after)
	}
}

// TestForkBacklogWithAChangedRole (fork: dependents run again): a
// finished backlog of two tasks is forked after its first task run
// completed, with a file whose iterate role changed: T001's run would run
// again while T002's run worked on the task list it left, so the fork
// point moves back to the last event before the decision that completed
// it (fork says so); in the fork T001 runs again with the new role, then
// T002 and the review, and the fork's task list holds the fork's work.
// The origin's task list and manifest are untouched.
func TestForkBacklogWithAChangedRole(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	runs := filepath.Join(dir, "runs.log")
	writeFiles(t, dir, map[string]string{
		// Each run logs its session, step and its prompt's first line.
		"agent.sh": `echo "$LOOPBUS_SESSION $LOOPBUS_STEP: $(head -n 1 "$LOOPBUS_PROMPT_FILE")" >> ` + runs + `
printf '{"task_id": "%s", "status": "done", "summary": "%s done by %s"}\n' "$LOOPBUS_STEP" "$LOOPBUS_STEP" "$LOOPBUS_SESSION" > "$LOOPBUS_OUTPUT_DIR/summary.json"
`,
		"spec.md":      "# Spec\n",
		"to-do.json":   twoTasks,
		"bk.yaml":      twoTaskBacklog(""),
		"iterate.yaml": twoTaskBacklog("prompts: {iterate: \"Do {{.Task.ID}} better.\"}\n"),
	})
	global := []string{"--data", filepath.Join(dir, "data")}
	if r := loopbus(t, append([]string{"run", filepath.Join(dir, "bk.yaml"), "--tasks", filepath.Join(dir, "to-do.json"), "--session", "br-1"}, global...)...); r.code != 0 {
		t.Fatalf("run: exit %d\n%s", r.code, r.stderr)
	}
	before := loopbus(t, append([]string{"status", "br-1", "--json"}, global...)...)
	exportTasks := func(session string) string {
		t.Helper()
		out := filepath.Join(t.TempDir(), "tasks.json")
		if r := loopbus(t, append([]string{"tasks", "export", session, "-o", out}, global...)...); r.code != 0 {
			t.Fatalf("tasks export %s: exit %d\n%s", session, r.code, r.stderr)
		}
		return mustRead(t, out)
	}
	tasksBefore := exportTasks("br-1")
	evs := events(t, global, "br-1")
	done := slices.IndexFunc(evs, func(e cloudEvent) bool { return e.Type == "loopbus.step.completed" && e.Step == "T001" })
	if done < 0 {
		t.Fatal("no step.completed of T001")
	}
	// Forked after T001 completed (at the event after its completion),
	// the point moves back to before the decision that completed it; the
	// stream holds only this session, so sequences are positions.
	at, point := done+2, beforeDecision(evs, done)+1
	if point >= done+1 || point < 1 {
		t.Fatalf("the event before T001's completion decision is at %d, its completion at %d", point, done+1)
	}

	r := loopbus(t, append([]string{"fork", "br-1", "--at", strconv.Itoa(at), "--as", "br-2", "--pipeline", filepath.Join(dir, "iterate.yaml")}, global...)...)
	if r.code != 0 {
		t.Fatalf("fork: exit %d, want 0 (completed)\n%s", r.code, r.stderr)
	}
	want := fmt.Sprintf("fork point moved back from stream sequence %d to %d: run T001 (role iterate, changed) completed at %d, and later work was built on it", at, point, done+1)
	if !strings.Contains(r.stderr, want) {
		t.Errorf("fork stderr does not say %q:\n%s", want, r.stderr)
	}
	var forkRuns []string
	for _, l := range strings.Split(strings.TrimSpace(mustRead(t, runs)), "\n") {
		if rest, ok := strings.CutPrefix(l, "br-2 "); ok {
			forkRuns = append(forkRuns, rest)
		}
	}
	if wantRuns := []string{"T001: Do T001 better.", "T002: Do T002 better."}; len(forkRuns) != 3 || !slices.Equal(forkRuns[:2], wantRuns) || !strings.HasPrefix(forkRuns[2], "review: ") {
		t.Errorf("the fork's runs: %q, want %q and the review", forkRuns, wantRuns)
	}
	if st := parseManifest(t, loopbus(t, append([]string{"status", "br-2", "--json"}, global...)...).stdout); st.Status != "completed" {
		t.Errorf("fork status: %+v", st)
	}
	if list := exportTasks("br-2"); !strings.Contains(list, "T001 done by br-2") || strings.Contains(list, "T001 done by br-1") || !strings.Contains(list, "T002 done by br-2") {
		t.Errorf("the fork's task list does not hold the fork's work:\n%s", list)
	}

	// The original is untouched.
	if after := loopbus(t, append([]string{"status", "br-1", "--json"}, global...)...); after.stdout != before.stdout {
		t.Errorf("the original's manifest changed:\n--- before\n%s\n--- after\n%s", before.stdout, after.stdout)
	}
	if after := exportTasks("br-1"); after != tasksBefore || !strings.Contains(after, "T001 done by br-1") {
		t.Errorf("the original's task list changed:\n--- before\n%s\n--- after\n%s", tasksBefore, after)
	}
	if n := len(events(t, global, "br-1")); n != len(evs) {
		t.Errorf("the original has %d events, had %d", n, len(evs))
	}
}
