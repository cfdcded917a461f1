package tui

import (
	"fmt"
	"io"
	"strings"

	"github.com/loopbus/loopbus/client"
	"github.com/loopbus/loopbus/schemas"
)

// ImportedStep is a step loopbus import recorded as completed, as import
// --json prints it.
type ImportedStep struct {
	Step        string                `json:"step"`
	ContentHash string                `json:"contentHash"`
	Artifacts   []schemas.ArtifactRef `json:"artifacts"`
	SourceStep  string                `json:"sourceStep,omitempty"`
}

// PendingStep is a step that runs on resume, and why it was not imported.
type PendingStep struct {
	Step   string `json:"step"`
	Reason string `json:"reason"`
}

// Import is what loopbus import --json prints.
type Import struct {
	Session    string `json:"session"`
	SourceHash string `json:"sourceHash"`
	// Manifest: the folder had a session.json (false for a folder of a
	// Looplia release before 0.5).
	Manifest      bool           `json:"manifest"`
	SourceChanged bool           `json:"sourceChanged,omitempty"`
	Imported      []ImportedStep `json:"imported"`
	Runs          []PendingStep  `json:"runs"`
	// Resume is the command that runs the steps not imported.
	Resume string `json:"resume"`
}

// ImportSummary returns what an import did: the steps imported with their
// hashes, the steps that run on resume and why, and the resume command
// (with where, the global flags that reach the same server: " --data DIR").
func ImportSummary(plan *client.ImportPlan, res client.ImportResult, where string) Import {
	out := Import{Session: res.Session, SourceHash: plan.SourceHash, Manifest: plan.HasManifest, SourceChanged: plan.SourceChanged,
		Imported: []ImportedStep{}, Runs: []PendingStep{}, Resume: "loopbus resume " + res.Session + where}
	for _, d := range res.Imported {
		out.Imported = append(out.Imported, ImportedStep{Step: d.Step, ContentHash: d.ContentHash, Artifacts: d.Artifacts, SourceStep: d.SourceStep})
	}
	for _, s := range plan.Steps {
		if !s.Import {
			out.Runs = append(out.Runs, PendingStep{Step: s.Step, Reason: s.Reason})
		}
	}
	return out
}

// ImportText describes an import in lines: the session, each step
// imported (its artifacts with their digests) or to run (and why), and,
// with withResume, the command that resumes it (see ImportSummary).
func ImportText(plan *client.ImportPlan, res client.ImportResult, withResume bool, where string) string {
	sum := ImportSummary(plan, res, where)
	var b strings.Builder
	from := "a legacy folder without " + client.LoopliaManifest
	if plan.HasManifest {
		from = client.LoopliaManifest + " sourceHash " + plan.ManifestSourceHash
	}
	fmt.Fprintf(&b, "session %s: imported from %s (input %s, sourceHash %s; %s)\n", res.Session, plan.Dir, plan.Input, plan.SourceHash, from)
	if plan.SourceChanged {
		b.WriteString("  the source changed since the folder's steps ran: nothing imported, every step runs\n")
	}
	for _, s := range sum.Imported {
		fmt.Fprintf(&b, "  imported  %s (contentHash %s)\n", s.Step, s.ContentHash)
		for _, a := range s.Artifacts {
			fmt.Fprintf(&b, "            %s %s (%d bytes)\n", a.Name, a.Digest, a.Size)
		}
	}
	for _, s := range sum.Runs {
		fmt.Fprintf(&b, "  runs      %s: %s\n", s.Step, s.Reason)
	}
	if withResume {
		switch {
		case len(sum.Runs) == 0:
			b.WriteString("every step was imported: the session completes without running an agent\n")
		default:
			fmt.Fprintf(&b, "nothing runs until you resume it: %s\n", sum.Resume)
		}
	}
	return strings.TrimSuffix(b.String(), "\n")
}

// WriteImport writes ImportText with the resume command.
func WriteImport(w io.Writer, plan *client.ImportPlan, res client.ImportResult, where string) error {
	_, err := fmt.Fprintln(w, ImportText(plan, res, true, where))
	return err
}
