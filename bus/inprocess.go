package bus

import (
	"io"
	"net"
	"os"
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
// that runs while there is something to send, so that a write never waits
// for the other end to read.
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
	wdl     time.Time     // write deadline: bounds Write's wait, never the pipe's write
	idle    chan struct{} // while send runs: closed when it returns; nil otherwise
}

// closeFlush bounds how long Close waits for the queue to be sent before
// it closes the pipe anyway.
const closeFlush = 500 * time.Millisecond

func newQueuedConn(c net.Conn) *queuedConn {
	q := &queuedConn{Conn: c}
	q.cond = sync.NewCond(&q.mu)
	return q
}

// Write queues p; it waits only while at least maxQueued bytes are
// queued (so the queue holds at most maxQueued plus one write).
func (q *queuedConn) Write(p []byte) (int, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	var wake *time.Timer // wakes the wait below at the write deadline
	var wakeAt time.Time
	defer func() {
		if wake != nil {
			wake.Stop()
		}
	}()
	for len(q.queue) >= maxQueued && q.err == nil && !q.closing && !q.expired() {
		if !q.wdl.IsZero() && !q.wdl.Equal(wakeAt) {
			if wake != nil {
				wake.Stop()
			}
			wake, wakeAt = time.AfterFunc(time.Until(q.wdl), q.wake), q.wdl
		}
		q.cond.Wait()
	}
	switch {
	case q.expired():
		return 0, os.ErrDeadlineExceeded
	case q.err != nil:
		return 0, q.err
	case q.closing:
		return 0, net.ErrClosed
	}
	q.queue = append(q.queue, p...)
	if q.idle == nil && len(q.queue) > 0 {
		q.idle = make(chan struct{})
		go q.send(q.idle)
	}
	return len(p), nil
}

// expired reports whether the write deadline has passed. q.mu is held.
func (q *queuedConn) expired() bool { return !q.wdl.IsZero() && !time.Now().Before(q.wdl) }

// wake wakes every goroutine waiting on q.cond.
func (q *queuedConn) wake() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.cond.Broadcast()
}

// SetWriteDeadline bounds Write (its wait for room in the queue), not the
// sending of what is already queued: nats.go's timeoutWriter and tls.Conn's
// close set deadlines meant for the write they make, and on the pipe
// they would cut the sending of earlier writes short.
func (q *queuedConn) SetWriteDeadline(t time.Time) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.wdl = t
	q.cond.Broadcast()
	return nil
}

// SetDeadline sets the read deadline on the pipe and the write deadline
// as SetWriteDeadline does.
func (q *queuedConn) SetDeadline(t time.Time) error {
	_ = q.SetWriteDeadline(t)
	return q.Conn.SetReadDeadline(t)
}

// send writes what is queued to the pipe, in order, until the queue is
// empty or a write fails; then it closes idle and returns. It runs only
// while there is something to send: a connection nats.go drops without
// closing it (a failed reconnect does) keeps no goroutine alive.
func (q *queuedConn) send(idle chan struct{}) {
	q.mu.Lock()
	defer q.mu.Unlock()
	defer func() { q.idle = nil; close(idle) }()
	for len(q.queue) > 0 {
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

// Close sends what is queued, as a socket's close does (waiting at most
// closeFlush, which nats.go may spend holding its connection's lock),
// then closes the pipe. Meanwhile whatever the server writes is read and
// dropped: a server blocked writing to this end (a refusal, a TLS alert)
// could not read the rest of the queue otherwise.
func (q *queuedConn) Close() error {
	q.mu.Lock()
	q.closing = true
	q.cond.Broadcast()
	idle := q.idle
	q.mu.Unlock()
	if idle == nil {
		return q.Conn.Close()
	}
	go func() { _, _ = io.Copy(io.Discard, q.Conn) }() // ends when the pipe is closed
	t := time.NewTimer(closeFlush)
	defer t.Stop()
	select {
	case <-idle:
	case <-t.C:
	}
	return q.Conn.Close()
}
