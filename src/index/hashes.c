/* hashes.c - chained block hashes: the identity of a cached block.
 *
 * root = H(H(DOMAIN || ns_len as u32 LE) || ns bytes); the length prefix
 *        keeps every namespace distinct from every other, and the empty
 *        namespace (ns_len 0, ns NULL or not) from any non-empty one.
 * h_0  = H(root || tokens of block 0), h_i = H(h_{i-1} || tokens of block i),
 *        tokens as uint32 little-endian bytes, H = kvt__hash128_chain.
 * So h_i commits to the namespace and to every token of blocks 0..i, and two
 * requests share h_i exactly when they share the first i+1 blocks.
 * Cost: one XXH3-128 pass over the tokens (about 1 ns per token).
 *
 * Keyed requests (the engine names each block by its own key):
 * kroot = H(root || KEYED_DOMAIN), h_0 = H(kroot || key 0 bytes),
 * h_i = H(h_{i-1} || key i bytes). The previous hash is a fixed 16 bytes, so
 * the key bytes after it are unambiguous without a length prefix; the keyed
 * domain keeps every keyed chain apart from every token chain of the same
 * namespace.
 *
 * Independent keys (KVT_REQ_INDEPENDENT_KEYS): h_i = H(kroot || key i
 * bytes), each key's h_0 as a one-key request of it.
 */
#include "index/index.h"

#include <assert.h>
#include <string.h>
#include "util/le.h"

/* Token ids go into the hash as their in-memory bytes, which must be the
 * little-endian encoding so that hashes agree across hosts. */
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
               "kvt__block_hashes hashes token ids as little-endian bytes");

/* "kvtier-ns" in ASCII, then a version: change it and every hash changes. */
static const kvt_hash128 kvt__ns_domain = {0x6e2d726569747636ull, 0x0000000000000001ull};

static kvt_hash128 kvt__ns_root(const void *ns, uint32_t ns_len)
{
    uint8_t len_le[4];
    kvt__put32(len_le, ns_len);
    kvt_hash128 h = kvt__hash128_chain(kvt__ns_domain, len_le, sizeof len_le);
    if (ns_len == 0) return h; /* the empty namespace; ns may be NULL */
    return kvt__hash128_chain(h, ns, ns_len);
}

uint32_t kvt__block_hashes(const uint32_t *tokens, uint32_t num_tokens, uint32_t block_tokens,
                           const void *ns, uint32_t ns_len, kvt_hash128 *out, uint32_t max_out)
{
    assert(block_tokens > 0);
    assert(ns != NULL || ns_len == 0);
    uint32_t n = num_tokens / block_tokens;
    if (n > max_out) n = max_out;
    if (n == 0) return 0;
    assert(tokens != NULL && out != NULL);

    kvt_hash128 h = kvt__ns_root(ns, ns_len);
    size_t block_bytes = (size_t)block_tokens * sizeof tokens[0];
    for (uint32_t i = 0; i < n; i++) {
        h = kvt__hash128_chain(h, tokens + (size_t)i * block_tokens, block_bytes);
        out[i] = h;
    }
    return n;
}

/* "kvtier-keyed-v1": change it and every keyed hash changes. */
static const char kvt__keyed_domain[] = "kvtier-keyed-v1";

/* Chained (h_i from h_{i-1}) or each from the keyed root. */
static uint32_t key_hashes(const kvt_key *keys, uint32_t num_keys, const void *ns,
                           uint32_t ns_len, kvt_hash128 *out, uint32_t max_out, bool chain)
{
    assert(ns != NULL || ns_len == 0);
    uint32_t n = num_keys < max_out ? num_keys : max_out;
    if (n == 0) return 0;
    assert(keys != NULL && out != NULL);

    kvt_hash128 root = kvt__hash128_chain(kvt__ns_root(ns, ns_len), kvt__keyed_domain,
                                          sizeof kvt__keyed_domain - 1);
    kvt_hash128 h = root;
    for (uint32_t i = 0; i < n; i++) {
        assert(keys[i].data != NULL && keys[i].len > 0);
        h = kvt__hash128_chain(chain ? h : root, keys[i].data, keys[i].len);
        out[i] = h;
    }
    return n;
}

uint32_t kvt__key_hashes(const kvt_key *keys, uint32_t num_keys, const void *ns, uint32_t ns_len,
                         kvt_hash128 *out, uint32_t max_out)
{
    return key_hashes(keys, num_keys, ns, ns_len, out, max_out, true);
}

uint32_t kvt__key_roots(const kvt_key *keys, uint32_t num_keys, const void *ns, uint32_t ns_len,
                        kvt_hash128 *out, uint32_t max_out)
{
    return key_hashes(keys, num_keys, ns, ns_len, out, max_out, false);
}
