package tui

import (
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	tea "charm.land/bubbletea/v2"
	"github.com/loopbus/loopbus/projections"
	"github.com/loopbus/loopbus/schemas"
	"github.com/mattn/go-isatty"
)

// frame is the shortest time between two batches of events sent into the
// program: a burst of events costs at most one model update (and one
// redraw) per frame, and the caller's goroutine never waits for the
// screen.
const frame = 50 * time.Millisecond

// Screen runs the live screen (Model) as a bubbletea program on a
// terminal and feeds it events.
type Screen struct {
	w      io.Writer
	p      *tea.Program
	mu     sync.Mutex
	queue  []EventMsg
	wake   chan struct{}
	stop   chan struct{}
	pumped chan struct{}
	done   chan struct{}
	err    error
	// model is the program's last model, once it ended.
	model *Model
	once  sync.Once
}

// Start runs the live screen on the terminal w (keys from o.Input) until
// the session ends, the person quits, or Stop. The program does not
// handle SIGINT or SIGTERM itself: the caller does (and calls Stop).
func Start(w io.Writer, o Options) *Screen {
	s := &Screen{w: w, wake: make(chan struct{}, 1), stop: make(chan struct{}), pumped: make(chan struct{}), done: make(chan struct{})}
	// The size holds where w is not a terminal; on one, bubbletea reads
	// the terminal's size instead.
	opts := []tea.ProgramOption{tea.WithOutput(w), tea.WithoutSignalHandler(), tea.WithWindowSize(defaultWidth, defaultHeight)}
	switch {
	case o.Input != nil:
		opts = append(opts, tea.WithInput(o.Input))
	case isatty.IsTerminal(os.Stdin.Fd()) || ttyOpens():
		// bubbletea's default: standard input when it is a terminal, else
		// /dev/tty.
	default:
		// Without a terminal to read, bubbletea would fail to start.
		opts = append(opts, tea.WithInput(nil))
	}
	s.p = tea.NewProgram(NewModel(o), opts...)
	go func() {
		defer close(s.done)
		m, err := s.p.Run()
		s.model, _ = m.(*Model)
		s.err = err
	}()
	go s.pump()
	return s
}

// ttyOpens reports whether this process has a terminal to read keys from.
func ttyOpens() bool {
	f, err := os.Open("/dev/tty")
	if err != nil {
		return false
	}
	_ = f.Close()
	return true
}

// Event queues ev and m (the manifest after ev; Event keeps a copy, so the
// caller may fold on into m) for the screen. It does not wait for the
// screen. When the program could not run, it prints EventLine instead;
// after the person quit, it does nothing.
func (s *Screen) Event(ev schemas.Event, m *projections.Manifest) {
	select {
	case <-s.done:
		if s.err != nil {
			s.mu.Lock()
			for _, q := range s.queue {
				fmt.Fprintln(s.w, EventLine(q.Event, q.Manifest))
			}
			s.queue = nil
			s.mu.Unlock()
			fmt.Fprintln(s.w, EventLine(ev, m))
		}
		return
	default:
	}
	c := m.Clone()
	s.mu.Lock()
	s.queue = append(s.queue, EventMsg{Event: ev, Manifest: c})
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// pump sends the queued events into the program, at most one batch per
// frame, until Stop (after sending the rest) or the program's end.
func (s *Screen) pump() {
	defer close(s.pumped)
	var last time.Time
	for {
		select {
		case <-s.wake:
		case <-s.stop:
			s.send()
			return
		case <-s.done:
			return
		}
		if wait := frame - time.Since(last); wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-t.C:
			case <-s.stop:
			case <-s.done:
				t.Stop()
				return
			}
			t.Stop()
		}
		s.send()
		last = time.Now()
	}
}

func (s *Screen) send() {
	s.mu.Lock()
	batch := s.queue
	s.queue = nil
	s.mu.Unlock()
	if len(batch) > 0 {
		s.p.Send(EventsMsg(batch))
	}
}

// Stop shows the events queued so far, ends the program (its last frame
// stays on the terminal) and waits until the terminal is restored. It
// returns the program's error, e.g. when the terminal could not be set
// up. It may be called more than once.
func (s *Screen) Stop() error {
	s.once.Do(func() {
		close(s.stop)
		<-s.pumped
		s.p.Send(EndMsg{})
		<-s.done
	})
	return s.err
}

// NewView returns what shows a session's events on w: on a terminal the
// live screen (Start with o), fed by onEvent; otherwise one EventLine per
// event, and o is not used. stop ends the screen after showing what
// onEvent was given and restores the terminal; it may be called more than
// once.
func NewView(w io.Writer, o Options) (onEvent func(schemas.Event, *projections.Manifest), stop func()) {
	if !IsTerminal(w) {
		return func(ev schemas.Event, m *projections.Manifest) {
			fmt.Fprintln(w, EventLine(ev, m))
		}, func() {}
	}
	s := Start(w, o)
	return s.Event, func() {
		if err := s.Stop(); err != nil {
			fmt.Fprintf(w, "live screen: %v\n", err)
		}
	}
}

// IsTerminal reports whether w is a terminal.
func IsTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && (isatty.IsTerminal(f.Fd()) || isatty.IsCygwinTerminal(f.Fd()))
}
