package schemas

import (
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"reflect"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"
)

// newTestCatalogue returns a compiled catalogue or stops the test.
func newTestCatalogue(t *testing.T) *Catalogue {
	t.Helper()
	c, err := NewCatalogue()
	if err != nil {
		t.Fatalf("NewCatalogue: %v", err)
	}
	return c
}

// testArtifact returns a reference to an artifact holding content, as the
// agent worker would store it for step (empty for the session input).
func testArtifact(t testing.TB, name, step, content string) ArtifactRef {
	t.Helper()
	if err := ValidateName(name); err != nil {
		t.Fatalf("test artifact: %v", err)
	}
	obj := "sess-1/input/" + name
	if step != "" {
		obj = "sess-1/" + step + "/" + name
	}
	return ArtifactRef{
		Name:        name,
		Object:      obj,
		Digest:      Digest([]byte(content)),
		Size:        int64(len(content)),
		ContentType: "application/json",
		Step:        step,
	}
}

// samples returns a realistic value of the registered Go type of every event
// type, with optional fields both set and unset somewhere.
func samples(t testing.TB) map[string]any {
	t.Helper()
	input := testArtifact(t, "brief.md", "", "# Write a report about otters\n")
	input.ContentType = "text/markdown"
	outline := testArtifact(t, "outline.json", "outline", `{"title":"Otters","sections":["habitat","diet"]}`)
	draft := testArtifact(t, "draft.json", "draft", `{"title":"Otters","body":"..."}`)
	notes := testArtifact(t, "notes.txt", "draft", "sources: ...")
	notes.ContentType = ""
	agent := AgentSpec{
		Backend: "exec",
		Command: []string{"./agents/write.sh", "--model", "small"},
		Env:     map[string]string{"LOOPBUS_MODE": "test"},
	}
	cachedPrice := 0.1
	apiAgent := AgentSpec{
		Backend: BackendOpenAI, Model: "gpt-4.1-mini", BaseURL: "http://127.0.0.1:8000/v1", APIKeyEnv: "LOCAL_KEY",
		Tools: []string{"read_file", "write_file", "run"}, MaxTurns: 40, MaxTokens: 8192,
		Price:       &Price{InputPerMTok: 0.4, OutputPerMTok: 1.6, CachedInputPerMTok: &cachedPrice},
		RetryWaitMs: 30000, NoStream: true, SecretEnv: []string{"LOCAL_KEY"},
	}
	outlineSchema := json.RawMessage(`{"$schema":"https://json-schema.org/draft/2020-12/schema","type":"object","required":["title","sections"],"properties":{"title":{"type":"string"},"sections":{"type":"array","items":{"type":"string"}}}}`)
	created := time.Date(2026, 11, 20, 9, 30, 0, 0, time.UTC)
	outlineErrors := []ValidationError{
		{Artifact: "outline.json", Pointer: "/sections/1", Message: "got number, want string", Source: "schema"},
		{Artifact: "outline.json", Pointer: "", Message: "missing property 'title'", Source: "schema"},
	}
	m := map[string]any{
		TypeSessionStarted: &SessionStarted{
			Pipeline: Pipeline{
				Name:   "report",
				Source: "pipelines/report.yaml",
				Dir:    "/home/user/pipelines",
				Steps: []Step{
					{
						Name:          "outline",
						Agent:         agent,
						Prompt:        "Outline a report from {{input}}.",
						Outputs:       []Output{{Name: "outline.json", SchemaPath: "schemas/outline.json", Schema: outlineSchema, SchemaVersion: "outline-1"}},
						Validate:      []string{"./check-outline.sh"},
						MaxIterations: 3,
						TimeoutMs:     600000,
						Line:          4,
					},
					{
						Name:              "draft",
						Agent:             apiAgent,
						Prompt:            "Write the report.",
						Requires:          []string{"outline"},
						Outputs:           []Output{{Name: "draft.json", Schema: json.RawMessage(`true`), Report: true}, {Name: "notes.txt"}},
						MaxIterations:     1,
						TimeoutMs:         300000,
						ValidateTimeoutMs: 30000,
						Final:             true,
						Line:              17,
					},
				},
			},
			Input:      input,
			SourceHash: ShortHash(input.Digest),
			Import:     &ImportStart{Source: ImportSourceLooplia, ManifestSourceHash: ShortHash(input.Digest)},
		},
		TypeSessionCompleted: &SessionCompleted{Final: []ArtifactRef{draft, notes}},
		TypeSessionFailed:    &SessionFailed{Step: "outline", Reason: "step outline used up its 3 iterations"},
		TypeJobRequested: &JobRequested{
			JobID:     DeterministicID("sess-1", TypeJobRequested, "outline", "2"),
			Step:      "outline",
			Iteration: 2,
			Attempt:   1,
			Agent:     apiAgent,
			Prompt:    "Outline a report from brief.md.",
			Inputs:    []ArtifactRef{input},
			Outputs:   []Output{{Name: "outline.json", SchemaPath: "schemas/outline.json", Schema: outlineSchema, SchemaVersion: SchemaVersionOf(outlineSchema)}},
			Validate:  []string{"/home/user/pipelines/check-outline.sh", "outline.json"},
			TimeoutMs: 600000,
			// ValidateTimeoutMs left unset: optional.
			Dir: "/home/user/pipelines",
			Feedback: []Feedback{
				{Iteration: 1, Kind: "validation", Errors: outlineErrors, Message: "outline.json fails its schema", RetryHint: "Give every section as a string."},
				{Iteration: 1, Kind: "job", Message: "agent exited 1"},
			},
		},
		TypeJobStarted:   &JobStarted{JobID: "job-1", Worker: "worker-a", Delivery: 2, LeaseMs: 30000},
		TypeJobHeartbeat: &JobHeartbeat{JobID: "job-1", Worker: "worker-a", Delivery: 2},
		TypeJobReleased:  &JobReleased{JobID: "job-1", Worker: "worker-a", Delivery: 2, Reason: "the worker is shutting down"},
		TypeJobCompleted: &JobCompleted{
			JobID:      "job-1",
			Step:       "outline",
			Iteration:  2,
			RequestSeq: 41,
			Worker:     "worker-a",
			ExitCode:   0,
			DurationMs: 12345,
			Artifacts:  []ArtifactRef{outline},
			OutputTail: "wrote outline.json\n",
			Usage:      &Usage{InputTokens: 1200, CachedTokens: 800, OutputTokens: 340, CostUSD: 0.0042},
		},
		TypeJobFailed: &JobFailed{
			JobID:      "job-2",
			Step:       "draft",
			Iteration:  1,
			Worker:     "worker-b",
			ExitCode:   -1,
			DurationMs: 300000,
			Error:      "timed out after 5m0s",
			Retryable:  true,
			// Usage nil: omitted.
		},
		TypeToolStarted:   &ToolStarted{JobID: "job-1", ToolID: "job-1.0", Name: "exec", Lane: "agent", Input: "./agents/write.sh --model small"},
		TypeToolCompleted: &ToolCompleted{JobID: "job-1", ToolID: "job-1.0", Name: "exec", Status: "error", ExitCode: 2, DurationMs: 75, Output: "usage: ...", Error: "exit status 2"},
		TypeAgentMessage:  &AgentMessage{JobID: "job-1", Text: "I will run the tests first."},
		TypeArtifactStored: &ArtifactStored{
			JobID:    "job-1",
			Artifact: outline,
		},
		TypeValidationPassed: &Verdict{
			JobID: "job-3", Step: "draft", Iteration: 1, Artifacts: []ArtifactRef{draft, notes},
			Reports: []Report{{Name: "draft.json", Content: json.RawMessage(`{"title":"Otters","body":"..."}`)}},
		},
		TypeValidationFailed: &Verdict{
			JobID:     "job-1",
			Step:      "outline",
			Iteration: 1,
			Artifacts: []ArtifactRef{outline},
			Errors: append(outlineErrors, ValidationError{
				Pointer: "", Message: "check-outline.sh: too few sections", Source: "command",
			}),
			RetryHint: "Give every section as a string.",
		},
		TypeStepCompleted: &StepCompleted{
			Step:          "draft",
			JobID:         "job-3",
			Iterations:    1,
			Artifacts:     []ArtifactRef{draft, notes},
			ContentHash:   ContentHash([]ArtifactRef{draft, notes}),
			SchemaVersion: "sha256:0123456789ab",
		},
		TypeStepFailed:         &StepFailed{Step: "outline", Iterations: 3, Error: "validation failed 3 times"},
		TypeSignalStop:         &Signal{Target: "sess-1", Reason: "wrong brief"},
		TypeSignalPause:        &Signal{Target: "all"},
		TypeSignalResume:       &Signal{Target: "sess-1/outline", Step: "outline"},
		TypeSignalInfo:         &Signal{Target: "sess-1/outline", Step: "outline", Message: "Sections are strings, not objects."},
		TypeSignalInvalidate:   &Signal{Target: "sess-1/outline", Step: "outline", Reason: "brief changed"},
		TypeSignalAcknowledged: &SignalAcknowledged{SignalID: "sig-1", Signal: "stop", Result: SignalApplied, Detail: "cancelled job sess-1.outline.2"},
		TypeJobCancelled:       &JobCancelled{JobID: "sess-1.outline.2", Step: "outline", Iteration: 2, Reason: "stop signal: wrong brief"},
		TypeStepWaiting:        &StepWaiting{Step: "outline", JobID: "sess-1.outline.2", Until: time.Date(2026, 11, 22, 15, 0, 0, 0, time.UTC), Reason: "usage limit"},
		TypeStepPaused:         &StepPaused{Step: "outline", Kind: PauseBreaker, Reason: "3 iterations without progress"},
		TypeStepResumed:        &StepResumed{Step: "outline"},
		TypeStepInvalidated:    &StepInvalidated{Step: "draft", Cause: "outline", Reason: "brief changed"},
		TypeSessionPaused:      &SessionPaused{},
		TypeSessionStopped:     &SessionStopped{Kind: StopBudget, Reason: "cost $0.52 reached max_cost_usd $0.50"},
		TypeSessionResumed:     &SessionResumed{Reason: "budget raised"},
		TypeTaskAdded: &TaskAdded{
			Task: Task{
				ID: "T-2", Title: "Parse the config file", Description: "Read loopbus.yaml.", Reference: "DESIGN.md#config",
				Priority: 1, Status: TaskTodo, Details: "Use yaml.v3.", Steps: []string{"write the parser", "test it"},
				Tags: []string{"config"}, Files: []string{"internal/config/config.go"}, DependsOn: []string{"T-1"},
				Notes: []string{"imported"}, CreatedAt: &created, UpdatedAt: &created,
			},
			By:     "import",
			Reason: "to-do.json",
		},
		TypeTaskUpdated:  &TaskUpdated{ID: "T-2", Status: TaskBlocked, Blockers: &[]string{"needs the schema of loopbus.yaml"}, Files: []string{"internal/config/config.go"}, Note: "parser written", By: "sess-1.T-2.1", Reason: "summary of run 1"},
		TypeTaskSelected: &TaskSelected{ID: "T-2", Run: 1, Agent: "claude", Reason: "todo, priority 1, dependencies done"},
		TypeBacklogPhase: &BacklogPhase{Phase: PhaseIterate, Reason: "task file imported", Counts: map[string]int{TaskTodo: 2, TaskDone: 1}},
		TypeHookCompleted: &HookRun{
			Hook: "notify", EventID: "ev-1", EventType: TypeStepCompleted, EventSeq: 42, Runner: "hooks-default",
			ExitCode: 0, DurationMs: 120, OutputTail: "sent\n",
		},
		TypeHookFailed: &HookRun{
			Hook: "notify", EventID: "ev-2", EventType: TypeSessionFailed, EventSeq: 57, Runner: "hooks-default",
			ExitCode: -1, DurationMs: 10000, TimedOut: true, Error: "timed out after 10s",
		},
		TypeLoopSpawned: &LoopSpawned{
			Loop: "root-2", Parent: "root", Level: "feature", Index: 2,
			Input: "## Search\nAdd a search box.\n", InputName: "plan.md", InputDigest: Digest([]byte("## Search\nAdd a search box.\n")),
			Title: "## Search", Generation: 1,
		},
		TypeLoopMerged: &LoopMerged{
			Loop: "root-2", JobID: "sess-1.root-2.merge.1",
			Head: strings.Repeat("b", 40), Previous: strings.Repeat("a", 40),
			Bundle: testArtifact(t, "root-2.bundle", "root-2", "bundle"), Position: 1,
		},
		TypeLoopRebase:      &LoopRebase{Loop: "root-1", Head: strings.Repeat("b", 40), Cause: "root-2", Conflict: []string{"README.md"}, Reason: "root-2 was merged first"},
		TypeLoopInvalidated: &LoopInvalidated{Loop: "root-1", Cause: "root", Reason: "root iterated again"},

		TypeSessionBudget: &SessionBudget{Budget: Budget{MaxCostUSD: 5, MaxIterations: 40}, Reason: "worth another $3"},
		TypeSessionClosed: &SessionClosed{Reason: "superseded by sess-2"},
		TypeSessionRerun:  &SessionRerun{Step: "outline", Reason: "agent fixed"},
		TypeSessionForked: nil, // below: the pipeline of session.started

		TypeStepImported: &StepImported{Step: "outline", Artifacts: []ArtifactRef{outline}, ContentHash: ContentHash([]ArtifactRef{outline}),
			SchemaVersion: "outline-1", Source: ImportSourceLooplia, SourceStep: "analyzing", SourceSchemaVersion: "0.5.0", CompletedAt: &created},

		TypeSignalApprove: &Signal{Target: "sess-1/outline", Step: "outline", Reason: "looks good", By: "alice"},
		TypeSignalReject:  &Signal{Target: "sess-1/outline", Step: "outline", Reason: "too long", By: "bob"},
		TypeApprovalRequested: &ApprovalRequested{Step: "outline", JobID: "sess-1.outline.2", Iteration: 2, Artifacts: []ArtifactRef{outline},
			Until: ptrTime(t, "2026-11-22T15:00:00Z"), OnTimeout: OnTimeoutReject},
		TypeApprovalExpired: &ApprovalExpired{Step: "outline", JobID: "sess-1.outline.2", Iteration: 2, OnTimeout: OnTimeoutFail, Reason: "no approval within 24h0m0s"},
	}
	st := m[TypeSessionStarted].(*SessionStarted)
	m[TypeSessionForked] = &SessionForked{Origin: "sess-1", Seq: 42, Event: "9f86d081884c7d659a2feaa0c55ad015", Copied: 12, Pipeline: st.Pipeline, Input: st.Input,
		SourceHash: st.SourceHash, Budget: &Budget{MaxCostUSD: 2}, DefinitionFiles: st.DefinitionFiles, Changed: []string{"outline"}, Reason: "try another outline"}
	return m
}

