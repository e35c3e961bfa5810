"""CUDA KV tensors through kvtier.vllm_connector, driven as vLLM drives it,
over the fake CUDA runtime (tests/fake_cudart.c: "device" memory is host
memory its cudaMalloc handed out; every copy is queued on a stream and
done only when that stream is synchronized or an event on it is waited
for). Run by test_vllm_connector.CudaKVFakeRuntime in a child process
whose KVTIER_CUDART names the fake: the library loads its CUDA runtime
once per process, so these cases cannot share a process with tests that
load none. Not a GPU test: it checks kvtier's plumbing (registration as
KVT_MEMORY_CUDA, the copy backend, layer waits, the server client's CUDA
copies and checksums), byte for byte."""
import ctypes
import os
import shutil
import tempfile
import time
import types
import unittest

import numpy as np

from _util import skip_if_unloadable

BS, BLOCKS, LAYERS, HEADS, DIM = 4, 32, 3, 2, 8
TOKENS = list(range(7000, 7033))  # 8 full blocks + 1 token
SRC = list(range(0, 8))
DST = list(range(16, 24))


def imports():
    """The modules the engines use (also for test_vllm_cuda_torch)."""
    skip_if_unloadable()
    global kvtier, vc, fakes
    import kvtier
    import kvtier.vllm_connector as vc
    import _vllm_fakes as fakes


def setUpModule():
    imports()
    global RT
    path = os.environ.get("KVTIER_CUDART")
    if not path or not os.environ.get("KVTIER_TEST_FAKE_CUDA"):
        raise RuntimeError("vllm_cuda_cases runs under the fake CUDA runtime only "
                           "(KVTIER_CUDART=.../libfake_cudart.so KVTIER_TEST_FAKE_CUDA=1)")
    RT = ctypes.CDLL(path)  # the same handle the library dlopens
    RT.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]


def device_alloc(nbytes):
    p = ctypes.c_void_p()
    rc = RT.cudaMalloc(ctypes.byref(p), nbytes)
    if rc != 0:
        raise RuntimeError("fake cudaMalloc(%d) failed: %d" % (nbytes, rc))
    return p.value


