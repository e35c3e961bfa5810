/* test_pool.c - the CPU tier block pool. */
#include "support.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include "store/pool.h"

static void test_capacity_math(void **state)
{
    (void)state;
    kvt_pool *p = NULL;
    /* floor(capacity / block_bytes), with an odd block size. */
    assert_ok(kvt__pool_create(&p, 10 * 5000 + 4999, 5000, false));
    assert_int_equal(kvt__pool_blocks_total(p), 10);
    assert_int_equal(kvt__pool_blocks_free(p), 10);
    assert_int_equal(kvt__pool_block_bytes(p), 5000);
    kvt__pool_destroy(p);

    /* Exactly one block. */
    assert_ok(kvt__pool_create(&p, 4096, 4096, false));
    assert_int_equal(kvt__pool_blocks_total(p), 1);
    kvt__pool_destroy(p);

    /* A realistic one: 64 blocks of 2 MiB, with huge pages if there are any. */
    assert_ok(kvt__pool_create(&p, 128ull << 20, 2ull << 20, true));
    assert_int_equal(kvt__pool_blocks_total(p), 64);
    const char *kind = kvt__pool_page_kind(p);
    assert_true(strcmp(kind, "hugetlb") == 0 || strcmp(kind, "thp") == 0 ||
                strcmp(kind, "4k") == 0);
    kvt__pool_destroy(p);

    assert_ok(kvt__pool_create(&p, 1 << 20, 4096, false));
    assert_string_equal(kvt__pool_page_kind(p), "4k");
    kvt__pool_destroy(p);
}

static void test_alloc_until_exhausted(void **state)
{
    (void)state;
    kvt_pool *p = NULL;
    assert_ok(kvt__pool_create(&p, 33 * 1000, 1000, false));
    uint32_t n = kvt__pool_blocks_total(p);
    assert_int_equal(n, 33);
    uint8_t *seen = calloc(n, 1);
    assert_non_null(seen);
    for (uint32_t i = 0; i < n; i++) {
        uint32_t s = kvt__pool_alloc(p);
        assert_true(s < n);
        assert_int_equal(seen[s], 0);
        seen[s] = 1;
        assert_int_equal(kvt__pool_blocks_free(p), n - 1 - i);
    }
    assert_int_equal(kvt__pool_alloc(p), KVT_POOL_NONE);
    assert_int_equal(kvt__pool_alloc(p), KVT_POOL_NONE);
    assert_int_equal(kvt__pool_blocks_free(p), 0);
    for (uint32_t i = 0; i < n; i++) kvt__pool_free(p, i);
    assert_int_equal(kvt__pool_blocks_free(p), n);
    free(seen);
    kvt__pool_destroy(p);
}

static void test_free_and_reuse(void **state)
{
    (void)state;
    kvt_pool *p = NULL;
    assert_ok(kvt__pool_create(&p, 4 * 8192, 8192, false));
    uint32_t a = kvt__pool_alloc(p), b = kvt__pool_alloc(p);
    assert_int_not_equal(a, b);
    kvt__pool_free(p, a);
    /* LIFO: the block just freed (still warm in cache) comes back first. */
    assert_int_equal(kvt__pool_alloc(p), a);
    kvt__pool_free(p, b);
    kvt__pool_free(p, a);
    assert_int_equal(kvt__pool_blocks_free(p), 4);
    /* Drain and refill repeatedly: the count never drifts. */
    for (int round = 0; round < 100; round++) {
        uint32_t s[4];
        for (int i = 0; i < 4; i++) s[i] = kvt__pool_alloc(p);
        assert_int_equal(kvt__pool_alloc(p), KVT_POOL_NONE);
        for (int i = 3; i >= 0; i--) kvt__pool_free(p, s[i]);
    }
    assert_int_equal(kvt__pool_blocks_free(p), 4);
    kvt__pool_destroy(p);
}

