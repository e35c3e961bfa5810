/* hash_avx2.c - XXH3-64 (one-shot seeded and streaming), copy while
 * hashing, and the streaming-store copy (util/copy.h), built for AVX2,
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

/* ---- copy while hashing (kvt_hash_copy, hash.h) ----
 * XXH3-64's long form, as XXH3_hashLong_internal_loop runs it: stripe i
 * (64 bytes at 64 i) is accumulated with secret + 8 (i mod 16), the
 * accumulators scrambled after every 16th, for the (total - 1) / 64
 * stripes before the last; then the last 64 bytes (overlapping) with the
 * "last" secret, and the merge. Built from xxhash's own steps; only the
 * order of copying and hashing is ours. test_util_helpers checks the value
 * against XXH3_64bits_withSeed over many sizes, seeds and feed splits. */
#include <stdbool.h>
#include <string.h>

#define HC_STRIPES_PER_BLOCK ((XXH_SECRET_DEFAULT_SIZE - XXH_STRIPE_LEN) / XXH_SECRET_CONSUME_RATE)
_Static_assert(sizeof(((kvt_hash_copy *)0)->secret) == XXH_SECRET_DEFAULT_SIZE,
               "kvt_hash_copy.secret must be XXH3's default secret size");

void kvt__xxh3_avx2_copy_begin(kvt_hash_copy *h, uint64_t seed)
{
    static const uint64_t init[XXH_ACC_NB] = XXH3_INIT_ACC;
    memcpy(h->acc, init, sizeof init);
    XXH3_initCustomSecret(h->secret, seed); /* seed 0: XXH3's own secret */
}

/* XXH3's accumulate and scramble steps on one 32-byte half of the
 * accumulators, held in a register: exactly XXH3_accumulate_512_avx2 and
 * XXH3_scrambleAcc_avx2 of xxhash 0.8 (test_hash_copy compares every
 * result with libxxhash), which keep the accumulators in memory: next to
 * streaming stores the compiler cannot keep them in registers, and the
 * store-to-load round trip per stripe cost a third of the fused copy. */
static inline __m256i hc_acc(__m256i acc, __m256i data, const uint8_t *key)
{
    __m256i data_key = _mm256_xor_si256(data, _mm256_loadu_si256((const __m256i *)key));
    __m256i data_key_lo = _mm256_shuffle_epi32(data_key, _MM_SHUFFLE(0, 3, 0, 1));
    __m256i product = _mm256_mul_epu32(data_key, data_key_lo);
    __m256i data_swap = _mm256_shuffle_epi32(data, _MM_SHUFFLE(1, 0, 3, 2));
    return _mm256_add_epi64(product, _mm256_add_epi64(acc, data_swap));
}

static inline __m256i hc_scramble(__m256i acc, const uint8_t *key)
{
    const __m256i prime32 = _mm256_set1_epi32((int)XXH_PRIME32_1);
    __m256i data = _mm256_xor_si256(acc, _mm256_srli_epi64(acc, 47));
    __m256i data_key = _mm256_xor_si256(data, _mm256_loadu_si256((const __m256i *)key));
    __m256i data_key_hi = _mm256_shuffle_epi32(data_key, _MM_SHUFFLE(0, 3, 0, 1));
    __m256i prod_lo = _mm256_mul_epu32(data_key, prime32);
    __m256i prod_hi = _mm256_mul_epu32(data_key_hi, prime32);
    return _mm256_add_epi64(prod_lo, _mm256_slli_epi64(prod_hi, 32));
}

/* Stripe *c (its halves a, b) into the accumulators, and counted; the
 * accumulators scrambled after every 16th. */
static inline void hc_one(const kvt_hash_copy *h, __m256i *acc0, __m256i *acc1, __m256i a,
                          __m256i b, uint64_t *c)
{
    const uint8_t *key = h->secret + (*c % HC_STRIPES_PER_BLOCK) * XXH_SECRET_CONSUME_RATE;
    *acc0 = hc_acc(*acc0, a, key);
    *acc1 = hc_acc(*acc1, b, key + 32);
    if (++*c % HC_STRIPES_PER_BLOCK == 0) {
        const uint8_t *scramble_key = h->secret + XXH_SECRET_DEFAULT_SIZE - XXH_STRIPE_LEN;
        *acc0 = hc_scramble(*acc0, scramble_key);
        *acc1 = hc_scramble(*acc1, scramble_key + 32);
    }
}

