package backlog

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/loopbus/loopbus/schemas"
)

// List is a task list: the fold of a session's task.* events. The zero
// value is not usable; call NewList.
type List struct {
	Tasks map[string]*schemas.Task
	// progress counts tasks that became done or were added; blockedAt
	// holds its value when each blocked task was blocked. A blocked task
	// is tried again only after progress, so an agent that stays blocked
	// cannot spin the backlog.
	progress  int
	blockedAt map[string]int
}

// NewList returns an empty task list.
func NewList() *List {
	return &List{Tasks: map[string]*schemas.Task{}, blockedAt: map[string]int{}}
}

// Clone returns a deep enough copy for a decider to change.
func (l *List) Clone() *List {
	c := &List{Tasks: make(map[string]*schemas.Task, len(l.Tasks)), progress: l.progress, blockedAt: maps.Clone(l.blockedAt)}
	for id, t := range l.Tasks {
		tc := CloneTask(*t)
		c.Tasks[id] = &tc
	}
	return c
}

// CloneTask returns a copy of t that shares no memory with it.
func CloneTask(t schemas.Task) schemas.Task {
	t.Steps, t.Blockers, t.Tags = slices.Clone(t.Steps), slices.Clone(t.Blockers), slices.Clone(t.Tags)
	t.Files, t.DependsOn, t.Notes = slices.Clone(t.Files), slices.Clone(t.DependsOn), slices.Clone(t.Notes)
	if t.CreatedAt != nil {
		c := *t.CreatedAt
		t.CreatedAt = &c
	}
	if t.UpdatedAt != nil {
		c := *t.UpdatedAt
		t.UpdatedAt = &c
	}
	return t
}

// IDs returns the task ids in id order (see Less).
func (l *List) IDs() []string {
	return slices.SortedFunc(maps.Keys(l.Tasks), Compare)
}

// Sorted returns copies of the tasks in id order.
func (l *List) Sorted() []schemas.Task {
	out := make([]schemas.Task, 0, len(l.Tasks))
	for _, id := range l.IDs() {
		out = append(out, *l.Tasks[id])
	}
	return out
}

// Counts returns the number of tasks per status.
func (l *List) Counts() map[string]int {
	c := map[string]int{}
	for _, t := range l.Tasks {
		c[t.Status]++
	}
	return c
}

// Apply folds one event into the list and reports whether it changed it.
// task.added of an id the list has, and updates of unknown tasks, change
// nothing. Times come from the event.
func (l *List) Apply(ev schemas.Event) bool {
	at := ev.Time.UTC()
	switch d := ev.Data.(type) {
	case *schemas.TaskAdded:
		if _, ok := l.Tasks[d.Task.ID]; ok || d.Task.ID == "" {
			return false
		}
		t := CloneTask(d.Task)
		if t.Status == "" {
			t.Status = schemas.TaskTodo
		}
		if t.CreatedAt == nil {
			t.CreatedAt = &at
		}
		if t.UpdatedAt == nil {
			t.UpdatedAt = &at
		}
		l.Tasks[t.ID] = &t
		l.progress++
		if t.Status == schemas.TaskBlocked {
			l.blockedAt[t.ID] = l.progress - 1 // an imported blocked task is tried once
		}
		return true
	case *schemas.TaskUpdated:
		t := l.Tasks[d.ID]
		if t == nil {
			return false
		}
		if d.Status != "" && d.Status != t.Status {
			t.Status = d.Status
			switch d.Status {
			case schemas.TaskDone:
				l.progress++
			case schemas.TaskBlocked:
				l.blockedAt[t.ID] = l.progress
			}
		}
		if d.Blockers != nil {
			t.Blockers = slices.Clone(*d.Blockers)
		}
		for _, f := range d.Files {
			if !slices.Contains(t.Files, f) {
				t.Files = append(t.Files, f)
			}
		}
		if d.Note != "" {
			t.Notes = append(t.Notes, d.Note)
		}
		t.UpdatedAt = &at
		return true
	case *schemas.TaskSelected:
		t := l.Tasks[d.ID]
		if t == nil {
			return false
		}
		t.Status, t.UpdatedAt = schemas.TaskDoing, &at
		return true
	}
	return false
}

