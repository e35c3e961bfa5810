/* dir.c - the cluster directory in Redis (dir.h) over hiredis.
 *
 * Connections: each shard (the one Redis, the primary Sentinel names, or
 * one Redis Cluster primary) has two, one for lookups and one for
 * writes (publish, renew, forget, unpublish), each behind its own mutex,
 * so a lookup never queues behind a publish batch. A batch takes the
 * mutexes of the shards it touches in index order (no deadlock), writes
 * every shard's pipeline, then reads the replies: one round trip for the
 * batch however many shards it spans.
 *
 * hiredis writes with write(2), which raises SIGPIPE on a connection the
 * peer reset; the library must not kill its host, so every pipeline is
 * flushed here with send(MSG_NOSIGNAL) and hiredis only reads.
 *
 * Failure: a connection error (or a reply saying Redis cannot serve now:
 * READONLY, LOADING, MASTERDOWN, CLUSTERDOWN, TRYAGAIN) is retried once
 * after re-asking the sentinels or re-reading the slot map; if the retry
 * fails the directory is down and calls fail at once until the backoff
 * lets one call probe again. */
#include "cluster/dir.h"
#include "cluster/dir_decode.h"

#include <errno.h>
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include "util/clock.h"
#include "util/file.h"
#include "util/parse.h"
#include "util/err.h"
#include "util/log.h"

#define DIR_SHARDS_MAX KVT_DIR_PRIMARIES_MAX /* cluster primaries routed to */
#define DIR_SEEDS_MAX 16      /* addresses in the redis string */
#define DIR_PREFIX_MAX 64     /* key prefix bytes */
#define DIR_NAME_MAX 128      /* sentinel master name, with its NUL */
/* prefix + "b:" + 16 hex + ":" + 32 hex, or prefix + "n:" + node id */
#define DIR_KEY_MAX (DIR_PREFIX_MAX + 2 + KVT_DIR_NODE_MAX + 8)
#define DIR_BATCH 512         /* blocks per pipelined round trip (dir.h) */
#define DIR_REDIRECTS 5       /* MOVED/ASK rounds one call follows before giving up */
#define DIR_REFRESH_TRIES 3   /* cluster nodes one slot-map read tries */
#define DIR_SLOTS KVT_DIR_SLOTS
#define DIR_NO_SHARD KVT_DIR_NO_PRIMARY /* a slot no primary serves (that we know of) */
#define DIR_LEASE_CACHE 1024  /* node leases remembered for lookups (direct-mapped) */
#define DIR_BATCH_NODES 1024  /* distinct holders one lookup batch considers */
#define DIR_NODES_LIST_MAX 65536 /* node ids kvt__dir_nodes collects; more are only counted */
#define DIR_BACKOFF_FIRST_MS 100
#define DIR_BACKOFF_MAX_MS 5000

enum { ROLE_LOOKUP, ROLE_WRITE, ROLES };
enum { MODE_SINGLE, MODE_SENTINEL, MODE_CLUSTER };

typedef struct dir_conn {
    pthread_mutex_t mu;
    redisContext *c;              /* NULL: not connected */
    char addr[KVT_DIR_ADDR_MAX];  /* where c is connected */
    bool had;                     /* was connected before: the next connect is a reconnect */
} dir_conn;

typedef struct dir_shard {
    char addr[KVT_DIR_ADDR_MAX]; /* under topo_mu; changes only for Sentinel's primary */
    dir_conn conn[ROLES];
} dir_shard;

typedef struct lease_ent {
    char node[KVT_DIR_NODE_MAX];
    char addr[KVT_DIR_ADDR_MAX];
    uint64_t epoch;
    uint64_t seen_ns; /* when read from Redis; 0: empty */
    bool live;        /* the lease existed then */
} lease_ent;

struct kvt_dir {
    int mode;
    char prefix[DIR_PREFIX_MAX + 1];
    char node[KVT_DIR_NODE_MAX];
    char advertise[KVT_DIR_ADDR_MAX];
    char password[KVT_DIR_PASSWORD_MAX + 1];
    char user[KVT_DIR_USER_MAX + 1]; /* "": AUTH as the default user */
    char sentinel_password[KVT_DIR_PASSWORD_MAX + 1]; /* "": the sentinels want none */
    char name[DIR_NAME_MAX];                  /* Sentinel's master name */
    char seeds[DIR_SEEDS_MAX][KVT_DIR_ADDR_MAX]; /* Redis, sentinels or cluster seeds */
    uint32_t nseeds;
    uint32_t lease_ms, timeout_ms;
    bool watch_only; /* a reader: no epoch, no lease, writes refused */
    _Atomic bool warned_open; /* the unauthenticated-Redis warning was logged */
    uint64_t epoch;
    char entry_val[2][32]; /* a block entry's value: "<epoch> cpu", "<epoch> ssd" */
    char lease_val[24 + KVT_DIR_ADDR_MAX]; /* "<epoch> <advertise>" */
    bool opened;                            /* open finished: failures are logged from now */
    _Atomic uint64_t generation;
    _Atomic uint64_t redirects; /* MOVED/ASK answers followed */

    pthread_mutex_t topo_mu; /* shards[].addr, nshards, slots, nprimaries */
    dir_shard shards[DIR_SHARDS_MAX];
    uint32_t nshards; /* only grows: a shard's connections outlive map changes */
    uint32_t nprimaries;
    uint8_t slots[DIR_SLOTS];

    pthread_mutex_t refresh_mu; /* one sentinel ask or slot-map read at a time */

    pthread_mutex_t state_mu; /* the fields below but down */
    atomic_bool down;
    uint32_t backoff_ms;
    uint64_t next_try_ns, down_since_ns, gen_at_down;

    pthread_mutex_t lease_mu;
    lease_ent leases[DIR_LEASE_CACHE];
};

/* One command of a batch. argv points into key/num or at the handle's
 * strings, so a command can be sent again after a redirection. */
typedef struct dir_cmd {
    const char *argv[6];
    size_t len[6];
    int argc;
    char key[DIR_KEY_MAX];
    char num[24];
    uint16_t slot;
    uint8_t shard;  /* where this round sends it */
    bool fixed;     /* the caller chose the shard (SCAN): not routed by slot */
    bool ask;       /* an ASK redirection: ASKING first, to shard */
    redisReply *r;  /* NULL: not answered yet */
} dir_cmd;

/* ------------------------------------------------------------------ */
/* Keys and slots                                                     */
/* ------------------------------------------------------------------ */

/* CRC16-CCITT (XMODEM), as Redis Cluster hashes keys. Bitwise: a key is
 * under 150 bytes and a batch is one network round trip anyway. */
static uint16_t crc16(const char *p, size_t n)
{
    uint16_t crc = 0;
    for (size_t i = 0; i < n; i++) {
        crc ^= (uint16_t)((unsigned char)p[i] << 8);
        for (int b = 0; b < 8; b++) crc = (uint16_t)(crc & 0x8000 ? (crc << 1) ^ 0x1021 : crc << 1);
    }
    return crc;
}

/* The key's slot: only the part inside the first {...} is hashed when it
 * is non-empty (a hash tag, as Redis Cluster does). */
static uint16_t key_slot(const char *k, size_t n)
{
    const char *l = memchr(k, '{', n);
    if (l) {
        const char *r = memchr(l + 1, '}', n - (size_t)(l + 1 - k));
        if (r && r > l + 1) return crc16(l + 1, (size_t)(r - l - 1)) & (DIR_SLOTS - 1);
    }
    return crc16(k, n) & (DIR_SLOTS - 1);
}

