package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/loopbus/loopbus/client"
	"github.com/loopbus/loopbus/projections"
	"github.com/loopbus/loopbus/schemas"
	"github.com/mattn/go-isatty"
	"github.com/rs/zerolog"
	"github.com/spf13/cobra"
)

func newWatchCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "watch SESSION",
		Short: "Watch a session live: steps, running tools, cost, waits, breakers and signals",
		Long: `Watch a session live from the event stream, from its start.

On a terminal the screen is redrawn as events arrive (at most ten times a
second): steps with their state, iterations and cost, tools running now, the
agents' latest message, the cost against the budget and recent signals.
Otherwise one line is printed per event.

Exits 0 when the session completes, 1 when it fails and 3 when its budget
stops it (the reason on stderr). A paused session, or one stopped by a
signal, is watched on until it ends or Ctrl-C.
watch only reads: it runs none of the services that work on the session.`,
		Example: `  loopbus watch kit-1
  loopbus watch kit-1 --nats nats://127.0.0.1:4222 | grep tool`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			session := args[0]
			if err := schemas.ValidateSessionID(session); err != nil {
				return usageErr(err)
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			c, err := g.connect(ctx, "watch", g.logger(zerolog.WarnLevel), false)
			if err != nil {
				return err
			}
			defer c.close(g.stderr)
			if last, err := c.bus.SessionLastSeq(ctx, session); err != nil {
				return err
			} else if last == 0 {
				return usageErr(fmt.Errorf("%w: %s", client.ErrNoSession, session))
			}
			return g.watch(ctx, c, session)
		},
	}
}

// watch shows a session until it ends or ctx does.
func (g *globals) watch(ctx context.Context, c *conn, session string) error {
	if c.ownsServer() {
		// Nothing but this command serves the data directory, so nothing
		// will move an unfinished session on.
		if m, err := client.Status(ctx, c.bus, session); err == nil && !m.Terminal() {
			fmt.Fprintf(g.stderr, "no loopbus server runs on this data directory: session %s progresses only while 'loopbus serve' or 'loopbus wait %s' runs\n", session, session)
		}
	}
	view, stopView := newView(g.stdout, false)
	m, err := client.Watch(ctx, c.bus, session, view)
	stopView()
	switch {
	case ctx.Err() != nil:
		return errInterrupted
	case err != nil:
		return err
	}
	return sessionEnd(g.stderr, m)
}

// sessionEnd is how watching a session ended: nil when it completed,
// errFailed when it failed, errStopped when its budget stopped it; the
// reason goes to w.
func sessionEnd(w io.Writer, m *projections.Manifest) error {
	switch {
	case m.Status == projections.StatusFailed:
		fmt.Fprintf(w, "session %s failed: %s\n", m.ContentID, m.Error)
		return errFailed
	case m.StoppedByBudget():
		fmt.Fprintf(w, "session %s stopped: %s\n", m.ContentID, m.Hold.Reason)
		return errStopped
	}
	return nil
}

// followView is what run and wait show while they follow a session: the
// live screen when w is a terminal, else the progress lines they always
// printed. stop draws the last screen; it may be called more than once.
func followView(w io.Writer) (onEvent func(schemas.Event, *projections.Manifest), stop func()) {
	if !isTerminal(w) {
		return client.NewProgress(w).Event, func() {}
	}
	return newView(w, true)
}

// newView returns the live screen on a terminal w, or plain lines. For
// run and wait (follow), the screen says how to leave them.
func newView(w io.Writer, follow bool) (onEvent func(schemas.Event, *projections.Manifest), stop func()) {
	if !isTerminal(w) {
		return func(ev schemas.Event, m *projections.Manifest) {
			fmt.Fprintln(w, plainLine(ev, m))
		}, func() {}
	}
	s := newScreen(w, follow, termWidth())
	var once sync.Once
	return s.event, func() { once.Do(s.close) }
}

// newScreen starts redrawing on w; close stops it.
func newScreen(w io.Writer, follow bool, width int) *screen {
	s := &screen{w: w, live: &live{}, follow: follow, width: width, done: make(chan struct{})}
	go s.loop()
	return s
}

// isTerminal reports whether w is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && (isatty.IsTerminal(f.Fd()) || isatty.IsCygwinTerminal(f.Fd()))
}

