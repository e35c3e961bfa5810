/* geometry.c - the public kvt_geometry_* functions. */
#include "layout/layout.h"

#include <stdlib.h>
#include <string.h>
#include "util/err.h"
#include "util/hash.h"

static const char *comp_name(const kvt_geometry *g, uint32_t layer, uint32_t comp)
{
    if (g->layers[layer].num_components == 1) return "KV";
    return comp == 0 ? "K" : "V";
}

static void recompute_prefix(kvt_geometry *g)
{
    uint64_t sum = 0;
    for (uint32_t l = 0; l < g->num_layers; l++) {
        for (uint32_t c = 0; c < KVT_MAX_COMPONENTS; c++) {
            g->unit_prefix[KVT_UNIT(l, c)] = sum;
            const kvt_layer_spec *s = &g->layers[l];
            if (g->layer_set[l] && c < s->num_components) {
                const kvt_component_spec *cs = &s->component[c];
                sum += (uint64_t)cs->kv_heads * cs->head_dim * cs->elem_size;
            }
        }
    }
    g->unit_prefix[(uint64_t)g->num_layers * KVT_MAX_COMPONENTS] = sum;
}

kvt_status kvt_geometry_create(kvt_geometry **out, uint32_t num_layers,
                               uint32_t tokens_per_page, kvt_layout layout)
{
    kvt__clear_error();
    KVT_CHECK_NOT_NULL(out, "kvt_geometry_create");
    KVT_CHECK_ARG(num_layers > 0 && num_layers <= KVT_MAX_LAYERS,
                  "kvt_geometry_create: num_layers is %u (must be 1..%u)", num_layers,
                  KVT_MAX_LAYERS);
    KVT_CHECK_ARG(tokens_per_page > 0 && tokens_per_page <= 65536,
                  "kvt_geometry_create: tokens_per_page is %u (must be 1..65536)",
                  tokens_per_page);
    KVT_CHECK_ARG(layout == KVT_LAYOUT_LAYER_FIRST || layout == KVT_LAYOUT_PAGE_FIRST,
                  "kvt_geometry_create: layout %d is neither LAYER_FIRST nor PAGE_FIRST",
                  (int)layout);
    kvt_geometry *g = calloc(1, sizeof *g);
    if (!g) goto fail_nomem;
    g->layers = calloc(num_layers, sizeof *g->layers);
    g->layer_set = calloc(num_layers, sizeof *g->layer_set);
    g->unit_prefix = calloc((size_t)num_layers * KVT_MAX_COMPONENTS + 1, sizeof(uint64_t));
    if (!g->layers || !g->layer_set || !g->unit_prefix) goto fail_free;
    g->num_layers = num_layers;
    g->tokens_per_page = tokens_per_page;
    g->layout = layout;
    *out = g;
    return KVT_OK;
fail_free:
    kvt_geometry_destroy(g);
fail_nomem:
    return kvt__fail(KVT_ENOMEM, "kvt_geometry_create: out of memory for %u layers",
                     num_layers);
}

void kvt_geometry_destroy(kvt_geometry *g)
{
    if (!g) return;
    free(g->layers);
    free(g->layer_set);
    free(g->unit_prefix);
    free(g);
}

kvt_status kvt_geometry_clone(const kvt_geometry *src, kvt_geometry **out)
{
    KVT_CHECK_NOT_NULL_AS(src, "geo", "kvt_geometry_clone");
    KVT_CHECK_NOT_NULL(out, "kvt_geometry_clone");
    kvt_geometry *g;
    kvt_status st = kvt_geometry_create(&g, src->num_layers, src->tokens_per_page, src->layout);
    if (st) return st;
    memcpy(g->layers, src->layers, src->num_layers * sizeof *g->layers);
    memcpy(g->layer_set, src->layer_set, src->num_layers * sizeof *g->layer_set);
    recompute_prefix(g);
    *out = g;
    return KVT_OK;
}

