package bus_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/loopbus/loopbus/internal/testnats"
	"github.com/loopbus/loopbus/schemas"
)

func benchEvent(i int) schemas.Event {
	return schemas.Event{
		ID: fmt.Sprintf("bench-%d-%d", time.Now().UnixNano(), i), Type: schemas.TypeJobStarted,
		Session: "bench", Step: "s", Job: "bench.s.1", Time: time.Now(),
		Data: &schemas.JobStarted{JobID: "bench.s.1", Worker: "w1", Delivery: 1},
	}
}

// BenchmarkAppend compares appending one event through bus (validation,
// CloudEvent encoding, Nats-Msg-Id) with a raw JetStream publish of the same
// bytes, on one embedded server that fsyncs before acknowledging.
func BenchmarkAppend(b *testing.B) {
	bs, _ := testnats.Bus(b)
	ctx := context.Background()
	b.Run("bus", func(b *testing.B) {
		for i := range b.N {
			if _, err := bs.Publish(ctx, benchEvent(i)); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("raw", func(b *testing.B) {
		msg, err := bs.Encode(benchEvent(0))
		if err != nil {
			b.Fatal(err)
		}
		js := bs.JetStream()
		for i := range b.N {
			msg.Header.Set("Nats-Msg-Id", fmt.Sprintf("raw-%d-%d", time.Now().UnixNano(), i))
			if _, err := js.PublishMsg(ctx, msg); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkCodec measures encoding and decoding (with schema validation) of
// one event, without NATS.
func BenchmarkCodec(b *testing.B) {
	bs, _ := testnats.Bus(b)
	ev := benchEvent(0)
	msg, err := bs.Encode(ev)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("encode", func(b *testing.B) {
		for range b.N {
			if _, err := bs.Encode(ev); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("decode", func(b *testing.B) {
		for range b.N {
			if _, err := bs.Decode(msg.Subject, msg.Data); err != nil {
				b.Fatal(err)
			}
		}
	})
}
