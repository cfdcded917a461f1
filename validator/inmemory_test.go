package validator_test

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/loopbus/loopbus/internal/testnats"
	"github.com/loopbus/loopbus/schemas"
	"github.com/loopbus/loopbus/validator"
	"github.com/loopbus/loopbus/workspace"
)

// TestNoWorkspaceWithoutCommand checks that outputs of a step without a
// validate command are checked in memory: whatever the verdict, nothing is
// created under the work directory, even with workspaces kept. A step
// with a command still gets its workspace, with the outputs' exact bytes
// in out/.
func TestNoWorkspaceWithoutCommand(t *testing.T) {
	b, _ := testnats.Bus(t)
	workDir := filepath.Join(t.TempDir(), "work")
	v, err := validator.New(validator.Config{
		WorkDir:        workDir,
		KeepWorkspaces: true,
		Env:            []string{"PATH=" + os.Getenv("PATH")},
	}, b, testnats.Logger(t), time.Now)
	if err != nil {
		t.Fatalf("validator.New: %v", err)
	}
	testnats.Run(t, "validator", v.Run)

	summary := schemas.Output{Name: "summary.json", Schema: json.RawMessage(summarySchema), Report: true}
	// big is stored in several chunks (over 128 KiB) and passes the schema;
	// it is too big for a report.
	bigSummary := schemas.Output{Name: "summary.json", Schema: json.RawMessage(summarySchema)}
	big := `{"title":"` + strings.Repeat("t", 300<<10) + `","count":2}`
	submit := func(id string, outputs []schemas.Output, produced []file, validate []string) {
		t.Helper()
		j := newJob(id, outputs...)
		j.produced = produced
		j.request.Validate = validate
		j.complete(t, b, publish(t, b, session, schemas.TypeJobRequested, "summary", id, j.request))
	}
	noCommand := []struct {
		id       string
		outputs  []schemas.Output
		produced []file
		want     string
	}{
		{"s1.summary.1", []schemas.Output{summary, {Name: "notes.md"}},
			[]file{{"summary.json", `{"title":"t","count":1}`}, {"notes.md", "notes"}}, schemas.TypeValidationPassed},
		{"s1.summary.2", []schemas.Output{bigSummary}, []file{{"summary.json", big}}, schemas.TypeValidationPassed},
		{"s1.summary.3", []schemas.Output{summary}, []file{{"summary.json", `{"title":"t","count":0}`}}, schemas.TypeValidationFailed},
		{"s1.summary.4", []schemas.Output{summary, {Name: "ideas.md"}}, []file{{"summary.json", `{"title":"t","count":1}`}}, schemas.TypeValidationFailed},
		{"s1.summary.5", []schemas.Output{{Name: "review.json", Report: true}}, []file{{"review.json", "not JSON"}}, schemas.TypeValidationFailed},
	}
	for _, c := range noCommand {
		submit(c.id, c.outputs, c.produced, nil)
	}
	for _, c := range noCommand {
		if ev, v := waitVerdict(t, b, c.id); ev.Type != c.want {
			t.Errorf("%s: verdict %s, want %s: %s", c.id, ev.Type, c.want, mustJSON(t, v))
		}
	}
	waitAcked(t, b)
	if _, err := os.Stat(workDir); !os.IsNotExist(err) {
		var made []string
		_ = filepath.WalkDir(workDir, func(path string, _ os.DirEntry, _ error) error {
			made = append(made, path)
			return nil
		})
		t.Fatalf("verdicts of steps without a validate command created under the work dir:\n%s", strings.Join(made, "\n"))
	}

	submit("s1.summary.6", []schemas.Output{bigSummary, {Name: "notes.md"}},
		[]file{{"summary.json", big}, {"notes.md", "notes"}}, []string{"true"})
	if ev, v := waitVerdict(t, b, "s1.summary.6"); ev.Type != schemas.TypeValidationPassed {
		t.Fatalf("verdict %s, want %s: %s", ev.Type, schemas.TypeValidationPassed, mustJSON(t, v))
	}
	for name, want := range map[string]string{"summary.json": big, "notes.md": "notes"} {
		paths, _ := filepath.Glob(filepath.Join(workDir, session+".summary-1-*", "out", name))
		if len(paths) != 1 {
			t.Fatalf("kept workspaces of the step with a command hold %d out/%s, want 1", len(paths), name)
		}
		if got, err := os.ReadFile(paths[0]); err != nil || !bytes.Equal(got, []byte(want)) {
			t.Errorf("out/%s: %d bytes (%v), want the %d bytes produced", name, len(got), err, len(want))
		}
	}
}

// TestReuseWorkspaces: with ReuseWorkspaces a validate command's
// workspace is emptied and kept for the next, which finds nothing the
// last command left.
func TestReuseWorkspaces(t *testing.T) {
	b, _ := testnats.Bus(t)
	workDir := filepath.Join(t.TempDir(), "work")
	v, err := validator.New(validator.Config{
		WorkDir:         workDir,
		ReuseWorkspaces: true,
		Env:             []string{"PATH=" + os.Getenv("PATH")},
	}, b, testnats.Logger(t), time.Now)
	if err != nil {
		t.Fatalf("validator.New: %v", err)
	}
	testnats.Run(t, "validator", v.Run)
	// Passes only in a workspace the last command left nothing in.
	check := []string{"sh", "-c", `test ! -e "$LOOPBUS_WORKSPACE/stray" && echo left > "$LOOPBUS_WORKSPACE/stray"`}
	for i := range 3 {
		id := "s1.summary." + strconv.Itoa(i+1)
		j := newJob(id, schemas.Output{Name: "notes.md"})
		j.produced = []file{{"notes.md", "notes"}}
		j.request.Validate = check
		j.complete(t, b, publish(t, b, session, schemas.TypeJobRequested, "summary", id, j.request))
		if ev, v := waitVerdict(t, b, id); ev.Type != schemas.TypeValidationPassed {
			t.Fatalf("%s: verdict %s, want %s: %s", id, ev.Type, schemas.TypeValidationPassed, mustJSON(t, v))
		}
	}
	waitAcked(t, b)
	left, err := os.ReadDir(workDir)
	if err != nil {
		t.Fatal(err)
	}
	if len(left) != 1 || !strings.HasPrefix(left[0].Name(), workspace.IdlePrefix) {
		t.Errorf("work dir holds %v, want one kept workspace", left)
	}
}
