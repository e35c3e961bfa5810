/* demo.c - `kvtier demo`: an emulated engine serves a multi-turn chat
 * workload through the cache and checks every byte it loads.
 *
 * Per request, as an engine would: lookup -> launch the load of the cached
 * prefix into freshly allocated (poisoned) pages -> wait for it layer by
 * layer -> verify the loaded bytes -> "compute" the rest (the emulator
 * fills it) -> prepare_store -> launch the store and move on; finished
 * stores are polled and their pages freed. The CPU tier is smaller than the
 * working set, so eviction happens. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "chat.h"
#include "cmds.h"
#include "demo_util.h"
#include "kvtier.h"
#include "util/clock.h"

#define DEMO_WAIT_MS 30000 /* generous: a stuck task is a failure, not a hang */

typedef struct demo_opts {
    bool json, quick, no_ssd;
    const char *config_file;
    const char *cpu_capacity;
    const char *ssd_capacity;
    const char *ssd_dir; /* kept when given; else a temporary directory */
    chat_params chat;
} demo_opts;

typedef struct pending_store {
    kvt_task_id task;
    uint32_t *pages;
    uint32_t num_pages;
} pending_store;

typedef struct demo {
    demo_opts o;
    kvt_geometry *geo;
    kvt_config *cfg;
    kvt_cache *cache;
    kvt_emu *emu;
    char tmp_dir[256]; /* removed at the end */
    page_alloc pages;
    pending_store *stores;
    uint32_t num_stores, max_stores;
    uint32_t tokens_per_page;
    /* results */
    uint32_t requests, failures;
    uint64_t verified_bytes, mismatches, load_ns_total;
    sample_set lookup_us, load_ms;
} demo;

static int usage(FILE *to)
{
    fprintf(to,
            "usage: kvtier demo [--json] [--quick] [--conversations N] [--active N] [--turns N]\n"
            "                   [--cpu-capacity SIZE] [--ssd-capacity SIZE] [--ssd-dir DIR]\n"
            "                   [--no-ssd] [--seed N] [--config FILE]\n"
            "       kvtier demo --server [--json] [--model M]\n"
            "       kvtier demo --cluster [--json]\n"
            "Serves a multi-turn chat workload from an emulated engine through the cache and\n"
            "verifies every loaded byte. The CPU tier is small on purpose; an SSD tier in a\n"
            "temporary directory sits under it, or in DIR with --ssd-dir, which keeps the\n"
            "cache: a second run with the same DIR starts warm. Options also come from\n"
            "KVTIER_* variables (kvtier config --dump lists them).\n"
            "--server: a kvtier serve process and two engine instances of TP 2 (four client\n"
            "processes) sharing system prompts through it; one instance is SIGKILLed and\n"
            "restarted, then the server itself; every loaded byte is verified.\n"
            "--cluster: Redis (primary, replica, Sentinel) and three kvtier serve nodes sharing\n"
            "blocks through it (docs/cluster.md), two engines behind a random router; a node is\n"
            "SIGKILLed and restarted, then the Redis primary (the Sentinel fails over);\n"
            "cross-node hits counted, every loaded byte verified.\n");
    return to == stdout ? 0 : 2;
}

static int parse_args(demo_opts *o, int argc, char **argv)
{
    chat_params c = {.system_prompts = 4, .system_tokens = 1024, .conversations = 48,
                     .active = 8, .turns = 6, .user_min = 48, .user_max = 256,
                     .reply_min = 32, .reply_max = 192, .seed = 42};
    o->chat = c;
    o->cpu_capacity = "128MiB";
    o->ssd_capacity = "2GiB";
    bool cpu_set = false;
    static const char *const takes_value[] = {"--config", "--cpu-capacity", "--ssd-capacity",
        "--ssd-dir", "--conversations", "--active", "--turns", "--seed", NULL};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        uint64_t n = 0;
        if (!strcmp(a, "--json")) o->json = true;
        else if (!strcmp(a, "--quick")) o->quick = true;
        else if (!strcmp(a, "--no-ssd")) o->no_ssd = true;
        else if (!strcmp(a, "--help") || !strcmp(a, "-h")) return usage(stdout) - 1;
        else if (!cli_arg_in(a, takes_value)) return cli_bad_arg("demo", a, false);
        else if (!v) return cli_bad_arg("demo", a, true);
        else if (!strcmp(a, "--config")) o->config_file = v, i++;
        else if (!strcmp(a, "--cpu-capacity")) o->cpu_capacity = v, cpu_set = true, i++;
        else if (!strcmp(a, "--ssd-capacity")) o->ssd_capacity = v, i++;
        else if (!strcmp(a, "--ssd-dir")) o->ssd_dir = v, i++;
        else if (!demo_parse_u64(v, &n) || n == 0 || n > 1000000)
            return fprintf(stderr, "kvtier demo: %s: \"%s\" is not a count in 1..1000000\n", a, v), 2;
        else if (!strcmp(a, "--conversations")) o->chat.conversations = (uint32_t)n, i++;
        else if (!strcmp(a, "--active")) o->chat.active = (uint32_t)n, i++;
        else if (!strcmp(a, "--turns")) o->chat.turns = (uint32_t)n, i++;
        else if (!strcmp(a, "--seed")) o->chat.seed = n, i++;
        else return cli_bad_arg("demo", a, false);
    }
    if (o->quick) {
        /* Small enough that the quick run evicts too. */
        if (!cpu_set) o->cpu_capacity = "48MiB";
        o->chat.conversations = o->chat.conversations > 16 ? 16 : o->chat.conversations;
        o->chat.turns = o->chat.turns > 4 ? 4 : o->chat.turns;
    }
    return 0;
}