static void cmd_key(dir_cmd *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void cmd_key(dir_cmd *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(c->key, sizeof c->key, fmt, ap);
    va_end(ap);
    /* every part of a key is length-checked at open: it always fits */
    size_t len = n < 0 ? 0 : (size_t)n < sizeof c->key ? (size_t)n : sizeof c->key - 1;
    c->argv[1] = c->key;
    c->len[1] = len;
    c->slot = key_slot(c->key, len);
}

static void cmd_arg(dir_cmd *c, int i, const char *s)
{
    c->argv[i] = s;
    c->len[i] = strlen(s);
    if (c->argc <= i) c->argc = i + 1;
}

static void block_key(const kvt_dir *d, dir_cmd *c, uint64_t space, kvt_hash128 h)
{
    cmd_key(c, "%sb:%016" PRIx64 ":%016" PRIx64 "%016" PRIx64, d->prefix, space, h.hi, h.lo);
}

static void node_key(const kvt_dir *d, dir_cmd *c, const char *node)
{
    cmd_key(c, "%sn:%s", d->prefix, node);
}

static void holding_key(const kvt_dir *d, dir_cmd *c, const char *node)
{
    cmd_key(c, "%sh:%s", d->prefix, node);
}

static void cmds_free(dir_cmd *cmds, size_t n)
{
    if (!cmds) return;
    for (size_t i = 0; i < n; i++)
        if (cmds[i].r) freeReplyObject(cmds[i].r);
    free(cmds);
}

/* ------------------------------------------------------------------ */
/* Connections                                                        */
/* ------------------------------------------------------------------ */

static kvt_status io_fail(redisContext *c, int err, const char *addr, const char *what)
{
    if (c->err == REDIS_ERR_IO && (err == EAGAIN || err == EWOULDBLOCK || err == ETIMEDOUT))
        return kvt__fail(KVT_ETIMEDOUT, "cluster directory: Redis at %s did not answer %s in time", addr,
                         what);
    if (c->err == REDIS_ERR_PROTOCOL)
        return kvt__fail(KVT_EPROTO, "cluster directory: Redis at %s sent a malformed reply to %s: %s",
                         addr, what, c->errstr);
    return kvt__fail(KVT_ECONN, "cluster directory: Redis at %s: %s: %s", addr, what,
                     c->errstr[0] ? c->errstr : "connection closed");
}

/* Writes c's pending pipeline with MSG_NOSIGNAL (see the top); the
 * socket's send timeout (redisSetTimeout) bounds each send. */
static kvt_status ctx_flush(redisContext *c, const char *addr)
{
    size_t len = sdslen(c->obuf), off = 0;
    while (off < len) {
        ssize_t w = send(c->fd, c->obuf + off, len - off, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) {
            int e = errno;
            if (e == EAGAIN || e == EWOULDBLOCK)
                return kvt__fail(KVT_ETIMEDOUT, "cluster directory: Redis at %s did not take a request in time",
                                 addr);
            return kvt__fail(KVT_ECONN, "cluster directory: sending to Redis at %s: %s", addr, strerror(e));
        }
        off += (size_t)w;
    }
    sdsclear(c->obuf);
    return KVT_OK;
}

static kvt_status ctx_append(redisContext *c, int argc, const char **argv, const size_t *len)
{
    if (redisAppendCommandArgv(c, argc, argv, len) != REDIS_OK)
        return kvt__fail(KVT_ENOMEM, "cluster directory: out of memory for a Redis command");
    return KVT_OK;
}

static kvt_status ctx_reply(redisContext *c, const char *addr, const char *what, redisReply **out)
{
    void *r = NULL;
    errno = 0;
    if (redisGetReply(c, &r) != REDIS_OK || !r) return io_fail(c, errno, addr, what);
    *out = r;
    return KVT_OK;
}

/* One command, one round trip, on c. */
static kvt_status ctx_call(redisContext *c, const char *addr, int argc, const char **argv,
                           redisReply **out)
{
    size_t len[8];
    for (int i = 0; i < argc; i++) len[i] = strlen(argv[i]);
    kvt_status st = ctx_append(c, argc, argv, len);
    if (!st) st = ctx_flush(c, addr);
    if (!st) st = ctx_reply(c, addr, argv[0], out);
    return st;
}

/* AUTH [user] password on c (to addr); KVT_EAUTH naming the option to fix
 * when refused. */
static kvt_status ctx_auth(redisContext *c, const char *addr, const char *user, const char *pw,
                           bool sentinel)
{
    redisReply *r = NULL;
    const char *argv[3] = {"AUTH", user[0] ? user : pw, pw};
    kvt_status st = ctx_call(c, addr, user[0] ? 3 : 2, argv, &r);
    if (!st && r->type == REDIS_REPLY_ERROR)
        st = sentinel ? kvt__fail(KVT_EAUTH, "cluster directory: sentinel at %s refused the password "
                                  "in cluster_sentinel_password_file: %s", addr, r->str)
           : user[0] ? kvt__fail(KVT_EAUTH, "cluster directory: Redis at %s refused user \"%s\" with "
                                 "the password in cluster_redis_password_file: %s", addr, user, r->str)
                     : kvt__fail(KVT_EAUTH, "cluster directory: Redis at %s refused the password: %s",
                                 addr, r->str);
    if (r) freeReplyObject(r);
    return st;
}

/* A connection to addr with the deadline on connect and on every read
 * and write, authenticated when a password is set (auth: false for the
 * sentinels, which have a password of their own if any). */
static kvt_status ctx_open(kvt_dir *d, const char *addr, bool auth, redisContext **out)
{
    char host[KVT_DIR_ADDR_MAX];
    uint16_t port;
    if (!kvt__dir_addr_split(addr, strlen(addr), host, sizeof host, &port))
        return kvt__fail(KVT_EPROTO, "cluster directory: \"%s\" is not host:port", addr);
    struct timeval tv = {(time_t)(d->timeout_ms / 1000), (suseconds_t)(d->timeout_ms % 1000) * 1000};
    errno = 0;
    redisContext *c = redisConnectWithTimeout(host, port, tv);
    if (!c) return kvt__fail(KVT_ENOMEM, "cluster directory: out of memory connecting to %s", addr);
    if (c->err) {
        kvt_status st = io_fail(c, errno, addr, "connect");
        redisFree(c);
        return st;
    }
    if (redisSetTimeout(c, tv) != REDIS_OK) {
        kvt_status st = io_fail(c, errno, addr, "setting the socket timeout");
        redisFree(c);
        return st;
    }
    kvt__dir_reader_cap(c->reader);
    if (auth && !d->password[0] && !d->watch_only && !kvt__host_is_loopback(host) &&
        !atomic_exchange(&d->warned_open, true))
        kvt__log(KVT_LOG_WARN, "cluster directory: Redis at %s is not on loopback and no "
                 "password is set (cluster_redis_password_file): anyone who reaches it can "
                 "rewrite which node holds what (pulls then miss); set requirepass there", addr);
    const char *pw = auth ? d->password : d->sentinel_password;
    if (pw[0]) {
        kvt_status st = ctx_auth(c, addr, auth ? d->user : "", pw, !auth);
        if (st) {
            redisFree(c);
            return st;
        }
    }
    *out = c;
    return KVT_OK;
}

static void conn_drop(dir_conn *cn)
{
    if (cn->c) redisFree(cn->c);
    cn->c = NULL;
}

/* Makes cn (its mutex held) connected to shard s's current address. A
 * replaced connection bumps the generation: what it wrote may be lost. */
static kvt_status conn_ensure(kvt_dir *d, uint32_t s, dir_conn *cn)
{
    char addr[KVT_DIR_ADDR_MAX];
    pthread_mutex_lock(&d->topo_mu);
    memcpy(addr, d->shards[s].addr, sizeof addr);
    pthread_mutex_unlock(&d->topo_mu);
    if (cn->c && strcmp(cn->addr, addr) == 0) return KVT_OK;
    conn_drop(cn);
    kvt_status st = ctx_open(d, addr, true, &cn->c);
    if (st) return st;
    memcpy(cn->addr, addr, sizeof addr);
    if (cn->had) atomic_fetch_add(&d->generation, 1);
    cn->had = true;
    return KVT_OK;
}

/* ------------------------------------------------------------------ */
/* Down and back                                                      */
/* ------------------------------------------------------------------ */

/* The thread's message without its "cluster directory: ", to quote it
 * inside another of ours. */
static const char *last_error_tail(void)
{
    static const char pre[] = "cluster directory: ";
    const char *e = kvt_last_error();
    return strncmp(e, pre, sizeof pre - 1) == 0 ? e + sizeof pre - 1 : e;
}

/* Fails at once while the directory is down and its backoff runs; when
 * it has run out, lets this call through as the probe (others keep
 * failing at once until it ends). */
static kvt_status gate(kvt_dir *d, bool *probe)
{
    *probe = false;
    if (!atomic_load(&d->down)) return KVT_OK;
    pthread_mutex_lock(&d->state_mu);
    kvt_status st = KVT_OK;
    uint64_t now = kvt__now_ns();
    if (!atomic_load(&d->down)) {
    } else if (now < d->next_try_ns) {
        st = kvt__fail(KVT_ECONN, "cluster directory: Redis is down; the next try is in %" PRIu64 " ms",
                       (d->next_try_ns - now) / 1000000 + 1);
    } else {
        d->next_try_ns = now + (uint64_t)d->backoff_ms * 1000000ull;
        *probe = true;
    }
    pthread_mutex_unlock(&d->state_mu);
    return st;
}

static void mark_down(kvt_dir *d, bool probe)
{
    pthread_mutex_lock(&d->state_mu);
    uint64_t now = kvt__now_ns();
    if (!atomic_load(&d->down)) {
        d->backoff_ms = DIR_BACKOFF_FIRST_MS;
        d->down_since_ns = now;
        d->gen_at_down = atomic_load(&d->generation);
        atomic_store(&d->down, true);
        if (d->opened)
            KVT_LOG(KVT_LOG_WARN, "cluster directory: down (%s); calls fail at once, retried after "
                    "100 ms doubling to 5 s", last_error_tail());
    } else if (probe) {
        d->backoff_ms = d->backoff_ms * 2 > DIR_BACKOFF_MAX_MS ? DIR_BACKOFF_MAX_MS : d->backoff_ms * 2;
    } else {
        pthread_mutex_unlock(&d->state_mu);
        return; /* a call in flight when another found it down: the probe decides */
    }
    d->next_try_ns = now + (uint64_t)d->backoff_ms * 1000000ull;
    pthread_mutex_unlock(&d->state_mu);
}

static void mark_up(kvt_dir *d)
{
    if (!atomic_load(&d->down)) return;
    pthread_mutex_lock(&d->state_mu);
    if (atomic_load(&d->down)) {
        /* every way back involves a new connection, which bumped it; a
         * LOADING or READONLY spell may not have: bump it here then */
        if (atomic_load(&d->generation) == d->gen_at_down) atomic_fetch_add(&d->generation, 1);
        atomic_store(&d->down, false);
        KVT_LOG(KVT_LOG_INFO, "cluster directory: back after %" PRIu64 " ms (generation %" PRIu64 ")",
                (kvt__now_ns() - d->down_since_ns) / 1000000, atomic_load(&d->generation));
    }
    pthread_mutex_unlock(&d->state_mu);
}

/* ------------------------------------------------------------------ */
/* Topology: Sentinel's primary, the cluster's slot map               */
/* ------------------------------------------------------------------ */

/* A sentinel's answer (dir_decode.h) with a message naming it. */
static kvt_status sentinel_answer(const kvt_dir *d, const char *sentinel, const redisReply *r,
                                  char addr[KVT_DIR_ADDR_MAX])
{
    const char *err = NULL;
    kvt_status st = kvt__dir_sentinel_reply(r, addr, &err);
    if (st == KVT_ENOTFOUND)
        return kvt__fail(KVT_ECONN, "cluster directory: sentinel %s knows no primary named \"%s\"",
                         sentinel, d->name);
    if (st == KVT_EAUTH)
        return kvt__fail(KVT_EAUTH, "cluster directory: sentinel %s wants a password (\"%s\"): set "
                         "cluster_sentinel_password_file to a file holding its requirepass",
                         sentinel, err);
    if (st == KVT_EINVAL)
        return kvt__fail(KVT_EPROTO, "cluster directory: sentinel %s named primary \"%s\" at an "
                         "unusable address", sentinel, d->name);
    if (st)
        return kvt__fail(KVT_EPROTO, "cluster directory: sentinel %s answered get-master-addr-by-name "
                         "%s with %s", sentinel, d->name, err ? err : "an unexpected reply");
    return KVT_OK;
}

/* Asks the sentinels in turn which address the primary has; the first
 * answer is taken. A change is logged (a failover followed). */
static kvt_status sentinel_ask(kvt_dir *d)
{
    pthread_mutex_lock(&d->refresh_mu);
    kvt_status st = KVT_ECONN;
    char addr[KVT_DIR_ADDR_MAX] = "";
    for (uint32_t i = 0; i < d->nseeds && st; i++) {
        redisContext *c = NULL;
        st = ctx_open(d, d->seeds[i], false, &c);
        if (st) continue;
        redisReply *r = NULL;
        const char *argv[] = {"SENTINEL", "get-master-addr-by-name", d->name};
        st = ctx_call(c, d->seeds[i], 3, argv, &r);
        if (!st) st = sentinel_answer(d, d->seeds[i], r, addr);
        if (r) freeReplyObject(r);
        redisFree(c);
    }
    if (st) { /* name the sentinels' role: the inner message speaks of "Redis" */
        char last[KVT_ERRMSG_MAX];
        snprintf(last, sizeof last, "%s", last_error_tail());
        st = kvt__fail(st, "cluster directory: no sentinel named primary \"%s\" (%u asked; the last: %s)",
                       d->name, d->nseeds, last);
    } else {
        pthread_mutex_lock(&d->topo_mu);
        if (strcmp(d->shards[0].addr, addr) != 0) {
            if (d->opened)
                KVT_LOG(KVT_LOG_INFO, "cluster directory: sentinels name %s as primary \"%s\" (was %s)",
                        addr, d->name, d->shards[0].addr);
            memcpy(d->shards[0].addr, addr, sizeof addr);
        }
        pthread_mutex_unlock(&d->topo_mu);
    }
    pthread_mutex_unlock(&d->refresh_mu);
    return st;
}

/* The shard whose address is addr, added when new (topo_mu held);
 * DIR_NO_SHARD when the table is full. */
static uint32_t shard_of(kvt_dir *d, const char *addr)
{
    for (uint32_t i = 0; i < d->nshards; i++)
        if (strcmp(d->shards[i].addr, addr) == 0) return i;
    if (d->nshards == DIR_SHARDS_MAX) return DIR_NO_SHARD;
    snprintf(d->shards[d->nshards].addr, KVT_DIR_ADDR_MAX, "%s", addr);
    return d->nshards++;
}

/* Installs the slot map of a CLUSTER SLOTS reply from asked. changed:
 * whether a slot changed primary (after a connection failure: a failover,
 * which may have lost writes). */
static kvt_status slots_install(kvt_dir *d, const redisReply *r, const char *asked, bool *changed)
{
    kvt_dir_slot_map *m = malloc(sizeof *m); /* 20 KiB: not on a caller's stack */
    if (!m) return kvt__fail(KVT_ENOMEM, "cluster directory: out of memory reading a slot map");
    kvt_status st = kvt__dir_slots_reply(r, asked, m);
    uint8_t shard[KVT_DIR_PRIMARIES_MAX];
    pthread_mutex_lock(&d->topo_mu);
    for (uint32_t i = 0; !st && i < m->n; i++)
        if ((shard[i] = (uint8_t)shard_of(d, m->addr[i])) == DIR_NO_SHARD)
            st = kvt__fail(KVT_EFULL, "cluster directory: more than %d primaries", DIR_SHARDS_MAX);
    if (!st) {
        for (uint32_t k = 0; k < DIR_SLOTS; k++)
            if (m->slot[k] != KVT_DIR_NO_PRIMARY) m->slot[k] = shard[m->slot[k]];
        bool seen[DIR_SHARDS_MAX] = {false};
        uint32_t np = 0;
        *changed = memcmp(m->slot, d->slots, sizeof d->slots) != 0;
        memcpy(d->slots, m->slot, sizeof d->slots);
        for (uint32_t k = 0; k < DIR_SLOTS; k++)
            if (m->slot[k] != DIR_NO_SHARD && !seen[m->slot[k]]) seen[m->slot[k]] = true, np++;
        d->nprimaries = np;
    }
    pthread_mutex_unlock(&d->topo_mu);
    free(m);
    return st;
}

/* Reads the slot map from hint (a node that just redirected us), else a
 * known primary, else a seed: the first that answers. */
static kvt_status cluster_refresh(kvt_dir *d, const char *hint, bool *changed)
{
    pthread_mutex_lock(&d->refresh_mu);
    char cand[1 + DIR_SHARDS_MAX + DIR_SEEDS_MAX][KVT_DIR_ADDR_MAX];
    uint32_t nc = 0;
    if (hint) snprintf(cand[nc++], KVT_DIR_ADDR_MAX, "%s", hint);
    pthread_mutex_lock(&d->topo_mu);
    for (uint32_t i = 0; i < d->nshards; i++) memcpy(cand[nc++], d->shards[i].addr, KVT_DIR_ADDR_MAX);
    pthread_mutex_unlock(&d->topo_mu);
    for (uint32_t i = 0; i < d->nseeds; i++) memcpy(cand[nc++], d->seeds[i], KVT_DIR_ADDR_MAX);
    kvt_status st = kvt__fail(KVT_ECONN, "cluster directory: no cluster node to ask");
    *changed = false;
    /* at most DIR_REFRESH_TRIES nodes, each bounded by timeout_ms: a
     * partitioned cluster must not hold a call for every node's deadline */
    for (uint32_t i = 0; i < nc && i < DIR_REFRESH_TRIES && st; i++) {
        redisContext *c = NULL;
        st = ctx_open(d, cand[i], true, &c);
        if (st) continue;
        redisReply *r = NULL;
        const char *argv[] = {"CLUSTER", "SLOTS"};
        st = ctx_call(c, cand[i], 2, argv, &r);
        if (!st) st = slots_install(d, r, cand[i], changed);
        if (r) freeReplyObject(r);
        redisFree(c);
    }
    pthread_mutex_unlock(&d->refresh_mu);
    return st;
}

/* ------------------------------------------------------------------ */
/* Batches                                                            */
/* ------------------------------------------------------------------ */

/* Routes the unanswered commands (topo_mu held): false when a slot has
 * no primary. */
static bool route(kvt_dir *d, dir_cmd *cmds, size_t n, uint16_t *bad_slot)
{
    for (size_t i = 0; i < n; i++) {
        dir_cmd *c = &cmds[i];
        if (c->r || c->fixed || c->ask) continue;
        c->shard = d->mode == MODE_CLUSTER ? d->slots[c->slot] : 0;
        if (c->shard == DIR_NO_SHARD) {
            *bad_slot = c->slot;
            return false;
        }
    }
    return true;
}

/* Sends shard s's part of the batch (its connection's mutex held). */
static kvt_status send_shard(kvt_dir *d, uint32_t s, dir_conn *cn, dir_cmd *cmds, size_t n)
{
    kvt_status st = conn_ensure(d, s, cn);
    static const char *const asking[] = {"ASKING"};
    static const size_t asking_len[] = {6};
    for (size_t i = 0; i < n && !st; i++) {
        if (cmds[i].r || cmds[i].shard != s) continue;
        if (cmds[i].ask) st = ctx_append(cn->c, 1, (const char **)asking, asking_len);
        if (!st) st = ctx_append(cn->c, cmds[i].argc, cmds[i].argv, cmds[i].len);
    }
    if (!st) st = ctx_flush(cn->c, cn->addr);
    return st;
}

static kvt_status recv_shard(uint32_t s, dir_conn *cn, dir_cmd *cmds, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (cmds[i].r || cmds[i].shard != s) continue;
        redisReply *r = NULL;
        kvt_status st = KVT_OK;
        if (cmds[i].ask) {
            st = ctx_reply(cn->c, cn->addr, "ASKING", &r);
            if (r) freeReplyObject(r);
            r = NULL;
        }
        if (!st) st = ctx_reply(cn->c, cn->addr, cmds[i].argv[0], &r);
        if (st) return st;
        cmds[i].r = r;
        cmds[i].ask = false;
    }
    return KVT_OK;
}

