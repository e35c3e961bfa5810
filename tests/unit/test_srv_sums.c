/* test_srv_sums.c - the node server's record of the layer checksums each
 * block was stored with (src/server/sums.c): kept by index entry, so a
 * block read back into another tier slot is still checked against what
 * its store's client copied; a record of another block (an entry id
 * reused) is never taken for it; a block with no record is hashed once and
 * recorded; a request's checksums fit one frame. */
#include <string.h>

#include "support.h"

#include "layout/layout.h"
#include "server/server.h"
#include "util/hash.h"

#define BT (2 * KVT_TEST_SMALL_TPP) /* tokens per block */
#define NL KVT_TEST_SMALL_LAYERS

static const kvt_hash128 K1 = {1, 11}, K2 = {2, 22};

/* Two blocks of the small geometry in one buffer, at offsets 0 and bb. */
typedef struct tier {
    kvt_geometry *g;
    uint64_t bb;
    uint8_t buf[2 * 128 * BT];
} tier;

static void tier_init(tier *t)
{
    t->g = kvt_test_small_geo();
    t->bb = 128 * BT; /* 2 layers x (K, V) x 2 heads x 8 dims x 2 bytes a token */
    for (size_t i = 0; i < sizeof t->buf; i++) t->buf[i] = (uint8_t)(i * 37 + 5);
}

static void test_a_record_follows_its_entry_not_its_slot(void **state)
{
    (void)state;
    tier t;
    tier_init(&t);
    kvt_srv_sums s;
    assert_ok(kvt__srv_sums_init(&s, 8, NL));
    /* entry 3 stored from the block at offset 0 with these sums */
    uint64_t stored[NL] = {0x1111, 0x2222};
    uint8_t wire[8 * NL];
    for (uint32_t l = 0; l < NL; l++)
        for (int k = 0; k < 8; k++) wire[8 * l + k] = (uint8_t)(stored[l] >> (8 * k));
    uint32_t id = 3;
    kvt__srv_sums_put(&s, &id, &K1, 1, wire);
    /* read back into another slot (offset bb): the record, not a hash */
    uint64_t off = t.bb, out[NL];
    assert_int_equal(kvt__srv_sums_get(&s, t.buf, t.g, BT, &off, &id, &K1, 1, out), 0);
    assert_true(out[0] == 0x1111 && out[1] == 0x2222);
    /* entry 3 now names another block (K2): its bytes are hashed once
     * and recorded; the next get takes the record */
    uint64_t want[NL];
    kvt__srv_layer_sums(t.buf + t.bb, t.g, BT, want);
    assert_int_equal(kvt__srv_sums_get(&s, t.buf, t.g, BT, &off, &id, &K2, 1, out), 1);
    assert_memory_equal(out, want, sizeof want);
    memset(t.buf + t.bb, 0, t.bb); /* the bytes change: the record stands */
    assert_int_equal(kvt__srv_sums_get(&s, t.buf, t.g, BT, &off, &id, &K2, 1, out), 0);
    assert_memory_equal(out, want, sizeof want);
    kvt__srv_sums_destroy(&s);
    kvt_geometry_destroy(t.g);
}

static void test_layer_sums_are_the_transfer_engines(void **state)
{
    (void)state;
    tier t;
    tier_init(&t);
    uint64_t got[NL];
    kvt__srv_layer_sums(t.buf, t.g, BT, got);
    for (uint32_t l = 0; l < NL; l++) {
        const uint8_t *seg = t.buf + kvt__geo_block_offset(t.g, BT, l, 0);
        uint64_t len = (uint64_t)BT * kvt__geo_layer_token_bytes(t.g, l);
        assert_true(got[l] == kvt__hash64(seg, (size_t)len, l));
    }
    kvt_geometry_destroy(t.g);
}

/* A get of more blocks than one 64-block chunk (sums.c works in chunks
 * with a bit mask): each block gets its own record or its own hash, the
 * return counts exactly the hashed ones, and they are recorded. */
static void test_a_long_get_reads_and_hashes_the_right_blocks(void **state)
{
    (void)state;
    enum { N = 150 };
    tier t;
    tier_init(&t);
    kvt_srv_sums s;
    assert_ok(kvt__srv_sums_init(&s, N, NL));
    static uint32_t ids[N];
    static uint64_t offs[N], out[N * NL], hashed[2][NL];
    static kvt_hash128 keys[N];
    kvt__srv_layer_sums(t.buf, t.g, BT, hashed[0]);
    kvt__srv_layer_sums(t.buf + t.bb, t.g, BT, hashed[1]);
    uint32_t recorded = 0;
    for (uint32_t i = 0; i < N; i++) {
        ids[i] = i;
        offs[i] = (i % 2) * t.bb;
        keys[i] = (kvt_hash128){100 + i, i};
        if (i % 3) continue; /* every third has a record: its own sums */
        uint8_t wire[8 * NL];
        for (uint32_t l = 0; l < NL; l++)
            for (int k = 0; k < 8; k++) wire[8 * l + k] = (uint8_t)((0xabc000ull + i * 8 + l) >> (8 * k));
        kvt__srv_sums_put(&s, &ids[i], &keys[i], 1, wire);
        recorded++;
    }
    assert_int_equal(kvt__srv_sums_get(&s, t.buf, t.g, BT, offs, ids, keys, N, out), N - recorded);
    for (uint32_t i = 0; i < N; i++)
        for (uint32_t l = 0; l < NL; l++)
            assert_true(out[i * NL + l] == (i % 3 ? hashed[i % 2][l] : 0xabc000u + i * 8 + l));
    memset(out, 0, sizeof out); /* now every block has a record */
    assert_int_equal(kvt__srv_sums_get(&s, t.buf, t.g, BT, offs, ids, keys, N, out), 0);
    for (uint32_t i = 0; i < N; i++)
        assert_true(out[i * NL] == (i % 3 ? hashed[i % 2][0] : 0xabc000u + i * 8));
    kvt__srv_sums_destroy(&s);
    kvt_geometry_destroy(t.g);
}

static void test_a_tasks_sums_fit_one_frame(void **state)
{
    (void)state;
    /* (16 MiB - 64) / (8 + 8 x layers) */
    assert_int_equal(kvt__srv_sums_max_blocks(32), 63549);
    assert_int_equal(kvt__srv_sums_max_blocks(80), 25890);
    assert_true((uint64_t)kvt__srv_sums_max_blocks(KVT_MAX_LAYERS) * (8 + 8 * KVT_MAX_LAYERS) <=
                KVT_SRV_MAX_MSG - 64);
    assert_int_equal(kvt__srv_sums_max_blocks(1), (KVT_SRV_MAX_MSG - 64) / 16);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_a_record_follows_its_entry_not_its_slot),
        cmocka_unit_test(test_layer_sums_are_the_transfer_engines),
        cmocka_unit_test(test_a_long_get_reads_and_hashes_the_right_blocks),
        cmocka_unit_test(test_a_tasks_sums_fit_one_frame),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
