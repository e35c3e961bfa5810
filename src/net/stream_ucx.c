/* stream_ucx.c - the UCX stream: an authenticated TCP connection whose
 * traffic moves onto UCP tag messages. Both sides swap worker addresses over
 * the socket and create an endpoint to each other; the socket then carries
 * nothing but stays open as the liveness signal (its hang-up, or a failed
 * request, fails every wait at once).
 *
 * One process-wide UCP context (refcounted: the last stream to go cleans it
 * up, so the next one re-reads UCX_TLS & co. from the environment) and one
 * worker per stream, driven only by the thread that owns the stream (PD:
 * the link's thread), so the worker runs in single-thread mode.
 *
 * Byte semantics over tag messages: a sendv is a run of contiguous messages
 * (large pieces straight from the caller's memory, small ones gathered;
 * sendv_async leaves the last INFLIGHT in flight). recvv probes the next
 * message: when it fits in the current destination piece it is received
 * there (up to RINFLIGHT at once); when it is longer (a header read before
 * its body) or spans pieces it lands in a staging buffer (bounded by
 * STAGE_MAX = CHUNK, the most one message of a sendv holds) that later
 * reads drain.
 *
 * Every wait progresses the worker in a bounded loop: spin a little, then
 * arm the worker and poll its event fd with the socket, up to the deadline;
 * a request that misses its deadline or errs breaks the stream (later
 * calls fail at once) and is cancelled and reaped. Waiting for the next
 * message past the deadline breaks nothing (no request is out), but every
 * caller treats it as the link's end. */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include "net/ucx_api.h"
#include "net/stream.h"
#include "util/clock.h"
#include "util/config.h"
#include "util/err.h"
#include "util/le.h"
#include "util/vec.h"

#define UX_TAG 0x4b56544945520001ull /* "KVTIER" + stream v1: every message */
#define UX_MAX_ADDR (64u << 10)       /* a worker address: a few hundred bytes in practice */
#define UX_ADDR_VERSION_MAX 1u /* a worker address's first byte, low nibble: UCX's address
                                  format version (1.13 reads 0 and 1, and asserts on others) */
#define CHUNK (1u << 20)               /* a message: big enough for rendezvous, small to pipeline */
#define STAGE_MAX CHUNK /* a peer that stages a longer message is broken: refused, not buffered */
#define DIRECT_MIN (128u << 10)        /* pieces this big go zero-copy; smaller ones are gathered */
#define INFLIGHT 16                    /* messages of sendv (async: across sendvs) in flight */
#define RINFLIGHT 16                   /* zero-copy receives of one recvv in flight */
#define HUP_DRAIN_NS 20000000ull  /* after a hang-up: time for the peer's last messages */
#define DISCARD_NS 20000000ull    /* destroy: bound on discarding the messages nobody read */
#define SPINS 256                      /* idle progress rounds before sleeping on the fd */
#define REAP_NS (500ull * 1000000ull)  /* bound on reaping a broken stream's cancelled requests */

typedef struct ux_stream {
    kvt_stream base; /* base.fd: the TCP socket */
    ucp_worker_h worker;
    ucp_ep_h ep;
    int efd;                    /* the worker's event fd; -1: poll the socket only */
    bool broken;                /* an operation failed: the stream is unusable */
    void *req[INFLIGHT];        /* sendv's messages in flight, oldest at req_head */
    unsigned req_head, req_n;
    void *rreq[RINFLIGHT];      /* recvv's receives in flight, oldest first */
    size_t rofs[RINFLIGHT];     /* where each lands: its offset in recvv's bytes */
    unsigned rreq_n;
    size_t rtaken;              /* recvv's bytes taken off the worker so far */
    size_t rlanded;             /* ... and landed in order, as told to landed */
    void (*landed)(void *arg, size_t n); /* recvv_landed's callback; NULL in plain recvv */
    void *landed_arg;
    uint64_t idle_ns;           /* recvv_landed: fail after this long without a byte (0: off) */
    uint64_t moved_ns;          /* ... when a byte last landed (or a message arrived) */
    uint8_t *gather[INFLIGHT];  /* CHUNK-byte buffers small pieces are gathered into */
    struct iovec *cur;          /* recvv's cursor over the caller's iovecs */
    size_t cur_cap;
    uint8_t *stage;             /* a received message's bytes not yet read */
    size_t stage_cap, stage_off, stage_len;
    uint8_t sink[64];           /* destroy: where unread messages are taken, truncated */
    uint64_t reap_dl;           /* reaping cancelled requests ends by then (0: none yet) */
} ux_stream;

/* ---- the process-wide context ---- */

/* UCX's functions, resolved at the first UCX stream (net/ucx_api.h); every
 * call below goes through U, which ctx_ref sets before any other use. */
static const kvt_ucx_api *U;
#define ucp_config_read U->config_read
#define ucp_config_release U->config_release
#define ucp_cleanup U->cleanup
#define ucp_worker_create U->worker_create
#define ucp_worker_destroy U->worker_destroy
#define ucp_worker_get_address U->worker_get_address
#define ucp_worker_release_address U->worker_release_address
#define ucp_worker_progress U->worker_progress
#define ucp_worker_get_efd U->worker_get_efd
#define ucp_worker_arm U->worker_arm
#define ucp_ep_create U->ep_create
#define ucp_ep_close_nbx U->ep_close_nbx
#define ucp_ep_flush_nbx U->ep_flush_nbx
#define ucp_tag_send_nbx U->tag_send_nbx
#define ucp_tag_msg_recv_nbx U->tag_msg_recv_nbx
#define ucp_tag_probe_nb U->tag_probe_nb
#define ucp_request_check_status U->request_check_status
#define ucp_request_free U->request_free
#define ucp_request_cancel U->request_cancel
#define ucs_status_string U->status_string

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static ucp_context_h g_ctx;
static unsigned g_refs;

