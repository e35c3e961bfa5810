/* test_cluster_pull_cost.c - the pull-or-recompute cost model
 * (src/cluster/pull_cost.c): a fixed cost and a per-byte cost told apart
 * when pulls differ in size, one mean time per byte when they do not. */
#include "support.h"

#include "cluster/pull_cost.h"

#define MIB (1024.0 * 1024.0)

/* Pulls of 1 MiB and 64 MiB over a link of 1 GiB/s (~0.98 ns a byte)
 * with 5 ms of fixed cost each: a 4-block (8 MiB) pull is expected to
 * take about 5 + 7.8 ms (regression: one bandwidth over whole pulls put
 * it at 8 MiB / (the mean bytes / the mean time), charging the fixed cost
 * per byte: ~ 10.6 ms from these pulls, and far more after small ones). */
static void fixed_and_per_byte_told_apart(void **state)
{
    (void)state;
    kvt_pull_cost c = {0};
    assert_int_equal(kvt__pull_cost_ns(&c, 1 << 20), 0); /* nothing measured yet */
    assert_int_equal(kvt__pull_cost_bps(&c), 0);
    const double per_byte = 1e9 / (1024.0 * MIB), fixed = 5e6;
    for (int i = 0; i < 12; i++) {
        uint64_t b = (uint64_t)((i % 2 ? 64 : 1) * MIB);
        kvt__pull_cost_add(&c, b, (uint64_t)(fixed + per_byte * (double)b));
    }
    double want = fixed + per_byte * 8 * MIB, got = (double)kvt__pull_cost_ns(&c, 8u << 20);
    print_message("8 MiB: expected %.2f ms, model %.2f ms\n", want / 1e6, got / 1e6);
    assert_true(got > want * 0.98 && got < want * 1.02);
    double bps = (double)kvt__pull_cost_bps(&c);
    assert_true(bps > 1024.0 * MIB * 0.98 && bps < 1024.0 * MIB * 1.02); /* net of the fixed cost */
    /* small pulls only (latency-bound): no fit; the mean time per byte */
    kvt_pull_cost s = {0};
    for (int i = 0; i < 8; i++) kvt__pull_cost_add(&s, 1 << 20, (uint64_t)(fixed + per_byte * MIB));
    got = (double)kvt__pull_cost_ns(&s, 2u << 20);
    want = 2 * (fixed + per_byte * MIB);
    assert_true(got > want * 0.99 && got < want * 1.01);
}

/* The fit forgets: after the link got 4x slower, the model follows
 * within two dozen pulls; and a fit that says a negative fixed cost is
 * not used. */
static void follows_the_link_and_refuses_nonsense(void **state)
{
    (void)state;
    kvt_pull_cost c = {0};
    for (int i = 0; i < 12; i++) {
        uint64_t b = (uint64_t)((i % 2 ? 32 : 2) * MIB);
        kvt__pull_cost_add(&c, b, (uint64_t)(1e6 + (double)b));
    }
    for (int i = 0; i < 24; i++) {
        uint64_t b = (uint64_t)((i % 2 ? 32 : 2) * MIB);
        kvt__pull_cost_add(&c, b, (uint64_t)(1e6 + 4.0 * (double)b));
    }
    double got = (double)kvt__pull_cost_ns(&c, 16u << 20), want = 1e6 + 4.0 * 16 * MIB;
    assert_true(got > want * 0.95 && got < want * 1.05);
    /* big pulls slower per byte than small ones (say the big ones spill
     * out of a cache): the line through them would start below zero, so
     * the mean time per byte is used */
    kvt_pull_cost n = {0};
    kvt__pull_cost_add(&n, 1 << 20, 1000000);
    kvt__pull_cost_add(&n, 64u << 20, 200000000);
    got = (double)kvt__pull_cost_ns(&n, 1 << 20);
    /* the weights: the newer pull 1, the older 3/4 */
    double mean_per_byte = (0.75 * 1000000.0 + 200000000.0) / (0.75 * (1 << 20) + (64u << 20));
    assert_true(got > mean_per_byte * (1 << 20) * 0.99 && got < mean_per_byte * (1 << 20) * 1.01);
    /* latency-bound pulls of any size take the same 5 ms: the fitted
     * per-byte cost (about 0) would call a 1 GiB pull 5 ms; not used */
    kvt_pull_cost z = {0};
    kvt__pull_cost_add(&z, 1 << 20, 5000000);
    kvt__pull_cost_add(&z, 64u << 20, 5000100);
    mean_per_byte = (0.75 * 5000000.0 + 5000100.0) / (0.75 * (1 << 20) + (64u << 20));
    got = (double)kvt__pull_cost_ns(&z, 1u << 30);
    assert_true(got > mean_per_byte * (1u << 30) * 0.99 && got < mean_per_byte * (1u << 30) * 1.01);
    assert_true(kvt__pull_cost_bps(&z) < UINT64_MAX);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(fixed_and_per_byte_told_apart),
        cmocka_unit_test(follows_the_link_and_refuses_nonsense),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
