/* The cache with an SSD tier under a small CPU tier, on both io backends:
 * write-through, read-back of SSD-only blocks (byte-verified), restart
 * recovery, refusal of a directory of another geometry, corrupt blocks
 * never served and re-filled by the next store, injected I/O faults, and
 * the index observer told of every tier change (what KV events publish). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/mount.h>
#include "store/ssd.h"

#include "cache/cache.h"
#include "cache/observe.h"
#include "index/index.h"
#include "support.h"

#define WAIT_MS 20000
#define BT 8
#define TOKENS 161 /* 20 full blocks + 1 */

static const char *const BACKENDS[] = {"threads", "uring"};

typedef struct env {
    kvt_geometry *geo;
    kvt_config *cfg;
    kvt_cache *cache;
    kvt_emu *emu;
    char dir[256];
    uint64_t block_bytes;
} env;

static void make_dir(env *e)
{
    const char *base = getenv("KVTIER_TEST_TMP");
    if (!base || !*base) base = "/tmp";
    char cmd[300];
    snprintf(cmd, sizeof cmd, "mkdir -p %s", base);
    assert_int_equal(system(cmd), 0);
    snprintf(e->dir, sizeof e->dir, "%s/tiers-XXXXXX", base);
    assert_non_null(mkdtemp(e->dir));
}

