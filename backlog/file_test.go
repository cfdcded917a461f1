package backlog

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/loopbus/loopbus/schemas"
)

// canonicalFile is a task file with every member set, written the way
// Format writes it: parsing and formatting it must give back these bytes.
const canonicalFile = `{
  "schema_version": 1,
  "project": {
    "name": "Demo <&>",
    "root": "."
  },
  "source_files": [
    "README.md",
    "docs/spec.md"
  ],
  "tasks": [
    {
      "id": "T001",
      "title": "Write the parser",
      "description": "Parse the input",
      "reference": "internal/parse",
      "priority": 1,
      "status": "done",
      "details": "Use a table",
      "steps": [
        "Step 1",
        "Step 2"
      ],
      "blockers": [
        "none left"
      ],
      "tags": [
        "core"
      ],
      "files": [
        "parse.go",
        "parse_test.go"
      ],
      "notes": [
        "done in one run"
      ],
      "created_at": "2024-01-01T00:00:00Z",
      "updated_at": "2024-01-02T03:04:05.5+02:00"
    },
    {
      "id": "T002",
      "title": "Use the parser",
      "status": "todo",
      "depends_on": [
        "T001"
      ]
    }
  ]
}
`

// problem is one expected validation error: its JSON pointer and a part of
// its message.
type problem struct {
	pointer string
	msg     string
}

// checkProblems fails unless got are exactly want, in order, each with the
// artifact name set.
func checkProblems(t *testing.T, artifact string, got []schemas.ValidationError, want []problem) {
	t.Helper()
	ok := len(got) == len(want)
	for i := 0; ok && i < len(got); i++ {
		ok = got[i].Pointer == want[i].pointer && strings.Contains(got[i].Message, want[i].msg) &&
			got[i].Artifact == artifact && got[i].Source == "schema"
	}
	if !ok {
		t.Errorf("problems:\n%s\nwant (pointer: message part, artifact %q, source schema):\n%v", dump(got), artifact, want)
	}
}

func dump(errs []schemas.ValidationError) string {
	var b strings.Builder
	for _, e := range errs {
		b.WriteString("  " + e.Artifact + " " + e.Pointer + ": " + e.Message + " [" + e.Source + "]\n")
	}
	return b.String()
}

// file builds a task file text from its tasks.
func file(t *testing.T, tasks ...schemas.Task) string {
	t.Helper()
	return string(Format(&File{SchemaVersion: 1, Project: Project{Name: "p"}, Tasks: tasks}))
}

func task(id, status string, deps ...string) schemas.Task {
	return schemas.Task{ID: id, Title: "do " + id, Status: status, DependsOn: deps}
}

