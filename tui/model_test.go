package tui

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	tea "charm.land/bubbletea/v2"
	"github.com/charmbracelet/x/exp/teatest/v2"
	"github.com/loopbus/loopbus/projections"
	"github.com/loopbus/loopbus/schemas"
)

// call is one Signal call the fake signaler saw.
type call struct{ kind, target, message string }

// fakeSignaler records the signals the screen sends and answers them as
// applied (or with err).
type fakeSignaler struct {
	calls chan call
	err   error
}

func newFakeSignaler() *fakeSignaler { return &fakeSignaler{calls: make(chan call, 10)} }

func (f *fakeSignaler) Signal(_ context.Context, kind, target, message string) (string, error) {
	f.calls <- call{kind, target, message}
	if f.err != nil {
		return "", f.err
	}
	return kind + " " + target + ": applied", nil
}

// next is the next call, failing the test after a while without one.
func (f *fakeSignaler) next(t *testing.T) call {
	t.Helper()
	select {
	case c := <-f.calls:
		return c
	case <-time.After(10 * time.Second):
		t.Fatal("no signal sent")
		return call{}
	}
}

// none fails the test if a signal was sent.
func (f *fakeSignaler) none(t *testing.T) {
	t.Helper()
	select {
	case c := <-f.calls:
		t.Fatalf("unexpected signal %+v", c)
	default:
	}
}

// folder folds events into a manifest and makes the messages the screen
// gets: each event with a copy of the manifest after it.
type folder struct {
	m *projections.Manifest
}

func (f *folder) msgs(evs ...schemas.Event) EventsMsg {
	var out EventsMsg
	for _, ev := range evs {
		f.m = projections.FoldManifest(f.m, ev)
		out = append(out, EventMsg{Event: ev, Manifest: f.m.Clone()})
	}
	return out
}

// screenAt is the options of a screen whose clock stands at now.
func screenAt(now time.Time, sig Signaler) Options {
	return Options{Signaler: sig, Now: func() time.Time { return now }}
}

// testScreen is the screen running in a test program, shown on a
// terminal of the same size.
type testScreen struct {
	*teatest.TestModel
	term *terminal
}

// newTestScreen runs the screen of the session e in a test program of
// 100×40 and waits until it shows the session.
func newTestScreen(t *testing.T, e *events, o Options) (*testScreen, *folder) {
	t.Helper()
	tm := teatest.NewTestModel(t, NewModel(o), teatest.WithInitialTermSize(100, 40))
	t.Cleanup(func() { _ = tm.Quit() })
	s := &testScreen{TestModel: tm, term: newTerminal(t, 100, 40)}
	f := &folder{}
	s.Send(f.msgs(e.evs...))
	waitFor(t, s, "s1  p  ")
	return s, f
}

// waitFor waits until the terminal shows all of want.
func waitFor(t *testing.T, s *testScreen, want ...string) {
	t.Helper()
	var screen string
	shows := func() bool {
		b, err := io.ReadAll(s.Output())
		if err != nil {
			t.Fatal(err)
		}
		screen = s.term.show(b)
		for _, w := range want {
			if !strings.Contains(screen, w) {
				return false
			}
		}
		return true
	}
	for deadline := time.Now().Add(10 * time.Second); !shows(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the terminal does not show %q; it shows:\n%s", want, screen)
		}
	}
}

// lastScreen waits for the program's end and returns what the terminal
// shows then.
func lastScreen(t *testing.T, s *testScreen) string {
	t.Helper()
	var b bytes.Buffer
	if _, err := b.ReadFrom(s.FinalOutput(t, teatest.WithFinalTimeout(10*time.Second))); err != nil {
		t.Fatal(err)
	}
	return s.term.show(b.Bytes())
}

