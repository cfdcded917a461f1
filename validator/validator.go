// Package validator checks the artifacts of completed jobs: each output that
// names a JSON Schema is validated against it, then the step's optional
// validate command runs with the outputs and inputs materialized. The
// verdict, validation.passed or validation.failed, lists every error with
// its JSON pointer and a hint for the next iteration; validation.passed
// carries the content of the outputs declared as reports.
package validator

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/gitrepo"
	"github.com/loopbus/loopbus/schemas"
	"github.com/loopbus/loopbus/workspace"
	"github.com/loopbus/loopbus/workspace/procrun"
	"github.com/rs/zerolog"
)

// Bus is what the validator needs from the event bus.
type Bus interface {
	Consume(ctx context.Context, cfg bus.ConsumerConfig, h bus.Handler) error
	Publish(ctx context.Context, ev schemas.Event) (bus.Published, error)
	GetEvent(ctx context.Context, seq uint64) (schemas.Event, error)
	// GetArtifact copies an artifact to w, checking its size and digest
	// (see bus.Bus.GetArtifact): outputs are checked in memory, and a
	// validate command's inputs and definition files written to its
	// workspace.
	GetArtifact(ctx context.Context, ref schemas.ArtifactRef, w io.Writer) error
	// GetArtifactFile writes an artifact to a file: git bundles.
	GetArtifactFile(ctx context.Context, ref schemas.ArtifactRef, path string) error
	// OwnID makes a derived event id unguessable to other keys (see
	// bus.Bus.OwnID).
	OwnID(id string) string
}

// verdictID is one per job result: a redelivered result gets the same
// verdict. With signed events it is one per job and signer, so that a
// result forged by another worker (dead-lettered by the orchestrator)
// cannot take the id of the real result's verdict.
func verdictID(ev schemas.Event) string {
	jobID := ev.Job
	if jc, ok := ev.Data.(*schemas.JobCompleted); ok {
		jobID = jc.JobID
	}
	if ev.Signer == "" {
		return schemas.DeterministicID(ev.Session, "verdict", jobID)
	}
	return schemas.DeterministicID(ev.Session, "verdict", jobID, ev.Signer)
}

// Config of the validator. The zero value is usable.
type Config struct {
	// Concurrency is the number of verdicts worked on at once; default 2.
	Concurrency int
	// WorkDir holds the workspaces of validate commands (outputs are
	// otherwise checked in memory); default $TMPDIR/loopbus-validate-UID.
	// It is made with the first workspace, and refused then when another
	// user could change it (workspace.PrivateDir); each repository cache
	// when it is not the validator's user's alone.
	WorkDir string
	// RepoCache holds the validator's git repository caches, one per
	// session, in which the commits of worktree jobs are checked out to run
	// their validate command; default WorkDir/repos.
	RepoCache string
	// KeepWorkspaces leaves workspaces on disk for debugging.
	KeepWorkspaces bool
	// ReuseWorkspaces reuses validate commands' workspaces, as
	// agentworker.Config.ReuseWorkspaces does jobs'.
	ReuseWorkspaces bool
	// DefaultTimeout bounds a validate command whose step sets none; 1m.
	DefaultTimeout time.Duration
	// Env is the base environment of validate commands; nil means this
	// process's, without its LOOPBUS_* settings. The step's agent env is
	// added, as for the agent.
	Env []string
	// SecretEnv names environment variables whose values are masked in
	// verdicts and logs, in addition to the step's secret_env and names
	// that look secret (see workspace.NewSecrets).
	SecretEnv []string
	// AckWait is the heartbeat horizon: a job completion whose validator is
	// silent this long (crashed) goes to another replica; default 30s.
	AckWait time.Duration
}

// ErrInvalidConfig: a Config value is out of range.
var ErrInvalidConfig = errors.New("validator: invalid configuration")

