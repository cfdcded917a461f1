package hooks

import (
	"fmt"
	"slices"
	"strings"

	"github.com/loopbus/loopbus/schemas"
)

// hookEntity is the entity of the hook runner's own events, which never
// trigger hooks: a hook reacting to its own outcomes would loop.
const hookEntity = "hook"

// isHookEvent reports whether typ is a hook.* event.
func isHookEvent(typ string) bool {
	return strings.HasPrefix(typ, "loopbus."+hookEntity+".")
}

// checkType validates a type pattern: loopbus.<entity>.<verb>, where the
// entity and the verb are lowercase words or * (any one word). A pattern
// naming the hook entity is refused: hook.* events never trigger hooks.
func checkType(p string) error {
	parts := strings.Split(p, ".")
	if len(parts) != 3 || parts[0] != "loopbus" {
		return fmt.Errorf("%q is not an event type: want loopbus.<entity>.<verb>, where * matches any one part (loopbus.session.*)", p)
	}
	for _, w := range parts[1:] {
		if w != "*" && !lowerWord(w) {
			return fmt.Errorf("%q is not an event type: %q is neither a lowercase word nor *", p, w)
		}
	}
	if parts[1] == hookEntity {
		return fmt.Errorf("%q: hook.* events never trigger hooks (a hook would loop on its own outcomes)", p)
	}
	return nil
}

func lowerWord(s string) bool {
	if s == "" || len(s) > 32 {
		return false
	}
	for _, c := range s {
		if c < 'a' || c > 'z' {
			return false
		}
	}
	return true
}

// eventTokens is the number of tokens of an event subject:
// loopbus.evt.<session>.<entity>.<verb>.
const eventTokens = 5

// checkSubject validates a NATS subject filter: under loopbus.evt, no empty
// token, > only last, able to match some event subject, and not naming the
// hook entity.
func checkSubject(f string) error {
	if !strings.HasPrefix(f, schemas.SubjectPrefix+".") {
		return fmt.Errorf("subject filter %q is not under %s.> (event subjects are %s.<session>.<entity>.<verb>)", f, schemas.SubjectPrefix, schemas.SubjectPrefix)
	}
	toks := strings.Split(f, ".")
	for i, t := range toks {
		switch {
		case t == "":
			return fmt.Errorf("subject filter %q has an empty token", f)
		case strings.ContainsAny(t, " \t\r\n"):
			return fmt.Errorf("subject filter %q contains white space", f)
		case t == ">" && i != len(toks)-1:
			return fmt.Errorf("subject filter %q: > must be the last token", f)
		case t != "*" && t != ">" && strings.ContainsAny(t, "*>"):
			return fmt.Errorf("subject filter %q: wildcards * and > must be whole tokens", f)
		}
	}
	last := toks[len(toks)-1]
	if len(toks) > eventTokens || (len(toks) < eventTokens && last != ">") {
		return fmt.Errorf("subject filter %q matches no event: event subjects are %s.<session>.<entity>.<verb>", f, schemas.SubjectPrefix)
	}
	if len(toks) > 3 && toks[3] == hookEntity {
		return fmt.Errorf("subject filter %q: hook.* events never trigger hooks (a hook would loop on its own outcomes)", f)
	}
	return nil
}

// typeMatches reports whether event type typ matches pattern p (see
// checkType).
func typeMatches(p, typ string) bool {
	pp, tp := strings.Split(p, "."), strings.Split(typ, ".")
	if len(pp) != len(tp) {
		return false
	}
	for i := range pp {
		if pp[i] != "*" && pp[i] != tp[i] {
			return false
		}
	}
	return true
}

// subjectMatches reports whether the literal subject s matches the NATS
// filter f (* matches one token, a final > one or more).
func subjectMatches(f, s string) bool {
	ft, st := strings.Split(f, "."), strings.Split(s, ".")
	for i, t := range ft {
		if t == ">" {
			return len(st) > i
		}
		if i >= len(st) || (t != "*" && t != st[i]) {
			return false
		}
	}
	return len(ft) == len(st)
}

