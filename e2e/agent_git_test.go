package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCodingAgentGitConfigNeverRunsAsTheWorker: a code loop's agent runs
// git config in its worktree (a clean filter for every file, signing with
// a gpg.program of its own) and names the filter in .gitattributes. The
// worker's commit and merge run none of it, the session completes with
// the agent's change on the target branch, and the next iteration's
// worktree (the loop validates only on the second) finds the cache's
// configuration clean.
func TestCodingAgentGitConfigNeverRunsAsTheWorker(t *testing.T) {
	t.Parallel()
	marks := t.TempDir()
	r := newCodingRig(t, []string{"alpha"}, `set -eu
printf '#!/bin/sh\ntouch `+marks+`/gpg\nexit 1\n' > "$LOOPBUS_OUTPUT_DIR/../gpg.sh"
chmod +x "$LOOPBUS_OUTPUT_DIR/../gpg.sh"
test -z "$(git config --get filter.evil.clean || true)" || touch `+marks+`/carried
git config filter.evil.clean "touch `+marks+`/clean; cat"
git config filter.evil.smudge "touch `+marks+`/smudge; cat"
git config commit.gpgSign true
git config gpg.program "$(cd "$LOOPBUS_OUTPUT_DIR/.." && pwd)/gpg.sh"
printf '* filter=evil\n' > .gitattributes
echo "line $(wc -l < NOTES.md)" >> NOTES.md
`)
	// The loop passes on its second iteration: two lines added.
	writeFiles(t, r.repo, map[string]string{"test.sh": "test $(wc -l < NOTES.md) -ge 3\n"})
	commitAll(t, r.repo)
	data := filepath.Join(r.dir, "data")
	res := loopbus(t, "run", r.file, "--repo", r.repo, "--task", "note", "--session", "gitcfg", "--data", data, "--json")
	if res.code != 0 {
		t.Fatalf("run: exit %d\n%s", res.code, res.stderr)
	}
	clone := checkTarget(t, r.repo, "loopbus/gitcfg")
	if notes := mustRead(t, filepath.Join(clone, "NOTES.md")); strings.Count(notes, "line ") != 2 {
		t.Errorf("NOTES.md on the target:\n%s\nwant both iterations' lines", notes)
	}
	for _, m := range []string{"clean", "smudge", "gpg", "carried"} {
		if _, err := os.Stat(filepath.Join(marks, m)); err == nil {
			t.Errorf("the agent's git configuration (%s) reached the worker or the next iteration", m)
		}
	}
}

// TestCodingCommitRefusedIsReported: an agent that leaves its worktree's
// index locked makes the worker's commit fail; the job fails with git's
// own words, not as a job the workers abandoned after crashing.
func TestCodingCommitRefusedIsReported(t *testing.T) {
	t.Parallel()
	r := newCodingRig(t, []string{"alpha"}, `set -eu
echo more >> NOTES.md
touch "$(git rev-parse --git-dir)/index.lock"
`)
	data := filepath.Join(r.dir, "data")
	res := loopbus(t, "run", r.file, "--repo", r.repo, "--task", "note", "--session", "locked", "--data", data, "--json")
	if res.code == 0 {
		t.Fatalf("run with every commit refused: exit 0\n%s", res.stdout)
	}
	var failures []string
	for _, e := range events(t, []string{"--data", data}, "locked") {
		if e.Type == "loopbus.job.failed" {
			failures = append(failures, string(e.Data))
		}
	}
	if len(failures) == 0 {
		t.Fatalf("no job failed\n%s", res.stderr)
	}
	for _, f := range failures {
		if strings.Contains(f, "abandoned") {
			t.Errorf("a refused commit was reported as an abandoned job: %s", f)
		}
	}
	if !strings.Contains(failures[0], "committing the agent's work") || !strings.Contains(failures[0], "index.lock") {
		t.Errorf("the first failure does not give git's reason: %s", failures[0])
	}
}
