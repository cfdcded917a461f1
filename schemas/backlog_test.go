package schemas

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"
)

// backlogSession returns a valid session.started of a backlog pipeline
// whose task file was imported.
func backlogSession(t *testing.T) *SessionStarted {
	t.Helper()
	spec := testArtifact(t, "spec.md", "", "# Spec\n")
	todo := testArtifact(t, "to-do.json", "", `{"schema_version":1,"tasks":[]}`)
	return &SessionStarted{
		Pipeline: Pipeline{
			Name: "app",
			Kind: KindBacklog,
			Backlog: &Backlog{
				Agents: map[string]AgentSpec{
					"claude": {Backend: BackendClaude, Model: "opus"},
					"codex":  {Backend: BackendCodex},
				},
				Roles: map[string][]string{
					RoleIterate: {"claude", "codex"},
					RoleReview:  {"codex"},
				},
				Schedule:             ScheduleOddEven,
				MaxParallel:          2,
				SourceFiles:          []string{"spec.md"},
				Project:              "app",
				Prompts:              map[string]string{RoleReview: "Review {{.Task.ID}}."},
				MaxSummaryIterations: 3,
				TimeoutMs:            1800000,
				Validate:             []string{"make", "test"},
				ValidateTimeoutMs:    600000,
			},
		},
		Input:      todo,
		SourceHash: ShortHash(todo.Digest),
		Backlog: &BacklogStart{
			Sources: []ArtifactRef{spec},
			Tasks: []Task{
				{ID: "T-1", Title: "Scaffold", Status: TaskDone},
				{ID: "T-2", Title: "Parse config", Status: TaskTodo, Priority: 2, DependsOn: []string{"T-1"}},
			},
			TaskFile: &todo,
		},
	}
}