static kvt_status ctx_ref(ucp_context_h *out)
{
    pthread_mutex_lock(&g_mu); /* U is written here only, under g_mu */
    kvt_status st = U ? KVT_OK : kvt__ucx_api(&U);
    if (st) {
        pthread_mutex_unlock(&g_mu);
        return st;
    }
    if (!g_ctx) {
        ucp_config_t *cfg = NULL;
        ucs_status_t us = ucp_config_read(NULL, NULL, &cfg); /* UCX_TLS etc. from the environment */
        if (us == UCS_OK) {
            ucp_params_t p = {
                .field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED,
                .features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP,
                .mt_workers_shared = 1, /* one worker per link thread, memory registered per context */
            };
            us = U->init_version(UCP_API_MAJOR, UCP_API_MINOR, &p, cfg, &g_ctx);
            ucp_config_release(cfg);
        }
        if (us != UCS_OK) {
            g_ctx = NULL;
            const char *tls = kvt__config_env("UCX_TLS");
            st = kvt__fail(KVT_EUNSUPPORTED, "stream: UCX init failed (UCX_TLS=%s): %s",
                           tls ? tls : "(unset)", ucs_status_string(us));
        }
    }
    if (g_ctx) {
        g_refs++;
        *out = g_ctx;
    }
    pthread_mutex_unlock(&g_mu);
    return st;
}

static void ctx_unref(void)
{
    pthread_mutex_lock(&g_mu);
    if (g_refs && --g_refs == 0) {
        ucp_cleanup(g_ctx);
        g_ctx = NULL;
    }
    pthread_mutex_unlock(&g_mu);
}

/* ---- waiting ---- */

static int ms_until(uint64_t deadline_ns, int cap)
{
    uint64_t now = kvt__now_ns();
    if (now >= deadline_ns) return 0;
    uint64_t ms = (deadline_ns - now + 999999) / 1000000;
    return ms > (uint64_t)cap ? cap : (int)ms;
}

/* Whether the TCP socket says the peer is gone (EOF, error, or bytes that
 * should never come: the socket carries nothing after the upgrade). */
static bool sock_dead(int fd)
{
    uint8_t b;
    ssize_t n = recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n == 0) return true;
    if (n < 0) return errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
    return true;
}

static bool ux_lost(ux_stream *u)
{
    return u->broken;
}

/* Sleeps until the worker has events, the socket stirs, wake_fd (may be -1)
 * is readable, or up to the deadline (at most 100 ms per call, so callers
 * re-check their state). Returns KVT_STREAM_* (IDLE: nothing but time). */
static int ux_sleep(ux_stream *u, int wake_fd, uint64_t deadline_ns)
{
    if (u->efd >= 0) {
        ucs_status_t us = ucp_worker_arm(u->worker);
        if (us == UCS_ERR_BUSY) return KVT_STREAM_READABLE; /* events pending: progress again */
    }
    struct pollfd p[3];
    int n = 0, iw = -1;
    p[n++] = (struct pollfd){u->base.fd, POLLIN, 0};
    if (u->efd >= 0) p[n++] = (struct pollfd){u->efd, POLLIN, 0};
    if (wake_fd >= 0) {
        iw = n;
        p[n++] = (struct pollfd){wake_fd, POLLIN, 0};
    }
    int rc = poll(p, (nfds_t)n, ms_until(deadline_ns, u->efd >= 0 ? 100 : 1));
    if (rc <= 0) return KVT_STREAM_IDLE;
    if (p[0].revents && sock_dead(u->base.fd)) return KVT_STREAM_HUP;
    if (iw >= 0 && p[iw].revents) return KVT_STREAM_WOKEN;
    return KVT_STREAM_READABLE;
}

/* Progress rounds until none does anything (at most 64, so a busy worker
 * never starves the caller's deadline check); true when any did. */
static bool ux_progress(ux_stream *u)
{
    bool any = false;
    for (int i = 0; i < 64 && ucp_worker_progress(u->worker); i++) any = true;
    return any;
}

/* The socket hung up. What the peer sent before (it flushes first: see
 * ux_farewell) may still be passing through UCX's own connections, which
 * the socket does not order: progress for up to HUP_DRAIN_NS and say
 * whether a message waits to be read (the hang-up counts once none does). */
static bool ux_pending_after_hup(ux_stream *u)
{
    uint64_t dl = kvt__now_ns() + HUP_DRAIN_NS;
    ucp_tag_recv_info_t info;
    for (;;) {
        if (ucp_tag_probe_nb(u->worker, UX_TAG, UINT64_MAX, 0, &info)) return true;
        if (kvt__now_ns() >= dl) return false;
        (void)ux_progress(u);
    }
}

/* Cancels a request that will not complete in time and progresses until UCX
 * lets go of it (bounded; a request UCX keeps is left to worker teardown). */
