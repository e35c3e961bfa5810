"""kvtier as SGLang's HiCache L3 storage, driven exactly as SGLang drives it.

SGLang would be started with:

    python -m sglang.launch_server --model-path <model> --page-size 16 \\
        --enable-hierarchical-cache --hicache-mem-layout layer_first \\
        --hicache-storage-backend dynamic \\
        --hicache-storage-backend-extra-config '{"backend_name": "kvtier",
            "module_path": "kvtier.sglang_hicache", "class_name": "KvtierHiCacheStorage",
            "interface_v1": 1, "cpu_capacity": "64MiB", "ssd_dir": "/tmp/kvtier-l3"}'

This example plays SGLang's part (SGLang itself is not installed here): a
host pool shaped like SGLang's MHATokenToKVPoolHost, the backend built as
StorageBackendFactory builds a "dynamic" backend, page hashes chained over
the tokens of each page as SGLang's get_hash_str chains them, a backup
thread writing pages through in batches of 128 while a prefetch thread
reads another conversation's pages back, then an engine restart: a new
backend on the same SSD directory finds every page and every loaded byte
is checked.

Run: make demo-python   (or KVTIER_LIB=build/libkvtier.so /usr/bin/python3 examples/python/sglang_hicache_example.py)
"""
import hashlib
import importlib
import os
import shutil
import sys
import tempfile
import threading
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import kvtier.sglang_hicache as hc  # noqa: E402

LAYERS, HEADS, HEAD_DIM, PAGE, PAGES = 8, 4, 64, 16, 512
BATCH = 128  # SGLang's STORAGE_BATCH_SIZE


class HostPool:
    """SGLang's MHA host pool, layer_first: kv_buffer (2, layers, tokens, heads, head_dim)."""
    layout, page_size, layer_num, dtype = "layer_first", PAGE, LAYERS, np.float16

    def __init__(self):
        self.size = PAGES * PAGE
        self.kv_buffer = np.zeros((2, LAYERS, self.size, HEADS, HEAD_DIM), np.float16)
        self.free = list(range(PAGES))

    def alloc(self, n):
        got, self.free = self.free[:n], self.free[n:]
        return np.asarray(got, np.int64)

    def host_indices(self, pages):
        return (pages[:, None] * PAGE + np.arange(PAGE)).ravel()

    def compute(self, tokens, pages):
        """The "forward pass": each token's KV is a function of its prefix."""
        for i, p in enumerate(pages):
            toks = tokens[i * PAGE:(i + 1) * PAGE]
            seed = int.from_bytes(hashlib.blake2b(tokens[:(i + 1) * PAGE].tobytes(),
                                                  digest_size=8).digest(), "little")
            rng = np.random.default_rng(seed + len(toks))
            self.kv_buffer[:, :, p * PAGE:(p + 1) * PAGE] = rng.standard_normal(
                (2, LAYERS, PAGE, HEADS, HEAD_DIM)).astype(np.float16)

    def page(self, p):
        return self.kv_buffer[:, :, p * PAGE:(p + 1) * PAGE].view(np.uint8)


def page_hashes(tokens):
    """Chained per-page hashes, as SGLang's get_hash_str(token_ids, prior_hash)."""
    out, prior = [], None
    for i in range(0, len(tokens) - len(tokens) % PAGE, PAGE):
        h = hashlib.sha256()
        if prior:
            h.update(bytes.fromhex(prior))
        h.update(tokens[i:i + PAGE].astype("<u4").tobytes())
        prior = h.hexdigest()
        out.append(prior)
    return out


def make_backend(ssd_dir, pool):
    cfg = hc.HiCacheStorageConfig(
        tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
        is_mla_model=False, enable_storage_metrics=False, is_page_first_layout=False,
        model_name="example/llama-tiny",
        extra_config={"backend_name": "kvtier", "module_path": "kvtier.sglang_hicache",
                      "class_name": "KvtierHiCacheStorage", "interface_v1": 1,
                      "cpu_capacity": "64MiB", "ssd_dir": ssd_dir, "ssd_capacity": "256MiB",
                      "kvtier_options": {"huge_pages": False}})
    # StorageBackendFactory._create_dynamic_backend, then the cache controller:
    cls = getattr(importlib.import_module(cfg.extra_config["module_path"]),
                  cfg.extra_config["class_name"])
    assert issubclass(cls, hc.HiCacheStorage)
    backend = cls(cfg, {})
    backend.register_mem_pool_host(pool)
    return backend


