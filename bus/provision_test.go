package bus_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/internal/testnats"
	"github.com/loopbus/loopbus/schemas"
	"github.com/nats-io/nats.go/jetstream"
)

func catalogue(t *testing.T) *schemas.Catalogue {
	t.Helper()
	cat, err := schemas.NewCatalogue()
	if err != nil {
		t.Fatalf("catalogue: %v", err)
	}
	return cat
}

func TestConnectIsIdempotent(t *testing.T) {
	t.Parallel()
	b1, srv := testnats.Bus(t)
	ctx := ctxT(t)
	publish(t, b1, jobStarted("s1", "e1"))
	publish(t, b1, jobStarted("s1", "e2"))

	b2 := testnats.Connect(t, srv.URL(), "test/second")
	if got := msgCount(t, b2); got != 2 {
		t.Fatalf("after a second Connect the stream holds %d events, want 2", got)
	}
	last, err := b2.LastSeq(ctx)
	if err != nil || last != 2 {
		t.Fatalf("LastSeq = %d, %v; want 2", last, err)
	}
	ev, err := b2.GetEvent(ctx, 1)
	if err != nil || ev.ID != "e1" {
		t.Fatalf("GetEvent(1) via second bus = %q, %v; want e1", ev.ID, err)
	}
	if b2.Source() != "test/second" || b2.StreamName() != bus.DefaultStream || b2.Catalogue() == nil || b2.Conn() == nil {
		t.Errorf("accessors: source %q stream %q", b2.Source(), b2.StreamName())
	}
}

func TestProvisionedStream(t *testing.T) {
	t.Parallel()
	b, _ := testnats.Bus(t)
	ctx := ctxT(t)
	js := b.JetStream()

	s, err := js.Stream(ctx, bus.DefaultStream)
	if err != nil {
		t.Fatalf("event stream: %v", err)
	}
	cfg := s.CachedInfo().Config
	if !cfg.DenyDelete || !cfg.DenyPurge || !cfg.AllowAtomicPublish {
		t.Errorf("DenyDelete %v DenyPurge %v AllowAtomicPublish %v; want all true", cfg.DenyDelete, cfg.DenyPurge, cfg.AllowAtomicPublish)
	}
	if cfg.Storage != jetstream.FileStorage {
		t.Errorf("storage %v, want file", cfg.Storage)
	}
	if want := []string{schemas.SubjectPrefix + ".>"}; len(cfg.Subjects) != 1 || cfg.Subjects[0] != want[0] {
		t.Errorf("subjects %v, want %v", cfg.Subjects, want)
	}
	if cfg.Duplicates != bus.DefaultDuplicateWindow {
		t.Errorf("duplicate window %v, want %v", cfg.Duplicates, bus.DefaultDuplicateWindow)
	}
	if cfg.MaxAge != 0 || cfg.MaxBytes != -1 || cfg.Replicas != 1 {
		t.Errorf("MaxAge %v MaxBytes %d Replicas %d; want unlimited, R1", cfg.MaxAge, cfg.MaxBytes, cfg.Replicas)
	}

	seq := publish(t, b, jobStarted("s1", "e1"))
	if err := s.DeleteMsg(ctx, seq); err == nil {
		t.Error("deleting an event succeeded; the stream must deny deletes")
	}
	if err := s.SecureDeleteMsg(ctx, seq); err == nil {
		t.Error("secure-deleting an event succeeded; the stream must deny deletes")
	}
	if err := s.Purge(ctx); err == nil {
		t.Error("purging the stream succeeded; the stream must deny purges")
	}
	if err := s.Purge(ctx, jetstream.WithPurgeSubject("loopbus.evt.s1.>")); err == nil {
		t.Error("purging a session succeeded; the stream must deny purges")
	}
	if got := msgCount(t, b); got != 1 {
		t.Errorf("stream holds %d events after refused delete/purge, want 1", got)
	}

	dlq, err := js.Stream(ctx, bus.DefaultDLQStream)
	if err != nil {
		t.Fatalf("DLQ stream: %v", err)
	}
	if subj := dlq.CachedInfo().Config.Subjects; len(subj) != 1 || subj[0] != bus.DLQSubjectPrefix+".>" {
		t.Errorf("DLQ subjects %v", subj)
	}
	if dlq.CachedInfo().Config.Storage != jetstream.FileStorage {
		t.Errorf("DLQ storage %v, want file", dlq.CachedInfo().Config.Storage)
	}
	kv, err := js.KeyValue(ctx, bus.DefaultViewsBucket)
	if err != nil {
		t.Fatalf("views bucket: %v", err)
	}
	if st, err := kv.Status(ctx); err != nil || st.History() != 1 {
		t.Errorf("views bucket status: %v (history %d, want 1)", err, st.History())
	}
	if _, err := js.ObjectStore(ctx, bus.DefaultArtifactsBucket); err != nil {
		t.Fatalf("artifact store: %v", err)
	}
}