static void ux_reap(ux_stream *u, void *req)
{
    ucp_request_cancel(u->worker, req);
    /* one budget for the stream, not per request: a hang-up can leave 16
     * sends in flight that UCX cannot cancel, and 16 x REAP_NS held a
     * prefill link (and its destroy) for ~8 s */
    if (!u->reap_dl) u->reap_dl = kvt__now_ns() + REAP_NS;
    uint64_t dl = u->reap_dl;
    while (ucp_request_check_status(req) == UCS_INPROGRESS && kvt__now_ns() < dl) ux_progress(u);
    if (ucp_request_check_status(req) == UCS_INPROGRESS && u->ep) {
        /* still held (a matched rendezvous): a forced close fails it */
        ucp_request_param_t cp = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                                .flags = UCP_EP_CLOSE_FLAG_FORCE};
        void *c = ucp_ep_close_nbx(u->ep, &cp);
        u->ep = NULL;
        while (UCS_PTR_IS_PTR(c) && ucp_request_check_status(c) == UCS_INPROGRESS &&
               kvt__now_ns() < dl + REAP_NS)
            ux_progress(u);
        if (UCS_PTR_IS_PTR(c)) ucp_request_free(c);
        while (ucp_request_check_status(req) == UCS_INPROGRESS && kvt__now_ns() < dl + REAP_NS)
            ux_progress(u);
    }
    ucp_request_free(req); /* UCX frees it on completion if still held */
}

/* Waits for a request by the deadline. The stream breaks on any failure. */
/* The deadline a wait has now: deadline_ns, or sooner when a receive with
 * an idle bound (recvv_landed) has seen nothing land for idle_ns. */
static uint64_t ux_dl(const ux_stream *u, uint64_t deadline_ns)
{
    if (!u->idle_ns || u->moved_ns + u->idle_ns >= deadline_ns) return deadline_ns;
    return u->moved_ns + u->idle_ns;
}

static kvt_status ux_wait_req(ux_stream *u, void *req, uint64_t deadline_ns, const char *what)
{
    kvt_status st = KVT_OK;
    if (req == NULL) return KVT_OK;
    if (UCS_PTR_IS_ERR(req)) {
        u->broken = true;
        return kvt__fail(KVT_ECONN, "stream: UCX %s failed: %s", what,
                         ucs_status_string(UCS_PTR_STATUS(req)));
    }
    for (unsigned idle = 0;;) {
        ucs_status_t us = ucp_request_check_status(req);
        if (us != UCS_INPROGRESS) {
            ucp_request_free(req);
            if (us == UCS_OK) return KVT_OK;
            u->broken = true;
            return kvt__fail(KVT_ECONN, "stream: UCX %s failed: %s", what, ucs_status_string(us));
        }
        if (ux_lost(u)) {
            st = kvt__fail(KVT_ECONN, "stream: UCX %s: peer lost", what);
            break;
        }
        if (kvt__now_ns() >= ux_dl(u, deadline_ns)) {
            st = kvt__fail(KVT_ETIMEDOUT, "stream: UCX %s timed out", what);
            break;
        }
        if (ux_progress(u)) {
            idle = 0;
            if (u->idle_ns) u->moved_ns = kvt__now_ns(); /* bytes of a receive in flight moved */
        } else if (++idle >= SPINS) {
            idle = 0;
            if (ux_sleep(u, -1, ux_dl(u, deadline_ns)) == KVT_STREAM_HUP) {
                st = kvt__fail(KVT_ECONN, "stream: UCX %s: peer hung up", what);
                break;
            }
        }
    }
    u->broken = true;
    ux_reap(u, req);
    return st;
}

/* ---- send / receive ---- */

/* Waits for sendv's oldest message in flight. */
static kvt_status ux_retire(ux_stream *u, uint64_t dl)
{
    void *r = u->req[u->req_head];
    u->req[u->req_head] = NULL;
    u->req_head = (u->req_head + 1) % INFLIGHT;
    u->req_n--;
    return ux_wait_req(u, r, dl, "send");
}

/* Sends one contiguous message, retiring the oldest first when INFLIGHT are out. */
static kvt_status ux_post(ux_stream *u, const void *buf, size_t len, uint64_t dl)
{
    if (u->req_n == INFLIGHT) {
        kvt_status st = ux_retire(u, dl);
        if (st) return st;
    }
    ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_DATATYPE, .datatype = ucp_dt_make_contig(1)};
    void *r = ucp_tag_send_nbx(u->ep, buf, len, UX_TAG, &p);
    if (UCS_PTR_IS_ERR(r)) return ux_wait_req(u, r, dl, "send");
    u->req[(u->req_head + u->req_n) % INFLIGHT] = r;
    u->req_n++;
    return KVT_OK;
}

/* Waits for every message in flight (each bounded by the deadline; on a
 * broken stream each is cancelled and reaped, ~1 s at most). */
static kvt_status ux_flush_reqs(ux_stream *u, uint64_t dl)
{
    kvt_status st = KVT_OK;
    while (u->req_n) {
        kvt_status s2 = ux_retire(u, dl);
        if (!st) st = s2;
    }
    return st;
}

/* The gather buffer of the next slot (its previous message retired first). */
static kvt_status ux_gather_buf(ux_stream *u, uint64_t dl, uint8_t **out)
{
    if (u->req_n == INFLIGHT) {
        kvt_status st = ux_retire(u, dl);
        if (st) return st;
    }
    unsigned slot = (u->req_head + u->req_n) % INFLIGHT;
    if (!u->gather[slot] && !(u->gather[slot] = malloc(CHUNK)))
        return kvt__fail(KVT_ENOMEM, "stream: out of memory for a send buffer");
    *out = u->gather[slot];
    return KVT_OK;
}

