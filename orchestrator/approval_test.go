package orchestrator

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/loopbus/loopbus/schemas"
)

// The specification of approval gates: given events → the events Decide
// returns.

// gatedPipeline is draft (with the approval gate a, max_iterations 1; its
// prompt does not use .Feedback) → publish (no gate).
func gatedPipeline(a *schemas.Approval) schemas.Pipeline {
	return schemas.Pipeline{Name: "gated", Steps: []schemas.Step{
		{Name: "draft", Agent: agent("draft.sh"), Prompt: "Draft from {{.Input.Name}}.", Outputs: []schemas.Output{{Name: "draft.md"}},
			MaxIterations: 1, TimeoutMs: 1000, Approval: a},
		{Name: "publish", Requires: []string{"draft"}, Agent: agent("publish.sh"), Prompt: "Publish.", Outputs: []schemas.Output{{Name: "post.md"}},
			MaxIterations: 1, TimeoutMs: 1000, Final: true},
	}}
}

// twice is p with two iterations for its gated step.
func twice(p schemas.Pipeline) schemas.Pipeline {
	p.Steps = slices.Clone(p.Steps)
	p.Steps[0].MaxIterations = 2
	return p
}

func approvalSignal(n int, verb, step, reason, by string) schemas.Event {
	ev := signal(n, verb, step)
	d := ev.Data.(*schemas.Signal)
	d.Reason, d.By = reason, by
	return ev
}

// awaiting is the approval.requested the orchestrator emitted for draft's
// iteration.
func awaiting(iteration int, until *time.Time) schemas.Event {
	d := &schemas.ApprovalRequested{Step: "draft", JobID: jid("draft", iteration), Iteration: iteration, Artifacts: []schemas.ArtifactRef{art("draft", "draft.md")}, Until: until}
	if until != nil {
		d.OnTimeout = "x"
	}
	return schemas.Event{ID: fmt.Sprintf("await-%d", iteration), Type: schemas.TypeApprovalRequested, Session: sess, Step: "draft", Data: d}
}

func approvalLine(ev schemas.Event) string {
	typ := strings.TrimPrefix(ev.Type, "loopbus.")
	switch d := ev.Data.(type) {
	case *schemas.ApprovalRequested:
		s := fmt.Sprintf("%s %s job %s, %d artifacts", typ, d.Step, d.JobID, len(d.Artifacts))
		if d.Until != nil {
			s += fmt.Sprintf(", until %s then %s", d.Until.Format(time.RFC3339), d.OnTimeout)
		}
		return s
	case *schemas.ApprovalExpired:
		return fmt.Sprintf("%s %s %s: %s", typ, d.Step, d.OnTimeout, d.Reason)
	case *schemas.JobRequested:
		s := line(ev)
		for _, f := range d.Feedback {
			s += fmt.Sprintf(" feedback=%s:%q", f.Kind, f.Message)
		}
		return s
	case *schemas.SessionFailed:
		return typ + ": " + d.Reason
	}
	return line(ev)
}

