package e2e

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/loopbus/loopbus/internal/testnats"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// secureConfig is the shipped example server configuration.
const secureConfig = "../examples/secure/nats-server.conf"

// secureRoles are the users of secureConfig.
var secureRoles = []string{"admin", "orchestrator", "agentworker", "validator", "projector", "client"}

// secret returns a random string that cannot occur in output by chance.
func secret(t *testing.T, prefix string) string {
	t.Helper()
	b := make([]byte, 12)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return prefix + "-" + hex.EncodeToString(b)
}

// outputs collects everything the processes of a test print, to search it
// for secrets at the end.
type outputs struct {
	mu   sync.Mutex
	all  map[string]func() string
	stop []func()
}

func newOutputs() *outputs { return &outputs{all: map[string]func() string{}} }

func (o *outputs) add(name string, text func() string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.all[name] = text
}

// result records a finished command's output and returns r.
func (o *outputs) result(name string, r result) result {
	o.add(name, func() string { return r.stdout + r.stderr })
	return r
}

// start runs a long-lived loopbus process with extra environment; its
// output is recorded. It is stopped (SIGTERM, then SIGKILL) by stopAll or
// at cleanup.
func (o *outputs) start(t *testing.T, name string, env []string, args ...string) {
	t.Helper()
	cmd := exec.Command(binary, args...)
	cmd.Env = append(testEnv(t), env...)
	buf := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = buf, buf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	stop := sync.OnceFunc(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	t.Cleanup(stop)
	o.add(name, buf.String)
	o.mu.Lock()
	o.stop = append(o.stop, stop)
	o.mu.Unlock()
}

// stopAll stops every process, so that their shutdown logs are recorded.
func (o *outputs) stopAll() {
	o.mu.Lock()
	stops := o.stop
	o.mu.Unlock()
	for i := len(stops) - 1; i >= 0; i-- {
		stops[i]()
	}
}

// assertNoSecret fails for every recorded output that contains a secret.
func (o *outputs) assertNoSecret(t *testing.T, secrets ...string) {
	t.Helper()
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.all) == 0 {
		t.Fatal("no output recorded")
	}
	for name, text := range o.all {
		s := text()
		for _, sec := range secrets {
			if i := strings.Index(s, sec); i >= 0 {
				t.Errorf("%s leaks a secret: …%s…", name, s[max(0, i-120):min(len(s), i+len(sec)+40)])
			}
		}
	}
}

// addDir records the content of every file under dir.
func (o *outputs) addDir(t *testing.T, name, dir string) {
	t.Helper()
	n := 0
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		raw, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		n++
		o.add(name+":"+strings.TrimPrefix(p, dir), func() string { return string(raw) })
		return nil
	})
	if err != nil || n == 0 {
		t.Fatalf("%s: %d files, %v", name, n, err)
	}
}

// waitListening waits until something accepts connections on addr.
func waitListening(t *testing.T, addr string, logs func() string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("nothing listens on %s after 30s:\n%s", addr, logs())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// securePipeline writes a two-step pipeline (the second step's output has
// a schema, so the validator reads artifacts) and its input.
func securePipeline(t *testing.T) (pipeline, input string) {
	t.Helper()
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{
		"first.sh":          "set -eu\ncat \"$LOOPBUS_INPUT_DIR\"/in.txt > \"$LOOPBUS_OUTPUT_DIR/a.txt\"\n",
		"second.sh":         "set -eu\nprintf '{\"lines\": %d}' \"$(wc -l < \"$LOOPBUS_INPUT_DIR/a.txt\")\" > \"$LOOPBUS_OUTPUT_DIR/count.json\"\n",
		"count.schema.json": `{"type": "object", "required": ["lines"], "properties": {"lines": {"type": "integer"}}}`,
		"in.txt":            strings.Repeat("a line of input\n", 20000), // 320 KB: several object chunks
		"pipeline.yaml": `name: secure
steps:
  first:
    agent: {backend: exec, command: [sh, first.sh]}
    prompt: copy the input
    outputs: [{name: a.txt}]
  second:
    requires: [first]
    agent: {backend: exec, command: [sh, second.sh]}
    prompt: count its lines
    outputs: [{name: count.json, schema: count.schema.json}]
`,
	})
	return filepath.Join(dir, "pipeline.yaml"), filepath.Join(dir, "in.txt")
}

