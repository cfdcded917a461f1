package projections

import (
	"slices"
	"time"

	"github.com/loopbus/loopbus/backlog"
	"github.com/loopbus/loopbus/schemas"
)

// TaskListVersion is the value of TaskList.Version.
const TaskListVersion = 1

// MaxTaskHistory bounds each task's history in a TaskList: only the newest
// changes are kept.
const MaxTaskHistory = 20

// Task change kinds (TaskChange.Event).
const (
	TaskChangeAdded    = "added"
	TaskChangeUpdated  = "updated"
	TaskChangeSelected = "selected"
)

// TaskList is the task list view of a backlog session: its tasks as folded
// from the session's task.* events by FoldTasks (with backlog.List.Apply,
// so the view and the orchestrator agree on every task), its phase, and who
// changed each task and why.
type TaskList struct {
	// Version is the view format version, always TaskListVersion.
	Version int `json:"version"`
	// Session is the session id.
	Session string `json:"session"`
	// Pipeline is the backlog's pipeline name.
	Pipeline string `json:"pipeline"`
	// Project names the project: the backlog's project, else the
	// pipeline name.
	Project string `json:"project"`
	// SourceFiles are the backlog's source files, as written.
	SourceFiles []string `json:"sourceFiles,omitempty"`
	// Status is the session's status, as in Manifest.Status.
	Status string `json:"status"`
	// Phase is the backlog's current phase (schemas.Phase*), empty before
	// the first backlog.phase; PhaseReason says why it was entered and
	// PhaseSince when.
	Phase       string    `json:"phase,omitempty"`
	PhaseReason string    `json:"phaseReason,omitempty"`
	PhaseSince  time.Time `json:"phaseSince,omitzero"`
	// Counts holds the number of tasks per status, every status present.
	Counts map[string]int `json:"counts"`
	// Tasks are the tasks in id order (backlog.Compare), with their
	// creation and last change times from the events.
	Tasks []schemas.Task `json:"tasks"`
	// History maps each task id to its newest MaxTaskHistory changes,
	// oldest first.
	History   map[string][]TaskChange `json:"history,omitempty"`
	CreatedAt time.Time               `json:"createdAt"`
	UpdatedAt time.Time               `json:"updatedAt"`
	// CopiesOnly is set while every event folded was a copy in a fork's
	// history (Event.ForkOf), as Manifest.CopiesOnly: after the session's
	// first event of its own, copies are forgeries and are not folded.
	CopiesOnly bool `json:"copiesOnly,omitempty"`
	// LastSeq is the stream sequence of the last event of the session
	// folded (0 when no folded event came from the stream).
	LastSeq uint64 `json:"lastSeq"`

	// list is the task state backlog.List.Apply folds into; rebuilt from
	// Tasks when the view was decoded (the selection bookkeeping it also
	// keeps plays no part in the view).
	list *backlog.List
}

// TaskChange is one change of a task: which event made it, who and why.
type TaskChange struct {
	// Seq is the stream sequence of the event.
	Seq uint64    `json:"seq,omitempty"`
	At  time.Time `json:"at,omitzero"`
	// Event is TaskChangeAdded, TaskChangeUpdated or TaskChangeSelected.
	Event string `json:"event"`
	// By is who made it: "import", "cli", "orchestrator" or a job id (for
	// a selection, the orchestrator).
	By string `json:"by,omitempty"`
	// Reason is why, folded into one paragraph of at most
	// MaxFeedbackBytes bytes.
	Reason string `json:"reason,omitempty"`
	// Status is the task's status after the change.
	Status string `json:"status"`
	// Run and Agent say which run of the task a selection starts and
	// which agent runs it.
	Run   int    `json:"run,omitempty"`
	Agent string `json:"agent,omitempty"`
}

// TasksKey is the views-bucket key of a session's task list.
func TasksKey(session string) string { return "tasks." + session }

