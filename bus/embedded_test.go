package bus_test

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/internal/testnats"
	"github.com/loopbus/loopbus/schemas"
	"github.com/nats-io/nats.go"
)

// startEmbedded starts a server on dir; its Shutdown runs at cleanup (and
// may also be called earlier through the returned function, once).
func startEmbedded(t *testing.T, cfg bus.EmbeddedConfig) (*bus.Embedded, func()) {
	t.Helper()
	srv, err := bus.StartEmbedded(cfg, testnats.Logger(t))
	if err != nil {
		t.Fatalf("StartEmbedded: %v", err)
	}
	shutdown := sync.OnceFunc(srv.Shutdown)
	t.Cleanup(shutdown)
	return srv, shutdown
}

func TestEmbeddedConfigValidate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		cfg     bus.EmbeddedConfig
		wantErr bool
	}{
		{name: "data dir only", cfg: bus.EmbeddedConfig{DataDir: "/tmp/x"}},
		{name: "no data dir", cfg: bus.EmbeddedConfig{}, wantErr: true},
		{name: "listen host:port", cfg: bus.EmbeddedConfig{DataDir: "/tmp/x", Listen: "127.0.0.1:4222"}},
		{name: "listen :port", cfg: bus.EmbeddedConfig{DataDir: "/tmp/x", Listen: ":4222"}},
		{name: "listen without port", cfg: bus.EmbeddedConfig{DataDir: "/tmp/x", Listen: "127.0.0.1"}, wantErr: true},
		{name: "listen garbage", cfg: bus.EmbeddedConfig{DataDir: "/tmp/x", Listen: "a:b:c"}, wantErr: true},
		{name: "cluster node", cfg: bus.EmbeddedConfig{DataDir: "/tmp/x", ClusterListen: "127.0.0.1:6222", ClusterName: "c", Routes: []string{"nats://127.0.0.1:6222", "nats://127.0.0.1:6223"}}},
		{name: "cluster listen without routes", cfg: bus.EmbeddedConfig{DataDir: "/tmp/x", ClusterListen: "127.0.0.1:6222"}},
		{name: "cluster listen random port", cfg: bus.EmbeddedConfig{DataDir: "/tmp/x", ClusterListen: "127.0.0.1:0"}, wantErr: true},
		{name: "cluster listen without port", cfg: bus.EmbeddedConfig{DataDir: "/tmp/x", ClusterListen: "127.0.0.1"}, wantErr: true},
		{name: "routes without cluster listen", cfg: bus.EmbeddedConfig{DataDir: "/tmp/x", Routes: []string{"nats://127.0.0.1:6223"}}, wantErr: true},
		{name: "cluster name without cluster listen", cfg: bus.EmbeddedConfig{DataDir: "/tmp/x", ClusterName: "c"}, wantErr: true},
		{name: "routes with a config file", cfg: bus.EmbeddedConfig{DataDir: "/tmp/x", ConfigFile: "nats.conf", Routes: []string{"nats://127.0.0.1:6223"}}},
		{name: "route without scheme", cfg: bus.EmbeddedConfig{DataDir: "/tmp/x", ClusterListen: "127.0.0.1:6222", Routes: []string{"127.0.0.1:6223"}}, wantErr: true},
		{name: "route without port", cfg: bus.EmbeddedConfig{DataDir: "/tmp/x", ClusterListen: "127.0.0.1:6222", Routes: []string{"nats://127.0.0.1"}}, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			if (err != nil) != tt.wantErr {
				t.Fatalf("Validate() = %v, wantErr %v", err, tt.wantErr)
			}
			if err != nil && !errors.Is(err, bus.ErrConfig) {
				t.Errorf("error %v does not wrap ErrConfig", err)
			}
		})
	}
}

func TestStartEmbeddedTwiceOnOneDataDir(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	srv, _ := startEmbedded(t, bus.EmbeddedConfig{DataDir: dir})

	second, err := bus.StartEmbedded(bus.EmbeddedConfig{DataDir: dir}, testnats.Logger(t))
	if err == nil {
		second.Shutdown()
		t.Fatal("a second server started on a served data directory")
	}
	if !errors.Is(err, bus.ErrServerRunning) {
		t.Fatalf("second StartEmbedded = %v, want ErrServerRunning", err)
	}
	if !strings.Contains(err.Error(), srv.URL()) {
		t.Errorf("error %q does not name the running server's URL %s", err, srv.URL())
	}
	raw, err := os.ReadFile(filepath.Join(dir, "nats.url"))
	if err != nil || strings.TrimSpace(string(raw)) != srv.URL() {
		t.Errorf("nats.url = %q, %v; want %s", raw, err, srv.URL())
	}
}

