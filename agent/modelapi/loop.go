// Package modelapi is what the model-API backends (agent/openai,
// agent/anthropic) share: the tools a model may call, confined to the
// job's directory (Toolbox), and the loop that asks the model for a turn,
// runs the tools it calls, answers it and asks again (Run), with the retry
// policy for rate limits, server errors and dropped connections.
//
// A backend supplies a Model: one conversation in its vendor's wire format.
package modelapi

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/loopbus/loopbus/agent"
	"github.com/loopbus/loopbus/schemas"
	"github.com/loopbus/loopbus/workspace/procrun"
)

// Model is one conversation with a model. The loop calls it from one
// goroutine.
type Model interface {
	// Next asks the model for its next turn. text is called with each
	// piece of the reply's text as it is complete (as it streams in, for
	// a streaming model). On success the turn joins the conversation; on
	// an error the conversation is as it was and Next may be called again.
	// An error answer of the API is an *APIError.
	Next(ctx context.Context, text func(string)) (Turn, error)
	// Answer adds the results of the last turn's tool calls, in the
	// calls' order.
	Answer(results []Answer)
}

// Turn is one reply of the model.
type Turn struct {
	// Calls are the tools the model asked for, in its order; none means
	// it is done.
	Calls []Call
	// Usage is the API's count of this call's tokens.
	Usage agent.Usage
	// Truncated reports that the reply stopped at MaxTokens.
	Truncated bool
	// Unknown are the types of the reply's parts (stream events, content
	// blocks) the backend does not know and skipped: each is a KindUnknown
	// event, never fatal.
	Unknown []string
}

// Call is one tool call of a turn.
type Call struct {
	ID, Name string
	// Args is the arguments as the model wrote them (a JSON object).
	Args string
}

// Answer is the result of one Call.
type Answer struct {
	CallID, Name string
	Output       string
	IsError      bool
}

// APIError is an error answer of a model's API.
type APIError struct {
	// Status is the HTTP status code.
	Status int
	// Message is the API's own message (its error object's, or the body).
	Message string
	// RetryAfter is how long the API asked to wait (Retry-After and its
	// kin); 0 when it did not say.
	RetryAfter time.Duration
}

func (e *APIError) Error() string {
	status := http.StatusText(e.Status)
	if e.Status == 529 {
		status = "Overloaded" // Anthropic's own
	}
	if e.Message == "" {
		return fmt.Sprintf("%d %s", e.Status, status)
	}
	return fmt.Sprintf("%d %s: %s", e.Status, status, e.Message)
}

// rateLimited reports an answer that means "too many requests, come back
// later": 429, and Anthropic's 529 (overloaded).
func (e *APIError) rateLimited() bool { return e.Status == 429 || e.Status == 529 }

// transient reports an answer worth asking again soon: server errors,
// request timeouts and conflicts.
func (e *APIError) transient() bool { return e.Status >= 500 || e.Status == 408 || e.Status == 409 }

// RetryAfter reads how long h asks a client to wait: retry-after-ms
// (OpenAI's), then Retry-After in seconds or as an HTTP date. 0 when h does
// not say, or says something unreadable.
func RetryAfter(h http.Header, now time.Time) time.Duration {
	if v := h.Get("Retry-After-Ms"); v != "" {
		if ms, err := strconv.ParseFloat(v, 64); err == nil && ms > 0 && ms < 1e12 {
			return time.Duration(ms * float64(time.Millisecond))
		}
	}
	v := strings.TrimSpace(h.Get("Retry-After"))
	if v == "" {
		return 0
	}
	if s, err := strconv.ParseFloat(v, 64); err == nil {
		if s <= 0 || s > 1e9 {
			return 0
		}
		return time.Duration(s * float64(time.Second))
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return t.Sub(now)
	}
	return 0
}

// Defaults of Config.
const (
	DefaultMaxTurns  = 40
	DefaultMaxTokens = 8192
	DefaultRetryWait = 30 * time.Second
	// DefaultRetries is how often a failed model call is asked again
	// before the job fails.
	DefaultRetries = 4
	// DefaultBackoff is the first wait before asking again; it doubles.
	DefaultBackoff = time.Second
	// maxBackoff caps one wait of the backoff.
	maxBackoff = 30 * time.Second
	// maxLimitWaits bounds the rate-limit waits of one model call.
	maxLimitWaits = 10
	// MaxCallsPerTurn bounds the tool calls of one turn that are run; the
	// others are answered with an error.
	MaxCallsPerTurn = 64
	// maxMessagesPerTurn bounds the agent.message events of one turn;
	// later texts of the turn make one more.
	maxMessagesPerTurn = 16
)

