package bus_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"maps"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/internal/testnats"
	"github.com/loopbus/loopbus/schemas"
)

// consumers lists the consumers of every stream, by stream.
func consumers(t *testing.T, b *bus.Bus) map[string][]string {
	t.Helper()
	ctx := ctxT(t)
	out := map[string][]string{}
	names := b.JetStream().StreamNames(ctx)
	for name := range names.Name() {
		s, err := b.JetStream().Stream(ctx, name)
		if err != nil {
			t.Fatalf("stream %s: %v", name, err)
		}
		cs := s.ConsumerNames(ctx)
		list := []string{}
		for c := range cs.Name() {
			list = append(list, c)
		}
		if err := cs.Err(); err != nil {
			t.Fatalf("consumers of %s: %v", name, err)
		}
		info, err := s.Info(ctx)
		if err != nil {
			t.Fatalf("stream %s info: %v", name, err)
		}
		if info.State.Consumers != len(list) {
			t.Fatalf("stream %s: State.Consumers %d, listed %v", name, info.State.Consumers, list)
		}
		slices.Sort(list)
		out[name] = list
	}
	if err := names.Err(); err != nil {
		t.Fatalf("streams: %v", err)
	}
	return out
}

// Every read (events of a session, following until an end, artifacts,
// views, sequences, dead letters) removes what it created on the server
// when it returns: a read command must not leave an ephemeral consumer
// behind for the server to expire minutes later.
func TestReadsLeaveNoConsumers(t *testing.T) {
	t.Parallel()
	b, _ := testnats.Bus(t)
	ctx := ctxT(t)

	// A service's durable is not a read's: it stays throughout.
	startConsume(t, b, bus.ConsumerConfig{Durable: "svc", Subjects: []string{requested}},
		func(context.Context, bus.Delivery) error { return nil })
	waitFor(t, testTimeout, "the service's durable", func() bool {
		_, err := tryConsumerInfo(t, b, "svc")
		return err == nil
	})

	var seqs []uint64
	for _, id := range []string{"a", "b", "c", "d"} {
		seqs = append(seqs, publish(t, b, jobStarted("s1", id)))
	}
	publish(t, b, jobStarted("s2", "other"))
	publishRaw(t, b, "loopbus.evt.s3.job.started", []byte("not an event"))
	payload := make([]byte, 300<<10) // three chunks
	if _, err := rand.Read(payload); err != nil {
		t.Fatal(err)
	}
	ref, err := b.PutArtifact(ctx, "s1/plan/out.bin", "out.bin", bytes.NewReader(payload))
	if err != nil {
		t.Fatal(err)
	}
	empty, err := b.PutArtifact(ctx, "s1/plan/empty.txt", "empty.txt", bytes.NewReader(nil))
	if err != nil {
		t.Fatal(err)
	}
	if err := b.PutView(ctx, "manifest.s1", map[string]int{"n": 4}); err != nil {
		t.Fatal(err)
	}

	before := consumers(t, b)
	if !slices.Equal(before[bus.DefaultStream], []string{"svc"}) {
		t.Fatalf("consumers before reading: %v, want only the durable svc on %s", before, bus.DefaultStream)
	}

	session := []string{schemas.SessionSubjects("s1")}
	read := func(name string, opts bus.ReadOptions, fn func(schemas.Event) error) []string {
		t.Helper()
		var ids []string
		err := b.Read(ctx, opts, func(ev schemas.Event) error {
			ids = append(ids, ev.ID)
			if fn != nil {
				return fn(ev)
			}
			return nil
		})
		if err != nil && !errors.Is(err, errBoom) {
			t.Fatalf("%s: %v", name, err)
		}
		return ids
	}
	if ids := read("a session's events", bus.ReadOptions{Subjects: session}, nil); !slices.Equal(ids, []string{"a", "b", "c", "d"}) {
		t.Errorf("a session's events: %v", ids)
	}
	if ids := read("every event, dead-lettering", bus.ReadOptions{DeadLetter: "reader"}, nil); len(ids) != 5 {
		t.Errorf("every event: %v", ids)
	}
	if ids := read("nothing to read", bus.ReadOptions{Subjects: []string{schemas.SessionSubjects("none")}}, nil); len(ids) != 0 {
		t.Errorf("no session: %v", ids)
	}
	if ids := read("from a sequence", bus.ReadOptions{Subjects: session, StartSeq: seqs[2]}, nil); !slices.Equal(ids, []string{"c", "d"}) {
		t.Errorf("from seq %d: %v", seqs[2], ids)
	}
	if ids := read("from a time", bus.ReadOptions{Subjects: session, StartTime: time.Now().Add(-time.Hour)}, nil); len(ids) != 4 {
		t.Errorf("from a time: %v", ids)
	}
	if ids := read("stopped by the callback", bus.ReadOptions{Subjects: session}, func(schemas.Event) error { return bus.ErrStop }); len(ids) != 1 {
		t.Errorf("stopped: %v", ids)
	}
	read("failed by the callback", bus.ReadOptions{Subjects: session}, func(schemas.Event) error { return errBoom })

	// Follow until an end event published once caught up.
	ids := read("followed until an end", bus.ReadOptions{Subjects: session, Follow: true, OnCaughtUp: func() {
		publish(t, b, jobStarted("s1", "end"))
	}}, func(ev schemas.Event) error {
		if ev.ID == "end" {
			return bus.ErrStop
		}
		return nil
	})
	if !slices.Equal(ids, []string{"a", "b", "c", "d", "end"}) {
		t.Errorf("followed: %v", ids)
	}
	// Follow until ctx ends (a watch interrupted).
	fctx, cancel := context.WithCancel(ctx)
	if err := b.Read(fctx, bus.ReadOptions{Subjects: session, Follow: true, OnCaughtUp: cancel}, func(schemas.Event) error { return nil }); err != nil {
		t.Fatalf("follow until ctx ends: %v", err)
	}
	// Follow on a subject with no events yet.
	fctx, cancel = context.WithCancel(ctx)
	if err := b.Read(fctx, bus.ReadOptions{Subjects: []string{schemas.SessionSubjects("none")}, Follow: true, OnCaughtUp: cancel}, func(schemas.Event) error { return nil }); err != nil {
		t.Fatalf("follow an empty subject: %v", err)
	}

	var buf bytes.Buffer
	if err := b.GetArtifact(ctx, ref, &buf); err != nil || !bytes.Equal(buf.Bytes(), payload) {
		t.Errorf("GetArtifact: %v (%d bytes, want %d)", err, buf.Len(), len(payload))
	}
	if err := b.GetArtifactFile(ctx, empty, filepath.Join(t.TempDir(), "empty.txt")); err != nil {
		t.Errorf("GetArtifactFile of an empty artifact: %v", err)
	}
	bad := ref
	bad.Digest = schemas.Digest([]byte("other"))
	if err := b.GetArtifact(ctx, bad, &bytes.Buffer{}); !errors.Is(err, bus.ErrDigestMismatch) {
		t.Errorf("GetArtifact with a wrong digest: %v", err)
	}
	missing := ref
	missing.Object = "s1/plan/nope.bin"
	if err := b.GetArtifact(ctx, missing, &bytes.Buffer{}); !errors.Is(err, bus.ErrNotFound) {
		t.Errorf("GetArtifact of a missing object: %v", err)
	}
	var v map[string]int
	if err := b.GetView(ctx, "manifest.s1", &v); err != nil || v["n"] != 4 {
		t.Errorf("GetView: %v %v", v, err)
	}
	if err := b.GetView(ctx, "manifest.none", &v); !errors.Is(err, bus.ErrNotFound) {
		t.Errorf("GetView of a missing key: %v", err)
	}
	if last, err := b.SessionLastSeq(ctx, "s1"); err != nil || last <= seqs[3] {
		t.Errorf("SessionLastSeq = %d, %v", last, err)
	}
	if _, err := b.LastSeq(ctx); err != nil {
		t.Errorf("LastSeq: %v", err)
	}
	if ev, err := b.GetEvent(ctx, seqs[0]); err != nil || ev.ID != "a" {
		t.Errorf("GetEvent: %+v, %v", ev, err)
	}
	letters := 0
	if err := b.DeadLetters(ctx, func(bus.DeadLetter) error { letters++; return nil }); err != nil || letters != 1 {
		t.Errorf("DeadLetters: %d letters, %v; want 1", letters, err)
	}
	stopped := 0
	if err := b.DeadLetters(ctx, func(bus.DeadLetter) error { stopped++; return bus.ErrStop }); err != nil || stopped != 1 {
		t.Errorf("DeadLetters stopped at the first: %d, %v", stopped, err)
	}

	// No waiting: every read has returned, so what it created is gone.
	if after := consumers(t, b); !maps.EqualFunc(after, before, slices.Equal) {
		t.Errorf("consumers after the reads:\n%v\nwant as before:\n%v", after, before)
	}
}

var errBoom = errors.New("boom")
