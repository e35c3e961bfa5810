/* ep.c - the parts of an endpoint both roles share: setup, the room table
 * and state machine, and the public poll/wait/clear/abort/info helpers. */
#include "pd/ep.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "layout/layout.h"
#include "pd/hasher.h"
#include "util/clock.h"
#include "util/config.h"
#include "util/err.h"
#include "util/log.h"
#include "util/parse.h"
#include "util/sync.h"

void pd_log(const char *fmt, ...)
{
    if (kvt__config_env("KVTIER_PD_QUIET")) return;
    va_list ap;
    va_start(ap, fmt);
    kvt__vlog(KVT_LOG_WARN, fmt, ap);
    va_end(ap);
}

void pd_peer_addr(int fd, char *host, size_t hn, char *addr, size_t an)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    char h[INET6_ADDRSTRLEN] = "?";
    uint16_t port = 0;
    if (getpeername(fd, (struct sockaddr *)&ss, &sl) == 0) {
        if (ss.ss_family == AF_INET) {
            const struct sockaddr_in *a = (const struct sockaddr_in *)&ss;
            inet_ntop(AF_INET, &a->sin_addr, h, sizeof h);
            port = ntohs(a->sin_port);
        } else if (ss.ss_family == AF_INET6) {
            const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)&ss;
            inet_ntop(AF_INET6, &a->sin6_addr, h, sizeof h);
            port = ntohs(a->sin6_port);
        }
    }
    snprintf(host, hn, "%s", h);
    snprintf(addr, an, "%s:%u", h, port);
}

static kvt_status check_net(const kvt_pd_net_params *n, const char *fn)
{
    KVT_CHECK_ARG(!n->secret || (n->secret_len >= 16 && n->secret_len <= 1024),
                  "%s: secret_len is %zu (must be 16..1024)", fn, n->secret_len);
    KVT_CHECK_ARG(n->max_frame == 0 || (n->max_frame >= 4096 && n->max_frame <= (256u << 20)),
                  "%s: max_frame is %u (must be 4096..268435456, or 0)", fn, n->max_frame);
    KVT_CHECK_ARG(n->transport == KVT_PD_TCP || n->transport == KVT_PD_UCX,
                  "%s: transport %d is neither KVT_PD_TCP nor KVT_PD_UCX", fn, (int)n->transport);
    KVT_CHECK_ARG(!n->bind_host || strlen(n->bind_host) < 64, "%s: bind_host is too long", fn);
    return KVT_OK;
}

kvt_status pd_net_exposed(const kvt_pd_net_params *n, const char *fn)
{
    const char *h = n->bind_host ? n->bind_host : "127.0.0.1";
    KVT_CHECK_ARG(n->allow_insecure <= 1, "%s: allow_insecure is %u (0 or 1)", fn, n->allow_insecure);
    KVT_CHECK_ARG(n->secret || n->allow_insecure || kvt__host_is_loopback(h),
                  "%s: bind_host %s is not a loopback address and no secret is set: anyone who reaches it "
                  "could register prefill positions, read the topology or send KV; set net.secret "
                  "(16..1024 bytes, the same on every end), or net.allow_insecure = 1 on a trusted network",
                  fn, h);
    return KVT_OK;
}

kvt_status pd_net_defaults(kvt_pd_net_params *n, uint8_t **secret, char *host, const char *fn)
{
    kvt_status st = check_net(n, fn);
    if (st) return st;
    snprintf(host, 64, "%s", n->bind_host ? n->bind_host : "127.0.0.1");
    n->bind_host = host;
    if (!n->max_frame) n->max_frame = 64u << 20;
    if (!n->heartbeat_ms) n->heartbeat_ms = 100;
    if (!n->peer_timeout_ms) n->peer_timeout_ms = 3000;
    *secret = NULL;
    if (n->secret) {
        *secret = malloc(n->secret_len);
        if (!*secret) return kvt__fail(KVT_ENOMEM, "%s: out of memory", fn);
        memcpy(*secret, n->secret, n->secret_len);
        n->secret = *secret;
    }
    return KVT_OK;
}

