package agentworker_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/loopbus/loopbus/agentworker"
	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/internal/testnats"
	"github.com/loopbus/loopbus/schemas"
	"github.com/nats-io/nats.go/jetstream"
)

// TestJobLeftToItsLiveHolder: a job handed out again while the worker
// that started it is still there (its presence record lists the job) is
// handed back, not run, however often it comes; once that worker is gone
// (its record deleted) the next hand-out runs it. The holder here is a
// record and a job.started of a worker that is not a process: its first
// delivery is taken from the consumer by hand and never acknowledged, as
// a holder cut off from the server leaves it.
func TestJobLeftToItsLiveHolder(t *testing.T) {
	b, _ := testnats.Bus(t)
	ctx := context.Background()
	// A worker makes its consumer (ack wait 1 s), then stops.
	stop := startWorker(t, b, agentworker.Config{ID: "w0", AckWait: time.Second})
	var cons jetstream.Consumer
	for deadline := time.Now().Add(waitTimeout); cons == nil; time.Sleep(50 * time.Millisecond) {
		cons, _ = b.JetStream().Consumer(ctx, b.StreamName(), agentworker.ConsumerName)
		if time.Now().After(deadline) {
			t.Fatal("the worker made no consumer")
		}
	}
	stop()
	jr := request("s1.step.1", "step", 1, writeScript(t, blockingAgent), "report.txt")
	reqSeq := publishRequest(t, b, jr)
	batch, err := cons.Fetch(1, jetstream.FetchMaxWait(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var first jetstream.Msg
	for m := range batch.Messages() {
		first = m
	}
	if first == nil {
		t.Fatal("the request was not handed out")
	}
	if md, err := first.Metadata(); err != nil || md.Sequence.Stream != reqSeq || md.NumDelivered != 1 {
		t.Fatalf("handed out %+v (%v), want the request's first delivery", md, err)
	}
	if _, err := b.Publish(ctx, schemas.Event{
		ID: schemas.DeterministicID("test", session, "job.started", jr.JobID), Type: schemas.TypeJobStarted,
		Session: session, Step: jr.Step, Job: jr.JobID, Correlation: session, Time: time.Now(),
		Data: &schemas.JobStarted{JobID: jr.JobID, Worker: "ghost", Delivery: 1},
	}); err != nil {
		t.Fatal(err)
	}
	if err := b.PutWorker(ctx, bus.WorkerInfo{ID: "ghost", Lanes: []string{"fs"}, Jobs: []string{session + "/" + jr.JobID}}); err != nil {
		t.Fatal(err)
	}

	startWorker(t, b, agentworker.Config{ID: "w1", AckWait: time.Second})
	// Three more hand-outs (one an ack wait after the other), each left
	// to the holder.
	deadline := time.Now().Add(waitTimeout)
	for {
		info, err := cons.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.Delivered.Consumer >= 4 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the job was handed out %d times in %v, want 4", info.Delivered.Consumer, waitTimeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if started := ofType(ofJob(sessionEvents(t, b), jr.JobID), schemas.TypeJobStarted); len(started) != 1 {
		t.Fatalf("the job was started again while its holder was there:%s", describe(started))
	}

	// The holder goes: the next hand-out runs the job.
	if err := b.DeleteWorker(ctx, "ghost"); err != nil {
		t.Fatal(err)
	}
	all, res := waitResult(t, b, jr.JobID)
	if res.Type != schemas.TypeJobCompleted {
		t.Fatalf("result %s, want job.completed; events:%s", res.Type, describe(all))
	}
	var got []string
	for _, ev := range ofType(ofJob(all, jr.JobID), schemas.TypeJobStarted) {
		js := ev.Data.(*schemas.JobStarted)
		got = append(got, fmt.Sprintf("%s/%d", js.Worker, js.Delivery))
	}
	if len(got) != 2 || got[0] != "ghost/1" || !strings.HasPrefix(got[1], "w1/") || got[1] == "w1/2" {
		t.Errorf("job.started (worker/delivery) = %v, want ghost/1 then w1 once, after hand-outs left to ghost", got)
	}
}
