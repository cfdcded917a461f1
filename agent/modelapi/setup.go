package modelapi

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/loopbus/loopbus/agent"
	"github.com/loopbus/loopbus/schemas"
	"github.com/loopbus/loopbus/workspace"
)

// Vendor names a vendor's defaults.
type Vendor struct {
	// Name is the backend's name, for messages.
	Name string
	// KeyEnv, BaseURLEnv and ModelEnv are the variables the API key, the
	// API's address and the model are read from when the spec does not
	// say (OPENAI_API_KEY, OPENAI_BASE_URL, OPENAI_MODEL).
	KeyEnv, BaseURLEnv, ModelEnv string
}

// Endpoint is where a job's model answers and how to authenticate.
type Endpoint struct {
	// BaseURL is the API's address; "" means the vendor's public API.
	BaseURL string
	// APIKey is the key; "" sends none (a local server that wants none).
	APIKey string
}

// ErrNoAPIKey is wrapped by Setup's error when the API key's variable is
// not set in the worker's environment.
var ErrNoAPIKey = errors.New("no API key")

// Setup is what a backend needs to start a job: the endpoint, the model,
// the toolbox and the instructions that tell the model where it works.
type Setup struct {
	Endpoint Endpoint
	// Model is the spec's model, or the worker's $ModelEnv.
	Model string
	// MaxTokens is the spec's, or DefaultMaxTokens.
	MaxTokens int64
	// Loop is the loop's configuration from the spec.
	Loop  Config
	Tools *Toolbox
	// System is the system prompt: the job's layout and how to use the
	// tools.
	System string
}

// Prepare reads job's endpoint and model from its spec and environment
// and opens its toolbox. The key comes from the variable spec.APIKeyEnv names (default
// v.KeyEnv) in job.Env; it must be set when the spec names the variable or
// when the public API is used, and a local server (a base URL given) may
// do without. The run tool's commands get job.Env without that variable.
// The tools offered are spec.Tools (every tool when empty) less those
// job.Forbidden names. The error is the job's: it cannot start.
func Prepare(job agent.Job, v Vendor) (*Setup, error) {
	s := job.Spec
	base := strings.TrimSpace(s.BaseURL)
	if base == "" {
		base, _ = lookup(job.Env, v.BaseURLEnv)
	}
	if base != "" {
		u, err := url.Parse(base)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, fmt.Errorf("%s: base URL %q is not an http(s) URL", v.Name, base)
		}
	}
	model := strings.TrimSpace(s.Model)
	if model == "" {
		model, _ = lookup(job.Env, v.ModelEnv)
	}
	if model == "" {
		return nil, fmt.Errorf("%s: no model: set agent.model in the definition or %s in the worker's environment", v.Name, v.ModelEnv)
	}
	keyEnv := s.APIKeyEnv
	if keyEnv == "" {
		keyEnv = v.KeyEnv
	}
	key, _ := lookup(job.Env, keyEnv)
	if key == "" && (s.APIKeyEnv != "" || base == "") {
		return nil, fmt.Errorf("%s: %w: %s is not set in the worker's environment", v.Name, ErrNoAPIKey, keyEnv)
	}
	env := make([]string, 0, len(job.Env))
	for _, kv := range job.Env {
		if !strings.HasPrefix(kv, keyEnv+"=") {
			env = append(env, kv)
		}
	}
	tb, err := NewToolbox(job.Root, job.Dir, env, Offered(s.Tools, job.Forbidden))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", v.Name, err)
	}
	maxTokens := s.MaxTokens
	if maxTokens <= 0 {
		maxTokens = DefaultMaxTokens
	}
	return &Setup{Endpoint: Endpoint{BaseURL: base, APIKey: key}, Model: model, MaxTokens: maxTokens,
		Loop:  Config{MaxTurns: s.MaxTurns, RetryWait: time.Duration(s.RetryWaitMs) * time.Millisecond, Price: s.Price, Secret: secret(key)},
		Tools: tb, System: instructions(job, tb)}, nil
}

