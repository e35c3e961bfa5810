/* test_conc_net_ucx.c - the rank-group TCP transport with its links on UCX
 * (kvt_net_tcp_params.transport = KVT_NET_UCX): ranks join through the one
 * handshake, the links move onto UCX tag messages, and messages of every
 * size (empty to several UCX chunks) arrive byte for byte; a receive that
 * times out before a message leaves the link usable; kvt_net_interrupt
 * ends a UCX wait. UCX_TLS=tcp on loopback. */
#include "test_group_util.h"

#include "net/net.h"
#include "net/stream.h"
#include "net/tcp.h"

#define SECRET "0123456789abcdef-ucx"
static const size_t sizes[] = {0, 1, 4096, (3u << 20) + 5}; /* the last: 4 UCX chunks */

static void fill(uint8_t *p, size_t n, uint32_t seed)
{
    for (size_t i = 0; i < n; i++) p[i] = (uint8_t)((i * 131u + seed * 7u) ^ (i >> 9));
}

static kvt_net *open_net(uint32_t rank, uint16_t port)
{
    kvt_net_tcp_params p = {rank, 2, "127.0.0.1", port, SECRET, sizeof SECRET - 1, 8u << 20, KVT_NET_UCX};
    kvt_net *n = NULL;
    assert_ok(kvt_net_tcp_create(&n, &p));
    return n;
}

typedef struct member {
    uint16_t port;
    kvt_status st;
    char link[16];
} member;

/* Rank 1: sends each size, reads the hub's echo and checks it. */
static void *member_main(void *arg)
{
    member *m = arg;
    kvt_net *n = NULL;
    kvt_net_tcp_params p = {1, 2, "127.0.0.1", m->port, SECRET, sizeof SECRET - 1, 8u << 20, KVT_NET_UCX};
    m->st = kvt_net_tcp_create(&n, &p);
    if (!m->st) m->st = kvt_net_connect(n, 10000);
    if (!m->st) snprintf(m->link, sizeof m->link, "%s", ((tcp_net *)n)->links[0]->ops->name);
    uint8_t *out = malloc(sizes[3]);
    kvt_buf b = {0};
    for (size_t k = 0; !m->st && k < sizeof sizes / sizeof sizes[0]; k++) {
        fill(out, sizes[k], (uint32_t)k);
        uint8_t hdr[3] = {'h', 'd', (uint8_t)k};
        size_t hl = sizes[k] ? 3 : 0;
        m->st = kvt__net_send(n, 0, hdr, hl, out, sizes[k], kvt__deadline_ns(10000));
        if (!m->st) m->st = kvt__net_recv(n, 0, &b, kvt__deadline_ns(10000));
        if (!m->st && (b.len != hl + sizes[k] || memcmp(b.p, hdr, hl) || memcmp(b.p + hl, out, sizes[k])))
            m->st = KVT_EPROTO;
    }
    kvt__buf_free(&b);
    free(out);
    kvt_net_destroy(n);
    return NULL;
}

static void links_move_bytes(void **state)
{
    (void)state;
    kvt_net *hub = open_net(0, 0);
    member m = {0};
    assert_ok(kvt_net_tcp_port(hub, &m.port));
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, member_main, &m), 0);
    assert_ok(kvt_net_connect(hub, 10000));
    assert_string_equal(((tcp_net *)hub)->links[1]->ops->name, "ucx");
    kvt_buf b = {0};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        assert_ok(kvt__net_recv(hub, 1, &b, kvt__deadline_ns(10000)));
        assert_ok(kvt__net_send(hub, 1, b.p, b.len, NULL, 0, kvt__deadline_ns(10000)));
    }
    pthread_join(th, NULL);
    assert_ok(m.st);
    assert_string_equal(m.link, "ucx");
    /* the member closed: the hub sees a lost link, not a hang */
    assert_status(kvt__net_recv(hub, 1, &b, kvt__deadline_ns(5000)), KVT_ECONN);
    kvt__buf_free(&b);
    kvt_net_destroy(hub);
}

typedef struct quiet {
    uint16_t port;
    kvt_net *n;
    atomic_int phase; /* 1: connected; 2: the hub is done */
} quiet;

static void *quiet_main(void *arg)
{
    quiet *q = arg;
    kvt_net_tcp_params p = {1, 2, "127.0.0.1", q->port, SECRET, sizeof SECRET - 1, 0, KVT_NET_UCX};
    if (kvt_net_tcp_create(&q->n, &p) == KVT_OK && kvt_net_connect(q->n, 10000) == KVT_OK) {
        atomic_store(&q->phase, 1);
        while (atomic_load(&q->phase) != 2) tg_sleep_ms(10);
    }
    kvt_net_destroy(q->n);
    return NULL;
}

static void *interrupt_later(void *arg)
{
    tg_sleep_ms(200);
    (void)kvt_net_interrupt(arg);
    return NULL;
}

/* A silent peer: the receive times out with the link kept, and an
 * interrupt from another thread ends the next long wait at once. */
static void timeout_and_interrupt(void **state)
{
    (void)state;
    quiet q = {0};
    kvt_net *hub = open_net(0, 0);
    assert_ok(kvt_net_tcp_port(hub, &q.port));
    pthread_t th, ti;
    assert_int_equal(pthread_create(&th, NULL, quiet_main, &q), 0);
    assert_ok(kvt_net_connect(hub, 10000));
    kvt_buf b = {0};
    assert_status(kvt__net_recv(hub, 1, &b, kvt__deadline_ns(100)), KVT_ETIMEDOUT);
    assert_non_null(((tcp_net *)hub)->links[1]); /* still linked */
    uint64_t t0 = kvt__now_ns();
    assert_int_equal(pthread_create(&ti, NULL, interrupt_later, hub), 0);
    assert_status(kvt__net_recv(hub, 1, &b, kvt__deadline_ns(20000)), KVT_ECANCELED);
    assert_true(kvt__now_ns() - t0 < 10000000000ull); /* not the 20 s deadline */
    pthread_join(ti, NULL);
    atomic_store(&q.phase, 2);
    pthread_join(th, NULL);
    kvt__buf_free(&b);
    kvt_net_destroy(hub);
}

int main(void)
{
    setenv("UCX_TLS", "tcp", 0);
    setenv("UCX_NET_DEVICES", "lo", 0);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(links_move_bytes),
        cmocka_unit_test(timeout_and_interrupt),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