// termWidth is the terminal's width from $COLUMNS, else 120.
func termWidth() int {
	if n, err := strconv.Atoi(os.Getenv("COLUMNS")); err == nil && n >= 40 {
		return n
	}
	return 120
}

// live is what a watcher shows beyond the manifest, folded from the same
// events: tools started and not completed, and the agents' latest message.
type live struct {
	m *projections.Manifest
	// tools are the running tools by job and tool id, in start order.
	tools []tool
	// message is the newest agent.message.
	message struct {
		tag  string
		text string
		at   time.Time
	}
}

type tool struct {
	job, id, tag, name, input string
	started                   time.Time
}

// fold takes in ev, after m (the manifest so far) folded it.
func (l *live) fold(ev schemas.Event, m *projections.Manifest) {
	l.m = m
	switch d := ev.Data.(type) {
	case *schemas.ToolStarted:
		l.tools = append(l.tools, tool{job: d.JobID, id: d.ToolID, tag: jobTag(m, d.JobID, ev.Step), name: d.Name, input: d.Input, started: ev.Time})
	case *schemas.ToolCompleted:
		l.tools = slices.DeleteFunc(l.tools, func(t tool) bool { return t.job == d.JobID && t.id == d.ToolID })
	case *schemas.AgentMessage:
		l.message.tag, l.message.text, l.message.at = jobTag(m, d.JobID, ev.Step), d.Text, ev.Time
	case *schemas.JobCompleted:
		l.dropTools(d.JobID)
	case *schemas.JobFailed:
		l.dropTools(d.JobID)
	case *schemas.JobCancelled:
		l.dropTools(d.JobID)
	}
	if m != nil && m.Terminal() {
		l.tools = nil
	}
}

// dropTools forgets a finished job's tools: a killed agent reports no end.
func (l *live) dropTools(job string) {
	l.tools = slices.DeleteFunc(l.tools, func(t tool) bool { return t.job == job })
}

// jobTag names a job's run for people: "step#iteration".
func jobTag(m *projections.Manifest, job, step string) string {
	if m != nil {
		if j := m.Jobs[job]; j != nil {
			return j.Step + "#" + strconv.Itoa(j.Iteration)
		}
	}
	if step != "" {
		return step
	}
	return "job " + shortID(job)
}

func shortID(id string) string { return id[:min(len(id), 8)] }

// plainLine is the line for one event when watching without a terminal:
// the event's local time, then what happened, e.g.
// "15:04:05 outline#2 tool Bash started: ls -la".
func plainLine(ev schemas.Event, m *projections.Manifest) string {
	return ev.Time.Local().Format("15:04:05") + " " + describe(ev, m)
}

