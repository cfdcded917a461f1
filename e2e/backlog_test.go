package e2e

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// The tests of backlogs drive real processes (loopbus nats, orchestrator,
// validator, projector, agentworker replicas) with testdata/backlog-agent,
// a scripted agent whose outputs a test plans per run, and read results as
// a user does: events, `loopbus tasks`, `tasks export`, `replay`.

var updateGolden = flag.Bool("update", false, "rewrite golden files")

// backlogRig is a loop rig plus the scripted agent's plan directory.
type backlogRig struct {
	*loopRig
	plan string
}

func newBacklogRig(t *testing.T, workers, concurrency int) *backlogRig {
	t.Helper()
	r := &backlogRig{loopRig: newLoopRigOf(t, workers, concurrency)}
	r.plan = filepath.Join(r.dir, "plan")
	if err := os.MkdirAll(r.plan, 0o755); err != nil {
		t.Fatal(err)
	}
	return r
}

// backlog writes backlog.yaml with the scripted agent; top adds lines.
func (r *backlogRig) backlog(top string) string {
	r.t.Helper()
	script, err := filepath.Abs(filepath.Join("testdata", "backlog-agent"))
	if err != nil {
		r.t.Fatal(err)
	}
	y := fmt.Sprintf(`kind: backlog
name: demo
project: Demo
agents:
  scripted:
    backend: exec
    command: [%s]
    env: {FAKE_DIR: %s, FAKE_PLAN: %s}
roles:
  iterate: scripted
source_files: [spec.md]
timeout: 1m
%s`, script, r.fake, r.plan, top)
	writeFiles(r.t, r.dir, map[string]string{"backlog.yaml": y, "spec.md": "# Spec\n\nBuild the thing.\n"})
	return filepath.Join(r.dir, "backlog.yaml")
}

// planRun sets what run n of step writes (n 0: every run without its own).
func (r *backlogRig) planRun(step string, n int, content string) {
	r.t.Helper()
	name := step + ".json"
	if n > 0 {
		name = fmt.Sprintf("%s.%d.json", step, n)
	}
	writeFiles(r.t, r.plan, map[string]string{name: content})
}

