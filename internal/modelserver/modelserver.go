// Package modelserver is a scripted model server for tests. It speaks the
// OpenAI Chat Completions and the Anthropic Messages wire formats, streaming
// and not, closely enough that the official Go SDKs decode its answers, so
// the backends built on those SDKs can be tested without a network or a real
// model: each turn's text, tool calls, usage, failures, stalls and dropped
// connections come from a Script.
package modelserver

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Vendor names, as recorded in Request.Vendor.
const (
	OpenAI    = "openai"
	Anthropic = "anthropic"
)

// Server is a scripted model: each named script answers the requests made to its own base URLs.
type Server struct {
	t   testing.TB
	srv *httptest.Server
	// closing is closed before httptest's Close, which waits for active
	// handlers: stalled handlers watch it so that Close can never hang.
	closing   chan struct{}
	closeOnce sync.Once
	seq       atomic.Int64 // makes response ids unique across the server

	mu      sync.Mutex
	scripts map[string]*script
	// hook, when set (by this package's tests), hears "stall" when a handler
	// starts to block and "return" when a handler returns, so tests can await
	// those moments instead of sleeping.
	hook func(event string)
}

// script is a Script with the server's bookkeeping for it.
type script struct {
	Script
	attempts map[[2]int]int // per variant (0: Replies) and turn: requests answered so far, for Fail and Drop
	reqs     []Request
	stalls   int // handlers that began to block (Stall)
}

// Script is a model's replies, turn by turn. The turn of a request is the
// number of assistant messages in its conversation (so the server is stateless
// apart from failure counters); a turn past the end of Replies is answered with
// the text "done." and no tool call.
type Script struct {
	Replies []Reply
	// Variants, when one's Contains is in the conversation's first user
	// message (the prompt), answer in place of Replies: the first that
	// matches. A job's later iterations, whose prompts carry feedback,
	// can so be answered otherwise than the first.
	Variants []Variant
	// Key, when set, must be the request's API key ("Authorization: Bearer
	// KEY", as both SDKs send it; Anthropic's "x-api-key: KEY" too);
	// otherwise the answer is 401 in the vendor's error format.
	Key string
}

// Variant is a script's replies for prompts that contain a text.
type Variant struct {
	Contains string
	Replies  []Reply
}

// Reply is the model's answer for one turn.
type Reply struct {
	Text  string   // assistant text (may be empty)
	Calls []Call   // tool calls, in order; several = parallel tool calls in one turn
	Usage Usage    // reported token usage for this reply
	Fail  *Failure // error answers for the first Fail.Times attempts of this turn
	// Stall, streaming: send the first part (message start, first text delta),
	// flush, then block until the client's request context ends (a cancel
	// mid-stream) or the server closes; non-streaming: block likewise without
	// answering.
	Stall bool
	// Drop makes the first attempt of this turn that Fail does not answer
	// (with no Fail: the first attempt) end abruptly: streaming sends the first
	// part then closes the connection (the client sees an unexpected EOF);
	// non-streaming closes it without a response. Later attempts answer normally.
	Drop bool
	// Unknown, streaming Anthropic only, also sends an event of an unknown type
	// and a content block of an unknown type ("server_future_block") among the
	// known ones, as a newer API would; OpenAI and non-streaming ignore it.
	Unknown bool
	// Cut makes the first attempt of this turn that Fail does not answer
	// a stream that ends cleanly before its end: no finish reason, no
	// usage, no [DONE] (OpenAI), no message_delta and message_stop
	// (Anthropic). Later attempts answer normally.
	Cut bool
	// StreamError, streaming, makes every attempt of this turn send the
	// first part and then an error event with this error type
	// ("rate_limit_error", "invalid_request_error", "server_error"), as an
	// API does when it fails after its 200.
	StreamError string
	// NoType leaves the "type" of OpenAI tool calls out, as some
	// compatible servers do.
	NoType bool
	// Finish overrides the stop/finish reason. Either vendor's spelling works
	// for both ("length" and "max_tokens" are the same reason); others are sent
	// as given. Default: tool calls → "tool_calls"/"tool_use", else "stop"/"end_turn".
	Finish string
}

// Call is a tool call. Args is a JSON object as text ("" means "{}"); an ID of
// "" is generated: "call_<turn>_<i>" for OpenAI, "toolu_<turn>_<i>" for Anthropic.
type Call struct{ ID, Name, Args string }

