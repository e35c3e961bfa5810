/* cmd_replay.c - `kvtier replay --trace FILE`: replays a Mooncake-format
 * trace in file order through the real index (--no-data, --unbounded) or
 * through kvt_cache with KV bytes moving (default). docs/replay.md. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "cli_util.h"
#include "cmds.h"
#include "replay.h"
#include "replay_fleet.h"
#include "util/clock.h"

#define DEFAULT_DATA_REQUESTS 16u /* full data moves ~GiB per request: keep runs short */
#define MAX_FLEET_NODES 256u      /* each node is an index of the trace's unique blocks */

typedef struct replay_opts {
    const char *trace, *ssd_dir;
    double cpu_gib, ssd_gib;
    bool no_data, unbounded, json, max_set;
    uint64_t max_requests, window;
    uint64_t nodes, seed;   /* nodes 0: one cache; else a fleet (replay_fleet.h) */
    const char *routing;
    model_opts m;
} replay_opts;

typedef struct replay_out {
    sim_counts c, max;       /* the replay, and the unbounded cache over the same requests */
    uint64_t cpu_blocks, ssd_blocks, block_bytes;
    double elapsed_s;
    const data_result *data; /* full-data replay only */
    const fleet_result *fleet; /* --nodes only */
} replay_out;

static int usage(FILE *to)
{
    fprintf(to,
            "usage: kvtier replay --trace FILE [--cpu-gb G] [--ssd-gb G] [--ssd-dir DIR]\n"
            "                     [--model llama3-8b|llama3-70b|deepseek-v3]\n"
            "                     [--layers N --kv-heads N --head-dim N --elem-size N [--mla]]\n"
            "                     [--no-data | --unbounded] [--max-requests N] [--window N] [--json]\n"
            "Replays a Mooncake-format JSONL trace (512-token blocks) in file order. A request's\n"
            "hit is the longest prefix of its blocks already cached; then all its blocks are\n"
            "stored. Sizes are GiB (2^30 bytes): --cpu-gb (default 16) and --ssd-gb (default 0:\n"
            "no SSD tier; a temporary directory unless --ssd-dir).\n"
            "  --no-data      the real index only, same capacities in blocks (fast)\n"
            "  --unbounded    every tier unlimited (index only, nothing allocated)\n"
            "  default        KV bytes move through kvt_cache and an emulated engine and loads\n"
            "                 are byte-verified; the first %u requests unless --max-requests N\n"
            "  --window N     engine window in blocks for stores and verified loads (default 4)\n"
            "A fleet (index only, with --no-data or --unbounded; capacities are per node):\n"
            "  --nodes N      N nodes (2..%u) behind a router, replayed twice: each node hitting\n"
            "                 only what it holds (local) and pulling the rest of a prefix from\n"
            "                 the peer holding it (shared, the cluster tier)\n"
            "  --routing R    random (default; --seed N), sticky (by the first block) or\n"
            "                 prefix (to the node holding the longest prefix)\n",
            DEFAULT_DATA_REQUESTS, MAX_FLEET_NODES);
    return to == stdout ? 0 : 2;
}

static int parse_value(replay_opts *o, const char *a, const char *v)
{
    if (!strcmp(a, "--trace")) return o->trace = v, 0;
    if (!strcmp(a, "--ssd-dir")) return o->ssd_dir = v, 0;
    if (!strcmp(a, "--cpu-gb")) return parse_gib("replay", a, v, 1e-3, 1 << 20, &o->cpu_gib);
    if (!strcmp(a, "--ssd-gb")) return parse_gib("replay", a, v, 0, 1 << 24, &o->ssd_gib);
    if (!strcmp(a, "--window")) return parse_count("replay", a, v, 1, 64, &o->window);
    if (!strcmp(a, "--nodes")) return parse_count("replay", a, v, 2, MAX_FLEET_NODES, &o->nodes);
    if (!strcmp(a, "--seed")) return parse_count("replay", a, v, 0, UINT64_MAX, &o->seed);
    if (!strcmp(a, "--routing")) {
        fleet_routing r;
        if (fleet_routing_parse(v, &r))
            return fprintf(stderr, "kvtier replay: --routing %s: not random, sticky or prefix\n", v), -1;
        return o->routing = v, 0;
    }
    if (!strcmp(a, "--max-requests")) {
        o->max_set = true;
        return parse_count("replay", a, v, 1, TRACE_MAX_REQUESTS, &o->max_requests);
    }
    return cli_bad_arg("replay", a, false), -1;
}

