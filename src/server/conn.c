/* conn.c - the thread serving one attached client. It answers one request
 * at a time; when the socket closes (detach, crash, SIGKILL) or breaks the
 * protocol, every task the client still holds is ended at once: planned
 * ones released, launched stores rolled back (their blocks never become
 * visible), launched loads unpinned. A store's END commits it with the
 * layer checksums its client took while copying (sums.c); a load's LAUNCH
 * reply carries them, and the loading client checks its blocks in its own
 * copy's pass. */
#include <poll.h>
#include <stdio.h>
#include <sys/socket.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "net/fdio.h"
#include "net/stream.h"
#include "server/server.h"
#include "index/index.h"
#include "layout/layout.h"
#include "util/clock.h"
#include "util/err.h"
#include "util/sync.h"

/* A client that starts a frame must finish it within this. */
#define FRAME_MS 10000

/* Bound on releasing a task whose SSD reads run (it waits for them):
 * server_read_ms. */
static uint64_t read_deadline(const kvt_srv_conn *c)
{
    return kvt__deadline_ns(c->srv->cfg.server_read_ms);
}

static kvt_status reply(kvt_srv_conn *c, uint16_t op, const kvt_srv_buf *b)
{
    if (b->oom) return kvt__fail(KVT_ENOMEM, "reply: no memory");
    return kvt__srv_send_frame(c->fd, op | KVT_SRV_REPLY, 0, b->p, b->len, -1,
                               kvt__deadline_ns(FRAME_MS));
}

static kvt_status reply_err(kvt_srv_conn *c, uint16_t op, kvt_status st)
{
    const char *msg = kvt_last_error();
    size_t len = strlen(msg);
    if (len > KVT_SRV_MAX_ERRMSG) len = KVT_SRV_MAX_ERRMSG;
    return kvt__srv_send_frame(c->fd, op | KVT_SRV_REPLY, st, msg, len, -1,
                               kvt__deadline_ns(FRAME_MS));
}

static kvt_srv_task *find_task(kvt_srv_conn *c, uint64_t id)
{
    for (uint32_t i = 0; i < c->ntasks; i++)
        if (c->tasks[i].id == id) return &c->tasks[i];
    return NULL;
}

/* Takes t off the list (its offsets and pins now the caller's). */
static void take_task(kvt_srv_conn *c, kvt_srv_task *t)
{
    *t = c->tasks[--c->ntasks];
}

static void drop_task(kvt_srv_conn *c, kvt_srv_task *t)
{
    atomic_fetch_sub(&c->pins, t->pins);
    free(t->offsets);
    take_task(c, t);
}

static kvt_status add_task(kvt_srv_conn *c, kvt_task_id id, kvt_task_kind kind,
                           uint32_t tokens)
{
    if (c->ntasks == c->cap) {
        uint32_t cap = c->cap ? c->cap * 2 : 16;
        kvt_srv_task *t = realloc(c->tasks, cap * sizeof *t);
        if (!t) return kvt__fail(KVT_ENOMEM, "no memory for the client's task list");
        c->tasks = t;
        c->cap = cap;
    }
    kvt_srv_task t = {.id = id, .kind = kind, .pins = tokens / c->sh->shm.block_tokens};
    c->tasks[c->ntasks++] = t;
    atomic_fetch_add(&c->pins, t.pins);
    return KVT_OK;
}

/* Forgets planned tasks the cache expired (plan_ttl_ms), so a client that
 * drops requests without cancelling them neither fills its quota nor keeps
 * their results in the cache's task table. */
static void sweep_expired(kvt_srv_conn *c)
{
    for (uint32_t i = 0; i < c->ntasks;) {
        kvt_srv_task *t = &c->tasks[i];
        if (!t->launched && kvt__cache_ext_expired(c->sh->cache, t->id)) drop_task(c, t);
        else i++;
    }
}

/* A client that took a plan and stopped copying (server_copy_ms passed
 * since a launch it never ended) is cut off: every launched task ends (a
 * load's pins released, a store rolled back with its blocks fenced until
 * the process exits, as it may still write into them) and the connection
 * closes, which ends the rest. Other clients never wait on it. */
static kvt_status check_copy_deadline(kvt_srv_conn *c)
{
    uint64_t limit = (uint64_t)c->srv->cfg.server_copy_ms * 1000000ull, now = kvt__now_ns();
    uint32_t late = 0;
    for (uint32_t i = 0; i < c->ntasks; i++)
        late += c->tasks[i].launched && !c->tasks[i].pending &&
                now - c->tasks[i].launched_ns > limit; /* pending: the server's own reads */
    if (!late) return KVT_OK;
    /* Shut first: once its tasks are seen dropped (stats), the client
     * already sees the cut-off (a copy ending then must not be reported
     * done: client.c, end_early). */
    shutdown(c->fd, SHUT_RDWR);
    uint32_t fenced = 0;
    for (uint32_t i = c->ntasks; i-- > 0;) {
        kvt_srv_task *t = &c->tasks[i];
        if (!t->launched) continue;
        uint32_t *slots = malloc(((size_t)t->num_blocks + 1) * sizeof *slots), n = 0;
        if (slots) kvt__cache_ext_cut(c->sh->cache, t->id, slots, t->num_blocks, &n);
        else kvt__cache_ext_abort(c->sh->cache, t->id, read_deadline(c));
        fenced += n;
        if (slots) kvt__srv_fence_add(c->srv, c->sh, c->pid, c->session, slots, n);
        drop_task(c, t);
    }
    kvt_status st = kvt__fail(KVT_ETIMEDOUT, "client pid %ld (uid %ld) cut off: %u launched "
                              "task(s) not ended within server_copy_ms (%u ms); pins released, "
                              "%u store blocks held until the process exits or re-attaches",
                              (long)c->pid, (long)c->uid, late, c->srv->cfg.server_copy_ms,
                              fenced);
    kvt__srv_log(KVT_LOG_WARN, "%s", kvt_last_error());
    return st;
}