// Terminal reports whether the session has completed or failed: its task
// list no longer changes. A nil task list is not terminal.
func (v *TaskList) Terminal() bool {
	return v != nil && (v.Status == StatusCompleted || v.Status == StatusFailed || v.Status == StatusClosed)
}

// Task returns the task with id, or nil.
func (v *TaskList) Task(id string) *schemas.Task {
	if v == nil {
		return nil
	}
	i, ok := v.index(id)
	if !ok {
		return nil
	}
	return &v.Tasks[i]
}

// FoldTasks applies one event to v and returns the result.
//
// v is nil until the session's session.started: a session.started whose
// pipeline is of kind backlog then creates the task list (for ev.Session);
// any other event, and the session.started of a pipeline, return nil, so
// a session that is not a backlog has no task list. Once v exists, events
// of other sessions and events with Seq != 0 and Seq <= v.LastSeq are
// ignored (re-applying events is idempotent). Every other event sets
// UpdatedAt (unless ev.Time is zero) and LastSeq (when ev.Seq != 0).
//
// task.added, task.updated and task.selected change the tasks exactly as
// backlog.List.Apply does (an added id the list has, and updates or
// selections of unknown tasks, change nothing) and each change is recorded
// in the task's history; backlog.phase sets the phase; the session's
// lifecycle events set Status as FoldManifest does. Data of an unexpected
// type is ignored; FoldTasks never panics.
//
// FoldTasks is pure (no I/O, no clock) and mutates v in place.
func FoldTasks(v *TaskList, ev schemas.Event) *TaskList {
	if v == nil {
		if ev.Type != schemas.TypeSessionStarted {
			return nil
		}
		v := startTasks(ev)
		if v != nil {
			v.CopiesOnly = ev.ForkOf != ""
		}
		return v
	}
	if ev.Session != v.Session || ev.Seq != 0 && ev.Seq <= v.LastSeq {
		return v
	}
	if ev.ForkOf != "" && !v.CopiesOnly {
		return v // a copy into a session of its own events: a forgery
	}
	if ev.ForkOf == "" {
		v.CopiesOnly = false
	}
	if !ev.Time.IsZero() {
		v.UpdatedAt = ev.Time
	}
	if ev.Seq != 0 {
		v.LastSeq = ev.Seq
	}
	switch ev.Type {
	case schemas.TypeTaskAdded:
		if d, ok := dataAs[schemas.TaskAdded](ev.Data); ok {
			v.apply(ev, d, d.Task.ID, TaskChange{Event: TaskChangeAdded, By: d.By, Reason: d.Reason})
		}
	case schemas.TypeTaskUpdated:
		if d, ok := dataAs[schemas.TaskUpdated](ev.Data); ok {
			v.apply(ev, d, d.ID, TaskChange{Event: TaskChangeUpdated, By: d.By, Reason: d.Reason})
		}
	case schemas.TypeTaskSelected:
		if d, ok := dataAs[schemas.TaskSelected](ev.Data); ok {
			v.apply(ev, d, d.ID, TaskChange{Event: TaskChangeSelected, By: "orchestrator", Reason: d.Reason, Run: d.Run, Agent: d.Agent})
		}
	case schemas.TypeBacklogPhase:
		if d, ok := dataAs[schemas.BacklogPhase](ev.Data); ok {
			v.Phase, v.PhaseReason, v.PhaseSince = d.Phase, paragraph(d.Reason), ev.Time
		}
	case schemas.TypeSessionPaused, schemas.TypeSessionStopped:
		if !v.Terminal() {
			v.Status = StatusPaused
			if ev.Type == schemas.TypeSessionStopped {
				v.Status = StatusStopped
			}
		}
	case schemas.TypeSessionResumed:
		if !v.Terminal() {
			v.Status = StatusRunning
		}
	case schemas.TypeSessionClosed:
		if !v.Terminal() {
			v.Status = StatusClosed
		}
	case schemas.TypeSessionCompleted:
		if v.Status != StatusClosed {
			v.Status = StatusCompleted
		}
	case schemas.TypeSessionFailed:
		if v.Status != StatusClosed {
			v.Status = StatusFailed
		}
	}
	return v
}

