package dashboard_test

import (
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/dashboard"
	"github.com/loopbus/loopbus/projections"
	"github.com/loopbus/loopbus/schemas"
	"github.com/loopbus/loopbus/serve"
)

// controlAnswer is what the budget and close endpoints answer.
type controlAnswer struct {
	Session string `json:"session"`
	ID      string `json:"id"`
	Type    string `json:"type"`
	Seq     uint64 `json:"seq"`
}

// TestAPIBudgetAndClose: the session page's budget form and close button
// write session.budget and session.closed as loopbus budget and close do,
// only as JSON from the dashboard's own pages; a session that ended is
// refused (409).
func TestAPIBudgetAndClose(t *testing.T) {
	s := startSystem(t, dashboard.Config{Addr: "127.0.0.1:0"})
	open := s.submitGated(t, "ctl-1")
	defer open("c")
	defer open("b")
	defer open("a")
	u := s.srv.URL
	budget := u + "/api/sessions/ctl-1/budget"

	r := post(t, budget, `{"maxIterations": 40, "maxCostUsd": 2.5, "reason": "two more tasks"}`, map[string]string{"Origin": u})
	var a controlAnswer
	if err := json.NewDecoder(r.Body).Decode(&a); err != nil || r.StatusCode != http.StatusOK {
		t.Fatalf("budget: %d %v", r.StatusCode, err)
	}
	if a.Session != "ctl-1" || a.Type != schemas.TypeSessionBudget || a.Seq == 0 || a.ID == "" {
		t.Errorf("budget answer %+v", a)
	}
	s.waitManifest(t, "ctl-1", "the new budget in the manifest", func(m *projections.Manifest) bool {
		return m.Budget != nil && m.Budget.MaxIterations == 40 && m.Budget.MaxCostUSD == 2.5
	})
	for _, bad := range []string{`{}`, `{"reason": "no bound"}`, `{"maxTokens": -1}`, `{"maxCostUsd": -2}`, `{"maxIterations": 3, "extra": 1}`, `[1]`, `{"maxTokens": "many"}`} {
		if r := post(t, budget, bad, nil); r.StatusCode != http.StatusBadRequest {
			t.Errorf("budget %s: %d, want 400", bad, r.StatusCode)
		}
	}
	if r := post(t, budget, `{"maxIterations": 3}`, map[string]string{"Content-Type": "text/plain"}); r.StatusCode != http.StatusBadRequest {
		t.Errorf("budget as text/plain: %d, want 400", r.StatusCode)
	}
	if r := post(t, u+"/api/sessions/no-such/budget", `{"maxIterations": 3}`, nil); r.StatusCode != http.StatusNotFound {
		t.Errorf("budget of an unknown session: %d, want 404", r.StatusCode)
	}
	for _, path := range []string{"/budget", "/close"} {
		if r := post(t, u+"/api/sessions/ctl-1"+path, `{"maxIterations": 3}`, map[string]string{"Origin": "https://evil.example"}); r.StatusCode != http.StatusForbidden {
			t.Errorf("cross-origin %s: %d, want 403", path, r.StatusCode)
		}
		if r := post(t, u+"/api/sessions/ctl-1"+path, `{"reason": "x"}`, map[string]string{"Sec-Fetch-Site": "cross-site"}); r.StatusCode != http.StatusForbidden {
			t.Errorf("cross-site %s: %d, want 403", path, r.StatusCode)
		}
	}
	if r := post(t, u+"/api/sessions/ctl-1/close", `{"reason": "x", "force": true}`, nil); r.StatusCode != http.StatusBadRequest {
		t.Errorf("close with an unknown field: %d, want 400", r.StatusCode)
	}
	if m := s.waitManifest(t, "ctl-1", "the session", func(*projections.Manifest) bool { return true }); m.Status != projections.StatusRunning {
		t.Fatalf("refused requests changed the session: %s", m.Status)
	}

	r = post(t, u+"/api/sessions/ctl-1/close", `{"reason": "superseded"}`, map[string]string{"Sec-Fetch-Site": "same-origin"})
	a = controlAnswer{}
	if err := json.NewDecoder(r.Body).Decode(&a); err != nil || r.StatusCode != http.StatusOK || a.Type != schemas.TypeSessionClosed {
		t.Fatalf("close: %d %v %+v", r.StatusCode, err, a)
	}
	s.waitManifest(t, "ctl-1", "the session to be closed", func(m *projections.Manifest) bool { return m.Status == projections.StatusClosed })
	for _, c := range []struct{ path, body string }{{"/budget", `{"maxIterations": 50}`}, {"/close", `{}`}} {
		r := post(t, u+"/api/sessions/ctl-1"+c.path, c.body, nil)
		var e struct {
			Error string `json:"error"`
		}
		_ = json.NewDecoder(r.Body).Decode(&e)
		if r.StatusCode != http.StatusConflict || !strings.Contains(e.Error, "ctl-1 is closed") {
			t.Errorf("%s of a closed session: %d %q, want 409 saying it is closed", c.path, r.StatusCode, e.Error)
		}
	}
}

