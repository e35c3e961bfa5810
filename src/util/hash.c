#include "util/hash.h"

#include <stdatomic.h>
#include <string.h>

/* The state struct on the stack (no malloc per hash) needs the static
 * definitions; the functions still come from the shared libxxhash. */
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define KVT_HASH_X86 1
#endif

int kvt__hash_avx2(void)
{
#ifdef KVT_HASH_X86
    static _Atomic int v; /* 0: unknown, 1: no, 2: yes */
    int k = atomic_load_explicit(&v, memory_order_relaxed);
    if (!k) {
        __builtin_cpu_init();
        k = __builtin_cpu_supports("avx2") &&
                    kvt__xxh3_avx2_state_size() == sizeof(XXH3_state_t) ? 2 : 1;
        atomic_store_explicit(&v, k, memory_order_relaxed);
    }
    return k == 2;
#else
    return 0;
#endif
}

uint64_t kvt__hash64(const void *data, size_t len, uint64_t seed)
{
#ifdef KVT_HASH_X86
    /* Up to 240 bytes XXH3 is scalar either way. */
    if (len > 240 && kvt__hash_avx2()) return kvt__xxh3_avx2_seeded(data, len, seed);
#endif
    return XXH3_64bits_withSeed(data, len, seed);
}

int kvt__hash_copy_begin(kvt_hash_copy *h, uint64_t total, uint64_t seed)
{
#ifdef KVT_HASH_X86
    if (total > 240 && kvt__hash_avx2()) {
        kvt__xxh3_avx2_copy_begin(h, seed);
        h->total = total;
        h->pos = h->stripes = 0;
        h->normal = (total - 1) / 64; /* XXH3 long: stripes before the last one */
        return 1;
    }
#endif
    (void)h, (void)total, (void)seed;
    return 0;
}

void kvt__hash_copy_feed(kvt_hash_copy *h, void *dst, const void *src, size_t len)
{
#ifdef KVT_HASH_X86
    kvt__xxh3_avx2_copy_feed(h, dst, src, len);
#else
    (void)h, (void)dst, (void)src, (void)len;
#endif
}

void kvt__hash_copy_feedv(kvt_hash_copy *h, const kvt_copy_chunk *ch, size_t n)
{
#ifdef KVT_HASH_X86
    kvt__xxh3_avx2_copy_feedv(h, ch, n);
#else
    (void)h, (void)ch, (void)n;
#endif
}

uint64_t kvt__hash_copy_end(kvt_hash_copy *h)
{
#ifdef KVT_HASH_X86
    return kvt__xxh3_avx2_copy_end(h);
#else
    (void)h;
    return 0;
#endif
}

/* Inputs up to this many bytes are hashed from one stack buffer. */
#define CHAIN_ONESHOT_MAX 1024u

kvt_hash128 kvt__hash128_chain(kvt_hash128 prev, const void *data, size_t len)
{
    /* Hash (prev || data): prev is committed in full, not just through a
     * 64-bit seed. XXH3's streaming state gives exactly the one-shot hash
     * of the concatenation; for a block of tokens (64 bytes for 16 tokens)
     * resetting the 576-byte state cost most of the time, so a short input
     * is copied behind prev and hashed in one call (the same value:
     * test_chain_hash_values pins both paths). */
    if (len <= CHAIN_ONESHOT_MAX) {
        unsigned char buf[sizeof prev + CHAIN_ONESHOT_MAX];
        memcpy(buf, &prev, sizeof prev);
        if (len) memcpy(buf + sizeof prev, data, len);
        XXH128_hash_t h = XXH3_128bits(buf, sizeof prev + len);
        return (kvt_hash128){h.low64, h.high64};
    }
    XXH3_state_t st;
    XXH3_128bits_reset(&st);
    XXH3_128bits_update(&st, &prev, sizeof prev);
    XXH3_128bits_update(&st, data, len);
    XXH128_hash_t h = XXH3_128bits_digest(&st);
    kvt_hash128 out = {h.low64, h.high64};
    return out;
}
