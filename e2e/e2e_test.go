package e2e

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/loopbus/loopbus/internal/testnats"
)

// TestExampleCompletes runs the shipped writing-kit example on the embedded
// default and reads the session back with events, replay, status and export.
func TestExampleCompletes(t *testing.T) {
	t.Parallel()
	data := t.TempDir()
	global := []string{"--data", data}
	r := loopbus(t, append([]string{"run", "../examples/writing-kit/pipeline.yaml", "--input", "../examples/writing-kit/article.md", "--session", "kit-1", "--json"}, global...)...)
	if r.code != 0 {
		t.Fatalf("run: exit %d\nstderr:\n%s", r.code, r.stderr)
	}
	m := parseManifest(t, r.stdout)
	if m.Status != "completed" || m.ContentID != "kit-1" || len(m.SourceHash) != 16 {
		t.Fatalf("manifest: %+v", m)
	}
	for _, step := range []string{"summary", "ideas", "writing-kit"} {
		st, ok := m.Steps[step]
		if !ok || st.Status != "completed" || len(st.ContentHash) != 16 || st.Iterations != 1 {
			t.Errorf("step %s: %+v", step, st)
		}
	}
	if !strings.Contains(r.stderr, "✓ summary completed") || !strings.Contains(r.stderr, "✓ session kit-1 completed") {
		t.Errorf("run printed no progress:\n%s", r.stderr)
	}
	if strings.Contains(r.stderr, "serving until they finish") {
		t.Errorf("a lone run claims other commands use its server:\n%s", r.stderr)
	}

	evs := events(t, global, "kit-1")
	for i, e := range evs {
		if e.SpecVersion != "1.0" || e.ID == "" || e.Source == "" || !strings.HasPrefix(e.Type, "loopbus.") || !strings.HasPrefix(e.Subject, "kit-1") || e.Time == "" {
			t.Errorf("event %d is not a complete CloudEvent: %+v", i, e)
		}
		if _, err := time.Parse(time.RFC3339Nano, e.Time); err != nil {
			t.Errorf("event %d time %q: %v", i, e.Time, err)
		}
	}
	for _, typ := range []string{"loopbus.session.started", "loopbus.session.completed"} {
		if count(evs, typ, "") != 1 {
			t.Errorf("%d %s events, want 1", count(evs, typ, ""), typ)
		}
	}
	if n := count(evs, "loopbus.step.completed", ""); n != 3 {
		t.Errorf("%d step.completed, want 3", n)
	}

	// The data dir holds only this session, so stream sequence = index+1.
	k := 0
	for i, e := range evs {
		if e.Type == "loopbus.step.completed" && e.Step == "summary" {
			k = i + 1
		}
	}
	at := parseManifest(t, loopbus(t, append([]string{"replay", "kit-1", "--until", itoa(k), "--json"}, global...)...).stdout)
	if at.LastSeq != uint64(k) || at.Steps["summary"].Status != "completed" || at.Steps["ideas"].Status == "completed" || at.Status != "running" {
		t.Errorf("replay --until %d: %+v", k, at)
	}
	before := parseManifest(t, loopbus(t, append([]string{"replay", "kit-1", "--until", itoa(k - 1), "--json"}, global...)...).stdout)
	if before.Steps["summary"].Status == "completed" {
		t.Errorf("replay --until %d already shows summary completed", k-1)
	}

	st := loopbus(t, append([]string{"status", "kit-1", "--json"}, global...)...)
	if st.code != 0 || parseManifest(t, st.stdout).Status != "completed" {
		t.Errorf("status: exit %d %s %s", st.code, st.stdout, st.stderr)
	}
	if human := loopbus(t, append([]string{"status", "kit-1"}, global...)...); !strings.Contains(human.stdout, "writing-kit  completed") {
		t.Errorf("status table:\n%s", human.stdout)
	}

	out := t.TempDir()
	if ex := loopbus(t, append([]string{"export", "kit-1", "--dir", out}, global...)...); ex.code != 0 {
		t.Fatalf("export: %d %s", ex.code, ex.stderr)
	}
	for _, f := range []string{"session.json", "events.jsonl", "artifacts/article.md", "artifacts/summary.json", "artifacts/ideas.json", "artifacts/writing-kit.json", "iterations/kit-1.summary.1/summary.json"} {
		if _, err := os.Stat(filepath.Join(out, f)); err != nil {
			t.Errorf("export: %v", err)
		}
	}
	var kit map[string]any
	raw, _ := os.ReadFile(filepath.Join(out, "artifacts", "writing-kit.json"))
	if err := json.Unmarshal(raw, &kit); err != nil || kit["outline"] == nil {
		t.Errorf("exported writing-kit.json: %v %s", err, raw)
	}

	// A second run with the same session id is refused as a usage error.
	again := loopbus(t, append([]string{"run", "../examples/writing-kit/pipeline.yaml", "--input", "../examples/writing-kit/article.md", "--session", "kit-1"}, global...)...)
	if again.code != 2 || !strings.Contains(again.stderr, "already exists") {
		t.Errorf("rerun of kit-1: exit %d, stderr %s", again.code, again.stderr)
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

const countSchema = `{"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object", "required": ["count"], "properties": {"count": {"type": "integer"}}}`

// retryPipeline is one step whose agent writes an invalid result on
// iteration 1; on later iterations it writes a valid one only if the
// prompt carries the first verdict (when passOnRetry is set).
func retryPipeline(t *testing.T, maxIterations int, passOnRetry bool) string {
	t.Helper()
	dir := t.TempDir()
	agent := `set -eu
out="$LOOPBUS_OUTPUT_DIR/result.json"
if [ "$LOOPBUS_ITERATION" = 1 ] || [ "${PASS_ON_RETRY:-no}" != yes ]; then
  printf '{"count": "three"}' > "$out"; exit 0
fi
# The first verdict must have reached this iteration's prompt.
if grep -q 'result.json /count' "$LOOPBUS_PROMPT_FILE" && grep -q 'Iteration 1' "$LOOPBUS_PROMPT_FILE"; then
  printf '{"count": 3}' > "$out"
else
  echo "feedback of iteration 1 is missing from the prompt" >&2; exit 7
fi
`
	pass := "no"
	if passOnRetry {
		pass = "yes"
	}
	writeFiles(t, dir, map[string]string{
		"count.sh":          agent,
		"count.schema.json": countSchema,
		"input.txt":         "three apples\n",
		"pipeline.yaml": `name: retry
steps:
  count:
    agent: {backend: exec, command: [sh, count.sh], env: {PASS_ON_RETRY: ` + pass + `}}
    prompt: |
      Count the apples in {{.Input.Name}} and write out/result.json.
      {{if .Feedback}}Your previous attempt was rejected:
      {{.Feedback}}{{end}}
    outputs: [{name: result.json, schema: count.schema.json}]
    max_iterations: ` + itoa(maxIterations) + `
    timeout: 30s
`,
	})
	return dir
}

// TestValidationRetry: a step that fails validation once passes on its
// second iteration, whose prompt shows the first verdict.
func TestValidationRetry(t *testing.T) {
	t.Parallel()
	dir := retryPipeline(t, 3, true)
	global := []string{"--data", t.TempDir()}
	r := loopbus(t, append([]string{"run", filepath.Join(dir, "pipeline.yaml"), "--input", filepath.Join(dir, "input.txt"), "--session", "retry-1", "--json"}, global...)...)
	if r.code != 0 {
		t.Fatalf("run: exit %d\n%s", r.code, r.stderr)
	}
	m := parseManifest(t, r.stdout)
	if st := m.Steps["count"]; st.Status != "completed" || st.Iterations != 2 {
		t.Fatalf("count step: %+v", st)
	}
	if !strings.Contains(r.stderr, "iteration 1 failed validation") {
		t.Errorf("progress does not show the failed iteration:\n%s", r.stderr)
	}
	evs := events(t, global, "retry-1")
	if n := count(evs, "loopbus.validation.failed", ""); n != 1 {
		t.Errorf("%d validation.failed, want 1", n)
	}
	var second struct {
		Iteration int    `json:"iteration"`
		Prompt    string `json:"prompt"`
	}
	for _, e := range evs {
		if e.Type == "loopbus.job.requested" {
			_ = json.Unmarshal(e.Data, &second)
		}
	}
	if second.Iteration != 2 || !strings.Contains(second.Prompt, "/count: got string, want integer") || !strings.Contains(second.Prompt, "previous attempt was rejected") {
		t.Errorf("second prompt (iteration %d) lacks the first verdict:\n%s", second.Iteration, second.Prompt)
	}
}

// TestMaxIterationsExhausted: a step that never passes fails the session
// with the reason, exit code 1.
func TestMaxIterationsExhausted(t *testing.T) {
	t.Parallel()
	dir := retryPipeline(t, 2, false)
	global := []string{"--data", t.TempDir()}
	r := loopbus(t, append([]string{"run", filepath.Join(dir, "pipeline.yaml"), "--input", filepath.Join(dir, "input.txt"), "--session", "fail-1", "--json"}, global...)...)
	if r.code != 1 {
		t.Fatalf("run: exit %d, want 1\n%s", r.code, r.stderr)
	}
	want := "session fail-1 failed: step count failed: no valid output after 2 of 2 iterations; last error: result.json /count: got string, want integer"
	if !strings.Contains(r.stderr, want) {
		t.Errorf("stderr lacks %q:\n%s", want, r.stderr)
	}
	m := parseManifest(t, r.stdout)
	if m.Status != "failed" || m.FailedStep != "count" || m.Steps["count"].Status != "failed" || m.Steps["count"].Iterations != 2 || m.Steps["count"].ErrorMessage == "" {
		t.Errorf("manifest: %+v", m)
	}
	evs := events(t, global, "fail-1")
	if count(evs, "loopbus.job.requested", "") != 2 || count(evs, "loopbus.session.failed", "") != 1 {
		t.Errorf("events: %d job.requested, %d session.failed", count(evs, "loopbus.job.requested", ""), count(evs, "loopbus.session.failed", ""))
	}
}

// TestUsageErrors: bad pipelines and arguments exit 2 with a message naming
// the file, line and field.
func TestUsageErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{
		"bad.yaml": "name: bad\nsteps:\n  a:\n    agent: {backend: exec, command: [true]}\n    prompt: hi\n    outputs: [{name: ../escape.json}]\n    bogus: 1\n",
		"in.txt":   "x",
	})
	tests := []struct {
		name string
		args []string
		want []string
	}{
		{"unknown key and unsafe output", []string{"run", filepath.Join(dir, "bad.yaml"), "--input", filepath.Join(dir, "in.txt")}, []string{"bad.yaml:7", "steps.a.bogus", "bad.yaml:6", "escape.json"}},
		{"missing input flag", []string{"run", "../examples/writing-kit/pipeline.yaml"}, []string{"--input"}},
		{"missing input file", []string{"run", "../examples/writing-kit/pipeline.yaml", "--input", filepath.Join(dir, "nope.md")}, []string{"nope.md"}},
		{"unsafe session id", []string{"run", "../examples/writing-kit/pipeline.yaml", "--input", filepath.Join(dir, "in.txt"), "--session", "a.b>"}, []string{"invalid session id"}},
		{"bad until", []string{"replay", "s1", "--until", "yesterday"}, []string{"RFC 3339"}},
		{"unknown flag", []string{"status", "s1", "--bogus"}, []string{"bogus"}},
		{"missing argument", []string{"status"}, []string{"accepts 1 arg"}},
		{"unknown command", []string{"bogus"}, []string{"unknown command"}},
		{"bad log level", []string{"status", "s1", "--log-level", "loud"}, []string{"--log-level"}},
		{"until zero", []string{"replay", "s1", "--until", "0"}, []string{"start at 1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := loopbus(t, append(tt.args, "--data", t.TempDir())...)
			if r.code != 2 {
				t.Fatalf("exit %d, want 2\n%s", r.code, r.stderr)
			}
			for _, w := range tt.want {
				if !strings.Contains(r.stderr, w) {
					t.Errorf("stderr lacks %q:\n%s", w, r.stderr)
				}
			}
		})
	}
}

