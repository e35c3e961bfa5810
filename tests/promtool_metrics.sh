#!/bin/sh
# Validates the Prometheus exposition with promtool: `test_conc_metrics
# --dump` (a cache with an SSD tier after real stores and loads, plus the
# node server's families) piped through `promtool check metrics`. Fails if
# promtool says anything at all (its lint findings included), and fails,
# never skips, when promtool is missing.
# Usage: promtool_metrics.sh PATH/TO/test_conc_metrics
set -u
bin="$1"
if ! command -v promtool >/dev/null 2>&1; then
    echo "FAIL: promtool not found; it comes with Debian's prometheus package:" \
         "run scripts/deps.sh (as root) to install it" >&2
    exit 1
fi
out=$(mktemp) || exit 1
trap 'rm -f "$out" "$out.check"' EXIT
if ! "$bin" --dump >"$out"; then
    echo "FAIL: $bin --dump failed" >&2
    exit 1
fi
if ! grep -q '^kvtier_lookup_duration_seconds_bucket{geometry="g[0-9a-f]*",le="+Inf"}' "$out"; then
    echo "FAIL: the dump has no lookup histogram:" >&2
    cat "$out" >&2
    exit 1
fi
promtool check metrics <"$out" >"$out.check" 2>&1
rc=$?
if [ "$rc" -ne 0 ] || [ -s "$out.check" ]; then
    echo "FAIL: promtool check metrics (exit $rc) says:" >&2
    cat "$out.check" >&2
    exit 1
fi
echo "promtool check metrics: $(grep -c '^# TYPE' "$out") families, no findings"
