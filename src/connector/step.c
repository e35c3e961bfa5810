/* step.c - the one collective per scheduler iteration. Every rank encodes
 * what it queued (UP); the leader decides for all (leader.c) and sends one
 * identical DOWN; every rank, the leader included, applies that DOWN by the
 * same code, so all ranks launch, cancel and report exactly the same
 * operations and see the same event stream. */
#include <stdlib.h>
#include <string.h>
#include "connector/conn.h"
#include "util/clock.h"
#include "util/log.h"

void kvt__pend_lookup_free(pend_lookup *p)
{
    free(p->tokens);
    free(p->ns);
    free(p->pages);
    p->tokens = NULL;
    p->ns = NULL;
    p->pages = NULL;
}

void kvt__pend_store_free(pend_store *p)
{
    free(p->pages);
    p->pages = NULL;
}

kvt_status kvt__conn_push_event(kvt_conn *c, const kvt_conn_event *e)
{
    kvt_status st = VEC_RESERVE(c->ev, c->ev.n + 1);
    if (st == KVT_OK) c->ev.p[c->ev.n++] = *e;
    return st;
}

kvt_status kvt__conn_push_done(kvt_conn *c, uint64_t rid, uint32_t kind, kvt_status status,
                               uint32_t tokens)
{
    kvt_status st = VEC_RESERVE(c->done, c->done.n + 1);
    if (st == KVT_OK)
        c->done.p[c->done.n++] = (kvt_result_rec){rid, kind, status, tokens, c->g->rank};
    return st;
}

kvt_status kvt__conn_poll_locked(kvt_conn *c, uint32_t *ended)
{
    kvt_task_result res[32];
    uint32_t n = 0, total = 0;
    do {
        kvt_status st = kvt_cache_poll(c->cache, res, 32, &n);
        if (st != KVT_OK) return st;
        for (uint32_t i = 0; i < n; i++) {
            /* Tasks not in `running` were cancelled by the connector itself
             * (refused, truncated, reset or aborted): nobody awaits them. */
            for (uint32_t j = 0; j < c->run.n; j++) {
                running_task *r = &c->run.p[j];
                if (r->task != res[i].task) continue;
                st = kvt__conn_push_done(c, r->rid, r->kind, res[i].status, res[i].num_tokens);
                if (st != KVT_OK) return st;
                *r = c->run.p[--c->run.n];
                total++;
                break;
            }
        }
    } while (n == 32);
    if (ended) *ended = total;
    return KVT_OK;
}

/* How long cancel_all waits for cancelled transfers to stop touching the
 * engine's pages: a transfer stops at its next layer boundary, so this is
 * far more than a healthy one needs. */
#define KVT_CONN_CANCEL_WAIT_MS 10000

kvt_status kvt__conn_cancel_all(kvt_conn *c)
{
    for (uint32_t i = 0; i < c->lk.n; i++) {
        if (c->lk.p[i].task) (void)kvt_cache_cancel(c->cache, c->lk.p[i].task);
        kvt__pend_lookup_free(&c->lk.p[i]);
    }
    for (uint32_t i = 0; i < c->st.n; i++) {
        if (c->st.p[i].task) (void)kvt_cache_cancel(c->cache, c->st.p[i].task);
        kvt__pend_store_free(&c->st.p[i]);
    }
    for (uint32_t i = 0; i < c->run.n; i++) (void)kvt_cache_cancel(c->cache, c->run.p[i].task);
    /* The engine recomputes into these pages as soon as this returns: wait
     * until every cancelled transfer has stopped writing (or reading) them. */
    uint32_t busy = 0;
    uint64_t deadline = kvt__now_ns() + KVT_CONN_CANCEL_WAIT_MS * 1000000ull;
    for (uint32_t i = 0; i < c->run.n; i++) {
        uint64_t now = kvt__now_ns();
        int64_t left = now < deadline ? (int64_t)((deadline - now) / 1000000) : 0;
        kvt_task_result res;
        if (kvt_cache_wait(c->cache, c->run.p[i].task, left, &res) == KVT_ETIMEDOUT) busy++;
    }
    c->lk.n = c->st.n = c->run.n = c->done.n = 0;
    if (busy)
        return kvt__fail(KVT_ETIMEDOUT, "%u cancelled transfers still use the engine's pages "
                         "after %d ms; do not reuse them yet", busy, KVT_CONN_CANCEL_WAIT_MS);
    return KVT_OK;
}

