package dashboard_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/loopbus/loopbus/client"
	"github.com/loopbus/loopbus/dashboard"
	"github.com/loopbus/loopbus/internal/testnats"
	"github.com/loopbus/loopbus/projections"
)

func TestConfigRefusesAnOpenListenerWithoutToken(t *testing.T) {
	for _, tt := range []struct {
		cfg  dashboard.Config
		want error
	}{
		{dashboard.Config{}, nil},
		{dashboard.Config{Addr: "127.0.0.1:0"}, nil},
		{dashboard.Config{Addr: "[::1]:7070"}, nil},
		{dashboard.Config{Addr: "localhost:7070"}, nil},
		{dashboard.Config{Addr: "0.0.0.0:7070"}, dashboard.ErrUnsafeListener},
		{dashboard.Config{Addr: ":7070"}, dashboard.ErrUnsafeListener},
		{dashboard.Config{Addr: "192.0.2.10:7070"}, dashboard.ErrUnsafeListener},
		{dashboard.Config{Addr: "0.0.0.0:7070", Token: "s3cret-token-0123"}, nil},
		{dashboard.Config{Addr: "0.0.0.0:7070", Token: "short"}, dashboard.ErrUnsafeListener},
	} {
		if err := tt.cfg.Validate(); !errors.Is(err, tt.want) || (tt.want == nil && err != nil) {
			t.Errorf("Validate(%+v) = %v, want %v", tt.cfg, err, tt.want)
		}
	}
	if err := (dashboard.Config{Addr: "no-port"}).Validate(); err == nil {
		t.Error("an address without a port was accepted")
	}
}

// get sends a GET with the given headers.
func get(t *testing.T, url string, hdr map[string]string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	if h := hdr["Host"]; h != "" {
		req.Host = h
	}
	c := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	r, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Body.Close() })
	return r
}

func post(t *testing.T, url, body string, hdr map[string]string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	r, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Body.Close() })
	return r
}

// TestTokenIsRequired: with a token every page and API call needs it
// (bearer or the login cookie); pages send a browser to the login form.
func TestTokenIsRequired(t *testing.T) {
	s := startSystem(t, dashboard.Config{Addr: "0.0.0.0:0", Token: "s3cret-token-0123"})
	u := s.srv.URL
	if r := get(t, u+"/api/sessions", nil); r.StatusCode != http.StatusUnauthorized {
		t.Errorf("API without token: %d, want 401", r.StatusCode)
	}
	if r := get(t, u+"/api/sessions", map[string]string{"Authorization": "Bearer wrong"}); r.StatusCode != http.StatusUnauthorized {
		t.Errorf("API with a wrong token: %d, want 401", r.StatusCode)
	}
	if r := get(t, u+"/api/sessions", map[string]string{"Authorization": "Bearer s3cret-token-0123"}); r.StatusCode != http.StatusOK {
		t.Errorf("API with the token: %d, want 200", r.StatusCode)
	}
	if r := get(t, u+"/", map[string]string{"Accept": "text/html"}); r.StatusCode != http.StatusSeeOther || !strings.HasPrefix(r.Header.Get("Location"), "/login") {
		t.Errorf("page without token: %d to %q, want a redirect to /login", r.StatusCode, r.Header.Get("Location"))
	}
	if r := post(t, u+"/api/sessions/x/signal", `{"verb":"pause"}`, nil); r.StatusCode != http.StatusUnauthorized {
		t.Errorf("signal without token: %d, want 401", r.StatusCode)
	}
	if r := get(t, u+"/login", nil); r.StatusCode != http.StatusOK {
		t.Errorf("login page: %d", r.StatusCode)
	}

	// The login form keeps the token in a cookie.
	form := "token=s3cret-token-0123&next=%2Fdeadletters"
	req, _ := http.NewRequest(http.MethodPost, u+"/login", strings.NewReader(form))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	noFollow := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	r, err := noFollow.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	r.Body.Close()
	var cookie *http.Cookie
	for _, c := range r.Cookies() {
		if c.Name == "loopbus_token" {
			cookie = c
		}
	}
	if r.Header.Get("Location") != "/deadletters" || cookie == nil || !cookie.HttpOnly || cookie.SameSite != http.SameSiteStrictMode {
		t.Fatalf("login: to %q, cookie %+v; want /deadletters and an HttpOnly, SameSite=Strict cookie", r.Header.Get("Location"), cookie)
	}
	if r := get(t, u+"/api/deadletters", map[string]string{"Cookie": "loopbus_token=" + cookie.Value}); r.StatusCode != http.StatusOK {
		t.Errorf("API with the login cookie: %d", r.StatusCode)
	}
	// A login with another site as its next page stays here (browsers
	// drop tabs and newlines: /<tab>/evil.example is //evil.example).
	for _, next := range []string{"//evil.example/", "/%09/evil.example", "/%0a/evil.example", "/%5C/evil.example", "https://evil.example/", "evil.example"} {
		req, _ = http.NewRequest(http.MethodPost, u+"/login", strings.NewReader("token=s3cret-token-0123&next="+next))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		if r, err = noFollow.Do(req); err != nil {
			t.Fatal(err)
		}
		r.Body.Close()
		if r.Header.Get("Location") != "/" {
			t.Errorf("login with next %s: redirected to %q, want /", next, r.Header.Get("Location"))
		}
	}
	// The login page shows no text from its address.
	page := get(t, u+"/login?error=Your+session+expired.+Call+evil", nil)
	body, _ := io.ReadAll(page.Body)
	if strings.Contains(string(body), "Call evil") {
		t.Error("the login page shows text from its address")
	}
}

