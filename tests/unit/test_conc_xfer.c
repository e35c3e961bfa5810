/* test_conc_xfer.c - the transfer engine: byte-exact gather/scatter for both
 * layouts, concurrency, cancel, deadlines, copy errors, destroy. Runs under
 * TSan (the "conc" prefix). Every wait has a deadline. */
#include "support.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "layout/layout.h"
#include "store/pool.h"
#include "util/clock.h"
#include "util/hash.h"
#include "util/sync.h"
#include "xfer/xfer.h"

#define WAIT_MS 20000 /* generous: TSan on a 2-core VM is slow */

/* ---- a copy ops table the tests control ---- */

typedef struct test_ops {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int calls;
    int block_at;   /* calls >= block_at wait for `open` (0: never) */
    bool open;
    int blocked;    /* calls waiting at the gate now */
    int fail_at;    /* this call returns fail_status (0: never) */
    kvt_status fail_status;
    unsigned sleep_us; /* per call */
} test_ops;

static kvt_status test_copy(void *ctx, const kvt_copy_chunk *c, uint32_t n)
{
    test_ops *o = ctx;
    pthread_mutex_lock(&o->mu);
    int call = ++o->calls;
    if (o->fail_at && call == o->fail_at) {
        pthread_mutex_unlock(&o->mu);
        return o->fail_status;
    }
    if (o->block_at && call >= o->block_at) {
        uint64_t dl = kvt__deadline_ns(WAIT_MS);
        o->blocked++;
        pthread_cond_broadcast(&o->cv);
        while (!o->open && kvt__now_ns() < dl) kvt__cond_wait_until(&o->cv, &o->mu, dl);
        o->blocked--;
    }
    unsigned sl = o->sleep_us;
    pthread_mutex_unlock(&o->mu);
    if (sl) usleep(sl);
    for (uint32_t i = 0; i < n; i++) memcpy(c[i].dst, c[i].src, c[i].len);
    return KVT_OK;
}

static void ops_init(test_ops *o, kvt_copy_ops *table)
{
    memset(o, 0, sizeof *o);
    pthread_mutex_init(&o->mu, NULL);
    assert_int_equal(kvt__cond_init(&o->cv), 0);
    *table = (kvt_copy_ops){.name = "test", .copy = test_copy, .ctx = o};
}

static void ops_fini(test_ops *o)
{
    pthread_cond_destroy(&o->cv);
    pthread_mutex_destroy(&o->mu);
}

static void ops_open(test_ops *o)
{
    pthread_mutex_lock(&o->mu);
    o->open = true;
    pthread_cond_broadcast(&o->cv);
    pthread_mutex_unlock(&o->mu);
}

static void ops_wait_blocked(test_ops *o, int n)
{
    uint64_t dl = kvt__deadline_ns(WAIT_MS);
    pthread_mutex_lock(&o->mu);
    while (o->blocked < n && kvt__now_ns() < dl) kvt__cond_wait_until(&o->cv, &o->mu, dl);
    int got = o->blocked;
    pthread_mutex_unlock(&o->mu);
    assert_int_equal(got, n);
}

static int ops_calls(test_ops *o)
{
    pthread_mutex_lock(&o->mu);
    int c = o->calls;
    pthread_mutex_unlock(&o->mu);
    return c;
}

/* ---- completion records ---- */

typedef struct done_board {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int ended;
} done_board;

typedef struct done_rec {
    done_board *board;
    int calls;
    kvt_status status;
    bool free_task; /* on_done frees the task (checks the engine lets go) */
} done_rec;

static done_board board;

static void on_done(kvt_xfer_task *t, kvt_status st)
{
    done_rec *r = t->user;
    bool free_task = r->free_task;
    pthread_mutex_lock(&r->board->mu);
    r->calls++;
    r->status = st;
    r->board->ended++;
    pthread_cond_broadcast(&r->board->cv);
    pthread_mutex_unlock(&r->board->mu);
    if (free_task) free(t);
}

static int board_setup(void **state)
{
    (void)state;
    pthread_mutex_init(&board.mu, NULL);
    board.ended = 0;
    return kvt__cond_init(&board.cv);
}

static int board_teardown(void **state)
{
    (void)state;
    pthread_cond_destroy(&board.cv);
    pthread_mutex_destroy(&board.mu);
    return 0;
}

/* Waits until r's on_done ran; returns its status. */
static kvt_status wait_done(done_rec *r)
{
    uint64_t dl = kvt__deadline_ns(WAIT_MS);
    pthread_mutex_lock(&board.mu);
    while (r->calls == 0 && kvt__now_ns() < dl) kvt__cond_wait_until(&board.cv, &board.mu, dl);
    int calls = r->calls;
    kvt_status st = r->status;
    pthread_mutex_unlock(&board.mu);
    assert_int_equal(calls, 1);
    return st;
}

static int rec_calls(done_rec *r)
{
    pthread_mutex_lock(&board.mu);
    int c = r->calls;
    pthread_mutex_unlock(&board.mu);
    return c;
}

/* ---- a rig: geometry, engine memory, page map, pool ---- */

