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
	buf   []byte // fixed capacity; len(buf) == size
	w     int    // next write position
	full  bool   // buf has wrapped at least once
	total int64  // bytes ever written
}

func newRing(size int) *ring {
	return &ring{buf: make([]byte, size)}
}

// Write records p, dropping the oldest bytes beyond the capacity. It never
// fails.
func (r *ring) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := len(p)
	r.total += int64(n)
	size := len(r.buf)
	if size == 0 {
		return n, nil
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

// sinkReadBuffer is the buffer ReadFrom reads through.
const sinkReadBuffer = 8 << 10

// ReadFrom copies r into the sink through a buffer of sinkReadBuffer
// bytes: exec's copying goroutines (io.Copy) would otherwise take 32 KiB
// each, for stdout and stderr, for every process run, most of which
// print a few lines.
func (s sink) ReadFrom(r io.Reader) (int64, error) {
	buf := make([]byte, sinkReadBuffer)
	var n int64
	for {
		k, err := r.Read(buf)
		if k > 0 {
			_, _ = s.Write(buf[:k])
			n += int64(k)
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

// lineWriter calls fn for each complete line written to it. The mutex
// matters only when a copier outlives Wait (WaitDelay) while flush runs.
type lineWriter struct {
	mu  sync.Mutex
	fn  func([]byte)
	buf []byte
	// panicked is fn's first panic; fn is not called after it.
	panicked string
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
	n := len(p)
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			l.buf = append(l.buf, p...)
			if len(l.buf) >= MaxLine {
				l.flushLocked()
			}
			break
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
	return n, nil
}

// flush passes on what is buffered as a last line.
func (l *lineWriter) flush() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.flushLocked()
}

func (l *lineWriter) flushLocked() {
	if len(l.buf) > 0 {
		l.call(l.buf)
		l.buf = l.buf[:0]
	}
}
