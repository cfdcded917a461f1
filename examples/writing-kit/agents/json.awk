# json.awk: JSON string helpers shared by the writing-kit agents.
# jinit() must run first (in BEGIN). jesc(s) returns s as the body of a JSON
# string; jval(line) returns the escaped body of the string value on a
# "key": "value" line, or of a lone "value" line.
function jinit(    i) {
	for (i = 1; i < 32; i++) JESC[sprintf("%c", i)] = sprintf("\\u%04x", i)
	JESC["\b"] = "\\b"; JESC["\f"] = "\\f"; JESC["\n"] = "\\n"
	JESC["\r"] = "\\r"; JESC["\t"] = "\\t"
	JESC["\\"] = "\\\\"; JESC["\""] = "\\\""
}
function jesc(s,    out, i, n, c) {
	out = ""
	n = length(s)
	for (i = 1; i <= n; i++) {
		c = substr(s, i, 1)
		if (c in JESC) out = out JESC[c]
		else out = out c
	}
	return out
}
function jval(line) {
	sub(/^[ \t]*("[A-Za-z]+"[ \t]*:[ \t]*)?"/, "", line)
	sub(/"[ \t]*,?[ \t]*$/, "", line)
	return line
}
