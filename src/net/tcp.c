/* tcp.c - ranks as processes: a star of TCP connections around rank 0 (the
 * hub). A message on the wire is a 4-byte little-endian length and the
 * bytes; the length is checked against max_msg before anything is
 * allocated. Sockets are non-blocking and every wait is a poll() bounded by
 * the caller's deadline. The sockets are set up by sock.c (TCP_NODELAY:
 * step messages are small and latency bound) and a joining rank passes the
 * one handshake of stream_auth.c (realm kvt__auth_group: it claims a rank,
 * and with a secret both ends prove they hold it). */
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>
#include "net/fdio.h"
#include "net/sock.h"
#include "net/tcp.h"
#include "util/clock.h"
#include "util/err.h"
#include "util/le.h"
#include "util/parse.h"

static kvt_status io_all(int fd, void *p, size_t len, uint64_t deadline_ns, int writing)
{
    struct iovec v = {p, len};
    return kvt__fd_io(fd, &v, 1, deadline_ns, writing);
}

kvt_status kvt__tcp_write_all(int fd, const void *p, size_t len, uint64_t deadline_ns)
{
    return io_all(fd, (void *)p, len, deadline_ns, 1);
}

kvt_status kvt__tcp_read_all(int fd, void *p, size_t len, uint64_t deadline_ns)
{
    return io_all(fd, p, len, deadline_ns, 0);
}

static kvt_stream **peer_slot(tcp_net *t, uint32_t peer)
{
    return &t->links[t->base.rank == 0 ? peer : 0];
}

static kvt_status route(tcp_net *t, uint32_t peer, const char *fn, kvt_stream **s)
{
    kvt_status st = kvt__net_check_peer(&t->base, peer, fn);
    if (st != KVT_OK) return st;
    if (t->base.rank != 0 && peer != 0)
        return kvt__fail(KVT_EUNSUPPORTED, "%s: rank %u -> %u: tcp links only reach the hub "
                         "(rank 0)", fn, t->base.rank, peer);
    *s = *peer_slot(t, peer);
    if (!*s)
        return kvt__fail(KVT_ECONN, "%s: rank %u: no connection to rank %u (kvt_net_connect "
                         "not done, or the link was lost)", fn, t->base.rank, peer);
    return KVT_OK;
}

/* Descriptor slots change under fd_mu only (kvt_net_interrupt reads them
 * from another thread): *slot closed and emptied. */
static void drop_fd(tcp_net *t, int *slot)
{
    pthread_mutex_lock(&t->fd_mu);
    if (*slot >= 0) close(*slot);
    *slot = -1;
    pthread_mutex_unlock(&t->fd_mu);
}

/* The link in *slot taken out under fd_mu, then closed (a UCX stream's
 * teardown takes milliseconds: not while an interrupt waits for the lock). */
static void drop_link(tcp_net *t, kvt_stream **slot)
{
    pthread_mutex_lock(&t->fd_mu);
    kvt_stream *s = *slot;
    *slot = NULL;
    pthread_mutex_unlock(&t->fd_mu);
    kvt__stream_destroy(s);
}

/* s becomes the link in *slot, shut at once if the net was interrupted;
 * with pending, s holds the socket tracked as in its handshake, which is
 * then no longer tracked apart. */
static void adopt_link(tcp_net *t, kvt_stream **slot, kvt_stream *s, bool pending)
{
    pthread_mutex_lock(&t->fd_mu);
    *slot = s;
    if (pending) t->pending_fd = -1;
    if (kvt__net_interrupted(&t->base)) shutdown(s->fd, SHUT_RDWR);
    pthread_mutex_unlock(&t->fd_mu);
}

/* fd becomes the connection in its handshake (shut at once if interrupted). */
static void track_pending(tcp_net *t, int fd)
{
    pthread_mutex_lock(&t->fd_mu);
    t->pending_fd = fd;
    if (kvt__net_interrupted(&t->base)) shutdown(fd, SHUT_RDWR);
    pthread_mutex_unlock(&t->fd_mu);
}

/* An authenticated connection as a link: a TCP stream, moved onto UCX
 * when the net was made so (both ends swap worker addresses over the
 * socket by deadline_ns; the socket then stays as the liveness signal, and
 * an interrupt's shutdown of it ends UCX waits too). On failure fd is
 * still open and the caller's. */
