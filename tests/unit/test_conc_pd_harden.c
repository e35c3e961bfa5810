/* test_conc_pd_harden.c - the PD hand-off against peers that go away,
 * flood, or lie (issue 14, "PD hand-off"): a finished prefill rank may
 * exit, unclaimed rooms are bounded per decode identity and in all, and
 * the messages name who and what. 127.0.0.1 only; every wait bounded. */
#include <stdatomic.h>
#include <stdio.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include "pd_harness.h"
#include "net/stream.h"
#include "pd/bootstrap.h"
#include "pd/ep.h"
#include "util/clock.h"
#include "util/err.h"

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

/* ---- raw decode peers that open rooms the prefill engine never claims ---- */

/* Connects to a sender as decode rank tp_rank/tp_size of geometry geo and
 * registers; NULL on failure. */
static kvt_stream *raw_decode(uint16_t port, const kvt_geometry *geo, uint32_t tp_rank, uint32_t tp_size)
{
    kvt_stream *s = NULL;
    kvt_stream_auth auth = {NULL, 0, "flooding decode"};
    if (kvt__stream_connect("127.0.0.1", port, &auth, kvt__deadline_ns(5000), &s) != KVT_OK) return NULL;
    pd_desc d;
    kvt_pd_rank rk = {.tp_size = tp_size, .tp_rank = tp_rank, .dcp_size = 1};
    assert_ok(pd_desc_from_geometry(&d, geo, &rk, PD_ROLE_DECODE));
    size_t n = pd_desc_wire_size(&d) + 4;
    uint8_t *reg = malloc(n);
    pd_desc_encode(&d, reg);
    pd_put32(reg + n - 4, 64u << 20);
    uint8_t hb[PD_HDR_LEN], ok[PD_HDR_LEN + 4];
    pd_hdr h = {.type = PD_F_REGISTER, .body_len = (uint32_t)n};
    pd_hdr_encode(&h, hb);
    assert_ok(kvt__stream_send(s, hb, sizeof hb, kvt__deadline_ns(2000)));
    assert_ok(kvt__stream_send(s, reg, n, kvt__deadline_ns(2000)));
    assert_ok(kvt__stream_recv(s, ok, sizeof ok, kvt__deadline_ns(5000)));
    assert_true(pd_hdr_decode(&h, ok));
    assert_int_equal(h.type, PD_F_OK);
    free(reg);
    pd_desc_free(&d);
    return s;
}

/* Opens rooms [first, first + n) of ntok tokens (3 pages of 16) on s. */
static void raw_rooms(kvt_stream *s, uint64_t first, uint32_t n, uint32_t ntok)
{
    uint8_t room[8 + 4 * 3] = {0}, hb[PD_HDR_LEN];
    pd_put32(room, ntok);
    pd_put32(room + 4, 3);
    for (uint32_t i = 0; i < n; i++) {
        pd_hdr rh = {.type = PD_F_ROOM, .room = first + i, .gen = 1, .a0 = 1, .body_len = sizeof room};
        pd_hdr_encode(&rh, hb);
        assert_ok(kvt__stream_send(s, hb, sizeof hb, kvt__deadline_ns(5000)));
        assert_ok(kvt__stream_send(s, room, sizeof room, kvt__deadline_ns(5000)));
    }
}

/* Reads s until a FAIL arrives (its room and message out); false if none
 * by 10 s. */
static bool raw_next_fail(kvt_stream *s, pd_hdr *h, char *msg, size_t cap)
{
    uint8_t hb[PD_HDR_LEN];
    uint64_t dl = kvt__deadline_ns(10000);
    while (kvt__now_ns() < dl) {
        if (kvt__stream_recv(s, hb, sizeof hb, dl) != KVT_OK) return false;
        assert_true(pd_hdr_decode(h, hb));
        assert_true(h->body_len < cap);
        memset(msg, 0, cap);
        if (h->body_len) assert_ok(kvt__stream_recv(s, msg, h->body_len, dl));
        if (h->type == PD_F_FAIL) return true;
    }
    return false;
}

