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
		perSession = foldedHeap(b, bs, tpl, sessions, func(evs []schemas.Event) []schemas.Event { return evs },
			orchestrator.StatusCompleted)
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
		perSession = foldedHeap(b, bs, tpl, sessions, untilFirstStart, orchestrator.StatusRunning)
	}
	b.ReportMetric(perSession, "bytes/live_session")
	b.ReportMetric(perSession*100_000/1e6, "MB/100k_live")
	b.ReportMetric(float64(sessions), "live_sessions_folded")
	b.ReportMetric(0, "ns/op")
}

// untilFirstStart returns the events of one session up to and including
// its first job.started.
func untilFirstStart(evs []schemas.Event) []schemas.Event {
	for i, ev := range evs {
		if ev.Type == schemas.TypeJobStarted {
			return evs[:i+1]
		}
	}
	return evs
}

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
// events keep returns of each into one State with orchestrator.Evolve,
// checks that every session ended up with status want, and returns the
// live heap the State holds per session (after a GC, the events
// dropped).
func foldedHeap(b *testing.B, bs *bus.Bus, tpl []template, sessions int, keep func([]schemas.Event) []schemas.Event, want string) float64 {
	b.Helper()
	// Decoding is the slow part and not what is measured: two goroutines
	// decode, one folds, and a session's events are dropped once folded.
	type decoded struct {
		evs []schemas.Event
		err error
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&before)
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
				evs := make([]schemas.Event, len(msgs))
				for j, m := range msgs {
					ev, err := bs.Decode(m.Subject, m.Header, m.Data)
					if err != nil {
						out <- decoded{err: err}
						return
					}
					ev.Seq = uint64(i*len(msgs) + j + 1)
					evs[j] = ev
				}
				out <- decoded{evs: keep(evs)}
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
	runtime.ReadMemStats(&after)
	if path := os.Getenv("LOOPBUS_BENCH_HEAPPROFILE"); path != "" {
		// The State is live here, unlike at the end of the run, where
		// -memprofile takes its profile.
		writeHeapProfile(b, path+"."+strings.ReplaceAll(b.Name(), "/", "_"))
	}
	if len(st.Sessions) != sessions {
		b.Fatalf("%d sessions in state, want %d", len(st.Sessions), sessions)
	}
	for id, s := range st.Sessions {
		if s.Status != want {
			b.Fatalf("session %s is %s, want %s", id, s.Status, want)
		}
	}
	perSession := float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / float64(sessions)
	runtime.KeepAlive(st)
	return perSession
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
