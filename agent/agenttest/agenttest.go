// Package agenttest is the conformance suite of agent.Backend: each
// backend's own tests call RunConformance with fake agents (small
// executables printing the real output formats, or a scripted model server
// speaking the vendor's wire format), and it checks what every backend
// must do.
package agenttest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/loopbus/loopbus/agent"
	"github.com/loopbus/loopbus/schemas"
)

// Fixture is one fake agent run.
type Fixture struct {
	// Spec runs the fake: Backend and Command at least (a command-line
	// backend runs Command in place of its program), or Backend and
	// BaseURL (a model-API backend calls a scripted server).
	Spec schemas.AgentSpec
	// Env is added to the run's environment, which holds PATH,
	// LOOPBUS_OUTPUT_DIR (an empty directory) and AGENTTEST_PIDFILE (see
	// Fixtures.Hang).
	Env []string
	// Want, if not nil, are the kinds of the run's events, in order.
	Want []agent.Kind
}

func (f Fixture) set() bool { return f.Spec.Backend != "" || len(f.Spec.Command) > 0 }

// Fixtures are the fake agents of a conformance run. Success, Failure and
// Hang are required; a backend that cannot produce the others (exec reads
// no event stream: no usage, limits or unknown lines) leaves them zero and
// their checks are skipped.
type Fixtures struct {
	// Success exits 0 after at least one tool call, which it completes.
	Success Fixture
	// Failure fails: it exits non-zero or reports a failure.
	Failure Fixture
	// Hang writes the pid of a process it started in the background to
	// $AGENTTEST_PIDFILE, then blocks until it is killed (a model-API
	// backend's model has its run tool do this).
	Hang Fixture
	// Usage reports token usage (it may be Success again).
	Usage Fixture
	// RateLimit hits a usage or rate limit and says when it resets.
	RateLimit Fixture
	// Unknown prints lines of unknown types and malformed lines among
	// known ones, then exits 0.
	Unknown Fixture
	// Large prints a tool output and a message each longer than
	// agent.MaxSummary, and more output than Job.TailBytes.
	Large Fixture
	// StartFailure cannot start. When zero, it is Success with a program
	// that does not exist as its Command (for command-line backends).
	StartFailure Fixture
}

// The limits of the suite's waits; generous for -race on a busy machine.
const (
	runTimeout = 60 * time.Second
	// promptly bounds how long Run may take to return once its context is
	// cancelled: procrun's grace before SIGKILL, plus slack.
	promptly = 10 * time.Second
)

