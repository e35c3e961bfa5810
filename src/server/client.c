/* client.c - kvt_client_*: an engine process attached to the node server.
 *
 * The client maps the server's CPU tier (a memfd passed at attach) and moves
 * bytes between its engine pages and the tier with its own transfer engine
 * (src/xfer, the copy ops table). Each call is one round trip on the socket,
 * serialised by io_mu; a launched task ends on a copy thread, which sends
 * END (with each stored block's checksum) and keeps the server's answer
 * as the task's result for wait or poll (a store's check runs on the server
 * after that answer). A round trip that fails or passes
 * its deadline breaks the connection for good: every later call gives
 * KVT_ECONN naming the socket (the engine recomputes; re-attach). */
#include <errno.h>
#include <poll.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "cache/cache.h"
#include "cache/tasks.h"
#include "cuda/cuda.h"
#include "layout/layout.h"
#include "net/fdio.h"
#include "net/stream.h"
#include "server/answers.h"
#include "server/proto.h"
#include "server/server.h"
#include "store/pool.h"
#include "util/clock.h"
#include "util/err.h"
#include "util/log.h"
#include "util/sync.h"
#include "xfer/xfer.h"

/* A pending load (the server reads its blocks from SSD) is polled first
 * every 50 us, backing off to 2 ms, for read_ms at most (server_read_ms). */
#define POLL_FIRST_NS 50000ull
#define POLL_MAX_NS 2000000ull

typedef enum { CT_PLANNED, CT_RUNNING, CT_ENDED } ct_state;

typedef struct ctask {
    kvt_task_id id;
    kvt_task_kind kind;
    ct_state state;
    uint32_t epoch;      /* the connection it was planned on */
    uint32_t first_token, num_tokens; /* as planned */
    kvt_task_result result;
    uint64_t end_seq;    /* order of ending, for poll */
    uint32_t refs;       /* threads inside wait_layer */
    bool reported;
    bool copying;        /* submitted to the transfer engine (under mu) */
    bool pending;        /* launched, the server still reads its blocks from SSD
                            (under mu; only the launcher thread clears it) */
    bool cancel_asked;   /* kvt_client_cancel of a pending task (under mu) */
    bool visible_at_end; /* a store planned KVT_REQ_VISIBLE_AT_END: ends by END_SYNC */
    uint64_t pending_deadline_ns; /* read_ms after its launch */
    uint8_t **blocks;
    uint32_t *pages;
    uint64_t *offsets;
    uint64_t *layer_sums; /* num_blocks x num_layers: a store's from its copy, a load's
                             from its launch (what its copy is checked against) */
    kvt_status bad_status; /* a load's, from its launch: why it was cut short */
    kvt_xfer_task xt;
    struct kvt_client *cl;
} ctask;

struct kvt_client {
    char path[108];
    int fd;
    int64_t timeout_ms;
    uint32_t read_ms;       /* server_read_ms (KVTIER_SERVER_READ_MS) */
    uint32_t spin_us;       /* server_spin_us (KVTIER_SERVER_SPIN_US) */
    uint32_t workers;       /* copy threads: workers (KVTIER_WORKERS) */
    uint32_t block_tokens;  /* asked for at HELLO (KVTIER_BLOCK_TOKENS; the server's
                               GEOMETRY reply's when attached without a geometry), or 0 */
    pthread_mutex_t io_mu;  /* one round trip at a time */
    bool broken;            /* under io_mu */
    bool unsettled;         /* under io_mu: the last round trip was an END (detach makes
                               one more, so that store is committed before it returns) */
    char broken_msg[256];
    uint64_t retry_ns;      /* under io_mu: no re-attach before this */
    uint32_t backoff_ms;    /* under io_mu: 10 ms doubling to 1 s */
    uint32_t epoch;         /* under mu: bumped by each re-attach */
    kvt_geometry *geo;
    uint64_t session;       /* random, sent in SESSION at each attach */
    uint8_t *secret;        /* KVTIER_SERVER_SECRET_FILE's bytes, or NULL */
    size_t secret_len;
    uint8_t *tier;
    kvt_srv_hello_rep shm;
    /* Engine memory on a CUDA device: the copy backend, set once by
     * kvt_client_register_memory (under io_mu and mu); the tier mapping is
     * pinned in it while mapped (tier_unmap unpins). */
    kvt_cuda_backend *cuda;
    kvt_xfer *xfer;
    pthread_mutex_t mu;     /* tasks, memory */
    pthread_cond_t cv;
    bool memory_registered, detaching;
    kvt_page_map map;
    ctask **tasks;
    uint32_t ntasks, cap;
    uint64_t end_seq;
    pthread_t launcher;     /* finishes pending launches (started on the first) */
    bool launcher_started;  /* under mu */
    pthread_cond_t lcv;     /* wakes the launcher: a new pending task, detach */
    uint64_t requests;      /* under io_mu: requests sent (kvt__client_requests) */
};

/* ------------------------------------------------------------------ */
/* Round trips                                                        */

static kvt_status broken_fail(kvt_client *cl, const char *fn)
{
    return kvt__fail(KVT_ECONN, "%s: kvtier server at %s: %s", fn, cl->path, cl->broken_msg);
}

/* Sends op with payload b and receives its reply (payload into *rep, the
 * caller frees). A failure status from the server comes back as the status
 * with the server's message. */
static kvt_status open_conn(kvt_client *cl, uint64_t connect_deadline);
static kvt_status hello_locked(kvt_client *cl);
static kvt_status session_locked(kvt_client *cl, bool resumed);

/* Drops the server's tier mapping (unpinned first when CUDA copies use it). */
static void tier_unmap(kvt_client *cl)
{
    if (!cl->tier) return;
    if (cl->cuda) kvt__cuda_backend_unpin(cl->cuda, cl->tier);
    munmap(cl->tier, cl->shm.map_bytes);
    cl->tier = NULL;
}

/* A broken connection is re-established by a later call, at most once per
 * backoff (10 ms doubling to 1 s), and only when no task of this client is
 * running (copying into, or being launched on, the old server's tier, whose
 * mapping is dropped here). Tasks of
 * the old connection are gone with it: they report KVT_ECONN. io_mu held. */
static kvt_status reattach(kvt_client *cl, const char *fn)
{
    uint64_t now = kvt__now_ns();
    if (now < cl->retry_ns) return broken_fail(cl, fn);
    cl->backoff_ms = cl->backoff_ms ? cl->backoff_ms * 2 : 10;
    if (cl->backoff_ms > 1000) cl->backoff_ms = 1000;
    cl->retry_ns = now + (uint64_t)cl->backoff_ms * 1000000ull;
    pthread_mutex_lock(&cl->mu);
    /* A running task is copying into the old tier, or being launched (its
     * block addresses are being computed from it): wait for those. */
    bool copying = false;
    for (uint32_t i = 0; i < cl->ntasks; i++) copying |= cl->tasks[i]->state == CT_RUNNING;
    if (!copying) cl->epoch++; /* launches of older plans now fail before copying */
    pthread_mutex_unlock(&cl->mu);
    if (copying) return broken_fail(cl, fn);
    tier_unmap(cl);
    close(cl->fd);
    cl->fd = -1;
    char keep[sizeof cl->broken_msg];
    snprintf(keep, sizeof keep, "%s", cl->broken_msg);
    kvt_status st = open_conn(cl, now); /* one try: the backoff spaces the next */
    if (!st) {
        cl->broken = false; /* hello's round trip needs the stream */
        st = hello_locked(cl);
        /* No copy of ours runs (checked above) and the old mapping is gone:
         * the server may free the blocks it fenced when it cut us off. */
        if (!st) st = session_locked(cl, true);
    }
    if (st) {
        cl->broken = true;
        snprintf(cl->broken_msg, sizeof cl->broken_msg, "%.100s; re-attach failed: %.120s",
                 keep, kvt_last_error());
        return broken_fail(cl, fn);
    }
    cl->backoff_ms = 0;
    cl->retry_ns = 0;
    return KVT_OK;
}

/* A round trip failed with st: the stream is out of step now, so no later
 * call may use it (io_mu held). What the caller gets: a malformed reply,
 * or no memory to take it in, is not the server going away and keeps its
 * own status; anything else (no reply in time, a send or receive failing)
 * is KVT_ECONN naming the socket. */
static kvt_status lost(kvt_client *cl, const char *fn, kvt_status st)
{
    cl->broken = true;
    if (st == KVT_ETIMEDOUT)
        snprintf(cl->broken_msg, sizeof cl->broken_msg, "no reply within %lld ms",
                 (long long)cl->timeout_ms);
    else if (st == KVT_ECONN)
        snprintf(cl->broken_msg, sizeof cl->broken_msg, "connection lost (the server "
                 "stopped or died)");
    else
        snprintf(cl->broken_msg, sizeof cl->broken_msg, "%s (%s)", kvt_status_name(st),
                 kvt_last_error());
    shutdown(cl->fd, SHUT_RDWR);
    switch (st) {
    case KVT_EPROTO:
        return kvt__fail(KVT_EPROTO, "%s: kvtier server at %s: %s", fn, cl->path, cl->broken_msg);
    case KVT_EVERSION:
        return kvt__fail(KVT_EVERSION, "%s: kvtier server at %s: %s", fn, cl->path,
                         cl->broken_msg);
    case KVT_ENOMEM:
        return kvt__fail(KVT_ENOMEM, "%s: kvtier server at %s: %s", fn, cl->path, cl->broken_msg);
    default:
        return broken_fail(cl, fn);
    }
}

/* The reply to a request just sent: polled for up to server_spin_us first
 * (it is usually microseconds away), then waited for until deadline. */
static kvt_status recv_reply(kvt_client *cl, kvt_srv_hdr *h, uint8_t **p, int *fd_got,
                             uint64_t deadline)
{
    if (cl->spin_us) kvt__fd_spin(cl->fd, cl->spin_us);
    return kvt__srv_recv_frame(cl->fd, h, p, fd_got, deadline);
}

/* The failure the server answered request op with (h->status != 0): its
 * status and message, or KVT_EPROTO when the status is none the server's
 * handler of op can answer (answers.h), so a call never hands the engine a
 * status its documentation does not list. */
static kvt_status answered_failure(const char *fn, uint16_t op, const kvt_srv_hdr *h, const uint8_t *p)
{
    int len = h->len > KVT_SRV_MAX_ERRMSG ? (int)KVT_SRV_MAX_ERRMSG : (int)h->len;
    const char *msg = p ? (const char *)p : "";
    if (!kvt__srv_answers_with(op, h->status))
        return kvt__fail(KVT_EPROTO, "%s: the server answered a %s with %s, which no kvtier "
                         "server answers it with (%.*s)", fn, kvt__srv_op_name(op),
                         kvt_status_name((kvt_status)h->status), len, msg);
    return kvt__fail((kvt_status)h->status, "%s: %.*s", fn, len, msg);
}

