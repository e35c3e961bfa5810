#!/bin/sh
# cli_help.sh KVTIER - one rule for every command and subcommand: --help
# (or -h), anywhere among its arguments, prints its usage on stdout and
# exits 0 at once, running nothing (bench group used to run the whole
# bench); an option a command does not know names itself.
set -u
K=$1
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
rc=0
for c in "" demo serve stats config fsck plan replay trace "trace synth" pd "pd bootstrap" "pd prefill" "pd decode" \
         bench "bench copy" "bench index" "bench ssd" "bench group" "bench pd" "bench client" "bench engine"; do
    for h in --help -h "--json --help"; do
        # shellcheck disable=SC2086
        timeout 10 "$K" $c $h >"$T/out" 2>"$T/err"
        got=$?
        if [ $got -ne 0 ] || ! grep -qi "usage\|^kvtier [0-9]" "$T/out" || [ -s "$T/err" ]; then
            echo "cli_help: kvtier $c $h exited $got; stdout:"; cat "$T/out"; echo "stderr:"; cat "$T/err"
            rc=1
        fi
    done
done
for c in demo plan replay; do
    "$K" $c --nosuch >/dev/null 2>"$T/err" && { echo "cli_help: kvtier $c --nosuch exited 0"; rc=1; }
    grep -q -- "--nosuch" "$T/err" || { echo "cli_help: kvtier $c --nosuch does not name it:"; cat "$T/err"; rc=1; }
done
[ $rc -eq 0 ] && echo "cli_help: ok"
exit $rc
