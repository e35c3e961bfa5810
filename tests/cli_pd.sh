#!/bin/sh
# cli_pd.sh KVTIER TRANSPORT - `kvtier pd` as an operator runs it: a
# bootstrap service, two prefill ranks (TP 2, page 16) and four decode ranks
# (TP 4, page 4), each its own process on 127.0.0.1. Passes when every
# decode rank reports Success with 0 mismatching bytes and every prefill
# rank Success, in --json.
set -eu
K=$1
TRANSPORT=${2:-tcp}
T=$(mktemp -d)
BS=
BS2=
trap '[ -n "$BS" ] && kill "$BS" 2>/dev/null; [ -n "$BS2" ] && kill "$BS2" 2>/dev/null; rm -rf "$T"' EXIT
export KVTIER_PD_QUIET=1 UCX_TLS=${UCX_TLS:-tcp}
# bootstrap_port OUT: the port of the bootstrap writing OUT, once it
# listens (10 s).
bootstrap_port() {
    i=0
    until grep -q listening "$1" 2>/dev/null; do
        i=$((i + 1))
        [ $i -lt 100 ] || { echo "cli_pd: the bootstrap did not start:" >&2; cat "$1" >&2; exit 1; }
        sleep 0.1
    done
    sed -n 's/.*127\.0\.0\.1:\([0-9]*\) .*/\1/p' "$1"
}
"$K" pd bootstrap --port 0 --seconds 120 >"$T/bs" &
BS=$!
PORT=$(bootstrap_port "$T/bs")
PIDS=
for r in 0 1; do
    "$K" pd prefill --bootstrap-port "$PORT" --tp 2 --rank $r --transport "$TRANSPORT" --seconds 60 --json >"$T/p$r" &
    PIDS="$PIDS $!"
done
for r in 0 1 2 3; do
    "$K" pd decode --bootstrap-port "$PORT" --tp 4 --rank $r --page 4 --transport "$TRANSPORT" --seconds 60 --json >"$T/d$r" &
    PIDS="$PIDS $!"
done
rc=0
for p in $PIDS; do wait "$p" || rc=1; done
for f in "$T"/p0 "$T"/p1 "$T"/d0 "$T"/d1 "$T"/d2 "$T"/d3; do
    cat "$f"
    grep -q '"state":"Success"' "$f" || { echo "cli_pd: $(basename "$f") did not succeed"; rc=1; }
done
for f in "$T"/d0 "$T"/d1 "$T"/d2 "$T"/d3; do
    grep -q '"mismatching_bytes":0,' "$f" || { echo "cli_pd: $(basename "$f") has wrong bytes"; rc=1; }
done
# A prompt bigger than the machine is refused at once, naming the sizes,
# instead of running past --seconds (1 Mi tokens of llama3-70b: ~340 GB).
t0=$(date +%s)
big=0
"$K" pd prefill --bootstrap-port "$PORT" --tokens 1048576 --model llama3-70b --seconds 1 \
    --transport "$TRANSPORT" >/dev/null 2>"$T/big" || big=$?
[ $big -eq 1 ] && grep -q "need [0-9]* bytes of emulated engine memory" "$T/big" &&
[ $(( $(date +%s) - t0 )) -le 5 ] || { echo "cli_pd: a huge prompt exited $big:"; cat "$T/big"; rc=1; }
# --secret-file: the secret read from a file on every end (so it never
# shows in ps); an end holding another file is refused at once, naming the
# secret; a short file and both options are usage errors naming them.
head -c 32 /dev/urandom >"$T/sec"
head -c 32 /dev/urandom >"$T/other"
head -c 8 /dev/urandom >"$T/short"
"$K" pd bootstrap --port 0 --seconds 120 --secret-file "$T/sec" >"$T/bs2" &
BS2=$!
P2=$(bootstrap_port "$T/bs2")
"$K" pd prefill --bootstrap-port "$P2" --secret-file "$T/sec" --transport "$TRANSPORT" --seconds 60 --json >"$T/sp" &
SP=$!
"$K" pd decode --bootstrap-port "$P2" --secret-file "$T/sec" --page 4 --transport "$TRANSPORT" --seconds 60 --json >"$T/sd" || rc=1
wait "$SP" || rc=1
grep -q '"state":"Success"' "$T/sp" && grep -q '"mismatching_bytes":0,' "$T/sd" ||
    { echo "cli_pd: --secret-file hand-off:"; cat "$T/sp" "$T/sd"; rc=1; }
bad=0
"$K" pd decode --bootstrap-port "$P2" --secret-file "$T/other" --page 4 --transport "$TRANSPORT" \
    --seconds 10 >/dev/null 2>"$T/wrong" || bad=$?
[ $bad -eq 1 ] && grep -q "hold different secrets" "$T/wrong" ||
    { echo "cli_pd: another secret file exited $bad:"; cat "$T/wrong"; rc=1; }
bad=0
"$K" pd prefill --bootstrap-port "$P2" --secret-file "$T/short" 2>"$T/short.err" || bad=$?
[ $bad -eq 2 ] && grep -q "holds 8 bytes (16..1024)" "$T/short.err" ||
    { echo "cli_pd: a short secret file exited $bad:"; cat "$T/short.err"; rc=1; }
bad=0
"$K" pd prefill --bootstrap-port "$P2" --secret-file "$T/sec" --secret 0123456789abcdefg 2>"$T/both" || bad=$?
[ $bad -eq 2 ] && grep -q "give one of --secret and --secret-file" "$T/both" ||
    { echo "cli_pd: both secrets exited $bad:"; cat "$T/both"; rc=1; }
[ $rc -eq 0 ] && echo "cli_pd: all ranks Success, every byte verified ($TRANSPORT)"
exit $rc
