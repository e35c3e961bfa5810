/* cmd_plan.c - `kvtier plan --trace FILE`: hit rate against capacity, for
 * CPU-only caches of log-spaced sizes and for CPU + SSD combinations, from
 * ONE walk over the trace that feeds every index simulation (replay_sim.h)
 * at once. Writes a CSV and an SVG plot (replay_svg.c). docs/replay.md. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_util.h"
#include "cmds.h"
#include "replay_plan.h"
#include "replay.h"
#include "util/clock.h"

#define PLAN_MAX_SSD 8

typedef struct plan_opts {
    const char *trace, *csv, *svg;
    uint64_t points;
    double ssd_gib[PLAN_MAX_SSD];
    uint32_t num_ssd;
    model_opts m;
} plan_opts;

static int usage(FILE *to)
{
    fprintf(to,
            "usage: kvtier plan --trace FILE [--out-csv F] [--out-svg F] [--points N]\n"
            "                   [--ssd-gb G[,G...]] [--model NAME | custom geometry options]\n"
            "Sweeps cache capacity in one pass over a Mooncake-format trace: N log-spaced CPU\n"
            "sizes (default 12) from a few blocks up to the trace's distinct blocks, alone and\n"
            "with each SSD size (default: 1/16, 1/4 and all of the distinct blocks), every one an\n"
            "index-only replay (kvtier replay --no-data). Writes the CSV (default plan.csv) and\n"
            "an SVG plot of token hit rate against CPU GiB with the unbounded maximum (default\n"
            "plan.svg), and prints the table.\n");
    return to == stdout ? 0 : 2;
}

static int parse_ssd_list(plan_opts *o, const char *v)
{
    char buf[256];
    if (!v || strlen(v) >= sizeof buf)
        return fprintf(stderr, "kvtier plan: --ssd-gb: give up to %d sizes, comma separated\n",
                       PLAN_MAX_SSD), -1;
    strcpy(buf, v);
    o->num_ssd = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (o->num_ssd == PLAN_MAX_SSD)
            return fprintf(stderr, "kvtier plan: --ssd-gb: at most %d sizes\n", PLAN_MAX_SSD), -1;
        if (parse_gib("plan", "--ssd-gb", tok, 1e-3, 1 << 24, &o->ssd_gib[o->num_ssd])) return -1;
        o->num_ssd++;
    }
    if (!o->num_ssd) return fprintf(stderr, "kvtier plan: --ssd-gb: no size given\n"), -1;
    return 0;
}

static int parse_args(plan_opts *o, int argc, char **argv)
{
    o->csv = "plan.csv";
    o->svg = "plan.svg";
    o->points = 12;
    static const char *const takes_value[] = {"--trace", "--out-csv", "--out-svg", "--points",
                                              "--ssd-gb", NULL};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int taken = model_parse_opt(&o->m, "plan", argc, argv, &i);
        if (taken < 0) return 2;
        if (taken) continue;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) return usage(stdout), 1;
        if (strncmp(a, "--", 2) != 0)
            return fprintf(stderr, "kvtier plan: unexpected argument \"%s\"\n", a), 2;
        if (!cli_arg_in(a, takes_value)) return cli_bad_arg("plan", a, false);
        if (!v) return cli_bad_arg("plan", a, true);
        i++;
        if (!strcmp(a, "--trace")) o->trace = v;
        else if (!strcmp(a, "--out-csv")) o->csv = v;
        else if (!strcmp(a, "--out-svg")) o->svg = v;
        else if (!strcmp(a, "--points")) {
            if (parse_count("plan", a, v, 2, 64, &o->points)) return 2;
        } else if (!strcmp(a, "--ssd-gb")) {
            if (parse_ssd_list(o, v)) return 2;
        } else return cli_bad_arg("plan", a, false);
    }
    if (!o->trace) return fprintf(stderr, "kvtier plan: --trace FILE is required\n"), 2;
    return model_check(&o->m, "plan") ? 2 : 0;
}

/* Log-spaced CPU sizes in blocks, from about u/1000 (at least 4) to u. */
static uint32_t cpu_points(uint32_t u, uint32_t n, uint64_t *out)
{
    double lo = u / 1000.0 < 4 ? 4 : u / 1000.0, hi = u;
    if (hi < lo) hi = lo;
    uint32_t k = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint64_t b = (uint64_t)llround(lo * pow(hi / lo, n > 1 ? (double)i / (n - 1) : 1.0));
        if (k == 0 || b > out[k - 1]) out[k++] = b; /* small traces: drop repeats */
    }
    return k;
}

/* Every simulation's configuration, CPU-only points first. A CPU + SSD
 * point with CPU >= SSD adds nothing in an inclusive design: skipped. */