/* ------------------------------------------------------------------ */

/* HELLO: the client's geometry picks (or makes) its tier. */
static kvt_status on_hello(kvt_srv_conn *c, const uint8_t *p, size_t len)
{
    kvt_server *s = c->srv;
    kvt_srv_hello h;
    kvt_status st = kvt__srv_hello_decode(p, len, false, &h);
    if (st) return reply_err(c, KVT_SRV_HELLO, st) ? st : st;
    kvt_srv_shard *sh = NULL;
    st = kvt__srv_shard_get(s, h.geo, h.block_tokens, &sh);
    kvt_geometry_destroy(h.geo);
    if (st) {
        kvt__wrap_error(st, "attach refused");
        kvt__srv_log(KVT_LOG_WARN, "refused client pid %ld: %s", (long)c->pid, kvt_last_error());
        reply_err(c, KVT_SRV_HELLO, st);
        return st;
    }
    if ((st = kvt__srv_conn_attach(s, c))) {
        kvt__wrap_error(st, "attach refused");
        kvt__srv_log(KVT_LOG_WARN, "refused client pid %ld: %s", (long)c->pid, kvt_last_error());
        reply_err(c, KVT_SRV_HELLO, st);
        return st;
    }
    kvt_srv_hello_rep r = {
        .map_bytes = sh->shm.map_bytes, .stride = sh->shm.stride,
        .block_bytes = sh->shm.block_bytes, .block_tokens = sh->shm.block_tokens,
        .num_blocks = sh->shm.num_blocks, .server_pid = (uint32_t)getpid(),
        .flags = sh->shm.sparse ? KVT_SRV_TIER_SPARSE : 0,
    };
    kvt_srv_buf b = {0};
    kvt__srv_hello_rep_encode(&b, &r);
    st = b.oom ? KVT_ENOMEM
               : kvt__srv_send_frame(c->fd, KVT_SRV_HELLO | KVT_SRV_REPLY, 0, b.p, b.len,
                                     sh->shm.fd, kvt__deadline_ns(FRAME_MS));
    kvt__srv_buf_free(&b);
    if (!st) {
        c->sh = sh;
        kvt__srv_log(c->watcher ? KVT_LOG_DEBUG : KVT_LOG_INFO,
                     "client pid %ld (uid %ld) attached (geometry %s)", (long)c->pid, (long)c->uid,
                     sh->id);
    }
    return st;
}

/* SESSION, once, after HELLO: the client handle's key, under which a
 * cut-off store's blocks are fenced; RESUMED frees this pid's fences of
 * that key (its copies stopped; the pid is the socket's, not the client's
 * word). */
static kvt_status on_session(kvt_srv_conn *c, const uint8_t *p, size_t len)
{
    uint64_t key;
    uint32_t flags, zero;
    kvt_status st = kvt__srv_task_rep_decode(p, len, &key, &flags, &zero);
    if (st) return st;
    if (c->session || !key || zero || (flags & ~KVT_SRV_SESSION_RESUMED))
        return kvt__fail(KVT_EPROTO, "session: %s", c->session ? "a second SESSION" :
                         "key 0 or unknown flags");
    c->session = key;
    uint32_t freed = flags & KVT_SRV_SESSION_RESUMED
                         ? kvt__srv_fences_release(c->srv, c->pid, key) : 0;
    kvt_srv_buf b = {0};
    kvt__srv_task_rep_encode(&b, 0, freed, 0);
    st = reply(c, KVT_SRV_SESSION, &b);
    kvt__srv_buf_free(&b);
    return st;
}

/* GEOMETRY, before HELLO: the declared geometry (or the first attached),
 * encoded as a HELLO with its block_tokens. */
static kvt_status on_geometry(kvt_srv_conn *c, size_t len)
{
    if (len) return kvt__fail(KVT_EPROTO, "geometry: %zu bytes of payload", len);
    c->watcher = true; /* a client that takes the server's geometry watches (kvtier stats) */
    kvt_srv_shard *sh = kvt__srv_shard_first(c->srv);
    if (!sh)
        return reply_err(c, KVT_SRV_GEOMETRY,
                         kvt__fail(KVT_EGEOMETRY, "the server serves any geometry and no client "
                                   "attached yet: attach with the engine's geometry"));
    kvt_srv_buf b = {0};
    kvt_status st = kvt__srv_hello_encode(&b, (uint32_t)getpid(), sh->geo, sh->block_tokens);
    st = st ? reply_err(c, KVT_SRV_GEOMETRY, st) : reply(c, KVT_SRV_GEOMETRY, &b);
    kvt__srv_buf_free(&b);
    return st;
}

/* KVT_EAUTH naming the namespace (printable bytes, at most 64) and the
 * client, logged at warn too: an operator sees who tried what. */
static kvt_status ns_refused(kvt_srv_conn *c, const uint8_t *ns, uint32_t len)
{
    char name[72];
    uint32_t n = len < 64 ? len : 64, i;
    for (i = 0; i < n; i++) name[i] = ns[i] >= 0x20 && ns[i] < 0x7f ? (char)ns[i] : '?';
    snprintf(name + i, sizeof name - i, "%s", len > 64 ? "..." : "");
    kvt_status st = kvt__fail(KVT_EAUTH, "namespace \"%s\" is not allowed for client pid %ld "
                              "(uid %ld, gid %ld) by the server's server_namespaces", len ? name :
                              "(default)", (long)c->pid, (long)c->uid, (long)c->peer.gid);
    kvt__srv_log(KVT_LOG_WARN, "%s", kvt_last_error());
    return st;
}

