"""kvtier.sglang_hicache: (a) conformance of every method name and parameter
list with SGLang's HiCacheStorage, recorded from SGLang's source; (b) the
backend driven the way SGLang drives it: factory construction,
register_mem_pool_host with host pools of each layout (MHA and MLA),
batch_set_v1 / batch_exists / batch_get_v1 with page-aligned host_indices,
every loaded page byte-checked, a page written under one layout read under
another, concurrent prefetch and backup threads, a corrupt page in the
middle, separate processes for TP ranks, and the errors."""
import inspect
import itertools
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import unittest

import numpy as np

from _util import HERE, skip_if_unloadable


def setUpModule():
    skip_if_unloadable()
    global kvtier, hc, fakes
    import kvtier
    import kvtier.sglang_hicache as hc
    import _sglang_fakes as fakes


# Recorded from sgl-project/sglang, commit 001067fffe33427bee0ed2f007fb7551a1d76b44,
# python/sglang/srt/mem_cache/hicache_storage.py (class HiCacheStorage): method ->
# parameters after self, each (name, default) with REQ for no default.
REQ = object()
HICACHE_STORAGE_METHODS = {
    "register_mem_pool_host": [("mem_pool_host", REQ)],
    "register_mem_host_pool_v2": [("host_pool", REQ), ("host_pool_name", REQ)],
    "batch_exists_v2": [("keys", REQ), ("pool_transfers", None), ("extra_info", None)],
    "batch_get_v2": [("transfers", REQ), ("extra_info", None)],
    "batch_set_v2": [("transfers", REQ), ("extra_info", None)],
    "batch_get_v1": [("keys", REQ), ("host_indices", REQ), ("extra_info", None)],
    "batch_set_v1": [("keys", REQ), ("host_indices", REQ), ("extra_info", None)],
    "get": [("key", REQ), ("target_location", None), ("target_sizes", None)],
    "batch_get": [("keys", REQ), ("target_locations", None), ("target_sizes", None)],
    "set": [("key", REQ), ("value", None), ("target_location", None), ("target_sizes", None)],
    "batch_set": [("keys", REQ), ("values", None), ("target_locations", None),
                  ("target_sizes", None)],
    "exists": [("key", REQ)],
    "batch_exists": [("keys", REQ), ("extra_info", None)],
    "clear": [],
    "get_stats": [],
}
ABSTRACT = {"get", "batch_get", "set", "batch_set", "exists"}
# Same file: the dataclasses, fields in order with defaults.
STORAGE_CONFIG_FIELDS = [
    ("tp_rank", REQ), ("tp_size", REQ), ("pp_rank", REQ), ("pp_size", REQ),
    ("attn_cp_rank", REQ), ("attn_cp_size", REQ), ("is_mla_model", REQ),
    ("enable_storage_metrics", REQ), ("is_page_first_layout", REQ), ("model_name", REQ),
    ("dp_rank", 0), ("dp_size", 1), ("tp_lcm_size", None), ("should_split_heads", False),
    ("extra_config", None)]
EXTRA_INFO_FIELDS = [("prefix_keys", None), ("extra_info", None)]
# python/sglang/srt/metrics/collector.py, same commit: what get_stats() hands
# StorageMetricsCollector.log_storage_metrics (it asserts the type).
STORAGE_METRICS_FIELDS = ["prefetch_pgs", "backup_pgs", "prefetch_bandwidth",
                          "backup_bandwidth"]
# storage/backend_factory.py, _create_dynamic_backend: backend_class(storage_config, kwargs).
FACTORY_CALL_ARGS = 2

OPTS = {"kvtier_options": {"huge_pages": False}, "cpu_capacity": "8MiB"}


def params(fn):
    ps = list(inspect.signature(fn).parameters.values())[1:]  # after self
    return [(p.name, REQ if p.default is inspect.Parameter.empty else p.default) for p in ps]