func TestParseFile(t *testing.T) {
	tests := []struct {
		name string
		in   string
		// wantIDs are the ids of the decoded tasks; nil when no file
		// comes back.
		wantIDs []string
		want    []problem
		wantErr bool
	}{
		{name: "valid canonical file", in: canonicalFile, wantIDs: []string{"T001", "T002"}},
		{name: "valid minimal file", in: `{"schema_version": 1, "tasks": []}`, wantIDs: []string{}},
		{
			name:    "invalid JSON names line and column",
			in:      "{\n  \"schema_version\": 1,\n  \"tasks\": [\n    {\"id\": \"T1\",, }\n  ]\n}",
			want:    []problem{{"", "not valid JSON at line 4, column 17: invalid character ','"}},
			wantErr: true,
		},
		{
			name:    "invalid JSON on the first line",
			in:      `{"schema_version": 1 "tasks": []}`,
			want:    []problem{{"", "not valid JSON at line 1, column 22"}},
			wantErr: true,
		},
		{
			name:    "trailing garbage",
			in:      "{\"schema_version\": 1, \"tasks\": []}\nx",
			want:    []problem{{"", "not valid JSON at line 2, column 1"}},
			wantErr: true,
		},
		{
			name:    "empty input",
			in:      "",
			want:    []problem{{"", "not valid JSON at line 1, column 1: unexpected end of JSON input"}},
			wantErr: true,
		},
		{
			name:    "not an object",
			in:      `[]`,
			want:    []problem{{"", "got array, want object"}},
			wantErr: true,
		},
		{
			name:    "missing title",
			in:      `{"schema_version": 1, "tasks": [{"id": "T1", "status": "todo"}]}`,
			wantIDs: []string{"T1"},
			want:    []problem{{"/tasks/0", "missing property 'title'"}},
			wantErr: true,
		},
		{
			name:    "empty title",
			in:      `{"schema_version": 1, "tasks": [{"id": "T1", "title": "", "status": "todo"}]}`,
			wantIDs: []string{"T1"},
			want:    []problem{{"/tasks/0/title", "minLength"}},
			wantErr: true,
		},
		{
			name:    "bad status",
			in:      `{"schema_version": 1, "tasks": [{"id": "T1", "title": "a", "status": "finished"}]}`,
			wantIDs: []string{"T1"},
			want:    []problem{{"/tasks/0/status", "value must be one of 'todo', 'doing', 'done', 'blocked'"}},
			wantErr: true,
		},
		{
			name:    "unknown member of a task",
			in:      `{"schema_version": 1, "tasks": [{"id": "T1", "title": "a", "status": "todo", "owner": "me"}]}`,
			wantIDs: []string{"T1"},
			want:    []problem{{"/tasks/0", "additional properties 'owner' not allowed"}},
			wantErr: true,
		},
		{
			name:    "unknown top-level member",
			in:      `{"schema_version": 1, "tasks": [], "version": 3}`,
			wantIDs: []string{},
			want:    []problem{{"", "additional properties 'version' not allowed"}},
			wantErr: true,
		},
		{
			name:    "schema_version 2",
			in:      `{"schema_version": 2, "tasks": []}`,
			wantIDs: []string{},
			want:    []problem{{"/schema_version", "value must be 1"}},
			wantErr: true,
		},
		{
			name:    "missing schema_version",
			in:      `{"tasks": []}`,
			wantIDs: []string{},
			want:    []problem{{"", "missing property 'schema_version'"}},
			wantErr: true,
		},
		{
			name:    "id outside the step-name alphabet",
			in:      `{"schema_version": 1, "tasks": [{"id": "T 1", "title": "a", "status": "todo"}]}`,
			wantIDs: []string{"T 1"},
			want:    []problem{{"/tasks/0/id", "does not match pattern"}},
			wantErr: true,
		},
		{
			name:    "negative priority",
			in:      `{"schema_version": 1, "tasks": [{"id": "T1", "title": "a", "status": "todo", "priority": -1}]}`,
			wantIDs: []string{"T1"},
			want:    []problem{{"/tasks/0/priority", "minimum"}},
			wantErr: true,
		},
		{
			name: "several schema problems at once",
			in: `{"schema_version": 2, "tasks": [
				{"id": "T1", "status": "todo"},
				{"id": "T2", "title": "b", "status": "later", "x": 1}]}`,
			wantIDs: []string{"T1", "T2"},
			want: []problem{
				{"/schema_version", "value must be 1"},
				{"/tasks/0", "missing property 'title'"},
				{"/tasks/1", "additional properties 'x' not allowed"},
				{"/tasks/1/status", "value must be one of"},
			},
			wantErr: true,
		},
		{
			name:    "duplicate ids",
			in:      file(t, task("T1", "todo"), task("T2", "todo"), task("T1", "done")),
			wantIDs: []string{"T1", "T2", "T1"},
			want:    []problem{{"/tasks/2/id", `duplicate task id "T1" (also /tasks/0)`}},
			wantErr: true,
		},
		{
			name:    "missing dependency",
			in:      file(t, task("T1", "todo"), task("T2", "todo", "T1", "T9")),
			wantIDs: []string{"T1", "T2"},
			want:    []problem{{"/tasks/1/depends_on/1", "task T2 depends on T9, which does not exist"}},
			wantErr: true,
		},
		{
			// A self-dependency is its own problem, not also a cycle.
			name:    "self-dependency",
			in:      file(t, task("T1", "todo", "T1")),
			wantIDs: []string{"T1"},
			want:    []problem{{"/tasks/0/depends_on/0", "task T1 depends on itself"}},
			wantErr: true,
		},
		{
			name:    "cycle of 3 named as a path",
			in:      file(t, task("A", "todo", "B"), task("B", "todo", "C"), task("C", "todo", "A")),
			wantIDs: []string{"A", "B", "C"},
			want:    []problem{{"/tasks/0/depends_on", "dependency cycle: A -> B -> C -> A"}},
			wantErr: true,
		},
		{
			// The path starts at the lowest id whatever the file order,
			// so the message is stable; the pointer is that task's.
			name:    "cycle of 3 in another file order",
			in:      file(t, task("C", "todo", "A"), task("B", "todo", "C"), task("A", "todo", "B")),
			wantIDs: []string{"C", "B", "A"},
			want:    []problem{{"/tasks/2/depends_on", "dependency cycle: A -> B -> C -> A"}},
			wantErr: true,
		},
		{
			// A task that only leads into a loop is not part of it.
			name:    "cycle reached through another task",
			in:      file(t, task("A", "todo", "B"), task("B", "todo", "C"), task("C", "todo", "B")),
			wantIDs: []string{"A", "B", "C"},
			want:    []problem{{"/tasks/1/depends_on", "dependency cycle: B -> C -> B"}},
			wantErr: true,
		},
		{
			name: "several dependency problems at once",
			in: file(t, task("T1", "todo", "T1"), task("T2", "todo", "T3"), task("T3", "todo", "T2"),
				task("T1", "todo"), task("T4", "todo", "T8")),
			wantIDs: []string{"T1", "T2", "T3", "T1", "T4"},
			want: []problem{
				{"/tasks/3/id", `duplicate task id "T1" (also /tasks/0)`},
				{"/tasks/0/depends_on/0", "task T1 depends on itself"},
				{"/tasks/4/depends_on/0", "task T4 depends on T8, which does not exist"},
				{"/tasks/1/depends_on", "dependency cycle: T2 -> T3 -> T2"},
			},
			wantErr: true,
		},
		{
			name: "a dependency chain without a cycle",
			in: file(t, task("T1", "done"), task("T2", "todo", "T1"), task("T3", "todo", "T1", "T2"),
				task("T4", "blocked", "T2", "T3")),
			wantIDs: []string{"T1", "T2", "T3", "T4"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, errs := ParseFile("to-do.json", []byte(tt.in))
			if gotErr := len(errs) > 0; gotErr != tt.wantErr {
				t.Fatalf("ParseFile problems:\n%swantErr %v", dump(errs), tt.wantErr)
			}
			checkProblems(t, "to-do.json", errs, tt.want)
			if tt.wantIDs == nil {
				if f != nil {
					t.Errorf("file = %+v, want nil", f)
				}
				return
			}
			if f == nil {
				t.Fatalf("file = nil, want tasks %v", tt.wantIDs)
			}
			var ids []string
			for _, tk := range f.Tasks {
				ids = append(ids, tk.ID)
			}
			if !slices.Equal(ids, tt.wantIDs) {
				t.Errorf("task ids = %v, want %v", ids, tt.wantIDs)
			}
		})
	}
}