/* round_trip_ex with io_mu held (the caller's). */
static kvt_status exchange_locked(kvt_client *cl, const char *fn, uint16_t op,
                                  const kvt_srv_buf *b, uint8_t **rep, uint32_t *rep_len,
                                  int *fd_got, int64_t extra_ms)
{
    if (b->oom) return kvt__fail(KVT_ENOMEM, "%s: no memory for the request", fn);
    if (cl->broken && (op == KVT_SRV_END || op == KVT_SRV_HELLO || reattach(cl, fn)))
        return broken_fail(cl, fn);
    uint64_t deadline = kvt__deadline_ns(cl->timeout_ms + extra_ms);
    kvt_status st = kvt__srv_send_frame(cl->fd, op, 0, b->p, b->len, -1, deadline);
    cl->requests++;
    kvt_srv_hdr h = {0};
    uint8_t *p = NULL;
    if (!st) st = recv_reply(cl, &h, &p, fd_got, deadline);
    if (st == KVT_OK && h.op != (op | KVT_SRV_REPLY)) {
        free(p);
        st = kvt__fail(KVT_EPROTO, "reply op 0x%x to request op %u", h.op, op);
    }
    if (st) {
        st = lost(cl, fn, st);
        return st;
    }
    cl->unsettled = op == KVT_SRV_END;
    if (h.status != 0) {
        st = answered_failure(fn, op, &h, p);
        free(p);
        if (fd_got && *fd_got >= 0) close(*fd_got);
        return st;
    }
    *rep = p;
    *rep_len = h.len;
    return KVT_OK;
}

static kvt_status round_trip_ex(kvt_client *cl, const char *fn, uint16_t op,
                                const kvt_srv_buf *b, uint8_t **rep, uint32_t *rep_len,
                                int *fd_got, int64_t extra_ms)
{
    pthread_mutex_lock(&cl->io_mu);
    kvt_status st = exchange_locked(cl, fn, op, b, rep, rep_len, fd_got, extra_ms);
    pthread_mutex_unlock(&cl->io_mu);
    return st;
}

static kvt_status round_trip(kvt_client *cl, const char *fn, uint16_t op, const kvt_srv_buf *b,
                             uint8_t **rep, uint32_t *rep_len, int *fd_got)
{
    return round_trip_ex(cl, fn, op, b, rep, rep_len, fd_got, 0);
}

void *kvt__client_tier(kvt_client *cl, uint64_t *bytes)
{
    *bytes = cl && cl->tier ? cl->shm.map_bytes : 0;
    return cl ? cl->tier : NULL;
}

uint64_t kvt__client_requests(kvt_client *cl)
{
    if (!cl) return 0;
    /* Under io_mu: a copy thread that reported its task done early holds
     * it until its END is sent (end_early), so a count read after a wait
     * returned includes that END. */
    pthread_mutex_lock(&cl->io_mu);
    uint64_t n = cl->requests;
    pthread_mutex_unlock(&cl->io_mu);
    return n;
}

/* ------------------------------------------------------------------ */
/* Task table (under cl->mu)                                          */

static ctask *find(kvt_client *cl, kvt_task_id id)
{
    for (uint32_t i = 0; i < cl->ntasks; i++)
        if (cl->tasks[i]->id == id && !cl->tasks[i]->reported) return cl->tasks[i];
    return NULL;
}

static void ct_free(kvt_client *cl, ctask *t)
{
    for (uint32_t i = 0; i < cl->ntasks; i++)
        if (cl->tasks[i] == t) {
            cl->tasks[i] = cl->tasks[--cl->ntasks];
            break;
        }
    free(t->blocks);
    free(t->pages);
    free(t->offsets);
    free(t->layer_sums);
    free(t);
}

static kvt_status ct_add(kvt_client *cl, kvt_task_id id, kvt_task_kind kind, uint32_t first,
                         uint32_t n)
{
    ctask *t = calloc(1, sizeof *t);
    if (!t) return kvt__fail(KVT_ENOMEM, "no memory for a task");
    if (cl->ntasks == cl->cap) {
        uint32_t cap = cl->cap ? cl->cap * 2 : 32;
        ctask **v = realloc(cl->tasks, cap * sizeof *v);
        if (!v) {
            free(t);
            return kvt__fail(KVT_ENOMEM, "no memory for the task table");
        }
        cl->tasks = v;
        cl->cap = cap;
    }
    t->id = id;
    t->kind = kind;
    t->state = CT_PLANNED;
    t->first_token = first;
    t->num_tokens = n;
    t->epoch = cl->epoch;
    t->cl = cl;
    cl->tasks[cl->ntasks++] = t;
    return KVT_OK;
}

static void ct_end(kvt_client *cl, ctask *t, const kvt_task_result *r)
{
    t->copying = false;
    t->result = *r;
    t->result.status = kvt__task_status(r->status); /* the server's too: one set (tasks.h) */
    t->state = CT_ENDED;
    t->end_seq = ++cl->end_seq;
    pthread_cond_broadcast(&cl->cv);
}

static kvt_task_result local_result(const ctask *t, kvt_status st)
{
    kvt_task_result r = {t->id, t->kind, st, t->first_token, 0, 0};
    return r;
}

/* ------------------------------------------------------------------ */
/* Attach and detach                                                  */

static kvt_status connect_until(kvt_client *cl, uint64_t deadline)
{
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof a.sun_path, "%s", cl->path);
    int last = 0;
    for (;;) {
        int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0) return kvt__fail(KVT_ESYS, "kvt_client_attach: socket: %s", strerror(errno));
        if (connect(fd, (struct sockaddr *)&a, sizeof a) == 0) {
            cl->fd = fd;
            return KVT_OK;
        }
        last = errno;
        close(fd);
        if (last == EACCES)
            return kvt__fail(KVT_EAUTH, "kvt_client_attach: kvtier server at %s: permission "
                             "denied (uid %ld, gid %ld): the socket admits the server's user "
                             "and, with server_socket_group, that group's members", cl->path,
                             (long)geteuid(), (long)getegid());
        /* Not there yet, or its backlog is full: retry until the deadline. */
        if (last != ENOENT && last != ECONNREFUSED && last != EAGAIN) break;
        if (kvt__now_ns() >= deadline) break;
        struct timespec ts = {0, 10 * 1000000L};
        nanosleep(&ts, NULL);
    }
    return kvt__fail(KVT_ECONN, "kvt_client_attach: no kvtier server at %s: %s", cl->path,
                     strerror(last));
}

/* The handshake the server runs first (net/stream_auth.c): with the
 * server_secret_file option's secret (KVTIER_SERVER_SECRET_FILE), mutual
 * proof of it; a server that wants one refuses a client without. */
static kvt_status authenticate(kvt_client *cl, uint64_t deadline)
{
    char who[160];
    snprintf(who, sizeof who, "kvt_client_attach: kvtier server at %s", cl->path);
    kvt_stream_auth a = {.secret = cl->secret, .secret_len = cl->secret_len, .who = who,
                         .realm = &kvt__auth_server};
    return kvt__stream_auth_client(cl->fd, &a, deadline);
}

/* A connection, authenticated: at attach and at each re-attach. */
static kvt_status open_conn(kvt_client *cl, uint64_t connect_deadline)
{
    kvt_status st = connect_until(cl, connect_deadline);
    if (!st) st = authenticate(cl, kvt__deadline_ns(cl->timeout_ms));
    return st;
}

/* KVTIER_SERVER_SECRET_FILE: the server_secret_file option on the client's
 * side (clients take no kvt_config), read once at attach. */
static kvt_status load_secret(kvt_client *cl)
{
    if (sodium_init() < 0)
        return kvt__fail(KVT_ESYS, "kvt_client_attach: libsodium failed to initialise");
    const char *path = getenv("KVTIER_SERVER_SECRET_FILE");
    if (!path || !*path) return KVT_OK;
    return kvt__srv_secret_load(path, "kvt_client_attach: KVTIER_SERVER_SECRET_FILE",
                                &cl->secret, &cl->secret_len);
}

/* KVTIER_SERVER_READ_MS, KVTIER_SERVER_SPIN_US, KVTIER_WORKERS and
 * KVTIER_BLOCK_TOKENS: the server_read_ms, server_spin_us, workers and
 * block_tokens options on the client's side (clients take no kvt_config),
 * parsed and bounded by the option table. block_tokens only when set: the
 * block size this client asks the server for (unset: the server's choice,
 * its block_tokens rounded up to whole pages). */
static kvt_status load_client_options(kvt_client *cl)
{
    static const char *const names[][2] = {{"KVTIER_SERVER_READ_MS", "server_read_ms"},
                                           {"KVTIER_SERVER_SPIN_US", "server_spin_us"},
                                           {"KVTIER_WORKERS", "workers"},
                                           {"KVTIER_BLOCK_TOKENS", "block_tokens"}};
    kvt_config *cfg = NULL;
    kvt_status st = kvt_config_create(&cfg);
    for (size_t i = 0; i < sizeof names / sizeof names[0] && !st; i++) {
        const char *v = kvt__config_env(names[i][0]);
        if (v && *v && (st = kvt_config_set(cfg, names[i][1], v))) {
            char what[64];
            snprintf(what, sizeof what, "kvt_client_attach: %s", names[i][0]);
            st = kvt__wrap_error(st, what);
        }
    }
    if (!st) {
        cl->read_ms = kvt__config_values(cfg)->server_read_ms;
        cl->spin_us = kvt__config_values(cfg)->server_spin_us;
        cl->workers = kvt__config_values(cfg)->workers;
        const char *bt = kvt__config_env("KVTIER_BLOCK_TOKENS");
        cl->block_tokens = bt && *bt ? kvt__config_values(cfg)->block_tokens : 0;
    }
    kvt_config_destroy(cfg);
    return st;
}

/* One request of attach (GEOMETRY or HELLO) and its reply: a server that
 * closes the connection or does not answer in time is KVT_ECONN naming
 * the socket, as a server that is not there. */
static kvt_status attach_exchange(kvt_client *cl, uint16_t op, const kvt_srv_buf *b,
                                  kvt_srv_hdr *h, uint8_t **p, int *fd)
{
    static const char fn[] = "kvt_client_attach";
    uint64_t deadline = kvt__deadline_ns(cl->timeout_ms);
    kvt_status st = kvt__srv_send_frame(cl->fd, op, 0, b->p, b->len, -1, deadline);
    cl->requests++;
    if (!st) st = kvt__srv_recv_frame(cl->fd, h, p, fd, deadline);
    if (st == KVT_ECONN)
        return kvt__fail(KVT_ECONN, "%s: kvtier server at %s: connection lost during attach",
                         fn, cl->path);
    if (st == KVT_ETIMEDOUT)
        return kvt__fail(KVT_ECONN, "%s: kvtier server at %s: no reply to attach", fn, cl->path);
    return st;
}

/* Whether CUDA copies pin the server's tier mapping (cudaHostRegister):
 * only a tier backed whole (a server with --model). Pinning a sparse tier
 * (geometries sharing cpu_capacity) would back every page of it, the whole
 * cpu_capacity for this geometry, and a slot the sharing later punches out
 * to give its memory to another geometry would stay pinned here while the
 * server's mapping got a new page: a later load of that slot would copy
 * stale bytes to the GPU. Unpinned, the copies go through the driver's
 * staging (copy_cuda.c): correct, slower than pinned DMA. */
static bool tier_pinnable(const kvt_client *cl)
{
    return !(cl->shm.flags & KVT_SRV_TIER_SPARSE);
}

