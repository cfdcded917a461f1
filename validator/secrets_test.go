package validator_test

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/loopbus/loopbus/internal/testnats"
	"github.com/loopbus/loopbus/schemas"
	"github.com/loopbus/loopbus/validator"
)

// TestCommandOutputMasksSecrets: the validate command's output becomes
// feedback in validation.failed; the values of secret environment
// variables (listed by the step, by the validator, or named like secrets)
// are masked there.
func TestCommandOutputMasksSecrets(t *testing.T) {
	t.Parallel()
	secrets := map[string]string{
		"API_TOKEN":   "tok-0123456789abcdef", // secret by its name
		"DB_URL":      "postgres://u:pw-9876543210@db/x",
		"CUSTOMER_ID": "cust-5555-6666-7777",
	}
	b, _ := testnats.Bus(t)
	env := []string{"PATH=" + os.Getenv("PATH")}
	for k, v := range secrets {
		env = append(env, k+"="+v)
	}
	v, err := validator.New(validator.Config{WorkDir: t.TempDir(), Env: env, SecretEnv: []string{"DB_URL"}}, b, testnats.Logger(t), time.Now)
	if err != nil {
		t.Fatalf("validator.New: %v", err)
	}
	j := newJob("s1.summary.1", schemas.Output{Name: "notes.md"})
	j.produced = []file{{"notes.md", "notes"}}
	j.request.Agent.SecretEnv = []string{"CUSTOMER_ID"}
	j.request.Validate = writeScript(t, `echo "token $API_TOKEN url $DB_URL customer $CUSTOMER_ID"; echo "$API_TOKEN" >&2; exit 3`)
	reqSeq := publish(t, b, session, schemas.TypeJobRequested, "summary", j.id, j.request)
	j.complete(t, b, reqSeq)
	testnats.Run(t, "validator", v.Run)

	ev, verdict := waitVerdict(t, b, j.id)
	if ev.Type != schemas.TypeValidationFailed || len(verdict.Errors) != 1 {
		t.Fatalf("verdict %s %+v, want one command error", ev.Type, verdict.Errors)
	}
	msg := verdict.Errors[0].Message + verdict.RetryHint
	for name, val := range secrets {
		if strings.Contains(msg, val) {
			t.Errorf("the value of %s is in the verdict: %q", name, msg)
		}
		if !strings.Contains(msg, "[secret "+name+"]") {
			t.Errorf("no [secret %s] marker in %q", name, msg)
		}
	}
}

func TestNewRefusesShortListedSecret(t *testing.T) {
	t.Parallel()
	b, _ := testnats.Bus(t)
	_, err := validator.New(validator.Config{Env: []string{"PIN=1234"}, SecretEnv: []string{"PIN"}}, b, testnats.Logger(t), time.Now)
	if err == nil || !strings.Contains(err.Error(), "PIN") || strings.Contains(err.Error(), "1234") {
		t.Errorf("New = %v, want an error naming PIN but not its value", err)
	}
}
