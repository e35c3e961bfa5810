/* sums.c - the layer checksums each block of a tier was stored with, by
 * slot (server.h, kvt_srv_sums). A store's client computes them in its
 * copy's pass and sends them with END; the server records them here and
 * commits the store at once. Every load gets them with its offsets, and
 * the loading client checks each layer of each block against them in its
 * own copy's pass before it reports the layer landed: bytes that changed
 * after the store (a torn or stray write, at any time while the block is
 * held) fail the load, never reach the engine (docs/server.md, Integrity).
 *
 * Records are kept by index entry, which a block keeps while it moves
 * between the CPU and SSD tiers: a block spilled to the SSD and read back
 * into another slot is still checked against what its store's client
 * copied. A record names the block it describes (its index key), so an
 * entry id reused by another block is not mistaken for it; a block with no
 * record (recovered from the SSD at a warm restart) is hashed from the
 * tier once, at its first load, after the SSD's own checksum passed, and
 * recorded. Pulled blocks are recorded by the puller (src/cluster). One
 * mutex per tier, taken once per request (not per block); hashing runs
 * outside it. Memory: 16 + 8 x layers bytes per entry, taken as entries
 * are used (calloc'd). */
#include <stdlib.h>
#include <string.h>

#include "layout/layout.h"
#include "server/server.h"
#include "util/err.h"
#include "util/hash.h"

uint64_t kvt__srv_layer_sum(const uint8_t *block, const kvt_geometry *g, uint32_t block_tokens,
                            uint32_t l)
{
    const uint8_t *seg = block + kvt__geo_block_offset(g, block_tokens, l, 0);
    uint64_t len = (uint64_t)block_tokens * kvt__geo_layer_token_bytes(g, l);
    return kvt__hash64(seg, (size_t)len, l);
}

uint64_t kvt__srv_layer_end(const kvt_geometry *g, uint32_t block_tokens, uint32_t l)
{
    return kvt__geo_block_offset(g, block_tokens, l, 0) +
           (uint64_t)block_tokens * kvt__geo_layer_token_bytes(g, l);
}

void kvt__srv_layer_sums(const uint8_t *block, const kvt_geometry *g, uint32_t block_tokens,
                         uint64_t *out)
{
    for (uint32_t l = 0; l < g->num_layers; l++)
        out[l] = kvt__srv_layer_sum(block, g, block_tokens, l);
}

kvt_status kvt__srv_sums_init(kvt_srv_sums *s, uint32_t entries, uint32_t layers)
{
    memset(s, 0, sizeof *s);
    if (pthread_mutex_init(&s->mu, NULL)) return kvt__fail(KVT_ESYS, "server: mutex init");
    s->ready = true;
    /* calloc of this size maps zero pages: memory is taken as entries fill */
    s->key = calloc(entries ? entries : 1, sizeof *s->key);
    s->sum = calloc((size_t)(entries ? entries : 1) * layers, sizeof *s->sum);
    s->entries = entries;
    s->layers = layers;
    if (!s->key || !s->sum) {
        kvt__srv_sums_destroy(s);
        return kvt__fail(KVT_ENOMEM, "server: no memory for the layer checksums of %u blocks "
                         "x %u layers", entries, layers);
    }
    return KVT_OK;
}

void kvt__srv_sums_destroy(kvt_srv_sums *s)
{
    if (!s->ready) return;
    free(s->key);
    free(s->sum);
    pthread_mutex_destroy(&s->mu);
    memset(s, 0, sizeof *s);
}

uint32_t kvt__srv_sums_max_blocks(uint32_t layers)
{
    /* a reply or END of n blocks carries n * (8 + 8 * layers) bytes and a
     * few fixed fields; one frame is at most KVT_SRV_MAX_MSG */
    uint64_t n = (KVT_SRV_MAX_MSG - 64) / (8ull + 8ull * layers);
    return n > KVT_SRV_MAX_BLOCKS ? KVT_SRV_MAX_BLOCKS : (uint32_t)n;
}

static bool same_key(kvt_hash128 a, kvt_hash128 b) { return a.lo == b.lo && a.hi == b.hi; }

