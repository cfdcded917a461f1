package modelapi

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/loopbus/loopbus/agent"
	"github.com/loopbus/loopbus/schemas"
)

// script is a Model answering from a list: each step is a turn or an
// error; a nil step blocks until ctx ends.
type script struct {
	mu      sync.Mutex
	steps   []func(ctx context.Context) (Turn, error)
	calls   int
	answers [][]Answer
}

func (s *script) Next(ctx context.Context, text func(string)) (Turn, error) {
	s.mu.Lock()
	i := s.calls
	s.calls++
	s.mu.Unlock()
	if i >= len(s.steps) {
		text("done.")
		return Turn{}, nil
	}
	return s.steps[i](ctx)
}

func (s *script) Answer(a []Answer) { s.answers = append(s.answers, a) }

func turn(calls ...Call) func(context.Context) (Turn, error) {
	return func(context.Context) (Turn, error) {
		return Turn{Calls: calls, Usage: agent.Usage{InputTokens: 100, CacheReadTokens: 50, OutputTokens: 10}}, nil
	}
}

func fail(err error) func(context.Context) (Turn, error) {
	return func(context.Context) (Turn, error) { return Turn{}, err }
}

func block(ctx context.Context) (Turn, error) {
	<-ctx.Done()
	return Turn{}, ctx.Err()
}

type recorder struct {
	mu     sync.Mutex
	events []agent.Event
}

func (r *recorder) emit(ev agent.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, ev)
}

func (r *recorder) kinds() string {
	var k []string
	for _, ev := range r.events {
		k = append(k, ev.Kind.String())
	}
	return strings.Join(k, " ")
}

func (r *recorder) of(k agent.Kind) []agent.Event {
	var out []agent.Event
	for _, ev := range r.events {
		if ev.Kind == k {
			out = append(out, ev)
		}
	}
	return out
}

func (r *recorder) find(k agent.Kind) (agent.Event, bool) {
	for _, ev := range r.events {
		if ev.Kind == k {
			return ev, true
		}
	}
	return agent.Event{}, false
}

func runScript(t *testing.T, ctx context.Context, cfg Config, job agent.Job, s *script) (agent.Result, *recorder) {
	t.Helper()
	tb, _ := newBox(t)
	if cfg.Backoff == 0 {
		cfg.Backoff = time.Millisecond
	}
	r := &recorder{}
	res := Run(ctx, cfg, job, s, tb, r.emit)
	return res, r
}

func TestRunParallelCalls(t *testing.T) {
	s := &script{steps: []func(context.Context) (Turn, error){
		turn(Call{ID: "a", Name: ToolWriteFile, Args: `{"path":"../out/x.md","content":"hello"}`},
			Call{ID: "b", Name: ToolRun, Args: `{"command":"sleep 0.2; echo slow"}`},
			Call{ID: "c", Name: ToolReadFile, Args: `{"path":"../../secret.txt"}`}),
	}}
	price := 0.5
	res, r := runScript(t, context.Background(), Config{Price: &schemas.Price{InputPerMTok: 2, OutputPerMTok: 10, CachedInputPerMTok: &price}}, agent.Job{}, s)
	if res.ExitCode != 0 || res.Canceled || res.TimedOut {
		t.Fatalf("result %+v", res)
	}
	if got, want := r.kinds(), "usage tool-start tool-start tool-start tool-end tool-end tool-end message"; got != want {
		t.Errorf("events %s, want %s", got, want)
	}
	for _, ev := range r.of(agent.KindToolEnd) {
		if ev.Name == ToolRun && (ev.ExitCode != 0 || !strings.Contains(ev.Output, "slow")) {
			t.Errorf("the run call's end %+v", ev)
		}
	}
	if len(s.answers) != 1 || len(s.answers[0]) != 3 {
		t.Fatalf("answers %+v, want one turn of three", s.answers)
	}
	for i, id := range []string{"a", "b", "c"} {
		if a := s.answers[0][i]; a.CallID != id {
			t.Errorf("answer %d is for %s, want %s (the calls' order)", i, a.CallID, id)
		}
	}
	if a := s.answers[0][2]; !a.IsError || !strings.Contains(a.Output, "outside") {
		t.Errorf("the refused path's answer %+v", a)
	}
	u, _ := r.find(agent.KindUsage)
	if want := (100*2 + 50*0.5 + 10*10) / 1e6; u.Usage.CostUSD != want {
		t.Errorf("cost %v, want %v", u.Usage.CostUSD, want)
	}
}

