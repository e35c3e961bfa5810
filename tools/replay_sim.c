/* replay_sim.c - index-only replay (see replay_sim.h). */
#include "replay_sim.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SIM_MAX_INDEX (1u << 31) /* kvt__index_create's bound */

static uint32_t clamp_cap(uint64_t blocks, uint32_t useful)
{
    uint64_t cap = blocks < useful ? blocks : useful;
    if (cap == 0) cap = 1;
    return cap > SIM_MAX_INDEX ? SIM_MAX_INDEX : (uint32_t)cap;
}

int sim_init(sim *s, uint64_t cpu_blocks, uint64_t ssd_blocks, uint32_t useful,
             uint32_t max_req_blocks, char *err, size_t err_len)
{
    memset(s, 0, sizeof *s);
    if (cpu_blocks == 0) {
        snprintf(err, err_len, "the CPU tier holds no block");
        return -1;
    }
    s->all_cap = clamp_cap(cpu_blocks > ssd_blocks ? cpu_blocks : ssd_blocks, useful);
    s->cpu_cap = clamp_cap(cpu_blocks, useful);
    size_t n = (size_t)(max_req_blocks ? max_req_blocks : 1);
    s->ids = malloc(n * sizeof *s->ids);
    s->cpu_ids = malloc(n * sizeof *s->cpu_ids);
    s->scratch = malloc(n * sizeof *s->scratch);
    kvt_status st = s->ids && s->cpu_ids && s->scratch ? KVT_OK : KVT_ENOMEM;
    if (!st) st = kvt__index_create(&s->all, s->all_cap, KVT_EVICT_LRU);
    if (!st && ssd_blocks) st = kvt__index_create(&s->cpu, s->cpu_cap, KVT_EVICT_LRU);
    if (st) {
        snprintf(err, err_len, "cannot create an index of %u blocks: %s", s->all_cap,
                 kvt_last_error()[0] ? kvt_last_error() : kvt_strerror(st));
        sim_fini(s);
        return -1;
    }
    return 0;
}

void sim_fini(sim *s)
{
    kvt__index_destroy(s->all);
    kvt__index_destroy(s->cpu);
    free(s->ids);
    free(s->cpu_ids);
    free(s->scratch);
    memset(s, 0, sizeof *s);
}

void sim_keys(const uint32_t *ids, uint32_t n, kvt_hash128 *out)
{
    for (uint32_t i = 0; i < n; i++) {
        uint64_t st = ids[i];
        out[i].lo = kvt__splitmix64(&st);
        out[i].hi = kvt__splitmix64(&st);
    }
}

/* Stores blocks [k, n) of a request whose first k blocks (ids[0..k)) are
 * cached: pins the prefix so eviction never takes it, evicts cold leaves
 * for the rest, inserts as many as fit (all, unless one request is larger
 * than the tier). Returns blocks stored; *evicted gets blocks evicted. */
static uint32_t store(kvt_index *idx, uint32_t cap, const kvt_hash128 *keys, uint32_t n,
                      uint32_t k, uint32_t *ids, uint32_t *scratch, uint64_t *evicted)
{
    uint32_t need = n - k, used = kvt__index_count(idx);
    if (need > cap - used) {
        /* Cannot fail: one pin each (unpinned below) under KVT_INDEX_MAX_PINS. */
        (void)kvt__index_pin(idx, ids, k);
        *evicted += kvt__index_evict(idx, need - (cap - used), scratch);
        kvt__index_unpin(idx, ids, k);
    }
    uint32_t parent = k ? ids[k - 1] : KVT_INDEX_NONE, stored = 0;
    for (uint32_t i = k; i < n; i++) {
        if (kvt__index_insert(idx, parent, keys[i], 0, &ids[i]) != KVT_OK) break;
        parent = ids[i];
        stored++;
    }
    kvt__index_commit(idx, ids + k, stored);
    return stored;
}

uint32_t sim_probe(sim *s, const kvt_hash128 *keys, uint32_t n)
{
    return kvt__index_match(s->all, keys, n, s->scratch, false);
}

static uint64_t tokens_of(uint32_t blocks, uint32_t input_length)
{
    uint64_t tok = (uint64_t)blocks * TRACE_BLOCK_TOKENS;
    return tok < input_length ? tok : input_length;
}

void sim_request(sim *s, const kvt_hash128 *keys, uint32_t n, uint32_t input_length)
{
    sim_request_shared(s, keys, n, input_length, 0);
}

void sim_request_shared(sim *s, const kvt_hash128 *keys, uint32_t n, uint32_t input_length,
                        uint32_t remote)
{
    uint32_t k = kvt__index_match(s->all, keys, n, s->ids, true);
    if (remote > k) {
        s->c.cross_hit_blocks += remote - k;
        s->c.cross_hit_tokens += tokens_of(remote, input_length) - tokens_of(k, input_length);
        s->c.hit_blocks += remote - k;
        s->c.hit_tokens += tokens_of(remote, input_length) - tokens_of(k, input_length);
    }
    /* Leaf eviction runs separately in each index; a block the CPU index
     * kept but the other dropped is not a hit, so kc <= k. */
    uint32_t kc_raw = s->cpu ? kvt__index_match(s->cpu, keys, n, s->cpu_ids, true) : k;
    uint32_t kc = kc_raw < k ? kc_raw : k;
    uint64_t tok = (uint64_t)k * TRACE_BLOCK_TOKENS, ctok = (uint64_t)kc * TRACE_BLOCK_TOKENS;
    tok = tok < input_length ? tok : input_length;
    ctok = ctok < input_length ? ctok : input_length;
    s->c.requests++;
    s->c.blocks += n;
    s->c.input_tokens += input_length;
    s->c.hit_blocks += k;
    s->c.cpu_hit_blocks += kc;
    s->c.ssd_hit_blocks += k - kc;
    s->c.hit_tokens += tok;
    s->c.cpu_hit_tokens += ctok;
    s->c.ssd_hit_tokens += tok - ctok;
    s->c.stored_blocks += store(s->all, s->all_cap, keys, n, k, s->ids, s->scratch,
                                &s->c.evicted_blocks);
    if (s->cpu) {
        uint64_t ignored = 0;
        store(s->cpu, s->cpu_cap, keys, n, kc_raw, s->cpu_ids, s->scratch, &ignored);
    }
}