// Retrying returns the loop's configuration with the retry settings of o
// (Retries, Backoff, Now): a backend's, for tests that retry quickly.
func (s *Setup) Retrying(o Config) Config {
	c := s.Loop
	c.Retries, c.Backoff, c.Now = o.Retries, o.Backoff, o.Now
	return c
}

// Offered returns the tools named (every tool when none is) less those
// that forbidden lane table keys name (a name, or a prefix ending in "*").
func Offered(names, forbidden []string) []string {
	if len(names) == 0 {
		names = ToolNames()
	}
	var out []string
	for _, n := range names {
		if !slices.ContainsFunc(forbidden, func(k string) bool {
			p, isPrefix := strings.CutSuffix(k, "*")
			return k == n || isPrefix && strings.HasPrefix(n, p)
		}) {
			out = append(out, n)
		}
	}
	return out
}

// secret is the key as the loop redacts it: none for a placeholder too
// short to be a secret (a local server's "x"), which would garble every
// text it occurs in.
func secret(key string) string {
	if len(key) < workspace.MinSecretLen {
		return ""
	}
	return key
}

func lookup(env []string, key string) (string, bool) {
	for i := len(env) - 1; i >= 0; i-- {
		if k, v, ok := strings.Cut(env[i], "="); ok && k == key {
			return v, true
		}
	}
	return "", false
}

// instructions is the system prompt: where the model works, what the
// job's variables mean as paths it can use, and its tools.
func instructions(job agent.Job, tb *Toolbox) string {
	var b strings.Builder
	b.WriteString("You are an agent working on a task through tools. Paths you give the tools are relative to your working directory and must stay inside ")
	if tb.dir == "." {
		b.WriteString("it.")
	} else {
		b.WriteString("the job's workspace, which holds it.")
	}
	// The prompt speaks of the job's directories by variable, as it does
	// to command-line agents; tell the model which paths they are.
	var vars []string
	for _, name := range []string{"LOOPBUS_INPUT_DIR", "LOOPBUS_OUTPUT_DIR", "LOOPBUS_FEEDBACK_FILE", "LOOPBUS_WORKSPACE"} {
		v, ok := lookup(job.Env, name)
		if !ok || v == "" {
			continue
		}
		rel, err := filepath.Rel(job.Dir, v)
		if err != nil {
			continue
		}
		if job.Root != "" {
			if r, err := filepath.Rel(job.Root, v); err != nil || !filepath.IsLocal(r) && r != "." {
				continue
			}
		} else if !filepath.IsLocal(rel) && rel != "." {
			continue
		}
		vars = append(vars, fmt.Sprintf("$%s is %s", name, filepath.ToSlash(rel)))
	}
	if len(vars) > 0 {
		b.WriteString(" Where the task names a variable, use the path: " + strings.Join(vars, "; ") + ".")
	}
	b.WriteString(" Your tools: ")
	var names []string
	for _, d := range tb.Defs() {
		names = append(names, d.Name)
	}
	if len(names) == 0 {
		b.WriteString("none.")
	} else {
		b.WriteString(strings.Join(names, ", ") + ".")
	}
	b.WriteString(" Do the work with the tools, then answer with a short summary and no tool call when you are done.")
	return b.String()
}

// Options are what a model-API backend takes besides its jobs; a backend
// embeds them, and with them the agent.ToolPlanner and
// agent.LaneDefaulter methods every model-API backend has.
type Options struct {
	// HTTPClient makes the API's requests; nil means a default client.
	HTTPClient *http.Client
	// Loop overrides the loop's retry settings (Retries, Backoff, Now);
	// the rest comes from the job's spec.
	Loop Config
}

// PlannedTools implements agent.ToolPlanner: the tools spec lets the model
// call.
func (Options) PlannedTools(spec schemas.AgentSpec) []agent.Tool { return PlannedTools(spec.Tools) }

// DefaultLanes implements agent.LaneDefaulter.
func (Options) DefaultLanes() map[string]string { return DefaultLanes() }
