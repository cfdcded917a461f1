//go:build cluster

package agentworker_test

import (
	"bytes"
	"context"
	"testing"

	"github.com/loopbus/loopbus/agentworker"
	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/internal/testnats"
	"github.com/loopbus/loopbus/schemas"
)

// TestClusterJobOnLaggingReplica: a worker connected only to a node whose
// JetStream store is full (it takes no more writes, yet answers direct
// gets from the history it holds) runs a job whose input was stored after
// the node filled up. The node lacks the input; the worker reads it from
// the stream's leader, and the job completes at its first start with the
// input's content: a lagging replica never makes a step fail with
// "artifact not found", nor a job run again.
func TestClusterJobOnLaggingReplica(t *testing.T) {
	t.Parallel()
	c, w := testnats.LaggingCluster(t)
	in := putArtifact(t, w, session+"/input/talk.txt", "talk.txt", []byte("the talk, stored after the node filled up\n"))
	if held, last := c.LastSeq(t, 2, bus.DefaultArtifactsBucket), c.LastSeq(t, 0, bus.DefaultArtifactsBucket); held >= last {
		t.Fatalf("the lagging node holds the artifacts up to %d of %d: it does not lag", held, last)
	}
	lagging := testnats.ConnectConfig(t, bus.Config{URL: c.URLs[2], Replicas: 3}, "test/lagging-worker", testnats.Logger(t))
	startWorker(t, lagging, agentworker.Config{ID: "w-lagging"})

	jr := request("s1.read.1", "read", 1, writeScript(t, `cat "$LOOPBUS_INPUT_DIR"/* > "$LOOPBUS_OUTPUT_DIR/report.txt"`), "report.txt")
	jr.Inputs = []schemas.ArtifactRef{in}
	publishRequest(t, w, jr)
	all, res := waitResult(t, w, jr.JobID)
	if res.Type != schemas.TypeJobCompleted {
		t.Fatalf("result %s, want job.completed; events:%s", res.Type, describe(all))
	}
	// Once: the input was found at the first try, not after the job was
	// handed out again until a hand-out reached a replica that held it.
	if started := ofType(ofJob(all, jr.JobID), schemas.TypeJobStarted); len(started) != 1 {
		t.Errorf("the job was started %d times, want once:%s", len(started), describe(all))
	}
	done := res.Data.(*schemas.JobCompleted)
	if len(done.Artifacts) != 1 {
		t.Fatalf("job.completed with %d artifacts, want report.txt", len(done.Artifacts))
	}
	var got bytes.Buffer
	if err := w.GetArtifact(context.Background(), done.Artifacts[0], &got); err != nil {
		t.Fatal(err)
	}
	if got.String() != "the talk, stored after the node filled up\n" {
		t.Errorf("report.txt = %q, want the input's content", got.String())
	}
}
