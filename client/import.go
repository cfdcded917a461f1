package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"time"

	"github.com/loopbus/loopbus/schemas"
)

// MaxImportBytes bounds each file loopbus import reads: an artifact as
// large as a worker stores by default (agentworker --max-output-bytes).
const MaxImportBytes = 64 << 20

// maxLoopliaManifestBytes bounds a session folder's session.json.
const maxLoopliaManifestBytes = 1 << 20

// Files of a Looplia session folder.
const (
	// LoopliaContent is the source content: the session's input unless
	// another is named.
	LoopliaContent = "content.md"
	// LoopliaManifest is the session manifest (absent in folders made
	// before Looplia 0.5).
	LoopliaManifest = "session.json"
)

// loopliaSteps maps an artifact file of a Looplia session folder to the
// name its session.json records the step under (Looplia's step-to-artifact
// table). A pipeline step whose name is not in session.json is matched to
// the entry of its output's Looplia step (a step with summary.json among
// its outputs to "analyzing").
var loopliaSteps = map[string]string{
	"summary.json":     "analyzing",
	"ideas.json":       "generating_ideas",
	"outline.json":     "building_outline",
	"writing-kit.json": "assembling_kit",
}

// loopliaManifest is a Looplia session.json (format version 1).
type loopliaManifest struct {
	Version    *int                         `json:"version"`
	ContentID  string                       `json:"contentId"`
	CreatedAt  string                       `json:"createdAt"`
	UpdatedAt  string                       `json:"updatedAt"`
	Steps      map[string]loopliaStepRecord `json:"steps"`
	SourceHash string                       `json:"sourceHash"`
}

type loopliaStepRecord struct {
	Status        string `json:"status"`
	ContentHash   string `json:"contentHash"`
	CompletedAt   string `json:"completedAt"`
	ErrorMessage  string `json:"errorMessage"`
	SchemaVersion string `json:"schemaVersion"`
}

var shortHashRE = regexp.MustCompile(`^[0-9a-f]{16}$`)

// ImportPlan is what a session folder holds for a pipeline: the input, and
// for each step (in pipeline order) whether it is imported as completed
// and, if not, why.
type ImportPlan struct {
	// Dir is the session folder; Input the session's input file.
	Dir, Input string
	// SourceHash is the first 16 hex digits of the input's sha-256.
	SourceHash string
	// HasManifest: the folder has a session.json; ManifestSourceHash is
	// the sourceHash it recorded.
	HasManifest        bool
	ManifestSourceHash string
	// SourceChanged: session.json's sourceHash is not the input's; then
	// no step is imported (the source changed since its steps ran).
	SourceChanged bool
	Steps         []ImportStep
}

// ImportStep is one pipeline step of an ImportPlan.
type ImportStep struct {
	Step string
	// Import: every output is present and valid, every required step is
	// imported, and session.json (if any) records the step completed.
	Import bool
	// Reason says why the step is not imported ("" when it is).
	Reason string
	// Files are the step's outputs found in the folder (all of them when
	// Import).
	Files []ImportFile
	// SourceStep, SourceSchemaVersion and CompletedAt are what
	// session.json recorded for the step, if anything.
	SourceStep          string
	SourceSchemaVersion string
	CompletedAt         *time.Time
}

// ImportFile is an output file of a step in the session folder.
type ImportFile struct {
	Name, Path string
	// Digest is "sha256:" and the file's 64 hex digits; Size its length.
	Digest string
	Size   int64
}

