#!/bin/sh
# cli_serve.sh KVTIER - `kvtier serve` as an operator runs it: it listens on
# a 0600 socket, a second server on the same socket is refused naming the
# first one's pid, a missing --socket is a usage error, `kvtier stats`
# reports its figures given only the socket (--json, --watch bounded by
# --count and by SIGINT), one section per geometry and the totals, saying
# which geometries it holds when asked for another (never making a tier:
# it does not attach), and
# the server logs its attach, --layers beyond the model's is refused, and
# SIGTERM stops it with exit 0 within 5 s, removing the socket. A server
# with no --model serves any geometry: stats before any attach says so,
# --tp without --model is a usage error, and the model preset's clients
# (two TP slices) attach to it.
set -eu
K=$1
HERE=$(cd "$(dirname "$0")" && pwd)
# attach SOCKET TP: an engine of the tiny preset at TP slice TP attaches
# (the Python client over this build's library) and detaches. In a
# sanitizer build Python loads the library with the sanitizer's runtime
# preloaded (leak checks off: they would report the interpreter's).
LIB="$(dirname "$K")/libkvtier.so"
PRE=
if ldd "$LIB" 2>/dev/null | grep -q libasan; then
    PRE=$(gcc -print-file-name=libasan.so)
elif ldd "$LIB" 2>/dev/null | grep -q libtsan; then
    PRE=$(gcc -print-file-name=libtsan.so)
fi
attach() {
    LD_PRELOAD="$PRE" ASAN_OPTIONS=detect_leaks=0 TSAN_OPTIONS=report_bugs=0 KVTIER_LIB="$LIB" \
        PYTHONPATH="$HERE/../python" /usr/bin/python3 -c '
import sys, kvtier
from kvtier.config import Geometry
with Geometry.preset("tiny", 16, int(sys.argv[2])) as g:
    kvtier.Client(sys.argv[1], g, timeout_ms=5000).close()' "$1" "$2"
}
T=$(mktemp -d)
SRV=
trap '[ -n "$SRV" ] && kill -9 "$SRV" 2>/dev/null; rm -rf "$T"' EXIT
# wait_for PATH LOG: until PATH is a socket (10 s), else fail showing LOG.
wait_for() {
    i=0
    until [ -S "$1" ]; do
        i=$((i + 1))
        [ $i -lt 100 ] || { echo "cli_serve: no socket $1"; cat "$2"; exit 1; }
        sleep 0.1
    done
}
S="$T/node.sock"
"$K" serve --socket "$S" --model tiny --tp 2 --set cpu_capacity=16MiB --set huge_pages=false \
    --set "server_quotas=kvtier-=8MiB; -=1MiB" 2>"$T/log" &
SRV=$!
wait_for "$S" "$T/log"
[ "$(stat -c %a "$S")" = 600 ] || { echo "cli_serve: socket mode $(stat -c %a "$S")"; exit 1; }
if "$K" serve --socket "$S" --set cpu_capacity=16MiB 2>"$T/second"; then
    echo "cli_serve: a second server started"; exit 1
fi
grep -q "held by another kvtier server (pid $SRV" "$T/second" ||
    { echo "cli_serve: refusal does not name pid $SRV:"; cat "$T/second"; exit 1; }
# kvtier stats: one JSON object with the server's figures.
"$K" stats --socket "$S" --json >"$T/stats.json" 2>"$T/stats.err" ||
    { echo "cli_serve: stats failed"; cat "$T/stats.err"; exit 1; }
[ "$(wc -l <"$T/stats.json")" -eq 1 ] || { echo "cli_serve: stats --json is not one line"; exit 1; }
grep -q '^{"socket":"'"$S"'","geometries":\[{"geometry":"g[0-9a-f]\{16\}","num_layers":4,' "$T/stats.json" &&
grep -q '"lookups":0,' "$T/stats.json" &&
grep -Eq '"cpu_blocks_total":[1-9][0-9]*,' "$T/stats.json" &&
grep -Eq '"block_bytes":[1-9][0-9]*,' "$T/stats.json" &&
grep -q '"totals":{"geometries":1,"cpu_bytes_used":0,"cpu_bytes_capacity":[1-9][0-9]*,"lookups":0,.*"hit_rate":0.0000},"quotas":\[{"prefix":"kvtier-","limit_bytes":8388608,"used_bytes":0,"limited_blocks":0,"evicted_blocks":0},{"prefix":"-","limit_bytes":1048576,.*}\],"server":{"version":"[0-9][0-9.]*","pid":'"$SRV"',"uptime_ms":[0-9][0-9]*,"clients":0,"max_clients":64,"geometries":1,"max_geometries":[0-9][0-9]*,"cpu_capacity_bytes":16777216,"metrics_port":0}}$' "$T/stats.json" ||
    { echo "cli_serve: stats --json:"; cat "$T/stats.json"; exit 1; }