func TestStartEmbeddedBadPortReleasesLock(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	_, err := bus.StartEmbedded(bus.EmbeddedConfig{DataDir: dir, Listen: "127.0.0.1:http-alt"}, testnats.Logger(t))
	if !errors.Is(err, bus.ErrConfig) {
		t.Fatalf("StartEmbedded with a named port = %v, want ErrConfig", err)
	}
	// The failed start must not keep the directory locked.
	startEmbedded(t, bus.EmbeddedConfig{DataDir: dir})
}

func TestOpenDataDir(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ctx := ctxT(t)
	cfg := bus.EmbeddedConfig{DataDir: dir}

	url, first, err := bus.OpenDataDir(ctx, cfg, testnats.Logger(t))
	if err != nil || first == nil {
		t.Fatalf("OpenDataDir on a fresh dir = %q, %v, %v; want a new server", url, first, err)
	}
	shutdownFirst := sync.OnceFunc(first.Shutdown)
	t.Cleanup(shutdownFirst)
	if url != first.URL() {
		t.Errorf("URL %q, server URL %q", url, first.URL())
	}

	b := testnats.Connect(t, url, "test/first")
	seq := publish(t, b, jobStarted("s1", "kept"))

	// A second opener shares the running server.
	url2, second, err := bus.OpenDataDir(ctx, cfg, testnats.Logger(t))
	if err != nil {
		t.Fatalf("second OpenDataDir: %v", err)
	}
	if second != nil {
		second.Shutdown()
		t.Fatal("second OpenDataDir started its own server")
	}
	if url2 != first.URL() {
		t.Errorf("second OpenDataDir URL %q, want %q", url2, first.URL())
	}

	b.Close()
	shutdownFirst()
	if _, err := os.Stat(filepath.Join(dir, "nats.url")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("nats.url after Shutdown: %v, want removed", err)
	}

	// With the owner gone, OpenDataDir starts a new server on the same
	// store: the events survived.
	url3, third, err := bus.OpenDataDir(ctx, cfg, testnats.Logger(t))
	if err != nil || third == nil {
		t.Fatalf("OpenDataDir after shutdown = %q, %v, %v; want a new server", url3, third, err)
	}
	t.Cleanup(third.Shutdown)
	b3 := testnats.Connect(t, url3, "test/third")
	ev, err := b3.GetEvent(ctx, seq)
	if err != nil || ev.ID != "kept" {
		t.Fatalf("event %d after restart = %q, %v; want kept", seq, ev.ID, err)
	}
	if n := msgCount(t, b3); n != 1 {
		t.Errorf("stream holds %d events after restart, want 1", n)
	}
}

// Shutdown must not remove the URL file of a later server on the same
// directory when it is called twice (for example by a deferred cleanup).
func TestEmbeddedShutdownTwiceKeepsSuccessorURL(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	first, err := bus.StartEmbedded(bus.EmbeddedConfig{DataDir: dir}, testnats.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	first.Shutdown()
	second, _ := startEmbedded(t, bus.EmbeddedConfig{DataDir: dir})
	first.Shutdown() // again
	raw, err := os.ReadFile(filepath.Join(dir, "nats.url"))
	if err != nil || strings.TrimSpace(string(raw)) != second.URL() {
		t.Errorf("after a repeated Shutdown of the old server nats.url = %q, %v; want %s", raw, err, second.URL())
	}
}

func TestEmbeddedSync(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name             string
		cfg              bus.EmbeddedConfig
		wantSyncAlways   bool
		wantSyncInterval time.Duration
	}{
		{name: "default fsyncs every write", cfg: bus.EmbeddedConfig{}, wantSyncAlways: true},
		{name: "relaxed", cfg: bus.EmbeddedConfig{RelaxedSync: true, SyncInterval: 5 * time.Second}, wantSyncAlways: false, wantSyncInterval: 5 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg := tt.cfg
			cfg.DataDir = t.TempDir()
			srv, _ := startEmbedded(t, cfg)
			jsc := srv.Server().JetStreamConfig()
			if jsc == nil {
				t.Fatal("JetStream is not enabled")
			}
			if jsc.SyncAlways != tt.wantSyncAlways {
				t.Errorf("SyncAlways = %v, want %v", jsc.SyncAlways, tt.wantSyncAlways)
			}
			if tt.wantSyncInterval != 0 && jsc.SyncInterval != tt.wantSyncInterval {
				t.Errorf("SyncInterval = %v, want %v", jsc.SyncInterval, tt.wantSyncInterval)
			}
			if want := filepath.Join(cfg.DataDir, "jetstream"); !strings.HasPrefix(jsc.StoreDir, want) {
				t.Errorf("StoreDir = %q, want it under %q", jsc.StoreDir, want)
			}
			b := testnats.Connect(t, srv.URL(), "test/sync")
			if got := b.Conn().MaxPayload(); got != 8<<20 {
				t.Errorf("max payload %d, want 8 MiB", got)
			}
			publish(t, b, jobStarted("s1", "e1"))
		})
	}
}

