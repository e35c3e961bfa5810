/* test_api_errors_net.c - the statuses kvtier.h lists for the net, group,
 * connector and PD calls that only a misbehaving peer, host or transport
 * brings out (test_api_errors.c has their argument checks and the common
 * faults). Each case makes the fault real: a fake peer on a socket or an
 * in-process fabric that sends what a hostile or broken one would, a hub
 * holding another secret, UCX with no usable transport, a host out of file
 * descriptors, engine memory a PD rank cannot use. scripts/status_map.py
 * --coverage counts the (function, status) pairs shown here.
 *
 *  kvt_net_connect       UCX_TLS naming nothing usable (EUNSUPPORTED); a hub
 *                        sending a malformed UCX worker address (EPROTO); a
 *                        hub of another handshake version (EVERSION); a hub
 *                        that never answers the hello (ECONN)
 *  kvt_group_create      a member over UCX that cannot start (EUNSUPPORTED); a
 *                        member re-proposing a later epoch after the leader
 *                        agreed one (ESTATE)
 *  kvt_group_reform,     as create, on a formed group; a member whose hub is
 *  kvt_conn_reform       gone and no descriptor is left (ESYS), or whose new
 *                        hub holds another secret (EAUTH); a WELCOME failing
 *                        its checksum (conn_reform ECORRUPT)
 *  kvt_conn_wait_layer   a load whose SSD reads are held past the deadline
 *  kvt_pd_*_create       memory of the wrong kind (EUNSUPPORTED) or smaller
 *                        than the geometry (EGEOMETRY); a bootstrap service
 *                        refusing with EBUSY or EFULL (the call's status) or
 *                        with one no PD peer refuses with (EPROTO); a prefill rank that
 *                        answers RETRY to a registration (EPROTO); 257
 *                        prefill ranks feeding one decode rank (EFULL)
 *  kvt_pd_receiver_abort/clear  a batch still landing past the wait's bound
 *                        (a prefill rank that trickles its payload; ETIMEDOUT)
 *  an established PD link meeting another wire version: the room fails with
 *  KVT_EVERSION, as the bootstrap calls and rank groups report one.
 *
 * Pairs the header does not list because no path produces them are in
 * scripts/status_map.py's UNREACHABLE, each with its reason.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "support.h"
#include "cache/cache.h"
#include "group/frame.h"
#include "net/net.h"
#include "net/stream.h"
#include "pd/bootstrap.h"
#include "pd/desc.h"
#include "pd/ep.h"
#include "pd/wire.h"
#include "store/ssd.h"
#include "util/clock.h"
#include "util/err.h"
#include "util/le.h"

/* ------------------------------------------------------------------ */
/* Fixtures                                                            */

/* kvt_test_small_geo's (support.h): 2 layers, 4 tokens per page. */
#define T_LAYERS KVT_TEST_SMALL_LAYERS
#define T_TPP KVT_TEST_SMALL_TPP
#define T_PAGES KVT_TEST_SMALL_PAGES

/* The group parameters a rank of f's cache proposes (pp 1, cp 1, tp ranks). */
static kvt_group_params fx_group_params(const kvt_test_cache_fx *f, uint32_t ranks, int64_t t_ms, int64_t b_ms)
{
    kvt_geometry_info gi;
    assert_ok(kvt_geometry_info_get(f->geo, &gi));
    kvt_group_params gp = {1, 1, ranks, gi.digest, 0, t_ms, 0, b_ms};
    assert_ok(kvt_config_digest(f->cfg, &gp.config_digest));
    return gp;
}

/* A rank forming its group on a thread of its own. */
typedef struct group_run {
    kvt_net *n;
    kvt_group_params gp;
    kvt_group *g;
    kvt_status st;
} group_run;

static void *group_main(void *arg)
{
    group_run *r = arg;
    r->st = kvt_group_create(&r->g, r->n, &r->gp);
    return NULL;
}

/* ------------------------------------------------------------------ */
/* kvt_net_connect: UCX that cannot start, a hub that sends a malformed  */
/* UCX address, a hub that never answers                               */

/* A fake hub: accepts one rank and refuses its hello with refuse_code, or
 * (0) passes the group handshake (no secret) and then sends a UCX worker
 * address of 0 bytes. */
typedef struct fake_hub {
    int lfd;
    uint16_t port;
    pthread_t th;
    uint32_t refuse_code;
} fake_hub;

static void *fake_hub_main(void *arg)
{
    fake_hub *h = arg;
    kvt_stream *s = NULL;
    if (kvt__stream_accept(h->lfd, kvt__deadline_ns(5000), &s) != KVT_OK) return NULL;
    kvt_stream_auth a = {.who = "fake hub", .realm = &kvt__auth_group, .ranks = 2};
    uint8_t hello[KVT_AUTH_HELLO], chal[KVT_AUTH_CHAL], b;
    if (h->refuse_code) {
        if (kvt__stream_recv(s, hello, sizeof hello, kvt__deadline_ns(5000)) == KVT_OK) {
            kvt__auth_refuse_chal(&a, chal, h->refuse_code);
            (void)kvt__stream_send(s, chal, sizeof chal, kvt__deadline_ns(5000));
            (void)kvt__stream_recv(s, &b, 1, kvt__deadline_ns(5000)); /* until the rank hangs up */
        }
    } else if (kvt__stream_auth_server(s->fd, &a, kvt__deadline_ns(5000)) == KVT_OK) {
        uint8_t zero[4] = {0};
        (void)kvt__stream_send(s, zero, sizeof zero, kvt__deadline_ns(5000));
        while (kvt__stream_recv(s, &b, 1, kvt__deadline_ns(5000)) == KVT_OK) {
        } /* until the rank hangs up */
    }
    kvt__stream_destroy(s);
    return NULL;
}