class Conformance(unittest.TestCase):
    def check_class(self, cls):
        for name, want in HICACHE_STORAGE_METHODS.items():
            fn = getattr(cls, name, None)
            self.assertTrue(callable(fn), "%s.%s missing" % (cls.__name__, name))
            self.assertEqual(params(fn), want, "%s.%s parameters" % (cls.__name__, name))

    def test_base_matches_sglang(self):
        self.check_class(hc.HiCacheStorage)
        self.assertEqual(set(hc.HiCacheStorage.__abstractmethods__), ABSTRACT)

    def test_backend_matches_sglang(self):
        self.check_class(hc.KvtierHiCacheStorage)
        self.assertTrue(issubclass(hc.KvtierHiCacheStorage, hc.HiCacheStorage))
        self.assertEqual(hc.KvtierHiCacheStorage.__abstractmethods__, frozenset())
        init = list(inspect.signature(hc.KvtierHiCacheStorage.__init__).parameters)[1:]
        self.assertEqual(len([p for p in init]), FACTORY_CALL_ARGS)

    def test_dataclasses_match_sglang(self):
        import dataclasses
        for cls, want in ((hc.HiCacheStorageConfig, STORAGE_CONFIG_FIELDS),
                          (hc.HiCacheStorageExtraInfo, EXTRA_INFO_FIELDS)):
            got = [(f.name, REQ if f.default is dataclasses.MISSING else f.default)
                   for f in dataclasses.fields(cls)]
            self.assertEqual(got, want, cls.__name__)
        self.assertEqual([f.name for f in dataclasses.fields(hc.StorageMetrics)],
                         STORAGE_METRICS_FIELDS)

    def test_real_base_without_sglang_metrics(self):
        """An SGLang whose metrics module does not import (an optional
        dependency missing) still gives kvtier's class SGLang's own base, so
        the factory's issubclass check passes; only StorageMetrics falls
        back. Before, any failed import took the stand-in base silently."""
        import os
        import subprocess
        import sys
        import textwrap
        root = tempfile.mkdtemp(prefix="kvt-fake-sglang-")
        self.addCleanup(shutil.rmtree, root, ignore_errors=True)
        pkg = os.path.join(root, "sglang", "srt", "mem_cache")
        os.makedirs(pkg)
        for d in ("sglang", "sglang/srt", "sglang/srt/mem_cache"):
            open(os.path.join(root, d, "__init__.py"), "w").close()
        with open(os.path.join(pkg, "hicache_storage.py"), "w") as f:
            f.write(textwrap.dedent("""
                from dataclasses import dataclass
                class HiCacheStorage:
                    pass
                @dataclass
                class HiCacheStorageConfig:
                    tp_rank: int = 0
                """))
        os.makedirs(os.path.join(root, "sglang", "srt", "metrics"))
        with open(os.path.join(root, "sglang", "srt", "metrics", "__init__.py"), "w") as f:
            f.write("raise ImportError('prometheus_client is not installed')\n")
        code = textwrap.dedent("""
            import kvtier.sglang_hicache as hc
            from sglang.srt.mem_cache.hicache_storage import HiCacheStorage
            assert hc.SGLANG_IMPORTED, hc.base_description()
            assert issubclass(hc.KvtierHiCacheStorage, HiCacheStorage)
            assert hc.StorageMetrics.__module__.startswith("kvtier."), hc.StorageMetrics
            assert hc.HiCacheStorageExtraInfo.__module__.startswith("kvtier.")
            print(hc.base_description())
            """)
        env = dict(os.environ)
        here = os.path.dirname(os.path.abspath(__file__))
        env["PYTHONPATH"] = os.pathsep.join([root, os.path.join(here, "..")] +
                                            [env["PYTHONPATH"]] if env.get("PYTHONPATH") else
                                            [root, os.path.join(here, "..")])
        p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                           text=True, timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("SGLang's sglang.srt.mem_cache.hicache_storage.HiCacheStorage", p.stdout)

    def test_real_sglang_when_importable(self):
        if not hc.SGLANG_IMPORTED:
            self.skipTest("sglang is not importable here; the stand-in base was checked")
        from sglang.srt.mem_cache.hicache_storage import HiCacheStorage
        self.assertIs(hc.HiCacheStorage, HiCacheStorage)


class Base(unittest.TestCase):
    def setUp(self):
        self.backends = []
        self.tmp = tempfile.mkdtemp(prefix="kvt-sglang-")

    def tearDown(self):
        for b in self.backends:
            b.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def backend(self, pool, mla=False, extra=None, **kw):
        e = dict(OPTS)
        e.update(extra or {})
        cfg = fakes.storage_config(mla=mla, extra=e, layout=pool.layout, **kw)
        b = fakes.create_backend(cfg, pool)
        self.backends.append(b)
        return b

    def assert_page_equal(self, dst_pool, dst, src_pool, src, what):
        a, b = dst_pool.page_bytes(dst), src_pool.page_bytes(src)
        self.assertEqual(sorted(a), sorted(b))
        for k in a:
            if not np.array_equal(a[k], b[k]):
                self.fail("%s: page %d (component, layer) %s differs from page %d"
                          % (what, dst, k, src))

    def roundtrip(self, pool, backend, keys, src, dst, what):
        ok = backend.batch_set_v1(keys, pool.host_indices(src))
        self.assertEqual(ok, [True] * len(keys), what)
        self.assertEqual(backend.batch_exists(keys), len(keys), what)
        for p in dst:
            pool.set_page_bytes(p, 0x5A)
        others = {p: pool.page_bytes(p) for p in range(pool.page_num) if p not in dst}
        got = backend.batch_get_v1(keys, pool.host_indices(dst))
        self.assertEqual(got, [True] * len(keys), what)
        for s, d in zip(src, dst):
            self.assert_page_equal(pool, d, pool, s, what)
        for p, want in others.items():  # a load writes its pages and nothing else
            now = pool.page_bytes(p)
            for k in want:
                if not np.array_equal(now[k], want[k]):
                    self.fail("%s: page %d (component, layer) %s changed by a load into %s"
                              % (what, p, k, dst))


