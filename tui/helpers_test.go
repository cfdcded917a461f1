package tui

import (
	"strconv"
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
