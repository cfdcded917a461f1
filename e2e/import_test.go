package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The pipeline the imported folders belong to: summary → ideas →
// writing-kit, each output with a schema. Every agent appends its step to
// runs.log; writing-kit's output is made of its inputs summary.json and
// ideas.json, so it shows what it was given.
func importPipeline(t *testing.T, dir string) (pipeline, runs string) {
	t.Helper()
	runs = filepath.Join(dir, "runs.log")
	agent := func(step, body string) string {
		return "echo " + step + " >> " + runs + "\n" + body + "\n"
	}
	writeFiles(t, dir, map[string]string{
		"summary.schema.json": `{"type":"object","required":["title"],"properties":{"title":{"type":"string"}}}`,
		"ideas.schema.json":   `{"type":"object","required":["ideas"],"properties":{"ideas":{"type":"array","minItems":1}}}`,
		"kit.schema.json":     `{"type":"object","required":["summary","ideas"]}`,
		"summary.sh":          agent("summary", `echo '{"title":"made by loopbus"}' > "$LOOPBUS_OUTPUT_DIR/summary.json"`),
		"ideas.sh":            agent("ideas", `echo '{"ideas":["made by loopbus"]}' > "$LOOPBUS_OUTPUT_DIR/ideas.json"`),
		"kit.sh":              agent("writing-kit", `{ printf '{"summary":'; cat "$LOOPBUS_INPUT_DIR/summary.json"; printf ',"ideas":'; cat "$LOOPBUS_INPUT_DIR/ideas.json"; printf '}'; } > "$LOOPBUS_OUTPUT_DIR/writing-kit.json"`),
		"p.yaml": `name: kit
steps:
  summary:
    agent: {backend: exec, command: [sh, summary.sh]}
    prompt: summarize
    outputs: [{name: summary.json, schema: summary.schema.json}]
  ideas:
    requires: [summary]
    agent: {backend: exec, command: [sh, ideas.sh]}
    prompt: ideas
    outputs: [{name: ideas.json, schema: ideas.schema.json}]
  writing-kit:
    requires: [summary, ideas]
    agent: {backend: exec, command: [sh, kit.sh]}
    prompt: kit
    outputs: [{name: writing-kit.json, schema: kit.schema.json}]
    final: true
`,
	})
	return filepath.Join(dir, "p.yaml"), runs
}

func shortHash(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])[:16]
}

const (
	loopliaContent = "---\ntitle: Event sourcing\n---\nThe stream is the truth.\n"
	loopliaSummary = `{"title":"from looplia"}`
	loopliaIdeas   = `{"ideas":["from looplia"]}`
)

// loopliaManifest is a session.json (Looplia 0.5) recording analyzing and
// generating_ideas completed, building_outline in progress, for source
// content.
func loopliaManifest(content string) string {
	return `{
  "version": 1,
  "contentId": "article-2025-12-12-a1b2c3",
  "createdAt": "2025-12-12T10:30:00.000Z",
  "updatedAt": "2025-12-12T10:35:42.000Z",
  "steps": {
    "analyzing": {"status": "completed", "contentHash": "` + shortHash(loopliaSummary) + `", "completedAt": "2025-12-12T10:32:15.000Z", "schemaVersion": "0.5.0"},
    "generating_ideas": {"status": "completed", "contentHash": "` + shortHash(loopliaIdeas) + `", "completedAt": "2025-12-12T10:34:30.000Z", "schemaVersion": "0.5.0"},
    "building_outline": {"status": "in_progress"}
  },
  "sourceHash": "` + shortHash(content) + `"
}`
}