typedef struct rig {
    kvt_geometry *geo;
    uint32_t tpp, ppb, block_tokens, num_pages;
    uint8_t *engine; /* every engine buffer, in one allocation */
    uint8_t *expect;
    uint64_t engine_bytes;
    kvt_page_map *map;
    kvt_pool *pool;
    uint8_t **blocks; /* all pool blocks */
    uint32_t nblocks;
} rig;

/* Heterogeneous layers: heads and head_dim vary per layer, K and V differ,
 * and with mla every third layer has one component. */
static kvt_geometry *make_geo(uint32_t layers, uint32_t tpp, kvt_layout layout, bool mla)
{
    kvt_geometry *g = NULL;
    assert_ok(kvt_geometry_create(&g, layers, tpp, layout));
    for (uint32_t l = 0; l < layers; l++) {
        kvt_layer_spec s;
        memset(&s, 0, sizeof s);
        if (mla && l % 3 == 1) {
            s.num_components = 1;
            s.component[0] = (kvt_component_spec){1, 24 + 8 * (l % 2), 2};
        } else {
            s.num_components = 2;
            s.component[0] = (kvt_component_spec){1 + l % 3, 16, 2};
            s.component[1] = (kvt_component_spec){1 + l % 3, 8 * (1 + l % 2), l % 2 ? 4 : 2};
        }
        assert_ok(kvt_geometry_set_layer(g, l, &s));
    }
    assert_ok(kvt_geometry_validate(g));
    return g;
}

static void rig_init(rig *r, kvt_geometry *g, uint32_t ppb, uint32_t num_pages, uint32_t nblocks)
{
    memset(r, 0, sizeof *r);
    r->geo = g;
    r->tpp = g->tokens_per_page;
    r->ppb = ppb;
    r->block_tokens = ppb * r->tpp;
    r->num_pages = num_pages;
    uint64_t bpt = kvt__geo_bytes_per_token(g);
    r->engine_bytes = bpt * r->tpp * num_pages;
    r->engine = malloc(r->engine_bytes);
    r->expect = malloc(r->engine_bytes);
    assert_non_null(r->engine);
    assert_non_null(r->expect);
    uint64_t st = 42;
    for (uint64_t i = 0; i + 8 <= r->engine_bytes; i += 8) {
        uint64_t v = kvt__splitmix64(&st);
        memcpy(r->engine + i, &v, 8);
    }
    void *bases[KVT_MAX_LAYERS * KVT_MAX_COMPONENTS] = {0};
    uint64_t off = 0;
    for (uint32_t l = 0; l < g->num_layers; l++) {
        for (uint32_t c = 0; c < kvt__geo_ncomp(g, l); c++) {
            bases[KVT_UNIT(l, c)] = r->engine + off;
            off += kvt__geo_token_bytes(g, l, c) * r->tpp * num_pages;
        }
    }
    kvt_engine_memory mem = {.num_pages = num_pages, .base = r->engine, .layer_bases = bases};
    r->map = malloc(sizeof *r->map);
    assert_non_null(r->map);
    assert_ok(kvt__page_map_init(r->map, g, &mem));
    uint64_t block_bytes = bpt * r->block_tokens;
    assert_ok(kvt__pool_create(&r->pool, block_bytes * nblocks, block_bytes, false));
    r->nblocks = nblocks;
    r->blocks = malloc(nblocks * sizeof *r->blocks);
    assert_non_null(r->blocks);
    for (uint32_t i = 0; i < nblocks; i++) {
        r->blocks[i] = kvt__pool_block(r->pool, i);
        memset(r->blocks[i], 0xEE, block_bytes);
    }
}

static void rig_fini(rig *r)
{
    kvt__pool_destroy(r->pool);
    free(r->blocks);
    free(r->map);
    free(r->engine);
    free(r->expect);
    kvt_geometry_destroy(r->geo);
}

static void task_init(kvt_xfer_task *t, rig *r, kvt_xfer_dir dir, uint32_t nblocks,
                      uint8_t *const *blocks, const uint32_t *pages, done_rec *rec)
{
    memset(t, 0, sizeof *t);
    t->dir = dir;
    t->geo = r->geo;
    t->map = r->map;
    t->block_tokens = r->block_tokens;
    t->num_blocks = nblocks;
    t->blocks = blocks;
    t->pages = pages;
    t->on_done = on_done;
    t->user = rec;
    memset(rec, 0, sizeof *rec);
    rec->board = &board;
}

/* n distinct pages from [lo, lo + span), shuffled. */
static void pick_pages(uint32_t *out, uint32_t n, uint32_t lo, uint32_t span, uint64_t seed)
{
    uint32_t *all = malloc(span * sizeof *all);
    assert_non_null(all);
    for (uint32_t i = 0; i < span; i++) all[i] = lo + i;
    uint64_t st = seed;
    for (uint32_t i = span - 1; i > 0; i--) {
        uint32_t j = (uint32_t)(kvt__splitmix64(&st) % (i + 1));
        uint32_t tmp = all[i];
        all[i] = all[j];
        all[j] = tmp;
    }
    memcpy(out, all, n * sizeof *out);
    free(all);
}