/* One sendv = a run of messages: pieces >= DIRECT_MIN straight from the
 * caller's memory (CHUNK at a time), smaller ones gathered into CHUNK-byte
 * buffers; up to INFLIGHT in flight. Unless async, all (and every earlier
 * one) complete before it returns (the caller may reuse its memory); async,
 * the last INFLIGHT may still be in flight (stream.h: sendv_async). The
 * receiver reads bytes, not messages. */
static kvt_status ux_send_all(ux_stream *u, const struct iovec *iov, int cnt, uint64_t dl,
                              bool async)
{
    kvt_status st = KVT_OK;
    uint8_t *g = NULL;
    size_t gl = 0;
    for (int i = 0; i < cnt && !st; i++) {
        const uint8_t *p = iov[i].iov_base;
        size_t n = iov[i].iov_len;
        if (n >= DIRECT_MIN) {
            if (gl) st = ux_post(u, g, gl, dl);
            gl = 0;
            for (size_t off = 0; off < n && !st; off += CHUNK)
                st = ux_post(u, p + off, n - off < CHUNK ? n - off : CHUNK, dl);
            continue;
        }
        while (n && !st) {
            if (!gl) st = ux_gather_buf(u, dl, &g);
            if (st) break;
            size_t k = CHUNK - gl < n ? CHUNK - gl : n;
            memcpy(g + gl, p, k);
            gl += k;
            p += k;
            n -= k;
            if (gl == CHUNK) {
                st = ux_post(u, g, gl, dl);
                gl = 0;
            }
        }
    }
    if (!st && gl) st = ux_post(u, g, gl, dl);
    if (st || !async) {
        kvt_status s2 = ux_flush_reqs(u, dl);
        if (!st) st = s2;
    }
    return st;
}

static kvt_status ux_sendv(kvt_stream *s, const struct iovec *iov, int cnt, uint64_t dl)
{
    ux_stream *u = (ux_stream *)s;
    KVT_CHECK_ARG(cnt >= 0 && (iov || !cnt), "stream: UCX sendv of %d iovecs at %p", cnt, (void *)iov);
    if (ux_lost(u)) {
        (void)ux_flush_reqs(u, kvt__now_ns());
        return kvt__fail(KVT_ECONN, "stream: UCX link lost");
    }
    return ux_send_all(u, iov, cnt, dl, false);
}

/* sendv that leaves up to INFLIGHT messages in flight (stream.h). */
static kvt_status ux_sendv_async(kvt_stream *s, const struct iovec *iov, int cnt, uint64_t dl)
{
    ux_stream *u = (ux_stream *)s;
    KVT_CHECK_ARG(cnt >= 0 && (iov || !cnt), "stream: UCX sendv of %d iovecs at %p", cnt, (void *)iov);
    if (ux_lost(u)) {
        (void)ux_flush_reqs(u, kvt__now_ns());
        return kvt__fail(KVT_ECONN, "stream: UCX link lost");
    }
    return ux_send_all(u, iov, cnt, dl, true);
}

static kvt_status ux_flush(kvt_stream *s, uint64_t dl)
{
    return ux_flush_reqs((ux_stream *)s, dl);
}

static kvt_status ux_reap_landed(ux_stream *u);

/* Takes the next message off the worker by the deadline. */
static kvt_status ux_next(ux_stream *u, uint64_t dl, ucp_tag_message_h *msg, size_t *len)
{
    for (unsigned idle = 0;;) {
        ucp_tag_recv_info_t info;
        ucp_tag_message_h m = ucp_tag_probe_nb(u->worker, UX_TAG, UINT64_MAX, 1, &info);
        if (m) {
            *msg = m;
            *len = info.length;
            u->moved_ns = kvt__now_ns(); /* the peer is sending */
            return KVT_OK;
        }
        if (ux_lost(u)) return kvt__fail(KVT_ECONN, "stream: UCX link lost");
        if (kvt__now_ns() >= ux_dl(u, dl)) return kvt__fail(KVT_ETIMEDOUT, "stream: UCX receive timed out");
        kvt_status st = u->landed ? ux_reap_landed(u) : KVT_OK; /* work for the caller meanwhile */
        if (st) return st;
        if (ux_progress(u)) {
            idle = 0;
            if (u->idle_ns) u->moved_ns = kvt__now_ns(); /* bytes of a receive in flight moved */
        } else if (++idle >= SPINS) {
            idle = 0;
            if (ux_sleep(u, -1, ux_dl(u, dl)) == KVT_STREAM_HUP) {
                if (ux_pending_after_hup(u)) continue;
                u->broken = true;
                return kvt__fail(KVT_ECONN, "stream: UCX peer hung up");
            }
        }
    }
}

static kvt_status ux_take(ux_stream *u, ucp_tag_message_h m, void *buf, size_t count,
                          ucp_datatype_t dt, uint64_t dl)
{
    ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_DATATYPE, .datatype = dt};
    return ux_wait_req(u, ucp_tag_msg_recv_nbx(u->worker, buf, count, m, &p), dl, "receive");
}

/* Tells recvv_landed's caller how far its bytes have landed in order: up
 * to the oldest receive still in flight. */
static void ux_report(ux_stream *u)
{
    size_t n = u->rreq_n ? u->rofs[0] : u->rtaken;
    if (u->landed && n > u->rlanded) {
        u->rlanded = n;
        u->moved_ns = kvt__now_ns();
        u->landed(u->landed_arg, n);
    }
}

