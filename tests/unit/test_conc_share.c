/* Two caches of different geometries on one share (cache/share.h: the node
 * server's tiers of any model): when one member is busy under its own
 * mutex at the moment another needs its room, the needy one waits for it
 * rather than dropping its own newer blocks. Before, a reclaim passed a
 * busy member over at once (trylock), and the SSD writer of the member
 * that needed disk dropped its writes while the other held colder blocks
 * (test_conc_server's test_shared_ssd lost a whole request that way under
 * TSan). Every load is byte-verified. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "cache/cache.h"
#include "cache/share.h"
#include "support.h"

#define WAIT_MS 20000
#define BT 8
#define TOKENS 161 /* 20 full blocks of 8 tokens + 1 */
#define PAGES 41   /* 4 tokens a page */
#define BLOCKS 20

typedef struct member {
    kvt_geometry *geo;
    kvt_config *cfg;
    kvt_cache *cache;
    kvt_emu *emu;
} member;

/* A member of sh with the whole CPU and SSD budgets as its capacity (as
 * the server's shards), its SSD files in dir/sub, blocks of 8 tokens. */
static void member_open(member *m, kvt_share *sh, uint32_t heads, const char *dir,
                        const char *sub, uint64_t cpu, uint64_t ssd)
{
    memset(m, 0, sizeof *m);
    char path[320], v[64];
    snprintf(path, sizeof path, "%s/%s", dir, sub);
    assert_int_equal(mkdir(path, 0700), 0);
    m->geo = kvt_test_geometry(2, heads, 64, 4, KVT_LAYOUT_LAYER_FIRST);
    assert_ok(kvt_config_create(&m->cfg));
    snprintf(v, sizeof v, "%llu", (unsigned long long)cpu);
    assert_ok(kvt_config_set(m->cfg, "cpu_capacity", v));
    snprintf(v, sizeof v, "%llu", (unsigned long long)ssd);
    assert_ok(kvt_config_set(m->cfg, "ssd_capacity", v));
    assert_ok(kvt_config_set(m->cfg, "ssd_dirs", path));
    assert_ok(kvt_config_set(m->cfg, "ssd_fresh", "true"));
    assert_ok(kvt_config_set(m->cfg, "io", "threads"));
    assert_ok(kvt_config_set(m->cfg, "block_tokens", "8"));
    assert_ok(kvt_config_set(m->cfg, "huge_pages", "false"));
    assert_ok(kvt_config_set(m->cfg, "memory_check", "false"));
    assert_ok(kvt__cache_create_shared(&m->cache, m->cfg, m->geo, sh));
    assert_ok(kvt_emu_create(&m->emu, m->geo, 128));
    kvt_engine_memory mem;
    assert_ok(kvt_emu_memory(m->emu, &mem));
    assert_ok(kvt_cache_register_memory(m->cache, &mem));
}

static void member_close(member *m)
{
    kvt__cache_destroy(m->cache);
    kvt_emu_destroy(m->emu);
    kvt_config_destroy(m->cfg);
    kvt_geometry_destroy(m->geo);
}

static void request(uint32_t *tokens, uint64_t seed, kvt_request *r)
{
    kvt_test_tokens(tokens, TOKENS, seed);
    kvt_request x = {.tokens = tokens, .num_tokens = TOKENS};
    *r = x;
}

static void pages_at(uint32_t *pages, uint32_t base)
{
    for (uint32_t i = 0; i < PAGES; i++) pages[i] = base + i;
}

static void store(member *m, uint64_t seed)
{
    uint32_t tokens[TOKENS], pages[PAGES];
    kvt_request r;
    request(tokens, seed, &r);
    pages_at(pages, 0);
    assert_ok(kvt_emu_fill(m->emu, &r, 0, r.num_tokens, pages, PAGES));
    kvt_store_plan p;
    assert_ok(kvt_cache_prepare_store(m->cache, &r, &p));
    assert_true(p.task != 0);
    assert_ok(kvt_cache_launch(m->cache, p.task, pages, PAGES));
    kvt_task_result res;
    assert_ok(kvt_cache_wait(m->cache, p.task, WAIT_MS, &res));
    assert_int_equal(res.status, KVT_OK);
    assert_int_equal(res.num_tokens, BLOCKS * BT);
}

/* Tokens of request seed that load into poisoned pages, every byte
 * verified. */
