package client

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/loopbus/loopbus/backlog"
	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/internal/testnats"
	"github.com/loopbus/loopbus/projections"
	"github.com/loopbus/loopbus/schemas"
)

// tasksPipeline is a minimal valid pipeline of kind backlog.
func tasksPipeline() schemas.Pipeline {
	return schemas.Pipeline{Name: "todo", Kind: schemas.KindBacklog, Backlog: &schemas.Backlog{
		Agents:      map[string]schemas.AgentSpec{"coder": {Backend: schemas.BackendExec, Command: []string{"true"}}},
		Roles:       map[string][]string{schemas.RoleIterate: {"coder"}},
		Schedule:    schemas.ScheduleSingle,
		MaxParallel: 1, MaxSummaryIterations: 3, TimeoutMs: 1000,
		SourceFiles: []string{"README.md"}, Project: "todo app",
	}}
}

// publishTaskEvent publishes one event into session as the orchestrator
// would and returns its sequence.
func publishTaskEvent(t *testing.T, b *bus.Bus, session, typ string, data any) uint64 {
	t.Helper()
	p, err := b.Publish(context.Background(), schemas.Event{ID: NewSignalID(), Type: typ, Session: session, Time: time.Now(), Data: data})
	if err != nil {
		t.Fatalf("publish %s: %v", typ, err)
	}
	return p.Seq
}

// startTasksSession starts a backlog session whose imported tasks are
// recorded as the orchestrator records them, and returns the id of its
// session.started.
func startTasksSession(t *testing.T, b *bus.Bus, session string, tasks ...schemas.Task) string {
	t.Helper()
	in := schemas.ArtifactRef{Name: "to-do.json", Object: session + "/input/to-do.json", Digest: schemas.Digest(nil)}
	ev, err := publishStart(context.Background(), b, session, time.Now(), &schemas.SessionStarted{
		Pipeline: tasksPipeline(), Input: in, SourceHash: schemas.ShortHash(in.Digest), Backlog: &schemas.BacklogStart{Tasks: tasks}})
	if err != nil {
		t.Fatalf("start %s: %v", session, err)
	}
	for _, task := range tasks {
		publishTaskEvent(t, b, session, schemas.TypeTaskAdded, &schemas.TaskAdded{Task: task, By: "import", Reason: "imported"})
	}
	publishTaskEvent(t, b, session, schemas.TypeBacklogPhase, &schemas.BacklogPhase{Phase: schemas.PhaseIterate, Reason: "imported"})
	return ev.ID
}

func twoTasks() []schemas.Task {
	return []schemas.Task{
		{ID: "T001", Title: "Parse", Priority: 1, Status: schemas.TaskTodo},
		{ID: "T002", Title: "Print", Status: schemas.TaskTodo, DependsOn: []string{"T001"}},
	}
}

