/* test_pd_plan.c - plan computation as a pure function: refusals name the
 * field and both values (D4: equal DCP with different ranks, DCP 2 -> 4),
 * slices for head slicing, GQA heads replicated across TP (which prefill
 * replica feeds which decode rank, the slices, expected counts), and
 * descriptor wire round trips and validation. */
#include "support.h"
#include <stdlib.h>
#include <string.h>
#include "pd/desc.h"
#include "pd/wire.h"
#include "util/hash.h"
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

static pd_desc make(kvt_geometry *g, uint32_t tp, uint32_t r, uint32_t dcp, uint32_t dr, uint32_t role)
{
    pd_desc d;
    kvt_pd_rank rk = {tp, r, dcp, dr, 0};
    assert_ok(pd_desc_from_geometry(&d, g, &rk, role));
    return d;
}

static void dcp_refusals(void **state)
{
    (void)state;
    kvt_geometry *g;
    assert_ok(kvt_geometry_preset(&g, "deepseek-v3", 64, 1));
    pd_desc s = make(g, 1, 0, 2, 0, PD_ROLE_PREFILL), d = make(g, 1, 0, 2, 1, PD_ROLE_DECODE);
    pd_plan p;
    assert_int_equal(pd_plan_compute(&p, &s, &d), KVT_EGEOMETRY);
    assert_non_null(strstr(kvt_last_error(), "dcp_rank: prefill 0 vs decode 1"));
    pd_desc d4 = make(g, 1, 0, 4, 0, PD_ROLE_DECODE);
    assert_int_equal(pd_plan_compute(&p, &s, &d4), KVT_EUNSUPPORTED);
    assert_non_null(strstr(kvt_last_error(), "dcp_size: prefill 2 vs decode 4"));
    pd_desc_free(&s);
    pd_desc_free(&d);
    pd_desc_free(&d4);
    kvt_geometry_destroy(g);
}

static void head_slices_and_wire(void **state)
{
    (void)state;
    kvt_geometry *g2, *g4;
    assert_ok(kvt_geometry_preset(&g2, "llama3-8b", 16, 2));
    assert_ok(kvt_geometry_preset(&g4, "llama3-8b", 32, 4));
    pd_desc s = make(g2, 2, 1, 1, 0, PD_ROLE_PREFILL), d = make(g4, 4, 3, 1, 0, PD_ROLE_DECODE);
    pd_plan p;
    assert_ok(pd_plan_compute(&p, &s, &d));
    assert_true(p.feeds);
    assert_int_equal(p.slices[0].src_off, p.slices[0].len); /* second half of prefill rank 1's heads */
    assert_int_equal(p.slices[0].dst_off, 0);
    pd_plan_free(&p);
    size_t n = pd_desc_wire_size(&d), used;
    uint8_t *b = malloc(n);
    pd_desc_encode(&d, b);
    pd_desc back;
    assert_ok(pd_desc_decode(&back, b, n, &used));
    assert_int_equal(used, n);
    assert_int_equal(back.num_entries, d.num_entries);
    assert_memory_equal(back.entries, d.entries, d.num_entries * sizeof *d.entries);
    pd_desc tmp;
    assert_int_equal(pd_desc_decode(&tmp, b, n - 1, &used), KVT_EPROTO);
    pd_desc_free(&back);
    free(b);
    pd_desc_free(&s);
    pd_desc_free(&d);
    kvt_geometry_destroy(g2);
    kvt_geometry_destroy(g4);
}

/* tp_size x dcp_size is bounded (PD_MAX_RANKS): a peer's descriptor with
 * 1024 x 1024 positions made the bootstrap service plan for minutes under
 * its lock. Refused locally with the numbers, and on the wire. */
static void rank_count_bounded(void **state)
{
    (void)state;
    kvt_geometry *g;
    assert_ok(kvt_geometry_preset(&g, "deepseek-v3", 64, 1));
    pd_desc d;
    kvt_pd_rank big = {64, 0, 32, 0, 0};
    assert_int_equal(pd_desc_from_geometry(&d, g, &big, PD_ROLE_DECODE), KVT_EINVAL);
    assert_non_null(strstr(kvt_last_error(), "tp_size 64 x dcp_size 32 is 2048 ranks (at most 1024)"));
    d = make(g, 32, 0, 32, 0, PD_ROLE_DECODE); /* 1024: the most allowed */
    size_t n = pd_desc_wire_size(&d), used;
    uint8_t *b = malloc(n);
    pd_desc_encode(&d, b);
    pd_desc back;
    assert_ok(pd_desc_decode(&back, b, n, &used));
    pd_desc_free(&back);
    pd_put32(b + 6 * 4, 33); /* dcp_size 33 on the wire: 1056 positions */
    assert_int_equal(pd_desc_decode(&back, b, n, &used), KVT_EPROTO);
    assert_non_null(strstr(kvt_last_error(), "tp_size 32 x dcp_size 33 is more than 1024 ranks"));
    free(b);
    pd_desc_free(&d);
    kvt_geometry_destroy(g);
}

