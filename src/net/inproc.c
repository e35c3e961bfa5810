/* inproc.c - ranks as threads: one bounded FIFO per ordered pair of ranks.
 * A message is one malloc'd node (the copy decouples sender and receiver
 * lifetimes); send blocks while the queue is full, until its deadline.
 * Control messages (send_ctl: the group's ABORT) may exceed the depth by
 * KVT_INPROC_CTL_RESERVE, so an abort never waits behind an unread STEP_UP
 * (the group sends at most one ABORT per link and epoch). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include "net/net.h"
#include "util/err.h"
#include "util/sync.h"

#define KVT_INPROC_CTL_RESERVE 4

typedef struct msg {
    struct msg *next;
    size_t len;
    uint8_t data[];
} msg;

typedef struct pairq {
    pthread_mutex_t mu;
    pthread_cond_t cv; /* signalled on push and pop */
    msg *head, *tail;
    uint32_t count;
} pairq;

struct kvt_fabric {
    uint32_t ranks, depth;
    pairq *q; /* q[src * ranks + dst] */
};

typedef struct inproc_net {
    kvt_net base;
    kvt_fabric *fab;
} inproc_net;

static pairq *q_of(kvt_fabric *f, uint32_t src, uint32_t dst)
{
    return &f->q[(size_t)src * f->ranks + dst];
}

kvt_status kvt_fabric_create(kvt_fabric **out, uint32_t ranks, uint32_t depth)
{
    static const char fn[] = "kvt_fabric_create";
    KVT_CHECK_NOT_NULL(out, fn);
    KVT_CHECK_ARG(ranks >= 1 && ranks <= KVT_NET_MAX_RANKS, "%s: ranks %u is outside 1..%u",
                  fn, ranks, KVT_NET_MAX_RANKS);
    KVT_CHECK_ARG(depth >= 1 && depth <= 4096, "%s: depth %u is outside 1..4096", fn, depth);
    kvt_fabric *f = calloc(1, sizeof *f);
    if (f) f->q = calloc((size_t)ranks * ranks, sizeof *f->q);
    if (!f || !f->q) {
        free(f);
        return kvt__fail(KVT_ENOMEM, "%s: out of memory for %u ranks", fn, ranks);
    }
    f->ranks = ranks;
    f->depth = depth;
    for (size_t i = 0; i < (size_t)ranks * ranks; i++) {
        pthread_mutex_init(&f->q[i].mu, NULL);
        kvt__cond_init(&f->q[i].cv);
    }
    kvt__clear_error();
    *out = f;
    return KVT_OK;
}

void kvt_fabric_destroy(kvt_fabric *f)
{
    if (!f) return;
    for (size_t i = 0; i < (size_t)f->ranks * f->ranks; i++) {
        for (msg *m = f->q[i].head, *nx; m; m = nx) {
            nx = m->next;
            free(m);
        }
        pthread_mutex_destroy(&f->q[i].mu);
        pthread_cond_destroy(&f->q[i].cv);
    }
    free(f->q);
    free(f);
}

static kvt_status push(kvt_net *n, uint32_t peer, const void *hdr, size_t hlen,
                       const void *body, size_t blen, uint64_t deadline_ns, uint32_t room)
{
    static const char fn[] = "net inproc send";
    kvt_status st = kvt__net_check_peer(n, peer, fn);
    if (st == KVT_OK) st = kvt__net_check_size(n, hlen + blen, fn);
    if (st != KVT_OK) return st;
    msg *m = malloc(sizeof *m + hlen + blen);
    if (!m) return kvt__fail(KVT_ENOMEM, "%s: out of memory", fn);
    m->next = NULL;
    m->len = hlen + blen;
    if (hlen) memcpy(m->data, hdr, hlen);
    if (blen) memcpy(m->data + hlen, body, blen);
    kvt_fabric *f = ((inproc_net *)n)->fab;
    pairq *q = q_of(f, n->rank, peer);
    pthread_mutex_lock(&q->mu);
    while (q->count >= room) {
        if (kvt__net_interrupted(n)) {
            pthread_mutex_unlock(&q->mu);
            free(m);
            return KVT_ECANCELED; /* net.h words it */
        }
        if (!kvt__cond_wait_until(&q->cv, &q->mu, deadline_ns) && q->count >= room) {
            pthread_mutex_unlock(&q->mu);
            free(m);
            return kvt__fail(KVT_ETIMEDOUT, "%s: rank %u -> %u: queue full (%u) until deadline",
                             fn, n->rank, peer, f->depth);
        }
    }
    if (q->tail) q->tail->next = m; else q->head = m;
    q->tail = m;
    q->count++;
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
    return KVT_OK;
}