func TestParseFileDecodesEveryMember(t *testing.T) {
	f, errs := ParseFile("to-do.json", []byte(canonicalFile))
	if len(errs) > 0 {
		t.Fatalf("ParseFile:\n%s", dump(errs))
	}
	created := time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)
	updated := time.Date(2024, 1, 2, 1, 4, 5, 5e8, time.UTC)
	want := &File{
		SchemaVersion: 1,
		Project:       Project{Name: "Demo <&>", Root: "."},
		SourceFiles:   []string{"README.md", "docs/spec.md"},
		Tasks: []schemas.Task{{
			ID: "T001", Title: "Write the parser", Description: "Parse the input", Reference: "internal/parse",
			Priority: 1, Status: "done", Details: "Use a table", Steps: []string{"Step 1", "Step 2"},
			Blockers: []string{"none left"}, Tags: []string{"core"}, Files: []string{"parse.go", "parse_test.go"},
			Notes: []string{"done in one run"}, CreatedAt: &created, UpdatedAt: &updated,
		}, {ID: "T002", Title: "Use the parser", Status: "todo", DependsOn: []string{"T001"}}},
	}
	// Times are compared as instants; the rest exactly.
	for i := range f.Tasks {
		g, w := f.Tasks[i], want.Tasks[i]
		if !sameTime(g.CreatedAt, w.CreatedAt) || !sameTime(g.UpdatedAt, w.UpdatedAt) {
			t.Errorf("task %d times = %v, %v; want %v, %v", i, g.CreatedAt, g.UpdatedAt, w.CreatedAt, w.UpdatedAt)
		}
		f.Tasks[i].CreatedAt, f.Tasks[i].UpdatedAt = nil, nil
		want.Tasks[i].CreatedAt, want.Tasks[i].UpdatedAt = nil, nil
	}
	if !reflect.DeepEqual(f, want) {
		t.Errorf("file =\n%+v\nwant\n%+v", f, want)
	}
}

func sameTime(a, b *time.Time) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Equal(*b)
}

