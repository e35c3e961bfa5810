#include "support.h"

#include "util/hash.h"

kvt_geometry *kvt_test_geometry(uint32_t layers, uint32_t heads, uint32_t head_dim,
                                uint32_t tokens_per_page, kvt_layout layout)
{
    kvt_geometry *g = NULL;
    if (kvt_geometry_create(&g, layers, tokens_per_page, layout) != KVT_OK) return NULL;
    kvt_layer_spec s = {.num_components = 2,
                        .component = {{heads, head_dim, 2}, {heads, head_dim, 2}}};
    if (kvt_geometry_set_layers(g, 0, layers, &s) != KVT_OK) {
        kvt_geometry_destroy(g);
        return NULL;
    }
    return g;
}

void kvt_test_tokens(uint32_t *tokens, uint32_t n, uint64_t seed)
{
    uint64_t st = seed;
    for (uint32_t i = 0; i < n; i++) tokens[i] = (uint32_t)(kvt__splitmix64(&st) % 128000);
}
