package e2e

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/loopbus/loopbus/internal/testnats"
)

// TestRunSaysWhereResultsAre: run names the final artifacts and how to get
// them; --out writes them; sessions lists what ran.
func TestRunSaysWhereResultsAre(t *testing.T) {
	t.Parallel()
	data := t.TempDir()
	global := []string{"--data", data}
	kit := []string{"run", "../examples/writing-kit/pipeline.yaml", "--input", "../examples/writing-kit/article.md"}

	r := loopbus(t, append(append(kit, "--session", "kit-1"), global...)...)
	if r.code != 0 {
		t.Fatalf("run: exit %d\n%s", r.code, r.stderr)
	}
	for _, want := range []string{"final artifacts: writing-kit.json (", "get them with: " + binary + " export kit-1 --dir DIR --data " + data, "run --out DIR"} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("run's stderr lacks %q:\n%s", want, r.stderr)
		}
	}
	// The hint names the binary as it was invoked: here ./lb.
	bin := t.TempDir()
	if err := os.Symlink(binary, filepath.Join(bin, "lb")); err != nil {
		t.Fatal(err)
	}
	abs := func(p string) string {
		a, err := filepath.Abs(p)
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	cmd := exec.Command("./lb", "run", abs("../examples/writing-kit/pipeline.yaml"), "--input", abs("../examples/writing-kit/article.md"), "--session", "kit-lb", "--data", bin)
	cmd.Dir, cmd.Env = bin, testEnv(t)
	stderr, err := cmd.CombinedOutput()
	if want := "get them with: ./lb export kit-lb --dir DIR --data " + bin; err != nil || !strings.Contains(string(stderr), want) {
		t.Errorf("./lb run: %v; its output lacks %q:\n%s", err, want, stderr)
	}

	out := filepath.Join(t.TempDir(), "results")
	r = loopbus(t, append(append(kit, "--session", "kit-2", "--out", out), global...)...)
	if r.code != 0 {
		t.Fatalf("run --out: exit %d\n%s", r.code, r.stderr)
	}
	got, err := os.ReadFile(filepath.Join(out, "writing-kit.json"))
	if err != nil {
		t.Fatalf("run --out wrote no writing-kit.json: %v\n%s", err, r.stderr)
	}
	exported := t.TempDir()
	if ex := loopbus(t, append([]string{"export", "kit-2", "--dir", exported}, global...)...); ex.code != 0 {
		t.Fatalf("export: %d %s", ex.code, ex.stderr)
	}
	if want := mustRead(t, filepath.Join(exported, "artifacts", "writing-kit.json")); string(got) != want {
		t.Errorf("--out's writing-kit.json differs from the exported one")
	}
	if r := loopbus(t, append(append(kit, "--detach", "--out", out), global...)...); r.code != 2 || !strings.Contains(r.stderr, "--out") {
		t.Errorf("run --detach --out: exit %d, want 2\n%s", r.code, r.stderr)
	}

	ls := loopbus(t, append([]string{"sessions", "--json"}, global...)...)
	if ls.code != 0 {
		t.Fatalf("sessions: exit %d\n%s", ls.code, ls.stderr)
	}
	var list []struct {
		ID, Status, Pipeline string
		Steps, StepsDone     int
	}
	if err := json.Unmarshal([]byte(ls.stdout), &list); err != nil {
		t.Fatalf("sessions --json: %v\n%s", err, ls.stdout)
	}
	if len(list) != 2 || list[0].ID != "kit-2" || list[1].ID != "kit-1" || list[0].Status != "completed" || list[0].StepsDone != 3 || list[0].Pipeline != "writing-kit" {
		t.Errorf("sessions: %+v, want kit-2 then kit-1, completed 3/3", list)
	}
	table := loopbus(t, append([]string{"sessions"}, global...)...)
	if !strings.Contains(table.stdout, "SESSION") || !strings.Contains(table.stdout, "kit-1") || !strings.Contains(table.stdout, "3/3") {
		t.Errorf("sessions table:\n%s", table.stdout)
	}
	if none := loopbus(t, append([]string{"sessions", "--status", "failed"}, global...)...); none.code != 0 || strings.TrimSpace(none.stdout) != "no sessions" {
		t.Errorf("sessions --status failed: exit %d %q", none.code, none.stdout)
	}
	if bad := loopbus(t, append([]string{"sessions", "--status", "done"}, global...)...); bad.code != 2 {
		t.Errorf("sessions --status done: exit %d, want 2", bad.code)
	}
}

