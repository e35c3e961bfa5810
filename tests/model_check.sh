#!/bin/sh
# model_check.sh MODEL WORKDIR - checks the Promela model of the step
# protocol (docs/model/step.pml) with spin: an exhaustive search must find
# no assertion violation and no invalid end state (a wait that never ends);
# and the model with its seeded bug (-DSEEDED_BUG: the leader applies
# before its members acknowledged) must fail, so a check that silently
# checks nothing cannot pass. Exit 0 pass, 1 fail (also without spin: a
# check that is not run is not a pass).
set -eu
model=$1
work=$2
if ! command -v spin >/dev/null 2>&1; then
  echo "model_check: FAIL: spin is not installed (Debian package spin; run scripts/deps.sh)"
  exit 1
fi
mkdir -p "$work"
cp "$model" "$work/model.pml"
cd "$work"

# One search: spin -a, compile the verifier (compressed states, a 2 GiB
# memory ceiling: the model needs ~300 MiB), run it; prints its report.
search() {
  rm -f pan pan.* model.pml.trail
  spin "$@" -a model.pml >/dev/null
  ${CC:-cc} -O2 -w -DSAFETY -DCOLLAPSE -DMEMLIM=2048 -o pan pan.c
  ./pan -m200000 2>&1 || true
}

out=$(search)
echo "$out" | grep -E "errors:|states, stored|pan:" || true
if ! echo "$out" | grep -q "errors: 0"; then
  echo "model_check: FAIL: spin found a violation in $model; the trail:"
  spin -t -p model.pml | tail -60
  exit 1
fi
if echo "$out" | grep -q "Search not completed\|out of memory"; then
  echo "model_check: FAIL: the search did not complete"
  exit 1
fi

out=$(search -DSEEDED_BUG)
if echo "$out" | grep -q "errors: 0"; then
  echo "model_check: FAIL: spin did not find the seeded bug (-DSEEDED_BUG): the model checks nothing"
  exit 1
fi
echo "model_check: seeded bug found as it must be:"
echo "$out" | grep -E "assertion violated|errors:" | head -2
echo "model_check: OK"