static kvt_status pin_tier(kvt_client *cl, kvt_cuda_backend *b, const char *fn)
{
    if (tier_pinnable(cl)) return kvt__cuda_backend_pin(b, fn, cl->tier, cl->shm.map_bytes);
    kvt__log(KVT_LOG_INFO, "%s: the server shares cpu_capacity across geometries (kvtier serve "
             "without --model), so its CPU tier is not pinned: CUDA copies go through the "
             "driver's staging buffers; a server started with --model for this geometry lets "
             "them use pinned DMA (docs/gpu.md)", fn);
    return KVT_OK;
}

/* HELLO and the tier's mapping; io_mu held or not yet shared. */
static kvt_status hello_locked(kvt_client *cl)
{
    static const char fn[] = "kvt_client_attach";
    kvt_srv_buf b = {0};
    kvt_status st = kvt__srv_hello_encode(&b, (uint32_t)getpid(), cl->geo, cl->block_tokens);
    kvt_srv_hdr h = {0};
    uint8_t *p = NULL;
    int fd = -1;
    if (!st) st = attach_exchange(cl, KVT_SRV_HELLO, &b, &h, &p, &fd);
    kvt__srv_buf_free(&b);
    if (st) return st;
    if (h.op != (KVT_SRV_HELLO | KVT_SRV_REPLY)) st = kvt__fail(KVT_EPROTO, "%s: reply op 0x%x",
                                                                fn, h.op);
    else if (h.status)
        st = answered_failure(fn, KVT_SRV_HELLO, &h, p);
    uint32_t len = h.len;
    if (st) {
        free(p);
        if (fd >= 0) close(fd);
        return st;
    }
    st = kvt__srv_hello_rep_decode(p, len, &cl->shm);
    free(p);
    if (!st && fd < 0) st = kvt__fail(KVT_EPROTO, "%s: the server sent no shared memory", fn);
    if (!st && cl->shm.block_bytes != kvt__geo_bytes_per_token(cl->geo) * cl->shm.block_tokens)
        st = kvt__fail(KVT_EPROTO, "%s: the server's blocks are %llu bytes, not %u tokens of "
                       "this geometry", fn, (unsigned long long)cl->shm.block_bytes,
                       cl->shm.block_tokens);
    if (!st && cl->shm.block_tokens % cl->geo->tokens_per_page != 0)
        st = kvt__fail(KVT_EGEOMETRY, "%s: the server's block_tokens %u is not a multiple of "
                       "tokens_per_page %u", fn, cl->shm.block_tokens, cl->geo->tokens_per_page);
    if (!st && cl->block_tokens && cl->shm.block_tokens != cl->block_tokens)
        st = kvt__fail(KVT_EPROTO, "%s: asked for block_tokens %u, the server gave %u", fn,
                       cl->block_tokens, cl->shm.block_tokens);
    if (!st) {
        /* A tier backed whole (a model's, prefaulted by the server) is
         * mapped writable now, page tables and all (MADV_POPULATE_WRITE:
         * no guest page faults later; on a VM under shadow paging a fault
         * costs ~20-50 us a page: docs/server.md; MAP_POPULATE alone maps
         * pages read-only, so each first write faulted still). A shadow-
         * paged VM still charges this process's first touch of each page
         * (~5 us, the hypervisor filling its shadow entry, which the guest
         * cannot ask for ahead: bench engine's client_first_touch_ns_per_page).
         * A sparse tier
         * (geometries sharing cpu_capacity) is not populated: that would
         * back every slot of it in memory, the budget's whole size per
         * geometry. 2 MiB aligned, so huge pages map whole here too. */
        bool sparse = cl->shm.flags & KVT_SRV_TIER_SPARSE;
        void *m = kvt__pool_map_shared(fd, (size_t)cl->shm.map_bytes, false);
        if (m != MAP_FAILED && !sparse) kvt__pool_populate_write(m, (size_t)cl->shm.map_bytes);
        if (m == MAP_FAILED)
            st = kvt__fail(KVT_ESYS, "%s: cannot map the server's CPU tier (%llu bytes): %s", fn,
                           (unsigned long long)cl->shm.map_bytes, strerror(errno));
        else
            cl->tier = m;
    }
    /* A re-attach with engine memory on a CUDA device: the new mapping is
     * pinned if the first one was (pin_tier: a tier backed whole). */
    if (!st && cl->cuda) {
        st = pin_tier(cl, cl->cuda, fn);
        if (st) {
            munmap(cl->tier, cl->shm.map_bytes);
            cl->tier = NULL;
        }
    }
    if (fd >= 0) close(fd);
    return st;
}

/* SESSION after HELLO (io_mu held or not yet shared): this handle's key,
 * and with resumed, that its copies of earlier connections have stopped. */
static kvt_status session_locked(kvt_client *cl, bool resumed)
{
    static const char fn[] = "kvt_client_attach";
    kvt_srv_buf b = {0};
    kvt__srv_task_rep_encode(&b, cl->session, resumed ? KVT_SRV_SESSION_RESUMED : 0, 0);
    kvt_srv_hdr h = {0};
    uint8_t *p = NULL;
    kvt_status st = b.oom ? kvt__fail(KVT_ENOMEM, "%s: no memory", fn)
                          : attach_exchange(cl, KVT_SRV_SESSION, &b, &h, &p, NULL);
    kvt__srv_buf_free(&b);
    uint64_t zero = 0;
    uint32_t freed = 0, pad = 0;
    if (!st && h.op != (KVT_SRV_SESSION | KVT_SRV_REPLY))
        st = kvt__fail(KVT_EPROTO, "%s: reply op 0x%x to SESSION", fn, h.op);
    else if (!st && h.status)
        st = answered_failure(fn, KVT_SRV_SESSION, &h, p);
    else if (!st)
        st = kvt__srv_task_rep_decode(p, h.len, &zero, &freed, &pad);
    free(p);
    return st;
}

/* GEOMETRY before HELLO, for a client attached without one: it takes the
 * server's (the reply is a HELLO, checked by the same decoder). */
static kvt_status fetch_geometry(kvt_client *cl)
{
    static const char fn[] = "kvt_client_attach";
    kvt_srv_hdr h = {0};
    uint8_t *p = NULL;
    kvt_srv_buf none = {0};
    kvt_status st = attach_exchange(cl, KVT_SRV_GEOMETRY, &none, &h, &p, NULL);
    if (st) {
        free(p);
        return st;
    }
    kvt_srv_hello g = {0};
    if (h.op != (KVT_SRV_GEOMETRY | KVT_SRV_REPLY))
        st = kvt__fail(KVT_EPROTO, "%s: reply op 0x%x to GEOMETRY", fn, h.op);
    else if (h.status)
        st = answered_failure(fn, KVT_SRV_GEOMETRY, &h, p);
    else if ((st = kvt__srv_hello_decode(p, h.len, true, &g)))
        kvt__wrap_error(st, "kvt_client_attach: the server's geometry");
    free(p);
    if (!st) {
        cl->geo = g.geo;
        cl->block_tokens = g.block_tokens;
    }
    return st;
}

kvt_status kvt_client_attach(kvt_client **out, const char *socket_path, const kvt_geometry *geo,
                             int64_t timeout_ms)
{
    static const char fn[] = "kvt_client_attach";
    kvt__clear_error();
    KVT_CHECK_NOT_NULL(out, fn);
    KVT_CHECK_NOT_NULL(socket_path, fn);
    KVT_CHECK_ARG(timeout_ms > 0, "%s: timeout_ms is %lld; it must be > 0 (every call's "
                  "deadline)", fn, (long long)timeout_ms);
    struct sockaddr_un a;
    KVT_CHECK_ARG(strlen(socket_path) < sizeof a.sun_path, "%s: socket_path is longer than %zu "
                  "bytes", fn, sizeof a.sun_path - 1);
    kvt_status st = geo ? kvt_geometry_validate(geo) : KVT_OK;
    if (st) return kvt__wrap_error(st, "kvt_client_attach: geo");
    kvt_client *cl = calloc(1, sizeof *cl);
    if (!cl) return kvt__fail(KVT_ENOMEM, "%s: out of memory", fn);
    cl->fd = -1;
    cl->timeout_ms = timeout_ms;
    snprintf(cl->path, sizeof cl->path, "%s", socket_path);
    pthread_mutex_init(&cl->io_mu, NULL);
    pthread_mutex_init(&cl->mu, NULL);
    if (kvt__cond_init(&cl->cv) != 0 || kvt__cond_init(&cl->lcv) != 0) {
        free(cl);
        return kvt__fail(KVT_ESYS, "%s: pthread_cond_init failed", fn);
    }
    st = load_client_options(cl);
    if (!st) st = load_secret(cl); /* (libsodium initialised here) */
    while (!st && !cl->session) randombytes_buf(&cl->session, sizeof cl->session);
    if (!st) st = open_conn(cl, kvt__deadline_ns(timeout_ms));
    if (!st) st = geo ? kvt_geometry_clone(geo, &cl->geo) : fetch_geometry(cl);
    if (!st) st = hello_locked(cl);
    if (!st) st = session_locked(cl, false);
    if (!st) st = kvt__xfer_create(&cl->xfer, cl->workers, &kvt__host_copy_ops);
    if (st) {
        kvt_client_detach(cl);
        return st;
    }
    *out = cl;
    return KVT_OK;
}

/* A store reported done early (end_early) is committed when the server
 * takes its END, which may still be on its way. One STATS round trip
 * (bounded by the attach's timeout) makes the last store visible to every
 * other client by the time detach returns: a worker that stores and
 * exits leaves nothing a scheduler process could miss. */
static void settle_last_store(kvt_client *cl)
{
    pthread_mutex_lock(&cl->io_mu);
    bool go = cl->unsettled && !cl->broken && cl->fd >= 0;
    pthread_mutex_unlock(&cl->io_mu);
    if (!go) return;
    kvt_srv_buf b = {0};
    uint8_t *p = NULL;
    uint32_t len = 0;
    if (round_trip(cl, "kvt_client_detach", KVT_SRV_STATS, &b, &p, &len, NULL) != KVT_OK)
        KVT_LOG(KVT_LOG_WARN, "kvtier client: detaching: %s", kvt_last_error());
    free(p);
}

void kvt_client_detach(kvt_client *cl)
{
    if (!cl) return;
    pthread_mutex_lock(&cl->mu);
    cl->detaching = true; /* copy threads skip END: the close releases everything */
    for (uint32_t i = 0; i < cl->ntasks; i++)
        if (cl->tasks[i]->copying) kvt__xfer_cancel(cl->xfer, &cl->tasks[i]->xt);
    bool launcher = cl->launcher_started;
    pthread_cond_broadcast(&cl->lcv);
    pthread_mutex_unlock(&cl->mu);
    /* Its round trip in flight, if any, ends by its deadline. */
    if (launcher) pthread_join(cl->launcher, NULL);
    kvt__xfer_destroy(cl->xfer);
    settle_last_store(cl);
    if (cl->fd >= 0) close(cl->fd);
    tier_unmap(cl);
    kvt__cuda_backend_destroy(cl->cuda); /* after the workers (their streams) */
    while (cl->ntasks) ct_free(cl, cl->tasks[0]);
    free(cl->tasks);
    kvt_geometry_destroy(cl->geo);
    kvt__srv_secret_free(cl->secret, cl->secret_len);
    pthread_cond_destroy(&cl->cv);
    pthread_cond_destroy(&cl->lcv);
    pthread_mutex_destroy(&cl->mu);
    pthread_mutex_destroy(&cl->io_mu);
    free(cl);
}