/* A small model: 8 layers x (K, V) x 4 KV heads x 128 dims, bf16, pages of
 * 16 tokens: 16 KiB per token, like one TP rank of a mid-size model. */
static kvt_status make_geometry(kvt_geometry **out)
{
    kvt_status st = kvt_geometry_create(out, 8, 16, KVT_LAYOUT_LAYER_FIRST);
    if (st) return st;
    kvt_layer_spec s = {.num_components = 2, .component = {{4, 128, 2}, {4, 128, 2}}};
    return kvt_geometry_set_layers(*out, 0, 8, &s);
}

/* The SSD tier's directory: the user's, or a fresh temporary one. */
static kvt_status ssd_dir(demo *d, const char **dir)
{
    *dir = d->o.ssd_dir;
    if (*dir) return KVT_OK;
    const char *base = getenv("TMPDIR");
    snprintf(d->tmp_dir, sizeof d->tmp_dir, "%s/kvtier-demo-XXXXXX", base && *base ? base : "/tmp");
    if (!mkdtemp(d->tmp_dir)) {
        d->tmp_dir[0] = '\0';
        return KVT_ESYS;
    }
    *dir = d->tmp_dir;
    return KVT_OK;
}

static kvt_status make_config(demo *d)
{
    kvt_status st = kvt_config_create(&d->cfg);
    if (!st) st = kvt_config_set(d->cfg, "cpu_capacity", d->o.cpu_capacity);
    const char *dir = NULL;
    if (!st && !d->o.no_ssd) st = ssd_dir(d, &dir);
    if (!st && dir) st = kvt_config_set(d->cfg, "ssd_dirs", dir);
    if (!st && dir) st = kvt_config_set(d->cfg, "ssd_capacity", d->o.ssd_capacity);
    if (!st && d->o.config_file) st = kvt_config_load_file(d->cfg, d->o.config_file);
    if (!st) st = kvt_config_load_env(d->cfg);
    return st;
}

static kvt_status setup(demo *d, uint32_t max_tokens)
{
    kvt_status st = make_geometry(&d->geo);
    if (!st) st = make_config(d);
    if (!st) st = kvt_cache_create(&d->cache, d->cfg, d->geo);
    d->tokens_per_page = 16;
    /* Enough pages for the request being served plus many stores still
     * gathering from their pages. */
    uint32_t per_request = (max_tokens + d->tokens_per_page - 1) / d->tokens_per_page;
    uint32_t num_pages = per_request * 12;
    if (!st) st = kvt_emu_create(&d->emu, d->geo, num_pages);
    kvt_engine_memory mem;
    if (!st) st = kvt_emu_memory(d->emu, &mem);
    if (!st) st = kvt_cache_register_memory(d->cache, &mem);
    if (!st && !page_alloc_init(&d->pages, num_pages)) st = KVT_ENOMEM;
    d->max_stores = 64;
    d->stores = calloc(d->max_stores, sizeof *d->stores);
    if (!st && !d->stores) st = KVT_ENOMEM;
    return st;
}

static void teardown(demo *d)
{
    for (uint32_t i = 0; i < d->num_stores; i++) free(d->stores[i].pages);
    free(d->stores);
    page_alloc_fini(&d->pages);
    kvt_cache_destroy(d->cache);
    kvt_emu_destroy(d->emu);
    kvt_config_destroy(d->cfg);
    kvt_geometry_destroy(d->geo);
    if (d->tmp_dir[0]) remove_tree(d->tmp_dir);
    samples_fini(&d->lookup_us);
    samples_fini(&d->load_ms);
}

/* Frees the pages of stores that ended; with block=true waits for the
 * oldest one first (the engine needs pages back). */
