/* test_conc_fdio_tcp.c - kvt__fd_readv_landed over real TCP loopback, where
 * poll honours SO_RCVLOWAT: the mark is back to 1 after every read (a
 * 48-byte header wakes the next poll at once) and small receive buffers
 * do not stall a raised mark. */
#include "support.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include "net/fdio.h"
#include "util/clock.h"

static void nb(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); }

/* sv[0]: writer, sv[1]: reader; rcvbuf/sndbuf 0: leave default */
static void tcp_pair(int sv[2], int rcvbuf, int sndbuf)
{
    int l = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof sa;
    assert_int_equal(bind(l, (struct sockaddr *)&sa, sizeof sa), 0);
    assert_int_equal(listen(l, 1), 0);
    assert_int_equal(getsockname(l, (struct sockaddr *)&sa, &sl), 0);
    int c = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    if (sndbuf) setsockopt(c, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof sndbuf);
    assert_int_equal(connect(c, (struct sockaddr *)&sa, sizeof sa), 0);
    int a = accept(l, NULL, NULL);
    assert_true(a >= 0);
    close(l);
    setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(a, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (rcvbuf) setsockopt(a, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
    nb(c);
    nb(a);
    sv[0] = c;
    sv[1] = a;
}

static int lowat(int fd)
{
    int v = -1;
    socklen_t l = sizeof v;
    getsockopt(fd, SOL_SOCKET, SO_RCVLOWAT, &v, &l);
    return v;
}

static void noop(void *arg, size_t n) { (void)arg, (void)n; }

typedef struct writer {
    int fd;
    const uint8_t *p;
    size_t len, piece;
    int delay_ms;
} writer;

static void *write_slow(void *arg)
{
    writer *w = arg;
    for (size_t off = 0; off < w->len; off += w->piece) {
        size_t k = w->piece < w->len - off ? w->piece : w->len - off;
        if (w->delay_ms) {
            struct timespec ts = {0, (long)w->delay_ms * 1000000L};
            nanosleep(&ts, NULL);
        }
        struct iovec v = {(void *)(w->p + off), k};
        if (kvt__fd_io(w->fd, &v, 1, kvt__deadline_ns(20000), 1)) break;
    }
    return NULL;
}

/* A landed read that had to sleep leaves the socket at lowat 1, so a 48-byte
 * header then wakes poll at once. */
static void lowat_reset_after_read(void **state)
{
    (void)state;
    enum { LEN = 3 << 20 };
    uint8_t *src = malloc(LEN), *dst = calloc(1, LEN);
    for (size_t i = 0; i < LEN; i++) src[i] = (uint8_t)(i * 7 + 3);
    int sv[2];
    tcp_pair(sv, 0, 0);
    writer w = {sv[0], src, LEN, 200000, 5};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, write_slow, &w), 0);
    struct iovec v[3] = {{dst, 1000}, {dst + 1000, 2 << 20}, {dst + 1000 + (2 << 20), LEN - 1000 - (2 << 20)}};
    assert_ok(kvt__fd_readv_landed(sv[1], v, 3, kvt__deadline_ns(20000), 0, 1 << 20, noop, NULL));
    pthread_join(th, NULL);
    assert_memory_equal(src, dst, LEN);
    assert_int_equal(lowat(sv[1]), 1);
    uint8_t hdr[48] = {1};
    assert_int_equal(write(sv[0], hdr, sizeof hdr), 48);
    struct pollfd p = {sv[1], POLLIN, 0};
    assert_int_equal(poll(&p, 1, 1000), 1);
    /* timeout path */
    struct iovec t = {dst, 1000};
    assert_int_equal(read(sv[1], hdr, 48), 48);
    assert_int_equal(write(sv[0], src, 300), 300);
    assert_status(kvt__fd_readv_landed(sv[1], &t, 1, kvt__deadline_ns(200), 0, 1 << 20, noop, NULL), KVT_ETIMEDOUT);
    assert_int_equal(lowat(sv[1]), 1);
    assert_int_equal(write(sv[0], hdr, sizeof hdr), 48);
    assert_int_equal(poll(&p, 1, 1000), 1);
    close(sv[0]);
    close(sv[1]);
    free(src);
    free(dst);
}

/* A receive buffer far below max_read: the raised lowat must not wait for
 * more than the window lets in (a stall would run into the 20 s deadline). */
static void small_rcvbuf_no_stall(void **state)
{
    (void)state;
    enum { LEN = 16 << 20 };
    int bufs[] = {16384, 65536, 212992, 1 << 20};
    for (int b = 0; b < 4; b++) {
        uint8_t *src = malloc(LEN), *dst = calloc(1, LEN);
        for (size_t i = 0; i < LEN; i++) src[i] = (uint8_t)(i * 13 + b);
        int sv[2];
        tcp_pair(sv, bufs[b], bufs[b]);
        writer w = {sv[0], src, LEN, LEN, 0};
        pthread_t th;
        assert_int_equal(pthread_create(&th, NULL, write_slow, &w), 0);
        struct iovec v = {dst, LEN};
        uint64_t t0 = kvt__now_ns();
        assert_ok(kvt__fd_readv_landed(sv[1], &v, 1, kvt__deadline_ns(20000), 0, 1 << 20, noop, NULL));
        uint64_t ms = (kvt__now_ns() - t0) / 1000000;
        pthread_join(th, NULL);
        print_message("rcvbuf %d: 16 MiB in %llu ms, lowat now %d\n", bufs[b], (unsigned long long)ms, lowat(sv[1]));
        assert_memory_equal(src, dst, LEN);
        close(sv[0]);
        close(sv[1]);
        free(src);
        free(dst);
    }
}