func TestEmbeddedListenAndName(t *testing.T) {
	t.Parallel()
	srv, _ := startEmbedded(t, bus.EmbeddedConfig{DataDir: t.TempDir(), Listen: "127.0.0.1:0", ServerName: "loopbus-test", MaxPayload: 2 << 20})
	if !strings.HasPrefix(srv.URL(), "nats://127.0.0.1:") {
		t.Errorf("URL %q, want a 127.0.0.1 URL", srv.URL())
	}
	if got := srv.Server().Name(); got != "loopbus-test" {
		t.Errorf("server name %q, want loopbus-test", got)
	}
	b := testnats.Connect(t, srv.URL(), "test/listen")
	if got := b.Conn().MaxPayload(); got != 2<<20 {
		t.Errorf("max payload %d, want 2 MiB", got)
	}
}

func TestStartEmbeddedBusyPort(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	dir := t.TempDir()
	type result struct {
		srv *bus.Embedded
		err error
	}
	done := make(chan result, 1)
	log := testnats.Logger(t)
	go func() {
		srv, err := bus.StartEmbedded(bus.EmbeddedConfig{DataDir: dir, Listen: l.Addr().String()}, log)
		done <- result{srv, err}
	}()
	var r result
	select {
	case r = <-done:
	case <-time.After(hangGuard):
		// The server's own readiness wait is 30s: reporting the busy port
		// must not depend on it.
		t.Fatalf("StartEmbedded on a busy port did not return within %v", hangGuard)
	}
	if r.err == nil {
		r.srv.Shutdown()
		t.Fatalf("StartEmbedded on busy %s succeeded", l.Addr())
	}
	if !strings.Contains(r.err.Error(), "cannot listen") {
		t.Errorf("StartEmbedded on a busy port = %v, want it to say it cannot listen", r.err)
	}
	// The failed start must not keep the directory locked.
	startEmbedded(t, bus.EmbeddedConfig{DataDir: dir})
}

// TestInProcessConnection: with Config.InProcess the bus reaches the
// server in this process through memory, never its URL (here one nothing
// listens on), with the server's authentication all the same.
func TestInProcessConnection(t *testing.T) {
	t.Parallel()
	srv, _ := startEmbedded(t, bus.EmbeddedConfig{DataDir: t.TempDir(), Token: "s3cret-token"})
	cat, err := schemas.NewCatalogue()
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t)
	// Refused, it fails at once, as over the socket (no ConnectTimeout:
	// only the refusal can end Connect).
	cfg := bus.Config{URL: "nats://127.0.0.1:1", InProcess: srv.InProcess(), Name: "inproc"}
	if b, err := bus.Connect(ctx, cfg, "test/inproc", cat, testnats.Logger(t)); err == nil {
		b.Close()
		t.Fatal("an in-process connection without the token was accepted")
	} else if !errors.Is(err, nats.ErrAuthorization) {
		t.Fatalf("refused in process: %v, want the server's refusal", err)
	}
	cfg.Token = "s3cret-token"
	b, err := bus.Connect(ctx, cfg, "test/inproc", cat, testnats.Logger(t))
	if err != nil {
		t.Fatalf("Connect in process: %v", err)
	}
	defer b.Close()
	if got := b.Conn().ConnectedAddr(); got != "pipe" {
		t.Errorf("connected to %q, want the in-process pipe", got)
	}
	p, err := b.Publish(ctx, jobStarted("s1", "e1"))
	if err != nil {
		t.Fatalf("Publish: %v", err)
	}
	ev, err := b.GetEvent(ctx, p.Seq)
	if err != nil || ev.ID != "e1" {
		t.Fatalf("GetEvent(%d) = %s, %v; want e1", p.Seq, ev.ID, err)
	}
}
