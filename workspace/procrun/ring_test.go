package procrun

import (
	"bytes"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"
)

func TestRing(t *testing.T) {
	tests := []struct {
		name   string
		size   int
		writes []string
		want   string
	}{
		{name: "empty", size: 8, writes: nil, want: ""},
		{name: "fits", size: 8, writes: []string{"abc", "de"}, want: "abcde"},
		{name: "exactly full", size: 5, writes: []string{"abc", "de"}, want: "abcde"},
		{name: "wraps", size: 5, writes: []string{"abc", "def"}, want: "…bcdef"},
		{name: "wraps twice", size: 4, writes: []string{"ab", "cd", "ef", "gh", "i"}, want: "…fghi"},
		{name: "one big write", size: 4, writes: []string{"0123456789"}, want: "…6789"},
		{name: "big write after small", size: 4, writes: []string{"xy", "0123456789"}, want: "…6789"},
		{name: "zero size", size: 0, writes: []string{"abc"}, want: ""},
		{name: "invalid bytes replaced", size: 16, writes: []string{"a\xffb"}, want: "a\uFFFDb"},
		// "é" is 0xC3 0xA9: a cut after 0xC3 leaves a stray 0xA9, dropped.
		{name: "cut rune dropped", size: 3, writes: []string{"xé", "yz"}, want: "…yz"},
		{name: "whole rune kept", size: 4, writes: []string{"xé", "yz"}, want: "…éyz"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRing(tt.size)
			for _, w := range tt.writes {
				n, err := r.Write([]byte(w))
				if n != len(w) || err != nil {
					t.Fatalf("Write(%q) = %d, %v", w, n, err)
				}
			}
			if got := r.String(); got != tt.want {
				t.Errorf("String() = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestRingConcurrent(t *testing.T) {
	r := newRing(64)
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < 1000; j++ {
				_, _ = r.Write([]byte("0123456789"))
				_ = r.String()
			}
		}()
	}
	wg.Wait()
	got := r.String()
	if !strings.HasPrefix(got, "…") || !utf8.ValidString(got) {
		t.Fatalf("String() = %q", got)
	}
	// Whole 10-byte writes are atomic, so the tail is a suffix of the repeated
	// pattern.
	if body := strings.TrimPrefix(got, "…"); len(body) != 64 || !strings.Contains(strings.Repeat("0123456789", 8), body) {
		t.Errorf("tail %q is not a run of the pattern", body)
	}
}

func TestCapBuffer(t *testing.T) {
	tests := []struct {
		name   string
		max    int
		writes []string
		want   string
	}{
		{name: "under", max: 10, writes: []string{"abc"}, want: "abc"},
		{name: "at", max: 3, writes: []string{"abc", "d"}, want: "abc"},
		{name: "over", max: 4, writes: []string{"abc", "def"}, want: "abcd"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := &capBuffer{max: tt.max}
			for _, w := range tt.writes {
				if n, err := c.Write([]byte(w)); n != len(w) || err != nil {
					t.Fatalf("Write(%q) = %d, %v", w, n, err)
				}
			}
			if string(c.buf) != tt.want {
				t.Errorf("buf = %q, want %q", c.buf, tt.want)
			}
		})
	}
}

// TestLineWriterBounded: while fn is busy, Write queues up to
// maxPendingLines (besides the chunk fn's goroutine took, at most as
// much again) and then waits; flush passes everything on.
func TestLineWriterBounded(t *testing.T) {
	release := make(chan struct{})
	var lines int
	l := newLineWriter(func([]byte) {
		if lines == 0 {
			<-release
		}
		lines++
	})
	line := append(bytes.Repeat([]byte("x"), 1023), '\n')
	wrote := make(chan int, 1)
	go func() {
		n := 0
		for range 2*maxPendingLines/len(line) + 64 {
			_, _ = l.Write(line)
			n++
		}
		wrote <- n
	}()
	// The first line is taken by fn, which waits; the writer fills the
	// queue and must then wait too.
	deadline := time.After(10 * time.Second)
	for {
		l.mu.Lock()
		full := len(l.pend) >= maxPendingLines
		l.mu.Unlock()
		if full {
			break
		}
		select {
		case n := <-wrote:
			t.Fatalf("Write queued all %d lines while fn was busy: no bound", n)
		case <-deadline:
			t.Fatal("the queue never filled")
		default:
			time.Sleep(time.Millisecond)
		}
	}
	select {
	case n := <-wrote:
		t.Fatalf("Write returned after %d lines with a full queue", n)
	default:
	}
	close(release)
	n := <-wrote
	l.flush()
	if lines != n {
		t.Errorf("fn got %d lines, want %d", lines, n)
	}
}
