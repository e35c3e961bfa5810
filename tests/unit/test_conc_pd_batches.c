/* test_conc_pd_batches.c - the sender gathers chunks of consecutive entries
 * into ~1 MiB sends (sender.c send_chunks); rooms byte-verified with batches
 * well above PD_CHUNK_BYTES: entries of very different sizes (some split
 * over several chunks, some gathered), DCP, GQA head slicing, page-first,
 * consecutive and scattered page tables, prefixes; TCP and UCX. And with
 * checksums on a thread per link (kvt_pd_params.checksum_threads) on one
 * side only: a chunk hashed out of order or not at all on that side would
 * fail the room ECORRUPT against the other side's inline digests. */
#include "pd_harness.h"

/* MLA, entries from 2 to 8192 bytes a token */
static const uint32_t mixed_bytes[7] = {1152, 64, 4096, 2, 8192, 640, 256};
static const pd_model mixed = {.layers = 7, .mla_bytes = mixed_bytes};
static const pd_model wide = {.layers = 4, .heads = 16, .head_dim = 128};
static const pd_model gqa = {.layers = 5, .heads = 4, .head_dim = 64};

static bool consecutive; /* this pass's page tables: 1, 2, 3, ... or scattered */
static int32_t pre_threads, dec_threads; /* this pass's checksum_threads */

static void trip(bool ucx, const pd_side_cfg *p, const pd_side_cfg *d, uint32_t ntok, uint32_t prefix)
{
    pd_cluster cl = {0};
    if (ucx) {
        setenv("UCX_TLS", "tcp", 1);
        setenv("UCX_NET_DEVICES", "lo", 1);
        cl.net.transport = KVT_PD_UCX;
    }
    cl.consecutive_pages = consecutive;
    cl.base.checksum_threads = pre_threads;
    cl.dec_checksum_threads = dec_threads;
    pd_cluster_start(&cl, p, d, ntok);
    pd_cluster_decoders(&cl);
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

/* Checksum threads on the prefill side only (scattered page tables: many
 * short pieces), then on the decode side only (consecutive: long runs);
 * the other side hashes inline, so both must give the same digests. */
static void threads(bool ucx)
{
    for (int k = 0; k < 2; k++) {
        consecutive = k == 1;
        pre_threads = k == 0 ? 1 : -1;
        dec_threads = -pre_threads;
        pd_side_cfg a = {1, 1, 16, KVT_LAYOUT_LAYER_FIRST, &mixed}, b = {1, 4, 8, KVT_LAYOUT_PAGE_FIRST, &mixed};
        trip(ucx, &a, &b, 2500, 333);
        pd_side_cfg g8 = {8, 1, 16, KVT_LAYOUT_LAYER_FIRST, &gqa}, g2 = {2, 1, 32, KVT_LAYOUT_LAYER_FIRST, &gqa};
        trip(ucx, &g8, &g2, 1200, 5);
    }
    pre_threads = dec_threads = 0;
}

static void tcp(void **state) { (void)state, all(false); }
static void ucx(void **state) { (void)state, all(true); }
static void tcp_checksum_threads(void **state) { (void)state, threads(false); }
static void ucx_checksum_threads(void **state) { (void)state, threads(true); }

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(tcp),
        cmocka_unit_test(ucx),
        cmocka_unit_test(tcp_checksum_threads),
        cmocka_unit_test(ucx_checksum_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
