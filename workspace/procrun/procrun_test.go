package procrun

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/loopbus/loopbus/internal/testcpu"
)

// want describes the expected Result of a run; empty fields are not checked
// unless noted.
type want struct {
	exitCode     int
	stdout       string // exact Stdout when checkStdout
	checkStdout  bool
	tailPrefix   string
	tailSuffix   string
	tailContains string
	tailMaxLen   int // in bytes, 0: unchecked
	timedOut     bool
	canceled     bool
}

func checkResult(t *testing.T, got Result, w want) {
	t.Helper()
	if got.ExitCode != w.exitCode {
		t.Errorf("ExitCode = %d, want %d (tail %q)", got.ExitCode, w.exitCode, got.Tail)
	}
	if w.checkStdout && string(got.Stdout) != w.stdout {
		t.Errorf("Stdout = %q, want %q", got.Stdout, w.stdout)
	}
	if !strings.HasPrefix(got.Tail, w.tailPrefix) {
		t.Errorf("Tail = %q, want prefix %q", got.Tail, w.tailPrefix)
	}
	if !strings.HasSuffix(got.Tail, w.tailSuffix) {
		t.Errorf("Tail = %q, want suffix %q", got.Tail, w.tailSuffix)
	}
	if !strings.Contains(got.Tail, w.tailContains) {
		t.Errorf("Tail = %q, want it to contain %q", got.Tail, w.tailContains)
	}
	if w.tailMaxLen > 0 && len(got.Tail) > w.tailMaxLen {
		t.Errorf("len(Tail) = %d, want at most %d", len(got.Tail), w.tailMaxLen)
	}
	if !utf8.ValidString(got.Tail) {
		t.Errorf("Tail is not valid UTF-8: %q", got.Tail)
	}
	if got.TimedOut != w.timedOut {
		t.Errorf("TimedOut = %v, want %v", got.TimedOut, w.timedOut)
	}
	if got.Canceled != w.canceled {
		t.Errorf("Canceled = %v, want %v", got.Canceled, w.canceled)
	}
	if got.Duration <= 0 && !w.canceled {
		t.Errorf("Duration = %v, want > 0", got.Duration)
	}
}

