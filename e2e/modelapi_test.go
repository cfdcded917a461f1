package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/loopbus/loopbus/internal/modelserver"
)

// exampleKey is the API key of the example's run: its value must appear in
// no event.
const exampleKey = "sk-example-0123456789abcdef"

// TestModelAPIExample runs examples/model-api as its README says, with
// OPENAI_BASE_URL pointing at a scripted OpenAI-compatible server: the
// model lists its workspace, reads the notes and writes a summary that
// fails the example's check; the next iteration's prompt says why, and the
// model writes it again and edits it; the session completes with the
// summary as its output. Every tool call is an event; the key is in none.
func TestModelAPIExample(t *testing.T) {
	t.Parallel()
	ms := modelserver.New(t)
	const bad = "# Release meeting\\n\\n- Version 2.4 ships on 2 December.\\n- Priya owns the migration tool.\\n"
	ms.Add("notes", modelserver.Script{Key: exampleKey, Replies: []modelserver.Reply{
		{Text: "Let me look at the workspace.", Usage: modelserver.Usage{Input: 900, Output: 20}, Calls: []modelserver.Call{
			{Name: "list_files", Args: `{"path":"."}`},
			{Name: "read_file", Args: `{"path":"in/notes.md"}`},
		}},
		{Usage: modelserver.Usage{Input: 1400, Output: 80, Cached: 900}, Calls: []modelserver.Call{
			{Name: "write_file", Args: `{"path":"out/summary.md","content":"` + bad + `"}`},
		}},
		{Text: "I wrote out/summary.md.", Usage: modelserver.Usage{Input: 1500, Output: 10, Cached: 1400}},
	}, Variants: []modelserver.Variant{{Contains: "An earlier attempt was rejected", Replies: []modelserver.Reply{
		{Text: "Fixing the bullet count.", Usage: modelserver.Usage{Input: 1000, Output: 90}, Calls: []modelserver.Call{
			{Name: "write_file", Args: `{"path":"out/summary.md","content":"` + bad + `"}`},
		}},
		{Usage: modelserver.Usage{Input: 1100, Output: 60, Cached: 1000}, Calls: []modelserver.Call{
			{Name: "edit_file", Args: `{"path":"out/summary.md","old_string":"- Priya owns the migration tool.\n",` +
				`"new_string":"- Priya owns the migration tool.\n- The old REST endpoints stay until March.\n- Audit log export as CSV comes in 2.5.\n"}`},
		}},
		{Text: "Done: four bullets.", Usage: modelserver.Usage{Input: 1200, Output: 8, Cached: 1100}},
	}}}})
	out := t.TempDir()
	data := t.TempDir()
	env := append(testEnv(t), "OPENAI_BASE_URL="+ms.OpenAIURL("notes"), "OPENAI_API_KEY="+exampleKey, "OPENAI_MODEL=test-model")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, "run", filepath.Join("..", "examples", "model-api", "pipeline.yaml"),
		"--input", filepath.Join("..", "examples", "model-api", "notes.md"), "--session", "notes-1", "--data", data, "--out", out, "--json")
	cmd.Env = env
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	_ = cmd.Run()
	m := parseManifest(t, stdout.String())
	if m.Status != "completed" || m.Steps["summary"].Iterations != 2 {
		t.Fatalf("manifest %+v\nstderr:\n%s", m, stderr.String())
	}
	reqs := ms.Requests("notes")
	if len(reqs) != 6 {
		t.Fatalf("%d model calls, want 3 per iteration", len(reqs))
	}
	if !strings.Contains(reqs[3].Prompt, "has 2 '- ' bullet lines; want 3 to 5") {
		t.Errorf("the second iteration's prompt lacks the check's verdict:\n%s", reqs[3].Prompt)
	}
	if reqs[0].Model != "test-model" || reqs[0].APIKey != exampleKey || strings.Join(reqs[0].Tools, ",") != "read_file,write_file,edit_file,list_files" {
		t.Errorf("first request: model %q, tools %v", reqs[0].Model, reqs[0].Tools)
	}
	var first string
	for _, r := range reqs[1].Results {
		first += r.Content
	}
	if !strings.Contains(first, "in/notes.md") || !strings.Contains(first, "We ship version 2.4 on 2 December") {
		t.Errorf("the first turn's answers %q lack the listing and the notes", first)
	}
	evs := events(t, []string{"--data", data}, "notes-1")
	if n := count(evs, "loopbus.tool.started", "summary"); n != 5 {
		t.Errorf("%d tool.started, want 5", n)
	}
	if n := count(evs, "loopbus.tool.completed", "summary"); n != 5 {
		t.Errorf("%d tool.completed, want 5", n)
	}
	if n := count(evs, "loopbus.agent.message", "summary"); n != 4 {
		t.Errorf("%d agent.message, want 4", n)
	}
	var usage []string
	for _, ev := range evs {
		if strings.Contains(string(ev.Data), exampleKey) {
			t.Errorf("%s shows the API key", ev.Type)
		}
		if ev.Type == "loopbus.job.completed" {
			var jc struct {
				Usage struct{ InputTokens, CachedTokens, OutputTokens int64 }
			}
			if err := json.Unmarshal(ev.Data, &jc); err != nil {
				t.Fatal(err)
			}
			usage = append(usage, fmt.Sprintf("%+v", jc.Usage))
		}
	}
	// Per iteration, the API's figures summed over its three calls.
	if got, want := strings.Join(usage, " "), "{InputTokens:3800 CachedTokens:2300 OutputTokens:110} {InputTokens:3300 CachedTokens:2100 OutputTokens:158}"; got != want {
		t.Errorf("job.completed usage %s, want %s", got, want)
	}
	b, err := os.ReadFile(filepath.Join(out, "summary.md"))
	if err != nil || strings.Count(string(b), "\n- ") != 4 {
		t.Errorf("summary.md = %q, %v; want the edited summary", b, err)
	}
}

