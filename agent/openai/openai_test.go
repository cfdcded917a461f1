package openai

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/loopbus/loopbus/agent"
	"github.com/loopbus/loopbus/agent/modelapi"
	"github.com/loopbus/loopbus/internal/modelserver"
	"github.com/loopbus/loopbus/schemas"
)

// TestBackend runs the conformance suite and the model-API scenarios
// against a scripted server speaking OpenAI's wire format, streaming and
// not.
func TestBackend(t *testing.T) {
	modelserver.RunSuite(t, modelserver.OpenAI, func() agent.Backend {
		return Backend{modelapi.Options{Loop: modelapi.Config{Backoff: time.Millisecond}}}
	})
}

// TestWorkerEnvironmentStaysOut: the SDK reads the worker process's own
// OPENAI_* variables; none of them reaches a pipeline's server, nor moves
// the job to another one.
func TestWorkerEnvironmentStaysOut(t *testing.T) {
	t.Setenv("OPENAI_ORG_ID", "org-of-the-worker")
	t.Setenv("OPENAI_PROJECT_ID", "proj-of-the-worker")
	t.Setenv("OPENAI_CUSTOM_HEADERS", "X-Proxy-Token: secret-of-the-worker")
	t.Setenv("OPENAI_BASE_URL", "http://127.0.0.1:1/v1")
	ms := modelserver.New(t)
	ms.Add("env", modelserver.Script{Replies: []modelserver.Reply{{Text: "Fine."}}})
	job := agent.Job{Spec: schemas.AgentSpec{Backend: "openai", Model: "m", BaseURL: ms.OpenAIURL("env")}, Dir: t.TempDir(), Prompt: "Go."}
	res, err := Backend{}.Run(context.Background(), job, func(agent.Event) {})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("%+v, %v", res, err)
	}
	reqs := ms.Requests("env")
	if len(reqs) != 1 {
		t.Fatalf("%d requests reached the pipeline's server", len(reqs))
	}
	for name, vals := range reqs[0].Header {
		for _, v := range vals {
			if strings.Contains(v, "of-the-worker") {
				t.Errorf("header %s: %s came from the worker's environment", name, v)
			}
		}
	}
	if reqs[0].APIKey != "" {
		t.Errorf("a key was sent: %q", reqs[0].APIKey)
	}
}
