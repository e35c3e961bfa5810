/* test_util_helpers.c - the shared small helpers of src/util: the
 * little-endian codec every wire and disk format uses (util/le.h), the
 * growable array (util/vec.h), the copy that hashes as it goes
 * (util/hash.h, kvt_hash_copy) and the loopback test every listener's
 * "needs a secret" check shares (util/parse.h). */
#include "support.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>
#include "util/hash.h"
#include "util/le.h"
#include "util/parse.h"
#include "util/vec.h"

static void test_le_layout(void **state)
{
    uint8_t b[1 + 8 + 4 + 2];
    memset(b, 0xee, sizeof b);
    /* at odd offsets: no alignment is assumed */
    kvt__put64(b + 1, 0x0807060504030201ull);
    kvt__put32(b + 9, 0x0c0b0a09u);
    kvt__put16(b + 13, 0x0e0du);
    static const uint8_t want[] = {0xee, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14};
    assert_memory_equal(b, want, sizeof want);
    assert_true(kvt__get64(b + 1) == 0x0807060504030201ull);
    assert_int_equal(kvt__get32(b + 9), 0x0c0b0a09u);
    assert_int_equal(kvt__get16(b + 13), 0x0e0du);
    /* the top bit of every width survives a round trip */
    kvt__put64(b, 0xffffffffffffffffull);
    assert_true(kvt__get64(b) == 0xffffffffffffffffull);
    kvt__put32(b, 0x80000001u);
    assert_int_equal(kvt__get32(b), 0x80000001u);
    kvt__put16(b, 0x8001u);
    assert_int_equal(kvt__get16(b), 0x8001u);
}

static void test_grow(void **state)
{
    uint64_t *v = NULL;
    size_t cap = 0;
    assert_ok(kvt__grow((void **)&v, &cap, 1, sizeof *v, "test"));
    assert_int_equal(cap, 16); /* a first capacity, not one element */
    for (size_t i = 0; i < 16; i++) v[i] = i;
    assert_ok(kvt__grow((void **)&v, &cap, 16, sizeof *v, "test")); /* enough already */
    assert_int_equal(cap, 16);
    assert_ok(kvt__grow((void **)&v, &cap, 17, sizeof *v, "test"));
    assert_int_equal(cap, 32); /* doubles */
    assert_ok(kvt__grow((void **)&v, &cap, 1000, sizeof *v, "test"));
    assert_int_equal(cap, 1024);
    for (size_t i = 0; i < 16; i++) assert_true(v[i] == i); /* contents kept */
    /* a capacity whose bytes overflow: ENOMEM naming what, nothing changed */
    uint64_t *keep = v;
    assert_status(kvt__grow((void **)&v, &cap, SIZE_MAX / 4, sizeof *v, "the test's list"),
                  KVT_ENOMEM);
    assert_ptr_equal(v, keep);
    assert_int_equal(cap, 1024);
    assert_non_null(strstr(kvt_last_error(), "the test's list: out of memory"));
    free(v);

    uint32_t *w = NULL, wcap = 0;
    assert_ok(kvt__grow32((void **)&w, &wcap, 100, sizeof *w, "test"));
    assert_int_equal(wcap, 128);
    free(w);
}

/* How a case feeds the fused copy: one feed per chunk; kvt__hash_copy_feedv
 * over every chunk at once, or in calls of up to 3 chunks; or feedv with
 * each chunk's source taken from the mirrored place of the source buffer
 * (a strided source, as a page_first pool's tokens). */
enum { FEED_EACH, FEEDV_ALL, FEEDV_THREES, FEEDV_SCATTERED, FEED_MODES };
#define HC_MAX_CHUNKS 4096

/* Copies total bytes to dst in chunks of the given sizes (cycled), fed as
 * mode says, and checks the result against XXH3 over what the range must
 * hold, the copy against it, and the bytes around the range untouched. */
