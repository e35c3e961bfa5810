"""The PD tests' model, and one prefill rank as its own process.

test_pd imports the helpers (geometry, engine, tokens); run as a script it
is a prefill rank for test_pd's two-process case: an emulated engine
computes a request's KV and a Sender hands it to the decode ranks of the
parent process over TCP. argv: bootstrap_port room num_tokens secret_hex.
Prints "READY" once registered with the bootstrap service, then
"RESULT <json>" (its room's final state and bytes) or "ERROR <json>"."""
import json
import sys
import traceback

import numpy as np

import _util  # noqa: F401  (sys.path)

LAYERS = 3
HEADS = 8      # KV heads of the whole model, split across TP ranks
HEAD_DIM = 16  # bf16: 32 bytes per head per token
NS = b"pd-test"


def tokens(ntok, seed=7):
    """The request's token ids (deterministic)."""
    return np.random.default_rng(seed).integers(0, 50000, ntok, dtype=np.uint32)


def geometry(tp, tpp, layout=None, head_dim=HEAD_DIM):
    """One TP rank's share of the model: HEADS / tp KV heads per layer."""
    import kvtier
    layout = kvtier.LAYER_FIRST if layout is None else layout
    return kvtier.Geometry.uniform(LAYERS, tpp, HEADS // tp, head_dim, layout=layout)


def engine(tp, rank, tpp, ntok, layout=None):
    """(EmulatedEngine holding TP rank `rank`'s heads, the request's pages):
    scattered, in reverse order, with free pages between them."""
    import kvtier
    need = (ntok + tpp - 1) // tpp
    with geometry(tp, tpp, layout) as g:
        eng = kvtier.EmulatedEngine(g, 2 * need + 3, first_head=rank * (HEADS // tp))
    pages = np.array([2 * need + 2 - 2 * i for i in range(need)], dtype=np.uint32)
    return eng, pages


def main():
    port, room, ntok, secret = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    import kvtier
    try:
        eng, pages = engine(tp=1, rank=0, tpp=16, ntok=ntok)
        req = tokens(ntok)
        with eng, kvtier.Sender(("127.0.0.1", port), engine=eng, secret=bytes.fromhex(secret),
                                bootstrap_timeout=10, connect_timeout=10) as sender:
            eng.fill(req, pages, ns=NS)
            print("READY", flush=True)
            sender.room(room)
            sender.send(room, pages, ntok)
            state = sender.wait(room, 15)
            info = sender.info(room)
            sender.clear(room)
        print("RESULT " + json.dumps({"state": int(state), "bytes": info.bytes,
                                      "peers": info.peers, "message": info.message}), flush=True)
    except BaseException:
        print("ERROR " + json.dumps(traceback.format_exc()), flush=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
