/* test_pd_plan.c - plan computation as a pure function: refusals name the
 * field and both values (D4: equal DCP with different ranks, DCP 2 -> 4),
 * slices for head slicing, and descriptor wire round trips. */
#include "support.h"
#include <stdlib.h>
#include <string.h>
#include "pd/desc.h"
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

static pd_desc make(kvt_geometry *g, uint32_t tp, uint32_t r, uint32_t dcp, uint32_t dr, uint32_t role)
{
    pd_desc d;
    kvt_pd_rank rk = {tp, r, dcp, dr};
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
    assert_memory_equal(back.entries, d.entries, n - 36);
    pd_desc tmp;
    assert_int_equal(pd_desc_decode(&tmp, b, n - 1, &used), KVT_EPROTO);
    pd_desc_free(&back);
    free(b);
    pd_desc_free(&s);
    pd_desc_free(&d);
    kvt_geometry_destroy(g2);
    kvt_geometry_destroy(g4);
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
size_t pd_xxh3_avx2_state_size(void);
void pd_xxh3_avx2_reset(void *st);
void pd_xxh3_avx2_update(void *st, const void *p, size_t n);
uint64_t pd_xxh3_avx2_digest(void *st);
#endif

/* The AVX2 build of XXH3 that pd/xfer.c picks at run time gives exactly
 * libxxhash's page checksums, for any length and split into updates. */
static void xxh3_avx2_matches_lib(void **state)
{
    (void)state;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx2")) skip();
    assert_int_equal(pd_xxh3_avx2_state_size(), sizeof(XXH3_state_t));
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
            pd_xxh3_avx2_reset(&c);
            pd_xxh3_avx2_update(&c, b, cut);
            pd_xxh3_avx2_update(&c, b + cut, n - cut);
            assert_true(XXH3_64bits_digest(&a) == pd_xxh3_avx2_digest(&c));
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
        cmocka_unit_test(xxh3_avx2_matches_lib),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