static kvt_status encode_up(kvt_conn *c)
{
    size_t len = kvt__wire_up_size(c->lk.n, c->st.n, c->done.n);
    kvt_status st = kvt__buf_reserve(&c->up, len);
    if (st != KVT_OK) return st;
    uint8_t *p = c->up.p;
    kvt__wire_head(p, c->reset_req ? KVT_WIRE_RESET : 0, c->lk.n, c->st.n, c->done.n);
    p += KVT_WIRE_HEAD;
    for (uint32_t i = 0; i < c->lk.n; i++, p += KVT_UPL_SIZE) {
        const pend_lookup *l = &c->lk.p[i];
        kvt_up_lookup r = {l->rid, l->digest, l->local_tokens,
                           (l->load ? KVT_UPL_LOAD : 0) | (l->layerwise ? KVT_UPL_LAYERWISE : 0)};
        kvt__wire_put_lookup(p, &r);
    }
    for (uint32_t i = 0; i < c->st.n; i++, p += KVT_UPS_SIZE) {
        kvt_up_store r = {c->st.p[i].rid, c->st.p[i].digest, c->st.p[i].num_tokens, 0};
        kvt__wire_put_store(p, &r);
    }
    for (uint32_t i = 0; i < c->done.n; i++, p += KVT_RES_SIZE)
        kvt__wire_put_result(p, &c->done.p[i]);
    c->up.len = len;
    return KVT_OK;
}

/* Starts the agreed load. A prefix shorter than this rank's own match is
 * re-looked-up truncated (the original task still pins those blocks, so the
 * shorter match is exact) before the original is cancelled. Any local
 * failure becomes this rank's result, reported to all at the next step. */
static kvt_status launch_load(kvt_conn *c, pend_lookup *p, const kvt_down_load *d)
{
    kvt_task_id task = p->task;
    kvt_status st = KVT_OK;
    if (d->tokens < p->local_tokens) {
        kvt_request req = {p->tokens, d->tokens + 1, p->ns, p->ns_len};
        kvt_match m = {0, 0};
        st = kvt_cache_lookup(c->cache, &req, &m);
        if (st != KVT_OK) /* before the cancels below clear the message */
            KVT_LOG(KVT_LOG_WARN, "connector: rank %u: rid %llu: the agreed load's lookup "
                    "failed: %s", c->g->rank, (unsigned long long)p->rid, kvt_last_error());
        if (st == KVT_OK && m.matched_tokens != d->tokens) {
            if (m.task) (void)kvt_cache_cancel(c->cache, m.task);
            st = KVT_ENOTFOUND;
        }
        (void)kvt_cache_cancel(c->cache, p->task);
        task = st == KVT_OK ? m.task : 0;
    }
    p->task = 0; /* owned by `running` now, or gone */
    if (st == KVT_OK) st = kvt_cache_launch(c->cache, task, p->pages, p->num_pages);
    if (st != KVT_OK) {
        /* The DONE event carries only the status; the why goes to the log
         * (a failed lookup above said it already). */
        if (st != KVT_ENOTFOUND && task)
            KVT_LOG(KVT_LOG_WARN, "connector: rank %u: rid %llu: the agreed load was not "
                    "launched: %s", c->g->rank, (unsigned long long)p->rid, kvt_last_error());
        if (task) (void)kvt_cache_cancel(c->cache, task);
        return kvt__conn_push_done(c, p->rid, KVT_TASK_LOAD, st, 0);
    }
    st = VEC_RESERVE(c->run, c->run.n + 1);
    if (st != KVT_OK) return st;
    c->run.p[c->run.n++] = (running_task){p->rid, KVT_TASK_LOAD, task};
    return KVT_OK;
}

