//go:build cluster

package bus_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/internal/testnats"
	"github.com/loopbus/loopbus/schemas"
	"github.com/nats-io/nats.go/jetstream"
)

// TestClusterReadsOnLaggingReplica: a node whose JetStream store is full takes
// no more writes but stays a follower of every stream, answering direct
// gets and hosting consumers from the history it holds. Through a bus
// connected only to that node, everything written after it filled up is
// read all the same: artifacts (in one message and in chunks), a view,
// an event by sequence, a session's last sequence and its events (read to
// the end, and followed until caught up), every time.
func TestClusterReadsOnLaggingReplica(t *testing.T) {
	t.Parallel()
	c, w := testnats.LaggingCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// Written through the quorum, after the third node's store filled up.
	var seqs []uint64
	for i := range 4 {
		seqs = append(seqs, publish(t, w, jobStarted("late", fmt.Sprintf("late-%d", i))))
	}
	small, err := w.PutArtifact(ctx, "late/in", "in.txt", strings.NewReader("written after the store filled up"))
	if err != nil {
		t.Fatal(err)
	}
	payload := randomBytes(t, 2*bus.ArtifactChunkSize+100)
	big, err := w.PutArtifact(ctx, "late/big", "big.bin", bytes.NewReader(payload))
	if err != nil {
		t.Fatal(err)
	}
	if err := w.PutView(ctx, "manifest.late", map[string]uint64{"lastSeq": seqs[3]}); err != nil {
		t.Fatal(err)
	}
	// The lagging node holds none of it: it stopped at the filler.
	if held := c.LastSeq(t, 2, bus.DefaultStream); held >= seqs[0] {
		t.Fatalf("the lagging node holds event %d (the first written after it filled up is %d): it does not lag", held, seqs[0])
	}
	if held, all := c.LastSeq(t, 2, bus.DefaultArtifactsBucket), c.LastSeq(t, 0, bus.DefaultArtifactsBucket); held >= all {
		t.Fatalf("the lagging node holds artifact message %d of %d: it does not lag", held, all)
	}
	if held := c.LastSeq(t, 2, "KV_"+bus.DefaultViewsBucket); held != 0 {
		t.Fatalf("the lagging node holds view message %d: it does not lag", held)
	}
	if !c.AnswersDirect(2, bus.DefaultArtifactsBucket) || !c.AnswersDirect(2, "KV_"+bus.DefaultViewsBucket) {
		t.Fatal("the lagging node no longer answers direct gets: the test would test nothing")
	}

	r := testnats.ConnectConfig(t, bus.Config{URL: c.URLs[2], Name: "on-lagging"}, "test/on-lagging", testnats.Logger(t))
	// A plain direct get through this connection does miss at times: the
	// lagging node is one of those that answer.
	arts, err := r.JetStream().Stream(ctx, bus.DefaultArtifactsBucket)
	if err != nil {
		t.Fatal(err)
	}
	misses := 0
	for range 60 {
		if _, err := arts.GetLastMsgForSubject(ctx, bus.ArtifactMetaSubject(small.Object)); errors.Is(err, jetstream.ErrMsgNotFound) {
			misses++
		} else if err != nil {
			t.Fatal(err)
		}
	}
	if misses == 0 {
		t.Fatal("no direct get answered by the lagging node in 60: the test would test nothing")
	}
	t.Logf("%d of 60 direct gets answered by the lagging node", misses)

	// About one direct get in three is answered by the lagging node: each
	// kind of read is repeated until missing it every time would be a
	// matter of luck.
	start := time.Now()
	for i := range 150 {
		var buf bytes.Buffer
		if err := r.GetArtifact(ctx, small, &buf); err != nil || buf.String() != "written after the store filled up" {
			t.Fatalf("read %d of the small artifact: %q, %v", i, buf.String(), err)
		}
		var v map[string]uint64
		if err := r.GetView(ctx, "manifest.late", &v); err != nil || v["lastSeq"] != seqs[3] {
			t.Fatalf("read %d of the view: %v, %v", i, v, err)
		}
	}
	for i := range 20 {
		var buf bytes.Buffer
		if err := r.GetArtifact(ctx, big, &buf); err != nil || !bytes.Equal(buf.Bytes(), payload) {
			t.Fatalf("read %d of the chunked artifact: %d bytes, %v", i, buf.Len(), err)
		}
	}
	var v map[string]uint64
	if err := r.GetViewFromLeader(ctx, "manifest.late", &v); err != nil || v["lastSeq"] != seqs[3] {
		t.Fatalf("the view from the leader: %v, %v", v, err)
	}
	if err := r.GetView(ctx, "manifest.never", &v); !errors.Is(err, bus.ErrNotFound) {
		t.Errorf("a view never written: %v, want ErrNotFound", err)
	}
	missing := small
	missing.Object = "late/none~" + strings.Repeat("x", 22)
	if err := r.GetArtifact(ctx, missing, &bytes.Buffer{}); !errors.Is(err, bus.ErrNotFound) {
		t.Errorf("an artifact never written: %v, want ErrNotFound", err)
	}
	t.Logf("150 reads of the small artifact and the view, 20 of the chunked one in %v", time.Since(start))

	if last, err := r.SessionLastSeq(ctx, "late"); err != nil || last != seqs[3] {
		t.Errorf("SessionLastSeq = %d, %v; want %d", last, err, seqs[3])
	}
	if ev, err := r.GetEvent(ctx, seqs[2]); err != nil || ev.ID != "late-2" {
		t.Errorf("GetEvent(%d) = %q, %v", seqs[2], ev.ID, err)
	}
	// Each read's consumer lands on any of the three nodes.
	start = time.Now()
	for i := range 12 {
		var got []uint64
		if err := r.Read(ctx, bus.ReadOptions{Subjects: []string{schemas.SessionSubjects("late")}}, func(ev schemas.Event) error {
			got = append(got, ev.Seq)
			return nil
		}); err != nil {
			t.Fatalf("read %d: %v", i, err)
		}
		if !slices.Equal(got, seqs) {
			t.Fatalf("read %d of the session's events: %v, want %v", i, got, seqs)
		}
	}
	t.Logf("12 reads of the session in %v", time.Since(start))
	for i := range 6 {
		fctx, fcancel := context.WithCancel(ctx)
		var got, atCaughtUp []uint64
		err := r.Read(fctx, bus.ReadOptions{Subjects: []string{schemas.SessionSubjects("late")}, Follow: true, OnCaughtUp: func() {
			atCaughtUp = slices.Clone(got)
			fcancel()
		}}, func(ev schemas.Event) error {
			got = append(got, ev.Seq)
			return nil
		})
		fcancel()
		if err != nil || !slices.Equal(atCaughtUp, seqs) {
			t.Fatalf("follow %d: caught up with %v, %v; want %v", i, atCaughtUp, err, seqs)
		}
	}
}