func TestNewCatalogue(t *testing.T) {
	c := newTestCatalogue(t)
	var want []string
	for typ := range catalogueEntries() {
		want = append(want, typ)
	}
	sort.Strings(want)
	if got := c.Types(); !reflect.DeepEqual(got, want) {
		t.Errorf("Types() = %v, want %v", got, want)
	}
	if len(want) != 50 {
		t.Errorf("catalogue has %d types, want 50", len(want))
	}
	for _, typ := range want {
		if !c.Known(typ) {
			t.Errorf("Known(%q) = false", typ)
		}
	}
	if c.Known("loopbus.session.frozen") {
		t.Error(`Known("loopbus.session.frozen") = true`)
	}
}

func TestCatalogueRoundTrip(t *testing.T) {
	c := newTestCatalogue(t)
	all := samples(t)
	for _, typ := range c.Types() {
		t.Run(typ, func(t *testing.T) {
			want, ok := all[typ]
			if !ok {
				t.Fatalf("no sample for %s", typ)
			}
			raw, err := c.Encode(typ, want)
			if err != nil {
				t.Fatalf("Encode: %v", err)
			}
			got, err := c.Decode(typ, raw)
			if err != nil {
				t.Fatalf("Decode(%s): %v", raw, err)
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("round trip:\n got %#v\nwant %#v", got, want)
			}
		})
	}
}

