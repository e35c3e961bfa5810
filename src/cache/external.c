/* external.c - tasks another process copies (see external.h). */
#include "cache/external.h"

#include <stdlib.h>

#include "cache/cache.h"
#include "cache/tasks.h"
#include "cache/tiers.h"
#include "util/clock.h"

/* Defined in ops.c: commits or rolls back, unpins, parks the result. */
void kvt__cache_end_task(kvt_cache *c, kvt_task *t, kvt_status st);

void kvt__cache_ext_shm(kvt_cache *c, kvt_ext_shm *out)
{
    int fd = kvt__pool_fd(c->pool);
    kvt_ext_shm s = {
        .fd = fd, .base = kvt__pool_base(c->pool), .map_bytes = kvt__pool_map_bytes(c->pool), .stride = kvt__pool_stride(c->pool),
        .block_bytes = c->block_bytes, .block_tokens = c->cfg.block_tokens,
        .num_blocks = kvt__pool_blocks_total(c->pool), .pages = kvt__pool_page_kind(c->pool),
        .sparse = kvt__pool_budgeted(c->pool),
    };
    *out = s;
}

/* No lock: the slots belong to the caller's running task, and a slot is
 * unmapped (kvt__pool_release) only while free. */
void kvt__cache_ext_populate(kvt_cache *c, const uint64_t *offsets, uint32_t n)
{
    kvt__pool_populate(c->pool, offsets, n);
}

/* Reports an ended task's result (nobody else does for external tasks). */
static kvt_status reap(kvt_cache *c, kvt_task_id id, kvt_task_result *out)
{
    kvt_task_result r;
    kvt_status st = kvt_cache_wait(c, id, 0, &r);
    if (!st && out) *out = r;
    return st;
}

static kvt_status ended_fail(kvt_cache *c, kvt_task_id id, const char *fn)
{
    kvt_task_result r = {0};
    kvt_status st = reap(c, id, &r);
    if (st) return st;
    if (r.status == KVT_ETIMEDOUT)
        return kvt__fail(KVT_ETIMEDOUT, "%s: task %llu expired unlaunched after plan_ttl_ms "
                         "(%u ms); look it up again", fn, (unsigned long long)id,
                         c->cfg.plan_ttl_ms);
    return kvt__fail(r.status, "%s: task %llu ended before its launch (%s)", fn,
                     (unsigned long long)id, kvt_status_name(r.status));
}

static kvt_status launch_locked(kvt_cache *c, kvt_task *t, uint64_t deadline_ns, bool *ended)
{
    static const char fn[] = "launch";
    if (t->state == KVT_TS_PLANNED && t->plan_deadline_ns <= kvt__now_ns()) {
        kvt__list_remove(&c->planned, t);
        kvt__cache_end_task(c, t, KVT_ETIMEDOUT);
    }
    if (t->state == KVT_TS_ENDED) {
        *ended = true;
        return KVT_OK;
    }
    if (t->state != KVT_TS_PLANNED)
        return kvt__fail(KVT_ESTATE, "%s: task %llu was already launched", fn,
                         (unsigned long long)t->id);
    kvt__list_remove(&c->planned, t);
    t->state = KVT_TS_RUNNING;
    t->launched = true;
    t->launch_ns = kvt__now_ns(); /* external loads and stores reach the latency histograms */
    t->external = true;
    if (t->kind != KVT_TASK_LOAD || t->reads_left == 0) return KVT_OK;
    kvt_status st = kvt__tiers_start_load(c, t); /* reads only: never the transfer */
    if (st) {
        kvt__cache_end_task(c, t, st);
        *ended = true;
        return KVT_OK;
    }
    t->refs++;
    while (t->reading && kvt__cond_wait_until(&c->ended_cv, &c->mu, deadline_ns)) {}
    t->refs--;
    if (t->state == KVT_TS_ENDED) *ended = true;
    return KVT_OK;
}

/* A launched task's blocks as memfd offsets, and its shape; only reading
 * set while its SSD reads run (c->mu held). */
