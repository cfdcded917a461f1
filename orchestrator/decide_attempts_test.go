package orchestrator

import (
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/loopbus/loopbus/schemas"
)

func retryableFailure(step string, iteration, attempt int, msg string) schemas.Event {
	job := JobID(sess, step, iteration, attempt, 0)
	return schemas.Event{
		ID: "retryable-" + job, Type: schemas.TypeJobFailed, Session: sess, Step: step, Job: job, Correlation: startID,
		Data: &schemas.JobFailed{JobID: job, Step: step, Iteration: iteration, Worker: "w1", ExitCode: -1, Error: msg, Retryable: true},
	}
}

func requestedAttempt(step string, iteration, attempt int) schemas.Event {
	ev := requested(step, iteration)
	job := JobID(sess, step, iteration, attempt, 0)
	ev.ID = schemas.DeterministicID(sess, schemas.TypeJobRequested, step, strconv.Itoa(iteration), "attempt", strconv.Itoa(attempt))
	ev.Job = job
	jr := *ev.Data.(*schemas.JobRequested)
	jr.JobID, jr.Attempt = job, attempt
	ev.Data = &jr
	return ev
}

// wantAttempt is wantJob for a later attempt of the same iteration.
func wantAttempt(t *testing.T, ev schemas.Event, step string, iteration, attempt int) schemas.Event {
	t.Helper()
	job := JobID(sess, step, iteration, attempt, 0)
	ev.ID = schemas.DeterministicID(sess, "loopbus.job.requested", step, strconv.Itoa(iteration), "attempt", strconv.Itoa(attempt))
	ev.Job = job
	jr := *ev.Data.(*schemas.JobRequested)
	jr.JobID, jr.Attempt = job, attempt
	ev.Data = &jr
	return ev
}

// TestDecideRetryableAttempts: a failure that was not the agent's fault
// (Retryable) runs the same iteration again, up to MaxAttempts, without
// spending an iteration or adding feedback.
func TestDecideRetryableAttempts(t *testing.T) {
	single := singlePipeline() // max_iterations 2
	in := input()
	first := wantJob(t, single, "only", 1, "Do article.md (1)", []schemas.ArtifactRef{in})
	runCases(t, []decideCase{
		{
			name:  "retryable failure: attempt 2 of iteration 1",
			given: []schemas.Event{started(single), requested("only", 1), retryableFailure("only", 1, 1, "cannot provide inputs: not found")},
			want:  []schemas.Event{wantAttempt(t, first, "only", 1, 2)},
		},
		{
			name: "attempt 3 after two retryable failures",
			given: []schemas.Event{started(single), requested("only", 1), retryableFailure("only", 1, 1, "x"),
				requestedAttempt("only", 1, 2), retryableFailure("only", 1, 2, "x")},
			want: []schemas.Event{wantAttempt(t, first, "only", 1, 3)},
		},
		{
			name: "attempts used up: the failure counts as an iteration",
			given: []schemas.Event{started(single), requested("only", 1), retryableFailure("only", 1, 1, "x"),
				requestedAttempt("only", 1, 2), retryableFailure("only", 1, 2, "x"),
				requestedAttempt("only", 1, 3), retryableFailure("only", 1, 3, "job abandoned")},
			want: []schemas.Event{wantJob(t, single, "only", 2,
				"Do article.md (2)\n\n## Feedback from earlier iterations\n\nIteration 1: the agent run failed.\njob abandoned\n",
				[]schemas.ArtifactRef{in}, schemas.Feedback{Iteration: 1, Kind: "job", Message: "job abandoned"})},
		},
		{
			name:  "a result of an earlier attempt is stale",
			given: []schemas.Event{started(single), requested("only", 1), retryableFailure("only", 1, 1, "x"), requestedAttempt("only", 1, 2), passed("only", 1)},
			want:  nil,
		},
	})
}

// TestDecidePromptTooLarge: a prompt over MaxPromptBytes fails the step
// instead of producing an event that cannot be stored.
func TestDecidePromptTooLarge(t *testing.T) {
	p := promptPipeline(`{{printf "%0300000d" 0}}`, 1)
	evs := runDecide(t, []schemas.Event{started(p)})
	if len(evs) != 2 || evs[0].Type != schemas.TypeStepFailed || evs[1].Type != schemas.TypeSessionFailed {
		t.Fatalf("got %v", types(evs))
	}
	if reason := evs[1].Data.(*schemas.SessionFailed).Reason; !strings.Contains(reason, "300000 bytes, over the 131072-byte limit") {
		t.Errorf("reason: %s", reason)
	}
}

// TestUnrecordable: a decision the bus refused ends the step and session
// with the cause, under the ids of the ordinary failure events.
func TestUnrecordable(t *testing.T) {
	chain := chainPipeline()
	given := []schemas.Event{started(chain)}
	st := fold(t, given)
	evs := Decide(st, given[0], fixedNow)
	if len(evs) != 1 {
		t.Fatalf("decide: %v", types(evs))
	}
	got := Unrecordable(st, given[0], evs, errors.New("publish rejected: too big"), fixedNow)
	reason := "the orchestrator could not record its decision (job.requested): publish rejected: too big"
	want := []schemas.Event{wantStepFailed("summary", 0, reason), wantSessionFailed("summary", "step summary failed: "+reason)}
	for i := range want {
		want[i].Causation = given[0].ID
	}
	compareEvents(t, got, want, "unrecordable")

	done := fold(t, []schemas.Event{started(chain), sessionFailedEv("earlier")})
	if evs := Unrecordable(done, given[0], evs, errors.New("x"), fixedNow); evs != nil {
		t.Errorf("ended session: %v", types(evs))
	}
}
