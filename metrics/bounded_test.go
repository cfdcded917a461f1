package metrics

import (
	"strings"
	"testing"
)

func TestBoundedForgetsTheOldest(t *testing.T) {
	b := newBounded[int](2)
	b.put("a", 1)
	b.put("b", 2)
	b.put("a", 3) // now the newest
	b.put("c", 4) // forgets b
	if _, ok := b.get("b"); ok {
		t.Error("b kept beyond the bound")
	}
	if v, ok := b.get("a"); !ok || v != 3 {
		t.Errorf("a = %d, %v", v, ok)
	}
	b.remove("a")
	b.remove("missing")
	if _, ok := b.get("a"); ok || b.len() != 1 {
		t.Errorf("after remove: len %d", b.len())
	}
	for i := range 1000 {
		b.put(strings.Repeat("k", i%7+1), i)
	}
	if b.len() != 2 || len(b.items) != 2 {
		t.Errorf("len %d, items %d, want 2", b.len(), len(b.items))
	}
}

func TestLabelSetIsBounded(t *testing.T) {
	l := newLabelSet(2, "exec")
	for v, want := range map[string]string{"exec": "exec", "": Other, strings.Repeat("x", maxLabelBytes+1): Other, "bad\xff": Other} {
		if got := l.label(v); got != want {
			t.Errorf("label(%q) = %q, want %q", v, got, want)
		}
	}
	for _, v := range []string{"a", "b", "a"} {
		if got := l.label(v); got != v {
			t.Errorf("label(%q) = %q", v, got)
		}
	}
	for i := range 100 {
		if got := l.label(strings.Repeat("c", i+1)); got != Other {
			t.Fatalf("value %d beyond the bound labelled %q", i, got)
		}
	}
	if len(l.known) != 4 { // exec, other, a, b
		t.Errorf("%d values known, want 4", len(l.known))
	}
}

func TestCapConsumersSumsTheRest(t *testing.T) {
	cs := []consumerCounts{{name: "c", pending: 1}, {name: "a", pending: 2}, {name: "b", pending: 3, redelivered: 1}, {name: "d", ackPending: 4}}
	got := capConsumers(cs, 2)
	want := []consumerCounts{{name: "a", pending: 2}, {name: "b", pending: 3, redelivered: 1}, {name: Other, pending: 1, ackPending: 4}}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("got[%d] = %v, want %v", i, got[i], want[i])
		}
	}
}
