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
and PP rank (each stage holds its own layers; stages share one server when
their geometries are alike, else "{pp_rank}" in the socket path gives each
stage its own). kvtier copies whole blocks, so a block's bytes are opaque
to it; the namespace keeps one layout's blocks from an engine of the other.

Scheduler role: get_num_new_matched_tokens asks where the blocks are (the
servers in socket mode, over every PP stage's and TP rank's namespace, the
least of them, as LMCache's lookup client does; in-process the worker's
cache of the same process), pins nothing, and remembers the answer while
the request waits with the same computed prefix (not asked again each
step). Requests vLLM added together (on_new_request) are looked up
together: the step's first ask peeks for it and up to lookup_batch - 1
others in one round trip per server (all TP ranks' namespaces in it);
update_state_after_alloc queues the load, request_finished queues the store
and holds the blocks (True) until every worker reported the save in
get_finished; build_connector_meta hands both to the workers.

Worker role: register_kv_caches (host tensors, or CUDA tensors of one
device, registered as KVT_MEMORY_CUDA: kvtier's CUDA backend copies; their
shape and strides say the backend's layout, kvtier._vllm_kv); start_load_kv
looks up and launches this step's loads (the request's computed prefix
blocks given as PAGE_SKIP: a kvtier load starts at block 0) and stores;
a synchronous load (load_async False) is waited for layer by layer in
wait_for_layer_load (CUDA in-process: the engine's current stream waits
on the layer's event, kvt_cache_stream_wait_layer; through the server, or
host memory: the CPU waits until the layer landed) and ended in
wait_for_save; an
asynchronous one (load_async True, the default in socket mode: vLLM then
schedules the request once get_finished reports it received) and every
store run behind the forward passes and are reported by get_finished. Blocks
that did not load (missing, evicted, corrupt, the server lost) are reported
once by get_block_ids_with_load_errors and vLLM recomputes them; a failed
load never hands over wrong bytes as good ones. Every wait has the
`timeout` deadline.
"""
import collections
import logging
import os
import threading
import time
from collections import namedtuple
from dataclasses import dataclass, field
from typing import List

from ._vllm_kv import HostKV, dtype_info, parse_layer
from .cache import PAGE_SKIP, Cache
from .client import WORKERS_HINT, DeferredClient
from .config import LAYER_FIRST, Config, Geometry
from .errors import STATUS, ConnectionFailure, KvtierError

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
    "socket": "path of a `kvtier serve` socket (node server mode, recommended); \"{pp_rank}\" "
              "in it is replaced by the PP stage's rank (one server per stage)",
    "load_async": "load behind the forward passes, reported by get_finished (default: true "
                  "in socket mode, false in-process)",
    "cpu_capacity": "CPU tier per worker, in-process mode (default 1GiB)",
    "workers": "kvtier transfer threads, in-process mode",
    "eviction": "lru or lfu, in-process mode",
    "namespace": "extra salt for every block's namespace",
    "timeout": "seconds a transfer or a server round trip may take (default 30)",
    "lookup_batch": "socket mode: requests whose lookups share one round trip per server "
                    "(the one asked and those added since, oldest first; default 64, 1: "
                    "one request per round trip)",
    "tp_rank": "this worker's TP rank when vLLM's parallel state is not importable",
    "pp_rank": "this worker's PP rank when vLLM's parallel state is not importable",
    "pp_layers": "KV layers of each PP stage, a list (default: vLLM's partition of the "
                 "model's hidden layers, VLLM_PP_LAYER_PARTITION included)",
    "kv_layout": "NHD (token-major blocks) or HND (head-major) in every vLLM process "
                 "(default: learned from vllm_config, see kv_layout())",
    "kvtier_options": "a dict of further kvtier options, in-process mode",
}
# Requests whose lookups share a round trip: vLLM adds a burst of requests
# (on_new_request) and then asks for them one by one in the same step; the
# first ask peeks for the oldest lookup_batch of them at once. Bounded so a
# flood of queued requests is not looked up long before its turn (the
# answer would be stale by then) and one PEEK_MANY stays well inside the
# server's 4096 requests and 16 MiB payload (LOOKUP_BYTES_MAX of keys, each
# sent as a 4-byte length and its bytes padded to 4).
LOOKUP_BATCH = 64
LOOKUP_BATCH_MAX = 1024
LOOKUP_BYTES_MAX = 8 << 20
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


def _norm_layout(layout, heads, mla):
    """One head (or MLA's latent): token-major and head-major are the same
    bytes, so such blocks are named NHD whatever the engine said."""
    return "NHD" if mla or heads == 1 else layout


def pp_partition(num_layers, pp_size):
    """Layers of each PP stage as vLLM splits them
    (vllm/distributed/utils.py, get_pp_indices): VLLM_PP_LAYER_PARTITION
    ("8,8,7,7") when set, else even, the remainder one each to the stages
    before the last."""
    env = os.environ.get("VLLM_PP_LAYER_PARTITION")
    if env:
        try:
            parts = [int(x) for x in env.split(",")]
        except ValueError:
            raise ValueError("kvtier: VLLM_PP_LAYER_PARTITION %r is not a list of layer "
                             "counts" % env) from None
        if len(parts) != pp_size or sum(parts) != num_layers:
            raise ValueError("kvtier: VLLM_PP_LAYER_PARTITION %r: %d stages of %d layers in "
                             "all, not %d of %d" % (env, len(parts), sum(parts), pp_size,
                                                    num_layers))
        return parts
    parts = [num_layers // pp_size] * pp_size
    for i in range(2, num_layers % pp_size + 2):
        parts[-i] += 1
    return parts


def _total_layers(model_config):
    """The model's hidden layers, all stages, or None."""
    f = getattr(model_config, "get_total_num_hidden_layers", None)
    if callable(f):
        return int(f())
    n = getattr(getattr(model_config, "hf_text_config", None), "num_hidden_layers", None)
    return None if n is None else int(n)


def kv_head_replicas(model_config, tp_size):
    """How many consecutive TP ranks hold the same KV heads: tp_size / the
    model's KV heads when TP exceeds them (vLLM then gives every rank one
    head, tp_size / heads ranks each the same one), else 1. 1 when the
    model config does not say (an MLA model has one latent component: its
    replication is handled apart)."""
    f = getattr(model_config, "get_total_num_kv_heads", None)
    try:
        total = int(f()) if callable(f) else 0
    except (AttributeError, TypeError, ValueError):
        total = 0
    if total <= 0 or tp_size <= total or tp_size % total:
        return 1
    return tp_size // total


def stage_layers(vllm_config, extra, pp_size):
    """[KV layers of each PP stage], or None when nothing says: extra
    pp_layers, else vLLM's partition of the model's hidden layers (every
    hidden layer one attention layer: hybrid models are refused anyway)."""
    given = extra.get("pp_layers")
    if given is not None:
        if (not isinstance(given, (list, tuple)) or len(given) != pp_size or
                not all(isinstance(n, int) and n > 0 for n in given)):
            raise ValueError("kvtier: kv_connector_extra_config pp_layers must list %d "
                             "positive layer counts (one per PP stage), got %r"
                             % (pp_size, given))
        return list(given)
    if pp_size == 1:
        return None
    total = _total_layers(vllm_config.model_config)
    return None if total is None else pp_partition(total, pp_size)


def _spec_shape(vllm_config, kv_cache_config, layout, layers=None):
    """The workers' KVShape as the scheduler knows it: from kv_cache_config's
    one KV cache group (vLLM passes it to every role), else from the model
    config; `layers` (a PP stage's) overrides the layer count. None when
    neither says."""
    shape = _spec_shape_all(vllm_config, kv_cache_config, layout)
    return shape if shape is None or layers is None else shape._replace(layers=layers)


def _spec_shape_all(vllm_config, kv_cache_config, layout):
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
        # GQA with TP > KV heads: a head group of kv_replicas ranks holds the
        # same bytes; its first rank writes the one copy every rank loads.
        self.kv_replicas = kv_head_replicas(vllm_config.model_config, self.tp_size)
        self.stage_layers = stage_layers(vllm_config, self.extra, self.pp_size)
        self.load_async = bool(self.extra.get("load_async", self.socket is not None))
        self.layout, self.layout_why = kv_layout(vllm_config, self.extra)
        self._kv_cache_config = kv_cache_config
        self.cache = None         # the worker's Cache or Client (worker role)
        self.client = None        # the scheduler's Client of PP stage 0 (socket mode)
        self._stages = []         # scheduler: (KVShape, Client) per PP stage
        self.namespace = None
        self.shape = None
        self._layers = {}
        self.device = None        # worker: the KV tensors' CUDA device, None: host
        self._torch_kv = False    # worker: real torch CUDA tensors (their streams exist)
        # worker: layer waits go to the engine's CUDA stream: CUDA tensors
        # in-process (kvt_cache_stream_wait_layer). A node server's client
        # offers no layer events: its wait_layer returns once the layer's
        # copies are synchronized on kvtier's stream.
        self._stream_waits = False
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
        # req_id -> ((num_computed_tokens, number of hashes), matched blocks):
        # a waiting request is asked again every step; the server only once
        # until its computed prefix changes (LMCache's lookup client keeps
        # its answer per request the same way)
        self._looked = {}
        # socket mode: requests added (on_new_request) and not yet looked up,
        # oldest first: the next lookup takes them along
        self._new = collections.OrderedDict()
        self.peeks_sent = 0       # namespaces peeked (nothing pinned)
        self.lookup_round_trips = 0  # round trips those took: one per server per batch
        self._meta = KvtierConnectorMetadata()
        self._server_down = False
        if self.socket is not None and role == KVConnectorRole.SCHEDULER:
            self._attach_scheduler(vllm_config, kv_cache_config)

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config):
        """The KV cache layout vLLM must allocate for this connector, or
        None when any works (vLLM's signature: a classmethod taking
        vllm_config, returning "NHD", "HND" or None; VLLM_KV_CACHE_LAYOUT
        still overrides it). kvtier moves whole blocks of either layout and
        reads which one from the tensors' strides, so it needs one only
        when kv_connector_extra_config kv_layout names it: then vLLM
        allocates what the scheduler names blocks by. MLA: None (one
        latent per token, no head order)."""
        ktc = getattr(vllm_config, "kv_transfer_config", None)
        extra = dict(getattr(ktc, "kv_connector_extra_config", None) or {})
        if extra.get("kv_layout") is None:
            return None
        if bool(getattr(getattr(vllm_config, "model_config", None), "use_mla", False)):
            return None
        return kv_layout(vllm_config, extra)[0]

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config):
        """True when workers wait for loads layer by layer in the forward
        pass (load_async false: the default in-process), which a captured
        full CUDA graph would skip: vLLM then captures piecewise, running
        attention (and wait_for_layer_load before it) eagerly. Asynchronous
        loads (the default in socket mode) wait for nothing in the forward
        pass."""
        extra = dict(extra_config or {})
        return not bool(extra.get("load_async", extra.get("socket") is not None))

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
                                 % ", ".join(server_side)
                                 + (WORKERS_HINT if "workers" in server_side else ""))
        la = self.extra.get("load_async")
        if la is not None and not isinstance(la, bool):
            raise ValueError("kvtier: kv_connector_extra_config load_async must be true or "
                             "false (JSON), got %r" % (la,))
        self.timeout = float(self.extra.get("timeout", 30.0))
        if not self.timeout > 0:
            raise ValueError("kvtier: kv_connector_extra_config timeout must be > 0 seconds, "
                             "got %r" % (self.extra.get("timeout"),))
        lb = self.extra.get("lookup_batch", LOOKUP_BATCH)
        if isinstance(lb, bool) or not isinstance(lb, int) or not 1 <= lb <= LOOKUP_BATCH_MAX:
            raise ValueError("kvtier: kv_connector_extra_config lookup_batch must be an integer "
                             "1..%d (requests per lookup round trip), got %r"
                             % (LOOKUP_BATCH_MAX, lb))
        self.lookup_batch = lb

    def _ranks(self):
        """(tp rank, pp rank): vLLM's parallel state in a worker process,
        else kv_connector_extra_config tp_rank/pp_rank (default 0)."""
        tp, pp = self.extra.get("tp_rank"), self.extra.get("pp_rank")
        if tp is None and pp is None:
            try:
                from vllm.distributed.parallel_state import (  # type: ignore
                    get_pp_group, get_tensor_model_parallel_rank)
                return get_tensor_model_parallel_rank(), get_pp_group().rank_in_group
            except Exception:  # scheduler process, or vllm not importable
                pass
        tp, pp = int(tp or 0), int(pp or 0)
        if not 0 <= tp < self.tp_size:
            raise ValueError("kvtier: tp_rank %d is outside tensor_parallel_size %d"
                             % (tp, self.tp_size))
        if not 0 <= pp < self.pp_size:
            raise ValueError("kvtier: pp_rank %d is outside pipeline_parallel_size %d"
                             % (pp, self.pp_size))
        return tp, pp

    def _socket_for(self, pp_rank):
        """The server socket of a PP stage: one path for all, or one per
        stage when the path holds "{pp_rank}"."""
        return self.socket.replace("{pp_rank}", str(pp_rank))

    def _namespace(self, shape, tp_rank, pp_rank):
        """The namespace of one rank's blocks; the scheduler builds the same
        from kv_cache_config as the worker from its tensors. PP stages hold
        other layers: each its own namespace, so stages sharing a server
        never read each other's blocks. TP ranks holding the same KV heads
        (TP > the model's KV heads) share one: "tp=g/G" names the head group."""
        return "|".join([
            "kvtier-vllm-v1", "model=%s" % self.model, "dtype=%s" % shape.dtype,
            "block=%d" % self.block_size, "layers=%d" % shape.layers, "heads=%d" % shape.heads,
            "dim=%d" % shape.dim, "layout=%s" % shape.layout,
            "mla" if shape.mla else "tp=%d/%d" % (tp_rank // self.kv_replicas,
                                                   self.tp_size // self.kv_replicas),
            "pp=%d/%d" % (pp_rank, self.pp_size)] +
            (["salt=%s" % self.extra["namespace"]] if self.extra.get("namespace") else []))

    def _geometry(self, shape):
        return Geometry.uniform(shape.layers, self.block_size, shape.heads, shape.dim,
                                shape.elem, 1 if shape.mla else 2, LAYER_FIRST)

    def _attach(self, shape, who, pp_rank):
        """A kvtier.Client of PP stage pp_rank's server, its block size
        checked; a server that is not there yet gives a client that
        attaches when it answers (client.DeferredClient), never an exception."""
        from .client import Client
        path = self._socket_for(pp_rank)

        def attach():
            with self._geometry(shape) as geo:
                cl = Client(path, geo, timeout_ms=max(1, int(self.timeout * 1000)))
            if cl.block_tokens != self.block_size:
                cl.close()
                raise ValueError("kvtier: %s: the server at %s stores blocks of %d tokens but "
                                 "vLLM's block_size is %d (each vLLM block is one kvtier "
                                 "block): start kvtier serve with --set block_tokens=%d"
                                 % (who, path, cl.block_tokens, self.block_size,
                                    self.block_size))
            return cl
        return DeferredClient(attach, who, path, logger)

    def _attach_scheduler(self, vllm_config, kv_cache_config):
        """One client per PP stage (stages with one server and one geometry
        share it): a block counts as a hit only when every stage has it."""
        if self.pp_size > 1 and self.stage_layers is None:
            raise ValueError("kvtier: pipeline parallel size %d: the scheduler needs each "
                             "stage's layer count: kv_connector_extra_config pp_layers, or a "
                             "model_config naming the model's hidden layers" % self.pp_size)
        clients = {}
        try:
            for s in range(self.pp_size):
                layers = self.stage_layers[s] if self.pp_size > 1 else None
                shape = _spec_shape(vllm_config, kv_cache_config, self.layout, layers)
                if shape is None:
                    raise ValueError("kvtier: the scheduler role in socket mode needs the "
                                     "workers' KV geometry: kv_cache_config with one KV cache "
                                     "group (vLLM passes it to KVConnectorBase_V1) or a "
                                     "model_config that names it")
                key = (self._socket_for(s), shape)
                if key not in clients:
                    clients[key] = self._attach(shape, "scheduler, PP stage %d" % s, s)
                self._stages.append((shape, clients[key]))
        except BaseException:
            for c in clients.values():
                c.close()
            self._stages = []
            raise
        self.shape, self.client = self._stages[0]

    # ------------------------------------------------------------------
    # Worker role

    def register_kv_caches(self, kv_caches):
        """kv_caches: layer name -> host tensor, in layer order (a PP
        stage: its own layers). Each tensor's shape and strides say which
        backend's layout it is (kvtier._vllm_kv); one the scheduler does not
        expect, or kvtier cannot move without strided buffers, is refused
        with the reason, before anything is attached."""
        names = list(kv_caches)
        if not names:
            raise ValueError("kvtier: register_kv_caches got no layers")
        spec = self._spec()
        layers = [HostKV(kv_caches[n], "kv_caches[%r]" % n) for n in names]
        parsed = [parse_layer(kv, self.block_size, self.layout, *spec) for kv in layers]
        first, p0 = layers[0], parsed[0]
        for n, kv in zip(names, layers):
            if kv.device != first.device:
                def where(d):
                    return "host memory" if d is None else "on CUDA device %d" % d
                raise ValueError("kvtier: kv_caches[%r] is %s but kv_caches[%r] is %s; every "
                                 "layer must be host memory or on one CUDA device"
                                 % (names[0], where(first.device), n, where(kv.device)))
        for n, kv, p in zip(names, layers, parsed):
            if (kv.shape, kv.order, kv.dtype) != (first.shape, first.order, first.dtype):
                raise ValueError("kvtier: kv_caches[%r] is %s %s in memory order %s; the first "
                                 "layer %s %s in order %s: every layer must be alike"
                                 % (n, kv.shape, kv.dtype, kv.order, first.shape, first.dtype,
                                    first.order))
        self._check_layout(names[0], first, p0)
        if self.stage_layers is not None and len(names) != self.stage_layers[self.pp_rank]:
            raise ValueError("kvtier: PP stage %d registered %d layers, but the scheduler "
                             "expects %d (pp_layers %s): it would look up blocks no worker "
                             "stores; set kv_connector_extra_config pp_layers to the stages' "
                             "layer counts" % (self.pp_rank, len(names),
                                               self.stage_layers[self.pp_rank],
                                               self.stage_layers))
        self.is_mla = p0.mla
        self._layers = {n: i for i, n in enumerate(names)}
        self.shape = KVShape(len(names), p0.heads, p0.dim, first.elem, first.dtype, p0.mla,
                             _norm_layout(p0.layout, p0.heads, p0.mla))
        self.namespace = self._namespace(self.shape, self.tp_rank, self.pp_rank)
        cache = self._attach(self.shape, "worker tp %d pp %d" % (self.tp_rank, self.pp_rank),
                             self.pp_rank) if self.socket is not None else self._open_local()
        try:
            cache.register_buffers(p0.num_blocks, [[kv.component(c) for c in p.comps]
                                                   for kv, p in zip(layers, parsed)])
        except BaseException:
            cache.close()
            raise
        self.device = first.device
        self._stream_waits = first.device is not None and self.socket is None
        self._torch_kv = first.device is not None and type(first.owner).__module__.startswith(
            "torch")
        self.cache = cache
        if self.socket is None:
            with _CACHES_MU:
                _CACHES[self.engine_key] = self

    def _spec(self):
        """(heads, mla, num_blocks, backend) as kv_cache_config and
        vllm_config say, each None when unknown."""
        groups = getattr(self._kv_cache_config, "kv_cache_groups", None)
        heads = mla = None
        if groups:
            sp = groups[0].kv_cache_spec
            mla = bool(getattr(sp, "use_mla", False)) or type(sp).__name__.startswith("MLA")
            heads = None if mla else int(sp.num_kv_heads)
        nb = getattr(self._kv_cache_config, "num_blocks", None)
        return heads, mla, (None if nb is None else int(nb)), _backend_name(self._vllm_config)

    _LAYOUT_SHAPES = {"NHD": "token-major (2, num_blocks, block_size, num_kv_heads, head_size)",
                      "HND": "head-major (2, num_blocks, num_kv_heads, block_size, head_size)"}

    def _check_layout(self, name, kv, p):
        """Blocks of one layout are never served to an engine of the other:
        tensors whose bytes are not in the layout the scheduler names
        blocks by (self.layout) are refused."""
        if p.mla or p.heads == 1 or p.layout == self.layout:
            return
        raise ValueError(
            "kvtier: kv_caches[%r] has shape %s (memory order %s): %s blocks in memory, but "
            "the connector expects %s blocks, from %s, as the scheduler does; blocks of one "
            "layout are never served to the other. Set kv_connector_extra_config kv_layout "
            "to \"%s\" in every vLLM process" % (
                name, kv.shape, kv.order, self._LAYOUT_SHAPES[p.layout],
                self._LAYOUT_SHAPES[self.layout], self.layout_why, p.layout))

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
        if meta.saves:
            self._engine_sync()
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
        landed (CUDA KV in-process: once the engine's current stream waits
        on the layer's event, the copies enqueued; every wait bounded by
        the timeout); a load that fails here is reported whole by
        get_block_ids_with_load_errors (the layer the forward pass ran on
        was not whole). Asynchronous loads are not waited for: their
        requests are not in this forward pass."""
        if not self._sync:
            return
        layer = self._layers.get(layer_name)
        if layer is None:
            raise ValueError("kvtier: wait_for_layer_load(%r): not a registered layer"
                             % (layer_name,))
        stream = self._engine_stream() if self._stream_waits else None
        for load in self._sync:
            if load[3]:
                continue
            try:
                if stream is None:
                    self.cache.wait_layer(load[1], layer, self.timeout)
                else:  # the layer's copies enqueued (bounded); the stream waits on them
                    self.cache.stream_wait_layer(load[1], layer, stream, self.timeout)
            except KvtierError as e:
                logger.warning("kvtier: load of %s, layer %s: %s", load[0].req_id, layer_name, e)
                load[3] = True

    def _engine_stream(self):
        """The stream vLLM runs this layer's attention on: torch's current
        stream of the KV device (real torch tensors), else 0 (the legacy
        default stream: duck-typed stand-ins under a fake runtime)."""
        if not self._torch_kv:
            return 0
        import torch  # type: ignore
        return torch.cuda.current_stream(self.device).cuda_stream

    def _engine_sync(self):
        """Before a store of CUDA KV: kvtier copies on its own streams, so
        whatever the engine's current stream still has queued (the last
        forward pass's KV writes) finishes first."""
        if self._torch_kv:
            import torch  # type: ignore
            torch.cuda.current_stream(self.device).synchronize()

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
        writes the one copy; KV heads on several ranks: the first rank of
        each head group; other ranks report the request saved)."""
        shared_copy = self.socket is not None and self.tp_rank % self.kv_replicas
        if (self.is_mla and self.tp_rank != 0) or shared_copy or not spec.keys:
            self._sent_done.add(spec.req_id)
            return
        try:
            # visible: the task ends once the server committed its blocks, so
            # the scheduler's next lookup (another process) finds them.
            plan = self.cache.prepare_store(keys=spec.keys, ns=self.namespace, visible=True)
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
        saved = []
        for req_id, (task, deadline) in list(self._saves.items()):
            ended, r = self._poll_task(task, deadline)
            if ended:
                del self._saves[req_id]
                if r is None or not r.ok:
                    logger.warning("kvtier: save of %s failed (%s); its blocks stay uncached",
                                   req_id, r.error() if r is not None else "lost")
                saved.append(req_id)
        self._sent_done.update(saved)
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
        if self.cache is not None:
            self.cache.close()
            self.cache = None
        stage_clients = {id(cl): cl for _, cl in self._stages}
        for cl in stage_clients.values():
            cl.close()
        self._stages, self.client = [], None
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
        load: on each PP stage's server, each TP rank's namespace (MLA: the
        one copy TP rank 0 wrote, the same bytes for every rank); or the
        worker's cache of this process. As LMCache's lookup client, which
        asks every TP and PP rank and takes the least: a block is a hit
        only when every stage and rank has it."""
        if self._stages:
            return [(cl, self._namespace(shape, r, s))
                    for s, (shape, cl) in enumerate(self._stages)
                    for r in (range(1) if shape.mla else
                              range(0, self.tp_size, self.kv_replicas))]
        with _CACHES_MU:
            w = _CACHES.get(self.engine_key)
        if w is None or w.cache is None:
            return []
        return [(w.cache, w.namespace)]

    def _peek_rounds(self, store, items):
        """store.peek_many of items [(keys, ns)] in as few round trips as
        the server's bounds allow (LOOKUP_BYTES_MAX, KVT_SRV_MAX_PEEKS):
        the matched tokens of each."""
        got, chunk, size = [], [], 0
        for keys, ns in items:
            n = sum(4 + (len(k) + 3) // 4 * 4 for k in keys)
            if chunk and (size + n > LOOKUP_BYTES_MAX or len(chunk) == 4096):
                got += self._peek_round(store, chunk)
                chunk, size = [], 0
            chunk.append((keys, ns))
            size += n
        if chunk:
            got += self._peek_round(store, chunk)
        return got

    def _peek_round(self, store, chunk):
        self.lookup_round_trips += 1
        self.peeks_sent += len(chunk)
        if len(chunk) > 1 and hasattr(store, "peek_many"):
            return store.peek_many([dict(keys=k, ns=ns) for k, ns in chunk])
        self.lookup_round_trips += len(chunk) - 1
        return [store.peek(keys=k, ns=ns) for k, ns in chunk]

    def _matched_many(self, prompts):
        """Leading blocks every target holds, for each of prompts (lists of
        keys), or None when a peek failed (the server is down: not
        remembered, asked again next step). One round trip per server
        client (PP stage) for all of them: every prompt in every TP rank's
        namespace on it (PEEK_MANY; nothing pinned, so no cancel follows a
        hit); a later stage asks only for what the earlier ones matched,
        none for a prompt that matched nothing."""
        targets = self._lookup_targets()
        if not targets:
            return [0] * len(prompts)
        groups = {}
        for store, ns in targets:
            groups.setdefault(id(store), (store, []))[1].append(ns)
        best = [len(k) for k in prompts]
        try:
            for store, nss in groups.values():
                ask = [i for i, b in enumerate(best) if b > 0]
                if not ask:
                    break
                items = [(prompts[i][:best[i]], ns) for i in ask for ns in nss]
                got = self._peek_rounds(store, items)
                for j, m in enumerate(got):
                    i = ask[j // len(nss)]
                    best[i] = min(best[i], m // self.block_size)
        except KvtierError as e:
            if not self._server_down:
                logger.warning("kvtier: peek failed (%s); the engine computes until it "
                               "answers again", e)
            self._server_down = True
            return None
        self._server_down = False
        return best

    def _matched_blocks(self, keys):
        got = self._matched_many([keys])
        return None if got is None else got[0]

    def on_new_request(self, request):
        """vLLM's Scheduler.add_request: in socket mode the request waits
        for a lookup batch, which the step's first get_num_new_matched_tokens
        sends (one round trip per server for up to lookup_batch requests
        instead of one per request)."""
        if not self._stages or self.lookup_batch <= 1:
            return
        hashes = getattr(request, "block_hashes", None)
        if not hashes:
            return
        with self._mu:
            self._new[request.request_id] = request

    def _lookup_batch(self, request, asked):
        """Looks up request (asked: its (num_computed_tokens, hashes)) with
        the oldest requests added since the last batch and not yet asked
        about; remembers each answer in _looked. Answers of the others
        carry computed None: valid for whatever prefix they are asked with
        first, as long as their hashes are the same."""
        rid = request.request_id
        with self._mu:
            self._new.pop(rid, None)
            more = []
            while self._new and len(more) < self.lookup_batch - 1:
                more.append(self._new.popitem(last=False)[1])
        batch = [(rid, asked, list(request.block_hashes))]
        batch += [(r.request_id, (None, len(h)), h) for r in more
                  for h in [list(getattr(r, "block_hashes", None) or [])] if h]
        got = self._matched_many([[block_key(h) for h in hs] for _, _, hs in batch])
        if got is None:
            return
        with self._mu:
            for (r, key, _), blocks in zip(batch, got):
                self._looked[r] = (key, blocks)

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        """(tokens beyond num_computed_tokens kvtier can load, load_async).
        Pins nothing: a block evicted before the worker loads it is reported
        by get_block_ids_with_load_errors and recomputed. vLLM asks every
        step while the request waits: the servers are asked again only once
        its computed prefix (or its number of block hashes) changed."""
        hashes = list(getattr(request, "block_hashes", None) or [])
        if not hashes:
            return 0, False
        rid, asked = request.request_id, (int(num_computed_tokens), len(hashes))
        seen = self._seen(rid, asked)
        if seen is None:
            self._lookup_batch(request, asked)
            seen = self._seen(rid, asked)
        blocks = 0 if seen is None else seen
        matched = blocks * self.block_size
        # the engine always computes the last prompt token
        limit = (int(request.num_tokens) - 1) // self.block_size * self.block_size
        n = max(0, min(matched, limit) - int(num_computed_tokens))
        if n == 0:
            return 0, False
        with self._mu:
            self._asked[rid] = int(num_computed_tokens)
        return n, self.load_async

    def _seen(self, rid, asked):
        """The remembered answer for rid asked with asked, or None. A batch
        answer (computed None) is taken for the first prefix asked."""
        with self._mu:
            seen = self._looked.get(rid)
            if seen is None:
                return None
            (computed, n), blocks = seen
            if n != asked[1] or computed not in (None, asked[0]):
                return None
            self._looked[rid] = (asked, blocks)
            return blocks

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        """The request is scheduled: its load (if any) goes to the workers,
        and its remembered lookup is dropped (asked afresh if preempted)."""
        with self._mu:
            computed = self._asked.pop(request.request_id, None)
            self._looked.pop(request.request_id, None)
            self._new.pop(request.request_id, None)
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
            self._looked.pop(request.request_id, None)
            self._new.pop(request.request_id, None)
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