static uint32_t make_points(const plan_opts *o, uint32_t u, uint64_t bb, plan_point *p)
{
    uint64_t cpu[64];
    uint32_t nc = cpu_points(u, (uint32_t)o->points, cpu), n = 0;
    for (uint32_t i = 0; i < nc; i++) p[n++] = (plan_point){.series = 0, .cpu_blocks = cpu[i]};
    double def[3] = {u / 16.0, u / 4.0, u};
    uint32_t ns = o->num_ssd ? o->num_ssd : 3;
    for (uint32_t s = 0; s < ns; s++) {
        uint64_t sb = o->num_ssd ? (uint64_t)(o->ssd_gib[s] * REPLAY_GIB / bb) : (uint64_t)ceil(def[s]);
        for (uint32_t i = 0; i < nc; i++)
            if (sb > cpu[i]) p[n++] = (plan_point){.series = s + 1, .cpu_blocks = cpu[i], .ssd_blocks = sb};
    }
    return n;
}

/* The one pass: each request's keys are computed once and fed to every
 * simulation in turn. */
static int sweep(const trace *t, plan_point *p, uint32_t n, sim_counts *max)
{
    sim *sims = calloc((size_t)n + 1, sizeof *sims);
    kvt_hash128 *keys = malloc(((size_t)t->max_blocks + 1) * sizeof *keys);
    char err[256];
    int rc = sims && keys ? 0 : (snprintf(err, sizeof err, "out of memory"), -1);
    uint32_t made = 0;
    for (; !rc && made <= n; made++) { /* sims[n]: unbounded, the maximum */
        uint64_t c = made < n ? p[made].cpu_blocks : t->num_unique;
        uint64_t s = made < n ? p[made].ssd_blocks : 0;
        rc = sim_init(&sims[made], c, s, t->num_unique, t->max_blocks, err, sizeof err);
        if (rc) break;
    }
    progress pr;
    progress_init(&pr, "plan", t->num_reqs);
    for (uint32_t i = 0; !rc && i < t->num_reqs; i++) {
        const trace_req *r = &t->reqs[i];
        sim_keys(trace_ids(t, r), r->num_blocks, keys);
        for (uint32_t k = 0; k <= n; k++) sim_request(&sims[k], keys, r->num_blocks, r->input_length);
        if (i % 256 == 255 || i + 1 == t->num_reqs)
            progress_update(&pr, i + 1, sim_rate(sims[n].c.hit_tokens, sims[n].c.input_tokens));
    }
    progress_done(&pr);
    for (uint32_t k = 0; k < made && k <= n; k++) {
        if (!rc && k < n) p[k].c = sims[k].c;
        if (!rc && k == n) *max = sims[k].c;
        sim_fini(&sims[k]);
    }
    free(sims);
    free(keys);
    if (rc) fprintf(stderr, "kvtier plan: %s\n", err);
    return rc;
}

static void print_table(const plan_point *p, uint32_t n, const sim_counts *max, uint64_t bb)
{
    printf("%-10s %12s %12s %10s %10s %10s\n", "series", "cpu_gib", "ssd_gib", "block_hit",
           "token_hit", "from_cpu");
    for (uint32_t i = 0; i < n; i++)
        printf("%-10s %12.1f %12.1f %9.1f%% %9.1f%% %9.1f%%\n", p[i].series ? "cpu+ssd" : "cpu",
               p[i].cpu_blocks * (double)bb / REPLAY_GIB, p[i].ssd_blocks * (double)bb / REPLAY_GIB,
               100 * sim_rate(p[i].c.hit_blocks, p[i].c.blocks),
               100 * sim_rate(p[i].c.hit_tokens, p[i].c.input_tokens),
               100 * sim_rate(p[i].c.cpu_hit_tokens, p[i].c.input_tokens));
    printf("%-10s %12s %12s %9.1f%% %9.1f%%\n", "max", "unbounded", "-",
           100 * sim_rate(max->hit_blocks, max->blocks),
           100 * sim_rate(max->hit_tokens, max->input_tokens));
}

int kvt_cmd_plan(int argc, char **argv)
{
    plan_opts o = {0};
    int rc = parse_args(&o, argc, argv);
    if (rc) return rc == 1 ? 0 : rc;
    uint64_t bb = model_block_bytes(&o.m, "plan");
    if (!bb) return 1;
    trace t;
    char err[600];
    if (trace_load(o.trace, &t, err, sizeof err)) return fprintf(stderr, "kvtier plan: %s\n", err), 1;
    plan_point pts[64 * (PLAN_MAX_SSD + 1)];
    uint32_t n = make_points(&o, t.num_unique, bb, pts);
    sim_counts max = {0};
    uint64_t t0 = kvt__now_ns();
    rc = sweep(&t, pts, n, &max) ? 1 : 0;
    double secs = (double)(kvt__now_ns() - t0) / 1e9;
    plan_chart ch = {.points = pts, .num_points = n, .max = max, .block_bytes = bb,
                     .model = model_name(&o.m), .trace = o.trace, .requests = t.num_reqs};
    if (!rc && plan_write_csv(o.csv, &ch)) rc = 1;
    if (!rc && plan_write_svg(o.svg, &ch)) rc = 1;
    if (!rc) {
        print_table(pts, n, &max, bb);
        printf("kvtier plan: %u simulations in one pass over %u requests in %.2f s; wrote %s and %s\n",
               n + 1, t.num_reqs, secs, o.csv, o.svg);
    }
    trace_free(&t);
    return rc;
}
