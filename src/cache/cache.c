/* cache.c - creating and destroying a cache, engine memory, stats, errors. */
#include "cache/cache.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache/tasks.h"
#include "cache/quota.h"
#include "cache/share.h"
#include "cache/tiers.h"
#include "cuda/cuda.h"
#include "util/file.h"
#include "util/log.h"

/* Records the thread's last error on the cache too, then returns st. */
kvt_status kvt__cache_fail(const kvt_cache *c, kvt_status st)
{
    kvt_cache *mc = (kvt_cache *)c;
    pthread_mutex_lock(&mc->err_mu);
    snprintf(mc->last_error, sizeof mc->last_error, "%s", kvt_last_error());
    pthread_mutex_unlock(&mc->err_mu);
    return st;
}

const char *kvt_cache_last_error(const kvt_cache *c)
{
    /* A copy per calling thread: another thread may be writing the cache's. */
    static _Thread_local char copy[KVT_ERRMSG_MAX];
    if (!c) return "kvt_cache_last_error: cache is NULL";
    kvt_cache *mc = (kvt_cache *)c;
    pthread_mutex_lock(&mc->err_mu);
    memcpy(copy, c->last_error, sizeof copy);
    pthread_mutex_unlock(&mc->err_mu);
    return copy;
}

static kvt_status check_config(const kvt_config_values *v, const kvt_geometry *g)
{
    static const char fn[] = "kvt_cache_create";
    KVT_CHECK_ARG(v->block_tokens > 0 && v->block_tokens % g->tokens_per_page == 0,
                  "%s: block_tokens (%u) must be a positive multiple of the geometry's "
                  "tokens_per_page (%u)", fn, v->block_tokens, g->tokens_per_page);
    KVT_CHECK_ARG(v->workers >= 1 && v->workers <= 64, "%s: workers is %u (must be 1..64)", fn,
                  v->workers);
    KVT_CHECK_ARG(v->max_tasks >= 1, "%s: max_tasks is 0", fn);
    /* The tier is prefaulted: more than the machine can give would bring
     * the OOM killer mid-prefault, with no message. */
    uint64_t avail = v->memory_check ? kvt__mem_available() : 0;
    if (avail && v->cpu_capacity > avail)
        return kvt__fail(KVT_ENOMEM, "%s: cpu_capacity is %llu bytes, more than this machine can "
                         "give now (%llu bytes: MemAvailable plus free huge pages); lower "
                         "cpu_capacity, or set memory_check=false to try anyway", fn,
                         (unsigned long long)v->cpu_capacity, (unsigned long long)avail);
    return KVT_OK;
}

static kvt_status build(kvt_cache *c, const kvt_config *cfg, const kvt_geometry *geo,
                        bool shared, kvt_share *share)
{
    kvt_status st = kvt_geometry_validate(geo);
    if (st) return kvt__wrap_error(st, "kvt_cache_create: geo");
    c->cfg = *kvt__config_values(cfg);
    st = kvt__log_set_level((kvt_log_level)c->cfg.log_level, "kvt_cache_create");
    if (st) return st;
    st = check_config(&c->cfg, geo);
    if (st) return st;
    st = kvt_geometry_clone(geo, &c->geo);
    if (st) return st;
    c->pages_per_block = c->cfg.block_tokens / geo->tokens_per_page;
    c->block_bytes = kvt__geo_bytes_per_token(c->geo) * c->cfg.block_tokens;
    st = share    ? kvt__pool_create_budgeted(&c->pool, c->cfg.cpu_capacity, c->block_bytes,
                                              c->cfg.huge_pages, kvt__share_budget(share))
         : shared ? kvt__pool_create_shared(&c->pool, c->cfg.cpu_capacity, c->block_bytes,
                                            c->cfg.huge_pages)
                  : kvt__pool_create(&c->pool, c->cfg.cpu_capacity, c->block_bytes,
                                     c->cfg.huge_pages);
    if (st) return st;
    if (share) c->ssd_budget = kvt__share_ssd_budget(share);
    st = kvt__tiers_open(c);
    if (st) return st;
    st = kvt__tasks_init(c, c->cfg.max_tasks);
    if (st) return st;
    st = kvt__xfer_create(&c->xfer, c->cfg.workers, &kvt__host_copy_ops);
    if (st) return st;
    c->stats.cpu_blocks_total = kvt__pool_blocks_total(c->pool);
    c->stats.block_bytes = c->block_bytes;
    /* Before any block is stored (recovered SSD blocks included: their
     * ticks restart on the share's clock at their first touch). */
    if (share && (st = kvt__share_join(share, c))) return st;
    /* Complete: the layer above may start what reads the whole cache (the
     * metrics endpoint: src/api/cache.c, src/server). */
    return KVT_OK;
}