static int check_opts(replay_opts *o)
{
    if (!o->trace) return fprintf(stderr, "kvtier replay: --trace FILE is required\n"), -1;
    if (o->no_data && o->unbounded)
        return fprintf(stderr, "kvtier replay: --unbounded already implies --no-data; give one\n"), -1;
    if (o->ssd_dir && o->ssd_gib <= 0)
        return fprintf(stderr, "kvtier replay: --ssd-dir needs --ssd-gb > 0\n"), -1;
    if ((o->no_data || o->unbounded) && (o->ssd_dir || o->window))
        return fprintf(stderr, "kvtier replay: --ssd-dir and --window apply to full-data "
                       "replay only\n"), -1;
    if (o->nodes && !o->no_data && !o->unbounded)
        return fprintf(stderr, "kvtier replay: --nodes replays the index only: add --no-data "
                       "or --unbounded\n"), -1;
    if (!o->nodes && (o->routing || o->seed))
        return fprintf(stderr, "kvtier replay: --routing and --seed apply to a fleet: add "
                       "--nodes N\n"), -1;
    if (!o->max_set) o->max_requests = (o->no_data || o->unbounded) ? TRACE_MAX_REQUESTS
                                                                     : DEFAULT_DATA_REQUESTS;
    if (!o->window) o->window = 4;
    return model_check(&o->m, "replay");
}

/* 0: run; 1: --help was printed; 2: bad usage (printed). */
static int parse_args(replay_opts *o, int argc, char **argv)
{
    o->cpu_gib = 16;
    static const char *const takes_value[] = {"--trace", "--ssd-dir", "--cpu-gb", "--ssd-gb",
        "--window", "--nodes", "--seed", "--routing", "--max-requests", NULL};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int taken = model_parse_opt(&o->m, "replay", argc, argv, &i);
        if (taken < 0) return 2;
        if (taken) continue;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) return usage(stdout), 1;
        if (!strcmp(a, "--json")) o->json = true;
        else if (!strcmp(a, "--no-data")) o->no_data = true;
        else if (!strcmp(a, "--unbounded")) o->unbounded = true;
        else if (strncmp(a, "--", 2) != 0)
            return fprintf(stderr, "kvtier replay: unexpected argument \"%s\"\n", a), 2;
        else if (!cli_arg_in(a, takes_value)) return cli_bad_arg("replay", a, false);
        else if (i + 1 >= argc) return cli_bad_arg("replay", a, true);
        else if (parse_value(o, a, argv[++i])) return 2;
    }
    return check_opts(o) ? 2 : 0;
}

/* Index-only replay of the first n requests; cpu 0 = unbounded. */
static int run_index(const trace *t, uint32_t n, uint64_t cpu, uint64_t ssd, bool quiet,
                     sim_counts *out)
{
    sim s;
    char err[256];
    uint64_t c = cpu ? cpu : t->num_unique, d = cpu ? ssd : 0;
    if (sim_init(&s, c, d, t->num_unique, t->max_blocks, err, sizeof err))
        return fprintf(stderr, "kvtier replay: %s\n", err), -1;
    kvt_hash128 *keys = malloc(((size_t)t->max_blocks + 1) * sizeof *keys);
    if (!keys) return sim_fini(&s), fprintf(stderr, "kvtier replay: out of memory\n"), -1;
    progress pr;
    progress_init(&pr, "replay", n);
    for (uint32_t i = 0; i < n; i++) {
        const trace_req *r = &t->reqs[i];
        sim_keys(trace_ids(t, r), r->num_blocks, keys);
        sim_request(&s, keys, r->num_blocks, r->input_length);
        if (!quiet && (i % 256 == 255 || i + 1 == n))
            progress_update(&pr, i + 1, sim_rate(s.c.hit_tokens, s.c.input_tokens));
    }
    if (!quiet) progress_done(&pr);
    *out = s.c;
    free(keys);
    sim_fini(&s);
    return 0;
}

static void pct_line(const char *what, uint64_t part, uint64_t whole, const char *unit)
{
    printf("  %-18s %5.1f%% (%llu of %llu %s)\n", what, 100 * sim_rate(part, whole),
           (unsigned long long)part, (unsigned long long)whole, unit);
}