/* Device memory: the layout checks as for host memory, then the CUDA
 * runtime and device (KVT_EUNSUPPORTED naming what is missing), every
 * buffer on that device, the server's tier mapping pinned (pin_tier), the copy ops
 * switched to the CUDA backend (as kvt_cache_register_memory does). io_mu
 * and mu held; nothing was submitted yet (launch needs registered memory). */
static kvt_status register_cuda(kvt_client *cl, const kvt_engine_memory *mem, const char *fn)
{
    kvt_engine_memory host = *mem;
    host.kind = KVT_MEMORY_HOST;
    kvt_page_map map;
    kvt_status st = kvt__page_map_init_fn(&map, cl->geo, &host, fn);
    if (st) return st;
    KVT_CHECK_ARG(mem->device >= 0, "%s: device is %d (a CUDA device ordinal is >= 0)", fn,
                  (int)mem->device);
    if (!cl->tier)
        return kvt__fail(KVT_ECONN, "%s: the server's tier is not mapped (the connection to %s "
                         "is down: %s); register again once it answers", fn, cl->path,
                         cl->broken_msg);
    kvt_cuda_backend *b = NULL;
    st = kvt__cuda_backend_create(&b, fn, mem->device, KVT_CUDA_AUTO);
    if (st) return st;
    char what[64];
    for (uint32_t l = 0; l < cl->geo->num_layers && !st; l++)
        for (uint32_t k = 0; k < kvt__geo_ncomp(cl->geo, l) && !st; k++) {
            uint32_t u = KVT_UNIT(l, k);
            if (cl->geo->layout == KVT_LAYOUT_PAGE_FIRST && !mem->page_strides)
                snprintf(what, sizeof what, "base");
            else
                snprintf(what, sizeof what, "layer_bases[%u]", u);
            st = kvt__cuda_backend_check_ptr(b, fn, what, map.base[u]);
        }
    if (!st) st = pin_tier(cl, b, fn);
    if (!st) st = kvt__xfer_set_ops(cl->xfer, kvt__cuda_backend_ops(b));
    if (st) {
        kvt__cuda_backend_destroy(b); /* unpins the tier */
        return st;
    }
    cl->map = map;
    cl->cuda = b;
    return KVT_OK;
}

kvt_status kvt_client_register_memory(kvt_client *cl, const kvt_engine_memory *mem)
{
    static const char fn[] = "kvt_client_register_memory";
    kvt__clear_error();
    KVT_CHECK_NOT_NULL_AS(cl, "cl", fn);
    KVT_CHECK_NOT_NULL(mem, fn);
    pthread_mutex_lock(&cl->io_mu); /* a re-attach remaps the tier under io_mu */
    pthread_mutex_lock(&cl->mu);
    kvt_status st = KVT_OK;
    if (cl->memory_registered)
        st = kvt__fail(KVT_ESTATE, "%s: engine memory is already registered (allowed once per "
                       "client)", fn);
    else if (mem->kind == KVT_MEMORY_CUDA)
        st = register_cuda(cl, mem, fn);
    else
        st = kvt__page_map_init_fn(&cl->map, cl->geo, mem, fn);
    if (!st) cl->memory_registered = true;
    pthread_mutex_unlock(&cl->mu);
    pthread_mutex_unlock(&cl->io_mu);
    return st;
}

/* ------------------------------------------------------------------ */
/* Planning                                                           */

/* A server's answer (the status named got) no request of this kind gets:
 * it breaks the protocol. */
static kvt_status answer_refused(const char *fn, const char *what, const char *got)
{
    char said[KVT_ERRMSG_MAX];
    snprintf(said, sizeof said, "%s", kvt_last_error());
    return kvt__fail(KVT_EPROTO, "%s: the server answered %s with %s (%s)", fn, what, got, said);
}

/* A plan's status, checked: the server answers a plan with a status of
 * kvt_cache_lookup or prepare_store (KVT_EINVAL, KVT_ENOMEM, KVT_EFULL),
 * KVT_EFULL (this client's task quota, server_client_tasks) or KVT_EAUTH (a
 * namespace this client may not use: on_plan in conn.c); the round trip
 * adds its own KVT_ENOMEM, KVT_EPROTO, KVT_ECONN and KVT_EVERSION (every
 * other failure of it is KVT_ECONN). That is all a plan may return: a
 * server answering anything else breaks the protocol. A switch, so that
 * scripts/status_map.py reads it as a filter passing these codes. */
static kvt_status plan_status(const char *fn, kvt_status st)
{
    const char *got = kvt_status_name(st);
    switch (st) {
    case KVT_EINVAL: case KVT_ENOMEM: case KVT_EFULL: case KVT_EAUTH: /* the server's */
    case KVT_EPROTO: case KVT_ECONN: case KVT_EVERSION:               /* the round trip's */
        return st;
    default:
        return answer_refused(fn, "a plan", got);
    }
}

/* req checked as the cache checks it, so a bad request is refused here,
 * naming fn, before a round trip (the server checks it again), and encoded
 * into *b (freed on failure). */
static kvt_status encode_request(kvt_client *cl, const char *fn, const kvt_request *req,
                                 kvt_srv_buf *b)
{
    pthread_mutex_lock(&cl->io_mu); /* a re-attach rewrites shm */
    uint32_t block_tokens = cl->shm.block_tokens;
    pthread_mutex_unlock(&cl->io_mu);
    kvt_status st = kvt__request_check(fn, req, block_tokens ? block_tokens : 1);
    if (st) return st;
    st = kvt__srv_req_encode(b, req);
    if (st) {
        kvt__srv_buf_free(b);
        return kvt__wrap_error(st, fn);
    }
    return KVT_OK;
}

static kvt_status plan(kvt_client *cl, const char *fn, uint16_t op, const kvt_request *req,
                       uint64_t *task, uint32_t *a, uint32_t *c)
{
    kvt_srv_buf b = {0};
    kvt_status st = encode_request(cl, fn, req, &b);
    if (st) return st;
    uint8_t *p = NULL;
    uint32_t len = 0;
    st = round_trip(cl, fn, op, &b, &p, &len, NULL);
    kvt__srv_buf_free(&b);
    if (st) st = plan_status(fn, st);
    if (!st) st = kvt__srv_task_rep_decode(p, len, task, a, c);
    free(p);
    return st;
}

kvt_status kvt_client_lookup(kvt_client *cl, const kvt_request *req, kvt_match *out)
{
    static const char fn[] = "kvt_client_lookup";
    kvt__clear_error();
    KVT_CHECK_NOT_NULL_AS(cl, "cl", fn);
    KVT_CHECK_NOT_NULL(out, fn);
    uint64_t task = 0;
    uint32_t matched = 0, unused = 0;
    kvt_status st = plan(cl, fn, KVT_SRV_LOOKUP, req, &task, &matched, &unused);
    if (st) return st;
    if (task) {
        pthread_mutex_lock(&cl->mu);
        st = ct_add(cl, task, KVT_TASK_LOAD, 0, matched);
        pthread_mutex_unlock(&cl->mu);
        if (st) return st; /* the server expires the plan */
    }
    kvt_match m = {task, task ? matched : 0};
    *out = m;
    return KVT_OK;
}

/* A peek's status, checked as plan_status does, less KVT_EFULL: a peek
 * makes no task, so no quota applies and the cache's peek never fills. */
static kvt_status peek_status(const char *fn, kvt_status st)
{
    const char *got = kvt_status_name(st);
    switch (st) {
    case KVT_EINVAL: case KVT_ENOMEM: case KVT_EAUTH:    /* the server's */
    case KVT_EPROTO: case KVT_ECONN: case KVT_EVERSION: /* the round trip's */
        return st;
    default:
        return answer_refused(fn, "a peek", got);
    }
}

kvt_status kvt_client_peek(kvt_client *cl, const kvt_request *req, uint32_t *matched_tokens)
{
    static const char fn[] = "kvt_client_peek";
    kvt__clear_error();
    KVT_CHECK_NOT_NULL_AS(cl, "cl", fn);
    KVT_CHECK_NOT_NULL_AS(matched_tokens, "matched_tokens", fn);
    kvt_srv_buf b = {0};
    kvt_status st = encode_request(cl, fn, req, &b);
    if (st) return st;
    uint8_t *p = NULL;
    uint32_t len = 0;
    st = round_trip(cl, fn, KVT_SRV_PEEK, &b, &p, &len, NULL);
    kvt__srv_buf_free(&b);
    if (st) st = peek_status(fn, st);
    uint64_t task = 0;
    uint32_t matched = 0, unused = 0;
    if (!st) st = kvt__srv_task_rep_decode(p, len, &task, &matched, &unused);
    free(p);
    if (st) return st;
    if (task != 0)
        return kvt__fail(KVT_EPROTO, "%s: the server answered a peek with task %llu (a peek "
                         "makes none)", fn, (unsigned long long)task);
    *matched_tokens = matched;
    return KVT_OK;
}

kvt_status kvt_client_peek_many(kvt_client *cl, const kvt_request *reqs, uint32_t n,
                                uint32_t *matched_tokens, kvt_status *status)
{
    static const char fn[] = "kvt_client_peek_many";
    kvt__clear_error();
    KVT_CHECK_NOT_NULL_AS(cl, "cl", fn);
    KVT_CHECK_NOT_NULL(reqs, fn);
    KVT_CHECK_NOT_NULL_AS(matched_tokens, "matched_tokens", fn);
    KVT_CHECK_NOT_NULL(status, fn);
    KVT_CHECK_ARG(n >= 1 && n <= KVT_SRV_MAX_PEEKS, "%s: n is %u (1..%u)", fn, n,
                  KVT_SRV_MAX_PEEKS);
    pthread_mutex_lock(&cl->io_mu); /* a re-attach rewrites shm */
    uint32_t block_tokens = cl->shm.block_tokens;
    pthread_mutex_unlock(&cl->io_mu);
    for (uint32_t i = 0; i < n; i++) {
        char what[64];
        snprintf(what, sizeof what, "%s: reqs[%u]", fn, i);
        kvt_status st = kvt__request_check(what, &reqs[i], block_tokens ? block_tokens : 1);
        if (st) return st;
    }
    kvt_srv_buf b = {0};
    kvt_status st = kvt__srv_peek_many_encode(&b, reqs, n);
    if (st) {
        kvt__srv_buf_free(&b);
        return kvt__wrap_error(st, fn);
    }
    uint8_t *p = NULL;
    uint32_t len = 0;
    st = round_trip(cl, fn, KVT_SRV_PEEK_MANY, &b, &p, &len, NULL);
    kvt__srv_buf_free(&b);
    if (st) st = peek_status(fn, st);
    int32_t *s32 = st ? NULL : malloc((size_t)n * sizeof *s32);
    uint32_t *m = st ? NULL : malloc((size_t)n * sizeof *m);
    if (!st && (!s32 || !m)) st = kvt__fail(KVT_ENOMEM, "%s: no memory", fn);
    if (!st) st = kvt__srv_peek_answers_decode(p, len, n, s32, m);
    for (uint32_t i = 0; !st && i < n; i++) {
        kvt_status e = (kvt_status)s32[i];
        if (e != KVT_OK && e != KVT_EAUTH && e != KVT_EINVAL && e != KVT_ENOMEM)
            st = kvt__fail(KVT_EPROTO, "%s: the server answered request %u with status %d", fn,
                           i, (int)s32[i]);
    }
    for (uint32_t i = 0; !st && i < n; i++) {
        status[i] = (kvt_status)s32[i];
        matched_tokens[i] = s32[i] ? 0 : m[i];
    }
    free(s32);
    free(m);
    free(p);
    return st;
}

