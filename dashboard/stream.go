package dashboard

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/client"
	"github.com/loopbus/loopbus/projections"
	"github.com/loopbus/loopbus/schemas"
	"github.com/loopbus/loopbus/tui"
)

// How often a stream writes: events in batches, so that a thousand events
// a second are ten messages, not a thousand; the manifest less often.
const (
	batchEvery    = 100 * time.Millisecond
	manifestEvery = 250 * time.Millisecond
	updatesEvery  = 500 * time.Millisecond
	// maxChanged bounds the session ids one update names.
	maxChanged = 1000
)

// Row is one event of a session's timeline as the page shows it.
type Row struct {
	Seq  uint64    `json:"seq"`
	Time time.Time `json:"time"`
	// Type is the event type without "loopbus.".
	Type string `json:"type"`
	Step string `json:"step,omitempty"`
	Job  string `json:"job,omitempty"`
	// Text says what the event means, as `loopbus watch` does.
	Text string `json:"text"`
	// Tool is set on tool.started and tool.completed.
	Tool *ToolRow `json:"tool,omitempty"`
}

// ToolRow is a tool call of a job.
type ToolRow struct {
	ID         string `json:"id"`
	Name       string `json:"name"`
	Lane       string `json:"lane,omitempty"`
	Status     string `json:"status,omitempty"`
	DurationMs int64  `json:"durationMs,omitempty"`
}

// Bounds of a row's text: a timeline holds MaxRows of them, whatever the
// events carry.
const (
	maxRowText = 1000
	maxRowName = 200
)

func rowOf(ev schemas.Event, m *projections.Manifest) Row {
	r := Row{Seq: ev.Seq, Time: ev.Time.UTC(), Type: tui.OneLine(strings.TrimPrefix(ev.Type, "loopbus."), maxRowName),
		Step: tui.OneLine(ev.Step, maxRowName), Job: tui.OneLine(ev.Job, maxRowName), Text: tui.OneLine(tui.Describe(ev, m), maxRowText)}
	switch d := ev.Data.(type) {
	case *schemas.ToolStarted:
		r.Tool = &ToolRow{ID: tui.OneLine(d.ToolID, maxRowName), Name: tui.OneLine(d.Name, maxRowName), Lane: tui.OneLine(d.Lane, maxRowName)}
	case *schemas.ToolCompleted:
		r.Tool = &ToolRow{ID: tui.OneLine(d.ToolID, maxRowName), Name: tui.OneLine(d.Name, maxRowName), Lane: tui.OneLine(d.Lane, maxRowName),
			Status: tui.OneLine(d.Status, maxRowName), DurationMs: d.DurationMs}
	}
	return r
}

// timeline is what one session stream has read and not sent yet.
type timeline struct {
	mu   sync.Mutex
	from uint64 // rows at or below it were sent before (Last-Event-ID)
	max  int
	m    *projections.Manifest
	rows []Row
	// dropped counts rows left out since the last batch: the oldest, when
	// more came than max (the page says so).
	dropped int
	dirty   bool
	caught  bool
}

func (t *timeline) add(ev schemas.Event) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.m = projections.FoldManifest(t.m, ev)
	if t.m == nil {
		return
	}
	t.dirty = true
	if ev.Seq <= t.from {
		return
	}
	t.rows = append(t.rows, rowOf(ev, t.m))
	// Trimmed to the newest max only when twice as many wait: a long
	// history costs one copy per max events, not one per event.
	if len(t.rows) >= 2*t.max {
		t.trim()
	}
}

// trim keeps the newest max rows.
func (t *timeline) trim() {
	if n := len(t.rows) - t.max; n > 0 {
		t.rows = append(t.rows[:0:0], t.rows[n:]...)
		t.dropped += n
	}
}

func (t *timeline) caughtUp() {
	t.mu.Lock()
	t.caught = true
	t.mu.Unlock()
}

// take returns what is to be sent: nothing before the history is read,
// then the rows so far, and the manifest (as JSON) when it changed and
// withManifest.
func (t *timeline) take(withManifest bool) (rows []Row, dropped int, manifest []byte, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.caught {
		return nil, 0, nil, nil
	}
	t.trim()
	rows, dropped, t.rows, t.dropped = t.rows, t.dropped, nil, 0
	if withManifest && t.dirty && t.m != nil {
		t.dirty = false
		manifest, err = json.Marshal(t.m)
	}
	return rows, dropped, manifest, err
}

