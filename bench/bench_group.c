/* bench_group.c - `kvtier bench group [--json]`: the latency of one step
 * exchange (every member's UP to the sync leader, the leader's DOWN back to
 * every member), measured at the leader, for 2, 4, 8 and 16 ranks as
 * threads over inproc queues, over loopback TCP (127.0.0.1 only) and over
 * UCX tag messages after the same TCP join (UCX_TLS from the environment). The
 * payload is an idle connector step (16-byte head) plus one lookup record,
 * the common case. Each configuration runs at most ~1.2 s a round (--rounds N,
 * default 3: every figure the median over them). For TCP the
 * machine's floor is measured in the same run: the same star exchange over
 * plain sockets (bench_group_raw.c), reported as raw_p50_us and ratio (for
 * UCX too: the socket floor is what UCX over loopback must beat).
 * The commit phase's cost (every member's ACK before the leader applies,
 * docs/protocol.md "Step") is measured in the same run: each configuration
 * also runs without it (exchange_p50_us), which is not a valid protocol
 * run, only the reference for commit_cost_us. */
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "bench.h"
#include "bench_util.h"
#include "bench_group_raw.h"
#include "cli_util.h"
#include "group/group.h"
#include "util/clock.h"

#define MAX_STEPS 4000
#define WARMUP 200
#define BUDGET_NS 1200000000ull
#define PAYLOAD 40

enum { INPROC, TCP, UCX };
static const char *const kind_name[] = {"inproc", "tcp", "ucx"};

typedef struct cfg {
    int kind;  /* INPROC, TCP or UCX */
    bool tcp;  /* TCP or UCX: a hub and a join over TCP */
    int commit; /* 0: the bare gather + bcast, for the commit phase's cost */
    uint32_t ranks;
    uint16_t port;
    kvt_fabric *fab;
    kvt_status st[16];
    double *lat_us; /* leader's per-step latency */
    uint32_t steps;
} cfg;

typedef struct arg {
    cfg *c;
    uint32_t rank;
} arg;

/* Ranks joining the hub: 16 of them (UCX: 16 workers) on a small loaded
 * host can take seconds, which is not what the bench measures; 5 s failed
 * a fresh machine's make test once (rank 9 of 16 did not join). */
#define JOIN_MS 30000

static kvt_status open_net(cfg *c, uint32_t rank, kvt_net **n)
{
    if (!c->tcp) return kvt_net_inproc_create(n, c->fab, rank);
    kvt_net_tcp_params p = {rank, c->ranks, "127.0.0.1", c->port, NULL, 0, 0};
    p.transport = c->kind == UCX ? KVT_NET_UCX : KVT_NET_TCP;
    kvt_status st = kvt_net_tcp_create(n, &p);
    if (st == KVT_OK) st = kvt_net_connect(*n, JOIN_MS);
    return st;
}

/* Members step until the leader's DOWN says stop (first byte 0). */
static kvt_status member_loop(cfg *c, kvt_group *g)
{
    uint8_t up[PAYLOAD] = {0};
    for (uint64_t step = 1;; step++) {
        const uint8_t *down;
        size_t len;
        kvt_status st = kvt__group_step_member(g, step, up, sizeof up, &down, &len);
        int last = st == KVT_OK && (len == 0 || down[0] == 0);
        if (st == KVT_OK && c->commit) st = kvt__group_step_ack(g);
        if (st != KVT_OK || last) return st;
    }
}

static kvt_status leader_loop(cfg *c, kvt_group *g)
{
    uint8_t down[PAYLOAD] = {1};
    uint64_t t_start = kvt__now_ns();
    uint32_t i = 0;
    for (;; i++) {
        int last = i + 1 >= MAX_STEPS + WARMUP || kvt__now_ns() - t_start > BUDGET_NS;
        down[0] = last ? 0 : 1;
        uint64_t t0 = kvt__now_ns();
        kvt_status st = kvt__group_gather(g, (uint64_t)i + 1);
        if (st == KVT_OK) st = kvt__group_bcast(g, down, sizeof down);
        if (st == KVT_OK && c->commit) st = kvt__group_commit(g);
        if (st != KVT_OK) return st;
        if (i >= WARMUP) c->lat_us[c->steps++] = (double)(kvt__now_ns() - t0) / 1000.0;
        if (last) return KVT_OK;
    }
}

