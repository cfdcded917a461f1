package bus

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/loopbus/loopbus/schemas"
	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"
)

// storeBus connects a Bus to an embedded server of its own.
func storeBus(t *testing.T) *Bus {
	t.Helper()
	return storeBusWith(t, Config{})
}

// storeBusWith is storeBus with cfg (its URL and Name are set here).
func storeBusWith(t *testing.T, cfg Config) *Bus {
	t.Helper()
	srv, err := StartEmbedded(EmbeddedConfig{DataDir: t.TempDir()}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	cat, err := schemas.NewCatalogue()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg.URL, cfg.Name = srv.URL(), "store-test"
	b, err := Connect(ctx, cfg, "test/store", cat, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	return b
}

// A put whose chunks are never acknowledged (a subscriber takes them
// where the artifact stream should, and answers nothing) fails after
// Config.ArtifactAckWait with a time-out, and its chunks do not stay
// pending on the connection: each would hold its 128 KiB until a
// reconnect, and enough of them would stall every later put.
func TestPutArtifactAckNeverComes(t *testing.T) {
	const wait = 300 * time.Millisecond
	b := storeBusWith(t, Config{ArtifactAckWait: wait})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := b.js.DeleteStream(ctx, b.cfg.ArtifactsBucket); err != nil {
		t.Fatal(err)
	}
	sub, err := b.nc.SubscribeSync(artifactChunkPrefix + ">")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := b.nc.Flush(); err != nil {
		t.Fatal(err)
	}

	big := bytes.Repeat([]byte("x"), 3*ArtifactChunkSize+5)
	_, err = b.PutArtifact(ctx, "s1/output/big.bin", "big.bin", bytes.NewReader(big))
	if !errors.Is(err, nats.ErrTimeout) || !strings.Contains(err.Error(), "no acknowledgement in "+wait.String()) {
		t.Fatalf("put with no acknowledgement = %v, want a time-out", err)
	}
	if _, err := sub.NextMsg(5 * time.Second); err != nil {
		t.Fatalf("no chunk reached the subscriber: %v", err)
	}
	select {
	case <-b.js.PublishAsyncComplete():
	case <-time.After(20 * wait):
		t.Fatalf("%d chunk publishes still pending %s after the put failed", b.js.PublishAsyncPending(), 20*wait)
	}
}

// A put whose subject someone else wrote first fails with
// ErrArtifactExists and stores nothing readable; a write repeated after
// its ack was lost (same bytes) succeeds. Not parallel: it makes the
// random tokens predictable.
func TestPutArtifactSubjectTaken(t *testing.T) {
	b := storeBus(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b.newToken = func() string { return "predictable-token" }

	// The metadata subject: taken by a squatter that guessed the key.
	key := "s1/input/in.txt~predictable-token"
	squat := &nats.Msg{Subject: ArtifactMetaSubject(key), Header: nats.Header{HeaderArtifactMeta: {`{"object":"` + key + `","size":0}`}}}
	if _, err := b.nc.RequestMsg(squat, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	_, err := b.PutArtifact(ctx, "s1/input/in.txt", "in.txt", strings.NewReader("mine"))
	if !errors.Is(err, ErrArtifactExists) || !strings.Contains(err.Error(), ArtifactMetaSubject(key)) {
		t.Fatalf("put on a taken metadata subject = %v, want ErrArtifactExists naming the subject", err)
	}

	// A chunk subject: taken before the put reaches it.
	big := bytes.Repeat([]byte("x"), 3*ArtifactChunkSize+5)
	if _, err := b.nc.Request(artifactChunkSubject("predictable-token", 2), []byte("theirs"), 5*time.Second); err != nil {
		t.Fatal(err)
	}
	_, err = b.PutArtifact(ctx, "s1/input/big.bin", "big.bin", bytes.NewReader(big))
	if !errors.Is(err, ErrArtifactExists) || !strings.Contains(err.Error(), artifactChunkSubject("predictable-token", 2)) {
		t.Fatalf("put over a taken chunk subject = %v, want ErrArtifactExists naming the chunk", err)
	}
	ref := schemas.ArtifactRef{Name: "big.bin", Object: "s1/input/big.bin~predictable-token", Digest: schemas.Digest(big), Size: int64(len(big))}
	if err := b.GetArtifact(ctx, ref, &bytes.Buffer{}); !errors.Is(err, ErrNotFound) {
		t.Errorf("the failed put left a readable artifact: %v", err)
	}

	// Writing the same message again (a retry after a lost ack) is not an
	// error; other bytes on the same subject are.
	m := chunkMsg("another-token", 0, []byte("chunk"))
	if err := b.putArtifactMsg(ctx, m); err != nil {
		t.Fatal(err)
	}
	if err := b.putArtifactMsg(ctx, chunkMsg("another-token", 0, []byte("chunk"))); err != nil {
		t.Errorf("repeating a write that landed = %v, want nil", err)
	}
	if err := b.putArtifactMsg(ctx, chunkMsg("another-token", 0, []byte("other"))); !errors.Is(err, ErrArtifactExists) {
		t.Errorf("another write to the subject = %v, want ErrArtifactExists", err)
	}
	cp := chunkPut{b: b, start: time.Now()}
	if err := cp.publish(ctx, chunkMsg("another-token", 0, []byte("chunk"))); err != nil {
		t.Fatal(err)
	}
	if err := cp.wait(ctx, 0); err != nil {
		t.Errorf("repeating an asynchronous write that landed = %v, want nil", err)
	}
	if err := cp.publish(ctx, chunkMsg("another-token", 0, []byte("other"))); err != nil {
		t.Fatal(err)
	}
	if err := cp.wait(ctx, 0); !errors.Is(err, ErrArtifactExists) {
		t.Errorf("another asynchronous write to the subject = %v, want ErrArtifactExists", err)
	}
}

func TestSubjectTaken(t *testing.T) {
	t.Parallel()
	tests := []struct {
		code int
		desc string
		want bool
	}{
		{codeStoreFailed, "maximum messages per subject exceeded", true},
		{codeWrongLastSeq, "wrong last sequence: 7", true},
		{codeStoreFailed, "maximum bytes exceeded", false},
		{10077, "insufficient resources", false},
		{10111, "rollup not permitted", false},
	}
	for _, tt := range tests {
		if got := subjectTaken(tt.code, tt.desc); got != tt.want {
			t.Errorf("subjectTaken(%d, %q) = %v, want %v", tt.code, tt.desc, got, tt.want)
		}
	}
}