static uint32_t loaded(member *m, uint64_t seed)
{
    uint32_t tokens[TOKENS], pages[PAGES];
    kvt_request r;
    request(tokens, seed, &r);
    pages_at(pages, 64);
    assert_ok(kvt_emu_poison(m->emu, pages, PAGES));
    kvt_match mt;
    assert_ok(kvt_cache_lookup(m->cache, &r, &mt));
    if (!mt.task) return 0;
    assert_ok(kvt_cache_launch(m->cache, mt.task, pages, PAGES));
    kvt_task_result res;
    assert_ok(kvt_cache_wait(m->cache, mt.task, WAIT_MS, &res));
    assert_int_equal(res.status, KVT_OK);
    kvt_verify_result v;
    assert_ok(kvt_emu_verify(m->emu, &r, 0, res.num_tokens, pages, PAGES, &v));
    assert_int_equal(v.mismatches, 0);
    return res.num_tokens;
}

static kvt_cache_stats stats(member *m)
{
    kvt_cache_stats s;
    assert_ok(kvt_cache_stats_get(m->cache, &s));
    return s;
}

/* Holds a member's mutex for hold_ms, as its own threads do briefly (its
 * SSD commit round, a stats read); a slow host stretches those. */
typedef struct holder {
    kvt_cache *c;
    int64_t hold_ms;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool holding;
} holder;

static void *hold(void *arg)
{
    holder *h = arg;
    pthread_mutex_lock(&h->c->mu);
    pthread_mutex_lock(&h->mu);
    h->holding = true;
    pthread_cond_signal(&h->cv);
    pthread_mutex_unlock(&h->mu);
    struct timespec ts = {h->hold_ms / 1000, (h->hold_ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
    pthread_mutex_unlock(&h->c->mu);
    return NULL;
}

static void hold_start(holder *h, pthread_t *th, kvt_cache *c, int64_t ms)
{
    h->c = c;
    h->hold_ms = ms;
    h->holding = false;
    pthread_mutex_init(&h->mu, NULL);
    pthread_cond_init(&h->cv, NULL);
    assert_int_equal(pthread_create(th, NULL, hold, h), 0);
    pthread_mutex_lock(&h->mu);
    while (!h->holding) pthread_cond_wait(&h->cv, &h->mu);
    pthread_mutex_unlock(&h->mu);
}

static void hold_join(holder *h, pthread_t th)
{
    assert_int_equal(pthread_join(th, NULL), 0);
    pthread_cond_destroy(&h->cv);
    pthread_mutex_destroy(&h->mu);
}

/* A (8 KiB blocks) fills the 512 KiB SSD budget with three requests; B
 * (16 KiB blocks) then stores one while A's mutex is held for 800 ms (long
 * enough that B's writes start inside it on a slow host, short of the 2 s
 * B's writer waits for room). B's
 * SSD writer must wait for A and take A's coldest blocks: every B block
 * durable, no write dropped, A's newest request whole, its oldest cut. */
static void test_busy_member_still_gives_ssd_room(void **state)
{
    (void)state;
    char dir[256];
    kvt_test_mkdtemp(dir, sizeof dir, "share-");
    kvt_share *sh = NULL;
    const uint64_t cpu = 4u << 20, ssd = 512u << 10;
    assert_ok(kvt__share_create(&sh, cpu, ssd));
    member a, b;
    member_open(&a, sh, 2, dir, "a", cpu, ssd);
    member_open(&b, sh, 4, dir, "b", cpu, ssd);
    for (uint64_t seed = 1; seed <= 3; seed++) {
        store(&a, seed);
        assert_ok(kvt_cache_flush(a.cache, WAIT_MS));
    }
    assert_int_equal(stats(&a).ssd_blocks_used, 3 * BLOCKS);

    holder h;
    pthread_t th;
    hold_start(&h, &th, a.cache, 800);
    store(&b, 10);
    assert_ok(kvt_cache_flush(b.cache, WAIT_MS));
    hold_join(&h, th);

    kvt_cache_stats sb = stats(&b), sa = stats(&a);
    if (sb.ssd_write_errors || sb.ssd_blocks_used != BLOCKS)
        fail_msg("B's SSD writes while A was busy: %llu of %u blocks on the SSD, %llu dropped "
                 "(A: %llu blocks on the SSD, %llu evicted)",
                 (unsigned long long)sb.ssd_blocks_used, BLOCKS,
                 (unsigned long long)sb.ssd_write_errors, (unsigned long long)sa.ssd_blocks_used,
                 (unsigned long long)sa.evicted_blocks);
    assert_true(sa.evicted_blocks > 0);
    assert_true(sa.ssd_blocks_used * 8192 + sb.ssd_blocks_used * 16384 <= ssd);
    assert_int_equal(loaded(&b, 10), BLOCKS * BT);
    assert_int_equal(loaded(&a, 3), BLOCKS * BT); /* A's newest stays whole */
    assert_true(loaded(&a, 1) < BLOCKS * BT);     /* its coldest gave the room */
    member_close(&b);
    member_close(&a);
    kvt__share_destroy(sh);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_busy_member_still_gives_ssd_room),
    };
    return kvt_test_dirs_done(cmocka_run_group_tests(tests, NULL, NULL));
}
