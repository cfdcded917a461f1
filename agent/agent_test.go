package agent_test

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/loopbus/loopbus/agent"
	"github.com/loopbus/loopbus/schemas"
)

type fakeBackend struct{ lanes map[string]string }

func (fakeBackend) Run(context.Context, agent.Job, func(agent.Event)) (agent.Result, error) {
	return agent.Result{}, nil
}

func (b fakeBackend) DefaultLanes() map[string]string { return b.lanes }

type plainBackend struct{}

func (plainBackend) Run(context.Context, agent.Job, func(agent.Event)) (agent.Result, error) {
	return agent.Result{}, nil
}

func TestRegistryLookup(t *testing.T) {
	r := agent.Registry{schemas.BackendExec: plainBackend{}, schemas.BackendClaude: fakeBackend{}}
	if b, err := r.Lookup("exec"); err != nil || b == nil {
		t.Fatalf("Lookup(exec) = %v, %v", b, err)
	}
	_, err := r.Lookup("docker")
	if !errors.Is(err, agent.ErrUnsupported) || err.Error() != `agent backend "docker" is not supported by this worker (supported: claude, exec)` {
		t.Errorf("Lookup(docker) error %v", err)
	}
}

func TestRegistryDefaultLanes(t *testing.T) {
	r := agent.Registry{
		"a": fakeBackend{lanes: map[string]string{"x": agent.LaneHeavy, "y": agent.LaneNet}},
		"b": fakeBackend{lanes: map[string]string{"y": agent.LaneNoNet}},
		"c": plainBackend{},
	}
	want := map[string]string{"x": agent.LaneHeavy, "y": agent.LaneNoNet}
	if got := r.DefaultLanes(); !reflect.DeepEqual(got, want) {
		t.Errorf("DefaultLanes = %v, want %v", got, want)
	}
}

func TestTruncate(t *testing.T) {
	s := strings.Repeat("é", agent.MaxSummary) // 2 bytes a rune
	got := agent.Truncate("a" + s)
	if len(got) > agent.MaxSummary || !utf8.ValidString(got) || len(got) < agent.MaxSummary-1 {
		t.Fatalf("len %d, valid %v", len(got), utf8.ValidString(got))
	}
	if got := agent.Truncate("short"); got != "short" {
		t.Fatalf("got %q", got)
	}
}
