/* Keyed requests (kvt_request.keys): a request names its blocks by the
 * engine's keys instead of token ids. The emulated engine computes KV from
 * tokens, so each test fills pages from a token request and stores or loads
 * them under keys derived from it; every load is byte-verified against the
 * token request. Also: the prefix property, namespaces, keyed and token
 * chains kept apart, eviction from the tail, restart from the SSD tier, and
 * every argument error with its message. And kvt_cache_peek, for keyed and
 * token requests: lookup's answer with nothing pinned, planned or counted. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support.h"

#define WAIT_MS 10000
#define BT 8 /* block tokens */
#define MAXB 64

typedef struct env {
    kvt_geometry *geo;
    kvt_config *cfg;
    kvt_cache *cache;
    kvt_emu *emu;
    uint32_t tpp, layers;
} env;

/* 3 layers x (K, V) x 2 heads x 16 dims, 4 tokens a page. */
static kvt_geometry *test_geo(void) { return kvt_test_geometry(3, 2, 16, 4, KVT_LAYOUT_LAYER_FIRST); }

static void env_open(env *e, const char *capacity, const char *ssd_dir)
{
    memset(e, 0, sizeof *e);
    e->geo = test_geo();
    e->tpp = 4;
    e->layers = 3;
    assert_ok(kvt_config_create(&e->cfg));
    assert_ok(kvt_config_set(e->cfg, "cpu_capacity", capacity));
    assert_ok(kvt_config_set(e->cfg, "block_tokens", "8"));
    assert_ok(kvt_config_set(e->cfg, "huge_pages", "false"));
    if (ssd_dir) {
        assert_ok(kvt_config_set(e->cfg, "ssd_dirs", ssd_dir));
        assert_ok(kvt_config_set(e->cfg, "ssd_capacity", "16MiB"));
    }
    assert_ok(kvt_cache_create(&e->cache, e->cfg, e->geo));
    assert_ok(kvt_emu_create(&e->emu, e->geo, 1024));
    kvt_engine_memory mem;
    assert_ok(kvt_emu_memory(e->emu, &mem));
    assert_ok(kvt_cache_register_memory(e->cache, &mem));
}

/* An env whose CPU tier holds exactly `blocks` blocks (eviction tests). */
static void env_open_blocks(env *e, uint32_t blocks)
{
    kvt_geometry_info info;
    kvt_geometry *g = test_geo();
    assert_ok(kvt_geometry_info_get(g, &info));
    kvt_geometry_destroy(g);
    char cap[32];
    snprintf(cap, sizeof cap, "%llu", (unsigned long long)blocks * BT * info.bytes_per_token);
    env_open(e, cap, NULL);
}

static void env_close(env *e)
{
    kvt_cache_destroy(e->cache);
    kvt_emu_destroy(e->emu);
    kvt_config_destroy(e->cfg);
    kvt_geometry_destroy(e->geo);
}

/* A chain of string keys, one per block, as SGLang's page hashes are. */
typedef struct chain {
    char text[MAXB][32];
    kvt_key keys[MAXB];
    uint32_t tokens[MAXB * BT];
    uint32_t n;
} chain;

static void chain_make(chain *c, uint32_t n, uint64_t seed)
{
    assert_true(n <= MAXB);
    c->n = n;
    kvt_test_tokens(c->tokens, n * BT, seed);
    for (uint32_t i = 0; i < n; i++) {
        snprintf(c->text[i], sizeof c->text[i], "page-%llu-%u", (unsigned long long)seed, i);
        c->keys[i] = (kvt_key){c->text[i], (uint32_t)strlen(c->text[i])};
    }
}

static kvt_request keyed(const chain *c, uint32_t n, const char *ns)
{
    kvt_request r = {.keys = c->keys, .num_keys = n};
    if (ns) {
        r.ns = ns;
        r.ns_len = (uint32_t)strlen(ns);
    }
    return r;
}

static kvt_request tokens_of(const chain *c, uint32_t n)
{
    return (kvt_request){.tokens = c->tokens, .num_tokens = n * BT};
}

