package client

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/loopbus/loopbus/backlog"
	"github.com/loopbus/loopbus/schemas"
)

// BacklogSubmission is what SubmitBacklog started: the session.started
// event and how the session begins.
type BacklogSubmission struct {
	Event schemas.Event
	// Phase is the first phase: iterate (tasks imported), repair (the
	// imported file is invalid: Problems) or bootstrap (no tasks).
	Phase    string
	Tasks    int
	Problems []schemas.ValidationError
}

// SubmitBacklog starts a session of a backlog pipeline. It stores the task
// file (tasksPath; an empty task file when "") as the session input and the
// backlog's source files as artifacts, then publishes session.started. A
// task file that fails its checks is not refused: the session starts with a
// repair run, and Problems says why. A backlog with workdir: repo needs
// repo, the git repository its runs work in (see SubmitLoops). Errors wrap
// ErrBadInput (unreadable or unsafe files, name clashes, a missing or
// dirty repository) or ErrSessionExists.
func SubmitBacklog(ctx context.Context, b Bus, p schemas.Pipeline, tasksPath, repo, session string, now time.Time, budget *schemas.Budget) (BacklogSubmission, error) {
	var sub BacklogSubmission
	if p.Kind != schemas.KindBacklog || p.Backlog == nil {
		return sub, fmt.Errorf("%w: %s is not a backlog (kind: backlog)", ErrBadInput, p.Source)
	}
	if budget != nil {
		if err := CheckBudget(*budget); err != nil {
			return sub, err
		}
	}
	if err := schemas.ValidateSessionID(session); err != nil {
		return sub, fmt.Errorf("%w: %v", ErrBadInput, err)
	}
	inRepo := p.Backlog.Workdir == schemas.WorkdirRepo
	switch {
	case inRepo && repo == "":
		return sub, fmt.Errorf("%w: %s works in git worktrees (workdir: repo): name the repository with --repo DIR", ErrBadInput, p.Source)
	case !inRepo && repo != "":
		return sub, fmt.Errorf("%w: --repo is for backlogs with workdir: repo; %s runs each task in a fresh workspace", ErrBadInput, p.Source)
	}
	info, err := inspectRepo(ctx, repo, p.Backlog.Base)
	if err != nil {
		return sub, err
	}
	name, data := backlog.FileName, []byte(nil)
	if tasksPath != "" {
		name = filepath.Base(tasksPath)
		if err := schemas.ValidateName(name); err != nil {
			return sub, fmt.Errorf("%w: task file name: %v (rename the file)", ErrBadInput, err)
		}
		var err error
		if data, err = ReadRegular(tasksPath); err != nil {
			return sub, err
		}
	} else {
		data = backlog.Format(&backlog.File{SchemaVersion: backlog.FileSchemaVersion, Project: backlog.Project{Name: orElse(p.Backlog.Project, p.Name)}, SourceFiles: p.Backlog.SourceFiles})
	}
	start := &schemas.BacklogStart{}
	switch f, problems := backlog.ParseFile(name, data); {
	case len(problems) > 0:
		sub.Phase, sub.Problems, start.ImportErrors = schemas.PhaseRepair, problems, problems
	case len(f.Tasks) > 0:
		sub.Phase, sub.Tasks, start.Tasks = schemas.PhaseIterate, len(f.Tasks), f.Tasks
	default:
		sub.Phase = schemas.PhaseBootstrap
	}
	// Read every source before storing anything, so a bad one stores
	// nothing.
	type source struct {
		name string
		data []byte
	}
	var sources []source
	seen := map[string]string{name: "the task file"}
	for _, src := range p.Backlog.SourceFiles {
		path := src
		if !filepath.IsAbs(path) {
			path = filepath.Join(p.Dir, path)
		}
		base := filepath.Base(path)
		if err := schemas.ValidateName(base); err != nil {
			return sub, fmt.Errorf("%w: source file %s: %v", ErrBadInput, src, err)
		}
		if other, dup := seen[base]; dup {
			return sub, fmt.Errorf("%w: source file %s has the name of %s; agents see both in in/ (rename one)", ErrBadInput, src, other)
		}
		seen[base] = "source file " + src
		data, err := ReadRegular(path)
		if err != nil {
			return sub, err
		}
		sources = append(sources, source{base, data})
	}
	if last, err := b.SessionLastSeq(ctx, session); err != nil {
		return sub, err
	} else if last != 0 {
		return sub, fmt.Errorf("%w: %s (use 'loopbus wait %s' or 'loopbus tasks %s')", ErrSessionExists, session, session, session)
	}
	var repoInfo *schemas.LoopsStart
	if inRepo {
		if repoInfo, err = repoStart(ctx, b, info, session); err != nil {
			return sub, err
		}
	}
	for _, s := range sources {
		ref, err := b.PutArtifact(ctx, session+"/sources/"+s.name, s.name, bytes.NewReader(s.data))
		if err != nil {
			return sub, err
		}
		start.Sources = append(start.Sources, ref)
	}
	ref, err := b.PutArtifact(ctx, session+"/input/"+name, name, bytes.NewReader(data))
	if err != nil {
		return sub, err
	}
	if tasksPath != "" {
		start.TaskFile = &ref
	}
	ev, err := publishStart(ctx, b, session, now, &schemas.SessionStarted{Pipeline: p, Input: ref, SourceHash: schemas.ShortHash(ref.Digest), Budget: budget, Backlog: start, Loops: repoInfo})
	sub.Event = ev
	return sub, err
}

// ReadRegular reads a regular file named by a user, refusing anything
// else (a directory, a device, a pipe); errors wrap ErrBadInput.
func ReadRegular(path string) ([]byte, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadInput, err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%w: %s is not a regular file", ErrBadInput, path)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadInput, err)
	}
	return data, nil
}

func orElse(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// RunInput checks the files a run of p names: a pipeline's input file
// (required, and it must exist), or a backlog's task file (tasks; "" lets
// the bootstrap agent propose tasks). It returns the file to submit.
// Errors wrap ErrBadInput and name the run flags (--input, --tasks).
func RunInput(p schemas.Pipeline, input, tasks string) (string, error) {
	if p.Kind == schemas.KindLoops {
		if input != "" || tasks != "" {
			return "", fmt.Errorf("%w: run: %s is a loops file: give its task with --task TEXT or --task-file FILE (and the repository with --repo DIR), not --input or --tasks", ErrBadInput, p.Source)
		}
		return "", nil
	}
	if p.Kind == schemas.KindBacklog {
		if input != "" {
			return "", fmt.Errorf("%w: run: %s is a backlog: give its task file with --tasks FILE (or nothing, to bootstrap one), not --input", ErrBadInput, p.Source)
		}
		return tasks, nil
	}
	switch {
	case tasks != "":
		return "", fmt.Errorf("%w: run: --tasks is for backlogs (kind: backlog); %s is a pipeline", ErrBadInput, p.Source)
	case input == "":
		return "", fmt.Errorf("%w: run: --input FILE is required", ErrBadInput)
	}
	if _, err := os.Stat(input); err != nil {
		return "", fmt.Errorf("%w: run: input: %w", ErrBadInput, err)
	}
	return input, nil
}
