package schemas

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"reflect"
	"strings"
	"testing"
)

const reportSchema = `{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "type": "object",
  "required": ["title", "items"],
  "properties": {
    "title": {"type": "string", "minLength": 1},
    "items": {"type": "array", "items": {"type": "string"}},
    "a/b~c": {"type": "integer"},
    "contact": {"type": "string", "format": "email"},
    "kind": {"$ref": "#/$defs/kind"}
  },
  "$defs": {"kind": {"enum": ["short", "long"]}}
}`

// compileSchema compiles a schema that must be valid.
func compileSchema(t *testing.T, raw string) *ArtifactSchema {
	t.Helper()
	s, err := CompileArtifactSchema("schemas/report.json", []byte(raw))
	if err != nil {
		t.Fatalf("CompileArtifactSchema: %v", err)
	}
	return s
}

func TestArtifactSchemaValidate(t *testing.T) {
	s := compileSchema(t, reportSchema)
	tests := []struct {
		name string
		doc  string
		// want is the pointers of the errors, in order.
		want []string
		// wantMsg, when set, must occur in the message of each error.
		wantMsg []string
	}{
		{name: "valid", doc: `{"title":"Otters","items":["habitat","diet"],"kind":"short","contact":"a@example.com"}`},
		{name: "valid with extra members", doc: `{"title":"Otters","items":[],"extra":true}`},
		{
			name:    "two problems, sorted by pointer",
			doc:     `{"title":3,"items":["habitat",2]}`,
			want:    []string{"/items/1", "/title"},
			wantMsg: []string{"want string", "want string"},
		},
		{name: "pointer escaping", doc: `{"title":"t","items":[],"a/b~c":"x"}`, want: []string{"/a~1b~0c"}},
		{name: "missing members are reported at their object", doc: `{"items":[]}`, want: []string{""}, wantMsg: []string{"title"}},
		{name: "local ref", doc: `{"title":"t","items":[],"kind":"medium"}`, want: []string{"/kind"}},
		{name: "format is asserted", doc: `{"title":"t","items":[],"contact":"nobody"}`, want: []string{"/contact"}, wantMsg: []string{"email"}},
		{name: "root of wrong type", doc: `[1]`, want: []string{""}},
		{name: "not JSON", doc: `{"title":`, want: []string{""}, wantMsg: []string{"not valid JSON"}},
		{name: "trailing data", doc: `{"title":"t","items":[]} x`, want: []string{""}, wantMsg: []string{"not valid JSON"}},
		{name: "empty", doc: ``, want: []string{""}, wantMsg: []string{"not valid JSON"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := s.Validate("report.json", []byte(tt.doc))
			if len(tt.want) == 0 {
				if got != nil {
					t.Fatalf("Validate = %q, want nil", got)
				}
				return
			}
			var ptrs []string
			for _, e := range got {
				ptrs = append(ptrs, e.Pointer)
			}
			if !reflect.DeepEqual(ptrs, tt.want) {
				t.Fatalf("Validate pointers = %q, want %q (errors %q)", ptrs, tt.want, got)
			}
			for i, e := range got {
				if e.Artifact != "report.json" || e.Source != "schema" || e.Message == "" {
					t.Errorf("error %d = %+v, want artifact report.json, source schema and a message", i, e)
				}
				if i < len(tt.wantMsg) && !strings.Contains(e.Message, tt.wantMsg[i]) {
					t.Errorf("error %d message %q does not contain %q", i, e.Message, tt.wantMsg[i])
				}
			}
		})
	}
}

