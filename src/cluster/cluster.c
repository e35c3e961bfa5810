/* cluster.c - the cluster tier (docs/cluster.md): node servers tell a
 * Redis directory which blocks they hold, and a lookup that misses locally
 * pulls the request's next blocks from the peer that holds them into this
 * node's CPU tier, where they are served like local hits.
 *
 * Layers: above server (its hooks, shards and caches) and net (streams,
 * the handshake); dir.c talks to Redis, pull.c frames the pulls. Threads:
 * one publishing the index's changes to the directory (the observer only
 * queues: it runs under a cache lock), one accepting peers, one per peer
 * served (at most cluster_serve_max); pulls run on the engine connection's
 * thread that asked (the server's fill hook), bounded by cluster_pull_ms. */
#include <errno.h>
#include <stddef.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "cache/cache.h"
#include "cache/external.h"
#include "cache/observe.h"
#include "cluster/cluster.h"
#include "cluster/dir.h"
#include "cluster/pull.h"
#include "cluster/pull_cost.h"
#include "events/events.h"
#include "index/index.h"
#include "metrics/metrics.h"
#include "net/stream.h"
#include "server/auth.h"
#include "server/proto.h"
#include "server/server.h"
#include "util/clock.h"
#include "util/err.h"
#include "util/log.h"
#include "util/parse.h"

#define CL_QUEUE 65536         /* index changes waiting to be published, at most */
#define CL_BATCH 512           /* published per directory round trip */
#define CL_PUBLISH_MS 20       /* the publisher's longest sleep with work queued */
#define CL_CONNECT_MS 300      /* a peer that does not take a connection by then is down */
#define CL_AUTH_MS 5000        /* a peer's handshake, either side */
#define CL_IDLE_MS 60000       /* a served connection with no FETCH for this long is closed */
#define CL_PEERS 64            /* peers remembered (idle links, down marks) */
#define CL_IDLE_LINKS 4        /* idle links kept per peer */
#define CL_IOV 256             /* blocks per sendv/recvv (below IOV_MAX) */

typedef struct cl_event {
    uint64_t space;
    kvt_hash128 h;
    uint8_t stored; /* 1 held (in the tiers below), 0 REMOVED */
    uint8_t tiers;  /* KVT_CACHE_TIER_CPU | _DISK (cache/observe.h) */
} cl_event;

typedef struct cl_link {
    kvt_stream *s;
    struct cl_link *next;
} cl_link;

typedef struct cl_peer {
    char addr[KVT_DIR_ADDR_MAX];
    uint64_t down_until_ns;
    cl_link *idle;
    uint32_t nidle;
    bool said_tcp_only; /* its "no" to UCX was logged */
} cl_peer;

typedef struct cl_served {
    pthread_t thread;
    kvt_stream *s; /* the serving thread's own: it swaps it for a UCX stream */
    int fd;        /* s's socket (the same under UCX), for cluster_stop to shut */
    struct kvt_cluster *cl;
    atomic_bool done;
    struct cl_served *next;
} cl_served;

/* The blocks this node holds (what it published): republished in full
 * after the directory comes back, renewed every 2 leases. Open addressing
 * with linear probing and backward-shift deletion; the publisher's thread
 * alone uses it. */
typedef struct cl_held {
    cl_event *v; /* stored = 1: slot used */
    uint32_t cap, n;
    uint64_t bytes; /* of the n blocks (their geometries' block sizes) */
    uint32_t cpu_n, ssd_n; /* of them with a CPU copy, with a durable SSD copy */
} cl_held;

struct kvt_cluster {
    kvt_server *srv;
    const kvt_config_values *cfg;
    /* NULL until Redis answered: a node whose Redis is away at start serves
     * its local tiers and the publishing thread opens the directory later
     * (set once, read by pulls on other threads) */
    _Atomic(kvt_dir *) dir;
    kvt_dir_config dcfg; /* what the publishing thread opens it with */
    uint64_t open_backoff_ns, open_next_ns; /* its retries: 100 ms doubling to 5 s */
    char node[KVT_DIR_NODE_MAX], advertise[KVT_DIR_ADDR_MAX];
    uint8_t *secret;
    size_t secret_len;
    char redis_password[KVT_DIR_PASSWORD_MAX + 1]; /* "": no AUTH; wiped at leave */
    char sentinel_password[KVT_DIR_PASSWORD_MAX + 1]; /* the same for the sentinels */
    int listen_fd;
    uint16_t port;
    int stop_pipe[2];
    atomic_bool stopping;
    bool stopped; /* cluster_stop ran: leave, or the server's destroy before it */
    pthread_t accept_thread, publish_thread;
    bool accept_started, publish_started;
    bool ucx; /* cluster_transport ucx and UCX started: a hold on its context
               * (set at join, read-only after it, released at leave) */

    pthread_mutex_t qmu; /* a leaf lock: taken under a cache's lock by the observer */
    pthread_cond_t qcv;
    cl_event *q;
    uint32_t qhead, qlen;
    /* The publish_backlog gauge is qlen + inflight + owed: 0 with the
     * directory up means a peer's lookup finds everything this node stored.
     * inflight: the batch the publisher took and is writing (set under qmu
     * as it leaves the queue: never counted in neither place). owed: every
     * held block while the directory lacks some of them (it never opened,
     * a write failed, or it came back and is being written in full). */
    _Atomic uint32_t inflight, owed;

    pthread_mutex_t pace_mu; /* cluster_serve_mib_s: when the next byte may leave */
    uint64_t pace_next_ns;

    pthread_mutex_t mu; /* peers and served */
    cl_peer peers[CL_PEERS];
    uint32_t npeers;
    cl_served *served;
    uint32_t nserved;

    cl_held held;
    pthread_mutex_t cost_mu; /* cost */
    kvt_pull_cost cost;      /* what pulls took: fixed + per-byte (pull_cost.h) */
    _Atomic uint64_t bw_bps; /* its per-byte part as bytes/s, for stats; 0 before a pull */
    _Atomic uint64_t probe_ns; /* when a pull judged not worth it was last made anyway */
    kvt_cluster_counters st;   /* fields updated with atomic adds */
};

#define STAT_ADD(cl, f, v) __atomic_fetch_add(&(cl)->st.f, (uint64_t)(v), __ATOMIC_RELAXED)

/* ---------------------------------------------------------------- */
/* The held set                                                     */
/* ---------------------------------------------------------------- */

static uint32_t held_slot(const cl_held *t, uint64_t space, kvt_hash128 h)
{
    return (uint32_t)((h.lo ^ space * 0x9e3779b97f4a7c15ull) & (t->cap - 1));
}

static bool held_same(const cl_event *e, uint64_t space, kvt_hash128 h)
{
    return e->space == space && kvt__hash_eq(e->h, h);
}

static bool held_grow(cl_held *t)
{
    uint32_t cap = t->cap ? t->cap * 2 : 1024;
    cl_event *v = calloc(cap, sizeof *v), *old = t->v;
    if (!v) return false;
    cl_held g = {v, cap, 0, t->bytes, t->cpu_n, t->ssd_n};
    for (uint32_t i = 0; i < t->cap; i++) {
        if (!old[i].stored) continue;
        uint32_t j = held_slot(&g, old[i].space, old[i].h);
        while (v[j].stored) j = (j + 1) & (cap - 1);
        v[j] = old[i];
        g.n++;
    }
    free(old);
    *t = g;
    return true;
}

static void held_count(cl_held *t, uint8_t tiers, int d)
{
    if (tiers & KVT_CACHE_TIER_CPU) t->cpu_n += (uint32_t)d;
    if (tiers & KVT_CACHE_TIER_DISK) t->ssd_n += (uint32_t)d;
}

/* Holds h in tiers (added, or its tiers changed); *was gets the tiers it
 * had (0: new). False: no memory (the block is published but not renewed:
 * its entry expires, a miss, never a wrong byte). bytes: the block's size. */
static bool held_put(cl_held *t, uint64_t space, kvt_hash128 h, uint8_t tiers, uint64_t bytes,
                     uint8_t *was)
{
    *was = 0;
    if ((t->n + 1) * 2 > t->cap && !held_grow(t)) return false;
    uint32_t j = held_slot(t, space, h);
    while (t->v[j].stored) {
        if (held_same(&t->v[j], space, h)) {
            *was = t->v[j].tiers;
            held_count(t, *was, -1);
            held_count(t, tiers, 1);
            t->v[j].tiers = tiers;
            return true;
        }
        j = (j + 1) & (t->cap - 1);
    }
    t->v[j] = (cl_event){space, h, 1, tiers};
    t->n++;
    t->bytes += bytes;
    held_count(t, tiers, 1);
    return true;
}

static void held_del(cl_held *t, uint64_t space, kvt_hash128 h, uint64_t bytes)
{
    if (!t->cap) return;
    uint32_t j = held_slot(t, space, h);
    while (t->v[j].stored && !held_same(&t->v[j], space, h)) j = (j + 1) & (t->cap - 1);
    if (!t->v[j].stored) return;
    t->v[j].stored = 0;
    t->n--;
    held_count(t, t->v[j].tiers, -1);
    t->bytes -= bytes < t->bytes ? bytes : t->bytes;
    /* backward shift: later entries of the run move into the hole */
    for (uint32_t k = (j + 1) & (t->cap - 1); t->v[k].stored; k = (k + 1) & (t->cap - 1)) {
        uint32_t home = held_slot(t, t->v[k].space, t->v[k].h);
        bool between = j <= k ? (home > j && home <= k) : (home > j || home <= k);
        if (between) continue;
        t->v[j] = t->v[k];
        t->v[k].stored = 0;
        j = k;
    }
}

