"""Keyed requests through the binding: Cache.lookup(keys=...) and
prepare_store(keys=...), with bytes or str keys (str encoded UTF-8); every
load byte-checked against the pages stored; the prefix property,
namespaces, and bad keys refused with the index named. Cache.peek answers
every lookup here first (the same tokens, nothing pinned). Independent keys
(independent=True): each key the block of a one-key request of it, leading
runs, store plans that stop at the next stored key; on a Cache and through
a Client of a `kvtier serve`."""
import os
import shutil
import tempfile
import unittest

import numpy as np

from _util import skip_if_unloadable


def setUpModule():
    skip_if_unloadable()
    global kvtier
    import kvtier


class KeyedRequests(unittest.TestCase):
    PAGES, ROW = 32, 16 * 2 * 16 * 2  # 16 tokens/page x 2 heads x 16 dim x 2 bytes

    def setUp(self):
        self.geo = kvtier.Geometry.uniform(4, 16, 2, 16)
        self.cfg = kvtier.Config({"cpu_capacity": "4MiB", "block_tokens": 16})
        self.cache = kvtier.Cache(self.cfg, self.geo)
        self.bufs = [[np.zeros((self.PAGES, self.ROW), np.uint8) for _ in range(2)]
                     for _ in range(4)]
        self.cache.register_buffers(self.PAGES, self.bufs)
        rng = np.random.default_rng(7)
        for l in range(4):
            for c in range(2):
                self.bufs[l][c][:8] = rng.integers(0, 256, (8, self.ROW), dtype=np.uint8)

    def tearDown(self):
        self.cache.close()
        self.cfg.close()
        self.geo.close()

    def store(self, keys, pages, ns=None, independent=False):
        plan = self.cache.prepare_store(keys=keys, ns=ns, independent=independent)
        if plan.task:
            self.cache.launch(plan.task, pages)
            self.assertTrue(self.cache.wait(plan.task, 5).ok)
        return plan.num_tokens

    def load(self, keys, dst, src, ns=None, independent=False):
        for l in range(4):
            for c in range(2):
                self.bufs[l][c][dst] = 0xA5
        peeked = self.cache.peek(keys=keys, ns=ns, independent=independent)
        m = self.cache.lookup(keys=keys, ns=ns, independent=independent)
        self.assertEqual(peeked, m.matched_tokens)
        if m.task:
            self.cache.launch(m.task, dst)
            for layer in range(4):
                self.cache.wait_layer(m.task, layer, 5)
            self.assertTrue(self.cache.wait(m.task, 5).ok)
            n = m.matched_tokens // 16
            for l in range(4):
                for c in range(2):
                    np.testing.assert_array_equal(self.bufs[l][c][dst[:n]],
                                                  self.bufs[l][c][src[:n]])
        return m.matched_tokens

    def test_str_and_bytes_keys_round_trip_every_key(self):
        keys = ["h%02d" % i for i in range(6)]
        self.assertEqual(self.load(keys, list(range(20, 26)), list(range(6))), 0)
        self.assertEqual(self.store(keys, list(range(6))), 96)
        # every key matches (no "last token" for keyed requests)
        self.assertEqual(self.load(keys, list(range(20, 26)), list(range(6))), 96)
        # str keys are their UTF-8 bytes
        as_bytes = [k.encode() for k in keys]
        self.assertEqual(self.load(as_bytes, list(range(20, 26)), list(range(6))), 96)
        self.assertEqual(self.cache.stats()["stored_blocks"], 6)

    def test_prefix_and_namespace(self):
        keys = ["k%d" % i for i in range(5)]
        self.assertEqual(self.store(keys, list(range(5)), ns="model-a"), 80)
        other = keys[:3] + ["changed", "k4"]
        self.assertEqual(self.load(other, list(range(20, 25)), list(range(5)), ns="model-a"), 48)
        self.assertEqual(self.load(keys, list(range(20, 25)), list(range(5)), ns="model-b"), 0)
        self.assertEqual(self.load(keys[1:], list(range(20, 24)), list(range(1, 5)),
                                   ns="model-a"), 0)
        # a token request never meets a keyed chain
        self.assertEqual(self.cache.lookup(list(range(200)), ns="model-a").task, 0)
        # unicode keys
        uk = ["页-%d" % i for i in range(2)]
        self.assertEqual(self.store(uk, [6, 7]), 32)
        self.assertEqual(self.load([k.encode("utf-8") for k in uk], [28, 29], [6, 7]), 32)

    def test_bad_keys_name_the_index(self):
        cases = [
            (["a", ""], "keys[1]: 0 bytes"),
            (["a", "b" * 257], "keys[1]: 257 bytes"),
            (["a", 3], "keys[1]: expected bytes or str, got int"),
            ("abc", "keys: expected a sequence of keys, got one str"),
            (5, "keys: expected a sequence of bytes or str, got int"),
        ]
        for keys, msg in cases:
            with self.assertRaises(kvtier.InvalidArgument) as cm:
                self.cache.lookup(keys=keys)
            self.assertIn(msg, str(cm.exception))
            with self.assertRaises(kvtier.InvalidArgument):
                self.cache.prepare_store(keys=keys)
            with self.assertRaises(kvtier.InvalidArgument):
                self.cache.peek(keys=keys)
        with self.assertRaises(kvtier.InvalidArgument) as cm:
            self.cache.lookup([1, 2, 3], keys=["a"])
        self.assertIn("tokens or by keys", str(cm.exception))
        with self.assertRaises(kvtier.InvalidArgument):
            self.cache.lookup()
        self.assertEqual(self.cache.lookup(keys=[]).task, 0)
        self.assertEqual(self.cache.lookup(keys=[b"x" * 256]).task, 0)
        self.assertEqual(self.cache.peek(keys=[b"x" * 256]), 0)

    def test_peek_pins_plans_and_counts_nothing(self):
        keys = ["p%d" % i for i in range(4)]
        self.assertEqual(self.store(keys, list(range(4))), 64)
        before = self.cache.stats()
        self.assertEqual(self.cache.peek(keys=keys), 64)
        self.assertEqual(self.cache.peek(keys=keys, ns="other"), 0)
        after = self.cache.stats()
        for k in ("lookups", "hit_tokens", "tasks_in_flight"):
            self.assertEqual(after[k], before[k], k)
        # token requests: the last token is never matched
        plan = self.cache.prepare_store(list(range(1000, 1048)))
        self.cache.launch(plan.task, list(range(4, 7)))
        self.assertTrue(self.cache.wait(plan.task, 5).ok)
        self.assertEqual(self.cache.peek(list(range(1000, 1048))), 32)
        self.assertEqual(self.cache.peek(list(range(1000, 1049))), 48)


    # Independent keys: every key a root of its own

    def test_independent_is_the_one_key_identity(self):
        keys = ["i%d" % i for i in range(4)]
        for i, k in enumerate(keys):  # the old way: one request per page
            self.assertEqual(self.store([k], [i]), 16)
        self.assertEqual(self.load(keys, list(range(20, 24)), list(range(4)),
                                   independent=True), 64)
        # and back: stored in one independent request, found key by key
        more = ["j%d" % i for i in range(4)]
        self.assertEqual(self.store(more, list(range(4, 8)), independent=True), 64)
        self.assertEqual(self.cache.stats()["stores"], 5)
        for i, k in enumerate(more):
            self.assertEqual(self.load([k], [24 + i], [4 + i]), 16, k)
            # any key of the batch, alone or first: no parent to match
            self.assertEqual(self.load(more[i:], list(range(24, 28 - i)),
                                       list(range(4 + i, 8)), independent=True),
                             16 * (4 - i), k)
        # a chained request of the same keys is another identity past key 0
        self.assertEqual(self.load(more, list(range(24, 28)), list(range(4, 8))), 16)
        chained = ["c%d" % i for i in range(3)]
        self.assertEqual(self.store(chained, [0, 1, 2]), 48)
        self.assertEqual(self.load(chained, [20, 21, 22], [0, 1, 2], independent=True), 16)
        self.assertEqual(self.cache.stats()["stored_blocks"], 11)

    def test_independent_leading_run_and_store_plans(self):
        k = ["r%d" % i for i in range(6)]
        for i in (0, 1, 3):
            self.assertEqual(self.store([k[i]], [i]), 16)
        # keys 0, 1 stored, 2 missing, 3 stored: a run of 2 pages
        self.assertEqual(self.cache.peek(keys=k[:4], independent=True), 32)
        self.assertEqual(self.load(k[:4], list(range(20, 24)), list(range(4)),
                                   independent=True), 32)
        # the plan: from the first key missing up to the next one stored
        plan = self.cache.prepare_store(keys=k, independent=True)
        self.assertNotEqual(plan.task, 0)
        self.assertEqual((plan.first_token, plan.num_tokens), (32, 16))
        # key 2 is being stored by that task: another plan stops before it
        busy = self.cache.prepare_store(keys=k, independent=True)
        self.assertEqual((busy.task, busy.first_token, busy.num_tokens), (0, 32, 0))
        self.cache.launch(plan.task, list(range(6)))
        self.assertTrue(self.cache.wait(plan.task, 5).ok)
        # the keys after the plan: key 3 stored, 4 and 5 planned
        rest = self.cache.prepare_store(keys=k[3:], independent=True)
        self.assertEqual((rest.first_token, rest.num_tokens), (16, 32))
        self.cache.launch(rest.task, list(range(3, 6)))
        self.assertTrue(self.cache.wait(rest.task, 5).ok)
        self.assertEqual(self.load(k, list(range(20, 26)), list(range(6)), independent=True),
                         96)
        done = self.cache.prepare_store(keys=k, independent=True)
        self.assertEqual((done.task, done.first_token, done.num_tokens), (0, 96, 0))
        self.assertEqual(self.cache.stats()["stored_blocks"], 6)

    def test_independent_refuses_tokens(self):
        for call in (self.cache.lookup, self.cache.peek, self.cache.prepare_store):
            with self.assertRaises(kvtier.InvalidArgument) as cm:
                call(list(range(64)), independent=True)
            self.assertIn("independent=True applies to keyed requests (keys=), not tokens",
                          str(cm.exception))


