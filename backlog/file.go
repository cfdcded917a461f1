// Package backlog is the pure logic of task backlogs: the task file
// (to-do.json) and its checks, the task list folded from task.* events, the
// selection of the next task, and the summary an agent writes after a run.
// It does no I/O; the orchestrator, the projections and the CLI share it so
// they agree on every rule.
package backlog

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/loopbus/loopbus/schemas"
)

// FileSchemaVersion is the task file format this package reads and writes.
const FileSchemaVersion = 1

// FileName is the conventional name of a task file.
const FileName = "to-do.json"

// File is a task file: the seed's to-do.json shape.
type File struct {
	SchemaVersion int            `json:"schema_version"`
	Project       Project        `json:"project"`
	SourceFiles   []string       `json:"source_files"`
	Tasks         []schemas.Task `json:"tasks"`
}

// Project names the project a task file is about.
type Project struct {
	Name string `json:"name"`
	Root string `json:"root,omitempty"`
}

// taskProps is the JSON Schema of one task; ids use the step-name pattern
// because a task runs as a step of that name.
const taskProps = `{
  "type": "object",
  "additionalProperties": false,
  "required": ["id", "title", "status"],
  "properties": {
    "id": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,64}$"},
    "title": {"type": "string", "minLength": 1},
    "description": {"type": "string"},
    "reference": {"type": "string"},
    "priority": {"type": "integer", "minimum": 0},
    "status": {"enum": ["todo", "doing", "done", "blocked"]},
    "details": {"type": "string"},
    "steps": {"type": "array", "items": {"type": "string"}},
    "blockers": {"type": "array", "items": {"type": "string"}},
    "tags": {"type": "array", "items": {"type": "string"}},
    "files": {"type": "array", "items": {"type": "string"}},
    "depends_on": {"type": "array", "items": {"type": "string"}},
    "notes": {"type": "array", "items": {"type": "string"}},
    "created_at": {"type": "string", "format": "date-time"},
    "updated_at": {"type": "string", "format": "date-time"}
  }
}`

// FileSchema returns the JSON Schema of a task file.
func FileSchema() json.RawMessage {
	return json.RawMessage(`{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "$id": "urn:loopbus:schema:task-file:1",
  "title": "loopbus task file (to-do.json)",
  "type": "object",
  "additionalProperties": false,
  "required": ["schema_version", "tasks"],
  "properties": {
    "schema_version": {"const": 1},
    "project": {
      "type": "object",
      "additionalProperties": false,
      "properties": {"name": {"type": "string"}, "root": {"type": "string"}}
    },
    "source_files": {"type": "array", "items": {"type": "string"}},
    "tasks": {"type": "array", "items": ` + taskProps + `}
  }
}`)
}

// ErrInvalidFile: a task file fails its schema or its dependency checks.
var ErrInvalidFile = errors.New("invalid task file")

// Bounds of a task file: its tasks travel in session.started, which must
// stay under the bus's event size limit.
const (
	MaxFileBytes = 1 << 20
	MaxTasks     = 1000
)

// ParseFile decodes and checks a task file: JSON syntax (with line and
// column), the schema, unique ids, known dependencies and no dependency
// cycles. It returns every problem found, each with its JSON pointer; the
// file is nil when it could not be decoded at all.
func ParseFile(name string, data []byte) (*File, []schemas.ValidationError) {
	if len(data) > MaxFileBytes {
		return nil, []schemas.ValidationError{{Artifact: name, Message: fmt.Sprintf("the task file is %d bytes, over the %d-byte limit", len(data), MaxFileBytes), Source: "schema"}}
	}
	if err := syntaxCheck(data); err != nil {
		return nil, []schemas.ValidationError{{Artifact: name, Message: err.Error(), Source: "schema"}}
	}
	sch, err := schemas.CompileArtifactSchema(name, FileSchema())
	if err != nil { // the schema is a constant: a bug, not bad input
		panic(err)
	}
	errs := sch.Validate(name, data)
	var f File
	if err := json.Unmarshal(data, &f); err != nil {
		if len(errs) == 0 { // what the schema allows but Go cannot hold
			errs = append(errs, decodeProblem(name, err))
		}
		return nil, errs
	}
	if len(f.Tasks) > MaxTasks {
		return nil, []schemas.ValidationError{{Artifact: name, Pointer: "/tasks", Message: fmt.Sprintf("%d tasks, over the limit of %d a session carries", len(f.Tasks), MaxTasks), Source: "schema"}}
	}
	// Dependency problems too, so a repair fixes everything at once; a
	// pointer the schema already reported is not reported again.
	reported := map[string]bool{}
	for _, e := range errs {
		reported[e.Pointer] = true
	}
	for _, e := range CheckTasks(f.Tasks) {
		if !reported[e.Pointer] {
			e.Artifact = name
			errs = append(errs, e)
		}
	}
	return &f, errs
}

// decodeProblem describes a value the schema accepts but a task cannot
// hold (a priority of 2.0, a date-time Go does not read).
func decodeProblem(name string, err error) schemas.ValidationError {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		return schemas.ValidationError{Artifact: name, Pointer: "/" + strings.ReplaceAll(te.Field, ".", "/"),
			Message: fmt.Sprintf("want %s, got %s", te.Type, te.Value), Source: "schema"}
	}
	return schemas.ValidationError{Artifact: name, Message: "cannot read the file: " + err.Error(), Source: "schema"}
}

// syntaxCheck reports a JSON syntax error with its line and column.
func syntaxCheck(data []byte) error {
	var v any
	err := json.Unmarshal(data, &v)
	var se *json.SyntaxError
	if errors.As(err, &se) {
		line, col := lineCol(data, se.Offset)
		return fmt.Errorf("not valid JSON at line %d, column %d: %v", line, col, se)
	}
	if err != nil {
		return fmt.Errorf("not valid JSON: %v", err)
	}
	return nil
}

func lineCol(data []byte, off int64) (line, col int) {
	if off > int64(len(data)) {
		off = int64(len(data))
	}
	before := data[:off]
	line = bytes.Count(before, []byte("\n")) + 1
	col = int(off) - (bytes.LastIndexByte(before, '\n') + 1)
	return line, max(col, 1)
}

// Format renders a task file canonically: two-space indentation, members in
// a fixed order, a final newline. Formatting a formatted file changes
// nothing.
func Format(f *File) []byte {
	if f.SourceFiles == nil {
		f.SourceFiles = []string{}
	}
	if f.Tasks == nil {
		f.Tasks = []schemas.Task{}
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(f); err != nil { // plain structs: cannot fail
		panic(err)
	}
	return b.Bytes()
}

// FormatErrors renders problems one per line for people.
func FormatErrors(errs []schemas.ValidationError) string {
	lines := make([]string, len(errs))
	for i, e := range errs {
		lines[i] = e.String()
	}
	return strings.Join(lines, "\n")
}