/* ---------------------------------------------------------------- */
/* Publishing                                                       */
/* ---------------------------------------------------------------- */

/* The index observer (server hook): under the shard cache's lock, so it
 * only queues; a full queue drops (counted): a dropped STORED is a block
 * peers will not find, a dropped REMOVED an entry a pull finds stale. A
 * block stored, or one of its tiers gained or lost (index.h), is queued
 * with the tiers it is in now; one left in no tier (its SSD copy found
 * lost) as removed: it cannot be served. */
static void cl_observe(void *arg, kvt_srv_shard *sh, kvt_index_event e, const kvt_index *idx,
                       const uint32_t *ids, uint32_t n)
{
    kvt_cluster *cl = arg;
    pthread_mutex_lock(&cl->qmu);
    for (uint32_t i = 0; i < n; i++) {
        if (cl->qlen == CL_QUEUE) {
            STAT_ADD(cl, queue_dropped, n - i);
            break;
        }
        uint8_t tiers = e == KVT_INDEX_REMOVED ? 0 : kvt__cache_tiers_of(sh->cache, ids[i]);
        cl->q[(cl->qhead + cl->qlen++) % CL_QUEUE] =
            (cl_event){sh->fingerprint, kvt__index_key(idx, ids[i]), tiers != 0, tiers};
    }
    if (cl->qlen >= CL_BATCH) pthread_cond_signal(&cl->qcv);
    pthread_mutex_unlock(&cl->qmu);
}

/* The tier a block's directory entry names: cpu while it has a CPU copy. */
static uint8_t dir_tier(uint8_t tiers)
{
    return tiers & KVT_CACHE_TIER_CPU ? KVT_DIR_TIER_CPU : KVT_DIR_TIER_SSD;
}

/* The publisher's scratch: one directory batch's blocks and tiers. */
typedef struct cl_batch {
    kvt_hash128 h[CL_BATCH];
    uint8_t tier[CL_BATCH];
} cl_batch;

/* Sends one run of same-kind, same-space changes; false when the
 * directory did not take it (away, or the write failed). */
static bool publish_run(kvt_cluster *cl, const cl_event *ev, uint32_t n, cl_batch *b)
{
    kvt_hash128 *h = b->h;
    uint8_t *tier = b->tier;
    for (uint32_t i = 0; i < n; i++) {
        h[i] = ev[i].h;
        tier[i] = dir_tier(ev[i].tiers);
    }
    kvt_dir *d = atomic_load(&cl->dir);
    if (!d) return false; /* held: published once the directory opens */
    kvt_status st = ev[0].stored ? kvt__dir_publish_tiers(d, ev[0].space, h, tier, n)
                                 : kvt__dir_unpublish(d, ev[0].space, h, n);
    if (st) STAT_ADD(cl, dir_errors, 1);
    else if (ev[0].stored) STAT_ADD(cl, published, n);
    else STAT_ADD(cl, unpublished, n);
    return !st;
}

/* ev[0..n) into the held set; those the directory must hear of (a block
 * new or removed, or its entry's tier changed) are kept in ev, in order,
 * and sent in runs. */
static void publish_events(kvt_cluster *cl, cl_event *ev, uint32_t n, cl_batch *b)
{
    uint32_t k = 0;
    for (uint32_t i = 0; i < n; i++) {
        const kvt_srv_shard *sh = kvt__srv_shard_by_fp(cl->srv, ev[i].space);
        uint64_t bb = sh ? sh->shm.block_bytes : 0;
        uint8_t was = 0;
        if (ev[i].stored && !held_put(&cl->held, ev[i].space, ev[i].h, ev[i].tiers, bb, &was))
            STAT_ADD(cl, queue_dropped, 1);
        if (!ev[i].stored) held_del(&cl->held, ev[i].space, ev[i].h, bb);
        if (ev[i].stored && was && dir_tier(was) == dir_tier(ev[i].tiers)) continue;
        ev[k++] = ev[i];
    }
    n = k;
    uint32_t i = 0;
    bool ok = atomic_load(&cl->dir) != NULL;
    while (i < n) {
        uint32_t j = i + 1;
        while (j < n && j - i < CL_BATCH && ev[j].stored == ev[i].stored && ev[j].space == ev[i].space)
            j++;
        ok = publish_run(cl, ev + i, j - i, b) && ok;
        i = j;
    }
    /* a run the directory missed is written with everything else when it
     * is back (try_open, keep_up): until then all held blocks are owed */
    if (!ok || atomic_load(&cl->owed)) atomic_store(&cl->owed, cl->held.n);
}

/* Every held block again (after the directory came back, or to renew the
 * entries' expiry), in batches per space; false when a batch failed. */
static bool publish_all(kvt_cluster *cl, cl_batch *b, bool renew)
{
    const cl_held *t = &cl->held;
    kvt_hash128 *h = b->h;
    uint8_t *tier = b->tier;
    for (uint32_t i = 0; i < t->cap;) {
        uint32_t n = 0;
        uint64_t space = 0;
        for (; i < t->cap && n < CL_BATCH; i++) {
            if (!t->v[i].stored) continue;
            if (n && t->v[i].space != space) break;
            space = t->v[i].space;
            tier[n] = dir_tier(t->v[i].tiers);
            h[n++] = t->v[i].h;
        }
        if (!n) continue;
        kvt_dir *d = atomic_load(&cl->dir);
        kvt_status st = !d ? KVT_ECONN : renew ? kvt__dir_renew_tiers(d, space, h, tier, n)
                                               : kvt__dir_publish_tiers(d, space, h, tier, n);
        if (st) {
            STAT_ADD(cl, dir_errors, 1);
            return false; /* down again: the next generation republishes */
        }
        STAT_ADD(cl, published, n);
    }
    return true;
}

/* Writes every held block after the directory (re)opened: owed until the
 * last batch is in. */
static void republish(kvt_cluster *cl, cl_batch *b)
{
    atomic_store(&cl->owed, cl->held.n);
    if (publish_all(cl, b, false)) atomic_store(&cl->owed, 0);
}

static uint32_t take_events(kvt_cluster *cl, cl_event *out, uint32_t max, uint64_t wait_ns)
{
    pthread_mutex_lock(&cl->qmu);
    if (cl->qlen < CL_BATCH && !atomic_load(&cl->stopping))
        kvt__cond_wait_until(&cl->qcv, &cl->qmu, kvt__now_ns() + wait_ns);
    uint32_t n = cl->qlen < max ? cl->qlen : max;
    for (uint32_t i = 0; i < n; i++) out[i] = cl->q[(cl->qhead + i) % CL_QUEUE];
    cl->qhead = (cl->qhead + n) % CL_QUEUE;
    cl->qlen -= n;
    atomic_store(&cl->inflight, n);
    pthread_mutex_unlock(&cl->qmu);
    return n;
}

/* Opens the directory a join could not (Redis away at start), at most
 * once per backoff; true once it is open (then its holdings go out). */
static bool try_open(kvt_cluster *cl, cl_batch *b)
{
    if (atomic_load(&cl->dir)) return true;
    uint64_t now = kvt__now_ns();
    if (now < cl->open_next_ns) return false;
    kvt_dir *d = NULL;
    if (kvt__dir_open(&d, &cl->dcfg)) {
        cl->open_backoff_ns = cl->open_backoff_ns ? cl->open_backoff_ns * 2 : 100000000ull;
        if (cl->open_backoff_ns > 5000000000ull) cl->open_backoff_ns = 5000000000ull;
        cl->open_next_ns = now + cl->open_backoff_ns;
        return false;
    }
    atomic_store(&cl->owed, cl->held.n); /* before the directory shows up */
    atomic_store(&cl->dir, d);
    kvt__log(KVT_LOG_INFO, "cluster: node %s joined the directory %s (epoch %llu): publishing "
             "%u blocks", cl->node, cl->cfg->cluster_redis,
             (unsigned long long)kvt__dir_epoch(d), cl->held.n);
    republish(cl, b);
    return true;
}

/* The lease every lease/3, everything again after a reconnect (Redis may
 * have lost it), every entry's expiry every 2 leases. */
static void keep_up(kvt_cluster *cl, cl_batch *b, uint64_t *gen, uint64_t *next_lease,
                    uint64_t *next_renew)
{
    kvt_dir *d = atomic_load(&cl->dir);
    uint64_t lease_ns = (uint64_t)cl->cfg->cluster_lease_ms * 1000000ull, now = kvt__now_ns();
    if (now >= *next_lease) {
        kvt_dir_holding held = {cl->held.n, cl->held.bytes, cl->held.cpu_n, cl->held.ssd_n, true};
        if (kvt__dir_renew(d, 0, NULL, 0) || kvt__dir_set_holding(d, &held)) /* cluster status */
            STAT_ADD(cl, dir_errors, 1);
        *next_lease = now + lease_ns / 3;
    }
    uint64_t g = kvt__dir_generation(d);
    if (g != *gen && kvt__dir_up(d)) {
        kvt__log(KVT_LOG_INFO, "cluster: directory back: republishing %u blocks", cl->held.n);
        *gen = g;
        if (kvt__dir_renew(d, 0, NULL, 0)) STAT_ADD(cl, dir_errors, 1); /* the lease first */
        republish(cl, b);
    } else if (now >= *next_renew) {
        if (publish_all(cl, b, true)) atomic_store(&cl->owed, 0); /* renewing writes them too */
        *next_renew = now + 2 * lease_ns;
    }
}