/* The cache block holds what the engine pages hold, for layers [lo, hi). */
static void check_blocks(rig *r, uint32_t nblocks, uint8_t *const *blocks, const uint32_t *pages,
                         uint32_t lo, uint32_t hi)
{
    const kvt_geometry *g = r->geo;
    for (uint32_t b = 0; b < nblocks; b++)
        for (uint32_t l = lo; l < hi; l++)
            for (uint32_t c = 0; c < kvt__geo_ncomp(g, l); c++) {
                uint64_t len = kvt__geo_token_bytes(g, l, c) * r->tpp;
                const uint8_t *blk = blocks[b] + kvt__geo_block_offset(g, r->block_tokens, l, c);
                for (uint32_t j = 0; j < r->ppb; j++) {
                    const uint8_t *eng = kvt__page_addr(r->map, KVT_UNIT(l, c), pages[b * r->ppb + j]);
                    if (memcmp(blk + j * len, eng, len) != 0)
                        fail_msg("block %u layer %u comp %u page %u differs", b, l, c, j);
                }
            }
}

/* Engine pages dst hold what pages src hold, for layers [lo, hi). */
static void check_pages(rig *r, uint32_t npages, const uint32_t *src, const uint32_t *dst,
                        uint32_t lo, uint32_t hi)
{
    const kvt_geometry *g = r->geo;
    for (uint32_t i = 0; i < npages; i++)
        for (uint32_t l = lo; l < hi; l++)
            for (uint32_t c = 0; c < kvt__geo_ncomp(g, l); c++) {
                uint32_t u = KVT_UNIT(l, c);
                uint64_t len = kvt__geo_token_bytes(g, l, c) * r->tpp;
                if (memcmp(kvt__page_addr(r->map, u, dst[i]), kvt__page_addr(r->map, u, src[i]), len))
                    fail_msg("page %u (from %u) layer %u comp %u differs", dst[i], src[i], l, c);
            }
}

/* The whole engine memory equals the snapshot with src copied onto dst:
 * nothing outside the task's pages and units was written. */
static void check_engine_exact(rig *r, const uint8_t *snapshot, uint32_t npages,
                               const uint32_t *src, const uint32_t *dst)
{
    memcpy(r->expect, snapshot, r->engine_bytes);
    const kvt_geometry *g = r->geo;
    for (uint32_t i = 0; i < npages; i++)
        for (uint32_t l = 0; l < g->num_layers; l++)
            for (uint32_t c = 0; c < kvt__geo_ncomp(g, l); c++) {
                uint32_t u = KVT_UNIT(l, c);
                uint64_t len = kvt__geo_token_bytes(g, l, c) * r->tpp;
                uint64_t so = (uint64_t)(kvt__page_addr(r->map, u, src[i]) - r->engine);
                uint64_t d = (uint64_t)(kvt__page_addr(r->map, u, dst[i]) - r->engine);
                memcpy(r->expect + d, snapshot + so, len);
            }
    assert_memory_equal(r->engine, r->expect, r->engine_bytes);
}

/* ---- tests ---- */

/* Gather then scatter to other pages, for both layouts, page sizes 1/4/16,
 * 1..3 pages per block, heterogeneous and MLA layers, 1..3 workers. The
 * scatter goes through slow copies so wait_layer(l) is checked while later
 * layers are still in flight: the bytes of layers <= l must be in place. */