/* One round: every shard's pipeline written, then every reply read. A
 * shard whose connection fails is dropped (its unanswered commands stay
 * so); the first failure is returned, the others' replies kept. */
static kvt_status round_trip(kvt_dir *d, int role, dir_cmd *cmds, size_t n)
{
    bool use[DIR_SHARDS_MAX] = {false}, bad[DIR_SHARDS_MAX] = {false};
    for (size_t i = 0; i < n; i++)
        if (!cmds[i].r) use[cmds[i].shard] = true;
    kvt_status first = KVT_OK;
    for (uint32_t s = 0; s < DIR_SHARDS_MAX; s++) {
        if (!use[s]) continue;
        dir_conn *cn = &d->shards[s].conn[role];
        pthread_mutex_lock(&cn->mu);
        kvt_status st = send_shard(d, s, cn, cmds, n);
        if (st) {
            conn_drop(cn);
            bad[s] = true;
            if (!first) first = st;
        }
    }
    for (uint32_t s = 0; s < DIR_SHARDS_MAX; s++) {
        if (!use[s]) continue;
        dir_conn *cn = &d->shards[s].conn[role];
        kvt_status st = bad[s] ? KVT_OK : recv_shard(s, cn, cmds, n);
        if (st) {
            conn_drop(cn);
            if (!first) first = st;
        }
        pthread_mutex_unlock(&cn->mu);
    }
    return first;
}

