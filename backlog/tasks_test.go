package backlog

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/loopbus/loopbus/schemas"
)

var (
	t0 = time.Date(2025, 3, 1, 10, 0, 0, 0, time.UTC)
	t1 = t0.Add(time.Minute)
	t2 = t0.Add(2 * time.Minute)
)

// ev wraps event data the way the catalogue decodes it (a pointer).
func ev(at time.Time, data any) schemas.Event {
	return schemas.Event{Time: at, Data: data}
}

func added(tk schemas.Task) schemas.Event {
	return ev(t0, &schemas.TaskAdded{Task: tk, By: "import"})
}

func status(id, s string) schemas.Event {
	return ev(t1, &schemas.TaskUpdated{ID: id, Status: s, By: "test"})
}

func selected(id string) schemas.Event {
	return ev(t1, &schemas.TaskSelected{ID: id, Run: 1, Agent: "a"})
}

// listOf folds task.added events of tasks into a new list.
func listOf(t *testing.T, tasks ...schemas.Task) *List {
	t.Helper()
	l := NewList()
	for _, tk := range tasks {
		if !l.Apply(added(tk)) {
			t.Fatalf("task.added %s not applied", tk.ID)
		}
	}
	return l
}

func prio(tk schemas.Task, p int) schemas.Task {
	tk.Priority = p
	return tk
}

func TestCompare(t *testing.T) {
	tests := []struct {
		name string
		a, b string
		want int
	}{
		{name: "T2 before T10", a: "T2", b: "T10", want: -1},
		{name: "T10 after T2", a: "T10", b: "T2", want: 1},
		{name: "T9 before T010", a: "T9", b: "T010", want: -1},
		{name: "T001 before T1 (same number, string order)", a: "T001", b: "T1", want: -1},
		{name: "T1 after T001", a: "T1", b: "T001", want: 1},
		{name: "T001 before T2", a: "T001", b: "T2", want: -1},
		{name: "equal", a: "T7", b: "T7", want: 0},
		{name: "digit before letter", a: "T1", b: "TA", want: -1},
		{name: "letter after digit", a: "A", b: "1", want: 1},
		{name: "prefix first", a: "T9", b: "T9a", want: -1},
		{name: "several digit runs", a: "a2b10", b: "a2b9", want: 1},
		{name: "numbers beyond 64 bits", a: "T99999999999999999999", b: "T100000000000000000000", want: -1},
		{name: "letters plainly", a: "alpha", b: "beta", want: -1},
		{name: "empty first", a: "", b: "T1", want: -1},
		{name: "both empty", a: "", b: "", want: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Compare(tt.a, tt.b); got != tt.want {
				t.Errorf("Compare(%q, %q) = %d, want %d", tt.a, tt.b, got, tt.want)
			}
		})
	}
}

// TestCompareIsTotalOrder sorts every short string over a small alphabet
// and checks each pair agrees with that order: then Compare is a strict
// total order (antisymmetric and transitive), which sorting relies on.
func TestCompareIsTotalOrder(t *testing.T) {
	const alphabet = "019a"
	all := []string{""}
	for prev := []string{""}; len(prev[0]) < 5; {
		var next []string
		for _, p := range prev {
			for _, c := range alphabet {
				next = append(next, p+string(c))
			}
		}
		all, prev = append(all, next...), next
	}
	slices.SortFunc(all, Compare)
	for i := range all {
		if c := Compare(all[i], all[i]); c != 0 {
			t.Fatalf("Compare(%q, itself) = %d", all[i], c)
		}
		for j := i + 1; j < len(all); j++ {
			if Compare(all[i], all[j]) >= 0 || Compare(all[j], all[i]) <= 0 {
				t.Fatalf("sorted %q before %q but Compare = %d, reverse %d",
					all[i], all[j], Compare(all[i], all[j]), Compare(all[j], all[i]))
			}
		}
	}
}