// RunConformance checks newBackend's backends against f, one parallel
// subtest per property:
//
//   - Success: exit 0, no error, no failure or limit, events well formed
//     (below) and in f.Success.Want's order, every tool call ended;
//   - Usage: the usage events add up to some tokens;
//   - RateLimit: a KindRateLimit with a text and ResetAt;
//   - Failure: a non-zero exit code or a KindFailure, and no error;
//   - Unknown: unknown and malformed lines become KindUnknown events, and
//     the run goes on to succeed;
//   - Large: summaries cut to agent.MaxSummary, the tail to Job.TailBytes;
//   - Cancel: cancelling ctx makes Run return promptly with
//     Result.Canceled, and kills the whole process group;
//   - Timeout: Job.Timeout makes Run return with Result.TimedOut;
//   - StartFailure: an agent that cannot start (a program that does not
//     exist) makes Run return an error.
//
// Every run's events must be well formed: emit is never called
// concurrently nor after Run returned, every KindToolEnd has an earlier
// KindToolStart with its ToolID (and name, when it gives one), summaries
// are within their limits.
func RunConformance(t *testing.T, newBackend func() agent.Backend, f Fixtures) {
	t.Helper()
	for name, fx := range map[string]Fixture{"Success": f.Success, "Failure": f.Failure, "Hang": f.Hang} {
		if !fx.set() {
			t.Fatalf("agenttest: Fixtures.%s is required", name)
		}
	}
	t.Run("Success", func(t *testing.T) {
		t.Parallel()
		r := run(t, newBackend(), f.Success, nil)
		r.wantOK(t)
		if r.count(agent.KindToolStart) == 0 {
			t.Errorf("no tool call: %s", r)
		}
		if open := r.open(); len(open) > 0 {
			t.Errorf("tool calls %q never ended: %s", open, r)
		}
		r.wantKinds(t, f.Success.Want)
	})
	t.Run("Usage", func(t *testing.T) {
		skipUnset(t, f.Usage)
		t.Parallel()
		r := run(t, newBackend(), f.Usage, nil)
		var sum agent.Usage
		for _, ev := range r.events {
			if ev.Kind == agent.KindUsage {
				sum.InputTokens += ev.Usage.InputTokens + ev.Usage.CacheReadTokens + ev.Usage.CacheWriteTokens
				sum.OutputTokens += ev.Usage.OutputTokens
			}
		}
		if sum.InputTokens == 0 || sum.OutputTokens == 0 {
			t.Errorf("usage %+v, want input and output tokens: %s", sum, r)
		}
		r.wantKinds(t, f.Usage.Want)
	})
	t.Run("RateLimit", func(t *testing.T) {
		skipUnset(t, f.RateLimit)
		t.Parallel()
		r := run(t, newBackend(), f.RateLimit, nil)
		if r.err != nil {
			t.Fatalf("Run: %v", r.err)
		}
		found := false
		for _, ev := range r.events {
			if ev.Kind == agent.KindRateLimit && ev.Text != "" && !ev.ResetAt.IsZero() {
				found = true
			}
		}
		if !found {
			t.Errorf("no rate limit with a text and a reset time: %s", r)
		}
		r.wantKinds(t, f.RateLimit.Want)
	})
	t.Run("Failure", func(t *testing.T) {
		t.Parallel()
		r := run(t, newBackend(), f.Failure, nil)
		if r.err != nil {
			t.Fatalf("Run: %v (a failing agent is not an error of Run)", r.err)
		}
		if r.res.ExitCode == 0 && r.count(agent.KindFailure) == 0 {
			t.Errorf("exit code 0 and no failure reported: %s", r)
		}
		r.wantKinds(t, f.Failure.Want)
	})
	t.Run("Unknown", func(t *testing.T) {
		skipUnset(t, f.Unknown)
		t.Parallel()
		r := run(t, newBackend(), f.Unknown, nil)
		r.wantOK(t)
		first := -1
		for i, ev := range r.events {
			if ev.Kind == agent.KindUnknown {
				first = i
				break
			}
		}
		switch {
		case first < 0:
			t.Errorf("no KindUnknown event: %s", r)
		case r.count(agent.KindUnknown) == len(r.events)-first:
			t.Errorf("nothing understood after the first unknown line: %s", r)
		}
		r.wantKinds(t, f.Unknown.Want)
	})
	t.Run("Large", func(t *testing.T) {
		skipUnset(t, f.Large)
		t.Parallel()
		const tail = 1024
		r := run(t, newBackend(), f.Large, func(j *agent.Job) { j.TailBytes = tail })
		if r.err != nil {
			t.Fatalf("Run: %v", r.err)
		}
		// checkEvent already bounds every summary; the fake's must have
		// come through, cut.
		longest := 0
		for _, ev := range r.events {
			longest = max(longest, len(ev.Input), len(ev.Output), len(ev.Text))
		}
		if longest < agent.MaxSummary/2 {
			t.Errorf("no long summary came through (longest %d bytes): %s", longest, r)
		}
		if len(r.res.Tail) > tail+len("…") {
			t.Errorf("Result.Tail has %d bytes, want at most Job.TailBytes %d", len(r.res.Tail), tail)
		}
		r.wantKinds(t, f.Large.Want)
	})
	t.Run("Cancel", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithCancelCause(context.Background())
		defer cancel(nil)
		var cancelledAt atomic.Int64
		pidfile := filepath.Join(t.TempDir(), "pid")
		go func() {
			pid := waitPid(ctx, pidfile)
			if pid == 0 {
				return
			}
			cancelledAt.Store(time.Now().UnixNano())
			cancel(errors.New("agenttest: cancelled"))
		}()
		r := runCtx(t, ctx, newBackend(), f.Hang, func(j *agent.Job) { j.Env = setEnv(j.Env, "AGENTTEST_PIDFILE", pidfile) })
		if at := cancelledAt.Load(); at == 0 {
			t.Fatalf("Run returned before the agent wrote its pid file: %s", r)
		} else if took := time.Since(time.Unix(0, at)); took > promptly {
			t.Errorf("Run returned %s after its context was cancelled, want within %s", took, promptly)
		}
		if !r.res.Canceled {
			t.Errorf("Result.Canceled not set: %+v", r.res)
		}
		waitDead(t, readPid(t, pidfile))
	})
	t.Run("Timeout", func(t *testing.T) {
		t.Parallel()
		pidfile := filepath.Join(t.TempDir(), "pid")
		const timeout = 500 * time.Millisecond
		// A backend deaf to Job.Timeout is stopped by ctx, and fails.
		ctx, cancel := context.WithTimeout(context.Background(), timeout+promptly)
		defer cancel()
		r := runCtx(t, ctx, newBackend(), f.Hang, func(j *agent.Job) {
			j.Timeout = timeout
			j.Env = setEnv(j.Env, "AGENTTEST_PIDFILE", pidfile)
		})
		if !r.res.TimedOut || r.res.Canceled {
			t.Errorf("Result %+v, want TimedOut", r.res)
		}
		if pid := readPidIfAny(pidfile); pid > 0 {
			waitDead(t, pid)
		}
	})
	t.Run("StartFailure", func(t *testing.T) {
		t.Parallel()
		fx := f.StartFailure
		if !fx.set() {
			fx = f.Success
			fx.Spec.Command = []string{filepath.Join(t.TempDir(), "no-such-agent")}
		}
		r := run(t, newBackend(), fx, nil)
		if r.err == nil {
			t.Errorf("Run of an agent that cannot start: no error (%+v): %s", r.res, r)
		}
		if r.res.ExitCode == 0 {
			t.Errorf("exit code 0 for a program that did not start")
		}
	})
}

