"""kvtier as a vLLM KV connector (KVConnectorBase_V1).

vLLM loads it with no patch to vLLM. Recommended: every vLLM process
attaches to the node's `kvtier serve` (socket mode):

    kvtier serve --socket /run/kvtier/node.sock --model <preset> --tp <TP> \\
        --page 16 --set block_tokens=16 --set cpu_capacity=64GiB
    vllm serve <model> --block-size 16 --tensor-parallel-size <TP> \\
      --kv-transfer-config '{"kv_connector": "KvtierConnector",
        "kv_connector_module_path": "kvtier.vllm_connector", "kv_role": "kv_both",
        "kv_connector_extra_config": {"socket": "/run/kvtier/node.sock"}}'

vLLM builds KvtierConnector(vllm_config, role, kv_cache_config) once in its
scheduler process (role SCHEDULER) and once in each worker process (role
WORKER); KvtierConnectorMetadata (plain dataclasses of bytes and ints) goes
from the scheduler to the workers through vLLM's own IPC, pickled.

Blocks are keyed requests: a request's vLLM block hashes (each already
commits to its whole prefix) are the keys of one keyed request from block
0, key i's parent key i-1, in a namespace of model, dtype, block size,
geometry, layout (NHD: FlashAttention's token-major blocks; HND: the
head-major blocks of vLLM's CPU backend, CPU_ATTN; both roles learn it from
vllm_config, see kv_layout) and TP rank (MHA: each rank holds its own
heads) or "mla" (MLA: one copy, written by TP rank 0, read by every rank),
PP rank. kvtier copies whole blocks, so a block's bytes are opaque to it;
the namespace keeps one layout's blocks from an engine of the other.

Scheduler role: get_num_new_matched_tokens asks where the blocks are (the
server in socket mode, over every TP rank's namespace, the least of them;
in-process the worker's cache of the same process) and pins nothing;
update_state_after_alloc queues the load, request_finished queues the store
and holds the blocks (True) until every worker reported the save in
get_finished; build_connector_meta hands both to the workers.

Worker role: register_kv_caches (host tensors in the expected layout;
CUDA tensors refused until kvtier's CUDA data path exists); start_load_kv
looks up and launches this step's loads (the request's computed prefix
blocks given as PAGE_SKIP: a kvtier load starts at block 0) and stores;
a synchronous load (load_async False) is waited for layer by layer in
wait_for_layer_load and ended in wait_for_save; an
asynchronous one (load_async True, the default in socket mode: vLLM then
schedules the request once get_finished reports it received) and every
store run behind the forward passes and are reported by get_finished. Blocks
that did not load (missing, evicted, corrupt, the server lost) are reported
once by get_block_ids_with_load_errors and vLLM recomputes them; a failed
load never hands over wrong bytes as good ones. Every wait has the
`timeout` deadline.
"""
import logging
import os
import threading
import time
from collections import namedtuple
from dataclasses import dataclass, field
from typing import List

import numpy as np

from .cache import PAGE_SKIP, Cache
from .config import LAYER_FIRST, Config, Geometry
from .errors import STATUS, KvtierError

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
    "socket": "path of a `kvtier serve` socket (node server mode, recommended)",
    "load_async": "load behind the forward passes, reported by get_finished (default: true "
                  "in socket mode, false in-process)",
    "cpu_capacity": "CPU tier per worker, in-process mode (default 1GiB)",
    "workers": "kvtier transfer threads, in-process mode",
    "eviction": "lru or lfu, in-process mode",
    "namespace": "extra salt for every block's namespace",
    "timeout": "seconds a transfer or a server round trip may take (default 30)",
    "tp_rank": "this worker's TP rank when vLLM's parallel state is not importable",
    "kv_layout": "NHD (token-major blocks) or HND (head-major) in every vLLM process "
                 "(default: learned from vllm_config, see kv_layout())",
    "kvtier_options": "a dict of further kvtier options, in-process mode",
}
# Options of the tiers: the server's own in socket mode.
SERVER_KEYS = {"cpu_capacity", "workers", "eviction", "kvtier_options"}
# Load results whose num_tokens says how many leading tokens did land (a
# bad SSD read shortens a load); any other failure lands nothing we trust.
_PARTIAL_OK = {STATUS["OK"], STATUS["ECORRUPT"], STATUS["EIO"]}