kvt_status kvt_client_prepare_store(kvt_client *cl, const kvt_request *req, kvt_store_plan *out)
{
    static const char fn[] = "kvt_client_prepare_store";
    kvt__clear_error();
    KVT_CHECK_NOT_NULL_AS(cl, "cl", fn);
    KVT_CHECK_NOT_NULL(out, fn);
    uint64_t task = 0;
    uint32_t first = 0, n = 0;
    kvt_status st = plan(cl, fn, KVT_SRV_PREPARE, req, &task, &first, &n);
    if (st) return st;
    if (task) {
        pthread_mutex_lock(&cl->mu);
        st = ct_add(cl, task, KVT_TASK_STORE, first, n);
        if (!st && (req->flags & KVT_REQ_VISIBLE_AT_END))
            cl->tasks[cl->ntasks - 1]->visible_at_end = true;
        pthread_mutex_unlock(&cl->mu);
        if (st) return st;
    }
    kvt_store_plan p = {task, first, task ? n : 0};
    *out = p;
    return KVT_OK;
}

/* ------------------------------------------------------------------ */
/* Launch and the end of a copy                                       */

/* Nothing waits to be read on the connection (io_mu held: no reply is
 * owed): a server that cut this client off, stopped or died shows here as
 * EOF or a hang-up, at the cost of one poll. */
static bool conn_quiet(const kvt_client *cl)
{
    struct pollfd p = {cl->fd, POLLIN, 0};
    return !cl->broken && poll(&p, 1, 0) == 0;
}

/* A task whose copy ended well, reported before its END round trip: what
 * the server's answer says then (kvt__cache_end_task: a load cut short by
 * lost blocks ends with why, its landed prefix counted). */
static kvt_task_result copied(const kvt_client *cl, const ctask *t)
{
    uint32_t blocks = t->xt.num_blocks;
    kvt_status st = t->kind == KVT_TASK_LOAD ? t->bad_status : KVT_OK;
    kvt_task_result r = {t->id, t->kind, st, t->first_token, blocks * cl->shm.block_tokens,
                         (uint64_t)blocks * cl->shm.block_bytes};
    return r;
}

/* The END of t, whose copy ended with st, into *b: a store that copied
 * well sends its checksums; without memory for them its END says
 * KVT_ENOMEM (the server drops the store). Returns the status END carries. */
static kvt_status end_encode(const kvt_client *cl, const ctask *t, kvt_status st,
                             kvt_srv_buf *b)
{
    if (st == KVT_OK && t->kind == KVT_TASK_STORE) {
        /* the layers' checksums, taken in the copy's pass: the server
         * records them, and every load of these blocks is checked so */
        kvt__srv_end_encode(b, t->id, KVT_OK, t->layer_sums, t->xt.num_blocks,
                            cl->geo->num_layers);
        if (!b->oom) return KVT_OK;
        kvt__srv_buf_free(b);
        *b = (kvt_srv_buf){0};
        st = KVT_ENOMEM;
    }
    kvt__srv_end_encode(b, t->id, st, NULL, 0, 0);
    return st;
}

/* A task whose copy ended well: its wait returns now, as in process (the
 * engine's pages are free, or hold the loaded KV), and END follows under
 * the same hold of io_mu, so this client's next request reaches the server
 * after it (a store is then committed: the server settles a connection's
 * check before its next plan; a load's pins are released).
 * Why a load may be reported before the server answers: its blocks were
 * pinned from its launch until the server sees END or drops this client,
 * and the server shuts the socket before it releases any pin of a client
 * it drops or cuts off (conn.c: kvt__srv_conn_main, check_copy_deadline);
 * the copy ended before conn_quiet looked, so a quiet connection means
 * the pins outlived the copy. A dead server's blocks are never written
 * again (a new server makes a new tier).
 * What the server then says is not the result any more: a store it drops
 * (a protocol failure) is as if evicted at once - a miss, never served -
 * and is logged here (warn). A connection that already shows
 * EOF (cut off, server gone) takes the synchronous way, so that task still
 * reports KVT_ECONN. b: its END (end_encode). false: that way (nothing
 * done). */
static bool end_early(kvt_client *cl, ctask *t, const kvt_srv_buf *b)
{
    kvt_task_id id = t->id;
    bool store = t->kind == KVT_TASK_STORE;
    pthread_mutex_lock(&cl->io_mu);
    bool early = conn_quiet(cl);
    if (early) {
        kvt_task_result r = copied(cl, t);
        pthread_mutex_lock(&cl->mu);
        ct_end(cl, t, &r); /* t may be freed from here on */
        pthread_mutex_unlock(&cl->mu);
        uint8_t *p = NULL;
        uint32_t len = 0;
        if (exchange_locked(cl, "kvt_client_wait", KVT_SRV_END, b, &p, &len, NULL, 0))
            KVT_LOG(KVT_LOG_WARN, "kvtier client: %s task %llu was reported done, but the "
                    "server did not take its end (%s)%s", store ? "store" : "load",
                    (unsigned long long)id, kvt_last_error(),
                    store ? ": it is not in the cache" : "");
        free(p);
    }
    pthread_mutex_unlock(&cl->io_mu);
    return early;
}

/* Runs on a copy thread when the local copy ended: tells the server, whose
 * verdict is the result (end_early: reported first, when it can). */
static void on_copied(kvt_xfer_task *xt, kvt_status st)
{
    ctask *t = xt->user;
    kvt_client *cl = t->cl;
    if (st == KVT_ECORRUPT) /* the worker's message: which block and layer */
        KVT_LOG(KVT_LOG_WARN, "kvtier client: task %llu: %s (the server drops the block; the "
                "engine recomputes)", (unsigned long long)t->id, kvt_last_error());
    kvt_task_result r = local_result(t, st);
    pthread_mutex_lock(&cl->mu);
    bool skip = cl->detaching;
    pthread_mutex_unlock(&cl->mu);
    /* (A re-attach waits for this copy to end, so the epoch cannot have
     * moved: END goes to the server that planned the task, or fails.) */
    if (!skip) {
        kvt_srv_buf b = {0};
        /* A store asked to be visible when it ends is reported only with
         * the server's verdict (END_SYNC), never early. */
        bool sync = t->visible_at_end && end_encode(cl, t, st, &b) == KVT_OK && !b.oom;
        bool early = !sync && !t->visible_at_end && end_encode(cl, t, st, &b) == KVT_OK &&
                     !b.oom && end_early(cl, t, &b);
        if (early) { /* t is the waiter's now */
            kvt__srv_buf_free(&b);
            return;
        }
        uint8_t *p = NULL;
        uint32_t len = 0;
        kvt_status rs = round_trip(cl, "kvt_client_wait", sync ? KVT_SRV_END_SYNC : KVT_SRV_END,
                                   &b, &p, &len, NULL);
        kvt__srv_buf_free(&b);
        if (!rs) rs = kvt__srv_result_decode(p, len, &r);
        free(p);
        if (rs) r.status = rs;
        r.task = t->id;
    }
    pthread_mutex_lock(&cl->mu);
    ct_end(cl, t, &r);
    pthread_mutex_unlock(&cl->mu);
}

static kvt_status check_pages(kvt_client *cl, const char *fn, const ctask *t,
                              const uint32_t *pages, uint32_t num_pages)
{
    uint32_t tpp = cl->geo->tokens_per_page;
    uint32_t first = t->first_token / tpp, end = first + t->num_tokens / tpp;
    KVT_CHECK_ARG(pages != NULL, "%s: pages is NULL", fn);
    KVT_CHECK_ARG(num_pages >= end, "%s: task %llu moves tokens [%u, %u), which needs "
                  "pages[0..%u) but num_pages is %u", fn, (unsigned long long)t->id,
                  t->first_token, t->first_token + t->num_tokens, end, num_pages);
    for (uint32_t i = first; i < end; i++) {
        if (pages[i] == KVT_PAGE_SKIP && t->kind == KVT_TASK_LOAD) continue;
        KVT_CHECK_ARG(pages[i] != KVT_PAGE_SKIP, "%s: pages[%u] is KVT_PAGE_SKIP in store task "
                      "%llu; a store copies whole blocks (only a load may skip pages)", fn, i,
                      (unsigned long long)t->id);
        KVT_CHECK_ARG(pages[i] < cl->map.num_pages, "%s: pages[%u] is %u but the engine "
                      "registered %u pages", fn, i, pages[i], cl->map.num_pages);
    }
    return KVT_OK;
}

/* The server's launch reply, checked: a hostile or broken server must not
 * make this process copy outside the mapped tier. *pending: the server
 * still reads the load's blocks from SSD (no offsets yet; ask again). */
static kvt_status take_launch(kvt_client *cl, const char *fn, ctask *t, const uint8_t *p,
                              uint32_t len, bool *pending)
{
    kvt_srv_launch_rep l;
    kvt_status st = kvt__srv_launch_rep_decode(p, len, &l);
    if (st) return st;
    *pending = (l.flags & KVT_SRV_LAUNCH_PENDING) != 0;
    if (*pending)
        return t->kind == KVT_TASK_LOAD
                   ? KVT_OK
                   : kvt__fail(KVT_EPROTO, "%s: task %llu: the server says a store's launch "
                               "pends on SSD reads", fn, (unsigned long long)t->id);
    if (l.kind != (uint32_t)t->kind || l.first_token != t->first_token ||
        l.num_tokens > t->num_tokens || l.num_tokens != l.num_blocks * cl->shm.block_tokens)
        return kvt__fail(KVT_EPROTO, "%s: task %llu: the server launched tokens [%u, +%u) of "
                         "kind %u, planned [%u, +%u)", fn, (unsigned long long)t->id,
                         l.first_token, l.num_tokens, l.kind, t->first_token, t->num_tokens);
    const uint32_t nl = cl->geo->num_layers;
    if (t->kind == KVT_TASK_LOAD && l.num_blocks && l.num_layers != nl)
        return kvt__fail(KVT_EPROTO, "%s: task %llu: the server sent checksums of %u layers "
                         "per block for this geometry's %u", fn, (unsigned long long)t->id,
                         l.num_layers, nl);
    t->offsets = malloc((size_t)l.num_blocks * sizeof *t->offsets + 1);
    t->blocks = malloc((size_t)l.num_blocks * sizeof *t->blocks + 1);
    t->layer_sums = malloc((size_t)l.num_blocks * nl * sizeof *t->layer_sums + 1);
    if (!t->offsets || !t->blocks || !t->layer_sums)
        return kvt__fail(KVT_ENOMEM, "%s: no memory", fn);
    if (t->kind == KVT_TASK_LOAD) /* what each block's layers were stored with */
        for (size_t i = 0; i < (size_t)l.num_blocks * nl; i++)
            t->layer_sums[i] = kvt__srv_get64(l.sums + 8 * i);
    for (uint32_t i = 0; i < l.num_blocks; i++) {
        uint64_t off = kvt__srv_get64(l.offsets + 8 * (size_t)i);
        if (off % cl->shm.stride != 0 || off / cl->shm.stride >= cl->shm.num_blocks)
            return kvt__fail(KVT_EPROTO, "%s: task %llu: block %u at offset %llu is not a block "
                             "of the tier", fn, (unsigned long long)t->id, i,
                             (unsigned long long)off);
        t->offsets[i] = off;
        t->blocks[i] = cl->tier + off;
    }
    t->num_tokens = l.num_tokens; /* a load may shrink (lost blocks): a prefix */
    t->bad_status = kvt__task_status((kvt_status)l.bad_status); /* ... and then ends with why */
    t->xt.num_blocks = l.num_blocks;
    t->xt.dir = t->kind == KVT_TASK_STORE ? KVT_XFER_GATHER : KVT_XFER_SCATTER;
    t->xt.geo = cl->geo;
    t->xt.map = &cl->map;
    t->xt.block_tokens = cl->shm.block_tokens;
    t->xt.blocks = t->blocks;
    t->xt.pages = t->pages;
    t->xt.on_done = on_copied;
    t->xt.user = t;
    /* a store takes its blocks' checksums in the copy's pass; a load
     * checks them in its own before it reports a layer landed */
    t->xt.layer_sums = t->kind == KVT_TASK_STORE ? t->layer_sums : NULL;
    t->xt.expect_sums = t->kind == KVT_TASK_LOAD ? t->layer_sums : NULL;
    return KVT_OK;
}