static uint32_t sender_unclaimed(kvt_pd_sender *s)
{
    pd_ep *ep = pd_sender_ep(s);
    pthread_mutex_lock(&ep->mu);
    uint32_t n = ep->unclaimed;
    pthread_mutex_unlock(&ep->mu);
    return n;
}

/* Issue 14 item 3: the unclaimed-room budget belongs to the decode rank,
 * not to one link: a second link of the same rank (same address and
 * position) gets nothing more once the first holds PD_MAX_UNCLAIMED, and
 * the refusal names it (regression: each link had its own 4096). */
static void unclaimed_bounded_per_identity(void **state)
{
    (void)state;
    pd_cluster cl = {.net = {.peer_timeout_ms = 60000}};
    pd_cluster_start(&cl, &c1, &c1, 40);
    uint16_t port;
    assert_ok(kvt_pd_sender_port(cl.pre[0].s, &port));
    /* the flooder claims decode position tp1/2 (from this host, as the good
     * decode rank tp0/1 below, which keeps its own budget) */
    kvt_geometry *g2 = pd_model_geo(&mha, 2, 16, KVT_LAYOUT_LAYER_FIRST);
    kvt_stream *a = raw_decode(port, g2, 1, 2), *b = raw_decode(port, g2, 1, 2);
    kvt_geometry_destroy(g2);
    assert_non_null(a);
    assert_non_null(b);
    raw_rooms(a, 100000, PD_MAX_UNCLAIMED, 40);
    uint64_t dl = kvt__deadline_ns(20000);
    while (sender_unclaimed(cl.pre[0].s) < PD_MAX_UNCLAIMED && kvt__now_ns() < dl) sleep_ms(10);
    assert_int_equal(sender_unclaimed(cl.pre[0].s), PD_MAX_UNCLAIMED);
    raw_rooms(b, 200000, 1, 40);
    pd_hdr h;
    char msg[512];
    assert_true(raw_next_fail(b, &h, msg, sizeof msg));
    assert_int_equal(h.room, 200000);
    assert_int_equal(h.status, KVT_EFULL);
    if (!strstr(msg, "decode tp1/2 dcp0/1 at 127.0.0.1:") || !strstr(msg, "over all its links"))
        fail_msg("refusal: %s", msg);
    /* Issue 24: the rooms of a link that closed stop counting at once (they
     * held the identity's budget for 15-30 s), so its other link opens
     * rooms again. */
    kvt__stream_destroy(a);
    a = NULL;
    dl = kvt__deadline_ns(5000);
    while (sender_unclaimed(cl.pre[0].s) != 0 && kvt__now_ns() < dl) sleep_ms(10);
    assert_int_equal(sender_unclaimed(cl.pre[0].s), 0);
    raw_rooms(b, 300000, 1, 40);
    dl = kvt__deadline_ns(5000);
    while (sender_unclaimed(cl.pre[0].s) != 1 && kvt__now_ns() < dl) sleep_ms(10);
    assert_int_equal(sender_unclaimed(cl.pre[0].s), 1);
    /* the engine and a well-behaved decode rank still work */
    pd_cluster_decoders(&cl);
    pd_open_room(&cl, 7, 0);
    pd_expect_room(&cl, 7, KVT_PD_SUCCESS);
    assert_int_equal(pd_verify(&cl, 0), 0);
    kvt__stream_destroy(b);
    pd_cluster_stop(&cl);
}

/* Issue 14 item 3: 16 decode identities each opening PD_MAX_UNCLAIMED
 * rooms hold at most PD_MAX_UNCLAIMED_ALL between them, so the engine can
 * still open the other half of the table; its EFULL then says whose rooms
 * fill it (regression: 16 links filled all 65536 and the engine's first
 * kvt_pd_sender_room failed, telling it to clear rooms it does not own). */