static kvt_status launch_store(kvt_conn *c, pend_store *s)
{
    kvt_task_id task = s->task;
    s->task = 0;
    if (!task) return kvt__conn_push_done(c, s->rid, KVT_TASK_STORE, KVT_OK, 0);
    kvt_status st = kvt_cache_launch(c->cache, task, s->pages, s->num_pages);
    if (st != KVT_OK) {
        KVT_LOG(KVT_LOG_WARN, "connector: rank %u: rid %llu: the agreed store was not "
                "launched: %s", c->g->rank, (unsigned long long)s->rid, kvt_last_error());
        (void)kvt_cache_cancel(c->cache, task);
        return kvt__conn_push_done(c, s->rid, KVT_TASK_STORE, st, 0);
    }
    st = VEC_RESERVE(c->run, c->run.n + 1);
    if (st == KVT_OK) c->run.p[c->run.n++] = (running_task){s->rid, KVT_TASK_STORE, task};
    return st;
}

static kvt_status apply_loads(kvt_conn *c, const kvt_down_view *d)
{
    for (uint32_t i = 0; i < d->n_loads; i++) {
        kvt_down_load l = kvt__wire_get_load(d->loads + (size_t)i * KVT_DNL_SIZE);
        if (l.rank >= c->g->ranks || l.counter >= KVT_CONN_COUNTERS)
            return kvt__fail(KVT_EPROTO, "the leader's load of rid %llu names rank %u of %u, "
                             "counter %u of %u", (unsigned long long)l.rid, l.rank, c->g->ranks,
                             l.counter, KVT_CONN_COUNTERS);
        pend_lookup *p = NULL;
        for (uint32_t j = 0; j < c->lk.n && !p; j++)
            if (c->lk.p[j].rid == l.rid && !c->lk.p[j].decided) p = &c->lk.p[j];
        if (!p && l.status == KVT_OK)
            return kvt__fail(KVT_EPROTO, "the leader started a load of rid %llu that rank %u "
                             "never queued", (unsigned long long)l.rid, c->g->rank);
        kvt_status st = KVT_OK;
        if (p && l.status == KVT_OK) st = launch_load(c, p, &l);
        if (p) p->decided = true;
        kvt_conn_event e = {l.rid, KVT_EV_LOAD, l.status, l.tokens, l.rank, l.counter,
                            l.generation, c->g->step_no};
        if (st == KVT_OK) st = kvt__conn_push_event(c, &e);
        if (st != KVT_OK) return st;
    }
    return KVT_OK;
}

static kvt_status apply_stores(kvt_conn *c, const kvt_down_view *d)
{
    for (uint32_t i = 0; i < d->n_stores; i++) {
        kvt_down_store s = kvt__wire_get_sdec(d->stores + (size_t)i * KVT_DNS_SIZE);
        if (s.rank >= c->g->ranks)
            return kvt__fail(KVT_EPROTO, "the leader's store of rid %llu names rank %u of %u",
                             (unsigned long long)s.rid, s.rank, c->g->ranks);
        pend_store *p = NULL;
        for (uint32_t j = 0; j < c->st.n && !p; j++)
            if (c->st.p[j].rid == s.rid && !c->st.p[j].decided) p = &c->st.p[j];
        if (!p && s.status == KVT_OK)
            return kvt__fail(KVT_EPROTO, "the leader started a store of rid %llu that rank %u "
                             "never queued", (unsigned long long)s.rid, c->g->rank);
        kvt_status st = KVT_OK;
        if (p && s.status == KVT_OK) st = launch_store(c, p);
        if (p) p->decided = true;
        kvt_conn_event e = {s.rid, KVT_EV_STORE, s.status, 0, s.rank, 0, 0, c->g->step_no};
        if (st == KVT_OK) st = kvt__conn_push_event(c, &e);
        if (st != KVT_OK) return st;
    }
    return KVT_OK;
}

