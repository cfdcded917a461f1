package modelserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"strings"
	"testing"

	"github.com/anthropics/anthropic-sdk-go/v2"
	aoption "github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/openai/openai-go/v3"
	ooption "github.com/openai/openai-go/v3/option"
)

// The first turn of the conversation scripts: text and two parallel tool calls
// (one id given, one generated), with cached input tokens.
var toolTurn = Reply{
	Text:  "Let me look at <a> & <b>.",
	Calls: []Call{{Name: "read", Args: `{"path":"a.txt"}`}, {ID: "given_1", Name: "grep", Args: `{"pattern":"x","n":2}`}},
	Usage: Usage{Input: 100, Output: 20, Cached: 40},
}

func openAIClient(url, key string) openai.Client {
	return openai.NewClient(ooption.WithBaseURL(url), ooption.WithAPIKey(key), ooption.WithMaxRetries(0))
}

func anthropicClient(url, key string) anthropic.Client {
	return anthropic.NewClient(aoption.WithBaseURL(url), aoption.WithAPIKey(key), aoption.WithMaxRetries(0))
}

// openAIComplete runs one chat completion, accumulating the chunks when streaming.
func openAIComplete(ctx context.Context, t *testing.T, c openai.Client, stream bool, p openai.ChatCompletionNewParams) (*openai.ChatCompletion, error) {
	t.Helper()
	if !stream {
		return c.Chat.Completions.New(ctx, p)
	}
	p.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
	s := c.Chat.Completions.NewStreaming(ctx, p)
	defer s.Close()
	var acc openai.ChatCompletionAccumulator
	for s.Next() {
		if !acc.AddChunk(s.Current()) {
			t.Fatalf("chunk not accumulated: %s", s.Current().RawJSON())
		}
	}
	return &acc.ChatCompletion, s.Err()
}

// anthropicCreate runs one message creation, accumulating the events when streaming.
func anthropicCreate(ctx context.Context, t *testing.T, c anthropic.Client, stream bool, p anthropic.MessageNewParams) (*anthropic.Message, error) {
	t.Helper()
	if !stream {
		return c.Messages.New(ctx, p)
	}
	s := c.Messages.NewStreaming(ctx, p)
	defer s.Close()
	var msg anthropic.Message
	for s.Next() {
		if err := msg.Accumulate(s.Current()); err != nil {
			t.Fatalf("accumulate: %v", err)
		}
	}
	return &msg, s.Err()
}

