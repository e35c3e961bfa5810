/* proto.c - encoding and decoding the node server's frames (proto.h). */
#include "server/proto.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "layout/layout.h"
#include "net/fdio.h"
#include "util/clock.h"
#include "util/err.h"

/* ------------------------------------------------------------------ */
/* Encoding                                                           */

void kvt__srv_buf_free(kvt_srv_buf *b)
{
    free(b->p);
    memset(b, 0, sizeof *b);
}

static bool grow(kvt_srv_buf *b, size_t n)
{
    if (b->oom) return false;
    if (n > KVT_SRV_MAX_MSG || b->len + n > KVT_SRV_MAX_MSG) {
        b->oom = true;
        return false;
    }
    if (b->len + n <= b->cap) return true;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + n) cap *= 2;
    uint8_t *p = realloc(b->p, cap);
    if (!p) {
        b->oom = true;
        return false;
    }
    b->p = p;
    b->cap = cap;
    return true;
}

void kvt__srv_put32(kvt_srv_buf *b, uint32_t v)
{
    if (!grow(b, 4)) return;
    memcpy(b->p + b->len, &v, 4);
    b->len += 4;
}

void kvt__srv_put64(kvt_srv_buf *b, uint64_t v)
{
    if (!grow(b, 8)) return;
    memcpy(b->p + b->len, &v, 8);
    b->len += 8;
}

void kvt__srv_put_bytes(kvt_srv_buf *b, const void *p, size_t n)
{
    size_t padded = (n + 3) & ~(size_t)3;
    if (!grow(b, padded)) return;
    if (n) memcpy(b->p + b->len, p, n);
    memset(b->p + b->len + n, 0, padded - n);
    b->len += padded;
}

uint64_t kvt__srv_get64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

/* ------------------------------------------------------------------ */
/* Decoding: a cursor that latches the first overrun                  */

typedef struct rd {
    const uint8_t *p;
    size_t left;
    bool bad;
} rd;

static uint32_t get32(rd *r)
{
    uint32_t v = 0;
    if (r->left < 4) {
        r->bad = true;
        return 0;
    }
    memcpy(&v, r->p, 4);
    r->p += 4;
    r->left -= 4;
    return v;
}

static uint64_t get64(rd *r)
{
    uint64_t v = 0;
    if (r->left < 8) {
        r->bad = true;
        return 0;
    }
    memcpy(&v, r->p, 8);
    r->p += 8;
    r->left -= 8;
    return v;
}

/* n bytes (padded to 4 on the wire), or NULL past the end. */
static const uint8_t *get_bytes(rd *r, size_t n)
{
    size_t padded = (n + 3) & ~(size_t)3;
    if (padded < n || r->left < padded) {
        r->bad = true;
        return NULL;
    }
    const uint8_t *p = r->p;
    r->p += padded;
    r->left -= padded;
    return p;
}

static kvt_status done(const rd *r, const char *what)
{
    if (r->bad) return kvt__fail(KVT_EPROTO, "%s: message truncated", what);
    if (r->left) return kvt__fail(KVT_EPROTO, "%s: %zu bytes past the end", what, r->left);
    return KVT_OK;
}

/* ------------------------------------------------------------------ */
/* Header                                                             */

void kvt__srv_hdr_encode(uint8_t out[KVT_SRV_HDR], uint16_t op, uint32_t len, int32_t status)
{
    uint32_t magic = KVT_SRV_MAGIC;
    uint16_t version = KVT_SRV_VERSION;
    memcpy(out, &magic, 4);
    memcpy(out + 4, &op, 2);
    memcpy(out + 6, &version, 2);
    memcpy(out + 8, &len, 4);
    memcpy(out + 12, &status, 4);
}

kvt_status kvt__srv_hdr_decode(const uint8_t in[KVT_SRV_HDR], kvt_srv_hdr *out)
{
    kvt_srv_hdr h;
    memcpy(&h.magic, in, 4);
    memcpy(&h.op, in + 4, 2);
    memcpy(&h.version, in + 6, 2);
    memcpy(&h.len, in + 8, 4);
    memcpy(&h.status, in + 12, 4);
    if (h.magic != KVT_SRV_MAGIC)
        return kvt__fail(KVT_EPROTO, "frame: magic 0x%08x is not a kvtier server frame", h.magic);
    if (h.version != KVT_SRV_VERSION)
        return kvt__fail(KVT_EVERSION, "frame: protocol version %u, this library speaks %u",
                         h.version, KVT_SRV_VERSION);
    if (h.len > KVT_SRV_MAX_MSG)
        return kvt__fail(KVT_EPROTO, "frame: len %u is over the %u-byte bound", h.len,
                         KVT_SRV_MAX_MSG);
    uint16_t op = h.op & (uint16_t)~KVT_SRV_REPLY;
    if (op < KVT_SRV_HELLO || op > KVT_SRV_END_SYNC)
        return kvt__fail(KVT_EPROTO, "frame: unknown op %u", op);
    if (!(h.op & KVT_SRV_REPLY) && h.status != 0)
        return kvt__fail(KVT_EPROTO, "frame: a request carries status %d", h.status);
    if (h.status != 0 && !kvt__status_known(h.status))
        return kvt__fail(KVT_EPROTO, "frame: unknown status %d", h.status);
    *out = h;
    return KVT_OK;
}

