/* tcp.h - the rank-group TCP transport's internals (tcp.c), for tests and
 * the fuzz target. Sockets come from sock.c, the join handshake is the one
 * in stream_auth.c (realm kvt__auth_group). */
#ifndef KVT_NET_TCP_H
#define KVT_NET_TCP_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include "net/net.h"
#include "net/stream.h"

typedef struct tcp_net {
    kvt_net base;
    char host[64];
    uint16_t port;
    int listen_fd;   /* hub only: accepts joins, and rejoins of closed links */
    /* The links, as streams (TCP, or UCX over an authenticated TCP
     * socket): hub: one per rank (links[0] unused); others: links[0] = hub.
     * NULL: not connected. */
    kvt_stream **links;
    kvt_net_transport transport;
    bool ucx_held;   /* this net holds the UCP context (kvt__stream_ucx_hold) */
    uint8_t *secret; /* NULL: no authentication */
    size_t secret_len;
    kvt_stream_auth auth; /* the join handshake: secret, this rank's claim */
    char who[32];         /* "net tcp: rank N", for the handshake's messages */
    uint32_t refused; /* connections the hub refused (strangers) */
    /* Guards the descriptors against kvt_net_interrupt on another thread,
     * which shuts down (never closes) every one of them, and pending_fd:
     * a connection still in its handshake (a rank's), or in its UCX
     * upgrade (the hub's). */
    pthread_mutex_t fd_mu;
    int pending_fd;
} tcp_net;

/* Whole reads/writes on a non-blocking socket by deadline_ns:
 * KVT_ETIMEDOUT, KVT_ECONN (peer closed or error). */
kvt_status kvt__tcp_write_all(int fd, const void *p, size_t len, uint64_t deadline_ns);
kvt_status kvt__tcp_read_all(int fd, void *p, size_t len, uint64_t deadline_ns);

/* Connections the hub refused so far (tests). */
uint32_t kvt__net_tcp_refused(const kvt_net *net);

#endif
