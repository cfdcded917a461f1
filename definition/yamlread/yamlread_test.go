package yamlread

import (
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/goccy/go-yaml/ast"
)

var errTest = errors.New("invalid test file")

// testKind gives the test's problems their type and sentinel.
type testKind struct{}

func (testKind) Sentinel() error { return errTest }

// otherKind is a second format, whose problems must not be taken for
// testKind's.
type otherKind struct{}

func (otherKind) Sentinel() error { return errors.New("other") }

// dump decodes the whole document the way a caller would and lists every
// scalar as field=text@line:col (null as field=null@...), descending
// mappings (keys outside allowed rejected at the top) and lists.
func dump(t *testing.T, r *Reader[testKind], data []byte, allowed []string) []string {
	t.Helper()
	body, ok := r.Document(data)
	if !ok {
		return nil
	}
	var out []string
	var walk func(e Entry)
	walk = func(e Entry) {
		switch e.Val.(type) {
		case nil:
			out = append(out, fmt.Sprintf("%s=null@%d:%d", e.Field, e.ValPos.Line, e.ValPos.Col))
		case *ast.MappingNode:
			m, _ := r.Mapping(e.Val, e.ValPos, e.Field, nil)
			for _, c := range m.Entries {
				walk(c)
			}
		case *ast.SequenceNode:
			items, _ := r.Items(e, "[a]")
			for _, c := range items {
				walk(c)
			}
		default:
			s, _ := r.Str(e)
			out = append(out, fmt.Sprintf("%s=%s@%d:%d", e.Field, s, e.ValPos.Line, e.ValPos.Col))
		}
	}
	top, ok := r.Mapping(r.Resolve(body), Pos{}, "", allowed)
	if !ok {
		return nil
	}
	for _, e := range top.Entries {
		walk(e)
	}
	return out
}

// problems lists r's problems, sorted, as line:col field: msg.
func problems(t *testing.T, r *Reader[testKind]) []string {
	t.Helper()
	err := r.Err()
	if err == nil {
		return nil
	}
	var es Errors[testKind]
	if !errors.As(err, &es) {
		t.Fatalf("Err() = %T, want Errors", err)
	}
	out := make([]string, len(es))
	for i, e := range es {
		out[i] = fmt.Sprintf("%d:%d %s: %s", e.Line, e.Column, e.Field, e.Msg)
	}
	return out
}