func TestDecideApproval(t *testing.T) {
	gate := gatedPipeline(&schemas.Approval{})
	timed := func(action string) schemas.Pipeline {
		return gatedPipeline(&schemas.Approval{TimeoutMs: time.Hour.Milliseconds(), OnTimeout: action})
	}
	until := fixedNow.Add(time.Hour)
	draft := art("draft", "draft.md")
	waitingFor := func(p schemas.Pipeline, u *time.Time) []schemas.Event {
		return []schemas.Event{started(p), requested("draft", 1), jobCompleted("draft", 1), passed("draft", 1, draft), awaiting(1, u)}
	}
	with := func(given []schemas.Event, more ...schemas.Event) []schemas.Event {
		return append(append([]schemas.Event(nil), given...), more...)
	}
	approve := approvalSignal(1, "approve", "draft", "ship it", "alice")
	reject := approvalSignal(2, "reject", "draft", "too long: cut it to 100 words", "bob")
	cases := []struct {
		name  string
		given []schemas.Event
		now   time.Time
		want  []string
	}{
		{
			name:  "a passed verdict stops at the gate",
			given: []schemas.Event{started(gate), requested("draft", 1), jobCompleted("draft", 1), passed("draft", 1, draft)},
			want:  []string{"approval.requested draft job s1.draft.1, 1 artifacts"},
		},
		{
			name:  "with a timeout the request says until when and what then",
			given: []schemas.Event{started(timed("")), requested("draft", 1), jobCompleted("draft", 1), passed("draft", 1, draft)},
			want:  []string{"approval.requested draft job s1.draft.1, 1 artifacts, until 2025-03-04T06:06:07Z then fail"},
		},
		{
			name:  "a waiting gate decides nothing more",
			given: waitingFor(gate, nil),
			want:  nil,
		},
		{
			name:  "approve completes the step with the passed artifacts and the next step runs",
			given: with(waitingFor(gate, nil), approve),
			want: []string{
				"signal.acknowledged sig-1 approve applied: step draft approved by alice; it completes",
				"step.completed draft after 1",
				"job.requested s1.publish.1",
			},
		},
		{
			name:  "reject runs another iteration with the reason as feedback, beyond max_iterations",
			given: with(waitingFor(gate, nil), reject),
			want: []string{
				"signal.acknowledged sig-2 reject applied: step draft rejected by bob; iteration 2 runs with the reason as feedback",
				`job.requested s1.draft.2 feedback=rejected:"too long: cut it to 100 words"`,
			},
		},
		{
			name: "the rejected iteration's outputs pass: the gate waits again",
			given: with(waitingFor(gate, nil), reject, ackEv(reject, schemas.SignalApplied),
				requested("draft", 2, schemas.Feedback{Iteration: 1, Kind: schemas.FeedbackRejected, Message: "too long"}),
				jobCompleted("draft", 2), passed("draft", 2, draft)),
			want: []string{"approval.requested draft job s1.draft.2, 1 artifacts"},
		},
		{
			name:  "approve of a step still running is ignored",
			given: []schemas.Event{started(gate), requested("draft", 1), approve},
			want:  []string{"signal.acknowledged sig-1 approve ignored: step draft is not awaiting approval (it is running)"},
		},
		{
			name:  "approve of a step without a gate is ignored",
			given: with(waitingFor(gate, nil), approvalSignal(3, "approve", "publish", "", "")),
			want:  []string{"signal.acknowledged sig-3 approve ignored: step publish has no approval gate"},
		},
		{
			name:  "approve of a whole session is ignored",
			given: with(waitingFor(gate, nil), approvalSignal(4, "approve", "", "", "")),
			want:  []string{"signal.acknowledged sig-4 approve ignored: approve names a step awaiting approval: SESSION/STEP"},
		},
		{
			name:  "reject without a reason is ignored",
			given: with(waitingFor(gate, nil), approvalSignal(5, "reject", "draft", " ", "")),
			want:  []string{"signal.acknowledged sig-5 reject ignored: a reject needs a reason: it is the next iteration's feedback"},
		},
		{
			name: "a second approve after the step completed is ignored",
			given: with(waitingFor(gate, nil), approve, ackEv(approve, schemas.SignalApplied), stepCompleted("draft", 1, draft),
				requested("publish", 1), approvalSignal(6, "approve", "draft", "", "")),
			want: []string{"signal.acknowledged sig-6 approve ignored: step draft is not awaiting approval (it is completed)"},
		},
		{
			name:  "before its timeout nothing happens",
			given: waitingFor(timed(schemas.OnTimeoutFail), &until),
			now:   until.Add(-time.Second),
			want:  nil,
		},
		{
			name:  "on_timeout fail: the step and the session fail",
			given: waitingFor(timed(schemas.OnTimeoutFail), &until),
			now:   until,
			want: []string{
				"approval.expired draft fail: no approval within 1h0m0s",
				"step.failed draft: approval timed out: no approval within 1h0m0s (on_timeout: fail)",
				"session.failed: step draft failed: approval timed out: no approval within 1h0m0s (on_timeout: fail)",
			},
		},
		{
			name:  "on_timeout reject: another iteration runs while iterations remain",
			given: waitingFor(twice(timed(schemas.OnTimeoutReject)), &until),
			now:   until.Add(time.Minute),
			want: []string{
				"approval.expired draft reject: rejected: no approval within 1h0m0s",
				`job.requested s1.draft.2 feedback=rejected:"rejected: no approval within 1h0m0s"`,
			},
		},
		{
			// A gate nobody answers must not run agents forever.
			name:  "on_timeout reject counts against max_iterations",
			given: waitingFor(timed(schemas.OnTimeoutReject), &until),
			now:   until.Add(time.Minute),
			want: []string{
				"approval.expired draft reject: rejected: no approval within 1h0m0s",
				"step.failed draft: no valid output after 1 of 1 iterations; last error: rejected: no approval within 1h0m0s",
				"session.failed: step draft failed: no valid output after 1 of 1 iterations; last error: rejected: no approval within 1h0m0s",
			},
		},
		{
			name:  "on_timeout approve: the step completes",
			given: waitingFor(timed(schemas.OnTimeoutApprove), &until),
			now:   until,
			want: []string{
				"approval.expired draft approve: no approval within 1h0m0s",
				"step.completed draft after 1",
				"job.requested s1.publish.1",
			},
		},
		{
			name:  "a paused session's gate does not time out",
			given: with(waitingFor(timed(schemas.OnTimeoutFail), &until), control(schemas.TypeSessionPaused, &schemas.SessionPaused{})),
			now:   until.Add(time.Hour),
			want:  nil,
		},
		{
			name: "a rejection while the session is paused runs the next iteration on resume",
			given: with(waitingFor(gate, nil), control(schemas.TypeSessionPaused, &schemas.SessionPaused{}), reject, ackEv(reject, schemas.SignalApplied),
				signal(7, "resume", "")),
			want: []string{
				"session.resumed",
				"signal.acknowledged sig-7 resume applied: resumed session",
				`job.requested s1.draft.2 feedback=rejected:"too long: cut it to 100 words"`,
			},
		},
	}
	cat, err := schemas.NewCatalogue()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var got []schemas.Event
			if tc.now.IsZero() {
				got = runDecide(t, tc.given)
			} else {
				got = Decide(fold(t, tc.given), tc.given[len(tc.given)-1], tc.now)
			}
			lines := make([]string, len(got))
			for i, ev := range got {
				lines[i] = approvalLine(ev)
				// Every decided event satisfies its schema.
				raw, err := json.Marshal(ev.Data)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := cat.Decode(ev.Type, raw); err != nil {
					t.Errorf("%s: %v", ev.Type, err)
				}
			}
			if strings.Join(lines, "\n") != strings.Join(tc.want, "\n") {
				t.Errorf("got:\n  %s\nwant:\n  %s", strings.Join(lines, "\n  "), strings.Join(tc.want, "\n  "))
			}
		})
	}
}

