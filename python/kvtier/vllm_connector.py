"""kvtier as a vLLM KV connector (KVConnectorBase_V1), in-process pieces.

vLLM loads it with no patch to vLLM:

    --kv-transfer-config '{"kv_connector": "KvtierConnector",
        "kv_connector_module_path": "kvtier.vllm_connector", "kv_role": "kv_both",
        "kv_connector_extra_config": {"cpu_capacity": "64GiB"}}'

and builds KvtierConnector(vllm_config, role, kv_cache_config) once in the
scheduler (role SCHEDULER) and once per worker (role WORKER).

Blocks are keyed requests: a request's vLLM block hashes (each already
commits to its whole prefix) are the keys of one keyed request from block 0,
key i's parent key i-1, in a namespace of model, dtype, block size,
geometry and TP rank (MHA) or none (MLA), PP rank.

What this build does (docs/engines.md):
- worker role, host tensors: register_kv_caches (FlashAttention's
  (2, num_blocks, block_size, heads, head_size) per layer, or MLA's
  (num_blocks, block_size, head_size); CUDA tensors refused until kvtier's
  CUDA data path exists), start_load_kv / wait_for_layer_load (layerwise),
  save_kv_layer / wait_for_save, get_finished,
  get_block_ids_with_load_errors, shutdown; all driven by the metadata the
  scheduler role builds (KvtierConnectorMetadata);
- scheduler role: answers from the worker's cache when both run in one
  process (vLLM's uniproc executor with VLLM_ENABLE_V1_MULTIPROCESSING=0);
  with separate processes it needs kvtier's node server (`kvtier serve`),
  which this build lacks: get_num_new_matched_tokens then says 0 (the
  engine computes), and saves still happen on the workers.
"""
import logging
import threading
from dataclasses import dataclass, field
from typing import List

import numpy as np

from .cache import Cache
from .config import LAYER_FIRST, Config, Geometry

try:
    from vllm.distributed.kv_transfer.kv_connector.v1.base import (  # type: ignore
        KVConnectorBase_V1, KVConnectorMetadata, KVConnectorRole)
    VLLM_IMPORTED = True
except ImportError:
    from ._engine_stubs.vllm import (KVConnectorBase_V1, KVConnectorMetadata,  # noqa: F401
                                     KVConnectorRole)
    VLLM_IMPORTED = False

logger = logging.getLogger(__name__)

EXTRA_KEYS = {
    "cpu_capacity": "CPU tier per worker (default 1GiB)",
    "workers": "kvtier transfer threads",
    "eviction": "lru or lfu",
    "namespace": "extra salt for every block's namespace",
    "timeout": "seconds a transfer may take (default 30)",
    "tp_rank": "this worker's TP rank when vLLM's parallel state is not importable",
    "socket": "a `kvtier serve` socket (node server mode; not in this build)",
    "kvtier_options": "a dict of further kvtier options",
}

# In-process: the worker's cache, found by the scheduler of the same process.
_CACHES = {}
_CACHES_MU = threading.Lock()


@dataclass
class LoadSpec:
    """Load blocks [first_block, len(keys)) of a request: keys are its block
    hashes from block 0, block_ids its vLLM blocks from block 0."""
    req_id: str
    keys: List[bytes]
    block_ids: List[int]
    first_block: int = 0


@dataclass
class SaveSpec:
    """Store the request's full blocks (keys and block ids from block 0)."""
    req_id: str
    keys: List[bytes]
    block_ids: List[int]


@dataclass
class KvtierConnectorMetadata(KVConnectorMetadata):
    loads: List[LoadSpec] = field(default_factory=list)
    saves: List[SaveSpec] = field(default_factory=list)