// TestKillServeMidSession: SIGKILL `serve` while the second step runs,
// restart it, and the session completes without re-running the first step.
func TestKillServeMidSession(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	marker := filepath.Join(dir, "release")
	writeFiles(t, dir, map[string]string{
		"first.sh":  "set -eu\necho run >> \"$COUNT_DIR/first.count\"\necho first > \"$LOOPBUS_OUTPUT_DIR/a.txt\"\n",
		"second.sh": "set -eu\necho run >> \"$COUNT_DIR/second.count\"\ni=0\nwhile [ ! -e \"$RELEASE\" ]; do sleep 0.1; i=$((i+1)); [ $i -lt 1200 ] || exit 9; done\ncat \"$LOOPBUS_INPUT_DIR/a.txt\" > \"$LOOPBUS_OUTPUT_DIR/b.txt\"\n",
		"input.txt": "x\n",
		"pipeline.yaml": `name: crash
steps:
  first:
    agent: {backend: exec, command: [sh, first.sh], env: {COUNT_DIR: ` + dir + `}}
    prompt: first
    outputs: [{name: a.txt}]
  second:
    requires: [first]
    agent: {backend: exec, command: [sh, second.sh], env: {COUNT_DIR: ` + dir + `, RELEASE: ` + marker + `}}
    prompt: second
    outputs: [{name: b.txt}]
`,
	})
	data := t.TempDir()
	addr := testnats.FreeAddr(t)
	url := "nats://" + addr
	serve := func() *exec.Cmd {
		t.Helper()
		cmd := exec.Command(binary, "serve", "--data", data, "--listen", addr, "--ack-wait", "2s", "--log-level", "warn")
		cmd.Env = testEnv(t)
		logf, err := os.OpenFile(filepath.Join(dir, "serve.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stdout, cmd.Stderr = logf, logf
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait(); logf.Close() })
		return cmd
	}
	srv := serve()
	global := []string{"--nats", url}
	r := loopbus(t, append([]string{"run", filepath.Join(dir, "pipeline.yaml"), "--input", filepath.Join(dir, "input.txt"), "--session", "crash-1", "--detach"}, global...)...)
	if r.code != 0 || strings.TrimSpace(r.stdout) != "crash-1" {
		t.Fatalf("run --detach: exit %d, stdout %q\n%s", r.code, r.stdout, r.stderr)
	}
	eventually(t, 60*time.Second, "second step to start", func() bool {
		return count(events(t, global, "crash-1"), "loopbus.job.started", "second") > 0
	})
	if err := srv.Process.Kill(); err != nil { // SIGKILL
		t.Fatal(err)
	}
	_ = srv.Wait()

	serve()
	if err := os.WriteFile(marker, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	w := loopbus(t, append([]string{"wait", "crash-1", "--json"}, global...)...)
	if w.code != 0 {
		log, _ := os.ReadFile(filepath.Join(dir, "serve.log"))
		t.Fatalf("wait: exit %d\n%s\nserve log:\n%s", w.code, w.stderr, log)
	}
	if m := parseManifest(t, w.stdout); m.Status != "completed" {
		t.Fatalf("manifest: %+v", m)
	}
	firstRuns, _ := os.ReadFile(filepath.Join(dir, "first.count"))
	if n := strings.Count(string(firstRuns), "run"); n != 1 {
		t.Errorf("first step's agent ran %d times, want 1", n)
	}
	evs := events(t, global, "crash-1")
	for _, step := range []string{"first", "second"} {
		if n := count(evs, "loopbus.step.completed", step); n != 1 {
			t.Errorf("%d step.completed for %s, want 1", n, step)
		}
	}
	if n := count(evs, "loopbus.job.requested", "first"); n != 1 {
		t.Errorf("first step requested %d times, want 1", n)
	}
	if n := count(evs, "loopbus.session.completed", ""); n != 1 {
		t.Errorf("%d session.completed, want 1", n)
	}
	// The interrupted job ran again after the restart. (Its delivery count
	// may say 1 again: a server killed right after delivering a message
	// may not have recorded that delivery.)
	secondRuns, _ := os.ReadFile(filepath.Join(dir, "second.count"))
	if n := strings.Count(string(secondRuns), "run"); n != 2 {
		t.Errorf("second step's agent ran %d times, want 2 (interrupted, then run again)", n)
	}
}

// TestSharedDataDir: two `run`s on one data directory. The first starts the
// embedded server; when its session ends it keeps serving until the second,
// still running, is done.
func TestSharedDataDir(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	release := filepath.Join(dir, "release")
	writeFiles(t, dir, map[string]string{
		"quick.sh":   "set -eu\necho quick > \"$LOOPBUS_OUTPUT_DIR/out.txt\"\n",
		"slow.sh":    "set -eu\ni=0\nwhile [ ! -e \"$RELEASE\" ]; do sleep 0.1; i=$((i+1)); [ $i -lt 1200 ] || exit 9; done\necho slow > \"$LOOPBUS_OUTPUT_DIR/out.txt\"\n",
		"in.txt":     "x\n",
		"quick.yaml": "name: quick\nsteps:\n  only:\n    agent: {backend: exec, command: [sh, quick.sh]}\n    prompt: go\n    outputs: [{name: out.txt}]\n",
		"slow.yaml":  "name: slow\nsteps:\n  only:\n    agent: {backend: exec, command: [sh, slow.sh], env: {RELEASE: " + release + "}}\n    prompt: go\n    outputs: [{name: out.txt}]\n",
	})
	data := t.TempDir()
	start := func(pipeline, session string) (*exec.Cmd, *syncBuffer) {
		t.Helper()
		cmd := exec.Command(binary, "run", filepath.Join(dir, pipeline), "--input", filepath.Join(dir, "in.txt"), "--session", session, "--data", data)
		cmd.Env = testEnv(t)
		errb := &syncBuffer{}
		cmd.Stderr = errb
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill() })
		return cmd, errb
	}
	// The owner's own session waits for the release, so the second run
	// surely connects to its server while it runs.
	ownerRelease := filepath.Join(dir, "owner-release")
	writeFiles(t, dir, map[string]string{"owner.yaml": "name: owner\nsteps:\n  only:\n    agent: {backend: exec, command: [sh, slow.sh], env: {RELEASE: " + ownerRelease + "}}\n    prompt: go\n    outputs: [{name: out.txt}]\n"})
	owner, ownerErr := start("owner.yaml", "owner-1")
	eventually(t, 30*time.Second, "the owner's server", func() bool {
		_, err := os.Stat(filepath.Join(data, "nats.url"))
		return err == nil
	})
	second, secondErr := start("slow.yaml", "second-1")
	eventually(t, 30*time.Second, "the second session's job to start", func() bool {
		return count(events(t, []string{"--data", data}, "second-1"), "loopbus.job.started", "") > 0
	})
	// The owner finishes first, while the second is still running.
	if err := os.WriteFile(ownerRelease, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the owner to wait for the other command", func() bool {
		return strings.Contains(ownerErr.String(), "serving until they finish")
	})
	if err := os.WriteFile(release, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 2)
	go func() { done <- second.Wait() }()
	go func() { done <- owner.Wait() }()
	for range 2 {
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("a run failed: %v\nowner:\n%s\nsecond:\n%s", err, ownerErr, secondErr)
			}
		case <-time.After(60 * time.Second):
			t.Fatalf("runs did not finish\nowner:\n%s\nsecond:\n%s", ownerErr, secondErr)
		}
	}
	if !strings.Contains(secondErr.String(), "✓ session second-1 completed") {
		t.Errorf("second run:\n%s", secondErr)
	}
}

