/* test_layout.c - KV geometry: creation, layer specs, derived sizes,
 * digests and comparison, presets, and the engine page map. */
#include "support.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "layout/layout.h"

#define assert_error_has(text)                                                  \
    do {                                                                        \
        if (!strstr(kvt_last_error(), (text)))                                  \
            fail_msg("last error \"%s\" lacks \"%s\"", kvt_last_error(), text); \
    } while (0)

static const kvt_layer_spec KV_8x128 = {
    .num_components = 2, .component = {{8, 128, 2}, {8, 128, 2}}};
static const kvt_layer_spec MLA_576 = {.num_components = 1, .component = {{1, 576, 2}}};
/* K and V differ (some hybrid and quantised models). */
static const kvt_layer_spec KV_MIXED = {
    .num_components = 2, .component = {{4, 64, 1}, {4, 128, 4}}};

static kvt_geometry *new_geometry(uint32_t layers, uint32_t tpp, kvt_layout layout)
{
    kvt_geometry *g = NULL;
    assert_ok(kvt_geometry_create(&g, layers, tpp, layout));
    assert_non_null(g);
    return g;
}

/* Layer 0: K/V 8x128 bf16, layer 1: MLA 576 bf16, layer 2: mixed K/V. */
static kvt_geometry *hybrid_geometry(uint32_t tpp, kvt_layout layout)
{
    kvt_geometry *g = new_geometry(3, tpp, layout);
    assert_ok(kvt_geometry_set_layer(g, 0, &KV_8x128));
    assert_ok(kvt_geometry_set_layer(g, 1, &MLA_576));
    assert_ok(kvt_geometry_set_layer(g, 2, &KV_MIXED));
    return g;
}

static kvt_geometry_info info_of(const kvt_geometry *g)
{
    kvt_geometry_info info;
    memset(&info, 0, sizeof info);
    assert_ok(kvt_geometry_info_get(g, &info));
    return info;
}

/* ------------------------------------------------------------------ */

static void test_create_bounds(void **state)
{
    (void)state;
    kvt_geometry *g = (kvt_geometry *)0x1;
    assert_status(kvt_geometry_create(NULL, 4, 16, KVT_LAYOUT_LAYER_FIRST), KVT_EINVAL);
    assert_error_has("kvt_geometry_create: out is NULL");
    assert_status(kvt_geometry_create(&g, 0, 16, KVT_LAYOUT_LAYER_FIRST), KVT_EINVAL);
    assert_error_has("num_layers is 0 (must be 1..1024)");
    assert_status(kvt_geometry_create(&g, KVT_MAX_LAYERS + 1, 16, KVT_LAYOUT_LAYER_FIRST),
                  KVT_EINVAL);
    assert_error_has("num_layers is 1025");
    assert_status(kvt_geometry_create(&g, 4, 0, KVT_LAYOUT_LAYER_FIRST), KVT_EINVAL);
    assert_error_has("tokens_per_page is 0");
    assert_status(kvt_geometry_create(&g, 4, 65537, KVT_LAYOUT_PAGE_FIRST), KVT_EINVAL);
    assert_error_has("tokens_per_page is 65537");
    assert_status(kvt_geometry_create(&g, 4, 16, (kvt_layout)2), KVT_EINVAL);
    assert_error_has("layout 2");
    assert_ptr_equal(g, (kvt_geometry *)0x1); /* untouched on failure */

    g = new_geometry(1, 1, KVT_LAYOUT_LAYER_FIRST);
    kvt_geometry_destroy(g);
    g = new_geometry(KVT_MAX_LAYERS, 65536, KVT_LAYOUT_PAGE_FIRST);
    kvt_geometry_destroy(g);
    kvt_geometry_destroy(NULL); /* no-op */
}

