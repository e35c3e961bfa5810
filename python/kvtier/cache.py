"""The cache manager (kvt_cache_*): lookup, store, launch, wait, poll.

Engine memory is registered once, from numpy arrays or CPU torch tensors
(``Cache.register_buffers``) or from an EmulatedEngine; the cache keeps a
reference to them for as long as it lives, because the C library keeps
their addresses.
"""
import ctypes
from collections import namedtuple

from . import _lib
from ._arrays import (as_request, buffer_address, cuda_buffer_address, cuda_device, is_contiguous,
                      strided_view, timeout_ms,
                      u32_array, u32_ptr, uint)
from ._handle import Handle
from .config import LAYER_FIRST, Config, Geometry
from .errors import check, invalid, make_error

lib = _lib.lib

TASK_LOAD = 1   #: kvt_task_kind of a load
TASK_STORE = 2  #: kvt_task_kind of a store
#: KVT_PAGE_SKIP: a load's page-table entry that copies nothing into that
#: page (the engine keeps its own bytes there); a store refuses it.
PAGE_SKIP = 0xFFFFFFFF

#: A task's result. status is a kvt_status (0 = OK); ``error()`` gives the
#: matching exception (or None).
class TaskResult(namedtuple("TaskResult", "task kind status first_token num_tokens bytes")):
    """The result of one task (kvt_task_result). ``ok`` is status == 0."""

    @property
    def ok(self):
        """True when the task succeeded."""
        return self.status == 0

    def error(self):
        """The KvtierError for a failed task (None when it succeeded)."""
        from .errors import status_name
        if self.ok:
            return None
        return make_error(self.status, "task %d (%s) ended with %s" % (
            self.task, "load" if self.kind == TASK_LOAD else "store", status_name(self.status)))


def _result(r):
    return TaskResult(r.task, r.kind, r.status, r.first_token, r.num_tokens, r.bytes)


Match = namedtuple("Match", "task matched_tokens")
Match.__doc__ = """A lookup's answer: task (0 when nothing matched) and matched_tokens."""
StorePlan = namedtuple("StorePlan", "task first_token num_tokens")
StorePlan.__doc__ = """A planned store: task (0 when nothing to store) and its token range."""


def register_memory(target, geometry, num_pages, buffers=None, base=None):
    """Builds a kvt_engine_memory from host buffers, or from CUDA tensors
    (torch tensors on a GPU, duck-typed by data_ptr() and device), checking
    each one's size against the geometry. Returns (EngineMemory, keep-alive
    list). All buffers are host memory, or all are on one CUDA device.

    LAYER_FIRST: ``buffers[layer][component]`` (or a flat list indexed
    ``layer * 2 + component``) each holding num_pages pages of that
    component. PAGE_FIRST: ``base``, num_pages * bytes_per_page bytes.

    A buffer may also be a non-contiguous view (numpy or torch) of shape
    (pages, tokens_per_page, ...) or (tokens, ...) whose trailing dims hold
    one token's bytes contiguously: kvtier then addresses it by its strides
    (kvt_engine_memory.page_strides / token_strides), with no copy, e.g.
    ``kv[:, layer]`` of SGLang's page_first pool (tokens, layers, heads,
    head_dim). A layer-first geometry takes such views for any layout."""
    devices = []

    def address(buf, what, need, contiguous=True):
        device = cuda_device(buf)
        if device is None:
            devices.append((what, None))
            return buffer_address(buf, what, need, contiguous)
        addr, device, obj = cuda_buffer_address(buf, what, need, contiguous)
        devices.append((what, device))
        return addr, obj

    mem, keep = _build_memory(target, geometry, num_pages, buffers, base, address)
    kinds = set(d for _, d in devices)
    if len(kinds) > 1:
        first = devices[0]
        other = next(d for d in devices if d[1] != first[1])

        def name(d):
            return "host memory" if d[1] is None else "CUDA device %d" % d[1]
        raise invalid("%s: %s is %s but %s is %s; all buffers must be host memory or on one "
                      "CUDA device" % (target, first[0], name(first), other[0], name(other)))
    if devices and devices[0][1] is not None:
        mem.kind = _lib.KVT_MEMORY_CUDA
        mem.device = devices[0][1]
    return mem, keep


