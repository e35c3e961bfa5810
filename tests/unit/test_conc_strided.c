/* test_conc_strided.c - engine memory described by strides
 * (kvt_engine_memory.page_strides / token_strides): SGLang's page_first
 * host pool (every layer's token t side by side, so a page's tokens of one
 * layer are interleaved with the other layers') and page_first_direct
 * (page-major, then layer; here with padding between pages), registered
 * with no copy.
 *
 * Every check is byte for byte against an image of the whole engine
 * buffer: after a load, the loaded tokens hold the stored request's KV and
 * every other byte (other layers' tokens, padding, other pages) still holds
 * the poison it had, so a copy that lands one stride off or runs past a
 * token fails. Through a server, a block stored from a strided pool loads
 * into a layer-first engine (kvt_emu_verify) and back: blocks do not depend
 * on the engine's layout. Concurrent: copies run on worker threads. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support.h"

#define LAYERS 3
#define HEADS 2
#define HDIM 8
#define TB (HEADS * HDIM * 2) /* token bytes of one (layer, component) */
#define TPP 4
#define BT 8 /* block tokens: two pages per block */
#define BLOCKS 3
#define NTOK (BLOCKS * BT + 1)
#define NP (BLOCKS * BT / TPP)
#define PAGES 16
#define PAD 24 /* page_first_direct: bytes between pages nobody owns */
#define WAIT_MS 10000
#define UNITS (LAYERS * KVT_MAX_COMPONENTS)

typedef enum { PAGE_FIRST, PAGE_FIRST_DIRECT } pool_layout;

/* A host pool as SGLang lays it out: one buffer for K, one for V. */
typedef struct pool {
    pool_layout layout;
    size_t bytes;        /* of each buffer */
    uint8_t *buf[2];     /* K, V */
    uint8_t *image[2];   /* what buf must hold */
    void *bases[UNITS];
    uint64_t page_strides[UNITS], token_strides[UNITS], sizes[UNITS];
} pool;

static uint64_t page_stride(const pool *p)
{
    return p->layout == PAGE_FIRST ? (uint64_t)TPP * LAYERS * TB : (uint64_t)LAYERS * TPP * TB + PAD;
}

/* Offset of token t of page pg of layer l in its component's buffer. */
static size_t token_off(const pool *p, uint32_t pg, uint32_t t, uint32_t l)
{
    if (p->layout == PAGE_FIRST) return ((size_t)(pg * TPP + t) * LAYERS + l) * TB;
    return pg * page_stride(p) + ((size_t)l * TPP + t) * TB;
}

static void pool_init(pool *p, pool_layout layout, kvt_engine_memory *mem)
{
    memset(p, 0, sizeof *p);
    p->layout = layout;
    p->bytes = PAGES * page_stride(p);
    for (int c = 0; c < 2; c++) {
        p->buf[c] = malloc(p->bytes);
        p->image[c] = malloc(p->bytes);
        assert_non_null(p->buf[c]);
        assert_non_null(p->image[c]);
        memset(p->buf[c], 0xA5, p->bytes);
        memset(p->image[c], 0xA5, p->bytes);
    }
    for (uint32_t l = 0; l < LAYERS; l++)
        for (uint32_t c = 0; c < 2; c++) {
            uint32_t u = l * KVT_MAX_COMPONENTS + c;
            size_t first = token_off(p, 0, 0, l);
            p->bases[u] = p->buf[c] + first;
            p->page_strides[u] = page_stride(p);
            p->token_strides[u] = layout == PAGE_FIRST ? (uint64_t)LAYERS * TB : TB;
            p->sizes[u] = p->bytes - first;
        }
    memset(mem, 0, sizeof *mem);
    mem->num_pages = PAGES;
    mem->layer_bases = p->bases;
    mem->buffer_bytes = p->sizes;
    mem->page_strides = p->page_strides;
    /* page_first_direct's tokens are contiguous: no token_strides at all */
    mem->token_strides = layout == PAGE_FIRST ? p->token_strides : NULL;
}

static void pool_free(pool *p)
{
    for (int c = 0; c < 2; c++) {
        free(p->buf[c]);
        free(p->image[c]);
    }
}