static kvt_status check_params(const kvt_pd_params *p, const char *fn)
{
    KVT_CHECK_NOT_NULL_AS(p, "params", fn);
    KVT_CHECK_NOT_NULL(p->geo, fn);
    KVT_CHECK_NOT_NULL(p->mem, fn);
    KVT_CHECK_ARG(p->bootstrap_port != 0, "%s: bootstrap_port is 0", fn);
    KVT_CHECK_ARG(p->mem->num_pages > 0, "%s: mem->num_pages is 0", fn);
    KVT_CHECK_ARG(p->checksum_threads >= -1 && p->checksum_threads <= 1,
                  "%s: checksum_threads is %d (1: a thread per link, -1: none, 0: auto)", fn,
                  p->checksum_threads);
    return KVT_OK;
}

/* UCX trusts what its peers send (stream_ucx.c: a worker address is parsed
 * unchecked past its version): said once per endpoint that talks UCX with
 * no secret beyond this host, where only the secret keeps strangers out. */
static void warn_open_ucx(const pd_ep *ep, const kvt_pd_params *p, const char *fn)
{
    const char *bs = p->bootstrap_host ? p->bootstrap_host : "127.0.0.1";
    bool local = kvt__host_is_loopback(ep->bind_host) && kvt__host_is_loopback(bs);
    if (ep->net.transport == KVT_PD_UCX && !ep->secret && !local)
        pd_log("%s: UCX transport without a secret (listening on %s, bootstrap %s): UCX parses the "
               "worker addresses peers send without bounds, and a malformed one can abort this "
               "process; set net.secret where strangers can reach these ports", fn, ep->bind_host, bs);
}

kvt_status pd_ep_init(pd_ep *ep, const kvt_pd_params *p, int role, const char *fn)
{
    kvt_status st = check_params(p, fn);
    if (st) return st;
    ep->role = role;
    ep->lfd = -1;
    ep->net = p->net;
    st = pd_net_defaults(&ep->net, &ep->secret, ep->bind_host, fn);
    if (!st && role == PD_ROLE_PREFILL) st = pd_net_exposed(&ep->net, fn);
    if (st) return st;
    ep->auth = (kvt_stream_auth){ep->secret, ep->net.secret_len,
                                 role == PD_ROLE_PREFILL ? "pd sender" : "pd receiver"};
    warn_open_ucx(ep, p, fn);
    ep->t_boot = p->bootstrap_timeout_ms ? p->bootstrap_timeout_ms : 30000;
    ep->t_wait = p->waiting_timeout_ms ? p->waiting_timeout_ms : 30000;
    ep->t_xfer = p->transfer_timeout_ms ? p->transfer_timeout_ms : 60000;
    ep->hash_thread = p->checksum_threads > 0 || (p->checksum_threads == 0 && pd_hash_thread_auto());
    pthread_mutex_init(&ep->mu, NULL);
    kvt__cond_init(&ep->cv);
    st = pd_desc_from_geometry(&ep->desc, p->geo, &p->rank, (uint32_t)role);
    if (!st) st = kvt_geometry_clone(p->geo, &ep->geo);
    if (st) return st;
    ep->map = calloc(1, sizeof *ep->map);
    if (!ep->map) return kvt__fail(KVT_ENOMEM, "%s: out of memory", fn);
    ep->engine_pages = p->mem->num_pages;
    return kvt__page_map_init_fn(ep->map, ep->geo, p->mem, fn);
}

static void room_free(pd_room *r)
{
    for (uint32_t i = 0; i < r->ntargets; i++) free(r->targets[i].pages);
    free(r->targets);
    free(r->src_pages);
    free(r->dst_pages);
    free(r->next_page);
    free(r->peer_done);
    free(r);
}

void pd_room_unref(pd_room *r)
{
    if (--r->refs == 0) room_free(r);
}

void pd_ep_fini(pd_ep *ep)
{
    for (uint32_t i = 0; i < ep->nconns; i++) pd_conn_free(ep->conns[i]);
    for (uint32_t b = 0; b < PD_ROOM_BUCKETS; b++) {
        pd_room *r = ep->buckets[b];
        while (r) {
            pd_room *n = r->next;
            pd_room_unref(r);
            r = n;
        }
    }
    if (ep->lfd >= 0) close(ep->lfd);
    pd_desc_free(&ep->desc);
    kvt_geometry_destroy(ep->geo);
    free(ep->map);
    free(ep->secret);
    pthread_mutex_destroy(&ep->mu);
    pthread_cond_destroy(&ep->cv);
}