func TestListIDsNaturalOrder(t *testing.T) {
	l := listOf(t, task("T10", "todo"), task("T2", "todo"), task("T001", "todo"), task("T1", "todo"), task("A", "todo"))
	want := []string{"A", "T001", "T1", "T2", "T10"}
	if got := l.IDs(); !slices.Equal(got, want) {
		t.Errorf("IDs = %v, want %v", got, want)
	}
	var sorted []string
	for _, tk := range l.Sorted() {
		sorted = append(sorted, tk.ID)
	}
	if !slices.Equal(sorted, want) {
		t.Errorf("Sorted ids = %v, want %v", sorted, want)
	}
}

func TestApply(t *testing.T) {
	east := time.FixedZone("east", 3*3600)
	c0 := time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)
	tests := []struct {
		name   string
		events []schemas.Event
		// want are the tasks afterwards, in id order.
		want []schemas.Task
		// wantChanged is what each Apply returns.
		wantChanged []bool
	}{
		{
			// Times come from the event, in UTC.
			name:        "added: status todo, times from the event",
			events:      []schemas.Event{ev(t0.In(east), &schemas.TaskAdded{Task: schemas.Task{ID: "T1", Title: "a"}, By: "cli"})},
			want:        []schemas.Task{{ID: "T1", Title: "a", Status: "todo", CreatedAt: &t0, UpdatedAt: &t0}},
			wantChanged: []bool{true},
		},
		{
			name: "added keeps its status and times",
			events: []schemas.Event{ev(t1, &schemas.TaskAdded{Task: schemas.Task{ID: "T1", Title: "a", Status: "done",
				CreatedAt: &c0, UpdatedAt: &c0}, By: "import"})},
			want:        []schemas.Task{{ID: "T1", Title: "a", Status: "done", CreatedAt: &c0, UpdatedAt: &c0}},
			wantChanged: []bool{true},
		},
		{
			name: "added of an existing id ignored",
			events: []schemas.Event{
				ev(t0, &schemas.TaskAdded{Task: schemas.Task{ID: "T1", Title: "first"}}),
				ev(t1, &schemas.TaskAdded{Task: schemas.Task{ID: "T1", Title: "second", Status: "done"}}),
			},
			want:        []schemas.Task{{ID: "T1", Title: "first", Status: "todo", CreatedAt: &t0, UpdatedAt: &t0}},
			wantChanged: []bool{true, false},
		},
		{
			name:        "added without id ignored",
			events:      []schemas.Event{ev(t0, &schemas.TaskAdded{Task: schemas.Task{Title: "a"}})},
			wantChanged: []bool{false},
		},
		{
			name: "updated of an unknown id ignored",
			events: []schemas.Event{
				ev(t0, &schemas.TaskAdded{Task: schemas.Task{ID: "T1", Title: "a"}}),
				ev(t1, &schemas.TaskUpdated{ID: "T2", Status: "done", Note: "n"}),
			},
			want:        []schemas.Task{{ID: "T1", Title: "a", Status: "todo", CreatedAt: &t0, UpdatedAt: &t0}},
			wantChanged: []bool{true, false},
		},
		{
			name: "updated: status, updated_at from the event",
			events: []schemas.Event{
				ev(t0, &schemas.TaskAdded{Task: schemas.Task{ID: "T1", Title: "a"}}),
				ev(t1.In(east), &schemas.TaskUpdated{ID: "T1", Status: "done"}),
			},
			want:        []schemas.Task{{ID: "T1", Title: "a", Status: "done", CreatedAt: &t0, UpdatedAt: &t1}},
			wantChanged: []bool{true, true},
		},
		{
			name: "blockers replaced, cleared by an empty list, kept when absent",
			events: []schemas.Event{
				ev(t0, &schemas.TaskAdded{Task: schemas.Task{ID: "T1", Title: "a", Blockers: []string{"x", "y"}}}),
				ev(t1, &schemas.TaskUpdated{ID: "T1", Status: "blocked", Blockers: &[]string{"z"}}),
				ev(t1, &schemas.TaskUpdated{ID: "T1", Note: "still"}),
				ev(t2, &schemas.TaskUpdated{ID: "T2"}),
				ev(t0, &schemas.TaskAdded{Task: schemas.Task{ID: "T2", Title: "b", Blockers: []string{"x"}}}),
				ev(t2, &schemas.TaskUpdated{ID: "T2", Blockers: &[]string{}}),
			},
			want: []schemas.Task{
				{ID: "T1", Title: "a", Status: "blocked", Blockers: []string{"z"}, Notes: []string{"still"}, CreatedAt: &t0, UpdatedAt: &t1},
				{ID: "T2", Title: "b", Status: "todo", CreatedAt: &t0, UpdatedAt: &t2},
			},
			wantChanged: []bool{true, true, true, false, true, true},
		},
		{
			name: "files merged without duplicates, in order",
			events: []schemas.Event{
				ev(t0, &schemas.TaskAdded{Task: schemas.Task{ID: "T1", Title: "a", Files: []string{"x.go"}}}),
				ev(t1, &schemas.TaskUpdated{ID: "T1", Files: []string{"y.go", "x.go", "y.go"}}),
				ev(t2, &schemas.TaskUpdated{ID: "T1", Files: []string{"z.go"}}),
			},
			want:        []schemas.Task{{ID: "T1", Title: "a", Status: "todo", Files: []string{"x.go", "y.go", "z.go"}, CreatedAt: &t0, UpdatedAt: &t2}},
			wantChanged: []bool{true, true, true},
		},
		{
			name: "notes appended, empty note adds none",
			events: []schemas.Event{
				ev(t0, &schemas.TaskAdded{Task: schemas.Task{ID: "T1", Title: "a", Notes: []string{"n0"}}}),
				ev(t1, &schemas.TaskUpdated{ID: "T1", Note: "n1"}),
				ev(t1, &schemas.TaskUpdated{ID: "T1"}),
				ev(t2, &schemas.TaskUpdated{ID: "T1", Note: "n2"}),
			},
			want:        []schemas.Task{{ID: "T1", Title: "a", Status: "todo", Notes: []string{"n0", "n1", "n2"}, CreatedAt: &t0, UpdatedAt: &t2}},
			wantChanged: []bool{true, true, true, true},
		},
		{
			name: "selected: doing, updated_at from the event; unknown id ignored",
			events: []schemas.Event{
				ev(t0, &schemas.TaskAdded{Task: schemas.Task{ID: "T1", Title: "a", Status: "blocked"}}),
				ev(t2, &schemas.TaskSelected{ID: "T1", Run: 1}),
				ev(t2, &schemas.TaskSelected{ID: "T9", Run: 1}),
			},
			want:        []schemas.Task{{ID: "T1", Title: "a", Status: "doing", CreatedAt: &t0, UpdatedAt: &t2}},
			wantChanged: []bool{true, true, false},
		},
		{
			name: "other events ignored",
			events: []schemas.Event{
				ev(t0, &schemas.BacklogPhase{Phase: "iterate"}),
				ev(t0, schemas.TaskAdded{Task: schemas.Task{ID: "T1", Title: "by value"}}),
				ev(t0, nil),
			},
			wantChanged: []bool{false, false, false},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := NewList()
			var changed []bool
			for _, e := range tt.events {
				changed = append(changed, l.Apply(e))
			}
			if !slices.Equal(changed, tt.wantChanged) {
				t.Errorf("Apply returned %v, want %v", changed, tt.wantChanged)
			}
			if got, want := tasksJSON(t, l.Sorted()), tasksJSON(t, tt.want); got != want {
				t.Errorf("tasks =\n%s\nwant\n%s", got, want)
			}
		})
	}
}

