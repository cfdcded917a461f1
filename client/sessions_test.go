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
	"github.com/loopbus/loopbus/serve"
)

// rig is loopbus in this process with a Client on it.
func rig(t *testing.T) (context.Context, *client.Client) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	node, err := serve.Start(ctx, serve.Config{Embedded: bus.EmbeddedConfig{DataDir: t.TempDir()}, Services: serve.All(2)}, testnats.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := node.Close(); err != nil {
			t.Errorf("node: %v", err)
		}
	})
	c, err := client.Dial(ctx, bus.Config{URL: node.URL()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return ctx, c
}

// runSession submits a pipeline file over the input and follows it to its
// end.
func runSession(t *testing.T, ctx context.Context, c *client.Client, pipeline, input, session string) *projections.Manifest {
	t.Helper()
	p, err := definition.Load(pipeline)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Submit(ctx, p, input, client.SubmitOptions{Session: session}); err != nil {
		t.Fatal(err)
	}
	m, err := c.Follow(ctx, session, nil)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestSessionsListsAndFilters(t *testing.T) {
	ctx, c := rig(t)
	dir := t.TempDir()
	failing := filepath.Join(dir, "failing.yaml")
	if err := os.WriteFile(failing, []byte(`name: failing
steps:
  only:
    agent: {backend: exec, command: [sh, -c, "exit 0"]}
    prompt: write nothing
    outputs: [{name: out.txt}]
`), 0o644); err != nil {
		t.Fatal(err)
	}
	const kit, article = "../examples/writing-kit/pipeline.yaml", "../examples/writing-kit/article.md"
	if m := runSession(t, ctx, c, kit, article, "kit-a"); m.Status != projections.StatusCompleted {
		t.Fatalf("kit-a: %s %s", m.Status, m.Error)
	}
	if m := runSession(t, ctx, c, failing, article, "fail-b"); m.Status != projections.StatusFailed {
		t.Fatalf("fail-b: %s", m.Status)
	}
	if m := runSession(t, ctx, c, kit, article, "kit-c"); m.Status != projections.StatusCompleted {
		t.Fatalf("kit-c: %s %s", m.Status, m.Error)
	}

	ids := func(f client.SessionFilter) []string {
		t.Helper()
		list, err := c.Sessions(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, s := range list {
			out = append(out, s.ID)
		}
		return out
	}
	for _, tt := range []struct {
		name string
		f    client.SessionFilter
		want []string
	}{
		{"all, newest first", client.SessionFilter{}, []string{"kit-c", "fail-b", "kit-a"}},
		{"completed", client.SessionFilter{Status: []string{"completed"}}, []string{"kit-c", "kit-a"}},
		{"failed or running", client.SessionFilter{Status: []string{"failed", "running"}}, []string{"fail-b"}},
		{"pipeline", client.SessionFilter{Pipeline: "failing"}, []string{"fail-b"}},
		{"limit", client.SessionFilter{Limit: 2}, []string{"kit-c", "fail-b"}},
		{"recent", client.SessionFilter{MaxAge: time.Hour}, []string{"kit-c", "fail-b", "kit-a"}},
	} {
		if got := ids(tt.f); !slices.Equal(got, tt.want) {
			t.Errorf("%s: got %v, want %v", tt.name, got, tt.want)
		}
	}
	list, err := c.Sessions(ctx, client.SessionFilter{Pipeline: "writing-kit", Limit: 1})
	if err != nil {
		t.Fatal(err)
	}
	if s := list[0]; s.Steps != 3 || s.StepsDone != 3 || s.Status != "completed" || s.Started.IsZero() {
		t.Errorf("summary %+v, want 3/3 steps completed with a start time", s)
	}
	failed, err := c.Sessions(ctx, client.SessionFilter{Status: []string{"failed"}})
	if err != nil || len(failed) != 1 || failed[0].Error == "" || failed[0].StepsDone != 0 {
		t.Errorf("failed listing %+v, %v: want fail-b with its reason", failed, err)
	}
	if _, err := c.Sessions(ctx, client.SessionFilter{Status: []string{"done"}}); !errors.Is(err, client.ErrBadInput) {
		t.Errorf("unknown status: err %v, want ErrBadInput", err)
	}
}

func TestClientUnknownSessionAndFinal(t *testing.T) {
	ctx, c := rig(t)
	for name, call := range map[string]func() error{
		"follow": func() error { _, err := c.Follow(ctx, "nope", nil); return err },
		"events": func() error { _, err := c.Events(ctx, "nope", client.Until{}); return err },
		"replay": func() error { _, err := c.Replay(ctx, "nope", client.Until{}); return err },
		"status": func() error { _, err := c.Status(ctx, "nope"); return err },
	} {
		if err := call(); !errors.Is(err, client.ErrNoSession) {
			t.Errorf("%s of an unknown session: err %v, want ErrNoSession", name, err)
		}
	}
	if _, err := c.Follow(ctx, "../x", nil); !errors.Is(err, client.ErrBadInput) {
		t.Errorf("unsafe id: err %v, want ErrBadInput", err)
	}

	m := runSession(t, ctx, c, "../examples/writing-kit/pipeline.yaml", "../examples/writing-kit/article.md", "kit-final")
	out := filepath.Join(t.TempDir(), "new", "out")
	paths, err := c.WriteFinal(ctx, m, out)
	if err != nil {
		t.Fatal(err)
	}
	if len(paths) != 1 || filepath.Base(paths[0]) != "writing-kit.json" {
		t.Fatalf("paths %v, want writing-kit.json", paths)
	}
	fi, err := os.Stat(paths[0])
	if err != nil || fi.Size() != m.Final[0].Size {
		t.Fatalf("written %v, %v; want %d bytes", fi, err, m.Final[0].Size)
	}
	m.Status = projections.StatusFailed
	if _, err := c.WriteFinal(ctx, m, out); !errors.Is(err, client.ErrBadInput) {
		t.Errorf("final of a failed session: err %v, want ErrBadInput", err)
	}
}

func TestClientSignalExportTasks(t *testing.T) {
	ctx, c := rig(t)
	m := runSession(t, ctx, c, "../examples/writing-kit/pipeline.yaml", "../examples/writing-kit/article.md", "kit-sig")
	if m.Status != projections.StatusCompleted {
		t.Fatalf("session %s", m.Status)
	}
	target, err := client.ParseSignalTarget("kit-sig/summary")
	if err != nil {
		t.Fatal(err)
	}
	// The orchestrator answers; a finished session ignores the pause.
	sent, acks, err := c.Signal(ctx, client.SignalRequest{Verb: "pause", Target: target, Reason: "look"}, time.Minute)
	if err != nil || len(sent) != 1 {
		t.Fatalf("signal: %v, %d sent", err, len(sent))
	}
	a := acks[sent[0].Event.ID]
	if a == nil || a.Result != "ignored" {
		t.Fatalf("acknowledgement %+v, want ignored", a)
	}
	if r := client.ResultOf(sent[0], "pause", a, ""); r.Session != "kit-sig" || r.Step != "summary" || r.Result != "ignored" {
		t.Errorf("result %+v", r)
	}
	if _, _, err := c.Signal(ctx, client.SignalRequest{Verb: "pause", Target: client.SignalTarget{Session: "nope"}}, 0); !errors.Is(err, client.ErrNoSession) {
		t.Errorf("signal to an unknown session: %v", err)
	}

	dir := t.TempDir()
	if _, err := c.Export(ctx, "kit-sig", dir); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "artifacts", "writing-kit.json")); err != nil {
		t.Errorf("export: %v", err)
	}
	if _, err := c.Tasks(ctx, "kit-sig"); !errors.Is(err, client.ErrNotBacklog) {
		t.Errorf("tasks of a pipeline session: %v, want ErrNotBacklog", err)
	}
	if c.Bus() == nil {
		t.Error("no bus")
	}
}