func TestTasksAddAndSetStatus(t *testing.T) {
	b, _ := testnats.Bus(t)
	ctx := context.Background()
	startedID := startTasksSession(t, b, "bk", twoTasks()...)

	added, err := AddTask(ctx, b, "bk", schemas.Task{Title: "Write docs", Priority: 2, DependsOn: []string{"T001", "T002"}, Tags: []string{"docs"}}, "asked by support")
	if err != nil {
		t.Fatal(err)
	}
	if added.Task.ID != "T003" || added.Task.Status != schemas.TaskTodo || added.Task.CreatedAt == nil {
		t.Errorf("added task %+v, want T003, todo, with its creation time", added.Task)
	}
	// The Client's methods are the same operations.
	c := New(b)
	named, err := c.AddTask(ctx, "bk", schemas.Task{ID: "fix-ci", Title: "Fix CI", Description: "the race job"}, "")
	if err != nil {
		t.Fatal(err)
	}
	blocked, err := SetTaskStatus(ctx, b, "bk", "T002", schemas.TaskBlocked, "waiting on design", []string{"no design yet", "who owns it?"})
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(blocked.Task.Blockers, []string{"no design yet", "who owns it?"}) || blocked.Task.Status != schemas.TaskBlocked {
		t.Errorf("blocked task %+v", blocked.Task)
	}
	unblocked, err := c.SetTaskStatus(ctx, "bk", "T002", schemas.TaskTodo, "design done", nil)
	if err != nil {
		t.Fatal(err)
	}
	if unblocked.Task.Blockers != nil && len(unblocked.Task.Blockers) != 0 {
		t.Errorf("moving out of blocked kept the blockers: %v", unblocked.Task.Blockers)
	}

	// The events as published: by cli, correlated with the session, the
	// update on the task's subject.
	for _, c := range []TaskChange{added, named, blocked, unblocked} {
		ev := c.Event
		if ev.Correlation != startedID || ev.Session != "bk" || len(ev.ID) != 32 {
			t.Errorf("event %s: correlation %q session %q id %q", ev.Type, ev.Correlation, ev.Session, ev.ID)
		}
	}
	evs := testnats.Events(t, b, schemas.SessionSubjects("bk"))
	last := evs[len(evs)-1]
	if up, ok := last.Data.(*schemas.TaskUpdated); !ok || up.By != ByCLI || up.Reason != "design done" || last.Step != "T002" || last.Seq != unblocked.Seq {
		t.Errorf("last event %s %+v step %q seq %d", last.Type, last.Data, last.Step, last.Seq)
	}

	// Tasks (a fold: no projector runs) shows every change.
	v, err := Tasks(ctx, b, "bk")
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, task := range v.Tasks {
		ids = append(ids, task.ID+":"+task.Status)
	}
	if want := []string{"T001:todo", "T002:todo", "T003:todo", "fix-ci:todo"}; !reflect.DeepEqual(ids, want) {
		t.Errorf("tasks %v, want %v", ids, want)
	}
	if h := v.History["T002"]; len(h) != 3 || h[1].By != ByCLI || h[1].Reason != "waiting on design" || h[1].Status != schemas.TaskBlocked {
		t.Errorf("history of T002: %+v", h)
	}
	if got := *v.Task("T003"); !reflect.DeepEqual(got, added.Task) {
		t.Errorf("AddTask returned %+v, the list holds %+v", added.Task, got)
	}
}

