package definition

import (
	"errors"
	"strings"
	"testing"
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
	data := map[string]any{"Name": "talk.md", "List": []string{"a", "b"}}
	tests := []struct {
		name, text, want, wantErr string
		limit                     int
	}{
		{name: "fits", text: `{{.Name}}{{range .List}}-{{.}}{{end}}`, limit: 100, want: "talk.md-a-b"},
		{name: "exactly the limit", text: `{{printf "%010d" 7}}`, limit: 10, want: "0000000007"},
		{name: "one byte over", text: `{{printf "%011d" 7}}`, limit: 10, wantErr: "renders more than 10 bytes"},
		{name: "stops early", text: `{{range 1000000}}{{printf "%0999d" 0}}{{end}}`, limit: 128 << 10, wantErr: "renders more than 131072 bytes"},
		{name: "wide printf", text: `{{printf "%1000000d" 1}}`, limit: 128 << 10, wantErr: "width or precision 1000000 is over 9999"},
		{name: "wide precision", text: `{{printf "%.20000f" 1.0}}`, limit: 128 << 10, wantErr: "width or precision 20000 is over 9999"},
		{name: "star width", text: `{{printf "%*d" 100000 1}}`, limit: 128 << 10, wantErr: "width or precision 100000 is over 9999"},
		{name: "missing key", text: `{{.Nope}}`, limit: 100, wantErr: "map has no entry"},
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
