/* test_conc_pd_fail.c - PD failure paths: aborts with acknowledgements,
 * deadlines (WaitingForInput and Transferring), a dead peer, corruption,
 * cleared rooms never resurrected, strangers and bad frames refused while
 * the good peers keep working. 127.0.0.1 only; every wait bounded. */
#include <time.h>
#include "pd_harness.h"
#include "net/stream.h"
#include "pd/ep.h"
#include "util/clock.h"

static const pd_model mha = {.layers = 2, .heads = 4, .head_dim = 32};
static const pd_side_cfg c1 = {.tp = 1, .dcp = 1, .tpp = 16, .layout = KVT_LAYOUT_LAYER_FIRST, .model = &mha};

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000};
    nanosleep(&ts, NULL);
}

/* Polls are bounded by deadlines of 10 s, not counts: normally they end
 * within a few ms, but CI runs this under TSan on 2 loaded cores. */
#define POLL_MS 10000

static kvt_pd_room_info dec_info(pd_cluster *cl, uint64_t room)
{
    kvt_pd_room_info i;
    assert_ok(kvt_pd_room_info_get(NULL, cl->dec[0].r, room, &i));
    return i;
}

/* One prefill and one decode rank, with room `room` opened on both sides
 * and nothing sent yet. */
static void start_with_idle_room(pd_cluster *cl, uint64_t room)
{
    pd_cluster_start(cl, &c1, &c1, 40);
    pd_cluster_decoders(cl);
    kvt_pd_room_params rp = {cl->dec[0].pages, cl->dec[0].num_pages, 40, 0};
    assert_ok(kvt_pd_receiver_room(cl->dec[0].r, room, &rp));
    assert_ok(kvt_pd_sender_room(cl->pre[0].s, room));
}

static void abort_from_decode_acked(void **state)
{
    (void)state;
    pd_cluster cl = {0};
    start_with_idle_room(&cl, 5);
    assert_ok(kvt_pd_receiver_abort(cl.dec[0].r, 5, "client went away"));
    kvt_pd_poll st;
    assert_ok(kvt_pd_sender_wait(cl.pre[0].s, 5, 5000, &st));
    assert_int_equal(st, KVT_PD_FAILED);
    for (uint64_t dl = kvt__deadline_ns(POLL_MS); dec_info(&cl, 5).abort_acks == 0 && kvt__now_ns() < dl;)
        sleep_ms(10);
    assert_int_equal(dec_info(&cl, 5).abort_acks, 1);
    kvt_pd_room_info si;
    assert_ok(kvt_pd_room_info_get(cl.pre[0].s, NULL, 5, &si));
    assert_int_equal(si.error, KVT_EABORTED);
    assert_non_null(strstr(si.message, "client went away"));
    pd_cluster_stop(&cl);
}

/* Clearing a live room tells the peers at once (regression: the peer sat
 * in its state until its own deadline, the prefill side pinning pages). */
static void clear_live_room_fails_peer_promptly(void **state)
{
    (void)state;
    pd_cluster cl = {0};
    start_with_idle_room(&cl, 6);
    assert_ok(kvt_pd_receiver_clear(cl.dec[0].r, 6));
    kvt_pd_poll st;
    assert_ok(kvt_pd_sender_wait(cl.pre[0].s, 6, 3000, &st)); /* peers' deadlines are 30 s */
    assert_int_equal(st, KVT_PD_FAILED);
    pd_cluster_stop(&cl);
}

/* Decode ranks that reconnect many times (restarts) never exhaust the
 * sender's link table (regression: dead registered links were never
 * reaped, and the 257th decode rank was refused). */
static void decode_reconnects_are_reaped(void **state)
{
    (void)state;
    pd_cluster cl = {0};
    pd_cluster_start(&cl, &c1, &c1, 40);
    pd_cluster_decoders(&cl);
    for (int k = 0; k < 300; k++) {
        pd_rank_free(&cl.dec[0]);
        memset(&cl.dec[0], 0, sizeof cl.dec[0]);
        kvt_status st = pd_cluster_decoder(&cl, 0);
        if (st != KVT_OK) fail_msg("reconnect %d: %s: %s", k, kvt_status_name(st), kvt_last_error());
    }
    pd_open_room(&cl, 9, 0);
    pd_expect_room(&cl, 9, KVT_PD_SUCCESS);
    assert_int_equal(pd_verify(&cl, 0), 0);
    pd_cluster_stop(&cl);
}

