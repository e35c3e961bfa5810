#!/bin/sh
# cli_demo_server.sh KVTIER - `kvtier demo --server --json` runs a server and
# four client processes (two TP-2 instances), SIGKILLs one instance, restarts
# it and the server; its report must show hits across processes, after each
# restart, KVT_ECONN seen while the server was away, a warm restart (blocks
# recovered from the SSD directory), and every loaded byte verified.
set -eu
K=$1
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
"$K" demo --server --json >"$T/out" 2>"$T/err" ||
    { echo "cli_demo_server: exit $?"; cat "$T/out" "$T/err"; exit 1; }
R=$(cat "$T/out")
# A JSON number field, or fail naming it.
num() {
    v=$(printf '%s' "$R" | sed -n 's/.*"'"$1"'":\([0-9][0-9]*\).*/\1/p')
    [ -n "$v" ] || { echo "cli_demo_server: no field $1 in: $R"; exit 1; }
    echo "$v"
}
positive() {
    [ "$(num "$1")" -gt 0 ] || { echo "cli_demo_server: $1 is 0 in: $R"; exit 1; }
}
zero() {
    [ "$(num "$1")" -eq 0 ] || { echo "cli_demo_server: $1 is not 0 in: $R"; exit 1; }
}
positive cross_process_hit_tokens
positive instance_restart_hit_tokens
positive server_restart_hit_tokens
positive server_restart_econn
positive recovered_blocks
positive verified_bytes
zero mismatches
zero failures
[ "$(num killed)" -eq 2 ] || { echo "cli_demo_server: killed != 2: $R"; exit 1; }
[ "$(num processes)" -eq 4 ] || { echo "cli_demo_server: processes != 4: $R"; exit 1; }
echo "cli_demo_server: ok"