/* How far ahead of the stripe being copied its source is prefetched. The
 * hashing steps make the loop long enough that the out-of-order window no
 * longer covers the memory latency, and the hardware prefetcher restarts
 * at each chunk (an engine page, 8-32 KiB, anywhere): without it the fused
 * copy ran at 0.70-0.74x the plain streaming copy on this VM, with it at
 * 0.88-0.91x (one thread, 8 KiB chunks, contiguous or shuffled). The plain
 * streaming copy gains nothing from it (its loop is short). */
#define HC_PREFETCH_BYTES 4096

/* Prefetches [s, s + len), at most the first HC_PREFETCH_BYTES: the head
 * of a feed, before its loop prefetches ahead on its own. */
static inline void hc_prefetch_head(const uint8_t *s, size_t len)
{
    for (size_t o = 0; o < len && o < HC_PREFETCH_BYTES; o += XXH_STRIPE_LEN)
        _mm_prefetch((const char *)s + o, _MM_HINT_T0);
}

/* Whole stripes: each loaded once into registers, stored, and hashed from
 * those registers (the accumulators *acc0, *acc1 stay in registers once
 * inlined). Streaming stores where 32-byte aligned: the tier's cold
 * lines are not read for ownership first (a third less memory traffic, as
 * glibc's large memcpy). What is hashed is what was stored. No fence
 * here (one per 8 KiB feed cost a third of a store's copy): the caller
 * fences once per batch (kvt__copy_stream_fence). The source is
 * prefetched HC_PREFETCH_BYTES ahead, never past the n stripes. */
static inline void hc_stripes(const kvt_hash_copy *h, __m256i *acc0, __m256i *acc1, uint8_t *d,
                              const uint8_t *s, size_t n, uint64_t *count)
{
    const bool nt = ((uintptr_t)d & 31) == 0;
    const size_t ahead = HC_PREFETCH_BYTES / XXH_STRIPE_LEN; /* stripes */
    for (size_t i = 0; i < n; i++, d += XXH_STRIPE_LEN, s += XXH_STRIPE_LEN) {
        if (i + ahead < n) _mm_prefetch((const char *)s + HC_PREFETCH_BYTES, _MM_HINT_T0);
        __m256i a = _mm256_loadu_si256((const __m256i *)s);
        __m256i b = _mm256_loadu_si256((const __m256i *)(s + 32));
        if (nt) {
            _mm256_stream_si256((__m256i *)d, a);
            _mm256_stream_si256((__m256i *)(d + 32), b);
        } else {
            _mm256_storeu_si256((__m256i *)d, a);
            _mm256_storeu_si256((__m256i *)(d + 32), b);
        }
        hc_one(h, acc0, acc1, a, b, count);
    }
}

/* The range's last 64 bytes (XXH3's final, overlapping stripe) are kept
 * from the sources: [start, end) of the range was just copied from src. */
static inline void hc_keep_last(kvt_hash_copy *h, const uint8_t *src, uint64_t start, uint64_t end)
{
    uint64_t lo = h->total - XXH_STRIPE_LEN, from = start > lo ? start : lo;
    if (from < end) memcpy(h->last + (from - lo), src + (from - start), (size_t)(end - from));
}

/* Nothing is hashed from the destination: a line just written there may
 * still be on its way to memory (a streaming store, or a plain one waiting
 * for its line), and reading it back stalls. A stripe split across feeds
 * is assembled in h->part, and the range's last 64 bytes (XXH3's final,
 * overlapping stripe) are kept in h->last, both from the sources. */
