package e2e

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestAgentCLIsRecordedOutput runs, through every service, Claude Code
// and Codex steps whose CLIs replay what the real CLIs (Claude Code
// 2.1.332, Codex 0.171.0) printed against a scripted model server
// (agent/*/testdata/recorded): a 429 each retried until they gave up, a
// Codex usage limit, a shell command that exited 3, and Codex given the
// --full-auto that Codex 0.171 no longer knows.
func TestAgentCLIsRecordedOutput(t *testing.T) {
	t.Parallel()
	r := newLoopRig(t)
	fake := func(backend string) string {
		p, err := filepath.Abs(filepath.Join("..", "agent", backend, "testdata", "fake-"+backend))
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	sessions := map[string]string{ // session → its agent
		"claude-429":   fmt.Sprintf("{backend: claude, command: [%s], env: {FAKE_CLAUDE_SCENARIO: recorded/rate-limit-429}}", fake("claude")),
		"codex-429":    fmt.Sprintf("{backend: codex, command: [%s], env: {FAKE_CODEX_SCENARIO: recorded/rate-limit-429}}", fake("codex")),
		"codex-usage":  fmt.Sprintf("{backend: codex, command: [%s], env: {FAKE_CODEX_SCENARIO: recorded/usage-limit}}", fake("codex")),
		"claude-exit3": fmt.Sprintf("{backend: claude, command: [%s], env: {FAKE_CLAUDE_SCENARIO: recorded/tool-exit-3}}", fake("claude")),
		"codex-exit3":  fmt.Sprintf("{backend: codex, command: [%s], env: {FAKE_CODEX_SCENARIO: recorded/tool-exit-3}}", fake("codex")),
		"codex-auto":   fmt.Sprintf("{backend: codex, command: [%s], args: [--full-auto]}", fake("codex")),
	}
	files := map[string]string{"input.txt": "x\n"}
	for s, agent := range sessions {
		files[s+".yaml"] = "name: " + s + "\nsteps:\n  work:\n    agent: " + agent +
			"\n    prompt: \"Write out/out.txt.\"\n    outputs: [{name: out.txt}]\n    max_iterations: 1\n"
	}
	writeFiles(t, r.dir, files)
	for s := range sessions {
		r.submit(filepath.Join(r.dir, s+".yaml"), filepath.Join(r.dir, "input.txt"), s)
	}

	// A 429 the CLI gave up on is a rate limit: the step waits instead of
	// using up its iteration; the CLI's retries are counted.
	for _, c := range []struct {
		session     string
		retries     float64
		stop        string
		resetWithin time.Duration // 0: no reset time from the CLI
	}{
		{"claude-429", 10, "api_error", 2 * time.Minute}, // Claude Code's last wait, 35.9 s
		{"codex-429", 5, "", 0},
	} {
		w := r.waitFor(c.session, "step.waiting", "work", 90*time.Second)
		f := ofType(r.sessionEvents(c.session), "job.failed")
		if len(f) != 1 {
			t.Fatalf("%s: %d job.failed", c.session, len(f))
		}
		d := f[0].data
		if stop, _ := d["stopReason"].(string); d["rateLimited"] != true || d["apiRetries"] != c.retries || stop != c.stop {
			t.Errorf("%s: job.failed %v, want rateLimited, %v retries, stop reason %q", c.session, d, c.retries, c.stop)
		}
		if !strings.Contains(d["error"].(string), "429") {
			t.Errorf("%s: error %q does not name the 429", c.session, d["error"])
		}
		_, hasReset := d["resetAt"]
		if hasReset != (c.resetWithin > 0) {
			t.Errorf("%s: resetAt %v, want one: %v", c.session, d["resetAt"], c.resetWithin > 0)
		}
		until, err := time.Parse(time.RFC3339, w.str("until"))
		if err != nil || time.Until(until) > 10*time.Minute {
			t.Errorf("%s: waits until %q (%v)", c.session, w.str("until"), err)
		}
	}

	// A usage limit waits until the time Codex names: the next 6:00 AM
	// local time (the server's resets_at, printed in the machine's zone
	// when it was recorded; read here in this one's).
	w := r.waitFor("codex-usage", "step.waiting", "work", 90*time.Second)
	until, err := time.Parse(time.RFC3339, w.str("until"))
	if err != nil {
		t.Fatal(err)
	}
	if l := until.Local(); l.Hour() != 6 || l.Minute() != 0 || time.Until(until) > 25*time.Hour || time.Until(until) < 0 {
		t.Errorf("codex-usage waits until %s, want the next 6:00 local", l)
	}

	// A command that exited 3 is a failed tool with exit code 3; the run's
	// usage, turns and usage by model (Claude) are the job's.
	for _, c := range []struct {
		session string
		turns   float64
		models  bool
	}{{"claude-exit3", 2, true}, {"codex-exit3", 0, false}} {
		evs := r.completed(c.session)
		tools := ofType(evs, "tool.completed")
		if len(tools) != 1 || tools[0].data["exitCode"] != float64(3) || tools[0].data["status"] != "error" {
			t.Errorf("%s: tool.completed %v, want one with exit code 3", c.session, tools)
		}
		jc := ofType(evs, "job.completed")
		if len(jc) != 1 {
			t.Fatalf("%s: %d job.completed", c.session, len(jc))
		}
		u, _ := jc[0].data["usage"].(map[string]any)
		if u == nil || u["outputTokens"] == nil || (c.turns > 0 && u["turns"] != c.turns) {
			t.Errorf("%s: usage %v", c.session, jc[0].data["usage"])
		}
		if _, ok := u["models"]; ok != c.models {
			t.Errorf("%s: usage by model %v, want it: %v", c.session, u["models"], c.models)
		}
	}

	// --full-auto, in the documented example before, fails the job with
	// Codex's own words.
	f := r.waitFor("codex-auto", "job.failed", "work", 90*time.Second)
	if msg := f.str("error") + f.str("outputTail"); !strings.Contains(msg, "unexpected argument '--full-auto'") {
		t.Errorf("codex with --full-auto: job.failed %v", f.data)
	}
}
