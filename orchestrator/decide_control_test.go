package orchestrator

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/loopbus/loopbus/schemas"
)

// The specification of signals, budgets, rate-limit waits and the circuit
// breaker: given events → the events Decide returns, written one line per
// event (see line).

func signal(n int, verb, step string, msg ...string) schemas.Event {
	target := sess
	if step != "" {
		target += "/" + step
	}
	d := &schemas.Signal{Target: target, Step: step, Reason: "test"}
	if len(msg) > 0 {
		d.Message = msg[0]
	}
	return schemas.Event{ID: fmt.Sprintf("sig-%d", n), Type: schemas.SignalTypes()[verb], Session: sess, Step: step, Data: d}
}

func withUsage(ev schemas.Event, cost float64, tokens int64) schemas.Event {
	u := &schemas.Usage{InputTokens: tokens, CostUSD: cost}
	switch d := ev.Data.(type) {
	case *schemas.JobFailed:
		c := *d
		c.Usage = u
		ev.Data = &c
	case *schemas.JobCompleted:
		c := *d
		c.Usage = u
		ev.Data = &c
	}
	return ev
}

func jobCompleted(step string, iteration int) schemas.Event {
	return schemas.Event{
		ID: fmt.Sprintf("completed-%s-%d", step, iteration), Type: schemas.TypeJobCompleted, Session: sess, Step: step, Job: jid(step, iteration),
		Data: &schemas.JobCompleted{JobID: jid(step, iteration), Step: step, Iteration: iteration, Worker: "w1"},
	}
}

func rateLimited(step string, iteration int, reset *time.Time) schemas.Event {
	ev := jobFailed(step, iteration, "usage limit reached", "")
	d := *ev.Data.(*schemas.JobFailed)
	d.RateLimited, d.ResetAt = true, reset
	ev.Data = &d
	return ev
}

func withArtifacts(ev schemas.Event, arts ...schemas.ArtifactRef) schemas.Event {
	d := *ev.Data.(*schemas.Verdict)
	d.Artifacts = arts
	ev.Data = &d
	return ev
}

// line renders an event as one line with what the tables check.
func line(ev schemas.Event) string {
	typ := strings.TrimPrefix(ev.Type, "loopbus.")
	switch d := ev.Data.(type) {
	case *schemas.JobRequested:
		s := fmt.Sprintf("%s %s", typ, d.JobID)
		if len(d.Hints) > 0 {
			s += fmt.Sprintf(" hints=%q", d.Hints)
		}
		return s
	case *schemas.JobCancelled:
		return fmt.Sprintf("%s %s: %s", typ, d.JobID, d.Reason)
	case *schemas.SignalAcknowledged:
		return fmt.Sprintf("%s %s %s %s: %s", typ, d.SignalID, d.Signal, d.Result, d.Detail)
	case *schemas.SessionStopped:
		return fmt.Sprintf("%s %s: %s", typ, d.Kind, d.Reason)
	case *schemas.StepPaused:
		return fmt.Sprintf("%s %s %s: %s", typ, d.Step, d.Kind, d.Reason)
	case *schemas.StepWaiting:
		return fmt.Sprintf("%s %s until %s", typ, d.Step, d.Until.Format(time.RFC3339))
	case *schemas.StepInvalidated:
		return fmt.Sprintf("%s %s (cause %s)", typ, d.Step, d.Cause)
	case *schemas.StepResumed:
		return typ + " " + d.Step
	case *schemas.StepCompleted:
		return fmt.Sprintf("%s %s after %d", typ, d.Step, d.Iterations)
	case *schemas.StepFailed:
		return fmt.Sprintf("%s %s: %s", typ, d.Step, d.Error)
	}
	return typ
}

type controlCase struct {
	name  string
	given []schemas.Event
	now   time.Time // fixedNow when zero
	want  []string
}

func runControl(t *testing.T, cases []controlCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var got []schemas.Event
			if tc.now.IsZero() {
				got = runDecide(t, tc.given)
			} else {
				st := fold(t, tc.given)
				got = Decide(st, tc.given[len(tc.given)-1], tc.now)
			}
			lines := make([]string, len(got))
			ids := map[string]bool{}
			for i, ev := range got {
				lines[i] = line(ev)
				if ids[ev.ID] {
					t.Errorf("id %s used twice", ev.ID)
				}
				ids[ev.ID] = true
			}
			if strings.Join(lines, "\n") != strings.Join(tc.want, "\n") {
				t.Errorf("got:\n  %s\nwant:\n  %s", strings.Join(lines, "\n  "), strings.Join(tc.want, "\n  "))
			}
		})
	}
}

