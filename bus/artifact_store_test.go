package bus_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/internal/testnats"
	"github.com/loopbus/loopbus/schemas"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

func randomBytes(t *testing.T, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

// artifactMeta reads the metadata message of an artifact as anyone may.
func artifactMeta(t *testing.T, b *bus.Bus, key string) (*jetstream.RawStreamMsg, map[string]any) {
	t.Helper()
	s, err := b.JetStream().Stream(ctxT(t), bus.DefaultArtifactsBucket)
	if err != nil {
		t.Fatal(err)
	}
	m, err := s.GetLastMsgForSubject(ctxT(t), bus.ArtifactMetaSubject(key))
	if err != nil {
		t.Fatalf("metadata of %s: %v", key, err)
	}
	var meta map[string]any
	if err := json.Unmarshal([]byte(m.Header.Get(bus.HeaderArtifactMeta)), &meta); err != nil {
		t.Fatalf("metadata of %s: %v", key, err)
	}
	return m, meta
}

// Artifacts of every size around the chunk boundaries round-trip, in one
// message when they fit one chunk, else in chunks and a metadata message.
func TestArtifactSizes(t *testing.T) {
	t.Parallel()
	b, _ := testnats.Bus(t)
	const c = bus.ArtifactChunkSize
	tests := []struct {
		size, msgs int
	}{
		{0, 1}, {1, 1}, {511, 1}, {512, 1}, {513, 1}, {1000, 1},
		{16<<10 - 1, 1}, {16 << 10, 1}, {16<<10 + 1, 1}, {c - 1, 1}, {c, 1},
		{c + 1, 3}, {2 * c, 3}, {5*c + 7, 7}, {40*c + 3, 42},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprint(tt.size), func(t *testing.T) {
			ctx := ctxT(t)
			payload := randomBytes(t, tt.size)
			before := streamState(t, b, bus.DefaultArtifactsBucket).Msgs
			ref, err := b.PutArtifact(ctx, "s1/sizes/"+fmt.Sprint(tt.size), "a.bin", bytes.NewReader(payload))
			if err != nil {
				t.Fatal(err)
			}
			if ref.Size != int64(tt.size) || ref.Digest != schemas.Digest(payload) {
				t.Errorf("ref %+v", ref)
			}
			var buf bytes.Buffer
			if err := b.GetArtifact(ctx, ref, &buf); err != nil {
				t.Fatalf("GetArtifact: %v", err)
			}
			if !bytes.Equal(buf.Bytes(), payload) {
				t.Errorf("read %d bytes that differ from the %d stored", buf.Len(), tt.size)
			}
			// Other subtests store concurrently: count this put's own
			// messages through its metadata.
			m, meta := artifactMeta(t, b, ref.Object)
			chunks := int(meta["chunks"].(float64))
			if chunks+1 != tt.msgs {
				t.Errorf("%d chunks, want %d messages in all", chunks, tt.msgs)
			}
			if chunks == 0 && !bytes.Equal(m.Data, payload) {
				t.Errorf("the metadata message of a small artifact does not hold its bytes")
			}
			if after := streamState(t, b, bus.DefaultArtifactsBucket).Msgs; after < before+uint64(tt.msgs) {
				t.Errorf("stream grew from %d to %d messages, want at least %d more", before, after, tt.msgs)
			}
		})
	}
}

