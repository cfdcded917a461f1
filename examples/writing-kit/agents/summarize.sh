#!/bin/sh
# summarize.sh: the "summary" agent of the writing-kit example.
#
# Reads the one Markdown file in $LOOPBUS_INPUT_DIR and writes
# $LOOPBUS_OUTPUT_DIR/summary.json:
#   {"title", "wordCount", "headline", "keyPoints": [...], "source"}
# pretty-printed with one member (and one key point) per line, so that the
# later agents can read it with awk.
#
# POSIX sh and awk only: no jq, no python, no API key.
set -eu

LC_ALL=C
export LC_ALL

die() {
	printf 'summarize.sh: %s\n' "$*" >&2
	exit 1
}

[ -n "${LOOPBUS_INPUT_DIR:-}" ] || die "LOOPBUS_INPUT_DIR is not set"
[ -n "${LOOPBUS_OUTPUT_DIR:-}" ] || die "LOOPBUS_OUTPUT_DIR is not set"

[ -d "$LOOPBUS_INPUT_DIR" ] || die "input directory $LOOPBUS_INPUT_DIR does not exist"

# Find the one .md file.
input=
for f in "$LOOPBUS_INPUT_DIR"/*.md; do
	[ -f "$f" ] || continue
	[ -z "$input" ] || die "more than one .md file in $LOOPBUS_INPUT_DIR"
	input=$f
done
[ -n "$input" ] || die "no .md file in $LOOPBUS_INPUT_DIR"

if [ -n "${LOOPBUS_FEEDBACK_FILE:-}" ] && [ -s "$LOOPBUS_FEEDBACK_FILE" ]; then
	printf 'summarize.sh: iteration %s; feedback from earlier iterations:\n' "${LOOPBUS_ITERATION:-?}" >&2
	cat "$LOOPBUS_FEEDBACK_FILE" >&2
fi

mkdir -p "$LOOPBUS_OUTPUT_DIR"
out=$LOOPBUS_OUTPUT_DIR/summary.json
tmp=$LOOPBUS_OUTPUT_DIR/.summary.json.tmp
trap 'rm -f "$tmp"' EXIT

# JSON helpers (jinit, jesc, jval), shared by the three agents.
json_awk=$(cat "$(dirname "$0")/json.awk")

summary_awk=$(cat <<'EOF'
function trim(s) {
	sub(/^[ \t]+/, "", s)
	sub(/[ \t]+$/, "", s)
	return s
}
# clean removes inline Markdown: links and images keep their text, code
# spans and strong emphasis lose their markers; white space is collapsed.
function clean(s,    m) {
	while (match(s, /!?\[[^]]*\]\([^)]*\)/)) {
		m = substr(s, RSTART, RLENGTH)
		sub(/^!?\[/, "", m)
		sub(/\]\(.*$/, "", m)
		s = substr(s, 1, RSTART - 1) m substr(s, RSTART + RLENGTH)
	}
	gsub(/`/, "", s)
	gsub(/\*\*/, "", s)
	gsub(/[ \t]+/, " ", s)
	return trim(s)
}
# first_sentence ends at . ! or ? (plus closing quotes or brackets) followed
# by white space and something that can start a sentence.
function first_sentence(s,    rest, pos) {
	rest = s
	pos = 0
	while (match(rest, /[.!?][]"')]*[ \t]+/)) {
		if (substr(rest, RSTART + RLENGTH, 1) ~ /[A-Z0-9"'(\[]/)
			return trim(substr(s, 1, pos + RSTART + RLENGTH - 1))
		pos += RSTART + RLENGTH - 1
		rest = substr(rest, RSTART + RLENGTH)
	}
	return trim(s)
}
function endpara() {
	if (para != "") P[++np] = clean(para)
	para = ""
}
function heading_text(s) {
	sub(/^[ \t]*#+[ \t]*/, "", s)
	sub(/[ \t]+#+[ \t]*$/, "", s)
	return clean(s)
}
BEGIN { jinit(); np = 0; words = 0; fence = 0; para = ""; title = ""; anyheading = "" }
{ sub(/\r$/, ""); words += NF }
/^[ \t]*(```|~~~)/ { fence = !fence; endpara(); next }
fence { next }
/^[ \t]*#+([ \t]|$)/ {
	endpara()
	h = heading_text($0)
	if (title == "" && $0 ~ /^[ \t]*#([ \t]|$)/ && h != "") title = h
	if (anyheading == "" && h != "") anyheading = h
	next
}
/^[ \t]*$/ { endpara(); next }
/^[ \t]*<!--/ { next }
{
	t = $0
	gsub(/[ \t]/, "", t)
	if ((t ~ /^[-*_]+$/ && length(t) >= 3) || t ~ /^=+$/) { endpara(); next }
	line = $0
	sub(/^[ \t]*(>[ \t]*)+/, "", line)
	sub(/^[ \t]*([-*+]|[0-9]+[.)])[ \t]+/, "", line)
	line = trim(line)
	if (line != "") para = (para == "" ? line : para " " line)
}
END {
	endpara()
	src = ENVIRON["SUMMARY_SOURCE"]
	if (np == 0) {
		print "summarize.sh: no paragraph of text in " src > "/dev/stderr"
		exit 1
	}
	if (title == "") title = anyheading
	if (title == "") { title = src; sub(/\.md$/, "", title) }
	n = np < 5 ? np : 5
	printf "{\n"
	printf "  \"title\": \"%s\",\n", jesc(title)
	printf "  \"wordCount\": %d,\n", words
	printf "  \"headline\": \"%s\",\n", jesc(first_sentence(P[1]))
	printf "  \"keyPoints\": [\n"
	for (i = 1; i <= n; i++)
		printf "    \"%s\"%s\n", jesc(first_sentence(P[i])), (i < n ? "," : "")
	printf "  ],\n"
	printf "  \"source\": \"%s\"\n", jesc(src)
	printf "}\n"
}
EOF
)

SUMMARY_SOURCE=${input##*/}
export SUMMARY_SOURCE
awk "$json_awk
$summary_awk" <"$input" >"$tmp" || die "cannot summarize $input"
mv "$tmp" "$out"
printf 'summarize.sh: wrote %s\n' "$out" >&2
