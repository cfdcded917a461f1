package schemas

import (
	"encoding/json"
	"math"
	"math/big"
	"math/bits"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
	"unsafe"
)

// The fast check: a JSON Schema compiled from its document on its own, for
// checking raw JSON in one pass over its bytes, without building a tree of
// values. It decides only what it can decide exactly as the generic
// validator (jsonschema) does; anything else it calls unsure, and the
// generic validator, which also writes the error messages, decides. A
// value it passes the generic validator passes too (TestFastCheckAgrees,
// TestCompileFastDocuments and FuzzFastCheck hold it to that).

// verdict is the fast check's answer.
type verdict uint8

const (
	pass   verdict = iota // valid, for certain
	fail                  // invalid, for certain
	unsure                // the generic validator must decide
)

// JSON types as bits, in the fast check's own numbering.
const (
	jNull uint8 = 1 << iota
	jBool
	jNumber // any number; a schema's "integer" is jInteger
	jInteger
	jString
	jArray
	jObject
)

// Bounds of the fast check, beyond which it is unsure.
const (
	fastMaxDepth = 256 // nested values and subschemas applied to one value
	fastMaxKeys  = 64  // names of one object outside its properties that it tracks
)

// fastNode is one schema compiled for the fast check.
type fastNode struct {
	never bool  // the false schema
	types uint8 // allowed types; 0: any

	enum     []any // strings, bools, nil and numbers as *big.Rat
	hasEnum  bool
	constVal any
	hasConst bool

	ref, not, ifN, thenN, elseN *fastNode
	allOf, anyOf, oneOf         []*fastNode

	// strings
	minLen, maxLen int // -1: none
	pattern        matcher

	// numbers
	minimum, maximum, exMinimum, exMaximum *big.Rat
	minI, maxI, exMinI, exMaxI             int64 // the same bounds, when whole and in int64
	intBounds                              bool  // every bound set has its int64 form

	// objects
	minProps, maxProps int // -1: none
	props              map[string]propNode
	required           []int // indexes into props' idx
	reqNames           []string
	noAdditional       bool
	additional         *fastNode
	propNames          *fastNode

	// arrays
	items              *fastNode
	minItems, maxItems int // -1: none

	// bare: the node's own keywords accept every value, so check lets
	// its ref read the value instead of reading it twice (a bare "$ref"
	// per level of nesting would otherwise double the reads per level).
	bare bool
}

type propNode struct {
	idx  int
	node *fastNode
}

// compileFast compiles a schema document, as jsonschema.UnmarshalJSON
// returns it, for the fast check, or returns nil when the document uses a
// keyword, a reference or a form the fast check does not implement. It
// reads the document rather than the generic validator's compiled schema,
// so that a process that meets only valid data never compiles that one,
// which checks the document against the meta-schema and compiles every
// pattern: most of the time of compiling both.
func compileFast(doc any) *fastNode {
	c := fastCompiler{root: doc, done: map[string]*fastNode{}}
	if root, ok := doc.(map[string]any); ok {
		if d, ok := root["$schema"]; ok && d != draft2020 {
			return nil
		}
	}
	n := c.node("", doc)
	if c.unsupported {
		return nil
	}
	return n
}

// draft2020 is the dialect the catalogue's schemas are written in, and
// the generic validator's default.
const draft2020 = "https://json-schema.org/draft/2020-12/schema"

type fastCompiler struct {
	root any
	// done holds the node compiled for each place in the document, by
	// its JSON pointer, so that a recursive "$ref" meets the node being
	// built.
	done        map[string]*fastNode
	unsupported bool
}

// fastKeyword reports whether the fast check reads keyword k. Besides the
// keywords it applies, it reads past annotations the generic validator
// does not assert ("format" among them, as the 2020-12 dialect has it) and
// "$defs", which holds schemas only for references; any other keyword
// makes the schema unsupported.
func fastKeyword(k string) bool {
	switch k {
	case "type", "enum", "const", "$ref", "not", "if", "then", "else", "allOf", "anyOf", "oneOf",
		"minLength", "maxLength", "pattern",
		"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
		"properties", "required", "additionalProperties", "minProperties", "maxProperties", "propertyNames",
		"items", "minItems", "maxItems",
		"$comment", "title", "description", "default", "examples", "deprecated", "readOnly", "writeOnly",
		"format", "$defs":
		return true
	}
	return false
}

