/* cmd_stats.c - `kvtier stats --socket PATH [--json] [--watch [--count N]]`:
 * the figures of a running `kvtier serve`, one section per geometry's tier
 * and the totals (kvt_server_snapshot). It never attaches, so it makes
 * no tier: --model/--tp/--page name a geometry whose tiers to show, and one
 * the server does not hold is an error naming the ones it does. --watch redraws
 * every second like top until SIGINT/SIGTERM or --count frames. Exit 0, 1
 * when the server cannot be reached or refuses, 2 on usage. */
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "cli_util.h"
#include "cmds.h"

static int usage(FILE *f, int rc)
{
    fprintf(f,
            "usage: kvtier stats --socket PATH [--json] [--watch] [--count N]\n"
            "                    [--model M] [--tp N] [--page T] [--timeout-ms MS]\n"
            "  --socket PATH   the socket of a running kvtier serve\n"
            "  --json          one JSON object per report (one line each)\n"
            "  --watch         report every second until Ctrl-C (or --count reports), with\n"
            "                  rates per second; a server that restarts is re-attached\n"
            "  --count N       with --watch: stop after N reports\n"
            "  --model/--tp/--page  optional: show only this geometry's tier (an error\n"
            "                  naming the server's geometries when it holds none of it)\n");
    return rc;
}

typedef struct field {
    const char *name;
    size_t off;
} field;

#define F(n) {#n, offsetof(kvt_cache_stats, n)}
static const field FIELDS[] = {
    F(lookups), F(lookup_tokens), F(hit_tokens), F(ssd_hit_tokens), F(stores),
    F(stored_blocks), F(stored_bytes), F(loads), F(loaded_blocks), F(loaded_bytes),
    F(evicted_blocks), F(cpu_dropped_blocks), F(failed_tasks), F(cancelled_tasks),
    F(expired_tasks), F(cpu_blocks_used), F(cpu_blocks_total), F(block_bytes),
    F(ssd_blocks_used), F(ssd_blocks_total), F(ssd_written_blocks), F(ssd_read_blocks),
    F(ssd_write_errors), F(ssd_read_errors), F(corrupt_blocks), F(recovered_blocks),
    F(index_blocks), F(index_bytes), F(tasks_in_flight),
};
#undef F

static uint64_t get(const kvt_cache_stats *s, const field *f)
{
    uint64_t v;
    memcpy(&v, (const char *)s + f->off, sizeof v);
    return v;
}

static double pct(uint64_t a, uint64_t b) { return b ? 100.0 * (double)a / (double)b : 0.0; }

/* "<text, escaped>" (control characters dropped) */
static void json_str(const char *text)
{
    putchar('"');
    for (const char *p = text; *p; p++) {
        if (*p == '"' || *p == '\\') putchar('\\');
        if ((unsigned char)*p >= 0x20) putchar(*p);
    }
    putchar('"');
}

/* {"socket":"<sock, escaped>" */
static void json_open(const char *sock)
{
    printf("{\"socket\":");
    json_str(sock);
}

static void print_fields(const kvt_cache_stats *s, bool total)
{
    const char *sep = "";
    for (size_t i = 0; i < sizeof FIELDS / sizeof FIELDS[0]; i++) {
        /* Blocks of different sizes do not add up: totals give bytes. */
        if (total && (!strcmp(FIELDS[i].name, "block_bytes") ||
                      !strncmp(FIELDS[i].name, "cpu_blocks_", 11)))
            continue;
        printf("%s\"%s\":%llu", sep, FIELDS[i].name, (unsigned long long)get(s, &FIELDS[i]));
        sep = ",";
    }
    double hit = s->lookup_tokens ? (double)s->hit_tokens / (double)s->lookup_tokens : 0.0;
    printf(",\"hit_rate\":%.4f", hit);
}

/* The CPU tier in bytes over all geometries. They share one capacity
 * (each tier may grow to all of it), so the capacity is the largest
 * tier's, not the sum. */
static void cpu_bytes(const kvt_tier_stats *t, uint32_t n, uint64_t *used, uint64_t *cap)
{
    *used = *cap = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint64_t bb = t[i].stats.block_bytes, c = t[i].stats.cpu_blocks_total * bb;
        *used += t[i].stats.cpu_blocks_used * bb;
        if (c > *cap) *cap = c;
    }
}