static void unclaimed_bounded_in_all(void **state)
{
    (void)state;
    static const pd_model m16 = {.layers = 1, .heads = 16, .head_dim = 8};
    pd_side_cfg c = {.tp = 1, .dcp = 1, .tpp = 16, .layout = KVT_LAYOUT_LAYER_FIRST, .model = &m16};
    pd_cluster cl = {.net = {.peer_timeout_ms = 60000}};
    pd_cluster_start(&cl, &c, &c, 40);
    uint16_t port;
    assert_ok(kvt_pd_sender_port(cl.pre[0].s, &port));
    kvt_stream *links[16];
    for (uint32_t i = 0; i < 16; i++) {
        kvt_geometry *g = pd_model_geo(&m16, 16, 16, KVT_LAYOUT_LAYER_FIRST);
        links[i] = raw_decode(port, g, i, 16);
        assert_non_null(links[i]);
        kvt_geometry_destroy(g);
    }
    for (uint32_t i = 0; i < 16; i++) raw_rooms(links[i], 1000000 + 100000ull * i, PD_MAX_UNCLAIMED, 40);
    /* the last link's last room is refused once the others are in */
    pd_hdr h;
    char msg[512];
    uint64_t dl = kvt__deadline_ns(30000);
    while (sender_unclaimed(cl.pre[0].s) < PD_MAX_UNCLAIMED_ALL && kvt__now_ns() < dl) sleep_ms(10);
    assert_int_equal(sender_unclaimed(cl.pre[0].s), PD_MAX_UNCLAIMED_ALL);
    uint32_t opened = 0;
    kvt_status st = KVT_OK;
    while (opened < PD_MAX_ROOMS && (st = kvt_pd_sender_room(cl.pre[0].s, 1 + opened)) == KVT_OK) opened++;
    assert_int_equal(st, KVT_EFULL);
    assert_int_equal(opened, PD_MAX_ROOMS - PD_MAX_UNCLAIMED_ALL);
    const char *e = kvt_last_error();
    if (!strstr(e, "kvt_pd_sender_room") || !strstr(e, "32768 opened by decode ranks and not claimed") ||
        !strstr(e, "32768 opened or claimed by its engine") || !strstr(e, "(most: decode tp") ||
        !strstr(e, "at 127.0.0.1 (4096)"))
        fail_msg("EFULL message: %s", e);
    /* a refused link heard why */
    bool heard = false;
    for (uint32_t i = 0; i < 16 && !heard; i++) {
        pd_ep *ep = pd_sender_ep(cl.pre[0].s);
        pthread_mutex_lock(&ep->mu);
        uint32_t mine = 0;
        for (uint32_t k = 0; k < ep->nconns; k++)
            if (ep->conns[k] && ep->conns[k]->peer.tp_rank == i && ep->conns[k]->registered)
                mine = ep->conns[k]->unclaimed;
        pthread_mutex_unlock(&ep->mu);
        if (mine == PD_MAX_UNCLAIMED) continue;
        assert_true(raw_next_fail(links[i], &h, msg, sizeof msg));
        assert_int_equal(h.status, KVT_EFULL);
        if (!strstr(msg, "the limit for all decode ranks")) fail_msg("refusal: %s", msg);
        heard = true;
    }
    assert_true(heard);
    for (uint32_t i = 0; i < 16; i++) kvt__stream_destroy(links[i]);
    pd_cluster_stop(&cl);
}

/* ---- messages that name what is wrong and who ---- */

/* A bootstrap service that answers the first lookup RETRY (prefill tp1/2
 * missing) and then goes silent: later connections are accepted and never
 * answered, as a loaded or stuck service would. */
typedef struct fake_bs {
    int lfd;
    uint16_t port;
    pthread_t th;
    atomic_bool stop;
} fake_bs;