static kvt_status link_up(tcp_net *t, int fd, uint64_t deadline_ns, kvt_stream **out)
{
    kvt_stream *s = NULL;
    kvt_status st = kvt__stream_tcp_wrap(fd, &s);
    if (st == KVT_OK && t->transport == KVT_NET_UCX) {
        st = kvt__stream_ucx_upgrade(&s, t->base.rank == 0, deadline_ns);
        if (st != KVT_OK) kvt__stream_tcp_free_shell(s);
    }
    if (st == KVT_OK) *out = s;
    return st;
}

static void tcp_interrupt(kvt_net *n)
{
    tcp_net *t = (tcp_net *)n;
    pthread_mutex_lock(&t->fd_mu);
    if (t->listen_fd >= 0) shutdown(t->listen_fd, SHUT_RDWR);
    if (t->pending_fd >= 0) shutdown(t->pending_fd, SHUT_RDWR);
    for (uint32_t r = 0; r < n->ranks; r++)
        if (t->links[r]) shutdown(t->links[r]->fd, SHUT_RDWR);
    pthread_mutex_unlock(&t->fd_mu);
}

/* A failure part-way through a message. The byte stream cannot be
 * resynchronised (the next read would start inside this message), so the
 * link is closed: later calls fail plainly instead of misreading frames. */
static kvt_status lost(tcp_net *t, uint32_t peer, kvt_status st, const char *fn, const char *what)
{
    drop_link(t, peer_slot(t, peer));
    if (st == KVT_ECONN)
        return kvt__fail(st, "%s: rank %u: connection to rank %u lost while %s", fn,
                         t->base.rank, peer, what);
    return kvt__fail(st, "%s: rank %u: %s rank %u stopped part-way through a message by the deadline; "
                     "link closed (its byte stream cannot be resynchronised)", fn, t->base.rank, what, peer);
}

/* Waits for the first byte of the next message: a timeout here leaves the
 * stream aligned (nothing of a message was consumed) and the link open. */
static kvt_status first_byte(kvt_stream *s, uint64_t deadline_ns)
{
    for (;;) {
        uint64_t now = kvt__now_ns();
        uint64_t ms = now >= deadline_ns ? 0 : (deadline_ns - now + 999999) / 1000000;
        int w = s->ops->wait(s, -1, ms > 1000 ? 1000 : (int)ms);
        if (w != KVT_STREAM_IDLE) return KVT_OK; /* data, or a failure the read reports */
        if (kvt__now_ns() >= deadline_ns) return KVT_ETIMEDOUT;
    }
}

static kvt_status tcp_send(kvt_net *n, uint32_t peer, const void *hdr, size_t hlen,
                           const void *body, size_t blen, uint64_t deadline_ns)
{
    static const char fn[] = "net tcp send";
    tcp_net *t = (tcp_net *)n;
    kvt_stream *s = NULL;
    kvt_status st = route(t, peer, fn, &s);
    if (st == KVT_OK) st = kvt__net_check_size(n, hlen + blen, fn);
    if (st != KVT_OK) return st;
    uint8_t len[4];
    kvt__put32(len, (uint32_t)(hlen + blen));
    /* One message (TCP: one sendmsg in the common case; a closed or
     * interrupted link is EPIPE, never SIGPIPE). */
    struct iovec iov[3] = {{len, 4}, {(void *)hdr, hlen}, {(void *)body, blen}};
    st = s->ops->sendv(s, iov, 3, deadline_ns);
    return st == KVT_OK ? KVT_OK : lost(t, peer, st, fn, "sending to");
}

