package gitrepo

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/loopbus/loopbus/schemas"
)

// The functions below work on the user's repository. They read the user's
// own git configuration (not the system's) and never change its HEAD,
// index or working tree.

// RepoInfo describes the user's repository as a session starts from it.
type RepoInfo struct {
	// Dir is the top-level directory of the work tree.
	Dir string
	// Branch is the checked-out branch, "" if HEAD is detached.
	Branch string
	// Base is the branch the session starts from, BaseCommit its commit.
	Base       string
	BaseCommit string
	// Identity is the repository's user.name and user.email (local or
	// global configuration) when both are set, else nil.
	Identity *schemas.GitIdentity
	// Dirty reports uncommitted changes, untracked files included.
	Dirty bool
}

// Inspect describes the git work tree containing dir, resolving base (""
// means the checked-out branch). It fails with ErrNotRepo when dir is not
// inside a git work tree and with ErrNoBranch when base is "" and HEAD is
// detached or base names no commit. A dirty work tree is reported, not an
// error.
func Inspect(ctx context.Context, dir, base string) (RepoInfo, error) {
	g := gitCmd{dir: dir}
	out, err := g.run(ctx, "rev-parse", "--is-inside-work-tree", "--show-toplevel")
	if lines := strings.Split(out, "\n"); err != nil || len(lines) != 2 || lines[0] != "true" {
		if err == nil {
			err = errors.New("not inside a work tree")
		}
		return RepoInfo{}, fmt.Errorf("%w: %s: %v", ErrNotRepo, dir, err)
	}
	info := RepoInfo{Dir: strings.Split(out, "\n")[1]}
	g.dir = info.Dir
	info.Branch, err = g.run(ctx, "symbolic-ref", "-q", "--short", "HEAD")
	if err != nil && exitCode(err) != 1 {
		return info, err
	}
	if base == "" {
		if info.Branch == "" {
			return info, fmt.Errorf("%w: HEAD is detached in %s; name the base branch", ErrNoBranch, info.Dir)
		}
		base = info.Branch
	}
	info.Base = base
	if info.BaseCommit, err = g.resolve(ctx, base); err != nil {
		return info, fmt.Errorf("%w: %s: %v", ErrNoBranch, info.Dir, err)
	}
	name, _ := g.run(ctx, "config", "user.name")
	email, _ := g.run(ctx, "config", "user.email")
	if name != "" && email != "" {
		info.Identity = &schemas.GitIdentity{Name: name, Email: email}
	}
	status, err := g.run(ctx, "status", "--porcelain")
	if err != nil {
		return info, err
	}
	info.Dirty = strings.TrimSpace(status) != ""
	return info, nil
}

// BundleBase writes to path a bundle of the whole history of commit in the
// repository at dir, with one ref, HEAD, pointing at it: readable by
// Cache.FetchBundle. The repository's refs and HEAD are not touched.
func BundleBase(ctx context.Context, dir, commit, path string) error {
	return writeBundle(ctx, gitCmd{dir: dir}, path, commit, "")
}

// Pull brings the bundles (local paths, in order; each needs only the
// commits of the repository and the bundles before it) into the repository
// at dir and points branch at head: creating it, or moving it forward when
// its commit is an ancestor of head. Moving it anywhere else fails with
// ErrDiverged (it is never forced); a branch checked out in any work tree
// of the repository is refused with ErrCheckedOut. It never touches HEAD,
// the index or the working tree. It reports whether the branch changed.
func Pull(ctx context.Context, dir string, bundles []string, head, branch string) (bool, error) {
	g := gitCmd{dir: dir}
	if _, err := g.run(ctx, "rev-parse", "--git-dir"); err != nil {
		return false, fmt.Errorf("%w: %s: %v", ErrNotRepo, dir, err)
	}
	ref := "refs/heads/" + branch
	if strings.HasPrefix(branch, "-") {
		return false, fmt.Errorf("gitrepo: invalid branch name %q", branch)
	}
	if _, err := g.run(ctx, "check-ref-format", ref); err != nil {
		return false, fmt.Errorf("gitrepo: invalid branch name %q", branch)
	}
	worktrees, err := g.run(ctx, "worktree", "list", "--porcelain")
	if err != nil {
		return false, err
	}
	for _, line := range strings.Split(worktrees, "\n") {
		if line == "branch "+ref {
			return false, fmt.Errorf("%w: %s is checked out; not moving it", ErrCheckedOut, branch)
		}
	}
	for _, b := range bundles {
		if b, err = filepath.Abs(b); err != nil {
			return false, err
		}
		if _, err := g.unbundle(ctx, b); err != nil {
			return false, fmt.Errorf("gitrepo: pulling bundle %s: %w", b, err)
		}
	}
	head, err = g.resolve(ctx, head)
	if err != nil {
		return false, fmt.Errorf("gitrepo: pull: head not in the repository: %w", err)
	}
	cur, err := g.run(ctx, "rev-parse", "--verify", "-q", ref)
	switch {
	case exitCode(err) == 1:
		_, err = g.run(ctx, "update-ref", "-m", "loopbus: pull", ref, head, "")
		return err == nil, err
	case err != nil:
		return false, err
	case cur == head:
		return false, nil
	}
	ff, err := g.isAncestor(ctx, cur, head)
	if err != nil {
		return false, err
	}
	if !ff {
		return false, fmt.Errorf("%w: %s is at %s, which %s does not descend from; not moving it",
			ErrDiverged, branch, short(cur), short(head))
	}
	_, err = g.run(ctx, "update-ref", "-m", "loopbus: pull", ref, head, cur)
	return err == nil, err
}
