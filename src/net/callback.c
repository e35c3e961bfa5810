/* callback.c - the engine lends its own point-to-point send/recv. kvtier
 * opens no sockets; it only converts deadlines to the remaining timeout and
 * bounds message sizes. The send scratch joins header and body because the
 * engine's send takes one buffer. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "net/net.h"
#include "util/clock.h"
#include "util/err.h"

/* What the engine's failing callback said (kvt_net_callback_error): set on
 * the thread running the callback, read right after it returns there. */
static _Thread_local char engine_words[256];

void kvt_net_callback_error(const char *msg)
{
    snprintf(engine_words, sizeof engine_words, "%s", msg ? msg : "");
}

/* ": <the engine's words>" when it gave some, else "". */
static const char *engine_said(char *out, size_t len)
{
    if (engine_words[0]) snprintf(out, len, ": %s", engine_words);
    else out[0] = '\0';
    return out;
}

typedef struct cb_net {
    kvt_net base;
    kvt_net_callbacks cb;
    kvt_buf scratch;
} cb_net;

/* Milliseconds left until deadline_ns, at least 1 so a call with time left
 * never degenerates into "no wait". */
static int64_t ms_left(uint64_t deadline_ns)
{
    uint64_t now = kvt__now_ns();
    if (now >= deadline_ns) return 0;
    return (int64_t)((deadline_ns - now + 999999) / 1000000);
}

static kvt_status cb_send(kvt_net *n, uint32_t peer, const void *hdr, size_t hlen,
                          const void *body, size_t blen, uint64_t deadline_ns)
{
    static const char fn[] = "net callback send";
    cb_net *c = (cb_net *)n;
    kvt_status st = kvt__net_check_peer(n, peer, fn);
    if (st == KVT_OK) st = kvt__net_check_size(n, hlen + blen, fn);
    if (st == KVT_OK) st = kvt__buf_reserve(&c->scratch, hlen + blen);
    if (st != KVT_OK) return st;
    if (hlen) memcpy(c->scratch.p, hdr, hlen);
    if (blen) memcpy(c->scratch.p + hlen, body, blen);
    int64_t left = ms_left(deadline_ns);
    if (left == 0) return kvt__fail(KVT_ETIMEDOUT, "%s: rank %u -> %u: deadline passed", fn,
                                    n->rank, peer);
    engine_words[0] = '\0';
    kvt_status said = c->cb.send(c->cb.ctx, peer, c->scratch.p, hlen + blen, left);
    st = said == KVT_OK || said == KVT_ETIMEDOUT ? said : KVT_ECONN;
    char words[sizeof engine_words + 2];
    if (st != KVT_OK)
        return kvt__fail(st, "%s: rank %u -> %u: the engine's send failed (%s)%s", fn, n->rank,
                         peer, kvt_status_name(said), engine_said(words, sizeof words));
    return KVT_OK;
}

static kvt_status cb_recv(kvt_net *n, uint32_t peer, kvt_buf *buf, uint64_t deadline_ns)
{
    static const char fn[] = "net callback recv";
    cb_net *c = (cb_net *)n;
    kvt_status st = kvt__net_check_peer(n, peer, fn);
    if (st == KVT_OK) st = kvt__buf_reserve(buf, n->max_msg);
    if (st != KVT_OK) return st;
    int64_t left = ms_left(deadline_ns);
    if (left == 0)
        return kvt__fail(KVT_ETIMEDOUT, "%s: rank %u: nothing from rank %u by the deadline", fn,
                         n->rank, peer);
    size_t len = 0;
    engine_words[0] = '\0';
    st = c->cb.recv(c->cb.ctx, peer, buf->p, n->max_msg, &len, left);
    char words[sizeof engine_words + 2];
    if (st == KVT_ETIMEDOUT)
        return kvt__fail(st, "%s: rank %u: nothing from rank %u by the deadline", fn, n->rank,
                         peer);
    if (st == KVT_EPROTO || (st == KVT_OK && len > n->max_msg))
        return kvt__fail(KVT_EPROTO, "%s: rank %u: message from rank %u exceeds max_msg %u", fn,
                         n->rank, peer, n->max_msg);
    if (st != KVT_OK)
        return kvt__fail(KVT_ECONN, "%s: rank %u <- %u: the engine's recv failed (%s)%s", fn,
                         n->rank, peer, kvt_status_name(st), engine_said(words, sizeof words));
    buf->len = len;
    return KVT_OK;
}

static void cb_destroy(kvt_net *n)
{
    cb_net *c = (cb_net *)n;
    kvt__buf_free(&c->scratch);
    free(c);
}

static const kvt_net_ops cb_ops = {
    .name = "callback",
    .send = cb_send,
    .recv = cb_recv,
    .connect = NULL,
    .destroy = cb_destroy,
};

kvt_status kvt_net_callback_create(kvt_net **out, uint32_t rank, uint32_t ranks,
                                   const kvt_net_callbacks *cb, uint32_t max_msg)
{
    static const char fn[] = "kvt_net_callback_create";
    KVT_CHECK_NOT_NULL(out, fn);
    KVT_CHECK_NOT_NULL(cb, fn);
    KVT_CHECK_ARG(cb->send && cb->recv, "%s: cb->send and cb->recv must both be set", fn);
    KVT_CHECK_ARG(ranks >= 1 && ranks <= KVT_NET_MAX_RANKS, "%s: ranks %u is outside 1..%u",
                  fn, ranks, KVT_NET_MAX_RANKS);
    KVT_CHECK_ARG(rank < ranks, "%s: rank %u is not below ranks %u", fn, rank, ranks);
    uint32_t mm;
    kvt_status st = kvt__net_pick_max(max_msg, &mm, fn);
    if (st != KVT_OK) return st;
    cb_net *c = calloc(1, sizeof *c);
    if (!c) return kvt__fail(KVT_ENOMEM, "%s: out of memory", fn);
    c->base = (kvt_net){&cb_ops, rank, ranks, mm, false};
    c->cb = *cb;
    kvt__clear_error();
    *out = &c->base;
    return KVT_OK;
}