// TestExportNamesCannotCollide: an output named like the export's own files
// lands under artifacts/ and leaves session.json and events.jsonl intact.
func TestExportNamesCannotCollide(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{
		"a.sh":   "set -eu\necho PWNED > \"$LOOPBUS_OUTPUT_DIR/session.json\"\necho PWNED > \"$LOOPBUS_OUTPUT_DIR/events.jsonl\"\n",
		"in.txt": "x\n",
		"p.yaml": "name: clash\nsteps:\n  only:\n    agent: {backend: exec, command: [sh, a.sh]}\n    prompt: go\n    outputs: [{name: session.json}, {name: events.jsonl}]\n",
	})
	global := []string{"--data", t.TempDir()}
	if r := loopbus(t, append([]string{"run", filepath.Join(dir, "p.yaml"), "--input", filepath.Join(dir, "in.txt"), "--session", "clash-1"}, global...)...); r.code != 0 {
		t.Fatalf("run: %d %s", r.code, r.stderr)
	}
	out := t.TempDir()
	if r := loopbus(t, append([]string{"export", "clash-1", "--dir", out}, global...)...); r.code != 0 {
		t.Fatalf("export: %d %s", r.code, r.stderr)
	}
	if m := parseManifest(t, mustRead(t, filepath.Join(out, "session.json"))); m.ContentID != "clash-1" {
		t.Errorf("session.json was overwritten: %+v", m)
	}
	if ev := mustRead(t, filepath.Join(out, "events.jsonl")); !strings.Contains(ev, "loopbus.session.started") {
		t.Errorf("events.jsonl was overwritten: %q", ev)
	}
	if a := mustRead(t, filepath.Join(out, "artifacts", "session.json")); a != "PWNED\n" {
		t.Errorf("artifact session.json: %q", a)
	}
}

func mustRead(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
