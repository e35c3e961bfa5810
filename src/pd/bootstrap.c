/* bootstrap.c - the directory. Prefill ranks register (descriptor + data
 * address); decode ranks look up the topology, and their descriptor is
 * checked against every prefill rank of their DCP position first, so an
 * inconvertible decode rank learns why at once (and nothing is stored for
 * it). One short-lived connection per request, served by its own thread
 * under a deadline; a bad or hostile peer fails alone and is logged. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "pd/ep.h"
#include "util/clock.h"
#include "util/err.h"

#define BS_MAX_PREFILL 1024
#define BS_MAX_HANDLERS 64
#define ADDR_LEN 66 /* u16 port + host[64] */

typedef struct bs_prefill {
    pd_desc desc;
    uint8_t addr[ADDR_LEN];
} bs_prefill;

struct kvt_pd_bootstrap {
    kvt_pd_net_params net;
    uint8_t *secret;
    char host[64];
    kvt_stream_auth auth;
    int lfd;
    uint16_t port;
    pthread_t th;
    bool started;
    atomic_bool stop;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint32_t handlers;
    bs_prefill prefill[BS_MAX_PREFILL];
    uint32_t nprefill;
    uint64_t lookups, refused;
};

typedef struct bs_req {
    kvt_pd_bootstrap *bs;
    kvt_stream *s;
} bs_req;

kvt_status pd_bootstrap_call_ex(kvt_stream *s, const pd_hdr *h, const void *body,
                                const kvt_pd_net_params *net, uint64_t dl, const char *what,
                                uint8_t **resp_body, uint32_t *resp_len)
{
    uint8_t hb[PD_HDR_LEN];
    pd_hdr_encode(h, hb);
    struct iovec v[2] = {{hb, PD_HDR_LEN}, {(void *)body, h->body_len}};
    kvt_status st = s->ops->sendv(s, v, h->body_len ? 2 : 1, dl);
    pd_hdr r;
    if (!st) st = kvt__stream_recv(s, hb, PD_HDR_LEN, dl);
    if (st) return kvt__fail(st, "%s: no answer from the bootstrap service", what);
    if (!pd_hdr_decode(&r, hb) || r.body_len > net->max_frame)
        return kvt__fail(KVT_EPROTO, "%s: malformed answer from the bootstrap service", what);
    uint8_t *b = malloc((size_t)r.body_len + 1);
    if (!b) return kvt__fail(KVT_ENOMEM, "%s: out of memory", what);
    st = r.body_len ? kvt__stream_recv(s, b, r.body_len, dl) : KVT_OK;
    b[r.body_len] = 0;
    if (!st && r.type == PD_F_REFUSE) {
        kvt_status rs = r.status < 0 && r.status >= KVT_EVERSION ? (kvt_status)r.status : KVT_EPROTO;
        st = kvt__fail(rs, "%s refused: %s", what, (char *)b);
    } else if (!st && r.type == PD_F_RETRY) {
        st = kvt__fail(KVT_EAGAIN, "%s: %s", what, (char *)b);
    } else if (!st && r.type != PD_F_OK && r.type != PD_F_TOPO) {
        st = kvt__fail(KVT_EPROTO, "%s: unexpected answer type %u", what, r.type);
    }
    if (!st && resp_body) {
        *resp_body = b;
        *resp_len = r.body_len;
        return KVT_OK;
    }
    free(b);
    return st;
}

kvt_status pd_bootstrap_call(kvt_stream *s, const pd_hdr *h, const void *body,
                             const kvt_pd_net_params *net, uint64_t dl, const char *what)
{
    return pd_bootstrap_call_ex(s, h, body, net, dl, what, NULL, NULL);
}

static void reply(kvt_stream *s, uint16_t type, kvt_status st, const void *body, size_t len, uint64_t dl)
{
    uint8_t hb[PD_HDR_LEN];
    pd_hdr h = {.type = type, .status = st, .body_len = (uint32_t)len};
    pd_hdr_encode(&h, hb);
    struct iovec v[2] = {{hb, PD_HDR_LEN}, {(void *)body, len}};
    (void)s->ops->sendv(s, v, len ? 2 : 1, dl);
}

