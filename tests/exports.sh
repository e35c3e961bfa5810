#!/bin/sh
# libkvtier.so exports the public API and nothing else: every defined
# dynamic function or object symbol is kvt_<name>, never kvt__<name>
# (internal) or an unprefixed helper. Usage: exports.sh LIBKVTIER_SO
so=$1
[ -r "$so" ] || { echo "exports.sh: cannot read $so"; exit 1; }
syms=$(nm -D --defined-only "$so") || { echo "exports.sh: nm failed on $so"; exit 1; }
# nm types: T/t text, D/d data, B/b bss, R/r read-only, V/W weak, i ifunc.
public=$(printf '%s\n' "$syms" | awk '$2 ~ /^[TDBRVWi]$/ {print $3}')
bad=$(printf '%s\n' "$public" | grep -v '^kvt_[a-z0-9]' )
count=$(printf '%s\n' "$public" | grep -c '^kvt_[a-z0-9]')
if [ -n "$bad" ]; then
    echo "exports.sh: $so exports $(printf '%s\n' "$bad" | wc -l) symbols outside the public API:"
    printf '%s\n' "$bad" | head -20
    exit 1
fi
if [ "$count" -lt 50 ]; then
    echo "exports.sh: only $count kvt_ symbols exported from $so (the public API has more)"
    exit 1
fi
echo "exports ok: $count kvt_ symbols, nothing else"