static void test_alignment_and_disjoint(void **state)
{
    (void)state;
    static const uint64_t sizes[] = {1, 63, 64, 100, 4095, 4096, 4097, 12345, 1 << 20};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        uint64_t bb = sizes[k];
        kvt_pool *p = NULL;
        assert_ok(kvt__pool_create(&p, bb * 8, bb, k % 2 == 0));
        uint32_t n = kvt__pool_blocks_total(p);
        assert_int_equal(n, 8);
        for (uint32_t i = 0; i < n; i++) {
            uint8_t *blk = kvt__pool_block(p, i);
            /* Page aligned for O_DIRECT (so 64-byte aligned too). */
            assert_int_equal((uintptr_t)blk % 4096, 0);
            if (i > 0) assert_true(blk >= kvt__pool_block(p, i - 1) + bb);
            memset(blk, (int)(i + 1), bb); /* writable end to end */
        }
        for (uint32_t i = 0; i < n; i++) {
            uint8_t *blk = kvt__pool_block(p, i);
            assert_int_equal(blk[0], (uint8_t)(i + 1));
            assert_int_equal(blk[bb - 1], (uint8_t)(i + 1));
        }
        kvt__pool_destroy(p);
    }
}

/* What shmem_enabled allows: THP for the shared tier unless never/deny. */
static bool shmem_thp_on(void)
{
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/shmem_enabled", "r");
    char buf[128] = {0};
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f) fclose(f);
    return n > 0 && !strstr(buf, "[never]") && !strstr(buf, "[deny]");
}

/* The shared tier: huge pages where the system has them (hugetlb, else
 * shmem THP when shmem_enabled allows), else 4 KiB; a second mapping of its
 * memfd (a client's) is 2 MiB aligned and sees the same bytes. */
static void test_shared_pages_and_mapping(void **state)
{
    (void)state;
    kvt_pool *p = NULL;
    assert_ok(kvt__pool_create_shared(&p, 16ull << 20, 1ull << 20, true));
    const char *kind = kvt__pool_page_kind(p);
    if (strcmp(kind, "hugetlb") != 0) assert_string_equal(kind, shmem_thp_on() ? "thp" : "4k");
    assert_true((uintptr_t)kvt__pool_base(p) % (2u << 20) == 0);
    uint8_t *b = kvt__pool_block(p, 3);
    memset(b, 0x5c, 1u << 20);
    size_t len = (size_t)kvt__pool_map_bytes(p);
    uint8_t *m = kvt__pool_map_shared(kvt__pool_fd(p), len, true);
    assert_true(m != MAP_FAILED);
    assert_true((uintptr_t)m % (2u << 20) == 0);
    uint8_t *mb = m + (b - kvt__pool_base(p));
    assert_int_equal(mb[0], 0x5c);
    assert_int_equal(mb[(1u << 20) - 1], 0x5c);
    mb[17] = 0x11; /* and writes go both ways */
    assert_int_equal(b[17], 0x11);
    munmap(m, len);
    kvt__pool_destroy(p);

    assert_ok(kvt__pool_create_shared(&p, 1 << 20, 4096, false));
    assert_string_equal(kvt__pool_page_kind(p), "4k");
    kvt__pool_destroy(p);
}

/* Bytes of memory behind a memfd (what its pages use now). */
static uint64_t backed_bytes(int fd)
{
    struct stat st;
    assert_int_equal(fstat(fd, &st), 0);
    return (uint64_t)st.st_blocks * 512;
}

/* Two budgeted pools on one budget (the node server's geometries on one
 * cpu_capacity): each may grow to the whole budget, together never past
 * it; nothing is backed before a slot is allocated and written; released
 * slots give their memory back to the system (the memfd shrinks) and their
 * bytes to the budget, which the other pool can then use. */
