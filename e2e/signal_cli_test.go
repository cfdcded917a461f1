package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/loopbus/loopbus/internal/testnats"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// signalLine is one line of `signal --json`.
type signalLine struct {
	Signal  string `json:"signal"`
	Target  string `json:"target"`
	Session string `json:"session"`
	Step    string `json:"step"`
	ID      string `json:"id"`
	Seq     uint64 `json:"seq"`
	Result  string `json:"result"`
	Detail  string `json:"detail"`
}

func parseSignalLines(t *testing.T, out string) []signalLine {
	t.Helper()
	var lines []signalLine
	for l := range strings.Lines(out) {
		var s signalLine
		if err := json.Unmarshal([]byte(l), &s); err != nil {
			t.Fatalf("signal --json line is not JSON: %v\n%s", err, l)
		}
		lines = append(lines, s)
	}
	return lines
}

// startNATS runs `loopbus nats` on data until the returned stop is called
// (or the test ends), and waits until it listens.
func startNATS(t *testing.T, data, logFile string) (url string, stop func()) {
	t.Helper()
	addr := testnats.FreeAddr(t)
	cmd := exec.Command(binary, "nats", "--data", data, "--listen", addr)
	cmd.Env = testEnv(t)
	f, err := os.Create(logFile)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); f.Close(); close(exited) }()
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	}
	t.Cleanup(stop)
	eventually(t, 60*time.Second, "loopbus nats to listen on "+addr, func() bool {
		select {
		case <-exited:
			log, _ := os.ReadFile(logFile)
			t.Fatalf("loopbus nats exited:\n%s", log)
		default:
		}
		conn, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			return false
		}
		conn.Close()
		return true
	})
	return "nats://" + addr, stop
}

