package e2e

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/loopbus/loopbus/internal/testnats"
)

// hookRunner is a running `loopbus hooks` process.
type hookRunner struct {
	cmd    *exec.Cmd
	stderr *syncBuffer
	done   chan error
}

// startHooks starts `loopbus hooks` with args and waits until its consumer
// exists (it says so), so that events published from then on run hooks.
func startHooks(t *testing.T, env []string, args ...string) *hookRunner {
	t.Helper()
	cmd := exec.Command(binary, append([]string{"hooks"}, args...)...)
	cmd.Env = env
	h := &hookRunner{cmd: cmd, stderr: &syncBuffer{}, done: make(chan error, 1)}
	cmd.Stdout, cmd.Stderr = h.stderr, h.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { h.done <- cmd.Wait() }()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-h.done })
	eventually(t, 60*time.Second, "the hook runner to be ready", func() bool {
		return strings.Contains(h.stderr.String(), "hooks: waiting for events")
	})
	return h
}

// stop sends SIGTERM and waits for a clean exit.
func (h *hookRunner) stop(t *testing.T) {
	t.Helper()
	if err := h.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	h.wait(t)
}

// wait waits for a clean exit.
func (h *hookRunner) wait(t *testing.T) {
	t.Helper()
	select {
	case err := <-h.done:
		h.done <- err // for the cleanup
		if err != nil {
			t.Fatalf("hooks after SIGTERM: %v\n%s", err, h.stderr.String())
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("hooks did not stop after SIGTERM\n%s", h.stderr.String())
	}
}

// hookData is the data of a hook.* event.
type hookData struct {
	Hook       string `json:"hook"`
	EventID    string `json:"eventId"`
	EventType  string `json:"eventType"`
	Runner     string `json:"runner"`
	ExitCode   int    `json:"exitCode"`
	OutputTail string `json:"outputTail"`
}

func hookRuns(t *testing.T, evs []cloudEvent) []hookData {
	t.Helper()
	var out []hookData
	for _, e := range evs {
		if !strings.HasPrefix(e.Type, "loopbus.hook.") {
			continue
		}
		var d hookData
		if err := json.Unmarshal(e.Data, &d); err != nil {
			t.Fatalf("%s data: %v", e.Type, err)
		}
		out = append(out, d)
	}
	return out
}

// TestHooksExample drives examples/hooks with the binary: `serve`, the hook
// runner on the example's hooks file, and sessions of a two-step pipeline.
// The runner is stopped with SIGTERM between two sessions and started
// again: every step.completed and session.completed of both sessions runs
// its hook exactly once (one line in the record log, one hook.completed
// each), and the notifier prints what it would post.
func TestHooksExample(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{
		"input.txt": "x\n",
		"pipeline.yaml": `name: hooked
steps:
  first:
    agent: {backend: exec, command: [sh, -c, 'echo one > "$LOOPBUS_OUTPUT_DIR/a.txt"']}
    prompt: first
    outputs: [{name: a.txt}]
  second:
    requires: [first]
    agent: {backend: exec, command: [sh, -c, 'cat "$LOOPBUS_INPUT_DIR/a.txt" > "$LOOPBUS_OUTPUT_DIR/b.txt"']}
    prompt: second
    outputs: [{name: b.txt}]
`,
	})
	addr := testnats.FreeAddr(t)
	global := []string{"--nats", "nats://" + addr}
	startService(t, filepath.Join(dir, "serve.log"), testEnv(t), "serve", "--data", t.TempDir(), "--listen", addr, "--log-level", "warn")
	recordLog := filepath.Join(dir, "finished.log")
	env := append(testEnv(t), "RECORD_LOG="+recordLog)
	hooksArgs := append([]string{"--config", filepath.Join("..", "examples", "hooks", "hooks.yaml")}, global...)
	session := func(id string) {
		t.Helper()
		r := loopbus(t, append([]string{"run", filepath.Join(dir, "pipeline.yaml"), "--input", filepath.Join(dir, "input.txt"), "--session", id}, global...)...)
		if r.code != 0 {
			t.Fatalf("run %s: exit %d\n%s", id, r.code, r.stderr)
		}
	}
	// Each session has 2 step.completed (record) and 1 session.completed
	// (notify).
	waitRuns := func(id string) {
		t.Helper()
		eventually(t, 60*time.Second, "3 hook runs in "+id, func() bool {
			return len(hookRuns(t, events(t, global, id))) >= 3
		})
	}

	first := startHooks(t, env, hooksArgs...)
	session("hk-1")
	waitRuns("hk-1")
	first.stop(t)
	session("hk-2") // while no runner runs
	second := startHooks(t, env, hooksArgs...)
	waitRuns("hk-2")
	second.stop(t)

	for _, id := range []string{"hk-1", "hk-2"} {
		evs := events(t, global, id)
		runs := hookRuns(t, evs)
		var got []string
		for _, r := range runs {
			got = append(got, r.Hook+" "+r.EventType)
			if r.Runner != "example" || r.ExitCode != 0 {
				t.Errorf("%s: run %+v", id, r)
			}
		}
		slices.Sort(got)
		want := []string{"notify loopbus.session.completed", "record loopbus.step.completed", "record loopbus.step.completed"}
		if !slices.Equal(got, want) {
			t.Errorf("%s: hook runs %q, want %q", id, got, want)
		}
		if n := count(evs, "loopbus.hook.completed", ""); n != 3 {
			t.Errorf("%s: %d hook.completed, want 3", id, n)
		}
		for _, r := range runs {
			if r.Hook == "notify" && !strings.Contains(r.OutputTail, `would POST: {"text":"loopbus: session `+id+` completed"}`) {
				t.Errorf("%s: notify printed %q", id, r.OutputTail)
			}
		}
	}
	log, err := os.ReadFile(recordLog)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(log)), "\n")
	var what []string
	for _, l := range lines {
		f := strings.Fields(l)
		if len(f) < 4 {
			t.Fatalf("record log line %q", l)
		}
		what = append(what, f[1]+" "+f[2]+" "+f[3])
	}
	slices.Sort(what)
	if want := []string{"hk-1/first step first", "hk-1/second step second", "hk-2/first step first", "hk-2/second step second"}; !slices.Equal(what, want) {
		t.Errorf("record log:\n%s\nwant one line for each of %q", log, want)
	}
	if !strings.Contains(second.stderr.String(), "hook record for loopbus.step.completed #") ||
		!strings.Contains(second.stderr.String(), "(session hk-2): exit 0 in ") {
		t.Errorf("the runner printed no line per run:\n%s", second.stderr.String())
	}
	if strings.Contains(second.stderr.String(), "hk-1") {
		t.Errorf("the restarted runner ran hooks for the first session again:\n%s", second.stderr.String())
	}
}