static void *publish_main(void *arg)
{
    kvt_cluster *cl = arg;
    cl_event *ev = malloc(CL_QUEUE * sizeof *ev);
    cl_batch *b = malloc(sizeof *b);
    uint64_t lease_ns = (uint64_t)cl->cfg->cluster_lease_ms * 1000000ull;
    kvt_dir *d0 = atomic_load(&cl->dir);
    uint64_t gen = d0 ? kvt__dir_generation(d0) : 0, next_lease = 0;
    uint64_t next_renew = kvt__now_ns() + 2 * lease_ns;
    while (ev && b) {
        bool stop = atomic_load(&cl->stopping);
        uint32_t n = take_events(cl, ev, CL_QUEUE, stop ? 0 : CL_PUBLISH_MS * 1000000ull);
        bool was_open = atomic_load(&cl->dir) != NULL;
        if (n) publish_events(cl, ev, n, b);
        atomic_store(&cl->inflight, 0);
        if (!stop && try_open(cl, b)) {
            if (!was_open) gen = kvt__dir_generation(atomic_load(&cl->dir));
            keep_up(cl, b, &gen, &next_lease, &next_renew);
        }
        if (stop && !n) break;
    }
    if (!ev || !b) kvt__log(KVT_LOG_ERROR, "cluster: out of memory: this node publishes nothing");
    free(ev);
    free(b);
    return NULL;
}

/* ---------------------------------------------------------------- */
/* Serving pulls                                                    */
/* ---------------------------------------------------------------- */

static kvt_status send_answer(kvt_stream *s, int32_t status, uint32_t n, uint64_t block_bytes,
                              uint64_t dl)
{
    uint8_t hdr[KVT_PULL_REP_HDR];
    kvt__pull_answer_encode(hdr, &(kvt_pull_answer){status, n, block_bytes});
    return kvt__stream_send(s, hdr, sizeof hdr, dl);
}

/* cluster_serve_mib_s over every pull served: each block reserves its
 * send time on one clock (a leaky bucket without burst) and waits for
 * it; KVT_ETIMEDOUT when that is past the pull's deadline (the puller
 * misses, which it would anyway). */
static kvt_status pace(kvt_cluster *cl, uint64_t bytes, uint64_t dl)
{
    uint64_t rate = (uint64_t)cl->cfg->cluster_serve_mib_s << 20;
    if (!rate) return KVT_OK;
    pthread_mutex_lock(&cl->pace_mu);
    uint64_t now = kvt__now_ns();
    uint64_t start = cl->pace_next_ns > now ? cl->pace_next_ns : now;
    bool late = start > dl;
    if (!late) cl->pace_next_ns = start + (uint64_t)((double)bytes * 1e9 / (double)rate);
    pthread_mutex_unlock(&cl->pace_mu);
    if (late) {
        kvt_status st = kvt__fail(KVT_ETIMEDOUT, "cluster: cluster_serve_mib_s (%u) leaves no "
                                  "room for a pull before its deadline (cluster_pull_ms %u): "
                                  "the peer recomputes", cl->cfg->cluster_serve_mib_s,
                                  cl->cfg->cluster_pull_ms);
        kvt__log(KVT_LOG_WARN, "%s", kvt_last_error());
        return st;
    }
    if (start > now) {
        struct timespec ts = kvt__ns_to_timespec(start - now);
        nanosleep(&ts, NULL);
    }
    return KVT_OK;
}

/* The n blocks at offsets (of the shard's memfd), keys their index keys,
 * then their sums: of the layer checksums each block was stored with
 * (server/sums.c; a block the tier refilled from the SSD or a peer is
 * hashed once here, as at its first load), never of the bytes as sent,
 * so a block that changed in this tier fails at the puller. */
static kvt_status send_blocks(kvt_cluster *cl, kvt_stream *s, kvt_srv_shard *sh,
                              const uint64_t *offsets, const kvt_hash128 *keys,
                              const uint32_t *ids, uint32_t first, uint32_t n, uint64_t dl)
{
    uint64_t bb = sh->shm.block_bytes;
    uint32_t nl = sh->geo->num_layers;
    uint64_t *sums = malloc((size_t)n * (1 + nl) * sizeof *sums), *ls = sums ? sums + n : NULL;
    if (!sums) return kvt__fail(KVT_ENOMEM, "cluster: out of memory serving a pull");
    kvt__srv_sums_get(&sh->sums, sh->shm.base, sh->geo, sh->block_tokens, offsets, ids, keys, n, ls);
    for (uint32_t i = 0; i < n; i++) sums[i] = kvt__pull_sum(ls + (size_t)i * nl, nl, first + i);
    kvt_status st = send_answer(s, KVT_OK, n, bb, dl);
    for (uint32_t i = 0; i < n && !st; i++) {
        st = pace(cl, bb, dl);
        if (!st) st = kvt__stream_send(s, sh->shm.base + offsets[i], (size_t)bb, dl);
    }
    if (!st) st = kvt__stream_send(s, sums, (size_t)n * sizeof *sums, dl);
    free(sums);
    return st;
}

static kvt_request to_request(const kvt_srv_req *q)
{
    kvt_request r = {.ns = q->ns, .ns_len = q->ns_len};
    if (q->form) {
        r.keys = q->keys;
        r.num_keys = q->count;
        r.flags = q->form == 2 ? KVT_REQ_INDEPENDENT_KEYS : 0;
    } else {
        r.tokens = q->tokens;
        r.num_tokens = q->count;
    }
    return r;
}

/* Blocks [first, first + n) of a FETCH or REPORT's request that this node
 * holds, pinned by a load task with their offsets, keys and entries. */
typedef struct cl_pinned {
    kvt_srv_shard *sh;
    kvt_task_id task; /* 0: nothing pinned */
    kvt_ext_blocks b; /* indexed from the request's first block */
    uint32_t n;
} cl_pinned;

/* KVT_OK with p->n 0 when none of the asked blocks is held; another
 * status is the ANSWER's. */
static kvt_status pin_asked(kvt_cluster *cl, const kvt_pull_fetch *f, const kvt_srv_req *q,
                            uint64_t dl, cl_pinned *p)
{
    *p = (cl_pinned){.sh = kvt__srv_shard_by_fp(cl->srv, f->space)};
    if (!p->sh) return KVT_ENOTFOUND;
    kvt_srv_shard *sh = p->sh;
    kvt_request req = to_request(q);
    kvt_match m;
    kvt_status st = kvt__cache_lookup_for_peer(sh->cache, &req, &m);
    if (st) return st;
    uint32_t nb = m.matched_tokens / sh->block_tokens;
    if (nb <= f->first) {
        if (m.task) kvt__cache_ext_abort(sh->cache, m.task, dl);
        return KVT_OK;
    }
    kvt_ext_launch lo = {0};
    st = kvt__ext_blocks_alloc(&p->b, nb, 0, "cluster: serving a pull");
    if (!st) st = kvt__cache_ext_launch(sh->cache, m.task, dl, p->b.offsets, nb, &lo);
    if (!st && !lo.reading) st = kvt__cache_ext_keys(sh->cache, m.task, p->b.keys, p->b.ids, nb);
    if (st || lo.reading) {
        kvt__cache_ext_abort(sh->cache, m.task, dl); /* a task already gone: nothing */
        free(p->b.offsets);
        p->b.offsets = NULL;
        return st ? st : KVT_ETIMEDOUT;
    }
    uint32_t have = lo.num_blocks > f->first ? lo.num_blocks - f->first : 0;
    p->n = have < f->count ? have : f->count;
    p->task = m.task;
    return KVT_OK;
}

static void unpin(cl_pinned *p)
{
    kvt_task_result r;
    if (p->task) kvt__cache_ext_end(p->sh->cache, p->task, KVT_OK, &r);
    p->task = 0;
    free(p->b.offsets);
    p->b.offsets = NULL;
}

/* Blocks [f->first, +count) of the request, as far as this node holds
 * them, pinned while they are sent. */
static kvt_status serve_fetch(kvt_cluster *cl, kvt_stream *s, const kvt_pull_fetch *f,
                              const kvt_srv_req *q)
{
    uint64_t dl = kvt__deadline_ns(cl->cfg->cluster_pull_ms);
    cl_pinned p;
    kvt_status st = pin_asked(cl, f, q, dl, &p);
    if (st) return send_answer(s, st, 0, 0, dl);
    uint32_t f0 = f->first, n = p.n;
    st = n ? send_blocks(cl, s, p.sh, p.b.offsets + f0, p.b.keys + f0, p.b.ids + f0, f0, n, dl)
           : send_answer(s, KVT_OK, 0, p.sh->shm.block_bytes, dl);
    unpin(&p);
    if (!st && n) {
        STAT_ADD(cl, served, 1);
        STAT_ADD(cl, served_blocks, n);
    }
    return st;
}

