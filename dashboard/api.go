package dashboard

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/client"
	"github.com/loopbus/loopbus/projections"
	"github.com/loopbus/loopbus/schemas"
)

// Bounds of what one request may ask for.
const (
	maxListed      = 1000
	defaultListed  = 200
	maxDeadLetters = 500
	maxSignalBody  = 64 << 10
	// signalWait is how long a button waits for the orchestrator's answer.
	signalWait = 5 * time.Second
)

// writeJSON answers v as JSON.
func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

// apiError answers err as {"error": "..."} with the status it maps to.
func (s *Service) apiError(w http.ResponseWriter, err error) {
	status := statusOf(err)
	if status == http.StatusInternalServerError {
		s.log.Warn().Err(err).Msg("dashboard API")
	}
	writeJSON(w, status, map[string]string{"error": err.Error()})
}

// sessionID is the request's session id, checked.
func sessionID(r *http.Request) (string, error) {
	id := r.PathValue("id")
	if err := schemas.ValidateSessionID(id); err != nil {
		return "", fmt.Errorf("%w: %v", client.ErrBadInput, err)
	}
	return id, nil
}

// apiSessions lists sessions, newest first: ?status=running,paused
// &pipeline=NAME &age=24h &limit=N (default 200, at most 1000).
func (s *Service) apiSessions(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	f := client.SessionFilter{Pipeline: q.Get("pipeline"), Limit: defaultListed}
	if st := q.Get("status"); st != "" {
		f.Status = strings.Split(st, ",")
	}
	if a := q.Get("age"); a != "" {
		d, err := time.ParseDuration(a)
		if err != nil {
			s.apiError(w, fmt.Errorf("%w: age %q: want a duration such as 90m or 24h", client.ErrBadInput, a))
			return
		}
		f.MaxAge = d
	}
	if l := q.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 || n > maxListed {
			s.apiError(w, fmt.Errorf("%w: limit %q: want 1 to %d", client.ErrBadInput, l, maxListed))
			return
		}
		f.Limit = n
	}
	list, err := client.Sessions(r.Context(), s.c.Bus(), f, s.now())
	if err != nil {
		s.apiError(w, err)
		return
	}
	if list == nil {
		list = []client.SessionSummary{}
	}
	writeJSON(w, http.StatusOK, list)
}

// sessionAPI answers, as JSON, what get returns for the request's
// session: its manifest (client.Status) or task list (client.Tasks).
func sessionAPI[T any](s *Service, get func(ctx context.Context, id string) (T, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		id, err := sessionID(r)
		if err != nil {
			s.apiError(w, err)
			return
		}
		v, err := get(r.Context(), id)
		if err != nil {
			s.apiError(w, err)
			return
		}
		writeJSON(w, http.StatusOK, v)
	}
}

// forks answers the forks of a session (the sessions forked from it, with
// their fork points, oldest first; [] when none), for the session page's
// tree: its origin is in its manifest (forkedFrom), its children here.
func (s *Service) forks(ctx context.Context, id string) ([]client.ForkRef, error) {
	if _, err := s.c.Status(ctx, id); err != nil {
		return nil, err
	}
	f, err := s.c.Forks(ctx, id)
	if f == nil {
		f = []client.ForkRef{}
	}
	return f, err
}

// apiArtifact answers one artifact of a session: ?object=OBJECT (as the
// manifest names it), as a download, or with &view=1 as plain text. Only
// artifacts the session's manifest names are served, and never as a page
// the browser would run.
func (s *Service) apiArtifact(w http.ResponseWriter, r *http.Request) {
	id, err := sessionID(r)
	if err != nil {
		s.apiError(w, err)
		return
	}
	m, err := s.c.Status(r.Context(), id)
	if err != nil {
		s.apiError(w, err)
		return
	}
	ref, ok := artifactOf(m, r.URL.Query().Get("object"))
	if !ok {
		s.apiError(w, fmt.Errorf("%w: session %s has no artifact %q", bus.ErrNotFound, id, r.URL.Query().Get("object")))
		return
	}
	out := &artifactWriter{w: w, start: func(h http.Header) {
		if r.URL.Query().Get("view") != "" {
			h.Set("Content-Type", "text/plain; charset=utf-8")
		} else {
			h.Set("Content-Type", "application/octet-stream")
			h.Set("Content-Disposition", mime.FormatMediaType("attachment", map[string]string{"filename": ref.Name}))
		}
		h.Set("Content-Security-Policy", "default-src 'none'; sandbox")
		h.Set("Content-Length", strconv.FormatInt(ref.Size, 10))
	}}
	err = s.c.Bus().GetArtifact(r.Context(), ref, out)
	switch {
	case err != nil && !out.started:
		if errors.Is(err, bus.ErrDigestMismatch) {
			err = fmt.Errorf("%w (the stored bytes do not match the artifact's digest)", err)
		}
		s.apiError(w, err)
	case err != nil:
		// The headers are gone: the cut-short body (against its
		// Content-Length) tells the browser.
		s.log.Warn().Err(err).Str("object", ref.Object).Msg("dashboard artifact")
	case !out.started:
		out.start(w.Header()) // an empty artifact
		w.WriteHeader(http.StatusOK)
	}
}