const char *kvt__srv_op_name(uint16_t op)
{
    static const char *const names[] = {
        [KVT_SRV_HELLO] = "HELLO", [KVT_SRV_LOOKUP] = "LOOKUP", [KVT_SRV_PREPARE] = "PREPARE",
        [KVT_SRV_LAUNCH] = "LAUNCH", [KVT_SRV_END] = "END", [KVT_SRV_CANCEL] = "CANCEL",
        [KVT_SRV_STATS] = "STATS", [KVT_SRV_FLUSH] = "FLUSH", [KVT_SRV_GEOMETRY] = "GEOMETRY",
        [KVT_SRV_SESSION] = "SESSION", [KVT_SRV_PEEK] = "PEEK", [KVT_SRV_STATS_ALL] = "STATS_ALL",
        [KVT_SRV_CLEAR] = "CLEAR", [KVT_SRV_PEEK_MANY] = "PEEK_MANY", [KVT_SRV_END_SYNC] = "END_SYNC",
    };
    return op < sizeof names / sizeof *names && names[op] ? names[op] : "an unknown op";
}

/* ------------------------------------------------------------------ */
/* HELLO                                                              */

kvt_status kvt__srv_hello_encode(kvt_srv_buf *b, uint32_t pid, const kvt_geometry *geo,
                                 uint32_t block_tokens)
{
    kvt__srv_put32(b, KVT_SRV_VERSION);
    kvt__srv_put32(b, pid);
    kvt__srv_put32(b, geo->num_layers);
    kvt__srv_put32(b, geo->tokens_per_page);
    kvt__srv_put32(b, (uint32_t)geo->layout);
    kvt__srv_put32(b, block_tokens);
    for (uint32_t l = 0; l < geo->num_layers; l++) {
        const kvt_layer_spec *s = &geo->layers[l];
        kvt__srv_put32(b, s->num_components);
        for (uint32_t c = 0; c < s->num_components && c < KVT_MAX_COMPONENTS; c++) {
            kvt__srv_put32(b, s->component[c].kv_heads);
            kvt__srv_put32(b, s->component[c].head_dim);
            kvt__srv_put32(b, s->component[c].elem_size);
        }
    }
    return b->oom ? kvt__fail(KVT_ENOMEM, "hello: no memory") : KVT_OK;
}

kvt_status kvt__srv_hello_decode(const uint8_t *p, size_t len, bool from_server,
                                 kvt_srv_hello *out)
{
    /* The same bytes are a client's HELLO or the server's GEOMETRY reply;
     * name the side that sent them so a version mismatch reads right. */
    const char *what = from_server ? "geometry" : "hello";
    const char *sender = from_server ? "server" : "client";
    const char *receiver = from_server ? "client" : "server";
    rd r = {p, len, false};
    uint32_t proto = get32(&r), pid = get32(&r);
    uint32_t layers = get32(&r), tpp = get32(&r), layout = get32(&r), bt = get32(&r);
    if (r.bad) return done(&r, what);
    if (proto != KVT_SRV_VERSION)
        return kvt__fail(KVT_EVERSION, "%s: %s speaks protocol %u, %s %u", what, sender, proto,
                         receiver, KVT_SRV_VERSION);
    if (layers == 0 || layers > KVT_MAX_LAYERS)
        return kvt__fail(KVT_EPROTO, "%s: num_layers %u (1..%u)", what, layers, KVT_MAX_LAYERS);
    if (layout > KVT_LAYOUT_PAGE_FIRST)
        return kvt__fail(KVT_EPROTO, "%s: layout %u is unknown", what, layout);
    if (bt > KVT_SRV_MAX_BLOCK_TOKENS || (bt && tpp && bt % tpp))
        return kvt__fail(KVT_EPROTO, "%s: block_tokens %u (0, or a multiple of tokens_per_page "
                         "%u up to %u)", what, bt, tpp, KVT_SRV_MAX_BLOCK_TOKENS);
    kvt_geometry *geo = NULL;
    kvt_status st = kvt_geometry_create(&geo, layers, tpp, (kvt_layout)layout);
    if (st) return kvt__wrap_error(KVT_EPROTO, what);
    for (uint32_t l = 0; l < layers && !st; l++) {
        kvt_layer_spec s = {0};
        s.num_components = get32(&r);
        if (s.num_components == 0 || s.num_components > KVT_MAX_COMPONENTS) {
            st = kvt__fail(KVT_EPROTO, "%s: layer %u has %u components", what, l,
                           s.num_components);
            break;
        }
        for (uint32_t c = 0; c < s.num_components; c++) {
            s.component[c].kv_heads = get32(&r);
            s.component[c].head_dim = get32(&r);
            s.component[c].elem_size = get32(&r);
        }
        if (r.bad) break;
        if (kvt_geometry_set_layer(geo, l, &s)) st = kvt__wrap_error(KVT_EPROTO, what);
    }
    if (!st) st = done(&r, what);
    if (!st && kvt_geometry_validate(geo)) st = kvt__wrap_error(KVT_EPROTO, what);
    if (st) {
        kvt_geometry_destroy(geo);
        return st;
    }
    out->proto = proto;
    out->pid = pid;
    out->block_tokens = bt;
    out->geo = geo;
    return KVT_OK;
}

