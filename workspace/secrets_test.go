package workspace_test

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/loopbus/loopbus/workspace"
)

func TestLooksSecret(t *testing.T) {
	tests := []struct {
		name string
		want bool
	}{
		{"API_TOKEN", true},
		{"github_token", true},
		{"ANTHROPIC_API_KEY", true},
		{"OPENAI_APIKEY", true},
		{"AWS_SECRET_ACCESS_KEY", true},
		{"AWS_ACCESS_KEY_ID", true},
		{"DB_PASSWORD", true},
		{"PGPASSWD", true},
		{"GPG_PASSPHRASE", true},
		{"GOOGLE_APPLICATION_CREDENTIALS", true},
		{"SSH_PRIVATE_KEY", true},
		{"STRIPE_KEY", true},
		{"client_secret", true},
		{"PATH", false},
		{"HOME", false},
		{"KEYBOARD_LAYOUT", false},
		{"SSH_AUTH_SOCK", false},
		{"PASS_ON_RETRY", false},
		{"LOOPBUS_OUTPUT_DIR", false},
		{"MONKEY", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := workspace.LooksSecret(tt.name); got != tt.want {
				t.Errorf("LooksSecret(%q) = %v, want %v", tt.name, got, tt.want)
			}
		})
	}
}

func TestValidateSecretName(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		wantErr bool
	}{
		{name: "upper", in: "API_TOKEN"},
		{name: "lower", in: "deploy_pw"},
		{name: "underscore first", in: "_X9"},
		{name: "empty", in: "", wantErr: true},
		{name: "digit first", in: "9LIVES", wantErr: true},
		{name: "dash", in: "API-TOKEN", wantErr: true},
		{name: "equals", in: "A=B", wantErr: true},
		{name: "NUL", in: "A\x00B", wantErr: true},
		{name: "non-ASCII", in: "TÖKEN", wantErr: true},
		{name: "loopbus own", in: "LOOPBUS_TOKEN", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := workspace.ValidateSecretName(tt.in)
			if (err != nil) != tt.wantErr {
				t.Fatalf("ValidateSecretName(%q) = %v, wantErr %v", tt.in, err, tt.wantErr)
			}
			if err != nil && !errors.Is(err, workspace.ErrBadSecretName) {
				t.Errorf("error %v does not wrap ErrBadSecretName", err)
			}
		})
	}
}

func TestNewSecrets(t *testing.T) {
	tests := []struct {
		name    string
		env     []string
		names   []string
		wantLen int
		wantErr error
		// wantText must appear in the error; the values in env never may.
		wantText string
	}{
		{name: "nothing secret", env: []string{"PATH=/usr/bin:/bin", "HOME=/home/someone"}, wantLen: 0},
		{name: "name looks secret", env: []string{"API_TOKEN=tok-12345678"}, wantLen: 1},
		{name: "short looking-secret value is not masked", env: []string{"MAX_TOKENS=4096"}, wantLen: 0},
		{name: "listed", env: []string{"PLAIN=plain-value-1"}, names: []string{"PLAIN"}, wantLen: 1},
		{name: "listed but unset", env: []string{"OTHER=x"}, names: []string{"PLAIN"}, wantLen: 0},
		{name: "listed and empty", env: []string{"PLAIN="}, names: []string{"PLAIN"}, wantLen: 0},
		{name: "every value of a repeated name", env: []string{"A_TOKEN=first-value", "A_TOKEN=second-value"}, wantLen: 2},
		{name: "same value twice", env: []string{"A_TOKEN=same-value-x", "A_TOKEN=same-value-x"}, wantLen: 1},
		{name: "invalid UTF-8 value also masked as shown", env: []string{"A_TOKEN=bin\xff\xfevalue"}, wantLen: 2},
		{
			name: "listed but short", env: []string{"PIN=1234", "PW=abc"}, names: []string{"PIN", "PW"},
			wantErr: workspace.ErrShortSecret, wantText: "PIN, PW listed as secret but shorter than 8 bytes",
		},
		{name: "bad name", names: []string{"LOOPBUS_TOKEN"}, wantErr: workspace.ErrBadSecretName},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := workspace.NewSecrets(tt.env, tt.names)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("NewSecrets error = %v, want %v", err, tt.wantErr)
				}
				if !strings.Contains(err.Error(), tt.wantText) {
					t.Errorf("error %q does not say %q", err, tt.wantText)
				}
				for _, kv := range tt.env {
					if _, v, _ := strings.Cut(kv, "="); v != "" && strings.Contains(err.Error(), v) {
						t.Errorf("error %q shows the value %q", err, v)
					}
				}
				return
			}
			if err != nil {
				t.Fatalf("NewSecrets: %v", err)
			}
			if s.Len() != tt.wantLen {
				t.Errorf("Len = %d, want %d", s.Len(), tt.wantLen)
			}
		})
	}
}