/* Checks one layer's spec; the message names the layer and field. */
static kvt_status check_spec(const kvt_geometry *g, uint32_t layer, const kvt_layer_spec *s,
                             const char *fn)
{
    if (s->num_components < 1 || s->num_components > KVT_MAX_COMPONENTS)
        return kvt__fail(KVT_EINVAL, "%s: layer %u: num_components is %u (must be 1 or 2)",
                         fn, layer, s->num_components);
    for (uint32_t c = 0; c < s->num_components; c++) {
        const kvt_component_spec *cs = &s->component[c];
        const char *name = s->num_components == 1 ? "KV" : (c == 0 ? "K" : "V");
        if (cs->kv_heads == 0 || cs->kv_heads > 4096)
            return kvt__fail(KVT_EINVAL, "%s: layer %u %s: kv_heads is %u (must be 1..4096)",
                             fn, layer, name, cs->kv_heads);
        if (cs->head_dim == 0 || cs->head_dim > 65536)
            return kvt__fail(KVT_EINVAL, "%s: layer %u %s: head_dim is %u (must be 1..65536)",
                             fn, layer, name, cs->head_dim);
        uint32_t e = cs->elem_size;
        if (e != 1 && e != 2 && e != 4 && e != 8)
            return kvt__fail(KVT_EINVAL, "%s: layer %u %s: elem_size is %u (must be 1, 2, 4 or 8)",
                             fn, layer, name, e);
    }
    (void)g;
    return KVT_OK;
}

kvt_status kvt_geometry_set_layers(kvt_geometry *g, uint32_t first, uint32_t count,
                                   const kvt_layer_spec *spec)
{
    static const char fn[] = "kvt_geometry_set_layers";
    KVT_CHECK_NOT_NULL_AS(g, "geo", fn);
    KVT_CHECK_NOT_NULL(spec, fn);
    KVT_CHECK_ARG(count > 0 && first < g->num_layers && count <= g->num_layers - first,
                  "%s: layers [%u, %llu) are outside the geometry's %u layers", fn, first,
                  (unsigned long long)first + count, g->num_layers);
    kvt_status st = check_spec(g, first, spec, fn);
    if (st) return st;
    for (uint32_t l = first; l < first + count; l++) {
        g->layers[l] = *spec;
        /* Unused component slots read as zero so digests are canonical. */
        for (uint32_t c = spec->num_components; c < KVT_MAX_COMPONENTS; c++)
            memset(&g->layers[l].component[c], 0, sizeof g->layers[l].component[c]);
        g->layer_set[l] = true;
    }
    recompute_prefix(g);
    return KVT_OK;
}

kvt_status kvt_geometry_set_layer(kvt_geometry *g, uint32_t layer, const kvt_layer_spec *spec)
{
    KVT_CHECK_NOT_NULL_AS(g, "geo", "kvt_geometry_set_layer");
    KVT_CHECK_ARG(layer < g->num_layers, "kvt_geometry_set_layer: layer %u is out of range (geometry has %u layers)",
                  layer, g->num_layers);
    KVT_CHECK_NOT_NULL(spec, "kvt_geometry_set_layer");
    kvt_status st = check_spec(g, layer, spec, "kvt_geometry_set_layer");
    if (st) return st;
    return kvt_geometry_set_layers(g, layer, 1, spec);
}

kvt_status kvt_geometry_validate(const kvt_geometry *g)
{
    kvt__clear_error();
    KVT_CHECK_ARG(g != NULL, "kvt_geometry_validate: geo is NULL");
    for (uint32_t l = 0; l < g->num_layers; l++) {
        if (!g->layer_set[l])
            return kvt__fail(KVT_EINVAL, "kvt_geometry_validate: layer %u is not described "
                             "(call kvt_geometry_set_layer)", l);
        kvt_status st = check_spec(g, l, &g->layers[l], "kvt_geometry_validate");
        if (st) return st;
    }
    /* A page of every layer must fit comfortably in 64-bit offsets and a
     * block in memory; 1 TiB per page is far beyond any real model. */
    if (kvt__geo_bytes_per_token(g) * g->tokens_per_page > (1ull << 40))
        return kvt__fail(KVT_EINVAL, "kvt_geometry_validate: a page would hold %llu bytes",
                         (unsigned long long)(kvt__geo_bytes_per_token(g) * g->tokens_per_page));
    return KVT_OK;
}

static uint64_t digest(const kvt_geometry *g)
{
    uint64_t h = kvt__hash64(&g->num_layers, sizeof g->num_layers, 0x6b767469ull);
    h = kvt__hash64(&g->tokens_per_page, sizeof g->tokens_per_page, h);
    uint32_t layout = (uint32_t)g->layout;
    h = kvt__hash64(&layout, sizeof layout, h);
    return kvt__hash64(g->layers, g->num_layers * sizeof *g->layers, h);
}

