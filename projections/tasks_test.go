package projections

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/loopbus/loopbus/backlog"
	"github.com/loopbus/loopbus/schemas"
)

// Backlog fixtures: a backlog session over two source files whose tasks
// are imported, selected, run, blocked, added by agents and by people.

const backlogSession = "docs-20261122-b4c1"

func backlogPipeline() schemas.Pipeline {
	return schemas.Pipeline{
		Name:   "docs-backlog",
		Source: "backlog.yaml",
		Dir:    "/srv/loopbus/backlog",
		Kind:   schemas.KindBacklog,
		Backlog: &schemas.Backlog{
			Agents:               map[string]schemas.AgentSpec{"coder": agentSpec("coder"), "reviewer": agentSpec("reviewer")},
			Roles:                map[string][]string{schemas.RoleIterate: {"coder"}, schemas.RoleReview: {"reviewer"}},
			Schedule:             schemas.ScheduleSingle,
			MaxParallel:          1,
			SourceFiles:          []string{"README.md", "docs/spec.md"},
			Project:              "loopbus docs",
			MaxSummaryIterations: 3,
			TimeoutMs:            600000,
		},
	}
}

func importedTasks() []schemas.Task {
	return []schemas.Task{
		{ID: "T001", Title: "Write the quick start", Priority: 1, Status: schemas.TaskTodo, Tags: []string{"docs"}},
		{ID: "T002", Title: "Document the task file", Priority: 2, Status: schemas.TaskTodo, DependsOn: []string{"T001"},
			Steps: []string{"list the members", "give an example"}},
		{ID: "T010", Title: "Publish the site", Status: schemas.TaskTodo, DependsOn: []string{"T001", "T002"}, Reference: "docs/spec.md#site"},
	}
}

func (b *builder) startBacklog(session string, tasks []schemas.Task) {
	in := inputRef(session)
	start := &schemas.BacklogStart{Tasks: tasks}
	b.add(session, schemas.TypeSessionStarted, "", "", &schemas.SessionStarted{
		Pipeline: backlogPipeline(), Input: in, SourceHash: shortHash(in.Digest), Backlog: start,
	})
}

func (b *builder) phase(session, phase, reason string) {
	b.add(session, schemas.TypeBacklogPhase, "", "", &schemas.BacklogPhase{Phase: phase, Reason: reason})
}

func (b *builder) taskAdded(session string, t schemas.Task, by, reason string) schemas.Event {
	return b.add(session, schemas.TypeTaskAdded, "", "", &schemas.TaskAdded{Task: t, By: by, Reason: reason})
}

func (b *builder) taskSelected(session, id string, run int, reason string) {
	b.add(session, schemas.TypeTaskSelected, id, "", &schemas.TaskSelected{ID: id, Run: run, Agent: "coder", Reason: reason})
}

func (b *builder) taskUpdated(session string, u schemas.TaskUpdated) schemas.Event {
	return b.add(session, schemas.TypeTaskUpdated, u.ID, "", &u)
}

func blockers(s ...string) *[]string {
	if s == nil {
		s = []string{}
	}
	return &s
}

// backlogIterate: the imported tasks are worked; an agent adds a task, one
// task is blocked, a person unblocks it and adds another; the session is
// still running.
func backlogIterate() []schemas.Event {
	var b builder
	s := backlogSession
	b.startBacklog(s, importedTasks())
	for _, t := range importedTasks() {
		b.taskAdded(s, t, "import", "imported from to-do.json")
	}
	b.phase(s, schemas.PhaseIterate, "imported 3 task(s)")
	b.taskSelected(s, "T001", 1, "todo: priority 1, lowest id among equals, dependencies done")
	j1 := jobID(s, "T001", 1)
	b.request(s, "T001", 1) // unrelated to the task list: only lastSeq moves
	b.taskUpdated(s, schemas.TaskUpdated{ID: "T001", Status: schemas.TaskDone, Files: []string{"docs/quickstart.md"},
		Note: "Wrote the quick start.\nIt covers run and status.", By: j1, Reason: "summary of run 1"})
	b.taskAdded(s, schemas.Task{ID: "T011", Title: "Add a troubleshooting page", Status: schemas.TaskTodo, DependsOn: []string{"T001"}},
		j1, "found while working on T001")
	b.taskSelected(s, "T002", 1, "todo: priority 2, lowest id among equals, dependencies done")
	j2 := jobID(s, "T002", 1)
	b.taskUpdated(s, schemas.TaskUpdated{ID: "T002", Status: schemas.TaskBlocked, Blockers: blockers("the schema of depends_on is undecided"),
		Note: "Need a decision on depends_on.", By: j2, Reason: "summary of run 1"})
	b.taskUpdated(s, schemas.TaskUpdated{ID: "T002", Status: schemas.TaskTodo, Blockers: blockers(), By: "cli", Reason: "decided: ids only"})
	b.taskAdded(s, schemas.Task{ID: "T012", Title: "Explain exit codes", Priority: 3, Status: schemas.TaskTodo}, "cli", "asked for by support")
	b.taskSelected(s, "T002", 2, "todo: priority 2, lowest id among equals, dependencies done")
	return b.evs
}