// TestUnknownSessionSameAnswerEverywhere: every command naming a session
// that does not exist exits 2 saying so.
func TestUnknownSessionSameAnswerEverywhere(t *testing.T) {
	t.Parallel()
	data := t.TempDir()
	out := t.TempDir()
	for _, args := range [][]string{
		{"status", "typo"},
		{"events", "--session", "typo"},
		{"events", "--session", "typo", "--follow"},
		{"replay", "typo"},
		{"export", "typo", "--dir", out},
		{"watch", "typo"},
		{"wait", "typo"},
		{"signal", "pause", "typo"},
	} {
		r := loopbus(t, append(args, "--data", data)...)
		if r.code != 2 || !strings.Contains(r.stderr, "no such session") || !strings.Contains(r.stderr, "typo") {
			t.Errorf("%v: exit %d, want 2 with 'no such session: typo'\n%s", args, r.code, r.stderr)
		}
	}
}

// TestServeBanner: serve says, once up, where NATS, the dashboard and the
// metrics are and how to give it work; each works as printed.
func TestServeBanner(t *testing.T) {
	t.Parallel()
	data := t.TempDir()
	addr := testnats.FreeAddr(t)
	cmd := exec.Command(binary, "serve", "--data", data, "--listen", addr, "--http", "127.0.0.1:0", "--metrics", "127.0.0.1:0", "--concurrency", "1", "--log-level", "warn")
	cmd.Env = testEnv(t)
	logPath := filepath.Join(t.TempDir(), "serve.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	cmd.Stderr = logf
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	lines := make(chan string)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	banner := map[string]string{}
	timeout := time.After(60 * time.Second)
	for banner["run work"] == "" {
		select {
		case l, ok := <-lines:
			if !ok {
				logs, _ := os.ReadFile(logPath)
				t.Fatalf("serve's stdout ended before its banner's run line: %q\nlogs:\n%s", banner, logs)
			}
			if k, v, found := strings.Cut(strings.TrimSpace(l), ":"); found {
				banner[k] = strings.TrimSpace(v)
			}
		case <-timeout:
			t.Fatalf("no banner within a minute: %q", banner)
		}
	}
	if want := "nats://" + addr + " (embedded; data in " + data + ")"; banner["NATS"] != want {
		t.Errorf("NATS line %q, want %q", banner["NATS"], want)
	}
	if want := binary + " run PIPELINE.yaml --input FILE --data " + data; banner["run work"] != want {
		t.Errorf("run line %q, want %q", banner["run work"], want)
	}
	if banner["workers"] != "1 job at once, every lane" {
		t.Errorf("workers line %q", banner["workers"])
	}
	get := func(url, want string) {
		t.Helper()
		resp, err := http.Get(url)
		if err != nil {
			t.Fatalf("GET %s: %v", url, err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), want) {
			t.Errorf("GET %s: %s, want 200 with %q", url, resp.Status, want)
		}
	}
	get(banner["dashboard"], "Sessions")
	get(banner["metrics"], "loopbus_sessions_running 0")
	// The run line, with a pipeline and input: the session runs here.
	words := strings.Fields(strings.NewReplacer("PIPELINE.yaml", "../examples/writing-kit/pipeline.yaml", "FILE", "../examples/writing-kit/article.md").Replace(banner["run work"]))
	run := exec.Command(words[0], words[1:]...)
	run.Env = testEnv(t)
	if out, err := run.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(words, " "), err, out)
	}
}