// dlqCount is the number of messages in the dead-letter stream.
func dlqCount(t *testing.T, js jetstream.JetStream) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, "LOOPBUS_DLQ")
	if err != nil {
		t.Fatalf("stream LOOPBUS_DLQ: %v", err)
	}
	return s.CachedInfo().State.Msgs
}

// rawConn connects to url as a user with nats.go directly and reports the
// server's asynchronous errors (permission violations) on the channel.
func rawConn(t *testing.T, url, user, password string) (*nats.Conn, <-chan error) {
	t.Helper()
	errs := make(chan error, 16)
	nc, err := nats.Connect(url, nats.UserInfo(user, password), nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		select {
		case errs <- err:
		default:
		}
	}))
	if err != nil {
		t.Fatalf("connect as %s: %v", user, err)
	}
	t.Cleanup(nc.Close)
	return nc, errs
}

// secureNATS is a NATS server started from the example configuration with
// a random password per role.
type secureNATS struct {
	url   string
	pw    map[string]string
	out   *outputs
	debug bool
}

// startSecureNATS starts it, recording its output in out as "nats"; with
// debug, it and every command run through as log at debug level.
func startSecureNATS(t *testing.T, out *outputs, debug bool) *secureNATS {
	t.Helper()
	s := &secureNATS{pw: map[string]string{}, out: out, debug: debug}
	var serverEnv []string
	for _, role := range secureRoles {
		s.pw[role] = secret(t, role+"-pw")
		serverEnv = append(serverEnv, "LOOPBUS_"+strings.ToUpper(role)+"_PASSWORD="+s.pw[role])
	}
	addr := testnats.FreeAddr(t)
	s.url = "nats://" + addr
	args := []string{"nats", "--config", secureConfig, "--data", t.TempDir(), "--listen", addr}
	if debug {
		args = append(args, "--log-level", "debug")
	}
	out.start(t, "nats", serverEnv, args...)
	waitListening(t, addr, out.all["nats"])
	return s
}

// as returns args with the connection flags of role.
func (s *secureNATS) as(role string, args ...string) []string {
	args = append(args, "--nats", s.url, "--user", role, "--password", s.pw[role])
	if s.debug {
		args = append(args, "--log-level", "debug")
	}
	return args
}

// provision creates the streams and buckets as admin.
func (s *secureNATS) provision(t *testing.T) {
	t.Helper()
	doc := s.out.result("admin doctor", loopbus(t, s.as("admin", "doctor")...))
	if !strings.Contains(doc.stdout, "ok    event stream") {
		t.Fatalf("admin doctor did not provision: exit %d\n%s%s", doc.code, doc.stdout, doc.stderr)
	}
}