// TestCatalogueNilSlices checks that the zero-length slices of non-omitempty
// fields, which encoding/json writes as null, pass their schemas.
func TestCatalogueNilSlices(t *testing.T) {
	c := newTestCatalogue(t)
	tests := []struct {
		name string
		typ  string
		data any
		want string
	}{
		{"session.completed without final", TypeSessionCompleted, &SessionCompleted{}, `{"final":null}`},
		{"job.completed without artifacts", TypeJobCompleted, &JobCompleted{JobID: "j", Step: "s", Iteration: 1, Worker: "w"},
			`{"jobId":"j","step":"s","iteration":1,"requestSeq":0,"worker":"w","exitCode":0,"durationMs":0,"artifacts":null}`},
		{"usage all zero", TypeJobFailed, &JobFailed{JobID: "j", Step: "s", Iteration: 1, Worker: "w", ExitCode: 1, Error: "e", Usage: &Usage{}},
			`{"jobId":"j","step":"s","iteration":1,"worker":"w","exitCode":1,"durationMs":0,"error":"e","usage":{}}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			raw, err := c.Encode(tt.typ, tt.data)
			if err != nil {
				t.Fatalf("Encode: %v", err)
			}
			if string(raw) != tt.want {
				t.Errorf("Encode = %s, want %s", raw, tt.want)
			}
		})
	}
}

func TestCatalogueDecode(t *testing.T) {
	c := newTestCatalogue(t)
	const digest = "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
	const verdict = `{"jobId":"j","step":"s","iteration":1,"artifacts":[{"name":"a.json","object":"o","digest":"` + digest + `","size":0}]}`
	tests := []struct {
		name    string
		typ     string
		raw     string
		want    any
		wantErr error
	}{
		{
			name: "valid",
			typ:  TypeJobStarted,
			raw:  `{"jobId":"j","worker":"w","delivery":1}`,
			want: &JobStarted{JobID: "j", Worker: "w", Delivery: 1},
		},
		{
			name: "unknown members are allowed",
			typ:  TypeStepFailed,
			raw:  `{"step":"s","iterations":0,"error":"cannot run","addedInV1_1":{"x":1}}`,
			want: &StepFailed{Step: "s", Iterations: 0, Error: "cannot run"},
		},
		{
			name: "verdict with artifact",
			typ:  TypeValidationPassed,
			raw:  verdict,
			want: &Verdict{JobID: "j", Step: "s", Iteration: 1, Artifacts: []ArtifactRef{{Name: "a.json", Object: "o", Digest: digest}}},
		},
		{
			name: "model-API agent",
			typ:  TypeJobRequested,
			raw:  `{"jobId":"j","step":"s","iteration":1,"attempt":0,"agent":{"backend":"anthropic","model":"m","baseUrl":"https://[::1]:8443","apiKeyEnv":"K","tools":["run"],"maxTurns":3,"maxTokens":100,"price":{"inputPerMTok":0,"outputPerMTok":15},"retryWaitMs":1000,"noStream":true},"prompt":"p","inputs":[],"timeoutMs":1}`,
			want: &JobRequested{
				JobID: "j", Step: "s", Iteration: 1, Prompt: "p", Inputs: []ArtifactRef{}, TimeoutMs: 1,
				Agent: AgentSpec{
					Backend: "anthropic", Model: "m", BaseURL: "https://[::1]:8443", APIKeyEnv: "K", Tools: []string{"run"},
					MaxTurns: 3, MaxTokens: 100, Price: &Price{OutputPerMTok: 15}, RetryWaitMs: 1000, NoStream: true,
				},
			},
		},
		{
			name: "usage with cached tokens",
			typ:  TypeJobFailed,
			raw:  `{"jobId":"j","step":"s","iteration":1,"worker":"w","exitCode":1,"durationMs":1,"error":"e","usage":{"inputTokens":10,"cachedTokens":5}}`,
			want: &JobFailed{JobID: "j", Step: "s", Iteration: 1, Worker: "w", ExitCode: 1, DurationMs: 1, Error: "e", Usage: &Usage{InputTokens: 10, CachedTokens: 5}},
		},
		{name: "missing required field", typ: TypeJobStarted, raw: `{"jobId":"j","delivery":1}`, wantErr: ErrInvalidData},
		{name: "missing required array", typ: TypeSessionCompleted, raw: `{}`, wantErr: ErrInvalidData},
		{name: "missing required nested field", typ: TypeArtifactStored, raw: `{"jobId":"j","artifact":{"name":"a.json","object":"o","size":1}}`, wantErr: ErrInvalidData},
		{name: "wrong type", typ: TypeJobStarted, raw: `{"jobId":"j","worker":"w","delivery":"1"}`, wantErr: ErrInvalidData},
		{name: "wrong type of data", typ: TypeJobStarted, raw: `["j","w",1]`, wantErr: ErrInvalidData},
		{name: "null data", typ: TypeSessionFailed, raw: `null`, wantErr: ErrInvalidData},
		{name: "empty id", typ: TypeJobStarted, raw: `{"jobId":"","worker":"w","delivery":1}`, wantErr: ErrInvalidData},
		{name: "bad digest uppercase", typ: TypeArtifactStored, raw: `{"jobId":"j","artifact":{"name":"a.json","object":"o","digest":"` + strings.ToUpper(digest) + `","size":1}}`, wantErr: ErrInvalidData},
		{name: "bad digest short", typ: TypeArtifactStored, raw: `{"jobId":"j","artifact":{"name":"a.json","object":"o","digest":"sha256:abc","size":1}}`, wantErr: ErrInvalidData},
		{name: "bad digest algorithm", typ: TypeArtifactStored, raw: `{"jobId":"j","artifact":{"name":"a.json","object":"o","digest":"md5:` + digest[7:] + `","size":1}}`, wantErr: ErrInvalidData},
		{name: "negative size", typ: TypeArtifactStored, raw: `{"jobId":"j","artifact":{"name":"a.json","object":"o","digest":"` + digest + `","size":-1}}`, wantErr: ErrInvalidData},
		{name: "artifact name is a path", typ: TypeArtifactStored, raw: `{"jobId":"j","artifact":{"name":"../a.json","object":"o","digest":"` + digest + `","size":1}}`, wantErr: ErrInvalidData},
		{name: "artifact name dot dot", typ: TypeArtifactStored, raw: `{"jobId":"j","artifact":{"name":"..","object":"o","digest":"` + digest + `","size":1}}`, wantErr: ErrInvalidData},
		{name: "iteration 0", typ: TypeValidationFailed, raw: strings.Replace(verdict, `"iteration":1`, `"iteration":0`, 1), wantErr: ErrInvalidData},
		{name: "fractional iteration", typ: TypeValidationFailed, raw: strings.Replace(verdict, `"iteration":1`, `"iteration":1.5`, 1), wantErr: ErrInvalidData},
		{name: "step name with dot", typ: TypeStepFailed, raw: `{"step":"a.b","iterations":1,"error":"e"}`, wantErr: ErrInvalidData},
		{name: "step name too long", typ: TypeStepFailed, raw: `{"step":"` + strings.Repeat("s", 65) + `","iterations":1,"error":"e"}`, wantErr: ErrInvalidData},
		{name: "bad tool status", typ: TypeToolCompleted, raw: `{"jobId":"j","toolId":"t","name":"exec","status":"killed","exitCode":0,"durationMs":1}`, wantErr: ErrInvalidData},
		{name: "negative duration", typ: TypeToolCompleted, raw: `{"jobId":"j","toolId":"t","name":"exec","status":"ok","exitCode":0,"durationMs":-1}`, wantErr: ErrInvalidData},
		{name: "bad feedback kind", typ: TypeJobRequested, raw: `{"jobId":"j","step":"s","iteration":2,"attempt":0,"agent":{"backend":"exec"},"prompt":"p","inputs":[],"timeoutMs":1,"feedback":[{"iteration":1,"kind":"timeout"}]}`, wantErr: ErrInvalidData},
		{name: "bad validation error source", typ: TypeValidationFailed, raw: strings.Replace(verdict, `}]}`, `}],"errors":[{"pointer":"","message":"m","source":"agent"}]}`, 1), wantErr: ErrInvalidData},
		{name: "output schema is a string", typ: TypeJobRequested, raw: `{"jobId":"j","step":"s","iteration":1,"attempt":0,"agent":{"backend":"exec"},"prompt":"p","inputs":[],"timeoutMs":1,"outputs":[{"name":"o.json","schema":"{}"}]}`, wantErr: ErrInvalidData},
		{name: "unknown model tool", typ: TypeJobRequested, raw: `{"jobId":"j","step":"s","iteration":1,"attempt":0,"agent":{"backend":"openai","model":"m","tools":["bash"]},"prompt":"p","inputs":[],"timeoutMs":1}`, wantErr: ErrInvalidData},
		{name: "price without output", typ: TypeJobRequested, raw: `{"jobId":"j","step":"s","iteration":1,"attempt":0,"agent":{"backend":"openai","model":"m","price":{"inputPerMTok":1}},"prompt":"p","inputs":[],"timeoutMs":1}`, wantErr: ErrInvalidData},
		{name: "negative price", typ: TypeJobRequested, raw: `{"jobId":"j","step":"s","iteration":1,"attempt":0,"agent":{"backend":"openai","model":"m","price":{"inputPerMTok":1,"outputPerMTok":-1}},"prompt":"p","inputs":[],"timeoutMs":1}`, wantErr: ErrInvalidData},
		{name: "base URL with credentials", typ: TypeJobRequested, raw: `{"jobId":"j","step":"s","iteration":1,"attempt":0,"agent":{"backend":"openai","model":"m","baseUrl":"https://k:s@example.com/v1"},"prompt":"p","inputs":[],"timeoutMs":1}`, wantErr: ErrInvalidData},
		{name: "base URL not http", typ: TypeJobRequested, raw: `{"jobId":"j","step":"s","iteration":1,"attempt":0,"agent":{"backend":"openai","model":"m","baseUrl":"ftp://example.com"},"prompt":"p","inputs":[],"timeoutMs":1}`, wantErr: ErrInvalidData},
		{name: "API key variable of loopbus", typ: TypeJobRequested, raw: `{"jobId":"j","step":"s","iteration":1,"attempt":0,"agent":{"backend":"anthropic","model":"m","apiKeyEnv":"LOOPBUS_KEY"},"prompt":"p","inputs":[],"timeoutMs":1}`, wantErr: ErrInvalidData},
		{name: "negative cached tokens", typ: TypeJobFailed, raw: `{"jobId":"j","step":"s","iteration":1,"worker":"w","exitCode":1,"durationMs":1,"error":"e","usage":{"cachedTokens":-1}}`, wantErr: ErrInvalidData},
		{name: "bad content hash", typ: TypeStepCompleted, raw: `{"step":"s","jobId":"j","iterations":1,"artifacts":[],"contentHash":"xyz"}`, wantErr: ErrInvalidData},
		{name: "not JSON", typ: TypeJobStarted, raw: `{"jobId":`, wantErr: ErrInvalidData},
		{name: "not JSON at all", typ: TypeJobStarted, raw: "\xff\xfe", wantErr: ErrInvalidData},
		{name: "empty", typ: TypeJobStarted, raw: ``, wantErr: ErrInvalidData},
		{name: "trailing data", typ: TypeJobStarted, raw: `{"jobId":"j","worker":"w","delivery":1} {}`, wantErr: ErrInvalidData},
		{name: "unknown type", typ: "loopbus.session.frozen", raw: `{}`, wantErr: ErrUnknownType},
		{name: "malformed type", typ: "session.started", raw: `{}`, wantErr: ErrUnknownType},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := c.Decode(tt.typ, []byte(tt.raw))
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("Decode(%s) error = %v, want %v", tt.raw, err, tt.wantErr)
				}
				if got != nil {
					t.Errorf("Decode returned %#v with an error", got)
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

func TestCatalogueEncodeErrors(t *testing.T) {
	c := newTestCatalogue(t)
	tests := []struct {
		name    string
		typ     string
		data    any
		wantErr error
	}{
		{"value instead of pointer", TypeJobStarted, JobStarted{JobID: "j", Worker: "w", Delivery: 1}, ErrInvalidData},
		{"other event's type", TypeJobStarted, &JobCompleted{JobID: "j"}, ErrInvalidData},
		{"map", TypeJobStarted, map[string]any{"jobId": "j", "worker": "w", "delivery": 1}, ErrInvalidData},
		{"nil", TypeJobStarted, nil, ErrInvalidData},
		{"nil pointer", TypeJobStarted, (*JobStarted)(nil), ErrInvalidData},
		{"fails schema", TypeJobStarted, &JobStarted{JobID: "j", Delivery: 1}, ErrInvalidData},
		{"bad digest", TypeArtifactStored, &ArtifactStored{JobID: "j", Artifact: ArtifactRef{Name: "a", Object: "o", Digest: "sha256:1234", Size: 4}}, ErrInvalidData},
		{"iteration 0", TypeStepCompleted, &StepCompleted{Step: "s", JobID: "j", Iterations: 0, ContentHash: "0123456789abcdef"}, ErrInvalidData},
		{"max iterations 0", TypeSessionStarted, &SessionStarted{
			Pipeline:   Pipeline{Name: "p", Steps: []Step{{Name: "s", Agent: AgentSpec{Backend: "exec"}, TimeoutMs: 1}}},
			Input:      ArtifactRef{Name: "in.txt", Object: "o", Digest: Digest(nil)},
			SourceHash: ShortHash(Digest(nil)),
		}, ErrInvalidData},
		{"unmarshalable output schema", TypeJobRequested, &JobRequested{Outputs: []Output{{Name: "o", Schema: json.RawMessage(`{`)}}}, ErrInvalidData},
		{"unknown type", "loopbus.job.paused", &JobStarted{}, ErrUnknownType},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			raw, err := c.Encode(tt.typ, tt.data)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("Encode error = %v, want %v", err, tt.wantErr)
			}
			if raw != nil {
				t.Errorf("Encode returned %s with an error", raw)
			}
		})
	}
}

// TestCatalogueConcurrent uses one catalogue from many goroutines (run with
// -race).
func TestCatalogueConcurrent(t *testing.T) {
	c := newTestCatalogue(t)
	all := samples(t)
	var wg sync.WaitGroup
	errs := make(chan error, 8*len(all))
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for typ, data := range all {
				raw, err := c.Encode(typ, data)
				if err == nil {
					_, err = c.Decode(typ, raw)
				}
				if err != nil {
					errs <- err
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// readSchemaFile parses the embedded schema of typ.
func readSchemaFile(t *testing.T, typ string) map[string]any {
	t.Helper()
	raw, err := SchemaFile(typ)
	if err != nil {
		t.Fatalf("SchemaFile(%s): %v", typ, err)
	}
	var doc map[string]any
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatalf("schema of %s: %v", typ, err)
	}
	return doc
}

func TestSchemaFiles(t *testing.T) {
	for typ := range catalogueEntries() {
		t.Run(typ, func(t *testing.T) {
			doc := readSchemaFile(t, typ)
			want := map[string]string{
				"$schema": "https://json-schema.org/draft/2020-12/schema",
				"$id":     DataSchemaURI(typ),
				"title":   typ,
			}
			for k, v := range want {
				if doc[k] != v {
					t.Errorf("%s = %v, want %q", k, doc[k], v)
				}
			}
			if d, _ := doc["description"].(string); !strings.Contains(d, "Emitted by") {
				t.Errorf("description %q does not say who emits the event", d)
			}
			for _, r := range refs(doc) {
				if !strings.HasPrefix(r, "#/$defs/") {
					t.Errorf("$ref %q is not local: schema files must be self-contained", r)
				}
			}
		})
	}
}

// refs returns every $ref value in a JSON document.
func refs(v any) []string {
	var out []string
	switch v := v.(type) {
	case map[string]any:
		for k, e := range v {
			if s, ok := e.(string); ok && k == "$ref" {
				out = append(out, s)
				continue
			}
			out = append(out, refs(e)...)
		}
	case []any:
		for _, e := range v {
			out = append(out, refs(e)...)
		}
	}
	return out
}

// TestSchemaFilesRequired checks each file's top-level required list against
// the json tags of the Go type: exactly the fields without omitempty.
func TestSchemaFilesRequired(t *testing.T) {
	for typ, e := range catalogueEntries() {
		t.Run(typ, func(t *testing.T) {
			doc := readSchemaFile(t, typ)
			var got []string
			if req, ok := doc["required"].([]any); ok {
				for _, r := range req {
					got = append(got, r.(string))
				}
			}
			props, _ := doc["properties"].(map[string]any)
			var want, all []string
			rt := reflect.TypeOf(e.newData()).Elem()
			for i := range rt.NumField() {
				f := rt.Field(i)
				name, opts, _ := strings.Cut(f.Tag.Get("json"), ",")
				all = append(all, name)
				if !strings.Contains(","+opts+",", ",omitempty,") {
					want = append(want, name)
				}
			}
			sort.Strings(got)
			sort.Strings(want)
			if !reflect.DeepEqual(got, want) {
				t.Errorf("required = %v, want %v", got, want)
			}
			var gotProps []string
			for p := range props {
				gotProps = append(gotProps, p)
			}
			sort.Strings(gotProps)
			sort.Strings(all)
			if !reflect.DeepEqual(gotProps, all) {
				t.Errorf("properties = %v, want %v", gotProps, all)
			}
		})
	}
}

// TestSchemaFileDefs checks the $defs that describe Go types against their
// json tags, as TestSchemaFilesRequired does for the files themselves:
// every field a property, the fields without omitempty required. Each $def
// is checked in every file that holds it.
func TestSchemaFileDefs(t *testing.T) {
	defs := map[string]reflect.Type{
		"agentSpec": reflect.TypeFor[AgentSpec](),
		"price":     reflect.TypeFor[Price](),
		"usage":     reflect.TypeFor[Usage](),
	}
	found := make(map[string]int)
	for typ := range catalogueEntries() {
		doc := readSchemaFile(t, typ)
		all, _ := doc["$defs"].(map[string]any)
		for name, rt := range defs {
			def, ok := all[name].(map[string]any)
			if !ok {
				continue
			}
			found[name]++
			t.Run(typ+"/"+name, func(t *testing.T) {
				var want, wantProps []string
				for i := range rt.NumField() {
					tag, opts, _ := strings.Cut(rt.Field(i).Tag.Get("json"), ",")
					wantProps = append(wantProps, tag)
					if !strings.Contains(","+opts+",", ",omitempty,") {
						want = append(want, tag)
					}
				}
				var got, gotProps []string
				if req, ok := def["required"].([]any); ok {
					for _, r := range req {
						got = append(got, r.(string))
					}
				}
				props, _ := def["properties"].(map[string]any)
				for p, v := range props {
					gotProps = append(gotProps, p)
					if d, _ := v.(map[string]any)["description"].(string); d == "" {
						t.Errorf("property %s has no description", p)
					}
				}
				for _, l := range [][]string{got, want, gotProps, wantProps} {
					sort.Strings(l)
				}
				if !reflect.DeepEqual(got, want) {
					t.Errorf("required = %v, want %v", got, want)
				}
				if !reflect.DeepEqual(gotProps, wantProps) {
					t.Errorf("properties = %v, want %v", gotProps, wantProps)
				}
			})
		}
	}
	for name := range defs {
		if found[name] == 0 {
			t.Errorf("no schema file defines %s", name)
		}
	}
}

// TestSchemaFilesNoOrphans checks that every file in v1/ is the schema of a
// registered event type.
func TestSchemaFilesNoOrphans(t *testing.T) {
	entries := catalogueEntries()
	check := func(t *testing.T, names []string) {
		t.Helper()
		if len(names) != len(entries) {
			t.Errorf("%d files, %d event types", len(names), len(entries))
		}
		for _, n := range names {
			ev, ok := strings.CutSuffix(n, ".json")
			if _, known := entries["loopbus."+ev]; !ok || !known {
				t.Errorf("v1/%s is not the schema of a registered event type", n)
			}
		}
	}
	t.Run("disk", func(t *testing.T) {
		des, err := os.ReadDir(SchemaVersion)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, de := range des {
			names = append(names, de.Name())
		}
		check(t, names)
	})
	t.Run("embedded", func(t *testing.T) {
		des, err := fs.ReadDir(schemaFiles, SchemaVersion)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, de := range des {
			names = append(names, de.Name())
		}
		check(t, names)
	})
}

func TestSchemaFile(t *testing.T) {
	tests := []struct {
		name    string
		typ     string
		want    string
		wantErr error
	}{
		{name: "known", typ: TypeValidationFailed, want: `"$id": "urn:loopbus:schema:v1:validation.failed"`},
		{name: "unknown", typ: "loopbus.session.frozen", wantErr: ErrUnknownType},
		{name: "malformed", typ: "loopbus.session", wantErr: ErrBadType},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := SchemaFile(tt.typ)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("SchemaFile error = %v, want %v", err, tt.wantErr)
			}
			if !strings.Contains(string(got), tt.want) {
				t.Errorf("SchemaFile = %s, want it to contain %s", got, tt.want)
			}
		})
	}
}

func TestDataSchemaURI(t *testing.T) {
	tests := []struct {
		name string
		typ  string
		want string
	}{
		{"session started", TypeSessionStarted, "urn:loopbus:schema:v1:session.started"},
		{"validation passed", TypeValidationPassed, "urn:loopbus:schema:v1:validation.passed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := DataSchemaURI(tt.typ); got != tt.want {
				t.Errorf("DataSchemaURI(%q) = %q, want %q", tt.typ, got, tt.want)
			}
		})
	}
}

// TestCatalogueCompilesEverySchema: schemas compile when first used; every
// embedded one compiles.
func TestCatalogueCompilesEverySchema(t *testing.T) {
	c, err := NewCatalogue()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.CompileAll(); err != nil {
		t.Fatalf("CompileAll: %v", err)
	}
}

// TestLookup: Lookup finds every type by its bytes, with its dataschema,
// and nothing else.
func TestLookup(t *testing.T) {
	cat, err := NewCatalogue()
	if err != nil {
		t.Fatal(err)
	}
	for _, typ := range cat.Types() {
		name, uri, ok := cat.Lookup([]byte(typ))
		if !ok || name != typ || uri != DataSchemaURI(typ) {
			t.Errorf("Lookup(%q) = %q, %q, %v", typ, name, uri, ok)
		}
	}
	for _, typ := range []string{"", "loopbus.job", "loopbus.job.started ", "LOOPBUS.JOB.STARTED"} {
		if name, uri, ok := cat.Lookup([]byte(typ)); ok || name != "" || uri != "" {
			t.Errorf("Lookup(%q) = %q, %q, %v; want nothing", typ, name, uri, ok)
		}
	}
}
