/* xfer.c - the transfer engine (see xfer.h).
 *
 * State, all under x->mu:
 *  - the queue (head..tail, linked by task->next): submitted tasks that
 *    still have units to hand out, oldest first. A task leaves the queue
 *    when its last unit is handed out, or when it is stopped (cancel, a
 *    failed unit, destroy); a stopped task gets next_layer = num_layers, so
 *    "next_layer < num_layers" <=> "in the queue" for a task not yet ended;
 *  - the reap list (also linked by task->next): stopped tasks with no unit
 *    running. A worker ends them, so on_done always runs on a worker, never
 *    in the thread that called kvt__xfer_cancel (which may hold the
 *    caller's own locks);
 *  - per task: units_running, layer_done[], layers_ready, status, ended.
 * A unit (one layer of one task) is copied without the lock, through the
 * worker's own chunk buffer: no allocation, lock or syscall per block.
 *
 * How a task ends, and why in this order (the lifetime contract):
 *  1. under x->mu: status is final, ended = true, done_cv is broadcast, and
 *     the on_done pointer is read; the task is on no list any more;
 *  2. x->mu is released;
 *  3. on_done(task, status) runs; the engine never touches the task again.
 * ended is set before on_done (not after) because the engine may not write
 * the task once on_done has returned: on_done is where the owner learns the
 * task is over and may free it. So a kvt__xfer_wait_layer() caller can wake
 * up and see the task ended before on_done has run. Consequences for the
 * owner, which the cache honours:
 *  - the task memory stays valid until on_done has returned AND every
 *    kvt__xfer_wait_layer() / kvt__xfer_cancel() call on it has returned
 *    (the cache frees a task only after its result is reported, and reports
 *    it only after on_done);
 *  - wait_layer returning, even with the task's final status, does not mean
 *    on_done has run yet.
 * wait_layer reads ended and layers_ready under x->mu only, so it never sees
 * a torn update, and a layer it reports has had its bytes copied by a
 * worker that released x->mu afterwards (a happens-before edge to the
 * waiter).
 *
 * Final status: the first copy error; else KVT_ECANCELED if a cancel (or
 * destroy) reached the task before it ended, even if every layer landed;
 * else KVT_OK.
 */
#include "xfer/xfer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "util/clock.h"
#include "util/copy.h"
#include "util/err.h"
#include "util/hash.h"
#include "util/sync.h"

/* Chunks a worker collects before calling ops->copy: 12 KiB per worker, and
 * at 32 KiB per chunk 16 MiB of copying per call, so the call overhead is
 * nothing while a cancel is still noticed within one buffer. */
#define XFER_CHUNKS 512
#define XFER_MAX_WORKERS 64

typedef struct xfer_worker {
    kvt_hash_copy sum;  /* the block part being copied and summed (aligned: first) */
    uint8_t *sum_next;  /* the part's next byte in the block (a store's destination, a
                           load's source); NULL: not fusing */
    bool sum_load;      /* fusing a load's check: sum_next follows the sources */
    kvt_xfer *x;
    pthread_t thread;
    uint32_t index;
    void *wctx; /* async ops: the backend's per-worker state */
    kvt_copy_chunk chunks[XFER_CHUNKS];
} xfer_worker;

struct kvt_xfer {
    pthread_mutex_t mu;
    pthread_cond_t work_cv; /* workers: a unit or a task to end, or stop */
    pthread_cond_t done_cv; /* waiters: a layer landed or a task ended */
    kvt_xfer_task *head, *tail;
    kvt_xfer_task *reap;
    bool stopping;
    bool submitted; /* a task was submitted: the ops are fixed */
    kvt_copy_ops ops;
    uint32_t nworkers;
    xfer_worker *workers;
};

static uint32_t task_layers(const kvt_xfer_task *t) { return t->geo->num_layers; }

/* ---- queue (x->mu held) ---- */

static void queue_push(kvt_xfer *x, kvt_xfer_task *t)
{
    t->next = NULL;
    if (x->tail)
        x->tail->next = t;
    else
        x->head = t;
    x->tail = t;
}