static kvt_status apply_results(kvt_conn *c, const kvt_down_view *d)
{
    for (uint32_t i = 0; i < d->n_results; i++) {
        kvt_result_rec r = kvt__wire_get_result(d->results + (size_t)i * KVT_RES_SIZE);
        if (r.rank >= c->g->ranks)
            return kvt__fail(KVT_EPROTO, "the leader's result for rid %llu names rank %u of %u",
                             (unsigned long long)r.rid, r.rank, c->g->ranks);
        kvt_conn_event e = {r.rid, r.kind == KVT_TASK_LOAD ? KVT_EV_LOAD_DONE : KVT_EV_STORE_DONE,
                            r.status, r.tokens, r.rank, 0, 0, c->g->step_no};
        kvt_status st = kvt__conn_push_event(c, &e);
        if (st != KVT_OK) return st;
    }
    return KVT_OK;
}

/* Every queued op must have been decided: the leader decides the union of
 * what all ranks queued, so an undecided one means the DOWN is not for
 * this stream. */
static kvt_status check_decided(kvt_conn *c)
{
    for (uint32_t i = 0; i < c->lk.n; i++)
        if (!c->lk.p[i].decided)
            return kvt__fail(KVT_EPROTO, "rank %u queued a lookup of rid %llu the leader did "
                             "not decide", c->g->rank, (unsigned long long)c->lk.p[i].rid);
    for (uint32_t i = 0; i < c->st.n; i++)
        if (!c->st.p[i].decided)
            return kvt__fail(KVT_EPROTO, "rank %u queued a store of rid %llu the leader did "
                             "not decide", c->g->rank, (unsigned long long)c->st.p[i].rid);
    return KVT_OK;
}

static bool queued_lookup(const kvt_conn *c, uint64_t rid)
{
    for (uint32_t j = 0; j < c->lk.n; j++)
        if (c->lk.p[j].rid == rid) return true;
    return false;
}

static bool queued_store(const kvt_conn *c, uint64_t rid)
{
    for (uint32_t j = 0; j < c->st.n; j++)
        if (c->st.p[j].rid == rid) return true;
    return false;
}

static bool has_record(const uint8_t *recs, uint32_t n, size_t size, uint64_t rid)
{
    for (uint32_t i = 0; i < n; i++)
        if (kvt__get64(recs + (size_t)i * size) == rid) return true;
    return false;
}

/* A member checks the DOWN before it acknowledges it, so that after the
 * ACK nothing but a reset whose transfers do not stop (bounded) can keep
 * it from applying: the leader applies on the ACKs. Mirrors the checks of
 * apply_*() and check_decided(), and reserves room for the events. */
static kvt_status validate_down(kvt_conn *c, const uint8_t *p, size_t len)
{
    kvt_down_view d;
    kvt_status st = kvt__wire_down_parse(p, len, &d);
    if (st != KVT_OK) return st;
    uint32_t me = c->g->rank, ranks = c->g->ranks;
    for (uint32_t i = 0; i < d.n_results; i++)
        if (kvt__wire_get_result(d.results + (size_t)i * KVT_RES_SIZE).rank >= ranks)
            return kvt__fail(KVT_EPROTO, "the leader's results name a rank beyond %u", ranks);
    for (uint32_t i = 0; i < d.n_loads && !(d.flags & KVT_WIRE_RESET); i++) {
        kvt_down_load l = kvt__wire_get_load(d.loads + (size_t)i * KVT_DNL_SIZE);
        if (l.rank >= ranks || l.counter >= KVT_CONN_COUNTERS ||
            (l.status == KVT_OK && !queued_lookup(c, l.rid)))
            return kvt__fail(KVT_EPROTO, "the leader's load of rid %llu (rank %u, counter %u) "
                             "is not one rank %u can apply", (unsigned long long)l.rid, l.rank,
                             l.counter, me);
    }
    for (uint32_t i = 0; i < d.n_stores && !(d.flags & KVT_WIRE_RESET); i++) {
        kvt_down_store s = kvt__wire_get_sdec(d.stores + (size_t)i * KVT_DNS_SIZE);
        if (s.rank >= ranks || (s.status == KVT_OK && !queued_store(c, s.rid)))
            return kvt__fail(KVT_EPROTO, "the leader's store of rid %llu (rank %u) is not one "
                             "rank %u can apply", (unsigned long long)s.rid, s.rank, me);
    }
    for (uint32_t i = 0; i < c->lk.n && !(d.flags & KVT_WIRE_RESET); i++)
        if (!has_record(d.loads, d.n_loads, KVT_DNL_SIZE, c->lk.p[i].rid))
            return kvt__fail(KVT_EPROTO, "rank %u queued a lookup of rid %llu the leader did "
                             "not decide", me, (unsigned long long)c->lk.p[i].rid);
    for (uint32_t i = 0; i < c->st.n && !(d.flags & KVT_WIRE_RESET); i++)
        if (!has_record(d.stores, d.n_stores, KVT_DNS_SIZE, c->st.p[i].rid))
            return kvt__fail(KVT_EPROTO, "rank %u queued a store of rid %llu the leader did "
                             "not decide", me, (unsigned long long)c->st.p[i].rid);
    return VEC_RESERVE(c->ev, c->ev.n + d.n_loads + d.n_stores + d.n_results + 1);
}

