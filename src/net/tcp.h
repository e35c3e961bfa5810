/* tcp.h - TCP transport internals shared by tcp.c and tcp_auth.c. */
#ifndef KVT_NET_TCP_H
#define KVT_NET_TCP_H

#include <pthread.h>
#include <stdint.h>
#include "net/net.h"

#define KVT_TCP_NONCE 32
#define KVT_TCP_MAC 32

typedef struct tcp_net {
    kvt_net base;
    char host[64];
    uint16_t port;
    int listen_fd;   /* hub only: accepts joins, and rejoins of closed links */
    int *fds;        /* hub: one per rank (fds[0] unused); others: fds[0] = hub */
    uint8_t *secret; /* NULL: no authentication */
    size_t secret_len;
    uint32_t refused; /* connections the hub refused (strangers) */
    /* Guards the descriptors against kvt_net_interrupt on another thread,
     * which shuts down (never closes) every one of them, and pending_fd:
     * a connection still in its handshake. */
    pthread_mutex_t fd_mu;
    int pending_fd;
} tcp_net;

/* Whole reads/writes on a non-blocking socket by deadline_ns:
 * KVT_ETIMEDOUT, KVT_ECONN (peer closed or error). */
kvt_status kvt__tcp_write_all(int fd, const void *p, size_t len, uint64_t deadline_ns);
kvt_status kvt__tcp_read_all(int fd, void *p, size_t len, uint64_t deadline_ns);

/* The connection handshake (tcp_auth.c). The client proves its rank and,
 * with a secret, both sides prove they hold it (mutual HMAC-SHA256 over
 * fresh nonces). On the hub *rank_out gets the peer's rank. */
kvt_status kvt__tcp_auth_client(tcp_net *t, int fd, uint64_t deadline_ns);
kvt_status kvt__tcp_auth_hub(tcp_net *t, int fd, uint32_t *rank_out, uint64_t deadline_ns);

/* Connections the hub refused so far (tests). */
uint32_t kvt__net_tcp_refused(const kvt_net *net);

#endif
