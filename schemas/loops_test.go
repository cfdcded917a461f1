package schemas

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
)

// Commits of the loop tests: SHA-1 and SHA-256 object names.
var (
	commitA   = strings.Repeat("a", 40)
	commitB   = strings.Repeat("b", 40)
	commitC   = strings.Repeat("c", 40)
	commit256 = strings.Repeat("d", 64)
)

// loopsSession returns a valid session.started of a loops pipeline whose
// leaf level works in a git worktree.
func loopsSession(t *testing.T) *SessionStarted {
	t.Helper()
	task := testArtifact(t, "task.md", "", "# Add search\n")
	task.ContentType = "text/markdown"
	bundle := testArtifact(t, "base.bundle", "", "bundle")
	agent := AgentSpec{Backend: BackendClaude, Model: "opus"}
	return &SessionStarted{
		Pipeline: Pipeline{
			Name:   "build",
			Source: "loops.yaml",
			Dir:    "/home/user/app",
			Kind:   KindLoops,
			Loops: &Loops{
				Base: "main",
				Levels: []LoopLevel{
					{
						Name:          "plan",
						Agent:         agent,
						Prompt:        "Plan {{.Task}}.",
						PromptPath:    "prompts/plan.md",
						Outputs:       []Output{{Name: "plan.md", Report: true, ReportText: true}},
						MaxIterations: 2,
						TimeoutMs:     600000,
						Children:      &LoopChildren{Level: "feature", From: "plan.md", Split: SplitHeadings, Max: 10},
						Line:          3,
					},
					{
						Name:          "feature",
						Agent:         agent,
						Prompt:        "Build {{.Input}}.",
						Outputs:       []Output{{Name: "items.json", Report: true}},
						Validate:      []string{"make", "test"},
						MaxIterations: 5,
						TimeoutMs:     1800000,
						// ValidateTimeoutMs left unset: optional.
						Worktree: true,
						Children: &LoopChildren{Level: "fix", From: "items.json", Split: SplitJSON, Path: "/items"},
						Breaker:  &Breaker{NoProgress: 2},
						Line:     10,
					},
					{
						Name:              "fix",
						Agent:             AgentSpec{Backend: BackendExec, Command: []string{"./fix.sh"}},
						Prompt:            "Fix it.",
						MaxIterations:     1,
						TimeoutMs:         60000,
						ValidateTimeoutMs: 30000,
						Worktree:          true,
						Line:              20,
					},
				},
			},
		},
		Input:      task,
		SourceHash: ShortHash(task.Digest),
		Loops: &LoopsStart{
			Task:       "Add search to the app.",
			Repo:       "app",
			Base:       "main",
			BaseCommit: commitA,
			Bundle:     &bundle,
			Target:     "loopbus/sess-1",
			Identity:   &GitIdentity{Name: "Ada", Email: "ada@example.com"},
		},
	}
}

