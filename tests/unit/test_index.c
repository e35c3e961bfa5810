/* test_index.c - block hashes and the prefix index, including a randomized
 * comparison against a plain reference model of the same rules. */
#include "support.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "index/index.h"
#include "util/hash.h"

#include <xxhash.h>

#define BT 4 /* tokens per block in these tests */

static kvt_hash128 test_hash(uint64_t a, uint64_t b)
{
    uint64_t st = a * 0x9e3779b97f4a7c15ull + b;
    kvt_hash128 h = {kvt__splitmix64(&st), kvt__splitmix64(&st)};
    return h;
}

static bool hash_in(kvt_hash128 h, const kvt_hash128 *set, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        if (kvt__hash_eq(h, set[i])) return true;
    return false;
}

/* ------------------------------------------------------------------ */
/* Hashing                                                            */
/* ------------------------------------------------------------------ */

/* Block hashes are persisted (the SSD journal, the cluster's Redis keys)
 * and published (KV events): these values, taken from the streaming-state
 * implementation before the short-input path, must never change; both
 * paths of kvt__hash128_chain (<= 1024 bytes from one buffer, longer ones
 * streamed) give them. */
static void test_chain_hash_values(void **state)
{
    (void)state;
    static const kvt_hash128 want[6] = {
        {0x46cda6be21232923ull, 0xd7513cbb76a60ddbull},
        {0xab96d89d385d357dull, 0x532391e2ee4a171full},
        {0xae88ddc5ce4f1f01ull, 0x30a1699f21f21fcfull},
        {0xc78c639630970e1aull, 0x5f0025836b51b256ull},
        {0x13f033f294719313ull, 0x40625b6b4703afb1ull}, /* 1500 bytes: streamed */
        {0x05ea23ef06e28b2dull, 0xe5189a9599e3f862ull}, /* 0 bytes */
    };
    uint32_t toks[64];
    for (int i = 0; i < 64; i++) toks[i] = 1000u + 7u * (uint32_t)i;
    kvt_hash128 got[4];
    assert_int_equal(kvt__block_hashes(toks, 64, 16, "tenant-a", 8, got, 4), 4);
    for (int i = 0; i < 4; i++) assert_true(kvt__hash_eq(got[i], want[i]));
    unsigned char big[1500];
    for (int i = 0; i < 1500; i++) big[i] = (unsigned char)(i * 31 + 7);
    kvt_hash128 zero = {0, 0};
    assert_true(kvt__hash_eq(kvt__hash128_chain(zero, big, 1500), want[4]));
    assert_true(kvt__hash_eq(kvt__hash128_chain(zero, big, 0), want[5]));
    /* Either side of the one-buffer bound (1024 bytes one-shot, 1025
     * streamed): each is XXH3-128 of prev's 16 bytes and the data. */
    for (size_t len = 1020; len <= 1028; len++) {
        unsigned char cat[16 + 1028];
        memcpy(cat, &want[0], 16);
        memcpy(cat + 16, big, len);
        XXH128_hash_t r = XXH3_128bits(cat, 16 + len);
        assert_true(kvt__hash_eq(kvt__hash128_chain(want[0], big, len),
                                 (kvt_hash128){r.low64, r.high64}));
    }
}

static void test_hash_prefix_property(void **state)
{
    (void)state;
    enum { NB = 12 };
    uint32_t a[NB * BT], b[NB * BT];
    kvt_hash128 ha[NB], hb[NB];
    kvt_test_tokens(a, NB * BT, 1);
    memcpy(b, a, sizeof a);
    b[7 * BT] ^= 1; /* differs from block 7 on */
    assert_int_equal(kvt__block_hashes(a, NB * BT, BT, "m", 1, ha, NB), NB);
    assert_int_equal(kvt__block_hashes(b, NB * BT, BT, "m", 1, hb, NB), NB);
    for (uint32_t i = 0; i < NB; i++) assert_int_equal(kvt__hash_eq(ha[i], hb[i]), i < 7);

    /* Changing token j changes the hash of block j / BT and of every later
     * block, and no earlier one. */
    for (uint32_t j = 0; j < NB * BT; j++) {
        memcpy(b, a, sizeof a);
        b[j] += 1;
        kvt__block_hashes(b, NB * BT, BT, "m", 1, hb, NB);
        for (uint32_t i = 0; i < NB; i++) assert_int_equal(kvt__hash_eq(ha[i], hb[i]), i < j / BT);
    }
    /* All block hashes of one request are distinct. */
    for (uint32_t i = 0; i < NB; i++) assert_false(hash_in(ha[i], ha + i + 1, NB - 1 - i));
    /* Deterministic. */
    kvt__block_hashes(a, NB * BT, BT, "m", 1, hb, NB);
    assert_memory_equal(ha, hb, sizeof ha);
}

static void test_hash_namespaces(void **state)
{
    (void)state;
    enum { NB = 8 };
    uint32_t t[NB * BT];
    kvt_test_tokens(t, NB * BT, 2);
    kvt_hash128 h_null[NB], h_empty[NB], h_a[NB], h_b[NB], h_ab[NB];
    kvt__block_hashes(t, NB * BT, BT, NULL, 0, h_null, NB);
    kvt__block_hashes(t, NB * BT, BT, "", 0, h_empty, NB);
    kvt__block_hashes(t, NB * BT, BT, "a", 1, h_a, NB);
    kvt__block_hashes(t, NB * BT, BT, "b", 1, h_b, NB);
    kvt__block_hashes(t, NB * BT, BT, "ab", 2, h_ab, NB);
    /* ns_len 0 is the empty namespace whether or not ns is NULL. */
    assert_memory_equal(h_null, h_empty, sizeof h_null);
    /* Different namespaces share no hash at all, at any block. */
    const kvt_hash128 *all[] = {h_empty, h_a, h_b, h_ab};
    for (int x = 0; x < 4; x++)
        for (int y = x + 1; y < 4; y++)
            for (uint32_t i = 0; i < NB; i++) assert_false(hash_in(all[x][i], all[y], NB));
    /* The namespace's length counts: "a" + tokens is not "" + other tokens
     * that happen to start with the same bytes. */
    uint32_t zero_ns = 0;
    kvt_hash128 h0[NB], h1[NB];
    kvt__block_hashes(t, NB * BT, BT, &zero_ns, 4, h0, NB);
    kvt__block_hashes(t, NB * BT, BT, NULL, 0, h1, NB);
    assert_false(hash_in(h0[0], h1, NB));
}

