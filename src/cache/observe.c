/* observe.c - the snapshot behind src/metrics (observe.h). */
#include "cache/observe.h"

#include <string.h>

#include "cache/cache.h"

kvt_status kvt__cache_observe(kvt_cache *c, kvt_cache_observed *out)
{
    memset(out, 0, sizeof *out);
    kvt_status st = kvt_cache_stats_get(c, &out->stats);
    if (st) return st;
    pthread_mutex_lock(&c->mu);
    out->has_ssd = c->ssd != NULL;
    out->ssd_writes_off = c->ssd_writes_off;
    out->ssd_write_queue = c->ssd_pending;
    out->ssd_read_queue = c->ssd_reads_pending;
    pthread_mutex_unlock(&c->mu);
    kvt__lat_snapshot(&c->lat_lookup, &out->lookup);
    kvt__lat_snapshot(&c->lat_load, &out->load);
    kvt__lat_snapshot(&c->lat_store, &out->store);
    return KVT_OK;
}