/* Writes request r's KV for tokens [0, NP * TPP) into pages (the image too). */
static void pool_fill(pool *p, kvt_emu *emu, const kvt_request *r, const uint32_t *pages)
{
    for (uint32_t i = 0; i < NP * TPP; i++)
        for (uint32_t l = 0; l < LAYERS; l++)
            for (uint32_t c = 0; c < 2; c++) {
                size_t off = token_off(p, pages[i / TPP], i % TPP, l);
                assert_ok(kvt_emu_token_kv(emu, r, i, l, c, p->image[c] + off, TB));
                memcpy(p->buf[c] + off, p->image[c] + off, TB);
            }
}

/* The expected KV of request r in pages, in the image only. */
static void pool_expect(pool *p, kvt_emu *emu, const kvt_request *r, const uint32_t *pages)
{
    for (uint32_t i = 0; i < NP * TPP; i++)
        for (uint32_t l = 0; l < LAYERS; l++)
            for (uint32_t c = 0; c < 2; c++)
                assert_ok(kvt_emu_token_kv(emu, r, i, l, c,
                                           p->image[c] + token_off(p, pages[i / TPP], i % TPP, l), TB));
}

static void pool_check(const pool *p)
{
    for (int c = 0; c < 2; c++)
        for (size_t i = 0; i < p->bytes; i++)
            if (p->buf[c][i] != p->image[c][i])
                fail_msg("%s buffer byte %zu is 0x%02x, want 0x%02x (first of the differing bytes)",
                         c ? "V" : "K", i, p->buf[c][i], p->image[c][i]);
}

static kvt_geometry *geo(void)
{
    return kvt_test_geometry(LAYERS, HEADS, HDIM, TPP, KVT_LAYOUT_LAYER_FIRST);
}

static kvt_config *config(void)
{
    kvt_config *cfg = NULL;
    assert_ok(kvt_config_create(&cfg));
    assert_ok(kvt_config_set(cfg, "cpu_capacity", "1MiB"));
    assert_ok(kvt_config_set(cfg, "block_tokens", "8"));
    assert_ok(kvt_config_set(cfg, "huge_pages", "false"));
    return cfg;
}

/* The engine-side calls: a cache or a client. */
typedef struct side {
    kvt_cache *cache;
    kvt_client *cl;
} side;

static void side_store(side *s, const kvt_request *r, const uint32_t *pages)
{
    kvt_store_plan p;
    kvt_task_result res;
    if (s->cache) {
        assert_ok(kvt_cache_prepare_store(s->cache, r, &p));
        assert_int_equal(p.num_tokens, BLOCKS * BT);
        assert_ok(kvt_cache_launch(s->cache, p.task, pages, NP));
        assert_ok(kvt_cache_wait(s->cache, p.task, WAIT_MS, &res));
    } else {
        assert_ok(kvt_client_prepare_store(s->cl, r, &p));
        assert_int_equal(p.num_tokens, BLOCKS * BT);
        assert_ok(kvt_client_launch(s->cl, p.task, pages, NP));
        assert_ok(kvt_client_wait(s->cl, p.task, WAIT_MS, &res));
    }
    assert_int_equal(res.status, KVT_OK);
}

static void side_load(side *s, const kvt_request *r, const uint32_t *pages)
{
    kvt_match m;
    kvt_task_result res;
    if (s->cache) {
        assert_ok(kvt_cache_lookup(s->cache, r, &m));
        assert_int_equal(m.matched_tokens, BLOCKS * BT);
        assert_ok(kvt_cache_launch(s->cache, m.task, pages, NP));
        for (uint32_t l = 0; l < LAYERS; l++) assert_ok(kvt_cache_wait_layer(s->cache, m.task, l, WAIT_MS));
        assert_ok(kvt_cache_wait(s->cache, m.task, WAIT_MS, &res));
    } else {
        assert_ok(kvt_client_lookup(s->cl, r, &m));
        assert_int_equal(m.matched_tokens, BLOCKS * BT);
        assert_ok(kvt_client_launch(s->cl, m.task, pages, NP));
        for (uint32_t l = 0; l < LAYERS; l++) assert_ok(kvt_client_wait_layer(s->cl, m.task, l, WAIT_MS));
        assert_ok(kvt_client_wait(s->cl, m.task, WAIT_MS, &res));
    }
    assert_int_equal(res.status, KVT_OK);
    assert_int_equal(res.num_tokens, BLOCKS * BT);
}