static void refuse(kvt_pd_bootstrap *bs, kvt_stream *s, kvt_status st, uint64_t dl)
{
    char msg[KVT_ERRMSG_MAX];
    snprintf(msg, sizeof msg, "%s", kvt_last_error());
    pd_log("pd bootstrap: refused a peer: %s", msg);
    pthread_mutex_lock(&bs->mu);
    bs->refused++;
    pthread_mutex_unlock(&bs->mu);
    reply(s, PD_F_REFUSE, st, msg, strlen(msg), dl);
}

/* (bs->mu held) */
static kvt_status store_prefill(kvt_pd_bootstrap *bs, pd_desc *d, const uint8_t *addr)
{
    if (bs->nprefill && (bs->prefill[0].desc.tp_size != d->tp_size ||
                         bs->prefill[0].desc.dcp_size != d->dcp_size))
        return kvt__fail(KVT_EINVAL, "pd bootstrap: prefill rank says TP %u DCP %u, registered ranks say TP %u DCP %u",
                         d->tp_size, d->dcp_size, bs->prefill[0].desc.tp_size, bs->prefill[0].desc.dcp_size);
    uint32_t i = 0;
    while (i < bs->nprefill && !(bs->prefill[i].desc.tp_rank == d->tp_rank &&
                                 bs->prefill[i].desc.dcp_rank == d->dcp_rank))
        i++;
    if (i == BS_MAX_PREFILL) return kvt__fail(KVT_EFULL, "pd bootstrap: %u prefill ranks (the limit)", i);
    if (i < bs->nprefill) pd_desc_free(&bs->prefill[i].desc); /* a restarted rank replaces itself */
    else bs->nprefill++;
    bs->prefill[i].desc = *d;
    memcpy(bs->prefill[i].addr, addr, ADDR_LEN);
    *d = (pd_desc){0};
    return KVT_OK;
}

static kvt_status on_register(kvt_pd_bootstrap *bs, const uint8_t *b, uint32_t len)
{
    pd_desc d = {0};
    size_t used;
    kvt_status st = pd_desc_decode(&d, b, len, &used);
    if (st) return st;
    if (d.role != PD_ROLE_PREFILL || len - used != ADDR_LEN) {
        pd_desc_free(&d);
        return kvt__fail(KVT_EPROTO, "pd bootstrap: malformed prefill registration");
    }
    pthread_mutex_lock(&bs->mu);
    st = store_prefill(bs, &d, b + used);
    pthread_mutex_unlock(&bs->mu);
    pd_desc_free(&d);
    return st;
}

/* (bs->mu held) Encodes the topology after checking dec against it. */
static kvt_status topo(kvt_pd_bootstrap *bs, const pd_desc *dec, uint8_t **out, size_t *len)
{
    if (!bs->nprefill || bs->nprefill < bs->prefill[0].desc.tp_size * bs->prefill[0].desc.dcp_size)
        return kvt__fail(KVT_EAGAIN, "%u prefill ranks registered so far", bs->nprefill);
    size_t n = 4;
    for (uint32_t i = 0; i < bs->nprefill; i++) {
        kvt_status st = pd_topo_check(&bs->prefill[i].desc, dec);
        if (st) return st;
        n += pd_desc_wire_size(&bs->prefill[i].desc) + ADDR_LEN;
    }
    uint8_t *p = malloc(n), *o = p + 4;
    if (!p) return kvt__fail(KVT_ENOMEM, "pd bootstrap: out of memory");
    pd_put32(p, bs->nprefill);
    for (uint32_t i = 0; i < bs->nprefill; i++) {
        pd_desc_encode(&bs->prefill[i].desc, o);
        o += pd_desc_wire_size(&bs->prefill[i].desc);
        memcpy(o, bs->prefill[i].addr, ADDR_LEN);
        o += ADDR_LEN;
    }
    *out = p;
    *len = n;
    return KVT_OK;
}