/* O(queue length), only on cancel and error paths. */
static void queue_unlink(kvt_xfer *x, kvt_xfer_task *t)
{
    kvt_xfer_task *prev = NULL;
    for (kvt_xfer_task *it = x->head; it; prev = it, it = it->next) {
        if (it != t) continue;
        if (prev)
            prev->next = t->next;
        else
            x->head = t->next;
        if (x->tail == t) x->tail = prev;
        t->next = NULL;
        return;
    }
}

/* Ends t: see "How a task ends" above. Drops and retakes x->mu; t must not
 * be touched afterwards. */
static void task_end_locked(kvt_xfer *x, kvt_xfer_task *t)
{
    kvt_status st = t->status;
    if (st == KVT_OK && atomic_load_explicit(&t->cancel, memory_order_relaxed))
        st = KVT_ECANCELED;
    t->status = st;
    t->ended = true;
    void (*on_done)(kvt_xfer_task *, kvt_status) = t->on_done;
    pthread_cond_broadcast(&x->done_cv);
    pthread_mutex_unlock(&x->mu);
    on_done(t, st);
    pthread_mutex_lock(&x->mu);
}

/* Stops handing out t's units. If none is running, a worker must end it:
 * it goes on the reap list. */
static void task_stop_locked(kvt_xfer *x, kvt_xfer_task *t)
{
    if (t->ended || t->next_layer >= task_layers(t)) return; /* not in the queue */
    queue_unlink(x, t);
    t->next_layer = task_layers(t);
    if (t->units_running == 0) {
        t->next = x->reap;
        x->reap = t;
        pthread_cond_signal(&x->work_cv);
    }
}

/* The next unit of the oldest task, or NULL. May end stopped tasks on the
 * way (dropping the lock meanwhile). */
static kvt_xfer_task *claim_unit(kvt_xfer *x, uint32_t *layer)
{
    kvt_xfer_task *t;
    while ((t = x->head) != NULL) {
        uint32_t nl = task_layers(t);
        if (atomic_load_explicit(&t->cancel, memory_order_relaxed) || t->status != KVT_OK) {
            x->head = t->next;
            if (!x->head) x->tail = NULL;
            t->next = NULL;
            t->next_layer = nl;
            if (t->units_running == 0) task_end_locked(x, t);
            continue;
        }
        *layer = t->next_layer++;
        t->units_running++;
        if (t->next_layer == nl) {
            x->head = t->next;
            if (!x->head) x->tail = NULL;
            t->next = NULL;
        }
        /* More work left: wake another worker (no syscall when none sleeps). */
        if (x->head) pthread_cond_signal(&x->work_cv);
        return t;
    }
    return NULL;
}

static void unit_done_locked(kvt_xfer *x, kvt_xfer_task *t, uint32_t layer, kvt_status rc)
{
    uint32_t nl = task_layers(t);
    t->units_running--;
    if (rc == KVT_OK) {
        t->layer_done[layer] = 1;
        uint32_t before = t->layers_ready;
        while (t->layers_ready < nl && t->layer_done[t->layers_ready]) t->layers_ready++;
        if (t->layers_ready != before) pthread_cond_broadcast(&x->done_cv);
    } else {
        if (rc != KVT_ECANCELED && t->status == KVT_OK) t->status = rc;
        if (rc == KVT_ECANCELED) atomic_store_explicit(&t->cancel, 1, memory_order_relaxed);
        if (t->next_layer < nl) {
            queue_unlink(x, t);
            t->next_layer = nl;
        }
    }
    if (t->next_layer >= nl && t->units_running == 0) task_end_locked(x, t);
}

/* ---- the copy of one unit (no lock held) ---- */

/* A summing store over plain memcpy copies each chunk while hashing it
 * (kvt_hash_copy), as long as the chunks fill the block part in order
 * (every layout kvtier builds): each run of chunks that continues the part
 * is one kvt__hash_copy_feedv. A chunk out of order ends the fusing, and
 * sum_end hashes the part in a second pass. No fence: run_unit fences
 * once per unit. */
