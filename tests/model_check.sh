#!/bin/sh
# model_check.sh MODEL WORKDIR [VARIANT...] - checks a Promela model of the
# rank-group protocol (docs/model/*.pml) with spin. Each VARIANT is
#   ok[:FLAGS]   an exhaustive search with FLAGS (comma-separated -D
#                options) must find no assertion violation and no invalid
#                end state (a wait that never ends), and must complete;
#   bug:FLAGS    the model with a seeded bug must FAIL: so a check that
#                silently checks nothing cannot pass.
# Without variants: "ok" and "bug:-DSEEDED_BUG" (step.pml's seeded bug: the
# leader applies before its members acknowledged). Exit 0 pass, 1 fail (also
# without spin: a check that is not run is not a pass).
set -eu
model=$1
work=$2
shift 2
[ $# -gt 0 ] || set -- ok bug:-DSEEDED_BUG
if ! command -v spin >/dev/null 2>&1; then
  echo "model_check: FAIL: spin is not installed (Debian package spin; run scripts/deps.sh)"
  exit 1
fi
mkdir -p "$work"
cp "$model" "$work/model.pml"
cd "$work"

# One search: spin -a, compile the verifier (compressed states, a 2 GiB
# memory ceiling: step.pml needs ~300 MiB), run it; prints its report. $opt:
# -O2 for full searches; a seeded bug is found in a few thousand states, so
# its verifier is compiled without optimisation (the compile is its cost).
search() {
  rm -f pan pan.* model.pml.trail
  spin "$@" -a model.pml >/dev/null
  ${CC:-cc} $opt -w -DSAFETY -DCOLLAPSE -DMEMLIM=2048 -o pan pan.c
  ./pan -m200000 2>&1 || true
}

for v in "$@"; do
  kind=${v%%:*}
  flags=
  case $v in *:*) flags=$(echo "${v#*:}" | tr ',' ' ') ;; esac
  opt=-O2
  [ "$kind" = bug ] && opt=-O0
  # shellcheck disable=SC2086 # flags are words
  out=$(search $flags)
  case $kind in
  ok)
    echo "model_check: $model ${flags:-(as is)}:"
    echo "$out" | grep -E "errors:|states, stored|pan:" || true
    if ! echo "$out" | grep -q "errors: 0"; then
      echo "model_check: FAIL: spin found a violation in $model ${flags}; the trail:"
      # shellcheck disable=SC2086
      spin $flags -t -p model.pml | tail -60
      exit 1
    fi
    if echo "$out" | grep -q "Search not completed\|out of memory"; then
      echo "model_check: FAIL: the search of $model ${flags} did not complete"
      exit 1
    fi
    ;;
  bug)
    if echo "$out" | grep -q "errors: 0"; then
      echo "model_check: FAIL: spin did not find the seeded bug ($flags): the model checks nothing"
      exit 1
    fi
    echo "model_check: seeded bug $flags found as it must be:"
    echo "$out" | grep -E "^pan:1:|errors:" | head -2
    ;;
  *)
    echo "model_check: FAIL: unknown variant $v (ok[:FLAGS] or bug:FLAGS)"
    exit 1
    ;;
  esac
done
echo "model_check: OK"
