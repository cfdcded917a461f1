package projections

import (
	"encoding/binary"
	"encoding/json"
	"math"
	"reflect"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/loopbus/loopbus/schemas"
)

// fuzzType is an event type and a constructor of its registered data (nil:
// the type carries no data).
type fuzzType struct {
	typ     string
	newData func() any
}

// fuzzTypes are the event types a fuzz input can pick.
var fuzzTypes = []fuzzType{
	{schemas.TypeSessionStarted, func() any { return new(schemas.SessionStarted) }},
	{schemas.TypeSessionCompleted, func() any { return new(schemas.SessionCompleted) }},
	{schemas.TypeSessionFailed, func() any { return new(schemas.SessionFailed) }},
	{schemas.TypeJobRequested, func() any { return new(schemas.JobRequested) }},
	{schemas.TypeJobStarted, func() any { return new(schemas.JobStarted) }},
	{schemas.TypeJobCompleted, func() any { return new(schemas.JobCompleted) }},
	{schemas.TypeJobFailed, func() any { return new(schemas.JobFailed) }},
	{schemas.TypeToolStarted, func() any { return new(schemas.ToolStarted) }},
	{schemas.TypeToolCompleted, func() any { return new(schemas.ToolCompleted) }},
	{schemas.TypeArtifactStored, func() any { return new(schemas.ArtifactStored) }},
	{schemas.TypeValidationPassed, func() any { return new(schemas.Verdict) }},
	{schemas.TypeValidationFailed, func() any { return new(schemas.Verdict) }},
	{schemas.TypeStepCompleted, func() any { return new(schemas.StepCompleted) }},
	{schemas.TypeStepFailed, func() any { return new(schemas.StepFailed) }},
	{schemas.TypeSessionPaused, func() any { return new(schemas.SessionPaused) }},
	{schemas.TypeSessionStopped, func() any { return new(schemas.SessionStopped) }},
	{schemas.TypeSessionResumed, func() any { return new(schemas.SessionResumed) }},
	{schemas.TypeJobCancelled, func() any { return new(schemas.JobCancelled) }},
	{schemas.TypeStepWaiting, func() any { return new(schemas.StepWaiting) }},
	{schemas.TypeStepPaused, func() any { return new(schemas.StepPaused) }},
	{schemas.TypeStepResumed, func() any { return new(schemas.StepResumed) }},
	{schemas.TypeStepInvalidated, func() any { return new(schemas.StepInvalidated) }},
	{schemas.TypeSignalStop, func() any { return new(schemas.Signal) }},
	{schemas.TypeSignalInfo, func() any { return new(schemas.Signal) }},
	{schemas.TypeSignalAcknowledged, func() any { return new(schemas.SignalAcknowledged) }},
	{"loopbus.session.snoozed", nil},
	{schemas.TypeLoopSpawned, func() any { return new(schemas.LoopSpawned) }},
	{schemas.TypeLoopMerged, func() any { return new(schemas.LoopMerged) }},
	{schemas.TypeLoopRebase, func() any { return new(schemas.LoopRebase) }},
	{schemas.TypeLoopInvalidated, func() any { return new(schemas.LoopInvalidated) }},
}

var fuzzSessions = []string{sessionID, otherSession, ""}
var fuzzSteps = []string{"", "summary", "ideas", "writing-kit", "publish", "plan", "plan-001", "plan-001-001", "plan-001-002"}

// fuzzReader consumes fuzz bytes; reads past the end yield zeros.
type fuzzReader struct{ b []byte }

func (r *fuzzReader) byte() byte {
	if len(r.b) == 0 {
		return 0
	}
	c := r.b[0]
	r.b = r.b[1:]
	return c
}

func (r *fuzzReader) bytes(n int) []byte {
	n = min(n, len(r.b))
	out := r.b[:n]
	r.b = r.b[n:]
	return out
}

