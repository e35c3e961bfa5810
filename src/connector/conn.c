/* conn.c - the connector's rank-local calls. None of them touches the wire:
 * they only change what this rank will report at its next kvt_conn_step, so
 * calling any of them more or fewer times on one rank than on another can
 * never shift a message stream (docs/protocol.md, "Why asymmetry cannot
 * desynchronise"). */
#include <stdlib.h>
#include <string.h>
#include "cache/cache.h"
#include "connector/conn.h"
#include "util/hash.h"

static uint64_t req_digest(const kvt_request *r)
{
    uint64_t h = kvt__hash64(r->ns ? r->ns : "", r->ns_len, r->num_tokens);
    return kvt__hash64(r->tokens, (size_t)r->num_tokens * sizeof *r->tokens, h);
}

/* Everything the cache would check, here, before the request is copied
 * (a copy of an unchecked num_tokens reads past the caller's array) and
 * under the connector's own name. */
static kvt_status check_req(const kvt_request *r, const char *fn)
{
    KVT_CHECK_NOT_NULL_AS(r, "req", fn);
    KVT_CHECK_ARG(!r->keys && r->num_keys == 0, "%s: req is a keyed request (%u keys); the "
                  "connector takes token requests (keyed ones go to kvt_cache_* or "
                  "kvt_client_*)", fn, r->num_keys);
    KVT_CHECK_ARG(r->num_tokens > 0 && r->tokens, "%s: req has no tokens", fn);
    KVT_CHECK_ARG(r->num_tokens <= KVT_MAX_REQUEST_TOKENS, "%s: req->num_tokens is %u (at most "
                  "%u)", fn, r->num_tokens, KVT_MAX_REQUEST_TOKENS);
    KVT_CHECK_ARG(r->ns || r->ns_len == 0, "%s: req->ns is NULL but ns_len is %u", fn, r->ns_len);
    KVT_CHECK_ARG(r->ns_len <= KVT_MAX_NS_LEN, "%s: req->ns_len is %u (at most %u bytes)", fn,
                  r->ns_len, KVT_MAX_NS_LEN);
    KVT_CHECK_ARG((r->flags & ~KVT_REQ_VISIBLE_AT_END) == 0, "%s: req->flags is 0x%x (a token "
                  "request takes KVT_REQ_VISIBLE_AT_END or 0)", fn, r->flags);
    return KVT_OK;
}

static kvt_status usable(kvt_conn *c, const char *fn)
{
    KVT_CHECK_NOT_NULL_AS(c, "conn", fn);
    if (!c->aborted && c->g->aborted) {
        /* The epoch ended outside a step (kvt_group_abort from the engine's
         * exception handler): stop this rank's work now, as a failed step
         * does, rather than at the next step. */
        pthread_mutex_lock(&c->mu);
        (void)kvt__conn_cancel_all(c);
        if (c->L) kvt__leader_clear(c->L);
        c->aborted = true;
        c->reset_req = false;
        pthread_mutex_unlock(&c->mu);
    }
    if (c->aborted)
        return kvt__fail(KVT_EABORTED, "%s: the group aborted (%s); recompute, then "
                         "kvt_conn_reform", fn, kvt_group_diagnostic(c->g));
    return KVT_OK;
}

kvt_status kvt_conn_create(kvt_conn **out, kvt_group *group, kvt_cache *cache)
{
    static const char fn[] = "kvt_conn_create";
    KVT_CHECK_NOT_NULL(out, fn);
    KVT_CHECK_NOT_NULL(group, fn);
    KVT_CHECK_NOT_NULL(cache, fn);
    kvt_conn *c = calloc(1, sizeof *c);
    if (c && group->rank == 0) c->L = calloc(1, sizeof *c->L);
    if (!c || (group->rank == 0 && !c->L)) {
        free(c);
        return kvt__fail(KVT_ENOMEM, "%s: out of memory", fn);
    }
    c->g = group;
    c->cache = cache;
    c->aborted = group->aborted;
    pthread_mutex_init(&c->mu, NULL);
    kvt__clear_error();
    *out = c;
    return KVT_OK;
}