// TestSignalCLI: `loopbus signal` against a `loopbus nats` server with no
// orchestrator. Bad targets and options exit 2 with a clear message and
// send nothing; good signals are recorded in the stream with their data,
// and the command exits 0 saying so, with its stream sequence. After the
// server stops, a signal sent on its data directory (embedded) is recorded
// too, without waiting for an orchestrator that cannot be there.
func TestSignalCLI(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	writeFiles(t, dir, map[string]string{
		"input.txt": "x\n",
		"pipeline.yaml": `name: sig
budget: {max_tokens: 50000}
breaker: {no_progress: 2}
steps:
  draft:
    agent: {backend: exec, command: [sh, -c, "echo d > \"$LOOPBUS_OUTPUT_DIR/d.txt\""]}
    prompt: draft
    outputs: [{name: d.txt}]
    breaker: {identical_failures: 1}
  review:
    requires: [draft]
    agent: {backend: exec, command: [sh, -c, "echo r > \"$LOOPBUS_OUTPUT_DIR/r.txt\""]}
    prompt: review
    outputs: [{name: r.txt}]
`,
	})
	url, stopNATS := startNATS(t, data, filepath.Join(dir, "nats.log"))
	global := []string{"--nats", url}
	pipelineFile, input := filepath.Join(dir, "pipeline.yaml"), filepath.Join(dir, "input.txt")

	// Sessions nothing runs: no orchestrator is connected.
	r := loopbus(t, append([]string{"run", pipelineFile, "--input", input, "--session", "sig-1", "--detach",
		"--max-cost-usd", "2.5", "--max-iterations", "9"}, global...)...)
	if r.code != 0 || strings.TrimSpace(r.stdout) != "sig-1" {
		t.Fatalf("run --detach: exit %d, stdout %q\n%s", r.code, r.stdout, r.stderr)
	}
	if r := loopbus(t, append([]string{"run", pipelineFile, "--input", input, "--session", "sig-2", "--detach"}, global...)...); r.code != 0 {
		t.Fatalf("run --detach sig-2: exit %d\n%s", r.code, r.stderr)
	}
	started := events(t, global, "sig-1")
	if len(started) != 1 || started[0].Type != "loopbus.session.started" {
		t.Fatalf("sig-1 events: %+v", started)
	}
	var ss struct {
		Budget   map[string]float64 `json:"budget"`
		Pipeline struct {
			Budget  map[string]float64 `json:"budget"`
			Breaker map[string]float64 `json:"breaker"`
			Steps   []struct {
				Breaker map[string]float64 `json:"breaker"`
			} `json:"steps"`
		} `json:"pipeline"`
	}
	if err := json.Unmarshal(started[0].Data, &ss); err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(ss.Budget, map[string]float64{"maxCostUsd": 2.5, "maxIterations": 9}) ||
		!maps.Equal(ss.Pipeline.Budget, map[string]float64{"maxTokens": 50000}) ||
		!maps.Equal(ss.Pipeline.Breaker, map[string]float64{"noProgress": 2}) ||
		len(ss.Pipeline.Steps) != 2 || !maps.Equal(ss.Pipeline.Steps[0].Breaker, map[string]float64{"identicalFailures": 1}) || ss.Pipeline.Steps[1].Breaker != nil {
		t.Errorf("session.started budget and breakers: %s", started[0].Data)
	}
	if r := loopbus(t, append([]string{"run", pipelineFile, "--input", input, "--session", "sig-3", "--detach", "--max-tokens", "0"}, global...)...); r.code != 2 || !strings.Contains(r.stderr, "--max-tokens must be > 0") {
		t.Errorf("run --max-tokens 0: exit %d\n%s", r.code, r.stderr)
	}

	usage := []struct {
		name string
		args []string
		want string
	}{
		{"unknown session", []string{"stop", "nope"}, "no such session: nope"},
		{"unknown step", []string{"pause", "sig-1/publish"}, `session sig-1 has no step "publish" (steps: draft, review)`},
		{"bad session id", []string{"stop", "sig.1"}, `invalid session id "sig.1"`},
		{"bad step name", []string{"stop", "sig-1/a b"}, `invalid step name "a b"`},
		{"all takes no step", []string{"pause", "all/draft"}, "takes no step"},
		{"hint without message", []string{"hint", "sig-1/draft"}, "hint needs --message"},
		{"info (hint's old name) without message", []string{"info", "sig-1/draft"}, "info needs --message"},
		{"message too long", []string{"hint", "sig-1", "--message", strings.Repeat("m", 4097)}, "--message is 4097 bytes; at most 4096"},
		{"message on stop", []string{"stop", "sig-1", "--message", "hi"}, "stop takes no --message"},
		{"invalidate without step", []string{"invalidate", "sig-1"}, "invalidate needs SESSION/STEP"},
		{"unknown signal", []string{"kill", "sig-1"}, `unknown signal "kill"`},
		{"missing target", []string{"stop"}, "want a signal"},
		{"negative wait", []string{"stop", "sig-1", "--wait", "-1s"}, "--wait"},
	}
	for _, tt := range usage {
		t.Run(tt.name, func(t *testing.T) {
			r := loopbus(t, append(append([]string{"signal"}, tt.args...), global...)...)
			if r.code != 2 || !strings.Contains(r.stderr, tt.want) {
				t.Errorf("exit %d, want 2 with %q on stderr\nstderr: %s", r.code, tt.want, r.stderr)
			}
		})
	}
	for _, s := range []string{"sig-1", "sig-2"} {
		if n := len(events(t, global, s)); n != 1 {
			t.Fatalf("refused signals left events: %s has %d", s, n)
		}
	}

	// A stop nobody acknowledges: recorded, exit 0.
	r = loopbus(t, append([]string{"signal", "stop", "sig-1", "--reason", "enough for today", "--wait", "1s"}, global...)...)
	if r.code != 0 || !strings.Contains(r.stdout, "stop sig-1: recorded at stream sequence ") ||
		!strings.Contains(r.stdout, "takes effect when the orchestrator runs (the orchestrator did not answer within 1s)") {
		t.Fatalf("signal stop: exit %d\nstdout: %s\nstderr: %s", r.code, r.stdout, r.stderr)
	}
	evs := events(t, global, "sig-1")
	if len(evs) != 2 || evs[1].Type != "loopbus.signal.stop" || evs[1].Subject != "sig-1" || evs[1].Step != "" || evs[1].ID == "" {
		t.Fatalf("sig-1 events after stop: %+v", evs)
	}
	var sig map[string]string
	if err := json.Unmarshal(evs[1].Data, &sig); err != nil {
		t.Fatal(err)
	}
	if want := map[string]string{"target": "sig-1", "reason": "enough for today"}; !maps.Equal(sig, want) {
		t.Errorf("signal.stop data %v, want %v", sig, want)
	}

	// --json with a step and --wait 0.
	r = loopbus(t, append([]string{"signal", "hint", "sig-1/review", "--message", "Prefer case studies.", "--wait", "0", "--json"}, global...)...)
	if r.code != 0 {
		t.Fatalf("signal hint: exit %d\n%s", r.code, r.stderr)
	}
	lines := parseSignalLines(t, r.stdout)
	if len(lines) != 1 || lines[0].Signal != "hint" || lines[0].Session != "sig-1" || lines[0].Step != "review" || lines[0].Target != "sig-1/review" ||
		lines[0].Result != "recorded" || lines[0].Seq == 0 || !strings.Contains(lines[0].Detail, "--wait 0") {
		t.Fatalf("signal hint --json: %+v", lines)
	}
	evs = events(t, global, "sig-1")
	last := evs[len(evs)-1]
	if last.Type != "loopbus.signal.info" || last.ID != lines[0].ID || last.Step != "review" || last.Subject != "sig-1/review" ||
		!strings.Contains(string(last.Data), `"message":"Prefer case studies."`) {
		t.Errorf("signal.info event: %+v %s", last, last.Data)
	}

	// all: one signal per running session, each with target all.
	r = loopbus(t, append([]string{"signal", "pause", "all", "--wait", "0", "--json"}, global...)...)
	if r.code != 0 {
		t.Fatalf("signal pause all: exit %d\n%s", r.code, r.stderr)
	}
	lines = parseSignalLines(t, r.stdout)
	if len(lines) != 2 || lines[0].Session != "sig-1" || lines[1].Session != "sig-2" || lines[0].Target != "all" || lines[1].Target != "all" || lines[0].ID == lines[1].ID {
		t.Fatalf("signal pause all: %+v", lines)
	}
	for _, l := range lines {
		evs := events(t, global, l.Session)
		if last := evs[len(evs)-1]; last.Type != "loopbus.signal.pause" || last.ID != l.ID || string(last.Data) != `{"target":"all"}` {
			t.Errorf("%s: last event %+v %s", l.Session, last, last.Data)
		}
	}

	// An acknowledgement, published by hand as any tool could, reaches the
	// command waiting for it, which prints it and exits 0.
	waiting := exec.Command(binary, "signal", "resume", "sig-2", "--reason", "go on", "--wait", "90s", "--nats", url)
	waiting.Env = testEnv(t)
	var out, errb syncBuffer
	waiting.Stdout, waiting.Stderr = &out, &errb
	if err := waiting.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- waiting.Wait() }()
	t.Cleanup(func() { _ = waiting.Process.Kill() })
	signalID := ""
	eventually(t, 60*time.Second, "signal.resume of sig-2 in the stream", func() bool {
		for _, e := range events(t, global, "sig-2") {
			if e.Type == "loopbus.signal.resume" {
				signalID = e.ID
			}
		}
		return signalID != ""
	})
	publishAck(t, url, "sig-2", `{"signalId":"`+signalID+`","signal":"resume","result":"applied","detail":"resumed session sig-2"}`)
	select {
	case err := <-exited:
		if err != nil || out.String() != "resume sig-2: applied — resumed session sig-2\n" {
			t.Errorf("signal resume: %v\nstdout: %q\nstderr: %s", err, out.String(), errb.String())
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("signal resume still waits after its acknowledgement\nstdout: %s\nstderr: %s", out.String(), errb.String())
	}

	// The server stops; a signal on its data directory starts it embedded,
	// where no orchestrator can be: recorded at once, no waiting.
	stopNATS()
	// With --wait 5m, waiting at all would outlast the 2-minute limit of
	// loopbus(); the deadline below only checks liveness.
	begin := time.Now()
	r = loopbus(t, "signal", "resume", "sig-2", "--data", data, "--wait", "5m")
	if r.code != 0 || !strings.Contains(r.stdout, "resume sig-2: recorded at stream sequence ") || !strings.Contains(r.stdout, "no orchestrator runs on this data directory") {
		t.Fatalf("embedded signal resume: exit %d\nstdout: %s\nstderr: %s", r.code, r.stdout, r.stderr)
	}
	if took := time.Since(begin); took > time.Minute {
		t.Errorf("embedded signal took %s: it waited for an acknowledgement no one can send", took)
	}
	local := []string{"--data", data}
	if evs := events(t, local, "sig-2"); evs[len(evs)-1].Type != "loopbus.signal.resume" {
		t.Errorf("sig-2's last event is %s, want loopbus.signal.resume", evs[len(evs)-1].Type)
	}
	if r := loopbus(t, "signal", "stop", "nope", "--data", data); r.code != 2 || !strings.Contains(r.stderr, "no such session: nope") {
		t.Errorf("embedded unknown session: exit %d\n%s", r.code, r.stderr)
	}
}

// publishAck publishes a signal.acknowledged of session with the given
// data as a structured CloudEvent, the way a tool outside loopbus would.
func publishAck(t *testing.T, url, session, data string) {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	id := fmt.Sprintf("ack-%d", time.Now().UnixNano())
	ce := fmt.Sprintf(`{"specversion":"1.0","id":%q,"source":"test/orchestrator","type":"loopbus.signal.acknowledged","subject":%q,`+
		`"time":%q,"datacontenttype":"application/json","dataschema":"urn:loopbus:schema:v1:signal.acknowledged","session":%q,"data":%s}`,
		id, session, time.Now().UTC().Format(time.RFC3339Nano), session, data)
	m := nats.NewMsg("loopbus.evt." + session + ".signal.acknowledged")
	m.Header.Set(nats.MsgIdHdr, id)
	m.Header.Set("Content-Type", "application/cloudevents+json")
	m.Data = []byte(ce)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := js.PublishMsg(ctx, m); err != nil {
		t.Fatal(err)
	}
}