// TestSecureExample starts NATS from the shipped example configuration,
// provisions as admin, runs every service as its own restricted user and a
// session as the client user to completion; then shows that the agent
// worker's user may not start a session, send a signal, or delete, purge
// or reconfigure the stream, and that nothing it tried lands in the
// stream. Every process logs at debug level, and no password appears in
// any output, in events --json or in an export.
func TestSecureExample(t *testing.T) {
	t.Parallel()
	out := newOutputs()
	srv := startSecureNATS(t, out, true)
	url, pw, as := srv.url, srv.pw, srv.as

	// A restricted user cannot provision: it is told which permission it lacks.
	early := out.result("early worker", loopbus(t, as("agentworker", "agentworker")...))
	if early.code == 0 || !strings.Contains(early.stderr, `Permissions Violation for Publish to "$JS.API.STREAM.CREATE.LOOPBUS"`) {
		t.Errorf("agentworker before provisioning: exit %d, want a permission error naming the stream creation\n%s", early.code, early.stderr)
	}
	// The admin provisions (doctor creates the streams and buckets, then
	// reports the consumers missing until the services run).
	srv.provision(t)
	for _, svc := range []string{"orchestrator", "validator", "projector", "agentworker"} {
		out.start(t, svc, nil, as(svc, svc)...)
	}

	pipeline, input := securePipeline(t)
	r := out.result("run", loopbus(t, as("client", "run", pipeline, "--input", input, "--session", "sec-1", "--json")...))
	if r.code != 0 {
		t.Fatalf("run as client: exit %d\n%s\nservices:\n%s", r.code, r.stderr, out.all["agentworker"]()+out.all["orchestrator"]()+out.all["validator"]())
	}
	if m := parseManifest(t, r.stdout); m.Status != "completed" || m.Steps["second"].Status != "completed" {
		t.Fatalf("manifest: %+v", m)
	}
	ev := out.result("events --json", loopbus(t, as("client", "events", "--session", "sec-1", "--json")...))
	if ev.code != 0 || strings.Count(ev.stdout, "\n") < 10 {
		t.Fatalf("events --json as client: exit %d\n%s", ev.code, ev.stderr)
	}
	exportDir := t.TempDir()
	if ex := out.result("export", loopbus(t, as("client", "export", "sec-1", "--dir", exportDir)...)); ex.code != 0 {
		t.Fatalf("export as client: exit %d\n%s", ex.code, ex.stderr)
	}
	out.addDir(t, "export", exportDir)
	for _, args := range [][]string{{"status", "sec-1"}, {"replay", "sec-1", "--until", "3"}, {"wait", "sec-1"}, {"doctor"}} {
		if c := out.result(args[0], loopbus(t, as("client", args...)...)); c.code != 0 {
			t.Errorf("%s as client: exit %d\n%s%s", args[0], c.code, c.stdout, c.stderr)
		}
	}

	// A backlog under the restricted users: the orchestrator records task
	// and phase events, the client adds a task while the session runs, and
	// a hook runner (as the client) records its runs.
	blDir := t.TempDir()
	release := filepath.Join(blDir, "release")
	writeFiles(t, blDir, map[string]string{
		"agent.sh": `set -eu
case $LOOPBUS_STEP in
review) printf '{"task_id": "review", "status": "done", "summary": "ok"}' > "$LOOPBUS_OUTPUT_DIR/summary.json" ;;
*) while [ ! -e "` + release + `" ]; do sleep 0.1; done
   printf '{"task_id": "%s", "status": "done", "summary": "done"}' "$LOOPBUS_STEP" > "$LOOPBUS_OUTPUT_DIR/summary.json" ;;
esac
`,
		"backlog.yaml": "kind: backlog\nname: secure-backlog\nagents: {sh: {backend: exec, command: [sh, agent.sh]}}\nroles: {iterate: sh}\n",
		"to-do.json":   `{"schema_version": 1, "tasks": [{"id": "T1", "title": "first", "status": "todo"}]}`,
		"hooks.yaml":   "runner: sec\nstart: all\nhooks:\n  - name: count\n    types: [loopbus.task.updated]\n    command: [sh, -c, 'echo run >> hook.log']\n",
	})
	if r := out.result("run backlog", loopbus(t, as("client", "run", filepath.Join(blDir, "backlog.yaml"), "--tasks", filepath.Join(blDir, "to-do.json"), "--session", "sec-bl", "--detach")...)); r.code != 0 {
		t.Fatalf("run backlog as client: exit %d\n%s", r.code, r.stderr)
	}
	if r := out.result("tasks add", loopbus(t, as("client", "tasks", "add", "sec-bl", "--title", "second", "--id", "T2")...)); r.code != 0 {
		t.Fatalf("tasks add as client: exit %d\n%s", r.code, r.stderr)
	}
	writeFiles(t, blDir, map[string]string{"release": ""})
	if r := out.result("wait backlog", loopbus(t, as("client", "wait", "sec-bl")...)); r.code != 0 {
		t.Fatalf("backlog under restricted users: exit %d\n%s\nservices:\n%s", r.code, r.stderr, out.all["orchestrator"]())
	}
	out.start(t, "hooks", nil, as("client", "hooks", "--config", filepath.Join(blDir, "hooks.yaml"))...)
	eventually(t, 30*time.Second, "two hook.completed events", func() bool {
		r := loopbus(t, as("client", "events", "--session", "sec-bl", "--type", "hook.completed", "--json")...)
		return r.code == 0 && strings.Count(r.stdout, "\n") == 2
	})
	if b, err := os.ReadFile(filepath.Join(blDir, "hook.log")); err != nil || string(b) != "run\nrun\n" {
		t.Errorf("hook.log: %q, %v; want two runs (T1 and T2 done)", b, err)
	}

	// The agent worker's user is refused what is not its job.
	admin, _ := rawConn(t, url, "admin", pw["admin"])
	js, err := jetstream.New(admin)
	if err != nil {
		t.Fatal(err)
	}
	streamInfo := func() *jetstream.StreamInfo {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		s, err := js.Stream(ctx, "LOOPBUS")
		if err != nil {
			t.Fatalf("stream LOOPBUS: %v", err)
		}
		return s.CachedInfo()
	}
	before := streamInfo()
	var started cloudEvent
	for line := range strings.SplitSeq(ev.stdout, "\n") {
		if strings.Contains(line, `"loopbus.session.started"`) {
			if err := json.Unmarshal([]byte(line), &started); err != nil {
				t.Fatal(err)
			}
		}
	}
	forged, _ := json.Marshal(map[string]any{
		"specversion": "1.0", "id": "forged-1", "source": "loopbus/agentworker/evil", "type": "loopbus.session.started",
		"subject": "sec-2", "time": time.Now().UTC().Format(time.RFC3339Nano), "datacontenttype": "application/json",
		"session": "sec-2", "data": started.Data,
	})
	deleteReq, _ := json.Marshal(map[string]any{})
	update, _ := json.Marshal(map[string]any{"name": "LOOPBUS", "subjects": []string{"loopbus.evt.>"}, "deny_delete": false, "deny_purge": false})
	worker, refusals := rawConn(t, url, "agentworker", pw["agentworker"])
	tests := []struct {
		name, subject string
		data          []byte
	}{
		{name: "start a session", subject: "loopbus.evt.sec-2.session.started", data: forged},
		{name: "send a signal", subject: "loopbus.evt.sec-1.signal.stop", data: []byte(`{}`)},
		{name: "request a job", subject: "loopbus.evt.sec-1.job.requested", data: []byte(`{}`)},
		{name: "delete the stream", subject: "$JS.API.STREAM.DELETE.LOOPBUS", data: deleteReq},
		{name: "purge the stream", subject: "$JS.API.STREAM.PURGE.LOOPBUS", data: deleteReq},
		{name: "reconfigure the stream", subject: "$JS.API.STREAM.UPDATE.LOOPBUS", data: update},
		{name: "delete the validator's consumer", subject: "$JS.API.CONSUMER.DELETE.LOOPBUS.validator", data: deleteReq},
		{name: "write a view", subject: "$KV.LOOPBUS_VIEWS.session.sec-1", data: []byte(`{}`)},
	}
	for _, tt := range tests {
		t.Run("worker may not "+tt.name, func(t *testing.T) {
			_, err := worker.Request(tt.subject, tt.data, 2*time.Second)
			if err == nil {
				t.Fatalf("request on %s was answered", tt.subject)
			}
			want := `Permissions Violation for Publish to "` + tt.subject + `"`
			select {
			case perr := <-refusals:
				if !errors.Is(perr, nats.ErrPermissionViolation) || !strings.Contains(perr.Error(), want) {
					t.Errorf("server error %v, want %s", perr, want)
				}
			case <-time.After(5 * time.Second):
				t.Errorf("no permissions violation reported for %s (request error: %v)", tt.subject, err)
			}
		})
	}
	after := streamInfo()
	if after.State.Msgs != before.State.Msgs || after.State.LastSeq != before.State.LastSeq {
		t.Errorf("the stream changed: %d events (last %d) before the refused attempts, %d (last %d) after", before.State.Msgs, before.State.LastSeq, after.State.Msgs, after.State.LastSeq)
	}
	if !after.Config.DenyDelete || !after.Config.DenyPurge {
		t.Errorf("stream config changed: %+v", after.Config)
	}
	if st := out.result("status sec-2", loopbus(t, as("client", "status", "sec-2")...)); st.code == 0 {
		t.Errorf("the forged session sec-2 exists:\n%s", st.stdout)
	}

	// A malformed event is dead-lettered by the restricted services (each
	// may write only its own loopbus.dlq.<consumer>.> subjects).
	dlqBefore := dlqCount(t, js)
	if _, err := admin.Request("loopbus.evt.sec-9.job.requested", []byte("not a CloudEvent"), 10*time.Second); err != nil {
		t.Fatalf("admin publish: %v", err)
	}
	eventually(t, 60*time.Second, "the malformed event to be dead-lettered", func() bool { return dlqCount(t, js) > dlqBefore })

	out.stopAll()
	// The services had every permission they needed.
	for _, svc := range []string{"orchestrator", "validator", "projector", "agentworker"} {
		if log := out.all[svc](); strings.Contains(log, "Permissions Violation") {
			t.Errorf("%s was refused something:\n%s", svc, log)
		}
	}
	var secrets []string
	for _, p := range pw {
		secrets = append(secrets, p)
	}
	out.assertNoSecret(t, secrets...)
}

