/* test_conc_pd.c - prefill -> decode hand-off end to end over TCP on
 * 127.0.0.1, every geometry pair byte-verified through the emulated engine,
 * and scenarios D1-D5 of failure-scenarios.md. */
#include "pd_harness.h"

static const pd_model mha = {.layers = 3, .heads = 8, .head_dim = 16};

static void identical(void **state)
{
    (void)state;
    pd_side_cfg c = {1, 1, 16, KVT_LAYOUT_LAYER_FIRST, &mha};
    pd_roundtrip(&c, &c, 100, 0);
}

static void identical_page_first_prefix(void **state)
{
    (void)state;
    pd_side_cfg c = {2, 1, 8, KVT_LAYOUT_PAGE_FIRST, &mha};
    pd_roundtrip(&c, &c, 77, 21);
}

static void repage(void **state)
{
    (void)state;
    pd_side_cfg p = {1, 1, 16, KVT_LAYOUT_LAYER_FIRST, &mha}, d = {1, 1, 8, KVT_LAYOUT_LAYER_FIRST, &mha};
    pd_roundtrip(&p, &d, 90, 0);
    pd_roundtrip(&d, &p, 90, 5);
}

static void layout_convert(void **state)
{
    (void)state;
    pd_side_cfg p = {1, 1, 16, KVT_LAYOUT_LAYER_FIRST, &mha}, d = {1, 1, 4, KVT_LAYOUT_PAGE_FIRST, &mha};
    pd_roundtrip(&p, &d, 50, 0);
    pd_roundtrip(&d, &p, 50, 0);
}

/* Strided engine memory (a token-major pool of every layer, as SGLang's
 * page_first) on either side and both, across a repage and TP head
 * slicing: every decode byte checked through the strided addresses. */
static void strided_pools(void **state)
{
    (void)state;
    pd_side_cfg p = {2, 1, 16, KVT_LAYOUT_LAYER_FIRST, &mha, true};
    pd_side_cfg d = {1, 1, 8, KVT_LAYOUT_LAYER_FIRST, &mha, true};
    pd_side_cfg plain = {1, 1, 8, KVT_LAYOUT_LAYER_FIRST, &mha};
    pd_roundtrip(&p, &d, 70, 0);
    pd_roundtrip(&p, &plain, 70, 3);
    pd_roundtrip(&plain, &p, 70, 0);
}

static void tp_head_slicing(void **state)
{
    (void)state;
    pd_side_cfg p2 = {2, 1, 16, KVT_LAYOUT_LAYER_FIRST, &mha}, d4 = {4, 1, 8, KVT_LAYOUT_LAYER_FIRST, &mha};
    pd_roundtrip(&p2, &d4, 60, 0);
    pd_roundtrip(&d4, &p2, 60, 0);
}

/* GQA with fewer KV heads than TP: 4 KV heads, each on tp / 4 consecutive
 * ranks at TP 8 (as SGLang / vLLM place them). */
static const pd_model gqa4 = {.layers = 3, .heads = 4, .head_dim = 16};

/* One room, byte-verified, and every byte moved exactly once: each decode
 * rank received (ntok - prefix) x its bytes per token, and prefill rank j
 * sent heads_out[j] heads' worth (so which replica fed whom is checked). */
static void gqa_roundtrip(const pd_side_cfg *pc, const pd_side_cfg *dc, uint32_t ntok, uint32_t prefix,
                          const uint32_t *heads_out)
{
    pd_cluster cl = {0};
    pd_cluster_start(&cl, pc, dc, ntok);
    pd_cluster_decoders(&cl);
    pd_open_room(&cl, 5, prefix);
    pd_expect_room(&cl, 5, KVT_PD_SUCCESS);
    assert_int_equal(pd_verify(&cl, prefix), 0);
    const pd_model *m = pc->model;
    uint64_t head_tok = (uint64_t)m->layers * 2 * m->head_dim * 2 * (ntok - prefix); /* one head, K and V */
    for (uint32_t i = 0; i < cl.ndec; i++) {
        kvt_pd_room_info info;
        assert_ok(kvt_pd_room_info_get(NULL, cl.dec[i].r, 5, &info));
        if (info.bytes != head_tok * pd_model_rank_heads(m, dc->tp))
            fail_msg("decode %u received %llu bytes, want %llu", i, (unsigned long long)info.bytes,
                     (unsigned long long)(head_tok * pd_model_rank_heads(m, dc->tp)));
    }
    for (uint32_t j = 0; j < cl.npre; j++) {
        kvt_pd_room_info info;
        assert_ok(kvt_pd_room_info_get(cl.pre[j].s, NULL, 5, &info));
        if (info.bytes != head_tok * heads_out[j])
            fail_msg("prefill %u sent %llu bytes, want %u heads' worth (%llu)", j, (unsigned long long)info.bytes,
                     heads_out[j], (unsigned long long)(head_tok * heads_out[j]));
    }
    pd_cluster_stop(&cl);
}

