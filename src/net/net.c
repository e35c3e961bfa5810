/* net.c - what every transport shares: buffers, checks, logging, dispatch
 * of the public entry points through the ops table. */
#include "net/net.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include "util/clock.h"
#include "util/err.h"
#include "util/log.h"
#include "util/vec.h"

kvt_status kvt__buf_reserve(kvt_buf *b, size_t cap)
{
    void *p = b->p;
    kvt_status st = kvt__grow(&p, &b->cap, cap, 1, "net: a message buffer");
    b->p = p;
    return st;
}

void kvt__buf_free(kvt_buf *b)
{
    free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
}

kvt_status kvt__net_check_peer(const kvt_net *n, uint32_t peer, const char *fn)
{
    if (peer >= n->ranks || peer == n->rank)
        return kvt__fail(KVT_EINVAL, "%s: rank %u: peer %u is not another rank of %u", fn,
                         n->rank, peer, n->ranks);
    return KVT_OK;
}

kvt_status kvt__net_check_size(const kvt_net *n, size_t len, const char *fn)
{
    if (len > n->max_msg)
        return kvt__fail(KVT_EPROTO, "%s: rank %u: message of %zu bytes exceeds max_msg %u",
                         fn, n->rank, len, n->max_msg);
    return KVT_OK;
}

kvt_status kvt__net_pick_max(uint32_t max_msg, uint32_t *out, const char *fn)
{
    if (max_msg == 0) max_msg = KVT_NET_DEFAULT_MAX_MSG;
    /* 64 bytes leaves room for a frame header; the limit bounds memory a
     * peer can make us allocate. */
    if (max_msg < 64 || max_msg > KVT_NET_LIMIT_MAX_MSG)
        return kvt__fail(KVT_EINVAL, "%s: max_msg %u is outside 64..%u", fn, max_msg,
                         KVT_NET_LIMIT_MAX_MSG);
    *out = max_msg;
    return KVT_OK;
}

void kvt__net_log(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    kvt__vlog(KVT_LOG_WARN, fmt, ap);
    va_end(ap);
}

kvt_status kvt__net_interrupted_fail(const kvt_net *n, const char *what)
{
    return kvt__fail(KVT_ECANCELED, "net %s: rank %u: %s interrupted (kvt_net_interrupt): the "
                     "net is only good for destroy now", n->ops->name, n->rank, what);
}

kvt_status kvt_net_connect(kvt_net *net, int64_t timeout_ms)
{
    KVT_CHECK_NOT_NULL(net, "kvt_net_connect");
    KVT_CHECK_ARG(timeout_ms > 0 && timeout_ms <= 3600000,
                  "kvt_net_connect: timeout_ms %lld is outside 1..3600000",
                  (long long)timeout_ms);
    kvt__clear_error();
    return kvt__net_connect(net, kvt__deadline_ns(timeout_ms));
}

kvt_status kvt_net_interrupt(kvt_net *net)
{
    KVT_CHECK_NOT_NULL(net, "kvt_net_interrupt");
    atomic_store_explicit(&net->interrupted, true, memory_order_release);
    if (net->ops->interrupt) net->ops->interrupt(net);
    return KVT_OK;
}

void kvt_net_destroy(kvt_net *net)
{
    if (net) net->ops->destroy(net);
}
