/* bench_client.c - `kvtier bench client [--json] [--rounds N]`: loads and
 * stores through a client attached to a node server (in this process, on
 * its own thread, over the real socket and shared tier) against an
 * in-process kvt_cache on the same blocks in the same run; the control
 * round trip (p50/p99) and miss lookups per second through the socket.
 * A third side, an in-process cache on 4 KiB pages (huge_pages false),
 * shows what the page size alone costs here: the shared tier has 4 KiB
 * pages where the system gives it no huge pages (tier_pages says which).
 * Each tier is twice the last-level cache (at least 256 MiB, at most
 * 2 GiB): a store then lands in memory, as in a real tier of many GB,
 * not in a cache that happens to hold the whole working set (this VM
 * reports 480 MiB of L3, and a 256 MiB tier made single rounds swing 2x).
 * A store is timed until its wait returns (the engine's pages are free);
 * through the server it is visible to other clients once the server took
 * its END, so that time is measured too (store_visible: one more round
 * trip), and each load starts after it; each load checks every layer of
 * every block against the checksums it was stored with. Every loaded byte is verified; nothing is printed
 * as a result otherwise. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"
#include "bench_util.h"
#include "cli_util.h"
#include "server/server.h"
#include "util/clock.h"

#define TOKENS 2049 /* 128 blocks of 16 and the last token */
#define TPP 16
#define PAGES (TOKENS / TPP + 1)
#define TASK_BYTES (64ull << 20) /* llama3-8b at TP 4: 128 blocks of 512 KiB */

#define SIDES 3 /* in-process, through the server, in-process on 4 KiB pages */

typedef struct side {
    kvt_cache *cache;   /* exactly one of cache, client */
    kvt_client *client;
} side;

static kvt_status s_lookup(side *s, const kvt_request *r, kvt_match *m)
{
    return s->cache ? kvt_cache_lookup(s->cache, r, m) : kvt_client_lookup(s->client, r, m);
}
static kvt_status s_prepare(side *s, const kvt_request *r, kvt_store_plan *p)
{
    return s->cache ? kvt_cache_prepare_store(s->cache, r, p)
                    : kvt_client_prepare_store(s->client, r, p);
}
static kvt_status s_launch(side *s, kvt_task_id t, const uint32_t *pages)
{
    return s->cache ? kvt_cache_launch(s->cache, t, pages, PAGES)
                    : kvt_client_launch(s->client, t, pages, PAGES);
}
/* Every call's bound. Generous: under a sanitizer on a loaded 2-core host
 * a 64 MiB copy took over 10 s, and the bench measures speed, not this
 * bound. */
#define CALL_MS 60000
static kvt_status s_wait(side *s, kvt_task_id t, kvt_task_result *r)
{
    return s->cache ? kvt_cache_wait(s->cache, t, CALL_MS, r) : kvt_client_wait(s->client, t, CALL_MS, r);
}
/* Until the last store is visible to every client: at once in process;
 * through the server, one call on the connection waits for its check. */
static kvt_status s_settle(side *s)
{
    kvt_cache_stats cs;
    return s->cache ? KVT_OK : kvt_client_stats(s->client, &cs);
}

/* Twice the last-level cache, in whole tasks, 256 MiB to 2 GiB. */
static uint64_t tier_bytes(void)
{
    long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
    uint64_t b = l3 > 0 ? 2 * (uint64_t)l3 : 0;
    b = (b + TASK_BYTES - 1) / TASK_BYTES * TASK_BYTES;
    return b < (256ull << 20) ? 256ull << 20 : b > (2ull << 30) ? 2ull << 30 : b;
}

/* A store's stages, microseconds: the calls an engine makes. */
enum { ST_PREPARE, ST_LAUNCH, ST_WAIT, NSTAGES };
static const char *const stage_name[NSTAGES] = {"prepare", "launch", "wait"};

/* One store (of a fresh namespace, so every block is new) and one load of
 * it: seconds into sec[0] (store), sec[1] (load), sec[2] (store until
 * visible), the store's stages into us; the load verified. */
