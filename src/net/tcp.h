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

/* The connection handshake (tcp_auth.c). The client sends HELLO, the hub
 * answers CHALLENGE, the client its proof (a MAC), the hub ACCEPT or
 * REFUSE (an ack). The client proves its rank and, with a secret, both
 * sides prove they hold it (mutual HMAC-SHA256 over fresh nonces). */
#define KVT_TCP_HELLO_LEN (4 + 2 + 2 + 4 + 4 + KVT_TCP_NONCE)
#define KVT_TCP_CHAL_LEN (4 + 4 + KVT_TCP_NONCE + KVT_TCP_MAC)
#define KVT_TCP_ACK_LEN 8

/* Refusal codes, on the wire in CHALLENGE and the ack. */
enum {
    KVT_TCP_ST_OK = 0,
    KVT_TCP_ST_NEED_SECRET = 1,
    KVT_TCP_ST_BAD_RANK = 2,
    KVT_TCP_ST_BAD_PROOF = 3,
    KVT_TCP_ST_BAD_HELLO = 4
};
const char *kvt__tcp_refusal(uint32_t code);

kvt_status kvt__tcp_auth_client(tcp_net *t, int fd, uint64_t deadline_ns);

/* The hub's side as steps over bytes already read, so the hub can run many
 * handshakes at once (tcp.c). hub_hello fills the CHALLENGE to send
 * (a refusal when the code is not OK); hub_proof checks the client's MAC;
 * hub_status fills the final ack. They do no I/O and set no message. */
uint32_t kvt__tcp_hub_hello(const tcp_net *t, const uint8_t hello[KVT_TCP_HELLO_LEN],
                            uint8_t chal[KVT_TCP_CHAL_LEN]);
uint32_t kvt__tcp_hub_proof(const tcp_net *t, const uint8_t hello[KVT_TCP_HELLO_LEN],
                            const uint8_t chal[KVT_TCP_CHAL_LEN], const uint8_t resp[KVT_TCP_MAC]);
void kvt__tcp_hub_status(uint8_t ack[KVT_TCP_ACK_LEN], uint32_t code);
uint32_t kvt__tcp_hello_rank(const uint8_t hello[KVT_TCP_HELLO_LEN]);

/* Connections the hub refused so far (tests). */
uint32_t kvt__net_tcp_refused(const kvt_net *net);

#endif
