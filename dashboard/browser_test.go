package dashboard_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	cdpruntime "github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/client"
	"github.com/loopbus/loopbus/dashboard"
	"github.com/loopbus/loopbus/definition"
	"github.com/loopbus/loopbus/internal/testnats"
	"github.com/loopbus/loopbus/projections"
	"github.com/loopbus/loopbus/schemas"
	"github.com/loopbus/loopbus/serve"
)

// chromium finds Debian's Chromium ($LOOPBUS_CHROMIUM, else chromium on
// PATH). Without it the browser tests are skipped, loudly: `make test`
// installs it where it can (see .ci/run).
func chromium(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("LOOPBUS_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Skip("SKIPPING BROWSER TEST: no Chromium found (install Debian's chromium package, or set LOOPBUS_CHROMIUM)")
	return ""
}

// browser starts a headless Chromium for one test; every action on the
// returned context must finish within a minute.
func browser(t testing.TB) context.Context {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium(t)),
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1400, 1100),
		// This machine's network is closed: no background connections.
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelCtx := chromedp.NewContext(actx, chromedp.WithLogf(t.Logf))
	tctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	t.Cleanup(func() {
		cancel()
		cancelCtx()
		cancelAlloc()
	})
	if err := chromedp.Do(tctx); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	return tctx
}

func run(t *testing.T, ctx context.Context, what string, actions ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	if err := chromedp.Do(ctx, actions...); err != nil {
		out, _ := chromedp.Run(ctx, chromedp.Text(chromedp.CSS("body")))
		t.Fatalf("%s: %v\npage text:\n%s", what, err, out)
	}
}

// value runs an action that reads something from the page.
func value[T any](t *testing.T, ctx context.Context, what string, a chromedp.Action[T]) T {
	t.Helper()
	v, err := chromedp.Run(ctx, a)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return v
}

// disabledControls lists the session page's disabled controls, by verb
// (or id), in page order.
func disabledControls(t *testing.T, ctx context.Context) []string {
	t.Helper()
	return value(t, ctx, "the disabled controls", chromedp.Evaluate[[]string](
		`[...document.querySelectorAll(".controls button")].filter((b) => b.disabled).map((b) => b.dataset.verb || b.id)`))
}

