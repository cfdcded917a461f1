package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// binary is the loopbus binary built once for the package by TestMain.
var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "loopbus-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "loopbus")
	args := []string{"build", "-o", binary}
	if binaryRace() {
		args = append(args, "-race")
		// A race-built program sleeps a second before it exits (by
		// default), so that reports from its other threads get out; the
		// tests run hundreds of commands and stop many services. 50 ms
		// is time enough for a report under way. The processes inherit
		// this (testEnv keeps it); a GORACE of the user's is kept.
		if !strings.Contains(os.Getenv("GORACE"), "atexit_sleep_ms") {
			os.Setenv("GORACE", strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=50"))
		}
	}
	build := exec.Command("go", append(args, "../cmd/loopbus")...)
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building loopbus:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// binaryRace reports whether the binary the tests drive is built with the
// race detector: by default when the tests are; LOOPBUS_E2E_BINARY_RACE=0
// or 1 says otherwise.
func binaryRace() bool {
	switch os.Getenv("LOOPBUS_E2E_BINARY_RACE") {
	case "0":
		return false
	case "1":
		return true
	}
	return raceEnabled
}

// result of one command.
type result struct {
	code           int
	stdout, stderr string
}

// loopbus runs the binary to completion with a time limit.
func loopbus(t *testing.T, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, args...)
	cmd.Env = testEnv(t)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("loopbus %v: %v", args, err)
	}
	if ctx.Err() != nil {
		t.Fatalf("loopbus %v: timed out\nstderr:\n%s", args, errb.String())
	}
	return result{code: code, stdout: out.String(), stderr: errb.String()}
}

// testEnv isolates config files and temp dirs from the user's.
func testEnv(t *testing.T) []string {
	t.Helper()
	env := []string{}
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "LOOPBUS_") || strings.HasPrefix(kv, "XDG_CONFIG_HOME=") {
			continue
		}
		env = append(env, kv)
	}
	return append(env, "XDG_CONFIG_HOME="+t.TempDir())
}

// manifest is the part of the session manifest the tests read.
type manifest struct {
	ContentID  string `json:"contentId"`
	Status     string `json:"status"`
	Error      string `json:"error"`
	FailedStep string `json:"failedStep"`
	LastSeq    uint64 `json:"lastSeq"`
	SourceHash string `json:"sourceHash"`
	Steps      map[string]struct {
		Status       string `json:"status"`
		ContentHash  string `json:"contentHash"`
		Iterations   int    `json:"iterations"`
		ErrorMessage string `json:"errorMessage"`
		LastFeedback string `json:"lastFeedback"`
	} `json:"steps"`
}

func parseManifest(t *testing.T, s string) manifest {
	t.Helper()
	var m manifest
	if err := json.Unmarshal([]byte(s), &m); err != nil {
		t.Fatalf("manifest: %v\n%s", err, s)
	}
	return m
}

// cloudEvent is a decoded line of `events --json`.
type cloudEvent struct {
	SpecVersion string `json:"specversion"`
	ID          string `json:"id"`
	Source      string `json:"source"`
	Type        string `json:"type"`
	Subject     string `json:"subject"`
	Time        string `json:"time"`
	Step        string `json:"step"`
	Causation   string `json:"causation"`
	Correlation string `json:"correlation"`
	// ForkOf is set on a copy in a fork's history.
	ForkOf string          `json:"forkof"`
	Data   json.RawMessage `json:"data"`
}

// events returns a session's events as `loopbus events --json` prints them;
// none for a session not started yet.
func events(t *testing.T, global []string, session string) []cloudEvent {
	t.Helper()
	r := loopbus(t, append([]string{"events", "--session", session, "--json"}, global...)...)
	if r.code == 2 && strings.Contains(r.stderr, "no such session: "+session) {
		return nil // not submitted yet: callers poll until it is
	}
	if r.code != 0 {
		t.Fatalf("events: exit %d\n%s", r.code, r.stderr)
	}
	var evs []cloudEvent
	sc := bufio.NewScanner(strings.NewReader(r.stdout))
	sc.Buffer(make([]byte, 1<<20), 4<<20)
	for sc.Scan() {
		var e cloudEvent
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			t.Fatalf("events --json line is not JSON: %v\n%s", err, sc.Text())
		}
		evs = append(evs, e)
	}
	return evs
}

func count(evs []cloudEvent, typ, step string) int {
	n := 0
	for _, e := range evs {
		if e.Type == typ && (step == "" || e.Step == step) {
			n++
		}
	}
	return n
}

// writeFiles creates files under dir from a map of relative path → content.
func writeFiles(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// eventually polls cond every 100ms until it holds or the deadline passes.
func eventually(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", within, what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// syncBuffer is a buffer a child process writes to while the test reads it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// within polls cond every 200ms until it holds (true) or d passes (false).
func within(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(200 * time.Millisecond)
	}
	return true
}
