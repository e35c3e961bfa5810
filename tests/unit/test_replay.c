/* test_replay.c - `kvtier replay`'s index-only simulation (tools/replay_sim.c
 * over the real src/index) against a straightforward reference of the same
 * rules written here, on the shared Mooncake trace and on generated traces,
 * plus the trace reader's error messages.
 *
 * Expected relations:
 *  - unbounded: identical counts (any correct cache holds everything);
 *  - bounded LRU: the index evicts only leaves, least recently used first.
 *    The reference is a plain LRU over blocks where a request stamps every
 *    block it touches with its own time and ties go to the deeper block.
 *    A parent is touched whenever its child is, so its stamp is never older
 *    and on a tie it goes later: plain LRU then only ever evicts leaves, and
 *    the two agree EXACTLY (asserted) whenever a request fits in the cache.
 *    (A plain LRU that stamps blocks in prefix order would evict parents
 *    first and lose whole prefixes; that is the effect leaf eviction avoids.)
 * The tool sources are compiled into this test (the CLI is not a library). */
#include "support.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "trace.h"
#include "replay_sim.h"

typedef struct ref_lru {
    uint32_t cap, count;
    uint8_t *present;
    uint64_t *stamp;
    uint32_t *depth, *list, *pos;
} ref_lru;

static void ref_init(ref_lru *r, uint32_t cap, uint32_t ids)
{
    r->cap = cap;
    r->count = 0;
    r->present = calloc(ids, 1);
    r->stamp = calloc(ids, sizeof *r->stamp);
    r->depth = calloc(ids, sizeof *r->depth);
    r->list = calloc(ids, sizeof *r->list);
    r->pos = calloc(ids, sizeof *r->pos);
    assert_non_null(r->present);
    assert_non_null(r->pos);
}

static void ref_fini(ref_lru *r)
{
    free(r->present);
    free(r->stamp);
    free(r->depth);
    free(r->list);
    free(r->pos);
}

/* The oldest block not touched by request now, deepest on a tie. */
static bool ref_evict(ref_lru *r, uint64_t now)
{
    uint32_t best = UINT32_MAX;
    for (uint32_t i = 0; i < r->count; i++) {
        uint32_t b = r->list[i];
        if (r->stamp[b] == now) continue;
        if (best == UINT32_MAX || r->stamp[b] < r->stamp[best] ||
            (r->stamp[b] == r->stamp[best] && r->depth[b] > r->depth[best]))
            best = b;
    }
    if (best == UINT32_MAX) return false;
    uint32_t p = r->pos[best], last = r->list[--r->count];
    r->list[p] = last;
    r->pos[last] = p;
    r->present[best] = 0;
    return true;
}

/* Same rules as sim_request: hit = longest cached prefix; store all. */
static void ref_request(ref_lru *r, const uint32_t *ids, uint32_t n, uint32_t input, uint64_t now,
                        sim_counts *c)
{
    uint32_t k = 0;
    while (k < n && r->present[ids[k]]) r->stamp[ids[k++]] = now;
    uint64_t tok = (uint64_t)k * TRACE_BLOCK_TOKENS;
    c->requests++;
    c->blocks += n;
    c->input_tokens += input;
    c->hit_blocks += k;
    c->hit_tokens += tok < input ? tok : input;
    for (uint32_t i = k; i < n; i++) {
        if (r->count == r->cap && !ref_evict(r, now)) break;
        r->present[ids[i]] = 1;
        r->stamp[ids[i]] = now;
        r->depth[ids[i]] = i;
        r->pos[ids[i]] = r->count;
        r->list[r->count++] = ids[i];
    }
}

