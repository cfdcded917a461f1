package schemas

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

// Sentinel errors for names and ids; wrapped with the offending value.
var (
	ErrBadSessionID = errors.New("invalid session id")
	ErrBadStepName  = errors.New("invalid step name")
	ErrBadName      = errors.New("invalid artifact name")
	ErrBadType      = errors.New("invalid event type")
)

// SubjectPrefix is the first two tokens of every event subject.
const SubjectPrefix = "loopbus.evt"

// MaxIDLen bounds session ids and step names.
const MaxIDLen = 64

// ValidateSessionID accepts ids of 1..64 characters from [A-Za-z0-9_-]: they
// become one token of a NATS subject and part of object-store keys.
func ValidateSessionID(id string) error {
	if err := validateToken(id); err != nil {
		return fmt.Errorf("%w %q: %s", ErrBadSessionID, id, err)
	}
	return nil
}

// ValidateStepName applies the session-id rules to step names.
func ValidateStepName(name string) error {
	if err := validateToken(name); err != nil {
		return fmt.Errorf("%w %q: %s", ErrBadStepName, name, err)
	}
	return nil
}

func validateToken(s string) error {
	if s == "" {
		return errors.New("must not be empty")
	}
	if len(s) > MaxIDLen {
		return fmt.Errorf("longer than %d characters", MaxIDLen)
	}
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return fmt.Errorf("character %q not allowed (use A-Z, a-z, 0-9, _ and -)", c)
		}
	}
	return nil
}

// ValidateName accepts artifact file names: a single path element of 1..128
// bytes of UTF-8 from [A-Za-z0-9._-], not "." or "..", not starting with "-".
// Anything that could escape a directory or confuse a shell is refused.
func ValidateName(name string) error {
	bad := func(why string) error { return fmt.Errorf("%w %q: %s", ErrBadName, name, why) }
	switch {
	case name == "":
		return bad("must not be empty")
	case len(name) > 128:
		return bad("longer than 128 bytes")
	case !utf8.ValidString(name):
		return bad("not valid UTF-8")
	case name == "." || name == "..":
		return bad("must not be . or ..")
	case strings.ContainsAny(name, `/\`):
		return bad("must be a file name, not a path")
	case strings.HasPrefix(name, "-"):
		return bad("must not start with -")
	}
	for _, c := range name {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.') {
			return bad(fmt.Sprintf("character %q not allowed (use A-Z, a-z, 0-9, ., _ and -)", c))
		}
	}
	return nil
}

// EntityVerb returns "<entity>.<verb>" of a loopbus event type.
func EntityVerb(typ string) (string, error) {
	rest, ok := strings.CutPrefix(typ, "loopbus.")
	entity, verb, two := strings.Cut(rest, ".")
	if !ok || !two || !lowerWord(entity) || !lowerWord(verb) {
		return "", fmt.Errorf("%w %q: want loopbus.<entity>.<verb> in lowercase letters", ErrBadType, typ)
	}
	return rest, nil
}

func lowerWord(s string) bool {
	if s == "" || len(s) > 32 {
		return false
	}
	for _, c := range s {
		if c < 'a' || c > 'z' {
			return false
		}
	}
	return true
}

// SubjectFor returns the stream subject of an event of type typ in session.
func SubjectFor(session, typ string) (string, error) {
	if err := ValidateSessionID(session); err != nil {
		return "", err
	}
	ev, err := EntityVerb(typ)
	if err != nil {
		return "", err
	}
	return SubjectPrefix + "." + session + "." + ev, nil
}

// SessionSubjects is the subject filter covering a session's whole history.
func SessionSubjects(session string) string {
	return SubjectPrefix + "." + session + ".>"
}

// SessionOfSubject returns the session token of any subject under
// loopbus.evt (valid or not), i.e. what the filter loopbus.evt.<session>.>
// matches on.
func SessionOfSubject(subject string) (string, bool) {
	rest, ok := strings.CutPrefix(subject, SubjectPrefix+".")
	if !ok {
		return "", false
	}
	session, _, more := strings.Cut(rest, ".")
	return session, more && session != ""
}

// ParseSubject splits an event subject into session and "<entity>.<verb>".
func ParseSubject(subject string) (session, entityVerb string, err error) {
	rest, ok := strings.CutPrefix(subject, SubjectPrefix+".")
	parts := strings.Split(rest, ".")
	if !ok || len(parts) != 3 {
		return "", "", fmt.Errorf("subject %q: want %s.<session>.<entity>.<verb>", subject, SubjectPrefix)
	}
	if err := ValidateSessionID(parts[0]); err != nil {
		return "", "", fmt.Errorf("subject %q: %w", subject, err)
	}
	ev, err := EntityVerb("loopbus." + parts[1] + "." + parts[2])
	if err != nil {
		return "", "", fmt.Errorf("subject %q: %w", subject, err)
	}
	return parts[0], ev, nil
}

// DeterministicID derives an event id from its logical position (for
// example session, type, step and iteration), so that re-deciding the same
// thing after a crash yields the same id and JetStream de-duplicates it.
func DeterministicID(parts ...string) string {
	h := sha256.New()
	for _, p := range parts {
		fmt.Fprintf(h, "%d:%s", len(p), p) // length-prefixed: no two splits collide
	}
	return hex.EncodeToString(h.Sum(nil)[:16])
}

// Digest returns "sha256:<hex>" of b.
func Digest(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// ShortHash returns the first 16 hex digits of a "sha256:<hex>" digest.
func ShortHash(digest string) string {
	h := strings.TrimPrefix(digest, "sha256:")
	if len(h) > 16 {
		return h[:16]
	}
	return h
}

// ContentHash returns 16 hex digits identifying a set of artifacts: the
// artifact's own short hash when there is one, otherwise the sha-256 over
// "name digest" lines in the given order.
func ContentHash(arts []ArtifactRef) string {
	if len(arts) == 1 {
		return ShortHash(arts[0].Digest)
	}
	h := sha256.New()
	for _, a := range arts {
		fmt.Fprintf(h, "%s %s\n", a.Name, a.Digest)
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}
