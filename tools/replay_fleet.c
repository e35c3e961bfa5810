/* replay_fleet.c - an N-node fleet replay (see replay_fleet.h). */
#include "replay_fleet.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/hash.h"

int fleet_routing_parse(const char *name, fleet_routing *out)
{
    if (!strcmp(name, "random")) *out = ROUTE_RANDOM;
    else if (!strcmp(name, "sticky")) *out = ROUTE_STICKY;
    else if (!strcmp(name, "prefix")) *out = ROUTE_PREFIX;
    else return -1;
    return 0;
}

const char *fleet_routing_name(fleet_routing r)
{
    return r == ROUTE_RANDOM ? "random" : r == ROUTE_STICKY ? "sticky" : "prefix";
}

typedef struct fleet {
    sim *node;
    uint64_t *served; /* requests routed to each node */
    uint32_t n;
    uint64_t rng;
} fleet;

static void fleet_fini(fleet *f)
{
    for (uint32_t i = 0; f->node && i < f->n; i++) sim_fini(&f->node[i]);
    free(f->node);
    free(f->served);
}

static int fleet_init(fleet *f, const trace *t, const fleet_opts *o)
{
    memset(f, 0, sizeof *f);
    f->n = o->nodes;
    f->rng = o->seed;
    f->node = calloc(o->nodes, sizeof *f->node);
    f->served = calloc(o->nodes, sizeof *f->served);
    if (!f->node || !f->served) {
        fleet_fini(f);
        return fprintf(stderr, "kvtier replay: out of memory for %u nodes\n", o->nodes), -1;
    }
    uint64_t cpu = o->cpu_blocks ? o->cpu_blocks : t->num_unique;
    uint64_t ssd = o->cpu_blocks ? o->ssd_blocks : 0;
    char err[256];
    for (uint32_t i = 0; i < o->nodes; i++) {
        if (sim_init(&f->node[i], cpu, ssd, t->num_unique, t->max_blocks, err, sizeof err)) {
            f->n = i; /* only those made are torn down */
            fleet_fini(f);
            return fprintf(stderr, "kvtier replay: node %u: %s\n", i, err), -1;
        }
    }
    return 0;
}

/* The node holding the longest prefix of keys (ties: the one that served
 * fewest requests, then the lowest number); its match in *best. */
static uint32_t longest_holder(fleet *f, const kvt_hash128 *keys, uint32_t n, uint32_t *best)
{
    uint32_t at = 0;
    *best = 0;
    for (uint32_t i = 0; i < f->n; i++) {
        uint32_t k = sim_probe(&f->node[i], keys, n);
        if (k > *best || (k == *best && f->served[i] < f->served[at])) {
            *best = k;
            at = i;
        }
    }
    return at;
}

static uint32_t route(fleet *f, fleet_routing r, const uint32_t *ids, const kvt_hash128 *keys,
                      uint32_t n)
{
    if (r == ROUTE_RANDOM) return (uint32_t)(kvt__splitmix64(&f->rng) % f->n);
    if (r == ROUTE_STICKY) {
        uint64_t st = n ? ids[0] : 0;
        return (uint32_t)(kvt__splitmix64(&st) % f->n);
    }
    uint32_t best;
    return longest_holder(f, keys, n, &best);
}

/* One pass over the first max_requests requests; shared: pulls allowed. */
static int fleet_pass(const trace *t, const fleet_opts *o, bool shared, sim_counts *sum,
                      fleet_result *out)
{
    fleet f;
    if (fleet_init(&f, t, o)) return -1;
    kvt_hash128 *keys = malloc(((size_t)t->max_blocks + 1) * sizeof *keys);
    if (!keys) {
        fleet_fini(&f);
        return fprintf(stderr, "kvtier replay: out of memory\n"), -1;
    }
    uint32_t n = o->max_requests < t->num_reqs ? o->max_requests : t->num_reqs;
    for (uint32_t i = 0; i < n; i++) {
        const trace_req *r = &t->reqs[i];
        const uint32_t *ids = trace_ids(t, r);
        sim_keys(ids, r->num_blocks, keys);
        uint32_t to = route(&f, o->routing, ids, keys, r->num_blocks), remote = 0;
        if (shared) (void)longest_holder(&f, keys, r->num_blocks, &remote);
        sim_request_shared(&f.node[to], keys, r->num_blocks, r->input_length, remote);
        f.served[to]++;
    }
    memset(sum, 0, sizeof *sum);
    out->min_requests_per_node = UINT64_MAX;
    out->max_requests_per_node = 0;
    for (uint32_t i = 0; i < f.n; i++) {
        const sim_counts *c = &f.node[i].c;
        uint64_t *dst = (uint64_t *)sum;
        const uint64_t *src = (const uint64_t *)c;
        for (size_t k = 0; k < sizeof *c / sizeof(uint64_t); k++) dst[k] += src[k];
        if (f.served[i] < out->min_requests_per_node) out->min_requests_per_node = f.served[i];
        if (f.served[i] > out->max_requests_per_node) out->max_requests_per_node = f.served[i];
    }
    free(keys);
    fleet_fini(&f);
    return 0;
}

int fleet_run(const trace *t, const fleet_opts *o, fleet_result *out)
{
    memset(out, 0, sizeof *out);
    if (fleet_pass(t, o, false, &out->local, out)) return -1;
    return fleet_pass(t, o, true, &out->shared, out);
}