// PlanImport reads a Looplia session folder (dir: content.md, the step
// artifacts and, since Looplia 0.5, session.json) for pipeline p and says
// which steps are imported as completed: a step whose every declared
// output is a file in dir that satisfies the output's schema, whose
// required steps are imported too, and, when session.json exists, that it
// records as completed (under the step's name, or else under the Looplia
// name of one of its outputs, see loopliaSteps) with the file's content
// hash if it recorded one. When session.json's sourceHash is not the
// input's, nothing is imported. input is the session's input; "" for
// dir/content.md. It reads files only: nothing is stored or published.
//
// Errors wrap ErrBadInput: dir missing or not a directory, no input, a
// file that is not a regular file, a symbolic link leading out of dir, a
// file over MaxImportBytes, an invalid session.json (naming the field),
// and a pipeline that is not of steps.
func PlanImport(p schemas.Pipeline, dir, input string) (*ImportPlan, error) {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: %s", ErrBadInput, fmt.Sprintf(format, a...))
	}
	if p.Kind != "" && p.Kind != schemas.KindPipeline {
		return nil, bad("import takes a pipeline of steps; %s is of kind %s", orSource(p), p.Kind)
	}
	fi, err := os.Stat(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil, bad("session folder %s does not exist", dir)
	case err != nil:
		return nil, bad("session folder %s: %v", dir, err)
	case !fi.IsDir():
		return nil, bad("%s is not a directory (import takes a session folder: content.md, session.json and the step artifacts)", dir)
	}
	root, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return nil, bad("session folder %s: %v", dir, err)
	}
	plan := &ImportPlan{Dir: dir, Input: input}
	if input == "" {
		plan.Input = filepath.Join(dir, LoopliaContent)
		if _, err := os.Lstat(plan.Input); errors.Is(err, fs.ErrNotExist) {
			return nil, bad("%s has no %s (the source content, the session's input); name the input with --input FILE", dir, LoopliaContent)
		}
		if err := insideDir(root, plan.Input); err != nil {
			return nil, bad("%v", err)
		}
	}
	raw, err := readBounded(inputFolder(dir, plan.Input), plan.Input)
	if err != nil {
		return nil, bad("input: %v", err)
	}
	plan.SourceHash = schemas.ShortHash(schemas.Digest(raw))

	manifestPath := filepath.Join(dir, LoopliaManifest)
	var man *loopliaManifest
	if _, err := os.Lstat(manifestPath); err == nil {
		if err := insideDir(root, manifestPath); err != nil {
			return nil, bad("%v", err)
		}
		if man, err = readLoopliaManifest(dir, manifestPath); err != nil {
			return nil, fmt.Errorf("%w: %v", ErrBadInput, err)
		}
		plan.HasManifest, plan.ManifestSourceHash = true, man.SourceHash
		plan.SourceChanged = man.SourceHash != plan.SourceHash
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, bad("%s: %v", manifestPath, err)
	}

	imported := map[string]bool{}
	for _, st := range p.Steps {
		is := ImportStep{Step: st.Name}
		if is.Reason, err = planStep(&is, st, root, dir, man, imported); err != nil {
			return nil, fmt.Errorf("%w: step %s: %v", ErrBadInput, st.Name, err)
		}
		if plan.SourceChanged {
			is.Reason = fmt.Sprintf("the source changed: %s records sourceHash %s, the input's is %s", LoopliaManifest, man.SourceHash, plan.SourceHash)
		}
		if is.Reason == "" && len(st.Outputs) == 0 {
			is.Reason = "the step declares no outputs"
		}
		if is.Reason == "" {
			is.Import, imported[st.Name] = true, true
		}
		plan.Steps = append(plan.Steps, is)
	}
	return plan, nil
}