static uint32_t bucket(uint64_t id)
{
    id ^= id >> 29;
    id *= 0xbf58476d1ce4e5b9ull;
    return (uint32_t)(id >> 40) % PD_ROOM_BUCKETS;
}

pd_room *pd_room_find(pd_ep *ep, uint64_t id)
{
    for (pd_room *r = ep->buckets[bucket(id)]; r; r = r->next)
        if (r->id == id) return r;
    return NULL;
}

kvt_status pd_room_add(pd_ep *ep, uint64_t id, pd_room **out)
{
    if (ep->nrooms >= PD_MAX_ROOMS)
        return kvt__fail(KVT_EFULL, "pd: %u rooms are open on this %s rank (the limit); clear finished ones",
                         ep->nrooms, ep->role == PD_ROLE_PREFILL ? "prefill" : "decode");
    pd_room *r = calloc(1, sizeof *r);
    if (!r) return kvt__fail(KVT_ENOMEM, "pd: out of memory for room %llu", (unsigned long long)id);
    r->id = id;
    r->refs = 1;
    r->opener = UINT32_MAX;
    r->state = KVT_PD_BOOTSTRAPPING;
    r->deadline_ns = kvt__deadline_ns(ep->t_boot);
    uint32_t b = bucket(id);
    r->next = ep->buckets[b];
    ep->buckets[b] = r;
    ep->nrooms++;
    *out = r;
    return KVT_OK;
}

void pd_room_unclaimed_done(pd_ep *ep, pd_room *r)
{
    if (r->opener == UINT32_MAX) return;
    pd_conn *c = ep->conns[r->opener]; /* its slot is not reused while r names it */
    if (c && c->unclaimed) c->unclaimed--;
    if (ep->unclaimed) ep->unclaimed--;
    r->opener = UINT32_MAX;
}

void pd_room_remove(pd_ep *ep, pd_room *r)
{
    pd_room **pp = &ep->buckets[bucket(r->id)];
    while (*pp && *pp != r) pp = &(*pp)->next;
    if (*pp) *pp = r->next;
    pd_room_unclaimed_done(ep, r);
    r->cleared = true;
    ep->nrooms--;
    pd_room_unref(r);
}

const char *kvt_pd_poll_name(kvt_pd_poll s)
{
    switch (s) {
    case KVT_PD_FAILED: return "Failed";
    case KVT_PD_BOOTSTRAPPING: return "Bootstrapping";
    case KVT_PD_WAITING_FOR_INPUT: return "WaitingForInput";
    case KVT_PD_TRANSFERRING: return "Transferring";
    case KVT_PD_SUCCESS: return "Success";
    }
    return "unknown";
}

bool pd_room_terminal(const pd_room *r)
{
    return r->state == KVT_PD_FAILED || r->state == KVT_PD_SUCCESS;
}

static uint32_t state_timeout(const pd_ep *ep, kvt_pd_poll s)
{
    return s == KVT_PD_BOOTSTRAPPING ? ep->t_boot : s == KVT_PD_WAITING_FOR_INPUT ? ep->t_wait : ep->t_xfer;
}

void pd_room_advance(pd_ep *ep, pd_room *r, kvt_pd_poll to)
{
    if (pd_room_terminal(r) || to <= r->state || to == KVT_PD_FAILED) return;
    r->state = to;
    if (to != KVT_PD_SUCCESS) r->deadline_ns = kvt__deadline_ns(state_timeout(ep, to));
    pthread_cond_broadcast(&ep->cv);
}

bool pd_room_fail(pd_ep *ep, pd_room *r, kvt_status st, const char *fmt, ...)
{
    if (pd_room_terminal(r)) return false;
    r->state = KVT_PD_FAILED;
    r->err = st;
    r->failed_ns = kvt__now_ns();
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->msg, sizeof r->msg, fmt, ap);
    va_end(ap);
    pthread_cond_broadcast(&ep->cv);
    return true;
}

uint32_t pd_room_conns(pd_ep *ep, pd_room *r, uint32_t *out, uint32_t max)
{
    uint32_t n = 0;
    if (ep->role == PD_ROLE_PREFILL) {
        for (uint32_t i = 0; i < r->ntargets && n < max; i++) out[n++] = r->targets[i].conn;
    } else {
        for (uint32_t i = 0; i < ep->nconns && n < max; i++) out[n++] = i;
    }
    return n;
}

