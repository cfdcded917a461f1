package hooks

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	yaml "github.com/goccy/go-yaml"
	"github.com/goccy/go-yaml/ast"
	"github.com/goccy/go-yaml/parser"
)

// This file reads values out of goccy/go-yaml's AST so that every problem
// is reported with its line. Anchors, aliases and tags are looked through;
// merge keys (<<) are refused (a hooks file is short enough without them).

// pos is a 1-based position in the hooks file; zero when unknown.
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

// loader collects every problem of one hooks file.
type loader struct {
	file    string
	dir     string
	errs    Errors
	aliases map[*ast.AliasNode]ast.Node
}

// errorf records a problem at p concerning field. A %w verb keeps its
// operand as the problem's cause.
func (l *loader) errorf(p pos, field, format string, args ...any) {
	err := fmt.Errorf(format, args...)
	l.errs = append(l.errs, &Error{
		File: l.file, Line: p.line, Column: p.col, Field: field,
		Msg: err.Error(), Err: errors.Unwrap(err),
	})
}

// document parses data and returns the body of its only document; ok is
// false when there is none or the YAML is malformed (reported).
func (l *loader) document(data []byte) (ast.Node, bool) {
	f, err := parser.ParseBytes(data, 0)
	if err != nil {
		var ye yaml.Error
		if errors.As(err, &ye) {
			p := pos{}
			if tk := ye.GetToken(); tk != nil && tk.Position != nil {
				p = pos{tk.Position.Line, tk.Position.Column}
			}
			l.errorf(p, "", "YAML syntax error: %s", ye.GetMessage())
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
		l.errorf(pos{}, "", "file is empty: want a mapping with a hooks list")
		return nil, false
	}
	l.aliases = map[*ast.AliasNode]ast.Node{}
	anchors := map[string]ast.Node{}
	ok := true
	// Walk in document order: an alias refers to the nearest preceding anchor.
	ast.Walk(visitor(func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.AnchorNode:
			if n.Name != nil {
				anchors[n.Name.GetToken().Value] = n.Value
			}
		case *ast.AliasNode:
			name := ""
			if n.Value != nil {
				name = n.Value.GetToken().Value
			}
			v, found := anchors[name]
			if !found {
				l.errorf(posOf(n), "", "YAML alias *%s refers to no preceding anchor &%s", name, name)
				ok = false
			}
			l.aliases[n] = v
			return false
		}
		return true
	}), body)
	return body, ok
}

// visitor adapts a function to ast.Visitor; it descends while fn says so.
type visitor func(ast.Node) bool

// Visit implements ast.Visitor.
func (v visitor) Visit(n ast.Node) ast.Visitor {
	if v(n) {
		return v
	}
	return nil
}

// resolve looks through anchors, aliases and tags; it returns nil for null.
func (l *loader) resolve(n ast.Node) ast.Node {
	// An alias may refer to an anchor enclosing it: the bound ends the loop.
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

// entry is one key of a mapping or one element of a list.
type entry struct {
	key    string
	field  string   // dotted path, e.g. hooks[0].timeout
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

// mapping decodes n (resolved) as a mapping at field; at locates n when it
// is null. Keys outside allowed (when non-nil) and duplicate keys are
// reported and dropped.
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
	for _, kv := range m.Values {
		if kv == nil || kv.Key == nil {
			continue
		}
		kp := posOf(kv.Key)
		if kv.Key.IsMergeKey() {
			l.errorf(kp, join(field, "<<"), "merge keys are not supported in hooks files")
			continue
		}
		key, ok := scalarText(l.resolve(kv.Key))
		if !ok {
			l.errorf(kp, field, "mapping keys must be strings, got %s", kind(l.resolve(kv.Key)))
			continue
		}
		e := entry{key: key, field: join(field, key), keyPos: kp, val: l.resolve(kv.Value), valPos: kp}
		if e.val != nil {
			e.valPos = posOf(e.val)
		}
		switch {
		case allowed != nil && !slices.Contains(allowed, key):
			l.errorf(kp, e.field, "unknown key %q (allowed: %s)", key, strings.Join(allowed, ", "))
		case slices.ContainsFunc(out.entries, func(x entry) bool { return x.key == key }):
			l.errorf(kp, e.field, "duplicate key %q", key)
		default:
			out.entries = append(out.entries, e)
		}
	}
	return out, true
}

// join appends key to the dotted path field.
func join(field, key string) string {
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

// items returns the elements of e's list value as entries whose field is
// e's field with the index appended. example shows the expected form.
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

// strList decodes e's value as a list of strings with their entries.
func (l *loader) strList(e entry, example string) ([]string, []entry, bool) {
	items, ok := l.items(e, example)
	if !ok {
		return nil, nil, false
	}
	out := make([]string, len(items))
	for i, it := range items {
		s, isStr := scalarText(it.val)
		if !isStr {
			l.errorf(it.valPos, it.field, "want a string, got %s", kind(it.val))
			ok = false
		}
		out[i] = s
	}
	return out, items, ok
}