static void pages_from(uint32_t *pages, uint32_t n, uint32_t base)
{
    for (uint32_t i = 0; i < n; i++) pages[i] = base + i;
}

/* Computes the chain's first n blocks into pages at page_base and stores them
 * under their keys; returns the tokens stored. */
static uint32_t store_keys(env *e, const chain *c, uint32_t n, const char *ns, uint32_t page_base)
{
    uint32_t np = n * BT / e->tpp, pages[MAXB * BT];
    pages_from(pages, np, page_base);
    kvt_request t = tokens_of(c, n);
    assert_ok(kvt_emu_fill(e->emu, &t, 0, n * BT, pages, np));
    kvt_request r = keyed(c, n, ns);
    kvt_store_plan p;
    assert_ok(kvt_cache_prepare_store(e->cache, &r, &p));
    if (p.task == 0) return 0;
    assert_ok(kvt_cache_launch(e->cache, p.task, pages, np));
    kvt_task_result res;
    assert_ok(kvt_cache_wait(e->cache, p.task, WAIT_MS, &res));
    assert_int_equal(res.status, KVT_OK);
    return p.num_tokens;
}

/* Looks the first n keys up and loads them into poisoned pages layer by
 * layer; verifies every loaded byte against the chain's tokens. */
static uint32_t load_keys(env *e, const chain *c, uint32_t n, const char *ns, uint32_t page_base)
{
    uint32_t np = n * BT / e->tpp, pages[MAXB * BT];
    pages_from(pages, np, page_base);
    assert_ok(kvt_emu_poison(e->emu, pages, np));
    kvt_request r = keyed(c, n, ns);
    kvt_match m;
    assert_ok(kvt_cache_lookup(e->cache, &r, &m));
    if (m.task == 0) {
        assert_int_equal(m.matched_tokens, 0);
        return 0;
    }
    assert_int_equal(m.matched_tokens % BT, 0);
    assert_ok(kvt_cache_launch(e->cache, m.task, pages, np));
    for (uint32_t l = 0; l < e->layers; l++)
        assert_ok(kvt_cache_wait_layer(e->cache, m.task, l, WAIT_MS));
    kvt_task_result res;
    assert_ok(kvt_cache_wait(e->cache, m.task, WAIT_MS, &res));
    assert_int_equal(res.status, KVT_OK);
    assert_int_equal(res.num_tokens, m.matched_tokens);
    kvt_request t = tokens_of(c, n);
    kvt_verify_result v;
    assert_ok(kvt_emu_verify(e->emu, &t, 0, m.matched_tokens, pages, np, &v));
    assert_int_equal(v.mismatches, 0);
    assert_int_equal(v.bytes_checked, (uint64_t)m.matched_tokens * 3 * 2 * 2 * 16 * 2);
    return m.matched_tokens;
}

/* Store and load by keys; a keyed lookup may match every key. */
static void test_keyed_roundtrip_matches_every_key(void **state)
{
    (void)state;
    env e;
    env_open(&e, "4MiB", NULL);
    chain c;
    chain_make(&c, 10, 1);
    assert_int_equal(load_keys(&e, &c, 10, NULL, 0), 0);
    assert_int_equal(store_keys(&e, &c, 6, NULL, 0), 6 * BT);
    /* Storing more keys stores only the new tail. */
    assert_int_equal(store_keys(&e, &c, 10, NULL, 100), 4 * BT);
    assert_int_equal(load_keys(&e, &c, 10, NULL, 300), 10 * BT);
    assert_int_equal(load_keys(&e, &c, 3, NULL, 400), 3 * BT);
    /* num_tokens may be given when it agrees with the keys. */
    kvt_request r = keyed(&c, 4, NULL);
    r.num_tokens = 4 * BT;
    kvt_match m;
    assert_ok(kvt_cache_lookup(e.cache, &r, &m));
    assert_int_equal(m.matched_tokens, 4 * BT);
    assert_ok(kvt_cache_cancel(e.cache, m.task));
    kvt_cache_stats s;
    assert_ok(kvt_cache_stats_get(e.cache, &s));
    assert_int_equal(s.stored_blocks, 10);
    env_close(&e);
}

