package agentworker_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/loopbus/loopbus/agent"
	"github.com/loopbus/loopbus/agentworker"
	"github.com/loopbus/loopbus/internal/modelserver"
	"github.com/loopbus/loopbus/internal/testnats"
	"github.com/loopbus/loopbus/schemas"
)

// apiKey is the worker's key for the scripted model: its value must never
// reach an event.
const apiKey = "sk-proj-worker-secret-0123456789"

// modelRequest builds a job request whose agent calls script name of ms
// through backend (openai or anthropic).
func modelRequest(ms *modelserver.Server, backend, jobID, name string, outputs ...string) *schemas.JobRequested {
	jr := request(jobID, "step", 1, nil, outputs...)
	jr.Agent = schemas.AgentSpec{Backend: backend, Model: "test-model", BaseURL: ms.BaseURL(backend, name), APIKeyEnv: "MODEL_KEY"}
	return jr
}

// TestModelAPIJob: a job worked by a model behind an API, through a real
// worker and bus: its tool calls are tool.started/tool.completed pairs
// with their lanes, its text agent.message, its usage (cached tokens
// included) in job.completed; the file it wrote is the stored output; the
// key, which the worker reads from a variable whose name does not look
// secret, appears in no event and is not in the run tool's environment.
func TestModelAPIJob(t *testing.T) {
	t.Parallel()
	for _, backend := range []string{schemas.BackendOpenAI, schemas.BackendAnthropic} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			ms := modelserver.New(t)
			ms.Add("write", modelserver.Script{Key: apiKey, Replies: []modelserver.Reply{
				{Text: "Writing the summary.", Usage: modelserver.Usage{Input: 500, Output: 40, Cached: 100}, Calls: []modelserver.Call{
					{Name: "write_file", Args: `{"path":"out/out.txt","content":"the summary\n"}`},
					{Name: "run", Args: `{"command":"echo key=[$MODEL_KEY] base=$WORKER_BASE"}`},
				}},
				{Text: "Done: out/out.txt holds the summary.", Usage: modelserver.Usage{Input: 600, Output: 10}},
			}})
			b, _ := testnats.Bus(t)
			startWorker(t, b, agentworker.Config{ID: "w1", Env: baseEnv("MODEL_KEY=" + apiKey), ModelKeyEnv: []string{"MODEL_KEY"}})
			jr := modelRequest(ms, backend, "s1.step.1", "write", "out.txt")
			publishRequest(t, b, jr)
			evs, res := waitResult(t, b, jr.JobID)
			jc, ok := res.Data.(*schemas.JobCompleted)
			if !ok {
				t.Fatalf("result %s: %+v%s", res.Type, res.Data, describe(evs))
			}
			if u := jc.Usage; u == nil || u.InputTokens != 1100 || u.CachedTokens != 100 || u.OutputTokens != 50 {
				t.Errorf("usage %+v, want 1100 input (100 cached) and 50 output", jc.Usage)
			}
			if len(jc.Artifacts) != 1 || string(fetch(t, b, jc.Artifacts[0])) != "the summary\n" {
				t.Errorf("artifacts %+v", jc.Artifacts)
			}
			lanes := map[string]string{}
			for _, ev := range ofType(evs, schemas.TypeToolStarted) {
				ts := ev.Data.(*schemas.ToolStarted)
				lanes[ts.Name] = ts.Lane
			}
			if lanes["write_file"] != agent.LaneNoNet || lanes["run"] != agent.LaneHeavy {
				t.Errorf("tool lanes %v, want write_file no-net and run heavy", lanes)
			}
			var runOut string
			for _, ev := range ofType(evs, schemas.TypeToolCompleted) {
				if tc := ev.Data.(*schemas.ToolCompleted); tc.Name == "run" {
					runOut = tc.Output
				}
			}
			if !strings.Contains(runOut, "key=[] base=from-worker") {
				t.Errorf("run output %q: want the worker's environment without the key", runOut)
			}
			if n := len(ofType(evs, schemas.TypeAgentMessage)); n != 2 {
				t.Errorf("%d agent.message, want 2", n)
			}
			for _, ev := range evs {
				raw, _ := json.Marshal(ev.Data)
				if strings.Contains(string(raw), apiKey) {
					t.Errorf("%s shows the API key: %s", ev.Type, raw)
				}
			}
			if reqs := ms.Requests("write"); len(reqs) != 2 || reqs[0].APIKey != apiKey {
				t.Errorf("%d requests, want 2 with the worker's key", len(reqs))
			}
		})
	}
}