static void test_hash_partial_and_max_out(void **state)
{
    (void)state;
    uint32_t t[40];
    kvt_test_tokens(t, 40, 3);
    kvt_hash128 full[10], h[10];
    assert_int_equal(kvt__block_hashes(t, 40, BT, "n", 1, full, 10), 10);
    /* A partial last block is not hashed. */
    memset(h, 0xab, sizeof h);
    assert_int_equal(kvt__block_hashes(t, 39, BT, "n", 1, h, 10), 9);
    assert_memory_equal(h, full, 9 * sizeof h[0]);
    kvt_hash128 poison;
    memset(&poison, 0xab, sizeof poison);
    assert_memory_equal(&h[9], &poison, sizeof poison);
    assert_int_equal(kvt__block_hashes(t, 3, BT, "n", 1, h, 10), 0);
    assert_int_equal(kvt__block_hashes(t, 0, BT, "n", 1, h, 10), 0);
    /* max_out is respected, and the prefix is the same. */
    memset(h, 0xab, sizeof h);
    assert_int_equal(kvt__block_hashes(t, 40, BT, "n", 1, h, 4), 4);
    assert_memory_equal(h, full, 4 * sizeof h[0]);
    assert_memory_equal(&h[4], &poison, sizeof poison);
    assert_int_equal(kvt__block_hashes(t, 40, BT, "n", 1, h, 0), 0);
    /* The block size is part of the identity. */
    kvt_hash128 h8[5];
    assert_int_equal(kvt__block_hashes(t, 40, 8, "n", 1, h8, 5), 5);
    assert_false(hash_in(h8[0], full, 10));
}

/* ------------------------------------------------------------------ */
/* Index rules                                                        */
/* ------------------------------------------------------------------ */

/* Inserts h[0..n) as one store under parent and commits it. */
static void store_chain(kvt_index *idx, uint32_t parent, const kvt_hash128 *h, uint32_t n,
                        uint32_t payload0, uint32_t *ids)
{
    for (uint32_t i = 0; i < n; i++) {
        assert_ok(kvt__index_insert(idx, i == 0 ? parent : ids[i - 1], h[i], payload0 + i, &ids[i]));
    }
    kvt__index_commit(idx, ids, n);
    assert_true(kvt__index_check(idx));
}

static void chain_hashes(kvt_hash128 *h, uint32_t n, uint64_t seed)
{
    for (uint32_t i = 0; i < n; i++) h[i] = test_hash(seed, i);
}

static void test_index_create_args(void **state)
{
    (void)state;
    kvt_index *idx = NULL;
    assert_status(kvt__index_create(&idx, 0, KVT_EVICT_LRU), KVT_EINVAL);
    assert_status(kvt__index_create(&idx, 10, (kvt_evict_policy)7), KVT_EINVAL);
    assert_ok(kvt__index_create(&idx, 1, KVT_EVICT_LFU));
    assert_int_equal(kvt__index_capacity(idx), 1);
    assert_int_equal(kvt__index_count(idx), 0);
    kvt__index_destroy(idx);
    kvt__index_destroy(NULL);
}

static void test_index_pending_commit_abort(void **state)
{
    (void)state;
    kvt_index *idx;
    assert_ok(kvt__index_create(&idx, 64, KVT_EVICT_LRU));
    kvt_hash128 h[6];
    uint32_t ids[6], got[6], pl[6];
    chain_hashes(h, 6, 1);
    store_chain(idx, KVT_INDEX_NONE, h, 2, 100, ids); /* h0 h1 READY */
    assert_int_equal(kvt__index_evictable(idx), 1);    /* h1 only */

    /* A store of h2..h4 in flight: invisible to match, seen by probe. */
    for (uint32_t i = 2; i < 5; i++) assert_ok(kvt__index_insert(idx, ids[i - 1], h[i], 100 + i, &ids[i]));
    assert_int_equal(kvt__index_count(idx), 5);
    assert_int_equal(kvt__index_match(idx, h, 5, got, true), 2);
    assert_int_equal(got[0], ids[0]);
    assert_int_equal(got[1], ids[1]);
    kvt_index_stop stop;
    assert_int_equal(kvt__index_probe(idx, h, 6, got, &stop), 2);
    assert_int_equal(stop, KVT_STOP_PENDING);
    /* The parent of a pending child is not evictable. */
    assert_int_equal(kvt__index_evictable(idx), 0);
    assert_int_equal(kvt__index_evict(idx, 6, pl), 0);
    /* Duplicate insert rejected, READY or PENDING. */
    uint32_t dummy = 77;
    assert_status(kvt__index_insert(idx, KVT_INDEX_NONE, h[0], 1, &dummy), KVT_EINVAL);
    assert_status(kvt__index_insert(idx, ids[3], h[4], 1, &dummy), KVT_EINVAL);
    assert_int_equal(dummy, 77);

    /* Abort: no trace; h1 is evictable again. */
    kvt__index_abort(idx, ids + 2, 3);
    assert_true(kvt__index_check(idx));
    assert_int_equal(kvt__index_count(idx), 2);
    assert_int_equal(kvt__index_probe(idx, h, 6, got, &stop), 2);
    assert_int_equal(stop, KVT_STOP_ABSENT);
    assert_int_equal(kvt__index_evictable(idx), 1);

    /* Commit makes a store visible. */
    for (uint32_t i = 2; i < 6; i++) assert_ok(kvt__index_insert(idx, ids[i - 1], h[i], 100 + i, &ids[i]));
    kvt__index_commit(idx, ids + 2, 4);
    assert_true(kvt__index_check(idx));
    assert_int_equal(kvt__index_match(idx, h, 6, got, false), 6);
    assert_memory_equal(got, ids, sizeof ids);
    assert_int_equal(kvt__index_probe(idx, h, 6, got, &stop), 6);
    assert_int_equal(stop, KVT_STOP_END);
    for (uint32_t i = 0; i < 6; i++) assert_int_equal(kvt__index_payload(idx, ids[i]), 100 + i);

    /* Eviction takes the chain from its tail. */
    assert_int_equal(kvt__index_evict(idx, 100, pl), 6);
    for (uint32_t i = 0; i < 6; i++) assert_int_equal(pl[i], 105 - i);
    assert_int_equal(kvt__index_count(idx), 0);
    assert_int_equal(kvt__index_match(idx, h, 6, got, false), 0);
    assert_true(kvt__index_check(idx));
    kvt__index_destroy(idx);
}

