package agentworker_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/loopbus/loopbus/agent"
	"github.com/loopbus/loopbus/agentworker"
	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/internal/testnats"
	"github.com/loopbus/loopbus/schemas"
)

const session = "s1"

// waitTimeout bounds every wait for events; generous for -race on a busy
// machine, never reached when things work.
const waitTimeout = 30 * time.Second

// baseEnv is the worker's base environment for agents: just enough to find
// sh and the coreutils, plus a marker proving the base is passed on.
func baseEnv(extra ...string) []string {
	return append([]string{"PATH=" + os.Getenv("PATH"), "WORKER_BASE=from-worker"}, extra...)
}

// startWorker runs a worker until the returned stop is called (or the test
// ends); stop waits for Run to return.
func startWorker(t *testing.T, b *bus.Bus, cfg agentworker.Config) (stop func()) {
	t.Helper()
	if cfg.WorkDir == "" {
		cfg.WorkDir = t.TempDir()
	}
	if cfg.Env == nil {
		cfg.Env = baseEnv()
	}
	w, err := agentworker.New(cfg, b, testnats.Logger(t), time.Now)
	if err != nil {
		t.Fatalf("agentworker.New: %v", err)
	}
	return testnats.Run(t, "worker "+cfg.ID, w.Run)
}

// writeScript writes an agent script and returns its argv.
func writeScript(t *testing.T, body string) []string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "agent.sh")
	if err := os.WriteFile(p, []byte("#!/bin/sh\n"+body), 0o700); err != nil {
		t.Fatal(err)
	}
	return []string{"sh", p}
}

func putArtifact(t *testing.T, b *bus.Bus, object, name string, content []byte) schemas.ArtifactRef {
	t.Helper()
	ref, err := b.PutArtifact(context.Background(), object, name, bytes.NewReader(content))
	if err != nil {
		t.Fatalf("PutArtifact %s: %v", object, err)
	}
	return ref
}

// request builds a job request for step/iteration running argv.
func request(jobID, step string, iteration int, argv []string, outputs ...string) *schemas.JobRequested {
	jr := &schemas.JobRequested{
		JobID: jobID, Step: step, Iteration: iteration, Attempt: 1,
		Agent:     schemas.AgentSpec{Backend: "exec", Command: argv},
		Prompt:    "Summarise the talk.\n",
		Inputs:    []schemas.ArtifactRef{},
		TimeoutMs: 20000,
	}
	for _, o := range outputs {
		jr.Outputs = append(jr.Outputs, schemas.Output{Name: o})
	}
	return jr
}

// publishRequest publishes a job.requested and returns its stream sequence.
func publishRequest(t testing.TB, b *bus.Bus, jr *schemas.JobRequested) uint64 {
	t.Helper()
	p, err := b.Publish(context.Background(), schemas.Event{
		ID:          schemas.DeterministicID("test", session, "job.requested", jr.JobID),
		Type:        schemas.TypeJobRequested,
		Session:     session,
		Step:        jr.Step,
		Job:         jr.JobID,
		Correlation: session,
		Time:        time.Now(),
		Data:        jr,
	})
	if err != nil {
		t.Fatalf("publish job.requested %s: %v", jr.JobID, err)
	}
	return p.Seq
}

func sessionEvents(t *testing.T, b *bus.Bus) []schemas.Event {
	t.Helper()
	return testnats.Events(t, b, schemas.SessionSubjects(session))
}

func describe(evs []schemas.Event) string {
	var b strings.Builder
	for _, ev := range evs {
		d, _ := json.Marshal(ev.Data)
		fmt.Fprintf(&b, "\n  %d %s job=%s %s", ev.Seq, ev.Type, ev.Job, d)
	}
	return b.String()
}