static void test_set_layer_messages(void **state)
{
    (void)state;
    kvt_geometry *g = new_geometry(8, 16, KVT_LAYOUT_LAYER_FIRST);
    kvt_layer_spec s = KV_8x128;

    s.component[1].head_dim = 0;
    assert_status(kvt_geometry_set_layer(g, 3, &s), KVT_EINVAL);
    assert_error_has("kvt_geometry_set_layer: layer 3 V: head_dim is 0");
    s = KV_8x128;
    s.component[0].kv_heads = 0;
    assert_status(kvt_geometry_set_layer(g, 3, &s), KVT_EINVAL);
    assert_error_has("layer 3 K: kv_heads is 0");
    s = KV_8x128;
    s.component[0].kv_heads = 4097;
    assert_status(kvt_geometry_set_layer(g, 5, &s), KVT_EINVAL);
    assert_error_has("layer 5 K: kv_heads is 4097");
    s = KV_8x128;
    s.component[1].head_dim = 65537;
    assert_status(kvt_geometry_set_layer(g, 5, &s), KVT_EINVAL);
    assert_error_has("layer 5 V: head_dim is 65537");
    s = KV_8x128;
    s.component[1].elem_size = 3;
    assert_status(kvt_geometry_set_layer(g, 0, &s), KVT_EINVAL);
    assert_error_has("layer 0 V: elem_size is 3 (must be 1, 2, 4 or 8)");
    s = KV_8x128;
    s.component[0].elem_size = 0;
    assert_status(kvt_geometry_set_layer(g, 7, &s), KVT_EINVAL);
    assert_error_has("layer 7 K: elem_size is 0");
    s = MLA_576;
    s.component[0].head_dim = 0;
    assert_status(kvt_geometry_set_layer(g, 2, &s), KVT_EINVAL);
    assert_error_has("layer 2 KV: head_dim is 0");
    s = KV_8x128;
    s.num_components = 0;
    assert_status(kvt_geometry_set_layer(g, 1, &s), KVT_EINVAL);
    assert_error_has("layer 1: num_components is 0 (must be 1 or 2)");
    s.num_components = 3;
    assert_status(kvt_geometry_set_layer(g, 1, &s), KVT_EINVAL);
    assert_error_has("layer 1: num_components is 3");

    assert_status(kvt_geometry_set_layer(g, 8, &KV_8x128), KVT_EINVAL);
    assert_error_has("kvt_geometry_set_layer: layer 8 is out of range (geometry has 8 layers)");
    assert_status(kvt_geometry_set_layer(g, 0, NULL), KVT_EINVAL);
    assert_error_has("kvt_geometry_set_layer: spec is NULL");
    assert_status(kvt_geometry_set_layer(NULL, 0, &KV_8x128), KVT_EINVAL);
    assert_error_has("kvt_geometry_set_layer");

    /* Every accepted element size. */
    static const uint32_t sizes[] = {1, 2, 4, 8};
    for (int i = 0; i < 4; i++) {
        s = KV_8x128;
        s.component[0].elem_size = s.component[1].elem_size = sizes[i];
        assert_ok(kvt_geometry_set_layer(g, 0, &s));
    }
    /* The limits themselves are accepted. */
    s = KV_8x128;
    s.component[0].kv_heads = 4096;
    s.component[1].head_dim = 65536;
    assert_ok(kvt_geometry_set_layer(g, 1, &s));
    kvt_geometry_destroy(g);
}

static void test_set_layers(void **state)
{
    (void)state;
    kvt_geometry *g = new_geometry(4, 16, KVT_LAYOUT_LAYER_FIRST);
    assert_status(kvt_geometry_set_layers(g, 2, 3, &KV_8x128), KVT_EINVAL);
    assert_error_has("kvt_geometry_set_layers: layers [2, 5) are outside the geometry's 4 layers");
    assert_status(kvt_geometry_set_layers(g, 4, 1, &KV_8x128), KVT_EINVAL);
    assert_error_has("layers [4, 5)");
    assert_status(kvt_geometry_set_layers(g, 0, 0, &KV_8x128), KVT_EINVAL);
    assert_status(kvt_geometry_set_layers(g, 1, UINT32_MAX, &KV_8x128), KVT_EINVAL);
    assert_status(kvt_geometry_set_layers(g, 0, 4, NULL), KVT_EINVAL);
    assert_error_has("kvt_geometry_set_layers: spec is NULL");
    assert_status(kvt_geometry_set_layers(NULL, 0, 4, &KV_8x128), KVT_EINVAL);

    kvt_layer_spec bad = KV_8x128;
    bad.component[1].head_dim = 0;
    assert_status(kvt_geometry_set_layers(g, 1, 3, &bad), KVT_EINVAL);
    assert_error_has("kvt_geometry_set_layers: layer 1 V: head_dim is 0");

    /* A failed set changes nothing: layer 2 stays MLA. */
    assert_ok(kvt_geometry_set_layers(g, 0, 4, &MLA_576));
    assert_status(kvt_geometry_set_layers(g, 2, 2, &bad), KVT_EINVAL);
    uint64_t tb = 0;
    assert_ok(kvt_geometry_token_bytes(g, 2, 0, &tb));
    assert_int_equal(tb, 576 * 2);

    /* Later calls override earlier ones, one range at a time. */
    assert_ok(kvt_geometry_set_layers(g, 1, 2, &KV_8x128));
    assert_int_equal(info_of(g).bytes_per_token, 2 * 1152 + 2 * 4096);
    kvt_geometry_destroy(g);
}

