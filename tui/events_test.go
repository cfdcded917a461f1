package tui

import (
	"strings"
	"testing"
	"time"

	"github.com/loopbus/loopbus/projections"
	"github.com/loopbus/loopbus/schemas"
)

func TestDescribe(t *testing.T) {
	e := started()
	// The job must be known for its events to be tagged step#iteration.
	e.add(schemas.TypeJobRequested, "a", &schemas.JobRequested{JobID: "ja2", Step: "a", Iteration: 2, Round: 1, Hints: []string{"h"}})
	m := e.manifest(t)
	reset := time.Date(2026, 11, 22, 15, 0, 0, 0, time.Local)
	tests := []struct {
		name string
		typ  string
		step string
		data any
		want string
	}{
		{"requested", schemas.TypeJobRequested, "a", &schemas.JobRequested{JobID: "ja2", Step: "a", Iteration: 2, Round: 1, Hints: []string{"h"}}, "a#2 queued (round 1, with 1 hint)"},
		{"claude tool input", schemas.TypeToolStarted, "a", &schemas.ToolStarted{JobID: "ja2", ToolID: "t", Name: "Bash", Input: `{"command":"ls -la","description":"List"}`}, "a#2 tool Bash started: ls -la"},
		{"plain tool input", schemas.TypeToolStarted, "a", &schemas.ToolStarted{JobID: "ja2", ToolID: "t", Name: "sh", Input: "sh run.sh"}, "a#2 tool sh started: sh run.sh"},
		{"tool error shows its output", schemas.TypeToolCompleted, "a", &schemas.ToolCompleted{JobID: "ja2", ToolID: "t", Name: "Edit", Status: "error", DurationMs: 1200, Output: "File has not\nbeen read"}, "a#2 tool Edit error after 1.2s: File has not been read"},
		{"message", schemas.TypeAgentMessage, "a", &schemas.AgentMessage{JobID: "ja2", Text: "Done.\nBye."}, "a#2 says: Done. Bye."},
		{"job done with usage", schemas.TypeJobCompleted, "a", &schemas.JobCompleted{JobID: "ja2", DurationMs: 41300, Usage: &schemas.Usage{InputTokens: 5120, OutputTokens: 830, CostUSD: 0.0312}}, "a#2 agent done after 41.3s, 5.1k in / 830 out tokens, $0.0312"},
		{"kill report", schemas.TypeJobFailed, "a", &schemas.JobFailed{JobID: "ja2", Cancelled: true}, "a#2 agent killed: the job was cancelled"},
		{"rate limited", schemas.TypeJobFailed, "a", &schemas.JobFailed{JobID: "ja2", RateLimited: true, ResetAt: &reset, Error: "limit reached"}, "a#2 agent hit a usage or rate limit (lifts at 15:00:00): limit reached"},
		{"cancelled", schemas.TypeJobCancelled, "a", &schemas.JobCancelled{JobID: "ja2", Step: "a", Iteration: 2, Reason: "session stopped"}, "a#2 job cancelled: session stopped"},
		{"unknown job", schemas.TypeJobStarted, "b", &schemas.JobStarted{JobID: "zzzzzzzzzz", Worker: "w"}, "b running on w"},
		{"waiting", schemas.TypeStepWaiting, "a", &schemas.StepWaiting{Step: "a", Until: reset, Reason: "usage limit"}, "step a waiting until 15:00:00 (usage limit)"},
		{"breaker", schemas.TypeStepPaused, "b", &schemas.StepPaused{Step: "b", Kind: schemas.PauseBreaker, Reason: "same failure 3 times"}, "step b breaker open: same failure 3 times"},
		{"stopped step", schemas.TypeStepPaused, "b", &schemas.StepPaused{Step: "b", Kind: schemas.PauseStop, Reason: "wrong"}, "step b stopped: wrong"},
		{"resumed step", schemas.TypeStepResumed, "b", &schemas.StepResumed{Step: "b"}, "step b resumed"},
		{"invalidated", schemas.TypeStepInvalidated, "b", &schemas.StepInvalidated{Step: "b", Cause: "a", Reason: "input changed"}, "step b invalidated (by a): input changed; it runs again from iteration 1"},
		{"signal", schemas.TypeSignalInfo, "b", &schemas.Signal{Step: "b", Message: "prefer tables"}, "signal hint for b: prefer tables"},
		{"acknowledged", schemas.TypeSignalAcknowledged, "", &schemas.SignalAcknowledged{Signal: "pause", Result: schemas.SignalApplied, Detail: "session paused"}, "signal pause applied: session paused"},
		{"step failed", schemas.TypeStepFailed, "b", &schemas.StepFailed{Step: "b", Iterations: 3, Error: "no valid output"}, "step b failed after 3 iterations: no valid output"},
		{"unknown type", "loopbus.thing.happened", "", nil, "thing.happened"},
		{"awaiting approval", schemas.TypeApprovalRequested, "a", &schemas.ApprovalRequested{Step: "a", JobID: "ja2", Iteration: 2, Until: &reset, OnTimeout: "reject"},
			"step a awaiting approval until 15:00:00 (then reject): loopbus approve|reject " + testSession + "/a"},
		{"approval expired", schemas.TypeApprovalExpired, "a", &schemas.ApprovalExpired{Step: "a", JobID: "ja2", Iteration: 2, OnTimeout: "fail", Reason: "no approval within 1h0m0s"},
			"step a approval timed out (fail): no approval within 1h0m0s"},
		{"reject", schemas.TypeSignalReject, "a", &schemas.Signal{Step: "a", Reason: "too long", By: "bob"}, "signal reject for a by bob: too long"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ev := schemas.Event{Type: tc.typ, Session: testSession, Step: tc.step, Time: base, Data: tc.data}
			if got := Describe(ev, m); got != tc.want {
				t.Errorf("Describe = %q, want %q", got, tc.want)
			}
		})
	}
}