func TestTasksRefusals(t *testing.T) {
	b, _ := testnats.Bus(t)
	ctx := context.Background()
	startTasksSession(t, b, "bk", twoTasks()...)
	// A task that depends on one not (yet) in the list, as a concurrent
	// change could leave it: adding T9 depending on T1x closes a cycle.
	publishTaskEvent(t, b, "bk", schemas.TypeTaskAdded, &schemas.TaskAdded{Task: schemas.Task{ID: "T1x", Title: "x", Status: schemas.TaskTodo, DependsOn: []string{"T9"}}, By: "job-1"})
	startTasksSession(t, b, "ended", twoTasks()...)
	publishTaskEvent(t, b, "ended", schemas.TypeSessionCompleted, &schemas.SessionCompleted{Final: []schemas.ArtifactRef{}})
	pipe := signalPipeline()
	if _, err := publishStart(ctx, b, "pipe", time.Now(), &schemas.SessionStarted{Pipeline: pipe, Input: schemas.ArtifactRef{Name: "in.txt", Object: "pipe/input/in.txt", Digest: schemas.Digest(nil)}, SourceHash: "0000000000000000"}); err != nil {
		t.Fatal(err)
	}

	add := func(session string, task schemas.Task) func() error {
		return func() error { _, err := AddTask(ctx, b, session, task, ""); return err }
	}
	set := func(session, id, status string, blockers ...string) func() error {
		return func() error { _, err := SetTaskStatus(ctx, b, session, id, status, "", blockers); return err }
	}
	tests := []struct {
		name    string
		do      func() error
		wantErr error
		errText string
		// notText must not be in the error (the list's own problems).
		notText string
	}{
		{name: "unknown session", do: add("nope", schemas.Task{Title: "x"}), wantErr: ErrNoSession, errText: "nope"},
		{name: "invalid session id", do: add("a.b", schemas.Task{Title: "x"}), wantErr: ErrBadInput, errText: "invalid session id"},
		{name: "pipeline session", do: add("pipe", schemas.Task{Title: "x"}), wantErr: ErrNotBacklog, errText: "runs pipeline p"},
		{name: "ended session: add", do: add("ended", schemas.Task{Title: "x"}), wantErr: ErrSessionEnded, errText: "session ended: ended completed; its task list no longer changes"},
		{name: "ended session: set-status", do: set("ended", "T001", schemas.TaskDone), wantErr: ErrSessionEnded},
		{name: "blank title", do: add("bk", schemas.Task{Title: "  "}), wantErr: ErrBadInput, errText: "needs a title"},
		{name: "id taken", do: add("bk", schemas.Task{ID: "T001", Title: "again"}), wantErr: ErrBadInput, errText: "already has a task T001 (Parse)"},
		{name: "reserved id", do: add("bk", schemas.Task{ID: "review", Title: "x"}), wantErr: ErrBadInput, errText: `"review" is reserved`},
		{name: "invalid id", do: add("bk", schemas.Task{ID: "a b", Title: "x"}), wantErr: ErrBadInput, errText: `task id "a b"`},
		{name: "unknown dependency", do: add("bk", schemas.Task{Title: "x", DependsOn: []string{"T404"}}), wantErr: ErrBadInput, errText: "/task/0/depends_on/0: task T004 depends on T404, which does not exist", notText: "T1x"},
		{name: "dependency cycle", do: add("bk", schemas.Task{ID: "T9", Title: "x", DependsOn: []string{"T1x"}}), wantErr: ErrBadInput, errText: "dependency cycle: T1x -> T9 -> T1x"},
		{name: "self dependency", do: add("bk", schemas.Task{ID: "T8", Title: "x", DependsOn: []string{"T8"}}), wantErr: ErrBadInput, errText: "T8 depends on itself"},
		{name: "bad status on add", do: add("bk", schemas.Task{Title: "x", Status: "later"}), wantErr: ErrBadInput, errText: `status "later"`},
		{name: "unknown task", do: set("bk", "T404", schemas.TaskDone), wantErr: ErrBadInput, errText: "session bk has no task T404 (tasks: T001, T1x, T002)"},
		{name: "invalid status", do: set("bk", "T001", "finished"), wantErr: ErrBadInput, errText: `status "finished": want one of todo, doing, done, blocked`},
		{name: "nothing changes", do: set("bk", "T001", schemas.TaskTodo), wantErr: ErrBadInput, errText: "already todo"},
		{name: "blank blocker", do: set("bk", "T001", schemas.TaskBlocked, " "), wantErr: ErrBadInput, errText: "blocker is blank"},
		{name: "long reason", do: func() error {
			_, err := AddTask(ctx, b, "bk", schemas.Task{Title: "x"}, strings.Repeat("r", maxReasonBytes+1))
			return err
		}, wantErr: ErrBadInput, errText: "--reason is"},
	}
	before, err := b.LastSeq(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.do()
			if !errors.Is(err, tt.wantErr) || !strings.Contains(err.Error(), tt.errText) {
				t.Fatalf("err = %v, want %v containing %q", err, tt.wantErr, tt.errText)
			}
			if tt.notText != "" && strings.Contains(err.Error(), tt.notText) {
				t.Errorf("err = %v; it should not mention %q", err, tt.notText)
			}
		})
	}
	if after, _ := b.LastSeq(ctx); after != before {
		t.Errorf("refused changes published %d event(s)", after-before)
	}
}

// racingBus is the real bus whose first PublishExpect is preceded by
// another publisher's event (the orchestrator adding a task) or, with
// loseAck, lands but reports a lost acknowledgement.
type racingBus struct {
	*bus.Bus
	t       *testing.T
	loseAck bool
	calls   atomic.Int32
}

func (r *racingBus) PublishExpect(ctx context.Context, ev schemas.Event, expectLast uint64) (bus.Published, error) {
	if r.calls.Add(1) == 1 {
		if r.loseAck {
			if _, err := r.Bus.PublishExpect(ctx, ev, expectLast); err != nil {
				r.t.Errorf("first publish: %v", err)
			}
			return bus.Published{}, bus.ErrStale
		}
		publishTaskEvent(r.t, r.Bus, ev.Session, schemas.TypeTaskAdded, &schemas.TaskAdded{Task: schemas.Task{ID: "T003", Title: "Found by an agent", Status: schemas.TaskTodo}, By: "job-1"})
	}
	return r.Bus.PublishExpect(ctx, ev, expectLast)
}

// TestTasksAddRacesTheOrchestrator: a task added between the check and the
// publish makes the publish stale; the change is checked again against the
// newer list (the next free id is taken by then).
func TestTasksAddRacesTheOrchestrator(t *testing.T) {
	b, _ := testnats.Bus(t)
	startTasksSession(t, b, "bk", twoTasks()...)
	rb := &racingBus{Bus: b, t: t}
	c, err := AddTask(context.Background(), rb, "bk", schemas.Task{Title: "Mine"}, "")
	if err != nil {
		t.Fatal(err)
	}
	if rb.calls.Load() != 2 || c.Task.ID != "T004" {
		t.Errorf("after %d publishes the task got id %s, want a second publish with T004", rb.calls.Load(), c.Task.ID)
	}
	v, err := ReplayTasks(context.Background(), b, "bk", Until{})
	if err != nil {
		t.Fatal(err)
	}
	if v.Task("T003").Title != "Found by an agent" || v.Task("T004").Title != "Mine" {
		t.Errorf("tasks %+v", v.Tasks)
	}
}

