package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/loopbus/loopbus/internal/testnats"
	"github.com/loopbus/loopbus/orchestrator"
	"github.com/loopbus/loopbus/schemas"
)

// TestDoctorDecisionsCheck: a session whose first job was never requested
// (no orchestrator ran) fails doctor's decisions line once it has been
// owed the decision for the bound, naming the session; with the job
// requested it waits for a worker, and the line is ok.
func TestDoctorDecisionsCheck(t *testing.T) {
	b, _ := testnats.Bus(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const session = "owed-1"
	in := schemas.ArtifactRef{Name: "input.md", Object: session + "/input/input.md", Digest: schemas.Digest([]byte("x")), Size: 1}
	p := schemas.Pipeline{Name: "one", Steps: []schemas.Step{{
		Name: "only", Agent: schemas.AgentSpec{Backend: "exec", Command: []string{"true"}}, Prompt: "p",
		Outputs: []schemas.Output{{Name: "out.txt"}}, MaxIterations: 1, TimeoutMs: 60000, Final: true,
	}}}
	start := schemas.Event{ID: schemas.DeterministicID(session, schemas.TypeSessionStarted), Type: schemas.TypeSessionStarted, Session: session,
		Time: time.Now(), Data: &schemas.SessionStarted{Pipeline: p, Input: in, SourceHash: schemas.ShortHash(in.Digest)}}
	start.Correlation = start.ID
	res, err := b.PublishExpect(ctx, start, 0)
	if err != nil {
		t.Fatal(err)
	}
	stored, err := b.GetEvent(ctx, res.Seq)
	if err != nil {
		t.Fatal(err)
	}
	const bound = time.Minute
	if c := decisionsCheck(ctx, b, bound, stored.Stored.Add(bound/2)); !c.OK {
		t.Errorf("before the bound: %+v, want ok", c)
	}
	c := decisionsCheck(ctx, b, bound, stored.Stored.Add(2*bound))
	if c.OK || !strings.Contains(c.Detail, session+" (after session.started 2m0s ago)") || !strings.Contains(c.Detail, "1 sessions owed") {
		t.Errorf("owed its first job: %+v, want a failure naming %s", c, session)
	}

	// The job the orchestrator owed, requested: the session waits for a
	// worker.
	evs, err := orchestrator.Owed(session, orchestrator.HistoryOf(ctx, b), time.Now())
	if err != nil || len(evs) != 1 {
		t.Fatalf("Owed = %v, %v; want the job request", evs, err)
	}
	if _, err := b.PublishChain(ctx, session, res.Seq, evs); err != nil {
		t.Fatal(err)
	}
	if c := decisionsCheck(ctx, b, bound, time.Now().Add(2*bound)); !c.OK || !strings.Contains(c.Detail, "1 not finished looked at") {
		t.Errorf("with the job requested: %+v, want ok, one session looked at", c)
	}
}