// planStep fills is with the files of step st found in dir and returns why
// the step is not imported ("" when it is); an error for a file that is
// unsafe to read (see PlanImport).
func planStep(is *ImportStep, st schemas.Step, root, dir string, man *loopliaManifest, imported map[string]bool) (string, error) {
	var missing []string
	for _, r := range st.Requires {
		if !imported[r] {
			missing = append(missing, r)
		}
	}
	var reason string
	if len(missing) > 0 {
		reason = "it requires step " + strings.Join(missing, ", ") + ", which is not imported"
	}
	var rec *loopliaStepRecord
	if man != nil {
		rec, is.SourceStep = man.record(st)
		if rec != nil {
			is.SourceSchemaVersion = rec.SchemaVersion
			if t, err := time.Parse(time.RFC3339Nano, rec.CompletedAt); err == nil {
				is.CompletedAt = &t
			}
		}
		switch {
		case reason != "":
		case rec == nil:
			reason = fmt.Sprintf("%s records no step %s", LoopliaManifest, orName(is.SourceStep, st.Name))
		case rec.Status != "completed":
			reason = fmt.Sprintf("%s records step %s as %s", LoopliaManifest, orName(is.SourceStep, st.Name), rec.Status)
		}
	}
	for _, o := range st.Outputs {
		path := filepath.Join(dir, o.Name)
		if _, err := os.Lstat(path); errors.Is(err, fs.ErrNotExist) {
			if reason == "" {
				reason = o.Name + " is missing"
			}
			continue
		}
		if err := insideDir(root, path); err != nil {
			return "", err
		}
		raw, err := readBounded(dir, path)
		if err != nil {
			return "", err
		}
		f := ImportFile{Name: o.Name, Path: path, Digest: schemas.Digest(raw), Size: int64(len(raw))}
		is.Files = append(is.Files, f)
		if reason != "" {
			continue
		}
		if rec != nil && rec.ContentHash != "" && len(st.Outputs) == 1 && rec.ContentHash != schemas.ShortHash(f.Digest) {
			reason = fmt.Sprintf("%s changed since it was made: %s records contentHash %s, the file's is %s", o.Name, LoopliaManifest, rec.ContentHash, schemas.ShortHash(f.Digest))
			continue
		}
		if len(o.Schema) > 0 {
			sch, err := schemas.CompileArtifactSchema(o.Name, o.Schema)
			if err != nil {
				reason = fmt.Sprintf("the schema of %s does not compile: %v", o.Name, err)
				continue
			}
			if errs := sch.Validate(o.Name, raw); len(errs) > 0 {
				reason = fmt.Sprintf("%s fails its schema: %s", o.Name, errs[0].String())
				if len(errs) > 1 {
					reason += fmt.Sprintf(" (and %d more errors)", len(errs)-1)
				}
			}
		}
	}
	return reason, nil
}

// record returns the session.json entry of pipeline step st: under its
// own name, else under the Looplia name of its first output that has one
// (then source names it).
func (m *loopliaManifest) record(st schemas.Step) (rec *loopliaStepRecord, source string) {
	if r, ok := m.Steps[st.Name]; ok {
		return &r, ""
	}
	for _, o := range st.Outputs {
		if name := loopliaSteps[o.Name]; name != "" {
			if r, ok := m.Steps[name]; ok {
				return &r, name
			}
		}
	}
	for _, o := range st.Outputs {
		if name := loopliaSteps[o.Name]; name != "" {
			return nil, name
		}
	}
	return nil, ""
}

func orName(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

func orSource(p schemas.Pipeline) string {
	if p.Source != "" {
		return p.Source
	}
	return p.Name
}

// readLoopliaManifest reads and checks a session.json: errors name the file
// and the field.
func readLoopliaManifest(dir, path string) (*loopliaManifest, error) {
	raw, err := readBoundedN(dir, path, maxLoopliaManifestBytes)
	if err != nil {
		return nil, err
	}
	var m loopliaManifest
	if err := json.Unmarshal(raw, &m); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field != "" {
			return nil, fmt.Errorf("%s: %s: want a JSON %s, got %s", path, te.Field, jsonKind(te.Type.Kind().String()), te.Value)
		}
		return nil, fmt.Errorf("%s: not a valid session manifest: %v", path, err)
	}
	bad := func(field, format string, a ...any) error {
		return fmt.Errorf("%s: %s: %s", path, field, fmt.Sprintf(format, a...))
	}
	switch {
	case m.Version == nil:
		return nil, bad("version", "missing (want 1)")
	case *m.Version != 1:
		return nil, bad("version", "want 1, got %d (a manifest of another Looplia release)", *m.Version)
	case !shortHashRE.MatchString(m.SourceHash):
		return nil, bad("sourceHash", "want 16 lowercase hex digits (of content.md's sha-256), got %q", m.SourceHash)
	}
	for name, r := range m.Steps {
		field := "steps." + name
		switch r.Status {
		case "pending", "in_progress", "completed", "failed":
		default:
			return nil, bad(field+".status", "want pending, in_progress, completed or failed, got %q", r.Status)
		}
		if r.ContentHash != "" && !shortHashRE.MatchString(r.ContentHash) {
			return nil, bad(field+".contentHash", "want 16 lowercase hex digits, got %q", r.ContentHash)
		}
		if r.CompletedAt != "" {
			if _, err := time.Parse(time.RFC3339Nano, r.CompletedAt); err != nil {
				return nil, bad(field+".completedAt", "want an ISO 8601 time, got %q", r.CompletedAt)
			}
		}
	}
	return &m, nil
}