/* A decoded request as the cache takes it (pointing into q). */
static kvt_request srv_request(const kvt_srv_req *q)
{
    kvt_request req = {.ns = q->ns, .ns_len = q->ns_len};
    if (q->form >= 1) {
        req.keys = q->keys;
        req.num_keys = q->count;
        req.flags = q->form == 2 ? KVT_REQ_INDEPENDENT_KEYS : 0;
    } else {
        req.tokens = q->tokens;
        req.num_tokens = q->count;
    }
    return req;
}

/* A store task's chain roots, under its namespace (server.h,
 * kvt_srv_roots): one block hash per request; independent keys are each a
 * root, so there the planned ones. */
static void record_roots(kvt_srv_conn *c, const kvt_request *req, const kvt_store_plan *pl)
{
    uint32_t bt = c->sh->shm.block_tokens;
    kvt_hash128 one, *h = &one;
    uint32_t n = 0;
    if (req->keys && (req->flags & KVT_REQ_INDEPENDENT_KEYS)) {
        uint32_t first = pl->first_token / bt, nb = pl->num_tokens / bt;
        if (first > req->num_keys || nb > req->num_keys - first) return;
        if (nb > 1 && !(h = malloc((size_t)nb * sizeof *h))) return;
        n = kvt__key_roots(req->keys + first, nb, req->ns, req->ns_len, h, nb);
    } else if (req->keys) {
        n = kvt__key_hashes(req->keys, req->num_keys ? 1 : 0, req->ns, req->ns_len, h, 1);
    } else {
        n = kvt__block_hashes(req->tokens, req->num_tokens, bt, req->ns, req->ns_len, h, 1);
    }
    if (n) kvt__srv_roots_add(c->sh, req->ns, req->ns_len, h, n);
    if (h != &one) free(h);
}

/* With KV events on: a keyed store's planned blocks are named by the
 * engine's keys (events.h kvt__events_name), so a router computing the
 * engine's block hashes matches the BlockStored it will publish; a token
 * store's carry their tokens (kvt__events_tokens: vLLM's token_ids). One
 * hash pass over the keys or tokens per store request (they are hashed
 * again at commit by the cache: the events need them before). */
static void name_blocks(kvt_srv_conn *c, const kvt_request *req, const kvt_store_plan *pl)
{
    kvt_events *ev = c->srv->events;
    uint32_t bt = c->sh->shm.block_tokens;
    uint32_t first = pl->first_token / bt, nb = pl->num_tokens / bt;
    if (ev && req->tokens && nb && first + nb <= req->num_tokens / bt) {
        kvt_hash128 *h = malloc((size_t)(first + nb) * sizeof *h);
        if (h && kvt__block_hashes(req->tokens, req->num_tokens, bt, req->ns, req->ns_len, h,
                                   first + nb) == first + nb)
            kvt__events_tokens(ev, h + first, req->tokens + (size_t)first * bt, nb, bt);
        free(h); /* no memory: these BlockStored carry no token_ids */
        return;
    }
    if (!ev || !req->keys || !nb || first > req->num_keys || nb > req->num_keys - first) return;
    bool independent = req->flags & KVT_REQ_INDEPENDENT_KEYS;
    uint32_t n = independent ? nb : first + nb; /* chained: the chain from key 0 */
    kvt_hash128 *h = malloc((size_t)n * sizeof *h);
    if (!h) return; /* the events then name these blocks by kvtier's ids */
    uint32_t got = independent ? kvt__key_roots(req->keys + first, nb, req->ns, req->ns_len, h, nb)
                               : kvt__key_hashes(req->keys, n, req->ns, req->ns_len, h, n);
    if (got == n) kvt__events_name(ev, independent ? h : h + first, req->keys + first, nb);
    free(h);
}

/* CLEAR: every unpinned block this geometry's tier holds under one
 * namespace (one this client may use) leaves the CPU and SSD tiers. New
 * stores' SSD writes pin their blocks: they are waited for first (at most
 * CLEAR_FLUSH_MS). Pinned blocks (loads in flight) are kept and counted. */
#define CLEAR_FLUSH_MS 2000
static kvt_status on_clear(kvt_srv_conn *c, const uint8_t *p, size_t len)
{
    const uint8_t *ns = NULL;
    uint32_t ns_len = 0, removed = 0, kept = 0;
    kvt_status st = kvt__srv_clear_decode(p, len, &ns, &ns_len);
    if (st) return st; /* a protocol violation: the caller drops the client */
    if (!kvt__srv_ns_allowed(&c->srv->ns, &c->peer, ns, ns_len))
        return reply_err(c, KVT_SRV_CLEAR, ns_refused(c, ns, ns_len));
    (void)kvt_cache_flush(c->sh->cache, CLEAR_FLUSH_MS);
    st = kvt__srv_roots_clear(c->sh, ns, ns_len, &removed, &kept);
    if (st) return reply_err(c, KVT_SRV_CLEAR, st);
    kvt__srv_log(KVT_LOG_INFO, "client pid %ld cleared a namespace of %u bytes in geometry %s: "
                 "%u blocks removed, %u kept (pinned)", (long)c->pid, ns_len, c->sh->id,
                 removed, kept);
    kvt_srv_buf b = {0};
    kvt__srv_task_rep_encode(&b, 0, removed, kept);
    st = reply(c, KVT_SRV_CLEAR, &b);
    kvt__srv_buf_free(&b);
    return st;
}

