/* replay_data.c - full-data replay: an emulated engine serves the trace's
 * requests through kvt_cache (CPU tier, optional SSD tier), so KV bytes
 * really move and loaded bytes are checked with kvt_emu_verify.
 *
 * Requests: block id d becomes 512 deterministic tokens derived from d, so
 * equal ids give equal blocks and chained hashes reproduce the trace's
 * prefix tree. The trace names a block (and the rules store it) even when
 * input_length ends inside it, so a request is presented as its whole
 * blocks plus one token the engine computes (a lookup never matches the
 * last token): the cache then decides exactly what the rules decide, and
 * token hits are min(hit blocks x 512, input_length) as in index-only mode.
 *
 * The engine is small on purpose (KV of 70B-class models is 320 KiB a
 * token): `window` blocks of pages plus one scratch block.
 *  - A store runs window by window, like chunked prefill: prepare_store of
 *    the request cut after the next `window` blocks, fill, launch, wait.
 *  - A load of k blocks maps one window of them (a position that varies per
 *    request) to the window pages and every other block to the scratch
 *    pages; the window is poisoned first and byte-verified after. So every
 *    load moves all its bytes, and up to `window` blocks of each are
 *    verified: the report says how many bytes that was. */
#include "replay.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli_util.h"
#include "util/clock.h"

#define DATA_WAIT_MS 120000   /* one task of a few GiB from a slow SSD; never a hang */
#define DATA_PAGE_TOKENS 16u  /* engine page size, as in vLLM and SGLang */

typedef struct data_run {
    const trace *t;
    const data_opts *o;
    data_result *r;
    kvt_geometry *geo;
    kvt_config *cfg;
    kvt_cache *cache;
    kvt_emu *emu;
    char tmp_dir[256];
    uint32_t ppb, window; /* pages per block; window in blocks */
    uint32_t *tokens, *pages;
} data_run;

static uint64_t mix(uint64_t x)
{
    uint64_t s = x;
    return kvt__splitmix64(&s);
}

/* Block d's tokens: a deterministic function of d (ids below 2^31 keep
 * clear of any special-token range an engine may reserve). */
static void block_tokens(uint32_t d, uint32_t *out)
{
    uint64_t s = mix(d ^ 0x7265706c6179ull);
    for (uint32_t j = 0; j < TRACE_BLOCK_TOKENS; j++) out[j] = (uint32_t)(kvt__splitmix64(&s) >> 33);
}

static int fail_st(const char *what, kvt_status st)
{
    fprintf(stderr, "kvtier replay: %s: %s: %s\n", what, kvt_strerror(st), kvt_last_error());
    return -1;
}

static kvt_status make_config(data_run *d)
{
    char buf[64];
    kvt_status st = kvt_config_create(&d->cfg);
    snprintf(buf, sizeof buf, "%llu", (unsigned long long)(d->o->cpu_gib * REPLAY_GIB));
    if (!st) st = kvt_config_set(d->cfg, "cpu_capacity", buf);
    if (!st) st = kvt_config_set(d->cfg, "block_tokens", "512");
    if (st || d->o->ssd_gib <= 0) return st;
    const char *dir = d->o->ssd_dir;
    if (!dir) {
        const char *base = getenv("TMPDIR");
        snprintf(d->tmp_dir, sizeof d->tmp_dir, "%s/kvtier-replay-XXXXXX",
                 base && *base ? base : "/tmp");
        if (!mkdtemp(d->tmp_dir)) {
            d->tmp_dir[0] = '\0';
            return kvt_config_set(d->cfg, "ssd_dirs", "/nonexistent/mkdtemp-failed");
        }
        dir = d->tmp_dir;
    }
    snprintf(buf, sizeof buf, "%llu", (unsigned long long)(d->o->ssd_gib * REPLAY_GIB));
    st = kvt_config_set(d->cfg, "ssd_dirs", dir);
    if (!st) st = kvt_config_set(d->cfg, "ssd_capacity", buf);
    if (!st) st = kvt_config_set(d->cfg, "ssd_fresh", "true");
    return st;
}