func jsonKind(k string) string {
	switch k {
	case "map", "struct":
		return "object"
	case "slice":
		return "array"
	case "int", "int64":
		return "number"
	}
	return k
}

// inputFolder is dir when the input is a file in it (its content.md, or
// an --input there), read as the folder's files are; "" for an input from
// elsewhere, which --input named itself.
func inputFolder(dir, input string) string {
	if filepath.Dir(input) == filepath.Clean(dir) {
		return dir
	}
	return ""
}

// insideDir refuses path when it is, or leads through a symbolic link to,
// a file outside root (the session folder with its own links resolved).
func insideDir(root, path string) error {
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		return fmt.Errorf("%s: %v", path, err)
	}
	rel, err := filepath.Rel(root, real)
	if err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) || filepath.IsAbs(rel) {
		return fmt.Errorf("%s is a symbolic link to %s, outside the session folder", path, real)
	}
	return nil
}

func readBounded(dir, path string) ([]byte, error) { return readBoundedN(dir, path, MaxImportBytes) }

// readBoundedN reads a regular file of at most limit bytes. With dir set,
// path is a file in the folder dir and is opened through an os.Root of
// dir: a symbolic link cannot lead the open out of the folder, even one
// swapped in after insideDir looked. The open does not block (a named
// pipe with no writer would block it forever); what it opened is then
// refused unless it is a regular file.
func readBoundedN(dir, path string, limit int64) ([]byte, error) {
	flag := os.O_RDONLY | syscall.O_NONBLOCK
	var f *os.File
	if dir == "" {
		var err error
		if f, err = os.OpenFile(path, flag, 0); err != nil {
			return nil, err
		}
	} else {
		rel, err := filepath.Rel(dir, path)
		if err != nil || !filepath.IsLocal(rel) {
			return nil, fmt.Errorf("%s is not in the session folder %s", path, dir)
		}
		root, err := os.OpenRoot(dir)
		if err != nil {
			return nil, err
		}
		f, err = root.OpenFile(rel, flag, 0)
		root.Close()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file", path)
	}
	if fi.Size() > limit {
		return nil, fmt.Errorf("%s is %d bytes, over the %d-byte limit of a file import reads", path, fi.Size(), limit)
	}
	raw, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(raw)) > limit {
		return nil, fmt.Errorf("%s is over the %d-byte limit of a file import reads", path, limit)
	}
	return raw, nil
}

// ImportResult is a session loopbus import started.
type ImportResult struct {
	Session string
	// Started is the session.started event.
	Started schemas.Event
	// Imported are the step.imported events published, in pipeline order.
	Imported []*schemas.StepImported
}

