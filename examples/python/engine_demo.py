"""kvtier from a Python engine: two tensor-parallel ranks (threads over the
in-process transport) share cache decisions through the SGLang-shaped
connector. Turn 1 computes and stores a prompt; turn 2 extends it, loads
the cached prefix layer by layer and checks every loaded byte.

Run: make demo-python   (or KVTIER_LIB=build/libkvtier.so /usr/bin/python3 examples/python/engine_demo.py)
"""
import os
import sys
import threading

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import kvtier  # noqa: E402

TP, LAYERS, PAGE = 2, 4, 16


def rank_main(rank, fabric, report):
    # Each rank: its own cache over its own KV pages (its heads), one connector.
    with kvtier.EmulatedRank(rank, tp=TP, transport=("inproc", fabric), num_layers=LAYERS,
                             tokens_per_page=PAGE, num_pages=64, timeout=1.0) as r:
        r.join(connect_timeout=5.0)
        conn = r.sgl                                   # kvtier.SGLangConnector
        prompt = np.random.default_rng(7).integers(0, 32000, 96, dtype=np.uint32)

        # Turn 1: the engine computed the prompt's KV into pages 0..5; store it.
        r.engine.fill(prompt, range(6))
        conn.store_kv("turn-1", prompt, range(6))
        conn.step()                                    # one collective per iteration
        stored = conn.wait_for_store("turn-1", timeout=10)

        # Turn 2: prompt + 20 new tokens. Look up, give pages, step, load layerwise.
        turn2 = np.concatenate([prompt, np.arange(20, dtype=np.uint32)])
        pages = list(range(10, 18))
        local = conn.lookup_kv(turn2, "turn-2")
        load = conn.start_load_kv_layerwise("turn-2", pages)
        conn.step()                                    # the leader decides for all ranks
        for layer in range(LAYERS):
            load.wait_layer(layer, timeout=10)         # ... run layer `layer` here ...
        result = conn.wait_for_load("turn-2", timeout=10)
        check = r.engine.verify(turn2, pages, 0, load.tokens)
        report[rank] = (stored.ok, local, load.tokens, result.ok, check.bytes_checked,
                        check.mismatches, r.cache.stats()["hit_tokens"])


def main():
    report = {}
    with kvtier.Fabric(TP) as fabric:
        threads = [threading.Thread(target=rank_main, args=(i, fabric, report)) for i in range(TP)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    print("kvtier %s (%s)" % (kvtier.version(), kvtier.LIB_PATH))
    ok = len(report) == TP
    for rank in sorted(report):
        stored, local, agreed, loaded, checked, bad, hits = report[rank]
        print("  rank %d: stored=%s local match=%d agreed=%d loaded=%s verified %d bytes, "
              "%d mismatching" % (rank, stored, local, agreed, loaded, checked, bad))
        ok = ok and stored and loaded and bad == 0 and checked > 0
    print("engine demo: %s" % ("OK" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
