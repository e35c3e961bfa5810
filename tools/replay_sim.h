/* replay_sim.h - index-only replay: the real prefix index (src/index) fed
 * with a trace's block ids, no KV bytes.
 *
 * Rules (issue 6): a request's hit is the longest prefix of its blocks
 * already cached; then all its blocks are stored. Token hits are
 * min(hit blocks x 512, input_length).
 *
 * Two tiers are modelled as the cache builds them: inclusive, so every
 * cached block is on the SSD (when there is one) and the CPU tier holds a
 * subset. One index of max(cpu, ssd) blocks decides hits (all tiers); a
 * second index of cpu blocks, fed the same requests, says which of them the
 * CPU tier still holds (a hit read back from the SSD is stored into it
 * again, as a recently used block). Both evict cold leaves (LRU), never the
 * prefix being extended, exactly as the cache's index does. */
#ifndef KVT_TOOLS_REPLAY_SIM_H
#define KVT_TOOLS_REPLAY_SIM_H

#include <stdbool.h>
#include <stdint.h>

#include "index/index.h"
#include "trace.h"

typedef struct sim_counts {
    uint64_t requests, blocks, input_tokens;
    uint64_t hit_blocks, cpu_hit_blocks, ssd_hit_blocks;
    uint64_t hit_tokens, cpu_hit_tokens, ssd_hit_tokens;
    uint64_t stored_blocks, evicted_blocks;
    uint64_t cross_hit_blocks, cross_hit_tokens; /* a fleet with sharing: pulled from peers */
} sim_counts;

typedef struct sim {
    kvt_index *all; /* every cached block: capacity max(cpu, ssd) */
    kvt_index *cpu; /* the CPU tier's share; NULL without an SSD tier */
    uint32_t all_cap, cpu_cap;
    uint32_t *ids, *cpu_ids, *scratch; /* max_req_blocks each */
    sim_counts c;
} sim;

/* cpu_blocks >= 1; ssd_blocks 0 means no SSD tier. Capacities are clamped
 * to `useful` (the trace's distinct blocks: more can never be used) so an
 * unbounded run allocates only what it needs. max_req_blocks bounds one
 * request. -1 with a message in err on failure. */
int sim_init(sim *s, uint64_t cpu_blocks, uint64_t ssd_blocks, uint32_t useful,
             uint32_t max_req_blocks, char *err, size_t err_len);
void sim_fini(sim *s);
/* The index key of each dense block id (the trace's ids are already prefix
 * hashes, so a key needs no chaining; it is just well mixed). */
void sim_keys(const uint32_t *ids, uint32_t n, kvt_hash128 *out);
/* One request: match, count, store. keys: its n block keys. */
void sim_request(sim *s, const kvt_hash128 *keys, uint32_t n, uint32_t input_length);
/* Blocks of keys this node's cache would hit now (nothing is touched). */
uint32_t sim_probe(sim *s, const kvt_hash128 *keys, uint32_t n);
/* sim_request for a node of a fleet that shares blocks: the first `remote`
 * blocks are on some peer; those past the local prefix are pulled (counted
 * as cross-node hits, from neither local tier) and stored here with the
 * rest of the request. */
void sim_request_shared(sim *s, const kvt_hash128 *keys, uint32_t n, uint32_t input_length,
                        uint32_t remote);

static inline double sim_rate(uint64_t part, uint64_t whole)
{
    return whole ? (double)part / (double)whole : 0.0;
}

#endif
