#!/bin/sh
# Runs every test in tests/; exits non-zero if any fails.
fail=0
for t in tests/*.sh; do
	if sh "$t"; then echo "ok   $t"; else echo "FAIL $t"; fail=1; fi
done
exit $fail
