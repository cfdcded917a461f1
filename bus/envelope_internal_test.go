package bus

import (
	"encoding/json"
	"testing"
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
