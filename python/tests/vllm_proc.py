"""One vLLM process for the connector tests: the scheduler (role SCHEDULER)
or a worker (role WORKER, one TP rank with its own KV arrays), each with its
own KvtierConnector, driven by the test over stdin/stdout in length-prefixed
pickles (the metadata goes from the scheduler's process to the workers'
exactly as vLLM sends it: pickled). argv: a pickled dict of settings, hex.
Replies ("ok", value) or ("err", traceback)."""
import os
import pickle
import struct
import sys
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import _util  # noqa: E402,F401  (puts python/ on the path)
import numpy as np  # noqa: E402

import _vllm_fakes as fakes  # noqa: E402


def read_msg(f):
    head = f.read(4)
    if len(head) < 4:
        return None
    n = struct.unpack("<I", head)[0]
    return pickle.loads(f.read(n))


def write_msg(f, obj):
    data = pickle.dumps(obj)
    f.write(struct.pack("<I", len(data)) + data)
    f.flush()


class Scheduler:
    def __init__(self, vc, s):
        self.s = s
        self.bs = s["block_size"]
        cfg = fakes.vllm_config(s["extra"], tp=s["tp"], block_size=self.bs,
                                device=s.get("device", "cuda"), pp=s.get("pp", 1),
                                total_layers=s.get("total_layers"))
        # PP: vLLM hands the scheduler worker 0's kv_cache_config (stage 0's layers)
        kcc = fakes.kv_cache_config(s["stages"][0], self.bs, s["heads"], s["dim"], mla=s["mla"])
        self.conn = vc.KvtierConnector(cfg, vc.KVConnectorRole.SCHEDULER, kcc)
        self.reqs = {}

    def matched(self, rid, tokens, num_computed):
        """vLLM's Scheduler.add_request (on_new_request), then its step."""
        self.add(rid, tokens)
        return self.ask(rid, num_computed)

    def add(self, rid, tokens):
        """Scheduler.add_request: the request queues; asked in a later step."""
        r = self.reqs[rid] = fakes.Request(rid, tokens, self.bs)
        self.conn.on_new_request(r)

    def ask(self, rid, num_computed):
        """vLLM asks again for a request still waiting (every step)."""
        return self.conn.get_num_new_matched_tokens(self.reqs[rid], num_computed)

    def alloc(self, rid, block_ids, num_external):
        self.conn.update_state_after_alloc(self.reqs[rid], fakes.Blocks(block_ids), num_external)

    def finished(self, rid, block_ids):
        return self.conn.request_finished(self.reqs[rid], block_ids)

    def meta(self):
        return pickle.dumps(self.conn.build_connector_meta(None))

    def hashes(self, rid):
        return list(self.reqs[rid].block_hashes)

    def flush(self):
        self.conn.client.flush(20)

    def stats(self):
        return self.conn.client.stats()

    def stage_stats(self):
        """Each PP stage's server's stats (the scheduler's own clients)."""
        return [cl.stats() for _, cl in self.conn._stages]

    def peeks_sent(self):
        return self.conn.peeks_sent

    def lookup_round_trips(self):
        return self.conn.lookup_round_trips

    def close(self):
        self.conn.shutdown()


