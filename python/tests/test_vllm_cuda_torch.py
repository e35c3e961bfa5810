"""kvtier.vllm_connector with real torch CUDA tensors, on a GPU machine
(scripts/gpu-check.sh runs it; skipped where torch cannot see a GPU). The
same engines as vllm_cuda_cases (scheduler and worker driven as vLLM
drives them, every loaded block byte-checked right after its layer's
wait), in-process (the torch current stream waits on each layer's event)
and through a `kvtier serve`."""
import os
import shutil
import tempfile
import unittest

import vllm_cuda_cases as cases


def _torch_cuda():
    try:
        import torch
        return torch if torch.cuda.is_available() else None
    except Exception:
        return None


def setUpModule():
    cases.imports()
    if _torch_cuda() is None:
        raise unittest.SkipTest("skipped: no CUDA device (torch with a visible GPU is not "
                                "available)")


class TorchKV:
    """A layer's KV as vLLM allocates it: one CUDA buffer in the backend's
    physical order (phys), handed over permuted to the logical shape."""

    def __init__(self, phys_shape, perm, seed):
        import torch
        gen = torch.Generator(device="cuda").manual_seed(seed)
        n = 1
        for d in phys_shape:
            n *= d
        self.phys = torch.randint(0, 256, (n * 2,), dtype=torch.uint8, device="cuda",
                                  generator=gen).view(torch.float16).view(phys_shape)
        self.logical = self.phys.permute(perm) if perm else self.phys

    def tensor(self):
        return self.logical


def torch_kv(layout, seed):
    shape, perm, _, _ = cases.LAYOUTS[layout]
    return {"model.layers.%d.self_attn.attn" % i: TorchKV(shape, perm, seed * 10 + i)
            for i in range(cases.LAYERS)}


class TorchInProcess(unittest.TestCase):
    def check(self, layout):
        e = cases.Engine(self, "torch-" + layout, layout, torch_kv(layout, 1))
        self.assertEqual(e.worker.device, 0)
        expect = e.snapshot()
        e.store("a")
        calls = e.load("b", expect)
        self.assertEqual(calls, [("stream_wait_layer", i) for i in range(cases.LAYERS)])

    def test_flash_attn_nhd(self):
        self.check("flash_attn_nhd")

    def test_flash_attn_hnd(self):
        self.check("flash_attn_hnd")

    def test_flashinfer_nhd(self):
        self.check("flashinfer_nhd")

    def test_mla(self):
        self.check("mla")


class TorchThroughServer(unittest.TestCase):
    def test_store_then_load_into_another_engine(self):
        from test_client import start_server, stop_server
        tmp = tempfile.mkdtemp(prefix="kvtct")
        self.addCleanup(shutil.rmtree, tmp, True)
        sock = os.path.join(tmp, "node.sock")
        srv = start_server(sock, "--set", "block_tokens=%d" % cases.BS, model=None)
        self.addCleanup(stop_server, srv)
        a = cases.Engine(self, "ta", "flash_attn_nhd", torch_kv("flash_attn_nhd", 3), sock)
        expect = a.snapshot()
        a.store("a")
        b = cases.Engine(self, "tb", "flash_attn_nhd", torch_kv("flash_attn_nhd", 4), sock)
        self.assertEqual(b.load("b", expect),
                         [("wait_layer", i) for i in range(cases.LAYERS)])


if __name__ == "__main__":
    unittest.main()