func skipUnset(t *testing.T, f Fixture) {
	t.Helper()
	if !f.set() {
		t.Skip("the backend has no fixture for this")
	}
}

// result is what one run gave.
type result struct {
	res    agent.Result
	err    error
	events []agent.Event
}

func (r *result) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "exit %d, err %v, %d events:", r.res.ExitCode, r.err, len(r.events))
	for _, ev := range r.events {
		fmt.Fprintf(&b, "\n  %s id=%q name=%q text=%.60q output=%.60q", ev.Kind, ev.ToolID, ev.Name, ev.Text, ev.Output)
	}
	return b.String()
}

func (r *result) count(k agent.Kind) int {
	n := 0
	for _, ev := range r.events {
		if ev.Kind == k {
			n++
		}
	}
	return n
}

// open returns the ids of tool calls that started and did not end.
func (r *result) open() []string {
	var open []string
	for _, ev := range r.events {
		switch ev.Kind {
		case agent.KindToolStart:
			open = append(open, ev.ToolID)
		case agent.KindToolEnd:
			for i, id := range open {
				if id == ev.ToolID {
					open = append(open[:i], open[i+1:]...)
					break
				}
			}
		}
	}
	return open
}

func (r *result) wantOK(t *testing.T) {
	t.Helper()
	if r.err != nil || r.res.ExitCode != 0 || r.res.Canceled || r.res.TimedOut {
		t.Fatalf("result %+v, error %v; want exit 0: %s", r.res, r.err, r)
	}
	if n := r.count(agent.KindFailure) + r.count(agent.KindRateLimit); n > 0 {
		t.Errorf("a successful run reported %d failures or limits: %s", n, r)
	}
}

func (r *result) wantKinds(t *testing.T, want []agent.Kind) {
	t.Helper()
	if want == nil {
		return
	}
	got := make([]agent.Kind, len(r.events))
	for i, ev := range r.events {
		got[i] = ev.Kind
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("event kinds %v, want %v: %s", got, want, r)
	}
}

// run runs fx with a fresh job (edited by edit) to its end.
func run(t *testing.T, b agent.Backend, fx Fixture, edit func(*agent.Job)) *result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), runTimeout)
	defer cancel()
	return runCtx(t, ctx, b, fx, edit)
}