/* GQA: 4 KV heads of 128 x bf16 (256 bytes per head), 2 layers, placed on
 * TP ranks as SGLang / vLLM do: TP 8 -> 1 head per rank, 2 replicas. */
#define GQA_HEADS 4u
#define HEAD_BYTES 256u

static kvt_geometry *gqa_geo(uint32_t tp, uint32_t tpp, kvt_layout lay)
{
    uint32_t per = tp < GQA_HEADS ? GQA_HEADS / tp : 1;
    kvt_geometry *g;
    assert_ok(kvt_geometry_create(&g, 2, tpp, lay));
    kvt_layer_spec ls = {.num_components = 2, .component = {{per, 128, 2}, {per, 128, 2}}};
    assert_ok(kvt_geometry_set_layers(g, 0, 2, &ls));
    return g;
}

static uint32_t gqa_reps(uint32_t tp) { return tp > GQA_HEADS ? tp / GQA_HEADS : 1; }

static pd_desc gqa_make(uint32_t tp, uint32_t r, uint32_t reps, uint32_t tpp, kvt_layout lay, uint32_t role)
{
    kvt_geometry *g = gqa_geo(tp, tpp, lay);
    pd_desc d;
    kvt_pd_rank rk = {tp, r, 0, 0, reps};
    assert_ok(pd_desc_from_geometry(&d, g, &rk, role));
    kvt_geometry_destroy(g);
    return d;
}

/* Computes every (prefill j, decode t) plan between TP sp and TP dp and
 * checks the invariants that keep rooms from hanging or corrupting:
 *  - every byte of every decode token of every entry is written by exactly
 *    one prefill rank, with the same global head on both sides;
 *  - for each prefill rank, pd_topo_expected equals the number of decode
 *    ranks for which pd_topo_talks is true (feeds or dummy), and every
 *    feeding pair talks.
 * feeder[t * 8 + k]: the k-th prefill rank (ascending) that feeds decode t,
 * with its src_off for entry 0 in src_off[t * 8 + k]; UINT32_MAX ends. */
