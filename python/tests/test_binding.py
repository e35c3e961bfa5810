"""The binding: round trips through the cache over numpy buffers and the
emulated engine, error classes and messages for bad arguments, closed
handles, and the vLLM-shaped OffloadingManager."""
import logging
import socket
import unittest

import numpy as np

from _util import skip_if_unloadable


def setUpModule():
    skip_if_unloadable()
    global kvtier
    import kvtier


def geometry(layers=4, tpp=16, heads=2, dim=16):
    return kvtier.Geometry.uniform(layers, tpp, heads, dim)


class CacheRoundTrip(unittest.TestCase):
    """Store then load, bytes checked."""

    def setUp(self):
        self.geo = geometry()
        self.cfg = kvtier.Config({"cpu_capacity": "4MiB", "block_tokens": 16})
        self.cache = kvtier.Cache(self.cfg, self.geo)

    def tearDown(self):
        self.cache.close()
        self.cfg.close()
        self.geo.close()

    def test_emulated_engine_round_trip(self):
        with kvtier.EmulatedEngine(self.geo, 32) as eng:
            self.cache.register_engine(eng)
            tok = np.arange(1000, 1080, dtype=np.int64)
            eng.fill(tok, [0, 1, 2, 3, 4], ns="lora-a")
            plan = self.cache.prepare_store(tok, ns="lora-a")
            self.assertEqual((plan.first_token, plan.num_tokens), (0, 80))
            self.cache.launch(plan.task, [0, 1, 2, 3, 4])
            self.assertTrue(self.cache.wait(plan.task, 5).ok)
            self.assertEqual(self.cache.lookup(tok, ns="lora-b").task, 0)  # other namespace
            m = self.cache.lookup(tok, ns="lora-a")
            self.assertEqual(m.matched_tokens, 64)  # never the last token
            eng.poison([10, 11, 12, 13])
            self.cache.launch(m.task, [10, 11, 12, 13])
            for layer in range(4):
                self.cache.wait_layer(m.task, layer, 5)
            self.assertTrue(self.cache.wait(m.task, 5).ok)
            v = eng.verify(tok, [10, 11, 12, 13], 0, 64, ns="lora-a")
            self.assertEqual(v.mismatches, 0)
            self.assertEqual(v.bytes_checked, 64 * 512)
            # the numpy view sees the loaded bytes
            self.assertTrue(np.array_equal(eng.buffer(2, 1)[10], eng.buffer(2, 1)[0]))
            self.assertGreater(self.cache.stats()["loaded_bytes"], 0)
        self.assertTrue(self.cache.closed)  # closing the engine closed its borrower first

    def test_numpy_buffers_round_trip(self):
        pages, row = 8, 16 * 2 * 16 * 2
        bufs = [[np.zeros((pages, row), np.uint8) for _ in range(2)] for _ in range(4)]
        self.cache.register_buffers(pages, bufs)
        rng = np.random.default_rng(1)
        for l in range(4):
            for c in range(2):
                bufs[l][c][:2] = rng.integers(0, 256, (2, row), dtype=np.uint8)
        tok = list(range(33))
        plan = self.cache.prepare_store(tok)
        self.cache.launch(plan.task, [0, 1, 2])
        self.assertTrue(self.cache.wait(plan.task, 5).ok)
        m = self.cache.lookup(tok)
        self.assertEqual(m.matched_tokens, 32)
        self.cache.launch(m.task, [5, 6])
        self.assertTrue(self.cache.wait(m.task, 5).ok)
        for l in range(4):
            for c in range(2):
                np.testing.assert_array_equal(bufs[l][c][5:7], bufs[l][c][0:2])

    def test_strided_views_round_trip(self):
        """A page_first pool (tokens, layers, token bytes): each layer's
        view kv[:, layer] is registered by its strides, no copy; a load
        writes its tokens of every layer and no other byte."""
        pages, tpp, tb = 8, 16, 2 * 16 * 2
        kv = [np.zeros((pages * tpp, 4, tb), np.uint8) for _ in range(2)]  # K, V
        views = [[kv[c][:, l] for c in range(2)] for l in range(4)]
        self.assertFalse(views[1][0].flags.c_contiguous)
        self.cache.register_buffers(pages, views)
        rng = np.random.default_rng(5)
        for c in range(2):
            kv[c][:2 * tpp] = rng.integers(0, 256, (2 * tpp, 4, tb), dtype=np.uint8)
        tok = list(range(33))
        plan = self.cache.prepare_store(tok)
        self.cache.launch(plan.task, [0, 1, 2])
        self.assertTrue(self.cache.wait(plan.task, 5).ok)
        want = [k.copy() for k in kv]
        for c in range(2):
            want[c][5 * tpp:7 * tpp] = kv[c][0:2 * tpp]
        m = self.cache.lookup(tok)
        self.cache.launch(m.task, [5, 6])
        self.assertTrue(self.cache.wait(m.task, 5).ok)
        for c in range(2):
            np.testing.assert_array_equal(kv[c], want[c])

    def test_poll_reports_each_result_once(self):
        with kvtier.EmulatedEngine(self.geo, 8) as eng:
            self.cache.register_engine(eng)
            plan = self.cache.prepare_store(list(range(40)))
            self.cache.launch(plan.task, [0, 1, 2])
            seen = []
            for _ in range(500):
                seen += self.cache.poll()
                if seen:
                    break
                import time
                time.sleep(0.002)
            self.assertEqual([r.task for r in seen], [plan.task])
            with self.assertRaises(kvtier.NotFound):
                self.cache.wait(plan.task, 0)


