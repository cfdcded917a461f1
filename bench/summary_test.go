package bench

import (
	"errors"
	"strings"
	"testing"
)

const sampleOutput = `goos: linux
goarch: amd64
pkg: github.com/loopbus/loopbus/bench
BenchmarkAppend/fsync=always-2         	       1	         0.9182 append_ratio	    404750 bus_ns/event	    371638 raw_ns/event
BenchmarkAppend/fsync=default-2        	       1	         0.5207 append_ratio	     42659 bus_ns/event	     22213 raw_ns/event
BenchmarkDispatch/fsync=default-2        	       1	         2.028 orch_p50_ms	         6.341 orch_p99_ms	         2.997 p50_ms	         7.462 p99_ms	        80.00 samples
BenchmarkDispatch/fsync=default/serve-2  	       1	         1.528 orch_p50_ms	         4.341 orch_p99_ms	         1.997 p50_ms	         5.462 p99_ms	        80.00 samples
BenchmarkThroughput/fsync=default/workers=1-2        	       1	        55.89 steps/s
BenchmarkThroughput/fsync=default/workers=4-2        	       1	       133.5 steps/s	      11.44 cpu_ms/step	       0.1234 limit_ratio	      1.846 raw_cpu_ms/step	      1082 raw_steps/s
BenchmarkThroughput/fsync=default/workers=4/reuse-2  	       1	       150.7 steps/s	      10.21 cpu_ms/step	       0.1391 limit_ratio	      1082 raw_steps/s
BenchmarkThroughput/fsync=default/workers=4/serve-2  	       1	       171.2 steps/s	      8.873 cpu_ms/step	       0.1582 limit_ratio	      1082 raw_steps/s
BenchmarkRebuild/fsync=default-2         	       1	      8681 events/s	      4771 projector_events/s	    105173 raw_events/s	         0.08254 rebuild_ratio
BenchmarkMerge/fsync=default-2         	       1	       133.0 pass_to_merge_p50_ms	       141.8 pass_to_merge_p99_ms	        12.00 samples
BenchmarkToolCall/fsync=default-2         	       1	       647.7 direct_us/call	       188.3 overhead_us/call	       836.0 worker_us/call
BenchmarkOrchestratorMemory-2       	       1	  19636000 bytes/10k_sessions	      1964 bytes/session
BenchmarkOrchestratorMemoryLive-2   	       1	       246.2 MB/100k_live	      2462 bytes/live_session	     10000 live_sessions_folded
PASS
ok  	github.com/loopbus/loopbus/bench	13.472s
`

func TestSummary(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    string
		wantErr string
		failed  bool
	}{
		{
			name: "default-fsync figures in order",
			in:   sampleOutput,
			want: "append_ratio=0.521 dispatch_p50_ms=3.00 dispatch_p99_ms=7.46 dispatch_p50_ms_serve=2.00 dispatch_p99_ms_serve=5.46 steps_per_s=134 limit_ratio=0.123 cpu_ms_per_step=11.44 raw_cpu_ms_per_step=1.85 steps_per_s_reuse=151 limit_ratio_reuse=0.139 cpu_ms_per_step_reuse=10.21 steps_per_s_serve=171 limit_ratio_serve=0.158 cpu_ms_per_step_serve=8.87 rebuild_events_per_s=8681 rebuild_ratio=0.083 pass_to_merge_p50_ms=133.0 tool_overhead_us=188 orch_live_bytes_per_session=2462",
		},
		{
			name:    "a missing benchmark is named",
			in:      strings.ReplaceAll(sampleOutput, "BenchmarkRebuild/", "BenchmarkOther/"),
			wantErr: "rebuild_events_per_s (events/s of BenchmarkRebuild/fsync=default), rebuild_ratio",
		},
		{
			name:    "fsync=always figures are not used",
			in:      strings.ReplaceAll(sampleOutput, "BenchmarkAppend/fsync=default-2", "BenchmarkAppend/fsync=other-2"),
			wantErr: "append_ratio (append_ratio of BenchmarkAppend/fsync=default)",
		},
		{
			name:    "a failed benchmark fails the summary",
			in:      sampleOutput + "--- FAIL: BenchmarkRebuild/fsync=default\nFAIL\n",
			wantErr: "--- FAIL: BenchmarkRebuild",
			failed:  true,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Summary(strings.NewReader(tt.in))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Summary() error = %v, want one containing %q", err, tt.wantErr)
				}
				if errors.Is(err, ErrFailed) != tt.failed {
					t.Fatalf("errors.Is(%v, ErrFailed) = %v, want %v", err, !tt.failed, tt.failed)
				}
				return
			}
			if err != nil {
				t.Fatalf("Summary() error = %v", err)
			}
			if got != tt.want {
				t.Fatalf("Summary() = %q, want %q", got, tt.want)
			}
		})
	}
}
