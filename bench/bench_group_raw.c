/* bench_group_raw.c - this machine's floor for a group step: the same star
 * exchange as kvtier's TCP group step (every member sends PAYLOAD bytes to
 * the hub, the hub answers each), over plain blocking loopback sockets with
 * TCP_NODELAY, no framing, checksums or deadlines. kvtier's step latency is
 * reported against it. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "bench_group_raw.h"
#include "util/clock.h"

#define RAW_PAYLOAD 40
#define RAW_MAX_RANKS 16

typedef struct raw_member {
    uint16_t port;
    uint32_t steps;
    int ok;
} raw_member;

static int full_io(int fd, void *p, size_t n, int writing)
{
    uint8_t *b = p;
    while (n > 0) {
        ssize_t k = writing ? send(fd, b, n, MSG_NOSIGNAL) : recv(fd, b, n, 0);
        if (k <= 0) return -1;
        b += k;
        n -= (size_t)k;
    }
    return 0;
}

static int connect_hub(uint16_t port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (fd < 0) return -1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static void *member_main(void *p)
{
    raw_member *m = p;
    int fd = connect_hub(m->port);
    uint8_t buf[RAW_PAYLOAD] = {1};
    for (uint32_t i = 0; fd >= 0 && i < m->steps; i++)
        if (full_io(fd, buf, sizeof buf, 1) || full_io(fd, buf, sizeof buf, 0)) break;
        else if (i + 1 == m->steps) m->ok = 1;
    if (fd >= 0) close(fd);
    return NULL;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The hub: steps rounds of read-all-then-answer-all; latencies into lat. */
static int hub_steps(const int *fds, uint32_t n, uint32_t steps, double *lat)
{
    uint8_t buf[RAW_PAYLOAD];
    for (uint32_t i = 0; i < steps; i++) {
        uint64_t t0 = kvt__now_ns();
        for (uint32_t r = 0; r < n; r++)
            if (full_io(fds[r], buf, sizeof buf, 0)) return -1;
        for (uint32_t r = 0; r < n; r++)
            if (full_io(fds[r], buf, sizeof buf, 1)) return -1;
        lat[i] = (double)(kvt__now_ns() - t0) / 1000.0;
    }
    return 0;
}

static int listen_any(uint16_t *port)
{
    int l = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof sa;
    if (l < 0) return -1;
    if (bind(l, (struct sockaddr *)&sa, sizeof sa) || listen(l, RAW_MAX_RANKS) ||
        getsockname(l, (struct sockaddr *)&sa, &sl)) {
        close(l);
        return -1;
    }
    *port = ntohs(sa.sin_port);
    return l;
}

int kvt_bench_raw_star(uint32_t ranks, uint32_t steps, double *p50, double *p99)
{
    if (ranks < 2 || ranks > RAW_MAX_RANKS || steps == 0) return -1;
    uint16_t port;
    int l = listen_any(&port), fds[RAW_MAX_RANKS], one = 1, rc = -1;
    double *lat = malloc(sizeof *lat * steps);
    pthread_t th[RAW_MAX_RANKS];
    raw_member m[RAW_MAX_RANKS];
    uint32_t n = 0, started = 0;
    if (l < 0 || !lat) goto done;
    for (; started < ranks - 1; started++) {
        m[started] = (raw_member){port, steps, 0};
        if (pthread_create(&th[started], NULL, member_main, &m[started])) break;
    }
    for (; n < started; n++) {
        fds[n] = accept(l, NULL, NULL);
        if (fds[n] < 0) break;
        setsockopt(fds[n], IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    }
    if (n == ranks - 1 && hub_steps(fds, n, steps, lat) == 0) {
        qsort(lat, steps, sizeof *lat, cmp_double);
        *p50 = lat[steps / 2];
        *p99 = lat[(size_t)(steps * 0.99)];
        rc = 0;
    }
    for (uint32_t r = 0; r < n; r++) close(fds[r]); /* members see EOF and stop */
    for (uint32_t r = 0; r < started; r++) pthread_join(th[r], NULL);
done:
    if (l >= 0) close(l);
    free(lat);
    return rc;
}