kvt_status kvt_geometry_info_get(const kvt_geometry *g, kvt_geometry_info *out)
{
    kvt__clear_error();
    KVT_CHECK_ARG(g != NULL, "kvt_geometry_info_get: geo is NULL");
    KVT_CHECK_NOT_NULL(out, "kvt_geometry_info_get");
    kvt_status st = kvt_geometry_validate(g);
    if (st) return st;
    kvt_geometry_info info = {
        .num_layers = g->num_layers,
        .tokens_per_page = g->tokens_per_page,
        .layout = g->layout,
        .bytes_per_token = kvt__geo_bytes_per_token(g),
        .bytes_per_page = kvt__geo_bytes_per_token(g) * g->tokens_per_page,
        .digest = digest(g),
    };
    *out = info;
    return KVT_OK;
}

kvt_status kvt_geometry_layer(const kvt_geometry *g, uint32_t layer, kvt_layer_spec *out)
{
    kvt__clear_error();
    KVT_CHECK_NOT_NULL_AS(g, "geo", "kvt_geometry_layer");
    KVT_CHECK_NOT_NULL(out, "kvt_geometry_layer");
    KVT_CHECK_ARG(layer < g->num_layers, "kvt_geometry_layer: layer %u is out of range (%u layers)",
                  layer, g->num_layers);
    KVT_CHECK_ARG(g->layer_set[layer], "kvt_geometry_layer: layer %u is not described", layer);
    *out = g->layers[layer];
    return KVT_OK;
}

kvt_status kvt_geometry_token_bytes(const kvt_geometry *g, uint32_t layer, uint32_t comp,
                                    uint64_t *out)
{
    KVT_CHECK_NOT_NULL_AS(g, "geo", "kvt_geometry_token_bytes");
    KVT_CHECK_NOT_NULL(out, "kvt_geometry_token_bytes");
    KVT_CHECK_ARG(layer < g->num_layers, "kvt_geometry_token_bytes: layer %u is out of range (%u layers)",
                  layer, g->num_layers);
    KVT_CHECK_ARG(g->layer_set[layer], "kvt_geometry_token_bytes: layer %u is not described", layer);
    KVT_CHECK_ARG(comp < g->layers[layer].num_components,
                  "kvt_geometry_token_bytes: layer %u has no component %u", layer, comp);
    *out = kvt__geo_token_bytes(g, layer, comp);
    return KVT_OK;
}

kvt_status kvt_geometry_compare(const kvt_geometry *a, const kvt_geometry *b)
{
    static const char fn[] = "kvt_geometry_compare";
    KVT_CHECK_NOT_NULL(a, fn);
    KVT_CHECK_NOT_NULL(b, fn);
    kvt__clear_error();
    if (a->num_layers != b->num_layers)
        return kvt__fail(KVT_EGEOMETRY, "kvt_geometry_compare: num_layers %u vs %u", a->num_layers, b->num_layers);
    if (a->tokens_per_page != b->tokens_per_page)
        return kvt__fail(KVT_EGEOMETRY, "kvt_geometry_compare: tokens_per_page %u vs %u", a->tokens_per_page,
                         b->tokens_per_page);
    if (a->layout != b->layout)
        return kvt__fail(KVT_EGEOMETRY, "kvt_geometry_compare: layout %s vs %s",
                         a->layout == KVT_LAYOUT_LAYER_FIRST ? "layer-first" : "page-first",
                         b->layout == KVT_LAYOUT_LAYER_FIRST ? "layer-first" : "page-first");
    for (uint32_t l = 0; l < a->num_layers; l++) {
        const kvt_layer_spec *x = &a->layers[l], *y = &b->layers[l];
        if (a->layer_set[l] != b->layer_set[l])
            return kvt__fail(KVT_EGEOMETRY, "kvt_geometry_compare: layer %u: described %s vs %s", l,
                             a->layer_set[l] ? "yes" : "no", b->layer_set[l] ? "yes" : "no");
        if (x->num_components != y->num_components)
            return kvt__fail(KVT_EGEOMETRY, "kvt_geometry_compare: layer %u: num_components %u vs %u", l,
                             x->num_components, y->num_components);
        for (uint32_t c = 0; c < x->num_components; c++) {
            const kvt_component_spec *p = &x->component[c], *q = &y->component[c];
            const char *name = comp_name(a, l, c);
            if (p->kv_heads != q->kv_heads)
                return kvt__fail(KVT_EGEOMETRY, "kvt_geometry_compare: layer %u %s: kv_heads %u vs %u", l, name,
                                 p->kv_heads, q->kv_heads);
            if (p->head_dim != q->head_dim)
                return kvt__fail(KVT_EGEOMETRY, "kvt_geometry_compare: layer %u %s: head_dim %u vs %u", l, name,
                                 p->head_dim, q->head_dim);
            if (p->elem_size != q->elem_size)
                return kvt__fail(KVT_EGEOMETRY, "kvt_geometry_compare: layer %u %s: elem_size %u vs %u", l, name,
                                 p->elem_size, q->elem_size);
        }
    }
    return KVT_OK;
}

