package orchestrator

import (
	"strconv"
	"strings"
	"testing"
)

// TestPromptCache: a text is parsed once while it is kept, the cache
// starts again empty rather than grow past its bounds, and a template
// that does not parse is not kept.
func TestPromptCache(t *testing.T) {
	c := NewPromptCache()
	first, err := c.parse("step {{.Step}}")
	if err != nil {
		t.Fatal(err)
	}
	if again, _ := c.parse("step {{.Step}}"); again != first {
		t.Error("the same text was parsed again")
	}
	out, err := renderPrompt(c, "step {{.Step}}", PromptData{Step: "a"}, "", "")
	if err != nil || out != "step a" {
		t.Errorf("rendered %q, %v; want %q", out, err, "step a")
	}
	if _, err := c.parse("{{.Step"); err == nil {
		t.Error("a template that does not parse was accepted")
	}
	if len(c.byText) != 1 {
		t.Errorf("%d texts kept, want 1", len(c.byText))
	}

	for i := range maxCachedPrompts + 10 {
		if _, err := c.parse("p" + strconv.Itoa(i)); err != nil {
			t.Fatal(err)
		}
		if len(c.byText) > maxCachedPrompts {
			t.Fatalf("%d texts kept, past the bound of %d", len(c.byText), maxCachedPrompts)
		}
	}
	// One text was kept before: the bound is met at p254, p255 starts
	// again, and p255 to p265 are kept.
	if len(c.byText) != 11 {
		t.Errorf("%d texts kept after passing the bound, want the 11 parsed since", len(c.byText))
	}

	// Texts whose templates would hold more than half the bound each.
	big := strings.Repeat("x", (maxCachedPromptCost/2)/34)
	for _, text := range []string{big + "1", big + "2"} {
		if _, err := c.parse(text); err != nil {
			t.Fatal(err)
		}
		if c.cost > maxCachedPromptCost {
			t.Fatalf("templates of cost %d kept, past the bound of %d", c.cost, maxCachedPromptCost)
		}
	}
	if _, kept := c.byText[big+"2"]; len(c.byText) != 1 || !kept || c.cost != promptCost(big+"2") {
		t.Errorf("%d texts of cost %d kept, want the last one alone", len(c.byText), c.cost)
	}
	huge := strings.Repeat("y", maxCachedPromptCost/34+1)
	if _, err := c.parse(huge); err != nil {
		t.Fatal(err)
	}
	if _, kept := c.byText[huge]; kept {
		t.Error("a text over the whole bound was kept")
	}

	var none *PromptCache
	if _, err := none.parse("{{.Step}}"); err != nil {
		t.Errorf("a nil cache: %v", err)
	}
}
