"""cli_bench_cluster.py KVTIER - `kvtier bench cluster --json` in its
smallest run: a pull of 8 MiB between two node servers (a first one
into node B's empty tier, then a timed one that evicts it), the directory
against redis-benchmark, and KV events through a publisher to a subscriber,
one round. The numbers are not judged (a test
never asserts throughput); the report must hold every field with a
measured (positive) value, and the pulled bytes must have been verified
with no mismatch."""
import json
import subprocess
import sys

r = subprocess.run([sys.argv[1], "bench", "cluster", "--json", "--rounds", "1", "--mib", "8"],
                   capture_output=True, text=True, timeout=300)
if r.returncode != 0:
    sys.exit("cli_bench_cluster: exit %d\n%s\n%s" % (r.returncode, r.stdout, r.stderr[-4000:]))
rep = json.loads(r.stdout)
for k in ("pull_gbps", "raw_stream_gbps", "raw_direct_gbps", "raw_bounced_gbps", "pull_ratio",
          "directory_lookups_per_s",
          "redis_benchmark_hgetall_per_s", "directory_ratio", "events_per_s"):
    v = rep.get(k)
    if not v or not all(v[s] > 0 for s in ("min", "median", "max")):
        sys.exit("cli_bench_cluster: %s not measured in %s" % (k, r.stdout))
for k in ("first_pull_gbps", "first_pull_ratio"):
    if not rep.get(k, 0) > 0:
        sys.exit("cli_bench_cluster: %s not measured in %s" % (k, r.stdout))
if rep["raw_stream_gbps"]["max"] < max(rep["raw_direct_gbps"]["max"], rep["raw_bounced_gbps"]["max"]):
    sys.exit("cli_bench_cluster: raw_stream_gbps is not the better raw: %s" % r.stdout)
if not rep.get("directory_bytes_per_block", 0) > 0:
    sys.exit("cli_bench_cluster: directory_bytes_per_block not measured: %s" % r.stdout)
if rep["mismatches"] != 0 or rep["verified_bytes"] < 2 * (8 << 20):  # the first pull and the round
    sys.exit("cli_bench_cluster: pulled bytes not verified: %s" % r.stdout)
host = rep.get("host", {})
for k in ("cpus", "cpu_model", "cpu_flags", "page_size", "thp", "shmem_thp", "kernel",
          "loadavg_1m"):
    if k not in host:
        sys.exit("cli_bench_cluster: no host.%s: %s" % (k, r.stdout))
print("cli_bench_cluster: ok")