static void roundtrip_ops(kvt_layout layout, uint32_t tpp, uint32_t ppb, uint32_t workers,
                          bool mla, unsigned sleep_us, bool plain)
{
    rig r;
    uint32_t nblk = 5, npages = nblk * ppb, num_pages = 4 * npages;
    rig_init(&r, make_geo(7, tpp, layout, mla), ppb, num_pages, nblk);
    uint8_t *snapshot = malloc(r.engine_bytes);
    assert_non_null(snapshot);
    memcpy(snapshot, r.engine, r.engine_bytes);
    uint32_t *src = malloc(npages * sizeof *src), *dst = malloc(npages * sizeof *dst);
    assert_non_null(src);
    assert_non_null(dst);
    pick_pages(src, npages, 0, num_pages / 2, tpp * 31 + ppb);
    pick_pages(dst, npages, num_pages / 2, num_pages / 2, tpp * 17 + ppb);

    test_ops o;
    kvt_copy_ops table;
    ops_init(&o, &table);
    /* plain: the gather's sums come from the fused copy (kvt_hash_copy)
     * wherever a block part is over 240 bytes and the CPU has AVX2 */
    table.plain_memcpy = plain;
    kvt_xfer *x = NULL;
    assert_ok(kvt__xfer_create(&x, workers, &table));
    assert_int_equal(kvt__xfer_workers(x), workers);

    kvt_xfer_task t;
    done_rec rec;
    task_init(&t, &r, KVT_XFER_GATHER, nblk, r.blocks, src, &rec);
    uint32_t nl = r.geo->num_layers;
    uint64_t *sums = malloc((size_t)nblk * nl * sizeof *sums);
    assert_non_null(sums);
    memset(sums, 0xA5, (size_t)nblk * nl * sizeof *sums);
    t.layer_sums = sums; /* each block's layers hashed in the copy's pass */
    assert_ok(kvt__xfer_submit(x, &t));
    assert_int_equal(wait_done(&rec), KVT_OK);
    check_blocks(&r, nblk, r.blocks, src, 0, r.geo->num_layers);
    for (uint32_t b = 0; b < nblk; b++)
        for (uint32_t l = 0; l < nl; l++) {
            const uint8_t *seg = r.blocks[b] + kvt__geo_block_offset(r.geo, r.block_tokens, l, 0);
            uint64_t len = (uint64_t)r.block_tokens * kvt__geo_layer_token_bytes(r.geo, l);
            assert_true(sums[(size_t)b * nl + l] == kvt__hash64(seg, len, l));
        }

    pthread_mutex_lock(&o.mu);
    o.sleep_us = sleep_us;
    pthread_mutex_unlock(&o.mu);
    task_init(&t, &r, KVT_XFER_SCATTER, nblk, r.blocks, dst, &rec);
    t.expect_sums = sums; /* the load checks each part in its copy's pass */
    assert_ok(kvt__xfer_submit(x, &t));
    for (uint32_t l = 0; l < r.geo->num_layers; l++) {
        assert_ok(kvt__xfer_wait_layer(x, &t, l, kvt__deadline_ns(WAIT_MS)));
        check_pages(&r, npages, src, dst, 0, l + 1);
    }
    assert_int_equal(wait_done(&rec), KVT_OK);
    assert_ok(kvt__xfer_wait_layer(x, &t, r.geo->num_layers - 1, kvt__now_ns()));
    check_engine_exact(&r, snapshot, npages, src, dst);

    /* One byte of layer 3 of block 2 changes in the block after its sums
     * were taken: the load fails KVT_ECORRUPT and never reports layer 3
     * landed. */
    r.blocks[2][kvt__geo_block_offset(r.geo, r.block_tokens, 3, 0) + 5] ^= 0x40;
    task_init(&t, &r, KVT_XFER_SCATTER, nblk, r.blocks, dst, &rec);
    t.expect_sums = sums;
    assert_ok(kvt__xfer_submit(x, &t));
    assert_int_equal(kvt__xfer_wait_layer(x, &t, 3, kvt__deadline_ns(WAIT_MS)), KVT_ECORRUPT);
    assert_int_equal(wait_done(&rec), KVT_ECORRUPT);
    assert_int_equal(kvt__xfer_wait_layer(x, &t, 3, kvt__now_ns()), KVT_ECORRUPT);
    r.blocks[2][kvt__geo_block_offset(r.geo, r.block_tokens, 3, 0) + 5] ^= 0x40;
    free(sums);

    kvt__xfer_destroy(x);
    ops_fini(&o);
    free(src);
    free(dst);
    free(snapshot);
    rig_fini(&r);
}

/* Every round trip twice: the copy through the ops table, and the store's
 * copy fused with its checksums (as the node client's host copies do). */
static void roundtrip(kvt_layout layout, uint32_t tpp, uint32_t ppb, uint32_t workers, bool mla,
                      unsigned sleep_us)
{
    roundtrip_ops(layout, tpp, ppb, workers, mla, sleep_us, false);
    roundtrip_ops(layout, tpp, ppb, workers, mla, sleep_us, true);
}

static void test_roundtrip_layer_first(void **state)
{
    (void)state;
    static const uint32_t tpps[] = {1, 4, 16};
    for (int i = 0; i < 3; i++) {
        roundtrip(KVT_LAYOUT_LAYER_FIRST, tpps[i], 1, 1, false, 0);
        roundtrip(KVT_LAYOUT_LAYER_FIRST, tpps[i], 3, 2, true, 300);
        roundtrip(KVT_LAYOUT_LAYER_FIRST, tpps[i], 2, 3, true, 0);
    }
}

static void test_roundtrip_page_first(void **state)
{
    (void)state;
    static const uint32_t tpps[] = {1, 4, 16};
    for (int i = 0; i < 3; i++) {
        roundtrip(KVT_LAYOUT_PAGE_FIRST, tpps[i], 1, 1, true, 0);
        roundtrip(KVT_LAYOUT_PAGE_FIRST, tpps[i], 3, 2, false, 300);
        roundtrip(KVT_LAYOUT_PAGE_FIRST, tpps[i], 2, 3, true, 0);
    }
}

/* In-order pages of a LAYER_FIRST engine are contiguous both in the engine
 * and inside a block, so they merge into one chunk; units with more chunks
 * than the worker's buffer (512) are copied in several calls. */
static void test_large_unit(void **state)
{
    (void)state;
    rig r;
    uint32_t nblk = 700, ppb = 2, np = nblk * ppb;
    rig_init(&r, make_geo(2, 1, KVT_LAYOUT_LAYER_FIRST, false), ppb, 2 * np, nblk);
    uint32_t *src = malloc(np * sizeof *src), *dst = malloc(np * sizeof *dst);
    assert_non_null(src);
    assert_non_null(dst);
    for (uint32_t i = 0; i < np; i++) {
        src[i] = i;              /* pairs merge: 1400 chunks per unit */
        dst[i] = 2 * np - 1 - i; /* nothing merges: 2800 chunks per unit */
    }
    kvt_xfer *x = NULL;
    assert_ok(kvt__xfer_create(&x, 2, &kvt__host_copy_ops));
    kvt_xfer_task t;
    done_rec rec;
    task_init(&t, &r, KVT_XFER_GATHER, nblk, r.blocks, src, &rec);
    assert_ok(kvt__xfer_submit(x, &t));
    assert_int_equal(wait_done(&rec), KVT_OK);
    check_blocks(&r, nblk, r.blocks, src, 0, 2);
    task_init(&t, &r, KVT_XFER_SCATTER, nblk, r.blocks, dst, &rec);
    assert_ok(kvt__xfer_submit(x, &t));
    assert_int_equal(wait_done(&rec), KVT_OK);
    check_pages(&r, np, src, dst, 0, 2);
    kvt__xfer_destroy(x);
    free(src);
    free(dst);
    rig_fini(&r);
}