// The reason of a rejection reaches the next prompt (appended under the
// feedback heading when the template does not use .Feedback).
func TestDecideRejectReasonInPrompt(t *testing.T) {
	reject := approvalSignal(2, "reject", "draft", "too long: cut it to 100 words", "bob")
	given := []schemas.Event{started(gatedPipeline(&schemas.Approval{})), requested("draft", 1), jobCompleted("draft", 1),
		passed("draft", 1, art("draft", "draft.md")), awaiting(1, nil), reject}
	got := runDecide(t, given)
	if len(got) != 2 {
		t.Fatalf("got %d events, want 2", len(got))
	}
	jr, ok := got[1].Data.(*schemas.JobRequested)
	if !ok {
		t.Fatalf("second event is %s", got[1].Type)
	}
	for _, want := range []string{"Draft from article.md.", "## Feedback from earlier iterations", "Iteration 1: a reviewer rejected the outputs.", "too long: cut it to 100 words"} {
		if !strings.Contains(jr.Prompt, want) {
			t.Errorf("prompt lacks %q:\n%s", want, jr.Prompt)
		}
	}
}

// A step with a gate completes only once approved: Check refuses a
// step.completed before, whoever sends it.
func TestCheckGatedStepCompleted(t *testing.T) {
	draft := art("draft", "draft.md")
	given := []schemas.Event{started(gatedPipeline(&schemas.Approval{})), requested("draft", 1), jobCompleted("draft", 1),
		{ID: "stored", Type: schemas.TypeArtifactStored, Session: sess, Step: "draft", Data: &schemas.ArtifactStored{JobID: jid("draft", 1), Artifact: draft}},
		passed("draft", 1, draft), awaiting(1, nil)}
	st := NewState()
	for i, ev := range given {
		ev.Seq = uint64(i + 1)
		Evolve(st, ev)
	}
	done := stepCompleted("draft", 1, draft)
	if err := Check(st, done); !errors.Is(err, ErrInconsistent) || !strings.Contains(err.Error(), "not approved") {
		t.Fatalf("Check before approval = %v, want ErrInconsistent naming the approval", err)
	}
	approve := approvalSignal(1, "approve", "draft", "", "alice")
	Evolve(st, approve)
	Evolve(st, ackEv(approve, schemas.SignalApplied))
	if err := Check(st, done); err != nil {
		t.Fatalf("Check after approval = %v", err)
	}
}