// TestBrowserFollowsASession drives the real pages in headless Chromium:
// the sessions list shows a running session; its page updates live as its
// steps complete (no reload); the pause button pauses it. With
// LOOPBUS_SCREENSHOT set, it saves the session page there as a PNG.
func TestBrowserFollowsASession(t *testing.T) {
	ctx := browser(t)
	s := startSystem(t, dashboard.Config{Addr: "127.0.0.1:0"})
	open := s.submitGated(t, "browser-1")
	defer open("c")

	run(t, ctx, "the sessions list shows the running session",
		chromedp.Navigate(s.srv.URL+"/"),
		chromedp.WaitVisible(chromedp.CSS(`#sessions tr[data-session="browser-1"] .s-running`)),
	)
	run(t, ctx, "the session's page shows step a running",
		chromedp.Click(chromedp.CSS(`#sessions tr[data-session="browser-1"] a`)),
		chromedp.WaitVisible(chromedp.CSS(`.node[data-step="a"][data-status="in_progress"]`)),
		chromedp.WaitVisible(chromedp.CSS(`.node[data-step="c"][data-status="pending"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#live.on`)),
	)
	if got, want := disabledControls(t, ctx), []string{"resume", "approve", "reject"}; !slices.Equal(got, want) {
		t.Errorf("a running session without a gate: disabled %q, want %q", got, want)
	}
	wantEdges(t, ctx)
	loc := value(t, ctx, "read the location", chromedp.Location())
	open("a")
	run(t, ctx, "the page updates as step a completes",
		chromedp.WaitVisible(chromedp.CSS(`.node[data-step="a"][data-status="completed"]`)),
		chromedp.WaitVisible(chromedp.CSS(`.node[data-step="b"][data-status="in_progress"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#timeline tr[data-type="step.completed"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#artifacts a[href*="view=1"]`)),
	)
	after := value(t, ctx, "read the location again", chromedp.Location())
	if after != loc {
		t.Errorf("the page moved from %s to %s: it should update in place", loc, after)
	}

	run(t, ctx, "the pause button pauses the session",
		chromedp.SendKeys(chromedp.CSS(`#text`), "look at b first"),
		chromedp.Click(chromedp.CSS(`button[data-verb="pause"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#signal-result[data-result="applied"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#status.s-paused`)),
	)
	if got, want := disabledControls(t, ctx), []string{"pause", "approve", "reject"}; !slices.Equal(got, want) {
		t.Errorf("a paused session: disabled %q, want %q", got, want)
	}
	m := s.waitManifest(t, "browser-1", "the session to be paused", func(m *projections.Manifest) bool { return m.Status == projections.StatusPaused })
	if m.Hold == nil || !strings.Contains(m.Hold.Reason, "look at b first") {
		t.Errorf("hold = %+v, want the reason typed on the page", m.Hold)
	}
	run(t, ctx, "the resume button resumes it",
		chromedp.WaitVisible(chromedp.CSS(`#text[data-empty]`)),
		chromedp.Click(chromedp.CSS(`button[data-verb="resume"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#status.s-running`)),
	)
	open("b")
	run(t, ctx, "step b completes on the page",
		chromedp.WaitVisible(chromedp.CSS(`.node[data-step="b"][data-status="completed"]`)),
		chromedp.WaitVisible(chromedp.CSS(`.node[data-step="c"][data-status="in_progress"]`)),
	)
	jobSteps := value(t, ctx, "the jobs' steps", chromedp.Evaluate[[]string](
		`[...document.querySelectorAll("#jobs tbody tr td:nth-child(2)")].map((td) => td.textContent)`))
	if want := []string{"a #1", "b #1", "c #1"}; !slices.Equal(jobSteps, want) {
		t.Errorf("jobs listed as %q, want the steps' order %q", jobSteps, want)
	}
	if path := os.Getenv("LOOPBUS_SCREENSHOT"); path != "" {
		png := value(t, ctx, "screenshot", chromedp.FullScreenshot(100))
		if err := os.WriteFile(path, png, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("screenshot of the session page: %s", path)
	}
}

// wantEdges checks the step graph's arrows of gatedPipeline: a → b and
// b → c, each from its step's node to the next one's.
func wantEdges(t *testing.T, ctx context.Context) {
	t.Helper()
	edges := value(t, ctx, "the graph's arrows", chromedp.Evaluate[[]string](
		`[...document.querySelectorAll("#graph svg.edges path[data-from]")].map((p) => p.dataset.from + "->" + p.dataset.to)`))
	if want := []string{"a->b", "b->c"}; !slices.Equal(edges, want) {
		t.Errorf("arrows %q, want %q", edges, want)
	}
	// Each arrow starts at its first node's edge and ends at the other's.
	gaps := value(t, ctx, "the arrows' ends", chromedp.Evaluate[[]float64](`(() => {
		const out = [];
		for (const p of document.querySelectorAll("#graph svg.edges path[data-from]")) {
			const from = document.querySelector('.node[data-step="' + p.dataset.from + '"]').getBoundingClientRect();
			const to = document.querySelector('.node[data-step="' + p.dataset.to + '"]').getBoundingClientRect();
			const len = p.getTotalLength(), svg = p.ownerSVGElement.getBoundingClientRect();
			const a = p.getPointAtLength(0), b = p.getPointAtLength(len);
			const ax = svg.left + a.x, ay = svg.top + a.y, bx = svg.left + b.x, by = svg.top + b.y;
			const dist = (r, x, y) => Math.hypot(Math.max(r.left - x, 0, x - r.right), Math.max(r.top - y, 0, y - r.bottom));
			out.push(dist(from, ax, ay), dist(to, bx, by));
		}
		return out;
	})()`))
	for i, g := range gaps {
		if g > 2 {
			t.Errorf("arrow end %d is %.1f px from its node", i, g)
		}
	}
}

// TestBrowserNeedsTheToken: on a listener beyond loopback, a browser
// without the token is sent to the login form and sees no session; with
// the token typed there, it sees the sessions.
func TestBrowserNeedsTheToken(t *testing.T) {
	ctx := browser(t)
	s := startSystem(t, dashboard.Config{Addr: "127.0.0.1:0"})
	open := s.submitGated(t, "token-1")
	defer open("c")
	defer open("b")
	defer open("a")

	d, err := dashboard.New(dashboard.Config{Addr: "0.0.0.0:0", Token: "s3cret-token-0123"}, s.c, testnats.Logger(t), time.Now)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	sctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Serve(sctx, ln) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("serve: %v", err)
		}
	})
	url := "http://127.0.0.1:" + portOf(ln.Addr().String())

	run(t, ctx, "without the token, the login form",
		chromedp.Navigate(url+"/"),
		chromedp.WaitVisible(chromedp.CSS(`input[name="token"]`)),
	)
	loc := value(t, ctx, "location", chromedp.Location())
	body := value(t, ctx, "page text", chromedp.Text(chromedp.CSS("body")))
	if !strings.Contains(loc, "/login") || strings.Contains(body, "token-1") {
		t.Fatalf("without the token: at %s, page %q", loc, body)
	}
	run(t, ctx, "the API refuses the browser too", chromedp.Navigate(url+"/api/sessions"))
	body = value(t, ctx, "page text", chromedp.Text(chromedp.CSS("body")))
	if !strings.Contains(body, "unauthorized") || strings.Contains(body, "token-1") {
		t.Fatalf("API without the token: %q", body)
	}
	run(t, ctx, "a wrong token is refused",
		chromedp.Navigate(url+"/login"),
		chromedp.SendKeys(chromedp.CSS(`input[name="token"]`), "guess"),
		chromedp.Submit(chromedp.CSS(`input[name="token"]`)),
		chromedp.WaitVisible(chromedp.CSS(`p.error`)),
	)
	run(t, ctx, "with the token, the sessions",
		chromedp.SendKeys(chromedp.CSS(`input[name="token"]`), "s3cret-token-0123"),
		chromedp.Submit(chromedp.CSS(`input[name="token"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#sessions tr[data-session="token-1"]`)),
	)
}

