package workspace_test

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/loopbus/loopbus/workspace"
)

// TestPrivateDir: a missing work directory is made for this user alone,
// and a link to it is as good; one others may write (or a link to it), one
// of another owner, or one inside a directory others may write (without
// the sticky bit) is refused with an error naming it.
func TestPrivateDir(t *testing.T) {
	t.Parallel()
	base := t.TempDir()
	fresh := filepath.Join(base, "a", "work")
	if err := workspace.PrivateDir(fresh); err != nil {
		t.Fatalf("a missing work directory: %v", err)
	}
	if fi, err := os.Stat(fresh); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("made %v (%v), want mode 0700", fi, err)
	}
	if err := workspace.PrivateDir(fresh); err != nil {
		t.Fatalf("the same directory again: %v", err)
	}

	open := filepath.Join(base, "open")
	mkdir(t, open, 0o777)
	link := filepath.Join(base, "link")
	if err := os.Symlink(fresh, link); err != nil {
		t.Fatal(err)
	}
	if err := workspace.PrivateDir(link); err != nil {
		t.Errorf("a link to a private work directory: %v", err)
	}
	openLink := filepath.Join(base, "open-link")
	loose := filepath.Join(base, "loose")
	mkdir(t, loose, 0o777)
	inLoose := filepath.Join(loose, "work")
	mkdir(t, inLoose, 0o700)
	sticky := filepath.Join(base, "sticky")
	mkdir(t, sticky, 0o777|os.ModeSticky)
	if err := os.Symlink(open, openLink); err != nil {
		t.Fatal(err)
	}
	cases := map[string]string{open: "writable by you alone", openLink: "writable by you alone", inLoose: "another user could replace it"}
	// Another owner: root may give a directory away; anyone else finds
	// one of root's.
	other := "/usr"
	if os.Geteuid() == 0 {
		other = filepath.Join(base, "theirs")
		mkdir(t, other, 0o755)
		if err := os.Chown(other, 65534, 65534); err != nil {
			t.Fatal(err)
		}
	}
	cases[other] = "must be a directory of yours"
	for dir, want := range cases {
		err := workspace.PrivateDir(dir)
		if !errors.Is(err, workspace.ErrUnsafeDir) || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), dir) {
			t.Errorf("PrivateDir(%s) = %v; want ErrUnsafeDir naming it and saying %q", dir, err, want)
		}
	}
	if err := workspace.PrivateDir(filepath.Join(sticky, "work")); err != nil {
		t.Errorf("a work directory inside a sticky one (as /tmp): %v", err)
	}
	if !strings.HasSuffix(workspace.DefaultDir("loopbus-work"), "loopbus-work-"+strconv.Itoa(os.Geteuid())) {
		t.Errorf("DefaultDir = %s, want one per user", workspace.DefaultDir("loopbus-work"))
	}
}

func mkdir(t *testing.T, dir string, mode os.FileMode) {
	t.Helper()
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, mode); err != nil { // past the umask
		t.Fatal(err)
	}
}