func TestSessionStartedBacklog(t *testing.T) {
	c := newTestCatalogue(t)
	tests := []struct {
		name    string
		edit    func(s *SessionStarted)
		wantErr bool
	}{
		{name: "imported task file", edit: func(*SessionStarted) {}},
		{name: "import errors instead of tasks", edit: func(s *SessionStarted) {
			s.Backlog.Tasks = nil
			s.Backlog.ImportErrors = []ValidationError{{Artifact: "to-do.json", Pointer: "/tasks/0/status", Message: "value must be one of ...", Source: "schema"}}
		}},
		{name: "no task file", edit: func(s *SessionStarted) { s.Backlog = &BacklogStart{} }},
		{name: "no backlog start", edit: func(s *SessionStarted) { s.Backlog = nil }},
		{name: "nil steps", edit: func(s *SessionStarted) { s.Pipeline.Steps = nil }},
		{name: "empty steps", edit: func(s *SessionStarted) { s.Pipeline.Steps = []Step{} }},
		{name: "single schedule, one role", edit: func(s *SessionStarted) {
			s.Pipeline.Backlog.Schedule = ScheduleSingle
			s.Pipeline.Backlog.Roles = map[string][]string{RoleIterate: {"claude"}}
		}},
		{name: "kind pipeline with steps", edit: func(s *SessionStarted) {
			s.Pipeline = Pipeline{Name: "p", Kind: KindPipeline, Steps: []Step{{Name: "s", Agent: AgentSpec{Backend: BackendExec}, MaxIterations: 1, TimeoutMs: 1}}}
			s.Backlog = nil
		}},
		{name: "kind backlog without backlog", edit: func(s *SessionStarted) { s.Pipeline.Backlog = nil }, wantErr: true},
		{name: "kind backlog with steps", edit: func(s *SessionStarted) {
			s.Pipeline.Steps = []Step{{Name: "s", Agent: AgentSpec{Backend: BackendExec}, MaxIterations: 1, TimeoutMs: 1}}
		}, wantErr: true},
		{name: "backlog without kind", edit: func(s *SessionStarted) { s.Pipeline.Kind = "" }, wantErr: true},
		{name: "backlog of kind pipeline", edit: func(s *SessionStarted) { s.Pipeline.Kind = KindPipeline }, wantErr: true},
		{name: "session backlog without backlog pipeline", edit: func(s *SessionStarted) {
			s.Pipeline = Pipeline{Name: "p", Steps: []Step{{Name: "s", Agent: AgentSpec{Backend: BackendExec}, MaxIterations: 1, TimeoutMs: 1}}}
		}, wantErr: true},
		{name: "unknown kind", edit: func(s *SessionStarted) { s.Pipeline.Kind = "loop" }, wantErr: true},
		{name: "tasks and import errors", edit: func(s *SessionStarted) {
			s.Backlog.ImportErrors = []ValidationError{{Pointer: "", Message: "m"}}
		}, wantErr: true},
		{name: "unknown schedule", edit: func(s *SessionStarted) { s.Pipeline.Backlog.Schedule = "random" }, wantErr: true},
		{name: "no schedule", edit: func(s *SessionStarted) { s.Pipeline.Backlog.Schedule = "" }, wantErr: true},
		{name: "max parallel 0", edit: func(s *SessionStarted) { s.Pipeline.Backlog.MaxParallel = 0 }, wantErr: true},
		{name: "max summary iterations 0", edit: func(s *SessionStarted) { s.Pipeline.Backlog.MaxSummaryIterations = 0 }, wantErr: true},
		{name: "negative timeout", edit: func(s *SessionStarted) { s.Pipeline.Backlog.TimeoutMs = -1 }, wantErr: true},
		{name: "no agents", edit: func(s *SessionStarted) { s.Pipeline.Backlog.Agents = nil }, wantErr: true},
		{name: "agent without backend", edit: func(s *SessionStarted) {
			s.Pipeline.Backlog.Agents["claude"] = AgentSpec{Model: "opus"}
		}, wantErr: true},
		{name: "agent name with a space", edit: func(s *SessionStarted) {
			s.Pipeline.Backlog.Agents["my agent"] = AgentSpec{Backend: BackendExec}
		}, wantErr: true},
		{name: "role naming a bad agent name", edit: func(s *SessionStarted) { s.Pipeline.Backlog.Roles[RoleRepair] = []string{"a/b"} }, wantErr: true},
		{name: "empty prompt", edit: func(s *SessionStarted) { s.Pipeline.Backlog.Prompts[RoleReview] = "" }, wantErr: true},
		{name: "unknown role", edit: func(s *SessionStarted) { s.Pipeline.Backlog.Roles["deploy"] = []string{"codex"} }, wantErr: true},
		{name: "no iterate role", edit: func(s *SessionStarted) { delete(s.Pipeline.Backlog.Roles, RoleIterate) }, wantErr: true},
		{name: "role without agents", edit: func(s *SessionStarted) { s.Pipeline.Backlog.Roles[RoleReview] = []string{} }, wantErr: true},
		{name: "prompt of unknown role", edit: func(s *SessionStarted) { s.Pipeline.Backlog.Prompts["deploy"] = "x" }, wantErr: true},
		{name: "empty validate argv", edit: func(s *SessionStarted) { s.Pipeline.Backlog.Validate = []string{} }, wantErr: false},
		{name: "bad task id", edit: func(s *SessionStarted) { s.Backlog.Tasks[0].ID = "T 1" }, wantErr: true},
		{name: "unknown task status", edit: func(s *SessionStarted) { s.Backlog.Tasks[0].Status = "wontfix" }, wantErr: true},
		{name: "task without title", edit: func(s *SessionStarted) { s.Backlog.Tasks[0].Title = "" }, wantErr: true},
		{name: "bad dependency id", edit: func(s *SessionStarted) { s.Backlog.Tasks[1].DependsOn = []string{"T/1"} }, wantErr: true},
		{name: "source with bad digest", edit: func(s *SessionStarted) { s.Backlog.Sources[0].Digest = "sha256:00" }, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			want := backlogSession(t)
			tt.edit(want)
			raw, err := c.Encode(TypeSessionStarted, want)
			if tt.wantErr {
				if !errors.Is(err, ErrInvalidData) {
					t.Fatalf("Encode error = %v, want %v", err, ErrInvalidData)
				}
				return
			}
			if err != nil {
				t.Fatalf("Encode: %v", err)
			}
			got, err := c.Decode(TypeSessionStarted, raw)
			if err != nil {
				t.Fatalf("Decode(%s): %v", raw, err)
			}
			// An empty slice of an omitempty member is omitted, so it comes
			// back nil.
			if want.Pipeline.Backlog != nil && len(want.Pipeline.Backlog.Validate) == 0 {
				want.Pipeline.Backlog.Validate = nil
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("round trip:\n got %#v\nwant %#v", got, want)
			}
		})
	}
}