// key is the key press named s: a key's name as tea.KeyPressMsg.String
// gives it, or its text.
func key(s string) tea.KeyPressMsg {
	switch s {
	case "up":
		return tea.KeyPressMsg{Code: tea.KeyUp}
	case "down":
		return tea.KeyPressMsg{Code: tea.KeyDown}
	case "enter":
		return tea.KeyPressMsg{Code: tea.KeyEnter}
	case "esc":
		return tea.KeyPressMsg{Code: tea.KeyEscape}
	case "backspace":
		return tea.KeyPressMsg{Code: tea.KeyBackspace}
	case "pgup":
		return tea.KeyPressMsg{Code: tea.KeyPgUp}
	case "pgdown":
		return tea.KeyPressMsg{Code: tea.KeyPgDown}
	case "home":
		return tea.KeyPressMsg{Code: tea.KeyHome}
	case "end":
		return tea.KeyPressMsg{Code: tea.KeyEnd}
	case "ctrl+c":
		return tea.KeyPressMsg{Code: 'c', Mod: tea.ModCtrl}
	case " ":
		return tea.KeyPressMsg{Code: tea.KeySpace, Text: " "}
	}
	if r := []rune(s); len(r) == 1 {
		return tea.KeyPressMsg{Code: r[0], Text: s}
	}
	return tea.KeyPressMsg{Code: tea.KeyExtended, Text: s}
}

func TestKeys(t *testing.T) {
	now := base.Add(time.Minute)

	t.Run("p pauses the selected step, r resumes the session", func(t *testing.T) {
		sig := newFakeSignaler()
		tm, _ := newTestScreen(t, started(), screenAt(now, sig))
		tm.Send(key("j"))
		tm.Send(key("down"))
		waitFor(t, tm, "> b ")
		tm.Send(key("p"))
		if c := sig.next(t); c != (call{"pause", "s1/b", ""}) {
			t.Errorf("p sent %+v, want pause for s1/b", c)
		}
		waitFor(t, tm, "pause s1/b: applied")
		tm.Send(key("k"))
		tm.Send(key("up"))
		tm.Send(key("up")) // stays on the session
		tm.Send(key("r"))
		if c := sig.next(t); c != (call{"resume", "s1", ""}) {
			t.Errorf("r sent %+v, want resume for s1", c)
		}
		waitFor(t, tm, "resume s1: applied")
	})

	t.Run("s stops only when confirmed", func(t *testing.T) {
		sig := newFakeSignaler()
		tm, _ := newTestScreen(t, started(), screenAt(now, sig))
		tm.Send(key("s"))
		waitFor(t, tm, "stop s1? press s or y to stop it, any other key cancels")
		sig.none(t)
		tm.Send(key("x"))
		waitFor(t, tm, "stop cancelled")
		sig.none(t)
		tm.Send(key("j"))
		tm.Send(key("s"))
		waitFor(t, tm, "stop s1/a? press s or y")
		tm.Send(key("y"))
		if c := sig.next(t); c != (call{"stop", "s1/a", ""}) {
			t.Errorf("s y sent %+v, want stop for s1/a", c)
		}
		waitFor(t, tm, "stop s1/a: applied")
		tm.Send(key("s"))
		tm.Send(key("s"))
		if c := sig.next(t); c != (call{"stop", "s1/a", ""}) {
			t.Errorf("s s sent %+v, want stop for s1/a", c)
		}
	})

	t.Run("h sends the typed hint", func(t *testing.T) {
		sig := newFakeSignaler()
		tm, _ := newTestScreen(t, started(), screenAt(now, sig))
		tm.Send(key("j"))
		tm.Send(key("j"))
		tm.Send(key("h"))
		waitFor(t, tm, "hint for s1/b: ")
		// Keys are text while typing: q does not quit, p does not pause.
		tm.Type("quote primary sources")
		tm.Send(key("x"))
		tm.Send(key("backspace"))
		waitFor(t, tm, "hint for s1/b: quote primary sources▏")
		tm.Send(key("enter"))
		if c := sig.next(t); c != (call{"hint", "s1/b", "quote primary sources"}) {
			t.Errorf("h sent %+v, want info for s1/b with the hint", c)
		}
		waitFor(t, tm, "hint s1/b: applied")
		tm.Send(key("h"))
		tm.Type("never mind")
		tm.Send(key("esc"))
		waitFor(t, tm, "hint cancelled")
		sig.none(t)
	})

	t.Run("a key of several characters acts one at a time", func(t *testing.T) {
		sig := newFakeSignaler()
		tm, _ := newTestScreen(t, started(), screenAt(now, sig))
		tm.Send(key("jjjkp"))
		if c := sig.next(t); c != (call{"pause", "s1/b", ""}) {
			t.Errorf("jjjkp sent %+v, want pause for s1/b", c)
		}
		tm.Send(key("hbe brief"))
		waitFor(t, tm, "hint for s1/b: be brief▏")
		tm.Send(tea.PasteMsg{Content: " and kind"})
		tm.Send(key("enter"))
		if c := sig.next(t); c != (call{"hint", "s1/b", "be brief and kind"}) {
			t.Errorf("hint sent %+v", c)
		}
	})

	t.Run("a failed signal says why", func(t *testing.T) {
		sig := newFakeSignaler()
		sig.err = errors.New("connection closed")
		tm, _ := newTestScreen(t, started(), screenAt(now, sig))
		tm.Send(key("p"))
		sig.next(t)
		waitFor(t, tm, "pause s1 failed: connection closed")
	})

	t.Run("without a signaler the keys say so", func(t *testing.T) {
		tm, _ := newTestScreen(t, started(), screenAt(now, nil))
		tm.Send(key("p"))
		waitFor(t, tm, "signals cannot be sent from here")
	})

	t.Run("? shows and hides the keys", func(t *testing.T) {
		tm, _ := newTestScreen(t, started(), screenAt(now, newFakeSignaler()))
		tm.Send(key("?"))
		waitFor(t, tm, "keys (they act on the selected session or step", "s then s or y", "pgup/pgdn")
		tm.Send(key("?"))
		waitFor(t, tm, "STEP")
	})

	t.Run("pgup and pgdown scroll the events", func(t *testing.T) {
		e := started()
		for i := range 100 {
			e.add(schemas.TypeAgentMessage, "a", &schemas.AgentMessage{JobID: "x", Text: fmt.Sprintf("message %03d", i)})
		}
		tm, _ := newTestScreen(t, e, screenAt(now, nil))
		tm.Send(key("pgup"))
		waitFor(t, tm, "newer below", "says: message 06")
		tm.Send(key("end"))
		waitFor(t, tm, "of 101")
	})

	t.Run("q quits; the session goes on", func(t *testing.T) {
		quit := make(chan struct{})
		o := screenAt(now, newFakeSignaler())
		o.OnQuit = func() { close(quit) }
		tm, _ := newTestScreen(t, started(), o)
		tm.Send(key("q"))
		tm.WaitFinished(t, teatest.WithFinalTimeout(10*time.Second))
		<-quit
		if m := tm.FinalModel(t).(*Model); !m.Quit() {
			t.Error("the model does not say the person quit")
		}
		out := lastScreen(t, tm)
		if !strings.Contains(out, "stopped watching; the session goes on") {
			t.Errorf("last screen:\n%s", out)
		}
	})

	t.Run("ctrl-c quits", func(t *testing.T) {
		quit := make(chan struct{})
		o := screenAt(now, nil)
		o.OnQuit = func() { close(quit) }
		tm, _ := newTestScreen(t, started(), o)
		tm.Send(key("ctrl+c"))
		tm.WaitFinished(t, teatest.WithFinalTimeout(10*time.Second))
		<-quit
	})
}