// TestSecretsNeverLeak: a token (flag) and credentials embedded in the
// NATS URL appear in no output of a debug-level run, events --json or an
// export, nor in error messages of a refused connection.
func TestSecretsNeverLeak(t *testing.T) {
	t.Parallel()
	token := secret(t, "tok")
	out := newOutputs()
	addr := testnats.FreeAddr(t)
	out.start(t, "nats --token", nil, "nats", "--data", t.TempDir(), "--listen", addr, "--token", token, "--log-level", "debug")
	waitListening(t, addr, out.all["nats --token"])
	pipeline, input := securePipeline(t)
	dir := t.TempDir()

	// The services run in one process (serve) against the token server.
	withToken := []string{"--nats", "nats://" + addr, "--token", token, "--log-level", "debug"}
	out.start(t, "serve", nil, append([]string{"serve"}, withToken...)...)
	inURL := []string{"--nats", "nats://" + token + "@" + addr, "--log-level", "debug"}
	tests := []struct {
		name     string
		args     []string
		wantCode int
	}{
		{name: "run with --token", args: append([]string{"run", pipeline, "--input", input, "--session", "tok-1", "--json"}, withToken...)},
		{name: "events with --token", args: append([]string{"events", "--session", "tok-1", "--json"}, withToken...)},
		{name: "export with --token", args: append([]string{"export", "tok-1", "--dir", filepath.Join(dir, "export")}, withToken...)},
		{name: "status with the token in the URL", args: append([]string{"status", "tok-1", "--json"}, inURL...)},
		{name: "events with the token in the URL", args: append([]string{"events", "--json"}, inURL...)},
		{name: "replay with the token in the URL", args: append([]string{"replay", "tok-1", "--until", "2"}, inURL...)},
		{name: "doctor with the token in the URL", args: append([]string{"doctor"}, inURL...)},
		{name: "wrong token", args: []string{"status", "tok-1", "--nats", "nats://" + addr, "--token", "x" + token, "--log-level", "debug"}, wantCode: 1},
		{name: "wrong token in the URL", args: []string{"status", "tok-1", "--nats", "nats://x" + token + "@" + addr, "--log-level", "debug"}, wantCode: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := out.result(tt.name, loopbus(t, tt.args...))
			if r.code != tt.wantCode {
				t.Fatalf("exit %d, want %d\n%s", r.code, tt.wantCode, r.stderr)
			}
			if tt.wantCode != 0 && !strings.Contains(r.stderr, "Authorization Violation") {
				t.Errorf("a refused connection does not say so:\n%s", r.stderr)
			}
		})
	}
	out.addDir(t, "export", filepath.Join(dir, "export"))

	// User and password in the URL, against the example configuration.
	pw := map[string]string{}
	var serverEnv []string
	for _, role := range secureRoles {
		pw[role] = secret(t, role+"-pw")
		serverEnv = append(serverEnv, "LOOPBUS_"+strings.ToUpper(role)+"_PASSWORD="+pw[role])
	}
	secureAddr := testnats.FreeAddr(t)
	out.start(t, "nats --config", serverEnv, "nats", "--config", secureConfig, "--data", t.TempDir(), "--listen", secureAddr, "--log-level", "debug")
	waitListening(t, secureAddr, out.all["nats --config"])
	adminURL := "nats://admin:" + pw["admin"] + "@" + secureAddr
	if r := out.result("doctor with user:password in the URL", loopbus(t, "doctor", "--nats", adminURL, "--log-level", "debug")); !strings.Contains(r.stdout, "ok    event stream") {
		t.Errorf("doctor as admin: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	bad := "nats://client:x" + pw["client"] + "@" + secureAddr
	if r := out.result("wrong password in the URL", loopbus(t, "events", "--nats", bad, "--log-level", "debug")); r.code != 1 || !strings.Contains(r.stderr, "REDACTED@") {
		t.Errorf("events with a wrong password: exit %d, want 1 and the URL redacted\n%s", r.code, r.stderr)
	}

	out.stopAll()
	secrets := []string{token}
	for _, p := range pw {
		secrets = append(secrets, p)
	}
	out.assertNoSecret(t, secrets...)
}
