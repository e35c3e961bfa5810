/* test_cuda_plan.c - the host side of the cuda copy backend, on every
 * machine (no CUDA needed): the batched copy descriptors built per layer and
 * direction (cudaMemcpyBatchAsync arrays and attributes, the copy kernel's
 * descriptors through pinned ranges), the transfer engine's asynchronous
 * ops protocol (one batched call per layer and direction, an event recorded
 * per layer, sync after), and the engine memory kind checks. */
#include "support.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include "cuda/cuda.h"
#include "layout/layout.h"
#include "util/clock.h"
#include "util/sync.h"
#include "xfer/xfer.h"

#define WAIT_MS 20000

static void plan_batch_gather_scatter(void **state)
{
    (void)state;
    uint8_t dev[4096], host[4096];
    kvt_copy_chunk ch[3] = {
        {.dst = host, .src = dev + 1024, .len = 512},
        {.dst = host + 512, .src = dev, .len = 1024},
        {.dst = host + 2048, .src = dev + 3000, .len = 7},
    };
    void *dsts[3];
    const void *srcs[3];
    size_t sizes[3];
    kvt_cu_memcpy_attr a;
    kvt__cuda_plan_batch(ch, 3, KVT_XFER_GATHER, 5, dsts, srcs, sizes, &a);
    for (int i = 0; i < 3; i++) {
        assert_ptr_equal(dsts[i], ch[i].dst);
        assert_ptr_equal(srcs[i], ch[i].src);
        assert_int_equal(sizes[i], ch[i].len);
    }
    assert_int_equal(a.src_access_order, KVT_CU_SRC_ORDER_STREAM);
    assert_int_equal(a.src_loc_hint.type, KVT_CU_LOC_DEVICE);
    assert_int_equal(a.src_loc_hint.id, 5);
    assert_int_equal(a.dst_loc_hint.type, KVT_CU_LOC_HOST);
    assert_int_equal(a.flags, 0);
    kvt__cuda_plan_batch(ch, 3, KVT_XFER_SCATTER, 2, dsts, srcs, sizes, &a);
    assert_int_equal(a.src_loc_hint.type, KVT_CU_LOC_HOST);
    assert_int_equal(a.dst_loc_hint.type, KVT_CU_LOC_DEVICE);
    assert_int_equal(a.dst_loc_hint.id, 2);
    /* The mirrored struct has the CUDA 12.8+ layout: 4 + 8 + 8 + 4 bytes. */
    assert_int_equal(sizeof(kvt_cu_memcpy_attr), 24);
    assert_int_equal(sizeof(kvt_cuda_desc), 24);
}