static void give_offsets(kvt_cache *c, const kvt_task *t, uint64_t *offsets, kvt_ext_launch *out)
{
    kvt_ext_launch l = {t->kind, t->first_token, t->num_tokens, t->num_blocks, t->bad_status,
                        t->reading};
    if (t->reading) l.num_blocks = 0;
    const uint8_t *base = kvt__pool_base(c->pool);
    for (uint32_t i = 0; i < l.num_blocks; i++) offsets[i] = (uint64_t)(t->blocks[i] - base);
    *out = l;
}

/* The task id names, if its blocks fit in max offsets (c->mu held). */
static kvt_status find_fitting(kvt_cache *c, kvt_task_id id, uint32_t max, const char *fn,
                               kvt_task **out)
{
    kvt_task *t = kvt__task_find(c, id);
    if (!t)
        return kvt__fail(KVT_ENOTFOUND, "%s: task %llu is unknown or already reported", fn,
                         (unsigned long long)id);
    if (t->num_blocks > max)
        return kvt__fail(KVT_EINVAL, "%s: task %llu has %u blocks, room for %u", fn,
                         (unsigned long long)id, t->num_blocks, max);
    *out = t;
    return KVT_OK;
}

kvt_status kvt__cache_ext_launch(kvt_cache *c, kvt_task_id id, uint64_t deadline_ns,
                                 uint64_t *offsets, uint32_t max, kvt_ext_launch *out)
{
    static const char fn[] = "launch";
    pthread_mutex_lock(&c->mu);
    kvt_task *t = NULL;
    kvt_status st = find_fitting(c, id, max, fn, &t);
    bool ended = false;
    if (!st) st = launch_locked(c, t, deadline_ns, &ended);
    if (!st && !ended) give_offsets(c, t, offsets, out);
    pthread_mutex_unlock(&c->mu);
    if (!st && ended) return ended_fail(c, id, fn);
    return st;
}

kvt_status kvt__cache_ext_offsets(kvt_cache *c, kvt_task_id id, uint64_t deadline_ns,
                                  uint64_t *offsets, uint32_t max, kvt_ext_launch *out)
{
    static const char fn[] = "launch";
    pthread_mutex_lock(&c->mu);
    kvt_task *t = NULL;
    kvt_status st = find_fitting(c, id, max, fn, &t);
    if (!st && t->state == KVT_TS_RUNNING && !t->external)
        st = kvt__fail(KVT_ESTATE, "%s: task %llu is not a launched external task", fn,
                       (unsigned long long)id);
    bool ended = !st && t->state == KVT_TS_ENDED;
    if (!st && !ended && t->state != KVT_TS_RUNNING)
        st = kvt__fail(KVT_ESTATE, "%s: task %llu was never launched", fn,
                       (unsigned long long)id);
    if (!st && !ended) {
        t->refs++;
        while (t->reading && kvt__cond_wait_until(&c->ended_cv, &c->mu, deadline_ns)) {}
        t->refs--;
        ended = t->state == KVT_TS_ENDED;
        if (!ended) give_offsets(c, t, offsets, out);
    }
    pthread_mutex_unlock(&c->mu);
    if (!st && ended) return ended_fail(c, id, fn);
    return st;
}

uint32_t kvt__cache_ext_entries(kvt_cache *c) { return kvt__index_capacity(c->index); }

kvt_status kvt__ext_blocks_alloc(kvt_ext_blocks *b, uint32_t n, uint32_t extra_per_block,
                                 const char *what)
{
    size_t m = n ? n : 1; /* every u64 part first, then the ids: each part aligned */
    size_t u64s = m + 2 * m + m * extra_per_block;
    uint64_t *p = malloc(u64s * sizeof *p + m * sizeof(uint32_t));
    if (!p) return kvt__fail(KVT_ENOMEM, "%s: no memory for %u blocks' offsets", what, n);
    b->offsets = p;
    b->keys = (kvt_hash128 *)(p + m);
    b->extra = extra_per_block ? p + 3 * m : NULL;
    b->ids = (uint32_t *)(p + u64s);
    return KVT_OK;
}