static void *fake_bs_main(void *arg)
{
    fake_bs *f = arg;
    kvt_stream *held[64];
    int n = 0;
    kvt_stream_auth a = {NULL, 0, "fake bootstrap"};
    while (!atomic_load(&f->stop)) {
        kvt_stream *s;
        if (kvt__stream_accept(f->lfd, kvt__deadline_ns(20), &s) != KVT_OK) continue;
        if (n == 0 && kvt__stream_auth_server(s->fd, &a, kvt__deadline_ns(2000)) == KVT_OK) {
            uint8_t hb[PD_HDR_LEN], body[4096];
            pd_hdr h;
            if (kvt__stream_recv(s, hb, sizeof hb, kvt__deadline_ns(2000)) == KVT_OK && pd_hdr_decode(&h, hb) &&
                h.body_len <= sizeof body &&
                kvt__stream_recv(s, body, h.body_len, kvt__deadline_ns(2000)) == KVT_OK) {
                const char *m = "1 of 2 prefill ranks registered; missing tp1/2 dcp0/1";
                pd_hdr r = {.type = PD_F_RETRY, .status = KVT_EAGAIN, .body_len = (uint32_t)strlen(m)};
                pd_hdr_encode(&r, hb);
                (void)kvt__stream_send(s, hb, sizeof hb, kvt__deadline_ns(1000));
                (void)kvt__stream_send(s, m, strlen(m), kvt__deadline_ns(1000));
            }
        }
        if (n < 64) held[n++] = s; /* silent from here on */
        else kvt__stream_destroy(s);
    }
    for (int i = 0; i < n; i++) kvt__stream_destroy(held[i]);
    return NULL;
}

/* Issue 14 item 5: a decode rank whose deadline passes while a prefill rank
 * is missing names the missing rank, even when its last attempt died on a
 * service that did not answer in time (regression: "the server did not
 * answer the hello"). */
static void deadline_names_missing_ranks(void **state)
{
    (void)state;
    setenv("KVTIER_PD_QUIET", "1", 0);
    fake_bs f = {.lfd = -1};
    assert_ok(kvt__stream_listen("127.0.0.1", 0, &f.lfd, &f.port));
    assert_int_equal(pthread_create(&f.th, NULL, fake_bs_main, &f), 0);
    pd_rank r = {0};
    pd_rank_init(&r, &c1, 0, 0, 40);
    kvt_engine_memory mem;
    assert_ok(kvt_emu_memory(r.emu, &mem));
    kvt_pd_params p = {.rank = r.rank, .geo = r.geo, .mem = &mem, .bootstrap_port = f.port,
                       .connect_timeout_ms = 1500};
    kvt_status st = kvt_pd_receiver_create(&r.r, &p);
    char msg[KVT_ERRMSG_MAX];
    snprintf(msg, sizeof msg, "%s", kvt_last_error());
    atomic_store(&f.stop, true);
    pthread_join(f.th, NULL);
    close(f.lfd);
    pd_rank_free(&r);
    assert_int_equal(st, KVT_ETIMEDOUT);
    if (!strstr(msg, "missing tp1/2 dcp0/1") || !strstr(msg, "incomplete at the deadline")) fail_msg("%s", msg);
}

/* Issue 14 item 5: a wrong secret is called a wrong secret on both ends
 * (regression: the server said "no proof before the deadline"). */
static void wrong_secret_says_so(void **state)
{
    (void)state;
    auth_end srv = {.secret = "0123456789abcdef-right"}, cli = {.secret = "0123456789abcdef-wrong"};
    handshake_pair(&srv, &cli);
    assert_int_equal(srv.st, KVT_EAUTH);
    assert_int_equal(cli.st, KVT_EAUTH);
    if (!strstr(srv.msg, "wrong proof of the shared secret (the two ends hold different secrets)"))
        fail_msg("server: %s", srv.msg);
    if (!strstr(cli.msg, "could not prove the shared secret")) fail_msg("client: %s", cli.msg);
    /* and the right one still passes */
    auth_end s2 = {.secret = "0123456789abcdef-right"}, c2s = {.secret = "0123456789abcdef-right"};
    handshake_pair(&s2, &c2s);
    assert_int_equal(s2.st, KVT_OK);
    assert_int_equal(c2s.st, KVT_OK);
}

