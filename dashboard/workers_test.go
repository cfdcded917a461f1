package dashboard_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/dashboard"
)

// GET /api/workers lists the agent workers present with their lanes, the
// workers of each lane and the lanes none serves.
func TestAPIWorkers(t *testing.T) {
	t.Parallel()
	s := startSystem(t, dashboard.Config{})
	type answer struct {
		Workers []struct {
			ID    string   `json:"id"`
			Lanes []string `json:"lanes"`
		} `json:"workers"`
		Lanes    map[string][]string `json:"lanes"`
		Unserved []string            `json:"unserved"`
	}
	var a answer
	deadline := time.Now().Add(10 * time.Second)
	for {
		a = answer{}
		getJSON(t, s.srv.URL+"/api/workers", &a)
		if len(a.Workers) > 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if len(a.Workers) != 1 || len(a.Workers[0].Lanes) != 3 || len(a.Unserved) != 0 || a.Unserved == nil {
		t.Fatalf("workers of the embedded services: %+v; want one serving every lane, unserved []", a)
	}
	if len(a.Lanes["heavy"]) != 1 {
		t.Errorf("lanes = %v; want heavy served by the worker", a.Lanes)
	}
	// The worker goes away: every lane is unserved; a no-net worker comes.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.b.DeleteWorker(ctx, a.Workers[0].ID); err != nil {
		t.Fatal(err)
	}
	if err := s.b.PutWorker(ctx, bus.WorkerInfo{ID: "laptop", Lanes: []string{"no-net"}}); err != nil {
		t.Fatal(err)
	}
	a = answer{}
	getJSON(t, s.srv.URL+"/api/workers", &a)
	if len(a.Workers) != 1 || a.Workers[0].ID != "laptop" || !slices.Equal(a.Unserved, []string{"net", "heavy"}) ||
		!slices.Equal(a.Lanes["no-net"], []string{"laptop"}) || len(a.Lanes["heavy"]) != 0 {
		t.Fatalf("after the change: %+v; want laptop serving no-net, net and heavy unserved", a)
	}
}