// TestForeignRequestsAreRefused: a change from another site's page is
// refused, and so is a request naming another host on a loopback listener
// without a token (DNS rebinding).
func TestForeignRequestsAreRefused(t *testing.T) {
	s := startSystem(t, dashboard.Config{Addr: "127.0.0.1:0"})
	open := s.submitGated(t, "guarded")
	defer open("c")
	defer open("b")
	defer open("a")
	u := s.srv.URL + "/api/sessions/guarded/signal"
	if r := post(t, u, `{"verb":"pause"}`, map[string]string{"Origin": "https://evil.example"}); r.StatusCode != http.StatusForbidden {
		t.Errorf("cross-origin signal: %d, want 403", r.StatusCode)
	}
	if r := post(t, u, `{"verb":"pause"}`, map[string]string{"Sec-Fetch-Site": "cross-site"}); r.StatusCode != http.StatusForbidden {
		t.Errorf("cross-site signal: %d, want 403", r.StatusCode)
	}
	req, _ := http.NewRequest(http.MethodPost, u, strings.NewReader("verb=pause"))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	r, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	r.Body.Close()
	if r.StatusCode != http.StatusBadRequest {
		t.Errorf("a form post: %d, want 400 (signals are JSON)", r.StatusCode)
	}
	if r := get(t, s.srv.URL+"/api/sessions", map[string]string{"Host": "evil.example"}); r.StatusCode != http.StatusForbidden {
		t.Errorf("request for host evil.example: %d, want 403", r.StatusCode)
	}
	// None of them paused the session.
	m := s.waitManifest(t, "guarded", "the session to run", func(m *projections.Manifest) bool { return m.Status == projections.StatusRunning })
	if m.Hold != nil {
		t.Errorf("the session is held: %+v", m.Hold)
	}
}

