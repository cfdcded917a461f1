// Package procrun runs one subprocess safely: in its own process group,
// never through a shell, with a bounded run time, a bounded in-memory copy
// of its output and a guarantee that, once Run returns, nothing it started
// in its process group is left running.
//
// Linux is the target platform.
package procrun

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
	"unsafe"
)

// ErrStart is wrapped by the error Run returns when the process could not be
// started (bad argv, missing binary or directory, unwritable output file).
var ErrStart = errors.New("cannot start process")

// Defaults applied to a zero Spec field.
const (
	DefaultGrace     = 2 * time.Second
	DefaultTailBytes = 8192
	// MaxStdout is how much of stdout Result.Stdout keeps (the first bytes).
	MaxStdout = 1 << 20
)

// pipeDrain is how long Run keeps reading the output pipes after the process
// group is gone, in case a process that left the group (setsid) still holds
// them. After it the pipes are closed.
const pipeDrain = time.Second

// Spec describes one run.
type Spec struct {
	// Argv is the command. argv[0] is looked up in PATH if it has no '/':
	// the PATH of Env when it sets one, else the PATH of this process. A
	// relative argv[0] with a '/' is relative to Dir. Argv is never run
	// through a shell by this package.
	Argv []string
	// Dir is the working directory; it must exist. Empty means the working
	// directory of this process.
	Dir string
	// Env is the full environment (KEY=VALUE), to which Run adds
	// RunIDVar. Nil means an empty environment plus PATH and HOME of this
	// process; a non-nil empty slice means an empty environment.
	Env []string
	// Stdin is written to stdin, then stdin is closed. Nil or empty gives
	// the process an empty stdin.
	Stdin []byte
	// Timeout bounds the run; 0 means none. On expiry the whole process
	// group gets SIGTERM, then SIGKILL after Grace.
	Timeout time.Duration
	// Grace is how long the process gets to exit after SIGTERM; 0 means
	// DefaultGrace.
	Grace time.Duration
	// TailBytes is how many bytes of combined stdout+stderr Result.Tail
	// keeps (the last ones); 0 means DefaultTailBytes.
	TailBytes int
	// StdoutFile, if set, receives the full stdout (created or truncated,
	// mode 0600).
	StdoutFile string
	// StderrFile, if set, receives the full stderr (created or truncated,
	// mode 0600). It may equal StdoutFile.
	StderrFile string
	// OnStdoutLine, if set, is called with each line of stdout (without
	// the newline) as it is written, from one goroutine, in order; the
	// last line is passed when the process's output ends even without a
	// newline. Lines over MaxLine bytes are passed in pieces. The slice is
	// only valid during the call.
	OnStdoutLine func(line []byte)

	// waitLeader replaces waitExited in tests of the fallback path.
	waitLeader func(pid int) error
}

// Result of a run.
type Result struct {
	// ExitCode is the exit status; -1 if the process was killed by a signal
	// or failed to start.
	ExitCode int
	// Duration is the time from start until the process and its output
	// were done.
	Duration time.Duration
	// TimedOut reports that Spec.Timeout expired and the group was killed.
	TimedOut bool
	// Canceled reports that ctx was done and the group was killed (or, if
	// ctx was done before Run was called, that nothing was started).
	Canceled bool
	// Tail is the last TailBytes of combined output as valid UTF-8 (invalid
	// bytes replaced by U+FFFD), starting with "…" if older output was
	// dropped.
	Tail string
	// Stdout is the full stdout, up to MaxStdout bytes (the first ones).
	Stdout []byte
	// HandlerPanic is set when Spec.OnStdoutLine panicked (it runs on
	// the output-copying goroutine, where a panic would end the whole
	// program): the panic, after which no line was passed on.
	HandlerPanic string
}

