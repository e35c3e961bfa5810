/* replay_fleet.h - an N-node fleet behind a router, index only: what
 * sharing blocks across nodes (the cluster tier, issue 26) buys on a trace.
 *
 * Each node is a sim (replay_sim.h) with the same per-node capacities. A
 * router sends each request to one node:
 *   random  uniform, from a seeded generator (the same seed: the same run);
 *   sticky  by the request's first block (session affinity: requests that
 *           open with the same block go to the same node);
 *   prefix  to the node holding the longest prefix of the request, ties to
 *           the node that served fewest requests (a KV-aware router).
 * The fleet is replayed twice, routed the same way from its own state:
 * local (each node hits only what it holds) and shared (the rest of the
 * prefix is pulled from the peer holding the longest one, then stored on
 * the node that served the request). Unbounded, the shared rate equals the
 * single-cache maximum exactly: a block's whole prefix lives on the node
 * that stored it, and nothing is evicted. */
#ifndef KVT_TOOLS_REPLAY_FLEET_H
#define KVT_TOOLS_REPLAY_FLEET_H

#include <stdbool.h>
#include <stdint.h>

#include "replay_sim.h"
#include "trace.h"

typedef enum fleet_routing { ROUTE_RANDOM, ROUTE_STICKY, ROUTE_PREFIX } fleet_routing;

typedef struct fleet_opts {
    uint32_t nodes;
    fleet_routing routing;
    uint64_t seed;
    uint64_t cpu_blocks, ssd_blocks; /* per node; cpu 0: unbounded */
    uint32_t max_requests;
    bool quiet;
} fleet_opts;

typedef struct fleet_result {
    sim_counts local, shared; /* summed over the nodes */
    uint64_t max_requests_per_node, min_requests_per_node;
} fleet_result;

/* 0 for a name, -1 otherwise. */
int fleet_routing_parse(const char *name, fleet_routing *out);
const char *fleet_routing_name(fleet_routing r);
/* -1 after printing an error naming kvtier replay. */
int fleet_run(const trace *t, const fleet_opts *o, fleet_result *out);

#endif