void kvt__srv_hello_rep_encode(kvt_srv_buf *b, const kvt_srv_hello_rep *h)
{
    kvt__srv_put64(b, h->map_bytes);
    kvt__srv_put64(b, h->stride);
    kvt__srv_put64(b, h->block_bytes);
    kvt__srv_put32(b, h->block_tokens);
    kvt__srv_put32(b, h->num_blocks);
    kvt__srv_put32(b, h->server_pid);
    kvt__srv_put32(b, h->flags);
}

kvt_status kvt__srv_hello_rep_decode(const uint8_t *p, size_t len, kvt_srv_hello_rep *out)
{
    static const char what[] = "hello reply";
    rd r = {p, len, false};
    kvt_srv_hello_rep h;
    h.map_bytes = get64(&r);
    h.stride = get64(&r);
    h.block_bytes = get64(&r);
    h.block_tokens = get32(&r);
    h.num_blocks = get32(&r);
    h.server_pid = get32(&r);
    h.flags = get32(&r);
    kvt_status st = done(&r, what);
    if (st) return st;
    if (h.block_bytes == 0 || h.stride < h.block_bytes || h.block_tokens == 0 ||
        h.num_blocks == 0 || h.map_bytes / h.stride < h.num_blocks)
        return kvt__fail(KVT_EPROTO, "%s: inconsistent tier (%u blocks of %llu bytes, stride "
                         "%llu, map %llu bytes)", what, h.num_blocks,
                         (unsigned long long)h.block_bytes, (unsigned long long)h.stride,
                         (unsigned long long)h.map_bytes);
    *out = h;
    return KVT_OK;
}

/* ------------------------------------------------------------------ */
/* Requests                                                           */

kvt_status kvt__srv_req_encode(kvt_srv_buf *b, const kvt_request *req)
{
    uint32_t count = req->keys ? req->num_keys : req->num_tokens;
    if (count > KVT_SRV_MAX_TOKENS)
        return kvt__fail(KVT_EINVAL, "%s is %u (at most %u through the server)",
                         req->keys ? "num_keys" : "num_tokens", count, KVT_SRV_MAX_TOKENS);
    if (req->ns_len > KVT_SRV_MAX_NS)
        return kvt__fail(KVT_EINVAL, "ns_len is %u (at most %u)", req->ns_len, KVT_SRV_MAX_NS);
    kvt__srv_put32(b, !req->keys ? 0 : req->flags & KVT_REQ_INDEPENDENT_KEYS ? 2 : 1);
    kvt__srv_put32(b, req->ns_len);
    kvt__srv_put_bytes(b, req->ns, req->ns_len);
    kvt__srv_put32(b, count);
    if (req->keys) {
        for (uint32_t i = 0; i < count; i++) {
            uint32_t kl = req->keys[i].len;
            if (kl == 0 || kl > KVT_SRV_MAX_KEY || !req->keys[i].data)
                return kvt__fail(KVT_EINVAL, "req->keys[%u] is %u bytes%s (1..%u through the "
                                 "server)", i, kl, req->keys[i].data ? "" : " at NULL",
                                 KVT_SRV_MAX_KEY);
            kvt__srv_put32(b, kl);
            kvt__srv_put_bytes(b, req->keys[i].data, kl);
        }
    } else if (count) {
        kvt__srv_put_bytes(b, req->tokens, (size_t)count * 4);
    }
    return b->oom ? kvt__fail(KVT_ENOMEM, "request of %u %s: no memory (or over the %u-byte "
                              "frame bound)", count, req->keys ? "keys" : "tokens",
                              KVT_SRV_MAX_MSG)
                  : KVT_OK;
}

kvt_status kvt__srv_req_decode(const uint8_t *p, size_t len, kvt_srv_req *out)
{
    static const char what[] = "request";
    rd r = {p, len, false};
    kvt_srv_req q = {0};
    q.form = get32(&r);
    q.ns_len = get32(&r);
    if (r.bad) return done(&r, what);
    if (q.form > 2) return kvt__fail(KVT_EPROTO, "%s: form %u is unknown", what, q.form);
    if (q.ns_len > KVT_SRV_MAX_NS)
        return kvt__fail(KVT_EPROTO, "%s: ns_len %u (at most %u)", what, q.ns_len,
                         KVT_SRV_MAX_NS);
    q.ns = get_bytes(&r, q.ns_len);
    q.count = get32(&r);
    if (r.bad) return done(&r, what);
    if (q.count > KVT_SRV_MAX_TOKENS)
        return kvt__fail(KVT_EPROTO, "%s: count %u (at most %u)", what, q.count,
                         KVT_SRV_MAX_TOKENS);
    if (q.form == 0) {
        const uint8_t *t = get_bytes(&r, (size_t)q.count * 4);
        if (!t) return done(&r, what);
        q.tokens = malloc(q.count ? (size_t)q.count * 4 : 4);
        if (!q.tokens) return kvt__fail(KVT_ENOMEM, "%s: no memory for %u tokens", what, q.count);
        if (q.count) memcpy(q.tokens, t, (size_t)q.count * 4);
    } else {
        /* Each key takes at least 8 bytes on the wire: bound the array by
         * what the frame can hold before allocating it. */
        if ((size_t)q.count > r.left / 8)
            return kvt__fail(KVT_EPROTO, "%s: %u keys cannot fit in %zu bytes", what, q.count,
                             r.left);
        q.keys = malloc(q.count ? (size_t)q.count * sizeof *q.keys : sizeof *q.keys);
        if (!q.keys) return kvt__fail(KVT_ENOMEM, "%s: no memory for %u keys", what, q.count);
        for (uint32_t i = 0; i < q.count && !r.bad; i++) {
            uint32_t kl = get32(&r);
            if (r.bad) break;
            if (kl == 0 || kl > KVT_SRV_MAX_KEY) {
                free(q.keys);
                return kvt__fail(KVT_EPROTO, "%s: key %u is %u bytes (1..%u)", what, i, kl,
                                 KVT_SRV_MAX_KEY);
            }
            q.keys[i].data = get_bytes(&r, kl); /* points into p */
            q.keys[i].len = kl;
        }
    }
    kvt_status st = done(&r, what);
    if (st) {
        free(q.tokens);
        free(q.keys);
        return st;
    }
    if (q.ns_len == 0) q.ns = NULL;
    *out = q;
    return KVT_OK;
}