// artifactWriter sets an artifact's headers on its first bytes, so that
// an artifact that cannot be read is answered with an error, not an empty
// download.
type artifactWriter struct {
	w       http.ResponseWriter
	start   func(http.Header)
	started bool
}

func (a *artifactWriter) Write(p []byte) (int, error) {
	if !a.started {
		a.started = true
		a.start(a.w.Header())
		a.w.WriteHeader(http.StatusOK)
	}
	return a.w.Write(p)
}

// artifactOf finds the artifact named object among m's: the input, the
// final artifacts and every step's.
func artifactOf(m *projections.Manifest, object string) (schemas.ArtifactRef, bool) {
	if object == "" {
		return schemas.ArtifactRef{}, false
	}
	if m.Input != nil && m.Input.Object == object {
		return *m.Input, true
	}
	for _, a := range m.Final {
		if a.Object == object {
			return a, true
		}
	}
	for _, st := range m.Steps {
		for _, a := range st.Artifacts {
			if a.Object == object {
				return a, true
			}
		}
	}
	return schemas.ArtifactRef{}, false
}

// signalBody is what the page's buttons post.
type signalBody struct {
	Verb    string `json:"verb"`
	Step    string `json:"step,omitempty"`
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
}

// apiSignal sends a signal to the session (or one of its steps), as
// `loopbus signal` does, and answers what became of it: applied or
// ignored by the orchestrator, or recorded when it did not answer within
// a few seconds.
func (s *Service) apiSignal(w http.ResponseWriter, r *http.Request) {
	var body signalBody
	id, err := sessionBody(w, r, "signal", &body)
	if err != nil {
		s.apiError(w, err)
		return
	}
	req := client.SignalRequest{Verb: body.Verb, Target: client.SignalTarget{Session: id, Step: body.Step}, Reason: body.Reason, Message: body.Message}
	if body.Verb == "approve" || body.Verb == "reject" {
		req.By = "dashboard" // approvals name who gave them
	}
	if body.Step != "" {
		if err := schemas.ValidateStepName(body.Step); err != nil {
			s.apiError(w, fmt.Errorf("%w: step: %v", client.ErrBadInput, err))
			return
		}
	}
	// Signal checks that the session and step exist (ErrNoSession: 404).
	sent, acks, err := s.c.Signal(r.Context(), req, signalWait)
	if err != nil && !errors.Is(err, context.DeadlineExceeded) {
		s.apiError(w, err)
		return
	}
	out := make([]client.SignalResult, 0, len(sent))
	for _, sg := range sent {
		out = append(out, client.ResultOf(sg, body.Verb, acks[sg.Event.ID], "no orchestrator answered within "+signalWait.String()))
	}
	writeJSON(w, http.StatusOK, out)
}

// sessionBody returns the session id of the request's path and decodes
// its JSON body (what names it in errors) into v: it must be
// application/json (a cross-site form cannot send JSON without asking
// first, CORS), at most maxSignalBody bytes, with no field v does not
// have. Errors of the body wrap client.ErrBadInput.
func sessionBody(w http.ResponseWriter, r *http.Request, what string, v any) (string, error) {
	id, err := sessionID(r)
	if err != nil {
		return "", err
	}
	if ct, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); ct != "application/json" {
		return "", fmt.Errorf("%w: send the %s as application/json", client.ErrBadInput, what)
	}
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxSignalBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return "", fmt.Errorf("%w: %s: %v", client.ErrBadInput, what, err)
	}
	return id, nil
}

// budgetBody is what the page's budget form posts: each bound given (not
// zero) replaces the session's, as loopbus budget's flags do.
type budgetBody struct {
	MaxCostUSD    float64 `json:"maxCostUsd,omitempty"`
	MaxTokens     int64   `json:"maxTokens,omitempty"`
	MaxIterations int     `json:"maxIterations,omitempty"`
	Reason        string  `json:"reason,omitempty"`
}

// closeBody is what the page's close button posts.
type closeBody struct {
	Reason string `json:"reason,omitempty"`
}

// controlAnswer is what budget and close answer: the event written, as
// loopbus budget --json and loopbus close --json print it.
type controlAnswer struct {
	Session string `json:"session"`
	ID      string `json:"id"`
	Type    string `json:"type"`
	Seq     uint64 `json:"seq"`
}

// apiBudget sets the session's budget (client.SetBudget, as loopbus budget
// does): a session its budget stopped goes on when the new bounds allow.
// A session that ended is refused (409).
func (s *Service) apiBudget(w http.ResponseWriter, r *http.Request) {
	var body budgetBody
	id, err := sessionBody(w, r, "budget", &body)
	if err != nil {
		s.apiError(w, err)
		return
	}
	p, err := s.c.SetBudget(r.Context(), id, schemas.Budget{MaxCostUSD: body.MaxCostUSD, MaxTokens: body.MaxTokens, MaxIterations: body.MaxIterations}, body.Reason)
	if err != nil {
		s.apiError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, controlAnswer{Session: id, ID: p.Event.ID, Type: p.Event.Type, Seq: p.Seq})
}

