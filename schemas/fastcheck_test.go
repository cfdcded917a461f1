package schemas

import (
	"bytes"
	"encoding/json"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// genericValid is the generic validator's verdict on raw: the reference
// the fast check must agree with.
func genericValid(t testing.TB, c *Catalogue, typ string, raw []byte) bool {
	t.Helper()
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		return false
	}
	sch, err := c.schema(typ)
	if err != nil {
		t.Fatal(err)
	}
	return sch.Validate(inst) == nil
}

// agree fails the test when the fast check's verdict on raw contradicts
// the generic validator's, and returns the fast verdict. A pass must
// always hold. A fail must hold on well-formed JSON without duplicate
// names (wellFormed), what the fast check meets when it applies a
// subschema to a value it has read once already; on other text a fail
// only sends the data to the generic validator.
func agree(t testing.TB, c *Catalogue, typ string, raw []byte, wellFormed bool) verdict {
	t.Helper()
	fast := c.fast(typ)
	if fast == nil {
		return unsure
	}
	v := fastCheck(fast, raw)
	if v == unsure || (v == fail && !wellFormed) {
		return v
	}
	if g := genericValid(t, c, typ, raw); g != (v == pass) {
		t.Errorf("%s: fast check says %v, generic validator says valid=%v, for\n%s", typ, v, g, raw)
	}
	return v
}

func (v verdict) String() string {
	return [...]string{"pass", "fail", "unsure"}[v]
}

func TestFastCheckCoversTheCatalogue(t *testing.T) {
	c := newTestCatalogue(t)
	all := samples(t)
	for _, typ := range c.Types() {
		if c.fast(typ) == nil {
			t.Errorf("%s: the schema uses a keyword the fast check lacks; every event of it takes the generic validator", typ)
			continue
		}
		raw, err := json.Marshal(all[typ])
		if err != nil {
			t.Fatal(err)
		}
		if v := agree(t, c, typ, raw, true); v != pass {
			t.Errorf("%s: fast check on the sample: %v, want pass\n%s", typ, v, raw)
		}
	}
}

// TestFastCheckReadsEachValueAboutOnce bounds how often the fast check
// reads the values of each sample: a bare "$ref" must not read its value
// before the schema it names does, and an if, not or allOf that reads an
// object again must jump over the members it does not look into. Without
// either, nested schemas multiply the reads (session.started's sample took
// 15 reads a value).
func TestFastCheckReadsEachValueAboutOnce(t *testing.T) {
	c := newTestCatalogue(t)
	all := samples(t)
	reads := func(n *fastNode, raw []byte) (int, verdict) {
		s := fastScanner{b: raw}
		s.anything = fastNode{minLen: -1, maxLen: -1, minItems: -1, maxItems: -1, minProps: -1, maxProps: -1}
		v := s.check(n, 0)
		return s.reads, v
	}
	for _, typ := range c.Types() {
		raw, err := json.Marshal(all[typ])
		if err != nil {
			t.Fatal(err)
		}
		values, _ := reads(nil, raw) // any value: each read once
		got, v := reads(c.fast(typ), raw)
		if v != pass {
			t.Fatalf("%s: %v, want pass", typ, v)
		}
		if got > 2*values {
			t.Errorf("%s: %d reads of %d values; want at most %d", typ, got, values, 2*values)
		}
	}
}

