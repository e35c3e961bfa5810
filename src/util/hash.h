/* hash.h - the hashes kvtier uses, all XXH3 from libxxhash. */
#ifndef KVT_UTIL_HASH_H
#define KVT_UTIL_HASH_H

#include <stddef.h>
#include <stdint.h>

/* A block's identity: 128 bits so that accidental collisions are out of
 * reach even across billions of cached blocks. */
typedef struct kvt_hash128 {
    uint64_t lo, hi;
} kvt_hash128;

static inline int kvt__hash_eq(kvt_hash128 a, kvt_hash128 b)
{
    return a.lo == b.lo && a.hi == b.hi;
}

/* XXH3-64 with seed: the AVX2 build when the CPU has it (same values). */
uint64_t kvt__hash64(const void *data, size_t len, uint64_t seed);
/* True when the CPU has AVX2 and the AVX2 build below is usable. */
int kvt__hash_avx2(void);
/* XXH3-64 built for AVX2 (hash_avx2.c; x86-64 GCC/clang builds only; call
 * only when kvt__hash_avx2()). The streaming state is an XXH3_state_t. */
size_t kvt__xxh3_avx2_state_size(void);
void kvt__xxh3_avx2_reset(void *st);
void kvt__xxh3_avx2_update(void *st, const void *p, size_t n);
uint64_t kvt__xxh3_avx2_digest(void *st);
uint64_t kvt__xxh3_avx2_seeded(const void *p, size_t n, uint64_t seed);
/* XXH3-128 of data with a 128-bit chaining input folded into the seed and
 * the secret-independent mix, so the result commits to prev and data. */
kvt_hash128 kvt__hash128_chain(kvt_hash128 prev, const void *data, size_t len);

/* splitmix64: a fast, well-mixed PRNG step for deterministic test data. */
static inline uint64_t kvt__splitmix64(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

#endif