// TestKeysFromTerminalInput types keys into a program's input as a
// terminal sends them: a burst in one write acts one key at a time, and a
// bracketed paste is a hint's text.
func TestKeysFromTerminalInput(t *testing.T) {
	sig := newFakeSignaler()
	in, keys := io.Pipe()
	p := tea.NewProgram(NewModel(screenAt(base.Add(time.Minute), sig)), tea.WithInput(in), tea.WithOutput(io.Discard),
		tea.WithWindowSize(100, 40), tea.WithoutSignalHandler())
	done := make(chan tea.Model, 1)
	go func() {
		m, err := p.Run()
		if err != nil {
			t.Errorf("program: %v", err)
		}
		done <- m
	}()
	t.Cleanup(func() { p.Kill(); _ = keys.Close() })
	// Send returns once the program took the events in, so the keys
	// written next act on the session.
	p.Send((&folder{}).msgs(started().evs...))
	if _, err := keys.Write([]byte("jjjkp")); err != nil {
		t.Fatal(err)
	}
	if c := sig.next(t); c != (call{"pause", "s1/b", ""}) {
		t.Errorf("jjjkp sent %+v, want pause for s1/b", c)
	}
	if _, err := keys.Write([]byte("hbe \x1b[200~brief q\x1b[201~\r")); err != nil {
		t.Fatal(err)
	}
	if c := sig.next(t); c != (call{"hint", "s1/b", "be brief q"}) {
		t.Errorf("hint sent %+v, want info for s1/b with the hint", c)
	}
	if _, err := keys.Write([]byte("q")); err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-done:
		if m, _ := m.(*Model); m == nil || !m.Quit() {
			t.Error("q did not quit")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("q did not end the program")
	}
}

