package client

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/loopbus/loopbus/schemas"
)

// kitPipeline is summary → ideas → outline, each output with a schema
// that requires a member.
func kitPipeline() schemas.Pipeline {
	sch := func(member string) json.RawMessage {
		return json.RawMessage(`{"type":"object","required":["` + member + `"]}`)
	}
	return schemas.Pipeline{Name: "kit", Steps: []schemas.Step{
		{Name: "summary", Outputs: []schemas.Output{{Name: "summary.json", Schema: sch("title"), SchemaVersion: "summary-v1"}}},
		{Name: "ideas", Requires: []string{"summary"}, Outputs: []schemas.Output{{Name: "ideas.json", Schema: sch("ideas")}}},
		{Name: "outline", Requires: []string{"ideas"}, Outputs: []schemas.Output{{Name: "outline.json"}}},
	}}
}

func writeFolder(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

const (
	content = "# Source\n"
	summary = `{"title":"t"}`
	ideas   = `{"ideas":[]}`
	outline = `[]`
)

func short(s string) string { return schemas.ShortHash(schemas.Digest([]byte(s))) }

// manifest is a session.json with the given steps member and the content's
// source hash.
func manifest(steps string) string {
	return `{"version":1,"contentId":"c","createdAt":"2025-12-12T10:30:00.000Z","updatedAt":"2025-12-12T10:35:42.000Z","sourceHash":"` + short(content) + `","steps":` + steps + `}`
}

// plan runs PlanImport and returns "step:imported" or "step:reason" per step.
func planOf(t *testing.T, files map[string]string) (*ImportPlan, []string) {
	t.Helper()
	p, err := PlanImport(kitPipeline(), writeFolder(t, files), "")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, s := range p.Steps {
		if s.Import {
			out = append(out, s.Step+": imported")
		} else {
			out = append(out, s.Step+": "+s.Reason)
		}
	}
	return p, out
}

func TestPlanImport(t *testing.T) {
	for _, tc := range []struct {
		name  string
		files map[string]string
		want  []string
	}{
		{
			name:  "legacy folder: the files present and valid",
			files: map[string]string{"content.md": content, "summary.json": summary, "ideas.json": ideas},
			want:  []string{"summary: imported", "ideas: imported", "outline: outline.json is missing"},
		},
		{
			name:  "a step after a gap is not imported",
			files: map[string]string{"content.md": content, "summary.json": summary, "outline.json": outline},
			want:  []string{"summary: imported", "ideas: ideas.json is missing", "outline: it requires step ideas, which is not imported"},
		},
		{
			name:  "an invalid artifact: neither it nor what follows",
			files: map[string]string{"content.md": content, "summary.json": `{"name":"t"}`, "ideas.json": ideas},
			want: []string{"summary: summary.json fails its schema: summary.json (root): missing property 'title'", "ideas: it requires step summary, which is not imported",
				"outline: it requires step ideas, which is not imported"},
		},
		{
			name: "session.json matched by Looplia's step names; a step in progress is not imported",
			files: map[string]string{"content.md": content, "summary.json": summary, "ideas.json": ideas, "outline.json": outline,
				"session.json": manifest(`{"analyzing":{"status":"completed","contentHash":"` + short(summary) + `"},"generating_ideas":{"status":"completed"},"building_outline":{"status":"in_progress"}}`)},
			want: []string{"summary: imported", "ideas: imported", "outline: session.json records step building_outline as in_progress"},
		},
		{
			name: "session.json matched by the pipeline's step names; a step it does not record is not imported",
			files: map[string]string{"content.md": content, "summary.json": summary, "ideas.json": ideas,
				"session.json": manifest(`{"summary":{"status":"completed"}}`)},
			want: []string{"summary: imported", "ideas: session.json records no step generating_ideas"},
		},
		{
			name: "a file changed since Looplia recorded it",
			files: map[string]string{"content.md": content, "summary.json": summary,
				"session.json": manifest(`{"analyzing":{"status":"completed","contentHash":"0123456789abcdef"}}`)},
			want: []string{"summary: summary.json changed since it was made: session.json records contentHash 0123456789abcdef, the file's is " + short(summary)},
		},
		{
			name: "the source changed: nothing",
			files: map[string]string{"content.md": content + "edited\n", "summary.json": summary,
				"session.json": manifest(`{"analyzing":{"status":"completed"}}`)},
			want: []string{"summary: the source changed: session.json records sourceHash " + short(content) + ", the input's is " + short(content+"edited\n")},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, got := planOf(t, tc.files)
			for i, w := range tc.want {
				if i >= len(got) || got[i] != w {
					t.Errorf("got:\n  %s\nwant (first %d):\n  %s", strings.Join(got, "\n  "), len(tc.want), strings.Join(tc.want, "\n  "))
					break
				}
			}
		})
	}
}