/* ------------------------------------------------------------------ */
/* STATS_ALL, CLEAR, PEEK_MANY                                         */

static void quotas_encode(kvt_srv_buf *b, const kvt_srv_quota *q, uint32_t nq)
{
    kvt__srv_put32(b, nq);
    for (uint32_t i = 0; i < nq; i++) {
        uint32_t len = (uint32_t)strnlen(q[i].prefix, KVT_SRV_QUOTA_PREFIX);
        kvt__srv_put32(b, len);
        kvt__srv_put_bytes(b, q[i].prefix, len);
        kvt__srv_put64(b, q[i].limit);
        kvt__srv_put64(b, q[i].used);
        kvt__srv_put64(b, q[i].limited);
        kvt__srv_put64(b, q[i].evicted);
    }
}

/* The quotas after the tiers; r is left at the end. */
static void quotas_decode(rd *r, kvt_srv_quota *out, uint32_t max, uint32_t *n, bool *too_many)
{
    uint32_t count = get32(r);
    *too_many = count > KVT_SRV_MAX_QUOTAS;
    if (r->bad || *too_many) return;
    for (uint32_t i = 0; i < count && !r->bad; i++) {
        kvt_srv_quota q = {0};
        uint32_t len = get32(r);
        if (len > KVT_SRV_QUOTA_PREFIX) {
            r->bad = true;
            return;
        }
        const uint8_t *b = get_bytes(r, len);
        if (r->bad) return;
        memcpy(q.prefix, b, len);
        q.limit = get64(r);
        q.used = get64(r);
        q.limited = get64(r);
        q.evicted = get64(r);
        if (i < max && out) out[i] = q;
    }
    *n = count;
}

enum { INFO_FIELDS = 8 }; /* kvt_srv_info's u64 fields, in order */

static void info_encode(kvt_srv_buf *b, const kvt_srv_info *in)
{
    const uint64_t f[INFO_FIELDS] = {in->pid, in->uptime_ms, in->clients, in->max_clients,
                                     in->geometries, in->max_geometries, in->cpu_capacity,
                                     in->metrics_port};
    kvt__srv_put32(b, INFO_FIELDS);
    for (int k = 0; k < INFO_FIELDS; k++) kvt__srv_put64(b, f[k]);
    uint32_t len = (uint32_t)strnlen(in->version, KVT_SRV_VERSION_MAX);
    kvt__srv_put32(b, len);
    kvt__srv_put_bytes(b, in->version, len);
}

/* After the quotas; r is left at the end. */
static void info_decode(rd *r, kvt_srv_info *out)
{
    uint32_t nf = get32(r);
    if (r->bad || nf > 4096) {
        r->bad = true;
        return;
    }
    uint64_t f[INFO_FIELDS] = {0};
    for (uint32_t k = 0; k < nf && !r->bad; k++) {
        uint64_t v = get64(r);
        if (k < INFO_FIELDS) f[k] = v; /* a newer server's extra fields are skipped */
    }
    uint32_t len = get32(r);
    if (r->bad || len > KVT_SRV_VERSION_MAX) {
        r->bad = true;
        return;
    }
    const uint8_t *v = get_bytes(r, len);
    if (r->bad || !out) return;
    *out = (kvt_srv_info){f[0], f[1], f[2], f[3], f[4], f[5], f[6], f[7], ""};
    for (uint32_t i = 0; i < len; i++) /* shown to a person: printable bytes only */
        out->version[i] = v[i] >= 0x20 && v[i] < 0x7f ? (char)v[i] : '?';
}