// Event encoding, 7 header bytes then the JSON data:
//
//	type, session, step, data form, seq (2 bytes big endian), data length,
//	data.
//
// The data form byte selects the Go value: 0 the registered pointer, 1 the
// plain struct, 2 nil, 3 data of another type. Data that does not
// unmarshal is left partly or wholly zero.
func decodeEvents(data []byte) []schemas.Event {
	r := &fuzzReader{b: data}
	var evs []schemas.Event
	for len(r.b) > 0 && len(evs) < 256 {
		ft := fuzzTypes[int(r.byte())%len(fuzzTypes)]
		session := fuzzSessions[int(r.byte())%len(fuzzSessions)]
		step := fuzzSteps[int(r.byte())%len(fuzzSteps)]
		form := r.byte() % 4
		seq := uint64(binary.BigEndian.Uint16([]byte{r.byte(), r.byte()}))
		raw := r.bytes(int(r.byte()) * 4)
		var d any
		if ft.newData != nil {
			v := ft.newData()
			_ = json.Unmarshal(raw, v) // errors ignored: partial data is fine
			switch form {
			case 1:
				d = reflect.ValueOf(v).Elem().Interface()
			case 2:
				d = nil
			case 3:
				d = &schemas.ToolStarted{}
			default:
				d = v
			}
		}
		evs = append(evs, schemas.Event{
			ID: strconv.FormatUint(seq, 10), Type: ft.typ, Session: session, Step: step,
			Time: t0.Add(time.Duration(seq) * time.Second), Seq: seq, Data: d,
		})
	}
	return evs
}

// encodeEvents is the inverse of decodeEvents, for seeds (sequences are
// taken modulo 2^16). To keep seeds small, which keeps the fuzzer's
// minimization of interesting inputs quick, the data keeps only the fields
// the fold reads and job ids become short aliases.
func encodeEvents(evs []schemas.Event) []byte {
	jobs := map[string]string{}
	job := func(id string) string {
		if id == "" {
			return ""
		}
		if _, ok := jobs[id]; !ok {
			jobs[id] = "j" + strconv.Itoa(len(jobs)+1)
		}
		return jobs[id]
	}
	// Event ids become the decoded ids: the sequence.
	ids := map[string]string{}
	sig := func(id string) string { return ids[id] }
	var out []byte
	for _, ev := range evs {
		ids[ev.ID] = strconv.FormatUint(uint64(uint16(ev.Seq)), 10)
		ti := max(0, slices.IndexFunc(fuzzTypes, func(ft fuzzType) bool { return ft.typ == ev.Type }))
		si := max(0, slices.Index(fuzzSessions, ev.Session))
		pi := max(0, slices.Index(fuzzSteps, ev.Step))
		raw, _ := json.Marshal(compactData(ev.Data, job, sig))
		// Pad to a multiple of 4 with spaces, which JSON ignores.
		for len(raw)%4 != 0 {
			raw = append(raw, ' ')
		}
		if len(raw) > 255*4 {
			raw = []byte("{}  ")
		}
		out = append(out, byte(ti), byte(si), byte(pi), 0)
		out = binary.BigEndian.AppendUint16(out, uint16(ev.Seq))
		out = append(out, byte(len(raw)/4))
		out = append(out, raw...)
	}
	return out
}