static kvt_status copy_fused(xfer_worker *w, uint32_t n)
{
    const kvt_copy_ops *ops = &w->x->ops;
    for (uint32_t i = 0; i < n;) {
        uint32_t j = i;
        uint64_t room = w->sum.total - w->sum.pos;
        while (w->sum_next && j < n) {
            const kvt_copy_chunk *ch = &w->chunks[j];
            const uint8_t *side = w->sum_load ? ch->src : ch->dst;
            if (side != w->sum_next || ch->len > room) break;
            w->sum_next += ch->len;
            room -= ch->len;
            j++;
        }
        if (j > i) {
            kvt__hash_copy_feedv(&w->sum, &w->chunks[i], j - i);
            i = j;
            continue;
        }
        w->sum_next = NULL; /* out of order: the rest is copied, sum_end hashes */
        kvt_status rc = ops->copy(ops->ctx, &w->chunks[i], 1);
        if (rc != KVT_OK) return rc;
        i++;
    }
    return KVT_OK;
}

static kvt_status flush(xfer_worker *w, kvt_xfer_task *t, uint32_t n)
{
    if (atomic_load_explicit(&t->cancel, memory_order_relaxed)) return KVT_ECANCELED;
    const kvt_copy_ops *ops = &w->x->ops;
    if (ops->copy_async) return ops->copy_async(ops->ctx, &w->wctx, (int)t->dir, w->chunks, n);
    if (w->sum_next) return copy_fused(w, n);
    if (t->dir == KVT_XFER_GATHER && ops->plain_memcpy) {
        /* Into the tier: streaming stores (util/copy.h), fenced once per
         * unit (run_unit), before the unit is reported. */
        for (uint32_t i = 0; i < n; i++)
            kvt__copy_stream(w->chunks[i].dst, w->chunks[i].src, (size_t)w->chunks[i].len);
        return KVT_OK;
    }
    return ops->copy(ops->ctx, w->chunks, n);
}

static kvt_status build_unit(xfer_worker *w, kvt_xfer_task *t, uint32_t layer);

/* Async ops: enqueue the unit, record its event (and tell
 * kvt__xfer_wait_recorded), then wait for the stream. */
static uint8_t *sum_part(const kvt_xfer_task *t, uint32_t b, uint32_t layer, uint64_t *len);
static kvt_status check_parts(const kvt_xfer_task *t, uint32_t layer);

static kvt_status run_unit(xfer_worker *w, kvt_xfer_task *t, uint32_t layer)
{
    const kvt_copy_ops *ops = &w->x->ops;
    if (!ops->copy_async) {
        /* The unit's streaming stores (fused or not), fenced once before
         * it is reported landed, not after every block's part (each
         * fence waits for the write-combining buffers to drain). */
        kvt_status rc = build_unit(w, t, layer);
        kvt__copy_stream_fence();
        return rc;
    }
    /* A load's blocks are checked on the host before the device copies
     * them: the device's bytes are never read back by the CPU. */
    kvt_status rc = t->dir == KVT_XFER_SCATTER && t->expect_sums ? check_parts(t, layer)
                                                                  : KVT_OK;
    if (rc != KVT_OK) return rc; /* nothing enqueued */
    rc = build_unit(w, t, layer);
    if (rc == KVT_OK && ops->record) {
        rc = ops->record(ops->ctx, &w->wctx, t->layer_events ? &t->layer_events[layer] : NULL);
        if (rc == KVT_OK) {
            pthread_mutex_lock(&w->x->mu);
            t->layer_recorded[layer] = 1;
            pthread_cond_broadcast(&w->x->done_cv);
            pthread_mutex_unlock(&w->x->mu);
        }
    }
    kvt_status sr = ops->sync ? ops->sync(ops->ctx, &w->wctx) : KVT_OK;
    if (rc == KVT_OK && sr == KVT_OK && t->dir == KVT_XFER_GATHER && t->layer_sums) {
        /* The bytes reached the (host) blocks at sync: one pass each over
         * what landed, as build_unit's unfused sums (device memory is never
         * read by the CPU). */
        for (uint32_t b = 0; b < t->num_blocks; b++) {
            uint64_t len;
            uint8_t *seg = sum_part(t, b, layer, &len);
            t->layer_sums[(uint64_t)b * t->geo->num_layers + layer] =
                kvt__hash64(seg, (size_t)len, layer);
        }
    }
    return rc != KVT_OK ? rc : sr;
}