/* Waits for the oldest receive in flight (failing: cancelled and reaped). */
static kvt_status ux_rretire(ux_stream *u, uint64_t dl)
{
    kvt_status st = ux_wait_req(u, u->rreq[0], dl, "receive");
    u->rreq_n--;
    memmove(u->rreq, u->rreq + 1, u->rreq_n * sizeof *u->rreq);
    memmove(u->rofs, u->rofs + 1, u->rreq_n * sizeof *u->rofs);
    if (!st) ux_report(u);
    return st;
}

/* Retires the receives that have completed, oldest first, without waiting,
 * so the caller hears of landed bytes while later ones are still moving. */
static kvt_status ux_reap_landed(ux_stream *u)
{
    kvt_status st = KVT_OK;
    while (!st && u->rreq_n && ucp_request_check_status(u->rreq[0]) != UCS_INPROGRESS)
        st = ux_rretire(u, kvt__now_ns());
    return st;
}

/* Waits for every receive in flight (on failure each is cancelled and reaped). */
static kvt_status ux_rflush(ux_stream *u, uint64_t dl)
{
    kvt_status st = KVT_OK;
    while (u->rreq_n) {
        kvt_status s2 = ux_rretire(u, st ? kvt__now_ns() : dl);
        if (!st) st = s2;
        if (st) u->landed = NULL; /* what follows a lost receive never landed */
    }
    return st;
}

/* Takes message m into buf without waiting (RINFLIGHT at most; the oldest
 * waited for first); ux_rflush waits for them all. */
static kvt_status ux_take_async(ux_stream *u, ucp_tag_message_h m, void *buf, size_t len, uint64_t dl)
{
    ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_DATATYPE, .datatype = ucp_dt_make_contig(1)};
    void *r = ucp_tag_msg_recv_nbx(u->worker, buf, len, m, &p);
    if (r == NULL || UCS_PTR_IS_ERR(r)) {
        kvt_status st = ux_wait_req(u, r, dl, "receive");
        u->rtaken += st ? 0 : len;
        if (!st) ux_report(u);
        return st;
    }
    if (u->rreq_n == RINFLIGHT) {
        kvt_status st = ux_rretire(u, dl);
        if (st) {
            u->rofs[u->rreq_n] = u->rtaken;
            u->rreq[u->rreq_n++] = r; /* cancelled and reaped by ux_rflush */
            return st;
        }
    }
    u->rofs[u->rreq_n] = u->rtaken;
    u->rreq[u->rreq_n++] = r;
    u->rtaken += len;
    return KVT_OK;
}

/* Copies staged bytes into the cursor; returns the bytes copied. */
static size_t ux_unstage(ux_stream *u, struct iovec **cur, int *cnt)
{
    size_t got = 0;
    while (*cnt > 0 && u->stage_off < u->stage_len) {
        size_t k = u->stage_len - u->stage_off;
        if (k > (*cur)->iov_len) k = (*cur)->iov_len;
        memcpy((*cur)->iov_base, u->stage + u->stage_off, k);
        u->stage_off += k;
        got += k;
        (*cur)->iov_base = (uint8_t *)(*cur)->iov_base + k;
        (*cur)->iov_len -= k;
        while (*cnt > 0 && (*cur)->iov_len == 0) {
            (*cur)++;
            (*cnt)--;
        }
    }
    return got; /* staging stays (at most STAGE_MAX) until the stream goes */
}

/* Advances the cursor past n bytes (n <= what it holds). */
static void ux_skip(struct iovec **cur, int *cnt, size_t n)
{
    while (*cnt > 0 && n >= (*cur)->iov_len) {
        n -= (*cur)->iov_len;
        (*cur)++;
        (*cnt)--;
    }
    if (*cnt > 0 && n) {
        (*cur)->iov_base = (uint8_t *)(*cur)->iov_base + n;
        (*cur)->iov_len -= n;
    }
    while (*cnt > 0 && (*cur)->iov_len == 0) {
        (*cur)++;
        (*cnt)--;
    }
}

/* A message longer than the reader wants: stage it whole. */
static kvt_status ux_stage(ux_stream *u, ucp_tag_message_h m, size_t len, uint64_t dl)
{
    if (len > STAGE_MAX) {
        u->broken = true;
        uint8_t sink[64]; /* truncates: UCX drops the message */
        (void)ux_take(u, m, sink, sizeof sink, ucp_dt_make_contig(1), kvt__now_ns() + REAP_NS);
        return kvt__fail(KVT_EPROTO, "stream: UCX message of %zu bytes exceeds %u", len, STAGE_MAX);
    }
    if (len > u->stage_cap) {
        free(u->stage);
        u->stage_cap = 0;
        u->stage = malloc(len > 4096 ? len : 4096);
        if (!u->stage) {
            u->broken = true;
            uint8_t sink[64];
            (void)ux_take(u, m, sink, sizeof sink, ucp_dt_make_contig(1), kvt__now_ns() + REAP_NS);
            return kvt__fail(KVT_ENOMEM, "stream: out of memory staging %zu bytes", len);
        }
        u->stage_cap = len > 4096 ? len : 4096;
    }
    kvt_status st = ux_take(u, m, u->stage, len, ucp_dt_make_contig(1), dl);
    if (st) return st;
    u->stage_off = 0;
    u->stage_len = len;
    return KVT_OK;
}

/* Copies staged bytes into the cursor, counting them as landed. */
static size_t ux_unstage_landed(ux_stream *u, struct iovec **cur, int *cnt)
{
    size_t got = ux_unstage(u, cur, cnt);
    u->rtaken += got;
    ux_report(u);
    return got;
}