// node compiles the schema v found at path (a JSON pointer into the
// document).
func (c *fastCompiler) node(path string, v any) *fastNode {
	if n, ok := c.done[path]; ok {
		return n // a recursive schema refers to a node being built
	}
	n := &fastNode{minLen: -1, maxLen: -1, minItems: -1, maxItems: -1, minProps: -1, maxProps: -1}
	c.done[path] = n
	switch s := v.(type) {
	case bool:
		n.never = !s
		return n
	case map[string]any:
		c.object(n, path, s)
	default:
		c.unsupported = true
	}
	return n
}

// object compiles the keywords of schema s, found at path, into n.
func (c *fastCompiler) object(n *fastNode, path string, s map[string]any) {
	for k := range s {
		// "$schema" and "$id" only at the root: elsewhere they start a
		// resource of their own, with its own base for references.
		if !fastKeyword(k) && (path != "" || (k != "$schema" && k != "$id")) {
			c.unsupported = true
			return
		}
	}
	if t, ok := s["type"]; ok {
		n.types = c.types(t)
	}
	if e, ok := s["enum"]; ok {
		arr, ok := e.([]any)
		if !ok {
			c.unsupported = true
			return
		}
		n.hasEnum = true
		for _, v := range arr {
			n.enum = append(n.enum, c.scalar(v))
		}
	}
	if v, ok := s["const"]; ok {
		n.hasConst, n.constVal = true, c.scalar(v)
	}
	if r, ok := s["$ref"]; ok {
		n.ref = c.ref(r)
	}
	n.not = c.sub(path, s, "not")
	if _, ok := s["if"]; ok {
		// As the generic validator does: "then" only under an "if" that
		// may pass, "else" only under one that may fail.
		n.ifN = c.sub(path, s, "if")
		if b, ok := s["if"].(bool); !ok || b {
			n.thenN = c.sub(path, s, "then")
		}
		if b, ok := s["if"].(bool); !ok || !b {
			n.elseN = c.sub(path, s, "else")
		}
	}
	n.allOf, n.anyOf, n.oneOf = c.subs(path, s, "allOf"), c.subs(path, s, "anyOf"), c.subs(path, s, "oneOf")
	n.minLen, n.maxLen = c.count(s, "minLength"), c.count(s, "maxLength")
	if p, ok := s["pattern"]; ok {
		src, ok := p.(string)
		if !ok {
			c.unsupported = true
			return
		}
		m, err := fastPattern(src)
		if err != nil {
			c.unsupported = true
			return
		}
		n.pattern = m
	}
	n.minimum, n.maximum = c.number(s, "minimum"), c.number(s, "maximum")
	n.exMinimum, n.exMaximum = c.number(s, "exclusiveMinimum"), c.number(s, "exclusiveMaximum")
	n.intBounds = true
	for _, b := range []struct {
		r *big.Rat
		i *int64
	}{{n.minimum, &n.minI}, {n.maximum, &n.maxI}, {n.exMinimum, &n.exMinI}, {n.exMaximum, &n.exMaxI}} {
		if b.r == nil {
			continue
		}
		if !b.r.IsInt() || !b.r.Num().IsInt64() {
			n.intBounds = false
			continue
		}
		*b.i = b.r.Num().Int64()
	}
	if p, ok := s["properties"]; ok {
		props, ok := p.(map[string]any)
		if !ok {
			c.unsupported = true
			return
		}
		n.props = make(map[string]propNode, len(props))
		for name, ps := range props {
			n.props[name] = propNode{idx: len(n.props), node: c.node(path+"/properties/"+escapePointer(name), ps)}
		}
	}
	if r, ok := s["required"]; ok {
		arr, ok := r.([]any)
		if !ok {
			c.unsupported = true
			return
		}
		for _, v := range arr {
			name, ok := v.(string)
			if !ok {
				c.unsupported = true
				return
			}
			n.reqNames = append(n.reqNames, name)
			if p, ok := n.props[name]; ok {
				n.required = append(n.required, p.idx)
			} else {
				n.required = append(n.required, -1)
			}
		}
	}
	a, hasAdditional := s["additionalProperties"]
	switch a := a.(type) {
	case nil:
		c.unsupported = c.unsupported || hasAdditional // null is no schema
	case bool:
		n.noAdditional = !a
	default:
		n.additional = c.sub(path, s, "additionalProperties")
	}
	n.minProps, n.maxProps = c.count(s, "minProperties"), c.count(s, "maxProperties")
	n.propNames = c.sub(path, s, "propertyNames")
	n.items = c.sub(path, s, "items")
	n.minItems, n.maxItems = c.count(s, "minItems"), c.count(s, "maxItems")
	n.bare = n.ownAcceptsAll()
}

