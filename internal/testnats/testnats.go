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
	return ConnectLogged(t, url, source, Logger(t))
}

// ConnectLogged is Connect with the bus logging to log.
func ConnectLogged(t testing.TB, url, source string, log zerolog.Logger) *bus.Bus {
	t.Helper()
	return ConnectConfig(t, bus.Config{URL: url, Name: source}, source, log)
}

// ConnectConfig is Connect with a bus configuration of the caller's.
func ConnectConfig(t testing.TB, cfg bus.Config, source string, log zerolog.Logger) *bus.Bus {
	t.Helper()
	cat, err := schemas.NewCatalogue()
	if err != nil {
		t.Fatalf("catalogue: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := bus.Connect(ctx, cfg, source, cat, log)
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

// Events reads the events currently in the stream under subjects (every
// event when none is given), in stream order.
func Events(t testing.TB, b *bus.Bus, subjects ...string) []schemas.Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var evs []schemas.Event
	err := b.Read(ctx, bus.ReadOptions{Subjects: subjects}, func(ev schemas.Event) error {
		evs = append(evs, ev)
		return nil
	})
	if err != nil {
		t.Fatalf("read %v: %v", subjects, err)
	}
	return evs
}

// Run starts run(ctx) in a goroutine, the way a service runs, and returns a
// stop that cancels it and waits. Run must return nil when stopped (that is
// the services' contract); an error, or not returning within 30s, fails
// the test. stop is idempotent and also runs at cleanup.
func Run(t testing.TB, name string, run func(context.Context) error) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("%s: Run returned %v after cancel", name, err)
				}
			case <-time.After(30 * time.Second):
				t.Errorf("%s: Run did not return after cancel", name)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}
