/* leader.c - the sync leader's decisions for one step, from every rank's
 * UP (its own included, parsed like the others'):
 *  - a load goes ahead only if every rank looked the request up with the
 *    same bytes (digest) and gave pages; its prefix is the minimum of the
 *    ranks' matches; the leader alone picks counter and generation;
 *  - a store goes ahead only if every rank queued it with the same bytes;
 *  - a result becomes a group result once every rank reported it: OK only
 *    if OK everywhere, with the fewest tokens; else the first failure;
 *  - any rank's reset request resets everyone.
 * Refusals carry the first rank that caused them, for the engine's log. */
#include <stdlib.h>
#include <string.h>
#include "connector/conn.h"

typedef struct item {
    uint64_t rid;
    uint32_t rank;
    const uint8_t *rec;
} item;

static int item_cmp(const void *a, const void *b)
{
    const item *x = a, *y = b;
    if (x->rid != y->rid) return x->rid < y->rid ? -1 : 1;
    return x->rank < y->rank ? -1 : x->rank > y->rank;
}

/* All ranks' records of one kind, sorted by (rid, rank). */
static item *collect(const kvt_up_view *ups, uint32_t ranks, int stores, uint32_t *n_out)
{
    uint32_t n = 0;
    for (uint32_t r = 0; r < ranks; r++) n += stores ? ups[r].n_stores : ups[r].n_lookups;
    item *it = malloc(((size_t)n + 1) * sizeof *it);
    if (!it) return NULL;
    uint32_t k = 0;
    for (uint32_t r = 0; r < ranks; r++) {
        uint32_t m = stores ? ups[r].n_stores : ups[r].n_lookups;
        const uint8_t *base = stores ? ups[r].stores : ups[r].lookups;
        size_t sz = stores ? KVT_UPS_SIZE : KVT_UPL_SIZE;
        for (uint32_t i = 0; i < m; i++)
            it[k++] = (item){kvt__get64(base + i * sz), r, base + i * sz};
    }
    qsort(it, n, sizeof *it, item_cmp);
    *n_out = n;
    return it;
}

/* For a run of items of one rid: the first rank missing from it (or
 * UINT32_MAX), and whether a rank appears twice (a malformed UP). */
static uint32_t first_missing(const item *g, uint32_t n, uint32_t ranks, int *dup)
{
    *dup = 0;
    for (uint32_t i = 1; i < n; i++)
        if (g[i].rank == g[i - 1].rank) *dup = 1;
    for (uint32_t i = 0; i < n; i++)
        if (g[i].rank != i) return i;
    return n < ranks ? n : UINT32_MAX;
}

/* The leader's record of an operation still running for (rid, kind), or
 * NULL. A second operation on the same rid and kind waits until the first
 * one's group result: results are matched by (rid, kind), so two at once
 * could be confused and a store reported done while it still copies. */
static const awaiting *running(const leader_state *L, uint64_t rid, uint32_t kind)
{
    for (uint32_t i = 0; i < L->aw.n; i++)
        if (L->aw.p[i].rid == rid && L->aw.p[i].kind == kind) return &L->aw.p[i];
    return NULL;
}

/* A layer counter no running load holds, or UINT32_MAX when all are taken
 * (two loads sharing one would release each other's layers: scenario E6). */
static uint32_t free_counter(const leader_state *L)
{
    uint32_t used = 0;
    for (uint32_t i = 0; i < L->aw.n; i++)
        if (L->aw.p[i].kind == KVT_TASK_LOAD) used |= 1u << L->aw.p[i].counter;
    for (uint32_t k = 0; k < KVT_CONN_COUNTERS; k++)
        if (!(used & (1u << k))) return k;
    return UINT32_MAX;
}