static void test_index_pins(void **state)
{
    (void)state;
    kvt_index *idx;
    assert_ok(kvt__index_create(&idx, 16, KVT_EVICT_LRU));
    kvt_hash128 h[4];
    uint32_t ids[4], pl[4];
    chain_hashes(h, 4, 2);
    store_chain(idx, KVT_INDEX_NONE, h, 4, 0, ids);
    kvt__index_pin(idx, ids + 3, 1);
    kvt__index_pin(idx, ids + 3, 1); /* pins count */
    assert_int_equal(kvt__index_evict(idx, 4, pl), 0);
    kvt__index_unpin(idx, ids + 3, 1);
    assert_int_equal(kvt__index_evict(idx, 4, pl), 0);
    /* A pinned middle block stops the eviction of its prefix too. */
    kvt__index_pin(idx, ids + 1, 1);
    kvt__index_unpin(idx, ids + 3, 1);
    assert_int_equal(kvt__index_evict(idx, 4, pl), 2);
    assert_int_equal(pl[0], 3);
    assert_int_equal(pl[1], 2);
    assert_true(kvt__index_check(idx));
    kvt__index_unpin(idx, ids + 1, 1);
    assert_int_equal(kvt__index_evict(idx, 4, pl), 2);
    assert_int_equal(kvt__index_count(idx), 0);
    kvt__index_destroy(idx);
}

static void test_index_accessors_and_evict_ids(void **state)
{
    (void)state;
    kvt_index *idx;
    assert_ok(kvt__index_create(&idx, 16, KVT_EVICT_LRU));
    kvt_hash128 h[3];
    uint32_t ids[3], out_ids[3], pl[3];
    chain_hashes(h, 3, 5);
    store_chain(idx, KVT_INDEX_NONE, h, 3, 20, ids);
    for (uint32_t i = 0; i < 3; i++) {
        kvt_hash128 k = kvt__index_key(idx, ids[i]);
        assert_true(kvt__hash_eq(k, h[i]));
        assert_int_equal(kvt__index_parent(idx, ids[i]), i == 0 ? KVT_INDEX_NONE : ids[i - 1]);
        assert_int_equal(kvt__index_pins(idx, ids[i]), 0);
    }
    kvt__index_pin(idx, ids, 2);
    assert_int_equal(kvt__index_pins(idx, ids[1]), 1);
    kvt__index_set_payload(idx, ids[2], 99);
    assert_int_equal(kvt__index_payload(idx, ids[2]), 99);
    assert_int_equal(kvt__index_evict_ids(idx, 3, out_ids, pl), 1);
    assert_int_equal(out_ids[0], ids[2]);
    assert_int_equal(pl[0], 99);
    kvt__index_unpin(idx, ids, 2);
    assert_int_equal(kvt__index_evict_ids(idx, 3, out_ids, NULL), 2);
    assert_int_equal(out_ids[0], ids[1]);
    assert_int_equal(out_ids[1], ids[0]);
    assert_true(kvt__index_check(idx));
    kvt__index_destroy(idx);
}

static void test_index_full_and_leaves_only(void **state)
{
    (void)state;
    kvt_index *idx;
    assert_ok(kvt__index_create(&idx, 8, KVT_EVICT_LRU));
    kvt_hash128 a[4], b[4];
    uint32_t ia[4], ib[4], pl[8], got[4];
    chain_hashes(a, 4, 3);
    chain_hashes(b, 4, 4);
    store_chain(idx, KVT_INDEX_NONE, a, 4, 0, ia);
    store_chain(idx, ia[1], b, 4, 10, ib); /* b hangs off a1: a tree */
    uint32_t x;
    assert_status(kvt__index_insert(idx, KVT_INDEX_NONE, test_hash(9, 9), 0, &x), KVT_EFULL);
    assert_status(kvt__index_insert(idx, KVT_INDEX_NONE, a[0], 0, &x), KVT_EINVAL);
    /* Leaves are a3 and b3; a is older. Evicting one at a time, a middle
     * block never goes before its descendants. */
    for (uint32_t n = 0; n < 8; n++) {
        assert_int_equal(kvt__index_evict(idx, 1, pl + n), 1);
        assert_true(kvt__index_check(idx));
        /* every prefix that remains is matchable in full up to its end */
        uint32_t ka = kvt__index_match(idx, a, 4, got, false);
        uint32_t kb = kvt__index_match(idx, b, 4, got, false);
        assert_int_equal(kvt__index_count(idx), 8 - n - 1);
        assert_true(kb == 0 || ka >= 2);
    }
    const uint32_t want[8] = {3, 2, 13, 12, 11, 10, 1, 0};
    assert_memory_equal(pl, want, sizeof want);
    kvt__index_destroy(idx);
}

static void test_index_lru_order(void **state)
{
    (void)state;
    kvt_index *idx;
    enum { N = 6 };
    assert_ok(kvt__index_create(&idx, 64, KVT_EVICT_LRU));
    kvt_hash128 h[N];
    uint32_t ids[N], got[1], pl[N];
    for (uint32_t i = 0; i < N; i++) {
        h[i] = test_hash(100 + i, 0);
        store_chain(idx, KVT_INDEX_NONE, &h[i], 1, i, &ids[i]);
    }
    /* Use in the order 3, 0, 5; untouched 1, 2, 4 are the oldest. */
    kvt__index_match(idx, &h[3], 1, got, true);
    kvt__index_match(idx, &h[0], 1, got, true);
    kvt__index_match(idx, &h[5], 1, got, true);
    kvt__index_match(idx, &h[1], 1, got, false); /* not a touch */
    assert_int_equal(kvt__index_evict(idx, N, pl), N);
    const uint32_t want[N] = {1, 2, 4, 3, 0, 5};
    assert_memory_equal(pl, want, sizeof want);
    kvt__index_destroy(idx);
}

static void test_index_lfu_keeps_frequent(void **state)
{
    (void)state;
    kvt_index *idx;
    enum { N = 6 };
    assert_ok(kvt__index_create(&idx, 1024, KVT_EVICT_LFU));
    kvt_hash128 h[N];
    uint32_t ids[N], got[1], pl[N];
    for (uint32_t i = 0; i < N; i++) {
        h[i] = test_hash(200 + i, 0);
        store_chain(idx, KVT_INDEX_NONE, &h[i], 1, i, &ids[i]);
    }
    /* Block 0 is hot, 1 warm; 5 is touched last but only once. */
    for (int r = 0; r < 10; r++) kvt__index_match(idx, &h[0], 1, got, true);
    for (int r = 0; r < 3; r++) kvt__index_match(idx, &h[1], 1, got, true);
    kvt__index_match(idx, &h[5], 1, got, true);
    assert_true(kvt__index_check(idx));
    /* Counts: 2:1 3:1 4:1 (ties by age) 5:2 1:4 0:11. */
    assert_int_equal(kvt__index_evict(idx, N, pl), N);
    const uint32_t want[N] = {2, 3, 4, 5, 1, 0};
    assert_memory_equal(pl, want, sizeof want);
    kvt__index_destroy(idx);
}