func TestSessionStartedLoops(t *testing.T) {
	c := newTestCatalogue(t)
	tests := []struct {
		name    string
		edit    func(s *SessionStarted)
		wantErr bool
	}{
		{name: "loops with worktrees", edit: func(*SessionStarted) {}},
		{name: "empty steps", edit: func(s *SessionStarted) { s.Pipeline.Steps = []Step{} }},
		{name: "no loops start", edit: func(s *SessionStarted) { s.Loops = nil }},
		{name: "task only", edit: func(s *SessionStarted) { s.Loops = &LoopsStart{Task: "t"} }},
		{name: "sha-256 base commit", edit: func(s *SessionStarted) { s.Loops.BaseCommit = commit256 }},
		{name: "one level", edit: func(s *SessionStarted) {
			s.Pipeline.Loops = &Loops{Levels: s.Pipeline.Loops.Levels[2:]}
		}},
		{name: "split none", edit: func(s *SessionStarted) {
			s.Pipeline.Loops.Levels[0].Children = &LoopChildren{Level: "feature"}
		}},
		{name: "kind loops without loops", edit: func(s *SessionStarted) { s.Pipeline.Loops = nil }, wantErr: true},
		{name: "kind loops with steps", edit: func(s *SessionStarted) {
			s.Pipeline.Steps = []Step{{Name: "s", Agent: AgentSpec{Backend: BackendExec}, MaxIterations: 1, TimeoutMs: 1}}
		}, wantErr: true},
		{name: "loops without kind", edit: func(s *SessionStarted) { s.Pipeline.Kind = "" }, wantErr: true},
		{name: "loops of kind backlog", edit: func(s *SessionStarted) { s.Pipeline.Kind = KindBacklog }, wantErr: true},
		{name: "session loops without loops pipeline", edit: func(s *SessionStarted) {
			s.Pipeline = Pipeline{Name: "p", Steps: []Step{{Name: "s", Agent: AgentSpec{Backend: BackendExec}, MaxIterations: 1, TimeoutMs: 1}}}
		}, wantErr: true},
		{name: "no levels", edit: func(s *SessionStarted) { s.Pipeline.Loops.Levels = nil }, wantErr: true},
		{name: "empty levels", edit: func(s *SessionStarted) { s.Pipeline.Loops.Levels = []LoopLevel{} }, wantErr: true},
		{name: "bad level name", edit: func(s *SessionStarted) { s.Pipeline.Loops.Levels[1].Name = "a feature" }, wantErr: true},
		{name: "level without agent backend", edit: func(s *SessionStarted) { s.Pipeline.Loops.Levels[1].Agent = AgentSpec{} }, wantErr: true},
		{name: "level max iterations 0", edit: func(s *SessionStarted) { s.Pipeline.Loops.Levels[0].MaxIterations = 0 }, wantErr: true},
		{name: "level negative timeout", edit: func(s *SessionStarted) { s.Pipeline.Loops.Levels[0].TimeoutMs = -1 }, wantErr: true},
		{name: "level empty validate argv", edit: func(s *SessionStarted) { s.Pipeline.Loops.Levels[1].Validate = []string{} }},
		{name: "unknown split", edit: func(s *SessionStarted) { s.Pipeline.Loops.Levels[0].Children.Split = "lines" }, wantErr: true},
		{name: "children without level", edit: func(s *SessionStarted) { s.Pipeline.Loops.Levels[0].Children.Level = "" }, wantErr: true},
		{name: "children from a path", edit: func(s *SessionStarted) { s.Pipeline.Loops.Levels[0].Children.From = "out/plan.md" }, wantErr: true},
		{name: "split path not a pointer", edit: func(s *SessionStarted) { s.Pipeline.Loops.Levels[1].Children.Path = "items" }, wantErr: true},
		{name: "negative max children", edit: func(s *SessionStarted) { s.Pipeline.Loops.Levels[0].Children.Max = -1 }, wantErr: true},
		{name: "bad base commit", edit: func(s *SessionStarted) { s.Loops.BaseCommit = "main" }, wantErr: true},
		{name: "uppercase base commit", edit: func(s *SessionStarted) { s.Loops.BaseCommit = strings.ToUpper(commitA) }, wantErr: true},
		{name: "bundle with bad digest", edit: func(s *SessionStarted) { s.Loops.Bundle.Digest = "sha256:00" }, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			want := loopsSession(t)
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
			for i := range want.Pipeline.Loops.Levels {
				if lv := &want.Pipeline.Loops.Levels[i]; len(lv.Validate) == 0 {
					lv.Validate = nil
				}
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("round trip:\n got %#v\nwant %#v", got, want)
			}
		})
	}
}