uint32_t pd_room_gen(const pd_ep *ep, const pd_room *r, uint32_t conn)
{
    if (ep->role == PD_ROLE_DECODE) return r->gen;
    for (uint32_t i = 0; i < r->ntargets; i++)
        if (r->targets[i].conn == conn) return r->targets[i].gen;
    return 0;
}

void pd_room_notify(pd_ep *ep, pd_room *r, uint32_t except)
{
    uint32_t ids[PD_MAX_CONNS];
    uint32_t n = pd_room_conns(ep, r, ids, PD_MAX_CONNS);
    for (uint32_t i = 0; i < n; i++)
        if (ids[i] != except && !atomic_load(&ep->conns[ids[i]]->dead))
            pd_conn_queue_msg(ep->conns[ids[i]], PD_F_FAIL, r->id, pd_room_gen(ep, r, ids[i]), r->err,
                              r->msg);
}

kvt_pd_poll pd_room_seen_state(const pd_room *r)
{
    return r->landing && r->state == KVT_PD_FAILED ? KVT_PD_TRANSFERRING : r->state;
}

static bool seen_terminal(const pd_room *r)
{
    kvt_pd_poll s = pd_room_seen_state(r);
    return s == KVT_PD_SUCCESS || s == KVT_PD_FAILED;
}

kvt_status pd_room_wait_landed(pd_ep *ep, pd_room *r, const char *fn)
{
    /* A landing is one stream receive under the landing deadline
     * (PD_LAND_FACTOR x peer timeout, pd_conn_land_deadline); past that the
     * link thread gives up and ends it. */
    uint64_t ms = (uint64_t)ep->net.peer_timeout_ms * PD_LAND_FACTOR + 1000;
    uint64_t dl = kvt__deadline_ns((int64_t)ms);
    while (r->landing && kvt__cond_wait_until(&ep->cv, &ep->mu, dl)) {
    }
    if (!r->landing) return KVT_OK;
    return kvt__fail(KVT_ETIMEDOUT, "%s: room %llu: a batch is still being written into its pages after %llu ms; retry",
                     fn, (unsigned long long)r->id, (unsigned long long)ms);
}

static kvt_status find_live(pd_ep *ep, uint64_t room, const char *fn, pd_room **out)
{
    pd_room *r = pd_room_find(ep, room);
    if (!r || (ep->role == PD_ROLE_PREFILL && !r->claimed))
        return kvt__fail(KVT_ENOTFOUND, "%s: room %llu is unknown (never opened, or cleared)", fn,
                         (unsigned long long)room);
    *out = r;
    return KVT_OK;
}

kvt_status pd_ep_poll(pd_ep *ep, uint64_t room, kvt_pd_poll *out, const char *fn)
{
    KVT_CHECK_NOT_NULL(out, fn);
    pthread_mutex_lock(&ep->mu);
    pd_room *r = NULL;
    kvt_status st = find_live(ep, room, fn, &r);
    if (!st) *out = pd_room_seen_state(r);
    pthread_mutex_unlock(&ep->mu);
    return st;
}

kvt_status pd_ep_wait(pd_ep *ep, uint64_t room, int64_t timeout_ms, kvt_pd_poll *out, const char *fn)
{
    KVT_CHECK_NOT_NULL(out, fn);
    KVT_CHECK_ARG(timeout_ms >= 0 && timeout_ms <= 86400000, "%s: timeout_ms is %lld (must be 0..86400000)",
                  fn, (long long)timeout_ms);
    uint64_t dl = kvt__deadline_ns(timeout_ms);
    pthread_mutex_lock(&ep->mu);
    pd_room *r = NULL;
    kvt_status st = find_live(ep, room, fn, &r);
    if (st) {
        pthread_mutex_unlock(&ep->mu);
        return st;
    }
    r->refs++;
    while (!seen_terminal(r) && !r->cleared && kvt__cond_wait_until(&ep->cv, &ep->mu, dl)) {
    }
    *out = pd_room_seen_state(r);
    bool done = seen_terminal(r);
    pd_room_unref(r);
    pthread_mutex_unlock(&ep->mu);
    if (!done)
        return kvt__fail(KVT_ETIMEDOUT, "%s: room %llu still in state %d after %lld ms", fn,
                         (unsigned long long)room, (int)*out, (long long)timeout_ms);
    return KVT_OK;
}