static void report_fleet_text(const replay_opts *o, const replay_out *r)
{
    const fleet_result *f = r->fleet;
    printf("  fleet              %llu nodes, %s routing%s, %llu..%llu requests per node\n",
           (unsigned long long)o->nodes, o->routing ? o->routing : "random",
           o->routing && strcmp(o->routing, "random") ? "" : " (--seed)",
           (unsigned long long)f->min_requests_per_node,
           (unsigned long long)f->max_requests_per_node);
    pct_line("local token hits", f->local.hit_tokens, f->local.input_tokens, "tokens");
    pct_line("shared token hits", f->shared.hit_tokens, f->shared.input_tokens, "tokens");
    pct_line("  from peers", f->shared.cross_hit_tokens, f->shared.input_tokens, "tokens");
    pct_line("max (one cache)", r->max.hit_tokens, r->max.input_tokens, "tokens");
}

static void report_text(const replay_opts *o, const trace *t, const replay_out *r)
{
    const sim_counts *c = &r->c;
    const char *mode = o->unbounded ? "unbounded, index only" : o->no_data ? "index only"
                                                                            : "full data";
    printf("kvtier replay: %llu of %u requests of %s (%s, %s) in %.2f s\n",
           (unsigned long long)c->requests, t->num_reqs, o->trace, mode, model_name(&o->m),
           r->elapsed_s);
    if (!o->unbounded)
        printf("  tiers%s         CPU %llu blocks, SSD %llu blocks (%.1f MiB each)\n",
               r->fleet ? "/node" : "     ", (unsigned long long)r->cpu_blocks,
               (unsigned long long)r->ssd_blocks, (double)r->block_bytes / (1 << 20));
    if (r->fleet) return report_fleet_text(o, r);
    pct_line("block hit rate", c->hit_blocks, c->blocks, "blocks");
    pct_line("  from CPU", c->cpu_hit_blocks, c->blocks, "blocks");
    pct_line("  from SSD", c->ssd_hit_blocks, c->blocks, "blocks");
    pct_line("token hit rate", c->hit_tokens, c->input_tokens, "tokens");
    pct_line("  from CPU", c->cpu_hit_tokens, c->input_tokens, "tokens");
    pct_line("  from SSD", c->ssd_hit_tokens, c->input_tokens, "tokens");
    pct_line("max (unbounded)", r->max.hit_blocks, r->max.blocks, "blocks");
    printf("  stored             %llu blocks, evicted %llu\n", (unsigned long long)c->stored_blocks,
           (unsigned long long)c->evicted_blocks);
    if (!r->data) {
        printf("  bytes (modelled)   %.2f GiB loaded, %.2f GiB stored\n",
               (double)c->hit_blocks * r->block_bytes / REPLAY_GIB,
               (double)c->stored_blocks * r->block_bytes / REPLAY_GIB);
        return;
    }
    const data_result *d = r->data;
    printf("  loaded             %.2f GiB at %.2f GB/s\n", d->loaded_bytes / REPLAY_GIB,
           d->load_s > 0 ? d->loaded_bytes / d->load_s / 1e9 : 0.0);
    printf("  stored             %.2f GiB at %.2f GB/s (fill by the emulated engine: %.1f s)\n",
           d->stored_bytes / REPLAY_GIB, d->store_s > 0 ? d->stored_bytes / d->store_s / 1e9 : 0.0,
           d->fill_s);
    printf("  SSD                %llu blocks written, %llu read\n",
           (unsigned long long)d->ssd_written_blocks, (unsigned long long)d->ssd_read_blocks);
    if (d->truncated)
        printf("  note               %llu requests were larger than the tiers: stored in part\n",
               (unsigned long long)d->truncated);
    printf("  verification       %.2f GiB of %.2f GiB loaded checked (a window of up to %llu "
           "blocks per load), %llu mismatching bytes, %llu failed tasks: %s\n",
           d->verified_bytes / REPLAY_GIB, d->loaded_bytes / REPLAY_GIB,
           (unsigned long long)o->window, (unsigned long long)d->mismatches,
           (unsigned long long)d->failures, d->mismatches || d->failures ? "FAILED" : "OK");
}

