package claude

import (
	"strings"
	"testing"
	"time"

	"github.com/loopbus/loopbus/agent"
)

// kindsOf returns the kinds of obs, in order.
func kindsOf(obs []agent.Event) []agent.Kind {
	kinds := make([]agent.Kind, len(obs))
	for i, o := range obs {
		kinds[i] = o.Kind
	}
	return kinds
}

// eventsOf returns the events of obs of kind k.
func eventsOf(obs []agent.Event, k agent.Kind) []agent.Event {
	var out []agent.Event
	for _, o := range obs {
		if o.Kind == k {
			out = append(out, o)
		}
	}
	return out
}

// TestRecordedRateLimit429: Claude Code 2.1.332 retried a 429 ten times
// (system/api_retry) and gave up with an error result: a rate limit, to
// be tried again after its last wait, and ten retries.
func TestRecordedRateLimit429(t *testing.T) {
	obs, code, _ := runFakeClaude(t, "recorded/rate-limit-429", "say hi")
	if code != 1 {
		t.Errorf("exit code %d, want 1", code)
	}
	retries := eventsOf(obs, agent.KindRetry)
	if len(retries) != 10 {
		t.Fatalf("%d retries, want 10: %v", len(retries), kindsOf(obs))
	}
	if want := "the API answered 429 rate_limit: retry 10 of 10 in 35.9s"; retries[9].Text != want {
		t.Errorf("last retry %q, want %q", retries[9].Text, want)
	}
	limits := eventsOf(obs, agent.KindRateLimit)
	if len(limits) != 1 {
		t.Fatalf("%d rate limits, want 1: %v", len(limits), kindsOf(obs))
	}
	if !strings.Contains(limits[0].Text, "Request rejected (429)") {
		t.Errorf("rate limit text %q", limits[0].Text)
	}
	// The parser's clock reads claudeT0 at the result; the last retry
	// waited 35,928 ms.
	if want := claudeT0.Add(35928 * time.Millisecond).UTC(); !limits[0].ResetAt.Equal(want) {
		t.Errorf("ResetAt %v, want %v", limits[0].ResetAt, want)
	}
	if f := eventsOf(obs, agent.KindFailure); len(f) != 1 {
		t.Errorf("%d failures, want 1", len(f))
	}
	if s := eventsOf(obs, agent.KindStop); len(s) != 1 || s[0].Text != "api_error" {
		t.Errorf("stop %+v, want api_error", s)
	}
	if u := eventsOf(obs, agent.KindUnknown); len(u) != 0 {
		t.Errorf("unknown lines %+v", u)
	}
}

// TestRecordedRateLimitNoRetry: a 429 Claude Code does not retry is a rate
// limit without a reset time (the orchestrator waits its default).
func TestRecordedRateLimitNoRetry(t *testing.T) {
	obs, code, _ := runFakeClaude(t, "recorded/rate-limit-429-no-retry", "say hi")
	if code != 1 {
		t.Errorf("exit code %d, want 1", code)
	}
	if r := eventsOf(obs, agent.KindRetry); len(r) != 0 {
		t.Errorf("%d retries, want none", len(r))
	}
	limits := eventsOf(obs, agent.KindRateLimit)
	if len(limits) != 1 || !limits[0].ResetAt.IsZero() {
		t.Errorf("rate limits %+v, want one without a reset time", limits)
	}
}

// TestRecordedToolExit3: a Bash command that exited 3 is a failed tool
// with exit code 3; the result's usage by model, turns and terminal
// reason are read.
func TestRecordedToolExit3(t *testing.T) {
	obs, code, _ := runFakeClaude(t, "recorded/tool-exit-3", "run the tests")
	if code != 0 {
		t.Errorf("exit code %d, want 0", code)
	}
	ends := eventsOf(obs, agent.KindToolEnd)
	if len(ends) != 1 {
		t.Fatalf("%d tool ends, want 1: %v", len(ends), kindsOf(obs))
	}
	if e := ends[0]; e.Name != "Bash" || !e.IsError || e.ExitCode != 3 || !strings.Contains(e.Output, "FAIL: TestX") {
		t.Errorf("tool end %+v, want Bash failed with exit code 3", e)
	}
	usage := eventsOf(obs, agent.KindUsage)
	if len(usage) != 1 {
		t.Fatalf("%d usage events, want 1", len(usage))
	}
	want := agent.Usage{InputTokens: 2400, OutputTokens: 52, CacheReadTokens: 1800, CacheWriteTokens: 600, Turns: 2, CostUSD: 0.01077}
	if usage[0].Usage != want {
		t.Errorf("usage %+v, want %+v", usage[0].Usage, want)
	}
	m, ok := usage[0].Models["claude-sonnet-4-5"]
	if len(usage[0].Models) != 1 || !ok || m.InputTokens != 2400 || m.CacheWriteTokens != 600 || m.CostUSD != 0.01077 {
		t.Errorf("usage by model %+v", usage[0].Models)
	}
	if s := eventsOf(obs, agent.KindStop); len(s) != 1 || s[0].Text != "completed" {
		t.Errorf("stop %+v, want completed", s)
	}
	if f := eventsOf(obs, agent.KindFailure); len(f) != 0 {
		t.Errorf("failures %+v, want none", f)
	}
}