// Compare orders task ids naturally: digit runs compare as numbers, so T2
// comes before T10; ties fall back to plain string order.
func Compare(a, b string) int {
	i, j := 0, 0
	for i < len(a) && j < len(b) {
		ca, cb := a[i], b[j]
		if isDigit(ca) && isDigit(cb) {
			si, sj := i, j
			for i < len(a) && isDigit(a[i]) {
				i++
			}
			for j < len(b) && isDigit(b[j]) {
				j++
			}
			na, nb := strings.TrimLeft(a[si:i], "0"), strings.TrimLeft(b[sj:j], "0")
			if len(na) != len(nb) {
				return cmpInt(len(na), len(nb))
			}
			if c := strings.Compare(na, nb); c != 0 {
				return c
			}
			continue
		}
		if ca != cb {
			return cmpInt(int(ca), int(cb))
		}
		i, j = i+1, j+1
	}
	if c := cmpInt(len(a)-i, len(b)-j); c != 0 {
		return c
	}
	return strings.Compare(a, b)
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

func cmpInt(a, b int) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// priorityKey sorts priority 1 first and unset (0) last.
func priorityKey(p int) int {
	if p <= 0 {
		return int(^uint(0) >> 1)
	}
	return p
}

// Select picks the next task to run, the seed's way: a doing task (lowest
// id) first, then the todo task of highest priority (lowest number, then
// lowest id), then a blocked one the same way. A task is runnable only when
// every task it depends on is done; busy tasks (already running) are
// skipped, and a blocked task is tried again only after some task was done
// or added since it was blocked. It returns the task id and why it was
// picked; ok is false when nothing is runnable.
func (l *List) Select(busy func(id string) bool) (id, reason string, ok bool) {
	byStatus := map[string][]*schemas.Task{}
	for _, t := range l.Tasks {
		byStatus[t.Status] = append(byStatus[t.Status], t)
	}
	for _, status := range []string{schemas.TaskDoing, schemas.TaskTodo, schemas.TaskBlocked} {
		ts := byStatus[status]
		slices.SortFunc(ts, func(a, b *schemas.Task) int {
			if status != schemas.TaskDoing {
				if c := cmpInt(priorityKey(a.Priority), priorityKey(b.Priority)); c != 0 {
					return c
				}
			}
			return Compare(a.ID, b.ID)
		})
		for _, t := range ts {
			if busy != nil && busy(t.ID) || !l.depsDone(t) {
				continue
			}
			if status == schemas.TaskBlocked && l.progress <= l.blockedAt[t.ID] {
				continue
			}
			switch status {
			case schemas.TaskDoing:
				return t.ID, "doing: lowest id of the unfinished tasks", true
			case schemas.TaskTodo:
				return t.ID, fmt.Sprintf("todo: %s, lowest id among equals, dependencies done", describePriority(t.Priority)), true
			default:
				return t.ID, fmt.Sprintf("blocked, retried after progress: %s", describePriority(t.Priority)), true
			}
		}
	}
	return "", "", false
}

func describePriority(p int) string {
	if p <= 0 {
		return "no priority"
	}
	return "priority " + strconv.Itoa(p)
}

func (l *List) depsDone(t *schemas.Task) bool {
	for _, dep := range t.DependsOn {
		if d := l.Tasks[dep]; d == nil || d.Status != schemas.TaskDone {
			return false
		}
	}
	return true
}

// Waiting describes why the tasks that are not done cannot run: each one's
// unfinished dependencies, for the review prompt and the status line.
func (l *List) Waiting() []string {
	var out []string
	for _, id := range l.IDs() {
		t := l.Tasks[id]
		if t.Status == schemas.TaskDone {
			continue
		}
		var open []string
		for _, dep := range t.DependsOn {
			if d := l.Tasks[dep]; d == nil || d.Status != schemas.TaskDone {
				open = append(open, dep)
			}
		}
		switch {
		case len(open) > 0:
			out = append(out, fmt.Sprintf("%s (%s) waits for %s", id, t.Status, strings.Join(open, ", ")))
		case t.Status == schemas.TaskBlocked:
			out = append(out, fmt.Sprintf("%s is blocked: %s", id, orNone(strings.Join(t.Blockers, "; "))))
		}
	}
	return out
}

func orNone(s string) string {
	if s == "" {
		return "no blocker given"
	}
	return s
}

// ReservedIDs are the names of a backlog's own runs (its role steps): no
// task may take them.
func ReservedIDs() []string {
	return []string{schemas.PhaseBootstrap, schemas.PhaseRepair, schemas.PhaseReview}
}

// CheckTasks checks a set of tasks as a whole: ids valid, not reserved and unique,
// dependencies known and not the task itself, no dependency cycle (the
// cycle is named as a path, T1 -> T2 -> T1). Pointers index the slice.
func CheckTasks(tasks []schemas.Task) []schemas.ValidationError {
	var errs []schemas.ValidationError
	at := map[string]int{}
	for i, t := range tasks {
		p := fmt.Sprintf("/tasks/%d", i)
		if err := schemas.ValidateStepName(t.ID); err != nil {
			errs = append(errs, schemas.ValidationError{Pointer: p + "/id", Message: fmt.Sprintf("task id %q: %v", t.ID, err), Source: "schema"})
			continue
		}
		if slices.Contains(ReservedIDs(), t.ID) {
			errs = append(errs, schemas.ValidationError{Pointer: p + "/id", Message: fmt.Sprintf("task id %q is reserved: %s name the backlog's own runs", t.ID, strings.Join(ReservedIDs(), ", ")), Source: "schema"})
			continue
		}
		if j, dup := at[t.ID]; dup {
			errs = append(errs, schemas.ValidationError{Pointer: p + "/id", Message: fmt.Sprintf("duplicate task id %q (also /tasks/%d)", t.ID, j), Source: "schema"})
			continue
		}
		at[t.ID] = i
		if !slices.Contains(schemas.TaskStatuses(), t.Status) {
			errs = append(errs, schemas.ValidationError{Pointer: p + "/status", Message: fmt.Sprintf("status %q: want one of %s", t.Status, strings.Join(schemas.TaskStatuses(), ", ")), Source: "schema"})
		}
	}
	for i, t := range tasks {
		for k, dep := range t.DependsOn {
			p := fmt.Sprintf("/tasks/%d/depends_on/%d", i, k)
			switch _, ok := at[dep]; {
			case dep == t.ID:
				errs = append(errs, schemas.ValidationError{Pointer: p, Message: fmt.Sprintf("task %s depends on itself", t.ID), Source: "schema"})
			case !ok:
				errs = append(errs, schemas.ValidationError{Pointer: p, Message: fmt.Sprintf("task %s depends on %s, which does not exist", t.ID, dep), Source: "schema"})
			}
		}
	}
	if cycle := findCycle(tasks); cycle != nil {
		errs = append(errs, schemas.ValidationError{Pointer: fmt.Sprintf("/tasks/%d/depends_on", at[cycle[0]]),
			Message: "dependency cycle: " + strings.Join(cycle, " -> "), Source: "schema"})
	}
	return errs
}

// findCycle returns one dependency cycle as a path that ends where it
// starts, or nil. Self-dependencies are reported separately.
func findCycle(tasks []schemas.Task) []string {
	deps := map[string][]string{}
	for _, t := range tasks {
		if _, ok := deps[t.ID]; !ok {
			deps[t.ID] = t.DependsOn
		}
	}
	const (
		unseen = iota
		onPath
		finished
	)
	mark := map[string]int{}
	var path []string
	var visit func(id string) []string
	visit = func(id string) []string {
		mark[id] = onPath
		path = append(path, id)
		for _, dep := range deps[id] {
			if _, known := deps[dep]; !known || dep == id {
				continue
			}
			switch mark[dep] {
			case onPath:
				i := slices.Index(path, dep)
				return append(slices.Clone(path[i:]), dep)
			case unseen:
				if c := visit(dep); c != nil {
					return c
				}
			}
		}
		path = path[:len(path)-1]
		mark[id] = finished
		return nil
	}
	for _, id := range slices.SortedFunc(maps.Keys(deps), Compare) {
		if mark[id] == unseen {
			if c := visit(id); c != nil {
				return c
			}
		}
	}
	return nil
}

// Export returns the list as a task file.
func (l *List) Export(project string, sources []string) *File {
	return &File{SchemaVersion: FileSchemaVersion, Project: Project{Name: project, Root: "."}, SourceFiles: slices.Clone(sources), Tasks: l.Sorted()}
}

// NextID returns an id of the form T001, T002, … that is neither in the
// list nor taken: the first free one from the task count plus one, so ids
// grow with the list.
func (l *List) NextID(taken map[string]bool) string {
	for n := len(l.Tasks) + 1; ; n++ {
		id := fmt.Sprintf("T%03d", n)
		if l.Tasks[id] == nil && !taken[id] {
			return id
		}
	}
}