static int reap_stores(demo *d, bool block)
{
    if (block && d->num_stores > 0) {
        kvt_task_result r;
        kvt_status st = kvt_cache_wait(d->cache, d->stores[0].task, DEMO_WAIT_MS, &r);
        if (st) return demo_error("waiting for a store", st);
        if (r.status != KVT_OK) d->failures++;
        page_free_list(&d->pages, d->stores[0].pages, d->stores[0].num_pages);
        free(d->stores[0].pages);
        memmove(d->stores, d->stores + 1, --d->num_stores * sizeof *d->stores);
    }
    kvt_task_result done[32];
    uint32_t n = 0;
    kvt_status st = kvt_cache_poll(d->cache, done, 32, &n);
    if (st) return demo_error("polling", st);
    for (uint32_t i = 0; i < n; i++) {
        if (done[i].status != KVT_OK) d->failures++;
        for (uint32_t j = 0; j < d->num_stores; j++) {
            if (d->stores[j].task != done[i].task) continue;
            page_free_list(&d->pages, d->stores[j].pages, d->stores[j].num_pages);
            free(d->stores[j].pages);
            memmove(d->stores + j, d->stores + j + 1, (--d->num_stores - j) * sizeof *d->stores);
            break;
        }
    }
    return 0;
}

/* Loads the matched prefix layer by layer and verifies it. Returns the
 * number of tokens the engine may reuse (0 if the load failed). */
static uint32_t load_prefix(demo *d, const kvt_request *req, const kvt_match *m, uint32_t *pages,
                            uint32_t num_pages)
{
    uint32_t load_pages = m->matched_tokens / d->tokens_per_page;
    kvt_emu_poison(d->emu, pages, load_pages);
    uint64_t t0 = kvt__now_ns();
    kvt_status st = kvt_cache_launch(d->cache, m->task, pages, num_pages);
    for (uint32_t l = 0; !st && l < 8; l++) st = kvt_cache_wait_layer(d->cache, m->task, l, DEMO_WAIT_MS);
    kvt_task_result r = {0};
    if (!st) st = kvt_cache_wait(d->cache, m->task, DEMO_WAIT_MS, &r);
    if (!st) st = r.status;
    uint64_t dt = kvt__now_ns() - t0;
    if (st) {
        demo_error("load failed; recomputing", st);
        kvt_cache_cancel(d->cache, m->task);
        d->failures++;
        return 0;
    }
    d->load_ns_total += dt;
    samples_add(&d->load_ms, (double)dt / 1e6);
    kvt_verify_result v;
    if (kvt_emu_verify(d->emu, req, 0, m->matched_tokens, pages, num_pages, &v) == KVT_OK) {
        d->verified_bytes += v.bytes_checked;
        d->mismatches += v.mismatches;
        if (v.mismatches)
            fprintf(stderr, "\nkvtier demo: MISMATCH: %llu bytes differ, first at token %u layer %u\n",
                    (unsigned long long)v.mismatches, v.first_bad_token, v.first_bad_layer);
    }
    return m->matched_tokens;
}

static int store_rest(demo *d, const kvt_request *req, uint32_t *pages, uint32_t num_pages)
{
    kvt_store_plan plan;
    kvt_status st = kvt_cache_prepare_store(d->cache, req, &plan);
    if (st) return demo_error("prepare_store", st);
    if (plan.task == 0) {
        page_free_list(&d->pages, pages, num_pages);
        free(pages);
        return 0;
    }
    st = kvt_cache_launch(d->cache, plan.task, pages, num_pages);
    if (st) return demo_error("launching a store", st);
    pending_store ps = {plan.task, pages, num_pages};
    d->stores[d->num_stores++] = ps;
    return 0;
}

static int serve(demo *d, const kvt_request *req)
{
    uint32_t num_pages = (req->num_tokens + d->tokens_per_page - 1) / d->tokens_per_page;
    while (d->num_stores == d->max_stores || page_free_count(&d->pages) < num_pages)
        if (reap_stores(d, true)) return 1;
    uint32_t *pages = page_alloc_list(&d->pages, num_pages);
    if (!pages) return demo_error("allocating engine pages", KVT_ENOMEM);
    uint64_t t0 = kvt__now_ns();
    kvt_match m;
    kvt_status st = kvt_cache_lookup(d->cache, req, &m);
    samples_add(&d->lookup_us, (double)(kvt__now_ns() - t0) / 1e3);
    if (st) return demo_error("lookup", st);
    uint32_t reuse = m.task ? load_prefix(d, req, &m, pages, num_pages) : 0;
    kvt_emu_fill(d->emu, req, reuse, req->num_tokens - reuse, pages, num_pages);
    d->requests++;
    if (store_rest(d, req, pages, num_pages)) return 1;
    return reap_stores(d, false);
}

