/* emu.c - the emulated engine: paged KV in host memory whose content is a
 * pure function of (namespace, token prefix, layer, component, global head).
 *
 * Each token t gets a prefix key p_t that commits to the namespace and to
 * tokens[0..t]; the bytes of head h in (layer, comp) are a splitmix64 stream
 * seeded from (p_t, layer, comp, first_head + h). A block stored under the
 * wrong prefix, a wrong layer, a swapped K/V or a shifted head all verify as
 * mismatches. */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "layout/layout.h"
#include "util/err.h"
#include "util/hash.h"

struct kvt_emu {
    kvt_geometry *geo;
    uint32_t num_pages;
    uint32_t first_head;
    kvt_page_map map;
    void *bufs[KVT_MAX_LAYERS * KVT_MAX_COMPONENTS]; /* layer-first buffers */
    void *page_buf;                                  /* page-first buffer */
    void *layer_bases[KVT_MAX_LAYERS * KVT_MAX_COMPONENTS];
    uint64_t buffer_bytes[KVT_MAX_LAYERS * KVT_MAX_COMPONENTS];
};

static inline uint64_t mix64(uint64_t x)
{
    uint64_t s = x;
    return kvt__splitmix64(&s);
}

static uint64_t prefix_root(const kvt_request *req)
{
    return kvt__hash64(req->ns, req->ns ? req->ns_len : 0, 0x656d75ull);
}

static inline uint64_t prefix_next(uint64_t p, uint32_t token)
{
    return mix64(p ^ ((uint64_t)token * 0xff51afd7ed558ccdull + 0x1234567ull));
}

/* Writes the bytes of one token's (layer, comp) for prefix key p. */
static void token_bytes(const kvt_emu *e, uint64_t p, uint32_t layer, uint32_t comp,
                        uint8_t *out)
{
    const kvt_component_spec *cs = &e->geo->layers[layer].component[comp];
    size_t head_bytes = (size_t)cs->head_dim * cs->elem_size;
    for (uint32_t h = 0; h < cs->kv_heads; h++) {
        uint64_t head = e->first_head + h;
        uint64_t st = mix64(p ^ mix64(((uint64_t)layer << 40) ^ ((uint64_t)comp << 32) ^ head));
        uint8_t *dst = out + h * head_bytes;
        size_t i = 0;
        for (; i + 8 <= head_bytes; i += 8) {
            uint64_t v = kvt__splitmix64(&st);
            memcpy(dst + i, &v, 8);
        }
        if (i < head_bytes) {
            uint64_t v = kvt__splitmix64(&st);
            memcpy(dst + i, &v, head_bytes - i);
        }
    }
}

/* Engine KV memory stands in for device memory (2 MiB GPU pages) or an
 * engine's pinned host pool, not for malloc'd memory: a buffer is a
 * zero-filled mapping on a 2 MiB boundary with transparent huge pages
 * advised (over-mapped by 2 MiB and trimmed). With 4 KiB pages each kernel
 * copy of a large transfer walks 512x the page table entries; the PD bench
 * runs ~10% faster and steadier on huge pages on this VM class. Touched
 * lazily, like calloc. A buffer under 2 MiB stays on the heap: with huge
 * pages advised, its first touched byte would fault in a whole 2 MiB page,
 * so a small engine of many layers (tests, demos) would cost 2 MiB a layer
 * and component (test_conc_pd peaked at ~5 GB instead of ~0.1 GB). Under
 * AddressSanitizer the heap is kept, so an overrun past a buffer's end is
 * reported, not absorbed by the 2 MiB rounding. */
#if defined(__SANITIZE_ADDRESS__)
#define EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define EMU_ASAN 1
#endif
#endif
#ifndef EMU_ASAN
#define EMU_ASAN 0
#endif

#define EMU_HUGE (2u << 20)

/* emu_map and emu_unmap decide alike from the size. */
static bool emu_on_heap(uint64_t bytes) { return EMU_ASAN || bytes < EMU_HUGE; }

static size_t emu_map_len(uint64_t bytes) { return (size_t)((bytes + EMU_HUGE - 1) / EMU_HUGE * EMU_HUGE); }