// backlogCompletes: no tasks imported; bootstrap proposes them, they are
// all done, the review finds nothing to add and the session completes.
func backlogCompletes() []schemas.Event {
	var b builder
	s := backlogSession
	b.startBacklog(s, nil)
	b.phase(s, schemas.PhaseBootstrap, "no tasks: the bootstrap agent proposes them from the source files")
	boot := jobID(s, schemas.PhaseBootstrap, 1)
	b.taskAdded(s, schemas.Task{ID: "T1", Title: "Outline", Status: schemas.TaskTodo}, boot, "bootstrap run")
	b.taskAdded(s, schemas.Task{ID: "T2", Title: "Draft", Status: schemas.TaskTodo, DependsOn: []string{"T1"}}, boot, "bootstrap run")
	b.phase(s, schemas.PhaseIterate, "bootstrap added 2 task(s)")
	for _, id := range []string{"T1", "T2"} {
		b.taskSelected(s, id, 1, "todo: no priority, lowest id among equals, dependencies done")
		b.taskUpdated(s, schemas.TaskUpdated{ID: id, Status: schemas.TaskDone, Note: "Done.", By: jobID(s, id, 1), Reason: "summary of run 1"})
	}
	b.phase(s, schemas.PhaseReview, "no runnable task left")
	b.phase(s, schemas.PhaseDone, "review found nothing to add")
	b.sessionCompleted(s)
	return b.evs
}

// backlogIgnored: changes the task list must ignore, interleaved with a
// pipeline session and another backlog session: updates and selections of
// unknown tasks, a second task.added of a known id, an empty id, events
// replayed with old sequences and events before session.started.
func backlogIgnored() []schemas.Event {
	var b builder
	s := backlogSession
	b.taskAdded(s, schemas.Task{ID: "T000", Title: "Before the start", Status: schemas.TaskTodo}, "cli", "too early")
	b.start(sessionID) // a pipeline session
	b.startBacklog(s, importedTasks()[:1])
	b.startBacklog("other-backlog", nil)
	imported := b.taskAdded(s, importedTasks()[0], "import", "imported from to-do.json")
	b.taskAdded("other-backlog", schemas.Task{ID: "X1", Title: "Someone else's", Status: schemas.TaskTodo}, "cli", "")
	b.taskUpdated(s, schemas.TaskUpdated{ID: "T999", Status: schemas.TaskDone, By: "cli", Reason: "no such task"})
	b.taskSelected(s, "T998", 1, "no such task either")
	b.taskAdded(s, schemas.Task{ID: "T001", Title: "A different title", Status: schemas.TaskDone}, "cli", "id taken")
	b.taskAdded(s, schemas.Task{Title: "No id", Status: schemas.TaskTodo}, "cli", "no id")
	doing := b.taskUpdated(s, schemas.TaskUpdated{ID: "T001", Status: schemas.TaskDoing, By: "cli", Reason: "started by hand"})
	b.add(s, schemas.TypeTaskUpdated, "T001", "", "not task data")
	// Redelivered with their old sequences: the import and the update.
	return append(b.evs, imported, doing)
}

// tasksGoldenCases are the task list fold's specification: each sequence
// is folded with FoldTasks and compared with testdata/tasks/<name>.golden.json.
var tasksGoldenCases = []struct {
	name   string
	events func() []schemas.Event
}{
	{"iterate", backlogIterate},
	{"completes", backlogCompletes},
	{"ignored", backlogIgnored},
	{"pipeline_session", happyPath},
}

func foldTasks(evs []schemas.Event) *TaskList {
	var v *TaskList
	for _, ev := range evs {
		v = FoldTasks(v, ev)
	}
	return v
}

func marshalTasks(t *testing.T, v *TaskList) []byte {
	t.Helper()
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		t.Fatalf("marshal task list: %v", err)
	}
	return append(b, '\n')
}