// TestDescribeAfterFold checks the lines that read the manifest after
// their event: session states, step and session costs.
func TestDescribeAfterFold(t *testing.T) {
	e := controlled()
	m := e.manifest(t)
	last := func(typ string) schemas.Event {
		for i := len(e.evs) - 1; i >= 0; i-- {
			if e.evs[i].Type == typ {
				return e.evs[i]
			}
		}
		t.Fatalf("no %s", typ)
		return schemas.Event{}
	}
	if got, want := Describe(last(schemas.TypeSessionStopped), m), "session stopped by the budget: cost $0.105 reached the budget of $0.10"; got != want {
		t.Errorf("Describe = %q, want %q", got, want)
	}
	if got, want := Describe(last(schemas.TypeSessionStarted), m), "session s1 started: pipeline p, 4 steps, budget $0.10, 100,000 tokens"; got != want {
		t.Errorf("Describe = %q, want %q", got, want)
	}
	done := e.add(schemas.TypeStepCompleted, "a", &schemas.StepCompleted{Step: "a", Iterations: 2})
	end := e.add(schemas.TypeSessionCompleted, "", &schemas.SessionCompleted{})
	m = e.manifest(t)
	if got, want := Describe(done, m), "step a completed after 2 iterations, $0.105"; got != want {
		t.Errorf("Describe = %q, want %q", got, want)
	}
	if got, want := Describe(end, m), "session s1 completed in 13s, $0.105 of $0.10"; got != want {
		t.Errorf("Describe = %q, want %q", got, want)
	}
}

func TestFormats(t *testing.T) {
	tests := []struct {
		name string
		got  string
		want string
	}{
		{"money zero", Money(0), "$0.00"},
		{"money small", Money(0.004), "$0.004"},
		{"money cents", Money(0.0312), "$0.0312"},
		{"money tenths", Money(0.105), "$0.105"},
		{"money budget", Money(0.5), "$0.50"},
		{"money dollars", Money(12.4), "$12.40"},
		{"thousands", Thousands(1234567), "1,234,567"},
		{"thousands small", Thousands(999), "999"},
		{"thousands negative", Thousands(-1234), "-1,234"},
		{"tokens", ShortTokens(830), "830"},
		{"tokens k", ShortTokens(5120), "5.1k"},
		{"tokens M", ShortTokens(2_340_000), "2.3M"},
		{"duration ms", Duration(850 * time.Millisecond), "850ms"},
		{"duration s", Duration(41300 * time.Millisecond), "41.3s"},
		{"duration m", Duration(125 * time.Second), "2m05s"},
		{"duration h", Duration(62 * time.Minute), "1h02m"},
		{"one line", OneLine("a\n b  c", 10), "a b c"},
		{"one line cut", OneLine("héllo wörld", 6), "héllo…"},
		{"cut", cut("abcdef", 4), "abc…"},
		{"tool input argv", toolInput(`{"command":["bash","-lc","ls"]}`), "bash -lc ls"},
		{"tool input other JSON", toolInput(`{"x":1}`), `{"x":1}`},
		{"tool input truncated JSON", toolInput(`{"command":"ls`), `{"command":"ls`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.got != tc.want {
				t.Errorf("got %q, want %q", tc.got, tc.want)
			}
		})
	}
}