// describe says what ev means, in one line; m is the manifest after it.
func describe(ev schemas.Event, m *projections.Manifest) string {
	tag := func(job string) string { return jobTag(m, job, ev.Step) }
	switch d := ev.Data.(type) {
	case *schemas.SessionStarted:
		s := fmt.Sprintf("session %s started: pipeline %s, %s", ev.Session, d.Pipeline.Name, plural(len(d.Pipeline.Steps), "step"))
		if b := budgetText(m); b != "" {
			s += ", budget " + b
		}
		return s
	case *schemas.JobRequested:
		s := d.Step + "#" + strconv.Itoa(d.Iteration) + " queued"
		var notes []string
		if d.Round > 0 {
			notes = append(notes, "round "+strconv.Itoa(d.Round))
		}
		if len(d.Hints) > 0 {
			notes = append(notes, "with "+plural(len(d.Hints), "hint"))
		}
		if len(d.Feedback) > 0 {
			notes = append(notes, "with feedback")
		}
		if len(notes) > 0 {
			s += " (" + strings.Join(notes, ", ") + ")"
		}
		return s
	case *schemas.JobStarted:
		s := tag(d.JobID) + " running on " + d.Worker
		if d.Delivery > 1 {
			s += fmt.Sprintf(" (delivery %d: an earlier worker did not finish)", d.Delivery)
		}
		return s
	case *schemas.ToolStarted:
		s := tag(d.JobID) + " tool " + d.Name + " started"
		if in := oneLine(toolInput(d.Input), 100); in != "" {
			s += ": " + in
		}
		return s
	case *schemas.ToolCompleted:
		s := tag(d.JobID) + " tool " + d.Name + " " + d.Status
		if d.Status != "ok" && d.ExitCode != 0 {
			s += fmt.Sprintf(" (exit %d)", d.ExitCode)
		}
		s += " after " + duration(time.Duration(d.DurationMs)*time.Millisecond)
		if msg := d.Error; msg != "" || d.Status != "ok" {
			if msg == "" {
				msg = d.Output
			}
			if msg = oneLine(msg, 100); msg != "" {
				s += ": " + msg
			}
		}
		return s
	case *schemas.AgentMessage:
		return tag(d.JobID) + " says: " + oneLine(d.Text, 160)
	case *schemas.ArtifactStored:
		return fmt.Sprintf("%s stored %s (%d bytes)", tag(d.JobID), d.Artifact.Name, d.Artifact.Size)
	case *schemas.JobCompleted:
		return tag(d.JobID) + " agent done after " + duration(time.Duration(d.DurationMs)*time.Millisecond) + usageText(d.Usage)
	case *schemas.JobFailed:
		switch {
		case d.Cancelled:
			return tag(d.JobID) + " agent killed: the job was cancelled" + usageText(d.Usage)
		case d.RateLimited:
			s := tag(d.JobID) + " agent hit a usage or rate limit"
			if d.ResetAt != nil {
				s += " (lifts at " + clock(*d.ResetAt, ev.Time) + ")"
			}
			// The worker's message says so too.
			msg := strings.TrimPrefix(d.Error, "the agent hit a usage or rate limit: ")
			return s + ": " + oneLine(msg, 120) + usageText(d.Usage)
		}
		return fmt.Sprintf("%s agent failed (exit %d): %s", tag(d.JobID), d.ExitCode, oneLine(d.Error, 120)) + usageText(d.Usage)
	case *schemas.JobCancelled:
		return tag(d.JobID) + " job cancelled: " + oneLine(d.Reason, 120)
	case *schemas.Verdict:
		if ev.Type == schemas.TypeValidationPassed {
			return tag(d.JobID) + " validation passed"
		}
		msgs := make([]string, 0, len(d.Errors))
		for _, e := range d.Errors {
			msgs = append(msgs, e.String())
		}
		return tag(d.JobID) + " validation failed: " + oneLine(strings.Join(msgs, "; "), 160)
	case *schemas.StepCompleted:
		s := "step " + d.Step + " completed after " + plural(d.Iterations, "iteration")
		if st := m.Steps[d.Step]; st != nil && st.Usage != nil && st.Usage.CostUSD != 0 {
			s += ", " + money(st.Usage.CostUSD)
		}
		return s
	case *schemas.StepFailed:
		return "step " + d.Step + " failed after " + plural(d.Iterations, "iteration") + ": " + oneLine(d.Error, 160)
	case *schemas.StepWaiting:
		st := projections.StepView{Status: projections.StepStatusWaiting, Wait: &projections.Wait{Until: d.Until, Reason: d.Reason}}
		return "step " + d.Step + " " + stepState(&st, ev.Time)
	case *schemas.StepPaused:
		st := projections.StepView{Status: projections.StepStatusPaused, Hold: &projections.Hold{Kind: d.Kind, Reason: d.Reason}}
		switch d.Kind {
		case schemas.PauseStop:
			st.Status = projections.StepStatusStopped
		case schemas.PauseBreaker:
			st.Status = projections.StepStatusBreaker
		}
		return "step " + d.Step + " " + oneLine(stepState(&st, ev.Time), 200)
	case *schemas.StepResumed:
		return "step " + d.Step + " resumed" + reasonText(d.Reason)
	case *schemas.StepInvalidated:
		s := "step " + d.Step + " invalidated"
		if d.Cause != "" && d.Cause != d.Step {
			s += " (by " + d.Cause + ")"
		}
		return s + reasonText(d.Reason) + "; it runs again from iteration 1"
	case *schemas.SessionPaused, *schemas.SessionStopped:
		return "session " + sessionState(m)
	case *schemas.SessionResumed:
		return "session resumed" + reasonText(d.Reason)
	case *schemas.Signal:
		s := "signal " + strings.TrimPrefix(ev.Type, "loopbus.signal.")
		if d.Step != "" {
			s += " for " + d.Step
		}
		if t := signalText(projections.SignalView{Reason: d.Reason, Message: d.Message}); t != "" {
			s += ": " + oneLine(t, 120)
		}
		return s
	case *schemas.SignalAcknowledged:
		s := "signal " + d.Signal
		if d.Step != "" {
			s += " for " + d.Step
		}
		return s + " " + signalAnswer(projections.SignalView{Result: d.Result, Detail: d.Detail})
	case *schemas.SessionCompleted:
		s := fmt.Sprintf("session %s completed in %s", ev.Session, duration(ev.Time.Sub(m.CreatedAt)))
		if c := costLine(m); c != "" {
			s += ", " + c
		}
		return s
	case *schemas.SessionFailed:
		return fmt.Sprintf("session %s failed: %s", ev.Session, oneLine(d.Reason, 200))
	}
	return strings.TrimPrefix(ev.Type, "loopbus.")
}

