package projections

import (
	"testing"

	"github.com/loopbus/loopbus/schemas"
)

// TestManifestBudgetRaisedThenClosed: a budget-stopped session gets a
// raised budget (the manifest shows the new bound) and resumes; closed
// later, it is terminal and stays closed whatever follows.
func TestManifestBudgetRaisedThenClosed(t *testing.T) {
	evs := budgetStop()
	b := builder{evs: evs, seq: evs[len(evs)-1].Seq}
	b.add(sessionID, schemas.TypeSessionBudget, "", "", &schemas.SessionBudget{Budget: schemas.Budget{MaxCostUSD: 5}})
	m := foldAll(b.evs)
	if m.Budget == nil || m.Budget.MaxCostUSD != 5 || m.Budget.MaxTokens != 100000 {
		t.Fatalf("budget %+v, want max cost 5 and the tokens bound kept", m.Budget)
	}
	if m.Status != StatusStopped || m.StoppedByBudget() || m.Terminal() {
		t.Fatalf("status %s (stopped by budget %v): the raise does not resume by itself, but followers wait for the orchestrator's answer", m.Status, m.StoppedByBudget())
	}
	// Answered by a stop again: followers stop following.
	b.add(sessionID, schemas.TypeSessionStopped, "", "", &schemas.SessionStopped{Kind: schemas.StopBudget, Reason: "still spent"})
	if m = foldAll(b.evs); !m.StoppedByBudget() {
		t.Fatalf("status %s after a second stop, want stopped by its budget", m.Status)
	}
	b.evs = b.evs[:len(b.evs)-1] // answered by a resume instead
	b.add(sessionID, schemas.TypeSessionResumed, "", "", &schemas.SessionResumed{Reason: "budget raised"})
	if m = foldAll(b.evs); m.Status != StatusRunning {
		t.Fatalf("status %s after session.resumed, want running", m.Status)
	}
	b.add(sessionID, schemas.TypeSessionClosed, "", "", &schemas.SessionClosed{Reason: "not worth it"})
	if m = foldAll(b.evs); m.Status != StatusClosed || !m.Terminal() || m.Error != "not worth it" {
		t.Fatalf("status %s (terminal %v, error %q), want closed, terminal, the reason", m.Status, m.Terminal(), m.Error)
	}
	b.sessionCompleted(sessionID)
	b.sessionFailed(sessionID, "", "late")
	b.add(sessionID, schemas.TypeSessionResumed, "", "", &schemas.SessionResumed{})
	if m = foldAll(b.evs); m.Status != StatusClosed {
		t.Errorf("status %s after later events, want closed", m.Status)
	}
	// A completed session is not closed.
	evs = happyPath()
	b = builder{evs: evs, seq: evs[len(evs)-1].Seq}
	b.add(sessionID, schemas.TypeSessionClosed, "", "", &schemas.SessionClosed{})
	if m = foldAll(b.evs); m.Status != StatusCompleted {
		t.Errorf("a completed session closed: status %s, want completed", m.Status)
	}
}
