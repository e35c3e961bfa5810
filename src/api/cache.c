/* cache.c - kvt_cache_create and kvt_cache_destroy: the cache (src/cache)
 * with its metrics endpoint (src/metrics). The endpoint reads the whole
 * cache, so it starts after the cache is complete and stops before any of
 * it is freed. Joining the two here, above both, keeps every call between
 * layers pointing down (tests/layers.py). */
#include "cache/cache.h"
#include "metrics/metrics.h"
#include "util/err.h"

kvt_status kvt_cache_create(kvt_cache **out, const kvt_config *cfg, const kvt_geometry *geo)
{
    kvt__clear_error();
    KVT_CHECK_NOT_NULL(out, "kvt_cache_create");
    kvt_cache *c = NULL;
    kvt_status st = kvt__cache_create_ex(&c, cfg, geo, false); /* checks cfg and geo */
    if (st) return st;
    st = kvt__metrics_cache_start(c);
    if (st) {
        kvt__cache_destroy(c);
        return st;
    }
    *out = c;
    return KVT_OK;
}

void kvt_cache_destroy(kvt_cache *c)
{
    if (!c) return;
    kvt__metrics_cache_stop(c);
    kvt__cache_destroy(c);
}
