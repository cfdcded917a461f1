package agentworker_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/loopbus/loopbus/agentworker"
	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/internal/testnats"
	"github.com/loopbus/loopbus/schemas"
)

// killDeadline is how soon after job.cancelled is published the agent and
// everything it started must be gone: a liveness bound, not a measurement.
const killDeadline = 5 * time.Second

// pidAgent starts a child, writes the child's pid and its own to $PIDS
// (each file renamed into place, so that it is read whole), then sleeps.
// With IGNORE_TERM set, it and its child ignore SIGTERM: only SIGKILL
// ends them.
const pidAgent = `set -eu
if [ -n "${IGNORE_TERM:-}" ]; then trap '' TERM; fi
sleep 600 &
echo $! > "$PIDS/child.tmp" && mv "$PIDS/child.tmp" "$PIDS/child"
echo $$ > "$PIDS/leader.tmp" && mv "$PIDS/leader.tmp" "$PIDS/leader"
sleep 600
`

// pidRequest builds a job request running pidAgent, with its pid files in
// a fresh directory, which it returns.
func pidRequest(t testing.TB, jobID string, ignoreTerm bool) (*schemas.JobRequested, string) {
	t.Helper()
	dir := t.TempDir()
	script := filepath.Join(dir, "agent.sh")
	if err := os.WriteFile(script, []byte("#!/bin/sh\n"+pidAgent), 0o700); err != nil {
		t.Fatal(err)
	}
	pids := filepath.Join(dir, "pids")
	if err := os.Mkdir(pids, 0o700); err != nil {
		t.Fatal(err)
	}
	jr := request(jobID, "step", 1, []string{"sh", script}, "out.txt")
	jr.TimeoutMs = 120000
	jr.Agent.Env = map[string]string{"PIDS": pids}
	if ignoreTerm {
		jr.Agent.Env["IGNORE_TERM"] = "1"
	}
	return jr, pids
}

