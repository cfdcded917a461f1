package bench

import (
	"runtime"
	"testing"

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
	srv := startServer(b, b.TempDir(), syncMode{name: "default", relaxed: true})
	tpl := runTemplate(b, srv)
	// Decoding needs only the bus's catalogue, not its connection.
	bs := testnats.Connect(b, srv.URL(), "bench/memory")
	bs.Close()
	srv.Shutdown() // nothing else allocates while we measure

	// Decoding is the slow part and not what is measured: two goroutines
	// decode, one folds, and a session's events are dropped once folded.
	type decoded struct {
		evs []schemas.Event
		err error
	}
	b.ResetTimer()
	var perSession float64
	for range b.N {
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
		runtime.ReadMemStats(&after)
		if len(st.Sessions) != sessions {
			b.Fatalf("%d sessions in state, want %d", len(st.Sessions), sessions)
		}
		for id, s := range st.Sessions {
			if s.Status != orchestrator.StatusCompleted {
				b.Fatalf("session %s is %s, want completed", id, s.Status)
			}
		}
		perSession = float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / float64(sessions)
		runtime.KeepAlive(st)
	}
	b.ReportMetric(perSession*10_000, "bytes/10k_sessions")
	b.ReportMetric(perSession, "bytes/session")
	b.ReportMetric(0, "ns/op")
}
