package tui

import (
	"bytes"
	"testing"

	"github.com/charmbracelet/x/vt"
)

// terminal is a terminal emulator that shows a program's output as a
// person would see it: bubbletea sends only what changed since the last
// frame, so the output itself need not hold a line whole. Only the test's
// goroutine may use it.
type terminal struct {
	emu *vt.Emulator
}

// newTerminal returns a terminal of w×h.
func newTerminal(t *testing.T, w, h int) *terminal {
	t.Helper()
	term := &terminal{emu: vt.NewEmulator(w, h)}
	// The emulator answers the program's queries into a pipe and waits
	// until they are read: read them away, for as long as the test binary
	// runs. (Stopping this reader at the test's end by sending one more
	// query hung when the program's output ended inside an escape sequence
	// and that query drew two answers; closing the emulator while it reads
	// would race inside it.)
	go func() {
		buf := make([]byte, 1024)
		for {
			if _, err := term.emu.Read(buf); err != nil {
				return
			}
		}
	}()
	return term
}

// show takes in output and returns what the terminal shows. Like a
// terminal not set to raw mode (the test programs read no terminal, so
// they leave it as it is) it starts a new line at a line feed.
func (term *terminal) show(out []byte) string {
	_, _ = term.emu.Write(bytes.ReplaceAll(out, []byte("\n"), []byte("\r\n")))
	return term.emu.String()
}