// TestTasksChangeWhoseAckIsLost: a publish that landed although it
// reported failure is found in the stream, not published twice.
func TestTasksChangeWhoseAckIsLost(t *testing.T) {
	b, _ := testnats.Bus(t)
	startTasksSession(t, b, "bk", twoTasks()...)
	rb := &racingBus{Bus: b, t: t, loseAck: true}
	c, err := SetTaskStatus(context.Background(), rb, "bk", "T001", schemas.TaskDone, "done by hand", nil)
	if err != nil {
		t.Fatal(err)
	}
	if rb.calls.Load() != 1 || c.Task.Status != schemas.TaskDone || c.Seq == 0 {
		t.Errorf("%d publishes, change %+v", rb.calls.Load(), c)
	}
	n := 0
	for _, ev := range testnats.Events(t, b, schemas.SessionSubjects("bk")) {
		if ev.Type == schemas.TypeTaskUpdated {
			n++
		}
	}
	if n != 1 {
		t.Errorf("%d task.updated events, want 1", n)
	}
}

func TestTasksReadsViewOrFold(t *testing.T) {
	b, _ := testnats.Bus(t)
	ctx := context.Background()
	startTasksSession(t, b, "bk", twoTasks()...)
	last, err := b.SessionLastSeq(ctx, "bk")
	if err != nil {
		t.Fatal(err)
	}
	fold, err := ReplayTasks(ctx, b, "bk", Until{})
	if err != nil {
		t.Fatal(err)
	}
	marked := *fold
	marked.Project = "from the view"
	tests := []struct {
		name        string
		view        *projections.TaskList
		wantProject string
	}{
		{name: "no view: folded", wantProject: "todo app"},
		{name: "up-to-date view: read", view: &marked, wantProject: "from the view"},
		{name: "lagging view: folded", view: func() *projections.TaskList { v := marked; v.LastSeq = last - 1; return &v }(), wantProject: "todo app"},
		{name: "view of another format: folded", view: func() *projections.TaskList { v := marked; v.Version = 0; return &v }(), wantProject: "todo app"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.view != nil {
				if err := b.PutView(ctx, projections.TasksKey("bk"), tt.view); err != nil {
					t.Fatal(err)
				}
			}
			v, err := Tasks(ctx, b, "bk")
			if err != nil {
				t.Fatal(err)
			}
			if v.Project != tt.wantProject || len(v.Tasks) != 2 {
				t.Errorf("project %q with %d tasks, want %q", v.Project, len(v.Tasks), tt.wantProject)
			}
		})
	}
	if _, err := Tasks(ctx, b, "nope"); !errors.Is(err, ErrNoSession) {
		t.Errorf("unknown session: %v", err)
	}
}