# stats needs only the socket; a geometry given that the server does not
# hold is an error naming the ones it holds.
rc=0
"$K" stats --socket "$S" --tp 1 >/dev/null 2>"$T/geo" || rc=$?
[ $rc -eq 1 ] && grep -q "the server holds no tier for geometry g[0-9a-f]\{16\} (4 layers, .*; it holds: g[0-9a-f]\{16\}" "$T/geo" ||
    { echo "cli_serve: stats --tp 1 against a --tp 2 server exited $rc:"; cat "$T/geo"; exit 1; }
# --watch --count 2: two reports, a second apart.
"$K" stats --socket "$S" --watch --count 2 >"$T/watch" 2>&1 ||
    { echo "cli_serve: stats --watch failed"; cat "$T/watch"; exit 1; }
[ "$(grep -c "^kvtier server $S" "$T/watch")" -eq 2 ] && grep -q "CPU tier" "$T/watch" &&
[ "$(grep -c "^  server       version [0-9][0-9.]*, pid $SRV, up 0d 00:0[0-9]:[0-5][0-9]; 0 clients attached (of 64); 1 of [0-9]* geometries; CPU tier 16.0 MiB; metrics port none$" "$T/watch")" -eq 2 ] &&
[ "$(grep -c "^  kvtier-  *0.0 / 8.0 MiB (0.0%); 0 own blocks evicted for room, 0 blocks refused at the quota$" "$T/watch")" -eq 2 ] ||
    { echo "cli_serve: stats --watch --count 2:"; cat "$T/watch"; exit 1; }
# --watch until SIGINT: exits 0 at once.
"$K" stats --socket "$S" --watch --json >"$T/watch2" 2>&1 &
W=$!
i=0
until [ -s "$T/watch2" ]; do
    i=$((i + 1))
    [ $i -lt 100 ] || { echo "cli_serve: stats --watch printed nothing"; exit 1; }
    sleep 0.1
done
kill -INT "$W"
wait "$W" || { echo "cli_serve: stats --watch exited $? on SIGINT"; exit 1; }
rc=0
"$K" stats >/dev/null 2>&1 || rc=$?
[ $rc -eq 2 ] || { echo "cli_serve: stats without --socket exited $rc"; exit 1; }
rc=0
"$K" stats --socket "$T/none.sock" >/dev/null 2>"$T/none" || rc=$?
[ $rc -eq 1 ] && grep -q "none.sock" "$T/none" ||
    { echo "cli_serve: stats on no server exited $rc:"; cat "$T/none"; exit 1; }
# stats of the server's own geometry; then an engine's attach: logged at info.
"$K" stats --socket "$S" --model tiny --tp 2 >"$T/own" 2>&1 &&
grep -q "^geometry g[0-9a-f]\{16\}: 4 layers" "$T/own" ||
    { echo "cli_serve: stats --model tiny --tp 2 failed"; cat "$T/own"; exit 1; }
attach "$S" 2 || { echo "cli_serve: an engine did not attach"; exit 1; }
# --layers (a pipeline-parallel stage's share) beyond the model's is refused.
rc=0
"$K" serve --socket "$T/pp.sock" --model tiny --layers 5 >/dev/null 2>"$T/layers" || rc=$?
[ $rc -eq 1 ] && grep -q "layers 5: the model has 4 layers" "$T/layers" ||
    { echo "cli_serve: serve --layers 5 of tiny exited $rc:"; cat "$T/layers"; exit 1; }
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
# Watchers (kvtier stats) never attach: a --watch every second does not
# fill the log. An
# engine's attach (a geometry of its own) is logged at info, time-stamped.
grep -Eq "^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:.]{12}Z kvtier: info: server: client pid [0-9]+ \(uid $(id -u)\) attached \(geometry g[0-9a-f]{16}\)" "$T/log" &&
grep -Eq "info: server: client pid [0-9]+ \(uid $(id -u)\) detached" "$T/log" ||
    { echo "cli_serve: no attach/detach lines"; cat "$T/log"; exit 1; }