static void test_net_connect_peer_faults(void **state)
{
    (void)state;
    /* UCX_TLS naming no transport: UCX cannot start, before any socket. */
    setenv("UCX_TLS", "kvtier-no-such-transport", 1);
    kvt_net *m = NULL;
    kvt_net_tcp_params mp = {1, 2, "127.0.0.1", 9, NULL, 0, 0, KVT_NET_UCX, 0};
    assert_ok(kvt_net_tcp_create(&m, &mp));
    EXPECT_ERR(kvt_net_connect(m, 1000), KVT_EUNSUPPORTED, "UCX init failed",
               "UCX_TLS=kvtier-no-such-transport");
    /* A member's group formation connects its link itself. */
    kvt_group_params gp = {1, 1, 2, 7, 0, 1000, 0, 2000};
    kvt_group *g = NULL;
    EXPECT_ERR(kvt_group_create(&g, m, &gp), KVT_EUNSUPPORTED, "kvt_group_create",
               "UCX init failed");
    assert_null(g);
    kvt_net_destroy(m);
    setenv("UCX_TLS", "tcp", 1);

    /* A hub that takes the handshake, then sends a 0-byte worker address. */
    fake_hub h = {.lfd = -1};
    assert_ok(kvt__stream_listen("127.0.0.1", 0, &h.lfd, &h.port));
    assert_int_equal(pthread_create(&h.th, NULL, fake_hub_main, &h), 0);
    mp.port = h.port;
    assert_ok(kvt_net_tcp_create(&m, &mp));
    EXPECT_ERR(kvt_net_connect(m, 5000), KVT_EPROTO, "kvt_net_connect", "UCX address is 0 bytes");
    kvt_net_destroy(m);
    pthread_join(h.th, NULL);
    close(h.lfd);

    /* A hub of handshake version 2: a version refusal, named both ways. */
    h = (fake_hub){.lfd = -1, .refuse_code = KVT_AUTH_BAD_VERSION | 2u << 16};
    assert_ok(kvt__stream_listen("127.0.0.1", 0, &h.lfd, &h.port));
    assert_int_equal(pthread_create(&h.th, NULL, fake_hub_main, &h), 0);
    mp.port = h.port;
    assert_ok(kvt_net_tcp_create(&m, &mp));
    EXPECT_ERR(kvt_net_connect(m, 5000), KVT_EVERSION, "kvt_net_connect", "handshake version 2, this end 1");
    kvt_net_destroy(m);
    pthread_join(h.th, NULL);
    close(h.lfd);

    /* A hub whose listener queues the connection and never answers. */
    int lfd = -1;
    uint16_t port = 0;
    assert_ok(kvt__stream_listen("127.0.0.1", 0, &lfd, &port));
    kvt_net_tcp_params tp = {1, 2, "127.0.0.1", port, NULL, 0, 0, KVT_NET_TCP, 0};
    assert_ok(kvt_net_tcp_create(&m, &tp));
    EXPECT_ERR(kvt_net_connect(m, 200), KVT_ECONN, "kvt_net_connect", "did not answer the hello");
    kvt_net_destroy(m);
    close(lfd);
    END_CHECKS();
}

/* A one-rank group over a UCX net formed without a link (it has no peer);
 * re-forming connects, and UCX cannot start. */
static void test_reform_ucx_unusable(void **state)
{
    (void)state;
    kvt_test_cache_fx f;
    kvt_test_cache_fx_init(&f, kvt_test_small_config(NULL));
    setenv("UCX_TLS", "kvtier-no-such-transport", 1);
    kvt_net *n = NULL;
    kvt_net_tcp_params p = {0, 1, "127.0.0.1", 0, NULL, 0, 0, KVT_NET_UCX, 0};
    assert_ok(kvt_net_tcp_create(&n, &p));
    kvt_group_params gp = fx_group_params(&f, 1, 1000, 0);
    kvt_group *g = NULL;
    assert_ok(kvt_group_create(&g, n, &gp));
    kvt_conn *conn = NULL;
    assert_ok(kvt_conn_create(&conn, g, f.cache));
    EXPECT_ERR(kvt_group_reform(g, 1000), KVT_EUNSUPPORTED, "kvt_group_reform", "UCX init failed");
    EXPECT_ERR(kvt_conn_reform(conn, 1000), KVT_EUNSUPPORTED, "kvt_conn_reform", "UCX init failed");
    setenv("UCX_TLS", "tcp", 1);
    kvt_conn_destroy(conn);
    kvt_group_destroy(g);
    kvt_net_destroy(n);
    kvt_test_cache_fx_fini(&f);
    END_CHECKS();
}

/* ------------------------------------------------------------------ */
/* Formation against a member played by the test over an inproc fabric  */

typedef struct pair_fx {
    kvt_test_cache_fx c;
    kvt_fabric *fab;
    kvt_net *n[2];
    kvt_group_params gp;
} pair_fx;

