package client

import (
	"strings"
	"testing"
	"time"

	"github.com/loopbus/loopbus/schemas"
)

func TestParseUntil(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    Until
		wantErr string
	}{
		{name: "sequence", in: "42", want: Until{Seq: 42}},
		{name: "time", in: "2026-11-22T10:00:00Z", want: Until{Time: time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)}},
		{name: "time with nanoseconds and offset", in: "2026-11-22T11:00:00.5+01:00", want: Until{Time: time.Date(2026, 11, 22, 10, 0, 0, 5e8, time.UTC)}},
		{name: "zero", in: "0", wantErr: "start at 1"},
		{name: "negative", in: "-3", wantErr: "RFC 3339"},
		{name: "leading zero is not a sequence", in: "042", wantErr: "RFC 3339"},
		{name: "words", in: "yesterday", wantErr: "RFC 3339"},
		{name: "date only", in: "2026-11-22", wantErr: "RFC 3339"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseUntil(tt.in)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil || got.Seq != tt.want.Seq || !got.Time.Equal(tt.want.Time) {
				t.Fatalf("ParseUntil(%q) = %+v, %v; want %+v", tt.in, got, err, tt.want)
			}
		})
	}
}

func TestUntilIncludes(t *testing.T) {
	at := time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)
	ev := schemas.Event{Seq: 7, Stored: at, Time: at.Add(time.Hour)} // producer clock ahead
	tests := []struct {
		name  string
		until Until
		want  bool
	}{
		{"no bound", Until{}, true},
		{"seq at", Until{Seq: 7}, true},
		{"seq before", Until{Seq: 6}, false},
		{"stored at the bound", Until{Time: at}, true},
		{"stored after the bound (producer time is ignored)", Until{Time: at.Add(-time.Second)}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.until.includes(ev); got != tt.want {
				t.Errorf("includes = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestNewSessionID(t *testing.T) {
	now := time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)
	tests := []struct {
		name, pipeline, wantPrefix string
	}{
		{"short", "writing-kit", "writing-kit-20261122-"},
		{"long name is cut to fit", strings.Repeat("p", 80), strings.Repeat("p", 50) + "-20261122-"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id := NewSessionID(tt.pipeline, now)
			if !strings.HasPrefix(id, tt.wantPrefix) || len(id) != len(tt.wantPrefix)+4 {
				t.Errorf("id %q, want %q + 4 hex", id, tt.wantPrefix)
			}
			if err := schemas.ValidateSessionID(id); err != nil {
				t.Error(err)
			}
		})
	}
}