// TestImportLoopliaFolder (issue 18, "time travel and human control"):
// Looplia session folders become loopbus sessions. Steps whose artifacts
// are present and valid are imported (step.imported with their hashes)
// and their agents never run; the rest run on `loopbus resume`, the first
// of them with the imported artifacts as inputs.
func TestImportLoopliaFolder(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		folder map[string]string
		// runs are the agents that run on resume, imported the steps
		// imported.
		runs, imported string
		stderr         string
		// atOnce: import --resume, which resumes and follows at once.
		atOnce bool
	}{
		{
			name:     "two of three steps done",
			folder:   map[string]string{"content.md": loopliaContent, "summary.json": loopliaSummary, "ideas.json": loopliaIdeas, "session.json": loopliaManifest(loopliaContent)},
			runs:     "writing-kit",
			imported: "summary ideas",
		},
		{
			name: "the source changed since: every step runs",
			folder: map[string]string{"content.md": loopliaContent + "An edit.\n", "summary.json": loopliaSummary, "ideas.json": loopliaIdeas,
				"session.json": loopliaManifest(loopliaContent)},
			runs:   "summary ideas writing-kit",
			stderr: "the source changed",
		},
		{
			name: "an artifact that fails its schema: that step and its dependents run",
			folder: map[string]string{"content.md": loopliaContent, "summary.json": loopliaSummary, "ideas.json": `{"ideas":[]}`,
				"session.json": strings.Replace(loopliaManifest(loopliaContent), shortHash(loopliaIdeas), shortHash(`{"ideas":[]}`), 1)},
			runs:     "ideas writing-kit",
			imported: "summary",
		},
		{
			name:     "a legacy folder without session.json: the artifacts present are imported",
			folder:   map[string]string{"content.md": loopliaContent, "summary.json": loopliaSummary, "ideas.json": loopliaIdeas},
			runs:     "writing-kit",
			imported: "summary ideas",
		},
		{
			name:     "import --resume runs the rest at once",
			folder:   map[string]string{"content.md": loopliaContent, "summary.json": loopliaSummary, "session.json": loopliaManifest(loopliaContent)},
			runs:     "ideas writing-kit",
			imported: "summary",
			atOnce:   true,
		},
		{
			name: "session.json records a step in progress: it runs although its file is there",
			folder: map[string]string{"content.md": loopliaContent, "summary.json": loopliaSummary, "ideas.json": loopliaIdeas,
				"session.json": strings.Replace(loopliaManifest(loopliaContent), `"status": "completed", "contentHash": "`+shortHash(loopliaIdeas), `"status": "in_progress", "contentHash": "`+shortHash(loopliaIdeas), 1)},
			runs:     "ideas writing-kit",
			imported: "summary",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			pipeline, runs := importPipeline(t, filepath.Join(dir, "pipeline"))
			folder := filepath.Join(dir, "article")
			writeFiles(t, folder, tc.folder)
			global := []string{"--data", filepath.Join(dir, "data")}
			out := filepath.Join(dir, "out")
			if tc.atOnce {
				r := loopbus(t, append([]string{"import", folder, "--pipeline", pipeline, "--session", "imp", "--resume", "--out", out}, global...)...)
				if r.code != 0 || !strings.Contains(r.stderr, "imported  summary (contentHash "+shortHash(loopliaSummary)+")") {
					t.Fatalf("import --resume: exit %d, want 0 (completed), saying what it imported\n%s", r.code, r.stderr)
				}
			} else {
				importThenResume(t, tc.folder, folder, pipeline, out, global, tc.imported, tc.runs, tc.stderr)
			}
			log, err := os.ReadFile(runs)
			if err != nil {
				t.Fatal(err)
			}
			if got := strings.Join(strings.Fields(string(log)), " "); got != tc.runs {
				t.Errorf("agents run: %q, want %q (imported steps do not run)", got, tc.runs)
			}
			kit := mustRead(t, filepath.Join(out, "writing-kit.json"))
			for _, step := range strings.Fields(tc.imported) {
				if !strings.Contains(kit, tc.folder[step+".json"]) {
					t.Errorf("writing-kit.json was not made from the imported %s.json:\n%s", step, kit)
				}
			}
			st := parseManifest(t, loopbus(t, append([]string{"status", "imp", "--json"}, global...)...).stdout)
			if st.Status != "completed" {
				t.Errorf("after resume: status %s, want completed", st.Status)
			}
			evs := events(t, global, "imp")
			for _, step := range strings.Fields(tc.imported) {
				if n := count(evs, "loopbus.job.requested", step); n != 0 {
					t.Errorf("imported step %s was requested %d times", step, n)
				}
			}
		})
	}
}

