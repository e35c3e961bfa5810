/* test_conc_net_hub.c - the TCP hub handshakes connections side by side:
 * strangers that connect first and stay silent, send garbage, stop half
 * way, or claim a rank and never prove it cost only their own slot, not
 * the group's formation time (issue 14 item 6: 3 silent sockets used to
 * delay formation 3 s, 12 made it fail). */
#include "test_group_util.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include "net/net.h"
#include "net/tcp.h"
#include "util/le.h"

#define RANKS 4
#define SILENT 16
#define GARBAGE 4
#define HALF 4
/* The HELLO's size on the wire (stream_auth.c): magic, version, flags, rank,
 * ranks, nonce. */
#define HELLO_LEN (4 + 2 + 2 + 4 + 4 + 32)

/* Refusal lines that name the stranger's address. */
static int refusals_named;
static void count_refusals(void *user, kvt_log_level level, const char *line)
{
    if (level == KVT_LOG_WARN && strstr(line, "refused connection from 127.0.0.1:"))
        refusals_named++;
}

typedef struct members {
    uint16_t port;
    const char *secret;
    kvt_status st[RANKS];
} members;

static void member(uint32_t rank, void *arg)
{
    members *m = arg;
    if (rank == 0) return; /* the hub runs in the test's own thread */
    kvt_net_tcp_params p = {rank, RANKS, "127.0.0.1", m->port, m->secret,
                            m->secret ? strlen(m->secret) : 0, 0};
    kvt_net *n;
    m->st[rank] = kvt_net_tcp_create(&n, &p);
    if (m->st[rank] != KVT_OK) return;
    m->st[rank] = kvt_net_connect(n, 10000);
    kvt_net_destroy(n);
}

static void *run_members(void *arg)
{
    tg_run_ranks(RANKS, member, arg);
    return NULL;
}

/* A blocking connection to the hub (the kernel completes it from the
 * listen backlog before the hub accepts). */
static int stranger(uint16_t port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    return fd;
}

/* A well-formed HELLO claiming rank (no secret flag). */
static void hello_for(uint8_t h[HELLO_LEN], uint32_t rank)
{
    memset(h, 0x5a, HELLO_LEN);
    kvt__put32(h, 0x4154564bu); /* "KVTA" */
    h[4] = 1;
    h[5] = h[6] = h[7] = 0;
    kvt__put32(h + 8, rank);
    kvt__put32(h + 12, RANKS);
}

/* Whether the hub closed fd (EOF or reset), within ms. Reads and discards
 * what the hub sent first (a refusal, a challenge). */
static bool closed_within(int fd, int ms)
{
    uint64_t dl = kvt__deadline_ns(ms);
    for (;;) {
        struct pollfd p = {fd, POLLIN, 0};
        uint64_t now = kvt__now_ns();
        if (now >= dl) return false;
        if (poll(&p, 1, (int)((dl - now) / 1000000) + 1) <= 0) continue;
        char buf[256];
        ssize_t n = recv(fd, buf, sizeof buf, 0);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) return true;
    }
}

static void form_among_strangers(const char *secret)
{
    kvt_net_tcp_params hp = {0, RANKS, NULL, 0, secret, secret ? strlen(secret) : 0, 4096};
    kvt_net *hub;
    assert_ok(kvt_net_tcp_create(&hub, &hp));
    members m = {.secret = secret};
    assert_ok(kvt_net_tcp_port(hub, &m.port));

    /* Strangers first, all in the backlog before the hub accepts anything:
     * silent ones; ones that send garbage; ones that send half a hello and
     * stop; and (no secret) ones that send a valid hello claiming each
     * member's rank, then never send the proof. */
    int fds[SILENT + GARBAGE + HALF + RANKS];
    int nf = 0;
    for (int i = 0; i < SILENT; i++) fds[nf++] = stranger(m.port);
    for (int i = 0; i < GARBAGE; i++) {
        fds[nf] = stranger(m.port);
        char junk[HELLO_LEN + 16];
        memset(junk, 'G' + i, sizeof junk);
        assert_int_equal(send(fds[nf++], junk, sizeof junk, MSG_NOSIGNAL), (ssize_t)sizeof junk);
    }
    for (int i = 0; i < HALF; i++) {
        fds[nf] = stranger(m.port);
        uint8_t h[HELLO_LEN];
        hello_for(h, 1);
        assert_int_equal(send(fds[nf++], h, 10, MSG_NOSIGNAL), 10);
    }
    int squatters = 0;
    if (!secret) {
        for (uint32_t r = 1; r < RANKS; r++) {
            fds[nf] = stranger(m.port);
            uint8_t h[HELLO_LEN];
            hello_for(h, r);
            assert_int_equal(send(fds[nf++], h, sizeof h, MSG_NOSIGNAL), (ssize_t)sizeof h);
            squatters++;
        }
    }

    refusals_named = 0;
    assert_ok(kvt_set_log_handler(count_refusals, NULL));
    uint64_t t0 = kvt__now_ns();
    pthread_t th;
    pthread_create(&th, NULL, run_members, &m);
    /* The normal deadline of a 4-rank formation: the old hub spent 1 s on
     * each silent stranger in turn and failed here. */
    assert_ok(kvt_net_connect(hub, 3000));
    uint64_t ms = (kvt__now_ns() - t0) / 1000000;
    pthread_join(th, NULL);
    for (uint32_t r = 1; r < RANKS; r++) assert_int_equal(m.st[r], KVT_OK);
    /* the garbage ones were refused at once, not at their deadline */
    assert_true(kvt__net_tcp_refused(hub) >= GARBAGE);
    /* every stranger is closed once formation ends (or by its own 1 s
     * deadline), not left holding a descriptor */
    for (int i = 0; i < nf; i++) {
        if (!closed_within(fds[i], 2000)) fail_msg("stranger %d of %d still open", i, nf);
        close(fds[i]);
    }
    /* each stranger's refusal was logged once, naming its address */
    assert_ok(kvt_set_log_handler(NULL, NULL));
    assert_int_equal(refusals_named, nf);
    print_message("formed in %llu ms among %d strangers (%d squatting on ranks)\n",
                  (unsigned long long)ms, nf, squatters);
    kvt_net_destroy(hub);
}

static void test_hub_strangers_no_secret(void **state)
{
    form_among_strangers(NULL);
}

static void test_hub_strangers_with_secret(void **state)
{
    form_among_strangers("0123456789abcdef-secret");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hub_strangers_no_secret),
        cmocka_unit_test(test_hub_strangers_with_secret),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
