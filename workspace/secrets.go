package workspace

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"unicode/utf8"
)

// MinSecretLen is the shortest secret value that is masked. Shorter values
// (say "1" or "true") would mask ordinary text everywhere; a variable listed
// by name as secret with a shorter value is refused instead (see NewSecrets).
const MinSecretLen = 8

// Errors about secret environment values.
var (
	// ErrBadSecretName: a name listed as secret is not an environment
	// variable name, or is one of loopbus's own LOOPBUS_* variables.
	ErrBadSecretName = errors.New("invalid secret variable name")
	// ErrShortSecret: a variable listed as secret has a value shorter than
	// MinSecretLen bytes, too short to be masked without masking everything.
	ErrShortSecret = errors.New("secret value too short to mask")
	// ErrSecretInOutput: an output contains the value of a secret variable.
	ErrSecretInOutput = errors.New("output contains a secret")
)

// ValidateSecretName accepts the names of environment variables that may
// be listed as secret: [A-Za-z_][A-Za-z0-9_]*, not starting with LOOPBUS_
// (those are loopbus's own and never reach agents from the worker).
func ValidateSecretName(name string) error {
	if name == "" {
		return fmt.Errorf("%w: must not be empty", ErrBadSecretName)
	}
	for i, c := range name {
		if !(c == '_' || c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || i > 0 && c >= '0' && c <= '9') {
			return fmt.Errorf("%w %q: want letters, digits and _, not starting with a digit", ErrBadSecretName, name)
		}
	}
	if strings.HasPrefix(name, "LOOPBUS_") {
		return fmt.Errorf("%w %q: LOOPBUS_* variables are loopbus's own and never passed to agents", ErrBadSecretName, name)
	}
	return nil
}

// secretWords mark a variable as secret when its upper-cased name contains
// one of them; secretSuffixes when it ends with one.
var (
	secretWords    = []string{"TOKEN", "SECRET", "PASSWORD", "PASSWD", "PASSPHRASE", "CREDENTIAL", "API_KEY", "APIKEY", "PRIVATE_KEY", "ACCESS_KEY"}
	secretSuffixes = []string{"_KEY"}
)

// LooksSecret reports whether an environment variable's name suggests a
// secret: it contains (in any case) TOKEN, SECRET, PASSWORD, PASSWD,
// PASSPHRASE, CREDENTIAL, API_KEY, APIKEY, PRIVATE_KEY or ACCESS_KEY, or
// ends with _KEY. Such variables are secret without being listed.
func LooksSecret(name string) bool {
	up := strings.ToUpper(name)
	for _, w := range secretWords {
		if strings.Contains(up, w) {
			return true
		}
	}
	for _, s := range secretSuffixes {
		if strings.HasSuffix(up, s) {
			return true
		}
	}
	return false
}

// secret is one value to mask.
type secret struct{ name, value string }

// Secrets is the set of secret values of one environment. Its methods mask
// them in text and find them in files. The zero value and nil hold none.
type Secrets struct {
	list   []secret // longest value first, so a value containing another wins
	maxLen int
	repl   *strings.Replacer
}

// NewSecrets collects the secret values of env (KEY=VALUE entries; every
// entry of a name counts, not only the last): those of the variables named
// in names and of those whose names LooksSecret, when at least MinSecretLen
// bytes long. A variable listed in names whose value is non-empty but
// shorter is refused with ErrShortSecret naming it (never its value); a
// listed variable that is unset or empty has nothing to hide.
func NewSecrets(env []string, names []string) (*Secrets, error) {
	listed := make(map[string]bool, len(names))
	for _, n := range names {
		if err := ValidateSecretName(n); err != nil {
			return nil, err
		}
		listed[n] = true
	}
	s := &Secrets{}
	seen := make(map[secret]bool)
	var short []string
	for _, kv := range env {
		name, val, ok := strings.Cut(kv, "=")
		if !ok || val == "" || !(listed[name] || LooksSecret(name)) {
			continue
		}
		if len(val) < MinSecretLen {
			if listed[name] && !slices.Contains(short, name) {
				short = append(short, name)
			}
			continue
		}
		vals := []string{val}
		// Output tails are made valid UTF-8; mask the value as it appears there too.
		if !utf8.ValidString(val) {
			vals = append(vals, strings.ToValidUTF8(val, "\uFFFD"))
		}
		for _, v := range vals {
			if sec := (secret{name, v}); !seen[sec] {
				seen[sec] = true
				s.list = append(s.list, sec)
				s.maxLen = max(s.maxLen, len(v))
			}
		}
	}
	if len(short) > 0 {
		return nil, fmt.Errorf("%w: %s listed as secret but shorter than %d bytes; use a longer value or do not list it",
			ErrShortSecret, strings.Join(short, ", "), MinSecretLen)
	}
	slices.SortFunc(s.list, func(a, b secret) int {
		if len(a.value) != len(b.value) {
			return len(b.value) - len(a.value)
		}
		return strings.Compare(a.name, b.name)
	})
	pairs := make([]string, 0, 2*len(s.list))
	for _, sec := range s.list {
		pairs = append(pairs, sec.value, "[secret "+sec.name+"]")
	}
	s.repl = strings.NewReplacer(pairs...)
	return s, nil
}