static void test_budget_shared_by_two_pools(void **state)
{
    (void)state;
    kvt_pool_budget budget = {.limit = 16 * 8192};
    kvt_pool *a = NULL, *b = NULL;
    assert_ok(kvt__pool_create_budgeted(&a, 16 * 8192, 8192, false, &budget));
    assert_ok(kvt__pool_create_budgeted(&b, 16 * 16384, 16384, false, &budget));
    assert_true(kvt__pool_budgeted(a));
    assert_int_equal(kvt__pool_blocks_total(a), 16);
    assert_int_equal(kvt__pool_blocks_backed(a), 0);
    assert_int_equal(backed_bytes(kvt__pool_fd(a)), 0); /* no prefault */
    assert_int_equal(kvt__pool_blocks_free(a), 16);
    assert_int_equal(kvt__pool_blocks_free(b), 8); /* what the budget could back now */
    uint32_t s[16];
    for (int i = 0; i < 16; i++) {
        s[i] = kvt__pool_alloc(a);
        assert_int_not_equal(s[i], KVT_POOL_NONE);
        memset(kvt__pool_block(a, s[i]), i + 1, 8192);
    }
    assert_int_equal(atomic_load(&budget.used), 16 * 8192);
    assert_int_equal(kvt__pool_alloc(b), KVT_POOL_NONE); /* the budget is spent */
    assert_int_equal(kvt__pool_blocks_free(b), 0);
    assert_true(backed_bytes(kvt__pool_fd(a)) >= 16 * 8192);
    /* A freed slot stays backed (reused at no cost) until released. */
    for (int i = 0; i < 4; i++) kvt__pool_free(a, s[i]);
    assert_int_equal(kvt__pool_blocks_free_backed(a), 4);
    assert_int_equal(kvt__pool_alloc(b), KVT_POOL_NONE);
    assert_int_equal(kvt__pool_release(a, 100), 4);
    assert_int_equal(kvt__pool_blocks_backed(a), 12);
    assert_int_equal(atomic_load(&budget.used), 12 * 8192);
    assert_true(backed_bytes(kvt__pool_fd(a)) <= 12 * 8192 + 4096);
    uint32_t x = kvt__pool_alloc(b), y = kvt__pool_alloc(b);
    assert_int_not_equal(x, KVT_POOL_NONE);
    assert_int_not_equal(y, KVT_POOL_NONE);
    assert_int_equal(kvt__pool_alloc(b), KVT_POOL_NONE);
    assert_int_equal(kvt__pool_alloc(a), KVT_POOL_NONE);
    /* The bytes of the slots a kept are untouched by the holes. */
    for (int i = 4; i < 16; i++) {
        uint8_t *blk = kvt__pool_block(a, s[i]);
        assert_int_equal(blk[0], i + 1);
        assert_int_equal(blk[8191], i + 1);
    }
    /* A released slot reads as zeros when backed again. */
    kvt__pool_free(b, y);
    kvt__pool_free(b, x);
    assert_int_equal(kvt__pool_release(b, 2), 2);
    uint32_t again = kvt__pool_alloc(a);
    assert_int_not_equal(again, KVT_POOL_NONE);
    assert_int_equal(kvt__pool_block(a, again)[100], 0);
    /* Destroying a pool gives its bytes back. */
    kvt__pool_destroy(a);
    assert_int_equal(atomic_load(&budget.used), 0);
    kvt__pool_destroy(b);
    /* A pool without a budget releases nothing. */
    kvt_pool *p = NULL;
    assert_ok(kvt__pool_create_shared(&p, 4 * 8192, 8192, false));
    kvt__pool_free(p, kvt__pool_alloc(p));
    assert_int_equal(kvt__pool_release(p, 4), 0);
    assert_false(kvt__pool_budgeted(p));
    kvt__pool_destroy(p);
}

/* kvt__pool_populate backs exactly the ranges it is given (a run of
 * adjacent blocks in one call, a block apart from them in another), in
 * this process's mapping and in the memfd, and leaves the bytes of a
 * block that was already written as they were. */
static void test_populate_backs_the_ranges(void **state)
{
    (void)state;
    kvt_pool_budget budget = {.limit = 8 * 16384};
    kvt_pool *p = NULL;
    assert_ok(kvt__pool_create_budgeted(&p, 8 * 16384, 16384, false, &budget));
    uint8_t *base = kvt__pool_base(p);
    uint32_t s[4];
    for (int i = 0; i < 4; i++) s[i] = kvt__pool_alloc(p);
    assert_int_equal(backed_bytes(kvt__pool_fd(p)), 0);
    memset(kvt__pool_block(p, s[2]), 0x77, 16384);
    assert_ptr_equal(kvt__pool_block(p, s[1]), kvt__pool_block(p, s[0]) + 16384); /* adjacent */
    /* s0 and s1: one run; s3: apart (s2 between them is left out) */
    uint64_t off[3] = {(uint64_t)(kvt__pool_block(p, s[0]) - base),
                       (uint64_t)(kvt__pool_block(p, s[1]) - base),
                       (uint64_t)(kvt__pool_block(p, s[3]) - base)};
    kvt__pool_populate(p, off, 3);
    unsigned char vec[4];
    for (int i = 0; i < 4; i++) {
        assert_int_equal(mincore(kvt__pool_block(p, s[i]), 16384, vec), 0);
        for (int k = 0; k < 4; k++) assert_true(vec[k] & 1);
    }
    assert_true(backed_bytes(kvt__pool_fd(p)) >= 4 * 16384);
    assert_true(backed_bytes(kvt__pool_fd(p)) < 5 * 16384); /* nothing beyond them */
    assert_int_equal(kvt__pool_block(p, s[2])[16383], 0x77);
    assert_int_equal(kvt__pool_block(p, s[0])[0], 0);
    kvt__pool_populate(p, off, 0); /* nothing to do */
    kvt__pool_destroy(p);
}