/* After a lookup of req matched `matched` tokens: true when the hooks
 * (the cluster tier's pull) stored more of its blocks, so it is asked
 * again. */
static bool fill_more(kvt_srv_conn *c, const kvt_request *req, uint32_t matched)
{
    const kvt_srv_hooks *h = &c->srv->hooks;
    return h->fill && h->fill(h->arg, c->sh, req, matched);
}

/* A task's checksums travel in one frame (sums.c): a request of more
 * blocks than that is planned up to there (the rest is a miss now; the
 * engine stores or asks again from there). At 32 layers 63 549 blocks. */
static void cap_request(const kvt_srv_shard *sh, kvt_request *req)
{
    uint64_t maxb = kvt__srv_sums_max_blocks(sh->geo->num_layers);
    if (req->keys && req->num_keys > maxb) req->num_keys = (uint32_t)maxb;
    if (!req->keys && req->num_tokens > maxb * sh->block_tokens)
        req->num_tokens = (uint32_t)(maxb * sh->block_tokens);
}

/* LOOKUP and PREPARE. */
static kvt_status on_plan(kvt_srv_conn *c, uint16_t op, const uint8_t *p, size_t len)
{
    kvt_server *s = c->srv;
    kvt_srv_req q;
    kvt_status st = kvt__srv_req_decode(p, len, &q);
    if (st) return st; /* a protocol violation: the caller drops the client */
    if (c->ntasks >= s->cfg.server_client_tasks) sweep_expired(c);
    if (!kvt__srv_ns_allowed(&s->ns, &c->peer, q.ns, q.ns_len))
        st = ns_refused(c, q.ns, q.ns_len);
    else if (c->ntasks >= s->cfg.server_client_tasks)
        st = kvt__fail(KVT_EFULL, "this client holds %u tasks (server_client_tasks); launch, "
                       "wait or cancel some first", c->ntasks);
    kvt_request req = srv_request(&q);
    cap_request(c->sh, &req);
    kvt_srv_buf b = {0};
    if (!st && op == KVT_SRV_LOOKUP) {
        kvt_match m;
        st = kvt_cache_lookup(c->sh->cache, &req, &m);
        if (!st && fill_more(c, &req, m.matched_tokens)) {
            if (m.task) kvt__cache_ext_abort(c->sh->cache, m.task, read_deadline(c));
            st = kvt_cache_lookup(c->sh->cache, &req, &m);
        }
        if (!st && m.task) st = add_task(c, m.task, KVT_TASK_LOAD, m.matched_tokens);
        if (!st) kvt__srv_task_rep_encode(&b, m.task, m.matched_tokens, 0);
        if (st && m.task) kvt__cache_ext_abort(c->sh->cache, m.task, read_deadline(c));
    } else if (!st) {
        kvt_store_plan pl;
        st = kvt_cache_prepare_store(c->sh->cache, &req, &pl);
        if (!st && pl.task) st = add_task(c, pl.task, KVT_TASK_STORE, pl.num_tokens);
        if (!st && pl.task) record_roots(c, &req, &pl);
        if (!st && pl.task) name_blocks(c, &req, &pl);
        if (!st) kvt__srv_task_rep_encode(&b, pl.task, pl.first_token, pl.num_tokens);
        if (st && pl.task) kvt__cache_ext_abort(c->sh->cache, pl.task, read_deadline(c));
    }
    free(q.tokens);
    free(q.keys);
    kvt_status io = st ? reply_err(c, op, st) : reply(c, op, &b);
    kvt__srv_buf_free(&b);
    return io;
}

/* PEEK: LOOKUP's answer with no task (so no quota), nothing pinned. */
static kvt_status on_peek(kvt_srv_conn *c, const uint8_t *p, size_t len)
{
    kvt_srv_req q;
    kvt_status st = kvt__srv_req_decode(p, len, &q);
    if (st) return st; /* a protocol violation: the caller drops the client */
    uint32_t matched = 0;
    if (!kvt__srv_ns_allowed(&c->srv->ns, &c->peer, q.ns, q.ns_len)) {
        st = ns_refused(c, q.ns, q.ns_len);
    } else {
        kvt_request req = srv_request(&q);
        st = kvt_cache_peek(c->sh->cache, &req, &matched);
        if (!st && fill_more(c, &req, matched)) st = kvt_cache_peek(c->sh->cache, &req, &matched);
    }
    free(q.tokens);
    free(q.keys);
    if (st) return reply_err(c, KVT_SRV_PEEK, st);
    kvt_srv_buf b = {0};
    kvt__srv_task_rep_encode(&b, 0, matched, 0);
    st = reply(c, KVT_SRV_PEEK, &b);
    kvt__srv_buf_free(&b);
    return st;
}

/* PEEK_MANY: PEEK of each request, one round trip (vLLM's scheduler asks
 * every TP rank's namespace of a request at once). A refused namespace or
 * a request the cache refuses fails that entry only; a malformed one
 * breaks the protocol. */
