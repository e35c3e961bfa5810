"""Scenarios E1-E7 over 4 ranks (pp2 x tp2) as threads on the inproc
transport; every rank must see the identical event stream and every load
that reports success must verify byte for byte."""
import threading
import traceback
import unittest

from _util import skip_if_unloadable

RANKS = 4


def setUpModule():
    skip_if_unloadable()


def run_world(name, timeout=0.3, join_s=60):
    import kvtier
    import scenarios
    results, errors = [None] * RANKS, [None] * RANKS
    fabric = kvtier.Fabric(RANKS, 64)

    def worker(rank):
        try:
            with kvtier.EmulatedRank(rank, pp=2, tp=2, transport=("inproc", fabric),
                                     timeout=timeout) as r:
                r.join(5.0)
                results[rank] = scenarios.run_rank(r, name)
        except BaseException:
            errors[rank] = traceback.format_exc()

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(RANKS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(join_s)
    hung = [i for i, t in enumerate(threads) if t.is_alive()]
    if not hung:
        fabric.close()
    return results, errors, hung


class ConnectorThreads(unittest.TestCase):
    """One test per scenario; see scenarios.py."""

    def world(self, name):
        results, errors, hung = run_world(name)
        self.assertEqual(hung, [], "ranks %s still running after 60 s" % hung)
        failed = ["rank %d:\n%s" % (i, e) for i, e in enumerate(errors) if e]
        if failed:
            self.fail("\n".join(failed))
        for r in range(1, RANKS):
            self.assertEqual(results[r]["events"], results[0]["events"],
                             "rank %d's event stream differs from rank 0's" % r)
        return results

    def test_basic_round_trip(self):
        res = self.world("basic")
        self.assertTrue(all(x["verified"] > 0 for x in res))

    def test_e1_leader_extra_polls(self):
        self.world("e1")

    def test_e2_receiver_skips_load(self):
        self.world("e2")

    def test_e3_leader_skips_load(self):
        self.world("e3")

    def test_e3_leader_raises_then_reform(self):
        self.world("e3_raise")

    def test_step_skew(self):
        self.world("step_skew")

    def test_e4_receiver_polls(self):
        self.world("e4")

    def test_e5_seeded_asymmetry(self):
        res = self.world("e5")
        self.assertGreater(res[0]["verified"], 0)

    def test_e6_leader_counters(self):
        self.world("e6")

    def test_e7_leader_load_fails(self):
        self.world("e7")

    def test_request_bytes_mismatch(self):
        self.world("mismatch")


if __name__ == "__main__":
    unittest.main()
