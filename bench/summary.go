// Package bench holds loopbus's end-to-end benchmarks (in its _test.go
// files: append, dispatch latency, pipeline throughput, manifest rebuild,
// orchestrator memory, merges, model-API tool calls; see
// docs/PERFORMANCE.md) and Summary, which turns
// their `go test -bench` output into one line.
package bench

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"
)

// ErrFailed: the benchmark output reports a failure.
var ErrFailed = errors.New("benchmarks failed")

// summaryField is one field of the summary line: the benchmark (without
// its -GOMAXPROCS suffix) and the metric unit it comes from, and the
// decimals printed.
type summaryField struct {
	key, bench, unit string
	prec             int
}

// summaryFields are the summary line's fields in order, all default-fsync
// figures (the orchestrator's memory does not depend on the sync mode).
func summaryFields() []summaryField {
	return []summaryField{
		{"append_ratio", "BenchmarkAppend/fsync=default", "append_ratio", 3},
		{"dispatch_p50_ms", "BenchmarkDispatch/fsync=default", "p50_ms", 2},
		{"dispatch_p99_ms", "BenchmarkDispatch/fsync=default", "p99_ms", 2},
		{"dispatch_p50_ms_serve", "BenchmarkDispatch/fsync=default/serve", "p50_ms", 2},
		{"dispatch_p99_ms_serve", "BenchmarkDispatch/fsync=default/serve", "p99_ms", 2},
		{"steps_per_s", "BenchmarkThroughput/fsync=default/workers=4", "steps/s", 0},
		{"limit_ratio", "BenchmarkThroughput/fsync=default/workers=4", "limit_ratio", 3},
		{"cpu_ms_per_step", "BenchmarkThroughput/fsync=default/workers=4", "cpu_ms/step", 2},
		{"raw_cpu_ms_per_step", "BenchmarkThroughput/fsync=default/workers=4", "raw_cpu_ms/step", 2},
		{"steps_per_s_reuse", "BenchmarkThroughput/fsync=default/workers=4/reuse", "steps/s", 0},
		{"limit_ratio_reuse", "BenchmarkThroughput/fsync=default/workers=4/reuse", "limit_ratio", 3},
		{"cpu_ms_per_step_reuse", "BenchmarkThroughput/fsync=default/workers=4/reuse", "cpu_ms/step", 2},
		{"steps_per_s_serve", "BenchmarkThroughput/fsync=default/workers=4/serve", "steps/s", 0},
		{"limit_ratio_serve", "BenchmarkThroughput/fsync=default/workers=4/serve", "limit_ratio", 3},
		{"cpu_ms_per_step_serve", "BenchmarkThroughput/fsync=default/workers=4/serve", "cpu_ms/step", 2},
		{"rebuild_events_per_s", "BenchmarkRebuild/fsync=default", "events/s", 0},
		{"rebuild_ratio", "BenchmarkRebuild/fsync=default", "rebuild_ratio", 3},
		{"pass_to_merge_p50_ms", "BenchmarkMerge/fsync=default", "pass_to_merge_p50_ms", 1},
		{"tool_overhead_us", "BenchmarkToolCall/fsync=default", "overhead_us/call", 0},
		{"orch_live_bytes_per_session", "BenchmarkOrchestratorMemoryLive", "bytes/live_session", 0},
	}
}

// Summary reads the output of `go test -bench` over this package and
// returns "append_ratio=X dispatch_p50_ms=X dispatch_p99_ms=X
// dispatch_p50_ms_serve=X dispatch_p99_ms_serve=X steps_per_s=X
// limit_ratio=X cpu_ms_per_step=X raw_cpu_ms_per_step=X
// steps_per_s_reuse=X limit_ratio_reuse=X cpu_ms_per_step_reuse=X
// steps_per_s_serve=X limit_ratio_serve=X cpu_ms_per_step_serve=X
// rebuild_events_per_s=X rebuild_ratio=X
// pass_to_merge_p50_ms=X tool_overhead_us=X orch_live_bytes_per_session=X"
// from the default-fsync results. It fails, wrapping ErrFailed, if the
// output reports a failure, and names any figure it did not find.
func Summary(r io.Reader) (string, error) {
	procsSuffix := regexp.MustCompile(`-\d+$`)
	metrics := map[string]map[string]float64{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "FAIL") || strings.HasPrefix(strings.TrimSpace(line), "--- FAIL") || strings.HasPrefix(line, "panic:") {
			return "", fmt.Errorf("%w: %s", ErrFailed, strings.TrimSpace(line))
		}
		f := strings.Fields(line)
		if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") || len(f)%2 != 0 {
			continue
		}
		if _, err := strconv.Atoi(f[1]); err != nil {
			continue
		}
		name := procsSuffix.ReplaceAllString(f[0], "")
		m := metrics[name]
		if m == nil {
			m = map[string]float64{}
			metrics[name] = m
		}
		for i := 2; i+1 < len(f); i += 2 {
			if v, err := strconv.ParseFloat(f[i], 64); err == nil {
				m[f[i+1]] = v
			}
		}
	}
	if err := sc.Err(); err != nil {
		return "", err
	}
	var parts, missing []string
	for _, fl := range summaryFields() {
		v, ok := metrics[fl.bench][fl.unit]
		if !ok {
			missing = append(missing, fmt.Sprintf("%s (%s of %s)", fl.key, fl.unit, fl.bench))
			continue
		}
		parts = append(parts, fl.key+"="+strconv.FormatFloat(v, 'f', fl.prec, 64))
	}
	if len(missing) > 0 {
		return "", fmt.Errorf("no figure for %s", strings.Join(missing, ", "))
	}
	return strings.Join(parts, " "), nil
}