static void *emu_map(uint64_t bytes)
{
    if (emu_on_heap(bytes)) return calloc(1, (size_t)bytes);
    if (bytes > SIZE_MAX - 2 * (uint64_t)EMU_HUGE) return NULL;
    size_t len = emu_map_len(bytes);
    uint8_t *m = mmap(NULL, len + EMU_HUGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return NULL;
    uintptr_t start = ((uintptr_t)m + EMU_HUGE - 1) & ~(uintptr_t)(EMU_HUGE - 1);
    size_t head = start - (uintptr_t)m;
    if (head) munmap(m, head);
    if (EMU_HUGE - head) munmap((uint8_t *)start + len, EMU_HUGE - head);
    (void)madvise((void *)start, len, MADV_HUGEPAGE); /* advice: 4 KiB pages work too */
    return (void *)start;
}

static void emu_unmap(void *p, uint64_t bytes)
{
    if (emu_on_heap(bytes)) free(p);
    else if (p) munmap(p, emu_map_len(bytes));
}

void kvt_emu_destroy(kvt_emu *e)
{
    if (!e) return;
    for (size_t i = 0; i < KVT_MAX_LAYERS * KVT_MAX_COMPONENTS; i++) emu_unmap(e->bufs[i], e->buffer_bytes[i]);
    emu_unmap(e->page_buf, e->buffer_bytes[0]);
    kvt_geometry_destroy(e->geo);
    free(e);
}

static kvt_status alloc_buffers(kvt_emu *e)
{
    const kvt_geometry *g = e->geo;
    if (g->layout == KVT_LAYOUT_PAGE_FIRST) {
        uint64_t bytes = kvt__geo_bytes_per_token(g) * g->tokens_per_page * e->num_pages;
        e->buffer_bytes[0] = bytes;
        e->page_buf = emu_map(bytes);
        if (!e->page_buf) return kvt__fail(KVT_ENOMEM, "kvt_emu_create: %llu bytes", (unsigned long long)bytes);
        return KVT_OK;
    }
    for (uint32_t l = 0; l < g->num_layers; l++) {
        for (uint32_t c = 0; c < kvt__geo_ncomp(g, l); c++) {
            uint64_t bytes = kvt__geo_token_bytes(g, l, c) * g->tokens_per_page * e->num_pages;
            uint32_t u = KVT_UNIT(l, c);
            e->bufs[u] = emu_map(bytes);
            if (!e->bufs[u])
                return kvt__fail(KVT_ENOMEM, "kvt_emu_create: %llu bytes for layer %u", (unsigned long long)bytes, l);
            e->layer_bases[u] = e->bufs[u];
            e->buffer_bytes[u] = bytes;
        }
    }
    return KVT_OK;
}

kvt_status kvt_emu_create(kvt_emu **out, const kvt_geometry *geo, uint32_t num_pages)
{
    KVT_CHECK_NOT_NULL(out, "kvt_emu_create");
    KVT_CHECK_NOT_NULL(geo, "kvt_emu_create");
    KVT_CHECK_ARG(num_pages > 0 && num_pages <= (1u << 24),
                  "kvt_emu_create: num_pages is %u (must be 1..16777216)", num_pages);
    kvt_status st = kvt_geometry_validate(geo);
    if (st) return kvt__wrap_error(st, "kvt_emu_create: geo");
    kvt_emu *e = calloc(1, sizeof *e);
    if (!e) return kvt__fail(KVT_ENOMEM, "kvt_emu_create: out of memory");
    e->num_pages = num_pages;
    st = kvt_geometry_clone(geo, &e->geo);
    if (!st) st = alloc_buffers(e);
    kvt_engine_memory mem;
    if (!st) st = kvt_emu_memory(e, &mem);
    /* the emulator's own buffers, sized from geo: they fit without checking */
    if (!st) kvt__page_map_fill(&e->map, e->geo, &mem);
    if (st) {
        kvt_emu_destroy(e);
        return st;
    }
    *out = e;
    return KVT_OK;
}

kvt_status kvt_emu_set_first_head(kvt_emu *e, uint32_t first_head)
{
    KVT_CHECK_NOT_NULL_AS(e, "emu", "kvt_emu_set_first_head");
    e->first_head = first_head;
    return KVT_OK;
}

kvt_status kvt_emu_memory(kvt_emu *e, kvt_engine_memory *out)
{
    KVT_CHECK_NOT_NULL_AS(e, "emu", "kvt_emu_memory");
    KVT_CHECK_NOT_NULL(out, "kvt_emu_memory");
    kvt_engine_memory m = {.num_pages = e->num_pages, .base = e->page_buf,
                           .layer_bases = e->page_buf ? NULL : e->layer_bases,
                           .buffer_bytes = e->buffer_bytes};
    *out = m;
    return KVT_OK;
}

static kvt_status check_range(const kvt_emu *e, const char *fn, const kvt_request *req,
                              uint32_t first, uint32_t count, const uint32_t *pages,
                              uint32_t num_pages)
{
    KVT_CHECK_NOT_NULL(req, fn);
    KVT_CHECK_ARG(req->tokens != NULL || req->num_tokens == 0, "%s: req->tokens is NULL", fn);
    KVT_CHECK_ARG(req->ns != NULL || req->ns_len == 0, "%s: req->ns is NULL but ns_len is %u", fn,
                  req->ns_len);
    KVT_CHECK_ARG(first <= req->num_tokens && count <= req->num_tokens - first,
                  "%s: tokens [%u, %u) are outside the request's %u tokens", fn, first,
                  first + count, req->num_tokens);
    if (count == 0) return KVT_OK;
    KVT_CHECK_NOT_NULL(pages, fn);
    uint32_t tpp = e->geo->tokens_per_page;
    uint32_t need = (first + count + tpp - 1) / tpp;
    KVT_CHECK_ARG(num_pages >= need, "%s: %u pages cover %u tokens, need %u pages for token %u", fn,
                  num_pages, num_pages * tpp, need, first + count - 1);
    for (uint32_t i = first / tpp; i < need; i++)
        KVT_CHECK_ARG(pages[i] < e->num_pages, "%s: pages[%u] is %u, engine has %u pages", fn, i,
                      pages[i], e->num_pages);
    return KVT_OK;
}

/* Calls fn(e, t, layer, comp, engine address, p_t, arg) for every token of
 * [first, first+count) and every unit; stops early when fn returns false. */
typedef bool (*unit_fn)(const kvt_emu *e, uint32_t t, uint32_t l, uint32_t c, uint8_t *addr,
                        uint64_t p, void *arg);

static void for_each_unit(const kvt_emu *e, const kvt_request *req, uint32_t first,
                          uint32_t count, const uint32_t *pages, unit_fn fn, void *arg)
{
    const kvt_geometry *g = e->geo;
    uint64_t p = prefix_root(req);
    for (uint32_t t = 0; t < first; t++) p = prefix_next(p, req->tokens[t]);
    for (uint32_t t = first; t < first + count; t++) {
        p = prefix_next(p, req->tokens[t]);
        uint32_t page = pages[t / g->tokens_per_page], slot = t % g->tokens_per_page;
        for (uint32_t l = 0; l < g->num_layers; l++) {
            for (uint32_t c = 0; c < kvt__geo_ncomp(g, l); c++) {
                uint8_t *addr = kvt__page_addr(&e->map, KVT_UNIT(l, c), page) +
                                slot * kvt__geo_token_bytes(g, l, c);
                fn(e, t, l, c, addr, p, arg);
            }
        }
    }
}

static bool fill_unit(const kvt_emu *e, uint32_t t, uint32_t l, uint32_t c, uint8_t *addr,
                      uint64_t p, void *arg)
{
    (void)t; (void)arg;
    token_bytes(e, p, l, c, addr);
    return true;
}

kvt_status kvt_emu_fill(kvt_emu *e, const kvt_request *req, uint32_t first, uint32_t count,
                        const uint32_t *pages, uint32_t num_pages)
{
    KVT_CHECK_NOT_NULL_AS(e, "emu", "kvt_emu_fill");
    kvt_status st = check_range(e, "kvt_emu_fill", req, first, count, pages, num_pages);
    if (st || count == 0) return st;
    for_each_unit(e, req, first, count, pages, fill_unit, NULL);
    return KVT_OK;
}

struct verify_ctx {
    kvt_verify_result r;
    uint8_t scratch[1 << 16];
};

static bool verify_unit(const kvt_emu *e, uint32_t t, uint32_t l, uint32_t c, uint8_t *addr,
                        uint64_t p, void *arg)
{
    struct verify_ctx *v = arg;
    uint64_t n = kvt__geo_token_bytes(e->geo, l, c);
    token_bytes(e, p, l, c, v->scratch);
    v->r.bytes_checked += n;
    if (memcmp(addr, v->scratch, n) == 0) return true;
    for (uint64_t i = 0; i < n; i++) {
        if (addr[i] == v->scratch[i]) continue;
        if (v->r.mismatches == 0) {
            v->r.first_bad_token = t;
            v->r.first_bad_layer = l;
        }
        v->r.mismatches++;
    }
    return true;
}

kvt_status kvt_emu_verify(const kvt_emu *e, const kvt_request *req, uint32_t first,
                          uint32_t count, const uint32_t *pages, uint32_t num_pages,
                          kvt_verify_result *out)
{
    KVT_CHECK_NOT_NULL_AS(e, "emu", "kvt_emu_verify");
    KVT_CHECK_NOT_NULL(out, "kvt_emu_verify");
    kvt_status st = check_range(e, "kvt_emu_verify", req, first, count, pages, num_pages);
    if (st) return st;
    for (uint32_t l = 0; l < e->geo->num_layers; l++)
        for (uint32_t c = 0; c < kvt__geo_ncomp(e->geo, l); c++)
            KVT_CHECK_ARG(kvt__geo_token_bytes(e->geo, l, c) <= sizeof ((struct verify_ctx *)0)->scratch,
                          "kvt_emu_verify: layer %u holds more than 64 KiB per token", l);
    struct verify_ctx *v = calloc(1, sizeof *v);
    if (!v) return kvt__fail(KVT_ENOMEM, "kvt_emu_verify: out of memory");
    if (count) for_each_unit(e, req, first, count, pages, verify_unit, v);
    *out = v->r;
    free(v);
    return KVT_OK;
}

kvt_status kvt_emu_token_kv(const kvt_emu *e, const kvt_request *req, uint32_t token,
                            uint32_t layer, uint32_t comp, void *out, size_t len)
{
    static const char fn[] = "kvt_emu_token_kv";
    KVT_CHECK_NOT_NULL_AS(e, "emu", fn);
    KVT_CHECK_NOT_NULL(req, fn);
    KVT_CHECK_NOT_NULL(out, fn);
    KVT_CHECK_ARG(req->tokens != NULL && token < req->num_tokens,
                  "%s: token %u is outside the request's %u tokens", fn, token, req->num_tokens);
    KVT_CHECK_ARG(req->ns != NULL || req->ns_len == 0, "%s: req->ns is NULL but ns_len is %u", fn,
                  req->ns_len);
    KVT_CHECK_ARG(layer < e->geo->num_layers, "%s: layer %u is out of range (%u layers)", fn, layer,
                  e->geo->num_layers);
    KVT_CHECK_ARG(comp < kvt__geo_ncomp(e->geo, layer), "%s: layer %u has no component %u", fn,
                  layer, comp);
    uint64_t n = kvt__geo_token_bytes(e->geo, layer, comp);
    KVT_CHECK_ARG(len == n, "%s: len is %zu, layer %u component %u holds %llu bytes per token", fn,
                  len, layer, comp, (unsigned long long)n);
    uint64_t p = prefix_root(req);
    for (uint32_t t = 0; t <= token; t++) p = prefix_next(p, req->tokens[t]);
    token_bytes(e, p, layer, comp, out);
    return KVT_OK;
}

kvt_status kvt_emu_poison(kvt_emu *e, const uint32_t *pages, uint32_t num_pages)
{
    KVT_CHECK_NOT_NULL_AS(e, "emu", "kvt_emu_poison");
    KVT_CHECK_ARG(pages != NULL || num_pages == 0, "kvt_emu_poison: pages is NULL");
    const kvt_geometry *g = e->geo;
    for (uint32_t i = 0; i < num_pages; i++) /* all checked before any is written */
        KVT_CHECK_ARG(pages[i] < e->num_pages, "kvt_emu_poison: pages[%u] is %u, engine has %u pages",
                      i, pages[i], e->num_pages);
    for (uint32_t i = 0; i < num_pages; i++) {
        for (uint32_t l = 0; l < g->num_layers; l++)
            for (uint32_t c = 0; c < kvt__geo_ncomp(g, l); c++)
                memset(kvt__page_addr(&e->map, KVT_UNIT(l, c), pages[i]), 0xA5,
                       kvt__geo_token_bytes(g, l, c) * g->tokens_per_page);
    }
    return KVT_OK;
}