/* Layer's part of block b: [*seg, *seg + *len). */
static uint8_t *sum_part(const kvt_xfer_task *t, uint32_t b, uint32_t layer, uint64_t *len)
{
    const kvt_geometry *g = t->geo;
    *len = (uint64_t)t->block_tokens * kvt__geo_layer_token_bytes(g, layer);
    return t->blocks[b] + kvt__geo_block_offset(g, t->block_tokens, layer, 0);
}

/* Before layer's part of block b is copied: fuse its hash into the copy
 * when the ops are plain memcpy and the CPU has the fused form. */
static void sum_begin(xfer_worker *w, const kvt_xfer_task *t, uint32_t b, uint32_t layer)
{
    uint64_t len;
    uint8_t *seg = sum_part(t, b, layer, &len);
    bool fuse = w->x->ops.plain_memcpy && kvt__hash_copy_begin(&w->sum, len, layer);
    w->sum_next = fuse ? seg : NULL;
    w->sum_load = t->dir == KVT_XFER_SCATTER;
}

/* A load's part of block b that hashes to `have` against the checksum it
 * was stored with. */
static kvt_status part_verdict(const kvt_xfer_task *t, uint32_t b, uint32_t layer, uint64_t have)
{
    uint64_t want = t->expect_sums[(uint64_t)b * t->geo->num_layers + layer];
    if (have == want) return KVT_OK;
    return kvt__fail(KVT_ECORRUPT, "load: layer %u of block %u holds bytes unlike those it "
                     "was stored with (checksum %016llx, stored %016llx); the layer is not "
                     "reported landed", layer, b, (unsigned long long)have,
                     (unsigned long long)want);
}

/* A load's layer, checked in the blocks before any of it is copied (the
 * asynchronous ops' way). */
static kvt_status check_parts(const kvt_xfer_task *t, uint32_t layer)
{
    for (uint32_t b = 0; b < t->num_blocks; b++) {
        uint64_t len;
        uint8_t *seg = sum_part(t, b, layer, &len);
        kvt_status rc = part_verdict(t, b, layer, kvt__hash64(seg, (size_t)len, layer));
        if (rc != KVT_OK) return rc;
    }
    return KVT_OK;
}

/* The hash of layer's bytes in block b, just copied (seeded with the
 * layer, as kvt__srv_layer_sums computes it): from the fused copy when it
 * covered the part, else one pass over it. A store keeps it in
 * layer_sums; a load compares it with expect_sums. */
static kvt_status sum_end(xfer_worker *w, const kvt_xfer_task *t, uint32_t b, uint32_t layer)
{
    uint64_t len;
    uint8_t *seg = sum_part(t, b, layer, &len);
    uint64_t have = w->sum_next == seg + len ? kvt__hash_copy_end(&w->sum)
                                             : kvt__hash64(seg, (size_t)len, layer);
    w->sum_next = NULL;
    if (t->dir == KVT_XFER_SCATTER) return part_verdict(t, b, layer, have);
    t->layer_sums[(uint64_t)b * t->geo->num_layers + layer] = have;
    return KVT_OK;
}

/* Appends one chunk to the worker's list, merged into the previous one when
 * it continues it on both sides (neighbouring pages of a neighbouring block
 * part), flushing a full list first. */
