package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestTasksFileCommands: `loopbus tasks validate` and `tasks fmt` on files,
// without a server.
func TestTasksFileCommands(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	compact := `{"tasks":[{"status":"todo","title":"Parse","id":"T1","priority":1},{"id":"T2","title":"Print","status":"todo","depends_on":["T1"]}],"schema_version":1,"project":{"name":"demo"}}`
	canonical := `{
  "schema_version": 1,
  "project": {
    "name": "demo"
  },
  "source_files": [],
  "tasks": [
    {
      "id": "T1",
      "title": "Parse",
      "priority": 1,
      "status": "todo"
    },
    {
      "id": "T2",
      "title": "Print",
      "status": "todo",
      "depends_on": [
        "T1"
      ]
    }
  ]
}
`
	invalid := `{"schema_version": 1, "tasks": [
  {"id": "T1", "title": "a", "status": "todo", "depends_on": ["T2"]},
  {"id": "T2", "title": "b", "status": "todo", "depends_on": ["T1", "T9"]},
  {"id": "review", "title": "c", "status": "later"}
]}`
	writeFiles(t, dir, map[string]string{
		"compact.json":   compact,
		"canonical.json": canonical,
		"invalid.json":   invalid,
		"broken.json":    "{\n  \"schema_version\": 1,\n  \"tasks\": [}\n",
		"unknown.json":   `{"schema_version":1,"tasks":[{"id":"T1","title":"a","status":"todo","owner":"me"}]}`,
	})
	path := func(name string) string { return filepath.Join(dir, name) }
	if err := os.Chmod(path("compact.json"), 0o600); err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name       string
		args       []string
		wantCode   int
		wantStdout []string
		wantStderr []string
		wantOut    string // the whole stdout, when set
	}{
		{name: "validate valid", args: []string{"validate", path("compact.json")}, wantStdout: []string{path("compact.json") + ": 2 tasks, valid"}},
		{name: "validate lists every problem with its pointer", args: []string{"validate", path("invalid.json")}, wantCode: 1, wantStdout: []string{
			": 4 problems",
			"/tasks/2/id: task id \"review\" is reserved",
			"/tasks/2/status: ",
			"/tasks/1/depends_on/1: task T2 depends on T9, which does not exist",
			"/tasks/0/depends_on: dependency cycle: T1 -> T2 -> T1",
		}},
		{name: "validate broken JSON", args: []string{"validate", path("broken.json")}, wantCode: 1, wantStdout: []string{"line 3, column 13"}},
		{name: "validate missing file", args: []string{"validate", path("nope.json")}, wantCode: 2, wantStderr: []string{"nope.json"}},
		{name: "fmt prints the canonical form", args: []string{"fmt", path("compact.json")}, wantOut: canonical},
		{name: "fmt --check of a canonical file", args: []string{"fmt", "--check", path("canonical.json")}, wantOut: ""},
		{name: "fmt --check names the file", args: []string{"fmt", "--check", path("compact.json")}, wantCode: 1, wantOut: "", wantStderr: []string{path("compact.json") + ": not in canonical form"}},
		{name: "fmt of an invalid but lossless file", args: []string{"fmt", path("invalid.json")}, wantStdout: []string{`"id": "review"`}},
		{name: "fmt refuses broken JSON", args: []string{"fmt", path("broken.json")}, wantCode: 1, wantStderr: []string{"line 3, column 13"}},
		{name: "fmt refuses to drop a member", args: []string{"fmt", "-w", path("unknown.json")}, wantCode: 1, wantStderr: []string{"unknown.json: not formatted: it would lose content", "/tasks/0: additional properties 'owner'"}},
		{name: "fmt --check with -w", args: []string{"fmt", "--check", "-w", path("compact.json")}, wantCode: 2, wantStderr: []string{"exclude each other"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := loopbus(t, append([]string{"tasks"}, tt.args...)...)
			if r.code != tt.wantCode {
				t.Fatalf("exit %d, want %d\nstdout:\n%s\nstderr:\n%s", r.code, tt.wantCode, r.stdout, r.stderr)
			}
			for _, w := range tt.wantStdout {
				if !strings.Contains(r.stdout, w) {
					t.Errorf("stdout lacks %q:\n%s", w, r.stdout)
				}
			}
			for _, w := range tt.wantStderr {
				if !strings.Contains(r.stderr, w) {
					t.Errorf("stderr lacks %q:\n%s", w, r.stderr)
				}
			}
			if tt.wantOut != "" || tt.wantStdout == nil && tt.wantCode != 2 {
				if r.stdout != tt.wantOut {
					t.Errorf("stdout:\n%s\nwant:\n%s", r.stdout, tt.wantOut)
				}
			}
		})
	}

	// -w rewrites in place, keeping the mode; a second -w changes nothing.
	for i := 0; i < 2; i++ {
		if r := loopbus(t, "tasks", "fmt", "-w", path("compact.json")); r.code != 0 || r.stdout != "" {
			t.Fatalf("fmt -w: exit %d\n%s%s", r.code, r.stdout, r.stderr)
		}
		data, err := os.ReadFile(path("compact.json"))
		if err != nil {
			t.Fatal(err)
		}
		fi, _ := os.Stat(path("compact.json"))
		if string(data) != canonical || fi.Mode().Perm() != 0o600 {
			t.Fatalf("after fmt -w: mode %v\n%s", fi.Mode().Perm(), data)
		}
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 5 {
		t.Errorf("files left beside the task files: %v", entries)
	}
	if r := loopbus(t, "tasks", "fmt", "--check", path("compact.json")); r.code != 0 {
		t.Errorf("fmt --check after -w: exit %d\n%s", r.code, r.stderr)
	}
}