// cancelledEv is the job.cancelled the orchestrator emitted for a job.
func cancelledEv(step string, iteration int) schemas.Event {
	return schemas.Event{ID: "cancel-" + jid(step, iteration), Type: schemas.TypeJobCancelled, Session: sess, Step: step,
		Data: &schemas.JobCancelled{JobID: jid(step, iteration), Step: step, Iteration: iteration, Reason: "stop"}}
}

func ackEv(sig schemas.Event, result string) schemas.Event {
	d := sig.Data.(*schemas.Signal)
	return schemas.Event{ID: "ack-" + sig.ID, Type: schemas.TypeSignalAcknowledged, Session: sess, Step: d.Step,
		Data: &schemas.SignalAcknowledged{SignalID: sig.ID, Signal: strings.TrimPrefix(sig.Type, "loopbus.signal."), Step: d.Step, Result: result}}
}

func control(typ string, data any) schemas.Event {
	return schemas.Event{ID: "fact-" + typ + fmt.Sprint(data), Type: typ, Session: sess, Data: data}
}

// requestedRound is a job.requested of a later round (after a stop or an
// invalidation).
func requestedRound(step string, iteration, round int) schemas.Event {
	ev := requested(step, iteration)
	job := JobID(sess, step, iteration, 1, round)
	ev.ID, ev.Job = "req-"+job, job
	d := *ev.Data.(*schemas.JobRequested)
	d.JobID, d.Round = job, round
	ev.Data = &d
	return ev
}