static bool slot_backed(kvt_pool *p, uint32_t slot)
{
    unsigned char vec[4];
    assert_int_equal(mincore(kvt__pool_block(p, slot), 16384, vec), 0);
    return (vec[0] & vec[3] & 1) != 0;
}

/* A slot populated once is skipped after (its page tables need no second
 * walk: 2-3 ms per 64 MiB of pulls), until kvt__pool_release punches it:
 * then it is cold again and the next populate backs it. Seen through a
 * hole punched behind the pool's back (a skipped slot stays a hole) and
 * through the real release (before the release forgot the slot was
 * mapped, the next populate skipped it and the slot stayed a hole). */
static void test_populate_skips_mapped_slots_until_punched(void **state)
{
    (void)state;
    kvt_pool_budget budget = {.limit = 8 * 16384};
    kvt_pool *p = NULL;
    assert_ok(kvt__pool_create_budgeted(&p, 8 * 16384, 16384, false, &budget));
    uint8_t *base = kvt__pool_base(p);
    uint32_t a = kvt__pool_alloc(p), b = kvt__pool_alloc(p);
    uint64_t off[2] = {(uint64_t)(kvt__pool_block(p, a) - base),
                       (uint64_t)(kvt__pool_block(p, b) - base)};
    kvt__pool_populate(p, off, 2);
    assert_true(slot_backed(p, a) && slot_backed(p, b));
    /* a punched by someone else: populate believes it mapped and skips it */
    assert_int_equal(fallocate(kvt__pool_fd(p), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                               (off_t)off[0], 16384), 0);
    assert_false(slot_backed(p, a));
    kvt__pool_populate(p, off, 2);
    assert_false(slot_backed(p, a));
    assert_true(slot_backed(p, b));
    /* b through the pool: freed, released (punched), allocated again cold */
    kvt__pool_free(p, b);
    assert_int_equal(kvt__pool_release(p, 1), 1);
    assert_false(slot_backed(p, b));
    assert_int_equal(kvt__pool_alloc(p), b);
    kvt__pool_populate(p, &off[1], 1);
    assert_true(slot_backed(p, b));
    kvt__pool_destroy(p);
}

static void test_bad_args(void **state)
{
    (void)state;
    kvt_pool *p = (kvt_pool *)0x1;
    assert_status(kvt__pool_create(NULL, 4096, 4096, false), KVT_EINVAL);
    assert_non_null(strstr(kvt_last_error(), "kvt__pool_create"));
    assert_status(kvt__pool_create(&p, 4096, 0, false), KVT_EINVAL);
    assert_non_null(strstr(kvt_last_error(), "block_bytes is 0"));
    assert_status(kvt__pool_create(&p, 4095, 4096, false), KVT_EINVAL);
    assert_non_null(strstr(kvt_last_error(), "4095"));
    assert_status(kvt__pool_create(&p, 0, 64, false), KVT_EINVAL);
    assert_ptr_equal(p, (kvt_pool *)0x1); /* out untouched on failure */
    kvt__pool_destroy(NULL);              /* no-op */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_capacity_math),
        cmocka_unit_test(test_alloc_until_exhausted),
        cmocka_unit_test(test_free_and_reuse),
        cmocka_unit_test(test_alignment_and_disjoint),
        cmocka_unit_test(test_shared_pages_and_mapping),
        cmocka_unit_test(test_budget_shared_by_two_pools),
        cmocka_unit_test(test_populate_backs_the_ranges),
        cmocka_unit_test(test_populate_skips_mapped_slots_until_punched),
        cmocka_unit_test(test_bad_args),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