static void pair_init(pair_fx *p)
{
    kvt_test_cache_fx_init(&p->c, kvt_test_small_config(NULL));
    kvt_test_inproc_pair(&p->fab, p->n);
    p->gp = fx_group_params(&p->c, 2, 2000, 8000);
}

static void pair_fini(pair_fx *p)
{
    kvt_test_inproc_pair_destroy(p->fab, p->n);
    kvt_test_cache_fx_fini(&p->c);
}

/* Rank 1's HELLO for attempt att proposing epoch, as kvt_group_create
 * would send it. */
static kvt_status fake_hello(pair_fx *p, uint64_t att, uint64_t epoch)
{
    uint8_t msg[KVT_FRAME_HDR + 8 + KVT_HELLO_LEN];
    uint8_t *pl = msg + KVT_FRAME_HDR;
    kvt__put64(pl, att);
    kvt_hello h = {kvt_version(), 1, 1, 2, 1, 0, 0, 1, KVT_ROLE_MEMBER, p->gp.geometry_digest,
                   p->gp.config_digest, epoch, att};
    kvt__hello_encode(pl + 8, &h);
    kvt_frame f = {KVT_PROTO_VERSION, KVT_OP_HELLO, epoch, 0, KVT_CH_HANDSHAKE, 1, 0,
                   8 + KVT_HELLO_LEN, 0, NULL};
    kvt__frame_encode(msg, &f, pl);
    return kvt__net_send(p->n[1], 0, msg, sizeof msg, NULL, 0, kvt__deadline_ns(2000));
}

/* Waits (rank 1) for the leader's WELCOME to attempt att; its epoch, or 0
 * (frames of other attempts, left from earlier formations, are skipped). */
static uint64_t fake_await_welcome(pair_fx *p, uint64_t att)
{
    kvt_buf b = {0};
    uint64_t epoch = 0;
    for (int i = 0; i < 100 && !epoch; i++) {
        kvt_frame f;
        if (kvt__net_recv(p->n[1], 0, &b, kvt__deadline_ns(5000)) != KVT_OK ||
            kvt__frame_decode(b.p, b.len, KVT_PROTO_VERSION, &f) != KVT_OK)
            break;
        if (f.channel == KVT_CH_HANDSHAKE && f.op == KVT_OP_WELCOME && f.len == 16 &&
            kvt__get64(f.payload) == att)
            epoch = kvt__get64(f.payload + 8);
    }
    kvt__buf_free(&b);
    return epoch;
}

/* Rank 1 played by a thread: it proposes `propose`, is welcomed to it,
 * then proposes a later epoch under a new attempt. */
typedef struct late_member {
    pair_fx *p;
    uint64_t propose;
    uint64_t agreed; /* what the leader welcomed it to (0: nothing) */
    pthread_t th;
} late_member;

static void *late_member_main(void *arg)
{
    late_member *m = arg;
    if (fake_hello(m->p, 0x1001, m->propose) != KVT_OK) return NULL;
    m->agreed = fake_await_welcome(m->p, 0x1001);
    if (m->agreed) (void)fake_hello(m->p, 0x1002, m->agreed + 7);
    return NULL;
}

static void late_member_start(late_member *m, pair_fx *p, uint64_t propose)
{
    *m = (late_member){p, propose, 0, 0};
    assert_int_equal(pthread_create(&m->th, NULL, late_member_main, m), 0);
}

static void late_member_join(late_member *m)
{
    pthread_join(m->th, NULL);
    assert_int_equal(m->agreed, m->propose);
}

/* The leader agreed an epoch and welcomed rank 1; rank 1 then proposes a
 * later one (a second HELLO, as from a restarted attempt): the leader
 * refuses to form (ESTATE) rather than welcome it to an epoch it did not
 * agree with the others. */
static void test_group_late_proposal(void **state)
{
    (void)state;
    pair_fx p;
    pair_init(&p);
    late_member lm;
    kvt_group *g = NULL;
    late_member_start(&lm, &p, 1);
    EXPECT_ERR(kvt_group_create(&g, p.n[0], &p.gp), KVT_ESTATE, "kvt_group_create",
               "rank 1 proposed epoch 8", "after epoch 1 was agreed");
    late_member_join(&lm);
    assert_null(g);

    /* A formed group (rank 1 real this time) re-forming, directly and
     * through the connector, meets the same late proposal. */
    group_run mem = {p.n[1], p.gp, NULL, KVT_OK};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, group_main, &mem), 0);
    assert_ok(kvt_group_create(&g, p.n[0], &p.gp));
    pthread_join(th, NULL);
    assert_ok(mem.st);
    kvt_conn *conn = NULL;
    assert_ok(kvt_conn_create(&conn, g, p.c.cache));
    late_member_start(&lm, &p, 2);
    EXPECT_ERR(kvt_group_reform(g, 8000), KVT_ESTATE, "kvt_group_reform", "rank 1 proposed epoch 9",
               "after epoch 2 was agreed");
    late_member_join(&lm);
    late_member_start(&lm, &p, 2);
    EXPECT_ERR(kvt_conn_reform(conn, 8000), KVT_ESTATE, "kvt_conn_reform", "rank 1 proposed epoch 9");
    late_member_join(&lm);

    /* rank 1's connector re-forming meets a WELCOME failing its checksum */
    kvt_conn *mconn = NULL;
    assert_ok(kvt_conn_create(&mconn, mem.g, p.c.cache));
    uint8_t msg[KVT_FRAME_HDR + 16] = {0};
    kvt_frame f = {KVT_PROTO_VERSION, KVT_OP_WELCOME, 3, 0, KVT_CH_HANDSHAKE, 0, 1, 16, 0, NULL};
    kvt__frame_encode(msg, &f, msg + KVT_FRAME_HDR);
    msg[KVT_FRAME_HDR] ^= 1;
    assert_ok(kvt__net_send(p.n[0], 1, msg, sizeof msg, NULL, 0, kvt__deadline_ns(1000)));
    EXPECT_ERR(kvt_conn_reform(mconn, 200), KVT_ECORRUPT, "kvt_conn_reform", "rank 0", "checksum");
    kvt_conn_destroy(mconn);
    kvt_conn_destroy(conn);
    kvt_group_destroy(g);
    kvt_group_destroy(mem.g);
    pair_fini(&p);
    END_CHECKS();
}

