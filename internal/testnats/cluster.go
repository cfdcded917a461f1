//go:build cluster

// Clusters of embedded servers, for the tests on three nodes: those are
// kept behind the build tag cluster (make test-cluster), and so is this.

package testnats

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/schemas"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Cluster is a JetStream cluster of three embedded servers, each with its
// own store under t.TempDir(), shut down by t.Cleanup.
type Cluster struct {
	Nodes []*bus.Embedded
	URLs  []string
}

// LaggingMaxStore is the JetStream store limit (max_file_store) of the
// lagging node of LaggingCluster.
const LaggingMaxStore = 4 << 20

// LaggingCluster starts a cluster whose third node (Nodes[2], the lagging
// one) has a JetStream store of LaggingMaxStore bytes, provisions every
// stream and bucket with three replicas, and fills that store: from then
// on the node is a follower of every stream that takes nothing more (it
// drops what the leaders send, as a node whose store is full does) but
// still answers direct gets and hosts consumers from what it holds. It
// returns the cluster and a Bus connected to the other two nodes only,
// through which what is written reaches the quorum.
func LaggingCluster(t testing.TB) (*Cluster, *bus.Bus) {
	t.Helper()
	routes := []string{"nats://" + FreeAddr(t), "nats://" + FreeAddr(t), "nats://" + FreeAddr(t)}
	small := filepath.Join(t.TempDir(), "small-store.conf")
	if err := os.WriteFile(small, []byte("jetstream { max_file_store: 4MB }\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c := &Cluster{}
	for i := range routes {
		cfg := bus.EmbeddedConfig{DataDir: t.TempDir(), Listen: "127.0.0.1:0",
			ClusterListen: strings.TrimPrefix(routes[i], "nats://"), ClusterName: "lagging", Routes: routes}
		if i == 2 {
			cfg.ConfigFile = small
		}
		srv, err := bus.StartEmbedded(cfg, Logger(t))
		if err != nil {
			t.Fatalf("node %d: %v", i+1, err)
		}
		t.Cleanup(srv.Shutdown)
		c.Nodes = append(c.Nodes, srv)
		c.URLs = append(c.URLs, srv.URL())
	}
	nc, err := nats.Connect(strings.Join(c.URLs[:2], ","))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	awaitMetaLeader(t, js)
	cat, err := schemas.NewCatalogue()
	if err != nil {
		t.Fatal(err)
	}
	// Three replicas of everything take a while on a loaded machine.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	w, err := bus.Connect(ctx, bus.Config{URL: strings.Join(c.URLs[:2], ","), Replicas: 3}, "test/writer", cat, Logger(t))
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(w.Close)

	// The lagging node must lead nothing (a leader whose store is full
	// refuses writes) and must answer direct gets, as a node that was
	// healthy when its store filled up does.
	lagging := c.Nodes[2].Server().Name()
	streams := []string{bus.DefaultStream, bus.DefaultDLQStream, "KV_" + bus.DefaultViewsBucket, bus.DefaultArtifactsBucket, "KV_" + bus.DefaultWorkersBucket}
	await(t, time.Minute, "every stream led by another node than "+lagging, func() bool {
		ok := true
		for _, name := range streams {
			sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			info, err := streamInfo(sctx, js, name)
			cancel()
			if err != nil || info.Cluster == nil || info.Cluster.Leader == "" {
				ok = false
				continue
			}
			if info.Cluster.Leader == lagging {
				ok = false
				_, _ = nc.Request("$JS.API.STREAM.LEADER.STEPDOWN."+name, nil, 2*time.Second)
			}
		}
		return ok
	})
	await(t, time.Minute, lagging+" answering direct gets", func() bool {
		for _, name := range []string{bus.DefaultArtifactsBucket, "KV_" + bus.DefaultViewsBucket} {
			if !c.AnswersDirect(2, name) {
				return false
			}
		}
		return true
	})
	// Fill its store; the quorum stores the rest.
	if _, err := w.PutArtifact(ctx, "filler", "filler.bin", bytes.NewReader(make([]byte, 3*LaggingMaxStore/2))); err != nil {
		t.Fatalf("filler: %v", err)
	}
	await(t, time.Minute, lagging+"'s store to fill up", func() bool {
		jsz, err := c.Nodes[2].Server().Jsz(nil)
		return err == nil && jsz.Store > LaggingMaxStore
	})
	return c, w
}

// LastSeq is the last sequence of stream on node i (0 if it holds none).
func (c *Cluster) LastSeq(t testing.TB, i int, stream string) uint64 {
	t.Helper()
	jsz, err := c.Nodes[i].Server().Jsz(&server.JSzOptions{Accounts: true, Streams: true})
	if err != nil {
		t.Fatalf("node %d: %v", i+1, err)
	}
	for _, acc := range jsz.AccountDetails {
		for _, s := range acc.Streams {
			if s.Name == stream {
				return s.State.LastSeq
			}
		}
	}
	return 0
}

// AnswersDirect reports whether node i takes part in answering direct
// gets on stream.
func (c *Cluster) AnswersDirect(i int, stream string) bool {
	sz, err := c.Nodes[i].Server().Subsz(&server.SubszOptions{Subscriptions: true, Test: "$JS.API.DIRECT.GET." + stream})
	if err != nil {
		return false
	}
	for _, d := range sz.Subs {
		if d.Queue != "" {
			return true
		}
	}
	return false
}

func streamInfo(ctx context.Context, js jetstream.JetStream, name string) (*jetstream.StreamInfo, error) {
	s, err := js.Stream(ctx, name)
	if err != nil {
		return nil, err
	}
	return s.Info(ctx)
}

// await polls cond until it holds, failing the test after timeout.
func await(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// ClusterURLs starts n embedded servers forming one JetStream cluster, each
// on a data directory of its own, waits until the cluster has elected its
// JetStream meta leader, and returns the servers' client URLs. Connect
// with bus.Config.Replicas set to provision replicated streams.
func ClusterURLs(t testing.TB, n int) []string {
	t.Helper()
	routes := make([]string, n)
	for i := range routes {
		routes[i] = "nats://" + FreeAddr(t)
	}
	urls := make([]string, n)
	for i := range routes {
		srv, err := bus.StartEmbedded(bus.EmbeddedConfig{DataDir: t.TempDir(), Listen: "127.0.0.1:0",
			ClusterListen: strings.TrimPrefix(routes[i], "nats://"), ClusterName: "testnats", Routes: routes}, Logger(t))
		if err != nil {
			t.Fatalf("embedded NATS cluster node %d: %v", i+1, err)
		}
		t.Cleanup(srv.Shutdown)
		urls[i] = srv.URL()
	}
	nc, err := nats.Connect(strings.Join(urls, ","))
	if err != nil {
		t.Fatalf("connect to the cluster: %v", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	awaitMetaLeader(t, js)
	return urls
}

// awaitMetaLeader waits until the cluster js reaches has elected its
// JetStream meta leader (it answers account info).
func awaitMetaLeader(t testing.TB, js jetstream.JetStream) {
	t.Helper()
	await(t, time.Minute, "a JetStream meta leader", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err := js.AccountInfo(ctx)
		return err == nil
	})
}
