package definition

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/loopbus/loopbus/definition/yamlread"
)

func TestParsePromptBounds(t *testing.T) {
	tests := []struct {
		name, text, wantErr string
	}{
		{name: "ordinary", text: `Summarize {{.Name}}{{range .List}} {{.}}{{end}} {{printf "%5d|%-8s|%.3f" 1 "a" 2.0}}`},
		{name: "small literal ranges nest", text: `{{range 100}}{{range 100}}{{range 100}}x{{end}}{{end}}{{end}}`},
		{name: "nested counts over the bound", text: "a\n{{range 1000}}{{if true}}{{range 1001}}{{end}}{{end}}{{end}}", wantErr: "line 2: {{range 1001}} nested in other loops runs over 1000000 times"},
		{name: "one huge count", text: `{{range $i := 99999999999}}{{end}}`, wantErr: "runs over 1000000 times"},
		{name: "in a defined template", text: `{{define "x"}}{{range 2000000}}{{end}}{{end}}`, wantErr: "runs over"},
		{name: "syntax", text: `{{range}}`, wantErr: "missing value for range"},
		{name: "NUL", text: "a\x00b", wantErr: "NUL byte (at byte 1)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParsePrompt("p", tt.text)
			if tt.wantErr == "" && err != nil || tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
				t.Fatalf("err = %v, want %q", err, tt.wantErr)
			}
		})
	}
}

func TestRenderPromptBounds(t *testing.T) {
	thousands := make([]int, 2000)
	data := map[string]any{"Name": "talk.md", "List": []string{"a", "b"}, "Size": int64(1) << 40,
		"Thousand": make([]int, 1000), "Small": 3, "Empty": []string{}, "Pointer": &thousands}
	tests := []struct {
		name, text, want, wantErr string
		limit                     int
	}{
		{name: "fits", text: `{{.Name}}{{range .List}}-{{.}}{{end}}`, limit: 100, want: "talk.md-a-b"},
		{name: "exactly the limit", text: `{{printf "%010d" 7}}`, limit: 10, want: "0000000007"},
		{name: "one byte over", text: `{{printf "%011d" 7}}`, limit: 10, wantErr: "renders more than 10 bytes"},
		{name: "stops early", text: `{{range 100000}}{{printf "%0999d" 0}}{{end}}`, limit: 128 << 10, wantErr: "renders more than 131072 bytes"},
		{name: "wide printf", text: `{{printf "%1000000d" 1}}`, limit: 128 << 10, wantErr: "width or precision 1000000 is over 9999"},
		{name: "wide precision", text: `{{printf "%.20000f" 1.0}}`, limit: 128 << 10, wantErr: "width or precision 20000 is over 9999"},
		{name: "star width", text: `{{printf "%*d" 100000 1}}`, limit: 128 << 10, wantErr: "width or precision 100000 is over 9999"},
		{name: "missing key", text: `{{.Nope}}`, limit: 100, wantErr: "map has no entry"},
		// Loops that write nothing, over counts the parser cannot see.
		{name: "range over a number in the data", text: `{{range .Size}}{{end}}`, limit: 100, wantErr: "calls run more than 200000 times"},
		{name: "nested ranges over lists", text: `{{range .Thousand}}{{range $.Thousand}}{{range $.List}}{{end}}{{end}}{{end}}`, limit: 100, wantErr: "calls run more than 200000 times"},
		{name: "a range through a template call", text: `{{define "t"}}{{range $.Thousand}}{{end}}{{end}}{{range .Thousand}}{{template "t" $}}{{range $.Thousand}}{{end}}{{end}}`, limit: 100, wantErr: "calls run more than 200000 times"},
		{name: "a template that calls itself twice", text: `{{define "t"}}{{if lt (len .) 40}}{{template "t" (print . "x")}}{{template "t" (print . "x")}}{{end}}{{end}}{{template "t" ""}}`, limit: 100, wantErr: "calls run more than 200000 times"},
		{name: "a template called without data", text: `{{define "t"}}{{if .}}x{{else}}y{{end}}{{end}}{{template "t"}}{{range .List}}{{template "t" .}}{{end}}`, limit: 100, want: "yxx"},
		{name: "a range over a pointer to a list", text: `{{range .Pointer}}{{range $.Pointer}}{{end}}{{end}}`, limit: 100, wantErr: "calls run more than 200000 times"},
		{name: "ranges within the bound", text: `{{range $i, $x := .List}}{{$i}}{{$x}}{{end}}{{range .Small}}.{{end}}{{range .Thousand}}{{end}}{{range .Empty}}x{{else}}none{{end}}`, limit: 100, want: "0a1b...none"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tmpl, err := ParsePrompt("p", tt.text)
			if err != nil {
				t.Fatal(err)
			}
			got, err := RenderPrompt(tmpl, data, tt.limit)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want %q", err, tt.wantErr)
				}
				if strings.Contains(tt.wantErr, "renders more") && !errors.Is(err, ErrPromptTooLarge) {
					t.Errorf("err %v does not wrap ErrPromptTooLarge", err)
				}
				if strings.Contains(tt.wantErr, "calls run") && !errors.Is(err, ErrPromptLoops) {
					t.Errorf("err %v does not wrap ErrPromptLoops", err)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("got %q, %v; want %q", got, err, tt.want)
			}
		})
	}
}