// sub compiles the subschema under keyword k of s (at path), or returns
// nil when s has none.
func (c *fastCompiler) sub(path string, s map[string]any, k string) *fastNode {
	v, ok := s[k]
	if !ok {
		return nil
	}
	return c.node(path+"/"+k, v)
}

// subs compiles the array of subschemas under keyword k of s (at path).
func (c *fastCompiler) subs(path string, s map[string]any, k string) []*fastNode {
	v, ok := s[k]
	if !ok {
		return nil
	}
	arr, ok := v.([]any)
	if !ok || len(arr) == 0 {
		c.unsupported = true
		return nil
	}
	out := make([]*fastNode, len(arr))
	for i, sub := range arr {
		out[i] = c.node(path+"/"+k+"/"+strconv.Itoa(i), sub)
	}
	return out
}

// ref compiles the schema a "$ref" names. Only references into the same
// document by JSON pointer are supported.
func (c *fastCompiler) ref(v any) *fastNode {
	s, ok := v.(string)
	if !ok || !strings.HasPrefix(s, "#") {
		c.unsupported = true
		return nil
	}
	frag, err := url.PathUnescape(s[1:])
	if err != nil || (frag != "" && frag[0] != '/') {
		c.unsupported = true // not a pointer: an anchor
		return nil
	}
	target, path := c.root, ""
	if frag != "" {
		for _, tok := range strings.Split(frag[1:], "/") {
			if strings.Count(tok, "~") != strings.Count(tok, "~0")+strings.Count(tok, "~1") {
				c.unsupported = true // an escape other than ~0 and ~1
				return nil
			}
			tok = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
			switch t := target.(type) {
			case map[string]any:
				// A schema passed through on the way that starts a resource
				// of its own would be the base of references below it.
				if path != "" && (t["$id"] != nil || t["$schema"] != nil) {
					c.unsupported = true
					return nil
				}
				if target, ok = t[tok]; !ok {
					c.unsupported = true
					return nil
				}
			case []any:
				i, err := strconv.Atoi(tok)
				if err != nil || i < 0 || i >= len(t) || strconv.Itoa(i) != tok {
					c.unsupported = true
					return nil
				}
				target = t[i]
			default:
				c.unsupported = true
				return nil
			}
			path += "/" + escapePointer(tok)
		}
	}
	return c.node(path, target)
}

// escapePointer escapes a name for a JSON pointer.
func escapePointer(name string) string {
	return strings.ReplaceAll(strings.ReplaceAll(name, "~", "~0"), "/", "~1")
}

// types returns the type bits of a "type" keyword's value.
func (c *fastCompiler) types(v any) uint8 {
	var names []any
	switch t := v.(type) {
	case string:
		names = []any{t}
	case []any:
		names = t
	}
	if len(names) == 0 {
		c.unsupported = true
		return 0
	}
	var bits uint8
	for _, name := range names {
		switch name {
		case "null":
			bits |= jNull
		case "boolean":
			bits |= jBool
		case "number":
			bits |= jNumber | jInteger
		case "integer":
			bits |= jInteger
		case "string":
			bits |= jString
		case "array":
			bits |= jArray
		case "object":
			bits |= jObject
		default:
			c.unsupported = true
		}
	}
	return bits
}

// count returns a non-negative whole bound (minLength and the like), or
// -1 when s has none.
func (c *fastCompiler) count(s map[string]any, k string) int {
	r := c.number(s, k)
	if r == nil {
		return -1
	}
	if !r.IsInt() || r.Sign() < 0 || !r.Num().IsInt64() || r.Num().Int64() > math.MaxInt32 {
		c.unsupported = true
		return -1
	}
	return int(r.Num().Int64())
}

// number returns the value of a numeric keyword, or nil when s has none.
func (c *fastCompiler) number(s map[string]any, k string) *big.Rat {
	v, ok := s[k]
	if !ok {
		return nil
	}
	num, ok := v.(json.Number)
	if !ok {
		c.unsupported = true
		return nil
	}
	r, ok := new(big.Rat).SetString(string(num))
	if !ok {
		c.unsupported = true
		return nil
	}
	return r
}