static kvt_status add_chunk(xfer_worker *w, kvt_xfer_task *t, uint32_t *n, uint8_t *dst,
                            const uint8_t *src, uint64_t len)
{
    kvt_copy_chunk *ch = w->chunks;
    if (*n > 0 && (uint8_t *)ch[*n - 1].dst + ch[*n - 1].len == dst &&
        (const uint8_t *)ch[*n - 1].src + ch[*n - 1].len == src) {
        ch[*n - 1].len += len;
        return KVT_OK;
    }
    if (*n == XFER_CHUNKS) {
        kvt_status rc = flush(w, t, *n);
        if (rc != KVT_OK) return rc;
        *n = 0;
    }
    ch[(*n)++] = (kvt_copy_chunk){.dst = dst, .src = src, .len = len};
    return KVT_OK;
}

/* One engine page of one unit <-> its part of a cache block: one chunk, or
 * one per token when the engine interleaves the page's tokens with other
 * data (strided memory, e.g. SGLang's page_first pool). */
static kvt_status add_page(xfer_worker *w, kvt_xfer_task *t, uint32_t *n, uint32_t unit,
                           uint32_t page, uint8_t *cache, uint64_t tb)
{
    const uint32_t tpp = t->geo->tokens_per_page;
    const bool gather = t->dir == KVT_XFER_GATHER;
    uint8_t *eng = kvt__page_addr(t->map, unit, page);
    uint64_t ts = t->map->token_stride[unit];
    if (ts == tb) /* contiguous tokens: the page is one run */
        return gather ? add_chunk(w, t, n, cache, eng, tb * tpp) : add_chunk(w, t, n, eng, cache, tb * tpp);
    for (uint32_t k = 0; k < tpp; k++) {
        uint8_t *e = eng + (uint64_t)k * ts, *c = cache + (uint64_t)k * tb;
        kvt_status rc = gather ? add_chunk(w, t, n, c, e, tb) : add_chunk(w, t, n, e, c, tb);
        if (rc != KVT_OK) return rc;
    }
    return KVT_OK;
}

static kvt_status build_unit(xfer_worker *w, kvt_xfer_task *t, uint32_t layer)
{
    const kvt_geometry *g = t->geo;
    const uint32_t ppb = t->block_tokens / g->tokens_per_page;
    const bool gather = t->dir == KVT_XFER_GATHER;
    /* Summing (a store's checksums, or a load's check): each block's part
     * is flushed on its own, hashed while it is copied or right after. */
    const bool sums = (gather ? t->layer_sums != NULL : t->expect_sums != NULL) &&
                      !w->x->ops.copy_async;
    uint32_t n = 0;
    for (uint32_t b = 0; b < t->num_blocks; b++) {
        const uint32_t *pg = t->pages + (uint64_t)b * ppb;
        if (sums) sum_begin(w, t, b, layer);
        for (uint32_t c = 0; c < kvt__geo_ncomp(g, layer); c++) {
            uint64_t tb = kvt__geo_token_bytes(g, layer, c);
            if (tb == 0) continue;
            uint32_t unit = KVT_UNIT(layer, c);
            uint8_t *blk = t->blocks[b] + kvt__geo_block_offset(g, t->block_tokens, layer, c);
            for (uint32_t j = 0; j < ppb; j++) {
                if (pg[j] == KVT_PAGE_SKIP) continue; /* a load leaves this page alone */
                uint8_t *cache = blk + (uint64_t)j * tb * g->tokens_per_page;
                kvt_status rc = add_page(w, t, &n, unit, pg[j], cache, tb);
                if (rc != KVT_OK) return rc;
            }
        }
        if (sums) {
            kvt_status rc = n ? flush(w, t, n) : KVT_OK;
            if (rc != KVT_OK) {
                w->sum_next = NULL;
                return rc;
            }
            n = 0;
            rc = sum_end(w, t, b, layer);
            if (rc != KVT_OK) return rc;
        }
    }
    return n ? flush(w, t, n) : KVT_OK;
}