/* After a round: redirections recorded (MOVED also re-points the slot),
 * answers saying Redis cannot serve now taken back. Returns whether any
 * command must go again; *moved_to names a node that sent MOVED. */
static bool take_redirects(kvt_dir *d, dir_cmd *cmds, size_t n, bool *unavail, char *moved_to,
                           char *unavail_msg, size_t msg_len)
{
    bool again = false;
    for (size_t i = 0; i < n; i++) {
        dir_cmd *c = &cmds[i];
        char addr[KVT_DIR_ADDR_MAX];
        int k = c->r ? kvt__dir_reply_kind(c->r, addr) : KVT_DIR_REPLY_OK;
        if (k == KVT_DIR_REPLY_OK) continue;
        if (k == KVT_DIR_REPLY_UNAVAIL) {
            *unavail = true;
            snprintf(unavail_msg, msg_len, "%s", c->r->str);
        } else {
            pthread_mutex_lock(&d->topo_mu);
            uint32_t s = shard_of(d, addr);
            if (s != DIR_NO_SHARD && k == KVT_DIR_REPLY_MOVED) d->slots[c->slot] = (uint8_t)s;
            pthread_mutex_unlock(&d->topo_mu);
            if (s == DIR_NO_SHARD) continue; /* reported to the caller as the error it is */
            atomic_fetch_add(&d->redirects, 1);
            KVT_LOG(KVT_LOG_DEBUG, "cluster directory: %s for slot %u: %s", k == KVT_DIR_REPLY_ASK ? "ASK" : "MOVED",
                    c->slot, addr);
            if (k == KVT_DIR_REPLY_ASK) {
                c->ask = true;
                c->shard = (uint8_t)s;
            } else {
                snprintf(moved_to, KVT_DIR_ADDR_MAX, "%s", addr);
            }
        }
        freeReplyObject(c->r);
        c->r = NULL;
        again = true;
    }
    return again;
}

/* Re-reads where the data lives before the one retry of a failed round. */
static kvt_status rediscover(kvt_dir *d, const char *hint)
{
    bool changed = false;
    kvt_status st = KVT_OK;
    if (d->mode == MODE_SENTINEL) st = sentinel_ask(d);
    if (d->mode == MODE_CLUSTER) {
        st = cluster_refresh(d, hint, &changed);
        if (!st && changed && d->opened) atomic_fetch_add(&d->generation, 1);
    }
    return st;
}

/* Runs the batch: every command answered (replies in cmds[].r, errors
 * among them for the caller to judge) or a failure status. Follows
 * MOVED/ASK up to DIR_REDIRECTS rounds and retries once after a
 * connection failure or a not-now answer; a failure then is the
 * directory going down. */
static kvt_status batch_exec(kvt_dir *d, int role, dir_cmd *cmds, size_t n)
{
    bool probe;
    kvt_status st = gate(d, &probe);
    if (st) return st;
    bool retried = false, refreshed = false;
    for (int round = 0;; round++) {
        uint16_t bad_slot = 0;
        pthread_mutex_lock(&d->topo_mu);
        bool routed = route(d, cmds, n, &bad_slot);
        pthread_mutex_unlock(&d->topo_mu);
        if (!routed && !refreshed) {
            refreshed = true;
            st = rediscover(d, NULL);
            if (st) break;
            round--;
            continue;
        }
        if (!routed) {
            st = kvt__fail(KVT_ECONN, "cluster directory: no primary serves slot %u", bad_slot);
            break;
        }
        st = round_trip(d, role, cmds, n);
        char moved_to[KVT_DIR_ADDR_MAX] = "", why[128] = "";
        bool unavail = false;
        /* redirections are taken back even from a failed round, so no
         * MOVED reads as an answer after the retry */
        bool again = take_redirects(d, cmds, n, &unavail, moved_to, why, sizeof why);
        bool lost = st == KVT_ECONN || st == KVT_ETIMEDOUT;
        if (st && !lost) break;
        if (!lost && !again) break; /* all answered */
        if (lost || unavail) {
            if (retried) {
                if (!lost) st = kvt__fail(KVT_ECONN, "cluster directory: Redis cannot serve now: %s", why);
                break;
            }
            retried = true;
            kvt_status rst = rediscover(d, NULL);
            if (rst && d->mode != MODE_SINGLE) {
                st = rst;
                break;
            }
            st = KVT_OK;
            continue;
        }
        if (round >= DIR_REDIRECTS) {
            st = kvt__fail(KVT_EIO, "cluster directory: still redirected after %d rounds", DIR_REDIRECTS);
            break;
        }
        if (moved_to[0] && !refreshed) {
            refreshed = true;
            bool changed;
            /* the slot is re-pointed already; an operator sees a resharding
             * or failover once per re-read map, not per command (debug) */
            kvt_status rs = cluster_refresh(d, moved_to, &changed);
            KVT_LOG(KVT_LOG_INFO, "cluster directory: Redis Cluster moved slots (MOVED to %s); %s",
                    moved_to, rs ? "reading the slot map again failed: the next MOVED tries again"
                                 : "slot map read again");
        }
    }
    if (st == KVT_ECONN || st == KVT_ETIMEDOUT) mark_down(d, probe);
    else if (!st) mark_up(d);
    return st;
}

static kvt_status cmds_alloc(dir_cmd **out, size_t n)
{
    *out = calloc(n ? n : 1, sizeof **out);
    if (!*out)
        return kvt__fail(KVT_ENOMEM, "cluster directory: out of memory for a batch of %zu commands", n);
    return KVT_OK;
}

/* An error answer to cmd: KVT_EAUTH saying what to set when Redis wants
 * a password (NOAUTH), refused the one given (WRONGPASS) or denies the
 * ACL user a command or key (NOPERM), else KVT_EIO quoting it. */
static kvt_status reply_error(const kvt_dir *d, const dir_cmd *cmd)
{
    const char *e = cmd->r->str;
    if (!strncmp(e, "NOPERM", 6))
        return kvt__fail(KVT_EAUTH, "cluster directory: Redis (%s) denies user \"%s\": %s %s "
                         "answered \"%s\"; its ACL must allow the directory's commands on keys "
                         "%s* (docs/cluster.md, \"Redis ACL user\")", d->seeds[0],
                         d->user[0] ? d->user : "default", cmd->argv[0], cmd->key, e, d->prefix);
    if (!strncmp(e, "NOAUTH", 6) || !strncmp(e, "WRONGPASS", 9))
        return kvt__fail(KVT_EAUTH, "cluster directory: Redis (%s) %s: %s %s answered \"%s\"; set "
                         "cluster_redis_password_file to a file holding its requirepass",
                         d->seeds[0], d->password[0] ? "refused the password" : "wants a password",
                         cmd->argv[0], cmd->key, e);
    return kvt__fail(KVT_EIO, "cluster directory: Redis refused %s %s: %s", cmd->argv[0], cmd->key, e);
}

/* A plain error among a batch's answers: reply_error's status. */
static kvt_status reply_errors(const kvt_dir *d, const dir_cmd *cmds, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (cmds[i].r->type == REDIS_REPLY_ERROR) return reply_error(d, &cmds[i]);
    return KVT_OK;
}

/* ------------------------------------------------------------------ */
/* Open and close                                                     */
/* ------------------------------------------------------------------ */

/* The comma-separated addresses of list[0..n) into d->seeds. */
static kvt_status parse_seeds(kvt_dir *d, const char *redis, const char *list, size_t n)
{
    const char *p = list, *end = list + n;
    while (p <= end) {
        const char *c = memchr(p, ',', (size_t)(end - p));
        const char *e = c ? c : end;
        if (d->nseeds == DIR_SEEDS_MAX)
            return kvt__fail(KVT_EINVAL, "cluster directory: redis \"%s\" names more than %d addresses", redis,
                             DIR_SEEDS_MAX);
        if (!kvt__dir_addr_split(p, (size_t)(e - p), NULL, 0, NULL))
            return kvt__fail(KVT_EINVAL, "cluster directory: redis \"%s\": \"%.*s\" is not host:port", redis,
                             (int)(e - p), p);
        memcpy(d->seeds[d->nseeds], p, (size_t)(e - p));
        d->seeds[d->nseeds++][e - p] = '\0';
        p = e + 1;
    }
    return KVT_OK;
}