// Config of a Run. The zero value is usable.
type Config struct {
	// MaxTurns bounds the model calls; 0 means DefaultMaxTurns.
	MaxTurns int
	// RetryWait is the longest Retry-After waited out inside the job; a
	// longer one ends it with a KindRateLimit. 0 means DefaultRetryWait.
	RetryWait time.Duration
	// Retries is how often a model call that failed with a server error,
	// a rate limit that gave no time, or a dropped connection is asked
	// again; 0 means DefaultRetries, negative none.
	Retries int
	// Backoff is the first wait before asking again (it doubles, with
	// jitter); 0 means DefaultBackoff.
	Backoff time.Duration
	// Price turns usage into cost; nil means none.
	Price *schemas.Price
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Secret, when set, is replaced by "[api key]" in every text the run
	// reports (an API's error may quote the key it refused).
	Secret string
}

func (c Config) withDefaults() Config {
	if c.MaxTurns <= 0 {
		c.MaxTurns = DefaultMaxTurns
	}
	if c.RetryWait <= 0 {
		c.RetryWait = DefaultRetryWait
	}
	if c.Retries == 0 {
		c.Retries = DefaultRetries
	}
	if c.Backoff <= 0 {
		c.Backoff = DefaultBackoff
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// Cost returns what u costs at p.
func Cost(u agent.Usage, p *schemas.Price) float64 {
	if p == nil {
		return 0
	}
	cached := p.InputPerMTok
	if p.CachedInputPerMTok != nil {
		cached = *p.CachedInputPerMTok
	}
	return (float64(u.InputTokens+u.CacheWriteTokens)*p.InputPerMTok + float64(u.CacheReadTokens)*cached +
		float64(u.OutputTokens)*p.OutputPerMTok) / 1e6
}

var errTimeout = errors.New("the job's time ran out")

// Run works job with m and tb: it asks the model for a turn, emits its
// text as KindMessage events, runs the tools it calls (all of a turn's
// calls at once, each a KindToolStart and a KindToolEnd), answers it, and
// asks again, until the model calls no tool or cfg.MaxTurns calls were
// made (the job then ends as a success: its outputs decide). Each call's
// usage is a KindUsage event, priced by cfg.Price.
//
// A rate limit whose Retry-After is at most cfg.RetryWait is waited out; a
// longer one ends the run with a KindRateLimit saying when it lifts. Server
// errors and dropped connections are asked again with backoff, at most
// cfg.Retries times; then, and on any other error answer, the run ends with
// a KindFailure carrying the API's message (exit code 1). When ctx ends or
// job.Timeout expires, the request and any running tool are stopped and Run
// returns at once with Canceled or TimedOut.
//
// emit is called from one goroutine at a time, never after Run returns.
func Run(ctx context.Context, cfg Config, job agent.Job, m Model, tb *Toolbox, emit func(agent.Event)) agent.Result {
	cfg = cfg.withDefaults()
	start := cfg.Now()
	if job.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(ctx, job.Timeout, errTimeout)
		defer cancel()
	}
	r := &runner{cfg: cfg, m: m, tb: tb, emit: emit, tail: newTail(job.TailBytes)}
	r.tail.redact = r.redact
	exit := r.contained(ctx)
	res := agent.Result{ExitCode: exit, Duration: cfg.Now().Sub(start), Tail: r.tail.String()}
	if ctx.Err() != nil {
		res.ExitCode = -1
		if errors.Is(context.Cause(ctx), errTimeout) {
			res.TimedOut = true
		} else {
			res.Canceled = true
		}
	}
	return res
}

type runner struct {
	cfg  Config
	m    Model
	tb   *Toolbox
	tail *tail
	// answered counts the bytes of the tools' answers so far.
	answered int
	// mu serializes emit: tools of one turn end concurrently.
	mu   sync.Mutex
	emit func(agent.Event)
}

func (r *runner) send(ev agent.Event) {
	ev.Text, ev.Output, ev.Error = agent.Truncate(r.redact(ev.Text)), agent.Truncate(r.redact(ev.Output)), agent.Truncate(r.redact(ev.Error))
	r.mu.Lock()
	defer r.mu.Unlock()
	r.emit(ev)
}

// redact replaces the API key in s.
func (r *runner) redact(s string) string {
	if r.cfg.Secret == "" {
		return s
	}
	return strings.ReplaceAll(s, r.cfg.Secret, "[api key]")
}

// contained runs loop, turning a panic (a reply no one foresaw) into the
// job's failure rather than the worker's end.
func (r *runner) contained(ctx context.Context) (exit int) {
	defer func() {
		if p := recover(); p != nil {
			r.fail(fmt.Sprintf("internal error in the model loop: %v", p))
			exit = 1
		}
	}()
	return r.loop(ctx)
}

// loop runs the turns and returns the exit code: 0 when the model is done
// or out of turns, 1 when the API failed the run.
func (r *runner) loop(ctx context.Context) int {
	for turn := 1; ; turn++ {
		t, ok := r.next(ctx)
		if !ok {
			return 1
		}
		for _, typ := range t.Unknown {
			r.send(agent.Event{Kind: agent.KindUnknown, Raw: typ})
		}
		if t.Usage != (agent.Usage{}) {
			// A server's counts are not trusted to be sane: a negative
			// one would lower what the budget sees as spent.
			u := &t.Usage
			u.InputTokens, u.OutputTokens = max(u.InputTokens, 0), max(u.OutputTokens, 0)
			u.CacheReadTokens, u.CacheWriteTokens = max(u.CacheReadTokens, 0), max(u.CacheWriteTokens, 0)
			t.Usage.CostUSD = Cost(t.Usage, r.cfg.Price)
			r.send(agent.Event{Kind: agent.KindUsage, Usage: t.Usage})
		}
		if len(t.Calls) == 0 {
			if t.Truncated {
				r.tail.add("\n[the reply stopped at max_tokens]\n")
			}
			return 0
		}
		answers := r.runTools(ctx, turn, t.Calls)
		if ctx.Err() != nil {
			return -1
		}
		for _, a := range answers {
			r.answered += len(a.Output)
		}
		if r.answered > MaxConversationBytes {
			r.fail(fmt.Sprintf("the tools' answers of this job exceed %d MiB: the conversation, sent whole with every request, would grow without end", MaxConversationBytes>>20))
			return 1
		}
		if turn >= r.cfg.MaxTurns {
			r.tail.add(fmt.Sprintf("\n[max_turns (%d) reached: the job ends here]\n", r.cfg.MaxTurns))
			return 0
		}
		r.m.Answer(answers)
	}
}

// next asks the model for a turn, waiting out short rate limits and
// retrying server errors and dropped connections; ok is false when the
// run must end (the reason was emitted, or ctx ended).
func (r *runner) next(ctx context.Context) (Turn, bool) {
	// sent are the texts emitted for this turn: an attempt asked again
	// after a dropped stream repeats them, and is not shown twice. Past
	// maxMessagesPerTurn, texts are joined into one message at the end.
	var (
		sent     []string
		overflow strings.Builder
		k        int
	)
	text := func(s string) {
		if strings.TrimSpace(s) == "" {
			return
		}
		defer func() { k++ }()
		if k < len(sent) && sent[k] == s {
			return
		}
		r.tail.add(s + "\n")
		if len(sent) >= maxMessagesPerTurn {
			if overflow.Len() < agent.MaxSummary {
				overflow.WriteString(s + "\n")
			}
			return
		}
		sent = append(sent, s)
		r.send(agent.Event{Kind: agent.KindMessage, Text: agent.Truncate(s)})
	}
	retries, waits := 0, 0
	for {
		k = 0
		overflow.Reset()
		t, err := r.m.Next(ctx, text)
		if err == nil {
			if overflow.Len() > 0 {
				r.send(agent.Event{Kind: agent.KindMessage, Text: agent.Truncate(overflow.String())})
			}
			return t, true
		}
		if ctx.Err() != nil {
			return Turn{}, false
		}
		var ae *APIError
		isAPI := errors.As(err, &ae)
		var wait time.Duration
		switch {
		case errors.Is(err, ErrReplyTooLarge):
			r.fail(err.Error())
			return Turn{}, false
		case isAPI && ae.rateLimited() && ae.RetryAfter > 0:
			if ae.RetryAfter > r.cfg.RetryWait || waits >= maxLimitWaits {
				r.limit(ae, ae.RetryAfter)
				return Turn{}, false
			}
			waits++
			wait = ae.RetryAfter
		case isAPI && !ae.rateLimited() && !ae.transient():
			r.fail(fmt.Sprintf("the model's API refused the request: %v", ae))
			return Turn{}, false
		case retries >= r.cfg.Retries:
			if isAPI && ae.rateLimited() {
				r.limit(ae, r.cfg.RetryWait)
			} else {
				r.fail(fmt.Sprintf("the model's API failed %d times; last: %v", retries+1, err))
			}
			return Turn{}, false
		default:
			wait = r.backoff(retries)
			retries++
		}
		r.tail.add(fmt.Sprintf("[%v; asking again in %s]\n", err, wait.Round(time.Millisecond)))
		if !sleep(ctx, wait) {
			return Turn{}, false
		}
	}
}

func (r *runner) limit(ae *APIError, after time.Duration) {
	r.tail.add(fmt.Sprintf("[rate limited: %v]\n", ae))
	r.send(agent.Event{Kind: agent.KindRateLimit, Text: agent.Truncate(ae.Error()), ResetAt: r.cfg.Now().Add(after)})
}

func (r *runner) fail(msg string) {
	r.tail.add("[" + msg + "]\n")
	r.send(agent.Event{Kind: agent.KindFailure, Text: agent.Truncate(msg)})
}

// backoff is the wait before retry n (from 0): Backoff doubled n times,
// capped, with up to a quarter of jitter.
func (r *runner) backoff(n int) time.Duration {
	d := r.cfg.Backoff << min(n, 16)
	if d <= 0 || d > maxBackoff {
		d = maxBackoff
	}
	return d - time.Duration(rand.Int64N(int64(d)/4+1))
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// runTools runs a turn's calls at once and returns their answers in the
// calls' order. Each call is a tool start and a tool end event; the ends
// come as the calls finish.
func (r *runner) runTools(ctx context.Context, turn int, calls []Call) []Answer {
	answers := make([]Answer, len(calls))
	if len(calls) > MaxCallsPerTurn {
		// Answered, not run: a reply cannot make the worker start
		// thousands of commands or publish thousands of events.
		for i, c := range calls[MaxCallsPerTurn:] {
			answers[MaxCallsPerTurn+i] = Answer{CallID: c.ID, Name: c.Name, IsError: true,
				Output: fmt.Sprintf("not run: at most %d tool calls are run per turn; ask again", MaxCallsPerTurn)}
		}
		r.tail.add(fmt.Sprintf("[%d tool calls in one turn: the first %d run]\n", len(calls), MaxCallsPerTurn))
		calls = calls[:MaxCallsPerTurn]
	}
	// Event ids are the run's own: APIs and scripted servers may repeat a
	// call id in later turns.
	ids := make([]string, len(calls))
	// Every call starts before any ends: the turn's calls run together.
	for i, c := range calls {
		ids[i] = fmt.Sprintf("t%d-%d-%s", turn, i+1, shortID(c.ID))
		r.send(agent.Event{Kind: agent.KindToolStart, ToolID: ids[i], Name: shortName(c.Name), Category: Category(c.Name), Input: summary(c.Name, c.Args)})
	}
	var wg sync.WaitGroup
	for i, c := range calls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			began := time.Now()
			o := r.tb.contained(ctx, c.Name, c.Args)
			answers[i] = Answer{CallID: c.ID, Name: c.Name, Output: o.Output, IsError: o.IsError}
			r.tail.add(fmt.Sprintf("[%s] %s\n", c.Name, o.Output))
			ev := agent.Event{Kind: agent.KindToolEnd, ToolID: ids[i], Name: shortName(c.Name), Category: Category(c.Name),
				Output: agent.Truncate(o.Output), IsError: o.IsError, Duration: time.Since(began), TimedOut: o.TimedOut}
			if c.Name == ToolRun {
				ev.ExitCode = o.ExitCode
			}
			if o.IsError && c.Name != ToolRun {
				ev.Error = agent.Truncate(o.Output)
			}
			r.send(ev)
		}()
	}
	wg.Wait()
	return answers
}

