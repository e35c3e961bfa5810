"""Scenarios E1-E7 of shared/reference/failure-scenarios.md, driven through
the SGLang-shaped connector. Each function is one rank's script over an
EmulatedRank `r` (pp2 x tp2 ranks); it raises AssertionError on a wrong
outcome. The caller checks that every rank saw the identical event stream
(r.sgl.events from r.mark on) and that loads verified (r.verified)."""
import numpy as np

import kvtier

NTOK = 64
WAIT = 10.0  # seconds: bound on every collective wait in a scenario


def tokens(seed, n=NTOK):
    """Deterministic token ids of request `seed` (equal on every rank)."""
    return np.random.default_rng(seed).integers(0, 50000, n, dtype=np.uint32)


def extended(seed):
    """Request `seed` followed by 16 new tokens."""
    return np.concatenate([tokens(seed), tokens(seed + 10**6, 16)])


def last(r, rid, kind):
    for e in reversed(r.sgl.events):
        if e.rid == kvtier.rid64(rid) and e.kind == kind:
            return e
    return None


def do_store(r, rid, seed, extra_polls=0):
    tok, pages = tokens(seed), [0, 1, 2, 3]
    r.engine.fill(tok, pages)
    r.sgl.store_kv(rid, tok, pages)
    for _ in range(extra_polls):
        r.sgl.check_completed_stores()  # rank-local: never on the wire
    r.sgl.step()
    e = last(r, rid, kvtier.EV_STORE)
    assert e is not None and e.ok, "rank %d: store of %r not started: %s" % (r.rank, rid, e)
    res = r.sgl.wait_for_store(rid, WAIT)
    assert res.ok and res.kind == kvtier.EV_STORE_DONE, "rank %d: store %r: %s" % (r.rank, rid, res)


def do_load(r, rid, seed, give_pages=True, layerwise=False, want=0):
    tok, pages = extended(seed), [8, 9, 10, 11, 12]
    r.engine.poison(pages)
    hit = r.sgl.lookup_kv(tok, rid)
    pl = r.sgl.start_load_kv_layerwise(rid, pages) if give_pages and layerwise else (
        r.sgl.start_load_kv(rid, pages) if give_pages else None)
    if not give_pages:
        r.sgl.release_pending(rid)  # e.g. the page allocation failed
    r.sgl.step()
    e = last(r, rid, kvtier.EV_LOAD)
    assert e is not None, "rank %d: no load decision for %r" % (r.rank, rid)
    if not e.ok:
        assert want != 0, "rank %d: load of %r refused: %s" % (r.rank, rid, e)
        return e
    want = 0 if want is None else want  # None: refusal or success both fine
    assert pl is not None and pl.ok and pl.tokens == e.tokens <= hit
    if layerwise:
        for layer in range(r.num_layers):
            pl.wait_layer(layer, WAIT)
    res = r.sgl.wait_for_load(rid, WAIT)
    assert res.status == want, "rank %d: load of %r gave %s, want %s" % (
        r.rank, rid, kvtier.status_name(res.status), kvtier.status_name(want))
    if res.ok:
        v = r.engine.verify(tok, pages, 0, pl.tokens)
        assert v.mismatches == 0, "rank %d: %r: %d bytes differ from token %d layer %d" % (
            r.rank, rid, v.mismatches, v.first_bad_token, v.first_bad_layer)
        r.verified += v.bytes_checked
    return res


def sc_basic(r):
    do_store(r, "req-1", 11)
    do_load(r, "req-2", 11)


def sc_e1(r):
    """E1: the leader polls completions from its eviction path."""
    do_store(r, 1, 21, 5 if r.rank == 0 else 0)
    do_store(r, 3, 22, 3 if r.rank == 0 else 0)
    do_load(r, 2, 21)


def sc_e2(r):
    """E2: a receiver's page allocation fails, so it skips the load."""
    do_store(r, 1, 31)
    do_load(r, 2, 31, give_pages=r.rank != 1, layerwise=True, want=kvtier.STATUS["ECANCELED"])
    assert last(r, 2, kvtier.EV_LOAD).rank == 1
    do_store(r, 4, 32)  # the next store is not misread
    do_load(r, 5, 31, layerwise=True)


def sc_e3(r):
    """E3: the leader does not reach its load (its allocation failed)."""
    do_store(r, 1, 41)
    do_load(r, 2, 41, give_pages=r.rank != 0, layerwise=True, want=kvtier.STATUS["ECANCELED"])
    do_load(r, 3, 41, layerwise=True)


def sc_e3_raise(r):
    """E3 (raise): the leader raises before its step; every rank aborts
    within 2T with the reason, recomputes, then the group re-forms."""
    import time
    do_store(r, 1, 51)
    tok = extended(51)
    r.sgl.lookup_kv(tok, 2)
    r.sgl.start_load_kv_layerwise(2, [8, 9, 10, 11, 12])
    t0 = time.monotonic()
    if r.rank == 0:
        r.sgl.abort("assertion in start_load_kv_layerwise")
    try:
        r.sgl.step()
        raise AssertionError("rank %d: step after the abort did not fail" % r.rank)
    except kvtier.GroupAborted as e:
        assert "raised: assertion in start_load_kv_layerwise" in str(e), str(e)
    assert time.monotonic() - t0 < 2 * r.timeout + 0.5, "abort seen late"
    try:
        r.sgl.lookup_kv(tok, 9)
        raise AssertionError("lookup after abort did not fail")
    except kvtier.GroupAborted:
        pass
    for _ in range(200):  # nothing stays pinned or in flight
        r.connector.poll()
        if r.cache.stats()["tasks_in_flight"] == 0:
            break
        time.sleep(0.005)
    assert r.cache.stats()["tasks_in_flight"] == 0
    r.sgl.reform(5.0)
    assert r.group.info().epoch == 2
    r.mark = len(r.sgl.events)  # compare only the new epoch's events
    do_load(r, 3, 51)