func TestEventLine(t *testing.T) {
	e := started()
	ev := e.add(schemas.TypeJobRequested, "a", &schemas.JobRequested{JobID: "ja1", Step: "a", Iteration: 1})
	want := ev.Time.Local().Format("15:04:05") + " a#1 queued"
	if got := EventLine(ev, e.manifest(t)); got != want {
		t.Errorf("EventLine = %q, want %q", got, want)
	}
}

// TestProgress checks the lines of run and wait without a terminal, byte
// for byte: long texts are cut by bytes, as they always were.
func TestProgress(t *testing.T) {
	e := started()
	var b strings.Builder
	p := NewProgress(&b)
	var m *projections.Manifest
	add := func(typ, step string, data any) {
		ev := e.add(typ, step, data)
		m = projections.FoldManifest(projections.BuildManifest(testSession, e.evs[:len(e.evs)-1]), ev)
		p.Event(ev, m)
	}
	add(schemas.TypeJobRequested, "a", &schemas.JobRequested{JobID: "ja1", Step: "a", Iteration: 1})
	add(schemas.TypeJobStarted, "a", &schemas.JobStarted{JobID: "ja1", Worker: "w1", Delivery: 2})
	add(schemas.TypeToolStarted, "a", &schemas.ToolStarted{JobID: "ja1", ToolID: "t", Name: "sh"})
	add(schemas.TypeJobFailed, "a", &schemas.JobFailed{JobID: "ja1", Step: "a", Iteration: 1, Error: strings.Repeat("é", 70)})
	add(schemas.TypeStepCompleted, "a", &schemas.StepCompleted{JobID: "ja1", Step: "a", Iterations: 1, ContentHash: "abc"})
	ts := func(n int) string { return base.Add(time.Duration(n) * time.Second).Local().Format("15:04:05") }
	want := ts(2) + "  → a: iteration 1 queued\n" +
		ts(3) + "    a: running on w1 (delivery 2: an earlier worker did not finish)\n" +
		ts(5) + "  ✗ a: iteration 1 failed: " + strings.Repeat("é", 60) + "…\n" +
		ts(6) + "  ✓ a completed in 4s (iterations 1, hash abc)\n"
	if got := b.String(); got != want {
		t.Errorf("progress:\n%s\nwant:\n%s", got, want)
	}
}

// TestDescribeFork: a copy in a fork's history says what the original
// said, marked as copied; session.forked names the origin and the point,
// and what the fork keeps and runs.
func TestDescribeFork(t *testing.T) {
	e := controlled()
	var started schemas.Event
	for i, ev := range e.evs {
		// A fork's history: copies of the origin's events, then
		// session.forked.
		e.evs[i].ForkOf = "orig-" + ev.ID
		if ev.Type == schemas.TypeSessionStarted {
			started = ev
		}
	}
	d := started.Data.(*schemas.SessionStarted)
	forked := e.add(schemas.TypeSessionForked, "", &schemas.SessionForked{Origin: "o1", Seq: 7, Event: "e7", Copied: 7, Pipeline: d.Pipeline, Input: d.Input, SourceHash: d.SourceHash})
	m := e.manifest(t)
	copied := started
	copied.ForkOf = "e1"
	if got, want := Describe(copied, m), "copied: session s1 started: pipeline p, 4 steps"; !strings.HasPrefix(got, want) {
		t.Errorf("Describe(copy) = %q, want it to begin with %q", got, want)
	}
	if got, want := Describe(forked, m), "session s1 forked from o1 at stream seq 7: pipeline p, 0 steps kept, 4 to run"; got != want {
		t.Errorf("Describe(session.forked) = %q, want %q", got, want)
	}
}
