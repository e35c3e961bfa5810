/* nsroots.c - which namespace stored each chain (server.h, kvt_srv_roots):
 * lets CLEAR remove one namespace's blocks from a tier. */
#include <stdlib.h>
#include <string.h>

#include "cache/cache.h"
#include "server/server.h"
#include "util/err.h"

static kvt_hash128 ns_hash(const void *ns, uint32_t ns_len)
{
    kvt_hash128 zero = {0x6b76746e73ull, 0};
    return kvt__hash128_chain(zero, ns_len ? ns : "", ns_len);
}

void kvt__srv_roots_init(kvt_srv_roots *r, uint32_t index_capacity)
{
    memset(r, 0, sizeof *r);
    pthread_mutex_init(&r->mu, NULL);
    uint64_t lim = 2ull * index_capacity;
    r->limit = lim < 1024 ? 1024 : lim > (1u << 30) ? (1u << 30) : (uint32_t)lim;
}

void kvt__srv_roots_free(kvt_srv_roots *r)
{
    free(r->v);
    free(r->table);
    pthread_mutex_destroy(&r->mu);
    memset(r, 0, sizeof *r);
}

static uint32_t slot_of(const kvt_srv_roots *r, kvt_hash128 h)
{
    return (uint32_t)(h.lo ^ (h.hi >> 7)) & (r->tcap - 1);
}

/* v index of root h, or UINT32_MAX; *slot gets where it is or would go. */
static uint32_t find(const kvt_srv_roots *r, kvt_hash128 h, uint32_t *slot)
{
    uint32_t i = slot_of(r, h);
    while (r->table[i]) {
        if (kvt__hash_eq(r->v[r->table[i] - 1].root, h)) {
            *slot = i;
            return r->table[i] - 1;
        }
        i = (i + 1) & (r->tcap - 1);
    }
    *slot = i;
    return UINT32_MAX;
}

/* The table again over v[0..n) with room for cap; false when no memory. */
static bool rebuild(kvt_srv_roots *r, uint32_t tcap)
{
    uint32_t *t = calloc(tcap, sizeof *t);
    if (!t) return false;
    free(r->table);
    r->table = t;
    r->tcap = tcap;
    for (uint32_t i = 0; i < r->n; i++) {
        uint32_t s;
        (void)find(r, r->v[i].root, &s);
        r->table[s] = i + 1;
    }
    return true;
}

/* Drops records whose root left the index (mu held). */
static void prune(kvt_srv_shard *sh)
{
    kvt_srv_roots *r = &sh->roots;
    kvt_hash128 *h = malloc((r->n ? r->n : 1) * sizeof *h);
    bool *live = malloc((r->n ? r->n : 1) * sizeof *live);
    if (h && live) {
        for (uint32_t i = 0; i < r->n; i++) h[i] = r->v[i].root;
        kvt__cache_ext_roots_live(sh->cache, h, r->n, live);
        uint32_t k = 0;
        for (uint32_t i = 0; i < r->n; i++)
            if (live[i]) r->v[k++] = r->v[i];
        r->n = k;
        (void)rebuild(r, r->tcap);
    }
    free(h);
    free(live);
}

void kvt__srv_roots_add(kvt_srv_shard *sh, const void *ns, uint32_t ns_len,
                        const kvt_hash128 *roots, uint32_t n)
{
    kvt_srv_roots *r = &sh->roots;
    kvt_hash128 nh = ns_hash(ns, ns_len);
    pthread_mutex_lock(&r->mu);
    for (uint32_t i = 0; i < n; i++) {
        uint32_t s;
        if (r->tcap && find(r, roots[i], &s) != UINT32_MAX) continue; /* recorded already */
        if (r->n == r->limit) prune(sh);
        if (r->n == r->limit) break; /* cannot be: live roots are fewer than the index holds */
        if (r->n == r->cap) {
            uint32_t cap = r->cap ? r->cap * 2 : 64;
            if (cap > r->limit) cap = r->limit;
            kvt_srv_root *v = realloc(r->v, (size_t)cap * sizeof *v);
            if (!v) break;
            r->v = v;
            r->cap = cap;
        }
        if (r->tcap < 2 * r->cap) {
            uint32_t t = 16;
            while (t < 2 * r->cap) t *= 2;
            if (!rebuild(r, t)) break;
        }
        (void)find(r, roots[i], &s);
        r->v[r->n] = (kvt_srv_root){roots[i], nh};
        r->table[s] = ++r->n;
    }
    pthread_mutex_unlock(&r->mu);
}

kvt_status kvt__srv_roots_clear(kvt_srv_shard *sh, const void *ns, uint32_t ns_len,
                                uint32_t *removed, uint32_t *kept)
{
    kvt_srv_roots *r = &sh->roots;
    kvt_hash128 nh = ns_hash(ns, ns_len);
    pthread_mutex_lock(&r->mu);
    kvt_hash128 *h = malloc((r->n ? r->n : 1) * sizeof *h);
    uint32_t k = 0;
    kvt_status st = h ? KVT_OK : kvt__fail(KVT_ENOMEM, "clear: no memory");
    for (uint32_t i = 0; h && i < r->n; i++)
        if (kvt__hash_eq(r->v[i].ns, nh)) h[k++] = r->v[i].root;
    if (!st) st = kvt__cache_ext_clear(sh->cache, h, k, removed, kept);
    if (!st) prune(sh); /* the removed chains' records go; pinned ones stay */
    pthread_mutex_unlock(&r->mu);
    free(h);
    return st;
}
