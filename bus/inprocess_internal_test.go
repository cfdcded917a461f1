package bus

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"testing"
	"time"
)

// TestQueuedConn: writes return without the other end reading, arrive in
// order, what is queued is sent before Close closes the pipe, and a
// failed send fails the writes after it.
func TestQueuedConn(t *testing.T) {
	client, server := net.Pipe()
	q := newQueuedConn(client)
	var want bytes.Buffer
	for i := range 100 {
		p := bytes.Repeat([]byte{byte('a' + i%26)}, 1000+i)
		want.Write(p)
		// Nobody reads yet: a plain pipe would block here.
		if n, err := q.Write(p); n != len(p) || err != nil {
			t.Fatalf("Write %d = %d, %v", i, n, err)
		}
	}
	got := make(chan []byte)
	go func() {
		b, _ := io.ReadAll(server)
		got <- b
	}()
	if err := q.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	select {
	case b := <-got:
		if !bytes.Equal(b, want.Bytes()) {
			t.Fatalf("read %d bytes, want the %d written, in order", len(b), want.Len())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the queue was not sent")
	}
	if _, err := q.Write([]byte("late")); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Write after Close = %v, want net.ErrClosed", err)
	}

	client, server = net.Pipe()
	q = newQueuedConn(client)
	server.Close()
	if _, err := q.Write([]byte("x")); err != nil {
		t.Fatalf("first Write = %v, want it queued", err)
	}
	awaitIdle(t, q) // the sender met the closed end
	if _, err := q.Write([]byte("y")); !errors.Is(err, io.ErrClosedPipe) {
		t.Errorf("Write after a failed send = %v, want the send's error", err)
	}
	q.Close()
}