static void test_validate_unset(void **state)
{
    (void)state;
    kvt_geometry *g = new_geometry(4, 16, KVT_LAYOUT_LAYER_FIRST);
    assert_status(kvt_geometry_validate(g), KVT_EINVAL);
    assert_error_has("layer 0 is not described");
    assert_ok(kvt_geometry_set_layers(g, 0, 2, &KV_8x128));
    assert_ok(kvt_geometry_set_layer(g, 3, &KV_8x128));
    assert_status(kvt_geometry_validate(g), KVT_EINVAL);
    assert_error_has("kvt_geometry_validate: layer 2 is not described");
    kvt_geometry_info info = {.num_layers = 77};
    assert_status(kvt_geometry_info_get(g, &info), KVT_EINVAL);
    assert_error_has("layer 2 is not described");
    assert_int_equal(info.num_layers, 77);
    uint64_t tb = 99;
    assert_status(kvt_geometry_token_bytes(g, 2, 0, &tb), KVT_EINVAL);
    assert_error_has("layer 2 is not described");
    assert_int_equal(tb, 99);
    assert_ok(kvt_geometry_set_layer(g, 2, &KV_8x128));
    assert_ok(kvt_geometry_validate(g));
    assert_status(kvt_geometry_validate(NULL), KVT_EINVAL);
    kvt_geometry_destroy(g);
}

static void test_page_size_limit(void **state)
{
    (void)state;
    /* The largest component: 4096 heads x 65536 x 8 bytes = 2 GiB a token. */
    kvt_layer_spec huge = {.num_components = 2,
                           .component = {{4096, 65536, 8}, {4096, 65536, 8}}};
    kvt_geometry *g = new_geometry(1, 256, KVT_LAYOUT_PAGE_FIRST);
    assert_ok(kvt_geometry_set_layer(g, 0, &huge));
    assert_int_equal(info_of(g).bytes_per_page, 1ull << 40); /* exactly 1 TiB */
    kvt_geometry_destroy(g);
    g = new_geometry(1, 257, KVT_LAYOUT_PAGE_FIRST);
    assert_ok(kvt_geometry_set_layer(g, 0, &huge));
    assert_status(kvt_geometry_validate(g), KVT_EINVAL);
    assert_error_has("a page would hold");
    kvt_geometry_destroy(g);
}

static void test_info_uniform(void **state)
{
    (void)state;
    kvt_geometry *g = kvt_test_geometry(4, 2, 64, 16, KVT_LAYOUT_PAGE_FIRST);
    assert_non_null(g);
    kvt_geometry_info info = info_of(g);
    assert_int_equal(info.num_layers, 4);
    assert_int_equal(info.tokens_per_page, 16);
    assert_int_equal(info.layout, KVT_LAYOUT_PAGE_FIRST);
    assert_int_equal(info.bytes_per_token, 4 * 2 * 2 * 64 * 2);
    assert_int_equal(info.bytes_per_page, 2048 * 16);
    for (uint32_t l = 0; l < 4; l++) {
        for (uint32_t c = 0; c < 2; c++) {
            uint64_t tb = 0;
            assert_ok(kvt_geometry_token_bytes(g, l, c, &tb));
            assert_int_equal(tb, 256);
        }
    }
    kvt_geometry_info none;
    assert_status(kvt_geometry_info_get(g, NULL), KVT_EINVAL);
    assert_status(kvt_geometry_info_get(NULL, &none), KVT_EINVAL);
    kvt_geometry_destroy(g);
}