func TestTasksGolden(t *testing.T) {
	for _, tc := range tasksGoldenCases {
		t.Run(tc.name, func(t *testing.T) {
			evs := tc.events()
			// FoldTasks follows the first session started; the goldens
			// fold the backlog session's events (the pipeline case its own).
			session := backlogSession
			if tc.name == "pipeline_session" {
				session = sessionID
			}
			got := marshalTasks(t, BuildTaskList(session, evs))
			var own []schemas.Event
			for _, ev := range evs {
				if ev.Session == session {
					own = append(own, ev)
				}
			}
			if f := marshalTasks(t, foldTasks(own)); !bytes.Equal(f, got) {
				t.Errorf("FoldTasks differs from BuildTaskList:\n%s\nvs\n%s", f, got)
			}

			path := filepath.Join("testdata", "tasks", tc.name+".golden.json")
			if *update {
				if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(path, got, 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run go test ./projections -run TestTasksGolden -update)", err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("task list differs from %s:\n--- got\n%s\n--- want\n%s", path, got, want)
			}
			// The golden file decodes back to the same view.
			var back *TaskList
			if err := json.Unmarshal(want, &back); err != nil {
				t.Fatalf("unmarshal %s: %v", path, err)
			}
			if !bytes.Equal(marshalTasks(t, back), want) {
				t.Errorf("%s does not round-trip", path)
			}
		})
	}
}

// TestTasksFoldAgreesWithBacklogList: the view's tasks are exactly what
// backlog.List folds from the same events (the orchestrator's state).
func TestTasksFoldAgreesWithBacklogList(t *testing.T) {
	for _, tc := range tasksGoldenCases[:3] {
		t.Run(tc.name, func(t *testing.T) {
			evs := tc.events()
			v := BuildTaskList(backlogSession, evs)
			l := backlog.NewList()
			started := false
			for _, ev := range evs {
				started = started || ev.Session == backlogSession && ev.Type == schemas.TypeSessionStarted
				if started && ev.Session == backlogSession {
					l.Apply(ev)
				}
			}
			if want := l.Sorted(); !reflect.DeepEqual(v.Tasks, want) {
				t.Errorf("view tasks differ from backlog.List:\n got %+v\nwant %+v", v.Tasks, want)
			}
			for status, n := range l.Counts() {
				if v.Counts[status] != n {
					t.Errorf("counts[%s] = %d, want %d", status, v.Counts[status], n)
				}
			}
		})
	}
}

// TestTasksFoldResumesFromDecodedView: a view decoded from JSON (as the
// projector reads it back from the views bucket) folds the rest of the
// history to the same result as one fold of everything.
func TestTasksFoldResumesFromDecodedView(t *testing.T) {
	evs := backlogIterate()
	want := marshalTasks(t, foldTasks(evs))
	for cut := 1; cut < len(evs); cut++ {
		var v *TaskList
		if err := json.Unmarshal(marshalTasks(t, foldTasks(evs[:cut])), &v); err != nil {
			t.Fatal(err)
		}
		for _, ev := range evs { // the whole history again: old events change nothing
			v = FoldTasks(v, ev)
		}
		if got := marshalTasks(t, v); !bytes.Equal(got, want) {
			t.Fatalf("resumed after %d events:\n%s\nwant\n%s", cut, got, want)
		}
	}
}

func TestTasksHistoryIsBounded(t *testing.T) {
	var b builder
	b.startBacklog(backlogSession, nil)
	b.taskAdded(backlogSession, schemas.Task{ID: "T1", Title: "Flaky", Status: schemas.TaskTodo}, "cli", "")
	const updates = MaxTaskHistory + 5
	for i := 1; i <= updates; i++ {
		b.taskUpdated(backlogSession, schemas.TaskUpdated{ID: "T1", Note: fmt.Sprintf("try %d", i), By: "cli", Reason: fmt.Sprintf("update %d", i)})
	}
	v := foldTasks(b.evs)
	h := v.History["T1"]
	if len(h) != MaxTaskHistory {
		t.Fatalf("history holds %d changes, want %d", len(h), MaxTaskHistory)
	}
	if first, last := h[0].Reason, h[len(h)-1].Reason; first != fmt.Sprintf("update %d", updates-MaxTaskHistory+1) || last != fmt.Sprintf("update %d", updates) {
		t.Errorf("history runs from %q to %q, want the newest %d", first, last, MaxTaskHistory)
	}
	if n := len(v.Task("T1").Notes); n != updates {
		t.Errorf("task has %d notes, want all %d", n, updates)
	}
}