/* TP 8 (2 replicas per head) -> TP 4 (1 head each): decode t pulls from
 * replica t % 2 (prefill 0, 3, 4, 7); the others feed nobody and each
 * hears from its dummy decode rank. Page 16 -> 8 and a layout change. */
static void gqa_tp8_to_tp4(void **state)
{
    (void)state;
    pd_side_cfg p = {8, 1, 16, KVT_LAYOUT_LAYER_FIRST, &gqa4}, d = {4, 1, 8, KVT_LAYOUT_PAGE_FIRST, &gqa4};
    static const uint32_t out[8] = {1, 0, 0, 1, 1, 0, 0, 1};
    gqa_roundtrip(&p, &d, 75, 0, out);
}

/* TP 4 -> TP 8 (decode replicated): each prefill rank feeds both decode
 * replicas of its head. Page 8 -> 32, with a prefix. */
static void gqa_tp4_to_tp8(void **state)
{
    (void)state;
    pd_side_cfg p = {4, 1, 8, KVT_LAYOUT_LAYER_FIRST, &gqa4}, d = {8, 1, 32, KVT_LAYOUT_LAYER_FIRST, &gqa4};
    static const uint32_t out[4] = {2, 2, 2, 2};
    gqa_roundtrip(&p, &d, 90, 13, out);
}

/* TP 8 -> TP 8, both replicated: every decode rank from its own replica
 * (load spread over all prefill ranks). Page 16 -> 4 and page-first. */