// toolInput is what a tool was given, for people: an agent's JSON tool
// input shows its command, path, pattern, URL or query when it has one
// ({"command":"ls -la"} shows as ls -la); other input as it is.
func toolInput(in string) string {
	var fields map[string]any
	if !strings.HasPrefix(strings.TrimSpace(in), "{") || json.Unmarshal([]byte(in), &fields) != nil {
		return in
	}
	for _, k := range []string{"command", "cmd", "file_path", "path", "pattern", "url", "query", "prompt", "description"} {
		switch v := fields[k].(type) {
		case string:
			if v != "" {
				return v
			}
		case []any: // codex gives argv
			parts := make([]string, 0, len(v))
			for _, p := range v {
				parts = append(parts, fmt.Sprint(p))
			}
			return strings.Join(parts, " ")
		}
	}
	return in
}

// reasonText is ": reason", or nothing for no reason.
func reasonText(reason string) string {
	if reason = oneLine(reason, 120); reason != "" {
		return ": " + reason
	}
	return ""
}

// usageText is ", 5.1k in / 830 out tokens, $0.0312", or nothing.
func usageText(u *schemas.Usage) string {
	if u == nil || *u == (schemas.Usage{}) {
		return ""
	}
	s := ", " + shortTokens(u.InputTokens) + " in / " + shortTokens(u.OutputTokens) + " out tokens"
	if u.CostUSD != 0 {
		s += ", " + money(u.CostUSD)
	}
	return s
}

// budgetText is the session's budget: "$0.50, 100,000 tokens, 12 runs".
func budgetText(m *projections.Manifest) string {
	if m == nil || m.Budget == nil {
		return ""
	}
	var parts []string
	if b := m.Budget; b.MaxCostUSD > 0 {
		parts = append(parts, money(b.MaxCostUSD))
	}
	if b := m.Budget; b.MaxTokens > 0 {
		parts = append(parts, thousands(b.MaxTokens)+" tokens")
	}
	if b := m.Budget; b.MaxIterations > 0 {
		parts = append(parts, plural(b.MaxIterations, "run"))
	}
	return strings.Join(parts, ", ")
}

// duration rounds d for people: 850ms, 41.3s, 2m05s, 1h02m.
func duration(d time.Duration) string {
	switch {
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Minute:
		return d.Round(100 * time.Millisecond).String()
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
	}
	return fmt.Sprintf("%dh%02dm", int(d.Hours()), int(d.Minutes())%60)
}

// screen redraws the live view of a session on a terminal: at once for
// the first event after a quiet tenth of a second, otherwise at most every
// tenth of a second, and every second for the clocks.
type screen struct {
	mu     sync.Mutex
	w      io.Writer
	live   *live
	follow bool
	width  int
	dirty  bool
	// cleared is set once the first frame cleared the screen; later
	// frames overwrite in place, which does not flicker.
	cleared bool
	drawn   time.Time
	done    chan struct{}
}

const redrawEvery = 100 * time.Millisecond

func (s *screen) event(ev schemas.Event, m *projections.Manifest) {
	// The caller folds on into m after this returns, while the redraw
	// loop may read the screen's copy: keep one of our own.
	m = m.Clone()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.live.fold(ev, m)
	s.dirty = true
	if time.Since(s.drawn) >= redrawEvery {
		s.drawLocked(time.Now())
	}
}