/* ------------------------------------------------------------------ */
/* A TCP member whose hub is gone: re-forming with no descriptor left     */
/* (ESYS) and against a new hub holding another secret (EAUTH)           */

static void test_reform_member_lost_hub(void **state)
{
    (void)state;
    kvt_test_cache_fx f;
    kvt_test_cache_fx_init(&f, kvt_test_small_config(NULL));
    const char *secret = "0123456789abcdef-net-api-errors", *other = "fedcba9876543210-net-other";
    kvt_net *hub = NULL, *m = NULL;
    kvt_net_tcp_params hp = {0, 2, NULL, 0, secret, strlen(secret), 0, KVT_NET_TCP, 0};
    assert_ok(kvt_net_tcp_create(&hub, &hp));
    uint16_t port = 0;
    assert_ok(kvt_net_tcp_port(hub, &port));
    kvt_net_tcp_params mp = {1, 2, "127.0.0.1", port, secret, strlen(secret), 0, KVT_NET_TCP, 0};
    assert_ok(kvt_net_tcp_create(&m, &mp));
    kvt_group_params gp = fx_group_params(&f, 2, 2000, 8000);
    group_run lead = {hub, gp, NULL, KVT_OK};
    kvt_test_hub_wait hw;
    kvt_test_hub_wait_start(&hw, hub, 8000);
    assert_ok(kvt_net_connect(m, 8000));
    assert_ok(kvt_test_hub_wait_join(&hw));
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, group_main, &lead), 0);
    kvt_group *g = NULL;
    assert_ok(kvt_group_create(&g, m, &gp));
    pthread_join(th, NULL);
    assert_ok(lead.st);
    kvt_conn *conn = NULL;
    assert_ok(kvt_conn_create(&conn, g, f.cache));

    /* The hub goes. The first re-forming finds the link lost and no hub. */
    kvt_group_destroy(lead.g);
    kvt_net_destroy(hub);
    assert_true(kvt_group_reform(g, 300) != KVT_OK);

    /* No descriptor left for the new connection's socket. */
    struct rlimit old;
    kvt_test_nofile_low(&old);
    EXPECT_ERR(kvt_group_reform(g, 300), KVT_ESYS, "kvt_group_reform", "reconnecting", "socket");
    EXPECT_ERR(kvt_conn_reform(conn, 300), KVT_ESYS, "kvt_conn_reform", "reconnecting", "socket");
    assert_int_equal(setrlimit(RLIMIT_NOFILE, &old), 0);

    /* A new hub on that port with another secret. */
    hp.port = port;
    hp.secret = other;
    hp.secret_len = strlen(other);
    assert_ok(kvt_net_tcp_create(&hub, &hp));
    kvt_test_hub_wait_start(&hw, hub, 3000);
    EXPECT_ERR(kvt_group_reform(g, 2000), KVT_EAUTH, "kvt_group_reform", "reconnecting", "secret");
    EXPECT_ERR(kvt_conn_reform(conn, 2000), KVT_EAUTH, "kvt_conn_reform", "reconnecting", "secret");
    assert_int_equal(kvt_test_hub_wait_join(&hw), KVT_ETIMEDOUT);
    kvt_net_destroy(hub);
    kvt_conn_destroy(conn);
    kvt_group_destroy(g);
    kvt_net_destroy(m);
    kvt_test_cache_fx_fini(&f);
    END_CHECKS();
}

/* ------------------------------------------------------------------ */
/* kvt_conn_wait_layer past its deadline: the load's SSD reads are held  */

