/* test_conc_page_skip.c - KVT_PAGE_SKIP in a load's page table: the skipped
 * pages keep the engine's own bytes, every other page gets the cache's, in
 * process (kvt_cache_launch) and through a server (kvt_client_launch).
 * A block here is two pages, so a skip may cover a whole block or half of
 * one. Before each load, every page is filled with another request's KV
 * (the "marker"); afterwards the skipped pages must still verify against
 * the marker and the rest against the stored request, byte for byte.
 * Also: a store refuses KVT_PAGE_SKIP, and other page ids are checked as
 * before. Concurrent: the client copies on its own threads. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support.h"

#define LAYERS 3
#define TPP 8
#define BT 16 /* block tokens: two pages per block */
#define BLOCKS 6
#define NTOK (BLOCKS * BT + 1)
#define NP (BLOCKS * BT / TPP)
#define ENGINE_PAGES 64
#define WAIT_MS 10000

/* Pages a load leaves alone: all of block 0 (as a vLLM prefix already
 * computed), and the second half of block 3. */
static int skipped(uint32_t i) { return i < 2 || i == 7; }

static kvt_geometry *geo(void) { return kvt_test_geometry(LAYERS, 2, 16, TPP, KVT_LAYOUT_LAYER_FIRST); }

static void verify(kvt_emu *emu, const kvt_request *r, uint32_t page, const uint32_t *pages)
{
    kvt_verify_result v;
    assert_ok(kvt_emu_verify(emu, r, page * TPP, TPP, pages, NP, &v));
    if (v.mismatches || v.bytes_checked == 0)
        fail_msg("page %u: %llu of %llu bytes differ", page, (unsigned long long)v.mismatches,
                 (unsigned long long)v.bytes_checked);
}

/* Stores request a from pages [0, NP), loads it into pages [NP, 2 NP)
 * (marked with request b's KV) with the skips, and checks every page. */
static void store_then_load_with_skips(kvt_test_side *s, kvt_emu *emu)
{
    uint32_t ta[NTOK], tb[NTOK], src[NP], dst[NP], table[NP];
    kvt_test_tokens(ta, NTOK, 41);
    kvt_test_tokens(tb, NTOK, 42);
    kvt_request a = {ta, NTOK, "skip", 4}, b = {tb, NTOK, "skip", 4};
    for (uint32_t i = 0; i < NP; i++) {
        src[i] = i;
        dst[i] = ENGINE_PAGES - 1 - i; /* not in order, not adjacent to src */
        table[i] = skipped(i) ? KVT_PAGE_SKIP : dst[i];
    }
    assert_ok(kvt_emu_fill(emu, &a, 0, BLOCKS * BT, src, NP));
    kvt_store_plan p;
    assert_ok(kvt_test_prepare(s, &a, &p));
    assert_true(p.task != 0);
    assert_int_equal(p.num_tokens, BLOCKS * BT);
    /* A store copies whole blocks: a skip is refused, the task stays planned. */
    uint32_t bad[NP];
    memcpy(bad, src, sizeof bad);
    bad[3] = KVT_PAGE_SKIP;
    assert_status(kvt_test_launch(s, p.task, bad, NP), KVT_EINVAL);
    assert_non_null(strstr(kvt_last_error(), "pages[3] is KVT_PAGE_SKIP in store task"));
    assert_ok(kvt_test_launch(s, p.task, src, NP));
    kvt_task_result res;
    assert_ok(kvt_test_wait(s, p.task, WAIT_MS, &res));
    assert_int_equal(res.status, KVT_OK);

    assert_ok(kvt_emu_fill(emu, &b, 0, BLOCKS * BT, dst, NP)); /* the marker */
    kvt_match m;
    assert_ok(kvt_test_lookup(s, &a, &m));
    assert_int_equal(m.matched_tokens, BLOCKS * BT);
    /* Other ids are still checked: one past the engine's pages. */
    uint32_t far[NP];
    memcpy(far, table, sizeof far);
    far[4] = ENGINE_PAGES;
    assert_status(kvt_test_launch(s, m.task, far, NP), KVT_EINVAL);
    assert_non_null(strstr(kvt_last_error(), "pages[4] is 64"));
    assert_ok(kvt_test_launch(s, m.task, table, NP));
    for (uint32_t l = 0; l < LAYERS; l++) assert_ok(kvt_test_wait_layer(s, m.task, l, WAIT_MS));
    assert_ok(kvt_test_wait(s, m.task, WAIT_MS, &res));
    assert_int_equal(res.status, KVT_OK);
    assert_int_equal(res.num_tokens, BLOCKS * BT);
    for (uint32_t i = 0; i < NP; i++) verify(emu, skipped(i) ? &b : &a, i, dst);

    /* A load whose every page is skipped copies nothing and still ends. */
    uint32_t none[NP];
    for (uint32_t i = 0; i < NP; i++) none[i] = KVT_PAGE_SKIP;
    assert_ok(kvt_emu_fill(emu, &b, 0, BLOCKS * BT, dst, NP));
    assert_ok(kvt_test_lookup(s, &a, &m));
    assert_ok(kvt_test_launch(s, m.task, none, NP));
    assert_ok(kvt_test_wait(s, m.task, WAIT_MS, &res));
    assert_int_equal(res.status, KVT_OK);
    for (uint32_t i = 0; i < NP; i++) verify(emu, &b, i, dst);
}

