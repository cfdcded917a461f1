package anthropic

import (
	"testing"
	"time"

	"github.com/loopbus/loopbus/agent"
	"github.com/loopbus/loopbus/agent/modelapi"
	"github.com/loopbus/loopbus/internal/modelserver"
)

// TestBackend runs the conformance suite and the model-API scenarios
// against a scripted server speaking Anthropic's wire format, streaming and
// not.
func TestBackend(t *testing.T) {
	modelserver.RunSuite(t, modelserver.Anthropic, func() agent.Backend {
		return Backend{modelapi.Options{Loop: modelapi.Config{Backoff: time.Millisecond}}}
	})
}