static kvt_status ux_recv_all(ux_stream *u, const struct iovec *iov, int cnt, uint64_t dl)
{
    kvt_status st = kvt__grow((void **)&u->cur, &u->cur_cap, (size_t)cnt, sizeof *u->cur, "stream: iovecs");
    if (st) return st;
    memcpy(u->cur, iov, (size_t)cnt * sizeof *iov);
    struct iovec *cur = u->cur;
    size_t want = 0;
    for (int i = 0; i < cnt; i++) want += iov[i].iov_len;
    u->rtaken = u->rlanded = 0;
    ux_skip(&cur, &cnt, 0);
    want -= ux_unstage_landed(u, &cur, &cnt);
    while (want) {
        ucp_tag_message_h m = NULL;
        size_t len = 0;
        st = ux_next(u, dl, &m, &len);
        if (st) break;
        if (len == 0) {
            st = ux_take(u, m, NULL, 0, ucp_dt_make_contig(1), dl);
        } else if (len <= want && len <= cur->iov_len) {
            /* zero copy, and without waiting: a window of receives in flight
             * (each lands at its own place in the caller's memory), so the
             * sender's rendezvous messages are not taken one round trip at a
             * time */
            st = ux_take_async(u, m, cur->iov_base, len, dl);
            if (!st) {
                ux_skip(&cur, &cnt, len);
                want -= len;
            }
        } else {
            /* longer than the read (a header before its body) or spanning the
             * reader's pieces: land in staging, copy out what is wanted */
            st = ux_stage(u, m, len, dl);
            if (!st) want -= ux_unstage_landed(u, &cur, &cnt);
        }
        if (st) break;
    }
    if (st) u->landed = NULL;
    kvt_status s2 = ux_rflush(u, st ? kvt__now_ns() : dl);
    return st ? st : s2;
}

static kvt_status ux_recvv(kvt_stream *s, const struct iovec *iov, int cnt, uint64_t dl)
{
    ux_stream *u = (ux_stream *)s;
    KVT_CHECK_ARG(cnt >= 0 && (iov || !cnt), "stream: UCX recvv of %d iovecs at %p", cnt, (void *)iov);
    if (u->broken) return kvt__fail(KVT_ECONN, "stream: UCX link lost");
    return ux_recv_all(u, iov, cnt, dl);
}

/* recvv that reports landed bytes as they land in order (stream.h): the
 * caller hashes them while the receives after them stay posted. */
static kvt_status ux_recvv_landed(kvt_stream *s, const struct iovec *iov, int cnt, uint64_t dl,
                                  uint64_t idle_ns, void (*landed)(void *arg, size_t n), void *arg)
{
    ux_stream *u = (ux_stream *)s;
    KVT_CHECK_ARG(cnt >= 0 && (iov || !cnt), "stream: UCX recvv of %d iovecs at %p", cnt, (void *)iov);
    if (u->broken) return kvt__fail(KVT_ECONN, "stream: UCX link lost");
    u->landed = landed;
    u->landed_arg = arg;
    u->idle_ns = idle_ns;
    u->moved_ns = kvt__now_ns();
    kvt_status st = ux_recv_all(u, iov, cnt, dl);
    u->idle_ns = 0;
    u->landed = NULL;
    return st;
}

static int ux_wait(kvt_stream *s, int wake_fd, int timeout_ms)
{
    ux_stream *u = (ux_stream *)s;
    uint64_t dl = kvt__deadline_ns(timeout_ms < 0 ? 0 : timeout_ms);
    for (unsigned idle = 0;;) {
        if (u->stage_off < u->stage_len) return KVT_STREAM_READABLE;
        if (ux_lost(u)) return KVT_STREAM_HUP;
        ucp_tag_recv_info_t info;
        if (ucp_tag_probe_nb(u->worker, UX_TAG, UINT64_MAX, 0, &info)) return KVT_STREAM_READABLE;
        if (ux_progress(u)) {
            idle = 0;
            continue;
        }
        if (kvt__now_ns() >= dl) {
            /* a zero timeout still notices a hang-up or a wake-up */
            struct pollfd p[2] = {{u->base.fd, POLLIN, 0}, {wake_fd, POLLIN, 0}};
            if (poll(p, wake_fd >= 0 ? 2 : 1, 0) > 0) {
                if (p[0].revents && sock_dead(u->base.fd)) {
                    if (ux_pending_after_hup(u)) return KVT_STREAM_READABLE;
                    u->broken = true; /* the close is forced, not a flush to a dead peer */
                    return KVT_STREAM_HUP;
                }
                if (wake_fd >= 0 && p[1].revents) return KVT_STREAM_WOKEN;
            }
            return KVT_STREAM_IDLE;
        }
        if (++idle < SPINS / 4) continue;
        idle = 0;
        int w = ux_sleep(u, wake_fd, dl);
        if (w == KVT_STREAM_HUP && ux_pending_after_hup(u)) return KVT_STREAM_READABLE;
        if (w == KVT_STREAM_HUP) u->broken = true;
        if (w == KVT_STREAM_HUP || w == KVT_STREAM_WOKEN) return w;
    }
}

/* ---- setup and teardown ---- */

/* Closes the endpoint: a flush bounded in time (so the last frames sent
 * reach a live peer), forced when the peer is already lost. */