static kvt_status on_peek_many(kvt_srv_conn *c, const uint8_t *p, size_t len)
{
    kvt_srv_span *sp = NULL;
    uint32_t n = 0;
    kvt_status st = kvt__srv_peek_many_decode(p, len, &sp, &n);
    if (st) return st;
    int32_t *status = calloc(n ? n : 1, sizeof *status);
    uint32_t *matched = calloc(n ? n : 1, sizeof *matched);
    if (!status || !matched) {
        free(sp);
        free(status);
        free(matched);
        return reply_err(c, KVT_SRV_PEEK_MANY, kvt__fail(KVT_ENOMEM, "peek many: no memory"));
    }
    for (uint32_t i = 0; i < n && !st; i++) {
        kvt_srv_req q;
        if ((st = kvt__srv_req_decode(sp[i].p, sp[i].len, &q))) break;
        kvt_status e;
        if (!kvt__srv_ns_allowed(&c->srv->ns, &c->peer, q.ns, q.ns_len)) {
            e = ns_refused(c, q.ns, q.ns_len);
        } else {
            kvt_request req = srv_request(&q);
            e = kvt_cache_peek(c->sh->cache, &req, &matched[i]);
            if (!e && fill_more(c, &req, matched[i]))
                e = kvt_cache_peek(c->sh->cache, &req, &matched[i]);
        }
        status[i] = (int32_t)e;
        free(q.tokens);
        free(q.keys);
    }
    free(sp);
    if (!st) {
        kvt_srv_buf b = {0};
        kvt__srv_peek_answers_encode(&b, status, matched, n);
        st = reply(c, KVT_SRV_PEEK_MANY, &b);
        kvt__srv_buf_free(&b);
    }
    free(status);
    free(matched);
    return st;
}

static kvt_status not_ours(uint64_t id)
{
    return kvt__fail(KVT_ENOTFOUND, "task %llu is unknown, already reported, or not this "
                     "client's", (unsigned long long)id);
}

/* A load's layer checksums, block 0's layers first (sums.c): the
 * client checks its copy against them. Blocks the tier refilled (from
 * the SSD or a peer) are hashed here, once, at their first load. */
static kvt_status load_sums(kvt_srv_conn *c, const kvt_srv_task *t, uint64_t **out)
{
    const kvt_srv_shard *sh = c->sh;
    uint32_t n = t->num_blocks ? t->num_blocks : 1;
    uint64_t *sums = malloc((size_t)n * sh->geo->num_layers * sizeof *sums);
    if (!sums) return kvt__fail(KVT_ENOMEM, "launch: no memory for the checksums of %u blocks", n);
    kvt__srv_sums_get(&c->sh->sums, sh->shm.base, sh->geo, sh->shm.block_tokens, t->offsets,
                      t->ids, t->keys, t->num_blocks, sums);
    *out = sums;
    return KVT_OK;
}

/* Answers LAUNCH: the blocks' offsets, or "pending" while a load's SSD
 * reads run. Never waits for the SSD: the client asks again (a LAUNCH of
 * the same task), so neither this thread nor the client's caller blocks. */
static kvt_status launch_reply(kvt_srv_conn *c, kvt_srv_task *t, kvt_status st,
                               const kvt_ext_launch *l, const kvt_ext_blocks *blk)
{
    uint64_t id = t->id, *offs = blk->offsets;
    if (!st && l->reading) { /* the task stays launched */
        free(offs);
        t->launched = t->pending = true;
        kvt_srv_launch_rep r = {(uint32_t)KVT_TASK_LOAD, 0, 0, 0, KVT_OK,
                                KVT_SRV_LAUNCH_PENDING, NULL, 0, NULL};
        kvt_srv_buf b = {0};
        kvt__srv_launch_rep_encode(&b, &r, NULL, NULL);
        st = reply(c, KVT_SRV_LAUNCH, &b);
        kvt__srv_buf_free(&b);
        return st;
    }
    if (st) {
        free(offs);
        kvt__cache_ext_abort(c->sh->cache, id, read_deadline(c));
        drop_task(c, t);
        return reply_err(c, KVT_SRV_LAUNCH, st);
    }
    t->launched = true;
    t->pending = false;
    t->num_blocks = l->num_blocks;
    t->first_token = l->first_token;
    t->offsets = offs; /* the task owns blk now: freed with its offsets */
    t->keys = blk->keys;
    t->ids = blk->ids;
    kvt_srv_launch_rep r = {(uint32_t)l->kind, l->first_token, l->num_tokens, l->num_blocks,
                            l->bad_status, 0, NULL, 0, NULL};
    uint64_t *sums = NULL;
    st = kvt__cache_ext_keys(c->sh->cache, id, t->keys, t->ids, t->pins + 1);
    if (!st && l->kind == KVT_TASK_LOAD) st = load_sums(c, t, &sums);
    if (st) { /* the task ends here (a load unpinned, a store rolled back) */
        kvt__cache_ext_abort(c->sh->cache, id, read_deadline(c));
        drop_task(c, t);
        return reply_err(c, KVT_SRV_LAUNCH, st);
    }
    if (sums) r.num_layers = c->sh->geo->num_layers;
    t->launched_ns = kvt__now_ns(); /* the client's copy starts: server_copy_ms runs */
    kvt_srv_buf b = {0};
    kvt__srv_launch_rep_encode(&b, &r, offs, sums);
    free(sums);
    st = reply(c, KVT_SRV_LAUNCH, &b);
    kvt__srv_buf_free(&b);
    return st;
}

static kvt_status on_launch(kvt_srv_conn *c, const uint8_t *p, size_t len)
{
    uint64_t id;
    kvt_status st = kvt__srv_id_decode(p, len, &id);
    if (st) return st;
    kvt_srv_task *t = find_task(c, id);
    if (!t) return reply_err(c, KVT_SRV_LAUNCH, not_ours(id));
    if (t->launched && !t->pending)
        return reply_err(c, KVT_SRV_LAUNCH, kvt__fail(KVT_ESTATE, "task %llu was already "
                                                      "launched", (unsigned long long)id));
    /* Room for the blocks the task planned (a launch never grows it): a
     * room for the largest request was a 2 MiB allocation, mmap'd and
     * unmapped by every launch. */
    uint32_t max = t->pins + 1;
    kvt_ext_blocks b; /* the offsets, the blocks' keys and entries (launch_reply) */
    if (kvt__ext_blocks_alloc(&b, max, 0, t->pending ? "launch (ask again)" : "launch")) {
        st = reply_err(c, KVT_SRV_LAUNCH, KVT_ENOMEM);
        if (t->pending) return st;
        kvt__cache_ext_abort(c->sh->cache, id, read_deadline(c));
        drop_task(c, t);
        return st;
    }

    kvt_ext_launch l;
    /* A deadline already passed: the cache only looks whether the reads are done. */
    uint64_t now = kvt__deadline_ns(0);
    st = t->pending ? kvt__cache_ext_offsets(c->sh->cache, id, now, b.offsets, max, &l)
                    : kvt__cache_ext_launch(c->sh->cache, id, now, b.offsets, max, &l);
    return launch_reply(c, t, st, &l, &b);
}