static void gqa_check(uint32_t sp, uint32_t dp, uint32_t stpp, uint32_t dtpp, const uint32_t *feeder,
                      const uint32_t *src_off, const uint32_t *expected)
{
    pd_desc s0 = gqa_make(sp, 0, gqa_reps(sp), stpp, KVT_LAYOUT_LAYER_FIRST, PD_ROLE_PREFILL);
    pd_desc d0 = gqa_make(dp, 0, gqa_reps(dp), dtpp, KVT_LAYOUT_PAGE_FIRST, PD_ROLE_DECODE);
    uint32_t *talks = calloc(sp, sizeof *talks);
    for (uint32_t t = 0; t < dp; t++) {
        pd_desc d;
        assert_ok(pd_desc_at(&d, &d0, t, 0));
        uint32_t dtb = d.entries[0].token_bytes;
        uint8_t cover[2 * 4 * HEAD_BYTES] = {0}; /* entries 0..1 (layer 0 K, V) */
        uint32_t k = 0;
        for (uint32_t j = 0; j < sp; j++) {
            pd_desc s;
            assert_ok(pd_desc_at(&s, &s0, j, 0));
            s.role = PD_ROLE_PREFILL;
            pd_plan p;
            assert_ok(pd_plan_compute(&p, &s, &d));
            assert_ok(pd_topo_check(&s, &d));
            bool talk;
            assert_ok(pd_topo_talks(&s, &d, &talk));
            talks[j] += talk;
            assert_int_equal(p.feeds, pd_topo_feeds(&s, &d));
            if (p.feeds) {
                assert_true(talk);
                if (feeder[t * 8 + k] != j) fail_msg("TP%u -> TP%u: decode %u fed by prefill %u, want %u", sp, dp, t, j, feeder[t * 8 + k]);
                assert_int_equal(p.slices[0].src_off, src_off[t * 8 + k]);
                k++;
            }
            for (uint32_t e = 0; e < p.num_slices; e++) {
                const pd_slice *sl = &p.slices[e];
                const pd_entry *a = &s.entries[e], *b = &d.entries[e];
                if (!sl->len) continue;
                assert_int_equal(sl->len % HEAD_BYTES, 0);
                assert_true(sl->src_off + sl->len <= sl->src_tb && sl->dst_off + sl->len <= sl->dst_tb);
                /* the same global head lands where the decode rank keeps it */
                assert_int_equal(a->head_offset + sl->src_off / HEAD_BYTES, b->head_offset + sl->dst_off / HEAD_BYTES);
                if (e < 2)
                    for (uint32_t x = sl->dst_off; x < sl->dst_off + sl->len; x++) cover[e * dtb + x]++;
            }
            assert_int_equal(p.bytes_per_token % HEAD_BYTES, 0);
            pd_plan_free(&p);
            pd_desc_free(&s);
        }
        if (feeder[t * 8 + k] != UINT32_MAX) fail_msg("TP%u -> TP%u: decode %u: %u feeders, want more", sp, dp, t, k);
        for (uint32_t x = 0; x < 2 * dtb; x++)
            if (cover[x] != 1) fail_msg("TP%u -> TP%u: decode %u byte %u written %u times", sp, dp, t, x, cover[x]);
        pd_desc_free(&d);
    }
    for (uint32_t j = 0; j < sp; j++) {
        pd_desc s;
        assert_ok(pd_desc_at(&s, &s0, j, 0));
        uint32_t n;
        assert_ok(pd_topo_expected(&s, &d0, &n));
        if (n != talks[j] || n != expected[j])
            fail_msg("TP%u -> TP%u: prefill %u expects %u decode ranks, %u talk to it, want %u", sp, dp, j, n, talks[j], expected[j]);
        pd_desc_free(&s);
    }
    free(talks);
    pd_desc_free(&s0);
    pd_desc_free(&d0);
}

#define E UINT32_MAX
#define H HEAD_BYTES

static void gqa_tp8_to_tp4(void **state)
{
    (void)state;
    /* decode t holds head t: replica t % 2 of prefill pair {2t, 2t+1} */
    static const uint32_t f[] = {0, E, 0, 0, 0, 0, 0, 0, 3, E, 0, 0, 0, 0, 0, 0,
                                 4, E, 0, 0, 0, 0, 0, 0, 7, E, 0, 0, 0, 0, 0, 0};
    static const uint32_t o[32] = {0};
    static const uint32_t x[8] = {1, 1, 1, 1, 1, 1, 1, 1}; /* 1, 2, 5, 6 feed nobody: a dummy each */
    gqa_check(8, 4, 16, 64, f, o, x);
}

static void gqa_tp4_to_tp8(void **state)
{
    (void)state;
    static const uint32_t f[] = {0, E, 0, 0, 0, 0, 0, 0, 0, E, 0, 0, 0, 0, 0, 0, 1, E, 0, 0, 0, 0, 0, 0,
                                 1, E, 0, 0, 0, 0, 0, 0, 2, E, 0, 0, 0, 0, 0, 0, 2, E, 0, 0, 0, 0, 0, 0,
                                 3, E, 0, 0, 0, 0, 0, 0, 3, E, 0, 0, 0, 0, 0, 0};
    static const uint32_t o[64] = {0};
    static const uint32_t x[4] = {2, 2, 2, 2};
    gqa_check(4, 8, 16, 4, f, o, x);
}

