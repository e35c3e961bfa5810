/* bench_engine.c - `kvtier bench engine [--json] [--rounds N] [--quick] ...`:
 * the engines' own call patterns, as the Python plugins make them, through
 * the public API, against a plain memcpy of the same pages in the same run.
 *
 *  - SGLang HiCache (python/kvtier/sglang_hicache.py, zero copy): a prompt
 *    of --pages pages stored in batches of --batch pages, each batch what
 *    batch_set_v1 does: one independent-keys prepare_store per run of
 *    missing pages (KVT_REQ_VISIBLE_AT_END: through a node server each
 *    task ends once the server committed it, so every rank finds the
 *    batch when the waits return), its launch, the waits; then each
 *    batch read back as batch_exists (one peek) and batch_get_v1 (one
 *    lookup, one launch, one wait). Both host pool layouts: layer_first
 *    (kv_buffer (2, layers, tokens, heads, dim): each layer's K and V
 *    contiguous) and page_first ((2, tokens, layers, heads, dim): every
 *    layer's token t side by side, registered by its strides).
 *  - vLLM worker (python/kvtier/vllm_connector.py): a finished request's
 *    blocks saved as one keyed request (chained keys, visible at end:
 *    prepare_store, launch, the wait its get_finished polls end with;
 *    save_kv_layer itself does nothing), then loaded as a
 *    synchronous load: lookup, launch, wait_layer for every layer
 *    (wait_for_layer_load) and the wait of wait_for_save. vLLM's
 *    FlashAttention buffers per layer ((2, blocks, block_size, heads, dim))
 *    are the layer_first pool's shape, so it moves the same pages.
 *
 * Each pattern runs in-process (kvt_cache) and through a node server (the
 * `kvtier serve` server, in this process on its own thread, over its real
 * socket and shared tier; clients as engines attach them). The plain copy
 * is memcpy of the same pages between the same pool and cold blocks of the
 * same size (cycling through a buffer as large as a tier), per page per
 * layer per K/V (page_first: per token, as the pages lie), on as many
 * threads as kvtier's copy workers (2); the tiers and that buffer are
 * twice the last-level cache or twice the prompt, whichever is more. The
 * sides take turns within each round (one warm-up round first), so each
 * ratio is taken within its round; min/median/max over rounds. Every side
 * is timed on memory its process touched before: the plain buffer and the
 * in-process tiers are written at creation, and each client reads a byte
 * of every page of its mapping of the server's tier first
 * (client_first_touch_ns_per_page: that cold cost, reported apart).
 *
 * Round trips are the client's requests to the server (each one frame out,
 * its reply back: kvt__client_requests), counting the END a copy thread
 * sends for each launched task. store_wait_share: the part of a store's
 * time spent in its waits: the client's copy (with each block's layer
 * checksums in the pass, through the server) and, through the server, the
 * END_SYNC round trip that commits the store; the rest is the planning
 * and launching calls. Through the server every load checks each layer of
 * each block against those checksums in its copy's pass.
 *
 * Every load is byte-verified: the pool is filled with bytes unique to
 * (round, side, position) before a store and overwritten before the load;
 * after the load every byte of the pool is compared. A mismatch fails the
 * bench (exit 1). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"
#include "bench_util.h"
#include "cli_util.h"
#include "server/server.h"
#include "store/pool.h"
#include "util/clock.h"
#include "util/err.h"

#define ELEM 2
#define WORKERS 2 /* kvtier's copy threads (the workers option's default) */
#define WAIT_MS 30000

enum { LF, PF, NLAYOUTS };
static const char *const layout_name[NLAYOUTS] = {"layer_first", "page_first"};

/* The sides of a round, in the order they run. */
enum {
    PLAIN_LF, PLAIN_PF,
    SG_LOCAL_LF, SG_SERVER_LF, SG_LOCAL_PF, SG_SERVER_PF,
    VL_LOCAL, VL_SERVER,
    NSIDES
};
/* Per side per round. */
enum { M_STORE_S, M_LOAD_S, M_RT_STORE, M_RT_EXISTS, M_RT_LOAD, M_WAIT_S, NMETRICS };

typedef struct params {
    uint32_t layers, heads, dim, tpp, pages, batch, rounds;
    uint64_t tier_mib; /* 0: twice the last-level cache or the prompt */
} params;

/* A host pool of `pages` pages in one layout. */
typedef struct pool {
    int layout;
    uint8_t *mem;
    uint64_t bytes;
    void **bases;        /* layers x KVT_MAX_COMPONENTS */
    uint64_t *buf_bytes; /* same */
    uint64_t *pstrides, *tstrides;
    uint64_t pstride, tstride; /* every unit's */
    kvt_engine_memory em;
} pool;

typedef struct engine {
    kvt_cache *cache; /* exactly one of cache, client */
    kvt_client *client;
} engine;

typedef struct bench {
    params p;
    uint64_t tb;          /* token bytes of one (layer, K or V) */
    uint64_t page_bytes;  /* every layer's K and V of one page: one block */
    uint64_t prompt_bytes;
    uint32_t *pages;      /* the page table: a permutation of the pool's pages */
    pool pools[NLAYOUTS];
    kvt_pool *plain;      /* the plain copy's blocks */
    uint32_t plain_next;  /* its next block */
    char (*hex)[65];      /* the keys' bytes */
    kvt_key *keys;
    uint64_t mismatches, verified_bytes;
    char ns[256];
} bench;

/* ---- the host pools ---- */

