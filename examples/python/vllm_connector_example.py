"""kvtier as a vLLM KV connector, driven exactly as vLLM drives it: a
scheduler process and a worker process, both attached to the node's
`kvtier serve` (socket mode, the recommended deployment).

The deployment this example plays:

    kvtier serve --socket /run/kvtier/node.sock --model tiny --page 16 \\
        --set block_tokens=16 --set cpu_capacity=64MiB &
    vllm serve <model> --device cpu --block-size 16 \\
        --kv-transfer-config '{"kv_connector": "KvtierConnector",
            "kv_connector_module_path": "kvtier.vllm_connector", "kv_role": "kv_both",
            "kv_connector_extra_config": {"socket": "/run/kvtier/node.sock"}}'

vLLM itself is not installed here, so this process plays vLLM's engine core
(the scheduler role's connector lives here) and starts one worker process
(the worker role's connector, host KV tensors as vLLM's CPU backend,
CPU_ATTN, allocates them: (2, num_blocks, num_kv_heads, block_size,
head_size), which both roles expect from the device);
every step the scheduler's KvtierConnectorMetadata goes to the worker
pickled, as vLLM's IPC sends it. Turn 1 of a chat is computed and saved
when it finishes (vLLM holds its blocks until the worker reports the save);
turn 2 extends it: the scheduler finds the cached prefix in the server,
the worker loads it asynchronously and reports it received, and every
loaded byte is checked.

Run: make demo-python   (or KVTIER_LIB=build/libkvtier.so /usr/bin/python3 examples/python/vllm_connector_example.py)
"""
import hashlib
import importlib
import multiprocessing as mp
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import time
import types

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import kvtier  # noqa: E402
import kvtier.vllm_connector as vc  # noqa: E402

# kvtier serve's "tiny" geometry at TP 1: 4 layers, 2 KV heads of 64, fp16.
LAYERS, HEADS, DIM, BS, BLOCKS = 4, 2, 64, 16, 256
NAMES = ["model.layers.%d.self_attn.attn" % i for i in range(LAYERS)]


def vllm_config(sock):
    ns = types.SimpleNamespace
    return ns(kv_transfer_config=ns(
        kv_connector="KvtierConnector", kv_connector_module_path="kvtier.vllm_connector",
        kv_role="kv_both", engine_id="example", is_kv_producer=True,
        kv_connector_extra_config={"socket": sock, "timeout": 10}),
        cache_config=ns(block_size=BS), model_config=ns(model="example/llama-tiny"),
        parallel_config=ns(tensor_parallel_size=1, pipeline_parallel_size=1),
        device_config=ns(device_type="cpu"))


def kv_cache_config():
    """The KVCacheConfig vLLM hands every role: one group, FullAttentionSpec."""
    ns = types.SimpleNamespace
    spec = ns(block_size=BS, num_kv_heads=HEADS, head_size=DIM, dtype=np.float16)
    return ns(num_blocks=BLOCKS, kv_cache_groups=[ns(layer_names=NAMES, kv_cache_spec=spec)])


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


def block_kv(tokens, i):
    """The "forward pass": block i's KV is a function of its whole prefix."""
    seed = int.from_bytes(hashlib.blake2b(np.asarray(tokens[:(i + 1) * BS], "<u4").tobytes(),
                                          digest_size=8).digest(), "little")
    return np.random.default_rng(seed).standard_normal((LAYERS, 2, HEADS, BS, DIM)) \
        .astype(np.float16)


def worker_main(pipe, sock):
    """vLLM's worker process: the WORKER role connector over its KV tensors."""
    cfg = vllm_config(sock)
    cls = getattr(importlib.import_module(cfg.kv_transfer_config.kv_connector_module_path),
                  cfg.kv_transfer_config.kv_connector)
    kv = {n: np.zeros((2, BLOCKS, HEADS, BS, DIM), np.float16) for n in NAMES}
    conn = cls(cfg, vc.KVConnectorRole.WORKER, kv_cache_config())
    conn.register_kv_caches(kv)
    try:
        while True:
            op, args = pipe.recv()
            if op == "compute":  # the forward pass wrote these blocks
                tokens, block_ids = args
                for i, b in enumerate(block_ids):
                    want = block_kv(tokens, i)
                    for layer, n in enumerate(NAMES):
                        kv[n][:, b] = want[layer]
                pipe.send(None)
            elif op == "step":  # one step, as vLLM's model runner drives it
                conn.bind_connector_metadata(pickle.loads(args))
                conn.start_load_kv(None)
                for n, t in kv.items():
                    conn.wait_for_layer_load(n)
                    conn.save_kv_layer(n, t, None)
                conn.wait_for_save()
                done = conn.get_finished(set())
                errors = conn.get_block_ids_with_load_errors()
                conn.clear_connector_metadata()
                pipe.send((done, errors))
            elif op == "verify":
                tokens, block_ids = args
                checked = 0
                for i, b in enumerate(block_ids):
                    want = block_kv(tokens, i)
                    for layer, n in enumerate(NAMES):
                        if not np.array_equal(kv[n][:, b].view(np.uint8),
                                              want[layer].view(np.uint8)):
                            pipe.send(-1 - b)
                            break
                        checked += want[layer].nbytes
                    else:
                        continue
                    break
                else:
                    pipe.send(checked)
            else:
                pipe.send(None)
                return
    finally:
        conn.shutdown()