static void abort_from_prefill_acked(void **state)
{
    (void)state;
    pd_cluster cl = {0};
    start_with_idle_room(&cl, 6);
    kvt_pd_poll st = KVT_PD_BOOTSTRAPPING;
    for (uint64_t dl = kvt__deadline_ns(POLL_MS); st != KVT_PD_WAITING_FOR_INPUT && kvt__now_ns() < dl; sleep_ms(5))
        assert_ok(kvt_pd_sender_poll(cl.pre[0].s, 6, &st));
    assert_int_equal(st, KVT_PD_WAITING_FOR_INPUT);
    assert_ok(kvt_pd_sender_abort(cl.pre[0].s, 6, NULL));
    assert_ok(kvt_pd_receiver_wait(cl.dec[0].r, 6, 5000, &st));
    assert_int_equal(st, KVT_PD_FAILED);
    assert_int_equal(dec_info(&cl, 6).error, KVT_EABORTED);
    kvt_pd_room_info si = {0};
    for (uint64_t dl = kvt__deadline_ns(POLL_MS); si.abort_acks == 0 && kvt__now_ns() < dl; sleep_ms(10))
        assert_ok(kvt_pd_room_info_get(cl.pre[0].s, NULL, 6, &si));
    assert_int_equal(si.abort_acks, 1);
    /* a failed room cannot be sent any more, and poll keeps saying Failed */
    assert_int_equal(kvt_pd_sender_send(cl.pre[0].s, 6, cl.pre[0].pages, cl.pre[0].num_pages, 40), KVT_ESTATE);
    pd_cluster_stop(&cl);
}

static void waiting_deadline(void **state)
{
    (void)state;
    /* peer_timeout_ms 30 s: only the 200 ms deadline can end the room
     * within the 10 s bound below */
    pd_cluster cl = {.base = {.waiting_timeout_ms = 200}, .net = {.peer_timeout_ms = 30000}};
    pd_cluster_start(&cl, &c1, &c1, 40);
    pd_cluster_decoders(&cl);
    kvt_pd_room_params rp = {cl.dec[0].pages, cl.dec[0].num_pages, 40, 0};
    assert_ok(kvt_pd_receiver_room(cl.dec[0].r, 9, &rp));
    assert_ok(kvt_pd_sender_room(cl.pre[0].s, 9)); /* ...and prefill never sends */
    uint64_t t0 = kvt__now_ns();
    kvt_pd_poll st;
    assert_ok(kvt_pd_sender_wait(cl.pre[0].s, 9, 10000, &st));
    assert_int_equal(st, KVT_PD_FAILED);
    assert_ok(kvt_pd_receiver_wait(cl.dec[0].r, 9, 10000, &st));
    assert_int_equal(st, KVT_PD_FAILED);
    /* by the 200 ms deadline, not a silence of 30 s nor a default deadline
     * (30 s); 10 s: wide, CI runs this under TSan on 2 loaded cores */
    assert_true(kvt__now_ns() - t0 < 10000000000ull);
    assert_int_equal(dec_info(&cl, 9).error, KVT_ETIMEDOUT);
    pd_cluster_stop(&cl);
}

static void cleared_room_not_resurrected(void **state)
{
    (void)state;
    pd_cluster cl = {0};
    pd_cluster_start(&cl, &c1, &c1, 40);
    pd_cluster_decoders(&cl);
    pd_open_room(&cl, 3, 0);
    pd_expect_room(&cl, 3, KVT_PD_SUCCESS);
    assert_ok(kvt_pd_receiver_clear(cl.dec[0].r, 3));
    assert_ok(kvt_pd_sender_abort(cl.pre[0].s, 3, "late")); /* a late Failed reaches the decode side */
    sleep_ms(100);
    kvt_pd_poll st;
    assert_int_equal(kvt_pd_receiver_poll(cl.dec[0].r, 3, &st), KVT_ENOTFOUND);
    assert_ok(kvt_pd_sender_clear(cl.pre[0].s, 3));
    pd_open_room(&cl, 3, 0); /* the room id is reused */
    pd_expect_room(&cl, 3, KVT_PD_SUCCESS);
    assert_int_equal(pd_verify(&cl, 0), 0);
    pd_cluster_stop(&cl);
}