# In-process: the worker's cache, found by the scheduler of the same process.
_CACHES = {}
_CACHES_MU = threading.Lock()

# A worker's KV geometry as the namespace names it: dtype is the element
# type's name ("float16", "bfloat16"), dim the head size in elements, layout
# the order of a block's bytes ("NHD": tokens before heads, "HND": heads
# before tokens; MLA and one head: "NHD", the bytes are the same).
KVShape = namedtuple("KVShape", "layers heads dim elem dtype mla layout")

LAYOUTS = ("NHD", "HND")
# vLLM's CPU attention backend (vllm/v1/attention/backends/cpu_attn.py)
# allocates (2, num_blocks, num_kv_heads, block_size, head_size) whatever the
# KV cache layout setting; FlashAttention (2, num_blocks, block_size,
# num_kv_heads, head_size), head-major in memory under VLLM_KV_CACHE_LAYOUT=HND.
_CPU_BACKEND = "CPU_ATTN"


def _backend_name(vllm_config):
    """The attention backend vLLM was told to use, or None: the attention
    config's backend (recent vLLM, an enum) or VLLM_ATTENTION_BACKEND."""
    b = getattr(getattr(vllm_config, "attention_config", None), "backend", None)
    if b is None:
        b = os.environ.get("VLLM_ATTENTION_BACKEND") or None
    if b is None:
        return None
    return str(getattr(b, "name", b)).upper()


def kv_layout(vllm_config, extra):
    """(layout, why): the order of a KV block's bytes as every vLLM process
    can tell from its vllm_config, so the scheduler names the namespace the
    workers will use before any worker has registered a tensor:
    kv_connector_extra_config kv_layout; else HND with the CPU_ATTN backend
    (named, or the device is the CPU, whose only backend it is); else
    VLLM_KV_CACHE_LAYOUT; else NHD (vLLM's default)."""
    v = extra.get("kv_layout")
    if v is not None:
        if not isinstance(v, str) or v.upper() not in LAYOUTS:
            raise ValueError("kvtier: kv_connector_extra_config kv_layout must be \"NHD\" or "
                             "\"HND\", got %r" % (v,))
        return v.upper(), "kv_connector_extra_config kv_layout"
    backend = _backend_name(vllm_config)
    dc = getattr(vllm_config, "device_config", None)
    device = str(getattr(dc, "device_type", None) or getattr(dc, "device", None) or "")
    if backend == _CPU_BACKEND or (backend is None and device.startswith("cpu")):
        return "HND", ("attention backend CPU_ATTN" if backend else
                       "device cpu, whose attention backend is CPU_ATTN")
    env = (os.environ.get("VLLM_KV_CACHE_LAYOUT") or "").upper()
    if env in LAYOUTS:
        return env, "VLLM_KV_CACHE_LAYOUT"
    return "NHD", "vLLM's default KV cache layout"


@dataclass
class LoadSpec:
    """Load blocks [first_block, len(keys)) of a request: keys are its block
    hashes from block 0, block_ids its vLLM blocks from block 0; load_async
    as get_num_new_matched_tokens answered."""
    req_id: str
    keys: List[bytes]
    block_ids: List[int]
    first_block: int = 0
    load_async: bool = False


@dataclass
class SaveSpec:
    """Store the request's full blocks (keys and block ids from block 0)."""
    req_id: str
    keys: List[bytes]
    block_ids: List[int]


@dataclass
class KvtierConnectorMetadata(KVConnectorMetadata):
    """What each worker loads and stores this step; plain picklable data."""
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


def dtype_info(d):
    """(name, element size) of a numpy or torch dtype."""
    if type(d).__module__.startswith("torch"):
        size = getattr(d, "itemsize", None)
        if size is None:  # torch before 2.1
            import torch  # type: ignore
            size = torch.empty((), dtype=d).element_size()
        return str(d).replace("torch.", ""), int(size)
    d = np.dtype(d)
    return d.name, d.itemsize