// tasksJSON renders tasks for comparison: every member, times with their
// zone, so a time not in UTC shows.
func tasksJSON(t *testing.T, tasks []schemas.Task) string {
	t.Helper()
	if len(tasks) == 0 {
		return "[]"
	}
	b, err := json.MarshalIndent(tasks, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestApplyCopies checks the list shares no slice with the events it
// folds nor with its clones: events are kept by others, and a decider
// changes a clone.
func TestApplyCopies(t *testing.T) {
	in := schemas.Task{ID: "T1", Title: "a", Steps: []string{"s"}, Blockers: []string{"b"}, Tags: []string{"t"},
		Files: []string{"f"}, DependsOn: []string{"T0"}, Notes: []string{"n"}}
	l := NewList()
	l.Apply(added(in))
	for _, s := range [][]string{in.Steps, in.Blockers, in.Tags, in.Files, in.DependsOn, in.Notes} {
		s[0] = "changed"
	}
	got := l.Tasks["T1"]
	for _, s := range [][]string{got.Steps, got.Blockers, got.Tags, got.Files, got.DependsOn, got.Notes} {
		if s[0] == "changed" {
			t.Fatalf("list task shares a slice with the event: %+v", got)
		}
	}

	blockers := []string{"b2"}
	l.Apply(ev(t1, &schemas.TaskUpdated{ID: "T1", Blockers: &blockers}))
	blockers[0] = "changed"
	if l.Tasks["T1"].Blockers[0] != "b2" {
		t.Errorf("blockers share the event's slice: %v", l.Tasks["T1"].Blockers)
	}

	c := l.Clone()
	c.Apply(ev(t2, &schemas.TaskUpdated{ID: "T1", Status: "done", Files: []string{"g"}, Note: "n2", Blockers: &[]string{}}))
	c.Apply(added(task("T2", "todo")))
	o := l.Tasks["T1"]
	if o.Status != "todo" || len(o.Files) != 1 || len(o.Notes) != 1 || len(o.Blockers) != 1 || l.Tasks["T2"] != nil {
		t.Errorf("changing a clone changed the original: %+v, %d tasks", o, len(l.Tasks))
	}
}

// TestCloneSharesNoBacking checks clones can grow a task's lists without
// writing into each other's: the lists have spare capacity after merges.
func TestCloneSharesNoBacking(t *testing.T) {
	l := listOf(t, schemas.Task{ID: "T1", Title: "a", Files: []string{"f"}, Notes: []string{"n"}, Blockers: []string{"b"}})
	l.Apply(ev(t1, &schemas.TaskUpdated{ID: "T1", Files: []string{"x", "y"}, Note: "n1"}))
	l.Apply(ev(t1, &schemas.TaskUpdated{ID: "T1", Note: "n2"}))
	c1, c2 := l.Clone(), l.Clone()
	c1.Apply(ev(t2, &schemas.TaskUpdated{ID: "T1", Files: []string{"c1"}, Note: "c1"}))
	c2.Apply(ev(t2, &schemas.TaskUpdated{ID: "T1", Files: []string{"c2"}, Note: "c2"}))
	got := c1.Tasks["T1"]
	if !slices.Equal(got.Files, []string{"f", "x", "y", "c1"}) || !slices.Equal(got.Notes, []string{"n", "n1", "n2", "c1"}) {
		t.Errorf("clone 1 files %v, notes %v: written by clone 2", got.Files, got.Notes)
	}
	if o := l.Tasks["T1"]; len(o.Files) != 3 || len(o.Notes) != 3 {
		t.Errorf("original files %v, notes %v changed by its clones", o.Files, o.Notes)
	}
}

func TestCounts(t *testing.T) {
	l := listOf(t, task("T1", "todo"), task("T2", "todo"), task("T3", "done"), task("T4", "blocked"))
	l.Apply(selected("T2"))
	want := map[string]int{"todo": 1, "doing": 1, "done": 1, "blocked": 1}
	if got := l.Counts(); !maps.Equal(got, want) {
		t.Errorf("Counts = %v, want %v", got, want)
	}
}

func TestSelect(t *testing.T) {
	tests := []struct {
		name  string
		tasks []schemas.Task
		// after are applied once the tasks are added.
		after      []schemas.Event
		busy       []string
		want       string
		wantReason string
		wantErr    bool // nothing runnable
	}{
		{name: "empty list", wantErr: true},
		{name: "all done", tasks: []schemas.Task{task("T1", "done"), task("T2", "done")}, wantErr: true},
		{
			name:       "doing first, lowest id in natural order",
			tasks:      []schemas.Task{task("T10", "doing"), task("T2", "doing"), prio(task("T1", "todo"), 1)},
			want:       "T2",
			wantReason: "doing: lowest id of the unfinished tasks",
		},
		{
			// Priority does not order doing tasks: they are finished in
			// id order.
			name:  "doing ignores priority",
			tasks: []schemas.Task{prio(task("T3", "doing"), 1), prio(task("T2", "doing"), 9)},
			want:  "T2", wantReason: "doing: lowest id of the unfinished tasks",
		},
		{
			name: "todo by priority, 1 highest",
			tasks: []schemas.Task{task("T1", "todo"), prio(task("T2", "todo"), 2), prio(task("T3", "todo"), 1),
				prio(task("T4", "todo"), 1)},
			want:       "T3",
			wantReason: "todo: priority 1, lowest id among equals, dependencies done",
		},
		{
			name:       "unset priority last",
			tasks:      []schemas.Task{task("T1", "todo"), prio(task("T9", "todo"), 5)},
			want:       "T9",
			wantReason: "todo: priority 5, lowest id among equals, dependencies done",
		},
		{
			name:       "no priority anywhere: lowest id",
			tasks:      []schemas.Task{task("T10", "todo"), task("T9", "todo")},
			want:       "T9",
			wantReason: "todo: no priority, lowest id among equals, dependencies done",
		},
		{
			name:  "equal priority: lowest id in natural order",
			tasks: []schemas.Task{prio(task("T10", "todo"), 2), prio(task("T9", "todo"), 2), prio(task("U1", "todo"), 2)},
			want:  "T9", wantReason: "todo: priority 2, lowest id among equals, dependencies done",
		},
		{
			name: "dependency not done: skip, check next",
			tasks: []schemas.Task{prio(task("T1", "todo", "T3"), 1), prio(task("T2", "todo", "T3"), 2),
				prio(task("T3", "todo"), 3)},
			want: "T3", wantReason: "todo: priority 3, lowest id among equals, dependencies done",
		},
		{
			name:  "dependencies done: runnable",
			tasks: []schemas.Task{prio(task("T1", "todo", "T2", "T3"), 1), task("T2", "done"), task("T3", "done"), task("T4", "todo")},
			want:  "T1", wantReason: "todo: priority 1, lowest id among equals, dependencies done",
		},
		{
			name:  "one dependency not done is enough to wait",
			tasks: []schemas.Task{prio(task("T1", "todo", "T2", "T3"), 1), task("T2", "done"), task("T3", "doing")},
			busy:  []string{"T3"}, wantErr: true,
		},
		{
			name:    "dependency on a missing task never runs",
			tasks:   []schemas.Task{task("T1", "todo", "T9")},
			wantErr: true,
		},
		{
			name:  "doing task waiting on a dependency skipped",
			tasks: []schemas.Task{task("T1", "doing", "T2"), task("T2", "todo")},
			want:  "T2", wantReason: "todo: no priority, lowest id among equals, dependencies done",
		},
		{
			name:  "busy doing task skipped",
			tasks: []schemas.Task{task("T1", "doing"), task("T2", "doing"), task("T3", "todo")},
			busy:  []string{"T1"},
			want:  "T2", wantReason: "doing: lowest id of the unfinished tasks",
		},
		{
			name:  "busy tasks skipped down to todo",
			tasks: []schemas.Task{task("T1", "doing"), prio(task("T2", "todo"), 1), task("T3", "todo")},
			busy:  []string{"T1", "T2"},
			want:  "T3", wantReason: "todo: no priority, lowest id among equals, dependencies done",
		},
		{
			name:    "everything busy",
			tasks:   []schemas.Task{task("T1", "doing"), task("T2", "todo")},
			busy:    []string{"T1", "T2"},
			wantErr: true,
		},
		{
			name:  "todo before blocked whatever the priority",
			tasks: []schemas.Task{prio(task("T1", "blocked"), 1), prio(task("T2", "todo"), 9)},
			want:  "T2", wantReason: "todo: priority 9, lowest id among equals, dependencies done",
		},
		{
			// An imported blocked task is tried once.
			name: "imported blocked tasks by priority then id",
			tasks: []schemas.Task{task("T1", "blocked"), prio(task("T3", "blocked"), 2), prio(task("T2", "blocked"), 2),
				task("T4", "done")},
			want: "T2", wantReason: "blocked, retried after progress: priority 2",
		},
		{
			name:  "todo waiting on a blocked task: the blocked one runs",
			tasks: []schemas.Task{prio(task("T1", "todo", "T2"), 1), task("T2", "blocked")},
			want:  "T2", wantReason: "blocked, retried after progress: no priority",
		},
		{
			name:    "blocked without progress since not retried",
			tasks:   []schemas.Task{task("T1", "todo")},
			after:   []schemas.Event{selected("T1"), status("T1", "blocked")},
			wantErr: true,
		},
		{
			name:  "blocked retried after another task is done",
			tasks: []schemas.Task{task("T1", "todo"), task("T2", "todo")},
			after: []schemas.Event{selected("T1"), status("T1", "blocked"), selected("T2"), status("T2", "done")},
			want:  "T1", wantReason: "blocked, retried after progress: no priority",
		},
		{
			name:  "blocked retried after a task is added",
			tasks: []schemas.Task{task("T1", "todo")},
			after: []schemas.Event{selected("T1"), status("T1", "blocked"), added(task("T2", "done"))},
			want:  "T1", wantReason: "blocked, retried after progress: no priority",
		},
		{
			name:  "blocked retried only if blocked before the progress",
			tasks: []schemas.Task{task("T1", "todo"), task("T2", "todo")},
			after: []schemas.Event{selected("T2"), status("T2", "blocked"), added(task("T3", "done")),
				selected("T1"), status("T1", "blocked")},
			want: "T2", wantReason: "blocked, retried after progress: no priority",
		},
		{
			// A task going back to todo is no progress.
			name:  "todo again is no progress",
			tasks: []schemas.Task{task("T1", "todo"), task("T2", "todo")},
			after: []schemas.Event{selected("T1"), status("T1", "blocked"), selected("T2"), status("T2", "todo"),
				status("T2", "blocked")},
			wantErr: true,
		},
		{
			name:  "blocked task reset to todo runs as todo",
			tasks: []schemas.Task{task("T1", "todo")},
			after: []schemas.Event{selected("T1"), status("T1", "blocked"), status("T1", "todo")},
			want:  "T1", wantReason: "todo: no priority, lowest id among equals, dependencies done",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := listOf(t, tt.tasks...)
			for _, e := range tt.after {
				l.Apply(e)
			}
			var busy func(string) bool
			if tt.busy != nil {
				busy = func(id string) bool { return slices.Contains(tt.busy, id) }
			}
			id, reason, ok := l.Select(busy)
			if ok == tt.wantErr {
				t.Fatalf("Select = %q, %q, %v; wantErr %v", id, reason, ok, tt.wantErr)
			}
			if id != tt.want || reason != tt.wantReason {
				t.Errorf("Select = %q, %q; want %q, %q", id, reason, tt.want, tt.wantReason)
			}
		})
	}
}

// TestSelectLoop runs tasks the way the orchestrator does, selecting and
// finishing one at a time, and checks the order of the whole backlog.
func TestSelectLoop(t *testing.T) {
	l := listOf(t,
		prio(task("T1", "todo", "T4"), 1),
		prio(task("T2", "todo"), 2),
		task("T3", "blocked"),
		prio(task("T4", "todo"), 3),
		task("T5", "todo"),
		task("T10", "doing"),
	)
	var order []string
	for range 20 {
		id, _, ok := l.Select(nil)
		if !ok {
			break
		}
		order = append(order, id)
		l.Apply(selected(id))
		next := "done"
		if id == "T3" { // the only blocked task stays blocked
			next = "blocked"
		}
		l.Apply(status(id, next))
	}
	// T10 is doing; T2 (p2) before T4 (p3); T1 (p1) only once T4 is done;
	// T5 (no priority) last of the todo; then T3, imported blocked, is
	// tried once and stays blocked with no progress left to retry it.
	want := []string{"T10", "T2", "T4", "T1", "T5", "T3"}
	if !slices.Equal(order, want) {
		t.Fatalf("order = %v, want %v", order, want)
	}
	if got := l.Waiting(); !slices.Equal(got, []string{"T3 is blocked: no blocker given"}) {
		t.Errorf("Waiting = %q", got)
	}
	// Progress (a task added) lets T3 run again.
	l.Apply(added(task("T11", "done")))
	if id, _, ok := l.Select(nil); !ok || id != "T3" {
		t.Errorf("after progress Select = %q, %v; want T3", id, ok)
	}
}

// TestCloneKeepsBlockedBookkeeping checks a clone decides as the original
// would and independently of it.
func TestCloneKeepsBlockedBookkeeping(t *testing.T) {
	l := listOf(t, task("T1", "todo"), task("T2", "todo"))
	for _, e := range []schemas.Event{selected("T1"), status("T1", "blocked"), selected("T2"), status("T2", "blocked")} {
		l.Apply(e)
	}
	c := l.Clone()
	if id, _, ok := c.Select(nil); ok {
		t.Fatalf("clone Select = %q; want nothing (no progress since blocked)", id)
	}
	c.Apply(added(task("T3", "done")))
	if id, _, ok := c.Select(nil); !ok || id != "T1" {
		t.Errorf("clone after progress Select = %q, %v; want T1", id, ok)
	}
	if id, _, ok := l.Select(nil); ok {
		t.Errorf("original Select = %q; progress on the clone leaked into it", id)
	}

	// Blocking a task on a clone leaves the original's bookkeeping alone.
	l.Apply(added(task("T4", "done")))
	c = l.Clone()
	c.Apply(selected("T1"))
	c.Apply(status("T1", "blocked"))
	if id, _, ok := l.Select(nil); !ok || id != "T1" {
		t.Errorf("original Select = %q, %v after a clone blocked T1; want T1", id, ok)
	}
}

func TestWaiting(t *testing.T) {
	tests := []struct {
		name  string
		tasks []schemas.Task
		after []schemas.Event
		want  []string
	}{
		{name: "empty list"},
		{name: "nothing waits", tasks: []schemas.Task{task("T1", "done"), task("T2", "todo", "T1"), task("T3", "doing")}},
		{
			name: "open dependencies and blockers, in id order",
			tasks: []schemas.Task{
				task("T1", "done"),
				task("T2", "todo", "T1"),
				task("T10", "doing", "T3"),
				task("T3", "todo", "T1", "T2", "T9"),
				{ID: "T4", Title: "x", Status: "blocked", Blockers: []string{"no key", "no network"}},
				task("T5", "blocked"),
				task("T6", "blocked", "T2"),
				task("T7", "done", "T2"),
			},
			want: []string{
				"T3 (todo) waits for T2, T9",
				"T4 is blocked: no key; no network",
				"T5 is blocked: no blocker given",
				"T6 (blocked) waits for T2",
				"T10 (doing) waits for T3",
			},
		},
		{
			name:  "blockers from an update",
			tasks: []schemas.Task{task("T1", "todo")},
			after: []schemas.Event{ev(t1, &schemas.TaskUpdated{ID: "T1", Status: "blocked", Blockers: &[]string{"need a token"}})},
			want:  []string{"T1 is blocked: need a token"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := listOf(t, tt.tasks...)
			for _, e := range tt.after {
				l.Apply(e)
			}
			if got := l.Waiting(); !slices.Equal(got, tt.want) {
				t.Errorf("Waiting =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(tt.want, "\n"))
			}
		})
	}
}

func TestCheckTasks(t *testing.T) {
	tests := []struct {
		name    string
		tasks   []schemas.Task
		want    []problem
		wantErr bool
	}{
		{name: "none"},
		{name: "valid", tasks: []schemas.Task{task("T1", "todo"), task("T2", "doing", "T1")}},
		{
			name:    "empty id",
			tasks:   []schemas.Task{task("", "todo")},
			want:    []problem{{"/tasks/0/id", `task id ""`}},
			wantErr: true,
		},
		{
			name:    "id with a dot",
			tasks:   []schemas.Task{task("T.1", "todo")},
			want:    []problem{{"/tasks/0/id", `task id "T.1"`}},
			wantErr: true,
		},
		{
			name:    "empty status",
			tasks:   []schemas.Task{task("T1", "")},
			want:    []problem{{"/tasks/0/status", `status "": want one of todo, doing, done, blocked`}},
			wantErr: true,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			errs := CheckTasks(tt.tasks)
			if (len(errs) > 0) != tt.wantErr {
				t.Fatalf("CheckTasks:\n%swantErr %v", dump(errs), tt.wantErr)
			}
			checkProblems(t, "", errs, tt.want)
		})
	}
}

func TestNextID(t *testing.T) {
	many := NewList()
	for i := 1; i <= 999; i++ {
		many.Tasks[fmt.Sprintf("T%03d", i)] = &schemas.Task{ID: fmt.Sprintf("T%03d", i)}
	}
	tests := []struct {
		name  string
		list  *List
		taken []string
		want  string
	}{
		{name: "empty list", list: NewList(), want: "T001"},
		{name: "after existing", list: listOf(t, task("T001", "done"), task("T002", "todo")), want: "T003"},
		{name: "skips taken", list: listOf(t, task("T001", "done")), taken: []string{"T002", "T003"}, want: "T004"},
		{name: "skips existing", list: listOf(t, task("T002", "done")), want: "T003"},
		{name: "beyond three digits", list: many, want: "T1000"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			taken := map[string]bool{}
			for _, id := range tt.taken {
				taken[id] = true
			}
			if got := tt.list.NextID(taken); got != tt.want {
				t.Errorf("NextID = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestExport(t *testing.T) {
	l := listOf(t, task("T10", "todo"), task("T2", "done", "T10"))
	sources := []string{"README.md"}
	f := l.Export("demo", sources)
	sources[0] = "changed"
	out := Format(f)
	back, errs := ParseFile(FileName, out)
	if len(errs) > 0 {
		t.Fatalf("exported file refused:\n%s%s", out, dump(errs))
	}
	if back.Project != (Project{Name: "demo", Root: "."}) || !slices.Equal(back.SourceFiles, []string{"README.md"}) {
		t.Errorf("exported project %+v, sources %v", back.Project, back.SourceFiles)
	}
	if len(back.Tasks) != 2 || back.Tasks[0].ID != "T2" || back.Tasks[1].ID != "T10" {
		t.Errorf("exported tasks not in id order:\n%s", out)
	}
	for i, tk := range back.Tasks {
		if !sameTask(tk, f.Tasks[i]) || tk.CreatedAt == nil {
			t.Errorf("task %d = %+v, want %+v with times", i, tk, f.Tasks[i])
		}
	}
}