// The service decides again when a gate's timeout elapses: WakeAt names it.
func TestWakeAtApprovalTimeout(t *testing.T) {
	until := fixedNow.Add(time.Hour)
	p := gatedPipeline(&schemas.Approval{TimeoutMs: time.Hour.Milliseconds()})
	st := fold(t, []schemas.Event{started(p), requested("draft", 1), jobCompleted("draft", 1), passed("draft", 1, art("draft", "draft.md")), awaiting(1, &until)})
	at, ok := st.Sessions[sess].WakeAt()
	if !ok || !at.Equal(until) {
		t.Fatalf("WakeAt = %v, %v; want %v", at, ok, until)
	}
	st = fold(t, []schemas.Event{started(gatedPipeline(&schemas.Approval{})), requested("draft", 1), jobCompleted("draft", 1), passed("draft", 1, art("draft", "draft.md")), awaiting(1, nil)})
	if at, ok := st.Sessions[sess].WakeAt(); ok {
		t.Fatalf("WakeAt without a timeout = %v, want none", at)
	}
}

// Check refuses approval events the session's history contradicts: a gate
// reached by no passed verdict, a timeout of a gate without one or with
// another on_timeout than its definition's.
func TestCheckApprovalEvents(t *testing.T) {
	until := fixedNow.Add(time.Hour)
	draft := art("draft", "draft.md")
	noTimeout := fold(t, []schemas.Event{started(gatedPipeline(&schemas.Approval{})), requested("draft", 1)})
	if err := Check(noTimeout, awaiting(1, nil)); !errors.Is(err, ErrInconsistent) {
		t.Errorf("approval.requested before a verdict: %v, want ErrInconsistent", err)
	}
	expired := func(action string) schemas.Event {
		return schemas.Event{ID: "exp-" + action, Type: schemas.TypeApprovalExpired, Session: sess, Step: "draft",
			Data: &schemas.ApprovalExpired{Step: "draft", JobID: jid("draft", 1), Iteration: 1, OnTimeout: action, Reason: "r"}}
	}
	waiting := fold(t, []schemas.Event{started(gatedPipeline(&schemas.Approval{})), requested("draft", 1), jobCompleted("draft", 1), passed("draft", 1, draft), awaiting(1, nil)})
	if err := Check(waiting, expired(schemas.OnTimeoutApprove)); !errors.Is(err, ErrInconsistent) || !strings.Contains(err.Error(), "no timeout") {
		t.Errorf("approval.expired of a gate without timeout: %v", err)
	}
	timed := fold(t, []schemas.Event{started(gatedPipeline(&schemas.Approval{TimeoutMs: 3600000})), requested("draft", 1), jobCompleted("draft", 1),
		passed("draft", 1, draft), awaiting(1, &until)})
	if err := Check(timed, expired(schemas.OnTimeoutApprove)); !errors.Is(err, ErrInconsistent) || !strings.Contains(err.Error(), "whose on_timeout is fail") {
		t.Errorf("approval.expired approving a gate that fails: %v", err)
	}
	if err := Check(timed, expired(schemas.OnTimeoutFail)); err != nil {
		t.Errorf("approval.expired as defined: %v", err)
	}
}