// waitEvents polls the session's events until cond holds.
func waitEvents(t *testing.T, b *bus.Bus, what string, cond func([]schemas.Event) bool) []schemas.Event {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for {
		evs := sessionEvents(t, b)
		if cond(evs) {
			return evs
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s; events:%s", what, describe(evs))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func ofJob(evs []schemas.Event, jobID string) []schemas.Event {
	var out []schemas.Event
	for _, ev := range evs {
		if ev.Job == jobID {
			out = append(out, ev)
		}
	}
	return out
}

func ofType(evs []schemas.Event, typ string) []schemas.Event {
	var out []schemas.Event
	for _, ev := range evs {
		if ev.Type == typ {
			out = append(out, ev)
		}
	}
	return out
}

func isResult(ev schemas.Event) bool {
	return ev.Type == schemas.TypeJobCompleted || ev.Type == schemas.TypeJobFailed
}

// waitResult waits for the job.completed or job.failed of jobID and returns
// all the session's events then and the result.
func waitResult(t *testing.T, b *bus.Bus, jobID string) ([]schemas.Event, schemas.Event) {
	t.Helper()
	var res schemas.Event
	evs := waitEvents(t, b, "the result of "+jobID, func(evs []schemas.Event) bool {
		for _, ev := range ofJob(evs, jobID) {
			if isResult(ev) {
				res = ev
				return true
			}
		}
		return false
	})
	return evs, res
}

func types(evs []schemas.Event) []string {
	out := make([]string, len(evs))
	for i, ev := range evs {
		out[i] = ev.Type
	}
	return out
}

// waitAcked waits until the shared consumer has no unacknowledged message.
func waitAcked(t *testing.T, b *bus.Bus) {
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(waitTimeout)
	for {
		cons, err := b.JetStream().Consumer(ctx, b.StreamName(), agentworker.ConsumerName)
		if err != nil {
			t.Fatalf("consumer %s: %v", agentworker.ConsumerName, err)
		}
		info, err := cons.Info(ctx)
		if err != nil {
			t.Fatalf("consumer info: %v", err)
		}
		if info.NumAckPending == 0 && info.NumPending == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("consumer still has %d unacknowledged and %d pending messages", info.NumAckPending, info.NumPending)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func consumerRedelivered(t *testing.T, b *bus.Bus) int {
	t.Helper()
	cons, err := b.JetStream().Consumer(context.Background(), b.StreamName(), agentworker.ConsumerName)
	if err != nil {
		t.Fatal(err)
	}
	info, err := cons.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info.NumRedelivered
}

func fetch(t *testing.T, b *bus.Bus, ref schemas.ArtifactRef) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := b.GetArtifact(context.Background(), ref, &buf); err != nil {
		t.Fatalf("GetArtifact %s: %v", ref.Object, err)
	}
	return buf.Bytes()
}

func envMap(dump []byte) map[string]string {
	m := map[string]string{}
	for _, line := range strings.Split(string(dump), "\x00") {
		if k, v, ok := strings.Cut(line, "="); ok {
			m[k] = v
		}
	}
	return m
}

func TestHappyPathAgentContract(t *testing.T) {
	b, _ := testnats.Bus(t)
	input := []byte("# Event-sourced agents\n\nA talk about logs.\n")
	in := putArtifact(t, b, "s1/input/talk.md", "talk.md", input)

	argv := writeScript(t, `set -eu
o="$LOOPBUS_OUTPUT_DIR"
cat > "$o/stdin.txt"
cat "$LOOPBUS_PROMPT_FILE" > "$o/prompt.txt"
cat "$LOOPBUS_FEEDBACK_FILE" > "$o/feedback.txt"
cat "$LOOPBUS_INPUT_DIR/talk.md" > "$o/input.md"
ls -A "$LOOPBUS_INPUT_DIR" > "$o/inputs.txt"
pwd -P > "$o/cwd.txt"
env -0 > out/env.txt
echo "agent done"
`)
	outputs := []string{"stdin.txt", "prompt.txt", "feedback.txt", "input.md", "inputs.txt", "cwd.txt", "env.txt"}
	jr := request("s1.summary.2", "summary", 2, argv, outputs...)
	jr.Inputs = []schemas.ArtifactRef{in}
	jr.Prompt = "Summarise talk.md into JSON.\nBe brief.\n"
	jr.Agent.Env = map[string]string{"AGENT_MODEL": "tiny", "WORKER_BASE": "overridden-by-agent"}
	jr.Feedback = []schemas.Feedback{{
		Iteration: 1, Kind: "validation",
		Errors:    []schemas.ValidationError{{Artifact: "summary.json", Pointer: "/title", Message: "got number, want string", Source: "schema"}},
		RetryHint: "Fix the title.",
	}}
	reqSeq := publishRequest(t, b, jr)

	workDir := t.TempDir()
	startWorker(t, b, agentworker.Config{ID: "worker-a", WorkDir: workDir})
	all, res := waitResult(t, b, jr.JobID)
	if res.Type != schemas.TypeJobCompleted {
		t.Fatalf("result is %s, want job.completed; events:%s", res.Type, describe(all))
	}

	evs := ofJob(all, jr.JobID)
	wantTypes := []string{schemas.TypeJobRequested, schemas.TypeJobStarted, schemas.TypeToolStarted, schemas.TypeToolCompleted}
	for range outputs {
		wantTypes = append(wantTypes, schemas.TypeArtifactStored)
	}
	wantTypes = append(wantTypes, schemas.TypeJobCompleted)
	if got := types(evs); strings.Join(got, " ") != strings.Join(wantTypes, " ") {
		t.Fatalf("event types:\n got %v\nwant %v", got, wantTypes)
	}
	for _, ev := range evs[1:] {
		if ev.Session != session || ev.Step != "summary" || ev.Causation != evs[0].ID || ev.Correlation != session {
			t.Errorf("%s: session/step/causation/correlation = %s/%s/%s/%s, want %s/summary/%s/%s",
				ev.Type, ev.Session, ev.Step, ev.Causation, ev.Correlation, session, evs[0].ID, session)
		}
	}

	js := evs[1].Data.(*schemas.JobStarted)
	if *js != (schemas.JobStarted{JobID: jr.JobID, Worker: "worker-a", Delivery: 1}) {
		t.Errorf("job.started = %+v", *js)
	}
	ts := evs[2].Data.(*schemas.ToolStarted)
	tc := evs[3].Data.(*schemas.ToolCompleted)
	if ts.JobID != jr.JobID || ts.Name != "sh" || ts.Lane != "no-net" || ts.ToolID == "" || !strings.Contains(ts.Input, argv[1]) {
		t.Errorf("tool.started = %+v", *ts)
	}
	if tc.ToolID != ts.ToolID || tc.Status != "ok" || tc.ExitCode != 0 || tc.Error != "" || !strings.Contains(tc.Output, "agent done") {
		t.Errorf("tool.completed = %+v", *tc)
	}

	jc := res.Data.(*schemas.JobCompleted)
	if jc.JobID != jr.JobID || jc.Step != "summary" || jc.Iteration != 2 || jc.Worker != "worker-a" || jc.ExitCode != 0 {
		t.Errorf("job.completed = %+v", *jc)
	}
	if jc.RequestSeq != reqSeq || evs[0].Seq != reqSeq {
		t.Errorf("job.completed RequestSeq = %d, want %d (the job.requested)", jc.RequestSeq, reqSeq)
	}
	if !strings.Contains(jc.OutputTail, "agent done") {
		t.Errorf("OutputTail = %q", jc.OutputTail)
	}
	if len(jc.Artifacts) != len(outputs) {
		t.Fatalf("job.completed has %d artifacts, want %d", len(jc.Artifacts), len(outputs))
	}

	got := map[string][]byte{}
	for i, ev := range evs[4 : 4+len(outputs)] {
		as := ev.Data.(*schemas.ArtifactStored)
		ref := jc.Artifacts[i]
		if as.JobID != jr.JobID || as.Artifact != ref {
			t.Errorf("artifact.stored %d = %+v, job.completed lists %+v", i, *as, ref)
		}
		if ref.Name != outputs[i] || ref.Step != "summary" {
			t.Errorf("artifact %d: name %q step %q, want %q summary", i, ref.Name, ref.Step, outputs[i])
		}
		data := fetch(t, b, ref)
		if ref.Digest != schemas.Digest(data) || ref.Size != int64(len(data)) {
			t.Errorf("%s: digest %s size %d, bytes hash to %s size %d", ref.Name, ref.Digest, ref.Size, schemas.Digest(data), len(data))
		}
		got[ref.Name] = data
	}

	// The workspace is a fresh directory <session>.summary-2-1-<random>
	// under workDir, named by LOOPBUS_WORKSPACE; cwd must be it.
	root := envMap(got["env.txt"])["LOOPBUS_WORKSPACE"]
	if filepath.Dir(root) != workDir || !strings.HasPrefix(filepath.Base(root), session+".summary-2-1-") {
		t.Fatalf("LOOPBUS_WORKSPACE = %q, want a directory %s.summary-2-1-* under %s", root, session, workDir)
	}
	realRoot := root
	if r, err := filepath.EvalSymlinks(workDir); err == nil {
		realRoot = filepath.Join(r, filepath.Base(root))
	}
	checks := []struct {
		name, want string
	}{
		{"stdin.txt", jr.Prompt},
		{"prompt.txt", jr.Prompt},
		{"feedback.txt", schemas.FormatFeedback(jr.Feedback)},
		{"input.md", string(input)},
		{"inputs.txt", "talk.md\n"},
		{"cwd.txt", realRoot + "\n"},
	}
	for _, c := range checks {
		if string(got[c.name]) != c.want {
			t.Errorf("%s = %q, want %q", c.name, got[c.name], c.want)
		}
	}
	if !strings.Contains(string(got["feedback.txt"]), "Fix the title.") {
		t.Errorf("feedback file %q lacks the retry hint", got["feedback.txt"])
	}

	env := envMap(got["env.txt"])
	wantEnv := map[string]string{
		"LOOPBUS_SESSION":       session,
		"LOOPBUS_STEP":          "summary",
		"LOOPBUS_JOB":           jr.JobID,
		"LOOPBUS_ITERATION":     "2",
		"LOOPBUS_WORKSPACE":     root,
		"LOOPBUS_INPUT_DIR":     filepath.Join(root, "in"),
		"LOOPBUS_OUTPUT_DIR":    filepath.Join(root, "out"),
		"LOOPBUS_PROMPT_FILE":   filepath.Join(root, "prompt.md"),
		"LOOPBUS_FEEDBACK_FILE": filepath.Join(root, "feedback.md"),
		"AGENT_MODEL":           "tiny",
		"WORKER_BASE":           "overridden-by-agent",
	}
	for k, want := range wantEnv {
		if env[k] != want {
			t.Errorf("agent env %s = %q, want %q", k, env[k], want)
		}
	}

	waitAcked(t, b)
	if n := consumerRedelivered(t, b); n != 0 {
		t.Errorf("consumer redelivered %d messages", n)
	}
	if _, err := os.Stat(root); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("workspace %s not removed after the job: %v", root, err)
	}
}

func TestBaseEnvironmentReachesAgent(t *testing.T) {
	b, _ := testnats.Bus(t)
	argv := writeScript(t, `env -0 > "$LOOPBUS_OUTPUT_DIR/env.txt"`)
	jr := request("s1.envcheck.1", "envcheck", 1, argv, "env.txt")
	publishRequest(t, b, jr)
	startWorker(t, b, agentworker.Config{ID: "w", Env: baseEnv("LOOPBUS_STEP=spoofed")})
	all, res := waitResult(t, b, jr.JobID)
	if res.Type != schemas.TypeJobCompleted {
		t.Fatalf("result %s; events:%s", res.Type, describe(all))
	}
	env := envMap(fetch(t, b, res.Data.(*schemas.JobCompleted).Artifacts[0]))
	if env["WORKER_BASE"] != "from-worker" {
		t.Errorf("WORKER_BASE = %q, want the worker's base value", env["WORKER_BASE"])
	}
	if env["LOOPBUS_STEP"] != "envcheck" {
		t.Errorf("LOOPBUS_STEP = %q: the contract must override the base environment", env["LOOPBUS_STEP"])
	}
}

func TestJobFailures(t *testing.T) {
	tests := []struct {
		name string
		// script is the agent's body; PIDFILE is set in its environment.
		script  string
		outputs []string
		// edit adjusts the request after it is built (inputs, timeout, ...).
		edit           func(t *testing.T, b *bus.Bus, jr *schemas.JobRequested)
		maxOutputBytes int64
		wantErr        []string
		wantExit       int
		wantTail       string
		// wantTool is the tool.completed status; "" means no tool ran.
		wantTool string
		check    func(t *testing.T, pidfile string)
	}{
		{
			name:     "missing output",
			script:   "echo working\n",
			outputs:  []string{"report.json"},
			wantErr:  []string{"report.json", "$LOOPBUS_OUTPUT_DIR/report.json"},
			wantTool: "ok",
			wantTail: "working",
		},
		{
			name:     "one of two outputs missing",
			script:   `echo '{}' > "$LOOPBUS_OUTPUT_DIR/a.json"` + "\n",
			outputs:  []string{"a.json", "b.json"},
			wantErr:  []string{"missing output b.json", "$LOOPBUS_OUTPUT_DIR/b.json"},
			wantTool: "ok",
		},
		{
			name:     "exit code 3",
			script:   "echo 'reading input'\necho 'fatal: model refused' >&2\nexit 3\n",
			outputs:  []string{"report.json"},
			wantErr:  []string{"exited with code 3"},
			wantExit: 3,
			wantTail: "fatal: model refused",
			wantTool: "error",
		},
		{
			name:   "timeout kills the process group",
			script: "echo started\nsleep 30 &\necho $! > \"$PIDFILE\"\nwait\n",
			edit: func(_ *testing.T, _ *bus.Bus, jr *schemas.JobRequested) {
				jr.TimeoutMs = 500
			},
			outputs:  []string{"report.json"},
			wantErr:  []string{"timed out"},
			wantExit: -1,
			wantTail: "started",
			wantTool: "timeout",
			check: func(t *testing.T, pidfile string) {
				raw, err := os.ReadFile(pidfile)
				if err != nil {
					t.Fatalf("pidfile: %v", err)
				}
				pid, err := strconv.Atoi(strings.TrimSpace(string(raw)))
				if err != nil || pid <= 0 {
					t.Fatalf("pidfile holds %q", raw)
				}
				waitDead(t, pid)
			},
		},
		{
			name:     "output is a symlink outside the workspace",
			script:   "ln -s \"$SECRET\" \"$LOOPBUS_OUTPUT_DIR/report.json\"\n",
			outputs:  []string{"report.json"},
			wantErr:  []string{"report.json", "symbolic link"},
			wantTool: "ok",
		},
		{
			name:     "output is a symlink to /etc/passwd",
			script:   "ln -s /etc/passwd \"$LOOPBUS_OUTPUT_DIR/report.json\"\n",
			outputs:  []string{"report.json"},
			wantErr:  []string{"symbolic link"},
			wantTool: "ok",
		},
		{
			name:     "output is a directory",
			script:   "mkdir \"$LOOPBUS_OUTPUT_DIR/report.json\"\n",
			outputs:  []string{"report.json"},
			wantErr:  []string{"not a regular file"},
			wantTool: "ok",
		},
		{
			name:           "output over MaxOutputBytes",
			script:         "head -c 2000 /dev/zero > \"$LOOPBUS_OUTPUT_DIR/report.json\"\n",
			outputs:        []string{"report.json"},
			maxOutputBytes: 1024,
			wantErr:        []string{"report.json", "2000 bytes", "1024-byte limit"},
			wantTool:       "ok",
		},
		{
			name:    "input object missing",
			script:  "echo '{}' > \"$LOOPBUS_OUTPUT_DIR/report.json\"\n",
			outputs: []string{"report.json"},
			edit: func(_ *testing.T, _ *bus.Bus, jr *schemas.JobRequested) {
				jr.Inputs = []schemas.ArtifactRef{{
					Name: "talk.md", Object: "s1/input/never-stored.md",
					Digest: schemas.Digest([]byte("x")), Size: 1,
				}}
			},
			wantErr:  []string{"cannot provide inputs", "talk.md"},
			wantExit: -1,
		},
		{
			name:    "input digest mismatch",
			script:  "echo '{}' > \"$LOOPBUS_OUTPUT_DIR/report.json\"\n",
			outputs: []string{"report.json"},
			edit: func(t *testing.T, b *bus.Bus, jr *schemas.JobRequested) {
				ref := putArtifact(t, b, "s1/input/talk.md", "talk.md", []byte("real bytes"))
				ref.Digest = schemas.Digest([]byte("other bytes"))
				jr.Inputs = []schemas.ArtifactRef{ref}
			},
			wantErr:  []string{"cannot provide inputs", "digest mismatch"},
			wantExit: -1,
		},
		{
			name:    "unsupported backend",
			script:  "exit 0\n",
			outputs: []string{"report.json"},
			edit: func(_ *testing.T, _ *bus.Bus, jr *schemas.JobRequested) {
				jr.Agent.Backend = "docker"
			},
			wantErr:  []string{`backend "docker"`, "not supported"},
			wantExit: -1,
		},
		{
			name:    "command cannot start",
			script:  "exit 0\n",
			outputs: []string{"report.json"},
			edit: func(_ *testing.T, _ *bus.Bus, jr *schemas.JobRequested) {
				jr.Agent.Command = []string{"/nonexistent/agent-binary"}
			},
			wantErr:  []string{"/nonexistent/agent-binary"},
			wantExit: -1,
			wantTool: "error",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b, _ := testnats.Bus(t)
			pidfile := filepath.Join(t.TempDir(), "pid")
			secret := filepath.Join(t.TempDir(), "secret.txt")
			if err := os.WriteFile(secret, []byte("do not read me"), 0o600); err != nil {
				t.Fatal(err)
			}
			jr := request("s1.step.1", "step", 1, writeScript(t, tt.script), tt.outputs...)
			jr.Agent.Env = map[string]string{"PIDFILE": pidfile, "SECRET": secret}
			if tt.edit != nil {
				tt.edit(t, b, jr)
			}
			publishRequest(t, b, jr)
			startWorker(t, b, agentworker.Config{ID: "w1", MaxOutputBytes: tt.maxOutputBytes})

			all, res := waitResult(t, b, jr.JobID)
			if res.Type != schemas.TypeJobFailed {
				t.Fatalf("result is %s, want job.failed; events:%s", res.Type, describe(all))
			}
			jf := res.Data.(*schemas.JobFailed)
			for _, s := range tt.wantErr {
				if !strings.Contains(jf.Error, s) {
					t.Errorf("job.failed error %q does not mention %q", jf.Error, s)
				}
			}
			if jf.JobID != jr.JobID || jf.Step != "step" || jf.Iteration != 1 || jf.Worker != "w1" {
				t.Errorf("job.failed = %+v", *jf)
			}
			if jf.ExitCode != tt.wantExit {
				t.Errorf("job.failed exit code = %d, want %d", jf.ExitCode, tt.wantExit)
			}
			if !strings.Contains(jf.OutputTail, tt.wantTail) {
				t.Errorf("job.failed output tail %q does not contain %q", jf.OutputTail, tt.wantTail)
			}

			evs := ofJob(all, jr.JobID)
			if n := len(ofType(evs, schemas.TypeArtifactStored)); n != 0 && len(tt.outputs) == 1 {
				t.Errorf("%d artifact.stored events for a failed job", n)
			}
			if n := len(ofType(evs, schemas.TypeJobCompleted)); n != 0 {
				t.Errorf("job.completed published as well")
			}
			tools := ofType(evs, schemas.TypeToolCompleted)
			switch {
			case tt.wantTool == "" && len(tools) != 0:
				t.Errorf("a tool ran: %s", describe(tools))
			case tt.wantTool != "" && len(tools) != 1:
				t.Errorf("%d tool.completed events, want 1", len(tools))
			case tt.wantTool != "":
				if tc := tools[0].Data.(*schemas.ToolCompleted); tc.Status != tt.wantTool {
					t.Errorf("tool.completed status = %q, want %q (%+v)", tc.Status, tt.wantTool, *tc)
				}
			}
			for _, name := range objects(t, b) {
				if strings.HasPrefix(name, jr.JobID+"/") {
					t.Errorf("output %s of the failed job was stored", name)
				}
			}
			waitAcked(t, b)
			if tt.check != nil {
				tt.check(t, pidfile)
			}
		})
	}
}

// waitDead waits until pid no longer runs (gone, or a zombie awaiting a
// reaper that is not ours).
func waitDead(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
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
			t.Fatalf("grandchild %d still runs after the job timed out (kill: %v)", pid, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A job whose input cannot be fetched failed through no fault of the
// agent: JobFailed.Retryable documents exactly this case.
func TestInputFailureIsRetryable(t *testing.T) {
	b, _ := testnats.Bus(t)
	jr := request("s1.step.1", "step", 1, writeScript(t, "exit 0\n"), "report.json")
	jr.Inputs = []schemas.ArtifactRef{{Name: "talk.md", Object: "s1/input/never-stored.md", Digest: schemas.Digest(nil), Size: 0}}
	publishRequest(t, b, jr)
	startWorker(t, b, agentworker.Config{ID: "w1"})
	all, res := waitResult(t, b, jr.JobID)
	jf, ok := res.Data.(*schemas.JobFailed)
	if !ok || !strings.Contains(jf.Error, "cannot provide inputs") {
		t.Fatalf("want job.failed for the input; events:%s", describe(all))
	}
	if !jf.Retryable {
		t.Errorf("job.failed %q has Retryable false; schemas.JobFailed documents an unfetchable input as retryable", jf.Error)
	}
}

// blockingAgent blocks while MODE=block (set in the worker's base
// environment), else writes its output and records the worker's pid.
const blockingAgent = `set -eu
if [ "${MODE:-}" = block ]; then
	echo blocking
	sleep 60
fi
echo done > "$LOOPBUS_OUTPUT_DIR/report.txt"
`

func TestInterruptedJobIsHandedBack(t *testing.T) {
	b, _ := testnats.Bus(t)
	jr := request("s1.step.1", "step", 1, writeScript(t, blockingAgent), "report.txt")
	reqSeq := publishRequest(t, b, jr)

	stop1 := startWorker(t, b, agentworker.Config{ID: "w1", AckWait: time.Second, Env: baseEnv("MODE=block")})
	waitEvents(t, b, "w1 to run the agent", func(evs []schemas.Event) bool {
		return len(ofType(ofJob(evs, jr.JobID), schemas.TypeToolStarted)) == 1
	})
	// Well past AckWait: heartbeats must keep the job with w1.
	time.Sleep(2500 * time.Millisecond)
	if started := ofType(ofJob(sessionEvents(t, b), jr.JobID), schemas.TypeJobStarted); len(started) != 1 {
		t.Fatalf("job started %d times while w1 was running it:%s", len(started), describe(started))
	}
	stop1()

	startWorker(t, b, agentworker.Config{ID: "w2", AckWait: time.Second})
	all, res := waitResult(t, b, jr.JobID)
	if res.Type != schemas.TypeJobCompleted {
		t.Fatalf("result %s, want job.completed; events:%s", res.Type, describe(all))
	}
	if jc := res.Data.(*schemas.JobCompleted); jc.Worker != "w2" || jc.RequestSeq != reqSeq {
		t.Errorf("job.completed worker %q request seq %d, want w2 %d", jc.Worker, jc.RequestSeq, reqSeq)
	}
	var got []string
	for _, ev := range ofType(ofJob(all, jr.JobID), schemas.TypeJobStarted) {
		js := ev.Data.(*schemas.JobStarted)
		got = append(got, fmt.Sprintf("%s/%d", js.Worker, js.Delivery))
	}
	if want := "w1/1 w2/2"; strings.Join(got, " ") != want {
		t.Errorf("job.started (worker/delivery) = %v, want %s", got, want)
	}
	if n := len(ofType(ofJob(all, jr.JobID), schemas.TypeToolCompleted)); n != 2 {
		t.Errorf("%d tool.completed events, want 2 (the interrupted run and the second)", n)
	}
	waitAcked(t, b)
}

// TestJobHandedOutAgainAfterItsResult: a server that loses its record of
// a hand-out (killed right after it) hands the job out again under the
// same delivery count, here by losing the consumer while the worker is
// stopped. The worker finds the delivery announced before and the
// request's result stored, acknowledges it, and does not run the agent
// again.
func TestJobHandedOutAgainAfterItsResult(t *testing.T) {
	b, _ := testnats.Bus(t)
	runs := filepath.Join(t.TempDir(), "runs")
	jr := request("s1.step.1", "step", 1, writeScript(t, `echo run >> "`+runs+`"
echo done > "$LOOPBUS_OUTPUT_DIR/report.txt"
`), "report.txt")
	reqSeq := publishRequest(t, b, jr)
	stop := startWorker(t, b, agentworker.Config{ID: "w1"})
	if _, res := waitResult(t, b, jr.JobID); res.Type != schemas.TypeJobCompleted {
		t.Fatalf("result %s, want job.completed", res.Type)
	}
	waitAcked(t, b)
	stop()

	ctx := context.Background()
	if err := b.JetStream().DeleteConsumer(ctx, b.StreamName(), agentworker.ConsumerName); err != nil {
		t.Fatal(err)
	}
	// The worker makes the consumer again, which hands out the request
	// anew; wait until it is acknowledged.
	startWorker(t, b, agentworker.Config{ID: "w1"})
	deadline := time.Now().Add(waitTimeout)
	for {
		cons, err := b.JetStream().Consumer(ctx, b.StreamName(), agentworker.ConsumerName)
		if err == nil {
			info, err := cons.Info(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if info.Delivered.Stream >= reqSeq && info.NumAckPending == 0 && info.NumPending == 0 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("the request was not handed out again and acknowledged")
		}
		time.Sleep(50 * time.Millisecond)
	}
	got, err := os.ReadFile(runs)
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(got), "run\n"); n != 1 {
		t.Errorf("the agent ran %d times, want 1", n)
	}
	all := ofJob(sessionEvents(t, b), jr.JobID)
	if n := len(ofType(all, schemas.TypeJobStarted)); n != 1 {
		t.Errorf("%d job.started, want 1:%s", n, describe(all))
	}
	if n := len(ofType(all, schemas.TypeJobCompleted)); n != 1 {
		t.Errorf("%d job.completed, want 1:%s", n, describe(all))
	}
}

// TestAbandonedJobFails: a job whose workers keep stopping is failed, not
// run again, by the worker that gets it once MaxAttempts starts are used
// up. Unsigned, that worker does not start the job; with signed events
// only a job's holder may state its result, so it takes the job over
// first (a job.started at its own, higher delivery).
func TestAbandonedJobFails(t *testing.T) {
	for _, signed := range []bool{false, true} {
		t.Run(fmt.Sprintf("signed=%v", signed), func(t *testing.T) {
			srv := testnats.Server(t)
			b1, b2 := workerBus(t, srv.URL(), "w1", signed), workerBus(t, srv.URL(), "w2", signed)
			jr := request("s1.step.1", "step", 1, writeScript(t, blockingAgent), "report.txt")
			publishRequest(t, b1, jr)

			stop1 := startWorker(t, b1, agentworker.Config{ID: "w1", MaxAttempts: 1, Env: baseEnv("MODE=block")})
			waitEvents(t, b1, "w1 to run the agent", func(evs []schemas.Event) bool {
				return len(ofType(ofJob(evs, jr.JobID), schemas.TypeToolStarted)) == 1
			})
			stop1()

			// The second delivery exceeds MaxAttempts 1: the job is failed, not run.
			startWorker(t, b2, agentworker.Config{ID: "w2", MaxAttempts: 1})
			all, res := waitResult(t, b2, jr.JobID)
			jf, ok := res.Data.(*schemas.JobFailed)
			if !ok {
				t.Fatalf("result %s, want job.failed; events:%s", res.Type, describe(all))
			}
			if !strings.Contains(jf.Error, "abandoned") || jf.Worker != "w2" {
				t.Errorf("job.failed = %+v, want an abandoned job failed by w2", *jf)
			}
			evs := ofJob(all, jr.JobID)
			var got []string
			for _, ev := range ofType(evs, schemas.TypeJobStarted) {
				js := ev.Data.(*schemas.JobStarted)
				got = append(got, fmt.Sprintf("%s/%d", js.Worker, js.Delivery))
			}
			want := "w1/1"
			if signed {
				want = "w1/1 w2/2"
			}
			if strings.Join(got, " ") != want {
				t.Errorf("job.started (worker/delivery) = %v, want %s", got, want)
			}
			if n := len(ofType(evs, schemas.TypeToolStarted)); n != 1 {
				t.Errorf("%d tool.started events, want 1", n)
			}
			waitAcked(t, b2)
		})
	}
}

// TestSignedWorkerHoldsItsLease: a worker that signs its events states a
// lease in its job.started, sends a job.heartbeat every third of it while
// the job runs, and announces job.released when it hands the job back
// (shutting down), so the orchestrator lets the next worker take it over
// at once. Unsigned, none of this is sent: nobody holds a job.
func TestSignedWorkerHoldsItsLease(t *testing.T) {
	for _, signed := range []bool{false, true} {
		t.Run(fmt.Sprintf("signed=%v", signed), func(t *testing.T) {
			srv := testnats.Server(t)
			b1, b2 := workerBus(t, srv.URL(), "w1", signed), workerBus(t, srv.URL(), "w2", signed)
			jr := request("s1.step.1", "step", 1, writeScript(t, blockingAgent), "report.txt")
			publishRequest(t, b1, jr)

			const lease = 900 * time.Millisecond
			stop1 := startWorker(t, b1, agentworker.Config{ID: "w1", AckWait: lease, Env: baseEnv("MODE=block")})
			waitEvents(t, b1, "w1 to run the agent", func(evs []schemas.Event) bool {
				return len(ofType(ofJob(evs, jr.JobID), schemas.TypeToolStarted)) == 1
			})
			if signed {
				waitEvents(t, b1, "two heartbeats from w1", func(evs []schemas.Event) bool {
					return len(ofType(ofJob(evs, jr.JobID), schemas.TypeJobHeartbeat)) >= 2
				})
			}
			stop1()
			startWorker(t, b2, agentworker.Config{ID: "w2", AckWait: lease})
			all, res := waitResult(t, b2, jr.JobID)
			if jc, ok := res.Data.(*schemas.JobCompleted); !ok || jc.Worker != "w2" {
				t.Fatalf("result %s, want job.completed by w2; events:%s", res.Type, describe(all))
			}
			evs := ofJob(all, jr.JobID)
			first := ofType(evs, schemas.TypeJobStarted)[0].Data.(*schemas.JobStarted)
			heartbeats, releases := ofType(evs, schemas.TypeJobHeartbeat), ofType(evs, schemas.TypeJobReleased)
			if !signed {
				if first.LeaseMs != 0 || len(heartbeats) != 0 || len(releases) != 0 {
					t.Errorf("unsigned: lease %d ms, %d heartbeats, %d releases; want none", first.LeaseMs, len(heartbeats), len(releases))
				}
				return
			}
			if first.LeaseMs != lease.Milliseconds() {
				t.Errorf("job.started states a lease of %d ms, want %d", first.LeaseMs, lease.Milliseconds())
			}
			for _, hb := range heartbeats {
				if d := hb.Data.(*schemas.JobHeartbeat); d.Worker == "w1" && d.Delivery != 1 {
					t.Errorf("w1's heartbeat names delivery %d, want 1", d.Delivery)
				}
			}
			if len(releases) != 1 {
				t.Fatalf("%d job.released events, want 1 (w1's); events:%s", len(releases), describe(evs))
			}
			rel := releases[0]
			if d := rel.Data.(*schemas.JobReleased); d.Worker != "w1" || d.Delivery != 1 || !strings.Contains(d.Reason, "shutting down") {
				t.Errorf("job.released = %+v, want w1's release of delivery 1 on shutdown", *d)
			}
			// The release comes before the next worker's start.
			if second := ofType(evs, schemas.TypeJobStarted)[1]; second.Seq < rel.Seq {
				t.Errorf("w2 started the job (seq %d) before w1 released it (seq %d)", second.Seq, rel.Seq)
			}
			waitAcked(t, b2)
		})
	}
}

// workerBus connects a worker's bus to url, signing with a key of its own
// when signed.
func workerBus(t *testing.T, url, name string, signed bool) *bus.Bus {
	t.Helper()
	if !signed {
		return testnats.Connect(t, url, "test/"+name)
	}
	seed := filepath.Join(t.TempDir(), name+".seed")
	if _, err := bus.NewSignKey(seed); err != nil {
		t.Fatal(err)
	}
	cat, err := schemas.NewCatalogue()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := bus.Connect(ctx, bus.Config{URL: url, SignKeyFile: seed}, "test/"+name, cat, testnats.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	return b
}

func TestConcurrencyRunsJobsAtOnce(t *testing.T) {
	b, _ := testnats.Bus(t)
	marks := t.TempDir()
	// Each agent announces itself, then waits for the other: they can only
	// both finish when they run at the same time.
	script := writeScript(t, `set -eu
touch "$MARKS/$LOOPBUS_STEP"
i=0
while [ ! -e "$MARKS/$OTHER" ]; do
	i=$((i+1))
	if [ "$i" -gt 300 ]; then echo "never saw $OTHER" >&2; exit 7; fi
	sleep 0.05
done
echo ok > "$LOOPBUS_OUTPUT_DIR/out.txt"
`)
	a := request("s1.alpha.1", "alpha", 1, script, "out.txt")
	a.Agent.Env = map[string]string{"MARKS": marks, "OTHER": "beta"}
	c := request("s1.beta.1", "beta", 1, script, "out.txt")
	c.Agent.Env = map[string]string{"MARKS": marks, "OTHER": "alpha"}
	publishRequest(t, b, a)
	publishRequest(t, b, c)

	startWorker(t, b, agentworker.Config{ID: "w", Concurrency: 2})
	for _, jr := range []*schemas.JobRequested{a, c} {
		all, res := waitResult(t, b, jr.JobID)
		if res.Type != schemas.TypeJobCompleted {
			t.Errorf("%s: result %s, want job.completed; events:%s", jr.JobID, res.Type, describe(ofJob(all, jr.JobID)))
		}
	}
	waitAcked(t, b)
}

func TestWorkersShareTheConsumer(t *testing.T) {
	b, _ := testnats.Bus(t)
	script := writeScript(t, `sleep 0.2; echo "$LOOPBUS_JOB" > "$LOOPBUS_OUTPUT_DIR/out.txt"`+"\n")
	var jobs []string
	for i := 1; i <= 4; i++ {
		jr := request(fmt.Sprintf("s1.step%d.1", i), fmt.Sprintf("step%d", i), 1, script, "out.txt")
		publishRequest(t, b, jr)
		jobs = append(jobs, jr.JobID)
	}
	startWorker(t, b, agentworker.Config{ID: "w1"})
	startWorker(t, b, agentworker.Config{ID: "w2"})

	all := waitEvents(t, b, "4 results", func(evs []schemas.Event) bool {
		n := 0
		for _, ev := range evs {
			if isResult(ev) {
				n++
			}
		}
		return n >= len(jobs)
	})
	waitAcked(t, b)
	all = sessionEvents(t, b) // anything a duplicate run would have added
	byWorker := map[string]int{}
	for _, job := range jobs {
		evs := ofJob(all, job)
		completed := ofType(evs, schemas.TypeJobCompleted)
		if len(completed) != 1 || len(ofType(evs, schemas.TypeJobFailed)) != 0 {
			t.Errorf("%s: want exactly one job.completed and no job.failed; events:%s", job, describe(evs))
			continue
		}
		if n := len(ofType(evs, schemas.TypeJobStarted)); n != 1 {
			t.Errorf("%s started %d times, want once", job, n)
		}
		jc := completed[0].Data.(*schemas.JobCompleted)
		byWorker[jc.Worker]++
		if data := fetch(t, b, jc.Artifacts[0]); string(data) != job+"\n" {
			t.Errorf("%s: output %q", job, data)
		}
	}
	t.Logf("jobs per worker: %v", byWorker)
	if n := consumerRedelivered(t, b); n != 0 {
		t.Errorf("consumer redelivered %d messages", n)
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	b, _ := testnats.Bus(t)
	tests := []struct {
		name    string
		cfg     agentworker.Config
		nilBus  bool
		wantErr bool
	}{
		{name: "zero value", cfg: agentworker.Config{}},
		{name: "negative concurrency", cfg: agentworker.Config{Concurrency: -1}, wantErr: true},
		{name: "negative attempts", cfg: agentworker.Config{MaxAttempts: -1}, wantErr: true},
		{name: "negative output limit", cfg: agentworker.Config{MaxOutputBytes: -1}, wantErr: true},
		{name: "negative ack wait", cfg: agentworker.Config{AckWait: -time.Second}, wantErr: true},
		{name: "some lanes", cfg: agentworker.Config{Lanes: []string{"no-net", "net"}, LaneTable: map[string]string{"Bash": "net", "mcp__db__*": "heavy"}}},
		{name: "unknown lane", cfg: agentworker.Config{Lanes: []string{"no-net", "gpu"}}, wantErr: true},
		{name: "lane table with an unknown lane", cfg: agentworker.Config{LaneTable: map[string]string{"Bash": "hevy"}}, wantErr: true},
		{name: "lane table with a bad key", cfg: agentworker.Config{LaneTable: map[string]string{"Bash(git:*)": "net"}}, wantErr: true},
		{name: "no bus", nilBus: true, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var bb agentworker.Bus = b
			if tt.nilBus {
				bb = nil
			}
			_, err := agentworker.New(tt.cfg, bb, testnats.Logger(t), time.Now)
			if (err != nil) != tt.wantErr {
				t.Fatalf("New error = %v, wantErr %v", err, tt.wantErr)
			}
		})
	}
}

// An agent that swaps out/ for a symbolic link to another directory must
// not get a file from there stored as its output.
func TestOutputDirSymlinkIsRefused(t *testing.T) {
	b, _ := testnats.Bus(t)
	elsewhere := t.TempDir()
	if err := os.WriteFile(filepath.Join(elsewhere, "report.json"), []byte(`{"secret":true}`), 0o600); err != nil {
		t.Fatal(err)
	}
	argv := writeScript(t, `set -eu
rmdir "$LOOPBUS_OUTPUT_DIR"
ln -s "$ELSEWHERE" "$LOOPBUS_OUTPUT_DIR"
`)
	jr := request("s1.step.1", "step", 1, argv, "report.json")
	jr.Agent.Env = map[string]string{"ELSEWHERE": elsewhere}
	publishRequest(t, b, jr)
	startWorker(t, b, agentworker.Config{ID: "w1"})
	all, res := waitResult(t, b, jr.JobID)
	if res.Type != schemas.TypeJobFailed {
		var stored string
		if jc, ok := res.Data.(*schemas.JobCompleted); ok && len(jc.Artifacts) == 1 {
			stored = string(fetch(t, b, jc.Artifacts[0]))
		}
		t.Fatalf("result %s, want job.failed: the worker stored %q read through the out/ symlink from %s; events:%s",
			res.Type, stored, elsewhere, describe(ofJob(all, jr.JobID)))
	}
}

// TestRepeatedJobKeepsLandedArtifacts: a job that runs twice (here: its
// request published twice, as after a lost ack or a repeated decision)
// produces different bytes each time; only one result lands, and the
// artifact it names must still have the bytes of its digest.
func TestRepeatedJobKeepsLandedArtifacts(t *testing.T) {
	b, _ := testnats.Bus(t)
	argv := writeScript(t, `date +%s%N > "$LOOPBUS_OUTPUT_DIR/out.txt"; echo "$$" >> "$LOOPBUS_OUTPUT_DIR/out.txt"`)
	jr := request("s1.step.1", "step", 1, argv, "out.txt")
	publishRequest(t, b, jr)
	ctx := context.Background()
	// The same job again under another event id (past the dedupe window).
	if _, err := b.Publish(ctx, schemas.Event{
		ID: "second-request", Type: schemas.TypeJobRequested, Session: session, Step: jr.Step, Job: jr.JobID,
		Correlation: session, Time: time.Now(), Data: jr,
	}); err != nil {
		t.Fatal(err)
	}
	startWorker(t, b, agentworker.Config{ID: "w1"})
	evs := waitEvents(t, b, "both runs to store their artifact", func(evs []schemas.Event) bool {
		return len(ofType(evs, schemas.TypeArtifactStored)) == 2
	})
	waitAcked(t, b)
	results := ofType(sessionEvents(t, b), schemas.TypeJobCompleted)
	if len(results) != 1 {
		t.Fatalf("%d job.completed, want 1 (the second is de-duplicated)", len(results))
	}
	stored := ofType(evs, schemas.TypeArtifactStored)
	a0, a1 := stored[0].Data.(*schemas.ArtifactStored).Artifact, stored[1].Data.(*schemas.ArtifactStored).Artifact
	if a0.Object == a1.Object {
		t.Errorf("both runs stored under %s", a0.Object)
	}
	for _, ref := range results[0].Data.(*schemas.JobCompleted).Artifacts {
		fetch(t, b, ref) // fails on a digest mismatch
	}
}

// panicky is a backend with a bug: it panics.
type panicky struct{}

func (panicky) Run(context.Context, agent.Job, func(agent.Event)) (agent.Result, error) {
	panic("a bug in a backend")
}

// TestPanickingJobFailsAlone: a job whose handling panics fails with the
// panic as its reason; the worker goes on with the next job.
func TestPanickingJobFailsAlone(t *testing.T) {
	b, _ := testnats.Bus(t)
	backends := agentworker.Builtin()
	backends["boom"] = panicky{}
	bad := request("s1.bad.1", "bad", 1, nil)
	bad.Agent = schemas.AgentSpec{Backend: "boom"}
	publishRequest(t, b, bad)
	good := request("s1.good.1", "good", 1, writeScript(t, blockingAgent), "report.txt")
	publishRequest(t, b, good)
	startWorker(t, b, agentworker.Config{ID: "w1", Backends: backends})

	all, res := waitResult(t, b, bad.JobID)
	if jf, ok := res.Data.(*schemas.JobFailed); !ok || !strings.Contains(jf.Error, "crashed while running the job: a bug in a backend") {
		t.Fatalf("result of the panicking job: %s %+v; events:%s", res.Type, res.Data, describe(all))
	}
	if _, res := waitResult(t, b, good.JobID); res.Type != schemas.TypeJobCompleted {
		t.Fatalf("the next job: %s %+v", res.Type, res.Data)
	}
	waitAcked(t, b)
}