static void corrupt_page_fails_room(void **state)
{
    (void)state;
    pd_cluster cl = {0};
    pd_cluster_start(&cl, &c1, &c1, 40);
    pd_sender_ep(cl.pre[0].s)->corrupt_batch = 1;
    pd_cluster_decoders(&cl);
    pd_open_room(&cl, 4, 0);
    pd_expect_room(&cl, 4, KVT_PD_FAILED);
    assert_int_equal(dec_info(&cl, 4).error, KVT_ECORRUPT);
    kvt_pd_room_info si;
    assert_ok(kvt_pd_room_info_get(cl.pre[0].s, NULL, 4, &si));
    assert_int_equal(si.error, KVT_ECORRUPT);
    pd_cluster_stop(&cl);
}

/* The room fails by the hang-up (KVT_ECONN), well before the silence of
 * peer_timeout_ms (20 s here) or the room's 30 s deadline could end it. The
 * bound includes the sender's destroy (joins, an unregister of up to 250
 * ms): 10 s, wide for TSan on 2 loaded cores. */
static void dead_prefill_fails_rooms_promptly(void **state)
{
    (void)state;
    pd_cluster cl = {.net = {.peer_timeout_ms = 20000}};
    pd_cluster_start(&cl, &c1, &c1, 40);
    pd_cluster_decoders(&cl);
    kvt_pd_room_params rp = {cl.dec[0].pages, cl.dec[0].num_pages, 40, 0};
    assert_ok(kvt_pd_receiver_room(cl.dec[0].r, 8, &rp));
    uint64_t t0 = kvt__now_ns();
    kvt_pd_sender_destroy(cl.pre[0].s);
    cl.pre[0].s = NULL;
    kvt_pd_poll st;
    assert_ok(kvt_pd_receiver_wait(cl.dec[0].r, 8, 15000, &st));
    assert_int_equal(st, KVT_PD_FAILED);
    assert_int_equal(dec_info(&cl, 8).error, KVT_ECONN);
    assert_true(kvt__now_ns() - t0 < 10000000000ull);
    pd_cluster_stop(&cl);
}

/* ---- raw peers against a sender's listener ---- */

static kvt_stream *raw_connect(uint16_t port, const char *secret)
{
    kvt_stream *s = NULL;
    kvt_stream_auth a = {(const uint8_t *)secret, secret ? strlen(secret) : 0, "test peer"};
    kvt_status st = kvt__stream_connect("127.0.0.1", port, &a, kvt__deadline_ns(2000), &s);
    return st == KVT_OK ? s : NULL;
}

static void raw_frame(kvt_stream *s, uint16_t type, uint32_t body_len, const void *body, size_t n)
{
    uint8_t hb[PD_HDR_LEN];
    pd_hdr h = {.type = type, .body_len = body_len};
    pd_hdr_encode(&h, hb);
    (void)kvt__stream_send(s, hb, sizeof hb, kvt__deadline_ns(1000));
    if (n) (void)kvt__stream_send(s, body, n, kvt__deadline_ns(1000));
}

static void sender_bad_peers(void **state)
{
    (void)state;
    /* peer_timeout_ms applies to the good decode rank too: 3 s, not 500 ms
     * (wide: CI runs this under TSan on 2 loaded cores) */
    pd_cluster cl = {.net = {.secret = "0123456789abcdef-secret", .secret_len = 23, .peer_timeout_ms = 3000}};
    pd_cluster_start(&cl, &c1, &c1, 40);
    uint16_t port;
    assert_ok(kvt_pd_sender_port(cl.pre[0].s, &port));
    assert_null(raw_connect(port, NULL));                       /* no secret */
    assert_null(raw_connect(port, "wrong-secret-of-16+bytes")); /* wrong secret */
    const char *sec = "0123456789abcdef-secret";
    kvt_stream *s = raw_connect(port, sec);
    assert_non_null(s);
    raw_frame(s, PD_F_REGISTER, 1u << 30, NULL, 0); /* oversized */
    assert_true(pd_peer_closed(s));
    kvt__stream_destroy(s);
    s = raw_connect(port, sec);
    raw_frame(s, PD_F_REGISTER, 100, "short", 5); /* truncated */
    assert_true(pd_peer_closed(s));
    kvt__stream_destroy(s);
    s = raw_connect(port, sec);
    uint8_t junk[PD_HDR_LEN];
    memset(junk, 0x5a, sizeof junk);
    (void)kvt__stream_send(s, junk, sizeof junk, kvt__deadline_ns(1000)); /* garbage */
    assert_true(pd_peer_closed(s));
    kvt__stream_destroy(s);
    /* the good peers still work */
    pd_cluster_decoders(&cl);
    pd_open_room(&cl, 12, 0);
    pd_expect_room(&cl, 12, KVT_PD_SUCCESS);
    assert_int_equal(pd_verify(&cl, 0), 0);
    pd_cluster_stop(&cl);
}