// compactData returns the members of d that the fold reads, as JSON the
// registered type decodes; job maps job ids to their aliases, sig event
// ids to the decoded ones.
func compactData(d any, job, sig func(string) string) any {
	type obj = map[string]any
	arts := func(as []schemas.ArtifactRef) []obj {
		var out []obj
		for _, a := range as {
			out = append(out, obj{"name": a.Name, "digest": a.Digest[:15]})
		}
		return out
	}
	switch d := d.(type) {
	case *schemas.SessionStarted:
		var steps []obj
		for _, st := range d.Pipeline.Steps {
			steps = append(steps, obj{"name": st.Name, "requires": st.Requires, "final": st.Final})
		}
		p := obj{"name": d.Pipeline.Name, "steps": steps}
		out := obj{"pipeline": p, "input": obj{"name": d.Input.Name}, "sourceHash": d.SourceHash}
		if l := d.Pipeline.Loops; l != nil {
			var levels []obj
			for _, lv := range l.Levels {
				levels = append(levels, obj{"name": lv.Name, "maxIterations": lv.MaxIterations, "worktree": lv.Worktree})
			}
			p["kind"], p["loops"] = d.Pipeline.Kind, obj{"levels": levels}
		}
		if st := d.Loops; st != nil {
			out["loops"] = obj{"task": st.Task[:min(len(st.Task), 20)], "baseCommit": st.BaseCommit[:min(len(st.BaseCommit), 8)], "target": st.Target}
		}
		return out
	case *schemas.JobRequested:
		out := obj{"jobId": job(d.JobID), "step": d.Step, "iteration": d.Iteration, "round": d.Round, "hints": d.Hints}
		if d.Worktree != nil && d.Worktree.Merge {
			out["worktree"] = obj{"merge": true}
		}
		return out
	case *schemas.JobCompleted:
		out := obj{"jobId": job(d.JobID), "step": d.Step, "usage": d.Usage}
		if g := d.Git; g != nil {
			out["git"] = obj{"commit": g.Commit[:min(len(g.Commit), 8)], "changed": g.Changed}
		}
		return out
	case *schemas.LoopSpawned:
		return obj{"loop": d.Loop, "parent": d.Parent, "level": d.Level, "generation": d.Generation}
	case *schemas.LoopMerged:
		return obj{"loop": d.Loop, "head": d.Head[:min(len(d.Head), 8)], "bundle": obj{"object": d.Bundle.Object}}
	case *schemas.LoopRebase:
		return obj{"loop": d.Loop, "conflict": d.Conflict}
	case *schemas.LoopInvalidated:
		return obj{"loop": d.Loop}
	case *schemas.JobCancelled:
		return obj{"jobId": job(d.JobID), "step": d.Step, "iteration": d.Iteration, "reason": d.Reason}
	case *schemas.StepWaiting:
		return obj{"step": d.Step, "jobId": job(d.JobID), "until": d.Until, "reason": d.Reason}
	case *schemas.StepPaused:
		return obj{"step": d.Step, "kind": d.Kind, "reason": d.Reason}
	case *schemas.StepResumed:
		return obj{"step": d.Step}
	case *schemas.StepInvalidated:
		return obj{"step": d.Step, "cause": d.Cause}
	case *schemas.SessionStopped:
		return obj{"kind": d.Kind, "reason": d.Reason}
	case *schemas.Signal:
		return obj{"step": d.Step, "reason": d.Reason, "message": d.Message}
	case *schemas.SignalAcknowledged:
		return obj{"signalId": sig(d.SignalID), "signal": d.Signal, "result": d.Result}
	case *schemas.JobStarted:
		return obj{"jobId": job(d.JobID), "worker": d.Worker}
	case *schemas.JobFailed:
		return obj{"jobId": job(d.JobID), "error": d.Error[:min(len(d.Error), 40)], "exitCode": d.ExitCode, "usage": d.Usage, "cancelled": d.Cancelled}
	case *schemas.Verdict:
		if len(d.Errors) == 0 {
			return obj{"jobId": job(d.JobID)}
		}
		return obj{"jobId": job(d.JobID), "errors": d.Errors[:1], "retryHint": "fix"}
	case *schemas.StepCompleted:
		return obj{"step": d.Step, "jobId": job(d.JobID), "iterations": d.Iterations, "artifacts": arts(d.Artifacts), "contentHash": d.ContentHash}
	case *schemas.StepFailed:
		return obj{"step": d.Step, "iterations": d.Iterations, "error": d.Error}
	case *schemas.SessionCompleted:
		return obj{"final": arts(d.Final)}
	case *schemas.SessionFailed:
		return obj{"step": d.Step, "reason": d.Reason}
	}
	return obj{}
}

