/* test_quota.c - server_quotas rules (cache/quota.c) and the pool's
 * charging of slots to their owner (store/pool.c). */
#include "support.h"
#include <stdio.h>
#include <string.h>

#include "cache/quota.h"
#include "store/pool.h"

static uint8_t owner_of(const kvt_quota *q, const char *ns)
{
    return kvt__quota_owner(q, ns, (uint32_t)strlen(ns));
}

/* The longest matching prefix wins; "-" is the empty namespace only; "*"
 * takes what nothing else matches; no "*": unmatched namespaces have no
 * quota. A prefix may hold '=' (SGLang's namespaces do): the size is
 * after the last one. */
static void test_matching(void **state)
{
    (void)state;
    kvt_quota q;
    assert_ok(kvt__quota_parse("a=1M; ab=2M ;-=4K;*=8M; m|model=x=16M", "server_quotas", &q));
    assert_int_equal(q.n, 5);
    assert_int_equal(owner_of(&q, "a"), 1);
    assert_int_equal(owner_of(&q, "abc"), 2);
    assert_int_equal(owner_of(&q, "az"), 1);
    assert_int_equal(owner_of(&q, ""), 3);
    assert_int_equal(owner_of(&q, "zzz"), 4);
    assert_int_equal(owner_of(&q, "m|model=x|tp=0/2"), 5);
    assert_int_equal(q.pool.limit[5], 16u << 20);
    assert_string_equal(q.rule[4].prefix, "m|model=x");
    assert_ok(kvt__quota_parse("a=1M", "server_quotas", &q));
    assert_int_equal(owner_of(&q, "b"), 0);
    assert_int_equal(owner_of(&q, ""), 0);
    assert_int_equal(kvt__quota_owner(NULL, "a", 1), 0);
    assert_ok(kvt__quota_parse("", "server_quotas", &q));
    assert_int_equal(q.n, 0);
}

static void test_malformed(void **state)
{
    (void)state;
    static const struct {
        const char *text, *msg;
    } bad[] = {
        {"a", "rule \"a\" has no '='"},
        {"a=", "is not a size above 0"},
        {"a=0", "is not a size above 0"},
        {"a=lots", "\"lots\" is not a size"},
        {"=1M", "has no prefix"},
        {"a=1M;a=2M", "prefix \"a\" has two rules"},
    };
    kvt_quota q;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_status(kvt__quota_parse(bad[i].text, "server_quotas", &q), KVT_EINVAL);
        if (!strstr(kvt_last_error(), bad[i].msg) || !strstr(kvt_last_error(), "server_quotas"))
            fail_msg("\"%s\": %s", bad[i].text, kvt_last_error());
    }
    char many[1024] = "";
    for (int i = 0; i <= (int)KVT_POOL_MAX_OWNERS; i++)
        snprintf(many + strlen(many), sizeof many - strlen(many), "p%d=1M;", i);
    assert_status(kvt__quota_parse(many, "server_quotas", &q), KVT_EINVAL);
    assert_non_null(strstr(kvt_last_error(), "more than 32 rules"));
    /* The rule refused for being one too many is written nowhere: its
     * prefix once landed past the last rule, over the limits after it (a
     * long one over every limit), which ASan cannot see inside one struct. */
    char big[4096] = "";
    for (int i = 0; i < (int)KVT_POOL_MAX_OWNERS; i++)
        snprintf(big + strlen(big), sizeof big - strlen(big), "p%d=1M;", i);
    size_t at = strlen(big);
    memset(big + at, 'x', 200);
    snprintf(big + at + 200, sizeof big - at - 200, "=1M");
    assert_status(kvt__quota_parse(big, "server_quotas", &q), KVT_EINVAL);
    assert_non_null(strstr(kvt_last_error(), "more than 32 rules"));
    for (uint32_t i = 1; i <= KVT_POOL_MAX_OWNERS; i++)
        if (q.pool.limit[i] != 1u << 20)
            fail_msg("limit[%u] is %llu after the refused rule, not 1 MiB", i,
                     (unsigned long long)q.pool.limit[i]);
}

/* Slots charge their owner block_bytes while allocated; a new owner takes
 * the charge over; an owner at its limit gets no slot when enforced. */
static void test_pool_charges_owners(void **state)
{
    (void)state;
    kvt_pool *p = NULL;
    assert_ok(kvt__pool_create(&p, 16 * 4096, 4096, false));
    kvt_quota q;
    assert_ok(kvt__quota_parse("a=8K;b=1M", "server_quotas", &q));
    kvt__pool_set_quotas(p, &q.pool);
    uint32_t s1 = kvt__pool_alloc_for(p, 1, true), s2 = kvt__pool_alloc_for(p, 1, true);
    assert_int_not_equal(s1, KVT_POOL_NONE);
    assert_int_not_equal(s2, KVT_POOL_NONE);
    assert_int_equal(atomic_load(&q.pool.used[1]), 8192);
    assert_false(kvt__pool_quota_room(p, 1));
    assert_int_equal(kvt__pool_alloc_for(p, 1, true), KVT_POOL_NONE);
    assert_true(kvt__pool_quota_room(p, 0)); /* no owner: no quota */
    kvt__pool_set_owner(p, s2, 2);
    assert_int_equal(kvt__pool_owner(p, s2), 2);
    assert_int_equal(atomic_load(&q.pool.used[1]), 4096);
    assert_int_equal(atomic_load(&q.pool.used[2]), 4096);
    kvt__pool_free(p, s1);
    assert_int_equal(atomic_load(&q.pool.used[1]), 0);
    assert_true(kvt__pool_quota_room(p, 1));
    kvt__pool_destroy(p); /* s2 still held: its charge goes with the pool */
    assert_int_equal(atomic_load(&q.pool.used[2]), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matching),
        cmocka_unit_test(test_malformed),
        cmocka_unit_test(test_pool_charges_owners),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
