package bus

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"
	"unicode/utf8"
)

// The wire format is CloudEvents 1.0 in structured mode: one JSON object
// whose members are the context attributes and "data". It is read and
// written here in one pass, without an intermediate SDK event: an event is
// parsed once (its data then once more, into its Go type) and encoded by
// appending. bus/conformance_test.go holds both directions against the
// CloudEvents SDK.

// specVersion is the only CloudEvents version loopbus reads and writes.
const specVersion = "1.0"

// dataContentType is the datacontenttype of every loopbus event.
const dataContentType = "application/json"

// maxJSONDepth bounds the nesting of an event's JSON, as encoding/json does.
const maxJSONDepth = 10000

// attrSpecVersion to attrForkOf number the attributes envelope keeps
// (attrIndex): the index of envelope.attrs and the bit of envelope.seen;
// numAttrs counts them.
const (
	attrSpecVersion = iota
	attrID
	attrSource
	attrType
	attrSubject
	attrTime
	attrDataContentType
	attrDataSchema
	attrSession
	attrStep
	attrJob
	attrCausation
	attrCorrelation
	attrForkOf
	numAttrs
)

// attrNames names the attributes envelope keeps, by attrIndex.
var attrNames = [numAttrs]string{
	"specversion", "id", "source", "type", "subject", "time", "datacontenttype", "dataschema",
	extSession, extStep, extJob, extCausation, extCorrelation, extForkOf,
}

// envelope is a structured-mode CloudEvent as loopbus reads it: the
// attributes it uses, as the values of their JSON strings, and data as raw
// JSON. Both are slices of the event's bytes (a value with escapes is a
// decoded copy), so reading an event makes strings only of what the
// reader keeps.
type envelope struct {
	attrs [numAttrs][]byte
	data  []byte
	// seen records which attributes were present, by their attrIndex, so
	// a missing one and an empty one differ.
	seen uint32
}

// attrIndex numbers the attributes envelope keeps; -1 for any other
// member. Every one is a JSON string on the wire.
func attrIndex(name []byte) int {
	switch string(name) {
	case "specversion":
		return attrSpecVersion
	case "id":
		return attrID
	case "source":
		return attrSource
	case "type":
		return attrType
	case "subject":
		return attrSubject
	case "time":
		return attrTime
	case "datacontenttype":
		return attrDataContentType
	case "dataschema":
		return attrDataSchema
	case extSession:
		return attrSession
	case extStep:
		return attrStep
	case extJob:
		return attrJob
	case extCausation:
		return attrCausation
	case extCorrelation:
		return attrCorrelation
	case extForkOf:
		return attrForkOf
	}
	return -1
}

func (e *envelope) has(i int) bool { return e.seen&(1<<i) != 0 }