// TestLoopJobsRoundTrip round-trips the job events of worktree loops.
func TestLoopJobsRoundTrip(t *testing.T) {
	c := newTestCatalogue(t)
	base := testArtifact(t, "base.bundle", "", "base")
	work := testArtifact(t, "root-1.bundle", "root-1", "work")
	agent := AgentSpec{Backend: BackendClaude}
	tests := []struct {
		name string
		typ  string
		data any
	}{
		{"job requested with files and worktree", TypeJobRequested, &JobRequested{
			JobID: "sess-1.root-1.2", Step: "root-1", Iteration: 2, Agent: agent, Prompt: "Build it.",
			Inputs:    []ArtifactRef{},
			Outputs:   []Output{{Name: "plan.md", Report: true, ReportText: true}},
			TimeoutMs: 600000,
			Files: []InlineFile{
				{Name: "task.md", Content: "# Add search\n"},
				{Name: "plan.md", Content: ""},
			},
			Worktree: &WorktreeSpec{
				Bundles:  []ArtifactRef{base, work},
				Base:     commitB,
				From:     commitC,
				FromBase: commitA,
				Branch:   "loopbus/sess-1/root-1",
				Identity: &GitIdentity{Name: "Ada", Email: "ada@example.com"},
			},
		}},
		{"merge job", TypeJobRequested, &JobRequested{
			JobID: "sess-1.root-1.merge.1", Step: "root-1", Iteration: 1, Agent: agent,
			Inputs:   []ArtifactRef{base},
			Worktree: &WorktreeSpec{Bundles: []ArtifactRef{base, work}, Base: commitB, From: commitC, FromBase: commitA, Branch: "loopbus/sess-1", Merge: true},
		}},
		{"first iteration without bundles", TypeJobRequested, &JobRequested{
			JobID: "j", Step: "root", Iteration: 1, Agent: agent, Inputs: []ArtifactRef{},
			Worktree: &WorktreeSpec{Base: commit256, Branch: "loopbus/sess-1/root"},
		}},
		{"job completed with git", TypeJobCompleted, &JobCompleted{
			JobID: "sess-1.root-1.2", Step: "root-1", Iteration: 2, RequestSeq: 7, Worker: "w", DurationMs: 100,
			Artifacts: []ArtifactRef{},
			Git:       &GitResult{Commit: commitC, Base: commitB, Bundle: &work, Changed: true},
		}},
		{"job completed unchanged", TypeJobCompleted, &JobCompleted{
			JobID: "j", Step: "root-1", Iteration: 1, Worker: "w",
			Git: &GitResult{Commit: commitB, Base: commitB},
		}},
		{"job failed with conflict", TypeJobFailed, &JobFailed{
			JobID: "sess-1.root-1.merge.1", Step: "root-1", Iteration: 1, Worker: "w", ExitCode: 1,
			Error: "merge conflict", Conflict: []string{"README.md", "cmd/main.go"},
		}},
		{"loop spawned root", TypeLoopSpawned, &LoopSpawned{Loop: "root", Level: "plan"}},
		{"loop spawned child", TypeLoopSpawned, &LoopSpawned{
			Loop: "root-3", Parent: "root", Level: "feature", Index: 3,
			Input: "## Export\n", InputName: "plan.md", InputDigest: Digest([]byte("## Export\n")), Title: "## Export", Generation: 2,
		}},
		{"loop merged", TypeLoopMerged, &LoopMerged{Loop: "root-1", JobID: "sess-1.root-1.merge.1", Head: commitC, Previous: commitB, Bundle: work, Position: 3}},
		{"loop merged sha-256", TypeLoopMerged, &LoopMerged{Loop: "root-1", JobID: "j", Head: commit256, Previous: strings.Repeat("e", 64), Bundle: work, Position: 1}},
		{"loop rebase", TypeLoopRebase, &LoopRebase{Loop: "root-2", Head: commitC, Cause: "root-1"}},
		{"loop rebase after conflict", TypeLoopRebase, &LoopRebase{Loop: "root-2", Head: commitC, Cause: "root-2", Conflict: []string{"go.mod"}, Reason: "merge conflicted"}},
		{"loop invalidated", TypeLoopInvalidated, &LoopInvalidated{Loop: "root-2", Cause: "root"}},
		{"loop invalidated with reason", TypeLoopInvalidated, &LoopInvalidated{Loop: "root-2", Cause: "root", Reason: "root iterated again"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			raw, err := c.Encode(tt.typ, tt.data)
			if err != nil {
				t.Fatalf("Encode: %v", err)
			}
			got, err := c.Decode(tt.typ, raw)
			if err != nil {
				t.Fatalf("Decode(%s): %v", raw, err)
			}
			if !reflect.DeepEqual(got, tt.data) {
				t.Errorf("round trip:\n got %#v\nwant %#v", got, tt.data)
			}
		})
	}
}

