package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/internal/testcpu"
	"github.com/loopbus/loopbus/schemas"
	"github.com/loopbus/loopbus/workspace"
	"github.com/loopbus/loopbus/workspace/procrun"
)

// BenchmarkDispatch measures how long the orchestrator and a worker take
// to move a session from one step to the next with a no-op agent: from the
// previous step's validation.passed to the next step's job.requested
// (orchestrator leg) and on to its job.started (worker leg). Sessions run
// one at a time, so the figures are latencies, not queueing. Times are the
// stream's stored timestamps of the three events (one server clock).
// Each service has a connection of its own, as separate processes do;
// the serve runs put them on one connection that reaches the server
// through memory, as `loopbus serve` (and `run`) connect them.
func BenchmarkDispatch(b *testing.B) {
	for _, mode := range modes() {
		for _, serve := range []bool{false, true} {
			name := "fsync=" + mode.name
			if serve {
				name += "/serve"
			}
			b.Run(name, func(b *testing.B) {
				benchDispatch(b, mode, serve)
			})
		}
	}
}

// benchDispatch is one run of BenchmarkDispatch.
func benchDispatch(b *testing.B, mode syncMode, serve bool) {
	sessions := size(40, 250)
	sys := newSystem(b, mode)
	if serve {
		sys.serveMode()
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ends := sys.watchEnds(ctx)
	sys.startValidator()
	sys.startWorkers(1)
	sys.startOrchestrator()
	// A first session warms every consumer and the file store.
	sys.submit(ctx, "warm")
	waitEnds(b, ends, 1, time.Minute)

	b.ResetTimer()
	var ids []string
	for i := range b.N * sessions {
		id := fmt.Sprintf("d%06d", i)
		ids = append(ids, id)
		sys.submit(ctx, id)
		waitEnds(b, ends, 1, time.Minute)
	}
	b.StopTimer()

	total, orch, worker := dispatchLatencies(b, sys.admin, ids)
	b.ReportMetric(percentile(total, 50), "p50_ms")
	b.ReportMetric(percentile(total, 99), "p99_ms")
	b.ReportMetric(percentile(orch, 50), "orch_p50_ms")
	b.ReportMetric(percentile(orch, 99), "orch_p99_ms")
	b.ReportMetric(percentile(worker, 50), "worker_p50_ms")
	b.ReportMetric(percentile(worker, 99), "worker_p99_ms")
	b.ReportMetric(float64(len(total)), "samples")
	b.ReportMetric(0, "ns/op")
}

// dispatchLatencies reads the sessions' events back and returns, in
// milliseconds, for every step after the first: validation.passed of the
// previous step → job.started (total), → job.requested (orchestrator leg),
// job.requested → job.started (worker leg).
func dispatchLatencies(tb testing.TB, bs *bus.Bus, sessions []string) (total, orch, worker []float64) {
	tb.Helper()
	first := firstStored(tb, bs, sessions, schemas.TypeValidationPassed, schemas.TypeJobRequested, schemas.TypeJobStarted)
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	steps := chain()
	for _, s := range sessions {
		for i := 1; i < len(steps); i++ {
			passed, ok1 := first[key{s, steps[i-1], schemas.TypeValidationPassed}]
			req, ok2 := first[key{s, steps[i], schemas.TypeJobRequested}]
			started, ok3 := first[key{s, steps[i], schemas.TypeJobStarted}]
			if !ok1 || !ok2 || !ok3 {
				tb.Fatalf("session %s step %s: missing events (passed %v, requested %v, started %v)", s, steps[i], ok1, ok2, ok3)
			}
			total = append(total, ms(started.Sub(passed)))
			orch = append(orch, ms(req.Sub(passed)))
			worker = append(worker, ms(started.Sub(req)))
		}
	}
	return total, orch, worker
}

// key names the first event of a type of one step of a session.
type key struct{ session, step, typ string }

// firstStored reads the events of the given types back and returns the
// stored time of the first of each type per step of sessions. It reads
// every event and picks the types itself: nats-server finds the next
// message for several filters by intersecting them with each subject of
// a block, per message, which made this read, after the measured run,
// the largest item of a full-size CPU profile.
func firstStored(tb testing.TB, bs *bus.Bus, sessions []string, types ...string) map[key]time.Time {
	tb.Helper()
	want := map[string]bool{}
	for _, s := range sessions {
		want[s] = true
	}
	first := map[key]time.Time{}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	err := bs.Read(ctx, bus.ReadOptions{SkipSchema: true}, func(ev schemas.Event) error {
		k := key{ev.Session, ev.Step, ev.Type}
		if _, seen := first[k]; want[ev.Session] && !seen && slices.Contains(types, ev.Type) {
			first[k] = ev.Stored
		}
		return nil
	})
	if err != nil {
		tb.Fatalf("read: %v", err)
	}
	return first
}

// percentile returns the p-th percentile (nearest rank) of xs.
func percentile(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(xs))
	rank := int(p/100*float64(len(s))+0.999999) - 1
	return s[min(max(rank, 0), len(s)-1)]
}