static void *worker_main(void *arg)
{
    xfer_worker *w = arg;
    kvt_xfer *x = w->x;
    char name[16];
    snprintf(name, sizeof name, "kvt-xfer-%u", w->index);
    pthread_setname_np(pthread_self(), name);

    pthread_mutex_lock(&x->mu);
    for (;;) {
        if (x->reap) {
            kvt_xfer_task *t = x->reap;
            x->reap = t->next;
            t->next = NULL;
            task_end_locked(x, t);
            continue;
        }
        uint32_t layer;
        kvt_xfer_task *t = claim_unit(x, &layer);
        if (t) {
            pthread_mutex_unlock(&x->mu);
            kvt_status rc = run_unit(w, t, layer);
            pthread_mutex_lock(&x->mu);
            unit_done_locked(x, t, layer, rc);
            continue;
        }
        if (x->stopping) break;
        pthread_cond_wait(&x->work_cv, &x->mu);
    }
    pthread_mutex_unlock(&x->mu);
    if (w->wctx && x->ops.worker_exit) x->ops.worker_exit(x->ops.ctx, w->wctx);
    w->wctx = NULL;
    return NULL;
}

/* ---- API ---- */

static void xfer_free(kvt_xfer *x)
{
    pthread_cond_destroy(&x->work_cv);
    pthread_cond_destroy(&x->done_cv);
    pthread_mutex_destroy(&x->mu);
    free(x->workers);
    free(x);
}

static void stop_and_join(kvt_xfer *x, uint32_t started)
{
    pthread_mutex_lock(&x->mu);
    x->stopping = true;
    while (x->head) {
        kvt_xfer_task *t = x->head;
        atomic_store_explicit(&t->cancel, 1, memory_order_relaxed);
        task_stop_locked(x, t); /* unlinks t, so the loop advances */
    }
    pthread_cond_broadcast(&x->work_cv);
    pthread_mutex_unlock(&x->mu);
    for (uint32_t i = 0; i < started; i++) pthread_join(x->workers[i].thread, NULL);
}

kvt_status kvt__xfer_create(kvt_xfer **out, uint32_t workers, const kvt_copy_ops *ops)
{
    static const char fn[] = "kvt__xfer_create";
    KVT_CHECK_NOT_NULL(out, fn);
    KVT_CHECK_NOT_NULL(ops, fn);
    KVT_CHECK_ARG(ops->copy != NULL, "%s: ops->copy is NULL (ops \"%s\")", fn,
                  ops->name ? ops->name : "?");
    KVT_CHECK_ARG(workers >= 1 && workers <= XFER_MAX_WORKERS,
                  "%s: workers is %u (must be 1..%u)", fn, workers, XFER_MAX_WORKERS);
    kvt_xfer *x = calloc(1, sizeof *x);
    if (!x) return kvt__fail(KVT_ENOMEM, "%s: out of memory", fn);
    x->ops = *ops;
    x->nworkers = workers;
    int rc = pthread_mutex_init(&x->mu, NULL);
    if (rc) goto fail_mu;
    rc = kvt__cond_init(&x->work_cv);
    if (rc) goto fail_work_cv;
    rc = kvt__cond_init(&x->done_cv);
    if (rc) goto fail_done_cv;
    /* aligned: each worker's kvt_hash_copy holds 64-byte aligned state */
    x->workers = aligned_alloc(_Alignof(xfer_worker), workers * sizeof *x->workers);
    if (x->workers) memset(x->workers, 0, workers * sizeof *x->workers);
    if (!x->workers) {
        xfer_free(x);
        return kvt__fail(KVT_ENOMEM, "%s: out of memory for %u workers", fn, workers);
    }
    for (uint32_t i = 0; i < workers; i++) {
        x->workers[i].x = x;
        x->workers[i].index = i;
        rc = pthread_create(&x->workers[i].thread, NULL, worker_main, &x->workers[i]);
        if (rc) {
            stop_and_join(x, i);
            xfer_free(x);
            return kvt__fail(KVT_ESYS, "%s: pthread_create of worker %u failed: %s", fn, i,
                             strerror(rc));
        }
    }
    *out = x;
    return KVT_OK;

fail_done_cv:
    pthread_cond_destroy(&x->work_cv);
fail_work_cv:
    pthread_mutex_destroy(&x->mu);
fail_mu:
    free(x);
    return kvt__fail(KVT_ESYS, "%s: mutex or condition variable init failed: %s", fn,
                     strerror(rc));
}