/* Several submitter threads, many tasks each, on_done frees the task. */
typedef struct submitter {
    rig *r;
    kvt_xfer *x;
    uint32_t id, ntasks, blocks_per_task;
    done_rec *recs;
    int failures;
} submitter;

static void *submit_main(void *arg)
{
    submitter *s = arg;
    rig *r = s->r;
    for (uint32_t k = 0; k < s->ntasks; k++) {
        kvt_xfer_task *t = malloc(sizeof *t);
        if (!t) {
            s->failures++;
            continue;
        }
        /* Every task gathers into blocks of its own (concurrent tasks
         * never write the same block, as in the cache). */
        uint32_t first = (s->id * s->ntasks + k) * s->blocks_per_task;
        static const uint32_t pages_of[] = {3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8};
        memset(t, 0, sizeof *t);
        t->dir = KVT_XFER_GATHER;
        t->geo = r->geo;
        t->map = r->map;
        t->block_tokens = r->block_tokens;
        t->num_blocks = s->blocks_per_task;
        t->blocks = r->blocks + first;
        t->pages = pages_of + (s->id % 3);
        t->on_done = on_done;
        done_rec *rec = &s->recs[k];
        rec->board = &board;
        rec->free_task = true;
        t->user = rec;
        if (kvt__xfer_submit(s->x, t) != KVT_OK) {
            free(t);
            s->failures++;
        }
        if (k % 7 == 3) usleep(100);
    }
    return NULL;
}

static void test_many_concurrent_tasks(void **state)
{
    (void)state;
    enum { NSUB = 4, NTASK = 60, BPT = 3 };
    rig r;
    rig_init(&r, make_geo(6, 4, KVT_LAYOUT_PAGE_FIRST, true), 1, 16, NSUB * NTASK * BPT);
    kvt_xfer *x = NULL;
    assert_ok(kvt__xfer_create(&x, 3, &kvt__host_copy_ops));
    submitter subs[NSUB];
    pthread_t th[NSUB];
    pthread_mutex_lock(&board.mu);
    int ended_before = board.ended; /* the board counts across tests */
    pthread_mutex_unlock(&board.mu);
    done_rec *recs = calloc(NSUB * NTASK, sizeof *recs);
    assert_non_null(recs);
    for (uint32_t i = 0; i < NSUB; i++) {
        subs[i] = (submitter){.r = &r, .x = x, .id = i, .ntasks = NTASK, .blocks_per_task = BPT,
                              .recs = recs + i * NTASK};
        assert_int_equal(pthread_create(&th[i], NULL, submit_main, &subs[i]), 0);
    }
    for (uint32_t i = 0; i < NSUB; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(subs[i].failures, 0);
    }
    uint64_t dl = kvt__deadline_ns(WAIT_MS);
    pthread_mutex_lock(&board.mu);
    while (board.ended < ended_before + NSUB * NTASK && kvt__now_ns() < dl)
        kvt__cond_wait_until(&board.cv, &board.mu, dl);
    pthread_mutex_unlock(&board.mu);
    for (uint32_t i = 0; i < NSUB * NTASK; i++) {
        assert_int_equal(rec_calls(&recs[i]), 1);
        assert_int_equal(recs[i].status, KVT_OK);
    }
    static const uint32_t pages_of[] = {3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8};
    for (uint32_t i = 0; i < NSUB; i++)
        for (uint32_t k = 0; k < NTASK; k++)
            check_blocks(&r, BPT, r.blocks + (i * NTASK + k) * BPT, pages_of + (i % 3), 0,
                         r.geo->num_layers);
    kvt__xfer_destroy(x);
    free(recs);
    rig_fini(&r);
}

/* One worker held at the gate by task A; B is cancelled while queued and
 * ends with KVT_ECANCELED without a single copy. */