// TestEventsUpdateTheScreen feeds events into a running screen: step
// states, costs and running tools show as they happen, and the program
// ends by itself when the session does.
func TestEventsUpdateTheScreen(t *testing.T) {
	now := base.Add(time.Minute)
	e := started()
	tm, f := newTestScreen(t, e, screenAt(now, nil))
	tm.Send(f.msgs(
		e.add(schemas.TypeJobRequested, "a", &schemas.JobRequested{JobID: "ja1", Step: "a", Iteration: 1}),
		e.add(schemas.TypeJobStarted, "a", &schemas.JobStarted{JobID: "ja1", Worker: "w1"}),
		e.add(schemas.TypeToolStarted, "a", &schemas.ToolStarted{JobID: "ja1", ToolID: "t1", Name: "Bash", Input: `{"command":"make test"}`}),
	))
	waitFor(t, tm, "running tools", "a#1  Bash  make test", "in_progress", "a#1 tool Bash started: make test")
	tm.Send(f.msgs(
		e.add(schemas.TypeToolCompleted, "a", &schemas.ToolCompleted{JobID: "ja1", ToolID: "t1", Name: "Bash", Status: "ok"}),
		e.add(schemas.TypeJobCompleted, "a", &schemas.JobCompleted{JobID: "ja1", Usage: &schemas.Usage{InputTokens: 5000, OutputTokens: 800, CostUSD: 0.03}}),
		e.add(schemas.TypeStepCompleted, "a", &schemas.StepCompleted{JobID: "ja1", Step: "a", Iterations: 1}),
	))
	waitFor(t, tm, "completed  1/3   $0.03", "cost $0.03 of $0.10", "step a completed after 1 iteration, $0.03")
	tm.Send(f.msgs(
		e.add(schemas.TypeStepCompleted, "b", &schemas.StepCompleted{JobID: "jb1", Step: "b", Iterations: 1}),
		e.add(schemas.TypeStepCompleted, "c", &schemas.StepCompleted{JobID: "jc1", Step: "c", Iterations: 1}),
		e.add(schemas.TypeStepCompleted, "d", &schemas.StepCompleted{JobID: "jd1", Step: "d", Iterations: 1}),
		e.add(schemas.TypeSessionCompleted, "", &schemas.SessionCompleted{}),
	))
	tm.WaitFinished(t, teatest.WithFinalTimeout(10*time.Second))
	if out := lastScreen(t, tm); !strings.Contains(out, "session over") {
		t.Errorf("last screen lacks the end:\n%s", out)
	}
	if m := tm.FinalModel(t).(*Model); m.Quit() {
		t.Error("the session's end counted as the person quitting")
	}
}

// view folds evs into a fresh model of w×h and returns it with its view.
func view(t *testing.T, o Options, w, h int, evs []schemas.Event) (*Model, string) {
	t.Helper()
	m := NewModel(o)
	m.Update(tea.WindowSizeMsg{Width: w, Height: h})
	f := &folder{}
	m.Update(f.msgs(evs...))
	return m, m.View().Content
}