def start_server(sock):
    exe = os.path.join(os.path.dirname(os.path.abspath(kvtier.LIB_PATH)), "kvtier")
    p = subprocess.Popen([exe, "serve", "--socket", sock, "--model", "tiny", "--page", str(BS),
                          "--set", "block_tokens=%d" % BS, "--set", "cpu_capacity=64MiB",
                          "--set", "huge_pages=false", "--set", "log_level=warn"])
    deadline = time.monotonic() + 10
    while not os.path.exists(sock):
        if p.poll() is not None or time.monotonic() > deadline:
            p.kill()
            sys.exit("kvtier vllm example: kvtier serve did not start")
        time.sleep(0.05)
    return p


def call(pipe, op, args=None):
    pipe.send((op, args))
    if not pipe.poll(60):
        sys.exit("kvtier vllm example: the worker did not answer %s" % op)
    return pipe.recv()


def run_until(pipe, sched, sent=(), recv=()):
    """Engine steps until the worker reported these requests' saves and
    loads; returns the load errors."""
    want_s, want_r, errors = set(sent), set(recv), set()
    deadline = time.monotonic() + 30
    while want_s or want_r:
        if time.monotonic() > deadline:
            sys.exit("kvtier vllm example: not reported: %s %s" % (want_s, want_r))
        (s, r), e = call(pipe, "step", pickle.dumps(sched.build_connector_meta(None)))
        want_s -= s or set()
        want_r -= r or set()
        errors |= e
    return errors


def main():
    tmp = tempfile.mkdtemp(prefix="kvtier-vllm-example-")
    sock = os.path.join(tmp, "node.sock")
    srv = start_server(sock)
    ctx = mp.get_context("spawn")
    pipe, child = ctx.Pipe()
    worker = ctx.Process(target=worker_main, args=(child, sock))
    worker.start()
    try:
        cfg = vllm_config(sock)
        cls = getattr(importlib.import_module(cfg.kv_transfer_config.kv_connector_module_path),
                      cfg.kv_transfer_config.kv_connector)
        assert issubclass(cls, vc.KVConnectorBase_V1)
        sched = cls(cfg, vc.KVConnectorRole.SCHEDULER, kv_cache_config())

        rng = np.random.default_rng(5)
        turn1 = rng.integers(0, 32000, 40 * BS + 7).tolist()
        r1 = Request("turn-1", turn1)
        hit1, _ = sched.get_num_new_matched_tokens(r1, 0)
        blocks1 = list(range(41))
        call(pipe, "compute", (turn1, blocks1[:40]))
        held = sched.request_finished(r1, blocks1)
        run_until(pipe, sched, sent={"turn-1"})

        turn2 = turn1 + rng.integers(0, 32000, 30 * BS).tolist()
        r2 = Request("turn-2", turn2)
        hit2, load_async = sched.get_num_new_matched_tokens(r2, 0)
        blocks2 = list(range(100, 100 + len(turn2) // BS + 1))
        sched.update_state_after_alloc(r2, Blocks(blocks2), hit2)
        errors = run_until(pipe, sched, recv={"turn-2"})
        checked = call(pipe, "verify", (turn2, blocks2[:hit2 // BS]))
        stats = sched.client.stats()
        sched.shutdown()
    finally:
        call(pipe, "close")
        worker.join(30)
        srv.terminate()
        srv.wait(15)
        shutil.rmtree(tmp, ignore_errors=True)

    print("kvtier as a vLLM KV connector (socket mode: scheduler and worker processes, "
          "one kvtier serve)")
    print("  turn 1      %d tokens, %d cached before; finished: %d blocks saved (held: %s)"
          % (len(turn1), hit1, stats["stored_blocks"], held[0]))
    print("  turn 2      %d tokens, %d loaded from kvtier (async: %s), %d load errors"
          % (len(turn2), hit2, load_async, len(errors)))
    if checked < 0:
        sys.exit("kvtier vllm example: block %d differs" % (-1 - checked))
    print("  verified    %.1f MiB, every loaded block byte-identical: OK" % (checked / 2**20))
    if hit2 != 40 * BS or errors or not load_async:
        sys.exit("kvtier vllm example: expected 640 tokens loaded asynchronously, no errors")


if __name__ == "__main__":
    main()
