package client_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/loopbus/loopbus/client"
	"github.com/loopbus/loopbus/projections"
	"github.com/loopbus/loopbus/schemas"
)

// TestWatchNoticesARefusedStart: a session.forked the orchestrator
// refuses is dead-lettered, and nothing runs: Watch (which run, fork,
// rerun and wait follow) returns the refusal with its reason instead of
// waiting forever. A refused session.rerun is no refusal of a session
// that had ended.
func TestWatchNoticesARefusedStart(t *testing.T) {
	ctx, c := rig(t)
	dir := t.TempDir()
	pipeline, input := filepath.Join(dir, "one.yaml"), filepath.Join(dir, "in.txt")
	for path, body := range map[string]string{input: "x\n", pipeline: `name: one
steps:
  only:
    agent: {backend: exec, command: [sh, -c, "echo 1 > \"$LOOPBUS_OUTPUT_DIR/only.txt\""]}
    prompt: one
    outputs: [{name: only.txt}]
`} {
		if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if m := runSession(t, ctx, c, pipeline, input, "d-1"); m.Status != projections.StatusCompleted {
		t.Fatalf("d-1: %s %s", m.Status, m.Error)
	}
	evs, err := client.Events(ctx, c.Bus(), "d-1", client.Until{})
	if err != nil {
		t.Fatal(err)
	}
	start, last := evs[0].Data.(*schemas.SessionStarted), evs[len(evs)-1]
	// Written as a client would, but saying it copied an event it did
	// not: the orchestrator, reading the origin, refuses it.
	forked := schemas.Event{ID: schemas.DeterministicID("d-2", "forked"), Type: schemas.TypeSessionForked, Session: "d-2", Time: time.Now().UTC(),
		Data: &schemas.SessionForked{Origin: "d-1", Copied: 1, Seq: last.Seq, Event: last.ID, Pipeline: start.Pipeline, Input: start.Input, SourceHash: start.SourceHash}}
	forked.Correlation = forked.ID
	if _, err := c.Bus().Publish(ctx, forked); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	_, err = client.Watch(wctx, c.Bus(), "d-2", nil)
	if want := "session d-2 will not run: its session.forked at stream sequence "; !errors.Is(err, client.ErrDeadLettered) || !strings.Contains(err.Error(), want) ||
		!strings.Contains(err.Error(), "by orchestrator: malformed event: inconsistent with the session's history: loopbus.session.forked says it copied 1 events of session d-1") {
		t.Errorf("Watch = %v, want %s… with the orchestrator's reason", err, want)
	}

	// A rerun from a step the pipeline does not have is refused, and
	// d-1 stays completed: watching it ends there.
	rerun := schemas.Event{ID: schemas.DeterministicID("d-1", "rerun"), Type: schemas.TypeSessionRerun, Session: "d-1", Time: time.Now().UTC(),
		Data: &schemas.SessionRerun{Step: "nope"}}
	if _, err := c.Bus().Publish(ctx, rerun); err != nil {
		t.Fatal(err)
	}
	if m, err := client.Watch(ctx, c.Bus(), "d-1", nil); err != nil || m == nil || m.Status != projections.StatusCompleted {
		t.Errorf("Watch d-1 = %v", err)
	}
}