kvt_status kvt__page_map_init(kvt_page_map *map, const kvt_geometry *g,
                              const kvt_engine_memory *mem)
{
    return kvt__page_map_init_fn(map, g, mem, "kvt_cache_register_memory");
}

void kvt__page_map_fill(kvt_page_map *map, const kvt_geometry *g, const kvt_engine_memory *mem)
{
    memset(map, 0, sizeof *map);
    map->num_pages = mem->num_pages;
    uint64_t page_bytes = kvt__geo_bytes_per_token(g) * g->tokens_per_page;
    for (uint32_t l = 0; l < g->num_layers; l++) {
        for (uint32_t c = 0; c < kvt__geo_ncomp(g, l); c++) {
            uint32_t u = KVT_UNIT(l, c);
            uint64_t tb = kvt__geo_token_bytes(g, l, c);
            map->token_stride[u] = tb;
            if (mem->page_strides) {
                map->base[u] = mem->layer_bases[u];
                map->stride[u] = mem->page_strides[u];
                if (mem->token_strides) map->token_stride[u] = mem->token_strides[u];
            } else if (g->layout == KVT_LAYOUT_PAGE_FIRST) {
                map->base[u] = (uint8_t *)mem->base + g->unit_prefix[u] * g->tokens_per_page;
                map->stride[u] = page_bytes;
            } else {
                map->base[u] = mem->layer_bases[u];
                map->stride[u] = tb * g->tokens_per_page;
            }
        }
    }
}

/* a * b + c, or false when it overflows 64 bits. */
static bool mul_add(uint64_t a, uint64_t b, uint64_t c, uint64_t *out)
{
    return !__builtin_mul_overflow(a, b, out) && !__builtin_add_overflow(*out, c, out);
}

/* One unit of strided engine memory: its base, strides that do not make
 * tokens overlap, an extent that fits 64 bits and buffer_bytes[u]. */
static kvt_status check_strided_unit(const kvt_geometry *g, const kvt_engine_memory *mem,
                                     uint32_t l, uint32_t c, const char *fn)
{
    uint32_t u = KVT_UNIT(l, c);
    const char *name = comp_name(g, l, c);
    uint64_t tb = kvt__geo_token_bytes(g, l, c);
    uint64_t ps = mem->page_strides[u], ts = mem->token_strides ? mem->token_strides[u] : tb;
    KVT_CHECK_ARG(mem->layer_bases[u] != NULL, "%s: layer_bases[%u] (layer %u %s) is NULL", fn, u,
                  l, name);
    KVT_CHECK_ARG(g->tokens_per_page == 1 || ts >= tb, "%s: token_strides[%u] (layer %u %s) is %llu, "
                  "less than its %llu bytes per token (strides are in bytes)", fn, u, l, name,
                  (unsigned long long)ts, (unsigned long long)tb);
    KVT_CHECK_ARG(mem->num_pages == 1 || ps >= tb, "%s: page_strides[%u] (layer %u %s) is %llu, "
                  "less than its %llu bytes per token (strides are in bytes)", fn, u, l, name,
                  (unsigned long long)ps, (unsigned long long)tb);
    uint64_t page_end, need;
    KVT_CHECK_ARG(mul_add(g->tokens_per_page - 1, ts, tb, &page_end) &&
                  mul_add(mem->num_pages - 1, ps, page_end, &need),
                  "%s: layer %u %s: %u pages at stride %llu overflow 64 bits", fn, l, name,
                  mem->num_pages, (unsigned long long)ps);
    if (mem->buffer_bytes && mem->buffer_bytes[u] < need)
        return kvt__fail(KVT_EGEOMETRY, "%s: buffer_bytes[%u] (layer %u %s) is %llu but %u pages "
                         "at page stride %llu and token stride %llu reach %llu bytes", fn, u, l,
                         name, (unsigned long long)mem->buffer_bytes[u], mem->num_pages,
                         (unsigned long long)ps, (unsigned long long)ts, (unsigned long long)need);
    return KVT_OK;
}