func TestFormat(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want string
	}{
		{name: "canonical file unchanged", in: canonicalFile, want: canonicalFile},
		{
			// Members come out in the fixed order whatever the input
			// order; empty lists and a zero priority are left out.
			name: "member order fixed",
			in: `{"tasks": [{"updated_at": "2024-05-06T07:08:09Z", "depends_on": [], "status": "todo", "priority": 0,
				"title": "a & b", "id": "T1", "steps": []}],
				"source_files": ["a.md"], "project": {"root": "src", "name": "n"}, "schema_version": 1}`,
			want: `{
  "schema_version": 1,
  "project": {
    "name": "n",
    "root": "src"
  },
  "source_files": [
    "a.md"
  ],
  "tasks": [
    {
      "id": "T1",
      "title": "a & b",
      "status": "todo",
      "updated_at": "2024-05-06T07:08:09Z"
    }
  ]
}
`,
		},
		{
			name: "absent lists written empty",
			in:   `{"schema_version": 1, "tasks": []}`,
			want: "{\n  \"schema_version\": 1,\n  \"project\": {\n    \"name\": \"\"\n  },\n  \"source_files\": [],\n  \"tasks\": []\n}\n",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, errs := ParseFile("to-do.json", []byte(tt.in))
			if len(errs) > 0 {
				t.Fatalf("ParseFile:\n%s", dump(errs))
			}
			got := Format(f)
			if string(got) != tt.want {
				t.Errorf("Format =\n%s\nwant\n%s", got, tt.want)
			}
			// Idempotent: formatting the formatted file changes nothing.
			f2, errs := ParseFile("to-do.json", got)
			if len(errs) > 0 {
				t.Fatalf("ParseFile(Format):\n%s", dump(errs))
			}
			if again := Format(f2); !bytes.Equal(again, got) {
				t.Errorf("Format(ParseFile(Format(x))) =\n%s\nwant\n%s", again, got)
			}
		})
	}
}

func TestFormatZeroFileParses(t *testing.T) {
	out := Format(&File{SchemaVersion: FileSchemaVersion})
	if _, errs := ParseFile(FileName, out); len(errs) > 0 {
		t.Errorf("Format of an empty file does not parse:\n%s%s", out, dump(errs))
	}
}