static kvt_status parse_redis(kvt_dir *d, const char *redis)
{
    static const char sent[] = "sentinel://", clus[] = "cluster://";
    if (!redis || !redis[0]) return kvt__fail(KVT_EINVAL, "cluster directory: redis is empty");
    if (strncmp(redis, sent, sizeof sent - 1) == 0) {
        d->mode = MODE_SENTINEL;
        const char *list = redis + sizeof sent - 1, *slash = strchr(list, '/');
        if (!slash || !slash[1])
            return kvt__fail(KVT_EINVAL, "cluster directory: redis \"%s\" names no master "
                             "(want sentinel://host:port[,host:port]/name)", redis);
        size_t nn = strlen(slash + 1);
        if (nn >= DIR_NAME_MAX || strpbrk(slash + 1, " /\t\r\n"))
            return kvt__fail(KVT_EINVAL, "cluster directory: redis \"%s\": the master name is longer than "
                             "%d bytes or holds a space or '/'", redis, DIR_NAME_MAX - 1);
        memcpy(d->name, slash + 1, nn + 1);
        return parse_seeds(d, redis, list, (size_t)(slash - list));
    }
    if (strncmp(redis, clus, sizeof clus - 1) == 0) {
        d->mode = MODE_CLUSTER;
        return parse_seeds(d, redis, redis + sizeof clus - 1, strlen(redis + sizeof clus - 1));
    }
    if (strstr(redis, "://"))
        return kvt__fail(KVT_EINVAL, "cluster directory: redis \"%s\" has an unknown scheme (want host:port, "
                         "sentinel://... or cluster://...)", redis);
    d->mode = MODE_SINGLE;
    kvt_status st = parse_seeds(d, redis, redis, strlen(redis));
    if (!st && d->nseeds != 1)
        st = kvt__fail(KVT_EINVAL, "cluster directory: redis \"%s\" names %u addresses; one Redis is "
                       "host:port (sentinel:// or cluster:// for more)", redis, d->nseeds);
    return st;
}

kvt_status kvt__dir_check_redis(const char *redis)
{
    kvt_dir *d = calloc(1, sizeof *d);
    if (!d) return kvt__fail(KVT_ENOMEM, "cluster directory: out of memory");
    kvt_status st = parse_redis(d, redis);
    free(d);
    return st;
}

static kvt_status check_config(kvt_dir *d, const kvt_dir_config *cfg)
{
    kvt_status st = parse_redis(d, cfg->redis);
    if (st) return st;
    const char *pw = cfg->password ? cfg->password : "";
    if (strlen(pw) > KVT_DIR_PASSWORD_MAX)
        return kvt__fail(KVT_EINVAL, "cluster directory: password is longer than %d bytes", KVT_DIR_PASSWORD_MAX);
    strcpy(d->password, pw);
    const char *user = cfg->user ? cfg->user : "";
    size_t un = strlen(user);
    if (un > KVT_DIR_USER_MAX)
        return kvt__fail(KVT_EINVAL, "cluster directory: Redis user name has %zu bytes (at most %d)",
                         un, KVT_DIR_USER_MAX);
    for (size_t i = 0; i < un; i++)
        if (user[i] <= ' ' || user[i] == 0x7f)
            return kvt__fail(KVT_EINVAL, "cluster directory: Redis user name \"%s\" holds a space "
                             "or control byte at %zu (Redis ACL names do not)", user, i);
    if (un && !pw[0])
        return kvt__fail(KVT_EINVAL, "cluster directory: Redis user \"%s\" is set without a "
                         "password (set cluster_redis_password_file too)", user);
    strcpy(d->user, user);
    const char *spw = cfg->sentinel_password ? cfg->sentinel_password : "";
    if (strlen(spw) > KVT_DIR_PASSWORD_MAX)
        return kvt__fail(KVT_EINVAL, "cluster directory: sentinel password is longer than %d bytes",
                         KVT_DIR_PASSWORD_MAX);
    strcpy(d->sentinel_password, spw);
    const char *pre = cfg->prefix ? cfg->prefix : "kvt:";
    size_t pn = strlen(pre);
    if (pn == 0 || pn > DIR_PREFIX_MAX)
        return kvt__fail(KVT_EINVAL, "cluster directory: prefix \"%s\" has %zu bytes (want 1..%d)", pre, pn,
                         DIR_PREFIX_MAX);
    for (size_t i = 0; i < pn; i++)
        if (pre[i] <= ' ' || pre[i] > '~')
            return kvt__fail(KVT_EINVAL, "cluster directory: prefix \"%s\" holds a space or a byte that is "
                             "not printable ASCII (at %zu)", pre, i);
    strcpy(d->prefix, pre);
    if (!cfg->node || !kvt__dir_node_ok(cfg->node))
        return kvt__fail(KVT_EINVAL, "cluster directory: node \"%s\" is not 1..%d bytes of [A-Za-z0-9._-]",
                         cfg->node ? cfg->node : "(null)", KVT_DIR_NODE_MAX - 1);
    strcpy(d->node, cfg->node);
    if (cfg->watch_only && !cfg->advertise) {
        d->advertise[0] = 0; /* a reader advertises nothing */
    } else if (!cfg->advertise || !kvt__dir_addr_split(cfg->advertise, strlen(cfg->advertise), NULL, 0, NULL))
        return kvt__fail(KVT_EINVAL, "cluster directory: advertise \"%s\" is not host:port (under %d bytes)",
                         cfg->advertise ? cfg->advertise : "(null)", KVT_DIR_ADDR_MAX);
    else
        strcpy(d->advertise, cfg->advertise);
    if (cfg->lease_ms < 100)
        return kvt__fail(KVT_EINVAL, "cluster directory: lease_ms is %u (want >= 100)", cfg->lease_ms);
    if (cfg->timeout_ms < 1) return kvt__fail(KVT_EINVAL, "cluster directory: timeout_ms is 0 (want >= 1)");
    d->lease_ms = cfg->lease_ms;
    d->timeout_ms = cfg->timeout_ms;
    d->watch_only = cfg->watch_only;
    return KVT_OK;
}

static kvt_status dir_alloc(kvt_dir **out)
{
    kvt_dir *d = calloc(1, sizeof *d);
    if (!d) return kvt__fail(KVT_ENOMEM, "cluster directory: out of memory");
    pthread_mutex_init(&d->topo_mu, NULL);
    pthread_mutex_init(&d->refresh_mu, NULL);
    pthread_mutex_init(&d->state_mu, NULL);
    pthread_mutex_init(&d->lease_mu, NULL);
    for (uint32_t s = 0; s < DIR_SHARDS_MAX; s++)
        for (int r = 0; r < ROLES; r++) pthread_mutex_init(&d->shards[s].conn[r].mu, NULL);
    memset(d->slots, DIR_NO_SHARD, sizeof d->slots);
    atomic_init(&d->generation, 1);
    atomic_init(&d->down, false);
    *out = d;
    return KVT_OK;
}

static void dir_free(kvt_dir *d)
{
    for (uint32_t s = 0; s < DIR_SHARDS_MAX; s++)
        for (int r = 0; r < ROLES; r++) {
            conn_drop(&d->shards[s].conn[r]);
            pthread_mutex_destroy(&d->shards[s].conn[r].mu);
        }
    pthread_mutex_destroy(&d->topo_mu);
    pthread_mutex_destroy(&d->refresh_mu);
    pthread_mutex_destroy(&d->state_mu);
    pthread_mutex_destroy(&d->lease_mu);
    explicit_bzero(d->password, sizeof d->password);
    explicit_bzero(d->sentinel_password, sizeof d->sentinel_password);
    free(d);
}

/* Writes the lease "<epoch> <advertise>" PX lease_ms into c (cmd 0). */
static void lease_cmd(kvt_dir *d, dir_cmd *c)
{
    cmd_arg(c, 0, "SET");
    node_key(d, c, d->node);
    cmd_arg(c, 2, d->lease_val);
    cmd_arg(c, 3, "PX");
    snprintf(c->num, sizeof c->num, "%" PRIu32, d->lease_ms);
    cmd_arg(c, 4, c->num);
}

/* INCR the epoch, then write the lease. */
static kvt_status dir_start(kvt_dir *d)
{
    dir_cmd c[1];
    memset(c, 0, sizeof c);
    cmd_arg(&c[0], 0, "INCR");
    cmd_key(&c[0], "%se:%s", d->prefix, d->node);
    c[0].argc = 2;
    kvt_status st = batch_exec(d, ROLE_WRITE, c, 1);
    if (!st && c[0].r->type == REDIS_REPLY_ERROR) st = reply_error(d, &c[0]);
    if (!st && c[0].r->type != REDIS_REPLY_INTEGER)
        st = kvt__fail(KVT_EPROTO, "cluster directory: INCR %s answered no integer", c[0].key);
    if (!st && c[0].r->integer <= 0)
        st = kvt__fail(KVT_EPROTO, "cluster directory: INCR %s answered %lld", c[0].key, c[0].r->integer);
    if (st) {
        if (c[0].r) freeReplyObject(c[0].r);
        return st;
    }
    d->epoch = (uint64_t)c[0].r->integer;
    freeReplyObject(c[0].r);
    snprintf(d->entry_val[0], sizeof d->entry_val[0], "%" PRIu64 " cpu", d->epoch);
    snprintf(d->entry_val[1], sizeof d->entry_val[1], "%" PRIu64 " ssd", d->epoch);
    snprintf(d->lease_val, sizeof d->lease_val, "%" PRIu64 " %s", d->epoch, d->advertise);
    memset(c, 0, sizeof c);
    lease_cmd(d, &c[0]);
    st = batch_exec(d, ROLE_WRITE, c, 1);
    if (!st) st = reply_errors(d, c, 1);
    if (c[0].r) freeReplyObject(c[0].r);
    return st;
}

