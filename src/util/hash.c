#include "util/hash.h"

/* The state struct on the stack (no malloc per hash) needs the static
 * definitions; the functions still come from the shared libxxhash. */
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

uint64_t kvt__hash64(const void *data, size_t len, uint64_t seed)
{
    return XXH3_64bits_withSeed(data, len, seed);
}

kvt_hash128 kvt__hash128_chain(kvt_hash128 prev, const void *data, size_t len)
{
    /* Hash (prev || data) with a streaming state: prev is committed in full,
     * not just through a 64-bit seed. */
    XXH3_state_t st;
    XXH3_128bits_reset(&st);
    XXH3_128bits_update(&st, &prev, sizeof prev);
    XXH3_128bits_update(&st, data, len);
    XXH128_hash_t h = XXH3_128bits_digest(&st);
    kvt_hash128 out = {h.low64, h.high64};
    return out;
}