/* A peer's REPORT that blocks [f->first, +count) it pulled from here
 * failed their checksums: those still held are hashed again against their
 * records, and the ones that differ dropped (docs/server.md, Integrity),
 * so no peer pulls them again. The peer's word alone drops nothing. */
static kvt_status serve_report(kvt_cluster *cl, kvt_stream *s, const kvt_pull_fetch *f,
                               const kvt_srv_req *q)
{
    uint64_t dl = kvt__deadline_ns(cl->cfg->cluster_pull_ms);
    cl_pinned p;
    kvt_status st = pin_asked(cl, f, q, dl, &p);
    if (st) return send_answer(s, st, 0, 0, dl);
    uint32_t f0 = f->first, nbad = 0;
    kvt_hash128 *bad = p.n ? malloc(p.n * sizeof *bad) : NULL;
    if (bad)
        nbad = kvt__srv_sums_check(&p.sh->sums, p.sh->shm.base, p.sh->geo, p.sh->block_tokens,
                                   p.b.offsets + f0, p.b.ids + f0, p.b.keys + f0, p.n, bad);
    unpin(&p); /* a pinned block could not be dropped */
    if (nbad) kvt__srv_drop_corrupt(p.sh, bad, nbad, "a cluster peer's pull");
    free(bad);
    return send_answer(s, KVT_OK, nbad, p.sh->shm.block_bytes, dl);
}

/* After a link moved onto UCX, the puller sends this many bytes and the
 * peer echoes them: UCX wires up its endpoints and the lanes of its large-
 * message (rendezvous) protocol at their first messages (ms to tens of ms
 * over its tcp transport), which would otherwise land in the first pull's
 * time and make the bandwidth estimate skip pulls for a second. Larger
 * than any eager threshold, so the rendezvous lanes are up too. */
#define CL_UCX_PING (256u << 10)

/* A peer's UCX request (pull.h): yes when this node pulls over UCX too
 * (it holds UCX's context), then the link moves (this side the server's);
 * else no, and the link stays on TCP. */
static kvt_status serve_ucx(kvt_cluster *cl, kvt_stream **sp)
{
    uint64_t dl = kvt__deadline_ns(cl->cfg->cluster_pull_ms);
    bool yes = cl->ucx && !strcmp((*sp)->ops->name, "tcp");
    kvt_status st = send_answer(*sp, yes ? KVT_OK : KVT_EUNSUPPORTED, 0, 0, dl);
    if (!st && yes) st = kvt__stream_ucx_upgrade(sp, 1, dl);
    uint8_t *ping = !st && yes ? malloc(CL_UCX_PING) : NULL;
    if (!st && yes && !ping) st = kvt__fail(KVT_ENOMEM, "cluster: no memory for a UCX link");
    if (!st && yes) st = kvt__stream_recv(*sp, ping, CL_UCX_PING, dl);
    if (!st && yes) st = kvt__stream_send(*sp, ping, CL_UCX_PING, dl);
    free(ping);
    return st;
}

/* One FETCH, REPORT or UCX request: KVT_OK to go on with the connection. */
static kvt_status serve_one(kvt_cluster *cl, kvt_stream **sp)
{
    kvt_stream *s = *sp;
    uint8_t hdr[KVT_PULL_REQ_HDR];
    kvt_status st = kvt__stream_recv(s, hdr, sizeof hdr, kvt__deadline_ns(CL_IDLE_MS));
    if (st) return st;
    kvt_pull_fetch f;
    if ((st = kvt__pull_fetch_decode(hdr, "a cluster peer", &f))) return st;
    if (f.op == KVT_PULL_UCX) return serve_ucx(cl, sp);
    uint8_t *body = malloc(f.req_len);
    if (!body) return kvt__fail(KVT_ENOMEM, "cluster: no memory for a %u-byte request", f.req_len);
    st = kvt__stream_recv(s, body, f.req_len, kvt__deadline_ns(cl->cfg->cluster_pull_ms));
    kvt_srv_req q = {0};
    if (!st) st = kvt__srv_req_decode(body, f.req_len, &q);
    if (!st) st = f.op == KVT_PULL_REPORT ? serve_report(cl, s, &f, &q) : serve_fetch(cl, s, &f, &q);
    free(q.tokens);
    free(q.keys);
    free(body);
    return st;
}

static void *serve_main(void *arg)
{
    cl_served *sv = arg;
    kvt_cluster *cl = sv->cl;
    kvt_stream_auth a = {.secret = cl->secret, .secret_len = cl->secret_len,
                         .who = "cluster peer", .realm = &kvt__auth_cluster};
    kvt_status st = kvt__stream_auth_server(sv->s->fd, &a, kvt__deadline_ns(CL_AUTH_MS));
    if (st) {
        STAT_ADD(cl, refused, 1);
        kvt__log(KVT_LOG_WARN, "cluster: a peer was refused: %s", kvt_last_error());
    }
    while (!st && !atomic_load(&cl->stopping)) st = serve_one(cl, &sv->s);
    if (st && st != KVT_ECONN && st != KVT_ETIMEDOUT && !atomic_load(&cl->stopping))
        kvt__log(KVT_LOG_WARN, "cluster: dropped a peer: %s", kvt_last_error());
    atomic_store(&sv->done, true);
    return NULL;
}

/* Joins served threads that ended (all: at leave, after their sockets
 * were shut). Under cl->mu. */
static void reap_served(kvt_cluster *cl, bool all)
{
    for (cl_served **pp = &cl->served; *pp;) {
        cl_served *sv = *pp;
        if (!all && !atomic_load(&sv->done)) {
            pp = &sv->next;
            continue;
        }
        pthread_join(sv->thread, NULL);
        kvt__stream_destroy(sv->s);
        *pp = sv->next;
        cl->nserved--;
        free(sv);
    }
}

static void accept_one(kvt_cluster *cl, kvt_stream *s)
{
    pthread_mutex_lock(&cl->mu);
    reap_served(cl, false);
    cl_served *sv = NULL;
    if (cl->nserved < cl->cfg->cluster_serve_max && (sv = calloc(1, sizeof *sv))) {
        *sv = (cl_served){.s = s, .fd = s->fd, .cl = cl};
        if (pthread_create(&sv->thread, NULL, serve_main, sv)) {
            free(sv);
            sv = NULL;
        } else {
            sv->next = cl->served;
            cl->served = sv;
            cl->nserved++;
        }
    }
    pthread_mutex_unlock(&cl->mu);
    if (!sv) {
        /* cluster_serve_max: the peer recomputes. Logged at the 1st, 2nd,
         * 4th, ... refusal: a peer that keeps dialling cannot flood the log */
        uint64_t k = STAT_ADD(cl, refused, 1) + 1;
        if (!(k & (k - 1)))
            kvt__log(KVT_LOG_WARN, "cluster: a peer's connection was refused: %u pulls are being "
                     "served (cluster_serve_max; %llu refused so far)", cl->cfg->cluster_serve_max,
                     (unsigned long long)k);
        kvt__stream_destroy(s);
    }
}

static void *accept_main(void *arg)
{
    kvt_cluster *cl = arg;
    while (!atomic_load(&cl->stopping)) {
        struct pollfd p[2] = {{cl->listen_fd, POLLIN, 0}, {cl->stop_pipe[0], POLLIN, 0}};
        if (poll(p, 2, 1000) < 0 && errno != EINTR) break;
        if (p[1].revents) break;
        kvt_stream *s;
        if (p[0].revents && kvt__stream_accept(cl->listen_fd, kvt__now_ns(), &s) == KVT_OK)
            accept_one(cl, s);
    }
    return NULL;
}

/* ---------------------------------------------------------------- */
/* Pulling                                                          */
/* ---------------------------------------------------------------- */

/* The peer record of addr (made when new; the oldest reused past
 * CL_PEERS). Under cl->mu. */
static cl_peer *peer_of(kvt_cluster *cl, const char *addr)
{
    for (uint32_t i = 0; i < cl->npeers; i++)
        if (!strcmp(cl->peers[i].addr, addr)) return &cl->peers[i];
    uint32_t i = cl->npeers < CL_PEERS ? cl->npeers++ : (uint32_t)(kvt__now_ns() % CL_PEERS);
    cl_peer *p = &cl->peers[i];
    while (p->idle) {
        cl_link *l = p->idle;
        p->idle = l->next;
        kvt__stream_destroy(l->s);
        free(l);
    }
    *p = (cl_peer){0};
    snprintf(p->addr, sizeof p->addr, "%s", addr);
    return p;
}

static bool split_addr(const char *addr, char *host, size_t hlen, uint16_t *port)
{
    const char *c = strrchr(addr, ':');
    if (!c || (size_t)(c - addr) >= hlen || c == addr) return false;
    char *end;
    unsigned long v = strtoul(c + 1, &end, 10);
    if (*end || end == c + 1 || v == 0 || v > 65535) return false;
    memcpy(host, addr, (size_t)(c - addr));
    host[c - addr] = 0;
    *port = (uint16_t)v;
    return true;
}

/* A stream call's failure (the stream sets no message) named for the log:
 * which peer, doing what. */