// parseEnvelope reads a structured-mode CloudEvent. It accepts exactly one
// JSON object (valid JSON, nested at most maxJSONDepth deep, nothing but
// white space after it) whose members have distinct names, whose known
// attributes are strings, and whose other members are extensions named in
// lower-case letters and digits, as CloudEvents 1.0 requires; "data" is
// kept as raw JSON. It checks no attribute's value: the caller does.
//
// Errors of JSON syntax wrap errSyntax.
func parseEnvelope(b []byte) (envelope, error) {
	var e envelope
	s := scanner{b: b}
	s.ws()
	if !s.eat('{') {
		if err := s.value(0); err != nil {
			return e, err
		}
		if err := s.end(); err != nil {
			return e, err
		}
		return e, errors.New("not a JSON object")
	}
	// The names of the members that are not attributes kept, to refuse
	// one given twice: a few (an event has one, its traceparent) in
	// others, and all in many once there are more, so that an event of
	// many members costs no more than a map.
	var few [8][]byte
	others := few[:0]
	var many map[string]bool
	s.ws()
	if s.eat('}') {
		return e, s.end()
	}
	for {
		s.ws()
		name, err := s.text()
		if err != nil {
			return e, fmt.Errorf("member name: %w", err)
		}
		s.ws()
		if !s.eat(':') {
			return e, s.errf("want ':' after member %q", name)
		}
		s.ws()
		if i := attrIndex(name); i >= 0 {
			if e.has(i) {
				return e, fmt.Errorf("attribute %q appears twice", name)
			}
			e.seen |= 1 << i
			if s.peek() != '"' {
				return e, fmt.Errorf("attribute %s is not a string", name)
			}
			v, err := s.text()
			if err != nil {
				return e, fmt.Errorf("attribute %s: %w", name, err)
			}
			e.attrs[i] = v
		} else {
			data := string(name) == "data"
			if data {
				if e.data != nil {
					return e, errors.New(`member "data" appears twice`)
				}
			} else {
				if !extensionName(name) {
					return e, fmt.Errorf("member %q: attribute names are lower-case letters and digits", name)
				}
				if many == nil && len(others) == len(few) {
					many = make(map[string]bool, 2*len(few))
					for _, o := range others {
						many[string(o)] = true
					}
				}
				var twice bool
				if many != nil {
					twice = many[string(name)]
					many[string(name)] = true
				} else {
					twice = slices.ContainsFunc(others, func(o []byte) bool { return bytes.Equal(o, name) })
					others = append(others, name)
				}
				if twice {
					return e, fmt.Errorf("attribute %q appears twice", name)
				}
			}
			start := s.i
			skip := s.value
			if data {
				skip = s.skipData
			}
			if err := skip(0); err != nil {
				return e, fmt.Errorf("member %s: %w", name, err)
			}
			if data {
				e.data = b[start:s.i]
			}
		}
		s.ws()
		if s.eat(',') {
			continue
		}
		if s.eat('}') {
			return e, s.end()
		}
		return e, s.errf("want ',' or '}'")
	}
}

// extensionName reports whether name is a CloudEvents 1.0 attribute name:
// lower-case ASCII letters and digits.
func extensionName(name []byte) bool {
	if len(name) == 0 {
		return false
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; (c < 'a' || c > 'z') && (c < '0' || c > '9') {
			return false
		}
	}
	return true
}

// uriReference returns s as the URI reference the source attribute must
// be, in the form net/url writes it (as the CloudEvents SDK reads it: a
// non-ASCII or space character escaped), and whether it is one.
func uriReference(s string) (string, bool) {
	if strings.TrimSpace(s) == "" {
		return "", false
	}
	for i := 0; i < len(s); i++ {
		// The common case, a plain path or name, needs no parser.
		if c := s[i]; !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '.' || c == '_' || c == '/') {
			u, err := url.Parse(s)
			if err != nil {
				return "", false
			}
			n := u.String() // "#" is the empty reference
			return n, strings.TrimSpace(n) != ""
		}
	}
	return s, true
}

// scanner reads JSON from b at i.
type scanner struct {
	b []byte
	i int
}

// errSyntax: the bytes are not JSON.
var errSyntax = errors.New("not JSON")

func (s *scanner) errf(format string, a ...any) error {
	return fmt.Errorf("%w: offset %d: %s", errSyntax, s.i, fmt.Sprintf(format, a...))
}

func (s *scanner) ws() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

func (s *scanner) peek() byte {
	if s.i < len(s.b) {
		return s.b[s.i]
	}
	return 0
}

func (s *scanner) eat(c byte) bool {
	if s.i < len(s.b) && s.b[s.i] == c {
		s.i++
		return true
	}
	return false
}

func (s *scanner) end() error {
	s.ws()
	if s.i != len(s.b) {
		return s.errf("data after the JSON object")
	}
	return nil
}