func TestReader(t *testing.T) {
	tests := []struct {
		name    string
		doc     string
		setup   func(*Reader[testKind])
		allowed []string
		want    []string
		wantErr []string
	}{
		{
			name: "positions",
			doc:  "a: 1\nb:\n  c: x\n  d: [y, \"z\"]\ne:\n",
			want: []string{"a=1@1:4", "b.c=x@3:6", "b.d[0]=y@4:7", "b.d[1]=z@4:10", "e=null@5:1"},
		},
		{
			name: "aliases and tags are looked through",
			doc:  "x: &v {k: 1}\ny: *v\nz: !!map\n  k: v\n",
			want: []string{"x.k=1@1:11", "y.k=1@1:11", "z.k=v@4:6"},
		},
		{
			name:    "alias without anchor",
			doc:     "a: *nope\nb: &nope 1\n",
			wantErr: []string{"1:4 : YAML alias *nope refers to no preceding anchor &nope"},
		},
		{
			name: "merge keys expanded, explicit keys win",
			doc:  "base: &b {x: 1, y: 2}\nm: {<<: *b, y: 3}\n",
			want: []string{"base.x=1@1:14", "base.y=2@1:20", "m.y=3@2:16", "m.x=1@1:14"},
		},
		{
			name: "merge list, earlier mappings win",
			doc:  "a: &a {x: 1}\nb: &b {x: 2, y: 2}\nc: {<<: [*a, *b]}\n",
			want: []string{"a.x=1@1:11", "b.x=2@2:11", "b.y=2@2:17", "c.x=1@1:11", "c.y=2@2:17"},
		},
		{
			name:    "merge of a scalar",
			doc:     "c: {<<: 1, d: 2}\n",
			want:    []string{"c.d=2@1:15"},
			wantErr: []string{`1:5 c."<<": merge key wants a mapping or a list of mappings, got a number`},
		},
		{
			name:    "merge keys refused",
			doc:     "base: &b {x: 1}\nm: {<<: *b, y: 3}\n",
			setup:   func(r *Reader[testKind]) { r.NoMerge = "no merges here" },
			want:    []string{"base.x=1@1:14", "m.y=3@2:16"},
			wantErr: []string{`2:5 m."<<": no merges here`},
		},
		{
			name:    "merge keys refused, raw keys",
			doc:     "m: {<<: {x: 1}, y: 3}\n",
			setup:   func(r *Reader[testKind]) { r.NoMerge, r.RawKeys = "no merges here", true },
			want:    []string{"m.y=3@1:20"},
			wantErr: []string{`1:5 m.<<: no merges here`},
		},
		{
			name:    "keys written alike are a syntax error",
			doc:     "a: 1\n\"a\": 2\n",
			wantErr: []string{`2:1 : YAML syntax error: mapping key "a" already defined at [1:1]`},
		},
		{
			name: "keys decoding alike, first wins",
			doc:  "{&k a: 1, *k : 2}\n",
			want: []string{"a=1@1:8", "a=2@1:16"},
		},
		{
			name:    "keys decoding alike, duplicates reported",
			doc:     "{&k a: 1, *k : 2}\n",
			setup:   func(r *Reader[testKind]) { r.Duplicates = true },
			want:    []string{"a=1@1:8"},
			wantErr: []string{`1:11 a: duplicate key "a"`},
		},
		{
			name:    "unknown keys, also duplicated",
			doc:     "{a: 1, &k b: 2, *k : 3}\n",
			setup:   func(r *Reader[testKind]) { r.Duplicates = true },
			allowed: []string{"a"},
			want:    []string{"a=1@1:5"},
			wantErr: []string{`1:8 b: unknown key "b" (allowed: a)`, `1:17 b: unknown key "b" (allowed: a)`},
		},
		{
			name: "keys that are not plain names are quoted",
			doc:  "\"a b\": {\"x.y\": 1}\n",
			want: []string{`"a b"."x.y"=1@1:16`},
		},
		{
			name:  "raw keys",
			doc:   "\"a b\": {\"x.y\": 1}\n",
			setup: func(r *Reader[testKind]) { r.RawKeys = true },
			want:  []string{`a b.x.y=1@1:16`},
		},
		{
			name:    "key that is not a string",
			doc:     "~: x\nb: 2\n",
			want:    []string{"b=2@2:4"},
			wantErr: []string{"1:1 : mapping keys must be strings, got null"},
		},
		{
			name:    "not a mapping",
			doc:     "- 1\n",
			allowed: []string{"a", "b"},
			wantErr: []string{"1:1 : want a mapping with keys a, b, got a list"},
		},
		{
			name:    "empty",
			doc:     "# nothing\n",
			setup:   func(r *Reader[testKind]) { r.Empty = "file is empty: want a mapping" },
			wantErr: []string{"0:0 : file is empty: want a mapping"},
		},
		{
			name:    "two documents",
			doc:     "a: 1\n---\nb: 2\n",
			wantErr: []string{"3:1 : only one YAML document is allowed"},
		},
		{
			name:    "syntax error",
			doc:     "a: [\n",
			wantErr: []string{"1:4 : YAML syntax error: sequence end token ']' not found"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := &Reader[testKind]{File: "f.yaml"}
			if tt.setup != nil {
				tt.setup(r)
			}
			got := dump(t, r, []byte(tt.doc), tt.allowed)
			if !slices.Equal(got, tt.want) {
				t.Errorf("entries:\n got %q\nwant %q", got, tt.want)
			}
			if errs := problems(t, r); !slices.Equal(errs, tt.wantErr) {
				t.Errorf("problems:\n got %q\nwant %q", errs, tt.wantErr)
			}
		})
	}
}