static void bootstrap_bad_peers(void **state)
{
    (void)state;
    pd_cluster cl = {0};
    pd_cluster_start(&cl, &c1, &c1, 40);
    kvt_stream *s = raw_connect(cl.port, NULL);
    assert_non_null(s);
    raw_frame(s, PD_F_LOOKUP, 1u << 31, NULL, 0);
    assert_true(pd_peer_closed(s));
    kvt__stream_destroy(s);
    s = raw_connect(cl.port, NULL);
    uint8_t junk[64] = {1, 0, 0, 0, 2};
    raw_frame(s, PD_F_LOOKUP, sizeof junk, junk, sizeof junk);
    assert_true(pd_peer_closed(s));
    kvt__stream_destroy(s);
    kvt_pd_bootstrap_stats bst;
    assert_ok(kvt_pd_bootstrap_stats_get(cl.bs, &bst));
    assert_true(bst.refused >= 2);
    pd_cluster_decoders(&cl);
    pd_open_room(&cl, 13, 0);
    pd_expect_room(&cl, 13, KVT_PD_SUCCESS);
    pd_cluster_stop(&cl);
}

/* A decode peer that registers, opens a big room and stops reading: the
 * sender's room leaves Transferring by its deadline, other peers unharmed. */
static void peer_stops_reading(void **state)
{
    (void)state;
    static const pd_model big = {.layers = 2, .heads = 8, .head_dim = 128};
    pd_side_cfg c = {.tp = 1, .dcp = 1, .tpp = 16, .layout = KVT_LAYOUT_LAYER_FIRST, .model = &big};
    /* peer_timeout_ms 30 s: the 10 s bound below (wide: TSan on 2 loaded
     * cores) still tells the 300 ms transfer deadline from the silence */
    pd_cluster cl = {.base = {.transfer_timeout_ms = 300}, .net = {.peer_timeout_ms = 30000}};
    pd_cluster_start(&cl, &c, &c, 8192); /* 64 MiB: far beyond the socket buffers */
    uint16_t port;
    assert_ok(kvt_pd_sender_port(cl.pre[0].s, &port));
    kvt_stream *s = raw_connect(port, NULL);
    pd_ep *ep = pd_sender_ep(cl.pre[0].s);
    pd_desc d;
    kvt_pd_rank rk = {.tp_size = 1, .dcp_size = 1};
    assert_ok(pd_desc_from_geometry(&d, cl.pre[0].geo, &rk, PD_ROLE_DECODE));
    size_t n = pd_desc_wire_size(&d) + 4; /* the descriptor and our max_frame */
    uint8_t *b = malloc(n);
    pd_desc_encode(&d, b);
    pd_put32(b + n - 4, 64u << 20);
    raw_frame(s, PD_F_REGISTER, (uint32_t)n, b, n);
    uint8_t ok[PD_HDR_LEN];
    assert_ok(kvt__stream_recv(s, ok, sizeof ok, kvt__deadline_ns(2000)));
    uint32_t np = 8192 / 16;
    size_t blen = 8 + 4 * (size_t)np;
    uint8_t *room = calloc(1, blen);
    pd_put32(room, 8192);
    pd_put32(room + 4, np);
    uint8_t hb[PD_HDR_LEN];
    pd_hdr h = {.type = PD_F_ROOM, .room = 77, .a0 = 1, .body_len = (uint32_t)blen};
    pd_hdr_encode(&h, hb);
    assert_ok(kvt__stream_send(s, hb, sizeof hb, kvt__deadline_ns(1000)));
    assert_ok(kvt__stream_send(s, room, blen, kvt__deadline_ns(1000)));
    assert_ok(kvt_pd_sender_room(cl.pre[0].s, 77));
    assert_ok(kvt_pd_sender_send(cl.pre[0].s, 77, cl.pre[0].pages, cl.pre[0].num_pages, 8192));
    kvt_pd_poll st;
    uint64_t t0 = kvt__now_ns();
    assert_ok(kvt_pd_sender_wait(cl.pre[0].s, 77, 15000, &st));
    assert_int_equal(st, KVT_PD_FAILED);
    assert_true(kvt__now_ns() - t0 < 10000000000ull);
    kvt_pd_room_info si;
    assert_ok(kvt_pd_room_info_get(cl.pre[0].s, NULL, 77, &si));
    assert_int_equal(si.error, KVT_ETIMEDOUT);
    (void)ep;
    kvt__stream_destroy(s); /* now the stuck link breaks; the sender's thread exits */
    free(room);
    free(b);
    pd_desc_free(&d);
    pd_cluster_stop(&cl);
}