class BadArguments(unittest.TestCase):
    """Bad input raises a clear exception; nothing crashes."""

    def setUp(self):
        self.geo = geometry()
        self.cfg = kvtier.Config({"cpu_capacity": "4MiB"})
        self.cache = kvtier.Cache(self.cfg, self.geo)
        self.eng = kvtier.EmulatedEngine(self.geo, 8)

    def tearDown(self):
        self.eng.close()
        self.cfg.close()
        self.geo.close()

    def raises(self, cls, text, fn, *a, **kw):
        with self.assertRaises(cls) as cm:
            fn(*a, **kw)
        self.assertIn(text, str(cm.exception))
        return cm.exception

    def test_c_message_and_status(self):
        e = self.raises(kvtier.InvalidArgument, "cpu_capacity", self.cfg.set, "cpu_capacity", "lots")
        self.assertEqual(e.status, kvtier.STATUS["EINVAL"])
        self.assertEqual(e.status_name, "KVT_EINVAL")
        self.assertIsInstance(e, ValueError)
        self.raises(kvtier.NotFound if False else kvtier.KvtierError, "no_such_option",
                    self.cfg.set, "no_such_option", "1")

    def test_launch_page_out_of_range_names_it(self):
        self.cache.register_engine(self.eng)
        m = self.cache.prepare_store(list(range(40)))
        self.raises(kvtier.InvalidArgument, "pages[1] is 9000", self.cache.launch, m.task, [0, 9000, 1])

    def test_python_side_validation(self):
        self.raises(kvtier.InvalidArgument, "tokens is empty", self.cache.lookup, [])
        self.raises(kvtier.InvalidArgument, "tokens[1] is -5", self.cache.lookup, [1, -5, 3])
        self.raises(kvtier.InvalidArgument, "outside [0, 2**32)", self.cache.lookup, [2**33])
        self.raises(kvtier.InvalidArgument, "expected integers", self.cache.lookup, [1.5, 2.0])
        self.raises(kvtier.InvalidArgument, "1-D", self.cache.lookup, [[1, 2], [3, 4]])
        self.raises(kvtier.InvalidArgument, "sequence of integers", self.cache.lookup, "abc")
        self.raises(kvtier.InvalidArgument, "ns: expected bytes or str", self.cache.lookup, [1, 2], ns=5)
        self.raises(kvtier.InvalidArgument, "no engine memory registered", self.cache.launch, 1, [0])
        self.raises(kvtier.InvalidArgument, "every wait needs a deadline", self.cache.wait, 1, None)
        self.raises(kvtier.InvalidArgument, "must be a number of seconds >= 0", self.cache.wait, 1, -1)
        self.raises(kvtier.InvalidArgument, "task is -1", self.cache.wait, -1, 0)
        self.raises(kvtier.InvalidArgument, "config must be a kvtier.Config", kvtier.Cache, None, self.geo)
        self.raises(kvtier.InvalidArgument, "pages[0] is 8 but the engine has 8 pages",
                    self.eng.fill, list(range(16)), [8])
        self.raises(kvtier.InvalidArgument, "2 (K, V) or 1 (MLA)", self.geo.set_layer, 0, [])

    def test_geometry_errors_name_the_field(self):
        with kvtier.Geometry(2, 16) as g:
            g.set_layer(0, [(2, 16, 2), (2, 16, 2)])
            self.raises(kvtier.InvalidArgument, "layer 1", g.validate)
        with geometry(heads=4) as other:
            self.raises(kvtier.GeometryMismatch, "kv_heads", self.geo.compare, other)

    def test_buffer_checks(self):
        small = [[np.zeros((8, 10), np.uint8)] * 2] * 4
        self.raises(kvtier.InvalidArgument, "holds 80 bytes; the geometry needs 8192",
                    self.cache.register_buffers, 8, small)
        self.raises(kvtier.InvalidArgument, "3 buffers given", self.cache.register_buffers, 8,
                    [np.zeros(1)] * 3)
        ro = np.zeros((8, 1024), np.uint8)
        ro.flags.writeable = False
        self.raises(kvtier.InvalidArgument, "read-only", self.cache.register_buffers, 8,
                    [[ro, ro]] * 4)
        nc = np.zeros((8, 2048), np.uint8)[:, ::2]
        self.raises(kvtier.InvalidArgument, "view of shape (8, 1024) cannot hold 8 pages of "
                    "16 tokens of 64 bytes", self.cache.register_buffers, 8, [[nc, nc]] * 4)
        # a strided view whose token is not one run of bytes
        gap = np.zeros((8, 16, 128), np.uint8)[:, :, ::2]
        self.raises(kvtier.InvalidArgument, "trailing dims (64,) (one token) are not "
                    "contiguous", self.cache.register_buffers, 8, [[gap, gap]] * 4)
        self.cache.register_engine(self.eng)
        self.raises(kvtier.InvalidArgument, "already registered", self.cache.register_engine, self.eng)

    def test_closed_handle(self):
        self.cache.close()
        self.cache.close()  # idempotent
        self.raises(kvtier.StateError, "Cache is closed", self.cache.lookup, [1, 2, 3])

    def test_group_refuses_bad_params(self):
        with kvtier.Fabric(2) as fab:
            self.raises(kvtier.InvalidArgument, "rank 2 of a 2-rank fabric", kvtier.Net.inproc, fab, 2)
            with kvtier.Net.inproc(fab, 0) as net:
                self.raises(kvtier.InvalidArgument, "timeout", kvtier.Group, net, 1, 1, 2, 1, 1,
                            timeout=0)
        self.raises(kvtier.InvalidArgument, "needs the hub's port", kvtier.Net.tcp, 1, 2)
        # secure by default: an exposed hub needs a secret or an explicit allow_insecure
        self.raises(kvtier.InvalidArgument, "not a loopback address and no secret is set", kvtier.Net.tcp,
                    0, 2, host="0.0.0.0")
        self.raises(kvtier.InvalidArgument, "allow_insecure must be True or False", kvtier.Net.tcp, 0, 2,
                    host="0.0.0.0", allow_insecure=1)
        kvtier.Net.tcp(0, 2, host="0.0.0.0", allow_insecure=True).close()
        kvtier.Net.tcp(0, 2, host="0.0.0.0", secret=b"0123456789abcdef").close()

    def test_sglang_rids_and_order(self):
        self.assertEqual(kvtier.rid64("a"), kvtier.rid64("a"))
        self.assertNotEqual(kvtier.rid64("a"), kvtier.rid64("b"))
        self.raises(kvtier.InvalidArgument, "rid is an empty string", kvtier.rid64, "")
        self.raises(kvtier.InvalidArgument, "expected int or str", kvtier.rid64, 1.0)

    def test_pending_load_before_step(self):
        with kvtier.Fabric(1) as fab, kvtier.EmulatedRank(0, transport=("inproc", fab)) as r:
            r.join(2.0)
            tok = np.arange(80)
            r.sgl.lookup_kv(tok, "x")
            pl = r.sgl.start_load_kv_layerwise("x", [0, 1, 2, 3, 4])
            self.raises(kvtier.StateError, "call step() first", pl.wait_layer, 0, 1)
            self.raises(kvtier.InvalidArgument, "already has a load queued",
                        r.sgl.start_load_kv, "x", [0])
            r.sgl.step()
            self.assertEqual(pl.status, kvtier.STATUS["ENOTFOUND"])  # nothing cached
            self.raises(kvtier.NotFound, "was refused", pl.wait_layer, 0, 1)
            self.raises(kvtier.InvalidArgument, "no load", r.sgl.wait_for_load, "y", 1)