static kvt_status tcp_recv(kvt_net *n, uint32_t peer, kvt_buf *buf, uint64_t deadline_ns)
{
    static const char fn[] = "net tcp recv";
    tcp_net *t = (tcp_net *)n;
    kvt_stream *s = NULL;
    kvt_status st = route(t, peer, fn, &s);
    if (st != KVT_OK) return st;
    st = first_byte(s, deadline_ns);
    if (st == KVT_ETIMEDOUT)
        return kvt__fail(st, "%s: rank %u: nothing from rank %u by the deadline", fn, t->base.rank, peer);
    uint8_t lb[4];
    if (st == KVT_OK) st = kvt__stream_recv(s, lb, 4, deadline_ns);
    if (st != KVT_OK) return lost(t, peer, st, fn, "receiving from");
    uint32_t len = kvt__get32(lb);
    if (len > n->max_msg) {
        /* The stream cannot be resynchronised after an oversized length. */
        (void)lost(t, peer, KVT_ECONN, fn, "receiving from");
        return kvt__fail(KVT_EPROTO, "%s: rank %u: rank %u announced a %u-byte message, over "
                         "max_msg %u; link closed", fn, n->rank, peer, len, n->max_msg);
    }
    st = kvt__buf_reserve(buf, len ? len : 1);
    if (st == KVT_OK && len) st = kvt__stream_recv(s, buf->p, len, deadline_ns);
    if (st == KVT_ENOMEM) return st;
    if (st != KVT_OK) return lost(t, peer, st, fn, "receiving from");
    buf->len = len;
    return KVT_OK;
}

static kvt_status hub_listen(tcp_net *t)
{
    int fd = -1;
    kvt_status st = kvt__sock_listen(t->host, t->port, "kvt_net_tcp_create", &fd, &t->port);
    if (st == KVT_OK) t->listen_fd = fd;
    return st;
}

/* The hub handshakes every connection at once, each against its own
 * deadline, so a stranger that connects and stays silent (or sends
 * garbage) costs only its own slot, never the group's formation time. At
 * most HUB_PENDING connections are in their handshake; a newcomer beyond
 * that evicts the oldest. */
#define HUB_PENDING 64
#define HUB_HANDSHAKE_MS 1000
#define HUB_UPGRADE_MS 5000

typedef struct hub_hs {
    int fd; /* -1: free slot */
    uint64_t deadline_ns;
    uint64_t connect_dl; /* the connect's own deadline (bounds a UCX upgrade) */
    uint64_t seq;     /* accept order: the lowest is the oldest */
    bool proving;     /* hello answered; reading the proof */
    uint32_t got;     /* bytes of hello (or of resp) read so far */
    char peer[KVT_SOCK_PEER_MAX];
    uint8_t hello[KVT_AUTH_HELLO], chal[KVT_AUTH_CHAL], resp[KVT_AUTH_MAC];
} hub_hs;

static void hub_drop(tcp_net *t, hub_hs *h, const char *why)
{
    t->refused++;
    kvt__net_log("tcp hub %s:%u: refused connection from %s: %s", t->host, t->port, h->peer, why);
    close(h->fd);
    h->fd = -1;
}

static void hub_add(tcp_net *t, hub_hs *hs, uint64_t *seq, int fd, const char *peer,
                    uint64_t deadline_ns)
{
    hub_hs *slot = NULL, *oldest = NULL;
    for (int i = 0; i < HUB_PENDING && !slot; i++) {
        if (hs[i].fd < 0) slot = &hs[i];
        else if (!oldest || hs[i].seq < oldest->seq) oldest = &hs[i];
    }
    if (!slot) {
        hub_drop(t, oldest, "evicted: every handshake slot was taken (the oldest makes room)");
        slot = oldest;
    }
    uint64_t dl = kvt__deadline_ns(HUB_HANDSHAKE_MS);
    *slot = (hub_hs){.fd = fd, .deadline_ns = dl < deadline_ns ? dl : deadline_ns,
                     .connect_dl = deadline_ns, .seq = (*seq)++};
    snprintf(slot->peer, sizeof slot->peer, "%s", peer);
}

static void hub_accept_all(tcp_net *t, hub_hs *hs, uint64_t *seq, uint64_t deadline_ns)
{
    for (;;) {
        char peer[KVT_SOCK_PEER_MAX];
        int fd = kvt__sock_accept(t->listen_fd, false, peer);
        if (fd < 0) return; /* EAGAIN: the backlog is empty (or an error: poll tells again) */
        hub_add(t, hs, seq, fd, peer, deadline_ns);
    }
}

/* A handshake's CHALLENGE (72 bytes) and ack (8) go to a fresh socket
 * whose send buffer is empty, so the write completes at once; its deadline
 * is the connection's own. */
static bool hub_send(hub_hs *h, const void *p, size_t len)
{
    return kvt__tcp_write_all(h->fd, p, len, h->deadline_ns) == KVT_OK;
}

