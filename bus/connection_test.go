package bus_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/internal/testnats"
	"github.com/loopbus/loopbus/schemas"
)

// With ConnectTimeout, Connect to a server that is not there gives up on
// its own (ctx would allow much longer) and says the server is unreachable,
// without the URL's credentials.
func TestConnectTimeout(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		url  string
		want string // in the error
	}{
		{name: "closed port", url: closedPort(t), want: "unreachable"},
		{name: "credentials redacted", url: strings.Replace(closedPort(t), "nats://", "nats://alice:hunter2@", 1), want: "REDACTED@127.0.0.1"},
		{name: "server list", url: closedPort(t) + "," + closedPort(t), want: "unreachable"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			// ctx outlives the hang guard: returning before it is ConnectTimeout's doing.
			ctx, cancel := context.WithTimeout(context.Background(), 10*hangGuard)
			defer cancel()
			err := connectWithin(t, ctx, bus.Config{URL: tt.url, ConnectTimeout: 500 * time.Millisecond}, hangGuard)
			if err == nil {
				t.Fatal("Connect to a closed port succeeded")
			}
			if !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), "unreachable") {
				t.Errorf("error %q does not contain %q and \"unreachable\"", err, tt.want)
			}
			if strings.Contains(err.Error(), "hunter2") {
				t.Errorf("error leaks the password: %v", err)
			}
			if errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("error %v wraps the context's deadline, which had not passed", err)
			}
		})
	}
}

// A server that comes up within ConnectTimeout is connected to.
func TestConnectTimeoutServerComesUp(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	url := closedPort(t)
	listen := strings.TrimPrefix(url, "nats://")
	errs := make(chan error, 1)
	ctx, cat, log := ctxT(t), catalogue(t), testnats.Logger(t)
	go func() {
		b, err := bus.Connect(ctx, bus.Config{URL: url, ConnectTimeout: time.Minute}, "test/late", cat, log)
		if err == nil {
			b.Close()
		}
		errs <- err
	}()
	startEmbedded(t, bus.EmbeddedConfig{DataDir: dir, Listen: listen})
	if err := waitErr(t, errs, "Connect to a server started late", testTimeout); err != nil {
		t.Fatalf("Connect: %v", err)
	}
}

// With GiveUpAfter, a connection down for that long is closed and every
// operation then fails with ErrConnectionLost; Read and Consume loops that
// were running return instead of hanging.
func TestGiveUpAfter(t *testing.T) {
	t.Parallel()
	srv, shutdown := startEmbedded(t, bus.EmbeddedConfig{DataDir: t.TempDir()})
	b, err := bus.Connect(ctxT(t), bus.Config{URL: srv.URL(), GiveUpAfter: time.Second}, "test/giveup", catalogue(t), testnats.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	seq := publish(t, b, jobRequested("s1", "e1"))

	// ctx stays alive: only the lost connection may end these.
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	caughtUp := make(chan struct{})
	readDone := make(chan error, 1)
	go func() {
		readDone <- b.Read(ctx, bus.ReadOptions{Follow: true, OnCaughtUp: func() { close(caughtUp) }}, func(schemas.Event) error { return nil })
	}()
	var handled atomic.Int32
	consumeDone := make(chan error, 1)
	go func() {
		consumeDone <- b.Consume(ctx, bus.ConsumerConfig{Durable: "giveup", Subjects: []string{requested}}, func(context.Context, bus.Delivery) error {
			handled.Add(1)
			return nil
		})
	}()
	select {
	case <-caughtUp:
	case <-time.After(testTimeout):
		t.Fatal("Read never caught up")
	}
	waitSettled(t, b, "giveup", seq)

	shutdown()

	tests := []struct {
		name string
		done <-chan error
	}{
		{name: "Read with Follow", done: readDone},
		{name: "Consume", done: consumeDone},
	}
	for _, tt := range tests {
		err := waitErr(t, tt.done, tt.name+" after the server went away", testTimeout)
		if !errors.Is(err, bus.ErrConnectionLost) {
			t.Errorf("%s = %v, want ErrConnectionLost", tt.name, err)
		}
	}
	if !b.Conn().IsClosed() {
		t.Error("the connection is not closed after giving up")
	}

	ops := []struct {
		name string
		op   func(context.Context) error
	}{
		{name: "Publish", op: func(ctx context.Context) error {
			_, err := b.Publish(ctx, jobStarted("s1", "after"))
			return err
		}},
		{name: "PublishBatch", op: func(ctx context.Context) error {
			_, err := b.PublishBatch(ctx, "s1", seq, []schemas.Event{jobStarted("s1", "b1"), jobStarted("s1", "b2")})
			return err
		}},
		{name: "Read", op: func(ctx context.Context) error {
			return b.Read(ctx, bus.ReadOptions{}, func(schemas.Event) error { return nil })
		}},
		{name: "Consume", op: func(ctx context.Context) error {
			return b.Consume(ctx, bus.ConsumerConfig{Durable: "later", Subjects: []string{requested}}, func(context.Context, bus.Delivery) error { return nil })
		}},
		{name: "GetEvent", op: func(ctx context.Context) error {
			_, err := b.GetEvent(ctx, seq)
			return err
		}},
		{name: "LastSeq", op: func(ctx context.Context) error {
			_, err := b.LastSeq(ctx)
			return err
		}},
		{name: "GetView", op: func(ctx context.Context) error {
			var v any
			return b.GetView(ctx, "k", &v)
		}},
		{name: "Publish through a derived Bus", op: func(ctx context.Context) error {
			_, err := b.WithSource("test/derived").Publish(ctx, jobStarted("s1", "derived"))
			return err
		}},
	}
	for _, tt := range ops {
		t.Run(tt.name, func(t *testing.T) {
			ctx := ctxT(t)
			done := make(chan error, 1)
			go func() { done <- tt.op(ctx) }()
			if err := waitErr(t, done, tt.name, hangGuard); !errors.Is(err, bus.ErrConnectionLost) {
				t.Errorf("%s = %v, want ErrConnectionLost", tt.name, err)
			}
		})
	}
}

// Without GiveUpAfter the bus rides out an outage: a server restarted on
// the same address and data directory is reconnected to, and a Publish made
// while it was down goes through.
func TestReconnectsWithoutGiveUp(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	srv, shutdown := startEmbedded(t, bus.EmbeddedConfig{DataDir: dir})
	listen := strings.TrimPrefix(srv.URL(), "nats://")
	b := testnats.Connect(t, srv.URL(), "test/reconnect")
	publish(t, b, jobStarted("s1", "before"))
	shutdown()
	waitFor(t, testTimeout, "the client to notice the outage", func() bool { return !b.Conn().IsConnected() })

	ctx := ctxT(t)
	done := make(chan error, 1)
	go func() {
		_, err := b.Publish(ctx, jobStarted("s1", "during"))
		done <- err
	}()
	startEmbedded(t, bus.EmbeddedConfig{DataDir: dir, Listen: listen})
	if err := waitErr(t, done, "Publish during an outage", testTimeout); err != nil {
		t.Fatalf("Publish during an outage: %v", err)
	}
	if n := msgCount(t, b); n != 2 {
		t.Errorf("stream holds %d events, want 2", n)
	}
}