func TestDecideSignals(t *testing.T) {
	single := promptPipeline("Do {{.Input.Name}}", 5)
	chain := chainPipeline()
	diamond := diamondPipeline()
	stop := signal(1, "stop", "")
	pause := signal(2, "pause", "")
	runControl(t, []controlCase{
		{
			name:  "stop cancels the job in flight and stops the session",
			given: []schemas.Event{started(single), requested("p", 1), stop},
			want: []string{
				"job.cancelled s1.p.1: stop signal: test",
				"session.stopped signal: stopped by signal: test",
				"signal.acknowledged sig-1 stop applied: session stopped; cancelled job s1.p.1",
			},
		},
		{
			name: "a stopped session ignores the cancelled job's late result",
			given: []schemas.Event{started(single), requested("p", 1), stop, cancelledEv("p", 1),
				control(schemas.TypeSessionStopped, &schemas.SessionStopped{Kind: "signal", Reason: "x"}), ackEv(stop, "applied"), passed("p", 1)},
			want: nil,
		},
		{
			name: "resume runs the cancelled iteration again in a new round",
			given: []schemas.Event{started(single), requested("p", 1), stop, cancelledEv("p", 1),
				control(schemas.TypeSessionStopped, &schemas.SessionStopped{Kind: "signal", Reason: "x"}), ackEv(stop, "applied"), signal(3, "resume", "")},
			want: []string{
				"session.resumed",
				"signal.acknowledged sig-3 resume applied: resumed session",
				"job.requested s1.p.1.r1",
			},
		},
		{
			name: "a second stop is acknowledged as ignored",
			given: []schemas.Event{started(single), requested("p", 1), stop, cancelledEv("p", 1),
				control(schemas.TypeSessionStopped, &schemas.SessionStopped{Kind: "signal", Reason: "x"}), ackEv(stop, "applied"), signal(4, "stop", "")},
			want: []string{"signal.acknowledged sig-4 stop ignored: session already stopped"},
		},
		{
			name:  "pause: nothing new is dispatched, results are still recorded",
			given: []schemas.Event{started(chain), requested("summary", 1), pause, control(schemas.TypeSessionPaused, &schemas.SessionPaused{}), ackEv(pause, "applied"), passed("summary", 1, art("summary", "summary.json"))},
			want:  []string{"step.completed summary after 1"},
		},
		{
			name:  "pause is acknowledged",
			given: []schemas.Event{started(chain), requested("summary", 1), pause},
			want: []string{
				"session.paused",
				"signal.acknowledged sig-2 pause applied: session paused; running jobs finish, nothing new is dispatched",
			},
		},
		{
			name: "resume after pause dispatches the next step",
			given: []schemas.Event{started(chain), requested("summary", 1), pause, control(schemas.TypeSessionPaused, &schemas.SessionPaused{}), ackEv(pause, "applied"),
				passed("summary", 1, art("summary", "summary.json")), stepCompleted("summary", 1, art("summary", "summary.json")), signal(5, "resume", "")},
			want: []string{"session.resumed", "signal.acknowledged sig-5 resume applied: resumed session", "job.requested s1.ideas.1"},
		},
		{
			name:  "pause one step: its next iteration waits",
			given: []schemas.Event{started(single), requested("p", 1), control(schemas.TypeStepPaused, &schemas.StepPaused{Step: "p", Kind: "pause", Reason: "x"}), rejected("p", 1, "fix it")},
			want:  nil,
		},
		{
			name: "resume the step: the next iteration runs",
			given: []schemas.Event{started(single), requested("p", 1), control(schemas.TypeStepPaused, &schemas.StepPaused{Step: "p", Kind: "pause", Reason: "x"}),
				rejected("p", 1, "fix it"), signal(7, "resume", "p")},
			want: []string{"step.resumed p", "signal.acknowledged sig-7 resume applied: resumed step p", "job.requested s1.p.2"},
		},
		{
			name:  "stop one step: its job is cancelled and the step held",
			given: []schemas.Event{started(single), requested("p", 1), signal(8, "stop", "p")},
			want: []string{
				"job.cancelled s1.p.1: stop signal: test",
				"step.paused p stop: stopped by signal: test",
				"signal.acknowledged sig-8 stop applied: step p stopped; cancelled job s1.p.1",
			},
		},
		{
			name:  "info: acknowledged, then the hint rides the next job",
			given: []schemas.Event{started(single), requested("p", 1), signal(9, "info", "", "use tabs")},
			want:  []string{"signal.acknowledged sig-9 info applied: added to the next prompt of step p"},
		},
		{
			name:  "info reaches the next iteration",
			given: []schemas.Event{started(single), requested("p", 1), signal(9, "info", "", "use tabs"), ackEv(signal(9, "info", "", "use tabs"), "applied"), rejected("p", 1, "again")},
			want:  []string{`job.requested s1.p.2 hints=["use tabs"]`},
		},
		{
			name:  "info without a message is ignored",
			given: []schemas.Event{started(single), requested("p", 1), signal(10, "info", "")},
			want:  []string{"signal.acknowledged sig-10 info ignored: an info signal needs a message"},
		},
		{
			name: "invalidate re-runs the step and its dependents",
			given: []schemas.Event{started(diamond), requested("a", 1), passed("a", 1, art("a", "a.json")), stepCompleted("a", 1, art("a", "a.json")),
				requested("b", 1), requested("c", 1), passed("b", 1, art("b", "b.json")), stepCompleted("b", 1, art("b", "b.json")), signal(11, "invalidate", "b")},
			want: []string{
				"step.invalidated b (cause b)",
				"step.invalidated d (cause b)",
				"signal.acknowledged sig-11 invalidate applied: runs again: b, d",
				"job.requested s1.b.1.r1",
			},
		},
		{
			name: "invalidate the root: dependents in flight are cancelled",
			given: []schemas.Event{started(diamond), requested("a", 1), passed("a", 1, art("a", "a.json")), stepCompleted("a", 1, art("a", "a.json")),
				requested("b", 1), requested("c", 1), signal(12, "invalidate", "a")},
			want: []string{
				"step.invalidated a (cause a)",
				"job.cancelled s1.b.1: step a invalidated: test",
				"step.invalidated b (cause a)",
				"job.cancelled s1.c.1: step a invalidated: test",
				"step.invalidated c (cause a)",
				"step.invalidated d (cause a)",
				"signal.acknowledged sig-12 invalidate applied: runs again: a, b, c, d",
				"job.requested s1.a.1.r1",
			},
		},
		{
			name:  "a signal for a finished session is ignored",
			given: []schemas.Event{started(single), sessionFailedEv("x"), signal(13, "stop", "")},
			want:  []string{"signal.acknowledged sig-13 stop ignored: session s1 already failed"},
		},
		{
			name:  "a signal for an unknown step is ignored",
			given: []schemas.Event{started(single), signal(14, "pause", "nope")},
			want:  []string{"signal.acknowledged sig-14 pause ignored: session s1 has no step nope", "job.requested s1.p.1"},
		},
		{
			name:  "signals given while the orchestrator was away are answered in order",
			given: []schemas.Event{started(single), requested("p", 1), pause, signal(15, "resume", "")},
			want: []string{
				"session.paused",
				"signal.acknowledged sig-2 pause applied: session paused; running jobs finish, nothing new is dispatched",
				"session.resumed",
				"signal.acknowledged sig-15 resume applied: resumed session",
			},
		},
	})
}