// TestView checks the screen's content: running tools until they complete
// or their job ends, the latest message, step states, the budget and
// signals, and that it fits the terminal.
func TestView(t *testing.T) {
	e := controlled()
	e.add(schemas.TypeJobRequested, "d", &schemas.JobRequested{JobID: "jd1", Step: "d", Iteration: 1})
	e.add(schemas.TypeToolStarted, "d", &schemas.ToolStarted{JobID: "jd1", ToolID: "t1", Name: "Bash", Input: `{"command":"make test"}`})
	e.add(schemas.TypeToolStarted, "d", &schemas.ToolStarted{JobID: "jd1", ToolID: "t2", Name: "Read", Input: `{"file_path":"go.mod"}`})
	e.add(schemas.TypeToolCompleted, "d", &schemas.ToolCompleted{JobID: "jd1", ToolID: "t2", Name: "Read", Status: "ok"})
	e.add(schemas.TypeAgentMessage, "d", &schemas.AgentMessage{JobID: "jd1", Text: "Running the tests."})
	now := base.Add(time.Minute)
	// A budget stop ends the watch: the screen leaves its selection.
	m, screen := view(t, screenAt(now, nil), 120, 60, e.evs)
	for _, w := range []string{
		"  s1  p  stopped by the budget: cost $0.105 reached the budget of $0.10  59s\n",
		"cost $0.105 of $0.10 · tokens 45,000 in, 7,000 out (52,000 of 100,000)\n",
		"waiting until 15:00:00 (usage limit)",
		"breaker open: no progress in 3 iterations",
		"running tools\n  d#1  Bash  make test  ",
		"latest message  d#1  ",
		"  Running the tests.\n",
		"stop  enough  ignored: session already stopped",
		"d#1 says: Running the tests.",
		"session over",
	} {
		if !strings.Contains(screen, w) {
			t.Errorf("screen lacks %q:\n%s", w, screen)
		}
	}
	if strings.Contains(screen, "go.mod") && !strings.Contains(screen, "tool Read started: go.mod") {
		t.Errorf("a completed tool is shown running:\n%s", screen)
	}
	if !m.ended {
		t.Error("a budget stop did not end the screen")
	}
	f := &folder{}
	f.msgs(e.evs...)
	m.Update(f.msgs(e.add(schemas.TypeJobFailed, "d", &schemas.JobFailed{JobID: "jd1", Step: "d", Error: "killed", Cancelled: true})))
	if screen := m.View().Content; strings.Contains(screen, "running tools") {
		t.Errorf("tools of an ended job are shown running:\n%s", screen)
	}

	// A small terminal: lines are cut to its width, the view to its height.
	_, screen = view(t, screenAt(now, nil), 40, 12, e.evs)
	lines := strings.Split(screen, "\n")
	if len(lines) > 12 {
		t.Errorf("%d lines on a 12-line terminal:\n%s", len(lines), screen)
	}
	for _, l := range lines {
		if n := len([]rune(l)); n > 40 {
			t.Errorf("line of %d runes on a 40-column terminal: %q", n, l)
		}
	}
}

// TestViewWhileRunning checks the selection mark, the footer and the
// timeline of a running session.
func TestViewWhileRunning(t *testing.T) {
	e := started()
	o := screenAt(base.Add(time.Minute), nil)
	m, screen := view(t, o, 120, 40, e.evs)
	if !strings.Contains(screen, "> s1  p  running") && !strings.Contains(screen, "> s1  p  ") {
		t.Errorf("the session is not selected:\n%s", screen)
	}
	if !strings.Contains(screen, "q quit watching") || !strings.Contains(screen, "stream seq 1 · updated ") {
		t.Errorf("footer:\n%s", screen)
	}
	if !strings.Contains(screen, "\nevents\n") || !strings.Contains(screen, "session s1 started: pipeline p, 4 steps, budget $0.10, 100,000 tokens") {
		t.Errorf("timeline:\n%s", screen)
	}
	for range 10 {
		m.Update(key("j"))
	}
	if got := m.Target(); got != "s1/d" {
		t.Errorf("after moving down past the last step the target is %q, want s1/d", got)
	}
	if !strings.Contains(m.View().Content, "> d ") {
		t.Errorf("step d is not marked:\n%s", m.View().Content)
	}
	o.Follow = true
	if _, screen := view(t, o, 120, 40, e.evs); !strings.Contains(screen, "q quit following") {
		t.Errorf("follow footer:\n%s", screen)
	}
	if screen := NewModel(o).View().Content; !strings.Contains(screen, "waiting for the session's first event") {
		t.Errorf("empty screen:\n%s", screen)
	}
}

