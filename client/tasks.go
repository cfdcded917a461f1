package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/loopbus/loopbus/backlog"
	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/projections"
	"github.com/loopbus/loopbus/schemas"
)

// Errors of the task commands, beside ErrNoSession and ErrBadInput.
var (
	// ErrNotBacklog: the session runs a pipeline, which has no task list.
	ErrNotBacklog = errors.New("not a backlog session")
	// ErrSessionEnded: the session completed or failed; its task list no
	// longer changes.
	ErrSessionEnded = errors.New("session ended")
)

// ByCLI is the By of the task events the command line publishes.
const ByCLI = "cli"

// maxTaskChangeTries bounds the attempts of AddTask and SetTaskStatus when
// the session moves on between the check and the publish.
const maxTaskChangeTries = 10

// Tasks returns the session's task list: the materialized view when it is
// up to date with the stream, otherwise a fold of the stream (so it is
// exact while the projector lags or does not run). It fails with
// ErrNoSession for an unknown session and ErrNotBacklog for a pipeline
// session.
func Tasks(ctx context.Context, b Bus, session string) (*projections.TaskList, error) {
	last, err := lastOf(ctx, b, session)
	if err != nil {
		return nil, err
	}
	var v projections.TaskList
	if err := b.GetView(ctx, projections.TasksKey(session), &v); err == nil && v.LastSeq >= last && v.Version == projections.TaskListVersion {
		return &v, nil
	}
	return ReplayTasks(ctx, b, session, Until{})
}

// ReplayTasks folds a session's events up to until into its task list. It
// fails with ErrNoSession when no session.started is at or before until,
// and with ErrNotBacklog when the session runs a pipeline.
func ReplayTasks(ctx context.Context, b Bus, session string, until Until) (*projections.TaskList, error) {
	if err := schemas.ValidateSessionID(session); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadInput, err)
	}
	evs, err := Events(ctx, b, session, until)
	if err != nil {
		return nil, err
	}
	v := projections.BuildTaskList(session, evs)
	if v == nil {
		return nil, notBacklog(session, evs)
	}
	return v, nil
}

// notBacklog explains why the events of session fold to no task list.
func notBacklog(session string, evs []schemas.Event) error {
	for _, ev := range evs {
		if d, ok := ev.Data.(*schemas.SessionStarted); ok && ev.Type == schemas.TypeSessionStarted {
			return fmt.Errorf("%w: %s runs pipeline %s, whose steps have no task list ('loopbus status %s' shows them)", ErrNotBacklog, session, d.Pipeline.Name, session)
		}
	}
	return fmt.Errorf("%w: %s (no session.started at or before that point)", ErrNoSession, session)
}

// TaskChange is a task event the command line published.
type TaskChange struct {
	Event schemas.Event
	// Seq is the stream sequence it was stored at.
	Seq uint64
	// Task is the task as the event leaves it.
	Task schemas.Task
}

// AddTask publishes task.added (by "cli") to a backlog session that has
// not ended. The task's id, when empty, is the next free T001-style id
// (backlog.List.NextID); its status defaults to todo; its times come from
// the event. It is checked against the task list folded from the stream
// (not the view, which may lag): the title is not blank, the id is free,
// and the list with the task passes backlog.CheckTasks (id not reserved,
// known dependencies, no cycle: the error names the cycle's path). Errors
// wrap ErrBadInput, ErrNoSession, ErrNotBacklog or ErrSessionEnded.
func AddTask(ctx context.Context, b Bus, session string, task schemas.Task, reason string) (TaskChange, error) {
	if err := checkReason(reason); err != nil {
		return TaskChange{}, err
	}
	if strings.TrimSpace(task.Title) == "" {
		return TaskChange{}, fmt.Errorf("%w: a task needs a title", ErrBadInput)
	}
	if task.ID != "" {
		if err := checkTaskID(task.ID); err != nil {
			return TaskChange{}, err
		}
	}
	return changeTasks(ctx, b, session, func(v *projections.TaskList) (schemas.Event, error) {
		if task.ID != "" && v.Task(task.ID) != nil {
			return schemas.Event{}, fmt.Errorf("%w: session %s already has a task %s (%s)", ErrBadInput, session, task.ID, v.Task(task.ID).Title)
		}
		added, errs := v.List().CheckNew([]schemas.Task{task}, "/task")
		// Problems the list had without the task are not the task's.
		had := map[string]bool{}
		for _, e := range backlog.CheckTasks(v.Tasks) {
			had[e.Message] = true
		}
		errs = slices.DeleteFunc(errs, func(e schemas.ValidationError) bool { return had[e.Message] })
		if len(errs) > 0 {
			lines := make([]string, len(errs))
			for i, e := range errs {
				lines[i] = "  " + schemas.DisplayPointer(e.Pointer) + ": " + e.Message
			}
			return schemas.Event{}, fmt.Errorf("%w: task refused:\n%s", ErrBadInput, strings.Join(lines, "\n"))
		}
		return schemas.Event{Type: schemas.TypeTaskAdded, Data: &schemas.TaskAdded{Task: added[0], By: ByCLI, Reason: reason}}, nil
	})
}