// run starts a session of file (detached).
func (r *backlogRig) run(file, session string, args ...string) {
	r.t.Helper()
	res := loopbus(r.t, append(append([]string{"run", file, "--session", session, "--detach"}, args...), r.global()...)...)
	if res.code != 0 {
		r.t.Fatalf("run: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}
}

// backlogTrace renders the decisions of a session one per line.
func backlogTrace(evs []loopEvent) string {
	var b strings.Builder
	for _, e := range evs {
		switch e.Type {
		case "loopbus.task.selected", "loopbus.task.added", "loopbus.task.updated", "loopbus.backlog.phase",
			"loopbus.job.requested", "loopbus.validation.failed", "loopbus.session.completed", "loopbus.session.failed":
			fmt.Fprintf(&b, "%s\n", traceLine(e))
		}
	}
	return b.String()
}

func traceLine(e loopEvent) string {
	typ := strings.TrimPrefix(e.Type, "loopbus.")
	switch typ {
	case "task.selected":
		return typ + " " + e.str("id")
	case "task.added":
		t, _ := e.data["task"].(map[string]any)
		id, _ := t["id"].(string)
		return typ + " " + id + " by " + e.str("by")
	case "task.updated":
		return typ + " " + e.str("id") + " " + e.str("status")
	case "backlog.phase":
		return typ + " " + e.str("phase")
	case "job.requested":
		return typ + " " + e.str("jobId")
	}
	return typ
}

// selected lists the task ids in the order they were selected.
func selected(evs []loopEvent) []string {
	var out []string
	for _, e := range ofType(evs, "task.selected") {
		out = append(out, e.str("id"))
	}
	return out
}

const importedTasks = `{
  "schema_version": 1,
  "project": {"name": "Demo", "root": "."},
  "source_files": ["spec.md"],
  "tasks": [
    {"id": "T001", "title": "Lay the foundation", "priority": 2, "status": "todo"},
    {"id": "T002", "title": "Build the walls", "priority": 1, "status": "todo", "depends_on": ["T003"]},
    {"id": "T003", "title": "Frame the walls", "priority": 3, "status": "todo", "depends_on": ["T001"]},
    {"id": "T004", "title": "Paint", "priority": 1, "status": "todo"},
    {"id": "T005", "title": "Buy paint", "priority": 1, "status": "done"}
  ]
}
`

// TestBacklogImportedRunsInOrder: an imported backlog runs to done in
// dependency and priority order; an agent adds a task mid-run (it runs by
// its priority); a review pass adds a task, and the next review agrees;
// the exported to-do.json equals the golden file; replay --until shows the
// task list as it was.
func TestBacklogImportedRunsInOrder(t *testing.T) {
	t.Parallel()
	r := newBacklogRig(t, 1, 2)
	file := r.backlog("")
	writeFiles(t, r.dir, map[string]string{"to-do.json": importedTasks})
	// T004 finds a task more urgent than the rest, depending on T001.
	r.planRun("T004", 1, `{"task_id": "T004", "status": "done", "summary": "Painted; the primer is missing.", "files": ["walls.txt"],
  "new_tasks": [{"title": "Prime the walls", "priority": 1, "depends_on": ["T001"], "tags": ["found"]}]}`)
	r.planRun("review", 1, `{"task_id": "review", "status": "done", "summary": "The spec asks for a roof.",
  "new_tasks": [{"id": "T010", "title": "Put on the roof", "priority": 2, "depends_on": ["T002"]}]}`)
	r.planRun("review", 2, `{"task_id": "review", "status": "done", "summary": "Everything in the spec is covered."}`)
	r.run(file, "bl-import", "--tasks", filepath.Join(r.dir, "to-do.json"))
	evs := r.completed("bl-import")

	// T004 (p1, no deps) first; T002 (p1) waits for T003, which waits for
	// T001; T006 (added by T004, p1) waits for T001; T001 (p2) next.
	want := []string{"T004", "T001", "T006", "T003", "T002", "T010"}
	if got := selected(evs); !slices.Equal(got, want) {
		t.Errorf("tasks selected in order %v, want %v\n%s", got, want, backlogTrace(evs))
	}
	phases := []string{}
	for _, e := range ofType(evs, "backlog.phase") {
		phases = append(phases, e.str("phase"))
	}
	if want := []string{"iterate", "review", "iterate", "review", "done"}; !slices.Equal(phases, want) {
		t.Errorf("phases %v, want %v", phases, want)
	}
	// The agent's task was added by its job, between T004's update and the
	// next selection.
	trace := backlogTrace(evs)
	if !strings.Contains(trace, "task.updated T004 done\ntask.added T006 by bl-import.T004.1\ntask.selected T001") {
		t.Errorf("the task T004 found is not added with T004's result:\n%s", trace)
	}
	// Each prompt names its task; the list in T001's shows the new task.
	if p := r.prompt("T001", 1); !strings.Contains(p, "Your task: T001") || !strings.Contains(p, "T006 [todo] p1 Prime the walls (depends on T001)") {
		t.Errorf("T001's prompt lacks its task or the task list:\n%s", p)
	}

	// The task list as the user sees it.
	res := loopbus(t, append([]string{"tasks", "bl-import"}, r.global()...)...)
	if res.code != 0 || !strings.Contains(res.stdout, "T010") {
		t.Fatalf("tasks: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}
	// The export equals the golden file, times aside (they are checked,
	// then fixed).
	out := filepath.Join(r.dir, "exported.json")
	if res := loopbus(t, append([]string{"tasks", "export", "bl-import", "-o", out}, r.global()...)...); res.code != 0 {
		t.Fatalf("tasks export: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}
	compareGolden(t, out, filepath.Join("testdata", "backlog", "export.golden.json"))
	// The exported file is a valid task file.
	if res := loopbus(t, "tasks", "validate", out); res.code != 0 {
		t.Errorf("tasks validate of the export: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}

	// replay --until the first task's completion: T004 done, the task it
	// found added, nothing else done yet.
	// The stream holds this session only, so its i-th event is at
	// sequence i+1. The cut is inside the batch that applied T004's
	// result: T004 done and T006 added, T001 not yet selected.
	var until int
	for i, e := range evs {
		if e.Type == "loopbus.task.added" && strings.Contains(traceLine(e), "T006") {
			until = i + 1
		}
	}
	res = loopbus(t, append([]string{"replay", "bl-import", "--until", fmt.Sprint(until), "--tasks", "--json"}, r.global()...)...)
	if res.code != 0 {
		t.Fatalf("replay --tasks: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}
	var view struct {
		Phase string `json:"phase"`
		Tasks []struct {
			ID, Status string
		} `json:"tasks"`
	}
	if err := json.Unmarshal([]byte(res.stdout), &view); err != nil {
		t.Fatalf("replay --tasks --json: %v\n%s", err, res.stdout)
	}
	statuses := map[string]string{}
	for _, tk := range view.Tasks {
		statuses[tk.ID] = tk.Status
	}
	wantThen := map[string]string{"T001": "todo", "T002": "todo", "T003": "todo", "T004": "done", "T005": "done", "T006": "todo"}
	if fmt.Sprint(statuses) != fmt.Sprint(wantThen) || view.Phase != "iterate" {
		t.Errorf("replay --until %d: phase %q, tasks %v; want iterate, %v", until, view.Phase, statuses, wantThen)
	}
}

// compareGolden compares an exported task file with a golden one, byte for
// byte once its times (checked first) are fixed.
func compareGolden(t *testing.T, gotPath, goldenPath string) {
	t.Helper()
	raw, err := os.ReadFile(gotPath)
	if err != nil {
		t.Fatal(err)
	}
	times := regexp.MustCompile(`"(created_at|updated_at)": "([^"]*)"`)
	n := 0
	got := times.ReplaceAllFunc(raw, func(m []byte) []byte {
		sub := times.FindSubmatch(m)
		if _, err := time.Parse(time.RFC3339Nano, string(sub[2])); err != nil {
			t.Errorf("%s %q is not a time", sub[1], sub[2])
		}
		n++
		return []byte(`"` + string(sub[1]) + `": "2026-01-01T00:00:00Z"`)
	})
	if n == 0 {
		t.Errorf("the export has no times:\n%s", raw)
	}
	if *updateGolden {
		if err := os.MkdirAll(filepath.Dir(goldenPath), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(goldenPath, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(goldenPath)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if string(got) != string(want) {
		t.Errorf("export differs from %s (times fixed):\n%s", goldenPath, got)
	}
}

// TestBacklogBootstrap: with no task file, the bootstrap agent proposes
// the tasks from the source files; they run; the review agrees.
func TestBacklogBootstrap(t *testing.T) {
	t.Parallel()
	r := newBacklogRig(t, 1, 2)
	file := r.backlog("")
	r.planRun("bootstrap", 1, `{"schema_version": 1, "project": {"name": "Demo"}, "source_files": ["spec.md"], "tasks": [
  {"id": "T001", "title": "Build", "status": "todo", "priority": 1},
  {"id": "T002", "title": "Test", "status": "todo", "priority": 1, "depends_on": ["T001"]}]}`)
	r.run(file, "bl-boot")
	evs := r.completed("bl-boot")
	if got, want := selected(evs), []string{"T001", "T002"}; !slices.Equal(got, want) {
		t.Errorf("selected %v, want %v\n%s", got, want, backlogTrace(evs))
	}
	trace := backlogTrace(evs)
	if !strings.HasPrefix(trace, "backlog.phase bootstrap\njob.requested bl-boot.bootstrap.1\ntask.added T001 by bl-boot.bootstrap.1\ntask.added T002 by bl-boot.bootstrap.1\nbacklog.phase iterate\n") {
		t.Errorf("the session does not start with the bootstrap:\n%s", trace)
	}
	// The bootstrap agent got the source files.
	if p := r.prompt("bootstrap", 1); !strings.Contains(p, "spec.md") {
		t.Errorf("the bootstrap prompt does not name the source files:\n%s", p)
	}
}

// TestBacklogRepair: an imported task file with a dependency cycle starts
// a repair run; its first fix is still invalid and is fed back; the second
// is accepted and its tasks run.
func TestBacklogRepair(t *testing.T) {
	t.Parallel()
	r := newBacklogRig(t, 1, 2)
	file := r.backlog("")
	writeFiles(t, r.dir, map[string]string{"broken.json": `{"schema_version": 1, "tasks": [
  {"id": "A", "title": "a", "status": "todo", "depends_on": ["B"]},
  {"id": "B", "title": "b", "status": "todo", "depends_on": ["A"]}]}`})
	res := loopbus(t, "tasks", "validate", filepath.Join(r.dir, "broken.json"))
	if res.code != 1 || !strings.Contains(res.stdout+res.stderr, "A -> B -> A") {
		t.Errorf("tasks validate of a cycle: exit %d, want 1 naming the cycle A -> B -> A\n%s%s", res.code, res.stdout, res.stderr)
	}
	r.planRun("repair", 1, `{"schema_version": 1, "tasks": [{"id": "A", "title": "a", "status": "todo", "depends_on": ["C"]}]}`)
	r.planRun("repair", 2, `{"schema_version": 1, "tasks": [{"id": "A", "title": "a", "status": "todo"}, {"id": "B", "title": "b", "status": "todo", "depends_on": ["A"]}]}`)
	run := loopbus(t, append([]string{"run", file, "--session", "bl-repair", "--detach", "--tasks", filepath.Join(r.dir, "broken.json")}, r.global()...)...)
	if run.code != 0 {
		t.Fatalf("run: exit %d\n%s", run.code, run.stderr)
	}
	evs := r.completed("bl-repair")
	trace := backlogTrace(evs)
	if !strings.HasPrefix(trace, "backlog.phase repair\njob.requested bl-repair.repair.1\njob.requested bl-repair.repair.2\ntask.added A by bl-repair.repair.2\ntask.added B by bl-repair.repair.2\nbacklog.phase iterate\n") {
		t.Errorf("repair trace:\n%s", trace)
	}
	if got, want := selected(evs), []string{"A", "B"}; !slices.Equal(got, want) {
		t.Errorf("selected %v, want %v", got, want)
	}
	// The repair agent saw the problems and the file; its second run, why
	// the first fix was refused (the schema passed, the orchestrator's
	// dependency check did not: it is fed back the same way).
	if p := r.prompt("repair", 1); !strings.Contains(p, "dependency cycle: A -> B -> A") || !strings.Contains(p, "in/broken.json") {
		t.Errorf("repair prompt lacks the cycle or the file:\n%s", p)
	}
	if p := r.prompt("repair", 2); !strings.Contains(p, "task A depends on C, which does not exist") {
		t.Errorf("second repair prompt lacks the feedback:\n%s", p)
	}
}

// TestBacklogTwoTasksAtOnce: with max_parallel 2 and two workers that run
// one job each, two independent tasks run at the same time (each agent
// waits to see the other start), on different workers; the task that
// depends on both runs after them.
func TestBacklogTwoTasksAtOnce(t *testing.T) {
	t.Parallel()
	r := newBacklogRig(t, 2, 1)
	file := r.backlog("max_parallel: 2\n")
	writeFiles(t, r.dir, map[string]string{"to-do.json": `{"schema_version": 1, "tasks": [
  {"id": "T1", "title": "left", "status": "todo", "priority": 1},
  {"id": "T2", "title": "right", "status": "todo", "priority": 1},
  {"id": "T3", "title": "join", "status": "todo", "priority": 1, "depends_on": ["T1", "T2"]}]}`})
	writeFiles(t, r.plan, map[string]string{"T1.meet": "T2", "T2.meet": "T1"})
	r.run(file, "bl-par", "--tasks", filepath.Join(r.dir, "to-do.json"))
	evs := r.completed("bl-par")
	workers := map[string]string{}
	for _, e := range ofType(evs, "job.started") {
		workers[e.Step] = e.str("worker")
	}
	if workers["T1"] == "" || workers["T1"] == workers["T2"] {
		t.Errorf("T1 and T2 ran on workers %q and %q, want two different workers", workers["T1"], workers["T2"])
	}
	log, err := os.ReadFile(filepath.Join(r.fake, "log"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(log)), "\n")
	// Both started before either ended; the join ran last.
	if len(lines) < 6 || !strings.HasPrefix(lines[0], "start T") || !strings.HasPrefix(lines[1], "start T") || lines[4] != "start T3 1" {
		t.Errorf("agent log:\n%s", log)
	}
}

// TestBacklogExample runs docs/BACKLOGS.md's backlog commands on the embedded
// server: the example imports its task file, or bootstraps one from its
// plan, and works every task to done.
func TestBacklogExample(t *testing.T) {
	t.Parallel()
	data := t.TempDir()
	for _, tc := range []struct {
		name    string
		session string
		args    []string
	}{
		{name: "imported", session: "notes-import", args: []string{"--tasks", "../examples/backlog/to-do.json"}},
		{name: "bootstrapped", session: "notes-boot"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := loopbus(t, append([]string{"run", "../examples/backlog/backlog.yaml", "--data", data, "--session", tc.session}, tc.args...)...)
			if res.code != 0 {
				t.Fatalf("run: exit %d\n%s", res.code, res.stderr)
			}
			res = loopbus(t, "tasks", tc.session, "--data", data, "--json")
			var view struct {
				Phase  string         `json:"phase"`
				Counts map[string]int `json:"counts"`
			}
			if err := json.Unmarshal([]byte(res.stdout), &view); err != nil {
				t.Fatalf("tasks --json: %v\n%s", err, res.stdout)
			}
			if view.Phase != "done" || view.Counts["done"] != 4 || view.Counts["todo"]+view.Counts["doing"]+view.Counts["blocked"] != 0 {
				t.Errorf("phase %q, counts %v; want done with 4 tasks done", view.Phase, view.Counts)
			}
		})
	}
}
