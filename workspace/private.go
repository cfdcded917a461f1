package workspace

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
)

// ErrUnsafeDir: a work directory, or a directory above it, could be
// changed by another local user. Whoever can write there can plant the
// repository caches' configuration or swap a workspace, and have the
// worker run code of theirs as its own user.
var ErrUnsafeDir = errors.New("unsafe work directory")

// DefaultDir is the default work directory named name for this user:
// $TMPDIR/name-UID. One per user, so that no user shares (or can squat)
// another's; PrivateDir refuses one someone else made anyway.
func DefaultDir(name string) string {
	return filepath.Join(os.TempDir(), name+"-"+strconv.Itoa(os.Geteuid()))
}

// PrivateDir makes dir (mode 0700, with missing parents) when it does not
// exist, and checks that no other user can change it: dir (a link to one
// counts as what it leads to) must be a directory owned by this process's
// user and writable by no one else, and every directory above it, on the
// path as given and on the path with links resolved, must be owned by
// this user or root and writable by no one else unless it is sticky (as
// /tmp is: others cannot rename or remove what is ours there). It fails
// with an error wrapping ErrUnsafeDir that names the directory, its owner
// and mode, and what to do.
func PrivateDir(dir string) error {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return fmt.Errorf("work directory %s: %w", dir, err)
	}
	if err := os.MkdirAll(abs, 0o700); err != nil {
		return fmt.Errorf("work directory %s: %w", abs, err)
	}
	resolved, err := filepath.EvalSymlinks(abs)
	if err != nil {
		return fmt.Errorf("work directory %s: %w", abs, err)
	}
	fi, err := os.Stat(resolved)
	if err != nil {
		return fmt.Errorf("work directory %s: %w", abs, err)
	}
	uid := uint32(os.Geteuid())
	if st, ok := fi.Sys().(*syscall.Stat_t); !fi.IsDir() || !ok || st.Uid != uid || fi.Mode().Perm()&0o022 != 0 {
		return fmt.Errorf("%w: %s is %s: it must be a directory of yours (uid %d) writable by you alone; remove it, or give --work-dir a directory of your own",
			ErrUnsafeDir, abs, describeDir(fi), uid)
	}
	for _, p := range []string{abs, resolved} {
		if err := safeAbove(p, uid); err != nil {
			return err
		}
	}
	return nil
}

// safeAbove checks every directory above path as PrivateDir describes.
func safeAbove(path string, uid uint32) error {
	for p := filepath.Dir(path); ; p = filepath.Dir(p) {
		fi, err := os.Stat(p)
		if err != nil {
			return fmt.Errorf("work directory %s: %w", path, err)
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		sticky := fi.Mode()&fs.ModeSticky != 0
		if !ok || (st.Uid != uid && st.Uid != 0) || (fi.Mode().Perm()&0o022 != 0 && !sticky) {
			return fmt.Errorf("%w: %s is inside %s, which is %s: another user could replace it; give --work-dir a directory of your own",
				ErrUnsafeDir, path, p, describeDir(fi))
		}
		if p == filepath.Dir(p) {
			return nil
		}
	}
}

// describeDir says who owns fi and its mode, for error messages.
func describeDir(fi fs.FileInfo) string {
	owner := "of an unknown owner"
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		owner = "owned by uid " + strconv.FormatUint(uint64(st.Uid), 10)
	}
	return fmt.Sprintf("%s with mode %s", owner, fi.Mode())
}