/* Every field of the tiers added up (block_bytes aside). */
static void sum(kvt_cache_stats *tot, const kvt_tier_stats *t, uint32_t n)
{
    memset(tot, 0, sizeof *tot);
    for (uint32_t i = 0; i < n; i++)
        for (size_t k = 0; k < sizeof FIELDS / sizeof FIELDS[0]; k++) {
            uint64_t v = get(tot, &FIELDS[k]) + get(&t[i].stats, &FIELDS[k]);
            memcpy((char *)tot + FIELDS[k].off, &v, sizeof v);
        }
    tot->block_bytes = 0;
}

/* The server's server_quotas: "quotas":[...] in JSON, else a section. */
static void print_quotas(const kvt_quota_usage *q, uint32_t nq, bool json)
{
    double mib = 1.0 / (1024.0 * 1024.0);
    if (json) printf(",\"quotas\":[");
    else if (nq) printf("quotas (server_quotas, CPU tier bytes per namespace prefix)\n");
    for (uint32_t i = 0; i < nq; i++) {
        if (json) {
            printf("%s{\"prefix\":", i ? "," : "");
            json_str(q[i].prefix);
            printf(",\"limit_bytes\":%llu,\"used_bytes\":%llu,\"limited_blocks\":%llu,"
                   "\"evicted_blocks\":%llu}", (unsigned long long)q[i].limit_bytes,
                   (unsigned long long)q[i].used_bytes, (unsigned long long)q[i].limited_blocks,
                   (unsigned long long)q[i].evicted_blocks);
        } else {
            printf("  %-24s %.1f / %.1f MiB (%.1f%%); %llu own blocks evicted for room, %llu "
                   "blocks refused at the quota\n", q[i].prefix,
                   (double)q[i].used_bytes * mib, (double)q[i].limit_bytes * mib,
                   pct(q[i].used_bytes, q[i].limit_bytes),
                   (unsigned long long)q[i].evicted_blocks,
                   (unsigned long long)q[i].limited_blocks);
        }
    }
    if (json) printf("]");
}

/* The server as a whole: one line under the header, or "server":{...}. */
static void print_server(const kvt_server_info *in, bool json)
{
    if (json) {
        printf(",\"server\":{\"version\":");
        json_str(in->version);
        printf(",\"pid\":%u,\"uptime_ms\":%llu,\"clients\":%u,\"max_clients\":%u,"
               "\"geometries\":%u,\"max_geometries\":%u,\"cpu_capacity_bytes\":%llu,"
               "\"metrics_port\":%u}", in->pid, (unsigned long long)in->uptime_ms, in->clients,
               in->max_clients, in->geometries, in->max_geometries,
               (unsigned long long)in->cpu_capacity_bytes, in->metrics_port);
        return;
    }
    uint64_t s = in->uptime_ms / 1000;
    char port[24] = "none";
    if (in->metrics_port) snprintf(port, sizeof port, "%u", in->metrics_port);
    printf("  server       version %s, pid %u, up %llud %02llu:%02llu:%02llu; %u client%s "
           "attached (of %u); %u of %u geometries; CPU tier %.1f MiB; metrics port %s\n",
           in->version, in->pid, (unsigned long long)(s / 86400),
           (unsigned long long)(s / 3600 % 24), (unsigned long long)(s / 60 % 60),
           (unsigned long long)(s % 60), in->clients, in->clients == 1 ? "" : "s",
           in->max_clients, in->geometries, in->max_geometries,
           (double)in->cpu_capacity_bytes / (1024.0 * 1024.0), port);
}

static void print_json(const char *sock, const kvt_tier_stats *t, uint32_t n,
                       const kvt_cache_stats *tot, const kvt_quota_usage *q, uint32_t nq,
                       const kvt_server_info *info)
{
    json_open(sock);
    printf(",\"geometries\":[");
    for (uint32_t i = 0; i < n; i++) {
        printf("%s{\"geometry\":\"%s\",\"num_layers\":%u,\"bytes_per_token\":%llu,"
               "\"tokens_per_page\":%u,\"block_tokens\":%u,", i ? "," : "", t[i].geometry,
               t[i].num_layers, (unsigned long long)t[i].bytes_per_token, t[i].tokens_per_page,
               t[i].block_tokens);
        print_fields(&t[i].stats, false);
        printf("}");
    }
    uint64_t used, cap;
    cpu_bytes(t, n, &used, &cap);
    printf("],\"totals\":{\"geometries\":%u,\"cpu_bytes_used\":%llu,\"cpu_bytes_capacity\":%llu,",
           n, (unsigned long long)used, (unsigned long long)cap);
    print_fields(tot, true);
    printf("}");
    print_quotas(q, nq, true);
    print_server(info, true);
    printf("}\n");
}

/* --watch's rates: what changed per second since the previous report
 * (none for the first, or after the server restarted: counters went back). */