static void *junk_server_main(void *arg)
{
    auth_end *e = arg;
    uint8_t hello[40], junk[72];
    struct iovec v = {hello, sizeof hello};
    (void)kvt__stream_fd_io(e->fd, &v, 1, kvt__deadline_ns(5000), 0);
    memset(junk, 0x41, sizeof junk); /* "AAAA": not a kvtier answer */
    struct iovec w = {junk, sizeof junk};
    (void)kvt__stream_fd_io(e->fd, &w, 1, kvt__deadline_ns(5000), 1);
    return NULL;
}

/* Issue 14 item 5: something that is not a kvtier endpoint is called that
 * (regression: "the server refused: refused"). */
static void not_kvtier_says_so(void **state)
{
    (void)state;
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv), 0);
    auth_end srv = {.fd = sv[0]};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, junk_server_main, &srv), 0);
    kvt_stream_auth a = {NULL, 0, "test client"};
    kvt_status st = kvt__stream_auth_client(sv[1], &a, kvt__deadline_ns(5000));
    pthread_join(th, NULL);
    close(sv[0]);
    close(sv[1]);
    assert_int_equal(st, KVT_EAUTH);
    if (!strstr(kvt_last_error(), "not a kvtier PD endpoint") || strstr(kvt_last_error(), "refused: refused"))
        fail_msg("%s", kvt_last_error());
}

/* Issue 14 item 5: a sender's refusal logs the stranger's address. stderr
 * goes to a file for the test; the harness's KVTIER_PD_QUIET is lifted
 * while no PD thread runs. */
static void refusal_logs_peer_address(void **state)
{
    (void)state;
    char path[] = "/tmp/kvt_pd_log_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    fflush(stderr);
    int saved = dup(STDERR_FILENO);
    dup2(fd, STDERR_FILENO);
    unsetenv("KVTIER_PD_QUIET");
    kvt_pd_net_params net = {.secret = "0123456789abcdef-secret", .secret_len = 23};
    kvt_pd_bootstrap *bs = NULL;
    assert_ok(kvt_pd_bootstrap_create(&bs, &net));
    uint16_t bport;
    assert_ok(kvt_pd_bootstrap_port(bs, &bport));
    pd_rank r = {0};
    pd_rank_init(&r, &c1, 0, 0, 40);
    kvt_engine_memory mem;
    assert_ok(kvt_emu_memory(r.emu, &mem));
    kvt_pd_params p = {.rank = r.rank, .geo = r.geo, .mem = &mem, .bootstrap_port = bport, .net = net};
    assert_ok(kvt_pd_sender_create(&r.s, &p));
    uint16_t port;
    assert_ok(kvt_pd_sender_port(r.s, &port));
    kvt_stream *s = NULL;
    kvt_stream_auth a = {NULL, 0, "stranger"};
    assert_int_equal(kvt__stream_connect("127.0.0.1", port, &a, kvt__deadline_ns(3000), &s), KVT_EAUTH);
    assert_int_equal(kvt__stream_connect("127.0.0.1", bport, &a, kvt__deadline_ns(3000), &s), KVT_EAUTH);
    sleep_ms(300); /* the refusals are logged on the endpoints' threads */
    pd_rank_free(&r);
    kvt_pd_bootstrap_destroy(bs);
    fflush(stderr);
    dup2(saved, STDERR_FILENO);
    close(saved);
    setenv("KVTIER_PD_QUIET", "1", 1);
    char log[8192] = {0};
    ssize_t n = pread(fd, log, sizeof log - 1, 0);
    close(fd);
    unlink(path);
    assert_true(n > 0);
    if (!strstr(log, "pd sender: refused unregistered peer 127.0.0.1:") ||
        !strstr(log, "pd bootstrap: refused the peer at 127.0.0.1:"))
        fail_msg("log: %s", log);
}

