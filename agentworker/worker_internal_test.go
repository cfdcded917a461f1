package agentworker

import "testing"

func TestUnderURL(t *testing.T) {
	tests := []struct {
		u, allowed string
		want       bool
	}{
		{"https://api.openai.com/v1", "https://api.openai.com/", true},
		{"https://api.openai.com/v1", "https://api.openai.com", true},
		{"https://api.openai.com", "https://api.openai.com/", true},
		{"http://127.0.0.1:8080/v1", "http://127.0.0.1:8080/v1", true},
		{"http://127.0.0.1:8080/v1/x", "http://127.0.0.1:8080/v1", true},
		{"https://api.openai.com.evil.example/v1", "https://api.openai.com", false},
		{"https://api.openai.com@evil.example/v1", "https://api.openai.com", false},
		{"http://api.openai.com/v1", "https://api.openai.com", false},
		{"https://api.openai.com:8443/v1", "https://api.openai.com", false},
		{"http://127.0.0.1:8080/v10", "http://127.0.0.1:8080/v1", false},
		{"::", "https://api.openai.com", false},
	}
	for _, tt := range tests {
		if got := underURL(tt.u, tt.allowed); got != tt.want {
			t.Errorf("underURL(%q, %q) = %v, want %v", tt.u, tt.allowed, got, tt.want)
		}
	}
}

func TestCutRunes(t *testing.T) {
	for _, tt := range []struct {
		in   string
		n    int
		want string
	}{
		{"completed", 200, "completed"},
		{"completed", 4, "comp"},
		{"ééé", 2, "éé"},
		{"", 3, ""},
		{"abc", 0, ""},
	} {
		if got := cutRunes(tt.in, tt.n); got != tt.want {
			t.Errorf("cutRunes(%q, %d) = %q, want %q", tt.in, tt.n, got, tt.want)
		}
	}
}
