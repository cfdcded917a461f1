package modelserver

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/loopbus/loopbus/agent"
	"github.com/loopbus/loopbus/agent/agenttest"
	"github.com/loopbus/loopbus/agent/modelapi"
	"github.com/loopbus/loopbus/schemas"
)

// testKey is the API key of the suite's jobs: long enough to be masked.
const testKey = "sk-test-0123456789abcdef"

// keyEnv is the variable each vendor's backend reads its key from.
var keyEnv = map[string]string{OpenAI: "OPENAI_API_KEY", Anthropic: "ANTHROPIC_API_KEY"}

// BaseURL is the base URL of script name as vendor's SDK takes it.
func (s *Server) BaseURL(vendor, name string) string {
	if vendor == Anthropic {
		return s.AnthropicURL(name)
	}
	return s.OpenAIURL(name)
}

// RunSuite checks a model-API backend of vendor (OpenAI or Anthropic)
// against a scripted server, streaming and not: the agent.Backend
// conformance suite (agenttest.RunConformance), then what the model-API
// backends promise besides: parallel tool calls all run and all answered,
// a refused path answered as an error, a rate limit or server error then
// success, a long rate limit ending the job as rate limited, a cancel in
// the middle of a reply, max_turns, usage and its price, and the API key
// sent, never shown. newBackend must retry quickly (a backoff of
// milliseconds).
func RunSuite(t *testing.T, vendor string, newBackend func() agent.Backend) {
	t.Helper()
	s := New(t)
	for _, mode := range []struct {
		name  string
		whole bool
	}{{"stream", false}, {"whole", true}} {
		t.Run(mode.name, func(t *testing.T) {
			t.Run("Conformance", func(t *testing.T) {
				agenttest.RunConformance(t, newBackend, s.fixtures(t, vendor, mode.name, mode.whole))
			})
			s.scenarios(t, vendor, mode.name, mode.whole, newBackend)
		})
	}
}

// spec is an agent spec of vendor calling script name.
func (s *Server) spec(vendor, name string, whole bool) schemas.AgentSpec {
	return schemas.AgentSpec{Backend: vendor, Model: "test-model", BaseURL: s.BaseURL(vendor, name), NoStream: whole}
}

func (s *Server) fixtures(t *testing.T, vendor, mode string, whole bool) agenttest.Fixtures {
	fixture := func(name string, sc Script, want ...agent.Kind) agenttest.Fixture {
		name = mode + "-" + name
		s.Add(name, sc)
		return agenttest.Fixture{Spec: s.spec(vendor, name, whole), Env: []string{keyEnv[vendor] + "=" + testKey}, Want: want}
	}
	const (
		start, end, msg, usage = agent.KindToolStart, agent.KindToolEnd, agent.KindMessage, agent.KindUsage
		limit, failure         = agent.KindRateLimit, agent.KindFailure
	)
	success := Script{Key: testKey, Replies: []Reply{
		{Text: "I will write notes.txt and look around.", Usage: Usage{Input: 120, Output: 30, Cached: 20}, Calls: []Call{
			{Name: "write_file", Args: `{"path":"notes.txt","content":"hello\n"}`},
			{Name: "list_files", Args: `{"path":"."}`},
		}},
		{Text: "Done.", Usage: Usage{Input: 200, Output: 5}},
	}}
	f := agenttest.Fixtures{
		Success:   fixture("success", success, msg, usage, start, start, end, end, msg, usage),
		Usage:     fixture("usage", success),
		RateLimit: fixture("rate-limit", Script{Replies: []Reply{{Fail: &Failure{Status: 429, RetryAfter: "3600", Message: "rate limit reached"}}}}, limit),
		Failure:   fixture("failure", Script{Replies: []Reply{{Fail: &Failure{Status: 400, Message: "model test-model does not exist"}}}}, failure),
		Hang: fixture("hang", Script{Replies: []Reply{{Calls: []Call{
			{Name: "run", Args: `{"command":"sleep 300 & echo $! > \"$AGENTTEST_PIDFILE\"; wait"}`},
		}}}}),
		Large: fixture("large", Script{Replies: []Reply{
			{Text: strings.Repeat("long text ", 400), Usage: Usage{Input: 10, Output: 10}, Calls: []Call{
				{Name: "run", Args: `{"command":"head -c 5000 /dev/zero | tr '\\\\0' x"}`},
			}},
			{Text: "Done.", Usage: Usage{Input: 10, Output: 1}},
		}}, msg, usage, start, end, msg, usage),
	}
	if vendor == Anthropic && !whole {
		// Only Anthropic's stream has event types to be new to.
		f.Unknown = fixture("unknown", Script{Replies: []Reply{
			{Text: "Something new.", Unknown: true, Usage: Usage{Input: 10, Output: 3}},
		}}, msg, agent.KindUnknown, agent.KindUnknown, usage)
	}
	f.StartFailure = f.Success
	f.StartFailure.Spec.APIKeyEnv = "AGENTTEST_NO_SUCH_KEY"
	return f
}