/* Tells the server a launched task's copy will not happen (st), so it
 * releases the task now; the server's answer does not matter. */
static void end_unlaunched(kvt_client *cl, const char *fn, ctask *t, kvt_status st)
{
    kvt_srv_buf e = {0};
    kvt__srv_end_encode(&e, t->id, st, NULL, 0, 0);
    uint8_t *q = NULL;
    uint32_t ql = 0;
    char msg[KVT_ERRMSG_MAX];
    snprintf(msg, sizeof msg, "%s", kvt_last_error());
    if (!round_trip(cl, fn, KVT_SRV_END, &e, &q, &ql, NULL)) free(q);
    kvt__srv_buf_free(&e);
    kvt__fail(st, "%s", msg); /* the caller reports the first failure */
}

/* LAUNCH round trip (the first, or a pending task's poll). */
static kvt_status ask_launch(kvt_client *cl, const char *fn, ctask *t, bool *pending)
{
    kvt_srv_buf b = {0};
    kvt__srv_id_encode(&b, t->id);
    uint8_t *p = NULL;
    uint32_t len = 0;
    kvt_status st = round_trip(cl, fn, KVT_SRV_LAUNCH, &b, &p, &len, NULL);
    kvt__srv_buf_free(&b);
    if (st) return st; /* the server dropped the task (expired, unknown, lost...) */
    memset(&t->xt, 0, sizeof t->xt);
    st = take_launch(cl, fn, t, p, len, pending);
    free(p);
    if (st && !*pending) end_unlaunched(cl, fn, t, st);
    return st;
}

static kvt_status launch_planned(kvt_client *cl, const char *fn, ctask *t, const uint32_t *pages,
                                 bool *pending)
{
    /* The planned pages, kept: a pending load copies after this call returned. */
    uint32_t tpp = cl->geo->tokens_per_page;
    size_t n = t->num_tokens / tpp;
    t->pages = malloc(n * sizeof *t->pages + 1);
    if (!t->pages) return kvt__fail(KVT_ENOMEM, "%s: no memory", fn);
    memcpy(t->pages, pages + t->first_token / tpp, n * sizeof *t->pages);
    return ask_launch(cl, fn, t, pending);
}

/* Submits a launched task's copy (mu held). */
static kvt_status submit_locked(kvt_client *cl, const char *fn, ctask *t)
{
    kvt_status st;
    if (t->epoch != cl->epoch) /* re-attached meanwhile: the blocks are gone */
        st = kvt__fail(KVT_ECONN, "%s: kvtier server at %s: the connection was replaced "
                       "during the launch", fn, cl->path);
    else
        st = kvt__xfer_submit(cl->xfer, &t->xt);
    t->copying = st == KVT_OK;
    if (t->copying) pthread_cond_broadcast(&cl->cv); /* wait_layer of a pending load */
    return st;
}

/* ---- the launcher: pending loads (the server reads them from SSD) ---- */

/* Tells the server to drop a pending task (CANCEL waits there for its
 * reads, so the round trip gets their bound on top). */
static void cancel_at_server(kvt_client *cl, const ctask *t)
{
    kvt_srv_buf b = {0};
    kvt__srv_id_encode(&b, t->id);
    uint8_t *p = NULL;
    uint32_t len = 0;
    if (!round_trip_ex(cl, "kvt_client_cancel", KVT_SRV_CANCEL, &b, &p, &len, NULL,
                       cl->read_ms))
        free(p);
    kvt__srv_buf_free(&b);
}

/* Ends a pending task without a copy, with status why. */
static void pending_drop(kvt_client *cl, ctask *t, kvt_status why)
{
    cancel_at_server(cl, t);
    kvt_task_result r = local_result(t, why);
    pthread_mutex_lock(&cl->mu);
    t->pending = false;
    ct_end(cl, t, &r);
    pthread_mutex_unlock(&cl->mu);
}

/* One poll of a pending task; true when it is pending no more. */
static bool pending_poll(kvt_client *cl, ctask *t)
{
    static const char fn[] = "kvt_client_launch";
    pthread_mutex_lock(&cl->mu);
    bool cancel = t->cancel_asked;
    bool late = kvt__now_ns() >= t->pending_deadline_ns;
    pthread_mutex_unlock(&cl->mu);
    if (cancel || late) {
        pending_drop(cl, t, cancel ? KVT_ECANCELED : KVT_ETIMEDOUT);
        return true;
    }
    bool pending = false;
    kvt_status st = ask_launch(cl, fn, t, &pending);
    if (!st && pending) return false;
    bool not_copied = false;
    pthread_mutex_lock(&cl->mu);
    t->pending = false;
    if (!st && t->cancel_asked) /* cancelled before its copy: no copy at all */
        not_copied = (st = kvt__fail(KVT_ECANCELED, "%s: task %llu was cancelled", fn,
                                     (unsigned long long)t->id)) != KVT_OK;
    else if (!st)
        not_copied = (st = submit_locked(cl, fn, t)) != KVT_OK;
    pthread_mutex_unlock(&cl->mu);
    if (not_copied) end_unlaunched(cl, fn, t, st);
    if (st) {
        kvt_task_result r = local_result(t, st);
        pthread_mutex_lock(&cl->mu);
        ct_end(cl, t, &r);
        pthread_mutex_unlock(&cl->mu);
    }
    return true;
}

/* Polls every pending task until none is left, napping between rounds
 * (50 us doubling to 2 ms: SSD reads take about a millisecond), and sleeps
 * while there is none (waking at least once a second). */
static void *launcher_main(void *arg)
{
    kvt_client *cl = arg;
    uint64_t nap = POLL_FIRST_NS;
    pthread_mutex_lock(&cl->mu);
    while (!cl->detaching) {
        ctask **v = malloc((size_t)cl->ntasks * sizeof *v + 1);
        uint32_t n = 0;
        for (uint32_t i = 0; v && i < cl->ntasks; i++)
            if (cl->tasks[i]->pending) v[n++] = cl->tasks[i];
        /* A pending task stays in the table (only this thread ends it). */
        pthread_mutex_unlock(&cl->mu);
        bool moved = false;
        for (uint32_t i = 0; i < n; i++) moved |= pending_poll(cl, v[i]);
        free(v);
        pthread_mutex_lock(&cl->mu);
        if (cl->detaching) break;
        nap = moved || n == 0 ? POLL_FIRST_NS : (nap * 2 > POLL_MAX_NS ? POLL_MAX_NS : nap * 2);
        uint64_t until = kvt__now_ns() + (n ? nap : 1000000000ull);
        kvt__cond_wait_until(&cl->lcv, &cl->mu, until);
    }
    pthread_mutex_unlock(&cl->mu);
    return NULL;
}

/* Hands a pending task to the launcher (mu held). */
static kvt_status pend_locked(kvt_client *cl, const char *fn, ctask *t)
{
    if (t->epoch != cl->epoch)
        return kvt__fail(KVT_ECONN, "%s: kvtier server at %s: the connection was replaced "
                         "during the launch", fn, cl->path);
    if (!cl->launcher_started) {
        if (pthread_create(&cl->launcher, NULL, launcher_main, cl) != 0)
            return kvt__fail(KVT_ESYS, "%s: no thread to finish SSD loads", fn);
        cl->launcher_started = true;
    }
    t->pending = true;
    t->pending_deadline_ns = kvt__deadline_ns(cl->read_ms);
    pthread_cond_signal(&cl->lcv);
    return KVT_OK;
}

kvt_status kvt_client_launch(kvt_client *cl, kvt_task_id id, const uint32_t *pages,
                             uint32_t num_pages)
{
    static const char fn[] = "kvt_client_launch";
    kvt__clear_error();
    KVT_CHECK_NOT_NULL_AS(cl, "cl", fn);
    pthread_mutex_lock(&cl->mu);
    ctask *t = find(cl, id);
    kvt_status st = KVT_OK;
    if (!t)
        st = kvt__fail(KVT_ENOTFOUND, "%s: task %llu is unknown or its result was already "
                       "reported", fn, (unsigned long long)id);
    else if (t->state != CT_PLANNED)
        st = kvt__fail(KVT_ESTATE, "%s: task %llu was already launched", fn,
                       (unsigned long long)id);
    else if (!cl->memory_registered)
        st = kvt__fail(KVT_ESTATE, "%s: no engine memory registered (call "
                       "kvt_client_register_memory first)", fn);
    else if (t->epoch != cl->epoch)
        st = kvt__fail(KVT_ECONN, "%s: task %llu was planned by a server this client lost "
                       "(%s); look it up again", fn, (unsigned long long)id, cl->path);
    else
        st = check_pages(cl, fn, t, pages, num_pages);
    if (!st) t->state = CT_RUNNING; /* ours: no other thread launches it meanwhile */
    pthread_mutex_unlock(&cl->mu);
    if (st) return st;
    bool pending = false;
    st = launch_planned(cl, fn, t, pages, &pending);
    if (!st) {
        /* A load the server reads from SSD pends: the launcher copies it
         * once read, and wait, wait_layer and poll see it end as usual. */
        pthread_mutex_lock(&cl->mu);
        st = pending ? pend_locked(cl, fn, t) : submit_locked(cl, fn, t);
        pthread_mutex_unlock(&cl->mu);
        if (st && pending) {
            char msg[KVT_ERRMSG_MAX];
            snprintf(msg, sizeof msg, "%s", kvt_last_error());
            cancel_at_server(cl, t);
            kvt__fail(st, "%s", msg);
        } else if (st) {
            end_unlaunched(cl, fn, t, st);
        }
    }
    if (st) {
        char msg[KVT_ERRMSG_MAX];
        snprintf(msg, sizeof msg, "%s", kvt_last_error());
        pthread_mutex_lock(&cl->mu);
        ct_free(cl, t); /* the server has forgotten it; so does the engine's view */
        pthread_mutex_unlock(&cl->mu);
        return kvt__fail(st, "%s", msg);
    }
    return KVT_OK;
}

/* ------------------------------------------------------------------ */
/* Waiting, polling, cancelling                                       */

