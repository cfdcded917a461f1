package schemas

import (
	"errors"
	"regexp"
	"strings"
	"testing"
)

// tokenCases are shared by session ids and step names; wantErr is reported
// as true when the value must be rejected.
var tokenCases = []struct {
	name    string
	in      string
	wantErr bool
}{
	{"simple", "sess-1", false},
	{"all classes", "Az09_-", false},
	{"leading dash", "-x", false},
	{"one char", "a", false},
	{"max length", strings.Repeat("a", 64), false},
	{"empty", "", true},
	{"too long", strings.Repeat("a", 65), true},
	{"dot", ".", true},
	{"dot dot", "..", true},
	{"dot inside", "a.b", true},
	{"slash", "a/b", true},
	{"backslash", `a\b`, true},
	{"space", "a b", true},
	{"leading space", " a", true},
	{"tab", "a\tb", true},
	{"newline", "a\n", true},
	{"non-UTF-8", "a\xffb", true},
	{"non-ASCII letter", "café", true},
	{"dollar", "$sys", true},
	{"star", "*", true},
	{"gt", ">", true},
	{"NUL", "a\x00", true},
}

func TestValidateSessionID(t *testing.T) {
	for _, tt := range tokenCases {
		t.Run(tt.name, func(t *testing.T) {
			err := ValidateSessionID(tt.in)
			checkErr(t, err, tt.wantErr, ErrBadSessionID)
		})
	}
}

func TestValidateStepName(t *testing.T) {
	for _, tt := range tokenCases {
		t.Run(tt.name, func(t *testing.T) {
			err := ValidateStepName(tt.in)
			checkErr(t, err, tt.wantErr, ErrBadStepName)
		})
	}
}

// TestStepNamePattern checks that the step name pattern of the JSON Schemas
// agrees with ValidateStepName.
func TestStepNamePattern(t *testing.T) {
	re := regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)
	for _, tt := range tokenCases {
		t.Run(tt.name, func(t *testing.T) {
			if got := !re.MatchString(tt.in); got != tt.wantErr {
				t.Errorf("pattern rejects %q: %v, want %v", tt.in, got, tt.wantErr)
			}
		})
	}
}

func TestValidateName(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		wantErr bool
	}{
		{"file", "report.json", false},
		{"hidden file", ".env", false},
		{"dots inside", "a..b", false},
		{"trailing dash", "a-", false},
		{"underscore first", "_a", false},
		{"max length", strings.Repeat("a", 128), false},
		{"empty", "", true},
		{"too long", strings.Repeat("a", 129), true},
		{"dot", ".", true},
		{"dot dot", "..", true},
		{"path", "a/b", true},
		{"parent path", "../a", true},
		{"absolute", "/etc/passwd", true},
		{"backslash", `a\b`, true},
		{"leading dash", "-x", true},
		{"option", "--help", true},
		{"space", "a b.txt", true},
		{"non-UTF-8", "a\xff.txt", true},
		{"non-ASCII", "résumé.pdf", true},
		{"dollar", "$HOME", true},
		{"star", "*.json", true},
		{"gt", ">", true},
		{"semicolon", "a;rm", true},
		{"NUL", "a\x00", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			checkErr(t, ValidateName(tt.in), tt.wantErr, ErrBadName)
		})
	}
}

// TestArtifactNamePattern checks that the artifact name rules of the JSON
// Schemas agree with ValidateName, by decoding an artifact.stored event.
func TestArtifactNamePattern(t *testing.T) {
	c := newTestCatalogue(t)
	for _, in := range []string{"report.json", ".env", "a-", strings.Repeat("a", 128), "", strings.Repeat("a", 129), ".", "..", "a/b", "-x", "a b", "a\xff", "é", "$", "*", ">"} {
		t.Run(in, func(t *testing.T) {
			art := testArtifact(t, "x", "", "")
			art.Name = in
			_, encErr := c.Encode(TypeArtifactStored, &ArtifactStored{JobID: "j", Artifact: art})
			if got, want := encErr != nil, ValidateName(in) != nil; got != want {
				t.Errorf("schema rejects %q: %v (%v), ValidateName rejects it: %v", in, got, encErr, want)
			}
		})
	}
}

// checkErr checks that err is nil, or wraps sentinel when wantErr.
func checkErr(t *testing.T, err error, wantErr bool, sentinel error) {
	t.Helper()
	if !wantErr {
		if err != nil {
			t.Errorf("unexpected error: %v", err)
		}
		return
	}
	if !errors.Is(err, sentinel) {
		t.Errorf("error = %v, want %v", err, sentinel)
	}
}

func TestEntityVerb(t *testing.T) {
	tests := []struct {
		name    string
		typ     string
		want    string
		wantErr bool
	}{
		{"session started", TypeSessionStarted, "session.started", false},
		{"validation failed", TypeValidationFailed, "validation.failed", false},
		{"no prefix", "session.started", "", true},
		{"other prefix", "io.loopbus.session.started", "", true},
		{"no verb", "loopbus.session", "", true},
		{"too many parts", "loopbus.session.started.now", "", true},
		{"empty entity", "loopbus..started", "", true},
		{"empty verb", "loopbus.session.", "", true},
		{"empty", "", "", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := EntityVerb(tt.typ)
			checkErr(t, err, tt.wantErr, ErrBadType)
			if got != tt.want {
				t.Errorf("EntityVerb(%q) = %q, want %q", tt.typ, got, tt.want)
			}
		})
	}
}

