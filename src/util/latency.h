/* latency.h - lock-free latency histograms for the data path.
 *
 * Recording is one binary search over KVT_LAT_BOUNDS fixed bounds and two
 * relaxed atomic adds (the bucket, the sum): no lock, no syscall, no
 * allocation. Readers (src/metrics) take a snapshot bucket by bucket, so a
 * snapshot taken while others record is a consistent-enough histogram: each
 * bucket and the sum are exact as of some moment during the snapshot, and
 * the count is computed from the buckets, so it always equals the +Inf
 * bucket. Bounds are a 1-2.5-5 series from 1 us to 10 s. */
#ifndef KVT_UTIL_LATENCY_H
#define KVT_UTIL_LATENCY_H

#include <stdatomic.h>
#include <stdint.h>

#define KVT_LAT_BOUNDS 22 /* finite bounds; bucket KVT_LAT_BOUNDS is +Inf */

typedef struct kvt_lat_hist {
    _Atomic uint64_t bucket[KVT_LAT_BOUNDS + 1]; /* non-cumulative counts */
    _Atomic uint64_t sum_ns;
} kvt_lat_hist;

typedef struct kvt_lat_snapshot {
    uint64_t bucket[KVT_LAT_BOUNDS + 1]; /* non-cumulative counts */
    uint64_t count;                      /* the sum of bucket[] */
    uint64_t sum_ns;
} kvt_lat_snapshot;

/* Upper bounds in nanoseconds, and the same as Prometheus "le" labels (seconds). */
extern const uint64_t kvt__lat_bound_ns[KVT_LAT_BOUNDS];
extern const char *const kvt__lat_bound_le[KVT_LAT_BOUNDS];

/* The bucket a duration falls in: the first bound >= ns, else +Inf. */
static inline unsigned kvt__lat_bucket(uint64_t ns)
{
    unsigned lo = 0, hi = KVT_LAT_BOUNDS; /* answer in [lo, hi] */
    while (lo < hi) {
        unsigned mid = (lo + hi) / 2;
        if (ns <= kvt__lat_bound_ns[mid]) hi = mid;
        else lo = mid + 1;
    }
    return lo;
}

static inline void kvt__lat_record(kvt_lat_hist *h, uint64_t ns)
{
    atomic_fetch_add_explicit(&h->bucket[kvt__lat_bucket(ns)], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&h->sum_ns, ns, memory_order_relaxed);
}

void kvt__lat_snapshot(const kvt_lat_hist *h, kvt_lat_snapshot *out);

#endif
