package e2e

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/loopbus/loopbus/internal/testnats"
)

// TestHostilePipelinesAreRefused: `run` refuses, with file and line, a
// pipeline whose outputs could escape the workspace or whose env carries a
// secret, before any session starts.
func TestHostilePipelinesAreRefused(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		agent   string
		output  string
		wantErr string
	}{
		{name: "parent", output: "../x", wantErr: `p.yaml:6: steps.a.outputs[0].name: invalid artifact name "../x"`},
		{name: "absolute", output: "/etc/passwd", wantErr: `p.yaml:6: steps.a.outputs[0].name: invalid artifact name "/etc/passwd"`},
		{name: "subdirectory", output: "a/b", wantErr: `p.yaml:6: steps.a.outputs[0].name: invalid artifact name "a/b"`},
		{name: "dot-dot", output: `".."`, wantErr: `p.yaml:6: steps.a.outputs[0].name: invalid artifact name ".."`},
		{name: "NUL", output: `"a\0b"`, wantErr: `p.yaml:6: steps.a.outputs[0].name: invalid artifact name "a\x00b"`},
		{
			name: "secret in env", agent: `, env: {API_TOKEN: abcdefgh12345678}`, output: "a.txt",
			wantErr: `p.yaml:4: steps.a.agent.env.API_TOKEN: values in env travel in events; set API_TOKEN in the worker's environment and list it in secret_env`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			writeFiles(t, dir, map[string]string{
				"in.txt": "x\n",
				"p.yaml": "name: p\nsteps:\n  a:\n    agent: {backend: exec, command: [echo]" + tt.agent + "}\n    prompt: go\n    outputs: [{name: " + tt.output + "}]\n",
			})
			r := loopbus(t, "run", filepath.Join(dir, "p.yaml"), "--input", filepath.Join(dir, "in.txt"), "--data", t.TempDir())
			if r.code == 0 {
				t.Fatalf("run accepted the pipeline:\n%s", r.stderr)
			}
			if !strings.Contains(r.stderr, tt.wantErr) {
				t.Errorf("run stderr:\n%s\nwant it to contain:\n%s", r.stderr, tt.wantErr)
			}
			if strings.Contains(r.stderr, "abcdefgh12345678") {
				t.Errorf("run shows the env value:\n%s", r.stderr)
			}
		})
	}
}

// TestMaxOutputBytesFlag: `agentworker --max-output-bytes` bounds outputs;
// a larger one fails the session with both sizes in the message.
func TestMaxOutputBytesFlag(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{
		"in.txt": "x\n",
		"big.sh": "head -c 5000 /dev/zero > \"$LOOPBUS_OUTPUT_DIR/big.bin\"\n",
		"p.yaml": "name: big\nsteps:\n  big:\n    agent: {backend: exec, command: [sh, big.sh]}\n    prompt: go\n    outputs: [{name: big.bin}]\n",
	})
	addr := testnats.FreeAddr(t)
	global := []string{"--nats", "nats://" + addr}
	workerLog := filepath.Join(dir, "worker.log")
	startService(t, filepath.Join(dir, "serve.log"), testEnv(t), "serve", "--data", t.TempDir(), "--listen", addr, "--concurrency", "0")
	startService(t, workerLog, testEnv(t), "agentworker", "--nats", "nats://"+addr, "--max-output-bytes", "4096", "--work-dir", t.TempDir())
	eventually(t, 60*time.Second, "the worker to be ready", func() bool {
		return strings.Contains(mustRead(t, workerLog), "agent worker ready")
	})
	r := loopbus(t, append([]string{"run", filepath.Join(dir, "p.yaml"), "--input", filepath.Join(dir, "in.txt"), "--session", "big-1", "--json"}, global...)...)
	m := parseManifest(t, r.stdout)
	if m.Status != "failed" {
		t.Fatalf("status %q, want failed\n%s", m.Status, r.stderr)
	}
	evs := events(t, global, "big-1")
	if n := count(evs, "loopbus.artifact.stored", ""); n != 0 {
		t.Errorf("%d artifact.stored", n)
	}
	var failed string
	for _, e := range evs {
		if e.Type == "loopbus.job.failed" {
			failed = string(e.Data)
		}
	}
	for _, want := range []string{"big.bin", "5000 bytes", "4096-byte limit"} {
		if !strings.Contains(failed, want) {
			t.Errorf("job.failed %s does not mention %q", failed, want)
		}
	}
}
