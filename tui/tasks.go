package tui

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/loopbus/loopbus/backlog"
	"github.com/loopbus/loopbus/client"
	"github.com/loopbus/loopbus/projections"
	"github.com/loopbus/loopbus/schemas"
)

// TaskListing is how WriteTasks lists a task list.
type TaskListing struct {
	// Status keeps only tasks of these statuses; empty keeps all.
	Status []string
	// JSON writes the view (its tasks filtered) as indented JSON.
	JSON bool
}

// Validate refuses unknown statuses.
func (l TaskListing) Validate() error {
	for _, s := range l.Status {
		if !slices.Contains(schemas.TaskStatuses(), s) {
			return fmt.Errorf("--status %q: want one of %s", s, strings.Join(schemas.TaskStatuses(), ", "))
		}
	}
	return nil
}

// statusOrder is the order tasks are listed in: as they are worked.
var statusOrder = []string{schemas.TaskDoing, schemas.TaskTodo, schemas.TaskBlocked, schemas.TaskDone}

// WriteTasks writes a task list as indented JSON (the view, its tasks
// filtered by status), or for people: a header with the phase and counts,
// then one line per task in the order they are worked (doing, then todo
// and blocked by priority, then done), with the tasks each still waits for
// and its blockers.
func WriteTasks(w io.Writer, v *projections.TaskList, l TaskListing) error {
	shown := v.Tasks
	if len(l.Status) > 0 {
		shown = slices.DeleteFunc(slices.Clone(v.Tasks), func(t schemas.Task) bool { return !slices.Contains(l.Status, t.Status) })
	}
	if l.JSON {
		c := *v
		c.Tasks = shown
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(&c)
	}
	phase := OrDash(v.Phase)
	if v.PhaseReason != "" {
		phase += ": " + OneLine(v.PhaseReason, 100)
	}
	var counts []string
	for _, s := range schemas.TaskStatuses() {
		counts = append(counts, fmt.Sprintf("%d %s", v.Counts[s], s))
	}
	fmt.Fprintf(w, "session   %s\nproject   %s (backlog %s)\nstatus    %s\nphase     %s\ntasks     %d: %s\nupdated   %s (stream seq %d)\n\n",
		v.Session, v.Project, v.Pipeline, v.Status, phase, len(v.Tasks), strings.Join(counts, ", "), v.UpdatedAt.UTC().Format(time.RFC3339), v.LastSeq)
	if len(shown) == 0 {
		if len(v.Tasks) == 0 {
			fmt.Fprintln(w, "(no tasks yet)")
		} else {
			fmt.Fprintf(w, "(no %s tasks)\n", strings.Join(l.Status, " or "))
		}
		return nil
	}
	rank := func(t schemas.Task) int {
		if i := slices.Index(statusOrder, t.Status); i >= 0 {
			return i
		}
		return len(statusOrder)
	}
	prio := func(t schemas.Task) int {
		if t.Priority <= 0 || t.Status == schemas.TaskDoing || t.Status == schemas.TaskDone {
			return int(^uint(0) >> 1)
		}
		return t.Priority
	}
	shown = slices.Clone(shown)
	slices.SortStableFunc(shown, func(a, b schemas.Task) int {
		if c := rank(a) - rank(b); c != 0 {
			return c
		}
		if pa, pb := prio(a), prio(b); pa != pb {
			if pa < pb {
				return -1
			}
			return 1
		}
		return backlog.Compare(a.ID, b.ID)
	})
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSTATUS\tPRI\tTITLE\tWAITS FOR\tBLOCKERS")
	for _, t := range shown {
		var waits []string
		for _, dep := range t.DependsOn {
			if d := v.Task(dep); d == nil || d.Status != schemas.TaskDone {
				waits = append(waits, dep)
			}
		}
		pri := "-"
		if t.Priority > 0 {
			pri = fmt.Sprint(t.Priority)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", t.ID, t.Status, pri, OneLine(t.Title, 60),
			OrDash(strings.Join(waits, ",")), OrDash(OneLine(strings.Join(t.Blockers, "; "), 80)))
	}
	return tw.Flush()
}

// WriteProblems writes one problem of a task file per line, indented, with
// its JSON pointer.
func WriteProblems(w io.Writer, errs []schemas.ValidationError) {
	for _, e := range errs {
		fmt.Fprintf(w, "  %s: %s\n", schemas.DisplayPointer(e.Pointer), e.Message)
	}
}

// taskChangeJSON is the JSON form of a task change.
type taskChangeJSON struct {
	Session string       `json:"session"`
	Event   string       `json:"event"`
	ID      string       `json:"id"`
	Seq     uint64       `json:"seq"`
	Task    schemas.Task `json:"task"`
}

// WriteTaskChange writes what tasks add or set-status did (verb: added,
// set): one JSON object, or one line for people.
func WriteTaskChange(w io.Writer, c client.TaskChange, asJSON bool, verb string) error {
	if asJSON {
		return json.NewEncoder(w).Encode(taskChangeJSON{Session: c.Event.Session, Event: c.Event.ID, ID: c.Task.ID, Seq: c.Seq, Task: c.Task})
	}
	_, err := fmt.Fprintf(w, "%s %s %s (%s) in %s at stream sequence %d\n", verb, c.Task.ID, OneLine(c.Task.Title, 60), c.Task.Status, c.Event.Session, c.Seq)
	return err
}