/* Reads what is there of the current step's bytes; runs the step once they
 * are complete. */
static void hub_progress(tcp_net *t, hub_hs *h)
{
    uint8_t *buf = h->proving ? h->resp : h->hello;
    uint32_t need = h->proving ? sizeof h->resp : sizeof h->hello;
    ssize_t n = recv(h->fd, buf + h->got, need - h->got, 0);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
        hub_drop(t, h, h->proving ? "the peer hung up instead of proving the secret (it may "
                                    "hold a different one)"
                                  : "the peer hung up before a complete hello");
        return;
    }
    if (n < 0) return;
    h->got += (uint32_t)n;
    if (h->got < need) return;
    h->got = 0;
    uint32_t rank = kvt__auth_hello_rank(h->hello);
    char why[160];
    if (!h->proving) {
        uint32_t code = kvt__auth_hello(&t->auth, h->hello, h->chal);
        if (code == KVT_AUTH_OK && t->links[rank]) { /* a live link is never replaced */
            code = KVT_AUTH_BAD_RANK;
            kvt__auth_refuse_chal(&t->auth, h->chal, code);
        }
        bool sent = hub_send(h, h->chal, sizeof h->chal);
        if (code == KVT_AUTH_BAD_HELLO) {
            hub_drop(t, h, kvt__auth_refusal(code)); /* its "rank" is noise */
        } else if (code != KVT_AUTH_OK) {
            snprintf(why, sizeof why, "%s (hello rank %u)", kvt__auth_refusal(code), rank);
            hub_drop(t, h, why);
        } else if (!sent) {
            hub_drop(t, h, "could not send the challenge");
        } else {
            h->proving = true;
        }
        return;
    }
    uint32_t code = kvt__auth_proof(&t->auth, h->hello, h->chal, h->resp);
    /* Handshakes run side by side: two may claim one rank, and the first to
     * finish keeps it (a live link is never replaced by a newcomer). */
    if (code == KVT_AUTH_OK && t->links[rank]) code = KVT_AUTH_BAD_RANK;
    uint8_t ack[KVT_AUTH_ACK];
    kvt__auth_verdict(&t->auth, ack, code);
    bool sent = hub_send(h, ack, sizeof ack);
    if (code != KVT_AUTH_OK) {
        snprintf(why, sizeof why, "%s (hello rank %u)", kvt__auth_refusal(code), rank);
        hub_drop(t, h, why);
    } else if (!sent) {
        hub_drop(t, h, "could not send the accept");
    } else {
        /* UCX: only a rank that passed the handshake gets this far; its
         * upgrade (a worker, the address swap) may take HUB_UPGRADE_MS
         * under load, within the connect's deadline. */
        kvt_stream *s = NULL;
        uint64_t dl = kvt__deadline_ns(HUB_UPGRADE_MS);
        track_pending(t, h->fd); /* an interrupt ends the UCX upgrade's wait */
        if (link_up(t, h->fd, dl < h->connect_dl ? dl : h->connect_dl, &s) != KVT_OK) {
            snprintf(why, sizeof why, "rank %u: %s", rank, kvt_last_error());
            pthread_mutex_lock(&t->fd_mu);
            t->pending_fd = -1;
            pthread_mutex_unlock(&t->fd_mu);
            hub_drop(t, h, why);
            return;
        }
        adopt_link(t, &t->links[rank], s, true);
        h->fd = -1;
    }
}

static uint32_t hub_joined(const tcp_net *t)
{
    uint32_t joined = 0;
    for (uint32_t r = 1; r < t->base.ranks; r++) joined += t->links[r] != NULL;
    return joined;
}

/* One round: drop handshakes past their deadline, wait for the listener or
 * a handshake's bytes (until the earliest deadline), serve what is ready. */
