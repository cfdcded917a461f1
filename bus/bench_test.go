package bus_test

import (
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
			if _, err := bs.Decode(msg.Subject, msg.Header, msg.Data); err != nil {
				b.Fatal(err)
			}
		}
	})
}
