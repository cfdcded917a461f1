// Package testnats starts a real embedded NATS server for tests: one per
// test, file-backed under t.TempDir(), shut down by t.Cleanup.
package testnats

import (
	"context"
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

// Logger writes warnings and errors to the test log.
func Logger(t testing.TB) zerolog.Logger {
	return zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel)
}
