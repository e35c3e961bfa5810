/* faulty.c - deterministic fault injection for tests: wraps an endpoint and
 * perturbs exactly one of this rank's sends (chosen by the plan, which tests
 * derive from a seed), so every failure run is reproducible. */
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "net/net.h"
#include "util/err.h"

typedef struct faulty_net {
    kvt_net base;
    kvt_net *inner;
    kvt_fault_plan plan;
    uint64_t sends;   /* sends counted by the plan's filter */
    kvt_buf held;     /* a reordered message, sent after the next one */
    uint32_t held_peer;
    int holding;
} faulty_net;

const char *kvt__fault_name(kvt_fault_kind k)
{
    static const char *names[] = {"none", "drop", "duplicate", "delay", "reorder", "corrupt"};
    return (unsigned)k < sizeof names / sizeof names[0] ? names[k] : "unknown";
}

static kvt_status flush_held(faulty_net *f, uint64_t deadline_ns)
{
    if (!f->holding) return KVT_OK;
    f->holding = 0;
    return kvt__net_send(f->inner, f->held_peer, f->held.p, f->held.len, NULL, 0, deadline_ns);
}

static kvt_status hold(faulty_net *f, uint32_t peer, const void *hdr, size_t hlen,
                       const void *body, size_t blen)
{
    kvt_status st = kvt__buf_reserve(&f->held, hlen + blen);
    if (st != KVT_OK) return st;
    if (hlen) memcpy(f->held.p, hdr, hlen);
    if (blen) memcpy(f->held.p + hlen, body, blen);
    f->held.len = hlen + blen;
    f->held_peer = peer;
    f->holding = 1;
    return KVT_OK;
}

static kvt_status send_corrupt(faulty_net *f, uint32_t peer, const void *hdr, size_t hlen,
                               const void *body, size_t blen, uint64_t deadline_ns)
{
    kvt_status st = hold(f, peer, hdr, hlen, body, blen);
    if (st != KVT_OK) return st;
    f->holding = 0;
    f->held.p[f->held.len / 2] ^= 0x5a;
    return kvt__net_send(f->inner, peer, f->held.p, f->held.len, NULL, 0, deadline_ns);
}

static kvt_status faulty_send(kvt_net *n, uint32_t peer, const void *hdr, size_t hlen,
                              const void *body, size_t blen, uint64_t deadline_ns)
{
    faulty_net *f = (faulty_net *)n;
    int counted = f->plan.peer == UINT32_MAX || f->plan.peer == peer;
    int hit = counted && f->sends == f->plan.at_send;
    if (counted) f->sends++;
    kvt_status st = KVT_OK;
    if (!hit) {
        st = kvt__net_send(f->inner, peer, hdr, hlen, body, blen, deadline_ns);
        /* Reorder within the pair: messages to other peers travel on
         * independent streams, so overtaking them would be no reorder. */
        if (st == KVT_OK && f->holding && f->held_peer == peer) st = flush_held(f, deadline_ns);
        return st;
    }
    switch (f->plan.kind) {
    case KVT_FAULT_DROP:
        return KVT_OK;
    case KVT_FAULT_DUP:
        st = kvt__net_send(f->inner, peer, hdr, hlen, body, blen, deadline_ns);
        if (st == KVT_OK) st = kvt__net_send(f->inner, peer, hdr, hlen, body, blen, deadline_ns);
        return st;
    case KVT_FAULT_DELAY: {
        struct timespec ts = {f->plan.delay_ms / 1000, (long)(f->plan.delay_ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
        return kvt__net_send(f->inner, peer, hdr, hlen, body, blen, deadline_ns);
    }
    case KVT_FAULT_REORDER:
        return hold(f, peer, hdr, hlen, body, blen);
    case KVT_FAULT_CORRUPT:
        return send_corrupt(f, peer, hdr, hlen, body, blen, deadline_ns);
    default:
        return kvt__net_send(f->inner, peer, hdr, hlen, body, blen, deadline_ns);
    }
}

static kvt_status faulty_recv(kvt_net *n, uint32_t peer, kvt_buf *buf, uint64_t deadline_ns)
{
    return kvt__net_recv(((faulty_net *)n)->inner, peer, buf, deadline_ns);
}

static kvt_status faulty_connect(kvt_net *n, uint64_t deadline_ns)
{
    kvt_net *in = ((faulty_net *)n)->inner;
    return kvt__net_connect(in, deadline_ns);
}

static void faulty_destroy(kvt_net *n)
{
    faulty_net *f = (faulty_net *)n;
    kvt_net_destroy(f->inner);
    kvt__buf_free(&f->held);
    free(f);
}

static void faulty_interrupt(kvt_net *n)
{
    (void)kvt_net_interrupt(((faulty_net *)n)->inner);
}

static const kvt_net_ops faulty_ops = {
    .name = "faulty",
    .send = faulty_send,
    .recv = faulty_recv,
    .connect = faulty_connect,
    .destroy = faulty_destroy,
    .interrupt = faulty_interrupt,
};

kvt_status kvt__net_faulty_create(kvt_net **out, kvt_net *inner, const kvt_fault_plan *plan)
{
    static const char fn[] = "kvt__net_faulty_create";
    KVT_CHECK_NOT_NULL(out, fn);
    KVT_CHECK_NOT_NULL(inner, fn);
    KVT_CHECK_NOT_NULL(plan, fn);
    faulty_net *f = calloc(1, sizeof *f);
    if (!f) return kvt__fail(KVT_ENOMEM, "%s: out of memory", fn);
    f->base = (kvt_net){&faulty_ops, inner->rank, inner->ranks, inner->max_msg, false};
    f->inner = inner;
    f->plan = *plan;
    *out = &f->base;
    return KVT_OK;
}
