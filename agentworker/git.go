package agentworker

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/gitrepo"
	"github.com/loopbus/loopbus/schemas"
	"github.com/loopbus/loopbus/workspace"
)

// Code travels as data: a worktree job names the git bundles that hold its
// starting commit, the worker brings them into its own repository cache
// (Config.RepoCache, one bare repository per session) and makes the
// worktree there; the commit it leaves goes back as a bundle in the object
// store. No worker needs the user's repository or a disk shared with it.

// storeBundle stores the commits from base to tip as a bundle artifact.
func (s *Service) storeBundle(ctx context.Context, c *gitrepo.Cache, ws *workspace.Workspace, jr *schemas.JobRequested, req schemas.Event, delivery uint64, tip, base string) (*schemas.ArtifactRef, error) {
	path := filepath.Join(ws.Root, "result.bundle")
	if err := c.Bundle(ctx, path, tip, base); err != nil {
		return nil, err
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	object := fmt.Sprintf("%s/r%d-d%d/git.bundle", jr.JobID, req.Seq, delivery)
	ref, err := s.bus.PutArtifact(ctx, object, "git.bundle", f)
	if err != nil {
		return nil, err
	}
	ref.Step = jr.Step
	return &ref, nil
}

// identity is the author of the commits a job makes.
func identity(spec *schemas.WorktreeSpec) schemas.GitIdentity {
	if spec.Identity != nil && spec.Identity.Name != "" && spec.Identity.Email != "" {
		return *spec.Identity
	}
	return gitrepo.DefaultIdentity()
}

// checkWorktree refuses a worktree spec whose values git would read as
// options or that names no commit.
func checkWorktree(spec *schemas.WorktreeSpec) error {
	for _, c := range []string{spec.Base, spec.From, spec.FromBase} {
		if c != "" && !isCommit(c) {
			return fmt.Errorf("worktree: %q is not a commit id", c)
		}
	}
	if spec.Base == "" {
		return errors.New("worktree: no base commit")
	}
	if spec.Branch == "" || strings.HasPrefix(spec.Branch, "-") || strings.ContainsAny(spec.Branch, " \t\n~^:?*[\\") || strings.Contains(spec.Branch, "..") {
		return fmt.Errorf("worktree: unsafe branch name %q", spec.Branch)
	}
	for _, b := range spec.Bundles {
		if err := schemas.ValidateName(b.Name); err != nil {
			return fmt.Errorf("worktree bundle: %w", err)
		}
	}
	return nil
}

func isCommit(c string) bool {
	if len(c) != 40 && len(c) != 64 {
		return false
	}
	for _, r := range c {
		if (r < '0' || r > '9') && (r < 'a' || r > 'f') {
			return false
		}
	}
	return true
}

// merge runs a merge job: the loop's commits on top of the target's head.
// It returns the job's result data (completed or failed), or an error for
// the worker's own failures (retried).
func (s *Service) merge(ctx context.Context, req schemas.Event, jr *schemas.JobRequested, ws *workspace.Workspace, delivery uint64) (any, error) {
	spec := jr.Worktree
	start := time.Now()
	c, err := s.caches.Session(req.Session)
	if err != nil {
		return nil, err
	}
	if err := c.FetchArtifacts(ctx, s.bus, spec.Bundles, filepath.Join(ws.Root, "bundles")); err != nil {
		if errors.Is(err, bus.ErrNotFound) || errors.Is(err, bus.ErrDigestMismatch) || errors.Is(err, gitrepo.ErrBadBundle) {
			return &schemas.JobFailed{ExitCode: -1, Error: "cannot get the commits to merge: " + err.Error(), Retryable: true}, nil
		}
		return nil, err
	}
	// The request's time dates the rebased commits: a merge run again
	// makes the same commits.
	head, conflict, err := c.Merge(ctx, filepath.Join(ws.Root, "merge"), spec.Base, spec.From, spec.FromBase, identity(spec), req.Time)
	dur := time.Since(start)
	switch {
	case errors.Is(err, gitrepo.ErrConflict):
		return &schemas.JobFailed{ExitCode: 1, DurationMs: dur.Milliseconds(), Error: err.Error(), Conflict: conflict}, nil
	case err != nil:
		return nil, err
	}
	g := &schemas.GitResult{Commit: head, Base: spec.Base, Changed: head != spec.Base}
	if g.Changed {
		if g.Bundle, err = s.storeBundle(ctx, c, ws, jr, req, delivery, head, spec.Base); err != nil {
			return nil, err
		}
	}
	return &schemas.JobCompleted{JobID: jr.JobID, Step: jr.Step, Iteration: jr.Iteration, RequestSeq: req.Seq, Worker: s.cfg.ID,
		DurationMs: dur.Milliseconds(), Artifacts: []schemas.ArtifactRef{}, Git: g}, nil
}

// worktree is a job's git worktree while its agent runs.
type worktree struct {
	cache *gitrepo.Cache
	dir   string
	spec  *schemas.WorktreeSpec
}

// prepareWorktree makes the job's worktree at ws.Root/repo. The note says
// what the agent should know (work carried over was dropped).
func (s *Service) prepareWorktree(ctx context.Context, req schemas.Event, jr *schemas.JobRequested, ws *workspace.Workspace) (*worktree, string, error) {
	c, err := s.caches.Session(req.Session)
	if err != nil {
		return nil, "", err
	}
	if err := c.FetchArtifacts(ctx, s.bus, jr.Worktree.Bundles, filepath.Join(ws.Root, "bundles")); err != nil {
		return nil, "", err
	}
	wt := &worktree{cache: c, dir: filepath.Join(ws.Root, "repo"), spec: jr.Worktree}
	note, err := c.Prepare(ctx, wt.dir, *jr.Worktree)
	if err != nil {
		_ = c.RemoveWorktree(context.WithoutCancel(ctx), wt.dir)
		return nil, "", err
	}
	return wt, note, nil
}

// remove removes the worktree (not the cache).
func (w *worktree) remove(ctx context.Context) {
	_ = w.cache.RemoveWorktree(context.WithoutCancel(ctx), w.dir)
}

// errCommit marks a commit of the agent's work that git refused (a lock
// the agent left, a worktree it broke): the job's failure, reported with
// git's words, not a worker fault to retry until the job is abandoned.
var errCommit = errors.New("committing the agent's work")

// commitWork commits what the agent left and stores the commits since the
// base. A commit git refuses wraps errCommit.
func (s *Service) commitWork(ctx context.Context, w *worktree, req schemas.Event, jr *schemas.JobRequested, ws *workspace.Workspace, delivery uint64) (*schemas.GitResult, error) {
	// The commit is titled by the loop's part of its parent's output (a
	// section's heading), else by the prompt.
	title := schemas.Title(jr.Prompt, 72)
	for _, f := range jr.Files {
		if t := schemas.Title(f.Content, 72); t != "" {
			title = t
			break
		}
	}
	msg := fmt.Sprintf("%s: %s", jr.Step, title)
	head, err := w.cache.Commit(ctx, w.dir, identity(w.spec), msg, [][2]string{
		{gitrepo.TrailerSession, req.Session}, {gitrepo.TrailerLoop, jr.Step}, {gitrepo.TrailerJob, jr.JobID},
	})
	if err != nil {
		if ctx.Err() != nil {
			return nil, err
		}
		return nil, fmt.Errorf("%w: %w", errCommit, err)
	}
	g := &schemas.GitResult{Commit: head, Base: w.spec.Base, Changed: head != w.spec.Base}
	if g.Changed {
		if g.Bundle, err = s.storeBundle(ctx, w.cache, ws, jr, req, delivery, head, w.spec.Base); err != nil {
			return nil, err
		}
	}
	return g, nil
}
