package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/loopbus/loopbus/internal/testnats"
)

// The scaling instructions of docs/DEPLOY.md, run verbatim by TestForemanReplicas
// (which checks that the page still says them).
const (
	readmeForeman  = "foreman start -m all=1,agentworker=3"
	readmePortEnv  = "echo LOOPBUS_PORT=4333 > .env"
	readmeNatsURL  = "export LOOPBUS_NATS_URL=nats://127.0.0.1:4222"
	readmeWorker   = "bin/loopbus agentworker"
	readmeSection  = "## Separate processes and scaling (Procfile)"
	fanOutParallel = 6
)

// TestForemanReplicas runs the Procfile under foreman as docs/DEPLOY.md says,
// with three agent workers: the jobs of a fanned-out pipeline run on all
// three. A fourth worker started later, as docs/DEPLOY.md says, takes work
// while foreman keeps running. Stopping foreman leaves no process behind.
func TestForemanReplicas(t *testing.T) {
	t.Parallel()
	foreman, err := exec.LookPath("foreman")
	if err != nil {
		t.Fatalf("foreman is not installed (it runs the Procfile): install it with `apt-get install -y ruby-foreman` (.ci/run does)")
	}
	section := readmeScaling(t)
	for _, line := range []string{readmeForeman, readmePortEnv, readmeNatsURL, readmeWorker} {
		if !containsLine(section, line) {
			t.Fatalf("docs/DEPLOY.md's scaling section no longer has the line %q that this test runs:\n%s", line, section)
		}
	}

	// The Procfile's directory as after `make build`, on a free port (the
	// page's .env, with another port).
	dir := t.TempDir()
	procfile, err := os.ReadFile("../Procfile")
	if err != nil {
		t.Fatal(err)
	}
	port := strings.TrimPrefix(testnats.FreeAddr(t), "127.0.0.1:")
	writeFiles(t, dir, map[string]string{
		"Procfile": string(procfile),
		".env":     "LOOPBUS_PORT=" + port + "\n",
	})
	if err := os.MkdirAll(filepath.Join(dir, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(binary, filepath.Join(dir, "bin", "loopbus")); err != nil {
		t.Fatal(err)
	}
	work := t.TempDir()
	writeFiles(t, work, fanOutPipeline())

	// Every process of the test carries a tag in its environment, so any
	// left running at the end can be found, however it was reparented.
	// (Not LOOPBUS_*: workers keep those from their agents.)
	tag := "E2E_FOREMAN_TAG_" + strconv.Itoa(os.Getpid()) + "=" + strconv.FormatInt(time.Now().UnixNano(), 36)
	env := append(testEnv(t), tag)
	t.Cleanup(func() { killTagged(t, tag) })

	args := strings.Fields(readmeForeman)
	fm := exec.Command(foreman, args[1:]...)
	fm.Dir, fm.Env = dir, env
	fmOut := &syncBuffer{}
	fm.Stdout, fm.Stderr = fmOut, fmOut
	// Its own process group: foreman signals its group on shutdown.
	fm.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := fm.Start(); err != nil {
		t.Fatal(err)
	}
	fmDone := make(chan error, 1)
	go func() { fmDone <- fm.Wait() }()
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			_ = fm.Process.Signal(syscall.SIGTERM)
			select {
			case <-fmDone:
			case <-time.After(30 * time.Second):
				_ = syscall.Kill(-fm.Process.Pid, syscall.SIGKILL)
			}
		}
		if t.Failed() {
			t.Logf("foreman output:\n%s", fmOut)
		}
	})

	// The user's other terminal.
	natsURL := strings.Replace(strings.TrimPrefix(readmeNatsURL, "export LOOPBUS_NATS_URL="), "4222", port, 1)
	userEnv := append(append([]string{}, env...), "LOOPBUS_NATS_URL="+natsURL)
	cli := func(args ...string) result {
		t.Helper()
		select {
		case err := <-fmDone:
			t.Fatalf("foreman exited early (%v):\n%s", err, fmOut)
		default:
		}
		return runIn(t, dir, userEnv, args...)
	}
	if !within(90*time.Second, func() bool {
		return strings.Count(fmOut.String(), "agent worker ready") == 3 && strings.Contains(fmOut.String(), "caught up with the stream") &&
			strings.Contains(fmOut.String(), "validator ready") && strings.Contains(fmOut.String(), "views caught up")
	}) {
		t.Fatalf("foreman's services did not all become ready in 90s:\n%s", fmOut)
	}

	submit := func(session string) map[string]int {
		t.Helper()
		r := cli("run", filepath.Join(work, "pipeline.yaml"), "--input", filepath.Join(work, "input.txt"), "--session", session)
		if r.code != 0 {
			t.Fatalf("run %s: exit %d\n%s\nforeman:\n%s", session, r.code, r.stderr, fmOut)
		}
		return jobsPerWorker(t, cli, session)
	}
	first := submit("fan-1")
	t.Logf("fan-1: jobs per worker %v", first)
	if len(first) != 3 {
		t.Errorf("fan-1 ran on %d workers %v, want all 3 replicas", len(first), first)
	}

	// A fourth worker, the page's way, while foreman keeps running.
	w4 := exec.Command(filepath.Join(dir, strings.Fields(readmeWorker)[0]), strings.Fields(readmeWorker)[1:]...)
	w4.Dir, w4.Env = dir, userEnv
	w4Out := &syncBuffer{}
	w4.Stdout, w4.Stderr = w4Out, w4Out
	if err := w4.Start(); err != nil {
		t.Fatal(err)
	}
	w4Done := make(chan error, 1)
	go func() { w4Done <- w4.Wait() }()
	t.Cleanup(func() {
		_ = w4.Process.Signal(syscall.SIGTERM)
		select {
		case <-w4Done:
		case <-time.After(15 * time.Second):
			_ = w4.Process.Kill()
		}
	})
	host, _ := os.Hostname()
	w4ID := fmt.Sprintf("%s-%d", host, w4.Process.Pid)
	if !within(60*time.Second, func() bool { return strings.Contains(w4Out.String(), "agent worker ready") }) {
		t.Fatalf("the fourth worker did not become ready in 60s:\n%s", w4Out)
	}
	second := submit("fan-2")
	t.Logf("fan-2: jobs per worker %v (fourth worker %s)", second, w4ID)
	if second[w4ID] == 0 {
		t.Errorf("the fourth worker %s ran none of fan-2's jobs: %v\nits log:\n%s", w4ID, second, w4Out)
	}
	for id := range first {
		if id == w4ID {
			t.Errorf("worker id %s of fan-1 is the fourth worker's", id)
		}
	}
	if strings.Count(fmOut.String(), "started with pid") != 7 {
		t.Errorf("foreman started %d processes, want 7 (nothing restarted):\n%s", strings.Count(fmOut.String(), "started with pid"), fmOut)
	}

	// Stop the fourth worker, then foreman, as a user would, and check
	// that no process is left behind.
	_ = w4.Process.Signal(syscall.SIGINT)
	select {
	case <-w4Done:
	case <-time.After(15 * time.Second):
		t.Errorf("the fourth worker did not stop within 15s of SIGINT")
	}
	stopped = true
	if err := fm.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-fmDone:
	case <-time.After(30 * time.Second):
		t.Fatalf("foreman did not stop within 30s of SIGTERM:\n%s", fmOut)
	}
	if strings.Contains(fmOut.String(), "sending SIGKILL") {
		t.Errorf("a process ignored foreman's SIGTERM and was killed:\n%s", fmOut)
	}
	if left := tagged(tag); len(left) > 0 {
		t.Errorf("processes left running after foreman stopped: %v", left)
	}
}