static void test_info_mla(void **state)
{
    (void)state;
    kvt_geometry *g = new_geometry(61, 64, KVT_LAYOUT_LAYER_FIRST);
    assert_ok(kvt_geometry_set_layers(g, 0, 61, &MLA_576));
    kvt_geometry_info info = info_of(g);
    assert_int_equal(info.bytes_per_token, 61 * 576 * 2);
    assert_int_equal(info.bytes_per_page, 61 * 576 * 2 * 64);
    uint64_t tb = 0;
    assert_ok(kvt_geometry_token_bytes(g, 60, 0, &tb));
    assert_int_equal(tb, 1152);
    assert_status(kvt_geometry_token_bytes(g, 60, 1, &tb), KVT_EINVAL);
    assert_error_has("layer 60 has no component 1");
    assert_int_equal(kvt__geo_token_bytes(g, 60, 1), 0); /* absent: 0 bytes */
    kvt_geometry_destroy(g);
}

static void test_info_hybrid(void **state)
{
    (void)state;
    kvt_geometry *g = hybrid_geometry(16, KVT_LAYOUT_LAYER_FIRST);
    /* layer 0: 2 x 2048; layer 1: 1152; layer 2: K 256 + V 2048. */
    static const uint64_t want[3][2] = {{2048, 2048}, {1152, 0}, {256, 2048}};
    kvt_geometry_info info = info_of(g);
    assert_int_equal(info.bytes_per_token, 4096 + 1152 + 2304);
    assert_int_equal(info.bytes_per_page, (4096 + 1152 + 2304) * 16);
    uint64_t prefix = 0;
    for (uint32_t l = 0; l < 3; l++) {
        uint32_t nc = l == 1 ? 1 : 2;
        for (uint32_t c = 0; c < nc; c++) {
            uint64_t tb = 0;
            assert_ok(kvt_geometry_token_bytes(g, l, c, &tb));
            assert_int_equal(tb, want[l][c]);
            /* Cache blocks are layer-major: unit (l, c) starts after all before it. */
            assert_int_equal(kvt__geo_block_offset(g, 32, l, c), 32 * prefix);
            prefix += tb;
        }
        assert_int_equal(kvt__geo_layer_token_bytes(g, l), want[l][0] + want[l][1]);
    }
    assert_int_equal(kvt__geo_bytes_per_token(g), prefix);
    uint64_t tb = 0;
    assert_status(kvt_geometry_token_bytes(g, 3, 0, &tb), KVT_EINVAL);
    assert_error_has("layer 3 is out of range (3 layers)");
    assert_status(kvt_geometry_token_bytes(NULL, 0, 0, &tb), KVT_EINVAL);
    assert_status(kvt_geometry_token_bytes(g, 0, 0, NULL), KVT_EINVAL);
    kvt_geometry_destroy(g);
}

/* ------------------------------------------------------------------ */
/* Digest and compare                                                 */
/* ------------------------------------------------------------------ */

typedef void (*mutate_fn)(kvt_geometry **g);