// FuzzFoldManifest folds event sequences decoded from fuzz bytes and checks
// that the fold never panics, never replaces a live manifest, never lowers
// LastSeq, keeps Steps and StepOrder in step and bounds feedback; and that
// Clone, json.Marshal and a second fold agree. Minimizing a new input can
// take the whole default minute, so run it with a short minimize time:
//
//	go test -run '^$' -fuzz FuzzFoldManifest -fuzzminimizetime 3s ./projections
func FuzzFoldManifest(f *testing.F) {
	for _, tc := range goldenCases {
		f.Add(encodeEvents(tc.events()))
	}
	f.Add([]byte{})
	f.Add([]byte{0, 0, 1, 2, 0, 1, 0, 3, 1, 0, 0, 0, 0, 0})
	f.Add(encodeEvents([]schemas.Event{
		{Type: schemas.TypeSessionStarted, Session: sessionID, Seq: 9, Data: &schemas.SessionStarted{
			Pipeline: schemas.Pipeline{Steps: []schemas.Step{{Name: "summary"}, {Name: "summary"}, {Name: ""}}}}},
		{Type: schemas.TypeJobRequested, Session: sessionID, Seq: 0, Data: &schemas.JobRequested{Step: "summary"}},
		{Type: schemas.TypeJobFailed, Session: sessionID, Seq: 3, Data: &schemas.JobFailed{}},
		{Type: schemas.TypeStepCompleted, Session: sessionID, Seq: 10, Data: &schemas.StepCompleted{Step: "summary", Iterations: -4}},
	}))

	f.Fuzz(func(t *testing.T, data []byte) {
		evs := decodeEvents(data)
		var m *Manifest
		for i, ev := range evs {
			var before uint64
			if m != nil {
				before = m.LastSeq
			}
			next := FoldManifest(m, ev)
			if m != nil && next != m {
				t.Fatalf("event %d: FoldManifest replaced a non-nil manifest", i)
			}
			if m != nil && next.LastSeq < before {
				t.Fatalf("event %d: LastSeq went from %d to %d", i, before, next.LastSeq)
			}
			m = next
			if m == nil {
				continue
			}
			if len(m.Steps) != len(m.StepOrder) {
				t.Fatalf("event %d: %d steps but stepOrder %v", i, len(m.Steps), m.StepOrder)
			}
			for _, name := range m.StepOrder {
				sv := m.Steps[name]
				if sv == nil {
					t.Fatalf("event %d: step %q of stepOrder has no view", i, name)
				}
				if len(sv.LastFeedback) > MaxFeedbackBytes {
					t.Fatalf("event %d: feedback of %d bytes", i, len(sv.LastFeedback))
				}
				if len(sv.Hints) > MaxHints {
					t.Fatalf("event %d: %d hints kept", i, len(sv.Hints))
				}
				if !slices.Contains(stepStatuses, sv.Status) {
					t.Fatalf("event %d: step %s has status %q", i, name, sv.Status)
				}
			}
			if len(m.Signals) > MaxSignals {
				t.Fatalf("event %d: %d signals kept", i, len(m.Signals))
			}
			if !slices.Contains(sessionStatuses, m.Status) || (m.Hold != nil) != (m.Status == StatusPaused || m.Status == StatusStopped) {
				t.Fatalf("event %d: status %q with hold %+v", i, m.Status, m.Hold)
			}
			checkUsageSums(t, i, m)
		}
		if m == nil {
			return
		}
		if c := m.Clone(); !reflect.DeepEqual(c, m) {
			t.Fatal("Clone differs from the manifest")
		}
		if _, err := json.Marshal(m); err != nil {
			t.Fatalf("marshal: %v", err)
		}
		// Folding the same events again from scratch gives the same result.
		if again := foldAll(evs); !reflect.DeepEqual(again, m) {
			t.Fatal("the fold is not deterministic")
		}
		// So does folding on from the first half's view stored as JSON,
		// as the projector does.
		half := foldAll(evs[:len(evs)/2])
		if half != nil {
			b, err := json.Marshal(half)
			if err != nil {
				t.Fatalf("marshal: %v", err)
			}
			var stored *Manifest
			if err := json.Unmarshal(b, &stored); err != nil {
				t.Fatalf("unmarshal: %v", err)
			}
			for _, ev := range evs[len(evs)/2:] {
				stored = FoldManifest(stored, ev)
			}
			got, _ := json.Marshal(stored)
			want, _ := json.Marshal(m)
			if string(got) != string(want) {
				t.Fatalf("folding on from a stored view differs:\n%s\nwant\n%s", got, want)
			}
		}
	})
}

var (
	sessionStatuses = []string{StatusRunning, StatusPaused, StatusStopped, StatusCompleted, StatusFailed}
	stepStatuses    = []string{StepStatusPending, StepStatusInProgress, StepStatusCompleted, StepStatusFailed,
		StepStatusPaused, StepStatusStopped, StepStatusBreaker, StepStatusWaiting}
)

// checkUsageSums checks that the session's and each step's token counts are
// the sums of their jobs' and that costs agree to a millionth of a dollar
// (the sums are rounded).
func checkUsageSums(t *testing.T, i int, m *Manifest) {
	t.Helper()
	var total schemas.Usage
	steps := map[string]*schemas.Usage{}
	for _, j := range m.Jobs {
		if j == nil || j.Usage == nil {
			continue
		}
		total.InputTokens += j.Usage.InputTokens
		total.OutputTokens += j.Usage.OutputTokens
		total.CostUSD += j.Usage.CostUSD
		s := steps[j.Step]
		if s == nil {
			s = &schemas.Usage{}
			steps[j.Step] = s
		}
		s.InputTokens += j.Usage.InputTokens
		s.OutputTokens += j.Usage.OutputTokens
		s.CostUSD += j.Usage.CostUSD
	}
	same := func(got *schemas.Usage, want schemas.Usage) bool {
		var g schemas.Usage
		if got != nil {
			g = *got
		}
		return g.InputTokens == want.InputTokens && g.OutputTokens == want.OutputTokens &&
			math.Abs(g.CostUSD-want.CostUSD) <= 1e-6*max(1, math.Abs(want.CostUSD))
	}
	if !same(m.Usage, total) {
		t.Fatalf("event %d: session usage %+v, jobs sum to %+v", i, m.Usage, total)
	}
	for name, sv := range m.Steps {
		var want schemas.Usage
		if s := steps[name]; s != nil {
			want = *s
		}
		if !same(sv.Usage, want) {
			t.Fatalf("event %d: step %s usage %+v, its jobs sum to %+v", i, name, sv.Usage, want)
		}
	}
}