static uint64_t mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static int pool_init(pool *pl, const bench *b, int layout)
{
    const params *p = &b->p;
    uint32_t units = p->layers * KVT_MAX_COMPONENTS;
    uint64_t tokens = (uint64_t)p->pages * p->tpp, tb = b->tb;
    memset(pl, 0, sizeof *pl);
    pl->layout = layout;
    pl->bytes = 2 * tokens * p->layers * tb;
    pl->mem = aligned_alloc(4096, (pl->bytes + 4095) / 4096 * 4096);
    pl->bases = calloc(units, sizeof *pl->bases);
    pl->buf_bytes = calloc(units, sizeof *pl->buf_bytes);
    pl->pstrides = calloc(units, sizeof *pl->pstrides);
    pl->tstrides = calloc(units, sizeof *pl->tstrides);
    if (!pl->mem || !pl->bases || !pl->buf_bytes || !pl->pstrides || !pl->tstrides) return -1;
    memset(pl->mem, 0, pl->bytes); /* every page touched before any timing */
    pl->tstride = layout == LF ? tb : p->layers * tb;
    pl->pstride = pl->tstride * p->tpp;
    for (uint32_t l = 0; l < p->layers; l++)
        for (uint32_t c = 0; c < 2; c++) {
            uint32_t u = l * KVT_MAX_COMPONENTS + c;
            uint64_t off = layout == LF ? ((uint64_t)c * p->layers + l) * tokens * tb
                                        : (uint64_t)c * tokens * p->layers * tb + l * tb;
            pl->bases[u] = pl->mem + off;
            pl->buf_bytes[u] = (p->pages - 1) * pl->pstride + (p->tpp - 1) * pl->tstride + tb;
            pl->pstrides[u] = pl->pstride;
            pl->tstrides[u] = pl->tstride;
        }
    pl->em.num_pages = p->pages;
    pl->em.layer_bases = pl->bases;
    pl->em.buffer_bytes = pl->buf_bytes;
    if (layout == PF) { /* as the plugin registers page_first: the pool's own strides */
        pl->em.page_strides = pl->pstrides;
        pl->em.token_strides = pl->tstrides;
    }
    return 0;
}

static void pool_fini(pool *pl)
{
    free(pl->mem);
    free(pl->bases);
    free(pl->buf_bytes);
    free(pl->pstrides);
    free(pl->tstrides);
}

/* Every 8 bytes of the pool a function of (seed, position): a page, layer,
 * token or K/V moved to the wrong place, or not moved, shows. */
static void pool_fill(pool *pl, uint64_t seed)
{
    uint64_t *w = (uint64_t *)pl->mem, n = pl->bytes / 8;
    for (uint64_t i = 0; i < n; i++) w[i] = mix64(seed ^ (i * 0x100000001b3ull));
}

static void pool_poison(pool *pl) { memset(pl->mem, 0xa5, pl->bytes); }

/* Bytes of the pool that differ from pool_fill(seed). */
static uint64_t pool_check(const pool *pl, uint64_t seed)
{
    const uint64_t *w = (const uint64_t *)pl->mem;
    uint64_t n = pl->bytes / 8, bad = 0;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t want = mix64(seed ^ (i * 0x100000001b3ull));
        if (w[i] != want)
            for (int k = 0; k < 8; k++) bad += ((w[i] >> (8 * k)) & 0xff) != ((want >> (8 * k)) & 0xff);
    }
    return bad;
}

/* ---- the plain copy: memcpy of the same pages, on WORKERS threads ---- */

typedef struct plain_job {
    bench *b;
    pool *pl;
    uint32_t first_block;
    bool store;
} plain_job;

static struct {
    pthread_barrier_t start, end;
    pthread_t th[WORKERS];
    uint32_t index[WORKERS];
    plain_job job;
    bool quit, started;
} pc;

/* Layers i, i + WORKERS, ... of every page (how kvtier's workers share a
 * task): per page, layer and K/V one memcpy of the page's bytes, or per
 * token where the pool interleaves the layers (page_first). */
static void plain_share(uint32_t i)
{
    const plain_job *j = &pc.job;
    const bench *b = j->b;
    const params *p = &b->p;
    const pool *pl = j->pl;
    uint32_t nblocks = kvt__pool_blocks_total(b->plain);
    for (uint32_t l = i; l < p->layers; l += WORKERS)
        for (uint32_t k = 0; k < p->pages; k++) {
            uint8_t *blk = kvt__pool_block(b->plain, (j->first_block + k) % nblocks);
            for (uint32_t c = 0; c < 2; c++) {
                uint8_t *eng = (uint8_t *)pl->bases[l * KVT_MAX_COMPONENTS + c] +
                               (uint64_t)b->pages[k] * pl->pstride;
                uint8_t *cb = blk + ((uint64_t)l * 2 + c) * p->tpp * b->tb;
                if (pl->tstride == b->tb) {
                    if (j->store) memcpy(cb, eng, p->tpp * b->tb);
                    else memcpy(eng, cb, p->tpp * b->tb);
                } else {
                    for (uint32_t t = 0; t < p->tpp; t++) {
                        if (j->store) memcpy(cb + t * b->tb, eng + t * pl->tstride, b->tb);
                        else memcpy(eng + t * pl->tstride, cb + t * b->tb, b->tb);
                    }
                }
            }
        }
}

static void *plain_main(void *arg)
{
    uint32_t i = *(uint32_t *)arg;
    for (;;) {
        pthread_barrier_wait(&pc.start);
        if (pc.quit) return NULL;
        plain_share(i);
        pthread_barrier_wait(&pc.end);
    }
}

static int plain_start(void)
{
    pthread_barrier_init(&pc.start, NULL, WORKERS);
    pthread_barrier_init(&pc.end, NULL, WORKERS);
    for (uint32_t i = 1; i < WORKERS; i++) {
        pc.index[i] = i;
        if (pthread_create(&pc.th[i], NULL, plain_main, &pc.index[i])) return -1;
    }
    pc.started = true;
    return 0;
}

