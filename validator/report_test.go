package validator_test

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"

	"github.com/loopbus/loopbus/internal/testnats"
	"github.com/loopbus/loopbus/schemas"
	"github.com/loopbus/loopbus/validator"
)

// jsonOfSize returns a JSON object of exactly n bytes (n >= 10).
func jsonOfSize(n int) string {
	return `{"pad":"` + strings.Repeat("x", n-10) + `"}`
}

func TestReports(t *testing.T) {
	summary := schemas.Output{Name: "summary.json", Schema: json.RawMessage(summarySchema), Report: true}
	review := schemas.Output{Name: "review.json", Report: true}
	const validSummary = "{\n  \"title\": \"Event-sourced agents\",\n  \"count\": 3\n}\n"
	limit := strconv.Itoa(schemas.MaxReportBytes)

	tests := []struct {
		name     string
		outputs  []schemas.Output
		produced []file
		validate string
		want     string
		// wantReports are name and content pairs, in order.
		wantReports []schemas.Report
		wantErrs    []wantErr
	}{
		{
			name:        "schema-valid report carried compacted",
			outputs:     []schemas.Output{summary, {Name: "notes.md"}},
			produced:    []file{{"summary.json", validSummary}, {"notes.md", "not a report"}},
			want:        schemas.TypeValidationPassed,
			wantReports: []schemas.Report{{Name: "summary.json", Content: json.RawMessage(`{"title":"Event-sourced agents","count":3}`)}},
		},
		{
			name:     "reports in declaration order, as the bus encodes them",
			outputs:  []schemas.Output{review, summary},
			produced: []file{{"summary.json", validSummary}, {"review.json", `["a < b & c", null, 1.5e3]`}},
			validate: "exit 0\n",
			want:     schemas.TypeValidationPassed,
			wantReports: []schemas.Report{
				{Name: "review.json", Content: json.RawMessage(`["a \u003c b \u0026 c",null,1.5e3]`)},
				{Name: "summary.json", Content: json.RawMessage(`{"title":"Event-sourced agents","count":3}`)},
			},
		},
		{
			name:        "report of exactly the limit",
			outputs:     []schemas.Output{review},
			produced:    []file{{"review.json", jsonOfSize(schemas.MaxReportBytes)}},
			want:        schemas.TypeValidationPassed,
			wantReports: []schemas.Report{{Name: "review.json", Content: json.RawMessage(jsonOfSize(schemas.MaxReportBytes))}},
		},
		{
			name:     "report over the limit",
			outputs:  []schemas.Output{review},
			produced: []file{{"review.json", jsonOfSize(schemas.MaxReportBytes + 1)}},
			want:     schemas.TypeValidationFailed,
			wantErrs: []wantErr{{artifact: "review.json", source: "schema", contains: []string{strconv.Itoa(schemas.MaxReportBytes + 1), limit + "-byte limit"}}},
		},
		{
			name:     "report with a schema over the limit",
			outputs:  []schemas.Output{{Name: "review.json", Schema: json.RawMessage(`{"type":"object"}`), Report: true}},
			produced: []file{{"review.json", jsonOfSize(schemas.MaxReportBytes + 1)}},
			want:     schemas.TypeValidationFailed,
			wantErrs: []wantErr{{artifact: "review.json", source: "schema", contains: []string{strconv.Itoa(schemas.MaxReportBytes + 1), limit + "-byte limit"}}},
		},
		{
			name:     "report not JSON",
			outputs:  []schemas.Output{review},
			produced: []file{{"review.json", "verdict: pass\n"}},
			want:     schemas.TypeValidationFailed,
			wantErrs: []wantErr{{artifact: "review.json", source: "schema", contains: []string{"not valid JSON"}}},
		},
		{
			name:     "empty report",
			outputs:  []schemas.Output{review},
			produced: []file{{"review.json", ""}},
			want:     schemas.TypeValidationFailed,
			wantErrs: []wantErr{{artifact: "review.json", source: "schema", contains: []string{"not valid JSON"}}},
		},
		{
			name:     "report not UTF-8",
			outputs:  []schemas.Output{review},
			produced: []file{{"review.json", "\"caf\xe9\""}},
			want:     schemas.TypeValidationFailed,
			wantErrs: []wantErr{{artifact: "review.json", source: "schema", contains: []string{"UTF-8"}}},
		},
		{
			name:     "reports together over what a verdict carries",
			outputs:  []schemas.Output{{Name: "a.json", Report: true}, {Name: "b.json", Report: true}, {Name: "c.json", Report: true}},
			produced: []file{{"a.json", jsonOfSize(100 << 10)}, {"b.json", jsonOfSize(100 << 10)}, {"c.json", jsonOfSize(100 << 10)}},
			want:     schemas.TypeValidationFailed,
			wantErrs: []wantErr{{artifact: "c.json", source: "schema", contains: []string{strconv.Itoa(validator.MaxReportsBytes)}}},
		},
		{
			name:     "report failing its schema gives the schema's errors only",
			outputs:  []schemas.Output{summary},
			produced: []file{{"summary.json", `{"title":"t","count":0}`}},
			want:     schemas.TypeValidationFailed,
			wantErrs: []wantErr{{artifact: "summary.json", pointer: "/count", source: "schema", contains: []string{"minimum"}}},
		},
		{
			name:     "valid report, another output failing",
			outputs:  []schemas.Output{review, {Name: "notes.md"}},
			produced: []file{{"review.json", `{"ok":true}`}},
			want:     schemas.TypeValidationFailed,
			wantErrs: []wantErr{{artifact: "notes.md", source: "schema", contains: []string{"not produced"}}},
		},
		{
			name:     "valid report, validate command failing",
			outputs:  []schemas.Output{review},
			produced: []file{{"review.json", `{"ok":true}`}},
			validate: "echo no >&2; exit 3\n",
			want:     schemas.TypeValidationFailed,
			wantErrs: []wantErr{{source: "command", contains: []string{"exited with code 3"}}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b, _ := testnats.Bus(t)
			j := newJob("s1.summary.1", tt.outputs...)
			j.produced = tt.produced
			if tt.validate != "" {
				j.request.Validate = writeScript(t, tt.validate)
			}
			reqSeq := publish(t, b, session, schemas.TypeJobRequested, "summary", j.id, j.request)
			j.complete(t, b, reqSeq)
			startValidator(t, b, t.TempDir())
			// The verdict is read back from the stream: the reports checked
			// are those its readers decode.
			ev, v := waitVerdict(t, b, j.id)
			if ev.Type != tt.want {
				t.Fatalf("verdict %s, want %s: %s", ev.Type, tt.want, mustJSON(t, v))
			}
			if len(v.Reports) != len(tt.wantReports) {
				t.Fatalf("reports %s, want %d", mustJSON(t, v.Reports), len(tt.wantReports))
			}
			for i, w := range tt.wantReports {
				if g := v.Reports[i]; g.Name != w.Name || string(g.Content) != string(w.Content) {
					t.Errorf("report %d = %s %.200s, want %s %.200s", i, g.Name, g.Content, w.Name, w.Content)
				}
			}
			if len(v.Errors) != len(tt.wantErrs) {
				t.Fatalf("verdict errors:\n%s\nwant %d", mustJSON(t, v.Errors), len(tt.wantErrs))
			}
			for i, w := range tt.wantErrs {
				e := v.Errors[i]
				if e.Artifact != w.artifact || e.Pointer != w.pointer || e.Source != w.source {
					t.Errorf("error %d = %+v, want artifact %q pointer %q source %q", i, e, w.artifact, w.pointer, w.source)
				}
				for _, s := range w.contains {
					if !strings.Contains(e.Message, s) {
						t.Errorf("error %d message %q does not contain %q", i, e.Message, s)
					}
				}
			}
			waitAcked(t, b)
		})
	}
}