// readsAgain reports whether checking a value against n reads it more
// than once.
func (n *fastNode) readsAgain() bool {
	return (n.ref != nil && !n.bare) || n.not != nil || n.ifN != nil ||
		len(n.allOf) > 0 || len(n.anyOf) > 0 || len(n.oneOf) > 0
}

// ownAcceptsAll reports whether n's own keywords (not its subschemas)
// accept every JSON value.
func (n *fastNode) ownAcceptsAll() bool {
	return !n.never && n.types == 0 && !n.hasEnum && !n.hasConst &&
		n.minLen < 0 && n.maxLen < 0 && n.pattern == nil && !n.hasBounds() &&
		n.minProps < 0 && n.maxProps < 0 && len(n.props) == 0 && len(n.required) == 0 &&
		!n.noAdditional && n.additional == nil && n.propNames == nil &&
		n.items == nil && n.minItems < 0 && n.maxItems < 0
}

// scalar returns an enum or const value as the fast check compares it
// (strings, booleans and null as they are, numbers as *big.Rat), and
// marks the schema unsupported for any other.
func (c *fastCompiler) scalar(v any) any {
	switch v := v.(type) {
	case string, bool, nil:
		return v
	case json.Number:
		if r, ok := new(big.Rat).SetString(string(v)); ok {
			return r
		}
	}
	c.unsupported = true
	return nil
}

// fastCheck checks raw JSON against n. It passes only a single well-formed
// JSON value, with nothing after it but white space, that satisfies n.
func fastCheck(n *fastNode, raw []byte) verdict {
	s := fastScanner{b: raw}
	s.anything = fastNode{minLen: -1, maxLen: -1, minItems: -1, maxItems: -1, minProps: -1, maxProps: -1}
	s.ws()
	v := s.check(n, 0)
	if v != pass {
		return v
	}
	s.ws()
	if s.i != len(s.b) {
		return unsure
	}
	return pass
}

// fastScanner walks raw JSON, checking values as it goes.
type fastScanner struct {
	b        []byte
	i        int
	anything fastNode // the schema of any value
	// ends maps the start of a container read and found well formed to
	// its end; nil until a schema that reads values again is met.
	ends map[int]int
	// reads counts the values read, each time one is read (tests bound it).
	reads int
}

func (s *fastScanner) ws() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// check reads one value at s.i and checks it against n (nil: any value).
// It leaves s.i after the value when it passes; after fail or unsure the
// position is of no use.
func (s *fastScanner) check(n *fastNode, depth int) verdict {
	if depth > fastMaxDepth || s.i >= len(s.b) {
		return unsure
	}
	if n == nil {
		return s.skip(depth)
	}
	if n.never {
		return fail
	}
	start := s.i
	if s.ends == nil && n.readsAgain() {
		s.ends = map[int]int{}
	}
	ref := n.ref
	if n.bare && ref != nil {
		// The ref reads the value once, as own would have: a pass means a
		// whole value read and s.i after it.
		if v := s.check(ref, depth+1); v != pass {
			return v
		}
		ref = nil
	} else if v := s.own(n, depth); v != pass {
		return v
	}
	end := s.i
	// Subschemas applied to the same value read it again.
	again := func(sub *fastNode) verdict {
		s.i = start
		return s.check(sub, depth+1)
	}
	if ref != nil {
		if v := again(ref); v != pass {
			return v
		}
	}
	if n.not != nil {
		switch again(n.not) {
		case pass:
			return fail
		case unsure:
			return unsure
		}
	}
	for _, sub := range n.allOf {
		if v := again(sub); v != pass {
			return v
		}
	}
	if len(n.anyOf) > 0 {
		res := fail // unsure once a branch is unsure, pass once one passes
		for _, sub := range n.anyOf {
			if r := again(sub); r == pass {
				res = pass
				break
			} else if r == unsure {
				res = unsure
			}
		}
		if res != pass {
			return res
		}
	}
	if len(n.oneOf) > 0 {
		matched := 0
		for _, sub := range n.oneOf {
			switch again(sub) {
			case pass:
				matched++
			case unsure:
				return unsure
			}
		}
		if matched != 1 {
			return fail
		}
	}
	if n.ifN != nil {
		switch again(n.ifN) {
		case pass:
			if n.thenN != nil {
				if v := again(n.thenN); v != pass {
					return v
				}
			}
		case fail:
			if n.elseN != nil {
				if v := again(n.elseN); v != pass {
					return v
				}
			}
		default:
			return unsure
		}
	}
	s.i = end
	s.remember(start)
	return pass
}