// importThenResume imports dir (holding the files folder) as session imp
// and checks what import says and records (imported: the steps imported,
// runs: those to run, stderr: what it says there) and that nothing runs
// before the resume; then it resumes the session, which must complete,
// writing the final artifacts into out.
func importThenResume(t *testing.T, folder map[string]string, dir, pipeline, out string, global []string, imported, runs, stderr string) {
	t.Helper()
	r := loopbus(t, append([]string{"import", dir, "--pipeline", pipeline, "--session", "imp"}, global...)...)
	if r.code != 0 {
		t.Fatalf("import: exit %d\n%s", r.code, r.stderr)
	}
	if !strings.Contains(r.stdout, "loopbus resume imp "+strings.Join(global, " ")) || !strings.Contains(r.stderr, stderr) {
		t.Errorf("import does not say how to resume, or what it should on stderr (%q):\nstdout:\n%s\nstderr:\n%s", stderr, r.stdout, r.stderr)
	}
	for _, step := range strings.Fields(imported) {
		if !strings.Contains(r.stdout, "imported  "+step+" (contentHash ") {
			t.Errorf("import does not list %s as imported:\n%s", step, r.stdout)
		}
	}
	for _, step := range strings.Fields(runs) {
		if !strings.Contains(r.stdout, "runs      "+step+": ") {
			t.Errorf("import does not list %s as to run:\n%s", step, r.stdout)
		}
	}
	st := parseManifest(t, loopbus(t, append([]string{"status", "imp", "--json"}, global...)...).stdout)
	if st.Status != "paused" {
		t.Errorf("after import: status %s, want paused until resumed", st.Status)
	}
	evs := events(t, global, "imp")
	if n := count(evs, "loopbus.step.imported", ""); n != len(strings.Fields(imported)) {
		t.Errorf("%d step.imported events, want %d", n, len(strings.Fields(imported)))
	}
	for _, ev := range evs {
		if ev.Type != "loopbus.step.imported" {
			continue
		}
		var d struct {
			Step        string `json:"step"`
			Source      string `json:"source"`
			ContentHash string `json:"contentHash"`
			Artifacts   []struct {
				Name, Object, Digest string
			} `json:"artifacts"`
		}
		if err := json.Unmarshal(ev.Data, &d); err != nil {
			t.Fatal(err)
		}
		want := shortHash(folder[d.Step+".json"])
		if d.Source != "looplia" || d.ContentHash != want || len(d.Artifacts) != 1 || d.Artifacts[0].Digest != "sha256:"+sha(folder[d.Step+".json"]) || d.Artifacts[0].Object == "" {
			t.Errorf("step.imported %s: %s; want source looplia, content hash %s and the file's digest", d.Step, ev.Data, want)
		}
	}
	if n := count(evs, "loopbus.job.requested", ""); n != 0 {
		t.Errorf("%d jobs requested before the resume", n)
	}

	r = loopbus(t, append([]string{"resume", "imp", "--out", out}, global...)...)
	if r.code != 0 {
		t.Fatalf("resume: exit %d, want 0 (completed)\n%s", r.code, r.stderr)
	}
}

