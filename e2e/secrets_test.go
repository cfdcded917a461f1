package e2e

import (
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/loopbus/loopbus/internal/testnats"
)

// Secret values in the services' environment: one secret by its name, one
// listed with --secret-env, one listed by the pipeline's secret_env.
const (
	patternSecret = "Pq7Ttrn4c1d8e77Zx"
	workerSecret  = "Wk3Lz0QmV290ab12cd"
	jobSecret     = "Jb5Kc0ffeeTz77f00d3e21"
)

var e2eSecrets = []string{patternSecret, workerSecret, jobSecret}

// startService starts a long-running loopbus command logging to logFile
// and stops it when the test ends.
func startService(t *testing.T, logFile string, env []string, args ...string) {
	t.Helper()
	cmd := exec.Command(binary, args...)
	cmd.Env = env
	f, err := os.Create(logFile)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait(); f.Close() })
}

// checkNoSecrets fails if text shows a secret value or any 8 bytes of one.
func checkNoSecrets(t *testing.T, where, text string) {
	t.Helper()
	for _, v := range e2eSecrets {
		for i := 0; i+8 <= len(v); i++ {
			if strings.Contains(text, v[i:i+8]) {
				t.Errorf("%s shows %q, part of the secret value %q", where, v[i:i+8], v)
				break
			}
		}
	}
}

// TestSecretEnvNeverLeaks drives the binary: NATS and the services in `serve`,
// the agent worker on its own with --secret-env, all logging at debug level.
// Agents print every secret and one writes a secret into its output; no
// secret value appears in any log, event, status or export, and the job that
// wrote one fails with a message naming the variable.
func TestSecretEnvNeverLeaks(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{
		"input.txt": "input\n",
		"chatty.sh": `set -eu
echo "stdout: $DEPLOY_API_TOKEN $CUSTOMER_DB_URL $ACME_LICENSE"
echo "stderr: $DEPLOY_API_TOKEN $CUSTOMER_DB_URL $ACME_LICENSE" >&2
echo '{"ok":true}' > "$LOOPBUS_OUTPUT_DIR/report.json"
`,
		"leaky.sh": `set -eu
echo "writing the report"
printf '{"key":"%s"}\n' "$CUSTOMER_DB_URL" > "$LOOPBUS_OUTPUT_DIR/report.json"
`,
		"chatty.yaml": `name: chatty
steps:
  talk:
    agent: {backend: exec, command: [sh, chatty.sh], secret_env: [ACME_LICENSE]}
    prompt: talk
    outputs: [{name: report.json}]
`,
		"leaky.yaml": `name: leaky
steps:
  leak:
    agent: {backend: exec, command: [sh, leaky.sh], secret_env: [ACME_LICENSE]}
    prompt: leak
    outputs: [{name: report.json}]
`,
	})
	data := t.TempDir()
	addr := testnats.FreeAddr(t)
	global := []string{"--nats", "nats://" + addr}
	env := append(testEnv(t), "DEPLOY_API_TOKEN="+patternSecret, "CUSTOMER_DB_URL="+workerSecret, "ACME_LICENSE="+jobSecret)
	serveLog, workerLog := filepath.Join(dir, "serve.log"), filepath.Join(dir, "worker.log")
	startService(t, serveLog, env, "serve", "--data", data, "--listen", addr, "--concurrency", "0", "--log-level", "debug")
	startService(t, workerLog, env, "agentworker", "--nats", "nats://"+addr, "--secret-env", "CUSTOMER_DB_URL", "--id", "w-secrets",
		"--work-dir", t.TempDir(), "--log-level", "debug")

	eventually(t, 60*time.Second, "the worker to be ready", func() bool {
		return strings.Contains(mustRead(t, workerLog), "agent worker ready")
	})

	var seen strings.Builder // everything a reader of the session could see
	for _, s := range []struct{ pipeline, session, want string }{
		{"chatty.yaml", "chatty-1", "completed"},
		{"leaky.yaml", "leaky-1", "failed"},
	} {
		r := loopbus(t, append([]string{"run", filepath.Join(dir, s.pipeline), "--input", filepath.Join(dir, "input.txt"), "--session", s.session, "--json", "--log-level", "debug"}, global...)...)
		m := parseManifest(t, r.stdout)
		if m.Status != s.want {
			t.Fatalf("%s: status %q, want %q\nstderr:\n%s\nworker log:\n%s", s.session, m.Status, s.want, r.stderr, mustRead(t, workerLog))
		}
		seen.WriteString(r.stdout + r.stderr)

		ev := loopbus(t, append([]string{"events", "--session", s.session, "--json"}, global...)...)
		if ev.code != 0 {
			t.Fatalf("events: %d %s", ev.code, ev.stderr)
		}
		checkNoSecrets(t, "events --json of "+s.session, ev.stdout)
		seen.WriteString(ev.stdout)
		st := loopbus(t, append([]string{"status", s.session, "--json"}, global...)...)
		checkNoSecrets(t, "status --json of "+s.session, st.stdout+st.stderr)
		seen.WriteString(st.stdout)

		exportDir := filepath.Join(t.TempDir(), "export")
		if ex := loopbus(t, append([]string{"export", s.session, "--dir", exportDir}, global...)...); ex.code != 0 {
			t.Fatalf("export: %d %s", ex.code, ex.stderr)
		}
		files := 0
		_ = filepath.WalkDir(exportDir, func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			files++
			checkNoSecrets(t, "export file "+p, mustRead(t, p))
			return nil
		})
		if files < 2 {
			t.Errorf("export of %s wrote %d files, want events.jsonl, session.json and more", s.session, files)
		}
	}
	all := seen.String()
	// The checks above see the agents' output, masked.
	for _, want := range []string{"[secret DEPLOY_API_TOKEN]", "[secret CUSTOMER_DB_URL]", "[secret ACME_LICENSE]"} {
		if !strings.Contains(all, want) {
			t.Errorf("nothing shows %s: the agents' output did not reach what was checked", want)
		}
	}
	// The leaky job failed, naming the variable and the output.
	if !strings.Contains(all, "output report.json contains the value of the secret environment variable CUSTOMER_DB_URL") {
		t.Errorf("no clear message for the secret written into an output:\n%s", all)
	}
	for name, p := range map[string]string{"serve": serveLog, "agentworker": workerLog} {
		log := mustRead(t, p)
		if !strings.Contains(log, `"level":"debug"`) && !strings.Contains(log, "DBG") {
			t.Errorf("%s log has no debug lines, so it proves little:\n%s", name, log)
		}
		checkNoSecrets(t, name+" log", log)
	}
}