func TestLoopEventsDecode(t *testing.T) {
	c := newTestCatalogue(t)
	digest := Digest(nil)
	bundle := `{"name":"b.bundle","object":"o","digest":"` + digest + `","size":0}`
	const job = `"jobId":"j","step":"s","iteration":1,"attempt":0,"agent":{"backend":"exec"},"prompt":"p","inputs":[],"timeoutMs":1`
	tests := []struct {
		name    string
		typ     string
		raw     string
		want    any
		wantErr error
	}{
		{name: "loop spawned", typ: TypeLoopSpawned, raw: `{"loop":"root-1","parent":"root","level":"feature","index":1}`,
			want: &LoopSpawned{Loop: "root-1", Parent: "root", Level: "feature", Index: 1}},
		{name: "loop spawned bad loop id", typ: TypeLoopSpawned, raw: `{"loop":"root.1","level":"feature","index":1}`, wantErr: ErrInvalidData},
		{name: "loop spawned loop id too long", typ: TypeLoopSpawned, raw: `{"loop":"` + strings.Repeat("l", 65) + `","level":"feature","index":1}`, wantErr: ErrInvalidData},
		{name: "loop spawned empty parent", typ: TypeLoopSpawned, raw: `{"loop":"root-1","parent":"","level":"feature","index":1}`, wantErr: ErrInvalidData},
		{name: "loop spawned without level", typ: TypeLoopSpawned, raw: `{"loop":"root-1","index":1}`, wantErr: ErrInvalidData},
		{name: "loop spawned negative index", typ: TypeLoopSpawned, raw: `{"loop":"root-1","level":"l","index":-1}`, wantErr: ErrInvalidData},
		{name: "loop spawned bad input digest", typ: TypeLoopSpawned, raw: `{"loop":"root-1","level":"l","index":1,"inputDigest":"sha256:00"}`, wantErr: ErrInvalidData},
		{name: "loop spawned input name is a path", typ: TypeLoopSpawned, raw: `{"loop":"root-1","level":"l","index":1,"inputName":"in/plan.md"}`, wantErr: ErrInvalidData},

		{name: "loop merged", typ: TypeLoopMerged, raw: `{"loop":"root-1","jobId":"j","head":"` + commitB + `","previous":"` + commitA + `","bundle":` + bundle + `,"position":1}`,
			want: &LoopMerged{Loop: "root-1", JobID: "j", Head: commitB, Previous: commitA, Bundle: ArtifactRef{Name: "b.bundle", Object: "o", Digest: digest}, Position: 1}},
		{name: "loop merged bad head", typ: TypeLoopMerged, raw: `{"loop":"root-1","jobId":"j","head":"HEAD","previous":"` + commitA + `","bundle":` + bundle + `,"position":1}`, wantErr: ErrInvalidData},
		{name: "loop merged short head", typ: TypeLoopMerged, raw: `{"loop":"root-1","jobId":"j","head":"` + commitB[:12] + `","previous":"` + commitA + `","bundle":` + bundle + `,"position":1}`, wantErr: ErrInvalidData},
		{name: "loop merged head of 41 digits", typ: TypeLoopMerged, raw: `{"loop":"root-1","jobId":"j","head":"` + commitB + `0","previous":"` + commitA + `","bundle":` + bundle + `,"position":1}`, wantErr: ErrInvalidData},
		{name: "loop merged uppercase head", typ: TypeLoopMerged, raw: `{"loop":"root-1","jobId":"j","head":"` + strings.ToUpper(commitB) + `","previous":"` + commitA + `","bundle":` + bundle + `,"position":1}`, wantErr: ErrInvalidData},
		{name: "loop merged without bundle", typ: TypeLoopMerged, raw: `{"loop":"root-1","jobId":"j","head":"` + commitB + `","previous":"` + commitA + `","position":1}`, wantErr: ErrInvalidData},
		{name: "loop merged position 0", typ: TypeLoopMerged, raw: `{"loop":"root-1","jobId":"j","head":"` + commitB + `","previous":"` + commitA + `","bundle":` + bundle + `,"position":0}`, wantErr: ErrInvalidData},

		{name: "loop rebase", typ: TypeLoopRebase, raw: `{"loop":"root-2","head":"` + commitB + `","cause":"root-1","conflict":["a.go"]}`,
			want: &LoopRebase{Loop: "root-2", Head: commitB, Cause: "root-1", Conflict: []string{"a.go"}}},
		{name: "loop rebase without cause", typ: TypeLoopRebase, raw: `{"loop":"root-2","head":"` + commitB + `"}`, wantErr: ErrInvalidData},
		{name: "loop rebase bad head", typ: TypeLoopRebase, raw: `{"loop":"root-2","head":"main","cause":"root-1"}`, wantErr: ErrInvalidData},

		{name: "loop invalidated", typ: TypeLoopInvalidated, raw: `{"loop":"root-2","cause":"root","reason":"r"}`,
			want: &LoopInvalidated{Loop: "root-2", Cause: "root", Reason: "r"}},
		{name: "loop invalidated bad loop id", typ: TypeLoopInvalidated, raw: `{"loop":"root/2","cause":"root"}`, wantErr: ErrInvalidData},
		{name: "loop invalidated bad cause", typ: TypeLoopInvalidated, raw: `{"loop":"root-2","cause":""}`, wantErr: ErrInvalidData},

		{name: "job requested with files", typ: TypeJobRequested, raw: `{` + job + `,"files":[{"name":"task.md","content":"t"}]}`,
			want: &JobRequested{JobID: "j", Step: "s", Iteration: 1, Agent: AgentSpec{Backend: "exec"}, Prompt: "p", Inputs: []ArtifactRef{}, TimeoutMs: 1, Files: []InlineFile{{Name: "task.md", Content: "t"}}}},
		{name: "inline file name is a path", typ: TypeJobRequested, raw: `{` + job + `,"files":[{"name":"../task.md","content":"t"}]}`, wantErr: ErrInvalidData},
		{name: "inline file without content", typ: TypeJobRequested, raw: `{` + job + `,"files":[{"name":"task.md"}]}`, wantErr: ErrInvalidData},
		{name: "worktree without branch", typ: TypeJobRequested, raw: `{` + job + `,"worktree":{"bundles":[],"base":"` + commitA + `"}}`, wantErr: ErrInvalidData},
		{name: "worktree bad base", typ: TypeJobRequested, raw: `{` + job + `,"worktree":{"bundles":[],"base":"main","branch":"b"}}`, wantErr: ErrInvalidData},
		{name: "worktree bad from", typ: TypeJobRequested, raw: `{` + job + `,"worktree":{"bundles":[],"base":"` + commitA + `","from":"x","branch":"b"}}`, wantErr: ErrInvalidData},
		{name: "report text not boolean", typ: TypeJobRequested, raw: `{` + job + `,"outputs":[{"name":"o.md","reportText":"yes"}]}`, wantErr: ErrInvalidData},

		{name: "git result bad commit", typ: TypeJobCompleted, raw: `{"jobId":"j","step":"s","iteration":1,"requestSeq":0,"worker":"w","exitCode":0,"durationMs":0,"artifacts":[],"git":{"commit":"c","base":"` + commitA + `","bundle":` + bundle + `}}`, wantErr: ErrInvalidData},
		{name: "git result without bundle (nothing changed)", typ: TypeJobCompleted, raw: `{"jobId":"j","step":"s","iteration":1,"requestSeq":0,"worker":"w","exitCode":0,"durationMs":0,"artifacts":[],"git":{"commit":"` + commitA + `","base":"` + commitA + `"}}`},
		{name: "conflict not strings", typ: TypeJobFailed, raw: `{"jobId":"j","step":"s","iteration":1,"worker":"w","exitCode":1,"durationMs":0,"error":"e","conflict":[1]}`, wantErr: ErrInvalidData},

		{name: "split not in enum", typ: TypeSessionStarted, raw: loopsSessionJSON(t, `"children":{"level":"leaf","split":"lines"}`), wantErr: ErrInvalidData},
		{name: "split headings", typ: TypeSessionStarted, raw: loopsSessionJSON(t, `"children":{"level":"leaf","split":"headings"}`)},
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
			if tt.want != nil && !reflect.DeepEqual(got, tt.want) {
				t.Errorf("Decode = %#v, want %#v", got, tt.want)
			}
		})
	}
}

