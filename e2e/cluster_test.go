//go:build cluster

package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/loopbus/loopbus/internal/testnats"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// process is a long-running child of a test with its output in a log file.
type process struct {
	name string
	cmd  *exec.Cmd
	log  string
}

// startProcess runs binary with args until the test ends, output to
// dir/<name>.log. It is killed at cleanup if still running.
func startProcess(t *testing.T, dir, name string, args ...string) *process {
	t.Helper()
	p := &process{name: name, log: filepath.Join(dir, name+".log")}
	f, err := os.Create(p.log)
	if err != nil {
		t.Fatal(err)
	}
	p.cmd = exec.Command(binary, args...)
	p.cmd.Env = testEnv(t)
	p.cmd.Stdout, p.cmd.Stderr = f, f
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = p.cmd.Wait(); f.Close(); close(exited) }()
	t.Cleanup(func() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = p.cmd.Process.Kill()
			<-exited
		}
	})
	return p
}

// tail is the end of the process's log, for failure messages, without
// a node's attempts to reach a killed node, which would fill it.
func (p *process) tail() string {
	b, _ := os.ReadFile(p.log)
	var kept []string
	retries := 0
	for _, line := range strings.Split(string(b), "\n") {
		if strings.Contains(line, "Error trying to connect to route") {
			retries++
			continue
		}
		kept = append(kept, line)
	}
	out := strings.Join(kept, "\n")
	if len(out) > 4000 {
		out = out[len(out)-4000:]
	}
	if retries > 0 {
		out = fmt.Sprintf("(%d attempts to connect to a route left out)\n%s", retries, out)
	}
	return fmt.Sprintf("--- %s (%s):\n%s", p.name, p.log, out)
}

func tails(ps []*process) string {
	var out []string
	for _, p := range ps {
		out = append(out, p.tail())
	}
	return strings.Join(out, "\n")
}

// clusterNode is one `loopbus nats` process of a test cluster.
type clusterNode struct {
	*process
	url  string
	args []string // to start it again
}