// maxNameBytes bounds a tool name and a call id as events carry them: a
// server's are not trusted to be short.
const maxNameBytes = 64

// shortName is a tool name cut to maxNameBytes (a tool of that name is not
// offered anyway).
func shortName(name string) string {
	if len(name) <= maxNameBytes {
		return name
	}
	return strings.ToValidUTF8(name[:maxNameBytes], "") + "…"
}

// shortID is a call id, or a digest of one over maxNameBytes.
func shortID(id string) string {
	if len(id) <= maxNameBytes {
		return id
	}
	sum := sha256.Sum256([]byte(id))
	return "sha256-" + hex.EncodeToString(sum[:12])
}

// tail keeps the end of a run's transcript (text, tool results, retries)
// for Result.Tail.
type tail struct {
	mu  sync.Mutex
	max int
	b   []byte
	cut bool
	// redact is applied to each piece before it is kept.
	redact func(string) string
}

func newTail(n int) *tail {
	if n <= 0 {
		n = procrun.DefaultTailBytes
	}
	return &tail{max: n}
}

func (t *tail) add(s string) {
	if t.redact != nil {
		s = t.redact(s)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, s...)
	if over := len(t.b) - t.max; over > 0 {
		t.b = append(t.b[:0], t.b[over:]...)
		t.cut = true
	}
}

func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := strings.ToValidUTF8(string(t.b), "")
	if t.cut {
		return "…" + s
	}
	return s
}