func TestSubjectRoundTrip(t *testing.T) {
	c := newTestCatalogue(t)
	for _, typ := range c.Types() {
		t.Run(typ, func(t *testing.T) {
			subj, err := SubjectFor("sess-1", typ)
			if err != nil {
				t.Fatalf("SubjectFor: %v", err)
			}
			ev, _ := EntityVerb(typ)
			if want := "loopbus.evt.sess-1." + ev; subj != want {
				t.Errorf("SubjectFor = %q, want %q", subj, want)
			}
			session, gotEV, err := ParseSubject(subj)
			if err != nil {
				t.Fatalf("ParseSubject(%q): %v", subj, err)
			}
			if session != "sess-1" || "loopbus."+gotEV != typ {
				t.Errorf("ParseSubject(%q) = %q, %q", subj, session, gotEV)
			}
		})
	}
	if got, want := SessionSubjects("sess-1"), "loopbus.evt.sess-1.>"; got != want {
		t.Errorf("SessionSubjects = %q, want %q", got, want)
	}
}

func TestSubjectFor(t *testing.T) {
	tests := []struct {
		name    string
		session string
		typ     string
		want    string
		wantErr error
	}{
		{name: "ok", session: "s_1", typ: TypeJobStarted, want: "loopbus.evt.s_1.job.started"},
		{name: "session with dot", session: "a.b", typ: TypeJobStarted, wantErr: ErrBadSessionID},
		{name: "wildcard session", session: "*", typ: TypeJobStarted, wantErr: ErrBadSessionID},
		{name: "empty session", session: "", typ: TypeJobStarted, wantErr: ErrBadSessionID},
		{name: "bad type", session: "s", typ: "job.started", wantErr: ErrBadType},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := SubjectFor(tt.session, tt.typ)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("SubjectFor error = %v, want %v", err, tt.wantErr)
			}
			if got != tt.want {
				t.Errorf("SubjectFor = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestParseSubject(t *testing.T) {
	tests := []struct {
		name        string
		subject     string
		wantSession string
		want        string
		wantErr     bool
	}{
		{name: "ok", subject: "loopbus.evt.s-1.step.completed", wantSession: "s-1", want: "step.completed"},
		{name: "unknown event is parsed", subject: "loopbus.evt.s.job.paused", wantSession: "s", want: "job.paused"},
		{name: "other prefix", subject: "loopbus.cmd.s.job.started", wantErr: true},
		{name: "prefix only", subject: "loopbus.evt", wantErr: true},
		{name: "no event", subject: "loopbus.evt.s", wantErr: true},
		{name: "no verb", subject: "loopbus.evt.s.job", wantErr: true},
		{name: "too many tokens", subject: "loopbus.evt.s.job.started.x", wantErr: true},
		{name: "session filter", subject: "loopbus.evt.s.>", wantErr: true},
		{name: "no prefix", subject: "s.job.started.x.y", wantErr: true},
		{name: "empty", subject: "", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			session, ev, err := ParseSubject(tt.subject)
			if (err != nil) != tt.wantErr {
				t.Fatalf("ParseSubject(%q) error = %v, wantErr %v", tt.subject, err, tt.wantErr)
			}
			if session != tt.wantSession || ev != tt.want {
				t.Errorf("ParseSubject(%q) = %q, %q, want %q, %q", tt.subject, session, ev, tt.wantSession, tt.want)
			}
		})
	}
}

func TestDeterministicID(t *testing.T) {
	hex32 := regexp.MustCompile(`^[0-9a-f]{32}$`)
	tests := []struct {
		name  string
		a, b  []string
		equal bool
	}{
		{"stable", []string{"s", TypeJobRequested, "draft", "1"}, []string{"s", TypeJobRequested, "draft", "1"}, true},
		{"other iteration", []string{"s", TypeJobRequested, "draft", "1"}, []string{"s", TypeJobRequested, "draft", "2"}, false},
		{"part split", []string{"ab", "c"}, []string{"a", "bc"}, false},
		{"joined parts", []string{"ab", "c"}, []string{"abc"}, false},
		{"order", []string{"a", "b"}, []string{"b", "a"}, false},
		{"empty part", []string{"a"}, []string{"a", ""}, false},
		{"no parts", nil, []string{""}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, b := DeterministicID(tt.a...), DeterministicID(tt.b...)
			if !hex32.MatchString(a) || !hex32.MatchString(b) {
				t.Errorf("ids %q, %q are not 32 hex digits", a, b)
			}
			if (a == b) != tt.equal {
				t.Errorf("DeterministicID(%q) = %q, DeterministicID(%q) = %q, want equal %v", tt.a, a, tt.b, b, tt.equal)
			}
		})
	}
}