// BuildTaskList folds the events of session in order, starting from nil,
// and returns the task list; nil if no session.started of a backlog
// session is among them. Events of other sessions are skipped.
func BuildTaskList(session string, evs []schemas.Event) *TaskList {
	var v *TaskList
	for _, ev := range evs {
		if ev.Session == session {
			v = FoldTasks(v, ev)
		}
	}
	return v
}

// Export returns the task list as a task file (to-do.json), tasks in id
// order; nil for a nil list.
func (v *TaskList) Export() *backlog.File {
	if v == nil {
		return nil
	}
	return v.state().Export(v.Project, v.SourceFiles)
}

// startTasks creates the task list from a session.started event, or
// returns nil when the session is not a backlog session.
func startTasks(ev schemas.Event) *TaskList {
	d, ok := dataAs[schemas.SessionStarted](ev.Data)
	if !ok || d.Pipeline.Kind != schemas.KindBacklog {
		return nil
	}
	v := &TaskList{
		Version:   TaskListVersion,
		Session:   ev.Session,
		Pipeline:  d.Pipeline.Name,
		Project:   d.Pipeline.Name,
		Status:    StatusRunning,
		Counts:    map[string]int{},
		Tasks:     []schemas.Task{},
		CreatedAt: ev.Time,
		UpdatedAt: ev.Time,
		LastSeq:   ev.Seq,
		list:      backlog.NewList(),
	}
	if b := d.Pipeline.Backlog; b != nil {
		v.Project = orElse(b.Project, v.Project)
		v.SourceFiles = slices.Clone(b.SourceFiles)
	}
	v.count()
	return v
}

// apply folds one task event (with data d) into the list and, when it
// changed the task id, copies the task into Tasks and records change.
func (v *TaskList) apply(ev schemas.Event, d any, id string, change TaskChange) {
	l := v.state()
	// Apply dispatches on the data's registered pointer type.
	ev.Data = d
	if !l.Apply(ev) {
		return
	}
	t := backlog.CloneTask(*l.Tasks[id])
	if i, ok := v.index(id); ok {
		v.Tasks[i] = t
	} else {
		v.Tasks = slices.Insert(v.Tasks, i, t)
	}
	change.Seq, change.At, change.Status = ev.Seq, ev.Time, t.Status
	change.Reason = paragraph(change.Reason)
	if v.History == nil {
		v.History = map[string][]TaskChange{}
	}
	h := append(v.History[id], change)
	if n := len(h) - MaxTaskHistory; n > 0 {
		h = slices.Delete(h, 0, n)
	}
	v.History[id] = h
	v.count()
}

// List returns a copy of the task state (backlog.List) the view folds,
// for checks such as backlog.List.CheckNew.
func (v *TaskList) List() *backlog.List { return v.state().Clone() }

// state returns the task state to fold into, rebuilding it from Tasks for
// a decoded view.
func (v *TaskList) state() *backlog.List {
	if v.list == nil {
		v.list = backlog.NewList()
		for _, t := range v.Tasks {
			c := backlog.CloneTask(t)
			v.list.Tasks[c.ID] = &c
		}
	}
	return v.list
}

// index finds id in Tasks (kept in id order): its position, or where it
// would be inserted.
func (v *TaskList) index(id string) (int, bool) {
	return slices.BinarySearchFunc(v.Tasks, id, func(t schemas.Task, id string) int { return backlog.Compare(t.ID, id) })
}

// count recomputes Counts from Tasks, with every status present.
func (v *TaskList) count() {
	c := make(map[string]int, 4)
	for _, s := range schemas.TaskStatuses() {
		c[s] = 0
	}
	for _, t := range v.Tasks {
		c[t.Status]++
	}
	v.Counts = c
}
