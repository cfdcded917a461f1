package procrun

import (
	"bytes"
	"fmt"
	"io"
	"strings"
	"sync"
	"unicode/utf8"
)

// ring keeps the last bytes written to it. It is safe for concurrent use, so
// the stdout and stderr copiers can share one to build a combined tail.
type ring struct {
	mu    sync.Mutex
	size  int    // the capacity
	buf   []byte // nil until the first byte is written, then len(buf) == size
	w     int    // next write position
	full  bool   // buf has wrapped at least once
	total int64  // bytes ever written
}

// newRing returns a ring of size bytes; they are allocated by the first
// write, so a process that prints nothing costs none.
func newRing(size int) *ring {
	return &ring{size: size}
}

// Write records p, dropping the oldest bytes beyond the capacity. It never
// fails.
func (r *ring) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := len(p)
	r.total += int64(n)
	size := r.size
	if size == 0 || n == 0 {
		return n, nil
	}
	if r.buf == nil {
		r.buf = make([]byte, size)
	}
	if len(p) >= size {
		copy(r.buf, p[len(p)-size:])
		r.w = 0
		r.full = true
		return n, nil
	}
	k := copy(r.buf[r.w:], p)
	if k < len(p) {
		copy(r.buf, p[k:])
		r.full = true
	}
	r.w = (r.w + len(p)) % size
	if r.w == 0 && len(p) > 0 {
		r.full = true
	}
	return n, nil
}

// Bytes returns a copy of the kept bytes, oldest first, and whether older
// bytes were dropped.
func (r *ring) Bytes() ([]byte, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.full {
		return append([]byte(nil), r.buf[:r.w]...), false
	}
	out := make([]byte, 0, len(r.buf))
	out = append(out, r.buf[r.w:]...)
	out = append(out, r.buf[:r.w]...)
	return out, r.total > int64(len(r.buf))
}

// truncMarker starts a tail whose older output was dropped.
const truncMarker = "…"

// String returns the kept bytes as valid UTF-8: invalid bytes become U+FFFD
// and, when older output was dropped, a rune cut in half at the start is
// removed and truncMarker is prepended.
func (r *ring) String() string {
	b, truncated := r.Bytes()
	if !truncated {
		return strings.ToValidUTF8(string(b), "\uFFFD")
	}
	// Skip continuation bytes of a rune whose first bytes were dropped.
	for i := 0; i < utf8.UTFMax-1 && len(b) > 0 && !utf8.RuneStart(b[0]); i++ {
		b = b[1:]
	}
	return truncMarker + strings.ToValidUTF8(string(b), "\uFFFD")
}

// capBuffer keeps the first max bytes written to it and silently drops the
// rest. It is used by one goroutine at a time.
type capBuffer struct {
	buf []byte
	max int
}

func (c *capBuffer) Write(p []byte) (int, error) {
	if room := c.max - len(c.buf); room > 0 {
		if len(p) < room {
			room = len(p)
		}
		c.buf = append(c.buf, p[:room]...)
	}
	return len(p), nil
}

// sink fans one stream out to several writers. Its writes never fail: a
// failing output file must not stop the copier, which would leave the child
// blocked on a full pipe. File errors are therefore ignored.
type sink []io.Writer

func (s sink) Write(p []byte) (int, error) {
	for _, w := range s {
		_, _ = w.Write(p)
	}
	return len(p), nil
}

// sinkReadBuffer is the buffer ReadFrom reads through, once a read has
// filled sinkFirstBuffer.
const (
	sinkFirstBuffer = 512
	sinkReadBuffer  = 8 << 10
)

// ReadFrom copies r into the sink through a buffer of sinkFirstBuffer
// bytes, then, once a read fills it, of sinkReadBuffer: exec's copying
// goroutines (io.Copy) would otherwise take 32 KiB each, for stdout and
// stderr, for every process run, most of which print a few lines or none.
func (s sink) ReadFrom(r io.Reader) (int64, error) {
	buf := make([]byte, sinkFirstBuffer)
	var n int64
	for {
		k, err := r.Read(buf)
		if k > 0 {
			_, _ = s.Write(buf[:k])
			n += int64(k)
		}
		if k == len(buf) && len(buf) < sinkReadBuffer {
			buf = make([]byte, sinkReadBuffer)
		}
		if err == io.EOF {
			return n, nil
		}
		if err != nil {
			return n, err
		}
	}
}