// text reads a JSON string and returns its value: a slice of s.b (valid
// as long as the event's bytes are) unless it has escapes, which are
// decoded into a copy.
func (s *scanner) text() ([]byte, error) {
	start := s.i
	escaped, wide, err := s.skipString()
	if err != nil {
		return nil, err
	}
	raw := s.b[start:s.i]
	if wide && !utf8.Valid(raw) {
		// As the event's data, which JSON v2 refuses likewise: readers
		// that replace bad bytes and readers that keep them would differ.
		return nil, errors.New("a string is not valid UTF-8")
	}
	if !escaped {
		return raw[1 : len(raw)-1], nil
	}
	// Escapes are rare: encoding/json decodes them as every other reader
	// of the event would.
	var v string
	if err := json.Unmarshal(raw, &v); err != nil {
		return nil, fmt.Errorf("%w: %v", errSyntax, err)
	}
	return []byte(v), nil
}

// Masks of the bytes of a uint64, for looking at eight bytes of a string
// at once (skipString).
const (
	lowBits  = 0x0101010101010101
	highBits = 0x8080808080808080
)

// plain reports whether none of the eight bytes in x is a quote, a
// backslash or a control character, nor (unless wide) above ASCII:
// whether skipString can move past them at once. Each test is exact for
// the word as a whole (a borrow only ever carries from a byte that
// matches): x^c has a zero byte where x has c; x-n has the high bit set
// where a byte of x below n borrowed.
func plain(x uint64, wide bool) bool {
	quote := x ^ (lowBits * '"')
	bslash := x ^ (lowBits * '\\')
	special := (quote-lowBits)&^quote | (bslash-lowBits)&^bslash | (x-lowBits*0x20)&^x
	if !wide {
		special |= x
	}
	return special&highBits == 0
}

// skipString moves past a JSON string, reporting whether it has escapes
// and whether it has bytes above ASCII (which the caller checks for
// UTF-8 if it keeps the value).
func (s *scanner) skipString() (escaped, wide bool, err error) {
	if !s.eat('"') {
		return false, false, s.errf("want a string")
	}
	for s.i < len(s.b) {
		// Most of a string is plain text: eight bytes at a time.
		for s.i+8 <= len(s.b) && plain(binary.LittleEndian.Uint64(s.b[s.i:]), wide) {
			s.i += 8
		}
		if s.i >= len(s.b) {
			break
		}
		c := s.b[s.i]
		switch {
		case c == '"':
			s.i++
			return escaped, wide, nil
		case c < 0x20:
			return false, false, s.errf("control character in a string")
		case c == '\\':
			escaped = true
			s.i++
			if s.i >= len(s.b) {
				return false, false, s.errf("unterminated string")
			}
			switch s.b[s.i] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				s.i++
			case 'u':
				if s.i+5 > len(s.b) {
					return false, false, s.errf("unterminated string")
				}
				for _, h := range s.b[s.i+1 : s.i+5] {
					if !isHex(h) {
						return false, false, s.errf("bad \\u escape")
					}
				}
				s.i += 5
			default:
				return false, false, s.errf("bad escape")
			}
		default:
			wide = wide || c >= 0x80
			s.i++
		}
	}
	return false, false, s.errf("unterminated string")
}

func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}

// value moves past one JSON value, checking its syntax as json.Valid does.
func (s *scanner) value(depth int) error {
	if depth >= maxJSONDepth {
		return s.errf("nested more than %d deep", maxJSONDepth)
	}
	switch c := s.peek(); {
	case c == '{':
		s.i++
		return s.items('}', func() error {
			if _, _, err := s.skipString(); err != nil {
				return err
			}
			s.ws()
			if !s.eat(':') {
				return s.errf("want ':'")
			}
			s.ws()
			return s.value(depth + 1)
		})
	case c == '[':
		s.i++
		return s.items(']', func() error { return s.value(depth + 1) })
	case c == '"':
		_, _, err := s.skipString()
		return err
	case c == 't':
		return s.literal("true")
	case c == 'f':
		return s.literal("false")
	case c == 'n':
		return s.literal("null")
	case c == '-' || c >= '0' && c <= '9':
		return s.number()
	}
	return s.errf("want a JSON value")
}