class Layouts(Base):
    def test_every_layout_mha_and_mla_byte_verified(self):
        for mla, layout, zero_copy in itertools.product((False, True), hc.LAYOUTS, (True, False)):
                what = "%s %s %s" % ("MLA" if mla else "MHA", layout,
                                     "zero copy" if zero_copy else "staging")
                pool = fakes.FakeHostPool(layout, mla=mla, seed=hash(what) % 1000)
                b = self.backend(pool, mla=mla, extra={"staging_pages": 5, "zero_copy": zero_copy})
                # every layout registers the pool itself (strided views) unless told not to
                self.assertEqual(b.staging is None, zero_copy, what)
                keys = ["%s-page-%d" % (what, i) for i in range(9)]
                self.roundtrip(pool, b, keys, list(range(9)), list(range(12, 21)), what)
                st = b.stats()
                self.assertEqual(st["get_hits"], 9)
                self.assertEqual(st["kvtier_stored_blocks"], 9)
                self.assertGreater(st["kvtier_loaded_bytes"], 0)

    def test_misses_are_false_never_none_or_raise(self):
        pool = fakes.FakeHostPool("layer_first")
        b = self.backend(pool)
        keys = ["k%d" % i for i in range(6)]
        self.assertEqual(b.batch_exists(keys), 0)
        self.assertFalse(b.exists("k0"))
        self.assertEqual(b.batch_get_v1(keys, pool.host_indices(range(6))), [False] * 6)
        self.assertEqual(b.batch_set_v1(keys[:3], pool.host_indices([0, 1, 2])), [True] * 3)
        before = b.stats()
        self.assertEqual(b.batch_exists(keys), 3)
        self.assertTrue(b.exists("k2"))
        after = b.stats()  # peeks: no load planned, nothing pinned to cancel
        for k in ("kvtier_lookups", "kvtier_cancelled_tasks", "kvtier_hit_tokens"):
            self.assertEqual(after[k], before[k], k)
        got = b.batch_get_v1(keys, pool.host_indices(range(10, 16)))
        self.assertEqual(got, [True] * 3 + [False] * 3)
        for s, d in zip(range(3), range(10, 13)):
            self.assert_page_equal(pool, d, pool, s, "leading run")
        self.assertEqual(b.batch_get_v1([], pool.host_indices([])), [])
        self.assertEqual(b.batch_set_v1([], pool.host_indices([])), [])
        # storing what is stored is a success, and stores nothing new
        self.assertEqual(b.batch_set_v1(keys[:3], pool.host_indices([3, 4, 5])), [True] * 3)
        self.assertEqual(b.stats()["kvtier_stored_blocks"], 3)

    def test_written_under_one_layout_read_under_another(self):
        """Same model and rank, the SSD tier kept across a restart with a
        different host layout: the block format does not depend on it."""
        layouts = list(hc.LAYOUTS)
        for mla in (False, True):
            for i, src_layout in enumerate(layouts):
                dst_layout = layouts[(i + 1) % len(layouts)]
                ssd = os.path.join(self.tmp, "x-%d-%d" % (mla, i))
                extra = {"ssd_dir": ssd, "ssd_capacity": "4MiB"}
                a = fakes.FakeHostPool(src_layout, mla=mla, seed=10 + i)
                ba = self.backend(a, mla=mla, extra=extra)
                keys = ["x%d" % j for j in range(5)]
                self.assertEqual(ba.batch_set_v1(keys, a.host_indices(range(5))), [True] * 5)
                ba.cache.flush(10)
                ba.close()
                b = fakes.FakeHostPool(dst_layout, mla=mla, seed=99)
                bb = self.backend(b, mla=mla, extra=extra)
                self.assertEqual(bb.stats()["kvtier_recovered_blocks"], 5)
                self.assertEqual(bb.batch_exists(keys), 5)
                self.assertEqual(bb.batch_get_v1(keys, b.host_indices(range(7, 12))), [True] * 5)
                for s, d in zip(range(5), range(7, 12)):
                    self.assert_page_equal(b, d, a, s, "%s -> %s" % (src_layout, dst_layout))
                bb.close()

    def test_value_calls_through_staging(self):
        pool = fakes.FakeHostPool("page_first")
        b = self.backend(pool, extra={"zero_copy": False})
        self.assertIsNone(b.get("nothing"))
        page = np.random.default_rng(3).integers(0, 256, b.block_bytes(), dtype=np.uint8)
        self.assertTrue(b.set("v0", page))
        got = b.get("v0")
        self.assertTrue(np.array_equal(got, page))
        dst = np.zeros(b.block_bytes(), np.uint8)
        self.assertIs(b.get("v0", dst), dst)
        self.assertTrue(np.array_equal(dst, page))
        self.assertTrue(b.batch_set(["v1", "v2"], [page[::-1].copy(), page]))
        got = b.batch_get(["v1", "v2", "nope"])
        self.assertTrue(np.array_equal(got[0], page[::-1]))
        self.assertIsNone(got[2])
        # a value is a page in kvtier's block format: layer-major, K then V
        b.batch_get_v1(["v0"], pool.host_indices([3]))
        pb = pool.page_bytes(3)
        flat = np.concatenate([pb[(c, l)].ravel() for l in range(3) for c in range(2)])
        self.assertTrue(np.array_equal(flat, page))
        # zero copy has no staging area: values are refused, saying why
        for layout in hc.LAYOUTS:
            z = self.backend(fakes.FakeHostPool(layout))
            with self.assertRaisesRegex(NotImplementedError, "zero_copy: false"):
                z.get("v0")

    def test_get_stats_is_sglang_storage_metrics(self):
        pool = fakes.FakeHostPool("layer_first")
        off = self.backend(pool)
        off.batch_set_v1(["a"], pool.host_indices([0]))
        self.assertIsNone(off.get_stats())  # metrics off: SGLang's default
        on = self.backend(fakes.FakeHostPool("page_first"), metrics=True)
        pool2 = on.mem_pool_host
        self.assertEqual(on.batch_set_v1(["a", "b", "c"], pool2.host_indices([0, 1, 2])),
                         [True] * 3)
        self.assertEqual(on.batch_get_v1(["a", "b", "x"], pool2.host_indices([5, 6, 7])),
                         [True, True, False])
        m = on.get_stats()
        self.assertIsInstance(m, hc.StorageMetrics)
        self.assertEqual((m.backup_pgs, m.prefetch_pgs), ([3], [2]))
        self.assertTrue(all(v > 0 for v in m.backup_bandwidth + m.prefetch_bandwidth))
        m2 = on.get_stats()  # drained: only what happened since
        self.assertEqual((m2.backup_pgs, m2.prefetch_pgs), ([], []))

    def test_clear_and_v2(self):
        pool = fakes.FakeHostPool("layer_first")
        b = self.backend(pool)
        b.batch_set_v1(["a", "b"], pool.host_indices([0, 1]))
        self.assertEqual(b.batch_exists(["a", "b"]), 2)
        b.clear()
        self.assertEqual(b.batch_exists(["a", "b"]), 0)
        self.assertEqual(b.batch_set_v1(["a"], pool.host_indices([0])), [True])
        for name, args in (("batch_exists_v2", (["a"],)), ("batch_get_v2", ([],)),
                           ("batch_set_v2", ([],))):
            with self.assertRaisesRegex(NotImplementedError, "extra host pools"):
                getattr(b, name)(*args)