func TestOpenAIConversation(t *testing.T) {
	s := New(t)
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprintf("stream=%v", stream), func(t *testing.T) {
			name := fmt.Sprintf("oa-%v", stream)
			s.Add(name, Script{Replies: []Reply{toolTurn, {Text: "All good.", Usage: Usage{Input: 7, Output: 3}}}})
			c := openAIClient(s.OpenAIURL(name), "k1")
			p := openai.ChatCompletionNewParams{
				Model:               "gpt-test",
				MaxCompletionTokens: openai.Int(321),
				Messages:            []openai.ChatCompletionMessageParamUnion{openai.SystemMessage("be brief"), openai.UserMessage("look")},
				Tools: []openai.ChatCompletionToolUnionParam{
					openai.ChatCompletionFunctionTool(openai.FunctionDefinitionParam{Name: "read"}),
					openai.ChatCompletionFunctionTool(openai.FunctionDefinitionParam{Name: "grep"}),
				},
			}
			cc, err := openAIComplete(t.Context(), t, c, stream, p)
			if err != nil {
				t.Fatal(err)
			}
			ch := cc.Choices[0]
			if ch.Message.Content != toolTurn.Text || ch.FinishReason != "tool_calls" || cc.Model != "gpt-test" {
				t.Errorf("got content %q finish %q model %q", ch.Message.Content, ch.FinishReason, cc.Model)
			}
			var got []string
			for _, tc := range ch.Message.ToolCalls {
				got = append(got, tc.ID+" "+tc.Type+" "+tc.Function.Name+" "+tc.Function.Arguments)
			}
			want := []string{`call_0_0 function read {"path":"a.txt"}`, `given_1 function grep {"pattern":"x","n":2}`}
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("tool calls %q, want %q", got, want)
			}
			u := cc.Usage
			if u.PromptTokens != 100 || u.CompletionTokens != 20 || u.TotalTokens != 120 || u.PromptTokensDetails.CachedTokens != 40 {
				t.Errorf("usage %+v", u)
			}

			p.Messages = append(p.Messages, ch.Message.ToParam(),
				openai.ToolMessage("contents of a", "call_0_0"), openai.ToolMessage("x matches", "given_1"))
			cc, err = openAIComplete(t.Context(), t, c, stream, p)
			if err != nil {
				t.Fatal(err)
			}
			if ch := cc.Choices[0]; ch.Message.Content != "All good." || ch.FinishReason != "stop" || len(ch.Message.ToolCalls) != 0 {
				t.Errorf("second turn %+v", ch.Message)
			}
			p.Messages = append(p.Messages, cc.Choices[0].Message.ToParam(), openai.UserMessage("more"))
			if cc, err = openAIComplete(t.Context(), t, c, stream, p); err != nil || cc.Choices[0].Message.Content != "done." {
				t.Errorf("turn past the script: %v %+v", err, cc)
			}

			reqs := s.Requests(name)
			if len(reqs) != 3 {
				t.Fatalf("%d requests", len(reqs))
			}
			r := reqs[1]
			if r.Vendor != OpenAI || r.Turn != 1 || r.Stream != stream || r.Model != "gpt-test" || r.APIKey != "k1" ||
				r.MaxTokens != 321 || r.System != "be brief" || fmt.Sprint(r.Tools) != "[read grep]" {
				t.Errorf("request %+v", r)
			}
			wantResults := []Result{{CallID: "call_0_0", Content: "contents of a"}, {CallID: "given_1", Content: "x matches"}}
			if fmt.Sprint(r.Results) != fmt.Sprint(wantResults) {
				t.Errorf("results %+v, want %+v", r.Results, wantResults)
			}
			if reqs[0].Turn != 0 || len(reqs[0].Results) != 0 || reqs[2].Turn != 2 || len(reqs[2].Results) != 0 {
				t.Errorf("turns/results %+v %+v", reqs[0], reqs[2])
			}
			if !json.Valid(r.Body) {
				t.Errorf("body %s", r.Body)
			}
		})
	}
}

func TestAnthropicConversation(t *testing.T) {
	s := New(t)
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprintf("stream=%v", stream), func(t *testing.T) {
			name := fmt.Sprintf("an-%v", stream)
			s.Add(name, Script{Replies: []Reply{toolTurn, {Text: "All good.", Finish: "length"}}})
			c := anthropicClient(s.AnthropicURL(name), "k2")
			schema := anthropic.ToolInputSchemaParam{Properties: map[string]any{}}
			p := anthropic.MessageNewParams{
				Model:     "claude-test",
				MaxTokens: 123,
				System:    []anthropic.TextBlockParam{{Text: "be brief"}},
				Messages:  []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("look"))},
				Tools:     []anthropic.ToolUnionParam{anthropic.ToolUnionParamOfTool(schema, "read"), anthropic.ToolUnionParamOfTool(schema, "grep")},
			}
			msg, err := anthropicCreate(t.Context(), t, c, stream, p)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, b := range msg.Content {
				switch b.Type {
				case "text":
					got = append(got, "text "+b.Text)
				case "tool_use":
					got = append(got, "tool_use "+b.ID+" "+b.Name+" "+string(b.Input))
				default:
					got = append(got, b.Type)
				}
			}
			want := []string{"text " + toolTurn.Text, `tool_use toolu_0_0 read {"path":"a.txt"}`, `tool_use given_1 grep {"pattern":"x","n":2}`}
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("content %q, want %q", got, want)
			}
			u := msg.Usage
			if msg.StopReason != "tool_use" || msg.Model != "claude-test" || u.InputTokens != 60 || u.CacheReadInputTokens != 40 ||
				u.OutputTokens != 20 || u.CacheCreationInputTokens != 0 {
				t.Errorf("stop %q model %q usage %+v", msg.StopReason, msg.Model, u)
			}

			p.Messages = append(p.Messages, msg.ToParam(), anthropic.NewUserMessage(
				anthropic.NewToolResultBlock("toolu_0_0", "contents of a", false),
				anthropic.NewToolResultBlock("given_1", "no such pattern", true)))
			msg, err = anthropicCreate(t.Context(), t, c, stream, p)
			if err != nil {
				t.Fatal(err)
			}
			if len(msg.Content) != 1 || msg.Content[0].Text != "All good." || msg.StopReason != "max_tokens" {
				t.Errorf("second turn %+v", msg)
			}

			reqs := s.Requests(name)
			if len(reqs) != 2 {
				t.Fatalf("%d requests", len(reqs))
			}
			r := reqs[1]
			if r.Vendor != Anthropic || r.Turn != 1 || r.Stream != stream || r.Model != "claude-test" || r.APIKey != "k2" ||
				r.MaxTokens != 123 || r.System != "be brief" || fmt.Sprint(r.Tools) != "[read grep]" {
				t.Errorf("request %+v", r)
			}
			wantResults := []Result{{CallID: "toolu_0_0", Content: "contents of a"}, {CallID: "given_1", Content: "no such pattern", IsError: true}}
			if fmt.Sprint(r.Results) != fmt.Sprint(wantResults) {
				t.Errorf("results %+v, want %+v", r.Results, wantResults)
			}
		})
	}
}