// skipData moves past the value of "data", finding its end by its strings
// and brackets without checking the rest of its grammar: the decoder of
// its Go type reads all of it next and refuses what is not JSON, so a
// second full check here would only double the cost of every event.
func (s *scanner) skipData(int) error {
	depth := 0
	for s.i < len(s.b) {
		switch c := s.b[s.i]; c {
		case '"':
			if _, _, err := s.skipString(); err != nil {
				return err
			}
			if depth == 0 {
				return nil
			}
			continue
		case '{', '[':
			if depth++; depth > maxJSONDepth {
				return s.errf("nested more than %d deep", maxJSONDepth)
			}
		case '}', ']':
			if depth == 0 {
				return nil // the end of a scalar, or of the event
			}
			if depth--; depth == 0 {
				s.i++
				return nil
			}
		case ',', ' ', '\t', '\n', '\r':
			if depth == 0 {
				return nil // the end of a scalar
			}
		}
		s.i++
	}
	if depth > 0 {
		return s.errf("unterminated data")
	}
	return nil
}

// items reads the comma-separated items of an object or array, each with
// item, from after its opening bracket to past close.
func (s *scanner) items(close byte, item func() error) error {
	s.ws()
	if s.eat(close) {
		return nil
	}
	for {
		s.ws()
		if err := item(); err != nil {
			return err
		}
		s.ws()
		if s.eat(',') {
			continue
		}
		if s.eat(close) {
			return nil
		}
		return s.errf("want ',' or '%c'", close)
	}
}

func (s *scanner) literal(word string) error {
	if len(s.b)-s.i < len(word) || string(s.b[s.i:s.i+len(word)]) != word {
		return s.errf("want %s", word)
	}
	s.i += len(word)
	return nil
}

func (s *scanner) digits() int {
	n := 0
	for s.i < len(s.b) && s.b[s.i] >= '0' && s.b[s.i] <= '9' {
		s.i++
		n++
	}
	return n
}

func (s *scanner) number() error {
	s.eat('-')
	switch {
	case s.eat('0'):
	case s.digits() == 0:
		return s.errf("bad number")
	}
	if s.eat('.') && s.digits() == 0 {
		return s.errf("bad number")
	}
	if s.eat('e') || s.eat('E') {
		if !s.eat('+') {
			s.eat('-')
		}
		if s.digits() == 0 {
			return s.errf("bad number")
		}
	}
	return nil
}

// appendString appends s as a JSON string, escaped as encoding/json does;
// invalid UTF-8 becomes U+FFFD.
func appendString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c == '"' || c == '\\' || c >= 0x80 {
			q, _ := json.Marshal(s) // cannot fail for a string
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

// appendEvent appends the structured-mode CloudEvent with these attributes
// and data (raw JSON) to b. Empty extension values are left out.
func appendEvent(b []byte, id, source, typ, subject, dataSchema string, t time.Time, ext [7][2]string, data []byte) []byte {
	b = append(b, `{"specversion":"`+specVersion+`","id":`...)
	b = appendString(b, id)
	b = append(b, `,"source":`...)
	b = appendString(b, source)
	b = append(b, `,"type":`...)
	b = appendString(b, typ)
	b = append(b, `,"subject":`...)
	b = appendString(b, subject)
	b = append(b, `,"datacontenttype":"`+dataContentType+`","dataschema":`...)
	b = appendString(b, dataSchema)
	b = append(b, `,"time":"`...)
	b = t.UTC().AppendFormat(b, time.RFC3339Nano)
	b = append(b, '"')
	for _, x := range ext {
		if x[1] == "" {
			continue
		}
		b = append(b, ',')
		b = appendString(b, x[0])
		b = append(b, ':')
		b = appendString(b, x[1])
	}
	b = append(b, `,"data":`...)
	b = append(b, data...)
	return append(b, '}')
}
