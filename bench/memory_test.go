package bench

import (
	"os"
	"runtime"
	"runtime/pprof"
	"strings"
	"testing"

	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/internal/testnats"
	"github.com/loopbus/loopbus/orchestrator"
	"github.com/loopbus/loopbus/schemas"
)

// BenchmarkOrchestratorMemory folds the decoded events of complete
// three-step sessions (copies of one real session) into one orchestrator
// State, as its catch-up does, and reports the live heap the State holds
// per 10,000 sessions (measured after a GC, the events themselves
// dropped). The quick size folds 1,000 sessions and scales linearly.
// Memory does not depend on the sync mode, so there is one run.
func BenchmarkOrchestratorMemory(b *testing.B) {
	sessions := size(1_000, 10_000)
	bs, tpl := memoryTemplate(b)
	b.ResetTimer()
	var perSession float64
	for range b.N {
		perSession = foldedHeap(b, bs, tpl, sessions, nil, func(s *orchestrator.Session) bool { return s.Status == orchestrator.StatusCompleted })
	}
	b.ReportMetric(perSession*10_000, "bytes/10k_sessions")
	b.ReportMetric(perSession, "bytes/session")
	b.ReportMetric(0, "ns/op")
}

// BenchmarkOrchestratorMemoryLive is BenchmarkOrchestratorMemory for
// sessions in flight, what a busy orchestrator holds: each copy of the
// session is folded up to its first job.started (session.started, the
// first step's job.requested and job.started), and the live heap is
// reported per live session and for 100,000 of them. The full size folds
// 100,000 sessions; the quick size 10,000, scaled linearly to 100,000.
func BenchmarkOrchestratorMemoryLive(b *testing.B) {
	sessions := size(10_000, 100_000)
	bs, tpl := memoryTemplate(b)
	b.ResetTimer()
	var perSession float64
	for range b.N {
		perSession = foldedHeap(b, bs, tpl, sessions, untilFirstStart, func(s *orchestrator.Session) bool {
			st := s.Steps[chain()[0]]
			return s.Status == orchestrator.StatusRunning && st != nil && st.Status == orchestrator.StepRunning && st.Started
		})
	}
	b.ReportMetric(perSession, "bytes/live_session")
	b.ReportMetric(perSession*100_000/1e6, "MB/100k_live")
	b.ReportMetric(float64(sessions), "live_sessions_folded")
	b.ReportMetric(0, "ns/op")
}

// untilFirstStart ends a session's events at its first job.started.
func untilFirstStart(ev schemas.Event) bool { return ev.Type == schemas.TypeJobStarted }

// memoryTemplate runs the template session through the services and
// returns its stored messages and a bus to decode copies of them with.
// The server is shut down before anything is measured.
func memoryTemplate(b *testing.B) (*bus.Bus, []template) {
	b.Helper()
	srv := startServer(b, b.TempDir(), syncMode{name: "default", relaxed: true})
	tpl := runTemplate(b, srv)
	// Decoding needs only the bus's catalogue, not its connection.
	bs := testnats.Connect(b, srv.URL(), "bench/memory")
	bs.Close()
	srv.Shutdown() // nothing else allocates while we measure
	return bs, tpl
}

// foldedHeap decodes sessions copies of the template session, folds the
// events of each (up to and including the first that last reports, all
// of them when last is nil) into one State with orchestrator.Evolve,
// checks that every session is as want says, and returns the live heap
// the State holds per session: the heap after a GC with the State (the
// events dropped) less the heap after a GC without it.
func foldedHeap(b *testing.B, bs *bus.Bus, tpl []template, sessions int, last func(schemas.Event) bool, want func(*orchestrator.Session) bool) float64 {
	b.Helper()
	// Decoding is the slow part and not what is measured: two goroutines
	// decode, one folds, and a session's events are dropped once folded.
	type decoded struct {
		evs []schemas.Event
		err error
	}
	var with, without runtime.MemStats
	jobs := make(chan int)
	out := make(chan decoded, 64)
	go func() {
		defer close(jobs)
		for i := range sessions {
			jobs <- i
		}
	}()
	const decoders = 2
	done := make(chan struct{})
	for range decoders {
		go func() {
			defer func() { done <- struct{}{} }()
			for i := range jobs {
				msgs := copySession(tpl, i)
				evs := make([]schemas.Event, 0, len(msgs))
				for j, m := range msgs {
					ev, err := bs.Decode(m.Subject, m.Header, m.Data)
					if err != nil {
						out <- decoded{err: err}
						return
					}
					ev.Seq = uint64(i*len(msgs) + j + 1)
					evs = append(evs, ev)
					if last != nil && last(ev) {
						break
					}
				}
				out <- decoded{evs: evs}
			}
		}()
	}
	go func() {
		for range decoders {
			<-done
		}
		close(out)
	}()

	st := orchestrator.NewState()
	for d := range out {
		if d.err != nil {
			b.Fatalf("decode: %v", d.err)
		}
		for _, ev := range d.evs {
			orchestrator.Evolve(st, ev)
		}
	}
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&with)
	if path := os.Getenv("LOOPBUS_BENCH_HEAPPROFILE"); path != "" {
		// The State is live here, unlike at the end of the run, where
		// -memprofile takes its profile.
		writeHeapProfile(b, path+"."+strings.ReplaceAll(b.Name(), "/", "_"))
	}
	if len(st.Sessions) != sessions {
		b.Fatalf("%d sessions in state, want %d", len(st.Sessions), sessions)
	}
	for id, s := range st.Sessions {
		if !want(s) {
			b.Fatalf("session %s is not as folded: %s", id, s.Status)
		}
	}
	// What the State holds is what goes with it. (A reading before the
	// fold would also count what the services of the template run free
	// meanwhile.)
	st = nil
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&without)
	return float64(int64(with.HeapAlloc)-int64(without.HeapAlloc)) / float64(sessions)
}

// writeHeapProfile writes the heap profile as of the last GC to path.
func writeHeapProfile(b *testing.B, path string) {
	b.Helper()
	f, err := os.Create(path)
	if err != nil {
		b.Fatalf("heap profile: %v", err)
	}
	if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
		b.Fatalf("heap profile: %v", err)
	}
	if err := f.Close(); err != nil {
		b.Fatalf("heap profile: %v", err)
	}
}
