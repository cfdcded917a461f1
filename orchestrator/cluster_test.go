//go:build cluster

package orchestrator_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/internal/testnats"
	"github.com/loopbus/loopbus/orchestrator"
	"github.com/loopbus/loopbus/schemas"
	"github.com/rs/zerolog"
)

// TestClusterRunnerOnReplicatedStream runs the orchestrator on a cluster of three
// servers holding the stream at three replicas, as an operator did, and
// plays the client, the worker and the validator: sessions of two steps,
// one after another, each job passed as soon as it is requested. Every
// decision must be made when the event calling for it is read, with the
// watchdog out of the way (an hour): on such a stream the leader checks a
// decision's guard against the events it has applied, and refused the
// decisions on a session.started it had not forgotten the guard of yet,
// or on a verdict the orchestrator read from a follower before the leader
// applied it. The orchestrator took the refusal for newer events and
// waited for them: the session stopped for ever, with nothing logged.
// Without the fix, 3 runs of 4 stopped on some session (after
// session.started or a verdict). It takes about 10 s (20 s with -race).
func TestClusterRunnerOnReplicatedStream(t *testing.T) {
	t.Parallel()
	urls := testnats.ClusterURLs(t, 3)
	cat, err := schemas.NewCatalogue()
	if err != nil {
		t.Fatal(err)
	}
	connect := func(url, source string) *bus.Bus {
		t.Helper()
		// Provisioning every stream at three replicas takes a while on a
		// loaded machine.
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		b, err := bus.Connect(ctx, bus.Config{URL: url, Replicas: 3, Name: source}, source, cat, testnats.Logger(t))
		if err != nil {
			t.Fatalf("connect %s: %v", source, err)
		}
		t.Cleanup(b.Close)
		return b
	}
	ob := connect(strings.Join(urls, ","), "test/orchestrator")
	b := connect(urls[0], "test/others")
	watch := connect(urls[1], "test/watch")

	// seen follows the stream: await takes a session's events from it.
	seen := make(chan schemas.Event, 1024)
	stopWatch := testnats.Run(t, "watch", func(ctx context.Context) error {
		return watch.Read(ctx, bus.ReadOptions{Follow: true, SkipSchema: true}, func(ev schemas.Event) error {
			select {
			case seen <- ev:
			case <-ctx.Done():
			}
			return nil
		})
	})
	defer stopWatch()
	var mu sync.Mutex
	history := map[string][]schemas.Event{}
	await := func(session, typ, step string) schemas.Event {
		t.Helper()
		deadline := time.After(waitTimeout)
		for {
			mu.Lock()
			for _, ev := range history[session] {
				if ev.Type == typ && ev.Step == step {
					mu.Unlock()
					return ev
				}
			}
			mu.Unlock()
			select {
			case ev := <-seen:
				mu.Lock()
				history[ev.Session] = append(history[ev.Session], ev)
				mu.Unlock()
			case <-deadline:
				mu.Lock()
				defer mu.Unlock()
				t.Fatalf("session %s: no %s %s within %v, the orchestrator deciding nothing; events:\n%s", session, typ, step, waitTimeout, describe(history[session]))
			}
		}
	}

	sink := newLogSink(t)
	o, err := orchestrator.New(orchestrator.Config{StallAfter: time.Hour}, ob, zerolog.New(sink).Level(zerolog.InfoLevel), time.Now)
	if err != nil {
		t.Fatal(err)
	}
	stop := testnats.Run(t, "orchestrator", o.Run)
	defer stop()

	const sessions = 200
	start := time.Now()
	for i := range sessions {
		session := fmt.Sprintf("r3-%02d", i)
		startSession(t, b, session, twoSteps())
		pass(t, b, await(session, schemas.TypeJobRequested, "draft"))
		pass(t, b, await(session, schemas.TypeJobRequested, "review"))
		await(session, schemas.TypeSessionCompleted, "")
	}
	t.Logf("%d sessions of three decisions each in %v", sessions, time.Since(start).Round(time.Millisecond))
	if n := sink.count("refused as stale"); n > 0 {
		t.Errorf("%d decisions refused as stale with nothing newer in their session", n)
	}
}
