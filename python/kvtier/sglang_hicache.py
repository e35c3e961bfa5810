"""kvtier as an SGLang HiCache L3 storage backend.

SGLang loads it with no patch to SGLang:

    --enable-hierarchical-cache --hicache-storage-backend dynamic
    --hicache-storage-backend-extra-config '{"backend_name": "kvtier",
        "module_path": "kvtier.sglang_hicache", "class_name": "KvtierHiCacheStorage",
        "interface_v1": 1, "cpu_capacity": "64GiB", "ssd_dir": "/nvme/kvtier"}'

SGLang's factory imports the module, checks issubclass(cls, HiCacheStorage),
constructs cls(storage_config, kwargs) and calls
register_mem_pool_host(host_pool); its prefetch and backup threads then call
batch_exists / batch_get_v1 / batch_set_v1 concurrently (docs/engines.md).

Modes: in-process (one kvt_cache per rank, SSD directory per rank), or node
server (extra_config "socket": every rank attaches a kvtier.Client to one
`kvtier serve`, which owns the CPU and SSD tiers; start it with the ranks'
geometry and --set block_tokens=<SGLang page size>). In server mode the tier
options (cpu_capacity, ssd_dir, ...) belong to the server and are refused
here, and clear() cannot drop pages of the shared server (it logs so).

Block identity: every SGLang page is one keyed block, named by SGLang's page
hash string in a namespace of (model, KV dtype, page size, geometry; tp
rank/size for MHA, none for MLA; pp rank, attn cp rank). SGLang's page hashes
already chain (each commits to its whole token prefix), and SGLang calls the
backend from any page of a sequence (after its host hit) without the keys
before it, so a page's kvtier identity must not depend on where SGLang's
batch began: every page is a root block of its own, (namespace, page hash),
evicted by LRU/LFU page by page. A batch is one independent-keys request
(KVT_REQ_INDEPENDENT_KEYS: each key the block a one-key request of it
names, so pages stored page by page by earlier versions are found): one peek
per batch_exists; one lookup, launch and wait per batch_get_v1 (per run of
free slots with staging); one prepare_store, launch and wait per run of
missing pages in batch_set_v1 (a plan stops before a page stored or being
stored). Through the node server that is a few round trips per batch, not a
few per page. A missing page ends the leading run batch_exists reports and
batch_get_v1 loads; when a batch's load fails, its pages are loaded again
one by one, so a page that fails its checksum loads as False and the pages
around it as True; wrong bytes are never handed over.

Data path: the host pool itself is kvtier's engine memory, for every host
layout (pages move between the pool and the tiers with no extra copy):
layer_first registers each layer's K and V buffer; page_first (every layer's
token t side by side) and page_first_direct (page-major, then layer) register
each layer's strided view of the pool (kvt_engine_memory page_strides /
token_strides). extra_config zero_copy: false copies through a layer-first
staging area instead (needed only by the value-based get/set calls). The
block format is the same for every layout: a block written under one layout
reads back under another.
"""
import ctypes
import hashlib
import logging
import os
import shutil
import threading
import time

import numpy as np

from .cache import Cache
from .config import LAYER_FIRST, Config, Geometry
from .client import WORKERS_HINT, DeferredClient
from .errors import KvtierError

from ._engine_stubs import sglang as _stubs

# The real base class whenever SGLang's hicache_storage imports: SGLang's
# factory checks issubclass(cls, HiCacheStorage) against its own class, so a
# stand-in base there is refused. The optional names (the extra-info class
# of newer SGLang, the metrics dataclass) are imported one by one: one that
# is missing takes the stand-in for that name only, never for the base.
try:
    from sglang.srt.mem_cache import hicache_storage as _sglang_hs  # type: ignore
    SGLANG_IMPORTED = True
    SGLANG_IMPORT_ERROR = None
except ImportError as _e:
    _sglang_hs = _stubs
    SGLANG_IMPORTED = False
    SGLANG_IMPORT_ERROR = "%s: %s" % (type(_e).__name__, _e)
HiCacheStorage = _sglang_hs.HiCacheStorage
HiCacheStorageConfig = getattr(_sglang_hs, "HiCacheStorageConfig", _stubs.HiCacheStorageConfig)
HiCacheStorageExtraInfo = getattr(_sglang_hs, "HiCacheStorageExtraInfo",
                                  _stubs.HiCacheStorageExtraInfo)
try:
    from sglang.srt.metrics.collector import StorageMetrics  # type: ignore
except ImportError:
    StorageMetrics = _stubs.StorageMetrics

logger = logging.getLogger(__name__)


def _sglang_present():
    import importlib.util
    try:
        return importlib.util.find_spec("sglang") is not None
    except (ImportError, ValueError):
        return False


