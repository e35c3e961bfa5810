#!/bin/sh
# Checks share/prometheus/kvtier-rules.yml with promtool (check rules, then
# the unit tests in kvtier-rules.test.yml: the docs' queries on series
# labelled as a real scrape labels them), and that every query
# docs/metrics.md gives is one of those rules' expressions, so a query a
# user copies from the docs has been run. Fails, never skips, when
# promtool is missing. Usage: promtool_rules.sh SOURCE_DIR
set -u
src="$1"
if ! command -v promtool >/dev/null 2>&1; then
    echo "FAIL: promtool not found; it comes with Debian's prometheus package:" \
         "run scripts/deps.sh (as root) to install it" >&2
    exit 1
fi
rules="$src/share/prometheus/kvtier-rules.yml"
promtool check rules "$rules" || { echo "FAIL: promtool check rules $rules" >&2; exit 1; }
(cd "$src/share/prometheus" && promtool test rules kvtier-rules.test.yml) ||
    { echo "FAIL: promtool test rules" >&2; exit 1; }
# Every `...` span of docs/metrics.md that reads as a query (it calls rate,
# sum or histogram_quantile) must be a rule's expression, to the byte.
n=0
queries=$(grep -o '`[^`]*\(rate\|histogram_quantile\)([^`]*`' "$src/docs/metrics.md" | tr -d '`')
[ -n "$queries" ] || { echo "FAIL: no queries found in docs/metrics.md" >&2; exit 1; }
echo "$queries" | while IFS= read -r q; do
    grep -qxF "        expr: $q" "$rules" ||
        { echo "FAIL: docs/metrics.md's query is no rule's expression (so untested): $q" >&2; exit 1; }
done || exit 1
echo "promtool rules ok"
