#!/bin/sh
# cli_trace_synth.sh KVTIER - README's replay commands on a generated trace,
# as a user without the shared trace runs them: `kvtier trace synth` gives
# the same file for the same seed; replay reads it; the first 16 requests
# already share prefixes, so real KV bytes move and are verified (0
# mismatches); --unbounded reaches the trace's maximum; plan writes its CSV.
set -eu
K=$1
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
"$K" trace synth --out "$T/a.jsonl" --seed 3 >/dev/null
"$K" trace synth --out "$T/b.jsonl" --seed 3 >/dev/null
cmp -s "$T/a.jsonl" "$T/b.jsonl" || { echo "cli_trace_synth: one seed, two files"; exit 1; }
"$K" trace synth --out "$T/c.jsonl" --seed 4 >/dev/null
! cmp -s "$T/a.jsonl" "$T/c.jsonl" || { echo "cli_trace_synth: the seed changes nothing"; exit 1; }
[ "$(wc -l <"$T/a.jsonl")" -eq 2000 ] || { echo "cli_trace_synth: not 2000 requests"; exit 1; }
TR="$T/a.jsonl"
"$K" replay --trace "$TR" --no-data --cpu-gb 64 --ssd-gb 1024 >/dev/null
"$K" replay --trace "$TR" --cpu-gb 2 --ssd-gb 4 --max-requests 16 --json >"$T/moved.json"
grep -q '"mismatches":0[,}]' "$T/moved.json" &&
grep -Eq '"verified_bytes":[1-9][0-9]*' "$T/moved.json" ||
    { echo "cli_trace_synth: 16 requests verified no bytes:"; cat "$T/moved.json"; exit 1; }
"$K" replay --trace "$TR" --unbounded --json >"$T/max.json"
hit=$(tr ',' '\n' <"$T/max.json" | sed -n 's/^"token_hit_rate":\(.*\)/\1/p')
max=$(tr ',' '\n' <"$T/max.json" | sed -n 's/^"max_token_hit_rate":\(.*\)/\1/p')
[ -n "$hit" ] && [ "$hit" = "$max" ] ||
    { echo "cli_trace_synth: unbounded $hit is not the maximum $max"; exit 1; }
"$K" plan --trace "$TR" --out-csv "$T/plan.csv" --out-svg "$T/plan.svg" >/dev/null
[ -s "$T/plan.csv" ] && [ -s "$T/plan.svg" ] || { echo "cli_trace_synth: plan wrote nothing"; exit 1; }
echo "cli_trace_synth: ok"