def _build_memory(target, geometry, num_pages, buffers, base, buffer_address):
    gi = geometry.info()
    num_pages = uint(num_pages, "num_pages", minimum=1)
    keep = []
    mem = _lib.EngineMemory()
    mem.num_pages = num_pages
    if gi["layout"] == LAYER_FIRST:
        if buffers is None or base is not None:
            raise invalid("%s: a layer-first geometry takes buffers=[[K, V], ...] per layer" % target)
        bufs = list(buffers)
        nl = gi["num_layers"]
        if len(bufs) == nl and all(isinstance(b, (list, tuple)) for b in bufs):
            per_layer = [list(b) for b in bufs]
        elif len(bufs) == nl * 2:
            per_layer = [bufs[2 * i:2 * i + 2] for i in range(nl)]
        else:
            raise invalid("%s: %d buffers given; the geometry has %d layers (give [[K, V], ...] "
                          "or a flat list of %d)" % (target, len(bufs), nl, nl * 2))
        units = _lib.KVT_MAX_LAYERS * _lib.KVT_MAX_COMPONENTS
        ptrs = (ctypes.c_void_p * units)()
        sizes, pstr, tstr = (ctypes.c_uint64 * units)(), (ctypes.c_uint64 * units)(), \
            (ctypes.c_uint64 * units)()
        strided = False
        tpp = gi["tokens_per_page"]
        for layer, comps in enumerate(per_layer):
            ncomp = geometry.num_components(layer)
            given = [c for c in comps if c is not None]
            if len(given) != ncomp:
                raise invalid("%s: layer %d has %d component(s), %d buffer(s) given"
                              % (target, layer, ncomp, len(given)))
            for c in range(ncomp):
                u, what, tb = layer * 2 + c, "buffers[%d][%d]" % (layer, c), \
                    geometry.token_bytes(layer, c)
                pstr[u], tstr[u] = tpp * tb, tb
                sizes[u] = num_pages * tpp * tb
                if not is_contiguous(comps[c]):
                    strided = True
                    pstr[u], tstr[u], sizes[u] = strided_view(comps[c], what, num_pages, tpp, tb)
                addr, obj = buffer_address(comps[c], what, sizes[u], is_contiguous(comps[c]))
                ptrs[u] = addr  # sizes[u]: checked, the buffer holds at least this
                keep.append(obj)
        keep.extend([ptrs, sizes, pstr, tstr])
        mem.layer_bases = ctypes.cast(ptrs, ctypes.POINTER(ctypes.c_void_p))
        mem.buffer_bytes = ctypes.cast(sizes, ctypes.POINTER(ctypes.c_uint64))
        if strided:
            mem.page_strides = ctypes.cast(pstr, ctypes.POINTER(ctypes.c_uint64))
            mem.token_strides = ctypes.cast(tstr, ctypes.POINTER(ctypes.c_uint64))
    else:
        if base is None or buffers is not None:
            raise invalid("%s: a page-first geometry takes base=<one buffer of pages>" % target)
        addr, obj = buffer_address(base, "base", num_pages * gi["bytes_per_page"])
        mem.base = addr
        keep.append(obj)
    return mem, keep