kvt_status kvt__cache_ext_keys(kvt_cache *c, kvt_task_id id, kvt_hash128 *keys, uint32_t *ids,
                               uint32_t max)
{
    pthread_mutex_lock(&c->mu);
    kvt_task *t = NULL;
    kvt_status st = find_fitting(c, id, max, "keys", &t);
    if (!st && (t->state != KVT_TS_RUNNING || !t->external || t->reading))
        st = kvt__fail(KVT_ESTATE, "keys: task %llu is not a launched external task",
                       (unsigned long long)id);
    for (uint32_t i = 0; !st && i < t->num_blocks; i++) {
        keys[i] = kvt__index_key(c->index, t->entries[i]);
        ids[i] = t->entries[i];
    }
    pthread_mutex_unlock(&c->mu);
    return st;
}

void kvt__cache_ext_count_corrupt(kvt_cache *c, uint32_t n)
{
    pthread_mutex_lock(&c->mu);
    c->stats.corrupt_blocks += n;
    pthread_mutex_unlock(&c->mu);
}

kvt_status kvt__cache_ext_end(kvt_cache *c, kvt_task_id id, kvt_status result,
                              kvt_task_result *out)
{
    static const char fn[] = "end";
    pthread_mutex_lock(&c->mu);
    kvt_task *t = kvt__task_find(c, id);
    kvt_status st = KVT_OK;
    if (!t)
        st = kvt__fail(KVT_ENOTFOUND, "%s: task %llu is unknown or already reported", fn,
                       (unsigned long long)id);
    else if (t->state != KVT_TS_RUNNING || !t->external || t->reading)
        st = kvt__fail(KVT_ESTATE, "%s: task %llu is not a launched external task", fn,
                       (unsigned long long)id);
    else
        kvt__cache_end_task(c, t, result);
    pthread_mutex_unlock(&c->mu);
    return st ? st : reap(c, id, out);
}

kvt_status kvt__cache_ext_abort(kvt_cache *c, kvt_task_id id, uint64_t deadline_ns)
{
    pthread_mutex_lock(&c->mu);
    kvt_task *t = kvt__task_find(c, id);
    if (!t) {
        pthread_mutex_unlock(&c->mu);
        return KVT_OK; /* already gone */
    }
    if (t->state == KVT_TS_PLANNED) {
        kvt__list_remove(&c->planned, t);
        kvt__cache_end_task(c, t, KVT_ECANCELED);
    } else if (t->state == KVT_TS_RUNNING && t->external) {
        t->cancel_asked = true;
        if (!t->reading) kvt__cache_end_task(c, t, KVT_ECANCELED);
        t->refs++;
        while (t->state == KVT_TS_RUNNING && kvt__cond_wait_until(&c->ended_cv, &c->mu, deadline_ns)) {}
        t->refs--;
    }
    bool ended = t->state == KVT_TS_ENDED;
    pthread_mutex_unlock(&c->mu);
    if (!ended)
        return kvt__fail(KVT_ETIMEDOUT, "abort: task %llu still reading at the deadline",
                         (unsigned long long)id);
    return reap(c, id, NULL);
}

bool kvt__cache_ext_expired(kvt_cache *c, kvt_task_id id)
{
    pthread_mutex_lock(&c->mu);
    kvt_task *t = kvt__task_find(c, id);
    if (t && t->state == KVT_TS_PLANNED && t->plan_deadline_ns <= kvt__now_ns()) {
        kvt__list_remove(&c->planned, t);
        kvt__cache_end_task(c, t, KVT_ETIMEDOUT);
    }
    bool gone = !t || t->state == KVT_TS_ENDED;
    pthread_mutex_unlock(&c->mu);
    if (t && gone) (void)reap(c, id, NULL);
    return gone;
}

/* A cut store's slots: its repair blocks' and its fresh entries'. */
static uint32_t store_slots(kvt_cache *c, const kvt_task *t, uint32_t *slots)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < t->num_repair; i++)
        if (t->tmp_slots[i] != KVT_POOL_NONE) slots[n++] = t->tmp_slots[i];
    for (uint32_t i = t->num_repair; i < t->num_blocks; i++) {
        uint32_t slot = kvt__index_payload(c->index, t->entries[i]);
        if (slot != KVT_POOL_NONE) slots[n++] = slot;
    }
    return n;
}

