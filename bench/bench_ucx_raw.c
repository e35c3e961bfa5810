/* bench_ucx_raw.c - UCX's own limit for the PD hand-off's job: the same
 * engine buffers (prefill's into decode's) as a stream of 1 MiB tag
 * messages between two workers of one process, one thread each, busy
 * polling, WIN receives pre-posted and WIN sends in flight, no framing and
 * no checksums. ucx_perftest measures the transport with one cache-hot
 * buffer; this measures it with the hand-off's memory, so the ratio to it
 * is what kvtier itself costs. Uses kvtier's UCX loader (net/ucx_api.h). */
#include "bench_ucx_raw.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include "net/ucx_api.h"
#include "util/clock.h"

#define MSG (1u << 20)      /* a message: the hand-off's chunk */
#define WIN 16              /* sends in flight; receives posted ahead */
#define TAG 0x52415755ull   /* "RAWU" */
#define LIMIT_NS (60ull * 1000000000ull)

static const kvt_ucx_api *U;

/* The i-th message's place in buffers b (src or dst side). */
typedef struct cursor {
    const raw_bufs *b;
    int buf;
    uint64_t off;
} cursor;

static int next_msg(cursor *c, int dst, void **p, size_t *len)
{
    while (c->buf < c->b->n && c->off == c->b->len[c->buf]) {
        c->buf++;
        c->off = 0;
    }
    if (c->buf == c->b->n) return 0;
    uint64_t left = c->b->len[c->buf] - c->off;
    *len = left < MSG ? (size_t)left : MSG;
    *p = (dst ? c->b->dst[c->buf] : c->b->src[c->buf]) + c->off;
    c->off += *len;
    return 1;
}

typedef struct side {
    ucp_worker_h w;
    ucp_ep_h ep; /* sender only */
    const raw_bufs *b;
    int recv;
    atomic_int *go;
    int ok;
} side;

#define CANCEL_NS 1000000000ull /* bound on a cancelled request (UCX may not cancel a send) */

/* Frees r, cancelled first if still running, after progressing w until it
 * ends or CANCEL_NS pass (UCX releases one it still holds when it
 * completes, or with the worker). */
static void cancel_free(ucp_worker_h w, void *r)
{
    uint64_t dl = kvt__now_ns() + CANCEL_NS;
    if (U->request_check_status(r) == UCS_INPROGRESS) U->request_cancel(w, r);
    while (U->request_check_status(r) == UCS_INPROGRESS && kvt__now_ns() < dl) U->worker_progress(w);
    U->request_free(r);
}

/* Waits for the oldest request of a window (NULL: done at post). */
static int retire(ucp_worker_h w, void *r, uint64_t dl)
{
    if (r == NULL) return 0;
    if (UCS_PTR_IS_ERR(r)) return -1;
    while (U->request_check_status(r) == UCS_INPROGRESS) {
        U->worker_progress(w);
        if (kvt__now_ns() > dl) {
            cancel_free(w, r);
            return -1;
        }
    }
    ucs_status_t st = U->request_check_status(r);
    U->request_free(r);
    return st == UCS_OK ? 0 : -1;
}

static void *run_side(void *arg)
{
    side *s = arg;
    while (!atomic_load(s->go)) U->worker_progress(s->w); /* wire-up meanwhile */
    uint64_t dl = kvt__now_ns() + LIMIT_NS;
    cursor c = {s->b, 0, 0};
    void *win[WIN] = {0};
    unsigned head = 0, n = 0;
    ucp_request_param_t prm = {.op_attr_mask = UCP_OP_ATTR_FIELD_DATATYPE, .datatype = ucp_dt_make_contig(1)};
    void *p;
    size_t len;
    int err = 0;
    while (!err && next_msg(&c, s->recv, &p, &len)) {
        if (n == WIN) {
            err = retire(s->w, win[head], dl);
            head = (head + 1) % WIN;
            n--;
        }
        win[(head + n++) % WIN] = s->recv ? U->tag_recv_nbx(s->w, p, len, TAG, UINT64_MAX, &prm)
                                          : U->tag_send_nbx(s->ep, p, len, TAG, &prm);
        U->worker_progress(s->w);
    }
    for (; n; n--, head = (head + 1) % WIN) err |= retire(s->w, win[head], err ? kvt__now_ns() : dl);
    s->ok = !err;
    return NULL;
}

static int make_worker(ucp_context_h ctx, ucp_worker_h *w)
{
    ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                              .thread_mode = UCS_THREAD_MODE_SINGLE};
    return U->worker_create(ctx, &wp, w) == UCS_OK ? 0 : -1;
}