static void plan_kernel_translates_host_side(void **state)
{
    (void)state;
    static uint8_t pinned[1 << 20], other[64];
    uint8_t *fake_dev = (uint8_t *)(uintptr_t)0x7f0000000000ull;
    kvt_cuda_range r[2] = {{.host = other, .dev = (uint8_t *)(uintptr_t)0x100, .len = 64},
                           {.host = pinned, .dev = fake_dev, .len = sizeof pinned}};
    uint8_t *gpu = (uint8_t *)(uintptr_t)0x500000000ull;
    kvt_copy_chunk ch[2] = {{.dst = pinned + 4096, .src = gpu, .len = 256 * 1024},
                            {.dst = pinned + 300000, .src = gpu + 1000000, .len = 100}};
    kvt_cuda_desc d[2];
    uint32_t gy = 0;
    assert_ok(kvt__cuda_plan_kernel(ch, 2, KVT_XFER_GATHER, r, 2, d, &gy));
    assert_int_equal(d[0].dst, (uint64_t)(uintptr_t)fake_dev + 4096);
    assert_int_equal(d[0].src, (uint64_t)(uintptr_t)gpu);
    assert_int_equal(d[0].len, 256 * 1024);
    assert_int_equal(d[1].dst, (uint64_t)(uintptr_t)fake_dev + 300000);
    assert_int_equal(gy, 4); /* 256 KiB in 64 KiB slices */
    /* Scatter: the source is the host side. */
    kvt_copy_chunk sc = {.dst = gpu + 8, .src = pinned + 16, .len = 10};
    assert_ok(kvt__cuda_plan_kernel(&sc, 1, KVT_XFER_SCATTER, r, 2, d, &gy));
    assert_int_equal(d[0].src, (uint64_t)(uintptr_t)fake_dev + 16);
    assert_int_equal(d[0].dst, (uint64_t)(uintptr_t)gpu + 8);
    assert_int_equal(gy, 1);
    /* A huge chunk: slices are capped. */
    kvt_copy_chunk big = {.dst = gpu, .src = pinned, .len = sizeof pinned};
    assert_ok(kvt__cuda_plan_kernel(&big, 1, KVT_XFER_SCATTER, r, 2, d, &gy));
    assert_int_equal(gy, 16);
    big.len = 64ull << 20;
    r[1].len = big.len; /* pretend */
    assert_ok(kvt__cuda_plan_kernel(&big, 1, KVT_XFER_SCATTER, r, 2, d, &gy));
    assert_int_equal(gy, KVT_CUDA_MAX_SLICES);
    r[1].len = sizeof pinned;
    /* Unpinned host memory, or a chunk running past its range: refused. */
    uint8_t stack[32];
    kvt_copy_chunk bad = {.dst = stack, .src = gpu, .len = 32};
    assert_status(kvt__cuda_plan_kernel(&bad, 1, KVT_XFER_GATHER, r, 2, d, &gy), KVT_EINVAL);
    assert_non_null(strstr(kvt_last_error(), "is not in pinned memory"));
    kvt_copy_chunk past = {.dst = pinned + sizeof pinned - 8, .src = gpu, .len = 16};
    assert_status(kvt__cuda_plan_kernel(&past, 1, KVT_XFER_GATHER, r, 2, d, &gy), KVT_EINVAL);
}

static void mode_names(void **state)
{
    (void)state;
    kvt_cuda_mode m;
    const char *names[] = {"auto", "batch", "kernel", "memcpy"};
    for (int i = 0; i < 4; i++) {
        assert_ok(kvt__cuda_mode_parse(names[i], &m));
        assert_int_equal(m, i);
        assert_string_equal(kvt__cuda_mode_name(m), names[i]);
    }
    assert_ok(kvt__cuda_mode_parse(NULL, &m));
    assert_int_equal(m, KVT_CUDA_AUTO);
    assert_status(kvt__cuda_mode_parse("fast", &m), KVT_EINVAL);
    assert_string_equal(kvt_last_error(),
                        "CUDA copy mode \"fast\" is not auto, batch, kernel or memcpy");
}

/* ---- the transfer engine with an asynchronous ops table ---- */

typedef struct fake_async {
    pthread_mutex_t mu;
    int calls[2][64];   /* [dir-1][layer]: copy_async calls */
    int chunks[2][64];  /* chunks in them */
    int records, syncs, workers_made, workers_exited;
    int events[64];     /* the "events": their addresses are handed out */
    kvt_cuda_range range; /* the blocks, "pinned" at a fake device address */
    int layer_of_call;  /* set by the test per unit (one task at a time) */
} fake_async;

/* Plans like the kernel path, checks the descriptors, and "executes" them
 * by translating the host side back. */
static kvt_status fake_copy_async(void *ctx, void **wctx, int dir, const kvt_copy_chunk *ch,
                                  uint32_t n)
{
    fake_async *f = ctx;
    if (!*wctx) {
        pthread_mutex_lock(&f->mu);
        f->workers_made++;
        pthread_mutex_unlock(&f->mu);
        *wctx = calloc(1, sizeof(int)); /* this worker's "stream": copies pending on it */
    }
    kvt_cuda_desc *d = calloc(n, sizeof *d);
    uint32_t gy;
    kvt_status st = kvt__cuda_plan_kernel(ch, n, dir, &f->range, 1, d, &gy);
    if (st) {
        free(d);
        return st;
    }
    void **dsts = calloc(n, sizeof *dsts);
    const void **srcs = calloc(n, sizeof *srcs);
    size_t *sizes = calloc(n, sizeof *sizes);
    kvt_cu_memcpy_attr a;
    kvt__cuda_plan_batch(ch, n, dir, 0, dsts, srcs, sizes, &a);
    for (uint32_t i = 0; i < n; i++) {
        assert_int_equal(sizes[i], d[i].len);
        uint64_t host = dir == KVT_XFER_GATHER ? d[i].dst : d[i].src;
        uint8_t *h = f->range.host + (host - (uint64_t)(uintptr_t)f->range.dev);
        if (dir == KVT_XFER_GATHER) {
            assert_ptr_equal(h, dsts[i]);
            memcpy(h, (void *)(uintptr_t)d[i].src, d[i].len);
        } else {
            assert_ptr_equal(h, srcs[i]);
            memcpy((void *)(uintptr_t)d[i].dst, h, d[i].len);
        }
    }
    free(d);
    free(dsts);
    free((void *)srcs);
    free(sizes);
    ++*(int *)*wctx;
    return KVT_OK;
}