func TestFormatErrors(t *testing.T) {
	tests := []struct {
		name string
		errs []schemas.ValidationError
		want string
	}{
		{name: "none", want: ""},
		{
			name: "one per line, root shown",
			errs: []schemas.ValidationError{
				{Artifact: "to-do.json", Message: "not valid JSON"},
				{Artifact: "to-do.json", Pointer: "/tasks/0/id", Message: "bad id"},
				{Message: "command failed"},
			},
			want: "to-do.json (root): not valid JSON\nto-do.json /tasks/0/id: bad id\ncommand failed",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := FormatErrors(tt.errs); got != tt.want {
				t.Errorf("FormatErrors = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestFileSchemaIsJSONSchema(t *testing.T) {
	if !json.Valid(FileSchema()) {
		t.Fatal("FileSchema is not JSON")
	}
	if _, err := schemas.CompileArtifactSchema(FileName, FileSchema()); err != nil {
		t.Fatalf("CompileArtifactSchema: %v", err)
	}
}

// FuzzParseFile checks that ParseFile never panics, that every problem
// names the file, and that a file it accepts formats to a file it accepts
// again with the same tasks and the same bytes.
func FuzzParseFile(f *testing.F) {
	for _, seed := range []string{
		canonicalFile,
		`{"schema_version": 1, "tasks": []}`,
		`{"schema_version": 1, "tasks": [{"id": "T1", "title": "a", "status": "todo", "depends_on": ["T1"]}]}`,
		`{"schema_version": 1, "tasks": [{"id": "A", "title": "a", "status": "todo", "depends_on": ["B"]},
			{"id": "B", "title": "b", "status": "todo", "depends_on": ["A"]}]}`,
		`{"schema_version": 1, "tasks": [{"id": "T1", "title": "a\u00e9\ud83d\ude00<>", "status": "blocked",
			"steps": [], "priority": 7, "created_at": "2024-02-29T23:59:59.123456789-07:00"}]}`,
		`{"schema_version": 1, "tasks": [{"id": "T1", "title": "a", "status": "todo", "priority": 1.0}]}`,
		`{"schema_version": 1, "tasks": [{"id": "T1", "id": "T2", "title": "a", "status": "todo"}]}`,
		`{"schema_version": 2}`,
		"{\n\"tasks\": [,]}",
		``,
		`null`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		got, errs := ParseFile("x.json", data)
		for _, e := range errs {
			if e.Artifact != "x.json" || e.Message == "" {
				t.Fatalf("problem without artifact or message: %+v", e)
			}
		}
		if len(errs) > 0 {
			return
		}
		if got == nil {
			t.Fatal("no problem and no file")
		}
		tasks := slices.Clone(got.Tasks)
		out := Format(got)
		again, errs := ParseFile("x.json", out)
		if len(errs) > 0 {
			t.Fatalf("formatted file refused:\n%s%s", out, dump(errs))
		}
		if len(again.Tasks) != len(tasks) {
			t.Fatalf("%d tasks after formatting, want %d", len(again.Tasks), len(tasks))
		}
		for i := range tasks {
			if !sameTask(again.Tasks[i], tasks[i]) {
				t.Fatalf("task %d after formatting = %+v, want %+v", i, again.Tasks[i], tasks[i])
			}
		}
		if out2 := Format(again); !bytes.Equal(out2, out) {
			t.Fatalf("formatting not idempotent:\n%s\nthen\n%s", out, out2)
		}
	})
}

// sameTask compares tasks as a task file means them: empty and absent
// lists are the same, times are instants.
func sameTask(a, b schemas.Task) bool {
	if !sameTime(a.CreatedAt, b.CreatedAt) || !sameTime(a.UpdatedAt, b.UpdatedAt) {
		return false
	}
	norm := func(t schemas.Task) schemas.Task {
		t.CreatedAt, t.UpdatedAt = nil, nil
		for _, s := range []*[]string{&t.Steps, &t.Blockers, &t.Tags, &t.Files, &t.DependsOn, &t.Notes} {
			if len(*s) == 0 {
				*s = nil
			}
		}
		return t
	}
	return reflect.DeepEqual(norm(a), norm(b))
}

// TestParseFileSchemaAndDependencyProblemsTogether: a file failing its
// schema still gets its dependency problems reported, so a repair can fix
// everything in one run.
func TestParseFileSchemaAndDependencyProblemsTogether(t *testing.T) {
	in := `{"schema_version": 1, "tasks": [
  {"id": "T1", "status": "todo"},
  {"id": "T2", "title": "b", "status": "todo", "depends_on": ["T3"]},
  {"id": "T3", "title": "c", "status": "todo", "depends_on": ["T2", "T9"]}]}`
	_, errs := ParseFile("to-do.json", []byte(in))
	checkProblems(t, "to-do.json", errs, []problem{
		{"/tasks/0", "missing property 'title'"},
		{"/tasks/2/depends_on/1", "task T3 depends on T9, which does not exist"},
		{"/tasks/1/depends_on", "dependency cycle: T2 -> T3 -> T2"},
	})
}

// TestParseFileIntegralFloatPriority: 2.0 satisfies the schema's integer
// but not Go's int: one problem at the priority, not a bare Go error.
func TestParseFileIntegralFloatPriority(t *testing.T) {
	f, errs := ParseFile("to-do.json", []byte(`{"schema_version": 1, "tasks": [{"id": "T1", "title": "a", "status": "todo", "priority": 2.0}]}`))
	if len(errs) == 0 && f.Tasks[0].Priority == 2 {
		return
	}
	if len(errs) != 1 || errs[0].Pointer != "/tasks/priority" && errs[0].Pointer != "/tasks/0/priority" {
		t.Errorf("want priority 2 or one problem at the priority, got:\n%s", dump(errs))
	}
}

// TestParseFileLimits: a task file too big for a session is refused with
// the limit, before its tasks are checked one by one.
func TestParseFileLimits(t *testing.T) {
	var b strings.Builder
	b.WriteString(`{"schema_version": 1, "tasks": [`)
	for i := range MaxTasks + 1 {
		if i > 0 {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, `{"id": "T%d", "title": "t", "status": "todo"}`, i)
	}
	b.WriteString("]}")
	if _, errs := ParseFile("to-do.json", []byte(b.String())); len(errs) != 1 || !strings.Contains(errs[0].Message, "1001 tasks, over the limit of 1000") {
		t.Errorf("errs = %v", errs)
	}
	huge := []byte(`{"schema_version": 1, "tasks": [], "x": "` + strings.Repeat("x", MaxFileBytes) + `"}`)
	if _, errs := ParseFile("to-do.json", huge); len(errs) != 1 || !strings.Contains(errs[0].Message, "over the 1048576-byte limit") {
		t.Errorf("errs = %v", errs)
	}
}