static int setup(data_run *d, const model_opts *m)
{
    kvt_status st = model_geometry(m, DATA_PAGE_TOKENS, &d->geo);
    if (st) return fail_st("geometry", st);
    if ((st = make_config(d))) return fail_st("configuration", st);
    if ((st = kvt_cache_create(&d->cache, d->cfg, d->geo))) return fail_st("creating the cache", st);
    d->ppb = TRACE_BLOCK_TOKENS / DATA_PAGE_TOKENS;
    d->window = d->o->window;
    if ((st = kvt_emu_create(&d->emu, d->geo, (d->window + 1) * d->ppb)))
        return fail_st("creating the emulated engine", st);
    kvt_engine_memory mem;
    if ((st = kvt_emu_memory(d->emu, &mem)) || (st = kvt_cache_register_memory(d->cache, &mem)))
        return fail_st("registering engine memory", st);
    size_t max_tok = (size_t)d->t->max_blocks * TRACE_BLOCK_TOKENS + 1;
    d->tokens = malloc(max_tok * sizeof *d->tokens);
    d->pages = malloc(((size_t)d->t->max_blocks + 1) * d->ppb * sizeof *d->pages);
    if (!d->tokens || !d->pages) return fail_st("allocating", KVT_ENOMEM);
    kvt_cache_stats s;
    kvt_cache_stats_get(d->cache, &s);
    d->r->cpu_blocks = s.cpu_blocks_total;
    d->r->ssd_blocks = s.ssd_blocks_total;
    d->r->block_bytes = s.block_bytes;
    return 0;
}

static void teardown(data_run *d)
{
    kvt_cache_destroy(d->cache);
    kvt_emu_destroy(d->emu);
    kvt_config_destroy(d->cfg);
    kvt_geometry_destroy(d->geo);
    if (d->tmp_dir[0]) remove_tree(d->tmp_dir);
    free(d->tokens);
    free(d->pages);
}

/* Page table for blocks [0, nb): blocks [w0, w0 + wn) on the window pages
 * (window page i*ppb + j), every other block on the scratch block's pages. */
static void map_pages(data_run *d, uint32_t nb, uint32_t w0, uint32_t wn)
{
    uint32_t scratch = d->window * d->ppb;
    for (uint32_t b = 0; b < nb; b++)
        for (uint32_t j = 0; j < d->ppb; j++)
            d->pages[(size_t)b * d->ppb + j] =
                b >= w0 && b < w0 + wn ? (b - w0) * d->ppb + j : scratch + j;
}

static int wait_task(data_run *d, kvt_task_id id, const char *what)
{
    kvt_task_result res = {0};
    kvt_status st = kvt_cache_wait(d->cache, id, DATA_WAIT_MS, &res);
    if (!st) st = res.status;
    if (st) {
        kvt_cache_cancel(d->cache, id);
        d->r->failures++;
        fail_st(what, st);
        return 0; /* counted in failures; the replay goes on */
    }
    return 0;
}

/* Loads the k matched blocks and verifies one window of them. */
static int load(data_run *d, const kvt_request *req, const kvt_match *m, uint32_t salt)
{
    uint32_t k = m->matched_tokens / TRACE_BLOCK_TOKENS;
    uint32_t wn = k < d->window ? k : d->window;
    uint32_t w0 = k > wn ? (uint32_t)(mix(salt) % (k - wn + 1)) : 0;
    map_pages(d, k, w0, wn);
    kvt_emu_poison(d->emu, d->pages + (size_t)w0 * d->ppb, wn * d->ppb);
    uint64_t t0 = kvt__now_ns();
    kvt_status st = kvt_cache_launch(d->cache, m->task, d->pages, k * d->ppb);
    if (st) {
        kvt_cache_cancel(d->cache, m->task);
        d->r->failures++;
        return fail_st("launching a load", st);
    }
    uint64_t failures = d->r->failures;
    wait_task(d, m->task, "load");
    d->r->load_s += (double)(kvt__now_ns() - t0) / 1e9;
    if (d->r->failures != failures) return 0;
    kvt_verify_result v;
    st = kvt_emu_verify(d->emu, req, w0 * TRACE_BLOCK_TOKENS, wn * TRACE_BLOCK_TOKENS, d->pages,
                        k * d->ppb, &v);
    if (st) return fail_st("verifying a load", st);
    d->r->verified_bytes += v.bytes_checked;
    d->r->mismatches += v.mismatches;
    if (v.mismatches)
        fprintf(stderr, "kvtier replay: MISMATCH: %llu bytes differ, first at token %u layer %u\n",
                (unsigned long long)v.mismatches, v.first_bad_token, v.first_bad_layer);
    return 0;
}