func portOf(addr string) string {
	_, p, _ := net.SplitHostPort(addr)
	return p
}

// TestBrowserBudgetCloseAndLanes: a session whose job waits for lane heavy
// says so on its page; the budget form sets the bounds typed; the close
// button asks once more, then closes the session.
func TestBrowserBudgetCloseAndLanes(t *testing.T) {
	ctx := browser(t)
	heavy := func(schemas.AgentSpec) []string { return []string{"heavy"} }
	// No agent worker runs here: a no-net one is announced by hand.
	s := startServices(t, dashboard.Config{Addr: "127.0.0.1:0", Lanes: heavy}, serve.Services{Orchestrator: true, Validator: true, Projector: true})
	if err := s.b.PutWorker(t.Context(), bus.WorkerInfo{ID: "laptop", Lanes: []string{"no-net"}}); err != nil {
		t.Fatal(err)
	}
	open := s.submitGated(t, "ui-1")
	defer open("a")
	s.waitManifest(t, "ui-1", "job a requested", func(m *projections.Manifest) bool { return len(m.Jobs) == 1 })

	run(t, ctx, "the page says no worker serves the job's lane",
		chromedp.Navigate(s.srv.URL+"/sessions/ui-1"),
		chromedp.WaitVisible(chromedp.CSS(`#unserved:not([hidden])`)),
	)
	if text := value(t, ctx, "read the warning", chromedp.Text(chromedp.CSS(`#unserved`))); !strings.Contains(text, "no worker for lane heavy") {
		t.Errorf("warning %q, want it to name lane heavy", text)
	}
	run(t, ctx, "the step says its job is queued, and why",
		chromedp.WaitVisible(chromedp.CSS(`.node[data-step="a"] [data-part="queued"]`)))
	if text := value(t, ctx, "read the step's hint", chromedp.Text(chromedp.CSS(`.node[data-step="a"] [data-part="queued"]`))); !strings.Contains(text, "iteration 1 queued") || !strings.Contains(text, "no worker for lane heavy") {
		t.Errorf("the step's hint %q, want it queued for want of lane heavy", text)
	}
	run(t, ctx, "the budget form sets the bounds typed",
		chromedp.SendKeys(chromedp.CSS(`input[name="maxIterations"]`), "40"),
		chromedp.SendKeys(chromedp.CSS(`#session-controls input[name="reason"]`), "more runs"),
		chromedp.Click(chromedp.CSS(`#budget`)),
		chromedp.WaitVisible(chromedp.CSS(`#control-result[data-result="recorded"]`)),
	)
	s.waitManifest(t, "ui-1", "the new budget", func(m *projections.Manifest) bool { return m.Budget != nil && m.Budget.MaxIterations == 40 })
	run(t, ctx, "the close button asks once more",
		chromedp.Click(chromedp.CSS(`#close`)),
		chromedp.WaitVisible(chromedp.CSS(`#status.s-running`)),
	)
	if text := value(t, ctx, "read the button", chromedp.Text(chromedp.CSS(`#close`))); text != "Close for good?" {
		t.Errorf("after one click the button says %q", text)
	}
	run(t, ctx, "the second click closes the session",
		chromedp.Click(chromedp.CSS(`#close`)),
		chromedp.WaitVisible(chromedp.CSS(`#status.s-closed`)),
	)
	s.waitManifest(t, "ui-1", "the session to be closed", func(m *projections.Manifest) bool { return m.Status == projections.StatusClosed })
}