static int run(demo *d, chat_workload *w, progress *pr)
{
    const uint32_t *tokens;
    uint32_t n, conv;
    while (chat_next(w, &tokens, &n, &conv)) {
        kvt_request req = {.tokens = tokens, .num_tokens = n, .ns = NULL, .ns_len = 0};
        if (serve(d, &req)) return 1;
        chat_served(w, conv);
        kvt_cache_stats s;
        kvt_cache_stats_get(d->cache, &s);
        progress_update(pr, d->requests, s.lookup_tokens ? (double)s.hit_tokens / s.lookup_tokens : 0);
    }
    while (d->num_stores)
        if (reap_stores(d, true)) return 1;
    /* Every block on the SSD before the report (and before a warm rerun). */
    kvt_status st = kvt_cache_flush(d->cache, DEMO_WAIT_MS);
    return st ? demo_error("flushing the SSD tier", st) : 0;
}

static void report(demo *d, const kvt_cache_stats *s, double elapsed)
{
    double hit = s->lookup_tokens ? (double)s->hit_tokens / (double)s->lookup_tokens : 0;
    double gbps = d->load_ns_total ? (double)s->loaded_bytes / (double)d->load_ns_total : 0;
    demo_report r = {
        .requests = d->requests, .hit_rate = hit, .hit_tokens = s->hit_tokens,
        .lookup_tokens = s->lookup_tokens, .stored_bytes = s->stored_bytes,
        .loaded_bytes = s->loaded_bytes, .load_gbps = gbps,
        .lookup_p50_us = samples_pct(&d->lookup_us, 50), .lookup_p99_us = samples_pct(&d->lookup_us, 99),
        .load_p50_ms = samples_pct(&d->load_ms, 50), .load_p99_ms = samples_pct(&d->load_ms, 99),
        .evicted_blocks = s->evicted_blocks, .verified_bytes = d->verified_bytes,
        .mismatches = d->mismatches, .failures = d->failures, .elapsed_s = elapsed,
        .cpu_capacity = s->cpu_blocks_total * s->block_bytes, .block_bytes = s->block_bytes,
        .cpu_blocks = s->cpu_blocks_total,
        .ssd_hit_tokens = s->ssd_hit_tokens, .ssd_capacity = s->ssd_blocks_total * s->block_bytes,
        .ssd_written_blocks = s->ssd_written_blocks, .recovered_blocks = s->recovered_blocks,
        .corrupt_blocks = s->corrupt_blocks, .cpu_dropped_blocks = s->cpu_dropped_blocks,
        .ssd_dir = d->o.no_ssd ? NULL : (d->o.ssd_dir ? d->o.ssd_dir : "(temporary)"),
    };
    if (d->o.json) demo_report_json(&r);
    else demo_report_text(&r);
}

/* kvtier demo --server [--json] [--model M]: the node server's demo. */
static int server_demo(int argc, char **argv)
{
    const char *model = "tiny";
    bool json = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--server")) continue;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return usage(stdout);
        if (!strcmp(argv[i], "--json")) json = true;
        else if (!strcmp(argv[i], "--model") && i + 1 < argc) model = argv[++i];
        else if (!strcmp(argv[i], "--model")) return cli_bad_arg("demo --server", argv[i], true);
        else return fprintf(stderr, "kvtier demo --server: takes only --json and --model M, "
                            "not %s\n", argv[i]), 2;
    }
    return kvt_demo_server(model, json);
}

/* kvtier demo --cluster [--json]: the cluster tier's demo. */
static int cluster_demo(int argc, char **argv)
{
    bool json = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--cluster")) continue;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return usage(stdout);
        if (!strcmp(argv[i], "--json")) json = true;
        else return fprintf(stderr, "kvtier demo --cluster: takes only --json, not %s\n", argv[i]), 2;
    }
    return kvt_demo_cluster(json);
}

int kvt_cmd_demo(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--server")) return server_demo(argc, argv);
        if (!strcmp(argv[i], "--cluster")) return cluster_demo(argc, argv);
    }
    demo d = {0};
    int rc = parse_args(&d.o, argc, argv);
    if (rc) return rc < 0 ? 0 : rc;
    chat_workload *w = chat_create(&d.o.chat);
    if (!w) return 1;
    kvt_status st = setup(&d, chat_max_tokens(w));
    if (st) {
        fprintf(stderr, "kvtier demo: setup failed: %s: %s\n", kvt_strerror(st), kvt_last_error());
        teardown(&d);
        chat_destroy(w);
        return 1;
    }
    progress pr;
    progress_init(&pr, "demo", chat_total_requests(w));
    uint64_t t0 = kvt__now_ns();
    rc = run(&d, w, &pr);
    progress_done(&pr);
    double elapsed = (double)(kvt__now_ns() - t0) / 1e9;
    kvt_cache_stats s;
    kvt_cache_stats_get(d.cache, &s);
    if (!rc) report(&d, &s, elapsed);
    if (!rc && (d.mismatches || d.failures)) rc = 1;
    teardown(&d);
    chat_destroy(w);
    return rc;
}
