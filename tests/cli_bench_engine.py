#!/usr/bin/python3
"""cli_bench_engine.py KVTIER - `kvtier bench engine --quick --json` runs
tiny and reports what docs/server.md says it does: every key there, the
SGLang sides per host pool layout, the vLLM sides, ratios and round trips
as min/median/max, host facts, and 0 mismatched bytes over every loaded
byte. Speed is not checked (any machine, any build, sanitizers too)."""
import json
import subprocess
import sys

STAT = {"min", "median", "max"}
RATES = ["store_gbps", "load_gbps", "store_pages_per_s", "load_pages_per_s"]
RATIOS = ["ratio", "store_ratio", "load_ratio", "store_wait_share"]


def fail(msg):
    print("cli_bench_engine: " + msg)
    sys.exit(1)


def stat(d, key, where):
    v = d.get(key)
    if not isinstance(v, dict) or set(v) != STAT:
        fail("%s.%s is not {min, median, max}: %r" % (where, key, v))
    if not v["min"] <= v["median"] <= v["max"]:
        fail("%s.%s out of order: %r" % (where, key, v))
    return v


def main():
    k = sys.argv[1]
    p = subprocess.run([k, "bench", "engine", "--quick", "--json"], capture_output=True,
                       text=True, timeout=240)
    if p.returncode != 0:
        fail("exited %d; stderr:\n%s" % (p.returncode, p.stderr))
    out = json.loads(p.stdout)
    for key in ["bench", "rounds", "stat", "host", "memory", "geometry", "pages", "batch_pages",
                "batches", "prompt_bytes", "tier_bytes", "copy_threads", "sglang", "vllm",
                "sglang_ratio", "sglang_ratio_inproc", "vllm_ratio", "vllm_ratio_inproc",
                "target", "bytes_verified", "mismatches", "verified"]:
        if key not in out:
            fail("no key %r in %s" % (key, sorted(out)))
    for key in ["cpus", "cpu_model", "cpu_flags", "page_size", "thp", "shmem_thp",
                "hugepages_total", "mem_total_bytes", "kernel", "loadavg_1m"]:
        if key not in out["host"]:
            fail("no host.%s" % key)
    for key in ["l3_bytes", "tier_pages", "plain_pages"]:
        if key not in out["memory"]:
            fail("no memory.%s" % key)
    if out["mismatches"] != 0 or out["verified"] is not True:
        fail("mismatches %r, verified %r" % (out["mismatches"], out["verified"]))
    # every side stores and loads the whole prompt once per round, warm-up included
    sides = 8
    want = sides * (out["rounds"] + 1) * out["prompt_bytes"]
    if out["bytes_verified"] != want:
        fail("bytes_verified %r, expected %r" % (out["bytes_verified"], want))
    for layout in ["layer_first", "page_first"]:
        sg = out["sglang"][layout]
        for side in ["plain", "inproc", "server"]:
            for r in RATES:
                if stat(sg[side], r, layout + "." + side)["min"] <= 0:
                    fail("%s.%s.%s is not positive" % (layout, side, r))
        for side in ["inproc", "server"]:
            for r in RATIOS + ["set_round_trips_per_batch", "exists_round_trips_per_batch",
                               "get_round_trips_per_batch"]:
                stat(sg[side], r, layout + "." + side)
        srv = sg["server"]
        # the plugin's calls: prepare_store, launch, END_SYNC (a quick batch
        # is one run of missing pages: one task); peek; lookup, launch, END
        if srv["set_round_trips_per_batch"]["max"] != 3 or \
                srv["get_round_trips_per_batch"]["median"] < 2 or \
                srv["exists_round_trips_per_batch"]["median"] != 1:
            fail("%s server round trips: %r" % (layout, srv))
        if sg["inproc"]["set_round_trips_per_batch"]["max"] != 0:
            fail("in-process round trips are not 0")
        stat(out["sglang_ratio"], layout, "sglang_ratio")
        stat(out["sglang_ratio_inproc"], layout, "sglang_ratio_inproc")
    for side in ["inproc", "server"]:
        for r in RATES + RATIOS + ["save_round_trips_per_request",
                                   "load_round_trips_per_request"]:
            stat(out["vllm"][side], r, "vllm." + side)
    stat(out, "vllm_ratio", "")
    stat(out, "vllm_ratio_inproc", "")
    for key in ["ratio", "round_trips_per_batch", "ratio_met", "round_trips_met",
                "worst_round_trips_per_batch"]:
        if key not in out["target"]:
            fail("no target.%s" % key)
    print("cli_bench_engine: ok")


main()