// SetTaskStatus publishes task.updated (by "cli") setting a task's status
// in a backlog session that has not ended. blockers, when not nil, replace
// the task's blockers; moving a task out of blocked without new blockers
// clears them. The task must exist in the task list folded from the
// stream, and the change must change something. Errors wrap ErrBadInput,
// ErrNoSession, ErrNotBacklog or ErrSessionEnded.
func SetTaskStatus(ctx context.Context, b Bus, session, id, status, reason string, blockers []string) (TaskChange, error) {
	if err := checkReason(reason); err != nil {
		return TaskChange{}, err
	}
	if !slices.Contains(schemas.TaskStatuses(), status) {
		return TaskChange{}, fmt.Errorf("%w: status %q: want one of %s", ErrBadInput, status, strings.Join(schemas.TaskStatuses(), ", "))
	}
	if err := checkTaskID(id); err != nil {
		return TaskChange{}, err
	}
	for _, bl := range blockers {
		if strings.TrimSpace(bl) == "" || !utf8.ValidString(bl) || len(bl) > maxReasonBytes {
			return TaskChange{}, fmt.Errorf("%w: a blocker is blank, not UTF-8 or over %d bytes", ErrBadInput, maxReasonBytes)
		}
	}
	return changeTasks(ctx, b, session, func(v *projections.TaskList) (schemas.Event, error) {
		t := v.Task(id)
		if t == nil {
			return schemas.Event{}, fmt.Errorf("%w: session %s has no task %s (%s)", ErrBadInput, session, id, someIDs(v))
		}
		up := &schemas.TaskUpdated{ID: id, Status: status, By: ByCLI, Reason: reason}
		switch {
		case blockers != nil:
			bl := slices.Clone(blockers)
			up.Blockers = &bl
		case status != schemas.TaskBlocked && len(t.Blockers) > 0:
			none := []string{}
			up.Blockers = &none
		}
		if t.Status == status && (up.Blockers == nil || slices.Equal(*up.Blockers, t.Blockers)) {
			return schemas.Event{}, fmt.Errorf("%w: task %s is already %s; nothing to change", ErrBadInput, id, status)
		}
		return schemas.Event{Type: schemas.TypeTaskUpdated, Step: id, Data: up}, nil
	})
}

// changeTasks folds the session's events, lets build check the change
// against the task list and make its event, and publishes it only if the
// session has no newer event by then (expected last sequence); when it
// has, it folds the new events and tries again. The event gets a random
// id, kept across attempts, so an attempt that landed although its
// acknowledgement was lost is found in the stream instead of repeated.
func changeTasks(ctx context.Context, b Bus, session string, build func(*projections.TaskList) (schemas.Event, error)) (TaskChange, error) {
	if err := schemas.ValidateSessionID(session); err != nil {
		return TaskChange{}, fmt.Errorf("%w: %v", ErrBadInput, err)
	}
	id := NewSignalID()
	var (
		v         *projections.TaskList
		evs       []schemas.Event // kept until the session's start is found
		startedID string
		last      uint64 // newest stream sequence of the session, skipped messages too
		landed    *TaskChange
	)
	for attempt := 1; ; attempt++ {
		err := b.Read(ctx, bus.ReadOptions{
			Subjects: []string{schemas.SessionSubjects(session)},
			StartSeq: last + 1,
			OnSkip:   func(_ string, seq uint64) { last = max(last, seq) },
		}, func(ev schemas.Event) error {
			last = max(last, ev.Seq)
			if ev.Type == schemas.TypeSessionStarted && startedID == "" {
				startedID = ev.ID
			}
			if ev.ID == id {
				landed = &TaskChange{Event: ev, Seq: ev.Seq}
			}
			if v == nil {
				evs = append(evs, ev)
			}
			v = projections.FoldTasks(v, ev)
			return nil
		})
		if err != nil {
			return TaskChange{}, err
		}
		if landed != nil {
			if t := v.Task(taskIDOf(landed.Event)); t != nil {
				landed.Task = *t
			}
			return *landed, nil
		}
		switch {
		case last == 0:
			return TaskChange{}, fmt.Errorf("%w: %s", ErrNoSession, session)
		case v == nil:
			return TaskChange{}, notBacklog(session, evs)
		case v.Terminal():
			return TaskChange{}, fmt.Errorf("%w: %s %s; its task list no longer changes ('loopbus tasks %s' shows it)", ErrSessionEnded, session, v.Status, session)
		}
		evs = nil
		ev, err := build(v)
		if err != nil {
			return TaskChange{}, err
		}
		ev.ID, ev.Session, ev.Correlation, ev.Time = id, session, startedID, time.Now().UTC()
		p, err := b.PublishExpect(ctx, ev, last)
		switch {
		case err == nil && !p.Duplicate:
			ev.Seq = p.Seq
			c := TaskChange{Event: ev, Seq: p.Seq}
			if t := projections.FoldTasks(v, ev).Task(taskIDOf(ev)); t != nil {
				c.Task = *t
			}
			return c, nil
		case err == nil, errors.Is(err, bus.ErrStale), errors.Is(err, bus.ErrDuplicate):
			// Newer events, or our own from an attempt whose answer was
			// lost: read on and decide again.
			if attempt == maxTaskChangeTries {
				return TaskChange{}, fmt.Errorf("session %s kept changing while the task change was checked (%d attempts); try again", session, attempt)
			}
		default:
			return TaskChange{}, err
		}
	}
}