/* Stores a request from pages src of a strided pool, poisons the pool,
 * loads it into other pages (not in order) and checks every byte. */
static void round_trip(pool_layout layout)
{
    kvt_geometry *g = geo();
    kvt_config *cfg = config();
    side s = {0};
    assert_ok(kvt_cache_create(&s.cache, cfg, g));
    kvt_emu *emu = NULL; /* the reference KV only; its pages are unused */
    assert_ok(kvt_emu_create(&emu, g, 1));
    pool p;
    kvt_engine_memory mem;
    pool_init(&p, layout, &mem);
    assert_ok(kvt_cache_register_memory(s.cache, &mem));

    uint32_t toks[NTOK], src[NP], dst[NP];
    kvt_test_tokens(toks, NTOK, 7);
    kvt_request r = {toks, NTOK, "strided", 7};
    for (uint32_t i = 0; i < NP; i++) {
        src[i] = i;
        dst[i] = PAGES - 1 - 2 * i; /* reversed, with gaps between them */
    }
    pool_fill(&p, emu, &r, src);
    side_store(&s, &r, src);
    pool_check(&p); /* a store does not write into the engine */
    for (int c = 0; c < 2; c++) {
        memset(p.buf[c], 0xA5, p.bytes);
        memset(p.image[c], 0xA5, p.bytes);
    }
    pool_expect(&p, emu, &r, dst);
    side_load(&s, &r, dst);
    pool_check(&p);

    kvt_cache_destroy(s.cache);
    pool_free(&p);
    kvt_emu_destroy(emu);
    kvt_config_destroy(cfg);
    kvt_geometry_destroy(g);
}

static void test_page_first_round_trip(void **state)
{
    (void)state;
    round_trip(PAGE_FIRST);
}

static void test_page_first_direct_round_trip(void **state)
{
    (void)state;
    round_trip(PAGE_FIRST_DIRECT);
}

/* Strides that cannot describe a pool are refused, naming the field. */
static void test_bad_strides_refused(void **state)
{
    (void)state;
    kvt_geometry *g = geo();
    kvt_config *cfg = config();
    kvt_cache *c = NULL;
    assert_ok(kvt_cache_create(&c, cfg, g));
    pool p;
    kvt_engine_memory mem;
    pool_init(&p, PAGE_FIRST, &mem);

    kvt_engine_memory m = mem;
    m.page_strides = NULL;
    assert_status(kvt_cache_register_memory(c, &m), KVT_EINVAL);
    assert_non_null(strstr(kvt_last_error(), "token_strides is set but page_strides is NULL"));

    p.token_strides[3] = TB - 1; /* layer 1 V: tokens would overlap */
    assert_status(kvt_cache_register_memory(c, &mem), KVT_EINVAL);
    assert_non_null(strstr(kvt_last_error(), "token_strides[3] (layer 1 V) is 31"));
    p.token_strides[3] = LAYERS * TB;

    p.page_strides[4] = 2; /* element strides, not bytes */
    assert_status(kvt_cache_register_memory(c, &mem), KVT_EINVAL);
    assert_non_null(strstr(kvt_last_error(), "page_strides[4] (layer 2 K) is 2"));
    p.page_strides[4] = UINT64_MAX / 2;
    assert_status(kvt_cache_register_memory(c, &mem), KVT_EINVAL);
    assert_non_null(strstr(kvt_last_error(), "overflow 64 bits"));
    p.page_strides[4] = page_stride(&p);

    p.sizes[5] -= 1; /* one byte short of the last token */
    assert_status(kvt_cache_register_memory(c, &mem), KVT_EGEOMETRY);
    assert_non_null(strstr(kvt_last_error(), "buffer_bytes[5] (layer 2 V)"));
    p.sizes[5] += 1;

    void *keep = p.bases[0];
    p.bases[0] = NULL;
    assert_status(kvt_cache_register_memory(c, &mem), KVT_EINVAL);
    assert_non_null(strstr(kvt_last_error(), "layer_bases[0] (layer 0 K) is NULL"));
    p.bases[0] = keep;

    assert_ok(kvt_cache_register_memory(c, &mem)); /* nothing above stuck */
    kvt_cache_destroy(c);
    pool_free(&p);
    kvt_config_destroy(cfg);
    kvt_geometry_destroy(g);
}