func sha(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// TestImportRefusals: bad folders and ids are usage errors (exit 2) that
// name what is wrong, and nothing is started.
func TestImportRefusals(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	pipeline, _ := importPipeline(t, filepath.Join(dir, "pipeline"))
	global := []string{"--data", filepath.Join(dir, "data")}
	good := filepath.Join(dir, "good")
	writeFiles(t, good, map[string]string{"content.md": loopliaContent, "summary.json": loopliaSummary})
	escaping := filepath.Join(dir, "escaping")
	writeFiles(t, escaping, map[string]string{"content.md": loopliaContent})
	writeFiles(t, dir, map[string]string{"secret.json": `{"title":"outside"}`})
	if err := os.Symlink(filepath.Join(dir, "secret.json"), filepath.Join(escaping, "summary.json")); err != nil {
		t.Fatal(err)
	}
	badManifest := filepath.Join(dir, "bad-manifest")
	writeFiles(t, badManifest, map[string]string{"content.md": loopliaContent, "session.json": `{"version": 1, "sourceHash": "` + shortHash(loopliaContent) + `", "steps": {"analyzing": {"status": "done"}}}`})
	noContent := filepath.Join(dir, "no-content")
	writeFiles(t, noContent, map[string]string{"summary.json": loopliaSummary})
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"a missing folder", []string{"import", filepath.Join(dir, "nope"), "--pipeline", pipeline}, "does not exist"},
		{"a file, not a folder", []string{"import", pipeline, "--pipeline", pipeline}, "is not a directory"},
		{"no --pipeline", []string{"import", good}, "--pipeline FILE is required"},
		{"a symbolic link out of the folder", []string{"import", escaping, "--pipeline", pipeline}, "outside the session folder"},
		{"an invalid session.json", []string{"import", badManifest, "--pipeline", pipeline}, "session.json: steps.analyzing.status: want pending, in_progress, completed or failed"},
		{"no content.md", []string{"import", noContent, "--pipeline", pipeline}, "has no content.md"},
		{"an unsafe session id", []string{"import", good, "--pipeline", pipeline, "--session", "a/b"}, "session"},
	} {
		r := loopbus(t, append(tc.args, global...)...)
		if r.code != 2 || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("%s: exit %d, want 2 with %q\n%s", tc.name, r.code, tc.want, r.stderr)
		}
	}
	// An existing session id is refused; the first import stands.
	if r := loopbus(t, append([]string{"import", good, "--pipeline", pipeline, "--session", "once"}, global...)...); r.code != 0 {
		t.Fatalf("import: exit %d\n%s", r.code, r.stderr)
	}
	if r := loopbus(t, append([]string{"import", good, "--pipeline", pipeline, "--session", "once"}, global...)...); r.code != 2 || !strings.Contains(r.stderr, "already exists") {
		t.Errorf("import into an existing session: exit %d\n%s", r.code, r.stderr)
	}
	if r := loopbus(t, append([]string{"resume", "nosuch"}, global...)...); r.code != 2 {
		t.Errorf("resume of an unknown session: exit %d\n%s", r.code, r.stderr)
	}
}

// TestImportRefusesFIFO: a named pipe in the folder (an unpacked archive
// can hold one) as content.md or as a step's output is refused promptly,
// naming the file, instead of blocking the import on a read no writer
// ends.
func TestImportRefusesFIFO(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	pipeline, _ := importPipeline(t, filepath.Join(dir, "pipeline"))
	global := []string{"--data", filepath.Join(dir, "data")}
	for _, name := range []string{"content.md", "summary.json"} {
		folder := filepath.Join(dir, strings.TrimSuffix(name, filepath.Ext(name)))
		files := map[string]string{"content.md": loopliaContent}
		delete(files, name)
		if err := os.MkdirAll(folder, 0o755); err != nil {
			t.Fatal(err)
		}
		writeFiles(t, folder, files)
		if err := syscall.Mkfifo(filepath.Join(folder, name), 0o644); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		cmd := exec.CommandContext(ctx, binary, append([]string{"import", folder, "--pipeline", pipeline, "--session", "fifo"}, global...)...)
		cmd.Env = testEnv(t)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		err := cmd.Run()
		timedOut := ctx.Err() != nil
		cancel()
		if timedOut {
			t.Fatalf("%s a named pipe: import still ran after 20s (blocked opening it)\n%s", name, stderr.String())
		}
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(stderr.String(), name) || !strings.Contains(stderr.String(), "not a regular file") {
			t.Errorf("%s a named pipe: %v, want exit 2 naming it as not a regular file\n%s", name, err, stderr.String())
		}
	}
}
