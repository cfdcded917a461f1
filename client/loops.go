package client

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/loopbus/loopbus/gitrepo"
	"github.com/loopbus/loopbus/schemas"
)

// MaxTaskBytes bounds a loops session's task text: it travels in
// session.started and in every prompt.
const MaxTaskBytes = 32 << 10

// LoopsTask returns the task of a loops run: text, or the content of the
// file at path (exactly one of them). Errors wrap ErrBadInput.
func LoopsTask(text, path string) (string, error) {
	switch {
	case text != "" && path != "":
		return "", fmt.Errorf("%w: give the task as --task or --task-file, not both", ErrBadInput)
	case path != "":
		b, err := ReadRegular(path)
		if err != nil {
			return "", fmt.Errorf("%w: --task-file: %v", ErrBadInput, err)
		}
		text = string(b)
	}
	switch {
	case strings.TrimSpace(text) == "":
		return "", fmt.Errorf("%w: a loops file needs a task: --task TEXT or --task-file FILE", ErrBadInput)
	case len(text) > MaxTaskBytes:
		return "", fmt.Errorf("%w: the task is %d bytes, over the %d-byte limit; put the details in the repository and point to them", ErrBadInput, len(text), MaxTaskBytes)
	case !utf8.ValidString(text) || strings.ContainsRune(text, 0):
		return "", fmt.Errorf("%w: the task is not UTF-8 text", ErrBadInput)
	}
	return text, nil
}

// RunTask checks the loops flags of a run (--task, --task-file, --repo)
// against p: for a loops file it returns the task (see LoopsTask); for
// other files the flags must be unset. Errors wrap ErrBadInput.
func RunTask(p schemas.Pipeline, task, taskFile, repo string) (string, error) {
	if p.Kind == schemas.KindLoops {
		return LoopsTask(task, taskFile)
	}
	if task != "" || taskFile != "" || repo != "" && p.Kind != schemas.KindBacklog {
		return "", fmt.Errorf("%w: run: --task and --task-file are for loops files (kind: loops), --repo for loops files and backlogs with workdir: repo; %s is neither", ErrBadInput, p.Source)
	}
	return "", nil
}

// SubmitLoops starts a loops session of p: task is the work; repo is the
// git repository the worktree levels change (required when a level has
// worktree: true). The repository must be clean: its base branch's
// committed history is sent as a git bundle, and its checked-out branch,
// index and working tree are never touched. Errors wrap ErrBadInput or
// ErrSessionExists where those apply.
func SubmitLoops(ctx context.Context, b Bus, p schemas.Pipeline, task, repo, session string, now time.Time, budget *schemas.Budget) (schemas.Event, error) {
	if p.Kind != schemas.KindLoops || p.Loops == nil || len(p.Loops.Levels) == 0 {
		return schemas.Event{}, fmt.Errorf("%w: %s is not a loops file", ErrBadInput, p.Name)
	}
	if budget != nil {
		if err := CheckBudget(*budget); err != nil {
			return schemas.Event{}, err
		}
	}
	if err := schemas.ValidateSessionID(session); err != nil {
		return schemas.Event{}, fmt.Errorf("%w: %v", ErrBadInput, err)
	}
	if _, err := LoopsTask(task, ""); err != nil {
		return schemas.Event{}, err
	}
	if p.Loops.NeedsRepo() && repo == "" {
		return schemas.Event{}, fmt.Errorf("%w: %s works in git worktrees: name the repository with --repo DIR", ErrBadInput, p.Name)
	}
	info, err := inspectRepo(ctx, repo, p.Loops.Base)
	if err != nil {
		return schemas.Event{}, err
	}
	if last, err := b.SessionLastSeq(ctx, session); err != nil {
		return schemas.Event{}, err
	} else if last != 0 {
		return schemas.Event{}, fmt.Errorf("%w: %s (use 'loopbus wait %s' or 'loopbus status %s')", ErrSessionExists, session, session, session)
	}
	start, err := repoStart(ctx, b, info, session)
	if err != nil {
		return schemas.Event{}, err
	}
	start.Task = task
	in, err := b.PutArtifact(ctx, session+"/input/task.md", "task.md", strings.NewReader(task))
	if err != nil {
		return schemas.Event{}, err
	}
	return publishStart(ctx, b, session, now, &schemas.SessionStarted{Pipeline: p, Input: in, SourceHash: schemas.ShortHash(in.Digest), Budget: budget, Loops: start})
}

// inspectRepo checks the repository a session works on ("" for none): a
// git work tree without uncommitted changes, whose base branch (""
// for the checked-out one) exists. Errors wrap ErrBadInput.
func inspectRepo(ctx context.Context, repo, base string) (*gitrepo.RepoInfo, error) {
	if repo == "" {
		return nil, nil
	}
	info, err := gitrepo.Inspect(ctx, repo, base)
	if err != nil {
		return nil, fmt.Errorf("%w: --repo %s: %v", ErrBadInput, repo, err)
	}
	if info.Dirty {
		return nil, fmt.Errorf("%w: --repo %s has uncommitted changes; commit or stash them first (the session starts from the committed %s)", ErrBadInput, repo, info.Base)
	}
	return &info, nil
}

