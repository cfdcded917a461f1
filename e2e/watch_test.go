package e2e

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/charmbracelet/x/ansi"
	"github.com/charmbracelet/x/vt"
	"github.com/creack/pty"
	"github.com/loopbus/loopbus/internal/testnats"
)

// watchLine is one line of `watch` without a terminal: local time, then
// what happened.
var watchLine = regexp.MustCompile(`^\d\d:\d\d:\d\d \S.*$`)

// TestWatch drives `loopbus watch` against a `loopbus serve` process: it
// follows a running session live, one plain line per event, to its end
// (exit 0), reports a failed session (exit 1, the reason on stderr), and
// refuses an unknown session (exit 2). On a terminal its live screen sends
// the signals of its keys and leaves the session running on q (exit 130),
// and it ends by itself when the session does.
func TestWatch(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	fakeClaude, err := filepath.Abs(filepath.Join("..", "agent", "claude", "testdata", "fake-claude"))
	if err != nil {
		t.Fatal(err)
	}
	gate := filepath.Join(dir, "gate")
	ttyGate := filepath.Join(dir, "tty-gate")
	writeFiles(t, dir, map[string]string{
		"input.txt": "x\n",
		// build waits for the test to open the gate, so watch is seen
		// following the session while it runs.
		"build.sh": `while [ ! -e "$GATE" ]; do sleep 0.05; done
echo built > "$LOOPBUS_OUTPUT_DIR/built.txt"
`,
		"ok.yaml": `name: watched
steps:
  plan:
    agent: {backend: claude, command: [` + fakeClaude + `]}
    prompt: "Plan from in/{{.Input.Name}} into out/out.txt."
    outputs: [{name: out.txt}]
  build:
    agent: {backend: exec, command: [sh, build.sh], env: {GATE: ` + gate + `}}
    prompt: build
    requires: [plan]
    outputs: [{name: built.txt}]
    timeout: 90s
`,
		"tty.yaml": `name: keyed
steps:
  plan:
    agent: {backend: exec, command: [sh, -c, "echo planned > $LOOPBUS_OUTPUT_DIR/plan.txt"]}
    prompt: plan
    outputs: [{name: plan.txt}]
  build:
    agent: {backend: exec, command: [sh, build.sh], env: {GATE: ` + ttyGate + `}}
    prompt: build
    requires: [plan]
    outputs: [{name: built.txt}]
    timeout: 90s
`,
		"fail.yaml": `name: failing
steps:
  boom:
    agent: {backend: exec, command: [sh, -c, "echo cannot >&2; exit 3"]}
    prompt: x
    outputs: [{name: o.txt}]
    max_iterations: 1
`,
	})
	addr := testnats.FreeAddr(t)
	global := []string{"--nats", "nats://" + addr}
	startService(t, filepath.Join(dir, "serve.log"), testEnv(t), "serve", "--data", t.TempDir(), "--listen", addr, "--log-level", "warn")
	submit := func(t *testing.T, pipeline, session string) {
		t.Helper()
		r := loopbus(t, append([]string{"run", filepath.Join(dir, pipeline), "--input", filepath.Join(dir, "input.txt"), "--session", session, "--detach"}, global...)...)
		if r.code != 0 {
			t.Fatalf("run --detach: exit %d\n%s", r.code, r.stderr)
		}
	}
	checkLines := func(t *testing.T, out string) []string {
		t.Helper()
		if strings.Contains(out, "\x1b[") {
			t.Errorf("watch without a terminal printed escape sequences:\n%q", out)
		}
		lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
		for _, l := range lines {
			if !watchLine.MatchString(l) {
				t.Errorf("line %q is not 'HH:MM:SS what happened'", l)
			}
		}
		return lines
	}

	t.Run("follows a session live to its completion", func(t *testing.T) {
		submit(t, "ok.yaml", "watch-ok")
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, binary, append([]string{"watch", "watch-ok"}, global...)...)
		cmd.Env = testEnv(t)
		var stdout, stderr syncBuffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		eventually(t, 60*time.Second, "watch to show build's agent running", func() bool {
			return strings.Contains(stdout.String(), "build#1 tool sh started")
		})
		if strings.Contains(stdout.String(), "completed in") {
			t.Fatalf("the session ended before the gate opened:\n%s", stdout.String())
		}
		if err := os.WriteFile(gate, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := cmd.Wait(); err != nil {
			t.Fatalf("watch: %v\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
		}
		lines := checkLines(t, stdout.String())
		// One line per event of the session.
		if n := len(events(t, global, "watch-ok")); len(lines) != n {
			t.Errorf("%d lines for %d events:\n%s", len(lines), n, stdout.String())
		}
		want := []string{
			"session watch-ok started: pipeline watched, 2 steps",
			"plan#1 queued",
			"plan#1 tool Bash started: ls -la",
			"plan#1 says: Wrote out.txt.",
			"plan#1 agent done after",
			"step plan completed after 1 iteration, $0.0421",
			"build#1 tool sh started: sh ",
			"build#1 validation passed",
			"step build completed after 1 iteration",
			"session watch-ok completed in ",
		}
		at := 0
		for _, w := range want {
			i := at
			for i < len(lines) && !strings.Contains(lines[i], w) {
				i++
			}
			if i == len(lines) {
				t.Fatalf("no line with %q after line %d:\n%s", w, at, stdout.String())
			}
			at = i + 1
		}
		if last := lines[len(lines)-1]; !strings.HasSuffix(last, ", $0.0421") {
			t.Errorf("last line %q does not end with the session's cost", last)
		}

		// status shows the cost per step and in all.
		st := loopbus(t, append([]string{"status", "watch-ok"}, global...)...)
		if st.code != 0 || !regexp.MustCompile(`(?m)^cost +\$0\.0421$`).MatchString(st.stdout) ||
			!regexp.MustCompile(`(?m)^plan +completed +1/1 +46\.7k/135 +\$0\.0421 `).MatchString(st.stdout) {
			t.Errorf("status: exit %d\n%s%s", st.code, st.stdout, st.stderr)
		}
	})

	t.Run("a failed session exits 1 with the reason", func(t *testing.T) {
		submit(t, "fail.yaml", "watch-fail")
		r := loopbus(t, append([]string{"watch", "watch-fail"}, global...)...)
		if r.code != 1 {
			t.Fatalf("watch: exit %d, want 1\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
		}
		reason := "step boom failed: no valid output after 1 of 1 iterations"
		if !strings.Contains(r.stderr, "session watch-fail failed: "+reason) {
			t.Errorf("stderr lacks the reason:\n%s", r.stderr)
		}
		lines := checkLines(t, r.stdout)
		if !strings.Contains(r.stdout, "boom#1 agent failed (exit 3)") || !strings.Contains(lines[len(lines)-1], "session watch-fail failed: "+reason) {
			t.Errorf("stdout:\n%s", r.stdout)
		}
	})

	t.Run("on a terminal the keys signal the session", func(t *testing.T) {
		submit(t, "tty.yaml", "watch-tty")
		// watch in a pseudo-terminal until build runs, then: select build
		// (the second step), pause and resume it, send a hint, quit.
		tty := startInTerminal(t, append([]string{"watch", "watch-tty"}, global...)...)
		tty.waitFor(t, "build#1 tool sh started")
		tty.press(t, "j", "j", "p")
		tty.waitFor(t, "pause watch-tty/build: applied")
		tty.press(t, "r")
		tty.waitFor(t, "resume watch-tty/build: applied")
		tty.press(t, "h")
		tty.waitFor(t, "hint for watch-tty/build: ")
		tty.press(t, "be brief", "\r")
		tty.waitFor(t, "hint watch-tty/build: ")
		tty.press(t, "s")
		tty.waitFor(t, "stop watch-tty/build? press s or y")
		tty.press(t, "n", "?")
		tty.waitFor(t, "keys (they act on the selected session or step")
		tty.press(t, "q")
		if code := tty.wait(t); code != 130 {
			t.Fatalf("watch quit with q: exit %d, want 130\n%s", code, tty.screen.String())
		}
		var pause, resume, info, stop int
		for _, ev := range events(t, global, "watch-tty") {
			switch {
			case ev.Type == "loopbus.signal.pause" && ev.Step == "build":
				pause++
			case ev.Type == "loopbus.signal.resume" && ev.Step == "build":
				resume++
			case ev.Type == "loopbus.signal.info" && ev.Step == "build" && strings.Contains(string(ev.Data), `"be brief"`):
				info++
			case ev.Type == "loopbus.signal.stop":
				stop++
			}
		}
		if pause != 1 || resume != 1 || info != 1 || stop != 0 {
			t.Errorf("signals in the stream: %d pause, %d resume, %d info, %d stop; want 1, 1, 1, 0", pause, resume, info, stop)
		}

		// The session went on: watched again, the screen ends with it.
		tty = startInTerminal(t, append([]string{"watch", "watch-tty"}, global...)...)
		tty.waitFor(t, "build#1 tool sh started")
		if err := os.WriteFile(ttyGate, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		if code := tty.wait(t); code != 0 {
			t.Fatalf("watch to the end: exit %d, want 0\n%s", code, tty.screen.String())
		}
		if out := tty.screen.String(); !strings.Contains(out, "session watch-tty completed in ") || !strings.Contains(out, "session over") {
			t.Errorf("the last screen does not show the end:\n%s", out)
		}
	})

	t.Run("an unknown session is a usage error", func(t *testing.T) {
		r := loopbus(t, append([]string{"watch", "no-such-session"}, global...)...)
		if r.code != 2 || !strings.Contains(r.stderr, "no such session: no-such-session") || r.stdout != "" {
			t.Errorf("watch: exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
		}
	})
}

// ptyCommand is a loopbus command running in a pseudo-terminal of 120×40.
type ptyCommand struct {
	cmd    *exec.Cmd
	pty    *os.File
	screen *screen
	read   chan struct{}
}

// startInTerminal runs loopbus with args in a new pseudo-terminal, shown
// on a terminal emulator that answers the program's queries.
func startInTerminal(t *testing.T, args ...string) *ptyCommand {
	t.Helper()
	cmd := exec.Command(binary, args...)
	cmd.Env = append(testEnv(t), "TERM=xterm-256color")
	f, err := pty.StartWithSize(cmd, &pty.Winsize{Rows: 40, Cols: 120})
	if err != nil {
		t.Fatal(err)
	}
	tt := &ptyCommand{cmd: cmd, pty: f, screen: newScreen(120, 40, f), read: make(chan struct{})}
	go func() {
		defer close(tt.read)
		buf := make([]byte, 32<<10)
		for {
			n, err := f.Read(buf)
			tt.screen.write(buf[:n])
			if err != nil {
				return
			}
		}
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		_ = f.Close()
		<-tt.read
		tt.screen.close()
	})
	return tt
}

// waitFor waits until the terminal shows s.
func (tt *ptyCommand) waitFor(t *testing.T, s string) {
	t.Helper()
	// Longer than the screen's wait for an acknowledgement (45 s), so a
	// slow orchestrator on a loaded machine shows "applied", not a timeout.
	deadline := time.Now().Add(90 * time.Second)
	for !strings.Contains(tt.screen.String(), s) {
		if time.Now().After(deadline) {
			t.Fatalf("the terminal does not show %q; it shows:\n%s", s, tt.screen.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// press types keys, each as one write.
func (tt *ptyCommand) press(t *testing.T, keys ...string) {
	t.Helper()
	for _, k := range keys {
		if _, err := tt.pty.WriteString(k); err != nil {
			t.Fatal(err)
		}
	}
}

// wait waits for the command to exit and returns its exit code.
func (tt *ptyCommand) wait(t *testing.T) int {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- tt.cmd.Wait() }()
	select {
	case err := <-done:
		// The terminal shows all the output once the reader hit its end.
		select {
		case <-tt.read:
		case <-time.After(time.Minute):
			t.Fatal("the terminal's output does not end")
		}
		var ee *exec.ExitError
		switch {
		case err == nil:
			return 0
		case errors.As(err, &ee):
			return ee.ExitCode()
		}
		t.Fatal(err)
	case <-time.After(2 * time.Minute):
		t.Fatalf("still running:\n%s", tt.screen.String())
	}
	return -1
}

// screen is a terminal emulator showing a program's output as a person
// sees it (the program sends only what changed since its last frame). It
// answers the program's queries, as a terminal does, on answers.
type screen struct {
	mu      sync.Mutex
	emu     *vt.Emulator
	done    chan struct{}
	drained chan struct{}
}

func newScreen(w, h int, answers io.Writer) *screen {
	s := &screen{emu: vt.NewEmulator(w, h), done: make(chan struct{}), drained: make(chan struct{})}
	go func() {
		defer close(s.drained)
		buf := make([]byte, 1024)
		for {
			n, err := s.emu.Read(buf)
			if err != nil {
				return
			}
			select {
			case <-s.done:
				return
			default:
			}
			_, _ = answers.Write(buf[:n])
		}
	}()
	return s
}

// write takes in the program's output.
func (s *screen) write(p []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, _ = s.emu.Write(p)
}

// String is the text the terminal shows.
func (s *screen) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.emu.String()
}

// close stops answering once the output was taken in.
func (s *screen) close() {
	close(s.done)
	// A query's answer wakes the reader to see done. (Closing the emulator
	// while it reads would race inside it.)
	s.write([]byte(ansi.RequestModeSynchronizedOutput))
	<-s.drained
}

// TestWatchScreenLeavesOtherCommandsAlone runs `loopbus --help` on a
// terminal that answers nothing: the live screen's library must not ask
// the terminal anything when the program starts (a query would make every
// command wait seconds for an answer and could eat keys typed ahead).
func TestWatchScreenLeavesOtherCommandsAlone(t *testing.T) {
	t.Parallel()
	cmd := exec.Command(binary, "--help")
	cmd.Env = append(testEnv(t), "TERM=xterm-256color")
	f, err := pty.StartWithSize(cmd, &pty.Winsize{Rows: 40, Cols: 120})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := make(chan []byte, 1)
	go func() {
		// The output ends (EIO) once the command exited.
		b, _ := io.ReadAll(f)
		out <- b
	}()
	var got []byte
	select {
	case got = <-out:
	case <-time.After(time.Minute):
		_ = cmd.Process.Kill()
		t.Fatal("loopbus --help does not end")
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("loopbus --help: %v\n%q", err, got)
	}
	if i := bytes.IndexByte(got, 0x1b); i >= 0 {
		t.Errorf("loopbus --help wrote an escape sequence to the terminal: %q", got[i:min(len(got), i+20)])
	}
	if !bytes.Contains(got, []byte("Usage:")) {
		t.Errorf("no usage:\n%s", got)
	}
}
