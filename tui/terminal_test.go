package tui

import (
	"bytes"
	"testing"

	"github.com/charmbracelet/x/ansi"
	"github.com/charmbracelet/x/vt"
)

// terminal is a terminal emulator that shows a program's output as a
// person would see it: bubbletea sends only what changed since the last
// frame, so the output itself need not hold a line whole. Only the test's
// goroutine may use it.
type terminal struct {
	emu     *vt.Emulator
	done    chan struct{}
	drained chan struct{}
}

// newTerminal returns a terminal of w×h, closed when the test ends.
func newTerminal(t *testing.T, w, h int) *terminal {
	term := &terminal{emu: vt.NewEmulator(w, h), done: make(chan struct{}), drained: make(chan struct{})}
	// The emulator answers the program's queries into a pipe it waits on:
	// read them away.
	go func() {
		defer close(term.drained)
		buf := make([]byte, 1024)
		for {
			if _, err := term.emu.Read(buf); err != nil {
				return
			}
			select {
			case <-term.done:
				return
			default:
			}
		}
	}()
	t.Cleanup(func() {
		// A query's answer wakes the reader to see done. (Closing the
		// emulator while it reads would race inside it.)
		close(term.done)
		_, _ = term.emu.WriteString(ansi.RequestModeSynchronizedOutput)
		<-term.drained
	})
	return term
}

// show takes in output and returns what the terminal shows. Like a
// terminal not set to raw mode (the test programs read no terminal, so
// they leave it as it is) it starts a new line at a line feed.
func (term *terminal) show(out []byte) string {
	_, _ = term.emu.Write(bytes.ReplaceAll(out, []byte("\n"), []byte("\r\n")))
	return term.emu.String()
}
