/* test_conc_pd_batches.c - the sender gathers chunks of consecutive entries
 * into ~1 MiB sends (sender.c send_chunks); rooms byte-verified with batches
 * well above PD_CHUNK_BYTES: entries of very different sizes (some split
 * over several chunks, some gathered), DCP, GQA head slicing, page-first,
 * consecutive and scattered page tables, prefixes; TCP and UCX. */
#include "pd_harness.h"

/* MLA, entries from 2 to 8192 bytes a token */
static const uint32_t mixed_bytes[7] = {1152, 64, 4096, 2, 8192, 640, 256};
static const pd_model mixed = {.layers = 7, .mla_bytes = mixed_bytes};
static const pd_model wide = {.layers = 4, .heads = 16, .head_dim = 128};
static const pd_model gqa = {.layers = 5, .heads = 4, .head_dim = 64};

static bool consecutive;

/* pd_cluster_start, with page tables 0, 1, 2, ... when `consecutive` */
static void start(pd_cluster *cl, const pd_side_cfg *pc, const pd_side_cfg *dc, uint32_t ntok)
{
    setenv("KVTIER_PD_QUIET", "1", 0);
    cl->pc = *pc;
    cl->dc = *dc;
    cl->ntok = ntok;
    cl->tokens = calloc(ntok, sizeof *cl->tokens);
    kvt_test_tokens(cl->tokens, ntok, 42 + ntok);
    cl->req = (kvt_request){cl->tokens, ntok, "ns", 2};
    assert_ok(kvt_pd_bootstrap_create(&cl->bs, &cl->net));
    assert_ok(kvt_pd_bootstrap_port(cl->bs, &cl->port));
    cl->npre = pc->tp * pc->dcp;
    cl->pre = calloc(cl->npre, sizeof *cl->pre);
    for (uint32_t i = 0; i < cl->npre; i++) {
        pd_rank *r = &cl->pre[i];
        pd_rank_init(r, pc, i / pc->dcp, i % pc->dcp, ntok);
        if (consecutive)
            for (uint32_t k = 0; k < r->num_pages; k++) r->pages[k] = k + 1;
        assert_ok(kvt_emu_fill(r->emu, &cl->req, 0, ntok, r->pages, r->num_pages));
        kvt_engine_memory mem;
        kvt_pd_params p = pd_params(cl, r, &mem);
        assert_ok(kvt_pd_sender_create(&r->s, &p));
    }
    cl->ndec = dc->tp * dc->dcp;
    cl->dec = calloc(cl->ndec, sizeof *cl->dec);
    for (uint32_t i = 0; i < cl->ndec; i++) {
        pd_rank *r = &cl->dec[i];
        pd_rank_init(r, dc, i / dc->dcp, i % dc->dcp, ntok);
        if (consecutive)
            for (uint32_t k = 0; k < r->num_pages; k++) r->pages[k] = k + 2;
        assert_ok(kvt_emu_poison(r->emu, r->pages, r->num_pages));
        kvt_engine_memory mem;
        kvt_pd_params p = pd_params(cl, r, &mem);
        assert_ok(kvt_pd_receiver_create(&r->r, &p));
    }
}

static void trip(bool ucx, const pd_side_cfg *p, const pd_side_cfg *d, uint32_t ntok, uint32_t prefix)
{
    pd_cluster cl = {0};
    if (ucx) {
        setenv("UCX_TLS", "tcp", 1);
        setenv("UCX_NET_DEVICES", "lo", 1);
        cl.net.transport = KVT_PD_UCX;
    }
    start(&cl, p, d, ntok);
    pd_open_room(&cl, 9, prefix);
    pd_expect_room(&cl, 9, KVT_PD_SUCCESS);
    assert_int_equal(pd_verify(&cl, prefix), 0);
    pd_cluster_stop(&cl);
}

static void all(bool ucx)
{
    for (int k = 0; k < 2; k++) {
        consecutive = k == 1;
        pd_side_cfg a = {1, 1, 16, KVT_LAYOUT_LAYER_FIRST, &mixed}, b = {1, 4, 8, KVT_LAYOUT_PAGE_FIRST, &mixed};
        trip(ucx, &a, &b, 3000, 0);
        trip(ucx, &a, &b, 2500, 333);
        pd_side_cfg c = {1, 1, 64, KVT_LAYOUT_PAGE_FIRST, &mixed}, e = {1, 1, 16, KVT_LAYOUT_LAYER_FIRST, &mixed};
        trip(ucx, &c, &e, 2000, 17);
        pd_side_cfg w2 = {2, 1, 16, KVT_LAYOUT_LAYER_FIRST, &wide}, w4 = {4, 1, 8, KVT_LAYOUT_PAGE_FIRST, &wide};
        trip(ucx, &w2, &w4, 1500, 0);
        trip(ucx, &w4, &w2, 1500, 100);
        pd_side_cfg g8 = {8, 1, 16, KVT_LAYOUT_LAYER_FIRST, &gqa}, g2 = {2, 1, 32, KVT_LAYOUT_LAYER_FIRST, &gqa};
        trip(ucx, &g8, &g2, 1200, 5);
    }
}

static void tcp(void **state) { (void)state, all(false); }
static void ucx(void **state) { (void)state, all(true); }

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(tcp),
        cmocka_unit_test(ucx),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
