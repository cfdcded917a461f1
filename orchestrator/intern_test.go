package orchestrator

import (
	"errors"
	"reflect"
	"testing"

	"github.com/loopbus/loopbus/schemas"
)

// Sessions started from one definition share one copy of it (State.defs):
// a busy orchestrator holds it once, not once per running session.

// TestSessionsShareTheirDefinition: two sessions of the same pipeline,
// each from its own decoded copy, hold one pipeline and one definition
// per step; a session of another pipeline holds its own. What one
// session's run changes stays its own, and each decides as it would
// alone. The shared copy goes when its last session finishes.
func TestSessionsShareTheirDefinition(t *testing.T) {
	t.Parallel()
	const other, third = "s2", "s3"
	st := NewState() // as the service keeps it: finished sessions compacted
	seq := uint64(0)
	apply := func(evs ...schemas.Event) {
		t.Helper()
		for _, ev := range evs {
			seq++
			ev.Seq = seq
			if err := Check(st, ev); err != nil {
				t.Fatalf("Check(%s %s): %v", ev.Type, ev.ID, err)
			}
			Evolve(st, ev)
		}
	}
	apply(started(chainPipeline()), inSession(started(chainPipeline()), other), inSession(started(changedIdeas()), third))
	a, b, c := st.Sessions[sess], st.Sessions[other], st.Sessions[third]
	if len(st.defs) != 2 {
		t.Fatalf("%d definitions kept for three sessions of two pipelines, want 2", len(st.defs))
	}
	for _, name := range []string{"summary", "ideas", "writing-kit"} {
		if a.Steps[name].Def != b.Steps[name].Def {
			t.Errorf("step %s: sessions of one pipeline hold two definitions", name)
		}
		if a.Steps[name].Def == c.Steps[name].Def {
			t.Errorf("step %s: a session of another pipeline holds the same definition", name)
		}
	}
	if &a.Pipeline.Steps[0] != &b.Pipeline.Steps[0] || a.Steps["summary"].Def != &a.Pipeline.Steps[0] {
		t.Error("the sessions' pipelines, or a step and its pipeline, are not one copy")
	}
	if c.Steps["ideas"].Def.Prompt != changedIdeas().Steps[1].Prompt {
		t.Errorf("session of the other pipeline runs prompt %q", c.Steps["ideas"].Def.Prompt)
	}

	// The first session runs: a job, its rejection, the next iteration.
	apply(requested("summary", 1), jobCompleted("summary", 1), rejected("summary", 1, "fix it"),
		requested("summary", 2, schemas.Feedback{Iteration: 1, Kind: "validation", RetryHint: "fix it"}))
	if got := a.Steps["summary"]; got.Status != StepRunning || got.Iteration != 2 || len(got.Feedback) != 1 {
		t.Fatalf("first session's step: %+v", got)
	}
	if got := b.Steps["summary"]; got.Status != StepPending || got.Iteration != 0 || got.Feedback != nil || got.JobID != "" {
		t.Errorf("the other session's step moved with the first's: %+v", got)
	}
	for i, want := range chainPipeline().Steps {
		if !reflect.DeepEqual(a.Pipeline.Steps[i], want) {
			t.Errorf("step %s's shared definition changed: %+v", want.Name, a.Pipeline.Steps[i])
		}
	}
	// The second session decides what it would alone.
	alone := NewState()
	Evolve(alone, inSession(started(chainPipeline()), other))
	if got, want := Decide(st, inSession(started(chainPipeline()), other), fixedNow), Decide(alone, inSession(started(chainPipeline()), other), fixedNow); !reflect.DeepEqual(got, want) {
		t.Errorf("with a shared definition Decide = %s\nalone: %s", dump(got), dump(want))
	}

	// The replay guard still refuses a copy, and only a copy.
	if err := Check(st, requested("summary", 1)); !errors.Is(err, ErrReplayed) {
		t.Errorf("Check(copy of job.requested) = %v, want ErrReplayed", err)
	}
	if err := Check(st, inSession(requested("summary", 1), other)); err != nil {
		t.Errorf("Check(the other session's first job.requested) = %v, want nil", err)
	}

	// Finished sessions let go of it; the last one removes it.
	key := a.def.key
	apply(inSession(sessionFailedEv("stop"), other))
	if d := st.defs[key]; d == nil || d.refs != 1 || b.def != nil {
		t.Fatalf("after one of two sessions finished: shared %+v, finished session holds %p", d, b.def)
	}
	apply(sessionFailedEv("stop"), inSession(sessionFailedEv("stop"), third))
	if len(st.defs) != 0 {
		t.Errorf("%d definitions kept after every session finished", len(st.defs))
	}
	// A new session of the pipeline makes a new copy.
	apply(inSession(started(chainPipeline()), "s4"))
	if d := st.Sessions["s4"].def; d == nil || d.refs != 1 || len(st.defs) != 1 {
		t.Errorf("new session after the last finished: shared %+v, %d kept", d, len(st.defs))
	}
}

