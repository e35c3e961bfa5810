/* observe.h - everything the cache can tell an observer (src/metrics) in
 * one snapshot: the public counters plus figures that are not part of the
 * public kvt_cache_stats ABI (queue depths, latency histograms). */
#ifndef KVT_CACHE_OBSERVE_H
#define KVT_CACHE_OBSERVE_H

#include <stdbool.h>
#include <stdint.h>

#include "kvtier.h"
#include "util/latency.h"

typedef struct kvt_cache_observed {
    kvt_cache_stats stats;
    bool has_ssd;              /* an SSD tier is configured */
    bool ssd_writes_off;       /* it stopped taking writes (a write failed for want of
                                  space or an I/O error): blocks are no longer made durable */
    uint32_t ssd_write_queue;  /* SSD writes queued or in flight */
    uint32_t ssd_read_queue;   /* SSD reads queued or in flight */
    kvt_lat_snapshot lookup;   /* kvt_cache_lookup calls that succeeded */
    kvt_lat_snapshot load;     /* loads that succeeded, launch to end */
    kvt_lat_snapshot store;    /* stores that succeeded, launch to end */
} kvt_cache_observed;

/* Takes the cache mutex briefly (twice); the histograms are read without it. */
kvt_status kvt__cache_observe(kvt_cache *c, kvt_cache_observed *out);

/* The tiers that hold index entry id of c's index now: a CPU copy, and a
 * copy durable on the SSD (one being written, or lost, is not). For an
 * index observer (index.h), which runs under c's mutex: at a REMOVED
 * event, the tiers the block is leaving. */
enum { KVT_CACHE_TIER_CPU = 1, KVT_CACHE_TIER_DISK = 2 };
uint8_t kvt__cache_tiers_of(const kvt_cache *c, uint32_t id);

#endif
