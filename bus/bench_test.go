package bus_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/internal/testnats"
	"github.com/loopbus/loopbus/schemas"
)

func benchEvent(i int) schemas.Event {
	return schemas.Event{
		ID: fmt.Sprintf("bench-%d-%d", time.Now().UnixNano(), i), Type: schemas.TypeJobStarted,
		Session: "bench", Step: "s", Job: "bench.s.1", Time: time.Now(),
		Data: &schemas.JobStarted{JobID: fmt.Sprintf("bench.s.%d", i+1), Worker: "w1", Delivery: 1},
	}
}

// BenchmarkCodec measures encoding and decoding (with schema validation) of
// one event, without NATS. Each event has data of its own, as real events
// do.
func BenchmarkCodec(b *testing.B) {
	srv := testnats.Server(b)
	b.Run("encode", func(b *testing.B) {
		bs := testnats.Connect(b, srv.URL(), "bench/encode")
		evs := make([]schemas.Event, b.N)
		for i := range evs {
			evs[i] = benchEvent(i)
		}
		b.ResetTimer()
		for _, ev := range evs {
			if _, err := bs.Encode(ev); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("decode", func(b *testing.B) {
		enc := testnats.Connect(b, srv.URL(), "bench/encode")
		bs := testnats.Connect(b, srv.URL(), "bench/decode")
		msgs := make([]*nats.Msg, b.N)
		for i := range msgs {
			m, err := enc.Encode(benchEvent(i))
			if err != nil {
				b.Fatal(err)
			}
			msgs[i] = m
		}
		b.ResetTimer()
		for _, m := range msgs {
			if _, err := bs.Decode(m.Subject, m.Header, m.Data); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkDecision compares the two ways the orchestrator writes a
// decision of two events (step.completed and the next job.requested):
// as one atomic batch, as a chain of guarded publishes, and one guarded
// publish for scale, on the embedded server under both sync settings.
func BenchmarkDecision(b *testing.B) {
	for _, relaxed := range []bool{false, true} {
		name := "fsync=always"
		if relaxed {
			name = "fsync=default"
		}
		b.Run(name, func(b *testing.B) {
			srv, err := bus.StartEmbedded(bus.EmbeddedConfig{DataDir: b.TempDir(), RelaxedSync: relaxed}, testnats.Logger(b))
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(srv.Shutdown)
			bs := testnats.Connect(b, srv.URL(), "bench/decision")
			ctx := context.Background()
			var last uint64
			n := 0
			ev := func() schemas.Event { n++; return benchEvent(n) }
			for _, w := range []struct {
				name  string
				write func([]schemas.Event) (bus.Published, error)
				size  int
			}{
				{"batch", func(evs []schemas.Event) (bus.Published, error) { return bs.PublishBatch(ctx, "bench", last, evs) }, 2},
				{"chain", func(evs []schemas.Event) (bus.Published, error) { return bs.PublishChain(ctx, "bench", last, evs) }, 2},
				{"one", func(evs []schemas.Event) (bus.Published, error) { return bs.PublishExpect(ctx, evs[0], last) }, 1},
			} {
				b.Run(w.name, func(b *testing.B) {
					for range b.N {
						evs := make([]schemas.Event, w.size)
						for i := range evs {
							evs[i] = ev()
						}
						p, err := w.write(evs)
						if err != nil {
							b.Fatal(err)
						}
						last = p.Seq
					}
				})
			}
		})
	}
}

// BenchmarkConn publishes one event and waits for its ack, over the
// server's socket and through memory (Config.InProcess, as `loopbus
// serve` connects to its own server), alternating in rounds of 100, on a
// server that flushes periodically (the socket is then most of a publish).
func BenchmarkConn(b *testing.B) {
	srv, err := bus.StartEmbedded(bus.EmbeddedConfig{DataDir: b.TempDir(), RelaxedSync: true}, testnats.Logger(b))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(srv.Shutdown)
	conns := map[string]*bus.Bus{
		"socket":     testnats.Connect(b, srv.URL(), "bench/socket"),
		"in_process": testnats.ConnectConfig(b, bus.Config{URL: srv.URL(), Name: "bench/in-process", InProcess: srv.InProcess()}, "bench/in-process", testnats.Logger(b)),
	}
	evs := make([]schemas.Event, 2*b.N)
	for i := range evs {
		evs[i] = benchEvent(i)
	}
	ctx := context.Background()
	spent := map[string]time.Duration{}
	b.ResetTimer()
	for i := 0; i < b.N; i += 100 {
		for _, kind := range []string{"socket", "in_process"} {
			start := time.Now()
			for j := i; j < min(i+100, b.N); j++ {
				k := 2 * j
				if kind == "in_process" {
					k++
				}
				if _, err := conns[kind].Publish(ctx, evs[k]); err != nil {
					b.Fatal(err)
				}
			}
			spent[kind] += time.Since(start)
		}
	}
	b.StopTimer()
	for kind, d := range spent {
		b.ReportMetric(float64(d.Nanoseconds())/float64(b.N), kind+"_ns/event")
	}
	b.ReportMetric(float64(spent["in_process"])/float64(spent["socket"]), "in_process/socket")
	b.ReportMetric(0, "ns/op")
}
