package bus

import (
	"io"
	"net"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

// inProcess is Config.InProcess as the connection uses it: the client's
// end of each in-process pipe writes through a queue (queuedConn).
type inProcess struct{ p nats.InProcessConnProvider }

// InProcessConn implements nats.InProcessConnProvider.
func (ip inProcess) InProcessConn() (net.Conn, error) {
	c, err := ip.p.InProcessConn()
	if err != nil {
		return nil, err
	}
	return newQueuedConn(c), nil
}

// maxQueued bounds what a queuedConn holds: Write waits beyond it.
const maxQueued = 1 << 20

// queuedConn is a net.Conn whose writes are queued and sent by a goroutine
// of its own, so that a write never waits for the other end to read.
// net.Pipe, which in-process connections are, has no buffer at all, and
// nats.go writes CONNECT and PING one after the other: a server that
// refuses CONNECT writes its -ERR while the client still writes PING, and
// each waits for the other until the server's write deadline (10 s),
// after which the client sees a closed pipe instead of the refusal. The
// same holds for any error the server answers a write with. Over a socket
// the kernel's buffers take the place of the queue.
type queuedConn struct {
	net.Conn

	mu      sync.Mutex
	cond    *sync.Cond // data queued, data sent, failed or closing
	queue   []byte     // written, not yet sent
	spare   []byte     // the last buffer sent, reused
	err     error      // the first failed send; every later Write fails with it
	closing bool
	done    chan struct{} // closed when send returns
}

// closeFlush bounds how long Close waits for the queue to be sent before
// it closes the pipe anyway.
const closeFlush = 500 * time.Millisecond

func newQueuedConn(c net.Conn) *queuedConn {
	q := &queuedConn{Conn: c, done: make(chan struct{})}
	q.cond = sync.NewCond(&q.mu)
	go q.send()
	return q
}

// Write queues p; it waits only while at least maxQueued bytes are
// queued (so the queue holds at most maxQueued plus one write).
func (q *queuedConn) Write(p []byte) (int, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for len(q.queue) >= maxQueued && q.err == nil && !q.closing {
		q.cond.Wait()
	}
	switch {
	case q.err != nil:
		return 0, q.err
	case q.closing:
		return 0, net.ErrClosed
	}
	q.queue = append(q.queue, p...)
	q.cond.Broadcast()
	return len(p), nil
}

// send writes what is queued to the pipe, in order, until Close was called
// and the queue is empty, or a write fails.
func (q *queuedConn) send() {
	defer close(q.done)
	q.mu.Lock()
	defer q.mu.Unlock()
	for {
		for len(q.queue) == 0 && !q.closing {
			q.cond.Wait()
		}
		if len(q.queue) == 0 {
			return // closing, and all sent
		}
		// out is sent while Write fills the other buffer; spare is nil
		// until out is done with, so the two never share an array.
		out := q.queue
		q.queue, q.spare = q.spare[:0], nil
		q.cond.Broadcast() // room for writers waiting on a full queue
		q.mu.Unlock()
		_, err := q.Conn.Write(out)
		q.mu.Lock()
		if cap(out) <= 64<<10 {
			q.spare = out // a large one is not kept
		}
		if err != nil {
			q.err = err
			q.cond.Broadcast()
			return
		}
		q.cond.Broadcast()
	}
}

// Close sends what is queued, as a socket's close does (for at most
// closeFlush), then closes the pipe. Meanwhile whatever the server writes
// is read and dropped: a server blocked writing to this end (a refusal, a
// TLS alert) could not read the rest of the queue otherwise.
func (q *queuedConn) Close() error {
	q.mu.Lock()
	q.closing = true
	q.cond.Broadcast()
	q.mu.Unlock()
	go func() { _, _ = io.Copy(io.Discard, q.Conn) }() // ends when the pipe is closed
	t := time.NewTimer(closeFlush)
	defer t.Stop()
	select {
	case <-q.done:
	case <-t.C:
	}
	return q.Conn.Close()
}
