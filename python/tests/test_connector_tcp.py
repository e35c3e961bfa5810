"""Ranks as separate processes over the TCP transport on 127.0.0.1: a
store/load round trip byte-verified on every rank, and E2 / E7 across
processes. Every wait is bounded (process deadline 60 s)."""
import json
import os
import subprocess
import sys
import time
import unittest

from _util import HERE, skip_if_unloadable

RANKS = 4
DEADLINE_S = 60


def setUpModule():
    skip_if_unloadable()


def run_processes(name):
    """Starts rank 0, reads its port, starts the others; returns per-rank
    (returncode, result dict or None, output)."""
    cmd = [sys.executable, os.path.join(HERE, "rank_worker.py"), name]
    env = dict(os.environ)
    procs = [subprocess.Popen(cmd + ["0", str(RANKS), "0"], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, env=env, cwd=HERE)]
    deadline = time.monotonic() + DEADLINE_S
    first = procs[0].stdout.readline()
    if not first.startswith("PORT "):
        procs[0].kill()
        rest = procs[0].communicate(timeout=10)[0]
        raise AssertionError("rank 0 did not report its port: %s%s" % (first, rest))
    port = first.split()[1]
    for rank in range(1, RANKS):
        procs.append(subprocess.Popen(cmd + [str(rank), str(RANKS), port], stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True, env=env, cwd=HERE))
    out = []
    for p in procs:
        try:
            text = p.communicate(timeout=max(1, deadline - time.monotonic()))[0]
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise AssertionError("rank processes still running after %d s" % DEADLINE_S)
        res = None
        for line in text.splitlines():
            if line.startswith("RESULT "):
                res = json.loads(line[7:])
            elif line.startswith("ERROR "):
                text += "\n" + json.loads(line[6:])
        out.append((p.returncode, res, text))
    return out


class ConnectorTcp(unittest.TestCase):
    """Four rank processes (pp2 x tp2) on loopback TCP."""

    def world(self, name):
        out = run_processes(name)
        for rank, (rc, res, text) in enumerate(out):
            self.assertEqual(rc, 0, "rank %d failed:\n%s" % (rank, text))
            self.assertIsNotNone(res, "rank %d gave no result:\n%s" % (rank, text))
        for rank in range(1, RANKS):
            self.assertEqual(out[rank][1]["events"], out[0][1]["events"],
                             "rank %d's event stream differs from rank 0's" % rank)
        return [res for _, res, _ in out]

    def test_round_trip_verified_on_every_rank(self):
        res = self.world("basic")
        for r in res:
            self.assertGreater(r["verified"], 0, "rank %d verified nothing" % r["rank"])

    def test_e2_receiver_skips_load(self):
        self.world("e2")

    def test_e7_leader_load_fails(self):
        res = self.world("e7")
        self.assertTrue(all(r["verified"] > 0 for r in res))


if __name__ == "__main__":
    unittest.main()
