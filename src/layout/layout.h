/* layout.h - KV geometry internals: where each byte of a token's KV lives in
 * the engine's pages and in a cache block.
 *
 * A cache block holds block_tokens tokens of every layer and component, in
 * layer-major order so one layer of a block is contiguous (layerwise loads
 * move layer 0 of every block first):
 *   [L0 C0: block_tokens x token_bytes(0,0)] [L0 C1 ...] [L1 C0 ...] ...
 * Units: "unit" = one (layer, component) pair, numbered layer*2 + component.
 */
#ifndef KVT_LAYOUT_LAYOUT_H
#define KVT_LAYOUT_LAYOUT_H

#include <stdbool.h>
#include <stdint.h>
#include "kvtier.h"

struct kvt_geometry {
    uint32_t num_layers;
    uint32_t tokens_per_page;
    kvt_layout layout;
    kvt_layer_spec *layers; /* num_layers entries */
    bool *layer_set;
    /* unit_prefix[u] = sum of token_bytes of units before u (u = l*2+c),
     * unit_prefix[num_layers*2] = bytes per token. Kept current by set_layer. */
    uint64_t *unit_prefix;
};

#define KVT_UNIT(layer, comp) ((layer) * KVT_MAX_COMPONENTS + (comp))

static inline uint32_t kvt__geo_ncomp(const kvt_geometry *g, uint32_t layer)
{
    return g->layers[layer].num_components;
}

/* Bytes of one token in one (layer, component); 0 for an absent component. */
static inline uint64_t kvt__geo_token_bytes(const kvt_geometry *g, uint32_t layer,
                                            uint32_t comp)
{
    uint32_t u = KVT_UNIT(layer, comp);
    return g->unit_prefix[u + 1] - g->unit_prefix[u];
}

/* Bytes of one token across all layers and components. */
static inline uint64_t kvt__geo_bytes_per_token(const kvt_geometry *g)
{
    return g->unit_prefix[(uint64_t)g->num_layers * KVT_MAX_COMPONENTS];
}

/* Bytes of one token across all components of one layer. */
static inline uint64_t kvt__geo_layer_token_bytes(const kvt_geometry *g, uint32_t layer)
{
    return g->unit_prefix[KVT_UNIT(layer + 1, 0)] - g->unit_prefix[KVT_UNIT(layer, 0)];
}

/* Offset of (layer, comp) inside a cache block of block_tokens tokens. */
static inline uint64_t kvt__geo_block_offset(const kvt_geometry *g, uint32_t block_tokens,
                                             uint32_t layer, uint32_t comp)
{
    return (uint64_t)block_tokens * g->unit_prefix[KVT_UNIT(layer, comp)];
}

/* Where the engine keeps page `page` of (layer, comp): a base pointer, a
 * stride between pages and one between the tokens of a page (the unit's
 * token bytes when they are contiguous, the usual case: then a page of a
 * unit is one run of bytes). */
typedef struct kvt_page_map {
    uint8_t *base[KVT_MAX_LAYERS * KVT_MAX_COMPONENTS];
    uint64_t stride[KVT_MAX_LAYERS * KVT_MAX_COMPONENTS];
    uint64_t token_stride[KVT_MAX_LAYERS * KVT_MAX_COMPONENTS];
    uint32_t num_pages;
} kvt_page_map;

/* Builds the page map of engine memory for geometry g; KVT_EINVAL (with a
 * message naming the missing buffer) if mem does not fit the layout. */
kvt_status kvt__page_map_init(kvt_page_map *map, const kvt_geometry *g,
                              const kvt_engine_memory *mem);
/* The same; messages name fn (the public function the caller is in). */
kvt_status kvt__page_map_init_fn(kvt_page_map *map, const kvt_geometry *g,
                                 const kvt_engine_memory *mem, const char *fn);
/* The map alone, unchecked: for host memory the caller allocated from g
 * itself (the emulator's buffers), which fits g by construction. */
void kvt__page_map_fill(kvt_page_map *map, const kvt_geometry *g, const kvt_engine_memory *mem);

static inline uint8_t *kvt__page_addr(const kvt_page_map *m, uint32_t unit, uint32_t page)
{
    return m->base[unit] + (uint64_t)page * m->stride[unit];
}

/* Token `token` (0 .. tokens_per_page - 1) of page `page` of a unit. */
static inline uint8_t *kvt__token_addr(const kvt_page_map *m, uint32_t unit, uint32_t page,
                                       uint32_t token)
{
    return kvt__page_addr(m, unit, page) + (uint64_t)token * m->token_stride[unit];
}

#endif