func TestRun(t *testing.T) {
	t.Setenv("HOME", "/home/procrun-test")
	t.Setenv("PROCRUN_CANARY", "must not leak")
	dir := t.TempDir()
	realDir, err := filepath.EvalSymlinks(dir)
	if err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("a", 5000) + "THE-END"

	tests := []struct {
		name    string
		spec    Spec
		want    want
		wantErr error
	}{
		{
			name: "exit 0 with stdout",
			spec: Spec{Argv: []string{"sh", "-c", "echo hello; echo oops >&2"}},
			want: want{exitCode: 0, stdout: "hello\n", checkStdout: true, tailContains: "oops"},
		},
		{
			name: "exit 3",
			spec: Spec{Argv: []string{"sh", "-c", "echo failing >&2; exit 3"}},
			want: want{exitCode: 3, stdout: "", checkStdout: true, tailSuffix: "failing\n"},
		},
		{
			name: "stdin delivered",
			spec: Spec{Argv: []string{"cat"}, Stdin: []byte("from stdin\n")},
			want: want{exitCode: 0, stdout: "from stdin\n", checkStdout: true},
		},
		{
			name: "large stdin left unread",
			spec: Spec{Argv: []string{"sh", "-c", "sleep 60 & echo started"}, Stdin: make([]byte, 1<<20)},
			want: want{exitCode: 0, stdout: "started\n", checkStdout: true},
		},
		{
			name: "no stdin is empty",
			spec: Spec{Argv: []string{"wc", "-c"}},
			want: want{exitCode: 0, stdout: "0\n", checkStdout: true},
		},
		{
			name: "env delivered",
			spec: Spec{
				Argv: []string{"sh", "-c", `printf '%s|%s' "$FOO" "${HOME-unset}"`},
				Env:  []string{"FOO=bar baz", "PATH=" + os.Getenv("PATH")},
			},
			want: want{exitCode: 0, stdout: "bar baz|unset", checkStdout: true},
		},
		{
			name: "nil env has only PATH and HOME, and the run id",
			spec: Spec{Argv: []string{"sh", "-c", `env | grep -v '^PWD=' | grep -v '^SHLVL=' | grep -v '^_=' | cut -d= -f1 | sort | tr '\n' ' '`}},
			want: want{exitCode: 0, stdout: "HOME LOOPBUS_RUN_ID PATH ", checkStdout: true},
		},
		{
			name: "nil env passes HOME of the parent",
			spec: Spec{Argv: []string{"sh", "-c", `printf %s "$HOME"`}},
			want: want{exitCode: 0, stdout: "/home/procrun-test", checkStdout: true},
		},
		{
			name: "dir honoured",
			spec: Spec{Argv: []string{"pwd", "-P"}, Dir: dir},
			want: want{exitCode: 0, stdout: realDir + "\n", checkStdout: true},
		},
		{
			name: "tail keeps the last bytes",
			spec: Spec{Argv: []string{"printf", "%s", long}, TailBytes: 100},
			want: want{
				exitCode: 0, stdout: long, checkStdout: true,
				tailPrefix: "…", tailSuffix: long[len(long)-99:], tailMaxLen: len("…") + 100,
			},
		},
		{
			name: "short output is not marked",
			spec: Spec{Argv: []string{"printf", "short"}, TailBytes: 100},
			want: want{exitCode: 0, stdout: "short", checkStdout: true, tailPrefix: "short"},
		},
		{
			name: "invalid UTF-8 is sanitized",
			spec: Spec{Argv: []string{"printf", `ok\377\376done`}},
			want: want{exitCode: 0, stdout: "ok\xff\xfedone", checkStdout: true, tailPrefix: "ok\uFFFD", tailSuffix: "done"},
		},
		{
			name: "killed by a signal",
			spec: Spec{Argv: []string{"sh", "-c", "kill -9 $$"}},
			want: want{exitCode: -1},
		},
		{
			name:    "nonexistent binary",
			spec:    Spec{Argv: []string{"loopbus-no-such-binary-xyz"}},
			want:    want{exitCode: -1},
			wantErr: ErrStart,
		},
		{
			name:    "nonexistent path",
			spec:    Spec{Argv: []string{"/nonexistent/bin/tool"}},
			want:    want{exitCode: -1},
			wantErr: ErrStart,
		},
		{
			name:    "nonexistent dir",
			spec:    Spec{Argv: []string{"true"}, Dir: filepath.Join(dir, "missing")},
			want:    want{exitCode: -1},
			wantErr: ErrStart,
		},
		{
			name:    "empty argv",
			spec:    Spec{},
			want:    want{exitCode: -1},
			wantErr: ErrStart,
		},
		{
			name:    "unwritable stdout file",
			spec:    Spec{Argv: []string{"true"}, StdoutFile: filepath.Join(dir, "missing", "out")},
			want:    want{exitCode: -1},
			wantErr: ErrStart,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Run(context.Background(), tt.spec)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("Run error = %v, want %v", err, tt.wantErr)
				}
				if got.ExitCode != tt.want.exitCode {
					t.Errorf("ExitCode = %d, want %d", got.ExitCode, tt.want.exitCode)
				}
				return
			}
			if err != nil {
				t.Fatalf("Run error = %v", err)
			}
			checkResult(t, got, tt.want)
		})
	}
}