// BenchmarkThroughput runs many sessions of the three-step no-op pipeline
// through the orchestrator, the validator and 1, 2 or 4 agent-worker
// replicas (concurrency 1 each) and reports completed steps per second.
// The sessions are submitted before the orchestrator starts; the clock
// runs from its start to the last session.completed. Each service has a
// connection of its own, as separate processes do. With fsync=default, 4
// workers run once more reusing workspaces, as --reuse-workspaces does
// (".../reuse"; the pipeline has no validate command, so the validator
// makes none), and once more with every service on one connection through
// memory, as `loopbus serve` connects them (".../serve").
func BenchmarkThroughput(b *testing.B) {
	type variant struct {
		workers int
		reuse   bool
		serve   bool
	}
	for _, mode := range modes() {
		variants := []variant{{workers: 1}, {workers: 2}, {workers: 4}}
		if mode.name == "default" {
			variants = append(variants, variant{workers: 4, reuse: true}, variant{workers: 4, serve: true})
		}
		for _, v := range variants {
			name := fmt.Sprintf("fsync=%s/workers=%d", mode.name, v.workers)
			if v.reuse {
				name += "/reuse"
			}
			if v.serve {
				name += "/serve"
			}
			workers := v.workers
			b.Run(name, func(b *testing.B) {
				sessions := size(40, 300) * b.N
				sys := newSystem(b, mode)
				sys.reuse = v.reuse
				if v.serve {
					sys.serveMode()
				}
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				for i := range sessions {
					sys.submit(ctx, fmt.Sprintf("t%06d", i))
				}
				ends := sys.watchEnds(ctx)
				sys.startValidator()
				sys.startWorkers(workers)
				b.ResetTimer()
				start, cpu0 := time.Now(), testcpu.Used(b)
				sys.startOrchestrator()
				waitEnds(b, ends, sessions, 10*time.Minute)
				elapsed, cpu := time.Since(start), testcpu.Used(b)-cpu0
				b.StopTimer()
				if v.reuse {
					sys.reused(b)
				}
				steps := float64(sessions * len(chain()))
				b.ReportMetric(steps/elapsed.Seconds(), "steps/s")
				// Everything (server, services, agents) runs in this process
				// and its children: CPU per step bounds what 2 cores can do.
				b.ReportMetric(float64(cpu)/float64(time.Millisecond)/steps, "cpu_ms/step")
				// Where a step's time goes under this load (medians).
				ids := make([]string, sessions)
				for i := range ids {
					ids[i] = fmt.Sprintf("t%06d", i)
				}
				for name, xs := range stageLatencies(b, sys.admin, ids) {
					b.ReportMetric(percentile(xs, 50), name+"_p50_ms")
				}
				// The machine's limit, measured right after: the same agent
				// processes, as many at once as there are workers, with no
				// bus, no workspace, no validation.
				rawCPU0 := testcpu.Used(b)
				raw := spawnRate(b, int(steps), workers)
				b.ReportMetric(raw, "raw_steps/s")
				b.ReportMetric(float64(testcpu.Used(b)-rawCPU0)/float64(time.Millisecond)/steps, "raw_cpu_ms/step")
				b.ReportMetric(steps/elapsed.Seconds()/raw, "limit_ratio")
				b.ReportMetric(0, "ns/op")
			})
		}
	}
}

// stageLatencies returns, in milliseconds for every step of sessions, the
// time between the stored events that bound each stage: queue
// (job.requested → job.started), work (→ job.completed), validate (→
// validation.passed) and decide (→ the next step's job.requested).
func stageLatencies(tb testing.TB, bs *bus.Bus, sessions []string) map[string][]float64 {
	tb.Helper()
	first := firstStored(tb, bs, sessions, schemas.TypeJobRequested, schemas.TypeJobStarted, schemas.TypeJobCompleted, schemas.TypeValidationPassed)
	ms := func(a, b time.Time) float64 { return float64(b.Sub(a)) / float64(time.Millisecond) }
	out := map[string][]float64{}
	steps := chain()
	for _, s := range sessions {
		for i, step := range steps {
			req, started := first[key{s, step, schemas.TypeJobRequested}], first[key{s, step, schemas.TypeJobStarted}]
			done, passed := first[key{s, step, schemas.TypeJobCompleted}], first[key{s, step, schemas.TypeValidationPassed}]
			out["queue"] = append(out["queue"], ms(req, started))
			out["work"] = append(out["work"], ms(started, done))
			out["validate"] = append(out["validate"], ms(done, passed))
			if i+1 < len(steps) {
				out["decide"] = append(out["decide"], ms(passed, first[key{s, steps[i+1], schemas.TypeJobRequested}]))
			}
		}
	}
	return out
}

// spawnRate runs the no-op agent's process (touch out/x, through procrun
// as the exec backend does) n times, conc at once, and returns runs per
// second. The process gets the environment a worker gives its agent: this
// process's (workspace.BaseEnv, as agentworker.Config.Env defaults to)
// and a job's LOOPBUS_* variables. What the agent does with it (a
// program loads its locale's files when LANG names one) is the agent's
// own cost, and the workers' agents pay it too.
func spawnRate(tb testing.TB, n, conc int) float64 {
	tb.Helper()
	dir := tb.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "out"), 0o755); err != nil {
		tb.Fatal(err)
	}
	ws := &workspace.Workspace{Root: dir, In: filepath.Join(dir, "in"), Out: filepath.Join(dir, "out"),
		PromptFile: filepath.Join(dir, "prompt.md"), FeedbackFile: filepath.Join(dir, "feedback.md")}
	env := ws.Env(workspace.BaseEnv(), workspace.Vars{Session: "t000000", Step: chain()[0], Job: "t000000-a-1", Iteration: 1}, nil)
	next := make(chan int, n)
	for i := range n {
		next <- i
	}
	close(next)
	var wg sync.WaitGroup
	errs := make(chan error, conc)
	start := time.Now()
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				res, err := procrun.Run(context.Background(), procrun.Spec{Argv: []string{"touch", "out/" + strconv.Itoa(i)}, Dir: dir, Env: env})
				if err == nil && res.ExitCode != 0 {
					err = fmt.Errorf("touch exited %d", res.ExitCode)
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	select {
	case err := <-errs:
		tb.Fatal(err)
	default:
	}
	return float64(n) / elapsed.Seconds()
}