func TestBacklogEventsDecode(t *testing.T) {
	c := newTestCatalogue(t)
	const task = `{"id":"T-1","title":"Scaffold","status":"todo"}`
	const hook = `"hook":"notify","eventId":"e1","eventType":"loopbus.step.completed","eventSeq":7,"runner":"hooks","durationMs":5`
	blockers := []string{}
	tests := []struct {
		name    string
		typ     string
		raw     string
		want    any
		wantErr error
	}{
		{name: "task added", typ: TypeTaskAdded, raw: `{"task":` + task + `,"by":"cli"}`,
			want: &TaskAdded{Task: Task{ID: "T-1", Title: "Scaffold", Status: TaskTodo}, By: "cli"}},
		{name: "task added with times", typ: TypeTaskAdded, raw: `{"task":{"id":"T-1","title":"t","status":"doing","created_at":"2026-11-20T09:30:00Z"},"by":"s1.T-0.1","reason":"follow-up"}`,
			want: &TaskAdded{Task: Task{ID: "T-1", Title: "t", Status: TaskDoing, CreatedAt: ptrTime(t, "2026-11-20T09:30:00Z")}, By: "s1.T-0.1", Reason: "follow-up"}},
		{name: "task added unknown status", typ: TypeTaskAdded, raw: `{"task":{"id":"T-1","title":"t","status":"wontfix"},"by":"cli"}`, wantErr: ErrInvalidData},
		{name: "task added bad id", typ: TypeTaskAdded, raw: `{"task":{"id":"T.1","title":"t","status":"todo"},"by":"cli"}`, wantErr: ErrInvalidData},
		{name: "task added id too long", typ: TypeTaskAdded, raw: `{"task":{"id":"` + strings.Repeat("t", 65) + `","title":"t","status":"todo"},"by":"cli"}`, wantErr: ErrInvalidData},
		{name: "task added without status", typ: TypeTaskAdded, raw: `{"task":{"id":"T-1","title":"t"},"by":"cli"}`, wantErr: ErrInvalidData},
		{name: "task added without by", typ: TypeTaskAdded, raw: `{"task":` + task + `}`, wantErr: ErrInvalidData},
		{name: "task added empty by", typ: TypeTaskAdded, raw: `{"task":` + task + `,"by":""}`, wantErr: ErrInvalidData},
		{name: "task added negative priority", typ: TypeTaskAdded, raw: `{"task":{"id":"T-1","title":"t","status":"todo","priority":-1},"by":"cli"}`, wantErr: ErrInvalidData},
		{name: "task added bad time", typ: TypeTaskAdded, raw: `{"task":{"id":"T-1","title":"t","status":"todo","created_at":"yesterday"},"by":"cli"}`, wantErr: ErrInvalidData},

		{name: "task updated status", typ: TypeTaskUpdated, raw: `{"id":"T-1","status":"done","by":"s1.T-1.1"}`,
			want: &TaskUpdated{ID: "T-1", Status: TaskDone, By: "s1.T-1.1"}},
		{name: "task updated clears blockers", typ: TypeTaskUpdated, raw: `{"id":"T-1","blockers":[],"by":"cli"}`,
			want: &TaskUpdated{ID: "T-1", Blockers: &blockers, By: "cli"}},
		{name: "task updated note", typ: TypeTaskUpdated, raw: `{"id":"T-1","note":"half done","files":["a.go"],"by":"cli"}`,
			want: &TaskUpdated{ID: "T-1", Note: "half done", Files: []string{"a.go"}, By: "cli"}},
		{name: "task updated changes nothing", typ: TypeTaskUpdated, raw: `{"id":"T-1","by":"cli","reason":"r"}`, wantErr: ErrInvalidData},
		{name: "task updated null blockers", typ: TypeTaskUpdated, raw: `{"id":"T-1","blockers":null,"by":"cli"}`, wantErr: ErrInvalidData},
		{name: "task updated unknown status", typ: TypeTaskUpdated, raw: `{"id":"T-1","status":"later","by":"cli"}`, wantErr: ErrInvalidData},
		{name: "task updated bad id", typ: TypeTaskUpdated, raw: `{"id":"","status":"done","by":"cli"}`, wantErr: ErrInvalidData},
		{name: "task updated without id", typ: TypeTaskUpdated, raw: `{"status":"done","by":"cli"}`, wantErr: ErrInvalidData},

		{name: "task selected", typ: TypeTaskSelected, raw: `{"id":"T-1","run":2,"agent":"codex"}`,
			want: &TaskSelected{ID: "T-1", Run: 2, Agent: "codex"}},
		{name: "task selected run 0", typ: TypeTaskSelected, raw: `{"id":"T-1","run":0,"agent":"codex"}`, wantErr: ErrInvalidData},
		{name: "task selected without agent", typ: TypeTaskSelected, raw: `{"id":"T-1","run":1}`, wantErr: ErrInvalidData},
		{name: "task selected bad agent name", typ: TypeTaskSelected, raw: `{"id":"T-1","run":1,"agent":"my agent"}`, wantErr: ErrInvalidData},
		{name: "task selected bad id", typ: TypeTaskSelected, raw: `{"id":"a b","run":1,"agent":"codex"}`, wantErr: ErrInvalidData},

		{name: "backlog phase", typ: TypeBacklogPhase, raw: `{"phase":"review","reason":"every task done","counts":{"done":4,"blocked":1}}`,
			want: &BacklogPhase{Phase: PhaseReview, Reason: "every task done", Counts: map[string]int{TaskDone: 4, TaskBlocked: 1}}},
		{name: "backlog phase unknown", typ: TypeBacklogPhase, raw: `{"phase":"deploy","reason":"r"}`, wantErr: ErrInvalidData},
		{name: "backlog phase without reason", typ: TypeBacklogPhase, raw: `{"phase":"done"}`, wantErr: ErrInvalidData},
		{name: "backlog phase count of unknown status", typ: TypeBacklogPhase, raw: `{"phase":"done","reason":"r","counts":{"wontfix":1}}`, wantErr: ErrInvalidData},
		{name: "backlog phase negative count", typ: TypeBacklogPhase, raw: `{"phase":"done","reason":"r","counts":{"todo":-1}}`, wantErr: ErrInvalidData},

		{name: "hook completed", typ: TypeHookCompleted, raw: `{` + hook + `,"exitCode":0}`,
			want: &HookRun{Hook: "notify", EventID: "e1", EventType: TypeStepCompleted, EventSeq: 7, Runner: "hooks", DurationMs: 5}},
		{name: "hook completed with exit code 1", typ: TypeHookCompleted, raw: `{` + hook + `,"exitCode":1}`, wantErr: ErrInvalidData},
		{name: "hook completed timed out", typ: TypeHookCompleted, raw: `{` + hook + `,"exitCode":0,"timedOut":true}`, wantErr: ErrInvalidData},
		{name: "hook failed", typ: TypeHookFailed, raw: `{` + hook + `,"exitCode":2,"error":"exit status 2","outputTail":"boom"}`,
			want: &HookRun{Hook: "notify", EventID: "e1", EventType: TypeStepCompleted, EventSeq: 7, Runner: "hooks", ExitCode: 2, DurationMs: 5, Error: "exit status 2", OutputTail: "boom"}},
		{name: "hook failed without exit code", typ: TypeHookFailed, raw: `{` + hook + `}`, wantErr: ErrInvalidData},
		{name: "hook failed bad event type", typ: TypeHookFailed, raw: `{"hook":"h","eventId":"e1","eventType":"step.completed","eventSeq":7,"runner":"r","exitCode":1,"durationMs":5}`, wantErr: ErrInvalidData},
		{name: "hook failed event seq 0", typ: TypeHookFailed, raw: `{"hook":"h","eventId":"e1","eventType":"loopbus.step.completed","eventSeq":0,"runner":"r","exitCode":1,"durationMs":5}`, wantErr: ErrInvalidData},
		{name: "hook failed empty hook", typ: TypeHookFailed, raw: `{"hook":"","eventId":"e1","eventType":"loopbus.step.completed","eventSeq":1,"runner":"r","exitCode":1,"durationMs":5}`, wantErr: ErrInvalidData},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := c.Decode(tt.typ, []byte(tt.raw))
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("Decode(%s) error = %v, want %v", tt.raw, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("Decode = %#v, want %#v", got, tt.want)
			}
		})
	}
}