static void plain_stop(void)
{
    if (!pc.started) return;
    pc.quit = true;
    pthread_barrier_wait(&pc.start);
    for (uint32_t i = 1; i < WORKERS; i++) pthread_join(pc.th[i], NULL);
    pthread_barrier_destroy(&pc.start);
    pthread_barrier_destroy(&pc.end);
}

static double plain_run(bench *b, pool *pl, uint32_t first_block, bool store)
{
    uint64_t t0 = kvt__now_ns();
    pc.job = (plain_job){b, pl, first_block, store};
    pthread_barrier_wait(&pc.start);
    plain_share(0);
    pthread_barrier_wait(&pc.end);
    return (double)(kvt__now_ns() - t0) / 1e9;
}

/* ---- the engine's calls: in-process or through the server ---- */

static kvt_status e_lookup(engine *e, const kvt_request *r, kvt_match *m)
{
    return e->cache ? kvt_cache_lookup(e->cache, r, m) : kvt_client_lookup(e->client, r, m);
}
static kvt_status e_peek(engine *e, const kvt_request *r, uint32_t *n)
{
    return e->cache ? kvt_cache_peek(e->cache, r, n) : kvt_client_peek(e->client, r, n);
}
static kvt_status e_prepare(engine *e, const kvt_request *r, kvt_store_plan *p)
{
    return e->cache ? kvt_cache_prepare_store(e->cache, r, p)
                    : kvt_client_prepare_store(e->client, r, p);
}
static kvt_status e_launch(engine *e, kvt_task_id t, const uint32_t *pages, uint32_t n)
{
    return e->cache ? kvt_cache_launch(e->cache, t, pages, n)
                    : kvt_client_launch(e->client, t, pages, n);
}
/* The task's own status when the wait itself worked. */
static double wait_s; /* seconds in e_wait since the side began */
static kvt_status e_wait(engine *e, kvt_task_id t)
{
    kvt_task_result r;
    uint64_t t0 = kvt__now_ns();
    kvt_status st = e->cache ? kvt_cache_wait(e->cache, t, WAIT_MS, &r)
                             : kvt_client_wait(e->client, t, WAIT_MS, &r);
    wait_s += (double)(kvt__now_ns() - t0) / 1e9;
    return st ? st : r.status;
}
static kvt_status e_wait_layer(engine *e, kvt_task_id t, uint32_t layer)
{
    return e->cache ? kvt_cache_wait_layer(e->cache, t, layer, WAIT_MS)
                    : kvt_client_wait_layer(e->client, t, layer, WAIT_MS);
}
static void e_drop(engine *e, kvt_task_id t)
{
    kvt_task_result r;
    if (e->cache) {
        kvt_cache_cancel(e->cache, t);
        kvt_cache_wait(e->cache, t, WAIT_MS, &r);
    } else {
        kvt_client_cancel(e->client, t);
        kvt_client_wait(e->client, t, WAIT_MS, &r);
    }
}
static uint64_t e_requests(engine *e) { return e->client ? kvt__client_requests(e->client) : 0; }

/* SGLang batch_set_v1 (zero copy) of keys[0..n) from pages[0..n): one
 * independent-keys prepare_store per run of missing pages (a plan stops
 * before a page stored or being stored), its launch, every task waited
 * for at the end. *stored: pages stored now or before. */
static kvt_status sg_set(engine *e, const char *ns, const kvt_key *keys, const uint32_t *pages,
                         uint32_t n, uint32_t tpp, uint32_t *stored)
{
    kvt_task_id tasks[n];
    uint32_t counts[n], nt = 0, j = 0, ok = 0;
    kvt_status st = KVT_OK;
    while (!st && j < n) {
        kvt_request r = {NULL, 0, ns, (uint32_t)strlen(ns), keys + j, n - j,
                         KVT_REQ_INDEPENDENT_KEYS | KVT_REQ_VISIBLE_AT_END};
        kvt_store_plan plan;
        st = e_prepare(e, &r, &plan);
        if (st) break;
        uint32_t a = plan.first_token / tpp, c = plan.num_tokens / tpp;
        if (a > n - j) a = n - j;
        ok += a; /* cached already */
        if (plan.task == 0 || c == 0) {
            if (plan.task) e_drop(e, plan.task);
            j += a < n - j ? a + 1 : a; /* the page after the run: not stored by us */
            continue;
        }
        st = e_launch(e, plan.task, pages + j, a + c);
        if (st) {
            e_drop(e, plan.task);
            break;
        }
        tasks[nt] = plan.task;
        counts[nt++] = c;
        j += a + c;
    }
    for (uint32_t i = 0; i < nt; i++) {
        kvt_status ts = e_wait(e, tasks[i]);
        if (!ts) ok += counts[i];
        else if (!st) st = ts;
    }
    *stored = ok;
    return st;
}

/* SGLang batch_exists (one independent-keys peek) and batch_get_v1 (one
 * lookup, one launch and one wait for the leading run of stored keys).
 * *loaded: pages loaded. */
static kvt_status sg_get(engine *e, const char *ns, const kvt_key *keys, const uint32_t *pages,
                         uint32_t n, uint32_t tpp, uint32_t *exist, uint32_t *loaded,
                         uint64_t *rt_exists)
{
    kvt_request r = {NULL, 0, ns, (uint32_t)strlen(ns), keys, n, KVT_REQ_INDEPENDENT_KEYS};
    uint32_t tokens = 0;
    uint64_t r0 = e_requests(e);
    kvt_status st = e_peek(e, &r, &tokens);
    *rt_exists += e_requests(e) - r0;
    *exist = tokens / tpp;
    *loaded = 0;
    kvt_match m = {0};
    if (!st) st = e_lookup(e, &r, &m);
    if (st || m.task == 0) return st;
    uint32_t k = m.matched_tokens / tpp < n ? m.matched_tokens / tpp : n;
    st = e_launch(e, m.task, pages, k);
    if (st) {
        e_drop(e, m.task);
        return st;
    }
    st = e_wait(e, m.task);
    if (!st) *loaded = k;
    return st;
}