// TestAPI: the sessions list, a session's manifest, its artifacts, its
// event stream and a signal, over HTTP against a live session.
func TestAPI(t *testing.T) {
	s := startSystem(t, dashboard.Config{Addr: "127.0.0.1:0"})
	open := s.submitGated(t, "api-1")
	u := s.srv.URL

	var list []client.SessionSummary
	getJSON(t, u+"/api/sessions?status=running", &list)
	if len(list) != 1 || list[0].ID != "api-1" || list[0].Steps != 3 {
		t.Fatalf("running sessions = %+v, want api-1 with 3 steps", list)
	}
	getJSON(t, u+"/api/sessions?status=completed", &list)
	if len(list) != 0 {
		t.Errorf("completed sessions = %+v, want none", list)
	}
	for _, q := range []string{"status=bogus", "age=yesterday", "limit=0", "limit=100000"} {
		if r := get(t, u+"/api/sessions?"+q, nil); r.StatusCode != http.StatusBadRequest {
			t.Errorf("?%s: %d, want 400", q, r.StatusCode)
		}
	}
	if r := get(t, u+"/api/sessions/no-such-session", nil); r.StatusCode != http.StatusNotFound {
		t.Errorf("unknown session: %d, want 404", r.StatusCode)
	}
	if r := get(t, u+"/api/sessions/..%2Fetc", nil); r.StatusCode != http.StatusBadRequest && r.StatusCode != http.StatusNotFound {
		t.Errorf("bad session id: %d, want 400 or 404", r.StatusCode)
	}

	// The event stream sends the history, then what happens live.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, u+"/api/sessions/api-1/events", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("events content type %q", ct)
	}
	msgs := readSSE(resp.Body)
	waitSSE(t, msgs, "the session.started row", func(ev, data string) bool {
		return ev == "events" && strings.Contains(data, `"type":"session.started"`)
	})
	open("a")
	waitSSE(t, msgs, "step a completed in the manifest", func(ev, data string) bool {
		if ev != "manifest" {
			return false
		}
		var m projections.Manifest
		return json.Unmarshal([]byte(data), &m) == nil && m.Steps["a"] != nil && m.Steps["a"].Status == projections.StepStatusCompleted
	})

	// The artifact of step a, as text and as a download; only the
	// session's own artifacts are served.
	var m projections.Manifest
	getJSON(t, u+"/api/sessions/api-1", &m)
	a := m.Steps["a"].Artifacts[0]
	r := get(t, u+"/api/sessions/api-1/artifact?object="+a.Object+"&view=1", nil)
	body, _ := io.ReadAll(r.Body)
	if r.StatusCode != http.StatusOK || string(body) != "a done\n" || !strings.HasPrefix(r.Header.Get("Content-Type"), "text/plain") {
		t.Errorf("artifact view: %d %q %q", r.StatusCode, r.Header.Get("Content-Type"), body)
	}
	r = get(t, u+"/api/sessions/api-1/artifact?object="+a.Object, nil)
	if cd := r.Header.Get("Content-Disposition"); !strings.Contains(cd, "attachment") || !strings.Contains(cd, "a.txt") {
		t.Errorf("artifact download: Content-Disposition %q", cd)
	}
	if r := get(t, u+"/api/sessions/api-1/artifact?object=api-1/other/secret", nil); r.StatusCode != http.StatusNotFound {
		t.Errorf("an object the session does not name: %d, want 404", r.StatusCode)
	}

	// A signal, as the pause button sends it.
	r = post(t, u+"/api/sessions/api-1/signal", `{"verb":"pause","reason":"look first"}`, map[string]string{"Origin": u})
	var res []client.SignalResult
	if err := json.NewDecoder(r.Body).Decode(&res); err != nil || r.StatusCode != http.StatusOK {
		t.Fatalf("signal: %d %v", r.StatusCode, err)
	}
	if len(res) != 1 || res[0].Signal != "pause" || res[0].Result != "applied" {
		t.Errorf("signal results %+v, want pause applied", res)
	}
	s.waitManifest(t, "api-1", "the session to pause", func(m *projections.Manifest) bool { return m.Status == projections.StatusPaused })
	for _, bad := range []string{`{"verb":"explode"}`, `{"verb":"info"}`, `{"verb":"pause","extra":1}`, `{"verb":"invalidate"}`, `{"verb":"pause","step":"../x"}`,
		`{"verb":"approve"}`, `{"verb":"reject","step":"a"}`, `{"verb":"approve","step":"a","message":"m"}`} {
		if r := post(t, u+"/api/sessions/api-1/signal", bad, nil); r.StatusCode != http.StatusBadRequest {
			t.Errorf("signal %s: %d, want 400", bad, r.StatusCode)
		}
	}
	r = post(t, u+"/api/sessions/api-1/signal", `{"verb":"resume"}`, nil)
	if r.StatusCode != http.StatusOK {
		t.Fatalf("resume: %d", r.StatusCode)
	}
	open("b")
	open("c")
	s.waitManifest(t, "api-1", "the session to complete", func(m *projections.Manifest) bool { return m.Status == projections.StatusCompleted })
	var dl struct {
		Total int `json:"total"`
	}
	getJSON(t, u+"/api/deadletters", &dl)
	if dl.Total != 0 {
		t.Errorf("%d dead letters, want none", dl.Total)
	}
}

