package main

import (
	"bytes"
	"flag"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/cobra/doc"
)

var updateReference = flag.Bool("update", false, "rewrite docs/cli, the command line reference")

// referenceDir is where the command line reference is kept.
const referenceDir = "../../docs/cli"

// TestCLIReference: docs/cli is the reference cobra generates from the
// commands themselves (one page a command, with every flag); a command or
// flag changed without `make docs` fails here. Defaults that depend on the
// machine (the data directory) are shown by the variable they come from.
func TestCLIReference(t *testing.T) {
	t.Setenv("XDG_DATA_HOME", "~/.local/share")
	root := newRoot(&globals{stdout: io.Discard, stderr: io.Discard, program: "loopbus"})
	root.DisableAutoGenTag = true
	root.InitDefaultHelpCmd()
	root.InitDefaultCompletionCmd()
	dir := t.TempDir()
	if err := doc.GenMarkdownTree(root, dir); err != nil {
		t.Fatal(err)
	}
	generated, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if *updateReference {
		if err := os.RemoveAll(referenceDir); err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(referenceDir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	want := map[string]bool{}
	for _, f := range generated {
		want[f.Name()] = true
		body, err := os.ReadFile(filepath.Join(dir, f.Name()))
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(referenceDir, f.Name())
		if *updateReference {
			if err := os.WriteFile(path, body, 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		kept, err := os.ReadFile(path)
		if err != nil || !bytes.Equal(kept, body) {
			t.Errorf("%s is not the generated reference (run make docs): %v", path, err)
		}
	}
	kept, err := os.ReadDir(referenceDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range kept {
		if !want[f.Name()] {
			t.Errorf("%s documents no command (run make docs)", filepath.Join(referenceDir, f.Name()))
		}
	}
	for _, c := range allCommands(root) {
		if c.Short == "" {
			t.Errorf("command %q has no short description", c.CommandPath())
		}
	}
}

// allCommands is root and every command under it.
func allCommands(root *cobra.Command) []*cobra.Command {
	out := []*cobra.Command{root}
	for _, c := range root.Commands() {
		if !strings.HasPrefix(c.Name(), "__") {
			out = append(out, allCommands(c)...)
		}
	}
	return out
}