/* ---- one side of a round ---- */

/* Keys for this side and round: SGLang's page hashes are 64 hex digits. */
static void make_keys(bench *b, uint64_t seed)
{
    for (uint32_t i = 0; i < b->p.pages; i++) {
        char *h = b->hex[i];
        for (int q = 0; q < 4; q++)
            snprintf(h + 16 * q, 17, "%016llx",
                     (unsigned long long)mix64(seed * 0x10001ull + i * 4ull + (uint64_t)q));
        b->keys[i] = (kvt_key){h, 64};
    }
}

static int fail(const char *what, kvt_status st)
{
    fprintf(stderr, "kvtier bench engine: %s: %s: %s\n", what, kvt_status_name(st),
            kvt_last_error());
    return -1;
}

/* Reads one byte of each 4 KiB page of the client's mapping of the
 * server's tier; returns the nanoseconds per page. A process's first touch
 * of a page it mapped costs far more than any later one on some hosts (a
 * VM under shadow paging: ~6-9 us a page here, even after the client's
 * MADV_POPULATE_WRITE), and would otherwise land in the first stores into
 * each slot. The in-process tiers and the plain copy's buffer pay it at
 * their creation (a write per page), so every side is timed warm; this
 * figure reports the cold cost apart. */
static double touch_tier(kvt_client *cl)
{
    uint64_t bytes = 0, t0 = kvt__now_ns();
    volatile const uint8_t *m = kvt__client_tier(cl, &bytes);
    uint8_t sum = 0;
    for (uint64_t o = 0; o < bytes; o += 4096) sum += m[o];
    (void)sum;
    return bytes ? (double)(kvt__now_ns() - t0) / (double)(bytes / 4096) : 0;
}

/* Runs side `side` once: fills the pool, stores, poisons, loads, checks.
 * m[]: its metrics. */
static int run_side(bench *b, int side, engine *e, uint32_t round, double m[NMETRICS])
{
    const params *p = &b->p;
    bool plain = side == PLAIN_LF || side == PLAIN_PF;
    bool vllm = side == VL_LOCAL || side == VL_SERVER;
    pool *pl = &b->pools[side == PLAIN_PF || side == SG_LOCAL_PF || side == SG_SERVER_PF ? PF : LF];
    uint64_t seed = mix64(((uint64_t)round << 8) | (uint64_t)side);
    memset(m, 0, NMETRICS * sizeof *m);
    pool_fill(pl, seed);
    make_keys(b, seed);
    snprintf(b->ns, sizeof b->ns, "kvtier-%s-bench|page=%u|layers=%u|heads=%u|round=%u|side=%d",
             vllm ? "vllm" : "sglang-hicache", p->tpp, p->layers, p->heads, round, side);
    const char *ns = b->ns;
    uint32_t nb = (p->pages + p->batch - 1) / p->batch;
    kvt_status st = KVT_OK;
    uint64_t rt0 = e ? e_requests(e) : 0;
    wait_s = 0;
    uint32_t first_block = b->plain_next;
    uint64_t t0 = kvt__now_ns();
    if (plain) {
        b->plain_next = (b->plain_next + p->pages) % kvt__pool_blocks_total(b->plain);
        m[M_STORE_S] = plain_run(b, pl, first_block, true);
    } else if (!vllm) {
        for (uint32_t i = 0; i < nb && !st; i++) {
            uint32_t n = i + 1 < nb ? p->batch : p->pages - i * p->batch, stored = 0;
            st = sg_set(e, ns, b->keys + i * p->batch, b->pages + i * p->batch, n, p->tpp,
                        &stored);
            if (!st && stored != n) st = kvt__fail(KVT_ENOSPC, "batch %u: %u of %u pages stored",
                                                   i, stored, n);
        }
        m[M_STORE_S] = (double)(kvt__now_ns() - t0) / 1e9;
        if (st) return fail("sglang batch_set_v1", st);
    } else {
        kvt_request r = {NULL, 0, ns, (uint32_t)strlen(ns), b->keys, p->pages,
                         KVT_REQ_VISIBLE_AT_END};
        kvt_store_plan plan;
        st = e_prepare(e, &r, &plan);
        if (!st && (plan.task == 0 || plan.first_token || plan.num_tokens != p->pages * p->tpp))
            st = kvt__fail(KVT_ENOSPC, "planned tokens [%u, +%u) of %u", plan.first_token,
                           plan.num_tokens, p->pages * p->tpp);
        if (!st) st = e_launch(e, plan.task, b->pages, p->pages);
        if (!st) st = e_wait(e, plan.task);
        m[M_STORE_S] = (double)(kvt__now_ns() - t0) / 1e9;
        if (st) return fail("vllm save", st);
    }
    uint64_t rt1 = e ? e_requests(e) : 0;
    m[M_WAIT_S] = wait_s;
    pool_poison(pl);
    uint64_t rt_exists = 0;
    uint64_t t1 = kvt__now_ns();
    if (plain) {
        m[M_LOAD_S] = plain_run(b, pl, first_block, false);
    } else if (!vllm) {
        for (uint32_t i = 0; i < nb && !st; i++) {
            uint32_t n = i + 1 < nb ? p->batch : p->pages - i * p->batch, exist = 0, loaded = 0;
            st = sg_get(e, ns, b->keys + i * p->batch, b->pages + i * p->batch, n, p->tpp,
                        &exist, &loaded, &rt_exists);
            if (!st && (exist != n || loaded != n))
                st = kvt__fail(KVT_ENOTFOUND, "batch %u: %u of %u pages exist, %u loaded", i,
                               exist, n, loaded);
        }
        m[M_LOAD_S] = (double)(kvt__now_ns() - t1) / 1e9;
        if (st) return fail("sglang batch_exists / batch_get_v1", st);
    } else {
        kvt_request r = {NULL, 0, ns, (uint32_t)strlen(ns), b->keys, p->pages, 0};
        kvt_match mt = {0};
        st = e_lookup(e, &r, &mt);
        if (!st && (mt.task == 0 || mt.matched_tokens != p->pages * p->tpp))
            st = kvt__fail(KVT_ENOTFOUND, "matched %u of %u tokens", mt.matched_tokens,
                           p->pages * p->tpp);
        if (!st) st = e_launch(e, mt.task, b->pages, p->pages);
        for (uint32_t l = 0; !st && l < p->layers; l++) st = e_wait_layer(e, mt.task, l);
        kvt_status ws = mt.task && !st ? e_wait(e, mt.task) : KVT_OK;
        if (!st) st = ws;
        m[M_LOAD_S] = (double)(kvt__now_ns() - t1) / 1e9;
        if (st) return fail("vllm load", st);
    }
    uint64_t rt2 = e ? e_requests(e) : 0;
    m[M_RT_STORE] = (double)(rt1 - rt0) / (vllm ? 1 : nb);
    m[M_RT_EXISTS] = (double)rt_exists / nb;
    m[M_RT_LOAD] = (double)(rt2 - rt1 - rt_exists) / (vllm ? 1 : nb);
    uint64_t bad = pool_check(pl, seed);
    b->mismatches += bad;
    b->verified_bytes += pl->bytes;
    if (bad) {
        fprintf(stderr, "kvtier bench engine: side %d round %u: %llu bytes loaded wrong\n", side,
                round, (unsigned long long)bad);
        return -1;
    }
    return 0;
}