func getJSON(t *testing.T, url string, v any) {
	t.Helper()
	r := get(t, url, nil)
	if r.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(r.Body)
		t.Fatalf("GET %s: %d %s", url, r.StatusCode, b)
	}
	if err := json.NewDecoder(r.Body).Decode(v); err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
}

type sseMsg struct{ event, data string }

// readSSE parses server-sent events from r until it ends.
func readSSE(r io.Reader) <-chan sseMsg {
	out := make(chan sseMsg, 1024)
	go func() {
		defer close(out)
		sc := bufio.NewScanner(r)
		sc.Buffer(make([]byte, 0, 1<<20), 16<<20)
		var m sseMsg
		for sc.Scan() {
			line := sc.Text()
			switch {
			case line == "":
				if m.event != "" {
					out <- m
				}
				m = sseMsg{}
			case strings.HasPrefix(line, "event: "):
				m.event = strings.TrimPrefix(line, "event: ")
			case strings.HasPrefix(line, "data: "):
				m.data = strings.TrimPrefix(line, "data: ")
			}
		}
	}()
	return out
}

func waitSSE(t *testing.T, msgs <-chan sseMsg, what string, ok func(event, data string) bool) {
	t.Helper()
	timeout := time.After(60 * time.Second)
	for {
		select {
		case m, open := <-msgs:
			if !open {
				t.Fatalf("the stream ended before %s", what)
			}
			if ok(m.event, m.data) {
				return
			}
		case <-timeout:
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// TestTimelineKeepsTheNewest: a session with more events than MaxRows
// sends its newest MaxRows on connect, and says how many it left out.
func TestTimelineKeepsTheNewest(t *testing.T) {
	s := startSystem(t, dashboard.Config{Addr: "127.0.0.1:0"})
	open := s.submitGated(t, "rows")
	open("a")
	open("b")
	open("c")
	m := s.waitManifest(t, "rows", "the session to complete", func(m *projections.Manifest) bool { return m.Status == projections.StatusCompleted })
	d, err := dashboard.New(dashboard.Config{MaxRows: 3}, s.c, testnats.Logger(t), time.Now)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(d.Handler())
	defer srv.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/api/sessions/rows/events", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	msgs := readSSE(resp.Body)
	var batch struct {
		Rows []struct {
			Seq uint64 `json:"seq"`
		} `json:"rows"`
		Dropped int `json:"dropped"`
	}
	waitSSE(t, msgs, "the first batch", func(ev, data string) bool {
		return ev == "events" && json.Unmarshal([]byte(data), &batch) == nil
	})
	if len(batch.Rows) != 3 || batch.Rows[2].Seq != m.LastSeq || batch.Dropped == 0 {
		t.Errorf("first batch: %d rows ending at seq %d, %d dropped; want the 3 newest, ending at %d, and a count of the rest",
			len(batch.Rows), batch.Rows[len(batch.Rows)-1].Seq, batch.Dropped, m.LastSeq)
	}
}
