package dashboard_test

import (
	"context"
	"net/http"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/loopbus/loopbus/client"
	"github.com/loopbus/loopbus/dashboard"
	"github.com/loopbus/loopbus/projections"
	"github.com/loopbus/loopbus/schemas"
)

// TestForkTree: a session forked after its first step runs its own job of
// the second; the fork's manifest names its origin and point, the origin's
// forks are listed by GET /api/sessions/{id}/forks, and the session pages
// show the tree (origin, fork point, children) in headless Chromium when
// it is installed.
func TestForkTree(t *testing.T) {
	t.Parallel()
	s := startSystem(t, dashboard.Config{Addr: "127.0.0.1:0"})
	open := s.submitGated(t, "tree-1")
	defer open("c")
	defer open("b")
	open("a")
	s.waitManifest(t, "tree-1", "step a completed", func(m *projections.Manifest) bool {
		return m.Steps["a"].Status == projections.StepStatusCompleted
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	evs, err := client.Events(ctx, s.b, "tree-1", client.Until{})
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(evs, func(ev schemas.Event) bool { return ev.Type == schemas.TypeStepCompleted && ev.Step == "a" })
	if i < 0 {
		t.Fatal("no step.completed of a")
	}
	f, err := s.c.Fork(ctx, client.ForkRequest{Origin: "tree-1", At: strconv.FormatUint(evs[i].Seq, 10), As: "tree-2", Reason: "try b again"})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(f.Kept, []string{"a"}) || !slices.Equal(f.Again, []string{"b", "c"}) || f.Point.ID != evs[i].ID {
		t.Errorf("fork kept %v, runs %v, at %s", f.Kept, f.Again, f.Point.ID)
	}
	m := s.waitManifest(t, "tree-2", "the fork's own job of b", func(m *projections.Manifest) bool {
		return m.Steps["b"].Status == projections.StepStatusInProgress && m.Steps["b"].JobID == "tree-2.b.1"
	})
	if m.Steps["a"].Status != projections.StepStatusCompleted {
		t.Errorf("a in the fork: %s, want kept", m.Steps["a"].Status)
	}

	var fork struct {
		ForkedFrom *projections.ForkView `json:"forkedFrom"`
	}
	getJSON(t, s.srv.URL+"/api/sessions/tree-2", &fork)
	if ff := fork.ForkedFrom; ff == nil || ff.Session != "tree-1" || ff.Seq != evs[i].Seq || ff.Reason != "try b again" {
		t.Errorf("forkedFrom %+v", fork.ForkedFrom)
	}
	var forks []client.ForkRef
	getJSON(t, s.srv.URL+"/api/sessions/tree-1/forks", &forks)
	if len(forks) != 1 || forks[0].Session != "tree-2" || forks[0].Seq != evs[i].Seq || forks[0].Event != evs[i].ID {
		t.Errorf("forks of tree-1: %+v", forks)
	}
	forks = nil
	getJSON(t, s.srv.URL+"/api/sessions/tree-2/forks", &forks)
	if forks == nil || len(forks) != 0 {
		t.Errorf("forks of tree-2: %#v, want []", forks)
	}
	if r := get(t, s.srv.URL+"/api/sessions/nosuch/forks", nil); r.StatusCode != http.StatusNotFound {
		t.Errorf("forks of an unknown session: %d, want 404", r.StatusCode)
	}

	bctx := browser(t)
	run(t, bctx, "the fork's page links its origin and says where it forked",
		chromedp.Navigate(s.srv.URL+"/sessions/tree-2"),
		chromedp.WaitVisible(chromedp.CSS(`#lineage a[href="/sessions/tree-1"]`)),
	)
	if txt := value(t, bctx, "read the lineage", chromedp.Text(chromedp.CSS(`#lineage`))); txt != "forked from tree-1 at stream seq "+strconv.FormatUint(evs[i].Seq, 10)+" (event "+evs[i].ID+"): try b again" {
		t.Errorf("lineage of the fork: %q", txt)
	}
	run(t, bctx, "the origin's page links its fork",
		chromedp.Navigate(s.srv.URL+"/sessions/tree-1"),
		chromedp.WaitVisible(chromedp.CSS(`#lineage a[href="/sessions/tree-2"]`)),
	)
}
