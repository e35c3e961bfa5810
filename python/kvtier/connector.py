"""The multi-rank connector (kvt_conn_*), one per rank over that rank's
Cache and its Group.

Per scheduler iteration a rank makes any number of rank-local calls
(lookup, load, store, poll, reset) and then exactly ONE collective
``step()``; the sync leader decides for every rank and every rank receives
the identical list of events. See docs/protocol.md."""
import ctypes
from collections import namedtuple

from . import _lib
from ._arrays import as_request, timeout_ms, u32_array, u32_ptr, uint
from ._handle import Handle
from .cache import Cache
from .errors import KVT_EABORTED, GroupAborted, StateError, check, invalid, status_name
from .group import _NET_WAIT, Group

lib = _lib.lib

EV_LOAD, EV_STORE, EV_LOAD_DONE, EV_STORE_DONE, EV_RESET = 1, 2, 3, 4, 5
EVENT_NAMES = {1: "LOAD", 2: "STORE", 3: "LOAD_DONE", 4: "STORE_DONE", 5: "RESET"}


class Event(namedtuple("Event", "rid kind status tokens rank counter generation step")):
    """One decision or group result of a step (kvt_conn_event). kind is one
    of EV_LOAD, EV_STORE (decisions), EV_LOAD_DONE, EV_STORE_DONE (group
    results), EV_RESET; status 0 is OK, else the first failing `rank`'s;
    step is the engine's step number of the step that emitted it."""

    @property
    def ok(self):
        """True when status is KVT_OK."""
        return self.status == 0

    def __str__(self):
        return "%s(rid=%d, %s, tokens=%d, rank=%d, counter=%d, gen=%d, step=%d)" % (
            EVENT_NAMES.get(self.kind, self.kind), self.rid, status_name(self.status),
            self.tokens, self.rank, self.counter, self.generation, self.step)


class Connector(Handle):
    """kvt_conn over `group` and `cache` (both kept alive; closing either
    closes the connector first). The connector owns the cache's task
    reporting: do not wait/poll/cancel cache tasks directly while it lives.
    rid: the engine's request id, an integer in [0, 2**64). close() from
    another thread while a step or reform runs interrupts the group's net
    (kvt_net_interrupt): the call raises within milliseconds and the net is
    good only for closing afterwards; a wait_layer meanwhile ends by its own
    timeout."""

    _destroy = lib.kvt_conn_destroy

    def __init__(self, group, cache):
        super().__init__()
        if not isinstance(group, Group):
            raise invalid("Connector: group must be a kvtier.Group")
        if not isinstance(cache, Cache):
            raise invalid("Connector: cache must be a kvtier.Cache")
        self._borrow(group, cache)
        check(self._create(lib.kvt_conn_create, group, cache))
        self.group, self.cache = group, cache

    def lookup(self, rid, tokens, ns=None):
        """Rank-local: looks the request up in this rank's cache (pinning the
        match) and queues it for the next step; returns this rank's match."""
        req = as_request(tokens, ns)
        local = ctypes.c_uint32()
        check(self._call(lib.kvt_conn_lookup, uint(rid, "rid", 64), req.ref(), ctypes.byref(local)))
        return local.value

    def load(self, rid, pages, layerwise=False):
        """Rank-local: this rank has pages for rid's looked-up prefix and wants
        it loaded. Not calling it makes the step refuse the load everywhere."""
        pg = u32_array(pages, "pages")
        check(self._call(lib.kvt_conn_load, uint(rid, "rid", 64), u32_ptr(pg), len(pg),
                         1 if layerwise else 0))

    def store(self, rid, tokens, pages, ns=None):
        """Rank-local: plans the store of the request's blocks this rank lacks
        and queues it; it starts only if every rank queued the same request."""
        req = as_request(tokens, ns)
        pg = u32_array(pages, "pages")
        check(self._call(lib.kvt_conn_store, uint(rid, "rid", 64), req.ref(), u32_ptr(pg), len(pg)))

    def reset(self):
        """Rank-local: asks for a group-wide reset at the next step."""
        check(self._call(lib.kvt_conn_reset))

    def poll(self):
        """Rank-local, never on the wire: collects this rank's ended tasks for
        the next step; returns how many ended."""
        n = ctypes.c_uint32()
        check(self._call(lib.kvt_conn_poll, ctypes.byref(n)))
        return n.value

    def wait_layer(self, rid, layer, timeout):
        """Waits up to timeout seconds until layers [0, layer] of rid's running
        load landed (may be called from another thread than step's)."""
        check(self._call(lib.kvt_conn_wait_layer, uint(rid, "rid", 64), uint(layer, "layer"),
                         timeout_ms(timeout)))

    def step(self, step):
        """THE collective: every rank calls it once per scheduler iteration
        with the engine's iteration number `step` (an int in [0, 2**64), the
        same on every rank for the same iteration). Returns this step's
        events (identical on every rank). Raises GroupAborted, with the
        group's diagnostic, when the group aborted - also when ranks passed
        different step numbers (this rank's tasks are cancelled; recompute,
        then reform())."""
        st = self._call_waiting(_NET_WAIT, lib.kvt_conn_step, uint(step, "step", 64))
        if st == KVT_EABORTED:
            msg = _lib.cstr(lib.kvt_last_error())
            try:
                msg = self.group.diagnostic or msg
            except StateError:  # the group is being closed
                pass
            raise GroupAborted(st, msg)
        check(st)
        return self.events()

    def events(self):
        """Drains the pending events, oldest first (step() already does)."""
        out = []
        buf = (_lib.ConnEvent * 256)()
        n = ctypes.c_uint32()
        while True:
            check(self._call(lib.kvt_conn_events, buf, 256, ctypes.byref(n)))
            out.extend(Event(*(getattr(buf[i], f) for f, _ in _lib.ConnEvent._fields_))
                       for i in range(n.value))
            if n.value < 256:
                return out

    def reform(self, timeout):
        """Re-forms the group under a new epoch (every rank) and clears the state."""
        check(self._call_waiting(_NET_WAIT, lib.kvt_conn_reform, timeout_ms(timeout)))

    def _wake(self, keys):
        lib.kvt_net_interrupt(self.group.net._h)