void kvt__srv_tiers_encode(kvt_srv_buf *b, const kvt_srv_tier *t, uint32_t n,
                           const kvt_srv_quota *q, uint32_t nq, const kvt_srv_info *info)
{
    kvt__srv_put32(b, n);
    kvt__srv_put32(b, (uint32_t)(sizeof(kvt_cache_stats) / sizeof(uint64_t)));
    for (uint32_t i = 0; i < n; i++) {
        kvt__srv_put64(b, t[i].fingerprint);
        kvt__srv_put32(b, t[i].num_layers);
        kvt__srv_put32(b, t[i].tokens_per_page);
        kvt__srv_put32(b, t[i].block_tokens);
        kvt__srv_put32(b, 0);
        kvt__srv_put64(b, t[i].bytes_per_token);
        uint64_t f[sizeof(kvt_cache_stats) / sizeof(uint64_t)];
        memcpy(f, &t[i].stats, sizeof f);
        for (size_t k = 0; k < sizeof f / sizeof f[0]; k++) kvt__srv_put64(b, f[k]);
    }
    quotas_encode(b, q, nq);
    info_encode(b, info);
}

kvt_status kvt__srv_tiers_decode(const uint8_t *p, size_t len, kvt_srv_tier *out, uint32_t max,
                                 uint32_t *n, kvt_srv_quota *qout, uint32_t qmax, uint32_t *nq,
                                 kvt_srv_info *info)
{
    static const char what[] = "tier stats";
    enum { NF = sizeof(kvt_cache_stats) / sizeof(uint64_t) };
    rd r = {p, len, false};
    uint32_t count = get32(&r), nf = get32(&r);
    if (r.bad) return done(&r, what);
    if (count > KVT_SRV_MAX_TIERS || nf > 4096)
        return kvt__fail(KVT_EPROTO, "%s: %u tiers of %u fields (at most %u tiers)", what, count,
                         nf, KVT_SRV_MAX_TIERS);
    for (uint32_t i = 0; i < count && !r.bad; i++) {
        kvt_srv_tier t = {0};
        t.fingerprint = get64(&r);
        t.num_layers = get32(&r);
        t.tokens_per_page = get32(&r);
        t.block_tokens = get32(&r);
        (void)get32(&r);
        t.bytes_per_token = get64(&r);
        uint64_t f[NF] = {0};
        for (uint32_t k = 0; k < nf && !r.bad; k++) {
            uint64_t v = get64(&r);
            if (k < NF) f[k] = v; /* a newer server's extra fields are skipped */
        }
        memcpy(&t.stats, f, sizeof f);
        if (i < max && out) out[i] = t;
    }
    bool too_many = false;
    uint32_t quotas = 0;
    quotas_decode(&r, qout, qmax, &quotas, &too_many);
    if (too_many)
        return kvt__fail(KVT_EPROTO, "%s: more than %u quotas", what, KVT_SRV_MAX_QUOTAS);
    info_decode(&r, info);
    kvt_status st = done(&r, what);
    if (!st) {
        *n = count;
        if (nq) *nq = quotas;
    }
    return st;
}

kvt_status kvt__srv_clear_encode(kvt_srv_buf *b, const void *ns, uint32_t ns_len)
{
    if (ns_len > KVT_SRV_MAX_NS)
        return kvt__fail(KVT_EINVAL, "ns_len is %u (at most %u)", ns_len, KVT_SRV_MAX_NS);
    kvt__srv_put32(b, 0);
    kvt__srv_put32(b, ns_len);
    kvt__srv_put_bytes(b, ns, ns_len);
    return b->oom ? kvt__fail(KVT_ENOMEM, "clear: no memory") : KVT_OK;
}

kvt_status kvt__srv_clear_decode(const uint8_t *p, size_t len, const uint8_t **ns,
                                 uint32_t *ns_len)
{
    static const char what[] = "clear";
    rd r = {p, len, false};
    uint32_t flags = get32(&r), n = get32(&r);
    if (r.bad) return done(&r, what);
    if (flags) return kvt__fail(KVT_EPROTO, "%s: flags 0x%x are unknown", what, flags);
    if (n > KVT_SRV_MAX_NS)
        return kvt__fail(KVT_EPROTO, "%s: ns_len %u (at most %u)", what, n, KVT_SRV_MAX_NS);
    const uint8_t *q = get_bytes(&r, n);
    kvt_status st = done(&r, what);
    if (st) return st;
    *ns = n ? q : NULL;
    *ns_len = n;
    return KVT_OK;
}

kvt_status kvt__srv_peek_many_encode(kvt_srv_buf *b, const kvt_request *reqs, uint32_t n)
{
    if (n > KVT_SRV_MAX_PEEKS)
        return kvt__fail(KVT_EINVAL, "%u requests (at most %u in one round trip)", n,
                         KVT_SRV_MAX_PEEKS);
    kvt__srv_put32(b, n);
    kvt__srv_put32(b, 0);
    for (uint32_t i = 0; i < n; i++) {
        size_t at = b->len;
        kvt__srv_put32(b, 0); /* its length, below */
        kvt_status st = kvt__srv_req_encode(b, &reqs[i]);
        if (st) {
            char what[32];
            snprintf(what, sizeof what, "request %u", i);
            return kvt__wrap_error(st, what);
        }
        if (b->oom) break;
        uint32_t len = (uint32_t)(b->len - at - 4);
        memcpy(b->p + at, &len, 4);
    }
    return b->oom ? kvt__fail(KVT_ENOMEM, "%u requests: no memory (or over the %u-byte frame "
                              "bound)", n, KVT_SRV_MAX_MSG)
                  : KVT_OK;
}

