#!/usr/bin/env bash
# Runs every fuzz target in BUILD/tests for SECS seconds each, starting from
# its seed corpus in tests/fuzz/corpus/NAME (copied, so runs never write
# into the source tree). Fails on the first crash.
set -euo pipefail
build=${1:?build dir}; secs=${2:-10}
root=$(cd "$(dirname "$0")/.." && pwd)
found=0
for f in "$build"/tests/fuzz_*; do
  [ -x "$f" ] || continue
  found=$((found + 1))
  name=$(basename "$f")
  work=$(mktemp -d)
  if [ -d "$root/tests/fuzz/corpus/$name" ]; then cp -r "$root/tests/fuzz/corpus/$name/." "$work/"; fi
  echo "fuzz: $name for ${secs}s"
  # Crash inputs land in $work/crash-*; on failure they are kept and named.
  "$f" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=0 \
    -artifact_prefix="$work/" "$work" >"$work.log" 2>&1 || {
      tail -50 "$work.log"; echo "fuzz: $name FAILED; inputs kept in $work"; ls "$work"/crash-* "$work"/leak-* "$work"/timeout-* 2>/dev/null; exit 1; }
  grep -E '^(#[0-9]+ +DONE|Done [0-9]+ runs)' "$work.log" | tail -1 || true
  rm -rf "$work" "$work.log"
done
[ "$found" -gt 0 ] || { echo "fuzz: no targets in $build/tests"; exit 1; }
echo "fuzz: $found targets passed"