static kvt_status link_fail(kvt_status st, const char *addr, const char *doing)
{
    if (st == KVT_ETIMEDOUT)
        return kvt__fail(st, "cluster: %s did not answer by cluster_pull_ms %s", addr, doing);
    if (st == KVT_ECONN) return kvt__fail(st, "cluster: %s closed the connection %s", addr, doing);
    return st;
}

/* Asks the peer at addr to move new link *s onto UCX (pull.h): KVT_OK on
 * UCX, or on TCP when the peer said no (logged once per peer). */
static kvt_status link_to_ucx(kvt_cluster *cl, kvt_stream **s, const char *addr, uint64_t dl)
{
    uint8_t hdr[KVT_PULL_REQ_HDR], rep[KVT_PULL_REP_HDR];
    kvt__pull_fetch_encode(hdr, &(kvt_pull_fetch){.op = KVT_PULL_UCX});
    kvt_pull_answer a = {0};
    kvt_status st = link_fail(kvt__stream_send(*s, hdr, sizeof hdr, dl), addr, "asked for UCX");
    if (!st) st = link_fail(kvt__stream_recv(*s, rep, sizeof rep, dl), addr, "asked for UCX");
    if (!st) st = kvt__pull_answer_decode(rep, 0, 0, addr, &a);
    if (st) return st;
    if (a.status == KVT_EUNSUPPORTED) {
        pthread_mutex_lock(&cl->mu);
        cl_peer *p = peer_of(cl, addr);
        bool say = !p->said_tcp_only;
        p->said_tcp_only = true;
        pthread_mutex_unlock(&cl->mu);
        if (say)
            kvt__log(KVT_LOG_WARN, "cluster: peer %s does not serve over UCX (its "
                     "cluster_transport is tcp, or UCX cannot start there): pulling from it "
                     "over TCP", addr);
        return KVT_OK;
    }
    if (a.status)
        return kvt__fail(KVT_EPROTO, "cluster: %s answered a UCX request with %s", addr,
                         kvt_status_name((kvt_status)a.status));
    st = kvt__stream_ucx_upgrade(s, 0, dl);
    uint8_t *ping = st ? NULL : malloc(2 * (size_t)CL_UCX_PING), *echo = ping ? ping + CL_UCX_PING : NULL;
    if (!st && !ping) st = kvt__fail(KVT_ENOMEM, "cluster: no memory for a UCX link");
    for (uint32_t i = 0; !st && i < CL_UCX_PING; i++) ping[i] = (uint8_t)(i * 131 + 7);
    if (!st) st = link_fail(kvt__stream_send(*s, ping, CL_UCX_PING, dl), addr, "on UCX");
    if (!st) st = link_fail(kvt__stream_recv(*s, echo, CL_UCX_PING, dl), addr, "on UCX");
    if (!st && memcmp(ping, echo, CL_UCX_PING))
        st = kvt__fail(KVT_EPROTO, "cluster: %s echoed other bytes on UCX", addr);
    free(ping);
    if (!st) kvt__log(KVT_LOG_INFO, "cluster: a link to %s moved onto UCX", addr);
    return st;
}

/* An idle link to addr, or a new one (on UCX when this node pulls so);
 * NULL when the peer is marked down or cannot be reached (then marked down
 * for a quarter lease). */
static kvt_stream *link_take(kvt_cluster *cl, const char *addr, uint64_t dl)
{
    pthread_mutex_lock(&cl->mu);
    cl_peer *p = peer_of(cl, addr);
    kvt_stream *s = NULL;
    bool down = p->down_until_ns > kvt__now_ns();
    if (!down && p->idle) {
        cl_link *l = p->idle;
        p->idle = l->next;
        p->nidle--;
        s = l->s;
        free(l);
    }
    pthread_mutex_unlock(&cl->mu);
    if (s || down) return s;
    char host[KVT_DIR_ADDR_MAX];
    uint16_t port;
    if (!split_addr(addr, host, sizeof host, &port)) return NULL;
    kvt_stream_auth a = {.secret = cl->secret, .secret_len = cl->secret_len,
                         .who = "cluster puller", .realm = &kvt__auth_cluster};
    uint64_t cdl = kvt__deadline_ns(CL_CONNECT_MS);
    kvt_status st = kvt__stream_connect(host, port, &a, cdl < dl ? cdl : dl, &s);
    if (!st && cl->ucx && (st = link_to_ucx(cl, &s, addr, dl))) {
        kvt__stream_destroy(s); /* still TCP, and out of step */
        s = NULL;
    }
    if (st) {
        kvt__log(KVT_LOG_WARN, "cluster: peer %s unreachable, skipped for %u ms: %s", addr,
                 cl->cfg->cluster_lease_ms / 4, kvt_last_error());
        pthread_mutex_lock(&cl->mu);
        peer_of(cl, addr)->down_until_ns = kvt__deadline_ns(cl->cfg->cluster_lease_ms / 4);
        pthread_mutex_unlock(&cl->mu);
        return NULL;
    }
    return s;
}

static void link_put(kvt_cluster *cl, const char *addr, kvt_stream *s)
{
    cl_link *l = malloc(sizeof *l);
    pthread_mutex_lock(&cl->mu);
    cl_peer *p = peer_of(cl, addr);
    if (l && p->nidle < CL_IDLE_LINKS) {
        *l = (cl_link){s, p->idle};
        p->idle = l;
        p->nidle++;
        s = NULL;
        l = NULL;
    }
    pthread_mutex_unlock(&cl->mu);
    free(l);
    if (s) kvt__stream_destroy(s);
}

/* req cut to its first nb blocks; with one more token for a token
 * request the peer is to look up (its lookup leaves the last token). */
static kvt_request cut_request(const kvt_request *req, uint32_t nb, uint32_t bt, bool extra)
{
    kvt_request r = *req;
    if (r.keys) {
        r.num_keys = nb;
    } else {
        uint32_t t = nb * bt + (extra ? 1 : 0);
        r.num_tokens = t < r.num_tokens ? t : r.num_tokens;
    }
    return r;
}

static kvt_status send_fetch(kvt_stream *s, uint16_t op, const kvt_request *req, uint64_t space,
                             uint32_t first, uint32_t count, uint64_t dl)
{
    kvt_srv_buf b = {0};
    kvt_status st = kvt__srv_req_encode(&b, req);
    if (!st && b.len > KVT_PULL_MAX_REQ)
        st = kvt__fail(KVT_EINVAL, "cluster: a request of %zu bytes is too large to pull", b.len);
    if (!st) {
        uint8_t hdr[KVT_PULL_REQ_HDR];
        kvt__pull_fetch_encode(hdr, &(kvt_pull_fetch){op, space, first, count, (uint32_t)b.len});
        struct iovec iov[2] = {{hdr, sizeof hdr}, {b.p, b.len}};
        st = s->ops->sendv(s, iov, 2, dl);
    }
    kvt__srv_buf_free(&b);
    return st;
}

/* Hashes each layer of a receive's blocks once it landed whole
 * (recvv_landed's callback, every read of at most 1 MiB: the layer's
 * bytes are still in this core's cache), in order. */
typedef struct landing {
    const kvt_srv_shard *sh;
    const uint8_t *const *block; /* this receive's blocks */
    uint64_t bytes;              /* each block's */
    uint32_t n, done, first;     /* blocks, hashed so far, the first's number */
    uint32_t layer;              /* the next layer to hash in block done */
    uint64_t *sums;              /* out: one per block */
    uint64_t *layer_sums;        /* out: num_layers per block */
} landing;

static void on_landed(void *arg, size_t got)
{
    landing *l = arg;
    const kvt_geometry *g = l->sh->geo;
    uint32_t nl = g->num_layers, bt = l->sh->block_tokens;
    while (l->done < l->n) {
        uint64_t *ls = l->layer_sums + (size_t)l->done * nl, at = (uint64_t)l->done * l->bytes;
        for (; l->layer < nl && got >= at + kvt__srv_layer_end(g, bt, l->layer); l->layer++)
            ls[l->layer] = kvt__srv_layer_sum(l->block[l->done], g, bt, l->layer);
        if (l->layer < nl || got < at + l->bytes) return;
        l->sums[l->done] = kvt__pull_sum(ls, nl, l->first + l->done);
        l->done++;
        l->layer = 0;
    }
}

/* Receives n blocks into the store task's slots (backed first: one
 * madvise per run of slots not mapped here yet, kvt__pool_populate),
 * hashing each layer as it lands (into layer_sums: n x num_layers), then
 * the peer's sums, and compares them. */