static void on_lookup(kvt_pd_bootstrap *bs, kvt_stream *s, const uint8_t *b, uint32_t len, uint64_t dl)
{
    pd_desc d = {0};
    size_t used, tlen = 0;
    uint8_t *t = NULL;
    kvt_status st = pd_desc_decode(&d, b, len, &used);
    if (!st && d.role != PD_ROLE_DECODE) st = kvt__fail(KVT_EPROTO, "pd bootstrap: lookup by a non-decode rank");
    if (!st) {
        pthread_mutex_lock(&bs->mu);
        st = topo(bs, &d, &t, &tlen);
        if (!st) bs->lookups++;
        pthread_mutex_unlock(&bs->mu);
    }
    if (!st) reply(s, PD_F_TOPO, KVT_OK, t, tlen, dl);
    else if (st == KVT_EAGAIN) reply(s, PD_F_RETRY, st, kvt_last_error(), strlen(kvt_last_error()), dl);
    else refuse(bs, s, st, dl);
    free(t);
    pd_desc_free(&d);
}

static void serve(kvt_pd_bootstrap *bs, kvt_stream *s)
{
    uint64_t dl = kvt__deadline_ns(bs->net.peer_timeout_ms);
    kvt_status st = kvt__stream_auth_server(s->fd, &bs->auth, dl);
    if (st) {
        refuse(bs, s, st, dl);
        return;
    }
    uint8_t hb[PD_HDR_LEN];
    pd_hdr h = {0};
    st = kvt__stream_recv(s, hb, sizeof hb, dl);
    if (st) st = kvt__fail(KVT_EPROTO, "pd bootstrap: no request before the deadline");
    else if (!pd_hdr_decode(&h, hb)) st = kvt__fail(KVT_EPROTO, "pd bootstrap: bad frame magic");
    else if (h.body_len > bs->net.max_frame)
        st = kvt__fail(KVT_EPROTO, "pd bootstrap: %u-byte frame exceeds max_frame %u", h.body_len, bs->net.max_frame);
    uint8_t *b = st ? NULL : malloc((size_t)h.body_len + 1);
    if (!st && !b) st = kvt__fail(KVT_ENOMEM, "pd bootstrap: out of memory");
    if (!st && h.body_len && kvt__stream_recv(s, b, h.body_len, dl) != KVT_OK)
        st = kvt__fail(KVT_EPROTO, "pd bootstrap: truncated frame");
    if (!st && h.type == PD_F_REG_PREFILL) {
        st = on_register(bs, b, h.body_len);
        if (!st) reply(s, PD_F_OK, KVT_OK, NULL, 0, dl);
    } else if (!st && h.type == PD_F_LOOKUP) {
        on_lookup(bs, s, b, h.body_len, dl);
    } else if (!st) {
        st = kvt__fail(KVT_EPROTO, "pd bootstrap: unexpected frame type %u", h.type);
    }
    if (st) refuse(bs, s, st, dl);
    free(b);
}

static void *handler_main(void *arg)
{
    bs_req q = *(bs_req *)arg;
    free(arg);
    serve(q.bs, q.s);
    kvt__stream_destroy(q.s);
    pthread_mutex_lock(&q.bs->mu);
    q.bs->handlers--;
    pthread_cond_broadcast(&q.bs->cv);
    pthread_mutex_unlock(&q.bs->mu);
    return NULL;
}