static void add_counts(cJSON *j, const char *prefix, const sim_counts *c)
{
    char k[64];
#define NUM_(name, v) (snprintf(k, sizeof k, "%s%s", prefix, name), cJSON_AddNumberToObject(j, k, (double)(v)))
    NUM_("requests", c->requests);
    NUM_("blocks", c->blocks);
    NUM_("input_tokens", c->input_tokens);
    NUM_("hit_blocks", c->hit_blocks);
    NUM_("cpu_hit_blocks", c->cpu_hit_blocks);
    NUM_("ssd_hit_blocks", c->ssd_hit_blocks);
    NUM_("hit_tokens", c->hit_tokens);
    NUM_("cpu_hit_tokens", c->cpu_hit_tokens);
    NUM_("ssd_hit_tokens", c->ssd_hit_tokens);
    NUM_("block_hit_rate", sim_rate(c->hit_blocks, c->blocks));
    NUM_("cpu_block_hit_rate", sim_rate(c->cpu_hit_blocks, c->blocks));
    NUM_("ssd_block_hit_rate", sim_rate(c->ssd_hit_blocks, c->blocks));
    NUM_("token_hit_rate", sim_rate(c->hit_tokens, c->input_tokens));
    NUM_("cpu_token_hit_rate", sim_rate(c->cpu_hit_tokens, c->input_tokens));
    NUM_("ssd_token_hit_rate", sim_rate(c->ssd_hit_tokens, c->input_tokens));
    NUM_("stored_blocks", c->stored_blocks);
    NUM_("evicted_blocks", c->evicted_blocks);
#undef NUM_
}

static void add_data(cJSON *j, const data_result *d)
{
    cJSON_AddNumberToObject(j, "loaded_bytes", (double)d->loaded_bytes);
    cJSON_AddNumberToObject(j, "stored_bytes", (double)d->stored_bytes);
    cJSON_AddNumberToObject(j, "load_gbps", d->load_s > 0 ? d->loaded_bytes / d->load_s / 1e9 : 0);
    cJSON_AddNumberToObject(j, "store_gbps", d->store_s > 0 ? d->stored_bytes / d->store_s / 1e9 : 0);
    cJSON_AddNumberToObject(j, "fill_s", d->fill_s);
    cJSON_AddNumberToObject(j, "ssd_written_blocks", (double)d->ssd_written_blocks);
    cJSON_AddNumberToObject(j, "ssd_read_blocks", (double)d->ssd_read_blocks);
    cJSON_AddNumberToObject(j, "verified_bytes", (double)d->verified_bytes);
    cJSON_AddNumberToObject(j, "mismatches", (double)d->mismatches);
    cJSON_AddNumberToObject(j, "failed_tasks", (double)d->failures);
    cJSON_AddNumberToObject(j, "truncated_requests", (double)d->truncated);
}

static void add_fleet(cJSON *j, const replay_opts *o, const fleet_result *f)
{
    cJSON_AddNumberToObject(j, "nodes", (double)o->nodes);
    cJSON_AddStringToObject(j, "routing", o->routing ? o->routing : "random");
    cJSON_AddNumberToObject(j, "seed", (double)o->seed);
    cJSON_AddNumberToObject(j, "min_requests_per_node", (double)f->min_requests_per_node);
    cJSON_AddNumberToObject(j, "max_requests_per_node", (double)f->max_requests_per_node);
    cJSON_AddNumberToObject(j, "local_token_hit_rate",
                            sim_rate(f->local.hit_tokens, f->local.input_tokens));
    cJSON_AddNumberToObject(j, "shared_token_hit_rate",
                            sim_rate(f->shared.hit_tokens, f->shared.input_tokens));
    /* The names issue 26 and docs/cluster.md use for the same two rates. */
    cJSON_AddNumberToObject(j, "hit_rate_local", sim_rate(f->local.hit_tokens, f->local.input_tokens));
    cJSON_AddNumberToObject(j, "hit_rate_shared",
                            sim_rate(f->shared.hit_tokens, f->shared.input_tokens));
    cJSON_AddNumberToObject(j, "local_hit_tokens", (double)f->local.hit_tokens);
    cJSON_AddNumberToObject(j, "cross_node_hit_tokens", (double)f->shared.cross_hit_tokens);
    cJSON_AddNumberToObject(j, "cross_node_hit_blocks", (double)f->shared.cross_hit_blocks);
}

static int report_json(const replay_opts *o, const trace *t, const replay_out *r)
{
    cJSON *j = cJSON_CreateObject();
    if (!j) return 1;
    cJSON_AddStringToObject(j, "trace", o->trace);
    cJSON_AddStringToObject(j, "mode", o->unbounded ? "unbounded" : o->no_data ? "index" : "data");
    cJSON_AddStringToObject(j, "model", model_name(&o->m));
    cJSON_AddNumberToObject(j, "trace_requests", t->num_reqs);
    cJSON_AddNumberToObject(j, "block_bytes", (double)r->block_bytes);
    cJSON_AddNumberToObject(j, "cpu_blocks", (double)r->cpu_blocks);
    cJSON_AddNumberToObject(j, "ssd_blocks", (double)r->ssd_blocks);
    add_counts(j, "", &r->c);
    cJSON_AddNumberToObject(j, "max_block_hit_rate", sim_rate(r->max.hit_blocks, r->max.blocks));
    cJSON_AddNumberToObject(j, "max_token_hit_rate", sim_rate(r->max.hit_tokens, r->max.input_tokens));
    cJSON_AddNumberToObject(j, "elapsed_s", r->elapsed_s);
    if (r->data) add_data(j, r->data);
    if (r->fleet) add_fleet(j, o, r->fleet);
    char *s = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    if (!s) return 1;
    printf("%s\n", s);
    free(s);
    return 0;
}