class FakeTorch:
    """Just the torch.Tensor surface the backend reads (torch is not
    installed here): a CPU tensor over a numpy array, or a "cuda" one."""
    __module__ = "torch"

    class _Dev:
        def __init__(self, t):
            self.type = t

        def __str__(self):
            return self.type

    def __init__(self, arr, device="cpu"):
        self.a, self.device = arr, FakeTorch._Dev(device)
        self.shape, self.dtype = arr.shape, "torch.float16"

    def data_ptr(self):
        return self.a.ctypes.data

    def numel(self):
        return self.a.size

    def element_size(self):
        return self.a.itemsize

    def is_contiguous(self):
        return self.a.flags.c_contiguous

    def cpu(self):
        return self

    def numpy(self):
        return self.a


class TorchShaped(Base):
    def test_torch_host_pool_and_indices(self):
        pool = fakes.FakeHostPool("page_first_direct", seed=21)
        arr = pool.kv_buffer
        pool.kv_buffer = FakeTorch(arr)
        b = self.backend(pool)
        self.assertIn("dtype=float16", b.namespace)
        keys = ["t%d" % i for i in range(4)]
        pool.kv_buffer = arr  # the test reads pages through numpy
        self.assertEqual(b.batch_set_v1(keys, FakeTorch(pool.host_indices(range(4)))), [True] * 4)
        self.assertEqual(b.batch_get_v1(keys, FakeTorch(pool.host_indices(range(8, 12)))),
                         [True] * 4)
        for s, d in zip(range(4), range(8, 12)):
            self.assert_page_equal(pool, d, pool, s, "torch-shaped pool")
        gpu = fakes.FakeHostPool("layer_first")
        gpu.kv_buffer = FakeTorch(gpu.kv_buffer, "cuda")
        with self.assertRaisesRegex(ValueError, "is on cuda; the HiCache host pool must be in "
                                    "host memory"):
            fakes.create_backend(fakes.storage_config(extra=OPTS), gpu)


class Namespaces(Base):
    def test_mha_ranks_apart_mla_shared(self):
        pool = fakes.FakeHostPool("layer_first")
        r0 = self.backend(pool, tp_rank=0, tp_size=2)
        r1 = self.backend(fakes.FakeHostPool("layer_first"), tp_rank=1, tp_size=2)
        self.assertNotEqual(r0.namespace, r1.namespace)
        mpool = fakes.FakeHostPool("layer_first", mla=True)
        m0 = self.backend(mpool, mla=True, tp_rank=0, tp_size=2)
        m1 = self.backend(fakes.FakeHostPool("page_first", mla=True), mla=True, tp_rank=1,
                          tp_size=2)
        self.assertEqual(m0.namespace, m1.namespace)  # one copy for all TP ranks
        other = self.backend(fakes.FakeHostPool("layer_first"), model="org/other")
        self.assertNotEqual(other.namespace, r0.namespace)
        f32 = self.backend(fakes.FakeHostPool("layer_first", dtype=np.float32))
        self.assertNotEqual(f32.namespace.split("|")[2], r0.namespace.split("|")[2])
        # a page stored under one model is not found under another
        r0.batch_set_v1(["p"], pool.host_indices([0]))
        self.assertEqual(r0.batch_exists(["p"]), 1)
        salted = self.backend(pool, extra={"namespace": "tenant-b"}, tp_rank=0, tp_size=2)
        self.assertNotEqual(salted.namespace, r0.namespace)


class Corruption(Base):
    def test_corrupt_page_in_the_middle_loads_false(self):
        ssd = os.path.join(self.tmp, "corrupt")
        extra = {"ssd_dir": ssd, "ssd_capacity": "4MiB"}
        pool = fakes.FakeHostPool("layer_first", seed=5)
        b = self.backend(pool, extra=extra)
        keys = ["c%d" % i for i in range(7)]
        self.assertEqual(b.batch_set_v1(keys, pool.host_indices(range(7))), [True] * 7)
        b.cache.flush(10)
        rank_dir = b.ssd_dir
        b.close()
        # Flip a byte of page 3's block in the data file (found by its bytes).
        path = os.path.join(rank_dir, "kvtier.data")
        with open(path, "r+b") as f:
            data = f.read()
            needle = pool.page_bytes(3)[(0, 0)].tobytes()
            at = data.find(needle)
            self.assertGreaterEqual(at, 0, "page 3 not found in the data file")
            self.assertEqual(data.find(needle, at + 1), -1)
            f.seek(at + 5)
            f.write(bytes([data[at + 5] ^ 0xFF]))
        b2 = self.backend(pool, extra=extra)
        dst = list(range(10, 17))
        for p in dst:
            pool.set_page_bytes(p, 0x77)
        got = b2.batch_get_v1(keys, pool.host_indices(dst))
        self.assertEqual(got, [True, True, True, False, True, True, True])
        for s, d, ok in zip(range(7), dst, got):
            if ok:
                self.assert_page_equal(pool, d, pool, s, "around the corrupt page")
        bad = pool.page_bytes(13)
        self.assertTrue(all((v == 0x77).all() for v in bad.values()),
                        "the corrupt page's host page was written")
        st = b2.stats()
        self.assertEqual(st["kvtier_corrupt_blocks"], 1)
        self.assertEqual(st["get_failed"], 1)
        # the corrupt page is gone: SGLang sees a leading run of 3
        self.assertEqual(b2.batch_exists(keys), 3)
        # and a new backup fills it again
        self.assertEqual(b2.batch_set_v1(keys[3:4], pool.host_indices([3])), [True])
        self.assertEqual(b2.batch_exists(keys), 7)


def spy_calls(backend, names=("peek", "lookup", "prepare_store", "launch", "wait", "cancel",
                              "stats")):
    """Wraps the backend's cache (or client) methods; returns the list of
    the names called, in order."""
    calls = []
    for name in names:
        real = getattr(backend.cache, name)
        setattr(backend.cache, name,
                lambda *a, _r=real, _n=name, **kw: calls.append(_n) or _r(*a, **kw))
    return calls