static void test_index_lfu_decay(void **state)
{
    (void)state;
    /* With capacity 8, counts halve every 8 touches: an old burst of use
     * fades and a block used steadily since then wins. */
    kvt_index *idx;
    assert_ok(kvt__index_create(&idx, 8, KVT_EVICT_LFU));
    kvt_hash128 h[2];
    uint32_t ids[2], got[1], pl[2];
    for (uint32_t i = 0; i < 2; i++) {
        h[i] = test_hash(300 + i, 0);
        store_chain(idx, KVT_INDEX_NONE, &h[i], 1, i, &ids[i]);
    }
    for (int r = 0; r < 7; r++) kvt__index_match(idx, &h[0], 1, got, true); /* 0: 8 */
    /* 8th touch: decay -> 0: 4, 1: 1 */
    kvt__index_match(idx, &h[1], 1, got, true);
    for (int r = 0; r < 8 * 4; r++) kvt__index_match(idx, &h[1], 1, got, true);
    assert_true(kvt__index_check(idx));
    assert_int_equal(kvt__index_evict(idx, 1, pl), 1);
    assert_int_equal(pl[0], 0);
    kvt__index_destroy(idx);

    /* Halving can turn the order around: y (3 uses, older) was behind
     * x (2 uses, newer); after a decay both count 1 and y, older, goes
     * first. */
    assert_ok(kvt__index_create(&idx, 8, KVT_EVICT_LFU));
    kvt_hash128 y = test_hash(310, 0), x = test_hash(311, 0), w = test_hash(312, 0);
    uint32_t iy, ix, iw;
    store_chain(idx, KVT_INDEX_NONE, &y, 1, 1, &iy);
    store_chain(idx, KVT_INDEX_NONE, &x, 1, 2, &ix);
    store_chain(idx, KVT_INDEX_NONE, &w, 1, 3, &iw);
    kvt__index_match(idx, &y, 1, got, true);
    kvt__index_match(idx, &y, 1, got, true); /* y: 3 */
    kvt__index_match(idx, &x, 1, got, true); /* x: 2, heap root */
    for (int r = 0; r < 5; r++) kvt__index_match(idx, &w, 1, got, true); /* 8th: decay */
    assert_true(kvt__index_check(idx));
    uint32_t out[3];
    assert_int_equal(kvt__index_evict(idx, 3, out), 3);
    const uint32_t want[3] = {1, 2, 3};
    assert_memory_equal(out, want, sizeof want);
    kvt__index_destroy(idx);
}

static void test_index_slot_reuse(void **state)
{
    (void)state;
    /* Many generations through a small table: backward-shift deletion must
     * keep every live entry findable. */
    kvt_index *idx;
    enum { CAP = 97 };
    assert_ok(kvt__index_create(&idx, CAP, KVT_EVICT_LRU));
    uint32_t ids[CAP], pl[CAP], got[1];
    for (uint32_t gen = 0; gen < 200; gen++) {
        uint32_t n = CAP - kvt__index_count(idx);
        for (uint32_t i = 0; i < n; i++) {
            kvt_hash128 h = test_hash(gen + 1000, i);
            assert_ok(kvt__index_insert(idx, KVT_INDEX_NONE, h, i, &ids[i]));
            kvt__index_commit(idx, &ids[i], 1);
        }
        assert_int_equal(kvt__index_count(idx), CAP);
        for (uint32_t i = 0; i < n; i++) {
            kvt_hash128 h = test_hash(gen + 1000, i);
            assert_int_equal(kvt__index_match(idx, &h, 1, got, false), 1);
        }
        assert_int_equal(kvt__index_evict(idx, 1 + gen % CAP, pl), 1 + gen % CAP);
        assert_true(kvt__index_check(idx));
    }
    kvt__index_destroy(idx);
}

static void test_index_memory_budget(void **state)
{
    (void)state;
    kvt_index *idx;
    const uint32_t cap = 1000000;
    assert_ok(kvt__index_create(&idx, cap, KVT_EVICT_LRU));
    double per_block = (double)kvt__index_memory_bytes(idx) / cap;
    print_message("index: %.2f bytes per block at %u blocks\n", per_block, cap);
    assert_true(per_block <= 48.0);
    /* Fill it: the table stays usable at its full load factor. */
    uint32_t id, got[1];
    for (uint32_t i = 0; i < cap; i++) {
        kvt_hash128 h = test_hash(7, i);
        assert_ok(kvt__index_insert(idx, KVT_INDEX_NONE, h, i, &id));
    }
    assert_status(kvt__index_insert(idx, KVT_INDEX_NONE, test_hash(8, 0), 0, &id), KVT_EFULL);
    for (uint32_t i = 0; i < cap; i += 997) {
        kvt_hash128 h = test_hash(7, i);
        kvt_index_stop stop;
        assert_int_equal(kvt__index_probe(idx, &h, 1, got, &stop), 0);
        assert_int_equal(stop, KVT_STOP_PENDING);
    }
    kvt__index_destroy(idx);
}

/* ------------------------------------------------------------------ */
/* Bounds of the packed entry                                         */
/* ------------------------------------------------------------------ */

/* Entry ticks are u32 offsets from an epoch. A shared clock lets the test
 * start just below 2^32: the epoch moves while entries are stored, and
 * reported ticks and LRU order stay exact. */