class Worker:
    def __init__(self, vc, s):
        self.vc = vc
        self.rank = s["rank"]
        self.mla = s["mla"]
        self.bs = s["block_size"]
        pp_rank = s.get("pp_rank", 0)
        extra = dict(s["extra"], tp_rank=self.rank, pp_rank=pp_rank)
        device = s.get("device", "cuda")
        cfg = fakes.vllm_config(extra, tp=s["tp"], block_size=self.bs, device=device,
                                pp=s.get("pp", 1), total_layers=s.get("total_layers"))
        # a PP stage holds the model's layers [first, first + its count)
        self.first, layers = sum(s["stages"][:pp_rank]), s["stages"][pp_rank]
        # vLLM's CPU backend allocates head-major blocks, FlashAttention token-major
        shape = ((s["blocks"], self.bs, s["dim"]) if self.mla
                 else (2, s["blocks"], s["heads"], self.bs, s["dim"]) if device == "cpu"
                 else (2, s["blocks"], self.bs, s["heads"], s["dim"]))
        self.kv = {n: np.zeros(shape, np.float16)
                   for n in fakes.layer_names(layers, self.first)}
        self.conn = vc.KvtierConnector(cfg, vc.KVConnectorRole.WORKER, None)
        self.conn.register_kv_caches(self.kv)

    def _parts(self, name, b):
        """A layer's block as contiguous byte views (MHA: K, V)."""
        t = self.kv[name]
        parts = [t[b]] if self.mla else [t[0, b], t[1, b]]
        return [p.view(np.uint8).reshape(-1) for p in parts]

    def _want(self, h, layer, nbytes):
        """layer: this stage's index; the content names the model's layer."""
        return fakes.block_content(h, None if self.mla else self.rank, self.first + layer,
                                   nbytes)

    def _layer_bytes(self, name, b):
        return np.concatenate(self._parts(name, b))

    def fill(self, pairs):
        """The forward pass computed these blocks: (block id, hash) pairs."""
        for i, name in enumerate(self.kv):
            for b, h in pairs:
                parts = self._parts(name, b)
                want = self._want(h, i, sum(p.size for p in parts))
                at = 0
                for p in parts:
                    p[:] = want[at:at + p.size]
                    at += p.size

    def poison(self, block_ids, byte=0xEE):
        for name in self.kv:
            for b in block_ids:
                for p in self._parts(name, b):
                    p[:] = byte

    def check(self, pairs):
        """Block ids whose bytes differ from what their hash says, any layer."""
        bad = []
        for b, h in pairs:
            for i, name in enumerate(self.kv):
                v = self._layer_bytes(name, b)
                if not np.array_equal(v, self._want(h, i, v.size)):
                    bad.append(b)
                    break
        return bad

    def is_poisoned(self, block_ids, byte=0xEE):
        return [b for b in block_ids
                if all((self._layer_bytes(n, b) == byte).all() for n in self.kv)]

    def step(self, meta_bytes, finished=()):
        """One engine step as vLLM's model runner drives the connector."""
        c = self.conn
        c.bind_connector_metadata(pickle.loads(meta_bytes))
        c.start_load_kv(None)
        for name, t in self.kv.items():
            c.wait_for_layer_load(name)
            c.save_kv_layer(name, t, None)
        c.wait_for_save()
        done = c.get_finished(set(finished))
        errors = c.get_block_ids_with_load_errors()
        c.clear_connector_metadata()
        return done, errors

    def reattach(self, timeout=20):
        """Waits until this worker's client is attached again after a server
        restart (its first call after the loss fails, then it re-attaches)."""
        import time
        deadline = time.monotonic() + timeout
        while True:
            try:
                return self.conn.cache.stats()["block_bytes"] > 0
            except Exception:  # noqa: BLE001
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def namespace(self):
        return self.conn.namespace

    def close(self):
        self.conn.shutdown()


def main():
    s = pickle.loads(bytes.fromhex(sys.argv[1]))
    import logging
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    import kvtier.vllm_connector as vc
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing else may write to the reply pipe
    try:
        obj = (Scheduler if s["role"] == "scheduler" else Worker)(vc, s)
        write_msg(stdout, ("ok", None))
    except Exception:  # noqa: BLE001
        write_msg(stdout, ("err", traceback.format_exc()))
        return
    while True:
        msg = read_msg(stdin)
        if msg is None:
            break
        name, args = msg
        try:
            write_msg(stdout, ("ok", getattr(obj, name)(*args)))
        except Exception:  # noqa: BLE001
            write_msg(stdout, ("err", traceback.format_exc()))
        if name == "close":
            break


if __name__ == "__main__":
    main()
