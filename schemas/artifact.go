package schemas

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"sort"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"golang.org/x/text/language"
	"golang.org/x/text/message"
)

// ErrBadSchema: a user's artifact schema is not a valid JSON Schema.
var ErrBadSchema = errors.New("invalid JSON Schema")

// ArtifactSchema is a compiled user JSON Schema (draft 2020-12 unless the
// document's $schema says otherwise) that artifacts are checked against.
type ArtifactSchema struct {
	sch *jsonschema.Schema
}

// CompileArtifactSchema compiles a user schema. name is used in messages and
// as the schema's base location; $ref to other files is not followed.
func CompileArtifactSchema(name string, raw []byte) (*ArtifactSchema, error) {
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		return nil, fmt.Errorf("%w %s: not JSON: %v", ErrBadSchema, name, err)
	}
	comp := jsonschema.NewCompiler()
	comp.DefaultDraft(jsonschema.Draft2020)
	comp.AssertFormat()
	comp.UseLoader(noLoader{})
	// An https base (never fetched: noLoader refuses everything) makes
	// relative $refs resolve to distinct URLs that are then refused, instead
	// of silently pointing back at this schema as they would under a URN.
	loc := "https://artifact-schema.loopbus.invalid/" + url.PathEscape(name)
	if err := comp.AddResource(loc, doc); err != nil {
		return nil, fmt.Errorf("%w %s: %v", ErrBadSchema, name, err)
	}
	sch, err := comp.Compile(loc)
	if err != nil {
		return nil, fmt.Errorf("%w %s: %v", ErrBadSchema, name, err)
	}
	return &ArtifactSchema{sch: sch}, nil
}

type noLoader struct{}

func (noLoader) Load(url string) (any, error) {
	return nil, fmt.Errorf("loading %s: external references are not supported; inline them", url)
}

// Validate checks doc against the schema and returns every leaf error with
// its JSON pointer, sorted by pointer. A doc that is not JSON yields one
// error at the root.
func (s *ArtifactSchema) Validate(artifact string, doc []byte) []ValidationError {
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(doc))
	if err != nil {
		return []ValidationError{{Artifact: artifact, Pointer: "", Message: "not valid JSON: " + err.Error(), Source: "schema"}}
	}
	err = s.sch.Validate(inst)
	if err == nil {
		return nil
	}
	var ve *jsonschema.ValidationError
	if !errors.As(err, &ve) {
		return []ValidationError{{Artifact: artifact, Message: err.Error(), Source: "schema"}}
	}
	out := leafErrors(ve)
	for i := range out {
		out[i].Artifact = artifact
		out[i].Source = "schema"
	}
	return out
}

// leafErrors returns the innermost causes of a validation error, the ones
// that say what is actually wrong, deduplicated and sorted by pointer.
func leafErrors(ve *jsonschema.ValidationError) []ValidationError {
	var out []ValidationError
	seen := map[string]bool{}
	p := message.NewPrinter(language.English)
	var walk func(e *jsonschema.ValidationError)
	walk = func(e *jsonschema.ValidationError) {
		if len(e.Causes) == 0 {
			ptr := jsonPointer(e.InstanceLocation)
			msg := e.ErrorKind.LocalizedString(p)
			if k := ptr + "\x00" + msg; !seen[k] {
				seen[k] = true
				out = append(out, ValidationError{Pointer: ptr, Message: msg})
			}
			return
		}
		for _, c := range e.Causes {
			walk(c)
		}
	}
	walk(ve)
	sort.SliceStable(out, func(i, j int) bool { return out[i].Pointer < out[j].Pointer })
	return out
}

func jsonPointer(tokens []string) string {
	if len(tokens) == 0 {
		return ""
	}
	var b strings.Builder
	for _, t := range tokens {
		b.WriteByte('/')
		t = strings.ReplaceAll(t, "~", "~0")
		b.WriteString(strings.ReplaceAll(t, "/", "~1"))
	}
	return b.String()
}

// SchemaVersionOf identifies a schema document: its top-level "version" or
// "$id" string member, else "sha256:" and 12 hex digits of its bytes.
func SchemaVersionOf(raw []byte) string {
	var top map[string]any
	if json.Unmarshal(raw, &top) == nil {
		if v, ok := top["version"].(string); ok && v != "" {
			return v
		}
		if v, ok := top["$id"].(string); ok && v != "" {
			return v
		}
	}
	sum := sha256.Sum256(raw)
	return "sha256:" + hex.EncodeToString(sum[:])[:12]
}