/* kvt_cache_create, or (shared) its twin whose CPU tier is a memfd. */
static kvt_status create(kvt_cache **out, const kvt_config *cfg, const kvt_geometry *geo,
                         bool shared, kvt_share *share)
{
    kvt__clear_error();
    KVT_CHECK_NOT_NULL(out, "kvt_cache_create");
    KVT_CHECK_NOT_NULL(cfg, "kvt_cache_create");
    KVT_CHECK_NOT_NULL(geo, "kvt_cache_create");
    kvt_cache *c = calloc(1, sizeof *c);
    if (!c) return kvt__fail(KVT_ENOMEM, "kvt_cache_create: out of memory");
    pthread_mutex_init(&c->mu, NULL);
    pthread_mutex_init(&c->err_mu, NULL);
    if (kvt__cond_init(&c->ended_cv) != 0) {
        free(c);
        return kvt__fail(KVT_ESYS, "kvt_cache_create: pthread_cond_init failed");
    }
    kvt_status st = build(c, cfg, geo, shared, share);
    if (st) {
        kvt__cache_destroy(c);
        return st;
    }
    *out = c;
    return KVT_OK;
}

kvt_status kvt__cache_create_ex(kvt_cache **out, const kvt_config *cfg, const kvt_geometry *geo,
                                bool shared)
{
    return create(out, cfg, geo, shared, NULL);
}

kvt_status kvt__cache_create_shared(kvt_cache **out, const kvt_config *cfg,
                                    const kvt_geometry *geo, kvt_share *sh)
{
    if (!sh) return kvt__fail(KVT_EINVAL, "kvt__cache_create_shared: share is NULL");
    return create(out, cfg, geo, true, sh);
}

uint32_t kvt__cache_engine_pages(kvt_cache *c)
{
    pthread_mutex_lock(&c->mu);
    uint32_t n = c->memory_registered ? c->map.num_pages : 0;
    pthread_mutex_unlock(&c->mu);
    return n;
}

void kvt__cache_observe_index(kvt_cache *c, kvt_index_observer fn, void *arg)
{
    pthread_mutex_lock(&c->mu);
    kvt__index_set_observer(c->index, fn, arg);
    pthread_mutex_unlock(&c->mu);
}

void kvt__cache_set_quota(kvt_cache *c, struct kvt_quota *q)
{
    c->quota = q;
    kvt__pool_set_quotas(c->pool, q ? &q->pool : NULL);
}

void kvt__cache_destroy(kvt_cache *c)
{
    if (!c) return;
    kvt__share_leave(c); /* first: no other member's reclaim may take c's lock below */
    if (c->tasks) {
        /* Stop running tasks. The tiers then fail queued reads and wait for
         * in-flight I/O; xfer_destroy waits for copies and calls their
         * on_done. Both call back into the cache, so c->mu is not held. */
        pthread_mutex_lock(&c->mu);
        for (uint32_t i = 0; i < c->cfg.max_tasks; i++) {
            kvt_task *t = &c->tasks[i];
            if (t->state != KVT_TS_RUNNING) continue;
            t->cancel_asked = true;
            if (!t->reading && !t->external) kvt__xfer_cancel(c->xfer, &t->xt);
        }
        pthread_mutex_unlock(&c->mu);
    }
    if (c->pool) kvt__tiers_stop(c);
    kvt__xfer_destroy(c->xfer); /* its on_done callbacks still use the tier tables */
    if (c->cuda) { /* after the workers (their streams), before the pool (pinned) */
        if (c->cuda_events)
            kvt__cuda_backend_free_events(c->cuda, c->cuda_events,
                                          (size_t)c->cfg.max_tasks * c->geo->num_layers);
        kvt__cuda_backend_destroy(c->cuda);
    }
    free(c->cuda_events);
    kvt__tiers_free(c);
    kvt__tasks_fini(c);
    kvt__index_destroy(c->index);
    kvt__pool_destroy(c->pool);
    kvt_geometry_destroy(c->geo);
    pthread_cond_destroy(&c->ended_cv);
    pthread_mutex_destroy(&c->mu);
    pthread_mutex_destroy(&c->err_mu);
    free(c);
}