class Batched(Base):
    """A batch is a constant number of cache calls (independent-keys
    requests), also with some pages stored already and with a staging area
    smaller than the batch."""

    def test_set_around_stored_pages(self):
        pool = fakes.FakeHostPool("page_first", seed=11)
        b = self.backend(pool)
        keys = ["m%d" % i for i in range(8)]
        self.assertEqual(b.batch_set_v1([keys[i] for i in (0, 1, 4)],
                                        pool.host_indices([0, 1, 4])), [True] * 3)
        calls = spy_calls(b)
        self.assertEqual(b.batch_set_v1(keys, pool.host_indices(range(8))), [True] * 8)
        # plans [2, 4) then [5, 8): key 4 is stored
        self.assertEqual(calls.count("prepare_store"), 2)
        self.assertEqual(calls.count("launch"), 2)
        st = b.stats()
        self.assertEqual((st["set_present"], st["set_stored"], st["set_failed"]), (3, 8, 0))
        self.assertEqual(st["kvtier_stored_blocks"], 8)
        dst = list(range(12, 20))
        got = b.batch_get_v1(keys, pool.host_indices(dst))
        self.assertEqual(got, [True] * 8)
        for s_, d in zip(range(8), dst):
            self.assert_page_equal(pool, d, pool, s_, "batched set")
        # a key twice in one batch (a plan ends before a repeated key): the
        # first copy is stored; the second is present (True) or still being
        # stored by the first's task (False), as it ends
        got = b.batch_set_v1(["d0", "d1", "d0"], pool.host_indices([9, 10, 9]))
        self.assertEqual(got[:2], [True, True])
        self.assertEqual(b.stats()["unavailable"], 0)
        self.assertEqual(b.batch_exists(["d0", "d1"]), 2)

    def test_staging_smaller_than_the_batch(self):
        pool = fakes.FakeHostPool("layer_first", seed=12)
        b = self.backend(pool, extra={"zero_copy": False, "staging_pages": 3})
        keys = ["s%d" % i for i in range(8)]
        calls = spy_calls(b)
        self.assertEqual(b.batch_set_v1(keys, pool.host_indices(range(8))), [True] * 8)
        self.assertEqual(calls.count("prepare_store"), 3)  # 3 + 3 + 2 slots
        del calls[:]
        self.assertEqual(b.batch_exists(keys + ["nope"]), 8)
        self.assertEqual(calls, ["peek"])
        del calls[:]
        dst = list(range(12, 21))
        got = b.batch_get_v1(keys + ["nope"], pool.host_indices(dst))
        self.assertEqual(got, [True] * 8 + [False])
        self.assertEqual(calls.count("lookup"), 3)  # 3 + 3 + 3 (the last run ends at "nope")
        self.assertEqual(calls.count("launch"), 3)
        for s_, d in zip(range(8), dst):
            self.assert_page_equal(pool, d, pool, s_, "staged")
        self.assertEqual(b.stats()["get_failed"], 0)