def base_description():
    """Which HiCacheStorage this module's class derives from, in words (the
    construction logs it: a stand-in where SGLang runs means the factory
    will refuse the class)."""
    if SGLANG_IMPORTED:
        return "SGLang's %s.HiCacheStorage" % HiCacheStorage.__module__
    return ("kvtier's stand-in HiCacheStorage (sglang.srt.mem_cache.hicache_storage did not "
            "import: %s)" % SGLANG_IMPORT_ERROR)

LAYOUTS = ("layer_first", "page_first", "page_first_direct")

# extra_config keys SGLang itself puts there (or reads), and kvtier's own.
SGLANG_KEYS = {"backend_name", "module_path", "class_name", "interface_v1", "tp_lcm_size"}
KVTIER_KEYS = {
    "socket": "path of a `kvtier serve` socket (node server mode)",
    "cpu_capacity": "CPU tier size per rank (kvtier size string or bytes; default 1GiB)",
    "ssd_dir": "base directory of the SSD tier; each rank uses its own subdirectory",
    "ssd_capacity": "SSD tier size per rank (default 64GiB)",
    "workers": "kvtier transfer threads (default 2)",
    "eviction": "lru or lfu",
    "namespace": "extra bytes mixed into every key's namespace (a cache salt)",
    "timeout": "seconds one transfer may take before it counts as failed (default 30)",
    "zero_copy": "register the host pool itself, any layout (default true)",
    "staging_pages": "pages in the staging area of the copying path (default 256)",
    "kvtier_options": "a dict of further kvtier options (docs/design.md, `kvtier config`)",
}


class _RWLock:
    """Many users, or one exclusive owner (clear swaps the cache under it)."""

    def __init__(self):
        self._cv = threading.Condition()
        self._users = 0
        self._owner = False

    def acquire_shared(self):
        with self._cv:
            while self._owner:
                self._cv.wait()
            self._users += 1

    def release_shared(self):
        with self._cv:
            self._users -= 1
            if self._users == 0:
                self._cv.notify_all()

    def acquire_exclusive(self):
        with self._cv:
            while self._owner:
                self._cv.wait()
            self._owner = True
            while self._users:
                self._cv.wait()

    def release_exclusive(self):
        with self._cv:
            self._owner = False
            self._cv.notify_all()


class _Staging:
    """A layer-first area of `pages` pages that the cache registers when it
    cannot address the host pool itself; threads take and return page slots
    (blocking while none are free)."""

    def __init__(self, num_components, layers, pages, page_size, heads, row_bytes):
        self.data = np.zeros((num_components, layers, pages * page_size, heads, row_bytes),
                             np.uint8)
        self.pages = pages
        self._free = list(range(pages))
        self._cv = threading.Condition()

    def buffers(self):
        return [[self.data[c, l] for c in range(self.data.shape[0])]
                for l in range(self.data.shape[1])]

    def take(self, n):
        n = min(n, self.pages)
        with self._cv:
            while not self._free:
                self._cv.wait()
            got, self._free = self._free[:n], self._free[n:]
            return got

    def give(self, slots):
        with self._cv:
            self._free.extend(slots)
            self._cv.notify_all()


def _byte_view(buf, what):
    """(uint8 array over buf's memory, last dim in bytes; element size; dtype
    name). buf: a C-contiguous numpy array or CPU torch tensor."""
    if isinstance(buf, np.ndarray):
        if not buf.flags.c_contiguous or not buf.flags.writeable:
            raise ValueError("kvtier: %s must be a writable C-contiguous array" % what)
        if buf.ndim == 0:
            raise ValueError("kvtier: %s is a scalar" % what)
        e = buf.dtype.itemsize
        view = buf.view(np.uint8).reshape(buf.shape[:-1] + (buf.shape[-1] * e,))
        return view, e, str(buf.dtype)
    if type(buf).__module__.startswith("torch"):
        if buf.device.type != "cpu":
            raise ValueError("kvtier: %s is on %s; the HiCache host pool must be in host memory"
                             % (what, buf.device))
        if not buf.is_contiguous():
            raise ValueError("kvtier: %s must be contiguous" % what)
        e = buf.element_size()
        nbytes = buf.numel() * e
        raw = (ctypes.c_uint8 * nbytes).from_address(buf.data_ptr())
        view = np.ctypeslib.as_array(raw).reshape(tuple(buf.shape[:-1]) + (buf.shape[-1] * e,))
        return view, e, str(buf.dtype).replace("torch.", "")
    raise ValueError("kvtier: %s: expected a numpy array or a CPU torch tensor, got %s"
                     % (what, type(buf).__name__))


def _as_index_array(x, what):
    if type(x).__module__.startswith("torch"):
        x = x.cpu().numpy()
    a = np.asarray(x)
    if a.ndim != 1 or not np.issubdtype(a.dtype, np.integer):
        raise ValueError("kvtier: %s must be a 1-D integer tensor or array, got shape %s dtype %s"
                         % (what, a.shape, a.dtype))
    return a.astype(np.int64, copy=False)


