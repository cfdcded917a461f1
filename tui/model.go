package tui

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	tea "charm.land/bubbletea/v2"
	"github.com/loopbus/loopbus/projections"
	"github.com/loopbus/loopbus/schemas"
)

// Signaler sends a signal for the live screen's keys. kind is pause,
// resume, stop or hint; target is "SESSION" or "SESSION/STEP"; message is
// the hint's text (empty for the others). It returns a short text
// saying what became of the signal, shown on the screen's status line.
// The screen calls it off its event loop, so it may block until the
// signal is acknowledged or ctx ends.
type Signaler interface {
	Signal(ctx context.Context, kind, target, message string) (string, error)
}

// Options configure the live screen.
type Options struct {
	// Follow is set for run and wait, which follow a session they run:
	// the screen says q stops following rather than watching.
	Follow bool
	// Signaler sends the signals of the keys p, r, s and h; nil turns
	// them off (the screen says so).
	Signaler Signaler
	// Context bounds the signals sent; nil means context.Background.
	Context context.Context
	// Now is the clock of the durations shown; nil means time.Now.
	Now func() time.Time
	// OnQuit is called, once, when the person quits with q or ctrl-c
	// before the session ended. It must not block.
	OnQuit func()
	// Input is where Start reads keys from; nil means the terminal:
	// standard input when it is one, else /dev/tty, else no keys.
	Input io.Reader
}

// EventMsg is one event of the watched session with the manifest after
// it, for Model.Update. The model keeps Manifest: the sender must not
// change it afterwards (send a clone).
type EventMsg struct {
	Event    schemas.Event
	Manifest *projections.Manifest
}

// EventsMsg is a batch of EventMsg, oldest first.
type EventsMsg []EventMsg

// EndMsg tells the model that watching ended (the session ended or the
// events stopped): it shows the final state and quits.
type EndMsg struct{}

type (
	tickMsg       time.Time
	signalDoneMsg struct {
		kind, target, text string
		err                error
	}
)

// maxTimeline is how many event lines the timeline keeps.
const maxTimeline = 5000

// input modes.
const (
	modeKeys    = iota // keys act
	modeConfirm        // s was pressed: s or y stops
	modeHint           // typing a hint
)

// Model is the live screen of one session as a bubbletea model: the
// session and its steps (one selected; the keys act on it), their state,
// iterations and cost, tools running now, the agents' latest message,
// cost against the budget, recent signals, then a scrollable timeline of
// the session's events and a status line.
//
// Keys: up/down or k/j move the selection between the session and its
// steps; p pauses, r resumes, s asks to stop (s or y confirms), h reads a
// hint (enter sends it as an info signal, esc cancels; a paste is its
// text); pgup/pgdown (or b/f, space) scroll the timeline, home/end go to
// its oldest and newest line; ? shows or hides the keys; q or ctrl-c
// quits (calling Options.OnQuit).
// The program quits by itself when the session completes, fails or is
// stopped by its budget, or on EndMsg, leaving the final state on screen.
type Model struct {
	o      Options
	live   live
	width  int
	height int
	// timeline holds the event lines, newest last; scroll is how many of
	// the newest are hidden below the visible ones.
	timeline []string
	scroll   int
	// selected is 0 for the session, i for the i-th step.
	selected int
	mode     int
	help     bool
	hint     []rune
	// status is the status line: what became of the last signal.
	status string
	// ended is set once the session ended or EndMsg arrived; quit once
	// the person quit.
	ended, quit bool
	// batches counts the EventsMsg taken in.
	batches int
}