func TestBacklogEventsEncodeErrors(t *testing.T) {
	c := newTestCatalogue(t)
	var nilBlockers []string
	tests := []struct {
		name string
		typ  string
		data any
	}{
		// A pointer to a nil slice encodes as null, which decodes as "no
		// change": the schema refuses it so the writer's intent is not lost.
		{"blockers pointing at nil", TypeTaskUpdated, &TaskUpdated{ID: "T-1", Blockers: &nilBlockers, By: "cli"}},
		{"task without title", TypeTaskAdded, &TaskAdded{Task: Task{ID: "T-1", Status: TaskTodo}, By: "cli"}},
		{"task without status", TypeTaskAdded, &TaskAdded{Task: Task{ID: "T-1", Title: "t"}, By: "cli"}},
		{"zero task selected", TypeTaskSelected, &TaskSelected{}},
		{"phase without phase", TypeBacklogPhase, &BacklogPhase{Reason: "r"}},
		{"hook run without event", TypeHookFailed, &HookRun{Hook: "h", Runner: "r", ExitCode: 1}},
		{"report on a failed verdict", TypeValidationFailed, &Verdict{
			JobID: "j", Step: "s", Iteration: 1,
			Errors:  []ValidationError{{Pointer: "", Message: "m"}},
			Reports: []Report{{Name: "r.json", Content: json.RawMessage(`{}`)}},
		}},
		{"report with a path for a name", TypeValidationPassed, &Verdict{
			JobID: "j", Step: "s", Iteration: 1, Reports: []Report{{Name: "../r.json", Content: json.RawMessage(`{}`)}},
		}},
		{"report content not JSON", TypeValidationPassed, &Verdict{
			JobID: "j", Step: "s", Iteration: 1, Reports: []Report{{Name: "r.json", Content: json.RawMessage(`{`)}},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			raw, err := c.Encode(tt.typ, tt.data)
			if !errors.Is(err, ErrInvalidData) {
				t.Fatalf("Encode = %s, %v, want %v", raw, err, ErrInvalidData)
			}
		})
	}
}