// TestClusterNodeKilledMidRun: three `loopbus nats` nodes form a JetStream
// cluster; the services provision everything with three replicas. With the
// second step of every session running, the stream leader's node is
// SIGKILLed; every session still completes, each step exactly once.
func TestClusterNodeKilledMidRun(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	release := filepath.Join(dir, "release")
	writeFiles(t, dir, map[string]string{
		"first.sh":  "set -eu\necho first > \"$LOOPBUS_OUTPUT_DIR/a.txt\"\n",
		"second.sh": "set -eu\ni=0\nwhile [ ! -e \"$RELEASE\" ]; do sleep 0.1; i=$((i+1)); [ $i -lt 1800 ] || exit 9; done\ncat \"$LOOPBUS_INPUT_DIR/a.txt\" > \"$LOOPBUS_OUTPUT_DIR/b.txt\"\n",
		"third.sh":  "set -eu\ncat \"$LOOPBUS_INPUT_DIR/b.txt\" > \"$LOOPBUS_OUTPUT_DIR/c.txt\"\n",
		"input.txt": "x\n",
		"pipeline.yaml": `name: cluster
steps:
  first:
    agent: {backend: exec, command: [sh, first.sh]}
    prompt: first
    outputs: [{name: a.txt}]
  second:
    requires: [first]
    agent: {backend: exec, command: [sh, second.sh], env: {RELEASE: ` + release + `}}
    prompt: second
    outputs: [{name: b.txt}]
  third:
    requires: [second]
    agent: {backend: exec, command: [sh, third.sh]}
    prompt: third
    outputs: [{name: c.txt}]
`,
	})

	c := startCluster(t, dir)
	c.startServices(t, nil, []string{"--ack-wait", "10s"})
	nodes, global, all := c.nodes, c.global, c.all

	sessions := []string{"cl-1", "cl-2", "cl-3"}
	for _, s := range sessions {
		r := loopbus(t, append([]string{"run", filepath.Join(dir, "pipeline.yaml"), "--input", filepath.Join(dir, "input.txt"), "--session", s, "--detach"}, global...)...)
		if r.code != 0 {
			t.Fatalf("run %s --detach: exit %d\n%s\n%s", s, r.code, r.stderr, tails(all))
		}
	}
	for _, s := range sessions {
		if !within(120*time.Second, func() bool { return count(clusterEvents(t, global, s, all), "loopbus.job.started", "second") > 0 }) {
			t.Fatalf("session %s: second step did not start in 120s\n%s", s, tails(all))
		}
	}

	// Kill the node that leads the event stream: its followers must elect
	// a new leader while jobs are in flight.
	info := c.streamInfo("LOOPBUS")
	if info == nil || info.Cluster == nil {
		t.Fatalf("no info on stream LOOPBUS\n%s", tails(all))
	}
	victim := nodes[0]
	for _, n := range nodes {
		if n.name == info.Cluster.Leader {
			victim = n
		}
	}
	t.Logf("SIGKILL %s (stream LOOPBUS leader %q)", victim.name, info.Cluster.Leader)
	if err := victim.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(release, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	// Reading commands provision too, which needs every stream led.
	if !within(60*time.Second, func() bool { return c.allLed(victim.name) }) {
		t.Fatalf("%v not all led by the remaining nodes 60s after %s was killed\n%s", clusterStreams, victim.name, tails(all))
	}
	t.Logf("stream LOOPBUS: new leader %q after %v", c.streamInfo("LOOPBUS").Cluster.Leader, time.Since(killed).Round(100*time.Millisecond))

	for _, s := range sessions {
		w := loopbus(t, append([]string{"wait", s, "--json"}, global...)...)
		if w.code != 0 {
			t.Fatalf("wait %s: exit %d\n%s\n%s", s, w.code, w.stderr, tails(all))
		}
		if m := parseManifest(t, w.stdout); m.Status != "completed" {
			t.Fatalf("session %s: %+v", s, m)
		}
		evs := clusterEvents(t, global, s, all)
		for _, step := range []string{"first", "second", "third"} {
			if n := count(evs, "loopbus.step.completed", step); n != 1 {
				t.Errorf("session %s: %d step.completed for %s, want 1", s, n, step)
			}
		}
		if n := count(evs, "loopbus.session.completed", ""); n != 1 {
			t.Errorf("session %s: %d session.completed, want 1", s, n)
		}
	}
	t.Logf("all sessions completed %v after the kill", time.Since(killed).Round(100*time.Millisecond))
}

// testCluster is three `loopbus nats` nodes forming a JetStream cluster,
// and the loopbus services on it, each a process of the test.
type testCluster struct {
	nodes []*clusterNode
	// all is every process: the nodes, then the services.
	all []*process
	// global are the flags that reach the cluster with three replicas.
	global []string
	js     jetstream.JetStream
	dir    string
}

// startCluster starts three nodes, each with its own data directory
// under dir, all given the same route list (a node ignores the route to
// itself), and waits for JetStream's meta leader. Their logs are in the
// test's log if it fails.
func startCluster(t *testing.T, dir string) *testCluster {
	t.Helper()
	var clientAddrs, routeURLs []string
	for range 3 {
		clientAddrs = append(clientAddrs, testnats.FreeAddr(t))
		routeURLs = append(routeURLs, "nats://"+testnats.FreeAddr(t))
	}
	c := &testCluster{dir: dir}
	for i := range 3 {
		name := fmt.Sprintf("n%d", i+1)
		args := []string{"nats", "--data", filepath.Join(dir, name), "--listen", clientAddrs[i],
			"--name", name, "--cluster-name", "loopbus-e2e",
			"--cluster-listen", strings.TrimPrefix(routeURLs[i], "nats://"), "--routes", strings.Join(routeURLs, ",")}
		p := startProcess(t, dir, name, args...)
		c.nodes = append(c.nodes, &clusterNode{process: p, url: "nats://" + clientAddrs[i], args: args})
		c.all = append(c.all, p)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(tails(c.all))
		}
	})
	var urls []string
	for _, n := range c.nodes {
		urls = append(urls, n.url)
	}
	natsURL := strings.Join(urls, ",")
	// The nodes may not listen yet: keep trying in the background.
	// Quick pings: the test's requests leave a frozen node within seconds.
	nc, err := nats.Connect(natsURL, nats.RetryOnFailedConnect(true), nats.MaxReconnects(-1), nats.ReconnectWait(200*time.Millisecond),
		nats.PingInterval(2*time.Second), nats.MaxPingsOutstanding(2))
	if err != nil {
		t.Fatalf("connect %s: %v\n%s", natsURL, err, tails(c.all))
	}
	t.Cleanup(nc.Close)
	if c.js, err = jetstream.New(nc); err != nil {
		t.Fatal(err)
	}
	// JetStream answers once the cluster has elected a meta leader.
	jsReady := func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err := c.js.AccountInfo(ctx)
		return err == nil
	}
	if !within(90*time.Second, jsReady) {
		t.Fatalf("the cluster elected no JetStream meta leader in 90s\n%s", tails(c.all))
	}
	c.global = []string{"--nats", natsURL, "--replicas", "3"}
	return c
}