static void hub_round(tcp_net *t, hub_hs *hs, uint64_t *seq, uint64_t deadline_ns)
{
    struct pollfd p[HUB_PENDING + 1];
    int idx[HUB_PENDING + 1];
    nfds_t n = 0;
    uint64_t wake = deadline_ns, now = kvt__now_ns();
    p[n++] = (struct pollfd){t->listen_fd, POLLIN, 0};
    for (int i = 0; i < HUB_PENDING; i++) {
        if (hs[i].fd < 0) continue;
        if (now >= hs[i].deadline_ns) {
            hub_drop(t, &hs[i], hs[i].proving ? "no proof before its deadline"
                                              : "no complete hello before its deadline");
            continue;
        }
        if (hs[i].deadline_ns < wake) wake = hs[i].deadline_ns;
        idx[n] = i;
        p[n++] = (struct pollfd){hs[i].fd, POLLIN, 0};
    }
    int ms = now >= wake ? 0 : (int)((wake - now + 999999) / 1000000);
    if (poll(p, n, ms) <= 0) return; /* timeouts are handled above, next round */
    for (nfds_t k = 1; k < n; k++)
        if (p[k].revents) hub_progress(t, &hs[idx[k]]);
    if (p[0].revents) hub_accept_all(t, hs, seq, deadline_ns);
}

static kvt_status hub_connect(tcp_net *t, uint64_t deadline_ns)
{
    hub_hs *hs = malloc(HUB_PENDING * sizeof *hs);
    if (!hs) return kvt__fail(KVT_ENOMEM, "kvt_net_connect: hub: out of memory");
    for (int i = 0; i < HUB_PENDING; i++) hs[i].fd = -1;
    uint64_t seq = 0;
    kvt_status st = KVT_OK;
    while (hub_joined(t) < t->base.ranks - 1) {
        if (kvt__net_interrupted(&t->base)) {
            st = KVT_ECANCELED; /* net.h words it */
            break;
        }
        if (kvt__now_ns() >= deadline_ns) {
            uint32_t r = 1;
            while (t->links[r]) r++;
            st = kvt__fail(KVT_ETIMEDOUT, "kvt_net_connect: hub: rank %u did not join by the "
                           "deadline (%u of %u joined)", r, hub_joined(t), t->base.ranks - 1);
            break;
        }
        hub_round(t, hs, &seq, deadline_ns);
    }
    /* Handshakes still running when the group formed (or failed) are
     * strangers, or ranks that come back at the next connect. */
    for (int i = 0; i < HUB_PENDING; i++)
        if (hs[i].fd >= 0) hub_drop(t, &hs[i], "the hub stopped accepting before it finished");
    free(hs);
    /* The listener stays open: a link closed later (a lost peer, a message
     * cut by a deadline) is re-accepted by the next connect, which a group
     * reform makes. Until then the kernel only queues connections. */
    return st;
}

/* The connect is under way: the socket becomes the pending one (an
 * interrupt's shutdown() now wakes its wait), unless the net was already
 * interrupted: a shutdown() of a socket not yet connecting does not stop
 * the connect, so the flag, set before the shutdown, is checked here. */
static bool connect_started(void *arg)
{
    tcp_net *t = arg;
    pthread_mutex_lock(&t->fd_mu);
    bool go = !kvt__net_interrupted(&t->base);
    pthread_mutex_unlock(&t->fd_mu);
    return go;
}

/* One non-blocking connect attempt: KVT_OK, KVT_EAGAIN (retry), KVT_ECANCELED
 * (interrupted) or error. */
static kvt_status try_connect(tcp_net *t, const struct sockaddr_in *sa, uint64_t dl, int *out)
{
    int fd = kvt__sock_open(false);
    if (fd < 0) return kvt__fail(KVT_ESYS, "kvt_net_connect: socket: %s", strerror(errno));
    track_pending(t, fd);
    kvt_status st = kvt__sock_connect_fd(fd, sa, dl, connect_started, t);
    if (st != KVT_OK) {
        drop_fd(t, &t->pending_fd);
        return st == KVT_ECANCELED ? st : KVT_EAGAIN;
    }
    *out = fd;
    return KVT_OK;
}