def block_key(h):
    """A vLLM block hash as key bytes (bytes, str or int hashes)."""
    if isinstance(h, (bytes, bytearray, memoryview)):
        return bytes(h)
    if isinstance(h, str):
        return h.encode("utf-8")
    if isinstance(h, int):
        return h.to_bytes(max(1, (h.bit_length() + 8) // 8), "little", signed=True)
    hv = getattr(h, "hash_value", None)  # older vLLM: BlockHash(hash_value, ...)
    if hv is not None:
        return block_key(hv)
    raise TypeError("kvtier: block hash of type %s" % type(h).__name__)


def _host_array(t, what):
    """A numpy view of a host tensor (numpy array or CPU torch tensor)."""
    if isinstance(t, np.ndarray):
        return t
    if type(t).__module__.startswith("torch"):
        if t.device.type != "cpu":
            raise ValueError("kvtier: %s is a %s tensor; kvtier's connector moves host memory "
                             "only until its CUDA data path exists (use CPU KV caches, or "
                             "vLLM's CPU backend)" % (what, t.device.type))
        import ctypes
        e = t.element_size()
        raw = (ctypes.c_uint8 * (t.numel() * e)).from_address(t.data_ptr())
        return np.ctypeslib.as_array(raw).reshape(tuple(t.shape[:-1]) + (t.shape[-1] * e,))
    raise ValueError("kvtier: %s: expected a numpy array or torch tensor, got %s"
                     % (what, type(t).__name__))


class KvtierConnector(KVConnectorBase_V1):
    """vLLM KV connector over a kvtier cache (module docstring)."""

    def __init__(self, vllm_config, role, kv_cache_config):
        super().__init__(vllm_config, role, kv_cache_config)
        ktc = vllm_config.kv_transfer_config
        self.extra = dict(getattr(ktc, "kv_connector_extra_config", None) or {})
        unknown = sorted(set(self.extra) - set(EXTRA_KEYS))
        if unknown:
            raise ValueError("kvtier: unknown kv_connector_extra_config key(s) %s; kvtier's "
                             "keys: %s" % (", ".join(unknown), ", ".join(sorted(EXTRA_KEYS))))
        if "socket" in self.extra:
            raise RuntimeError("kvtier serve attach not available in this build: "
                               "kv_connector_extra_config \"socket\" needs kvtier's node "
                               "server client; remove it to run in-process")
        groups = getattr(kv_cache_config, "kv_cache_groups", None)
        if groups is not None and len(groups) > 1:
            raise NotImplementedError("kvtier: %d KV cache groups (a hybrid model); the "
                                      "connector supports one" % len(groups))
        self.timeout = float(self.extra.get("timeout", 30.0))
        self.engine_key = str(getattr(ktc, "engine_id", None) or "default")
        self.block_size = int(vllm_config.cache_config.block_size)
        self.model = str(getattr(vllm_config.model_config, "model", ""))
        pc = vllm_config.parallel_config
        self.tp_size = int(getattr(pc, "tensor_parallel_size", 1))
        self.pp_size = int(getattr(pc, "pipeline_parallel_size", 1))
        self.tp_rank, self.pp_rank = self._ranks()
        self.cache = None
        self.namespace = None
        self._layers = {}
        # worker state
        self._loads = []          # (spec, task, matched_blocks)
        self._load_errors = set()
        self._saved = set()       # req ids whose saves completed, for get_finished
        # scheduler state
        self._asked = {}          # req_id -> num_computed_tokens it was asked with
        self._meta = KvtierConnectorMetadata()
        self._mu = threading.Lock()

    def _ranks(self):
        tp = self.extra.get("tp_rank")
        if tp is None:
            try:
                from vllm.distributed.parallel_state import (  # type: ignore
                    get_pp_group, get_tensor_model_parallel_rank)
                return get_tensor_model_parallel_rank(), get_pp_group().rank_in_group
            except Exception:  # scheduler process, or vllm not importable
                tp = 0
        return int(tp), 0

    # ------------------------------------------------------------------
    # Worker role

    def register_kv_caches(self, kv_caches):
        """kv_caches: layer name -> host tensor, in layer order."""
        names = list(kv_caches)
        if not names:
            raise ValueError("kvtier: register_kv_caches got no layers")
        arrs = [_host_array(kv_caches[n], "kv_caches[%r]" % n) for n in names]
        views = [a.view(np.uint8).reshape(a.shape[:-1] + (a.shape[-1] * a.itemsize,))
                 if a.dtype != np.uint8 else a for a in arrs]
        first, elem = arrs[0], arrs[0].itemsize
        mla = first.ndim == 3
        for n, a in zip(names, arrs):
            if a.ndim not in (3, 5) or a.ndim != first.ndim or a.shape != first.shape:
                raise ValueError("kvtier: kv_caches[%r] has shape %s; expected every layer "
                                 "(2, num_blocks, block_size, heads, head_size) or MLA "
                                 "(num_blocks, block_size, head_size), all alike (first: %s)"
                                 % (n, a.shape, first.shape))
            if a.ndim == 5 and a.shape[0] != 2:
                raise ValueError("kvtier: kv_caches[%r] has shape %s: the first dim must be 2 "
                                 "(K, V; FlashAttention's layout)" % (n, a.shape))
            if not a.flags.c_contiguous:
                raise ValueError("kvtier: kv_caches[%r] is not contiguous" % n)
        if mla:
            num_blocks, bs, dim = first.shape
            heads, comps = 1, 1
            bufs = [[v] for v in views]
        else:
            _, num_blocks, bs, heads, dim = first.shape
            comps = 2
            bufs = [[v[0], v[1]] for v in views]
        if bs != self.block_size:
            raise ValueError("kvtier: KV caches hold %d tokens per block, cache_config.block_size "
                             "is %d" % (bs, self.block_size))
        self.is_mla = mla
        self._layers = {n: i for i, n in enumerate(names)}
        self.namespace = "|".join([
            "kvtier-vllm-v1", "model=%s" % self.model, "dtype=%s" % first.dtype,
            "block=%d" % bs, "layers=%d" % len(names), "heads=%d" % heads, "dim=%d" % dim,
            "mla" if mla else "tp=%d/%d" % (self.tp_rank, self.tp_size),
            "pp=%d/%d" % (self.pp_rank, self.pp_size)] +
            (["salt=%s" % self.extra["namespace"]] if self.extra.get("namespace") else []))
        opts = {"block_tokens": bs}
        for k in ("cpu_capacity", "workers", "eviction"):
            if k in self.extra:
                opts[k] = self.extra[k]
        opts.update(self.extra.get("kvtier_options") or {})
        with Config(opts) as cfg, Geometry.uniform(len(names), bs, heads, dim, elem, comps,
                                                   LAYER_FIRST) as geo:
            cache = Cache(cfg, geo)
        try:
            cache.register_buffers(num_blocks, bufs)
        except BaseException:
            cache.close()
            raise
        self.cache = cache
        with _CACHES_MU:
            _CACHES[self.engine_key] = self

    def start_load_kv(self, forward_context, **kwargs):
        """Looks up and launches every load of this step's metadata."""
        meta = self._get_connector_metadata()
        if not meta.loads:
            return
        self._require()
        for spec in meta.loads:
            m = self.cache.lookup(keys=spec.keys, ns=self.namespace)
            matched = m.matched_tokens // self.block_size
            if matched < len(spec.keys):
                self._load_errors.update(spec.block_ids[max(matched, spec.first_block):
                                                        len(spec.keys)])
            if m.task == 0:
                continue
            try:
                self.cache.launch(m.task, spec.block_ids[:matched])
            except Exception:
                self._drop(m.task)
                self._load_errors.update(spec.block_ids[spec.first_block:matched])
                continue
            self._loads.append((spec, m.task, matched))

    def wait_for_layer_load(self, layer_name):
        """Returns once this layer of every load in flight has landed (or
        failed: its blocks are reported by get_block_ids_with_load_errors)."""
        if not self._loads:
            return
        layer = self._layers.get(layer_name)
        if layer is None:
            raise ValueError("kvtier: wait_for_layer_load(%r): not a registered layer"
                             % (layer_name,))
        for spec, task, matched in self._loads:
            try:
                self.cache.wait_layer(task, layer, self.timeout)
            except Exception as e:
                logger.warning("kvtier: load of %s, layer %s: %s", spec.req_id, layer_name, e)

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        """Nothing per layer: wait_for_save stores whole blocks once the
        forward pass has written every layer."""
        return None

    def wait_for_save(self):
        """Ends this step's loads (noting failed blocks), then stores every
        save of this step's metadata and waits for it."""
        self._finish_loads()
        meta = self._connector_metadata
        if meta is None or not meta.saves:
            return
        self._require()
        for spec in meta.saves:
            ok = True
            if spec.keys:
                plan = self.cache.prepare_store(keys=spec.keys, ns=self.namespace)
                if plan.task:
                    try:
                        self.cache.launch(plan.task, spec.block_ids[:len(spec.keys)])
                        ok = self.cache.wait(plan.task, self.timeout).ok
                    except Exception as e:
                        logger.warning("kvtier: save of %s: %s", spec.req_id, e)
                        self._drop(plan.task)
                        ok = False
            if not ok:
                logger.warning("kvtier: save of %s failed; its blocks stay uncached",
                               spec.req_id)
            with self._mu:
                self._saved.add(spec.req_id)

    def _finish_loads(self):
        loads, self._loads = self._loads, []
        for spec, task, matched in loads:
            landed = matched
            try:
                r = self.cache.wait(task, self.timeout)
                if not r.ok:
                    landed = r.num_tokens // self.block_size
            except Exception:
                self._drop(task)
                landed = 0
            if landed < matched:
                self._load_errors.update(spec.block_ids[max(landed, spec.first_block):matched])

    def get_finished(self, finished_req_ids):
        """Requests whose saves ended (their blocks may be freed now)."""
        with self._mu:
            done, self._saved = self._saved, set()
        return (done or None), None

    def get_block_ids_with_load_errors(self):
        """Blocks that did not load (missing, corrupt, failed): vLLM
        recomputes them. Reported once."""
        errs, self._load_errors = self._load_errors, set()
        return errs

    def shutdown(self):
        self._finish_loads()
        with _CACHES_MU:
            if _CACHES.get(self.engine_key) is self:
                del _CACHES[self.engine_key]
        if self.cache is not None:
            self.cache.close()
            self.cache = None
        return None

    def _require(self):
        if self.cache is None:
            raise RuntimeError("kvtier: register_kv_caches was not called (or the connector "
                               "is shut down)")

    def _drop(self, task):
        try:
            self.cache.cancel(task)
            self.cache.wait(task, self.timeout)
        except Exception:
            pass

    # ------------------------------------------------------------------
    # Scheduler role

    def _worker(self):
        with _CACHES_MU:
            return _CACHES.get(self.engine_key)

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        """(tokens beyond num_computed_tokens kvtier can load, False): loads
        are synchronous (layerwise, within the step). No pins are kept."""
        w = self._worker()
        hashes = list(getattr(request, "block_hashes", None) or [])
        if w is None or w.cache is None or not hashes:
            return 0, False
        with self._mu:
            self._asked[request.request_id] = int(num_computed_tokens)
        keys = [block_key(h) for h in hashes]
        m = w.cache.lookup(keys=keys, ns=w.namespace)
        matched = m.matched_tokens
        if m.task:
            w._drop(m.task)
        # the engine always computes the last prompt token
        limit = (int(request.num_tokens) - 1) // self.block_size * self.block_size
        matched = min(matched, limit)
        return max(0, matched - num_computed_tokens), False

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        if num_external_tokens <= 0:
            return
        block_ids = list(blocks.get_block_ids()[0])
        with self._mu:
            computed = self._asked.pop(request.request_id, 0)
        end = (computed + num_external_tokens) // self.block_size
        keys = [block_key(h) for h in list(request.block_hashes)[:end]]
        with self._mu:
            self._meta.loads.append(LoadSpec(request.request_id, keys, block_ids[:end],
                                             computed // self.block_size))

    def build_connector_meta(self, scheduler_output):
        with self._mu:
            meta, self._meta = self._meta, KvtierConnectorMetadata()
        return meta

    def request_finished(self, request, block_ids):
        """Schedules the store of the request's full, publishable blocks and
        holds them (True) until a worker reports the save in get_finished."""
        hashes = list(getattr(request, "block_hashes", None) or [])
        n = min(len(hashes), int(getattr(request, "num_publishable_block_hashes", len(hashes))),
                len(block_ids))
        if n == 0:
            return False, None
        spec = SaveSpec(request.request_id, [block_key(h) for h in hashes[:n]],
                        list(block_ids[:n]))
        with self._mu:
            self._meta.saves.append(spec)
        return True, None