/* Key i's parent is key i-1: a chain that differs at key k matches only the
 * first k blocks, and one that differs at key 0 matches nothing. */
static void test_keyed_prefix_property(void **state)
{
    (void)state;
    env e;
    env_open(&e, "4MiB", NULL);
    chain c, d;
    chain_make(&c, 8, 2);
    assert_int_equal(store_keys(&e, &c, 8, NULL, 0), 8 * BT);
    d = c; /* same keys and tokens ... */
    for (uint32_t i = 0; i < d.n; i++) d.keys[i].data = d.text[i];
    snprintf(d.text[5], sizeof d.text[5], "other-5");
    d.keys[5].len = (uint32_t)strlen(d.text[5]);
    assert_int_equal(load_keys(&e, &d, 8, NULL, 100), 5 * BT);
    /* The same key bytes at another position are another block. */
    chain shifted = c;
    for (uint32_t i = 0; i < 7; i++) shifted.keys[i] = c.keys[i + 1];
    shifted.n = 7;
    kvt_request r = keyed(&shifted, 7, NULL);
    kvt_match m;
    assert_ok(kvt_cache_lookup(e.cache, &r, &m));
    assert_int_equal(m.matched_tokens, 0);
    /* Equal bytes, different length: a key is its exact bytes. */
    chain p = c;
    for (uint32_t i = 0; i < p.n; i++) p.keys[i].data = p.text[i];
    p.keys[0].len--;
    r = keyed(&p, 8, NULL);
    assert_ok(kvt_cache_lookup(e.cache, &r, &m));
    assert_int_equal(m.matched_tokens, 0);
    env_close(&e);
}

/* Namespaces never share keyed blocks, and keyed chains never meet token
 * chains (even where the key bytes equal the token bytes). */
static void test_keyed_namespaces_and_token_chains_apart(void **state)
{
    (void)state;
    env e;
    env_open(&e, "4MiB", NULL);
    chain c;
    chain_make(&c, 6, 3);
    assert_int_equal(store_keys(&e, &c, 6, "model-a", 0), 6 * BT);
    assert_int_equal(load_keys(&e, &c, 6, "model-b", 100), 0);
    assert_int_equal(load_keys(&e, &c, 6, NULL, 100), 0);
    assert_int_equal(load_keys(&e, &c, 6, "model-a", 100), 6 * BT);
    /* A token request whose blocks' bytes are the key bytes. */
    uint32_t tok[6 * BT];
    chain raw;
    chain_make(&raw, 6, 4);
    for (uint32_t i = 0; i < 6; i++) {
        raw.keys[i] = (kvt_key){&tok[i * BT], BT * sizeof(uint32_t)};
        for (uint32_t j = 0; j < BT; j++) tok[i * BT + j] = i * 1000 + j;
    }
    assert_int_equal(store_keys(&e, &raw, 6, NULL, 200), 6 * BT);
    kvt_request t = {.tokens = tok, .num_tokens = 6 * BT + 1};
    kvt_match m;
    assert_ok(kvt_cache_lookup(e.cache, &t, &m));
    assert_int_equal(m.matched_tokens, 0);
    env_close(&e);
}

/* Eviction takes keyed chains from the tail: what is left still loads. */
static void test_keyed_eviction_keeps_prefixes(void **state)
{
    (void)state;
    env e;
    env_open_blocks(&e, 16);
    chain a, b;
    chain_make(&a, 10, 5);
    chain_make(&b, 10, 6);
    assert_int_equal(store_keys(&e, &a, 10, NULL, 0), 10 * BT);
    assert_int_equal(store_keys(&e, &b, 10, NULL, 100), 10 * BT);
    assert_int_equal(load_keys(&e, &a, 10, NULL, 200), 6 * BT);
    assert_int_equal(load_keys(&e, &b, 10, NULL, 300), 10 * BT);
    env_close(&e);
}