static kvt_status recv_blocks(kvt_stream *s, const kvt_srv_shard *sh, const uint64_t *off,
                              uint32_t first, uint32_t n, uint64_t dl, const char *addr,
                              uint64_t *layer_sums)
{
    uint64_t bb = sh->shm.block_bytes;
    uint32_t nl = sh->geo->num_layers;
    uint64_t *sums = malloc((size_t)n * 2 * sizeof *sums), *mine = sums ? sums + n : NULL;
    if (!sums) return kvt__fail(KVT_ENOMEM, "cluster: out of memory pulling");
    kvt_status st = KVT_OK;
    struct iovec iov[CL_IOV];
    const uint8_t *blk[CL_IOV];
    kvt__cache_ext_populate(sh->cache, off, n);
    for (uint32_t i = 0; i < n && !st; i += CL_IOV) {
        uint32_t k = n - i < CL_IOV ? n - i : CL_IOV;
        for (uint32_t j = 0; j < k; j++) {
            blk[j] = sh->shm.base + off[i + j];
            iov[j] = (struct iovec){(void *)blk[j], bb};
        }
        landing l = {sh, blk, bb, k, 0, first + i, 0, mine + i, layer_sums + (size_t)i * nl};
        st = link_fail(kvt__stream_recvv_landed(s, iov, (int)k, dl, 0, on_landed, &l), addr,
                       "sending blocks");
        if (!st && l.done != k)
            st = kvt__fail(KVT_EPROTO, "cluster: a receive from %s ended before its blocks", addr);
    }
    if (!st) st = link_fail(kvt__stream_recv(s, sums, (size_t)n * sizeof *sums, dl), addr,
                            "sending checksums");
    for (uint32_t i = 0; i < n && !st; i++)
        if (mine[i] != sums[i])
            st = kvt__fail(KVT_ECORRUPT, "cluster: block %u pulled from %s failed its checksum",
                           first + i, addr);
    free(sums);
    return st;
}

/* The answer's n blocks go into a store task planned for exactly them;
 * anything else (they are being stored here meanwhile) drops the pull. */
static kvt_status land_pull(kvt_cluster *cl, kvt_stream *s, kvt_srv_shard *sh,
                            const kvt_request *req, uint32_t first, uint32_t n, uint64_t dl,
                            const char *addr)
{
    uint32_t bt = sh->block_tokens;
    kvt_request sr = cut_request(req, first + n, bt, false);
    kvt_store_plan pl;
    kvt_status st = kvt_cache_prepare_store(sh->cache, &sr, &pl);
    if (st) return st;
    if (!pl.task || pl.first_token != first * bt || pl.num_tokens != n * bt) {
        if (pl.task) kvt__cache_ext_abort(sh->cache, pl.task, dl);
        return kvt__fail(KVT_EBUSY, "cluster: the pulled blocks are being stored here already");
    }
    /* the offsets, the blocks' keys and entries, their layer checksums */
    kvt_ext_blocks b = {0};
    kvt_ext_launch lo = {0};
    st = kvt__ext_blocks_alloc(&b, n, sh->geo->num_layers, "cluster: pulling");
    if (!st) st = kvt__cache_ext_launch(sh->cache, pl.task, dl, b.offsets, n, &lo);
    if (!st) st = kvt__cache_ext_keys(sh->cache, pl.task, b.keys, b.ids, n);
    if (st) {
        kvt__cache_ext_abort(sh->cache, pl.task, dl);
        free(b.offsets);
        return st;
    }
    st = recv_blocks(s, sh, b.offsets, first, n, dl, addr, b.extra);
    if (st == KVT_ECORRUPT) STAT_ADD(cl, pull_corrupt, 1);
    /* recorded before the commit, as a client's END does: the first load
     * here checks against what was verified */
    if (!st) kvt__srv_sums_put64(&sh->sums, b.ids, b.keys, n, b.extra);
    kvt_task_result r = {0};
    kvt_status end = kvt__cache_ext_end(sh->cache, pl.task, st ? st : KVT_OK, &r);
    free(b.offsets);
    if (!st && (end || r.status)) st = end ? end : r.status;
    return st;
}

/* Tells holder that blocks [first, first + n) of lr it sent failed their
 * checksums here (pull.h, REPORT), within one pull deadline of its own:
 * rare, and it keeps every other peer from pulling them. True when the
 * stream is still in step. */
static bool report_corrupt(kvt_cluster *cl, kvt_stream *s, const kvt_srv_shard *sh,
                           const kvt_request *lr, uint32_t first, uint32_t n,
                           const kvt_dir_holder *holder)
{
    uint64_t dl = kvt__deadline_ns(cl->cfg->cluster_pull_ms);
    uint8_t hdr[KVT_PULL_REP_HDR];
    kvt_pull_answer a = {0};
    kvt_status st = send_fetch(s, KVT_PULL_REPORT, lr, sh->fingerprint, first, n, dl);
    if (!st) st = kvt__stream_recv(s, hdr, sizeof hdr, dl);
    if (!st) st = kvt__pull_answer_decode(hdr, n, sh->shm.block_bytes, holder->addr, &a);
    if (st) {
        kvt__log(KVT_LOG_WARN, "cluster: could not tell %s (%s) that blocks it sent failed "
                 "their checksums: %s", holder->node, holder->addr,
                 st == KVT_ECONN || st == KVT_ETIMEDOUT ? kvt_status_name(st) : kvt_last_error());
        return false;
    }
    kvt__log(KVT_LOG_WARN, "cluster: told %s (%s) that blocks %u..%u it sent failed their "
             "checksums: it found %u changed in its tier and dropped them", holder->node,
             holder->addr, first, first + n - 1, a.n);
    return true;
}

/* One pull of blocks [first, first + count) of req from holder: how many
 * of them landed here (0: a miss; fewer than count: the holder had no
 * more). */
static uint32_t pull_from(kvt_cluster *cl, kvt_srv_shard *sh, const kvt_request *req,
                      const kvt_dir_holder *holder, const kvt_hash128 *h, uint32_t first,
                      uint32_t count, uint64_t dl)
{
    kvt_stream *s = link_take(cl, holder->addr, dl);
    if (!s) return 0;
    uint64_t t0 = kvt__now_ns();
    kvt_request lr = cut_request(req, first + count, sh->block_tokens, true);
    kvt_status st = link_fail(send_fetch(s, KVT_PULL_FETCH, &lr, sh->fingerprint, first, count, dl),
                              holder->addr, "taking a fetch");
    uint8_t hdr[KVT_PULL_REP_HDR];
    kvt_pull_answer a = {0};
    if (!st) st = link_fail(kvt__stream_recv(s, hdr, sizeof hdr, dl), holder->addr, "answering a fetch");
    if (!st) st = kvt__pull_answer_decode(hdr, count, sh->shm.block_bytes, holder->addr, &a);
    if (!st && a.status == KVT_OK && a.n == 0) {
        /* a stale entry: the holder lost the block */
        (void)kvt__dir_forget(atomic_load(&cl->dir), sh->fingerprint, &h[first], holder->node);
        STAT_ADD(cl, stale, 1);
        link_put(cl, holder->addr, s);
        return 0;
    }
    if (!st && a.status) {
        link_put(cl, holder->addr, s);
        return 0;
    }
    if (!st && req->tokens) /* the BlockStored of a token request's pulled blocks names them */
        kvt__events_tokens(cl->srv->events, &h[first], req->tokens + (size_t)first * sh->block_tokens,
                           a.n, sh->block_tokens);
    if (!st) st = land_pull(cl, s, sh, req, first, a.n, dl, holder->addr);
    if (st) {
        /* EBUSY: this node's own clients store the same blocks meanwhile
         * (land_pull); their store serves the next lookup */
        if (st == KVT_EBUSY)
            STAT_ADD(cl, pull_raced, 1);
        else
            STAT_ADD(cl, pull_failed, 1);
        if (st != KVT_EBUSY)
            kvt__log(KVT_LOG_WARN, "cluster: pull from %s (%s) failed, a miss: %s: %s", holder->node,
                     holder->addr, kvt_status_name(st), kvt_last_error());
        /* the whole answer was read: the holder hears which blocks failed */
        if (st == KVT_ECORRUPT && report_corrupt(cl, s, sh, &lr, first, a.n, holder))
            link_put(cl, holder->addr, s);
        else
            kvt__stream_destroy(s); /* mid-answer: the stream's position is lost */
        return 0;
    }
    link_put(cl, holder->addr, s);
    uint64_t bytes = (uint64_t)a.n * sh->shm.block_bytes, ns = kvt__now_ns() - t0 + 1;
    pthread_mutex_lock(&cl->cost_mu);
    kvt__pull_cost_add(&cl->cost, bytes, ns);
    atomic_store(&cl->bw_bps, kvt__pull_cost_bps(&cl->cost));
    pthread_mutex_unlock(&cl->cost_mu);
    atomic_store(&cl->probe_ns, kvt__now_ns()); /* measured: no probe for CL_PROBE_MS */
    STAT_ADD(cl, pulls, 1);
    STAT_ADD(cl, pulled_blocks, a.n);
    STAT_ADD(cl, pulled_bytes, bytes);
    return a.n;
}

/* Pull or recompute: a pull expected to take longer than the engine's
 * prefill of the same tokens (cluster_prefill_tps) is not started; what it
 * would take comes from the pulls made, fixed cost and per-byte cost apart
 * (pull_cost.h), so small pulls do not make large ones look slow. Until
 * a pull was measured, pulls are assumed worth it. The estimate moves only
 * with pulls made, so one slow pull (a busy peer, a loaded link) would
 * stop this node pulling for good: a pull judged not worth it is made
 * anyway once CL_PROBE_MS passed since the last measured pull, to measure
 * the link again. */
