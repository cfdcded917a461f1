package serve_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/internal/testnats"
	"github.com/loopbus/loopbus/metrics"
	"github.com/loopbus/loopbus/serve"
	"github.com/oklog/run"
)

func TestBuildNamesEveryService(t *testing.T) {
	b, _ := testnats.Bus(t)
	for _, tt := range []struct {
		name string
		set  serve.Services
		want []string
	}{
		{"none", serve.Services{}, nil},
		{"all", serve.All(2), []string{"orchestrator", "validator", "projector", "agentworker"}},
		{"projector rebuilding", serve.Services{Projector: true, RebuildViews: true}, []string{"projector"}},
		{"worker only", serve.Services{Workers: 1}, []string{"agentworker"}},
		{"with metrics", serve.Services{Validator: true, Metrics: metrics.Config{Listen: "127.0.0.1:0"}}, []string{"validator", "metrics"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.set.Build(b, testnats.Logger(t), time.Now)
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, s := range got {
				names = append(names, s.Name)
			}
			if !slices.Equal(names, tt.want) {
				t.Errorf("services %v, want %v", names, tt.want)
			}
		})
	}
	if _, err := (serve.Services{Workers: -1}).Build(b, testnats.Logger(t), time.Now); err == nil {
		t.Error("negative workers accepted")
	}
	if _, err := (serve.Services{Metrics: metrics.Config{Listen: "no-port"}}).Build(b, testnats.Logger(t), time.Now); !errors.Is(err, metrics.ErrInvalidConfig) {
		t.Errorf("metrics address without a port: %v", err)
	}
}

func TestAddStopsWithItsContext(t *testing.T) {
	b, _ := testnats.Bus(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var g run.Group
	if err := serve.All(1).Add(&g, ctx, b, testnats.Logger(t), time.Now); err != nil {
		t.Fatal(err)
	}
	stopped := make(chan struct{})
	g.Add(func() error { cancel(); <-stopped; return nil }, func(error) { close(stopped) })
	done := make(chan error, 1)
	go func() { done <- g.Run() }()
	select {
	case err := <-done:
		if err != nil && !errors.Is(err, context.Canceled) {
			t.Fatalf("group: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("services did not stop with their context")
	}
}

func TestStartAndClose(t *testing.T) {
	ctx := context.Background()
	if _, err := serve.Start(ctx, serve.Config{}, testnats.Logger(t)); err == nil || !strings.Contains(err.Error(), "data directory") {
		t.Fatalf("no data directory: err %v", err)
	}
	n, err := serve.Start(ctx, serve.Config{Embedded: bus.EmbeddedConfig{DataDir: t.TempDir()}}, testnats.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(n.URL(), "nats://127.0.0.1:") {
		t.Errorf("URL %q", n.URL())
	}
	b := testnats.Connect(t, n.URL(), "test")
	if _, err := b.LastSeq(ctx); err != nil {
		t.Fatalf("the node's stream: %v", err)
	}
	b.Close()
	if err := n.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	if err := n.Close(); err != nil {
		t.Fatalf("second close: %v", err)
	}
}

// TestCloseAlone: a command alone on its data directory stops the server
// without waiting for anyone or saying it does (its own connection, in
// process, is gone once the server has seen it close).
func TestCloseAlone(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	emb := bus.EmbeddedConfig{DataDir: t.TempDir()}
	for i := range 5 {
		c, err := serve.Open(ctx, bus.Config{Name: "alone"}, emb, "test/alone", testnats.Logger(t))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Bus.LastSeq(ctx); err != nil {
			t.Fatal(err)
		}
		c.Close(ctx, func() { t.Errorf("round %d: Close waited for other commands, with none running", i) })
	}
}

func TestOpenSharesTheDataDirectoryServer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	emb := bus.EmbeddedConfig{DataDir: t.TempDir()}
	first, err := serve.Open(ctx, bus.Config{Name: "first"}, emb, "test/first", testnats.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	if !first.OwnsServer() {
		t.Fatal("the first Open on a data directory did not start its server")
	}
	second, err := serve.Open(ctx, bus.Config{Name: "second"}, emb, "test/second", testnats.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	if second.OwnsServer() {
		t.Fatal("the second Open started another server on the same data directory")
	}
	// The owner reaches its own server through memory, the other command
	// through the server's socket.
	if got := first.Bus.Conn().ConnectedAddr(); got != "pipe" {
		t.Errorf("the owner is connected to %q, want its server in process", got)
	}
	if got := second.Bus.Conn().ConnectedAddr(); !strings.HasPrefix(got, "127.0.0.1:") {
		t.Errorf("the other command is connected to %q, want the server's socket", got)
	}
	// The owner waits for the other command before it stops the server.
	waiting := make(chan struct{})
	closed := make(chan struct{})
	go func() {
		first.Close(ctx, func() { close(waiting) })
		close(closed)
	}()
	select {
	case <-waiting:
	case <-closed:
		t.Fatal("the owner stopped its server while another command used it")
	}
	if _, err := second.Bus.LastSeq(ctx); err != nil {
		t.Fatalf("the other command lost its server: %v", err)
	}
	second.Close(ctx, nil)
	select {
	case <-closed:
	case <-ctx.Done():
		t.Fatal("the owner kept serving after the other command left")
	}
}

func TestRunEndsWithItsFunction(t *testing.T) {
	b, _ := testnats.Bus(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	errDone := errors.New("done")
	ran := false
	err := serve.All(1).Run(ctx, b, testnats.Logger(t), func(ctx context.Context) error {
		ran = true
		_, err := b.LastSeq(ctx)
		if err != nil {
			return err
		}
		return errDone
	})
	if !ran || !errors.Is(err, errDone) {
		t.Fatalf("Run = %v (fn ran %v), want fn's error", err, ran)
	}
	// Without fn it runs until ctx ends.
	short, stop := context.WithCancel(ctx)
	stop()
	if err := (serve.Services{Projector: true}).Run(short, b, testnats.Logger(t), nil); err != nil {
		t.Fatalf("Run after ctx ended: %v", err)
	}
}