static kvt_down_load decide_load(kvt_conn *c, const item *g, uint32_t n, uint32_t ranks)
{
    int dup;
    kvt_down_load d = {g[0].rid, 0, KVT_OK, 0, 0, 0};
    uint32_t miss = first_missing(g, n, ranks, &dup);
    kvt_up_lookup first = kvt__wire_get_lookup(g[0].rec);
    uint32_t tokens = UINT32_MAX;
    for (uint32_t i = 0; i < n && d.status == KVT_OK; i++) {
        kvt_up_lookup l = kvt__wire_get_lookup(g[i].rec);
        if (l.digest != first.digest || dup) d = (kvt_down_load){l.rid, 0, KVT_EPROTO, g[i].rank, 0, 0};
        else if (!(l.flags & KVT_UPL_LOAD) ||
                 (l.flags & KVT_UPL_LAYERWISE) != (first.flags & KVT_UPL_LAYERWISE))
            d = (kvt_down_load){l.rid, 0, KVT_ECANCELED, g[i].rank, 0, 0};
        if (l.local_tokens < tokens) tokens = l.local_tokens;
    }
    if (d.status != KVT_OK) return d;
    if (miss != UINT32_MAX) return (kvt_down_load){g[0].rid, 0, KVT_ECANCELED, miss, 0, 0};
    if (tokens == 0) return (kvt_down_load){g[0].rid, 0, KVT_ENOTFOUND, 0, 0, 0};
    uint32_t counter = free_counter(c->L);
    if (running(c->L, g[0].rid, KVT_TASK_LOAD) || counter == UINT32_MAX)
        return (kvt_down_load){g[0].rid, 0, KVT_EBUSY, 0, 0, 0};
    uint64_t gen = ++c->L->generation;
    return (kvt_down_load){g[0].rid, tokens, KVT_OK, 0, counter, gen};
}

static kvt_down_store decide_store(const leader_state *L, const item *g, uint32_t n,
                                   uint32_t ranks)
{
    int dup;
    if (running(L, g[0].rid, KVT_TASK_STORE)) return (kvt_down_store){g[0].rid, KVT_EBUSY, 0};
    uint32_t miss = first_missing(g, n, ranks, &dup);
    kvt_up_store first = kvt__wire_get_store(g[0].rec);
    for (uint32_t i = 0; i < n; i++)
        if (dup || kvt__wire_get_store(g[i].rec).digest != first.digest)
            return (kvt_down_store){g[0].rid, KVT_EPROTO, g[i].rank};
    if (miss != UINT32_MAX) return (kvt_down_store){g[0].rid, KVT_ECANCELED, miss};
    return (kvt_down_store){g[0].rid, KVT_OK, 0};
}

static kvt_status await_add(leader_state *L, uint64_t rid, uint32_t kind, uint32_t counter)
{
    kvt_status st = VEC_RESERVE(L->aw, L->aw.n + 1);
    if (st != KVT_OK) return st;
    awaiting *a = &L->aw.p[L->aw.n++];
    memset(a, 0, sizeof *a);
    a->rid = rid;
    a->kind = kind;
    a->status = KVT_OK;
    a->tokens = UINT32_MAX;
    a->counter = counter;
    return KVT_OK;
}

void kvt__leader_clear(leader_state *L) { L->aw.n = 0; }

/* Folds one rank's result in; emits the group result when it is the last. */
static kvt_status fold_result(kvt_conn *c, uint32_t rank, const kvt_result_rec *r,
                              kvt_result_rec *out, uint32_t *n_out)
{
    leader_state *L = c->L;
    for (uint32_t i = 0; i < L->aw.n; i++) {
        awaiting *a = &L->aw.p[i];
        if (a->rid != r->rid || a->kind != r->kind) continue;
        uint64_t bit = 1ull << (rank % 64);
        if (a->mask[rank / 64] & bit) break;
        a->mask[rank / 64] |= bit;
        if (a->status == KVT_OK && r->status != KVT_OK) {
            a->status = r->status;
            a->rank = rank;
        }
        if (r->tokens < a->tokens) a->tokens = r->tokens;
        if (++a->reported == c->g->ranks) {
            out[(*n_out)++] = (kvt_result_rec){a->rid, a->kind, a->status,
                                               a->status == KVT_OK ? a->tokens : 0, a->rank};
            L->aw.p[i] = L->aw.p[--L->aw.n];
        }
        return KVT_OK;
    }
    return kvt__fail(KVT_EPROTO, "rank %u reported a %s result for rid %llu that the leader "
                     "never started (or reported it twice)", rank,
                     r->kind == KVT_TASK_LOAD ? "load" : "store", (unsigned long long)r->rid);
}