/* ---- link slots: silent and idle peers cost their own ---- */

/* Room for 256 sockets here and 3 fds per link on the sender. */
static void raise_fd_limit(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        (void)setrlimit(RLIMIT_NOFILE, &rl);
    }
}

/* A TCP connection to port that never sends a byte; -1 on failure. */
static int silent_connect(uint16_t port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        close(fd);
        fd = -1;
    }
    return fd;
}

/* Issue 14 item 2: 256 connections that send nothing, on a sender with a
 * secret and a 20 s peer_timeout_ms, no longer take every link slot: they
 * share PD_MAX_GREETING slots (the oldest evicted), and a decode rank
 * that starts meanwhile connects and moves verified bytes (regression: it
 * failed at once, "the server did not answer the hello"). */
static void silent_connections_cost_their_own_slots(void **state)
{
    (void)state;
    raise_fd_limit();
    pd_cluster cl = {.net = {.secret = "0123456789abcdef-secret", .secret_len = 23, .peer_timeout_ms = 20000}};
    pd_cluster_start(&cl, &c1, &c1, 40);
    uint16_t port;
    assert_ok(kvt_pd_sender_port(cl.pre[0].s, &port));
    int fds[PD_MAX_CONNS];
    for (uint32_t i = 0; i < PD_MAX_CONNS; i++) {
        fds[i] = silent_connect(port);
        assert_true(fds[i] >= 0);
    }
    sleep_ms(1000); /* the sender accepts them all (every 10 ms tick takes one or more) */
    pd_cluster_decoders(&cl);
    pd_open_room(&cl, 7, 0);
    pd_expect_room(&cl, 7, KVT_PD_SUCCESS);
    assert_int_equal(pd_verify(&cl, 0), 0);
    for (uint32_t i = 0; i < PD_MAX_CONNS; i++) close(fds[i]);
    pd_cluster_stop(&cl);
}

/* Issue 14 item 2: peers that register and then only ping fill all 256
 * link slots; a new decode rank still gets one (the idle link unused
 * longest is dropped) and moves verified bytes (regression: refused, "256
 * links open (the limit)"). */
static void idle_registered_links_make_room(void **state)
{
    (void)state;
    raise_fd_limit();
    pd_cluster cl = {.net = {.peer_timeout_ms = 60000}};
    pd_cluster_start(&cl, &c1, &c1, 40);
    uint16_t port;
    assert_ok(kvt_pd_sender_port(cl.pre[0].s, &port));
    kvt_geometry *g2 = pd_model_geo(&mha, 2, 16, KVT_LAYOUT_LAYER_FIRST);
    kvt_stream *links[PD_MAX_CONNS];
    for (uint32_t i = 0; i < PD_MAX_CONNS; i++) {
        links[i] = raw_decode(port, g2, 1, 2);
        assert_non_null(links[i]);
    }
    kvt_geometry_destroy(g2);
    pd_cluster_decoders(&cl);
    pd_open_room(&cl, 7, 0);
    pd_expect_room(&cl, 7, KVT_PD_SUCCESS);
    assert_int_equal(pd_verify(&cl, 0), 0);
    for (uint32_t i = 0; i < PD_MAX_CONNS; i++) kvt__stream_destroy(links[i]);
    pd_cluster_stop(&cl);
}

/* ---- secure by default ---- */

/* Issue 14 item 4: without a secret a stranger cannot re-register a live
 * prefill position at its own address (decode ranks would take its bytes
 * for KV); the real rank's registration stands and a decode rank moves
 * verified bytes from it (regression: the stranger's registration
 * replaced it). With a secret, a (proven) restarted rank still replaces
 * its entry at once. */