static kvt_status rank_connect(tcp_net *t, uint64_t deadline_ns)
{
    struct sockaddr_in sa;
    kvt_status st = kvt__sock_addr(t->host, t->port, &sa, "kvt_net_connect");
    if (st != KVT_OK) return st;
    int fd = -1;
retry:
    while ((st = try_connect(t, &sa, deadline_ns, &fd)) == KVT_EAGAIN) {
        if (kvt__net_interrupted(&t->base)) return KVT_ECANCELED; /* net.h words it */
        if (kvt__now_ns() >= deadline_ns)
            return kvt__fail(KVT_ETIMEDOUT, "kvt_net_connect: rank %u: hub %s:%u did not accept "
                             "by the deadline", t->base.rank, t->host, t->port);
        struct timespec ts = {0, 5 * 1000000L}; /* the hub may not listen yet */
        nanosleep(&ts, NULL);
    }
    if (st != KVT_OK) return st;
    st = kvt__stream_auth_client(fd, &t->auth, deadline_ns);
    if (st == KVT_ECONN && !kvt__net_interrupted(&t->base) && kvt__now_ns() < deadline_ns) {
        /* Accepted by a dying listener (a hub being replaced): its queue
         * is reset when it exits; try again within the deadline. */
        drop_fd(t, &t->pending_fd);
        struct timespec ts = {0, 5 * 1000000L};
        nanosleep(&ts, NULL);
        goto retry;
    }
    if (st != KVT_OK) {
        char msg[KVT_ERRMSG_MAX];
        snprintf(msg, sizeof msg, "%s", kvt_last_error());
        drop_fd(t, &t->pending_fd);
        return kvt__fail(st, "kvt_net_connect: %s (hub %s:%u)", msg, t->host, t->port);
    }
    kvt_stream *s = NULL;
    st = link_up(t, fd, deadline_ns, &s);
    if (st == KVT_ECONN && !kvt__net_interrupted(&t->base) && kvt__now_ns() < deadline_ns) {
        /* The hub gave up on the UCX upgrade (its own bound): join again. */
        drop_fd(t, &t->pending_fd);
        goto retry;
    }
    if (st != KVT_OK) {
        char msg[KVT_ERRMSG_MAX];
        snprintf(msg, sizeof msg, "%s", kvt_last_error());
        drop_fd(t, &t->pending_fd);
        return kvt__fail(st, "kvt_net_connect: rank %u: link to hub %s:%u: %s", t->base.rank,
                         t->host, t->port, msg);
    }
    adopt_link(t, &t->links[0], s, true);
    return KVT_OK;
}

static kvt_status tcp_connect(kvt_net *n, uint64_t deadline_ns)
{
    tcp_net *t = (tcp_net *)n;
    /* UCX's context is made once, at the first connect (after any fork of
     * the caller's), not inside a link's 1 s handshake bound. */
    if (t->transport == KVT_NET_UCX && !t->ucx_held) {
        kvt_status st = kvt__stream_ucx_hold();
        if (st != KVT_OK) return st;
        t->ucx_held = true;
    }
    /* Connects what is not connected: everything the first time, a closed
     * link again later (each side of it reconnects). */
    if (n->rank == 0) return hub_connect(t, deadline_ns);
    return t->links[0] ? KVT_OK : rank_connect(t, deadline_ns);
}

static void tcp_destroy(kvt_net *n)
{
    tcp_net *t = (tcp_net *)n;
    if (t->listen_fd >= 0) close(t->listen_fd);
    for (uint32_t r = 0; r < n->ranks; r++)
        kvt__stream_destroy(t->links[r]);
    if (t->secret) sodium_memzero(t->secret, t->secret_len);
    free(t->secret);
    free(t->links);
    if (t->ucx_held) kvt__stream_ucx_release(); /* after the streams: the last one out cleans up */
    pthread_mutex_destroy(&t->fd_mu);
    free(t);
}

static const kvt_net_ops tcp_ops = {
    .name = "tcp",
    .send = tcp_send,
    .recv = tcp_recv,
    .connect = tcp_connect,
    .destroy = tcp_destroy,
    .interrupt = tcp_interrupt,
};