// NewModel returns the live screen, empty until the first EventMsg.
func NewModel(o Options) *Model {
	if o.Context == nil {
		o.Context = context.Background()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return &Model{o: o, width: defaultWidth, height: defaultHeight}
}

// The screen's size until the terminal tells its own.
const (
	defaultWidth  = 120
	defaultHeight = 40
)

// Init starts the clock that redraws durations every second.
func (m *Model) Init() tea.Cmd { return tick() }

func tick() tea.Cmd {
	return tea.Tick(time.Second, func(t time.Time) tea.Msg { return tickMsg(t) })
}

// Update takes in events, key presses, pastes, window sizes and signal
// results.
func (m *Model) Update(msg tea.Msg) (tea.Model, tea.Cmd) {
	switch msg := msg.(type) {
	case EventMsg:
		return m, m.events(msg)
	case EventsMsg:
		m.batches++
		return m, m.events(msg...)
	case EndMsg:
		m.ended = true
		return m, tea.Quit
	case tea.WindowSizeMsg:
		// A size of zero comes from an output that is not a terminal: the
		// screen keeps the size it has.
		if msg.Width > 0 && msg.Height > 0 {
			m.width, m.height = msg.Width, msg.Height
			m.scroll = min(m.scroll, m.maxScroll())
		}
	case tickMsg:
		if !m.ended && !m.quit {
			return m, tick()
		}
	case signalDoneMsg:
		if msg.err != nil {
			m.status = fmt.Sprintf("%s %s failed: %v", msg.kind, msg.target, msg.err)
		} else {
			m.status = msg.text
		}
	case tea.KeyPressMsg:
		if m.ended || m.quit {
			return m, nil
		}
		return m, m.key(msg)
	case tea.PasteMsg:
		if m.ended || m.quit {
			return m, nil
		}
		return m, m.paste(msg.Content)
	}
	return m, nil
}

// events folds in evs; at the session's end the program quits.
func (m *Model) events(evs ...EventMsg) tea.Cmd {
	added := 0
	for _, e := range evs {
		if e.Manifest == nil {
			continue
		}
		m.live.fold(e.Event, e.Manifest)
		m.timeline = append(m.timeline, EventLine(e.Event, e.Manifest))
		added++
	}
	if n := len(m.timeline) - maxTimeline; n > 0 {
		m.timeline = append([]string(nil), m.timeline[n:]...)
	}
	if m.scroll > 0 {
		// Keep the lines in view where they are.
		m.scroll = min(m.scroll+added, m.maxScroll())
	}
	m.selected = min(m.selected, len(m.steps()))
	if man := m.live.m; !m.ended && (man.Terminal() || man.StoppedByBudget()) {
		m.ended = true
		m.mode, m.hint = modeKeys, nil
		return tea.Quit
	}
	return nil
}

// key acts on one key press. A key whose text has several characters
// acts one character at a time, as if typed in turn; in a hint it is text.
func (m *Model) key(k tea.KeyPressMsg) tea.Cmd {
	if utf8.RuneCountInString(k.Text) > 1 && m.mode != modeHint {
		return m.typed(k.Text)
	}
	if k.String() == "ctrl+c" {
		return m.leave()
	}
	switch m.mode {
	case modeHint:
		switch k.String() {
		case "enter":
			text := strings.TrimSpace(string(m.hint))
			m.mode, m.hint = modeKeys, nil
			if text == "" {
				m.status = "hint cancelled: it was empty"
				return nil
			}
			return m.signal("hint", text)
		case "esc":
			m.mode, m.hint = modeKeys, nil
			m.status = "hint cancelled"
		case "backspace":
			if len(m.hint) > 0 {
				m.hint = m.hint[:len(m.hint)-1]
			}
		case "ctrl+u":
			m.hint = nil
		default:
			m.addHint(k.Text)
		}
		return nil
	case modeConfirm:
		m.mode = modeKeys
		if s := k.String(); s == "s" || s == "y" {
			return m.signal("stop", "")
		}
		m.status = "stop cancelled"
		return nil
	}
	switch k.String() {
	case "q":
		return m.leave()
	case "?":
		m.help = !m.help
	case "esc":
		m.help = false
	case "up", "k":
		m.selected = max(m.selected-1, 0)
	case "down", "j":
		m.selected = min(m.selected+1, len(m.steps()))
	case "pgup", "b":
		m.scroll = min(m.scroll+m.page(), m.maxScroll())
	case "pgdown", "f", "space":
		m.scroll = max(m.scroll-m.page(), 0)
	case "home":
		m.scroll = m.maxScroll()
	case "end":
		m.scroll = 0
	case "p":
		return m.signal("pause", "")
	case "r":
		return m.signal("resume", "")
	case "s":
		if m.ready() {
			m.mode = modeConfirm
			m.status = ""
		}
	case "h":
		if m.ready() {
			m.mode, m.hint = modeHint, nil
			m.status = ""
		}
	}
	return nil
}

// typed acts on each character of text in turn, until the screen ends.
func (m *Model) typed(text string) tea.Cmd {
	var cmds []tea.Cmd
	for _, r := range text {
		if m.quit || m.ended {
			break
		}
		cmds = append(cmds, m.key(tea.KeyPressMsg{Code: r, Text: string(r)}))
	}
	return tea.Batch(cmds...)
}

// paste takes in pasted text: the hint's text while typing one, else
// keys acting in turn.
func (m *Model) paste(text string) tea.Cmd {
	if m.mode == modeHint {
		m.addHint(text)
		return nil
	}
	return m.typed(text)
}

// addHint appends text to the hint unless the hint would grow past
// schemas.MaxHintBytes.
func (m *Model) addHint(text string) {
	if text != "" && len(string(m.hint))+len(text) <= schemas.MaxHintBytes {
		m.hint = append(m.hint, []rune(text)...)
	}
}

// leave quits at the person's request.
func (m *Model) leave() tea.Cmd {
	m.quit = true
	m.mode, m.hint, m.help = modeKeys, nil, false
	if m.o.OnQuit != nil {
		m.o.OnQuit()
	}
	return tea.Quit
}

// ready reports whether a signal can be sent, else says why on the
// status line.
func (m *Model) ready() bool {
	switch {
	case m.o.Signaler == nil:
		m.status = "signals cannot be sent from here; use loopbus signal"
	case m.live.m == nil:
		m.status = "no event of the session yet"
	default:
		return true
	}
	return false
}

// signal sends kind to the selection, off the event loop.
func (m *Model) signal(kind, message string) tea.Cmd {
	if !m.ready() {
		return nil
	}
	target := m.target()
	m.status = kind + " " + target + ": sending…"
	sig, ctx := m.o.Signaler, m.o.Context
	return func() tea.Msg {
		text, err := sig.Signal(ctx, kind, target, message)
		return signalDoneMsg{kind: kind, target: target, text: text, err: err}
	}
}

// steps are the session's steps in pipeline order.
func (m *Model) steps() []string {
	man := m.live.m
	if man == nil {
		return nil
	}
	out := make([]string, 0, len(man.StepOrder))
	for _, name := range man.StepOrder {
		if man.Steps[name] != nil {
			out = append(out, name)
		}
	}
	return out
}

// target is the selection: "SESSION" or "SESSION/STEP".
func (m *Model) target() string {
	if m.live.m == nil {
		return ""
	}
	if steps := m.steps(); m.selected > 0 && m.selected <= len(steps) {
		return m.live.m.ContentID + "/" + steps[m.selected-1]
	}
	return m.live.m.ContentID
}

// Target is the selection the keys act on: "SESSION", "SESSION/STEP", or
// empty before the first event.
func (m *Model) Target() string { return m.target() }

// Quit reports whether the person quit (q or ctrl-c) before the session
// ended.
func (m *Model) Quit() bool { return m.quit }

// View draws the screen inline (not on the alternate screen, so the last
// frame stays on the terminal): its content is at most as wide and high
// as the terminal, its last line empty.
func (m *Model) View() tea.View {
	return tea.NewView(m.render())
}

// render is the screen's text.
func (m *Model) render() string {
	now := m.o.Now()
	var lines []string
	if m.live.m == nil {
		lines = []string{"waiting for the session's first event…"}
	} else {
		lines = m.top(now)
	}
	bottom := m.bottom()
	if m.help {
		lines = append(lines[:min(len(lines), 1)], "")
		lines = append(lines, helpLines(m.o.Follow)...)
	} else if tl := m.timelineLines(len(lines), len(bottom)); len(tl) > 0 {
		lines = append(append(lines, ""), tl...)
	}
	// The last line stays empty: bubbletea erases it when it ends.
	if room := max(m.height-len(bottom)-1, 1); len(lines) > room {
		lines = lines[:room]
	}
	lines = append(lines, bottom...)
	for i, l := range lines {
		lines[i] = cut(l, m.width)
	}
	return strings.Join(lines, "\n") + "\n"
}

// top is the session, its cost, its steps, running tools, the latest
// agent message and recent signals. The session and each step start with
// "> " when selected.
func (m *Model) top(now time.Time) []string {
	l, man := &m.live, m.live.m
	mark := func(i int) string {
		if i == m.selected && !m.ended {
			return "> "
		}
		return "  "
	}
	var b strings.Builder
	end := now
	if man.Terminal() {
		end = man.UpdatedAt
	}
	fmt.Fprintf(&b, "%s%s  %s  %s  %s\n", mark(0), man.ContentID, man.Pipeline, SessionState(man), Duration(end.Sub(man.CreatedAt).Round(time.Second)))
	if man.Error != "" {
		fmt.Fprintf(&b, "error: %s\n", OneLine(man.Error, 300))
	}
	var spent []string
	if c := costLine(man); c != "" {
		spent = append(spent, "cost "+c)
	}
	if t := tokenLine(man); t != "" {
		spent = append(spent, "tokens "+t)
	}
	if bu := man.Budget; bu != nil && bu.MaxIterations > 0 {
		spent = append(spent, fmt.Sprintf("runs %d of %d", len(man.Jobs), bu.MaxIterations))
	}
	if len(spent) > 0 {
		b.WriteString(strings.Join(spent, " · ") + "\n")
	}
	b.WriteString("\n")
	tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  STEP\tSTATUS\tITER\tCOST\tDETAIL")
	for i, name := range m.steps() {
		st := man.Steps[name]
		cost := ""
		if st.Usage != nil && st.Usage.CostUSD != 0 {
			cost = Money(st.Usage.CostUSD)
		}
		fmt.Fprintf(tw, "%s%s\t%s\t%s\t%s\t%s\n", mark(i+1), name, OneLine(StepState(st, now), 60), iterations(st), cost, OneLine(stepDetail(st), 80))
	}
	_ = tw.Flush()
	if len(l.tools) > 0 {
		b.WriteString("\nrunning tools\n")
		tw = tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
		for _, t := range l.tools {
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\n", t.tag, t.name, OneLine(toolInput(t.input), 60), Duration(now.Sub(t.started).Round(time.Second)))
		}
		_ = tw.Flush()
	}
	if l.message.text != "" {
		fmt.Fprintf(&b, "\nlatest message  %s  %s\n  %s\n", l.message.tag, l.message.at.Local().Format("15:04:05"), OneLine(l.message.text, 300))
	}
	if len(man.Signals) > 0 {
		b.WriteString("\nsignals\n")
		tw = tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
		for _, sg := range man.Signals[max(0, len(man.Signals)-3):] {
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\n", sg.At.Local().Format("15:04:05"), signalName(sg), OneLine(signalText(sg), 40), OneLine(signalAnswer(sg), 60))
		}
		_ = tw.Flush()
	}
	return strings.Split(strings.TrimRight(b.String(), "\n"), "\n")
}

// timelineLines is the timeline's title and its visible lines, in the
// room the other parts leave; none when there is no room for three lines.
func (m *Model) timelineLines(top, bottom int) []string {
	h := m.timelineHeight(top, bottom)
	if h < 3 || len(m.timeline) == 0 {
		return nil
	}
	scroll := min(m.scroll, max(len(m.timeline)-h, 0))
	end := len(m.timeline) - scroll
	start := max(end-h, 0)
	title := "events"
	if scroll > 0 || start > 0 {
		title = fmt.Sprintf("events %d–%d of %d", start+1, end, len(m.timeline))
	}
	if scroll > 0 {
		title += fmt.Sprintf(" · %d newer below (end: newest)", scroll)
	}
	return append([]string{title}, m.timeline[start:end]...)
}

// timelineHeight is how many event lines fit beside top and bottom lines
// of the other parts (a blank line, the title and the empty last line
// aside).
func (m *Model) timelineHeight(top, bottom int) int {
	return m.height - top - bottom - 3
}

// page is how far pgup and pgdown scroll: the visible timeline less a
// line, at least one line.
func (m *Model) page() int {
	top := 1
	if m.live.m != nil {
		top = len(m.top(m.o.Now()))
	}
	return max(m.timelineHeight(top, len(m.bottom()))-1, 1)
}

// maxScroll is the largest scroll that still fills the timeline.
func (m *Model) maxScroll() int {
	top := 1
	if m.live.m != nil {
		top = len(m.top(m.o.Now()))
	}
	return max(len(m.timeline)-max(m.timelineHeight(top, len(m.bottom())), 1), 0)
}

// bottom is the status line and the footer.
func (m *Model) bottom() []string {
	var out []string
	switch {
	case m.mode == modeConfirm:
		out = append(out, "stop "+m.target()+"? press s or y to stop it, any other key cancels")
	case m.mode == modeHint:
		out = append(out, "hint for "+m.target()+": "+string(m.hint)+"▏ (enter sends, esc cancels)")
	case m.status != "":
		out = append(out, m.status)
	}
	footer := ""
	if man := m.live.m; man != nil {
		footer = fmt.Sprintf("stream seq %d · updated %s · ", man.LastSeq, man.UpdatedAt.Local().Format("15:04:05"))
	}
	switch {
	case m.ended:
		footer += "session over"
	case m.quit && m.o.Follow:
		footer += "stopped following"
	case m.quit:
		footer += "stopped watching; the session goes on"
	default:
		verb := "watching"
		if m.o.Follow {
			verb = "following"
		}
		out = append(out, "↑/↓ select · p pause · r resume · s stop · h hint · pgup/pgdn scroll · ? keys · q quit "+verb)
		footer += "keys act on " + OrDash(m.target())
	}
	return append(out, footer)
}

// helpLines list the keys.
func helpLines(follow bool) []string {
	quit := "stop watching (the session goes on)"
	if follow {
		quit = "stop following (loopbus wait SESSION follows it again)"
	}
	return []string{
		"keys (they act on the selected session or step, marked >)",
		"  ↑/↓  k/j       select the session or one of its steps",
		"  p              pause: dispatch nothing new; running jobs finish",
		"  r              resume a paused or stopped session or step",
		"  s then s or y  stop: cancel running jobs (any other key cancels)",
		"  h              type a hint for the next iteration's prompt; enter sends it, esc cancels",
		"  pgup/pgdn b/f  scroll the events; home/end: oldest/newest",
		"  ?  esc         show/hide these keys",
		"  q  ctrl-c      " + quit,
	}
}