class Offloading(unittest.TestCase):
    """vLLM-shaped OffloadingManager: per-block keys from vLLM hashes."""

    def test_store_lookup_load_evict(self):
        with geometry() as geo, kvtier.Config({"cpu_capacity": "256KiB", "block_tokens": 32}) as cfg, \
                kvtier.EmulatedEngine(geo, 64) as eng, kvtier.Cache(cfg, geo) as cache:
            cache.register_engine(eng)
            mgr = kvtier.OffloadingManager(cache, prefix=b"model-x")
            self.assertEqual(mgr.pages_per_block, 2)
            hashes = [bytes([i]) * 32 for i in range(4)]
            rng = np.random.default_rng(3)
            for l in range(4):
                for c in range(2):
                    eng.buffer(l, c)[:8] = rng.integers(0, 256, (8, 1024), dtype=np.uint8)
            self.assertEqual(mgr.lookup(hashes), 0)
            out = mgr.prepare_store(hashes)
            self.assertEqual(out.block_hashes_to_store, hashes)
            mgr.transfer(out.store_spec, list(range(8)))
            mgr.complete_store(hashes)
            self.assertEqual(mgr.lookup(hashes), 4)
            self.assertEqual(mgr.lookup(hashes[2:]), 2)  # any start index
            self.assertEqual(mgr.prepare_store(hashes).block_hashes_to_store, [])
            spec = mgr.prepare_load(hashes[1:3])
            mgr.transfer(spec, [40, 41, 42, 43])
            mgr.complete_load(hashes[1:3])
            for l in range(4):
                for c in range(2):
                    np.testing.assert_array_equal(eng.buffer(l, c)[40:44], eng.buffer(l, c)[2:6])
            # a cancelled store leaves no trace
            out = mgr.prepare_store([b"new"])
            mgr.complete_store([b"new"], success=False)
            self.assertEqual(mgr.lookup([b"new"]), 0)
            # fill the small tier: old blocks are evicted, LRU first
            mgr.touch(hashes[:1])
            for i in range(24):
                o = mgr.prepare_store([i + 1000])
                if o is None:
                    break
                mgr.transfer(o.store_spec, [0, 1] * len(o.store_spec.tasks))
                mgr.complete_store([i + 1000])
            self.assertGreater(cache.stats()["evicted_blocks"], 0)
            self.assertRaises(kvtier.NotFound, mgr.prepare_load, [b"missing"])
            self.assertRaises(kvtier.InvalidArgument, mgr.lookup, b"one-hash")
            self.assertRaises(kvtier.InvalidArgument, mgr.complete_load, [b"never"])
            self.assertRaises(kvtier.InvalidArgument, mgr.transfer, spec, [1])