// Usage is a reply's token usage. OpenAI: prompt_tokens = Input (cached
// included), prompt_tokens_details.cached_tokens = Cached; Anthropic:
// input_tokens = Input-Cached, cache_read_input_tokens = Cached.
type Usage struct{ Input, Output, Cached int64 }

// Failure is an error answer.
type Failure struct {
	Status     int    // e.g. 429, 529, 500, 400
	RetryAfter string // Retry-After header value when not ""
	Message    string // "" means the status text
	Times      int    // how many attempts of this turn fail (counted per script and turn); 0 means always
}

// Request is what the server received.
type Request struct {
	Vendor    string // "openai" or "anthropic"
	Turn      int
	Prompt    string // the first user message's text
	Stream    bool
	Model     string
	APIKey    string          // the key the request carried
	MaxTokens int64           // max_tokens or max_completion_tokens
	Tools     []string        // names of the tools offered
	System    string          // OpenAI: the system (or developer) messages' text; Anthropic: the system field's text
	Results   []Result        // the tool results after the last assistant message (the answers to the previous turn), in order
	Body      json.RawMessage // the raw body
	Header    http.Header     // the request's headers
}

// Result is a tool result sent back to the model. OpenAI tool messages carry
// no error flag, so IsError is false there; Anthropic: tool_result.is_error.
type Result struct {
	CallID, Content string
	IsError         bool
}

// New starts a server; t.Cleanup closes it.
func New(t testing.TB) *Server {
	s := &Server{t: t, closing: make(chan struct{}), scripts: map[string]*script{}}
	s.srv = httptest.NewServer(http.HandlerFunc(s.serveHTTP))
	t.Cleanup(s.close)
	return s
}

// close releases stalled handlers first, because httptest's Close waits for them.
func (s *Server) close() {
	s.closeOnce.Do(func() {
		close(s.closing)
		s.srv.Close()
	})
}

// URL is the server's root URL.
func (s *Server) URL() string { return s.srv.URL }

// OpenAIURL is the base URL openai-go's WithBaseURL takes for the named script.
func (s *Server) OpenAIURL(name string) string { return s.URL() + "/" + name + "/v1" }

// AnthropicURL is the host root anthropic-sdk-go's WithBaseURL takes for the
// named script (the SDK appends /v1/messages).
func (s *Server) AnthropicURL(name string) string { return s.URL() + "/" + name }

var validName = regexp.MustCompile(`^[a-z0-9-]+$`)

// Add installs a script under name ([a-z0-9-]+); a bad or duplicate name fails
// the test, so call it from the test's goroutine. The script must not be
// modified afterwards.
func (s *Server) Add(name string, sc Script) {
	s.t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if !validName.MatchString(name) {
		s.t.Fatalf("modelserver: bad script name %q: want [a-z0-9-]+", name)
	}
	if _, dup := s.scripts[name]; dup {
		s.t.Fatalf("modelserver: duplicate script name %q", name)
	}
	sc.Replies = slices.Clone(sc.Replies)
	s.scripts[name] = &script{Script: sc, attempts: map[[2]int]int{}}
}

// Stalled returns how many requests of the named script have been answered
// in part and now block (Reply.Stall): a test awaits it to act in the
// middle of a reply.
func (s *Server) Stalled(name string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sc := s.scripts[name]; sc != nil {
		return sc.stalls
	}
	return 0
}

// Requests returns copies of every request received for the named script, in arrival order.
func (s *Server) Requests(name string) []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	sc := s.scripts[name]
	if sc == nil {
		return nil
	}
	out := make([]Request, len(sc.reqs))
	for i, r := range sc.reqs {
		r.Tools, r.Results, r.Body = slices.Clone(r.Tools), slices.Clone(r.Results), slices.Clone(r.Body)
		out[i] = r
	}
	return out
}

func (s *Server) note(event string) {
	s.mu.Lock()
	hook := s.hook
	s.mu.Unlock()
	if hook != nil {
		hook(event)
	}
}

