/* test_net_fdio.c - deadline-bounded socket reads that report what landed
 * (kvt__fd_readv_landed, behind the TCP stream's recvv_landed): every byte
 * lands where the iovecs say, reads never exceed max_read, reports grow to
 * the total, and a peer that hangs up or stays silent ends the read. */
#include "support.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include "net/fdio.h"
#include "util/clock.h"

typedef struct report {
    size_t seen[4096];
    int n;
} report;

static void landed(void *arg, size_t n)
{
    report *r = arg;
    if (r->n < 4096) r->seen[r->n] = n;
    r->n++;
}

typedef struct writer {
    int fd;
    const uint8_t *p;
    size_t len;
} writer;

/* Writes in odd-sized pieces so reads end at arbitrary offsets. */
static void *write_all(void *arg)
{
    writer *w = arg;
    for (size_t off = 0, k = 7; off < w->len; off += k, k = k * 3 % 65521 + 1) {
        if (k > w->len - off) k = w->len - off;
        struct iovec v = {(void *)(w->p + off), k};
        if (kvt__fd_io(w->fd, &v, 1, kvt__deadline_ns(10000), 1)) break;
    }
    return NULL;
}

static int pair(int sv[2])
{
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv)) return -1;
    for (int i = 0; i < 2; i++) fcntl(sv[i], F_SETFL, fcntl(sv[i], F_GETFL) | O_NONBLOCK);
    return 0;
}

static void test_lands_every_byte_in_capped_reads(void **state)
{
    (void)state;
    enum { LEN = 3 << 20, MAXR = 100000 };
    uint8_t *src = malloc(LEN), *dst = calloc(1, LEN);
    for (size_t i = 0; i < LEN; i++) src[i] = (uint8_t)(i * 131 + (i >> 12));
    /* pieces of uneven sizes, out of order in dst, one of them empty */
    size_t cuts[] = {0, 5, 4096, 4096, 70000, 1 << 20, LEN};
    struct iovec v[7];
    int n = 0;
    for (int i = 0; i + 1 < 7; i++) {
        size_t len = cuts[i + 1] - cuts[i];
        v[n++] = (struct iovec){dst + (LEN - cuts[i + 1]), len}; /* reversed placement */
    }
    v[n++] = (struct iovec){dst, 0};
    int sv[2];
    assert_int_equal(pair(sv), 0);
    writer w = {sv[0], src, LEN};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, write_all, &w), 0);
    report r = {.n = 0};
    assert_ok(kvt__fd_readv_landed(sv[1], v, n, kvt__deadline_ns(10000), 0, MAXR, landed, &r));
    pthread_join(th, NULL);
    for (int i = 0; i + 1 < 7; i++) {
        size_t len = cuts[i + 1] - cuts[i];
        assert_memory_equal(dst + (LEN - cuts[i + 1]), src + cuts[i], len);
    }
    assert_true(r.n >= LEN / MAXR);
    assert_true(r.n <= 4096);
    for (int i = 0; i < r.n; i++) {
        size_t prev = i ? r.seen[i - 1] : 0;
        assert_true(r.seen[i] > prev);          /* grows */
        assert_true(r.seen[i] - prev <= MAXR);  /* at most max_read a read */
    }
    assert_int_equal(r.seen[r.n - 1], LEN);
    close(sv[0]);
    close(sv[1]);
    free(src);
    free(dst);
}

static void test_hang_up_and_silence_end_the_read(void **state)
{
    (void)state;
    uint8_t buf[1000], data[300];
    memset(data, 0x5a, sizeof data);
    struct iovec v = {buf, sizeof buf};
    int sv[2];
    report r = {.n = 0};
    /* 300 of 1000 bytes, then silence: the deadline ends it */
    assert_int_equal(pair(sv), 0);
    assert_int_equal(write(sv[0], data, sizeof data), (ssize_t)sizeof data);
    uint64_t t0 = kvt__now_ns();
    assert_status(kvt__fd_readv_landed(sv[1], &v, 1, kvt__deadline_ns(100), 0, 64, landed, &r), KVT_ETIMEDOUT);
    assert_true(kvt__now_ns() - t0 < 5000000000ull);
    assert_int_equal(r.seen[r.n - 1], 300);
    assert_memory_equal(buf, data, 300);
    /* then a hang-up: KVT_ECONN, at once */
    close(sv[0]);
    v = (struct iovec){buf, sizeof buf};
    assert_status(kvt__fd_readv_landed(sv[1], &v, 1, kvt__deadline_ns(10000), 0, 64, landed, &r), KVT_ECONN);
    close(sv[1]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lands_every_byte_in_capped_reads),
        cmocka_unit_test(test_hang_up_and_silence_end_the_read),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
