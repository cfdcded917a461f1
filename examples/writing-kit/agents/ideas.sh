#!/bin/sh
# ideas.sh: the "ideas" agent of the writing-kit example.
#
# Reads $LOOPBUS_INPUT_DIR/summary.json (as summarize.sh writes it: one
# member and one key point per line) and writes $LOOPBUS_OUTPUT_DIR/ideas.json:
#   {"ideas": [{"title", "hook", "angle"}, x3]}
# one member per line, so that kit.sh can read it with awk.
#
# Strings read from summary.json are kept in their escaped JSON form and
# only combined with plain text, so the output stays valid JSON.
#
# POSIX sh and awk only: no jq, no python, no API key.
set -eu

LC_ALL=C
export LC_ALL

die() {
	printf 'ideas.sh: %s\n' "$*" >&2
	exit 1
}

[ -n "${LOOPBUS_INPUT_DIR:-}" ] || die "LOOPBUS_INPUT_DIR is not set"
[ -n "${LOOPBUS_OUTPUT_DIR:-}" ] || die "LOOPBUS_OUTPUT_DIR is not set"

summary=$LOOPBUS_INPUT_DIR/summary.json
[ -f "$summary" ] || die "missing input $summary (the summary step's output)"

if [ -n "${LOOPBUS_FEEDBACK_FILE:-}" ] && [ -s "$LOOPBUS_FEEDBACK_FILE" ]; then
	printf 'ideas.sh: iteration %s; feedback from earlier iterations:\n' "${LOOPBUS_ITERATION:-?}" >&2
	cat "$LOOPBUS_FEEDBACK_FILE" >&2
fi

mkdir -p "$LOOPBUS_OUTPUT_DIR"
out=$LOOPBUS_OUTPUT_DIR/ideas.json
tmp=$LOOPBUS_OUTPUT_DIR/.ideas.json.tmp
trap 'rm -f "$tmp"' EXIT

# JSON helpers (jinit, jesc, jval), shared by the three agents.
json_awk=$(cat "$(dirname "$0")/json.awk")

ideas_awk=$(cat <<'EOF'
# nopunct drops trailing sentence punctuation (never part of an escape).
function nopunct(s) {
	sub(/[ \t]*[.!?;:,]+$/, "", s)
	return s
}
# short returns the first k words of s, without trailing punctuation. Words
# split on spaces, which never occur inside an escape sequence.
function short(s, k,    w, n, i, r) {
	n = split(nopunct(s), w, " ")
	r = w[1]
	for (i = 2; i <= n && i <= k; i++) r = r " " w[i]
	if (n > k) r = nopunct(r) "..."
	return r
}
BEGIN { jinit(); n = 0; inkp = 0; title = "" }
/^[ \t]*"title"[ \t]*:/ { title = jval($0); next }
/^[ \t]*"keyPoints"[ \t]*:[ \t]*\[[ \t]*$/ { inkp = 1; next }
inkp && /^[ \t]*\]/ { inkp = 0; next }
inkp && /^[ \t]*"/ { K[++n] = jval($0); next }
END {
	if (title == "" || n == 0) {
		print "ideas.sh: summary.json has no title or no keyPoints (expected one member per line, as summarize.sh writes)" > "/dev/stderr"
		exit 1
	}
	k1 = K[1]; k2 = K[(1 % n) + 1]; k3 = K[(2 % n) + 1]
	T[1] = "Why it matters: " short(k1, 7)
	H[1] = "Open with a familiar frustration, then make the promise: " nopunct(k1) "."
	A[1] = "Explainer: restate the core claim of \\\"" title "\\\" in plain words and give one everyday example."
	T[2] = "A story from the trenches: " short(k2, 7)
	H[2] = "Start with a short incident story whose ending proves the point: " nopunct(k2) "."
	A[2] = "Case study: walk through one concrete failure and show step by step how the idea would have helped."
	T[3] = "A checklist for teams: " short(k3, 7)
	H[3] = "Ask the reader whether this holds where they work: " nopunct(k3) "."
	A[3] = "Practical guide: turn the point into five small steps a team can try this week."
	printf "{\n  \"ideas\": [\n"
	for (i = 1; i <= 3; i++) {
		printf "    {\n"
		printf "      \"title\": \"%s\",\n", T[i]
		printf "      \"hook\": \"%s\",\n", H[i]
		printf "      \"angle\": \"%s\"\n", A[i]
		printf "    }%s\n", (i < 3 ? "," : "")
	}
	printf "  ]\n}\n"
}
EOF
)

awk "$json_awk
$ideas_awk" <"$summary" >"$tmp" || die "cannot derive ideas from $summary"
mv "$tmp" "$out"
printf 'ideas.sh: wrote %s\n' "$out" >&2