// Run starts the process in its own process group and waits for it.
//
// Cancellation of ctx or expiry of the timeout sends SIGTERM to the whole
// group; if the process has not exited after Grace, the group gets SIGKILL.
// Once the process has exited, for whatever reason, every process still in
// its group gets SIGKILL, so grandchildren (say `sh -c "sleep 100 &"`) never
// outlive Run, and Run does not wait for them to close the output pipes.
// Processes that left the group (setsid, setpgid) are killed too: every
// process of the run carries RunIDVar in its environment, and Run kills
// whatever still carries it (see sweep); one that also cleared its
// environment escapes, and Run stops reading the pipes it holds a second
// after the process has exited.
// If ctx is already done, nothing is started and Result.Canceled is set.
//
// Run returns an error, wrapping ErrStart, only when the process could not be
// started; a non-zero exit, a time-out or a cancellation is reported in the
// Result with a nil error.
func Run(ctx context.Context, s Spec) (Result, error) {
	res := Result{ExitCode: -1}
	if len(s.Argv) == 0 || s.Argv[0] == "" {
		return res, fmt.Errorf("%w: empty argv", ErrStart)
	}
	if ctx.Err() != nil {
		res.Canceled = true
		return res, nil
	}
	grace := s.Grace
	if grace <= 0 {
		grace = DefaultGrace
	}
	tailBytes := s.TailBytes
	if tailBytes <= 0 {
		tailBytes = DefaultTailBytes
	}

	env := s.Env
	if env == nil {
		env = []string{}
		for _, k := range []string{"PATH", "HOME"} {
			if v, ok := os.LookupEnv(k); ok {
				env = append(env, k+"="+v)
			}
		}
	}
	runID := newRunID()
	env = append(env[:len(env):len(env)], RunIDVar+"="+runID)
	path, err := resolve(s.Argv[0], env)
	if err != nil {
		return res, fmt.Errorf("%w %q: %v", ErrStart, s.Argv[0], err)
	}

	tail := newRing(tailBytes)
	stdout := &capBuffer{max: MaxStdout}
	outW := sink{tail, stdout}
	errW := sink{tail}
	files, err := openOutputs(s.StdoutFile, s.StderrFile)
	if err != nil {
		return res, fmt.Errorf("%w %q: %v", ErrStart, s.Argv[0], err)
	}
	defer files.close()
	if files.out != nil {
		outW = append(outW, files.out)
	}
	var lines *lineWriter
	if s.OnStdoutLine != nil {
		lines = newLineWriter(s.OnStdoutLine)
		outW = append(outW, lines)
	}
	if files.err != nil {
		errW = append(errW, files.err)
	}

	cmd := &exec.Cmd{
		Path:   path,
		Args:   append([]string(nil), s.Argv...),
		Dir:    s.Dir,
		Env:    env,
		Stdout: outW,
		Stderr: errW,
		// Pdeathsig: if this process is killed (even with SIGKILL), the
		// agent does not live on unsupervised.
		SysProcAttr: &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL},
		WaitDelay:   pipeDrain,
	}
	if len(s.Stdin) > 0 {
		cmd.Stdin = bytes.NewReader(s.Stdin)
	}

	start := time.Now()
	forks, forksOK := forkCount()
	if err := cmd.Start(); err != nil {
		return res, fmt.Errorf("%w %q: %v", ErrStart, s.Argv[0], err)
	}
	pgid := cmd.Process.Pid // Setpgid with Pgid 0: the group id is the pid
	// Processes of the run started no earlier than its leader.
	since, _ := startTicks(pgid)
	scope := sweepScope{since: since, leader: pgid, forks: forks, forksOK: forksOK}

	// exited is closed once the leader has exited. waitExited does not reap
	// it, so its pid, and with it the group id, cannot be reused while the
	// group is signalled below. Should waitid be unusable, the goroutine
	// falls back to cmd.Wait, which reaps.
	exited := make(chan struct{})
	var (
		reaped  bool
		waitErr error
	)
	waitLeader := waitExited
	if s.waitLeader != nil {
		waitLeader = s.waitLeader
	}
	go func() {
		if waitLeader(cmd.Process.Pid) != nil {
			waitErr = cmd.Wait()
			reaped = true
		}
		close(exited)
	}()

	var timeout <-chan time.Time
	if s.Timeout > 0 {
		t := time.NewTimer(s.Timeout)
		defer t.Stop()
		timeout = t.C
	}
	select {
	case <-exited:
	case <-ctx.Done():
		res.Canceled = true
	case <-timeout:
		res.TimedOut = true
	}
	if res.Canceled || res.TimedOut {
		signalGroup(pgid, syscall.SIGTERM)
		g := time.NewTimer(grace)
		select {
		case <-exited:
		case <-g.C:
		}
		g.Stop()
	}
	// Whatever is left of the group, including the leader if it ignored
	// SIGTERM, is killed now.
	signalGroup(pgid, syscall.SIGKILL)
	<-exited
	// Those that left the group are found by their mark.
	swept := make(chan int, 1)
	go func() { swept <- sweep(runID, scope) }()
	select {
	case n := <-swept:
		if n > 0 {
			_, _ = fmt.Fprintf(tail, "\nprocrun: killed %d process(es) that left the process group and outlived the run\n", n)
		}
	case <-time.After(sweepTimeout):
		_, _ = fmt.Fprintf(tail, "\nprocrun: looking for processes that left the process group took over %s; some may outlive the run\n", sweepTimeout)
	}
	if !reaped {
		waitErr = cmd.Wait()
	}
	res.Duration = time.Since(start)
	if lines != nil {
		lines.flush() // the copying goroutines are done once Wait returned
		res.HandlerPanic = lines.panicked
	}

	var exitErr *exec.ExitError
	switch {
	case waitErr == nil, errors.Is(waitErr, exec.ErrWaitDelay), errors.As(waitErr, &exitErr):
	default:
		// The process ran; an unexpected wait error is not a start failure.
		// Record it in the tail so the caller sees it.
		_, _ = fmt.Fprintf(tail, "\nprocrun: wait: %v\n", waitErr)
	}
	if cmd.ProcessState != nil {
		res.ExitCode = cmd.ProcessState.ExitCode()
	}
	res.Tail = tail.String()
	res.Stdout = stdout.buf
	return res, nil
}