static kvt_status apply_down(kvt_conn *c, const uint8_t *p, size_t len)
{
    kvt_down_view d;
    kvt_status st = kvt__wire_down_parse(p, len, &d);
    if (st == KVT_OK) st = apply_results(c, &d);
    if (st != KVT_OK) return st;
    if (d.flags & KVT_WIRE_RESET) {
        st = kvt__conn_cancel_all(c);
        c->reset_req = false;
        if (st != KVT_OK) return st;
        kvt_conn_event e = {0, KVT_EV_RESET, KVT_OK, 0, 0, 0, 0, c->g->step_no};
        return kvt__conn_push_event(c, &e);
    }
    st = apply_loads(c, &d);
    if (st == KVT_OK) st = apply_stores(c, &d);
    if (st == KVT_OK) st = check_decided(c);
    /* Refused and launched lookups alike: a refused one's task is cancelled. */
    for (uint32_t i = 0; i < c->lk.n; i++) {
        if (c->lk.p[i].task) (void)kvt_cache_cancel(c->cache, c->lk.p[i].task);
        kvt__pend_lookup_free(&c->lk.p[i]);
    }
    for (uint32_t i = 0; i < c->st.n; i++) {
        if (c->st.p[i].task) (void)kvt_cache_cancel(c->cache, c->st.p[i].task);
        kvt__pend_store_free(&c->st.p[i]);
    }
    c->lk.n = c->st.n = 0;
    return st;
}

/* The leader: gather every UP, decide, send the DOWN, and wait until every
 * member acknowledged applying it before the caller applies it here: an
 * abort any member raised after its UP arrives instead of its ACK and wins. */
static kvt_status lead_step(kvt_conn *c, uint64_t step, const uint8_t **down, size_t *down_len)
{
    kvt_group *g = c->g;
    kvt_status st = g->ranks > 1 ? kvt__group_gather(g, step) : KVT_OK;
    if (st != KVT_OK) return st;
    g->step_no = step;
    kvt_up_view *ups = calloc(g->ranks, sizeof *ups);
    if (!ups) return kvt__group_abortf(g, UINT32_MAX, "sync leader: out of memory");
    st = kvt__wire_up_parse(c->up.p, c->up.len, &ups[0]);
    for (uint32_t r = 1; r < g->ranks && st == KVT_OK; r++)
        if ((st = kvt__wire_up_parse(g->ups[r].p, g->ups[r].len, &ups[r])) != KVT_OK)
            st = kvt__group_abortf(g, UINT32_MAX, "epoch %llu: rank %u sent an unreadable step "
                                   "%llu: %s", (unsigned long long)g->epoch, r,
                                   (unsigned long long)step, kvt_last_error());
    if (st == KVT_OK) st = kvt__conn_decide(c, ups, &c->L->down);
    free(ups);
    if (st == KVT_OK && g->ranks > 1) st = kvt__group_bcast(g, c->L->down.p, c->L->down.len);
    if (st == KVT_OK && g->ranks > 1) st = kvt__group_commit(g);
    else if (st == KVT_OK) g->steps++;
    *down = c->L->down.p;
    *down_len = c->L->down.len;
    return st;
}

/* Aborts the group (unless the failure was its abort already) and drops
 * this rank's work; c->mu held. */