static void test_conn_wait_layer_deadline(void **state)
{
    (void)state;
    char dir[200], ssd[240];
    kvt_test_mkdtemp(dir, sizeof dir, "apinet");
    snprintf(ssd, sizeof ssd, "%s/ssd", dir);
    kvt_test_cache_fx f;
    kvt_test_cache_fx_init(&f, kvt_test_small_config(ssd));
    /* The request's blocks, stored and written through to the SSD. */
    kvt_store_plan sp;
    kvt_task_result r;
    assert_ok(kvt_cache_prepare_store(f.cache, &f.req, &sp));
    assert_ok(kvt_cache_launch(f.cache, sp.task, f.pages, 4));
    assert_ok(kvt_cache_wait(f.cache, sp.task, 10000, &r));
    assert_int_equal(r.status, KVT_OK);
    assert_ok(kvt_cache_flush(f.cache, 10000));
    /* Reopened: the blocks are on the SSD only, and their reads held. */
    kvt_cache_destroy(f.cache);
    f.cache = NULL;
    assert_ok(kvt_cache_create(&f.cache, f.cfg, f.geo));
    assert_ok(kvt_cache_register_memory(f.cache, &f.mem));
    kvt__ssd_hold_reads(f.cache->ssd, true);

    kvt_fabric *fab = NULL;
    kvt_net *n = NULL;
    assert_ok(kvt_fabric_create(&fab, 1, 4));
    assert_ok(kvt_net_inproc_create(&n, fab, 0));
    kvt_group_params gp = fx_group_params(&f, 1, 1000, 0);
    kvt_group *g = NULL;
    assert_ok(kvt_group_create(&g, n, &gp));
    kvt_conn *k = NULL;
    assert_ok(kvt_conn_create(&k, g, f.cache));
    uint32_t local = 0;
    assert_ok(kvt_conn_lookup(k, 1, &f.req, &local));
    assert_true(local > 0);
    uint32_t dst[4] = {0, 2, 4, 6};
    assert_ok(kvt_conn_load(k, 1, dst, 4, 1));
    assert_ok(kvt_conn_step(k, 1));
    EXPECT_ERR(kvt_conn_wait_layer(k, 1, 0, 0), KVT_ETIMEDOUT, "kvt_conn_wait_layer: kvt_cache_wait_layer",
               "not loaded");
    kvt__ssd_hold_reads(f.cache->ssd, false);
    EXPECT_OK(kvt_conn_wait_layer(k, 1, T_LAYERS - 1, 10000));
    kvt_conn_destroy(k);
    kvt_group_destroy(g);
    kvt_net_destroy(n);
    kvt_fabric_destroy(fab);
    kvt_test_cache_fx_fini(&f);
    END_CHECKS();
}

/* ------------------------------------------------------------------ */
/* PD ranks: engine memory they cannot use                              */

static void test_pd_create_memory(void **state)
{
    (void)state;
    kvt_geometry *g = kvt_test_small_geo();
    kvt_emu *e = NULL;
    kvt_engine_memory mem;
    assert_ok(kvt_emu_create(&e, g, T_PAGES));
    assert_ok(kvt_emu_memory(e, &mem));
    /* Nothing listens at port 9: every refusal comes before the bootstrap. */
    kvt_pd_params p = {.bootstrap_port = 9, .rank = {.tp_size = 1}, .geo = g, .mem = &mem,
                       .connect_timeout_ms = 200, .net = {.peer_timeout_ms = 200}};
    kvt_pd_sender *s = NULL;
    kvt_pd_receiver *r = NULL;
    kvt_engine_memory dev = mem;
    dev.kind = KVT_MEMORY_CUDA;
    p.mem = &dev;
    EXPECT_ERR(kvt_pd_sender_create(&s, &p), KVT_EUNSUPPORTED, "kvt_pd_sender_create",
               "CUDA device memory");
    EXPECT_ERR(kvt_pd_receiver_create(&r, &p), KVT_EUNSUPPORTED, "kvt_pd_receiver_create",
               "CUDA device memory");
    const uint64_t small[4] = {64, 64, 64, 64}; /* 8 pages of 4 tokens need 1 KiB each */
    kvt_engine_memory tiny = mem;
    tiny.buffer_bytes = small;
    p.mem = &tiny;
    EXPECT_ERR(kvt_pd_sender_create(&s, &p), KVT_EGEOMETRY, "kvt_pd_sender_create",
               "buffer_bytes[0]", "layer 0 K");
    EXPECT_ERR(kvt_pd_receiver_create(&r, &p), KVT_EGEOMETRY, "kvt_pd_receiver_create",
               "buffer_bytes[0]");
    assert_null(s);
    assert_null(r);
    kvt_emu_destroy(e);
    kvt_geometry_destroy(g);
    END_CHECKS();
}

/* ------------------------------------------------------------------ */
/* A fake prefill rank: registered with a real bootstrap service, it     */
/* takes the decode rank's connection and misbehaves as told            */

typedef enum {
    FP_REFUSE,  /* as a bootstrap service: refuses any request with `status` */
    FP_OK,      /* accepts the registration, then hangs up */
    FP_RETRY,   /* answers the registration with RETRY */
    FP_VERSION, /* after the room opens, sends a frame of PD wire version 9 */
    FP_TRICKLE  /* after the room opens, sends a DATA batch whose last byte comes late */
} fp_mode;

typedef struct fake_prefill {
    fp_mode mode;
    int lfd;
    uint16_t port;
    pthread_t th;
    atomic_bool stop;
    uint32_t trickle_ms;
    uint64_t payload; /* FP_TRICKLE: the batch's bytes */
    int32_t status;   /* FP_REFUSE */
} fake_prefill;

static bool fp_read_frame(kvt_stream *s, pd_hdr *h, uint8_t *body, size_t cap)
{
    uint8_t hb[PD_HDR_LEN];
    if (kvt__stream_recv(s, hb, sizeof hb, kvt__deadline_ns(5000)) != KVT_OK || !pd_hdr_decode(h, hb) ||
        h->body_len > cap)
        return false;
    return kvt__stream_recv(s, body, h->body_len, kvt__deadline_ns(5000)) == KVT_OK;
}