static void report(kvt_client *cl, ctask *t, kvt_task_result *out)
{
    *out = t->result;
    t->reported = true;
    if (t->refs == 0) ct_free(cl, t);
}

kvt_status kvt_client_wait(kvt_client *cl, kvt_task_id id, int64_t timeout_ms,
                           kvt_task_result *out)
{
    static const char fn[] = "kvt_client_wait";
    kvt__clear_error();
    KVT_CHECK_NOT_NULL_AS(cl, "cl", fn);
    KVT_CHECK_NOT_NULL(out, fn);
    KVT_CHECK_ARG(timeout_ms >= 0, "%s: timeout_ms is %lld; every wait needs a deadline (use 0 "
                  "to poll)", fn, (long long)timeout_ms);
    uint64_t deadline = kvt__deadline_ns(timeout_ms);
    pthread_mutex_lock(&cl->mu);
    ctask *t = find(cl, id);
    kvt_status st = KVT_OK;
    if (!t) {
        st = kvt__fail(KVT_ENOTFOUND, "%s: task %llu is unknown or already reported", fn,
                       (unsigned long long)id);
    } else if (t->state == CT_PLANNED) {
        st = kvt__fail(KVT_ESTATE, "%s: task %llu was never launched (launch or cancel it)", fn,
                       (unsigned long long)id);
    } else {
        t->refs++;
        while (t->state != CT_ENDED && !t->reported)
            if (!kvt__cond_wait_until(&cl->cv, &cl->mu, deadline)) break;
        t->refs--;
        if (t->reported) {
            st = kvt__fail(KVT_ENOTFOUND, "%s: task %llu was reported to another caller "
                           "meanwhile", fn, (unsigned long long)id);
            if (t->refs == 0) ct_free(cl, t);
        } else if (t->state != CT_ENDED) {
            st = kvt__fail(KVT_ETIMEDOUT, "%s: task %llu still running after %lld ms", fn,
                           (unsigned long long)id, (long long)timeout_ms);
        } else {
            report(cl, t, out);
        }
    }
    pthread_mutex_unlock(&cl->mu);
    return st;
}

kvt_status kvt_client_poll(kvt_client *cl, kvt_task_result *out, uint32_t max, uint32_t *count)
{
    static const char fn[] = "kvt_client_poll";
    kvt__clear_error();
    KVT_CHECK_NOT_NULL_AS(cl, "cl", fn);
    KVT_CHECK_NOT_NULL(count, fn);
    KVT_CHECK_ARG(out != NULL || max == 0, "%s: out is NULL but max is %u", fn, max);
    pthread_mutex_lock(&cl->mu);
    uint32_t n = 0;
    while (n < max) {
        ctask *oldest = NULL;
        for (uint32_t i = 0; i < cl->ntasks; i++) {
            ctask *t = cl->tasks[i];
            if (t->state == CT_ENDED && !t->reported &&
                (!oldest || t->end_seq < oldest->end_seq))
                oldest = t;
        }
        if (!oldest) break;
        report(cl, oldest, &out[n++]);
    }
    pthread_mutex_unlock(&cl->mu);
    *count = n;
    return KVT_OK;
}

/* A load the server cut short (a block it could not read back, known from
 * LAUNCH's answer): every layer wait says so and what to recompute, as the
 * in-process cache's (cache/ops.c bad_read_fail), whether the copy of the
 * blocks before the lost one still runs or has ended. Before, a wait while
 * the copy ran said OK and one after it "ended with", without the advice. */
static kvt_status cut_load_fail(const kvt_client *cl, const ctask *t, const char *fn)
{
    uint32_t good = t->xt.num_blocks * cl->shm.block_tokens;
    return kvt__fail(t->bad_status, "%s: task %llu: blocks from token %u on could not be read "
                     "back (%s); only tokens [0, %u) will land; recompute the rest", fn,
                     (unsigned long long)t->id, good, kvt_status_name(t->bad_status), good);
}

/* wait_layer's first step (mu held): a pending load (its blocks still read
 * from SSD on the server) has no copy to wait on yet; wait for it to start
 * or end. Then the result of an ended task. */
static kvt_status wait_copying(kvt_client *cl, const char *fn, ctask *t, uint32_t layer,
                               uint64_t deadline, int64_t timeout_ms)
{
    t->refs++;
    while (t->state == CT_RUNNING && !t->copying && !t->reported)
        if (!kvt__cond_wait_until(&cl->cv, &cl->mu, deadline)) break;
    t->refs--;
    if (t->reported) {
        kvt_status st = kvt__fail(KVT_ENOTFOUND, "%s: task %llu was reported to another "
                                  "caller meanwhile", fn, (unsigned long long)t->id);
        if (t->refs == 0) ct_free(cl, t);
        return st;
    }
    /* cut and copying, or ended as cut (not cancelled before its copy, say) */
    if (t->bad_status != KVT_OK &&
        (t->copying || (t->state == CT_ENDED && t->result.status == t->bad_status)))
        return cut_load_fail(cl, t, fn);
    if (t->state == CT_ENDED)
        return t->result.status == KVT_OK
                   ? KVT_OK
                   : kvt__fail(t->result.status, "%s: task %llu ended with %s", fn,
                               (unsigned long long)t->id, kvt_status_name(t->result.status));
    if (!t->copying)
        return kvt__fail(KVT_ETIMEDOUT, "%s: layer %u of task %llu not loaded after %lld ms "
                         "(its blocks are still read from SSD)", fn, layer,
                         (unsigned long long)t->id, (long long)timeout_ms);
    return KVT_OK;
}

kvt_status kvt_client_wait_layer(kvt_client *cl, kvt_task_id id, uint32_t layer,
                                 int64_t timeout_ms)
{
    static const char fn[] = "kvt_client_wait_layer";
    kvt__clear_error();
    KVT_CHECK_NOT_NULL_AS(cl, "cl", fn);
    KVT_CHECK_ARG(timeout_ms >= 0, "%s: timeout_ms is %lld; every wait needs a deadline", fn,
                  (long long)timeout_ms);
    uint64_t deadline = kvt__deadline_ns(timeout_ms);
    pthread_mutex_lock(&cl->mu);
    ctask *t = find(cl, id);
    kvt_status st = KVT_OK;
    if (!t)
        st = kvt__fail(KVT_ENOTFOUND, "%s: task %llu is unknown or already reported", fn,
                       (unsigned long long)id);
    else if (t->kind != KVT_TASK_LOAD)
        st = kvt__fail(KVT_EINVAL, "%s: task %llu is a store; only loads have layers", fn,
                       (unsigned long long)id);
    else if (layer >= cl->geo->num_layers)
        st = kvt__fail(KVT_EINVAL, "%s: layer %u is out of range (%u layers)", fn, layer,
                       cl->geo->num_layers);
    else if (t->state == CT_PLANNED)
        st = kvt__fail(KVT_ESTATE, "%s: task %llu was never launched", fn,
                       (unsigned long long)id);
    else
        st = wait_copying(cl, fn, t, layer, deadline, timeout_ms);
    if (st || t->state == CT_ENDED || !t->copying) {
        /* answered above */
    } else {
        t->refs++;
        pthread_mutex_unlock(&cl->mu);
        st = kvt__xfer_wait_layer(cl->xfer, &t->xt, layer, deadline);
        if (st != KVT_ETIMEDOUT) st = kvt__task_status(st); /* the copy's failure, as its result */
        pthread_mutex_lock(&cl->mu);
        if (--t->refs == 0 && t->reported) ct_free(cl, t);
        if (st == KVT_ETIMEDOUT)
            st = kvt__fail(st, "%s: layer %u of task %llu not loaded after %lld ms", fn, layer,
                           (unsigned long long)id, (long long)timeout_ms);
        else if (st)
            st = kvt__fail(st, "%s: task %llu ended with %s", fn, (unsigned long long)id,
                           kvt_status_name(st));
    }
    pthread_mutex_unlock(&cl->mu);
    return st;
}

/* The server's answer to the CANCEL of a planned task, checked: it releases
 * the plan (KVT_OK), or no longer has it (KVT_ENOTFOUND: it expired there,
 * which is KVT_OK here); the round trip adds its own KVT_ENOMEM, KVT_EPROTO,
 * KVT_ECONN and KVT_EVERSION. The server's other answers to CANCEL (its
 * SSD reads not ending in time) are for launched tasks, which this client
 * cancels through the launcher (cancel_at_server) or by ending the copy. */
static kvt_status cancel_answer(const char *fn, kvt_status st)
{
    const char *got = kvt_status_name(st);
    switch (st) {
    case KVT_ENOMEM: case KVT_EPROTO: case KVT_ECONN: case KVT_EVERSION:
        return st;
    case KVT_OK: case KVT_ENOTFOUND:
        return KVT_OK;
    default:
        return answer_refused(fn, "the cancel of a planned task", got);
    }
}

/* CANCEL of a planned task, its answer checked (cancel_answer). */
static kvt_status cancel_planned(kvt_client *cl, const char *fn, kvt_task_id id)
{
    kvt_srv_buf b = {0};
    kvt__srv_id_encode(&b, id);
    uint8_t *p = NULL;
    uint32_t len = 0;
    kvt_status st = round_trip(cl, fn, KVT_SRV_CANCEL, &b, &p, &len, NULL);
    kvt__srv_buf_free(&b);
    free(p);
    st = cancel_answer(fn, st);
    return st;
}

kvt_status kvt_client_cancel(kvt_client *cl, kvt_task_id id)
{
    static const char fn[] = "kvt_client_cancel";
    kvt__clear_error();
    KVT_CHECK_NOT_NULL_AS(cl, "cl", fn);
    pthread_mutex_lock(&cl->mu);
    ctask *t = find(cl, id);
    kvt_status st = KVT_OK;
    if (!t) {
        st = kvt__fail(KVT_ENOTFOUND, "%s: task %llu is unknown or already reported", fn,
                       (unsigned long long)id);
    } else if (t->state == CT_RUNNING && t->copying) {
        kvt__xfer_cancel(cl->xfer, &t->xt); /* its END tells the server */
    } else if (t->state == CT_RUNNING && t->pending) {
        t->cancel_asked = true; /* the launcher tells the server and ends it */
        pthread_cond_signal(&cl->lcv);
    } else if (t->state == CT_PLANNED) {
        t->state = CT_RUNNING; /* no launch may start on it now */
        pthread_mutex_unlock(&cl->mu);
        st = cancel_planned(cl, fn, id);
        pthread_mutex_lock(&cl->mu);
        /* Whatever the server said, the task is over for the engine. */
        kvt_task_result r = local_result(t, KVT_ECANCELED);
        ct_end(cl, t, &r);
    }
    pthread_mutex_unlock(&cl->mu);
    return st;
}

kvt_status kvt_client_stats(kvt_client *cl, kvt_cache_stats *out)
{
    static const char fn[] = "kvt_client_stats";
    kvt__clear_error();
    KVT_CHECK_NOT_NULL_AS(cl, "cl", fn);
    KVT_CHECK_NOT_NULL(out, fn);
    kvt_srv_buf b = {0};
    uint8_t *p = NULL;
    uint32_t len = 0;
    b.p = NULL;
    kvt_status st = round_trip(cl, fn, KVT_SRV_STATS, &b, &p, &len, NULL);
    if (!st) st = kvt__srv_stats_decode(p, len, out);
    free(p);
    return st;
}