/* Two workers, an endpoint from the sender's to the receiver's. */
static int wire(ucp_context_h ctx, side *tx, side *rx)
{
    if (make_worker(ctx, &tx->w) || make_worker(ctx, &rx->w)) return -1;
    ucp_address_t *addr;
    size_t alen;
    if (U->worker_get_address(rx->w, &addr, &alen) != UCS_OK) return -1;
    ucp_ep_params_t ep = {.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS, .address = addr};
    ucs_status_t st = U->ep_create(tx->w, &ep, &tx->ep);
    U->worker_release_address(rx->w, addr);
    return st == UCS_OK ? 0 : -1;
}

/* One small message through before timing: UCX connects lazily. */
static int warm_up(side *tx, side *rx)
{
    uint64_t out = 1, in = 0, dl = kvt__now_ns() + 10000000000ull;
    ucp_request_param_t prm = {.op_attr_mask = UCP_OP_ATTR_FIELD_DATATYPE, .datatype = ucp_dt_make_contig(1)};
    void *r = U->tag_recv_nbx(rx->w, &in, sizeof in, TAG + 1, UINT64_MAX, &prm);
    void *t = U->tag_send_nbx(tx->ep, &out, sizeof out, TAG + 1, &prm);
    int bad = UCS_PTR_IS_ERR(r) || UCS_PTR_IS_ERR(t);
    while (!bad && ((r && U->request_check_status(r) == UCS_INPROGRESS) ||
                    (t && U->request_check_status(t) == UCS_INPROGRESS))) {
        U->worker_progress(tx->w);
        U->worker_progress(rx->w);
        if (kvt__now_ns() > dl) bad = 1;
    }
    if (UCS_PTR_IS_PTR(r)) cancel_free(rx->w, r); /* done by now unless bad */
    if (UCS_PTR_IS_PTR(t)) cancel_free(tx->w, t);
    return bad || in != 1 ? -1 : 0;
}

static void unwire(side *tx, side *rx)
{
    if (tx->ep) {
        ucp_request_param_t prm = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS, .flags = UCP_EP_CLOSE_FLAG_FORCE};
        void *r = U->ep_close_nbx(tx->ep, &prm);
        if (r && !UCS_PTR_IS_ERR(r)) {
            uint64_t dl = kvt__now_ns() + 1000000000ull;
            while (U->request_check_status(r) == UCS_INPROGRESS && kvt__now_ns() < dl) {
                U->worker_progress(tx->w);
                U->worker_progress(rx->w);
            }
            U->request_free(r);
        }
    }
    if (tx->w) U->worker_destroy(tx->w);
    if (rx->w) U->worker_destroy(rx->w);
}

static double run(ucp_context_h ctx, const raw_bufs *b)
{
    atomic_int go = 0;
    side tx = {.b = b, .recv = 0, .go = &go}, rx = {.b = b, .recv = 1, .go = &go};
    double gbps = -1;
    pthread_t th[2];
    int started = 0;
    if (wire(ctx, &tx, &rx) || warm_up(&tx, &rx)) {
        fprintf(stderr, "kvtier bench pd: raw UCX stream: cannot create workers or connect them\n");
    } else if (pthread_create(&th[0], NULL, run_side, &rx) == 0 && ++started &&
               pthread_create(&th[1], NULL, run_side, &tx) == 0 && ++started) {
        uint64_t t0 = kvt__now_ns(), bytes = 0;
        atomic_store(&go, 1);
        pthread_join(th[0], NULL);
        pthread_join(th[1], NULL);
        started = 0;
        for (int i = 0; i < b->n; i++) bytes += b->len[i];
        if (rx.ok && tx.ok) gbps = (double)bytes / ((double)(kvt__now_ns() - t0) / 1e9) / 1e9;
        else fprintf(stderr, "kvtier bench pd: raw UCX stream failed or timed out\n");
    }
    if (started) { /* the second thread did not start: release the first */
        atomic_store(&go, 1);
        tx.ok = 0;
        pthread_join(th[0], NULL);
    }
    unwire(&tx, &rx);
    return gbps;
}

double kvt_bench_raw_ucx_gbps(const raw_bufs *b)
{
    if (kvt__ucx_api(&U)) {
        fprintf(stderr, "kvtier bench pd: %s\n", kvt_last_error());
        return -1;
    }
    ucp_config_t *cfg;
    if (U->config_read(NULL, NULL, &cfg) != UCS_OK) return -1;
    ucp_params_t prm = {.field_mask = UCP_PARAM_FIELD_FEATURES, .features = UCP_FEATURE_TAG};
    ucp_context_h ctx;
    ucs_status_t st = U->init_version(UCP_API_MAJOR, UCP_API_MINOR, &prm, cfg, &ctx);
    U->config_release(cfg);
    if (st != UCS_OK) {
        fprintf(stderr, "kvtier bench pd: raw UCX stream: ucp_init: %s\n", U->status_string(st));
        return -1;
    }
    double gbps = run(ctx, b);
    U->cleanup(ctx);
    return gbps;
}