// taskList is the part of the task list view the tests read.
type taskList struct {
	Session string         `json:"session"`
	Status  string         `json:"status"`
	Counts  map[string]int `json:"counts"`
	LastSeq uint64         `json:"lastSeq"`
	Tasks   []struct {
		ID        string   `json:"id"`
		Title     string   `json:"title"`
		Status    string   `json:"status"`
		Blockers  []string `json:"blockers"`
		DependsOn []string `json:"depends_on"`
	} `json:"tasks"`
	History map[string][]struct {
		Event  string `json:"event"`
		By     string `json:"by"`
		Reason string `json:"reason"`
		Status string `json:"status"`
	} `json:"history"`
}

func parseTaskList(t *testing.T, s string) taskList {
	t.Helper()
	var v taskList
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		t.Fatalf("task list: %v\n%s", err, s)
	}
	return v
}

// TestTasksSessionCommands: tasks add, set-status, list, export and
// replay --tasks against a `loopbus nats` server with no orchestrator (so
// only the command line changes the task list). Refusals exit 2 and
// publish nothing.
func TestTasksSessionCommands(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{
		"backlog.yaml": `kind: backlog
name: demo
project: Demo
agents:
  coder: {backend: exec, command: ["true"]}
roles:
  iterate: coder
timeout: 1m
`,
		"pipeline.yaml": `name: pipe
steps:
  draft:
    agent: {backend: exec, command: ["true"]}
    prompt: draft
    outputs: [{name: d.txt}]
`,
		"in.txt": "x\n",
	})
	url, _ := startNATS(t, filepath.Join(dir, "data"), filepath.Join(dir, "nats.log"))
	global := []string{"--nats", url}
	lb := func(args ...string) result {
		t.Helper()
		return loopbus(t, append(args, global...)...)
	}
	if r := lb("run", filepath.Join(dir, "backlog.yaml"), "--session", "bk", "--detach"); r.code != 0 {
		t.Fatalf("run backlog: exit %d\n%s", r.code, r.stderr)
	}
	if r := lb("run", filepath.Join(dir, "pipeline.yaml"), "--input", filepath.Join(dir, "in.txt"), "--session", "pipe", "--detach"); r.code != 0 {
		t.Fatalf("run pipeline: exit %d\n%s", r.code, r.stderr)
	}

	steps := []struct {
		args       []string
		wantCode   int
		wantStdout string
		wantStderr string
	}{
		{args: []string{"tasks", "add", "bk", "--title", "Parse the input", "--priority", "1"}, wantStdout: "added T001 Parse the input (todo) in bk at stream sequence"},
		{args: []string{"tasks", "add", "bk", "--title", "Print", "--depends-on", "T001", "--tag", "cli", "--reason", "asked for"}, wantStdout: "added T002 Print (todo)"},
		{args: []string{"tasks", "add", "bk", "--id", "list", "--title", "A task named like a command"}, wantStdout: "added list"},
		{args: []string{"tasks", "set-status", "bk", "T002", "blocked", "--blocker", "needs T001's format", "--reason", "spec open"}, wantStdout: "set T002 Print (blocked)"},
		// Refusals.
		{args: []string{"tasks", "add", "bk", "--title", "x", "--depends-on", "T404"}, wantCode: 2, wantStderr: "depends on T404, which does not exist"},
		{args: []string{"tasks", "add", "bk", "--title", "x", "--id", "T001"}, wantCode: 2, wantStderr: "already has a task T001"},
		{args: []string{"tasks", "add", "bk", "--title", "x", "--id", "review"}, wantCode: 2, wantStderr: "reserved"},
		{args: []string{"tasks", "add", "bk"}, wantCode: 2, wantStderr: "--title is required"},
		{args: []string{"tasks", "add", "pipe", "--title", "x"}, wantCode: 2, wantStderr: "not a backlog session: pipe runs pipeline pipe"},
		{args: []string{"tasks", "add", "nope", "--title", "x"}, wantCode: 2, wantStderr: "no such session: nope"},
		{args: []string{"tasks", "set-status", "bk", "T404", "done"}, wantCode: 2, wantStderr: "has no task T404"},
		{args: []string{"tasks", "set-status", "bk", "T001", "finished"}, wantCode: 2, wantStderr: `status "finished"`},
		{args: []string{"tasks", "set-status", "bk", "T001"}, wantCode: 2, wantStderr: "want SESSION ID STATUS"},
		{args: []string{"tasks", "pipe"}, wantCode: 2, wantStderr: "not a backlog session"},
		{args: []string{"tasks", "bk", "--status", "later"}, wantCode: 2, wantStderr: `--status "later"`},
	}
	for _, s := range steps {
		r := lb(s.args...)
		if r.code != s.wantCode || !strings.Contains(r.stdout, s.wantStdout) || !strings.Contains(r.stderr, s.wantStderr) {
			t.Fatalf("loopbus %v: exit %d, want %d with %q / %q\nstdout:\n%s\nstderr:\n%s", s.args, r.code, s.wantCode, s.wantStdout, s.wantStderr, r.stdout, r.stderr)
		}
	}
	evs := events(t, global, "bk")
	if n := count(evs, "loopbus.task.added", ""); n != 3 || count(evs, "loopbus.task.updated", "T002") != 1 || len(evs) != 5 {
		t.Fatalf("bk has %d events, %d task.added: refusals must publish nothing", len(evs), n)
	}

	// The listing: header, then tasks in the order they are worked.
	r := lb("tasks", "bk")
	if r.code != 0 {
		t.Fatalf("tasks bk: exit %d\n%s", r.code, r.stderr)
	}
	for _, w := range []string{"session   bk", "project   Demo (backlog demo)", "status    running", "tasks     3: 2 todo, 0 doing, 0 done, 1 blocked"} {
		if !strings.Contains(r.stdout, w) {
			t.Errorf("tasks bk lacks %q:\n%s", w, r.stdout)
		}
	}
	lines := strings.Split(strings.TrimSpace(r.stdout[strings.Index(r.stdout, "ID "):]), "\n")
	if len(lines) != 4 || !strings.HasPrefix(lines[1], "T001  todo") || !strings.HasPrefix(lines[2], "list  todo") ||
		!strings.HasPrefix(lines[3], "T002  blocked") || !strings.Contains(lines[3], "T001") || !strings.HasSuffix(lines[3], "needs T001's format") {
		t.Errorf("task lines:\n%s", strings.Join(lines, "\n"))
	}
	// tasks list reaches a session whatever its name; --status filters.
	if r := lb("tasks", "list", "bk", "--status", "blocked", "--json"); r.code != 0 {
		t.Errorf("tasks list: exit %d\n%s", r.code, r.stderr)
	} else if v := parseTaskList(t, r.stdout); len(v.Tasks) != 1 || v.Tasks[0].ID != "T002" || v.Counts["todo"] != 2 ||
		len(v.History["T002"]) != 2 || v.History["T002"][1].By != "cli" || v.History["T002"][1].Reason != "spec open" {
		t.Errorf("tasks list --status blocked --json: %+v", v)
	}

	// replay --tasks at the sequence of the second add: two tasks, both todo.
	added := strings.Split(strings.TrimSpace(lb("events", "--session", "bk", "--type", "task.added").stdout), "\n")
	if len(added) != 3 {
		t.Fatalf("task.added events:\n%s", strings.Join(added, "\n"))
	}
	secondSeq := strings.Fields(added[1])[0]
	r = lb("replay", "bk", "--until", secondSeq, "--tasks")
	if r.code != 0 || !strings.Contains(r.stdout, "tasks     2: 2 todo, 0 doing, 0 done, 0 blocked") || strings.Contains(r.stdout, "session   bk\npipeline") {
		t.Errorf("replay --until %s --tasks: exit %d\n%s%s", secondSeq, r.code, r.stdout, r.stderr)
	}
	r = lb("replay", "bk")
	if r.code != 0 || !strings.Contains(r.stdout, "pipeline  demo") || !strings.Contains(r.stdout, "tasks     3:") {
		t.Errorf("replay: manifest then task list expected; exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}

	// export: to-do.json beside the manifest; tasks export to a file.
	exp := filepath.Join(dir, "exp")
	if r := lb("export", "bk", "--dir", exp); r.code != 0 {
		t.Fatalf("export: exit %d\n%s", r.code, r.stderr)
	}
	out := filepath.Join(dir, "to-do.json")
	if r := lb("tasks", "export", "bk", "-o", out); r.code != 0 || !strings.Contains(r.stderr, "wrote "+out+": 3 tasks") {
		t.Fatalf("tasks export: exit %d\n%s", r.code, r.stderr)
	}
	a, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(exp, "to-do.json"))
	if err != nil {
		t.Fatal(err)
	}
	if string(a) != string(b) {
		t.Errorf("tasks export and export --dir differ:\n%s\n%s", a, b)
	}
	if r := lb("tasks", "validate", out); r.code != 0 || !strings.Contains(r.stdout, "3 tasks, valid") {
		t.Errorf("exported file: validate exit %d\n%s", r.code, r.stdout)
	}
	if r := lb("tasks", "fmt", "--check", out); r.code != 0 {
		t.Errorf("exported file is not in canonical form:\n%s", a)
	}
	pexp := filepath.Join(dir, "exp-pipe")
	if r := lb("export", "pipe", "--dir", pexp); r.code != 0 {
		t.Fatalf("export pipe: exit %d\n%s", r.code, r.stderr)
	}
	if _, err := os.Stat(filepath.Join(pexp, "to-do.json")); !os.IsNotExist(err) {
		t.Errorf("a pipeline export has a to-do.json: %v", err)
	}
}