kvt_status kvt__cache_ext_cut(kvt_cache *c, kvt_task_id id, uint32_t *slots, uint32_t max,
                              uint32_t *n)
{
    *n = 0;
    pthread_mutex_lock(&c->mu);
    kvt_task *t = kvt__task_find(c, id);
    bool mine = t && t->state == KVT_TS_RUNNING && t->external && !t->reading &&
                (t->kind != KVT_TASK_STORE || max >= t->num_blocks);
    if (!mine) {
        pthread_mutex_unlock(&c->mu);
        return kvt__cache_ext_abort(c, id, kvt__now_ns());
    }
    if (t->kind == KVT_TASK_STORE) {
        *n = store_slots(c, t, slots);
        t->keep_blocks = true;
    }
    t->cancel_asked = true;
    kvt__cache_end_task(c, t, KVT_ECANCELED);
    pthread_mutex_unlock(&c->mu);
    return reap(c, id, NULL);
}

void kvt__cache_ext_release(kvt_cache *c, const uint32_t *slots, uint32_t n)
{
    pthread_mutex_lock(&c->mu);
    for (uint32_t i = 0; i < n; i++) kvt__pool_free(c->pool, slots[i]);
    pthread_mutex_unlock(&c->mu);
}

void kvt__cache_ext_roots_live(kvt_cache *c, const kvt_hash128 *roots, uint32_t n, bool *live)
{
    pthread_mutex_lock(&c->mu);
    for (uint32_t i = 0; i < n; i++)
        live[i] = kvt__index_find(c->index, roots[i]) != KVT_INDEX_NONE;
    pthread_mutex_unlock(&c->mu);
}

kvt_status kvt__cache_ext_clear(kvt_cache *c, const kvt_hash128 *roots, uint32_t n,
                                uint32_t *removed, uint32_t *kept)
{
    *removed = *kept = 0;
    pthread_mutex_lock(&c->mu);
    uint32_t high = kvt__index_high(c->index);
    /* mark: 0 not known yet, 1 below a root, 2 not */
    uint8_t *mark = calloc(high ? high : 1, 1);
    uint32_t *stack = malloc((high ? high : 1) * sizeof *stack);
    if (!mark || !stack) {
        pthread_mutex_unlock(&c->mu);
        free(mark);
        free(stack);
        return kvt__fail(KVT_ENOMEM, "clear: no memory for %u entries", high);
    }
    uint32_t found = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t id = kvt__index_find(c->index, roots[i]);
        if (id != KVT_INDEX_NONE) mark[id] = 1, found++;
    }
    for (uint32_t id = 0; found && id < high; id++) {
        if (!kvt__index_live(c->index, id) || mark[id]) continue;
        uint32_t k = 0, x = id;
        uint8_t res = 2;
        while (!mark[x]) {
            stack[k++] = x;
            uint32_t p = kvt__index_parent(c->index, x);
            if (p == KVT_INDEX_NONE) break;
            x = p;
        }
        if (mark[x]) res = mark[x];
        for (uint32_t j = 0; j < k; j++) mark[stack[j]] = res;
    }
    uint32_t cnt = 0;
    for (uint32_t id = 0; found && id < high; id++)
        if (mark[id] == 1 && kvt__index_live(c->index, id)) stack[cnt++] = id;
    /* Leaves first: each entry is tried once in the scan and again when
     * its last child goes, so the pass is O(entries). */
    for (uint32_t i = 0; i < cnt; i++) {
        uint32_t x = stack[i];
        while (x != KVT_INDEX_NONE && mark[x] == 1) {
            uint32_t p = kvt__index_parent(c->index, x);
            uint32_t slot = kvt__index_payload(c->index, x);
            if (!kvt__index_remove_candidate(c->index, x)) break;
            kvt__tiers_removed(c, &x, &slot, 1);
            mark[x] = 0;
            (*removed)++;
            x = p;
        }
    }
    *kept = cnt - *removed;
    pthread_mutex_unlock(&c->mu);
    free(mark);
    free(stack);
    return KVT_OK;
}