static void *serve(void *srv)
{
    kvt_server_run(srv);
    return NULL;
}

/* ---- figures ---- */

static void print_stat(const char *key, stat3 s, bool comma) { stat3_json(key, s, comma); }

static stat3 stat_of(const double *v, uint32_t n) { return stat3_of(v, n); }

/* Over rounds: f(round) -> value. */
typedef struct figures {
    uint32_t n;
    double (*v)[NSIDES][NMETRICS]; /* [round][side][metric] */
    double pages, bytes;
} figures;

static stat3 rate(const figures *f, int side, int metric, double amount)
{
    double x[f->n];
    for (uint32_t r = 0; r < f->n; r++) x[r] = amount / f->v[r][side][metric];
    return stat_of(x, f->n);
}
static stat3 metric(const figures *f, int side, int metric)
{
    double x[f->n];
    for (uint32_t r = 0; r < f->n; r++) x[r] = f->v[r][side][metric];
    return stat_of(x, f->n);
}
/* Within each round: the plain side's seconds over the side's (which:
 * M_STORE_S, M_LOAD_S, or -1 for both together). */
static stat3 ratio(const figures *f, int side, int plain, int which)
{
    double x[f->n];
    for (uint32_t r = 0; r < f->n; r++) {
        const double *s = f->v[r][side], *q = f->v[r][plain];
        x[r] = which < 0 ? (q[M_STORE_S] + q[M_LOAD_S]) / (s[M_STORE_S] + s[M_LOAD_S])
                         : q[which] / s[which];
    }
    return stat_of(x, f->n);
}

static void print_side(const figures *f, const char *name, int side, int plain, bool sglang,
                       bool comma)
{
    printf("\"%s\": {", name);
    print_stat("store_gbps", rate(f, side, M_STORE_S, f->bytes / 1e9), true);
    print_stat("load_gbps", rate(f, side, M_LOAD_S, f->bytes / 1e9), true);
    print_stat("store_pages_per_s", rate(f, side, M_STORE_S, f->pages), true);
    print_stat("load_pages_per_s", rate(f, side, M_LOAD_S, f->pages), plain >= 0);
    if (plain < 0) { /* the plain copy itself: no ratio, no server */
        printf("}%s", comma ? ", " : "");
        return;
    }
    print_stat("ratio", ratio(f, side, plain, -1), true);
    print_stat("store_ratio", ratio(f, side, plain, M_STORE_S), true);
    print_stat("load_ratio", ratio(f, side, plain, M_LOAD_S), true);
    {   /* of a store's seconds, those in its waits: the copy and, through
         * the server, END_SYNC's round trip */
        double x[f->n];
        for (uint32_t r = 0; r < f->n; r++) x[r] = f->v[r][side][M_WAIT_S] / f->v[r][side][M_STORE_S];
        print_stat("store_wait_share", stat_of(x, f->n), true);
    }
    if (sglang) {
        print_stat("set_round_trips_per_batch", metric(f, side, M_RT_STORE), true);
        print_stat("exists_round_trips_per_batch", metric(f, side, M_RT_EXISTS), true);
        print_stat("get_round_trips_per_batch", metric(f, side, M_RT_LOAD), false);
    } else {
        print_stat("save_round_trips_per_request", metric(f, side, M_RT_STORE), true);
        print_stat("load_round_trips_per_request", metric(f, side, M_RT_LOAD), false);
    }
    printf("}%s", comma ? ", " : "");
}