// The server refuses a second message on any subject of the artifact
// stream, whoever sends it and however (plain, rollup, TTL, expected
// sequence of the stored message): a stored artifact cannot be replaced.
func TestArtifactWriteOnce(t *testing.T) {
	t.Parallel()
	b, _ := testnats.Bus(t)
	ctx := ctxT(t)
	payload := randomBytes(t, 3*bus.ArtifactChunkSize+17)
	ref, err := b.PutArtifact(ctx, "s1/once/a.bin", "a.bin", bytes.NewReader(payload))
	if err != nil {
		t.Fatal(err)
	}
	small, err := b.PutArtifact(ctx, "s1/once/b.txt", "b.txt", strings.NewReader("small"))
	if err != nil {
		t.Fatal(err)
	}
	m, meta := artifactMeta(t, b, ref.Object)
	chunk := "loopbus.art.c." + meta["chunkId"].(string) + ".1"
	before := streamState(t, b, bus.DefaultArtifactsBucket)

	forged := m.Header.Get(bus.HeaderArtifactMeta)
	for _, subject := range []string{bus.ArtifactMetaSubject(ref.Object), chunk, bus.ArtifactMetaSubject(small.Object)} {
		for _, hdr := range []nats.Header{
			{bus.HeaderArtifactMeta: {forged}},
			{"Nats-Rollup": {"sub"}},
			{"Nats-Rollup": {"all"}},
			{"Nats-TTL": {"1s"}},
			{"Nats-Expected-Last-Subject-Sequence": {fmt.Sprint(m.Sequence)}},
			{"Nats-Msg-Id": {"x"}},
		} {
			resp, err := b.Conn().RequestMsg(&nats.Msg{Subject: subject, Header: hdr, Data: []byte("overwritten")}, 5*time.Second)
			if err != nil {
				t.Fatalf("publish to %s: %v", subject, err)
			}
			var ack struct {
				Seq   uint64 `json:"seq"`
				Error *struct {
					Description string `json:"description"`
				} `json:"error"`
			}
			if err := json.Unmarshal(resp.Data, &ack); err != nil || ack.Error == nil {
				t.Errorf("a second write to %s with %v was stored: %s", subject, hdr, resp.Data)
			}
		}
		// Through the JetStream client, asynchronously, too.
		f, err := b.JetStream().PublishAsync(subject, []byte("overwritten"))
		if err != nil {
			t.Fatal(err)
		}
		select {
		case <-f.Ok():
			t.Errorf("an asynchronous second write to %s was stored", subject)
		case err := <-f.Err():
			if !strings.Contains(err.Error(), "maximum messages per subject exceeded") {
				t.Errorf("asynchronous second write to %s: %v", subject, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("no ack")
		}
	}
	after := streamState(t, b, bus.DefaultArtifactsBucket)
	if after.Msgs != before.Msgs || after.LastSeq != before.LastSeq || after.Bytes != before.Bytes {
		t.Errorf("the stream changed: %+v, then %+v", before, after)
	}
	var buf bytes.Buffer
	if err := b.GetArtifact(ctx, ref, &buf); err != nil || !bytes.Equal(buf.Bytes(), payload) {
		t.Errorf("artifact after the refused writes: %v", err)
	}
	buf.Reset()
	if err := b.GetArtifact(ctx, small, &buf); err != nil || buf.String() != "small" {
		t.Errorf("small artifact after the refused writes: %q, %v", buf.String(), err)
	}
	want := []string{ref.Object, small.Object}
	slices.Sort(want)
	if keys, err := b.ArtifactKeys(ctx); err != nil || !slices.Equal(keys, want) {
		t.Errorf("ArtifactKeys = %q, %v; want %q", keys, err, want)
	}
}

// Provisioning restores the write-once settings of an existing artifact
// stream that someone changed, keeping its content.
func TestArtifactStreamInvariantsRestored(t *testing.T) {
	t.Parallel()
	srv := testnats.Server(t)
	b := testnats.Connect(t, srv.URL(), "test/a")
	ctx := ctxT(t)
	ref, err := b.PutArtifact(ctx, "s1/inv/a.txt", "a.txt", strings.NewReader("kept"))
	if err != nil {
		t.Fatal(err)
	}
	js := b.JetStream()
	s, err := js.Stream(ctx, bus.DefaultArtifactsBucket)
	if err != nil {
		t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	cfg.MaxMsgsPerSubject, cfg.Discard, cfg.DiscardNewPerSubject = 10, jetstream.DiscardOld, false
	cfg.AllowRollup, cfg.Subjects = true, []string{"loopbus.art.m.*", "loopbus.art.c.*.*", "elsewhere.>"}
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	cur, _, err := b.ArtifactStores(ctx)
	if err != nil || len(cur.Problems) != 5 {
		t.Errorf("ArtifactStores of a changed stream: %+v, %v; want 5 problems", cur, err)
	}

	b2 := testnats.Connect(t, srv.URL(), "test/b")
	s, err = js.Stream(ctx, bus.DefaultArtifactsBucket)
	if err != nil {
		t.Fatal(err)
	}
	got := s.CachedInfo().Config
	if got.MaxMsgsPerSubject != 1 || got.Discard != jetstream.DiscardNew || !got.DiscardNewPerSubject || got.AllowRollup ||
		!got.AllowDirect || len(got.Subjects) != 1 || got.Subjects[0] != bus.ArtifactSubjects {
		t.Errorf("artifact stream after Connect: %+v", got)
	}
	var buf bytes.Buffer
	if err := b2.GetArtifact(ctx, ref, &buf); err != nil || buf.String() != "kept" {
		t.Errorf("artifact after the restore: %q, %v", buf.String(), err)
	}
	cur, old, err := b2.ArtifactStores(ctx)
	if err != nil || len(cur.Problems) != 0 || cur.Stream != bus.DefaultArtifactsBucket || cur.Messages != 1 || old != nil {
		t.Errorf("ArtifactStores: %+v, %+v, %v", cur, old, err)
	}

	// Loosened again, and written over meanwhile: restoring one message
	// per subject would keep the overwrite, so Connect refuses, naming the
	// problem, and changes nothing.
	cfg = s.CachedInfo().Config
	cfg.MaxMsgsPerSubject, cfg.Discard, cfg.DiscardNewPerSubject = 5, jetstream.DiscardOld, false
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, bus.ArtifactMetaSubject(ref.Object), []byte("overwritten")); err != nil {
		t.Fatal(err)
	}
	_, err = bus.Connect(ctx, bus.Config{URL: srv.URL()}, "test/c", catalogue(t), testnats.Logger(t))
	if !errors.Is(err, bus.ErrNotWriteOnce) || !strings.Contains(err.Error(), "2 messages on 1 subjects") {
		t.Errorf("Connect to an overwritten artifact stream = %v, want ErrNotWriteOnce", err)
	}
	s, err = js.Stream(ctx, bus.DefaultArtifactsBucket)
	if err != nil {
		t.Fatal(err)
	}
	if c, st := s.CachedInfo().Config, s.CachedInfo().State; c.MaxMsgsPerSubject != 5 || st.Msgs != 2 {
		t.Errorf("the refused Connect changed the stream: %d per subject, %d messages", c.MaxMsgsPerSubject, st.Msgs)
	}
}

// A data directory written by releases that kept artifacts in an object
// store: its artifacts are still read, through the new Bus, after a
// restart of the server; nothing new goes there; and a new data directory
// gets no object store.
func TestArtifactLegacyObjectStore(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	dir := t.TempDir()
	srv, err := bus.StartEmbedded(bus.EmbeddedConfig{DataDir: dir}, testnats.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	// What the earlier release did: the object store LOOPBUS_ARTIFACTS,
	// one object per key.
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	obs, err := js.CreateObjectStore(ctx, jetstream.ObjectStoreConfig{Bucket: bus.DefaultArtifactsBucket, Storage: jetstream.FileStorage})
	if err != nil {
		t.Fatal(err)
	}
	old := map[string][]byte{
		"s1/input/empty.txt":    {},
		"s1/input/in.txt":       []byte("hello from the old store"),
		"j1/r5-d1/big.bin":      randomBytes(t, 3*128<<10+99),
		"s1/definition/x/y.txt": []byte("nested key"),
	}
	refs := map[string]schemas.ArtifactRef{}
	for key, data := range old {
		if _, err := obs.Put(ctx, jetstream.ObjectMeta{Name: key}, bytes.NewReader(data)); err != nil {
			t.Fatal(err)
		}
		refs[key] = schemas.ArtifactRef{Name: "a", Object: key, Digest: schemas.Digest(data), Size: int64(len(data))}
	}
	// The old release replaced objects in place: one was put twice.
	if _, err := obs.Put(ctx, jetstream.ObjectMeta{Name: "s1/input/in.txt"}, strings.NewReader("replaced")); err != nil {
		t.Fatal(err)
	}
	old["s1/input/in.txt"] = []byte("replaced")
	refs["s1/input/in.txt"] = schemas.ArtifactRef{Name: "in.txt", Object: "s1/input/in.txt", Digest: schemas.Digest([]byte("replaced")), Size: 8}
	nc.Close()
	srv.Shutdown()

	srv, err = bus.StartEmbedded(bus.EmbeddedConfig{DataDir: dir}, testnats.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	b := testnats.Connect(t, srv.URL(), "test/legacy")
	for key, data := range old {
		var buf bytes.Buffer
		if err := b.GetArtifact(ctx, refs[key], &buf); err != nil || !bytes.Equal(buf.Bytes(), data) {
			t.Errorf("old artifact %s: %d bytes, %v", key, buf.Len(), err)
		}
	}
	bad := refs["j1/r5-d1/big.bin"]
	bad.Digest = schemas.Digest([]byte("other"))
	if err := b.GetArtifact(ctx, bad, &bytes.Buffer{}); !errors.Is(err, bus.ErrDigestMismatch) {
		t.Errorf("old artifact with a wrong digest: %v, want ErrDigestMismatch", err)
	}
	bad = refs["j1/r5-d1/big.bin"]
	bad.Size++
	if err := b.GetArtifact(ctx, bad, &bytes.Buffer{}); !errors.Is(err, bus.ErrDigestMismatch) {
		t.Errorf("old artifact with a wrong size: %v, want ErrDigestMismatch", err)
	}
	if err := b.GetArtifact(ctx, schemas.ArtifactRef{Name: "x", Object: "s1/input/nope.txt", Digest: schemas.Digest(nil)}, &bytes.Buffer{}); !errors.Is(err, bus.ErrNotFound) {
		t.Errorf("a key in neither store: %v, want ErrNotFound", err)
	}
	// New artifacts go to the write-once stream, not the old store.
	oldState := streamState(t, b, "OBJ_"+bus.DefaultArtifactsBucket)
	ref, err := b.PutArtifact(ctx, "s2/input/in.txt", "in.txt", strings.NewReader("new"))
	if err != nil {
		t.Fatal(err)
	}
	if st := streamState(t, b, "OBJ_"+bus.DefaultArtifactsBucket); st.Msgs != oldState.Msgs || st.LastSeq != oldState.LastSeq {
		t.Errorf("the old store changed: %+v, then %+v", oldState, st)
	}
	var buf bytes.Buffer
	if err := b.GetArtifact(ctx, ref, &buf); err != nil || buf.String() != "new" {
		t.Errorf("new artifact: %q, %v", buf.String(), err)
	}
	cur, legacy, err := b.ArtifactStores(ctx)
	if err != nil || legacy == nil || legacy.Stream != "OBJ_"+bus.DefaultArtifactsBucket || legacy.Messages != oldState.Msgs || cur.Messages != 1 {
		t.Errorf("ArtifactStores: %+v, %+v, %v", cur, legacy, err)
	}
	if keys, err := b.ArtifactKeys(ctx); err != nil || len(keys) != 1 || keys[0] != ref.Object {
		t.Errorf("ArtifactKeys = %q, %v; want only %s (not those of the old store)", keys, err, ref.Object)
	}

	// A new data directory has no object store, and reading a missing
	// artifact there does not create one.
	fresh, _ := testnats.Bus(t)
	if err := fresh.GetArtifact(ctx, refs["s1/input/in.txt"], &bytes.Buffer{}); !errors.Is(err, bus.ErrNotFound) {
		t.Errorf("old key on a new data directory: %v, want ErrNotFound", err)
	}
	if _, err := fresh.JetStream().Stream(ctx, "OBJ_"+bus.DefaultArtifactsBucket); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Errorf("a new data directory has the old object store: %v", err)
	}
	if _, legacy, err := fresh.ArtifactStores(ctx); err != nil || legacy != nil {
		t.Errorf("ArtifactStores on a new data directory: %+v, %v", legacy, err)
	}
	// Metadata stored under an old artifact's key in the write-once
	// stream (by anyone allowed to store) does not hide it.
	for key := range old {
		squat := &nats.Msg{Subject: bus.ArtifactMetaSubject(key), Header: nats.Header{bus.HeaderArtifactMeta: {`{"object":"` + key + `","size":0}`}}}
		if _, err := b.JetStream().PublishMsg(ctx, squat); err != nil {
			t.Fatal(err)
		}
		var buf bytes.Buffer
		if err := b.GetArtifact(ctx, refs[key], &buf); err != nil || !bytes.Equal(buf.Bytes(), old[key]) {
			t.Errorf("old artifact %s after metadata was stored under its key: %d bytes, %v", key, buf.Len(), err)
		}
	}
}

// What a writer that does not follow the layout may store is refused
// when read, quickly and without reading more than the reference's size;
// the connection survives an absurd key.
func TestArtifactHostileMetadata(t *testing.T) {
	t.Parallel()
	b, _ := testnats.Bus(t)
	ctx := ctxT(t)
	digest := schemas.Digest([]byte("data"))
	write := func(t *testing.T, subject string, hdr nats.Header, data []byte) {
		t.Helper()
		resp, err := b.Conn().RequestMsg(&nats.Msg{Subject: subject, Header: hdr, Data: data}, 5*time.Second)
		if err != nil {
			t.Fatalf("write %s: %v", subject, err)
		}
		if strings.Contains(string(resp.Data), `"error"`) {
			t.Fatalf("write %s: %s", subject, resp.Data)
		}
	}
	meta := func(m map[string]any) nats.Header {
		raw, _ := json.Marshal(m)
		return nats.Header{bus.HeaderArtifactMeta: {string(raw)}}
	}
	tests := []struct {
		name   string
		key    string
		size   int64
		hdr    func(key string) nats.Header
		body   []byte
		chunks map[string][]byte
		want   string
	}{
		{name: "no metadata header", size: 4, hdr: func(string) nats.Header { return nil }, body: []byte("data"), want: "no Loopbus-Artifact header"},
		{name: "metadata not JSON", size: 4, hdr: func(string) nats.Header { return nats.Header{bus.HeaderArtifactMeta: {"{not json"}} }, want: "not JSON"},
		{name: "another key", size: 4, hdr: func(string) nats.Header {
			return meta(map[string]any{"object": "someone/else", "size": 4, "digest": digest})
		}, body: []byte("data"), want: "names the key"},
		{name: "more bytes than it says", size: 4, hdr: func(k string) nats.Header {
			return meta(map[string]any{"object": k, "size": 4, "digest": digest})
		}, body: []byte("data and more"), want: "holds 13 bytes"},
		{name: "a billion chunks for four bytes", size: 4, hdr: func(k string) nats.Header {
			return meta(map[string]any{"object": k, "size": 4, "digest": digest, "chunks": 1 << 30, "chunkId": "abcdefgh12", "chunkSize": 1024})
		}, want: "1073741824 chunks"},
		{name: "wildcard chunk id", size: 4, hdr: func(k string) nats.Header {
			return meta(map[string]any{"object": k, "size": 4, "digest": digest, "chunks": 1, "chunkId": ">", "chunkSize": 1024})
		}, want: "chunk id"},
		{name: "tiny chunks", size: 4, hdr: func(k string) nats.Header {
			return meta(map[string]any{"object": k, "size": 4, "digest": digest, "chunks": 4, "chunkId": "abcdefgh12", "chunkSize": 1})
		}, want: "chunks of 1 bytes"},
		{name: "negative size", size: -1, hdr: func(k string) nats.Header {
			return meta(map[string]any{"object": k, "size": -1, "digest": digest})
		}, want: "-1 bytes"},
		{name: "chunk missing", size: 1 << 40, hdr: func(k string) nats.Header {
			return meta(map[string]any{"object": k, "size": 1 << 40, "digest": digest, "chunks": 1 << 20, "chunkId": "missingchunks", "chunkSize": 1 << 20})
		}, want: "is missing"},
		{name: "chunk shorter than declared", size: 2048, hdr: func(k string) nats.Header {
			return meta(map[string]any{"object": k, "size": 2048, "digest": digest, "chunks": 2, "chunkId": "shortchunks", "chunkSize": 1024})
		}, chunks: map[string][]byte{"loopbus.art.c.shortchunks.0": []byte("short"), "loopbus.art.c.shortchunks.1": bytes.Repeat([]byte("x"), 1024)}, want: "chunk 0 of 2 holds 5 bytes"},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			key := fmt.Sprintf("hostile/%d~tokentoken", i)
			for subj, data := range tt.chunks {
				write(t, subj, nil, data)
			}
			write(t, bus.ArtifactMetaSubject(key), tt.hdr(key), tt.body)
			var buf bytes.Buffer
			start := time.Now()
			err := b.GetArtifact(ctx, schemas.ArtifactRef{Name: "a", Object: key, Digest: digest, Size: tt.size}, &buf)
			if !errors.Is(err, bus.ErrBadArtifact) || !errors.Is(err, bus.ErrDigestMismatch) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("GetArtifact = %v, want ErrBadArtifact saying %q", err, tt.want)
			}
			if buf.Len() != 0 {
				t.Errorf("%d bytes written", buf.Len())
			}
			if d := time.Since(start); d > 5*time.Second {
				t.Errorf("took %s", d)
			}
		})
	}

	// Metadata that disagrees with the reference fails before any byte
	// is read.
	ref, err := b.PutArtifact(ctx, "s1/hostile/a.bin", "a.bin", bytes.NewReader(randomBytes(t, 2*bus.ArtifactChunkSize+1)))
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []schemas.ArtifactRef{{Name: "a", Object: ref.Object, Digest: digest, Size: ref.Size}, {Name: "a", Object: ref.Object, Digest: ref.Digest, Size: 1 << 50}} {
		var buf bytes.Buffer
		if err := b.GetArtifact(ctx, r, &buf); !errors.Is(err, bus.ErrDigestMismatch) || buf.Len() != 0 {
			t.Errorf("GetArtifact(%+v) = %v after %d bytes; want ErrDigestMismatch before any", r, err, buf.Len())
		}
	}

	// Chunks stored out of order are read in order.
	chunkA, chunkB := bytes.Repeat([]byte("a"), 1024), []byte("b")
	both := append(append([]byte{}, chunkA...), chunkB...)
	write(t, "loopbus.art.c.reordered.1", nil, chunkB)
	write(t, "loopbus.art.c.reordered.0", nil, chunkA)
	write(t, bus.ArtifactMetaSubject("reordered~tokentoken"), meta(map[string]any{"object": "reordered~tokentoken", "size": 1025, "digest": schemas.Digest(both), "chunks": 2, "chunkId": "reordered", "chunkSize": 1024}), nil)
	var buf bytes.Buffer
	if err := b.GetArtifact(ctx, schemas.ArtifactRef{Name: "a", Object: "reordered~tokentoken", Digest: schemas.Digest(both), Size: 1025}, &buf); err != nil || !bytes.Equal(buf.Bytes(), both) {
		t.Errorf("reordered chunks: %v", err)
	}

	// A key too long to be stored is not found, and asking for it does not
	// cost the connection (whose control lines are bounded).
	huge := strings.Repeat("k", 64<<10)
	if err := b.GetArtifact(ctx, schemas.ArtifactRef{Name: "a", Object: huge, Digest: digest, Size: 4}, &bytes.Buffer{}); !errors.Is(err, bus.ErrNotFound) {
		t.Errorf("huge key: %v, want ErrNotFound", err)
	}
	if _, err := b.PutArtifact(ctx, huge, "a.txt", strings.NewReader("x")); err == nil {
		t.Error("PutArtifact took a huge key")
	}
	buf.Reset()
	if err := b.GetArtifact(ctx, ref, &buf); err != nil {
		t.Errorf("the connection after a huge key: %v", err)
	}
}

// A put honours its context.
func TestPutArtifactCancelled(t *testing.T) {
	t.Parallel()
	b, _ := testnats.Bus(t)
	ctx, cancel := context.WithCancel(ctxT(t))
	cancel()
	if _, err := b.PutArtifact(ctx, "s1/c/a.bin", "a.bin", bytes.NewReader(randomBytes(t, 3*bus.ArtifactChunkSize))); !errors.Is(err, context.Canceled) {
		t.Errorf("PutArtifact with a cancelled context = %v", err)
	}
}