static kvt_status round_trip_data(side *s, kvt_emu *emu, const uint32_t *tokens,
                                  const uint32_t *pages, uint32_t ns, double sec[3],
                                  double us[NSTAGES])
{
    kvt_request r = {tokens, TOKENS, &ns, sizeof ns};
    kvt_status st = kvt_emu_fill(emu, &r, 0, TOKENS, pages, PAGES);
    kvt_store_plan p;
    kvt_task_result res;
    uint64_t t0 = kvt__now_ns();
    if (!st) st = s_prepare(s, &r, &p);
    uint64_t tp = kvt__now_ns();
    if (!st && p.num_tokens != TOKENS - 1) st = KVT_ENOSPC;
    if (!st) st = s_launch(s, p.task, pages);
    uint64_t tl = kvt__now_ns();
    if (!st) st = s_wait(s, p.task, &res);
    if (!st) st = res.status;
    uint64_t t1 = kvt__now_ns();
    if (!st) st = s_settle(s);
    uint64_t t1v = kvt__now_ns();
    if (!st) st = kvt_emu_poison(emu, pages, PAGES);
    kvt_match m;
    uint64_t t2 = kvt__now_ns();
    if (!st) st = s_lookup(s, &r, &m);
    if (!st && m.matched_tokens != TOKENS - 1) st = KVT_ENOTFOUND;
    if (!st) st = s_launch(s, m.task, pages);
    if (!st) st = s_wait(s, m.task, &res);
    if (!st) st = res.status;
    uint64_t t3 = kvt__now_ns();
    kvt_verify_result v;
    if (!st) st = kvt_emu_verify(emu, &r, 0, TOKENS - 1, pages, PAGES, &v);
    if (!st && (v.mismatches || !v.bytes_checked)) st = KVT_ECORRUPT;
    us[ST_PREPARE] = (double)(tp - t0) / 1e3;
    us[ST_LAUNCH] = (double)(tl - tp) / 1e3;
    us[ST_WAIT] = (double)(t1 - tl) / 1e3;
    sec[0] = (double)(t1 - t0) / 1e9;
    sec[1] = (double)(t3 - t2) / 1e9;
    sec[2] = (double)(t1v - t0) / 1e9;
    return st;
}

/* Where a store's time goes, in process and through the server (the
 * 4 KiB side is the in-process path again): each call's microseconds,
 * min/median/max over the measured rounds. Through the server prepare and
 * launch are one round trip each, and wait covers the copy with its
 * checksums; a prepare far above the control round trip is the server's
 * thread waking (docs/server.md, Performance). */
static void stages_json(sample_set st[][NSTAGES])
{
    static const char *const side_name[2] = {"in_process", "server"};
    printf("\"store_stages_us\": {");
    for (int k = 0; k < 2; k++) {
        printf("\"%s\": {", side_name[k]);
        for (int j = 0; j < NSTAGES; j++) {
            stat3 x = {samples_pct(&st[k][j], 0), samples_pct(&st[k][j], 50),
                       samples_pct(&st[k][j], 100)};
            stat3_json(stage_name[j], x, j + 1 < NSTAGES);
        }
        printf("}%s", k ? "" : ", ");
    }
    printf("}, ");
}

static void stages_text(sample_set st[][NSTAGES])
{
    printf("  store stages, median us (in-process / through the server):");
    for (int j = 0; j < NSTAGES; j++)
        printf("%s %s %.0f / %.0f", j ? "," : "", stage_name[j], samples_pct(&st[0][j], 50),
               samples_pct(&st[1][j], 50));
    printf("\n");
}

static void *serve(void *arg)
{
    kvt_server_run(arg);
    return NULL;
}


/* Rates in GB/s from each side's round times: over all rounds (bytes
 * moved / seconds taken: the headline), and the median round. */
