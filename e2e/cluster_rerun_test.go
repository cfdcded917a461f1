//go:build cluster

package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestClusterFrozenNodeRunsNoJobTwice: each agent worker is connected to
// one node of a 3-node cluster; with every session's agent running, the
// node of the worker holding the first job is frozen (SIGSTOP) for longer
// than the workers' ack wait. The holder leaves the frozen node for
// another within seconds and keeps its jobs; a job handed out again
// meanwhile is left to it, as its holder is still there. No agent runs a
// second time, and every session completes.
func TestClusterFrozenNodeRunsNoJobTwice(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	release := filepath.Join(dir, "release")
	writeFiles(t, dir, map[string]string{
		"held.sh":   "set -eu\ni=0\nwhile [ ! -e \"$RELEASE\" ]; do sleep 0.1; i=$((i+1)); [ $i -lt 1800 ] || exit 9; done\necho done > \"$LOOPBUS_OUTPUT_DIR/a.txt\"\n",
		"input.txt": "x\n",
		"pipeline.yaml": `name: frozen
steps:
  held:
    agent: {backend: exec, command: [sh, held.sh], env: {RELEASE: ` + release + `}}
    prompt: held
    outputs: [{name: a.txt}]
`,
	})
	c := startCluster(t, dir)
	c.svc(t, "orchestrator", "orchestrator")
	if !within(90*time.Second, func() bool { return c.allLed("") }) {
		t.Fatalf("the orchestrator did not provision %v in 90s\n%s", clusterStreams, tails(c.all))
	}
	c.svc(t, "validator", "validator")
	c.svc(t, "projector", "projector")
	// Each worker is given one node (it learns the others from it).
	workerNode := map[string]*clusterNode{"worker-1": c.nodes[1], "worker-2": c.nodes[2]}
	var workers []*process
	for id, n := range workerNode {
		p := startProcess(t, dir, id, "agentworker", "--id", id, "--concurrency", "2", "--ack-wait", "6s", "--nats", n.url, "--replicas", "3")
		c.all = append(c.all, p)
		workers = append(workers, p)
	}
	if !within(90*time.Second, func() bool {
		for _, p := range workers {
			if b, _ := os.ReadFile(p.log); !strings.Contains(string(b), "agent worker ready") {
				return false
			}
		}
		return true
	}) {
		t.Fatalf("the workers were not ready in 90s\n%s", tails(c.all))
	}

	var sessions []string
	for i := range 4 {
		s := fmt.Sprintf("frozen-%d", i+1)
		sessions = append(sessions, s)
		r := loopbus(t, append([]string{"run", filepath.Join(dir, "pipeline.yaml"), "--input", filepath.Join(dir, "input.txt"), "--session", s, "--detach"}, c.global...)...)
		if r.code != 0 {
			t.Fatalf("run %s --detach: exit %d\n%s\n%s", s, r.code, r.stderr, tails(c.all))
		}
	}
	holders := map[string]string{}
	if !within(120*time.Second, func() bool {
		for _, s := range sessions {
			for _, e := range clusterEvents(t, c.global, s, c.all) {
				if e.Type == "loopbus.job.started" {
					var js struct {
						Worker string `json:"worker"`
					}
					_ = json.Unmarshal(e.Data, &js)
					holders[s] = js.Worker
				}
			}
			if holders[s] == "" {
				return false
			}
		}
		return true
	}) {
		t.Fatalf("the agents did not all start in 120s (%v)\n%s", holders, tails(c.all))
	}
	victim := workerNode[holders[sessions[0]]]
	t.Logf("jobs held by %v; freezing %s, the node of %s's worker", holders, victim.name, sessions[0])
	if err := victim.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	thawed := false
	thaw := func() {
		if !thawed {
			thawed = true
			_ = victim.cmd.Process.Signal(syscall.SIGCONT)
		}
	}
	t.Cleanup(thaw)
	// The node stays frozen until a job was handed out again (ack wait:
	// 6 s) and either left to its holder or run a second time.
	handedBack := func() int {
		n := 0
		for _, p := range workers {
			b, _ := os.ReadFile(p.log)
			n += strings.Count(string(b), "leaving it to that worker") + strings.Count(string(b), "while this worker still runs it")
		}
		return n
	}
	// rerun: a second job.started is stored. Read through the nodes not
	// frozen; a read that fails now is tried again at the next poll.
	var others []string
	for _, n := range c.nodes {
		if n != victim {
			others = append(others, n.url)
		}
	}
	rerun := func() bool {
		for _, s := range sessions {
			r := loopbus(t, "events", "--session", s, "--type", "job.started", "--json", "--nats", strings.Join(others, ","), "--replicas", "3")
			if r.code == 0 && strings.Count(r.stdout, "loopbus.job.started") > 1 {
				return true
			}
		}
		return false
	}
	// Or the holder reconnected to another node and two ack waits passed
	// since with no job handed out again: its in-progress signals kept
	// its jobs.
	var holder *process
	for _, p := range workers {
		if p.name == holders[sessions[0]] {
			holder = p
		}
	}
	frozen := time.Now()
	var reconnected time.Time
	if !within(90*time.Second, func() bool {
		if handedBack() > 0 || rerun() {
			return true
		}
		if b, _ := os.ReadFile(holder.log); reconnected.IsZero() && strings.Contains(string(b), "reconnected to NATS") {
			reconnected = time.Now()
			t.Logf("%s reconnected %v after the freeze", holder.name, time.Since(frozen).Round(100*time.Millisecond))
		}
		return !reconnected.IsZero() && time.Since(reconnected) > 12*time.Second
	}) {
		t.Fatalf("in 90s with %s frozen, no job was handed out again and %s did not reconnect\n%s", victim.name, holder.name, tails(c.all))
	}
	t.Logf("thawing %s %v after the freeze", victim.name, time.Since(frozen).Round(100*time.Millisecond))
	thaw()
	if err := os.WriteFile(release, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, s := range sessions {
		w := loopbus(t, append([]string{"wait", s, "--json"}, c.global...)...)
		if w.code != 0 {
			t.Fatalf("wait %s: exit %d\n%s\n%s", s, w.code, w.stderr, tails(c.all))
		}
		if m := parseManifest(t, w.stdout); m.Status != "completed" {
			t.Fatalf("session %s: %+v", s, m)
		}
		evs := clusterEvents(t, c.global, s, c.all)
		if n := count(evs, "loopbus.job.started", "held"); n != 1 {
			t.Errorf("session %s: the agent started %d times, want once", s, n)
		}
		if n := count(evs, "loopbus.step.completed", "held"); n != 1 {
			t.Errorf("session %s: %d step.completed, want 1", s, n)
		}
	}
	t.Logf("jobs handed out again and left to their holder: %d", handedBack())
}
