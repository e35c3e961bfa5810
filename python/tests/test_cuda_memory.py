"""Engine memory on a CUDA device through the binding: CUDA tensors are
recognised by duck typing (data_ptr() and device.type == "cuda"; torch is not
needed), registered as KVT_MEMORY_CUDA with their device ordinal, mixed
host/device buffers are refused, and without a GPU the library's refusal
(no runtime / no device) reaches Python as Unsupported while host buffers
keep working. A fake tensor over host memory stands in for a torch CUDA
tensor (on a GPU machine the library then refuses it as not device memory)."""
import ctypes
import unittest

import numpy as np

from _util import skip_if_unloadable


def setUpModule():
    skip_if_unloadable()
    global kvtier, cache_mod, _lib
    import kvtier
    import kvtier.cache as cache_mod
    from kvtier import _lib


class FakeDevice:
    def __init__(self, type_, index):
        self.type = type_
        self.index = index


class FakeCudaTensor:
    """The attributes of a torch CUDA tensor kvtier reads."""

    def __init__(self, nbytes, index=0, contiguous=True):
        self._buf = np.zeros(nbytes, dtype=np.uint8)  # host memory: an address only
        self.device = FakeDevice("cuda", index)
        self._contiguous = contiguous

    def data_ptr(self):
        return self._buf.ctypes.data

    def numel(self):
        return self._buf.size

    def element_size(self):
        return 1

    def is_contiguous(self):
        return self._contiguous


class CudaRegistration(unittest.TestCase):
    def setUp(self):
        self.geo = kvtier.Geometry.uniform(2, 16, 2, 16)
        self.cfg = kvtier.Config({"cpu_capacity": "4MiB", "block_tokens": 16})
        self.cache = kvtier.Cache(self.cfg, self.geo)
        self.need = 8 * 16 * self.geo.token_bytes(0, 0)

    def tearDown(self):
        self.cache.close()
        self.cfg.close()
        self.geo.close()

    def test_memory_struct_for_cuda_tensors(self):
        bufs = [[FakeCudaTensor(self.need, 3), FakeCudaTensor(self.need, 3)] for _ in range(2)]
        mem, keep = cache_mod.register_memory("t", self.geo, 8, buffers=bufs)
        self.assertEqual(mem.kind, _lib.KVT_MEMORY_CUDA)
        self.assertEqual(mem.device, 3)
        self.assertEqual(mem.layer_bases[2], bufs[1][0].data_ptr())
        self.assertEqual(ctypes.sizeof(_lib.EngineMemory),
                         _lib.lib.kvt_abi_struct_size(b"kvt_engine_memory"))
        host = [[np.zeros(self.need, np.uint8) for _ in range(2)] for _ in range(2)]
        mem, keep = cache_mod.register_memory("t", self.geo, 8, buffers=host)
        self.assertEqual(mem.kind, _lib.KVT_MEMORY_HOST)

    def test_mixed_and_bad_tensors_refused(self):
        mixed = [[FakeCudaTensor(self.need, 0), np.zeros(self.need, np.uint8)],
                 [FakeCudaTensor(self.need, 0), FakeCudaTensor(self.need, 0)]]
        with self.assertRaises(kvtier.InvalidArgument) as cm:
            cache_mod.register_memory("register_buffers", self.geo, 8, buffers=mixed)
        self.assertIn("buffers[0][0] is CUDA device 0 but buffers[0][1] is host memory",
                      str(cm.exception))
        two = [[FakeCudaTensor(self.need, 0), FakeCudaTensor(self.need, 1)],
               [FakeCudaTensor(self.need, 0), FakeCudaTensor(self.need, 0)]]
        with self.assertRaises(kvtier.InvalidArgument) as cm:
            cache_mod.register_memory("register_buffers", self.geo, 8, buffers=two)
        self.assertIn("is CUDA device 0 but buffers[0][1] is CUDA device 1", str(cm.exception))
        small = [[FakeCudaTensor(10, 0), FakeCudaTensor(self.need, 0)],
                 [FakeCudaTensor(self.need, 0), FakeCudaTensor(self.need, 0)]]
        with self.assertRaises(kvtier.InvalidArgument) as cm:
            cache_mod.register_memory("register_buffers", self.geo, 8, buffers=small)
        self.assertIn("buffers[0][0] holds 10 bytes", str(cm.exception))
        strided = [[FakeCudaTensor(self.need, 0, contiguous=False), FakeCudaTensor(self.need, 0)],
                   [FakeCudaTensor(self.need, 0), FakeCudaTensor(self.need, 0)]]
        with self.assertRaises(kvtier.InvalidArgument) as cm:
            cache_mod.register_memory("register_buffers", self.geo, 8, buffers=strided)
        self.assertIn("not contiguous", str(cm.exception))

    def test_register_cuda_tensors(self):
        bufs = [[FakeCudaTensor(self.need, 0), FakeCudaTensor(self.need, 0)] for _ in range(2)]
        try:
            self.cache.register_buffers(8, buffers=bufs)
            self.fail("fake (host) tensors registered as device memory")
        except kvtier.Unsupported as e:  # no GPU here: which part is missing is named
            self.assertTrue("needs the CUDA runtime" in e.message
                            or "no usable CUDA device" in e.message, e.message)
        except kvtier.InvalidArgument as e:  # a GPU: host memory is not device memory
            self.assertIn("not CUDA device memory", e.message)
        with self.assertRaises(kvtier.Unsupported) as cm:
            self.cache.layer_event(1, 0, 0)
        self.assertIn("layer events exist only for CUDA device memory", cm.exception.message)
        with self.assertRaises(kvtier.Unsupported):
            self.cache.stream_wait_layer(1, 0, 0, 0)
        with self.assertRaises(kvtier.InvalidArgument):
            self.cache.stream_wait_layer(1, 0, "stream", 0)
        # The cache still takes host buffers and works.
        with kvtier.EmulatedEngine(self.geo, 32) as eng:
            self.cache.register_engine(eng)
            tok = np.arange(0, 40, dtype=np.int64)
            eng.fill(tok, [0, 1, 2])
            plan = self.cache.prepare_store(tok)
            self.cache.launch(plan.task, [0, 1, 2])
            self.assertEqual(self.cache.wait(plan.task, 10).status, 0)