[ "$(grep -c "attached" "$T/log")" -eq 1 ] ||
    { echo "cli_serve: watchers logged their attaches at info:"; cat "$T/log"; exit 1; }
# The start banner names every tier, the version and the metrics endpoint.
grep -q "serving on $S (pid [0-9]*, version [0-9.]*, geometry g[0-9a-f]\{16\}: CPU tier [0-9]* blocks of .*; no metrics endpoint (metrics_port=0))" "$T/log" &&
grep -q "geometry g[0-9a-f]\{16\}: 4 layers, .*: CPU tier [0-9]* blocks of [0-9]* bytes (4k pages), no SSD tier \[1 of at most 1 geometries\]" "$T/log" ||
    { echo "cli_serve: the start banner:"; cat "$T/log"; exit 1; }
# No --model: any geometry.
rc=0
"$K" serve --socket "$T/any.sock" --tp 2 >/dev/null 2>"$T/tp" || rc=$?
[ $rc -eq 2 ] && grep -q "describe a --model" "$T/tp" ||
    { echo "cli_serve: serve --tp without --model exited $rc:"; cat "$T/tp"; exit 1; }
A="$T/any.sock"
MP=$(/usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$K" serve --socket "$A" --set cpu_capacity=16MiB --set huge_pages=false \
    --set metrics_port="$MP" --set ssd_dirs="$T/ssd" --set ssd_capacity=8MiB 2>"$T/any.log" &
SRV=$!
wait_for "$A" "$T/any.log"
"$K" stats --socket "$A" >"$T/any.stats" 2>&1 &&
grep -q "no tier yet: the server serves any geometry and no client attached yet" "$T/any.stats" ||
    { echo "cli_serve: stats on an empty any-geometry server:"; cat "$T/any.stats"; exit 1; }
# stats --model of a geometry it does not hold: an error, and no tier made
# (it used to attach, making one).
rc=0
"$K" stats --socket "$A" --model tiny --tp 2 >/dev/null 2>"$T/any.none" || rc=$?
[ $rc -eq 1 ] && grep -q "the server holds no tier for geometry g[0-9a-f]\{16\} (4 layers, .*); it holds: none" "$T/any.none" ||
    { echo "cli_serve: stats --model on an empty server exited $rc:"; cat "$T/any.none"; exit 1; }
"$K" stats --socket "$A" --json >"$T/any0.json" 2>&1 &&
grep -q '"geometries":\[\],"totals":{"geometries":0,' "$T/any0.json" ||
    { echo "cli_serve: stats --model made a tier:"; cat "$T/any0.json"; exit 1; }
attach "$A" 2 && attach "$A" 1 ||
    { echo "cli_serve: two geometries did not attach:"; cat "$T/any.log"; exit 1; }
# Two geometries: a section each and the totals; --json an array and totals.
"$K" stats --socket "$A" >"$T/any.txt" 2>&1 &&
[ "$(grep -c "^geometry g[0-9a-f]\{16\}: 4 layers, [0-9]* bytes per token, 16 tokens per page, block_tokens 16$" "$T/any.txt")" -eq 2 ] &&
grep -q "^totals (2 geometries)$" "$T/any.txt" &&
grep -q "^  CPU tier     0.0 / 16.0 MiB (0.0%), one capacity shared by the geometries$" "$T/any.txt" ||
    { echo "cli_serve: stats of two geometries:"; cat "$T/any.txt"; exit 1; }
"$K" stats --socket "$A" --json >"$T/any2.json" 2>&1 &&
[ "$(grep -o '"geometry":"g[0-9a-f]*"' "$T/any2.json" | sort -u | wc -l)" -eq 2 ] &&
grep -q '"totals":{"geometries":2,"cpu_bytes_used":0,"cpu_bytes_capacity":16777216,' "$T/any2.json" ||
    { echo "cli_serve: stats --json of two geometries:"; cat "$T/any2.json"; exit 1; }
"$K" stats --socket "$A" --model tiny --tp 1 >"$T/any1.txt" 2>&1 &&
[ "$(grep -c "^geometry g" "$T/any1.txt")" -eq 1 ] ||
    { echo "cli_serve: stats --model tiny --tp 1:"; cat "$T/any1.txt"; exit 1; }
[ "$(grep -c "geometry g[0-9a-f]*: 4 layers" "$T/any.log")" -eq 2 ] &&
grep -q "any geometry, up to 4 at once, sharing 16777216 bytes of CPU tier and 8388608 bytes of SSD tier under $T/ssd (coldest blocks evicted across them): .*; metrics on http://127.0.0.1:$MP/metrics)" "$T/any.log" &&
[ "$(grep -c "4 layers, .*, SSD tier up to [1-9][0-9]* blocks in $T/ssd/g[0-9a-f]\{16\} (.*), 0 recovered \[" "$T/any.log")" -eq 2 ] ||
    { echo "cli_serve: the any-geometry server's log:"; cat "$T/any.log"; exit 1; }
# Its /metrics: each geometry's tier labelled, the server's families once.
/usr/bin/python3 -c 'import sys, urllib.request; sys.stdout.write(urllib.request.urlopen("http://127.0.0.1:%s/metrics" % sys.argv[1], timeout=10).read().decode())' "$MP" >"$T/any.metrics" ||
    { echo "cli_serve: no /metrics from the any-geometry server"; exit 1; }
[ "$(grep -c '^kvtier_lookups_total{geometry="g[0-9a-f]\{16\}"} 0$' "$T/any.metrics")" -eq 2 ] &&
[ "$(grep -c '^# TYPE kvtier_lookups_total counter$' "$T/any.metrics")" -eq 1 ] &&
grep -q '^kvtier_clients_attached 0$' "$T/any.metrics" &&
grep -q '^kvtier_shared_capacity_bytes{tier="ssd"} 8388608$' "$T/any.metrics" &&
grep -q '^kvtier_shared_used_bytes{tier="cpu"} [0-9]' "$T/any.metrics" ||
    { echo "cli_serve: the any-geometry server's /metrics:"; cat "$T/any.metrics"; exit 1; }
kill -TERM "$SRV"
wait "$SRV" || { echo "cli_serve: any-geometry server exit status $?"; cat "$T/any.log"; exit 1; }
SRV=
# The socket from the environment; systemd's READY=1 and STOPPING=1 on
# NOTIFY_SOCKET; SIGHUP reopens a rotated log file and the server goes on.
E="$T/env.sock"
N="$T/notify.sock"
/usr/bin/python3 - "$N" >"$T/notes" <<'PY' &
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(sys.argv[1])
s.settimeout(20)
for _ in range(2):
    print(s.recv(256).decode().replace("\n", " "), flush=True)
PY
NP=$!
i=0
until [ -S "$N" ]; do i=$((i + 1)); [ $i -lt 100 ] || { echo "cli_serve: no notify socket"; exit 1; }; sleep 0.05; done
KVTIER_SERVER_SOCKET="$E" NOTIFY_SOCKET="$N" KVTIER_LOG="$T/env.log" \
    "$K" serve --set cpu_capacity=16MiB --set huge_pages=false &
SRV=$!
i=0
until grep -q "READY=1" "$T/notes" 2>/dev/null; do
    i=$((i + 1))
    [ $i -lt 100 ] || { echo "cli_serve: no READY=1 from KVTIER_SERVER_SOCKET's server"; cat "$T/env.log"; exit 1; }
    sleep 0.05
done
[ -S "$E" ] || { echo "cli_serve: READY=1 before the socket listens"; exit 1; }
mv "$T/env.log" "$T/env.log.1"
kill -HUP "$SRV"
attach "$E" 1 >/dev/null 2>&1 ||
    { echo "cli_serve: the server did not survive SIGHUP"; exit 1; }
grep -q "attached" "$T/env.log" && ! grep -q "attached" "$T/env.log.1" ||
    { echo "cli_serve: SIGHUP did not reopen the log:"; cat "$T/env.log.1" "$T/env.log"; exit 1; }
kill -TERM "$SRV"
wait "$SRV" || { echo "cli_serve: env-socket server exit status $?"; exit 1; }
SRV=
wait "$NP" || true
grep -q "STOPPING=1" "$T/notes" || { echo "cli_serve: no STOPPING=1:"; cat "$T/notes"; exit 1; }
# stats --watch outlives a server restart: it says the server is not
# answering, re-attaches, and reports (with rates) again.
W="$T/w.sock"
"$K" serve --socket "$W" --model tiny --set cpu_capacity=16MiB --set huge_pages=false 2>>"$T/w.log" &
SRV=$!
wait_for "$W" "$T/w.log"
"$K" stats --socket "$W" --watch --count 7 >"$T/w.out" 2>&1 &
WP=$!
i=0
until grep -q "^kvtier server $W " "$T/w.out"; do i=$((i + 1)); [ $i -lt 100 ] || { echo "cli_serve: no first report"; exit 1; }; sleep 0.1; done
kill -TERM "$SRV"; wait "$SRV" || true
i=0
until grep -q "not answering" "$T/w.out"; do i=$((i + 1)); [ $i -lt 100 ] || { echo "cli_serve: watch did not notice"; cat "$T/w.out"; exit 1; }; sleep 0.1; done
"$K" serve --socket "$W" --model tiny --set cpu_capacity=16MiB --set huge_pages=false 2>>"$T/w.log" &
SRV=$!
wait "$WP" || { echo "cli_serve: stats --watch exited $? across a restart:"; cat "$T/w.out"; exit 1; }
last=$(grep -n "^kvtier server $W " "$T/w.out" | tail -1 | cut -d: -f1)
gone=$(grep -n "not answering" "$T/w.out" | head -1 | cut -d: -f1)
[ "$last" -gt "$gone" ] && grep -q "^  per second " "$T/w.out" ||
    { echo "cli_serve: stats --watch across a restart:"; cat "$T/w.out"; exit 1; }
kill -TERM "$SRV"; wait "$SRV" || true
SRV=
# The systemd unit's way (docs/server.md): the socket and the options from
# --config; JSON log lines with KVTIER_LOG_FORMAT=json. Then the socket from
# --set server_socket=PATH, the time dropped with KVTIER_LOG_FORMAT=plain.
C="$T/cfg.sock"
printf '{"server_socket": "%s", "cpu_capacity": "16MiB", "huge_pages": false}\n' "$C" >"$T/kvtier.json"
env -u KVTIER_SERVER_SOCKET KVTIER_LOG_FORMAT=json "$K" serve --config "$T/kvtier.json" 2>"$T/cfg.log" &
SRV=$!
wait_for "$C" "$T/cfg.log"
attach "$C" 1 >/dev/null 2>&1 || { echo "cli_serve: no attach to the --config server"; cat "$T/cfg.log"; exit 1; }
kill -TERM "$SRV"
wait "$SRV" || { echo "cli_serve: --config server exit status $?"; cat "$T/cfg.log"; exit 1; }
SRV=
/usr/bin/python3 - "$T/cfg.log" "$C" <<'PY' || { echo "cli_serve: KVTIER_LOG_FORMAT=json:"; cat "$T/cfg.log"; exit 1; }
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
assert lines and all(set(l) >= {"ts", "level", "pid", "msg"} for l in lines), lines
assert any(sys.argv[2] in l["msg"] and "serving on" in l["msg"] for l in lines), lines
assert any("stopped" in l["msg"] for l in lines), lines
PY
P="$T/set.sock"
env -u KVTIER_SERVER_SOCKET KVTIER_LOG_FORMAT=plain "$K" serve --set "server_socket=$P" \
    --set cpu_capacity=16MiB --set huge_pages=false 2>"$T/set.log" &
SRV=$!
wait_for "$P" "$T/set.log"
kill -TERM "$SRV"
wait "$SRV" || { echo "cli_serve: --set server_socket server exit status $?"; cat "$T/set.log"; exit 1; }
SRV=
grep -q "^kvtier: info: server: serving on $P " "$T/set.log" ||
    { echo "cli_serve: KVTIER_LOG_FORMAT=plain:"; cat "$T/set.log"; exit 1; }
rc=0
env -u KVTIER_SERVER_SOCKET "$K" serve >/dev/null 2>"$T/nosock" || rc=$?
[ $rc -eq 2 ] && grep -q "no socket: give --socket PATH" "$T/nosock" ||
    { echo "cli_serve: serve with no socket anywhere exited $rc:"; cat "$T/nosock"; exit 1; }
echo "cli_serve: ok"