static kvt_status check_params(const kvt_net_tcp_params *p, const char *fn)
{
    KVT_CHECK_ARG(p->ranks >= 1 && p->ranks <= KVT_NET_MAX_RANKS,
                  "%s: ranks %u is outside 1..%u", fn, p->ranks, KVT_NET_MAX_RANKS);
    KVT_CHECK_ARG(p->rank < p->ranks, "%s: rank %u is not below ranks %u", fn, p->rank, p->ranks);
    KVT_CHECK_ARG(!p->host || strlen(p->host) < 64, "%s: host is longer than 63 bytes", fn);
    KVT_CHECK_ARG(p->rank == 0 || p->port != 0, "%s: rank %u needs the hub's port", fn, p->rank);
    KVT_CHECK_ARG(!p->secret == !p->secret_len, "%s: secret and secret_len disagree", fn);
    KVT_CHECK_ARG(p->transport == KVT_NET_TCP || p->transport == KVT_NET_UCX,
                  "%s: transport %d is neither KVT_NET_TCP (0) nor KVT_NET_UCX (1)", fn, (int)p->transport);
    KVT_CHECK_ARG(!p->secret || (p->secret_len >= 16 && p->secret_len <= 1024),
                  "%s: secret_len %zu is outside 16..1024", fn, p->secret_len);
    KVT_CHECK_ARG(p->allow_insecure <= 1, "%s: allow_insecure is %u (0 or 1)", fn, p->allow_insecure);
    /* secure by default: a hub reachable beyond this host admits any rank
     * claim without a secret (and, over UCX, any worker address) */
    const char *h = p->host ? p->host : "127.0.0.1";
    KVT_CHECK_ARG(p->rank != 0 || p->ranks < 2 || p->secret || p->allow_insecure || kvt__host_is_loopback(h),
                  "%s: the hub's host %s is not a loopback address and no secret is set: anyone who reaches "
                  "it could join as a rank and feed the group's decisions; set a secret (16..1024 bytes, the "
                  "same on every rank), or allow_insecure = 1 on a trusted network", fn, h);
    return KVT_OK;
}

static tcp_net *tcp_alloc(const kvt_net_tcp_params *p, uint32_t max_msg)
{
    tcp_net *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    t->links = calloc(p->ranks, sizeof *t->links);
    t->secret = p->secret ? malloc(p->secret_len) : NULL;
    if (!t->links || (p->secret && !t->secret)) {
        free(t->links);
        free(t->secret);
        free(t);
        return NULL;
    }
    if (p->secret) memcpy(t->secret, p->secret, p->secret_len);
    t->secret_len = p->secret_len;
    t->base = (kvt_net){&tcp_ops, p->rank, p->ranks, max_msg, false};
    snprintf(t->host, sizeof t->host, "%s", p->host ? p->host : "127.0.0.1");
    t->port = p->port;
    t->transport = p->transport;
    t->listen_fd = -1;
    t->pending_fd = -1;
    snprintf(t->who, sizeof t->who, "net tcp: rank %u", p->rank);
    t->auth = (kvt_stream_auth){.secret = t->secret, .secret_len = t->secret_len, .who = t->who,
                                .realm = &kvt__auth_group, .rank = p->rank, .ranks = p->ranks};
    pthread_mutex_init(&t->fd_mu, NULL);
    return t;
}

kvt_status kvt_net_tcp_create(kvt_net **out, const kvt_net_tcp_params *p)
{
    static const char fn[] = "kvt_net_tcp_create";
    KVT_CHECK_NOT_NULL(out, fn);
    KVT_CHECK_NOT_NULL_AS(p, "params", fn);
    uint32_t mm;
    kvt_status st = check_params(p, fn);
    if (st == KVT_OK) st = kvt__net_pick_max(p->max_msg, &mm, fn);
    if (st != KVT_OK) return st;
    if (sodium_init() < 0) return kvt__fail(KVT_ESYS, "%s: libsodium failed to initialise", fn);
    tcp_net *t = tcp_alloc(p, mm);
    if (!t) return kvt__fail(KVT_ENOMEM, "%s: out of memory", fn);
    if (p->rank == 0 && p->ranks > 1 && (st = hub_listen(t)) != KVT_OK) {
        tcp_destroy(&t->base);
        return st;
    }
    kvt__clear_error();
    *out = &t->base;
    return KVT_OK;
}

kvt_status kvt_net_tcp_port(const kvt_net *net, uint16_t *out)
{
    KVT_CHECK_NOT_NULL(net, "kvt_net_tcp_port");
    KVT_CHECK_NOT_NULL(out, "kvt_net_tcp_port");
    KVT_CHECK_ARG(net->ops == &tcp_ops && net->rank == 0,
                  "kvt_net_tcp_port: not a tcp hub endpoint (transport %s, rank %u)",
                  net->ops->name, net->rank);
    *out = ((const tcp_net *)net)->port;
    return KVT_OK;
}

uint32_t kvt__net_tcp_refused(const kvt_net *net)
{
    return net && net->ops == &tcp_ops ? ((const tcp_net *)net)->refused : 0;
}
