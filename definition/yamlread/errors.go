package yamlread

import (
	"fmt"
	"strings"
)

// Sentinel is the constraint of the type parameter that gives a file
// format's problems their own types: the Sentinel method of S's zero value
// returns the error every Error[S] wraps (such as a package's ErrInvalid).
// Two formats with different S have distinct Error and Errors types, so
// errors.As never mistakes one format's problems for another's.
type Sentinel interface{ Sentinel() error }

// Error is one problem in a file.
type Error[S Sentinel] struct {
	// File is the file as named by the caller.
	File string
	// Line and Column locate the problem (1-based); 0 when unknown.
	Line   int
	Column int
	// Field is the dotted path of the offending field, such as
	// "steps.summary.timeout" or "hooks[1].command[0]"; empty for problems
	// that concern no field (YAML syntax errors).
	Field string
	// Msg describes the problem.
	Msg string
	// Err is the underlying cause when there is one (for example
	// fs.ErrNotExist), else nil. Msg already includes its text.
	Err error
}

// Error formats e as "FILE:LINE: FIELD: MSG", leaving out the line when it is
// unknown and the field when there is none.
func (e *Error[S]) Error() string {
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
	msg := e.Msg
	if len(msg) > MaxMessageBytes {
		msg = strings.ToValidUTF8(msg[:MaxMessageBytes], "") + "… (cut)"
	}
	b.WriteString(msg)
	return b.String()
}

// Bounds of what a file's problems print: a file with thousands of
// problems (or one quoting a huge value) must not flood a terminal.
const (
	MaxShownErrors  = 20
	MaxMessageBytes = 500
)

// Unwrap returns S's sentinel error and, when set, the underlying cause Err.
func (e *Error[S]) Unwrap() []error {
	var s S
	if e.Err == nil {
		return []error{s.Sentinel()}
	}
	return []error{s.Sentinel(), e.Err}
}

// Errors is every problem found in one file. Reader.Err returns it ordered
// by position and never empty, so both errors.As(err, &errs) with errs of
// type Errors[S] and errors.As(err, &e) with e of type *Error[S] (which
// finds the first problem) succeed.
type Errors[S Sentinel] []*Error[S]

// Error returns the problems one per line: the first MaxShownErrors, then
// how many more there are.
func (es Errors[S]) Error() string {
	lines := make([]string, 0, min(len(es), MaxShownErrors)+1)
	for i, e := range es {
		if i == MaxShownErrors {
			lines = append(lines, fmt.Sprintf("… and %d more problem(s)", len(es)-MaxShownErrors))
			break
		}
		lines = append(lines, e.Error())
	}
	return strings.Join(lines, "\n")
}

// Unwrap returns the individual problems, so errors.Is and errors.As see
// each of them.
func (es Errors[S]) Unwrap() []error {
	errs := make([]error, len(es))
	for i, e := range es {
		errs[i] = e
	}
	return errs
}
