/* test_conc_pd_harden.c - the PD hand-off against peers that go away,
 * flood, or lie (issue 14, "PD hand-off"): a finished prefill rank may
 * exit, unclaimed rooms are bounded per decode identity and in all, and
 * the messages name who and what. 127.0.0.1 only; every wait bounded. */
#include <time.h>
#include "pd_harness.h"
#include "net/stream.h"
#include "pd/ep.h"
#include "util/clock.h"

static const pd_model mha = {.layers = 2, .heads = 4, .head_dim = 32};
static const pd_side_cfg c1 = {.tp = 1, .dcp = 1, .tpp = 16, .layout = KVT_LAYOUT_LAYER_FIRST, .model = &mha};
static const pd_side_cfg c2 = {.tp = 2, .dcp = 1, .tpp = 16, .layout = KVT_LAYOUT_LAYER_FIRST, .model = &mha};

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000};
    nanosleep(&ts, NULL);
}

/* Issue 14 item 1: TP2 -> TP1, prefill rank 1 sends its part (DONE
 * acknowledged: Success on its side) and exits while rank 0 has not sent
 * yet. The decode room must not fail for the rank that finished; once rank
 * 0 sends, it ends Success with every byte right (regression: it failed
 * "prefill tp1/2 dcp0/1 lost"). */
static void finished_prefill_may_exit(void **state)
{
    (void)state;
    pd_cluster cl = {0};
    pd_cluster_start(&cl, &c2, &c1, 40);
    pd_cluster_decoders(&cl);
    kvt_pd_room_params rp = {cl.dec[0].pages, cl.dec[0].num_pages, 40, 0};
    assert_ok(kvt_pd_receiver_room(cl.dec[0].r, 5, &rp));
    assert_ok(kvt_pd_sender_room(cl.pre[0].s, 5));
    assert_ok(kvt_pd_sender_room(cl.pre[1].s, 5));
    assert_ok(kvt_pd_sender_send(cl.pre[1].s, 5, cl.pre[1].pages, cl.pre[1].num_pages, 40));
    kvt_pd_poll st;
    assert_ok(kvt_pd_sender_wait(cl.pre[1].s, 5, 20000, &st));
    assert_int_equal(st, KVT_PD_SUCCESS);
    kvt_pd_sender_destroy(cl.pre[1].s);
    cl.pre[1].s = NULL;
    sleep_ms(500); /* the decode rank sees the hang-up (at once on loopback) */
    kvt_pd_room_info info;
    assert_ok(kvt_pd_room_info_get(NULL, cl.dec[0].r, 5, &info));
    if (info.state == KVT_PD_FAILED) fail_msg("decode room failed: %s", info.message);
    assert_ok(kvt_pd_sender_send(cl.pre[0].s, 5, cl.pre[0].pages, cl.pre[0].num_pages, 40));
    assert_ok(kvt_pd_receiver_wait(cl.dec[0].r, 5, 20000, &st));
    assert_ok(kvt_pd_room_info_get(NULL, cl.dec[0].r, 5, &info));
    if (st != KVT_PD_SUCCESS) fail_msg("decode room: state %d: %s", st, info.message);
    assert_int_equal(pd_verify(&cl, 0), 0);
    pd_cluster_stop(&cl);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(finished_prefill_may_exit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
