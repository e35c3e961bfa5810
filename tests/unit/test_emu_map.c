/* test_emu_map.c - the emulated engine's buffers: large ones are 2 MiB-aligned
 * mappings (huge pages advised) whose destroy leaves no mapping behind, and
 * every byte of every buffer is writable; small ones stay on the heap, so a
 * small engine of many layers costs its bytes, not a 2 MiB huge page per
 * layer and component (regression: test_conc_pd peaked at ~5 GB). */
#include "support.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__SANITIZE_ADDRESS__)
#define KVT_ASAN 1 /* emu keeps every buffer on the heap */
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KVT_ASAN 1
#endif
#endif

#define HUGE_PAGE (2u << 20)

static long status_kb(const char *key)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long v = -1;
    size_t kl = strlen(key);
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, key, kl)) v = atol(line + kl + 1);
    if (f) fclose(f);
    return v;
}

static int map_count(void)
{
    FILE *f = fopen("/proc/self/maps", "r");
    int n = 0, c;
    while (f && (c = fgetc(f)) != EOF) n += c == '\n';
    if (f) fclose(f);
    return n;
}

static kvt_geometry *geo(uint32_t layers, uint32_t comps, uint32_t heads, uint32_t dim, uint32_t tpp,
                         kvt_layout lay)
{
    kvt_geometry *g = NULL;
    assert_ok(kvt_geometry_create(&g, layers, tpp, lay));
    kvt_layer_spec s = {0};
    s.num_components = comps;
    for (uint32_t c = 0; c < comps; c++) s.component[c] = (kvt_component_spec){heads, dim, 2};
    assert_ok(kvt_geometry_set_layers(g, 0, layers, &s));
    return g;
}

static void check_buffer(void *p, uint64_t bytes)
{
    assert_non_null(p);
#ifndef KVT_ASAN
    if (bytes >= HUGE_PAGE) assert_int_equal((uintptr_t)p % HUGE_PAGE, 0);
#endif
    memset(p, 0xab, bytes); /* all of it is writable (ASan: and no more is read) */
}

static void buffers_mapped_and_unmapped(void **state)
{
    (void)state;
    struct {
        uint32_t layers, comps, heads, dim, tpp, pages;
        kvt_layout lay;
    } cases[] = {
        {3, 2, 1, 1, 1, 1, KVT_LAYOUT_LAYER_FIRST},       /* 2-byte buffers: heap */
        {2, 2, 8, 128, 16, 256, KVT_LAYOUT_LAYER_FIRST},  /* 8 MiB each: 4 huge pages */
        {2, 1, 1, 64, 16, 1025, KVT_LAYOUT_LAYER_FIRST},  /* 2 MiB + 2 KiB: rounded up */
        {2, 1, 1, 64, 16, 1024, KVT_LAYOUT_LAYER_FIRST},  /* exactly 2 MiB */
        {4, 2, 2, 32, 8, 77, KVT_LAYOUT_PAGE_FIRST},      /* 616 KiB: heap */
        {4, 2, 2, 32, 8, 4000, KVT_LAYOUT_PAGE_FIRST},    /* 31 MiB + 256 KiB */
    };
    for (int rep = 0; rep < 3; rep++)
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
            kvt_geometry *g = geo(cases[i].layers, cases[i].comps, cases[i].heads, cases[i].dim,
                                  cases[i].tpp, cases[i].lay);
            long vm0 = status_kb("VmSize:");
            int m0 = map_count();
            kvt_emu *e = NULL;
            assert_ok(kvt_emu_create(&e, g, cases[i].pages));
            kvt_engine_memory mem;
            assert_ok(kvt_emu_memory(e, &mem));
            if (mem.base) check_buffer(mem.base, mem.buffer_bytes[0]);
            else
                for (uint32_t l = 0; l < cases[i].layers; l++)
                    for (uint32_t c = 0; c < cases[i].comps; c++) {
                        uint32_t u = l * KVT_MAX_COMPONENTS + c;
                        check_buffer(mem.layer_bases[u], mem.buffer_bytes[u]);
                    }
            kvt_emu_destroy(e);
            long vm1 = status_kb("VmSize:");
            int m1 = map_count();
#ifndef KVT_ASAN /* (ASan's allocator maps memory of its own) */
            /* the malloc arena may keep a little; a leaked buffer is >= 2 MiB */
            if (m1 > m0 || vm1 - vm0 >= 1024)
                fail_msg("case %zu: VmSize %ld -> %ld kB, %d -> %d mappings after destroy", i, vm0, vm1, m0, m1);
#else
            (void)vm0, (void)vm1, (void)m0, (void)m1;
#endif
            kvt_geometry_destroy(g);
        }
}

/* 64 layers x K,V of 32 KiB each (4 MiB of KV), every page filled. */
static void small_engine_costs_its_bytes(void **state)
{
    (void)state;
    kvt_geometry *g = geo(64, 2, 2, 64, 16, KVT_LAYOUT_LAYER_FIRST);
    long r0 = status_kb("VmRSS:");
    kvt_emu *e = NULL;
    assert_ok(kvt_emu_create(&e, g, 8));
    uint32_t toks[128], pages[8];
    for (int i = 0; i < 128; i++) toks[i] = (uint32_t)i * 7 + 1;
    for (int i = 0; i < 8; i++) pages[i] = (uint32_t)i;
    kvt_request req = {toks, 128, "ns", 2};
    assert_ok(kvt_emu_fill(e, &req, 0, 128, pages, 8));
    long grew = status_kb("VmRSS:") - r0;
    if (grew > 32 * 1024) fail_msg("a 4 MiB engine grew RSS by %ld kB (a huge page per buffer?)", grew);
    kvt_verify_result vr;
    assert_ok(kvt_emu_verify(e, &req, 0, 128, pages, 8, &vr));
    assert_int_equal(vr.mismatches, 0);
    kvt_emu_destroy(e);
    kvt_geometry_destroy(g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(buffers_mapped_and_unmapped),
        cmocka_unit_test(small_engine_costs_its_bytes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
