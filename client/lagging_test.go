//go:build cluster

package client_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/client"
	"github.com/loopbus/loopbus/definition"
	"github.com/loopbus/loopbus/internal/testnats"
	"github.com/loopbus/loopbus/projections"
)

// TestClusterCommandsOnLaggingReplica: sessions started after a node's JetStream
// store filled up (it takes no more writes, yet answers reads from what it
// holds) are found, listed, shown and exported, with their input, by a
// client connected only to that node, every time: no "no such session",
// no session missing from the list, no artifact not found.
func TestClusterCommandsOnLaggingReplica(t *testing.T) {
	t.Parallel()
	c, w := testnats.LaggingCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const kit, article = "../examples/writing-kit/pipeline.yaml", "../examples/writing-kit/article.md"
	p, err := definition.Load(kit)
	if err != nil {
		t.Fatal(err)
	}
	input, err := os.ReadFile(article)
	if err != nil {
		t.Fatal(err)
	}
	sessions := []string{"late-a", "late-b", "late-c"}
	now := time.Now()
	for i, s := range sessions {
		if _, err := client.Submit(ctx, w, p, article, s, now.Add(time.Duration(i)*time.Second)); err != nil {
			t.Fatalf("submit %s: %v", s, err)
		}
	}
	if held, last := c.LastSeq(t, 2, bus.DefaultStream), c.LastSeq(t, 0, bus.DefaultStream); held != 0 || last == 0 {
		t.Fatalf("the lagging node holds %d of %d events: it does not lag", held, last)
	}

	cl, err := client.Dial(ctx, bus.Config{URL: c.URLs[2]})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	newestFirst := slices.Clone(sessions)
	slices.Reverse(newestFirst)
	start := time.Now()
	for i := range 3 {
		list, err := cl.Sessions(ctx, client.SessionFilter{})
		if err != nil {
			t.Fatalf("sessions %d: %v", i, err)
		}
		var ids []string
		for _, s := range list {
			ids = append(ids, s.ID)
		}
		if !slices.Equal(ids, newestFirst) {
			t.Fatalf("sessions %d: %v, want %v", i, ids, newestFirst)
		}
		for _, s := range sessions {
			if m, err := cl.Status(ctx, s); err != nil || m.Status != projections.StatusRunning {
				t.Fatalf("status %d of %s: %v", i, s, err)
			}
			dir := t.TempDir()
			if _, err := cl.Export(ctx, s, dir); err != nil {
				t.Fatalf("export %d of %s: %v", i, s, err)
			}
			got, err := os.ReadFile(filepath.Join(dir, "artifacts", filepath.Base(article)))
			if err != nil || string(got) != string(input) {
				t.Fatalf("export %d of %s: input %d bytes, %v", i, s, len(got), err)
			}
		}
	}
	t.Logf("3 rounds of sessions, status and export of 3 sessions in %v", time.Since(start))
	if _, err := cl.Status(ctx, "never-started"); !errors.Is(err, client.ErrNoSession) {
		t.Errorf("status of a session never started: %v, want ErrNoSession", err)
	}
}
