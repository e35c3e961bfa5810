#!/bin/sh
# cli_serve.sh KVTIER - `kvtier serve` as an operator runs it: it listens on
# a 0600 socket, a second server on the same socket is refused naming the
# first one's pid, a missing --socket is a usage error, and SIGTERM stops it
# with exit 0 within 5 s, removing the socket.
set -eu
K=$1
T=$(mktemp -d)
SRV=
trap '[ -n "$SRV" ] && kill -9 "$SRV" 2>/dev/null; rm -rf "$T"' EXIT
S="$T/node.sock"
"$K" serve --socket "$S" --set cpu_capacity=16MiB --set huge_pages=false 2>"$T/log" &
SRV=$!
i=0
until [ -S "$S" ]; do
    i=$((i + 1))
    [ $i -lt 100 ] || { echo "cli_serve: no socket"; cat "$T/log"; exit 1; }
    sleep 0.1
done
[ "$(stat -c %a "$S")" = 600 ] || { echo "cli_serve: socket mode $(stat -c %a "$S")"; exit 1; }
if "$K" serve --socket "$S" --set cpu_capacity=16MiB 2>"$T/second"; then
    echo "cli_serve: a second server started"; exit 1
fi
grep -q "held by another kvtier server (pid $SRV" "$T/second" ||
    { echo "cli_serve: refusal does not name pid $SRV:"; cat "$T/second"; exit 1; }
rc=0
"$K" serve >/dev/null 2>&1 || rc=$?
[ $rc -eq 2 ] || { echo "cli_serve: serve without --socket exited $rc"; exit 1; }
kill -TERM "$SRV"
i=0
while kill -0 "$SRV" 2>/dev/null; do
    i=$((i + 1))
    [ $i -lt 50 ] || { echo "cli_serve: SIGTERM did not stop it in 5 s"; exit 1; }
    sleep 0.1
done
wait "$SRV" || { echo "cli_serve: exit status $?"; cat "$T/log"; exit 1; }
SRV=
[ ! -e "$S" ] || { echo "cli_serve: socket left behind"; exit 1; }
grep -q "stopped" "$T/log" || { echo "cli_serve: no stop line"; cat "$T/log"; exit 1; }
echo "cli_serve: ok"
