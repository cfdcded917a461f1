//go:build cluster

package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// TestClusterFaults: on three `loopbus nats` nodes with every stream at
// three replicas, short sessions (two steps, each an exec agent that
// records its run and sleeps 0.1 s) are submitted one after another by
// four submitters while
//
//  1. the node leading the event stream is killed (SIGKILL) and started
//     again 10 s later, and, once it has caught up,
//  2. the node then leading the event stream is frozen (SIGSTOP) for 30 s,
//     three times the workers' ack wait, then let go (SIGCONT).
//
// Every session completes, each step once; each agent runs at most once
// more per fault; the restarts `sessions --json` reports are the
// job.started events beyond each job's first, and match the agents' extra
// runs; the orchestrator's watchdog never has a decision to make. It
// logs the figures docs/CLUSTER.md gives: leader elections,
// how long until sessions completed again, the restarts.
//
// It runs in `make test-cluster` (a build tag keeps it out of `make
// test`), a few minutes on two cores. LOOPBUS_E2E_FAULT_SESSIONS sets the
// number of sessions (300); LOOPBUS_E2E_KEEP=DIR keeps the processes'
// logs in a new directory under DIR.
func TestClusterFaults(t *testing.T) {
	sessions := 300
	if v := os.Getenv("LOOPBUS_E2E_FAULT_SESSIONS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 3 {
			t.Fatalf("LOOPBUS_E2E_FAULT_SESSIONS=%q: want a number of at least 3", v)
		}
		sessions = n
	}
	const faults = 2
	dir := t.TempDir()
	if keep := os.Getenv("LOOPBUS_E2E_KEEP"); keep != "" {
		// The logs of every process, and runs.log, stay there for a look.
		if err := os.MkdirAll(keep, 0o755); err != nil {
			t.Fatal(err)
		}
		var err error
		if dir, err = os.MkdirTemp(keep, "faults-"); err != nil {
			t.Fatal(err)
		}
		t.Logf("logs kept in %s", dir)
	}
	runsLog := filepath.Join(dir, "runs.log")
	step := func(name, out string, requires string) string {
		s := "  " + name + ":\n"
		if requires != "" {
			s += "    requires: [" + requires + "]\n"
		}
		return s + fmt.Sprintf("    agent: {backend: exec, command: [sh, agent.sh], env: {RUNS: %s, OUT: %s}}\n    prompt: %s\n    outputs: [{name: %s}]\n",
			runsLog, out, name, out)
	}
	writeFiles(t, dir, map[string]string{
		"input.txt": "x\n",
		"agent.sh": `set -eu
echo "$LOOPBUS_SESSION $LOOPBUS_STEP $LOOPBUS_JOB" >> "$RUNS"
sleep 0.1
{ echo "$LOOPBUS_STEP"; cat "$LOOPBUS_INPUT_DIR"/*; } > "$LOOPBUS_OUTPUT_DIR/$OUT"
`,
		"pipeline.yaml": "name: faults\nsteps:\n" + step("first", "a.txt", "") + step("second", "b.txt", "first"),
	})
	c := startCluster(t, dir)
	c.startServices(t, nil, []string{"--ack-wait", "10s"})
	orchestrator := c.all[len(c.nodes)]

	// The submitters run the CLI as a user would, retrying a submission
	// that failed while the cluster had no leader (a session the failed
	// attempt did create is found to exist: submitted).
	env := testEnv(t)
	cli := func(args ...string) (result, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, binary, append(args, c.global...)...)
		cmd.Env = env
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		r := result{stdout: out.String(), stderr: errb.String()}
		var ee *exec.ExitError
		switch {
		case errors.As(err, &ee):
			r.code = ee.ExitCode()
		case err != nil:
			return r, err
		}
		if ctx.Err() != nil {
			return r, fmt.Errorf("loopbus %v: timed out\n%s", args, r.stderr)
		}
		return r, nil
	}
	ids := make([]string, sessions)
	for i := range ids {
		ids[i] = fmt.Sprintf("f-%03d", i)
	}
	var submitted, retried atomic.Int64
	var subMu sync.Mutex
	var subErrs, failedOnce []string
	next := make(chan string)
	var subs sync.WaitGroup
	for range 4 {
		subs.Add(1)
		go func() {
			defer subs.Done()
			for id := range next {
				var last string
				ok := false
				for attempt := range 5 {
					if attempt > 0 {
						retried.Add(1)
					}
					r, err := cli("run", filepath.Join(dir, "pipeline.yaml"), "--input", filepath.Join(dir, "input.txt"), "--session", id, "--detach")
					if err == nil && (r.code == 0 || attempt > 0 && strings.Contains(r.stderr, "session already exists")) {
						ok = true
						break
					}
					last = fmt.Sprintf("%s: exit %d %v: %s", id, r.code, err, strings.TrimSpace(r.stderr))
					subMu.Lock()
					failedOnce = append(failedOnce, last)
					subMu.Unlock()
				}
				if !ok {
					subMu.Lock()
					subErrs = append(subErrs, last)
					subMu.Unlock()
				}
				submitted.Add(1)
			}
		}()
	}
	// The feeder stops when the test does (a failure stops it early).
	feedCtx, stopFeed := context.WithCancel(context.Background())
	feed := make(chan struct{})
	go func() {
		defer close(feed)
		defer close(next)
		for _, id := range ids {
			select {
			case next <- id:
			case <-feedCtx.Done():
				return
			}
		}
	}()
	t.Cleanup(func() {
		stopFeed()
		subs.Wait()
	})
	awaitSubmitted := func(k int) {
		t.Helper()
		if !within(20*time.Minute, func() bool { return submitted.Load() >= int64(k) }) {
			t.Fatalf("only %d of %d sessions submitted", submitted.Load(), k)
		}
	}
	leaderOf := func() *clusterNode {
		info := c.streamInfo("LOOPBUS")
		if info == nil || info.Cluster == nil {
			return nil
		}
		for _, n := range c.nodes {
			if n.name == info.Cluster.Leader {
				return n
			}
		}
		return nil
	}
	allCurrent := func() bool {
		for _, name := range clusterStreams {
			info := c.streamInfo(name)
			if info == nil || info.Cluster == nil || info.Cluster.Leader == "" || len(info.Cluster.Replicas) != 2 {
				return false
			}
			for _, r := range info.Cluster.Replicas {
				if !r.Current || r.Offline {
					return false
				}
			}
		}
		return true
	}
	var figures []string
	start := time.Now()

	// Fault 1: the event stream's leader node is killed, then started again.
	awaitSubmitted(sessions / 3)
	victim := leaderOf()
	if victim == nil {
		t.Fatalf("no leader of stream LOOPBUS\n%s", tails(c.all))
	}
	killed := time.Now()
	if err := victim.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	if !within(2*time.Minute, func() bool { return c.allLed(victim.name) }) {
		t.Fatalf("%v not all led by the other nodes 2 minutes after %s was killed\n%s", clusterStreams, victim.name, tails(c.all))
	}
	figures = append(figures, fmt.Sprintf("kill -9 of %s (leader of LOOPBUS) with %d sessions submitted: every stream led by the others after %v",
		victim.name, submitted.Load(), time.Since(killed).Round(100*time.Millisecond)))
	time.Sleep(time.Until(killed.Add(10 * time.Second))) // the node stays down 10 s: a fault's length, not a wait for an event
	victim.process = startProcess(t, dir, victim.name+"-again", victim.args...)
	c.all = append(c.all, victim.process)
	restarted := time.Now()
	if !within(3*time.Minute, allCurrent) {
		t.Fatalf("%s did not catch up in 3 minutes after it was started again\n%s", victim.name, tails(c.all))
	}
	figures = append(figures, fmt.Sprintf("  %s started again 10 s after the kill: a current replica of every stream %v later",
		victim.name, time.Since(restarted).Round(100*time.Millisecond)))

	// Fault 2: the node leading the event stream now is frozen for 30 s.
	awaitSubmitted(2 * sessions / 3)
	frozen := leaderOf()
	if frozen == nil {
		t.Fatalf("no leader of stream LOOPBUS\n%s", tails(c.all))
	}
	if err := frozen.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	thawed := false
	thaw := func() {
		if !thawed {
			thawed = true
			_ = frozen.cmd.Process.Signal(syscall.SIGCONT)
		}
	}
	t.Cleanup(thaw)
	if !within(2*time.Minute, func() bool { return c.allLed(frozen.name) }) {
		t.Fatalf("%v not all led by the other nodes 2 minutes after %s was frozen\n%s", clusterStreams, frozen.name, tails(c.all))
	}
	figures = append(figures, fmt.Sprintf("SIGSTOP of %s (leader of LOOPBUS) for 30 s with %d sessions submitted: every stream led by the others after %v",
		frozen.name, submitted.Load(), time.Since(stopped).Round(100*time.Millisecond)))
	time.Sleep(time.Until(stopped.Add(30 * time.Second))) // the freeze lasts 30 s: a fault's length
	thaw()
	if !within(3*time.Minute, allCurrent) {
		t.Fatalf("%s did not catch up in 3 minutes after it ran again\n%s", frozen.name, tails(c.all))
	}
	figures = append(figures, fmt.Sprintf("  %s let go after 30 s: a current replica of every stream %v later",
		frozen.name, time.Since(stopped.Add(30*time.Second)).Round(100*time.Millisecond)))

	<-feed
	subs.Wait()
	if len(subErrs) > 0 {
		t.Fatalf("%d submissions failed 5 times:\n%s", len(subErrs), strings.Join(subErrs, "\n"))
	}
	submittedIn := time.Since(start)
	if len(failedOnce) > 0 {
		t.Logf("submissions that failed (and were retried):\n%s", strings.Join(failedOnce, "\n"))
	}
	var left []summary
	if !within(5*time.Minute, func() bool {
		r, err := cli("sessions", "--status", "running,paused,stopped", "--json")
		if err != nil || r.code != 0 || json.Unmarshal([]byte(r.stdout), &left) != nil {
			return false
		}
		return len(left) == 0
	}) {
		t.Fatalf("%d sessions not finished 5 minutes after the last was submitted: %+v\n%s", len(left), left, tails(c.all))
	}
	figures = append(figures, fmt.Sprintf("%d sessions submitted in %v (%d submissions retried), all finished %v after the first",
		sessions, submittedIn.Round(time.Second), retried.Load(), time.Since(start).Round(time.Second)))

	// Every session completed, each step once.
	r := loopbus(t, append([]string{"sessions", "--json"}, c.global...)...)
	var all []struct {
		summary
		Restarts int `json:"restarts"`
	}
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &all) != nil {
		t.Fatalf("sessions --json: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	reported := map[string]int{}
	for _, s := range all {
		if s.Status != "completed" {
			t.Errorf("session %s: %s", s.ID, s.Status)
		}
		reported[s.ID] = s.Restarts
	}
	if len(all) != sessions {
		t.Errorf("%d sessions listed, want %d", len(all), sessions)
	}
	evs := allEvents(t, c.global)
	type jobKey struct{ session, job string }
	starts := map[jobKey]int{}
	stepsDone := map[[2]string]int{}
	done := map[string]int{}
	for _, e := range evs {
		sess, _, _ := strings.Cut(e.Subject, "/") // session or session/step
		switch e.Type {
		case "loopbus.job.started":
			var d struct {
				JobID string `json:"jobId"`
			}
			if err := json.Unmarshal(e.Data, &d); err != nil {
				t.Fatalf("job.started %s: %v", e.ID, err)
			}
			starts[jobKey{sess, d.JobID}]++
		case "loopbus.step.completed":
			stepsDone[[2]string{sess, e.Step}]++
		case "loopbus.session.completed":
			done[sess]++
		}
	}
	for _, id := range ids {
		for _, st := range []string{"first", "second"} {
			if n := stepsDone[[2]string{id, st}]; n != 1 {
				t.Errorf("session %s: %d step.completed for %s, want 1", id, n, st)
			}
		}
		if done[id] != 1 {
			t.Errorf("session %s: %d session.completed, want 1", id, done[id])
		}
	}

	// Each agent ran at most once more per fault; the sessions report
	// the job starts beyond the first.
	raw, err := os.ReadFile(runsLog)
	if err != nil {
		t.Fatal(err)
	}
	runs := map[jobKey]int{}
	for _, l := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
		f := strings.Fields(l)
		if len(f) != 3 {
			t.Fatalf("runs.log line %q", l)
		}
		runs[jobKey{f[0], f[2]}]++
	}
	extraRuns, extraStarts := 0, 0
	rerunSessions := map[string]int{}
	startsBySession := map[string]int{}
	for k, n := range runs {
		if n > 1+faults {
			t.Errorf("session %s: the agent of job %s ran %d times, want at most %d (once more per fault)", k.session, k.job, n, 1+faults)
		}
		extraRuns += n - 1
		if n > 1 {
			rerunSessions[k.session] += n - 1
		}
	}
	for k, n := range starts {
		extraStarts += n - 1
		startsBySession[k.session] += n - 1
	}
	if extraStarts != extraRuns {
		t.Errorf("%d job.started beyond each job's first, but %d agent runs beyond each job's first", extraStarts, extraRuns)
	}
	for _, id := range ids {
		if reported[id] != startsBySession[id] {
			t.Errorf("session %s: sessions --json reports %d restarts, its events show %d", id, reported[id], startsBySession[id])
		}
	}
	// Every decision was made when the event calling for it was read:
	// the watchdog never had one to make.
	c.checkAllDecided(t, orchestrator)

	// How long each fault held sessions up: the longest time the stream
	// took no step.completed, from a little before the fault on.
	for _, f := range []struct {
		what string
		at   time.Time
	}{{"the kill", killed}, {"the freeze", stopped}} {
		figures = append(figures, fmt.Sprintf("%s held steps up for %v: the longest time without a step.completed, from 5 s before it",
			f.what, longestGap(t, evs, "loopbus.step.completed", f.at.Add(-5*time.Second), f.at.Add(3*time.Minute)).Round(100*time.Millisecond)))
	}
	var rerun []string
	for s, n := range rerunSessions {
		rerun = append(rerun, fmt.Sprintf("%s:%d", s, n))
	}
	slices.Sort(rerun)
	figures = append(figures, fmt.Sprintf("%d agent runs for %d jobs: %d runs again, in %d sessions %v", len(runs)+extraRuns, len(runs), extraRuns, len(rerunSessions), rerun))
	t.Logf("figures:\n%s", strings.Join(figures, "\n"))
}