class NetTransport(unittest.TestCase):
    """Net.tcp's transport: the links stay on TCP or move onto UCX."""

    def test_transport_names(self):
        with self.assertRaises(kvtier.InvalidArgument):
            kvtier.Net.tcp(0, 2, transport="rdma")
        for name in ("tcp", "UCX"):
            net = kvtier.Net.tcp(0, 2, transport=name)  # UCX loads only when a rank joins
            try:
                self.assertGreater(net.port, 0)
            finally:
                net.close()


class Logging(unittest.TestCase):
    """kvt_set_log_handler from Python: the hub's refusal of a stranger
    reaches the handler (and logging), on the library's terms."""

    def refuse_a_stranger(self):
        net = kvtier.Net.tcp(0, 2)
        try:
            s = socket.create_connection(("127.0.0.1", net.port))
            s.sendall(b"not a kvtier hello" * 4)
            with self.assertRaises(kvtier.Timeout):
                net.connect(0.5)
            s.close()
        finally:
            net.close()

    def test_handler_receives_lines(self):
        lines = []
        kvtier.set_log_handler(lambda level, line: lines.append((level, line)))
        try:
            self.refuse_a_stranger()
        finally:
            kvtier.set_log_handler(None)
        self.assertTrue(any(level == "warn" and "refused connection from 127.0.0.1:" in line
                            for level, line in lines), lines)
        n = len(lines)
        self.refuse_a_stranger()  # the handler is gone: nothing more arrives
        self.assertEqual(len(lines), n)

    def test_route_to_logging_and_level(self):
        log = logging.getLogger("kvtier.test")
        with self.assertLogs(log, level="WARNING") as got:
            kvtier.route_to_logging(log)
            try:
                self.refuse_a_stranger()
            finally:
                kvtier.set_log_handler(None)
        self.assertTrue(any("refused connection" in m for m in got.output), got.output)
        with self.assertRaises(kvtier.InvalidArgument):
            kvtier.set_log_level("loud")
        kvtier.set_log_level("error")  # warn lines are filtered out now
        lines = []
        kvtier.set_log_handler(lambda level, line: lines.append(line))
        try:
            self.refuse_a_stranger()
        finally:
            kvtier.set_log_handler(None)
            kvtier.set_log_level("warn")
        self.assertEqual(lines, [])

if __name__ == "__main__":
    unittest.main()