// TestHooksStopWaitsForRunningHook: SIGTERM while a hook runs lets it
// finish and records it; the runner started again does not run it again.
// A runner killed with SIGKILL mid-hook leaves the event unacknowledged:
// after --ack-wait it is delivered again and the interrupted hook runs
// again, recorded once.
func TestHooksStopWaitsForRunningHook(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{
		"input.txt": "x\n",
		"pipeline.yaml": `name: one
steps:
  only:
    agent: {backend: exec, command: [sh, -c, 'echo one > "$LOOPBUS_OUTPUT_DIR/a.txt"']}
    prompt: only
    outputs: [{name: a.txt}]
`,
		// slow.sh marks its start, waits for a gate file (up to 60s),
		// then appends its line.
		"slow.sh": `set -eu
echo "$LOOPBUS_EVENT_ID" >> started
i=0
while [ ! -e "gate-$LOOPBUS_SESSION" ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done
echo "$LOOPBUS_SESSION $LOOPBUS_EVENT_ID" >> done
`,
		"hooks.yaml": `runner: slow
hooks:
  - name: slow
    types: [loopbus.session.completed]
    command: [sh, slow.sh]
    timeout: 2m
`,
	})
	addr := testnats.FreeAddr(t)
	global := []string{"--nats", "nats://" + addr}
	startService(t, filepath.Join(dir, "serve.log"), testEnv(t), "serve", "--data", t.TempDir(), "--listen", addr, "--log-level", "warn")
	args := append([]string{"--config", filepath.Join(dir, "hooks.yaml"), "--ack-wait", "2s"}, global...)
	read := func(name string) []string {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		return strings.Fields(string(b))
	}
	run := func(id string) {
		t.Helper()
		r := loopbus(t, append([]string{"run", filepath.Join(dir, "pipeline.yaml"), "--input", filepath.Join(dir, "input.txt"), "--session", id}, global...)...)
		if r.code != 0 {
			t.Fatalf("run %s: exit %d\n%s", id, r.code, r.stderr)
		}
	}
	open := func(id string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, "gate-"+id), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}

	// SIGTERM mid-hook: the hook finishes, its outcome is published.
	h := startHooks(t, testEnv(t), args...)
	run("st-1")
	eventually(t, 60*time.Second, "the hook to start", func() bool { return len(read("started")) == 1 })
	if err := h.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond) // the runner has been told to stop
	select {
	case err := <-h.done:
		h.done <- err
		t.Fatalf("the runner exited (%v) without waiting for its running hook\n%s", err, h.stderr.String())
	default:
	}
	open("st-1")
	h.wait(t)
	if got := read("done"); len(got) != 2 || got[0] != "st-1" {
		t.Fatalf("after SIGTERM: done %q, want one run for st-1", got)
	}
	if n := count(events(t, global, "st-1"), "loopbus.hook.completed", ""); n != 1 {
		t.Fatalf("after SIGTERM: %d hook.completed in st-1, want 1", n)
	}

	// SIGKILL mid-hook: no outcome; the restarted runner runs it again.
	h = startHooks(t, testEnv(t), args...)
	run("st-2")
	eventually(t, 60*time.Second, "the hook to start for st-2", func() bool { return len(read("started")) == 2 })
	if err := h.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-h.done
	h.done <- nil
	open("st-2")
	h = startHooks(t, testEnv(t), args...)
	eventually(t, 60*time.Second, "the interrupted hook to run again and finish", func() bool {
		return count(events(t, global, "st-2"), "loopbus.hook.completed", "") == 1
	})
	h.stop(t)
	if got := read("started"); len(got) != 3 {
		t.Errorf("hook starts %q, want 3 (st-1, st-2 killed, st-2 again)", got)
	}
	if got := read("done"); len(got) != 4 || got[0] != "st-1" || got[2] != "st-2" {
		t.Errorf("finished runs %q, want st-1 and st-2 once each", got)
	}
	if n := count(events(t, global, "st-1"), "loopbus.hook.completed", ""); n != 1 {
		t.Errorf("%d hook.completed in st-1 after two restarts, want 1", n)
	}
	if n := count(events(t, global, "st-2"), "loopbus.hook.completed", ""); n != 1 {
		t.Errorf("%d hook.completed in st-2, want 1", n)
	}
}