// TestSessionsShareAPipelineWithScripts: sessions of one pipeline whose
// definition files (scripts) each stored under its own id, as the client
// stores them, share the pipeline and keep their own files.
func TestSessionsShareAPipelineWithScripts(t *testing.T) {
	t.Parallel()
	st := NewState()
	withFiles := func(session string) schemas.Event {
		ev := inSession(started(chainPipeline()), session)
		d := *ev.Data.(*schemas.SessionStarted)
		d.DefinitionFiles = []schemas.DefinitionFile{{Path: "agent.sh", Artifact: schemas.ArtifactRef{Name: "agent.sh", Object: session + "/definition/agent.sh-x1",
			Digest: schemas.Digest([]byte("echo " + session)), Size: 5}}}
		ev.Data = &d
		return ev
	}
	for i, session := range []string{"s1", "s2"} {
		ev := withFiles(session)
		ev.Seq = uint64(i + 1)
		if err := Check(st, ev); err != nil {
			t.Fatal(err)
		}
		Evolve(st, ev)
	}
	a, b := st.Sessions["s1"], st.Sessions["s2"]
	if len(st.defs) != 1 || a.Steps["summary"].Def != b.Steps["summary"].Def {
		t.Errorf("%d definitions kept for two sessions of one pipeline with scripts, want 1 shared", len(st.defs))
	}
	if a.DefinitionFiles[0].Artifact.Object == b.DefinitionFiles[0].Artifact.Object {
		t.Error("the sessions' definition files are one session's")
	}
}

// TestSharedDefinitionNeedsEqualValues: a definition whose JSON is the
// same but whose values are not (an empty list and none) is not shared.
func TestSharedDefinitionNeedsEqualValues(t *testing.T) {
	t.Parallel()
	st := NewState()
	empty := chainPipeline()
	empty.Steps = append([]schemas.Step{}, empty.Steps...)
	empty.Steps[0].Validate = []string{} // omitted from JSON, as nil is
	for i, ev := range []schemas.Event{started(chainPipeline()), inSession(started(empty), "s2")} {
		ev.Seq = uint64(i + 1)
		Evolve(st, ev)
	}
	a, b := st.Sessions[sess], st.Sessions["s2"]
	if b.def != nil || a.Steps["summary"].Def == b.Steps["summary"].Def {
		t.Fatal("definitions that differ are shared")
	}
	if b.Steps["summary"].Def.Validate == nil || b.Steps["summary"].Def != &b.Pipeline.Steps[0] {
		t.Errorf("the second session does not run its own definition: %+v", b.Steps["summary"].Def)
	}
	if d := a.def; d == nil || d.refs != 1 || len(st.defs) != 1 {
		t.Errorf("shared %+v, %d kept", d, len(st.defs))
	}
}

// TestForkDoesNotChangeSharedDefinition: a fork of one of two sessions of
// a pipeline, with a step changed, runs its own definition; the two
// sessions still share theirs, unchanged.
func TestForkDoesNotChangeSharedDefinition(t *testing.T) {
	t.Parallel()
	done := checkedChain()
	s := (&stream{}).add(done[:6]...)
	s.add(inSession(started(chainPipeline()), "s2"))
	s.add(s.fork(t, sess, done[5].ID, forkSess, changedIdeas(), "ideas")...)
	st, refused := foldStream(t, s)
	if len(refused) > 0 {
		t.Fatalf("refused: %v", refused)
	}
	a, b, f := st.Sessions[sess], st.Sessions["s2"], st.Sessions[forkSess]
	want := chainPipeline().Steps[1].Prompt
	if a.Steps["ideas"].Def != b.Steps["ideas"].Def || a.Steps["ideas"].Def.Prompt != want {
		t.Errorf("after the fork the sessions hold %q and %q, want one shared %q", a.Steps["ideas"].Def.Prompt, b.Steps["ideas"].Def.Prompt, want)
	}
	if got := f.Steps["ideas"].Def.Prompt; got != changedIdeas().Steps[1].Prompt {
		t.Errorf("fork runs prompt %q", got)
	}
}
