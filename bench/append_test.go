package bench

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/loopbus/loopbus/internal/testnats"
	"github.com/loopbus/loopbus/schemas"
)

// appendEvent is the i-th event appended: a job.started of a job of its
// own, as real events have data of their own.
func appendEvent(i int) schemas.Event {
	job := fmt.Sprintf("bench.s.%d", i+1)
	return schemas.Event{
		ID: fmt.Sprintf("bench-%d-%d", time.Now().UnixNano(), i), Type: schemas.TypeJobStarted,
		Session: "bench", Step: "s", Job: job, Time: time.Now(),
		Data: &schemas.JobStarted{JobID: job, Worker: "w1", Delivery: 1},
	}
}

// BenchmarkAppend compares appending one event through bus.Publish
// (validation, CloudEvent encoding, Nats-Msg-Id, waiting for the ack) with
// a raw jetstream PublishMsg of the same encoded bytes, on one server.
// The two alternate in rounds of 100 so that the machine's noise hits both
// alike. append_ratio = raw ns/op ÷ bus ns/op: 1.0 means bus is as fast as
// raw.
func BenchmarkAppend(b *testing.B) {
	for _, mode := range modes() {
		b.Run("fsync="+mode.name, func(b *testing.B) {
			const round = 100
			rounds := size(15, 100)
			srv := startServer(b, b.TempDir(), mode)
			bs := testnats.Connect(b, srv.URL(), "bench/append")
			ctx := context.Background()
			msg, err := bs.Encode(appendEvent(0))
			if err != nil {
				b.Fatal(err)
			}
			js := bs.JetStream()
			// The events are made before the clock runs, as the raw side's
			// message is: building an event's ids is the caller's work.
			events := make([]schemas.Event, (b.N*rounds+1)*round)
			for i := range events {
				events[i] = appendEvent(i + 1)
			}
			appended := 0
			viaBus := func(n int) {
				for range n {
					if _, err := bs.Publish(ctx, events[appended]); err != nil {
						b.Fatal(err)
					}
					appended++
				}
			}
			raw := func(n int) {
				for i := range n {
					msg.Header.Set("Nats-Msg-Id", fmt.Sprintf("raw-%d-%d", time.Now().UnixNano(), i))
					if _, err := js.PublishMsg(ctx, msg); err != nil {
						b.Fatal(err)
					}
				}
			}
			viaBus(round) // warm-up
			raw(round)
			b.ResetTimer()
			var busTime, rawTime time.Duration
			for r := range b.N * rounds {
				first, second, ft, st := viaBus, raw, &busTime, &rawTime
				if r%2 == 1 {
					first, second, ft, st = raw, viaBus, &rawTime, &busTime
				}
				t0 := time.Now()
				first(round)
				t1 := time.Now()
				second(round)
				*ft += t1.Sub(t0)
				*st += time.Since(t1)
			}
			n := float64(b.N * rounds * round)
			busNs, rawNs := float64(busTime.Nanoseconds())/n, float64(rawTime.Nanoseconds())/n
			b.ReportMetric(busNs, "bus_ns/event")
			b.ReportMetric(rawNs, "raw_ns/event")
			b.ReportMetric(rawNs/busNs, "append_ratio")
			b.ReportMetric(0, "ns/op")
		})
	}
}