void kvt__xxh3_avx2_copy_feed(kvt_hash_copy *h, void *dst, const void *src, size_t len)
{
    __m256i acc0 = _mm256_load_si256((const __m256i *)h->acc);
    __m256i acc1 = _mm256_load_si256((const __m256i *)h->acc + 1);
    uint64_t count = h->stripes, start = h->pos;
    uint8_t *d = dst;
    const uint8_t *s = src;
    hc_prefetch_head(s, len);
    while (len) {
        size_t in = (size_t)(h->pos % XXH_STRIPE_LEN);
        if (in == 0 && len >= XXH_STRIPE_LEN && count < h->normal) {
            size_t n = len / XXH_STRIPE_LEN;
            if (n > h->normal - count) n = (size_t)(h->normal - count);
            hc_stripes(h, &acc0, &acc1, d, s, n, &count);
            d += n * XXH_STRIPE_LEN;
            s += n * XXH_STRIPE_LEN;
            len -= n * XXH_STRIPE_LEN;
            h->pos += n * XXH_STRIPE_LEN;
            continue;
        }
        /* A stripe split across feeds, or the bytes after the last normal
         * stripe: copy up to the stripe's end, hash it once complete. */
        size_t k = XXH_STRIPE_LEN - in < len ? XXH_STRIPE_LEN - in : len;
        memcpy(d, s, k);
        memcpy(h->part + in, s, k);
        d += k;
        s += k;
        len -= k;
        h->pos += k;
        if (h->pos % XXH_STRIPE_LEN == 0 && count < h->normal)
            hc_one(h, &acc0, &acc1, _mm256_loadu_si256((const __m256i *)h->part),
                   _mm256_loadu_si256((const __m256i *)(h->part + 32)), &count);
    }
    hc_keep_last(h, src, start, h->pos);
    _mm256_store_si256((__m256i *)h->acc, acc0);
    _mm256_store_si256((__m256i *)h->acc + 1, acc1);
    h->stripes = count;
}

/* hash.h: runs of chunks of whole normal stripes, with the accumulators
 * in registers across them and the next chunk's head prefetched before a
 * chunk is copied; any other chunk (a stripe split across chunks, the
 * range's last stripe) goes through the feed above. */
void kvt__xxh3_avx2_copy_feedv(kvt_hash_copy *h, const kvt_copy_chunk *ch, size_t n)
{
    size_t i = 0;
    while (i < n) {
        size_t j = i;
        if (h->pos % XXH_STRIPE_LEN == 0) {
            __m256i acc0 = _mm256_load_si256((const __m256i *)h->acc);
            __m256i acc1 = _mm256_load_si256((const __m256i *)h->acc + 1);
            uint64_t count = h->stripes;
            for (; j < n; j++) {
                size_t len = (size_t)ch[j].len, stripes = len / XXH_STRIPE_LEN;
                if (len % XXH_STRIPE_LEN || stripes > h->normal - count) break;
                if (j + 1 < n) hc_prefetch_head(ch[j + 1].src, (size_t)ch[j + 1].len);
                hc_stripes(h, &acc0, &acc1, ch[j].dst, ch[j].src, stripes, &count);
                hc_keep_last(h, ch[j].src, h->pos, h->pos + len);
                h->pos += len;
            }
            _mm256_store_si256((__m256i *)h->acc, acc0);
            _mm256_store_si256((__m256i *)h->acc + 1, acc1);
            h->stripes = count;
        }
        if (j == i) { /* not whole stripes here: the feed's way */
            kvt__xxh3_avx2_copy_feed(h, ch[i].dst, ch[i].src, (size_t)ch[i].len);
            j = i + 1;
        }
        i = j;
    }
}

uint64_t kvt__xxh3_avx2_copy_end(kvt_hash_copy *h)
{
    XXH3_accumulate_512_avx2(h->acc, h->last,
                             h->secret + XXH_SECRET_DEFAULT_SIZE - XXH_STRIPE_LEN -
                                 XXH_SECRET_LASTACC_START);
    return XXH3_mergeAccs(h->acc, h->secret + XXH_SECRET_MERGEACCS_START,
                          (xxh_u64)h->total * XXH_PRIME64_1);
}

/* util/copy.h: aligned to 32 bytes with memcpy, then 64-byte stripes. */
void kvt__copy_stream_avx2(void *dst, const void *src, size_t len)
{
    uint8_t *d = dst;
    const uint8_t *s = src;
    size_t head = (size_t)(-(uintptr_t)d & 31); /* to a 32-byte boundary */
    if (head > len) head = len;
    memcpy(d, s, head);
    d += head;
    s += head;
    len -= head;
    for (; len >= 64; len -= 64, d += 64, s += 64) {
        __m256i a = _mm256_loadu_si256((const __m256i *)s);
        __m256i b = _mm256_loadu_si256((const __m256i *)(s + 32));
        _mm256_stream_si256((__m256i *)d, a);
        _mm256_stream_si256((__m256i *)(d + 32), b);
    }
    memcpy(d, s, len);
}

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#endif