// TestQueuedConnManyWrites: writes of every size, large ones among them
// (the sender then keeps no buffer), arrive whole and in order at a
// reader that takes them in small pieces, so that writes land while the
// sender is mid-send.
func TestQueuedConnManyWrites(t *testing.T) {
	client, server := net.Pipe()
	q := newQueuedConn(client)
	defer q.Close()
	rng := rand.New(rand.NewPCG(1, 2))
	var writes [][]byte
	var want bytes.Buffer
	for i := range 400 {
		size := 1 + rng.IntN(2000)
		if i%7 == 0 {
			size = 64<<10 + rng.IntN(100<<10)
		}
		p := make([]byte, size)
		for j := range p {
			p[j] = byte(i + j/256)
		}
		writes = append(writes, p)
		want.Write(p)
	}
	got := make(chan []byte)
	go func() {
		b := make([]byte, want.Len())
		for n := 0; n < len(b); {
			k, err := server.Read(b[n:min(n+1500, len(b))])
			n += k
			if err != nil {
				b = b[:n]
				break
			}
		}
		got <- b
	}()
	for i, p := range writes {
		if _, err := q.Write(p); err != nil {
			t.Fatalf("Write %d: %v", i, err)
		}
	}
	select {
	case b := <-got:
		if i := firstDiff(b, want.Bytes()); i >= 0 {
			t.Fatalf("read %d bytes, want %d; they differ from byte %d", len(b), want.Len(), i)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the reader did not finish")
	}
}

// TestQueuedConnLargeThenSmall: after a send too large to keep its
// buffer, a write made while the next send is under way must not land in
// the buffer being sent.
func TestQueuedConnLargeThenSmall(t *testing.T) {
	client, server := net.Pipe()
	q := newQueuedConn(client)
	defer q.Close()
	read := func(n int) []byte {
		b := make([]byte, n)
		if _, err := io.ReadFull(server, b); err != nil {
			t.Fatal(err)
		}
		return b
	}
	// taken waits until the sender has taken what is queued.
	taken := func() {
		q.mu.Lock()
		defer q.mu.Unlock()
		for len(q.queue) > 0 {
			q.cond.Wait()
		}
	}
	fill := func(c byte, n int) []byte { return bytes.Repeat([]byte{c}, n) }
	q.Write(fill('a', 1000))
	read(1000)
	q.Write(fill('L', 100<<10)) // sent, its buffer not kept
	taken()
	q.Write(fill('b', 500))
	read(100 << 10)
	taken() // the b's are being sent: the reader takes nothing yet
	q.Write(fill('c', 500))
	if got := read(500); !bytes.Equal(got, fill('b', 500)) {
		t.Fatalf("read %q…, want the b's", got[:16])
	}
	if got := read(500); !bytes.Equal(got, fill('c', 500)) {
		t.Fatalf("read %q…, want the c's", got[:16])
	}
}

// TestQueuedConnNoIdleGoroutine: once what was queued is sent, no
// goroutine is left: nats.go drops a connection whose reconnect failed
// without closing it.
func TestQueuedConnNoIdleGoroutine(t *testing.T) {
	client, server := net.Pipe()
	q := newQueuedConn(client)
	msg := []byte("CONNECT {}\r\nPING\r\n")
	go func() {
		_, _ = io.ReadFull(server, make([]byte, len(msg)))
		server.Close()
	}()
	if _, err := q.Write(msg); err != nil {
		t.Fatal(err)
	}
	awaitIdle(t, q)
}

// TestQueuedConnDeadlines: a write deadline bounds Write's wait for room
// in the queue, and never the sending of what was queued before it
// (tls.Conn's Close sets one to now before it closes the connection).
func TestQueuedConnDeadlines(t *testing.T) {
	client, server := net.Pipe()
	q := newQueuedConn(client)
	want := bytes.Repeat([]byte("PUB x 1\r\nA\r\n"), 100)
	if _, err := q.Write(want); err != nil {
		t.Fatal(err)
	}
	_ = q.SetWriteDeadline(time.Now()) // nobody reads yet
	got := make(chan []byte)
	go func() {
		b, _ := io.ReadAll(server)
		got <- b
	}()
	q.Close()
	select {
	case b := <-got:
		if !bytes.Equal(b, want) {
			t.Fatalf("the server read %d bytes of the %d queued before the deadline", len(b), len(want))
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the reader did not finish")
	}

	// Nobody reads: the queue fills, and Write fails at its deadline.
	client, _ = net.Pipe()
	q = newQueuedConn(client)
	defer q.Close()
	errc := make(chan error, 1)
	go func() {
		p := make([]byte, 64<<10)
		for {
			_ = q.SetWriteDeadline(time.Now().Add(50 * time.Millisecond))
			if _, err := q.Write(p); err != nil {
				errc <- err
				return
			}
		}
	}()
	select {
	case err := <-errc:
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("Write on a full queue = %v, want os.ErrDeadlineExceeded", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Write waited on a full queue past its deadline")
	}
}

// TestQueuedConnCloseWhileServerWrites: Close still delivers the queue to
// a server that first writes to this end (a refusal, a TLS alert) and
// reads only once that write is taken.
func TestQueuedConnCloseWhileServerWrites(t *testing.T) {
	client, server := net.Pipe()
	q := newQueuedConn(client)
	want := []byte("PING\r\n")
	got := make(chan []byte)
	go func() {
		if _, err := server.Write([]byte("-ERR 'Authorization Violation'\r\n")); err != nil {
			got <- nil
			return
		}
		b, _ := io.ReadAll(server)
		got <- b
	}()
	if _, err := q.Write(want); err != nil {
		t.Fatal(err)
	}
	q.Close()
	select {
	case b := <-got:
		if !bytes.Equal(b, want) {
			t.Fatalf("the server read %q, want %q", b, want)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the server did not finish")
	}
}

// awaitIdle waits until q's sender has returned.
func awaitIdle(t *testing.T, q *queuedConn) {
	t.Helper()
	q.mu.Lock()
	idle := q.idle
	q.mu.Unlock()
	if idle == nil {
		return
	}
	select {
	case <-idle:
	case <-time.After(10 * time.Second):
		t.Fatal("the sender is still running")
	}
}

// firstDiff is the index of the first byte where a and b differ, or -1.
func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	if len(a) != len(b) {
		return min(len(a), len(b))
	}
	return -1
}
