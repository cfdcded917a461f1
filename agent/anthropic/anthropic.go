// Package anthropic is the agent backend for Anthropic's Messages API (and
// servers that speak it): loopbus calls the model itself through the
// official SDK, streams its replies, runs the tools it calls in the job's
// directory (see modelapi) and answers it, turn after turn.
package anthropic

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	sdk "github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/loopbus/loopbus/agent"
	"github.com/loopbus/loopbus/agent/modelapi"
	"github.com/loopbus/loopbus/schemas"
)

// vendor is the backend's name and the variables it reads by default.
var vendor = modelapi.Vendor{Name: schemas.BackendAnthropic, KeyEnv: "ANTHROPIC_API_KEY", BaseURLEnv: "ANTHROPIC_BASE_URL", ModelEnv: "ANTHROPIC_MODEL"}

// Backend calls Anthropic's Messages API. The zero value is ready to use.
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
	// The SDK would otherwise read the worker's own ANTHROPIC_* variables
	// (a key, a bearer token, a profile, a base URL, extra headers): the
	// job's setup decides alone.
	opts := []option.RequestOption{option.WithoutEnvironmentDefaults(), option.WithMaxRetries(0), option.WithAPIKey(setup.Endpoint.APIKey)}
	if setup.Endpoint.BaseURL != "" {
		opts = append(opts, option.WithBaseURL(setup.Endpoint.BaseURL))
	}
	if setup.Endpoint.APIKey == "" {
		// WithAPIKey sends the key as "Authorization: Bearer"; send none.
		opts = append(opts, option.WithHeaderDel("Authorization"), option.WithHeaderDel("X-Api-Key"))
	}
	opts = append(opts, option.WithHTTPClient(modelapi.HTTPClient(b.HTTPClient)))
	params := sdk.MessageNewParams{
		Model:     setup.Model,
		MaxTokens: setup.MaxTokens,
		System:    []sdk.TextBlockParam{{Text: setup.System}},
		Messages:  []sdk.MessageParam{sdk.NewUserMessage(sdk.NewTextBlock(job.Prompt))},
	}
	for _, d := range setup.Tools.Defs() {
		schema := sdk.ToolInputSchemaParam{Properties: d.Parameters["properties"]}
		schema.Required, _ = d.Parameters["required"].([]string)
		params.Tools = append(params.Tools, sdk.ToolUnionParam{OfTool: &sdk.ToolParam{
			Name: d.Name, Description: sdk.String(d.Description), InputSchema: schema,
		}})
	}
	m := &model{client: sdk.NewClient(opts...), params: params, stream: !job.Spec.NoStream}
	return modelapi.Run(ctx, setup.Retrying(b.Loop), job, m, setup.Tools, emit), nil
}

// model is one conversation: params holds its messages so far.
type model struct {
	client sdk.Client
	params sdk.MessageNewParams
	stream bool
}

func (m *model) Answer(results []modelapi.Answer) {
	blocks := make([]sdk.ContentBlockParamUnion, 0, len(results))
	for _, r := range results {
		blocks = append(blocks, sdk.NewToolResultBlock(r.CallID, r.Output, r.IsError))
	}
	m.params.Messages = append(m.params.Messages, sdk.NewUserMessage(blocks...))
}

func (m *model) Next(ctx context.Context, text func(string)) (modelapi.Turn, error) {
	var (
		msg     sdk.Message
		unknown []string
	)
	if m.stream {
		var err error
		if msg, unknown, err = m.streamed(ctx, text); err != nil {
			return modelapi.Turn{}, err
		}
	} else {
		res, err := m.client.Messages.New(ctx, m.params)
		if err != nil {
			return modelapi.Turn{}, apiError(err)
		}
		if res == nil {
			return modelapi.Turn{}, errors.New("the API's reply is empty")
		}
		msg = *res
		for _, c := range msg.Content {
			if c.Type == "text" {
				text(c.Text)
			}
		}
	}
	t := modelapi.Turn{Truncated: msg.StopReason == sdk.StopReasonMaxTokens, Unknown: unknown, Usage: agent.Usage{
		InputTokens:      msg.Usage.InputTokens,
		CacheReadTokens:  msg.Usage.CacheReadInputTokens,
		CacheWriteTokens: msg.Usage.CacheCreationInputTokens,
		OutputTokens:     msg.Usage.OutputTokens,
	}}
	for _, c := range msg.Content {
		if c.Type != "tool_use" {
			// Text was reported; thinking is the model's own; other
			// blocks are counted, and sent back as they came.
			if !knownBlocks[c.Type] {
				t.Unknown = append(t.Unknown, "block:"+c.Type)
			}
			continue
		}
		args := string(c.Input)
		if strings.TrimSpace(args) == "" {
			args = "{}"
		}
		t.Calls = append(t.Calls, modelapi.Call{ID: c.ID, Name: c.Name, Args: args})
	}
	m.params.Messages = append(m.params.Messages, msg.ToParam())
	return t, nil
}