static void test_cancel_before_start(void **state)
{
    (void)state;
    rig r;
    rig_init(&r, make_geo(4, 4, KVT_LAYOUT_LAYER_FIRST, false), 2, 32, 4);
    test_ops o;
    kvt_copy_ops table;
    ops_init(&o, &table);
    o.block_at = 1;
    kvt_xfer *x = NULL;
    assert_ok(kvt__xfer_create(&x, 1, &table));
    static const uint32_t pa[] = {0, 1, 2, 3}, pb[] = {4, 5, 6, 7};
    kvt_xfer_task a, b;
    done_rec ra, rb;
    task_init(&a, &r, KVT_XFER_GATHER, 2, r.blocks, pa, &ra);
    task_init(&b, &r, KVT_XFER_GATHER, 2, r.blocks + 2, pb, &rb);
    uint64_t bb = kvt__pool_block_bytes(r.pool);
    assert_ok(kvt__xfer_submit(x, &a));
    ops_wait_blocked(&o, 1);
    assert_ok(kvt__xfer_submit(x, &b));
    kvt__xfer_cancel(x, &b);
    kvt__xfer_cancel(x, &b); /* twice is harmless */
    assert_status(kvt__xfer_wait_layer(x, &b, 0, kvt__deadline_ns(10)), KVT_ETIMEDOUT);
    assert_int_equal(rec_calls(&rb), 0); /* only a worker ends a task */
    ops_open(&o);
    assert_int_equal(wait_done(&ra), KVT_OK);
    assert_int_equal(wait_done(&rb), KVT_ECANCELED);
    assert_status(kvt__xfer_wait_layer(x, &b, 0, kvt__deadline_ns(WAIT_MS)), KVT_ECANCELED);
    assert_non_null(strstr(kvt_last_error(), "KVT_ECANCELED"));
    assert_int_equal(ops_calls(&o), 4); /* A's 4 layers, none of B's */
    for (uint32_t i = 2; i < 4; i++)
        for (uint64_t k = 0; k < bb; k++)
            if (r.blocks[i][k] != 0xEE) fail_msg("cancelled task wrote block %u", i);
    check_blocks(&r, 2, r.blocks, pa, 0, 4);
    kvt__xfer_destroy(x);
    ops_fini(&o);
    rig_fini(&r);
}

/* Cancel while layer 2 is being copied: that copy finishes and lands, no
 * later layer starts, the task ends with KVT_ECANCELED. */
static void test_cancel_mid_run(void **state)
{
    (void)state;
    rig r;
    uint32_t L = 6;
    rig_init(&r, make_geo(L, 16, KVT_LAYOUT_PAGE_FIRST, true), 1, 8, 2);
    test_ops o;
    kvt_copy_ops table;
    ops_init(&o, &table);
    o.block_at = 3; /* one call per layer: layers 0, 1 land, layer 2 waits */
    kvt_xfer *x = NULL;
    assert_ok(kvt__xfer_create(&x, 1, &table));
    static const uint32_t pa[] = {5, 2};
    kvt_xfer_task t;
    done_rec rec;
    task_init(&t, &r, KVT_XFER_GATHER, 2, r.blocks, pa, &rec);
    assert_ok(kvt__xfer_submit(x, &t));
    ops_wait_blocked(&o, 1);
    assert_ok(kvt__xfer_wait_layer(x, &t, 1, kvt__deadline_ns(WAIT_MS)));
    kvt__xfer_cancel(x, &t);
    ops_open(&o);
    assert_int_equal(wait_done(&rec), KVT_ECANCELED);
    assert_int_equal(ops_calls(&o), 3);
    assert_ok(kvt__xfer_wait_layer(x, &t, 2, kvt__deadline_ns(WAIT_MS)));
    assert_status(kvt__xfer_wait_layer(x, &t, 3, kvt__deadline_ns(WAIT_MS)), KVT_ECANCELED);
    assert_status(kvt__xfer_wait_layer(x, &t, L - 1, kvt__now_ns()), KVT_ECANCELED);
    check_blocks(&r, 2, r.blocks, pa, 0, 3);
    for (uint32_t b = 0; b < 2; b++) {
        uint64_t from = kvt__geo_block_offset(r.geo, r.block_tokens, 3, 0);
        uint64_t bb = kvt__pool_block_bytes(r.pool);
        for (uint64_t k = from; k < bb; k++)
            if (r.blocks[b][k] != 0xEE) fail_msg("layer >= 3 of block %u was written", b);
    }
    kvt__xfer_destroy(x);
    ops_fini(&o);
    rig_fini(&r);
}

/* A cancel is seen between the copy calls of one big unit (> 512 chunks):
 * the unit stops, its layer does not count as landed. */
static void test_cancel_within_unit(void **state)
{
    (void)state;
    rig r;
    uint32_t nblk = 600;
    rig_init(&r, make_geo(2, 1, KVT_LAYOUT_LAYER_FIRST, false), 1, nblk, nblk);
    uint32_t *pages = malloc(nblk * sizeof *pages);
    assert_non_null(pages);
    for (uint32_t i = 0; i < nblk; i++) pages[i] = nblk - 1 - i;
    test_ops o;
    kvt_copy_ops table;
    ops_init(&o, &table);
    o.block_at = 1;
    kvt_xfer *x = NULL;
    assert_ok(kvt__xfer_create(&x, 1, &table));
    kvt_xfer_task t;
    done_rec rec;
    task_init(&t, &r, KVT_XFER_GATHER, nblk, r.blocks, pages, &rec);
    assert_ok(kvt__xfer_submit(x, &t));
    ops_wait_blocked(&o, 1);
    kvt__xfer_cancel(x, &t);
    ops_open(&o);
    assert_int_equal(wait_done(&rec), KVT_ECANCELED);
    assert_int_equal(ops_calls(&o), 1); /* 1200 chunks: 3 calls had it run on */
    assert_status(kvt__xfer_wait_layer(x, &t, 0, kvt__now_ns()), KVT_ECANCELED);
    kvt__xfer_destroy(x);
    ops_fini(&o);
    free(pages);
    rig_fini(&r);
}

/* A copy that never finishes: wait_layer returns KVT_ETIMEDOUT close to its
 * deadline, for a layer and for the last layer. */