static kvt_status end_reply(kvt_srv_conn *c, uint16_t op, const kvt_task_result *r)
{
    kvt_srv_buf b = {0};
    kvt__srv_result_encode(&b, r);
    kvt_status st = reply(c, op, &b);
    kvt__srv_buf_free(&b);
    return st;
}

/* A load whose client found bytes unlike the sums they were stored with:
 * the blocks that still differ (the tier's bytes hashed again against
 * their records) leave the tiers with the chains below them, so the next
 * lookup misses instead of failing again. Rare: one pass over the task's
 * blocks and one over the index. Called with the task still pinned. */
static uint32_t find_corrupt(kvt_srv_conn *c, const kvt_srv_task *t, kvt_hash128 *bad)
{
    const kvt_srv_shard *sh = c->sh;
    return kvt__srv_sums_check(&c->sh->sums, sh->shm.base, sh->geo, sh->shm.block_tokens,
                               t->offsets, t->ids, t->keys, t->num_blocks, bad);
}

/* A store's END commits it: the layer checksums its client took while
 * copying are recorded first (sums.c), so any load of its blocks is
 * checked against them. END_SYNC is the same (the store is visible when
 * either is answered). A load's END releases its pins; one its client
 * failed with KVT_ECORRUPT drops the blocks found changed. */
static kvt_status on_end(kvt_srv_conn *c, uint16_t op, const uint8_t *p, size_t len)
{
    kvt_srv_end e;
    kvt_status st = kvt__srv_end_decode(p, len, &e);
    if (st) return st;
    kvt_srv_task *t = find_task(c, e.task);
    if (!t || !t->launched) return reply_err(c, op, not_ours(e.task));
    if (t->pending) /* kept: its reads run; CANCEL or detach releases it */
        return reply_err(c, op, kvt__fail(KVT_ESTATE, "task %llu: its SSD reads "
                                                   "still run (LAUNCH again, or CANCEL it)",
                                                   (unsigned long long)e.task));
    kvt_status verdict = (kvt_status)e.status;
    const uint32_t nl = c->sh->geo->num_layers;
    if (verdict == KVT_OK && t->kind == KVT_TASK_STORE) {
        if (e.n != t->num_blocks || e.num_layers != nl)
            verdict = kvt__fail(KVT_EPROTO, "store task %llu: checksums of %u blocks x %u "
                                "layers for %u blocks x %u layers", (unsigned long long)t->id,
                                e.n, e.num_layers, t->num_blocks, nl);
        else
            kvt__srv_sums_put(&c->sh->sums, t->ids, t->keys, t->num_blocks, e.checksums);
    }
    const bool corrupt = t->kind == KVT_TASK_LOAD && verdict == KVT_ECORRUPT;
    kvt_hash128 *bad = NULL;
    uint32_t nbad = 0;
    if (corrupt && (bad = malloc((t->num_blocks ? t->num_blocks : 1) * sizeof *bad)))
        nbad = find_corrupt(c, t, bad);
    kvt_task_result r;
    st = kvt__cache_ext_end(c->sh->cache, e.task, verdict, &r);
    drop_task(c, t); /* t is another task's now */
    if (corrupt) {
        char who[48];
        snprintf(who, sizeof who, "client pid %ld's load", (long)c->pid);
        kvt__srv_drop_corrupt(c->sh, bad, nbad, who);
    }
    free(bad);
    return st ? reply_err(c, op, st) : end_reply(c, op, &r);
}

static kvt_status on_cancel(kvt_srv_conn *c, const uint8_t *p, size_t len)
{
    uint64_t id;
    kvt_status st = kvt__srv_id_decode(p, len, &id);
    if (st) return st;
    kvt_srv_task *t = find_task(c, id);
    if (!t) return reply_err(c, KVT_SRV_CANCEL, not_ours(id));
    st = kvt__cache_ext_abort(c->sh->cache, id, read_deadline(c));
    drop_task(c, t);
    if (st) return reply_err(c, KVT_SRV_CANCEL, st);
    kvt_srv_buf b = {0};
    st = reply(c, KVT_SRV_CANCEL, &b);
    return st;
}

static kvt_status on_stats(kvt_srv_conn *c, size_t len)
{
    if (len) return kvt__fail(KVT_EPROTO, "stats: %zu bytes of payload", len);
    kvt_cache_stats cs;
    kvt_status st = kvt_cache_stats_get(c->sh->cache, &cs);
    if (st) return reply_err(c, KVT_SRV_STATS, st);
    kvt_srv_buf b = {0};
    kvt__srv_stats_encode(&b, &cs);
    st = reply(c, KVT_SRV_STATS, &b);
    kvt__srv_buf_free(&b);
    return st;
}