static void test_index_tick_wrap(void **state)
{
    (void)state;
    kvt_index *idx;
    enum { N = 6 };
    const uint64_t t0 = (1ull << 32) - 3;
    _Atomic uint64_t clock = t0;
    assert_ok(kvt__index_create(&idx, 64, KVT_EVICT_LRU));
    kvt__index_share_clock(idx, &clock);
    kvt_hash128 h[N];
    uint32_t ids[N], got[1], pl[N];
    for (uint32_t i = 0; i < N; i++) { /* ticks 2^32 - 2 .. 2^32 + 3 */
        h[i] = test_hash(400 + i, 0);
        store_chain(idx, KVT_INDEX_NONE, &h[i], 1, i, &ids[i]);
    }
    uint16_t freq;
    uint64_t tick;
    for (uint32_t i = 0; i < N; i++) {
        kvt__index_age(idx, ids[i], &freq, &tick);
        assert_int_equal(freq, 0);
        assert_true(tick == t0 + 1 + i);
    }
    /* Use in the order 3, 0, 5; untouched 1, 2, 4 are the oldest. */
    kvt__index_match(idx, &h[3], 1, got, true);
    kvt__index_match(idx, &h[0], 1, got, true);
    kvt__index_match(idx, &h[5], 1, got, true);
    assert_true(kvt__index_check(idx));
    kvt__index_age(idx, ids[5], &freq, &tick);
    assert_true(tick == t0 + N + 3);
    assert_true(kvt__index_coldest(idx, &freq, &tick));
    assert_true(tick == t0 + 2); /* block 1 */
    /* The epoch moved to 2^31 at tick 2^32. The last tick before it moves
     * again, 2^32 - 1 past it, leaves every tick exact. */
    const uint64_t last = (1ull << 31) + UINT32_MAX;
    atomic_store(&clock, last - 1);
    kvt__index_match(idx, &h[4], 1, got, true);
    kvt__index_age(idx, ids[4], &freq, &tick);
    assert_true(tick == last);
    kvt__index_age(idx, ids[1], &freq, &tick);
    assert_true(tick == t0 + 2);
    /* The next moves it to 2^32: block 1 (touched at 2^32 - 1) becomes
     * 2^32, the same as block 2, and ranks before it by id. */
    kvt__index_match(idx, &h[4], 1, got, true);
    assert_true(kvt__index_check(idx));
    kvt__index_age(idx, ids[1], &freq, &tick);
    assert_true(tick == 1ull << 32);
    kvt__index_age(idx, ids[2], &freq, &tick);
    assert_true(tick == 1ull << 32);
    kvt__index_age(idx, ids[5], &freq, &tick);
    assert_true(tick == t0 + N + 3);
    kvt__index_age(idx, ids[4], &freq, &tick);
    assert_true(tick == last + 1);
    assert_int_equal(kvt__index_evict(idx, N, pl), N);
    const uint32_t want[N] = {1, 2, 3, 0, 5, 4};
    assert_memory_equal(pl, want, sizeof want);
    kvt__index_destroy(idx);
}

/* An entry untouched for more than 2^31 ticks when the epoch moves ranks as
 * touched at the new epoch: colder than every entry touched since, and
 * among such entries by id (LFU: by count first). */
static void test_index_tick_clamp(void **state)
{
    (void)state;
    for (int lfu = 0; lfu < 2; lfu++) {
        kvt_index *idx;
        enum { N = 6 };
        _Atomic uint64_t clock = 0;
        assert_ok(kvt__index_create(&idx, 64, lfu ? KVT_EVICT_LFU : KVT_EVICT_LRU));
        kvt__index_share_clock(idx, &clock);
        kvt_hash128 h[N];
        uint32_t ids[N], got[1], pl[N];
        for (uint32_t i = 0; i < N; i++) {
            h[i] = test_hash(500 + i, 0);
            store_chain(idx, KVT_INDEX_NONE, &h[i], 1, i, &ids[i]);
        }
        kvt__index_match(idx, &h[4], 1, got, true); /* 4, then 1: the newest before */
        kvt__index_match(idx, &h[1], 1, got, true);
        kvt__index_match(idx, &h[1], 1, got, true);
        const uint64_t jump = 3ull << 32;
        atomic_store(&clock, jump);
        kvt__index_match(idx, &h[5], 1, got, true); /* moves the epoch */
        kvt__index_match(idx, &h[2], 1, got, true);
        assert_true(kvt__index_check(idx));
        const uint64_t epoch = jump + 1 - (1ull << 31);
        uint16_t freq;
        uint64_t tick;
        const uint32_t old[4] = {0, 1, 3, 4};
        for (uint32_t i = 0; i < 4; i++) {
            kvt__index_age(idx, ids[old[i]], &freq, &tick);
            assert_true(tick == epoch);
        }
        kvt__index_age(idx, ids[5], &freq, &tick);
        assert_true(tick == jump + 1);
        kvt__index_age(idx, ids[2], &freq, &tick);
        assert_true(tick == jump + 2);
        assert_int_equal(kvt__index_evict(idx, N, pl), N);
        /* LRU: the clamped ones by id, then 5, 2. LFU counts 0:1 1:3 2:2
         * 3:1 4:2 5:2: 0 and 3 (count 1, tied), 4 (2, clamped), 5, 2, 1. */
        const uint32_t want_lru[N] = {0, 1, 3, 4, 5, 2};
        const uint32_t want_lfu[N] = {0, 3, 4, 5, 2, 1};
        assert_memory_equal(pl, lfu ? want_lfu : want_lru, sizeof want_lru);
        kvt__index_destroy(idx);
    }
}

/* Pins are a split count (index.c: the pin bound): a pin past
 * KVT_INDEX_MAX_PINS is refused, all or nothing, and the count and heap
 * stay as they were. */
