package tui

import (
	"strings"
	"testing"

	"github.com/loopbus/loopbus/client"
	"github.com/loopbus/loopbus/schemas"
)

// TestImportText: import names the session, each imported step with its
// hashes, each step that runs and why, and the resume command.
func TestImportText(t *testing.T) {
	plan := &client.ImportPlan{Dir: "article", Input: "article/content.md", SourceHash: "0123456789abcdef", HasManifest: true, ManifestSourceHash: "0123456789abcdef",
		Steps: []client.ImportStep{{Step: "summary", Import: true}, {Step: "ideas", Reason: "ideas.json is missing"}}}
	arts := []schemas.ArtifactRef{{Name: "summary.json", Object: "k/import/summary/summary.json~x", Digest: schemas.Digest([]byte("{}")), Size: 2, Step: "summary"}}
	res := client.ImportResult{Session: "k", Imported: []*schemas.StepImported{{Step: "summary", Artifacts: arts, ContentHash: schemas.ContentHash(arts), Source: schemas.ImportSourceLooplia}}}
	got := ImportText(plan, res, true, " --data /d")
	for _, want := range []string{
		"session k: imported from article (input article/content.md, sourceHash 0123456789abcdef; session.json sourceHash 0123456789abcdef)",
		"  imported  summary (contentHash 44136fa355b3678a)\n            summary.json " + arts[0].Digest + " (2 bytes)",
		"  runs      ideas: ideas.json is missing",
		"nothing runs until you resume it: loopbus resume k --data /d",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("lacks %q:\n%s", want, got)
		}
	}
	if s := ImportSummary(plan, res, ""); len(s.Imported) != 1 || len(s.Runs) != 1 || s.Resume != "loopbus resume k" {
		t.Errorf("summary %+v", s)
	}
}