static kvt_status on_flush(kvt_srv_conn *c, const uint8_t *p, size_t len)
{
    uint64_t ms;
    kvt_status st = kvt__srv_id_decode(p, len, &ms);
    if (st) return st;
    if (ms > 600000) ms = 600000; /* this client's thread is busy meanwhile */
    st = kvt_cache_flush(c->sh->cache, (int64_t)ms);
    if (st) return reply_err(c, KVT_SRV_FLUSH, st);
    kvt_srv_buf b = {0};
    return reply(c, KVT_SRV_FLUSH, &b);
}

/* The server's own figures for STATS_ALL (kvtier stats' header line). */
static void server_info(kvt_server *s, kvt_srv_info *out)
{
    uint64_t clients = 0;
    pthread_mutex_lock(&s->mu);
    for (const kvt_srv_conn *c = s->conns; c; c = c->next)
        clients += c->attached && !c->watcher;
    pthread_mutex_unlock(&s->mu);
    *out = (kvt_srv_info){
        .pid = (uint64_t)getpid(), .uptime_ms = (kvt__now_ns() - s->created_ns) / 1000000,
        .clients = clients, .max_clients = s->cfg.server_max_clients,
        .geometries = atomic_load(&s->nshards), .max_geometries = s->max_shards,
        .cpu_capacity = s->cfg.cpu_capacity, .metrics_port = s->cfg.metrics_port};
    snprintf(out->version, sizeof out->version, "%s", kvt_version_string());
}

/* STATS_ALL: every tier's figures (or those of one geometry's tiers),
 * before or after HELLO. Reads only: it never makes a tier, so a watcher
 * that names a geometry the server does not hold learns so (KVT_ENOTFOUND
 * naming it and the ones held) instead of creating it. */
static kvt_status on_stats_all(kvt_srv_conn *c, const uint8_t *p, size_t len)
{
    kvt_server *s = c->srv;
    kvt_srv_hello h = {0};
    kvt_status st = len ? kvt__srv_hello_decode(p, len, false, &h) : KVT_OK;
    if (st) return st; /* a protocol violation: the caller drops the client */
    uint32_t n = atomic_load(&s->nshards), got = 0;
    kvt_srv_tier *t = calloc(n ? n : 1, sizeof *t);
    if (!t) st = kvt__fail(KVT_ENOMEM, "stats: no memory");
    for (uint32_t i = 0; !st && i < n; i++) {
        kvt_srv_shard *sh = s->shards[i];
        if (h.geo && kvt_geometry_compare(sh->geo, h.geo) != KVT_OK) continue;
        kvt_srv_tier *x = &t[got++];
        x->fingerprint = sh->fingerprint;
        x->num_layers = sh->geo->num_layers;
        x->tokens_per_page = sh->geo->tokens_per_page;
        x->block_tokens = sh->block_tokens;
        x->bytes_per_token = kvt__geo_bytes_per_token(sh->geo);
        st = kvt_cache_stats_get(sh->cache, &x->stats);
    }
    if (!st && h.geo && !got) {
        uint64_t fp = 0;
        char held[KVT_SRV_MAX_ERRMSG / 2] = "";
        size_t used = 0;
        for (uint32_t i = 0; i < n && used < sizeof held; i++) {
            int k = snprintf(held + used, sizeof held - used, "%s%s", i ? ", " : "",
                             s->shards[i]->id);
            if (k > 0) used += (size_t)k;
        }
        (void)kvt__srv_geo_fingerprint(s, h.geo, 0, &fp);
        st = kvt__fail(KVT_ENOTFOUND, "the server holds no tier for geometry g%016llx (%u "
                       "layers, %llu bytes per token, %u tokens per page); it holds: %s",
                       (unsigned long long)fp, h.geo->num_layers,
                       (unsigned long long)kvt__geo_bytes_per_token(h.geo),
                       h.geo->tokens_per_page, n ? held : "none (no client attached yet)");
    }
    kvt_geometry_destroy(h.geo);
    if (st) {
        free(t);
        return reply_err(c, KVT_SRV_STATS_ALL, st);
    }
    kvt_srv_quota q[KVT_SRV_MAX_QUOTAS];
    uint32_t nq = kvt__srv_quota_usage(s, q);
    kvt_srv_info info;
    server_info(s, &info);
    kvt_srv_buf b = {0};
    kvt__srv_tiers_encode(&b, t, got, q, nq, &info);
    free(t);
    st = reply(c, KVT_SRV_STATS_ALL, &b);
    kvt__srv_buf_free(&b);
    return st;
}

