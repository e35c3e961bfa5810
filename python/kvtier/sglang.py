"""A connector shaped like SGLang's FlexKV connector, on kvt_conn.

The method names are FlexKV's (lookup_kv, start_load_kv_layerwise,
retrieve-style start_load_kv, store_kv, check_completed_stores,
wait_for_store, release_pending, reset). What differs, on purpose: none of
them sends anything. They queue rank-local work, and ``step()`` - called
exactly once per scheduler iteration on every rank, like the forward pass -
is the one collective that carries it to the sync leader and brings back
the decisions. So a rank whose allocation failed (it skips a load), whose
eviction path polls completions (extra calls), or whose store plan differs
cannot shift any message stream (seeds 000-002, scenarios E1-E7):

    hit = conn.lookup_kv(token_ids, rid)        # local match, pinned
    load = conn.start_load_kv_layerwise(rid, pages_for(hit))
    conn.store_kv(other_rid, other_tokens, other_pages)
    conn.step()                                 # once per iteration, every rank
                                                # (or conn.step(forward_ct))
    if load.ok:                                 # agreed prefix: load.tokens
        for layer in range(num_layers):
            load.wait_layer(layer, timeout=5)   # then run that layer
    for rid in conn.check_completed_stores():   # free those pages
        ...

Request ids may be str (as in SGLang) or int; a str rid is mapped to a
64-bit id with BLAKE2b, identically on every rank.
"""
import hashlib

from ._arrays import timeout_ms, uint
from .connector import (Event, EV_LOAD, EV_LOAD_DONE, EV_RESET, EV_STORE, EV_STORE_DONE,
                        Connector)
from .errors import STATUS, StateError, Timeout, invalid, make_error, status_name


def rid64(rid):
    """The 64-bit connector id of an engine request id (int or str)."""
    if isinstance(rid, bool):
        raise invalid("rid: expected int or str, got bool")
    if isinstance(rid, int):
        return uint(rid, "rid", 64)
    if isinstance(rid, str):
        if not rid:
            raise invalid("rid is an empty string")
        return int.from_bytes(hashlib.blake2b(rid.encode(), digest_size=8).digest(), "little")
    raise invalid("rid: expected int or str, got %s" % type(rid).__name__)


class PendingLoad:
    """A load queued by start_load_kv[_layerwise]; resolved by the next step.

    Before that step ``decided`` is False. Then ``status`` (0 = started,
    else why every rank refused it), ``tokens`` (the agreed prefix, the same
    on every rank), ``counter`` and ``generation`` (the leader's layer
    counter, the same on every rank). ``result`` is the group result (an
    Event) once a later step brought it; ``done`` tells whether it has."""

    def __init__(self, owner, rid, layerwise):
        self._owner = owner
        self.rid = rid
        self.layerwise = layerwise
        self.decided = False
        self.status = None
        self.tokens = 0
        self.counter = None
        self.generation = None
        self.refused_by = None
        self.decision = None
        self.result = None

    @property
    def ok(self):
        """True when the step started the load on every rank."""
        return self.decided and self.status == 0

    @property
    def done(self):
        """True once the group result arrived (result is set)."""
        return self.result is not None

    def wait_layer(self, layer, timeout):
        """Waits until layers [0, layer] landed in this rank's pages."""
        if not self.decided:
            raise StateError(STATUS["ESTATE"], "wait_layer: the load of rid %r is not decided "
                             "yet: call step() first" % (self.rid,))
        if self.status != 0:
            raise make_error(self.status, "wait_layer: the load of rid %r was refused (%s, "
                             "rank %s)" % (self.rid, status_name(self.status), self.refused_by))
        if self.done:  # ended: its result says how
            if not self.result.ok:
                raise make_error(self.result.status, "wait_layer: the load of rid %r failed "
                                 "on rank %d" % (self.rid, self.result.rank))
            return
        self._owner.conn.wait_layer(rid64(self.rid), layer, timeout)

    def __repr__(self):
        return "PendingLoad(rid=%r, decided=%s, status=%s, tokens=%d, done=%s)" % (
            self.rid, self.decided, None if self.status is None else status_name(self.status),
            self.tokens, self.done)