// openStream takes one of the maxStreams places for an event stream, or
// answers 503 when none is free.
func (s *Service) openStream(w http.ResponseWriter) bool {
	select {
	case s.streams <- struct{}{}:
		return true
	default:
		w.Header().Set("Retry-After", "10")
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": fmt.Sprintf("%d event streams are open already; close a dashboard tab", maxStreams)})
		return false
	}
}

func (s *Service) closeStream() { <-s.streams }

// sse writes server-sent events.
type sse struct {
	w http.ResponseWriter
	f http.Flusher
}

func startSSE(w http.ResponseWriter) (*sse, bool) {
	f, ok := w.(http.Flusher)
	if !ok {
		return nil, false
	}
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	f.Flush()
	return &sse{w: w, f: f}, true
}

// fail tells the page why its stream ends, when the read failed while the
// page still listens.
func (s *sse) fail(ctx context.Context, err error) {
	if err == nil || ctx.Err() != nil {
		return
	}
	msg, _ := json.Marshal(map[string]string{"error": err.Error()})
	_ = s.send("error", "", msg)
	s.f.Flush()
}

// send writes one message; data must be one line (JSON is).
func (s *sse) send(event, id string, data []byte) error {
	var b strings.Builder
	if id != "" {
		b.WriteString("id: " + id + "\n")
	}
	b.WriteString("event: " + event + "\ndata: ")
	b.Write(data)
	b.WriteString("\n\n")
	_, err := s.w.Write([]byte(b.String()))
	return err
}

// apiSessionEvents streams a session as server-sent events, first its
// history (its newest MaxRows events), then live:
//
//	event: manifest   data: the session's manifest (when it changed, at most 4 times a second)
//	event: events     data: {"rows": [Row…], "dropped": N} (every 100 ms while events come)
//	event: error      data: {"error": "…"} (the read failed; the stream ends)
//
// Each events message has the last sequence as its id: a browser that
// reconnects sends it back (Last-Event-ID) and is sent only newer events.
func (s *Service) apiSessionEvents(w http.ResponseWriter, r *http.Request) {
	id, err := sessionID(r)
	if err != nil {
		s.apiError(w, err)
		return
	}
	ctx := r.Context()
	if err := client.Exists(ctx, s.c.Bus(), id); err != nil {
		s.apiError(w, err)
		return
	}
	if !s.openStream(w) {
		return
	}
	defer s.closeStream()
	t := &timeline{max: s.cfg.MaxRows}
	if last := r.Header.Get("Last-Event-ID"); last != "" {
		t.from, _ = strconv.ParseUint(last, 10, 64)
	}
	out, ok := startSSE(w)
	if !ok {
		s.apiError(w, errors.New("streaming is not supported by this connection"))
		return
	}
	rctx, stop := context.WithCancel(ctx)
	defer stop()
	readErr := make(chan error, 1)
	go func() {
		readErr <- s.c.Bus().Read(rctx, bus.ReadOptions{Subjects: []string{schemas.SessionSubjects(id)}, Follow: true, OnCaughtUp: t.caughtUp, SkipSchema: true},
			func(ev schemas.Event) error { t.add(ev); return nil })
	}()
	tick := time.NewTicker(batchEvery)
	defer tick.Stop()
	lastManifest := time.Time{}
	for {
		select {
		case <-ctx.Done():
			return
		case err := <-readErr:
			out.fail(ctx, err)
			return
		case now := <-tick.C:
			withManifest := now.Sub(lastManifest) >= manifestEvery
			rows, dropped, manifest, err := t.take(withManifest)
			if err != nil {
				s.log.Warn().Err(err).Msg("dashboard manifest")
			}
			if manifest != nil {
				lastManifest = now
				if out.send("manifest", "", manifest) != nil {
					return
				}
			}
			if len(rows) > 0 || dropped > 0 {
				data, _ := json.Marshal(struct {
					Rows    []Row `json:"rows"`
					Dropped int   `json:"dropped,omitempty"`
				}{rows, dropped})
				lastID := ""
				if len(rows) > 0 {
					lastID = strconv.FormatUint(rows[len(rows)-1].Seq, 10)
				}
				if out.send("events", lastID, data) != nil {
					return
				}
			}
			if manifest != nil || len(rows) > 0 || dropped > 0 {
				out.f.Flush()
			}
		}
	}
}

