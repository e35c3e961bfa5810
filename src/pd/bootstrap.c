/* bootstrap.c - the directory. Prefill ranks register (descriptor + data
 * address) and hold their entry as a lease they renew; decode ranks look up
 * the topology, and their descriptor is checked against every live prefill
 * rank of their DCP position first, so an inconvertible decode rank learns
 * why at once (and nothing is stored for it). One short-lived connection
 * per request, served by its own thread: authentication and the request
 * must arrive within the greeting deadline (min(peer_timeout_ms, 2 s)),
 * and when all request slots are busy the oldest connection that has not
 * delivered its request yet is dropped to make room, so silent strangers
 * never lock registrations and lookups out. A bad or hostile peer fails
 * alone and is logged.
 *
 * Leases: an entry lives lease_ms (4 x peer_timeout_ms, at least 1 s) after
 * its last REG_PREFILL; expired entries are invisible to every request and
 * dropped (and logged) by the next one. All live entries share one TP/DCP
 * configuration; a registration of another configuration is refused
 * (KVT_EBUSY, naming both and when those leases end) until every entry of
 * the old one expired or was unregistered. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <sodium.h>
#include "pd/bootstrap.h"
#include "pd/ep.h"
#include "util/clock.h"
#include "util/err.h"
#include "util/sync.h"

#define BS_MAX_PREFILL PD_MAX_RANKS
#define BS_MAX_HANDLERS 64
#define BS_SLOTS (2 * BS_MAX_HANDLERS) /* in service, plus dropped ones still ending */
#define BS_SLOT_WAIT_MS 1000 /* a new connection waits this long for a slot */
#define BS_RETRY_LIST 360   /* characters of missing ranks in a RETRY text */
#define ADDR_LEN 66         /* u16 port + host[64] */
/* Plans a lookup may compute to learn which missing prefill ranks its
 * decode rank does not need (one per missing position and decode
 * position): beyond it every missing rank counts as needed, which only
 * makes the decode rank wait for all of them. Bounds what one request can
 * cost with bs->mu held (~5 us a plan at 2048 entries). */
#define BS_TOPO_BUDGET 16384u

typedef struct bs_prefill {
    pd_desc desc;
    uint8_t addr[ADDR_LEN];
    uint64_t expires_ns; /* its lease ends (monotonic) */
    char src[48];        /* the address its registration came from */
    uint8_t token[PD_BS_TOKEN_LEN]; /* random, given to the registrant in REG's OK: it alone
                                     * renews (without a secret) and unregisters the entry */
} bs_prefill;

/* One request in service. fd is shut down (never closed) by others only
 * under bs->mu while used; the handler closes it under bs->mu. */
typedef struct bs_slot {
    bool used;
    bool greeting; /* its request has not fully arrived: may be evicted */
    bool evicted;
    kvt_stream *s;
    uint64_t since_ns;
} bs_slot;

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
    uint32_t lease_ms, greet_ms, max_req;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint32_t handlers; /* threads (used slots) */
    uint32_t active;   /* used slots not evicted: at most BS_MAX_HANDLERS */
    bs_slot slots[BS_SLOTS];
    bs_prefill prefill[BS_MAX_PREFILL];
    uint32_t nprefill;
    uint64_t lookups, refused;
};

typedef struct bs_req {
    kvt_pd_bootstrap *bs;
    uint32_t slot;
    kvt_stream *s;
} bs_req;

/* ---- client side ---- */

/* The statuses a PD peer refuses a request with: the service's checks of a
 * registration or lookup (a descriptor it cannot read or convert, another
 * TP/DCP configuration holding the table, a full table, its own memory),
 * a sender's plan for a decode rank. A REFUSE carrying any other status is
 * the peer breaking the protocol (KVT_EPROTO): a peer cannot make this
 * end's call return what it never meets itself (KVT_ECANCELED, KVT_ENOSPC),
 * and kvtier.h's Returns: lines hold. */
static kvt_status refusal_status(int32_t status)
{
    static const kvt_status known[] = {KVT_EINVAL, KVT_ENOMEM, KVT_EBUSY, KVT_EFULL, KVT_EGEOMETRY,
                                       KVT_EUNSUPPORTED, KVT_EPROTO, KVT_EAUTH, KVT_EVERSION};
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if (status == (int32_t)known[i]) return known[i];
    return KVT_EPROTO;
}