// Len is the number of distinct values masked.
func (s *Secrets) Len() int {
	if s == nil {
		return 0
	}
	return len(s.list)
}

// MaxLen is the length of the longest value, 0 when there is none: a text
// cut to its last n bytes needs n+MaxLen bytes before the cut for MaskTail to
// see every value that reaches into the last n whole.
func (s *Secrets) MaxLen() int {
	if s == nil {
		return 0
	}
	return s.maxLen
}

// Mask replaces every secret value in text by "[secret NAME]".
func (s *Secrets) Mask(text string) string {
	if s.Len() == 0 {
		return text
	}
	return s.repl.Replace(text)
}

// tailMarker starts a tail whose beginning was dropped (as procrun does).
const tailMarker = "…"

// MaskTail masks a tail of output and then keeps its last limit bytes (cut
// at a rune boundary, marked with a leading "…" when anything was dropped).
// tail is the end of a longer output when it starts with "…"; it may then
// start inside a secret value, whose remaining part is dropped too. Mask
// first, cut second: a value cut in two by the limit is masked all the same
// when tail holds at least limit+MaxLen bytes.
func (s *Secrets) MaskTail(tail string, limit int) string {
	body, cut := strings.CutPrefix(tail, tailMarker)
	if cut {
		body = body[s.partialSuffix(body):]
	}
	body = s.Mask(body)
	if len(body) > limit {
		i := len(body) - limit
		for i < len(body) && !utf8.RuneStart(body[i]) {
			i++
		}
		body, cut = body[i:], true
	}
	if cut {
		return tailMarker + body
	}
	return body
}

// partialSuffix returns the length of the longest proper suffix of a secret
// value that text starts with: what is left of a value whose beginning was
// cut off.
func (s *Secrets) partialSuffix(text string) int {
	n := 0
	if s == nil {
		return 0
	}
	for _, sec := range s.list {
		for k := min(len(sec.value)-1, len(text)); k > n; k-- {
			if strings.HasPrefix(text, sec.value[len(sec.value)-k:]) {
				n = k
				break
			}
		}
	}
	return n
}

// Find reads r to its end and returns the name of the first secret whose
// value it contains, or "" when it contains none. With no secrets it
// reads nothing.
func (s *Secrets) Find(r io.Reader) (string, error) {
	if s.Len() == 0 {
		return "", nil
	}
	sc := &scanner{s: s}
	size := int64(findBuffer)
	if lr, ok := r.(*io.LimitedReader); ok {
		size = max(min(size-1, lr.N), 0) + 1 // +1: the read that sees the end
	}
	buf := make([]byte, size)
	for {
		n, err := r.Read(buf)
		if name := sc.scan(buf[:n]); name != "" {
			return name, nil
		}
		if errors.Is(err, io.EOF) {
			return "", nil
		}
		if err != nil {
			return "", err
		}
	}
}

// Reader returns a reader of r's bytes (those of output) that fails with
// SecretInOutput's error as soon as the bytes read so far contain a secret
// value: whatever reads through it never gets a whole value.
func (s *Secrets) Reader(r io.Reader, output string) io.Reader {
	if s.Len() == 0 {
		return r
	}
	return &guardReader{r: r, output: output, sc: scanner{s: s}}
}

// SecretInOutput returns the error for an output that contains the value of
// secret name: it names the variable, never the value.
func SecretInOutput(output, name string) error {
	return fmt.Errorf("%w: output %s contains the value of the secret environment variable %s; outputs are stored and readable by everyone who can read the session, so the agent must not write secrets into them",
		ErrSecretInOutput, output, name)
}

// findBuffer is the most Find reads at once.
const findBuffer = 64 << 10

// scanner finds secret values in a byte stream fed in pieces, keeping the
// last MaxLen-1 bytes so a value split between pieces is found.
type scanner struct {
	s    *Secrets
	keep []byte
}

// scan adds p to the stream and returns the name of a secret found in it.
// p is searched where it lies; only a value that may straddle the kept
// bytes and p is looked for in a copy of the two joined, which is shorter
// than two values.
func (sc *scanner) scan(p []byte) string {
	if sc.s.Len() == 0 || len(p) == 0 {
		return ""
	}
	keep := sc.s.maxLen - 1
	if len(sc.keep) > 0 {
		joint := append(sc.keep, p[:min(len(p), keep)]...)
		for _, sec := range sc.s.list {
			if bytes.Contains(joint, []byte(sec.value)) {
				return sec.name
			}
		}
		sc.keep = joint[:len(sc.keep)] // joint may have moved it
	}
	for _, sec := range sc.s.list {
		if bytes.Contains(p, []byte(sec.value)) {
			return sec.name
		}
	}
	if len(p) >= keep {
		sc.keep = append(sc.keep[:0], p[len(p)-keep:]...)
	} else {
		w := append(sc.keep, p...)
		sc.keep = append(sc.keep[:0], w[len(w)-min(len(w), keep):]...)
	}
	return ""
}

type guardReader struct {
	r      io.Reader
	output string
	sc     scanner
	err    error
}

func (g *guardReader) Read(p []byte) (int, error) {
	if g.err != nil {
		return 0, g.err
	}
	n, err := g.r.Read(p)
	if name := g.sc.scan(p[:n]); name != "" {
		g.err = SecretInOutput(g.output, name)
		return 0, g.err
	}
	return n, err
}