// Validate reports the first invalid value, wrapping ErrInvalidConfig.
func (c Config) Validate() error {
	if c.Concurrency < 0 || c.DefaultTimeout < 0 || c.AckWait < 0 {
		return fmt.Errorf("%w: negative setting", ErrInvalidConfig)
	}
	return nil
}

// Service is the validator.
type Service struct {
	cfg Config
	bus Bus
	log zerolog.Logger
	now func() time.Time

	caches *gitrepo.Caches
	// workspaces are the validate commands' workspaces, emptied and
	// kept for the next while Run runs.
	workspaces *workspace.Pool
}

// New returns a validator.
func New(cfg Config, b Bus, log zerolog.Logger, now func() time.Time) (*Service, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if b == nil || now == nil {
		return nil, errors.New("validator: bus and clock are required")
	}
	if cfg.Concurrency == 0 {
		cfg.Concurrency = 2
	}
	if cfg.WorkDir == "" {
		cfg.WorkDir = workspace.DefaultDir("loopbus-validate")
	}
	if cfg.RepoCache == "" {
		cfg.RepoCache = filepath.Join(cfg.WorkDir, "repos")
	}
	if cfg.DefaultTimeout == 0 {
		cfg.DefaultTimeout = time.Minute
	}
	if cfg.Env == nil {
		cfg.Env = workspace.BaseEnv()
	}
	// A listed secret too short to mask is a configuration error, found now
	// rather than as every verdict failing.
	if _, err := workspace.NewSecrets(cfg.Env, cfg.SecretEnv); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	pool, err := workspace.NewPool(cfg.WorkDir, cfg.ReuseWorkspaces)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	return &Service{cfg: cfg, bus: b, log: log, now: now, caches: gitrepo.NewCaches(cfg.RepoCache), workspaces: pool}, nil
}

// ConsumerName is the durable consumer validator replicas share.
const ConsumerName = "validator"

// Run validates completed jobs until ctx ends. A job.completed is
// acknowledged after its verdict is published.
func (s *Service) Run(ctx context.Context) error {
	defer func() {
		if err := s.workspaces.Close(); err != nil {
			s.log.Warn().Err(err).Msg("removing idle workspaces")
		}
	}()
	s.log.Info().Msg("validator ready")
	return s.bus.Consume(ctx, bus.ConsumerConfig{
		Durable:     ConsumerName,
		Subjects:    []string{schemas.SubjectPrefix + ".*.job.completed"},
		Concurrency: s.cfg.Concurrency,
		AckWait:     s.cfg.AckWait,
	}, s.handle)
}

func (s *Service) handle(ctx context.Context, d bus.Delivery) error {
	ev := d.Event
	jc, ok := ev.Data.(*schemas.JobCompleted)
	if !ok {
		return fmt.Errorf("%w: %s is not a job completion", bus.ErrPermanent, ev.Type)
	}
	reqEv, err := s.bus.GetEvent(ctx, jc.RequestSeq)
	if err != nil {
		if errors.Is(err, bus.ErrMalformed) {
			return fmt.Errorf("%w: request of job %s: %v", bus.ErrPermanent, jc.JobID, err)
		}
		return err
	}
	jr, ok := reqEv.Data.(*schemas.JobRequested)
	if !ok || jr.JobID != jc.JobID || reqEv.Session != ev.Session {
		return fmt.Errorf("%w: event %d is not the request of job %s", bus.ErrPermanent, jc.RequestSeq, jc.JobID)
	}
	if jr.Worktree != nil && jr.Worktree.Merge {
		return nil // a merge's result is the orchestrator's to judge
	}
	errs, reports, err := s.safeCheck(ctx, ev.Session, jr, jc)
	if err != nil {
		return err
	}
	v := &schemas.Verdict{JobID: jc.JobID, Step: jc.Step, Iteration: jc.Iteration, Artifacts: jc.Artifacts, Errors: errs}
	typ := schemas.TypeValidationPassed
	if len(errs) > 0 {
		typ = schemas.TypeValidationFailed
		v.RetryHint = retryHint(errs)
	} else {
		v.Reports = reports
	}
	_, err = s.bus.Publish(ctx, schemas.Event{
		ID:          s.bus.OwnID(verdictID(ev)),
		Type:        typ,
		Session:     ev.Session,
		Step:        ev.Step,
		Job:         jc.JobID,
		Causation:   ev.ID,
		Correlation: ev.Correlation,
		Time:        s.now(),
		Data:        v,
	})
	if err == nil {
		s.log.Info().Str("session", ev.Session).Str("job", jc.JobID).Str("verdict", typ).Int("errors", len(errs)).Msg("validated")
	}
	return err
}

