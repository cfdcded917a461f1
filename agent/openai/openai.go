// Package openai is the agent backend for any model behind an
// OpenAI-compatible Chat Completions API (OpenAI, vLLM, llama.cpp's
// server, Ollama, OpenRouter): loopbus calls the model itself through the
// official SDK, streams its replies, runs the tools it calls in the job's
// directory (see modelapi) and answers it, turn after turn.
package openai

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/loopbus/loopbus/agent"
	"github.com/loopbus/loopbus/agent/modelapi"
	"github.com/loopbus/loopbus/schemas"
	oai "github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/shared"
)

// vendor is the backend's name and the variables it reads by default.
var vendor = modelapi.Vendor{Name: schemas.BackendOpenAI, KeyEnv: "OPENAI_API_KEY", BaseURLEnv: "OPENAI_BASE_URL", ModelEnv: "OPENAI_MODEL"}

// Backend calls an OpenAI-compatible API. The zero value is ready to use.
type Backend struct {
	// HTTPClient makes the API's requests; nil means a default client.
	HTTPClient *http.Client
	// Loop overrides the loop's retry settings (Retries, Backoff, Now);
	// the rest comes from the job's spec.
	Loop modelapi.Config
}

var (
	_ agent.Backend       = Backend{}
	_ agent.ToolPlanner   = Backend{}
	_ agent.LaneDefaulter = Backend{}
)

// PlannedTools implements agent.ToolPlanner: the tools spec lets the model
// call.
func (Backend) PlannedTools(spec schemas.AgentSpec) []agent.Tool {
	return modelapi.PlannedTools(spec.Tools)
}

// DefaultLanes implements agent.LaneDefaulter.
func (Backend) DefaultLanes() map[string]string { return modelapi.DefaultLanes() }

// Run implements agent.Backend: see modelapi.Run. Its error is the job's
// setup's (no API key, a bad base URL, a directory that cannot be opened).
func (b Backend) Run(ctx context.Context, job agent.Job, emit func(agent.Event)) (agent.Result, error) {
	setup, err := modelapi.Prepare(job, vendor)
	if err != nil {
		return agent.Result{ExitCode: -1}, err
	}
	defer setup.Tools.Close()
	opts := []option.RequestOption{option.WithMaxRetries(0), option.WithAPIKey(setup.Endpoint.APIKey)}
	if setup.Endpoint.BaseURL != "" {
		opts = append(opts, option.WithBaseURL(setup.Endpoint.BaseURL))
	}
	if setup.Endpoint.APIKey == "" {
		opts = append(opts, option.WithHeaderDel("Authorization"))
	}
	opts = append(opts, option.WithHTTPClient(modelapi.HTTPClient(b.HTTPClient)))
	s := job.Spec
	params := oai.ChatCompletionNewParams{
		Model:    shared.ChatModel(setup.Model),
		Messages: []oai.ChatCompletionMessageParamUnion{oai.SystemMessage(setup.System), oai.UserMessage(job.Prompt)},
	}
	maxTokens := s.MaxTokens
	if maxTokens <= 0 {
		maxTokens = modelapi.DefaultMaxTokens
	}
	// OpenAI's own API wants max_completion_tokens (its reasoning models
	// refuse max_tokens); compatible servers know max_tokens.
	if setup.Endpoint.BaseURL == "" || strings.Contains(setup.Endpoint.BaseURL, "api.openai.com") {
		params.MaxCompletionTokens = oai.Int(maxTokens)
	} else {
		params.MaxTokens = oai.Int(maxTokens)
	}
	for _, d := range setup.Tools.Defs() {
		params.Tools = append(params.Tools, oai.ChatCompletionFunctionTool(shared.FunctionDefinitionParam{
			Name: d.Name, Description: oai.String(d.Description), Parameters: shared.FunctionParameters(d.Parameters),
		}))
	}
	if !s.NoStream {
		params.StreamOptions = oai.ChatCompletionStreamOptionsParam{IncludeUsage: oai.Bool(true)}
	}
	cfg := modelapi.ConfigOf(s)
	cfg.Retries, cfg.Backoff, cfg.Now = b.Loop.Retries, b.Loop.Backoff, b.Loop.Now
	m := &model{client: oai.NewClient(opts...), params: params, stream: !s.NoStream}
	return modelapi.Run(ctx, cfg, job, m, setup.Tools, emit), nil
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
	for _, tc := range msg.ToolCalls {
		if tc.Type != "" && tc.Type != "function" {
			continue // custom tools are never offered
		}
		t.Calls = append(t.Calls, modelapi.Call{ID: tc.ID, Name: tc.Function.Name, Args: tc.Function.Arguments})
	}
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