static kvt_status fake_record(void *ctx, void **wctx, void **event)
{
    fake_async *f = ctx;
    /* Recorded after the unit's copies, on the same worker's stream: a
     * count shared by the workers let one worker's sync hide another's
     * copies (a flaky failure in a worker thread, exit status 255). */
    assert_true(*wctx && *(int *)*wctx > 0);
    pthread_mutex_lock(&f->mu);
    f->records++;
    if (event && !*event) *event = &f->events[f->records % 64];
    pthread_mutex_unlock(&f->mu);
    return KVT_OK;
}

static kvt_status fake_sync(void *ctx, void **wctx)
{
    fake_async *f = ctx;
    if (*wctx) *(int *)*wctx = 0;
    pthread_mutex_lock(&f->mu);
    f->syncs++;
    pthread_mutex_unlock(&f->mu);
    return KVT_OK;
}

static void fake_exit(void *ctx, void *wctx)
{
    fake_async *f = ctx;
    pthread_mutex_lock(&f->mu);
    f->workers_exited++;
    pthread_mutex_unlock(&f->mu);
    free(wctx);
}

static kvt_status never_copy(void *ctx, const kvt_copy_chunk *c, uint32_t n)
{
    fail_msg("the synchronous copy must not be called with copy_async set");
    return KVT_EIO;
}

typedef struct done_flag {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done;
    kvt_status st;
} done_flag;

static void on_done(kvt_xfer_task *t, kvt_status st)
{
    done_flag *d = t->user;
    pthread_mutex_lock(&d->mu);
    d->done = 1;
    d->st = st;
    pthread_cond_broadcast(&d->cv);
    pthread_mutex_unlock(&d->mu);
}

static void wait_done(done_flag *d)
{
    uint64_t dl = kvt__deadline_ns(WAIT_MS);
    pthread_mutex_lock(&d->mu);
    while (!d->done && kvt__now_ns() < dl) kvt__cond_wait_until(&d->cv, &d->mu, dl);
    pthread_mutex_unlock(&d->mu);
    assert_true(d->done);
}

static void run_task(kvt_xfer *x, kvt_xfer_task *t, done_flag *d)
{
    d->done = 0;
    t->on_done = on_done;
    t->user = d;
    assert_ok(kvt__xfer_submit(x, t));
    wait_done(d);
    assert_int_equal(d->st, KVT_OK);
}

/* Store then load through the async protocol: byte-exact, one copy_async per
 * layer and direction (the unit has < 512 chunks), one event per layer,
 * one sync per unit; the events are reported by wait_recorded. */
