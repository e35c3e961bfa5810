/* hash.h - the hashes kvtier uses, all XXH3 from libxxhash. */
#ifndef KVT_UTIL_HASH_H
#define KVT_UTIL_HASH_H

#include <stddef.h>
#include <stdint.h>

#include "util/copy.h" /* kvt_copy_chunk */

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

/* Copy while hashing: a range of total bytes is filled front to back by
 * feed calls (each continuing where the last ended, from any sources), and
 * end returns kvt__hash64 of the range (seeded with seed) as it landed.
 * Each 64-byte stripe is hashed as it is copied, from L1, so the hash
 * costs no second pass over memory (a store through the node server
 * checksums every block it copies; docs/server.md, Performance), and the
 * range is written with streaming stores where it is 32-byte aligned:
 * call kvt__copy_stream_fence (util/copy.h) after a batch of feeds and
 * before anyone is told the bytes are there. begin is
 * false when this CPU or size has no fused form (no AVX2, or total <= 240
 * bytes, which XXH3 hashes another way): copy and kvt__hash64 instead.
 * No allocation, lock or syscall. */
typedef struct kvt_hash_copy {
    _Alignas(64) uint64_t acc[8];       /* XXH3's accumulators */
    _Alignas(64) unsigned char secret[192]; /* XXH3's secret for the seed */
    unsigned char part[64];  /* a stripe split across feeds, assembled */
    unsigned char last[64];  /* the range's last 64 bytes (XXH3's final stripe) */
    uint64_t total, pos;  /* bytes in the range; bytes fed so far */
    uint64_t stripes;     /* stripes accumulated */
    uint64_t normal;      /* stripes accumulated before the final one */
} kvt_hash_copy;
int kvt__hash_copy_begin(kvt_hash_copy *h, uint64_t total, uint64_t seed);
/* dst continues the range where the last feed ended; len at most what
 * remains. */
void kvt__hash_copy_feed(kvt_hash_copy *h, void *dst, const void *src, size_t len);
/* Feeds n chunks in order, each continuing the range where the last ended
 * (dst side), as n feed calls would, and faster: chunks of whole 64-byte
 * stripes are copied with the accumulators held in registers throughout
 * and the next chunk's source prefetched while one is copied (a strided
 * source, as SGLang's page_first pool's 512-byte tokens, defeats the
 * hardware prefetcher at every chunk: one feed per chunk ran at 0.65-0.7x
 * the plain streaming copy of the same chunks, this at 0.8-0.85x). */
void kvt__hash_copy_feedv(kvt_hash_copy *h, const kvt_copy_chunk *ch, size_t n);
/* After exactly total bytes were fed. */
uint64_t kvt__hash_copy_end(kvt_hash_copy *h);
/* util/copy.h's AVX2 body (call only when kvt__hash_avx2()). */
void kvt__copy_stream_avx2(void *dst, const void *src, size_t len);
/* Their AVX2 bodies (hash_avx2.c). */
void kvt__xxh3_avx2_copy_begin(kvt_hash_copy *h, uint64_t seed);
void kvt__xxh3_avx2_copy_feed(kvt_hash_copy *h, void *dst, const void *src, size_t len);
void kvt__xxh3_avx2_copy_feedv(kvt_hash_copy *h, const kvt_copy_chunk *ch, size_t n);
uint64_t kvt__xxh3_avx2_copy_end(kvt_hash_copy *h);
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