static kvt_status bs_call(kvt_stream *s, pd_mac *m, const pd_hdr *h, const void *body,
                          const kvt_pd_net_params *net, uint64_t dl, const char *what, pd_hdr *resp,
                          uint8_t **resp_body, uint32_t *resp_len)
{
    uint8_t hb[PD_HDR_LEN];
    pd_hdr_encode(h, hb);
    kvt_status st = pd_mac_send(m, s, hb, body, h->body_len, dl, false);
    pd_hdr r;
    if (!st) st = pd_mac_recv_head(m, s, hb, dl);
    /* what names the call and the peer: the service, or a prefill rank */
    if (st == KVT_EAUTH) return kvt__wrap_error(st, what);
    if (st) return kvt__fail(st, "%s: no answer (%s)", what,
                             st == KVT_ETIMEDOUT ? "timed out" : "the peer closed the connection");
    char why[160];
    if (!pd_hdr_decode(&r, hb)) /* a PD peer of another wire version, or not one at all */
        return kvt__fail(pd_magic_other_version(hb) ? KVT_EVERSION : KVT_EPROTO, "%s: the answer: %s", what,
                         pd_magic_why(hb, why, sizeof why));
    if (r.body_len > net->max_frame)
        return kvt__fail(KVT_EPROTO, "%s: a %u-byte answer exceeds this endpoint's max_frame %u",
                         what, r.body_len, net->max_frame);
    uint8_t *b = malloc((size_t)r.body_len + 1);
    if (!b) return kvt__fail(KVT_ENOMEM, "%s: out of memory", what);
    st = pd_mac_recv_body(m, s, b, r.body_len, dl);
    if (st == KVT_EAUTH) kvt__wrap_error(st, what);
    else if (st) st = kvt__fail(st, "%s: truncated answer", what);
    b[r.body_len] = 0;
    if (!st && r.type == PD_F_REFUSE) {
        kvt_status rs = refusal_status(r.status);
        if (rs == KVT_EPROTO && r.status != KVT_EPROTO)
            st = kvt__fail(rs, "%s refused with status %d, which no PD peer refuses with: %s", what,
                           (int)r.status, (char *)b);
        else
            st = kvt__fail(rs, "%s refused: %s", what, (char *)b);
    } else if (!st && r.type == PD_F_RETRY) {
        st = kvt__fail(KVT_EAGAIN, "%s: %s", what, (char *)b);
    } else if (!st && r.type != PD_F_OK && r.type != PD_F_TOPO) {
        st = kvt__fail(KVT_EPROTO, "%s: unexpected answer type %u", what, r.type);
    }
    if (!st && resp) *resp = r;
    if (!st && resp_body) {
        *resp_body = b;
        *resp_len = r.body_len;
        return KVT_OK;
    }
    free(b);
    return st;
}

kvt_status pd_bootstrap_call_ex(kvt_stream *s, pd_mac *m, const pd_hdr *h, const void *body,
                                const kvt_pd_net_params *net, uint64_t dl, const char *what,
                                uint8_t **resp_body, uint32_t *resp_len)
{
    return bs_call(s, m, h, body, net, dl, what, NULL, resp_body, resp_len);
}

kvt_status pd_bootstrap_call(kvt_stream *s, pd_mac *m, const pd_hdr *h, const void *body,
                             const kvt_pd_net_params *net, uint64_t dl, const char *what)
{
    return bs_call(s, m, h, body, net, dl, what, NULL, NULL, NULL);
}

kvt_status pd_retry_refused(const char *what, const char *peer)
{
    char why[KVT_ERRMSG_MAX];
    snprintf(why, sizeof why, "%s", kvt_last_error());
    return kvt__fail(KVT_EPROTO, "%s: %s answered RETRY, which only the bootstrap service sends, and only to "
                     "lookups (%s)", what, peer, why);
}

/* Connects to the service and authenticates; *m gets the connection's
 * frame keys when there is a secret (NULL otherwise). */
static kvt_status bs_connect(const char *host, uint16_t port, kvt_stream_auth *a, uint64_t dl,
                             kvt_stream **s, pd_mac **m)
{
    uint8_t key[PD_SESSION_KEY_LEN];
    a->session_key = key;
    *m = NULL;
    kvt_status st = kvt__stream_connect(host, port, a, dl, s);
    if (!st && a->secret && (st = pd_mac_new(m, key, false)) != KVT_OK) kvt__stream_destroy(*s);
    sodium_memzero(key, sizeof key);
    return st;
}

/* REG_PREFILL or UNREG_PREFILL of desc at data_host:data_port with the
 * entry's token (in: the one this rank holds, zeros for none; a REG's OK
 * gives the entry's, written back); *a0 gets the OK's a0. */
static kvt_status prefill_request(const kvt_pd_net_params *net, const kvt_stream_auth *auth,
                                  const char *bs_host, uint16_t bs_port, const pd_desc *desc,
                                  const char *data_host, uint16_t data_port, uint64_t dl,
                                  uint16_t type, const char *what, uint8_t *token, uint32_t *a0)
{
    KVT_CHECK_ARG(net && desc && data_host && token, "%s: net, desc, data_host or token is NULL",
                  what);
    size_t hl = strlen(data_host);
    KVT_CHECK_ARG(hl < 64, "%s: data_host is %zu characters (at most 63)", what, hl);
    kvt_stream_auth a = auth ? *auth : (kvt_stream_auth){0};
    a.who = "pd sender -> bootstrap";
    kvt_pd_net_params np = *net; /* the OK's token needs room in a frame */
    if (!np.max_frame) np.max_frame = 64u << 20;
    net = &np;
    kvt_stream *bs;
    pd_mac *m;
    kvt_status st = bs_connect(bs_host, bs_port, &a, dl, &bs, &m);
    if (st) return st;
    size_t dlen = pd_desc_wire_size(desc), blen = dlen + ADDR_LEN + PD_BS_TOKEN_LEN;
    uint8_t *body = calloc(1, blen);
    if (!body) {
        kvt__stream_destroy(bs);
        pd_mac_free(m);
        return kvt__fail(KVT_ENOMEM, "%s: out of memory", what);
    }
    pd_desc_encode(desc, body);
    pd_put16(body + dlen, data_port);
    memcpy(body + dlen + 2, data_host, hl);
    memcpy(body + dlen + ADDR_LEN, token, PD_BS_TOKEN_LEN);
    pd_hdr h = {.type = type, .body_len = (uint32_t)blen}, r = {0};
    uint8_t *rb = NULL;
    uint32_t rl = 0;
    st = bs_call(bs, m, &h, body, net, dl, what, &r, &rb, &rl);
    free(body);
    kvt__stream_destroy(bs);
    pd_mac_free(m);
    char peer[96];
    snprintf(peer, sizeof peer, "the bootstrap service at %s:%u", bs_host ? bs_host : "127.0.0.1", bs_port);
    /* RETRY answers lookups only: this service breaks the protocol */
    if (st == KVT_EAGAIN) return pd_retry_refused(what, peer);
    if (st != KVT_OK) return st;
    bool tokened = type != PD_F_REG_PREFILL || rl == PD_BS_TOKEN_LEN;
    if (type == PD_F_REG_PREFILL && tokened) memcpy(token, rb, PD_BS_TOKEN_LEN);
    free(rb);
    if (r.type != PD_F_OK) return kvt__fail(KVT_EPROTO, "%s: unexpected answer type %u", what, r.type);
    if (!tokened)
        return kvt__fail(KVT_EPROTO, "%s: the OK carries %u bytes, not the entry's %u-byte token",
                         what, rl, PD_BS_TOKEN_LEN);
    if (a0) *a0 = r.a0;
    return KVT_OK;
}