// resolve returns the path to execute for argv0: argv0 itself if it contains
// a '/', else the first executable regular file named argv0 in the
// absolute directories of the PATH in env (or of this process's PATH when env
// has none). Relative PATH entries are skipped.
func resolve(argv0 string, env []string) (string, error) {
	if strings.Contains(argv0, "/") {
		return argv0, nil
	}
	pathList, ok := lookupEnv(env, "PATH")
	if !ok {
		pathList = os.Getenv("PATH")
	}
	for _, dir := range filepath.SplitList(pathList) {
		if !filepath.IsAbs(dir) {
			continue
		}
		p := filepath.Join(dir, argv0)
		fi, err := os.Stat(p)
		if err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
			continue
		}
		return p, nil
	}
	return "", fmt.Errorf("executable file not found in PATH %q", pathList)
}

// lookupEnv returns the last value of key in env, as the exec package does.
func lookupEnv(env []string, key string) (string, bool) {
	for i := len(env) - 1; i >= 0; i-- {
		if k, v, ok := strings.Cut(env[i], "="); ok && k == key {
			return v, true
		}
	}
	return "", false
}

// outputs holds the optional files receiving the full output streams.
type outputs struct {
	out, err *os.File
}

func openOutputs(stdoutFile, stderrFile string) (outputs, error) {
	var o outputs
	open := func(name string) (*os.File, error) {
		return os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	}
	var err error
	if stdoutFile != "" {
		if o.out, err = open(stdoutFile); err != nil {
			return o, err
		}
	}
	switch {
	case stderrFile == "":
	case stderrFile == stdoutFile:
		o.err = o.out
	default:
		if o.err, err = open(stderrFile); err != nil {
			o.close()
			return outputs{}, err
		}
	}
	return o, nil
}

func (o outputs) close() {
	if o.out != nil {
		_ = o.out.Close()
	}
	if o.err != nil && o.err != o.out {
		_ = o.err.Close()
	}
}

// signalGroup sends sig to every process in the group pgid. Errors (ESRCH:
// the group is empty) are ignored.
func signalGroup(pgid int, sig syscall.Signal) {
	if pgid > 0 {
		_ = syscall.Kill(-pgid, sig)
	}
}

// waitExited blocks until the child pid has exited, without reaping it
// (waitid with WNOWAIT), as os.Process does internally on Linux.
func waitExited(pid int) error {
	const pPID = 1     // P_PID
	var info [128]byte // siginfo_t
	for {
		_, _, errno := syscall.Syscall6(syscall.SYS_WAITID, pPID, uintptr(pid),
			uintptr(unsafe.Pointer(&info)), syscall.WEXITED|syscall.WNOWAIT, 0, 0)
		switch errno {
		case 0:
			return nil
		case syscall.EINTR:
			continue
		default:
			return errno
		}
	}
}
