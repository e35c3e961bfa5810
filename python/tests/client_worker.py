"""One engine process attached to a kvtier server (test_client.py):
``client_worker.py SOCKET store|load SEED [keys|ikeys] [blocks=N]`` (ikeys:
independent keys, as SGLang's pages; N: the request's first N blocks, of 4). It fills (store) or
poisons then loads and verifies (load) an emulated engine's pages, prints
one JSON line with what happened, and exits 0 (1 with the error)."""
import json
import sys

import _util  # noqa: F401  (kvtier from this checkout)
import kvtier

TPP = 16


def tokens_of(seed, n):
    return [(seed * 1000003 + i * 7919) % 32000 for i in range(n)]


def keys_of(seed, n):
    return ["page-%d-%d" % (seed, i) for i in range(n)]


def main():
    sock, mode, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
    keyed = "keys" in sys.argv[4:] or "ikeys" in sys.argv[4:]
    independent = "ikeys" in sys.argv[4:]  # SGLang's pages
    blocks = 4
    for a in sys.argv[4:]:
        if a.startswith("blocks="):
            blocks = int(a[7:])
    geo = kvtier.Geometry.preset("tiny", TPP, 1)
    eng = kvtier.EmulatedEngine(geo, 64)
    out = {"mode": mode}
    with kvtier.Client(sock, geo, timeout_ms=5000) as cl:
        cl.register_engine(eng)
        bt = cl.block_tokens
        n = blocks * bt + (0 if keyed else 1)
        toks = tokens_of(seed, n)
        pages = [(i * 5 + 3) % 64 for i in range(n // TPP + 1)]
        req = {"keys": keys_of(seed, blocks)} if keyed else {"tokens": toks}
        if independent:
            req["independent"] = True
        if mode == "store":
            plan = cl.prepare_store(ns="tenant", **req)
            eng.fill(toks[:blocks * bt], pages, ns=None if keyed else "tenant")
            if plan.task:
                cl.launch(plan.task, pages)
                r = cl.wait(plan.task, 10)
                out["status"] = r.status
            out["stored"] = plan.num_tokens
        else:
            m = cl.lookup(ns="tenant", **req)
            out["matched"] = m.matched_tokens
            if m.task:
                eng.poison(pages)
                cl.launch(m.task, pages)
                cl.wait_layer(m.task, geo.info()["num_layers"] - 1, 10)
                r = cl.wait(m.task, 10)
                out["status"] = r.status
                v = eng.verify(toks[:blocks * bt], pages, count=m.matched_tokens,
                               ns=None if keyed else "tenant")
                out["bytes_checked"] = v.bytes_checked
                out["mismatches"] = v.mismatches
        out["stats"] = cl.stats()
        out["block_tokens"] = bt
    eng.close()
    geo.close()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
