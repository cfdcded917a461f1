package main

import (
	"bytes"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/loopbus/loopbus/projections"
	"github.com/loopbus/loopbus/schemas"
)

// The session of these tests: steps a, b, c and d, a $0.50 budget from the
// pipeline tightened by the session's $0.10 and 100,000 tokens.
const testSession = "s1"

var base = time.Date(2026, 11, 22, 10, 0, 0, 0, time.Local)

// events gives each data a type and the next sequence, a second apart.
type events struct{ evs []schemas.Event }

func (e *events) add(typ, step string, data any) schemas.Event {
	n := len(e.evs) + 1
	ev := schemas.Event{ID: "e" + strconv.Itoa(n), Type: typ, Session: testSession, Step: step,
		Seq: uint64(n), Time: base.Add(time.Duration(n) * time.Second), Data: data}
	e.evs = append(e.evs, ev)
	return ev
}

func started() *events {
	e := &events{}
	steps := []schemas.Step{{Name: "a", MaxIterations: 3}, {Name: "b", MaxIterations: 3}, {Name: "c", MaxIterations: 2}, {Name: "d", MaxIterations: 1}}
	e.add(schemas.TypeSessionStarted, "", &schemas.SessionStarted{
		Pipeline: schemas.Pipeline{Name: "p", Steps: steps, Budget: &schemas.Budget{MaxCostUSD: 0.5}},
		Budget:   &schemas.Budget{MaxCostUSD: 0.10, MaxTokens: 100000},
	})
	return e
}

func (e *events) manifest(t *testing.T) *projections.Manifest {
	t.Helper()
	m := projections.BuildManifest(testSession, e.evs)
	if m == nil {
		t.Fatal("no manifest")
	}
	return m
}

// controlled is a session with a step of each held state.
func controlled() *events {
	e := started()
	e.add(schemas.TypeJobRequested, "a", &schemas.JobRequested{JobID: "ja1", Step: "a", Iteration: 1})
	reset := base.Add(5 * time.Hour)
	e.add(schemas.TypeJobFailed, "a", &schemas.JobFailed{JobID: "ja1", Step: "a", Iteration: 1, Error: "limit", RateLimited: true, ResetAt: &reset,
		Usage: &schemas.Usage{InputTokens: 45000, OutputTokens: 7000, CostUSD: 0.105}})
	e.add(schemas.TypeStepWaiting, "a", &schemas.StepWaiting{Step: "a", JobID: "ja1", Until: reset, Reason: "usage limit"})
	e.add(schemas.TypeStepPaused, "b", &schemas.StepPaused{Step: "b", Kind: schemas.PauseBreaker, Reason: "no progress in 3 iterations"})
	e.add(schemas.TypeJobRequested, "c", &schemas.JobRequested{JobID: "jc1", Step: "c", Iteration: 1})
	e.add(schemas.TypeStepPaused, "c", &schemas.StepPaused{Step: "c", Kind: schemas.PauseStop, Reason: "wrong tone"})
	e.add(schemas.TypeJobCancelled, "c", &schemas.JobCancelled{JobID: "jc1", Step: "c", Iteration: 1, Reason: "step stopped"})
	e.add(schemas.TypeStepPaused, "d", &schemas.StepPaused{Step: "d", Kind: schemas.PauseSignal})
	sig := e.add(schemas.TypeSignalStop, "", &schemas.Signal{Target: testSession, Reason: "enough"})
	e.add(schemas.TypeSessionStopped, "", &schemas.SessionStopped{Kind: schemas.StopBudget, Reason: "cost $0.105 reached the budget of $0.10"})
	e.add(schemas.TypeSignalAcknowledged, "", &schemas.SignalAcknowledged{SignalID: sig.ID, Signal: "stop", Result: schemas.SignalIgnored, Detail: "session already stopped"})
	return e
}

var spaces = regexp.MustCompile(` +`)