static void gqa_tp8_to_tp8(void **state)
{
    (void)state;
    uint32_t f[64], o[64] = {0};
    for (uint32_t t = 0; t < 8; t++) f[t * 8] = t, f[t * 8 + 1] = E; /* every decode rank its own replica */
    static const uint32_t x[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    gqa_check(8, 8, 16, 8, f, o, x);
}

static void gqa_tp8_to_tp2_and_back(void **state)
{
    (void)state;
    /* decode 0 (heads 0, 1) from replicas 0 of {0,1}, {2,3}; decode 1 (heads 2, 3)
     * from replicas 1 of {4,5}, {6,7} */
    static const uint32_t f[] = {0, 2, E, 0, 0, 0, 0, 0, 5, 7, E, 0, 0, 0, 0, 0};
    static const uint32_t o[16] = {0};
    static const uint32_t x[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    gqa_check(8, 2, 16, 16, f, o, x);
    /* TP 2 -> TP 8: decode t holds head t / 2, the (t / 2) % 2-th head of prefill t / 4 */
    uint32_t fb[64], ob[64] = {0};
    for (uint32_t t = 0; t < 8; t++) fb[t * 8] = t / 4, fb[t * 8 + 1] = E, ob[t * 8] = t / 2 % 2 * H;
    static const uint32_t xb[2] = {4, 4};
    gqa_check(2, 8, 16, 16, fb, ob, xb);
}

static void gqa_tp16_to_tp8(void **state)
{
    (void)state;
    /* 4 replicas -> 2: decode ranks 2g, 2g+1 (head g) take replicas
     * (2g) % 4 and (2g+1) % 4 of prefill group {4g..4g+3}: different ones */
    uint32_t f[64], o[64] = {0}, x[16];
    for (uint32_t t = 0; t < 8; t++) f[t * 8] = 4 * (t / 2) + t % 4, f[t * 8 + 1] = E;
    for (uint32_t j = 0; j < 16; j++) x[j] = 1;
    gqa_check(16, 8, 16, 16, f, o, x);
}

static void gqa_refusals(void **state)
{
    (void)state;
    /* decode forgot to say its heads are replicated: 8 "heads" vs 4 */
    pd_desc s = gqa_make(8, 3, 2, 16, KVT_LAYOUT_LAYER_FIRST, PD_ROLE_PREFILL);
    pd_desc d = gqa_make(8, 3, 1, 16, KVT_LAYOUT_LAYER_FIRST, PD_ROLE_DECODE);
    pd_plan p;
    assert_int_equal(pd_plan_compute(&p, &s, &d), KVT_EGEOMETRY);
    const char *want = "entry 0 (layer 0 K): total kv heads: prefill 4 (1 x TP8 / kv_head_replicas 2) vs decode 8 (1 x TP8)";
    if (!strstr(kvt_last_error(), want)) fail_msg("%s", kvt_last_error());
    assert_int_equal(pd_topo_check(&s, &d), KVT_EGEOMETRY);
    assert_non_null(strstr(kvt_last_error(), want));
    assert_false(pd_topo_feeds(&s, &d));
    pd_desc_free(&d);
    /* 4 replicas of 1 head at TP 8 is 2 heads: refused against 4 */
    d = gqa_make(8, 0, 4, 16, KVT_LAYOUT_LAYER_FIRST, PD_ROLE_DECODE);
    assert_int_equal(pd_plan_compute(&p, &s, &d), KVT_EGEOMETRY);
    assert_non_null(strstr(kvt_last_error(), "total kv heads: prefill 4 (1 x TP8 / kv_head_replicas 2) vs decode 2 (1 x TP8 / kv_head_replicas 4)"));
    pd_desc_free(&d);
    pd_desc_free(&s);
    /* a replica count that does not divide TP is refused when the descriptor is built */
    kvt_geometry *g = gqa_geo(8, 16, KVT_LAYOUT_LAYER_FIRST);
    kvt_pd_rank rk = {8, 0, 0, 0, 3};
    assert_int_equal(pd_desc_from_geometry(&s, g, &rk, PD_ROLE_PREFILL), KVT_EINVAL);
    assert_non_null(strstr(kvt_last_error(), "kv_head_replicas 3 does not divide tp_size 8"));
    /* MLA ignores it: every rank holds the latent, replicas stay 1 */
    kvt_geometry *m;
    assert_ok(kvt_geometry_preset(&m, "deepseek-v3", 64, 1));
    rk = (kvt_pd_rank){8, 5, 0, 0, 2};
    assert_ok(pd_desc_from_geometry(&s, m, &rk, PD_ROLE_PREFILL));
    assert_int_equal(s.entries[0].replicas, 1);
    assert_int_equal(s.entries[0].head_offset, 0);
    pd_desc_free(&s);
    kvt_geometry_destroy(m);
    kvt_geometry_destroy(g);
}

/* The descriptor carries replicas; the decoder refuses nonsense naming the
 * field and both values. */
static void gqa_wire(void **state)
{
    (void)state;
    pd_desc d = gqa_make(8, 5, 2, 16, KVT_LAYOUT_LAYER_FIRST, PD_ROLE_DECODE);
    assert_int_equal(d.entries[1].replicas, 2);
    assert_int_equal(d.entries[1].head_offset, 2); /* rank 5 holds head 5 / 2 */
    size_t n = pd_desc_wire_size(&d), used;
    assert_int_equal(n, 36 + 4 * 32);
    uint8_t *b = malloc(n);
    pd_desc_encode(&d, b);
    pd_desc back;
    assert_ok(pd_desc_decode(&back, b, n, &used));
    assert_int_equal(back.entries[3].replicas, 2);
    assert_memory_equal(back.entries, d.entries, d.num_entries * sizeof *d.entries);
    pd_desc_free(&back);
    static const struct { size_t at; uint32_t v; const char *msg; } bad[] = {
        {36 + 32 + 28, 3, "entry 1: replicas 3 does not divide tp_size 8"},
        {36 + 32 + 28, 0, "entry 1: replicas 0 does not divide tp_size 8"},
        {36 + 32 + 28, 16, "entry 1: replicas 16 does not divide tp_size 8"},
        {36 + 32 + 28, 4, "entry 1: head_offset 2, but tp_rank 5 / replicas 4 x 1 heads is 1"},
        {36 + 32 + 16, 5, "entry 1: head_offset 5, but tp_rank 5 / replicas 2 x 1 heads is 2"},
        {36 + 32 + 24, 1, "entry 1: replicas 2 of an MLA entry (must be 1)"},
        {0, 1, "version 1"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        uint8_t *c = malloc(n);
        memcpy(c, b, n);
        c[bad[i].at] = (uint8_t)bad[i].v, c[bad[i].at + 1] = c[bad[i].at + 2] = c[bad[i].at + 3] = 0;
        kvt_status st = pd_desc_decode(&back, c, n, &used);
        assert_int_equal(st, i + 1 < sizeof bad / sizeof bad[0] ? KVT_EPROTO : KVT_EVERSION);
        if (!strstr(kvt_last_error(), bad[i].msg)) fail_msg("case %zu: %s", i, kvt_last_error());
        free(c);
    }
    free(b);
    pd_desc_free(&d);
}
#undef E
#undef H

/* The AVX2 build of XXH3 (util/hash_avx2.c) that pd/xfer.c and
 * kvt__hash64 pick at run time gives exactly libxxhash's page checksums and
 * seeded hashes (the node server's store checksums), for any length and
 * split into updates. */
static void xxh3_avx2_matches_lib(void **state)
{
    (void)state;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx2")) skip();
    assert_int_equal(kvt__xxh3_avx2_state_size(), sizeof(XXH3_state_t));
    size_t cap = 1u << 20;
    uint8_t *b = malloc(cap);
    assert_non_null(b);
    for (size_t i = 0; i < cap; i++) b[i] = (uint8_t)(i * 2654435761u >> 13);
    for (size_t n = 0; n < cap; n = n * 3 + 1)
        for (size_t cut = 0; cut <= n; cut += n / 3 + 1) {
            XXH3_state_t a, c;
            XXH3_64bits_reset(&a);
            XXH3_64bits_update(&a, b, cut);
            XXH3_64bits_update(&a, b + cut, n - cut);
            kvt__xxh3_avx2_reset(&c);
            kvt__xxh3_avx2_update(&c, b, cut);
            kvt__xxh3_avx2_update(&c, b + cut, n - cut);
            assert_true(XXH3_64bits_digest(&a) == kvt__xxh3_avx2_digest(&c));
            assert_true(XXH3_64bits_withSeed(b, n, n * 7 + cut) ==
                        kvt__xxh3_avx2_seeded(b, n, n * 7 + cut));
            assert_true(XXH3_64bits_withSeed(b, n, cut) == kvt__hash64(b, n, cut));
        }
    free(b);
#else
    skip();
#endif
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(dcp_refusals),
        cmocka_unit_test(head_slices_and_wire),
        cmocka_unit_test(rank_count_bounded),
        cmocka_unit_test(gqa_tp8_to_tp4),
        cmocka_unit_test(gqa_tp4_to_tp8),
        cmocka_unit_test(gqa_tp8_to_tp8),
        cmocka_unit_test(gqa_tp8_to_tp2_and_back),
        cmocka_unit_test(gqa_tp16_to_tp8),
        cmocka_unit_test(gqa_refusals),
        cmocka_unit_test(gqa_wire),
        cmocka_unit_test(xxh3_avx2_matches_lib),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
