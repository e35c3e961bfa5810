/* stream_tcp.c - the TCP stream: non-blocking sockets, writev/readv loops
 * bounded by the caller's deadline. TCP_NODELAY for the small control
 * frames; large payloads go as one writev of many iovecs (the page pieces),
 * IOV_MAX at a time, so the data path makes one syscall per ~MiBs. The
 * sockets are set up by sock.c (4 MiB buffers: fewer wake-ups on the data
 * path), and authenticated by the one handshake (stream_auth.c). */
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "net/fdio.h"
#include "net/sock.h"
#include "net/stream.h"
#include "util/clock.h"
#include "util/err.h"

/* A TCP stream keeps one iovec array to mutate while advancing (callers'
 * arrays stay intact); it grows to the largest call and is then reused, so
 * the data path allocates nothing per batch. */
typedef struct tcp_stream {
    kvt_stream base;
    struct iovec *scratch;
    int scratch_cap;
} tcp_stream;

/* The caller's iovecs copied into the stream's scratch array (*out). */
static kvt_status scratch_copy(tcp_stream *t, const struct iovec *iov, int cnt, struct iovec **out)
{
    if (cnt > t->scratch_cap) {
        struct iovec *v = malloc((size_t)cnt * sizeof *v);
        if (!v) return kvt__fail(KVT_ENOMEM, "stream: out of memory for %d iovecs", cnt);
        free(t->scratch);
        t->scratch = v;
        t->scratch_cap = cnt;
    }
    if (cnt) memcpy(t->scratch, iov, (size_t)cnt * sizeof *iov);
    *out = t->scratch;
    return KVT_OK;
}

static kvt_status tcp_io(kvt_stream *s, const struct iovec *iov, int cnt, uint64_t dl, int w)
{
    struct iovec *v = NULL;
    kvt_status st = scratch_copy((tcp_stream *)s, iov, cnt, &v);
    return st ? st : kvt__stream_fd_io(s->fd, v, cnt, dl, w);
}

static kvt_status tcp_sendv(kvt_stream *s, const struct iovec *iov, int cnt, uint64_t dl)
{
    return tcp_io(s, iov, cnt, dl, 1);
}

static kvt_status tcp_recvv(kvt_stream *s, const struct iovec *iov, int cnt, uint64_t dl)
{
    return tcp_io(s, iov, cnt, dl, 0);
}

/* recvv in reads of at most LANDED_READ bytes, each reported as it lands:
 * the caller hashes a chunk while it is in cache, not after the whole
 * batch has gone through it (stream.h). */
#define LANDED_READ (1u << 20)

static kvt_status tcp_recvv_landed(kvt_stream *s, const struct iovec *iov, int cnt, uint64_t dl,
                                   uint64_t idle_ns, void (*landed)(void *arg, size_t n), void *arg)
{
    struct iovec *v = NULL;
    kvt_status st = scratch_copy((tcp_stream *)s, iov, cnt, &v);
    return st ? st : kvt__fd_readv_landed(s->fd, v, cnt, dl, idle_ns, LANDED_READ, landed, arg);
}

static int tcp_wait(kvt_stream *s, int wake_fd, int timeout_ms)
{
    struct pollfd p[2] = {{s->fd, POLLIN, 0}, {wake_fd, POLLIN, 0}};
    int rc = poll(p, wake_fd >= 0 ? 2 : 1, timeout_ms);
    if (rc <= 0) return KVT_STREAM_IDLE;
    if (p[0].revents & POLLIN) return KVT_STREAM_READABLE;
    if (p[0].revents & (POLLHUP | POLLERR)) return KVT_STREAM_HUP;
    return KVT_STREAM_WOKEN;
}

static void tcp_destroy(kvt_stream *s)
{
    close(s->fd);
    kvt__stream_tcp_free_shell(s);
}

void kvt__stream_tcp_free_shell(kvt_stream *s)
{
    free(((tcp_stream *)s)->scratch);
    free(s);
}

static const kvt_stream_ops tcp_ops = {"tcp", tcp_sendv, tcp_recvv, tcp_wait, tcp_destroy,
                                       NULL, NULL, NULL, tcp_recvv_landed}; /* plain sends */

void kvt__stream_destroy(kvt_stream *s)
{
    if (s) s->ops->destroy(s);
}

kvt_status kvt__stream_listen(const char *host, uint16_t port, int *fd_out, uint16_t *port_out)
{
    return kvt__sock_listen(host, port, "stream", fd_out, port_out);
}

kvt_status kvt__stream_tcp_wrap(int fd, kvt_stream **out)
{
    tcp_stream *t = calloc(1, sizeof *t);
    if (!t) return kvt__fail(KVT_ENOMEM, "stream: out of memory");
    t->base.ops = &tcp_ops;
    t->base.fd = fd;
    *out = &t->base;
    return KVT_OK;
}

/* As kvt__stream_tcp_wrap, closing fd on failure. */
static kvt_status wrap(int fd, kvt_stream **out)
{
    kvt_status st = kvt__stream_tcp_wrap(fd, out);
    if (st) close(fd);
    return st;
}

kvt_status kvt__stream_accept(int lfd, uint64_t deadline_ns, kvt_stream **out)
{
    if (kvt__fd_wait(lfd, POLLIN, deadline_ns) != KVT_OK) return KVT_EAGAIN;
    int fd = kvt__sock_accept(lfd, true, NULL);
    if (fd < 0) return KVT_EAGAIN;
    return wrap(fd, out);
}

kvt_status kvt__stream_connect(const char *host, uint16_t port, const kvt_stream_auth *auth,
                               uint64_t deadline_ns, kvt_stream **out)
{
    struct sockaddr_in sa;
    kvt_status st = kvt__sock_addr(host, port, &sa, auth->who);
    if (st) return st;
    int fd = -1;
    while ((st = kvt__sock_dial(&sa, true, deadline_ns, &fd)) == KVT_ECONN && kvt__now_ns() < deadline_ns) {
        struct timespec ts = {0, 20 * 1000000};
        nanosleep(&ts, NULL); /* the server may not listen yet: retry until the deadline */
    }
    if (st == KVT_ECONN)
        return kvt__fail(st, "%s: cannot connect to %s:%u", auth->who, host ? host : "127.0.0.1", port);
    if (st) { /* a local fault (no descriptor ...): keep its cause */
        char why[KVT_ERRMSG_MAX];
        snprintf(why, sizeof why, "%s", kvt_last_error());
        return kvt__fail(st, "%s: cannot connect to %s:%u: %s", auth->who, host ? host : "127.0.0.1", port,
                         why);
    }
    st = kvt__stream_auth_client(fd, auth, deadline_ns);
    if (st) {
        char msg[KVT_ERRMSG_MAX];
        snprintf(msg, sizeof msg, "%s", kvt_last_error());
        close(fd);
        return kvt__fail(st, "%s (%s:%u)", msg, host ? host : "127.0.0.1", port);
    }
    return wrap(fd, out);
}