// fanOutPipeline: one step fanning out to fanOutParallel independent steps
// whose agents each take long enough that one worker cannot run them all,
// joined by a final step.
func fanOutPipeline() map[string]string {
	var b strings.Builder
	b.WriteString("name: fan\nsteps:\n  split:\n    agent: {backend: exec, command: [sh, split.sh]}\n    prompt: split\n    outputs: [{name: part.txt}]\n")
	var parts []string
	for i := 1; i <= fanOutParallel; i++ {
		fmt.Fprintf(&b, "  part%d:\n    requires: [split]\n    agent: {backend: exec, command: [sh, part.sh], env: {OUT: out%d.txt}}\n    prompt: part %d\n    outputs: [{name: out%d.txt}]\n", i, i, i, i)
		parts = append(parts, fmt.Sprintf("part%d", i))
	}
	fmt.Fprintf(&b, "  join:\n    requires: [%s]\n    agent: {backend: exec, command: [sh, join.sh]}\n    prompt: join\n    outputs: [{name: joined.txt}]\n", strings.Join(parts, ", "))
	return map[string]string{
		"split.sh":      "set -eu\necho part > \"$LOOPBUS_OUTPUT_DIR/part.txt\"\n",
		"part.sh":       "set -eu\nsleep 1.5\ncat \"$LOOPBUS_INPUT_DIR/part.txt\" > \"$LOOPBUS_OUTPUT_DIR/$OUT\"\n",
		"join.sh":       "set -eu\ncat \"$LOOPBUS_INPUT_DIR\"/out*.txt > \"$LOOPBUS_OUTPUT_DIR/joined.txt\"\n",
		"input.txt":     "x\n",
		"pipeline.yaml": b.String(),
	}
}