/* Stores the blocks of req the cache lacks, one window at a time. */
static int store(data_run *d, const kvt_request *req, uint32_t nb)
{
    for (uint32_t end = 0; end < nb;) {
        end = end + d->window < nb ? end + d->window : nb;
        kvt_request cut = *req;
        cut.num_tokens = end * TRACE_BLOCK_TOKENS;
        kvt_store_plan plan;
        kvt_status st = kvt_cache_prepare_store(d->cache, &cut, &plan);
        if (st) return fail_st("prepare_store", st);
        if (!plan.task) continue;
        uint32_t b0 = plan.first_token / TRACE_BLOCK_TOKENS;
        uint32_t bn = plan.num_tokens / TRACE_BLOCK_TOKENS;
        if (bn > d->window) {
            /* The tier evicted part of this request's own stored prefix: it
             * is smaller than the request. Drop the rest of the request
             * (expected with tiny tiers, not a failure). */
            kvt_task_result res;
            kvt_cache_cancel(d->cache, plan.task);
            kvt_cache_wait(d->cache, plan.task, DATA_WAIT_MS, &res);
            d->r->truncated++;
            break;
        }
        map_pages(d, b0 + bn, b0, bn);
        uint64_t t0 = kvt__now_ns();
        st = kvt_emu_fill(d->emu, &cut, plan.first_token, plan.num_tokens, d->pages,
                          (b0 + bn) * d->ppb);
        uint64_t t1 = kvt__now_ns();
        if (!st) st = kvt_cache_launch(d->cache, plan.task, d->pages, (b0 + bn) * d->ppb);
        if (st) {
            kvt_cache_cancel(d->cache, plan.task);
            return fail_st("filling or launching a store", st);
        }
        wait_task(d, plan.task, "store");
        d->r->fill_s += (double)(t1 - t0) / 1e9;
        d->r->store_s += (double)(kvt__now_ns() - t1) / 1e9;
    }
    return 0;
}

static int serve(data_run *d, uint32_t ri)
{
    const trace_req *tr = &d->t->reqs[ri];
    const uint32_t *ids = trace_ids(d->t, tr);
    uint32_t nb = tr->num_blocks;
    for (uint32_t b = 0; b < nb; b++) block_tokens(ids[b], d->tokens + (size_t)b * TRACE_BLOCK_TOKENS);
    d->tokens[(size_t)nb * TRACE_BLOCK_TOKENS] = ri; /* the token the engine computes */
    kvt_request req = {.tokens = d->tokens, .num_tokens = nb * TRACE_BLOCK_TOKENS + 1};
    kvt_cache_stats before, after;
    kvt_cache_stats_get(d->cache, &before);
    kvt_match m = {0};
    kvt_status st = kvt_cache_lookup(d->cache, &req, &m);
    if (st) return fail_st("lookup", st);
    kvt_cache_stats_get(d->cache, &after);
    uint32_t k = m.matched_tokens / TRACE_BLOCK_TOKENS;
    uint32_t ks = (uint32_t)((after.ssd_hit_tokens - before.ssd_hit_tokens) / TRACE_BLOCK_TOKENS);
    if (ks > k) ks = k;
    if (m.task && load(d, &req, &m, ri)) return -1;
    sim_counts *c = &d->r->c;
    uint64_t tok = (uint64_t)k * TRACE_BLOCK_TOKENS, ctok = (uint64_t)(k - ks) * TRACE_BLOCK_TOKENS;
    tok = tok < tr->input_length ? tok : tr->input_length;
    ctok = ctok < tr->input_length ? ctok : tr->input_length;
    c->requests++;
    c->blocks += nb;
    c->input_tokens += tr->input_length;
    c->hit_blocks += k;
    c->cpu_hit_blocks += k - ks;
    c->ssd_hit_blocks += ks;
    c->hit_tokens += tok;
    c->cpu_hit_tokens += ctok;
    c->ssd_hit_tokens += tok - ctok;
    return store(d, &req, nb);
}

int replay_data(const trace *t, const model_opts *m, const data_opts *o, data_result *out)
{
    memset(out, 0, sizeof *out);
    data_run d = {.t = t, .o = o, .r = out};
    int rc = setup(&d, m);
    uint32_t n = o->max_requests < t->num_reqs ? o->max_requests : t->num_reqs;
    progress pr;
    progress_init(&pr, "replay", n);
    uint64_t t0 = kvt__now_ns();
    for (uint32_t i = 0; !rc && i < n; i++) {
        rc = serve(&d, i);
        if (!o->quiet) progress_update(&pr, i + 1, sim_rate(out->c.hit_tokens, out->c.input_tokens));
    }
    if (!o->quiet) progress_done(&pr);
    kvt_status st = rc ? KVT_OK : kvt_cache_flush(d.cache, DATA_WAIT_MS);
    if (st) rc = fail_st("flushing the SSD tier", st);
    out->elapsed_s = (double)(kvt__now_ns() - t0) / 1e9;
    kvt_cache_stats s;
    if (d.cache && kvt_cache_stats_get(d.cache, &s) == KVT_OK) {
        out->stored_bytes = s.stored_bytes;
        out->loaded_bytes = s.loaded_bytes;
        out->ssd_written_blocks = s.ssd_written_blocks;
        out->ssd_read_blocks = s.ssd_read_blocks;
        out->c.stored_blocks = s.stored_blocks;
        out->c.evicted_blocks = s.evicted_blocks;
    }
    teardown(&d);
    return rc;
}