kvt_status pd_bootstrap_register(const kvt_pd_net_params *net, const kvt_stream_auth *auth,
                                 const char *bs_host, uint16_t bs_port, const pd_desc *desc,
                                 const char *data_host, uint16_t data_port, uint64_t deadline_ns,
                                 uint8_t token[PD_BS_TOKEN_LEN], uint32_t *lease_ms_out)
{
    return prefill_request(net, auth, bs_host, bs_port, desc, data_host, data_port, deadline_ns,
                           PD_F_REG_PREFILL, "pd sender: bootstrap registration", token,
                           lease_ms_out);
}

kvt_status pd_bootstrap_unregister(const kvt_pd_net_params *net, const kvt_stream_auth *auth,
                                   const char *bs_host, uint16_t bs_port, const pd_desc *desc,
                                   const char *data_host, uint16_t data_port, uint64_t deadline_ns,
                                   const uint8_t token[PD_BS_TOKEN_LEN], uint32_t *removed_out)
{
    uint8_t t[PD_BS_TOKEN_LEN] = {0};
    if (token) memcpy(t, token, sizeof t);
    return prefill_request(net, auth, bs_host, bs_port, desc, data_host, data_port, deadline_ns,
                           PD_F_UNREG_PREFILL, "pd sender: bootstrap unregistration", t,
                           removed_out);
}

kvt_status pd_bootstrap_lookup(const kvt_pd_net_params *net, const kvt_stream_auth *auth,
                               const char *bs_host, uint16_t bs_port, const pd_desc *desc,
                               uint64_t deadline_ns, uint8_t **topo, uint32_t *topo_len)
{
    static const char what[] = "pd receiver: lookup";
    KVT_CHECK_ARG(net && desc && topo && topo_len, "%s: net, desc, topo or topo_len is NULL", what);
    kvt_stream_auth a = auth ? *auth : (kvt_stream_auth){0};
    a.who = "pd receiver -> bootstrap";
    kvt_stream *s;
    pd_mac *m;
    kvt_status st = bs_connect(bs_host, bs_port, &a, deadline_ns, &s, &m);
    if (st) return st;
    size_t n = pd_desc_wire_size(desc);
    uint8_t *body = malloc(n);
    if (!body) st = kvt__fail(KVT_ENOMEM, "%s: out of memory", what);
    if (!st) {
        pd_desc_encode(desc, body);
        pd_hdr h = {.type = PD_F_LOOKUP, .body_len = (uint32_t)n}, r = {0};
        st = bs_call(s, m, &h, body, net, deadline_ns, what, &r, topo, topo_len);
        if (!st && r.type != PD_F_TOPO) {
            free(*topo);
            *topo = NULL;
            st = kvt__fail(KVT_EPROTO, "%s: unexpected answer type %u", what, r.type);
        }
    }
    free(body);
    kvt__stream_destroy(s);
    pd_mac_free(m);
    return st;
}

/* ---- the service ---- */

/* One request's connection: the stream and, with a secret, its frame keys. */
typedef struct bs_link {
    kvt_stream *s;
    pd_mac *m;
} bs_link;

static void reply(bs_link *l, uint16_t type, kvt_status st, uint32_t a0, const void *body, size_t len,
                  uint64_t dl)
{
    uint8_t hb[PD_HDR_LEN];
    pd_hdr h = {.type = type, .status = st, .a0 = a0, .body_len = (uint32_t)len};
    pd_hdr_encode(&h, hb);
    (void)pd_mac_send(l->m, l->s, hb, body, len, dl, false);
}

static void refuse(kvt_pd_bootstrap *bs, bs_link *s, const char *addr, kvt_status st, uint64_t dl)
{
    char msg[KVT_ERRMSG_MAX];
    snprintf(msg, sizeof msg, "%s", kvt_last_error());
    if (!atomic_load(&bs->stop)) pd_log("pd bootstrap: refused the peer at %s: %s", addr, msg);
    pthread_mutex_lock(&bs->mu);
    bs->refused++;
    pthread_mutex_unlock(&bs->mu);
    reply(s, PD_F_REFUSE, st, 0, msg, strlen(msg), dl);
}