/* ------------------------------------------------------------------ */
/* Through a server: a strided pool and a layer-first engine share blocks */

static kvt_status make_server(kvt_server **out, void *path)
{
    kvt_config *cfg = config();
    kvt_geometry *g = geo();
    kvt_status st = kvt_config_set(cfg, "server_socket", path);
    if (!st) st = kvt_server_create(out, cfg, g);
    kvt_geometry_destroy(g);
    kvt_config_destroy(cfg);
    return st;
}

static void check_emu(kvt_emu *emu, const kvt_request *r, const uint32_t *pages)
{
    kvt_verify_result v;
    assert_ok(kvt_emu_verify(emu, r, 0, NP * TPP, pages, NP, &v));
    if (v.mismatches || v.bytes_checked == 0)
        fail_msg("%llu of %llu bytes differ (first at token %u layer %u)",
                 (unsigned long long)v.mismatches, (unsigned long long)v.bytes_checked,
                 v.first_bad_token, v.first_bad_layer);
}

static void test_strided_and_layer_first_share_blocks(void **state)
{
    (void)state;
    char dir[256], path[300];
    kvt_test_mkdtemp(dir, sizeof dir, "strided");
    snprintf(path, sizeof path, "%s/s.sock", dir);
    pid_t pid = kvt_test_server_fork(make_server, path);
    kvt_geometry *g = geo();
    side a = {0}, b = {0};
    assert_ok(kvt_client_attach(&a.cl, path, g, WAIT_MS));
    assert_ok(kvt_client_attach(&b.cl, path, g, WAIT_MS));
    pool p;
    kvt_engine_memory mem;
    pool_init(&p, PAGE_FIRST, &mem);
    assert_ok(kvt_client_register_memory(a.cl, &mem));
    kvt_emu *emu = NULL; /* client b: a layer-first engine */
    assert_ok(kvt_emu_create(&emu, g, PAGES));
    assert_ok(kvt_emu_memory(emu, &mem));
    assert_ok(kvt_client_register_memory(b.cl, &mem));

    uint32_t t1[NTOK], t2[NTOK], src[NP], dst[NP];
    kvt_test_tokens(t1, NTOK, 11);
    kvt_test_tokens(t2, NTOK, 12);
    kvt_request r1 = {t1, NTOK, "x", 1}, r2 = {t2, NTOK, "x", 1};
    for (uint32_t i = 0; i < NP; i++) {
        src[i] = i;
        dst[i] = PAGES - 1 - 2 * i;
    }
    /* page_first -> blocks -> layer-first */
    pool_fill(&p, emu, &r1, src);
    side_store(&a, &r1, src);
    kvt_cache_stats st; /* the server answers once a's store is checked: b sees it */
    assert_ok(kvt_client_stats(a.cl, &st));
    assert_ok(kvt_emu_poison(emu, dst, NP));
    side_load(&b, &r1, dst);
    check_emu(emu, &r1, dst);
    /* layer-first -> blocks -> page_first */
    assert_ok(kvt_emu_fill(emu, &r2, 0, NP * TPP, src, NP));
    side_store(&b, &r2, src);
    assert_ok(kvt_client_stats(b.cl, &st));
    pool_expect(&p, emu, &r2, dst);
    side_load(&a, &r2, dst);
    pool_check(&p);

    kvt_client_detach(a.cl);
    kvt_client_detach(b.cl);
    kvt_emu_destroy(emu);
    pool_free(&p);
    kvt_geometry_destroy(g);
    kvt_test_server_stop(pid, 5000);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_page_first_round_trip),
        cmocka_unit_test(test_page_first_direct_round_trip),
        cmocka_unit_test(test_bad_strides_refused),
        cmocka_unit_test_teardown(test_strided_and_layer_first_share_blocks, kvt_test_servers_kill),
    };
    return kvt_test_dirs_done(cmocka_run_group_tests(tests, NULL, NULL));
}