// jobsPerWorker counts the session's fanned-out jobs by the worker id in
// their job.started events, after checking each part completed once.
func jobsPerWorker(t *testing.T, cli func(...string) result, session string) map[string]int {
	t.Helper()
	r := cli("events", "--session", session, "--json")
	if r.code != 0 {
		t.Fatalf("events: exit %d\n%s", r.code, r.stderr)
	}
	per := map[string]int{}
	completed := map[string]int{}
	for _, line := range strings.Split(strings.TrimSpace(r.stdout), "\n") {
		var e cloudEvent
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			t.Fatalf("events --json line: %v\n%s", err, line)
		}
		switch {
		case e.Type == "loopbus.job.started" && strings.HasPrefix(e.Step, "part"):
			var d struct {
				Worker string `json:"worker"`
			}
			if err := json.Unmarshal(e.Data, &d); err != nil || d.Worker == "" {
				t.Fatalf("job.started without a worker id: %s", e.Data)
			}
			per[d.Worker]++
		case e.Type == "loopbus.step.completed":
			completed[e.Step]++
		}
	}
	for i := 1; i <= fanOutParallel; i++ {
		if step := fmt.Sprintf("part%d", i); completed[step] != 1 {
			t.Errorf("session %s: %d step.completed for %s, want 1", session, completed[step], step)
		}
	}
	return per
}

// runIn runs the binary in dir with env, like loopbus does.
func runIn(t *testing.T, dir string, env []string, args ...string) result {
	t.Helper()
	cmd := exec.Command(binary, args...)
	cmd.Dir, cmd.Env = dir, env
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var err error
	select {
	case err = <-done:
	case <-time.After(2 * time.Minute):
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("loopbus %v: timed out\nstderr:\n%s", args, errb.String())
	}
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("loopbus %v: %v", args, err)
	}
	return result{code: code, stdout: out.String(), stderr: errb.String()}
}

// readmeScaling is docs/DEPLOY.md's section on separate processes and scaling.
func readmeScaling(t *testing.T) string {
	t.Helper()
	raw, err := os.ReadFile("../docs/DEPLOY.md")
	if err != nil {
		t.Fatal(err)
	}
	s := string(raw)
	i := strings.Index(s, readmeSection)
	if i < 0 {
		t.Fatalf("docs/DEPLOY.md has no section %q", readmeSection)
	}
	s = s[i+len(readmeSection):]
	if j := strings.Index(s, "\n## "); j >= 0 {
		s = s[:j]
	}
	return s
}

func containsLine(text, line string) bool {
	for _, l := range strings.Split(text, "\n") {
		if strings.TrimSpace(l) == line {
			return true
		}
	}
	return false
}

// tagged lists the live processes whose environment holds tag.
func tagged(tag string) []string {
	var out []string
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		env, err := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		if err != nil || !bytes.Contains(append([]byte{0}, env...), []byte("\x00"+tag+"\x00")) {
			continue
		}
		stat, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:])); len(f) > 0 && f[0] == "Z" {
			continue // exited, not yet reaped
		}
		cmdline, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		out = append(out, fmt.Sprintf("%d %s", pid, bytes.ReplaceAll(cmdline, []byte{0}, []byte{' '})))
	}
	return out
}

// killTagged kills whatever tagged left, so a failed test does not leak.
func killTagged(t *testing.T, tag string) {
	t.Helper()
	for _, p := range tagged(tag) {
		if pid, err := strconv.Atoi(strings.Fields(p)[0]); err == nil {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}