static void fp_send(kvt_stream *s, const pd_hdr *h, const void *body)
{
    uint8_t hb[PD_HDR_LEN];
    pd_hdr_encode(h, hb);
    (void)kvt__stream_send(s, hb, sizeof hb, kvt__deadline_ns(5000));
    if (h->body_len) (void)kvt__stream_send(s, body, h->body_len, kvt__deadline_ns(5000));
}

static void fp_sleep_unless_stopped(fake_prefill *f, uint32_t ms)
{
    for (uint32_t t = 0; t < ms && !atomic_load(&f->stop); t += 10)
        nanosleep(&(struct timespec){0, 10 * 1000000L}, NULL);
}

static void fp_serve(fake_prefill *f, kvt_stream *s)
{
    kvt_stream_auth a = {.who = "fake prefill"};
    static uint8_t body[1 << 16];
    pd_hdr h;
    if (kvt__stream_auth_server(s->fd, &a, kvt__deadline_ns(5000)) != KVT_OK ||
        !fp_read_frame(s, &h, body, sizeof body))
        return;
    if (f->mode == FP_REFUSE) {
        const char *why = "refused by the fake service";
        fp_send(s, &(pd_hdr){.type = PD_F_REFUSE, .status = f->status, .body_len = (uint32_t)strlen(why)}, why);
        return;
    }
    if (h.type != PD_F_REGISTER) return;
    if (f->mode == FP_RETRY) {
        const char *why = "busy";
        fp_send(s, &(pd_hdr){.type = PD_F_RETRY, .status = KVT_EAGAIN, .body_len = 4}, why);
        fp_sleep_unless_stopped(f, 5000);
        return;
    }
    uint8_t ok[4];
    pd_put32(ok, 1u << 20);
    fp_send(s, &(pd_hdr){.type = PD_F_OK, .body_len = 4}, ok);
    if (f->mode == FP_OK) return;
    do { /* pings, until the room's page table */
        if (!fp_read_frame(s, &h, body, sizeof body)) return;
    } while (h.type != PD_F_ROOM);
    if (f->mode == FP_VERSION) {
        uint8_t hb[PD_HDR_LEN] = {0};
        pd_hdr_encode(&(pd_hdr){.type = PD_F_PING}, hb);
        memcpy(hb, "KPD9", 4);
        (void)kvt__stream_send(s, hb, sizeof hb, kvt__deadline_ns(5000));
        fp_sleep_unless_stopped(f, 5000);
        return;
    }
    /* FP_TRICKLE: one DATA batch of the room's first page; all but the
     * last byte now, that byte after trickle_ms, the checksums never. */
    pd_hdr d = {.type = PD_F_DATA, .room = h.room, .gen = h.gen, .a0 = 0, .a1 = 1,
                .payload_len = f->payload};
    uint8_t hb[PD_HDR_LEN], *pay = calloc(1, f->payload);
    if (!pay) return; /* (no cmocka assert off the test's thread) the test then fails on the state */
    pd_hdr_encode(&d, hb);
    (void)kvt__stream_send(s, hb, sizeof hb, kvt__deadline_ns(5000));
    (void)kvt__stream_send(s, pay, f->payload - 1, kvt__deadline_ns(5000));
    fp_sleep_unless_stopped(f, f->trickle_ms);
    (void)kvt__stream_send(s, pay, 1, kvt__deadline_ns(5000));
    free(pay);
    fp_sleep_unless_stopped(f, 60000);
}

static void *fp_main(void *arg)
{
    fake_prefill *f = arg;
    while (!atomic_load(&f->stop)) {
        kvt_stream *s = NULL;
        if (kvt__stream_accept(f->lfd, kvt__deadline_ns(20), &s) != KVT_OK) continue;
        fp_serve(f, s);
        kvt__stream_destroy(s);
    }
    return NULL;
}

/* Listens and registers with the bootstrap service at bs_port as prefill
 * ranks tp 0..tp_size-1 of tp_size, every one of geometry g. */
static void fp_start_tp(fake_prefill *f, const kvt_geometry *g, uint16_t bs_port, uint32_t tp_size)
{
    atomic_store(&f->stop, false);
    assert_ok(kvt__stream_listen("127.0.0.1", 0, &f->lfd, &f->port));
    kvt_pd_net_params net = {.max_frame = 1u << 20};
    for (uint32_t i = 0; i < tp_size; i++) {
        pd_desc desc;
        kvt_pd_rank rank = {.tp_size = tp_size, .tp_rank = i};
        assert_ok(pd_desc_from_geometry(&desc, g, &rank, PD_ROLE_PREFILL));
        uint8_t tok[PD_BS_TOKEN_LEN] = {0};
        assert_ok(pd_bootstrap_register(&net, NULL, "127.0.0.1", bs_port, &desc, "127.0.0.1", f->port,
                                        kvt__deadline_ns(5000), tok, NULL));
        pd_desc_free(&desc);
    }
    assert_int_equal(pthread_create(&f->th, NULL, fp_main, f), 0);
}

static void fp_start(fake_prefill *f, const kvt_geometry *g, uint16_t bs_port)
{
    fp_start_tp(f, g, bs_port, 1);
}