// knownBlocks are the content block types the backend understands.
var knownBlocks = map[string]bool{"text": true, "tool_use": true, "thinking": true, "redacted_thinking": true}

// knownEvents are the stream event types the backend understands.
var knownEvents = map[string]bool{"message_start": true, "message_delta": true, "message_stop": true,
	"content_block_start": true, "content_block_delta": true, "content_block_stop": true, "ping": true, "error": true}

// streamed asks for a streamed reply and returns it accumulated, calling
// text with each text block's text as the block stops, and the types of
// the events it skipped as unknown.
func (m *model) streamed(ctx context.Context, text func(string)) (sdk.Message, []string, error) {
	stream := m.client.Messages.NewStreaming(ctx, m.params)
	defer stream.Close()
	var (
		msg     sdk.Message
		unknown []string
	)
	started, stopped := false, false
	reported := map[int64]bool{}
	// texts gathers the text and thinking deltas of each block: the SDK
	// adds each to the block's string, which costs the square of the
	// block's length in deltas; the block gets its text at its stop.
	texts := map[int64]*strings.Builder{}
	flush := func(i int64) {
		b := texts[i]
		if b == nil || i < 0 || i >= int64(len(msg.Content)) {
			return
		}
		if cb := &msg.Content[i]; cb.Type == "thinking" {
			cb.Thinking += b.String()
		} else {
			cb.Text += b.String()
		}
		delete(texts, i)
	}
	for stream.Next() {
		ev := stream.Current()
		switch ev.Type {
		case "message_start":
			started = true
		case "message_stop":
			stopped = true
		}
		if !knownEvents[ev.Type] && len(unknown) < 100 {
			unknown = append(unknown, ev.Type)
		}
		if !started {
			continue // nothing to add to before message_start
		}
		switch {
		case ev.Type == "content_block_delta" && (ev.Delta.Type == "text_delta" || ev.Delta.Type == "thinking_delta"):
			if ev.Index < 0 || ev.Index >= int64(len(msg.Content)) {
				return sdk.Message{}, nil, fmt.Errorf("the API streamed a delta of block %d, of %d", ev.Index, len(msg.Content))
			}
			b := texts[ev.Index]
			if b == nil {
				b = &strings.Builder{}
				texts[ev.Index] = b
			}
			b.WriteString(ev.Delta.Text)
			b.WriteString(ev.Delta.Thinking)
			continue
		case ev.Type == "content_block_stop":
			flush(ev.Index)
		case ev.Type == "message_stop":
			for i := range texts {
				flush(i)
			}
		}
		if err := msg.Accumulate(ev); err != nil {
			return sdk.Message{}, nil, fmt.Errorf("the API streamed an event that does not fit the reply so far: %w", err)
		}
		if ev.Type == "content_block_stop" && ev.Index >= 0 && ev.Index < int64(len(msg.Content)) &&
			msg.Content[ev.Index].Type == "text" && !reported[ev.Index] {
			text(msg.Content[ev.Index].Text)
			reported[ev.Index] = true
		}
	}
	if err := stream.Err(); err != nil {
		return sdk.Message{}, nil, apiError(err)
	}
	if !started || !stopped {
		// A reply cut short is a dropped connection: its last tool call
		// may be half written.
		return sdk.Message{}, nil, errors.New("the API's stream ended before the reply did")
	}
	for i, c := range msg.Content {
		if c.Type == "text" && !reported[int64(i)] {
			text(c.Text)
		}
	}
	// A block whose start event carried none has nothing to send back,
	// and would fail every later request.
	msg.Content = slices.DeleteFunc(msg.Content, func(c sdk.ContentBlockUnion) bool { return c.RawJSON() == "" })
	return msg, unknown, nil
}

// streamStatus is the HTTP status of an error event in a stream, which
// arrives after the 200 that began it.
var streamStatus = map[string]int{
	"invalid_request_error": 400, "authentication_error": 401, "billing_error": 402,
	"permission_error": 403, "not_found_error": 404, "conflict_error": 409,
	"rate_limit_error": 429, "api_error": 500, "timeout_error": 504, "overloaded_error": 529,
}

// apiError turns the SDK's error answer into a *modelapi.APIError; other
// errors (the connection's) are returned as they are.
func apiError(err error) error {
	var e *sdk.Error
	if !errors.As(err, &e) {
		return err
	}
	ae := &modelapi.APIError{Status: e.StatusCode, Message: e.Message}
	if ae.Status < 400 {
		if ae.Status = streamStatus[string(e.Type())]; ae.Status == 0 {
			ae.Status = http.StatusInternalServerError
		}
	}
	if ae.Message == "" {
		ae.Message = agent.Truncate(e.RawJSON())
	}
	if e.Response != nil {
		ae.RetryAfter = modelapi.RetryAfter(e.Response.Header, time.Now())
	}
	return ae
}
