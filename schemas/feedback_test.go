package schemas

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestBoundFeedback(t *testing.T) {
	huge := Feedback{Iteration: 1, Kind: "job", Message: strings.Repeat("x", 100_000), RetryHint: "retry"}
	manyErrs := Feedback{Iteration: 2, Kind: "validation"}
	for range 500 {
		manyErrs.Errors = append(manyErrs.Errors, ValidationError{Artifact: "a.json", Pointer: "/x", Message: strings.Repeat("m", 2000)})
	}
	var long []Feedback
	for i := range 40 {
		f := manyErrs
		f.Iteration = i + 1
		long = append(long, f)
	}
	tests := []struct {
		name        string
		in          []Feedback
		wantEntries int
		wantFirst   int // iteration of the first entry kept
		maxJSON     int
	}{
		{"nil stays nil", nil, 0, 0, 4},
		{"long message keeps its end", []Feedback{huge}, 1, 1, 5 << 10},
		{"errors capped and counted", []Feedback{manyErrs}, 1, 2, 40 << 10},
		{"newest entries kept", long, MaxFeedbackEntries, 31, 400 << 10},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := BoundFeedback(tt.in)
			if len(got) != tt.wantEntries {
				t.Fatalf("%d entries, want %d", len(got), tt.wantEntries)
			}
			if len(got) > 0 && got[0].Iteration != tt.wantFirst {
				t.Errorf("first kept iteration %d, want %d", got[0].Iteration, tt.wantFirst)
			}
			raw, _ := json.Marshal(got)
			if len(raw) > tt.maxJSON {
				t.Errorf("%d bytes of JSON, want at most %d", len(raw), tt.maxJSON)
			}
		})
	}
	if got := BoundFeedback([]Feedback{manyErrs}); !strings.Contains(got[0].Message, "450 more errors not shown") {
		t.Errorf("dropped errors not counted: %q", got[0].Message)
	}
	if got := BoundFeedback([]Feedback{huge}); !strings.HasPrefix(got[0].Message, "…") || len(got[0].Message) > 5000 {
		t.Errorf("long message not shortened from the front: %d bytes", len(got[0].Message))
	}
	if manyErrs.Errors[0].Message != strings.Repeat("m", 2000) {
		t.Error("BoundFeedback modified its input")
	}
}
