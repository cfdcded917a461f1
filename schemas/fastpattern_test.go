package schemas

import (
	"encoding/json"
	"io/fs"
	"math/rand/v2"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// catalogueRegexps returns every pattern of the embedded schemas.
func catalogueRegexps(t testing.TB) []*regexp.Regexp {
	t.Helper()
	seen := map[string]bool{}
	patterns := regexp.MustCompile(`"pattern":\s*("(?:[^"\\]|\\.)*")`)
	err := fs.WalkDir(schemaFiles, ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := schemaFiles.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range patterns.FindAllSubmatch(b, -1) {
			var p string
			if err := json.Unmarshal(m[1], &p); err != nil {
				return err
			}
			seen[p] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var out []*regexp.Regexp
	for p := range seen {
		out = append(out, regexp.MustCompile(p))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].String() < out[j].String() })
	return out
}

// TestFastPatternAgrees matches strings made of the patterns' characters
// and a few others, of lengths around their bounds, with each pattern's
// fast matcher and with its regexp.
func TestFastPatternAgrees(t *testing.T) {
	res := catalogueRegexps(t)
	fast := 0
	rng := rand.New(rand.NewPCG(1, 2))
	alphabet := []string{"a", "Z", "0", "f", "_", "-", ".", "/", ":", "sha256:", "LOOPBUS_", "loopbus", "é", "\xff", " ", "\n", "https://", "?", "@"}
	for _, re := range res {
		m, err := fastPattern(re.String())
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := m.(*classPattern); ok {
			fast++
		}
		check := func(s string) {
			if got, want := m.MatchString(s), re.MatchString(s); got != want {
				t.Errorf("pattern %s on %q: fast %v, regexp %v", re, s, got, want)
			}
		}
		for range 3000 {
			var b strings.Builder
			n := rng.IntN(140)
			if rng.IntN(4) == 0 {
				n = rng.IntN(8)
			}
			for b.Len() < n {
				b.WriteString(alphabet[rng.IntN(len(alphabet))])
				if rng.IntN(3) > 0 { // long runs of one character, as in names and digests
					b.WriteString(strings.Repeat(alphabet[rng.IntN(4)], rng.IntN(70)))
				}
			}
			check(b.String())
		}
		for _, s := range []string{"", "a", "_", "x.y", "LOOPBUS_X", "sha256:" + strings.Repeat("0", 64), "sha256:" + strings.Repeat("0", 63),
			strings.Repeat("a", 64), strings.Repeat("a", 65), strings.Repeat("a", 128), strings.Repeat("a", 129),
			strings.Repeat("0", 16), strings.Repeat("0", 40), strings.Repeat("0", 64), "loopbus.job.requested"} {
			check(s)
		}
	}
	if fast < len(res)/2 {
		t.Errorf("only %d of %d patterns have a fast matcher", fast, len(res))
	}
}

// FuzzFastPattern: a fast matcher never disagrees with its regexp.
func FuzzFastPattern(f *testing.F) {
	res := catalogueRegexps(f)
	f.Add(uint8(0), "abc")
	f.Add(uint8(1), "sha256:"+strings.Repeat("a", 64))
	f.Fuzz(func(t *testing.T, i uint8, s string) {
		re := res[int(i)%len(res)]
		m, err := fastPattern(re.String())
		if err != nil {
			t.Fatal(err)
		}
		if got, want := m.MatchString(s), re.MatchString(s); got != want {
			t.Errorf("pattern %s on %q: fast %v, regexp %v", re, s, got, want)
		}
	})
}