void kvt_conn_destroy(kvt_conn *c)
{
    if (!c) return;
    pthread_mutex_lock(&c->mu);
    (void)kvt__conn_cancel_all(c);
    (void)kvt__conn_poll_locked(c, NULL); /* forget the cancelled tasks */
    pthread_mutex_unlock(&c->mu);
    free(c->lk.p);
    free(c->st.p);
    free(c->run.p);
    free(c->done.p);
    free(c->ev.p);
    kvt__buf_free(&c->up);
    if (c->L) {
        kvt__leader_clear(c->L);
        free(c->L->aw.p);
        kvt__buf_free(&c->L->down);
        free(c->L);
    }
    pthread_mutex_destroy(&c->mu);
    free(c);
}

static pend_lookup *find_lookup(kvt_conn *c, uint64_t rid)
{
    for (uint32_t i = 0; i < c->lk.n; i++)
        if (c->lk.p[i].rid == rid) return &c->lk.p[i];
    return NULL;
}

static kvt_status copy_req(pend_lookup *p, const kvt_request *r)
{
    p->tokens = malloc((size_t)r->num_tokens * sizeof *p->tokens);
    p->ns = r->ns_len ? malloc(r->ns_len) : NULL;
    if (!p->tokens || (r->ns_len && !p->ns)) {
        kvt__pend_lookup_free(p);
        return kvt__fail(KVT_ENOMEM, "kvt_conn_lookup: out of memory copying the request");
    }
    memcpy(p->tokens, r->tokens, (size_t)r->num_tokens * sizeof *p->tokens);
    if (r->ns_len) memcpy(p->ns, r->ns, r->ns_len);
    p->num_tokens = r->num_tokens;
    p->ns_len = r->ns_len;
    return KVT_OK;
}

static kvt_status lookup_locked(kvt_conn *c, uint64_t rid, const kvt_request *req,
                                uint32_t *local)
{
    static const char fn[] = "kvt_conn_lookup";
    if (find_lookup(c, rid))
        return kvt__fail(KVT_EINVAL, "%s: rid %llu already has a lookup queued for this step",
                         fn, (unsigned long long)rid);
    kvt_status st = VEC_RESERVE(c->lk, c->lk.n + 1);
    pend_lookup p = {.rid = rid, .digest = req_digest(req)};
    if (st == KVT_OK) st = copy_req(&p, req);
    kvt_match m;
    if (st == KVT_OK && (st = kvt_cache_lookup(c->cache, req, &m)) != KVT_OK)
        kvt__pend_lookup_free(&p);
    if (st != KVT_OK) return st;
    p.task = m.task;
    p.local_tokens = m.task ? m.matched_tokens : 0;
    c->lk.p[c->lk.n++] = p;
    if (local) *local = p.local_tokens;
    return KVT_OK;
}

kvt_status kvt_conn_lookup(kvt_conn *c, uint64_t rid, const kvt_request *req, uint32_t *local)
{
    static const char fn[] = "kvt_conn_lookup";
    kvt_status st = usable(c, fn);
    if (st == KVT_OK) st = check_req(req, fn);
    if (st != KVT_OK) return st;
    pthread_mutex_lock(&c->mu);
    st = lookup_locked(c, rid, req, local);
    pthread_mutex_unlock(&c->mu);
    if (st == KVT_OK) kvt__clear_error();
    return st;
}

/* Every page index inside the engine memory the cache registered (or, for
 * a load, KVT_PAGE_SKIP: it leaves the engine's own bytes there; a store
 * copies whole blocks and has no use for it). Refused here, the bad
 * index is named to the rank that passed it; past this call the ranks
 * agree to move the blocks and the step's launch fails instead, which the
 * engine hears only as a failed event. Memory not registered yet: the
 * launch checks at the step. */
static kvt_status check_pages(kvt_conn *c, uint64_t rid, const uint32_t *pages, uint32_t count,
                              bool load, const char *fn)
{
    uint32_t have = kvt__cache_engine_pages(c->cache);
    for (uint32_t i = 0; have && i < count; i++)
        if (pages[i] >= have && !(load && pages[i] == KVT_PAGE_SKIP))
            return kvt__fail(KVT_EINVAL, "%s: rid %llu: pages[%u] is %u but the engine "
                             "registered %u pages with the cache", fn, (unsigned long long)rid, i,
                             pages[i], have);
    return KVT_OK;
}

