package schemas

import (
	"regexp"
	"regexp/syntax"
	"unicode/utf8"
)

// The patterns of the catalogue's schemas are mostly of one shape: runs
// of a character class, of a fixed length but for the last one, between
// ^ and $ (names, ids, digests). classPattern matches those with a loop
// over the string instead of the regexp engine; every other pattern keeps
// its regexp.

// matcher is a compiled pattern.
type matcher interface {
	MatchString(s string) bool
}

// classRun is one item of a classPattern: min to max (-1: no bound)
// runes of a class, given as sorted inclusive ranges lo, hi, lo, hi...
type classRun struct {
	ranges   []rune
	min, max int
}

// classPattern is a pattern that classRuns match in order.
type classPattern struct {
	runs     []classRun
	anchored bool // ends with $: nothing may follow the runs
}

// fastPattern compiles a schema's pattern: a classPattern when its source
// has the shape above, else Go's regexp, as the generic validator's. The
// two agree on every string (TestFastPatternAgrees, FuzzFastPattern).
func fastPattern(src string) (matcher, error) {
	p, err := syntax.Parse(src, syntax.Perl)
	if err != nil {
		return nil, err
	}
	if p.Op != syntax.OpConcat || len(p.Sub) < 2 || p.Sub[0].Op != syntax.OpBeginText {
		return regexp.Compile(src)
	}
	cp := &classPattern{}
	items := p.Sub[1:]
	if last := items[len(items)-1]; last.Op == syntax.OpEndText {
		cp.anchored = true
		items = items[:len(items)-1]
	}
	for i, it := range items {
		runs, ok := toRun(it)
		if !ok {
			return regexp.Compile(src)
		}
		for _, run := range runs {
			if run.min != run.max && i != len(items)-1 {
				return regexp.Compile(src) // a variable run before another would need backtracking
			}
		}
		cp.runs = append(cp.runs, runs...)
	}
	return cp, nil
}

// toRun turns one item of a concatenation into runs: a literal (one run
// per rune), a class, or a repeat of a class.
func toRun(it *syntax.Regexp) ([]classRun, bool) {
	if it.Flags&syntax.FoldCase != 0 {
		return nil, false
	}
	switch it.Op {
	case syntax.OpLiteral:
		var runs []classRun
		for _, r := range it.Rune {
			runs = append(runs, classRun{ranges: []rune{r, r}, min: 1, max: 1})
		}
		return runs, true
	case syntax.OpCharClass:
		return []classRun{{ranges: it.Rune, min: 1, max: 1}}, true
	case syntax.OpStar, syntax.OpPlus, syntax.OpQuest, syntax.OpRepeat:
		if len(it.Sub) != 1 || it.Sub[0].Op != syntax.OpCharClass || it.Sub[0].Flags&syntax.FoldCase != 0 {
			return nil, false
		}
		run := classRun{ranges: it.Sub[0].Rune}
		switch it.Op {
		case syntax.OpStar:
			run.min, run.max = 0, -1
		case syntax.OpPlus:
			run.min, run.max = 1, -1
		case syntax.OpQuest:
			run.min, run.max = 0, 1
		default:
			run.min, run.max = it.Min, it.Max
		}
		return []classRun{run}, true
	}
	return nil, false
}

// MatchString reports whether s matches: each run takes as many runes of
// its class as it may, which is exact as only the last run varies.
func (p *classPattern) MatchString(s string) bool {
	i := 0
	for _, run := range p.runs {
		n := 0
		for i < len(s) && (run.max < 0 || n < run.max) {
			r, size := utf8.DecodeRuneInString(s[i:])
			if !inRanges(run.ranges, r) {
				break
			}
			i += size
			n++
		}
		if n < run.min {
			return false
		}
	}
	return !p.anchored || i == len(s)
}

func inRanges(ranges []rune, r rune) bool {
	for j := 0; j+1 < len(ranges); j += 2 {
		if r < ranges[j] {
			return false
		}
		if r <= ranges[j+1] {
			return true
		}
	}
	return false
}