// own reads one value and checks it against n's own keywords (not its
// subschemas).
func (s *fastScanner) own(n *fastNode, depth int) verdict {
	s.reads++
	switch c := s.b[s.i]; {
	case c == '{' || c == '[':
		container := jObject
		if c == '[' {
			container = jArray
		}
		if n.rejects(container) {
			return fail
		}
		if n.hasEnum || n.hasConst {
			return unsure // never an object or array in a supported enum
		}
		if c == '{' {
			return s.object(n, depth)
		}
		return s.array(n, depth)
	case c == '"':
		if n.rejects(jString) {
			return fail
		}
		return s.str(n)
	case c == 't' || c == 'f':
		if !s.literal() {
			return unsure
		}
		if n.rejects(jBool) {
			return fail
		}
		return s.scalarMatches(n, c == 't')
	case c == 'n':
		if !s.literal() {
			return unsure
		}
		if n.rejects(jNull) {
			return fail
		}
		return s.scalarMatches(n, nil)
	case c == '-' || (c >= '0' && c <= '9'):
		return s.number(n)
	}
	return unsure
}

// scalarMatches checks a boolean or null value against n's enum and const.
func (s *fastScanner) scalarMatches(n *fastNode, v any) verdict {
	if n.hasConst && n.constVal != v {
		return fail
	}
	if n.hasEnum {
		for _, e := range n.enum {
			if e == v {
				return pass
			}
		}
		return fail
	}
	return pass
}

func (s *fastScanner) literal() bool {
	for _, w := range [...]string{"true", "false", "null"} {
		if len(s.b)-s.i >= len(w) && string(s.b[s.i:s.i+len(w)]) == w {
			s.i += len(w)
			return true
		}
	}
	return false
}

// number reads a number. Whole numbers of up to 18 digits are compared as
// int64; any other is compared exactly, as the generic validator does.
func (s *fastScanner) number(n *fastNode) verdict {
	start := s.i
	if s.b[s.i] == '-' {
		s.i++
	}
	if s.i >= len(s.b) {
		return unsure
	}
	digits := s.i
	if s.b[s.i] == '0' {
		s.i++
	} else if s.b[s.i] >= '1' && s.b[s.i] <= '9' {
		for s.i < len(s.b) && s.b[s.i] >= '0' && s.b[s.i] <= '9' {
			s.i++
		}
	} else {
		return unsure
	}
	whole := s.i - digits
	plain := true
	if s.i < len(s.b) && s.b[s.i] == '.' {
		plain = false
		s.i++
		if !s.digits() {
			return unsure
		}
	}
	if s.i < len(s.b) && (s.b[s.i] == 'e' || s.b[s.i] == 'E') {
		plain = false
		s.i++
		if s.i < len(s.b) && (s.b[s.i] == '+' || s.b[s.i] == '-') {
			s.i++
		}
		if !s.digits() {
			return unsure
		}
	}
	lit := s.b[start:s.i]
	if plain && whole <= 18 && (n.intBounds || !n.hasBounds()) && !n.hasEnum && !n.hasConst {
		if n.rejects(jInteger) {
			return fail
		}
		if !n.hasBounds() {
			return pass
		}
		x, err := strconv.ParseInt(unsafe.String(&lit[0], len(lit)), 10, 64)
		if err != nil {
			return unsure
		}
		if (n.minimum != nil && x < n.minI) || (n.maximum != nil && x > n.maxI) ||
			(n.exMinimum != nil && x <= n.exMinI) || (n.exMaximum != nil && x >= n.exMaxI) {
			return fail
		}
		return pass
	}
	// Rare: fractions, exponents, long numbers, bounds that are not whole,
	// numbers in enums. big.Rat reads the literal exactly, as the generic
	// validator does.
	if len(lit) > 64 {
		return unsure
	}
	r, ok := new(big.Rat).SetString(string(lit))
	if !ok {
		return unsure
	}
	if n.types != 0 && n.types&jNumber == 0 && (n.types&jInteger == 0 || !r.IsInt()) {
		return fail
	}
	if (n.minimum != nil && r.Cmp(n.minimum) < 0) || (n.maximum != nil && r.Cmp(n.maximum) > 0) ||
		(n.exMinimum != nil && r.Cmp(n.exMinimum) <= 0) || (n.exMaximum != nil && r.Cmp(n.exMaximum) >= 0) {
		return fail
	}
	equal := func(e any) bool { er, isNum := e.(*big.Rat); return isNum && er.Cmp(r) == 0 }
	if n.hasConst && !equal(n.constVal) {
		return fail
	}
	if n.hasEnum {
		for _, e := range n.enum {
			if equal(e) {
				return pass
			}
		}
		return fail
	}
	return pass
}

