package backlog

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/loopbus/loopbus/schemas"
)

// SummaryName is the output every task, review and bootstrap run writes.
const SummaryName = "summary.json"

// ReviewTaskID is the task_id of a review run's summary.
const ReviewTaskID = "review"

// Summary is what an agent writes after a run: what it did to its task and
// the tasks it found.
type Summary struct {
	TaskID string `json:"task_id"`
	// Status is the task's new status: done, blocked, doing (not finished:
	// it is picked again first) or todo.
	Status   string         `json:"status"`
	Summary  string         `json:"summary"`
	Files    []string       `json:"files,omitempty"`
	Blockers []string       `json:"blockers,omitempty"`
	NewTasks []schemas.Task `json:"new_tasks,omitempty"`
}

// newTaskProps is a task as an agent proposes it: id and status optional
// (an id is assigned, the status is todo).
var newTaskProps = strings.Replace(taskProps, `"required": ["id", "title", "status"]`, `"required": ["title"]`, 1)

// SummarySchema returns the JSON Schema of the summary of a run on task id
// (ReviewTaskID for a review run): task_id must be that id.
func SummarySchema(id string) json.RawMessage {
	quoted, _ := json.Marshal(id)
	return json.RawMessage(`{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "$id": "urn:loopbus:schema:task-summary:1",
  "title": "loopbus task summary",
  "type": "object",
  "additionalProperties": false,
  "required": ["task_id", "status", "summary"],
  "properties": {
    "task_id": {"const": ` + string(quoted) + `},
    "status": {"enum": ["todo", "doing", "done", "blocked"]},
    "summary": {"type": "string", "minLength": 1},
    "files": {"type": "array", "items": {"type": "string"}},
    "blockers": {"type": "array", "items": {"type": "string"}},
    "new_tasks": {"type": "array", "items": ` + newTaskProps + `}
  }
}`)
}

var ptrTask = regexp.MustCompile(`^/tasks/(\d+)`)

// CheckNew checks tasks an agent proposes against the list: ids are
// assigned where missing (see NextID), statuses default to todo, and the
// list with them added must pass CheckTasks. Pointers are rewritten to
// prefix (for example "/new_tasks"). It returns the tasks as they will be
// added.
func (l *List) CheckNew(tasks []schemas.Task, prefix string) ([]schemas.Task, []schemas.ValidationError) {
	out := make([]schemas.Task, len(tasks))
	taken := map[string]bool{}
	for _, t := range tasks {
		if t.ID != "" {
			taken[t.ID] = true
		}
	}
	for i, t := range tasks {
		if t.ID == "" {
			t.ID = l.NextID(taken)
			taken[t.ID] = true
		}
		if t.Status == "" {
			t.Status = schemas.TaskTodo
		}
		t.CreatedAt, t.UpdatedAt = nil, nil
		out[i] = t
	}
	existing := l.Sorted()
	all := append(existing, out...)
	errs := CheckTasks(all)
	for i := range errs {
		m := ptrTask.FindStringSubmatch(errs[i].Pointer)
		if m == nil {
			continue
		}
		k, _ := strconv.Atoi(m[1])
		rest := strings.TrimPrefix(errs[i].Pointer, m[0])
		if k >= len(existing) {
			errs[i].Pointer = fmt.Sprintf("%s/%d%s", prefix, k-len(existing), rest)
		} else {
			errs[i].Pointer = prefix
		}
	}
	return out, errs
}