static kvt_status fold_results(kvt_conn *c, const kvt_up_view *ups, kvt_result_rec *out,
                               uint32_t *n_out)
{
    for (uint32_t r = 0; r < c->g->ranks; r++)
        for (uint32_t i = 0; i < ups[r].n_results; i++) {
            kvt_result_rec rec = kvt__wire_get_result(ups[r].results + (size_t)i * KVT_RES_SIZE);
            kvt_status st = fold_result(c, r, &rec, out, n_out);
            if (st != KVT_OK) return st;
        }
    return KVT_OK;
}

typedef struct plan {
    item *lk, *st;
    uint32_t n_lk, n_st, n_loads, n_stores, n_res;
    kvt_result_rec *res;
    uint32_t flags;
} plan;

static uint32_t count_runs(const item *it, uint32_t n)
{
    uint32_t runs = 0;
    for (uint32_t i = 0; i < n; i++) runs += i == 0 || it[i].rid != it[i - 1].rid;
    return runs;
}

static kvt_status write_decisions(kvt_conn *c, plan *p, uint8_t *out)
{
    uint8_t *lo = out + KVT_WIRE_HEAD, *so = lo + (size_t)p->n_loads * KVT_DNL_SIZE;
    for (uint32_t i = 0, j; i < p->n_lk; i = j) {
        for (j = i; j < p->n_lk && p->lk[j].rid == p->lk[i].rid; j++) {}
        kvt_down_load d = decide_load(c, p->lk + i, j - i, c->g->ranks);
        if (d.status == KVT_OK && await_add(c->L, d.rid, KVT_TASK_LOAD, d.counter) != KVT_OK)
            return KVT_ENOMEM;
        kvt__wire_put_load(lo, &d);
        lo += KVT_DNL_SIZE;
    }
    for (uint32_t i = 0, j; i < p->n_st; i = j) {
        for (j = i; j < p->n_st && p->st[j].rid == p->st[i].rid; j++) {}
        kvt_down_store d = decide_store(c->L, p->st + i, j - i, c->g->ranks);
        if (d.status == KVT_OK && await_add(c->L, d.rid, KVT_TASK_STORE, 0) != KVT_OK)
            return KVT_ENOMEM;
        kvt__wire_put_sdec(so, &d);
        so += KVT_DNS_SIZE;
    }
    uint8_t *ro = so;
    for (uint32_t i = 0; i < p->n_res; i++, ro += KVT_RES_SIZE) kvt__wire_put_result(ro, &p->res[i]);
    return KVT_OK;
}

static kvt_status build(kvt_conn *c, const kvt_up_view *ups, plan *p, kvt_buf *down)
{
    kvt_status st = fold_results(c, ups, p->res, &p->n_res);
    if (st != KVT_OK) return st;
    for (uint32_t r = 0; r < c->g->ranks; r++) p->flags |= ups[r].flags & KVT_WIRE_RESET;
    if (p->flags & KVT_WIRE_RESET) {
        kvt__leader_clear(c->L); /* every rank cancels everything */
        p->n_lk = p->n_st = 0;
    }
    p->n_loads = count_runs(p->lk, p->n_lk);
    p->n_stores = count_runs(p->st, p->n_st);
    size_t len = kvt__wire_down_size(p->n_loads, p->n_stores, p->n_res);
    if ((st = kvt__buf_reserve(down, len)) != KVT_OK) return st;
    kvt__wire_head(down->p, p->flags, p->n_loads, p->n_stores, p->n_res);
    down->len = len;
    return write_decisions(c, p, down->p);
}

kvt_status kvt__conn_decide(kvt_conn *c, const kvt_up_view *ups, kvt_buf *down)
{
    plan p = {0};
    uint32_t n_res = 0;
    for (uint32_t r = 0; r < c->g->ranks; r++) n_res += ups[r].n_results;
    p.lk = collect(ups, c->g->ranks, 0, &p.n_lk);
    p.st = collect(ups, c->g->ranks, 1, &p.n_st);
    p.res = malloc(((size_t)n_res + 1) * sizeof *p.res);
    kvt_status st = (!p.lk || !p.st || !p.res) ? kvt__fail(KVT_ENOMEM, "sync leader: out of memory")
                                               : build(c, ups, &p, down);
    free(p.lk);
    free(p.st);
    free(p.res);
    return st;
}