// Import starts session over pipeline p from plan (see PlanImport): it
// stores the input and publishes session.started with Import set (the
// session waits paused: nothing runs until a resume), then, for each step
// the plan imports, stores its files in the artifact store as a worker
// stores outputs and publishes step.imported with their references, so
// the steps after it get them as inputs. It fails with ErrSessionExists if
// the session has events, and with ErrBadInput for an invalid session id
// or input name, or a file that changed since it was planned.
func Import(ctx context.Context, b Bus, p schemas.Pipeline, plan *ImportPlan, session string, now time.Time) (ImportResult, error) {
	if err := schemas.ValidateSessionID(session); err != nil {
		return ImportResult{}, fmt.Errorf("%w: %v", ErrBadInput, err)
	}
	name := filepath.Base(plan.Input)
	if err := schemas.ValidateName(name); err != nil {
		return ImportResult{}, fmt.Errorf("%w: input file name: %v (rename the file)", ErrBadInput, err)
	}
	for _, st := range p.Steps {
		for _, o := range st.Outputs {
			if o.Name == name {
				return ImportResult{}, fmt.Errorf("%w: input %s has the name of step %s's output; rename the input file", ErrBadInput, name, st.Name)
			}
		}
	}
	if last, err := b.SessionLastSeq(ctx, session); err != nil {
		return ImportResult{}, err
	} else if last != 0 {
		return ImportResult{}, fmt.Errorf("%w: %s (import starts a new session: choose another --session)", ErrSessionExists, session)
	}
	in, err := storeFile(ctx, b, session+"/input/"+name, name, inputFolder(plan.Dir, plan.Input), plan.Input, "")
	if err != nil {
		return ImportResult{}, err
	}
	start, err := publishStart(ctx, b, session, now, &schemas.SessionStarted{Pipeline: p, Input: in, SourceHash: schemas.ShortHash(in.Digest),
		Import: &schemas.ImportStart{Source: schemas.ImportSourceLooplia, ManifestSourceHash: plan.ManifestSourceHash}})
	if err != nil {
		return ImportResult{}, err
	}
	res := ImportResult{Session: session, Started: start}
	if schemas.ShortHash(in.Digest) != plan.SourceHash {
		return res, fmt.Errorf("%w: %s changed while it was imported; nothing was imported as completed (run import again with another --session)", ErrBadInput, plan.Input)
	}
	for _, is := range plan.Steps {
		if !is.Import {
			continue
		}
		var arts []schemas.ArtifactRef
		for _, f := range is.Files {
			ref, err := storeFile(ctx, b, session+"/import/"+is.Step+"/"+f.Name, f.Name, plan.Dir, f.Path, f.Digest)
			if err != nil {
				return res, err
			}
			ref.Step = is.Step
			arts = append(arts, ref)
		}
		d := &schemas.StepImported{Step: is.Step, Artifacts: arts, ContentHash: schemas.ContentHash(arts), SchemaVersion: schemas.StepSchemaVersion(stepOf(p, is.Step)),
			Source: schemas.ImportSourceLooplia, SourceStep: is.SourceStep, SourceSchemaVersion: is.SourceSchemaVersion, CompletedAt: is.CompletedAt}
		ev := schemas.Event{
			ID:          schemas.DeterministicID(session, schemas.TypeStepImported, is.Step),
			Type:        schemas.TypeStepImported,
			Session:     session,
			Step:        is.Step,
			Correlation: start.ID,
			Causation:   start.ID,
			Time:        now,
			Data:        d,
		}
		if _, err := b.Publish(ctx, ev); err != nil {
			return res, err
		}
		res.Imported = append(res.Imported, d)
	}
	return res, nil
}

func stepOf(p schemas.Pipeline, name string) schemas.Step {
	for _, s := range p.Steps {
		if s.Name == name {
			return s
		}
	}
	return schemas.Step{}
}

// storeFile stores the file at path as artifact name under object; with
// digest set, a file whose bytes no longer have that digest is refused
// (it changed since it was checked).
func storeFile(ctx context.Context, b Bus, object, name, dir, path, digest string) (schemas.ArtifactRef, error) {
	raw, err := readBounded(dir, path)
	if err != nil {
		return schemas.ArtifactRef{}, fmt.Errorf("%w: %v", ErrBadInput, err)
	}
	if digest != "" && schemas.Digest(raw) != digest {
		return schemas.ArtifactRef{}, fmt.Errorf("%w: %s changed while it was imported", ErrBadInput, path)
	}
	return b.PutArtifact(ctx, object, name, bytes.NewReader(raw))
}

// Resume publishes a resume signal for session (as loopbus signal resume
// SESSION): a paused or stopped session, or an imported one waiting for
// its first resume, runs on. It fails with ErrNoSession for a session
// never started and ErrBadInput for an invalid id or reason.
func Resume(ctx context.Context, b Bus, session, reason string, now time.Time) (SentSignal, error) {
	if err := schemas.ValidateSessionID(session); err != nil {
		return SentSignal{}, fmt.Errorf("%w: %v", ErrBadInput, err)
	}
	req := SignalRequest{Verb: "resume", Target: SignalTarget{Session: session}, Reason: reason}
	if err := req.Check(); err != nil {
		return SentSignal{}, err
	}
	dests, err := ResolveSignalTarget(ctx, b, req.Target)
	if err != nil {
		return SentSignal{}, err
	}
	sent, err := SendSignal(ctx, b, req, dests, now)
	if err != nil {
		return SentSignal{}, err
	}
	return sent[0], nil
}