func runCtx(t *testing.T, ctx context.Context, b agent.Backend, fx Fixture, edit func(*agent.Job)) *result {
	t.Helper()
	out := t.TempDir()
	job := agent.Job{
		Spec:   fx.Spec,
		Dir:    t.TempDir(),
		Env:    append([]string{"PATH=" + os.Getenv("PATH"), "LOOPBUS_OUTPUT_DIR=" + out, "AGENTTEST_PIDFILE=" + filepath.Join(out, "pid")}, fx.Env...),
		Prompt: "Write out.txt",
	}
	if edit != nil {
		edit(&job)
	}
	r := &result{}
	var (
		mu       sync.Mutex
		busy     atomic.Bool
		returned atomic.Bool
		starts   = map[string]string{} // tool id → name, or ended
	)
	emit := func(ev agent.Event) {
		if !busy.CompareAndSwap(false, true) {
			t.Errorf("emit called concurrently (%s)", ev.Kind)
		} else {
			defer busy.Store(false)
		}
		if returned.Load() {
			t.Errorf("emit called after Run returned (%s)", ev.Kind)
		}
		mu.Lock()
		defer mu.Unlock()
		checkEvent(t, ev, starts)
		r.events = append(r.events, ev)
	}
	type ran struct {
		res agent.Result
		err error
	}
	done := make(chan ran, 1)
	go func() {
		res, err := b.Run(ctx, job, emit)
		returned.Store(true)
		done <- ran{res, err}
	}()
	var got ran
	select {
	case got = <-done:
	case <-ctx.Done():
		select {
		case got = <-done:
		case <-time.After(promptly):
			t.Fatalf("Run has not returned %s after its context ended", promptly)
		}
	}
	r.res, r.err = got.res, got.err
	mu.Lock()
	defer mu.Unlock()
	for _, ev := range r.events {
		if ev.Kind == agent.KindToolEnd && ev.Output != r.res.Tail && len(ev.Output) > agent.MaxSummary {
			t.Errorf("tool %s output has %d bytes and is not the run's tail: want at most agent.MaxSummary", ev.ToolID, len(ev.Output))
		}
	}
	return r
}

// ended marks a tool call that ended, in checkEvent's starts.
const ended = "\x00ended"

// checkEvent checks one event given the tool calls started (and ended)
// before it: starts maps tool id to name, or to ended.
func checkEvent(t *testing.T, ev agent.Event, starts map[string]string) {
	t.Helper()
	if len(ev.Input) > agent.MaxSummary || len(ev.Text) > agent.MaxSummary {
		t.Errorf("%s event with a summary over agent.MaxSummary (input %d, text %d bytes)", ev.Kind, len(ev.Input), len(ev.Text))
	}
	switch ev.Kind {
	case agent.KindToolStart:
		if ev.ToolID == "" || ev.Name == "" {
			t.Errorf("tool start without id or name: %+v", ev)
		}
		if _, dup := starts[ev.ToolID]; dup {
			t.Errorf("tool %s started twice", ev.ToolID)
		}
		starts[ev.ToolID] = ev.Name
	case agent.KindToolEnd:
		name, ok := starts[ev.ToolID]
		switch {
		case !ok:
			t.Errorf("tool %s ended without a start", ev.ToolID)
		case name == ended:
			t.Errorf("tool %s ended twice", ev.ToolID)
		case ev.Name != "" && ev.Name != name:
			t.Errorf("tool %s started as %q, ended as %q", ev.ToolID, name, ev.Name)
		}
		starts[ev.ToolID] = ended
	case agent.KindUnknown, agent.KindMessage, agent.KindUsage, agent.KindRateLimit, agent.KindFailure, agent.KindRetry, agent.KindStop:
	default:
		t.Errorf("event of unknown kind %d", ev.Kind)
	}
}

func setEnv(env []string, key, value string) []string {
	for i, kv := range env {
		if strings.HasPrefix(kv, key+"=") {
			env[i] = key + "=" + value
			return env
		}
	}
	return append(env, key+"="+value)
}

// waitPid waits until path holds a pid and returns it; 0 if ctx ended
// first or it took too long.
func waitPid(ctx context.Context, path string) int {
	deadline := time.Now().Add(runTimeout)
	for ctx.Err() == nil && time.Now().Before(deadline) {
		if pid := readPidIfAny(path); pid > 0 {
			return pid
		}
		time.Sleep(10 * time.Millisecond)
	}
	return 0
}

func readPidIfAny(path string) int {
	b, err := os.ReadFile(path)
	if err != nil || !bytes.HasSuffix(b, []byte("\n")) {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return pid
}

func readPid(t *testing.T, path string) int {
	t.Helper()
	pid := readPidIfAny(path)
	if pid <= 0 {
		t.Fatalf("no pid in %s", path)
	}
	return pid
}

// waitDead waits until pid no longer runs (gone, or a zombie awaiting a
// reaper that is not ours).
func waitDead(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(promptly)
	for {
		err := syscall.Kill(pid, 0)
		if errors.Is(err, syscall.ESRCH) {
			return
		}
		if stat, rerr := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); rerr == nil {
			if i := bytes.LastIndexByte(stat, ')'); i > 0 && len(stat) > i+2 && stat[i+2] == 'Z' {
				return
			}
		}
		if time.Now().After(deadline) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			t.Fatalf("process %d the agent started still runs after Run returned", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