def _torch_cuda():
    try:
        import torch
        return torch if torch.cuda.is_available() else None
    except Exception:
        return None


class TorchCudaRoundTrip(unittest.TestCase):
    """On a GPU machine (scripts/gpu-check.sh): real torch CUDA tensors,
    stored and loaded back byte for byte, with layer events."""

    def test_round_trip(self):
        torch = _torch_cuda()
        if torch is None:
            self.skipTest("skipped: no CUDA device (torch with a visible GPU is not available)")
        geo = kvtier.Geometry.uniform(4, 16, 2, 64)
        cfg = kvtier.Config({"cpu_capacity": "16MiB", "block_tokens": 16})
        cache = kvtier.Cache(cfg, geo)
        try:
            pages = 16
            need = pages * 16 * geo.token_bytes(0, 0)
            gen = torch.Generator(device="cuda").manual_seed(1)
            bufs = [[torch.randint(0, 256, (need,), dtype=torch.uint8, device="cuda", generator=gen)
                     for _ in range(2)] for _ in range(4)]
            orig = [[b.clone() for b in layer] for layer in bufs]
            cache.register_buffers(pages, buffers=bufs)
            tok = np.arange(0, 16 * 8 + 1, dtype=np.int64)
            plan = cache.prepare_store(tok)
            self.assertEqual(plan.num_tokens, 128)
            cache.launch(plan.task, list(range(9)))
            self.assertEqual(cache.wait(plan.task, 30).status, 0)
            for layer in bufs:
                for b in layer:
                    b.zero_()
            torch.cuda.synchronize()
            m = cache.lookup(tok)
            self.assertEqual(m.matched_tokens, 128)
            cache.launch(m.task, list(range(9)))
            stream = torch.cuda.Stream()
            for layer in range(4):
                self.assertNotEqual(cache.layer_event(m.task, layer, 30), 0)
                cache.stream_wait_layer(m.task, layer, stream, 30)
            with torch.cuda.stream(stream):  # ordered behind every layer's copies
                seen = [[b[:128 * geo.token_bytes(0, 0)].clone() for b in layer] for layer in bufs]
            stream.synchronize()
            for layer in range(4):
                cache.wait_layer(m.task, layer, 30)
            self.assertEqual(cache.wait(m.task, 30).status, 0)
            n = 128 * geo.token_bytes(0, 0)
            for layer in range(4):
                for c in range(2):
                    self.assertTrue(torch.equal(bufs[layer][c][:n], orig[layer][c][:n]),
                                    "layer %d component %d differs" % (layer, c))
                    self.assertTrue(torch.equal(seen[layer][c], orig[layer][c][:n]),
                                    "layer %d component %d: the stream ran before the load"
                                    % (layer, c))
        finally:
            cache.close()
            cfg.close()
            geo.close()


if __name__ == "__main__":
    unittest.main()
