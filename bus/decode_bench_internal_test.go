package bus

import (
	"bufio"
	"encoding/json"
	"os"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/loopbus/loopbus/schemas"
)

// storedMessage is one message of testdata/session.jsonl: the events of a
// three-step session as the services stored them.
type storedMessage struct {
	Subject string          `json:"subject"`
	ID      string          `json:"id"`
	Data    json.RawMessage `json:"data"`
}

func loadSession(tb testing.TB) []storedMessage {
	tb.Helper()
	f, err := os.Open("testdata/session.jsonl")
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	var out []storedMessage
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, MaxEventBytes)
	for sc.Scan() {
		var m storedMessage
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			tb.Fatal(err)
		}
		out = append(out, m)
	}
	if err := sc.Err(); err != nil {
		tb.Fatal(err)
	}
	return out
}

// BenchmarkDecodeSession decodes the events of a real three-step session
// (26 events, 850 bytes on average) the way Read does: with the schema
// check (consumers that act on events) and without (ReadOptions.SkipSchema,
// the projector's fold). ns/op is per event.
func BenchmarkDecodeSession(b *testing.B) {
	msgs := loadSession(b)
	cat, err := schemas.NewCatalogue()
	if err != nil {
		b.Fatal(err)
	}
	bs := &Bus{cat: cat}
	headers := make([]nats.Header, len(msgs))
	size := 0
	for i, m := range msgs {
		headers[i] = nats.Header{nats.MsgIdHdr: {m.ID}}
		size += len(m.Data)
		// Every event decodes before the clock starts.
		if _, err := bs.decode(m.Subject, headers[i], m.Data, true); err != nil {
			b.Fatalf("event %d: %v", i, err)
		}
	}
	for _, checked := range []bool{false, true} {
		name := "unchecked"
		if checked {
			name = "checked"
		}
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(size / len(msgs)))
			i := 0
			for b.Loop() {
				m := msgs[i]
				if _, err := bs.decode(m.Subject, headers[i], m.Data, checked); err != nil {
					b.Fatal(err)
				}
				if i++; i == len(msgs) {
					i = 0
				}
			}
		})
	}
}
