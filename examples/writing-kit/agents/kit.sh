#!/bin/sh
# kit.sh: the "writing-kit" agent (final step) of the writing-kit example.
#
# Reads $LOOPBUS_INPUT_DIR/summary.json and $LOOPBUS_INPUT_DIR/ideas.json (as
# summarize.sh and ideas.sh write them: one member per line) and writes
# $LOOPBUS_OUTPUT_DIR/writing-kit.json:
#   {"title", "summary": {"headline", "wordCount"}, "ideas": [...],
#    "outline": [{"heading", "points": [...]}, ...]}
#
# Strings read from the inputs are kept in their escaped JSON form and only
# combined with plain text, so the output stays valid JSON.
#
# POSIX sh and awk only: no jq, no python, no API key.
set -eu

LC_ALL=C
export LC_ALL

die() {
	printf 'kit.sh: %s\n' "$*" >&2
	exit 1
}

[ -n "${LOOPBUS_INPUT_DIR:-}" ] || die "LOOPBUS_INPUT_DIR is not set"
[ -n "${LOOPBUS_OUTPUT_DIR:-}" ] || die "LOOPBUS_OUTPUT_DIR is not set"

summary=$LOOPBUS_INPUT_DIR/summary.json
ideas=$LOOPBUS_INPUT_DIR/ideas.json
[ -f "$summary" ] || die "missing input $summary (the summary step's output)"
[ -f "$ideas" ] || die "missing input $ideas (the ideas step's output)"

if [ -n "${LOOPBUS_FEEDBACK_FILE:-}" ] && [ -s "$LOOPBUS_FEEDBACK_FILE" ]; then
	printf 'kit.sh: iteration %s; feedback from earlier iterations:\n' "${LOOPBUS_ITERATION:-?}" >&2
	cat "$LOOPBUS_FEEDBACK_FILE" >&2
fi

mkdir -p "$LOOPBUS_OUTPUT_DIR"
out=$LOOPBUS_OUTPUT_DIR/writing-kit.json
tmp=$LOOPBUS_OUTPUT_DIR/.writing-kit.json.tmp
trap 'rm -f "$tmp"' EXIT

# JSON helpers (jinit, jesc, jval), shared by the three agents.
json_awk=$(cat "$(dirname "$0")/json.awk")

kit_awk=$(cat <<'EOF'
function nopunct(s) {
	sub(/[ \t]*[.!?;:,]+$/, "", s)
	return s
}
function short(s, k,    w, n, i, r) {
	n = split(nopunct(s), w, " ")
	r = w[1]
	for (i = 2; i <= n && i <= k; i++) r = r " " w[i]
	if (n > k) r = nopunct(r) "..."
	return r
}
# points prints a JSON array of already escaped strings P[1..n].
function points(P, n,    i, s) {
	s = "["
	for (i = 1; i <= n; i++) s = s (i > 1 ? ", " : "") "\"" P[i] "\""
	return s "]"
}
function section(heading, P, n, last) {
	printf "    {\"heading\": \"%s\", \"points\": %s}%s\n", heading, points(P, n), (last ? "" : ",")
}
BEGIN { jinit(); nk = 0; ni = 0; nl = 0; inkp = 0; inideas = 0; depth = 0 }
# summary.json
FILENAME == ARGV[1] && /^[ \t]*"title"[ \t]*:/ { title = jval($0); next }
FILENAME == ARGV[1] && /^[ \t]*"headline"[ \t]*:/ { headline = jval($0); next }
FILENAME == ARGV[1] && /^[ \t]*"source"[ \t]*:/ { source = jval($0); next }
FILENAME == ARGV[1] && /^[ \t]*"wordCount"[ \t]*:/ {
	wc = $0
	sub(/^[^:]*:[ \t]*/, "", wc)
	sub(/[ \t]*,?[ \t]*$/, "", wc)
	next
}
FILENAME == ARGV[1] && /^[ \t]*"keyPoints"[ \t]*:[ \t]*\[[ \t]*$/ { inkp = 1; next }
FILENAME == ARGV[1] && inkp && /^[ \t]*\]/ { inkp = 0; next }
FILENAME == ARGV[1] && inkp && /^[ \t]*"/ { K[++nk] = jval($0); next }
# ideas.json: copy the lines of the "ideas" array, note each idea's title.
FILENAME == ARGV[2] && !inideas && /^[ \t]*"ideas"[ \t]*:[ \t]*\[[ \t]*$/ { inideas = 1; next }
FILENAME == ARGV[2] && inideas && depth == 0 && /^[ \t]*\][ \t]*,?[ \t]*$/ { inideas = 0; next }
FILENAME == ARGV[2] && inideas {
	L[++nl] = $0
	if (/^[ \t]*\{/) depth++
	if (/^[ \t]*\}/) depth--
	if (depth == 1 && /^[ \t]*"title"[ \t]*:/) IT[++ni] = jval($0)
	next
}
END {
	if (title == "" || headline == "" || wc !~ /^[0-9]+$/ || nk == 0) {
		print "kit.sh: summary.json lacks title, headline, wordCount or keyPoints (expected one member per line, as summarize.sh writes)" > "/dev/stderr"
		exit 1
	}
	if (ni == 0) {
		print "kit.sh: ideas.json has no ideas (expected one member per line, as ideas.sh writes)" > "/dev/stderr"
		exit 1
	}
	printf "{\n"
	printf "  \"title\": \"%s\",\n", title
	printf "  \"summary\": {\n"
	printf "    \"headline\": \"%s\",\n", headline
	printf "    \"wordCount\": %d\n", wc
	printf "  },\n"
	printf "  \"ideas\": [\n"
	for (i = 1; i <= nl; i++) print "  " L[i]
	printf "  ],\n"
	printf "  \"outline\": [\n"
	split("", P)
	P[1] = headline
	P[2] = "Set the scene: what the reader loses today without this."
	if (source != "") P[3] = "Source: " source " (" wc " words)."
	section("Introduction", P, source != "" ? 3 : 2, 0)
	for (i = 1; i <= nk; i++) {
		split("", P)
		P[1] = K[i]
		P[2] = "Give one concrete example."
		section("Point " i ": " short(K[i], 6), P, 2, 0)
	}
	split("", P)
	for (i = 1; i <= ni; i++) P[i] = "Angle: " IT[i]
	section("Ways to develop the piece", P, ni, 0)
	split("", P)
	P[1] = "Return to the opening claim: " nopunct(headline) "."
	P[2] = "End with one step the reader can take this week."
	section("Conclusion", P, 2, 1)
	printf "  ]\n"
	printf "}\n"
}
EOF
)

# A relative operand such as a=b/summary.json would be taken as an awk
# variable assignment; ./a=b/summary.json is not.
case $summary in /*) ;; *) summary=./$summary ideas=./$ideas ;; esac
awk "$json_awk
$kit_awk" "$summary" "$ideas" >"$tmp" || die "cannot build the writing kit"
mv "$tmp" "$out"
printf 'kit.sh: wrote %s\n' "$out" >&2
