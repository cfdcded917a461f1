// Package yamlread reads configuration files out of goccy/go-yaml's AST so
// that every problem is reported with the file, line, column and dotted
// field path it concerns, and all problems of a file are reported at once.
//
// A Reader parses one document (Document), then the caller descends it
// with Mapping, Items, Str and Strings, which report what they cannot
// decode and let the caller go on. Anchors, aliases and tags are looked
// through; merge keys (<<) are expanded, explicit keys winning, unless the
// Reader refuses them (NoMerge). The problems are recorded as Errors whose
// type and sentinel error are the caller's (see Sentinel).
package yamlread

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	yaml "github.com/goccy/go-yaml"
	"github.com/goccy/go-yaml/ast"
	"github.com/goccy/go-yaml/parser"
)

// Pos is a 1-based position in a file; zero when unknown.
type Pos struct{ Line, Col int }

// PosOf returns where n starts; for a mapping, where its first key is.
func PosOf(n ast.Node) Pos {
	if m, ok := n.(*ast.MappingNode); ok && len(m.Values) > 0 {
		n = m.Values[0].Key
	}
	if n == nil {
		return Pos{}
	}
	tk := n.GetToken()
	if tk == nil || tk.Position == nil {
		return Pos{}
	}
	return Pos{tk.Position.Line, tk.Position.Column}
}

// Reader decodes one file and collects its problems. Set the options, then
// call Document once; the zero value of the options expands merge keys and
// does not look for keys that decode alike.
type Reader[S Sentinel] struct {
	// File names the file in every problem.
	File string
	// Empty is the message reported when the file holds no document.
	Empty string
	// NoMerge, when not empty, refuses merge keys: each is reported with
	// this message at field <mapping's field>.<< and ignored. When empty,
	// merge keys are expanded.
	NoMerge string
	// Duplicates makes Mapping report keys of one mapping that decode to
	// the same string ("duplicate key %q") and keep only the first. The
	// parser already refuses keys written alike, even quoted differently
	// (a YAML syntax error); this catches the rest, such as an anchored key
	// and an alias of it. Without Duplicates the first such key wins.
	Duplicates bool
	// RawKeys writes keys into the field paths of entries and problems as
	// they are; by default keys that are not plain names are quoted (see
	// Join).
	RawKeys bool
	// Errs is every problem recorded so far, in the order found.
	Errs Errors[S]

	aliases map[*ast.AliasNode]ast.Node
}

// Errorf records a problem at p concerning field (empty for none). A %w
// verb in format also sets the problem's Err.
func (r *Reader[S]) Errorf(p Pos, field, format string, args ...any) {
	err := fmt.Errorf(format, args...)
	r.Errs = append(r.Errs, &Error[S]{
		File: r.File, Line: p.Line, Column: p.Col, Field: field,
		Msg: err.Error(), Err: errors.Unwrap(err),
	})
}

// Err returns nil when no problem was recorded, else Errs sorted stably by
// line and column (problems of unknown position first).
func (r *Reader[S]) Err() error {
	if len(r.Errs) == 0 {
		return nil
	}
	slices.SortStableFunc(r.Errs, func(a, b *Error[S]) int {
		if a.Line != b.Line {
			return a.Line - b.Line
		}
		return a.Column - b.Column
	})
	return r.Errs
}

// Document parses data and returns the body of its only document, with
// every alias bound to its anchor. ok is false, and the problem reported,
// when the YAML is malformed, holds no document (message Empty) or more
// than one, or has an alias with no preceding anchor of its name.
func (r *Reader[S]) Document(data []byte) (body ast.Node, ok bool) {
	// A UTF-8 byte-order mark may start a YAML stream (YAML 1.2, 5.2);
	// the parser would read it as part of the first key.
	data = bytes.TrimPrefix(data, []byte("\xef\xbb\xbf"))
	if !r.withinLimits(data) {
		return nil, false
	}
	f, err := parser.ParseBytes(data, 0)
	if err != nil {
		var ye yaml.Error
		if errors.As(err, &ye) {
			r.Errorf(errPos(ye), "", "YAML syntax error: %s", ye.GetMessage())
		} else {
			r.Errorf(Pos{}, "", "YAML syntax error: %v", err)
		}
		return nil, false
	}
	for _, d := range f.Docs {
		if d == nil || d.Body == nil {
			continue
		}
		if body != nil {
			r.Errorf(PosOf(d.Body), "", "only one YAML document is allowed")
			return nil, false
		}
		body = d.Body
	}
	if body == nil {
		r.Errorf(Pos{}, "", "%s", r.Empty)
		return nil, false
	}
	r.aliases = make(map[*ast.AliasNode]ast.Node)
	b := &aliasBinder{report: r.Errorf, anchors: make(map[string]ast.Node), aliases: r.aliases}
	ast.Walk(b, body)
	return body, !b.failed
}

