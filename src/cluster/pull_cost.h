/* pull_cost.h - what a pull of n bytes is expected to take, from the pulls
 * made: a fixed cost (connect, FETCH round trip, the holder's lookup) plus
 * a per-byte cost, fitted by least squares over an exponentially weighted
 * window of pulls. Dividing a pull's bytes by one bandwidth measured on
 * whole pulls counted the fixed cost per byte: small pulls (latency-bound)
 * made every pull look slow, and a 4-block pull on a slow VM was judged
 * slower than recomputing it. Not thread-safe: the caller locks. */
#ifndef KVT_CLUSTER_PULL_COST_H
#define KVT_CLUSTER_PULL_COST_H

#include <stdint.h>

typedef struct kvt_pull_cost {
    double w, b, t, bb, bt; /* weighted sums of 1, bytes, ns, bytes^2, bytes x ns */
} kvt_pull_cost;

/* Adds a pull of bytes (> 0) that took ns; older pulls weigh 3/4 as much
 * at each new one. */
void kvt__pull_cost_add(kvt_pull_cost *c, uint64_t bytes, uint64_t ns);
/* Expected ns for a pull of bytes; 0 before any pull. The fit is used only
 * when the pulls seen differ enough in size to tell the fixed cost from
 * the per-byte one (and it says the fixed one is >= 0 and the per-byte one
 * at least a tenth of their mean time per byte); otherwise their mean time
 * per byte, as a single bandwidth would. */
uint64_t kvt__pull_cost_ns(const kvt_pull_cost *c, uint64_t bytes);
/* The per-byte part as bytes per second (the link's bandwidth net of the
 * fixed cost); 0 before any pull. */
uint64_t kvt__pull_cost_bps(const kvt_pull_cost *c);

#endif