// TestFastCheckAgrees checks variants of every sample (each member
// removed, each value replaced by values of every JSON type, names added)
// with both validators: where the fast check decides, it decides as the
// generic validator does.
func TestFastCheckAgrees(t *testing.T) {
	c := newTestCatalogue(t)
	all := samples(t)
	long := strings.Repeat("x", 1025)
	alternates := []any{
		nil, true, false,
		json.Number("0"), json.Number("-1"), json.Number("1"), json.Number("2"), json.Number("1.5"), json.Number("1.0"),
		json.Number("1e2"), json.Number("-0"), json.Number("99999999999999999999"), json.Number("1000000000000"),
		"", "a", "A b", "../x", "x/y", "sess-1", "sess-1.outline.1", "outline", "sha256:" + strings.Repeat("ab", 32),
		"é", "a\u0000b", "-x", "x.", "X", long[:64], long[:65], long[:129], long[:256], long,
		[]any{}, []any{"a"}, []any{json.Number("1")}, map[string]any{}, map[string]any{"a": "b"},
	}
	var mu sync.Mutex
	checked, decided := 0, 0
	t.Run("types", func(t *testing.T) {
		for _, typ := range c.Types() {
			t.Run(typ, func(t *testing.T) {
				t.Parallel()
				n, d := agreeOnVariants(t, c, typ, all[typ], alternates)
				mu.Lock()
				checked, decided = checked+n, decided+d
				mu.Unlock()
			})
		}
	})
	t.Logf("%d variants, %d decided by the fast check", checked, decided)
	if decided < checked*9/10 {
		t.Errorf("the fast check decided only %d of %d variants", decided, checked)
	}
}

// agreeOnVariants checks the variants of sample; it returns how many
// there were and how many the fast check decided.
func agreeOnVariants(t *testing.T, c *Catalogue, typ string, sample any, alternates []any) (checked, decided int) {
	raw, err := json.Marshal(sample)
	if err != nil {
		t.Fatal(err)
	}
	var doc any
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	if err := dec.Decode(&doc); err != nil {
		t.Fatal(err)
	}
	for _, variant := range variants(doc, alternates) {
		b, err := json.Marshal(variant)
		if err != nil {
			t.Fatal(err)
		}
		checked++
		if agree(t, c, typ, b, true) != unsure {
			decided++
		}
	}
	return checked, decided
}