// rejects reports whether n's types leave out the JSON type t.
func (n *fastNode) rejects(t uint8) bool { return n.types != 0 && n.types&t == 0 }

func (n *fastNode) hasBounds() bool {
	return n.minimum != nil || n.maximum != nil || n.exMinimum != nil || n.exMaximum != nil
}

func (s *fastScanner) digits() bool {
	from := s.i
	for s.i < len(s.b) && s.b[s.i] >= '0' && s.b[s.i] <= '9' {
		s.i++
	}
	return s.i > from
}

// rawString reads a string and returns its bytes between the quotes, and
// whether they can be used as they are (no escapes, valid UTF-8). ok is
// false for a string that is not well formed.
func (s *fastScanner) rawString() (raw []byte, plain, ok bool) {
	s.i++ // the opening quote
	from := s.i
	plain = true
	for s.i < len(s.b) {
		c := s.b[s.i]
		switch {
		case c == '"':
			raw = s.b[from:s.i]
			s.i++
			if plain && !utf8.Valid(raw) {
				plain = false
			}
			return raw, plain, true
		case c == '\\':
			plain = false
			s.i++
			if s.i >= len(s.b) {
				return nil, false, false
			}
			switch s.b[s.i] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				s.i++
			case 'u':
				if len(s.b)-s.i < 5 || !isHex4(s.b[s.i+1:s.i+5]) {
					return nil, false, false
				}
				s.i += 5
			default:
				return nil, false, false
			}
		case c < 0x20:
			return nil, false, false
		default:
			s.i++
		}
	}
	return nil, false, false
}

func isHex4(b []byte) bool {
	for _, c := range b {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F') {
			return false
		}
	}
	return true
}

// decoded is the string value of a string literal's body, as encoding/json
// decodes it (escapes resolved, bad UTF-8 replaced).
func decoded(raw []byte, plain bool) (string, bool) {
	if plain {
		return unsafe.String(unsafe.SliceData(raw), len(raw)), true
	}
	var str string
	quoted := make([]byte, 0, len(raw)+2)
	quoted = append(append(append(quoted, '"'), raw...), '"')
	if json.Unmarshal(quoted, &str) != nil {
		return "", false
	}
	return str, true
}

func (s *fastScanner) str(n *fastNode) verdict {
	raw, plain, ok := s.rawString()
	if !ok {
		return unsure
	}
	if n.minLen < 0 && n.maxLen < 0 && n.pattern == nil && !n.hasEnum && !n.hasConst {
		return pass
	}
	str, ok := decoded(raw, plain)
	if !ok {
		return unsure
	}
	if n.minLen >= 0 || n.maxLen >= 0 {
		l := utf8.RuneCountInString(str)
		if (n.minLen >= 0 && l < n.minLen) || (n.maxLen >= 0 && l > n.maxLen) {
			return fail
		}
	}
	if n.pattern != nil && !n.pattern.MatchString(str) {
		return fail
	}
	if n.hasConst {
		if c, isStr := n.constVal.(string); !isStr || c != str {
			return fail
		}
	}
	if n.hasEnum {
		for _, e := range n.enum {
			if e, isStr := e.(string); isStr && e == str {
				return pass
			}
		}
		return fail
	}
	return pass
}

// skip reads one value of any content, checking only that it is well
// formed.
func (s *fastScanner) skip(depth int) verdict {
	start := s.i
	if end, ok := s.ends[start]; ok {
		s.i = end
		return pass
	}
	v := s.own(&s.anything, depth)
	if v == pass {
		s.remember(start)
	}
	return v
}