static kvt_status inproc_send(kvt_net *n, uint32_t peer, const void *hdr, size_t hlen,
                              const void *body, size_t blen, uint64_t deadline_ns)
{
    uint32_t depth = ((inproc_net *)n)->fab->depth;
    return push(n, peer, hdr, hlen, body, blen, deadline_ns, depth);
}

static kvt_status inproc_send_ctl(kvt_net *n, uint32_t peer, const void *hdr, size_t hlen,
                                  const void *body, size_t blen, uint64_t deadline_ns)
{
    uint32_t depth = ((inproc_net *)n)->fab->depth;
    return push(n, peer, hdr, hlen, body, blen, deadline_ns, depth + KVT_INPROC_CTL_RESERVE);
}

static kvt_status inproc_recv(kvt_net *n, uint32_t peer, kvt_buf *buf, uint64_t deadline_ns)
{
    static const char fn[] = "net inproc recv";
    kvt_status st = kvt__net_check_peer(n, peer, fn);
    if (st != KVT_OK) return st;
    pairq *q = q_of(((inproc_net *)n)->fab, peer, n->rank);
    pthread_mutex_lock(&q->mu);
    while (!q->head) {
        if (kvt__net_interrupted(n)) {
            pthread_mutex_unlock(&q->mu);
            return KVT_ECANCELED; /* net.h words it */
        }
        if (!kvt__cond_wait_until(&q->cv, &q->mu, deadline_ns) && !q->head) {
            pthread_mutex_unlock(&q->mu);
            return kvt__fail(KVT_ETIMEDOUT, "%s: rank %u: nothing from rank %u by the deadline",
                             fn, n->rank, peer);
        }
    }
    msg *m = q->head;
    q->head = m->next;
    if (!q->head) q->tail = NULL;
    q->count--;
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
    st = kvt__buf_reserve(buf, m->len ? m->len : 1);
    if (st == KVT_OK) {
        memcpy(buf->p, m->data, m->len);
        buf->len = m->len;
    }
    free(m);
    return st;
}

static void inproc_destroy(kvt_net *n) { free(n); }

/* Wakes this rank's waits: a receive waits on a queue towards it, a send
 * on a full queue away from it. The flag is set before: a waiter checks
 * it under the queue's lock, so taking the lock here means none misses it. */
static void inproc_interrupt(kvt_net *n)
{
    kvt_fabric *f = ((inproc_net *)n)->fab;
    for (uint32_t p = 0; p < f->ranks; p++) {
        pairq *qs[2] = {q_of(f, p, n->rank), q_of(f, n->rank, p)};
        for (int i = 0; i < 2; i++) {
            pthread_mutex_lock(&qs[i]->mu);
            pthread_cond_broadcast(&qs[i]->cv);
            pthread_mutex_unlock(&qs[i]->mu);
        }
    }
}

static const kvt_net_ops inproc_ops = {
    .name = "inproc",
    .send = inproc_send,
    .recv = inproc_recv,
    .send_ctl = inproc_send_ctl,
    .connect = NULL,
    .destroy = inproc_destroy,
    .interrupt = inproc_interrupt,
};

kvt_status kvt_net_inproc_create(kvt_net **out, kvt_fabric *fab, uint32_t rank)
{
    static const char fn[] = "kvt_net_inproc_create";
    KVT_CHECK_NOT_NULL(out, fn);
    KVT_CHECK_NOT_NULL(fab, fn);
    KVT_CHECK_ARG(rank < fab->ranks, "%s: rank %u is not below ranks %u", fn, rank, fab->ranks);
    inproc_net *n = calloc(1, sizeof *n);
    if (!n) return kvt__fail(KVT_ENOMEM, "%s: out of memory", fn);
    n->base = (kvt_net){&inproc_ops, rank, fab->ranks, KVT_NET_DEFAULT_MAX_MSG, false};
    n->fab = fab;
    kvt__clear_error();
    *out = &n->base;
    return KVT_OK;
}
