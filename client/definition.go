package client

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/loopbus/loopbus/schemas"
)

// Bounds of the definition files a session carries.
const (
	MaxDefinitionFiles     = 64
	MaxDefinitionFileBytes = 1 << 20
)

// commandFiles returns the files under p.Dir that p's agent and validate
// commands name (the loader made such arguments absolute), sorted, then the
// other files of the folders holding them (not p.Dir itself; those fitting
// the bounds, while there is room). A worktree level's validate command
// runs in the repository: its arguments are not the definition's.
func commandFiles(p schemas.Pipeline) []string {
	var argvs [][]string
	for _, st := range p.Steps {
		argvs = append(argvs, st.Agent.Command, st.Validate)
	}
	if b := p.Backlog; b != nil {
		for _, a := range b.Agents {
			argvs = append(argvs, a.Command)
		}
		argvs = append(argvs, b.Validate)
	}
	if l := p.Loops; l != nil {
		for _, lv := range l.Levels {
			argvs = append(argvs, lv.Agent.Command)
			if !lv.Worktree {
				argvs = append(argvs, lv.Validate)
			}
		}
	}
	var out, siblings []string
	under := func(path string) bool {
		rel, err := filepath.Rel(p.Dir, path)
		return p.Dir != "" && filepath.IsAbs(path) && err == nil && rel != "." && !strings.HasPrefix(rel, "..")
	}
	regular := func(path string) bool { fi, err := os.Stat(path); return err == nil && fi.Mode().IsRegular() }
	for _, argv := range argvs {
		for _, arg := range argv {
			if !under(arg) || !regular(arg) || slices.Contains(out, arg) {
				continue
			}
			out = append(out, arg)
			// A script's helpers (files it reads next to itself) come
			// along when it lives in a folder of its own.
			if dir := filepath.Dir(arg); dir != filepath.Clean(p.Dir) {
				des, _ := os.ReadDir(dir)
				for _, de := range des {
					if path := filepath.Join(dir, de.Name()); de.Type().IsRegular() && !slices.Contains(siblings, path) {
						siblings = append(siblings, path)
					}
				}
			}
		}
	}
	slices.Sort(out)
	slices.Sort(siblings)
	for _, path := range siblings {
		if fi, err := os.Stat(path); err == nil && fi.Size() <= MaxDefinitionFileBytes && len(out) < MaxDefinitionFiles &&
			!slices.Contains(out, path) && schemas.ValidateDefinitionPath(relSlash(p.Dir, path)) == nil {
			out = append(out, path)
		}
	}
	return out
}

func relSlash(dir, path string) string {
	rel, _ := filepath.Rel(dir, path)
	return filepath.ToSlash(rel)
}

// storeDefinition stores the files p's commands name, so that they travel
// with session. Errors wrap ErrBadInput for files that cannot travel.
func storeDefinition(ctx context.Context, b Bus, session string, p schemas.Pipeline) ([]schemas.DefinitionFile, error) {
	paths := commandFiles(p)
	if len(paths) > MaxDefinitionFiles {
		return nil, fmt.Errorf("%w: the commands of %s name %d files under its directory, over the limit of %d", ErrBadInput, p.Source, len(paths), MaxDefinitionFiles)
	}
	var out []schemas.DefinitionFile
	for _, path := range paths {
		rel := relSlash(p.Dir, path)
		if err := schemas.ValidateDefinitionPath(rel); err != nil {
			return nil, fmt.Errorf("%w: %v (rename it to travel with the session)", ErrBadInput, err)
		}
		f, err := os.Open(path)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrBadInput, err)
		}
		fi, err := f.Stat()
		if err == nil && fi.Size() > MaxDefinitionFileBytes {
			err = fmt.Errorf("%s is %d bytes, over the %d-byte limit of a file that travels with the session", path, fi.Size(), MaxDefinitionFileBytes)
		}
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("%w: %v", ErrBadInput, err)
		}
		ref, err := b.PutArtifact(ctx, session+"/definition/"+rel, safeName(filepath.Base(rel)), f)
		f.Close()
		if err != nil {
			return nil, err
		}
		out = append(out, schemas.DefinitionFile{Path: rel, Artifact: ref, Executable: fi.Mode()&0o111 != 0})
	}
	return out, nil
}

// safeName is name when it is a valid artifact name, else "file".
func safeName(name string) string {
	if schemas.ValidateName(name) == nil {
		return name
	}
	return "file"
}