static int usage(void)
{
    fprintf(stderr,
            "usage: kvtier bench engine [--json] [--rounds N] [--quick] [--pages N] [--batch N]\n"
            "                           [--layers N] [--heads N] [--head-dim N] [--page-tokens N]\n"
            "                           [--tier-mib M]\n"
            "  SGLang HiCache (batch_set_v1, batch_exists + batch_get_v1; layer_first and\n"
            "  page_first host pools) and vLLM worker (save, layer-by-layer load) call\n"
            "  patterns, in-process and through a node server, against memcpy of the same\n"
            "  pages in the same run; every load byte-verified.\n"
            "  --rounds N       measured rounds after one warm-up (1..1000, default 5)\n"
            "  --pages N        pages in the prompt (default 512)\n"
            "  --batch N        pages per SGLang batch (default 128)\n"
            "  --layers N       (default 32)  --heads N  KV heads (default 2: llama3-8b at TP 4)\n"
            "  --head-dim N     (default 128) --page-tokens N  tokens per page (default 16)\n"
            "  --tier-mib M     each CPU tier (default: twice the last-level cache or the\n"
            "                   prompt, whichever is more)\n"
            "  --quick          a tiny run: 32 pages of 4 layers, batches of 8, 1 round,\n"
            "                   64 MiB tiers (the tests' size)\n");
    return 2;
}

/* Whether argv[*i] is option name; if so, takes its value into out, or
 * names what is wrong and sets *bad. */
static bool arg_u32(int argc, char **argv, int *i, const char *name, uint32_t lo, uint32_t hi,
                    uint32_t *out, bool *bad)
{
    if (strcmp(argv[*i], name)) return false;
    uint64_t v;
    if (*i + 1 >= argc) cli_bad_arg("bench engine", name, true);
    else if (!demo_parse_u64(argv[++*i], &v) || v < lo || v > hi)
        cli_bad_value("bench engine", name, argv[*i]);
    else {
        *out = (uint32_t)v;
        return true;
    }
    *bad = true;
    return true;
}