static void print_rates(const kvt_cache_stats *s, const kvt_cache_stats *prev, double secs)
{
    if (!prev || secs <= 0 || s->lookups < prev->lookups || s->loaded_bytes < prev->loaded_bytes ||
        s->stored_bytes < prev->stored_bytes)
        return;
    double mib = 1.0 / (1024.0 * 1024.0);
    uint64_t tok = s->lookup_tokens - prev->lookup_tokens, hit = s->hit_tokens - prev->hit_tokens;
    printf("  per second   %.0f lookups (%.1f%% hit), %.0f loads %.1f MiB/s, %.0f stores %.1f MiB/s\n",
           (double)(s->lookups - prev->lookups) / secs, pct(hit, tok),
           (double)(s->loads - prev->loads) / secs,
           (double)(s->loaded_bytes - prev->loaded_bytes) * mib / secs,
           (double)(s->stores - prev->stores) / secs,
           (double)(s->stored_bytes - prev->stored_bytes) * mib / secs);
}

/* One tier's figures, or (tiers given) the totals of these n. */
static void print_section(const kvt_cache_stats *s, const kvt_tier_stats *tiers, uint32_t n)
{
    double mib = 1.0 / (1024.0 * 1024.0);
    printf("  lookups      %llu (%llu tokens, %.1f%% hit, %llu from SSD)\n",
           (unsigned long long)s->lookups, (unsigned long long)s->lookup_tokens,
           pct(s->hit_tokens, s->lookup_tokens), (unsigned long long)s->ssd_hit_tokens);
    printf("  stores       %llu (%llu blocks, %.1f MiB)\n", (unsigned long long)s->stores,
           (unsigned long long)s->stored_blocks, (double)s->stored_bytes * mib);
    printf("  loads        %llu (%llu blocks, %.1f MiB)\n", (unsigned long long)s->loads,
           (unsigned long long)s->loaded_blocks, (double)s->loaded_bytes * mib);
    uint64_t used, cap;
    cpu_bytes(tiers, n, &used, &cap);
    if (tiers)
        printf("  CPU tier     %.1f / %.1f MiB (%.1f%%), one capacity shared by the geometries\n",
               (double)used * mib, (double)cap * mib, pct(used, cap));
    else
        printf("  CPU tier     %llu / %llu blocks (%.1f%%) of %llu bytes\n",
               (unsigned long long)s->cpu_blocks_used, (unsigned long long)s->cpu_blocks_total,
               pct(s->cpu_blocks_used, s->cpu_blocks_total), (unsigned long long)s->block_bytes);
    printf("  SSD tier     %llu / %llu blocks (%llu written, %llu read, %llu+%llu errors)\n",
           (unsigned long long)s->ssd_blocks_used, (unsigned long long)s->ssd_blocks_total,
           (unsigned long long)s->ssd_written_blocks, (unsigned long long)s->ssd_read_blocks,
           (unsigned long long)s->ssd_write_errors, (unsigned long long)s->ssd_read_errors);
    printf("  index        %llu blocks, %.1f MiB; %llu tasks in flight\n",
           (unsigned long long)s->index_blocks, (double)s->index_bytes * mib,
           (unsigned long long)s->tasks_in_flight);
    printf("  evicted      %llu blocks (%llu CPU copies dropped); %llu corrupt, %llu recovered\n",
           (unsigned long long)s->evicted_blocks, (unsigned long long)s->cpu_dropped_blocks,
           (unsigned long long)s->corrupt_blocks, (unsigned long long)s->recovered_blocks);
    printf("  tasks        %llu failed, %llu cancelled, %llu expired\n",
           (unsigned long long)s->failed_tasks, (unsigned long long)s->cancelled_tasks,
           (unsigned long long)s->expired_tasks);
}

/* A section per geometry, then the totals when there are several (or none). */
static void print_text(const char *sock, const kvt_tier_stats *t, uint32_t n,
                       const kvt_cache_stats *tot, const kvt_quota_usage *q, uint32_t nq,
                       const kvt_server_info *info, bool watch)
{
    if (watch && isatty(STDOUT_FILENO)) printf("\033[H\033[2J");
    time_t now = time(NULL);
    struct tm tm;
    char ts[32];
    strftime(ts, sizeof ts, "%H:%M:%S", localtime_r(&now, &tm));
    printf("kvtier server %s  %s  (%u geometr%s)\n", sock, ts, n, n == 1 ? "y" : "ies");
    print_server(info, false);
    if (n == 0) printf("  no tier yet: the server serves any geometry and no client attached yet\n");
    for (uint32_t i = 0; i < n; i++) {
        printf("geometry %s: %u layers, %llu bytes per token, %u tokens per page, block_tokens %u\n",
               t[i].geometry, t[i].num_layers, (unsigned long long)t[i].bytes_per_token,
               t[i].tokens_per_page, t[i].block_tokens);
        print_section(&t[i].stats, NULL, 0);
    }
    if (n != 1) {
        printf("totals (%u geometr%s)\n", n, n == 1 ? "y" : "ies");
        print_section(tot, t, n);
    }
    print_quotas(q, nq, false);
}

