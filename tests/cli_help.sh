#!/bin/sh
# cli_help.sh KVTIER - one rule for every command and subcommand: --help
# (or -h), anywhere among its arguments, prints its usage on stdout and
# exits 0 at once, running nothing (bench group used to run the whole
# bench); an argument a command does not take, an option missing its value
# and a value an option cannot take make it exit 2 at once, running
# nothing, with a message on stderr that names the argument (the usage
# alone does not say which one was wrong).
set -u
K=$1
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
rc=0
# Every command and subcommand (kvtier --help lists them), "" the top level.
IFS='|'
set -- "" demo serve stats config fsck plan replay trace "trace synth" pd "pd bootstrap" \
    "pd prefill" "pd decode" events cluster "cluster status" bench "bench copy" "bench index" \
    "bench ssd" "bench group" "bench pd" "bench client" "bench engine" "bench cluster" version
unset IFS
for c in "$@"; do
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
# refused WANT ARGS...: kvtier ARGS exits 2 (within the timeout: it runs
# nothing) and its stderr says WANT.
refused() {
    want=$1
    shift
    timeout 10 "$K" "$@" >"$T/out" 2>"$T/err"
    got=$?
    if [ $got -ne 2 ] || ! grep -qF -- "$want" "$T/err"; then
        echo "cli_help: kvtier $* exited $got; wanted 2 and \"$want\" on stderr, which says:"
        cat "$T/err"
        rc=1
    fi
}
# An option no command takes: also where a required option is missing
# (stats, events, cluster status) and after a good argument (fsck DIR).
for c in "$@" "fsck $T" "demo --server" "demo --cluster" "bench copy --device cuda"; do
    # shellcheck disable=SC2086
    refused --nosuch $c --nosuch
done
# An option given last, without its value: named as such, not as unknown.
for c in "demo --turns" "demo --server --model" "serve --socket" "stats --socket" \
         "config --file" "plan --trace" "replay --trace" "replay --model" "trace synth --out" \
         "pd bootstrap --port" "pd prefill --host" "pd decode --tokens" "events --endpoint" \
         "cluster status --redis" "bench copy --threads" "bench copy --device cuda --size-mb" \
         "bench index --blocks" "bench ssd --dir" "bench group --rounds" "bench pd --mib" \
         "bench client --rounds" "bench engine --rounds" "bench cluster --rounds"; do
    # shellcheck disable=SC2086
    refused "${c##* } needs a value" $c
done
# A value an option cannot take: the option and the value named.
for c in "demo --turns" "serve --tp" "stats --count" "plan --points" "replay --window" \
         "trace synth --requests" "pd prefill --tp" "events --count" "cluster status --timeout-ms" \
         "bench copy --threads" "bench copy --device cuda --size-mb" "bench index --rounds" \
         "bench ssd --size-mb" "bench group --rounds" "bench pd --rounds" "bench client --rounds" \
         "bench engine --rounds" "bench cluster --mib"; do
    # shellcheck disable=SC2086
    refused x9 $c x9
    grep -qF -- "${c##* }" "$T/err" || { echo "cli_help: kvtier $c x9 does not name ${c##* }:"; cat "$T/err"; rc=1; }
done
[ $rc -eq 0 ] && echo "cli_help: ok"
exit $rc