func TestRunOutputFiles(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		name       string
		stdoutFile string
		stderrFile string
		want       map[string]string // file -> content
	}{
		{
			name:       "separate files",
			stdoutFile: "out.log",
			stderrFile: "err.log",
			want:       map[string]string{"out.log": "to out\n", "err.log": "to err\n"},
		},
		{
			name:       "stdout only",
			stdoutFile: "only.log",
			want:       map[string]string{"only.log": "to out\n"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := Spec{Argv: []string{"sh", "-c", "echo to out; echo to err >&2"}}
			if tt.stdoutFile != "" {
				s.StdoutFile = filepath.Join(dir, tt.stdoutFile)
			}
			if tt.stderrFile != "" {
				s.StderrFile = filepath.Join(dir, tt.stderrFile)
			}
			got, err := Run(context.Background(), s)
			if err != nil {
				t.Fatalf("Run error = %v", err)
			}
			checkResult(t, got, want{exitCode: 0, stdout: "to out\n", checkStdout: true, tailContains: "to err"})
			for name, content := range tt.want {
				p := filepath.Join(dir, name)
				b, err := os.ReadFile(p)
				if err != nil {
					t.Fatal(err)
				}
				if string(b) != content {
					t.Errorf("%s = %q, want %q", name, b, content)
				}
				fi, err := os.Stat(p)
				if err != nil {
					t.Fatal(err)
				}
				if perm := fi.Mode().Perm(); perm != 0o600 {
					t.Errorf("%s mode = %o, want 600", name, perm)
				}
			}
		})
	}
}

func TestRunStdoutCap(t *testing.T) {
	// 1.5 MiB of output: Stdout keeps the first MaxStdout bytes.
	got, err := Run(context.Background(), Spec{
		Argv:      []string{"sh", "-c", "head -c 1572864 /dev/zero | tr '\\0' x"},
		TailBytes: 10,
	})
	if err != nil {
		t.Fatalf("Run error = %v", err)
	}
	if len(got.Stdout) != MaxStdout {
		t.Errorf("len(Stdout) = %d, want %d", len(got.Stdout), MaxStdout)
	}
	checkResult(t, got, want{exitCode: 0, tailPrefix: "…", tailSuffix: "xxxxxxxxxx"})
}

// TestRunKillsGroup runs `sh -c 'sleep 60 & sleep 60'`-like commands that
// record the pid of the background grandchild, and checks that Run kills it
// and returns without waiting for it, though it holds the output pipes.
func TestRunKillsGroup(t *testing.T) {
	tests := []struct {
		name string
		// script gets the pid file as $1.
		script  string
		timeout time.Duration
		grace   time.Duration
		cancel  bool // cancel ctx once the pid file exists
		want    want
	}{
		{
			name:    "timeout kills grandchild",
			script:  `sleep 60 & echo $! > "$1"; sleep 60`,
			timeout: time.Second,
			want:    want{exitCode: -1, timedOut: true},
		},
		{
			name:    "timeout with SIGTERM ignored needs SIGKILL after grace",
			script:  `trap '' TERM; sleep 60 & echo $! > "$1"; sleep 60`,
			timeout: time.Second,
			grace:   200 * time.Millisecond,
			want:    want{exitCode: -1, timedOut: true},
		},
		{
			name:   "ctx cancel kills grandchild",
			script: `sleep 60 & echo $! > "$1"; sleep 60`,
			cancel: true,
			want:   want{exitCode: -1, canceled: true},
		},
		{
			name:   "background leftovers die after a normal exit",
			script: `sleep 60 & echo $! > "$1"; echo done; exit 4`,
			want:   want{exitCode: 4, stdout: "done\n", checkStdout: true},
		},
		{
			// The pid file is written from the new session: the script
			// ends only once its child has left the group.
			name:   "a process in a session of its own dies after a normal exit",
			script: `setsid sh -c 'echo $$ > "$1.tmp"; mv "$1.tmp" "$1"; exec sleep 60' sh "$1" & while [ ! -e "$1" ]; do sleep 0.01; done; echo done`,
			want:   want{exitCode: 0, stdout: "done\n", checkStdout: true},
		},
		{
			name:    "a process in a session of its own dies at the timeout",
			script:  `setsid sh -c 'echo $$ > "$1.tmp"; mv "$1.tmp" "$1"; exec sleep 60' sh "$1" & sleep 60`,
			timeout: time.Second,
			want:    want{exitCode: -1, timedOut: true},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pidFile := filepath.Join(t.TempDir(), "pid")
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var wg sync.WaitGroup
			if tt.cancel {
				wg.Add(1)
				go func() {
					defer wg.Done()
					waitForFile(t, pidFile)
					cancel()
				}()
			}
			got, err := Run(ctx, Spec{
				Argv:    []string{"sh", "-c", tt.script, "sh", pidFile},
				Timeout: tt.timeout,
				Grace:   tt.grace,
			})
			wg.Wait()
			if err != nil {
				t.Fatalf("Run error = %v", err)
			}
			checkResult(t, got, tt.want)
			// Generous bound: Run must not have waited for `sleep 60`.
			if got.Duration > 30*time.Second {
				t.Errorf("Duration = %v: Run waited for the grandchild", got.Duration)
			}
			pid := readPid(t, pidFile)
			assertGone(t, pid)
		})
	}
}

