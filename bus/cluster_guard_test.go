//go:build cluster

package bus_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/internal/testnats"
	"github.com/loopbus/loopbus/schemas"
)

// TestClusterGuardedPublishAfterRead plays the orchestrator on
// a stream of three replicas: for each of many sessions, a reader that
// has just been given the session's newest event publishes an event
// guarded on it (PublishExpect with that event's sequence), as a decision
// is. Every such publish must be written: nothing else writes to the
// session meanwhile. The newest event is either written with a guard
// itself (session.started is: the leader then refuses a guard on the
// session, naming no sequence, until it has forgotten that one), or
// without (a verdict is: the reader, served by a follower, may be given
// it before the leader has applied it, and the leader refuses the guard
// naming the sequence before). Both refusals used to be returned as
// ErrStale, which the orchestrator took for "newer events exist" and
// waited for them, for ever: about 4 % of such publishes. It takes about
// 10 s.
func TestClusterGuardedPublishAfterRead(t *testing.T) {
	t.Parallel()
	routes := []string{"nats://" + testnats.FreeAddr(t), "nats://" + testnats.FreeAddr(t), "nats://" + testnats.FreeAddr(t)}
	var urls []string
	for i := range routes {
		srv, _ := startEmbedded(t, bus.EmbeddedConfig{DataDir: t.TempDir(), Listen: "127.0.0.1:0",
			ClusterListen: strings.TrimPrefix(routes[i], "nats://"), ClusterName: "guard", Routes: routes})
		urls = append(urls, srv.URL())
	}
	js := clusterJetStream(t, urls)
	waitFor(t, 60*time.Second, "the cluster's JetStream meta leader", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err := js.AccountInfo(ctx)
		return err == nil
	})
	cat, err := schemas.NewCatalogue()
	if err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	connect := func(url, source string) *bus.Bus {
		b, err := bus.Connect(cctx, bus.Config{URL: url, Replicas: 3}, source, cat, testnats.Logger(t))
		if err != nil {
			t.Fatalf("connect: %v", err)
		}
		t.Cleanup(b.Close)
		return b
	}
	decider := connect(strings.Join(urls, ","), "test/decider")
	writer := connect(urls[0], "test/writer")

	// The reader answers a session's first event ("a…", written guarded)
	// with "b…" and its second ("c…", written unguarded once "b…" was
	// answered) with "d…", each guarded on the event it answers, in the
	// background as the orchestrator does; answered gets the outcomes.
	const sessions = 300
	type outcome struct {
		id  string
		err error
	}
	answered := make(chan outcome, 2*sessions)
	rctx, rcancel := context.WithCancel(context.Background())
	read := make(chan error, 1)
	caughtUp := make(chan struct{})
	go func() {
		read <- decider.Read(rctx, bus.ReadOptions{Follow: true, OnCaughtUp: func() { close(caughtUp) }}, func(ev schemas.Event) error {
			answer, ok := map[byte]string{'a': "b", 'c': "d"}[ev.ID[0]]
			if !ok {
				return nil
			}
			go func() {
				ctx, cancel := context.WithTimeout(rctx, 30*time.Second)
				defer cancel()
				id := answer + ev.ID[1:]
				_, err := decider.PublishExpect(ctx, jobStarted(ev.Session, id), ev.Seq)
				if err != nil {
					err = fmt.Errorf("guarded on %d: %w", ev.Seq, err)
				}
				answered <- outcome{id, err}
			}()
			return nil
		})
	}()
	defer func() {
		rcancel()
		if err := <-read; err != nil {
			t.Errorf("Read: %v", err)
		}
	}()
	<-caughtUp
	var refused []string
	// await waits for the answer id.
	await := func(id string) {
		t.Helper()
		select {
		case o := <-answered:
			if o.id != id {
				t.Fatalf("answer %s, want %s", o.id, id)
			}
			if o.err != nil {
				refused = append(refused, fmt.Sprintf("%s: %v", o.id, o.err))
			}
		case <-time.After(time.Minute):
			t.Fatalf("no answer %s in a minute", id)
		}
	}
	for i := range sessions {
		// A bound for each session's writes, not the whole run's: on a
		// loaded machine 300 sessions take longer than any one write may.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		s := fmt.Sprintf("g%d", i)
		if _, err := writer.PublishExpect(ctx, jobStarted(s, fmt.Sprintf("a%d", i)), 0); err != nil {
			t.Fatalf("session %s: first event: %v", s, err)
		}
		await(fmt.Sprintf("b%d", i))
		if _, err := writer.Publish(ctx, jobStarted(s, fmt.Sprintf("c%d", i))); err != nil {
			t.Fatalf("session %s: third event: %v", s, err)
		}
		await(fmt.Sprintf("d%d", i))
	}
	if len(refused) > 0 {
		t.Errorf("%d of %d guarded answers refused although nothing else wrote to their sessions:\n%s",
			len(refused), 2*sessions, strings.Join(refused, "\n"))
	}
}
