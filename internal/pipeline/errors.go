package pipeline

import (
	"errors"
	"fmt"
	"strings"
)

// ErrInvalid is wrapped by every problem found in a pipeline file, including
// YAML syntax errors: errors.Is(err, ErrInvalid) is true for any error Load
// or Parse return because of the file's content (and false when Load cannot
// read the file at all).
var ErrInvalid = errors.New("invalid pipeline")

// Error is one problem in a pipeline file.
type Error struct {
	// File is the pipeline file as named by the caller.
	File string
	// Line and Column locate the problem (1-based); 0 when unknown.
	Line   int
	Column int
	// Field is the dotted path of the offending field, such as
	// "steps.summary.timeout" or "steps.summary.outputs[0].name"; empty for
	// problems that concern no field (YAML syntax errors).
	Field string
	// Msg describes the problem.
	Msg string
	// Err is the underlying cause when there is one (for example
	// schemas.ErrBadName or fs.ErrNotExist), else nil. Msg already includes
	// its text.
	Err error
}

// Error formats e as "FILE:LINE: FIELD: MSG", leaving out the line when it is
// unknown and the field when there is none.
func (e *Error) Error() string {
	var b strings.Builder
	switch {
	case e.File != "" && e.Line > 0:
		fmt.Fprintf(&b, "%s:%d: ", e.File, e.Line)
	case e.File != "":
		b.WriteString(e.File + ": ")
	case e.Line > 0:
		fmt.Fprintf(&b, "line %d: ", e.Line)
	}
	if e.Field != "" {
		b.WriteString(e.Field + ": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// Unwrap returns ErrInvalid and, when set, the underlying cause Err.
func (e *Error) Unwrap() []error {
	if e.Err == nil {
		return []error{ErrInvalid}
	}
	return []error{ErrInvalid, e.Err}
}

// Errors is every problem found in one pipeline file, ordered by position.
// Load and Parse always report problems as a non-empty Errors, so both
// errors.As(err, &errs) with errs of type Errors and errors.As(err, &e) with
// e of type *Error (which finds the first problem) succeed.
type Errors []*Error

// Error returns the problems one per line.
func (es Errors) Error() string {
	lines := make([]string, len(es))
	for i, e := range es {
		lines[i] = e.Error()
	}
	return strings.Join(lines, "\n")
}

// Unwrap returns the individual problems, so errors.Is and errors.As see
// each of them.
func (es Errors) Unwrap() []error {
	errs := make([]error, len(es))
	for i, e := range es {
		errs[i] = e
	}
	return errs
}