func (s *screen) loop() {
	t := time.NewTicker(redrawEvery)
	defer t.Stop()
	for {
		select {
		case <-s.done:
			return
		case now := <-t.C:
			s.mu.Lock()
			if s.live.m != nil && (s.dirty || now.Sub(s.drawn) >= time.Second) {
				s.drawLocked(now)
			}
			s.mu.Unlock()
		}
	}
}

// close stops the redraws after drawing the last state.
func (s *screen) close() {
	close(s.done)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.live.m != nil {
		s.drawLocked(time.Now())
	}
}

func (s *screen) drawLocked(now time.Time) {
	s.dirty, s.drawn = false, now
	var b strings.Builder
	b.WriteString("\x1b[H") // home; each line then clears its rest
	if !s.cleared {
		b.WriteString("\x1b[2J")
		s.cleared = true
	}
	for _, line := range strings.Split(strings.TrimRight(render(s.live, now, s.follow), "\n"), "\n") {
		b.WriteString(cut(line, s.width))
		b.WriteString("\x1b[K\n")
	}
	b.WriteString("\x1b[J") // and below the last line
	_, _ = io.WriteString(s.w, b.String())
}

// cut shortens line to width runes.
func cut(line string, width int) string {
	r := []rune(line)
	if len(r) <= width {
		return line
	}
	return string(r[:width-1]) + "…"
}

// render is the live screen: the session, its cost, its steps, running
// tools, the latest agent message and recent signals.
func render(l *live, now time.Time, follow bool) string {
	m := l.m
	var b strings.Builder
	end := now
	if m.Terminal() {
		end = m.UpdatedAt
	}
	fmt.Fprintf(&b, "%s  %s  %s  %s\n", m.ContentID, m.Pipeline, sessionState(m), duration(end.Sub(m.CreatedAt).Round(time.Second)))
	if m.Error != "" {
		fmt.Fprintf(&b, "error: %s\n", oneLine(m.Error, 300))
	}
	var spent []string
	if c := costLine(m); c != "" {
		spent = append(spent, "cost "+c)
	}
	if t := tokenLine(m); t != "" {
		spent = append(spent, "tokens "+t)
	}
	if bu := m.Budget; bu != nil && bu.MaxIterations > 0 {
		spent = append(spent, fmt.Sprintf("runs %d of %d", len(m.Jobs), bu.MaxIterations))
	}
	if len(spent) > 0 {
		b.WriteString(strings.Join(spent, " · ") + "\n")
	}
	b.WriteString("\n")
	tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "STEP\tSTATUS\tITER\tCOST\tDETAIL")
	for _, name := range m.StepOrder {
		st := m.Steps[name]
		if st == nil {
			continue
		}
		cost := ""
		if st.Usage != nil && st.Usage.CostUSD != 0 {
			cost = money(st.Usage.CostUSD)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", name, oneLine(stepState(st, now), 60), iterations(st), cost, oneLine(stepDetail(st), 80))
	}
	_ = tw.Flush()
	if len(l.tools) > 0 {
		b.WriteString("\nrunning tools\n")
		tw = tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
		for _, t := range l.tools {
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\n", t.tag, t.name, oneLine(toolInput(t.input), 60), duration(now.Sub(t.started).Round(time.Second)))
		}
		_ = tw.Flush()
	}
	if l.message.text != "" {
		fmt.Fprintf(&b, "\nlatest message  %s  %s\n  %s\n", l.message.tag, l.message.at.Local().Format("15:04:05"), oneLine(l.message.text, 300))
	}
	if len(m.Signals) > 0 {
		b.WriteString("\nsignals\n")
		tw = tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
		for _, sg := range m.Signals[max(0, len(m.Signals)-3):] {
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\n", sg.At.Local().Format("15:04:05"), signalName(sg), oneLine(signalText(sg), 40), oneLine(signalAnswer(sg), 60))
		}
		_ = tw.Flush()
	}
	quit := "Ctrl-C to stop watching"
	if follow {
		quit = "Ctrl-C to stop following"
	}
	fmt.Fprintf(&b, "\nstream seq %d · updated %s · %s\n", m.LastSeq, m.UpdatedAt.Local().Format("15:04:05"), quit)
	return b.String()
}
