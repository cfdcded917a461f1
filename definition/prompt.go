package definition

import (
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"text/template"
	"text/template/parse"
)

// Prompt templates are user input run by the orchestrator: one that renders
// without bound (a huge printf width, ranges nested over large counts, a
// long output) must fail its step, not exhaust the service's memory or CPU.

// Bounds of a prompt template.
const (
	// MaxPrintfWidth bounds a width or precision in printf's format (and
	// a * argument): wider padding is refused before it is allocated.
	MaxPrintfWidth = 9999
	// MaxRangeProduct bounds the product of the integer counts of nested
	// {{range N}} actions: a template cannot loop that often without
	// writing, which no output bound would stop.
	MaxRangeProduct = 1_000_000
	// MaxRangeRuns bounds the runs of every {{range}} and the
	// {{template}} calls of one rendering together, whatever they range
	// over (a number in the data, a list, nested, or recursion through
	// templates that call themselves), each call counting callWeight runs.
	// A prompt renders to at most 128 KiB, so a loop that writes runs
	// fewer times than this.
	MaxRangeRuns = 200_000
	// callWeight is what a {{template}} call counts: it does more than a
	// run of a range.
	callWeight = 10
	// MaxPromptBytes bounds a rendered prompt, and so a prompt template:
	// the job.requested carrying it must fit in an event.
	MaxPromptBytes = 128 << 10
)

// ErrPromptTooLarge: a prompt renders to more bytes than its limit.
var ErrPromptTooLarge = errors.New("prompt too large")

// ErrPromptLoops: a prompt's {{range}} actions and {{template}} calls ran
// more than MaxRangeRuns times in one rendering.
var ErrPromptLoops = fmt.Errorf("the prompt template's {{range}} loops and {{template}} calls run more than %d times", MaxRangeRuns)

// rangeBudget names the function ParsePrompt puts at the end of every
// {{range}} pipeline: it counts the runs about to happen and stops the
// rendering past MaxRangeRuns; callBudget, put at the end of every
// {{template}} call's pipeline, counts the call. Their names cannot clash
// with a user's: users name no functions.
const (
	rangeBudget = "loopbus_range_budget"
	callBudget  = "loopbus_call_budget"
)

// ParsePrompt parses a prompt template with missingkey=error and bounded
// print functions, and refuses a NUL byte and nested {{range N}} loops whose counts
// multiply beyond MaxRangeProduct.
func ParsePrompt(name, text string) (*template.Template, error) {
	if i := strings.IndexByte(text, 0); i >= 0 {
		return nil, fmt.Errorf("the prompt holds a NUL byte (at byte %d): prompts are text", i)
	}
	funcs := template.FuncMap{
		"printf":    boundedPrintf,
		"print":     fmt.Sprint,
		"println":   fmt.Sprintln,
		rangeBudget: passThrough,
		callBudget:  passThroughCall,
	}
	t, err := template.New(name).Option("missingkey=error").Funcs(funcs).Parse(text)
	if err != nil {
		return nil, err
	}
	ranges, err := budgetPipe(funcs, rangeBudget)
	if err != nil {
		return nil, err
	}
	calls, err := budgetPipe(funcs, callBudget)
	if err != nil {
		return nil, err
	}
	for _, tt := range t.Templates() {
		if tt.Tree == nil || tt.Root == nil {
			continue
		}
		if err := checkRanges(tt.Root, 1); err != nil {
			return nil, err
		}
		count(tt.Root, ranges, calls)
	}
	return t, nil
}

func passThrough(v any) any { return v }

func passThroughCall(v ...any) any {
	if len(v) == 0 {
		return nil
	}
	return v[len(v)-1]
}

// budgetPipe returns the pipeline "{{name}}", parsed: its command is
// appended to pipelines, and it stands for a {{template}} call's missing
// one.
func budgetPipe(funcs template.FuncMap, name string) (*parse.PipeNode, error) {
	t, err := template.New("budget").Funcs(funcs).Parse("{{" + name + "}}")
	if err != nil {
		return nil, err
	}
	return t.Root.Nodes[0].(*parse.ActionNode).Pipe, nil
}

// count appends the budget commands to the pipeline of every {{range}}
// and {{template}} call under n, so that each hands what it ranges over,
// or its call, to the budget first.
func count(n parse.Node, ranges, calls *parse.PipeNode) {
	switch n := n.(type) {
	case *parse.ListNode:
		if n == nil {
			return
		}
		for _, c := range n.Nodes {
			count(c, ranges, calls)
		}
	case *parse.RangeNode:
		n.Pipe.Cmds = append(n.Pipe.Cmds, ranges.Cmds[0])
		count(n.List, ranges, calls)
		count(n.ElseList, ranges, calls)
	case *parse.TemplateNode:
		if n.Pipe == nil {
			// {{template "t"}} runs t on nil: the budget's call gives nil.
			n.Pipe = calls
		} else {
			n.Pipe.Cmds = append(n.Pipe.Cmds, calls.Cmds[0])
		}
	case *parse.IfNode:
		count(n.List, ranges, calls)
		count(n.ElseList, ranges, calls)
	case *parse.WithNode:
		count(n.List, ranges, calls)
		count(n.ElseList, ranges, calls)
	}
}