static void rank_name(char *o, size_t n, const pd_desc *d)
{
    snprintf(o, n, "tp%u/%u dcp%u/%u", d->tp_rank, d->tp_size, d->dcp_rank, d->dcp_size);
}

static void addr_name(char *o, size_t n, const uint8_t *addr)
{
    snprintf(o, n, "%.64s:%u", (const char *)addr + 2, pd_get16(addr));
}

static uint64_t ms_until(uint64_t t, uint64_t now) { return t > now ? (t - now + 999999) / 1000000 : 0; }

static void drop_entry(kvt_pd_bootstrap *bs, uint32_t i)
{
    pd_desc_free(&bs->prefill[i].desc);
    bs->prefill[i] = bs->prefill[--bs->nprefill];
    bs->prefill[bs->nprefill] = (bs_prefill){0};
}

/* (bs->mu held) Drops the entries whose lease ended by now. */
static void purge(kvt_pd_bootstrap *bs, uint64_t now)
{
    for (uint32_t i = bs->nprefill; i-- > 0;) {
        bs_prefill *p = &bs->prefill[i];
        if (p->expires_ns > now) continue;
        char rn[64], an[80];
        rank_name(rn, sizeof rn, &p->desc);
        addr_name(an, sizeof an, p->addr);
        pd_log("pd bootstrap: dropped prefill %s at %s: its lease expired %llu ms ago (not renewed within %u ms)",
               rn, an, (unsigned long long)((now - p->expires_ns) / 1000000), bs->lease_ms);
        drop_entry(bs, i);
    }
}

static bool same_pos(const pd_desc *a, const pd_desc *b)
{
    return a->tp_rank == b->tp_rank && a->dcp_rank == b->dcp_rank;
}

static bool same_config(const pd_desc *a, const pd_desc *b)
{
    return a->tp_size == b->tp_size && a->dcp_size == b->dcp_size;
}

/* (bs->mu held) Adds or renews d's entry (takes d's entries on success). */
/* Whether two descriptors are the same to the byte (their encodings). */
static bool same_desc(const pd_desc *a, const pd_desc *b)
{
    size_t n = pd_desc_wire_size(a);
    if (n != pd_desc_wire_size(b)) return false;
    uint8_t *x = malloc(2 * n);
    if (!x) return false;
    pd_desc_encode(a, x);
    pd_desc_encode(b, x + n);
    bool same = !memcmp(x, x + n, n);
    free(x);
    return same;
}

/* (bs->mu held) token: the one the registrant presented (zeros: none);
 * on KVT_OK it becomes what the OK gives back: the entry's token when the
 * registrant made the entry or proved it holds it, zeros otherwise. */
static kvt_status store_prefill(kvt_pd_bootstrap *bs, pd_desc *d, const uint8_t *addr, const char *src,
                                uint64_t now, uint8_t token[PD_BS_TOKEN_LEN])
{
    char rn[64], an[80];
    rank_name(rn, sizeof rn, d);
    addr_name(an, sizeof an, addr);
    purge(bs, now); /* positions fit the table: pd_desc_decode bounds tp_size x dcp_size */
    /* Live entries of another configuration refuse it, except this very
     * endpoint's own entry (same position and address: it restarted). */
    uint32_t nconf = 0;
    uint64_t first = UINT64_MAX, last = 0;
    const bs_prefill *c = NULL;
    for (uint32_t i = 0; i < bs->nprefill; i++) {
        const bs_prefill *p = &bs->prefill[i];
        if (same_config(&p->desc, d) || (same_pos(&p->desc, d) && !memcmp(p->addr, addr, ADDR_LEN)))
            continue;
        nconf++;
        if (p->expires_ns < first) {
            first = p->expires_ns;
            c = p;
        }
        if (p->expires_ns > last) last = p->expires_ns;
    }
    if (nconf) {
        char cn[64], ca[80];
        rank_name(cn, sizeof cn, &c->desc);
        addr_name(ca, sizeof ca, c->addr);
        return kvt__fail(KVT_EBUSY,
                         "pd bootstrap: prefill rank %s at %s says tp_size %u, dcp_size %u, but %u live registration%s (oldest %s at %s) %s tp_size %u, dcp_size %u; the oldest lease expires in %llu ms, the last in %llu ms, unless renewed",
                         rn, an, d->tp_size, d->dcp_size, nconf, nconf == 1 ? "" : "s", cn, ca,
                         nconf == 1 ? "says" : "say", c->desc.tp_size, c->desc.dcp_size,
                         (unsigned long long)ms_until(first, now), (unsigned long long)ms_until(last, now));
    }
    uint32_t i = 0;
    while (i < bs->nprefill && !same_pos(&bs->prefill[i].desc, d)) i++;
    if (i == BS_MAX_PREFILL) /* cannot happen: positions are unique and ranks <= the table */
        return kvt__fail(KVT_EFULL, "pd bootstrap: %u prefill ranks (the limit)", i);
    bs_prefill *p = &bs->prefill[i];
    bool renewal = i < bs->nprefill && !memcmp(p->addr, addr, ADDR_LEN);
    bool proved = i < bs->nprefill && !sodium_memcmp(p->token, token, PD_BS_TOKEN_LEN);
    if (renewal && !proved && !bs->secret && !same_desc(&p->desc, d)) {
        /* The address is public (every lookup names it): without the
         * token, only a renewal that changes nothing is taken. */
        return kvt__fail(KVT_EBUSY,
                         "pd bootstrap: prefill rank %s at %s (from %s) would change its live registration without "
                         "its token (a process other than the one that registered it); refused until the lease "
                         "lapses in %llu ms, as this service has no secret",
                         rn, an, src, (unsigned long long)ms_until(p->expires_ns, now));
    }
    if (i < bs->nprefill && !renewal && !bs->secret) {
        /* Without a secret anyone may register: a live position is not
         * handed to another address (its decode ranks would take that
         * peer's bytes for KV) until its lease lapses or it unregisters. */
        char oa[80];
        addr_name(oa, sizeof oa, p->addr);
        return kvt__fail(KVT_EBUSY,
                         "pd bootstrap: prefill rank %s is registered at %s (from %s) with a live lease for %llu ms "
                         "more; %s (from %s) may take it over only after it lapses or unregisters, as this service "
                         "has no secret (set net.secret on every end to let a restarted rank replace its entry at once)",
                         rn, oa, p->src, (unsigned long long)ms_until(p->expires_ns, now), an, src);
    }
    if (i < bs->nprefill) {
        if (!renewal) {
            char oa[80];
            addr_name(oa, sizeof oa, p->addr);
            pd_log("pd bootstrap: prefill %s moved from %s to %s (a restarted rank replaces its entry)", rn, oa, an);
        }
        pd_desc_free(&p->desc);
    } else {
        bs->nprefill++;
    }
    /* A new entry, or one taken over (with the secret), gets a new token;
     * an unproved renewal of the same descriptor keeps it and learns nothing. */
    bool fresh = !proved && (!renewal || bs->secret);
    if (fresh) randombytes_buf(p->token, PD_BS_TOKEN_LEN);
    if (fresh || proved) memcpy(token, p->token, PD_BS_TOKEN_LEN);
    else memset(token, 0, PD_BS_TOKEN_LEN);
    p->desc = *d;
    memcpy(p->addr, addr, ADDR_LEN);
    snprintf(p->src, sizeof p->src, "%s", src);
    p->expires_ns = now + (uint64_t)bs->lease_ms * 1000000ull;
    *d = (pd_desc){0};
    return KVT_OK;
}