/* Both simulations over the whole trace; capacity 0 = unbounded. */
static void compare(const trace *t, uint32_t cap)
{
    uint32_t c = cap ? cap : t->num_unique;
    ref_lru r;
    ref_init(&r, c, t->num_unique);
    sim s;
    char err[256];
    assert_int_equal(sim_init(&s, c, 0, t->num_unique, t->max_blocks, err, sizeof err), 0);
    kvt_hash128 *keys = malloc(((size_t)t->max_blocks + 1) * sizeof *keys);
    assert_non_null(keys);
    sim_counts rc = {0};
    for (uint32_t i = 0; i < t->num_reqs; i++) {
        const trace_req *q = &t->reqs[i];
        sim_keys(trace_ids(t, q), q->num_blocks, keys);
        sim_request(&s, keys, q->num_blocks, q->input_length);
        ref_request(&r, trace_ids(t, q), q->num_blocks, q->input_length, i + 1, &rc);
    }
    if (t->max_blocks <= c) { /* every request fits: exact agreement */
        assert_int_equal(s.c.hit_blocks, rc.hit_blocks);
        assert_int_equal(s.c.hit_tokens, rc.hit_tokens);
    } else { /* a request larger than the cache: both store a part; no order holds */
        assert_true(s.c.hit_blocks <= s.c.blocks && rc.hit_blocks <= rc.blocks);
    }
    assert_int_equal(s.c.blocks, rc.blocks);
    assert_int_equal(s.c.input_tokens, rc.input_tokens);
    assert_int_equal(s.c.cpu_hit_blocks, s.c.hit_blocks); /* one tier: all from CPU */
    assert_true(kvt__index_check(s.all));
    free(keys);
    sim_fini(&s);
    ref_fini(&r);
}

/* A generated trace: each request extends a random prefix of an earlier
 * one (or starts fresh) with new blocks; input_length often ends mid-block. */
static char *gen_trace(uint64_t seed, uint32_t requests, size_t *len)
{
    uint32_t **reqs = calloc(requests, sizeof *reqs), *lens = calloc(requests, sizeof *lens);
    size_t cap = 1 << 20, n = 0;
    char *buf = malloc(cap);
    assert_non_null(buf);
    uint32_t next = 0;
    for (uint32_t i = 0; i < requests; i++) {
        uint32_t keep = 0, extra = 1 + (uint32_t)(kvt__splitmix64(&seed) % 12);
        uint32_t *base = NULL;
        if (i && kvt__splitmix64(&seed) % 4 != 0) {
            uint32_t j = (uint32_t)(kvt__splitmix64(&seed) % i);
            base = reqs[j];
            keep = (uint32_t)(kvt__splitmix64(&seed) % (lens[j] + 1));
        }
        lens[i] = keep + extra;
        reqs[i] = malloc(lens[i] * sizeof **reqs);
        for (uint32_t b = 0; b < lens[i]; b++) reqs[i][b] = b < keep ? base[b] : next++;
        uint32_t input = lens[i] * 512 - (uint32_t)(kvt__splitmix64(&seed) % 512);
        if (n + 32 + 12 * lens[i] + 64 > cap) buf = realloc(buf, cap *= 2);
        n += (size_t)sprintf(buf + n, "{\"timestamp\": %u, \"input_length\": %u, "
                             "\"output_length\": 1, \"hash_ids\": [", i, input);
        for (uint32_t b = 0; b < lens[i]; b++) n += (size_t)sprintf(buf + n, "%s%u", b ? ", " : "", reqs[i][b] * 7 + 3);
        n += (size_t)sprintf(buf + n, "]}\n");
    }
    for (uint32_t i = 0; i < requests; i++) free(reqs[i]);
    free(reqs);
    free(lens);
    *len = n;
    return buf;
}

static void test_generated(void **state)
{
    (void)state;
    for (uint64_t seed = 1; seed <= 6; seed++) {
        size_t len = 0;
        char *text = gen_trace(seed, 600, &len), err[256];
        trace t;
        assert_int_equal(trace_parse(text, len, &t, err, sizeof err), 0);
        free(text);
        uint32_t caps[] = {0, 16, 40, 97, 300};
        for (size_t i = 0; i < sizeof caps / sizeof caps[0]; i++) compare(&t, caps[i]);
        trace_free(&t);
    }
}

/* The shared trace: ../shared/traces next to the checkout, located from
 * this file's path, or KVTIER_TRACE. Skipped (the generated traces still
 * run) when neither exists. */
