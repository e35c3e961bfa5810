/* presets.c - kvt_geometry_preset: the KV geometry of a few known models,
 * as one tensor-parallel rank holds it. Presets use the layer-first layout
 * (vLLM and SGLang keep one buffer per layer and component). */
#include "layout/layout.h"

#include <stdio.h>
#include <string.h>
#include "util/err.h"

#define BF16_BYTES 2

typedef struct model_preset {
    const char *name;
    uint32_t num_layers;
    uint32_t kv_heads; /* across all ranks */
    uint32_t head_dim;
    bool mla;          /* one latent component, replicated on every rank */
} model_preset;

static const model_preset PRESETS[] = {
    {"llama3-8b", 32, 8, 128, false},
    {"llama3-70b", 80, 8, 128, false},
    /* 512 latent dims + 64 decoupled RoPE dims, one shared "head". */
    {"deepseek-v3", 61, 1, 576, true},
    {"tiny", 4, 2, 64, false},
};

#define NUM_PRESETS (sizeof PRESETS / sizeof PRESETS[0])

static kvt_status fail_unknown(const char *fn, const char *name)
{
    char known[128];
    size_t used = 0;
    known[0] = '\0';
    for (size_t i = 0; i < NUM_PRESETS && used < sizeof known; i++) {
        int n = snprintf(known + used, sizeof known - used, "%s%s", i ? ", " : "",
                         PRESETS[i].name);
        if (n < 0) break;
        used += (size_t)n;
    }
    return kvt__fail(KVT_EINVAL, "%s: unknown model \"%s\" (known: %s)", fn, name, known);
}

/* KV heads one rank holds: heads / tp, or 1 (replicated) when tp is a
 * multiple of heads. */
static kvt_status heads_per_rank(const char *fn, const model_preset *m, uint32_t tp,
                                 uint32_t *out)
{
    if (m->mla) {
        *out = m->kv_heads;
        return KVT_OK;
    }
    if (m->kv_heads % tp == 0) {
        *out = m->kv_heads / tp;
        return KVT_OK;
    }
    if (tp % m->kv_heads == 0) {
        *out = 1;
        return KVT_OK;
    }
    return kvt__fail(KVT_EINVAL,
                     "%s: tp %u does not divide the %u KV heads of %s, nor is it a multiple "
                     "of them", fn, tp, m->kv_heads, m->name);
}

kvt_status kvt_geometry_preset(kvt_geometry **out, const char *name, uint32_t tokens_per_page,
                               uint32_t tp)
{
    static const char fn[] = "kvt_geometry_preset";
    KVT_CHECK_NOT_NULL(out, fn);
    KVT_CHECK_NOT_NULL(name, fn);
    KVT_CHECK_ARG(tp >= 1, "%s: tp is 0 (must be >= 1)", fn);
    const model_preset *m = NULL;
    for (size_t i = 0; i < NUM_PRESETS; i++)
        if (strcmp(PRESETS[i].name, name) == 0) m = &PRESETS[i];
    if (!m) return fail_unknown(fn, name);

    uint32_t heads = 0;
    kvt_status st = heads_per_rank(fn, m, tp, &heads);
    if (st) return st;
    kvt_component_spec c = {.kv_heads = heads, .head_dim = m->head_dim, .elem_size = BF16_BYTES};
    kvt_layer_spec spec = {.num_components = m->mla ? 1 : 2, .component = {c, c}};
    if (m->mla) memset(&spec.component[1], 0, sizeof spec.component[1]);

    kvt_geometry *g = NULL;
    st = kvt_geometry_create(&g, m->num_layers, tokens_per_page, KVT_LAYOUT_LAYER_FIRST);
    if (st) {
        /* Keep create's reason, but say which call it was. */
        char why[KVT_ERRMSG_MAX];
        snprintf(why, sizeof why, "%s", kvt_last_error());
        return kvt__fail(st, "%s: %s", fn, why);
    }
    st = kvt_geometry_set_layers(g, 0, m->num_layers, &spec);
    if (st) {
        kvt_geometry_destroy(g);
        return st;
    }
    *out = g;
    return KVT_OK;
}