static void mut_layers(kvt_geometry **g)
{
    kvt_geometry_destroy(*g);
    *g = new_geometry(7, 16, KVT_LAYOUT_LAYER_FIRST);
    assert_ok(kvt_geometry_set_layers(*g, 0, 7, &KV_8x128));
}
static void mut_tpp(kvt_geometry **g)
{
    kvt_geometry_destroy(*g);
    *g = new_geometry(6, 32, KVT_LAYOUT_LAYER_FIRST);
    assert_ok(kvt_geometry_set_layers(*g, 0, 6, &KV_8x128));
}
static void mut_layout(kvt_geometry **g)
{
    kvt_geometry_destroy(*g);
    *g = new_geometry(6, 16, KVT_LAYOUT_PAGE_FIRST);
    assert_ok(kvt_geometry_set_layers(*g, 0, 6, &KV_8x128));
}
static void set5(kvt_geometry **g, kvt_layer_spec s) { assert_ok(kvt_geometry_set_layer(*g, 5, &s)); }
static void mut_ncomp(kvt_geometry **g)
{
    kvt_layer_spec s = KV_8x128;
    s.num_components = 1;
    set5(g, s);
}
static void mut_k_heads(kvt_geometry **g)
{
    kvt_layer_spec s = KV_8x128;
    s.component[0].kv_heads = 4;
    set5(g, s);
}
static void mut_k_dim(kvt_geometry **g)
{
    kvt_layer_spec s = KV_8x128;
    s.component[0].head_dim = 64;
    set5(g, s);
}
static void mut_k_elem(kvt_geometry **g)
{
    kvt_layer_spec s = KV_8x128;
    s.component[0].elem_size = 1;
    set5(g, s);
}
static void mut_v_heads(kvt_geometry **g)
{
    kvt_layer_spec s = KV_8x128;
    s.component[1].kv_heads = 4;
    set5(g, s);
}
static void mut_v_dim(kvt_geometry **g)
{
    kvt_layer_spec s = KV_8x128;
    s.component[1].head_dim = 256;
    set5(g, s);
}
static void mut_v_elem(kvt_geometry **g)
{
    kvt_layer_spec s = KV_8x128;
    s.component[1].elem_size = 4;
    set5(g, s);
}
/* Same bytes per token, different shape: heads and dim swapped. */
static void mut_same_bytes(kvt_geometry **g)
{
    kvt_layer_spec s = KV_8x128;
    s.component[0].kv_heads = 16;
    s.component[0].head_dim = 64;
    set5(g, s);
}

static kvt_geometry *six_layers(void)
{
    kvt_geometry *g = new_geometry(6, 16, KVT_LAYOUT_LAYER_FIRST);
    assert_ok(kvt_geometry_set_layers(g, 0, 6, &KV_8x128));
    return g;
}

static void test_digest_and_compare(void **state)
{
    (void)state;
    kvt_geometry *a = six_layers(), *b = six_layers();
    assert_true(info_of(a).digest == info_of(b).digest);
    assert_ok(kvt_geometry_compare(a, b));
    kvt_geometry_destroy(b);

    static const struct { mutate_fn fn; const char *msg; } cases[] = {
        {mut_layers, "num_layers 6 vs 7"},
        {mut_tpp, "tokens_per_page 16 vs 32"},
        {mut_layout, "layout layer-first vs page-first"},
        {mut_ncomp, "layer 5: num_components 2 vs 1"},
        {mut_k_heads, "layer 5 K: kv_heads 8 vs 4"},
        {mut_k_dim, "layer 5 K: head_dim 128 vs 64"},
        {mut_k_elem, "layer 5 K: elem_size 2 vs 1"},
        {mut_v_heads, "layer 5 V: kv_heads 8 vs 4"},
        {mut_v_dim, "layer 5 V: head_dim 128 vs 256"},
        {mut_v_elem, "layer 5 V: elem_size 2 vs 4"},
        {mut_same_bytes, "layer 5 K: kv_heads 8 vs 16"},
    };
    uint64_t da = info_of(a).digest;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        b = six_layers();
        cases[i].fn(&b);
        if (info_of(b).digest == da) fail_msg("case %zu (%s): digests equal", i, cases[i].msg);
        assert_status(kvt_geometry_compare(a, b), KVT_EGEOMETRY);
        assert_error_has(cases[i].msg);
        kvt_geometry_destroy(b);
    }

    /* A layer described on one side only. */
    kvt_geometry *c = new_geometry(6, 16, KVT_LAYOUT_LAYER_FIRST);
    assert_ok(kvt_geometry_set_layers(c, 0, 5, &KV_8x128));
    assert_status(kvt_geometry_compare(a, c), KVT_EGEOMETRY);
    assert_error_has("layer 5: described yes vs no");
    kvt_geometry_destroy(c);

    assert_status(kvt_geometry_compare(a, NULL), KVT_EINVAL);
    assert_status(kvt_geometry_compare(NULL, a), KVT_EINVAL);
    kvt_geometry_destroy(a);
}