// TestReportContentRoundTrip checks that any JSON value is carried as a
// report's content, compacted.
func TestReportContentRoundTrip(t *testing.T) {
	c := newTestCatalogue(t)
	tests := []struct {
		name    string
		content string
		want    string
	}{
		{"object", `{"verdict": "pass", "score": 0.9}`, `{"verdict":"pass","score":0.9}`},
		{"array", "[1,\n 2]", `[1,2]`},
		{"string", `"ok"`, `"ok"`},
		{"null", `null`, `null`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := &Verdict{JobID: "j", Step: "s", Iteration: 1, Reports: []Report{{Name: "r.json", Content: json.RawMessage(tt.content)}}}
			raw, err := c.Encode(TypeValidationPassed, v)
			if err != nil {
				t.Fatalf("Encode: %v", err)
			}
			got, err := c.Decode(TypeValidationPassed, raw)
			if err != nil {
				t.Fatalf("Decode(%s): %v", raw, err)
			}
			r := got.(*Verdict).Reports
			if len(r) != 1 || r[0].Name != "r.json" || string(r[0].Content) != tt.want {
				t.Errorf("reports = %+v, want r.json %s", r, tt.want)
			}
		})
	}
}

func ptrTime(t testing.TB, s string) *time.Time {
	t.Helper()
	tm, err := time.Parse(time.RFC3339, s)
	if err != nil {
		t.Fatal(err)
	}
	return &tm
}