kvt_status kvt__dir_open(kvt_dir **out, const kvt_dir_config *cfg)
{
    KVT_CHECK_NOT_NULL(out, "kvt__dir_open");
    *out = NULL;
    KVT_CHECK_NOT_NULL(cfg, "kvt__dir_open");
    kvt_dir *d = NULL;
    kvt_status st = dir_alloc(&d);
    if (st) return st;
    st = check_config(d, cfg);
    if (!st && d->mode == MODE_SINGLE) {
        memcpy(d->shards[0].addr, d->seeds[0], KVT_DIR_ADDR_MAX);
        d->nshards = 1;
    } else if (!st && d->mode == MODE_SENTINEL) {
        d->nshards = 1;
        st = sentinel_ask(d);
    } else if (!st) {
        bool changed;
        st = cluster_refresh(d, NULL, &changed);
    }
    if (!st && !d->watch_only) st = dir_start(d);
    if (!st && d->mode != MODE_CLUSTER) { /* the lookup connection now, so a bad one shows at open */
        pthread_mutex_lock(&d->shards[0].conn[ROLE_LOOKUP].mu);
        st = conn_ensure(d, 0, &d->shards[0].conn[ROLE_LOOKUP]);
        pthread_mutex_unlock(&d->shards[0].conn[ROLE_LOOKUP].mu);
    }
    if (st) {
        dir_free(d);
        return st;
    }
    d->opened = true;
    *out = d;
    return KVT_OK;
}

void kvt__dir_close(kvt_dir *d)
{
    if (!d) return;
    if (d->watch_only) {
        dir_free(d);
        return;
    }
    dir_cmd c[1];
    memset(c, 0, sizeof c);
    /* only the lease of this life: a node restarted while this handle
     * lingered has written its own, which must stay */
    static const char del_if_ours[] =
        "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0";
    cmd_arg(&c[0], 0, "EVAL");
    node_key(d, &c[0], d->node);
    c[0].argv[3] = c[0].key;
    c[0].len[3] = c[0].len[1];
    cmd_arg(&c[0], 1, del_if_ours);
    cmd_arg(&c[0], 2, "1");
    cmd_arg(&c[0], 4, d->lease_val);
    if (batch_exec(d, ROLE_WRITE, c, 1) != KVT_OK)
        KVT_LOG(KVT_LOG_DEBUG, "cluster directory: node %s left without deleting its lease (%s); it "
                "expires in %u ms", d->node, kvt_last_error(), d->lease_ms);
    if (c[0].r) freeReplyObject(c[0].r);
    dir_free(d);
}

uint64_t kvt__dir_epoch(const kvt_dir *d)
{
    return d ? d->epoch : 0;
}

uint64_t kvt__dir_generation(const kvt_dir *d)
{
    return d ? atomic_load(&((kvt_dir *)d)->generation) : 0;
}

uint64_t kvt__dir_redirects(const kvt_dir *d)
{
    return d ? atomic_load(&((kvt_dir *)d)->redirects) : 0;
}

bool kvt__dir_up(const kvt_dir *d)
{
    return d && !atomic_load(&((kvt_dir *)d)->down);
}

/* ------------------------------------------------------------------ */
/* Publish, unpublish, renew, forget                                  */
/* ------------------------------------------------------------------ */

static kvt_status check_blocks(const kvt_dir *d, const kvt_hash128 *h, uint32_t n, const char *fn)
{
    KVT_CHECK_ARG(d != NULL, "%s: d is NULL", fn);
    KVT_CHECK_ARG(h != NULL || n == 0, "%s: h is NULL with n = %u", fn, n);
    return KVT_OK;
}

/* HSET node "<epoch> <tier>" + PEXPIRE 4 x lease for h[0..n) (tier[i]
 * each; NULL: cpu) into c[0..2n). */
static void publish_cmds(kvt_dir *d, dir_cmd *c, uint64_t space, const kvt_hash128 *h,
                         const uint8_t *tier, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        dir_cmd *a = &c[2 * i], *b = &c[2 * i + 1];
        cmd_arg(a, 0, "HSET");
        block_key(d, a, space, h[i]);
        cmd_arg(a, 2, d->node);
        cmd_arg(a, 3, d->entry_val[tier && tier[i] == KVT_DIR_TIER_SSD]);
        cmd_arg(b, 0, "PEXPIRE");
        block_key(d, b, space, h[i]);
        snprintf(b->num, sizeof b->num, "%" PRIu64, (uint64_t)d->lease_ms * 4);
        cmd_arg(b, 2, b->num);
    }
}

/* Batches of DIR_BATCH blocks, each one round trip; with lease, the
 * lease's SET rides in the first. */
static kvt_status write_blocks(kvt_dir *d, uint64_t space, const kvt_hash128 *h,
                               const uint8_t *tier, uint32_t n, bool del, bool lease)
{
    if (d->watch_only)
        return kvt__fail(KVT_ESTATE, "cluster directory: opened watch-only (node %s): it "
                         "writes nothing", d->node);
    uint32_t per = del ? 1 : 2;
    dir_cmd *c;
    kvt_status st = cmds_alloc(&c, (size_t)DIR_BATCH * per + 1);
    if (st) return st;
    uint32_t i = 0;
    do {
        uint32_t m = n - i < DIR_BATCH ? n - i : DIR_BATCH;
        size_t k = lease ? 1 : 0;
        memset(c, 0, ((size_t)DIR_BATCH * per + 1) * sizeof *c);
        if (lease) lease_cmd(d, &c[0]);
        if (del) {
            for (uint32_t j = 0; j < m; j++) {
                cmd_arg(&c[k + j], 0, "HDEL");
                block_key(d, &c[k + j], space, h[i + j]);
                cmd_arg(&c[k + j], 2, d->node);
            }
        } else {
            publish_cmds(d, &c[k], space, h ? h + i : NULL, tier ? tier + i : NULL, m);
        }
        k += (size_t)m * per;
        st = batch_exec(d, ROLE_WRITE, c, k);
        if (!st) st = reply_errors(d, c, k);
        for (size_t j = 0; j < k; j++)
            if (c[j].r) freeReplyObject(c[j].r);
        lease = false;
        i += m;
    } while (!st && i < n);
    free(c);
    return st;
}

kvt_status kvt__dir_publish_tiers(kvt_dir *d, uint64_t space, const kvt_hash128 *h,
                                  const uint8_t *tier, uint32_t n)
{
    kvt_status st = check_blocks(d, h, n, "kvt__dir_publish");
    if (st || n == 0) return st;
    return write_blocks(d, space, h, tier, n, false, false);
}

kvt_status kvt__dir_publish(kvt_dir *d, uint64_t space, const kvt_hash128 *h, uint32_t n)
{
    return kvt__dir_publish_tiers(d, space, h, NULL, n);
}

kvt_status kvt__dir_unpublish(kvt_dir *d, uint64_t space, const kvt_hash128 *h, uint32_t n)
{
    kvt_status st = check_blocks(d, h, n, "kvt__dir_unpublish");
    if (st || n == 0) return st;
    return write_blocks(d, space, h, NULL, n, true, false);
}

kvt_status kvt__dir_renew_tiers(kvt_dir *d, uint64_t space, const kvt_hash128 *h,
                                const uint8_t *tier, uint32_t n)
{
    kvt_status st = check_blocks(d, h, n, "kvt__dir_renew");
    if (st) return st;
    return write_blocks(d, space, h, tier, n, false, true);
}

kvt_status kvt__dir_renew(kvt_dir *d, uint64_t space, const kvt_hash128 *h, uint32_t n)
{
    return kvt__dir_renew_tiers(d, space, h, NULL, n);
}

kvt_status kvt__dir_set_holding(kvt_dir *d, const kvt_dir_holding *h)
{
    KVT_CHECK_NOT_NULL(d, "kvt__dir_set_holding");
    KVT_CHECK_NOT_NULL(h, "kvt__dir_set_holding");
    if (d->watch_only)
        return kvt__fail(KVT_ESTATE, "cluster directory: opened watch-only (node %s): it "
                         "writes nothing", d->node);
    dir_cmd c[1];
    memset(c, 0, sizeof c);
    char val[96], px[24];
    snprintf(val, sizeof val, "%" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64, h->blocks, h->bytes,
             h->cpu_blocks, h->ssd_blocks);
    snprintf(px, sizeof px, "%" PRIu64, 2 * (uint64_t)d->lease_ms);
    cmd_arg(&c[0], 0, "SET");
    holding_key(d, &c[0], d->node);
    cmd_arg(&c[0], 2, val);
    cmd_arg(&c[0], 3, "PX");
    cmd_arg(&c[0], 4, px);
    kvt_status st = batch_exec(d, ROLE_WRITE, c, 1);
    if (!st) st = reply_errors(d, c, 1);
    if (c[0].r) freeReplyObject(c[0].r);
    return st;
}

kvt_status kvt__dir_forget(kvt_dir *d, uint64_t space, const kvt_hash128 *h, const char *node)
{
    KVT_CHECK_NOT_NULL(d, "kvt__dir_forget");
    KVT_CHECK_NOT_NULL(h, "kvt__dir_forget");
    KVT_CHECK_ARG(node && kvt__dir_node_ok(node), "kvt__dir_forget: node \"%s\" is not 1..%d bytes of [A-Za-z0-9._-]",
                  node ? node : "(null)", KVT_DIR_NODE_MAX - 1);
    dir_cmd c[1];
    memset(c, 0, sizeof c);
    cmd_arg(&c[0], 0, "HDEL");
    block_key(d, &c[0], space, *h);
    cmd_arg(&c[0], 2, node);
    kvt_status st = batch_exec(d, ROLE_WRITE, c, 1);
    if (!st) st = reply_errors(d, c, 1);
    if (c[0].r) freeReplyObject(c[0].r);
    return st;
}