static void gbps(sample_set secs[][3], double bytes, int sides, double all[][3],
                 double med[][3])
{
    for (int k = 0; k < sides; k++)
        for (int j = 0; j < 3; j++) {
            double total = 0;
            for (uint32_t i = 0; i < secs[k][j].n; i++) total += secs[k][j].v[i];
            all[k][j] = total > 0 ? bytes * secs[k][j].n / total / 1e9 : 0;
            med[k][j] = bytes / samples_pct(&secs[k][j], 50) / 1e9;
        }
}

int kvt_bench_client_main(int argc, char **argv)
{
    bool json = false, with_4k = true;
    uint64_t rounds = 40, tier_mib = 0;
    static const char *const takes_value[] = {"--rounds", "--tier-mib", NULL};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--json")) { json = true; continue; }
        if (!strcmp(a, "--no-4k")) { with_4k = false; continue; }
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            printf("usage: kvtier bench client [--json] [--rounds N] [--no-4k] "
                   "[--tier-mib M (64..65536, a multiple of 64; default: twice the "
                   "last-level cache, 256..2048)]\n");
            return 0;
        }
        if (!cli_arg_in(a, takes_value)) return cli_bad_arg("bench client", a, false);
        if (!v) return cli_bad_arg("bench client", a, true);
        i++;
        if (!strcmp(a, "--rounds") && demo_parse_u64(v, &rounds) && rounds >= 1 && rounds <= 1000) {}
        else if (!strcmp(a, "--tier-mib") && demo_parse_u64(v, &tier_mib) && tier_mib >= 64 &&
                 tier_mib <= 65536 && tier_mib % 64 == 0) {}
        else return cli_bad_value("bench client", a, v);
    }
    char dir[] = "/tmp/kvtier-bench-client-XXXXXX";
    if (!mkdtemp(dir)) return demo_error("mkdtemp", KVT_ESYS);
    char sock[128];
    snprintf(sock, sizeof sock, "%s/s.sock", dir);
    kvt_config *cfg = NULL, *cfg4k = NULL;
    kvt_geometry *geo = NULL;
    kvt_server *srv = NULL;
    kvt_emu *emu = NULL;
    side local = {0}, remote = {0}, local4k = {0};
    side *sides[SIDES] = {&local, &remote, &local4k};
    pthread_t th;
    bool running = false;
    int rc = 1;
    uint32_t *tokens = malloc(TOKENS * sizeof *tokens), pages[PAGES];
    kvt_status st = tokens ? kvt_config_create(&cfg) : KVT_ENOMEM;
    for (uint32_t i = 0; tokens && i < TOKENS; i++) tokens[i] = i * 2654435761u % 128000;
    for (uint32_t i = 0; i < PAGES; i++) pages[i] = i;
    /* The warm-up writes every block of the tier once, so the measured
     * rounds reuse blocks (evicting the oldest) as a busy cache does,
     * instead of paying each page's first write through the client's
     * mapping (docs/server.md: first touch). */
    uint64_t tier = tier_mib ? tier_mib << 20 : tier_bytes();
    uint32_t warm = (uint32_t)(tier / TASK_BYTES) + 1;
    char cap[32];
    snprintf(cap, sizeof cap, "%lluMiB", (unsigned long long)(tier >> 20));
    if (!st) st = kvt_config_set(cfg, "cpu_capacity", cap);
    if (!st) st = kvt_config_create(&cfg4k);
    if (!st) st = kvt_config_set(cfg4k, "cpu_capacity", cap);
    if (!st) st = kvt_config_set(cfg4k, "huge_pages", "false");
    if (!st) st = kvt_config_set(cfg, "server_socket", sock);
    if (!st) st = kvt_geometry_preset(&geo, "llama3-8b", TPP, 4);
    if (!st) st = kvt_server_create(&srv, cfg, geo);
    if (!st) running = pthread_create(&th, NULL, serve, srv) == 0;
    if (!st) st = kvt_client_attach(&remote.client, sock, geo, CALL_MS);
    if (!st) st = kvt_cache_create(&local.cache, cfg, geo);
    if (!st) st = kvt_cache_create(&local4k.cache, cfg4k, geo);
    if (!st) st = kvt_emu_create(&emu, geo, PAGES);
    kvt_engine_memory mem;
    if (!st) st = kvt_emu_memory(emu, &mem);
    if (!st) st = kvt_client_register_memory(remote.client, &mem);
    if (!st) st = kvt_cache_register_memory(local.cache, &mem);
    if (!st) st = kvt_cache_register_memory(local4k.cache, &mem);
    /* Seconds per warm round, [local/remote/local 4k][store/load/store
     * until visible]. The sides take turns within each round, so both see
     * the same stretches of the VM's weather. The headline is each side's
     * rate over all its rounds: single rounds here are bimodal (a 64 MiB
     * store takes 4.5 or 7.2 ms in process, depending on whether both copy
     * threads got a vCPU at once), and a median jumps between the modes
     * (ratios of medians of 0.6-1.4x in consecutive runs); the total is
     * what an engine's stream of stores gets. Medians and the spread of
     * the rounds' own store ratios are reported too. */
    sample_set secs[SIDES][3] = {{{0}}}, round_ratio = {0}, stages[SIDES][NSTAGES] = {{{0}}};
    for (uint32_t r = 0; !st && r < rounds + warm; r++) {
        double sec[SIDES][3], us[NSTAGES];
        for (int k = 0; k < (with_4k ? SIDES : 2) && !st; k++) {
            st = round_trip_data(sides[k], emu, tokens, pages, r * SIDES + (uint32_t)k, sec[k], us);
            for (int j = 0; !st && r >= warm && j < 3; j++) samples_add(&secs[k][j], sec[k][j]);
            for (int j = 0; !st && r >= warm && j < NSTAGES; j++) samples_add(&stages[k][j], us[j]);
        }
        if (!st && r >= warm) samples_add(&round_ratio, sec[0][0] / sec[1][0]);
    }
    /* The control round trip (stats) and miss lookups through the socket. */
    sample_set rt = {0};
    double lookups_per_s = 0;
    kvt_cache_stats cs;
    for (int i = 0; !st && i < 2000; i++) {
        uint64_t t0 = kvt__now_ns();
        st = kvt_client_stats(remote.client, &cs);
        samples_add(&rt, (double)(kvt__now_ns() - t0) / 1e3);
    }
    uint32_t miss_ns = 0xffffffffu;
    kvt_request miss = {tokens, TOKENS, &miss_ns, sizeof miss_ns};
    uint64_t t0 = kvt__now_ns();
    for (int i = 0; !st && i < 2000; i++) {
        kvt_match m;
        st = kvt_client_lookup(remote.client, &miss, &m);
    }
    if (!st) lookups_per_s = 2000.0 / ((double)(kvt__now_ns() - t0) / 1e9);
    if (st) {
        rc = demo_error("bench client", st);
    } else {
        double bytes = (double)cs.block_bytes * ((TOKENS - 1) / TPP);
        double g[SIDES][3], m[SIDES][3]; /* GB/s: over all rounds, median round */
        gbps(secs, bytes, with_4k ? SIDES : 2, g, m);
        double ls = g[0][0], ll = g[0][1], rs = g[1][0], rl = g[1][1], rv = g[1][2];
        /* --no-4k: the 4 KiB side is not run, and not reported (no zeros
         * that read as a measurement) */
        double ks = with_4k ? g[2][0] : 0, kl = with_4k ? g[2][1] : 0;
        double rks = with_4k ? rs / ks : 0, rkl = with_4k ? rl / kl : 0;
        char side4k[256] = "", text4k[160] = "";
        if (with_4k) {
            snprintf(side4k, sizeof side4k, "\"local_4k_store_gbps\": %.2f, \"local_4k_load_gbps\": "
                     "%.2f, \"store_ratio_vs_4k\": %.2f, \"load_ratio_vs_4k\": %.2f, ",
                     ks, kl, rks, rkl);
            snprintf(text4k, sizeof text4k, "; in-process on 4 KiB pages: store %.2f GB/s "
                     "(server %.2fx), load %.2f GB/s (%.2fx)", ks, rks, kl, rkl);
        }
        double lo = samples_pct(&round_ratio, 25), hi = samples_pct(&round_ratio, 75);
        const char *tier_pages = kvt__srv_shard_first(srv)->shm.pages;
        if (json) {
            printf("{\"bytes\": %.0f, \"rounds\": %llu, \"stat\": \"bytes over seconds of all "
                   "rounds\", \"local_store_gbps\": %.2f, \"client_store_gbps\": %.2f, "
                   "\"local_load_gbps\": %.2f, \"client_load_gbps\": %.2f, \"store_ratio\": %.2f, "
                   "\"load_ratio\": %.2f, \"client_store_visible_gbps\": %.2f, "
                   "\"store_visible_ratio\": %.2f, \"round_store_ratio_p25\": %.2f, "
                   "\"round_store_ratio_p75\": %.2f, \"tier_bytes\": %llu, "
                   "\"tier_pages\": \"%s\", %s\"rtt_p50_us\": %.1f, \"rtt_p99_us\": %.1f, "
                   "\"miss_lookups_per_s\": %.0f, \"median_local_store_gbps\": %.2f, "
                   "\"median_client_store_gbps\": %.2f, \"median_local_load_gbps\": %.2f, "
                   "\"median_client_load_gbps\": %.2f, \"verified\": true, ",
                   bytes, (unsigned long long)rounds, ls, rs, ll, rl, rs / ls, rl / ll, rv, rv / ls,
                   lo, hi, (unsigned long long)tier, tier_pages, side4k,
                   samples_pct(&rt, 50), samples_pct(&rt, 99), lookups_per_s, m[0][0], m[1][0],
                   m[0][1], m[1][1]);
            stat3 rr = {samples_pct(&round_ratio, 0), samples_pct(&round_ratio, 50),
                        samples_pct(&round_ratio, 100)};
            stat3_json("round_store_ratio", rr, true);
            stages_json(stages);
            bench_host_json(false);
            printf("}\n");
        } else {
            printf("kvtier bench client: %.1f MiB per task, %llu warm rounds (sides taking turns), "
                   "every load verified; GB/s over all rounds\n"
                   "  store   in-process %.2f GB/s, through the server %.2f GB/s (%.2fx; single "
                   "rounds' middle half %.2f-%.2fx); until visible to others %.2f GB/s (%.2fx)\n"
                   "  load    in-process %.2f GB/s, through the server %.2f GB/s (%.2fx)\n"
                   "  each tier %llu MiB, the server's on %s pages%s\n"
                   "  control round trip p50 %.1f us, p99 %.1f us\n"
                   "  miss lookups (%u tokens) %.0f per second through the socket\n",
                   bytes / 1048576.0, (unsigned long long)rounds, ls, rs, rs / ls, lo, hi, rv,
                   rv / ls, ll, rl, rl / ll, (unsigned long long)(tier >> 20), tier_pages, text4k,
                   samples_pct(&rt, 50), samples_pct(&rt, 99), TOKENS, lookups_per_s);
            stages_text(stages);
            bench_host_text(stdout);
        }
        rc = 0;
    }
    samples_fini(&rt);
    for (int k = 0; k < SIDES; k++) {
        for (int j = 0; j < 3; j++) samples_fini(&secs[k][j]);
    }
    samples_fini(&round_ratio);
    for (int k = 0; k < SIDES; k++)
        for (int j = 0; j < NSTAGES; j++) samples_fini(&stages[k][j]);
    kvt_client_detach(remote.client);
    kvt_cache_destroy(local.cache);
    kvt_cache_destroy(local4k.cache);
    if (running) {
        kvt_server_stop(srv);
        pthread_join(th, NULL);
    }
    kvt_server_destroy(srv);
    kvt_emu_destroy(emu);
    kvt_geometry_destroy(geo);
    kvt_config_destroy(cfg);
    kvt_config_destroy(cfg4k);
    free(tokens);
    char lock[160];
    snprintf(lock, sizeof lock, "%s.lock", sock);
    unlink(lock);
    rmdir(dir);
    return rc;
}