#define CL_PROBE_MS 1000
static bool worth_pulling(kvt_cluster *cl, const kvt_srv_shard *sh, uint32_t blocks)
{
    pthread_mutex_lock(&cl->cost_mu);
    uint64_t pull_ns = kvt__pull_cost_ns(&cl->cost, (uint64_t)blocks * sh->shm.block_bytes);
    pthread_mutex_unlock(&cl->cost_mu);
    if (!pull_ns) return true;
    double prefill_s = (double)blocks * sh->block_tokens / (double)cl->cfg->cluster_prefill_tps;
    if ((double)pull_ns / 1e9 < prefill_s) return true;
    uint64_t now = kvt__now_ns(), last = atomic_load(&cl->probe_ns);
    return now - last >= (uint64_t)CL_PROBE_MS * 1000000u &&
           atomic_compare_exchange_strong(&cl->probe_ns, &last, now); /* one probe at a time */
}

/* The server's fill hook: req matched `matched` tokens here; its next
 * blocks are looked up in the directory and pulled run by run, each run
 * from the peer that holds it (a prefix a random router spread over
 * several nodes), until one falls short or the deadline passes. */
static bool cl_fill(void *arg, kvt_srv_shard *sh, const kvt_request *req, uint32_t matched)
{
    kvt_cluster *cl = arg;
    uint32_t bt = sh->block_tokens;
    if (atomic_load(&cl->stopping)) return false;
    uint32_t total = req->keys ? req->num_keys : (req->num_tokens ? (req->num_tokens - 1) / bt : 0);
    uint32_t m = matched / bt;
    if (m >= total) return false;
    uint32_t want = total - m < KVT_PULL_MAX_BLOCKS ? total - m : KVT_PULL_MAX_BLOCKS;
    uint64_t dl = kvt__deadline_ns(cl->cfg->cluster_pull_ms);
    kvt_hash128 *h = malloc((size_t)(m + want) * sizeof *h);
    kvt_dir_holder *who = malloc((size_t)want * sizeof *who);
    uint32_t found = 0;
    bool ok = false;
    kvt_dir *d = atomic_load(&cl->dir);
    if (d && h && who && kvt__request_hashes(sh->cache, req, h, m + want) == m + want) {
        STAT_ADD(cl, dir_lookups, 1);
        if (kvt__dir_lookup(d, sh->fingerprint, h + m, want, who, &found))
            STAT_ADD(cl, dir_errors, 1);
    }
    for (uint32_t at = 0, end; at < found && kvt__now_ns() < dl; at = end) {
        for (end = at + 1; end < found && !strcmp(who[end].node, who[at].node);) end++;
        if (!worth_pulling(cl, sh, end - at)) {
            STAT_ADD(cl, pull_skipped, 1);
            break;
        }
        uint32_t got = pull_from(cl, sh, req, &who[at], h, m + at, end - at, dl);
        ok = ok || got > 0;
        if (got < end - at) break; /* the blocks after a gap are no use to the engine */
    }
    free(h);
    free(who);
    return ok;
}

/* The server's /metrics gets these (docs/metrics.md, "Cluster"). */
static void cl_metrics(void *arg, kvt_mbuf *b)
{
    kvt_cluster_counters c;
    (void)kvt_cluster_stats(arg, &c);
    static const struct {
        const char *name, *type, *help;
        size_t off;
    } rows[] = {
#define ROW(n, t, h, f) {"kvtier_cluster_" n, t, h, offsetof(kvt_cluster_counters, f)}
        ROW("pulls_total", "counter", "Pulls from peers that stored blocks here.", pulls),
        ROW("pulled_blocks_total", "counter", "Blocks pulled from peers.", pulled_blocks),
        ROW("pulled_bytes_total", "counter", "Bytes pulled from peers.", pulled_bytes),
        ROW("pull_failures_total", "counter", "Pulls that failed (each a miss).", pull_failed),
        ROW("pull_corrupt_total", "counter", "Pulls whose blocks failed their checksum.", pull_corrupt),
        ROW("pulls_skipped_total", "counter", "Pulls not started: recomputing was faster.", pull_skipped),
        ROW("pulls_raced_total", "counter", "Pulls dropped: this node was storing the blocks.", pull_raced),
        ROW("stale_entries_total", "counter", "Directory entries whose holder lacked the block.", stale),
        ROW("served_pulls_total", "counter", "Pulls this node answered for peers.", served),
        ROW("served_blocks_total", "counter", "Blocks this node sent to peers.", served_blocks),
        ROW("refused_peers_total", "counter", "Peers refused (no secret, or cluster_serve_max busy).", refused),
        ROW("directory_lookups_total", "counter", "Directory lookups of a request's next blocks.", dir_lookups),
        ROW("directory_errors_total", "counter", "Directory calls that failed.", dir_errors),
        ROW("directory_redirects_total", "counter", "MOVED/ASK answers the directory followed.", dir_redirects),
        ROW("published_blocks_total", "counter", "Block entries written to the directory.", published),
        ROW("unpublished_blocks_total", "counter", "Block entries removed from the directory.", unpublished),
        ROW("publish_dropped_total", "counter", "Index changes not published (queue full).", queue_dropped),
        ROW("publish_backlog", "gauge", "Index changes not yet written to the directory.", publish_backlog),
        ROW("epoch", "gauge", "This node's epoch in the directory.", epoch),
        ROW("directory_up", "gauge", "1 while the directory answers.", directory_up),
        ROW("pull_bytes_per_second", "gauge", "Measured pull bandwidth, net of the fixed cost per pull.", pull_bytes_per_s),
#undef ROW
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        kvt__metrics_family(b, rows[i].name, rows[i].type, rows[i].help);
        kvt__metrics_u64(b, rows[i].name, NULL, *(const uint64_t *)((const char *)&c + rows[i].off));
    }
}

/* ---------------------------------------------------------------- */
/* Join and leave                                                   */
/* ---------------------------------------------------------------- */

static kvt_status open_listener(kvt_cluster *cl)
{
    const kvt_config_values *v = cl->cfg;
    char host[KVT_DIR_ADDR_MAX];
    uint16_t port = 0;
    const char *colon = strrchr(v->cluster_listen, ':');
    bool any_port = colon && !strcmp(colon + 1, "0");
    if (any_port && (size_t)(colon - v->cluster_listen) < sizeof host && colon != v->cluster_listen) {
        memcpy(host, v->cluster_listen, (size_t)(colon - v->cluster_listen));
        host[colon - v->cluster_listen] = 0;
    } else if (!split_addr(v->cluster_listen, host, sizeof host, &port)) {
        return kvt__fail(KVT_EINVAL, "kvt_cluster_join: cluster_listen \"%s\" is not "
                         "IPV4-HOST:PORT", v->cluster_listen);
    }
    if (!kvt__host_is_loopback(host) && !cl->secret)
        return kvt__fail(KVT_EINVAL, "kvt_cluster_join: cluster_listen %s is not a loopback "
                         "address and cluster_secret_file is not set: anyone who reaches it "
                         "could read every block this node holds; give every node the same "
                         "cluster_secret_file", v->cluster_listen);
    kvt_status st = kvt__stream_listen(host, port, &cl->listen_fd, &cl->port);
    if (st) return st;
    if (strlen(v->cluster_advertise) >= sizeof cl->advertise) {
        return kvt__fail(KVT_EINVAL, "kvt_cluster_join: cluster_advertise is longer than %zu "
                         "bytes", sizeof cl->advertise - 1);
    } else if (v->cluster_advertise[0]) {
        memcpy(cl->advertise, v->cluster_advertise, strlen(v->cluster_advertise) + 1);
    } else if (!strcmp(host, "0.0.0.0")) {
        return kvt__fail(KVT_EINVAL, "kvt_cluster_join: cluster_listen %s binds every address: "
                         "set cluster_advertise to the host:port peers reach", v->cluster_listen);
    } else {
        int n = snprintf(cl->advertise, sizeof cl->advertise, "%.50s:%u", host, cl->port);
        (void)n;
    }
    return KVT_OK;
}

static kvt_status open_dir(kvt_cluster *cl)
{
    const kvt_config_values *v = cl->cfg;
    if (v->cluster_node[0]) {
        snprintf(cl->node, sizeof cl->node, "%s", v->cluster_node);
    } else if (gethostname(cl->node, sizeof cl->node - 1)) {
        return kvt__fail(KVT_ESYS, "kvt_cluster_join: cluster_node is empty and the host name "
                         "cannot be read: %s", strerror(errno));
    }
    uint32_t t = v->cluster_pull_ms / 2 < 1000 ? v->cluster_pull_ms / 2 : 1000;
    if (v->cluster_redis_password_file[0]) {
        kvt_status st = kvt__dir_password_load(v->cluster_redis_password_file, "kvt_cluster_join: "
                                               "cluster_redis_password_file", cl->redis_password);
        if (st) return st;
    }
    if (v->cluster_sentinel_password_file[0]) {
        kvt_status st = kvt__dir_password_load(v->cluster_sentinel_password_file, "kvt_cluster_join: "
                                               "cluster_sentinel_password_file", cl->sentinel_password);
        if (st) return st;
    }
    cl->dcfg = (kvt_dir_config){.redis = v->cluster_redis, .password = cl->redis_password,
                                .user = v->cluster_redis_user,
                                .sentinel_password = cl->sentinel_password, .node = cl->node,
                                .advertise = cl->advertise, .lease_ms = v->cluster_lease_ms,
                                .timeout_ms = t ? t : 1};
    kvt_dir *d = NULL;
    kvt_status st = kvt__dir_open(&d, &cl->dcfg);
    if (st == KVT_ECONN || st == KVT_ETIMEDOUT) {
        /* Redis away is a fault the node rides out, at start as later: it
         * serves its own tiers and joins when Redis answers */
        kvt__log(KVT_LOG_WARN, "cluster: the directory is not reachable (%s): node %s serves "
                 "its local tiers and joins when it answers", kvt_last_error(), cl->node);
        cl->open_backoff_ns = 100000000ull;
        cl->open_next_ns = kvt__now_ns() + cl->open_backoff_ns;
        return KVT_OK;
    }
    if (!st) atomic_store(&cl->dir, d);
    return st;
}

