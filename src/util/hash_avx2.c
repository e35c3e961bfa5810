/* hash_avx2.c - XXH3-64 (one-shot seeded and streaming) built for AVX2,
 * picked at run time (kvt__hash_avx2 in hash.c) when the CPU has it. The
 * distro's libxxhash is built for baseline x86-64 (SSE2): about half the
 * speed, and checksums are a large share of a PD transfer's CPU and of a
 * store through the node server (docs/server.md). Same algorithm, same
 * results. */
#include <stddef.h>
#include <stdint.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2")
#endif
#include <immintrin.h> /* xxhash.h includes it only under -mavx2 */
#define XXH_INLINE_ALL
#define XXH_VECTOR 2 /* XXH_AVX2 */
#include <xxhash.h>

#include "util/hash.h"

size_t kvt__xxh3_avx2_state_size(void) { return sizeof(XXH3_state_t); }
void kvt__xxh3_avx2_reset(void *st) { XXH3_64bits_reset((XXH3_state_t *)st); }
void kvt__xxh3_avx2_update(void *st, const void *p, size_t n) { XXH3_64bits_update((XXH3_state_t *)st, p, n); }
uint64_t kvt__xxh3_avx2_digest(void *st) { return XXH3_64bits_digest((XXH3_state_t *)st); }
uint64_t kvt__xxh3_avx2_seeded(const void *p, size_t n, uint64_t seed)
{
    return XXH3_64bits_withSeed(p, n, seed);
}

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#endif