// TestParseByteOrderMark: a UTF-8 byte-order mark may start a definition
// file, as YAML allows.
func TestParseByteOrderMark(t *testing.T) {
	doc := "\xef\xbb\xbfname: bom\nsteps:\n  a:\n    agent: {backend: exec, command: [\"true\"]}\n    prompt: hi\n    outputs: [{name: a.txt}]\n"
	p, err := Parse("bom.yaml", []byte(doc), t.TempDir())
	if err != nil || p.Name != "bom" {
		t.Fatalf("Parse: %v (name %q)", err, p.Name)
	}
}

// TestParseLimits: hostile definition files fail fast with the limit they
// break (before the limits, 100,000 nested brackets took over 25 s and a
// 10 MB file 64 s and 2.9 GB), and a file with many problems prints a
// bounded report.
func TestParseLimits(t *testing.T) {
	step := func(i int) string {
		return fmt.Sprintf("  s%d:\n    agent: {backend: exec, command: [\"true\"]}\n    prompt: p\n    outputs: [{name: o%d.txt}]\n", i, i)
	}
	var many strings.Builder
	many.WriteString("name: many\nsteps:\n")
	for i := range MaxSteps + 1 {
		many.WriteString(step(i))
	}
	var bad strings.Builder
	bad.WriteString("name: bad\nsteps:\n")
	for i := range 30 {
		fmt.Fprintf(&bad, "  s%d:\n    agent: {backend: exec, command: [\"true\"]}\n    prompt: p\n    outputs: [{name: o.txt}]\n    timeout: soon\n", i)
	}
	deep := "name: deep\nsteps:\n" + strings.Repeat(" ", 2*(yamlread.MaxNesting+1)) + "x: 1\n"
	// Prompts each within their limit that together make a session.started
	// over the event limit; the third is the largest.
	var wide strings.Builder
	wide.WriteString("name: wide\nsteps:\n")
	for i, kib := range []int{100, 110, 120, 100, 100} {
		fmt.Fprintf(&wide, "  s%d:\n    agent: {backend: exec, command: [\"true\"]}\n    prompt: %s\n    outputs: [{name: o%d.txt}]\n    final: %v\n", i, strings.Repeat("p", kib<<10), i, i == 4)
	}
	tests := []struct {
		name, doc, want, also string
		lines                 int
	}{
		{name: "nested brackets", doc: "name: x\nsteps: " + strings.Repeat("[", 100_000), want: "x.yaml:2: brackets nested 65 levels deep, over the limit of 64"},
		{name: "deep indentation", doc: deep, want: "x.yaml:3: nested 65 levels deep"},
		{name: "huge file", doc: "name: x\n# " + strings.Repeat("x", yamlread.MaxFileBytes) + "\n", want: "over the 1048576-byte limit of a definition file"},
		{name: "too many steps", doc: many.String(), want: "x.yaml:2: steps: 201 steps, over the limit of 200"},
		{name: "problems capped", doc: bad.String(), want: "more problem(s)", lines: yamlread.MaxShownErrors + 1},
		{name: "a prompt over what a prompt renders", doc: "name: x\nsteps:\n  a:\n    agent: {backend: exec, command: [\"true\"]}\n    prompt: " + strings.Repeat("p", MaxPromptBytes+1) + "\n    outputs: [{name: o.txt}]\n",
			want: "x.yaml:5: steps.a.prompt: the template is 131073 bytes; a prompt renders to at most 131072"},
		{name: "a definition over an event", doc: wide.String(),
			want: "x.yaml:15: steps.s2.prompt: the definition is ", also: "over the limit of 458752 (an event's size, less room for the rest); its largest part is this prompt, 122880 bytes", lines: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse("x.yaml", []byte(tt.doc), t.TempDir())
			if err == nil || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), tt.also) {
				t.Fatalf("err = %.300v, want %q and %q", err, tt.want, tt.also)
			}
			if tt.lines > 0 {
				if n := strings.Count(err.Error(), "\n") + 1; n != tt.lines {
					t.Errorf("%d lines of problems, want %d", n, tt.lines)
				}
			}
		})
	}
}