static void test_digest_canonical(void **state)
{
    (void)state;
    /* An MLA spec with junk in the unused V slot describes the same layer. */
    kvt_layer_spec junk = MLA_576;
    junk.component[1] = (kvt_component_spec){.kv_heads = 9, .head_dim = 9, .elem_size = 9};
    kvt_geometry *a = new_geometry(2, 16, KVT_LAYOUT_LAYER_FIRST);
    kvt_geometry *b = new_geometry(2, 16, KVT_LAYOUT_LAYER_FIRST);
    assert_ok(kvt_geometry_set_layers(a, 0, 2, &MLA_576));
    assert_ok(kvt_geometry_set_layers(b, 0, 2, &junk));
    assert_true(info_of(a).digest == info_of(b).digest);
    assert_ok(kvt_geometry_compare(a, b));
    /* Built layer by layer or all at once: the same geometry. */
    kvt_geometry *c = hybrid_geometry(16, KVT_LAYOUT_LAYER_FIRST);
    kvt_geometry *d = new_geometry(3, 16, KVT_LAYOUT_LAYER_FIRST);
    assert_ok(kvt_geometry_set_layers(d, 0, 3, &KV_MIXED));
    assert_ok(kvt_geometry_set_layer(d, 1, &MLA_576));
    assert_ok(kvt_geometry_set_layer(d, 0, &KV_8x128));
    assert_true(info_of(c).digest == info_of(d).digest);
    assert_ok(kvt_geometry_compare(c, d));
    kvt_geometry_destroy(a);
    kvt_geometry_destroy(b);
    kvt_geometry_destroy(c);
    kvt_geometry_destroy(d);
}

static void test_clone(void **state)
{
    (void)state;
    kvt_geometry *g = hybrid_geometry(16, KVT_LAYOUT_PAGE_FIRST);
    kvt_geometry *c = NULL;
    assert_ok(kvt_geometry_clone(g, &c));
    assert_non_null(c);
    assert_ptr_not_equal(c, g);
    assert_ok(kvt_geometry_compare(g, c));
    kvt_geometry_info gi = info_of(g), ci = info_of(c);
    assert_true(gi.digest == ci.digest);
    assert_int_equal(gi.bytes_per_page, ci.bytes_per_page);
    /* A deep copy: changing the clone leaves the original alone. */
    assert_ok(kvt_geometry_set_layer(c, 1, &KV_8x128));
    assert_status(kvt_geometry_compare(g, c), KVT_EGEOMETRY);
    assert_true(info_of(g).digest == gi.digest);
    assert_int_equal(info_of(g).bytes_per_token, gi.bytes_per_token);
    kvt_geometry_destroy(c);
    /* An incomplete geometry clones as incomplete. */
    kvt_geometry *p = new_geometry(3, 8, KVT_LAYOUT_LAYER_FIRST);
    assert_ok(kvt_geometry_set_layer(p, 1, &MLA_576));
    assert_ok(kvt_geometry_clone(p, &c));
    assert_ok(kvt_geometry_compare(p, c));
    assert_status(kvt_geometry_validate(c), KVT_EINVAL);
    kvt_geometry_destroy(c);
    kvt_geometry_destroy(p);

    c = (kvt_geometry *)0x1;
    assert_status(kvt_geometry_clone(NULL, &c), KVT_EINVAL);
    assert_error_has("kvt_geometry_clone");
    assert_ptr_equal(c, (kvt_geometry *)0x1);
    assert_status(kvt_geometry_clone(g, NULL), KVT_EINVAL);
    kvt_geometry_destroy(g);
}

/* ------------------------------------------------------------------ */
/* Presets                                                            */
/* ------------------------------------------------------------------ */

static void check_preset(const char *name, uint32_t tp, uint32_t layers, uint32_t ncomp,
                         uint32_t heads, uint32_t dim)
{
    kvt_geometry *g = NULL;
    assert_ok(kvt_geometry_preset(&g, name, 16, tp));
    assert_non_null(g);
    kvt_geometry_info info = info_of(g);
    assert_int_equal(info.num_layers, layers);
    assert_int_equal(info.tokens_per_page, 16);
    assert_int_equal(info.layout, KVT_LAYOUT_LAYER_FIRST);
    assert_int_equal(info.bytes_per_token, (uint64_t)layers * ncomp * heads * dim * 2);
    /* It equals the geometry written out by hand. */
    kvt_geometry *h = new_geometry(layers, 16, KVT_LAYOUT_LAYER_FIRST);
    kvt_layer_spec s = {.num_components = ncomp,
                        .component = {{heads, dim, 2}, {heads, dim, 2}}};
    assert_ok(kvt_geometry_set_layers(h, 0, layers, &s));
    assert_ok(kvt_geometry_compare(g, h));
    assert_true(info_of(h).digest == info.digest);
    kvt_geometry_destroy(h);
    kvt_geometry_destroy(g);
}