int kvt_bench_engine_main(int argc, char **argv)
{
    bool json = false, bad = false, quick = false;
    params p = {32, 2, 128, 16, 512, 128, 5, 0};
    uint32_t pages = 0, batch = 0, layers = 0, rounds = 0, tier_mib = 0;
    for (int i = 1; i < argc && !bad; i++) {
        if (!strcmp(argv[i], "--json")) json = true;
        else if (!strcmp(argv[i], "--quick")) quick = true;
        else if (arg_u32(argc, argv, &i, "--rounds", 1, 1000, &rounds, &bad)) {}
        else if (arg_u32(argc, argv, &i, "--pages", 1, 65536, &pages, &bad)) {}
        else if (arg_u32(argc, argv, &i, "--batch", 1, 65536, &batch, &bad)) {}
        else if (arg_u32(argc, argv, &i, "--layers", 1, KVT_MAX_LAYERS, &layers, &bad)) {}
        else if (arg_u32(argc, argv, &i, "--heads", 1, 128, &p.heads, &bad)) {}
        else if (arg_u32(argc, argv, &i, "--head-dim", 1, 1024, &p.dim, &bad)) {}
        else if (arg_u32(argc, argv, &i, "--page-tokens", 1, 1024, &p.tpp, &bad)) {}
        else if (arg_u32(argc, argv, &i, "--tier-mib", 16, 1u << 20, &tier_mib, &bad)) {}
        else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return usage();
        else return cli_bad_arg("bench engine", argv[i], false);
    }
    if (bad) return 2;
    if (quick) p = (params){4, p.heads, p.dim, p.tpp, 32, 8, 1, 64};
    if (pages) p.pages = pages;
    if (batch) p.batch = batch;
    if (layers) p.layers = layers;
    if (rounds) p.rounds = rounds;
    if (tier_mib) p.tier_mib = tier_mib;

    bench b = {.p = p};
    b.tb = (uint64_t)p.heads * p.dim * ELEM;
    b.page_bytes = 2ull * p.layers * p.tpp * b.tb;
    b.prompt_bytes = b.page_bytes * p.pages;
    long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
    uint64_t tier = p.tier_mib ? p.tier_mib << 20 : 2 * (l3 > 0 ? (uint64_t)l3 : 0);
    if (!p.tier_mib && tier < 2 * b.prompt_bytes) tier = 2 * b.prompt_bytes;
    tier = (tier + (1u << 20) - 1) >> 20 << 20;
    if (tier < b.prompt_bytes + b.page_bytes) {
        fprintf(stderr, "kvtier bench engine: a %llu MiB tier cannot hold the %llu MiB prompt\n",
                (unsigned long long)(tier >> 20), (unsigned long long)(b.prompt_bytes >> 20));
        return 2;
    }

    char dir[] = "/tmp/kvtier-bench-engine-XXXXXX";
    if (!mkdtemp(dir)) return demo_error("mkdtemp", KVT_ESYS);
    char sock[128], cap[32], bt[16];
    snprintf(sock, sizeof sock, "%s/s.sock", dir);
    snprintf(cap, sizeof cap, "%lluMiB", (unsigned long long)(tier >> 20));
    snprintf(bt, sizeof bt, "%u", p.tpp);

    kvt_config *cfg = NULL;
    kvt_geometry *geo = NULL;
    kvt_server *srv = NULL;
    engine local[NLAYOUTS] = {{0}}, remote[NLAYOUTS] = {{0}};
    pthread_t th;
    bool running = false;
    int rc = 1;
    figures f = {0};
    b.pages = malloc(p.pages * sizeof *b.pages);
    b.hex = malloc(p.pages * sizeof *b.hex);
    b.keys = malloc(p.pages * sizeof *b.keys);
    f.v = calloc(p.rounds, sizeof *f.v);
    kvt_status st = b.pages && b.hex && b.keys && f.v ? KVT_OK : KVT_ENOMEM;
    /* A shuffled page table, as an engine's is. */
    uint64_t rng = 7;
    for (uint32_t i = 0; !st && i < p.pages; i++) b.pages[i] = i;
    for (uint32_t i = p.pages - 1; !st && i > 0; i--) {
        uint32_t j = (uint32_t)(mix64(rng++) % (i + 1)), t = b.pages[i];
        b.pages[i] = b.pages[j];
        b.pages[j] = t;
    }
    for (int k = 0; !st && k < NLAYOUTS; k++)
        if (pool_init(&b.pools[k], &b, k)) st = KVT_ENOMEM;
    if (!st) st = kvt__pool_create(&b.plain, tier, b.page_bytes, true);
    if (!st) st = kvt_config_create(&cfg);
    if (!st) st = kvt_config_set(cfg, "cpu_capacity", cap);
    if (!st) st = kvt_config_set(cfg, "block_tokens", bt);
    if (!st) st = kvt_config_set(cfg, "workers", "2");
    if (!st) st = kvt_config_set(cfg, "server_socket", sock);
    if (!st) st = kvt_geometry_create(&geo, p.layers, p.tpp, KVT_LAYOUT_LAYER_FIRST);
    kvt_layer_spec spec = {2, {{p.heads, p.dim, ELEM}, {p.heads, p.dim, ELEM}}};
    if (!st) st = kvt_geometry_set_layers(geo, 0, p.layers, &spec);
    if (st) {
        fail("setup", st);
        goto out;
    }
    /* The server's thread (and every other) starts only now, after all of
     * the setup above; nothing here forks. */
    st = kvt_server_create(&srv, cfg, geo);
    if (!st) running = pthread_create(&th, NULL, serve, srv) == 0;
    for (int k = 0; !st && k < NLAYOUTS; k++) {
        st = kvt_client_attach(&remote[k].client, sock, geo, WAIT_MS);
        if (!st) st = kvt_client_register_memory(remote[k].client, &b.pools[k].em);
        if (!st) st = kvt_cache_create(&local[k].cache, cfg, geo);
        if (!st) st = kvt_cache_register_memory(local[k].cache, &b.pools[k].em);
    }
    /* Every side's memory touched before any timing, as the plain copy's
     * buffer and the in-process tiers are at their creation. */
    double touch_ns = 0;
    for (int k = 0; !st && k < NLAYOUTS; k++) touch_ns += touch_tier(remote[k].client);
    if (!st && plain_start()) st = kvt__fail(KVT_ESYS, "pthread_create");
    if (st) {
        fail("setup", st);
        goto out;
    }
    engine *eng[NSIDES] = {NULL, NULL, &local[LF], &remote[LF], &local[PF], &remote[PF],
                           &local[LF], &remote[LF]};
    int ok = 0;
    for (uint32_t r = 0; r <= p.rounds && !ok; r++) /* round 0: the warm-up */
        for (int s = 0; s < NSIDES && !ok; s++) {
            double m[NMETRICS];
            ok = run_side(&b, s, eng[s], r, m);
            if (r) memcpy(f.v[r - 1][s], m, sizeof m);
        }
    if (ok) goto out;
    f.n = p.rounds;
    f.pages = p.pages;
    f.bytes = (double)b.prompt_bytes;

    const char *tier_pages = kvt__srv_shard_first(srv)->shm.pages;
    stat3 sg[NLAYOUTS], sgl[NLAYOUTS], vl = ratio(&f, VL_SERVER, PLAIN_LF, -1),
                                        vll = ratio(&f, VL_LOCAL, PLAIN_LF, -1);
    stat3 rt_set[NLAYOUTS], rt_get[NLAYOUTS], rt_ex[NLAYOUTS];
    double worst_rt = 0;
    bool ratio_met = vl.med >= 0.8;
    for (int k = 0; k < NLAYOUTS; k++) {
        int srvside = k == LF ? SG_SERVER_LF : SG_SERVER_PF;
        sg[k] = ratio(&f, srvside, k == LF ? PLAIN_LF : PLAIN_PF, -1);
        sgl[k] = ratio(&f, k == LF ? SG_LOCAL_LF : SG_LOCAL_PF, k == LF ? PLAIN_LF : PLAIN_PF, -1);
        rt_set[k] = metric(&f, srvside, M_RT_STORE);
        rt_get[k] = metric(&f, srvside, M_RT_LOAD);
        rt_ex[k] = metric(&f, srvside, M_RT_EXISTS);
        if (rt_set[k].max > worst_rt) worst_rt = rt_set[k].max;
        if (rt_get[k].max > worst_rt) worst_rt = rt_get[k].max;
        if (sg[k].med < 0.8) ratio_met = false;
    }
    if (json) {
        printf("{\"bench\": \"engine\", \"rounds\": %u, \"stat\": \"min/median/max over rounds "
               "after one warm-up; ratios = plain copy seconds / engine seconds within each "
               "round, store + load\", ",
               p.rounds);
        bench_host_json(true);
        printf("\"memory\": {\"l3_bytes\": %ld, \"tier_pages\": \"%s\", \"plain_pages\": \"%s\", "
               "\"client_first_touch_ns_per_page\": %.0f}, ",
               l3, tier_pages, kvt__pool_page_kind(b.plain), touch_ns / NLAYOUTS);
        printf("\"geometry\": {\"layers\": %u, \"kv_heads\": %u, \"head_dim\": %u, \"elem_bytes\": "
               "%u, \"page_tokens\": %u, \"page_bytes\": %llu}, \"pages\": %u, \"batch_pages\": "
               "%u, \"batches\": %u, \"prompt_bytes\": %llu, \"tier_bytes\": %llu, "
               "\"copy_threads\": %u, ",
               p.layers, p.heads, p.dim, ELEM, p.tpp, (unsigned long long)b.page_bytes, p.pages,
               p.batch, (p.pages + p.batch - 1) / p.batch, (unsigned long long)b.prompt_bytes,
               (unsigned long long)tier, WORKERS);
        printf("\"sglang\": {");
        for (int k = 0; k < NLAYOUTS; k++) {
            int pls = k == LF ? PLAIN_LF : PLAIN_PF;
            printf("\"%s\": {", layout_name[k]);
            print_side(&f, "plain", pls, -1, true, true);
            print_side(&f, "inproc", k == LF ? SG_LOCAL_LF : SG_LOCAL_PF, pls, true, true);
            print_side(&f, "server", k == LF ? SG_SERVER_LF : SG_SERVER_PF, pls, true, false);
            printf("}%s", k + 1 < NLAYOUTS ? ", " : "}, ");
        }
        printf("\"vllm\": {");
        print_side(&f, "plain", PLAIN_LF, -1, false, true);
        print_side(&f, "inproc", VL_LOCAL, PLAIN_LF, false, true);
        print_side(&f, "server", VL_SERVER, PLAIN_LF, false, false);
        printf("}, \"sglang_ratio\": {");
        for (int k = 0; k < NLAYOUTS; k++)
            print_stat(layout_name[k], sg[k], k + 1 < NLAYOUTS);
        printf("}, \"sglang_ratio_inproc\": {");
        for (int k = 0; k < NLAYOUTS; k++)
            print_stat(layout_name[k], sgl[k], k + 1 < NLAYOUTS);
        printf("}, ");
        print_stat("vllm_ratio", vl, true);
        print_stat("vllm_ratio_inproc", vll, true);
        printf("\"target\": {\"ratio\": 0.8, \"round_trips_per_batch\": 3, \"ratio_met\": %s, "
               "\"round_trips_met\": %s, \"worst_round_trips_per_batch\": %.2f}, ",
               ratio_met ? "true" : "false", worst_rt <= 3 ? "true" : "false", worst_rt);
        printf("\"bytes_verified\": %llu, \"mismatches\": %llu, \"verified\": %s}\n",
               (unsigned long long)b.verified_bytes, (unsigned long long)b.mismatches,
               b.mismatches ? "false" : "true");
    } else {
        printf("kvtier bench engine: %u pages of %u tokens (%u layers x K,V x %u heads x %u x %u B "
               "= %llu KiB), SGLang batches of %u; %u rounds (min/median/max), every load "
               "verified;\ntiers %llu MiB on %s pages; plain copy: memcpy on %u threads; a "
               "client's first touch of the server's tier (before timing): %.0f ns a page\n",
               p.pages, p.tpp, p.layers, p.heads, p.dim, ELEM,
               (unsigned long long)(b.page_bytes >> 10), p.batch, p.rounds,
               (unsigned long long)(tier >> 20), tier_pages, WORKERS, touch_ns / NLAYOUTS);
        bench_host_text(stdout);
        for (int k = 0; k < NLAYOUTS; k++) {
            int pls = k == LF ? PLAIN_LF : PLAIN_PF;
            int ls = k == LF ? SG_LOCAL_LF : SG_LOCAL_PF, ss = k == LF ? SG_SERVER_LF : SG_SERVER_PF;
            stat3 ps = rate(&f, pls, M_STORE_S, f.bytes / 1e9), pld = rate(&f, pls, M_LOAD_S, f.bytes / 1e9);
            stat3 ss_ = rate(&f, ss, M_STORE_S, f.bytes / 1e9), sl = rate(&f, ss, M_LOAD_S, f.bytes / 1e9);
            stat3 ls_ = rate(&f, ls, M_STORE_S, f.bytes / 1e9), ll = rate(&f, ls, M_LOAD_S, f.bytes / 1e9);
            printf("  SGLang %-11s plain store %.2f / load %.2f GB/s; in-process %.2f / %.2f "
                   "(ratio %.2f); server %.2f / %.2f (ratio %.2f, %.2f-%.2f); round trips per "
                   "batch: set %.1f, exists %.1f, get %.1f\n",
                   layout_name[k], ps.med, pld.med, ls_.med, ll.med, sgl[k].med, ss_.med, sl.med,
                   sg[k].med, sg[k].min, sg[k].max, rt_set[k].med, rt_ex[k].med, rt_get[k].med);
        }
        stat3 ps = rate(&f, PLAIN_LF, M_STORE_S, f.bytes / 1e9), pld = rate(&f, PLAIN_LF, M_LOAD_S, f.bytes / 1e9);
        stat3 vs = rate(&f, VL_SERVER, M_STORE_S, f.bytes / 1e9), vld = rate(&f, VL_SERVER, M_LOAD_S, f.bytes / 1e9);
        printf("  vLLM worker        plain store %.2f / load %.2f GB/s; in-process ratio %.2f; "
               "server %.2f / %.2f (ratio %.2f, %.2f-%.2f); round trips per request: save %.1f, "
               "load %.1f\n",
               ps.med, pld.med, vll.med, vs.med, vld.med, vl.med, vl.min, vl.max,
               metric(&f, VL_SERVER, M_RT_STORE).med, metric(&f, VL_SERVER, M_RT_LOAD).med);
        printf("  target (>= 0.8x plain through the server, <= 3 round trips per batch): ratio "
               "%s, round trips %s (worst %.1f)\n",
               ratio_met ? "met" : "NOT met", worst_rt <= 3 ? "met" : "NOT met", worst_rt);
    }
    rc = b.mismatches ? 1 : 0;
out:
    plain_stop();
    for (int k = 0; k < NLAYOUTS; k++) {
        kvt_client_detach(remote[k].client);
        kvt_cache_destroy(local[k].cache);
    }
    if (running) {
        kvt_server_stop(srv);
        pthread_join(th, NULL);
    }
    kvt_server_destroy(srv);
    kvt_geometry_destroy(geo);
    kvt_config_destroy(cfg);
    kvt__pool_destroy(b.plain);
    for (int k = 0; k < NLAYOUTS; k++) pool_fini(&b.pools[k]);
    free(b.pages);
    free(b.hex);
    free(b.keys);
    free(f.v);
    char lock[160];
    snprintf(lock, sizeof lock, "%s.lock", sock);
    unlink(lock);
    rmdir(dir);
    return rc;
}