class Cache(Handle):
    """A kvt_cache: one rank's tiers, index and transfer workers.

    ``Cache(config, geometry)`` copies both (they may be closed after).
    Thread-safe like the C API. Timeouts are in seconds (>= 0)."""

    _destroy = lib.kvt_cache_destroy

    def __init__(self, config, geometry):
        super().__init__()
        if not isinstance(config, Config):
            raise invalid("Cache: config must be a kvtier.Config, got %s" % type(config).__name__)
        if not isinstance(geometry, Geometry):
            raise invalid("Cache: geometry must be a kvtier.Geometry, got %s" % type(geometry).__name__)
        check(self._create(lib.kvt_cache_create, config, geometry))
        self.geometry = geometry.clone()
        self.block_tokens = int(config.get("block_tokens"))
        self.num_pages = None

    def close(self):
        """Cancels every task, joins the workers, frees the tiers; then drops
        the references to the registered engine buffers. A wait in flight on
        another thread (wait, wait_layer) has its task cancelled, so it
        returns at once (wait: a TaskResult with status KVT_ECANCELED;
        wait_layer: Cancelled); other calls in flight are waited for."""
        super().close()

    def _wake(self, tasks):
        # kvt_cache_destroy cancels every task anyway; cancelling the ones
        # being waited on first ends those waits now (the C API is
        # thread-safe). A task that ended meanwhile gives NotFound: ignored.
        for task in tasks:
            lib.kvt_cache_cancel(self._h, task)

    def _after_close(self):
        if getattr(self, "geometry", None) is not None:
            self.geometry.close()

    def register_buffers(self, num_pages, buffers=None, base=None):
        """Registers the engine's host KV buffers (numpy arrays or CPU torch
        tensors): see register_memory. Allowed once. The cache keeps the
        arrays alive until it is closed."""
        mem, keep = register_memory("register_buffers", self.geometry, num_pages, buffers, base)
        self._register(mem, keep)

    def register_engine(self, engine):
        """Registers an EmulatedEngine's buffers (the engine is kept alive)."""
        self._borrow(engine)  # first: from now on the engine outlives this cache
        try:
            self._register(engine.memory(), [])
        except BaseException:
            self._unborrow(engine)
            raise

    def _register(self, mem, keep):
        if self.num_pages is not None:
            raise invalid("register: engine memory is already registered (allowed once)")
        check(self._call(lib.kvt_cache_register_memory, ctypes.byref(mem)))
        self._keep.extend(keep)
        self._keep.append(mem)
        self.num_pages = mem.num_pages

    def lookup(self, tokens=None, ns=None, keys=None, independent=False):
        """Finds the longest cached prefix of the request (tokens, namespace
        ns) and pins it; returns Match(task, matched_tokens).

        keys= instead of tokens: a keyed request, one key (bytes, or str
        encoded UTF-8; 1..256 bytes) per block of block_tokens tokens, key i's
        parent key i-1. A keyed lookup may match every key.

        independent=True (keys only; KVT_REQ_INDEPENDENT_KEYS): every key is
        a root of its own, the block it names the same as a one-key request
        of it: many pages in one call. lookup and peek match the leading run
        of stored keys; prepare_store plans the keys from the first not
        stored up to the next stored (or being stored) one."""
        req = as_request(tokens, ns, keys, independent)
        m = _lib.Match()
        check(self._call(lib.kvt_cache_lookup, req.ref(), ctypes.byref(m)))
        return Match(m.task, m.matched_tokens)

    def peek(self, tokens=None, ns=None, keys=None, independent=False):
        """How many tokens lookup would match now (an int), pinning nothing
        and making no task: nothing to cancel. Same requests and rule as
        lookup; the answer may be stale by the next lookup (blocks can be
        evicted meanwhile): load what that lookup matched."""
        req = as_request(tokens, ns, keys, independent)
        n = ctypes.c_uint32()
        check(self._call(lib.kvt_cache_peek, req.ref(), ctypes.byref(n)))
        return n.value

    def prepare_store(self, tokens=None, ns=None, keys=None, independent=False, visible=False):
        """Plans the store of the request's full blocks the cache lacks;
        returns StorePlan(task, first_token, num_tokens). keys= as for
        lookup: block i covers tokens [i * block_tokens, (i + 1) *
        block_tokens) of the page table given to launch. visible: as
        Client.prepare_store (in process a store is visible when it ends
        anyway)."""
        req = as_request(tokens, ns, keys, independent, visible)
        p = _lib.StorePlan()
        check(self._call(lib.kvt_cache_prepare_store, req.ref(), ctypes.byref(p)))
        return StorePlan(p.task, p.first_token, p.num_tokens)

    def launch(self, task, pages):
        """Starts a looked-up or prepared task; pages[i] is the engine page of
        tokens [i * tokens_per_page, ...) of the request. A load leaves
        pages given as PAGE_SKIP alone (a load starts at block 0: skip the
        pages the engine computed already)."""
        if self.num_pages is None:
            raise invalid("launch: no engine memory registered yet (register_buffers first)")
        pg = u32_array(pages, "pages")
        check(self._call(lib.kvt_cache_launch, uint(task, "task", 64), u32_ptr(pg), len(pg)))

    def wait(self, task, timeout):
        """Waits up to timeout seconds for the task; returns its TaskResult
        (whose status may be an error). Raises Timeout while it still runs,
        NotFound when unknown or already reported."""
        r = _lib.TaskResult()
        task = uint(task, "task", 64)
        check(self._call_waiting(task, lib.kvt_cache_wait, task, timeout_ms(timeout),
                                 ctypes.byref(r)))
        return _result(r)

    def try_wait(self, task):
        """The TaskResult if the task ended, else None (never blocks)."""
        r = _lib.TaskResult()
        st = self._call(lib.kvt_cache_try_wait, uint(task, "task", 64), ctypes.byref(r))
        if st == -4:  # KVT_EAGAIN
            return None
        check(st)
        return _result(r)

    def layer_event(self, task, layer, timeout):
        """For a launched load into CUDA tensors: the address of the
        cudaEvent_t that completes when layer `layer` has landed (an int; the
        engine's stream waits on it, e.g. cudaStreamWaitEvent through
        ctypes). Valid until the task's result is reported. Raises
        Unsupported for host memory."""
        task = uint(task, "task", 64)
        ev = ctypes.c_void_p()
        check(self._call_waiting(task, lib.kvt_cache_layer_event, task, uint(layer, "layer"),
                                 timeout_ms(timeout), ctypes.byref(ev)))
        return ev.value or 0

    def stream_wait_layer(self, task, layer, stream, timeout):
        """For a launched load into CUDA tensors: makes the CUDA stream
        ``stream`` (a torch.cuda.Stream, or its cuda_stream int; 0 is the
        legacy default stream) wait for layer `layer` without blocking this
        thread beyond the layer's copies being enqueued."""
        task = uint(task, "task", 64)
        handle = getattr(stream, "cuda_stream", stream)
        if not isinstance(handle, int) or handle < 0:
            raise invalid("stream_wait_layer: stream must be a CUDA stream or its handle (int)")
        check(self._call_waiting(task, lib.kvt_cache_stream_wait_layer, task,
                                 uint(layer, "layer"), ctypes.c_void_p(handle),
                                 timeout_ms(timeout)))

    def wait_layer(self, task, layer, timeout):
        """Waits until layers [0, layer] of a launched load landed."""
        task = uint(task, "task", 64)
        check(self._call_waiting(task, lib.kvt_cache_wait_layer, task, uint(layer, "layer"),
                                 timeout_ms(timeout)))

    def cancel(self, task):
        """Cancels a task (its ECANCELED result is still reported once)."""
        check(self._call(lib.kvt_cache_cancel, uint(task, "task", 64)))

    def poll(self, max_results=64):
        """Up to max_results ended tasks not yet reported (list of TaskResult)."""
        n = uint(max_results, "max_results", minimum=1)
        arr = (_lib.TaskResult * n)()
        count = ctypes.c_uint32()
        check(self._call(lib.kvt_cache_poll, arr, n, ctypes.byref(count)))
        return [_result(arr[i]) for i in range(count.value)]

    def stats(self):
        """The counters (kvt_cache_stats) as a dict."""
        s = _lib.CacheStats()
        check(self._call(lib.kvt_cache_stats_get, ctypes.byref(s)))
        return {k: getattr(s, k) for k in _lib.STATS_FIELDS}

    def flush(self, timeout):
        """Waits up to timeout seconds until stored blocks have durable SSD copies.
        (A close() meanwhile waits for it: the library has no way to end a
        flush early.)"""
        check(self._call(lib.kvt_cache_flush, timeout_ms(timeout)))