func TestConnectCustomNames(t *testing.T) {
	t.Parallel()
	srv := testnats.Server(t)
	ctx := ctxT(t)
	cfg := bus.Config{
		URL: srv.URL(), Name: "custom",
		Stream: "EV", DLQStream: "EV_DLQ", ViewsBucket: "EV_VIEWS", ArtifactsBucket: "EV_ART",
		DuplicateWindow: time.Minute, MaxBytes: 1 << 30,
	}
	b, err := bus.Connect(ctx, cfg, "test/custom", catalogue(t), testnats.Logger(t))
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(b.Close)
	if b.StreamName() != "EV" {
		t.Errorf("StreamName %q, want EV", b.StreamName())
	}
	s, err := b.JetStream().Stream(ctx, "EV")
	if err != nil {
		t.Fatalf("stream EV: %v", err)
	}
	if c := s.CachedInfo().Config; c.Duplicates != time.Minute || c.MaxBytes != 1<<30 {
		t.Errorf("duplicates %v max bytes %d; want 1m, 1GiB", c.Duplicates, c.MaxBytes)
	}
	if _, err := b.JetStream().Stream(ctx, "EV_DLQ"); err != nil {
		t.Errorf("stream EV_DLQ: %v", err)
	}
	if _, err := b.JetStream().KeyValue(ctx, "EV_VIEWS"); err != nil {
		t.Errorf("bucket EV_VIEWS: %v", err)
	}
	if _, err := b.JetStream().ObjectStore(ctx, "EV_ART"); err != nil {
		t.Errorf("object store EV_ART: %v", err)
	}
	// The default names were not provisioned.
	if _, err := b.JetStream().Stream(ctx, bus.DefaultStream); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Errorf("stream %s: %v, want not found", bus.DefaultStream, err)
	}

	// Reconnecting with another window updates the existing stream.
	cfg.DuplicateWindow = 2 * time.Minute
	b2, err := bus.Connect(ctx, cfg, "test/custom2", catalogue(t), testnats.Logger(t))
	if err != nil {
		t.Fatalf("reconnect: %v", err)
	}
	t.Cleanup(b2.Close)
	info, err := s.Info(ctx)
	if err != nil || info.Config.Duplicates != 2*time.Minute {
		t.Errorf("after reconnect duplicates = %v, %v; want 2m", info.Config.Duplicates, err)
	}
}