func mustSecrets(t *testing.T, env ...string) *workspace.Secrets {
	t.Helper()
	s, err := workspace.NewSecrets(env, nil)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestMask(t *testing.T) {
	s := mustSecrets(t, "API_TOKEN=tok-abcdefgh", "LONG_SECRET=tok-abcdefgh-and-more", "DB_PASSWORD=hunter2hunter2")
	tests := []struct {
		name, in, want string
	}{
		{name: "none", in: "nothing to hide", want: "nothing to hide"},
		{name: "one", in: "token is tok-abcdefgh.", want: "token is [secret API_TOKEN]."},
		{name: "repeated", in: "tok-abcdefghtok-abcdefgh", want: "[secret API_TOKEN][secret API_TOKEN]"},
		{name: "longer value containing a shorter one wins", in: "x tok-abcdefgh-and-more y", want: "x [secret LONG_SECRET] y"},
		{name: "two secrets", in: "hunter2hunter2 tok-abcdefgh", want: "[secret DB_PASSWORD] [secret API_TOKEN]"},
		{name: "prefix only is left", in: "tok-abcdefg", want: "tok-abcdefg"},
		{name: "multi-line", in: "a\ntok-abcdefgh\nb", want: "a\n[secret API_TOKEN]\nb"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := s.Mask(tt.in); got != tt.want {
				t.Errorf("Mask(%q) = %q, want %q", tt.in, got, tt.want)
			}
		})
	}
	var none *workspace.Secrets
	if got := none.Mask("tok-abcdefgh"); got != "tok-abcdefgh" {
		t.Errorf("nil Secrets masked %q", got)
	}
}

// TestMaskTail cuts an output at every position across a secret value, the
// way procrun keeps a tail of limit+MaxLen bytes, and checks that no digit
// (only the secret has digits) survives while the text after it does.
func TestMaskTail(t *testing.T) {
	const value = "31415926535897932384" // the only digits anywhere
	const limit = 64
	s := mustSecrets(t, "PI_TOKEN="+value)
	for _, before := range []int{0, 10, limit, limit + 40} {
		for _, after := range []int{0, 1, limit / 2, limit - len(value), limit - len(value)/2, limit - 1, limit, limit + 5} {
			full := strings.Repeat(".", before) + value + strings.Repeat("~", after)
			keep := limit + s.MaxLen()
			tail := full
			if len(full) > keep {
				tail = "…" + full[len(full)-keep:]
			}
			got := s.MaskTail(tail, limit)
			if strings.ContainsAny(got, "0123456789") {
				t.Errorf("before %d after %d: tail %q shows (part of) the secret", before, after, got)
			}
			body := strings.TrimPrefix(got, "…")
			if len(body) > limit {
				t.Errorf("before %d after %d: %d bytes kept, limit %d", before, after, len(body), limit)
			}
			if want := strings.Repeat("~", min(after, limit)); !strings.HasSuffix(got, want) {
				t.Errorf("before %d after %d: tail %q lost the text after the secret", before, after, got)
			}
			if after+len("[secret PI_TOKEN]") <= limit && !strings.Contains(got, "[secret PI_TOKEN]") {
				t.Errorf("before %d after %d: tail %q does not show where the secret was", before, after, got)
			}
			if (len(full) > limit) != strings.HasPrefix(got, "…") && len(s.Mask(full)) > limit {
				t.Errorf("before %d after %d: tail %q: want a leading … exactly when text was dropped", before, after, got)
			}
		}
	}
}

