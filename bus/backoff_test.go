package bus

import (
	"testing"
	"time"
)

func TestBackoffDelay(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		attempt int
		want    time.Duration
	}{
		{name: "negative is the first", attempt: -1, want: 50 * time.Millisecond},
		{name: "first", attempt: 0, want: 50 * time.Millisecond},
		{name: "second doubles", attempt: 1, want: 100 * time.Millisecond},
		{name: "fifth", attempt: 4, want: 800 * time.Millisecond},
		{name: "cap", attempt: 5, want: 1600 * time.Millisecond},
		{name: "past the cap", attempt: 1000, want: 1600 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := backoffDelay(tt.attempt); got != tt.want {
				t.Errorf("backoffDelay(%d) = %v, want %v", tt.attempt, got, tt.want)
			}
		})
	}
}