// safeCheck is check, except that a panic (a bug meeting strange outputs)
// becomes a validation error naming it: the job gets a verdict, and the
// validator goes on with the others.
func (s *Service) safeCheck(ctx context.Context, session string, jr *schemas.JobRequested, jc *schemas.JobCompleted) (errs []schemas.ValidationError, reports []schemas.Report, err error) {
	defer func() {
		if p := recover(); p != nil {
			s.log.Error().Str("session", session).Str("job", jc.JobID).Str("stack", string(debug.Stack())).Msgf("checking the job's outputs panicked: %v", p)
			errs, reports, err = []schemas.ValidationError{{Message: fmt.Sprintf("the validator crashed while checking the outputs: %v", p), Source: "command"}}, nil, nil
		}
	}()
	return s.check(ctx, session, jr, jc)
}

// check returns the validation errors of a job's outputs and the reports of
// its outputs declared with Report (to carry only when there are no
// errors). The error return is for failures to check (fetching, disk),
// which are retried. The outputs are checked in memory; a workspace is
// made only for a step with a validate command, which reads them there.
func (s *Service) check(ctx context.Context, session string, jr *schemas.JobRequested, jc *schemas.JobCompleted) ([]schemas.ValidationError, []schemas.Report, error) {
	byName := map[string]schemas.ArtifactRef{}
	for _, a := range jc.Artifacts {
		byName[a.Name] = a
	}
	var errs []schemas.ValidationError
	for _, out := range jr.Outputs {
		if _, ok := byName[out.Name]; !ok {
			errs = append(errs, schemas.ValidationError{Artifact: out.Name, Message: "declared output was not produced", Source: "schema"})
		}
	}
	var ws *workspace.Workspace
	if len(jr.Validate) > 0 {
		var err error
		if ws, err = s.workspaces.Create(session, fmt.Sprintf("%s-%d", jr.Step, jr.Iteration)); err != nil {
			return nil, nil, err
		}
		if !s.cfg.KeepWorkspaces {
			defer ws.Remove()
		}
	}
	fetched, err := s.fetchOutputs(ctx, jr.Outputs, byName, ws)
	if err != nil {
		if errors.Is(err, bus.ErrNotFound) || errors.Is(err, bus.ErrDigestMismatch) {
			return []schemas.ValidationError{{Message: "cannot read outputs: " + err.Error()}}, nil, nil
		}
		return nil, nil, err
	}
	var reports []schemas.Report
	reportBytes := 0
	for i, out := range jr.Outputs {
		o := fetched[i]
		if o == nil {
			continue // not produced
		}
		if len(out.Schema) > 0 {
			sch, err := schemas.CompileArtifactSchema(out.Name, out.Schema)
			if err != nil {
				errs = append(errs, schemas.ValidationError{Artifact: out.Name, Message: "the step's schema does not compile: " + err.Error(), Source: "schema"})
				continue
			}
			if verrs := sch.Validate(out.Name, o.content()); len(verrs) > 0 {
				errs = append(errs, verrs...)
				continue
			}
		}
		if !out.Report {
			continue
		}
		r, problem := makeReport(out.Name, o, out.ReportText)
		if problem == "" {
			reportBytes += len(r.Content)
			if reportBytes > MaxReportsBytes {
				problem = fmt.Sprintf("reports come to %d bytes with this one, over the %d bytes one verdict may carry", reportBytes, MaxReportsBytes)
			}
		}
		if problem != "" {
			errs = append(errs, schemas.ValidationError{Artifact: out.Name, Message: problem, Source: "schema"})
			continue
		}
		reports = append(reports, r)
	}
	// The command runs on schema-valid outputs only: its errors would
	// otherwise bury the schema's more precise ones.
	if len(errs) > 0 || ws == nil { // ws == nil: no validate command
		return errs, reports, nil
	}
	err = ws.Fetch(ctx, s.bus, jr.Inputs, ws.In)
	runnable := func(argv []string) []string { return argv }
	if err == nil {
		runnable, err = ws.FetchDefinition(ctx, s.bus, jr.Dir, jr.DefinitionFiles)
	}
	if err != nil {
		if errors.Is(err, bus.ErrNotFound) || errors.Is(err, bus.ErrDigestMismatch) || errors.Is(err, schemas.ErrBadName) {
			return []schemas.ValidationError{{Message: "cannot read inputs for the validate command: " + err.Error(), Source: "command"}}, nil, nil
		}
		return nil, nil, err
	}
	if err := ws.WriteFiles(jr.Files); err != nil {
		return []schemas.ValidationError{{Message: "cannot write inputs for the validate command: " + err.Error(), Source: "command"}}, nil, nil
	}
	if err := ws.WriteText(jr.Prompt, schemas.FormatFeedback(jr.Feedback)); err != nil {
		return nil, nil, err
	}
	dir := ws.Root
	var extra []string
	if jr.Worktree != nil {
		if jc.Git == nil {
			return []schemas.ValidationError{{Message: "the job ran in a worktree but reported no commit", Source: "command"}}, nil, nil
		}
		wdir, cache, problem, err := s.checkout(ctx, session, ws, jr, jc)
		if err != nil || problem != "" {
			if problem != "" {
				return []schemas.ValidationError{{Message: problem, Source: "command"}}, nil, nil
			}
			return nil, nil, err
		}
		defer func() { _ = cache.RemoveWorktree(context.WithoutCancel(ctx), wdir) }()
		dir = wdir
		extra = []string{"LOOPBUS_WORKSPACE=" + wdir}
	}
	timeout := time.Duration(jr.ValidateTimeoutMs) * time.Millisecond
	if timeout == 0 {
		timeout = s.cfg.DefaultTimeout
	}
	env := append(ws.Env(s.cfg.Env, workspace.Vars{Session: session, Step: jr.Step, Job: jr.JobID, Iteration: jr.Iteration}, jr.Agent.Env), extra...)
	// The command's output becomes feedback in events: secrets in the
	// environment must not reach it.
	sec, err := workspace.NewSecrets(env, append(slices.Clone(s.cfg.SecretEnv), jr.Agent.SecretEnv...))
	if err != nil {
		return []schemas.ValidationError{{Message: "validate command not run: " + err.Error(), Source: "command"}}, nil, nil
	}
	res, err := procrun.Run(ctx, procrun.Spec{
		Argv:      runnable(jr.Validate),
		Dir:       dir,
		Env:       env,
		Timeout:   timeout,
		TailBytes: procrun.DefaultTailBytes + sec.MaxLen(),
	})
	if ctx.Err() != nil {
		return nil, nil, ctx.Err()
	}
	res.Tail = sec.MaskTail(res.Tail, procrun.DefaultTailBytes)
	cmd := sec.Mask(strings.Join(jr.Validate, " "))
	switch {
	case err != nil:
		errs = append(errs, schemas.ValidationError{Message: fmt.Sprintf("validate command %q could not start: %v", cmd, sec.Mask(err.Error())), Source: "command"})
	case res.TimedOut:
		errs = append(errs, schemas.ValidationError{Message: fmt.Sprintf("validate command %q timed out after %s", cmd, timeout), Source: "command"})
	case res.ExitCode != 0:
		msg := fmt.Sprintf("validate command %q exited with code %d", cmd, res.ExitCode)
		if t := strings.TrimSpace(res.Tail); t != "" {
			msg += ": " + t
		}
		errs = append(errs, schemas.ValidationError{Message: msg, Source: "command"})
	}
	return errs, reports, nil
}

