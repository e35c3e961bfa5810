#!/usr/bin/env python3
"""cli_replay_fleet.py KVTIER - `kvtier replay --nodes N`: an index-only fleet
behind a router, replayed with each node hitting only what it holds (local)
and with prefixes pulled from peers (shared, the cluster tier).

What must hold on any trace (here one from `kvtier trace synth`):
- unbounded, sharing reaches the one-cache maximum exactly, whatever the
  routing: a block's whole prefix lives on the node that stored it;
- random routing with one seed routes both passes alike, so the shared
  pass gains exactly the tokens it pulled from peers;
- prefix routing (to the longest holder) needs no sharing when unbounded;
- the same seed gives the same numbers, another seed other routes;
- misuse is refused with a message naming the fix (exit 2)."""
import json
import subprocess
import sys
import tempfile

K = sys.argv[1]


def fail(msg):
    print("cli_replay_fleet: " + msg)
    sys.exit(1)


def replay(trace, *args):
    p = subprocess.run([K, "replay", "--trace", trace, "--json", *args],
                       capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        fail("replay %s exited %d: %s" % (" ".join(args), p.returncode, p.stderr))
    j = json.loads(p.stdout)
    j.pop("elapsed_s")
    return j


def refused(trace, want, *args):
    p = subprocess.run([K, "replay", "--trace", trace, *args],
                       capture_output=True, text=True, timeout=60)
    if p.returncode != 2 or want not in p.stderr:
        fail("replay %s: exit %d, stderr %r (wanted 2 and %r)"
             % (" ".join(args), p.returncode, p.stderr, want))


with tempfile.TemporaryDirectory() as d:
    tr = d + "/t.jsonl"
    subprocess.run([K, "trace", "synth", "--out", tr, "--seed", "5"], check=True,
                   capture_output=True, timeout=60)
    one = replay(tr, "--unbounded")
    for routing in ("random", "sticky", "prefix"):
        f = replay(tr, "--unbounded", "--nodes", "8", "--routing", routing)
        if (f["hit_rate_local"], f["hit_rate_shared"]) != (f["local_token_hit_rate"],
                                                           f["shared_token_hit_rate"]):
            fail("%s: hit_rate_local/shared differ from the token hit rates" % routing)
        if f["requests"] != one["requests"]:
            fail("%s: %d requests replayed, not %d" % (routing, f["requests"], one["requests"]))
        if f["shared_token_hit_rate"] != one["max_token_hit_rate"]:
            fail("%s: shared %r is not the one-cache maximum %r"
                 % (routing, f["shared_token_hit_rate"], one["max_token_hit_rate"]))
        if not f["min_requests_per_node"] * 8 <= f["requests"] <= f["max_requests_per_node"] * 8:
            fail("%s: requests per node %d..%d cannot sum to %d" % (
                routing, f["min_requests_per_node"], f["max_requests_per_node"], f["requests"]))
        if routing == "random":
            rnd = f
            if not f["local_token_hit_rate"] < f["shared_token_hit_rate"]:
                fail("random routing over 8 nodes lost nothing without sharing: %r" % f)
            if f["hit_tokens"] - f["local_hit_tokens"] != f["cross_node_hit_tokens"]:
                fail("random: shared gained %d tokens but pulled %d" % (
                    f["hit_tokens"] - f["local_hit_tokens"], f["cross_node_hit_tokens"]))
        if routing == "prefix" and f["local_token_hit_rate"] != one["max_token_hit_rate"]:
            fail("prefix routing, unbounded, local %r is not the maximum %r"
                 % (f["local_token_hit_rate"], one["max_token_hit_rate"]))
    if replay(tr, "--unbounded", "--nodes", "8") != rnd:
        fail("random routing with the default seed gave other numbers on a second run")
    other = replay(tr, "--unbounded", "--nodes", "8", "--seed", "99")
    if other["local_hit_tokens"] == rnd["local_hit_tokens"]:
        fail("--seed 99 routed exactly as seed 0")
    b = replay(tr, "--no-data", "--cpu-gb", "8", "--nodes", "4")
    if b["cpu_blocks"] != 8 * 1024 // 64 or b["cross_node_hit_tokens"] <= 0:
        fail("bounded fleet: %r" % b)
    refused(tr, "add --no-data or --unbounded", "--nodes", "4")
    refused(tr, "add --nodes N", "--no-data", "--routing", "sticky")
    refused(tr, "not random, sticky or prefix", "--no-data", "--nodes", "4", "--routing", "rr")
    refused(tr, "--nodes", "--no-data", "--nodes", "1")
print("cli_replay_fleet: ok")