static kvt_status copy_pages(uint32_t **dst, uint32_t *n, const uint32_t *pages, uint32_t count,
                             const char *fn)
{
    uint32_t *p = malloc((size_t)count * sizeof *p);
    if (!p) return kvt__fail(KVT_ENOMEM, "%s: out of memory copying %u pages", fn, count);
    memcpy(p, pages, (size_t)count * sizeof *p);
    free(*dst);
    *dst = p;
    *n = count;
    return KVT_OK;
}

kvt_status kvt_conn_load(kvt_conn *c, uint64_t rid, const uint32_t *pages, uint32_t num_pages,
                         int layerwise)
{
    static const char fn[] = "kvt_conn_load";
    kvt_status st = usable(c, fn);
    if (st != KVT_OK) return st;
    KVT_CHECK_ARG(pages && num_pages > 0, "%s: rid %llu: no pages", fn, (unsigned long long)rid);
    if ((st = check_pages(c, rid, pages, num_pages, true, fn)) != KVT_OK) return st;
    pthread_mutex_lock(&c->mu);
    pend_lookup *p = find_lookup(c, rid);
    if (!p)
        st = kvt__fail(KVT_EINVAL, "%s: rid %llu has no lookup queued in this step", fn,
                       (unsigned long long)rid);
    if (st == KVT_OK) st = copy_pages(&p->pages, &p->num_pages, pages, num_pages, fn);
    if (st == KVT_OK) {
        p->load = true;
        p->layerwise = layerwise != 0;
    }
    pthread_mutex_unlock(&c->mu);
    if (st == KVT_OK) kvt__clear_error();
    return st;
}

static kvt_status store_locked(kvt_conn *c, uint64_t rid, const kvt_request *req,
                               const uint32_t *pages, uint32_t num_pages)
{
    for (uint32_t i = 0; i < c->st.n; i++)
        if (c->st.p[i].rid == rid)
            return kvt__fail(KVT_EINVAL, "kvt_conn_store: rid %llu already has a store queued "
                             "for this step", (unsigned long long)rid);
    kvt_status st = VEC_RESERVE(c->st, c->st.n + 1);
    pend_store s = {.rid = rid, .digest = req_digest(req)};
    if (st == KVT_OK) st = copy_pages(&s.pages, &s.num_pages, pages, num_pages, "kvt_conn_store");
    kvt_store_plan plan;
    if (st == KVT_OK && (st = kvt_cache_prepare_store(c->cache, req, &plan)) != KVT_OK)
        kvt__pend_store_free(&s);
    if (st != KVT_OK) return st;
    s.task = plan.task;
    s.num_tokens = plan.task ? plan.num_tokens : 0;
    c->st.p[c->st.n++] = s;
    return KVT_OK;
}

kvt_status kvt_conn_store(kvt_conn *c, uint64_t rid, const kvt_request *req,
                          const uint32_t *pages, uint32_t num_pages)
{
    static const char fn[] = "kvt_conn_store";
    kvt_status st = usable(c, fn);
    if (st == KVT_OK) st = check_req(req, fn);
    if (st != KVT_OK) return st;
    KVT_CHECK_ARG(pages && num_pages > 0, "%s: rid %llu: no pages", fn, (unsigned long long)rid);
    if ((st = check_pages(c, rid, pages, num_pages, false, fn)) != KVT_OK) return st;
    pthread_mutex_lock(&c->mu);
    st = store_locked(c, rid, req, pages, num_pages);
    pthread_mutex_unlock(&c->mu);
    if (st == KVT_OK) kvt__clear_error();
    return st;
}

kvt_status kvt_conn_reset(kvt_conn *c)
{
    kvt_status st = usable(c, "kvt_conn_reset");
    if (st != KVT_OK) return st;
    c->reset_req = true;
    kvt__clear_error();
    return KVT_OK;
}

kvt_status kvt_conn_poll(kvt_conn *c, uint32_t *ended)
{
    KVT_CHECK_NOT_NULL_AS(c, "conn", "kvt_conn_poll");
    pthread_mutex_lock(&c->mu);
    kvt_status st = kvt__conn_poll_locked(c, ended);
    pthread_mutex_unlock(&c->mu);
    if (st == KVT_OK) kvt__clear_error();
    return st;
}

/* Whether rid's load was already collected by a rank-local poll (c->mu
 * held); *st: how it ended. */