static void test_wait_deadline(void **state)
{
    (void)state;
    rig r;
    rig_init(&r, make_geo(3, 4, KVT_LAYOUT_LAYER_FIRST, false), 1, 8, 2);
    test_ops o;
    kvt_copy_ops table;
    ops_init(&o, &table);
    o.block_at = 1;
    kvt_xfer *x = NULL;
    assert_ok(kvt__xfer_create(&x, 2, &table));
    static const uint32_t pa[] = {1, 2};
    kvt_xfer_task t;
    done_rec rec;
    task_init(&t, &r, KVT_XFER_SCATTER, 2, r.blocks, pa, &rec);
    assert_ok(kvt__xfer_submit(x, &t));
    ops_wait_blocked(&o, 2);
    uint64_t t0 = kvt__now_ns();
    assert_status(kvt__xfer_wait_layer(x, &t, 0, t0 + 50 * 1000000ull), KVT_ETIMEDOUT);
    uint64_t el = kvt__now_ns() - t0;
    assert_true(el >= 50 * 1000000ull);
    assert_true(el < 5000 * 1000000ull);
    assert_non_null(strstr(kvt_last_error(), "deadline"));
    /* A deadline already past: no wait at all. The copy is held until
     * ops_open below, so a wait that read 0 as "no deadline" would never
     * return (ctest's timeout ends it); the bound, 5 s as for the 50 ms
     * wait above, catches one that fell back to a default such as
     * WAIT_MS, where the 1 s it had could fail a TSan build on a loaded
     * machine. */
    t0 = kvt__now_ns();
    assert_status(kvt__xfer_wait_layer(x, &t, 2, 0), KVT_ETIMEDOUT);
    assert_true(kvt__now_ns() - t0 < 5000 * 1000000ull);
    ops_open(&o);
    assert_ok(kvt__xfer_wait_layer(x, &t, 2, kvt__deadline_ns(WAIT_MS)));
    assert_int_equal(wait_done(&rec), KVT_OK);
    kvt__xfer_destroy(x);
    ops_fini(&o);
    rig_fini(&r);
}

/* The 3rd copy fails with KVT_EIO: the task ends with it, once. */
static void test_copy_error(void **state)
{
    (void)state;
    for (uint32_t workers = 1; workers <= 2; workers++) {
        rig r;
        rig_init(&r, make_geo(8, 4, KVT_LAYOUT_PAGE_FIRST, false), 2, 8, 2);
        test_ops o;
        kvt_copy_ops table;
        ops_init(&o, &table);
        o.fail_at = 3;
        o.fail_status = KVT_EIO;
        kvt_xfer *x = NULL;
        assert_ok(kvt__xfer_create(&x, workers, &table));
        static const uint32_t pa[] = {1, 2, 3, 4};
        kvt_xfer_task t;
        done_rec rec;
        task_init(&t, &r, KVT_XFER_SCATTER, 2, r.blocks, pa, &rec);
        assert_ok(kvt__xfer_submit(x, &t));
        assert_int_equal(wait_done(&rec), KVT_EIO);
        assert_status(kvt__xfer_wait_layer(x, &t, 7, kvt__deadline_ns(WAIT_MS)), KVT_EIO);
        assert_true(t.layers_ready < 8);
        /* The engine goes on serving other tasks. */
        kvt_xfer_task t2;
        done_rec rec2;
        task_init(&t2, &r, KVT_XFER_SCATTER, 2, r.blocks, pa, &rec2);
        assert_ok(kvt__xfer_submit(x, &t2));
        assert_int_equal(wait_done(&rec2), KVT_OK);
        kvt__xfer_destroy(x);
        assert_int_equal(rec.calls, 1);
        ops_fini(&o);
        rig_fini(&r);
    }
}

static void *destroy_main(void *arg)
{
    kvt__xfer_destroy(arg);
    return NULL;
}

/* destroy with tasks queued behind a running one: the running one finishes,
 * the queued ones get on_done(KVT_ECANCELED), each exactly once. */
static void test_destroy_with_queued(void **state)
{
    (void)state;
    rig r;
    rig_init(&r, make_geo(1, 4, KVT_LAYOUT_LAYER_FIRST, false), 1, 8, 4);
    test_ops o;
    kvt_copy_ops table;
    ops_init(&o, &table);
    o.block_at = 1;
    kvt_xfer *x = NULL;
    assert_ok(kvt__xfer_create(&x, 1, &table));
    static const uint32_t pa[] = {0, 1, 2, 3};
    kvt_xfer_task t[4];
    done_rec rec[4];
    for (int i = 0; i < 4; i++) task_init(&t[i], &r, KVT_XFER_GATHER, 1, r.blocks + i, pa + i, &rec[i]);
    assert_ok(kvt__xfer_submit(x, &t[0]));
    ops_wait_blocked(&o, 1);
    for (int i = 1; i < 4; i++) assert_ok(kvt__xfer_submit(x, &t[i]));
    /* Destroy from a thread; open the gate only once it has begun: it
     * marks the queued tasks cancelled (last t[3]) in the same critical
     * section that empties the queue, so the worker, freed, finds nothing
     * to run (before: a fixed 100 ms, and a slow main thread let t[1] run). */
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, destroy_main, x), 0);
    uint64_t dl = kvt__deadline_ns(WAIT_MS);
    bool began;
    while (!(began = atomic_load(&t[3].cancel) != 0) && kvt__now_ns() < dl) usleep(1000);
    ops_open(&o);
    pthread_join(th, NULL);
    assert_true(began);
    assert_int_equal(rec[0].calls, 1);
    assert_int_equal(rec[0].status, KVT_OK);
    for (int i = 1; i < 4; i++) {
        assert_int_equal(rec[i].calls, 1);
        assert_int_equal(rec[i].status, KVT_ECANCELED);
    }
    assert_int_equal(ops_calls(&o), 1);
    ops_fini(&o);
    rig_fini(&r);
}