/* ------------------------------------------------------------------ */
/* Lookup                                                             */
/* ------------------------------------------------------------------ */

static lease_ent *lease_slot(kvt_dir *d, const char *node)
{
    return &d->leases[kvt__hash64(node, strlen(node), 0x6b76742d6469722eull) % DIR_LEASE_CACHE];
}

/* Whether the cached lease e of node must be read again: another node's
 * slot, older than lease_ms/4, or naming an epoch below the one an entry
 * carries (the node restarted since). */
static bool lease_stale(const kvt_dir *d, const lease_ent *e, const char *node, uint64_t epoch,
                        uint64_t now)
{
    if (e->seen_ns == 0 || strcmp(e->node, node) != 0) return true;
    if (now - e->seen_ns > (uint64_t)d->lease_ms / 4 * 1000000ull) return true;
    return e->live && e->epoch < epoch;
}

/* Field i of a block entry's HGETALL answer (r has i + 1 elements at
 * least): a holder other than this node (dir_decode.h). */
static bool holder_at(const kvt_dir *d, const redisReply *r, size_t i, const char **node,
                      uint64_t *epoch, uint8_t *tier)
{
    return kvt__dir_holder_reply(r->element[i], r->element[i + 1], d->node, node, epoch, tier);
}

static lease_ent *lease_in(lease_ent *l, uint32_t n, const char *node)
{
    for (uint32_t i = 0; i < n; i++)
        if (strcmp(l[i].node, node) == 0) return &l[i];
    return NULL;
}

/* The leases of the holders of blocks[0..n) (HGETALL replies), one entry
 * a node: copied from the cache where it can vouch, else marked
 * (seen_ns 0) to be read. Copies, because reading one lease into the
 * direct-mapped cache may evict another this batch needs. At most
 * DIR_BATCH_NODES nodes; a holder past that is not trusted. */
static uint32_t leases_gather(kvt_dir *d, const dir_cmd *blocks, uint32_t n, lease_ent *l)
{
    uint32_t nl = 0;
    uint64_t now = kvt__now_ns();
    pthread_mutex_lock(&d->lease_mu);
    for (uint32_t b = 0; b < n; b++) {
        const redisReply *r = blocks[b].r;
        for (size_t i = 0; i + 1 < r->elements; i += 2) {
            const char *node;
            uint64_t ep;
            uint8_t tier;
            if (!holder_at(d, r, i, &node, &ep, &tier)) continue;
            lease_ent *e = lease_in(l, nl, node);
            if (e) {
                if (e->seen_ns && lease_stale(d, e, node, ep, now)) e->seen_ns = 0; /* a newer epoch */
                continue;
            }
            if (nl == DIR_BATCH_NODES) continue;
            e = &l[nl++];
            *e = *lease_slot(d, node);
            if (lease_stale(d, e, node, ep, now)) {
                memset(e, 0, sizeof *e);
                snprintf(e->node, sizeof e->node, "%s", node);
            }
        }
    }
    pthread_mutex_unlock(&d->lease_mu);
    return nl;
}

/* Reads the leases marked in l[0..nl) in one pipelined round trip, into
 * l and the cache. */
static kvt_status leases_read(kvt_dir *d, lease_ent *l, uint32_t nl)
{
    uint32_t nw = 0;
    for (uint32_t i = 0; i < nl; i++) nw += l[i].seen_ns == 0;
    if (nw == 0) return KVT_OK;
    dir_cmd *c;
    kvt_status st = cmds_alloc(&c, nw);
    if (st) return st;
    for (uint32_t i = 0, k = 0; i < nl; i++) {
        if (l[i].seen_ns) continue;
        cmd_arg(&c[k], 0, "GET");
        node_key(d, &c[k], l[i].node);
        c[k++].argc = 2;
    }
    st = batch_exec(d, ROLE_LOOKUP, c, nw);
    if (!st) st = reply_errors(d, c, nw);
    uint64_t now = kvt__now_ns();
    pthread_mutex_lock(&d->lease_mu);
    for (uint32_t i = 0, k = 0; i < nl && !st; i++) {
        if (l[i].seen_ns) continue;
        lease_ent *e = &l[i];
        const redisReply *r = c[k++].r;
        e->seen_ns = now ? now : 1;
        if (r->type == REDIS_REPLY_STRING) /* a malformed lease vouches for nothing */
            e->live = kvt__dir_lease_decode(r->str, r->len, &e->epoch, e->addr, sizeof e->addr) == KVT_OK;
        *lease_slot(d, e->node) = *e;
    }
    pthread_mutex_unlock(&d->lease_mu);
    cmds_free(c, nw);
    return st;
}

/* The holder of a block to use: prev's node when it is a trusted holder
 * (a run from one peer), else a trusted holder with a CPU copy, else one
 * whose tier is unknown (version 1), else one with the SSD only; the
 * lowest node id among equals. False when none. */
static bool pick(const kvt_dir *d, const redisReply *r, const char *prev, lease_ent *l, uint32_t nl,
                 kvt_dir_holder *out)
{
    static const int rank[] = {[KVT_DIR_TIER_CPU] = 0, [KVT_DIR_TIER_UNKNOWN] = 1,
                               [KVT_DIR_TIER_SSD] = 2};
    const lease_ent *best = NULL;
    uint8_t best_tier = KVT_DIR_TIER_UNKNOWN;
    for (size_t i = 0; i + 1 < r->elements; i += 2) {
        const char *node;
        uint64_t ep;
        uint8_t tier;
        if (!holder_at(d, r, i, &node, &ep, &tier)) continue;
        const lease_ent *e = lease_in(l, nl, node);
        if (!e || !e->live || e->epoch != ep) continue;
        if (prev && strcmp(node, prev) == 0) {
            best = e;
            best_tier = tier;
            break;
        }
        if (!best || rank[tier] < rank[best_tier] ||
            (rank[tier] == rank[best_tier] && strcmp(node, best->node) < 0)) {
            best = e;
            best_tier = tier;
        }
    }
    if (!best) return false;
    memcpy(out->node, best->node, sizeof out->node);
    memcpy(out->addr, best->addr, sizeof out->addr);
    out->epoch = best->epoch;
    out->tier = best_tier;
    return true;
}

/* One batch of at most DIR_BATCH blocks: the entries, the leases, then
 * the walk. *got: leading blocks with a holder. */
static kvt_status lookup_batch(kvt_dir *d, dir_cmd *c, uint64_t space, const kvt_hash128 *h,
                               uint32_t n, kvt_dir_holder *out, const char *prev, uint32_t *got)
{
    *got = 0;
    for (uint32_t i = 0; i < n; i++) {
        cmd_arg(&c[i], 0, "HGETALL");
        block_key(d, &c[i], space, h[i]);
        c[i].argc = 2;
    }
    kvt_status st = batch_exec(d, ROLE_LOOKUP, c, n);
    if (!st) st = reply_errors(d, c, n);
    uint32_t held = 0; /* leading blocks with any entry */
    for (; !st && held < n; held++) {
        if (c[held].r->type != REDIS_REPLY_ARRAY)
            st = kvt__fail(KVT_EPROTO, "cluster directory: HGETALL %s answered no array", c[held].key);
        else if (c[held].r->elements == 0)
            break;
    }
    if (st || held == 0) return st;
    lease_ent *l = calloc(DIR_BATCH_NODES, sizeof *l);
    if (!l) return kvt__fail(KVT_ENOMEM, "cluster directory: out of memory for a lookup's leases");
    uint32_t nl = leases_gather(d, c, held, l);
    st = leases_read(d, l, nl);
    uint32_t k = 0;
    for (; !st && k < held; k++) {
        if (!pick(d, c[k].r, prev, l, nl, &out[k])) break;
        prev = out[k].node;
    }
    free(l);
    *got = k;
    return st;
}

kvt_status kvt__dir_lookup(kvt_dir *d, uint64_t space, const kvt_hash128 *h, uint32_t n,
                           kvt_dir_holder *out, uint32_t *found)
{
    kvt_status st = check_blocks(d, h, n, "kvt__dir_lookup");
    if (st) return st;
    KVT_CHECK_NOT_NULL(found, "kvt__dir_lookup");
    KVT_CHECK_ARG(out != NULL || n == 0, "kvt__dir_lookup: out is NULL with n = %u", n);
    *found = 0;
    if (n == 0) return KVT_OK;
    dir_cmd *c;
    st = cmds_alloc(&c, DIR_BATCH);
    if (st) return st;
    for (uint32_t i = 0; i < n && !st;) {
        uint32_t m = n - i < DIR_BATCH ? n - i : DIR_BATCH, got;
        memset(c, 0, (size_t)DIR_BATCH * sizeof *c);
        st = lookup_batch(d, c, space, h + i, m, out + i, i ? out[i - 1].node : NULL, &got);
        for (uint32_t j = 0; j < m; j++)
            if (c[j].r) freeReplyObject(c[j].r), c[j].r = NULL;
        if (st) break;
        i += got;
        *found = i;
        if (got < m) break;
    }
    if (!st && *found < n) memset(&out[*found], 0, sizeof *out); /* node "": no holder */
    free(c);
    return st;
}

/* ------------------------------------------------------------------ */
/* Nodes and topology                                                 */
/* ------------------------------------------------------------------ */