/* --nodes: the same capacities per node; r->c is the shared pass. */
static int run_fleet(const replay_opts *o, const trace *t, uint32_t n, replay_out *r,
                     fleet_result *fr)
{
    fleet_opts fo = {.nodes = (uint32_t)o->nodes, .seed = o->seed, .max_requests = n,
                     .cpu_blocks = r->cpu_blocks, .ssd_blocks = r->ssd_blocks};
    if (o->routing) (void)fleet_routing_parse(o->routing, &fo.routing);
    if (fleet_run(t, &fo, fr)) return 1;
    r->c = fr->shared;
    r->fleet = fr;
    return 0;
}

static int run(const replay_opts *o, const trace *t, replay_out *r, data_result *d,
               fleet_result *fr)
{
    uint32_t n = o->max_requests < t->num_reqs ? (uint32_t)o->max_requests : t->num_reqs;
    r->block_bytes = model_block_bytes(&o->m, "replay");
    if (!r->block_bytes) return 1;
    uint64_t t0 = kvt__now_ns();
    if (o->nodes) {
        if (!o->unbounded) {
            r->cpu_blocks = (uint64_t)(o->cpu_gib * REPLAY_GIB) / r->block_bytes;
            r->ssd_blocks = (uint64_t)(o->ssd_gib * REPLAY_GIB) / r->block_bytes;
            if (!r->cpu_blocks)
                return fprintf(stderr, "kvtier replay: --cpu-gb %g holds no block of %.1f MiB\n",
                               o->cpu_gib, (double)r->block_bytes / (1 << 20)), 1;
        }
        if (run_fleet(o, t, n, r, fr)) return 1;
    } else if (o->unbounded) {
        if (run_index(t, n, 0, 0, o->json, &r->c)) return 1;
        r->cpu_blocks = t->num_unique;
    } else if (o->no_data) {
        r->cpu_blocks = (uint64_t)(o->cpu_gib * REPLAY_GIB) / r->block_bytes;
        r->ssd_blocks = (uint64_t)(o->ssd_gib * REPLAY_GIB) / r->block_bytes;
        if (!r->cpu_blocks)
            return fprintf(stderr, "kvtier replay: --cpu-gb %g holds no block of %.1f MiB\n",
                           o->cpu_gib, (double)r->block_bytes / (1 << 20)), 1;
        if (run_index(t, n, r->cpu_blocks, r->ssd_blocks, o->json, &r->c)) return 1;
    } else {
        data_opts dopt = {.cpu_gib = o->cpu_gib, .ssd_gib = o->ssd_gib, .ssd_dir = o->ssd_dir,
                          .max_requests = n, .window = (uint32_t)o->window, .quiet = o->json};
        if (replay_data(t, &o->m, &dopt, d)) return 1;
        r->c = d->c;
        r->cpu_blocks = d->cpu_blocks;
        r->ssd_blocks = d->ssd_blocks;
        r->data = d;
    }
    r->elapsed_s = (double)(kvt__now_ns() - t0) / 1e9;
    return run_index(t, n, 0, 0, true, &r->max) ? 1 : 0;
}

int kvt_cmd_replay(int argc, char **argv)
{
    replay_opts o = {0};
    int rc = parse_args(&o, argc, argv);
    if (rc) return rc == 1 ? 0 : rc;
    trace t;
    char err[600];
    if (trace_load(o.trace, &t, err, sizeof err))
        return fprintf(stderr, "kvtier replay: %s\n", err), 1;
    replay_out r = {0};
    data_result d;
    fleet_result fr;
    rc = run(&o, &t, &r, &d, &fr);
    if (!rc) rc = o.json ? report_json(&o, &t, &r) : (report_text(&o, &t, &r), 0);
    if (!rc && r.data && (d.mismatches || d.failures)) rc = 1;
    if (!rc && !o.json && r.c.requests < t.num_reqs)
        printf("  note               replayed the first %llu requests only (--max-requests)\n",
               (unsigned long long)r.c.requests);
    trace_free(&t);
    return rc;
}
