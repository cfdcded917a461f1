package bus_test

import (
	"testing"
	"time"

	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/internal/testnats"
	"github.com/nats-io/nats.go/jetstream"
)

// Workers announce themselves in the presence bucket, which every
// connection provisions with a TTL; a deleted record is gone from the list.
func TestWorkerPresence(t *testing.T) {
	t.Parallel()
	b, _ := testnats.Bus(t)
	ctx := ctxT(t)
	ws, err := b.Workers(ctx)
	if err != nil || len(ws) != 0 {
		t.Fatalf("Workers on a fresh bus = %v, %v; want none", ws, err)
	}
	started := time.Now().UTC().Truncate(time.Second)
	for _, w := range []bus.WorkerInfo{
		{ID: "w1@host.example", Host: "host.example", Lanes: []string{"no-net"}, Concurrency: 2, Started: started},
		{ID: "w2", Lanes: []string{"no-net", "net", "heavy"}},
	} {
		if err := b.PutWorker(ctx, w); err != nil {
			t.Fatal(err)
		}
	}
	// A refresh replaces the record.
	if err := b.PutWorker(ctx, bus.WorkerInfo{ID: "w2", Lanes: []string{"net"}}); err != nil {
		t.Fatal(err)
	}
	ws, err = b.Workers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(ws) != 2 || ws[0].ID != "w1@host.example" || ws[1].ID != "w2" {
		t.Fatalf("Workers = %+v; want w1@host.example and w2", ws)
	}
	if ws[0].Host != "host.example" || ws[0].Concurrency != 2 || !ws[0].Started.Equal(started) || ws[0].Seen.IsZero() || len(ws[0].Lanes) != 1 {
		t.Errorf("w1 = %+v", ws[0])
	}
	if len(ws[1].Lanes) != 1 || ws[1].Lanes[0] != "net" {
		t.Errorf("w2 after its refresh = %+v; want lanes [net]", ws[1])
	}
	if err := b.DeleteWorker(ctx, "w1@host.example"); err != nil {
		t.Fatal(err)
	}
	if err := b.DeleteWorker(ctx, "never-there"); err != nil {
		t.Errorf("deleting an absent worker: %v", err)
	}
	ws, err = b.Workers(ctx)
	if err != nil || len(ws) != 1 || ws[0].ID != "w2" {
		t.Fatalf("Workers after delete = %+v, %v; want w2 only", ws, err)
	}
	// The records expire: the bucket keeps them WorkerTTL.
	kv, err := b.JetStream().KeyValue(ctx, bus.DefaultWorkersBucket)
	if err != nil {
		t.Fatal(err)
	}
	st, err := kv.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.TTL() != bus.WorkerTTL || st.TTL() < 2*bus.WorkerRefresh {
		t.Errorf("bucket TTL = %v; want %v", st.TTL(), bus.WorkerTTL)
	}
	cfg := st.(interface{ StreamInfo() *jetstream.StreamInfo }).StreamInfo().Config
	if cfg.Storage != jetstream.FileStorage || cfg.MaxMsgSize <= 0 || cfg.MaxBytes <= 0 {
		t.Errorf("presence bucket: storage %v, max record %d, max bytes %d; want on disk (a server restart keeps it) and bounded", cfg.Storage, cfg.MaxMsgSize, cfg.MaxBytes)
	}
	// A record that PutWorker did not write under its worker's key is not
	// listed.
	if _, err := kv.Put(ctx, "forged", []byte(`{"id":"someone-else","lanes":["heavy"]}`)); err != nil {
		t.Fatal(err)
	}
	ws, err = b.Workers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range ws {
		if w.ID == "someone-else" {
			t.Errorf("a record under another key is listed: %+v", w)
		}
	}
}