/* cluster_transport ucx: UCX's context made now (seconds under a
 * sanitizer), not inside a link's deadline. UCX unable to start is not a
 * failed join: pulls go over TCP, said once. */
#define CL_TRANSPORT_UCX 1 /* config.c TRANSPORT_NAMES */
static void start_ucx(kvt_cluster *cl)
{
    if (cl->cfg->cluster_transport != CL_TRANSPORT_UCX) return;
    if (kvt__stream_ucx_hold() == KVT_OK) {
        cl->ucx = true;
        return;
    }
    kvt__log(KVT_LOG_WARN, "cluster: cluster_transport is ucx, but UCX cannot start (%s): this "
             "node pulls and serves over TCP", kvt_last_error());
}

static kvt_status start_threads(kvt_cluster *cl)
{
    if (pipe(cl->stop_pipe))
        return kvt__fail(KVT_ESYS, "kvt_cluster_join: pipe: %s", strerror(errno));
    if (pthread_create(&cl->publish_thread, NULL, publish_main, cl))
        return kvt__fail(KVT_ESYS, "kvt_cluster_join: cannot start a thread");
    cl->publish_started = true;
    if (pthread_create(&cl->accept_thread, NULL, accept_main, cl))
        return kvt__fail(KVT_ESYS, "kvt_cluster_join: cannot start a thread");
    cl->accept_started = true;
    return KVT_OK;
}

static void cl_server_gone(void *arg);

kvt_status kvt_cluster_join(kvt_server *srv, kvt_cluster **out)
{
    /* *out is written on success only: a refused second join must not
     * clear the caller's handle to the cluster that is joined */
    KVT_CHECK_ARG(out, "kvt_cluster_join: out is NULL");
    KVT_CHECK_ARG(srv, "kvt_cluster_join: srv is NULL");
    if (atomic_load(&srv->state) != 0)
        return kvt__fail(KVT_ESTATE, "kvt_cluster_join: the server is already running or "
                         "stopped; join before kvt_server_run");
    if (!srv->cfg.cluster_redis[0])
        return kvt__fail(KVT_EINVAL, "kvt_cluster_join: the server's cluster_redis option is "
                         "empty (the directory's address, e.g. 127.0.0.1:6379)");
    if (srv->hooks.fill || srv->hooks.observe)
        return kvt__fail(KVT_ESTATE, "kvt_cluster_join: the server is in a cluster already");
    kvt_cluster *cl = calloc(1, sizeof *cl);
    if (!cl || !(cl->q = malloc(CL_QUEUE * sizeof *cl->q))) {
        free(cl);
        return kvt__fail(KVT_ENOMEM, "kvt_cluster_join: out of memory");
    }
    cl->srv = srv;
    cl->cfg = &srv->cfg;
    cl->listen_fd = cl->stop_pipe[0] = cl->stop_pipe[1] = -1;
    pthread_mutex_init(&cl->qmu, NULL);
    kvt__cond_init(&cl->qcv);
    pthread_mutex_init(&cl->mu, NULL);
    pthread_mutex_init(&cl->pace_mu, NULL);
    pthread_mutex_init(&cl->cost_mu, NULL);
    kvt_status st = KVT_OK;
    if (srv->cfg.cluster_secret_file[0])
        st = kvt__srv_secret_load(srv->cfg.cluster_secret_file, "kvt_cluster_join: "
                                  "cluster_secret_file", &cl->secret, &cl->secret_len);
    if (!st) st = open_listener(cl);
    if (!st) st = open_dir(cl);
    if (!st) start_ucx(cl);
    if (!st) kvt__srv_set_hooks(srv, &(kvt_srv_hooks){cl, cl_observe, cl_fill, cl_metrics, cl_server_gone});
    if (!st) st = start_threads(cl);
    if (st) {
        kvt_cluster_leave(cl);
        return st;
    }
    kvt_dir *d = atomic_load(&cl->dir);
    kvt__log(KVT_LOG_INFO, "cluster: node %s (epoch %llu) serves peers on %s, directory %s%s",
             cl->node, (unsigned long long)(d ? kvt__dir_epoch(d) : 0), cl->advertise,
             srv->cfg.cluster_redis, d ? "" : " (not reachable yet)");
    *out = cl;
    return KVT_OK;
}

/* Everything leave does but free cl: threads joined, peers and the
 * directory closed (its lease deleted), hooks off the server. Once only:
 * from kvt_cluster_leave, or from kvt_server_destroy (server_gone) when the
 * caller destroyed the server first. */
static void cluster_stop(kvt_cluster *cl)
{
    if (cl->stopped) return;
    cl->stopped = true;
    if (cl->srv->hooks.arg == cl) kvt__srv_set_hooks(cl->srv, NULL);
    atomic_store(&cl->stopping, true);
    if (cl->stop_pipe[1] >= 0) (void)!write(cl->stop_pipe[1], "x", 1);
    pthread_mutex_lock(&cl->qmu);
    pthread_cond_signal(&cl->qcv);
    pthread_mutex_unlock(&cl->qmu);
    if (cl->accept_started) pthread_join(cl->accept_thread, NULL);
    if (cl->publish_started) pthread_join(cl->publish_thread, NULL);
    pthread_mutex_lock(&cl->mu);
    /* sv->fd, not sv->s: a thread moving its link onto UCX frees the TCP
     * stream meanwhile (the socket stays open until reap_served) */
    for (cl_served *sv = cl->served; sv; sv = sv->next) shutdown(sv->fd, SHUT_RDWR);
    reap_served(cl, true);
    for (uint32_t i = 0; i < cl->npeers; i++) {
        while (cl->peers[i].idle) {
            cl_link *l = cl->peers[i].idle;
            cl->peers[i].idle = l->next;
            kvt__stream_destroy(l->s);
            free(l);
        }
    }
    pthread_mutex_unlock(&cl->mu);
    kvt__dir_close(atomic_exchange(&cl->dir, NULL));
    if (cl->listen_fd >= 0) close(cl->listen_fd);
    cl->listen_fd = -1;
    cl->srv = NULL; /* nothing touches the server from here */
}

static void cl_server_gone(void *arg)
{
    kvt_cluster *cl = arg;
    kvt__log(KVT_LOG_WARN, "cluster: node %s: kvt_server_destroy came before "
             "kvt_cluster_leave; the cluster stopped first (call leave to free it)", cl->node);
    cluster_stop(cl);
}

void kvt_cluster_leave(kvt_cluster *cl)
{
    if (!cl) return;
    cluster_stop(cl);
    if (cl->ucx) kvt__stream_ucx_release(); /* each UCX link holds its own */
    for (int i = 0; i < 2; i++)
        if (cl->stop_pipe[i] >= 0) close(cl->stop_pipe[i]);
    if (cl->secret) kvt__srv_secret_free(cl->secret, cl->secret_len);
    explicit_bzero(cl->redis_password, sizeof cl->redis_password);
    explicit_bzero(cl->sentinel_password, sizeof cl->sentinel_password);
    pthread_mutex_destroy(&cl->qmu);
    pthread_cond_destroy(&cl->qcv);
    pthread_mutex_destroy(&cl->mu);
    pthread_mutex_destroy(&cl->pace_mu);
    pthread_mutex_destroy(&cl->cost_mu);
    free(cl->held.v);
    free(cl->q);
    free(cl);
}

kvt_status kvt_cluster_stats(const kvt_cluster *cl, kvt_cluster_counters *out)
{
    KVT_CHECK_ARG(cl && out, "kvt_cluster_stats: %s is NULL", cl ? "out" : "cl");
    uint64_t *dst = (uint64_t *)out;
    const uint64_t *src = (const uint64_t *)&cl->st;
    for (size_t i = 0; i < sizeof *out / sizeof(uint64_t); i++)
        dst[i] = __atomic_load_n(&src[i], __ATOMIC_RELAXED);
    kvt_dir *d = atomic_load(&cl->dir);
    out->epoch = d ? kvt__dir_epoch(d) : 0;
    out->directory_up = d && kvt__dir_up(d);
    out->dir_redirects = kvt__dir_redirects(d);
    out->pull_bytes_per_s = atomic_load(&cl->bw_bps);
    kvt_cluster *w = (kvt_cluster *)cl; /* the queue's lock: a snapshot changes nothing */
    pthread_mutex_lock(&w->qmu);
    out->publish_backlog = (uint64_t)cl->qlen + atomic_load(&cl->inflight) + atomic_load(&cl->owed);
    pthread_mutex_unlock(&w->qmu);
    return KVT_OK;
}

uint16_t kvt__cluster_port(const kvt_cluster *cl)
{
    return cl->port;
}