def _host_kv(t, what):
    """(uint8 view with the last dim in bytes, shape in elements, element
    size, dtype name) of a host tensor (numpy array or CPU torch tensor)."""
    if isinstance(t, np.ndarray):
        if not t.flags.c_contiguous:
            raise ValueError("kvtier: %s is not contiguous" % what)
        name, e = dtype_info(t.dtype)
        return t.view(np.uint8).reshape(t.shape[:-1] + (t.shape[-1] * e,)), t.shape, e, name
    if type(t).__module__.startswith("torch"):
        if t.device.type != "cpu":
            raise ValueError("kvtier: %s is a %s tensor; kvtier's connector moves host memory "
                             "only until its CUDA data path exists (use CPU KV caches, or "
                             "vLLM's CPU backend)" % (what, t.device.type))
        if not t.is_contiguous():
            raise ValueError("kvtier: %s is not contiguous" % what)
        import ctypes
        name, e = str(t.dtype).replace("torch.", ""), int(t.element_size())
        shape = tuple(t.shape)
        raw = (ctypes.c_uint8 * (t.numel() * e)).from_address(t.data_ptr())
        return np.ctypeslib.as_array(raw).reshape(shape[:-1] + (shape[-1] * e,)), shape, e, name
    raise ValueError("kvtier: %s: expected a numpy array or torch tensor, got %s"
                     % (what, type(t).__name__))


def _norm_layout(layout, heads, mla):
    """One head (or MLA's latent): token-major and head-major are the same
    bytes, so such blocks are named NHD whatever the engine said."""
    return "NHD" if mla or heads == 1 else layout


def _spec_shape(vllm_config, kv_cache_config, layout):
    """The workers' KVShape as the scheduler knows it: from kv_cache_config's
    one KV cache group (vLLM passes it to every role), else from the model
    config. None when neither says."""
    groups = getattr(kv_cache_config, "kv_cache_groups", None)
    if groups:
        g = groups[0]
        spec = g.kv_cache_spec
        name, e = dtype_info(spec.dtype)
        mla = bool(getattr(spec, "use_mla", False)) or type(spec).__name__.startswith("MLA")
        heads = int(spec.num_kv_heads)
        return KVShape(len(g.layer_names), heads, int(spec.head_size), e, name, mla,
                       _norm_layout(layout, heads, mla))
    mc, pc = vllm_config.model_config, vllm_config.parallel_config
    try:
        mla = bool(getattr(mc, "use_mla", False))
        name, e = dtype_info(mc.dtype)
        heads = 1 if mla else int(mc.get_num_kv_heads(pc))
        return KVShape(int(mc.get_num_layers(pc)), heads, int(mc.get_head_size()), e, name, mla,
                       _norm_layout(layout, heads, mla))
    except (AttributeError, TypeError):
        return None