// MaxReportsBytes bounds the reports of one verdict together, as encoded:
// the verdict must fit in one event (bus.MaxEventBytes) with its artifact
// list.
const MaxReportsBytes = bus.MaxEventBytes / 2

// fetchOutputs fetches the produced outputs (those of outs that byName
// lists) in the order declared and returns what the checks read of each,
// indexed like outs; nil stands for an output not produced. Each digest is
// checked. With a workspace, each output is also written to its out/
// directory for the validate command. Every name is validated before
// anything is fetched. An output that cannot be had as listed gives an
// error wrapping bus.ErrNotFound or bus.ErrDigestMismatch.
func (s *Service) fetchOutputs(ctx context.Context, outs []schemas.Output, byName map[string]schemas.ArtifactRef, ws *workspace.Workspace) ([]*output, error) {
	for _, out := range outs {
		if ref, ok := byName[out.Name]; ok {
			if err := schemas.ValidateName(ref.Name); err != nil {
				return nil, err
			}
		}
	}
	fetched := make([]*output, len(outs))
	for i, out := range outs {
		ref, ok := byName[out.Name]
		if !ok {
			continue
		}
		o := newOutput(out, ref)
		if err := s.fetchOutput(ctx, ref, o, ws); err != nil {
			return nil, err
		}
		fetched[i] = o
	}
	return fetched, nil
}

