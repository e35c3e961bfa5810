#!/usr/bin/env bash
# Runs every fuzz target in BUILD/tests for SECS seconds each, starting from
# its seed corpus in tests/fuzz/corpus/NAME (copied, so runs never write
# into the source tree). Fails on the first crash.
#
# Each target runs unsymbolized (ASAN_OPTIONS=symbolize=0), as on a fresh
# Debian machine that has neither llvm-symbolizer nor libc6-dbg: a leak
# suppression that names a function would match here on a development
# machine and fail there, so running unsymbolized everywhere makes that
# class of failure show up on every machine. An input that fails is then
# run again symbolized, so the report a person reads names functions.
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
  ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}symbolize=0" \
  "$f" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=0 \
    -artifact_prefix="$work/" "$work" >"$work.log" 2>&1 || {
      tail -50 "$work.log"; echo "fuzz: $name FAILED; inputs kept in $work"
      for a in "$work"/crash-* "$work"/leak-* "$work"/timeout-*; do
        [ -e "$a" ] || continue
        echo "fuzz: $name again on $a, symbolized:"
        "$f" -timeout=10 -rss_limit_mb=2048 "$a" 2>&1 | tail -60 || true
      done
      exit 1; }
  grep -E '^(#[0-9]+ +DONE|Done [0-9]+ runs)' "$work.log" | tail -1 || true
  rm -rf "$work" "$work.log"
done
[ "$found" -gt 0 ] || { echo "fuzz: no targets in $build/tests"; exit 1; }
echo "fuzz: $found targets passed"