static kvt_status decode_prefill(pd_desc *d, const uint8_t *b, uint32_t len, const char *what)
{
    size_t used;
    kvt_status st = pd_desc_decode(d, b, len, &used);
    if (st) return st;
    if (d->role != PD_ROLE_PREFILL || len - used != ADDR_LEN + PD_BS_TOKEN_LEN) {
        pd_desc_free(d);
        return kvt__fail(KVT_EPROTO, "pd bootstrap: malformed prefill %s (role %u, %zu address and token bytes, want role %u, %u)",
                         what, d->role, len - used, PD_ROLE_PREFILL, ADDR_LEN + PD_BS_TOKEN_LEN);
    }
    return KVT_OK;
}

static kvt_status on_register(kvt_pd_bootstrap *bs, const uint8_t *b, uint32_t len, const char *src,
                               uint8_t token[PD_BS_TOKEN_LEN])
{
    pd_desc d = {0};
    kvt_status st = decode_prefill(&d, b, len, "registration");
    if (st) return st;
    memcpy(token, b + (len - PD_BS_TOKEN_LEN), PD_BS_TOKEN_LEN);
    pthread_mutex_lock(&bs->mu);
    st = store_prefill(bs, &d, b + (len - ADDR_LEN - PD_BS_TOKEN_LEN), src, kvt__now_ns(), token);
    pthread_mutex_unlock(&bs->mu);
    pd_desc_free(&d);
    return st;
}

static kvt_status on_unregister(kvt_pd_bootstrap *bs, const uint8_t *b, uint32_t len, const char *src,
                                 uint32_t *removed)
{
    pd_desc d = {0};
    kvt_status st = decode_prefill(&d, b, len, "unregistration");
    if (st) return st;
    const uint8_t *addr = b + (len - ADDR_LEN - PD_BS_TOKEN_LEN);
    const uint8_t *token = b + (len - PD_BS_TOKEN_LEN);
    char rn[64], an[80];
    rank_name(rn, sizeof rn, &d);
    addr_name(an, sizeof an, addr);
    *removed = 0;
    pthread_mutex_lock(&bs->mu);
    purge(bs, kvt__now_ns());
    char owner[48] = "";
    for (uint32_t i = 0; i < bs->nprefill; i++)
        if (same_pos(&bs->prefill[i].desc, &d) && !memcmp(bs->prefill[i].addr, addr, ADDR_LEN)) {
            /* Only the registrant, which holds the entry's token (the
             * address is public: every lookup names it; a host is not an
             * identity), may remove it. */
            if (sodium_memcmp(bs->prefill[i].token, token, PD_BS_TOKEN_LEN) != 0) {
                snprintf(owner, sizeof owner, "%s", bs->prefill[i].src);
                break;
            }
            drop_entry(bs, i);
            *removed = 1;
            break;
        }
    pthread_mutex_unlock(&bs->mu);
    if (owner[0]) {
        pd_desc_free(&d);
        return kvt__fail(KVT_EBUSY,
                         "pd bootstrap: unregistration of prefill %s at %s from %s refused: it lacks the "
                         "entry's token (only the rank that registered it, from %s, holds it)",
                         rn, an, src, owner);
    }
    if (*removed) pd_log("pd bootstrap: prefill %s at %s unregistered", rn, an);
    else pd_log("pd bootstrap: unregistration of prefill %s at %s matched no live entry", rn, an);
    pd_desc_free(&d);
    return KVT_OK;
}

