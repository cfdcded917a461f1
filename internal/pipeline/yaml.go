package pipeline

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	yaml "github.com/goccy/go-yaml"
	"github.com/goccy/go-yaml/ast"
	"github.com/goccy/go-yaml/parser"
)

// This file reads values out of goccy/go-yaml's AST so that every problem can
// be reported with a line. Aliases, anchors and tags are looked through;
// merge keys (<<) are expanded.

// pos is a 1-based position in the pipeline file; zero when unknown.
type pos struct{ line, col int }

// posOf returns where n starts.
func posOf(n ast.Node) pos {
	if m, ok := n.(*ast.MappingNode); ok && len(m.Values) > 0 {
		n = m.Values[0].Key
	}
	if n == nil {
		return pos{}
	}
	tk := n.GetToken()
	if tk == nil || tk.Position == nil {
		return pos{}
	}
	return pos{tk.Position.Line, tk.Position.Column}
}

// document parses data and returns the body of its only document; nil, false
// when there is none or the YAML is malformed (the problem is reported).
func (l *loader) document(data []byte) (ast.Node, bool) {
	f, err := parser.ParseBytes(data, 0)
	if err != nil {
		var ye yaml.Error
		if errors.As(err, &ye) {
			l.errorf(errPos(ye), "", "YAML syntax error: %s", ye.GetMessage())
		} else {
			l.errorf(pos{}, "", "YAML syntax error: %v", err)
		}
		return nil, false
	}
	var body ast.Node
	for _, d := range f.Docs {
		if d == nil || d.Body == nil {
			continue
		}
		if body != nil {
			l.errorf(posOf(d.Body), "", "only one YAML document is allowed")
			return nil, false
		}
		body = d.Body
	}
	if body == nil {
		l.errorf(pos{}, "", "file is empty: want a mapping with name and steps")
		return nil, false
	}
	l.aliases = make(map[*ast.AliasNode]ast.Node)
	r := &aliasResolver{l: l, anchors: make(map[string]ast.Node), aliases: l.aliases}
	ast.Walk(r, body)
	return body, !r.failed
}

// errPos returns where a goccy error is.
func errPos(e yaml.Error) pos {
	tk := e.GetToken()
	if tk == nil || tk.Position == nil {
		return pos{}
	}
	return pos{tk.Position.Line, tk.Position.Column}
}

// aliasResolver walks a document in order and binds every alias to the
// value of the nearest preceding anchor of that name.
type aliasResolver struct {
	l       *loader
	anchors map[string]ast.Node
	aliases map[*ast.AliasNode]ast.Node
	failed  bool
}

// Visit implements ast.Visitor.
func (r *aliasResolver) Visit(n ast.Node) ast.Visitor {
	switch n := n.(type) {
	case *ast.AnchorNode:
		if n.Name != nil {
			r.anchors[n.Name.GetToken().Value] = n.Value
		}
	case *ast.AliasNode:
		name := ""
		if n.Value != nil {
			name = n.Value.GetToken().Value
		}
		v, ok := r.anchors[name]
		if !ok {
			r.l.errorf(posOf(n), "", "YAML alias *%s refers to no preceding anchor &%s", name, name)
			r.failed = true
		}
		r.aliases[n] = v
		return nil
	}
	return r
}

// resolve looks through anchors, aliases and tags; it returns nil for null.
func (l *loader) resolve(n ast.Node) ast.Node {
	// An alias can refer to an anchor enclosing it; the bound keeps such
	// documents from looping here (callers descend only a fixed depth).
	for range 32 {
		switch v := n.(type) {
		case *ast.AnchorNode:
			n = v.Value
		case *ast.AliasNode:
			n = l.aliases[v]
		case *ast.TagNode:
			n = v.Value
		case *ast.NullNode:
			return nil
		default:
			return n
		}
	}
	return nil
}

// kind describes a resolved node for messages.
func kind(n ast.Node) string {
	switch n.(type) {
	case nil:
		return "null"
	case *ast.MappingNode:
		return "a mapping"
	case *ast.SequenceNode:
		return "a list"
	case *ast.BoolNode:
		return "a boolean"
	case *ast.IntegerNode, *ast.FloatNode, *ast.InfinityNode, *ast.NanNode:
		return "a number"
	case *ast.StringNode, *ast.LiteralNode:
		return "a string"
	}
	return "a " + n.Type().YAMLName()
}

// scalarText returns the text of a scalar: the decoded value of a string,
// the source text of a number or boolean (so argv [sleep, 10] works).
func scalarText(n ast.Node) (string, bool) {
	switch v := n.(type) {
	case *ast.StringNode:
		return v.Value, true
	case *ast.LiteralNode:
		if v.Value == nil {
			return "", true
		}
		return v.Value.Value, true
	case *ast.IntegerNode, *ast.FloatNode, *ast.BoolNode, *ast.InfinityNode, *ast.NanNode:
		return v.GetToken().Value, true
	}
	return "", false
}

// entry is one key of a mapping.
type entry struct {
	key    string
	field  string   // dotted path of the key
	keyPos pos      // where the key is
	val    ast.Node // resolved value; nil for null
	valPos pos      // where the value is (the key's position for null)
}

// mapNode is a decoded mapping.
type mapNode struct {
	pos     pos
	entries []entry
}

// get returns the entry for key when it is present with a non-null value.
func (m mapNode) get(key string) (entry, bool) {
	for _, e := range m.entries {
		if e.key == key {
			return e, e.val != nil
		}
	}
	return entry{}, false
}

