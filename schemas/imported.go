package schemas

import (
	"strings"
	"time"
)

// TypeStepImported records a step done outside loopbus, whose outputs
// loopbus import brought in: the step counts as completed and its agent
// does not run.
const TypeStepImported = "loopbus.step.imported"

// ImportSourceLooplia names the session folders of Looplia (content.md,
// session.json and the step artifacts side by side).
const ImportSourceLooplia = "looplia"

// ImportStart marks a session that loopbus import made from another
// system's session folder (SessionStarted.Import). The session starts
// paused: step.imported events record the steps done there, and nothing
// runs until a resume.
type ImportStart struct {
	// Source names the system: ImportSourceLooplia.
	Source string `json:"source"`
	// ManifestSourceHash is the sourceHash the folder's manifest
	// (session.json) recorded; "" without one. When it differs from the
	// session's SourceHash the input changed since, and nothing was
	// imported.
	ManifestSourceHash string `json:"manifestSourceHash,omitempty"`
}

// StepImported records a step whose outputs were produced outside loopbus:
// the step is completed with Artifacts, stored in the artifact store as a
// worker stores outputs, so the steps after it get them as inputs. Stated
// by the client (loopbus import) before the session's first job; the
// orchestrator refuses one after it, one for a step not in the pipeline or
// already completed, one whose required steps are not completed, and one
// whose artifacts are not exactly the step's declared outputs.
type StepImported struct {
	Step      string        `json:"step"`
	Artifacts []ArtifactRef `json:"artifacts"`
	// ContentHash is 16 hex digits identifying the artifacts (see
	// ContentHash).
	ContentHash string `json:"contentHash"`
	// SchemaVersion is the version of the step's output schemas the
	// artifacts were checked against (see StepSchemaVersion).
	SchemaVersion string `json:"schemaVersion,omitempty"`
	// Source names the system that produced the outputs:
	// ImportSourceLooplia.
	Source string `json:"source"`
	// SourceStep is the step's name in the source, when its manifest
	// recorded the step under another name (Looplia's "analyzing" for
	// summary.json).
	SourceStep string `json:"sourceStep,omitempty"`
	// SourceSchemaVersion is the schema version the source recorded for
	// the step, if any.
	SourceSchemaVersion string `json:"sourceSchemaVersion,omitempty"`
	// CompletedAt is when the source recorded the step completed, if it
	// did.
	CompletedAt *time.Time `json:"completedAt,omitempty"`
}

// StepSchemaVersion returns the schema versions of a step's outputs,
// comma-separated in declaration order ("" when none has one): the
// schemaVersion its step.completed and step.imported record.
func StepSchemaVersion(s Step) string {
	var vs []string
	for _, o := range s.Outputs {
		if o.SchemaVersion != "" {
			vs = append(vs, o.SchemaVersion)
		}
	}
	return strings.Join(vs, ",")
}