kvt_status kvt__srv_peek_many_decode(const uint8_t *p, size_t len, kvt_srv_span **spans,
                                     uint32_t *n)
{
    static const char what[] = "peek many";
    rd r = {p, len, false};
    uint32_t count = get32(&r), zero = get32(&r);
    if (r.bad) return done(&r, what);
    if (zero) return kvt__fail(KVT_EPROTO, "%s: flags 0x%x are unknown", what, zero);
    /* Each request takes at least 16 bytes (its length, form, ns_len, count). */
    if (count > KVT_SRV_MAX_PEEKS || (size_t)count > r.left / 16)
        return kvt__fail(KVT_EPROTO, "%s: %u requests in %zu bytes (at most %u)", what, count,
                         r.left, KVT_SRV_MAX_PEEKS);
    kvt_srv_span *s = malloc((count ? count : 1) * sizeof *s);
    if (!s) return kvt__fail(KVT_ENOMEM, "%s: no memory for %u requests", what, count);
    for (uint32_t i = 0; i < count && !r.bad; i++) {
        uint32_t l = get32(&r);
        if (r.bad) break;
        if (l & 3) {
            free(s);
            return kvt__fail(KVT_EPROTO, "%s: request %u is %u bytes (not a multiple of 4)",
                             what, i, l);
        }
        s[i].p = get_bytes(&r, l);
        s[i].len = l;
    }
    kvt_status st = done(&r, what);
    if (st) {
        free(s);
        return st;
    }
    *spans = s;
    *n = count;
    return KVT_OK;
}

void kvt__srv_peek_answers_encode(kvt_srv_buf *b, const int32_t *status, const uint32_t *matched,
                                  uint32_t n)
{
    kvt__srv_put32(b, n);
    kvt__srv_put32(b, 0);
    for (uint32_t i = 0; i < n; i++) {
        kvt__srv_put32(b, (uint32_t)status[i]);
        kvt__srv_put32(b, matched[i]);
    }
}

kvt_status kvt__srv_peek_answers_decode(const uint8_t *p, size_t len, uint32_t n,
                                        int32_t *status, uint32_t *matched)
{
    static const char what[] = "peek answers";
    rd r = {p, len, false};
    uint32_t count = get32(&r);
    (void)get32(&r);
    if (r.bad) return done(&r, what);
    if (count != n) return kvt__fail(KVT_EPROTO, "%s: %u answers to %u requests", what, count, n);
    if ((size_t)count > r.left / 8) return kvt__fail(KVT_EPROTO, "%s: message truncated", what);
    for (uint32_t i = 0; i < count; i++) {
        status[i] = (int32_t)get32(&r);
        matched[i] = get32(&r);
    }
    return done(&r, what);
}

/* ------------------------------------------------------------------ */
/* Small fixed messages                                               */

void kvt__srv_task_rep_encode(kvt_srv_buf *b, uint64_t task, uint32_t a, uint32_t c)
{
    kvt__srv_put64(b, task);
    kvt__srv_put32(b, a);
    kvt__srv_put32(b, c);
}

kvt_status kvt__srv_task_rep_decode(const uint8_t *p, size_t len, uint64_t *task, uint32_t *a,
                                    uint32_t *c)
{
    rd r = {p, len, false};
    uint64_t t = get64(&r);
    uint32_t x = get32(&r), y = get32(&r);
    kvt_status st = done(&r, "task reply");
    if (st) return st;
    *task = t;
    *a = x;
    *c = y;
    return KVT_OK;
}

void kvt__srv_id_encode(kvt_srv_buf *b, uint64_t task) { kvt__srv_put64(b, task); }

kvt_status kvt__srv_id_decode(const uint8_t *p, size_t len, uint64_t *task)
{
    rd r = {p, len, false};
    uint64_t t = get64(&r);
    kvt_status st = done(&r, "task id");
    if (st) return st;
    *task = t;
    return KVT_OK;
}

void kvt__srv_launch_rep_encode(kvt_srv_buf *b, const kvt_srv_launch_rep *l,
                                const uint64_t *offsets, const uint64_t *sums)
{
    kvt__srv_put32(b, l->kind);
    kvt__srv_put32(b, l->first_token);
    kvt__srv_put32(b, l->num_tokens);
    kvt__srv_put32(b, l->num_blocks);
    kvt__srv_put32(b, (uint32_t)l->bad_status);
    kvt__srv_put32(b, l->flags);
    for (uint32_t i = 0; i < l->num_blocks; i++) kvt__srv_put64(b, offsets[i]);
    kvt__srv_put32(b, l->num_layers);
    uint64_t ns = (uint64_t)l->num_blocks * l->num_layers;
    for (uint64_t i = 0; i < ns; i++) kvt__srv_put64(b, sums[i]);
}