class CudaKV:
    """A torch CUDA tensor's surface as kvtier reads it (data_ptr(),
    device, shape, stride(), dtype, element_size()), over memory of the
    fake runtime's cudaMalloc (memory "device"); "posing": over plain host
    memory, still claiming to be a CUDA tensor; "host": the engine gets
    the numpy view (logical), a host tensor.
    phys: the allocation in memory order, which the test reads and writes
    (as a GPU test would through copies); the tensor is phys permuted by
    perm. Not a torch module: the connector must not import torch for it."""

    def __init__(self, phys_shape, perm=None, seed=0, memory="device", index=0,
                 dtype=np.float16):
        self.dtype, self.memory = np.dtype(dtype), memory
        n = int(np.prod(phys_shape)) * self.dtype.itemsize
        if memory == "device":
            raw = np.ctypeslib.as_array((ctypes.c_uint8 * n).from_address(device_alloc(n)))
        else:
            raw = np.zeros(n, np.uint8)
        raw[:] = np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)
        self._raw = raw
        self.phys = raw.view(self.dtype).reshape(phys_shape)
        self.logical = self.phys.transpose(perm) if perm else self.phys
        self.shape = self.logical.shape
        self.device = types.SimpleNamespace(type="cuda", index=index)

    def data_ptr(self):
        return self._raw.ctypes.data

    def stride(self):
        return tuple(s // self.dtype.itemsize for s in self.logical.strides)

    def element_size(self):
        return self.dtype.itemsize

    def numel(self):
        return self.logical.size

    def is_contiguous(self):
        return bool(self.logical.flags.c_contiguous)

    def tensor(self):
        """What the engine hands register_kv_caches."""
        return self.logical if self.memory == "host" else self


# name -> (physical shape, permutation to the logical one, kv_layout, K/V dim first)
LAYOUTS = {
    "flash_attn_nhd": ((2, BLOCKS, BS, HEADS, DIM), None, "NHD", True),
    "flash_attn_hnd": ((2, BLOCKS, HEADS, BS, DIM), (0, 1, 3, 2, 4), "HND", True),
    "flashinfer_nhd": ((BLOCKS, 2, BS, HEADS, DIM), None, "NHD", False),
    "flashinfer_hnd": ((BLOCKS, 2, HEADS, BS, DIM), (0, 1, 3, 2, 4), "HND", False),
    "mla": ((BLOCKS, BS, 72), None, "NHD", False),
}


def make_kv(layout, seed, memory="device"):
    shape, perm, _, _ = LAYOUTS[layout]
    return {"model.layers.%d.self_attn.attn" % i: CudaKV(shape, perm, seed * 10 + i, memory)
            for i in range(LAYERS)}


def _bytes(t):
    """The layer's allocation as uint8 in memory order (numpy, or a torch
    CUDA tensor for test_vllm_cuda_torch)."""
    if isinstance(t.phys, np.ndarray):
        return t.phys.view(np.uint8)
    import torch
    return t.phys.view(torch.uint8)


def _host(x):
    return x.copy() if isinstance(x, np.ndarray) else x.cpu().numpy()


def block(t, layout, b):
    """Block b's bytes of one layer (all of K and V), on the host."""
    u8 = _bytes(t)
    return _host(u8[:, b] if LAYOUTS[layout][3] else u8[b])


def fill_blocks(t, layout, blocks, value):
    u8 = _bytes(t)
    for b in blocks:
        if LAYOUTS[layout][3]:
            u8[:, b] = value
        else:
            u8[b] = value


def whole(t):
    return _host(_bytes(t))


class Spy:
    """The worker's cache or client with its layer waits recorded."""

    def __init__(self, inner):
        self.inner, self.calls = inner, []

    def wait_layer(self, task, layer, timeout):
        self.calls.append(("wait_layer", layer))
        return self.inner.wait_layer(task, layer, timeout)

    def stream_wait_layer(self, task, layer, stream, timeout):
        self.calls.append(("stream_wait_layer", layer))
        return self.inner.stream_wait_layer(task, layer, stream, timeout)

    def __getattr__(self, name):
        return getattr(self.inner, name)


class Engine:
    """One vLLM engine: its scheduler and worker connectors, KV tensors."""

    def __init__(self, test, engine, layout, kv, socket=None):
        extra = {"timeout": 10}
        if LAYOUTS[layout][2] == "HND":
            extra["kv_layout"] = "HND"
        if socket:
            extra.update(socket=socket, load_async=False)
        else:
            extra.update(cpu_capacity="4MiB", kvtier_options={"huge_pages": False})
        cfg = fakes.vllm_config(extra, engine=engine, block_size=BS)
        mla = layout == "mla"
        kcc = fakes.kv_cache_config(LAYERS, BS, 1 if mla else HEADS, 72 if mla else DIM,
                                    mla=mla, num_blocks=BLOCKS)
        self.test, self.layout, self.kv = test, layout, kv
        self.worker = vc.KvtierConnector(cfg, vc.KVConnectorRole.WORKER, kcc)
        test.addCleanup(self.worker.shutdown)
        self.worker.register_kv_caches({n: t.tensor() for n, t in kv.items()})
        self.sched = vc.KvtierConnector(cfg, vc.KVConnectorRole.SCHEDULER, kcc)
        test.addCleanup(self.sched.shutdown)

    def step(self, check_layer=None):
        """One step as vLLM's model runner makes it; check_layer(i) runs
        right after wait_for_layer_load of layer i (before the forward
        pass would read it)."""
        w = self.worker
        w.bind_connector_metadata(self.sched.build_connector_meta(None))
        w.start_load_kv(None)
        for i, (name, t) in enumerate(self.kv.items()):
            w.wait_for_layer_load(name)
            if check_layer:
                check_layer(i)
            w.save_kv_layer(name, t, None)
        w.wait_for_save()
        w.clear_connector_metadata()
        return w.get_finished(set()), w.get_block_ids_with_load_errors()

    def store(self, rid):
        a = fakes.Request(rid, TOKENS, BS)
        self.test.assertEqual(self.sched.request_finished(a, SRC + [8]), (True, None))
        for _ in range(2000):
            (sent, _), errors = self.step()
            self.test.assertEqual(errors, set())
            if sent:
                self.test.assertEqual(sent, {rid})
                return
            time.sleep(0.001)
        self.test.fail("the store of %s was never reported" % rid)

    def load(self, rid, expect):
        """Loads TOKENS' blocks into DST, layer by layer, checking each
        layer's loaded blocks right after its wait against expect[layer][i]
        (the bytes of block SRC[i] where they were stored), and that
        nothing outside DST changed."""
        for t in self.kv.values():  # the destination holds other bytes first
            fill_blocks(t, self.layout, DST, 0xA5)
        before = [whole(t) for t in self.kv.values()]
        b = fakes.Request(rid, TOKENS, BS)
        self.test.assertEqual(self.sched.get_num_new_matched_tokens(b, 0), (32, False))
        self.sched.update_state_after_alloc(b, fakes.Blocks(DST + [30]), 32)
        spy = self.worker.cache = Spy(self.worker.cache)
        ts = list(self.kv.values())
        checked = []

        def check(i):
            for j, d in enumerate(DST):
                got = block(ts[i], self.layout, d)
                self.test.assertTrue(np.array_equal(got, expect[i][j]),
                                     "layer %d, block %d (from block %d): not the stored bytes "
                                     "right after wait_for_layer_load" % (i, d, SRC[j]))
            checked.append(i)
        _, errors = self.step(check)
        self.worker.cache = spy.inner
        self.test.assertEqual(errors, set())
        self.test.assertEqual(checked, list(range(LAYERS)))
        for i, t in enumerate(ts):  # nothing else written
            now, was = whole(t), before[i]
            for j, d in enumerate(DST):
                if LAYOUTS[self.layout][3]:
                    was[:, d] = expect[i][j]
                else:
                    was[d] = expect[i][j]
            self.test.assertTrue(np.array_equal(now, was), "layer %d: a load wrote outside "
                                 "its blocks" % i)
        return spy.calls

    def snapshot(self):
        return [[block(t, self.layout, s) for s in SRC] for t in self.kv.values()]


class InProcess(unittest.TestCase):
    """One engine, its own kvtier cache: store blocks SRC, load them into
    DST with the engine's stream waiting on each layer's event."""

    def check(self, layout):
        e = Engine(self, "cuda-" + layout, layout, make_kv(layout, 1))
        self.assertEqual(e.worker.cache.stats()["stored_blocks"], 0)
        expect = e.snapshot()
        e.store("a")
        self.assertEqual(e.worker.cache.stats()["stored_blocks"], 8)
        calls = e.load("b", expect)
        self.assertEqual(calls, [("stream_wait_layer", i) for i in range(LAYERS)])
        self.assertEqual(e.worker.cache.stats()["loaded_blocks"], 8)

    def test_flash_attn_nhd(self):
        self.check("flash_attn_nhd")

    def test_flash_attn_hnd_stride_order(self):
        self.check("flash_attn_hnd")

    def test_flashinfer_nhd(self):
        self.check("flashinfer_nhd")

    def test_flashinfer_hnd(self):
        self.check("flashinfer_hnd")

    def test_mla(self):
        self.check("mla")

    def test_host_memory_posing_as_cuda_refused(self):
        """A 'CUDA tensor' over memory the runtime did not allocate: the
        library's check (cudaPointerGetAttributes) refuses it, naming it."""
        cfg = fakes.vllm_config({"cpu_capacity": "4MiB", "kvtier_options": {
            "huge_pages": False}}, engine="posing", block_size=BS)
        w = vc.KvtierConnector(cfg, vc.KVConnectorRole.WORKER, None)
        self.addCleanup(w.shutdown)
        with self.assertRaisesRegex(kvtier.InvalidArgument, r"layer_bases\[0\] .* is "
                                    "unregistered host memory, not CUDA device memory"):
            w.register_kv_caches({n: t.tensor() for n, t in
                                  make_kv("flash_attn_nhd", 2, "posing").items()})
        self.assertIsNone(w.cache)


class ThroughServer(unittest.TestCase):
    """Two engines on one `kvtier serve`: one stores from its CUDA KV, the
    other loads into its own CUDA KV (layer waits through the client), and
    a host engine loads the same blocks (so the server holds the right
    bytes, checksums included, not just bytes both CUDA sides agree on)."""

    def setUp(self):
        from test_client import start_server, stop_server
        self.tmp = tempfile.mkdtemp(prefix="kvtcu")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.sock = os.path.join(self.tmp, "node.sock")
        srv = start_server(self.sock, "--set", "block_tokens=%d" % BS, model=None)
        self.addCleanup(stop_server, srv)

    def check(self, layout):
        a = Engine(self, "a-" + layout, layout, make_kv(layout, 3), self.sock)
        expect = a.snapshot()
        a.store("a")
        b = Engine(self, "b-" + layout, layout, make_kv(layout, 4), self.sock)
        self.assertEqual(b.load("b", expect), [("wait_layer", i) for i in range(LAYERS)])
        host = Engine(self, "h-" + layout, layout, make_kv(layout, 5, "host"), self.sock)
        self.assertIsNone(host.worker.device)
        self.assertEqual(b.worker.device, 0)
        host.load("c", expect)

    def test_flash_attn_nhd(self):
        self.check("flash_attn_nhd")

    def test_flashinfer_hnd(self):
        self.check("flashinfer_hnd")

    def test_host_memory_posing_as_cuda_refused(self):
        cfg = fakes.vllm_config({"socket": self.sock, "timeout": 10}, engine="posing-srv",
                                block_size=BS)
        w = vc.KvtierConnector(cfg, vc.KVConnectorRole.WORKER, None)
        self.addCleanup(w.shutdown)
        with self.assertRaisesRegex(kvtier.InvalidArgument, r"kvt_client_register_memory: "
                                    r"layer_bases\[0\] .* not CUDA device memory"):
            w.register_kv_caches({n: t.tensor() for n, t in
                                  make_kv("flash_attn_nhd", 2, "posing").items()})
        self.assertIsNone(w.cache)


if __name__ == "__main__":
    unittest.main()