// TestScroll checks the timeline's scrolling: pgup shows older lines and
// keeps them in place while events arrive, pgdown and end come back.
func TestScroll(t *testing.T) {
	e := started()
	for i := range 100 {
		e.add(schemas.TypeAgentMessage, "a", &schemas.AgentMessage{JobID: "x", Text: fmt.Sprintf("message %03d", i)})
	}
	m, screen := view(t, screenAt(base, nil), 100, 30, e.evs)
	if !strings.Contains(screen, "message 099") || strings.Contains(screen, "message 050") {
		t.Fatalf("before scrolling:\n%s", screen)
	}
	m.Update(key("pgup"))
	screen = m.View().Content
	if strings.Contains(screen, "says: message 099") || !strings.Contains(screen, "newer below") {
		t.Errorf("after pgup:\n%s", screen)
	}
	visible := screen
	f := &folder{}
	f.msgs(e.evs...)
	m.Update(f.msgs(e.add(schemas.TypeAgentMessage, "a", &schemas.AgentMessage{JobID: "x", Text: "message 100"})))
	if got := timelinePart(m.View().Content); got != timelinePart(visible) {
		t.Errorf("a new event moved the scrolled timeline:\n%s\nwas:\n%s", got, timelinePart(visible))
	}
	for range 100 {
		m.Update(key("pgup"))
	}
	if screen := m.View().Content; !strings.Contains(screen, "session s1 started") || !strings.Contains(screen, "events 1–") {
		t.Errorf("at the top:\n%s", screen)
	}
	m.Update(key("end"))
	if screen := m.View().Content; !strings.Contains(screen, "message 100") || strings.Contains(screen, "newer below") {
		t.Errorf("after end:\n%s", screen)
	}
	m.Update(key("home"))
	m.Update(key("pgdown"))
	m.Update(key(" "))
	if m.scroll >= m.maxScroll() || m.scroll == 0 {
		t.Errorf("pgdown from the top: scroll %d of %d", m.scroll, m.maxScroll())
	}
}

// timelinePart is the event lines of a view, its title aside.
func timelinePart(view string) string {
	lines := strings.Split(view, "\n")
	var out []string
	for _, l := range lines {
		if strings.Contains(l, " says: ") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestScreenBurst feeds a burst of events into Start's program: the sender
// never waits for the screen, the program takes them in a few batches, and
// the last frame shows the end.
func TestScreenBurst(t *testing.T) {
	var out bytes.Buffer
	o := screenAt(base.Add(time.Minute), nil)
	o.Input = &bytes.Buffer{}
	s := Start(&out, o)
	e := started()
	m := projections.FoldManifest(nil, e.evs[0])
	start := time.Now()
	s.Event(e.evs[0], m)
	const n = 2000
	for i := range n {
		ev := e.add(schemas.TypeAgentMessage, "a", &schemas.AgentMessage{JobID: "x", Text: fmt.Sprintf("message %d", i)})
		m = projections.FoldManifest(m, ev)
		s.Event(ev, m)
	}
	end := e.add(schemas.TypeSessionCompleted, "", &schemas.SessionCompleted{})
	m = projections.FoldManifest(m, end)
	s.Event(end, m)
	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	elapsed := time.Since(start)
	if err := s.Stop(); err != nil {
		t.Fatalf("second Stop: %v", err)
	}
	final := s.model
	if final == nil {
		t.Fatal("no final model")
	}
	if got := len(final.timeline); got != n+2 {
		t.Errorf("%d timeline lines, want %d", got, n+2)
	}
	// One batch at once, then one per frame at most, and the rest at Stop.
	if limit := 2 + int(elapsed/frame) + 1; final.batches > limit {
		t.Errorf("%d batches for %d events in %s, want at most %d", final.batches, n+2, elapsed, limit)
	}
	if screen := newTerminal(t, defaultWidth, defaultHeight).show(out.Bytes()); !final.ended || !strings.Contains(screen, "message 1999") || !strings.Contains(screen, "session over") {
		t.Errorf("last frame:\n%s", screen)
	}
	// Events after the end are dropped, not queued.
	s.Event(end, m)
}