// Matches reports whether ev triggers h: ev is not a hook.* event, its type
// matches one of h.Types or its stream subject matches one of h.Subjects,
// and, when h.Sessions is set, its session is one of them.
func (h Hook) Matches(ev schemas.Event) bool {
	if isHookEvent(ev.Type) || ev.ForkOf != "" {
		// A copy in a fork's history: hooks ran for the original.
		return false
	}
	if len(h.Sessions) > 0 && !slices.Contains(h.Sessions, ev.Session) {
		return false
	}
	if slices.ContainsFunc(h.Types, func(p string) bool { return typeMatches(p, ev.Type) }) {
		return true
	}
	subject, err := schemas.SubjectFor(ev.Session, ev.Type)
	if err != nil {
		return false
	}
	return slices.ContainsFunc(h.Subjects, func(f string) bool { return subjectMatches(f, subject) })
}

// filters returns the stream subject filters of the events h can match:
// each type as loopbus.evt.<session or *>.<entity>.<verb>, each subject
// filter as is or, with sessions, narrowed to each session.
func (h Hook) filters() []string {
	sessions := h.Sessions
	if len(sessions) == 0 {
		sessions = []string{"*"}
	}
	var out []string
	for _, s := range sessions {
		for _, t := range h.Types {
			ev := strings.TrimPrefix(t, "loopbus.")
			out = append(out, schemas.SubjectPrefix+"."+s+"."+ev)
		}
		for _, f := range h.Subjects {
			if n, ok := narrow(f, s); ok {
				out = append(out, n)
			}
		}
	}
	return out
}

// narrow returns the part of filter f within session s's subjects ("*"
// means every session); ok is false when they share no subject.
func narrow(f, s string) (string, bool) {
	if s == "*" {
		return f, true
	}
	toks := strings.Split(f, ".")
	switch toks[2] {
	case ">":
		return schemas.SessionSubjects(s), true
	case "*", s:
		toks[2] = s
		return strings.Join(toks, "."), true
	}
	return "", false
}

// consumerSubjects returns subject filters for one consumer that together
// cover every filter given and do not overlap, as JetStream requires of a
// consumer's filters: a filter covered by another is dropped and two that
// overlap are replaced by one covering both (which may also cover subjects
// neither did; events are matched again against each hook). The result is
// sorted.
func consumerSubjects(filters []string) []string {
	set := slices.Clone(filters)
	slices.Sort(set)
	set = slices.Compact(set)
	for changed := true; changed; {
		changed = false
	pairs:
		for i := 0; i < len(set); i++ {
			for j := i + 1; j < len(set); j++ {
				a, b := set[i], set[j]
				switch {
				case covers(a, b):
					set = slices.Delete(set, j, j+1)
				case covers(b, a):
					set = slices.Delete(set, i, i+1)
				case overlaps(a, b):
					set = slices.Delete(set, j, j+1)
					set[i] = joinFilters(a, b)
				default:
					continue
				}
				changed = true
				break pairs
			}
		}
	}
	slices.Sort(set)
	return set
}

// covers reports whether every subject matching filter b matches filter a.
func covers(a, b string) bool {
	at, bt := strings.Split(a, "."), strings.Split(b, ".")
	for i, t := range at {
		if t == ">" {
			return len(bt) > i
		}
		if i >= len(bt) || bt[i] == ">" || (t != "*" && (bt[i] == "*" || t != bt[i])) {
			return false
		}
	}
	return len(at) == len(bt)
}

// overlaps reports whether some subject matches both filters.
func overlaps(a, b string) bool {
	at, bt := strings.Split(a, "."), strings.Split(b, ".")
	for i := 0; i < len(at) && i < len(bt); i++ {
		switch {
		case at[i] == ">" || bt[i] == ">":
			return true
		case at[i] == "*" || bt[i] == "*" || at[i] == bt[i]:
		default:
			return false
		}
	}
	return len(at) == len(bt)
}

// joinFilters returns a filter covering both a and b: equal tokens are
// kept, differing ones become *, and from the first > (or where the
// lengths part) the rest becomes >.
func joinFilters(a, b string) string {
	at, bt := strings.Split(a, "."), strings.Split(b, ".")
	n := min(len(at), len(bt))
	out := make([]string, 0, n)
	for i := range n {
		switch {
		case at[i] == ">" || bt[i] == ">" || (len(at) != len(bt) && i == n-1):
			return strings.Join(append(out, ">"), ".")
		case at[i] == bt[i]:
			out = append(out, at[i])
		default:
			out = append(out, "*")
		}
	}
	return strings.Join(out, ".")
}