// repoStart stores the base branch of the repository info describes (none
// when nil) as a bundle and returns what session.started says of it.
func repoStart(ctx context.Context, b Bus, info *gitrepo.RepoInfo, session string) (*schemas.LoopsStart, error) {
	start := &schemas.LoopsStart{Target: "loopbus/" + session}
	if info == nil {
		return start, nil
	}
	start.Repo, start.Base, start.BaseCommit, start.Identity = filepath.Base(info.Dir), info.Base, info.BaseCommit, info.Identity
	ref, err := storeBaseBundle(ctx, b, *info, session)
	if err != nil {
		return nil, err
	}
	start.Bundle = &ref
	return start, nil
}

// storeBaseBundle stores the base branch's history as a bundle.
func storeBaseBundle(ctx context.Context, b Bus, info gitrepo.RepoInfo, session string) (schemas.ArtifactRef, error) {
	dir, err := os.MkdirTemp("", "loopbus-bundle-")
	if err != nil {
		return schemas.ArtifactRef{}, err
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "base.bundle")
	if err := gitrepo.BundleBase(ctx, info.Dir, info.BaseCommit, path); err != nil {
		return schemas.ArtifactRef{}, fmt.Errorf("bundling %s: %w", info.Base, err)
	}
	f, err := os.Open(path)
	if err != nil {
		return schemas.ArtifactRef{}, err
	}
	defer f.Close()
	return b.PutArtifact(ctx, session+"/repo/base.bundle", "base.bundle", f)
}

// PullResult says what Pull did.
type PullResult struct {
	// Repo is the repository's directory.
	Repo string
	// Branch is the target branch and Head the commit it points at.
	Branch, Head string
	// Merged counts the loops merged into it.
	Merged int
	// Changed is false when the repository already had the branch there.
	Changed bool
}

// String says it for people.
func (r PullResult) String() string {
	short := r.Head
	if len(short) > 12 {
		short = short[:12]
	}
	verb := "was already at"
	if r.Changed {
		verb = "now points at"
	}
	return fmt.Sprintf("%s: branch %s %s %s (%d merged); your branch and working tree are untouched", r.Repo, r.Branch, verb, short, r.Merged)
}

// ErrNoTarget: the session has no target branch (not a loops session, or
// one without a repository).
var ErrNoTarget = errors.New("no target branch")

// Pull brings a loops session's target branch (loopbus/<session>) into the
// git repository at repo: the bundles are fetched from the artifact stream
// and the branch is created or moved forward, never forced; the
// repository's checked-out branch, index and working tree are not touched.
// It may run while the session runs: the branch then holds what is merged
// so far. A fork's branch (loopbus/<fork>) holds its origin's merges up
// to the fork point, then its own.
func Pull(ctx context.Context, b Bus, session, repo string) (PullResult, error) {
	if err := Exists(ctx, b, session); err != nil {
		return PullResult{}, err
	}
	evs, err := Events(ctx, b, session, Until{})
	if err != nil {
		return PullResult{}, err
	}
	res := PullResult{Repo: repo}
	var bundles []schemas.ArtifactRef
	for _, ev := range evs {
		switch d := ev.Data.(type) {
		case *schemas.SessionStarted:
			if d.Loops == nil || d.Loops.Bundle == nil {
				return PullResult{}, fmt.Errorf("%w: session %s has no repository", ErrNoTarget, session)
			}
			res.Branch, res.Head = d.Loops.Target, d.Loops.BaseCommit
			bundles = append(bundles, *d.Loops.Bundle)
		case *schemas.SessionForked:
			// A fork's target is its own, from the head its origin's
			// merges (copied before) had made at the fork point.
			if ev.ForkOf == "" && res.Branch != "" {
				res.Branch = "loopbus/" + session
			}
		case *schemas.LoopMerged:
			if d.Previous == res.Head {
				res.Head = d.Head
				res.Merged++
				bundles = append(bundles, d.Bundle)
			}
		}
	}
	if res.Branch == "" {
		return PullResult{}, fmt.Errorf("%w: session %s has no repository", ErrNoTarget, session)
	}
	dir, err := os.MkdirTemp("", "loopbus-pull-")
	if err != nil {
		return PullResult{}, err
	}
	defer os.RemoveAll(dir)
	paths := make([]string, 0, len(bundles))
	for i, ref := range bundles {
		p := filepath.Join(dir, strconv.Itoa(i)+".bundle")
		if err := b.GetArtifactFile(ctx, ref, p); err != nil {
			return PullResult{}, fmt.Errorf("bundle %s: %w", ref.Object, err)
		}
		paths = append(paths, p)
	}
	if res.Changed, err = gitrepo.Pull(ctx, repo, paths, res.Head, res.Branch); err != nil {
		return PullResult{}, fmt.Errorf("--repo %s: %w", repo, err)
	}
	return res, nil
}