/* CLEAR's status, checked as peek_status does: the server answers
 * KVT_EAUTH (a namespace this client may not use) or KVT_ENOMEM. */
static kvt_status clear_status(const char *fn, kvt_status st)
{
    const char *got = kvt_status_name(st);
    switch (st) {
    case KVT_ENOMEM: case KVT_EAUTH:                    /* the server's */
    case KVT_EPROTO: case KVT_ECONN: case KVT_EVERSION: /* the round trip's */
        return st;
    default:
        return answer_refused(fn, "a clear", got);
    }
}

kvt_status kvt_client_clear(kvt_client *cl, const void *ns, uint32_t ns_len, uint32_t *removed,
                            uint32_t *kept)
{
    static const char fn[] = "kvt_client_clear";
    kvt__clear_error();
    KVT_CHECK_NOT_NULL_AS(cl, "cl", fn);
    KVT_CHECK_NOT_NULL(removed, fn);
    KVT_CHECK_NOT_NULL(kept, fn);
    KVT_CHECK_ARG(ns != NULL || ns_len == 0, "%s: ns is NULL but ns_len is %u", fn, ns_len);
    KVT_CHECK_ARG(ns_len <= KVT_SRV_MAX_NS, "%s: ns_len is %u (at most %u bytes)", fn, ns_len,
                  KVT_SRV_MAX_NS);
    kvt_srv_buf b = {0};
    kvt_status st = kvt__srv_clear_encode(&b, ns, ns_len);
    uint8_t *p = NULL;
    uint32_t len = 0;
    /* The server waits up to 2 s for fresh stores' SSD writes first. */
    if (!st) st = round_trip_ex(cl, fn, KVT_SRV_CLEAR, &b, &p, &len, NULL, 2000);
    else st = kvt__wrap_error(st, fn);
    kvt__srv_buf_free(&b);
    if (st) st = clear_status(fn, st);
    uint64_t zero = 0;
    uint32_t r = 0, k = 0;
    if (!st) st = kvt__srv_task_rep_decode(p, len, &zero, &r, &k);
    free(p);
    if (st) return st;
    *removed = r;
    *kept = k;
    return KVT_OK;
}

kvt_status kvt_client_flush(kvt_client *cl, int64_t timeout_ms)
{
    static const char fn[] = "kvt_client_flush";
    kvt__clear_error();
    KVT_CHECK_NOT_NULL_AS(cl, "cl", fn);
    KVT_CHECK_ARG(timeout_ms >= 0 && timeout_ms <= 600000, "%s: timeout_ms is %lld (0..600000)",
                  fn, (long long)timeout_ms);
    kvt_srv_buf b = {0};
    kvt__srv_id_encode(&b, (uint64_t)timeout_ms);
    uint8_t *p = NULL;
    uint32_t len = 0;
    /* The server waits up to timeout_ms; the round trip's own deadline comes on top. */
    kvt_status st = round_trip_ex(cl, fn, KVT_SRV_FLUSH, &b, &p, &len, NULL, timeout_ms);
    kvt__srv_buf_free(&b);
    free(p);
    return st;
}

/* ------------------------------------------------------------------ */
/* A server's tiers, without attaching                                */

/* One STATS_ALL on a connection of its own: the tiers (of geo, or all)
 * and the quotas, into t and q (room for KVT_SRV_MAX_TIERS and
 * KVT_SRV_MAX_QUOTAS), and the server's own figures into info (NULL: not
 * kept). */
static kvt_status stats_all(const char *fn, const char *socket_path, const kvt_geometry *geo,
                            int64_t timeout_ms, kvt_srv_tier *t, uint32_t *n, kvt_srv_quota *q,
                            uint32_t *nq, kvt_srv_info *info)
{
    KVT_CHECK_NOT_NULL(socket_path, fn);
    KVT_CHECK_ARG(timeout_ms > 0, "%s: timeout_ms is %lld; it must be > 0", fn,
                  (long long)timeout_ms);
    struct sockaddr_un a;
    KVT_CHECK_ARG(strlen(socket_path) < sizeof a.sun_path, "%s: socket_path is longer than %zu "
                  "bytes", fn, sizeof a.sun_path - 1);
    kvt_client c = {.fd = -1, .timeout_ms = timeout_ms};
    snprintf(c.path, sizeof c.path, "%s", socket_path);
    kvt_srv_buf b = {0};
    kvt_status st = load_secret(&c);
    if (!st && geo) st = kvt__srv_hello_encode(&b, (uint32_t)getpid(), geo, 0);
    if (!st) st = open_conn(&c, kvt__deadline_ns(timeout_ms));
    kvt_srv_hdr h = {0};
    uint8_t *p = NULL;
    if (!st && b.oom) st = kvt__fail(KVT_ENOMEM, "%s: no memory", fn);
    if (!st) st = attach_exchange(&c, KVT_SRV_STATS_ALL, &b, &h, &p, NULL);
    kvt__srv_buf_free(&b);
    if (!st && h.op != (KVT_SRV_STATS_ALL | KVT_SRV_REPLY))
        st = kvt__fail(KVT_EPROTO, "%s: reply op 0x%x to STATS_ALL", fn, h.op);
    else if (!st && h.status)
        st = answered_failure(fn, KVT_SRV_STATS_ALL, &h, p);
    else if (!st && (st = kvt__srv_tiers_decode(p, h.len, t, KVT_SRV_MAX_TIERS, n, q,
                                                KVT_SRV_MAX_QUOTAS, nq, info)))
        kvt__wrap_error(st, fn);
    free(p);
    if (c.fd >= 0) close(c.fd);
    kvt__srv_secret_free(c.secret, c.secret_len);
    return st;
}

static void tier_out(kvt_tier_stats *o, const kvt_srv_tier *t)
{
    memset(o, 0, sizeof *o);
    snprintf(o->geometry, sizeof o->geometry, "g%016llx", (unsigned long long)t->fingerprint);
    o->num_layers = t->num_layers;
    o->tokens_per_page = t->tokens_per_page;
    o->block_tokens = t->block_tokens;
    o->bytes_per_token = t->bytes_per_token;
    o->stats = t->stats;
}

static void quota_out(kvt_quota_usage *o, const kvt_srv_quota *q)
{
    memset(o, 0, sizeof *o);
    memcpy(o->prefix, q->prefix, strnlen(q->prefix, sizeof o->prefix - 1));
    o->limit_bytes = q->limit;
    o->used_bytes = q->used;
    o->limited_blocks = q->limited;
    o->evicted_blocks = q->evicted;
}

static void info_out(kvt_server_info *o, const kvt_srv_info *in, uint32_t quotas)
{
    memset(o, 0, sizeof *o);
    snprintf(o->version, sizeof o->version, "%s", in->version);
    o->pid = (uint32_t)in->pid;
    o->uptime_ms = in->uptime_ms;
    o->clients = (uint32_t)in->clients;
    o->max_clients = (uint32_t)in->max_clients;
    o->geometries = (uint32_t)in->geometries;
    o->max_geometries = (uint32_t)in->max_geometries;
    o->cpu_capacity_bytes = in->cpu_capacity;
    o->metrics_port = (uint32_t)in->metrics_port;
    o->quotas = quotas;
}

/* The reading behind the four public calls below: their arguments
 * checked under fn's name, then one STATS_ALL. */
static kvt_status snapshot(const char *fn, const char *socket_path, const kvt_geometry *geo,
                           int64_t timeout_ms, kvt_server_info *info, kvt_tier_stats *tiers,
                           uint32_t max_tiers, uint32_t *tier_count, kvt_quota_usage *quotas,
                           uint32_t max_quotas, uint32_t *quota_count)
{
    KVT_CHECK_ARG(tiers || max_tiers == 0, "%s: tiers is NULL but max_tiers is %u", fn,
                  max_tiers);
    KVT_CHECK_ARG(tier_count || max_tiers == 0, "%s: tier_count is NULL but max_tiers is %u",
                  fn, max_tiers);
    KVT_CHECK_ARG(quotas || max_quotas == 0, "%s: quotas is NULL but max_quotas is %u", fn,
                  max_quotas);
    KVT_CHECK_ARG(quota_count || max_quotas == 0, "%s: quota_count is NULL but max_quotas is "
                  "%u", fn, max_quotas);
    kvt_status st = geo ? kvt_geometry_validate(geo) : KVT_OK;
    if (st) {
        char why[64];
        snprintf(why, sizeof why, "%s: geo", fn);
        return kvt__wrap_error(st, why);
    }
    kvt_srv_tier t[KVT_SRV_MAX_TIERS];
    kvt_srv_quota q[KVT_SRV_MAX_QUOTAS];
    kvt_srv_info in = {0};
    uint32_t n = 0, nq = 0;
    st = stats_all(fn, socket_path, geo, timeout_ms, t, &n, q, &nq, &in);
    if (st) return st;
    for (uint32_t i = 0; i < n && i < max_tiers; i++) tier_out(&tiers[i], &t[i]);
    for (uint32_t i = 0; i < nq && i < max_quotas; i++) quota_out(&quotas[i], &q[i]);
    if (info) info_out(info, &in, nq);
    if (tier_count) *tier_count = n;
    if (quota_count) *quota_count = nq;
    return KVT_OK;
}

kvt_status kvt_server_snapshot(const char *socket_path, const kvt_geometry *geo,
                               int64_t timeout_ms, kvt_server_info *info, kvt_tier_stats *tiers,
                               uint32_t max_tiers, uint32_t *tier_count, kvt_quota_usage *quotas,
                               uint32_t max_quotas, uint32_t *quota_count)
{
    kvt__clear_error();
    return snapshot("kvt_server_snapshot", socket_path, geo, timeout_ms, info, tiers, max_tiers,
                    tier_count, quotas, max_quotas, quota_count);
}

kvt_status kvt_server_tier_stats(const char *socket_path, const kvt_geometry *geo,
                                 int64_t timeout_ms, kvt_tier_stats *out, uint32_t max,
                                 uint32_t *count)
{
    static const char fn[] = "kvt_server_tier_stats";
    kvt__clear_error();
    KVT_CHECK_NOT_NULL(count, fn);
    KVT_CHECK_ARG(out || max == 0, "%s: out is NULL but max is %u", fn, max);
    return snapshot(fn, socket_path, geo, timeout_ms, NULL, out, max, count, NULL, 0, NULL);
}

kvt_status kvt_server_quotas(const char *socket_path, int64_t timeout_ms, kvt_quota_usage *out,
                             uint32_t max, uint32_t *count)
{
    static const char fn[] = "kvt_server_quotas";
    kvt__clear_error();
    KVT_CHECK_NOT_NULL(count, fn);
    KVT_CHECK_ARG(out || max == 0, "%s: out is NULL but max is %u", fn, max);
    return snapshot(fn, socket_path, NULL, timeout_ms, NULL, NULL, 0, NULL, out, max, count);
}

kvt_status kvt_server_info_get(const char *socket_path, int64_t timeout_ms, kvt_server_info *out)
{
    static const char fn[] = "kvt_server_info_get";
    kvt__clear_error();
    KVT_CHECK_NOT_NULL(out, fn);
    return snapshot(fn, socket_path, NULL, timeout_ms, out, NULL, 0, NULL, NULL, 0, NULL);
}