def backup(backend, hashes, pool, pages):
    for i in range(0, len(hashes), BATCH):
        ok = backend.batch_set_v1(hashes[i:i + BATCH], pool.host_indices(pages[i:i + BATCH]))
        assert all(ok), "backup failed"


def prefetch(backend, hashes, pool):
    """batch_exists for the hit, then batch_get_v1 into fresh host pages."""
    hit = 0
    for i in range(0, len(hashes), BATCH):
        n = backend.batch_exists(hashes[i:i + BATCH])
        hit += n
        if n < len(hashes[i:i + BATCH]):
            break
    pages = pool.alloc(hit)
    got = 0
    for i in range(0, hit, BATCH):
        ok = backend.batch_get_v1(hashes[i:i + BATCH], pool.host_indices(pages[i:i + BATCH]))
        run = ok.index(False) if False in ok else len(ok)
        got += run
        if run < len(ok):
            break
    return pages[:got]


def main():
    tmp = tempfile.mkdtemp(prefix="kvtier-sglang-")
    rng = np.random.default_rng(1)
    convs = [rng.integers(0, 32000, n * PAGE, dtype=np.uint32) for n in (150, 90)]
    hashes = [page_hashes(c) for c in convs]
    try:
        pool = HostPool()
        backend = make_backend(tmp, pool)
        src = [pool.alloc(len(h)) for h in hashes]
        for c, p in zip(convs, src):
            pool.compute(c, p)
        backup(backend, hashes[0], pool, src[0])  # conversation 0 is in L3 first
        # SGLang's backup and prefetch threads run at once.
        loaded = {}
        t0 = time.monotonic()
        tb = threading.Thread(target=backup, args=(backend, hashes[1], pool, src[1]))
        tp = threading.Thread(target=lambda: loaded.update(a=prefetch(backend, hashes[0], pool)))
        tb.start()
        tp.start()
        tb.join()
        tp.join()
        busy = time.monotonic() - t0
        checked = 0
        for s, d in zip(src[0], loaded["a"]):
            assert np.array_equal(pool.page(s), pool.page(d)), "page %d differs" % d
            checked += pool.page(d).nbytes
        backend.cache.flush(30)
        stats1 = backend.stats()
        backend.close()

        # Engine restart: a new process would build a new backend on the same SSD dir.
        pool2 = HostPool()
        for c, p in zip(convs, src):
            pool2.compute(c, p)  # the reference bytes, to check against
        backend2 = make_backend(tmp, pool2)
        pool2.free = [p for p in pool2.free if p not in set(np.concatenate(src).tolist())]
        again = prefetch(backend2, hashes[1], pool2)
        for s, d in zip(src[1], again):
            assert np.array_equal(pool2.page(s), pool2.page(d)), "page %d differs" % d
            checked += pool2.page(d).nbytes
        stats2 = backend2.stats()
        backend2.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    print("kvtier as SGLang HiCache L3 (in-process, layer_first host pool, zero copy)")
    print("  backup      %d + %d pages of %d tokens written through" %
          (len(hashes[0]), len(hashes[1]), PAGE))
    print("  prefetch    %d of %d pages while the other backup ran (%.2f s for both)" %
          (len(loaded["a"]), len(hashes[0]), busy))
    print("  restart     %d blocks recovered from the SSD tier; %d of %d pages prefetched" %
          (stats2["kvtier_recovered_blocks"], len(again), len(hashes[1])))
    print("  stored      %d blocks, SSD written %d" %
          (stats1["kvtier_stored_blocks"], stats1["kvtier_ssd_written_blocks"]))
    print("  verified    %.1f MiB, every page byte-identical: OK" % (checked / 2**20))
    if len(loaded["a"]) != len(hashes[0]) or len(again) != len(hashes[1]):
        sys.exit("kvtier sglang example: a prefetch came back short")


if __name__ == "__main__":
    main()