static void ux_close_ep(ux_stream *u)
{
    if (!u->ep) return;
    uint64_t dl = kvt__now_ns() + REAP_NS;
    ucp_request_param_t cp = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                            .flags = ux_lost(u) ? UCP_EP_CLOSE_FLAG_FORCE : 0};
    void *c = ucp_ep_close_nbx(u->ep, &cp);
    u->ep = NULL;
    if (!UCS_PTR_IS_PTR(c)) return;
    while (ucp_request_check_status(c) == UCS_INPROGRESS && kvt__now_ns() < dl) ux_progress(u);
    ucp_request_free(c); /* still flushing: the worker's destruction ends it */
}

/* Takes every message the worker holds that nobody read, so that worker
 * destruction finds none: UCX prints a WARN for each one it drops there
 * ("unexpected tag-receive descriptor ... was not matched"). They are
 * routine, not lost data: the peer sends until it sees our hang-up (its
 * heartbeat PING every heartbeat_ms; the DATA of a room still moving when
 * the engine stops), so what reaches our worker after the owner's last
 * read is ours to drop, as closing a socket drops unread bytes. Called
 * once the endpoint is closed: each lands truncated in u->sink, an eager
 * message copied out of UCX's buffer, a rendezvous one dropped with no
 * data moved (its endpoint is closed). Bounded by DISCARD_NS; a receive UCX
 * does not finish at once (an eager message still arriving in parts)
 * progresses the worker meanwhile, and what that brings is taken too. */
static void ux_discard_unread(ux_stream *u)
{
    uint64_t dl = kvt__now_ns() + DISCARD_NS;
    ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_DATATYPE, .datatype = ucp_dt_make_contig(1)};
    ucp_tag_recv_info_t info;
    ucp_tag_message_h m;
    while (kvt__now_ns() < dl && (m = ucp_tag_probe_nb(u->worker, UX_TAG, UINT64_MAX, 1, &info))) {
        size_t n = info.length < sizeof u->sink ? info.length : sizeof u->sink;
        void *r = ucp_tag_msg_recv_nbx(u->worker, u->sink, n, m, &p);
        if (!UCS_PTR_IS_PTR(r)) continue; /* taken at once, or refused: gone either way */
        while (ucp_request_check_status(r) == UCS_INPROGRESS && kvt__now_ns() < dl) ux_progress(u);
        if (ucp_request_check_status(r) == UCS_INPROGRESS) ucp_request_cancel(u->worker, r);
        ucp_request_free(r); /* still held: released with the worker, before u->sink goes */
    }
}

static void ux_destroy(kvt_stream *s)
{
    ux_stream *u = (ux_stream *)s;
    /* async sends still out: let them finish briefly, else cancel and reap */
    if (u->req_n && u->worker) (void)ux_flush_reqs(u, kvt__now_ns() + REAP_NS);
    ux_close_ep(u);
    /* Last: the close's flush progressed the worker, and nothing does after
     * this, so nothing unread is left in it when it goes. (Before the close
     * a rendezvous message would be acknowledged, not dropped, and the
     * flush then waits on a peer still sending: REAP_NS per destroy.) */
    if (u->worker) ux_discard_unread(u);
    if (u->worker) {
        ucp_worker_destroy(u->worker);
        ctx_unref();
    }
    if (u->base.fd >= 0) close(u->base.fd);
    for (unsigned i = 0; i < INFLIGHT; i++) free(u->gather[i]);
    free(u->cur);
    free(u->stage);
    free(u);
}

/* The peer sees our hang-up on the socket, which UCX's own connections do
 * not order against: flush the endpoint first (remote completion of every
 * message sent), so the last ones are in the peer's worker when it does. */
static void ux_farewell(kvt_stream *s, uint64_t dl)
{
    ux_stream *u = (ux_stream *)s;
    if (ux_lost(u) || !u->ep || ux_flush_reqs(u, dl) != KVT_OK) return;
    ucp_request_param_t p = {0};
    (void)ux_wait_req(u, ucp_ep_flush_nbx(u->ep, &p), dl, "flush");
}

static const kvt_stream_ops ucx_ops = {"ucx", ux_sendv, ux_recvv, ux_wait, ux_destroy,
                                       ux_sendv_async, ux_flush, ux_farewell,
                                       ux_recvv_landed};

/* Test hook (stream.h), for tests/fuzz/fuzz_ucx_stream.c: one message of
 * any length, so the fuzzer can send what a hostile peer would. */
kvt_status kvt__stream_ucx_send_msg(kvt_stream *s, const void *p, size_t len, uint64_t deadline_ns)
{
    KVT_CHECK_ARG(s != NULL && s->ops == &ucx_ops && (p || !len), "kvt__stream_ucx_send_msg: not a UCX stream");
    ux_stream *u = (ux_stream *)s;
    if (ux_lost(u)) return kvt__fail(KVT_ECONN, "stream: UCX link lost");
    kvt_status st = ux_post(u, p, len, deadline_ns);
    kvt_status s2 = ux_flush_reqs(u, deadline_ns);
    return st ? st : s2;
}