// MaxLine bounds the line lineWriter buffers before passing it on.
const MaxLine = 4 << 20

// maxPendingLines bounds the queue of lineWriter: Write waits while it
// holds this much not yet taken by fn's goroutine, so a lineWriter holds
// at most about twice this (the queue and the chunk being split). It is
// well above what a pipe holds (64 KiB on Linux), so what is left in the
// pipe when the process exits is read at once however slow fn is.
const maxPendingLines = 1 << 20

// lineWriter calls fn for each complete line written to it, in order, from
// a goroutine of its own: a slow fn (one that publishes each line and
// waits for the acknowledgement) must not keep the copier from draining
// the pipe, or the output still in it when Run stops waiting for the
// pipes (pipeDrain after the process exited) would be lost. Write only
// queues (up to maxPendingLines, then it waits); flush passes on
// everything queued and the last, unterminated line, and returns once fn
// is done with them. What is written after flush is dropped.
type lineWriter struct {
	fn func([]byte)

	mu      sync.Mutex
	cond    *sync.Cond // data queued, room made, or flush called
	pend    []byte     // written, not yet split into lines
	started bool       // consume runs
	closed  bool       // flush was called
	done    chan struct{}

	buf []byte // the line being gathered: consume's, then flush's
	// panicked is fn's first panic; fn is not called after it.
	panicked string
}

func newLineWriter(fn func([]byte)) *lineWriter {
	l := &lineWriter{fn: fn, done: make(chan struct{})}
	l.cond = sync.NewCond(&l.mu)
	return l
}

// call passes line to fn unless fn has panicked, containing a panic.
func (l *lineWriter) call(line []byte) {
	if l.panicked != "" {
		return
	}
	defer func() {
		if p := recover(); p != nil {
			l.panicked = fmt.Sprint(p)
		}
	}()
	l.fn(line)
}

func (l *lineWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for len(l.pend) >= maxPendingLines && !l.closed {
		l.cond.Wait()
	}
	if l.closed {
		return len(p), nil
	}
	l.pend = append(l.pend, p...)
	if !l.started {
		l.started = true
		go l.consume()
	}
	l.cond.Broadcast()
	return len(p), nil
}

// consume splits what is queued into lines for fn until flush is called
// and nothing is left.
func (l *lineWriter) consume() {
	defer close(l.done)
	var chunk []byte
	for {
		l.mu.Lock()
		for len(l.pend) == 0 && !l.closed {
			l.cond.Wait()
		}
		if len(l.pend) == 0 {
			l.mu.Unlock()
			return
		}
		chunk, l.pend = l.pend, chunk[:0]
		l.cond.Broadcast() // room for Write
		l.mu.Unlock()
		l.split(chunk)
	}
}

// split passes each complete line of p to fn, gathering the rest.
func (l *lineWriter) split(p []byte) {
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			l.buf = append(l.buf, p...)
			if len(l.buf) >= MaxLine {
				l.call(l.buf)
				l.buf = l.buf[:0]
			}
			return
		}
		if len(l.buf) == 0 {
			l.call(p[:i])
		} else {
			l.buf = append(l.buf, p[:i]...)
			l.call(l.buf)
			l.buf = l.buf[:0]
		}
		p = p[i+1:]
	}
}

// flush passes on everything written before it, the last line too, and
// returns when fn is done with them.
func (l *lineWriter) flush() {
	l.mu.Lock()
	l.closed = true
	l.cond.Broadcast()
	started := l.started
	l.mu.Unlock()
	if started {
		<-l.done
	}
	if len(l.buf) > 0 {
		l.call(l.buf)
		l.buf = l.buf[:0]
	}
}