// TestModelAPICodeLoop: a code loop in a git worktree worked by a model
// behind an API. The model reads the repository's test, tries a path out
// of the job's workspace (refused: the model is told, nothing is read),
// reads its part of the plan beside the worktree (../in), writes the code
// and runs the test; the loop's commit is merged into the session's
// branch.
func TestModelAPICodeLoop(t *testing.T) {
	t.Parallel()
	ms := modelserver.New(t)
	ms.Add("coder", modelserver.Script{Replies: []modelserver.Reply{
		{Text: "Looking at the repository.", Calls: []modelserver.Call{
			{Name: "list_files", Args: `{"path":"."}`},
			{Name: "read_file", Args: `{"path":"test.sh"}`},
			{Name: "read_file", Args: `{"path":"../in/plan.md"}`},
			{Name: "read_file", Args: `{"path":"../../../../etc/hostname"}`},
		}},
		{Calls: []modelserver.Call{
			{Name: "write_file", Args: `{"path":"add.sh","content":"echo $(($1 + $2))\n"}`},
		}},
		{Calls: []modelserver.Call{{Name: "run", Args: `{"command":"sh test.sh && echo tests pass"}`}}},
		{Text: "add.sh is written and the test passes."},
	}})
	dir := t.TempDir()
	repo := filepath.Join(dir, "repo")
	writeFiles(t, repo, map[string]string{"test.sh": "test \"$(sh add.sh 2 3)\" = 5\n"})
	commitAll(t, repo)
	writeFiles(t, dir, map[string]string{"loops.yaml": `kind: loops
name: model-code
levels:
  plan:
    agent: {backend: exec, command: [sh, -c, "printf '# plan\n## add\nWrite add.sh: it prints the sum of its two arguments.\n' > \"$LOOPBUS_OUTPUT_DIR/plan.md\""]}
    outputs: [{name: plan.md}]
    children: {level: code, from: plan.md, split: headings}
  code:
    agent: {backend: openai, model: test-model, base_url: ` + ms.OpenAIURL("coder") + `}
    worktree: true
    validate: [sh, test.sh]
    max_iterations: 1
`})
	data := filepath.Join(dir, "data")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, "run", filepath.Join(dir, "loops.yaml"), "--repo", repo, "--task", "Add add.sh",
		"--session", "mc", "--data", data)
	cmd.Env = testEnv(t)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("run: %v\n%s", err, out)
	}
	if got := git(t, repo, "show", "loopbus/mc:add.sh"); got != "echo $(($1 + $2))" {
		t.Errorf("add.sh on loopbus/mc = %q", got)
	}
	reqs := ms.Requests("coder")
	if len(reqs) != 4 || len(reqs[1].Results) != 4 {
		t.Fatalf("%d model calls, want 4, the second answering 4 calls", len(reqs))
	}
	listing, test, plan, escape := reqs[1].Results[0].Content, reqs[1].Results[1].Content, reqs[1].Results[2].Content, reqs[1].Results[3].Content
	if !strings.Contains(listing, "test.sh") || !strings.Contains(test, "sh add.sh 2 3") || !strings.Contains(plan, "## add") {
		t.Errorf("the first turn's answers: listing %q, test %q, plan %q", listing, test, plan)
	}
	if !strings.Contains(escape, "outside the working directory") {
		t.Errorf("a path out of the workspace was answered %q", escape)
	}
	if run := reqs[3].Results[0].Content; !strings.Contains(run, "exit code 0") || !strings.Contains(run, "tests pass") {
		t.Errorf("run answered %q", run)
	}
}
