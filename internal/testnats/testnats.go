// Package testnats starts a real embedded NATS server for tests: one per
// test, file-backed under t.TempDir(), shut down by t.Cleanup.
package testnats

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/schemas"
	"github.com/rs/zerolog"
)

// Server starts an embedded JetStream server and returns it.
func Server(t testing.TB) *bus.Embedded {
	t.Helper()
	srv, err := bus.StartEmbedded(bus.EmbeddedConfig{DataDir: t.TempDir()}, Logger(t))
	if err != nil {
		t.Fatalf("embedded NATS: %v", err)
	}
	t.Cleanup(srv.Shutdown)
	return srv
}

// Connect returns a provisioned Bus on url with the given CloudEvent source.
func Connect(t testing.TB, url, source string) *bus.Bus {
	t.Helper()
	cat, err := schemas.NewCatalogue()
	if err != nil {
		t.Fatalf("catalogue: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := bus.Connect(ctx, bus.Config{URL: url, Name: source}, source, cat, Logger(t))
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(b.Close)
	return b
}

// Bus starts a server and returns a Bus connected to it.
func Bus(t testing.TB) (*bus.Bus, *bus.Embedded) {
	t.Helper()
	srv := Server(t)
	return Connect(t, srv.URL(), "test/"+t.Name()), srv
}

// Logger writes warnings and errors to the test log. Lines logged by
// goroutines after the test has finished are dropped instead of panicking.
func Logger(t testing.TB) zerolog.Logger {
	w := &testWriter{t: t}
	t.Cleanup(w.stop)
	return zerolog.New(w).Level(zerolog.WarnLevel)
}

type testWriter struct {
	mu   sync.Mutex
	t    testing.TB
	done bool
}

func (w *testWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done {
		w.t.Log(strings.TrimRight(string(p), "\n"))
	}
	return len(p), nil
}

func (w *testWriter) stop() {
	w.mu.Lock()
	w.done = true
	w.mu.Unlock()
}