static void test_cache_load_skips_pages(void **state)
{
    (void)state;
    kvt_geometry *g = geo();
    kvt_config *cfg = NULL;
    assert_ok(kvt_config_create(&cfg));
    assert_ok(kvt_config_set(cfg, "cpu_capacity", "4MiB"));
    assert_ok(kvt_config_set(cfg, "block_tokens", "16"));
    assert_ok(kvt_config_set(cfg, "huge_pages", "false"));
    kvt_test_side s = {0};
    assert_ok(kvt_cache_create(&s.cache, cfg, g));
    kvt_emu *emu = NULL;
    kvt_engine_memory mem;
    assert_ok(kvt_emu_create(&emu, g, ENGINE_PAGES));
    assert_ok(kvt_emu_memory(emu, &mem));
    assert_ok(kvt_cache_register_memory(s.cache, &mem));
    store_then_load_with_skips(&s, emu);
    kvt_cache_destroy(s.cache);
    kvt_emu_destroy(emu);
    kvt_config_destroy(cfg);
    kvt_geometry_destroy(g);
}

/* ------------------------------------------------------------------ */
/* Through a server process                                           */

static kvt_status make_server(kvt_server **out, void *path)
{
    kvt_config *cfg = NULL;
    kvt_status st = kvt_config_create(&cfg);
    if (!st) st = kvt_config_set(cfg, "server_socket", path);
    if (!st) st = kvt_config_set(cfg, "cpu_capacity", "4MiB");
    if (!st) st = kvt_config_set(cfg, "huge_pages", "false");
    if (!st) st = kvt_config_set(cfg, "block_tokens", "16");
    kvt_geometry *g = geo();
    if (!st) st = kvt_server_create(out, cfg, g);
    kvt_geometry_destroy(g);
    kvt_config_destroy(cfg);
    return st;
}

static void test_client_load_skips_pages(void **state)
{
    (void)state;
    char dir[256], path[300];
    kvt_test_mkdtemp(dir, sizeof dir, "skip"); /* the socket's files stay in it */
    snprintf(path, sizeof path, "%s/s.sock", dir);
    pid_t pid = kvt_test_server_fork(make_server, path);
    kvt_geometry *g = geo();
    kvt_test_side s = {0};
    assert_ok(kvt_client_attach(&s.cl, path, g, WAIT_MS));
    kvt_emu *emu = NULL;
    kvt_engine_memory mem;
    assert_ok(kvt_emu_create(&emu, g, ENGINE_PAGES));
    assert_ok(kvt_emu_memory(emu, &mem));
    assert_ok(kvt_client_register_memory(s.cl, &mem));
    store_then_load_with_skips(&s, emu);
    kvt_client_detach(s.cl);
    kvt_emu_destroy(emu);
    kvt_geometry_destroy(g);
    kvt_test_server_stop(pid, 5000);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cache_load_skips_pages),
        cmocka_unit_test_teardown(test_client_load_skips_pages, kvt_test_servers_kill),
    };
    return kvt_test_dirs_done(cmocka_run_group_tests(tests, NULL, NULL));
}
