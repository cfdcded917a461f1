package bus

import (
	"bytes"
	"errors"
	"io"
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
	<-q.done // the sender met the closed end
	if _, err := q.Write([]byte("y")); !errors.Is(err, io.ErrClosedPipe) {
		t.Errorf("Write after a failed send = %v, want the send's error", err)
	}
	q.Close()
}
