package bus_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/internal/testnats"
	"github.com/loopbus/loopbus/schemas"
	"github.com/nats-io/nats.go"
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
	art, err := js.Stream(ctx, bus.DefaultArtifactsBucket)
	if err != nil {
		t.Fatalf("artifact stream: %v", err)
	}
	if c := art.CachedInfo().Config; c.MaxMsgsPerSubject != 1 || c.Discard != jetstream.DiscardNew || !c.DiscardNewPerSubject ||
		c.AllowRollup || !c.AllowDirect || c.Storage != jetstream.FileStorage || len(c.Subjects) != 1 || c.Subjects[0] != bus.ArtifactSubjects {
		t.Errorf("artifact stream is not write-once: %+v", c)
	}
	// The object store of earlier releases is not created.
	if _, err := js.Stream(ctx, "OBJ_"+bus.DefaultArtifactsBucket); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Errorf("object store stream: %v, want not found", err)
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
	if _, err := b.JetStream().Stream(ctx, "EV_ART"); err != nil {
		t.Errorf("artifact stream EV_ART: %v", err)
	}
	// The default names were not provisioned.
	if _, err := b.JetStream().Stream(ctx, bus.DefaultStream); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Errorf("stream %s: %v, want not found", bus.DefaultStream, err)
	}

	// Reconnecting with another window keeps the existing stream's; with
	// Reconfigure it applies the new one.
	cfg.DuplicateWindow = 2 * time.Minute
	for _, tt := range []struct {
		name        string
		reconfigure bool
		want        time.Duration
	}{
		{name: "without reconfigure", want: time.Minute},
		{name: "with reconfigure", reconfigure: true, want: 2 * time.Minute},
	} {
		cfg.Reconfigure = tt.reconfigure
		b2, err := bus.Connect(ctx, cfg, "test/custom2", catalogue(t), testnats.Logger(t))
		if err != nil {
			t.Fatalf("reconnect %s: %v", tt.name, err)
		}
		t.Cleanup(b2.Close)
		info, err := s.Info(ctx)
		if err != nil || info.Config.Duplicates != tt.want {
			t.Errorf("after reconnect %s duplicates = %v, %v; want %v", tt.name, info.Config.Duplicates, err, tt.want)
		}
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
		{name: "timeouts set", cfg: bus.Config{URL: url, ConnectTimeout: time.Second, GiveUpAfter: time.Minute}},
		{name: "negative connect timeout", cfg: bus.Config{URL: url, ConnectTimeout: -time.Second}, wantErr: true},
		{name: "negative give-up time", cfg: bus.Config{URL: url, GiveUpAfter: -time.Second}, wantErr: true},
		{name: "reconfigure", cfg: bus.Config{URL: url, Reconfigure: true, MaxAge: time.Hour}},
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
		{name: "negative connect timeout", cfg: bus.Config{URL: "nats://127.0.0.1:1", ConnectTimeout: -time.Second}},
		{name: "negative give-up time", cfg: bus.Config{URL: "nats://127.0.0.1:1", GiveUpAfter: -time.Second}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// ErrConfig (not the context's error) shows Connect refused the
			// config instead of retrying until ctx ended.
			_, err := bus.Connect(ctxT(t), tt.cfg, "test", catalogue(t), testnats.Logger(t))
			if !errors.Is(err, bus.ErrConfig) {
				t.Fatalf("Connect = %v, want ErrConfig", err)
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
			err := connectWithin(t, ctx, bus.Config{URL: tt.url}, hangGuard)
			if err == nil {
				t.Fatal("Connect to a closed port succeeded")
			}
			// Retrying until ctx ends is what makes the error wrap ctx's.
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("error %v does not wrap the context's error", err)
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

	// ctx outlives the hang guard: an error before it that is not ctx's
	// shows Connect did not retry.
	err = connectWithin(t, ctx, bus.Config{URL: srv.URL(), Token: "wrong"}, hangGuard)
	if err == nil {
		t.Fatal("Connect with a wrong token succeeded")
	}
	if !errors.Is(err, nats.ErrAuthorization) || errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Connect with a wrong token = %v, want an authorization error", err)
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

// streamShape is the part of a stream's config that provisioning keeps
// unless told to reconfigure.
type streamShape struct {
	MaxAge     time.Duration
	MaxBytes   int64
	Replicas   int
	Duplicates time.Duration
}

func shapeOf(t *testing.T, b *bus.Bus, name string) streamShape {
	t.Helper()
	s, err := b.JetStream().Stream(ctxT(t), name)
	if err != nil {
		t.Fatalf("stream %s: %v", name, err)
	}
	c := s.CachedInfo().Config
	return streamShape{MaxAge: c.MaxAge, MaxBytes: c.MaxBytes, Replicas: c.Replicas, Duplicates: c.Duplicates}
}

// bucketReplicas returns the replicas of the views bucket and artifact store.
func bucketReplicas(t *testing.T, b *bus.Bus) (views, artifacts int) {
	t.Helper()
	ctx := ctxT(t)
	kv, err := b.JetStream().KeyValue(ctx, bus.DefaultViewsBucket)
	if err != nil {
		t.Fatalf("views bucket: %v", err)
	}
	kst, err := kv.Status(ctx)
	if err != nil {
		t.Fatalf("views bucket status: %v", err)
	}
	art, err := b.JetStream().Stream(ctx, bus.DefaultArtifactsBucket)
	if err != nil {
		t.Fatalf("artifact stream: %v", err)
	}
	return kst.Config().Replicas, art.CachedInfo().Config.Replicas
}

// holds checks cond repeatedly for d and fails the test the first time it
// does not hold.
func holds(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		if !cond() {
			t.Fatalf("%s stopped holding", what)
		}
	}
	if !cond() {
		t.Fatalf("%s stopped holding", what)
	}
}

// Provisioning never changes an existing stream's retention or replicas
// unless Config.Reconfigure says so: a read-only command run with
// "--max-age 1s", or any command run with default flags, must neither wipe
// nor reset the history a server was configured with.
func TestProvisionKeepsExistingRetention(t *testing.T) {
	t.Parallel()
	srv := testnats.Server(t)
	long := streamShape{MaxAge: 720 * time.Hour, MaxBytes: -1, Replicas: 1, Duplicates: time.Minute}
	reconfigured := streamShape{MaxAge: 48 * time.Hour, MaxBytes: -1, Replicas: 1, Duplicates: bus.DefaultDuplicateWindow}
	withBytes := reconfigured
	withBytes.MaxBytes = 1 << 30
	steps := []struct {
		name    string
		cfg     bus.Config // URL is filled in
		want    streamShape
		wantDLQ streamShape
		wantErr bool
		// holdFor: every event must still be there this long after the step.
		holdFor time.Duration
	}{
		{name: "first connect creates from config", cfg: bus.Config{MaxAge: 720 * time.Hour, DuplicateWindow: time.Minute}, want: long, wantDLQ: long},
		{name: "zero config keeps retention and window", cfg: bus.Config{}, want: long, wantDLQ: long},
		{name: "max age 1s without reconfigure keeps 720h", cfg: bus.Config{MaxAge: time.Second}, want: long, wantDLQ: long, holdFor: 2 * time.Second},
		{name: "max bytes and window without reconfigure are kept", cfg: bus.Config{MaxBytes: 1 << 20, DuplicateWindow: 5 * time.Minute}, want: long, wantDLQ: long},
		{name: "replicas 3 without reconfigure keep 1", cfg: bus.Config{Replicas: 3}, want: long, wantDLQ: long},
		{name: "reconfigure to max age 48h", cfg: bus.Config{MaxAge: 48 * time.Hour, Reconfigure: true}, want: reconfigured, wantDLQ: reconfigured},
		{name: "reconfigure max bytes of the event stream only", cfg: bus.Config{MaxAge: 48 * time.Hour, MaxBytes: 1 << 30, Reconfigure: true}, want: withBytes, wantDLQ: reconfigured},
		{name: "zero config after reconfigure keeps the new settings", cfg: bus.Config{}, want: withBytes, wantDLQ: reconfigured},
		{name: "reconfigure to replicas 3 fails on one server and changes nothing", cfg: bus.Config{Replicas: 3, Reconfigure: true}, want: withBytes, wantDLQ: reconfigured, wantErr: true},
		{name: "invalid config fails and changes nothing", cfg: bus.Config{MaxAge: time.Minute, DuplicateWindow: time.Hour, Reconfigure: true}, want: withBytes, wantDLQ: reconfigured, wantErr: true},
	}
	var events uint64
	for i, st := range steps {
		cfg := st.cfg
		cfg.URL = srv.URL()
		b, err := bus.Connect(ctxT(t), cfg, "test/provision", catalogue(t), testnats.Logger(t))
		if (err != nil) != st.wantErr {
			t.Fatalf("step %q: Connect = %v, wantErr %v", st.name, err, st.wantErr)
		}
		if err != nil {
			b = testnats.Connect(t, srv.URL(), "test/inspect")
		} else {
			t.Cleanup(b.Close)
			publish(t, b, jobStarted("s1", fmt.Sprintf("e%d", i)))
			events++
		}
		if got := shapeOf(t, b, bus.DefaultStream); got != st.want {
			t.Errorf("step %q: event stream %+v, want %+v", st.name, got, st.want)
		}
		if got := shapeOf(t, b, bus.DefaultDLQStream); got != st.wantDLQ {
			t.Errorf("step %q: DLQ stream %+v, want %+v", st.name, got, st.wantDLQ)
		}
		if v, a := bucketReplicas(t, b); v != 1 || a != 1 {
			t.Errorf("step %q: bucket replicas views %d artifacts %d, want 1", st.name, v, a)
		}
		if n := msgCount(t, b); n != events {
			t.Fatalf("step %q: stream holds %d events, want %d", st.name, n, events)
		}
		if st.holdFor > 0 {
			holds(t, st.holdFor, fmt.Sprintf("step %q: all %d events in the stream", st.name, events), func() bool {
				return msgCount(t, b) == events
			})
		}
	}
}

// Existing buckets are looked up, never re-created: their settings survive
// a Connect, and Reconfigure only touches their replicas.
func TestProvisionKeepsExistingBuckets(t *testing.T) {
	t.Parallel()
	srv := testnats.Server(t)
	b := testnats.Connect(t, srv.URL(), "test/owner")
	ctx := ctxT(t)
	js := b.JetStream()
	// Someone (an operator) changed the buckets.
	kst, err := b.JetStream().KeyValue(ctx, bus.DefaultViewsBucket)
	if err != nil {
		t.Fatal(err)
	}
	st, err := kst.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	kcfg := st.Config()
	kcfg.History = 5
	kcfg.Description = "operator's"
	if _, err := js.UpdateKeyValue(ctx, kcfg); err != nil {
		t.Fatalf("update views bucket: %v", err)
	}
	art, err := js.Stream(ctx, bus.DefaultArtifactsBucket)
	if err != nil {
		t.Fatal(err)
	}
	acfg := art.CachedInfo().Config
	acfg.Description, acfg.MaxBytes = "operator's", 1<<30
	if _, err := js.UpdateStream(ctx, acfg); err != nil {
		t.Fatalf("update artifact stream: %v", err)
	}
	if err := b.PutView(ctx, "k", map[string]int{"v": 1}); err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name string
		cfg  bus.Config
	}{
		{name: "zero config"},
		{name: "reconfigure", cfg: bus.Config{Reconfigure: true, MaxAge: time.Hour}},
	}
	for _, tt := range tests {
		cfg := tt.cfg
		cfg.URL = srv.URL()
		b2, err := bus.Connect(ctx, cfg, "test/"+tt.name, catalogue(t), testnats.Logger(t))
		if err != nil {
			t.Fatalf("%s: Connect: %v", tt.name, err)
		}
		t.Cleanup(b2.Close)
		kv, err := js.KeyValue(ctx, bus.DefaultViewsBucket)
		if err != nil {
			t.Fatal(err)
		}
		kst, err := kv.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if kst.History() != 5 || kst.Config().Description != "operator's" {
			t.Errorf("%s: views bucket history %d description %q, want the operator's 5 and description", tt.name, kst.History(), kst.Config().Description)
		}
		art, err := js.Stream(ctx, bus.DefaultArtifactsBucket)
		if err != nil {
			t.Fatal(err)
		}
		if c := art.CachedInfo().Config; c.Description != "operator's" || c.MaxBytes != 1<<30 {
			t.Errorf("%s: artifact stream description %q, max bytes %d; want the operator's", tt.name, c.Description, c.MaxBytes)
		}
		var v map[string]int
		if err := b2.GetView(ctx, "k", &v); err != nil || v["v"] != 1 {
			t.Errorf("%s: view after Connect = %v, %v; want it kept", tt.name, v, err)
		}
	}
}

// The event stream's invariants are restored whoever changed them; its
// retention is kept.
func TestProvisionRestoresInvariants(t *testing.T) {
	t.Parallel()
	base := jetstream.StreamConfig{
		Name:               bus.DefaultStream,
		Subjects:           []string{schemas.SubjectPrefix + ".>"},
		Storage:            jetstream.FileStorage,
		MaxAge:             720 * time.Hour,
		Duplicates:         time.Minute,
		DenyDelete:         true,
		DenyPurge:          true,
		AllowAtomicPublish: true,
	}
	tests := []struct {
		name    string
		tamper  func(*jetstream.StreamConfig)
		wantErr bool
	}{
		{name: "untouched", tamper: func(*jetstream.StreamConfig) {}},
		{name: "deletes allowed", tamper: func(c *jetstream.StreamConfig) { c.DenyDelete = false }},
		{name: "purges allowed", tamper: func(c *jetstream.StreamConfig) { c.DenyPurge = false }},
		{name: "atomic publish off", tamper: func(c *jetstream.StreamConfig) { c.AllowAtomicPublish = false }},
		{name: "narrower subjects", tamper: func(c *jetstream.StreamConfig) { c.Subjects = []string{schemas.SubjectPrefix + ".s1.>"} }},
		{name: "all of them", tamper: func(c *jetstream.StreamConfig) {
			c.DenyDelete, c.DenyPurge, c.AllowAtomicPublish = false, false, false
			c.Subjects = []string{schemas.SubjectPrefix + ".s1.>"}
		}},
		// The server cannot change storage: Connect must say so, not carry on.
		{name: "memory storage", tamper: func(c *jetstream.StreamConfig) { c.Storage = jetstream.MemoryStorage }, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv := testnats.Server(t)
			ctx := ctxT(t)
			sc := base
			tt.tamper(&sc)
			if err := createStream(ctx, srv.URL(), sc); err != nil {
				t.Fatalf("create tampered stream: %v", err)
			}
			b, err := bus.Connect(ctx, bus.Config{URL: srv.URL()}, "test/invariants", catalogue(t), testnats.Logger(t))
			if (err != nil) != tt.wantErr {
				t.Fatalf("Connect = %v, wantErr %v", err, tt.wantErr)
			}
			if err != nil {
				if !strings.Contains(err.Error(), bus.DefaultStream) {
					t.Errorf("error %v does not name the stream", err)
				}
				return
			}
			t.Cleanup(b.Close)
			s, err := b.JetStream().Stream(ctx, bus.DefaultStream)
			if err != nil {
				t.Fatal(err)
			}
			c := s.CachedInfo().Config
			if !c.DenyDelete || !c.DenyPurge || !c.AllowAtomicPublish || len(c.Subjects) != 1 || c.Subjects[0] != schemas.SubjectPrefix+".>" || c.Storage != jetstream.FileStorage {
				t.Errorf("after Connect: deny delete %v, deny purge %v, atomic %v, subjects %v, storage %v; want the invariants", c.DenyDelete, c.DenyPurge, c.AllowAtomicPublish, c.Subjects, c.Storage)
			}
			if c.MaxAge != 720*time.Hour || c.Duplicates != time.Minute {
				t.Errorf("after Connect: max age %v duplicates %v; want the existing 720h, 1m", c.MaxAge, c.Duplicates)
			}
			seq := publish(t, b, jobStarted("s2", "e1"))
			if err := s.DeleteMsg(ctx, seq); err == nil {
				t.Error("deleting an event succeeded after Connect")
			}
		})
	}
}

// createStream creates a stream through a plain JetStream connection.
func createStream(ctx context.Context, url string, sc jetstream.StreamConfig) error {
	nc, err := nats.Connect(url)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	_, err = js.CreateStream(ctx, sc)
	return err
}

// Services starting together on a fresh server all provision successfully.
func TestProvisionConcurrentConnects(t *testing.T) {
	t.Parallel()
	srv := testnats.Server(t)
	ctx, cat, log := ctxT(t), catalogue(t), testnats.Logger(t)
	const n = 6
	errs := make(chan error, n)
	for i := range n {
		go func() {
			b, err := bus.Connect(ctx, bus.Config{URL: srv.URL(), MaxAge: time.Duration(i+1) * time.Hour}, "test/concurrent", cat, log)
			if err == nil {
				b.Close()
			}
			errs <- err
		}()
	}
	for range n {
		if err := waitErr(t, errs, "concurrent Connect", hangGuard); err != nil {
			t.Errorf("concurrent Connect: %v", err)
		}
	}
}