kvt_status kvt__srv_launch_rep_decode(const uint8_t *p, size_t len, kvt_srv_launch_rep *out)
{
    static const char what[] = "launch reply";
    rd r = {p, len, false};
    kvt_srv_launch_rep l;
    l.kind = get32(&r);
    l.first_token = get32(&r);
    l.num_tokens = get32(&r);
    l.num_blocks = get32(&r);
    l.bad_status = (int32_t)get32(&r);
    l.flags = get32(&r);
    if (r.bad) return done(&r, what);
    if (l.flags & ~(uint32_t)KVT_SRV_LAUNCH_PENDING)
        return kvt__fail(KVT_EPROTO, "%s: unknown flags 0x%x", what, l.flags);
    if ((l.flags & KVT_SRV_LAUNCH_PENDING) && l.num_blocks != 0)
        return kvt__fail(KVT_EPROTO, "%s: pending, yet %u block offsets", what, l.num_blocks);
    if (l.kind != KVT_TASK_LOAD && l.kind != KVT_TASK_STORE)
        return kvt__fail(KVT_EPROTO, "%s: kind %u", what, l.kind);
    if (!kvt__status_known(l.bad_status))
        return kvt__fail(KVT_EPROTO, "%s: bad_status %d is unknown", what, l.bad_status);
    if (l.num_blocks > KVT_SRV_MAX_BLOCKS)
        return kvt__fail(KVT_EPROTO, "%s: %u blocks (at most %u)", what, l.num_blocks,
                         KVT_SRV_MAX_BLOCKS);
    l.offsets = get_bytes(&r, (size_t)l.num_blocks * 8);
    l.num_layers = get32(&r);
    if (r.bad) return done(&r, what);
    if (l.num_layers > KVT_MAX_LAYERS)
        return kvt__fail(KVT_EPROTO, "%s: %u layers (at most %u)", what, l.num_layers,
                         KVT_MAX_LAYERS);
    if (l.kind == KVT_TASK_STORE && l.num_layers)
        return kvt__fail(KVT_EPROTO, "%s: a store with %u layer checksums per block", what,
                         l.num_layers);
    if (l.kind == KVT_TASK_LOAD && l.num_blocks && !l.num_layers)
        return kvt__fail(KVT_EPROTO, "%s: a load of %u blocks without their checksums", what,
                         l.num_blocks);
    l.sums = get_bytes(&r, (size_t)l.num_blocks * l.num_layers * 8);
    kvt_status st = done(&r, what);
    if (st) return st;
    *out = l;
    return KVT_OK;
}

void kvt__srv_end_encode(kvt_srv_buf *b, uint64_t task, int32_t status, const uint64_t *sums,
                         uint32_t n, uint32_t num_layers)
{
    kvt__srv_put64(b, task);
    kvt__srv_put32(b, (uint32_t)status);
    kvt__srv_put32(b, n);
    kvt__srv_put32(b, num_layers);
    uint64_t ns = (uint64_t)n * num_layers;
    for (uint64_t i = 0; i < ns; i++) kvt__srv_put64(b, sums[i]);
}

kvt_status kvt__srv_end_decode(const uint8_t *p, size_t len, kvt_srv_end *out)
{
    static const char what[] = "end";
    rd r = {p, len, false};
    kvt_srv_end e;
    e.task = get64(&r);
    e.status = (int32_t)get32(&r);
    e.n = get32(&r);
    e.num_layers = get32(&r);
    if (r.bad) return done(&r, what);
    if (!kvt__status_known(e.status))
        return kvt__fail(KVT_EPROTO, "%s: status %d is unknown", what, e.status);
    if (e.n > KVT_SRV_MAX_BLOCKS)
        return kvt__fail(KVT_EPROTO, "%s: checksums of %u blocks (at most %u)", what, e.n,
                         KVT_SRV_MAX_BLOCKS);
    if (e.num_layers > KVT_MAX_LAYERS)
        return kvt__fail(KVT_EPROTO, "%s: checksums of %u layers (at most %u)", what,
                         e.num_layers, KVT_MAX_LAYERS);
    /* n * num_layers * 8 < 2^22 * 2^10 * 8: no overflow; get_bytes bounds it by len */
    e.checksums = get_bytes(&r, (size_t)e.n * e.num_layers * 8);
    kvt_status st = done(&r, what);
    if (st) return st;
    *out = e;
    return KVT_OK;
}

void kvt__srv_result_encode(kvt_srv_buf *b, const kvt_task_result *t)
{
    kvt__srv_put64(b, t->task);
    kvt__srv_put32(b, (uint32_t)t->kind);
    kvt__srv_put32(b, (uint32_t)t->status);
    kvt__srv_put32(b, t->first_token);
    kvt__srv_put32(b, t->num_tokens);
    kvt__srv_put64(b, t->bytes);
}

kvt_status kvt__srv_result_decode(const uint8_t *p, size_t len, kvt_task_result *out)
{
    static const char what[] = "result";
    rd r = {p, len, false};
    kvt_task_result t;
    t.task = get64(&r);
    uint32_t kind = get32(&r);
    int32_t status = (int32_t)get32(&r);
    t.first_token = get32(&r);
    t.num_tokens = get32(&r);
    t.bytes = get64(&r);
    kvt_status st = done(&r, what);
    if (st) return st;
    if (kind != KVT_TASK_LOAD && kind != KVT_TASK_STORE)
        return kvt__fail(KVT_EPROTO, "%s: kind %u", what, kind);
    if (!kvt__status_known(status))
        return kvt__fail(KVT_EPROTO, "%s: status %d is unknown", what, status);
    t.kind = (kvt_task_kind)kind;
    t.status = (kvt_status)status;
    *out = t;
    return KVT_OK;
}