func TestStrings(t *testing.T) {
	tests := []struct {
		name    string
		doc     string
		want    []string
		wantAt  []Pos
		wantOK  bool
		wantErr []string
	}{
		{name: "strings and numbers", doc: "l: [a, 10, \"b\"]\n", want: []string{"a", "10", "b"}, wantAt: []Pos{{1, 5}, {1, 8}, {1, 12}}, wantOK: true},
		{name: "empty list", doc: "l: []\n", want: []string{}, wantAt: []Pos{}, wantOK: true},
		{name: "element not a string", doc: "l:\n  - a\n  - {x: y}\n", want: []string{"a", ""}, wantAt: []Pos{{2, 5}, {3, 6}},
			wantErr: []string{"3:6 l[1]: want a string, got a mapping"}},
		{name: "not a list", doc: "l: a\n", wantErr: []string{"1:4 l: want a list such as [x, y], got a string"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := &Reader[testKind]{File: "f.yaml"}
			body, ok := r.Document([]byte(tt.doc))
			if !ok {
				t.Fatalf("Document: %v", r.Err())
			}
			m, _ := r.Mapping(body, Pos{}, "", []string{"l"})
			e, _ := m.Get("l")
			got, items, ok := r.Strings(e, "[x, y]")
			var at []Pos
			if items != nil {
				at = []Pos{}
			}
			for _, it := range items {
				at = append(at, it.ValPos)
			}
			if !slices.Equal(got, tt.want) || !slices.Equal(at, tt.wantAt) || ok != tt.wantOK {
				t.Errorf("Strings = %q at %v ok %v, want %q at %v ok %v", got, at, ok, tt.want, tt.wantAt, tt.wantOK)
			}
			if errs := problems(t, r); !slices.Equal(errs, tt.wantErr) {
				t.Errorf("problems:\n got %q\nwant %q", errs, tt.wantErr)
			}
		})
	}
}

func TestErr(t *testing.T) {
	r := &Reader[testKind]{File: "f.yaml"}
	if err := r.Err(); err != nil {
		t.Fatalf("Err() with no problems = %#v, want nil", err)
	}
	cause := errors.New("cause")
	r.Errorf(Pos{3, 1}, "c", "third: %w", cause)
	r.Errorf(Pos{1, 5}, "b", "second")
	r.Errorf(Pos{}, "", "first")
	r.Errorf(Pos{1, 2}, "a", "between")
	err := r.Err()
	want := "f.yaml: first\nf.yaml:1: a: between\nf.yaml:1: b: second\nf.yaml:3: c: third: cause"
	if err == nil || err.Error() != want {
		t.Fatalf("Err() = %v, want\n%s", err, want)
	}
	if !errors.Is(err, errTest) || !errors.Is(err, cause) {
		t.Errorf("errors.Is(sentinel) = %v, errors.Is(cause) = %v, want both", errors.Is(err, errTest), errors.Is(err, cause))
	}
	var first *Error[testKind]
	if !errors.As(err, &first) || first.Msg != "first" {
		t.Errorf("errors.As(*Error) = %v, want the first problem", first)
	}
	var other Errors[otherKind]
	var otherOne *Error[otherKind]
	if errors.As(err, &other) || errors.As(err, &otherOne) {
		t.Errorf("errors.As took testKind problems for otherKind ones")
	}
	for _, tt := range []struct {
		name string
		err  *Error[testKind]
		want string
	}{
		{"no line", &Error[testKind]{File: "f.yaml", Field: "x", Msg: "bad"}, "f.yaml: x: bad"},
		{"no file", &Error[testKind]{Line: 2, Msg: "bad"}, "line 2: bad"},
		{"nothing", &Error[testKind]{Msg: "bad"}, "bad"},
	} {
		if got := tt.err.Error(); got != tt.want || !errors.Is(tt.err, errTest) {
			t.Errorf("%s: Error() = %q, want %q wrapping the sentinel", tt.name, got, tt.want)
		}
	}
}
