package bus

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"
)

// FuzzScannerAgreesWithValid: the scanner that skips unknown members and
// finds the end of data accepts exactly the JSON encoding/json accepts.
func FuzzScannerAgreesWithValid(f *testing.F) {
	for _, s := range []string{`{"a":[1,-2.5e+3,true,false,null,"x\u00e9\n"]}`, `[]`, `{}`, `01`, `1.`, `"\x"`, `[1,]`, `{"a" 1}`, ` "s" `, `-`, `1e`, "\"\x01\""} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		s := scanner{b: b}
		s.ws()
		err := s.value(0)
		if err == nil {
			err = s.end()
		}
		if got, want := err == nil, json.Valid(b); got != want {
			t.Fatalf("scanner says %v (%v), json.Valid %v, for %q", got, err, want, b)
		}
	})
}

// TestTextEveryPosition: a string with a byte that matters (the closing
// quote, an escape, a control or non-ASCII byte, broken UTF-8) at every
// place of the words the scanner reads eight bytes at a time reads as
// encoding/json reads it; so does one with such a byte after non-ASCII
// text (which the scanner reads differently) or after another such byte.
func TestTextEveryPosition(t *testing.T) {
	specials := []string{`"`, `\n`, `\"`, `\u00e9`, "\x01", "\x1f", "\x7f", " ", "é", "\xe9", "\xff", "€"}
	for _, special := range specials {
		for _, before := range append([]string{""}, specials...) {
			for n := 0; n < 26; n++ {
				for p := 0; p <= n; p++ {
					body := before + strings.Repeat("a", p) + special + strings.Repeat("b", n-p)
					checkText(t, body)
				}
			}
		}
	}
}

// checkText checks that the scanner reads the JSON string "body" (also
// followed by white space) as encoding/json does.
func checkText(t *testing.T, body string) {
	t.Helper()
	for _, in := range []string{`"` + body + `"`, `"` + body + `"` + strings.Repeat(" ", 9)} {
		s := scanner{b: []byte(in)}
		got, err := s.text()
		if err == nil {
			err = s.end()
		}
		var want string
		jerr := json.Unmarshal([]byte(in), &want)
		if !utf8.ValidString(in) && jerr == nil {
			jerr = errors.New("invalid UTF-8")
		}
		switch {
		case (err == nil) != (jerr == nil):
			t.Fatalf("%q: scanner error %v, encoding/json %v", in, err, jerr)
		case err == nil && string(got) != want:
			t.Fatalf("%q: scanner read %q, encoding/json %q", in, got, want)
		}
	}
}

// TestExtensionTwice: an extension named twice is refused wherever the
// two are among its members, before and after there are too many to
// compare one by one.
func TestExtensionTwice(t *testing.T) {
	for n := 1; n <= 20; n++ {
		names := make([]string, n)
		for i := range names {
			names[i] = fmt.Sprintf(`"x%d":1`, i)
		}
		if _, err := parseEnvelope([]byte("{" + strings.Join(names, ",") + "}")); err != nil {
			t.Fatalf("%d distinct extensions: %v", n, err)
		}
		for i := range n {
			for j := range n + 1 {
				// A copy of the i-th member, inserted at j.
				members := append(append(append([]string{}, names[:j]...), names[i]), names[j:]...)
				_, err := parseEnvelope([]byte("{" + strings.Join(members, ",") + "}"))
				if err == nil || !strings.Contains(err.Error(), "appears twice") {
					t.Fatalf("x%d twice among %d extensions (at %d): %v", i, n, j, err)
				}
			}
		}
	}
}

// TestAttrIndex: attrIndex and attrNames number the attributes alike.
func TestAttrIndex(t *testing.T) {
	for i, name := range attrNames {
		if got := attrIndex([]byte(name)); got != i {
			t.Errorf("attrIndex(%q) = %d, want %d", name, got, i)
		}
	}
	if got := attrIndex([]byte("traceparent")); got != -1 {
		t.Errorf("attrIndex(traceparent) = %d, want -1", got)
	}
}
