"""kvtier as a vLLM KV connector, driven exactly as vLLM drives it in one
process (the uniproc executor, VLLM_ENABLE_V1_MULTIPROCESSING=0).

vLLM would be started with:

    VLLM_ENABLE_V1_MULTIPROCESSING=0 vllm serve <model> --device cpu --block-size 16 \\
        --kv-transfer-config '{"kv_connector": "KvtierConnector",
            "kv_connector_module_path": "kvtier.vllm_connector", "kv_role": "kv_both",
            "kv_connector_extra_config": {"cpu_capacity": "64MiB"}}'

This example plays vLLM's part (vLLM itself is not installed here): the
factory-style construction of a scheduler-role and a worker-role connector,
host KV tensors in FlashAttention's layout, block hashes chained over each
block's tokens, and per engine step the scheduler calls, the metadata
handed to the worker, and the worker's forward-pass calls layer by layer.
Turn 1 of a chat is computed and saved when it finishes; turn 2 extends it
and loads the cached prefix; every loaded byte is checked.

Run: make demo-python   (or KVTIER_LIB=build/libkvtier.so /usr/bin/python3 examples/python/vllm_connector_example.py)
"""
import hashlib
import importlib
import os
import sys
import types

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import kvtier.vllm_connector as vc  # noqa: E402

LAYERS, HEADS, DIM, BS, BLOCKS = 8, 4, 64, 16, 256


class Request:
    def __init__(self, rid, tokens):
        self.request_id, self.num_tokens, self.block_hashes, prev = rid, len(tokens), [], b""
        for i in range(len(tokens) // BS):
            prev = hashlib.sha256(prev + np.asarray(tokens[i * BS:(i + 1) * BS],
                                                    "<u4").tobytes()).digest()
            self.block_hashes.append(prev)


class Blocks:
    def __init__(self, ids):
        self.ids = list(ids)

    def get_block_ids(self):
        return (self.ids,)


def compute(kv, tokens, block_ids):
    """The "forward pass": a block's KV is a function of its whole prefix."""
    for i, b in enumerate(block_ids):
        seed = int.from_bytes(hashlib.blake2b(np.asarray(tokens[:(i + 1) * BS], "<u4")
                                              .tobytes(), digest_size=8).digest(), "little")
        rng = np.random.default_rng(seed)
        for t in kv.values():
            t[:, b] = rng.standard_normal((2, BS, HEADS, DIM)).astype(np.float16)


def main():
    ns = types.SimpleNamespace
    cfg = ns(kv_transfer_config=ns(
        kv_connector="KvtierConnector", kv_connector_module_path="kvtier.vllm_connector",
        kv_role="kv_both", engine_id="example", is_kv_producer=True,
        kv_connector_extra_config={"cpu_capacity": "64MiB",
                                   "kvtier_options": {"huge_pages": False}}),
        cache_config=ns(block_size=BS), model_config=ns(model="example/llama-tiny"),
        parallel_config=ns(tensor_parallel_size=1, pipeline_parallel_size=1))
    # KVConnectorFactory: import the module, take the class, build it per role.
    cls = getattr(importlib.import_module(cfg.kv_transfer_config.kv_connector_module_path),
                  cfg.kv_transfer_config.kv_connector)
    assert issubclass(cls, vc.KVConnectorBase_V1)
    kv = {"model.layers.%d.self_attn.attn" % i: np.zeros((2, BLOCKS, BS, HEADS, DIM), np.float16)
          for i in range(LAYERS)}
    worker = cls(cfg, vc.KVConnectorRole.WORKER, None)
    worker.register_kv_caches(kv)
    sched = cls(cfg, vc.KVConnectorRole.SCHEDULER, None)

    def step(finished=()):
        worker.bind_connector_metadata(sched.build_connector_meta(None))
        worker.start_load_kv(None)
        for name, t in kv.items():
            worker.wait_for_layer_load(name)
            worker.save_kv_layer(name, t, None)
        worker.wait_for_save()
        worker.clear_connector_metadata()
        return worker.get_finished(set(finished)), worker.get_block_ids_with_load_errors()

    try:
        rng = np.random.default_rng(5)
        turn1 = rng.integers(0, 32000, 40 * BS + 7).tolist()
        r1 = Request("turn-1", turn1)
        hit1, _ = sched.get_num_new_matched_tokens(r1, 0)
        blocks1 = list(range(41))
        compute(kv, turn1, blocks1[:40])
        held = sched.request_finished(r1, blocks1)
        (saved, _), _ = step(finished={"turn-1"})

        turn2 = turn1 + rng.integers(0, 32000, 30 * BS).tolist()
        r2 = Request("turn-2", turn2)
        hit2, load_async = sched.get_num_new_matched_tokens(r2, 0)
        blocks2 = list(range(100, 100 + len(turn2) // BS + 1))
        sched.update_state_after_alloc(r2, Blocks(blocks2), hit2)
        _, errors = step()
        ref = {n: t.copy() for n, t in kv.items()}
        compute(ref, turn2, blocks2[:hit2 // BS])
        checked = 0
        for n in kv:
            for b in blocks2[:hit2 // BS]:
                assert np.array_equal(kv[n][:, b].view(np.uint8), ref[n][:, b].view(np.uint8)), \
                    "block %d of %s differs" % (b, n)
                checked += kv[n][:, b].nbytes
        stats = worker.cache.stats()
    finally:
        worker.shutdown()

    print("kvtier as a vLLM KV connector (in-process, host KV tensors, zero copy)")
    print("  turn 1      %d tokens, %d cached before; finished: %d blocks saved (held: %s, "
          "reported %s)" % (len(turn1), hit1, stats["stored_blocks"], held[0], sorted(saved)))
    print("  turn 2      %d tokens, %d loaded from kvtier layer by layer (async: %s), "
          "%d load errors" % (len(turn2), hit2, load_async, len(errors)))
    print("  verified    %.1f MiB, every loaded block byte-identical: OK" % (checked / 2**20))
    if hit2 != 40 * BS or errors:
        sys.exit("kvtier vllm example: expected 640 tokens loaded and no errors")


if __name__ == "__main__":
    main()
