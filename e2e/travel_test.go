package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestScriptsTravelWithTheSession submits a pipeline whose agent and
// validate commands are scripts next to it, moves the pipeline's directory
// away, and only then starts a worker: the session completes on the copies
// that travelled with it over the bus.
func TestScriptsTravelWithTheSession(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	c.all(0, 1, 10*time.Second)
	dir := filepath.Join(c.dir, "kit")
	writeFiles(t, dir, map[string]string{
		"pipeline.yaml": `name: travel
steps:
  write:
    agent: {backend: exec, command: [./agents/write.sh]}
    prompt: "write"
    outputs: [{name: out.txt}]
    validate: [sh, checks/check.sh]
`,
		"agents/write.sh": "#!/bin/sh\necho written by the script > \"$LOOPBUS_OUTPUT_DIR/out.txt\"\n",
		"checks/check.sh": "grep -q 'written by the script' \"$LOOPBUS_OUTPUT_DIR/out.txt\"\n",
		"input.txt":       "in\n",
	})
	if err := os.Chmod(filepath.Join(dir, "agents", "write.sh"), 0o755); err != nil {
		t.Fatal(err)
	}
	res := loopbus(t, append([]string{"run", filepath.Join(dir, "pipeline.yaml"), "--input", filepath.Join(dir, "input.txt"), "--session", "travel", "--detach"}, c.global()...)...)
	if res.code != 0 {
		t.Fatalf("run --detach: exit %d\n%s", res.code, res.stderr)
	}
	if err := os.Rename(dir, dir+"-moved"); err != nil {
		t.Fatal(err)
	}
	c.service("worker-late", "agentworker", "--id", "worker-late", "--work-dir", filepath.Join(c.dir, "work-late"))
	evs := c.waitTerminal(time.Minute, "travel")["travel"]
	if last := evs[len(evs)-1]; last.Type != "loopbus.session.completed" {
		res := loopbus(t, append([]string{"status", "travel"}, c.global()...)...)
		t.Fatalf("session ended with %s:\n%s", last.Type, res.stdout)
	}
	raw := events(t, c.global(), "travel")
	if !strings.Contains(string(raw[0].Data), `"path":"agents/write.sh"`) || !strings.Contains(string(raw[0].Data), `"path":"checks/check.sh"`) {
		t.Errorf("session.started does not carry the scripts: %s", raw[0].Data)
	}
}
