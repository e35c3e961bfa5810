/* test_util_helpers.c - the shared small helpers of src/util: the
 * little-endian codec every wire and disk format uses (util/le.h) and the
 * growable array (util/vec.h). */
#include "support.h"

#include <stdlib.h>
#include <string.h>
#include "util/le.h"
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_le_layout),
        cmocka_unit_test(test_grow),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