/* Listens only (a fake bootstrap service: FP_REFUSE). */
static void fp_start_service(fake_prefill *f)
{
    atomic_store(&f->stop, false);
    assert_ok(kvt__stream_listen("127.0.0.1", 0, &f->lfd, &f->port));
    assert_int_equal(pthread_create(&f->th, NULL, fp_main, f), 0);
}

static void fp_stop(fake_prefill *f)
{
    atomic_store(&f->stop, true);
    pthread_join(f->th, NULL);
    close(f->lfd);
}

/* f: the test's fake prefill rank or service, stopped first (NULL: none,
 * or one the test stopped itself). */
static void pd_fx_fini(kvt_test_pd_fx *x, fake_prefill *f)
{
    if (f) fp_stop(f);
    kvt_test_pd_fx_fini(x);
}

/* A bootstrap service refusing a registration or lookup: its status is
 * the call's (KVT_EBUSY: another TP/DCP configuration holds the table, the
 * sender retrying until its deadline; KVT_EFULL: the table is full), but a
 * status no PD peer refuses with is the peer breaking the protocol. */
static void test_pd_create_service_refusals(void **state)
{
    (void)state;
    kvt_test_pd_fx x;
    kvt_test_pd_fx_init(&x, 5000, 2000);
    fake_prefill f = {.mode = FP_REFUSE, .lfd = -1, .status = KVT_EBUSY};
    fp_start_service(&f);
    x.p.bootstrap_port = f.port;
    x.p.connect_timeout_ms = 500;
    kvt_pd_sender *s = NULL;
    kvt_pd_receiver *r = NULL;
    EXPECT_ERR(kvt_pd_sender_create(&s, &x.p), KVT_EBUSY, "kvt_pd_sender_create", "registration refused",
               "refused by the fake service");
    EXPECT_ERR(kvt_pd_receiver_create(&r, &x.p), KVT_EBUSY, "kvt_pd_receiver_create", "lookup refused",
               "refused by the fake service");
    f.status = KVT_EFULL;
    EXPECT_ERR(kvt_pd_sender_create(&s, &x.p), KVT_EFULL, "kvt_pd_sender_create", "registration refused");
    f.status = KVT_ENOSPC;
    EXPECT_ERR(kvt_pd_sender_create(&s, &x.p), KVT_EPROTO, "kvt_pd_sender_create",
               "which no PD peer refuses with", "refused by the fake service");
    EXPECT_ERR(kvt_pd_receiver_create(&r, &x.p), KVT_EPROTO, "kvt_pd_receiver_create",
               "which no PD peer refuses with");
    assert_null(s);
    assert_null(r);
    pd_fx_fini(&x, &f);
    END_CHECKS();
}

/* RETRY is the bootstrap service's answer to lookups; from a prefill rank,
 * to a registration, it breaks the protocol (EPROTO, as the sender says of
 * a service that answers its registration so). */
static void test_pd_receiver_prefill_retry(void **state)
{
    (void)state;
    kvt_test_pd_fx x;
    kvt_test_pd_fx_init(&x, 5000, 2000);
    fake_prefill f = {.mode = FP_RETRY, .lfd = -1};
    fp_start(&f, x.g, x.p.bootstrap_port);
    kvt_pd_receiver *r = NULL;
    x.p.connect_timeout_ms = 2000;
    EXPECT_ERR(kvt_pd_receiver_create(&r, &x.p), KVT_EPROTO, "kvt_pd_receiver_create",
               "answered RETRY", "only to lookups", "busy");
    assert_null(r);
    pd_fx_fini(&x, &f);
    END_CHECKS();
}

/* A decode rank fed by more prefill ranks than it can hold links to (256,
 * src/pd/ep.h PD_MAX_CONNS): prefill TP 257 with one KV head each, decode
 * TP 1 with all 257 heads, so every prefill rank feeds it. */
static void test_pd_receiver_too_many_peers(void **state)
{
    (void)state;
    kvt_test_pd_fx x;
    kvt_test_pd_fx_init(&x, 5000, 2000);
    kvt_geometry *pg = kvt_test_geometry(T_LAYERS, 1, 8, T_TPP, KVT_LAYOUT_LAYER_FIRST);
    kvt_geometry *dg = kvt_test_geometry(T_LAYERS, 257, 8, T_TPP, KVT_LAYOUT_LAYER_FIRST);
    assert_non_null(pg);
    assert_non_null(dg);
    fake_prefill f = {.mode = FP_OK, .lfd = -1};
    fp_start_tp(&f, pg, x.p.bootstrap_port, 257);
    kvt_emu *de = NULL;
    kvt_engine_memory dm;
    assert_ok(kvt_emu_create(&de, dg, 2));
    assert_ok(kvt_emu_memory(de, &dm));
    x.p.geo = dg;
    x.p.mem = &dm;
    x.p.connect_timeout_ms = 20000; /* 256 handshakes on a loaded machine */
    kvt_pd_receiver *r = NULL;
    EXPECT_ERR(kvt_pd_receiver_create(&r, &x.p), KVT_EFULL, "kvt_pd_receiver_create",
               "more than 256 prefill peers");
    assert_null(r);
    kvt_emu_destroy(de);
    kvt_geometry_destroy(dg);
    kvt_geometry_destroy(pg);
    pd_fx_fini(&x, &f);
    END_CHECKS();
}

