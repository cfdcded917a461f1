package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
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
	for _, want := range []string{"final artifacts: writing-kit.json (", "loopbus export kit-1 --dir DIR --data " + data, "run --out DIR"} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("run's stderr lacks %q:\n%s", want, r.stderr)
		}
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