func TestCompileArtifactSchema(t *testing.T) {
	tests := []struct {
		name    string
		raw     string
		wantErr error
		// wantMsg, when set, must occur in the error.
		wantMsg string
	}{
		{name: "valid", raw: reportSchema},
		{name: "boolean schema", raw: `true`},
		{name: "empty schema", raw: `{}`},
		{name: "draft 7", raw: `{"$schema":"http://json-schema.org/draft-07/schema#","type":"string"}`},
		{name: "own $id", raw: `{"$id":"https://example.com/report.json","type":"object"}`},
		{name: "ref to the metaschema is built in", raw: `{"$ref":"https://json-schema.org/draft/2020-12/schema"}`},
		{name: "not JSON", raw: `{"type":`, wantErr: ErrBadSchema, wantMsg: "not JSON"},
		{name: "not a schema", raw: `[]`, wantErr: ErrBadSchema},
		{name: "bad type", raw: `{"type":12}`, wantErr: ErrBadSchema},
		{name: "unknown type name", raw: `{"type":"text"}`, wantErr: ErrBadSchema},
		{name: "negative minLength", raw: `{"minLength":-1}`, wantErr: ErrBadSchema},
		{name: "bad pattern", raw: `{"pattern":"("}`, wantErr: ErrBadSchema},
		{name: "dangling local ref", raw: `{"$ref":"#/$defs/missing"}`, wantErr: ErrBadSchema},
		{name: "external https ref", raw: `{"$ref":"https://example.com/schemas/item.json"}`, wantErr: ErrBadSchema, wantMsg: "external references are not supported"},
		{name: "external ref deep inside", raw: `{"properties":{"a":{"items":{"$ref":"http://127.0.0.1:1/item.json#/x"}}}}`, wantErr: ErrBadSchema, wantMsg: "external references are not supported"},
		{name: "file ref", raw: `{"$ref":"file:///etc/passwd"}`, wantErr: ErrBadSchema, wantMsg: "external references are not supported"},
		{name: "relative ref against own $id", raw: `{"$id":"https://example.com/a.json","$ref":"b.json"}`, wantErr: ErrBadSchema, wantMsg: "external references are not supported"},
		{name: "unknown $schema", raw: `{"$schema":"https://example.com/my-meta","type":"string"}`, wantErr: ErrBadSchema},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := CompileArtifactSchema("schemas/report.json", []byte(tt.raw))
			if tt.wantErr == nil {
				if err != nil || s == nil {
					t.Fatalf("CompileArtifactSchema = %v, %v; want a schema", s, err)
				}
				return
			}
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("CompileArtifactSchema error = %v, want %v", err, tt.wantErr)
			}
			if s != nil {
				t.Errorf("CompileArtifactSchema returned a schema with an error")
			}
			if !strings.Contains(err.Error(), tt.wantMsg) {
				t.Errorf("error %q does not contain %q", err, tt.wantMsg)
			}
			if !strings.Contains(err.Error(), "schemas/report.json") {
				t.Errorf("error %q does not name the schema", err)
			}
		})
	}
}

func TestSchemaVersionOf(t *testing.T) {
	hashOf := func(s string) string {
		t.Helper()
		sum := sha256.Sum256([]byte(s))
		return "sha256:" + hex.EncodeToString(sum[:])[:12]
	}
	const neither = `{"type":"object"}`
	tests := []struct {
		name string
		raw  string
		want string
	}{
		{"version", `{"version":"2.1.0","type":"object"}`, "2.1.0"},
		{"$id", `{"$id":"https://example.com/report/v3","type":"object"}`, "https://example.com/report/v3"},
		{"version wins over $id", `{"$id":"https://example.com/report/v3","version":"3.0"}`, "3.0"},
		{"neither", neither, hashOf(neither)},
		{"empty version", `{"version":"","$id":"urn:x"}`, "urn:x"},
		{"numeric version", `{"version":3}`, hashOf(`{"version":3}`)},
		{"boolean schema", `true`, hashOf(`true`)},
		{"not JSON", `{`, hashOf(`{`)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := SchemaVersionOf([]byte(tt.raw)); got != tt.want {
				t.Errorf("SchemaVersionOf(%s) = %q, want %q", tt.raw, got, tt.want)
			}
		})
	}
	if a, b := SchemaVersionOf([]byte(`{"type":"object"}`)), SchemaVersionOf([]byte(`{"type":"array"}`)); a == b {
		t.Errorf("different schemas without version share %q", a)
	}
}
