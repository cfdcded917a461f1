package bus

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/goccy/go-yaml/ast"
	"github.com/goccy/go-yaml/parser"
	"github.com/loopbus/loopbus/schemas"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

// Headers of a signed event. The signature covers the subject and the
// whole message body (the CloudEvent), so nothing of the event can change
// without breaking it.
const (
	HeaderSigner    = "Loopbus-Signer"
	HeaderSignature = "Loopbus-Signature"
)

// MaxTrustFileBytes bounds a trust file.
const MaxTrustFileBytes = 1 << 20

// signedBytes is what a signature covers.
func signedBytes(subject string, body []byte) []byte {
	b := make([]byte, 0, len("loopbus-event-v1\n")+len(subject)+1+len(body))
	b = append(b, "loopbus-event-v1\n"...)
	b = append(b, subject...)
	b = append(b, '\n')
	return append(b, body...)
}

// signer signs the events one Bus publishes.
type signer struct {
	kp  nkeys.KeyPair
	pub string
}

// LoadSignKey reads an nkey user seed ("SU…") from path: a file holding
// just the seed, or a NATS credentials file (the seed is taken from it).
func LoadSignKey(path string) (nkeys.KeyPair, error) {
	raw, err := readBounded(path, MaxTrustFileBytes)
	if err != nil {
		return nil, fmt.Errorf("%w: sign key: %v", ErrConfig, err)
	}
	kp, err := nkeys.FromSeed(bytes.TrimSpace(raw))
	if err != nil {
		if kp, err = nkeys.ParseDecoratedNKey(raw); err != nil {
			return nil, fmt.Errorf("%w: sign key %s: not an nkey seed or credentials file: %v", ErrConfig, path, err)
		}
	}
	pub, err := kp.PublicKey()
	if err != nil || !nkeys.IsValidPublicUserKey(pub) {
		return nil, fmt.Errorf("%w: sign key %s: want a user seed (SU…), as `loopbus keygen` writes", ErrConfig, path)
	}
	return kp, nil
}

// NewSignKey writes a new nkey user seed to path (mode 0600; an existing
// file is never replaced) and returns its public key, the one a trust
// file lists.
func NewSignKey(path string) (string, error) {
	kp, err := nkeys.CreateUser()
	if err != nil {
		return "", err
	}
	seed, err := kp.Seed()
	if err != nil {
		return "", err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return "", err
	}
	if _, err := f.Write(append(seed, '\n')); err != nil {
		_ = f.Close()
		_ = os.Remove(path)
		return "", err
	}
	if err := f.Close(); err != nil {
		_ = os.Remove(path)
		return "", err
	}
	return kp.PublicKey()
}

func readBounded(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file", path)
	}
	if fi.Size() > limit {
		return nil, fmt.Errorf("%s: %d bytes, over the limit of %d", path, fi.Size(), limit)
	}
	return os.ReadFile(path)
}

// sign adds the signature headers to m, whose body is final.
func (s *signer) sign(m *nats.Msg) error {
	sig, err := s.kp.Sign(signedBytes(m.Subject, m.Data))
	if err != nil {
		return fmt.Errorf("sign event: %w", err)
	}
	m.Header.Set(HeaderSigner, s.pub)
	m.Header.Set(HeaderSignature, base64.RawURLEncoding.EncodeToString(sig))
	return nil
}

// Trust says which public keys may state which events: each key has one
// or more roles (schemas.Role), and a role may publish the event types
// schemas.Publishers lists. A Bus with a Trust accepts only events signed
// by a key whose role may publish their type; others are malformed.
type Trust struct {
	keys map[string]trusted
}

type trusted struct {
	kp    nkeys.KeyPair
	roles []schemas.Role
}

// ErrUntrusted wraps every refusal of an event's signature: missing,
// invalid, or by a key not trusted for the event's type. Such events are
// also malformed (ErrMalformed), and dead-lettered with the reason.
var ErrUntrusted = errors.New("untrusted event")

func (t *Trust) add(role schemas.Role, pub string) error {
	if !nkeys.IsValidPublicUserKey(pub) {
		return fmt.Errorf("%q is not an nkey user public key (U…, 56 characters, as `loopbus keygen` prints)", pub)
	}
	k, ok := t.keys[pub]
	if !ok {
		kp, err := nkeys.FromPublicKey(pub)
		if err != nil {
			return err
		}
		k.kp = kp
	}
	if !slices.Contains(k.roles, role) {
		k.roles = append(k.roles, role)
	}
	t.keys[pub] = k
	return nil
}

func roleList() string {
	var s []string
	for _, r := range schemas.Roles() {
		s = append(s, string(r))
	}
	return strings.Join(s, ", ")
}

