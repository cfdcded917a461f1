package workspace_test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/loopbus/loopbus/workspace"
)

// fsTopDir is FS_TOPDIR_FL (chattr +T).
const fsTopDir = 0x00020000

// dirFlags returns dir's inode flags and whether the file system keeps
// them.
func dirFlags(t *testing.T, dir string) (uint32, bool) {
	t.Helper()
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	flags, err := unix.IoctlGetUint32(fd, unix.FS_IOC_GETFLAGS)
	return flags, err == nil
}

// onExt4 reports whether dir is on ext4, where the T attribute exists.
func onExt4(t *testing.T, dir string) bool {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	return st.Type == unix.EXT4_SUPER_MAGIC
}

// TestPoolSpreadsWorkspaces: a pool marks its base, when it is a private
// directory (made by the pool or given), as a top of directory
// hierarchies on ext4, so that its workspaces spread over the block
// groups; a directory others may write to is left as it is. Elsewhere
// workspaces are made as before.
func TestPoolSpreadsWorkspaces(t *testing.T) {
	cases := []struct {
		name   string
		base   func() string
		marked bool
	}{
		{"given private", func() string { return t.TempDir() }, true},
		{"made by the pool", func() string { return filepath.Join(t.TempDir(), "work", "dir") }, true},
		{"shared", func() string {
			dir := t.TempDir()
			if err := os.Chmod(dir, 0o1777); err != nil {
				t.Fatal(err)
			}
			return dir
		}, false},
	}
	for _, tc := range cases {
		for _, reuse := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/reuse=%v", tc.name, reuse), func(t *testing.T) {
				base := tc.base()
				p, err := workspace.NewPool(base, reuse)
				if err != nil {
					t.Fatal(err)
				}
				defer p.Close()
				for _, name := range []string{"a", "b"} {
					w, err := p.Create("s1", name)
					if err != nil {
						t.Fatal(err)
					}
					if fi, err := os.Stat(w.In); err != nil || !fi.IsDir() {
						t.Fatalf("%s: in/ missing: %v", w.Root, err)
					}
					if err := w.Remove(); err != nil {
						t.Fatal(err)
					}
				}
				flags, kept := dirFlags(t, base)
				switch {
				case onExt4(t, base) && !kept:
					t.Fatalf("ext4 keeps no flags of %s", base)
				case onExt4(t, base) && (flags&fsTopDir != 0) != tc.marked:
					t.Fatalf("%s has flags %#x; want the T attribute: %v", base, flags, tc.marked)
				case kept && !tc.marked && flags&fsTopDir != 0:
					t.Fatalf("shared %s was marked (flags %#x)", base, flags)
				}
			})
		}
	}
}