/* "<prefix>n:*" with the prefix's glob characters escaped. */
static void scan_pattern(const kvt_dir *d, char *out, size_t len)
{
    size_t k = 0;
    for (const char *p = d->prefix; *p && k + 6 < len; p++) {
        if (strchr("*?[]\\", *p)) out[k++] = '\\';
        out[k++] = *p;
    }
    snprintf(out + k, len - k, "n:*");
}

static int name_cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Every node id with a lease key, from a SCAN of every primary; at most
 * DIR_NODES_LIST_MAX kept (*total counts all). */
static kvt_status scan_nodes(kvt_dir *d, char ***names, uint32_t *kept, uint32_t *total)
{
    uint8_t shard[DIR_SHARDS_MAX];
    uint32_t ns = 0;
    pthread_mutex_lock(&d->topo_mu);
    bool seen[DIR_SHARDS_MAX] = {false};
    for (uint32_t k = 0; k < DIR_SLOTS && d->mode == MODE_CLUSTER; k++)
        if (d->slots[k] != DIR_NO_SHARD && !seen[d->slots[k]]) {
            seen[d->slots[k]] = true;
            shard[ns++] = d->slots[k];
        }
    pthread_mutex_unlock(&d->topo_mu);
    if (d->mode != MODE_CLUSTER) shard[ns++] = 0;
    char pat[2 * DIR_PREFIX_MAX + 8];
    scan_pattern(d, pat, sizeof pat);
    size_t plen = strlen(d->prefix) + 2, cap = 0;
    kvt_status st = KVT_OK;
    for (uint32_t s = 0; s < ns && !st; s++) {
        char cursor[KVT_DIR_CURSOR_MAX] = "0";
        do {
            dir_cmd c[1];
            memset(c, 0, sizeof c);
            const char *argv[] = {"SCAN", cursor, "MATCH", pat, "COUNT", "1000"};
            for (int i = 0; i < 6; i++) cmd_arg(&c[0], i, argv[i]);
            snprintf(c[0].key, sizeof c[0].key, "%s", pat);
            c[0].shard = shard[s];
            c[0].fixed = true;
            st = batch_exec(d, ROLE_LOOKUP, c, 1);
            if (!st) st = reply_errors(d, c, 1);
            const redisReply *keys = NULL;
            char next[KVT_DIR_CURSOR_MAX];
            if (!st) st = kvt__dir_scan_reply(c[0].r, next, &keys);
            for (size_t i = 0; !st && i < keys->elements; i++) {
                const redisReply *k = keys->element[i];
                if (k->type != REDIS_REPLY_STRING || k->len <= plen || !kvt__dir_node_ok(k->str + plen)) continue;
                (*total)++;
                if (*kept == DIR_NODES_LIST_MAX) continue;
                if (*kept == cap) {
                    size_t nc = cap ? 2 * cap : 64;
                    char **g = realloc(*names, nc * sizeof *g);
                    if (!g) st = kvt__fail(KVT_ENOMEM, "cluster directory: out of memory listing nodes");
                    else *names = g, cap = nc;
                }
                if (!st && !((*names)[*kept] = strdup(k->str + plen)))
                    st = kvt__fail(KVT_ENOMEM, "cluster directory: out of memory listing nodes");
                if (!st) (*kept)++;
            }
            if (!st) memcpy(cursor, next, sizeof cursor);
            if (c[0].r) freeReplyObject(c[0].r);
        } while (!st && strcmp(cursor, "0") != 0);
    }
    return st;
}

/* GET + PTTL of names[0..n) into out; *have counts those still there. */
static kvt_status read_nodes(kvt_dir *d, char **names, uint32_t n, kvt_dir_node *out, uint32_t *have)
{
    dir_cmd *c;
    kvt_status st = cmds_alloc(&c, 3 * (size_t)n);
    if (st) return st;
    for (uint32_t i = 0; i < n; i++) {
        cmd_arg(&c[3 * i], 0, "GET");
        node_key(d, &c[3 * i], names[i]);
        c[3 * i].argc = 2;
        cmd_arg(&c[3 * i + 1], 0, "PTTL");
        node_key(d, &c[3 * i + 1], names[i]);
        c[3 * i + 1].argc = 2;
        cmd_arg(&c[3 * i + 2], 0, "GET");
        holding_key(d, &c[3 * i + 2], names[i]);
        c[3 * i + 2].argc = 2;
    }
    st = batch_exec(d, ROLE_LOOKUP, c, 3 * (size_t)n);
    if (!st) st = reply_errors(d, c, 3 * (size_t)n);
    *have = 0;
    for (uint32_t i = 0; i < n && !st; i++) {
        const redisReply *v = c[3 * i].r, *t = c[3 * i + 1].r, *h = c[3 * i + 2].r;
        kvt_dir_node *o = &out[*have];
        if (v->type != REDIS_REPLY_STRING || t->type != REDIS_REPLY_INTEGER || t->integer == -2)
            continue; /* expired since the SCAN, or between GET and PTTL */
        if (kvt__dir_lease_decode(v->str, v->len, &o->epoch, o->addr, sizeof o->addr)) continue;
        snprintf(o->node, sizeof o->node, "%s", names[i]);
        o->lease_left_ms = t->integer;
        o->held = (kvt_dir_holding){0}; /* none written yet, or a malformed one */
        if (h->type == REDIS_REPLY_STRING && kvt__dir_holding_decode(h->str, h->len, &o->held))
            o->held = (kvt_dir_holding){0};
        (*have)++;
    }
    cmds_free(c, 3 * (size_t)n);
    return st;
}

kvt_status kvt__dir_nodes(kvt_dir *d, kvt_dir_node *out, uint32_t max, uint32_t *n)
{
    KVT_CHECK_NOT_NULL(d, "kvt__dir_nodes");
    KVT_CHECK_NOT_NULL(n, "kvt__dir_nodes");
    KVT_CHECK_ARG(out != NULL || max == 0, "kvt__dir_nodes: out is NULL with max = %u", max);
    *n = 0;
    char **names = NULL;
    uint32_t kept = 0, total = 0;
    kvt_status st = scan_nodes(d, &names, &kept, &total);
    if (!st && kept > 0) {
        /* a node seen on two shards' SCANs (a slot migrating) counts once */
        qsort(names, kept, sizeof *names, name_cmp);
        uint32_t u = 0;
        for (uint32_t i = 0; i < kept; i++) {
            if (u && strcmp(names[u - 1], names[i]) == 0) {
                free(names[i]);
                total--;
                continue;
            }
            names[u++] = names[i];
        }
        kept = u;
    }
    uint32_t want = kept < max ? kept : max, have = 0;
    if (!st && want > 0) st = read_nodes(d, names, want, out, &have);
    if (!st) *n = total - (want - have); /* those that expired between SCAN and GET are gone */
    for (uint32_t i = 0; i < kept; i++) free(names[i]);
    free(names);
    return st;
}

void kvt__dir_topology(kvt_dir *d, char *buf, size_t len)
{
    if (!buf || len == 0) return;
    if (!d) {
        snprintf(buf, len, "none");
        return;
    }
    pthread_mutex_lock(&d->topo_mu);
    if (d->mode == MODE_SINGLE) snprintf(buf, len, "redis %s", d->shards[0].addr);
    else if (d->mode == MODE_SENTINEL)
        snprintf(buf, len, "sentinel primary %s at %s", d->name, d->shards[0].addr);
    else snprintf(buf, len, "cluster of %u primar%s", d->nprimaries, d->nprimaries == 1 ? "y" : "ies");
    pthread_mutex_unlock(&d->topo_mu);
}

/* The password file's bytes buf[0..*n): one trailing newline dropped,
 * then 1..KVT_DIR_PASSWORD_MAX bytes with no NUL or line break. The read
 * takes up to 3 bytes past the bound, so a file longer than a password and
 * its line end is seen to be. */
static kvt_status check_password(const char *buf, ssize_t *np, const char *path, const char *who)
{
    ssize_t n = *np;
    bool over = n > KVT_DIR_PASSWORD_MAX + 2; /* too many, whatever ends it */
    if (!over && n > 0 && buf[n - 1] == '\n') n--;
    if (!over && n > 0 && buf[n - 1] == '\r') n--;
    if (n == 0 || n > KVT_DIR_PASSWORD_MAX)
        return kvt__fail(KVT_EINVAL, "%s: password file %s holds %s bytes (want 1..%d, one "
                         "trailing newline allowed)", who, path, n ? "too many" : "no",
                         KVT_DIR_PASSWORD_MAX);
    for (ssize_t i = 0; i < n; i++)
        if (buf[i] == '\0' || buf[i] == '\n' || buf[i] == '\r')
            return kvt__fail(KVT_EINVAL, "%s: password file %s holds a %s at byte %zd (one "
                             "password on one line)", who, path,
                             buf[i] ? "line break" : "NUL byte", i);
    *np = n;
    return KVT_OK;
}

kvt_status kvt__dir_password_load(const char *path, const char *who,
                                  char out[KVT_DIR_PASSWORD_MAX + 1])
{
    KVT_CHECK_ARG(path && who && out, "kvt__dir_password_load: an argument is NULL");
    char buf[KVT_DIR_PASSWORD_MAX + 3];
    ssize_t n = 0;
    kvt_status st = kvt__read_user_file(path, who, "password", buf, sizeof buf, &n);
    if (!st) st = check_password(buf, &n, path, who);
    if (st) {
        explicit_bzero(buf, sizeof buf);
        return st;
    }
    memcpy(out, buf, (size_t)n);
    out[n] = '\0';
    explicit_bzero(buf, sizeof buf);
    return KVT_OK;
}