// clusterStreams are the streams loopbus stores in, each replicated to
// all three nodes.
var clusterStreams = []string{"LOOPBUS", "LOOPBUS_DLQ", "KV_LOOPBUS_VIEWS", "LOOPBUS_ARTIFACTS"}

// streamInfo is the info of stream name, nil if it cannot be had.
func (c *testCluster) streamInfo(name string) *jetstream.StreamInfo {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := c.js.Stream(ctx, name)
	if err != nil {
		return nil
	}
	info, err := s.Info(ctx)
	if err != nil {
		return nil
	}
	return info
}

// allLed: every stream has a leader, and it is not on the node skip.
func (c *testCluster) allLed(skip string) bool {
	for _, name := range clusterStreams {
		if info := c.streamInfo(name); info == nil || info.Cluster == nil || info.Cluster.Leader == "" || info.Cluster.Leader == skip {
			return false
		}
	}
	return true
}

// svc starts a service process of the cluster.
func (c *testCluster) svc(t *testing.T, name string, args ...string) *process {
	t.Helper()
	p := startProcess(t, c.dir, name, append(args, c.global...)...)
	c.all = append(c.all, p)
	return p
}

// startServices starts the orchestrator (with orchestratorArgs), then
// the validator, the projector and two agent workers of two job slots
// (with workerArgs), each connected to every node, and waits until each
// is ready and every stream is replicated to the three nodes.
func (c *testCluster) startServices(t *testing.T, orchestratorArgs, workerArgs []string) {
	t.Helper()
	// The orchestrator provisions alone first: a service exits when its
	// provisioning fails, and on a loaded machine several processes
	// creating R3 streams at once can exceed the JetStream API timeout.
	first := len(c.all)
	c.svc(t, "orchestrator", append([]string{"orchestrator"}, orchestratorArgs...)...)
	if !within(90*time.Second, func() bool { return c.allLed("") }) {
		t.Fatalf("the orchestrator did not provision %v in 90s\n%s", clusterStreams, tails(c.all))
	}
	c.svc(t, "validator", "validator")
	c.svc(t, "projector", "projector")
	c.svc(t, "worker-1", append([]string{"agentworker", "--id", "worker-1", "--concurrency", "2"}, workerArgs...)...)
	c.svc(t, "worker-2", append([]string{"agentworker", "--id", "worker-2", "--concurrency", "2"}, workerArgs...)...)
	ready := map[string]string{
		"orchestrator": "caught up with the stream", "validator": "validator ready", "projector": "views caught up",
		"worker-1": "agent worker ready", "worker-2": "agent worker ready",
	}
	if !within(90*time.Second, func() bool {
		for _, p := range c.all[first:] {
			if b, _ := os.ReadFile(p.log); !strings.Contains(string(b), ready[p.name]) {
				return false
			}
		}
		return true
	}) {
		t.Fatalf("the services were not all ready in 90s\n%s", tails(c.all))
	}
	for _, name := range clusterStreams {
		info := c.streamInfo(name)
		if info == nil {
			t.Fatalf("stream %s: no info", name)
		}
		if info.Config.Replicas != 3 || len(info.Cluster.Replicas) != 2 {
			t.Errorf("stream %s: %d replicas configured, leader %s and %d followers; want 3 on 3 nodes", name, info.Config.Replicas, info.Cluster.Leader, len(info.Cluster.Replicas))
		}
	}
}

// clusterEvents is events, with the processes' logs on failure.
func clusterEvents(t *testing.T, global []string, session string, ps []*process) []cloudEvent {
	t.Helper()
	r := loopbus(t, append([]string{"events", "--session", session, "--json"}, global...)...)
	if r.code != 0 {
		t.Fatalf("events --session %s: exit %d\n%s\n%s", session, r.code, r.stderr, tails(ps))
	}
	return events(t, global, session)
}
