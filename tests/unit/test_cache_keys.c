/* Keyed requests (kvt_request.keys): a request names its blocks by the
 * engine's keys instead of token ids. The emulated engine computes KV from
 * tokens, so each test fills pages from a token request and stores or loads
 * them under keys derived from it; every load is byte-verified against the
 * token request. Also: the prefix property, namespaces, keyed and token
 * chains kept apart, eviction from the tail, restart from the SSD tier, and
 * every argument error with its message. And kvt_cache_peek, for keyed and
 * token requests: lookup's answer with nothing pinned, planned or counted.
 * And independent keys (KVT_REQ_INDEPENDENT_KEYS), in process and through a
 * node server: each key the block of a one-key request of it, leading-run
 * lookups, store plans that stop at the next stored or pending key, blocks
 * evicted one by one, and the flags' argument errors. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "support.h"

#define WAIT_MS 10000
#define BT 8 /* block tokens */
#define MAXB 64

typedef struct env {
    kvt_geometry *geo;
    kvt_config *cfg;
    kvt_cache *cache;
    kvt_client *client; /* set: the independent-keys tests go through a server */
    kvt_emu *emu;
    uint32_t tpp, layers;
    pid_t server;
    char dir[200];
} env;

/* 3 layers x (K, V) x 2 heads x 16 dims, 4 tokens a page. */
static kvt_geometry *test_geo(void) { return kvt_test_geometry(3, 2, 16, 4, KVT_LAYOUT_LAYER_FIRST); }

/* The geometry and config of an env, before anything starts a thread. */
static void env_config(env *e, const char *capacity, const char *ssd_dir)
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
}

/* The in-process cache (its copy threads start here) and the engine pages. */
static void env_start(env *e)
{
    assert_ok(kvt_cache_create(&e->cache, e->cfg, e->geo));
    assert_ok(kvt_emu_create(&e->emu, e->geo, 1024));
    kvt_engine_memory mem;
    assert_ok(kvt_emu_memory(e->emu, &mem));
    assert_ok(kvt_cache_register_memory(e->cache, &mem));
}

