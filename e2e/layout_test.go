package e2e

import (
	"bytes"
	"encoding/json"
	"io"
	"os/exec"
	"strings"
	"testing"
)

// layers ranks every package of the module: a package may import only
// packages of a lower rank, so imports run one way (schemas ← bus ←
// definition, projections ← services and client ← cmd, tui) and services,
// sharing a rank, never import each other. A new package must be given
// its rank here.
var layers = map[string]int{
	"schemas": 0, "workspace/procrun": 0, "internal/testcpu": 0,

	"bus": 1, "backlog": 1, "workspace": 1, "definition/yamlread": 1, "gitrepo": 1,
	"agent": 2,

	"definition": 3, "projections": 3, "agent/exec": 3, "agent/claude": 3, "agent/codex": 3, "config": 3,
	"internal/testnats": 3, "agent/modelapi": 3,
	"agent/agenttest": 4, "agent/openai": 4, "agent/anthropic": 4,
	"internal/modelserver": 5,

	"orchestrator": 5, "agentworker": 5, "validator": 5, "hooks": 5, "projections/projector": 5, "metrics": 5,
	"tracing": 5,

	"serve": 6, "client": 6,
	"tui": 7,

	"dashboard":   8,
	"cmd/loopbus": 9, "bench": 8, "bench/cmd/benchline": 9,
	"e2e": 10,
}

// testSupport are the packages under internal/: helpers for tests and
// benchmarks, nothing a service runs.
var testSupport = map[string]bool{"internal/testnats": true, "internal/modelserver": true, "internal/testcpu": true}

// TestImportsRunOneWay checks every package's non-test imports against
// layers, and that only test support lives under internal/.
func TestImportsRunOneWay(t *testing.T) {
	t.Parallel()
	const module = "github.com/loopbus/loopbus"
	cmd := exec.Command("go", "list", "-json", "./...")
	cmd.Dir = ".."
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	dec := json.NewDecoder(bytes.NewReader(out))
	seen := 0
	for {
		var p struct {
			ImportPath string
			Imports    []string
		}
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		seen++
		name := strings.TrimPrefix(strings.TrimPrefix(p.ImportPath, module), "/")
		rank, ok := layers[name]
		if !ok {
			t.Errorf("package %s has no rank in layers: place it", name)
			continue
		}
		if strings.HasPrefix(name, "internal/") && !testSupport[name] {
			t.Errorf("package %s is under internal/, which holds test support only", name)
		}
		for _, imp := range p.Imports {
			if !strings.HasPrefix(imp, module+"/") {
				continue
			}
			dep := strings.TrimPrefix(imp, module+"/")
			if r, ok := layers[dep]; ok && r >= rank {
				t.Errorf("%s (rank %d) imports %s (rank %d): imports must run from higher to lower ranks", name, rank, dep, r)
			}
		}
	}
	if seen < len(layers)-1 {
		t.Errorf("go list named %d packages, layers %d: a package is gone; drop it from layers", seen, len(layers))
	}
}