// TestModelAPIJobEnds: a long rate limit fails the job as rate limited
// with its reset time (for the orchestrator's durable wait); a job
// cancelled while the model is in the middle of a reply ends within
// killDeadline, its request aborted.
func TestModelAPIJobEnds(t *testing.T) {
	t.Parallel()
	ms := modelserver.New(t)
	ms.Add("limit", modelserver.Script{Replies: []modelserver.Reply{{Fail: &modelserver.Failure{Status: 429, RetryAfter: "600", Message: "requests per day exceeded"}}}})
	ms.Add("stall", modelserver.Script{Replies: []modelserver.Reply{{Stall: true, Text: "Let me think about this for a long while."}}})
	b, _ := testnats.Bus(t)
	startWorker(t, b, agentworker.Config{ID: "w1", Concurrency: 2, Env: baseEnv("MODEL_KEY=" + apiKey), ModelKeyEnv: []string{"MODEL_KEY"}})

	limited := modelRequest(ms, schemas.BackendOpenAI, "s1.limited.1", "limit", "out.txt")
	limited.Step = "limited"
	publishRequest(t, b, limited)
	stalled := modelRequest(ms, schemas.BackendAnthropic, "s1.stalled.1", "stall", "out.txt")
	stalled.Step = "stalled"
	publishRequest(t, b, stalled)

	_, res := waitResult(t, b, limited.JobID)
	jf, ok := res.Data.(*schemas.JobFailed)
	if !ok || !jf.RateLimited || jf.ResetAt == nil || !strings.Contains(jf.Error, "requests per day exceeded") {
		t.Fatalf("result %s %+v, want job.failed rate limited with a reset time and the API's message", res.Type, res.Data)
	}
	if d := time.Until(*jf.ResetAt); d < 8*time.Minute || d > 10*time.Minute {
		t.Errorf("resets in %s, want about the 10 minutes the API said", d)
	}

	deadline := time.Now().Add(waitTimeout)
	for len(ms.Requests("stall")) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the stalled job's model was never called")
		}
		time.Sleep(10 * time.Millisecond)
	}
	began := time.Now()
	publishCancel(t, b, stalled, "stop signal: wrong brief")
	assertCancelledOnce(t, b, stalled.JobID, "stop signal: wrong brief", 1)
	if took := time.Since(began); took > killDeadline {
		t.Errorf("the job ended %s after job.cancelled, want within %s", took, killDeadline)
	}
}

// TestModelAPIKeysStayWithTheWorker: a pipeline cannot have the worker send
// one of its other secrets as an API key, nor, where the worker names its
// servers, send its key to another server.
func TestModelAPIKeysStayWithTheWorker(t *testing.T) {
	t.Parallel()
	ms := modelserver.New(t)
	ms.Add("any", modelserver.Script{Replies: []modelserver.Reply{{Text: "Fine."}}})
	b, _ := testnats.Bus(t)
	startWorker(t, b, agentworker.Config{ID: "w1", Env: baseEnv("AWS_SECRET_ACCESS_KEY=aws-secret-0123456789", "OPENAI_API_KEY="+apiKey),
		ModelBaseURLs: []string{"https://api.openai.com/"}})
	other := modelRequest(ms, schemas.BackendOpenAI, "s1.other.1", "any", "out.txt")
	other.Step, other.Agent.APIKeyEnv = "other", "AWS_SECRET_ACCESS_KEY"
	publishRequest(t, b, other)
	elsewhere := modelRequest(ms, schemas.BackendOpenAI, "s1.elsewhere.1", "any", "out.txt")
	elsewhere.Step, elsewhere.Agent.APIKeyEnv = "elsewhere", ""
	publishRequest(t, b, elsewhere)
	// The backend's default from agent.env, and a host that only starts
	// like the allowed one.
	byEnv := modelRequest(ms, schemas.BackendOpenAI, "s1.byenv.1", "any", "out.txt")
	byEnv.Step, byEnv.Agent.APIKeyEnv, byEnv.Agent.BaseURL = "byenv", "", ""
	byEnv.Agent.Env = map[string]string{"OPENAI_BASE_URL": ms.OpenAIURL("any")}
	publishRequest(t, b, byEnv)
	lookalike := modelRequest(ms, schemas.BackendOpenAI, "s1.lookalike.1", "any", "out.txt")
	lookalike.Step, lookalike.Agent.APIKeyEnv, lookalike.Agent.BaseURL = "lookalike", "", "https://api.openai.com.evil.example/v1"
	publishRequest(t, b, lookalike)
	for _, c := range []struct{ job, want string }{
		{other.JobID, "api_key_env AWS_SECRET_ACCESS_KEY is not a variable this worker lends to model APIs"},
		{elsewhere.JobID, "is not a server this worker calls (https://api.openai.com/; agentworker --model-base-url)"},
		{byEnv.JobID, "is not a server this worker calls"},
		{lookalike.JobID, "is not a server this worker calls"},
	} {
		_, res := waitResult(t, b, c.job)
		if jf, ok := res.Data.(*schemas.JobFailed); !ok || !strings.Contains(jf.Error, c.want) {
			t.Errorf("%s: %s %+v, want job.failed: %q", c.job, res.Type, res.Data, c.want)
		}
	}
	if n := len(ms.Requests("any")); n != 0 {
		t.Errorf("%d requests reached the server", n)
	}
}
