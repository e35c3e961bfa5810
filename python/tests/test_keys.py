"""Keyed requests through the binding: Cache.lookup(keys=...) and
prepare_store(keys=...), with bytes or str keys (str encoded UTF-8); every
load byte-checked against the pages stored; the prefix property,
namespaces, and bad keys refused with the index named. Cache.peek answers
every lookup here first (the same tokens, nothing pinned)."""
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

    def store(self, keys, pages, ns=None):
        plan = self.cache.prepare_store(keys=keys, ns=ns)
        if plan.task:
            self.cache.launch(plan.task, pages)
            self.assertTrue(self.cache.wait(plan.task, 5).ok)
        return plan.num_tokens

    def load(self, keys, dst, src, ns=None):
        for l in range(4):
            for c in range(2):
                self.bufs[l][c][dst] = 0xA5
        peeked = self.cache.peek(keys=keys, ns=ns)
        m = self.cache.lookup(keys=keys, ns=ns)
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


if __name__ == "__main__":
    unittest.main()