class Threads(Base):
    def run_threads(self, layout, staging_pages, zero_copy=True):
        pool = fakes.FakeHostPool(layout, pages=64, seed=7)
        b = self.backend(pool, extra={"staging_pages": staging_pages, "zero_copy": zero_copy})
        # pages 0..15: stored before; 16..31: backed up by the threads
        pre = ["pre%d" % i for i in range(16)]
        self.assertEqual(b.batch_set_v1(pre, pool.host_indices(range(16))), [True] * 16)
        errors = []

        def backup(t):
            try:
                for r in range(6):
                    ks = ["t%d-r%d-%d" % (t, r, i) for i in range(4)]
                    src = [16 + 8 * t + i for i in range(4)]
                    if b.batch_set_v1(ks, pool.host_indices(src)) != [True] * 4:
                        errors.append("backup %d round %d failed" % (t, r))
            except Exception as e:  # noqa: BLE001
                errors.append("backup %d: %r" % (t, e))

        def prefetch(t):
            try:
                dst = [40 + 12 * t + i for i in range(12)]
                for r in range(6):
                    sel = [(r * 5 + t + i) % 16 for i in range(12)]
                    n = b.batch_exists([pre[i] for i in sel])
                    got = b.batch_get_v1([pre[i] for i in sel], pool.host_indices(dst))
                    if n != 12 or got != [True] * 12:
                        errors.append("prefetch %d round %d: %d %s" % (t, r, n, got))
                        continue
                    for s, d in zip(sel, dst):
                        a, c = pool.page_bytes(d), pool.page_bytes(s)
                        if any(not np.array_equal(a[k], c[k]) for k in a):
                            errors.append("prefetch %d: page %d != %d" % (t, d, s))
            except Exception as e:  # noqa: BLE001
                errors.append("prefetch %d: %r" % (t, e))

        ts = [threading.Thread(target=backup, args=(t,)) for t in range(2)]
        ts += [threading.Thread(target=prefetch, args=(t,)) for t in range(2)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(60)
            self.assertFalse(t.is_alive())
        self.assertEqual(errors, [])
        for t in range(2):
            ks = ["t%d-r5-%d" % (t, i) for i in range(4)]
            self.assertEqual(b.batch_get_v1(ks, pool.host_indices(range(60, 64))), [True] * 4)
            for i in range(4):
                self.assert_page_equal(pool, 60 + i, pool, 16 + 8 * t + i, "backup")

    def test_concurrent_prefetch_and_backup_zero_copy(self):
        self.run_threads("layer_first", 256)

    def test_concurrent_prefetch_and_backup_zero_copy_page_first(self):
        self.run_threads("page_first", 256)

    def test_concurrent_prefetch_and_backup_staging_contended(self):
        self.run_threads("page_first_direct", 6, zero_copy=False)


class Errors(Base):
    def test_bad_arguments_say_what(self):
        pool = fakes.FakeHostPool("layer_first")
        b = self.backend(pool)
        with self.assertRaisesRegex(ValueError, "2 keys need 8 host_indices"):
            b.batch_get_v1(["a", "b"], pool.host_indices([0]))
        bad = pool.host_indices([0, 1]) + 1
        with self.assertRaisesRegex(ValueError, "key 0 .'a'. are not one whole page"):
            b.batch_set_v1(["a", "b"], bad)
        with self.assertRaisesRegex(ValueError, "key 1 .'b'. are not one whole page"):
            b.batch_set_v1(["a", "b"], pool.host_indices([0, 99]))
        with self.assertRaisesRegex(ValueError, "1-D integer"):
            b.batch_get_v1(["a"], np.zeros(4, np.float32))

    def test_construction_refusals(self):
        pool = fakes.FakeHostPool("layer_first")
        cfg = fakes.storage_config(extra=dict(OPTS, interface_v1=0))
        with self.assertRaisesRegex(ValueError, '"interface_v1": 1'):
            fakes.create_backend(cfg, pool)
        cfg = fakes.storage_config(extra=dict(OPTS, cpu_capacty="1GiB"))
        with self.assertRaisesRegex(ValueError, "unknown extra_config key.s. cpu_capacty"):
            fakes.create_backend(cfg, pool)
        cfg = fakes.storage_config(extra=dict(OPTS, socket="/run/kvtier.sock"))
        with self.assertRaisesRegex(ValueError, "cpu_capacity.* the `kvtier serve` process "
                                    "owns in node server mode"):
            fakes.create_backend(cfg, pool)
        cfg = fakes.storage_config(extra={"socket": "/run/kvtier.sock", "workers": 4})
        with self.assertRaisesRegex(ValueError, "workers configure the tiers.* `workers` .this "
                                    "process's own copy threads. comes from KVTIER_WORKERS"):
            fakes.create_backend(cfg, pool)
        cfg = fakes.storage_config(extra={"socket": os.path.join(self.tmp, "none.sock"),
                                          "timeout": 0.2})
        # A server that is not there is no refusal: SGLang starts, every
        # call a miss until it answers (NodeServerMode.test_server_comes_later).
        down = fakes.create_backend(cfg, pool)
        self.assertEqual(down.batch_exists(["k0", "k1"]), 0)
        down.close()
        bad = fakes.FakeHostPool("layer_first")
        bad.layout = "page_head"
        with self.assertRaisesRegex(NotImplementedError, "'page_head' is not supported"):
            fakes.create_backend(fakes.storage_config(extra=OPTS), bad)
        mla_as_mha = fakes.FakeHostPool("layer_first", mla=True)
        with self.assertRaisesRegex(ValueError, "MHA layer_first host pool: kv_buffer has 4 "
                                    "dims, expected 5"):
            fakes.create_backend(fakes.storage_config(extra=OPTS), mla_as_mha)
        b = hc.KvtierHiCacheStorage(fakes.storage_config(extra=OPTS), {})
        with self.assertRaisesRegex(RuntimeError, "register_mem_pool_host was not called"):
            b.batch_exists(["a"])


class RankProcesses(Base):
    def test_tp_ranks_as_processes(self):
        """SGLang runs one process per TP rank, each with its own backend."""
        procs = []
        for rank in range(2):
            out = os.path.join(self.tmp, "rank%d.txt" % rank)
            procs.append((out, subprocess.Popen(
                [sys.executable, os.path.join(HERE, "sglang_rank_worker.py"), str(rank), "2",
                 os.path.join(self.tmp, "ssd"), out], env=dict(os.environ))))
        results = []
        for out, p in procs:
            self.assertEqual(p.wait(120), 0)
            with open(out) as f:
                results.append(f.read().split("\n"))
        self.assertEqual([r[0] for r in results], ["ok", "ok"])
        self.assertNotEqual(results[0][1], results[1][1])  # MHA: a namespace per rank
        self.assertNotEqual(results[0][2], results[1][2])  # and an SSD directory per rank


def stop_server_quiet(p):
    """Stops a `kvtier serve` started by the test (any way it ends)."""
    if p.poll() is None:
        p.terminate()
        p.wait(10)


class NodeServerMode(unittest.TestCase):
    """extra_config "socket": every TP rank attaches to one `kvtier serve`."""

    def setUp(self):
        from test_client import start_server
        self.tmp = tempfile.mkdtemp(prefix="kvtsgs")
        self.sock = os.path.join(self.tmp, "node.sock")
        self.srv = start_server(self.sock, "--set", "block_tokens=4", model=None)

    def tearDown(self):
        from test_client import stop_server
        if self.srv.poll() is None:
            stop_server(self.srv)
        shutil.rmtree(self.tmp, ignore_errors=True)

    def attached(self, seed, pages, salt=None):
        """(backend of TP rank 0 of 2 attached to the server, its pool)."""
        pool = fakes.FakeHostPool("page_first", seed=seed, pages=pages, layers=4, heads=1,
                                  head_dim=64)
        extra = {"socket": self.sock, "timeout": 10}
        if salt:
            extra["namespace"] = salt
        cfg = fakes.storage_config(tp_rank=0, tp_size=2, layout="page_first", extra=extra)
        b = fakes.create_backend(cfg, pool)
        self.addCleanup(b.close)
        return b, pool

    def test_two_tp_ranks_share_one_server(self):
        procs = []
        for rank in range(2):
            out = os.path.join(self.tmp, "rank%d.txt" % rank)
            procs.append((out, subprocess.Popen(
                [sys.executable, os.path.join(HERE, "sglang_rank_worker.py"), str(rank), "2",
                 "-", out, self.sock], env=dict(os.environ))))
        results = []
        for out, p in procs:
            self.assertEqual(p.wait(120), 0)
            with open(out) as f:
                results.append(f.read().split("\n"))
        self.assertEqual([r[0] for r in results], ["ok", "ok"])
        self.assertNotEqual(results[0][1], results[1][1])  # MHA: a namespace per rank
        self.assertEqual([r[2] for r in results], ["None", "None"])  # no SSD dir of its own
        # Both ranks' pages went to the one server: 8 pages each, stored by
        # one task and loaded by one task per rank (a batch is one request).
        geo = kvtier.Geometry.preset("tiny", 4, 2)
        with kvtier.Client(self.sock, geo, timeout_ms=3000) as cl:
            st = cl.stats()
        geo.close()
        self.assertEqual(st["stores"], 2)
        self.assertEqual(st["stored_blocks"], 16)
        self.assertEqual(st["loads"], 2)
        self.assertEqual(st["loaded_blocks"], 16)

    def test_backup_visible_to_other_ranks_on_return(self):
        """batch_set_v1 plans its stores visible=True (KVT_REQ_VISIBLE_AT_END):
        each task's wait returns only once the server checked its pages, so
        another rank's lookup right after finds them, with no publishing
        call: the MLA case, rank 0 writes and every rank reads."""
        b, pool = self.attached(3, 16)
        calls = []
        for name in ("wait", "stats"):
            real = getattr(b.cache, name)
            setattr(b.cache, name, lambda *a, _r=real, _n=name: calls.append(_n) or _r(*a))
        visible, real_prepare = [], b.cache.prepare_store
        b.cache.prepare_store = lambda **kw: visible.append(kw.get("visible")) or \
            real_prepare(**kw)
        keys = ["pub-%d" % i for i in range(8)]
        self.assertEqual(b.batch_set_v1(keys, pool.host_indices(range(8))), [True] * 8)
        self.assertEqual(calls, ["wait"])  # the 8 pages: one store task, nothing after
        self.assertEqual(visible, [True])
        other, _ = self.attached(4, 16)
        self.assertEqual(other.batch_exists(keys), 8)

    def test_clear_drops_this_namespace_only(self):
        """clear() (SGLang's flush_cache) in server mode removes this
        instance's pages from the server; another instance's (another
        namespace) still load, byte for byte."""
        a, pool_a = self.attached(11, 24, salt="inst-a")
        b, pool_b = self.attached(12, 24, salt="inst-b")
        keys = ["clr-%d" % i for i in range(8)]
        self.assertEqual(a.batch_set_v1(keys, pool_a.host_indices(range(8))), [True] * 8)
        self.assertEqual(b.batch_set_v1(keys, pool_b.host_indices(range(8))), [True] * 8)
        self.assertEqual((a.batch_exists(keys), b.batch_exists(keys)), (8, 8))
        with self.assertLogs("kvtier", "INFO") as logs:
            a.clear()
        self.assertTrue(any("8 pages of this rank's namespace removed" in m
                            for m in logs.output), logs.output)
        self.assertEqual(a.stats()["cleared_pages"], 8)
        self.assertEqual(a.batch_exists(keys), 0)
        self.assertEqual(b.batch_exists(keys), 8)
        dst = list(range(10, 18))
        for p in dst:
            pool_b.set_page_bytes(p, 0x5A)
        self.assertEqual(b.batch_get_v1(keys, pool_b.host_indices(dst)), [True] * 8)
        for s_, d in zip(range(8), dst):
            x, y = pool_b.page_bytes(d), pool_b.page_bytes(s_)
            for k in x:
                np.testing.assert_array_equal(x[k], y[k], "page %d %s" % (d, k))
        # stored again after the clear, found again
        self.assertEqual(a.batch_set_v1(keys, pool_a.host_indices(range(8))), [True] * 8)
        self.assertEqual(a.batch_exists(keys), 8)

    def test_batch_costs_a_constant_number_of_calls(self):
        """Through the server every call is a round trip: 8 pages cost one
        peek (batch_exists), one lookup and one launch (batch_get_v1), one
        prepare_store and one launch (batch_set_v1 of 8 new pages)."""
        b, pool = self.attached(9, 24)
        self.assertIsInstance(b.cache._cl, kvtier.Client)  # attached (client.DeferredClient)
        calls = spy_calls(b)
        keys = ["spy-%d" % i for i in range(8)]
        self.assertEqual(b.batch_exists(keys), 0)
        self.assertEqual(calls, ["peek"])
        del calls[:]
        self.assertEqual(b.batch_set_v1(keys, pool.host_indices(range(8))), [True] * 8)
        self.assertEqual(calls, ["prepare_store", "launch", "wait"])
        del calls[:]
        self.assertEqual(b.batch_exists(keys), 8)
        self.assertEqual(calls, ["peek"])
        del calls[:]
        dst = list(range(10, 18))
        for p in dst:
            pool.set_page_bytes(p, 0x5A)
        self.assertEqual(b.batch_get_v1(keys, pool.host_indices(dst)), [True] * 8)
        self.assertEqual(calls, ["lookup", "launch", "wait"])
        for s_, d in zip(range(8), dst):
            a, c = pool.page_bytes(d), pool.page_bytes(s_)
            for k in a:
                np.testing.assert_array_equal(a[k], c[k], "page %d %s" % (d, k))
        st = b.stats()
        self.assertEqual((st["get_hits"], st["set_stored"], st["exists_hits"]), (8, 8, 8))
        self.assertEqual((st["kvtier_loads"], st["kvtier_stores"]), (1, 1))

    def test_server_killed_and_restarted(self):
        """The node server dies mid-run (SIGKILL) and comes back on the same
        socket and SSD directory: while it is down every call answers (a
        miss, False pages, never an exception or None, nothing written into
        the host pool); the backend reattaches on its own and the pages
        flushed before the crash load back byte for byte."""
        from test_client import start_server
        stop_server_quiet(self.srv)
        ssd = os.path.join(self.tmp, "ssd")
        os.makedirs(ssd)
        extra = ("--set", "block_tokens=4", "--set", "ssd_dirs=" + ssd,
                 "--set", "ssd_capacity=8MiB")
        self.srv = start_server(self.sock, *extra, model=None)
        pool = fakes.FakeHostPool("page_first", seed=8, pages=24, layers=4, heads=1, head_dim=64)
        cfg = fakes.storage_config(tp_rank=0, tp_size=2, layout="page_first",
                                   extra={"socket": self.sock, "timeout": 5})
        b = fakes.create_backend(cfg, pool)
        self.addCleanup(b.close)
        vcfg = fakes.storage_config(tp_rank=0, tp_size=2, layout="page_first", extra={
            "socket": self.sock, "timeout": 5, "zero_copy": False})
        bv = fakes.create_backend(vcfg, fakes.FakeHostPool("page_first", pages=24, layers=4,
                                                           heads=1, head_dim=64))
        self.addCleanup(bv.close)
        keys = ["rs-%d" % i for i in range(6)]
        self.assertEqual(b.batch_set_v1(keys, pool.host_indices(range(6))), [True] * 6)
        b.cache.flush(10)  # durable on the SSD tier: the restart comes back warm
        self.srv.kill()
        self.srv.wait(10)
        os.unlink(self.sock)  # start_server waits for a fresh socket file
        dst = list(range(10, 16))
        for p in dst:
            pool.set_page_bytes(p, 0x3C)
        before = {p: pool.page_bytes(p) for p in range(pool.page_num)}
        self.assertEqual(b.batch_exists(keys), 0)
        self.assertEqual(b.batch_get_v1(keys, pool.host_indices(dst)), [False] * 6)
        self.assertEqual(b.batch_set_v1(["down"], pool.host_indices([20])), [False])
        self.assertIsNone(bv.get("rs-0"))  # the value calls too: a miss
        self.assertFalse(bv.set("down", np.zeros(bv.block_bytes(), np.uint8)))
        for p, want in before.items():
            now = pool.page_bytes(p)
            self.assertTrue(all(np.array_equal(now[k], want[k]) for k in want),
                            "page %d changed while the server was down" % p)
        self.srv = start_server(self.sock, *extra, model=None)
        deadline = time.monotonic() + 30
        while b.batch_exists(keys) != 6:  # the client reattaches with a bounded backoff
            self.assertLess(time.monotonic(), deadline, "no reattach within 30 s")
            time.sleep(0.05)
        self.assertEqual(b.batch_get_v1(keys, pool.host_indices(dst)), [True] * 6)
        for s_, d in zip(range(6), dst):
            a, c = pool.page_bytes(d), pool.page_bytes(s_)
            self.assertTrue(all(np.array_equal(a[k], c[k]) for k in a), "page %d" % d)

    def test_server_comes_later(self):
        """SGLang starts before its node server: the backend starts, answers
        misses (exists 0, get/set all False, the host pool untouched), then
        attaches on its own and pages stored after that load back byte for
        byte."""
        from kvtier.client import DeferredClient
        from test_client import start_server, stop_server
        old = DeferredClient.RETRY_S
        DeferredClient.RETRY_S = 0.05
        self.addCleanup(setattr, DeferredClient, "RETRY_S", old)
        sock = os.path.join(self.tmp, "late.sock")
        pool = fakes.FakeHostPool("layer_first", seed=3, pages=24, layers=4, heads=1, head_dim=64)
        cfg = fakes.storage_config(tp_rank=0, tp_size=2, extra={"socket": sock, "timeout": 5})
        b = fakes.create_backend(cfg, pool)
        self.addCleanup(b.close)
        keys = ["late-%d" % i for i in range(4)]
        self.assertEqual(b.batch_exists(keys), 0)
        self.assertEqual(b.batch_set_v1(keys, pool.host_indices(range(4))), [False] * 4)
        srv = start_server(sock, "--set", "block_tokens=4", model=None)
        self.addCleanup(stop_server, srv)
        time.sleep(0.1)
        ok = [False] * 4
        for _ in range(100):
            ok = b.batch_set_v1(keys, pool.host_indices(range(4)))
            if all(ok):
                break
            time.sleep(0.05)
        self.assertEqual(ok, [True] * 4)
        self.assertEqual(b.batch_exists(keys), 4)
        dst = list(range(10, 14))
        for p in dst:
            pool.set_page_bytes(p, 0x5A)
        self.assertEqual(b.batch_get_v1(keys, pool.host_indices(dst)), [True] * 4)
        for s_, d in zip(range(4), dst):
            a, c = pool.page_bytes(d), pool.page_bytes(s_)
            self.assertTrue(all(np.array_equal(a[k], c[k]) for k in a), "page %d" % d)

    def test_page_size_must_match_server_blocks(self):
        from test_client import start_server, stop_server
        sock = os.path.join(self.tmp, "b16.sock")
        srv = start_server(sock, model=None)  # block_tokens 16 (the default)
        try:
            pool = fakes.FakeHostPool("layer_first", layers=4, heads=1, head_dim=64)
            cfg = fakes.storage_config(tp_rank=0, tp_size=2, extra={"socket": sock})
            with self.assertRaisesRegex(ValueError, "blocks of 16 tokens but SGLang's page is "
                                        "4 tokens.*--set block_tokens=4"):
                fakes.create_backend(cfg, pool)
            # The same pool attaches to a server of 4-token blocks, zero copy.
            cfg = fakes.storage_config(tp_rank=0, tp_size=2, extra={"socket": self.sock})
            b = fakes.create_backend(cfg, pool)
            self.assertIsNone(b.staging)
            keys = ["k%d" % i for i in range(4)]
            self.assertEqual(b.batch_set_v1(keys, pool.host_indices(range(4))), [True] * 4)
            want = [pool.page_bytes(p) for p in range(4)]
            for p in range(10, 14):
                pool.set_page_bytes(p, 0)
            self.assertEqual(b.batch_get_v1(keys, pool.host_indices(range(10, 14))), [True] * 4)
            for i, p in enumerate(range(10, 14)):
                got = pool.page_bytes(p)
                for k in got:
                    np.testing.assert_array_equal(got[k], want[i][k])
            b.clear()  # drops this rank's namespace's pages from the server
            self.assertEqual(b.batch_exists(keys), 0)
            b.close()
        finally:
            stop_server(srv)


if __name__ == "__main__":
    unittest.main()