/* A keyed block's identity is its chain hash, so the SSD tier brings keyed
 * blocks back after a restart. */
static void test_keyed_blocks_survive_restart(void **state)
{
    (void)state;
    const char *base = getenv("KVTIER_TEST_TMP");
    if (!base || !*base) base = "/tmp";
    char dir[256], cmd[300];
    snprintf(cmd, sizeof cmd, "mkdir -p %s", base);
    assert_int_equal(system(cmd), 0);
    snprintf(dir, sizeof dir, "%s/keys-XXXXXX", base);
    assert_non_null(mkdtemp(dir));
    chain c;
    chain_make(&c, 5, 7);
    env e;
    env_open(&e, "4MiB", dir);
    assert_int_equal(store_keys(&e, &c, 5, "ns", 0), 5 * BT);
    assert_ok(kvt_cache_flush(e.cache, WAIT_MS));
    env_close(&e);
    env_open(&e, "4MiB", dir);
    kvt_cache_stats s;
    assert_ok(kvt_cache_stats_get(e.cache, &s));
    assert_int_equal(s.recovered_blocks, 5);
    /* Only on the SSD now: a load reads them back, so a peek counts them. */
    kvt_request r = keyed(&c, 5, "ns");
    uint32_t peeked = 0;
    assert_ok(kvt_cache_peek(e.cache, &r, &peeked));
    assert_int_equal(peeked, 5 * BT);
    assert_ok(kvt_cache_stats_get(e.cache, &s));
    assert_int_equal(s.ssd_hit_tokens + s.ssd_read_blocks + s.lookups, 0); /* nothing read */
    assert_int_equal(load_keys(&e, &c, 5, "ns", 100), 5 * BT);
    env_close(&e);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

/* Stores the chain's first n blocks as a token request of num_tokens
 * tokens (>= n * BT) from pages at page_base; returns the tokens stored. */
static uint32_t store_tokens(env *e, const chain *c, uint32_t num_tokens, uint32_t page_base)
{
    uint32_t np = (num_tokens + e->tpp - 1) / e->tpp, pages[MAXB * BT];
    pages_from(pages, np, page_base);
    kvt_request t = {.tokens = c->tokens, .num_tokens = num_tokens};
    assert_ok(kvt_emu_fill(e->emu, &t, 0, num_tokens, pages, np));
    kvt_store_plan p;
    assert_ok(kvt_cache_prepare_store(e->cache, &t, &p));
    if (p.task == 0) return 0;
    assert_ok(kvt_cache_launch(e->cache, p.task, pages, np));
    kvt_task_result res;
    assert_ok(kvt_cache_wait(e->cache, p.task, WAIT_MS, &res));
    assert_int_equal(res.status, KVT_OK);
    return p.num_tokens;
}

/* kvt_cache_peek's answer for r, checked against a lookup of r (cancelled). */
static uint32_t peek_as_lookup(env *e, const kvt_request *r)
{
    uint32_t peeked = 77;
    assert_ok(kvt_cache_peek(e->cache, r, &peeked));
    kvt_match m;
    assert_ok(kvt_cache_lookup(e->cache, r, &m));
    assert_int_equal(m.matched_tokens, peeked);
    if (m.task) assert_ok(kvt_cache_cancel(e->cache, m.task));
    return peeked;
}

/* A peek answers as lookup would, for keyed and token requests and per
 * namespace, and counts, plans and pins nothing. */
static void test_peek_answers_as_lookup(void **state)
{
    (void)state;
    env e;
    env_open(&e, "4MiB", NULL);
    chain c;
    chain_make(&c, 10, 21);
    kvt_request r = keyed(&c, 10, "model-a");
    assert_int_equal(peek_as_lookup(&e, &r), 0);
    assert_int_equal(store_keys(&e, &c, 6, "model-a", 0), 6 * BT);
    kvt_cache_stats before, after;
    assert_ok(kvt_cache_stats_get(e.cache, &before));
    uint32_t peeked = 0;
    for (uint32_t n = 0; n <= 10; n++) { /* a keyed request may match every key */
        r = keyed(&c, n, "model-a");
        assert_ok(kvt_cache_peek(e.cache, &r, &peeked));
        assert_int_equal(peeked, (n < 6 ? n : 6) * BT);
    }
    assert_ok(kvt_cache_stats_get(e.cache, &after));
    assert_int_equal(after.lookups, before.lookups);
    assert_int_equal(after.lookup_tokens, before.lookup_tokens);
    assert_int_equal(after.hit_tokens, before.hit_tokens);
    assert_int_equal(after.tasks_in_flight, 0);
    r = keyed(&c, 10, "model-a");
    assert_int_equal(peek_as_lookup(&e, &r), 6 * BT);
    r = keyed(&c, 10, "model-b"); /* namespaces apart */
    assert_int_equal(peek_as_lookup(&e, &r), 0);
    r = keyed(&c, 10, NULL);
    assert_int_equal(peek_as_lookup(&e, &r), 0);
    kvt_request t = tokens_of(&c, 10); /* a keyed chain never meets a token chain */
    t.num_tokens++;
    assert_int_equal(peek_as_lookup(&e, &t), 0);

    /* Token requests: the last token is never matched. */
    chain d;
    chain_make(&d, 8, 22);
    assert_int_equal(store_tokens(&e, &d, 5 * BT, 100), 5 * BT);
    t = tokens_of(&d, 5);
    assert_int_equal(peek_as_lookup(&e, &t), 4 * BT);
    t.num_tokens = 5 * BT + 1;
    assert_int_equal(peek_as_lookup(&e, &t), 5 * BT);
    t.num_tokens = 8 * BT;
    assert_int_equal(peek_as_lookup(&e, &t), 5 * BT);
    t.num_tokens = BT; /* one block: its last token left to the engine */
    assert_int_equal(peek_as_lookup(&e, &t), 0);
    t.ns = "x"; /* another namespace */
    t.ns_len = 1;
    t.num_tokens = 8 * BT;
    assert_int_equal(peek_as_lookup(&e, &t), 0);
    kvt_request empty = {0};
    assert_int_equal(peek_as_lookup(&e, &empty), 0);
    env_close(&e);
}

/* A peeked chain is not pinned: a store that needs its room evicts it
 * (had the peek pinned A's 10 blocks, B could take only 6 of the 16). */
static void test_peek_pins_nothing(void **state)
{
    (void)state;
    env e;
    env_open_blocks(&e, 16);
    chain a, b;
    chain_make(&a, 10, 23);
    chain_make(&b, 10, 24);
    assert_int_equal(store_keys(&e, &a, 10, NULL, 0), 10 * BT);
    kvt_request ra = keyed(&a, 10, NULL), rb = keyed(&b, 10, NULL);
    uint32_t peeked = 0;
    assert_ok(kvt_cache_peek(e.cache, &ra, &peeked));
    assert_int_equal(peeked, 10 * BT);
    assert_int_equal(store_keys(&e, &b, 10, NULL, 100), 10 * BT);
    assert_ok(kvt_cache_peek(e.cache, &ra, &peeked)); /* stale now: a lost its tail */
    assert_int_equal(peeked, 6 * BT);
    assert_ok(kvt_cache_peek(e.cache, &rb, &peeked));
    assert_int_equal(peeked, 10 * BT);
    assert_int_equal(load_keys(&e, &a, 10, NULL, 200), 6 * BT);
    kvt_cache_stats s;
    assert_ok(kvt_cache_stats_get(e.cache, &s));
    assert_int_equal(s.evicted_blocks, 4);
    assert_int_equal(s.lookups, 1); /* load_keys' own */
    assert_int_equal(s.tasks_in_flight, 0);
    env_close(&e);
}

static void expect_error(kvt_cache *cache, const kvt_request *r, const char *want)
{
    kvt_match m = {77, 77};
    kvt_store_plan p = {77, 77, 77};
    kvt_status st = kvt_cache_lookup(cache, r, &m);
    if (st != KVT_EINVAL || !strstr(kvt_last_error(), "kvt_cache_lookup: ") ||
        !strstr(kvt_last_error(), want))
        fail_msg("lookup: %s (%s), want KVT_EINVAL with \"%s\"", kvt_status_name(st),
                 kvt_last_error(), want);
    assert_int_equal(m.task, 77); /* out-params untouched on failure */
    assert_true(strstr(kvt_cache_last_error(cache), want) != NULL);
    uint32_t peeked = 77;
    st = kvt_cache_peek(cache, r, &peeked);
    if (st != KVT_EINVAL || !strstr(kvt_last_error(), "kvt_cache_peek: ") ||
        !strstr(kvt_last_error(), want))
        fail_msg("peek: %s (%s), want KVT_EINVAL with \"%s\"", kvt_status_name(st),
                 kvt_last_error(), want);
    assert_int_equal(peeked, 77);
    st = kvt_cache_prepare_store(cache, r, &p);
    if (st != KVT_EINVAL || !strstr(kvt_last_error(), "kvt_cache_prepare_store: ") ||
        !strstr(kvt_last_error(), want))
        fail_msg("prepare_store: %s (%s), want KVT_EINVAL with \"%s\"", kvt_status_name(st),
                 kvt_last_error(), want);
    assert_int_equal(p.task, 77);
}

static void test_keyed_errors_name_index_and_field(void **state)
{
    (void)state;
    env e;
    env_open(&e, "4MiB", NULL);
    chain c;
    chain_make(&c, 4, 8);
    kvt_request r = keyed(&c, 4, NULL);

    c.keys[2].data = NULL;
    expect_error(e.cache, &r, "req->keys[2].data is NULL");
    c.keys[2].data = c.text[2];
    c.keys[3].len = 0;
    expect_error(e.cache, &r, "req->keys[3].len is 0 (1..256 bytes)");
    char big[300];
    memset(big, 'x', sizeof big);
    c.keys[1] = (kvt_key){big, 257};
    c.keys[3].len = 3;
    expect_error(e.cache, &r, "req->keys[1].len is 257 (1..256 bytes)");
    c.keys[1] = (kvt_key){big, 256}; /* the longest key is fine */
    kvt_match m;
    assert_ok(kvt_cache_lookup(e.cache, &r, &m));
    assert_int_equal(m.matched_tokens, 0);

    r.tokens = c.tokens;
    expect_error(e.cache, &r, "req->keys and req->tokens are both set");
    r.tokens = NULL;
    r.num_tokens = 5;
    expect_error(e.cache, &r, "num_tokens is 5 but a keyed request covers num_keys * "
                 "block_tokens = 32 tokens");
    r.num_tokens = 0;
    r.num_keys = KVT_MAX_KEYS + 1;
    expect_error(e.cache, &r, "num_keys is 1048577 (at most 1048576)");
    kvt_request nokeys = {.num_keys = 3};
    expect_error(e.cache, &nokeys, "req->keys is NULL but num_keys is 3");
    kvt_request badns = keyed(&c, 1, NULL);
    badns.ns_len = 4;
    expect_error(e.cache, &badns, "req->ns is NULL but ns_len is 4");

    /* An empty keyed request is valid and matches nothing. */
    kvt_request empty = {.keys = c.keys, .num_keys = 0};
    assert_ok(kvt_cache_lookup(e.cache, &empty, &m));
    assert_int_equal(m.task, 0);
    kvt_store_plan p;
    assert_ok(kvt_cache_prepare_store(e.cache, &empty, &p));
    assert_int_equal(p.task, 0);
    env_close(&e);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_keyed_roundtrip_matches_every_key),
        cmocka_unit_test(test_keyed_prefix_property),
        cmocka_unit_test(test_keyed_namespaces_and_token_chains_apart),
        cmocka_unit_test(test_keyed_eviction_keeps_prefixes),
        cmocka_unit_test(test_keyed_blocks_survive_restart),
        cmocka_unit_test(test_keyed_errors_name_index_and_field),
        cmocka_unit_test(test_peek_answers_as_lookup),
        cmocka_unit_test(test_peek_pins_nothing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