// fetchOutput fetches one output into o and, with a workspace, also into
// the file of its name in out/ (mode 0600).
func (s *Service) fetchOutput(ctx context.Context, ref schemas.ArtifactRef, o *output, ws *workspace.Workspace) error {
	if ws == nil {
		return s.bus.GetArtifact(ctx, ref, o)
	}
	f, err := os.OpenFile(filepath.Join(ws.Out, ref.Name), os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("validator: output %s: %w", ref.Name, err)
	}
	err = s.bus.GetArtifact(ctx, ref, io.MultiWriter(f, o))
	if cerr := f.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("validator: output %s: %w", ref.Name, cerr)
	}
	return err
}

// output is what the checks read of one fetched output: its size and, if
// that is at most keep bytes, its content. It is the io.Writer an output
// is fetched into; its writes never fail.
type output struct {
	keep int64  // bytes of content kept at most
	want int64  // size listed for the output, which the store has checked before the first write
	size int64  // bytes written
	data []byte // content written, while size <= keep
}

// newOutput returns the destination of a fetch of out, listed as ref. It
// keeps what the checks read and no more: all of an output with a schema
// (which is validated whole; its size is bounded by the worker that stored
// it), schemas.MaxReportBytes of a report (a longer one is refused on its
// size alone), nothing of any other output.
func newOutput(out schemas.Output, ref schemas.ArtifactRef) *output {
	o := &output{want: ref.Size}
	switch {
	case len(out.Schema) > 0:
		o.keep = ref.Size
	case out.Report:
		o.keep = schemas.MaxReportBytes
	}
	return o
}

// Write counts p and appends it to the content while the size stays
// within keep; past it, the content is dropped.
func (o *output) Write(p []byte) (int, error) {
	o.size += int64(len(p))
	switch {
	case o.size > o.keep:
		o.data = nil
	case o.data == nil:
		// The store has checked the listed size by now (see
		// GetArtifact): one allocation holds all that is kept.
		o.data = append(make([]byte, 0, max(min(o.want, o.keep), int64(len(p)))), p...)
	default:
		o.data = append(o.data, p...)
	}
	return len(p), nil
}