void kvt__xfer_destroy(kvt_xfer *x)
{
    if (!x) return;
    stop_and_join(x, x->nworkers);
    xfer_free(x);
}

static kvt_status check_task(const kvt_xfer_task *t)
{
    static const char fn[] = "kvt__xfer_submit";
    KVT_CHECK_ARG(t->dir == KVT_XFER_GATHER || t->dir == KVT_XFER_SCATTER,
                  "%s: dir %d is neither GATHER nor SCATTER", fn, (int)t->dir);
    KVT_CHECK_NOT_NULL(t->geo, fn);
    KVT_CHECK_NOT_NULL(t->map, fn);
    KVT_CHECK_NOT_NULL(t->on_done, fn);
    uint32_t tpp = t->geo->tokens_per_page;
    KVT_CHECK_ARG(t->geo->num_layers >= 1 && t->geo->num_layers <= KVT_MAX_LAYERS,
                  "%s: geometry has %u layers (must be 1..%u)", fn, t->geo->num_layers,
                  KVT_MAX_LAYERS);
    KVT_CHECK_ARG(t->block_tokens > 0 && t->block_tokens % tpp == 0,
                  "%s: block_tokens %u is not a positive multiple of tokens_per_page %u", fn,
                  t->block_tokens, tpp);
    if (t->num_blocks == 0) return KVT_OK;
    KVT_CHECK_NOT_NULL(t->blocks, fn);
    KVT_CHECK_NOT_NULL(t->pages, fn);
    for (uint32_t b = 0; b < t->num_blocks; b++)
        KVT_CHECK_ARG(t->blocks[b] != NULL, "%s: blocks[%u] is NULL", fn, b);
    uint64_t npages = (uint64_t)t->num_blocks * (t->block_tokens / tpp);
    for (uint64_t i = 0; i < npages; i++) {
        if (t->pages[i] == KVT_PAGE_SKIP && t->dir == KVT_XFER_SCATTER) continue;
        KVT_CHECK_ARG(t->pages[i] < t->map->num_pages,
                      "%s: pages[%llu] is %u, past the engine's %u pages", fn,
                      (unsigned long long)i, t->pages[i], t->map->num_pages);
    }
    return KVT_OK;
}

kvt_status kvt__xfer_submit(kvt_xfer *x, kvt_xfer_task *task)
{
    KVT_CHECK_NOT_NULL(x, "kvt__xfer_submit");
    KVT_CHECK_NOT_NULL(task, "kvt__xfer_submit");
    kvt_status st = check_task(task);
    if (st != KVT_OK) return st;
    task->next_layer = 0;
    task->units_running = 0;
    task->layers_ready = 0;
    memset(task->layer_done, 0, task_layers(task));
    memset(task->layer_recorded, 0, task_layers(task));
    atomic_store_explicit(&task->cancel, 0, memory_order_relaxed);
    task->status = KVT_OK;
    task->ended = false;
    task->next = NULL;

    pthread_mutex_lock(&x->mu);
    if (x->stopping) {
        pthread_mutex_unlock(&x->mu);
        return kvt__fail(KVT_ESTATE, "kvt__xfer_submit: the transfer engine is shutting down");
    }
    x->submitted = true;
    queue_push(x, task);
    pthread_cond_signal(&x->work_cv);
    pthread_mutex_unlock(&x->mu);
    return KVT_OK;
}

void kvt__xfer_cancel(kvt_xfer *x, kvt_xfer_task *task)
{
    if (!x || !task) return;
    atomic_store_explicit(&task->cancel, 1, memory_order_relaxed);
    pthread_mutex_lock(&x->mu);
    task_stop_locked(x, task);
    pthread_mutex_unlock(&x->mu);
}