func TestRunRetries(t *testing.T) {
	rateLimit := func(after time.Duration) error {
		return &APIError{Status: 429, Message: "slow down", RetryAfter: after}
	}
	tests := []struct {
		name  string
		steps []func(context.Context) (Turn, error)
		exit  int
		calls int
		kinds string
		check func(t *testing.T, r *recorder)
	}{
		{name: "short rate limit waited out", steps: []func(context.Context) (Turn, error){fail(rateLimit(5 * time.Millisecond))},
			exit: 0, calls: 2, kinds: "message"},
		{name: "overloaded (529) waited out", steps: []func(context.Context) (Turn, error){fail(&APIError{Status: 529, RetryAfter: time.Millisecond})},
			exit: 0, calls: 2, kinds: "message"},
		{name: "long rate limit ends the job", steps: []func(context.Context) (Turn, error){fail(rateLimit(time.Hour))},
			exit: 1, calls: 1, kinds: "rate-limit", check: func(t *testing.T, r *recorder) {
				ev, _ := r.find(agent.KindRateLimit)
				if d := time.Until(ev.ResetAt); d < 59*time.Minute || d > time.Hour {
					t.Errorf("resets in %s, want an hour", d)
				}
				if !strings.Contains(ev.Text, "slow down") {
					t.Errorf("text %q lacks the API's message", ev.Text)
				}
			}},
		{name: "rate limit without a time retried, then a limit", steps: []func(context.Context) (Turn, error){
			fail(rateLimit(0)), fail(rateLimit(0)), fail(rateLimit(0))},
			exit: 1, calls: 3, kinds: "rate-limit"},
		{name: "server errors retried", steps: []func(context.Context) (Turn, error){
			fail(&APIError{Status: 503}), fail(io.ErrUnexpectedEOF)},
			exit: 0, calls: 3, kinds: "message"},
		{name: "server errors bounded", steps: []func(context.Context) (Turn, error){
			fail(&APIError{Status: 500}), fail(&APIError{Status: 500}), fail(&APIError{Status: 502, Message: "bad gateway"})},
			exit: 1, calls: 3, kinds: "failure", check: func(t *testing.T, r *recorder) {
				if ev, _ := r.find(agent.KindFailure); !strings.Contains(ev.Text, "3 times") || !strings.Contains(ev.Text, "bad gateway") {
					t.Errorf("failure %q", ev.Text)
				}
			}},
		{name: "client error fails at once", steps: []func(context.Context) (Turn, error){fail(&APIError{Status: 400, Message: "no such model"})},
			exit: 1, calls: 1, kinds: "failure", check: func(t *testing.T, r *recorder) {
				if ev, _ := r.find(agent.KindFailure); !strings.Contains(ev.Text, "no such model") || !strings.Contains(ev.Text, "400") {
					t.Errorf("failure %q", ev.Text)
				}
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := &script{steps: tt.steps}
			res, r := runScript(t, context.Background(), Config{Retries: 2, RetryWait: time.Second}, agent.Job{}, s)
			if res.ExitCode != tt.exit || s.calls != tt.calls || r.kinds() != tt.kinds {
				t.Errorf("exit %d after %d calls, events %q; want exit %d after %d calls, events %q", res.ExitCode, s.calls, r.kinds(), tt.exit, tt.calls, tt.kinds)
			}
			if tt.check != nil {
				tt.check(t, r)
			}
		})
	}
}

func TestRunMaxTurns(t *testing.T) {
	call := turn(Call{ID: "x", Name: ToolListFiles, Args: `{}`})
	s := &script{steps: []func(context.Context) (Turn, error){call, call, call, call, call}}
	res, r := runScript(t, context.Background(), Config{MaxTurns: 3}, agent.Job{}, s)
	if res.ExitCode != 0 || s.calls != 3 {
		t.Errorf("exit %d after %d model calls, want 0 after 3", res.ExitCode, s.calls)
	}
	if !strings.Contains(res.Tail, "max_turns (3) reached") {
		t.Errorf("tail %q does not say why it ended", res.Tail)
	}
	starts := 0
	for _, ev := range r.events {
		if ev.Kind == agent.KindToolStart {
			starts++
		}
	}
	if starts != 3 {
		t.Errorf("%d tool calls, want 3 (the last turn's tools run)", starts)
	}
}