/* Swaps worker addresses over the socket: u32 length (LE), then the bytes. */
static kvt_status ux_swap_addr(int fd, const void *mine, size_t len, uint8_t **peer,
                               size_t *peer_len, uint64_t dl)
{
    uint8_t hl[4];
    kvt__put32(hl, (uint32_t)len);
    struct iovec out[2] = {{hl, 4}, {(void *)mine, len}};
    kvt_status st = kvt__stream_fd_io(fd, out, 2, dl, 1);
    uint8_t pl[4];
    struct iovec in = {pl, 4};
    if (!st) st = kvt__stream_fd_io(fd, &in, 1, dl, 0);
    if (st) return kvt__fail(st, "stream: UCX address exchange %s",
                             st == KVT_ETIMEDOUT ? "timed out" : "lost the peer");
    uint32_t n = kvt__get32(pl);
    if (n == 0 || n > UX_MAX_ADDR)
        return kvt__fail(KVT_EPROTO, "stream: peer's UCX address is %u bytes (1..%u)", n, UX_MAX_ADDR);
    uint8_t *b = malloc(n);
    if (!b) return kvt__fail(KVT_ENOMEM, "stream: out of memory");
    in = (struct iovec){b, n};
    st = kvt__stream_fd_io(fd, &in, 1, dl, 0);
    if (st) {
        free(b);
        return kvt__fail(st, "stream: truncated UCX address from the peer");
    }
    *peer = b;
    *peer_len = n;
    return KVT_OK;
}

static kvt_status ux_setup(ux_stream *u, ucp_context_h ctx, uint64_t dl)
{
    ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                              .thread_mode = UCS_THREAD_MODE_SINGLE};
    ucs_status_t us = ucp_worker_create(ctx, &wp, &u->worker);
    if (us != UCS_OK) {
        u->worker = NULL;
        return kvt__fail(KVT_ESYS, "stream: UCX worker: %s", ucs_status_string(us));
    }
    if (ucp_worker_get_efd(u->worker, &u->efd) != UCS_OK) u->efd = -1;
    ucp_address_t *addr = NULL;
    size_t alen = 0, plen = 0;
    us = ucp_worker_get_address(u->worker, &addr, &alen);
    if (us != UCS_OK) return kvt__fail(KVT_ESYS, "stream: UCX worker address: %s", ucs_status_string(us));
    uint8_t *peer = NULL;
    kvt_status st = ux_swap_addr(u->base.fd, addr, alen, &peer, &plen, dl);
    ucp_worker_release_address(u->worker, addr);
    if (st) return st;
    /* UCX trusts worker addresses: ucp_ep_create takes no length, and its
     * unpacker aborts the process (an assertion, UCX 1.13) on a format
     * version it does not know; fuzz_ucx_stream found a 5-byte exchange
     * that killed a sender that way. kvtier checks what it can, the
     * version; the rest is UCX's to parse, and the shared secret is what
     * keeps strangers from getting this far (docs/pd.md). */
    if ((peer[0] & 0x0fu) > UX_ADDR_VERSION_MAX) {
        unsigned v = peer[0] & 0x0fu;
        free(peer);
        return kvt__fail(KVT_EPROTO, "stream: the peer's UCX worker address has format version %u, "
                         "which this UCX cannot read (0..%u): refused before UCX parses it",
                         v, UX_ADDR_VERSION_MAX);
    }
    /* No UCX peer-failure handling: the socket's hang-up is the liveness
     * signal (every wait polls it; a lost peer's requests are cancelled and
     * reaped with a forced close). Asking for it is costly over tcp (UCX
     * 1.13: ucx_perftest tag_bw 1 MiB with -e ran at ~0.65x, and our
     * receives were copied out of UCX's buffers instead of landing in place)
     * and shared memory (posix, sysv) cannot give it anyway. */
    ucp_ep_params_t ep = {
        .field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE,
        .address = (const ucp_address_t *)peer,
        .err_mode = UCP_ERR_HANDLING_MODE_NONE,
    };
    us = ucp_ep_create(u->worker, &ep, &u->ep);
    free(peer);
    if (us != UCS_OK) {
        u->ep = NULL;
        return kvt__fail(KVT_ECONN, "stream: UCX endpoint: %s", ucs_status_string(us));
    }
    return KVT_OK;
}

kvt_status kvt__stream_ucx_hold(void)
{
    ucp_context_h ctx = NULL;
    return ctx_ref(&ctx);
}

void kvt__stream_ucx_release(void)
{
    ctx_unref();
}

kvt_status kvt__stream_ucx_upgrade(kvt_stream **s, int server, uint64_t deadline_ns)
{
    KVT_CHECK_ARG(s != NULL && *s != NULL, "kvt__stream_ucx_upgrade: stream is NULL");
    KVT_CHECK_ARG((*s)->ops != &ucx_ops, "kvt__stream_ucx_upgrade: stream already on UCX");
    KVT_CHECK_ARG(strcmp((*s)->ops->name, "tcp") == 0,
                  "kvt__stream_ucx_upgrade: a %s stream cannot move to UCX", (*s)->ops->name);
    (void)server; /* the exchange is symmetric: both send, then both read */
    ucp_context_h ctx = NULL;
    kvt_status st = ctx_ref(&ctx);
    if (st) return st;
    ux_stream *u = calloc(1, sizeof *u);
    if (!u) {
        ctx_unref();
        return kvt__fail(KVT_ENOMEM, "stream: out of memory");
    }
    u->base.ops = &ucx_ops;
    u->base.fd = (*s)->fd;
    u->efd = -1;
    st = ux_setup(u, ctx, deadline_ns);
    if (st) {
        u->base.fd = -1; /* still the TCP stream's: the caller destroys it */
        if (!u->worker) ctx_unref();
        ux_destroy(&u->base);
        return st;
    }
    kvt__stream_tcp_free_shell(*s); /* the fd moved to the UCX stream */
    *s = &u->base;
    return KVT_OK;
}