/* One request; an error return ends the connection. */
static kvt_status serve_one(kvt_srv_conn *c, bool *hello_done)
{
    /* Idle clients may wait for ever; a started frame has a deadline; a
     * launched copy has server_copy_ms, checked at least 4 times in it. */
    uint32_t tick = c->srv->cfg.server_copy_ms / 4 < 1000 ? c->srv->cfg.server_copy_ms / 4 : 1000;
    /* The client's next call usually follows at once: poll a moment
     * (server_spin_us) before sleeping, so it does not wait for a wake-up. */
    if (c->srv->cfg.server_spin_us) kvt__fd_spin(c->fd, c->srv->cfg.server_spin_us);
    uint64_t attach_by = c->accepted_ns + (uint64_t)KVT_SRV_ATTACH_MS * 1000000ull;
    for (;;) {
        if (check_copy_deadline(c)) return KVT_ETIMEDOUT;
        uint64_t until = kvt__deadline_ns(tick);
        if (!*hello_done && attach_by < until) until = attach_by;
        kvt_status st = kvt__fd_wait(c->fd, POLLIN, until);
        if (st == KVT_OK) break;
        if (st != KVT_ETIMEDOUT) return st;
        if (!*hello_done && kvt__now_ns() >= attach_by)
            return kvt__fail(KVT_ETIMEDOUT, "client pid %ld connected but did not attach "
                             "within %d ms", (long)c->pid, KVT_SRV_ATTACH_MS);
        sweep_expired(c); /* idle for a tick */
    }
    kvt_srv_hdr h;
    uint8_t *p = NULL;
    kvt_status st = kvt__srv_recv_frame(c->fd, &h, &p, NULL, kvt__deadline_ns(FRAME_MS));
    if (st == KVT_EVERSION) {
        /* A client of another protocol version hears it (the reply's header
         * has this server's version, which its decoder names), rather than
         * a closed connection it would take for a dead server. */
        char why[KVT_SRV_MAX_ERRMSG];
        snprintf(why, sizeof why, "%s (the client's; the server speaks %u): upgrade the client "
                 "and the server together", kvt_last_error(), KVT_SRV_VERSION);
        (void)kvt__srv_send_frame(c->fd, KVT_SRV_HELLO | KVT_SRV_REPLY, KVT_EVERSION, why,
                                  strlen(why), -1, kvt__deadline_ns(FRAME_MS));
        return kvt__fail(KVT_EVERSION, "client pid %ld: %s", (long)c->pid, why);
    }
    if (st) return st;
    if (h.op & KVT_SRV_REPLY) {
        free(p);
        return kvt__fail(KVT_EPROTO, "the client sent a reply (op 0x%x)", h.op);
    }
    if (!*hello_done && h.op != KVT_SRV_HELLO && h.op != KVT_SRV_GEOMETRY &&
        h.op != KVT_SRV_STATS_ALL) {
        free(p);
        return kvt__fail(KVT_EPROTO, "the client's first message is op %u, not HELLO", h.op);
    }
    switch (h.op) {
    case KVT_SRV_HELLO:
        if (*hello_done) st = kvt__fail(KVT_EPROTO, "a second HELLO");
        else if (!(st = on_hello(c, p, h.len))) *hello_done = true;
        break;
    case KVT_SRV_LOOKUP:
    case KVT_SRV_PREPARE: st = on_plan(c, h.op, p, h.len); break;
    case KVT_SRV_PEEK: st = on_peek(c, p, h.len); break;
    case KVT_SRV_LAUNCH: st = on_launch(c, p, h.len); break;
    case KVT_SRV_END:
    case KVT_SRV_END_SYNC: st = on_end(c, h.op, p, h.len); break;
    case KVT_SRV_CANCEL: st = on_cancel(c, p, h.len); break;
    case KVT_SRV_STATS: st = on_stats(c, h.len); break;
    case KVT_SRV_STATS_ALL: st = on_stats_all(c, p, h.len); break;
    case KVT_SRV_CLEAR: st = on_clear(c, p, h.len); break;
    case KVT_SRV_PEEK_MANY: st = on_peek_many(c, p, h.len); break;
    case KVT_SRV_FLUSH: st = on_flush(c, p, h.len); break;
    case KVT_SRV_SESSION: st = on_session(c, p, h.len); break;
    case KVT_SRV_GEOMETRY:
        st = *hello_done ? kvt__fail(KVT_EPROTO, "GEOMETRY after HELLO") : on_geometry(c, h.len);
        break;
    default: st = kvt__fail(KVT_EPROTO, "unknown op %u", h.op);
    }
    free(p);
    return st;
}

/* The handshake every client passes first (net/stream_auth.c, as the PD
 * endpoints): with server_secret_file set, mutual HMAC-SHA256 proof of the
 * secret; without, the client learns the server needs none. */
static kvt_status authenticate(kvt_srv_conn *c)
{
    kvt_stream_auth a = {.secret = c->srv->secret, .secret_len = c->srv->secret_len,
                         .who = "kvtier server", .realm = &kvt__auth_server,
                         .refuse = c->not_admitted ? KVT_AUTH_NOT_ADMITTED : 0};
    kvt_status st = kvt__stream_auth_server(c->fd, &a, kvt__deadline_ns(FRAME_MS));
    if (st && c->not_admitted) return st; /* accept_one logged it */
    if (st && !atomic_load(&c->pushed_out))
        kvt__srv_log(KVT_LOG_WARN, "refused client pid %ld (uid %ld): %s", (long)c->pid,
                     (long)c->uid, *kvt_last_error() ? kvt_last_error() :
                     "it hung up during the handshake (it refused this server's proof)");
    return st;
}

void *kvt__srv_conn_main(void *arg)
{
    kvt_srv_conn *c = arg;
    bool hello_done = false;
    kvt_status st = authenticate(c);
    while (!st && !(st = serve_one(c, &hello_done))) {}
    if ((st == KVT_EPROTO || st == KVT_EVERSION) && !atomic_load(&c->pushed_out))
        kvt__srv_log(KVT_LOG_WARN, "client pid %ld dropped: %s", (long)c->pid, kvt_last_error());
    else if (st == KVT_ETIMEDOUT && !hello_done)
        kvt__srv_log(KVT_LOG_INFO, "%s", kvt_last_error());
    /* Shut before any pin goes: a client that still sees the connection
     * open after its copy ended knows its pins outlived the copy
     * (client.c, end_early). */
    shutdown(c->fd, SHUT_RDWR);
    uint32_t released = c->ntasks;
    while (c->ntasks) {
        kvt__cache_ext_abort(c->sh->cache, c->tasks[0].id, read_deadline(c));
        drop_task(c, &c->tasks[0]);
    }
    free(c->tasks);
    if (hello_done)
        kvt__srv_log(c->watcher ? KVT_LOG_DEBUG : KVT_LOG_INFO,
                     "client pid %ld (uid %ld) detached (%u tasks released)", (long)c->pid,
                     (long)c->uid, released);
    atomic_store(&c->finished, true);
    return NULL;
}
