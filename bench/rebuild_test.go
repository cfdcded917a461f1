package bench

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/internal/testcpu"
	"github.com/loopbus/loopbus/internal/testnats"
	"github.com/loopbus/loopbus/projections"
	"github.com/loopbus/loopbus/projections/projector"
	"github.com/loopbus/loopbus/schemas"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// templateSession is the id of the one session really run through the
// services; every other session in the stream is a copy of its events
// under another id. It contains no hex digit run, so replacing it touches
// nothing else.
const templateSession = "zqxtemplatezqx"

// BenchmarkRebuild fills a stream with the events of many three-step
// sessions (copies of one real session, re-identified, valid) and then,
// on the same data under each sync mode:
//   - raw: reads every message through an ordered consumer without
//     decoding (raw_events/s);
//   - fold: rebuilds every manifest the way the projector does — bus.Read
//     (decode and checks) and projections.FoldManifest into one manifest per
//     session — without writing views (events/s); rebuild_ratio is fold ÷
//     raw;
//   - projector: the projector's real Rebuild, which also writes the
//     changed manifests to the views bucket (once per batch of
//     projector.Config.CatchUpBatch events), for a bounded time
//     (projector_events/s).
//
// raw_cpu_us/event and cpu_us/event are the CPU time of the whole process
// (server, client, reader) per event during the raw read and the fold.
func BenchmarkRebuild(b *testing.B) {
	events := size(30_000, 1_000_000)
	dir := b.TempDir()
	total := fillStream(b, dir, events)
	for _, mode := range modes() {
		b.Run("fsync="+mode.name, func(b *testing.B) {
			srv := startServer(b, dir, mode)
			bs := testnats.Connect(b, srv.URL(), "bench/rebuild")
			ctx := context.Background()
			b.ResetTimer()
			var rawTime, foldTime, rawCPU, foldCPU time.Duration
			for range b.N {
				c0, t0 := testcpu.Used(b), time.Now()
				if n := rawRead(b, bs); n != total {
					b.Fatalf("raw read %d messages, want %d", n, total)
				}
				c1, t1 := testcpu.Used(b), time.Now()
				manifests := foldAll(b, bs)
				foldTime += time.Since(t1)
				foldCPU += testcpu.Used(b) - c1
				rawTime += t1.Sub(t0)
				rawCPU += c1 - c0
				if want := (total + 25) / 26; len(manifests) < want {
					b.Fatalf("%d manifests, want at least %d", len(manifests), want)
				}
			}
			b.StopTimer()
			n := float64(total * b.N)
			b.ReportMetric(n/foldTime.Seconds(), "events/s")
			b.ReportMetric(n/rawTime.Seconds(), "raw_events/s")
			b.ReportMetric(rawTime.Seconds()/foldTime.Seconds(), "rebuild_ratio")
			b.ReportMetric(float64(rawCPU.Microseconds())/n, "raw_cpu_us/event")
			b.ReportMetric(float64(foldCPU.Microseconds())/n, "cpu_us/event")

			cb := &countingBus{Bus: bs}
			p, err := projector.New(projector.Config{}, cb, testnats.Logger(b))
			if err != nil {
				b.Fatal(err)
			}
			pctx, cancel := context.WithTimeout(ctx, time.Duration(size(2, 15))*time.Second)
			defer cancel()
			start := time.Now()
			if err := p.Rebuild(pctx); err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(cb.n.Load())/time.Since(start).Seconds(), "projector_events/s")
			b.ReportMetric(0, "ns/op")
		})
	}
}

// countingBus is the real bus; it counts the events Read delivers.
type countingBus struct {
	*bus.Bus
	n atomic.Int64
}

func (c *countingBus) Read(ctx context.Context, opts bus.ReadOptions, fn func(schemas.Event) error) error {
	return c.Bus.Read(ctx, opts, func(ev schemas.Event) error {
		c.n.Add(1)
		return fn(ev)
	})
}

// foldAll rebuilds every session's manifest from the whole stream.
func foldAll(tb testing.TB, bs *bus.Bus) map[string]*projections.Manifest {
	tb.Helper()
	live := map[string]*projections.Manifest{}
	err := bs.Read(context.Background(), bus.ReadOptions{DeadLetter: "projector", SkipSchema: true}, func(ev schemas.Event) error {
		if m := projections.FoldManifest(live[ev.Session], ev); m != nil {
			live[ev.Session] = m
		}
		return nil
	})
	if err != nil {
		tb.Fatalf("fold: %v", err)
	}
	return live
}