class SGLangConnector:
    """FlexKV-shaped methods over a kvtier Connector (one per rank).

    ``ns`` (bytes or str) is this model's namespace (LoRA id, cache salt),
    hashed into every block; per-call ns overrides it."""

    def __init__(self, connector, ns=None):
        if not isinstance(connector, Connector):
            raise invalid("SGLangConnector: expected a kvtier.Connector")
        self.conn = connector
        self.ns = ns
        self._names = {}          # rid64 -> engine rid
        self._loads = {}          # rid64 -> PendingLoad (until its result)
        self._stores = {}         # rid64 -> decision Event or None (queued)
        self._completed = []      # engine rids whose store ended (group result)
        self.store_results = {}   # engine rid -> STORE_DONE Event (or refusal)
        self.load_results = {}    # engine rid -> ended PendingLoad (result or refusal)
        self.events = []          # every event of every step, in order
        self.steps = 0            # steps completed this epoch (step()'s default number)

    def _id(self, rid):
        r = rid64(rid)
        prev = self._names.get(r)
        if prev is not None and prev != rid:
            raise invalid("rid %r collides with live rid %r" % (rid, prev))
        return r

    def _name(self, r):
        return self._names.get(r, r)

    # --- rank-local calls -------------------------------------------------
    def lookup_kv(self, token_ids, rid, ns=None):
        """Looks the request up in this rank's cache (pinning the match) and
        queues it for the next step. Returns this rank's match in tokens: an
        upper bound of the agreed prefix, so pages for that many tokens
        suffice for the load."""
        r = self._id(rid)
        hit = self.conn.lookup(r, token_ids, self.ns if ns is None else ns)
        self._names[r] = rid
        return hit

    lookup = lookup_kv

    def start_load_kv_layerwise(self, rid, pages):
        """Queues a layerwise load of rid's looked-up prefix into `pages` (the
        request's page table; with one token per page, SGLang's slot mapping).
        Returns a PendingLoad the next step() resolves."""
        return self._start(rid, pages, True)

    def start_load_kv(self, rid, pages):
        """Queues a whole (not layerwise) load; see start_load_kv_layerwise."""
        return self._start(rid, pages, False)

    def _start(self, rid, pages, layerwise):
        r = self._id(rid)
        if r in self._loads and not self._loads[r].decided:
            raise invalid("start_load_kv: rid %r already has a load queued" % (rid,))
        self.conn.load(r, pages, layerwise)
        pl = PendingLoad(self, rid, layerwise)
        self._loads[r] = pl
        return pl

    def release_pending(self, rid):
        """A looked-up rid that will not be loaded (e.g. its allocation
        failed): nothing to send - the next step refuses its load on every
        rank (ECANCELED) and releases the pins."""
        self._id(rid)

    def store_kv(self, rid, token_ids, pages, ns=None):
        """Queues the store of the request's full blocks this rank lacks, from
        `pages`. It starts at the next step only if every rank queued the same
        request bytes; keep the pages unchanged until check_completed_stores
        (or wait_for_store) reports rid."""
        r = self._id(rid)
        if r in self._stores:
            raise invalid("store_kv: rid %r already has a store in flight" % (rid,))
        self.conn.store(r, token_ids, pages, self.ns if ns is None else ns)
        self._names[r] = rid
        self._stores[r] = None

    def check_completed_stores(self):
        """Returns the rids whose store ended (on every rank) since the last
        call - their pages may be reused. Rank-local: it polls this rank's
        ended tasks (reported at the next step) and sends nothing, so calling
        it any number of times on any rank is safe. A store's status is in
        store_results[rid]."""
        self.conn.poll()
        out, self._completed = self._completed, []
        return out

    def reset(self):
        """Asks for a group-wide reset at the next step: every rank's tasks are
        cancelled there (pending loads resolve as refused)."""
        self.conn.reset()

    def wait_layer(self, rid, layer, timeout):
        """wait_layer of rid's PendingLoad."""
        pl = self._loads.get(rid64(rid))
        if pl is None:
            raise invalid("wait_layer: rid %r has no load" % (rid,))
        pl.wait_layer(layer, timeout)

    # --- the collective ---------------------------------------------------
    def step(self, step=None):
        """The one collective per scheduler iteration (every rank calls it).
        step: the engine's forward-step number (the same on every rank);
        None numbers this adapter's own calls (1, 2, ... per epoch). Applies
        and returns this step's events. Raises GroupAborted with the
        diagnostic when the group aborted - also when the ranks' step
        numbers differ; every pending load then counts as refused and the
        engine recomputes."""
        try:
            evs = self.conn.step(self.steps + 1 if step is None else step)
        except Exception as e:
            if getattr(e, "status", None) == STATUS["EABORTED"]:
                self._drop_all(STATUS["EABORTED"])
            raise
        self.steps += 1
        for e in evs:
            self._apply(e)
        self.events.extend(evs)
        self._trim()
        return evs

    KEEP_RESULTS = 4096  #: ended rids remembered in store_results / load_results

    def _trim(self):
        for d in (self.store_results, self.load_results):
            while len(d) > self.KEEP_RESULTS:
                del d[next(iter(d))]
        if len(self.events) > 4 * self.KEEP_RESULTS:
            del self.events[:len(self.events) - 4 * self.KEEP_RESULTS]

    def _apply(self, e):
        if e.kind == EV_RESET:
            self._drop_all(STATUS["ECANCELED"])
            return
        name = self._name(e.rid)
        if e.kind == EV_LOAD:
            pl = self._loads.get(e.rid)
            if pl is not None:
                pl.decided, pl.status, pl.tokens = True, e.status, e.tokens
                pl.counter, pl.generation, pl.refused_by = e.counter, e.generation, e.rank
                pl.decision = e
                if e.status != 0:
                    self.load_results[name] = self._loads.pop(e.rid)
        elif e.kind == EV_LOAD_DONE:
            pl = self._loads.pop(e.rid, None)
            if pl is not None:
                pl.result = e
                self.load_results[name] = pl
        elif e.kind == EV_STORE:
            if e.rid in self._stores:
                self._stores[e.rid] = e
                if e.status != 0:  # refused: no result will follow
                    del self._stores[e.rid]
                    self.store_results[name] = e
                    self._completed.append(name)
        elif e.kind == EV_STORE_DONE:
            self._stores.pop(e.rid, None)
            self.store_results[name] = e
            self._completed.append(name)

    def _drop_all(self, status):
        for pl in self._loads.values():
            if not pl.decided:
                pl.decided, pl.status = True, status
            elif pl.result is None:
                pl.result = Event(pl.rid if isinstance(pl.rid, int) else rid64(pl.rid),
                                  EV_LOAD_DONE, status, 0, 0, 0, 0)
            self.load_results[pl.rid] = pl
        self._loads.clear()
        for r in list(self._stores):
            self._completed.append(self._name(r))
        self._stores.clear()

    def wait_for_store(self, rid, timeout):
        """COLLECTIVE: steps until rid's store has its group result, then
        returns that Event (status 0: stored on every rank). Every rank must
        call it at the same point of its iteration (all ranks see the result
        in the same step, so they leave together). Raises Timeout after
        `timeout` seconds."""
        return self._await(rid, timeout, store=True)

    def wait_for_load(self, rid, timeout):
        """COLLECTIVE, like wait_for_store: steps until rid's load has its
        group result and returns that Event (a load refused by that step
        returns its refusal Event)."""
        return self._await(rid, timeout, store=False)

    def _await(self, rid, timeout, store):
        import time
        r = rid64(rid)
        ms = timeout_ms(timeout)
        deadline = time.monotonic() + ms / 1000.0
        name = self._name(r)
        pl = None
        if store:
            if r not in self._stores and name not in self.store_results:
                raise invalid("wait_for_store: rid %r has no store" % (rid,))
        else:
            pl = self._loads.get(r) or self.load_results.get(name)
            if pl is None:
                raise invalid("wait_for_load: rid %r has no load" % (rid,))
        while True:
            if store and r not in self._stores:
                return self.store_results[name]
            if not store:
                if pl.done:
                    return pl.result
                if pl.decided and pl.status != 0:
                    return pl.decision  # refused: no result will come
            if time.monotonic() >= deadline:
                raise Timeout(STATUS["ETIMEDOUT"], "wait_for_%s: rid %r has no group result "
                              "after %.3f s" % ("store" if store else "load", rid, ms / 1000.0))
            if not self.step():
                time.sleep(0.001)

    # --- failures ---------------------------------------------------------
    def abort(self, reason):
        """Aborts the group (an engine exception handler): every rank's next
        (or current) step raises GroupAborted naming `reason`."""
        self.conn.group.abort(reason)

    def reform(self, timeout):
        """Re-forms the group (every rank; the leader agrees the epoch) and clears state."""
        self.conn.reform(timeout)
        self.steps = 0            # step() without a number counts from 1 again
        self._loads.clear()
        self._stores.clear()
        self._completed = []