class IndependentKeysThroughServer(unittest.TestCase):
    """The same requests through kvtier.Client: the flag crosses the socket."""

    def test_client_independent_keys(self):
        from test_client import start_server, stop_server
        tmp = tempfile.mkdtemp(prefix="kvtik")
        self.addCleanup(shutil.rmtree, tmp, True)
        sock = os.path.join(tmp, "node.sock")
        srv = start_server(sock)
        self.addCleanup(lambda: srv.poll() is not None or stop_server(srv))
        geo = kvtier.Geometry.preset("tiny", 16, 1)
        self.addCleanup(geo.close)
        eng = kvtier.EmulatedEngine(geo, 64)
        self.addCleanup(eng.close)
        with kvtier.Client(sock, geo, timeout_ms=5000) as cl:
            cl.register_engine(eng)
            bt = cl.block_tokens
            self.assertEqual(bt, 16)
            toks = [(7 * i + 3) % 50000 for i in range(6 * bt)]
            src = list(range(6))
            eng.fill(toks, src)
            keys = ["s%d" % i for i in range(6)]
            for i in (0, 1, 3):  # one-key requests
                plan = cl.prepare_store(keys=[keys[i]], ns="m")
                cl.launch(plan.task, [src[i]])
                self.assertTrue(cl.wait(plan.task, 10).ok)
            self.assertEqual(cl.peek(keys=keys, ns="m", independent=True), 2 * bt)
            plan = cl.prepare_store(keys=keys, ns="m", independent=True)
            self.assertEqual((plan.first_token, plan.num_tokens), (2 * bt, bt))
            cl.launch(plan.task, src)
            self.assertTrue(cl.wait(plan.task, 10).ok)
            plan = cl.prepare_store(keys=keys[3:], ns="m", independent=True)
            self.assertEqual((plan.first_token, plan.num_tokens), (bt, 2 * bt))
            cl.launch(plan.task, src[3:])
            self.assertTrue(cl.wait(plan.task, 10).ok)
            # one lookup, one load of all six, byte-verified
            dst = list(range(20, 26))
            eng.poison(dst)
            m = cl.lookup(keys=keys, ns="m", independent=True)
            self.assertEqual(m.matched_tokens, 6 * bt)
            cl.launch(m.task, dst)
            self.assertTrue(cl.wait(m.task, 10).ok)
            v = eng.verify(toks, dst)
            self.assertEqual(v.mismatches, 0)
            self.assertEqual(v.bytes_checked, eng.verify(toks, src).bytes_checked)
            self.assertGreater(v.bytes_checked, 0)
            # a page stored by the independent request, found by a one-key one
            eng.poison([30])
            m = cl.lookup(keys=[keys[4]], ns="m")
            self.assertEqual(m.matched_tokens, bt)
            cl.launch(m.task, [30])
            self.assertTrue(cl.wait(m.task, 10).ok)
            self.assertEqual(eng.verify(toks, [0, 0, 0, 0, 30, 0], first=4 * bt,
                                        count=bt).mismatches, 0)
            with self.assertRaises(kvtier.InvalidArgument) as cm:
                cl.lookup(toks, independent=True)
            self.assertIn("keyed requests", str(cm.exception))
            self.assertEqual(cl.stats()["stored_blocks"], 6)


if __name__ == "__main__":
    unittest.main()