static void gqa_tp8_to_tp8(void **state)
{
    (void)state;
    pd_side_cfg p = {8, 1, 16, KVT_LAYOUT_LAYER_FIRST, &gqa4}, d = {8, 1, 4, KVT_LAYOUT_PAGE_FIRST, &gqa4};
    static const uint32_t out[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    gqa_roundtrip(&p, &d, 66, 0, out);
}

/* TP 8 -> TP 2 (2 heads each): decode 0 gathers heads 0, 1 from prefill 0
 * and 2, decode 1 heads 2, 3 from prefill 5 and 7; and TP 2 -> TP 8. */
static void gqa_tp8_tp2_both_ways(void **state)
{
    (void)state;
    pd_side_cfg p = {8, 1, 16, KVT_LAYOUT_PAGE_FIRST, &gqa4}, d = {2, 1, 16, KVT_LAYOUT_LAYER_FIRST, &gqa4};
    static const uint32_t out[8] = {1, 0, 1, 0, 0, 1, 0, 1}, back[2] = {4, 4};
    gqa_roundtrip(&p, &d, 40, 0, out);
    gqa_roundtrip(&d, &p, 40, 7, back);
}

/* A decode side that does not declare its replication (8 "heads" at TP 8
 * against the prefill's 4) is refused at registration, naming the entry,
 * the field and both values; the senders keep serving. */
static void gqa_undeclared_replicas_refused(void **state)
{
    (void)state;
    pd_cluster cl = {0};
    pd_side_cfg p = {8, 1, 16, KVT_LAYOUT_LAYER_FIRST, &gqa4};
    cl.dec_replicas = 1;
    pd_cluster_start(&cl, &p, &p, 30);
    cl.ndec = 1;
    cl.dec = calloc(1, sizeof *cl.dec);
    assert_int_equal(pd_cluster_decoder(&cl, 0), KVT_EGEOMETRY);
    const char *want = "entry 0 (layer 0 K): total kv heads: prefill 4 (1 x TP8 / kv_head_replicas 2) vs decode 8 (1 x TP8)";
    if (!strstr(kvt_last_error(), want)) fail_msg("%s", kvt_last_error());
    pd_rank_free(&cl.dec[0]);
    memset(&cl.dec[0], 0, sizeof cl.dec[0]);
    free(cl.dec);
    cl.dec_replicas = 0;
    pd_cluster_decoders(&cl);
    pd_open_room(&cl, 9, 0);
    pd_expect_room(&cl, 9, KVT_PD_SUCCESS);
    assert_int_equal(pd_verify(&cl, 0), 0);
    pd_cluster_stop(&cl);
}

static const uint32_t mla_bytes[4] = {1152, 1152, 1152, 1152};
static const pd_model mla = {.layers = 4, .mla_bytes = mla_bytes};

static void mla_replication(void **state)
{
    (void)state;
    pd_side_cfg p2 = {2, 1, 16, KVT_LAYOUT_LAYER_FIRST, &mla}, d4 = {4, 1, 16, KVT_LAYOUT_LAYER_FIRST, &mla};
    pd_roundtrip(&p2, &d4, 40, 0);
    pd_side_cfg p4 = {4, 1, 16, KVT_LAYOUT_LAYER_FIRST, &mla}, d1 = {1, 1, 16, KVT_LAYOUT_LAYER_FIRST, &mla};
    pd_roundtrip(&p4, &d1, 40, 0); /* prefill ranks 1..3 feed nobody: their dummy opens the room */
}

static void dcp_mla(void **state)
{
    (void)state;
    pd_side_cfg p = {1, 1, 16, KVT_LAYOUT_LAYER_FIRST, &mla}, d = {1, 4, 4, KVT_LAYOUT_PAGE_FIRST, &mla};
    pd_roundtrip(&p, &d, 61, 9);
}

/* A decode DCP rank that holds none of a short prompt's tokens needs no
 * pages, but a NULL page table with num_pages > 0 is an argument error
 * naming it, not a copy from NULL (it crashed). */
static void dcp_rank_without_tokens_null_pages(void **state)
{
    (void)state;
    pd_side_cfg p = {1, 1, 16, KVT_LAYOUT_LAYER_FIRST, &mla}, d = {1, 2, 16, KVT_LAYOUT_LAYER_FIRST, &mla};
    pd_cluster cl = {0};
    pd_cluster_start(&cl, &p, &d, 1);
    pd_cluster_decoders(&cl);
    pd_rank *r = &cl.dec[1]; /* dcp rank 1 of 2: token 0 is rank 0's */
    kvt_pd_room_params rp = {NULL, r->num_pages, 1, 0};
    assert_status(kvt_pd_receiver_room(r->r, 5, &rp), KVT_EINVAL);
    assert_non_null(strstr(kvt_last_error(), "kvt_pd_receiver_room: pages is NULL"));
    rp.num_pages = 0; /* no pages at all: fine */
    assert_ok(kvt_pd_receiver_room(r->r, 5, &rp));
    pd_cluster_stop(&cl);
}

/* D1: prefill TP8/DCP1 -> decode TP8/DCP8, entries [1152]x24 + [256]x10. */
static uint32_t hybrid_bytes[34];
static const pd_model hybrid = {.layers = 34, .mla_bytes = hybrid_bytes};

/* Decode ranks that finish and go away at once (as `kvtier pd decode`
 * does) must not fail the prefill room their peers are still finishing:
 * only links still owing an acknowledgement fail a room (regression). */
static void decoders_leave_after_success(void **state)
{
    (void)state;
    static const uint32_t bytes[4] = {1152, 1152, 1152, 1152};
    static const pd_model m = {4, bytes, 0, 0};
    pd_side_cfg pc = {1, 1, 16, KVT_LAYOUT_LAYER_FIRST, &m}, dc = {1, 4, 16, KVT_LAYOUT_LAYER_FIRST, &m};
    pd_cluster cl = {0};
    pd_cluster_start(&cl, &pc, &dc, 700);
    pd_cluster_decoders(&cl);
    pd_open_room(&cl, 3, 0);
    for (uint32_t i = 0; i < cl.ndec; i++) {
        kvt_pd_poll st;
        assert_ok(kvt_pd_receiver_wait(cl.dec[i].r, 3, 20000, &st));
        assert_int_equal(st, KVT_PD_SUCCESS);
        kvt_pd_receiver_destroy(cl.dec[i].r); /* leaves right away */
        cl.dec[i].r = NULL;
    }
    kvt_pd_poll st;
    kvt_pd_room_info info;
    assert_ok(kvt_pd_sender_wait(cl.pre[0].s, 3, 20000, &st));
    kvt_pd_room_info_get(cl.pre[0].s, NULL, 3, &info);
    if (st != KVT_PD_SUCCESS) fail_msg("prefill room: state %d: %s", st, info.message);
    pd_cluster_stop(&cl);
}

static void d1_hybrid_dcp8(void **state)
{
    (void)state;
    for (int i = 0; i < 34; i++) hybrid_bytes[i] = i < 24 ? 1152 : 256;
    pd_side_cfg p = {8, 1, 4, KVT_LAYOUT_LAYER_FIRST, &hybrid}, d = {8, 8, 4, KVT_LAYOUT_LAYER_FIRST, &hybrid};
    pd_roundtrip(&p, &d, 70, 0);
}

/* D1 as SGLang sees it: the decode side believes every entry is 1152. */
static uint32_t flat_bytes[34];
static const pd_model flat = {.layers = 34, .mla_bytes = flat_bytes};

static void d1_single_item_len_refused(void **state)
{
    (void)state;
    for (int i = 0; i < 34; i++) hybrid_bytes[i] = i < 24 ? 1152 : 256, flat_bytes[i] = 1152;
    pd_cluster cl = {0};
    pd_side_cfg p = {2, 1, 4, KVT_LAYOUT_LAYER_FIRST, &hybrid}, d = {2, 2, 4, KVT_LAYOUT_LAYER_FIRST, &flat};
    pd_cluster_start(&cl, &p, &d, 20);
    cl.ndec = 1;
    cl.dec = calloc(1, sizeof *cl.dec);
    assert_int_equal(pd_cluster_decoder(&cl, 0), KVT_EGEOMETRY);
    const char *m = kvt_last_error();
    if (!strstr(m, "entry 24") || !strstr(m, "bytes_per_token") || !strstr(m, "256") || !strstr(m, "1152"))
        fail_msg("message does not name entry, field and values: %s", m);
    pd_cluster_stop(&cl);
}

/* D2: draft KV (256 B/token) appended to 1152-byte target entries, DCP 2. */
static uint32_t draft_bytes[6] = {1152, 1152, 1152, 1152, 256, 256};
static const pd_model draft = {.layers = 6, .mla_bytes = draft_bytes};

static void d2_draft_dcp(void **state)
{
    (void)state;
    pd_side_cfg p = {1, 1, 8, KVT_LAYOUT_LAYER_FIRST, &draft}, d = {2, 2, 4, KVT_LAYOUT_LAYER_FIRST, &draft};
    pd_roundtrip(&p, &d, 45, 3);
}

/* D3: MLA page 64, prefill 64 B/token (item 4096) vs decode 32 (item 2048), DCP 8. */
static const uint32_t b64[2] = {64, 64}, b32[2] = {32, 32};
static const pd_model m64 = {.layers = 2, .mla_bytes = b64}, m32 = {.layers = 2, .mla_bytes = b32};

static void d3_item_len_refused_then_ok(void **state)
{
    (void)state;
    pd_cluster cl = {0};
    pd_side_cfg p = {1, 1, 64, KVT_LAYOUT_LAYER_FIRST, &m64}, bad = {1, 8, 64, KVT_LAYOUT_LAYER_FIRST, &m32};
    pd_cluster_start(&cl, &p, &bad, 300);
    cl.ndec = 1;
    cl.dec = calloc(1, sizeof *cl.dec);
    assert_int_equal(pd_cluster_decoder(&cl, 0), KVT_EGEOMETRY);
    assert_non_null(strstr(kvt_last_error(), "entry 0 (layer 0 KV): bytes_per_token: prefill 64 vs decode 32"));
    kvt_pd_bootstrap_stats bst;
    assert_ok(kvt_pd_bootstrap_stats_get(cl.bs, &bst));
    assert_true(bst.refused >= 1);
    pd_cluster_stop(&cl);
    pd_side_cfg good = {1, 8, 64, KVT_LAYOUT_LAYER_FIRST, &m64};
    pd_roundtrip(&p, &good, 300, 0);
}

/* D4: DCP 2 -> 4 unsupported, MHA with decode DCP 8 refused, page 32 vs 64 converted. */
static void d4_refusals_and_repage(void **state)
{
    (void)state;
    pd_cluster cl = {0};
    pd_side_cfg p = {1, 1, 64, KVT_LAYOUT_LAYER_FIRST, &mha}, d = {1, 8, 64, KVT_LAYOUT_LAYER_FIRST, &mha};
    pd_cluster_start(&cl, &p, &d, 64);
    cl.ndec = 1;
    cl.dec = calloc(1, sizeof *cl.dec);
    assert_int_equal(pd_cluster_decoder(&cl, 0), KVT_EUNSUPPORTED);
    assert_non_null(strstr(kvt_last_error(), "MHA"));
    pd_cluster_stop(&cl);
    pd_side_cfg p32 = {1, 1, 32, KVT_LAYOUT_LAYER_FIRST, &mla}, d64 = {1, 1, 64, KVT_LAYOUT_LAYER_FIRST, &mla};
    pd_roundtrip(&p32, &d64, 130, 0);
}

/* D5: a refused decode rank leaves the service and the senders serving. */
static void d5_bad_peer_isolated(void **state)
{
    (void)state;
    pd_cluster cl = {0};
    pd_side_cfg p = {2, 1, 16, KVT_LAYOUT_LAYER_FIRST, &mla}, d = {2, 1, 16, KVT_LAYOUT_LAYER_FIRST, &mla};
    pd_cluster_start(&cl, &p, &d, 50);
    pd_rank bad = {0};
    pd_side_cfg bc = {1, 1, 16, KVT_LAYOUT_LAYER_FIRST, &m64};
    pd_rank_init(&bad, &bc, 0, 0, 50);
    kvt_engine_memory mem;
    kvt_pd_params bp = pd_params(&cl, &bad, &mem);
    assert_int_equal(kvt_pd_receiver_create(&bad.r, &bp), KVT_EGEOMETRY);
    pd_rank_free(&bad);
    pd_cluster_decoders(&cl);
    pd_open_room(&cl, 11, 0);
    pd_expect_room(&cl, 11, KVT_PD_SUCCESS);
    assert_int_equal(pd_verify(&cl, 0), 0);
    pd_cluster_stop(&cl);
}

static void many_rooms(void **state)
{
    (void)state;
    pd_cluster cl = {0};
    pd_side_cfg c = {2, 1, 16, KVT_LAYOUT_LAYER_FIRST, &mha};
    pd_cluster_start(&cl, &c, &c, 64);
    pd_cluster_decoders(&cl);
    for (uint64_t room = 100; room < 164; room++) pd_open_room(&cl, room, 0);
    for (uint64_t room = 100; room < 164; room++) pd_expect_room(&cl, room, KVT_PD_SUCCESS);
    assert_int_equal(pd_verify(&cl, 0), 0);
    pd_cluster_stop(&cl);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(identical),
        cmocka_unit_test(identical_page_first_prefix),
        cmocka_unit_test(repage),
        cmocka_unit_test(layout_convert),
        cmocka_unit_test(strided_pools),
        cmocka_unit_test(tp_head_slicing),
        cmocka_unit_test(gqa_tp8_to_tp4),
        cmocka_unit_test(gqa_tp4_to_tp8),
        cmocka_unit_test(gqa_tp8_to_tp8),
        cmocka_unit_test(gqa_tp8_tp2_both_ways),
        cmocka_unit_test(gqa_undeclared_replicas_refused),
        cmocka_unit_test(mla_replication),
        cmocka_unit_test(dcp_mla),
        cmocka_unit_test(dcp_rank_without_tokens_null_pages),
        cmocka_unit_test(decoders_leave_after_success),
        cmocka_unit_test(d1_hybrid_dcp8),
        cmocka_unit_test(d1_single_item_len_refused),
        cmocka_unit_test(d2_draft_dcp),
        cmocka_unit_test(d3_item_len_refused_then_ok),
        cmocka_unit_test(d4_refusals_and_repage),
        cmocka_unit_test(d5_bad_peer_isolated),
        cmocka_unit_test(many_rooms),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