static void api_validation(void **state)
{
    (void)state;
    kvt_pd_poll st;
    assert_int_equal(kvt_pd_sender_poll(NULL, 1, &st), KVT_EINVAL);
    assert_int_equal(kvt_pd_bootstrap_create(NULL, NULL), KVT_EINVAL);
    kvt_pd_net_params bad = {.secret = "short", .secret_len = 5};
    kvt_pd_bootstrap *bs = NULL;
    assert_int_equal(kvt_pd_bootstrap_create(&bs, &bad), KVT_EINVAL);
    assert_non_null(strstr(kvt_last_error(), "secret_len"));
    kvt_pd_params p = {0};
    kvt_pd_sender *s = NULL;
    assert_int_equal(kvt_pd_sender_create(&s, &p), KVT_EINVAL);
    pd_cluster cl = {0};
    pd_cluster_start(&cl, &c1, &c1, 40);
    pd_cluster_decoders(&cl);
    kvt_pd_room_params rp = {cl.dec[0].pages, 1, 40, 0};
    assert_int_equal(kvt_pd_receiver_room(cl.dec[0].r, 1, &rp), KVT_EINVAL); /* too few pages */
    rp.num_pages = cl.dec[0].num_pages;
    rp.prefix_tokens = 40;
    assert_int_equal(kvt_pd_receiver_room(cl.dec[0].r, 1, &rp), KVT_EINVAL);
    assert_int_equal(kvt_pd_sender_send(cl.pre[0].s, 1, cl.pre[0].pages, cl.pre[0].num_pages, 40), KVT_ENOTFOUND);
    assert_ok(kvt_pd_sender_room(cl.pre[0].s, 1));
    assert_int_equal(kvt_pd_sender_room(cl.pre[0].s, 1), KVT_EBUSY);
    assert_int_equal(kvt_pd_sender_wait(cl.pre[0].s, 1, -1, &st), KVT_EINVAL);
    assert_int_equal(kvt_pd_sender_wait(cl.pre[0].s, 1, 10, &st), KVT_ETIMEDOUT);
    kvt_pd_sender_destroy(NULL);
    kvt_pd_receiver_destroy(NULL);
    kvt_pd_bootstrap_destroy(NULL);
    pd_cluster_stop(&cl);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(abort_from_decode_acked),
        cmocka_unit_test(clear_live_room_fails_peer_promptly),
        cmocka_unit_test(decode_reconnects_are_reaped),
        cmocka_unit_test(abort_from_prefill_acked),
        cmocka_unit_test(waiting_deadline),
        cmocka_unit_test(cleared_room_not_resurrected),
        cmocka_unit_test(corrupt_page_fails_room),
        cmocka_unit_test(dead_prefill_fails_rooms_promptly),
        cmocka_unit_test(sender_bad_peers),
        cmocka_unit_test(bootstrap_bad_peers),
        cmocka_unit_test(peer_stops_reading),
        cmocka_unit_test(api_validation),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