// apiUpdates streams the ids of sessions that changed, so that the
// sessions page fetches the list again only when something happened:
//
//	event: changed   data: ["session-id", …] (at most twice a second)
func (s *Service) apiUpdates(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	if !s.openStream(w) {
		return
	}
	defer s.closeStream()
	out, ok := startSSE(w)
	if !ok {
		s.apiError(w, errors.New("streaming is not supported by this connection"))
		return
	}
	var mu sync.Mutex
	changed := map[string]bool{}
	rctx, stop := context.WithCancel(ctx)
	defer stop()
	readErr := make(chan error, 1)
	go func() {
		readErr <- s.c.Bus().Read(rctx, bus.ReadOptions{StartTime: s.now(), Follow: true, SkipSchema: true}, func(ev schemas.Event) error {
			mu.Lock()
			if len(changed) < maxChanged {
				changed[ev.Session] = true
			}
			mu.Unlock()
			return nil
		})
	}()
	// A comment first: the page knows the stream is open.
	if _, err := fmt.Fprint(w, ": connected\n\n"); err != nil {
		return
	}
	out.f.Flush()
	tick := time.NewTicker(updatesEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case err := <-readErr:
			out.fail(ctx, err)
			return
		case <-tick.C:
			mu.Lock()
			ids := make([]string, 0, len(changed))
			for id := range changed {
				ids = append(ids, id)
			}
			clear(changed)
			mu.Unlock()
			if len(ids) == 0 {
				continue
			}
			data, _ := json.Marshal(ids)
			if out.send("changed", "", data) != nil {
				return
			}
			out.f.Flush()
		}
	}
}

// Bounds of GET .../rows.
const (
	defaultEarlierRows = 500
	maxEarlierRows     = 2000
)

// rowsAnswer is GET /api/sessions/{id}/rows: the rows of a session's
// timeline before a stream sequence, and whether older ones are left.
type rowsAnswer struct {
	Rows []Row `json:"rows"`
	More bool  `json:"more"`
}

// apiRows answers the newest rows of the session's timeline before
// ?before=SEQ (default: all), at most ?limit=N (default 500, at most
// 2000), oldest first: what a session page left out when it connected
// (it is sent the newest MaxRows) and asks for on demand. It reads the
// session's history up to SEQ.
func (s *Service) apiRows(w http.ResponseWriter, r *http.Request) {
	id, err := sessionID(r)
	if err != nil {
		s.apiError(w, err)
		return
	}
	q := r.URL.Query()
	before := uint64(math.MaxUint64)
	if b := q.Get("before"); b != "" {
		if before, err = strconv.ParseUint(b, 10, 64); err != nil || before == 0 {
			s.apiError(w, fmt.Errorf("%w: before %q: want a stream sequence", client.ErrBadInput, b))
			return
		}
	}
	limit := defaultEarlierRows
	if l := q.Get("limit"); l != "" {
		if limit, err = strconv.Atoi(l); err != nil || limit < 1 || limit > maxEarlierRows {
			s.apiError(w, fmt.Errorf("%w: limit %q: want 1 to %d", client.ErrBadInput, l, maxEarlierRows))
			return
		}
	}
	ctx := r.Context()
	if err := client.Exists(ctx, s.c.Bus(), id); err != nil {
		s.apiError(w, err)
		return
	}
	var m *projections.Manifest
	// ring holds the newest limit rows; once full, start is its oldest.
	ring := make([]Row, 0, min(limit, 64))
	start, more := 0, false
	err = s.c.Bus().Read(ctx, bus.ReadOptions{Subjects: []string{schemas.SessionSubjects(id)}, SkipSchema: true}, func(ev schemas.Event) error {
		if ev.Seq >= before {
			return bus.ErrStop
		}
		if m = projections.FoldManifest(m, ev); m == nil {
			return nil
		}
		if len(ring) < limit {
			ring = append(ring, rowOf(ev, m))
			return nil
		}
		ring[start] = rowOf(ev, m)
		start = (start + 1) % limit
		more = true
		return nil
	})
	if err != nil {
		s.apiError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, rowsAnswer{Rows: slices.Concat(ring[start:], ring[:start]), More: more})
}