static void test_shared_trace(void **state)
{
    (void)state;
    const char *env = getenv("KVTIER_TRACE");
    char path[1024];
    snprintf(path, sizeof path, "%s", __FILE__);
    char *cut = strstr(path, "tests/unit/test_replay.c");
    if (cut) snprintf(cut, sizeof path - (size_t)(cut - path), "../shared/traces/synthetic_trace.jsonl");
    const char *cands[] = {env, cut ? path : NULL, "/work/shared/traces/synthetic_trace.jsonl"};
    trace t;
    char err[600];
    bool loaded = false;
    for (size_t i = 0; i < 3 && !loaded; i++)
        if (cands[i]) {
            FILE *f = fopen(cands[i], "rb");
            if (f) fclose(f);
            loaded = f && trace_load(cands[i], &t, err, sizeof err) == 0;
        }
    if (!loaded) skip();
    compare(&t, 0);
    compare(&t, 512);   /* about 1% of the distinct blocks */
    compare(&t, 4096);
    if (t.num_reqs == 3993) { /* the published trace: known numbers */
        sim s;
        assert_int_equal(sim_init(&s, t.num_unique, 0, t.num_unique, t.max_blocks, err, sizeof err), 0);
        kvt_hash128 *keys = malloc(((size_t)t.max_blocks + 1) * sizeof *keys);
        for (uint32_t i = 0; i < t.num_reqs; i++) {
            sim_keys(trace_ids(&t, &t.reqs[i]), t.reqs[i].num_blocks, keys);
            sim_request(&s, keys, t.reqs[i].num_blocks, t.reqs[i].input_length);
        }
        assert_int_equal(s.c.blocks, 121877);
        assert_int_equal(s.c.hit_blocks, 77953);
        assert_int_equal(s.c.hit_tokens, 39852661);
        free(keys);
        sim_fini(&s);
    }
    trace_free(&t);
}

static void expect_error(const char *text, const char *want)
{
    trace t;
    char err[600];
    assert_int_equal(trace_parse(text, strlen(text), &t, err, sizeof err), -1);
    if (!strstr(err, want)) fail_msg("error \"%s\" lacks \"%s\"", err, want);
}

static void test_trace_errors(void **state)
{
    (void)state;
    const char *ok = "{\"input_length\": 600, \"hash_ids\": [1, 2]}\n";
    char buf[512];
    snprintf(buf, sizeof buf, "%s%s", ok, "{\"input_length\": 5, \"hash_ids\": 3}\n");
    expect_error(buf, "line 2: hash_ids is not an array");
    expect_error("", "no requests");
    expect_error("{\"input_length\": 5}", "line 1: hash_ids is missing");
    expect_error("{\"input_length\": 5, \"hash_ids\": [1,", "line 1: not valid JSON");
    expect_error("[1]", "line 1: not a JSON object");
    expect_error("{\"input_length\": 0, \"hash_ids\": []}", "input_length is 0");
    expect_error("{\"input_length\": -3, \"hash_ids\": []}", "input_length is -3");
    expect_error("{\"input_length\": 5, \"hash_ids\": [1, 2]}", "2 hash_ids for input_length 5");
    expect_error("{\"input_length\": 2000, \"hash_ids\": [1, 1.5]}", "hash_ids[1] is not");
    expect_error("{\"input_length\": 2000, \"hash_ids\": [1, 1]}", "hash_ids[1] (1) follows");
    snprintf(buf, sizeof buf, "%s\n  \n{\"input_length\": 900, \"hash_ids\": [2, 1]}\n", ok);
    expect_error(buf, "line 4: hash_ids[0] (2) follows");
    trace t;
    char err[64];
    snprintf(buf, sizeof buf, "%s\r\n\n%s", ok, ok); /* CRLF and blank lines are fine */
    assert_int_equal(trace_parse(buf, strlen(buf), &t, err, sizeof err), 0);
    assert_int_equal(t.num_reqs, 2);
    assert_int_equal(t.num_unique, 2);
    trace_free(&t);
    assert_int_equal(trace_load("/nonexistent/trace.jsonl", &t, buf, sizeof buf), -1);
    assert_non_null(strstr(buf, "cannot open"));
    /* Issue 14 item 10: a NUL in a key or string would cut it short (a key
     * "hash_ids\u0000x" read as "hash_ids"); a FIFO blocked open() forever. */
    expect_error("{\"input_length\": 600, \"hash_ids\\u0000x\": [1, 2]}", "NUL character");
    const char *tmp = getenv("KVTIER_TEST_TMP");
    char fifo[512];
    snprintf(fifo, sizeof fifo, "%s/replay_fifo.%d", tmp && *tmp ? tmp : "/tmp", (int)getpid());
    unlink(fifo);
    assert_int_equal(mkfifo(fifo, 0600), 0);
    assert_int_equal(trace_load(fifo, &t, buf, sizeof buf), -1);
    assert_non_null(strstr(buf, "is a FIFO, not a regular file"));
    unlink(fifo);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_trace_errors),
        cmocka_unit_test(test_generated),
        cmocka_unit_test(test_shared_trace),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
