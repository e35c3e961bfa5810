"""kvtier.vllm_connector: (a) conformance of every KVConnectorBase_V1 method
name and parameter list, recorded from vLLM's source; (b) the connector
driven the way vLLM drives it in one process (uniproc executor): the
scheduler role's calls, the metadata handed to the worker role, the
worker's forward-pass calls layer by layer, with every loaded block
byte-checked; load errors reported for recompute; refusals."""
import hashlib
import itertools
import inspect
import re
import time
import types
import unittest

import numpy as np

from _util import skip_if_unloadable


def setUpModule():
    skip_if_unloadable()
    global vc, kvtier, kv_cache_config
    import kvtier
    import kvtier.vllm_connector as vc
    from _vllm_fakes import kv_cache_config


# Recorded from vllm-project/vllm, commit 003df2961dd8830c317a61f9745ccd557da9fa06,
# vllm/distributed/kv_transfer/kv_connector/v1/base.py (class KVConnectorBase_V1):
# method -> parameters after self/cls, (name, default) with REQ for none; "**" marks **kwargs.
REQ = object()
METHODS = {
    "__init__": [("vllm_config", REQ), ("role", REQ), ("kv_cache_config", REQ)],
    "set_eagle_prefix_cache_hashing": [("enabled", REQ)],
    "bind_connector_metadata": [("connector_metadata", REQ)],
    "clear_connector_metadata": [],
    "has_connector_metadata": [],
    "register_kv_caches": [("kv_caches", REQ)],
    "register_cross_layers_kv_cache": [("kv_cache", REQ), ("attn_backend", REQ)],
    "set_host_xfer_buffer_ops": [("copy_operation", REQ)],
    "handle_preemptions": [("kv_connector_metadata", REQ)],
    "start_load_kv": [("forward_context", REQ), ("**kwargs", REQ)],
    "wait_for_layer_load": [("layer_name", REQ)],
    "save_kv_layer": [("layer_name", REQ), ("kv_layer", REQ), ("attn_metadata", REQ),
                      ("**kwargs", REQ)],
    "wait_for_save": [],
    "get_finished": [("finished_req_ids", REQ)],
    "get_block_ids_with_load_errors": [],
    "shutdown": [],
    "get_kv_connector_stats": [],
    "get_kv_connector_kv_cache_events": [],
    "get_handshake_metadata": [],
    "build_connector_worker_meta": [],
    "bind_gpu_block_pool": [("gpu_block_pool", REQ)],
    "get_num_new_matched_tokens": [("request", REQ), ("num_computed_tokens", REQ)],
    "update_state_after_alloc": [("request", REQ), ("blocks", REQ),
                                 ("num_external_tokens", REQ)],
    "build_connector_meta": [("scheduler_output", REQ)],
    "on_new_request": [("request", REQ)],
    "update_connector_output": [("connector_output", REQ)],
    "request_finished": [("request", REQ), ("block_ids", REQ)],
    "take_events": [],
    "has_pending_push_work": [],
    "get_required_kvcache_layout": [("vllm_config", REQ)],
    "requires_piecewise_for_cudagraph": [("extra_config", REQ)],
    "get_finished_count": [],
    "build_kv_connector_stats": [("data", None)],
    "set_xfer_handshake_metadata": [("metadata", REQ)],
    "set_xfer_handshake_metadata_pp_aware": [("metadata", REQ)],
    "build_prom_metrics": [("vllm_config", REQ), ("metric_types", REQ), ("labelnames", REQ),
                           ("per_engine_labelvalues", REQ)],
    "reset_cache": [],
}
CLASSMETHODS = {"get_required_kvcache_layout", "requires_piecewise_for_cudagraph",
                "build_kv_connector_stats", "build_prom_metrics"}
PROPERTIES = {"prefer_cross_layer_blocks", "supports_eagle_prefix_cache_hashing",
              "requires_kv_delivery", "role"}
ABSTRACT = {"start_load_kv", "wait_for_layer_load", "save_kv_layer", "wait_for_save",
            "get_num_new_matched_tokens", "update_state_after_alloc", "build_connector_meta"}


def params(fn):
    ps = list(inspect.signature(fn).parameters.values())
    if ps and ps[0].name in ("self", "cls"):
        ps = ps[1:]
    out = []
    for p in ps:
        if p.kind is inspect.Parameter.VAR_KEYWORD:
            out.append(("**" + p.name, REQ))
        else:
            out.append((p.name, REQ if p.default is inspect.Parameter.empty else p.default))
    return out


class Conformance(unittest.TestCase):
    def check(self, cls):
        for name, want in METHODS.items():
            fn = getattr(cls, name, None)
            self.assertTrue(callable(fn), "%s.%s missing" % (cls.__name__, name))
            self.assertEqual(params(fn), want, "%s.%s" % (cls.__name__, name))
            if name in CLASSMETHODS:
                self.assertIsInstance(inspect.getattr_static(cls, name), classmethod, name)
        for name in PROPERTIES:
            self.assertIsInstance(inspect.getattr_static(cls, name), property, name)

    def test_base_and_connector(self):
        self.check(vc.KVConnectorBase_V1)
        self.assertEqual(set(vc.KVConnectorBase_V1.__abstractmethods__), ABSTRACT)
        self.check(vc.KvtierConnector)
        self.assertTrue(issubclass(vc.KvtierConnector, vc.KVConnectorBase_V1))
        self.assertEqual(vc.KvtierConnector.__abstractmethods__, frozenset())
        self.assertEqual([r.name for r in vc.KVConnectorRole], ["SCHEDULER", "WORKER"])

    def test_real_vllm_when_importable(self):
        if not vc.VLLM_IMPORTED:
            self.skipTest("vllm is not importable here; the stand-in base was checked")
        from vllm.distributed.kv_transfer.kv_connector.v1.base import (
            KVConnectorBase_V1, KVConnectorMetadata)
        self.assertIs(vc.KVConnectorBase_V1, KVConnectorBase_V1)
        self.assertTrue(issubclass(vc.KvtierConnectorMetadata, KVConnectorMetadata))
        self.check(KVConnectorBase_V1)


BS, LAYERS, HEADS, DIM, BLOCKS = 4, 3, 2, 8, 64


def vllm_config(extra=None, engine="engine-0", device="cuda"):
    """device "cpu": vLLM's CPU platform, whose CPU_ATTN backend allocates
    head-major KV (the connector expects HND)."""
    ns = types.SimpleNamespace
    return ns(kv_transfer_config=ns(kv_connector_extra_config=dict(
        {"cpu_capacity": "8MiB", "kvtier_options": {"huge_pages": False}}, **(extra or {})),
        engine_id=engine, is_kv_producer=True),
        cache_config=ns(block_size=BS), model_config=ns(model="org/llama"),
        parallel_config=ns(tensor_parallel_size=1, pipeline_parallel_size=1),
        device_config=ns(device_type=device))


def kv_arrays(layout, layers=LAYERS, heads=HEADS, dim=DIM, seed=3):
    """Random KV per layer: NHD (FlashAttention) or HND (CPU_ATTN) shape."""
    rng = np.random.default_rng(seed)
    shape = ((2, BLOCKS, BS, heads, dim) if layout == "NHD"
             else (2, BLOCKS, heads, BS, dim))
    return {"model.layers.%d.self_attn.attn" % i: rng.integers(
        0, 256, 2 * BLOCKS * BS * heads * dim * 2, dtype=np.uint8).view(np.float16).reshape(
        shape) for i in range(layers)}


