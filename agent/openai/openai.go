// Package openai is the agent backend for any model behind an
// OpenAI-compatible Chat Completions API (OpenAI, vLLM, llama.cpp's
// server, Ollama, OpenRouter): loopbus calls the model itself through the
// official SDK, streams its replies, runs the tools it calls in the job's
// directory (see modelapi) and answers it, turn after turn.
package openai

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/loopbus/loopbus/agent"
	"github.com/loopbus/loopbus/agent/modelapi"
	"github.com/loopbus/loopbus/schemas"
	oai "github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/packages/ssestream"
	"github.com/openai/openai-go/v3/shared"
)

// vendor is the backend's name and the variables it reads by default.
var vendor = modelapi.Vendor{Name: schemas.BackendOpenAI, KeyEnv: "OPENAI_API_KEY", BaseURLEnv: "OPENAI_BASE_URL", ModelEnv: "OPENAI_MODEL"}

// Backend calls an OpenAI-compatible API. The zero value is ready to use.
// Its options and its tools' plan and lanes are modelapi.Options'.
type Backend struct{ modelapi.Options }

var (
	_ agent.Backend       = Backend{}
	_ agent.ToolPlanner   = Backend{}
	_ agent.LaneDefaulter = Backend{}
)

// Run implements agent.Backend: see modelapi.Run. Its error is the job's
// setup's (no API key, a bad base URL, a directory that cannot be opened).
func (b Backend) Run(ctx context.Context, job agent.Job, emit func(agent.Event)) (agent.Result, error) {
	setup, err := modelapi.Prepare(job, vendor)
	if err != nil {
		return agent.Result{ExitCode: -1}, err
	}
	defer setup.Tools.Close()
	base := setup.Endpoint.BaseURL
	if base == "" {
		base = publicAPI
	}
	// The SDK also reads the worker process's own OPENAI_* variables (a
	// base URL, an organization, a project, extra headers): the job's
	// setup decides alone, so the base URL is always given, and only the
	// headers the SDK itself sets go out.
	opts := []option.RequestOption{option.WithMaxRetries(0), option.WithBaseURL(base), option.WithAPIKey(setup.Endpoint.APIKey),
		option.WithMiddleware(ownHeadersOnly(setup.Endpoint.APIKey != "")),
		option.WithHTTPClient(modelapi.HTTPClient(b.HTTPClient))}
	s := job.Spec
	params := oai.ChatCompletionNewParams{
		Model:    shared.ChatModel(setup.Model),
		Messages: []oai.ChatCompletionMessageParamUnion{oai.SystemMessage(setup.System), oai.UserMessage(job.Prompt)},
	}
	// OpenAI's own API wants max_completion_tokens (its reasoning models
	// refuse max_tokens); compatible servers know max_tokens.
	if strings.HasPrefix(base, publicAPI) {
		params.MaxCompletionTokens = oai.Int(setup.MaxTokens)
	} else {
		params.MaxTokens = oai.Int(setup.MaxTokens)
	}
	for _, d := range setup.Tools.Defs() {
		params.Tools = append(params.Tools, oai.ChatCompletionFunctionTool(shared.FunctionDefinitionParam{
			Name: d.Name, Description: oai.String(d.Description), Parameters: shared.FunctionParameters(d.Parameters),
		}))
	}
	if !s.NoStream {
		params.StreamOptions = oai.ChatCompletionStreamOptionsParam{IncludeUsage: oai.Bool(true)}
	}
	m := &model{client: oai.NewClient(opts...), params: params, stream: !s.NoStream}
	return modelapi.Run(ctx, setup.Retrying(b.Loop), job, m, setup.Tools, emit), nil
}

// publicAPI is OpenAI's API, the SDK's default base URL.
const publicAPI = "https://api.openai.com/v1/"

// ownHeadersOnly is a middleware that lets through only the headers the
// SDK sets for a request (and the key's, when there is one), so that none
// the worker's environment added (OPENAI_ORG_ID, OPENAI_PROJECT_ID,
// OPENAI_CUSTOM_HEADERS) reaches a pipeline's server.
func ownHeadersOnly(withKey bool) option.Middleware {
	return func(r *http.Request, next option.MiddlewareNext) (*http.Response, error) {
		for name := range r.Header {
			switch c := http.CanonicalHeaderKey(name); {
			case c == "Authorization" && withKey, c == "Content-Type", c == "Content-Length", c == "Accept",
				c == "Accept-Encoding", c == "User-Agent", c == "Idempotency-Key", strings.HasPrefix(c, "X-Stainless-"):
			default:
				r.Header.Del(name)
			}
		}
		return next(r)
	}
}

// model is one conversation: params holds its messages so far.
type model struct {
	client oai.Client
	params oai.ChatCompletionNewParams
	stream bool
}

func (m *model) Answer(results []modelapi.Answer) {
	for _, r := range results {
		out := r.Output
		if r.IsError {
			out = "Error: " + out
		}
		m.params.Messages = append(m.params.Messages, oai.ToolMessage(out, r.CallID))
	}
}