// taskIDOf returns the task a task event concerns.
func taskIDOf(ev schemas.Event) string {
	switch d := ev.Data.(type) {
	case *schemas.TaskAdded:
		return d.Task.ID
	case *schemas.TaskUpdated:
		return d.ID
	}
	return ""
}

// someIDs names a few of the list's task ids, for an error message.
func someIDs(v *projections.TaskList) string {
	if len(v.Tasks) == 0 {
		return "it has no tasks yet"
	}
	const shown = 10
	ids := make([]string, 0, shown)
	for _, t := range v.Tasks[:min(len(v.Tasks), shown)] {
		ids = append(ids, t.ID)
	}
	s := "tasks: " + strings.Join(ids, ", ")
	if len(v.Tasks) > shown {
		s += fmt.Sprintf(" and %d more", len(v.Tasks)-shown)
	}
	return s
}

func checkTaskID(id string) error {
	if err := schemas.ValidateStepName(id); err != nil {
		return fmt.Errorf("%w: task id %q: %v", ErrBadInput, id, err)
	}
	if slices.Contains(backlog.ReservedIDs(), id) {
		return fmt.Errorf("%w: task id %q is reserved (bootstrap, repair and review name the backlog's own runs)", ErrBadInput, id)
	}
	return nil
}

func checkReason(reason string) error {
	switch {
	case len(reason) > maxReasonBytes:
		return fmt.Errorf("%w: --reason is %d bytes; at most %d are allowed", ErrBadInput, len(reason), maxReasonBytes)
	case !utf8.ValidString(reason):
		return fmt.Errorf("%w: --reason is not valid UTF-8", ErrBadInput)
	}
	return nil
}

// FormatTaskFile returns the canonical form of a task file (backlog.Format)
// and whether data already is in it. A file that is not JSON, or whose
// decoding would lose something (an unknown member, a value of the wrong
// type), is not formatted: problems lists why, each with its JSON pointer
// (and a syntax error with its line and column). A file with other
// problems (a dependency cycle, say) is formatted: checking it is
// backlog.ParseFile's job.
func FormatTaskFile(name string, data []byte) (out []byte, formatted bool, problems []schemas.ValidationError) {
	f, errs := backlog.ParseFile(name, data)
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var strict backlog.File
	if f == nil || dec.Decode(&strict) != nil {
		if len(errs) == 0 { // ParseFile's schema reports what Decode trips on
			errs = []schemas.ValidationError{{Artifact: name, Message: "not a task file", Source: "schema"}}
		}
		return nil, false, errs
	}
	out = backlog.Format(f)
	return out, bytes.Equal(out, data), nil
}

// WriteFileAtomic replaces path with data: written to a temporary file in
// the same directory, synced, given path's mode (perm for a new file) and
// renamed over it, so readers see the old or the new content, never a mix.
func WriteFileAtomic(path string, data []byte, perm os.FileMode) error {
	if fi, err := os.Stat(path); err == nil {
		perm = fi.Mode().Perm()
	} else if !errors.Is(err, os.ErrNotExist) {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // fails harmlessly once renamed
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Chmod(tmp.Name(), perm); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// ExportTasks writes the task list of a backlog session, folded from its
// events up to stream sequence upTo (0: all), as dir/to-do.json in the
// canonical task file form. It returns the path, or "" without writing
// anything for a pipeline session.
func ExportTasks(ctx context.Context, b Bus, session, dir string, upTo uint64) (string, error) {
	v, err := ReplayTasks(ctx, b, session, Until{Seq: upTo})
	if errors.Is(err, ErrNotBacklog) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, backlog.FileName)
	return path, WriteFileAtomic(path, backlog.Format(v.Export()), 0o644)
}