// apiClose closes the session for good (client.CloseSession, as loopbus
// close does). A session that ended is refused (409).
func (s *Service) apiClose(w http.ResponseWriter, r *http.Request) {
	var body closeBody
	id, err := sessionBody(w, r, "close", &body)
	if err != nil {
		s.apiError(w, err)
		return
	}
	p, err := s.c.CloseSession(r.Context(), id, body.Reason)
	if err != nil {
		s.apiError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, controlAnswer{Session: id, ID: p.Event.ID, Type: p.Event.Type, Seq: p.Seq})
}

// waitingAnswer is GET /api/sessions/{id}/waiting: the session's jobs
// requested and not started, each with why it may wait (client.LaneWait:
// "no worker for lane heavy"), as loopbus status prints them.
type waitingAnswer struct {
	Waiting []client.LaneWait `json:"waiting"`
	// Note says why nothing can be said of workers, when presence is off.
	Note string `json:"note,omitempty"`
}

// apiWaiting answers the session's jobs that wait for a worker.
func (s *Service) apiWaiting(w http.ResponseWriter, r *http.Request) {
	id, err := sessionID(r)
	if err != nil {
		s.apiError(w, err)
		return
	}
	m, err := s.c.Status(r.Context(), id)
	if err != nil {
		s.apiError(w, err)
		return
	}
	ws, err := s.c.Bus().Workers(r.Context())
	if errors.Is(err, bus.ErrNoPresence) {
		writeJSON(w, http.StatusOK, waitingAnswer{Waiting: []client.LaneWait{}, Note: err.Error()})
		return
	}
	if err != nil {
		s.apiError(w, err)
		return
	}
	waits, err := client.WaitingJobs(r.Context(), s.c.Bus(), m, ws, s.cfg.Lanes)
	if err != nil {
		s.apiError(w, err)
		return
	}
	if waits == nil {
		waits = []client.LaneWait{}
	}
	writeJSON(w, http.StatusOK, waitingAnswer{Waiting: waits})
}

// apiDeadLetters answers the newest dead letters (at most 500), newest
// first; ?session=ID keeps one session's.
func (s *Service) apiDeadLetters(w http.ResponseWriter, r *http.Request) {
	session := r.URL.Query().Get("session")
	if session != "" {
		if err := schemas.ValidateSessionID(session); err != nil {
			s.apiError(w, fmt.Errorf("%w: %v", client.ErrBadInput, err))
			return
		}
	}
	type letter struct {
		bus.DeadLetter
		Session string `json:"session,omitempty"`
		// Data is the original body as text (bytes that are not UTF-8
		// are replaced).
		Data string `json:"data"`
	}
	var ring []letter
	total := 0
	err := s.c.Bus().DeadLetters(r.Context(), func(dl bus.DeadLetter) error {
		sess, _ := schemas.SessionOfSubject(dl.Subject)
		if session != "" && sess != session {
			return nil
		}
		total++
		ring = append(ring, letter{DeadLetter: dl, Session: sess, Data: strings.ToValidUTF8(string(dl.Data), "\uFFFD")})
		if len(ring) > maxDeadLetters {
			ring = ring[1:]
		}
		return nil
	})
	if err != nil {
		s.apiError(w, err)
		return
	}
	out := make([]letter, 0, len(ring))
	for i := len(ring) - 1; i >= 0; i-- {
		out = append(out, ring[i])
	}
	writeJSON(w, http.StatusOK, map[string]any{"total": total, "letters": out})
}

// workersAnswer is GET /api/workers: the agent workers present, the
// workers serving each lane, and the lanes none serves.
type workersAnswer struct {
	Workers  []bus.WorkerInfo    `json:"workers"`
	Lanes    map[string][]string `json:"lanes"`
	Unserved []string            `json:"unserved"`
	// Note says why no workers are known, when presence is off.
	Note string `json:"note,omitempty"`
}

// apiWorkers answers the agent workers present and their lanes.
func (s *Service) apiWorkers(w http.ResponseWriter, r *http.Request) {
	ws, err := s.c.Bus().Workers(r.Context())
	if errors.Is(err, bus.ErrNoPresence) {
		// Presence is off for this process: no workers known, not a fault.
		writeJSON(w, http.StatusOK, workersAnswer{Workers: []bus.WorkerInfo{}, Lanes: map[string][]string{}, Unserved: []string{}, Note: err.Error()})
		return
	}
	if err != nil {
		s.apiError(w, err)
		return
	}
	un := client.UnservedLanes(ws)
	if un == nil {
		un = []string{}
	}
	writeJSON(w, http.StatusOK, workersAnswer{Workers: ws, Lanes: client.ServedLanes(ws), Unserved: un})
}