/* Device memory: the layout checks as for host memory, then the CUDA
 * runtime and device (KVT_EUNSUPPORTED naming what is missing), every
 * buffer on that device, the CPU tier pinned, the copy ops switched.
 * c->mu held; nothing was submitted yet (no launch before registration). */
static kvt_status register_cuda(kvt_cache *c, const kvt_engine_memory *mem)
{
    static const char fn[] = "kvt_cache_register_memory";
    kvt_engine_memory host = *mem;
    host.kind = KVT_MEMORY_HOST;
    kvt_page_map map;
    kvt_status st = kvt__page_map_init(&map, c->geo, &host);
    if (st) return st;
    KVT_CHECK_ARG(mem->device >= 0, "%s: device is %d (a CUDA device ordinal is >= 0)", fn,
                  (int)mem->device);
    kvt_cuda_backend *b = NULL;
    st = kvt__cuda_backend_create(&b, fn, mem->device, KVT_CUDA_AUTO);
    if (st) return st;
    char what[64];
    for (uint32_t l = 0; l < c->geo->num_layers && !st; l++)
        for (uint32_t k = 0; k < kvt__geo_ncomp(c->geo, l) && !st; k++) {
            uint32_t u = KVT_UNIT(l, k);
            if (c->geo->layout == KVT_LAYOUT_PAGE_FIRST && !mem->page_strides)
                snprintf(what, sizeof what, "base");
            else
                snprintf(what, sizeof what, "layer_bases[%u]", u);
            st = kvt__cuda_backend_check_ptr(b, fn, what, map.base[u]);
        }
    if (!st) {
        uint64_t len = (uint64_t)kvt__pool_blocks_total(c->pool) * kvt__pool_stride(c->pool);
        if (len) st = kvt__cuda_backend_pin(b, fn, kvt__pool_block(c->pool, 0), len);
    }
    void **ev = NULL;
    if (!st) {
        ev = calloc((size_t)c->cfg.max_tasks * c->geo->num_layers, sizeof *ev);
        if (!ev) st = kvt__fail(KVT_ENOMEM, "%s: out of memory for CUDA events", fn);
    }
    if (!st) st = kvt__xfer_set_ops(c->xfer, kvt__cuda_backend_ops(b));
    if (st) {
        free(ev);
        kvt__cuda_backend_destroy(b);
        return st;
    }
    c->map = map;
    c->cuda = b;
    c->cuda_events = ev;
    return KVT_OK;
}

kvt_status kvt_cache_register_memory(kvt_cache *c, const kvt_engine_memory *mem)
{
    kvt__clear_error();
    KVT_CHECK_NOT_NULL_AS(c, "cache", "kvt_cache_register_memory");
    KVT_CHECK_NOT_NULL(mem, "kvt_cache_register_memory");
    pthread_mutex_lock(&c->mu);
    kvt_status st = KVT_OK;
    if (c->memory_registered)
        st = kvt__fail(KVT_ESTATE, "kvt_cache_register_memory: engine memory is already "
                       "registered (allowed once per cache)");
    else if (mem->kind == KVT_MEMORY_CUDA)
        st = register_cuda(c, mem);
    else
        st = kvt__page_map_init(&c->map, c->geo, mem);
    if (!st) c->memory_registered = true;
    pthread_mutex_unlock(&c->mu);
    return st ? kvt__cache_fail(c, st) : KVT_OK;
}

kvt_status kvt_cache_stats_get(kvt_cache *c, kvt_cache_stats *out)
{
    kvt__clear_error();
    KVT_CHECK_NOT_NULL_AS(c, "cache", "kvt_cache_stats_get");
    KVT_CHECK_NOT_NULL(out, "kvt_cache_stats_get");
    pthread_mutex_lock(&c->mu);
    c->stats.cpu_blocks_used = kvt__pool_blocks_backed(c->pool) - kvt__pool_blocks_free_backed(c->pool);
    c->stats.index_blocks = kvt__index_count(c->index);
    c->stats.index_bytes = kvt__index_memory_bytes(c->index);
    c->stats.tasks_in_flight = c->in_flight;
    if (c->ssd) {
        c->stats.ssd_blocks_total = kvt__ssd_blocks_total(c->ssd);
        c->stats.ssd_blocks_used = kvt__ssd_blocks_used(c->ssd);
    }
    *out = c->stats;
    pthread_mutex_unlock(&c->mu);
    return KVT_OK;
}