func (m *model) Next(ctx context.Context, text func(string)) (modelapi.Turn, error) {
	var (
		msg    oai.ChatCompletionMessage
		usage  oai.CompletionUsage
		finish string
	)
	if m.stream {
		var err error
		if msg, usage, finish, err = m.streamed(ctx, text); err != nil {
			return modelapi.Turn{}, err
		}
	} else {
		c, err := m.client.Chat.Completions.New(ctx, m.params)
		if err != nil {
			return modelapi.Turn{}, apiError(err)
		}
		if len(c.Choices) == 0 {
			return modelapi.Turn{}, errors.New("the API's reply has no choice")
		}
		msg, usage, finish = c.Choices[0].Message, c.Usage, c.Choices[0].FinishReason
		if msg.Content != "" {
			text(msg.Content)
		}
	}
	if msg.Refusal != "" {
		text(msg.Refusal)
	}
	t := modelapi.Turn{Truncated: finish == "length", Usage: agent.Usage{
		InputTokens:     usage.PromptTokens - usage.PromptTokensDetails.CachedTokens,
		CacheReadTokens: usage.PromptTokensDetails.CachedTokens,
		OutputTokens:    usage.CompletionTokens,
	}}
	calls := msg.ToolCalls[:0]
	for _, tc := range msg.ToolCalls {
		if tc.Type != "" && tc.Type != "function" {
			continue // custom tools are never offered
		}
		// Servers that leave the type out would get the call back as
		// null, which they refuse.
		tc.Type = "function"
		calls = append(calls, tc)
		t.Calls = append(t.Calls, modelapi.Call{ID: tc.ID, Name: tc.Function.Name, Args: tc.Function.Arguments})
	}
	msg.ToolCalls = calls
	m.params.Messages = append(m.params.Messages, msg.ToParam())
	return t, nil
}

// streamed asks for a streamed reply and returns it accumulated, calling
// text with each piece of content as it is complete.
func (m *model) streamed(ctx context.Context, text func(string)) (oai.ChatCompletionMessage, oai.CompletionUsage, string, error) {
	stream := m.client.Chat.Completions.NewStreaming(ctx, m.params)
	defer stream.Close()
	var acc oai.ChatCompletionAccumulator
	reported := false
	for stream.Next() {
		chunk := stream.Current()
		if !acc.AddChunk(chunk) {
			return oai.ChatCompletionMessage{}, oai.CompletionUsage{}, "", errors.New("the API streamed a chunk that does not fit the reply so far")
		}
		if content, ok := acc.JustFinishedContent(); ok {
			text(content)
			reported = true
		}
	}
	if err := stream.Err(); err != nil {
		return oai.ChatCompletionMessage{}, oai.CompletionUsage{}, "", apiError(err)
	}
	if len(acc.Choices) == 0 {
		return oai.ChatCompletionMessage{}, oai.CompletionUsage{}, "", errors.New("the API's stream ended without a reply")
	}
	c := acc.Choices[0]
	if c.FinishReason == "" {
		// Cut short: its text or a tool call's arguments may be half
		// written. Asked again, like a dropped connection.
		return oai.ChatCompletionMessage{}, oai.CompletionUsage{}, "", errors.New("the API's stream ended before the reply did (no finish_reason)")
	}
	// Some servers end a stream without the chunk that finishes its
	// content.
	if !reported && c.Message.Content != "" {
		text(c.Message.Content)
	}
	return c.Message, acc.Usage, c.FinishReason, nil
}

// apiError turns the SDK's error answer into a *modelapi.APIError; other
// errors (the connection's) are returned as they are.
func apiError(err error) error {
	var se *ssestream.StreamError
	if errors.As(err, &se) {
		return streamError(se)
	}
	var e *oai.Error
	if !errors.As(err, &e) {
		return err
	}
	ae := &modelapi.APIError{Status: e.StatusCode, Message: e.Message}
	if ae.Message == "" {
		ae.Message = agent.Truncate(e.RawJSON())
	}
	if e.Response != nil {
		ae.RetryAfter = modelapi.RetryAfter(e.Response.Header, time.Now())
	}
	return ae
}

// streamError reads an error the API sent in the middle of a stream, after
// the 200 that began it, as the error answer it stands for.
func streamError(se *ssestream.StreamError) error {
	var body struct {
		Error struct {
			Message string `json:"message"`
			Type    string `json:"type"`
			Code    any    `json:"code"`
		} `json:"error"`
	}
	_ = json.Unmarshal(se.Event.Data, &body)
	e := body.Error
	code := fmt.Sprint(e.Code)
	status := http.StatusInternalServerError
	switch {
	case code == "rate_limit_exceeded" || e.Type == "rate_limit_error" || e.Type == "requests" || e.Type == "tokens" || code == "429":
		status = http.StatusTooManyRequests
	case e.Type == "invalid_request_error" || code == "context_length_exceeded" || code == "400":
		status = http.StatusBadRequest
	}
	msg := e.Message
	if msg == "" {
		msg = agent.Truncate(string(se.Event.Data))
	}
	return &modelapi.APIError{Status: status, Message: msg}
}
