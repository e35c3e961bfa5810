/* net.h - transports behind one ops table (inproc, tcp, callback, faulty;
 * tcp's links are streams of stream.h, on TCP or UCX). A kvt_net is one
 * rank's endpoint: ordered, message-oriented links to the other ranks. Layering: util <- net <- group. Nothing here knows the
 * group's frame format; a message is opaque bytes of at most max_msg. */
#ifndef KVT_NET_NET_H
#define KVT_NET_NET_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "kvtier.h"

/* A growable receive buffer; grown only up to the endpoint's max_msg. */
typedef struct kvt_buf {
    uint8_t *p;
    size_t len, cap;
} kvt_buf;

kvt_status kvt__buf_reserve(kvt_buf *b, size_t cap);
void kvt__buf_free(kvt_buf *b);

typedef struct kvt_net_ops {
    const char *name;
    /* Sends hdr||body to peer as one message by deadline_ns (monotonic). */
    kvt_status (*send)(kvt_net *net, uint32_t peer, const void *hdr, size_t hlen,
                       const void *body, size_t blen, uint64_t deadline_ns);
    /* Receives the next message from peer into buf by deadline_ns:
     * KVT_ETIMEDOUT when none came, KVT_ECONN when the link is gone,
     * KVT_EPROTO when it is larger than max_msg. */
    kvt_status (*recv)(kvt_net *net, uint32_t peer, kvt_buf *buf, uint64_t deadline_ns);
    /* As send, for a control message (the group's ABORT): it must not wait
     * behind unread data, so a transport with bounded queues keeps room for
     * it. NULL: send (tcp: the socket buffer holds far more than the few
     * frames a step leaves unread; callback: the engine's own send). */
    kvt_status (*send_ctl)(kvt_net *net, uint32_t peer, const void *hdr, size_t hlen,
                           const void *body, size_t blen, uint64_t deadline_ns);
    kvt_status (*connect)(kvt_net *net, uint64_t deadline_ns); /* may be NULL */
    void (*destroy)(kvt_net *net);
    /* Wakes the waits in progress (kvt_net_interrupt, from any thread; the
     * flag is already set); may be NULL when nothing can be woken. */
    void (*interrupt)(kvt_net *net);
} kvt_net_ops;

/* Every transport's endpoint starts with this. */
struct kvt_net {
    const kvt_net_ops *ops;
    uint32_t rank, ranks;
    uint32_t max_msg;
    atomic_bool interrupted; /* kvt_net_interrupt was called: every exchange fails */
};

static inline bool kvt__net_interrupted(kvt_net *n)
{
    return atomic_load_explicit(&n->interrupted, memory_order_acquire);
}

/* KVT_ECANCELED naming the rank and what was cut short. */
kvt_status kvt__net_interrupted_fail(const kvt_net *n, const char *what);

/* An exchange's result: once the net is interrupted, whatever the wait
 * ended with (a hang-up of a shut socket, a woken queue) reads as that. */
static inline kvt_status kvt__net_result(kvt_net *n, kvt_status st, const char *what)
{
    return st != KVT_OK && kvt__net_interrupted(n) ? kvt__net_interrupted_fail(n, what) : st;
}

static inline kvt_status kvt__net_send(kvt_net *n, uint32_t peer, const void *hdr,
                                       size_t hlen, const void *body, size_t blen,
                                       uint64_t deadline_ns)
{
    if (kvt__net_interrupted(n)) return kvt__net_interrupted_fail(n, "send");
    return kvt__net_result(n, n->ops->send(n, peer, hdr, hlen, body, blen, deadline_ns), "send");
}

static inline kvt_status kvt__net_send_ctl(kvt_net *n, uint32_t peer, const void *hdr,
                                           size_t hlen, const void *body, size_t blen,
                                           uint64_t deadline_ns)
{
    if (!n->ops->send_ctl) return kvt__net_send(n, peer, hdr, hlen, body, blen, deadline_ns);
    if (kvt__net_interrupted(n)) return kvt__net_interrupted_fail(n, "send");
    return kvt__net_result(n, n->ops->send_ctl(n, peer, hdr, hlen, body, blen, deadline_ns),
                           "send");
}

/* Connects by deadline_ns (transports without connections: nothing to do). */
static inline kvt_status kvt__net_connect(kvt_net *n, uint64_t deadline_ns)
{
    if (kvt__net_interrupted(n)) return kvt__net_interrupted_fail(n, "connect");
    if (!n->ops->connect) return KVT_OK;
    return kvt__net_result(n, n->ops->connect(n, deadline_ns), "connect");
}

static inline kvt_status kvt__net_recv(kvt_net *n, uint32_t peer, kvt_buf *buf,
                                       uint64_t deadline_ns)
{
    if (kvt__net_interrupted(n)) return kvt__net_interrupted_fail(n, "receive");
    return kvt__net_result(n, n->ops->recv(n, peer, buf, deadline_ns), "receive");
}

/* Shared argument checks of send/recv: peer in range and not self, size
 * within max_msg. Return KVT_EINVAL/KVT_EPROTO with a message. */
kvt_status kvt__net_check_peer(const kvt_net *n, uint32_t peer, const char *fn);
kvt_status kvt__net_check_size(const kvt_net *n, size_t len, const char *fn);
/* max_msg 0 -> default; over the limit -> KVT_EINVAL. */
kvt_status kvt__net_pick_max(uint32_t max_msg, uint32_t *out, const char *fn);

/* Logs one line to stderr ("kvtier: ..."), for events nobody returns a
 * status for (a stranger's refused connection). */
void kvt__net_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Fault injection (tests): wraps inner and perturbs this rank's sends,
 * deterministically. The n-th send (0-based, counted over every peer, or
 * only those to `peer` when peer != UINT32_MAX) is dropped, duplicated,
 * delayed by delay_ms, or held back and sent after the next one to the
 * same peer (reorder).
 * The wrapper owns inner (destroys it). */
typedef enum kvt_fault_kind {
    KVT_FAULT_NONE = 0,
    KVT_FAULT_DROP,
    KVT_FAULT_DUP,
    KVT_FAULT_DELAY,
    KVT_FAULT_REORDER,
    KVT_FAULT_CORRUPT /* flips one byte of the message */
} kvt_fault_kind;

typedef struct kvt_fault_plan {
    kvt_fault_kind kind;
    uint64_t at_send;
    uint32_t peer;
    uint32_t delay_ms;
} kvt_fault_plan;

kvt_status kvt__net_faulty_create(kvt_net **out, kvt_net *inner, const kvt_fault_plan *plan);
const char *kvt__fault_name(kvt_fault_kind k);

#endif
