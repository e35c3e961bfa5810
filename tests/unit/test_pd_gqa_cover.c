/* test_pd_gqa_cover.c - brute force over GQA placements: for MHA with KV heads H, prefill TP P and decode TP D
 * (replicas as engines place them), every byte of every decode token entry
 * has exactly one writer, and pd_topo_expected(s) equals the number of
 * decode ranks s feeds (or 1). */
#include "pd_harness.h"
#include "pd/desc.h"
#include "pd/ep.h"

static void cover(uint32_t H, uint32_t P, uint32_t D)
{
    pd_model m = {.layers = 1, .heads = H, .head_dim = 8};
    kvt_geometry *gp = pd_model_geo(&m, P, 16, KVT_LAYOUT_LAYER_FIRST);
    kvt_geometry *gd = pd_model_geo(&m, D, 16, KVT_LAYOUT_LAYER_FIRST);
    pd_desc sd[64], dd[64];
    for (uint32_t p = 0; p < P; p++) {
        kvt_pd_rank r = {P, p, 1, 0, pd_model_replicas(&m, P)};
        assert_ok(pd_desc_from_geometry(&sd[p], gp, &r, PD_ROLE_PREFILL));
    }
    for (uint32_t t = 0; t < D; t++) {
        kvt_pd_rank r = {D, t, 1, 0, pd_model_replicas(&m, D)};
        assert_ok(pd_desc_from_geometry(&dd[t], gd, &r, PD_ROLE_DECODE));
    }
    for (uint32_t t = 0; t < D; t++) {
        uint32_t tb = dd[t].entries[0].token_bytes;
        uint8_t cnt[4096] = {0};
        for (uint32_t p = 0; p < P; p++) {
            pd_plan pl;
            assert_ok(pd_plan_compute(&pl, &sd[p], &dd[t]));
            for (uint32_t e = 0; e < 1; e++)
                for (uint32_t b = 0; b < pl.slices[e].len; b++) cnt[pl.slices[e].dst_off + b]++;
            pd_plan_free(&pl);
        }
        for (uint32_t b = 0; b < tb; b++)
            if (cnt[b] != 1) fail_msg("H%u P%u D%u: decode %u byte %u written %u times", H, P, D, t, b, cnt[b]);
    }
    for (uint32_t p = 0; p < P; p++) {
        uint32_t exp, n = 0;
        assert_ok(pd_topo_expected(&sd[p], &dd[0], &exp));
        for (uint32_t t = 0; t < D; t++) n += pd_topo_feeds(&sd[p], &dd[t]);
        if (exp != (n ? n : 1)) fail_msg("H%u P%u D%u: expected %u vs feeds %u", H, P, D, exp, n);
        uint32_t talkers = 0;
        for (uint32_t t = 0; t < D; t++) {
            bool talk;
            assert_ok(pd_topo_talks(&sd[p], &dd[t], &talk));
            talkers += talk;
        }
        if (talkers != (n ? n : 1)) fail_msg("H%u P%u D%u: prefill %u talkers %u vs expected %u", H, P, D, p, talkers, exp);
    }
    for (uint32_t p = 0; p < P; p++) pd_desc_free(&sd[p]);
    for (uint32_t t = 0; t < D; t++) pd_desc_free(&dd[t]);
    kvt_geometry_destroy(gp);
    kvt_geometry_destroy(gd);
}

static void gqa_every_byte_once(void **state)
{
    (void)state;
    const uint32_t tps[] = {1, 2, 4, 8, 16, 32};
    const uint32_t hs[] = {1, 2, 4, 8, 16};
    unsigned n = 0;
    for (unsigned a = 0; a < 5; a++)
        for (unsigned i = 0; i < 6; i++)
            for (unsigned j = 0; j < 6; j++) {
                uint32_t H = hs[a], P = tps[i], D = tps[j];
                if (H >= P && H % P) continue;
                if (H >= D && H % D) continue;
                cover(H, P, D);
                n++;
            }
    assert_true(n > 150); /* the loops above really ran */
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(gqa_every_byte_once)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