func TestTasksReasonsAreOneBoundedParagraph(t *testing.T) {
	var b builder
	b.startBacklog(backlogSession, nil)
	b.taskAdded(backlogSession, schemas.Task{ID: "T1", Title: "Long", Status: schemas.TaskTodo}, "cli", "line one\n\nline two "+strings.Repeat("x", 3*MaxFeedbackBytes))
	b.phase(backlogSession, schemas.PhaseReview, "no runnable task left:\nT1 waits")
	v := foldTasks(b.evs)
	r := v.History["T1"][0].Reason
	if len(r) > MaxFeedbackBytes || !strings.HasPrefix(r, "line one line two x") || !strings.HasSuffix(r, "…") {
		t.Errorf("reason not folded and cut: %d bytes, %.40q…", len(r), r)
	}
	if v.PhaseReason != "no runnable task left: T1 waits" {
		t.Errorf("phase reason %q", v.PhaseReason)
	}
}

func TestTasksExport(t *testing.T) {
	v := foldTasks(backlogIterate())
	f := v.Export()
	if f.SchemaVersion != backlog.FileSchemaVersion || f.Project.Name != "loopbus docs" || !reflect.DeepEqual(f.SourceFiles, []string{"README.md", "docs/spec.md"}) {
		t.Errorf("file header: %+v", f)
	}
	if !reflect.DeepEqual(f.Tasks, v.Tasks) {
		t.Errorf("exported tasks differ from the view's")
	}
	// The export is a valid task file whose canonical form reads back the same.
	data := backlog.Format(f)
	back, errs := backlog.ParseFile(backlog.FileName, data)
	if len(errs) > 0 {
		t.Fatalf("exported file is invalid:\n%s\n%s", backlog.FormatErrors(errs), data)
	}
	if !bytes.Equal(backlog.Format(back), data) {
		t.Errorf("exported file does not round-trip:\n%s", data)
	}
	// Changing the export leaves the view alone.
	f.Tasks[0].Notes[0] = "changed"
	if v.Tasks[0].Notes[0] == "changed" {
		t.Error("the export shares memory with the view")
	}
	if (*TaskList)(nil).Export() != nil {
		t.Error("nil view exports a file")
	}
}

func TestTasksStatus(t *testing.T) {
	tests := []struct {
		name         string
		types        []string
		want         string
		wantTerminal bool
	}{
		{name: "started", want: StatusRunning},
		{name: "paused", types: []string{schemas.TypeSessionPaused}, want: StatusPaused},
		{name: "stopped then resumed", types: []string{schemas.TypeSessionStopped, schemas.TypeSessionResumed}, want: StatusRunning},
		{name: "completed", types: []string{schemas.TypeSessionCompleted}, want: StatusCompleted, wantTerminal: true},
		{name: "failed then paused", types: []string{schemas.TypeSessionFailed, schemas.TypeSessionPaused}, want: StatusFailed, wantTerminal: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b builder
			b.startBacklog(backlogSession, nil)
			for _, typ := range tt.types {
				b.add(backlogSession, typ, "", "", nil)
			}
			v := foldTasks(b.evs)
			if v.Status != tt.want || v.Terminal() != tt.wantTerminal {
				t.Errorf("status %q terminal %v, want %q %v", v.Status, v.Terminal(), tt.want, tt.wantTerminal)
			}
		})
	}
}

// TestTasksIgnoreForgedCopies: a copy (an event of a fork's history)
// folded into a session that has events of its own is a forgery: the task
// list does not take it. Copies before the session's own events (a fork's
// history) are folded.
func TestTasksIgnoreForgedCopies(t *testing.T) {
	var b builder
	s := backlogSession
	b.startBacklog(s, importedTasks())
	for _, tk := range importedTasks() {
		b.taskAdded(s, tk, "import", "imported from to-do.json")
	}
	forged := b.taskAdded(s, schemas.Task{ID: "T099", Title: "Forged", Status: schemas.TaskTodo}, "cli", "forged copy")
	forged.ForkOf = "some-event"
	var v *TaskList
	for _, ev := range b.evs[:len(b.evs)-1] {
		v = FoldTasks(v, ev)
	}
	v = FoldTasks(v, forged)
	if slices.ContainsFunc(v.Tasks, func(tk schemas.Task) bool { return tk.ID == "T099" }) {
		t.Errorf("a forged copy was folded into a live task list: %+v", v.Tasks)
	}

	// A fork's history: copies only, then the task list continues.
	var f *TaskList
	for _, ev := range b.evs {
		ev.ForkOf = "orig-" + ev.ID
		f = FoldTasks(f, ev)
	}
	if !f.CopiesOnly || !slices.ContainsFunc(f.Tasks, func(tk schemas.Task) bool { return tk.ID == "T099" }) {
		t.Errorf("a fork's copied history was not folded: copiesOnly %v, tasks %+v", f.CopiesOnly, f.Tasks)
	}
}