static void env_open(env *e, const char *capacity, const char *ssd_dir)
{
    env_config(e, capacity, ssd_dir);
    env_start(e);
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

/* ---- independent keys ---- */

/* The env's calls: in process, or through its client. */
static kvt_test_side side_of(const env *e)
{
    return (kvt_test_side){e->client ? NULL : e->cache, e->client};
}
static kvt_status e_lookup(env *e, const kvt_request *r, kvt_match *m)
{
    kvt_test_side s = side_of(e);
    return kvt_test_lookup(&s, r, m);
}
static kvt_status e_peek(env *e, const kvt_request *r, uint32_t *n)
{
    kvt_test_side s = side_of(e);
    return kvt_test_peek(&s, r, n);
}
static kvt_status e_prepare(env *e, const kvt_request *r, kvt_store_plan *p)
{
    kvt_test_side s = side_of(e);
    return kvt_test_prepare(&s, r, p);
}
static void e_run(env *e, kvt_task_id t, const uint32_t *pages, uint32_t np)
{
    kvt_test_side s = side_of(e);
    kvt_task_result res;
    assert_ok(kvt_test_launch(&s, t, pages, np));
    assert_ok(kvt_test_wait(&s, t, WAIT_MS, &res));
    assert_int_equal(res.status, KVT_OK);
}
static void e_cancel(env *e, kvt_task_id t)
{
    kvt_test_side s = side_of(e);
    kvt_task_result res;
    assert_ok(kvt_test_cancel(&s, t));
    assert_ok(kvt_test_wait(&s, t, WAIT_MS, &res));
}

static kvt_status make_server(kvt_server **out, void *arg)
{
    env *e = arg;
    char sock[240];
    snprintf(sock, sizeof sock, "%s/s.sock", e->dir);
    kvt_status st = kvt_config_set(e->cfg, "server_socket", sock);
    if (!st) st = kvt_server_create(out, e->cfg, e->geo);
    return st;
}

/* An env whose calls go through a forked node server (same config). */
static void env_open_server(env *e)
{
    /* The server is forked before this process starts any thread (see
     * kvt_test_fork). */
    env_config(e, "4MiB", NULL);
    kvt_test_mkdtemp(e->dir, sizeof e->dir, "keys-srv");
    e->server = kvt_test_server_fork(make_server, e);
    env_start(e);
    char sock[240];
    snprintf(sock, sizeof sock, "%s/s.sock", e->dir);
    assert_ok(kvt_client_attach(&e->client, sock, e->geo, WAIT_MS));
    kvt_engine_memory mem;
    assert_ok(kvt_emu_memory(e->emu, &mem));
    assert_ok(kvt_client_register_memory(e->client, &mem));
}

static void env_close_server(env *e)
{
    kvt_client_detach(e->client);
    e->client = NULL;
    kvt_test_server_stop(e->server, WAIT_MS);
    char cmd[260];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", e->dir);
    assert_int_equal(system(cmd), 0);
    env_close(e);
}

/* Fills every page of the chain's n blocks (pages base + token / tpp) from
 * its token request: block i's bytes are what a one-key store of key i
 * from those pages writes. */
static void fill_chain(env *e, const chain *c, uint32_t n, uint32_t base)
{
    uint32_t np = n * BT / e->tpp, pages[MAXB * BT];
    pages_from(pages, np, base);
    kvt_request t = tokens_of(c, n);
    assert_ok(kvt_emu_fill(e->emu, &t, 0, n * BT, pages, np));
}

/* The pages of chain block b, in a page table indexed by chain tokens. */
static uint32_t block_page(const env *e, uint32_t b, uint32_t j, uint32_t base)
{
    return base + b * (BT / e->tpp) + j;
}

/* Independent request of the chain's blocks which[0..n). */
static kvt_request indep(const chain *c, const uint32_t *which, uint32_t n, kvt_key *keys)
{
    for (uint32_t i = 0; i < n; i++) keys[i] = c->keys[which[i]];
    return (kvt_request){.keys = keys, .num_keys = n, .flags = KVT_REQ_INDEPENDENT_KEYS};
}

/* Stores request blocks [plan first, + num) of r (chain blocks which[...])
 * from the chain's filled pages at base. */
static void store_plan(env *e, const kvt_store_plan *p, const uint32_t *which, uint32_t n,
                       uint32_t base)
{
    uint32_t ppb = BT / e->tpp, pages[MAXB * BT];
    for (uint32_t i = 0; i < n; i++)
        for (uint32_t j = 0; j < ppb; j++) pages[i * ppb + j] = block_page(e, which[i], j, base);
    e_run(e, p->task, pages, n * ppb);
}

/* Loads the independent request of which[0..n) into poisoned pages at
 * dst and verifies each matched block against chain block which[i];
 * returns the tokens matched. */
static uint32_t load_indep(env *e, const chain *c, const uint32_t *which, uint32_t n,
                           uint32_t dst)
{
    uint32_t ppb = BT / e->tpp, pages[MAXB * BT];
    kvt_key keys[MAXB];
    kvt_request r = indep(c, which, n, keys);
    pages_from(pages, n * ppb, dst);
    assert_ok(kvt_emu_poison(e->emu, pages, n * ppb));
    kvt_match m;
    assert_ok(e_lookup(e, &r, &m));
    if (m.task) e_run(e, m.task, pages, n * ppb);
    kvt_request t = tokens_of(c, c->n);
    for (uint32_t i = 0; i < m.matched_tokens / BT; i++) {
        /* chain block which[i] landed in request pages [i ppb, (i+1) ppb) */
        uint32_t table[MAXB * BT];
        for (uint32_t j = 0; j < ppb; j++) table[which[i] * ppb + j] = pages[i * ppb + j];
        kvt_verify_result v;
        assert_ok(kvt_emu_verify(e->emu, &t, which[i] * BT, BT, table, c->n * ppb, &v));
        assert_int_equal(v.mismatches, 0);
        assert_true(v.bytes_checked > 0);
    }
    return m.matched_tokens;
}

/* One-key store of chain block b (from its filled pages at base). */
static void store_one(env *e, const chain *c, uint32_t b, uint32_t base)
{
    kvt_key k[1];
    uint32_t which[1] = {b};
    kvt_request r = {.keys = k, .num_keys = 1};
    k[0] = c->keys[b];
    kvt_store_plan p;
    assert_ok(e_prepare(e, &r, &p));
    assert_int_not_equal(p.task, 0);
    assert_int_equal(p.first_token, 0);
    assert_int_equal(p.num_tokens, BT);
    store_plan(e, &p, which, 1, base);
}

static uint32_t peek_one(env *e, const chain *c, uint32_t b)
{
    kvt_key k[1] = {c->keys[b]};
    kvt_request r = {.keys = k, .num_keys = 1};
    uint32_t n = 99;
    assert_ok(e_peek(e, &r, &n));
    return n;
}

/* Each key names the block of a one-key request of it: stored one by one,
 * found together; stored together, found one by one; leading runs; plans
 * that end at the next stored or pending key. */
static void independent_keys(env *e)
{
    chain c;
    chain_make(&c, 16, 77);
    fill_chain(e, &c, 16, 0);
    /* One by one (0, 1, 3), then together. */
    store_one(e, &c, 0, 0);
    store_one(e, &c, 1, 0);
    store_one(e, &c, 3, 0);
    uint32_t w5[5] = {0, 1, 2, 3, 4}, got;
    kvt_key keys[MAXB];
    kvt_request r = indep(&c, w5, 5, keys);
    assert_ok(e_peek(e, &r, &got));
    assert_int_equal(got, 2 * BT); /* the leading run: key 2 is missing */
    assert_int_equal(load_indep(e, &c, w5, 5, 500), 2 * BT);
    uint32_t w3[3] = {3, 0, 1}; /* any order: each key stands alone */
    assert_int_equal(load_indep(e, &c, w3, 3, 520), 3 * BT);
    /* A chained request of the same keys: its first block is a root (a
     * one-key request), its second chains to it, so only the first is
     * found. */
    kvt_request chained = keyed(&c, 2, NULL);
    assert_ok(e_peek(e, &chained, &got));
    assert_int_equal(got, BT);

    /* The plan covers key 2 alone (key 3 is stored), then key 4. */
    kvt_store_plan p;
    assert_ok(e_prepare(e, &r, &p));
    assert_int_not_equal(p.task, 0);
    assert_int_equal(p.first_token, 2 * BT);
    assert_int_equal(p.num_tokens, BT);
    store_plan(e, &p, w5, 5, 0);
    kvt_request rest = indep(&c, w5 + 3, 2, keys); /* keys after the plan: 3, 4 */
    assert_ok(e_prepare(e, &rest, &p));
    assert_int_equal(p.first_token, BT);
    assert_int_equal(p.num_tokens, BT);
    store_plan(e, &p, w5 + 3, 2, 0);
    r = indep(&c, w5, 5, keys);
    assert_int_equal(load_indep(e, &c, w5, 5, 540), 5 * BT);

    /* Together (5..9) in one plan, then found one by one. */
    uint32_t w10[10] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
    r = indep(&c, w10, 10, keys);
    assert_ok(e_prepare(e, &r, &p));
    assert_int_equal(p.first_token, 5 * BT);
    assert_int_equal(p.num_tokens, 5 * BT);
    store_plan(e, &p, w10, 10, 0);
    for (uint32_t b = 0; b < 10; b++) assert_int_equal(peek_one(e, &c, b), BT);
    assert_int_equal(load_indep(e, &c, w10, 10, 600), 10 * BT);

    /* A key being stored by another task ends the plan before it, and a
     * plan that starts on it is empty (first_token says where). */
    kvt_key k12[1] = {c.keys[12]};
    kvt_request one12 = {.keys = k12, .num_keys = 1};
    kvt_store_plan pend;
    assert_ok(e_prepare(e, &one12, &pend));
    assert_int_not_equal(pend.task, 0);
    uint32_t w4[4] = {10, 11, 12, 13};
    r = indep(&c, w4, 4, keys);
    assert_ok(e_prepare(e, &r, &p));
    assert_int_equal(p.first_token, 0);
    assert_int_equal(p.num_tokens, 2 * BT); /* 10, 11: stops before pending 12 */
    store_plan(e, &p, w4, 4, 0);
    assert_ok(e_prepare(e, &r, &p));
    assert_int_equal(p.task, 0);
    assert_int_equal(p.first_token, 2 * BT);
    e_cancel(e, pend.task); /* 12 is free again: the plan takes 12 and 13 */
    assert_ok(e_prepare(e, &r, &p));
    assert_int_equal(p.first_token, 2 * BT);
    assert_int_equal(p.num_tokens, 2 * BT);
    store_plan(e, &p, w4, 4, 0);
    assert_int_equal(load_indep(e, &c, w4, 4, 700), 4 * BT);

    /* A key repeated in the run ends it before the repeat (a block is
     * inserted once); once stored, the repeat is a hit like any other. */
    uint32_t wd[3] = {14, 15, 14};
    r = indep(&c, wd, 3, keys);
    assert_ok(e_prepare(e, &r, &p));
    assert_int_equal(p.first_token, 0);
    assert_int_equal(p.num_tokens, 2 * BT);
    store_plan(e, &p, wd, 3, 0);
    assert_ok(e_prepare(e, &r, &p));
    assert_int_equal(p.task, 0);
    assert_int_equal(p.first_token, 3 * BT); /* all three stored */
    assert_int_equal(load_indep(e, &c, wd, 3, 720), 3 * BT);
}

static void test_independent_keys_in_process(void **state)
{
    (void)state;
    env e;
    env_open(&e, "4MiB", NULL);
    independent_keys(&e);
    env_close(&e);
}

static void test_independent_keys_through_a_server(void **state)
{
    (void)state;
    env e;
    env_open_server(&e);
    independent_keys(&e);
    env_close_server(&e);
}

/* Independent blocks have no parent: eviction takes any of them first (a
 * chained request's middle block would outlive its tail). */
static void test_independent_blocks_evicted_one_by_one(void **state)
{
    (void)state;
    env e;
    env_open_blocks(&e, 4);
    chain c;
    chain_make(&c, 8, 5);
    fill_chain(&e, &c, 8, 0);
    uint32_t w4[4] = {0, 1, 2, 3};
    kvt_key keys[MAXB];
    kvt_request r = indep(&c, w4, 4, keys);
    kvt_store_plan p;
    assert_ok(kvt_cache_prepare_store(e.cache, &r, &p));
    assert_int_equal(p.num_tokens, 4 * BT);
    store_plan(&e, &p, w4, 4, 0);
    /* Use 0, 2 and 3 (a lookup and a cancel each): block 1 is the least
     * recently used, in the middle of the request. */
    uint32_t used[3] = {0, 2, 3};
    for (uint32_t i = 0; i < 3; i++) {
        kvt_key k[1] = {c.keys[used[i]]};
        kvt_request one = {.keys = k, .num_keys = 1};
        kvt_match m;
        assert_ok(kvt_cache_lookup(e.cache, &one, &m));
        assert_int_equal(m.matched_tokens, BT);
        e_cancel(&e, m.task);
    }
    store_one(&e, &c, 4, 0); /* room for one: block 1 goes */
    assert_int_equal(peek_one(&e, &c, 1), 0);
    for (uint32_t b = 0; b < 5; b++)
        if (b != 1) assert_int_equal(peek_one(&e, &c, b), BT);
    uint32_t got;
    assert_ok(kvt_cache_peek(e.cache, &r, &got));
    assert_int_equal(got, BT); /* 0, then 1 is missing */
    env_close(&e);
}

static void test_request_flags_errors(void **state)
{
    (void)state;
    env e;
    env_open(&e, "4MiB", NULL);
    chain c;
    chain_make(&c, 2, 9);
    kvt_request r = tokens_of(&c, 2);
    r.flags = KVT_REQ_INDEPENDENT_KEYS;
    expect_error(e.cache, &r, "req->flags is 0x1, but flags other than KVT_REQ_VISIBLE_AT_END "
                 "apply to keyed requests and req->keys is NULL");
    kvt_request k = keyed(&c, 2, NULL);
    k.flags = 0xc | KVT_REQ_INDEPENDENT_KEYS;
    expect_error(e.cache, &k, "req->flags is 0xd; 0xc are not KVT_REQ_* bits");
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
        cmocka_unit_test(test_independent_keys_in_process),
        cmocka_unit_test_teardown(test_independent_keys_through_a_server, kvt_test_servers_kill),
        cmocka_unit_test(test_independent_blocks_evicted_one_by_one),
        cmocka_unit_test(test_request_flags_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