static void live_registration_not_taken_over(void **state)
{
    (void)state;
    pd_cluster cl = {0};
    pd_cluster_start(&cl, &c1, &c1, 40);
    pd_ep *ep = pd_sender_ep(cl.pre[0].s);
    kvt_stream_auth stranger = {NULL, 0, "stranger"};
    uint8_t none[PD_BS_TOKEN_LEN] = {0};
    kvt_status st = pd_bootstrap_register(&ep->net, &stranger, "127.0.0.1", cl.port, &ep->desc, "127.0.0.1", 9,
                                          kvt__deadline_ns(5000), none, NULL);
    assert_int_equal(st, KVT_EBUSY);
    if (!strstr(kvt_last_error(), "live lease") || !strstr(kvt_last_error(), "127.0.0.1:9") ||
        !strstr(kvt_last_error(), "no secret"))
        fail_msg("%s", kvt_last_error());
    /* its own renewal (same address) still works */
    uint8_t tok[PD_BS_TOKEN_LEN] = {0};
    assert_ok(pd_bootstrap_register(&ep->net, &ep->auth, "127.0.0.1", cl.port, &ep->desc, ep->bind_host, ep->port,
                                    kvt__deadline_ns(5000), tok, NULL));
    pd_cluster_decoders(&cl);
    pd_open_room(&cl, 4, 0);
    pd_expect_room(&cl, 4, KVT_PD_SUCCESS);
    assert_int_equal(pd_verify(&cl, 0), 0);
    pd_cluster_stop(&cl);

    /* with a secret the entry moves to a new address of a proven peer */
    pd_cluster sc = {.net = {.secret = "0123456789abcdef-secret", .secret_len = 23}};
    pd_cluster_start(&sc, &c1, &c1, 40);
    ep = pd_sender_ep(sc.pre[0].s);
    uint8_t tok2[PD_BS_TOKEN_LEN] = {0};
    assert_ok(pd_bootstrap_register(&ep->net, &ep->auth, "127.0.0.1", sc.port, &ep->desc, "127.0.0.1", 9,
                                    kvt__deadline_ns(5000), tok2, NULL));
    pd_cluster_stop(&sc);
}

/* Issue 14 item 4: a bootstrap service or sender listening beyond
 * loopback without a secret refuses to start, naming the address and the
 * two ways out; with a secret or allow_insecure it starts. A receiver
 * (which only dials) is not affected. */
static void exposed_listener_needs_secret(void **state)
{
    (void)state;
    kvt_pd_bootstrap *bs = NULL;
    kvt_pd_net_params n = {.bind_host = "0.0.0.0"};
    assert_int_equal(kvt_pd_bootstrap_create(&bs, &n), KVT_EINVAL);
    const char *e = kvt_last_error();
    if (!strstr(e, "kvt_pd_bootstrap_create: bind_host 0.0.0.0 is not a loopback address and no secret is set") ||
        !strstr(e, "allow_insecure"))
        fail_msg("%s", e);
    assert_null(bs);
    n.allow_insecure = 2;
    assert_int_equal(kvt_pd_bootstrap_create(&bs, &n), KVT_EINVAL);
    assert_non_null(strstr(kvt_last_error(), "allow_insecure is 2"));
    n.allow_insecure = 1;
    assert_ok(kvt_pd_bootstrap_create(&bs, &n));
    kvt_pd_bootstrap_destroy(bs);
    bs = NULL;
    /* "localhost" is loopback (kvt__host_is_loopback): refused only for
     * being a name where a numeric address belongs, not as "not a loopback
     * address" (the hand-written "127." check) */
    kvt_pd_net_params ln = {.bind_host = "localhost"};
    assert_int_equal(kvt_pd_bootstrap_create(&bs, &ln), KVT_EINVAL);
    e = kvt_last_error();
    if (strstr(e, "loopback") || !strstr(e, "kvt_pd_bootstrap_create") ||
        !strstr(e, "\"localhost\" is not a numeric IPv4 address"))
        fail_msg("%s", e);
    assert_null(bs);
    kvt_pd_net_params sn = {.bind_host = "0.0.0.0", .secret = "0123456789abcdef-secret", .secret_len = 23};
    assert_ok(kvt_pd_bootstrap_create(&bs, &sn));
    uint16_t port;
    assert_ok(kvt_pd_bootstrap_port(bs, &port));

    pd_rank r = {0};
    pd_rank_init(&r, &c1, 0, 0, 40);
    kvt_engine_memory mem;
    assert_ok(kvt_emu_memory(r.emu, &mem));
    kvt_pd_params p = {.rank = r.rank, .geo = r.geo, .mem = &mem, .bootstrap_port = port,
                       .net = {.bind_host = "0.0.0.0"}, .connect_timeout_ms = 3000};
    assert_int_equal(kvt_pd_sender_create(&r.s, &p), KVT_EINVAL);
    if (!strstr(kvt_last_error(), "kvt_pd_sender_create: bind_host 0.0.0.0 is not a loopback address"))
        fail_msg("%s", kvt_last_error());
    assert_null(r.s);
    p.net = sn;
    assert_ok(kvt_pd_sender_create(&r.s, &p));
    pd_rank_free(&r);
    kvt_pd_bootstrap_destroy(bs);
}