kvt_status pd_ep_clear(pd_ep *ep, uint64_t room, const char *fn)
{
    pthread_mutex_lock(&ep->mu);
    pd_room *r = NULL;
    kvt_status st = find_live(ep, room, fn, &r);
    if (!st) {
        /* A live room's peers hear of it now, not at their deadline, and
         * the prefill side stops streaming into it. */
        if (!pd_room_terminal(r) && pd_room_fail(ep, r, KVT_ECANCELED, "cleared while live"))
            pd_room_notify(ep, r, UINT32_MAX);
        /* and once clear returns, nothing writes into its pages any more */
        r->refs++;
        st = pd_room_wait_landed(ep, r, fn);
        if (!st && !r->cleared) pd_room_remove(ep, r);
        pd_room_unref(r);
    }
    pthread_mutex_unlock(&ep->mu);
    return st;
}

/* What a live room waits for, in words (ep->mu held): a rank whose peer
 * never came says which, instead of an empty message. */
static void describe_live(const pd_ep *ep, const pd_room *r, uint32_t peers, char *out, size_t n)
{
    if (ep->role == PD_ROLE_PREFILL) {
        if (r->ntargets == 0)
            snprintf(out, n, "no decode rank opened the room yet%s",
                     r->claimed ? "" : " (nor did this rank's engine claim it)");
        else if (r->ntargets < r->expected)
            snprintf(out, n, "%u of %u decode ranks opened the room", r->ntargets, r->expected);
        else if (!r->claimed)
            snprintf(out, n, "every decode rank opened the room; this rank's engine has not claimed "
                     "it (kvt_pd_sender_room)");
        else if (!r->have_input)
            snprintf(out, n, "every decode rank opened the room; waiting for the engine's pages "
                     "(kvt_pd_sender_send)");
        else
            snprintf(out, n, "sending to %u decode ranks, %u acknowledged", r->ntargets, r->acked);
    } else if (r->state == KVT_PD_BOOTSTRAPPING) {
        snprintf(out, n, "looking up the prefill ranks at the bootstrap service");
    } else {
        snprintf(out, n, "%u of %u prefill ranks finished sending", r->ndone, peers);
    }
}

kvt_status pd_ep_info(pd_ep *ep, uint64_t room, kvt_pd_room_info *out, const char *fn)
{
    KVT_CHECK_NOT_NULL(out, fn);
    pthread_mutex_lock(&ep->mu);
    pd_room *r = NULL;
    kvt_status st = find_live(ep, room, fn, &r);
    if (!st) {
        kvt_pd_room_info i = {.state = pd_room_seen_state(r), .error = r->err, .bytes = r->bytes,
                              .abort_acks = r->abort_acks};
        if (i.state != r->state) i.error = KVT_OK; /* still landing: the failure shows with the state */
        uint32_t ids[PD_MAX_CONNS];
        i.peers = pd_room_conns(ep, r, ids, PD_MAX_CONNS);
        if (i.error) snprintf(i.message, sizeof i.message, "%s", r->msg);
        else if (i.state != KVT_PD_SUCCESS)
            describe_live(ep, r, i.peers, i.message, sizeof i.message);
        *out = i;
    }
    pthread_mutex_unlock(&ep->mu);
    return st;
}

kvt_status pd_ep_abort(pd_ep *ep, uint64_t room, const char *reason, const char *fn)
{
    char why[PD_MSG];
    snprintf(why, sizeof why, "%s", reason ? reason : "aborted");
    pthread_mutex_lock(&ep->mu);
    pd_room *r = NULL;
    kvt_status st = find_live(ep, room, fn, &r);
    if (!st) {
        pd_room_fail(ep, r, KVT_EABORTED, "aborted here: %s", why);
        uint32_t ids[PD_MAX_CONNS];
        uint32_t n = pd_room_conns(ep, r, ids, PD_MAX_CONNS);
        for (uint32_t i = 0; i < n; i++)
            pd_conn_queue_msg(ep->conns[ids[i]], PD_F_ABORT, room, pd_room_gen(ep, r, ids[i]), KVT_EABORTED,
                              why);
        r->refs++;
        st = pd_room_wait_landed(ep, r, fn); /* no write into its pages after abort returns */
        pd_room_unref(r);
    }
    pthread_mutex_unlock(&ep->mu);
    return st;
}