func TestDecideResumeRound(t *testing.T) {
	// After stop and resume, the new round's job is the current one: its
	// verdict completes the step.
	single := promptPipeline("Do {{.Input.Name}}", 5)
	given := []schemas.Event{started(single), requested("p", 1), cancelledEv("p", 1), requestedRound("p", 1, 1)}
	ev := passed("p", 1, art("p", "p.json"))
	ev.Job = JobID(sess, "p", 1, 1, 1)
	d := *ev.Data.(*schemas.Verdict)
	d.JobID = ev.Job
	ev.Data = &d
	runControl(t, []controlCase{
		{name: "the new round's verdict completes the step", given: append(given, ev), want: []string{"step.completed p after 1", "session.completed"}},
		{name: "the old round's verdict is stale", given: append(given, passed("p", 1, art("p", "p.json"))), want: nil},
	})
}

func TestDecideBudget(t *testing.T) {
	withBudget := func(p schemas.Pipeline, b schemas.Budget) schemas.Pipeline {
		p.Budget = &b
		return p
	}
	single := withBudget(promptPipeline("Do {{.Input.Name}}", 5), schemas.Budget{MaxCostUSD: 0.5})
	diamond := withBudget(diamondPipeline(), schemas.Budget{MaxTokens: 1000})
	runs := withBudget(promptPipeline("Do {{.Input.Name}}", 5), schemas.Budget{MaxIterations: 2})
	runControl(t, []controlCase{
		{
			name:  "under budget: the next iteration runs",
			given: []schemas.Event{started(single), requested("p", 1), withUsage(jobCompleted("p", 1), 0.2, 100), rejected("p", 1, "again")},
			want:  []string{"job.requested s1.p.2"},
		},
		{
			name:  "cost reached: the session stops instead",
			given: []schemas.Event{started(single), requested("p", 1), withUsage(jobCompleted("p", 1), 0.6, 100), rejected("p", 1, "again")},
			want:  []string{"session.stopped budget: budget: cost $0.6000 reached max_cost_usd $0.5000"},
		},
		{
			name: "a job reporting twice counts once",
			given: []schemas.Event{started(single), requested("p", 1), withUsage(jobCompleted("p", 1), 0.3, 100),
				withUsage(jobCompleted("p", 1), 0.3, 100), rejected("p", 1, "again")},
			want: []string{"job.requested s1.p.2"},
		},
		{
			name: "tokens reached: a passed step is kept, the job in flight cancelled",
			given: []schemas.Event{started(diamond), requested("a", 1), passed("a", 1, art("a", "a.json")), stepCompleted("a", 1, art("a", "a.json")),
				requested("b", 1), requested("c", 1), withUsage(jobCompleted("b", 1), 0, 1200), passed("b", 1, art("b", "b.json"))},
			want: []string{
				"step.completed b after 1",
				"job.cancelled s1.c.1: budget: 1200 tokens reached max_tokens 1000",
				"session.stopped budget: budget: 1200 tokens reached max_tokens 1000",
			},
		},
		{
			name:  "total agent runs reached",
			given: []schemas.Event{started(runs), requested("p", 1), rejected("p", 1, "a"), requested("p", 2), rejected("p", 2, "b")},
			want:  []string{"session.stopped budget: budget: 2 agent runs reached max_iterations 2"},
		},
		{
			name: "resume is refused while the budget is spent",
			given: []schemas.Event{started(runs), requested("p", 1), rejected("p", 1, "a"), requested("p", 2), rejected("p", 2, "b"),
				control(schemas.TypeSessionStopped, &schemas.SessionStopped{Kind: schemas.StopBudget, Reason: "x"}), signal(1, "resume", "")},
			want: []string{"signal.acknowledged sig-1 resume ignored: the budget is still exhausted (2 agent runs reached max_iterations 2); raise it with loopbus budget s1, or close the session with loopbus close s1"},
		},
	})
	// The session's own budget tightens the pipeline's.
	ev := started(promptPipeline("Do {{.Input.Name}}", 5))
	d := *ev.Data.(*schemas.SessionStarted)
	d.Budget = &schemas.Budget{MaxCostUSD: 0.1}
	ev.Data = &d
	runControl(t, []controlCase{{
		name:  "session budget",
		given: []schemas.Event{ev, requested("p", 1), withUsage(jobCompleted("p", 1), 0.2, 1), rejected("p", 1, "again")},
		want:  []string{"session.stopped budget: budget: cost $0.2000 reached max_cost_usd $0.1000"},
	}})
}