static void test_index_pin_limit(void **state)
{
    (void)state;
    kvt_index *idx;
    assert_ok(kvt__index_create(&idx, 16, KVT_EVICT_LRU));
    kvt_hash128 a[2], b = test_hash(600, 9);
    uint32_t ia[2], ib, pl[3];
    chain_hashes(a, 2, 600);
    store_chain(idx, KVT_INDEX_NONE, a, 2, 0, ia);
    store_chain(idx, KVT_INDEX_NONE, &b, 1, 2, &ib);
    /* One at a time up to the limit and back down: exact through every
     * carry and borrow between the two parts, a candidate again only at 0. */
    for (uint32_t n = 1; n <= KVT_INDEX_MAX_PINS; n++) {
        assert_ok(kvt__index_pin(idx, &ib, 1));
        if (kvt__index_pins(idx, ib) != n) fail_msg("pins %u, want %u", kvt__index_pins(idx, ib), n);
        if (n % 4096 <= 1 || n % 16383 <= 1) assert_true(kvt__index_check(idx));
    }
    assert_int_equal(kvt__index_evictable(idx), 1); /* a1 */
    assert_status(kvt__index_pin(idx, &ib, 1), KVT_EFULL);
    assert_int_equal(kvt__index_pins(idx, ib), KVT_INDEX_MAX_PINS);
    for (uint32_t n = KVT_INDEX_MAX_PINS; n-- > 0;) {
        kvt__index_unpin(idx, &ib, 1);
        if (kvt__index_pins(idx, ib) != n) fail_msg("pins %u, want %u", kvt__index_pins(idx, ib), n);
        if (kvt__index_evictable(idx) != (n == 0 ? 2u : 1u)) fail_msg("candidate at %u pins", n);
        if (n % 4096 <= 1 || n % 16383 <= 1) assert_true(kvt__index_check(idx));
    }
    /* Many in one call. */
    uint32_t *many = malloc((size_t)KVT_INDEX_MAX_PINS * sizeof *many);
    assert_non_null(many);
    for (uint32_t i = 0; i < KVT_INDEX_MAX_PINS; i++) many[i] = ia[1];
    assert_ok(kvt__index_pin(idx, many, KVT_INDEX_MAX_PINS));
    assert_int_equal(kvt__index_pins(idx, ia[1]), KVT_INDEX_MAX_PINS);
    assert_status(kvt__index_pin(idx, &ia[1], 1), KVT_EFULL);
    assert_int_equal(kvt__index_pins(idx, ia[1]), KVT_INDEX_MAX_PINS);
    /* b (a candidate) and a0 come before the refusal: undone. */
    const uint32_t three[3] = {ib, ia[0], ia[1]};
    assert_int_equal(kvt__index_evictable(idx), 1);
    assert_status(kvt__index_pin(idx, three, 3), KVT_EFULL);
    assert_int_equal(kvt__index_pins(idx, ib), 0);
    assert_int_equal(kvt__index_pins(idx, ia[0]), 0);
    assert_int_equal(kvt__index_evictable(idx), 1);
    assert_true(kvt__index_check(idx));
    /* One off the limit: room for one more. */
    kvt__index_unpin(idx, many, 1);
    assert_ok(kvt__index_pin(idx, three, 3));
    assert_int_equal(kvt__index_pins(idx, ia[1]), KVT_INDEX_MAX_PINS);
    assert_int_equal(kvt__index_evictable(idx), 0);
    kvt__index_unpin(idx, three, 2);
    kvt__index_unpin(idx, many, KVT_INDEX_MAX_PINS);
    assert_true(kvt__index_check(idx));
    assert_int_equal(kvt__index_evict(idx, 3, pl), 3);
    const uint32_t want[3] = {1, 0, 2}; /* a1 (tick 2), then a0 (1), b (3) */
    assert_memory_equal(pl, want, sizeof want);
    free(many);
    kvt__index_destroy(idx);
}

/* Hashes that share their low 64 bits share a home slot and a slot tag:
 * every lookup of one meets the others' slots first and must compare the
 * full key; deleting one shifts the run back over it. */
static void test_index_tag_collision(void **state)
{
    (void)state;
    kvt_index *idx;
    enum { N = 5 };
    assert_ok(kvt__index_create(&idx, 32, KVT_EVICT_LRU));
    kvt_hash128 h[N];
    uint32_t ids[N], got[N], pl[N];
    for (uint32_t i = 0; i < N; i++) h[i] = (kvt_hash128){0x1234567890abcdefull, 1000 + i};
    store_chain(idx, KVT_INDEX_NONE, h, N, 0, ids);
    kvt_index_stop stop;
    assert_int_equal(kvt__index_probe(idx, h, N, got, &stop), N);
    assert_int_equal(stop, KVT_STOP_END);
    assert_memory_equal(got, ids, sizeof ids);
    kvt_hash128 other = {h[0].lo, 999};
    assert_int_equal(kvt__index_find(idx, other), KVT_INDEX_NONE);
    assert_int_equal(kvt__index_match(idx, &other, 1, got, true), 0);
    for (uint32_t n = N; n-- > 0;) { /* tail first, each time the run shrinks */
        assert_int_equal(kvt__index_evict(idx, 1, pl), 1);
        assert_int_equal(pl[0], n);
        assert_true(kvt__index_check(idx));
        assert_int_equal(kvt__index_match(idx, h, N, got, true), n);
    }
    kvt__index_destroy(idx);
}

/* ------------------------------------------------------------------ */
/* Randomized comparison with a reference model                       */
/* ------------------------------------------------------------------ */

enum { R_FREE = 0, R_PENDING = 1, R_READY = 2 };
enum { NSEQ = 24, SEQ_BLOCKS = 10, MAX_STORES = 8, MAX_PINSETS = 8 };

typedef struct ref_entry {
    kvt_hash128 h;
    int parent; /* model index or -1 */
    uint32_t payload, children, pins, freq, id;
    uint64_t tick;
    int state;
} ref_entry;

typedef struct ref_model {
    ref_entry *e;
    uint32_t n_slots; /* array length (grows as needed, reused when free) */
    uint32_t count, cap;
    uint64_t clock, decay_touches;
    uint64_t epoch; /* the index's tick bound: see ref_stamp */
    kvt_evict_policy policy;
} ref_model;

/* The next tick. The index keeps ticks as u32 offsets from an epoch: when
 * a tick is more than 2^32 - 1 past it, the epoch moves to 2^31 before
 * the tick and older ticks become the epoch. */
static uint64_t ref_stamp(ref_model *m)
{
    uint64_t t = ++m->clock;
    if (t - m->epoch > UINT32_MAX) {
        m->epoch = t - (1ull << 31);
        for (uint32_t i = 0; i < m->n_slots; i++)
            if (m->e[i].tick < m->epoch) m->e[i].tick = m->epoch;
    }
    return t;
}

typedef struct store_op {
    uint32_t n;
    uint32_t ids[SEQ_BLOCKS];
} store_op;

static int ref_find(const ref_model *m, kvt_hash128 h)
{
    for (uint32_t i = 0; i < m->n_slots; i++)
        if (m->e[i].state != R_FREE && kvt__hash_eq(m->e[i].h, h)) return (int)i;
    return -1;
}

static int ref_by_id(const ref_model *m, uint32_t id)
{
    for (uint32_t i = 0; i < m->n_slots; i++)
        if (m->e[i].state != R_FREE && m->e[i].id == id) return (int)i;
    return -1;
}

static uint32_t ref_match(ref_model *m, const kvt_hash128 *h, uint32_t n, bool touch)
{
    int found[SEQ_BLOCKS];
    uint32_t k = 0;
    while (k < n) {
        int i = ref_find(m, h[k]);
        if (i < 0 || m->e[i].state != R_READY) break;
        found[k++] = i;
    }
    if (touch) {
        for (uint32_t j = 0; j < k; j++) {
            ref_entry *e = &m->e[found[j]];
            e->tick = ref_stamp(m);
            if (e->freq < UINT16_MAX) e->freq++;
        }
        if (m->policy == KVT_EVICT_LFU && k > 0) {
            m->decay_touches += k;
            if (m->decay_touches >= m->cap) {
                for (uint32_t i = 0; i < m->n_slots; i++) m->e[i].freq >>= 1;
                m->decay_touches = 0;
            }
        }
    }
    return k;
}