static void test_presets(void **state)
{
    (void)state;
    check_preset("llama3-8b", 1, 32, 2, 8, 128);
    check_preset("llama3-8b", 2, 32, 2, 4, 128);
    check_preset("llama3-8b", 8, 32, 2, 1, 128);
    check_preset("llama3-8b", 16, 32, 2, 1, 128); /* replicated heads */
    check_preset("llama3-70b", 1, 80, 2, 8, 128);
    check_preset("llama3-70b", 4, 80, 2, 2, 128);
    check_preset("deepseek-v3", 1, 61, 1, 1, 576);
    check_preset("deepseek-v3", 8, 61, 1, 1, 576); /* MLA: replicated */
    check_preset("deepseek-v3", 3, 61, 1, 1, 576);
    check_preset("tiny", 1, 4, 2, 2, 64);
    check_preset("tiny", 2, 4, 2, 1, 64);
    check_preset("tiny", 4, 4, 2, 1, 64);

    kvt_geometry *g = (kvt_geometry *)0x1;
    assert_status(kvt_geometry_preset(&g, "llama3-8b", 16, 3), KVT_EINVAL);
    assert_error_has("kvt_geometry_preset: tp 3 does not divide the 8 KV heads of llama3-8b");
    assert_status(kvt_geometry_preset(&g, "llama3-70b", 16, 12), KVT_EINVAL);
    assert_error_has("tp 12");
    assert_status(kvt_geometry_preset(&g, "tiny", 16, 3), KVT_EINVAL);
    assert_error_has("tp 3 does not divide the 2 KV heads of tiny");
    assert_status(kvt_geometry_preset(&g, "tiny", 16, 0), KVT_EINVAL);
    assert_error_has("kvt_geometry_preset: tp is 0");
    assert_status(kvt_geometry_preset(&g, "deepseek-v3", 16, 0), KVT_EINVAL);
    assert_status(kvt_geometry_preset(&g, "llama2-7b", 16, 1), KVT_EINVAL);
    assert_error_has("kvt_geometry_preset: unknown model \"llama2-7b\" "
                     "(known: llama3-8b, llama3-70b, deepseek-v3, tiny)");
    assert_status(kvt_geometry_preset(&g, "Tiny", 16, 1), KVT_EINVAL);
    assert_status(kvt_geometry_preset(&g, "tiny", 0, 1), KVT_EINVAL);
    assert_error_has("kvt_geometry_preset");
    assert_error_has("tokens_per_page is 0");
    assert_status(kvt_geometry_preset(&g, NULL, 16, 1), KVT_EINVAL);
    assert_error_has("kvt_geometry_preset: name is NULL");
    assert_ptr_equal(g, (kvt_geometry *)0x1);
    assert_status(kvt_geometry_preset(NULL, "tiny", 16, 1), KVT_EINVAL);
    assert_error_has("kvt_geometry_preset: out is NULL");
}

/* ------------------------------------------------------------------ */
/* Page map                                                           */
/* ------------------------------------------------------------------ */