static void *rank_main(void *p)
{
    arg *a = p;
    cfg *c = a->c;
    kvt_net *n = NULL;
    kvt_group *g = NULL;
    kvt_status st = a->rank == 0 && c->tcp ? KVT_OK : open_net(c, a->rank, &n);
    kvt_group_params gp = {1, 1, c->ranks, 1, 2, 5000, 1};
    if (st == KVT_OK && a->rank != 0) st = kvt_group_create(&g, n, &gp);
    if (st == KVT_OK && a->rank != 0) st = member_loop(c, g);
    c->st[a->rank] = st;
    kvt_group_destroy(g);
    kvt_net_destroy(n);
    return NULL;
}

static kvt_status run_leader(cfg *c, kvt_net *hub)
{
    kvt_net *n = hub;
    kvt_status st = c->tcp ? kvt_net_connect(hub, JOIN_MS) : open_net(c, 0, &n);
    kvt_group *g = NULL;
    kvt_group_params gp = {1, 1, c->ranks, 1, 2, 5000, 1};
    if (st == KVT_OK) st = kvt_group_create(&g, n, &gp);
    if (st == KVT_OK) st = leader_loop(c, g);
    kvt_group_destroy(g);
    if (!c->tcp) kvt_net_destroy(n);
    return st;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static kvt_status run_cfg(cfg *c)
{
    kvt_net *hub = NULL;
    kvt_status st = KVT_OK;
    if (c->tcp) {
        kvt_net_tcp_params p = {0, c->ranks, "127.0.0.1", 0, NULL, 0, 0};
        p.transport = c->kind == UCX ? KVT_NET_UCX : KVT_NET_TCP;
        st = kvt_net_tcp_create(&hub, &p);
        if (st == KVT_OK) st = kvt_net_tcp_port(hub, &c->port);
    } else {
        st = kvt_fabric_create(&c->fab, c->ranks, 16);
    }
    if (st != KVT_OK) return st;
    pthread_t th[16];
    arg args[16];
    for (uint32_t r = 1; r < c->ranks; r++) {
        args[r] = (arg){c, r};
        pthread_create(&th[r], NULL, rank_main, &args[r]);
    }
    st = run_leader(c, hub);
    for (uint32_t r = 1; r < c->ranks; r++) pthread_join(th[r], NULL);
    kvt_net_destroy(hub);
    kvt_fabric_destroy(c->fab);
    for (uint32_t r = 1; r < c->ranks && st == KVT_OK; r++) st = c->st[r];
    return st;
}

#define MAX_ROUNDS 16

/* One configuration's rounds: each runs the exchange alone, the protocol
 * step, and (TCP, UCX) the raw socket floor right after. */
typedef struct cfg_rounds {
    double p50[MAX_ROUNDS], p99[MAX_ROUNDS], ex50[MAX_ROUNDS], raw50[MAX_ROUNDS],
        raw99[MAX_ROUNDS], ratio[MAX_ROUNDS];
    uint32_t steps;
} cfg_rounds;

static kvt_status run_round(int kind, uint32_t ranks, double *lat, cfg_rounds *o, uint32_t r)
{
    bool tcp = kind != INPROC;
    cfg c = {.kind = kind, .tcp = tcp, .ranks = ranks, .lat_us = lat};
    kvt_status st = KVT_OK;
    for (c.commit = 0; c.commit < 2 && st == KVT_OK; c.commit++) {
        c.steps = 0;
        st = run_cfg(&c);
        if (st == KVT_OK && c.steps == 0) st = KVT_EPROTO;
        if (st != KVT_OK) break;
        qsort(lat, c.steps, sizeof *lat, cmp_double);
        if (!c.commit) o->ex50[r] = lat[c.steps / 2];
        o->p50[r] = lat[c.steps / 2];
        o->p99[r] = lat[(size_t)(c.steps * 0.99)];
        o->steps = c.steps;
    }
    o->raw50[r] = o->raw99[r] = o->ratio[r] = -1;
    if (st == KVT_OK && tcp && kvt_bench_raw_star(ranks, 2000, &o->raw50[r], &o->raw99[r]) == 0 &&
        o->raw50[r] > 0)
        o->ratio[r] = o->p50[r] / o->raw50[r];
    return st;
}

static void print_cfg(int kind, uint32_t ranks, const cfg_rounds *o, uint32_t n, bool json,
                      bool first)
{
    stat3 p50 = stat3_of(o->p50, n), p99 = stat3_of(o->p99, n), ex = stat3_of(o->ex50, n),
          raw = stat3_of(o->raw50, n), raw99 = stat3_of(o->raw99, n), ratio = stat3_of(o->ratio, n);
    bool tcp = kind != INPROC;
    if (!json) {
        printf("%-8s %6u %10.1f %10.1f %8u %10.1f", kind_name[kind], ranks, p50.med, p99.med,
               o->steps, ex.med);
        if (tcp)
            printf("   raw sockets p50 %.1f us (%.2fx; rounds %.2f-%.2fx)", raw.med, ratio.med,
                   ratio.min, ratio.max);
        printf("\n");
        return;
    }
    printf("%s{\"transport\": \"%s\", \"ranks\": %u, \"p50_us\": %.1f, \"p99_us\": %.1f, "
           "\"steps\": %u, \"exchange_p50_us\": %.1f, \"commit_cost_us\": %.1f, ",
           first ? "" : ", ", kind_name[kind], ranks, p50.med, p99.med, o->steps, ex.med,
           p50.med - ex.med);
    if (tcp)
        printf("\"raw_p50_us\": %.1f, \"raw_p99_us\": %.1f, \"ratio\": %.2f, ", raw.med,
               raw99.med, ratio.med);
    if (tcp) stat3_json("ratio_rounds", ratio, true);
    stat3_json("p50_us_rounds", p50, false);
    printf("}");
}

int kvt_bench_group_main(int argc, char **argv)
{
    uint32_t rounds = 3;
    bool json = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        uint64_t n;
        if (!strcmp(a, "--json")) {
            json = true;
        } else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            printf("usage: kvtier bench group [--json] [--rounds N]\n"
                   "  rank-group step latency at 2, 4, 8 and 16 ranks, inproc, loopback TCP and "
                   "UCX, against a raw socket floor; each figure the median of N rounds (1..%d, "
                   "default 3), with min/median/max in the JSON\n", MAX_ROUNDS);
            return 0;
        } else if (strcmp(a, "--rounds") || !v) {
            return cli_bad_arg("bench group", a, !strcmp(a, "--rounds"));
        } else if (!demo_parse_u64(v, &n) || n < 1 || n > MAX_ROUNDS) {
            return cli_bad_value("bench group", a, v);
        } else {
            rounds = (uint32_t)n;
            i++;
        }
    }
    static const uint32_t sizes[] = {2, 4, 8, 16};
    double *lat = malloc(sizeof *lat * MAX_STEPS);
    if (!lat) return 1;
    if (json) printf("{\"rounds\": %u, \"stat\": \"median of the rounds\", \"results\": [", rounds);
    else printf("%-8s %6s %10s %10s %8s %10s   (medians of %u rounds)\n", "transport", "ranks",
                "p50_us", "p99_us", "steps", "no_commit", rounds);
    int first = 1, rc = 0;
    for (int kind = INPROC; kind <= UCX; kind++)
        for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
            cfg_rounds o;
            kvt_status st = KVT_OK;
            for (uint32_t r = 0; r < rounds && st == KVT_OK; r++) st = run_round(kind, sizes[i], lat, &o, r);
            if (st != KVT_OK) {
                fprintf(stderr, "bench group: %s x %u: %s: %s\n", kind_name[kind],
                        sizes[i], kvt_status_name(st), kvt_last_error());
                rc = 1;
                continue;
            }
            print_cfg(kind, sizes[i], &o, rounds, json, first);
            first = 0;
            fflush(stdout);
        }
    if (json) {
        printf("], ");
        bench_host_json(false);
        printf("}\n");
    } else {
        bench_host_text(stdout);
    }
    free(lat);
    return rc;
}
