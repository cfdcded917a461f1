package agentworker_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/loopbus/loopbus/agentworker"
	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/internal/testnats"
	"github.com/loopbus/loopbus/schemas"
	"github.com/loopbus/loopbus/workspace"
	"github.com/loopbus/loopbus/workspace/procrun"
)

// Secret values of the worker's environment, each made secret another way.
const (
	byPattern = "pattern-secret-value-7f3a9c"  // DEPLOY_API_TOKEN: its name looks secret
	byWorker  = "worker-listed-value-51be02"   // PLAINVAR: Config.SecretEnv
	byJob     = "job-listed-value-c0ffee99aa"  // JOBVAR: the job's agent.secretEnv
	notSecret = "ordinary-value-shown-freely1" // SHOWN: nothing makes it secret
)

var secretValues = []string{byPattern, byWorker, byJob}

func secretEnv() []string {
	return baseEnv("DEPLOY_API_TOKEN="+byPattern, "PLAINVAR="+byWorker, "JOBVAR="+byJob, "SHOWN="+notSecret)
}

// logBuffer collects a worker's log lines; zerolog writes from many goroutines.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// startLoggedWorker runs a worker on b (any Bus) logging at debug level
// into the returned buffer.
func startLoggedWorker(t *testing.T, b agentworker.Bus, cfg agentworker.Config) *logBuffer {
	t.Helper()
	if cfg.WorkDir == "" {
		cfg.WorkDir = t.TempDir()
	}
	logs := &logBuffer{}
	w, err := agentworker.New(cfg, b, zerolog.New(logs).Level(zerolog.DebugLevel), time.Now)
	if err != nil {
		t.Fatalf("agentworker.New: %v", err)
	}
	testnats.Run(t, "worker "+cfg.ID, w.Run)
	return logs
}

// eventsJSON renders every event of the session as JSON, as any reader of
// the stream would see it.
func eventsJSON(t *testing.T, evs []schemas.Event) string {
	t.Helper()
	var b strings.Builder
	for _, ev := range evs {
		d, err := json.Marshal(ev.Data)
		if err != nil {
			t.Fatal(err)
		}
		b.WriteString(ev.Type + " " + string(d) + "\n")
	}
	return b.String()
}

// assertNoSecrets fails if any secret value (or, with parts, any 8 bytes
// of one) appears in text.
func assertNoSecrets(t *testing.T, where, text string, parts bool) {
	t.Helper()
	for _, v := range secretValues {
		if strings.Contains(text, v) {
			t.Errorf("%s shows the secret value %q:\n%s", where, v, text)
			continue
		}
		for i := 0; parts && i+8 <= len(v); i++ {
			if strings.Contains(text, v[i:i+8]) {
				t.Errorf("%s shows %q, part of the secret value %q:\n%s", where, v[i:i+8], v, text)
				break
			}
		}
	}
}

// objects lists the keys of the stored artifacts.
func objects(t *testing.T, b *bus.Bus) []string {
	t.Helper()
	keys, err := b.ArtifactKeys(context.Background())
	if err != nil {
		t.Fatalf("list artifacts: %v", err)
	}
	return keys
}