func TestAnthropicUnknownEvents(t *testing.T) {
	s := New(t)
	s.Add("future", Script{Replies: []Reply{{Text: "hi there", Calls: []Call{{Name: "read"}}, Unknown: true}}})
	c := anthropicClient(s.AnthropicURL("future"), "k")
	st := c.Messages.NewStreaming(t.Context(), anthropic.MessageNewParams{Model: "m", MaxTokens: 10,
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("hi"))}})
	defer st.Close()
	var msg anthropic.Message
	var types []string
	for st.Next() {
		types = append(types, st.Current().Type)
		if err := msg.Accumulate(st.Current()); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.Err(); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(strings.Join(types, " "), "server_future_event") {
		t.Errorf("no unknown event among %v", types)
	}
	var blocks []string
	for _, b := range msg.Content {
		blocks = append(blocks, b.Type)
	}
	if fmt.Sprint(blocks) != "[text server_future_block tool_use]" || msg.Content[0].Text != "hi there" ||
		string(msg.Content[2].Input) != "{}" || msg.Content[2].ID != "toolu_0_0" {
		t.Errorf("blocks %v: %+v", blocks, msg.Content)
	}
}

// ask makes one single-message request of the given vendor and returns the
// text it got (up to an error).
type ask func(ctx context.Context, t *testing.T, s *Server, name, key string) (string, error)

var askers = map[string]ask{
	"openai": func(ctx context.Context, t *testing.T, s *Server, name, key string) (string, error) {
		return askOpenAI(ctx, t, s, name, key, false)
	},
	"openai-stream": func(ctx context.Context, t *testing.T, s *Server, name, key string) (string, error) {
		return askOpenAI(ctx, t, s, name, key, true)
	},
	"anthropic": func(ctx context.Context, t *testing.T, s *Server, name, key string) (string, error) {
		return askAnthropic(ctx, t, s, name, key, false)
	},
	"anthropic-stream": func(ctx context.Context, t *testing.T, s *Server, name, key string) (string, error) {
		return askAnthropic(ctx, t, s, name, key, true)
	},
}

func askOpenAI(ctx context.Context, t *testing.T, s *Server, name, key string, stream bool) (string, error) {
	cc, err := openAIComplete(ctx, t, openAIClient(s.OpenAIURL(name), key), stream, openai.ChatCompletionNewParams{
		Model: "m", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}})
	if cc == nil || len(cc.Choices) == 0 {
		return "", err
	}
	return cc.Choices[0].Message.Content, err
}

func askAnthropic(ctx context.Context, t *testing.T, s *Server, name, key string, stream bool) (string, error) {
	msg, err := anthropicCreate(ctx, t, anthropicClient(s.AnthropicURL(name), key), stream, anthropic.MessageNewParams{
		Model: "m", MaxTokens: 10, Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("hi"))}})
	var text string
	if msg != nil {
		for _, b := range msg.Content {
			text += b.Text
		}
	}
	return text, err
}

// apiError extracts the status, error type, and response of either SDK's API error.
func apiError(err error) (status int, typ string, header http.Header) {
	var oe *openai.Error
	var ae *anthropic.Error
	switch {
	case errors.As(err, &oe):
		return oe.StatusCode, oe.Type, oe.Response.Header
	case errors.As(err, &ae):
		return ae.StatusCode, string(ae.Type()), ae.Response.Header
	}
	return 0, "", nil
}

