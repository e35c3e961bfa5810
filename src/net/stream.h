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

#include <stdbool.h>
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
     * before it lets iov's memory go (as receiver.c on_data does).
     * idle_ns > 0: it also fails KVT_ETIMEDOUT once idle_ns pass without a
     * byte landing, and deadline_ns only bounds the whole read: a large
     * batch on a slow but live link is not failed as a silent one. */
    kvt_status (*recvv_landed)(kvt_stream *s, const struct iovec *iov, int iovcnt, uint64_t deadline_ns,
                               uint64_t idle_ns, void (*landed)(void *arg, size_t n), void *arg);
} kvt_stream_ops;

struct kvt_stream {
    const kvt_stream_ops *ops;
    int fd; /* the TCP socket (also under UCX) */
};

/* Who speaks the handshake (stream_auth.c): its magic and version, the
 * MAC labels of each direction, and words for messages. Three realms: PD
 * endpoints, rank-group hubs (whose clients also claim a rank) and the
 * node server's socket when it has a secret. */
typedef struct kvt_auth_realm {
    uint32_t magic;
    uint8_t version;
    const char *server_label, *client_label;
    const char *server_noun; /* "server", "hub" */
    const char *what;        /* "PD endpoint", "rank-group hub" */
    bool claims_rank;
} kvt_auth_realm;
extern const kvt_auth_realm kvt__auth_pd, kvt__auth_group, kvt__auth_server,
    kvt__auth_cluster;

typedef struct kvt_stream_auth {
    const uint8_t *secret; /* NULL: none */
    size_t secret_len;
    const char *who;       /* for messages: "pd sender", ... */
    uint8_t *session_key;  /* out (32 bytes; NULL: not wanted): after a handshake
                              with a secret, a key fresh to this connection that
                              only the two ends know (pd/mac.h keys frames by it) */
    const kvt_auth_realm *realm; /* NULL: kvt__auth_pd */
    uint32_t rank, ranks;  /* group realm: the rank a client claims (rank
                              unused on the hub) and the group's size */
    uint32_t refuse;       /* server: a refusal code decided before the
                              handshake (KVT_AUTH_NOT_ADMITTED), sent in
                              answer to a well-formed hello; 0: none */
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
/* Holds the process-wide UCP context, made now if there is none (it reads
 * UCX_TLS & co.; seconds under a sanitizer), so links upgraded later do not
 * pay its set-up inside their handshake deadlines; each hold is released
 * once. KVT_EUNSUPPORTED when UCX cannot start. Not across fork(): hold it
 * in the process that makes the streams. */
kvt_status kvt__stream_ucx_hold(void);
void kvt__stream_ucx_release(void);
/* Test hook, for tests/fuzz/fuzz_ucx_stream.c only (kvtier never calls it):
 * sends len bytes as exactly one UCP tag message on a UCX stream, as a peer
 * may (sendv cuts its bytes into messages of at most 1 MiB), and waits for
 * it by deadline_ns. */
kvt_status kvt__stream_ucx_send_msg(kvt_stream *s, const void *p, size_t len, uint64_t deadline_ns);
/* A connected, non-blocking socket as a TCP stream (KVT_ENOMEM: fd stays
 * the caller's). */
kvt_status kvt__stream_tcp_wrap(int fd, kvt_stream **out);
/* Frees a TCP stream without closing its socket (whose fd moved to another
 * stream: the UCX upgrade). */
void kvt__stream_tcp_free_shell(kvt_stream *s);

static inline kvt_status kvt__stream_send(kvt_stream *s, const void *p, size_t len, uint64_t dl)
{
    struct iovec v = {(void *)p, len};
    return s->ops->sendv(s, &v, 1, dl);
}

static inline kvt_status kvt__stream_recvv_landed(kvt_stream *s, const struct iovec *iov, int cnt,
                                                  uint64_t dl, uint64_t idle_ns,
                                                  void (*landed)(void *arg, size_t n), void *arg)
{
    if (s->ops->recvv_landed) return s->ops->recvv_landed(s, iov, cnt, dl, idle_ns, landed, arg);
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
/* The handshake (stream_auth.c), one for every TCP link kvtier makes:
 * mutual HMAC-SHA256 over the HELLO and the server's nonce. Blocking, by
 * deadline_ns: KVT_OK, KVT_EAUTH (refused, or no proof), KVT_ECONN (the
 * client: no answer to its hello), with a message. auth->session_key
 * receives the connection's key (see above). */
kvt_status kvt__stream_auth_server(int fd, const kvt_stream_auth *auth, uint64_t deadline_ns);
kvt_status kvt__stream_auth_client(int fd, const kvt_stream_auth *auth, uint64_t deadline_ns);

/* The server's side as steps over bytes already read, for a server that
 * runs many handshakes at once (the group hub). They do no I/O and set no
 * message; each returns a refusal code (KVT_AUTH_OK: go on). hello fills
 * the CHALLENGE to send (a refusal when the code is not OK); proof checks
 * the client's MAC; verdict fills the final ack; refuse_chal turns a
 * CHALLENGE into a refusal the caller decided (a rank already joined). */
#define KVT_AUTH_NONCE 32
#define KVT_AUTH_MAC 32
#define KVT_AUTH_HELLO (4 + 2 + 2 + 4 + 4 + KVT_AUTH_NONCE)
#define KVT_AUTH_CHAL (4 + 4 + KVT_AUTH_NONCE + KVT_AUTH_MAC)
#define KVT_AUTH_ACK 8
/* Refusal codes, on the wire in CHALLENGE and the ack. */
enum {
    KVT_AUTH_OK = 0,
    KVT_AUTH_NEED_SECRET = 1,
    KVT_AUTH_BAD_RANK = 2,
    KVT_AUTH_BAD_PROOF = 3,
    KVT_AUTH_BAD_HELLO = 4,
    /* the server's own version travels in the code's high 16 bits, so the
     * client can name both versions */
    KVT_AUTH_BAD_VERSION = 5,
    /* the peer's identity (a node server's client uid) is not admitted */
    KVT_AUTH_NOT_ADMITTED = 6
};
const char *kvt__auth_refusal(uint32_t code);
uint32_t kvt__auth_hello(const kvt_stream_auth *a, const uint8_t hello[KVT_AUTH_HELLO],
                         uint8_t chal[KVT_AUTH_CHAL]);
uint32_t kvt__auth_proof(const kvt_stream_auth *a, const uint8_t hello[KVT_AUTH_HELLO],
                         const uint8_t chal[KVT_AUTH_CHAL], const uint8_t resp[KVT_AUTH_MAC]);
void kvt__auth_verdict(const kvt_stream_auth *a, uint8_t ack[KVT_AUTH_ACK], uint32_t code);
void kvt__auth_refuse_chal(const kvt_stream_auth *a, uint8_t chal[KVT_AUTH_CHAL], uint32_t code);
uint32_t kvt__auth_hello_rank(const uint8_t hello[KVT_AUTH_HELLO]);

#endif