// TestMaskTailRepeatedValue: masking shortens the text, so the last limit
// bytes reach back to where the tail was cut; what is left there of a value
// cut in two must not show.
func TestMaskTailRepeatedValue(t *testing.T) {
	const value = "271828182845904523536028747135" // 30 digits, masked as 17 bytes
	const limit = 64
	s := mustSecrets(t, "E_TOKEN="+value)
	keep := limit + s.MaxLen()
	// Every phase of the repeated value against the cut.
	for end := 0; end <= len(value); end++ {
		full := strings.Repeat(value+"~", 10) + strings.Repeat("-", end)
		got := s.MaskTail("…"+full[len(full)-keep:], limit)
		if strings.ContainsAny(got, "0123456789") {
			t.Errorf("%d bytes after the last value: tail %q shows part of the secret", end, got)
		}
	}
}

func TestMaskTailKeepsRunes(t *testing.T) {
	s := mustSecrets(t, "A_TOKEN=secret-value-1")
	got := s.MaskTail(strings.Repeat("é", 50), 11)
	if got != "…"+strings.Repeat("é", 5) {
		t.Errorf("MaskTail = %q, want … and 5 whole runes", got)
	}
}

func TestFindAndReader(t *testing.T) {
	const value = "s3cr3t-v4lue-0123"
	s := mustSecrets(t, "API_TOKEN="+value, "OTHER_TOKEN=another-secret-value")
	tests := []struct {
		name    string
		content string
		want    string
	}{
		{name: "clean", content: strings.Repeat("harmless text\n", 10000), want: ""},
		{name: "at start", content: value + strings.Repeat("x", 100), want: "API_TOKEN"},
		{name: "at end", content: strings.Repeat("x", 200000) + value, want: "API_TOKEN"},
		{name: "across the 64 KiB read boundary", content: strings.Repeat("x", 64<<10-5) + value + "y", want: "API_TOKEN"},
		{name: "other", content: "another-secret-value", want: "OTHER_TOKEN"},
		{name: "the longest value, one byte before the read boundary", content: strings.Repeat("x", 64<<10-1) + "another-secret-value" + "y", want: "OTHER_TOKEN"},
		{name: "almost", content: value[:len(value)-1] + "!" + value[1:], want: ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, r := range []struct {
				kind string
				r    io.Reader
			}{
				{"whole", strings.NewReader(tt.content)},
				{"one byte at a time", iotest.OneByteReader(strings.NewReader(tt.content))},
				{"seven bytes at a time", &pieces{r: strings.NewReader(tt.content), n: 7}},
				{"limited to its size", io.LimitReader(strings.NewReader(tt.content), int64(len(tt.content)))},
			} {
				got, err := s.Find(r.r)
				if err != nil || got != tt.want {
					t.Errorf("%s: Find = %q, %v; want %q", r.kind, got, err, tt.want)
				}
			}
			var passed bytes.Buffer
			_, err := io.Copy(&passed, s.Reader(iotest.HalfReader(strings.NewReader(tt.content)), "report.json"))
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("Reader failed on clean content: %v", err)
			case tt.want == "" && passed.String() != tt.content:
				t.Errorf("Reader passed %d bytes, want all %d", passed.Len(), len(tt.content))
			case tt.want != "" && !errors.Is(err, workspace.ErrSecretInOutput):
				t.Errorf("Reader error = %v, want ErrSecretInOutput", err)
			case tt.want != "":
				if !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), "report.json") {
					t.Errorf("Reader error %q names neither %s nor the output", err, tt.want)
				}
				if strings.Contains(err.Error(), value) {
					t.Errorf("Reader error shows the value: %q", err)
				}
				if strings.Contains(passed.String(), value) {
					t.Errorf("Reader passed on the whole value before failing")
				}
			}
		})
	}
	if got, err := s.Find(iotest.ErrReader(io.ErrUnexpectedEOF)); !errors.Is(err, io.ErrUnexpectedEOF) || got != "" {
		t.Errorf("Find on a failing reader = %q, %v", got, err)
	}
	// With no secrets there is nothing to look for: nothing is read.
	none := mustSecrets(t)
	if got, err := none.Find(iotest.ErrReader(io.ErrUnexpectedEOF)); err != nil || got != "" {
		t.Errorf("Find without secrets = %q, %v; want nothing read", got, err)
	}
}

// pieces reads at most n bytes at a time.
type pieces struct {
	r io.Reader
	n int
}

func (p *pieces) Read(b []byte) (int, error) { return p.r.Read(b[:min(len(b), p.n)]) }