// The budget and close endpoints need the token, as every change does.
func TestAPIBudgetAndCloseNeedTheToken(t *testing.T) {
	s := startServices(t, dashboard.Config{Addr: "0.0.0.0:0", Token: "s3cret-token-0123"}, serve.Services{})
	for _, path := range []string{"/api/sessions/x/budget", "/api/sessions/x/close"} {
		if r := post(t, s.srv.URL+path, `{"maxIterations": 3}`, nil); r.StatusCode != http.StatusUnauthorized {
			t.Errorf("%s without the token: %d, want 401", path, r.StatusCode)
		}
	}
}

// GET /api/sessions/{id}/waiting names the session's jobs that wait for a
// worker and why: none running, or none serving a lane the job needs.
func TestAPIWaiting(t *testing.T) {
	heavy := func(schemas.AgentSpec) []string { return []string{"no-net", "heavy"} }
	// No agent worker: the session's first job stays requested.
	s := startServices(t, dashboard.Config{Addr: "127.0.0.1:0", Lanes: heavy}, serve.Services{Orchestrator: true, Validator: true, Projector: true})
	open := s.submitGated(t, "wait-1")
	defer open("a")
	s.waitManifest(t, "wait-1", "job a requested", func(m *projections.Manifest) bool { return len(m.Jobs) == 1 })
	type answer struct {
		Waiting []struct {
			Job      string   `json:"job"`
			Step     string   `json:"step"`
			Lanes    []string `json:"lanes"`
			Unserved []string `json:"unserved"`
			Message  string   `json:"message"`
		} `json:"waiting"`
		Note string `json:"note"`
	}
	var a answer
	getJSON(t, s.srv.URL+"/api/sessions/wait-1/waiting", &a)
	if a.Note != "" {
		t.Skipf("worker presence is off here: %s", a.Note)
	}
	if len(a.Waiting) != 1 || a.Waiting[0].Step != "a" || a.Waiting[0].Message != "no worker is running" {
		t.Fatalf("with no worker: %+v", a)
	}
	// A worker that serves no-net only: the job waits for lane heavy.
	if err := s.b.PutWorker(t.Context(), bus.WorkerInfo{ID: "laptop", Lanes: []string{"no-net"}}); err != nil {
		t.Fatal(err)
	}
	a = answer{}
	getJSON(t, s.srv.URL+"/api/sessions/wait-1/waiting", &a)
	if len(a.Waiting) != 1 || !slices.Equal(a.Waiting[0].Unserved, []string{"heavy"}) || a.Waiting[0].Message != "no worker for lane heavy" ||
		!strings.HasPrefix(a.Waiting[0].Job, "wait-1.a.") {
		t.Fatalf("with a no-net worker: %+v", a)
	}
	// One serving every lane: the job just requested is not named.
	if err := s.b.PutWorker(t.Context(), bus.WorkerInfo{ID: "big", Lanes: []string{"no-net", "net", "heavy"}}); err != nil {
		t.Fatal(err)
	}
	a = answer{}
	getJSON(t, s.srv.URL+"/api/sessions/wait-1/waiting", &a)
	if len(a.Waiting) != 0 || a.Waiting == nil {
		t.Fatalf("with every lane served: %+v, want waiting []", a)
	}
	if r := get(t, s.srv.URL+"/api/sessions/no-such/waiting", nil); r.StatusCode != http.StatusNotFound {
		t.Errorf("unknown session: %d, want 404", r.StatusCode)
	}
}