static bool ref_candidate(const ref_entry *e)
{
    return e->state == R_READY && e->pins == 0 && e->children == 0;
}

static bool ref_before(const ref_model *m, const ref_entry *a, const ref_entry *b)
{
    if (m->policy == KVT_EVICT_LFU && a->freq != b->freq) return a->freq < b->freq;
    if (a->tick != b->tick) return a->tick < b->tick;
    return a->id < b->id; /* ticks tie only once the epoch clamped them */
}

static void ref_remove(ref_model *m, int i)
{
    ref_entry *e = &m->e[i];
    assert_int_equal(e->children, 0);
    if (e->parent >= 0) {
        assert_true(m->e[e->parent].children > 0);
        m->e[e->parent].children--;
    }
    e->state = R_FREE;
    m->count--;
}

static void ref_insert(ref_model *m, int parent, kvt_hash128 h, uint32_t payload, uint32_t id)
{
    uint32_t i = 0;
    while (i < m->n_slots && m->e[i].state != R_FREE) i++;
    assert_true(i < m->cap);
    uint64_t tick = ref_stamp(m);
    if (i == m->n_slots) m->n_slots++;
    m->e[i] = (ref_entry){.h = h, .parent = parent, .payload = payload, .pins = 1, .freq = 1,
                          .id = id, .tick = tick, .state = R_PENDING};
    if (parent >= 0) m->e[parent].children++;
    m->count++;
}

/* The model's eviction victim, -1 if none. */
static int ref_victim(const ref_model *m)
{
    int best = -1;
    for (uint32_t i = 0; i < m->n_slots; i++) {
        if (m->e[i].state == R_FREE || !ref_candidate(&m->e[i])) continue;
        if (best < 0 || ref_before(m, &m->e[i], &m->e[best])) best = (int)i;
    }
    return best;
}

/* Sequences of blocks that share prefixes: each copies a random prefix of
 * an earlier one, then diverges. */
static void make_sequences(kvt_hash128 seq[NSEQ][SEQ_BLOCKS], uint64_t *rng)
{
    uint32_t tokens[NSEQ][SEQ_BLOCKS * BT];
    for (uint32_t s = 0; s < NSEQ; s++) {
        kvt_test_tokens(tokens[s], SEQ_BLOCKS * BT, kvt__splitmix64(rng));
        if (s > 0) {
            uint32_t from = (uint32_t)(kvt__splitmix64(rng) % s);
            uint32_t shared = (uint32_t)(kvt__splitmix64(rng) % SEQ_BLOCKS) * BT;
            memcpy(tokens[s], tokens[from], shared * sizeof(uint32_t));
        }
        const char *ns = s % 5 == 4 ? "other" : NULL;
        assert_int_equal(kvt__block_hashes(tokens[s], SEQ_BLOCKS * BT, BT, ns, ns ? 5 : 0, seq[s],
                                           SEQ_BLOCKS),
                         SEQ_BLOCKS);
    }
}

static void compare_all(kvt_index *idx, ref_model *m, kvt_hash128 seq[NSEQ][SEQ_BLOCKS])
{
    uint32_t ids[SEQ_BLOCKS];
    assert_int_equal(kvt__index_count(idx), m->count);
    for (uint32_t s = 0; s < NSEQ; s++) {
        kvt_index_stop stop;
        uint32_t k = kvt__index_probe(idx, seq[s], SEQ_BLOCKS, ids, &stop);
        assert_int_equal(k, ref_match(m, seq[s], SEQ_BLOCKS, false));
        for (uint32_t j = 0; j < k; j++) {
            int r = ref_find(m, seq[s][j]);
            assert_int_equal(m->e[r].id, ids[j]);
            uint16_t freq;
            uint64_t tick;
            kvt__index_age(idx, ids[j], &freq, &tick);
            assert_true(tick == m->e[r].tick);
            if (m->policy == KVT_EVICT_LFU) assert_int_equal(freq, m->e[r].freq);
            /* parent presence: the parent of a present block is the one before */
            if (j > 0) assert_int_equal(m->e[m->e[r].parent].id, ids[j - 1]);
        }
    }
}

/* clock0: 0, the index's own clock; else a shared clock starting there
 * that now and then jumps ahead (up to 2^33 ticks), so the index's epoch
 * moves and clamps old ticks, as the model does. */