// loopsSessionJSON returns the JSON of a session.started of a loops pipeline
// whose root level has the members root (JSON, without braces) besides its
// required ones.
func loopsSessionJSON(t *testing.T, root string) string {
	t.Helper()
	in := testArtifact(t, "task.md", "", "t")
	ref, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	return `{"pipeline":{"name":"p","steps":null,"kind":"loops","loops":{"levels":[` +
		`{"name":"root","agent":{"backend":"exec"},"prompt":"p","maxIterations":1,"timeoutMs":1,` + root + `},` +
		`{"name":"leaf","agent":{"backend":"exec"},"prompt":"p","maxIterations":1,"timeoutMs":1}]}},` +
		`"input":` + string(ref) + `,"sourceHash":"` + ShortHash(in.Digest) + `","loops":{"task":"t"}}`
}

func TestTitle(t *testing.T) {
	for _, tc := range []struct {
		text string
		max  int
		want string
	}{
		{"\n\n## Add greet()\nbody", 72, "Add greet()"},
		{"# é é é", 4, "é "},
		{"# ééé", 3, "é"},
		{"  \n", 10, ""},
	} {
		if got := Title(tc.text, tc.max); got != tc.want {
			t.Errorf("Title(%q, %d) = %q, want %q", tc.text, tc.max, got, tc.want)
		}
	}
}
