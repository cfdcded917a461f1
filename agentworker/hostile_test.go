package agentworker_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/loopbus/loopbus/agentworker"
	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/internal/testnats"
	"github.com/loopbus/loopbus/schemas"
	"github.com/loopbus/loopbus/workspace"
)

// tamperingBus is a real bus whose deliveries are altered after decoding,
// as a job.requested from a producer that skipped the schema checks (or an
// older schema) would look: the worker must not rely on the bus's checks.
type tamperingBus struct {
	*bus.Bus
	tamper func(*schemas.JobRequested)
}

func (b tamperingBus) Consume(ctx context.Context, cfg bus.ConsumerConfig, h bus.Handler) error {
	return b.Bus.Consume(ctx, cfg, func(ctx context.Context, d bus.Delivery) error {
		if jr, ok := d.Event.Data.(*schemas.JobRequested); ok {
			b.tamper(jr)
		}
		return h(ctx, d)
	})
}

// TestHostileRequestIsRefused: names in a job request that could escape the
// workspace fail the job, for good and with a clear message, before the
// agent runs or anything is fetched or stored.
func TestHostileRequestIsRefused(t *testing.T) {
	tests := []struct {
		name    string
		tamper  func(*schemas.JobRequested)
		wantErr []string
	}{
		{name: "output ../x", tamper: outputNamed("../x"), wantErr: []string{"declared output", `"../x"`, "not a path"}},
		{name: "output /etc/passwd", tamper: outputNamed("/etc/passwd"), wantErr: []string{"declared output", `"/etc/passwd"`}},
		{name: "output a/b", tamper: outputNamed("a/b"), wantErr: []string{"declared output", `"a/b"`}},
		{name: "output empty", tamper: outputNamed(""), wantErr: []string{"declared output", "must not be empty"}},
		{name: "output .", tamper: outputNamed("."), wantErr: []string{"declared output", "must not be . or .."}},
		{name: "output ..", tamper: outputNamed(".."), wantErr: []string{"declared output", "must not be . or .."}},
		{name: "output with NUL", tamper: outputNamed("a\x00b"), wantErr: []string{"declared output", `"a\x00b"`}},
		{name: "output not UTF-8", tamper: outputNamed("\xff\xfe.json"), wantErr: []string{"declared output", "not valid UTF-8"}},
		{name: "input ../prompt.md", tamper: inputNamed("../prompt.md"), wantErr: []string{"input", `"../prompt.md"`}},
		{name: "input /etc/passwd", tamper: inputNamed("/etc/passwd"), wantErr: []string{"input", `"/etc/passwd"`}},
		{name: "input ..", tamper: inputNamed(".."), wantErr: []string{"input", `".."`}},
		{
			name:    "secret env LOOPBUS_TOKEN",
			tamper:  func(jr *schemas.JobRequested) { jr.Agent.SecretEnv = []string{"LOOPBUS_TOKEN"} },
			wantErr: []string{"secretEnv", "LOOPBUS_TOKEN"},
		},
		{
			name:    "secret env not a name",
			tamper:  func(jr *schemas.JobRequested) { jr.Agent.SecretEnv = []string{"A=B"} },
			wantErr: []string{"secretEnv", `"A=B"`},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b, _ := testnats.Bus(t)
			marker := filepath.Join(t.TempDir(), "ran")
			input := putArtifact(t, b, "s1/input/talk.md", "talk.md", []byte("talk"))
			jr := request("s1.step.1", "step", 1, writeScript(t, "touch \"$MARKER\"\necho '{}' > \"$LOOPBUS_OUTPUT_DIR/report.json\"\n"), "report.json")
			jr.Agent.Env = map[string]string{"MARKER": marker}
			jr.Inputs = []schemas.ArtifactRef{input}
			publishRequest(t, b, jr)
			workDir := filepath.Join(t.TempDir(), "work")
			startLoggedWorker(t, tamperingBus{Bus: b, tamper: tt.tamper}, agentworker.Config{ID: "w1", WorkDir: workDir})

			all, res := waitResult(t, b, jr.JobID)
			jf, ok := res.Data.(*schemas.JobFailed)
			if !ok {
				t.Fatalf("result %s, want job.failed; events:%s", res.Type, describe(ofJob(all, jr.JobID)))
			}
			for _, want := range append([]string{"refusing the job request"}, tt.wantErr...) {
				if !strings.Contains(jf.Error, want) {
					t.Errorf("job.failed error %q does not mention %q", jf.Error, want)
				}
			}
			if jf.Retryable {
				t.Errorf("job.failed is retryable: the same request would be refused again")
			}
			if n := len(ofType(ofJob(all, jr.JobID), schemas.TypeToolStarted)); n != 0 {
				t.Errorf("the agent was started")
			}
			if _, err := os.Stat(marker); err == nil {
				t.Errorf("the agent ran")
			}
			waitAcked(t, b)
			if objs := objects(t, b); len(objs) != 1 {
				t.Errorf("object store holds %v, want only the input", objs)
			}
			// Nothing was laid out: the work dir (made when the worker
			// started) holds no workspace, so nothing was fetched anywhere.
			if entries, err := os.ReadDir(workDir); err != nil || len(entries) != 0 {
				t.Errorf("the work dir holds %v (%v): a workspace was laid out", entries, err)
			}
		})
	}
}