class Request:
    """The fields of vllm.v1.request.Request the connector reads."""

    def __init__(self, rid, tokens):
        self.request_id, self.num_tokens, self.num_computed_tokens = rid, len(tokens), 0
        self.block_hashes, prev = [], b""
        for i in range(len(tokens) // BS):
            prev = hashlib.sha256(prev + np.asarray(tokens[i * BS:(i + 1) * BS],
                                                    "<u4").tobytes()).digest()
            self.block_hashes.append(prev)


class Blocks:
    def __init__(self, ids):
        self.ids = list(ids)

    def get_block_ids(self):
        return (self.ids,)


class EngineBase(unittest.TestCase):
    LAYOUT = "NHD"

    def setUp(self):
        self.kv = kv_arrays(self.LAYOUT)
        cfg = vllm_config(device="cpu" if self.LAYOUT == "HND" else "cuda")
        self.worker = vc.KvtierConnector(cfg, vc.KVConnectorRole.WORKER, None)
        self.worker.register_kv_caches(self.kv)
        self.sched = vc.KvtierConnector(cfg, vc.KVConnectorRole.SCHEDULER, None)

    def tearDown(self):
        self.worker.shutdown()

    def step(self, finished=()):
        """One engine step: scheduler metadata -> worker forward pass."""
        meta = self.sched.build_connector_meta(None)
        w = self.worker
        w.bind_connector_metadata(meta)
        w.start_load_kv(None)
        for name, t in self.kv.items():
            w.wait_for_layer_load(name)
            w.save_kv_layer(name, t, None)
        w.wait_for_save()
        w.clear_connector_metadata()
        return w.get_finished(set(finished)), w.get_block_ids_with_load_errors()

    def step_until_sent(self, rid):
        """Steps until the worker reports rid's store ended (stores run
        behind the steps); returns the load errors seen meanwhile."""
        errors = set()
        for _ in range(2000):
            (sent, recv), e = self.step()
            errors |= e
            if sent:
                self.assertEqual(sent, {rid})
                return errors
            time.sleep(0.001)
        self.fail("the store of %s was never reported" % rid)

    def block(self, b):
        return [t[:, b].view(np.uint8).copy() for t in self.kv.values()]

    def assert_blocks_equal(self, dst, src):
        for d, s in zip(dst, src):
            for x, y in zip(self.block(d), self.block(s)):
                self.assertTrue(np.array_equal(x, y), "block %d != block %d" % (d, s))


class Engine(EngineBase):
    def test_save_then_load_a_shared_prefix(self):
        self.check_shared_prefix()
        self.assertIn("|layout=NHD|", self.worker.namespace)

    def check_shared_prefix(self):
        a_tokens = list(range(1000, 1041))  # 10 full blocks + 1 token
        a = Request("a", a_tokens)
        self.assertEqual(self.sched.get_num_new_matched_tokens(a, 0), (0, False))
        self.assertEqual(self.sched.request_finished(a, list(range(11))), (True, None))
        self.assertEqual(self.step_until_sent("a"), set())
        self.assertEqual(self.worker.cache.stats()["stored_blocks"], 10)
        # b shares a's first 8 blocks; 2 of them are computed on the GPU already
        b = Request("b", a_tokens[:32] + list(range(5000, 5018)))
        self.assertEqual(self.sched.get_num_new_matched_tokens(b, 8), (24, False))
        self.assertEqual(self.sched.get_num_new_matched_tokens(b, 8), (24, False))  # no side effects
        dst = list(range(30, 43))
        for t in self.kv.values():
            t[:, dst[2:8]] = 0
            # The computed prefix blocks: vLLM may share them with running
            # requests, so the load must leave them alone (a marker here).
            for blk in dst[:2]:
                t[:, blk].view(np.uint8)[...] = 0x5A
        self.sched.update_state_after_alloc(b, Blocks(dst), 24)
        _, errors = self.step()
        self.assertEqual(errors, set())
        self.assert_blocks_equal(dst[2:8], range(2, 8))
        for t in self.kv.values():
            self.assertTrue((t[:, dst[:2]].view(np.uint8) == 0x5A).all(),
                            "the load rewrote the computed prefix blocks")
        st = self.worker.cache.stats()
        self.assertEqual(st["loaded_blocks"], 8)

    def test_missing_blocks_are_load_errors(self):
        a = Request("a", list(range(33)))
        self.sched.request_finished(a, list(range(8)))
        self.step_until_sent("a")
        # the scheduler planned 8 blocks but only 6 are there now (evicted)
        meta = vc.KvtierConnectorMetadata(loads=[vc.LoadSpec(
            "b", [vc.block_key(h) for h in a.block_hashes[:6]] + [b"gone-1", b"gone-2"],
            list(range(40, 48)), 0)])
        self.worker.bind_connector_metadata(meta)
        self.worker.start_load_kv(None)
        for name in self.kv:
            self.worker.wait_for_layer_load(name)
        self.worker.wait_for_save()
        self.assertEqual(self.worker.get_block_ids_with_load_errors(), {46, 47})
        self.assertEqual(self.worker.get_block_ids_with_load_errors(), set())  # once
        self.assert_blocks_equal(range(40, 46), range(6))

    def test_refusals(self):
        with self.assertRaisesRegex(ValueError, "unknown kv_connector_extra_config key.s. "
                                    "cpu_capacty"):
            vc.KvtierConnector(vllm_config({"cpu_capacty": "1GiB"}),
                               vc.KVConnectorRole.WORKER, None)
        with self.assertRaisesRegex(ValueError, "cpu_capacity, kvtier_options configure the "
                                    "tiers, which the `kvtier serve` process owns"):
            vc.KvtierConnector(vllm_config({"socket": "/run/k.sock"}),
                               vc.KVConnectorRole.WORKER, None)
        workers = vllm_config()
        workers.kv_transfer_config.kv_connector_extra_config = {
            "socket": "/run/k.sock", "workers": 4}
        with self.assertRaisesRegex(ValueError, "workers configure the tiers.* `workers` .this "
                                    "process's own copy threads. comes from KVTIER_WORKERS"):
            vc.KvtierConnector(workers, vc.KVConnectorRole.WORKER, None)
        only_socket = vllm_config()
        only_socket.kv_transfer_config.kv_connector_extra_config = {
            "socket": "/nonexistent/k.sock", "timeout": 0.2}
        with self.assertRaisesRegex(ValueError, "needs the workers' KV geometry"):
            vc.KvtierConnector(only_socket, vc.KVConnectorRole.SCHEDULER, None)
        # A server that is not there is no refusal: the engine starts, with
        # 0 hits until it answers (ServerDownAtStart).
        down = vc.KvtierConnector(only_socket, vc.KVConnectorRole.SCHEDULER,
                                  kv_cache_config(LAYERS, BS, HEADS, DIM))
        self.assertEqual(down.get_num_new_matched_tokens(Request("x", list(range(9))), 0),
                         (0, False))
        down.shutdown()
        with self.assertRaisesRegex(ValueError, "load_async must be true or false .JSON., "
                                    "got 'false'"):
            vc.KvtierConnector(vllm_config({"load_async": "false"}),
                               vc.KVConnectorRole.WORKER, None)
        for bad in (0, 1025, "64", True):
            with self.assertRaisesRegex(ValueError, "lookup_batch must be an integer 1..1024 "
                                        ".requests per lookup round trip., got %s"
                                        % re.escape(repr(bad))):
                vc.KvtierConnector(vllm_config({"lookup_batch": bad}),
                                   vc.KVConnectorRole.WORKER, None)
        pp2 = vllm_config()
        pp2.kv_transfer_config.kv_connector_extra_config = {"socket": "/run/k.sock"}
        pp2.parallel_config.pipeline_parallel_size = 2
        with self.assertRaisesRegex(ValueError, "pipeline parallel size 2: the scheduler needs "
                                    "each stage's layer count"):
            vc.KvtierConnector(pp2, vc.KVConnectorRole.SCHEDULER,
                               kv_cache_config(LAYERS, BS, HEADS, DIM))
        pp2.kv_transfer_config.kv_connector_extra_config["pp_layers"] = [4]
        with self.assertRaisesRegex(ValueError, "pp_layers must list 2 positive layer counts"):
            vc.KvtierConnector(pp2, vc.KVConnectorRole.WORKER, None)
        pp2.kv_transfer_config.kv_connector_extra_config.update(pp_layers=[2, 3], pp_rank=2)
        with self.assertRaisesRegex(ValueError, "pp_rank 2 is outside pipeline_parallel_size 2"):
            vc.KvtierConnector(pp2, vc.KVConnectorRole.WORKER, None)
        with self.assertRaisesRegex(ValueError, "timeout must be > 0 seconds"):
            vc.KvtierConnector(vllm_config({"timeout": 0}), vc.KVConnectorRole.WORKER, None)
        with self.assertRaisesRegex(ValueError, "tp_rank 2 is outside tensor_parallel_size 1"):
            vc.KvtierConnector(vllm_config({"tp_rank": 2}), vc.KVConnectorRole.WORKER, None)
        w = vc.KvtierConnector(vllm_config(engine="other"), vc.KVConnectorRole.WORKER, None)
        with self.assertRaisesRegex(ValueError, r"has shape \(3, 4, 4, 2, 8\); kvtier knows "
                                    r"vLLM's \(2, num_blocks, block_size"):
            w.register_kv_caches({"l0": np.zeros((3, 4, BS, 2, 8), np.float16)})
        with self.assertRaisesRegex(ValueError, r"cache_config.block_size is 4\); a kernel "
                                    "block size other than"):
            w.register_kv_caches({"l0": np.zeros((2, 4, 8, 2, 8), np.float16)})

        class Xla:
            __module__ = "torch"
            device = types.SimpleNamespace(type="xla")
        with self.assertRaisesRegex(ValueError, "xla tensor; kvtier's connector moves host "
                                    r"\(CPU\) and CUDA tensors only"):
            w.register_kv_caches({"l0": Xla()})
        # without a worker in this process the scheduler answers 0
        s = vc.KvtierConnector(vllm_config(engine="nobody"), vc.KVConnectorRole.SCHEDULER, None)
        self.assertEqual(s.get_num_new_matched_tokens(Request("x", list(range(20))), 0),
                         (0, False))

    def test_torch_tensors_name_blocks_like_numpy(self):
        """A CPU torch tensor registers without a copy, and its blocks get
        the namespace a numpy array of the same dtype gets (the scheduler
        builds it from kv_cache_config, whatever the worker holds)."""
        class FakeTorch:
            __module__ = "torch"

            def __init__(self, a):
                self.a, self.shape = a, a.shape
                self.device = types.SimpleNamespace(type="cpu")
                self.dtype = "torch.float16"

            def is_contiguous(self):
                return self.a.flags.c_contiguous

            def element_size(self):
                return self.a.itemsize

            def numel(self):
                return self.a.size

            def data_ptr(self):
                return self.a.ctypes.data

        arrs = {n: t.copy() for n, t in self.kv.items()}
        w = vc.KvtierConnector(vllm_config(engine="torch"), vc.KVConnectorRole.WORKER, None)
        w.register_kv_caches({n: FakeTorch(a) for n, a in arrs.items()})
        try:
            self.assertEqual(w.namespace, self.worker.namespace)
            self.assertIn("|dtype=float16|", w.namespace)
            self.assertIn("|dim=%d|" % DIM, w.namespace)
            keys = [b"t%d" % i for i in range(2)]
            w.bind_connector_metadata(vc.KvtierConnectorMetadata(
                saves=[vc.SaveSpec("r", keys, [0, 1])]))
            w.start_load_kv(None)
            w.wait_for_save()
            for _ in range(2000):
                sent, _ = w.get_finished(set())
                if sent:
                    break
                time.sleep(0.001)
            w.bind_connector_metadata(vc.KvtierConnectorMetadata(
                loads=[vc.LoadSpec("r2", keys, [5, 6])]))
            w.start_load_kv(None)
            for n in arrs:
                w.wait_for_layer_load(n)
            w.wait_for_save()
            self.assertEqual(w.get_block_ids_with_load_errors(), set())
            for a in arrs.values():  # the load wrote the tensors' own memory
                self.assertTrue(np.array_equal(a[:, 5:7].view(np.uint8), a[:, 0:2].view(np.uint8)))
        finally:
            w.shutdown()

    def test_mla_layers(self):
        kv = {"l%d" % i: np.random.default_rng(i).integers(0, 256, (BLOCKS, BS, 576 * 2),
                                                           dtype=np.uint8).view(np.float16)
              for i in range(2)}
        w = vc.KvtierConnector(vllm_config(engine="mla"), vc.KVConnectorRole.WORKER, None)
        w.register_kv_caches(kv)
        try:
            self.assertIn("|mla|", w.namespace)
            keys = [b"k%d" % i for i in range(3)]
            w.bind_connector_metadata(vc.KvtierConnectorMetadata(
                saves=[vc.SaveSpec("r", keys, [0, 1, 2])]))
            w.start_load_kv(None)
            w.wait_for_save()
            for _ in range(2000):  # the store runs behind; get_finished reports it
                sent, _ = w.get_finished(set())
                if sent:
                    break
                time.sleep(0.001)
            self.assertEqual(sent, {"r"})
            w.bind_connector_metadata(vc.KvtierConnectorMetadata(
                loads=[vc.LoadSpec("r2", keys, [10, 11, 12])]))
            w.start_load_kv(None)
            for n in kv:
                w.wait_for_layer_load(n)
            w.wait_for_save()
            self.assertEqual(w.get_block_ids_with_load_errors(), set())
            for t in kv.values():
                self.assertTrue(np.array_equal(t[10:13].view(np.uint8), t[0:3].view(np.uint8)))
        finally:
            w.shutdown()


class HeadMajorEngine(Engine):
    """vLLM's CPU backend: (2, num_blocks, num_kv_heads, block_size,
    head_size) tensors, learned from the device by both roles."""
    LAYOUT = "HND"

    def test_save_then_load_a_shared_prefix(self):
        self.check_shared_prefix()
        self.assertIn("|layout=HND|", self.worker.namespace)

    # The other Engine tests build their own NHD workers.
    test_missing_blocks_are_load_errors = None
    test_refusals = None
    test_torch_tensors_name_blocks_like_numpy = None
    test_mla_layers = None


class Layouts(unittest.TestCase):
    """Which layout each role expects, and tensors that disagree refused."""

    def worker(self, cfg, kv):
        w = vc.KvtierConnector(cfg, vc.KVConnectorRole.WORKER, None)
        self.addCleanup(w.shutdown)
        w.register_kv_caches(kv)
        return w

    def test_expected_layout_from_vllm_config(self):
        ns = types.SimpleNamespace
        self.assertEqual(vc.kv_layout(vllm_config(), {}), ("NHD", "vLLM's default KV cache "
                                                           "layout"))
        self.assertEqual(vc.kv_layout(vllm_config(device="cpu"), {})[0], "HND")
        cfg = vllm_config()
        cfg.attention_config = ns(backend=ns(name="CPU_ATTN"))  # an AttentionBackendEnum
        self.assertEqual(vc.kv_layout(cfg, {}), ("HND", "attention backend CPU_ATTN"))
        cfg.attention_config = ns(backend=ns(name="FLASH_ATTN"))
        self.assertEqual(vc.kv_layout(cfg, {})[0], "NHD")
        self.assertEqual(vc.kv_layout(vllm_config(device="cpu"), {"kv_layout": "nhd"}),
                         ("NHD", "kv_connector_extra_config kv_layout"))
        with self.assertRaisesRegex(ValueError, 'kv_layout must be "NHD" or "HND", got '
                                    "'NDH'"):
            vc.KvtierConnector(vllm_config({"kv_layout": "NDH"}), vc.KVConnectorRole.WORKER,
                               None)

    def test_tensors_of_the_other_layout_refused(self):
        w = vc.KvtierConnector(vllm_config(engine="l1"), vc.KVConnectorRole.WORKER, None)
        self.addCleanup(w.shutdown)
        with self.assertRaisesRegex(ValueError, r"head-major \(2, num_blocks, num_kv_heads, "
                                    r"block_size, head_size\) blocks in memory, but the connector "
                                    r"expects token-major .* from vLLM's default KV cache "
                                    r'layout, as the scheduler does.*kv_layout to "HND"'):
            w.register_kv_caches(kv_arrays("HND"))
        c = vc.KvtierConnector(vllm_config(engine="l2", device="cpu"),
                               vc.KVConnectorRole.WORKER, None)
        self.addCleanup(c.shutdown)
        with self.assertRaisesRegex(ValueError, r"token-major .* but the connector expects "
                                    r"head-major .* from device cpu"):
            c.register_kv_caches(kv_arrays("NHD"))
        self.assertIsNone(c.cache)  # nothing registered, nothing attached

    def test_heads_from_kv_cache_config(self):
        """A worker handed kv_cache_config (recent vLLM) checks the head
        count too: as many heads as tokens per block reads either way."""
        cfg = vllm_config(engine="l5", device="cpu")
        w = vc.KvtierConnector(cfg, vc.KVConnectorRole.WORKER,
                               kv_cache_config(LAYERS, BS, BS, DIM))
        self.addCleanup(w.shutdown)
        w.register_kv_caches(kv_arrays("HND", heads=BS))
        self.assertIn("|heads=%d|dim=%d|layout=HND|" % (BS, DIM), w.namespace)
        c = vc.KvtierConnector(cfg, vc.KVConnectorRole.WORKER,
                               kv_cache_config(LAYERS, BS, 3, DIM))
        self.addCleanup(c.shutdown)
        with self.assertRaisesRegex(ValueError, r"not K/V blocks of 4 tokens and 3 heads in "
                                    r"either order \(cache_config.block_size is 4, kv_cache_spec."
                                    r"num_kv_heads 3\)$"):
            c.register_kv_caches(kv_arrays("HND"))

    def test_override_and_one_head(self):
        w = self.worker(vllm_config({"kv_layout": "NHD"}, engine="l3", device="cpu"),
                        kv_arrays("NHD"))
        self.assertIn("|layout=NHD|", w.namespace)
        # One KV head: both orders are the same bytes, one namespace.
        one = self.worker(vllm_config(engine="l4", device="cpu"), kv_arrays("HND", heads=1))
        self.assertIn("|layout=NHD|", one.namespace)


def roundtrip(test, w, phys, blocks_first=False, src=(0, 1), dst=(5, 6)):
    """Stores blocks src through worker w and loads them into blocks dst;
    asserts every layer's memory (phys: the arrays in memory order, K/V
    first, or blocks first) holds the same bytes there, and nothing else
    changed."""
    phys = [a.view(np.uint8) for a in phys]  # bytes: random float16 holds NaNs
    if blocks_first:  # the blocks' dim second, as for K/V first
        phys = [a.swapaxes(0, 1) for a in phys]
    before = [a.copy() for a in phys]
    keys = [b"rt%d" % i for i in range(len(src))]
    w.bind_connector_metadata(vc.KvtierConnectorMetadata(saves=[vc.SaveSpec("s", keys,
                                                                             list(src))]))
    w.start_load_kv(None)
    w.wait_for_save()
    for _ in range(2000):
        sent, _ = w.get_finished(set())
        if sent:
            break
        time.sleep(0.001)
    test.assertEqual(sent, {"s"})
    w.bind_connector_metadata(vc.KvtierConnectorMetadata(loads=[vc.LoadSpec("l", keys,
                                                                            list(dst))]))
    w.start_load_kv(None)
    for n in w._layers:
        w.wait_for_layer_load(n)
    w.wait_for_save()
    test.assertEqual(w.get_block_ids_with_load_errors(), set())
    for a, b in zip(phys, before):
        test.assertTrue(np.array_equal(a[:, list(dst)], b[:, list(src)]), "loaded blocks differ")
        b[:, list(dst)] = b[:, list(src)]
        test.assertTrue(np.array_equal(a, b), "a load wrote outside its blocks")


class StridedTorch:
    """A CPU torch tensor's surface as the connector reads it, over a numpy
    array that may be a permuted view: stride() in elements, data_ptr() the
    first element's address."""
    __module__ = "torch"

    def __init__(self, a):
        self.a, self.shape = a, a.shape
        self.device = types.SimpleNamespace(type="cpu")
        self.dtype = "torch.float16"

    def stride(self):
        return tuple(s // self.a.itemsize for s in self.a.strides)

    def is_contiguous(self):
        return self.a.flags.c_contiguous

    def element_size(self):
        return self.a.itemsize

    def data_ptr(self):
        return self.a.ctypes.data


class BackendShapes(unittest.TestCase):
    """Each backend's documented KV cache shape, as vLLM's model runner
    hands it over (the physical allocation permuted back to the logical
    shape), is read as what it is, or refused naming why."""

    def worker(self, extra=None, engine="shapes", kcc=None):
        w = vc.KvtierConnector(vllm_config(extra, engine=engine), vc.KVConnectorRole.WORKER, kcc)
        self.addCleanup(w.shutdown)
        return w

    def phys(self, shape, layers=2, seed=5):
        rng = np.random.default_rng(seed)
        return [rng.integers(0, 256, int(np.prod(shape)) * 2, dtype=np.uint8)
                .view(np.float16).reshape(shape) for _ in range(layers)]

    def test_flash_attention_hnd_stride_order(self):
        """VLLM_KV_CACHE_LAYOUT=HND: FlashAttention's logical (2, n, B, H, D)
        over head-major memory, stride order (0, 1, 3, 2, 4): numpy views
        and torch tensors (strides) alike move the right bytes."""
        for wrap in (lambda a: a, StridedTorch):
            phys = self.phys((2, BLOCKS, HEADS, BS, DIM))
            logical = {"l%d" % i: wrap(p.transpose(0, 1, 3, 2, 4)) for i, p in enumerate(phys)}
            self.assertEqual(logical["l0"].shape, (2, BLOCKS, BS, HEADS, DIM))
            w = self.worker({"kv_layout": "HND"}, engine="fa-hnd")
            w.register_kv_caches(logical)
            self.assertIn("|heads=%d|dim=%d|layout=HND|" % (HEADS, DIM), w.namespace)
            roundtrip(self, w, phys)
            w.shutdown()
        # The scheduler expects NHD (vLLM's default): refused, nothing attached.
        w = self.worker(engine="fa-hnd-2")
        with self.assertRaisesRegex(ValueError, r"memory order \(0, 1, 3, 2, 4\)\): head-major "
                                    r".* blocks in memory, but the connector expects "
                                    r"token-major"):
            w.register_kv_caches({"l0": self.phys((2, BLOCKS, HEADS, BS, DIM))[0]
                                  .transpose(0, 1, 3, 2, 4)})
        self.assertIsNone(w.cache)

    def test_heads_equal_block_size_follow_the_strides(self):
        """(2, n, B, B, D): a permuted tensor is FlashAttention's (tokens
        at logical dim 2); a contiguous one is read as the scheduler
        expects (CPU_ATTN's head-major on the CPU device)."""
        phys = self.phys((2, BLOCKS, BS, BS, DIM))
        w = self.worker({"kv_layout": "HND"}, engine="tie")
        w.register_kv_caches({"l%d" % i: p.transpose(0, 1, 3, 2, 4) for i, p in enumerate(phys)})
        self.assertIn("|heads=%d|dim=%d|layout=HND|" % (BS, DIM), w.namespace)
        roundtrip(self, w, phys)

    def test_flashinfer_blocks_first_zero_copy(self):
        """FlashInfer / Triton (num_blocks, 2, block_size, heads, head_size):
        K and V of a block side by side, so each component is a strided
        view; NHD and HND stride orders, numpy and torch-shaped tensors,
        every byte of the layer checked."""
        for (order, layout), wrap in itertools.product(
                (((0, 1, 2, 3, 4), "NHD"), ((0, 1, 3, 2, 4), "HND")), (lambda a: a, StridedTorch)):
            dims = (BLOCKS, 2, BS, HEADS, DIM) if layout == "NHD" else (BLOCKS, 2, HEADS, BS, DIM)
            phys = self.phys(dims)
            w = self.worker({"kv_layout": layout}, engine="fi-" + layout)
            w.register_kv_caches({"l%d" % i: wrap(p.transpose(order)) for i, p in enumerate(phys)})
            self.assertIn("|heads=%d|dim=%d|layout=%s|" % (HEADS, DIM, layout), w.namespace)
            roundtrip(self, w, phys, blocks_first=True)
            w.shutdown()
        # Two blocks and K/V: the backend's name says which dim is which.
        two = vllm_config(engine="fi2")
        two.attention_config = types.SimpleNamespace(backend=types.SimpleNamespace(
            name="FLASHINFER"))
        w2 = vc.KvtierConnector(two, vc.KVConnectorRole.WORKER, None)
        self.addCleanup(w2.shutdown)
        t = self.phys((2, 2, BS, HEADS, DIM), layers=1)[0]
        w2.register_kv_caches({"l0": t})
        roundtrip(self, w2, [t], blocks_first=True, src=[0], dst=[1])

    def test_mla_and_torch_sdpa_three_dims(self):
        w = self.worker(engine="sdpa")
        with self.assertRaisesRegex(ValueError, r"TORCH_SDPA's \(2, num_blocks, block_size \* "
                                    r"num_kv_heads \* head_size\)"):
            w.register_kv_caches({"l0": np.zeros((2, BLOCKS, BS * HEADS * DIM), np.float16)})
        # (2, B, x): MLA with 2 blocks, or SDPA with B blocks? Refused
        # without kv_cache_config; with it, read as its spec says.
        with self.assertRaisesRegex(ValueError, r"MLA's \(num_blocks, block_size, head_size\) "
                                    r"or TORCH_SDPA's"):
            w.register_kv_caches({"l0": np.zeros((2, BS, 8 * BS), np.float16)})
        kcc = kv_cache_config(2, BS, 1, 8 * BS, mla=True, num_blocks=2)
        m = self.worker(engine="mla2", kcc=kcc)
        m.register_kv_caches({"l%d" % i: np.zeros((2, BS, 8 * BS), np.float16)
                              for i in range(2)})
        self.assertIn("|mla|", m.namespace)
        # A spec that is not MLA: a 3-D tensor is refused, never read as MLA.
        s = self.worker(engine="notmla", kcc=kv_cache_config(2, BS, HEADS, DIM, num_blocks=BLOCKS))
        with self.assertRaisesRegex(ValueError, "kv_cache_config's spec is not MLA"):
            s.register_kv_caches({"l0": np.zeros((BLOCKS, BS, 576), np.float16)})

    def test_unknown_and_non_dense_refused(self):
        w = self.worker(engine="odd")
        with self.assertRaisesRegex(ValueError, r"has shape \(2, 64, 4, 16\); kvtier knows "
                                    r"vLLM's"):
            w.register_kv_caches({"l0": np.zeros((2, BLOCKS, BS, HEADS * DIM), np.float16)})
        padded = np.zeros((2, BLOCKS, BS, HEADS, DIM + 8), np.float16)[..., :DIM]
        with self.assertRaisesRegex(ValueError, "not a dense tensor in any dim order .padded "
                                    "blocks"):
            w.register_kv_caches({"l0": padded})
        self.assertIsNone(w.cache)


class RequiredLayout(unittest.TestCase):
    """get_required_kvcache_layout: vLLM's classmethod(vllm_config) -> str | None."""

    def test_layout_asked_of_vllm(self):
        K = vc.KvtierConnector
        self.assertIsNone(K.get_required_kvcache_layout(vllm_config()))
        self.assertIsNone(K.get_required_kvcache_layout(vllm_config(device="cpu")))
        self.assertEqual(K.get_required_kvcache_layout(vllm_config({"kv_layout": "hnd"})), "HND")
        self.assertEqual(K.get_required_kvcache_layout(vllm_config({"kv_layout": "NHD"})), "NHD")
        mla = vllm_config({"kv_layout": "HND"})
        mla.model_config.use_mla = True
        self.assertIsNone(K.get_required_kvcache_layout(mla))
        with self.assertRaisesRegex(ValueError, "kv_layout must be"):
            K.get_required_kvcache_layout(vllm_config({"kv_layout": "xyz"}))
        with self.assertRaises(TypeError):  # as vLLM's base: not on the abstract class
            vc.KVConnectorBase_V1.get_required_kvcache_layout(vllm_config())


class ServerCase(unittest.TestCase):
    """A `kvtier serve` of "tiny" (4 layers, 2 KV heads of 64, fp16) at
    tensor-parallel size TP, blocks of BS tokens, per test."""
    TP = 1

    def setUp(self):
        import os
        import tempfile
        from test_client import start_server
        self.tmp = tempfile.mkdtemp(prefix="kvtvs")
        self.sock = os.path.join(self.tmp, "node.sock")
        self.srv = start_server(self.sock, "--set", "block_tokens=%d" % BS, model=None)

    def tearDown(self):
        import shutil
        from test_client import stop_server
        stop_server(self.srv)
        shutil.rmtree(self.tmp, ignore_errors=True)


class HeadGroups(ServerCase):
    """GQA with TP > KV heads ("tiny": 2 KV heads at TP 4): ranks 0 and 1
    hold head 0, ranks 2 and 3 head 1. Each head group's first rank writes
    the one copy both ranks load, and the scheduler asks once per group."""
    TP = 4

    def config(self, rank):
        cfg = vllm_config(engine="gqa")
        cfg.parallel_config.tensor_parallel_size = 4
        cfg.model_config.get_total_num_kv_heads = lambda: 2
        cfg.kv_transfer_config.kv_connector_extra_config = {
            "socket": self.sock, "load_async": False, "timeout": 5, "tp_rank": rank}
        return cfg

    def test_one_copy_per_head_group(self):
        rng = np.random.default_rng(4)
        kvs, workers = [], []
        for rank in range(4):  # a group's ranks hold the same bytes
            if rank % 2 == 0:
                kv = {"l%d" % i: rng.integers(0, 256, (2, BLOCKS, BS, 1, 64 * 2), dtype=np.uint8)
                      .view(np.float16) for i in range(4)}
            else:
                kv = {n: t.copy() for n, t in kvs[-1].items()}
            w = vc.KvtierConnector(self.config(rank), vc.KVConnectorRole.WORKER, None)
            self.addCleanup(w.shutdown)
            w.register_kv_caches(kv)
            kvs.append(kv)
            workers.append(w)
        self.assertEqual([w.kv_replicas for w in workers], [2] * 4)
        ns = [w.namespace for w in workers]
        self.assertEqual((ns[0] == ns[1], ns[2] == ns[3], ns[0] == ns[2]), (True, True, False))
        self.assertIn("|tp=1/2|", ns[2])
        s = vc.KvtierConnector(self.config(0), vc.KVConnectorRole.SCHEDULER,
                               kv_cache_config(4, BS, 1, 64))
        self.addCleanup(s.shutdown)
        tokens = list(range(900, 925))  # 6 full blocks + 1 token
        self.assertEqual(s.request_finished(Request("a", tokens), list(range(7))), (True, None))
        meta = s.build_connector_meta(None)
        for w in workers:
            w.bind_connector_metadata(meta)
            w.start_load_kv(None)
            w.wait_for_save()
            w.clear_connector_metadata()
        for w in workers:  # every rank reports the save, writers once it ended
            for _ in range(2000):
                sent, _ = w.get_finished(set())
                if sent:
                    break
                time.sleep(0.001)
            self.assertEqual(sent, {"a"})
        st = s.client.stats()
        self.assertEqual((st["stores"], st["stored_blocks"]), (2, 12))  # one copy per group
        before, peeks, rts = st["lookups"], s.peeks_sent, s.lookup_round_trips
        b = Request("b", tokens)
        self.assertEqual(s.get_num_new_matched_tokens(b, 0), (24, False))
        self.assertEqual(s.peeks_sent - peeks, 2)  # one per head group
        self.assertEqual(s.lookup_round_trips - rts, 1)  # both in one PEEK_MANY
        # The batched answers equal the unbatched path's, peek by peek.
        keys = [vc.block_key(h) for h in b.block_hashes]
        targets = s._lookup_targets()
        reqs = [dict(keys=keys, ns=ns) for _, ns in targets]
        reqs.append(dict(keys=keys[:3], ns=targets[1][1]))
        reqs.append(dict(keys=[b"none-%d" % i for i in range(4)], ns=targets[0][1]))
        self.assertEqual(s.client.peek_many(reqs),
                         [s.client.peek(**r) for r in reqs])
        self.assertEqual(s.client.peek_many(reqs), [24, 24, 12, 0])
        self.assertEqual(s.client.stats()["lookups"] - before, 0)  # a peek plans nothing
        dst = list(range(30, 37))
        for kv in kvs:
            for t in kv.values():
                t[:, dst] = 0
        s.update_state_after_alloc(b, Blocks(dst), 24)
        meta = s.build_connector_meta(None)
        for w, kv in zip(workers, kvs):
            w.bind_connector_metadata(meta)
            w.start_load_kv(None)
            for name in kv:
                w.wait_for_layer_load(name)
            w.wait_for_save()
            w.clear_connector_metadata()
            self.assertEqual(w.get_block_ids_with_load_errors(), set())
            for t in kv.values():
                self.assertTrue(np.array_equal(t[:, dst[:6]].view(np.uint8),
                                               t[:, :6].view(np.uint8)))


class PipelineStages(unittest.TestCase):
    """PP stages' layer counts as vLLM splits them (get_pp_indices), and a
    worker whose layers are not its stage's refused."""

    def test_partition_as_vllm_splits(self):
        import os
        self.assertEqual(vc.pp_partition(20, 3), [7, 7, 6])   # remainder before the last
        self.assertEqual(vc.pp_partition(10, 4), [2, 3, 3, 2])  # the middle stages
        self.assertEqual(vc.pp_partition(61, 2), [31, 30])
        self.assertEqual(vc.pp_partition(32, 4), [8] * 4)
        old = os.environ.get("VLLM_PP_LAYER_PARTITION")
        try:
            os.environ["VLLM_PP_LAYER_PARTITION"] = "4,6,6,4"
            self.assertEqual(vc.pp_partition(20, 4), [4, 6, 6, 4])
            with self.assertRaisesRegex(ValueError, "3 stages of 16 layers in all, not 4 of "
                                        "20"):
                os.environ["VLLM_PP_LAYER_PARTITION"] = "4,6,6"
                vc.pp_partition(20, 4)
        finally:
            if old is None:
                del os.environ["VLLM_PP_LAYER_PARTITION"]
            else:
                os.environ["VLLM_PP_LAYER_PARTITION"] = old

    def test_stage_layers_from_config_and_worker_checked(self):
        cfg = vllm_config({"pp_rank": 1}, engine="pp")
        cfg.parallel_config.pipeline_parallel_size = 2
        cfg.model_config.get_total_num_hidden_layers = lambda: 5
        w = vc.KvtierConnector(cfg, vc.KVConnectorRole.WORKER, None)
        self.addCleanup(w.shutdown)
        self.assertEqual((w.stage_layers, w.pp_rank), ([3, 2], 1))
        with self.assertRaisesRegex(ValueError, "PP stage 1 registered 3 layers, but the "
                                    r"scheduler expects 2 \(pp_layers \[3, 2\]\)"):
            w.register_kv_caches(kv_arrays("NHD", layers=3))
        self.assertIsNone(w.cache)
        w.register_kv_caches(kv_arrays("NHD", layers=2))
        self.assertIn("|layers=2|", w.namespace)
        self.assertIn("|pp=1/2", w.namespace)
        cfg.kv_transfer_config.kv_connector_extra_config["pp_layers"] = [1, 4]
        self.assertEqual(vc.stage_layers(cfg, cfg.kv_transfer_config.kv_connector_extra_config,
                                         2), [1, 4])


class LayerSpy:
    """A worker's cache or client with its layer waits counted, and made to
    fail for one layer when asked."""

    def __init__(self, inner, fail_layer=None):
        self.inner, self.fail_layer, self.layers = inner, fail_layer, []

    def wait_layer(self, task, layer, timeout):
        self.layers.append(layer)
        if layer == self.fail_layer:
            raise kvtier.Timeout(kvtier.STATUS["ETIMEDOUT"], "layer %d (injected)" % layer)
        return self.inner.wait_layer(task, layer, timeout)

    def __getattr__(self, name):
        return getattr(self.inner, name)


class LoadModes(EngineBase):
    """Asynchronous loads in-process, and a layer wait that fails."""

    def save_a(self):
        tokens = list(range(2000, 2033))  # 8 full blocks + 1 token
        a = Request("a", tokens)
        self.sched.request_finished(a, list(range(9)))
        self.step_until_sent("a")
        return tokens

    def test_async_load_reported_received(self):
        tokens = self.save_a()
        self.sched.load_async = True
        b = Request("b", tokens)
        self.assertEqual(self.sched.get_num_new_matched_tokens(b, 0), (32, True))
        dst = list(range(20, 29))
        for t in self.kv.values():
            t[:, dst] = 0
        self.sched.update_state_after_alloc(b, Blocks(dst), 32)
        errors = set()
        for _ in range(2000):
            (sent, recv), e = self.step()
            errors |= e
            if recv:
                break
            time.sleep(0.001)
        self.assertEqual((recv, errors), ({"b"}, set()))
        self.assert_blocks_equal(dst[:8], range(8))

    def test_failed_layer_wait_reports_the_whole_load(self):
        tokens = self.save_a()
        spy = self.worker.cache = LayerSpy(self.worker.cache, fail_layer=1)
        b = Request("b", tokens)
        n, load_async = self.sched.get_num_new_matched_tokens(b, 4)
        self.assertEqual((n, load_async), (28, False))
        dst = list(range(20, 29))
        self.sched.update_state_after_alloc(b, Blocks(dst), n)
        _, errors = self.step()
        # layer 1 was not whole when the forward pass ran it: every block
        # past the computed one is recomputed (layer 2 waited no more)
        self.assertEqual(errors, set(dst[1:8]))
        self.assertEqual(spy.layers, [0, 1])
        self.worker.cache = spy.inner



def fake_cudart_path():
    """tests/fake_cudart.c built next to the library under test
    (build/tests/libfake_cudart.so), or KVTIER_FAKE_CUDART; None if absent."""
    import os
    from kvtier import _lib
    path = os.environ.get("KVTIER_FAKE_CUDART") or os.path.join(
        os.path.dirname(os.path.abspath(_lib.LIB_PATH)), "tests", "libfake_cudart.so")
    return path if os.path.exists(path) else None


class CudaKVFakeRuntime(unittest.TestCase):
    """CUDA KV tensors (torch's surface, duck-typed) driven as vLLM drives
    the connector, over the fake CUDA runtime: vllm_cuda_cases, run in a
    child process because the library loads its CUDA runtime once per
    process. In-process (the engine stream waits on each layer's event)
    for FlashAttention NHD and HND stride order, FlashInfer NHD and HND,
    MLA; through a `kvtier serve` (one engine stores from its CUDA KV,
    another loads into its CUDA KV and a host engine loads the same
    blocks); every loaded block byte-checked right after its layer's wait;
    host memory posing as CUDA refused by the library. batch and memcpy
    copy modes."""

    def run_cases(self, copy_mode):
        import os
        import subprocess
        import sys
        from kvtier import _lib
        fake = fake_cudart_path()
        if fake is None:
            self.skipTest("no fake CUDA runtime next to %s (build tests/fake_cudart.c, or set "
                          "KVTIER_FAKE_CUDART)" % _lib.LIB_PATH)
        env = dict(os.environ, KVTIER_CUDART=fake, KVTIER_TEST_FAKE_CUDA="1",
                   KVTIER_LIB=os.path.abspath(_lib.LIB_PATH), KVTIER_CUDA_COPY=copy_mode)
        here = os.path.dirname(os.path.abspath(__file__))
        r = subprocess.run([sys.executable, "-m", "unittest", "-v", "vllm_cuda_cases"],
                           cwd=here, env=env, capture_output=True, text=True, timeout=150)
        out = r.stdout + r.stderr
        self.assertEqual(r.returncode, 0, out)
        self.assertNotIn("skipped", out, out)  # every case ran
        self.assertRegex(out, r"Ran 9 tests")

    def test_batch_copies(self):
        self.run_cases("batch")

    def test_memcpy_copies(self):
        self.run_cases("memcpy")


class HostBackedCuda:
    """A CUDA tensor's surface over host memory (never registered: the
    connector refuses before registering)."""

    def __init__(self, a, index=0):
        self.a, self.shape, self.dtype = a, a.shape, a.dtype
        self.device = types.SimpleNamespace(type="cuda", index=index)

    def stride(self):
        return tuple(s // self.a.itemsize for s in self.a.strides)

    def element_size(self):
        return self.a.itemsize

    def data_ptr(self):
        return self.a.ctypes.data


class CudaGraphs(unittest.TestCase):
    def test_piecewise_when_loads_wait_per_layer(self):
        """A synchronous load is waited for layer by layer inside the
        forward pass: a full CUDA graph would skip those waits."""
        req = vc.KvtierConnector.requires_piecewise_for_cudagraph
        self.assertTrue(req({}))                                   # in-process: sync
        self.assertFalse(req({"socket": "/run/k.sock"}))           # socket: async
        self.assertTrue(req({"socket": "/run/k.sock", "load_async": False}))
        self.assertFalse(req({"load_async": True}))
        self.assertTrue(req(None))


class CudaRefusals(unittest.TestCase):
    """CUDA KV refused before anything is registered or attached, naming
    why: mixed host and device layers, two devices, layouts kvtier cannot
    move."""

    def worker(self, engine):
        w = vc.KvtierConnector(vllm_config(engine=engine), vc.KVConnectorRole.WORKER, None)
        self.addCleanup(w.shutdown)
        return w

    def test_mixed_devices(self):
        kv = kv_arrays("NHD")
        names = list(kv)
        w = self.worker("mixed")
        mixed = dict(kv, **{names[0]: HostBackedCuda(kv[names[0]])})
        with self.assertRaisesRegex(ValueError, r"kv_caches\['model.layers.0.self_attn.attn'\] "
                                    r"is on CUDA device 0 but kv_caches\['model.layers.1."
                                    r"self_attn.attn'\] is host memory; every layer must be "
                                    r"host memory or on one CUDA device"):
            w.register_kv_caches(mixed)
        self.assertIsNone(w.cache)
        two = {n: HostBackedCuda(a, index=i % 2) for i, (n, a) in enumerate(kv.items())}
        with self.assertRaisesRegex(ValueError, r"is on CUDA device 0 but kv_caches\['model."
                                    r"layers.1.self_attn.attn'\] is on CUDA device 1"):
            w.register_kv_caches(two)
        self.assertIsNone(w.cache)

    def test_unsupported_layouts(self):
        w = self.worker("cuda-shapes")
        sdpa = np.zeros((2, BLOCKS, BS * HEADS * DIM), np.float16)
        with self.assertRaisesRegex(ValueError, r"TORCH_SDPA's \(2, num_blocks, block_size"):
            w.register_kv_caches({"l0": HostBackedCuda(sdpa)})
        padded = np.zeros((2, BLOCKS, BS, HEADS, DIM + 8), np.float16)[..., :DIM]
        with self.assertRaisesRegex(ValueError, r"not a dense tensor in any dim order"):
            w.register_kv_caches({"l0": HostBackedCuda(padded)})
        with self.assertRaisesRegex(ValueError, r"has shape \(3, 4, 4, 2, 8\); kvtier knows"):
            w.register_kv_caches({"l0": HostBackedCuda(np.zeros((3, 4, BS, 2, 8), np.float16))})
        noindex = HostBackedCuda(kv_arrays("NHD", layers=1)["model.layers.0.self_attn.attn"])
        noindex.device.index = None
        with self.assertRaisesRegex(ValueError, "a CUDA tensor whose device has no index"):
            w.register_kv_caches({"l0": noindex})
        self.assertIsNone(w.cache)


class ServerDownAtStart(unittest.TestCase):
    """vLLM starts before its node server (or the server is restarting):
    the worker registers its KV and the scheduler answers 0 hits, with a
    logged warning and no exception; once the server answers both attach
    on their own and a saved prefix is found and loaded byte for byte."""

    def test_attach_when_the_server_comes(self):
        import os
        import tempfile
        from test_client import start_server, stop_server
        tmp = tempfile.mkdtemp(prefix="kvtvd")
        sock = os.path.join(tmp, "node.sock")
        from kvtier.client import DeferredClient
        old_retry = DeferredClient.RETRY_S
        DeferredClient.RETRY_S = 0.05
        self.addCleanup(setattr, DeferredClient, "RETRY_S", old_retry)
        cfg = vllm_config(engine="late")
        cfg.kv_transfer_config.kv_connector_extra_config = {
            "socket": sock, "load_async": False, "timeout": 5}
        kv = kv_arrays("NHD", layers=4, heads=2, dim=64, seed=11)
        with self.assertLogs("kvtier.vllm_connector", "WARNING") as logs:
            w = vc.KvtierConnector(cfg, vc.KVConnectorRole.WORKER, None)
            w.register_kv_caches(kv)
            s = vc.KvtierConnector(cfg, vc.KVConnectorRole.SCHEDULER,
                                   kv_cache_config(4, BS, 2, 64))
        self.addCleanup(w.shutdown)
        self.addCleanup(s.shutdown)
        self.assertIn("is not answering", "\n".join(logs.output))
        tokens = list(range(500, 525))  # 6 full blocks + 1 token
        self.assertEqual(s.get_num_new_matched_tokens(Request("x", tokens), 0), (0, False))
        srv = start_server(sock, "--set", "block_tokens=%d" % BS, model=None)
        self.addCleanup(stop_server, srv)
        time.sleep(0.1)  # past the retry interval
        a = Request("a", tokens)
        for _ in range(100):  # the save goes out once the worker attached
            self.assertEqual(s.request_finished(a, list(range(7))), (True, None))
            w.bind_connector_metadata(s.build_connector_meta(None))
            w.start_load_kv(None)
            w.wait_for_save()
            w.clear_connector_metadata()
            sent = None
            for _ in range(2000):
                sent, _ = w.get_finished(set())
                if sent:
                    break
                time.sleep(0.001)
            if w.cache._cl is not None and w.cache.stats()["stores"]:
                break
            time.sleep(0.05)
        b = Request("b", tokens)
        got = (0, False)
        for _ in range(100):
            got = s.get_num_new_matched_tokens(b, 0)
            if got[0]:
                break
            time.sleep(0.05)
        self.assertEqual(got, (24, False))
        dst = list(range(30, 37))
        for t in kv.values():
            t[:, dst] = 0
        s.update_state_after_alloc(b, Blocks(dst), 24)
        w.bind_connector_metadata(s.build_connector_meta(None))
        w.start_load_kv(None)
        for name in kv:
            w.wait_for_layer_load(name)
        w.wait_for_save()
        w.clear_connector_metadata()
        self.assertEqual(w.get_block_ids_with_load_errors(), set())
        for t in kv.values():
            self.assertTrue(np.array_equal(t[:, dst[:6]].view(np.uint8),
                                           t[:, :6].view(np.uint8)))

    def test_a_refused_attach_is_not_an_exception(self):
        """A server that answers and refuses this engine (here: one declared
        for another model, KVT_EGEOMETRY) must not kill vLLM either: both
        roles start, the refusal is logged at error level naming the field,
        and every lookup is a miss."""
        import os
        import tempfile
        from test_client import start_server, stop_server
        tmp = tempfile.mkdtemp(prefix="kvtvr")
        sock = os.path.join(tmp, "node.sock")
        srv = start_server(sock, model="tiny")
        self.addCleanup(stop_server, srv)
        cfg = vllm_config(engine="refused")
        cfg.kv_transfer_config.kv_connector_extra_config = {
            "socket": sock, "load_async": False, "timeout": 5}
        kv = kv_arrays("NHD", layers=3, heads=2, dim=64, seed=12)
        with self.assertLogs("kvtier.vllm_connector", "ERROR") as logs:
            w = vc.KvtierConnector(cfg, vc.KVConnectorRole.WORKER, None)
            w.register_kv_caches(kv)
            s = vc.KvtierConnector(cfg, vc.KVConnectorRole.SCHEDULER,
                                   kv_cache_config(3, BS, 2, 64))
        self.addCleanup(w.shutdown)
        self.addCleanup(s.shutdown)
        text = "\n".join(logs.output)
        self.assertIn("refused this engine's attach", text)
        self.assertIn("geometry differs", text)
        tokens = list(range(700, 725))
        self.assertEqual(s.get_num_new_matched_tokens(Request("r", tokens), 0), (0, False))

class SocketModeOneProcess(ServerCase):
    """Socket mode with both roles in this process: synchronous loads
    through the server are waited for layer by layer."""

    def test_sync_layerwise_load_through_the_server(self):
        cfg = vllm_config(engine="sock")
        cfg.kv_transfer_config.kv_connector_extra_config = {
            "socket": self.sock, "load_async": False, "timeout": 5}
        rng = np.random.default_rng(9)
        kv = {"l%d" % i: rng.integers(0, 256, (2, BLOCKS, BS, 2, 64 * 2), dtype=np.uint8)
              .view(np.float16) for i in range(4)}
        w = vc.KvtierConnector(cfg, vc.KVConnectorRole.WORKER, None)
        w.register_kv_caches(kv)
        s = vc.KvtierConnector(cfg, vc.KVConnectorRole.SCHEDULER,
                               kv_cache_config(4, BS, 2, 64))
        try:
            tokens = list(range(300, 325))  # 6 full blocks + 1 token
            a = Request("a", tokens)
            self.assertEqual(s.request_finished(a, list(range(7))), (True, None))
            w.bind_connector_metadata(s.build_connector_meta(None))
            # The worker plans its saves visible=True (KVT_REQ_VISIBLE_AT_END):
            # the task ends only once the server checked its blocks, so the
            # scheduler's lookup right after finds them, with no publishing
            # call after (one round trip fewer per save).
            published, real_stats = [], w.cache.stats
            w.cache.stats = lambda: published.append(len(w._saves)) or real_stats()
            planned, real_prepare = [], w.cache.prepare_store
            w.cache.prepare_store = lambda **kw: planned.append(kw.get("visible")) or \
                real_prepare(**kw)
            w.start_load_kv(None)
            w.wait_for_save()
            w.clear_connector_metadata()
            for _ in range(2000):
                sent, _ = w.get_finished(set())
                if sent:
                    break
                time.sleep(0.001)
            self.assertEqual(sent, {"a"})
            self.assertEqual(planned, [True])
            self.assertEqual(published, [])  # no publishing call
            del w.cache.stats
            del w.cache.prepare_store
            b = Request("b", tokens)
            self.assertEqual(s.get_num_new_matched_tokens(b, 0), (24, False))
            dst = list(range(30, 37))
            for t in kv.values():
                t[:, dst] = 0
            s.update_state_after_alloc(b, Blocks(dst), 24)
            spy = w.cache = LayerSpy(w.cache)
            w.bind_connector_metadata(s.build_connector_meta(None))
            w.start_load_kv(None)
            for name in kv:
                w.wait_for_layer_load(name)
            w.wait_for_save()
            w.clear_connector_metadata()
            self.assertEqual(spy.layers, [0, 1, 2, 3])
            self.assertEqual(w.get_block_ids_with_load_errors(), set())
            self.assertEqual(w.get_finished(set()), (None, None))  # sync: not reported
            for t in kv.values():
                self.assertTrue(np.array_equal(t[:, dst[:6]].view(np.uint8),
                                               t[:, :6].view(np.uint8)))
            w.cache = spy.inner
        finally:
            w.shutdown()
            s.shutdown()

    def engine(self, name, layout, seed):
        """A worker and a scheduler of one engine in socket mode, its KV in
        `layout` (HND: the CPU device), the server's geometry."""
        cfg = vllm_config(engine=name, device="cpu" if layout == "HND" else "cuda")
        cfg.kv_transfer_config.kv_connector_extra_config = {
            "socket": self.sock, "load_async": False, "timeout": 5}
        kv = kv_arrays(layout, layers=4, heads=2, dim=64, seed=seed)
        w = vc.KvtierConnector(cfg, vc.KVConnectorRole.WORKER, None)
        self.addCleanup(w.shutdown)
        w.register_kv_caches(kv)
        s = vc.KvtierConnector(cfg, vc.KVConnectorRole.SCHEDULER, kv_cache_config(4, BS, 2, 64))
        self.addCleanup(s.shutdown)
        self.assertEqual(s._namespace(s.shape, 0, 0), w.namespace)
        return w, s, kv

    def run_step(self, w, s):
        w.bind_connector_metadata(s.build_connector_meta(None))
        w.start_load_kv(None)
        for name in w._layers:
            w.wait_for_layer_load(name)
        w.wait_for_save()
        w.clear_connector_metadata()
        for _ in range(2000):
            sent, _ = w.get_finished(set())
            if sent or not w._saves:
                return
            time.sleep(0.001)

    def save(self, w, s, rid, tokens):
        r = Request(rid, tokens)
        self.assertEqual(s.request_finished(r, list(range(len(tokens) // BS))), (True, None))
        self.run_step(w, s)
        return r

    def test_layouts_never_mix(self):
        """A head-major engine (vLLM's CPU backend) and a token-major one on
        one server: each loads its own blocks byte for byte; blocks the
        other stored are a miss (never bytes of the other layout)."""
        wa, sa, kva = self.engine("nhd-engine", "NHD", 1)
        wb, sb, kvb = self.engine("hnd-engine", "HND", 2)
        self.assertIn("|layout=NHD|", wa.namespace)
        self.assertIn("|layout=HND|", wb.namespace)
        tokens = list(range(700, 725))  # 6 full blocks + 1 token
        a = self.save(wa, sa, "a", tokens)
        # B's scheduler sees nothing of A's blocks ...
        self.assertEqual(sb.get_num_new_matched_tokens(Request("b", tokens), 0), (0, False))
        # ... and B's worker, told to load them anyway, writes nothing.
        dst = list(range(30, 36))
        for t in kvb.values():
            for blk in dst:
                t[:, blk].view(np.uint8)[...] = 0xEE
        wb.bind_connector_metadata(vc.KvtierConnectorMetadata(loads=[vc.LoadSpec(
            "b", [vc.block_key(h) for h in a.block_hashes], dst)]))
        wb.start_load_kv(None)
        wb.wait_for_save()
        self.assertEqual(wb.get_block_ids_with_load_errors(), set(dst))
        for t in kvb.values():
            self.assertTrue((t[:, dst].view(np.uint8) == 0xEE).all())
        # Each engine stores and loads its own layout through the server.
        self.save(wb, sb, "b2", tokens)
        for w, s, kv in ((wa, sa, kva), (wb, sb, kvb)):
            r = Request("load", tokens)
            self.assertEqual(s.get_num_new_matched_tokens(r, 4), (20, False))
            s.update_state_after_alloc(r, Blocks(list(range(40, 47))), 20)
            for t in kv.values():
                t[:, 40].view(np.uint8)[...] = 0x5A  # computed already: kept
            self.run_step(w, s)
            self.assertEqual(w.get_block_ids_with_load_errors(), set())
            for t in kv.values():
                self.assertTrue(np.array_equal(t[:, 41:46].view(np.uint8),
                                               t[:, 1:6].view(np.uint8)))
                self.assertTrue((t[:, 40].view(np.uint8) == 0x5A).all())


if __name__ == "__main__":
    unittest.main()