static void run_random_clock(uint64_t seed, kvt_evict_policy policy, uint32_t cap, uint32_t ops,
                             uint64_t clock0)
{
    uint64_t rng = seed;
    kvt_hash128 seq[NSEQ][SEQ_BLOCKS];
    make_sequences(seq, &rng);
    kvt_index *idx;
    _Atomic uint64_t clock = clock0;
    assert_ok(kvt__index_create(&idx, cap, policy));
    if (clock0) kvt__index_share_clock(idx, &clock);
    ref_model m = {.e = calloc(cap, sizeof(ref_entry)), .cap = cap, .policy = policy,
                   .clock = clock0};
    assert_non_null(m.e);
    store_op stores[MAX_STORES];
    uint32_t nstores = 0;
    store_op pinsets[MAX_PINSETS];
    uint32_t npins = 0, payload_next = 1;
    uint32_t ids[SEQ_BLOCKS], pl[16];

    for (uint32_t op = 0; op < ops; op++) {
        if (clock0 && kvt__splitmix64(&rng) % 64 == 0) {
            uint64_t jump = kvt__splitmix64(&rng) % (1ull << (kvt__splitmix64(&rng) % 34));
            atomic_store(&clock, m.clock + jump);
            m.clock += jump;
        }
        uint32_t r = (uint32_t)(kvt__splitmix64(&rng) % 100);
        uint32_t s = (uint32_t)(kvt__splitmix64(&rng) % NSEQ);
        if (r < 25 && nstores < MAX_STORES) { /* start a store */
            kvt_index_stop stop;
            uint32_t k = kvt__index_probe(idx, seq[s], SEQ_BLOCKS, ids, &stop);
            if (stop != KVT_STOP_ABSENT) continue;
            uint32_t want = 1 + (uint32_t)(kvt__splitmix64(&rng) % (SEQ_BLOCKS - k));
            store_op *st = &stores[nstores];
            st->n = 0;
            for (uint32_t j = k; j < k + want; j++) {
                uint32_t parent = j == 0 ? KVT_INDEX_NONE : (j == k ? ids[k - 1] : st->ids[st->n - 1]);
                uint32_t id;
                kvt_status rc = kvt__index_insert(idx, parent, seq[s][j], payload_next, &id);
                if (m.count == m.cap) {
                    assert_int_equal(rc, KVT_EFULL);
                    break;
                }
                assert_int_equal(rc, KVT_OK);
                int rp = parent == KVT_INDEX_NONE ? -1 : ref_by_id(&m, parent);
                assert_true(parent == KVT_INDEX_NONE || rp >= 0);
                ref_insert(&m, rp, seq[s][j], payload_next++, id);
                st->ids[st->n++] = id;
            }
            if (st->n > 0) nstores++;
        } else if (r < 40 && nstores > 0) { /* finish a store */
            uint32_t i = (uint32_t)(kvt__splitmix64(&rng) % nstores);
            store_op *st = &stores[i];
            if (kvt__splitmix64(&rng) % 4 == 0) {
                kvt__index_abort(idx, st->ids, st->n);
                for (uint32_t j = st->n; j-- > 0;) ref_remove(&m, ref_by_id(&m, st->ids[j]));
            } else {
                kvt__index_commit(idx, st->ids, st->n);
                for (uint32_t j = 0; j < st->n; j++) {
                    ref_entry *e = &m.e[ref_by_id(&m, st->ids[j])];
                    assert_int_equal(e->state, R_PENDING);
                    e->state = R_READY;
                    e->pins--;
                }
            }
            stores[i] = stores[--nstores];
        } else if (r < 65) { /* match (a load lookup) */
            bool touch = kvt__splitmix64(&rng) % 4 != 0;
            uint32_t want = ref_match(&m, seq[s], SEQ_BLOCKS, touch);
            assert_int_equal(kvt__index_match(idx, seq[s], SEQ_BLOCKS, ids, touch), want);
            if (want > 0 && npins < MAX_PINSETS && kvt__splitmix64(&rng) % 3 == 0) {
                store_op *p = &pinsets[npins++];
                p->n = want;
                memcpy(p->ids, ids, want * sizeof ids[0]);
                kvt__index_pin(idx, ids, want);
                for (uint32_t j = 0; j < want; j++) m.e[ref_by_id(&m, ids[j])].pins++;
            }
        } else if (r < 75 && npins > 0) { /* a load finishes */
            uint32_t i = (uint32_t)(kvt__splitmix64(&rng) % npins);
            kvt__index_unpin(idx, pinsets[i].ids, pinsets[i].n);
            for (uint32_t j = 0; j < pinsets[i].n; j++) m.e[ref_by_id(&m, pinsets[i].ids[j])].pins--;
            pinsets[i] = pinsets[--npins];
        } else { /* evict */
            uint32_t want = 1 + (uint32_t)(kvt__splitmix64(&rng) % 16);
            uint32_t got = kvt__index_evict(idx, want, pl);
            for (uint32_t j = 0; j < got; j++) {
                int v = ref_victim(&m);
                assert_true(v >= 0);
                /* the model's victim is a READY, unpinned leaf by construction */
                assert_int_equal(m.e[v].payload, pl[j]);
                ref_remove(&m, v);
            }
            if (got < want) assert_int_equal(ref_victim(&m), -1);
        }
        compare_all(idx, &m, seq);
        assert_true(kvt__index_check(idx));
        if (clock0) assert_true(atomic_load(&clock) == m.clock);
    }
    /* Drain: finish everything, then evict to empty. */
    for (uint32_t i = 0; i < nstores; i++) kvt__index_abort(idx, stores[i].ids, stores[i].n);
    for (uint32_t i = 0; i < npins; i++) kvt__index_unpin(idx, pinsets[i].ids, pinsets[i].n);
    uint32_t total = 0, got;
    while ((got = kvt__index_evict(idx, 16, pl)) > 0) total += got;
    assert_int_equal(kvt__index_count(idx), 0);
    assert_true(kvt__index_check(idx));
    (void)total;
    free(m.e);
    kvt__index_destroy(idx);
}

static void run_random(uint64_t seed, kvt_evict_policy policy, uint32_t cap, uint32_t ops)
{
    run_random_clock(seed, policy, cap, ops, 0);
}

static void test_index_random_lru(void **state)
{
    (void)state;
    const uint64_t seeds[] = {1, 2, 3, 0xdeadbeef};
    for (size_t i = 0; i < sizeof seeds / sizeof seeds[0]; i++) {
        run_random(seeds[i], KVT_EVICT_LRU, 40, 4000);
        run_random(seeds[i] + 100, KVT_EVICT_LRU, 200, 2000); /* rarely full */
    }
}

static void test_index_random_lfu(void **state)
{
    (void)state;
    const uint64_t seeds[] = {11, 12, 13, 0xfeedface};
    for (size_t i = 0; i < sizeof seeds / sizeof seeds[0]; i++) {
        run_random(seeds[i], KVT_EVICT_LFU, 40, 4000);
        run_random(seeds[i] + 100, KVT_EVICT_LFU, 17, 3000); /* decays often */
    }
}

/* The model with the tick bound in play: a clock from just below 2^32
 * that jumps, for both policies. */
static void test_index_random_tick_bound(void **state)
{
    (void)state;
    const uint64_t seeds[] = {21, 22, 23};
    for (size_t i = 0; i < sizeof seeds / sizeof seeds[0]; i++) {
        run_random_clock(seeds[i], KVT_EVICT_LRU, 40, 3000, (1ull << 32) - 500);
        run_random_clock(seeds[i] + 100, KVT_EVICT_LFU, 40, 3000, (1ull << 32) - 500);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chain_hash_values),
        cmocka_unit_test(test_hash_prefix_property),
        cmocka_unit_test(test_hash_namespaces),
        cmocka_unit_test(test_hash_partial_and_max_out),
        cmocka_unit_test(test_index_create_args),
        cmocka_unit_test(test_index_pending_commit_abort),
        cmocka_unit_test(test_index_pins),
        cmocka_unit_test(test_index_accessors_and_evict_ids),
        cmocka_unit_test(test_index_full_and_leaves_only),
        cmocka_unit_test(test_index_lru_order),
        cmocka_unit_test(test_index_lfu_keeps_frequent),
        cmocka_unit_test(test_index_lfu_decay),
        cmocka_unit_test(test_index_slot_reuse),
        cmocka_unit_test(test_index_memory_budget),
        cmocka_unit_test(test_index_tick_wrap),
        cmocka_unit_test(test_index_tick_clamp),
        cmocka_unit_test(test_index_pin_limit),
        cmocka_unit_test(test_index_tag_collision),
        cmocka_unit_test(test_index_random_lru),
        cmocka_unit_test(test_index_random_lfu),
        cmocka_unit_test(test_index_random_tick_bound),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