func TestDecideRateLimit(t *testing.T) {
	single := promptPipeline("Do {{.Input.Name}}", 2)
	reset := fixedNow.Add(time.Hour)
	waiting := control(schemas.TypeStepWaiting, &schemas.StepWaiting{Step: "p", JobID: jid("p", 1), Until: reset, Reason: "limit"})
	runControl(t, []controlCase{
		{
			name:  "a rate-limited job waits until the reset",
			given: []schemas.Event{started(single), requested("p", 1), rateLimited("p", 1, &reset)},
			want:  []string{"step.waiting p until " + reset.Format(time.RFC3339)},
		},
		{
			name:  "without a reset time, the default wait",
			given: []schemas.Event{started(single), requested("p", 1), rateLimited("p", 1, nil)},
			want:  []string{"step.waiting p until " + fixedNow.Add(DefaultRateLimitWait).Format(time.RFC3339)},
		},
		{
			name:  "before the reset: nothing",
			given: []schemas.Event{started(single), requested("p", 1), rateLimited("p", 1, &reset), waiting},
			now:   reset.Add(-time.Second),
			want:  nil,
		},
		{
			name:  "at the reset: the same iteration again, not counted as a failure",
			given: []schemas.Event{started(single), requested("p", 1), rateLimited("p", 1, &reset), waiting},
			now:   reset,
			want:  []string{"job.requested s1.p.1.a2"},
		},
		{
			name:  "resuming the step ends the wait early",
			given: []schemas.Event{started(single), requested("p", 1), rateLimited("p", 1, &reset), waiting, signal(1, "resume", "p")},
			want:  []string{"step.resumed p", "signal.acknowledged sig-1 resume applied: resumed step p", "job.requested s1.p.1.a2"},
		},
	})
	st := fold(t, []schemas.Event{started(single), requested("p", 1), rateLimited("p", 1, &reset), waiting})
	if at, ok := st.Sessions[sess].WakeAt(); !ok || !at.Equal(reset) {
		t.Errorf("WakeAt = %v, %v; want %v", at, ok, reset)
	}
}

func TestDecideBreaker(t *testing.T) {
	p := promptPipeline("Do {{.Input.Name}}", 9)
	out := art("p", "p.json")
	verr := schemas.ValidationError{Artifact: "p.json", Pointer: "/a", Message: "missing"}
	same := func(i int) schemas.Event { return withArtifacts(rejected("p", i, "", verr), out) }
	loop := func(n int, verdict func(int) schemas.Event) []schemas.Event {
		evs := []schemas.Event{started(p)}
		for i := 1; i <= n; i++ {
			evs = append(evs, requested("p", i), verdict(i))
		}
		return evs
	}
	changed := func(i int) schemas.Event {
		return withArtifacts(rejected("p", i, "", verr), schemas.ArtifactRef{Name: "p.json", Digest: schemas.Digest([]byte{byte(i)})})
	}
	opened := append(loop(3, same), control(schemas.TypeStepPaused, &schemas.StepPaused{Step: "p", Kind: schemas.PauseBreaker, Reason: "x"}))
	tight := p
	tight.Breaker = &schemas.Breaker{IdenticalFailures: 2}
	failing := func(i int) schemas.Event { return jobFailed("p", i, "exit status 1", "tail "+fmt.Sprint(i)) }
	runControl(t, []controlCase{
		{name: "two alike: the loop goes on", given: loop(2, same), want: []string{"job.requested s1.p.3"}},
		{
			name:  "three alike: the breaker opens",
			given: loop(3, same),
			want:  []string{"step.paused p breaker: circuit breaker: 3 iterations in a row without progress (same verdict errors, unchanged outputs); resume the step to go on"},
		},
		{name: "outputs changed: progress", given: loop(3, changed), want: []string{"job.requested s1.p.4"}},
		{name: "open: nothing runs", given: append(slices.Clone(opened), toolCompleted("p", 3)), want: nil},
		{name: "resume closes it", given: append(slices.Clone(opened), signal(2, "resume", "p")), want: []string{"step.resumed p", "signal.acknowledged sig-2 resume applied: resumed step p", "job.requested s1.p.4"}},
		{
			name:  "identical job failures, threshold from the pipeline",
			given: []schemas.Event{started(tight), requested("p", 1), failing(1), requested("p", 2), failing(2)},
			want:  []string{"step.paused p breaker: circuit breaker: 2 identical job failures in a row (exit status 1); resume the step to go on"},
		},
	})
	// A step's own threshold overrides the pipeline's.
	own := tight
	own.Steps = []schemas.Step{own.Steps[0]}
	own.Steps[0].Breaker = &schemas.Breaker{IdenticalFailures: 4}
	runControl(t, []controlCase{{
		name:  "step threshold",
		given: []schemas.Event{started(own), requested("p", 1), failing(1), requested("p", 2), failing(2)},
		want:  []string{"job.requested s1.p.3"},
	}})
}