// variants returns copies of doc each with one change: a member removed,
// a value replaced, a name added, an array item added or removed.
func variants(doc any, alternates []any) []any {
	var out []any
	var walk func(v any, set func(any) any)
	walk = func(v any, set func(any) any) {
		for _, a := range alternates {
			out = append(out, set(a))
		}
		switch v := v.(type) {
		case string:
			for _, suffix := range []string{"!", "/", " ", "A", "0", "-"} {
				out = append(out, set(v+suffix))
			}
		case map[string]any:
			keys := make([]string, 0, len(v))
			for k := range v {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			for _, k := range keys {
				out = append(out, set(without(v, k)))
				walk(v[k], func(nv any) any { return set(with(v, k, nv)) })
			}
			out = append(out, set(with(v, "zzUnknown", "x")))
		case []any:
			out = append(out, set(append(append([]any{}, v...), v...)))
			for i := range v {
				rest := append(append([]any{}, v[:i]...), v[i+1:]...)
				out = append(out, set(rest))
				walk(v[i], func(nv any) any {
					cp := append([]any{}, v...)
					cp[i] = nv
					return set(cp)
				})
			}
		}
	}
	walk(doc, func(v any) any { return v })
	return out
}

func with(m map[string]any, k string, v any) map[string]any {
	cp := make(map[string]any, len(m)+1)
	for kk, vv := range m {
		cp[kk] = vv
	}
	cp[k] = v
	return cp
}

func without(m map[string]any, k string) map[string]any {
	cp := with(m, k, nil)
	delete(cp, k)
	return cp
}

// TestFastCheckRawJSON holds the fast check to the generic validator on
// text no encoder writes: duplicate names, escapes, odd numbers, broken
// JSON, trailing bytes.
func TestFastCheckRawJSON(t *testing.T) {
	c := newTestCatalogue(t)
	const typ = TypeJobStarted
	good := `{"jobId":"sess-1.outline.1","worker":"w1","delivery":1}`
	if v := agree(t, c, typ, []byte(good), true); v != pass {
		t.Fatalf("fast check on %s: %v", good, v)
	}
	cases := []string{
		good + " ",
		" \n" + good,
		good + "x",
		good + good,
		`{"jobId":"sess-1.outline.1","worker":"w1","delivery":1,"delivery":0}`,
		`{"jobId":"sess-1.outline.1","worker":"w1","delivery":0,"delivery":1}`,
		`{"jobId":"sess-1.outline.1","worker":"w1","worker":"","delivery":1}`,
		`{"job\u0049d":"sess-1.outline.1","worker":"w1","delivery":1}`,
		`{"jobId":"sess-1.outline.1","worker":"w\u0031","delivery":1}`,
		`{"jobId":"sess-1.outline.1","worker":"w1\"","delivery":1}`,
		`{"jobId":"sess-1.outline.1","worker":"w1","delivery":1.0}`,
		`{"jobId":"sess-1.outline.1","worker":"w1","delivery":1e0}`,
		`{"jobId":"sess-1.outline.1","worker":"w1","delivery":1.5}`,
		`{"jobId":"sess-1.outline.1","worker":"w1","delivery":-0}`,
		`{"jobId":"sess-1.outline.1","worker":"w1","delivery":01}`,
		`{"jobId":"sess-1.outline.1","worker":"w1","delivery":+1}`,
		`{"jobId":"sess-1.outline.1","worker":"w1","delivery":1.}`,
		`{"jobId":"sess-1.outline.1","worker":"w1","delivery":123456789012345678901234567890}`,
		`{"jobId":"sess-1.outline.1","worker":"w1","delivery":1,}`,
		`{"jobId":"sess-1.outline.1","worker":"w1" "delivery":1}`,
		`{"jobId":"sess-1.outline.1","worker":"w1","delivery":tru}`,
		`{"jobId":"sess-1.outline.1","worker":"w1","delivery":1`,
		`{"jobId":"sess-1.outline.1","worker":"w1\x01","delivery":1}`,
		"{\"jobId\":\"sess-1.outline.1\",\"worker\":\"w\xff\",\"delivery\":1}",
		`{"jobId":"sess-1.outline.1","worker":"w1","delivery":1,"extra":[1,2,{"a":[]}]}`,
		`{"jobId":"sess-1.outline.1","worker":"w1","delivery":1,"extra":[1,2,{"a":[}]}`,
		`{"jobId":"sess-1.outline.1","worker":"w1","delivery":1,"extra":"\uZZZZ"}`,
		`[]`, `null`, `"x"`, `1`, ``, `{}`,
		`{"jobId":"","worker":"w1","delivery":1}`,
		`{"jobId":"sess-1.outline.1","worker":"w1","delivery":0}`,
	}
	for _, raw := range cases {
		agree(t, c, typ, []byte(raw), false)
	}
	// A duplicate name under if/then: the generic decoder keeps the last
	// "kind", which asks for a backlog the session lacks.
	started, err := json.Marshal(samples(t)[TypeSessionStarted])
	if err != nil {
		t.Fatal(err)
	}
	dup := bytes.Replace(started, []byte(`{"pipeline":{`), []byte(`{"pipeline":{"kind":"loops","kind":"backlog",`), 1)
	if bytes.Equal(dup, started) {
		t.Fatal("the session.started sample no longer starts with its pipeline")
	}
	if genericValid(t, c, TypeSessionStarted, dup) {
		t.Fatalf("the generic validator passes %s", dup)
	}
	if v := agree(t, c, TypeSessionStarted, dup, false); v == pass {
		t.Error("a duplicate name passed the fast check")
	}

	// Nesting past the fast check's bound is left to the generic validator.
	deep := `{"jobId":"sess-1.outline.1","worker":"w1","delivery":1,"extra":` + strings.Repeat("[", 300) + strings.Repeat("]", 300) + "}"
	if v := agree(t, c, typ, []byte(deep), false); v != unsure {
		t.Errorf("nesting of 300: %v, want unsure", v)
	}
}

// FuzzFastCheck: on any bytes, for any event type, the fast check never
// contradicts the generic validator.
func FuzzFastCheck(f *testing.F) {
	c, err := NewCatalogue()
	if err != nil {
		f.Fatal(err)
	}
	types := c.Types()
	all := samples(f)
	for i, typ := range types {
		raw, err := json.Marshal(all[typ])
		if err != nil {
			f.Fatal(err)
		}
		f.Add(uint8(i), raw)
	}
	f.Fuzz(func(t *testing.T, ti uint8, raw []byte) {
		typ := types[int(ti)%len(types)]
		if len(raw) > 1<<16 {
			return
		}
		agree(t, c, typ, raw, false)
	})
}

// TestCompileFastDocuments compiles small schema documents for the fast
// check straight from their text: the forms it reads are decided as the
// generic validator decides them, and every other form makes it leave the
// whole schema to the generic validator.
func TestCompileFastDocuments(t *testing.T) {
	cases := []struct {
		schema    string
		supported bool
		values    []string
	}{
		{`{"$schema":"https://json-schema.org/draft/2020-12/schema","$id":"urn:x","type":"object",
		   "properties":{"a/b":{"$ref":"#/$defs/name"},"n":{"$ref":"#/properties/a~1b"},"t~":{"$ref":"#/allOf/0/properties/i"}},
		   "required":["a/b","gone"],"additionalProperties":{"type":"integer"},
		   "allOf":[{"properties":{"i":{"type":"integer","minimum":1,"exclusiveMaximum":3}}}],
		   "$defs":{"name":{"type":"string","minLength":2,"maxLength":4,"pattern":"^[a-z]+$","format":"email"}}}`,
			true, []string{`{"a/b":"ab","gone":1}`, `{"a/b":"ab"}`, `{"a/b":"a","gone":1}`, `{"a/b":"abcde","gone":1}`, `{"a/b":"AB","gone":1}`,
				`{"a/b":"ab","gone":1,"n":"xy","t~":2}`, `{"a/b":"ab","gone":1,"t~":3}`, `{"a/b":"ab","gone":1,"t~":0}`, `{"a/b":"ab","gone":1,"t~":1.5}`, `{"a/b":"ab","gone":1,"x":1}`, `{"a/b":"ab","gone":"1"}`}},
		{`{"$ref":"#/$defs/node","$defs":{"node":{"type":"object","properties":{"next":{"$ref":"#/$defs/node"},"v":{"enum":["a",1,null,true]}},"additionalProperties":false}}}`,
			true, []string{`{}`, `{"next":{"next":{"v":1.0}}}`, `{"next":{"v":"b"}}`, `{"v":null}`, `[]`, `{"next":{"w":1}}`}},
		{`{"if":{"properties":{"k":{"const":"x"}},"required":["k"]},"then":{"required":["x"]},"else":{"required":["y"]}}`,
			true, []string{`{"k":"x","x":1}`, `{"k":"x","y":1}`, `{"k":"z","y":1}`, `{"k":"z","x":1}`, `{}`}},
		{`{"if":true,"then":{"type":"string"},"else":{"type":"number"}}`, true, []string{`"a"`, `1`}},
		{`{"if":false,"then":{"type":"string"},"else":{"type":"number"}}`, true, []string{`"a"`, `1`}},
		{`{"then":{"type":"string"}}`, true, []string{`1`}},
		{`{"type":["string","null"],"allOf":[{"maxLength":3}],"anyOf":[{"type":"null"},{"minLength":1}],"oneOf":[{"type":"null"},{"pattern":"a"}],"not":{"const":"b"}}`,
			true, []string{`null`, `"a"`, `""`, `"b"`, `"abcd"`, `"xa"`, `1`}},
		{`{"type":"array","items":{"type":"number","maximum":1.5},"minItems":1,"maxItems":2}`, true, []string{`[1]`, `[1.5,2]`, `[]`, `[1,1,1]`, `[1.6]`}},
		{`{"type":"object","minProperties":1,"maxProperties":1,"propertyNames":{"pattern":"^x"},"additionalProperties":{"type":"boolean"}}`,
			true, []string{`{"x":true}`, `{"y":true}`, `{"x":1}`, `{}`, `{"x":true,"xx":false}`}},
		{`false`, true, []string{`null`}},
		{`{"$schema":"http://json-schema.org/draft-07/schema#","type":"string"}`, false, nil},
		{`{"type":"object","properties":{"a":{"$id":"urn:other","type":"string"}}}`, false, nil},
		{`{"type":"object","properties":{"a":{"$schema":"https://json-schema.org/draft/2020-12/schema"}}}`, false, nil},
		{`{"$ref":"urn:elsewhere#/$defs/a"}`, false, nil},
		{`{"$ref":"#anchor","$defs":{"a":{"$anchor":"anchor"}}}`, false, nil},
		{`{"$ref":"#/$defs/missing"}`, false, nil},
		{`{"$ref":"#/allOf/01","allOf":[true,true]}`, false, nil},
		{`{"$ref":"#/$defs/a/properties/b","$defs":{"a":{"$id":"urn:other","properties":{"b":{"$ref":"#/$defs/c"}},"$defs":{"c":{"type":"string"}}},"c":{"type":"integer"}}}`, false, nil},
		{`{"$ref":"#/$defs/~2","$defs":{"~2":true}}`, false, nil},
		{`{"additionalProperties":null}`, false, nil},
		{`{"type":"string","x-extension":1}`, false, nil},
		{`{"patternProperties":{"^a":true}}`, false, nil},
		{`{"uniqueItems":true}`, false, nil},
		{`{"multipleOf":2}`, false, nil},
		{`{"type":"decimal"}`, false, nil},
		{`{"minLength":1.5}`, false, nil},
		{`{"minLength":-1}`, false, nil},
		{`{"pattern":"(?<"}`, false, nil},
		{`{"enum":[{"a":1}]}`, false, nil},
		{`{"allOf":[]}`, false, nil},
		{`"string"`, false, nil},
	}
	for i, tc := range cases {
		doc, err := jsonschema.UnmarshalJSON(strings.NewReader(tc.schema))
		if err != nil {
			t.Fatalf("case %d: %v", i, err)
		}
		n := compileFast(doc)
		if (n != nil) != tc.supported {
			t.Errorf("case %d: supported %v, want %v: %s", i, n != nil, tc.supported, tc.schema)
			continue
		}
		if n == nil {
			continue
		}
		comp := jsonschema.NewCompiler()
		comp.UseLoader(noLoader{})
		if err := comp.AddResource("urn:test", doc); err != nil {
			t.Fatal(err)
		}
		sch, err := comp.Compile("urn:test")
		if err != nil {
			t.Fatalf("case %d: %v", i, err)
		}
		verdicts := map[verdict]int{}
		for _, raw := range tc.values {
			v := fastCheck(n, []byte(raw))
			verdicts[v]++
			inst, err := jsonschema.UnmarshalJSON(strings.NewReader(raw))
			if err != nil {
				t.Fatal(err)
			}
			if valid := sch.Validate(inst) == nil; v != unsure && valid != (v == pass) {
				t.Errorf("case %d: %s: fast check says %v, generic validator says valid=%v", i, raw, v, valid)
			}
		}
		if len(tc.values) > 1 && (verdicts[pass] == 0 || verdicts[fail] == 0) {
			t.Errorf("case %d: verdicts %v; want both a pass and a fail among %v", i, verdicts, tc.values)
		}
	}
}

// BenchmarkCompile compiles every type's schema in a new catalogue, as a
// process does the first time it meets each type: for the fast check
// alone (all a process that meets only valid data pays), and for the
// generic validator too.
func BenchmarkCompile(b *testing.B) {
	b.Run("fast", func(b *testing.B) {
		for b.Loop() {
			c, err := NewCatalogue()
			if err != nil {
				b.Fatal(err)
			}
			for _, typ := range c.Types() {
				if c.fast(typ) == nil {
					b.Fatalf("%s: no fast check", typ)
				}
			}
		}
	})
	b.Run("generic", func(b *testing.B) {
		for b.Loop() {
			c, err := NewCatalogue()
			if err != nil {
				b.Fatal(err)
			}
			if err := c.CompileAll(); err != nil {
				b.Fatal(err)
			}
		}
	})
}
