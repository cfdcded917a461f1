package backlog

import (
	"bytes"
	"encoding/json"
	"slices"
	"testing"

	"github.com/loopbus/loopbus/schemas"
)

func TestSummarySchema(t *testing.T) {
	tests := []struct {
		name    string
		id      string
		doc     string
		want    []problem
		wantErr bool
	}{
		{name: "minimal", id: "T001", doc: `{"task_id": "T001", "status": "done", "summary": "did it"}`},
		{
			name: "every member, new tasks without id or status",
			id:   "T001",
			doc: `{"task_id": "T001", "status": "blocked", "summary": "stuck", "files": ["a.go"], "blockers": ["no key"],
				"new_tasks": [{"title": "follow up"}, {"id": "T9", "title": "more", "status": "todo", "priority": 2,
				"depends_on": ["T001"], "tags": ["x"]}]}`,
		},
		{name: "review run", id: ReviewTaskID, doc: `{"task_id": "review", "status": "done", "summary": "ok", "new_tasks": []}`},
		{
			name: "id needing escapes",
			id:   `a"b\c`,
			doc:  `{"task_id": "a\"b\\c", "status": "todo", "summary": "s"}`,
		},
		{
			name:    "task_id of another task",
			id:      "T001",
			doc:     `{"task_id": "T002", "status": "done", "summary": "s"}`,
			want:    []problem{{"/task_id", "value must be 'T001'"}},
			wantErr: true,
		},
		{
			name:    "bad status",
			id:      "T001",
			doc:     `{"task_id": "T001", "status": "finished", "summary": "s"}`,
			want:    []problem{{"/status", "value must be one of 'todo', 'doing', 'done', 'blocked'"}},
			wantErr: true,
		},
		{
			name:    "missing summary",
			id:      "T001",
			doc:     `{"task_id": "T001", "status": "done"}`,
			want:    []problem{{"", "missing property 'summary'"}},
			wantErr: true,
		},
		{
			name:    "empty summary",
			id:      "T001",
			doc:     `{"task_id": "T001", "status": "done", "summary": ""}`,
			want:    []problem{{"/summary", "minLength"}},
			wantErr: true,
		},
		{
			name:    "unknown member",
			id:      "T001",
			doc:     `{"task_id": "T001", "status": "done", "summary": "s", "confidence": 0.9}`,
			want:    []problem{{"", "additional properties 'confidence' not allowed"}},
			wantErr: true,
		},
		{
			name:    "unknown member of a new task",
			id:      "T001",
			doc:     `{"task_id": "T001", "status": "done", "summary": "s", "new_tasks": [{"title": "a", "owner": "me"}]}`,
			want:    []problem{{"/new_tasks/0", "additional properties 'owner' not allowed"}},
			wantErr: true,
		},
		{
			name:    "new task without title",
			id:      "T001",
			doc:     `{"task_id": "T001", "status": "done", "summary": "s", "new_tasks": [{"id": "T5"}]}`,
			want:    []problem{{"/new_tasks/0", "missing property 'title'"}},
			wantErr: true,
		},
		{
			name:    "new task with a bad id and status",
			id:      "T001",
			doc:     `{"task_id": "T001", "status": "done", "summary": "s", "new_tasks": [{"id": "a b", "title": "t", "status": "x"}]}`,
			want:    []problem{{"/new_tasks/0/id", "does not match pattern"}, {"/new_tasks/0/status", "value must be one of"}},
			wantErr: true,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sch, err := schemas.CompileArtifactSchema(SummaryName, SummarySchema(tt.id))
			if err != nil {
				t.Fatalf("CompileArtifactSchema: %v", err)
			}
			errs := sch.Validate(SummaryName, []byte(tt.doc))
			if (len(errs) > 0) != tt.wantErr {
				t.Fatalf("Validate:\n%swantErr %v", dump(errs), tt.wantErr)
			}
			checkProblems(t, SummaryName, errs, tt.want)
			if tt.wantErr {
				return
			}
			// What the schema accepts, Summary holds member for member.
			dec := json.NewDecoder(bytes.NewReader([]byte(tt.doc)))
			dec.DisallowUnknownFields()
			var s Summary
			if err := dec.Decode(&s); err != nil {
				t.Fatalf("accepted summary does not decode into Summary: %v", err)
			}
			if s.TaskID != tt.id {
				t.Errorf("TaskID = %q, want %q", s.TaskID, tt.id)
			}
		})
	}
}