func TestTasksReplayAndExport(t *testing.T) {
	b, _ := testnats.Bus(t)
	ctx := context.Background()
	startTasksSession(t, b, "bk", twoTasks()...)
	c, err := SetTaskStatus(ctx, b, "bk", "T001", schemas.TaskDone, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := AddTask(ctx, b, "bk", schemas.Task{Title: "Later"}, ""); err != nil {
		t.Fatal(err)
	}
	then, err := ReplayTasks(ctx, b, "bk", Until{Seq: c.Seq})
	if err != nil {
		t.Fatal(err)
	}
	if then.LastSeq != c.Seq || len(then.Tasks) != 2 || then.Task("T001").Status != schemas.TaskDone {
		t.Errorf("replay until %d: lastSeq %d, %d tasks", c.Seq, then.LastSeq, len(then.Tasks))
	}
	if _, err := ReplayTasks(ctx, b, "bk", Until{Time: time.Now().Add(-time.Hour)}); !errors.Is(err, ErrNoSession) {
		t.Errorf("replay before the start: %v, want ErrNoSession", err)
	}

	dir := t.TempDir()
	path, err := ExportTasks(ctx, b, "bk", dir, c.Seq)
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	f, errs := backlog.ParseFile(path, data)
	if len(errs) > 0 || len(f.Tasks) != 2 || f.Project.Name != "todo app" || !reflect.DeepEqual(f.SourceFiles, []string{"README.md"}) {
		t.Errorf("exported %s: %v\n%s", path, errs, data)
	}
	if string(data) != string(backlog.Format(then.Export())) {
		t.Errorf("export is not the canonical form of the replayed list:\n%s", data)
	}

	pipe := signalPipeline()
	if _, err := publishStart(ctx, b, "pipe", time.Now(), &schemas.SessionStarted{Pipeline: pipe, Input: schemas.ArtifactRef{Name: "in.txt", Object: "pipe/input/in.txt", Digest: schemas.Digest(nil)}, SourceHash: "0000000000000000"}); err != nil {
		t.Fatal(err)
	}
	pdir := t.TempDir()
	if path, err := ExportTasks(ctx, b, "pipe", pdir, 0); err != nil || path != "" {
		t.Errorf("pipeline session: %q, %v; want nothing written", path, err)
	}
	if entries, _ := os.ReadDir(pdir); len(entries) != 0 {
		t.Errorf("pipeline export wrote %v", entries)
	}
}

func TestFormatTaskFile(t *testing.T) {
	canonical := string(backlog.Format(&backlog.File{SchemaVersion: 1, Project: backlog.Project{Name: "p"},
		Tasks: []schemas.Task{{ID: "T1", Title: "a", Status: schemas.TaskTodo, DependsOn: []string{"T1"}}}}))
	tests := []struct {
		name          string
		data          string
		wantFormatted bool
		wantErr       string
	}{
		{name: "canonical", data: canonical, wantFormatted: true},
		{name: "compact, members out of order, invalid but lossless", data: `{"tasks":[{"status":"todo","depends_on":["T1"],"title":"a","id":"T1"}],"project":{"name":"p"},"schema_version":1}`},
		{name: "unknown member would be lost", data: `{"schema_version":1,"tasks":[{"id":"T1","title":"a","status":"todo","owner":"me"}]}`, wantErr: "/tasks/0: additional properties 'owner'"},
		{name: "wrong type would be lost", data: `{"schema_version":1,"tasks":[{"id":"T1","title":"a","status":"todo","priority":"high"}]}`, wantErr: "/tasks/0/priority"},
		{name: "not JSON", data: "{\n  \"schema_version\": 1,\n  \"tasks\": [}\n", wantErr: "line 3, column 13"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, formatted, problems := FormatTaskFile("to-do.json", []byte(tt.data))
			if tt.wantErr != "" {
				if msg := backlog.FormatErrors(problems); out != nil || !strings.Contains(msg, tt.wantErr) {
					t.Fatalf("problems:\n%s\nwant %q and no output", msg, tt.wantErr)
				}
				return
			}
			if len(problems) > 0 {
				t.Fatal(backlog.FormatErrors(problems))
			}
			if formatted != tt.wantFormatted || string(out) != canonical {
				t.Errorf("formatted=%v, out:\n%s\nwant:\n%s", formatted, out, canonical)
			}
		})
	}
}

func TestWriteFileAtomicKeepsMode(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "to-do.json")
	if err := os.WriteFile(path, []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := WriteFileAtomic(path, []byte("new"), 0o644); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if data, _ := os.ReadFile(path); string(data) != "new" || fi.Mode().Perm() != 0o600 {
		t.Errorf("content %q mode %v, want new with 0600", data, fi.Mode().Perm())
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("temporary files left: %v", entries)
	}
	fresh := filepath.Join(dir, "new.json")
	if err := WriteFileAtomic(fresh, []byte("x"), 0o640); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(fresh); err != nil || fi.Mode().Perm() != 0o640 {
		t.Errorf("new file: %v %v", fi, err)
	}
}

// A backlog's steps are its task and role runs, made as it runs: a signal
// may name one (approve SESSION/T001), and the orchestrator answers for
// one it does not have.
func TestResolveSignalTargetBacklogRun(t *testing.T) {
	b, _ := testnats.Bus(t)
	id := startTasksSession(t, b, "bl-sig", twoTasks()...)
	for _, step := range []string{"T001", "review", "T999"} {
		got, err := ResolveSignalTarget(context.Background(), b, SignalTarget{Session: "bl-sig", Step: step})
		if err != nil || len(got) != 1 || got[0].StartedID != id {
			t.Errorf("step %s: %+v, %v; want the session", step, got, err)
		}
	}
}