func TestFailThenSucceed(t *testing.T) {
	s := New(t)
	for kind, ask := range askers {
		t.Run(kind, func(t *testing.T) {
			fail := &Failure{Status: 429, RetryAfter: "7", Message: "slow down", Times: 1}
			wantType := "requests"
			if strings.HasPrefix(kind, "anthropic") {
				fail.Status = 529
				wantType = "overloaded_error"
			}
			name := "fail-" + kind
			s.Add(name, Script{Replies: []Reply{{Text: "ok now", Fail: fail}}})
			_, err := ask(t.Context(), t, s, name, "k")
			if status, typ, h := apiError(err); status != fail.Status || typ != wantType || h.Get("Retry-After") != "7" {
				t.Fatalf("first attempt: %v (status %d type %q)", err, status, typ)
			}
			if text, err := ask(t.Context(), t, s, name, "k"); err != nil || text != "ok now" {
				t.Fatalf("second attempt: %q %v", text, err)
			}
		})
	}
}

func TestAlwaysFail(t *testing.T) {
	s := New(t)
	s.Add("down", Script{Replies: []Reply{{Fail: &Failure{Status: 500}}}})
	for range 3 {
		_, err := askers["anthropic"](t.Context(), t, s, "down", "k")
		if status, typ, _ := apiError(err); status != 500 || typ != "api_error" {
			t.Fatalf("want a 500 api_error, got %v", err)
		}
	}
}

func TestKey(t *testing.T) {
	s := New(t)
	for kind, ask := range askers {
		t.Run(kind, func(t *testing.T) {
			name := "key-" + kind
			s.Add(name, Script{Key: "right", Replies: []Reply{{Text: "welcome"}}})
			_, err := ask(t.Context(), t, s, name, "wrong")
			wantType := map[bool]string{true: "authentication_error", false: "invalid_request_error"}[strings.HasPrefix(kind, "anthropic")]
			if status, typ, _ := apiError(err); status != 401 || typ != wantType {
				t.Fatalf("wrong key: %v (status %d type %q)", err, status, typ)
			}
			if text, err := ask(t.Context(), t, s, name, "right"); err != nil || text != "welcome" {
				t.Fatalf("right key: %q %v", text, err)
			}
			if reqs := s.Requests(name); len(reqs) != 2 || reqs[0].APIKey != "wrong" || reqs[1].APIKey != "right" {
				t.Errorf("requests %+v", reqs)
			}
		})
	}
}

func TestDrop(t *testing.T) {
	s := New(t)
	for kind, ask := range askers {
		t.Run(kind, func(t *testing.T) {
			name := "drop-" + kind
			s.Add(name, Script{Replies: []Reply{{Text: "abcdef", Drop: true}}})
			text, err := ask(t.Context(), t, s, name, "k")
			if err == nil {
				t.Fatalf("dropped attempt succeeded with %q", text)
			}
			if status, _, _ := apiError(err); status != 0 {
				t.Fatalf("dropped attempt gave an API error: %v", err)
			}
			if strings.HasSuffix(kind, "stream") && (text != "ab" || !errors.Is(err, io.ErrUnexpectedEOF)) {
				t.Errorf("cut stream: text %q err %v; want the first part and an unexpected EOF", text, err)
			}
			if text, err := ask(t.Context(), t, s, name, "k"); err != nil || text != "abcdef" {
				t.Fatalf("second attempt: %q %v", text, err)
			}
		})
	}
}

// hooked returns a server whose handler milestones arrive on the channel.
func hooked(t *testing.T) (*Server, <-chan string) {
	s := New(t)
	events := make(chan string, 64)
	s.mu.Lock()
	s.hook = func(e string) { events <- e }
	s.mu.Unlock()
	return s, events
}

func await(t *testing.T, events <-chan string, want string) {
	t.Helper()
	if got := <-events; got != want {
		t.Fatalf("handler event %q, want %q", got, want)
	}
}

func TestStallNonStreaming(t *testing.T) {
	for _, kind := range []string{"openai", "anthropic"} {
		t.Run(kind, func(t *testing.T) {
			s, events := hooked(t)
			s.Add("stall", Script{Replies: []Reply{{Text: "never", Stall: true}}})
			ctx, cancel := context.WithCancel(t.Context())
			errc := make(chan error, 1)
			go func() {
				_, err := askers[kind](ctx, t, s, "stall", "k")
				errc <- err
			}()
			await(t, events, "stall")
			cancel()
			await(t, events, "return")
			if err := <-errc; !errors.Is(err, context.Canceled) {
				t.Fatalf("got %v, want context.Canceled", err)
			}
		})
	}
}

