package bus

import (
	"encoding/json"
	"errors"
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

// TestTextEveryPosition: a string with one byte that matters (the closing
// quote, an escape, a control or non-ASCII byte, broken UTF-8) at every
// place of the words the scanner reads eight bytes at a time reads as
// encoding/json reads it.
func TestTextEveryPosition(t *testing.T) {
	for _, special := range []string{`"`, `\n`, `\"`, `\u00e9`, "\x01", "\x1f", "\x7f", " ", "é", "\xe9", "\xff", "€"} {
		for n := 0; n < 26; n++ {
			for p := 0; p <= n; p++ {
				body := strings.Repeat("a", p) + special + strings.Repeat("b", n-p)
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
		}
	}
}