// route splits a path into vendor and script name. For paths it does not
// know it still guesses a vendor, so the 404 comes in a format the client parses.
func route(path string) (vendor, name string, ok bool) {
	parts := strings.Split(strings.Trim(path, "/"), "/")
	switch {
	case len(parts) == 4 && parts[1] == "v1" && parts[2] == "chat" && parts[3] == "completions":
		return OpenAI, parts[0], true
	case len(parts) == 3 && parts[1] == "v1" && parts[2] == "messages":
		return Anthropic, parts[0], true
	case strings.HasSuffix(path, "/messages"):
		return Anthropic, "", false
	}
	return OpenAI, "", false
}

func (s *Server) serveHTTP(w http.ResponseWriter, r *http.Request) {
	defer s.note("return")
	vendor, name, ok := route(r.URL.Path)
	if !ok {
		writeError(w, vendor, http.StatusNotFound, "", "unknown path "+r.URL.Path)
		return
	}
	if r.Method != http.MethodPost {
		writeError(w, vendor, http.StatusMethodNotAllowed, "", "method not allowed: "+r.Method)
		return
	}
	s.mu.Lock()
	sc := s.scripts[name]
	s.mu.Unlock()
	if sc == nil {
		writeError(w, vendor, http.StatusNotFound, "", "unknown script "+name)
		return
	}

	body, err := io.ReadAll(r.Body)
	var wire wireRequest
	if err == nil {
		err = json.Unmarshal(body, &wire)
	}
	req := wire.request(vendor, body)
	req.APIKey = apiKey(vendor, r)
	req.Header = r.Header.Clone()
	s.mu.Lock()
	sc.reqs = append(sc.reqs, req)
	s.mu.Unlock()
	if err != nil {
		writeError(w, vendor, http.StatusBadRequest, "", "malformed request: "+err.Error())
		return
	}
	if sc.Key != "" && req.APIKey != sc.Key {
		// As OpenAI's API does, the answer quotes the key it refused.
		writeError(w, vendor, http.StatusUnauthorized, "", "Incorrect API key provided: "+req.APIKey)
		return
	}

	replies, variant := sc.Replies, 0
	for i, v := range sc.Variants {
		if strings.Contains(req.Prompt, v.Contains) {
			replies, variant = v.Replies, i+1
			break
		}
	}
	reply := Reply{Text: "done."}
	if req.Turn < len(replies) {
		reply = replies[req.Turn]
	}
	s.mu.Lock()
	key := [2]int{variant, req.Turn}
	attempt := sc.attempts[key]
	sc.attempts[key]++
	s.mu.Unlock()
	firstAnswered := 0
	if f := reply.Fail; f != nil {
		if f.Times == 0 || attempt < f.Times {
			msg := f.Message
			if msg == "" {
				msg = http.StatusText(f.Status)
			}
			writeError(w, vendor, f.Status, f.RetryAfter, msg)
			return
		}
		firstAnswered = f.Times
	}
	drop := reply.Drop && attempt == firstAnswered
	cut := reply.Cut && attempt == firstAnswered

	a := answer{Reply: reply, vendor: vendor, turn: req.Turn, model: wire.Model,
		created: time.Now().Unix(), seq: s.seq.Add(1), includeUsage: wire.StreamOptions.IncludeUsage}
	rc := http.NewResponseController(w)
	if !wire.Stream {
		switch {
		case drop:
			hangUp(rc)
		case reply.Stall:
			s.block(r, sc)
		default:
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write(marshal(a.message()))
		}
		return
	}
	events, firstPart := a.events()
	switch {
	case drop || reply.Stall:
		events = events[:firstPart]
	case reply.StreamError != "":
		events = append(events[:firstPart:firstPart], a.streamError(reply.StreamError))
	case cut:
		events = events[:a.lastPart]
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	for _, e := range events {
		if e.name != "" {
			fmt.Fprintf(w, "event: %s\n", e.name)
		}
		fmt.Fprintf(w, "data: %s\n\n", e.data)
		// Flush each event, so clients see a real stream and a cut stream
		// keeps what came before the cut.
		_ = rc.Flush()
	}
	switch {
	case drop:
		hangUp(rc)
	case reply.Stall:
		s.block(r, sc)
	}
}

// block waits for the client to give up, or for the server to close so that
// httptest's Close, which waits for handlers, does not hang.
func (s *Server) block(r *http.Request, sc *script) {
	s.mu.Lock()
	sc.stalls++
	s.mu.Unlock()
	s.note("stall")
	select {
	case <-r.Context().Done():
	case <-s.closing:
	}
}

// hangUp closes the connection under the response, so the client sees the
// stream (or the response) end without its proper ending.
func hangUp(rc *http.ResponseController) {
	if conn, _, err := rc.Hijack(); err == nil {
		_ = conn.Close()
	}
}

func apiKey(vendor string, r *http.Request) string {
	bearer := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
	if key := r.Header.Get("X-Api-Key"); vendor == Anthropic && key != "" {
		return key
	}
	return bearer
}

// writeError answers in the vendor's error format, which is what the SDKs
// parse into their API error types.
func writeError(w http.ResponseWriter, vendor string, status int, retryAfter, msg string) {
	if retryAfter != "" {
		w.Header().Set("Retry-After", retryAfter)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	var body obj
	if vendor == Anthropic {
		typ := map[int]string{400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
			404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 529: "overloaded_error"}[status]
		if typ == "" && status < 500 {
			typ = "invalid_request_error"
		} else if typ == "" {
			typ = "api_error"
		}
		body = obj{"type": "error", "error": obj{"type": typ, "message": msg}}
	} else {
		typ, code := "invalid_request_error", any(nil)
		switch {
		case status == 401:
			code = "invalid_api_key"
		case status == 429:
			typ, code = "requests", "rate_limit_exceeded"
		case status >= 500:
			typ = "server_error"
		}
		body = obj{"error": obj{"message": msg, "type": typ, "param": nil, "code": code}}
	}
	_, _ = w.Write(marshal(body))
}

// wireRequest is the union of the request fields of both vendors that the
// server reads; each vendor simply leaves the other's fields empty.
type wireRequest struct {
	Model         string `json:"model"`
	Stream        bool   `json:"stream"`
	StreamOptions struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	MaxTokens           int64           `json:"max_tokens"`
	MaxCompletionTokens int64           `json:"max_completion_tokens"`
	System              json.RawMessage `json:"system"`
	Tools               []struct {
		Name     string `json:"name"`
		Function struct {
			Name string `json:"name"`
		} `json:"function"`
		Custom struct {
			Name string `json:"name"`
		} `json:"custom"`
	} `json:"tools"`
	Messages []struct {
		Role       string          `json:"role"`
		Content    json.RawMessage `json:"content"`
		ToolCallID string          `json:"tool_call_id"`
	} `json:"messages"`
}

// wireBlock is a content block or part of either vendor.
type wireBlock struct {
	Type      string          `json:"type"`
	Text      string          `json:"text"`
	ToolUseID string          `json:"tool_use_id"`
	Content   json.RawMessage `json:"content"`
	IsError   bool            `json:"is_error"`
}

func (wr *wireRequest) request(vendor string, body []byte) Request {
	req := Request{Vendor: vendor, Stream: wr.Stream, Model: wr.Model, Body: body,
		MaxTokens: max(wr.MaxTokens, wr.MaxCompletionTokens)}
	for _, t := range wr.Tools {
		req.Tools = append(req.Tools, cmp.Or(t.Name, t.Function.Name, t.Custom.Name))
	}
	system := []string{}
	if len(wr.System) > 0 {
		system = append(system, text(wr.System))
	}
	last := -1
	for i, m := range wr.Messages {
		switch m.Role {
		case "assistant":
			req.Turn++
			last = i
		case "system", "developer":
			system = append(system, text(m.Content))
		case "user":
			if req.Prompt == "" {
				req.Prompt = text(m.Content)
			}
		}
	}
	req.System = strings.Join(system, "\n")
	for _, m := range wr.Messages[last+1:] {
		if m.Role == "tool" {
			req.Results = append(req.Results, Result{CallID: m.ToolCallID, Content: text(m.Content)})
		}
		for _, b := range blocks(m.Content) {
			if b.Type == "tool_result" {
				req.Results = append(req.Results, Result{CallID: b.ToolUseID, Content: text(b.Content), IsError: b.IsError})
			}
		}
	}
	return req
}

// blocks decodes content given as a list of blocks; string content has none.
func blocks(raw json.RawMessage) []wireBlock {
	var bs []wireBlock
	_ = json.Unmarshal(raw, &bs)
	return bs
}

// text is the text of content that is either a string or a list of blocks,
// the blocks' texts joined by newlines.
func text(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var parts []string
	for _, b := range blocks(raw) {
		if b.Type == "text" {
			parts = append(parts, b.Text)
		}
	}
	return strings.Join(parts, "\n")
}

type obj = map[string]any

// event is one SSE event; name is empty for OpenAI, which sends data lines only.
type event struct {
	name string
	data []byte
}

func ev(name string, v any) event { return event{name, marshal(v)} }

// marshal encodes as the real APIs do, leaving <, > and & unescaped.
func marshal(v any) []byte {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
	return bytes.TrimSuffix(b.Bytes(), []byte("\n"))
}

// answer renders a Reply in one vendor's format.
type answer struct {
	Reply
	vendor, model string
	turn          int
	created, seq  int64
	includeUsage  bool
	// lastPart is how many events a cut stream sends (set by events).
	lastPart int
}

func (a *answer) calls() []Call {
	out := slices.Clone(a.Calls)
	for i := range out {
		if out[i].ID == "" {
			prefix := map[string]string{OpenAI: "call", Anthropic: "toolu"}[a.vendor]
			out[i].ID = fmt.Sprintf("%s_%d_%d", prefix, a.turn, i)
		}
		if out[i].Args == "" {
			out[i].Args = "{}"
		}
	}
	return out
}

// finishes pairs the OpenAI and Anthropic spellings of the same stop reason.
var finishes = [][2]string{{"stop", "end_turn"}, {"length", "max_tokens"}, {"tool_calls", "tool_use"}, {"content_filter", "refusal"}}

func (a *answer) finish() string {
	f := a.Finish
	if f == "" {
		f = "stop"
		if len(a.Calls) > 0 {
			f = "tool_calls"
		}
	}
	for _, pair := range finishes {
		if f == pair[0] || f == pair[1] {
			return pair[map[string]int{OpenAI: 0, Anthropic: 1}[a.vendor]]
		}
	}
	return f
}

func (a *answer) id() string {
	if a.vendor == Anthropic {
		return fmt.Sprintf("msg_%03d", a.seq)
	}
	return fmt.Sprintf("chatcmpl-%03d", a.seq)
}

func (a *answer) openAIUsage() obj {
	u := a.Usage
	return obj{"prompt_tokens": u.Input, "completion_tokens": u.Output, "total_tokens": u.Input + u.Output,
		"prompt_tokens_details": obj{"cached_tokens": u.Cached}}
}

func (a *answer) anthropicUsage(output int64) obj {
	u := a.Usage
	return obj{"input_tokens": u.Input - u.Cached, "output_tokens": output,
		"cache_read_input_tokens": u.Cached, "cache_creation_input_tokens": 0}
}

// message is the non-streaming answer.
func (a *answer) message() obj {
	if a.vendor == Anthropic {
		content := []obj{}
		if a.Text != "" {
			content = append(content, obj{"type": "text", "text": a.Text})
		}
		for _, c := range a.calls() {
			input := json.RawMessage(c.Args)
			if !json.Valid(input) {
				input = json.RawMessage("{}") // the real API only ever sends an object
			}
			content = append(content, obj{"type": "tool_use", "id": c.ID, "name": c.Name, "input": input})
		}
		return obj{"id": a.id(), "type": "message", "role": "assistant", "model": a.model, "content": content,
			"stop_reason": a.finish(), "stop_sequence": nil, "usage": a.anthropicUsage(a.Usage.Output)}
	}
	msg := obj{"role": "assistant", "content": nil, "refusal": nil}
	if a.Text != "" {
		msg["content"] = a.Text
	}
	var calls []obj
	for _, c := range a.calls() {
		calls = append(calls, obj{"id": c.ID, "type": "function", "function": obj{"name": c.Name, "arguments": c.Args}})
	}
	if len(calls) > 0 {
		msg["tool_calls"] = calls
	}
	return obj{"id": a.id(), "object": "chat.completion", "created": a.created, "model": a.model,
		"choices": []obj{{"index": 0, "message": msg, "logprobs": nil, "finish_reason": a.finish()}},
		"usage":   a.openAIUsage()}
}

// events is the streaming answer; the first firstPart events (the start and
// the first text delta) are what a stalled or dropped stream sends.
func (a *answer) events() (events []event, firstPart int) {
	if a.vendor == Anthropic {
		return a.anthropicEvents()
	}
	return a.openAIEvents()
}

func (a *answer) openAIEvents() ([]event, int) {
	base := func() obj {
		c := obj{"id": a.id(), "object": "chat.completion.chunk", "created": a.created, "model": a.model}
		if a.includeUsage {
			c["usage"] = nil // as the real API does on every chunk but the last
		}
		return c
	}
	var evs []event
	chunk := func(delta obj, finish any) {
		c := base()
		c["choices"] = []obj{{"index": 0, "delta": delta, "logprobs": nil, "finish_reason": finish}}
		evs = append(evs, ev("", c))
	}
	role := obj{"role": "assistant", "content": nil, "refusal": nil}
	firstPart := 1
	if a.Text != "" {
		role["content"], firstPart = "", 2
	}
	chunk(role, nil)
	for _, p := range pieces(a.Text) {
		chunk(obj{"content": p}, nil)
	}
	for i, c := range a.calls() {
		call := obj{"index": i, "id": c.ID, "type": "function", "function": obj{"name": c.Name, "arguments": ""}}
		if a.NoType {
			delete(call, "type")
		}
		chunk(obj{"tool_calls": []obj{call}}, nil)
		for _, p := range pieces(c.Args) {
			chunk(obj{"tool_calls": []obj{{"index": i, "function": obj{"arguments": p}}}}, nil)
		}
	}
	a.lastPart = len(evs)
	chunk(obj{}, a.finish())
	if a.includeUsage {
		c := base()
		c["choices"], c["usage"] = []obj{}, a.openAIUsage()
		evs = append(evs, ev("", c))
	}
	return append(evs, event{data: []byte("[DONE]")}), firstPart
}

func (a *answer) anthropicEvents() ([]event, int) {
	var evs []event
	add := func(typ string, v obj) {
		v["type"] = typ
		evs = append(evs, ev(typ, v))
	}
	index := 0
	block := func(start obj, deltas []obj) {
		add("content_block_start", obj{"index": index, "content_block": start})
		for _, d := range deltas {
			add("content_block_delta", obj{"index": index, "delta": d})
		}
		add("content_block_stop", obj{"index": index})
		index++
	}
	add("message_start", obj{"message": obj{"id": a.id(), "type": "message", "role": "assistant", "model": a.model,
		"content": []obj{}, "stop_reason": nil, "stop_sequence": nil, "usage": a.anthropicUsage(min(a.Usage.Output, 1))}})
	add("ping", obj{})
	if a.Unknown {
		add("server_future_event", obj{"detail": "an event type newer than the client"})
	}
	firstPart := 1
	if a.Text != "" {
		firstPart = len(evs) + 2 // its content_block_start and first delta
		var deltas []obj
		for _, p := range pieces(a.Text) {
			deltas = append(deltas, obj{"type": "text_delta", "text": p})
		}
		block(obj{"type": "text", "text": ""}, deltas)
	}
	if a.Unknown {
		block(obj{"type": "server_future_block", "data": "opaque"}, nil)
	}
	for _, c := range a.calls() {
		var deltas []obj
		for _, p := range pieces(c.Args) {
			deltas = append(deltas, obj{"type": "input_json_delta", "partial_json": p})
		}
		block(obj{"type": "tool_use", "id": c.ID, "name": c.Name, "input": obj{}}, deltas)
	}
	a.lastPart = len(evs)
	add("message_delta", obj{"delta": obj{"stop_reason": a.finish(), "stop_sequence": nil},
		"usage": obj{"output_tokens": a.Usage.Output}})
	add("message_stop", obj{})
	return evs, firstPart
}

// pieces cuts s into up to three pieces at rune boundaries (two or more when
// it has two runes or more), so clients must concatenate deltas.
func pieces(s string) []string {
	runes := []rune(s)
	size := max(1, (len(runes)+2)/3)
	var out []string
	for len(runes) > 0 {
		n := min(size, len(runes))
		out = append(out, string(runes[:n]))
		runes = runes[n:]
	}
	return out
}

// streamError is the event an API sends when it fails mid-stream.
func (a *answer) streamError(typ string) event {
	body := obj{"message": "stream failed: " + typ, "type": typ, "param": nil, "code": nil}
	if a.vendor == Anthropic {
		return ev("error", obj{"type": "error", "error": obj{"type": typ, "message": "stream failed: " + typ}})
	}
	return ev("", obj{"error": body})
}