// TestBrowserApprovesALoop: a loops session whose plan level has an
// approval gate; the loop tree shows plan awaiting approval; choosing it
// and pressing Approve completes it and its child is spawned.
func TestBrowserApprovesALoop(t *testing.T) {
	ctx := browser(t)
	s := startSystem(t, dashboard.Config{Addr: "127.0.0.1:0"})
	files := map[string]string{
		"plan.sh": `printf '# plan\n## the first part\n## the second part\n' > "$LOOPBUS_OUTPUT_DIR/plan.md"` + "\n",
		"part.sh": `cp "$LOOPBUS_INPUT_DIR/plan.md" "$LOOPBUS_OUTPUT_DIR/part.md"` + "\n",
		"loops.yaml": `kind: loops
name: gated-loops
levels:
  plan:
    agent: {backend: exec, command: [sh, plan.sh]}
    outputs: [{name: plan.md}]
    approval: required
    children: {level: part, from: plan.md, split: headings}
  part:
    agent: {backend: exec, command: [sh, part.sh]}
    outputs: [{name: part.md}]
`,
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(s.dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	p, err := definition.Load(filepath.Join(s.dir, "loops.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.SubmitLoops(t.Context(), s.b, p, "write one part", "", "loop-ui", time.Now(), nil); err != nil {
		t.Fatal(err)
	}
	run(t, ctx, "the loop tree shows plan awaiting approval",
		chromedp.Navigate(s.srv.URL+"/sessions/loop-ui"),
		chromedp.WaitVisible(chromedp.CSS(`.node[data-step="plan"][data-status="awaiting_approval"]`)),
	)
	if got, want := disabledControls(t, ctx), []string{"resume"}; !slices.Equal(got, want) {
		t.Errorf("a session awaiting approval: disabled %q, want %q", got, want)
	}
	run(t, ctx, "Approve on plan completes it and spawns its child",
		chromedp.SetValue(chromedp.CSS(`#step`), "plan"),
		chromedp.SendKeys(chromedp.CSS(`#text`), "good plan"),
		chromedp.Click(chromedp.CSS(`button[data-verb="approve"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#signal-result[data-result="applied"]`)),
		chromedp.WaitVisible(chromedp.CSS(`.node[data-step="plan-001"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#status.s-completed`)),
	)
	all := []string{"pause", "resume", "stop", "hint", "invalidate", "approve", "reject", "budget", "close"}
	if got := disabledControls(t, ctx); !slices.Equal(got, all) {
		t.Errorf("a completed session: disabled %q, want every control", got)
	}
	if title := value(t, ctx, "the pause button's title", chromedp.AttributeValue(chromedp.CSS(`button[data-verb="pause"]`), "title")); !strings.Contains(title.Value, "the session has ended (completed)") {
		t.Errorf("pause's title %q, want why it is disabled", title.Value)
	}
	if sum := value(t, ctx, "the summary", chromedp.Text(chromedp.CSS(`#summary`))); !strings.Contains(sum, "ran for ") || strings.Contains(sum, "running for") {
		t.Errorf("a completed session's summary %q, want \"ran for\"", sum)
	}
	if text := value(t, ctx, "read the answer", chromedp.Text(chromedp.CSS(`#signal-result`))); !strings.Contains(text, "loop plan approved by dashboard") {
		t.Errorf("the answer shown: %q", text)
	}
	// Both parts wrote part.md: each row says which loop it is from.
	from := value(t, ctx, "the artifacts' origins", chromedp.Evaluate[[]string](
		`[...document.querySelectorAll('#artifacts tr[data-artifact="part.md"] td:nth-child(2)')].map((td) => td.textContent)`))
	if want := []string{"plan-001 · part: the first part", "plan-002 · part: the second part"}; !slices.Equal(from, want) {
		t.Errorf("part.md is from %q, want %q", from, want)
	}
}

// TestBrowserEarlierEvents: a page sent only the newest events of a
// session (here 5) says earlier ones are left out, and fetches them on
// demand, down to the session's first.
func TestBrowserEarlierEvents(t *testing.T) {
	ctx := browser(t)
	s := startSystem(t, dashboard.Config{Addr: "127.0.0.1:0", MaxRows: 5})
	open := s.submitGated(t, "early-1")
	open("a")
	open("b")
	open("c")
	m := s.waitManifest(t, "early-1", "the session to complete", func(m *projections.Manifest) bool { return m.Status == projections.StatusCompleted })
	evs, err := s.c.Events(t.Context(), "early-1", client.Until{})
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) < 20 {
		t.Fatalf("%d events, want many more than the 5 sent", len(evs))
	}
	first := fmt.Sprint(evs[0].Seq)
	run(t, ctx, "the page says earlier events are left out",
		chromedp.Navigate(s.srv.URL+"/sessions/early-1"),
		chromedp.WaitVisible(chromedp.CSS(`#timeline tr[data-seq="`+fmt.Sprint(m.LastSeq)+`"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#earlier`)),
	)
	if n := value(t, ctx, "rows shown", chromedp.Evaluate[int](`document.querySelectorAll("#timeline tr[data-seq]").length`)); n != 5 {
		t.Errorf("%d rows shown on connect, want the newest 5", n)
	}
	run(t, ctx, "showing earlier events reaches the first",
		chromedp.Click(chromedp.CSS(`#earlier`)),
		chromedp.WaitVisible(chromedp.CSS(`#timeline tr[data-seq="`+first+`"][data-type="session.started"]`)),
	)
	seqs := value(t, ctx, "rows shown", chromedp.Evaluate[[]int](`[...document.querySelectorAll("#timeline tr[data-seq]")].map((tr) => Number(tr.dataset.seq))`))
	if len(seqs) != len(evs) || !slices.IsSorted(seqs) {
		t.Errorf("rows %v, want all %d events in order", seqs, len(evs))
	}
	if n := value(t, ctx, "notices left", chromedp.Evaluate[int](`document.querySelectorAll("#earlier").length`)); n != 0 {
		t.Errorf("%d notices of earlier events once all are shown", n)
	}
}

// TestBrowserUnknownSession: the page of a session that does not exist is
// a 404 that says so, with no script error and no page waiting for ever;
// an unsafe id is a 400.
func TestBrowserUnknownSession(t *testing.T) {
	ctx := browser(t)
	s := startSystem(t, dashboard.Config{Addr: "127.0.0.1:0"})
	var mu sync.Mutex
	var jsErrors []string
	if err := chromedp.Listen(ctx, func(ev any) {
		if e, ok := ev.(*cdpruntime.EventExceptionThrown); ok {
			mu.Lock()
			jsErrors = append(jsErrors, fmt.Sprintf("%s at %s:%d", e.ExceptionDetails.Text, e.ExceptionDetails.URL, e.ExceptionDetails.LineNumber))
			mu.Unlock()
		}
	}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		path   string
		status int64
		text   string
	}{
		{"/sessions/no-such-session", 404, "no such session: no-such-session"},
		{"/sessions/bad.id", 400, "session id"},
	} {
		resp, err := chromedp.RunResponse(ctx, chromedp.Navigate(s.srv.URL+c.path))
		if err != nil {
			t.Fatalf("%s: %v", c.path, err)
		}
		if resp.Status != c.status {
			t.Errorf("%s: HTTP %d, want %d", c.path, resp.Status, c.status)
		}
		msg := value(t, ctx, "the message", chromedp.Text(chromedp.CSS(`#missing`)))
		if !strings.Contains(msg, c.text) {
			t.Errorf("%s: the page says %q, want %q", c.path, msg, c.text)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(jsErrors) > 0 {
		t.Errorf("script errors: %q", jsErrors)
	}
}

// TestBrowserNarrowScreen: at 390 px wide (a phone), the sessions list and
// a session's page fit the screen: no horizontal scroll. With
// LOOPBUS_SCREENSHOT_NARROW set, it saves the session page there as a PNG.
func TestBrowserNarrowScreen(t *testing.T) {
	ctx := browser(t)
	s := startSystem(t, dashboard.Config{Addr: "127.0.0.1:0"})
	open := s.submitGated(t, "a-rather-long-session-name-on-a-phone")
	defer open("c")
	defer open("b")
	open("a")
	run(t, ctx, "a 390 px wide screen", chromedp.EmulateViewport(390, 844))
	width := `[document.documentElement.scrollWidth, document.documentElement.clientWidth]`
	for _, page := range []struct{ path, ready string }{
		{"/", `#sessions tr[data-session="a-rather-long-session-name-on-a-phone"]`},
		{"/sessions/a-rather-long-session-name-on-a-phone", `.node[data-step="b"][data-status="in_progress"]`},
	} {
		run(t, ctx, "open "+page.path, chromedp.Navigate(s.srv.URL+page.path), chromedp.WaitVisible(chromedp.CSS(page.ready)))
		w := value(t, ctx, "the page's widths", chromedp.Evaluate[[]int](width))
		if len(w) != 2 || w[1] != 390 || w[0] > w[1] {
			t.Errorf("%s: scroll width %d in a viewport %d wide: the page scrolls sideways", page.path, w[0], w[1])
		}
		// What is inside a box that scrolls by itself (a table, the
		// timeline) may be wider; the box may not.
		wide := value(t, ctx, "elements wider than the screen", chromedp.Evaluate[[]string](
			`[...document.querySelectorAll("body *")].filter((e) => !(e.parentElement && e.parentElement.closest("table.list, .timeline, pre")) && e.getBoundingClientRect().right > 391).map((e) => e.tagName + "#" + e.id + "." + e.className)`))
		if len(wide) > 0 {
			t.Errorf("%s: clipped past the screen's edge: %q", page.path, wide)
		}
	}
	// Stacked, the arrows run down the left side.
	wantEdges(t, ctx)
	png := value(t, ctx, "screenshot", chromedp.FullScreenshot(100)) // 100: PNG, not JPEG
	path := os.Getenv("LOOPBUS_SCREENSHOT_NARROW")
	if path == "" {
		path = filepath.Join(t.TempDir(), "narrow.png")
	}
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("the session page at 390 px: %s", path)
}

// TestBrowserShowsHowJobsFailed: a job whose agent exited 0 but whose
// output failed validation is marked so (not a green "completed"), with
// the validator's problems and the agent's output inline; a job whose
// agent failed shows its error and its stderr, on its line and on its
// step.
func TestBrowserShowsHowJobsFailed(t *testing.T) {
	ctx := browser(t)
	s := startSystem(t, dashboard.Config{Addr: "127.0.0.1:0"})
	s.submit(t, "fails-1", map[string]string{
		"pipeline.yaml": `name: fails
steps:
  a:
    agent: {backend: exec, command: [sh, agent.sh]}
    prompt: count
    max_iterations: 2
    outputs: [{name: a.json, schema: a.schema.json}]
`,
		"a.schema.json": `{"type": "object", "required": ["n"], "properties": {"n": {"type": "number"}}}`,
		// Iteration 1 writes a string where a number is wanted; 2 fails.
		"agent.sh": `if [ "$LOOPBUS_ITERATION" = 1 ]; then
  echo "first try, on stderr" >&2
  echo '{"n": "seven"}' > "$LOOPBUS_OUTPUT_DIR/a.json"
  exit 0
fi
echo "second try: disk on fire" >&2
exit 3
`,
	})
	m := s.waitManifest(t, "fails-1", "the session to fail", func(m *projections.Manifest) bool { return m.Status == projections.StatusFailed })
	first, second := m.Steps["a"].JobID, m.Steps["a"].JobID
	for id, j := range m.Jobs {
		if j.Iteration == 1 {
			first = id
		}
	}
	run(t, ctx, "the session's page shows both jobs' outcomes",
		chromedp.Navigate(s.srv.URL+"/sessions/fails-1"),
		chromedp.WaitVisible(chromedp.CSS(`#jobs tr[data-outcome="`+first+`"] [data-part="output"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#jobs tr[data-outcome="`+second+`"] [data-part="output"]`)),
		chromedp.WaitVisible(chromedp.CSS(`.node[data-step="a"] [data-outcome="`+second+`"]`)),
	)
	text := func(sel string) string {
		return value(t, ctx, "the text of "+sel, chromedp.Text(chromedp.CSS(sel)))
	}
	if got := text(`#jobs tr[data-job="` + first + `"] td:nth-child(3)`); got != "failed validation" {
		t.Errorf("the job that failed validation is shown as %q", got)
	}
	if got := text(`#jobs tr[data-job="` + second + `"] td:nth-child(3)`); got != "failed" {
		t.Errorf("the job that failed is shown as %q", got)
	}
	if got := text(`#jobs tr[data-outcome="` + first + `"] [data-part="validator"]`); !strings.Contains(got, "/n") || !strings.Contains(got, "number") {
		t.Errorf("the validator's problems shown: %q, want the pointer /n and what it wants", got)
	}
	if got := text(`#jobs tr[data-outcome="` + first + `"] pre`); !strings.Contains(got, "first try, on stderr") {
		t.Errorf("the first job's output shown: %q, want its stderr", got)
	}
	if got := text(`#jobs tr[data-outcome="` + second + `"] [data-part="error"]`); !strings.Contains(got, "exit code 3") {
		t.Errorf("the failed job's error shown: %q, want its exit code", got)
	}
	if got := text(`#jobs tr[data-outcome="` + second + `"] pre`); !strings.Contains(got, "second try: disk on fire") {
		t.Errorf("the failed job's output shown: %q, want its stderr", got)
	}
	// On the step, the output is folded: its text is there once opened.
	run(t, ctx, "open the step's output",
		chromedp.Click(chromedp.CSS(`.node[data-step="a"] [data-outcome] summary`)),
		chromedp.WaitVisible(chromedp.CSS(`.node[data-step="a"] [data-outcome] pre`)),
	)
	if got := text(`.node[data-step="a"] [data-outcome] pre`); !strings.Contains(got, "second try: disk on fire") {
		t.Errorf("the step's output shown: %q", got)
	}
}