func outputNamed(name string) func(*schemas.JobRequested) {
	return func(jr *schemas.JobRequested) { jr.Outputs = []schemas.Output{{Name: "ok.json"}, {Name: name}} }
}

func inputNamed(name string) func(*schemas.JobRequested) {
	return func(jr *schemas.JobRequested) {
		ref := jr.Inputs[0]
		ref.Name = name
		jr.Inputs = append(jr.Inputs, ref)
	}
}

// TestHostileRequestNeverReachesTheWorker: the same names published as a
// job.requested are refused by the bus already (the event schema), so the
// worker's own check above is a second line.
func TestHostileRequestNeverReachesTheWorker(t *testing.T) {
	b, _ := testnats.Bus(t)
	jr := request("s1.step.1", "step", 1, []string{"true"}, "../x")
	_, err := b.Publish(context.Background(), schemas.Event{
		ID: "hostile", Type: schemas.TypeJobRequested, Session: session, Step: jr.Step, Job: jr.JobID,
		Correlation: session, Time: time.Now(), Data: jr,
	})
	if err == nil {
		t.Fatal("bus published a job.requested with output ../x")
	}
}

// TestOutsideFilesUntouched: an agent that links its output, or its whole
// out/ directory, to a file or directory outside the workspace fails its job;
// the outside file keeps its content and mtime and nothing is stored.
func TestOutsideFilesUntouched(t *testing.T) {
	tests := []struct {
		name    string
		script  string
		wantErr string
	}{
		{
			name:    "output links to an outside file",
			script:  "ln -s \"$OUTSIDE\" \"$LOOPBUS_OUTPUT_DIR/report.json\"\n",
			wantErr: "symbolic link",
		},
		{
			name:    "out/ links to the outside directory",
			script:  "rmdir \"$LOOPBUS_OUTPUT_DIR\"\nln -s \"$(dirname \"$OUTSIDE\")\" \"$LOOPBUS_OUTPUT_DIR\"\n",
			wantErr: "out/ was removed or replaced",
		},
		{
			name:    "out/ links to the outside file",
			script:  "rmdir \"$LOOPBUS_OUTPUT_DIR\"\nln -s \"$OUTSIDE\" \"$LOOPBUS_OUTPUT_DIR\"\n",
			wantErr: "out/ was removed or replaced",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b, _ := testnats.Bus(t)
			outside := filepath.Join(t.TempDir(), "report.json")
			const content = `{"outside":true}`
			if err := os.WriteFile(outside, []byte(content), 0o600); err != nil {
				t.Fatal(err)
			}
			old := time.Now().Add(-time.Hour).Truncate(time.Second)
			if err := os.Chtimes(outside, old, old); err != nil {
				t.Fatal(err)
			}
			jr := request("s1.step.1", "step", 1, writeScript(t, tt.script), "report.json")
			jr.Agent.Env = map[string]string{"OUTSIDE": outside}
			publishRequest(t, b, jr)
			startWorker(t, b, agentworker.Config{ID: "w1"})
			all, res := waitResult(t, b, jr.JobID)
			jf, ok := res.Data.(*schemas.JobFailed)
			if !ok || !strings.Contains(jf.Error, tt.wantErr) {
				t.Fatalf("want job.failed saying %q; events:%s", tt.wantErr, describe(ofJob(all, jr.JobID)))
			}
			waitAcked(t, b)
			if objs := objects(t, b); len(objs) != 0 {
				t.Errorf("object store holds %v", objs)
			}
			fi, err := os.Lstat(outside)
			if err != nil {
				t.Fatal(err)
			}
			got, _ := os.ReadFile(outside)
			if string(got) != content || !fi.ModTime().Equal(old) || !fi.Mode().IsRegular() {
				t.Errorf("outside file changed: %q, mtime %v, mode %v", got, fi.ModTime(), fi.Mode())
			}
		})
	}
}

// TestNonUTF8FileNamesInOut: files an agent leaves in out/ under names that
// are not UTF-8 (or not artifact names at all) are ignored; the declared
// output is stored and the job completes.
func TestNonUTF8FileNamesInOut(t *testing.T) {
	b, _ := testnats.Bus(t)
	argv := writeScript(t, `set -eu
cd "$LOOPBUS_OUTPUT_DIR"
printf junk > "$(printf 'bad\377\376name')"
printf junk > "$(printf 'a\200b.json')"
printf junk > '-rf'
echo '{}' > report.json
`)
	jr := request("s1.step.1", "step", 1, argv, "report.json")
	publishRequest(t, b, jr)
	workDir := t.TempDir()
	stop := startWorker(t, b, agentworker.Config{ID: "w1", WorkDir: workDir})
	all, res := waitResult(t, b, jr.JobID)
	jc, ok := res.Data.(*schemas.JobCompleted)
	if !ok {
		t.Fatalf("result %s; events:%s", res.Type, describe(ofJob(all, jr.JobID)))
	}
	if len(jc.Artifacts) != 1 || jc.Artifacts[0].Name != "report.json" || string(fetch(t, b, jc.Artifacts[0])) != "{}\n" {
		t.Errorf("artifacts = %+v", jc.Artifacts)
	}
	if n := len(ofType(ofJob(all, jr.JobID), schemas.TypeArtifactStored)); n != 1 {
		t.Errorf("%d artifact.stored, want 1", n)
	}
	waitAcked(t, b)
	stop() // the workspace is removed once the job is done, before Run returns
	// The workspace, odd names and all, is gone, and nothing of the
	// session is left in the work dir.
	left, err := os.ReadDir(workDir)
	if err != nil {
		t.Fatal(err)
	}
	if len(left) != 0 {
		t.Errorf("workspace left behind: %v", left)
	}
}