kvt_status kvt__xfer_wait_layer(kvt_xfer *x, kvt_xfer_task *task, uint32_t layer,
                                uint64_t deadline_ns)
{
    static const char fn[] = "kvt__xfer_wait_layer";
    KVT_CHECK_NOT_NULL(x, fn);
    KVT_CHECK_NOT_NULL(task, fn);
    KVT_CHECK_ARG(layer < task_layers(task), "%s: layer %u is past the task's %u layers", fn,
                  layer, task_layers(task));
    kvt_status st;
    uint32_t ready;
    pthread_mutex_lock(&x->mu);
    for (;;) {
        ready = task->layers_ready;
        if (ready > layer) {
            st = KVT_OK;
            break;
        }
        if (task->ended) {
            st = task->status;
            break;
        }
        if (kvt__now_ns() >= deadline_ns) {
            st = KVT_ETIMEDOUT;
            break;
        }
        kvt__cond_wait_until(&x->done_cv, &x->mu, deadline_ns);
    }
    pthread_mutex_unlock(&x->mu);
    if (st == KVT_ETIMEDOUT)
        return kvt__fail(st, "%s: layer %u not landed by the deadline (%u layers landed)", fn,
                         layer, ready);
    if (st != KVT_OK)
        return kvt__fail(st, "%s: the task ended with %s before layer %u landed", fn,
                         kvt_status_name(st), layer);
    return KVT_OK;
}

uint32_t kvt__xfer_workers(const kvt_xfer *x) { return x ? x->nworkers : 0; }

kvt_status kvt__xfer_set_ops(kvt_xfer *x, const kvt_copy_ops *ops)
{
    static const char fn[] = "kvt__xfer_set_ops";
    KVT_CHECK_NOT_NULL(x, fn);
    KVT_CHECK_NOT_NULL(ops, fn);
    KVT_CHECK_ARG(ops->copy != NULL || ops->copy_async != NULL,
                  "%s: ops \"%s\" has neither copy nor copy_async", fn, ops->name ? ops->name : "?");
    pthread_mutex_lock(&x->mu);
    bool late = x->submitted;
    if (!late) x->ops = *ops;
    pthread_mutex_unlock(&x->mu);
    if (late)
        return kvt__fail(KVT_ESTATE, "%s: tasks were already submitted with ops \"%s\"", fn,
                         x->ops.name ? x->ops.name : "?");
    return KVT_OK;
}

kvt_status kvt__xfer_wait_recorded(kvt_xfer *x, kvt_xfer_task *task, uint32_t layer,
                                   uint64_t deadline_ns)
{
    static const char fn[] = "kvt__xfer_wait_recorded";
    KVT_CHECK_NOT_NULL(x, fn);
    KVT_CHECK_NOT_NULL(task, fn);
    KVT_CHECK_ARG(layer < task_layers(task), "%s: layer %u is past the task's %u layers", fn,
                  layer, task_layers(task));
    kvt_status st;
    pthread_mutex_lock(&x->mu);
    for (;;) {
        if (task->layer_recorded[layer]) {
            st = KVT_OK;
            break;
        }
        if (task->ended) {
            st = task->status == KVT_OK ? KVT_ESTATE : task->status;
            break;
        }
        if (kvt__now_ns() >= deadline_ns) {
            st = KVT_ETIMEDOUT;
            break;
        }
        kvt__cond_wait_until(&x->done_cv, &x->mu, deadline_ns);
    }
    pthread_mutex_unlock(&x->mu);
    if (st == KVT_ETIMEDOUT)
        return kvt__fail(st, "%s: layer %u not enqueued by the deadline", fn, layer);
    if (st == KVT_ESTATE)
        return kvt__fail(st, "%s: layer %u has no event (the copy backend records none)", fn,
                         layer);
    if (st != KVT_OK)
        return kvt__fail(st, "%s: the task ended with %s before layer %u was enqueued", fn,
                         kvt_status_name(st), layer);
    return KVT_OK;
}
