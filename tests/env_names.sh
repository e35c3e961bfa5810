#!/bin/sh
# env_names.sh KVTIER SRCDIR - every KVTIER_ environment name that the
# sources read (a quoted "KVTIER_X") or the docs mention is accepted by the
# environment loader: either an option or a listed non-option variable. A
# name missing from both makes every kvtier command refuse to start ("is not
# a kvtier option"), which is how KVTIER_CUDART from docs/gpu.md once broke
# `kvtier serve`.
set -eu
K=$1
S=$2
names=$( (grep -rhoE '"KVTIER_[A-Z][A-Z0-9_]*[A-Z0-9]"' "$S/src" "$S/include" "$S/python/kvtier" |
          tr -d '"'
          grep -rhoE 'KVTIER_[A-Z][A-Z0-9_]*[A-Z0-9]' "$S/docs" "$S/README.md") | sort -u)
n=0
bad=0
for name in $names; do
    n=$((n + 1))
    out=$(env "$name=1" "$K" config --dump 2>&1 >/dev/null || true)
    case "$out" in
    *"not a kvtier option"*)
        echo "env_names: $name is read or documented but the environment loader refuses it"
        bad=1 ;;
    esac
done
[ "$n" -ge 10 ] || { echo "env_names: only $n names found under $S"; exit 1; }
# The check itself must be able to fail: a typo is still refused.
out=$(env KVTIER_NO_SUCH_NAME=1 "$K" config --dump 2>&1 >/dev/null || true)
case "$out" in
*"KVTIER_NO_SUCH_NAME is not a kvtier option"*) ;;
*) echo "env_names: a misspelt KVTIER_ variable is no longer refused: $out"; exit 1 ;;
esac
[ "$bad" -eq 0 ] || exit 1
echo "env_names: ok ($n names)"