static void fail_step(kvt_conn *c, bool group_aborted)
{
    if (!group_aborted)
        (void)kvt__group_abortf(c->g, UINT32_MAX, "epoch %llu: rank %u, step %llu: %s",
                                (unsigned long long)c->g->epoch, c->g->rank,
                                (unsigned long long)c->g->step_no, kvt_last_error());
    /* Nothing is committed under metadata the group did not agree on, and
     * nothing still writes the pages the engine will recompute into. */
    (void)kvt__conn_cancel_all(c);
    if (c->L) kvt__leader_clear(c->L);
    c->aborted = true;
    c->reset_req = false;
}

/* Applies the DOWN (under c->mu); its events carry g->step_no. */
static kvt_status apply_step(kvt_conn *c, const uint8_t *down, size_t len)
{
    /* The first `reported` results went out in this UP. */
    uint32_t reported = kvt__get32(c->up.p + 12);
    if (reported)
        memmove(c->done.p, c->done.p + reported,
                (size_t)(c->done.n - reported) * sizeof *c->done.p);
    c->done.n -= reported;
    return apply_down(c, down, len);
}

/* A step refused because the group already aborted (c->mu not held). */
static kvt_status refuse_step(kvt_conn *c)
{
    pthread_mutex_lock(&c->mu);
    bool mine = c->aborted;
    if (!mine) fail_step(c, true);
    pthread_mutex_unlock(&c->mu);
    return kvt__fail(KVT_EABORTED, "kvt_conn_step: %s", kvt_group_diagnostic(c->g));
}

/* Ends a step that failed (c->mu held, released here): every
 * failure of a step is the group's abort, so this returns KVT_EABORTED. */
static kvt_status end_failed_step(kvt_conn *c, bool group_aborted, uint32_t ev0)
{
    c->ev.n = ev0 < c->ev.n ? ev0 : c->ev.n;
    fail_step(c, group_aborted);
    pthread_mutex_unlock(&c->mu);
    return kvt__fail(KVT_EABORTED, "kvt_conn_step: %s", kvt_group_diagnostic(c->g));
}

/* Every failure returns through refuse_step or end_failed_step (KVT_EABORTED
 * naming the group's diagnostic), never a lower layer's status:
 * scripts/status_map.py reads that from the returns. */
kvt_status kvt_conn_step(kvt_conn *c, uint64_t step)
{
    KVT_CHECK_NOT_NULL_AS(c, "conn", "kvt_conn_step");
    if (c->aborted || c->g->aborted) return refuse_step(c);
    bool leader = kvt__group_is_leader(c->g);
    pthread_mutex_lock(&c->mu);
    uint32_t ev0 = c->ev.n; /* a failed step delivers none of its events */
    c->g->step_no = step;   /* for every diagnostic of this step */
    kvt_status st = kvt__conn_poll_locked(c, NULL);
    if (st == KVT_OK) st = encode_up(c);
    pthread_mutex_unlock(&c->mu);
    const uint8_t *down = NULL;
    size_t len = 0;
    if (st == KVT_OK)
        st = leader ? lead_step(c, step, &down, &len)
                    : kvt__group_step_member(c->g, step, c->up.p, c->up.len, &down, &len);
    /* A member acknowledges only a DOWN it can apply (if it cannot, its
     * ABORT goes to the leader in the ACK's place), before applying it:
     * applying may wait for cancelled transfers (a reset), up to
     * KVT_CONN_CANCEL_WAIT_MS, which the leader's ACK deadline T must not
     * have to cover. */
    if (st == KVT_OK && !leader) {
        pthread_mutex_lock(&c->mu);
        st = validate_down(c, down, len);
        pthread_mutex_unlock(&c->mu);
        if (st == KVT_OK) st = kvt__group_step_ack(c->g);
    }
    pthread_mutex_lock(&c->mu);
    if (st == KVT_OK) st = apply_step(c, down, len);
    bool group_aborted = st == KVT_EABORTED;
    if (st != KVT_OK) return end_failed_step(c, group_aborted, ev0);
    pthread_mutex_unlock(&c->mu);
    kvt__clear_error();
    return KVT_OK;
}