// TestNextJobSeesCleanWorkspace: a worker asked to reuse workspaces keeps
// them emptied for the next job; what one job's agent left (files anywhere, directories,
// a read-only file, a link) is never seen by the next, and a workspace
// whose in/ it opened to others is not handed out again.
func TestNextJobSeesCleanWorkspace(t *testing.T) {
	b, _ := testnats.Bus(t)
	workDir := t.TempDir()
	startWorker(t, b, agentworker.Config{ID: "w1", WorkDir: workDir, Concurrency: 1, ReuseWorkspaces: true})
	messy := writeScript(t, `set -eu
cd "$LOOPBUS_WORKSPACE"
echo left > stray.txt
mkdir -p out/deep/er in/more
echo left > out/deep/er/f
echo left > in/more/g
echo left > out/extra.txt
ln -s / out/root
echo left > ro && chmod 0400 ro
stat -c %i . > out/report.txt
`)
	opened := writeScript(t, `set -eu
cd "$LOOPBUS_WORKSPACE"
echo left > in/more
chmod 0755 in
echo done > out/report.txt
`)
	look := writeScript(t, `set -eu
cd "$LOOPBUS_WORKSPACE"
seen=$(stat -c %i . ; ls -A . ; echo --; ls -A in ; echo --; ls -A out ; echo --; stat -c %a . in out)
printf '%s\n' "$seen" > out/look.txt
`)
	var inodes []string
	for i, step := range []struct {
		argv []string
		out  string
	}{{messy, "report.txt"}, {look, "look.txt"}, {opened, "report.txt"}, {look, "look.txt"}} {
		jr := request("s1.job"+strconv.Itoa(i), "job"+strconv.Itoa(i), 1, step.argv, step.out)
		publishRequest(t, b, jr)
		all, res := waitResult(t, b, jr.JobID)
		jc, ok := res.Data.(*schemas.JobCompleted)
		if !ok || len(jc.Artifacts) != 1 {
			t.Fatalf("job %d: result %s; events:%s", i, res.Type, describe(ofJob(all, jr.JobID)))
		}
		inode, seen, _ := strings.Cut(string(fetch(t, b, jc.Artifacts[0])), "\n")
		if step.out != "look.txt" {
			inodes = append(inodes, strings.TrimSpace(inode))
			continue
		}
		inodes = append(inodes, inode)
		want := "feedback.md\nin\nout\nprompt.md\n--\n--\n--\n700\n700\n700\n"
		if seen != want {
			t.Errorf("job %d saw its workspace as\n%s\nwant\n%s", i, seen, want)
		}
	}
	// The first job's workspace was handed to the second (the third's,
	// re-moded, was not, but a new directory may get its inode number).
	if inodes[0] != inodes[1] {
		t.Errorf("workspace inodes %v: the second job did not get the first one's workspace", inodes)
	}
}

// TestSharedWorkDirIsRefused: a work directory another user may write
// (made by someone else before the worker started, with a repository
// cache planted in it whose configuration runs a command) is refused when
// the worker starts: it names the directory and takes no job.
func TestSharedWorkDirIsRefused(t *testing.T) {
	t.Parallel()
	b, _ := testnats.Bus(t)
	work := filepath.Join(t.TempDir(), "loopbus-work")
	planted := filepath.Join(work, "repos", session+".git")
	if err := os.MkdirAll(planted, 0o777); err != nil {
		t.Fatal(err)
	}
	pwned := filepath.Join(t.TempDir(), "pwned")
	if err := os.WriteFile(filepath.Join(planted, "config"), []byte("[core]\n\tbare = true\n\tfsmonitor = touch "+pwned+"; false\n[commit]\n\tgpgsign = true\n"), 0o666); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{work, filepath.Dir(planted), planted} {
		if err := os.Chmod(d, 0o777); err != nil {
			t.Fatal(err)
		}
	}
	w, err := agentworker.New(agentworker.Config{WorkDir: work, Env: baseEnv()}, b, testnats.Logger(t), time.Now)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	err = w.Run(ctx)
	if !errors.Is(err, workspace.ErrUnsafeDir) || !strings.Contains(err.Error(), work) {
		t.Fatalf("Run with a work directory anyone may write: %v; want ErrUnsafeDir naming it", err)
	}
	if _, err := os.Stat(pwned); err == nil {
		t.Error("the planted configuration ran its command")
	}
}