func TestDigestAndShortHash(t *testing.T) {
	tests := []struct {
		name string
		got  string
		want string
	}{
		{"digest of nothing", Digest(nil), "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
		{"digest of abc", Digest([]byte("abc")), "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
		{"short hash", ShortHash(Digest([]byte("abc"))), "ba7816bf8f01cfea"},
		{"short hash without prefix", ShortHash("ba7816bf8f01cfea414140de5dae2223"), "ba7816bf8f01cfea"},
		{"short hash of short input", ShortHash("sha256:abc"), "abc"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.got != tt.want {
				t.Errorf("got %q, want %q", tt.got, tt.want)
			}
		})
	}
}

func TestContentHash(t *testing.T) {
	hex16 := regexp.MustCompile(`^[0-9a-f]{16}$`)
	a := testArtifact(t, "a.json", "s", `{"a":1}`)
	b := testArtifact(t, "b.json", "s", `{"b":2}`)
	renamed := b
	renamed.Name = "c.json"
	tests := []struct {
		name string
		arts []ArtifactRef
		want string // "" when any 16 hex digits will do
	}{
		{"one artifact", []ArtifactRef{a}, ShortHash(a.Digest)},
		{"two artifacts", []ArtifactRef{a, b}, ""},
		{"none", nil, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := ContentHash(tt.arts)
			if !hex16.MatchString(got) {
				t.Errorf("ContentHash = %q, want 16 hex digits", got)
			}
			if tt.want != "" && got != tt.want {
				t.Errorf("ContentHash = %q, want %q", got, tt.want)
			}
		})
	}
	two := ContentHash([]ArtifactRef{a, b})
	distinct := map[string]string{
		"a":    ContentHash([]ArtifactRef{a}),
		"b":    ContentHash([]ArtifactRef{b}),
		"a,b":  two,
		"b,a":  ContentHash([]ArtifactRef{b, a}),
		"a,c":  ContentHash([]ArtifactRef{a, renamed}),
		"none": ContentHash(nil),
	}
	seen := map[string]string{}
	for k, v := range distinct {
		if other, ok := seen[v]; ok {
			t.Errorf("ContentHash of %s and %s are both %q", k, other, v)
		}
		seen[v] = k
	}
	if again := ContentHash([]ArtifactRef{a, b}); again != two {
		t.Errorf("ContentHash not stable: %q then %q", two, again)
	}
}

// TestOnStreamSubject: OnStreamSubject says exactly whether a subject is
// the event's StreamSubject, for events and copies in a fork's history.
func TestOnStreamSubject(t *testing.T) {
	events := []Event{
		{Session: "s1", Type: TypeJobStarted},
		{Session: "s1", Type: TypeJobStarted, ForkOf: "s0"},
		{Session: "a-b_C9", Type: TypeSessionStarted, Step: "x"},
		{Session: "s.1", Type: TypeJobStarted},
		{Session: "", Type: TypeJobStarted},
		{Session: "s1", Type: "loopbus.job"},
		{Session: "s1", Type: "other.job.started"},
	}
	subjects := []string{
		"", "loopbus.evt", "loopbus.evt.", "loopbus.evt.s1", "loopbus.evt.s1.", "loopbus.evt.s1.job.started",
		"loopbus.evt.s1.job.started.x", "loopbus.evt.s1x.job.started", "loopbus.evt.s.job.started",
		"loopbus.evt.s1.history.job.started", "loopbus.evt.s1.history.job", "loopbus.evt.s1.historyjob.started",
		"loopbus.evt.a-b_C9.session.started", "loopbus.evt.s.1.job.started", "loopbus.evt..job.started",
		"loopbus.evts1.job.started", "xloopbus.evt.s1.job.started", "loopbus.evt.s1.job.startedx",
		"loopbus.evt.s1Xjob.started", "loopbus.evt.s1.historyXjob.started", "loopbus.evtXs1.job.started",
	}
	matched := 0
	for _, ev := range events {
		want, err := ev.StreamSubject()
		for _, subj := range subjects {
			if got := ev.OnStreamSubject(subj); got != (err == nil && subj == want) {
				t.Errorf("%+v on %q: OnStreamSubject %v, StreamSubject %q, %v", ev, subj, got, want, err)
			} else if got {
				matched++
			}
		}
	}
	if matched != 3 {
		t.Errorf("%d events on their own subject, want 3", matched)
	}
}

// TestSignalNames: hint is the info signal's name both ways; other verbs
// are their own names.
func TestSignalNames(t *testing.T) {
	if SignalVerb(HintVerb) != "info" || SignalName("info") != HintVerb {
		t.Errorf("hint and info: SignalVerb(hint) = %q, SignalName(info) = %q", SignalVerb(HintVerb), SignalName("info"))
	}
	for verb := range SignalTypes() {
		if verb != "info" && (SignalVerb(verb) != verb || SignalName(verb) != verb) {
			t.Errorf("%s: SignalVerb %q, SignalName %q", verb, SignalVerb(verb), SignalName(verb))
		}
		if _, ok := SignalTypes()[SignalVerb(SignalName(verb))]; !ok {
			t.Errorf("%s does not come back from its name", verb)
		}
	}
}