/* (bs->mu held) Whether prefill position (tp_rank, dcp_rank) matters to
 * decode rank dec: it talks to it (the position feeds it, or dec is the
 * position's dummy). Positions are homogeneous, so any live entry describes
 * the missing one at its place. */
static kvt_status needed_by(const kvt_pd_bootstrap *bs, uint32_t tp_rank, uint32_t dcp_rank, const pd_desc *dec,
                            bool *out)
{
    pd_desc at;
    kvt_status st = pd_desc_at(&at, &bs->prefill[0].desc, tp_rank, dcp_rank);
    if (!st) st = pd_topo_talks(&at, dec, out);
    pd_desc_free(&at);
    return st;
}

/* (bs->mu held) KVT_EAGAIN naming the prefill positions without a live
 * lease that dec needs; KVT_OK when it needs none of the missing ones (a
 * prefill rank that restarts, or finished and left, holds up only the
 * decode ranks it feeds). */
static kvt_status missing_for(kvt_pd_bootstrap *bs, const pd_desc *dec)
{
    const pd_desc *p0 = &bs->prefill[0].desc;
    uint32_t tp = p0->tp_size, dcp = p0->dcp_size, need = tp * dcp, missing = 0, listed = 0;
    bool have[BS_MAX_PREFILL] = {0};
    for (uint32_t i = 0; i < bs->nprefill; i++)
        have[bs->prefill[i].desc.tp_rank * dcp + bs->prefill[i].desc.dcp_rank] = true;
    uint64_t plans = (uint64_t)(need > bs->nprefill ? need - bs->nprefill : 0) * ((uint64_t)dec->tp_size * dec->dcp_size + 1);
    bool precise = plans <= BS_TOPO_BUDGET;
    char list[BS_RETRY_LIST + 1] = "";
    size_t off = 0;
    for (uint32_t pos = 0; pos < need; pos++) {
        bool needed = !have[pos];
        kvt_status st = needed && precise ? needed_by(bs, pos / dcp, pos % dcp, dec, &needed) : KVT_OK;
        if (st) return st;
        if (!needed) continue;
        missing++;
        char one[64];
        int n = snprintf(one, sizeof one, "%stp%u/%u dcp%u/%u", listed ? ", " : "", pos / dcp, tp, pos % dcp, dcp);
        if (off + (size_t)n > BS_RETRY_LIST || listed < missing - 1) continue; /* the list is full */
        memcpy(list + off, one, (size_t)n + 1);
        off += (size_t)n;
        listed++;
    }
    if (!missing) return KVT_OK;
    char more[48] = "";
    if (listed < missing) snprintf(more, sizeof more, ", and %u more", missing - listed);
    return kvt__fail(KVT_EAGAIN, "%u of %u prefill ranks registered; missing %s%s", bs->nprefill, need, list,
                     more);
}