static void remove_dir(const char *dir)
{
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

/* cpu_blocks and ssd_blocks in blocks of this geometry. */
static kvt_status open_cache(env *e, kvt_geometry *g, uint32_t cpu_blocks, uint32_t ssd_blocks,
                             const char *io, bool fresh)
{
    e->geo = g;
    kvt_geometry_info info;
    assert_ok(kvt_geometry_info_get(g, &info));
    e->block_bytes = info.bytes_per_token * BT;
    char v[64];
    assert_ok(kvt_config_create(&e->cfg));
    snprintf(v, sizeof v, "%llu", (unsigned long long)(cpu_blocks * e->block_bytes));
    assert_ok(kvt_config_set(e->cfg, "cpu_capacity", v));
    snprintf(v, sizeof v, "%llu", (unsigned long long)(ssd_blocks * e->block_bytes));
    assert_ok(kvt_config_set(e->cfg, "ssd_capacity", v));
    assert_ok(kvt_config_set(e->cfg, "ssd_dirs", e->dir));
    assert_ok(kvt_config_set(e->cfg, "io", io));
    assert_ok(kvt_config_set(e->cfg, "ssd_fresh", fresh ? "true" : "false"));
    assert_ok(kvt_config_set(e->cfg, "block_tokens", "8"));
    assert_ok(kvt_config_set(e->cfg, "huge_pages", "false"));
    kvt_status st = kvt_cache_create(&e->cache, e->cfg, g);
    if (st) return st;
    assert_ok(kvt_emu_create(&e->emu, g, 1024));
    kvt_engine_memory mem;
    assert_ok(kvt_emu_memory(e->emu, &mem));
    assert_ok(kvt_cache_register_memory(e->cache, &mem));
    return KVT_OK;
}

static void close_cache(env *e)
{
    kvt_cache_destroy(e->cache);
    kvt_emu_destroy(e->emu);
    kvt_config_destroy(e->cfg);
    kvt_geometry_destroy(e->geo);
    e->cache = NULL;
    e->emu = NULL;
    e->cfg = NULL;
    e->geo = NULL;
}

static kvt_geometry *geo(void) { return kvt_test_geometry(2, 2, 64, 4, KVT_LAYOUT_LAYER_FIRST); }

static void request(uint32_t *tokens, uint32_t seed, kvt_request *r)
{
    kvt_test_tokens(tokens, TOKENS, seed);
    kvt_request x = {.tokens = tokens, .num_tokens = TOKENS};
    *r = x;
}

static void pages_at(uint32_t *pages, uint32_t base)
{
    for (uint32_t i = 0; i < 64; i++) pages[i] = base + i;
}

static void store(env *e, const kvt_request *r)
{
    uint32_t pages[64];
    pages_at(pages, 0);
    assert_ok(kvt_emu_fill(e->emu, r, 0, r->num_tokens, pages, 41));
    kvt_store_plan p;
    assert_ok(kvt_cache_prepare_store(e->cache, r, &p));
    if (!p.task) return;
    assert_ok(kvt_cache_launch(e->cache, p.task, pages, 41));
    kvt_task_result res;
    assert_ok(kvt_cache_wait(e->cache, p.task, WAIT_MS, &res));
    assert_int_equal(res.status, KVT_OK);
}

/* Loads into poisoned pages; verifies every landed byte; returns the
 * tokens that landed and the task's status in *st. */
static uint32_t load(env *e, const kvt_request *r, kvt_status *st)
{
    uint32_t pages[64];
    pages_at(pages, 100);
    assert_ok(kvt_emu_poison(e->emu, pages, 41));
    kvt_match m;
    assert_ok(kvt_cache_lookup(e->cache, r, &m));
    *st = KVT_OK;
    if (!m.task) return 0;
    assert_ok(kvt_cache_launch(e->cache, m.task, pages, 41));
    kvt_task_result res;
    assert_ok(kvt_cache_wait(e->cache, m.task, WAIT_MS, &res));
    *st = res.status;
    uint32_t landed = res.status == KVT_OK || res.status == KVT_ECORRUPT ? res.num_tokens : 0;
    kvt_verify_result v;
    assert_ok(kvt_emu_verify(e->emu, r, 0, landed, pages, 41, &v));
    assert_int_equal(v.mismatches, 0);
    return landed;
}

static kvt_cache_stats stats(env *e)
{
    kvt_cache_stats s;
    assert_ok(kvt_cache_stats_get(e->cache, &s));
    return s;
}

/* A fresh directory and cache (24 CPU blocks, 512 SSD blocks) on backend
 * b, with n requests (seeds seed..) stored and flushed one by one, so all
 * but the last few are on the SSD only. */
static void open_and_store(env *e, int b, uint32_t n, uint32_t seed, uint32_t tokens[][TOKENS],
                           kvt_request *r)
{
    memset(e, 0, sizeof *e);
    make_dir(e);
    assert_ok(open_cache(e, geo(), 24, 512, BACKENDS[b], false));
    for (uint32_t i = 0; i < n; i++) {
        request(tokens[i], seed + i, &r[i]);
        store(e, &r[i]);
        assert_ok(kvt_cache_flush(e->cache, WAIT_MS));
    }
}

/* Six 20-block requests through an 8-block CPU tier: the early ones come
 * back from the SSD, byte for byte. */
static void test_conc_read_back_from_ssd(void **state)
{
    (void)state;
    for (int b = 0; b < 2; b++) {
        env e;
        uint32_t tokens[6][TOKENS];
        kvt_request r[6];
        open_and_store(&e, b, 6, 100, tokens, r);
        kvt_cache_stats s = stats(&e);
        assert_int_equal(s.ssd_written_blocks, 120);
        assert_true(s.cpu_dropped_blocks >= 96);
        assert_int_equal(s.evicted_blocks, 0);
        kvt_status st;
        for (uint32_t i = 0; i < 6; i++) {
            assert_int_equal(load(&e, &r[i], &st), 160);
            assert_int_equal(st, KVT_OK);
        }
        s = stats(&e);
        assert_true(s.ssd_hit_tokens >= 4 * 160);
        assert_int_equal(s.corrupt_blocks, 0);
        close_cache(&e);
        remove_dir(e.dir);
    }
}

/* Two loads of SSD-only prefixes compete for a 24-block CPU tier: the
 * second gets CPU slots for only a few of its blocks, so its load is cut
 * short at lookup; both still land byte for byte (regression: the cut load
 * once skipped its SSD reads and scattered stale CPU slots). */
static void test_conc_truncated_read_back(void **state)
{
    (void)state;
    for (int b = 0; b < 2; b++) {
        env e;
        uint32_t tokens[6][TOKENS];
        kvt_request r[6];
        open_and_store(&e, b, 6, 150, tokens, r);
        kvt_match m0, m1;
        assert_ok(kvt_cache_lookup(e.cache, &r[0], &m0));
        assert_ok(kvt_cache_lookup(e.cache, &r[1], &m1));
        assert_int_equal(m0.matched_tokens, 160);
        assert_true(m1.matched_tokens > 0 && m1.matched_tokens < 160);
        uint32_t p0[64], p1[64];
        pages_at(p0, 100);
        pages_at(p1, 200);
        assert_ok(kvt_emu_poison(e.emu, p0, 41));
        assert_ok(kvt_emu_poison(e.emu, p1, 41));
        assert_ok(kvt_cache_launch(e.cache, m0.task, p0, 41));
        assert_ok(kvt_cache_launch(e.cache, m1.task, p1, 41));
        kvt_task_result res;
        kvt_verify_result v;
        assert_ok(kvt_cache_wait(e.cache, m0.task, WAIT_MS, &res));
        assert_int_equal(res.status, KVT_OK);
        assert_ok(kvt_emu_verify(e.emu, &r[0], 0, 160, p0, 41, &v));
        assert_int_equal(v.mismatches, 0);
        assert_ok(kvt_cache_wait(e.cache, m1.task, WAIT_MS, &res));
        assert_int_equal(res.status, KVT_OK);
        assert_ok(kvt_emu_verify(e.emu, &r[1], 0, m1.matched_tokens, p1, 41, &v));
        assert_int_equal(v.mismatches, 0);
        assert_true(stats(&e).ssd_read_blocks >= 20);
        close_cache(&e);
        remove_dir(e.dir);
    }
}

/* CPU slots whose owner is entry id (the tier's bookkeeping, read under
 * the cache lock): never more than one. */
static uint32_t slots_owned(env *e, uint32_t id)
{
    kvt_cache *c = e->cache;
    uint32_t n = 0;
    pthread_mutex_lock(&c->mu);
    for (uint32_t s = 0; s < c->cpu_blocks; s++) n += c->cpu_owner[s] == id;
    pthread_mutex_unlock(&c->mu);
    return n;
}

/* Two loads read the same SSD-only block and one read is corrupt: the good
 * copy the other brought back keeps serving (the block is not "lost"), and
 * a later store never leaves two CPU slots owned by one block. */
static void test_conc_two_loads_one_bad_read(void **state)
{
    (void)state;
    for (int b = 0; b < 2; b++) {
        env e;
        uint32_t tokens[3][TOKENS];
        kvt_request r[3];
        open_and_store(&e, b, 3, 170, tokens, r);
        kvt_request a = r[0];
        a.num_tokens = 9; /* one block, on the SSD only by now */
        kvt_hash128 h;
        kvt__block_hashes(a.tokens, 9, BT, NULL, 0, &h, 1);
        uint32_t id;
        kvt_index_stop stop;
        pthread_mutex_lock(&e.cache->mu);
        assert_int_equal(kvt__index_probe(e.cache->index, &h, 1, &id, &stop), 1);
        pthread_mutex_unlock(&e.cache->mu);
        kvt_match m1, m2;
        assert_ok(kvt_cache_lookup(e.cache, &a, &m1));
        assert_ok(kvt_cache_lookup(e.cache, &a, &m2));
        assert_int_equal(m1.matched_tokens, 8);
        assert_int_equal(m2.matched_tokens, 8);
        kvt__ssd_inject(e.cache->ssd, KVT_SSD_FAULT_CORRUPT, false, 0);
        uint32_t p1[64], p2[64];
        pages_at(p1, 100);
        pages_at(p2, 200);
        assert_ok(kvt_cache_launch(e.cache, m1.task, p1, 3));
        assert_ok(kvt_cache_launch(e.cache, m2.task, p2, 3));
        kvt_task_result r1, r2;
        assert_ok(kvt_cache_wait(e.cache, m1.task, WAIT_MS, &r1));
        assert_ok(kvt_cache_wait(e.cache, m2.task, WAIT_MS, &r2));
        /* One read comes back corrupt. The other usually brings a good copy
         * back, which then serves; if it was submitted only after the
         * corrupt one had freed the SSD slot, it fails too, and a store
         * re-fills the block. Either way no byte is wrong and the block
         * never owns two CPU slots. */
        assert_true(r1.status == KVT_ECORRUPT || r2.status == KVT_ECORRUPT);
        assert_int_equal(stats(&e).corrupt_blocks, 1);
        kvt_status st;
        if (r1.status == KVT_OK || r2.status == KVT_OK) {
            assert_int_equal(load(&e, &a, &st), 8); /* the good copy serves */
        } else {
            assert_int_equal(load(&e, &a, &st), 0);
        }
        assert_true(slots_owned(&e, id) <= 1);
        store(&e, &a);
        assert_true(slots_owned(&e, id) <= 1);
        assert_int_equal(load(&e, &a, &st), 8);
        close_cache(&e);
        remove_dir(e.dir);
    }
}

/* Re-storing a cached prefix stores nothing and drops no CPU copies. */
static void test_conc_restore_cached_is_free(void **state)
{
    (void)state;
    env e = {0};
    make_dir(&e);
    assert_ok(open_cache(&e, geo(), 24, 512, "threads", false));
    uint32_t tokens[TOKENS];
    kvt_request r;
    request(tokens, 180, &r);
    store(&e, &r);
    assert_ok(kvt_cache_flush(e.cache, WAIT_MS));
    kvt_cache_stats before = stats(&e);
    kvt_store_plan p;
    assert_ok(kvt_cache_prepare_store(e.cache, &r, &p));
    assert_int_equal(p.task, 0);
    kvt_cache_stats after = stats(&e);
    assert_int_equal(after.cpu_dropped_blocks, before.cpu_dropped_blocks);
    assert_int_equal(after.cpu_blocks_used, before.cpu_blocks_used);
    close_cache(&e);
    remove_dir(e.dir);
}

/* A restart on the same directory finds every flushed block. */
static void test_conc_restart_recovers(void **state)
{
    (void)state;
    for (int b = 0; b < 2; b++) {
        env e = {0};
        make_dir(&e);
        uint32_t tokens[3][TOKENS];
        kvt_request r[3];
        assert_ok(open_cache(&e, geo(), 24, 512, BACKENDS[b], false));
        for (uint32_t i = 0; i < 3; i++) {
            request(tokens[i], 200 + i, &r[i]);
            store(&e, &r[i]);
        }
        assert_ok(kvt_cache_flush(e.cache, WAIT_MS));
        close_cache(&e);
        assert_ok(open_cache(&e, geo(), 24, 512, BACKENDS[b], false));
        assert_int_equal(stats(&e).recovered_blocks, 60);
        kvt_status st;
        for (uint32_t i = 0; i < 3; i++) assert_int_equal(load(&e, &r[i], &st), 160);
        close_cache(&e);
        remove_dir(e.dir);
    }
}

/* A directory written for another geometry is refused, naming the field;
 * ssd_fresh starts it empty instead. */
static void test_other_geometry_refused(void **state)
{
    (void)state;
    env e = {0};
    make_dir(&e);
    uint32_t tokens[TOKENS];
    kvt_request r;
    request(tokens, 300, &r);
    assert_ok(open_cache(&e, geo(), 24, 256, "threads", false));
    store(&e, &r);
    assert_ok(kvt_cache_flush(e.cache, WAIT_MS));
    close_cache(&e);
    kvt_geometry *other = kvt_test_geometry(2, 4, 64, 4, KVT_LAYOUT_LAYER_FIRST);
    assert_status(open_cache(&e, other, 24, 256, "threads", false), KVT_EGEOMETRY);
    assert_non_null(strstr(kvt_last_error(), e.dir));
    kvt_config_destroy(e.cfg);
    assert_ok(open_cache(&e, other, 24, 256, "threads", true));
    assert_int_equal(stats(&e).recovered_blocks, 0);
    close_cache(&e);
    remove_dir(e.dir);
}

/* A block that fails its checksum is never handed to the engine: the load
 * stops before it, and the next store of the prefix fills it again. */
static void test_conc_corrupt_block_is_a_miss(void **state)
{
    (void)state;
    for (int b = 0; b < 2; b++) {
        env e;
        uint32_t tokens[3][TOKENS];
        kvt_request r[3];
        open_and_store(&e, b, 3, 400, tokens, r);
        /* r[0] is on the SSD only now; its 6th block read comes back flipped.
         * No layer of that load may be reported whole to the engine. */
        kvt__ssd_inject(e.cache->ssd, KVT_SSD_FAULT_CORRUPT, false, 5);
        kvt_match cm;
        uint32_t cp[64];
        pages_at(cp, 300);
        assert_ok(kvt_cache_lookup(e.cache, &r[0], &cm));
        assert_int_equal(cm.matched_tokens, 160);
        assert_ok(kvt_cache_launch(e.cache, cm.task, cp, 41));
        assert_status(kvt_cache_wait_layer(e.cache, cm.task, 0, WAIT_MS), KVT_ECORRUPT);
        assert_non_null(strstr(kvt_last_error(), "recompute"));
        /* Asked again once the load has (most likely) ended, the answer is
         * the same: a load that ends before the engine asks must not lose
         * the "recompute" advice (CI once saw that race). */
        usleep(50 * 1000);
        assert_status(kvt_cache_wait_layer(e.cache, cm.task, 1, WAIT_MS), KVT_ECORRUPT);
        assert_non_null(strstr(kvt_last_error(), "recompute"));
        kvt_task_result cres;
        assert_ok(kvt_cache_wait(e.cache, cm.task, WAIT_MS, &cres));
        assert_int_equal(cres.status, KVT_ECORRUPT);
        assert_true(cres.num_tokens < 160);
        kvt_verify_result cv;
        assert_ok(kvt_emu_verify(e.emu, &r[0], 0, cres.num_tokens, cp, 41, &cv));
        assert_int_equal(cv.mismatches, 0);
        kvt_status st;
        assert_int_equal(stats(&e).corrupt_blocks, 1);
        uint32_t landed = cres.num_tokens;
        (void)landed;
        /* The lost block is not matched; a store re-fills it. */
        kvt_match m;
        assert_ok(kvt_cache_lookup(e.cache, &r[0], &m));
        assert_true(m.matched_tokens < 160);
        if (m.task) assert_ok(kvt_cache_cancel(e.cache, m.task));
        kvt_task_result res;
        if (m.task) assert_ok(kvt_cache_wait(e.cache, m.task, WAIT_MS, &res));
        store(&e, &r[0]);
        assert_int_equal(load(&e, &r[0], &st), 160);
        assert_int_equal(st, KVT_OK);
        close_cache(&e);
        remove_dir(e.dir);
    }
}

/* A failed SSD write (one, then another) leaves the CPU copy serving;
 * nothing is lost or wrong. The first ENOSPC/EIO stops SSD writes. */
static void test_conc_write_faults(void **state)
{
    (void)state;
    for (int b = 0; b < 2; b++) {
        env e = {0};
        make_dir(&e);
        assert_ok(open_cache(&e, geo(), 64, 512, BACKENDS[b], false));
        uint32_t tokens[2][TOKENS];
        kvt_request r[2];
        request(tokens[0], 500, &r[0]);
        request(tokens[1], 501, &r[1]);
        kvt__ssd_inject(e.cache->ssd, KVT_SSD_FAULT_ENOSPC, true, 2);
        store(&e, &r[0]);
        assert_ok(kvt_cache_flush(e.cache, WAIT_MS));
        kvt__ssd_inject(e.cache->ssd, KVT_SSD_FAULT_EIO, true, 0);
        store(&e, &r[1]);
        assert_ok(kvt_cache_flush(e.cache, WAIT_MS));
        kvt_cache_stats s = stats(&e);
        assert_true(s.ssd_write_errors >= 1);
        kvt_status st;
        assert_int_equal(load(&e, &r[0], &st), 160);
        assert_int_equal(load(&e, &r[1], &st), 160);
        close_cache(&e);
        remove_dir(e.dir);
    }
}

/* stderr into a file while a test runs, to count the lines kvtier logs. */
typedef struct capture {
    int saved;
    char path[300];
} capture;

/* What a failed assertion would leave behind, undone by the teardown. */
static capture *g_capture;
static char g_mount[256];

static int undo_capture_and_mount(void **state)
{
    (void)state;
    if (g_capture) { /* the test failed while capturing: show what it printed */
        fflush(stderr);
        dup2(g_capture->saved, 2);
        close(g_capture->saved);
        FILE *f = fopen(g_capture->path, "r");
        char line[1024];
        while (f && fgets(line, sizeof line, f)) fputs(line, stderr);
        if (f) fclose(f);
        unlink(g_capture->path);
        g_capture = NULL;
    }
    if (g_mount[0]) {
        umount2(g_mount, MNT_DETACH);
        remove_dir(g_mount);
        g_mount[0] = '\0';
    }
    return 0;
}

static void capture_begin(capture *c, const char *dir)
{
    snprintf(c->path, sizeof c->path, "%s.stderr", dir);
    int fd = open(c->path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    assert_true(fd >= 0);
    fflush(stderr);
    c->saved = dup(2);
    assert_true(c->saved >= 0);
    assert_true(dup2(fd, 2) == 2);
    close(fd);
    g_capture = c;
}

/* Restores stderr; returns how many lines hold want (and echoes them). */
static uint32_t capture_end(capture *c, const char *want, const char *also)
{
    fflush(stderr);
    g_capture = NULL;
    assert_true(dup2(c->saved, 2) == 2);
    close(c->saved);
    FILE *f = fopen(c->path, "r");
    assert_non_null(f);
    char line[1024];
    uint32_t n = 0;
    while (fgets(line, sizeof line, f)) {
        if (!strstr(line, want)) continue;
        fprintf(stderr, "  logged: %s", line);
        if (also) assert_non_null(strstr(line, also));
        n++;
    }
    fclose(f);
    unlink(c->path);
    return n;
}

/* 12 requests of 20 blocks through a 24-block CPU tier after the SSD tier
 * broke: every store and load succeeds, every landed byte verifies, blocks
 * already on the SSD are still served, and the tier took no more writes. */
static void serve_after_failure(env *e, uint64_t written_before, uint32_t first_seed)
{
    uint32_t tokens[12][TOKENS], conv_tokens[TOKENS];
    kvt_request r[12], conv;
    request(conv_tokens, first_seed + 100, &conv);
    for (uint32_t i = 0; i < 12; i++) {
        request(tokens[i], first_seed + i, &r[i]);
        store(e, &r[i]);
        assert_ok(kvt_cache_flush(e->cache, WAIT_MS));
        kvt_status st;
        assert_int_equal(load(e, &r[i], &st), 160); /* the CPU tier serves it */
        assert_int_equal(st, KVT_OK);
        /* A conversation growing by 3 blocks a turn: its stored prefix is a
         * cold leaf by the next turn, which is what a full disk used to
         * break (the prefix evicted while being extended). */
        conv.num_tokens = 3 * BT * (i % 6 + 1) + 1;
        store(e, &conv);
        assert_ok(kvt_cache_flush(e->cache, WAIT_MS));
    }
    kvt_cache_stats s = stats(e);
    assert_true(s.ssd_written_blocks <= written_before + 64); /* at most one round in flight */
    uint64_t w = s.ssd_written_blocks;
    for (uint32_t i = 0; i < 12; i++) store(e, &r[i]);
    assert_ok(kvt_cache_flush(e->cache, WAIT_MS));
    assert_int_equal(stats(e).ssd_written_blocks, w);
}

/* Issue 14 item 8: a journal that cannot be written (a full filesystem:
 * ENOSPC; a failing one: EIO) used to trip an assertion in kvt__index_pin
 * (debug) or fail prepare_store with an empty EINVAL. Now the SSD tier stops
 * taking writes, says so once, and the CPU tier keeps serving. Injected in
 * the store's journal writes, so it runs without root. */
static void test_conc_journal_write_fails(void **state)
{
    (void)state;
    static const int errs[] = {ENOSPC, EIO};
    for (int b = 0; b < 2; b++) {
        for (int k = 0; k < 2; k++) {
            env e = {0};
            make_dir(&e);
            assert_ok(open_cache(&e, geo(), 24, 512, BACKENDS[b], false));
            uint32_t tokens[2][TOKENS];
            kvt_request r[2];
            for (uint32_t i = 0; i < 2; i++) {
                request(tokens[i], 700 + i, &r[i]);
                store(&e, &r[i]);
                assert_ok(kvt_cache_flush(e.cache, WAIT_MS));
            }
            uint64_t written = stats(&e).ssd_written_blocks;
            assert_int_equal(written, 40);
            capture cap;
            capture_begin(&cap, e.dir);
            kvt__ssd_inject_journal(e.cache->ssd, errs[k], 0, UINT32_MAX);
            serve_after_failure(&e, written, 710);
            kvt_status st;
            assert_int_equal(load(&e, &r[0], &st), 160); /* from the SSD, written before */
            assert_int_equal(capture_end(&cap, "takes no more writes", "kvtier.journal: write"), 1);
            close_cache(&e);
            remove_dir(e.dir);
        }
    }
}

/* The same on a real full filesystem: a tmpfs just big enough for the data
 * file, the metadata and one page of journal (64 records). Needs root (or
 * CAP_SYS_ADMIN) to mount; skipped otherwise. */
static void test_conc_full_tmpfs(void **state)
{
    (void)state;
    env e = {0};
    make_dir(&e);
    kvt_geometry *g = geo();
    kvt_geometry_info info;
    assert_ok(kvt_geometry_info_get(g, &info));
    uint64_t block = info.bytes_per_token * BT, slot = (block + 4095) / 4096 * 4096;
    char opts[64];
    snprintf(opts, sizeof opts, "size=%lluk,mode=0700",
             (unsigned long long)((512 * slot) / 1024 + 8));
    if (mount("kvtier-test", e.dir, "tmpfs", 0, opts) != 0) {
        fprintf(stderr, "  skipped: cannot mount a tmpfs on %s (%s): needs root; the injected "
                "journal failures above cover the logic\n", e.dir, strerror(errno));
        kvt_geometry_destroy(g);
        remove_dir(e.dir);
        skip();
    }
    char mnt[sizeof e.dir];
    memcpy(mnt, e.dir, sizeof mnt);
    memcpy(g_mount, mnt, sizeof g_mount);
    assert_true(strlen(mnt) + 5 <= sizeof e.dir);
    memcpy(e.dir + strlen(mnt), "/ssd", 5);
    assert_ok(open_cache(&e, g, 24, 512, "threads", false));
    capture cap;
    capture_begin(&cap, mnt);
    serve_after_failure(&e, 0, 800);
    assert_true(stats(&e).ssd_write_errors >= 1);
    uint32_t lines = capture_end(&cap, "takes no more writes", "No space left on device");
    close_cache(&e);
    /* fsck: what the journal holds verifies; nothing is bad. */
    kvt_ssd_fsck_report rep;
    assert_ok(kvt__ssd_fsck(e.dir, false, &rep));
    assert_int_equal(rep.bad_blocks, 0);
    assert_int_equal(rep.bad_records, 0);
    assert_true(rep.blocks <= 64);
    assert_int_equal(umount(mnt), 0);
    g_mount[0] = '\0';
    assert_int_equal(lines, 1);
    remove_dir(mnt);
}

/* Issue 24 item 4: the disk fills while the SSD tier is full and churning
 * (every write reuses an evicted block's slot). A freed slot used to be
 * rewritten before its DEL record was durable; when the round carrying the
 * DEL then failed with ENOSPC, the journal kept PUTs naming overwritten
 * bytes (fsck: 9-55 of 128 blocks bad after a recovery). Now fsck is clean
 * and every block recovered at the next open loads byte-exact. Needs root
 * for the tmpfs, like test_conc_full_tmpfs; the store-level twin
 * (test_ssd_journal: test_failed_round_keeps_freed_slots) needs nothing. */
static void test_conc_full_disk_while_churning(void **state)
{
    (void)state;
    env e = {0};
    make_dir(&e);
    kvt_geometry *g = geo();
    kvt_geometry_info info;
    assert_ok(kvt_geometry_info_get(g, &info));
    uint64_t block = info.bytes_per_token * BT, slot = (block + 4095) / 4096 * 4096;
    char opts[64];
    /* 32 slots, the metadata, and 16 KiB (256 records) of journal. */
    snprintf(opts, sizeof opts, "size=%lluk,mode=0700", (unsigned long long)((32 * slot) / 1024 + 20));
    if (mount("kvtier-test", e.dir, "tmpfs", 0, opts) != 0) {
        fprintf(stderr, "  skipped: cannot mount a tmpfs on %s (%s): needs root; "
                "test_ssd_journal covers the logic\n", e.dir, strerror(errno));
        kvt_geometry_destroy(g);
        remove_dir(e.dir);
        skip();
    }
    char mnt[sizeof e.dir];
    memcpy(mnt, e.dir, sizeof mnt);
    memcpy(g_mount, mnt, sizeof g_mount);
    assert_true(strlen(mnt) + 5 <= sizeof e.dir);
    memcpy(e.dir + strlen(mnt), "/ssd", 5);
    assert_ok(open_cache(&e, g, 24, 32, "threads", false));
    uint32_t tokens[20][TOKENS];
    kvt_request r[20];
    for (uint32_t i = 0; i < 20; i++) {
        request(tokens[i], 900 + i, &r[i]);
        store(&e, &r[i]);
        assert_ok(kvt_cache_flush(e.cache, WAIT_MS));
    }
    assert_true(stats(&e).ssd_written_blocks > 32); /* slots were reused */
    assert_true(stats(&e).ssd_write_errors >= 1);   /* and the disk filled */
    close_cache(&e);
    kvt_ssd_fsck_report rep;
    assert_ok(kvt__ssd_fsck(e.dir, false, &rep));
    assert_int_equal(rep.bad_blocks, 0);
    assert_int_equal(rep.bad_records, 0);
    assert_true(rep.blocks >= 1);
    /* Recovery serves what the journal holds, every byte verified by load(). */
    assert_ok(open_cache(&e, geo(), 24, 32, "threads", false));
    uint32_t landed = 0;
    for (uint32_t i = 0; i < 20; i++) {
        kvt_status st;
        landed += load(&e, &r[i], &st);
        assert_int_equal(st, KVT_OK);
    }
    assert_true(landed >= BT);
    close_cache(&e);
    assert_int_equal(umount(mnt), 0);
    g_mount[0] = '\0';
    remove_dir(mnt);
}

/* A router's view of the node built from the index observer's events
 * alone (index.h: STORED/REMOVED with the tiers kvt__cache_tiers_of names,
 * and the tier events): per block, the tiers it was told of. Each event
 * must change the view consistently (nothing stored twice into a tier,
 * nothing removed from one it was not in) and leave it equal to the tiers
 * the cache has then. */
#define TV_MAX 4096
typedef struct tview {
    kvt_cache *c;
    kvt_hash128 h[TV_MAX];
    uint8_t bits[TV_MAX];
    uint32_t n;
    uint64_t count[8]; /* by kvt_index_event */
    char bad[200];     /* the first inconsistency */
} tview;

static uint8_t *tv_bits(tview *t, kvt_hash128 h)
{
    for (uint32_t i = 0; i < t->n; i++)
        if (kvt__hash_eq(t->h[i], h)) return &t->bits[i];
    if (t->n == TV_MAX) return NULL;
    t->h[t->n] = h;
    t->bits[t->n] = 0;
    return &t->bits[t->n++];
}

static void tv_observe(void *arg, kvt_index_event e, const kvt_index *idx, const uint32_t *ids,
                       uint32_t n)
{
    tview *t = arg;
    for (uint32_t i = 0; i < n; i++) {
        uint8_t *b = tv_bits(t, kvt__index_key(idx, ids[i]));
        uint8_t now = kvt__cache_tiers_of(t->c, ids[i]), set = 0, clr = 0;
        t->count[e < 8 ? e : 0]++;
        switch (e) {
        case KVT_INDEX_STORED: set = now; break;
        case KVT_INDEX_REMOVED: clr = now; break;
        case KVT_INDEX_CPU_STORED: set = KVT_CACHE_TIER_CPU; break;
        case KVT_INDEX_CPU_REMOVED: clr = KVT_CACHE_TIER_CPU; break;
        case KVT_INDEX_DISK_STORED: set = KVT_CACHE_TIER_DISK; break;
        case KVT_INDEX_DISK_REMOVED: clr = KVT_CACHE_TIER_DISK; break;
        }
        if (!b || t->bad[0]) continue;
        if ((*b & set) || (*b & clr) != clr || (e == KVT_INDEX_REMOVED && *b != now))
            snprintf(t->bad, sizeof t->bad, "event %d on a block seen in tiers %u: sets %u, "
                     "clears %u, the cache has %u", (int)e, *b, set, clr, now);
        *b = (uint8_t)((*b | set) & ~clr);
        if (!t->bad[0] && e != KVT_INDEX_REMOVED && *b != now)
            snprintf(t->bad, sizeof t->bad, "after event %d the view has tiers %u, the cache %u",
                     (int)e, *b, now);
    }
}

/* The view equals the cache: every block of the index in exactly its tiers,
 * every other block in none. */
static void tv_check(tview *t)
{
    kvt_cache *c = t->c;
    pthread_mutex_lock(&c->mu);
    for (uint32_t i = 0; i < t->n && !t->bad[0]; i++) {
        uint32_t id = kvt__index_find(c->index, t->h[i]);
        uint8_t want = id == KVT_INDEX_NONE ? 0 : kvt__cache_tiers_of(c, id);
        if (t->bits[i] != want)
            snprintf(t->bad, sizeof t->bad, "block %u: the view has tiers %u, the cache %u", i,
                     t->bits[i], want);
    }
    for (uint32_t id = 0; id < kvt__index_high(c->index) && !t->bad[0]; id++)
        if (kvt__index_live(c->index, id) && !tv_bits(t, kvt__index_key(c->index, id)))
            snprintf(t->bad, sizeof t->bad, "view full");
    pthread_mutex_unlock(&c->mu);
    if (t->bad[0]) fail_msg("%s", t->bad);
}

/* Stores through a 24-block CPU tier over a 64-block SSD tier (CPU copies
 * dropped, SSD copies made durable, leaves evicted from the SSD), loads
 * read back from it, a corrupt read (an SSD copy lost) and the store that
 * re-fills it: the observer hears every change in every tier. */
static void test_conc_tier_events(void **state)
{
    (void)state;
    for (int b = 0; b < 2; b++) {
        env e = {0};
        make_dir(&e);
        assert_ok(open_cache(&e, geo(), 24, 64, BACKENDS[b], false));
        tview *t = calloc(1, sizeof *t);
        assert_non_null(t);
        t->c = e.cache;
        kvt__cache_observe_index(e.cache, tv_observe, t);
        uint32_t tokens[6][TOKENS];
        kvt_request r[6];
        kvt_status st;
        for (uint32_t i = 0; i < 3; i++) {
            request(tokens[i], 700 + i, &r[i]);
            store(&e, &r[i]);
            assert_ok(kvt_cache_flush(e.cache, WAIT_MS));
        }
        /* r[0] is on the SSD only; its 6th block's read comes back corrupt */
        kvt__ssd_inject(e.cache->ssd, KVT_SSD_FAULT_CORRUPT, false, 5);
        kvt_match m;
        uint32_t cp[64];
        pages_at(cp, 300);
        assert_ok(kvt_cache_lookup(e.cache, &r[0], &m));
        assert_int_equal(m.matched_tokens, 160);
        assert_ok(kvt_cache_launch(e.cache, m.task, cp, 41));
        kvt_task_result res;
        assert_ok(kvt_cache_wait(e.cache, m.task, WAIT_MS, &res));
        assert_int_equal(res.status, KVT_ECORRUPT);
        assert_int_equal(t->count[KVT_INDEX_DISK_REMOVED], 1);
        store(&e, &r[0]); /* re-fills the lost block */
        assert_ok(kvt_cache_flush(e.cache, WAIT_MS));
        tv_check(t);
        for (uint32_t i = 3; i < 6; i++) { /* past the SSD's 64 blocks: leaves evicted */
            request(tokens[i], 700 + i, &r[i]);
            store(&e, &r[i]);
            assert_ok(kvt_cache_flush(e.cache, WAIT_MS));
        }
        for (uint32_t i = 0; i < 6; i++) (void)load(&e, &r[i], &st);
        assert_ok(kvt_cache_flush(e.cache, WAIT_MS));
        kvt_cache_stats s = stats(&e);
        tv_check(t);
        assert_true(s.evicted_blocks > 0 && s.ssd_read_blocks > 0 && s.cpu_dropped_blocks > 0);
        assert_int_equal(t->count[KVT_INDEX_DISK_STORED], s.ssd_written_blocks);
        assert_int_equal(t->count[KVT_INDEX_CPU_REMOVED], s.cpu_dropped_blocks);
        assert_int_equal(t->count[KVT_INDEX_REMOVED], s.evicted_blocks);
        /* each block read back (the corrupt one's was not) and the re-filled one */
        assert_int_equal(t->count[KVT_INDEX_CPU_STORED], s.ssd_read_blocks + 1);
        kvt__cache_observe_index(e.cache, NULL, NULL);
        free(t);
        close_cache(&e);
        remove_dir(e.dir);
    }
}

static void test_bad_directory_is_a_clear_error(void **state)
{
    (void)state;
    env e = {0};
    snprintf(e.dir, sizeof e.dir, "/proc/version/kvtier");
    kvt_status st = open_cache(&e, geo(), 24, 256, "threads", false);
    assert_true(st != KVT_OK);
    assert_non_null(strstr(kvt_last_error(), "/proc/version"));
    kvt_config_destroy(e.cfg);
    kvt_geometry_destroy(e.geo);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_conc_read_back_from_ssd),
        cmocka_unit_test(test_conc_truncated_read_back),
        cmocka_unit_test(test_conc_two_loads_one_bad_read),
        cmocka_unit_test(test_conc_restore_cached_is_free),
        cmocka_unit_test(test_conc_restart_recovers),
        cmocka_unit_test(test_other_geometry_refused),
        cmocka_unit_test(test_conc_corrupt_block_is_a_miss),
        cmocka_unit_test(test_conc_write_faults),
        cmocka_unit_test_teardown(test_conc_journal_write_fails, undo_capture_and_mount),
        cmocka_unit_test_teardown(test_conc_full_tmpfs, undo_capture_and_mount),
        cmocka_unit_test_teardown(test_conc_full_disk_while_churning, undo_capture_and_mount),
        cmocka_unit_test(test_bad_directory_is_a_clear_error),
        cmocka_unit_test(test_conc_tier_events),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