// rawRead reads every message of the event stream through an ordered
// consumer, the same kind bus.Read uses, touching only the payload length.
func rawRead(tb testing.TB, bs *bus.Bus) int {
	tb.Helper()
	ctx := context.Background()
	st, err := bs.JetStream().Stream(ctx, bs.StreamName())
	if err != nil {
		tb.Fatal(err)
	}
	want := int(st.CachedInfo().State.Msgs)
	cons, err := bs.JetStream().OrderedConsumer(ctx, bs.StreamName(), jetstream.OrderedConsumerConfig{})
	if err != nil {
		tb.Fatal(err)
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(512))
	if err != nil {
		tb.Fatal(err)
	}
	defer it.Stop()
	n, bytes := 0, 0
	for n < want {
		msg, err := it.Next()
		if err != nil {
			tb.Fatalf("raw read: %v", err)
		}
		bytes += len(msg.Data())
		n++
	}
	if bytes == 0 {
		tb.Fatal("raw read: empty messages")
	}
	return n
}

// fillStream runs one real session on a server on dir, then publishes
// copies of its events under new session and event ids until the stream
// holds at least events events, and shuts the server down. It returns the
// number of events in the stream.
func fillStream(tb testing.TB, dir string, events int) int {
	tb.Helper()
	srv := startServer(tb, dir, syncMode{name: "default", relaxed: true})
	tpl := runTemplate(tb, srv)
	bs := testnats.Connect(tb, srv.URL(), "bench/fill")
	js, err := jetstream.New(bs.Conn(), jetstream.WithPublishAsyncMaxPending(4096))
	if err != nil {
		tb.Fatal(err)
	}
	copies := (events - len(tpl) + len(tpl) - 1) / len(tpl)
	const group = 64 // sessions interleaved in the stream, as concurrent ones are
	for g := 0; g < copies; g += group {
		batch := make([][]*nats.Msg, 0, group)
		for i := g; i < min(g+group, copies); i++ {
			batch = append(batch, copySession(tpl, i))
		}
		if g == 0 {
			for _, m := range batch[0] {
				if _, err := bs.Decode(m.Subject, m.Header, m.Data); err != nil {
					tb.Fatalf("copied event is invalid: %v", err)
				}
			}
		}
		for pos := range tpl {
			for _, msgs := range batch {
				if _, err := js.PublishMsgAsync(msgs[pos]); err != nil {
					tb.Fatalf("publish: %v", err)
				}
			}
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(5 * time.Minute):
		tb.Fatal("fill: publishes not acknowledged")
	}
	st, err := js.Stream(context.Background(), bs.StreamName())
	if err != nil {
		tb.Fatal(err)
	}
	total := int(st.CachedInfo().State.Msgs)
	if total != len(tpl)*(copies+1) {
		tb.Fatalf("stream holds %d events, want %d (duplicates?)", total, len(tpl)*(copies+1))
	}
	bs.Close()
	srv.Shutdown()
	return total
}

// runTemplate runs templateSession through the services on srv and
// returns its stored events.
func runTemplate(tb testing.TB, srv *bus.Embedded) []template {
	tb.Helper()
	sys := newSystemOn(tb, srv)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ends := sys.watchEnds(ctx)
	stops := []func(){sys.startValidator(), sys.startWorkers(1), sys.startOrchestrator()}
	sys.submit(ctx, templateSession)
	waitEnds(tb, ends, 1, time.Minute)
	for _, stop := range stops {
		stop()
	}
	cancel() // ends the watcher
	tpl := templateMessages(tb, sys.admin)
	sys.closeConns()
	return tpl
}

// template is one stored event of the template session.
type template struct {
	id      string
	subject string
	data    []byte
}

func templateMessages(tb testing.TB, bs *bus.Bus) []template {
	tb.Helper()
	var out []template
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st, err := bs.JetStream().Stream(ctx, bs.StreamName())
	if err != nil {
		tb.Fatal(err)
	}
	err = bs.Read(ctx, bus.ReadOptions{Subjects: []string{schemas.SessionSubjects(templateSession)}}, func(ev schemas.Event) error {
		raw, err := st.GetMsg(ctx, ev.Seq)
		if err != nil {
			return err
		}
		out = append(out, template{id: ev.ID, subject: raw.Subject, data: raw.Data})
		return nil
	})
	if err != nil {
		tb.Fatalf("template: %v", err)
	}
	if len(out) < 20 {
		tb.Fatalf("template session has only %d events", len(out))
	}
	return out
}

// copySession returns the template's messages re-identified as copy i:
// another session id, and event ids (also where events refer to each
// other as causation and correlation) unique to the copy.
func copySession(tpl []template, i int) []*nats.Msg {
	pairs := []string{templateSession, fmt.Sprintf("r%07d", i)}
	ids := make([]string, len(tpl))
	for j, t := range tpl {
		ids[j] = t.id[:22] + fmt.Sprintf("%010d", i)
		pairs = append(pairs, t.id, ids[j])
	}
	r := strings.NewReplacer(pairs...)
	msgs := make([]*nats.Msg, len(tpl))
	for j, t := range tpl {
		m := nats.NewMsg(r.Replace(t.subject))
		m.Header.Set(nats.MsgIdHdr, ids[j])
		m.Header.Set("Content-Type", bus.ContentType)
		m.Data = []byte(r.Replace(string(t.data)))
		msgs[j] = m
	}
	return msgs
}
