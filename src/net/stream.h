/* stream.h - connection-oriented streams between client/server peers (the
 * PD bootstrap service, senders and receivers), behind one ops table: TCP,
 * and UCX (tag messages; set up over an authenticated TCP connection that
 * stays open as the liveness signal). Unlike net.h (a fixed rank mesh),
 * peers here are arbitrary and come and go.
 *
 * Semantics: message-oriented. sendv sends one message (the iovecs'
 * concatenation); recvv receives exactly one message whose length the
 * caller knows (the protocol above always knows it: fixed headers, then
 * lengths from the header). Every call has a monotonic deadline. */
#ifndef KVT_NET_STREAM_H
#define KVT_NET_STREAM_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>
#include "kvtier.h"
#include "net/fdio.h"

typedef struct kvt_stream kvt_stream;

enum { KVT_STREAM_READABLE = 1, KVT_STREAM_WOKEN = 2, KVT_STREAM_IDLE = 3, KVT_STREAM_HUP = 4 };

typedef struct kvt_stream_ops {
    const char *name;
    /* KVT_OK, KVT_ETIMEDOUT, KVT_ECONN. */
    kvt_status (*sendv)(kvt_stream *s, const struct iovec *iov, int iovcnt, uint64_t deadline_ns);
    kvt_status (*recvv)(kvt_stream *s, const struct iovec *iov, int iovcnt, uint64_t deadline_ns);
    /* Waits up to timeout_ms for a message, or for wake_fd (may be -1) to
     * become readable: one of KVT_STREAM_*. */
    int (*wait)(kvt_stream *s, int wake_fd, int timeout_ms);
    void (*destroy)(kvt_stream *s);
    /* Optional (NULL: use sendv). Like sendv, but may return with the message
     * still in flight: pieces < 64 KiB are copied before it returns, larger
     * ones are read from the caller's memory until the next sendv or flush
     * returns (both wait for every earlier message). Lets a sender prepare
     * its next message while this one moves. */
    kvt_status (*sendv_async)(kvt_stream *s, const struct iovec *iov, int iovcnt,
                              uint64_t deadline_ns);
    kvt_status (*flush)(kvt_stream *s, uint64_t deadline_ns);
    /* Optional (NULL: the socket already orders data before its close).
     * Before an orderly close of the socket: everything sent so far has
     * reached the peer by deadline_ns (best effort), so the hang-up the peer
     * sees next cannot overtake the last messages (a DONE_ACK). */
    void (*farewell)(kvt_stream *s, uint64_t deadline_ns);
    /* Optional (NULL: recvv, then one call with every byte). Like recvv, but
     * calls landed(arg, n) each time the first n bytes of iov (n grows) have
     * landed, so the caller can work on them (checksums, while in cache)
     * with the receives that follow still posted. landed may not use the
     * stream. On failure every receive it posted is cancelled and reaped
     * before it returns; a request UCX still holds after a forced close is
     * only released with the worker, so the caller must destroy the stream
     * before it lets iov's memory go (as receiver.c on_data does). */
    kvt_status (*recvv_landed)(kvt_stream *s, const struct iovec *iov, int iovcnt, uint64_t deadline_ns,
                               void (*landed)(void *arg, size_t n), void *arg);
} kvt_stream_ops;

struct kvt_stream {
    const kvt_stream_ops *ops;
    int fd; /* the TCP socket (also under UCX) */
};

typedef struct kvt_stream_auth {
    const uint8_t *secret; /* NULL: none */
    size_t secret_len;
    const char *who;       /* for messages: "pd sender", ... */
    uint8_t *session_key;  /* out (32 bytes; NULL: not wanted): after a handshake
                              with a secret, a key fresh to this connection that
                              only the two ends know (pd/mac.h keys frames by it) */
} kvt_stream_auth;

/* A listening socket on host:port (port 0: ephemeral); *port_out gets it. */
kvt_status kvt__stream_listen(const char *host, uint16_t port, int *fd_out, uint16_t *port_out);
/* Accepts one connection if one is pending by deadline_ns. KVT_EAGAIN:
 * none. The caller runs kvt__stream_auth_server on its own thread, so a
 * slow stranger never holds up the accept loop. */
kvt_status kvt__stream_accept(int lfd, uint64_t deadline_ns, kvt_stream **out);
/* Connects, retrying refused connections until deadline_ns, then runs the
 * client side of the handshake. */
kvt_status kvt__stream_connect(const char *host, uint16_t port, const kvt_stream_auth *auth,
                               uint64_t deadline_ns, kvt_stream **out);
/* Moves an established, authenticated TCP stream's traffic onto UCX (both
 * sides call it; they swap worker addresses over the socket). The socket
 * stays open: its hang-up is how each side learns the other died. */
kvt_status kvt__stream_ucx_upgrade(kvt_stream **s, int server, uint64_t deadline_ns);
/* Test hook, for tests/fuzz/fuzz_ucx_stream.c only (kvtier never calls it):
 * sends len bytes as exactly one UCP tag message on a UCX stream, as a peer
 * may (sendv cuts its bytes into messages of at most 1 MiB), and waits for
 * it by deadline_ns. */
kvt_status kvt__stream_ucx_send_msg(kvt_stream *s, const void *p, size_t len, uint64_t deadline_ns);
/* Frees a TCP stream without closing its socket (whose fd moved to another
 * stream: the UCX upgrade). */
void kvt__stream_tcp_free_shell(kvt_stream *s);

static inline kvt_status kvt__stream_send(kvt_stream *s, const void *p, size_t len, uint64_t dl)
{
    struct iovec v = {(void *)p, len};
    return s->ops->sendv(s, &v, 1, dl);
}

static inline kvt_status kvt__stream_recvv_landed(kvt_stream *s, const struct iovec *iov, int cnt,
                                                  uint64_t dl, void (*landed)(void *arg, size_t n),
                                                  void *arg)
{
    if (s->ops->recvv_landed) return s->ops->recvv_landed(s, iov, cnt, dl, landed, arg);
    kvt_status st = s->ops->recvv(s, iov, cnt, dl);
    size_t n = 0;
    for (int i = 0; i < cnt; i++) n += iov[i].iov_len;
    if (!st) landed(arg, n);
    return st;
}

static inline kvt_status kvt__stream_recv(kvt_stream *s, void *p, size_t len, uint64_t dl)
{
    struct iovec v = {p, len};
    return s->ops->recvv(s, &v, 1, dl);
}

void kvt__stream_destroy(kvt_stream *s);

/* Raw socket helpers (stream_tcp.c), also used by the handshake. */
static inline kvt_status kvt__stream_fd_io(int fd, struct iovec *iov, int iovcnt,
                                           uint64_t deadline_ns, int writing)
{
    return kvt__fd_io(fd, iov, iovcnt, deadline_ns, writing);
}
/* The handshake (stream_auth.c): mutual HMAC-SHA256 over both nonces;
 * auth->session_key receives the connection's key (see above). */
kvt_status kvt__stream_auth_server(int fd, const kvt_stream_auth *auth, uint64_t deadline_ns);
kvt_status kvt__stream_auth_client(int fd, const kvt_stream_auth *auth, uint64_t deadline_ns);

#endif