// mapping decodes n (already resolved) as a mapping at field. at locates n
// when n is null. When allowed is non-nil, keys outside it are reported.
// Merge keys are expanded: explicit keys win over merged ones. ok is false
// when n is not a mapping (the problem is reported).
func (l *loader) mapping(n ast.Node, at pos, field string, allowed []string) (mapNode, bool) {
	m, isMap := n.(*ast.MappingNode)
	if !isMap {
		want := "a mapping"
		if len(allowed) > 0 {
			want += " with keys " + strings.Join(allowed, ", ")
		}
		if n != nil {
			at = posOf(n)
		}
		l.errorf(at, field, "want %s, got %s", want, kind(n))
		return mapNode{}, false
	}
	out := mapNode{pos: posOf(m)}
	var merged []entry
	l.collect(m, field, &out.entries, &merged, map[*ast.MappingNode]bool{m: true})
	for _, e := range merged {
		if !slices.ContainsFunc(out.entries, func(x entry) bool { return x.key == e.key }) {
			out.entries = append(out.entries, e)
		}
	}
	if allowed != nil {
		out = l.only(out, allowed, "key")
	}
	return out, true
}

// only reports each entry of m whose key is not in allowed as an unknown
// what (such as "key" or "role") and returns m without them.
func (l *loader) only(m mapNode, allowed []string, what string) mapNode {
	for _, e := range m.entries {
		if !slices.Contains(allowed, e.key) {
			l.errorf(e.keyPos, e.field, "unknown %s %q (allowed: %s)", what, e.key, strings.Join(allowed, ", "))
		}
	}
	m.entries = slices.DeleteFunc(slices.Clone(m.entries), func(e entry) bool { return !slices.Contains(allowed, e.key) })
	return m
}

// collect appends m's explicit entries to own and the entries of mappings
// merged into it (recursively, each mapping once) to merged.
func (l *loader) collect(m *ast.MappingNode, field string, own, merged *[]entry, seen map[*ast.MappingNode]bool) {
	for _, kv := range m.Values {
		if kv == nil || kv.Key == nil {
			continue
		}
		if kv.Key.IsMergeKey() {
			l.merge(kv, field, merged, seen)
			continue
		}
		kp := posOf(kv.Key)
		key, ok := scalarText(l.resolve(kv.Key))
		if !ok {
			l.errorf(kp, field, "mapping keys must be strings, got %s", kind(l.resolve(kv.Key)))
			continue
		}
		e := entry{key: key, field: join(field, key), keyPos: kp, val: l.resolve(kv.Value), valPos: kp}
		if e.val != nil {
			e.valPos = posOf(e.val)
		}
		*own = append(*own, e)
	}
}

// merge expands one merge key: its value is a mapping or a list of them.
func (l *loader) merge(kv *ast.MappingValueNode, field string, merged *[]entry, seen map[*ast.MappingNode]bool) {
	v := l.resolve(kv.Value)
	srcs := []ast.Node{v}
	if s, ok := v.(*ast.SequenceNode); ok {
		srcs = s.Values
	}
	for _, src := range srcs {
		src = l.resolve(src)
		m, ok := src.(*ast.MappingNode)
		if !ok {
			l.errorf(posOf(kv.Key), join(field, "<<"), "merge key wants a mapping or a list of mappings, got %s", kind(src))
			continue
		}
		if seen[m] {
			continue
		}
		seen[m] = true
		var own []entry
		l.collect(m, field, &own, merged, seen)
		for _, e := range own {
			if !slices.ContainsFunc(*merged, func(x entry) bool { return x.key == e.key }) {
				*merged = append(*merged, e)
			}
		}
	}
}

// join appends key to the dotted path field, quoting keys that are not
// plain names so the path stays unambiguous and on one line.
func join(field, key string) string {
	plain := key != "" && strings.IndexFunc(key, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-')
	}) < 0
	if !plain {
		key = strconv.Quote(key)
	}
	if field == "" {
		return key
	}
	return field + "." + key
}

// str decodes e's value as a string.
func (l *loader) str(e entry) (string, bool) {
	s, ok := scalarText(e.val)
	if !ok {
		l.errorf(e.valPos, e.field, "want a string, got %s", kind(e.val))
	}
	return s, ok
}

// list decodes e's value as a list of strings, returning each element's
// position too. example shows the expected form when the value is not a list.
func (l *loader) list(e entry, example string) ([]string, []pos, bool) {
	items, ok := l.items(e, example)
	if !ok {
		return nil, nil, false
	}
	out := make([]string, len(items))
	at := make([]pos, len(items))
	for i, it := range items {
		at[i] = it.valPos
		s, isStr := scalarText(it.val)
		if !isStr {
			l.errorf(it.valPos, it.field, "want a string, got %s", kind(it.val))
			ok = false
		}
		out[i] = s
	}
	return out, at, ok
}

// items returns the elements of e's list value as entries whose field is
// e's field with the index appended.
func (l *loader) items(e entry, example string) ([]entry, bool) {
	seq, isSeq := e.val.(*ast.SequenceNode)
	if !isSeq {
		l.errorf(e.valPos, e.field, "want a list such as %s, got %s", example, kind(e.val))
		return nil, false
	}
	out := make([]entry, len(seq.Values))
	for i, item := range seq.Values {
		it := entry{field: fmt.Sprintf("%s[%d]", e.field, i), val: l.resolve(item), valPos: posOf(item)}
		if it.val != nil {
			it.valPos = posOf(it.val)
		}
		out[i] = it
	}
	return out, true
}
