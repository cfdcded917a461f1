package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/client"
	"github.com/loopbus/loopbus/definition"
	"github.com/loopbus/loopbus/schemas"
)

// mergeLoops is a plan whose four "## " sections each become a code loop
// in a git worktree; each code loop writes a file of its own, so no merge
// conflicts.
const mergeLoops = `kind: loops
name: merge
levels:
  plan:
    agent: {backend: exec, command: [sh, -c, "printf '# p\n## a\n## b\n## c\n## d\n' > out/plan.md"]}
    outputs: [{name: plan.md}]
    children: {level: code, from: plan.md, split: headings}
  code:
    agent: {backend: exec, command: [sh, -c, "echo \"$LOOPBUS_STEP\" > \"$LOOPBUS_STEP.txt\""]}
    worktree: true
    validate: [sh, -c, "test -s \"$LOOPBUS_STEP.txt\""]
`

// BenchmarkMerge measures how long a passed code loop waits for its work to
// be on the target branch: from the loop's step.completed (its validation
// passed) to its loop.merged, through the merge queue (one merge at a time,
// in pass order: four loops passing together queue behind each other) and a
// merge job on a worker (bundles fetched into its cache, a rebase, a bundle
// of the result stored). Sessions run one at a time on one worker.
func BenchmarkMerge(b *testing.B) {
	for _, mode := range modes() {
		b.Run("fsync="+mode.name, func(b *testing.B) {
			sessions := size(3, 12)
			sys := newSystem(b, mode)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			p, err := definition.Parse("merge.yaml", []byte(mergeLoops), b.TempDir())
			if err != nil {
				b.Fatal(err)
			}
			repo := benchRepo(b)
			ends := sys.watchEnds(ctx)
			sys.startValidator()
			sys.startWorkers(1)
			sys.startOrchestrator()
			b.ResetTimer()
			var ids []string
			for i := range b.N * sessions {
				id := fmt.Sprintf("m%04d", i)
				ids = append(ids, id)
				if _, err := client.SubmitLoops(ctx, sys.admin, p, "merge four files", repo, id, time.Now(), nil); err != nil {
					b.Fatal(err)
				}
				waitEnds(b, ends, 1, 2*time.Minute)
			}
			b.StopTimer()
			lat := passToMerge(b, sys.admin, ids)
			b.ReportMetric(percentile(lat, 50), "pass_to_merge_p50_ms")
			b.ReportMetric(percentile(lat, 99), "pass_to_merge_p99_ms")
			b.ReportMetric(float64(len(lat)), "samples")
			b.ReportMetric(0, "ns/op")
		})
	}
}

// passToMerge returns, in milliseconds, each code loop's time from its
// step.completed to its loop.merged (stored times).
func passToMerge(tb testing.TB, bs *bus.Bus, sessions []string) []float64 {
	tb.Helper()
	first := firstStored(tb, bs, sessions, schemas.TypeStepCompleted, schemas.TypeLoopMerged)
	var out []float64
	for k, merged := range first {
		if k.typ != schemas.TypeLoopMerged {
			continue
		}
		passed, ok := first[key{k.session, k.step, schemas.TypeStepCompleted}]
		if !ok {
			tb.Fatalf("session %s loop %s merged without step.completed", k.session, k.step)
		}
		out = append(out, float64(merged.Sub(passed))/float64(time.Millisecond))
	}
	if want := 4 * len(sessions); len(out) != want {
		tb.Fatalf("%d merges, want %d", len(out), want)
	}
	return out
}

// benchRepo makes a git repository with one commit.
func benchRepo(tb testing.TB) string {
	tb.Helper()
	dir := filepath.Join(tb.TempDir(), "repo")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "README.md"), []byte("bench\n"), 0o644); err != nil {
		tb.Fatal(err)
	}
	for _, args := range [][]string{{"init", "-q", "-b", "main"}, {"add", "-A"}, {"-c", "user.name=b", "-c", "user.email=b@b", "commit", "-q", "-m", "start"}} {
		cmd := exec.Command("git", append([]string{"-C", dir}, args...)...)
		if out, err := cmd.CombinedOutput(); err != nil {
			tb.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	return dir
}