func TestPlanImportRecordsTheSource(t *testing.T) {
	p, _ := planOf(t, map[string]string{"content.md": content, "summary.json": summary,
		"session.json": manifest(`{"analyzing":{"status":"completed","completedAt":"2025-12-12T10:32:15.000Z","schemaVersion":"0.5.0"}}`)})
	s := p.Steps[0]
	if !p.HasManifest || p.SourceChanged || p.SourceHash != short(content) || s.SourceStep != "analyzing" || s.SourceSchemaVersion != "0.5.0" || s.CompletedAt == nil ||
		len(s.Files) != 1 || s.Files[0].Digest != schemas.Digest([]byte(summary)) {
		t.Errorf("plan %+v, step %+v", p, s)
	}
}

func TestPlanImportRefusals(t *testing.T) {
	outside := filepath.Join(t.TempDir(), "outside.json")
	if err := os.WriteFile(outside, []byte(summary), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		files map[string]string
		setup func(dir string) error
		want  string
	}{
		{"no content.md", map[string]string{"summary.json": summary}, nil, "has no content.md"},
		{"a symbolic link out of the folder", map[string]string{"content.md": content}, func(dir string) error {
			return os.Symlink(outside, filepath.Join(dir, "summary.json"))
		}, "outside the session folder"},
		{"a directory for an artifact", map[string]string{"content.md": content}, func(dir string) error {
			return os.Mkdir(filepath.Join(dir, "summary.json"), 0o755)
		}, "is not a regular file"},
		{"a file over the limit", map[string]string{"content.md": content}, func(dir string) error {
			return os.Truncate(filepath.Join(dir, "content.md"), MaxImportBytes+1)
		}, "over the 67108864-byte limit"},
		{"session.json: not JSON", map[string]string{"content.md": content, "session.json": "{"}, nil, "session.json: not a valid session manifest"},
		{"session.json: another version", map[string]string{"content.md": content, "session.json": `{"version":2,"sourceHash":"` + short(content) + `"}`}, nil, "session.json: version: want 1, got 2"},
		{"session.json: no sourceHash", map[string]string{"content.md": content, "session.json": `{"version":1}`}, nil, "session.json: sourceHash: want 16 lowercase hex digits"},
		{"session.json: a step of the wrong type", map[string]string{"content.md": content, "session.json": `{"version":1,"steps":{"analyzing":"done"}}`}, nil, "session.json: steps: want a JSON object, got string"},
		{"session.json: a bad status", map[string]string{"content.md": content, "session.json": manifest(`{"analyzing":{"status":"done"}}`)}, nil, "session.json: steps.analyzing.status: want pending, in_progress, completed or failed, got \"done\""},
		{"session.json: a bad completedAt", map[string]string{"content.md": content, "session.json": manifest(`{"analyzing":{"status":"completed","completedAt":"yesterday"}}`)}, nil, "session.json: steps.analyzing.completedAt"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := writeFolder(t, tc.files)
			if tc.setup != nil {
				if err := tc.setup(dir); err != nil {
					t.Fatal(err)
				}
			}
			_, err := PlanImport(kitPipeline(), dir, "")
			if !errors.Is(err, ErrBadInput) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("PlanImport = %v, want ErrBadInput with %q", err, tc.want)
			}
		})
	}
	if _, err := PlanImport(kitPipeline(), filepath.Join(t.TempDir(), "nope"), ""); !errors.Is(err, ErrBadInput) || !strings.Contains(err.Error(), "does not exist") {
		t.Errorf("missing folder: %v", err)
	}
	if _, err := PlanImport(schemas.Pipeline{Name: "b", Kind: schemas.KindBacklog}, t.TempDir(), ""); !errors.Is(err, ErrBadInput) || !strings.Contains(err.Error(), "kind backlog") {
		t.Errorf("backlog: %v", err)
	}
}