func TestRunCancelAndTimeout(t *testing.T) {
	t.Run("cancel during the model call", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		s := &script{steps: []func(context.Context) (Turn, error){func(ctx context.Context) (Turn, error) {
			cancel()
			return block(ctx)
		}}}
		res, _ := runScript(t, ctx, Config{}, agent.Job{}, s)
		if !res.Canceled || res.ExitCode != -1 {
			t.Errorf("result %+v, want canceled", res)
		}
	})
	t.Run("timeout during a tool", func(t *testing.T) {
		s := &script{steps: []func(context.Context) (Turn, error){turn(Call{ID: "s", Name: ToolRun, Args: `{"command":"sleep 60"}`})}}
		began := time.Now()
		res, r := runScript(t, context.Background(), Config{}, agent.Job{Timeout: 300 * time.Millisecond}, s)
		if !res.TimedOut || res.Canceled {
			t.Errorf("result %+v, want timed out", res)
		}
		if took := time.Since(began); took > 20*time.Second {
			t.Errorf("took %s", took)
		}
		if got := r.kinds(); got != "usage tool-start tool-end" {
			t.Errorf("events %s", got)
		}
	})
	t.Run("a rate-limit wait ends with ctx", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		s := &script{steps: []func(context.Context) (Turn, error){func(context.Context) (Turn, error) {
			// Cancelled once the loop waits out the 20 s.
			time.AfterFunc(100*time.Millisecond, cancel)
			return Turn{}, &APIError{Status: 429, RetryAfter: 20 * time.Second}
		}}}
		began := time.Now()
		res, _ := runScript(t, ctx, Config{RetryWait: time.Minute}, agent.Job{}, s)
		if !res.Canceled || s.calls != 1 {
			t.Errorf("result %+v after %d calls, want canceled after 1", res, s.calls)
		}
		if took := time.Since(began); took > 15*time.Second {
			t.Errorf("Run returned %s after the cancel: the wait ignored it", took)
		}
	})
}

func TestRetryAfter(t *testing.T) {
	now := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		h    http.Header
		want time.Duration
	}{
		{http.Header{"Retry-After": {"7"}}, 7 * time.Second},
		{http.Header{"Retry-After": {"1.5"}}, 1500 * time.Millisecond},
		{http.Header{"Retry-After-Ms": {"250"}, "Retry-After": {"7"}}, 250 * time.Millisecond},
		{http.Header{"Retry-After": {now.Add(90 * time.Second).Format(http.TimeFormat)}}, 90 * time.Second},
		{http.Header{"Retry-After": {"soon"}}, 0},
		{http.Header{"Retry-After": {"-3"}}, 0},
		{http.Header{}, 0},
	}
	for _, tt := range tests {
		if got := RetryAfter(tt.h, now); got != tt.want {
			t.Errorf("RetryAfter(%v) = %s, want %s", tt.h, got, tt.want)
		}
	}
}

func TestAPIErrorText(t *testing.T) {
	err := error(&APIError{Status: 429, Message: "slow"})
	var ae *APIError
	if !errors.As(err, &ae) || err.Error() != "429 Too Many Requests: slow" {
		t.Errorf("%v", err)
	}
}

func TestRunBoundsCallsPerTurn(t *testing.T) {
	calls := make([]Call, MaxCallsPerTurn+6)
	for i := range calls {
		calls[i] = Call{ID: fmt.Sprint(i), Name: ToolListFiles, Args: `{}`}
	}
	s := &script{steps: []func(context.Context) (Turn, error){turn(calls...)}}
	res, r := runScript(t, context.Background(), Config{}, agent.Job{}, s)
	if res.ExitCode != 0 || len(r.of(agent.KindToolStart)) != MaxCallsPerTurn {
		t.Errorf("exit %d, %d tool starts, want %d", res.ExitCode, len(r.of(agent.KindToolStart)), MaxCallsPerTurn)
	}
	if a := s.answers[0]; len(a) != len(calls) || !a[len(a)-1].IsError || !strings.Contains(a[len(a)-1].Output, "not run") {
		t.Errorf("answers: %d, last %+v; want every call answered, the extra ones with an error", len(a), a[len(a)-1])
	}
}

func TestRunContainsAPanic(t *testing.T) {
	s := &script{steps: []func(context.Context) (Turn, error){func(context.Context) (Turn, error) {
		var content []string
		_ = content[3] // a reply no one foresaw
		return Turn{}, nil
	}}}
	res, r := runScript(t, context.Background(), Config{}, agent.Job{}, s)
	if f := r.of(agent.KindFailure); res.ExitCode != 1 || len(f) != 1 || !strings.Contains(f[0].Text, "internal error") {
		t.Errorf("exit %d, failures %+v; want the panic as the job's failure", res.ExitCode, f)
	}
}