func TestPrintManifest(t *testing.T) {
	now := base.Add(time.Minute)
	tests := []struct {
		name    string
		events  func() *events
		now     time.Time
		want    []string
		notWant []string
	}{
		{
			name:   "held steps, budget stop, cost against the budget, signals",
			events: controlled,
			now:    now,
			want: []string{
				"status    stopped by the budget: cost $0.105 reached the budget of $0.10\n",
				"cost      $0.105 of $0.10\n",
				"tokens    45,000 in, 7,000 out (52,000 of 100,000)\n",
				"STEP  STATUS ",
				"a     waiting until 15:00:00 (usage limit)  1/3   45.0k/7.0k     $0.105 ",
				"b     breaker open: no progress in 3 iterations ",
				"c     stopped: wrong tone ",
				"0/2 ",
				"1 job cancelled",
				"d     paused ",
				"stop  enough  ignored: session already stopped",
			},
		},
		{
			name:   "a wait on another day shows the date",
			events: controlled,
			now:    base.Add(-24 * time.Hour),
			want:   []string{"waiting until " + base.Add(5*time.Hour).Format("2006-01-02") + " 15:00:00 (usage limit)"},
		},
		{
			name: "paused, then resumed",
			events: func() *events {
				e := started()
				e.add(schemas.TypeSessionPaused, "", &schemas.SessionPaused{Reason: "lunch"})
				return e
			},
			now:  now,
			want: []string{"status    paused: lunch\n", "cost      $0.00 of $0.10\n", "a     pending  0/3   -              -     "},
		},
		{
			name: "a reason that names the state is not repeated",
			events: func() *events {
				e := started()
				e.add(schemas.TypeSessionStopped, "", &schemas.SessionStopped{Kind: schemas.StopSignal, Reason: "stopped by signal: wrong brief"})
				return e
			},
			now:     now,
			want:    []string{"status    stopped by signal: wrong brief\n"},
			notWant: []string{"stopped: stopped"},
		},
		{
			name: "no usage and no budget: no cost columns",
			events: func() *events {
				e := &events{}
				e.add(schemas.TypeSessionStarted, "", &schemas.SessionStarted{Pipeline: schemas.Pipeline{Name: "p", Steps: []schemas.Step{{Name: "a", MaxIterations: 1}}}})
				e.add(schemas.TypeSessionFailed, "", &schemas.SessionFailed{Reason: "step a failed"})
				return e
			},
			now:     now,
			want:    []string{"status    failed\n", "error     step a failed\n", "STEP  STATUS   ITER  HASH  DETAIL\n"},
			notWant: []string{"cost", "TOKENS", "signals"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var b bytes.Buffer
			if err := printManifest(&b, tc.events().manifest(t), false, tc.now); err != nil {
				t.Fatal(err)
			}
			// Column widths aside: runs of spaces compare as one.
			out := spaces.ReplaceAllString(b.String(), " ")
			for _, w := range tc.want {
				if !strings.Contains(out, spaces.ReplaceAllString(w, " ")) {
					t.Errorf("output lacks %q:\n%s", w, b.String())
				}
			}
			for _, w := range tc.notWant {
				if strings.Contains(out, w) {
					t.Errorf("output has %q:\n%s", w, b.String())
				}
			}
		})
	}
}

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
		{"signal", schemas.TypeSignalInfo, "b", &schemas.Signal{Step: "b", Message: "prefer tables"}, "signal info for b: prefer tables"},
		{"acknowledged", schemas.TypeSignalAcknowledged, "", &schemas.SignalAcknowledged{Signal: "pause", Result: schemas.SignalApplied, Detail: "session paused"}, "signal pause applied: session paused"},
		{"step failed", schemas.TypeStepFailed, "b", &schemas.StepFailed{Step: "b", Iterations: 3, Error: "no valid output"}, "step b failed after 3 iterations: no valid output"},
		{"unknown type", "loopbus.thing.happened", "", nil, "thing.happened"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ev := schemas.Event{Type: tc.typ, Session: testSession, Step: tc.step, Time: base, Data: tc.data}
			if got := describe(ev, m); got != tc.want {
				t.Errorf("describe = %q, want %q", got, tc.want)
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
	if got, want := describe(last(schemas.TypeSessionStopped), m), "session stopped by the budget: cost $0.105 reached the budget of $0.10"; got != want {
		t.Errorf("describe = %q, want %q", got, want)
	}
	if got, want := describe(last(schemas.TypeSessionStarted), m), "session s1 started: pipeline p, 4 steps, budget $0.10, 100,000 tokens"; got != want {
		t.Errorf("describe = %q, want %q", got, want)
	}
	done := e.add(schemas.TypeStepCompleted, "a", &schemas.StepCompleted{Step: "a", Iterations: 2})
	end := e.add(schemas.TypeSessionCompleted, "", &schemas.SessionCompleted{})
	m = e.manifest(t)
	if got, want := describe(done, m), "step a completed after 2 iterations, $0.105"; got != want {
		t.Errorf("describe = %q, want %q", got, want)
	}
	if got, want := describe(end, m), "session s1 completed in 13s, $0.105 of $0.10"; got != want {
		t.Errorf("describe = %q, want %q", got, want)
	}
}

// TestRender checks the live screen: running tools until they complete or
// their job ends, the latest message, step states and the budget.
func TestRender(t *testing.T) {
	e := controlled()
	l := &live{}
	m := (*projections.Manifest)(nil)
	fold := func(ev schemas.Event) {
		m = projections.FoldManifest(m, ev)
		l.fold(ev, m)
	}
	for _, ev := range e.evs {
		fold(ev)
	}
	fold(e.add(schemas.TypeJobRequested, "d", &schemas.JobRequested{JobID: "jd1", Step: "d", Iteration: 1}))
	fold(e.add(schemas.TypeToolStarted, "d", &schemas.ToolStarted{JobID: "jd1", ToolID: "t1", Name: "Bash", Input: `{"command":"make test"}`}))
	fold(e.add(schemas.TypeToolStarted, "d", &schemas.ToolStarted{JobID: "jd1", ToolID: "t2", Name: "Read", Input: `{"file_path":"go.mod"}`}))
	fold(e.add(schemas.TypeToolCompleted, "d", &schemas.ToolCompleted{JobID: "jd1", ToolID: "t2", Name: "Read", Status: "ok"}))
	fold(e.add(schemas.TypeAgentMessage, "d", &schemas.AgentMessage{JobID: "jd1", Text: "Running the tests."}))
	now := base.Add(time.Minute)
	screen := render(l, now, false)
	for _, w := range []string{
		"s1  p  stopped by the budget: cost $0.105 reached the budget of $0.10  59s\n",
		"cost $0.105 of $0.10 · tokens 45,000 in, 7,000 out (52,000 of 100,000)\n",
		"waiting until 15:00:00 (usage limit)",
		"breaker open: no progress in 3 iterations",
		"running tools\n  d#1  Bash  make test  ",
		"latest message  d#1  ",
		"  Running the tests.\n",
		"stop  enough  ignored: session already stopped",
		"Ctrl-C to stop watching",
	} {
		if !strings.Contains(screen, w) {
			t.Errorf("screen lacks %q:\n%s", w, screen)
		}
	}
	if strings.Contains(screen, "go.mod") {
		t.Errorf("a completed tool is shown running:\n%s", screen)
	}
	fold(e.add(schemas.TypeJobFailed, "d", &schemas.JobFailed{JobID: "jd1", Step: "d", Error: "killed", Cancelled: true}))
	if screen := render(l, now, true); strings.Contains(screen, "running tools") || !strings.Contains(screen, "Ctrl-C to stop following") {
		t.Errorf("tools of an ended job are shown running:\n%s", screen)
	}
}

func TestFormats(t *testing.T) {
	tests := []struct {
		name string
		got  string
		want string
	}{
		{"money zero", money(0), "$0.00"},
		{"money small", money(0.004), "$0.004"},
		{"money cents", money(0.0312), "$0.0312"},
		{"money tenths", money(0.105), "$0.105"},
		{"money budget", money(0.5), "$0.50"},
		{"money dollars", money(12.4), "$12.40"},
		{"thousands", thousands(1234567), "1,234,567"},
		{"thousands small", thousands(999), "999"},
		{"thousands negative", thousands(-1234), "-1,234"},
		{"tokens", shortTokens(830), "830"},
		{"tokens k", shortTokens(5120), "5.1k"},
		{"tokens M", shortTokens(2_340_000), "2.3M"},
		{"duration ms", duration(850 * time.Millisecond), "850ms"},
		{"duration s", duration(41300 * time.Millisecond), "41.3s"},
		{"duration m", duration(125 * time.Second), "2m05s"},
		{"duration h", duration(62 * time.Minute), "1h02m"},
		{"one line", oneLine("a\n b  c", 10), "a b c"},
		{"one line cut", oneLine("héllo wörld", 6), "héllo…"},
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

// TestScreen checks the terminal screen: the first frame clears the
// screen, later ones overwrite it in place, a burst of events is drawn at
// most about ten times a second, and the last frame shows the end.
func TestScreen(t *testing.T) {
	var buf bytes.Buffer
	s := newScreen(&buf, false, 80)
	e := started()
	start := time.Now()
	m := projections.FoldManifest(nil, e.evs[0])
	s.event(e.evs[0], m)
	for i := range 200 {
		ev := e.add(schemas.TypeAgentMessage, "a", &schemas.AgentMessage{JobID: "x", Text: "message " + strconv.Itoa(i)})
		m = projections.FoldManifest(m, ev)
		s.event(ev, m)
	}
	end := e.add(schemas.TypeSessionCompleted, "", &schemas.SessionCompleted{})
	m = projections.FoldManifest(m, end)
	s.event(end, m)
	s.close()
	elapsed := time.Since(start)
	out := buf.String()
	frames := strings.Count(out, "\x1b[H")
	// One frame at once, then one per tick at most, and the last one.
	if limit := 2 + int(elapsed/redrawEvery) + 1; frames > limit {
		t.Errorf("%d frames for 202 events in %s, want at most %d", frames, elapsed, limit)
	}
	if !strings.HasPrefix(out, "\x1b[H\x1b[2J") || strings.Count(out, "\x1b[2J") != 1 {
		t.Errorf("the first frame, and only it, must clear the screen: %q…", out[:min(len(out), 40)])
	}
	last := out[strings.LastIndex(out, "\x1b[H"):]
	if !strings.Contains(last, "s1  p  completed") || !strings.Contains(last, "message 199") || !strings.HasSuffix(last, "\x1b[J") {
		t.Errorf("last frame:\n%s", last)
	}
	for _, line := range strings.Split(last, "\n") {
		if n := len([]rune(strings.TrimSuffix(strings.TrimPrefix(line, "\x1b[H"), "\x1b[K"))); n > 80 {
			t.Errorf("line of %d runes on an 80-column screen: %q", n, line)
		}
	}
}