/* Zero-block tasks complete; idle create/destroy cycles are clean. */
static void test_empty_and_cycles(void **state)
{
    (void)state;
    rig r;
    rig_init(&r, make_geo(3, 4, KVT_LAYOUT_LAYER_FIRST, true), 1, 4, 1);
    for (uint32_t w = 1; w <= 4; w++) {
        kvt_xfer *x = NULL;
        assert_ok(kvt__xfer_create(&x, w, &kvt__host_copy_ops));
        kvt_xfer_task t;
        done_rec rec;
        task_init(&t, &r, KVT_XFER_SCATTER, 0, NULL, NULL, &rec);
        assert_ok(kvt__xfer_submit(x, &t));
        assert_ok(kvt__xfer_wait_layer(x, &t, 2, kvt__deadline_ns(WAIT_MS)));
        assert_int_equal(wait_done(&rec), KVT_OK);
        kvt__xfer_destroy(x);
    }
    kvt__xfer_destroy(NULL);
    rig_fini(&r);
}

static void test_bad_args(void **state)
{
    (void)state;
    kvt_xfer *x = (kvt_xfer *)0x1;
    assert_status(kvt__xfer_create(&x, 0, &kvt__host_copy_ops), KVT_EINVAL);
    assert_non_null(strstr(kvt_last_error(), "workers is 0"));
    assert_status(kvt__xfer_create(&x, 65, &kvt__host_copy_ops), KVT_EINVAL);
    assert_status(kvt__xfer_create(&x, 1, NULL), KVT_EINVAL);
    kvt_copy_ops bad = {.name = "bad", .copy = NULL};
    assert_status(kvt__xfer_create(&x, 1, &bad), KVT_EINVAL);
    assert_non_null(strstr(kvt_last_error(), "ops->copy"));
    assert_ptr_equal(x, (kvt_xfer *)0x1);

    rig r;
    rig_init(&r, make_geo(2, 4, KVT_LAYOUT_LAYER_FIRST, false), 2, 4, 1);
    assert_ok(kvt__xfer_create(&x, 1, &kvt__host_copy_ops));
    kvt_xfer_task t;
    done_rec rec;
    static const uint32_t ok_pages[] = {0, 1}, bad_pages[] = {0, 4};
    task_init(&t, &r, KVT_XFER_GATHER, 1, r.blocks, bad_pages, &rec);
    assert_status(kvt__xfer_submit(x, &t), KVT_EINVAL);
    assert_non_null(strstr(kvt_last_error(), "pages[1] is 4"));
    task_init(&t, &r, KVT_XFER_GATHER, 1, r.blocks, ok_pages, &rec);
    t.block_tokens = 6;
    assert_status(kvt__xfer_submit(x, &t), KVT_EINVAL);
    assert_non_null(strstr(kvt_last_error(), "block_tokens 6"));
    task_init(&t, &r, (kvt_xfer_dir)7, 1, r.blocks, ok_pages, &rec);
    assert_status(kvt__xfer_submit(x, &t), KVT_EINVAL);
    task_init(&t, &r, KVT_XFER_GATHER, 1, r.blocks, ok_pages, &rec);
    t.on_done = NULL;
    assert_status(kvt__xfer_submit(x, &t), KVT_EINVAL);
    assert_status(kvt__xfer_submit(x, NULL), KVT_EINVAL);
    /* Rejected submissions never call on_done. */
    assert_int_equal(rec.calls, 0);
    task_init(&t, &r, KVT_XFER_GATHER, 1, r.blocks, ok_pages, &rec);
    assert_ok(kvt__xfer_submit(x, &t));
    assert_status(kvt__xfer_wait_layer(x, &t, 2, kvt__deadline_ns(WAIT_MS)), KVT_EINVAL);
    assert_non_null(strstr(kvt_last_error(), "layer 2"));
    assert_int_equal(wait_done(&rec), KVT_OK);
    kvt__xfer_destroy(x);
    rig_fini(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip_layer_first),
        cmocka_unit_test(test_roundtrip_page_first),
        cmocka_unit_test(test_large_unit),
        cmocka_unit_test(test_many_concurrent_tasks),
        cmocka_unit_test(test_cancel_before_start),
        cmocka_unit_test(test_cancel_mid_run),
        cmocka_unit_test(test_cancel_within_unit),
        cmocka_unit_test(test_wait_deadline),
        cmocka_unit_test(test_copy_error),
        cmocka_unit_test(test_destroy_with_queued),
        cmocka_unit_test(test_empty_and_cycles),
        cmocka_unit_test(test_bad_args),
    };
    return cmocka_run_group_tests(tests, board_setup, board_teardown);
}