// stallStream opens a stalled stream of the given vendor and reads up to its
// first text delta; next reads on, reporting whether an event arrived.
func stallStream(ctx context.Context, t *testing.T, s *Server, kind string) (next func() bool, err func() error) {
	t.Helper()
	s.Add("stall", Script{Replies: []Reply{{Text: "abcdef", Stall: true}}})
	var first string
	if kind == "openai" {
		c := openAIClient(s.OpenAIURL("stall"), "k")
		st := c.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{
			Model: "m", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}})
		t.Cleanup(func() { st.Close() })
		for first == "" && st.Next() {
			if ch := st.Current().Choices; len(ch) > 0 {
				first = ch[0].Delta.Content
			}
		}
		next, err = st.Next, st.Err
	} else {
		c := anthropicClient(s.AnthropicURL("stall"), "k")
		st := c.Messages.NewStreaming(ctx, anthropic.MessageNewParams{
			Model: "m", MaxTokens: 10, Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("hi"))}})
		t.Cleanup(func() { st.Close() })
		for first == "" && st.Next() {
			first = st.Current().Delta.Text
		}
		next, err = st.Next, st.Err
	}
	if first != "ab" {
		t.Fatalf("first delta %q (%v), want \"ab\"", first, err())
	}
	return next, err
}

func TestStallStreamingCancel(t *testing.T) {
	for _, kind := range []string{"openai", "anthropic"} {
		t.Run(kind, func(t *testing.T) {
			s, events := hooked(t)
			ctx, cancel := context.WithCancel(t.Context())
			next, errf := stallStream(ctx, t, s, kind)
			await(t, events, "stall")
			cancel()
			if next() {
				t.Fatal("stalled stream went on")
			}
			if err := errf(); !errors.Is(err, context.Canceled) {
				t.Errorf("got %v, want context.Canceled", err)
			}
			await(t, events, "return")
		})
	}
}

func TestStallReleasedByClose(t *testing.T) {
	for _, kind := range []string{"openai", "anthropic"} {
		t.Run(kind, func(t *testing.T) {
			s, events := hooked(t)
			next, _ := stallStream(t.Context(), t, s, kind)
			await(t, events, "stall")
			s.close() // must not hang although the client still waits
			await(t, events, "return")
			if next() {
				t.Fatal("stalled stream went on after close")
			}
		})
	}
}

func TestNotFoundAndMalformed(t *testing.T) {
	s := New(t)
	s.Add("known", Script{})
	for kind, ask := range askers {
		_, err := ask(t.Context(), t, s, "unknown", "k")
		wantType := map[bool]string{true: "not_found_error", false: "invalid_request_error"}[strings.HasPrefix(kind, "anthropic")]
		if status, typ, _ := apiError(err); status != 404 || typ != wantType {
			t.Errorf("%s unknown script: %v (status %d type %q)", kind, err, status, typ)
		}
	}
	for _, tc := range []struct{ url, errKey string }{
		{s.OpenAIURL("known") + "/chat/completions", `"error":{`},
		{s.AnthropicURL("known") + "/v1/messages", `"type":"error"`},
		{s.URL() + "/known/v2/chat", `"error":{`},
	} {
		res, err := http.Post(tc.url, "application/json", strings.NewReader(`{"model":`))
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		want := http.StatusBadRequest
		if strings.Contains(tc.url, "/v2/") {
			want = http.StatusNotFound
		}
		if res.StatusCode != want || !strings.Contains(string(body), tc.errKey) {
			t.Errorf("%s: %d %s", tc.url, res.StatusCode, body)
		}
	}
	if n := len(s.Requests("known")); n != 2 {
		t.Errorf("%d malformed requests recorded, want 2", n)
	}
}

// fatalTB records Fatalf instead of failing the real test.
type fatalTB struct {
	testing.TB
	msg chan string
}

func (f fatalTB) Helper() {}
func (f fatalTB) Fatalf(format string, args ...any) {
	f.msg <- fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func TestAddRejects(t *testing.T) {
	f := fatalTB{TB: t, msg: make(chan string, 1)}
	s := New(f)
	s.Add("ok-1", Script{})
	for _, name := range []string{"ok-1", "Bad", "a/b", ""} {
		done := make(chan struct{})
		go func() {
			defer close(done)
			s.Add(name, Script{})
		}()
		<-done
		select {
		case <-f.msg:
		default:
			t.Errorf("Add(%q) accepted", name)
		}
	}
}