/* (bs->mu held) Encodes the live topology after checking dec against it. */
static kvt_status topo(kvt_pd_bootstrap *bs, const pd_desc *dec, uint8_t **out, size_t *len)
{
    purge(bs, kvt__now_ns());
    uint64_t n = 4;
    for (uint32_t i = 0; i < bs->nprefill; i++) {
        kvt_status st = pd_topo_check(&bs->prefill[i].desc, dec);
        if (st) return st;
        n += pd_desc_wire_size(&bs->prefill[i].desc) + ADDR_LEN;
    }
    if (!bs->nprefill)
        return kvt__fail(KVT_EAGAIN, "0 prefill ranks registered (none yet, or every lease expired)");
    kvt_status st = missing_for(bs, dec);
    if (st) return st;
    if (n > bs->net.max_frame)
        return kvt__fail(KVT_EINVAL, "pd bootstrap: the topology of %u prefill ranks takes %llu bytes, more than max_frame %u; raise max_frame on the bootstrap service and on every decode rank",
                         bs->nprefill, (unsigned long long)n, bs->net.max_frame);
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

static void on_lookup(kvt_pd_bootstrap *bs, bs_link *s, const char *addr, const uint8_t *b, uint32_t len,
                      uint64_t dl)
{
    pd_desc d = {0};
    size_t used, tlen = 0;
    uint8_t *t = NULL;
    kvt_status st = pd_desc_decode(&d, b, len, &used);
    if (!st && d.role != PD_ROLE_DECODE)
        st = kvt__fail(KVT_EPROTO, "pd bootstrap: lookup by a rank of role %u (want decode, %u)", d.role,
                       PD_ROLE_DECODE);
    if (!st) {
        pthread_mutex_lock(&bs->mu);
        st = topo(bs, &d, &t, &tlen);
        if (!st) bs->lookups++;
        pthread_mutex_unlock(&bs->mu);
    }
    if (!st) reply(s, PD_F_TOPO, KVT_OK, 0, t, tlen, dl);
    else if (st == KVT_EAGAIN) reply(s, PD_F_RETRY, st, 0, kvt_last_error(), strlen(kvt_last_error()), dl);
    else refuse(bs, s, addr, st, dl);
    free(t);
    pd_desc_free(&d);
}

/* Reads the request (authentication, header, body) by dl. */
static kvt_status read_request(kvt_pd_bootstrap *bs, bs_link *l, uint64_t dl, pd_hdr *h, uint8_t **body)
{
    kvt_stream *s = l->s;
    uint8_t key[PD_SESSION_KEY_LEN];
    kvt_stream_auth a = bs->auth;
    a.session_key = key;
    kvt_status st = kvt__stream_auth_server(s->fd, &a, dl);
    if (!st && bs->auth.secret) st = pd_mac_new(&l->m, key, true);
    sodium_memzero(key, sizeof key);
    if (st) {
        char why[KVT_ERRMSG_MAX];
        snprintf(why, sizeof why, "%s", kvt_last_error());
        return kvt__fail(st, "pd bootstrap: authentication: %s (greeting deadline %u ms)", why, bs->greet_ms);
    }
    uint8_t hb[PD_HDR_LEN];
    st = pd_mac_recv_head(l->m, s, hb, dl);
    if (st == KVT_EAUTH) return kvt__wrap_error(st, "pd bootstrap: request");
    if (st == KVT_ETIMEDOUT)
        return kvt__fail(KVT_EPROTO, "pd bootstrap: no request within %u ms of connecting", bs->greet_ms);
    if (st) return kvt__fail(KVT_EPROTO, "pd bootstrap: the peer closed without a request");
    char why[160];
    if (!pd_hdr_decode(h, hb)) return kvt__fail(KVT_EPROTO, "pd bootstrap: %s", pd_magic_why(hb, why, sizeof why));
    if (h->body_len > bs->max_req)
        return kvt__fail(KVT_EPROTO, "pd bootstrap: %u-byte request exceeds the limit %u (the largest descriptor and address, within max_frame %u)",
                         h->body_len, bs->max_req, bs->net.max_frame);
    *body = malloc((size_t)h->body_len + 1);
    if (!*body) return kvt__fail(KVT_ENOMEM, "pd bootstrap: out of memory");
    st = pd_mac_recv_body(l->m, s, *body, h->body_len, dl);
    if (st == KVT_EAUTH) return kvt__wrap_error(st, "pd bootstrap: request");
    if (st)
        return kvt__fail(KVT_EPROTO, "pd bootstrap: truncated request (%u-byte body not in by the deadline, %u ms)",
                         h->body_len, bs->greet_ms);
    return KVT_OK;
}

static void serve(kvt_pd_bootstrap *bs, uint32_t slot, kvt_stream *s)
{
    uint64_t t0 = kvt__now_ns();
    char host[48], addr[64];
    pd_peer_addr(s->fd, host, sizeof host, addr, sizeof addr);
    pd_hdr h = {0};
    uint8_t *b = NULL;
    bs_link l = {s, NULL};
    kvt_status st = read_request(bs, &l, kvt__deadline_ns(bs->greet_ms), &h, &b);
    pthread_mutex_lock(&bs->mu);
    bs->slots[slot].greeting = false; /* from here on it is never evicted */
    bool evicted = bs->slots[slot].evicted;
    if (evicted) bs->refused++;
    pthread_mutex_unlock(&bs->mu);
    uint64_t dl = kvt__deadline_ns(bs->net.peer_timeout_ms); /* the answer's */
    if (evicted) {
        pd_log("pd bootstrap: dropped the connection from %s: no complete request in %llu ms while all %d request slots were busy (the oldest such connection makes room)",
               addr, (unsigned long long)((kvt__now_ns() - t0) / 1000000), BS_MAX_HANDLERS);
    } else if (!st && h.type == PD_F_REG_PREFILL) {
        uint8_t token[PD_BS_TOKEN_LEN];
        st = on_register(bs, b, h.body_len, host, token);
        if (!st) reply(&l, PD_F_OK, KVT_OK, bs->lease_ms, token, sizeof token, dl);
        sodium_memzero(token, sizeof token);
    } else if (!st && h.type == PD_F_UNREG_PREFILL) {
        uint32_t removed = 0;
        st = on_unregister(bs, b, h.body_len, host, &removed);
        if (!st) reply(&l, PD_F_OK, KVT_OK, removed, NULL, 0, dl);
    } else if (!st && h.type == PD_F_LOOKUP) {
        on_lookup(bs, &l, addr, b, h.body_len, dl);
    } else if (!st) {
        st = kvt__fail(KVT_EPROTO, "pd bootstrap: unexpected frame type %u", h.type);
    }
    if (st && !evicted) refuse(bs, &l, addr, st, dl);
    free(b);
    pd_mac_free(l.m);
}

static void *handler_main(void *arg)
{
    bs_req q = *(bs_req *)arg;
    free(arg);
    serve(q.bs, q.slot, q.s);
    pthread_mutex_lock(&q.bs->mu);
    kvt__stream_destroy(q.s); /* under mu: nobody shuts down a closed fd */
    if (!q.bs->slots[q.slot].evicted) q.bs->active--;
    q.bs->slots[q.slot] = (bs_slot){0};
    q.bs->handlers--;
    pthread_cond_broadcast(&q.bs->cv);
    pthread_mutex_unlock(&q.bs->mu);
    return NULL;
}

/* (bs->mu held) */
static int free_slot(kvt_pd_bootstrap *bs)
{
    for (int i = 0; i < BS_SLOTS; i++)
        if (!bs->slots[i].used) return i;
    return -1;
}

/* (bs->mu held) Every request slot is busy: shuts down the oldest
 * connection that has not delivered its request. Its slot counts as free at
 * once (its handler ends on its own, in a spare entry of the table). */
static void evict_oldest_greeting(kvt_pd_bootstrap *bs)
{
    int v = -1;
    for (int i = 0; i < BS_SLOTS; i++) {
        bs_slot *x = &bs->slots[i];
        if (x->used && x->greeting && !x->evicted && (v < 0 || x->since_ns < bs->slots[v].since_ns)) v = i;
    }
    if (v < 0) return;
    bs->slots[v].evicted = true;
    bs->active--;
    shutdown(bs->slots[v].s->fd, SHUT_RDWR);
}

static void spawn(kvt_pd_bootstrap *bs, kvt_stream *s)
{
    bs_req *q = malloc(sizeof *q);
    pthread_mutex_lock(&bs->mu);
    int slot = -1;
    if (q) {
        if (bs->active >= BS_MAX_HANDLERS) evict_oldest_greeting(bs);
        uint64_t dl = kvt__deadline_ns(BS_SLOT_WAIT_MS);
        for (;;) { /* all serving (or dropped ones not gone yet): they end soon */
            slot = bs->active < BS_MAX_HANDLERS ? free_slot(bs) : -1;
            if (slot >= 0 || atomic_load(&bs->stop) || !kvt__cond_wait_until(&bs->cv, &bs->mu, dl)) break;
        }
        if (slot < 0 && bs->active < BS_MAX_HANDLERS) slot = free_slot(bs);
    }
    if (slot >= 0) {
        bs->slots[slot] = (bs_slot){.used = true, .greeting = true, .s = s, .since_ns = kvt__now_ns()};
        bs->handlers++;
        bs->active++;
    }
    pthread_mutex_unlock(&bs->mu);
    if (slot >= 0) {
        *q = (bs_req){bs, (uint32_t)slot, s};
        pthread_attr_t at;
        pthread_t th;
        pthread_attr_init(&at);
        pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
        int rc = pthread_create(&th, &at, handler_main, q);
        pthread_attr_destroy(&at);
        if (rc == 0) return;
        pd_log("pd bootstrap: refused a connection: cannot start a thread");
        pthread_mutex_lock(&bs->mu);
        bs->slots[slot] = (bs_slot){0};
        bs->handlers--;
        bs->active--;
        pthread_cond_broadcast(&bs->cv);
        pthread_mutex_unlock(&bs->mu);
    } else if (!q) {
        pd_log("pd bootstrap: refused a connection: out of memory");
    } else {
        pd_log("pd bootstrap: refused a connection: all %d request slots (the limit) were serving requests for %d ms",
               BS_MAX_HANDLERS, BS_SLOT_WAIT_MS);
    }
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
    kvt__cond_init(&bs->cv);
    bs->net = *params;
    kvt_status st = pd_net_defaults(&bs->net, &bs->secret, bs->host, fn);
    if (!st) st = pd_net_exposed(&bs->net, fn);
    bs->auth = (kvt_stream_auth){bs->secret, bs->net.secret_len, "pd bootstrap"};
    uint64_t lease = (uint64_t)bs->net.peer_timeout_ms * PD_BS_LEASE_FACTOR;
    bs->lease_ms = lease < PD_BS_LEASE_MIN_MS ? PD_BS_LEASE_MIN_MS : lease > INT32_MAX ? INT32_MAX : (uint32_t)lease;
    bs->greet_ms = bs->net.peer_timeout_ms < PD_BS_GREETING_MAX_MS ? bs->net.peer_timeout_ms : PD_BS_GREETING_MAX_MS;
    pd_desc largest = {.num_entries = PD_MAX_ENTRIES};
    size_t req = pd_desc_wire_size(&largest) + ADDR_LEN + PD_BS_TOKEN_LEN;
    bs->max_req = req < bs->net.max_frame ? (uint32_t)req : bs->net.max_frame;
    if (!st && (st = kvt__stream_listen(bs->host, bs->net.port, &bs->lfd, &bs->port)))
        kvt__wrap_error(st, fn); /* the refusal names the call */
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
    purge(bs, kvt__now_ns()); /* prefill_ranks counts live leases */
    *out = (kvt_pd_bootstrap_stats){bs->nprefill, bs->lookups, bs->refused};
    pthread_mutex_unlock(&bs->mu);
    return KVT_OK;
}

void kvt_pd_bootstrap_destroy(kvt_pd_bootstrap *bs)
{
    if (!bs) return;
    atomic_store(&bs->stop, true);
    pthread_mutex_lock(&bs->mu);
    pthread_cond_broadcast(&bs->cv); /* an accept waiting for a slot */
    pthread_mutex_unlock(&bs->mu);
    if (bs->started) pthread_join(bs->th, NULL);
    pthread_mutex_lock(&bs->mu);
    for (int i = 0; i < BS_SLOTS; i++) /* every handler ends at once */
        if (bs->slots[i].used) shutdown(bs->slots[i].s->fd, SHUT_RDWR);
    while (bs->handlers > 0) pthread_cond_wait(&bs->cv, &bs->mu);
    pthread_mutex_unlock(&bs->mu);
    for (uint32_t i = 0; i < bs->nprefill; i++) pd_desc_free(&bs->prefill[i].desc);
    if (bs->lfd >= 0) close(bs->lfd);
    free(bs->secret);
    pthread_mutex_destroy(&bs->mu);
    pthread_cond_destroy(&bs->cv);
    free(bs);
}