def sc_e4(r):
    """E4: a receiver polls under memory pressure while the leader stores
    (even an empty store: already cached)."""
    do_store(r, 1, 61, 7 if r.rank == 2 else 0)
    do_store(r, 2, 61, 2 if r.rank == 3 else 0)
    do_load(r, 3, 61)


def sc_e5(r, seed=1):
    """E5: seeded rank-local asymmetry: extra polls, skipped stores and
    loads; the streams never shift, every load that succeeds verifies."""
    rng = np.random.default_rng(seed * 1000 + r.rank)
    for it in range(10):
        rid, s = 100 + 2 * it, 70 + it % 3
        tok, pages = tokens(s), [0, 1, 2, 3]
        r.engine.fill(tok, pages)
        if rng.integers(10) != 0:
            r.sgl.store_kv(rid, tok, pages)
        for _ in range(int(rng.integers(4))):
            r.sgl.check_completed_stores()
        r.sgl.step()
        e = last(r, rid, kvtier.EV_STORE)
        if e is not None and e.ok:
            assert r.sgl.wait_for_store(rid, WAIT).ok
        elif rid in r.sgl._stores or kvtier.rid64(rid) in r.sgl._stores:
            raise AssertionError("store %d neither refused nor started" % rid)
        give = rng.integers(5) != 0
        res = do_load(r, rid + 1, s, give_pages=give, layerwise=bool(it % 2), want=None)
        assert res.kind in (kvtier.EV_LOAD, kvtier.EV_LOAD_DONE)
    r.sgl.step()


def sc_e6(r):
    """E6: the leader's layer counter and generation reach every rank."""
    do_store(r, 1, 81)
    for rid in range(2, 8):
        do_load(r, rid, 81, layerwise=True)
    a, b = last(r, 2, kvtier.EV_LOAD), last(r, 7, kvtier.EV_LOAD)
    assert b.generation == a.generation + 5, (a, b)
    # The leader hands out a counter no running load holds; these loads run
    # one after another, so each gets the first free one.
    assert a.counter == 0 and b.counter == 0, (a, b)


def sc_e7(r):
    """E7: a load failing on the leader only is failed on every rank."""
    do_store(r, 1, 91)
    tok = extended(91)
    r.sgl.lookup_kv(tok, 2)
    # A page past the engine's memory is refused at the rank's own call (the
    # lookup stays queued); too few pages for the agreed prefix fail only at
    # the step, on the leader here.
    try:
        r.sgl.start_load_kv(2, [8, 9999, 10, 11, 12])
        raise AssertionError("a page past the engine's memory was queued")
    except kvtier.InvalidArgument as e:
        assert "pages[1] is 9999" in str(e), e
    r.sgl.start_load_kv(2, [8] if r.rank == 0 else [8, 9, 10, 11, 12])
    r.sgl.step()
    res = r.sgl.wait_for_load(2, WAIT)
    assert not res.ok and res.rank == 0 and res.tokens == 0, res
    do_load(r, 3, 91)  # the prefix is still usable


def sc_mismatch(r):
    """Request bytes differ on rank 3: nothing is stored under them."""
    tok, pages = tokens(999 if r.rank == 3 else 101), [0, 1, 2, 3]
    r.engine.fill(tok, pages)
    r.sgl.store_kv(1, tok, pages)
    r.sgl.step()
    e = last(r, 1, kvtier.EV_STORE)
    assert e.status == kvtier.STATUS["EPROTO"] and e.rank == 3, e
    assert 1 in r.sgl.check_completed_stores()
    r.sgl.reset()
    r.sgl.step()
    assert last(r, 0, kvtier.EV_RESET) is not None


def sc_step_skew(r):
    """Rank 3 passes another step number (it skipped iterations): every
    rank's step raises at once, naming rank 3 and both numbers; events
    carry their step's number; after reform the ranks step again."""
    do_store(r, 1, 61)          # the adapter numbers its own steps 1, 2, ...
    n = r.sgl.steps
    assert all(e.step >= 1 and e.step <= n for e in r.sgl.events), r.sgl.events
    mine = n + 1 if r.rank != 3 else n + 3
    try:
        r.sgl.step(mine)
        raise AssertionError("rank %d: a skewed step did not fail" % r.rank)
    except kvtier.GroupAborted as e:
        want = ("step skew: rank 3 (pp1 cp0 tp1) calls step %d while rank 0 (pp0 cp0 tp0) "
                "calls step %d" % (n + 3, n + 1))
        assert want in str(e), str(e)
    r.sgl.reform(5.0)
    r.mark = len(r.sgl.events)
    do_store(r, 2, 62)


SCENARIOS = {n[3:]: f for n, f in list(globals().items()) if n.startswith("sc_")}


def run_rank(r, name):
    """Runs scenario `name` on rank r; returns a JSON-able summary."""
    r.mark, r.verified = 0, 0
    SCENARIOS[name](r)
    return {"rank": r.rank, "verified": r.verified,
            "events": [list(e) for e in r.sgl.events[r.mark:]]}