// content returns the output's content: all of it if its size is at most
// keep (never nil then, even when empty), else nil.
func (o *output) content() []byte {
	if o.size > o.keep {
		return nil
	}
	if o.data == nil {
		return []byte{}
	}
	return o.data
}

// makeReport makes the output o named name a report: at most
// schemas.MaxReportBytes of UTF-8 JSON, or of any UTF-8 text when text is
// set (carried as a JSON string). The report's content is the JSON as the
// bus encodes it (compacted, with <, > and & escaped), so the verdict
// carries the bytes its readers decode. problem says why the output cannot
// be a report. o must hold its content if that is at most
// schemas.MaxReportBytes (see newOutput).
func makeReport(name string, o *output, text bool) (r schemas.Report, problem string) {
	if o.size > schemas.MaxReportBytes {
		return r, fmt.Sprintf("report output is %d bytes, over the %d-byte limit of a report", o.size, schemas.MaxReportBytes)
	}
	doc := o.content()
	if !utf8.Valid(doc) {
		return r, "report output is not UTF-8 text"
	}
	if text {
		// Text (a loop's plan to split): carried as one JSON string.
		content, err := json.Marshal(string(doc))
		if err != nil {
			return r, "report output: " + err.Error()
		}
		return schemas.Report{Name: name, Content: content}, ""
	}
	var raw json.RawMessage
	if err := json.Unmarshal(doc, &raw); err != nil {
		return r, "report output is not valid JSON: " + err.Error()
	}
	content, err := json.Marshal(raw)
	if err != nil { // raw is valid JSON: cannot happen
		return r, "report output is not valid JSON: " + err.Error()
	}
	return schemas.Report{Name: name, Content: content}, ""
}

func retryHint(errs []schemas.ValidationError) string {
	var b bytes.Buffer
	arts := map[string]bool{}
	var names []string
	cmd := false
	for _, e := range errs {
		if e.Source == "command" {
			cmd = true
		}
		if e.Artifact != "" && !arts[e.Artifact] {
			arts[e.Artifact] = true
			names = append(names, e.Artifact)
		}
	}
	if len(names) > 0 {
		fmt.Fprintf(&b, "Fix the listed problems in %s and write the file(s) again in full.", strings.Join(names, ", "))
	}
	if cmd {
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		b.WriteString("The step's validation command rejected the outputs; its output above says why.")
	}
	if b.Len() == 0 {
		b.WriteString("Produce every declared output again.")
	}
	return b.String()
}

// checkout checks the commit a worktree job left out in a worktree of the
// session's repository cache, fetching its bundles. problem says why it
// cannot be had (a verdict error); the error return is for the
// validator's own failures (retried).
func (s *Service) checkout(ctx context.Context, session string, ws *workspace.Workspace, jr *schemas.JobRequested, jc *schemas.JobCompleted) (dir string, c *gitrepo.Cache, problem string, err error) {
	if c, err = s.caches.Session(session); err != nil {
		return "", nil, "", err
	}
	bundles := slices.Clone(jr.Worktree.Bundles)
	if jc.Git.Bundle != nil {
		bundles = append(bundles, *jc.Git.Bundle)
	}
	if err := c.FetchArtifacts(ctx, s.bus, bundles, filepath.Join(ws.Root, "bundles")); err != nil {
		if errors.Is(err, bus.ErrNotFound) || errors.Is(err, bus.ErrDigestMismatch) || errors.Is(err, gitrepo.ErrBadBundle) {
			return "", nil, "cannot get the job's commits: " + err.Error(), nil
		}
		return "", nil, "", err
	}
	dir = filepath.Join(ws.Root, "repo")
	spec := schemas.WorktreeSpec{Base: jc.Git.Commit, Branch: "loopbus-validate/" + jr.JobID}
	if _, err := c.Prepare(ctx, dir, spec); err != nil {
		_ = c.RemoveWorktree(context.WithoutCancel(ctx), dir)
		return "", nil, "", err
	}
	return dir, c, "", nil
}