static kvt_pd_poll wait_state(kvt_pd_receiver *r, uint64_t room, kvt_pd_poll want)
{
    kvt_pd_poll st = KVT_PD_BOOTSTRAPPING;
    for (int i = 0; i < 1000; i++) { /* 10 s */
        assert_ok(kvt_pd_receiver_poll(r, room, &st));
        if (st == want) break;
        nanosleep(&(struct timespec){0, 10 * 1000000L}, NULL);
    }
    return st;
}

/* An established link whose prefill rank turns out to speak another PD
 * wire version: the room fails with KVT_EVERSION naming both versions, as
 * the bootstrap calls and rank groups report a version refusal. */
static void test_pd_link_other_version(void **state)
{
    (void)state;
    kvt_test_pd_fx x;
    kvt_test_pd_fx_init(&x, 5000, 2000);
    fake_prefill f = {.mode = FP_VERSION, .lfd = -1};
    fp_start(&f, x.g, x.p.bootstrap_port);
    kvt_pd_receiver *r = NULL;
    assert_ok(kvt_pd_receiver_create(&r, &x.p));
    uint32_t pages[1] = {0};
    assert_ok(kvt_pd_receiver_room(r, 1, &(kvt_pd_room_params){pages, 1, T_TPP, 0}));
    assert_int_equal(wait_state(r, 1, KVT_PD_FAILED), KVT_PD_FAILED);
    kvt_pd_room_info info;
    assert_ok(kvt_pd_room_info_get(NULL, r, 1, &info));
    if (info.error != KVT_EVERSION || !strstr(info.message, "wire version 9")) {
        print_error("room failed with %s (\"%s\"), want KVT_EVERSION naming wire version 9\n",
                    kvt_status_name(info.error), info.message);
        atomic_fetch_add(&kvt_test_soft_failures, 1);
    }
    kvt_pd_receiver_destroy(r);
    pd_fx_fini(&x, &f);
    END_CHECKS();
}

/* kvt_pd_receiver_clear, waiting at the same time as the test's abort. */
static void *clear_held_main(void *arg)
{
    EXPECT_ERR(kvt_pd_receiver_clear((kvt_pd_receiver *)arg, 1), KVT_ETIMEDOUT, "kvt_pd_receiver_clear",
               "room 1", "still being written", "after 9000 ms"); /* 4 x 2 s + 1 s */
    return NULL;
}

/* Abort and clear wait for a batch landing in the room's pages up to the
 * landing's own bound (4 x the peer timeout) + 1 s. Only a link thread
 * held past its bound (descheduled: the test hook stalls it 9 s after the
 * batch's checksums timed out) keeps it landing past that wait: both say
 * so (ETIMEDOUT) rather than return while bytes may still be written into
 * the pages. */
static void test_pd_receiver_landing_held(void **state)
{
    (void)state;
    const uint32_t peer_ms = 2000; /* the script answers no ping: 1 s was short under load */
    kvt_test_pd_fx x;
    kvt_test_pd_fx_init(&x, 5000, peer_ms);
    /* one page: 2 layers x (K, V) x 2 heads x 8 dims x 2 bytes x 4 tokens */
    fake_prefill f = {.mode = FP_TRICKLE, .lfd = -1, .trickle_ms = 100, .payload = 512};
    fp_start(&f, x.g, x.p.bootstrap_port);
    kvt_pd_receiver *r = NULL;
    assert_ok(kvt_pd_receiver_create(&r, &x.p));
    atomic_store(&pd_receiver_ep(r)->stall_landing_ms, 9000);
    uint32_t pages[1] = {0};
    assert_ok(kvt_pd_receiver_room(r, 1, &(kvt_pd_room_params){pages, 1, T_TPP, 0}));
    assert_int_equal(wait_state(r, 1, KVT_PD_TRANSFERRING), KVT_PD_TRANSFERRING);
    /* Landing from here until >= peer_ms + 9 s (11 s); each wait ends at
     * 4 x peer_ms + 1000 (9 s) from now. */
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, clear_held_main, r), 0);
    EXPECT_ERR(kvt_pd_receiver_abort(r, 1, "test"), KVT_ETIMEDOUT, "kvt_pd_receiver_abort", "room 1",
               "still being written", "after 9000 ms");
    pthread_join(th, NULL);
    fp_stop(&f); /* the link drops; the landing ends */
    kvt_pd_receiver_destroy(r);
    pd_fx_fini(&x, NULL);
    END_CHECKS();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_net_connect_peer_faults),
        cmocka_unit_test(test_reform_ucx_unusable),
        cmocka_unit_test(test_group_late_proposal),
        cmocka_unit_test(test_reform_member_lost_hub),
        cmocka_unit_test(test_conn_wait_layer_deadline),
        cmocka_unit_test(test_pd_create_memory),
        cmocka_unit_test(test_pd_create_service_refusals),
        cmocka_unit_test(test_pd_receiver_prefill_retry),
        cmocka_unit_test(test_pd_receiver_too_many_peers),
        cmocka_unit_test(test_pd_link_other_version),
        cmocka_unit_test(test_pd_receiver_landing_held),
    };
    return kvt_test_dirs_done(cmocka_run_group_tests(tests, NULL, NULL));
}