/* wire: n * layers little-endian u64s, unaligned; else native. */
static void put(kvt_srv_sums *s, const uint32_t *ids, const kvt_hash128 *keys, uint32_t n,
                const uint8_t *wire, const uint64_t *native)
{
    const uint32_t nl = s->layers;
    pthread_mutex_lock(&s->mu);
    for (uint32_t i = 0; i < n; i++) {
        uint32_t e = ids[i];
        if (e >= s->entries) continue; /* ids come from the index: never */
        s->key[e] = keys[i];
        uint64_t *to = s->sum + (size_t)e * nl;
        for (uint32_t l = 0; l < nl; l++)
            to[l] = wire ? kvt__srv_get64(wire + 8 * ((size_t)i * nl + l))
                         : native[(size_t)i * nl + l];
    }
    pthread_mutex_unlock(&s->mu);
}

void kvt__srv_sums_put(kvt_srv_sums *s, const uint32_t *ids, const kvt_hash128 *keys,
                       uint32_t n, const uint8_t *sums)
{
    put(s, ids, keys, n, sums, NULL);
}

void kvt__srv_sums_put64(kvt_srv_sums *s, const uint32_t *ids, const kvt_hash128 *keys,
                         uint32_t n, const uint64_t *sums)
{
    put(s, ids, keys, n, NULL, sums);
}

/* Blocks [i0, i0 + k) of a get (k <= 64): their records into out, those
 * with none hashed from their bytes and recorded. The hashing runs outside
 * the lock (other loads read records meanwhile); the 64-bit mask is why a
 * get goes in chunks of 64, with no allocation. */
static uint32_t get_chunk(kvt_srv_sums *s, const uint8_t *base, const kvt_geometry *g,
                          uint32_t block_tokens, const uint64_t *offsets, const uint32_t *ids,
                          const kvt_hash128 *keys, uint32_t k, uint64_t *out)
{
    const uint32_t nl = s->layers;
    uint64_t miss = 0;
    pthread_mutex_lock(&s->mu);
    for (uint32_t i = 0; i < k; i++) {
        uint32_t e = ids[i];
        if (e >= s->entries || !same_key(s->key[e], keys[i])) miss |= 1ull << i;
        else memcpy(out + (size_t)i * nl, s->sum + (size_t)e * nl, (size_t)nl * 8);
    }
    pthread_mutex_unlock(&s->mu);
    if (!miss) return 0;
    /* Blocks with no record (recovered from the SSD): their bytes passed
     * the SSD's checksum when read (and are pinned by this load). */
    for (uint64_t m = miss; m; m &= m - 1) {
        uint32_t i = (uint32_t)__builtin_ctzll(m);
        kvt__srv_layer_sums(base + offsets[i], g, block_tokens, out + (size_t)i * nl);
    }
    pthread_mutex_lock(&s->mu);
    for (uint64_t m = miss; m; m &= m - 1) {
        uint32_t i = (uint32_t)__builtin_ctzll(m), e = ids[i];
        if (e >= s->entries) continue;
        s->key[e] = keys[i];
        memcpy(s->sum + (size_t)e * nl, out + (size_t)i * nl, (size_t)nl * 8);
    }
    pthread_mutex_unlock(&s->mu);
    return (uint32_t)__builtin_popcountll(miss);
}

uint32_t kvt__srv_sums_get(kvt_srv_sums *s, const uint8_t *base, const kvt_geometry *g,
                           uint32_t block_tokens, const uint64_t *offsets, const uint32_t *ids,
                           const kvt_hash128 *keys, uint32_t n, uint64_t *out)
{
    uint32_t computed = 0;
    for (uint32_t i = 0; i < n; i += 64) {
        uint32_t k = n - i < 64 ? n - i : 64;
        computed += get_chunk(s, base, g, block_tokens, offsets + i, ids + i, keys + i, k,
                              out + (size_t)i * s->layers);
    }
    return computed;
}

uint32_t kvt__srv_sums_check(kvt_srv_sums *s, const uint8_t *base, const kvt_geometry *g,
                             uint32_t block_tokens, const uint64_t *offsets, const uint32_t *ids,
                             const kvt_hash128 *keys, uint32_t n, kvt_hash128 *bad)
{
    const uint32_t nl = s->layers;
    uint64_t *want = malloc(2 * (size_t)(n ? n : 1) * nl * sizeof *want);
    uint32_t nbad = 0;
    if (!want) return 0;
    uint64_t *have = want + (size_t)n * nl;
    kvt__srv_sums_get(s, base, g, block_tokens, offsets, ids, keys, n, want);
    for (uint32_t i = 0; i < n; i++) {
        kvt__srv_layer_sums(base + offsets[i], g, block_tokens, have + (size_t)i * nl);
        if (memcmp(have + (size_t)i * nl, want + (size_t)i * nl, (size_t)nl * 8))
            bad[nbad++] = keys[i];
    }
    free(want);
    return nbad;
}
