package orchestrator

import (
	"testing"

	"github.com/loopbus/loopbus/schemas"
)

// written is what the service's publish leaves in the stream of a
// decision in the worst case: a chainable decision cut after its first
// event (the rest is refused because another event came between, or the
// orchestrator dies), anything else whole. The backlog and loops
// simulations apply only that and decide again, so every one of their
// expectations also holds for decisions cut short: Decide must make the
// rest of a chainable decision again, in the same order.
func written(evs []schemas.Event) []schemas.Event {
	if len(evs) > 1 && chainable(evs) {
		return evs[:1]
	}
	return evs
}

func TestChainable(t *testing.T) {
	ev := func(typ string) schemas.Event { return schemas.Event{Type: typ} }
	for _, tc := range []struct {
		evs  []schemas.Event
		want bool
	}{
		{[]schemas.Event{ev(schemas.TypeStepCompleted), ev(schemas.TypeJobRequested), ev(schemas.TypeJobRequested)}, true},
		{[]schemas.Event{ev(schemas.TypeStepCompleted), ev(schemas.TypeSessionCompleted)}, true},
		{[]schemas.Event{ev(schemas.TypeStepWaiting), ev(schemas.TypeApprovalRequested)}, true},
		{[]schemas.Event{ev(schemas.TypeStepFailed), ev(schemas.TypeSessionFailed)}, false},
		{[]schemas.Event{ev(schemas.TypeJobCancelled), ev(schemas.TypeSessionStopped), ev(schemas.TypeSignalAcknowledged)}, false},
		{[]schemas.Event{ev(schemas.TypeStepCompleted), ev(schemas.TypeLoopSpawned), ev(schemas.TypeJobRequested)}, false},
		{[]schemas.Event{ev(schemas.TypeTaskUpdated), ev(schemas.TypeStepCompleted)}, false},
		{[]schemas.Event{ev(schemas.TypeLoopMerged), ev(schemas.TypeLoopRebase)}, false},
		{[]schemas.Event{ev(schemas.TypeApprovalExpired), ev(schemas.TypeJobRequested)}, false},
	} {
		if got := chainable(tc.evs); got != tc.want {
			var types []string
			for _, e := range tc.evs {
				types = append(types, e.Type)
			}
			t.Errorf("chainable(%v) = %v, want %v", types, got, tc.want)
		}
	}
}