/* Issue 24: a room waiting for a decode rank that never came says which
 * ("1 of 2 decode ranks opened the room"), on both sides, instead of an
 * empty message; it then completes when the second one opens. */
static void waiting_room_says_why(void **state)
{
    (void)state;
    pd_cluster cl = {.net = {.peer_timeout_ms = 20000}};
    pd_cluster_start(&cl, &c1, &c2, 40);
    kvt_pd_room_info info;
    assert_ok(kvt_pd_sender_room(cl.pre[0].s, 9));
    assert_ok(kvt_pd_sender_send(cl.pre[0].s, 9, cl.pre[0].pages, cl.pre[0].num_pages, cl.ntok));
    assert_ok(kvt_pd_room_info_get(cl.pre[0].s, NULL, 9, &info));
    assert_string_equal(info.message, "no decode rank opened the room yet");
    pd_cluster_decoders(&cl);
    pd_rank *d0 = &cl.dec[0];
    kvt_pd_room_params rp = {d0->pages, d0->num_pages, cl.ntok, 0};
    assert_ok(kvt_pd_receiver_room(d0->r, 9, &rp));
    uint64_t dl = kvt__deadline_ns(10000);
    do {
        sleep_ms(10);
        assert_ok(kvt_pd_room_info_get(cl.pre[0].s, NULL, 9, &info));
    } while (strcmp(info.message, "1 of 2 decode ranks opened the room") != 0 && kvt__now_ns() < dl);
    assert_string_equal(info.message, "1 of 2 decode ranks opened the room");
    assert_ok(kvt_pd_room_info_get(NULL, d0->r, 9, &info));
    assert_true(info.message[0] != '\0'); /* the decode side says what it waits for too */
    pd_rank *d1 = &cl.dec[1];
    kvt_pd_room_params rp1 = {d1->pages, d1->num_pages, cl.ntok, 0};
    assert_ok(kvt_pd_receiver_room(d1->r, 9, &rp1));
    pd_expect_room(&cl, 9, KVT_PD_SUCCESS);
    assert_ok(kvt_pd_room_info_get(cl.pre[0].s, NULL, 9, &info));
    assert_string_equal(info.message, "");
    pd_cluster_stop(&cl);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(waiting_room_says_why),
        cmocka_unit_test(finished_prefill_may_exit),
        cmocka_unit_test(unclaimed_bounded_per_identity),
        cmocka_unit_test(unclaimed_bounded_in_all),
        cmocka_unit_test(deadline_names_missing_ranks),
        cmocka_unit_test(wrong_secret_says_so),
        cmocka_unit_test(not_kvtier_says_so),
        cmocka_unit_test(refusal_logs_peer_address),
        cmocka_unit_test(silent_connections_cost_their_own_slots),
        cmocka_unit_test(idle_registered_links_make_room),
        cmocka_unit_test(live_registration_not_taken_over),
        cmocka_unit_test(exposed_listener_needs_secret),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
