package dashboard_test

import (
	"context"
	"errors"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/client"
	"github.com/loopbus/loopbus/dashboard"
	"github.com/loopbus/loopbus/definition"
	"github.com/loopbus/loopbus/internal/testnats"
	"github.com/loopbus/loopbus/projections"
	"github.com/loopbus/loopbus/serve"
)

// system is a bus with every service running and a dashboard served over
// it by httptest (on loopback).
type system struct {
	b   *bus.Bus
	c   *client.Client
	srv *httptest.Server
	dir string
}

func startSystem(t *testing.T, cfg dashboard.Config) *system {
	t.Helper()
	return startServices(t, cfg, serve.All(2))
}

// startServices is startSystem running the services svc.
func startServices(t *testing.T, cfg dashboard.Config, svc serve.Services) *system {
	t.Helper()
	b, _ := testnats.Bus(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- svc.Run(ctx, b, testnats.Logger(t), nil) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("services: %v", err)
		}
	})
	c := client.New(b)
	d, err := dashboard.New(cfg, c, testnats.Logger(t), time.Now)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(d.Handler())
	t.Cleanup(func() {
		// Event streams end only when their browser goes.
		srv.CloseClientConnections()
		srv.Close()
	})
	return &system{b: b, c: c, srv: srv, dir: t.TempDir()}
}

// gatedPipeline is three steps in a chain (a → b → c) whose agent waits
// for a file named after its step in the gate directory before it writes
// its output.
const gatedPipeline = `name: gated
steps:
  a:
    agent: {backend: exec, command: [sh, agent.sh]}
    prompt: write a
    outputs: [{name: a.txt}]
  b:
    requires: [a]
    agent: {backend: exec, command: [sh, agent.sh]}
    prompt: write b
    outputs: [{name: b.txt}]
  c:
    requires: [b]
    agent: {backend: exec, command: [sh, agent.sh]}
    prompt: write c
    outputs: [{name: c.txt}]
`

// submitGated submits gatedPipeline as session id; open(step) lets that
// step's agent finish.
func (s *system) submitGated(t testing.TB, id string) (open func(step string)) {
	t.Helper()
	gate := filepath.Join(s.dir, "gate-"+id)
	if err := os.MkdirAll(gate, 0o755); err != nil {
		t.Fatal(err)
	}
	s.submit(t, id, map[string]string{
		"pipeline.yaml": gatedPipeline,
		"agent.sh": "set -eu\nwhile [ ! -e '" + gate + "'/\"$LOOPBUS_STEP\" ]; do sleep 0.05; done\n" +
			"echo \"$LOOPBUS_STEP done\" > \"$LOOPBUS_OUTPUT_DIR/$LOOPBUS_STEP.txt\"\n",
	})
	return func(step string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(gate, step), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// submit writes files (a pipeline.yaml among them) into a directory of
// their own, with an input in.txt unless files has one, and submits the
// pipeline over in.txt as session id.
func (s *system) submit(t testing.TB, id string, files map[string]string) {
	t.Helper()
	dir := filepath.Join(s.dir, id)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, ok := files["in.txt"]; !ok {
		files["in.txt"] = "input\n"
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	p, err := definition.Load(filepath.Join(dir, "pipeline.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := s.c.Submit(ctx, p, filepath.Join(dir, "in.txt"), client.SubmitOptions{Session: id}); err != nil {
		t.Fatal(err)
	}
}

// waitManifest waits until the session's manifest satisfies ok.
func (s *system) waitManifest(t *testing.T, id, what string, ok func(*projections.Manifest) bool) *projections.Manifest {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		m, err := s.c.Status(ctx, id)
		cancel()
		if err == nil && ok(m) {
			return m
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s (last error %v, manifest %+v)", what, err, m)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
