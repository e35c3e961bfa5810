/* test_util_helpers.c - the shared small helpers of src/util: the
 * little-endian codec every wire and disk format uses (util/le.h) and the
 * growable array (util/vec.h). */
#include "support.h"

#include <stdlib.h>
#include <string.h>
#include "util/le.h"

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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_le_layout),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