static kvt_status check_strided(const kvt_geometry *g, const kvt_engine_memory *mem, const char *fn)
{
    KVT_CHECK_ARG(mem->layer_bases != NULL, "%s: layer_bases is NULL (strided buffers need it)", fn);
    for (uint32_t l = 0; l < g->num_layers; l++)
        for (uint32_t c = 0; c < kvt__geo_ncomp(g, l); c++) {
            kvt_status st = check_strided_unit(g, mem, l, c, fn);
            if (st) return st;
        }
    return KVT_OK;
}

/* LAYER_FIRST or PAGE_FIRST buffers: present, and as large as buffer_bytes
 * says they must be. */
static kvt_status check_layout(const kvt_geometry *g, const kvt_engine_memory *mem, const char *fn)
{
    uint64_t page_bytes = kvt__geo_bytes_per_token(g) * g->tokens_per_page;
    for (uint32_t l = 0; l < g->num_layers; l++) {
        for (uint32_t c = 0; c < kvt__geo_ncomp(g, l); c++) {
            uint32_t u = KVT_UNIT(l, c);
            if (g->layout == KVT_LAYOUT_PAGE_FIRST) {
                KVT_CHECK_ARG(mem->base != NULL, "%s: base is NULL (page-first layout needs it)", fn);
                uint64_t need = page_bytes * mem->num_pages;
                if (mem->buffer_bytes && mem->buffer_bytes[0] < need)
                    return kvt__fail(KVT_EGEOMETRY, "%s: buffer_bytes[0] is %llu but %u pages of "
                                     "%llu bytes need %llu", fn,
                                     (unsigned long long)mem->buffer_bytes[0], mem->num_pages,
                                     (unsigned long long)page_bytes, (unsigned long long)need);
            } else {
                KVT_CHECK_ARG(mem->layer_bases != NULL,
                              "%s: layer_bases is NULL (layer-first layout needs it)", fn);
                KVT_CHECK_ARG(mem->layer_bases[u] != NULL, "%s: layer_bases[%u] (layer %u %s) is NULL",
                              fn, u, l, comp_name(g, l, c));
                uint64_t stride = kvt__geo_token_bytes(g, l, c) * g->tokens_per_page;
                uint64_t need = stride * mem->num_pages;
                if (mem->buffer_bytes && mem->buffer_bytes[u] < need)
                    return kvt__fail(KVT_EGEOMETRY, "%s: buffer_bytes[%u] (layer %u %s) is %llu "
                                     "but %u pages of %llu bytes need %llu", fn, u, l,
                                     comp_name(g, l, c), (unsigned long long)mem->buffer_bytes[u],
                                     mem->num_pages, (unsigned long long)stride,
                                     (unsigned long long)need);
            }
        }
    }
    return KVT_OK;
}

kvt_status kvt__page_map_init_fn(kvt_page_map *map, const kvt_geometry *g,
                                 const kvt_engine_memory *mem, const char *fn)
{
    KVT_CHECK_ARG(mem->num_pages > 0, "%s: num_pages is 0", fn);
    KVT_CHECK_ARG(mem->kind == KVT_MEMORY_HOST || mem->kind == KVT_MEMORY_CUDA,
                  "%s: kind is %d (KVT_MEMORY_HOST or KVT_MEMORY_CUDA)", fn, (int)mem->kind);
    if (mem->kind != KVT_MEMORY_HOST)
        return kvt__fail(KVT_EUNSUPPORTED, "%s: CUDA device memory is not supported here yet "
                         "(kvt_cache_register_memory and kvt_client_register_memory take it; docs/gpu.md)", fn);
    KVT_CHECK_ARG(mem->page_strides || !mem->token_strides,
                  "%s: token_strides is set but page_strides is NULL (strided buffers need both)", fn);
    kvt_status st = mem->page_strides ? check_strided(g, mem, fn) : check_layout(g, mem, fn);
    if (st) return st;
    kvt__page_map_fill(map, g, mem);
    return KVT_OK;
}