int kvt_cmd_stats(int argc, char **argv)
{
    const char *sock = NULL, *model = NULL;
    uint64_t tp = 1, page = 16, count = 0, timeout = 2000;
    bool json = false, watch = false, geo_flag = false;
    static const char *const takes_value[] = {"--socket", "--model", "--tp", "--page", "--count",
                                              "--timeout-ms", NULL};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) return usage(stdout, 0);
        if (!strcmp(a, "--json")) { json = true; continue; }
        if (!strcmp(a, "--watch")) { watch = true; continue; }
        if (!cli_arg_in(a, takes_value)) return cli_bad_arg("stats", a, false);
        if (!v) return cli_bad_arg("stats", a, true);
        i++;
        if (!strcmp(a, "--socket")) sock = v;
        else if (!strcmp(a, "--model")) model = v;
        else if (!strcmp(a, "--tp") && demo_parse_u64(v, &tp) && tp >= 1 && tp <= 1024) geo_flag = true;
        else if (!strcmp(a, "--page") && demo_parse_u64(v, &page) && page >= 1 && page <= 65536) geo_flag = true;
        else if (!strcmp(a, "--count") && demo_parse_u64(v, &count) && count >= 1) {}
        else if (!strcmp(a, "--timeout-ms") && demo_parse_u64(v, &timeout) && timeout >= 1 &&
                 timeout <= 600000) {}
        else return cli_bad_value("stats", a, v);
    }
    if (!sock || (count && !watch)) return usage(stderr, 2);
    kvt_geometry *geo = NULL; /* NULL: the server's */
    kvt_status st = KVT_OK;
    if (model || geo_flag)
        st = kvt_geometry_preset(&geo, model ? model : "tiny", (uint32_t)page, (uint32_t)tp);
    if (st) return demo_error("--model", st);
    cli_stop_on_signals();
    int rc = 0;
    kvt_cache_stats prev = {0};
    bool have_prev = false;
    struct timespec t_prev = {0, 0};
    static kvt_tier_stats tiers[64];
    static kvt_quota_usage quotas[32];
    kvt_server_info info;
    for (uint64_t n = 0; !cli_stop;) {
        uint32_t held = 0, nq = 0;
        struct timespec t_now;
        /* One reading each report (one round trip, so the header, tiers
         * and quotas agree): nothing attaches, no tier is made. */
        st = kvt_server_snapshot(sock, geo, (int64_t)timeout, &info, tiers, 64, &held, quotas, 32,
                                 &nq);
        if (nq > 32) nq = 32;
        if (st && (!watch || st != KVT_ECONN)) {
            rc = demo_error(sock, st);
            break;
        }
        if (held > 64) held = 64;
        kvt_cache_stats tot;
        sum(&tot, tiers, held);
        clock_gettime(CLOCK_MONOTONIC, &t_now);
        if (st) { /* --watch: the server went away; asked again next second */
            if (json) {
                json_open(sock);
                printf(",\"error\":\"KVT_ECONN\"}\n");
            } else {
                printf("kvtier server %s: not answering (%s); retrying\n", sock, kvt_last_error());
            }
            have_prev = false;
        } else if (json) {
            print_json(sock, tiers, held, &tot, quotas, nq, &info);
        } else {
            print_text(sock, tiers, held, &tot, quotas, nq, &info, watch);
            if (watch)
                print_rates(&tot, have_prev ? &prev : NULL,
                            (double)(t_now.tv_sec - t_prev.tv_sec) +
                                (double)(t_now.tv_nsec - t_prev.tv_nsec) / 1e9);
        }
        if (!st) {
            prev = tot;
            have_prev = true;
            t_prev = t_now;
        }
        fflush(stdout);
        if (!watch || (count && ++n >= count)) break;
        /* A second, in slices so Ctrl-C ends it at once. */
        for (int i = 0; i < 20 && !cli_stop; i++) {
            struct timespec ts = {0, 50000000};
            nanosleep(&ts, NULL);
        }
    }
    kvt_geometry_destroy(geo);
    return rc;
}