// TestSecretsAreMasked: an agent that prints every secret to stdout and
// stderr, and passes one on its command line, leaves none of them in the
// events or the worker's debug log; a plain variable stays visible.
func TestSecretsAreMasked(t *testing.T) {
	tests := []struct {
		name     string
		script   string
		wantType string
	}{
		{
			name: "job completes",
			script: `echo "out $DEPLOY_API_TOKEN $PLAINVAR $JOBVAR $SHOWN"
echo "err $DEPLOY_API_TOKEN $PLAINVAR $JOBVAR" >&2
echo '{}' > "$LOOPBUS_OUTPUT_DIR/report.json"
`,
			wantType: schemas.TypeJobCompleted,
		},
		{
			name:     "job fails",
			script:   "echo \"$DEPLOY_API_TOKEN $PLAINVAR $SHOWN\"\necho \"$JOBVAR\" >&2\nexit 4\n",
			wantType: schemas.TypeJobFailed,
		},
		{
			name:     "command cannot start",
			wantType: schemas.TypeJobFailed,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b, _ := testnats.Bus(t)
			argv := append(writeScript(t, tt.script), byPattern, byWorker, byJob, notSecret)
			if tt.script == "" {
				// The secret is in the path of a program that does not exist:
				// the start error quotes it.
				argv = []string{"/nonexistent/" + byJob, byPattern}
			}
			jr := request("s1.step.1", "step", 1, argv, "report.json")
			jr.Agent.SecretEnv = []string{"JOBVAR"}
			publishRequest(t, b, jr)
			logs := startLoggedWorker(t, b, agentworker.Config{ID: "w1", Env: secretEnv(), SecretEnv: []string{"PLAINVAR"}})

			all, res := waitResult(t, b, jr.JobID)
			if res.Type != tt.wantType {
				t.Fatalf("result %s, want %s; events:%s", res.Type, tt.wantType, describe(ofJob(all, jr.JobID)))
			}
			waitAcked(t, b)
			var published []schemas.Event
			for _, ev := range sessionEvents(t, b) {
				if ev.Type != schemas.TypeJobRequested { // the request is the orchestrator's, not the worker's
					published = append(published, ev)
				}
			}
			text := eventsJSON(t, published)
			assertNoSecrets(t, "the worker's events", text, true)
			assertNoSecrets(t, "the worker's log", logs.String(), true)
			if !strings.Contains(logs.String(), "job started") {
				t.Errorf("the log buffer holds no job lines, so it proves nothing:\n%s", logs.String())
			}
			if tt.script != "" {
				for _, want := range []string{"[secret DEPLOY_API_TOKEN]", "[secret PLAINVAR]", "[secret JOBVAR]", notSecret} {
					if !strings.Contains(text, want) {
						t.Errorf("events do not show %q:\n%s", want, text)
					}
				}
			} else if !strings.Contains(text, "[secret JOBVAR]") {
				t.Errorf("the start error does not show where the secret was:\n%s", text)
			}
		})
	}
}

// TestSecretCutByTheTail: a secret printed just where the kept output tail
// starts is masked whole, not shown in part.
func TestSecretCutByTheTail(t *testing.T) {
	b, _ := testnats.Bus(t)
	// The secret straddles the start of the last DefaultTailBytes bytes.
	after := procrun.DefaultTailBytes - len(byPattern)/2
	argv := writeScript(t, `printf '%s' "$DEPLOY_API_TOKEN"
head -c `+strconv.Itoa(after)+` /dev/zero | tr '\0' x
echo '{}' > "$LOOPBUS_OUTPUT_DIR/report.json"
`)
	jr := request("s1.step.1", "step", 1, argv, "report.json")
	publishRequest(t, b, jr)
	startWorker(t, b, agentworker.Config{ID: "w1", Env: secretEnv()})
	all, res := waitResult(t, b, jr.JobID)
	jc, ok := res.Data.(*schemas.JobCompleted)
	if !ok {
		t.Fatalf("result %s; events:%s", res.Type, describe(ofJob(all, jr.JobID)))
	}
	assertNoSecrets(t, "job.completed output tail", jc.OutputTail, true)
	if !strings.HasPrefix(jc.OutputTail, "…") || !strings.HasSuffix(jc.OutputTail, "xxxx") {
		t.Errorf("output tail does not look cut: %.40q … %q", jc.OutputTail, jc.OutputTail[max(0, len(jc.OutputTail)-20):])
	}
	if len(jc.OutputTail) > procrun.DefaultTailBytes+len("…") {
		t.Errorf("output tail is %d bytes, over %d", len(jc.OutputTail), procrun.DefaultTailBytes)
	}
	assertNoSecrets(t, "events", eventsJSON(t, ofType(all, schemas.TypeToolCompleted)), true)
}