static void spawn(kvt_pd_bootstrap *bs, kvt_stream *s)
{
    bs_req *q = malloc(sizeof *q);
    pthread_t th;
    pthread_mutex_lock(&bs->mu);
    bool room = bs->handlers < BS_MAX_HANDLERS && q;
    if (room) bs->handlers++;
    pthread_mutex_unlock(&bs->mu);
    if (room) {
        *q = (bs_req){bs, s};
        pthread_attr_t at;
        pthread_attr_init(&at);
        pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
        int rc = pthread_create(&th, &at, handler_main, q);
        pthread_attr_destroy(&at);
        if (rc == 0) return;
        pthread_mutex_lock(&bs->mu);
        bs->handlers--;
        pthread_mutex_unlock(&bs->mu);
    }
    pd_log("pd bootstrap: refused a connection: %d requests in service (the limit)", BS_MAX_HANDLERS);
    free(q);
    kvt__stream_destroy(s);
}

static void *accept_main(void *arg)
{
    kvt_pd_bootstrap *bs = arg;
    while (!atomic_load(&bs->stop)) {
        kvt_stream *s;
        if (kvt__stream_accept(bs->lfd, kvt__deadline_ns(20), &s) == KVT_OK) spawn(bs, s);
    }
    return NULL;
}

kvt_status kvt_pd_bootstrap_create(kvt_pd_bootstrap **out, const kvt_pd_net_params *params)
{
    static const char fn[] = "kvt_pd_bootstrap_create";
    KVT_CHECK_NOT_NULL(out, fn);
    KVT_CHECK_NOT_NULL(params, fn);
    kvt_pd_bootstrap *bs = calloc(1, sizeof *bs);
    if (!bs) return kvt__fail(KVT_ENOMEM, "%s: out of memory", fn);
    bs->lfd = -1;
    pthread_mutex_init(&bs->mu, NULL);
    pthread_cond_init(&bs->cv, NULL);
    bs->net = *params;
    kvt_status st = pd_net_defaults(&bs->net, &bs->secret, bs->host, fn);
    bs->auth = (kvt_stream_auth){bs->secret, bs->net.secret_len, "pd bootstrap"};
    if (!st) st = kvt__stream_listen(bs->host, bs->net.port, &bs->lfd, &bs->port);
    if (!st && pthread_create(&bs->th, NULL, accept_main, bs) != 0)
        st = kvt__fail(KVT_ESYS, "%s: cannot start a thread", fn);
    if (st) {
        kvt_pd_bootstrap_destroy(bs);
        return st;
    }
    bs->started = true;
    *out = bs;
    kvt__clear_error();
    return KVT_OK;
}

kvt_status kvt_pd_bootstrap_port(const kvt_pd_bootstrap *bs, uint16_t *out)
{
    KVT_CHECK_NOT_NULL(bs, "kvt_pd_bootstrap_port");
    KVT_CHECK_NOT_NULL(out, "kvt_pd_bootstrap_port");
    *out = bs->port;
    return KVT_OK;
}

kvt_status kvt_pd_bootstrap_stats_get(kvt_pd_bootstrap *bs, kvt_pd_bootstrap_stats *out)
{
    KVT_CHECK_NOT_NULL(bs, "kvt_pd_bootstrap_stats_get");
    KVT_CHECK_NOT_NULL(out, "kvt_pd_bootstrap_stats_get");
    pthread_mutex_lock(&bs->mu);
    *out = (kvt_pd_bootstrap_stats){bs->nprefill, bs->lookups, bs->refused};
    pthread_mutex_unlock(&bs->mu);
    return KVT_OK;
}

void kvt_pd_bootstrap_destroy(kvt_pd_bootstrap *bs)
{
    if (!bs) return;
    atomic_store(&bs->stop, true);
    if (bs->started) pthread_join(bs->th, NULL);
    pthread_mutex_lock(&bs->mu);
    while (bs->handlers > 0) pthread_cond_wait(&bs->cv, &bs->mu); /* each ends by its deadline */
    pthread_mutex_unlock(&bs->mu);
    for (uint32_t i = 0; i < bs->nprefill; i++) pd_desc_free(&bs->prefill[i].desc);
    if (bs->lfd >= 0) close(bs->lfd);
    free(bs->secret);
    pthread_mutex_destroy(&bs->mu);
    pthread_cond_destroy(&bs->cv);
    free(bs);
}