// errPos returns where a goccy error is.
func errPos(e yaml.Error) Pos {
	tk := e.GetToken()
	if tk == nil || tk.Position == nil {
		return Pos{}
	}
	return Pos{tk.Position.Line, tk.Position.Column}
}

// aliasBinder walks a document in order and binds every alias to the value
// of the nearest preceding anchor of that name.
type aliasBinder struct {
	report  func(p Pos, field, format string, args ...any)
	anchors map[string]ast.Node
	aliases map[*ast.AliasNode]ast.Node
	failed  bool
}

// Visit implements ast.Visitor.
func (b *aliasBinder) Visit(n ast.Node) ast.Visitor {
	switch n := n.(type) {
	case *ast.AnchorNode:
		if n.Name != nil {
			b.anchors[n.Name.GetToken().Value] = n.Value
		}
	case *ast.AliasNode:
		name := ""
		if n.Value != nil {
			name = n.Value.GetToken().Value
		}
		v, ok := b.anchors[name]
		if !ok {
			b.report(PosOf(n), "", "YAML alias *%s refers to no preceding anchor &%s", name, name)
			b.failed = true
		}
		b.aliases[n] = v
		return nil
	}
	return b
}

// Resolve looks through anchors, aliases and tags; it returns nil for null
// (and for an alias that loops).
func (r *Reader[S]) Resolve(n ast.Node) ast.Node {
	// An alias can refer to an anchor enclosing it; the bound keeps such
	// documents from looping here (callers descend only a fixed depth).
	for range 32 {
		switch v := n.(type) {
		case *ast.AnchorNode:
			n = v.Value
		case *ast.AliasNode:
			n = r.aliases[v]
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

// Kind describes a resolved node for messages: "null", "a mapping", "a
// list", "a boolean", "a number", "a string", or "a " and its YAML name.
func Kind(n ast.Node) string {
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

// Scalar returns the text of a resolved scalar: the decoded value of a
// string, the source text of a number or boolean (so argv [sleep, 10]
// works). ok is false for anything else, null included.
func Scalar(n ast.Node) (text string, ok bool) {
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

// Entry is one key of a mapping or one element of a list.
type Entry struct {
	// Key is the mapping key; empty for a list element.
	Key string
	// Field is the dotted path, such as steps.a.timeout or hooks[0].name.
	Field string
	// KeyPos is where the key is; zero for a list element.
	KeyPos Pos
	// Val is the resolved value; nil for null.
	Val ast.Node
	// ValPos is where the value is (the key's position for null).
	ValPos Pos
}

// Map is a decoded mapping.
type Map struct {
	// Pos is where the mapping is (its first key).
	Pos Pos
	// Entries in file order, merged keys after explicit ones.
	Entries []Entry
}

// Get returns the entry for key; ok is true when it is present with a
// non-null value.
func (m Map) Get(key string) (e Entry, ok bool) {
	for _, e := range m.Entries {
		if e.Key == key {
			return e, e.Val != nil
		}
	}
	return Entry{}, false
}

// Has reports whether key is present, even with a null value.
func (m Map) Has(key string) bool {
	return slices.ContainsFunc(m.Entries, func(e Entry) bool { return e.Key == key })
}

// Mapping decodes n (already resolved) as a mapping at field; at locates n
// when n is null. Keys that are not scalars are reported and dropped;
// merge keys are expanded (explicit keys win over merged ones, earlier
// merged mappings over later ones) or refused (see NoMerge). When allowed
// is non-nil, keys outside it are reported and dropped (see Only). With
// Duplicates, keys that decode alike are reported after the first. ok is
// false, and the problem reported, when n is not a mapping.
func (r *Reader[S]) Mapping(n ast.Node, at Pos, field string, allowed []string) (Map, bool) {
	m, isMap := n.(*ast.MappingNode)
	if !isMap {
		want := "a mapping"
		if len(allowed) > 0 {
			want += " with keys " + strings.Join(allowed, ", ")
		}
		if n != nil {
			at = PosOf(n)
		}
		r.Errorf(at, field, "want %s, got %s", want, Kind(n))
		return Map{}, false
	}
	out := Map{Pos: PosOf(m)}
	var merged []Entry
	r.collect(m, field, &out.Entries, &merged, map[*ast.MappingNode]bool{m: true})
	for _, e := range merged {
		if !out.Has(e.Key) {
			out.Entries = append(out.Entries, e)
		}
	}
	if allowed != nil {
		out = r.Only(out, allowed, "key")
	}
	if r.Duplicates {
		var kept []Entry
		for _, e := range out.Entries {
			if slices.ContainsFunc(kept, func(x Entry) bool { return x.Key == e.Key }) {
				r.Errorf(e.KeyPos, e.Field, "duplicate key %q", e.Key)
				continue
			}
			kept = append(kept, e)
		}
		out.Entries = kept
	}
	return out, true
}

// Only reports each entry of m whose key is not in allowed as an unknown
// what (such as "key" or "role": `unknown key "x" (allowed: a, b)`) and
// returns m without them; m itself is left as it was.
func (r *Reader[S]) Only(m Map, allowed []string, what string) Map {
	for _, e := range m.Entries {
		if !slices.Contains(allowed, e.Key) {
			r.Errorf(e.KeyPos, e.Field, "unknown %s %q (allowed: %s)", what, e.Key, strings.Join(allowed, ", "))
		}
	}
	m.Entries = slices.DeleteFunc(slices.Clone(m.Entries), func(e Entry) bool { return !slices.Contains(allowed, e.Key) })
	return m
}

// collect appends m's explicit entries to own and the entries of mappings
// merged into it (recursively, each mapping once) to merged.
func (r *Reader[S]) collect(m *ast.MappingNode, field string, own, merged *[]Entry, seen map[*ast.MappingNode]bool) {
	for _, kv := range m.Values {
		if kv == nil || kv.Key == nil {
			continue
		}
		kp := PosOf(kv.Key)
		if kv.Key.IsMergeKey() {
			if r.NoMerge != "" {
				r.Errorf(kp, r.join(field, "<<"), "%s", r.NoMerge)
			} else {
				r.merge(kv, field, merged, seen)
			}
			continue
		}
		key, ok := Scalar(r.Resolve(kv.Key))
		if !ok {
			r.Errorf(kp, field, "mapping keys must be strings, got %s", Kind(r.Resolve(kv.Key)))
			continue
		}
		e := Entry{Key: key, Field: r.join(field, key), KeyPos: kp, Val: r.Resolve(kv.Value), ValPos: kp}
		if e.Val != nil {
			e.ValPos = PosOf(e.Val)
		}
		*own = append(*own, e)
	}
}

// merge expands one merge key: its value is a mapping or a list of them.
func (r *Reader[S]) merge(kv *ast.MappingValueNode, field string, merged *[]Entry, seen map[*ast.MappingNode]bool) {
	v := r.Resolve(kv.Value)
	srcs := []ast.Node{v}
	if s, ok := v.(*ast.SequenceNode); ok {
		srcs = s.Values
	}
	for _, src := range srcs {
		src = r.Resolve(src)
		m, ok := src.(*ast.MappingNode)
		if !ok {
			r.Errorf(PosOf(kv.Key), r.join(field, "<<"), "merge key wants a mapping or a list of mappings, got %s", Kind(src))
			continue
		}
		if seen[m] {
			continue
		}
		seen[m] = true
		var own []Entry
		r.collect(m, field, &own, merged, seen)
		for _, e := range own {
			if !slices.ContainsFunc(*merged, func(x Entry) bool { return x.Key == e.Key }) {
				*merged = append(*merged, e)
			}
		}
	}
}

// Join appends key to the dotted path field, quoting keys that are not
// plain names (letters, digits, _ and -) so the path stays unambiguous and
// on one line.
func Join(field, key string) string {
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

// join is Join, or with RawKeys a plain dotted join.
func (r *Reader[S]) join(field, key string) string {
	switch {
	case !r.RawKeys:
		return Join(field, key)
	case field == "":
		return key
	}
	return field + "." + key
}

// Str decodes e's value as a string (see Scalar); ok is false, and the
// problem reported, when it is not a scalar.
func (r *Reader[S]) Str(e Entry) (string, bool) {
	s, ok := Scalar(e.Val)
	if !ok {
		r.Errorf(e.ValPos, e.Field, "want a string, got %s", Kind(e.Val))
	}
	return s, ok
}

// Items returns the elements of e's list value as entries whose field is
// e's field with the index appended, such as hooks[2]. ok is false, and the
// problem reported with example as the expected form, when the value is
// not a list.
func (r *Reader[S]) Items(e Entry, example string) ([]Entry, bool) {
	seq, isSeq := e.Val.(*ast.SequenceNode)
	if !isSeq {
		r.Errorf(e.ValPos, e.Field, "want a list such as %s, got %s", example, Kind(e.Val))
		return nil, false
	}
	out := make([]Entry, len(seq.Values))
	for i, item := range seq.Values {
		it := Entry{Field: fmt.Sprintf("%s[%d]", e.Field, i), Val: r.Resolve(item), ValPos: PosOf(item)}
		if it.Val != nil {
			it.ValPos = PosOf(it.Val)
		}
		out[i] = it
	}
	return out, true
}

// Strings decodes e's value as a list of strings (see Items and Str) and
// returns the elements' entries too. When the value is a list with
// elements that are not scalars, those are reported, their strings left
// empty, and ok is false; when it is not a list, both slices are nil.
func (r *Reader[S]) Strings(e Entry, example string) ([]string, []Entry, bool) {
	items, ok := r.Items(e, example)
	if !ok {
		return nil, nil, false
	}
	out := make([]string, len(items))
	for i, it := range items {
		s, isStr := Scalar(it.Val)
		if !isStr {
			r.Errorf(it.ValPos, it.Field, "want a string, got %s", Kind(it.Val))
			ok = false
		}
		out[i] = s
	}
	return out, items, ok
}

// Limits of a definition file, checked before it is parsed: the YAML
// parser's time and memory grow faster than linearly with deep nesting,
// and a definition file is written by hand.
const (
	MaxFileBytes = 1 << 20
	MaxNesting   = 64
)

// withinLimits reports (and says why not) whether data is small and
// shallow enough to parse: at most MaxFileBytes, and at most MaxNesting
// levels of flow brackets or of indentation (counted in steps of two
// spaces).
func (r *Reader[S]) withinLimits(data []byte) bool {
	if len(data) > MaxFileBytes {
		r.Errorf(Pos{}, "", "the file is %d bytes, over the %d-byte limit of a definition file", len(data), MaxFileBytes)
		return false
	}
	depth, line, quote, lineStart := 0, 1, byte(0), true
	indent := 0
	for i := 0; i < len(data); i++ {
		c := data[i]
		if lineStart {
			if c == ' ' {
				indent++
				continue
			}
			lineStart = false
			if indent/2 > MaxNesting && c != '\n' && c != '#' {
				r.Errorf(Pos{Line: line}, "", "nested %d levels deep (indented %d spaces), over the limit of %d", indent/2, indent, MaxNesting)
				return false
			}
		}
		switch {
		case c == '\n':
			line, lineStart, indent = line+1, true, 0
			if quote == '\'' {
				quote = 0 // a single-quoted scalar may span lines; be lenient
			}
		case quote != 0:
			if c == quote {
				quote = 0
			} else if c == '\\' && quote == '"' {
				i++
			}
		case c == '"' || c == '\'':
			quote = c
		case c == '#' && (i == 0 || data[i-1] == ' ' || data[i-1] == '\t'):
			for i < len(data) && data[i] != '\n' {
				i++
			}
			i--
		case c == '[' || c == '{':
			if depth++; depth > MaxNesting {
				r.Errorf(Pos{Line: line}, "", "brackets nested %d levels deep, over the limit of %d", depth, MaxNesting)
				return false
			}
		case c == ']' || c == '}':
			depth = max(depth-1, 0)
		}
	}
	return true
}