// TestOutputWithSecretIsRefused: an agent that writes a secret into one of
// its outputs fails for good, with a message naming the variable and the
// output but not the value, and nothing reaches the object store.
func TestOutputWithSecretIsRefused(t *testing.T) {
	tests := []struct {
		name     string
		script   string
		wantName string
	}{
		{
			name:     "second output holds a listed secret",
			script:   "echo clean > \"$LOOPBUS_OUTPUT_DIR/a.txt\"\nprintf 'key: %s\\n' \"$PLAINVAR\" > \"$LOOPBUS_OUTPUT_DIR/b.txt\"\n",
			wantName: "PLAINVAR",
		},
		{
			name:     "secret deep in a large output",
			script:   "head -c 300000 /dev/zero > \"$LOOPBUS_OUTPUT_DIR/a.txt\"\nprintf '%s' \"$DEPLOY_API_TOKEN\" >> \"$LOOPBUS_OUTPUT_DIR/a.txt\"\necho ok > \"$LOOPBUS_OUTPUT_DIR/b.txt\"\n",
			wantName: "DEPLOY_API_TOKEN",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b, _ := testnats.Bus(t)
			jr := request("s1.step.1", "step", 1, writeScript(t, tt.script), "a.txt", "b.txt")
			publishRequest(t, b, jr)
			logs := startLoggedWorker(t, b, agentworker.Config{ID: "w1", Env: secretEnv(), SecretEnv: []string{"PLAINVAR"}})
			all, res := waitResult(t, b, jr.JobID)
			jf, ok := res.Data.(*schemas.JobFailed)
			if !ok {
				t.Fatalf("result %s, want job.failed; events:%s", res.Type, describe(ofJob(all, jr.JobID)))
			}
			for _, want := range []string{tt.wantName, "secret", "must not write secrets"} {
				if !strings.Contains(jf.Error, want) {
					t.Errorf("job.failed error %q does not mention %q", jf.Error, want)
				}
			}
			if jf.Retryable {
				t.Errorf("job.failed is retryable; the same agent would leak again")
			}
			if n := len(ofType(ofJob(all, jr.JobID), schemas.TypeArtifactStored)); n != 0 {
				t.Errorf("%d artifact.stored for the job", n)
			}
			waitAcked(t, b)
			if objs := objects(t, b); len(objs) != 0 {
				t.Errorf("object store holds %v", objs)
			}
			assertNoSecrets(t, "events", eventsJSON(t, sessionEvents(t, b)), false)
			assertNoSecrets(t, "the worker's log", logs.String(), false)
		})
	}
}

// TestListedSecretTooShort: a secret listed by name whose value is too
// short to mask fails the job before the agent runs, naming the variable;
// the same in the worker's own list is a configuration error.
func TestListedSecretTooShort(t *testing.T) {
	b, _ := testnats.Bus(t)
	marker := filepath.Join(t.TempDir(), "ran")
	jr := request("s1.step.1", "step", 1, writeScript(t, "touch \"$MARKER\"\n"), "report.json")
	jr.Agent.SecretEnv = []string{"SHORTPIN"}
	jr.Agent.Env = map[string]string{"MARKER": marker}
	publishRequest(t, b, jr)
	startWorker(t, b, agentworker.Config{ID: "w1", Env: baseEnv("SHORTPIN=90210")})
	all, res := waitResult(t, b, jr.JobID)
	jf, ok := res.Data.(*schemas.JobFailed)
	if !ok || !strings.Contains(jf.Error, "SHORTPIN") || strings.Contains(jf.Error, "90210") || jf.Retryable {
		t.Fatalf("want a final job.failed naming SHORTPIN without its value; events:%s", describe(ofJob(all, jr.JobID)))
	}
	if _, err := os.Stat(marker); err == nil {
		t.Errorf("the agent ran")
	}

	_, err := agentworker.New(agentworker.Config{Env: baseEnv("SHORTPIN=90210"), SecretEnv: []string{"SHORTPIN"}}, b, testnats.Logger(t), time.Now)
	if !errors.Is(err, agentworker.ErrInvalidConfig) || !errors.Is(err, workspace.ErrShortSecret) || strings.Contains(err.Error(), "90210") {
		t.Errorf("New with a short listed secret: %v", err)
	}
	_, err = agentworker.New(agentworker.Config{SecretEnv: []string{"LOOPBUS_TOKEN"}}, b, testnats.Logger(t), time.Now)
	if !errors.Is(err, agentworker.ErrInvalidConfig) || !errors.Is(err, workspace.ErrBadSecretName) {
		t.Errorf("New with secret env LOOPBUS_TOKEN: %v", err)
	}
}