// TestRunWithoutWaitid checks the fallback used when waitid(WNOWAIT) is
// unusable: the results are the same, only slower to come when a grandchild
// holds the pipes after a normal exit.
func TestRunWithoutWaitid(t *testing.T) {
	tests := []struct {
		name    string
		script  string
		timeout time.Duration
		want    want
	}{
		{name: "exit 5", script: `echo out; exit 5`, want: want{exitCode: 5, stdout: "out\n", checkStdout: true}},
		{name: "timeout", script: `sleep 60 & sleep 60`, timeout: 500 * time.Millisecond, want: want{exitCode: -1, timedOut: true}},
		{name: "leftover", script: `sleep 60 & echo done`, want: want{exitCode: 0, stdout: "done\n", checkStdout: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			noWaitid := func(int) error { return syscall.ENOSYS }
			got, err := Run(context.Background(), Spec{Argv: []string{"sh", "-c", tt.script}, Timeout: tt.timeout, waitLeader: noWaitid})
			if err != nil {
				t.Fatalf("Run error = %v", err)
			}
			checkResult(t, got, tt.want)
			if got.Duration > 30*time.Second {
				t.Errorf("Duration = %v: Run waited for the grandchild", got.Duration)
			}
		})
	}
}

func TestRunCanceledBeforeStart(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	marker := filepath.Join(t.TempDir(), "ran")
	got, err := Run(ctx, Spec{Argv: []string{"touch", marker}})
	if err != nil {
		t.Fatalf("Run error = %v", err)
	}
	checkResult(t, got, want{exitCode: -1, canceled: true})
	if _, err := os.Stat(marker); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the process ran although ctx was already done (stat: %v)", err)
	}
}