static void test_page_map_layer_first(void **state)
{
    (void)state;
    kvt_geometry *g = hybrid_geometry(16, KVT_LAYOUT_LAYER_FIRST);
    enum { PAGES = 5, UNITS = 3 * KVT_MAX_COMPONENTS };
    void *bufs[UNITS] = {NULL};
    for (uint32_t l = 0; l < 3; l++)
        for (uint32_t c = 0; c < kvt__geo_ncomp(g, l); c++)
            bufs[KVT_UNIT(l, c)] = malloc(kvt__geo_token_bytes(g, l, c) * 16 * PAGES);
    kvt_engine_memory mem = {.num_pages = PAGES, .layer_bases = bufs};
    kvt_page_map *map = malloc(sizeof *map);
    assert_non_null(map);
    assert_ok(kvt__page_map_init(map, g, &mem)); /* MLA's unused V slot may be NULL */
    assert_int_equal(map->num_pages, PAGES);
    for (uint32_t l = 0; l < 3; l++) {
        for (uint32_t c = 0; c < kvt__geo_ncomp(g, l); c++) {
            uint32_t u = KVT_UNIT(l, c);
            uint64_t page = kvt__geo_token_bytes(g, l, c) * 16;
            assert_ptr_equal(map->base[u], bufs[u]);
            assert_int_equal(map->stride[u], page);
            assert_ptr_equal(kvt__page_addr(map, u, 3), (uint8_t *)bufs[u] + 3 * page);
        }
    }
    /* A missing buffer is named by index, layer and component. */
    void *saved = bufs[5];
    bufs[5] = NULL;
    assert_status(kvt__page_map_init(map, g, &mem), KVT_EINVAL);
    assert_error_has("layer_bases[5] (layer 2 V) is NULL");
    bufs[5] = saved;
    saved = bufs[2];
    bufs[2] = NULL;
    assert_status(kvt__page_map_init(map, g, &mem), KVT_EINVAL);
    assert_error_has("layer_bases[2] (layer 1 KV) is NULL");
    bufs[2] = saved;
    kvt_engine_memory none = {.num_pages = PAGES};
    assert_status(kvt__page_map_init(map, g, &none), KVT_EINVAL);
    assert_error_has("layer_bases is NULL (layer-first layout needs it)");
    kvt_engine_memory empty = {.num_pages = 0, .layer_bases = bufs};
    assert_status(kvt__page_map_init(map, g, &empty), KVT_EINVAL);
    assert_error_has("num_pages is 0");
    for (int u = 0; u < UNITS; u++) free(bufs[u]);
    free(map);
    kvt_geometry_destroy(g);
}

static void test_page_map_page_first(void **state)
{
    (void)state;
    kvt_geometry *g = hybrid_geometry(8, KVT_LAYOUT_PAGE_FIRST);
    enum { PAGES = 4 };
    uint64_t page = info_of(g).bytes_per_page;
    uint8_t *base = malloc(page * PAGES);
    assert_non_null(base);
    kvt_engine_memory mem = {.num_pages = PAGES, .base = base};
    kvt_page_map *map = malloc(sizeof *map);
    assert_non_null(map);
    assert_ok(kvt__page_map_init(map, g, &mem));
    /* Within a page: layer 0 K, layer 0 V, layer 1 KV, layer 2 K, layer 2 V,
     * each tokens_per_page tokens, back to back, filling the page. */
    uint64_t off = 0;
    for (uint32_t l = 0; l < 3; l++) {
        for (uint32_t c = 0; c < kvt__geo_ncomp(g, l); c++) {
            uint32_t u = KVT_UNIT(l, c);
            assert_ptr_equal(map->base[u], base + off);
            assert_int_equal(map->stride[u], page);
            assert_ptr_equal(kvt__page_addr(map, u, 2), base + 2 * page + off);
            off += kvt__geo_token_bytes(g, l, c) * 8;
        }
    }
    assert_int_equal(off, page);
    kvt_engine_memory none = {.num_pages = PAGES};
    assert_status(kvt__page_map_init(map, g, &none), KVT_EINVAL);
    assert_error_has("base is NULL (page-first layout needs it)");
    free(map);
    free(base);
    kvt_geometry_destroy(g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_create_bounds),
        cmocka_unit_test(test_set_layer_messages),
        cmocka_unit_test(test_set_layers),
        cmocka_unit_test(test_validate_unset),
        cmocka_unit_test(test_page_size_limit),
        cmocka_unit_test(test_info_uniform),
        cmocka_unit_test(test_info_mla),
        cmocka_unit_test(test_info_hybrid),
        cmocka_unit_test(test_digest_and_compare),
        cmocka_unit_test(test_digest_canonical),
        cmocka_unit_test(test_clone),
        cmocka_unit_test(test_presets),
        cmocka_unit_test(test_page_map_layer_first),
        cmocka_unit_test(test_page_map_page_first),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