func TestCheckNew(t *testing.T) {
	named := func(id, title string, deps ...string) schemas.Task {
		return schemas.Task{ID: id, Title: title, DependsOn: deps}
	}
	tests := []struct {
		name     string
		existing []schemas.Task
		in       []schemas.Task
		// want are the tasks as they will be added (id, status, deps).
		want    []schemas.Task
		wantErr []problem
	}{
		{name: "no new tasks", existing: []schemas.Task{task("T001", "done")}},
		{
			name:     "ids assigned after the existing ones, status todo",
			existing: []schemas.Task{task("T001", "done"), task("T002", "todo")},
			in:       []schemas.Task{named("", "a"), named("", "b")},
			want:     []schemas.Task{{ID: "T003", Title: "a", Status: "todo"}, {ID: "T004", Title: "b", Status: "todo"}},
		},
		{
			name:     "assigned ids skip the ids of other new tasks",
			existing: []schemas.Task{task("T001", "done")},
			in:       []schemas.Task{named("", "a"), named("T002", "b"), named("", "c")},
			want: []schemas.Task{{ID: "T003", Title: "a", Status: "todo"}, {ID: "T002", Title: "b", Status: "todo"},
				{ID: "T004", Title: "c", Status: "todo"}},
		},
		{
			name: "given status kept",
			in:   []schemas.Task{{ID: "X", Title: "x", Status: "blocked", Blockers: []string{"why"}}},
			want: []schemas.Task{{ID: "X", Title: "x", Status: "blocked", Blockers: []string{"why"}}},
		},
		{
			name: "times dropped",
			in:   []schemas.Task{{ID: "X", Title: "x", CreatedAt: &t0, UpdatedAt: &t1}},
			want: []schemas.Task{{ID: "X", Title: "x", Status: "todo"}},
		},
		{
			name:     "new task depending on another new task and an existing one",
			existing: []schemas.Task{task("T001", "done")},
			in:       []schemas.Task{named("T003", "b", "T002", "T001"), named("T002", "a")},
			want: []schemas.Task{{ID: "T003", Title: "b", Status: "todo", DependsOn: []string{"T002", "T001"}},
				{ID: "T002", Title: "a", Status: "todo"}},
		},
		{
			name:     "unknown dependency",
			existing: []schemas.Task{task("T001", "done")},
			in:       []schemas.Task{named("", "a", "T001"), named("", "b", "T001", "T7")},
			want: []schemas.Task{{ID: "T002", Title: "a", Status: "todo", DependsOn: []string{"T001"}},
				{ID: "T003", Title: "b", Status: "todo", DependsOn: []string{"T001", "T7"}}},
			wantErr: []problem{{"/new_tasks/1/depends_on/1", "task T003 depends on T7, which does not exist"}},
		},
		{
			name:     "cycle among new tasks",
			existing: []schemas.Task{task("T001", "todo")},
			in:       []schemas.Task{named("B", "b", "A"), named("A", "a", "B")},
			want: []schemas.Task{{ID: "B", Title: "b", Status: "todo", DependsOn: []string{"A"}},
				{ID: "A", Title: "a", Status: "todo", DependsOn: []string{"B"}}},
			wantErr: []problem{{"/new_tasks/1/depends_on", "dependency cycle: A -> B -> A"}},
		},
		{
			name:     "self-dependency",
			in:       []schemas.Task{named("X", "x", "X")},
			want:     []schemas.Task{{ID: "X", Title: "x", Status: "todo", DependsOn: []string{"X"}}},
			wantErr:  []problem{{"/new_tasks/0/depends_on/0", "task X depends on itself"}},
			existing: []schemas.Task{task("T001", "done")},
		},
		{
			name:     "id of an existing task",
			existing: []schemas.Task{task("T001", "done"), task("T2", "todo")},
			in:       []schemas.Task{named("", "a"), named("T2", "b")},
			want:     []schemas.Task{{ID: "T003", Title: "a", Status: "todo"}, {ID: "T2", Title: "b", Status: "todo"}},
			wantErr:  []problem{{"/new_tasks/1/id", `duplicate task id "T2"`}},
		},
		{
			// The list is not the agent's to fix, but a problem in it
			// still refuses the new tasks: it is reported at the prefix.
			name:     "problem of an existing task reported at the prefix",
			existing: []schemas.Task{task("T001", "todo", "T9")},
			in:       []schemas.Task{named("", "a")},
			want:     []schemas.Task{{ID: "T002", Title: "a", Status: "todo"}},
			wantErr:  []problem{{"/new_tasks", "task T001 depends on T9, which does not exist"}},
		},
		{
			name:     "bad status",
			existing: []schemas.Task{task("T001", "done")},
			in:       []schemas.Task{{ID: "X", Title: "x", Status: "later"}},
			want:     []schemas.Task{{ID: "X", Title: "x", Status: "later"}},
			wantErr:  []problem{{"/new_tasks/0/status", `status "later"`}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := listOf(t, tt.existing...)
			in := slices.Clone(tt.in)
			got, errs := l.CheckNew(in, "/new_tasks")
			checkProblems(t, "", errs, tt.wantErr)
			if g, w := tasksJSON(t, got), tasksJSON(t, tt.want); g != w {
				t.Errorf("tasks =\n%s\nwant\n%s", g, w)
			}
			// The caller's tasks and the list are left alone.
			if !slices.EqualFunc(in, tt.in, sameTask) {
				t.Errorf("CheckNew changed its input: %+v", in)
			}
			if len(l.Tasks) != len(tt.existing) {
				t.Errorf("CheckNew changed the list: %d tasks, want %d", len(l.Tasks), len(tt.existing))
			}
		})
	}
}