// LoadTrust reads a trust file: YAML mapping each role to a list of
// public keys, e.g.
//
//	orchestrator: [UAB…]
//	agentworker:
//	  - UCD…   # worker on host-1
//	  - UEF…   # worker on host-2
//	validator: [UGH…]
//	client: [UIJ…]
//
// Errors name the file and line.
func LoadTrust(path string) (*Trust, error) {
	raw, err := readBounded(path, MaxTrustFileBytes)
	if err != nil {
		return nil, fmt.Errorf("%w: trust file: %v", ErrConfig, err)
	}
	at := func(n ast.Node, format string, a ...any) error {
		line := 0
		if n != nil && n.GetToken() != nil {
			line = n.GetToken().Position.Line
		}
		return fmt.Errorf("%w: %s:%d: %s", ErrConfig, path, line, fmt.Sprintf(format, a...))
	}
	f, err := parser.ParseBytes(raw, 0)
	if err != nil {
		return nil, fmt.Errorf("%w: trust file %s: %v", ErrConfig, path, err)
	}
	t := &Trust{keys: map[string]trusted{}}
	if len(f.Docs) != 1 || f.Docs[0].Body == nil {
		return nil, fmt.Errorf("%w: trust file %s: want one YAML mapping of roles (%s) to lists of public keys", ErrConfig, path, roleList())
	}
	m, ok := f.Docs[0].Body.(*ast.MappingNode)
	if !ok {
		if mv, one := f.Docs[0].Body.(*ast.MappingValueNode); one {
			m = &ast.MappingNode{Values: []*ast.MappingValueNode{mv}}
		} else {
			return nil, at(f.Docs[0].Body, "want a mapping of roles (%s) to lists of public keys", roleList())
		}
	}
	for _, mv := range m.Values {
		role := schemas.Role(mv.Key.String())
		if !slices.Contains(schemas.Roles(), role) {
			return nil, at(mv.Key, "unknown role %q (want %s)", role, roleList())
		}
		seq, ok := mv.Value.(*ast.SequenceNode)
		if !ok {
			return nil, at(mv.Value, "%s: want a list of public keys", role)
		}
		for _, v := range seq.Values {
			s, ok := v.(*ast.StringNode)
			if !ok {
				return nil, at(v, "%s: want a public key (U…)", role)
			}
			if err := t.add(role, s.Value); err != nil {
				return nil, at(v, "%s: %v", role, err)
			}
		}
	}
	if len(t.keys) == 0 {
		return nil, fmt.Errorf("%w: trust file %s lists no key: every event would be refused", ErrConfig, path)
	}
	return t, nil
}

// verify checks the signature headers of a message against t and returns
// the signer's public key.
func (t *Trust) verify(eventType, subject string, header nats.Header, body []byte) (string, error) {
	pub := header.Get(HeaderSigner)
	if pub == "" {
		return "", fmt.Errorf("%w: not signed (no %s header), and this bus trusts only signed events", ErrUntrusted, HeaderSigner)
	}
	k, ok := t.keys[pub]
	if !ok {
		return "", fmt.Errorf("%w: signed by %s, a key the trust file does not list", ErrUntrusted, ShortKey(pub))
	}
	if !slices.ContainsFunc(k.roles, func(r schemas.Role) bool { return schemas.MayPublish(r, eventType) }) {
		return "", fmt.Errorf("%w: %s is signed by %s, a key of %s; only %s may state it", ErrUntrusted, eventType, ShortKey(pub), roleNames(k.roles), roleNames(schemas.Publishers(eventType)))
	}
	sig, err := base64.RawURLEncoding.DecodeString(header.Get(HeaderSignature))
	if err != nil || len(sig) == 0 {
		return "", fmt.Errorf("%w: %s header missing or not base64url", ErrUntrusted, HeaderSignature)
	}
	if err := k.kp.Verify(signedBytes(subject, body), sig); err != nil {
		return "", fmt.Errorf("%w: the signature by %s does not match the event (altered, or signed by another key)", ErrUntrusted, ShortKey(pub))
	}
	return pub, nil
}

func roleNames(rs []schemas.Role) string {
	s := make([]string, len(rs))
	for i, r := range rs {
		s[i] = string(r)
	}
	return strings.Join(s, " or ")
}

// ShortKey shortens a public key for messages.
func ShortKey(pub string) string {
	if len(pub) > 12 {
		return pub[:12] + "…"
	}
	return pub
}

// OwnID returns id made unguessable to holders of other keys. Event ids
// are de-duplication ids, and many are derived from what they answer (one
// result per job, one verdict per result): anyone able to publish could
// store an event under such an id first, and the real one would then be
// dropped as a duplicate. With a sign key, OwnID is a digest of id and
// this key's signature of it (ed25519 signatures are deterministic): the
// same process gets the same id when it publishes again after a crash, and
// no other key can compute it. Without a sign key it returns id.
func (b *Bus) OwnID(id string) string {
	if b.signer == nil {
		return id
	}
	sig, err := b.signer.kp.Sign([]byte("loopbus-id-v1\n" + id))
	if err != nil {
		return id
	}
	return schemas.DeterministicID(id, string(sig))
}

// SignerKey is the public key this Bus signs with; empty without one.
func (b *Bus) SignerKey() string {
	if b.signer == nil {
		return ""
	}
	return b.signer.pub
}
