package metrics

import (
	"container/list"
	"unicode/utf8"
)

// labelSet bounds the values of a label taken from event data: the fixed
// values, plus the first max others seen; any later value, and any value
// too long or not valid UTF-8, is Other. Not safe for concurrent use.
type labelSet struct {
	known map[string]bool
	extra int
	max   int
}

func newLabelSet(max int, fixed ...string) *labelSet {
	l := &labelSet{known: map[string]bool{Other: true}, max: max}
	for _, v := range fixed {
		l.known[v] = true
	}
	return l
}

// label returns the label value to use for v.
func (l *labelSet) label(v string) string {
	switch {
	case l.known[v]:
		return v
	case v == "" || len(v) > maxLabelBytes || !utf8.ValidString(v) || l.extra >= l.max:
		return Other
	}
	l.known[v] = true
	l.extra++
	return v
}

// bounded is a map from string keys that holds at most max entries: adding
// one more forgets the oldest. Not safe for concurrent use.
type bounded[V any] struct {
	max   int
	items map[string]*list.Element
	order *list.List // of *entry[V], oldest first
}

type entry[V any] struct {
	key string
	val V
}

func newBounded[V any](max int) *bounded[V] {
	return &bounded[V]{max: max, items: map[string]*list.Element{}, order: list.New()}
}

// put sets key to val, as the newest entry.
func (b *bounded[V]) put(key string, val V) {
	if e, ok := b.items[key]; ok {
		e.Value.(*entry[V]).val = val
		b.order.MoveToBack(e)
		return
	}
	b.items[key] = b.order.PushBack(&entry[V]{key: key, val: val})
	for b.order.Len() > b.max {
		oldest := b.order.Front()
		b.order.Remove(oldest)
		delete(b.items, oldest.Value.(*entry[V]).key)
	}
}

// get returns the value of key.
func (b *bounded[V]) get(key string) (V, bool) {
	if e, ok := b.items[key]; ok {
		return e.Value.(*entry[V]).val, true
	}
	var zero V
	return zero, false
}

// remove forgets key.
func (b *bounded[V]) remove(key string) {
	if e, ok := b.items[key]; ok {
		b.order.Remove(e)
		delete(b.items, key)
	}
}

// len is the number of entries.
func (b *bounded[V]) len() int { return b.order.Len() }
