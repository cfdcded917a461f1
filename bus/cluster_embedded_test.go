//go:build cluster

package bus_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/internal/testnats"
	"github.com/loopbus/loopbus/schemas"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TestClusterEmbedded: three embedded servers form a JetStream cluster,
// two from EmbeddedConfig's cluster fields and one from a configuration
// file's cluster block, and hold a stream with three replicas.
func TestClusterEmbedded(t *testing.T) {
	t.Parallel()
	routes := []string{"nats://" + testnats.FreeAddr(t), "nats://" + testnats.FreeAddr(t), "nats://" + testnats.FreeAddr(t)}
	clusterAddr := func(i int) string { return strings.TrimPrefix(routes[i], "nats://") }
	var urls []string
	for i := range 2 {
		srv, _ := startEmbedded(t, bus.EmbeddedConfig{DataDir: t.TempDir(), Listen: "127.0.0.1:0", ClusterListen: clusterAddr(i), ClusterName: "test-cluster", Routes: routes})
		if want := "loopbus-" + strings.ReplaceAll(clusterAddr(i), ":", "-"); srv.Server().Name() != want {
			t.Errorf("node %d: server name %q, want %q (derived from the cluster address)", i, srv.Server().Name(), want)
		}
		urls = append(urls, srv.URL())
	}
	conf := filepath.Join(t.TempDir(), "nats.conf")
	quoted := make([]string, len(routes))
	for i, r := range routes {
		quoted[i] = `"` + r + `"`
	}
	if err := os.WriteFile(conf, []byte("server_name: third\ncluster {\n  name: test-cluster\n  listen: "+clusterAddr(2)+"\n  routes: ["+strings.Join(quoted, ", ")+"]\n}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	third, _ := startEmbedded(t, bus.EmbeddedConfig{DataDir: t.TempDir(), Listen: "127.0.0.1:0", ConfigFile: conf})
	if third.Server().Name() != "third" || third.Server().ClusterName() != "test-cluster" {
		t.Errorf("config file node: name %q cluster %q", third.Server().Name(), third.Server().ClusterName())
	}
	urls = append(urls, third.URL())

	js := clusterJetStream(t, urls)
	var info *jetstream.StreamInfo
	waitFor(t, 60*time.Second, "an R3 stream on the cluster", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		s, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: "R3", Subjects: []string{"r3.>"}, Replicas: 3})
		if err != nil {
			return false
		}
		info, err = s.Info(ctx)
		return err == nil && info.Cluster != nil && info.Cluster.Leader != "" && len(info.Cluster.Replicas) == 2
	})
	if info.Cluster.Name != "test-cluster" {
		t.Errorf("stream cluster %q, want test-cluster", info.Cluster.Name)
	}
}

// clusterJetStream connects to the cluster of urls for the test.
func clusterJetStream(t *testing.T, urls []string) jetstream.JetStream {
	t.Helper()
	nc, err := nats.Connect(strings.Join(urls, ","))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// TestClusterPublishChain: on a stream of three replicas, a
// chain refused part-way (another session's event in front of its second
// event, then a stale chain), and a stale atomic batch, leave every
// replica applying the stream: each holds the event written after them.
func TestClusterPublishChain(t *testing.T) {
	t.Parallel()
	routes := []string{"nats://" + testnats.FreeAddr(t), "nats://" + testnats.FreeAddr(t), "nats://" + testnats.FreeAddr(t)}
	var nodes []*bus.Embedded
	var urls []string
	for i := range routes {
		srv, _ := startEmbedded(t, bus.EmbeddedConfig{DataDir: t.TempDir(), Listen: "127.0.0.1:0",
			ClusterListen: strings.TrimPrefix(routes[i], "nats://"), ClusterName: "chain", Routes: routes})
		nodes = append(nodes, srv)
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
	// Provisioning every stream with three replicas takes a while on a
	// loaded machine: more than testnats.ConnectConfig waits.
	cctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	b, err := bus.Connect(cctx, bus.Config{URL: strings.Join(urls, ","), Replicas: 3}, "test/chain", cat, testnats.Logger(t))
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(b.Close)
	ctx := ctxT(t)
	seed := publish(t, b, jobRequested("s1", "r0"))
	res, err := b.PublishChain(ctx, "s1", seed, []schemas.Event{jobStarted("s1", "c1"), jobRequested("s1", "c2")})
	if err != nil {
		t.Fatalf("chain: %v", err)
	}
	publish(t, b, jobStarted("s2", "other"))
	if res, err = b.PublishChain(ctx, "s1", res.Seq, []schemas.Event{jobRequested("s1", "c2"), jobStarted("s1", "c3")}); err != nil {
		t.Fatalf("chain after another session's event: %v", err)
	}
	if _, err := b.PublishChain(ctx, "s1", seed, []schemas.Event{jobStarted("s1", "c4"), jobStarted("s1", "c5")}); !errors.Is(err, bus.ErrStale) {
		t.Fatalf("stale chain of two: %v, want ErrStale", err)
	}
	// Atomic batches, refused and written, on the same stream.
	if _, err := b.PublishBatch(ctx, "s1", seed, []schemas.Event{jobStarted("s1", "b1"), jobStarted("s1", "b2")}); !errors.Is(err, bus.ErrStale) {
		t.Fatalf("stale batch: %v, want ErrStale", err)
	}
	if res, err = b.PublishBatch(ctx, "s1", res.Seq, []schemas.Event{jobStarted("s1", "b3"), jobStarted("s1", "b4")}); err != nil {
		t.Fatalf("batch: %v", err)
	}
	last := publish(t, b, jobStarted("s2", "after"))
	if last != res.Seq+1 {
		t.Errorf("event after the chains at %d, want %d", last, res.Seq+1)
	}
	waitFor(t, 30*time.Second, fmt.Sprintf("every replica to hold event %d", last), func() bool {
		for _, n := range nodes {
			jsz, err := n.Server().Jsz(&server.JSzOptions{Accounts: true, Streams: true})
			if err != nil {
				return false
			}
			held := uint64(0)
			for _, acc := range jsz.AccountDetails {
				for _, s := range acc.Streams {
					if s.Name == bus.DefaultStream {
						held = s.State.LastSeq
					}
				}
			}
			if held != last {
				return false
			}
		}
		return true
	})
}
