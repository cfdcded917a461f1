package bus

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"net"
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
	select { // the sender meets the closed end
	case <-q.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the sender did not stop at the closed end")
	}
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
