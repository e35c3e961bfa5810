/* test_conc_net_auth.c - the one handshake (net/stream_auth.c) that both
 * the rank-group hub and PD endpoints run: each realm refuses the other's
 * peers with words that say so, and a client holding a secret never leaves
 * a server without one believing it joined (issue 14 item 12). */
#include "test_group_util.h"

#include <sys/socket.h>
#include "net/net.h"
#include "net/stream.h"
#include "net/tcp.h"
#include "util/err.h"

typedef struct end {
    int fd;
    kvt_stream_auth a;
    kvt_status st;
    char msg[KVT_ERRMSG_MAX];
} end;

static void *server_main(void *arg)
{
    end *e = arg;
    e->st = kvt__stream_auth_server(e->fd, &e->a, kvt__deadline_ns(5000));
    snprintf(e->msg, sizeof e->msg, "%s", kvt_last_error());
    return NULL;
}

/* The handshake between srv and cli over a socket pair; the client hangs
 * up afterwards, as kvt__stream_connect and tcp.c do on a failure. */
static void pair(end *srv, end *cli)
{
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv), 0);
    srv->fd = sv[0];
    cli->fd = sv[1];
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, server_main, srv), 0);
    cli->st = kvt__stream_auth_client(cli->fd, &cli->a, kvt__deadline_ns(5000));
    snprintf(cli->msg, sizeof cli->msg, "%s", kvt_last_error());
    close(cli->fd);
    pthread_join(th, NULL);
    close(srv->fd);
}

#define SECRET "0123456789abcdef-secret"
static const kvt_stream_auth pd_open = {.who = "pd test"};
static const kvt_stream_auth pd_secret = {.secret = (const uint8_t *)SECRET, .secret_len = sizeof SECRET - 1, .who = "pd test"};

/* A client with a secret facing a server without one: the server cannot
 * prove it, so the client refuses, and the server must not take the link
 * for authenticated (regression: the client sent its proof anyway and a
 * secret-less PD server returned KVT_OK for a link its peer dropped). */
static void secretless_server_is_not_joined(void **state)
{
    (void)state;
    end srv = {.a = pd_open}, cli = {.a = pd_secret};
    pair(&srv, &cli);
    assert_int_equal(cli.st, KVT_EAUTH);
    if (!strstr(cli.msg, "could not prove the shared secret")) fail_msg("client: %s", cli.msg);
    assert_int_equal(srv.st, KVT_EAUTH);
    if (!strstr(srv.msg, "hung up instead of proving")) fail_msg("server: %s", srv.msg);
}

/* A rank-group client at a PD endpoint: the endpoint refuses the hello
 * (another realm's magic), and the client says what it reached. */
static void group_client_at_pd_endpoint(void **state)
{
    (void)state;
    end srv = {.a = pd_open};
    end cli = {.a = {.who = "net tcp: rank 1", .realm = &kvt__auth_group, .rank = 1, .ranks = 2}};
    pair(&srv, &cli);
    assert_int_equal(srv.st, KVT_EAUTH);
    if (!strstr(srv.msg, "malformed hello")) fail_msg("server: %s", srv.msg);
    assert_int_equal(cli.st, KVT_EAUTH);
    if (!strstr(cli.msg, "net tcp: rank 1: the hub is not a kvtier rank-group hub")) fail_msg("client: %s", cli.msg);
}

/* A PD client at a group hub's steps (as tcp.c drives them): refused as a
 * malformed hello, and the client reads that the server is no PD endpoint. */
static void pd_client_at_group_hub(void **state)
{
    (void)state;
    end srv = {.a = {.who = "hub", .realm = &kvt__auth_group, .ranks = 4}}, cli = {.a = pd_open};
    pair(&srv, &cli);
    assert_int_equal(srv.st, KVT_EAUTH);
    if (!strstr(srv.msg, "malformed hello")) fail_msg("server: %s", srv.msg);
    assert_int_equal(cli.st, KVT_EAUTH);
    if (!strstr(cli.msg, "pd test: the server is not a kvtier PD endpoint")) fail_msg("client: %s", cli.msg);
}

/* The group realm's claim: rank 0, a rank beyond the group, or another
 * group size are refused; a valid claim with the secret passes, and the
 * hub's steps read the claimed rank. */
static void group_claims_checked(void **state)
{
    (void)state;
    const uint8_t *s = (const uint8_t *)SECRET;
    struct { uint32_t rank, ranks; kvt_status want; } cases[] = {
        {0, 4, KVT_EAUTH}, {4, 4, KVT_EAUTH}, {1, 3, KVT_EAUTH}, {3, 4, KVT_OK}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        end srv = {.a = {.secret = s, .secret_len = sizeof SECRET - 1, .who = "hub", .realm = &kvt__auth_group, .ranks = 4}};
        end cli = {.a = {.secret = s, .secret_len = sizeof SECRET - 1, .who = "rank", .realm = &kvt__auth_group,
                             .rank = cases[i].rank, .ranks = cases[i].ranks}};
        pair(&srv, &cli);
        assert_int_equal(cli.st, cases[i].want);
        assert_int_equal(srv.st, cases[i].want);
        if (cases[i].want != KVT_OK && !strstr(cli.msg, "the hub refused: rank unknown, duplicate or group size differs"))
            fail_msg("case %zu: %s", i, cli.msg);
    }
    uint8_t hello[KVT_AUTH_HELLO] = {0}, chal[KVT_AUTH_CHAL];
    kvt_stream_auth hub = {.who = "hub", .realm = &kvt__auth_group, .ranks = 4};
    hello[0] = 'K', hello[1] = 'V', hello[2] = 'T', hello[3] = 'A', hello[4] = 1, hello[8] = 2, hello[12] = 4;
    assert_int_equal(kvt__auth_hello(&hub, hello, chal), KVT_AUTH_OK);
    assert_int_equal(kvt__auth_hello_rank(hello), 2);
    hello[4] = 2; /* another version: refused with the hub's own in the high half */
    assert_int_equal(kvt__auth_hello(&hub, hello, chal), KVT_AUTH_BAD_VERSION | 1u << 16);
    hello[0] = 'X'; /* not the realm's magic */
    assert_int_equal(kvt__auth_hello(&hub, hello, chal), KVT_AUTH_BAD_HELLO);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(secretless_server_is_not_joined),
        cmocka_unit_test(group_client_at_pd_endpoint),
        cmocka_unit_test(pd_client_at_group_hub),
        cmocka_unit_test(group_claims_checked),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
