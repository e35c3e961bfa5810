/* latency.c - the histogram bounds and snapshots (latency.h). */
#include "util/latency.h"

const uint64_t kvt__lat_bound_ns[KVT_LAT_BOUNDS] = {
    1000ull,        2500ull,        5000ull,        10000ull,       25000ull,
    50000ull,       100000ull,      250000ull,      500000ull,      1000000ull,
    2500000ull,     5000000ull,     10000000ull,    25000000ull,    50000000ull,
    100000000ull,   250000000ull,   500000000ull,   1000000000ull,  2500000000ull,
    5000000000ull,  10000000000ull,
};

const char *const kvt__lat_bound_le[KVT_LAT_BOUNDS] = {
    "1e-06", "2.5e-06", "5e-06", "1e-05", "2.5e-05", "5e-05", "0.0001", "0.00025",
    "0.0005", "0.001", "0.0025", "0.005", "0.01", "0.025", "0.05", "0.1", "0.25",
    "0.5", "1", "2.5", "5", "10",
};

void kvt__lat_snapshot(const kvt_lat_hist *h, kvt_lat_snapshot *out)
{
    out->count = 0;
    out->sum_ns = atomic_load_explicit(&h->sum_ns, memory_order_relaxed);
    for (unsigned i = 0; i <= KVT_LAT_BOUNDS; i++) {
        out->bucket[i] = atomic_load_explicit(&h->bucket[i], memory_order_relaxed);
        out->count += out->bucket[i];
    }
}