static void xfer_async_protocol(void **state)
{
    (void)state;
    const uint32_t L = 6, TPP = 4, BT = 16, NB = 5, PAGES = 64;
    kvt_geometry *g = kvt_test_geometry(L, 2, 32, TPP, KVT_LAYOUT_LAYER_FIRST);
    kvt_emu *emu;
    assert_ok(kvt_emu_create(&emu, g, PAGES));
    kvt_engine_memory mem;
    assert_ok(kvt_emu_memory(emu, &mem));
    kvt_page_map *map = malloc(sizeof *map);
    assert_ok(kvt__page_map_init(map, g, &mem));
    uint64_t block_bytes = kvt__geo_bytes_per_token(g) * BT;
    uint8_t *blocks_mem = calloc(NB, block_bytes);
    uint8_t *blocks[NB];
    for (uint32_t b = 0; b < NB; b++) blocks[b] = blocks_mem + b * block_bytes;
    /* Pages in order 0..19 for the store, then loaded into 40..59. */
    uint32_t ppb = BT / TPP, np = NB * ppb, store_pages[64], load_pages[64];
    for (uint32_t i = 0; i < np; i++) {
        store_pages[i] = (i * 7) % 20; /* scattered: no merging across pages */
        load_pages[i] = 40 + (i * 3) % 20;
    }
    uint32_t tokens[NB * 16 + 1];
    kvt_test_tokens(tokens, NB * BT + 1, 3);
    kvt_request req = {.tokens = tokens, .num_tokens = NB * BT + 1};
    assert_ok(kvt_emu_fill(emu, &req, 0, NB * BT, store_pages, np));

    fake_async f;
    memset(&f, 0, sizeof f);
    pthread_mutex_init(&f.mu, NULL);
    f.range = (kvt_cuda_range){.host = blocks_mem, .dev = (uint8_t *)(uintptr_t)0x10000000000ull,
                               .len = NB * block_bytes};
    kvt_copy_ops ops = {.name = "fake-async", .copy = never_copy, .ctx = &f,
                        .copy_async = fake_copy_async, .record = fake_record, .sync = fake_sync,
                        .worker_exit = fake_exit};
    kvt_xfer *x;
    assert_ok(kvt__xfer_create(&x, 2, &kvt__host_copy_ops));
    assert_ok(kvt__xfer_set_ops(x, &ops));
    done_flag d;
    pthread_mutex_init(&d.mu, NULL);
    assert_int_equal(kvt__cond_init(&d.cv), 0);

    kvt_xfer_task st = {.dir = KVT_XFER_GATHER, .geo = g, .map = map, .block_tokens = BT,
                        .num_blocks = NB, .blocks = blocks, .pages = store_pages};
    run_task(x, &st, &d);
    assert_int_equal(f.records, (int)L); /* a store has no events, but records are still made */
    assert_int_equal(f.syncs, (int)L);
    /* Too late to switch ops now. */
    assert_status(kvt__xfer_set_ops(x, &kvt__host_copy_ops), KVT_ESTATE);

    assert_ok(kvt_emu_poison(emu, load_pages, np));
    void *events[64] = {0};
    kvt_xfer_task lt = {.dir = KVT_XFER_SCATTER, .geo = g, .map = map, .block_tokens = BT,
                        .num_blocks = NB, .blocks = blocks, .pages = load_pages,
                        .layer_events = events};
    run_task(x, &lt, &d);
    for (uint32_t l = 0; l < L; l++) {
        assert_ok(kvt__xfer_wait_recorded(x, &lt, l, kvt__deadline_ns(WAIT_MS)));
        assert_non_null(events[l]);
        assert_true(lt.layer_recorded[l]);
    }
    assert_int_equal(f.records, 2 * (int)L);
    assert_int_equal(f.syncs, 2 * (int)L);
    kvt_verify_result v;
    assert_ok(kvt_emu_verify(emu, &req, 0, NB * BT, load_pages, np, &v));
    assert_int_equal(v.mismatches, 0);
    assert_true(v.bytes_checked > 0);

    kvt__xfer_destroy(x);
    assert_int_equal(f.workers_exited, f.workers_made);
    assert_true(f.workers_made >= 1);

    /* With the host ops, wait_recorded says there are no events. */
    assert_ok(kvt__xfer_create(&x, 1, &kvt__host_copy_ops));
    kvt_xfer_task ht = lt;
    ht.layer_events = NULL;
    run_task(x, &ht, &d);
    assert_status(kvt__xfer_wait_recorded(x, &ht, 0, kvt__deadline_ns(0)), KVT_ESTATE);
    kvt__xfer_destroy(x);

    free(blocks_mem);
    free(map);
    kvt_emu_destroy(emu);
    kvt_geometry_destroy(g);
}

/* Exactly one copy_async per layer per direction: count with a fresh
 * xfer whose copy_async tallies by the (single) layer of the unit. */