// runsOf returns how often a {{range}} over v runs: an integer's value, a
// list's or map's length; past the bound for what has no length known
// beforehand (a channel, an iterator function).
func runsOf(v any) int {
	rv := reflect.Indirect(reflect.ValueOf(v))
	switch rv.Kind() {
	case reflect.Chan, reflect.Func:
		return MaxRangeRuns + 1
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return int(min(max(rv.Int(), 0), MaxRangeRuns+1))
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		return int(min(rv.Uint(), MaxRangeRuns+1))
	case reflect.Slice, reflect.Array, reflect.Map, reflect.String:
		return rv.Len()
	}
	return 0
}

// RenderPrompt executes t on data and returns at most limit bytes: a
// template that writes more stops at the limit with ErrPromptTooLarge.
//
// The {{range}} actions of a template from ParsePrompt run at most
// MaxRangeRuns times in all; past that the rendering stops with
// ErrPromptLoops.
func RenderPrompt(t *template.Template, data any, limit int) (string, error) {
	w := &limitedWriter{limit: limit}
	runs := 0
	t, err := t.Clone()
	if err != nil {
		return "", err
	}
	t.Funcs(template.FuncMap{
		rangeBudget: func(v any) (any, error) {
			if runs += runsOf(v); runs > MaxRangeRuns {
				return nil, ErrPromptLoops
			}
			return v, nil
		},
		callBudget: func(v ...any) (any, error) {
			if runs += callWeight; runs > MaxRangeRuns {
				return nil, ErrPromptLoops
			}
			return passThroughCall(v...), nil
		},
	})
	if err := t.Execute(w, data); err != nil {
		switch {
		case errors.Is(err, ErrPromptTooLarge):
			return "", fmt.Errorf("%w: the prompt template renders more than %d bytes; pass large content as artifacts (files in in/) instead", ErrPromptTooLarge, limit)
		case errors.Is(err, ErrPromptLoops):
			return "", fmt.Errorf("%w; prompts must stay small", ErrPromptLoops)
		}
		return "", err
	}
	return w.b.String(), nil
}

type limitedWriter struct {
	b     strings.Builder
	limit int
}

func (w *limitedWriter) Write(p []byte) (int, error) {
	if w.b.Len()+len(p) > w.limit {
		return 0, ErrPromptTooLarge
	}
	return w.b.Write(p)
}

// boundedPrintf is fmt.Sprintf refusing widths and precisions over
// MaxPrintfWidth, written or given as * arguments.
func boundedPrintf(format string, args ...any) (string, error) {
	argi := 0
	for i := 0; i < len(format); i++ {
		if format[i] != '%' {
			continue
		}
		for i++; i < len(format); i++ {
			c := format[i]
			switch {
			case c >= '0' && c <= '9':
				j := i
				for j < len(format) && format[j] >= '0' && format[j] <= '9' {
					j++
				}
				if n, err := strconv.Atoi(format[i:j]); err != nil || n > MaxPrintfWidth {
					return "", fmt.Errorf("printf: width or precision %s is over %d", format[i:j], MaxPrintfWidth)
				}
				i = j - 1
				continue
			case c == '*':
				if argi < len(args) {
					if n, ok := args[argi].(int); ok && (n > MaxPrintfWidth || n < -MaxPrintfWidth) {
						return "", fmt.Errorf("printf: width or precision %d is over %d", n, MaxPrintfWidth)
					}
				}
				argi++
				continue
			case c == '.' || c == '-' || c == '+' || c == '#' || c == ' ' || c == '[' || c == ']':
				continue
			}
			if c != '%' {
				argi++
			}
			break
		}
	}
	return fmt.Sprintf(format, args...), nil
}

// checkRanges refuses {{range N}} actions whose integer counts, multiplied
// along their nesting, exceed MaxRangeProduct.
func checkRanges(n parse.Node, product int) error {
	switch n := n.(type) {
	case *parse.ListNode:
		if n == nil {
			return nil
		}
		for _, c := range n.Nodes {
			if err := checkRanges(c, product); err != nil {
				return err
			}
		}
	case *parse.RangeNode:
		inner := product
		if count, ok := rangeCount(n.Pipe); ok {
			if count > MaxRangeProduct || inner*count > MaxRangeProduct {
				return fmt.Errorf("line %d: {{range %d}} nested in other loops runs over %d times; prompts must stay small", n.Line, count, MaxRangeProduct)
			}
			inner *= max(count, 1)
		}
		if err := checkRanges(n.List, inner); err != nil {
			return err
		}
		return checkRanges(n.ElseList, product)
	case *parse.IfNode:
		if err := checkRanges(n.List, product); err != nil {
			return err
		}
		return checkRanges(n.ElseList, product)
	case *parse.WithNode:
		if err := checkRanges(n.List, product); err != nil {
			return err
		}
		return checkRanges(n.ElseList, product)
	}
	return nil
}

// rangeCount returns the integer a range's pipeline is, when it is a
// number literal.
func rangeCount(p *parse.PipeNode) (int, bool) {
	if p == nil || len(p.Cmds) != 1 || len(p.Cmds[0].Args) != 1 {
		return 0, false
	}
	num, ok := p.Cmds[0].Args[0].(*parse.NumberNode)
	if !ok || !num.IsInt {
		return 0, false
	}
	if num.Int64 > MaxRangeProduct {
		return MaxRangeProduct + 1, true
	}
	return int(num.Int64), true
}
