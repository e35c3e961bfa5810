"""cli_demo_cluster.py KVTIER - `kvtier demo --cluster --json` runs a
Redis primary with a replica and a Sentinel, three node servers and two
engine processes behind a random router; SIGKILLs a node and restarts it,
then SIGKILLs the Redis primary (the Sentinel fails over). Its report must
show cross-node hits (pulled blocks served) behind the router, after the
node's restart and after the failover, hits while it failed over, and
every loaded byte
verified with no mismatch or failure. In the TSan build the node servers
run instrumented: their cluster threads are checked there."""
import json
import subprocess
import sys

kvtier = sys.argv[1]
r = subprocess.run([kvtier, "demo", "--cluster", "--json"], capture_output=True, text=True,
                   timeout=600)
if r.returncode != 0:
    # the demo's own verdict lines first: the nodes' logs after them are long
    reasons = "\n".join(l for l in r.stderr.splitlines() if l.startswith("kvtier demo"))
    sys.exit("cli_demo_cluster: exit %d\n%s\n%s\n--- stderr's end:\n%s" %
             (r.returncode, r.stdout, reasons, r.stderr[-6000:]))
rep = json.loads(r.stdout.strip().splitlines()[-1])
phase = {p["phase"]: p for p in rep["phases"]}


def check(cond, what):
    if not cond:
        sys.exit("cli_demo_cluster: %s in: %s" % (what, json.dumps(rep)))


check(rep["nodes"] == 3 and rep["engines"] == 2, "not 3 nodes and 2 engines")
check(len(phase) == 6, "not 6 phases")
check(rep["mismatches"] == 0, "mismatches")
check(rep["failures"] == 0, "failures")
check(rep["verified_bytes"] > 0, "nothing verified")
check(phase[2]["cross_node_hit_tokens"] > 0, "no cross-node hits behind the router")
check(phase[4]["cross_node_hit_tokens"] > 0, "no cross-node hits after the node's restart")
check(phase[5]["hit_tokens"] > 0, "no hits while the Redis primary failed over")
check(phase[6]["cross_node_hit_tokens"] > 0, "no cross-node hits after the failover")
check(rep["redis_failovers"] == 1 and rep["nodes_killed"] == 1, "no node kill or failover")
check(rep["cross_node_hit_tokens"] == sum(p["cross_node_hit_tokens"] for p in rep["phases"]),
      "the total is not the phases' sum")
check(all(p["cross_node_hit_tokens"] <= p["hit_tokens"] for p in rep["phases"]),
      "more cross-node hit tokens than hit tokens in a phase")
print("cli_demo_cluster: ok")