static int g_calls;
static kvt_status counting_async(void *ctx, void **wctx, int dir, const kvt_copy_chunk *ch,
                                 uint32_t n)
{
    if (!*wctx) *wctx = malloc(1);
    __atomic_add_fetch(&g_calls, 1, __ATOMIC_RELAXED);
    for (uint32_t i = 0; i < n; i++) memcpy(ch[i].dst, ch[i].src, ch[i].len);
    return KVT_OK;
}
static kvt_status nop_record(void *ctx, void **wctx, void **ev) { return KVT_OK; }
static kvt_status nop_sync(void *ctx, void **wctx) { return KVT_OK; }
static void free_exit(void *ctx, void *wctx) { free(wctx); }

static void one_batched_call_per_layer(void **state)
{
    (void)state;
    const uint32_t L = 10, TPP = 2, BT = 8, NB = 16;
    kvt_geometry *g = kvt_test_geometry(L, 1, 64, TPP, KVT_LAYOUT_LAYER_FIRST);
    kvt_emu *emu;
    assert_ok(kvt_emu_create(&emu, g, 256));
    kvt_engine_memory mem;
    assert_ok(kvt_emu_memory(emu, &mem));
    kvt_page_map *map = malloc(sizeof *map);
    assert_ok(kvt__page_map_init(map, g, &mem));
    uint64_t bb = kvt__geo_bytes_per_token(g) * BT;
    uint8_t *bm = calloc(NB, bb), *blocks[NB];
    for (uint32_t b = 0; b < NB; b++) blocks[b] = bm + b * bb;
    uint32_t pages[64];
    for (uint32_t i = 0; i < NB * BT / TPP; i++) pages[i] = (i * 37) % 256; /* 64 chunks/comp */
    kvt_copy_ops ops = {.name = "count", .copy = never_copy, .copy_async = counting_async,
                        .record = nop_record, .sync = nop_sync, .worker_exit = free_exit};
    kvt_xfer *x;
    assert_ok(kvt__xfer_create(&x, 3, &ops));
    done_flag d;
    pthread_mutex_init(&d.mu, NULL);
    assert_int_equal(kvt__cond_init(&d.cv), 0);
    for (int dir = KVT_XFER_GATHER; dir <= KVT_XFER_SCATTER; dir++) {
        g_calls = 0;
        kvt_xfer_task t = {.dir = dir, .geo = g, .map = map, .block_tokens = BT,
                           .num_blocks = NB, .blocks = blocks, .pages = pages};
        run_task(x, &t, &d);
        assert_int_equal(g_calls, (int)L); /* 128 chunks per layer: one call each */
    }
    kvt__xfer_destroy(x);
    free(bm);
    free(map);
    kvt_emu_destroy(emu);
    kvt_geometry_destroy(g);
}

/* The memory kind: a bad kind is named; device memory where only host memory
 * is supported (the PD path's page map) is refused. */
static void memory_kind_checks(void **state)
{
    (void)state;
    kvt_geometry *g = kvt_test_geometry(2, 1, 8, 4, KVT_LAYOUT_PAGE_FIRST);
    kvt_page_map *map = malloc(sizeof *map);
    static uint8_t buf[1 << 16];
    kvt_engine_memory m = {.num_pages = 4, .base = buf};
    assert_ok(kvt__page_map_init(map, g, &m));
    m.kind = (kvt_memory_kind)7;
    assert_status(kvt__page_map_init(map, g, &m), KVT_EINVAL);
    assert_string_equal(kvt_last_error(), "kvt_cache_register_memory: kind is 7 "
                                          "(KVT_MEMORY_HOST or KVT_MEMORY_CUDA)");
    m.kind = KVT_MEMORY_CUDA;
    assert_status(kvt__page_map_init_fn(map, g, &m, "kvt_pd_sender_create"), KVT_EUNSUPPORTED);
    assert_string_equal(kvt_last_error(), "kvt_pd_sender_create: CUDA device memory is not "
                                          "supported here yet (kvt_cache_register_memory and "
                                          "kvt_client_register_memory take it; docs/gpu.md)");
    assert_int_equal(kvt_abi_struct_size("kvt_engine_memory"), sizeof(kvt_engine_memory));
    free(map);
    kvt_geometry_destroy(g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(plan_batch_gather_scatter),
        cmocka_unit_test(plan_kernel_translates_host_side),
        cmocka_unit_test(mode_names),
        cmocka_unit_test(xfer_async_protocol),
        cmocka_unit_test(one_batched_call_per_layer),
        cmocka_unit_test(memory_kind_checks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