class KvtierConnector(KVConnectorBase_V1):
    """vLLM KV connector over a kvtier cache (module docstring)."""

    def __init__(self, vllm_config, role, kv_cache_config):
        super().__init__(vllm_config, role, kv_cache_config)
        ktc = vllm_config.kv_transfer_config
        self.extra = dict(getattr(ktc, "kv_connector_extra_config", None) or {})
        self._check_extra()
        groups = getattr(kv_cache_config, "kv_cache_groups", None)
        if groups is not None and len(groups) > 1:
            raise NotImplementedError("kvtier: %d KV cache groups (a hybrid model); the "
                                      "connector supports one" % len(groups))
        self.engine_key = str(getattr(ktc, "engine_id", None) or "default")
        self.block_size = int(vllm_config.cache_config.block_size)
        self.model = str(getattr(vllm_config.model_config, "model", ""))
        pc = vllm_config.parallel_config
        self.tp_size = int(getattr(pc, "tensor_parallel_size", 1))
        self.pp_size = int(getattr(pc, "pipeline_parallel_size", 1))
        self.tp_rank, self.pp_rank = self._ranks()
        if self.socket is not None and self.pp_size > 1:
            raise NotImplementedError("kvtier: pipeline parallel size %d in socket mode: one "
                                      "`kvtier serve` serves one geometry, and each PP stage "
                                      "holds other layers" % self.pp_size)
        self.load_async = bool(self.extra.get("load_async", self.socket is not None))
        self.layout, self.layout_why = kv_layout(vllm_config, self.extra)
        self._kv_cache_config = kv_cache_config
        self.cache = None         # the worker's Cache or Client (worker role)
        self.client = None        # the scheduler's Client (socket mode)
        self.namespace = None
        self.shape = None
        self._layers = {}
        self._mu = threading.Lock()
        # worker state: loads and stores in flight, what ended
        self._sync = []           # [spec, task, matched, failed]
        self._async = {}          # req_id -> (spec, task, matched, deadline)
        self._saves = {}          # req_id -> (task, deadline)
        self._recv_done = set()
        self._sent_done = set()
        self._load_errors = set()
        # scheduler state
        self._asked = {}          # req_id -> num_computed_tokens it was asked with
        self._meta = KvtierConnectorMetadata()
        self._server_down = False
        if self.socket is not None and role == KVConnectorRole.SCHEDULER:
            self._attach_scheduler(vllm_config, kv_cache_config)

    def _check_extra(self):
        unknown = sorted(set(self.extra) - set(EXTRA_KEYS))
        if unknown:
            raise ValueError("kvtier: unknown kv_connector_extra_config key(s) %s; kvtier's "
                             "keys: %s" % (", ".join(unknown), ", ".join(sorted(EXTRA_KEYS))))
        self.socket = self.extra.get("socket")
        if self.socket is not None:
            if not isinstance(self.socket, str) or not self.socket:
                raise ValueError("kvtier: kv_connector_extra_config socket must be the path of "
                                 "a `kvtier serve` socket, got %r" % (self.socket,))
            server_side = sorted(set(self.extra) & SERVER_KEYS)
            if server_side:
                raise ValueError("kvtier: kv_connector_extra_config %s configure the tiers, "
                                 "which the `kvtier serve` process owns in socket mode; set "
                                 "them there (kvtier serve --set NAME=VALUE)"
                                 % ", ".join(server_side))
        la = self.extra.get("load_async")
        if la is not None and not isinstance(la, bool):
            raise ValueError("kvtier: kv_connector_extra_config load_async must be true or "
                             "false (JSON), got %r" % (la,))
        self.timeout = float(self.extra.get("timeout", 30.0))
        if not self.timeout > 0:
            raise ValueError("kvtier: kv_connector_extra_config timeout must be > 0 seconds, "
                             "got %r" % (self.extra.get("timeout"),))

    def _ranks(self):
        tp = self.extra.get("tp_rank")
        if tp is None:
            try:
                from vllm.distributed.parallel_state import (  # type: ignore
                    get_pp_group, get_tensor_model_parallel_rank)
                return get_tensor_model_parallel_rank(), get_pp_group().rank_in_group
            except Exception:  # scheduler process, or vllm not importable
                tp = 0
        tp = int(tp)
        if not 0 <= tp < self.tp_size:
            raise ValueError("kvtier: tp_rank %d is outside tensor_parallel_size %d"
                             % (tp, self.tp_size))
        return tp, 0

    def _namespace(self, shape, tp_rank):
        """The namespace of one rank's blocks; the scheduler builds the same
        from kv_cache_config as the worker from its tensors."""
        return "|".join([
            "kvtier-vllm-v1", "model=%s" % self.model, "dtype=%s" % shape.dtype,
            "block=%d" % self.block_size, "layers=%d" % shape.layers, "heads=%d" % shape.heads,
            "dim=%d" % shape.dim, "layout=%s" % shape.layout,
            "mla" if shape.mla else "tp=%d/%d" % (tp_rank, self.tp_size),
            "pp=%d/%d" % (self.pp_rank, self.pp_size)] +
            (["salt=%s" % self.extra["namespace"]] if self.extra.get("namespace") else []))

    def _geometry(self, shape):
        return Geometry.uniform(shape.layers, self.block_size, shape.heads, shape.dim,
                                shape.elem, 1 if shape.mla else 2, LAYER_FIRST)

    def _attach(self, shape, who):
        """A kvtier.Client of the server at self.socket, its block size checked."""
        from .client import Client
        with self._geometry(shape) as geo:
            cl = Client(self.socket, geo, timeout_ms=max(1, int(self.timeout * 1000)))
        if cl.block_tokens != self.block_size:
            cl.close()
            raise ValueError("kvtier: %s: the server at %s stores blocks of %d tokens but "
                             "vLLM's block_size is %d (each vLLM block is one kvtier block): "
                             "start kvtier serve with --set block_tokens=%d"
                             % (who, self.socket, cl.block_tokens, self.block_size,
                                self.block_size))
        return cl

    def _attach_scheduler(self, vllm_config, kv_cache_config):
        shape = _spec_shape(vllm_config, kv_cache_config, self.layout)
        if shape is None:
            raise ValueError("kvtier: the scheduler role in socket mode needs the workers' KV "
                             "geometry: kv_cache_config with one KV cache group (vLLM passes "
                             "it to KVConnectorBase_V1) or a model_config that names it")
        self.shape = shape
        self.client = self._attach(shape, "scheduler")

    # ------------------------------------------------------------------
    # Worker role

    def register_kv_caches(self, kv_caches):
        """kv_caches: layer name -> host tensor, in layer order."""
        names = list(kv_caches)
        if not names:
            raise ValueError("kvtier: register_kv_caches got no layers")
        got = [_host_kv(kv_caches[n], "kv_caches[%r]" % n) for n in names]
        _, first, elem, dtype = got[0]
        for n, (_, shape, _, dt) in zip(names, got):
            if len(shape) not in (3, 5) or shape != first or dt != dtype:
                raise ValueError("kvtier: kv_caches[%r] has shape %s (%s); expected every layer "
                                 "(2, num_blocks, block_size, heads, head_size) or MLA "
                                 "(num_blocks, block_size, head_size), all alike (first: %s %s)"
                                 % (n, tuple(shape), dt, tuple(first), dtype))
            if len(shape) == 5 and shape[0] != 2:
                raise ValueError("kvtier: kv_caches[%r] has shape %s: the first dim must be 2 "
                                 "(K, V; FlashAttention's layout)" % (n, tuple(shape)))
        views = [v for v, _, _, _ in got]
        mla = len(first) == 3
        if mla:
            num_blocks, bs, dim = first
            heads, bufs = 1, [[v] for v in views]
            if bs != self.block_size:
                raise ValueError("kvtier: KV caches hold %d tokens per block, "
                                 "cache_config.block_size is %d" % (bs, self.block_size))
        else:
            num_blocks, heads, dim = self._mha_dims(first, names[0])
            bufs = [[v[0], v[1]] for v in views]
        self.is_mla = mla
        self._layers = {n: i for i, n in enumerate(names)}
        self.shape = KVShape(len(names), heads, dim, elem, dtype, mla,
                             _norm_layout(self.layout, heads, mla))
        self.namespace = self._namespace(self.shape, self.tp_rank)
        cache = self._attach(self.shape, "worker tp %d" % self.tp_rank) \
            if self.socket is not None else self._open_local()
        try:
            cache.register_buffers(num_blocks, bufs)
        except BaseException:
            cache.close()
            raise
        self.cache = cache
        if self.socket is None:
            with _CACHES_MU:
                _CACHES[self.engine_key] = self

    _LAYOUT_SHAPES = {"NHD": "token-major (2, num_blocks, block_size, num_kv_heads, head_size)",
                      "HND": "head-major (2, num_blocks, num_kv_heads, block_size, head_size)"}

    def _mha_dims(self, shape, name):
        """(num_blocks, heads, head_size) of a 5-D layer in self.layout, the
        layout the scheduler names blocks by. Tensors in the other layout are
        refused: the scheduler would look up blocks no worker writes, and a
        block of one layout must never be served to an engine of the other.
        kvtier copies whole blocks, so a block's bytes are otherwise opaque."""
        _, num_blocks, a, b, dim = shape
        hm = self.layout == "HND"
        tokens, heads = (b, a) if hm else (a, b)
        groups = getattr(self._kv_cache_config, "kv_cache_groups", None)
        want_heads = int(groups[0].kv_cache_spec.num_kv_heads) if groups else None
        if tokens == self.block_size and want_heads in (None, heads):
            return num_blocks, heads, dim
        other = "NHD" if hm else "HND"
        if heads == self.block_size and want_heads in (None, tokens):
            raise ValueError(
                "kvtier: kv_caches[%r] has shape %s: %s blocks, but the connector expects %s "
                "blocks, from %s, as the scheduler does; blocks of one layout are never "
                "served to the other. Set kv_connector_extra_config kv_layout to \"%s\" in "
                "every vLLM process" % (name, tuple(shape), self._LAYOUT_SHAPES[other],
                                       self._LAYOUT_SHAPES[self.layout], self.layout_why,
                                       other))
        raise ValueError("kvtier: kv_caches[%r] has shape %s, not %s with %d tokens per block "
                         "(cache_config.block_size is %d%s)"
                         % (name, tuple(shape), self._LAYOUT_SHAPES[self.layout],
                            self.block_size, self.block_size,
                            "" if want_heads is None else
                            ", kv_cache_spec.num_kv_heads %d" % want_heads))

    def _open_local(self):
        opts = {"block_tokens": self.block_size}
        for k in ("cpu_capacity", "workers", "eviction"):
            if k in self.extra:
                opts[k] = self.extra[k]
        opts.update(self.extra.get("kvtier_options") or {})
        with Config(opts) as cfg, self._geometry(self.shape) as geo:
            return Cache(cfg, geo)

    def start_load_kv(self, forward_context, **kwargs):
        """Looks up and launches every load and store of this step's
        metadata; none is waited for here."""
        meta = self._get_connector_metadata()
        if not meta.loads and not meta.saves:
            return
        self._require()
        for spec in meta.loads:
            self._start_load(spec)
        for spec in meta.saves:
            self._start_save(spec)

    def _error_blocks(self, spec, lo, hi):
        """Blocks [max(lo, first_block), hi) of spec did not load."""
        self._load_errors.update(spec.block_ids[max(lo, spec.first_block):hi])

    def _start_load(self, spec):
        n = len(spec.keys)
        try:
            m = self.cache.lookup(keys=spec.keys, ns=self.namespace)
        except KvtierError as e:
            logger.warning("kvtier: load of %s: %s; its %d blocks will be recomputed",
                           spec.req_id, e, n - spec.first_block)
            self._error_blocks(spec, 0, n)
            self._load_ended(spec)
            return
        matched = m.matched_tokens // self.block_size
        if matched < n:
            self._error_blocks(spec, matched, n)
        if m.task == 0 or matched <= spec.first_block:
            if m.task:
                self._drop(m.task)
            self._load_ended(spec)
            return
        # A kvtier load starts at block 0; the blocks before first_block are
        # the request's computed prefix, which running requests may share:
        # skipped, never rewritten.
        pages = [PAGE_SKIP] * spec.first_block + list(spec.block_ids[spec.first_block:matched])
        try:
            self.cache.launch(m.task, pages)
        except KvtierError as e:
            logger.warning("kvtier: load of %s: %s", spec.req_id, e)
            self._drop(m.task)
            self._error_blocks(spec, 0, matched)
            self._load_ended(spec)
            return
        if spec.load_async:
            self._forget(self._async.pop(spec.req_id, None), 1)
            self._async[spec.req_id] = (spec, m.task, matched,
                                        time.monotonic() + self.timeout)
        else:
            self._sync.append([spec, m.task, matched, False])

    def _load_ended(self, spec):
        if spec.load_async:
            self._recv_done.add(spec.req_id)

    def _end_load(self, spec, task, matched, result):
        """Notes the blocks of an ended load that did not land. result: its
        TaskResult, or None when it was lost (cancelled, server gone)."""
        landed = 0
        if result is not None and result.status in _PARTIAL_OK:
            landed = min(matched, result.num_tokens // self.block_size)
        if landed < matched:
            if result is not None:
                logger.warning("kvtier: load of %s: %d of %d blocks landed (%s); the rest "
                               "will be recomputed", spec.req_id, landed, matched,
                               result.error() or "short")
            self._error_blocks(spec, landed, matched)
        self._load_ended(spec)

    def _wait_task(self, task):
        """The task's TaskResult within the timeout, else None (cancelled)."""
        try:
            return self.cache.wait(task, self.timeout)
        except KvtierError as e:
            logger.warning("kvtier: task %d: %s; cancelling it", task, e)
            self._drop(task)
            return None

    def _poll_task(self, task, deadline):
        """(ended, result) without blocking; past the deadline the task is
        cancelled and counts as lost."""
        try:
            r = self.cache.try_wait(task)
        except KvtierError as e:
            logger.warning("kvtier: task %d: %s", task, e)
            self._drop(task)
            return True, None
        if r is not None:
            return True, r
        if time.monotonic() < deadline:
            return False, None
        logger.warning("kvtier: task %d overran %.1f s; cancelling it", task, self.timeout)
        self._drop(task)
        return True, None

    def wait_for_layer_load(self, layer_name):
        """Returns once this layer of every synchronous load in flight has
        landed; a load that fails here is reported whole by
        get_block_ids_with_load_errors (the layer the forward pass ran on
        was not whole). Asynchronous loads are not waited for: their
        requests are not in this forward pass."""
        if not self._sync:
            return
        layer = self._layers.get(layer_name)
        if layer is None:
            raise ValueError("kvtier: wait_for_layer_load(%r): not a registered layer"
                             % (layer_name,))
        for load in self._sync:
            if load[3]:
                continue
            try:
                self.cache.wait_layer(load[1], layer, self.timeout)
            except KvtierError as e:
                logger.warning("kvtier: load of %s, layer %s: %s", load[0].req_id, layer_name, e)
                load[3] = True

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        """Nothing per layer: stores are of finished requests' whole blocks,
        launched by start_load_kv."""
        return None

    def wait_for_save(self):
        """Ends this step's synchronous loads (noting blocks that failed).
        Stores are not waited for: get_finished reports them."""
        loads, self._sync = self._sync, []
        for spec, task, matched, failed in loads:
            r = self._wait_task(task)
            if failed:  # a layer the forward pass ran on was not whole
                self._error_blocks(spec, 0, matched)
            else:
                self._end_load(spec, task, matched, r)

    def _start_save(self, spec):
        """Launches the store of a finished request's blocks (MLA: TP rank 0
        writes the one copy; other ranks report the request saved)."""
        if (self.is_mla and self.tp_rank != 0) or not spec.keys:
            self._sent_done.add(spec.req_id)
            return
        try:
            plan = self.cache.prepare_store(keys=spec.keys, ns=self.namespace)
        except KvtierError as e:
            logger.warning("kvtier: save of %s: %s; its blocks stay uncached", spec.req_id, e)
            self._sent_done.add(spec.req_id)
            return
        if plan.task == 0:  # stored already, being stored by another, or no room
            self._sent_done.add(spec.req_id)
            return
        try:
            self.cache.launch(plan.task, spec.block_ids[:len(spec.keys)])
        except KvtierError as e:
            logger.warning("kvtier: save of %s: %s; its blocks stay uncached", spec.req_id, e)
            self._drop(plan.task)
            self._sent_done.add(spec.req_id)
            return
        self._forget(self._saves.pop(spec.req_id, None), 0)
        self._saves[spec.req_id] = (plan.task, time.monotonic() + self.timeout)

    def _forget(self, entry, at):
        """A request planned again before its earlier task ended (vLLM
        preempted and resumed it): the earlier task is cancelled, not leaked."""
        if entry is not None:
            self._drop(entry[at])

    def _poll(self):
        """Collects ended asynchronous loads and stores (never blocks)."""
        for req_id, (task, deadline) in list(self._saves.items()):
            ended, r = self._poll_task(task, deadline)
            if ended:
                del self._saves[req_id]
                if r is None or not r.ok:
                    logger.warning("kvtier: save of %s failed (%s); its blocks stay uncached",
                                   req_id, r.error() if r is not None else "lost")
                self._sent_done.add(req_id)
        for req_id, (spec, task, matched, deadline) in list(self._async.items()):
            ended, r = self._poll_task(task, deadline)
            if ended:
                del self._async[req_id]
                self._end_load(spec, task, matched, r)

    def get_finished(self, finished_req_ids):
        """(requests whose stores ended: their blocks may be freed,
        requests whose asynchronous loads ended: they may run), each None
        when empty. A request is reported once, failed or not."""
        if self.cache is not None:
            self._poll()
        sent, self._sent_done = self._sent_done, set()
        recv, self._recv_done = self._recv_done, set()
        return (sent or None), (recv or None)

    def get_block_ids_with_load_errors(self):
        """Blocks that did not load (missing, corrupt, failed, server lost):
        vLLM recomputes them. Reported once."""
        errs, self._load_errors = self._load_errors, set()
        return errs

    def shutdown(self):
        if self.cache is not None:
            self.wait_for_save()
            for task, _ in self._saves.values():
                self._drop(task)
            for _, task, _, _ in self._async.values():
                self._drop(task)
            self._saves, self._async = {}, {}
        with _CACHES_MU:
            if _CACHES.get(self.engine_key) is self:
                del _CACHES[self.engine_key]
        for attr in ("cache", "client"):
            c = getattr(self, attr)
            if c is not None:
                c.close()
                setattr(self, attr, None)
        return None

    def _require(self):
        if self.cache is None:
            raise RuntimeError("kvtier: register_kv_caches was not called (or the connector "
                               "is shut down)")

    def _drop(self, task, store=None):
        """Cancels a task and collects its result (no pin left)."""
        store = store or self.cache
        try:
            store.cancel(task)
            store.wait(task, self.timeout)
        except KvtierError:
            pass

    # ------------------------------------------------------------------
    # Scheduler role

    def _lookup_targets(self):
        """[(store, namespace)] whose least match is what every worker can
        load: the server over each TP rank's namespace (MLA: the one copy),
        or the worker's cache of this process."""
        if self.client is not None:
            if self.shape.mla:
                return [(self.client, self._namespace(self.shape, 0))]
            return [(self.client, self._namespace(self.shape, r)) for r in range(self.tp_size)]
        with _CACHES_MU:
            w = _CACHES.get(self.engine_key)
        if w is None or w.cache is None:
            return []
        return [(w.cache, w.namespace)]

    def _matched_blocks(self, keys):
        targets = self._lookup_targets()
        if not targets:
            return 0
        best = len(keys)
        try:
            for store, ns in targets:
                m = store.lookup(keys=keys[:best], ns=ns)
                if m.task:
                    self._drop(m.task, store)
                best = min(best, m.matched_tokens // self.block_size)
                if best == 0:
                    break
        except KvtierError as e:
            if not self._server_down:
                logger.warning("kvtier: lookup failed (%s); the engine computes until it "
                               "answers again", e)
            self._server_down = True
            return 0
        self._server_down = False
        return best

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        """(tokens beyond num_computed_tokens kvtier can load, load_async).
        Pins nothing: a block evicted before the worker loads it is reported
        by get_block_ids_with_load_errors and recomputed."""
        hashes = list(getattr(request, "block_hashes", None) or [])
        if not hashes:
            return 0, False
        matched = self._matched_blocks([block_key(h) for h in hashes]) * self.block_size
        # the engine always computes the last prompt token
        limit = (int(request.num_tokens) - 1) // self.block_size * self.block_size
        n = max(0, min(matched, limit) - int(num_computed_tokens))
        if n == 0:
            return 0, False
        with self._mu:
            self._asked[request.request_id] = int(num_computed_tokens)
        return n, self.load_async

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        with self._mu:
            computed = self._asked.pop(request.request_id, None)
        if num_external_tokens <= 0 or computed is None:
            return
        block_ids = list(blocks.get_block_ids()[0])
        end = (computed + num_external_tokens) // self.block_size
        keys = [block_key(h) for h in list(request.block_hashes)[:end]]
        with self._mu:
            self._meta.loads.append(LoadSpec(request.request_id, keys, block_ids[:end],
                                             computed // self.block_size, self.load_async))

    def build_connector_meta(self, scheduler_output):
        with self._mu:
            meta, self._meta = self._meta, KvtierConnectorMetadata()
        return meta

    def request_finished(self, request, block_ids):
        """Schedules the store of the request's full, publishable blocks and
        holds them (True) until every worker reports the save in
        get_finished."""
        with self._mu:
            self._asked.pop(request.request_id, None)
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