// TestRenderHints: hints end the prompt under their own heading unless the
// template places .Hints.
func TestRenderHints(t *testing.T) {
	tests := []struct {
		name, tmpl string
		want       string
	}{
		{name: "appended", tmpl: "Do it.", want: "Do it.\n\n## Notes from the operator\n\n- use tabs\n- and\n  spaces\n"},
		{name: "placed", tmpl: "Notes: {{.Hints}}Do it.", want: "Notes: - use tabs\n- and\n  spaces\nDo it."},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := RenderPrompt(tc.tmpl, PromptData{Hints: formatHints([]string{"use tabs", "and\nspaces"})})
			if err != nil || got != tc.want {
				t.Errorf("got %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

// TestDecideReviewCases: a finished job is not cancelled by a budget stop,
// a past reset time does not retry at once, hints survive a retry or a
// stop, and there are at most MaxHints of them.
func TestDecideReviewCases(t *testing.T) {
	single := promptPipeline("Do {{.Input.Name}}", 5)
	budget := single
	budget.Budget = &schemas.Budget{MaxCostUSD: 0.5}
	past := fixedNow.Add(-time.Hour)
	info := signal(20, "info", "", "use tabs")
	withHint := func(ev schemas.Event, hints ...string) schemas.Event {
		d := *ev.Data.(*schemas.JobRequested)
		d.Hints = hints
		ev.Data = &d
		return ev
	}
	hinted := []schemas.Event{started(single), requested("p", 1), info, ackEv(info, "applied"), rejected("p", 1, "again"), withHint(requested("p", 2), "use tabs")}
	many := []schemas.Event{started(single), requested("p", 1)}
	for i := range MaxHints + 2 {
		sig := signal(30+i, "info", "", fmt.Sprintf("hint %d", i))
		many = append(many, sig, ackEv(sig, "applied"))
	}
	var wantMany []string
	for i := 2; i < MaxHints+2; i++ {
		wantMany = append(wantMany, fmt.Sprintf("hint %d", i))
	}
	runControl(t, []controlCase{
		{
			name:  "the job that crossed the budget is not cancelled: its verdict is due",
			given: []schemas.Event{started(budget), requested("p", 1), withUsage(jobCompleted("p", 1), 0.6, 1)},
			want:  nil,
		},
		{
			name:  "its passing verdict completes the session",
			given: []schemas.Event{started(budget), requested("p", 1), withUsage(jobCompleted("p", 1), 0.6, 1), passed("p", 1, art("p", "p.json"))},
			want:  []string{"step.completed p after 1", "session.completed"},
		},
		{
			name:  "a reset time already past waits the floor",
			given: []schemas.Event{started(single), requested("p", 1), rateLimited("p", 1, &past)},
			want:  []string{"step.waiting p until " + fixedNow.Add(5*time.Second).Format(time.RFC3339)},
		},
		{
			name:  "hints go again with a retry after a rate limit",
			given: append(slices.Clone(hinted), rateLimited("p", 2, &past), control(schemas.TypeStepWaiting, &schemas.StepWaiting{Step: "p", JobID: jid("p", 2), Until: past})),
			want:  []string{`job.requested s1.p.2.a2 hints=["use tabs"]`},
		},
		{
			name:  "hints go again after stop and resume",
			given: append(slices.Clone(hinted), cancelledEv("p", 2)),
			want:  []string{`job.requested s1.p.2.r1 hints=["use tabs"]`},
		},
		{
			name:  "at most MaxHints, the newest",
			given: append(many, rejected("p", 1, "again")),
			want:  []string{fmt.Sprintf("job.requested s1.p.2 hints=%q", wantMany)},
		},
	})
}
