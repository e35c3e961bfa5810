/* ssd_recover.c - kvt__ssd_recover: hands the blocks replayed from the
 * journals to the cache, parents before children. Blocks are striped over
 * directories, so journal order alone gives no such order: each block's
 * depth (parent chain length among recovered blocks) is computed through a
 * key -> slot hash table and blocks are sorted by it. A parent that was not
 * recovered makes its child a root (depth 0); a cycle (only from a forged
 * journal) is cut where it is found. Runs once at start; allocates. */
#include "store/ssd_internal.h"

#include <stdlib.h>
#include "util/err.h"

#define EMPTY UINT32_MAX
#define UNKNOWN (-1)
#define VISITING (-2)

typedef struct order_ctx {
    const kvt_ssd_slot *tab;
    uint32_t *map, mask; /* open addressing: slot numbers keyed by block key */
    int64_t *depth;
    uint32_t *path;
} order_ctx;

static void map_put(order_ctx *c, uint32_t slot)
{
    uint32_t h = (uint32_t)c->tab[slot].key.lo & c->mask;
    while (c->map[h] != EMPTY) h = (h + 1) & c->mask;
    c->map[h] = slot;
}

static uint32_t map_find(const order_ctx *c, kvt_hash128 key)
{
    for (uint32_t h = (uint32_t)key.lo & c->mask; c->map[h] != EMPTY; h = (h + 1) & c->mask)
        if (kvt__hash_eq(c->tab[c->map[h]].key, key)) return c->map[h];
    return EMPTY;
}

static uint32_t parent_slot(const order_ctx *c, uint32_t slot)
{
    const kvt_ssd_slot *e = &c->tab[slot];
    if (!e->has_parent) return EMPTY;
    uint32_t p = map_find(c, e->parent);
    return p == slot ? EMPTY : p;
}

/* Walks up from slot until a block of known depth (or a root, or a cycle),
 * then assigns depths on the way back down. Iterative: chains can be long. */
static void compute_depth(order_ctx *c, uint32_t slot)
{
    uint32_t len = 0, cur = slot;
    while (cur != EMPTY && c->depth[cur] == UNKNOWN) {
        c->depth[cur] = VISITING;
        c->path[len++] = cur;
        cur = parent_slot(c, cur);
    }
    int64_t next = (cur != EMPTY && c->depth[cur] >= 0) ? c->depth[cur] + 1 : 0;
    while (len > 0) c->depth[c->path[--len]] = next++;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

uint32_t kvt__ssd_recover(kvt_ssd *s, kvt_ssd_recover_fn fn, void *arg)
{
    if (!s || !fn || s->recovered) return 0;
    s->recovered = true;
    uint32_t n = 0;
    for (uint32_t g = 0; g < s->total; g++) n += s->slots[g].live;
    if (n == 0) return 0;
    uint32_t cap = 2;
    while (cap < 2 * (uint64_t)n) cap *= 2;
    order_ctx c = {.tab = s->slots, .mask = cap - 1};
    c.map = malloc((size_t)cap * sizeof *c.map);
    c.depth = malloc((size_t)s->total * sizeof *c.depth);
    c.path = malloc((size_t)n * sizeof *c.path);
    uint64_t *order = malloc((size_t)n * sizeof *order);
    uint32_t out = 0;
    if (!c.map || !c.depth || !c.path || !order) goto done; /* reported as 0 recovered */
    for (uint32_t i = 0; i < cap; i++) c.map[i] = EMPTY;
    for (uint32_t g = 0; g < s->total; g++) {
        c.depth[g] = UNKNOWN;
        if (s->slots[g].live) map_put(&c, g);
    }
    for (uint32_t g = 0; g < s->total; g++) {
        if (!s->slots[g].live) continue;
        compute_depth(&c, g);
        order[out++] = ((uint64_t)c.depth[g] << 32) | g; /* depth < n < 2^31 */
    }
    qsort(order, out, sizeof *order, cmp_u64);
    for (uint32_t i = 0; i < out; i++) {
        const kvt_ssd_slot *e = &s->slots[(uint32_t)order[i]];
        fn(arg, (uint32_t)order[i], e->key, e->parent, e->has_parent);
    }
done:
    free(c.map);
    free(c.depth);
    free(c.path);
    free(order);
    return out;
}