static void hash_copy_case(uint8_t *dst, const uint8_t *src, size_t total, uint64_t seed,
                           const size_t *feeds, size_t nfeeds, int mode)
{
    memset(dst - 64, 0xC3, total + 128);
    kvt_hash_copy h;
    if (!kvt__hash_copy_begin(&h, total, seed)) {
        /* no fused form: only for short ranges or a CPU without AVX2 */
        assert_true(total <= 240 || !kvt__hash_avx2());
        return;
    }
    static kvt_copy_chunk ch[HC_MAX_CHUNKS];
    uint8_t *want = malloc(total);
    assert_non_null(want);
    size_t pos = 0, n = 0;
    for (size_t k = 0; pos < total; k++) {
        size_t len = feeds[k % nfeeds];
        if (len > total - pos) len = total - pos;
        const uint8_t *from = mode == FEEDV_SCATTERED ? src + (total - pos - len) : src + pos;
        memcpy(want + pos, from, len);
        if (mode == FEED_EACH) {
            kvt__hash_copy_feed(&h, dst + pos, from, len);
        } else {
            assert_true(n < HC_MAX_CHUNKS);
            ch[n++] = (kvt_copy_chunk){dst + pos, from, len};
        }
        pos += len;
    }
    for (size_t i = 0; i < n; i += mode == FEEDV_THREES ? 3 : n)
        kvt__hash_copy_feedv(&h, ch + i, mode == FEEDV_THREES && n - i > 3 ? 3 : n - i);
    uint64_t got = kvt__hash_copy_end(&h);
    assert_memory_equal(dst, want, total);
    assert_true(got == XXH3_64bits_withSeed(want, total, seed));
    assert_true(got == kvt__hash64(dst, total, seed));
    for (size_t i = 1; i <= 64; i++) {
        assert_int_equal(dst[-(ptrdiff_t)i], 0xC3);
        assert_int_equal(dst[total + i - 1], 0xC3);
    }
    free(want);
}

static void test_hash_copy(void **state)
{
    (void)state;
    enum { MAX = 200003 };
    uint8_t *src = malloc(MAX + 64), *buf = aligned_alloc(64, (MAX + 256 + 63) / 64 * 64);
    assert_non_null(src);
    assert_non_null(buf);
    uint64_t rng = 42;
    for (size_t i = 0; i < MAX + 64; i++) src[i] = (uint8_t)kvt__splitmix64(&rng);
    /* around the short/long boundary, XXH3's 1 KiB blocks, a block part */
    static const size_t sizes[] = {200, 240, 241, 255, 256, 257, 1023, 1024, 1025,
                                   1088, 4096, 65536, 65536 + 7, MAX};
    /* whole stripes (page_first's 512-byte tokens, 2 KiB pages), stripes
     * split across chunks, a short chunk after long ones */
    static const size_t one[] = {SIZE_MAX}, tokens[] = {2048}, page_first[] = {512},
                        odd[] = {1, 63, 64, 65, 200, 7}, split[] = {32 << 10, 5},
                        mixed[] = {512, 512, 96, 32};
    static const struct { const size_t *f; size_t n; } feeds[] = {
        {one, 1}, {tokens, 1}, {page_first, 1}, {odd, 6}, {split, 2}, {mixed, 4}};
    static const uint64_t seeds[] = {0, 1, 31, 0x9e3779b97f4a7c15ull};
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++)
        for (size_t f = 0; f < sizeof feeds / sizeof *feeds; f++)
            for (size_t k = 0; k < sizeof seeds / sizeof *seeds; k++)
                for (int mode = 0; mode < FEED_MODES; mode++) {
                    /* streaming stores where 32-byte aligned, plain ones not */
                    size_t doff = 64 + (k % 2 ? 0 : 8), soff = k % 3;
                    hash_copy_case(buf + doff, src + soff, sizes[i], seeds[k], feeds[f].f,
                                   feeds[f].n, mode);
                }
    free(src);
    free(buf);
}

/* kvt__host_is_loopback: 127.0.0.0/8, ::1 however spelt, ::ffff:127.x.x.x
 * and "localhost" are this machine (the metrics endpoint's test, now the
 * one test); an address that merely contains 127, a name starting "127."
 * (resolved anywhere) or a longer name is not. */
static void test_host_is_loopback(void **state)
{
    (void)state;
    static const char *const yes[] = {"127.0.0.1", "127.1.2.3", "127.255.255.254", "localhost",
                                      "::1", "0:0:0:0:0:0:0:1", "::ffff:127.0.0.1"};
    static const char *const no[] = {"0.0.0.0", "10.0.0.1", "128.0.0.1", "1.127.0.0", "12.7.0.1",
                                     "localhost.example.com", "", "127", "127.example.com",
                                     "127.0.0.1.evil.example", "127.0.0.256", "::", "::2",
                                     "::ffff:10.0.0.1", "[::1]", "::1%lo"};
    for (size_t i = 0; i < sizeof yes / sizeof *yes; i++)
        if (!kvt__host_is_loopback(yes[i])) fail_msg("%s is loopback", yes[i]);
    for (size_t i = 0; i < sizeof no / sizeof *no; i++)
        if (kvt__host_is_loopback(no[i])) fail_msg("%s is not loopback", no[i]);
    assert_false(kvt__host_is_loopback(NULL));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_le_layout),
        cmocka_unit_test(test_grow),
        cmocka_unit_test(test_hash_copy),
        cmocka_unit_test(test_host_is_loopback),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