# Options of the tiers: the server's own in node server mode.
SERVER_KEYS = {"cpu_capacity", "ssd_dir", "ssd_capacity", "workers", "eviction",
               "kvtier_options"}


class KvtierHiCacheStorage(HiCacheStorage):
    """SGLang HiCacheStorage over a kvtier cache (module docstring)."""

    def __init__(self, storage_config, kwargs=None):
        self.storage_config = storage_config
        self.kwargs = kwargs or {}
        extra = dict(storage_config.extra_config or {})
        unknown = sorted(set(extra) - SGLANG_KEYS - set(KVTIER_KEYS))
        if unknown:
            raise ValueError("kvtier: unknown extra_config key(s) %s; kvtier's keys: %s"
                             % (", ".join(unknown), ", ".join(sorted(KVTIER_KEYS))))
        if extra.get("backend_name") is not None and not int(extra.get("interface_v1", 0) or 0):
            # Without it SGLang would use its generic path, whose values are
            # the host pool's own flat pages, not kvtier blocks.
            raise ValueError('kvtier: add "interface_v1": 1 to '
                             '--hicache-storage-backend-extra-config; kvtier serves SGLang '
                             'through batch_get_v1 / batch_set_v1 (zero copy)')
        if getattr(storage_config, "should_split_heads", False):
            raise NotImplementedError("kvtier: tp_lcm_size head splitting (page_head layout) "
                                      "is not supported")
        self.extra = extra
        if not SGLANG_IMPORTED and _sglang_present():
            # SGLang is there but its module did not import: its factory will
            # refuse this class (not its HiCacheStorage); say why first.
            logger.error("kvtier: SGLang is installed but %s; the HiCache factory will refuse "
                         "kvtier's class", base_description())
        self.socket = extra.get("socket")
        self._client_cls = None
        if self.socket is not None:
            if not isinstance(self.socket, str) or not self.socket:
                raise ValueError("kvtier: extra_config socket must be the path of a `kvtier "
                                 "serve` socket, got %r" % (self.socket,))
            server_side = sorted(set(extra) & SERVER_KEYS)
            if server_side:
                raise ValueError("kvtier: extra_config %s configure the tiers, which the "
                                 "`kvtier serve` process owns in node server mode (socket); "
                                 "set them there (kvtier serve --set NAME=VALUE)"
                                 % ", ".join(server_side)
                                 + (WORKERS_HINT if "workers" in server_side else ""))
            self._client_cls = _node_client_class()
        self.timeout = float(extra.get("timeout", 30.0))
        if not self.timeout > 0:
            raise ValueError("kvtier: extra_config timeout must be > 0 seconds, got %r"
                             % (extra.get("timeout"),))
        self.zero_copy = bool(extra.get("zero_copy", True))
        self.staging_pages = int(extra.get("staging_pages", 256))
        if self.staging_pages < 1:
            raise ValueError("kvtier: extra_config staging_pages must be >= 1")
        c = storage_config
        self.is_mla = bool(c.is_mla_model)
        if self.is_mla and c.tp_size > 1 and self.socket is None:
            logger.warning("kvtier: MLA with tp_size %d in-process: SGLang backs MLA pages up "
                           "from TP rank 0 only and takes the minimum hit over ranks, so "
                           "in-process caches give no L3 hits; attach every rank to one "
                           "`kvtier serve` (extra_config socket)", c.tp_size)
        self.cache = None
        self.mem_pool_host = None
        self._rw = _RWLock()
        self._stats_mu = threading.Lock()
        self._counters = dict(exists_queries=0, exists_hits=0, get_pages=0, get_hits=0,
                              get_failed=0, set_pages=0, set_stored=0, set_present=0,
                              set_failed=0, unavailable=0)
        self._metrics = StorageMetrics()  # drained by get_stats

    # ------------------------------------------------------------------
    # Registration: the host pool's geometry and memory

    def register_mem_pool_host(self, mem_pool_host):
        super().register_mem_pool_host(mem_pool_host)
        pool = mem_pool_host
        layout = getattr(pool, "layout", None)
        if layout not in LAYOUTS:
            raise NotImplementedError("kvtier: host pool layout %r is not supported (supported: %s)"
                                      % (layout, ", ".join(LAYOUTS)))
        kv, elem, dtype_name = _byte_view(pool.kv_buffer, "mem_pool_host.kv_buffer")
        self.layout = layout
        self.page_size = ps = int(pool.page_size)
        self.layer_num = L = int(pool.layer_num)
        want_dims = {("mha", "layer_first"): 5, ("mha", "page_first"): 5,
                     ("mha", "page_first_direct"): 6, ("mla", "layer_first"): 4,
                     ("mla", "page_first"): 4, ("mla", "page_first_direct"): 5}
        kind = "mla" if self.is_mla else "mha"
        if kv.ndim != want_dims[(kind, layout)]:
            raise ValueError("kvtier: %s %s host pool: kv_buffer has %d dims, expected %d"
                             % (kind.upper(), layout, kv.ndim, want_dims[(kind, layout)]))
        if kind == "mha":
            if kv.shape[0] != 2:
                raise ValueError("kvtier: MHA kv_buffer's first dim is %d, expected 2 (K, V)"
                                 % kv.shape[0])
            kv5 = kv
        else:
            kv5 = kv[None]  # one component
        self._kv = kv5
        self._C = 2 if kind == "mha" else 1
        if layout == "layer_first":
            layers, tokens, heads, row = kv5.shape[1:]
        elif layout == "page_first":
            tokens, layers, heads, row = kv5.shape[1:]
        else:
            pages, layers, page_tokens, heads, row = kv5.shape[1:]
            if page_tokens != ps:
                raise ValueError("kvtier: page_first_direct kv_buffer has %d tokens per page, "
                                 "page_size is %d" % (page_tokens, ps))
            tokens = pages * ps
        if layers != L:
            raise ValueError("kvtier: kv_buffer holds %d layers, layer_num is %d" % (layers, L))
        if tokens % ps:
            raise ValueError("kvtier: host pool of %d tokens is not a whole number of %d-token "
                             "pages" % (tokens, ps))
        if row % elem:
            raise ValueError("kvtier: kv_buffer row of %d bytes is not whole elements" % row)
        self.num_pages = tokens // ps
        self.heads, self.row_bytes, self.elem = heads, row, elem
        self.dtype_name = dtype_name
        self.namespace = self._namespace()
        self._open_cache()
        logger.info("kvtier: HiCache backend ready: %s %s, %d layers, page %d tokens, %s, "
                    "%s; %s; base %s", kind.upper(), layout, L, ps, dtype_name,
                    "zero copy" if self.staging is None else "staging copy",
                    "node server at %s" % self.socket if self.socket is not None
                    else "in-process cache", base_description())

    def _namespace(self):
        c = self.storage_config
        parts = ["kvtier-sglang-hicache-v1", "model=%s" % (c.model_name or ""),
                 "dtype=%s" % self.dtype_name, "page=%d" % self.page_size,
                 "layers=%d" % self.layer_num, "heads=%d" % self.heads,
                 "row=%d" % self.row_bytes]
        parts.append("mla" if self.is_mla else "tp=%d/%d" % (c.tp_rank, c.tp_size))
        parts.append("pp=%d/%d" % (c.pp_rank, c.pp_size))
        parts.append("cp=%d/%d" % (c.attn_cp_rank, c.attn_cp_size))
        salt = self.extra.get("namespace")
        if salt:
            parts.append("salt=%s" % salt)
        return "|".join(parts)

    def _rank_dir(self):
        base = self.extra.get("ssd_dir")
        if not base:
            return None
        c = self.storage_config
        digest = hashlib.blake2b(self.namespace.encode(), digest_size=6).hexdigest()
        return os.path.join(base, "%s-tp%d-pp%d-cp%d-dp%d" % (
            digest, c.tp_rank, c.pp_rank, c.attn_cp_rank, getattr(c, "dp_rank", 0)))

    def _geometry(self):
        return Geometry.uniform(self.layer_num, self.page_size, self.heads,
                                self.row_bytes // self.elem, self.elem, self._C, LAYER_FIRST)

    def _attach(self):
        """Node server mode: a Client of the `kvtier serve` at self.socket,
        its block size checked; a server that is not there yet gives a
        client that attaches when it answers (client.DeferredClient: every
        call a miss until then), never an exception that stops SGLang."""
        self.ssd_dir = None

        def attach():
            with self._geometry() as geo:
                cl = self._client_cls(self.socket, geo,
                                      timeout_ms=max(1, int(self.timeout * 1000)))
            if cl.block_tokens != self.page_size:
                cl.close()
                raise ValueError("kvtier: the server at %s stores blocks of %d tokens but "
                                 "SGLang's page is %d tokens (each page is one block): start "
                                 "kvtier serve with --set block_tokens=%d"
                                 % (self.socket, cl.block_tokens, self.page_size,
                                    self.page_size))
            return cl
        return DeferredClient(attach, "tp rank %d" % self.storage_config.tp_rank, self.socket,
                              logger)

    def _open_cache(self, wipe=False):
        if self.socket is not None:
            cache = self._attach()
        else:
            cache = self._open_local(wipe)
        try:
            self.staging = None
            if self.zero_copy:
                cache.register_buffers(self.num_pages, self._unit_views())
            else:
                self.staging = _Staging(self._C, self.layer_num, self.staging_pages,
                                        self.page_size, self.heads, self.row_bytes)
                cache.register_buffers(self.staging_pages, self.staging.buffers())
        except BaseException:
            cache.close()
            raise
        self.cache = cache

    def _unit_views(self):
        """Per layer, K and V (or the MLA component): the host pool's own
        memory as kvtier addresses it. layer_first: contiguous (tokens, heads,
        row); page_first: (tokens, heads, row) at a token stride of every
        layer's row; page_first_direct: (pages, page_size, heads, row) at a
        page stride of every layer's page."""
        kv = self._kv
        if self.layout == "layer_first":
            return [[kv[c, l] for c in range(self._C)] for l in range(self.layer_num)]
        return [[kv[c, :, l] for c in range(self._C)] for l in range(self.layer_num)]

    def _open_local(self, wipe):
        opts = {"block_tokens": self.page_size}
        if "cpu_capacity" in self.extra:
            opts["cpu_capacity"] = self.extra["cpu_capacity"]
        for k in ("workers", "eviction"):
            if k in self.extra:
                opts[k] = self.extra[k]
        rank_dir = self._rank_dir()
        if rank_dir:
            if wipe and os.path.isdir(rank_dir):
                shutil.rmtree(rank_dir)
            os.makedirs(rank_dir, exist_ok=True)
            opts["ssd_dirs"] = rank_dir
            opts["ssd_capacity"] = self.extra.get("ssd_capacity", "64GiB")
        opts.update(self.extra.get("kvtier_options") or {})
        self.ssd_dir = rank_dir
        with Config(opts) as cfg, self._geometry() as geo:
            return Cache(cfg, geo)

    # ------------------------------------------------------------------
    # Moving pages between the host pool and the staging area

    def _tok(self, pages):
        ps = self.page_size
        return (np.asarray(pages, np.int64)[:, None] * ps + np.arange(ps)).ravel()

    def _host_to_canon(self, hp):
        """The pages hp of the host pool as (C, L, n * page_size, heads, row)."""
        kv, n, ps = self._kv, len(hp), self.page_size
        if self.layout == "layer_first":
            return kv[:, :, self._tok(hp)]
        if self.layout == "page_first":
            return kv[:, self._tok(hp)].transpose(0, 2, 1, 3, 4)
        d = kv[:, np.asarray(hp, np.int64)].transpose(0, 2, 1, 3, 4, 5)
        return d.reshape(self._C, self.layer_num, n * ps, self.heads, self.row_bytes)

    def _canon_to_host(self, hp, data):
        kv, n, ps = self._kv, len(hp), self.page_size
        if self.layout == "layer_first":
            kv[:, :, self._tok(hp)] = data
        elif self.layout == "page_first":
            kv[:, self._tok(hp)] = data.transpose(0, 2, 1, 3, 4)
        else:
            d = data.reshape(self._C, self.layer_num, n, ps, self.heads, self.row_bytes)
            kv[:, np.asarray(hp, np.int64)] = d.transpose(0, 2, 1, 3, 4, 5)

    def _host_pages(self, keys, host_indices):
        """Page ids of the host pool for each key, checked: host_indices are
        len(keys) whole, page-aligned pages of token slots."""
        n, ps = len(keys), self.page_size
        idx = _as_index_array(host_indices, "host_indices")
        if idx.size != n * ps:
            raise ValueError("kvtier: %d keys need %d host_indices (%d per page), got %d"
                             % (n, n * ps, ps, idx.size))
        idx = idx.reshape(n, ps)
        first = idx[:, 0]
        bad = np.nonzero((first % ps != 0) | (first < 0) | (first >= self.num_pages * ps) |
                         np.any(idx != first[:, None] + np.arange(ps), axis=1))[0]
        if bad.size:
            i = int(bad[0])
            raise ValueError("kvtier: host_indices of key %d (%r) are not one whole page of the "
                             "host pool: %s" % (i, keys[i], idx[i][:4].tolist()))
        return first // ps

    # ------------------------------------------------------------------
    # Helpers over the cache

    def _require(self):
        if self.cache is None:
            raise RuntimeError("kvtier: register_mem_pool_host was not called (or the "
                               "backend is closed)")

    def _metric(self, kind, pages, seconds):
        """One batch for SGLang's storage metrics: pages and GB/s."""
        if pages == 0:
            return
        gbs = pages * self.block_bytes() / max(seconds, 1e-9) / 1e9
        with self._stats_mu:
            getattr(self._metrics, kind + "_pgs").append(pages)
            getattr(self._metrics, kind + "_bandwidth").append(gbs)

    def _count(self, **kw):
        with self._stats_mu:
            for k, v in kw.items():
                self._counters[k] += v

    def _drop(self, tasks):
        """Cancels planned tasks and collects their results (no pin left)."""
        for t in tasks:
            try:
                self.cache.cancel(t)
                self.cache.wait(t, self.timeout)
            except Exception:  # already ended and reported: nothing to release
                pass

    def _finish(self, task):
        """Waits for a launched task; True when it succeeded. A task that
        overruns the timeout is cancelled and waited for (so it does not
        write pages after we return) and counts as failed."""
        try:
            return self.cache.wait(task, self.timeout).ok
        except Exception:
            logger.warning("kvtier: task %d overran %.1f s; cancelling it", task, self.timeout)
            try:
                self.cache.cancel(task)
                self.cache.wait(task, self.timeout)
            except Exception:
                logger.error("kvtier: task %d did not end after cancel", task)
            return False

    # ------------------------------------------------------------------
    # The v1 interface SGLang uses (interface_v1: 1)

    def batch_exists(self, keys, extra_info=None):
        """The number of leading keys stored (pages found, nothing pinned):
        one independent-keys peek over the whole batch, no cancel after."""
        self._require()
        keys = list(keys)
        n = 0
        if keys:
            self._rw.acquire_shared()
            try:
                n = self.cache.peek(keys=keys, ns=self.namespace,
                                    independent=True) // self.page_size
            except KvtierError as e:  # the server lost, a timeout: the run ends here
                self._unavailable("batch_exists", e)
            finally:
                self._rw.release_shared()
        self._count(exists_queries=len(keys), exists_hits=n)
        return n

    def exists(self, key):
        return self.batch_exists([key]) == 1

    def batch_get_v1(self, keys, host_indices, extra_info=None):
        """Loads each key's page into its host pool page; one bool per key.
        One independent-keys lookup matches the leading run of stored keys
        and one task loads it (staging: one per run of free slots); loading
        stops at the first key not stored (the rest are False). A run whose
        task fails (a corrupt block, a timeout) is loaded again page by
        page, so only the pages that fail alone are False."""
        self._require()
        keys = list(keys)
        out = [False] * len(keys)
        if not keys:
            return out
        hp = self._host_pages(keys, host_indices)
        t0 = time.monotonic()
        self._rw.acquire_shared()
        try:
            if self.staging is None:
                for j in self._get_run(keys, hp)[1]:
                    out[j] = True
            else:
                self._get_staged(keys, hp, out)
        except KvtierError as e:  # the pages not loaded stay False
            self._unavailable("batch_get_v1", e)
        finally:
            self._rw.release_shared()
        self._count(get_pages=len(keys), get_hits=sum(out))
        self._metric("prefetch", sum(out), time.monotonic() - t0)
        return out

    def _get_run(self, keys, pages):
        """Loads the leading run of stored keys, key i into engine page
        pages[i] (host pool page or staging slot): one lookup, one launch,
        one wait. Returns (the run's length, the indices loaded)."""
        m = self.cache.lookup(keys=keys, ns=self.namespace, independent=True)
        if m.task == 0:
            return 0, []
        n = min(m.matched_tokens // self.page_size, len(keys))
        if n == 0:  # a task with nothing to load: release it
            self._drop([m.task])
            return 0, []
        try:
            self.cache.launch(m.task, [int(p) for p in pages[:n]])
        except BaseException:
            self._drop([m.task])
            raise
        if self._finish(m.task):
            return n, list(range(n))
        good = self._get_each(keys[:n], pages[:n])
        self._count(get_failed=n - len(good))
        return n, good

    def _get_each(self, keys, pages):
        """After a run's task failed: each key as its own request (the same
        block identity), every lookup first, then the launches, then the
        waits; the indices loaded. A page that fails alone (or is gone: a
        corrupt block leaves the index) is not loaded; the rest are."""
        planned, launched = [], []
        try:
            for i, k in enumerate(keys):
                m = self.cache.lookup(keys=[k], ns=self.namespace)
                if m.task:
                    planned.append((i, m.task))
            while planned:
                i, t = planned[0]
                self.cache.launch(t, [int(pages[i])])
                launched.append((i, t))
                planned.pop(0)
        finally:
            self._drop([t for _, t in planned])
            good = [i for i, t in launched if self._finish(t)]
        return good

    def _get_staged(self, keys, hp, out):
        """batch_get_v1 through the staging area: as many keys per run as
        free slots were taken (at least one), copied to the host pool after
        the run's task."""
        i = 0
        while i < len(keys):
            slots = self.staging.take(len(keys) - i)
            try:
                n, good = self._get_run(keys[i:i + len(slots)], slots)
                if good:
                    data = self.staging.data[:, :, self._tok([slots[j] for j in good])]
                    self._canon_to_host(hp[[i + j for j in good]], data)
                    for j in good:
                        out[i + j] = True
            finally:
                self.staging.give(slots)
            if n < len(slots):
                return
            i += n

    def batch_set_v1(self, keys, host_indices, extra_info=None):
        """Stores each key's host pool page; one bool per key (True: stored
        now or already stored)."""
        self._require()
        keys = list(keys)
        out = [False] * len(keys)
        if not keys:
            return out
        hp = self._host_pages(keys, host_indices)
        t0 = time.monotonic()
        self._rw.acquire_shared()
        try:
            if self.staging is None:
                self._set_pages(keys, list(range(len(keys))), [int(p) for p in hp], out)
            else:
                order = list(range(len(keys)))
                while order:
                    slots = self.staging.take(len(order))
                    part, order = order[:len(slots)], order[len(slots):]
                    try:
                        self.staging.data[:, :, self._tok(slots)] = self._host_to_canon(hp[part])
                        self._set_pages(keys, part, slots, out)
                    finally:
                        self.staging.give(slots)
        except KvtierError as e:  # the pages not stored stay False
            self._unavailable("batch_set_v1", e)
        finally:
            self._rw.release_shared()
        self._count(set_pages=len(keys))
        self._metric("backup", sum(out), time.monotonic() - t0)
        return out

    def _unavailable(self, what, e):
        """SGLang's prefetch and backup threads take a miss, never an
        exception: a lost or slow server (node server mode; the client
        reattaches on its own) or a failed call ends the batch as misses,
        logged at most once a second."""
        now = time.monotonic()
        if now - getattr(self, "_unavail_logged", 0.0) >= 1.0:
            self._unavail_logged = now
            logger.warning("kvtier: %s: %s; answered as misses", what, e)
        self._count(unavailable=1)

    def _set_pages(self, keys, which, pages, out):
        """Stores keys[which[j]] from engine page pages[j]: one
        independent-keys prepare_store per run of keys the cache lacks (it
        plans from the first key not stored up to the next one stored or
        being stored), each run one task; every task waited for at the end."""
        ks = [keys[i] for i in which]
        ps = self.page_size
        launched = []
        try:
            j = 0
            while j < len(ks):
                # A plan ends before a key repeated in it: the repeat is
                # asked again in the next request (pending by then: False).
                rest = ks[j:]
                # visible: the task ends once the server committed its pages, so
                # every rank finds them when SGLang hears of the batch.
                plan = self.cache.prepare_store(keys=rest, ns=self.namespace, independent=True,
                                                visible=True)
                a = min(plan.first_token // ps, len(rest))
                for x in range(j, j + a):  # cached already
                    out[which[x]] = True
                self._count(set_present=a)
                b = plan.num_tokens // ps
                if plan.task == 0 or b == 0:
                    if plan.task:
                        self._drop([plan.task])
                    if a < len(rest):
                        # Being stored by another thread, or no room right
                        # now: not stored by us (False).
                        out[which[j + a]] = False
                        self._count(set_failed=1)
                        a += 1
                    j += a
                    continue
                try:
                    self.cache.launch(plan.task, [int(p) for p in pages[j:j + a + b]])
                except BaseException:
                    self._drop([plan.task])
                    raise
                launched.append((j + a, b, plan.task))
                j += a + b
        finally:
            for first, b, t in launched:
                ok = self._finish(t)
                for x in range(first, first + b):
                    out[which[x]] = ok
                self._count(set_stored=b if ok else 0, set_failed=0 if ok else b)

    # ------------------------------------------------------------------
    # Value-based calls (kvtier's block format: layer-major, per layer K
    # then V, each page_size tokens x heads x row bytes)

    def _need_staging(self, what):
        self._require()
        if self.staging is None:
            raise NotImplementedError(
                "kvtier: %s by value needs the staging area, but this backend registered the "
                "host pool itself (zero copy); SGLang uses batch_get_v1 / "
                "batch_set_v1 with interface_v1: 1. Set extra_config zero_copy: false to use "
                "values" % what)

    def block_bytes(self):
        return self._C * self.layer_num * self.page_size * self.heads * self.row_bytes

    def get(self, key, target_location=None, target_sizes=None):
        """The page's bytes (numpy uint8, kvtier block format) or None when
        not stored; written into target_location when given."""
        self._need_staging("get")
        self._rw.acquire_shared()
        try:
            m = self.cache.lookup(keys=[key], ns=self.namespace)
            if m.task == 0:
                return None
            slots = self.staging.take(1)
            try:
                try:
                    self.cache.launch(m.task, slots)
                except BaseException:
                    self._drop([m.task])
                    raise
                if not self._finish(m.task):
                    return None
                data = self.staging.data[:, :, self._tok(slots)].transpose(1, 0, 2, 3, 4)
                flat = np.ascontiguousarray(data).reshape(-1)
            finally:
                self.staging.give(slots)
        except KvtierError as e:
            self._unavailable("get", e)
            return None
        finally:
            self._rw.release_shared()
        if target_location is None:
            return flat
        dst, _, _ = _byte_view(target_location, "target_location")
        dst = dst.reshape(-1)
        if dst.size != flat.size:
            raise ValueError("kvtier: target_location holds %d bytes, a page is %d"
                             % (dst.size, flat.size))
        dst[:] = flat
        return target_location

    def batch_get(self, keys, target_locations=None, target_sizes=None):
        targets = target_locations if target_locations is not None else [None] * len(keys)
        return [self.get(k, t) for k, t in zip(keys, targets)]

    def set(self, key, value=None, target_location=None, target_sizes=None):
        """Stores value (a page in kvtier block format, any dtype) under key."""
        self._need_staging("set")
        src = value if value is not None else target_location
        if src is None:
            raise ValueError("kvtier: set(%r): no value given" % (key,))
        flat, _, _ = _byte_view(np.ascontiguousarray(src) if isinstance(src, np.ndarray) else src,
                                "value")
        flat = flat.reshape(-1)
        if flat.size != self.block_bytes():
            raise ValueError("kvtier: set(%r): value is %d bytes, a page is %d"
                             % (key, flat.size, self.block_bytes()))
        self._rw.acquire_shared()
        try:
            slots = self.staging.take(1)
            try:
                canon = flat.reshape(self.layer_num, self._C, self.page_size, self.heads,
                                     self.row_bytes).transpose(1, 0, 2, 3, 4)
                self.staging.data[:, :, self._tok(slots)] = canon
                out = [False]
                self._set_pages([key], [0], slots, out)
                return out[0]
            finally:
                self.staging.give(slots)
        except KvtierError as e:
            self._unavailable("set", e)
            return False
        finally:
            self._rw.release_shared()

    def batch_set(self, keys, values=None, target_locations=None, target_sizes=None):
        vals = values if values is not None else target_locations
        if vals is None or len(vals) != len(keys):
            raise ValueError("kvtier: batch_set: %d keys need as many values" % len(keys))
        return all([self.set(k, v) for k, v in zip(keys, vals)])

    # ------------------------------------------------------------------
    # Extra pools (v2), housekeeping

    def batch_exists_v2(self, keys, pool_transfers=None, extra_info=None):
        raise NotImplementedError("kvtier: batch_exists_v2 (extra host pools: Mamba, SWA, DSA "
                                  "indexer, ...) is not supported; the KV pool is served "
                                  "through batch_exists / batch_get_v1 / batch_set_v1")

    def batch_get_v2(self, transfers, extra_info=None):
        raise NotImplementedError("kvtier: batch_get_v2 (extra host pools: Mamba, SWA, DSA "
                                  "indexer, ...) is not supported; only the KV pool "
                                  "(batch_get_v1)")

    def batch_set_v2(self, transfers, extra_info=None):
        raise NotImplementedError("kvtier: batch_set_v2 (extra host pools: Mamba, SWA, DSA "
                                  "indexer, ...) is not supported; only the KV pool "
                                  "(batch_set_v1)")

    def clear(self):
        """Drops every stored page of this rank (CPU and SSD tiers). In node
        server mode the pages live in the shared server: every page stored
        under this instance's namespace is removed there (other namespaces,
        other instances' pages, stay; pages pinned by a load in flight stay
        and are reported), and how many went is logged. SGLang's
        flush_cache calls it."""
        self._require()
        if self.socket is not None:
            try:
                removed, kept = self.cache.clear(ns=self.namespace)
            except KvtierError as e:
                logger.warning("kvtier: clear() could not clear the namespace in the `kvtier "
                               "serve` at %s: %s", self.socket, e)
                return
            with self._stats_mu:
                self._counters["cleared_pages"] = (self._counters.get("cleared_pages", 0)
                                                   + removed)
            logger.info("kvtier: clear(): %d pages of this rank's namespace removed from the "
                        "`kvtier serve` at %s%s", removed, self.socket,
                        " (%d pinned by loads in flight kept)" % kept if kept else "")
            return
        self._rw.acquire_exclusive()
        try:
            self.cache.close()
            self.cache = None
            self._open_cache(wipe=True)
        finally:
            self._rw.release_exclusive()

    def get_stats(self):
        """SGLang's storage metrics since the last call (pages and GB/s per
        prefetch and backup batch) when storage metrics are on, else None:
        SGLang's StorageMetricsCollector takes exactly that, every scheduler
        step. kvtier's own counters: stats()."""
        if not getattr(self.storage_config, "enable_storage_metrics", False):
            return None
        with self._stats_mu:
            out, self._metrics = self._metrics, StorageMetrics()
        return out

    def stats(self):
        """kvtier's cache counters (as kvtier_*) plus this backend's page
        counters, a dict."""
        with self._stats_mu:
            out = dict(self._counters)
        if self.cache is not None:
            out.update(("kvtier_" + k, v) for k, v in self.cache.stats().items())
        return out

    def close(self):
        """Closes the cache (SGLang calls close() on detach when present)."""
        self._rw.acquire_exclusive()
        try:
            if self.cache is not None:
                self.cache.close()
                self.cache = None
        finally:
            self._rw.release_exclusive()


def _node_client_class():
    """kvtier's node server client (kvtier.client.Client)."""
    from .client import Client
    return Client
