"""What vLLM hands a KV connector, for tests that play vLLM's part (vLLM is
not installed here): its config objects, the Request fields the connector
reads, the scheduler's block list, and KV contents that a checker can
recompute from a block's hash alone (so any process can verify any loaded
block)."""
import hashlib
import types

import numpy as np

ns = types.SimpleNamespace


def vllm_config(extra, engine="engine-0", block_size=4, tp=1, model="org/llama",
                device="cuda", pp=1, total_layers=None):
    """device "cpu": vLLM's CPU platform (CPU_ATTN: head-major KV).
    total_layers: the model's hidden layers, all PP stages (ModelConfig's
    get_total_num_hidden_layers)."""
    mc = ns(model=model)
    if total_layers is not None:
        mc.get_total_num_hidden_layers = lambda: total_layers
    return ns(kv_transfer_config=ns(kv_connector_extra_config=dict(extra), engine_id=engine,
                                    is_kv_producer=True),
              cache_config=ns(block_size=block_size), model_config=mc,
              parallel_config=ns(tensor_parallel_size=tp, pipeline_parallel_size=pp),
              device_config=ns(device_type=device))


def kv_cache_config(layers, block_size, heads, head_size, dtype=np.float16, mla=False,
                    num_blocks=64):
    """vllm.v1.kv_cache_interface.KVCacheConfig's fields the connector reads:
    one KVCacheGroupSpec(layer_names, kv_cache_spec) whose spec is a
    FullAttentionSpec (MLA: MLAAttentionSpec, one latent "head")."""
    spec_cls = type("MLAAttentionSpec" if mla else "FullAttentionSpec", (), {})
    spec = spec_cls()
    spec.block_size, spec.num_kv_heads, spec.head_size, spec.dtype = (
        block_size, heads, head_size, dtype)
    return ns(num_blocks=num_blocks, kv_cache_groups=[
        ns(layer_names=layer_names(layers), kv_cache_spec=spec)])


def layer_names(layers, first=0):
    """A stage's attention layers: PP stages hold [first, first + layers)."""
    return ["model.layers.%d.self_attn.attn" % i for i in range(first, first + layers)]


class Request:
    """The fields of vllm.v1.request.Request the connector reads; block
    hashes chain over each full block's tokens like vLLM's."""

    def __init__(self, rid, tokens, block_size):
        self.request_id, self.num_tokens, self.num_computed_tokens = rid, len(tokens), 0
        self.block_hashes, prev = [], b""
        for i in range(len(tokens) // block_size):
            prev = hashlib.sha256(prev + np.asarray(tokens[i * block_size:(i + 1) * block_size],
                                                    "<u4").tobytes()).digest()
            self.block_hashes.append(prev)


class Blocks:
    """KVCacheBlocks: get_block_ids() gives one list per KV cache group."""

    def __init__(self, ids):
        self.ids = list(ids)

    def get_block_ids(self):
        return (self.ids,)


def block_content(block_hash, rank, layer, nbytes):
    """The bytes a block holds on TP rank `rank` (None for MLA: every rank
    holds the same latent) in one layer (the model's layer index, whichever
    PP stage holds it): a function of the block's hash."""
    seed = hashlib.blake2b(block_hash + b"|%s|%d" % (str(rank).encode(), layer),
                           digest_size=8).digest()
    return np.random.default_rng(int.from_bytes(seed, "little")).integers(
        0, 256, nbytes, dtype=np.uint8)
