"""A client of the node server (kvt_client_*): ``kvtier serve`` owns the
node's cache; engine processes attach to it over a Unix socket and share
its CPU and SSD tiers (docs/server.md).

``Client`` has the surface of ``Cache`` (lookup / prepare_store / launch /
wait / wait_layer / try_wait / poll / cancel / stats / flush, keys=
included) plus ``attach``'s socket and geometry. Its copies run on this
process's threads, between the engine buffers registered here and the
server's tier mapped into this process.
"""
import ctypes
import logging
import threading
import time

from . import _lib
from ._arrays import as_request, ns_bytes, timeout_ms, u32_array, u32_ptr, uint
from ._handle import Handle, call
from .cache import Match, StorePlan, _result, register_memory
from .config import Geometry
from .errors import STATUS, ConnectionFailure, KvtierError, check, invalid

# What an engine plugin in node-server mode tells a user who set `workers`:
# the tiers' options are the server's, but a client's own copy threads are
# the workers option read from this process's environment at attach.
WORKERS_HINT = ("; `workers` (this process's own copy threads) comes from KVTIER_WORKERS in "
                "its environment")

lib = _lib.lib


class Client(Handle):
    """A kvt_client attached to the server at ``socket``.

    ``Client(socket, geometry, timeout_ms=2000)``: geometry must equal the
    server's (GeometryMismatch names the field otherwise); timeout_ms is the
    attach deadline (retrying the connect, so a client may start before its
    server) and the deadline of every later round trip. A lost server gives
    ConnectionFailure naming the socket; later calls re-attach on their own.
    Thread-safe like the C API. Task timeouts are in seconds (>= 0)."""

    _destroy = lib.kvt_client_detach

    def __init__(self, socket, geometry, timeout_ms=2000):
        super().__init__()
        if not isinstance(socket, (str, bytes)) or not socket:
            raise invalid("Client: socket must be the server's socket path (str), got %r"
                          % (socket,))
        if not isinstance(geometry, Geometry):
            raise invalid("Client: geometry must be a kvtier.Geometry, got %s"
                          % type(geometry).__name__)
        if isinstance(timeout_ms, bool) or not isinstance(timeout_ms, int) or timeout_ms <= 0:
            raise invalid("Client: timeout_ms must be a positive int (milliseconds), got %r"
                          % (timeout_ms,))
        path = socket.encode() if isinstance(socket, str) else socket
        self.socket = path.decode("utf-8", "replace")
        check(self._create(lib.kvt_client_attach, path, geometry, timeout_ms))
        self.geometry = geometry.clone()
        self.timeout_ms = timeout_ms
        self.num_pages = None
        # The server's block size in tokens (its block_tokens option).
        gi = self.geometry.info()
        self.block_tokens = int(self.stats()["block_bytes"] // gi["bytes_per_token"])

    def close(self):
        """Detaches: cancels this client's tasks (the server releases their
        pins), joins its copy threads, unmaps the tier, closes the socket."""
        super().close()

    def _wake(self, tasks):
        for task in tasks:
            lib.kvt_client_cancel(self._h, task)

    def _after_close(self):
        if getattr(self, "geometry", None) is not None:
            self.geometry.close()

    def register_buffers(self, num_pages, buffers=None, base=None):
        """Registers the engine's KV buffers (host, or CUDA tensors of one device:
        kvt_client_register_memory pins the server's tier mapping), as
        Cache.register_buffers."""
        mem, keep = register_memory("register_buffers", self.geometry, num_pages, buffers, base)
        self._register(mem, keep)

    def register_engine(self, engine):
        """Registers an EmulatedEngine's buffers (the engine is kept alive)."""
        self._borrow(engine)
        try:
            self._register(engine.memory(), [])
        except BaseException:
            self._unborrow(engine)
            raise

    def _register(self, mem, keep):
        if self.num_pages is not None:
            raise invalid("register: engine memory is already registered (allowed once)")
        check(self._call(lib.kvt_client_register_memory, ctypes.byref(mem)))
        self._keep.extend(keep)
        self._keep.append(mem)
        self.num_pages = mem.num_pages

    def lookup(self, tokens=None, ns=None, keys=None, independent=False):
        """As Cache.lookup, answered by the server: Match(task, matched_tokens)."""
        req = as_request(tokens, ns, keys, independent)
        m = _lib.Match()
        check(self._call(lib.kvt_client_lookup, req.ref(), ctypes.byref(m)))
        return Match(m.task, m.matched_tokens)

    def peek(self, tokens=None, ns=None, keys=None, independent=False):
        """As Cache.peek, one round trip to the server: the int lookup would
        match now, nothing pinned, no task to cancel."""
        req = as_request(tokens, ns, keys, independent)
        n = ctypes.c_uint32()
        check(self._call(lib.kvt_client_peek, req.ref(), ctypes.byref(n)))
        return n.value

    def peek_many(self, requests):
        """peek of several requests in one round trip to the server: a list
        of ints. requests: dicts of peek's arguments (tokens= or keys=, ns=,
        independent=). A request that fails (AUTH: a namespace this client
        may not use) raises its KvtierError, as peek would."""
        creqs = [as_request(r.get("tokens"), r.get("ns"), r.get("keys"),
                            r.get("independent", False)) for r in requests]
        n = len(creqs)
        if n == 0:
            return []
        arr = (_lib.Request * n)(*[r.c for r in creqs])
        matched = (ctypes.c_uint32 * n)()
        status = (ctypes.c_int * n)()
        check(self._call(lib.kvt_client_peek_many, arr, n, matched, status))
        for i in range(n):
            if status[i]:
                check(status[i], "peek_many: request %d" % i)
        return list(matched)

    def clear(self, ns=None):
        """Removes every block stored under namespace ns (str or bytes;
        None: the default) from the server's tier of this client's
        geometry, CPU and SSD, by any client: (removed, kept), kept being
        blocks pinned now (loads in flight), left for a later clear.
        KvtierError (AUTH) when the server's server_namespaces does not
        allow this client the namespace."""
        raw = ns_bytes(ns)
        buf = ctypes.create_string_buffer(raw, max(1, len(raw)))
        removed, kept = ctypes.c_uint32(), ctypes.c_uint32()
        check(self._call(lib.kvt_client_clear, ctypes.cast(buf, ctypes.c_void_p) if raw else None,
                         len(raw), ctypes.byref(removed), ctypes.byref(kept)))
        return removed.value, kept.value

    def prepare_store(self, tokens=None, ns=None, keys=None, independent=False, visible=False):
        """As Cache.prepare_store: StorePlan(task, first_token, num_tokens).
        visible=True (KVT_REQ_VISIBLE_AT_END): the task's wait returns only
        once every other client can find its blocks (the server committed
        them), in the same round trip; no stats() call needed to publish."""
        req = as_request(tokens, ns, keys, independent, visible)
        p = _lib.StorePlan()
        check(self._call(lib.kvt_client_prepare_store, req.ref(), ctypes.byref(p)))
        return StorePlan(p.task, p.first_token, p.num_tokens)

    def launch(self, task, pages):
        """Starts a planned task; this process copies between its pages and
        the server's tier (a load's SSD blocks are read back first). A load
        leaves pages given as PAGE_SKIP alone, as Cache.launch."""
        if self.num_pages is None:
            raise invalid("launch: no engine memory registered yet (register_buffers first)")
        pg = u32_array(pages, "pages")
        check(self._call(lib.kvt_client_launch, uint(task, "task", 64), u32_ptr(pg), len(pg)))

    def wait(self, task, timeout):
        """The task's TaskResult (reported when its copy ended; kvtier.h), waiting up to timeout s."""
        r = _lib.TaskResult()
        task = uint(task, "task", 64)
        check(self._call_waiting(task, lib.kvt_client_wait, task, timeout_ms(timeout),
                                 ctypes.byref(r)))
        return _result(r)

    def try_wait(self, task):
        """The TaskResult if the task ended, else None (never blocks)."""
        r = _lib.TaskResult()
        st = self._call(lib.kvt_client_wait, uint(task, "task", 64), 0, ctypes.byref(r))
        if st == STATUS["ETIMEDOUT"]:  # still running
            return None
        check(st)
        return _result(r)

    def wait_layer(self, task, layer, timeout):
        """Waits until layers [0, layer] of a launched load landed."""
        task = uint(task, "task", 64)
        check(self._call_waiting(task, lib.kvt_client_wait_layer, task, uint(layer, "layer"),
                                 timeout_ms(timeout)))

    def cancel(self, task):
        """Cancels a task (the server releases it)."""
        check(self._call(lib.kvt_client_cancel, uint(task, "task", 64)))

    def poll(self, max_results=64):
        """Up to max_results ended tasks of this client not yet reported."""
        n = uint(max_results, "max_results", minimum=1)
        arr = (_lib.TaskResult * n)()
        count = ctypes.c_uint32()
        check(self._call(lib.kvt_client_poll, arr, n, ctypes.byref(count)))
        return [_result(arr[i]) for i in range(count.value)]

    def stats(self):
        """The server's counters (every client's traffic together), a dict."""
        s = _lib.CacheStats()
        check(self._call(lib.kvt_client_stats, ctypes.byref(s)))
        return {k: getattr(s, k) for k in _lib.STATS_FIELDS}

    def flush(self, timeout):
        """Waits up to timeout s until every stored block is durable on the
        server's SSD tier."""
        check(self._call(lib.kvt_client_flush, timeout_ms(timeout)))


_logger = logging.getLogger("kvtier")


class DeferredClient:
    """A Client attached once its server answers, for the engine plugins: an
    engine must never die because the node server is down when it starts
    (a plugin constructor's exception kills vLLM and SGLang): while the
    server is not there every call raises ConnectionFailure, which the
    plugins already treat as a miss (0 hits; blocks recomputed, nothing
    stored), 
    and the attach is tried again at most every RETRY_S, a cheap probe of
    the socket first so a step never waits out a connect timeout. Buffers
    registered meanwhile are registered at the attach. Thread-safe as the
    Client is once attached; the attach itself is serialised."""

    RETRY_S = 1.0
    # A server that answers and refuses (its geometries full, another
    # declared model, another protocol version) is not fixed by the next
    # step: asked again less often, and said at error level.
    REFUSED_RETRY_S = 30.0

    def __init__(self, attach, who, path, log=None):
        self._attach, self._who, self._path = attach, who, path
        self._log = log or _logger
        self._cl, self._buffers, self._next = None, None, 0.0
        self._mu = threading.Lock()
        try:
            self._cl = attach()
        except ConnectionFailure as e:
            self._next = time.monotonic() + self.RETRY_S
            self._log.warning("kvtier: %s: the server at %s is not answering (%s): 0 hits and "
                           "nothing stored until it does; attaching again every %.0f s",
                           who, path, e, self.RETRY_S)
        except KvtierError as e:
            self._next = time.monotonic() + self.REFUSED_RETRY_S
            self._log.error("kvtier: %s: the server at %s refused this engine's attach (%s): "
                            "the engine runs without kvtier (0 hits, nothing stored); asking "
                            "again every %.0f s", who, path, e, self.REFUSED_RETRY_S)

    def _probe(self):
        import socket as _socket
        s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        s.settimeout(0.2)
        try:
            s.connect(self._path)
            return True
        except OSError:
            return False
        finally:
            s.close()

    def _client(self):
        cl = self._cl
        if cl is not None:
            return cl
        with self._mu:
            if self._cl is not None:
                return self._cl
            now = time.monotonic()
            down = ConnectionFailure(STATUS["ECONN"], "%s: the server at %s is not attached yet"
                                     % (self._who, self._path))
            if now < self._next or not self._probe():
                self._next = max(self._next, now + self.RETRY_S)
                raise down
            try:
                cl = self._attach()
                if self._buffers is not None:
                    try:
                        cl.register_buffers(*self._buffers[0], **self._buffers[1])
                    except BaseException:
                        cl.close()
                        raise
            except (KvtierError, ValueError) as e:
                refused = isinstance(e, KvtierError) and not isinstance(e, ConnectionFailure)
                self._next = now + (self.REFUSED_RETRY_S if refused else self.RETRY_S)
                self._log.warning("kvtier: %s: attaching to %s failed (%s); again in %.0f s",
                               self._who, self._path, e, self._next - now)
                raise down
            self._log.warning("kvtier: %s: attached to %s; hits from now on", self._who, self._path)
            self._cl = cl
            return cl

    def register_buffers(self, *args, **kwargs):
        with self._mu:
            if self._cl is None:
                self._buffers = (args, kwargs)
                return None
        return self._cl.register_buffers(*args, **kwargs)

    def close(self):
        with self._mu:
            cl, self._cl = self._cl, None
        if cl is not None:
            cl.close()

    def __getattr__(self, name):
        return getattr(self._client(), name)


def _read_all(fn, what, struct, args, max_entries):
    """Calls fn(*args, out, max, &count) once with room for max_entries,
    again with room for count if the server has more; the entries."""
    for _ in range(2):
        arr = (struct * max(1, max_entries))()
        count = ctypes.c_uint32()
        check(call(fn, *args, ctypes.cast(arr, ctypes.c_void_p), max_entries,
                   ctypes.byref(count)))
        if count.value <= max_entries:
            return [arr[i] for i in range(count.value)]
        max_entries = count.value
    raise KvtierError(STATUS["EFULL"], "%s: the server's list kept growing" % what)


def _path(socket):
    return socket.encode() if isinstance(socket, str) else socket


def _check_geometry(fn, geometry):
    if geometry is not None and not isinstance(geometry, Geometry):
        raise invalid("%s: geometry must be a kvtier.Geometry or None" % fn)


def _tier_dict(t):
    stats = {k: t.stats[i] for i, k in enumerate(_lib.STATS_FIELDS) if i < len(t.stats)}
    return {"geometry": t.geometry.decode(), "num_layers": t.num_layers,
            "tokens_per_page": t.tokens_per_page, "block_tokens": t.block_tokens,
            "bytes_per_token": t.bytes_per_token, "stats": stats}


def _info_dict(info):
    out = {name: getattr(info, name) for name, _ in _lib.ServerInfo._fields_}
    out["version"] = info.version.decode("utf-8", "replace")
    return out


def _quota_dict(q):
    return {"prefix": q.prefix.decode("utf-8", "replace"), "limit_bytes": q.limit_bytes,
            "used_bytes": q.used_bytes, "limited_blocks": q.limited_blocks,
            "evicted_blocks": q.evicted_blocks}


def server_tiers(socket, geometry=None, timeout=5.0):
    """The tiers of the node server at ``socket`` (kvt_server_tier_stats):
    one dict per geometry and block size (``geometry`` id, ``num_layers``,
    ``tokens_per_page``, ``block_tokens``, ``bytes_per_token`` and its
    ``stats``), on a connection that never attaches, so it works for any
    geometry the server holds. ``geometry`` (a Geometry) keeps only that
    geometry's tiers (NotFound, naming the ids it holds, when none)."""
    _check_geometry("server_tiers", geometry)
    return [_tier_dict(t) for t in _read_all(lib.kvt_server_tier_stats, "server_tiers",
                                             _lib.TierStats,
                                             (_path(socket), geometry, timeout_ms(timeout)), 8)]


def server_info(socket, timeout=5.0):
    """The node server at ``socket`` as a whole (kvt_server_info_get), on a
    connection that never attaches: a dict of ``version``, ``pid``,
    ``uptime_ms``, ``clients`` (engine clients attached now),
    ``max_clients``, ``geometries``, ``max_geometries``,
    ``cpu_capacity_bytes``, ``metrics_port`` (0: none) and ``quotas``."""
    info = _lib.ServerInfo()
    check(lib.kvt_server_info_get(_path(socket), timeout_ms(timeout), ctypes.byref(info)))
    return _info_dict(info)


def server_quotas(socket, timeout=5.0):
    """The server_quotas rules of the node server at ``socket`` and their
    use now (kvt_server_quotas): one dict per rule (``prefix``,
    ``limit_bytes``, ``used_bytes``, ``limited_blocks``,
    ``evicted_blocks``); [] for a server without quotas."""
    return [_quota_dict(q) for q in _read_all(lib.kvt_server_quotas, "server_quotas",
                                              _lib.QuotaUsage,
                                              (_path(socket), timeout_ms(timeout)), 16)]


# A STATS_ALL reply's bounds (server_max_geometries' and the quota rules'),
# so one call always has room for all of them.
_MAX_TIERS = 64
_MAX_QUOTAS = 32


def server_snapshot(socket, geometry=None, timeout=5.0):
    """server_info, server_tiers and server_quotas as one reading
    (kvt_server_snapshot; what ``kvtier stats`` shows): a dict with
    ``server``, ``tiers`` and ``quotas``, from one round trip, so they agree
    (``server["geometries"]`` counts every tier even when ``geometry``
    keeps only that geometry's)."""
    _check_geometry("server_snapshot", geometry)
    info = _lib.ServerInfo()
    tiers = (_lib.TierStats * _MAX_TIERS)()
    quotas = (_lib.QuotaUsage * _MAX_QUOTAS)()
    nt, nq = ctypes.c_uint32(), ctypes.c_uint32()
    check(call(lib.kvt_server_snapshot, _path(socket), geometry, timeout_ms(timeout),
               ctypes.byref(info), ctypes.cast(tiers, ctypes.c_void_p), _MAX_TIERS,
               ctypes.byref(nt), ctypes.cast(quotas, ctypes.c_void_p), _MAX_QUOTAS,
               ctypes.byref(nq)))
    return {"server": _info_dict(info),
            "tiers": [_tier_dict(tiers[i]) for i in range(min(nt.value, _MAX_TIERS))],
            "quotas": [_quota_dict(quotas[i]) for i in range(min(nq.value, _MAX_QUOTAS))]}
