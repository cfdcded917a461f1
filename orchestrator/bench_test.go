package orchestrator

import (
	"strconv"
	"testing"
	"time"

	"github.com/loopbus/loopbus/schemas"
)

// BenchmarkEvolveDecide measures the orchestrator's pure core on the hot
// path: a validation.passed that completes a step and dispatches the next.
func BenchmarkEvolveDecide(b *testing.B) {
	now := time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)
	p := schemas.Pipeline{Name: "bench", Steps: []schemas.Step{
		{Name: "a", Agent: schemas.AgentSpec{Backend: "exec", Command: []string{"true"}}, Prompt: "do {{.Input.Name}}", Outputs: []schemas.Output{{Name: "a.json"}}, MaxIterations: 1},
		{Name: "b", Requires: []string{"a"}, Agent: schemas.AgentSpec{Backend: "exec", Command: []string{"true"}}, Prompt: "then {{.Input.Name}}", Outputs: []schemas.Output{{Name: "b.json"}}, MaxIterations: 1, Final: true},
	}}
	input := schemas.ArtifactRef{Name: "in.md", Object: "x/in.md", Digest: schemas.Digest([]byte("x")), Size: 1}
	art := schemas.ArtifactRef{Name: "a.json", Object: "j/a.json", Digest: schemas.Digest([]byte("{}")), Size: 2}
	// fresh: each session in a state of its own (a first session);
	// shared: every session in one state, as the service keeps them (its
	// prompts parsed once).
	for _, shared := range []bool{false, true} {
		name := "fresh"
		if shared {
			name = "shared"
		}
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			st := NewState()
			st.Prompts = NewPromptCache()
			for i := range b.N {
				if !shared {
					st = NewState()
					st.Prompts = NewPromptCache()
				}
				sess := "s" + strconv.Itoa(i)
				Evolve(st, schemas.Event{ID: "1", Type: schemas.TypeSessionStarted, Session: sess, Seq: 1, Data: &schemas.SessionStarted{Pipeline: p, Input: input, SourceHash: "0123456789abcdef"}})
				for _, ev := range Decide(st, schemas.Event{ID: "1", Session: sess}, now) {
					Evolve(st, ev)
				}
				passed := schemas.Event{ID: "2", Type: schemas.TypeValidationPassed, Session: sess, Seq: 3,
					Data: &schemas.Verdict{JobID: JobID(sess, "a", 1, 1, 0), Step: "a", Iteration: 1, Artifacts: []schemas.ArtifactRef{art}}}
				Evolve(st, passed)
				if evs := Decide(st, passed, now); len(evs) != 2 {
					b.Fatalf("%d events", len(evs))
				}
			}
		})
	}
}
