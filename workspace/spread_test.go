package workspace_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/loopbus/loopbus/workspace"
)

// fsTopDir is FS_TOPDIR_FL (chattr +T).
const fsTopDir = 0x00020000

// onDir calls f with dir open.
func onDir(t *testing.T, dir string, f func(fd int)) {
	t.Helper()
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	f(fd)
}

// dirFlags returns dir's inode flags and whether the file system keeps
// them.
func dirFlags(t *testing.T, dir string) (flags uint32, kept bool) {
	t.Helper()
	onDir(t, dir, func(fd int) {
		var err error
		flags, err = unix.IoctlGetUint32(fd, unix.FS_IOC_GETFLAGS)
		kept = err == nil
	})
	return flags, kept
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

// fsNoDump is FS_NODUMP_FL (chattr +d), a flag any owner may set.
const fsNoDump = 0x00000040

// setFlags adds flags to dir's, as chattr does.
func setFlags(t *testing.T, dir string, add uint32) {
	t.Helper()
	onDir(t, dir, func(fd int) {
		flags, err := unix.IoctlGetUint32(fd, unix.FS_IOC_GETFLAGS)
		if err == nil {
			err = unix.IoctlSetPointerInt(fd, unix.FS_IOC_SETFLAGS, int(flags|add))
		}
		if err != nil {
			t.Fatalf("set flags of %s: %v", dir, err)
		}
	})
}

// TestPoolSpreadsWorkspaces: a pool marks its base, when it is a work dir
// of the user's own (writable by no one else, and of mode 0700 or empty
// before the first workspace; given, made by the pool, or reached through
// a link), as a top of directory hierarchies on ext4, keeping its other
// flags, so that its workspaces spread over the block groups; any other
// directory of the user's is left as it is. Elsewhere workspaces are made
// as before. A base others may write, or another user's, gets no
// workspace and no mark (PrivateDir).
func TestPoolSpreadsWorkspaces(t *testing.T) {
	type setup struct {
		base, check string // the pool's base, and the directory to check
		flags       uint32 // flags set before, which must stay
	}
	chmod := func(mode os.FileMode) setup {
		dir := t.TempDir()
		if err := os.Chmod(dir, mode); err != nil {
			t.Fatal(err)
		}
		return setup{base: dir, check: dir}
	}
	type spreadCase struct {
		name   string
		setup  func() setup
		marked bool
	}
	cases := []spreadCase{
		{"given private", func() setup { d := t.TempDir(); return setup{base: d, check: d} }, true},
		{"made by the pool", func() setup {
			d := filepath.Join(t.TempDir(), "work", "dir")
			return setup{base: d, check: d}
		}, true},
		{"through a link", func() setup {
			d, link := t.TempDir(), filepath.Join(t.TempDir(), "work")
			if err := os.Symlink(d, link); err != nil {
				t.Fatal(err)
			}
			return setup{base: link, check: d}
		}, true},
		{"other flags kept", func() setup {
			d := t.TempDir()
			if !onExt4(t, d) {
				return setup{base: d, check: d} // no flags to keep
			}
			setFlags(t, d, fsNoDump)
			return setup{base: d, check: d, flags: fsNoDump}
		}, true},
		{"private, not empty", func() setup {
			su := chmod(0o700)
			if err := os.WriteFile(filepath.Join(su.base, "notes"), nil, 0o600); err != nil {
				t.Fatal(err)
			}
			return su
		}, true},
		{"readable by others, empty", func() setup { return chmod(0o755) }, true},
		{"readable by others, not empty", func() setup {
			su := chmod(0o755)
			if err := os.Mkdir(filepath.Join(su.base, "src"), 0o755); err != nil {
				t.Fatal(err)
			}
			return su
		}, false},
	}
	// refused are bases Create must refuse without touching them.
	refused := []spreadCase{{"shared", func() setup { return chmod(0o1777) }, false}}
	if os.Geteuid() == 0 {
		// Only root can give a directory to another user.
		refused = append(refused, spreadCase{"another user's", func() setup {
			d := t.TempDir()
			if err := os.Chown(d, 65534, 65534); err != nil {
				t.Fatal(err)
			}
			return setup{base: d, check: d}
		}, false})
	}
	for _, tc := range refused {
		t.Run(tc.name, func(t *testing.T) {
			su := tc.setup()
			p, err := workspace.NewPool(su.base, false)
			if err != nil {
				t.Fatal(err)
			}
			for range 2 {
				if w, err := p.Create("s1", "a"); !errors.Is(err, workspace.ErrUnsafeDir) {
					t.Fatalf("Create under %s: %v, %v; want ErrUnsafeDir", su.base, w, err)
				}
			}
			if flags, kept := dirFlags(t, su.check); kept && flags&fsTopDir != 0 {
				t.Fatalf("%s was marked (flags %#x)", su.check, flags)
			}
		})
	}
	for _, tc := range cases {
		for _, reuse := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/reuse=%v", tc.name, reuse), func(t *testing.T) {
				su := tc.setup()
				p, err := workspace.NewPool(su.base, reuse)
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
				flags, kept := dirFlags(t, su.check)
				ext4 := onExt4(t, su.check)
				if !ext4 {
					t.Logf("%s is not on ext4: only checked that workspaces are made there and flags kept", su.check)
				}
				switch {
				case ext4 && !kept:
					t.Fatalf("ext4 keeps no flags of %s", su.check)
				case ext4 && (flags&fsTopDir != 0) != tc.marked:
					t.Fatalf("%s has flags %#x; want the T attribute: %v", su.check, flags, tc.marked)
				case kept && !tc.marked && flags&fsTopDir != 0:
					t.Fatalf("%s was marked (flags %#x)", su.check, flags)
				case flags&su.flags != su.flags:
					t.Fatalf("%s lost flags: %#x, had %#x", su.check, flags, su.flags)
				}
			})
		}
	}
}