// TestHooksUsageErrors: a missing --config and a bad hooks file exit 2
// with the file, line and field, before connecting anywhere.
func TestHooksUsageErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{"bad.yaml": "hooks:\n  - name: x\n    types: [loopbus.hook.completed]\n    command: [./missing.sh]\n"})
	tests := []struct {
		name string
		args []string
		want []string
	}{
		{"no config", []string{"hooks"}, []string{"--config HOOKS.yaml is required"}},
		{"bad file", []string{"hooks", "--config", filepath.Join(dir, "bad.yaml")}, []string{
			filepath.Join(dir, "bad.yaml") + `:3: hooks[0].types[0]: "loopbus.hook.completed": hook.* events never trigger hooks`,
			filepath.Join(dir, "bad.yaml") + ":4: hooks[0].command[0]: program " + filepath.Join(dir, "missing.sh") + ": no such file or directory",
		}},
		{"bad runner", []string{"hooks", "--config", filepath.Join("..", "examples", "hooks", "hooks.yaml"), "--runner", "a.b", "--nats", "nats://" + testnats.FreeAddr(t)}, []string{"runner \"a.b\""}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := loopbus(t, tt.args...)
			if r.code != 2 {
				t.Errorf("exit %d, want 2\n%s", r.code, r.stderr)
			}
			for _, w := range tt.want {
				if !strings.Contains(r.stderr, w) {
					t.Errorf("stderr lacks %q:\n%s", w, r.stderr)
				}
			}
		})
	}
}