/* Reads len bytes written piece bytes every delay_ms with an idle bound
 * of idle_ms and a whole-read bound of hard_ms; *ms gets how long it took. */
static kvt_status slow_read(size_t len, size_t piece, int delay_ms, int idle_ms, int hard_ms, uint64_t *ms)
{
    uint8_t *src = malloc(len), *dst = calloc(1, len);
    for (size_t i = 0; i < len; i++) src[i] = (uint8_t)(i * 11 + 5);
    int sv[2];
    tcp_pair(sv, 0, 0);
    writer w = {sv[0], src, len, piece, delay_ms};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, write_slow, &w), 0);
    struct iovec v = {dst, len};
    uint64_t t0 = kvt__now_ns();
    kvt_status st = kvt__fd_readv_landed(sv[1], &v, 1, kvt__deadline_ns(hard_ms), (uint64_t)idle_ms * 1000000u,
                                         1 << 20, noop, NULL);
    *ms = (kvt__now_ns() - t0) / 1000000;
    close(sv[1]); /* the writer's next send fails: it stops */
    pthread_join(th, NULL);
    close(sv[0]);
    if (!st) assert_memory_equal(src, dst, len);
    free(src);
    free(dst);
    return st;
}

/* A slow link that keeps moving is not a silent one: a read that takes
 * several idle bounds lands every byte as long as no bound passes without
 * a byte, whether the pieces reach SO_RCVLOWAT (256 KiB) or not (1000 B,
 * below the raised mark) (regression: PD batches failed "payload timed out"
 * after peer_timeout_ms in all while bytes flowed, under sanitizer load). */
static void slow_but_moving_read_lands(void **state)
{
    (void)state;
    uint64_t ms;
    assert_ok(slow_read(2u << 20, 256u << 10, 150, 500, 20000, &ms));
    print_message("2 MiB in 256 KiB pieces every 150 ms: %llu ms\n", (unsigned long long)ms);
    assert_true(ms >= 1000); /* it really took longer than the idle bound */
    assert_ok(slow_read(12000, 1000, 100, 500, 20000, &ms));
    print_message("12000 B in 1000 B pieces every 100 ms: %llu ms\n", (unsigned long long)ms);
    assert_true(ms >= 1000);
}

/* Silence past the idle bound ends the read early; a trickle that never
 * goes silent still ends at the whole-read bound. */
static void silence_and_trickle_end_the_read(void **state)
{
    (void)state;
    uint64_t ms;
    /* 300 of 1000 bytes, then nothing */
    uint8_t buf[1000], data[300] = {0};
    int sv[2];
    tcp_pair(sv, 0, 0);
    assert_int_equal(write(sv[0], data, sizeof data), (ssize_t)sizeof data);
    struct iovec v = {buf, sizeof buf};
    uint64_t t0 = kvt__now_ns();
    assert_status(kvt__fd_readv_landed(sv[1], &v, 1, kvt__deadline_ns(20000), 200000000u, 1 << 20, noop, NULL),
                  KVT_ETIMEDOUT);
    ms = (kvt__now_ns() - t0) / 1000000;
    assert_true(ms >= 190 && ms < 5000); /* the idle bound, not the 20 s one */
    close(sv[0]);
    close(sv[1]);
    /* 100 bytes at 50 and at 100 ms (below the raised SO_RCVLOWAT), then
     * silence: found within 1.25 x the 600 ms idle bound of the last byte
     * (regression: those bytes were read only at the idle deadline, which
     * then moved a whole bound on: 1200 ms) */
    uint8_t src[200] = {0};
    tcp_pair(sv, 0, 0);
    writer w = {sv[0], src, sizeof src, 100, 50};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, write_slow, &w), 0);
    v = (struct iovec){buf, sizeof buf};
    t0 = kvt__now_ns();
    assert_status(kvt__fd_readv_landed(sv[1], &v, 1, kvt__deadline_ns(20000), 600000000u, 1 << 20, noop, NULL),
                  KVT_ETIMEDOUT);
    ms = (kvt__now_ns() - t0) / 1000000;
    pthread_join(th, NULL);
    print_message("silent after 100 ms, idle bound 600 ms: ended at %llu ms\n", (unsigned long long)ms);
    assert_true(ms >= 690 && ms < 1000);
    close(sv[0]);
    close(sv[1]);
    /* 100 bytes every 50 ms for ever: the 800 ms whole-read bound ends it */
    assert_status(slow_read(1u << 20, 100, 50, 300, 800, &ms), KVT_ETIMEDOUT);
    assert_true(ms >= 790 && ms < 5000);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(lowat_reset_after_read),
        cmocka_unit_test(small_rcvbuf_no_stall),
        cmocka_unit_test(slow_but_moving_read_lands),
        cmocka_unit_test(silence_and_trickle_end_the_read),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