// run runs one job of spec in a fresh directory (the job's root) with the
// key in its environment, recording its events.
type run struct {
	res    agent.Result
	err    error
	mu     sync.Mutex
	events []agent.Event
	dir    string
}

func (r *run) of(k agent.Kind) []agent.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []agent.Event
	for _, ev := range r.events {
		if ev.Kind == k {
			out = append(out, ev)
		}
	}
	return out
}

func runJob(ctx context.Context, t *testing.T, b agent.Backend, spec schemas.AgentSpec, env ...string) *run {
	t.Helper()
	r := &run{dir: t.TempDir()}
	job := agent.Job{Spec: spec, Dir: r.dir, Prompt: "Do the task.", Env: append([]string{"PATH=" + os.Getenv("PATH")}, env...)}
	r.res, r.err = b.Run(ctx, job, func(ev agent.Event) {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.events = append(r.events, ev)
	})
	return r
}

func (s *Server) scenarios(t *testing.T, vendor, mode string, whole bool, newBackend func() agent.Backend) {
	key := keyEnv[vendor] + "=" + testKey
	add := func(name string, sc Script) schemas.AgentSpec {
		name = mode + "-" + name
		s.Add(name, sc)
		return s.spec(vendor, name, whole)
	}
	ctx := context.Background()

	t.Run("ParallelCallsAndARefusedPath", func(t *testing.T) {
		t.Parallel()
		spec := add("parallel", Script{Replies: []Reply{{Calls: []Call{
			{ID: "w", Name: "write_file", Args: `{"path":"a.txt","content":"A"}`},
			{ID: "o", Name: "read_file", Args: `{"path":"../outside.txt"}`},
			{ID: "l", Name: "list_files", Args: `{"path":"."}`},
		}}}})
		r := runJob(ctx, t, newBackend(), spec, key)
		if r.err != nil || r.res.ExitCode != 0 {
			t.Fatalf("result %+v, %v", r.res, r.err)
		}
		reqs := s.Requests(mode + "-parallel")
		if len(reqs) != 2 || len(reqs[1].Results) != 3 {
			t.Fatalf("requests %+v, want a second turn answering three calls", reqs)
		}
		for i, id := range []string{"w", "o", "l"} {
			if got := reqs[1].Results[i].CallID; got != id {
				t.Errorf("result %d answers %q, want %q (the calls' order)", i, got, id)
			}
		}
		refused := reqs[1].Results[1]
		if !strings.Contains(refused.Content, "outside") || vendor == Anthropic && !refused.IsError {
			t.Errorf("the refused path's answer %+v", refused)
		}
		if b, err := os.ReadFile(filepath.Join(r.dir, "a.txt")); err != nil || string(b) != "A" {
			t.Errorf("a.txt = %q, %v", b, err)
		}
		ends := r.of(agent.KindToolEnd)
		errs := 0
		for _, ev := range ends {
			if ev.IsError {
				errs++
			}
		}
		if len(r.of(agent.KindToolStart)) != 3 || len(ends) != 3 || errs != 1 {
			t.Errorf("%d starts, %d ends (%d errors), want 3, 3 (1)", len(r.of(agent.KindToolStart)), len(ends), errs)
		}
	})

	for _, c := range []struct {
		name string
		fail Failure
	}{
		{"RateLimitThenSuccess", Failure{Status: 429, RetryAfter: "0.02", Times: 1}},
		{"OverloadedThenSuccess", Failure{Status: 529, RetryAfter: "0.02", Times: 1}},
		{"ServerErrorThenSuccess", Failure{Status: 500, Times: 2}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			spec := add(strings.ToLower(c.name), Script{Replies: []Reply{{Fail: &c.fail, Text: "Nothing to do."}}})
			r := runJob(ctx, t, newBackend(), spec, key)
			if r.err != nil || r.res.ExitCode != 0 || len(r.of(agent.KindRateLimit))+len(r.of(agent.KindFailure)) > 0 {
				t.Fatalf("result %+v, %v, events %+v", r.res, r.err, r.events)
			}
			if n := len(s.Requests(mode + "-" + strings.ToLower(c.name))); n != c.fail.Times+1 {
				t.Errorf("%d requests, want %d", n, c.fail.Times+1)
			}
			if m := r.of(agent.KindMessage); len(m) != 1 || m[0].Text != "Nothing to do." {
				t.Errorf("messages %+v", m)
			}
		})
	}

	t.Run("DroppedConnectionThenSuccess", func(t *testing.T) {
		t.Parallel()
		spec := add("drop", Script{Replies: []Reply{{Drop: true, Text: "Back again."}}})
		r := runJob(ctx, t, newBackend(), spec, key)
		if r.err != nil || r.res.ExitCode != 0 || len(s.Requests(mode+"-drop")) != 2 {
			t.Fatalf("result %+v, %v after %d requests", r.res, r.err, len(s.Requests(mode+"-drop")))
		}
	})

	t.Run("ReplyTooLarge", func(t *testing.T) {
		t.Parallel()
		spec := add("huge", Script{Replies: []Reply{{Text: strings.Repeat("x", modelapi.MaxReplyBytes+1024)}}})
		r := runJob(ctx, t, newBackend(), spec, key)
		f := r.of(agent.KindFailure)
		if r.err != nil || len(f) != 1 || !strings.Contains(f[0].Text, "exceeds 16 MiB") {
			t.Fatalf("result %+v, %v, failures %+v; want the job failed on the answer's size", r.res, r.err, f)
		}
		if n := len(s.Requests(mode + "-huge")); n != 1 {
			t.Errorf("%d requests, want 1: an answer too large is not asked again", n)
		}
	})

	if !whole {
		t.Run("StreamCutThenSuccess", func(t *testing.T) {
			t.Parallel()
			spec := add("cut", Script{Replies: []Reply{{Cut: true, Text: "Whole at last.", Calls: []Call{{Name: "list_files", Args: `{"path":"."}`}}}}})
			r := runJob(ctx, t, newBackend(), spec, key)
			if r.err != nil || r.res.ExitCode != 0 {
				t.Fatalf("result %+v, %v", r.res, r.err)
			}
			// The cut reply was asked again, its call run once, its text shown once.
			if n := len(s.Requests(mode + "-cut")); n != 3 {
				t.Errorf("%d requests, want 3 (the cut one, again, the next turn)", n)
			}
			if n, m := len(r.of(agent.KindToolStart)), len(r.of(agent.KindMessage)); n != 1 || m != 2 {
				t.Errorf("%d tool calls and %d messages, want 1 and 2 (the reply's and done.)", n, m)
			}
		})
		for _, c := range []struct {
			typ      string
			requests int
			kind     agent.Kind
		}{
			{"rate_limit_error", modelapi.DefaultRetries + 1, agent.KindRateLimit},
			{"invalid_request_error", 1, agent.KindFailure},
		} {
			t.Run("StreamError/"+c.typ, func(t *testing.T) {
				t.Parallel()
				name := "stream-error-" + strings.ReplaceAll(c.typ, "_", "-")
				spec := add(name, Script{Replies: []Reply{{StreamError: c.typ, Text: "Starting."}}})
				r := runJob(ctx, t, newBackend(), spec, key)
				if n := len(s.Requests(mode + "-" + name)); r.err != nil || len(r.of(c.kind)) != 1 || n != c.requests {
					t.Errorf("%d requests, events %+v; want %d and one %s", n, r.events, c.requests, c.kind)
				}
			})
		}
	}

	t.Run("ToolCallWithoutType", func(t *testing.T) {
		t.Parallel()
		spec := add("no-type", Script{Replies: []Reply{{NoType: true, Calls: []Call{{Name: "list_files", Args: `{"path":"."}`}}}}})
		r := runJob(ctx, t, newBackend(), spec, key)
		reqs := s.Requests(mode + "-no-type")
		if r.err != nil || r.res.ExitCode != 0 || len(reqs) != 2 {
			t.Fatalf("result %+v, %v after %d requests", r.res, r.err, len(reqs))
		}
		if body := string(reqs[1].Body); strings.Contains(body, "[null]") || vendor == OpenAI && !strings.Contains(body, `"type":"function"`) {
			t.Errorf("the call went back malformed: %s", body)
		}
	})

	t.Run("LongRateLimitEndsTheJob", func(t *testing.T) {
		t.Parallel()
		spec := add("long-limit", Script{Replies: []Reply{{Fail: &Failure{Status: 429, RetryAfter: "7200", Message: "tokens per minute exceeded"}}}})
		spec.RetryWaitMs = 1000
		began := time.Now()
		r := runJob(ctx, t, newBackend(), spec, key)
		lim := r.of(agent.KindRateLimit)
		if r.err != nil || r.res.ExitCode == 0 || len(lim) != 1 {
			t.Fatalf("result %+v, %v, limits %+v", r.res, r.err, lim)
		}
		if d := lim[0].ResetAt.Sub(began); d < 2*time.Hour-time.Minute || d > 2*time.Hour+time.Minute {
			t.Errorf("resets in %s, want the two hours the API said", d)
		}
		if !strings.Contains(lim[0].Text, "tokens per minute exceeded") {
			t.Errorf("limit text %q lacks the API's message", lim[0].Text)
		}
		if n := len(s.Requests(mode + "-long-limit")); n != 1 {
			t.Errorf("%d requests, want 1: a long limit is not waited out in the job", n)
		}
	})

	t.Run("CancelMidReply", func(t *testing.T) {
		t.Parallel()
		spec := add("stall", Script{Replies: []Reply{{Stall: true, Text: "I am thinking about this at length."}}})
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		go func() {
			// Cancel once the reply is under way (streaming: in part).
			for s.Stalled(mode+"-stall") == 0 && ctx.Err() == nil {
				time.Sleep(5 * time.Millisecond)
			}
			cancel()
		}()
		r := runJob(ctx, t, newBackend(), spec, key)
		if !r.res.Canceled || r.err != nil {
			t.Errorf("result %+v, %v, want canceled", r.res, r.err)
		}
	})

	t.Run("MaxTurns", func(t *testing.T) {
		t.Parallel()
		list := Reply{Calls: []Call{{Name: "list_files", Args: `{"path":"."}`}}}
		spec := add("max-turns", Script{Replies: []Reply{list, list, list, list}})
		spec.MaxTurns = 2
		r := runJob(ctx, t, newBackend(), spec, key)
		if r.err != nil || r.res.ExitCode != 0 || len(s.Requests(mode+"-max-turns")) != 2 {
			t.Errorf("result %+v, %v after %d requests, want success after 2", r.res, r.err, len(s.Requests(mode+"-max-turns")))
		}
	})

	t.Run("UsageAndPrice", func(t *testing.T) {
		t.Parallel()
		spec := add("usage-price", Script{Replies: []Reply{{Text: "Done.", Usage: Usage{Input: 1000, Output: 100, Cached: 400}}}})
		spec.Price = &schemas.Price{InputPerMTok: 3, OutputPerMTok: 15}
		r := runJob(ctx, t, newBackend(), spec, key)
		u := r.of(agent.KindUsage)
		if len(u) != 1 {
			t.Fatalf("usage events %+v", u)
		}
		got := u[0].Usage
		if got.InputTokens+got.CacheReadTokens+got.CacheWriteTokens != 1000 || got.CacheReadTokens != 400 || got.OutputTokens != 100 {
			t.Errorf("usage %+v, want 1000 input (400 cached) and 100 output", got)
		}
		if want := (1000*3 + 100*15) / 1e6; got.CostUSD < want-1e-12 || got.CostUSD > want+1e-12 {
			t.Errorf("cost %v, want %v", got.CostUSD, want)
		}
	})

	t.Run("Key", func(t *testing.T) {
		t.Parallel()
		spec := add("key", Script{Key: testKey, Replies: []Reply{{Text: "Fine."}}})
		if r := runJob(ctx, t, newBackend(), spec, key); r.err != nil || r.res.ExitCode != 0 {
			t.Errorf("with the key: %+v, %v", r.res, r.err)
		}
		if reqs := s.Requests(mode + "-key"); len(reqs) == 0 || reqs[0].APIKey != testKey {
			t.Errorf("the request carried key %q", reqs[0].APIKey)
		}
		// A wrong key: the API's answer, never the key, in what the job shows.
		wrong := keyEnv[vendor] + "=sk-wrong-9876543210fedcba"
		r := runJob(ctx, t, newBackend(), spec, wrong)
		f := r.of(agent.KindFailure)
		if len(f) != 1 || !strings.Contains(f[0].Text, "401") {
			t.Fatalf("failures %+v, want the 401", f)
		}
		for _, ev := range r.events {
			if strings.Contains(ev.Text+ev.Input+ev.Output+ev.Error, "sk-wrong") {
				t.Errorf("an event shows the key: %+v", ev)
			}
		}
		if strings.Contains(r.res.Tail, "sk-wrong") {
			t.Errorf("the tail shows the key: %q", r.res.Tail)
		}
		// A base URL and no key: a local server that wants none.
		spec = add("no-key", Script{Replies: []Reply{{Text: "Fine."}}})
		if r := runJob(ctx, t, newBackend(), spec); r.err != nil || r.res.ExitCode != 0 {
			t.Errorf("a local server without a key: %+v, %v", r.res, r.err)
		}
		if reqs := s.Requests(mode + "-no-key"); len(reqs) != 1 || reqs[0].APIKey != "" {
			t.Errorf("requests %+v, want one without a key", reqs)
		}
		// The public API without a key: the job cannot start.
		spec.BaseURL = ""
		if r := runJob(ctx, t, newBackend(), spec); r.err == nil || !strings.Contains(r.err.Error(), keyEnv[vendor]) {
			t.Errorf("no key for the public API: %v, want an error naming %s", r.err, keyEnv[vendor])
		}
	})

	t.Run("ToolsOfferedAndSystemPrompt", func(t *testing.T) {
		t.Parallel()
		spec := add("tools", Script{Replies: []Reply{{Text: "Fine."}}})
		spec.Tools = []string{"read_file", "run"}
		spec.MaxTokens = 777
		b := newBackend()
		r := &run{dir: t.TempDir()}
		job := agent.Job{Spec: spec, Dir: r.dir, Prompt: "Do it.", Env: []string{key, "LOOPBUS_OUTPUT_DIR=" + filepath.Join(r.dir, "out")},
			Forbidden: []string{"run"}}
		if res, err := b.Run(ctx, job, func(agent.Event) {}); err != nil || res.ExitCode != 0 {
			t.Fatalf("%+v, %v", res, err)
		}
		reqs := s.Requests(mode + "-tools")
		if len(reqs) != 1 || strings.Join(reqs[0].Tools, ",") != "read_file" || reqs[0].MaxTokens != 777 || reqs[0].Model != "test-model" {
			t.Fatalf("request %+v, want read_file only (run is forbidden), max tokens 777", reqs)
		}
		if !strings.Contains(reqs[0].System, "$LOOPBUS_OUTPUT_DIR is out") {
			t.Errorf("system prompt %q does not say where the outputs go", reqs[0].System)
		}
	})
}