// longestGap is the longest time between events of type typ (and from
// and to, its ends) stored between from and to, by the events' times.
func longestGap(t *testing.T, evs []cloudEvent, typ string, from, to time.Time) time.Duration {
	t.Helper()
	times := []time.Time{from}
	for _, e := range evs {
		if e.Type != typ {
			continue
		}
		at, err := time.Parse(time.RFC3339Nano, e.Time)
		if err != nil {
			t.Fatalf("event %s: time %q: %v", e.ID, e.Time, err)
		}
		if at.After(from) && at.Before(to) {
			times = append(times, at)
		}
	}
	slices.SortFunc(times, func(a, b time.Time) int { return a.Compare(b) })
	var gap time.Duration
	last := from
	for _, at := range append(times[1:], to) {
		if at.After(last) && at.Sub(last) > gap && at.Before(to) {
			gap = at.Sub(last)
		}
		last = at
	}
	return gap
}

// allEvents is every event of the stream, as `loopbus events --json`
// prints them.
func allEvents(t *testing.T, global []string) []cloudEvent {
	t.Helper()
	r := loopbus(t, append([]string{"events", "--json"}, global...)...)
	if r.code != 0 {
		t.Fatalf("events --json: exit %d\n%s", r.code, r.stderr)
	}
	var evs []cloudEvent
	sc := bufio.NewScanner(strings.NewReader(r.stdout))
	sc.Buffer(make([]byte, 1<<20), 4<<20)
	for sc.Scan() {
		var e cloudEvent
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			t.Fatalf("events --json line is not JSON: %v\n%s", err, sc.Text())
		}
		evs = append(evs, e)
	}
	return evs
}