// waitForFile polls until path exists and is not empty.
func waitForFile(t *testing.T, path string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if b, err := os.ReadFile(path); err == nil && len(b) > 0 && b[len(b)-1] == '\n' {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Errorf("%s did not appear", path)
}

func readPid(t *testing.T, path string) int {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("reading pid file: %v", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		t.Fatalf("bad pid file %q: %v", b, err)
	}
	return pid
}

// assertGone polls until pid no longer runs: kill(pid, 0) fails with ESRCH,
// or the process is a zombie (dead, waiting for a reaper that may be slow or
// absent in a container).
func assertGone(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := syscall.Kill(pid, 0)
		if errors.Is(err, syscall.ESRCH) || isZombie(pid) {
			return
		}
		if time.Now().After(deadline) {
			_ = syscall.Kill(pid, syscall.SIGKILL) // do not leak it
			t.Fatalf("grandchild %d still alive (kill 0: %v)", pid, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func isZombie(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// The state follows the parenthesized command name.
	i := strings.LastIndexByte(string(b), ')')
	return i >= 0 && i+2 < len(b) && b[i+2] == 'Z'
}

func TestOnStdoutLine(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("x", 70000)
	tests := []struct {
		name   string
		script string
		want   []string
	}{
		{name: "lines as written", script: `printf 'a\nbb\n'; printf 'c'; sleep 0.05; printf 'c\n'`, want: []string{"a", "bb", "cc"}},
		{name: "last line without newline", script: `printf 'one\ntwo'`, want: []string{"one", "two"}},
		{name: "stderr is not stdout", script: `echo out; echo err >&2`, want: []string{"out"}},
		{name: "long line in one piece", script: `printf '%s\n' "` + long + `"`, want: []string{long}},
		{name: "empty lines kept", script: `printf 'a\n\nb\n'`, want: []string{"a", "", "b"}},
		{name: "no output", script: `true`, want: nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var got []string
			_, err := Run(context.Background(), Spec{
				Argv:         []string{"sh", "-c", tt.script},
				OnStdoutLine: func(l []byte) { got = append(got, string(l)) },
			})
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("lines %q, want %q", got, tt.want)
			}
		})
	}
}

// TestOnStdoutLineSlowHandler: a handler slower than the pipes are
// drained after the process exits (it publishes each line and waits for
// the acknowledgement, on a loaded server) loses no line: the output is
// read from the pipe as it comes, and passed on in order.
func TestOnStdoutLineSlowHandler(t *testing.T) {
	t.Parallel()
	var got []string
	res, err := Run(context.Background(), Spec{
		Argv: []string{"sh", "-c", `echo one; sleep 0.2; echo two; echo three`},
		OnStdoutLine: func(l []byte) {
			if string(l) == "one" {
				time.Sleep(pipeDrain + 500*time.Millisecond)
			}
			got = append(got, string(l))
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"one", "two", "three"}; res.ExitCode != 0 || !reflect.DeepEqual(got, want) {
		t.Errorf("exit %d, lines %q; want 0, %q (tail %q)", res.ExitCode, got, want, res.Tail)
	}
}

// TestOnStdoutLinePanic: a line handler that panics (it runs on a
// goroutine of its own, where a panic ends the program) is contained:
// the run completes, no later line is passed on, and the panic is
// reported in the result.
func TestOnStdoutLinePanic(t *testing.T) {
	t.Parallel()
	var got []string
	res, err := Run(context.Background(), Spec{
		Argv: []string{"sh", "-c", `printf 'a\nboom\nc\n'; exit 3`},
		OnStdoutLine: func(l []byte) {
			if string(l) == "boom" {
				panic("the parser met " + string(l))
			}
			got = append(got, string(l))
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.ExitCode != 3 || res.HandlerPanic != "the parser met boom" || !reflect.DeepEqual(got, []string{"a"}) {
		t.Errorf("exit %d, panic %q, lines %q; want 3, the panic, [a]", res.ExitCode, res.HandlerPanic, got)
	}
}

// TestSweepScope: when the pid counter cannot have come round since the
// leader started, the sweep skips every pid up to the leader's; when that
// is not known, it skips none.
func TestSweepScope(t *testing.T) {
	forks, ok := forkCount()
	if !ok {
		t.Fatal("no fork count in /proc/stat")
	}
	if got := (sweepScope{leader: os.Getpid(), forks: forks, forksOK: true}).minPID(); got != os.Getpid() {
		t.Errorf("minPID right after counting = %d, want the leader %d", got, os.Getpid())
	}
	if got := (sweepScope{leader: os.Getpid()}).minPID(); got != 0 {
		t.Errorf("minPID with no fork count = %d, want 0", got)
	}
	tests := []struct {
		name                string
		leader, last, limit int
		forks, now          uint64
		want                int
	}{
		{name: "few forks since", leader: 500, last: 900, limit: 4 << 20, forks: 1000, now: 1400, want: 500},
		{name: "as many forks as pids since", leader: 500, last: 900, limit: 4 << 20, forks: 1000, now: 1000 + 4<<20, want: 0},
		{name: "the last pid below the leader (the counter came round)", leader: 500, last: 400, limit: 4 << 20, forks: 1000, now: 1400, want: 0},
		{name: "a fork count that went back", leader: 500, last: 900, limit: 4 << 20, forks: 1000, now: 10, want: 0},
		{name: "no limit known", leader: 500, last: 900, limit: -5, forks: 1000, now: 1000, want: 0},
	}
	if limit, ok := wrapLimit(); !ok || limit <= 0 || limit > 1<<22 {
		t.Errorf("wrapLimit() = %d, %v; want a positive bound below pid_max", limit, ok)
	}
	for _, tt := range tests {
		if got := skippable(tt.leader, tt.forks, tt.now, tt.last, tt.limit); got != tt.want {
			t.Errorf("%s: %d, want %d", tt.name, got, tt.want)
		}
	}
}

// TestProcReads: the /proc readers agree with a plain read and split of
// the same files, for every process this user can see, and a file larger
// than the buffer is read whole.
func TestProcReads(t *testing.T) {
	names, err := procEntries()
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, name := range names {
		pid, err := strconv.Atoi(name)
		if err != nil {
			continue
		}
		got, ok := startTicks(pid)
		b, err := os.ReadFile("/proc/" + name + "/stat")
		if (!ok || err != nil) && pid != os.Getpid() {
			continue // gone meanwhile
		}
		if err != nil {
			t.Fatal(err)
		}
		fields := bytes.Fields(b[bytes.LastIndexByte(b, ')')+1:])
		want, werr := strconv.ParseUint(string(fields[19]), 10, 64)
		if !ok || werr != nil || got != want {
			t.Errorf("startTicks(%d) = %d, %v; the file says %d", pid, got, ok, want)
		}
		checked++
	}
	if checked == 0 {
		t.Fatal("no process checked")
	}
	want, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	got, ok := readProc("/proc/self/status", make([]byte, 8))
	if !ok || !bytes.HasPrefix(got, want[:bytes.IndexByte(want, '\n')]) || len(got) < len(want)/2 {
		t.Errorf("readProc with a small buffer = %q, %v", got, ok)
	}
	if n, ok := readInt("/proc/sys/kernel/pid_max"); !ok || n < 300 {
		t.Errorf("readInt(pid_max) = %d, %v", n, ok)
	}
	for _, tt := range []struct {
		in   string
		want uint64
		ok   bool
	}{{"0", 0, true}, {"12345", 12345, true}, {"", 0, false}, {"-1", 0, false}, {"1x", 0, false}, {"99999999999999999999", 0, false}} {
		if got, ok := parseUint([]byte(tt.in)); got != tt.want || ok != tt.ok {
			t.Errorf("parseUint(%q) = %d, %v", tt.in, got, ok)
		}
	}
}

// BenchmarkRun runs a process that does next to nothing (`true`), as many
// at once as GOMAXPROCS, through Run (the start, the wait and the sweep
// for processes that left the group) and, beside it, through os/exec
// alone. cpu_us/run is the CPU of this process and its children per run:
// the difference is what Run adds to starting the process.
func BenchmarkRun(b *testing.B) {
	for _, tc := range []struct {
		name string
		run  func() error
	}{
		{"procrun", func() error {
			res, err := Run(context.Background(), Spec{Argv: []string{"true"}})
			if err == nil && res.ExitCode != 0 {
				err = fmt.Errorf("exit %d", res.ExitCode)
			}
			return err
		}},
		{"exec", func() error { return exec.Command("true").Run() }},
	} {
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			cpu0 := testcpu.Used(b)
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if err := tc.run(); err != nil {
						b.Error(err) // not Fatal: this is not the benchmark's goroutine
						return
					}
				}
			})
			b.ReportMetric(float64(testcpu.Used(b)-cpu0)/float64(time.Microsecond)/float64(b.N), "cpu_us/run")
		})
	}
}

// TestSweepFinds: a process of a run that left its group is killed by a
// sweep that probes the pids handed out since its leader, and by one
// that lists /proc (no fork count, so no pid below which to skip).
func TestSweepFinds(t *testing.T) {
	for _, withForks := range []bool{true, false} {
		t.Run(map[bool]string{true: "probing the pids since", false: "listing /proc"}[withForks], func(t *testing.T) {
			forks, ok := forkCount()
			last, ok1 := readInt("/proc/sys/kernel/ns_last_pid")
			if !ok || !ok1 {
				t.Fatal("no fork count or last pid in /proc")
			}
			id := newRunID()
			cmd := exec.Command("sleep", "60")
			cmd.Env = []string{RunIDVar + "=" + id}
			cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
			low := cmd.Process.Pid - 1
			pids, err := pidsAfter(low)
			if err != nil || !slices.Contains(pids, cmd.Process.Pid) || slices.Contains(pids, os.Getpid()) {
				t.Fatalf("pidsAfter(%d) = %v, %v: want the sleeper and not this process", low, pids, err)
			}
			// Few pids since: probed, every one in turn (a listing holds
			// only those in use).
			if now, ok := readInt("/proc/sys/kernel/ns_last_pid"); ok && probeRange(low, now) {
				if want := pidRange(low, low+len(pids)); len(pids) == 0 || !reflect.DeepEqual(pids, want) {
					t.Errorf("pidsAfter(%d) = %v, want the pids since in order (%v)", low, pids, want)
				}
			}
			scope := sweepScope{leader: last, forks: forks, forksOK: withForks}
			// Unless the pid counter came round meanwhile (then the sweep
			// lists /proc either way).
			if now, ok := readInt("/proc/sys/kernel/ns_last_pid"); ok && now >= last {
				if got := scope.minPID(); withForks && got != last || !withForks && got != 0 {
					t.Errorf("minPID() = %d, want %d", got, map[bool]int{true: last}[withForks])
				}
			}
			if n := sweep(id, scope); n != 1 {
				t.Errorf("sweep killed %d processes, want 1", n)
			}
			assertGone(t, cmd.Process.Pid)
		})
	}
}

// TestEnvironDuringExec: a process read right after it was started (its
// exec may not have laid out the new environment yet, when /proc shows it
// empty) is seen with its environment, and so is one whose environment
// is empty; a zombie and a reaped process read as unreadable. Without the
// wait, a read came back empty within the first hundred starts.
func TestEnvironDuringExec(t *testing.T) {
	marker := []byte(RunIDVar + "=" + newRunID() + "\x00")
	for i := range 1000 {
		cmd := exec.Command("sleep", "60")
		cmd.Env = []string{string(marker[:len(marker)-1])}
		if i%100 == 99 {
			cmd.Env = []string{}
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		env, ok := environ(cmd.Process.Pid)
		_ = cmd.Process.Kill()
		switch {
		case len(cmd.Env) == 0 && (!ok || len(env) != 0):
			t.Fatalf("start %d, empty environment: environ = %q, %v; want empty and readable", i, env, ok)
		case len(cmd.Env) > 0 && (!ok || !hasVar(env, marker)):
			t.Fatalf("start %d: environ = %q, %v; want it to hold %q", i, env, ok, marker)
		}
		if i%100 == 0 {
			// Killed, not yet reaped: a zombie.
			for deadline := time.Now().Add(5 * time.Second); !isZombie(cmd.Process.Pid); time.Sleep(time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("start %d: process %d did not become a zombie", i, cmd.Process.Pid)
				}
			}
			if env, ok := environ(cmd.Process.Pid); ok {
				t.Fatalf("start %d: environ of a zombie = %q, true; want false", i, env)
			}
		}
		_ = cmd.Wait()
		if env, ok := environ(cmd.Process.Pid); ok {
			t.Fatalf("start %d: environ of a reaped process = %q, true; want false", i, env)
		}
	}
}

// TestMain lets the test binary stand in for a process with threads of
// its own (a Go program), which TestSweepCountsProcesses sweeps.
func TestMain(m *testing.M) {
	if os.Getenv(sleeperVar) != "" {
		time.Sleep(time.Minute)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// sleeperVar makes the test binary sleep instead of testing.
const sleeperVar = "PROCRUN_TEST_SLEEPER"

// TestSweepCountsProcesses: a process of a run with several threads,
// whose ids the sweep probes too, is killed and counted once.
func TestSweepCountsProcesses(t *testing.T) {
	forks, ok := forkCount()
	last, ok1 := readInt("/proc/sys/kernel/ns_last_pid")
	if !ok || !ok1 {
		t.Fatal("no fork count or last pid in /proc")
	}
	id := newRunID()
	cmd := exec.Command(os.Args[0])
	cmd.Env = []string{RunIDVar + "=" + id, sleeperVar + "=1"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	task := "/proc/" + strconv.Itoa(cmd.Process.Pid) + "/task"
	deadline := time.Now().Add(20 * time.Second)
	for {
		if tasks, err := os.ReadDir(task); err == nil && len(tasks) >= 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the sleeper did not start its threads")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if n := sweep(id, sweepScope{leader: last, forks: forks, forksOK: true}); n != 1 {
		t.Errorf("sweep killed %d processes, want 1", n)
	}
	assertGone(t, cmd.Process.Pid)
}

// TestPidRange: pids are probed one by one only after a known pid, when
// at most maxProbe were handed out since, and those are the pids after
// low up to last, in order, this process's excluded; otherwise /proc is
// listed.
func TestPidRange(t *testing.T) {
	self := os.Getpid()
	if got, want := pidRange(self-2, self+1), []int{self - 1, self + 1}; !reflect.DeepEqual(got, want) {
		t.Errorf("pidRange around this process = %v, want %v", got, want)
	}
	if got := pidRange(7, 7); len(got) != 0 {
		t.Errorf("pidRange(7, 7) = %v, want none", got)
	}
	for _, tt := range []struct {
		low, last int
		want      bool
	}{
		{1000, 1000, true},
		{1000, 1000 + maxProbe, true},
		{1000, 1001 + maxProbe, false},
		{1000, 999, false}, // the counter came round
		{0, 10, false},     // no bound
	} {
		if got := probeRange(tt.low, tt.last); got != tt.want {
			t.Errorf("probeRange(%d, %d) = %v, want %v", tt.low, tt.last, got, tt.want)
		}
	}
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	all, err := pidsAfter(0)
	if err != nil || slices.Contains(all, self) || !slices.Contains(all, cmd.Process.Pid) {
		t.Errorf("pidsAfter(0) = %v, %v: want every process but this one", all, err)
	}
}

// TestThreadGroup: a thread's id, as a process's, names its process; a
// thread created after a mark does not make an older process new.
func TestThreadGroup(t *testing.T) {
	self := os.Getpid()
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil || len(tasks) < 2 {
		t.Fatalf("threads of this process: %v, %v", tasks, err)
	}
	for _, task := range tasks {
		if got, ok := threadGroup(task.Name()); !ok || got != self {
			t.Errorf("threadGroup(%s) = %d, %v; want %d", task.Name(), got, ok, self)
		}
		if newGroup(task.Name(), self, self+1<<20) {
			t.Errorf("newGroup(%s) after a mark at this process: want false", task.Name())
		}
	}
	if newGroup(strconv.Itoa(self), self-1, self) != true {
		t.Errorf("newGroup(this process) after a mark just before it: want true")
	}
}