#define STATS_FIELDS (sizeof(kvt_cache_stats) / sizeof(uint64_t))

void kvt__srv_stats_encode(kvt_srv_buf *b, const kvt_cache_stats *s)
{
    uint64_t f[STATS_FIELDS];
    memcpy(f, s, sizeof f);
    kvt__srv_put32(b, (uint32_t)STATS_FIELDS);
    kvt__srv_put32(b, 0);
    for (size_t i = 0; i < STATS_FIELDS; i++) kvt__srv_put64(b, f[i]);
}

kvt_status kvt__srv_stats_decode(const uint8_t *p, size_t len, kvt_cache_stats *out)
{
    rd r = {p, len, false};
    uint32_t n = get32(&r);
    (void)get32(&r);
    if (r.bad) return done(&r, "stats");
    if (n > 4096) return kvt__fail(KVT_EPROTO, "stats: %u fields", n);
    uint64_t f[STATS_FIELDS] = {0};
    for (uint32_t i = 0; i < n; i++) {
        uint64_t v = get64(&r);
        if (i < STATS_FIELDS) f[i] = v; /* a newer server's extra fields are skipped */
    }
    kvt_status st = done(&r, "stats");
    if (st) return st;
    memcpy(out, f, sizeof f);
    return KVT_OK;
}

/* ------------------------------------------------------------------ */
/* Frames on a socket                                                 */

kvt_status kvt__srv_send_frame(int fd, uint16_t op, int32_t status, const void *payload,
                               size_t len, int fd_pass, uint64_t deadline_ns)
{
    uint8_t hdr[KVT_SRV_HDR];
    kvt__srv_hdr_encode(hdr, op, (uint32_t)len, status);
    struct iovec iov[2] = {{hdr, sizeof hdr}, {(void *)payload, len}};
    int cnt = len ? 2 : 1;
    if (fd_pass >= 0) {
        /* The fd rides on the header's first byte; the rest goes as usual. */
        union {
            struct cmsghdr h;
            char buf[CMSG_SPACE(sizeof(int))];
        } u;
        memset(&u, 0, sizeof u);
        struct iovec one = {hdr, 1};
        struct msghdr m = {.msg_iov = &one, .msg_iovlen = 1, .msg_control = u.buf,
                           .msg_controllen = sizeof u.buf};
        struct cmsghdr *c = CMSG_FIRSTHDR(&m);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(c), &fd_pass, sizeof(int));
        for (;;) {
            kvt_status st = kvt__fd_wait(fd, POLLOUT, deadline_ns);
            if (st) return st;
            ssize_t n = sendmsg(fd, &m, MSG_NOSIGNAL);
            if (n == 1) break;
            if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
            return KVT_ECONN;
        }
        iov[0].iov_base = hdr + 1;
        iov[0].iov_len = sizeof hdr - 1;
    }
    return kvt__fd_io(fd, iov, cnt, deadline_ns, 1);
}

kvt_status kvt__srv_recv_frame(int fd, kvt_srv_hdr *hdr, uint8_t **payload, int *fd_got,
                               uint64_t deadline_ns)
{
    uint8_t h[KVT_SRV_HDR];
    size_t got = 0;
    if (fd_got) *fd_got = -1;
    if (fd_got) {
        /* recvmsg for the header, so a passed fd is caught with its byte. */
        while (got < sizeof h) {
            kvt_status st = kvt__fd_wait(fd, POLLIN, deadline_ns);
            if (st) return st;
            union {
                struct cmsghdr c;
                char buf[CMSG_SPACE(sizeof(int))];
            } u;
            struct iovec v = {h + got, sizeof h - got};
            struct msghdr m = {.msg_iov = &v, .msg_iovlen = 1, .msg_control = u.buf,
                               .msg_controllen = sizeof u.buf};
            ssize_t n = recvmsg(fd, &m, MSG_CMSG_CLOEXEC);
            if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
            if (n <= 0) return KVT_ECONN;
            for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
                if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
                int passed;
                memcpy(&passed, CMSG_DATA(c), sizeof passed);
                if (*fd_got < 0) *fd_got = passed;
                else close(passed);
            }
            got += (size_t)n;
        }
    } else {
        struct iovec v = {h, sizeof h};
        kvt_status st = kvt__fd_io(fd, &v, 1, deadline_ns, 0);
        if (st) return st;
    }
    kvt_srv_hdr hd;
    kvt_status st = kvt__srv_hdr_decode(h, &hd);
    uint8_t *p = NULL;
    if (!st && hd.len) {
        p = malloc(hd.len);
        if (!p) st = kvt__fail(KVT_ENOMEM, "frame: no memory for %u bytes", hd.len);
    }
    if (!st && hd.len) {
        struct iovec v = {p, hd.len};
        st = kvt__fd_io(fd, &v, 1, deadline_ns, 0);
    }
    if (st) {
        free(p);
        if (fd_got && *fd_got >= 0) {
            close(*fd_got);
            *fd_got = -1;
        }
        return st;
    }
    *hdr = hd;
    *payload = p;
    return KVT_OK;
}