// remember notes where the container at start, just read and found well
// formed, ends, once a schema that reads values again was met: a read
// again that only needs to get past it (skip) then jumps. Without it, an
// if, not or allOf on an object reads the whole of it again, subtrees and
// all, once per subschema, and nested ones multiply the reads.
func (s *fastScanner) remember(start int) {
	if s.ends != nil && (s.b[start] == '{' || s.b[start] == '[') {
		s.ends[start] = s.i
	}
}

func (s *fastScanner) object(n *fastNode, depth int) verdict {
	s.i++             // {
	var seen uint64   // n's properties met, by idx
	var few [8]string // most objects have few names beyond n's properties
	extra := few[:0]
	v := pass
	s.ws()
	if s.i < len(s.b) && s.b[s.i] == '}' {
		s.i++
		return s.required(n, seen, nil, v)
	}
	for {
		s.ws()
		if s.i >= len(s.b) || s.b[s.i] != '"' {
			return unsure
		}
		rawKey, plain, ok := s.rawString()
		if !ok {
			return unsure
		}
		key, ok := decoded(rawKey, plain)
		if !ok {
			return unsure
		}
		s.ws()
		if s.i >= len(s.b) || s.b[s.i] != ':' {
			return unsure
		}
		s.i++
		s.ws()
		var sub *fastNode
		p, known := n.props[key]
		switch {
		case known && p.idx < 64:
			if seen&(1<<p.idx) != 0 {
				return unsure // a duplicate name: the generic decoder keeps the last
			}
			seen |= 1 << p.idx
			sub = p.node
		case known:
			return unsure
		default:
			if slices.Contains(extra, key) {
				return unsure // a duplicate name: the generic decoder keeps the last
			}
			if len(extra) == fastMaxKeys {
				return unsure
			}
			extra = append(extra, key) // lives no longer than the check
			if n.noAdditional {
				v = fail
			}
			sub = n.additional
		}
		if n.propNames != nil {
			if pv := fastCheck(n.propNames, quoteKey(key, plain)); pv != pass {
				if pv == unsure {
					return unsure
				}
				v = fail
			}
		}
		if sv := s.check(sub, depth+1); sv != pass {
			return sv
		}
		if done, ok := s.next('}'); !ok {
			return unsure
		} else if done {
			return s.required(n, seen, extra, v)
		}
	}
}

// quoteKey makes a property name a JSON string again, for propertyNames.
func quoteKey(key string, plain bool) []byte {
	if plain { // no quote, backslash or control character to escape
		return append(append(append(make([]byte, 0, len(key)+2), '"'), key...), '"')
	}
	b, err := json.Marshal(key)
	if err != nil {
		return nil
	}
	return b
}

// required checks that every required member was met (n's properties by
// index, other names among extra), and the number of members. v is the
// object's verdict so far, pass or fail.
func (s *fastScanner) required(n *fastNode, seen uint64, extra []string, v verdict) verdict {
	if count := bits.OnesCount64(seen) + len(extra); (n.minProps >= 0 && count < n.minProps) || (n.maxProps >= 0 && count > n.maxProps) {
		return fail
	}
	for i, idx := range n.required {
		switch {
		case idx >= 64:
			return unsure
		case idx >= 0 && seen&(1<<idx) == 0, idx < 0 && !slices.Contains(extra, n.reqNames[i]):
			return fail
		}
	}
	return v
}

func (s *fastScanner) array(n *fastNode, depth int) verdict {
	s.i++ // [
	count := 0
	s.ws()
	if s.i < len(s.b) && s.b[s.i] == ']' {
		s.i++
		return s.arrayLen(n, count)
	}
	for {
		s.ws()
		if v := s.check(n.items, depth+1); v != pass {
			return v
		}
		count++
		if done, ok := s.next(']'); !ok {
			return unsure
		} else if done {
			return s.arrayLen(n, count)
		}
	}
}

// next reads what follows an item of an object or array: a comma (more
// to come) or close (done). ok is false for anything else.
func (s *fastScanner) next(close byte) (done, ok bool) {
	s.ws()
	if s.i >= len(s.b) {
		return false, false
	}
	switch s.b[s.i] {
	case ',':
		s.i++
		return false, true
	case close:
		s.i++
		return true, true
	}
	return false, false
}

func (s *fastScanner) arrayLen(n *fastNode, count int) verdict {
	if (n.minItems >= 0 && count < n.minItems) || (n.maxItems >= 0 && count > n.maxItems) {
		return fail
	}
	return pass
}
