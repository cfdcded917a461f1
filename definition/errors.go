package definition

import (
	"errors"

	"github.com/loopbus/loopbus/definition/yamlread"
)

// ErrInvalid is wrapped by every problem found in a pipeline file, including
// YAML syntax errors: errors.Is(err, ErrInvalid) is true for any error Load
// or Parse return because of the file's content (and false when Load cannot
// read the file at all).
var ErrInvalid = errors.New("invalid pipeline")

// invalid gives pipeline problems their own Error type wrapping ErrInvalid.
type invalid struct{}

// Sentinel implements yamlread.Sentinel.
func (invalid) Sentinel() error { return ErrInvalid }

// Error is one problem in a pipeline file: File, Line and Column (1-based,
// 0 when unknown), Field (the dotted path of the offending field, such as
// "steps.summary.timeout" or "steps.summary.outputs[0].name"; empty for
// problems that concern no field, like YAML syntax errors), Msg, and Err
// (the underlying cause, such as schemas.ErrBadName or fs.ErrNotExist, or
// nil; Msg already includes its text). Its Error method formats it as
// "FILE:LINE: FIELD: MSG", leaving out the line when it is unknown and the
// field when there is none; it unwraps to ErrInvalid and Err.
type Error = yamlread.Error[invalid]

// Errors is every problem found in one pipeline file, ordered by position.
// Load and Parse always report problems as a non-empty Errors, so both
// errors.As(err, &errs) with errs of type Errors and errors.As(err, &e) with
// e of type *Error (which finds the first problem) succeed. Its Error method
// returns the problems one per line.
type Errors = yamlread.Errors[invalid]