// waitPIDs waits for the agent's pid files and returns the leader's and
// the child's pid. Both are SIGKILLed at cleanup should the test leave
// them running.
func waitPIDs(t testing.TB, dir string) (leader, child int) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	read := func(name string) int {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			return 0
		}
		n, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil {
			t.Fatalf("pid file %s: %q", name, b)
		}
		return n
	}
	for {
		leader, child = read("leader"), read("child")
		if leader > 0 && child > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the agent did not write its pid files to %s", dir)
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Cleanup(func() {
		for _, pid := range []int{leader, child} {
			if running(pid) {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	})
	return leader, child
}

// running reports whether pid runs: it exists and is not a zombie waiting
// for a reaper.
func running(pid int) bool {
	if errors.Is(syscall.Kill(pid, 0), syscall.ESRCH) {
		return false
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(stat, ')')
	return !(i > 0 && len(stat) > i+2 && stat[i+2] == 'Z')
}

// waitGone waits until none of pids runs, failing the test after
// waitTimeout.
func waitGone(t testing.TB, why string, pids ...int) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for _, pid := range pids {
		for running(pid) {
			if time.Now().After(deadline) {
				t.Fatalf("process %d still runs %s", pid, why)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// publishCancel publishes job.cancelled for jr, as the orchestrator does.
func publishCancel(t testing.TB, b *bus.Bus, jr *schemas.JobRequested, reason string) {
	t.Helper()
	_, err := b.Publish(context.Background(), schemas.Event{
		ID:          schemas.DeterministicID("test", session, "job.cancelled", jr.JobID),
		Type:        schemas.TypeJobCancelled,
		Session:     session,
		Step:        jr.Step,
		Job:         jr.JobID,
		Correlation: session,
		Time:        time.Now(),
		Data:        &schemas.JobCancelled{JobID: jr.JobID, Step: jr.Step, Iteration: jr.Iteration, Reason: reason},
	})
	if err != nil {
		t.Fatalf("publish job.cancelled %s: %v", jr.JobID, err)
	}
}

// cancelAndTime publishes job.cancelled for jr and waits until neither
// pid runs; it returns how long that took and fails the test past
// killDeadline.
func cancelAndTime(t testing.TB, b *bus.Bus, jr *schemas.JobRequested, reason string, pids ...int) time.Duration {
	t.Helper()
	start := time.Now()
	publishCancel(t, b, jr, reason)
	for {
		alive := 0
		for _, pid := range pids {
			if running(pid) {
				alive++
			}
		}
		took := time.Since(start)
		if alive == 0 {
			return took
		}
		if took > killDeadline {
			t.Fatalf("%d of the agent's processes %v still run %v after job.cancelled", alive, pids, took)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// assertCancelledOnce checks that jobID has exactly one result, a
// job.failed with Cancelled and the reason, that it ran once and that its
// request was acknowledged (so it is never delivered again).
func assertCancelledOnce(t *testing.T, b *bus.Bus, jobID, reason string, wantStarts int) *schemas.JobFailed {
	t.Helper()
	_, res := waitResult(t, b, jobID)
	waitAcked(t, b)
	evs := ofJob(sessionEvents(t, b), jobID)
	jf, ok := res.Data.(*schemas.JobFailed)
	if !ok {
		t.Fatalf("result %s, want job.failed:%s", res.Type, describe(evs))
	}
	if !jf.Cancelled || jf.Error != "cancelled: "+reason || jf.Retryable {
		t.Errorf("job.failed = %+v, want cancelled, error %q, not retryable", *jf, "cancelled: "+reason)
	}
	if n := len(ofType(evs, schemas.TypeJobFailed)) + len(ofType(evs, schemas.TypeJobCompleted)); n != 1 {
		t.Errorf("%d results, want one job.failed:%s", n, describe(evs))
	}
	if n := len(ofType(evs, schemas.TypeJobStarted)); n != wantStarts {
		t.Errorf("%d job.started, want %d:%s", n, wantStarts, describe(evs))
	}
	return jf
}

// TestCancelKillsRunningAgent: job.cancelled kills the agent a worker runs
// and everything it started, within killDeadline, whether or not it obeys
// SIGTERM; the job fails once as cancelled and is not delivered again.
func TestCancelKillsRunningAgent(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		ignoreTerm bool
	}{
		{name: "agent obeys SIGTERM"},
		{name: "agent ignores SIGTERM", ignoreTerm: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b, _ := testnats.Bus(t)
			logs := startLoggedWorker(t, b, agentworker.Config{ID: "w1", Env: baseEnv()})
			jr, dir := pidRequest(t, "s1.step.1", tt.ignoreTerm)
			publishRequest(t, b, jr)
			leader, child := waitPIDs(t, dir)

			took := cancelAndTime(t, b, jr, "stop signal: wrong brief", leader, child)
			t.Logf("agent (pid %d) and its child (pid %d) gone %v after job.cancelled", leader, child, took)

			jf := assertCancelledOnce(t, b, jr.JobID, "stop signal: wrong brief", 1)
			if jf.ExitCode != -1 || jf.Worker != "w1" {
				t.Errorf("job.failed exit %d worker %q, want -1 (killed) and w1", jf.ExitCode, jf.Worker)
			}
			evs := ofJob(sessionEvents(t, b), jr.JobID)
			if tc := ofType(evs, schemas.TypeToolCompleted); len(tc) != 1 || !strings.Contains(tc[0].Data.(*schemas.ToolCompleted).Error, "killed: cancelled: stop signal") {
				t.Errorf("want one tool.completed saying the agent was killed:%s", describe(tc))
			}
			if n := strings.Count(logs.String(), "job cancelled: killing its agent"); n != 1 || !strings.Contains(logs.String(), `"job":"s1.step.1"`) {
				t.Errorf("the kill was logged %d times, want once with the job id:\n%s", n, logs)
			}
		})
	}
}

// TestCancelledJobIsNeverRun: a job cancelled before a worker takes it, or
// while it was handed back by a worker that stopped, is failed as
// cancelled without running the agent.
func TestCancelledJobIsNeverRun(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		handedBack bool // a first worker ran the job and stopped before the cancellation
	}{
		{name: "before any worker took it"},
		{name: "while handed back", handedBack: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b, _ := testnats.Bus(t)
			jr, dir := pidRequest(t, "s1.step.1", false)
			publishRequest(t, b, jr)
			starts := 0
			if tt.handedBack {
				stop1 := startWorker(t, b, agentworker.Config{ID: "w1"})
				leader, child := waitPIDs(t, dir)
				stop1()
				waitGone(t, "after its worker stopped", leader, child)
				for _, name := range []string{"leader", "child"} {
					if err := os.Remove(filepath.Join(dir, name)); err != nil {
						t.Fatal(err)
					}
				}
				starts = 1
			}
			publishCancel(t, b, jr, "invalidated")
			startWorker(t, b, agentworker.Config{ID: "w2"})

			jf := assertCancelledOnce(t, b, jr.JobID, "invalidated", starts)
			if jf.Worker != "w2" {
				t.Errorf("job.failed by %q, want w2", jf.Worker)
			}
			if _, err := os.Stat(filepath.Join(dir, "leader")); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("the agent ran after its job was cancelled (pid file: %v)", err)
			}
			if n := len(ofType(ofJob(sessionEvents(t, b), jr.JobID), schemas.TypeToolStarted)); n != starts {
				t.Errorf("%d tool.started, want %d", n, starts)
			}
		})
	}
}

// TestCancelledWhileQueuedIsNeverRun: a job cancelled while it waits for
// a busy worker is failed as cancelled when that worker takes it, without
// running its agent or announcing a start: the worker followed the
// cancellation and remembers it (no request to the server).
func TestCancelledWhileQueuedIsNeverRun(t *testing.T) {
	t.Parallel()
	b, _ := testnats.Bus(t)
	startWorker(t, b, agentworker.Config{ID: "w1", Concurrency: 1})
	busy, busyPIDs := pidRequest(t, "s1.busy.1", false)
	publishRequest(t, b, busy)
	leader, child := waitPIDs(t, busyPIDs)
	queued, queuedPIDs := pidRequest(t, "s1.queued.1", false)
	publishRequest(t, b, queued)
	publishCancel(t, b, queued, "invalidated")
	// Cancellations are followed in stream order: once the busy job's own
	// has killed it, the queued job's was followed, before the worker is
	// free to take that job.
	cancelAndTime(t, b, busy, "stopped", leader, child)
	assertCancelledOnce(t, b, busy.JobID, "stopped", 1)
	jf := assertCancelledOnce(t, b, queued.JobID, "invalidated", 0)
	if jf.Worker != "w1" {
		t.Errorf("job.failed by %q, want w1", jf.Worker)
	}
	if _, err := os.Stat(filepath.Join(queuedPIDs, "leader")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the agent ran after its job was cancelled (pid file: %v)", err)
	}
}

// TestCancelOtherJobLeavesThisOne: a cancellation of another job (here
// one of another session with the same job id) does not touch a running
// job.
func TestCancelOtherJobLeavesThisOne(t *testing.T) {
	t.Parallel()
	b, _ := testnats.Bus(t)
	startWorker(t, b, agentworker.Config{ID: "w1"})
	jr, dir := pidRequest(t, "s1.step.1", false)
	publishRequest(t, b, jr)
	leader, child := waitPIDs(t, dir)
	if _, err := b.Publish(context.Background(), schemas.Event{
		ID: "other-cancel", Type: schemas.TypeJobCancelled, Session: "s2", Step: jr.Step, Job: jr.JobID, Time: time.Now(),
		Data: &schemas.JobCancelled{JobID: jr.JobID, Step: jr.Step, Iteration: 1, Reason: "not yours"},
	}); err != nil {
		t.Fatal(err)
	}
	// The worker handles job.cancelled in stream order: once this job's
	// own cancellation has killed it, the earlier one was seen and ignored.
	cancelAndTime(t, b, jr, "yours", leader, child)
	assertCancelledOnce(t, b, jr.JobID, "yours", 1)
}

// TestCancelFollowerSurvivesServerRestart: after the NATS server restarts,
// the worker still follows job.cancelled and kills the agent it runs.
func TestCancelFollowerSurvivesServerRestart(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	srv, err := bus.StartEmbedded(bus.EmbeddedConfig{DataDir: dir}, testnats.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	listen := strings.TrimPrefix(srv.URL(), "nats://")
	b := testnats.Connect(t, srv.URL(), "test/restart")
	startWorker(t, b, agentworker.Config{ID: "w1"})
	jr, pidDir := pidRequest(t, "s1.step.1", false)
	publishRequest(t, b, jr)
	leader, child := waitPIDs(t, pidDir)

	srv.Shutdown()
	deadline := time.Now().Add(waitTimeout)
	for b.Conn().IsConnected() {
		if time.Now().After(deadline) {
			t.Fatal("the client did not notice the server going away")
		}
		time.Sleep(20 * time.Millisecond)
	}
	srv2, err := bus.StartEmbedded(bus.EmbeddedConfig{DataDir: dir, Listen: listen}, testnats.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv2.Shutdown)
	for !b.Conn().IsConnected() {
		if time.Now().After(deadline) {
			t.Fatal("the client did not reconnect")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if !running(leader) || !running(child) {
		t.Fatal("the agent died with the server; nothing left to cancel")
	}
	took := cancelAndTime(t, b, jr, "stop after restart", leader, child)
	t.Logf("killed %v after job.cancelled, following a server restart", took)
	assertCancelledOnce(t, b, jr.JobID, "stop after restart", 1)
}

// stallingBus is a real bus whose first job.cancelled follow stops
// silently as soon as it has caught up, as a follow cut short would; the
// second waits for resume. A cancellation published in between must still
// reach the worker.
type stallingBus struct {
	*bus.Bus
	follows atomic.Int32
	stopped chan struct{} // closed when the first follow has returned
	resume  chan struct{} // the second follow starts once it is closed
}

func (s *stallingBus) Read(ctx context.Context, opts bus.ReadOptions, fn func(schemas.Event) error) error {
	if !opts.Follow {
		return s.Bus.Read(ctx, opts, fn)
	}
	switch s.follows.Add(1) {
	case 1:
		defer close(s.stopped)
		rctx, cancel := context.WithCancel(ctx)
		defer cancel()
		opts.OnCaughtUp = cancel
		return s.Bus.Read(rctx, opts, fn)
	case 2:
		select {
		case <-s.resume:
		case <-ctx.Done():
			return nil
		}
	}
	return s.Bus.Read(ctx, opts, fn)
}

// TestCancelFollowerResumesWhereItStopped: a follow of job.cancelled that
// stops is resumed from where it stopped, so a cancellation published
// meanwhile still kills the agent.
func TestCancelFollowerResumesWhereItStopped(t *testing.T) {
	t.Parallel()
	b, _ := testnats.Bus(t)
	sb := &stallingBus{Bus: b, stopped: make(chan struct{}), resume: make(chan struct{})}
	startLoggedWorker(t, sb, agentworker.Config{ID: "w1", Env: baseEnv()})
	jr, dir := pidRequest(t, "s1.step.1", false)
	publishRequest(t, b, jr)
	leader, child := waitPIDs(t, dir)
	select {
	case <-sb.stopped:
	case <-time.After(waitTimeout):
		t.Fatal("the first follow of job.cancelled never returned")
	}
	publishCancel(t, b, jr, "during the gap")
	close(sb.resume)
	waitGone(t, "after job.cancelled", leader, child)
	assertCancelledOnce(t, b, jr.JobID, "during the gap", 1)
	if n := sb.follows.Load(); n != 2 {
		t.Errorf("followed job.cancelled %d times, want 2 (the first, stopped, and its resumption)", n)
	}
}

// BenchmarkCancelKill measures the time from publishing job.cancelled to
// the agent and its child both being gone (ms/kill on average, worst-ms),
// for an agent that obeys SIGTERM and one that must be SIGKILLed after the
// grace period.
func BenchmarkCancelKill(b *testing.B) {
	for _, bc := range []struct {
		name       string
		ignoreTerm bool
	}{{name: "obeys-SIGTERM"}, {name: "ignores-SIGTERM", ignoreTerm: true}} {
		b.Run(bc.name, func(b *testing.B) {
			bb, _ := testnats.Bus(b)
			w, err := agentworker.New(agentworker.Config{ID: "w1", WorkDir: b.TempDir(), Env: baseEnv()}, bb, testnats.Logger(b), time.Now)
			if err != nil {
				b.Fatal(err)
			}
			testnats.Run(b, "worker", w.Run)
			var total, worst time.Duration
			n := 0
			for b.Loop() {
				b.StopTimer()
				jr, dir := pidRequest(b, fmt.Sprintf("s1.step.%d", n+1), bc.ignoreTerm)
				publishRequest(b, bb, jr)
				leader, child := waitPIDs(b, dir)
				b.StartTimer()
				took := cancelAndTime(b, bb, jr, "bench", leader, child)
				total += took
				worst = max(worst, took)
				n++
				b.Logf("kill %d: %v", n, took)
			}
			b.ReportMetric(float64(total.Microseconds())/1000/float64(n), "ms/kill")
			b.ReportMetric(float64(worst.Microseconds())/1000, "worst-ms")
		})
	}
}