static bool load_collected(const kvt_conn *c, uint64_t rid, kvt_status *st)
{
    for (uint32_t i = 0; i < c->done.n; i++)
        if (c->done.p[i].rid == rid && c->done.p[i].kind == KVT_TASK_LOAD) {
            *st = (kvt_status)c->done.p[i].status;
            return true;
        }
    return false;
}

static kvt_status collected_result(const char *fn, uint64_t rid, kvt_status st)
{
    return st == KVT_OK ? KVT_OK
                        : kvt__fail(st, "%s: rid %llu: the load ended with %s", fn,
                                    (unsigned long long)rid, kvt_status_name(st));
}

kvt_status kvt_conn_wait_layer(kvt_conn *c, uint64_t rid, uint32_t layer, int64_t timeout_ms)
{
    static const char fn[] = "kvt_conn_wait_layer";
    KVT_CHECK_NOT_NULL_AS(c, "conn", fn);
    KVT_CHECK_ARG(timeout_ms >= 0, "%s: timeout_ms %lld is negative", fn, (long long)timeout_ms);
    kvt_task_id task = 0;
    kvt_status ended_st = KVT_OK;
    pthread_mutex_lock(&c->mu);
    for (uint32_t i = 0; i < c->run.n; i++)
        if (c->run.p[i].rid == rid && c->run.p[i].kind == KVT_TASK_LOAD) task = c->run.p[i].task;
    /* A rank-local poll (an eviction path, say) may already have collected
     * the ended load: answer from its result, as a rank that did not poll
     * would, so ranks never see different answers. */
    bool ended = !task && load_collected(c, rid, &ended_st);
    pthread_mutex_unlock(&c->mu);
    if (ended) return collected_result(fn, rid, ended_st);
    if (!task)
        return kvt__fail(KVT_ENOTFOUND, "%s: rid %llu has no running load on this rank", fn,
                         (unsigned long long)rid);
    kvt_status st = kvt_cache_wait_layer(c->cache, task, layer, timeout_ms);
    if (st == KVT_OK) return st;
    if (st != KVT_ENOTFOUND) return kvt__wrap_error(st, fn); /* the call the user made, then the cache's */
    /* ... and such a poll may collect it while this call waits */
    pthread_mutex_lock(&c->mu);
    ended = load_collected(c, rid, &ended_st);
    pthread_mutex_unlock(&c->mu);
    return ended ? collected_result(fn, rid, ended_st) : st;
}

kvt_status kvt_conn_events(kvt_conn *c, kvt_conn_event *out, uint32_t max, uint32_t *count)
{
    static const char fn[] = "kvt_conn_events";
    KVT_CHECK_NOT_NULL_AS(c, "conn", fn);
    KVT_CHECK_NOT_NULL(count, fn);
    KVT_CHECK_ARG(out || max == 0, "%s: out is NULL", fn);
    pthread_mutex_lock(&c->mu);
    uint32_t n = c->ev.n < max ? c->ev.n : max;
    if (n) {
        memcpy(out, c->ev.p, (size_t)n * sizeof *out);
        memmove(c->ev.p, c->ev.p + n, (size_t)(c->ev.n - n) * sizeof *out);
    }
    c->ev.n -= n;
    pthread_mutex_unlock(&c->mu);
    *count = n;
    kvt__clear_error();
    return KVT_OK;
}

kvt_status kvt_conn_reform(kvt_conn *c, int64_t timeout_ms)
{
    KVT_CHECK_NOT_NULL_AS(c, "conn", "kvt_conn_reform");
    /* Checked before anything is cancelled: bad input changes nothing. */
    KVT_CHECK_ARG(timeout_ms >= 1 && timeout_ms <= 600000, "kvt_conn_reform: timeout_ms is "
                  "%lld (must be 1..600000: every wait needs a deadline)", (long long)timeout_ms);
    pthread_mutex_lock(&c->mu);
    kvt_status st = kvt__conn_cancel_all(c);
    if (c->L) kvt__leader_clear(c->L);
    c->reset_req = false;
    pthread_mutex_unlock(&c->mu);
    if (st != KVT_OK) return st;
    st = kvt_group_reform(c->g, timeout_ms);
    c->aborted = st != KVT_OK;
    return st ? kvt__wrap_error(st, "kvt_conn_reform") : st; /* the call the user made, then the group's */
}
