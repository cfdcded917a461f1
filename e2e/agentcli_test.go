package e2e

import (
	"path/filepath"
	"testing"
)

// TestAgentCLIsEndToEnd: a pipeline whose steps run Claude Code and Codex
// (fake CLIs printing the real event stream formats) completes; their tool
// calls and messages are events of the session.
func TestAgentCLIsEndToEnd(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	fake := func(backend string) string {
		p, err := filepath.Abs(filepath.Join("..", "agent", backend, "testdata", "fake-"+backend))
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	// The fakes write out.txt, and output names are unique per pipeline:
	// one pipeline per CLI.
	writeFiles(t, dir, map[string]string{
		"input.txt": "x\n",
		"claude.yaml": `name: with-claude
steps:
  plan:
    agent: {backend: claude, command: [` + fake("claude") + `], model: sonnet, allowed_tools: [Bash, Edit]}
    prompt: "Plan from in/{{.Input.Name}} into out/out.txt."
    outputs: [{name: out.txt}]
`,
		"codex.yaml": `name: with-codex
steps:
  build:
    agent: {backend: codex, command: [` + fake("codex") + `], model: gpt-5-codex}
    prompt: "Build from in/{{.Input.Name}} into out/out.txt."
    outputs: [{name: out.txt}]
`,
	})
	global := []string{"--data", t.TempDir()}
	for _, c := range []struct{ pipeline, session, step string }{{"claude.yaml", "claude-1", "plan"}, {"codex.yaml", "codex-1", "build"}} {
		r := loopbus(t, append([]string{"run", filepath.Join(dir, c.pipeline), "--input", filepath.Join(dir, "input.txt"), "--session", c.session, "--json"}, global...)...)
		if r.code != 0 {
			t.Fatalf("run %s: exit %d\n%s", c.pipeline, r.code, r.stderr)
		}
		if m := parseManifest(t, r.stdout); m.Status != "completed" {
			t.Fatalf("%s: manifest %+v", c.session, m)
		}
		evs := events(t, global, c.session)
		if n := count(evs, "loopbus.tool.started", c.step); n < 2 {
			t.Errorf("%s: %d tool.started, want the CLI's tool calls", c.session, n)
		}
		if n := count(evs, "loopbus.tool.completed", c.step); n < 2 {
			t.Errorf("%s: %d tool.completed", c.session, n)
		}
		if n := count(evs, "loopbus.agent.message", c.step); n == 0 {
			t.Errorf("%s: no agent.message", c.session)
		}
	}
}