// A MaxAge shorter than the default duplicate window is a valid Config but
// the server refuses a duplicate window longer than MaxAge.
func TestConnectShortMaxAge(t *testing.T) {
	t.Parallel()
	srv := testnats.Server(t)
	cfg := bus.Config{URL: srv.URL(), MaxAge: 5 * time.Minute}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	b, err := bus.Connect(ctxT(t), cfg, "test/maxage", catalogue(t), testnats.Logger(t))
	if err != nil {
		t.Fatalf("Connect with MaxAge 5m (valid per Validate) failed: %v", err)
	}
	t.Cleanup(b.Close)
	info, err := b.JetStream().Stream(ctxT(t), bus.DefaultStream)
	if err != nil {
		t.Fatal(err)
	}
	if c := info.CachedInfo().Config; c.MaxAge != 5*time.Minute || c.Duplicates > c.MaxAge {
		t.Errorf("MaxAge %v duplicates %v", c.MaxAge, c.Duplicates)
	}
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	const url = "nats://127.0.0.1:4222"
	tests := []struct {
		name    string
		cfg     bus.Config
		wantErr bool
	}{
		{name: "minimal", cfg: bus.Config{URL: url}},
		{name: "no URL", cfg: bus.Config{}, wantErr: true},
		{name: "replicas 1", cfg: bus.Config{URL: url, Replicas: 1}},
		{name: "replicas 3", cfg: bus.Config{URL: url, Replicas: 3}},
		{name: "replicas 5", cfg: bus.Config{URL: url, Replicas: 5}},
		{name: "replicas negative", cfg: bus.Config{URL: url, Replicas: -1}, wantErr: true},
		{name: "replicas 6", cfg: bus.Config{URL: url, Replicas: 6}, wantErr: true},
		{name: "negative max age", cfg: bus.Config{URL: url, MaxAge: -time.Second}, wantErr: true},
		{name: "negative max bytes", cfg: bus.Config{URL: url, MaxBytes: -1}, wantErr: true},
		{name: "negative duplicate window", cfg: bus.Config{URL: url, DuplicateWindow: -time.Second}, wantErr: true},
		{name: "retention set", cfg: bus.Config{URL: url, MaxAge: time.Hour, MaxBytes: 1 << 20, DuplicateWindow: time.Minute}},
		{name: "TLS cert without key", cfg: bus.Config{URL: url, TLSCert: "c.pem"}, wantErr: true},
		{name: "TLS key without cert", cfg: bus.Config{URL: url, TLSKey: "k.pem"}, wantErr: true},
		{name: "TLS cert and key", cfg: bus.Config{URL: url, TLSCert: "c.pem", TLSKey: "k.pem", TLSCA: "ca.pem"}},
		{name: "token and user", cfg: bus.Config{URL: url, Token: "t", User: "u"}, wantErr: true},
		{name: "token only", cfg: bus.Config{URL: url, Token: "t"}},
		{name: "user and password", cfg: bus.Config{URL: url, User: "u", Password: "p"}},
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

func TestConnectRefusesInvalidConfig(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		cfg  bus.Config
	}{
		{name: "no URL", cfg: bus.Config{}},
		{name: "bad replicas", cfg: bus.Config{URL: "nats://127.0.0.1:1", Replicas: 9}},
		{name: "missing nkey seed file", cfg: bus.Config{URL: "nats://127.0.0.1:1", NKeyFile: "/nonexistent/seed.nk"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			start := time.Now()
			_, err := bus.Connect(ctxT(t), tt.cfg, "test", catalogue(t), testnats.Logger(t))
			if !errors.Is(err, bus.ErrConfig) {
				t.Fatalf("Connect = %v, want ErrConfig", err)
			}
			if d := time.Since(start); d > 2*time.Second {
				t.Errorf("Connect took %v to refuse an invalid config", d)
			}
		})
	}
}

// Connect retries an unreachable server until ctx ends, and never shows the
// URL's credentials.
func TestConnectUnreachable(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		url  string
	}{
		{name: "user and password", url: "nats://alice:hunter2@127.0.0.1:1"},
		{name: "server list", url: "nats://127.0.0.1:1,nats://alice:hunter2@127.0.0.1:2"},
		// nats.go accepts URLs without a scheme and sends their credentials.
		{name: "no scheme", url: "alice:hunter2@127.0.0.1:1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
			defer cancel()
			start := time.Now()
			_, err := bus.Connect(ctx, bus.Config{URL: tt.url}, "test", catalogue(t), testnats.Logger(t))
			if err == nil {
				t.Fatal("Connect to a closed port succeeded")
			}
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("error %v does not wrap the context's error", err)
			}
			if d := time.Since(start); d < time.Second || d > 5*time.Second {
				t.Errorf("Connect gave up after %v; want it to retry until the 1.5s deadline", d)
			}
			if strings.Contains(err.Error(), "hunter2") {
				t.Errorf("error leaks the password: %v", err)
			}
		})
	}
}

// A wrong credential is not retried: Connect fails at once.
func TestConnectAuthFailsFast(t *testing.T) {
	t.Parallel()
	srv, err := bus.StartEmbedded(bus.EmbeddedConfig{DataDir: t.TempDir(), Token: "s3cret"}, testnats.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	ctx := ctxT(t)

	start := time.Now()
	_, err = bus.Connect(ctx, bus.Config{URL: srv.URL(), Token: "wrong"}, "test", catalogue(t), testnats.Logger(t))
	if err == nil {
		t.Fatal("Connect with a wrong token succeeded")
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("Connect took %v to report an authorization failure", d)
	}

	b, err := bus.Connect(ctx, bus.Config{URL: srv.URL(), Token: "s3cret"}, "test", catalogue(t), testnats.Logger(t))
	if err != nil {
		t.Fatalf("Connect with the right token: %v", err)
	}
	b.Close()

	// A token inside a scheme-less URL is a real credential too.
	noScheme := "s3cret@" + strings.TrimPrefix(srv.URL(), "nats://")
	b, err = bus.Connect(ctx, bus.Config{URL: noScheme}, "test", catalogue(t), testnats.Logger(t))
	if err != nil {
		t.Fatalf("Connect with the token in a scheme-less URL: %v", err)
	}
	b.Close()
}
