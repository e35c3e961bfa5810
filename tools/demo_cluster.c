/* demo_cluster.c - `kvtier demo --cluster`: node servers sharing blocks.
 *
 * A Redis primary with a replica and a Sentinel (the directory, as an HA
 * deployment runs it) and three `kvtier serve` nodes joined through the
 * Sentinel (docs/cluster.md), each with its own socket and /metrics; two
 * engine processes behind a random router: each request of a multi-turn
 * conversation (over shared system prompts) goes to a random node, as a
 * router that balances load sends it. Per request, as an engine: lookup,
 * load the cached prefix into poisoned pages and verify every byte,
 * compute the rest (the emulator), store it. The phases:
 *   1 first turns spread over the nodes;
 *   2 second turns, random node: prefixes another node stored are pulled;
 *   3 node 1 SIGKILLed: the router sends its requests elsewhere;
 *   4 node 1 restarted (a new epoch, empty): it pulls from its peers;
 *   5 the Redis primary SIGKILLed: the Sentinel fails over to the replica
 *     while the engines serve (local hits go on);
 *   6 after the failover: the nodes follow the new primary, republish,
 *     and pulls resume.
 * Cross-node hit tokens are the nodes' pulled blocks (their
 * kvtier_cluster_pulled_blocks_total) times block_tokens: each was pulled
 * for a lookup that then served it. Any byte that differs, any failure
 * other than a dead node's KVT_ECONN, or a phase without the hits it is
 * there to show fails the demo (exit 1). */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli_util.h"
#include "cluster_procs.h"
#include "cmds.h"
#include "kvtier.h"
#include "util/clock.h"

#define NODES 3
#define ENGINES 2
#define CONVS 6          /* conversations per engine */
#define NUM_SYS 3        /* system prompts, shared by every conversation */
#define SYS_TOKENS 512
#define TURN_MAX 128     /* a user turn: 32..TURN_MAX tokens */
#define NUM_PHASES 6
#define MAX_TOKENS (SYS_TOKENS + NUM_PHASES * TURN_MAX)
#define BLOCK_TOKENS 16
#define CALL_MS 3000
#define WAIT_MS 30000

typedef struct cmsg {
    uint64_t requests, lookup_tokens, hit_tokens, verified_bytes, mismatches, econn, failures;
} cmsg;

/* The nodes' pull counters a phase row shows: pulled blocks (the cross-node
 * hits) and why a lookup pulled nothing, so a phase short of hits says why. */
enum { NC_PULLED, NC_FAILED, NC_SKIPPED, NC_RACED, NC_STALE, NC_DIR_ERRORS, NC_N };
static const char *const NC_METRIC[NC_N] = {
    "kvtier_cluster_pulled_blocks_total", "kvtier_cluster_pull_failures_total",
    "kvtier_cluster_pulls_skipped_total", "kvtier_cluster_pulls_raced_total",
    "kvtier_cluster_stale_entries_total", "kvtier_cluster_directory_errors_total",
};
static const char *const NC_JSON[NC_N] = {"pulled_blocks", "pull_failures", "pulls_skipped",
                                          "pulls_raced", "stale_entries", "directory_errors"};

typedef struct cnode {
    pid_t pid;
    uint16_t metrics_port;
    char sock[300], log[300];
    uint64_t base[NC_N], last[NC_N]; /* this life's counters at the phase's start, now */
} cnode;

typedef struct cdemo {
    const char *self;
    bool json;
    char dir[256], redis_log[300];
    pid_t redis, replica, sentinel;
    uint16_t redis_port, replica_port, sentinel_port;
    cnode node[NODES];
    pid_t eng[ENGINES];
    int to[ENGINES], from[ENGINES];
    cmsg sum[NUM_PHASES + 1];
    uint64_t cross[NUM_PHASES + 1];         /* pulled blocks x BLOCK_TOKENS */
    uint64_t nc[NUM_PHASES + 1][NC_N];      /* the nodes' pull counters, summed */
} cdemo;

static const char *const PHASE_NAMES[NUM_PHASES + 1] = {
    "", "first turns, spread", "second turns, random node", "node 1 SIGKILLed",
    "node 1 restarted", "Redis primary killed", "after the failover",
};

/* ------------------------------------------------------------------ */
/* An engine (a child process) behind the random router                */

typedef struct engine {
    uint32_t idx;
    kvt_client *cl[NODES];
    kvt_emu *emu;
    uint32_t pages[MAX_TOKENS / 16 + 1], num_pages;
    cmsg m;
    uint64_t rng;
} engine;

static uint64_t mix(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}

/* Conversation c of engine e up to turn t: its system prompt, then turns
 * 1..t of its user (the same tokens each time it is asked). */
static uint32_t conversation(uint32_t *tok, uint32_t e, uint32_t c, uint32_t t)
{
    uint32_t sys = (e * CONVS + c) % NUM_SYS, n = 0;
    for (uint32_t i = 0; i < SYS_TOKENS; i++) tok[n++] = (uint32_t)(mix(77 + sys * 7919 + i) % 32000);
    for (uint32_t k = 1; k <= t; k++) {
        uint64_t seed = mix(((uint64_t)e << 40) ^ ((uint64_t)c << 20) ^ k);
        uint32_t len = 32 + (uint32_t)(seed % (TURN_MAX - 32));
        for (uint32_t i = 0; i < len; i++) tok[n++] = (uint32_t)(mix(seed + i) % 32000);
    }
    return n;
}

static uint32_t load(engine *g, kvt_client *cl, const kvt_request *req, const kvt_match *m)
{
    kvt_emu_poison(g->emu, g->pages, g->num_pages);
    kvt_task_result res = {0};
    kvt_status st = kvt_client_launch(cl, m->task, g->pages, g->num_pages);
    if (!st) st = kvt_client_wait(cl, m->task, WAIT_MS, &res);
    if (!st) st = res.status;
    if (st) {
        if (st == KVT_ECONN) g->m.econn++;
        else g->m.failures++, fprintf(stderr, "kvtier demo: engine %u: load: %s\n", g->idx, kvt_last_error());
        kvt_client_cancel(cl, m->task);
        return 0;
    }
    kvt_verify_result v;
    if (kvt_emu_verify(g->emu, req, 0, m->matched_tokens, g->pages, g->num_pages, &v)) {
        g->m.failures++;
        return 0;
    }
    g->m.verified_bytes += v.bytes_checked;
    g->m.mismatches += v.mismatches;
    if (v.mismatches)
        fprintf(stderr, "kvtier demo: MISMATCH: %llu bytes differ, first at token %u\n",
                (unsigned long long)v.mismatches, v.first_bad_token);
    return m->matched_tokens;
}

/* One request on one node; KVT_ECONN when the node is away (the router
 * then tries the next). */
static kvt_status serve_on(engine *g, kvt_client *cl, const kvt_request *req)
{
    kvt_match m;
    kvt_status st = kvt_client_lookup(cl, req, &m);
    if (st) return st;
    uint32_t reuse = m.task ? load(g, cl, req, &m) : 0;
    kvt_emu_fill(g->emu, req, reuse, req->num_tokens - reuse, g->pages, g->num_pages);
    g->m.requests++;
    g->m.lookup_tokens += req->num_tokens;
    g->m.hit_tokens += reuse;
    kvt_store_plan p;
    st = kvt_client_prepare_store(cl, req, &p);
    kvt_task_result res = {0};
    if (!st && p.task) {
        st = kvt_client_launch(cl, p.task, g->pages, g->num_pages);
        if (!st) st = kvt_client_wait(cl, p.task, WAIT_MS, &res);
        if (!st) st = res.status;
    }
    if (st == KVT_ECONN) g->m.econn++;
    else if (st) g->m.failures++, fprintf(stderr, "kvtier demo: engine %u: store: %s\n", g->idx, kvt_last_error());
    return KVT_OK;
}

static void run_phase(engine *g, uint32_t phase, int out)
{
    memset(&g->m, 0, sizeof g->m);
    uint32_t tok[MAX_TOKENS];
    for (uint32_t c = 0; c < CONVS; c++) {
        kvt_request req = {.tokens = tok, .num_tokens = conversation(tok, g->idx, c, phase),
                           .ns = "tenant", .ns_len = 6};
        uint32_t first = (uint32_t)((g->rng = mix(g->rng + 1)) % NODES);
        kvt_status st = KVT_ECONN;
        for (uint32_t k = 0; k < NODES && st == KVT_ECONN; k++) {
            st = serve_on(g, g->cl[(first + k) % NODES], &req);
            if (st == KVT_ECONN) g->m.econn++;
        }
        if (st) g->m.failures++, fprintf(stderr, "kvtier demo: engine %u: %s\n", g->idx, kvt_last_error());
    }
    if (write(out, &g->m, sizeof g->m) != sizeof g->m) _exit(3);
}

static void engine_main(const cdemo *d, uint32_t idx, int in, int out)
{
    engine g = {.idx = idx, .num_pages = MAX_TOKENS / 16 + 1, .rng = 12345 + idx};
    kvt_geometry *geo = NULL;
    kvt_status st = kvt_geometry_preset(&geo, "tiny", 16, 1);
    for (uint32_t n = 0; !st && n < NODES; n++) st = kvt_client_attach(&g.cl[n], d->node[n].sock, geo, CALL_MS);
    if (!st) st = kvt_emu_create(&g.emu, geo, g.num_pages);
    kvt_engine_memory mem;
    if (!st) st = kvt_emu_memory(g.emu, &mem);
    for (uint32_t n = 0; !st && n < NODES; n++) st = kvt_client_register_memory(g.cl[n], &mem);
    kvt_geometry_destroy(geo);
    if (st) {
        fprintf(stderr, "kvtier demo: engine %u: %s: %s\n", idx, kvt_status_name(st), kvt_last_error());
        _exit(1);
    }
    for (uint32_t i = 0; i < g.num_pages; i++) g.pages[i] = g.num_pages - 1 - i;
    uint8_t phase;
    while (read(in, &phase, 1) == 1 && phase != 0) run_phase(&g, phase, out);
    for (uint32_t n = 0; n < NODES; n++) kvt_client_detach(g.cl[n]);
    kvt_emu_destroy(g.emu);
    _exit(0);
}

/* ------------------------------------------------------------------ */
/* Processes                                                          */

static int fail(const char *what)
{
    fprintf(stderr, "kvtier demo --cluster: %s\n", what);
    return 1;
}

/* A dead node's counters stay where its last phase left them. */
static void node_counters(cnode *nd, uint64_t *out)
{
    for (uint32_t k = 0; k < NC_N; k++)
        out[k] = nd->pid ? cp_metric(nd->metrics_port, NC_METRIC[k], nd->last[k]) : nd->last[k];
}

static uint64_t published(const cnode *nd)
{
    return cp_metric(nd->metrics_port, "kvtier_cluster_published_blocks_total", 0);
}

/* Publishing is asynchronous (docs/cluster.md): a peer finds a block once
 * its holder wrote it to the directory. Until every live node is up with
 * nothing left to write, so the next phase's pulls find what this one
 * stored, however loaded the host. */
static int wait_published(cdemo *d)
{
    uint64_t until = kvt__now_ns() + (uint64_t)WAIT_MS * 1000000ull;
    for (uint32_t n = 0; n < NODES; n++) {
        const cnode *nd = &d->node[n];
        uint64_t up = 0, backlog = 0;
        while (nd->pid && ((up = cp_metric(nd->metrics_port, "kvtier_cluster_directory_up", 0)) != 1 ||
                           (backlog = cp_metric(nd->metrics_port, "kvtier_cluster_publish_backlog",
                                                UINT64_MAX)) != 0)) {
            if (kvt__now_ns() > until) {
                fprintf(stderr, "kvtier demo --cluster: node %u did not publish its blocks in %d ms "
                        "(kvtier_cluster_directory_up %llu, kvtier_cluster_publish_backlog %llu; "
                        "log: %s)\n", n, WAIT_MS, (unsigned long long)up,
                        (unsigned long long)backlog, nd->log);
                return 1;
            }
            struct timespec ts = {0, 20 * 1000000L};
            nanosleep(&ts, NULL);
        }
    }
    return 0;
}

/* Until the Sentinel names the replica, then until every node wrote to it
 * (its published count grew after that: its next directory call found the
 * old primary gone, asked the Sentinel and republished). */
static int wait_failover(cdemo *d)
{
    uint64_t until = kvt__now_ns() + (uint64_t)WAIT_MS * 1000000ull;
    while (cp_sentinel_primary(d->sentinel_port, "kvtdemo") != d->replica_port) {
        if (kvt__now_ns() > until) return fail("the Sentinel did not fail over to the replica");
        struct timespec ts = {0, 100 * 1000000L};
        nanosleep(&ts, NULL);
    }
    uint64_t base[NODES];
    for (uint32_t n = 0; n < NODES; n++) base[n] = published(&d->node[n]);
    for (uint32_t n = 0; n < NODES; n++)
        while (cp_metric(d->node[n].metrics_port, "kvtier_cluster_directory_up", 0) != 1 ||
               published(&d->node[n]) <= base[n]) {
            if (kvt__now_ns() > until) return fail("a node never wrote to the new Redis primary");
            struct timespec ts = {0, 50 * 1000000L};
            nanosleep(&ts, NULL);
        }
    return 0;
}

/* A primary, its replica, and a Sentinel watching them as "kvtdemo". */
static int start_redis(cdemo *d)
{
    d->redis = cp_start_redis(d->dir, d->redis_port, d->redis_log);
    if (d->redis > 0) d->replica = cp_start_replica(d->dir, d->replica_port, d->redis_port, d->redis_log);
    if (d->replica > 0)
        d->sentinel = cp_start_sentinel(d->dir, d->sentinel_port, "kvtdemo", d->redis_port, d->redis_log);
    return d->sentinel > 0 ? 0 : 1;
}

/* A failover needs a replica the Sentinel knows and that is in sync (it
 * learns of replicas from the primary's INFO, every 10 s at most). */
static int wait_sentinel_ready(cdemo *d)
{
    uint64_t until = kvt__now_ns() + (uint64_t)WAIT_MS * 1000000ull;
    while (!cp_sentinel_ready(d->sentinel_port, "kvtdemo", d->replica_port)) {
        if (kvt__now_ns() > until) return fail("the Sentinel never saw an in-sync replica");
        struct timespec ts = {0, 100 * 1000000L};
        nanosleep(&ts, NULL);
    }
    return 0;
}

static int start_node(cdemo *d, uint32_t i)
{
    cnode *nd = &d->node[i];
    char redis[64], name[64], metrics[64];
    snprintf(redis, sizeof redis, "cluster_redis=sentinel://127.0.0.1:%u/kvtdemo", d->sentinel_port);
    snprintf(name, sizeof name, "cluster_node=node%u", i);
    nd->metrics_port = cp_free_port();
    snprintf(metrics, sizeof metrics, "metrics_port=%u", nd->metrics_port);
    unlink(nd->sock);
    char *argv[] = {(char *)d->self, "serve", "--socket", nd->sock, "--set", "cpu_capacity=64MiB",
                    "--set", "huge_pages=false", "--set", "block_tokens=16", "--set", redis,
                    "--set", name, "--set", metrics, "--set", "cluster_lease_ms=2000",
                    /* the emulated engine "prefills" like a CPU, so a pull is always worth
                     * it, even of 32 KiB blocks under a sanitizer (docs/cluster.md) */
                    "--set", "cluster_prefill_tps=100",
                    "--set", "log_level=info", NULL};
    nd->pid = cp_spawn_logged(nd->log, argv);
    memset(nd->base, 0, sizeof nd->base);
    memset(nd->last, 0, sizeof nd->last);
    if (nd->pid < 0 || !cp_wait_file(nd->sock, nd->pid, WAIT_MS)) {
        nd->pid = 0;
        fprintf(stderr, "kvtier demo --cluster: node %u did not start (log: %s)\n", i, nd->log);
        return 1;
    }
    return 0;
}

static int spawn_engine(cdemo *d, uint32_t i)
{
    int down[2], up[2];
    if (pipe2(down, O_CLOEXEC) || pipe2(up, O_CLOEXEC)) return fail("pipe failed");
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) return fail("fork failed");
    if (pid == 0) {
        close(down[1]);
        close(up[0]);
        engine_main(d, i, down[0], up[1]);
    }
    close(down[0]);
    close(up[1]);
    d->eng[i] = pid;
    d->to[i] = down[1];
    d->from[i] = up[0];
    return 0;
}

/* Every engine serves the phase's turn; their counters and the nodes'
 * pulls go into the phase's row. */
static int phase(cdemo *d, uint8_t p)
{
    for (uint32_t n = 0; n < NODES; n++) node_counters(&d->node[n], d->node[n].base);
    for (uint32_t i = 0; i < ENGINES; i++)
        if (write(d->to[i], &p, 1) != 1) return fail("an engine went away");
    for (uint32_t i = 0; i < ENGINES; i++) {
        cmsg m;
        struct pollfd pf = {d->from[i], POLLIN, 0};
        if (poll(&pf, 1, 4 * WAIT_MS) != 1 || read(d->from[i], &m, sizeof m) != (ssize_t)sizeof m)
            return fail("an engine died or stalled");
        cmsg *s = &d->sum[p];
        s->requests += m.requests, s->lookup_tokens += m.lookup_tokens, s->hit_tokens += m.hit_tokens;
        s->verified_bytes += m.verified_bytes, s->mismatches += m.mismatches;
        s->econn += m.econn, s->failures += m.failures;
    }
    for (uint32_t n = 0; n < NODES; n++) {
        cnode *nd = &d->node[n];
        node_counters(nd, nd->last);
        if (!nd->pid) continue;
        for (uint32_t k = 0; k < NC_N; k++) d->nc[p][k] += nd->last[k] - nd->base[k];
        d->cross[p] += (nd->last[NC_PULLED] - nd->base[NC_PULLED]) * BLOCK_TOKENS;
    }
    return 0;
}

static int run(cdemo *d)
{
    if (start_redis(d)) return 1;
    for (uint32_t n = 0; n < NODES; n++)
        if (start_node(d, n)) return 1;
    for (uint32_t i = 0; i < ENGINES; i++)
        if (spawn_engine(d, i)) return 1;
    if (wait_published(d) || phase(d, 1) || wait_published(d) || phase(d, 2)) return 1;
    cp_kill_wait(&d->node[1].pid, SIGKILL);
    if (phase(d, 3)) return 1;
    if (start_node(d, 1) || wait_published(d) || phase(d, 4)) return 1;
    if (wait_sentinel_ready(d)) return 1;
    cp_kill_wait(&d->redis, SIGKILL);
    if (phase(d, 5)) return 1;
    if (wait_failover(d) || wait_published(d)) return 1;
    return phase(d, 6);
}

/* ------------------------------------------------------------------ */
/* The report                                                         */

static void totals(const cdemo *d, cmsg *t, uint64_t *cross)
{
    memset(t, 0, sizeof *t);
    *cross = 0;
    for (uint32_t p = 1; p <= NUM_PHASES; p++) {
        const cmsg *s = &d->sum[p];
        t->requests += s->requests, t->lookup_tokens += s->lookup_tokens;
        t->hit_tokens += s->hit_tokens, t->verified_bytes += s->verified_bytes;
        t->mismatches += s->mismatches, t->failures += s->failures, t->econn += s->econn;
        *cross += d->cross[p];
    }
}

static void report_text(const cdemo *d, const cmsg *t, uint64_t cross)
{
    printf("kvtier demo --cluster: Redis (primary, replica, Sentinel) + %d node servers, %d engines "
           "behind a random router\n",
           NODES, ENGINES);
    printf("  %-28s %8s %11s %10s %12s %6s %10s\n", "phase", "requests", "lookup tok", "hit tok",
           "cross-node", "ECONN", "pull fail");
    for (uint32_t p = 1; p <= NUM_PHASES; p++) {
        const cmsg *s = &d->sum[p];
        printf("  %-28s %8llu %11llu %10llu %12llu %6llu %10llu\n", PHASE_NAMES[p],
               (unsigned long long)s->requests, (unsigned long long)s->lookup_tokens,
               (unsigned long long)s->hit_tokens, (unsigned long long)d->cross[p],
               (unsigned long long)s->econn, (unsigned long long)d->nc[p][NC_FAILED]);
    }
    printf("  cross-node hit tokens: %llu of %llu hit tokens; loaded bytes verified: %llu, "
           "mismatches: %llu, failures: %llu\n", (unsigned long long)cross,
           (unsigned long long)t->hit_tokens, (unsigned long long)t->verified_bytes,
           (unsigned long long)t->mismatches, (unsigned long long)t->failures);
}

static void report_json(const cdemo *d, const cmsg *t, uint64_t cross)
{
    printf("{\"nodes\":%d,\"engines\":%d,\"phases\":[", NODES, ENGINES);
    for (uint32_t p = 1; p <= NUM_PHASES; p++) {
        const cmsg *s = &d->sum[p];
        printf("%s{\"phase\":%u,\"name\":\"%s\",\"requests\":%llu,\"lookup_tokens\":%llu,"
               "\"hit_tokens\":%llu,\"cross_node_hit_tokens\":%llu,\"econn\":%llu", p > 1 ? "," : "",
               p, PHASE_NAMES[p], (unsigned long long)s->requests,
               (unsigned long long)s->lookup_tokens, (unsigned long long)s->hit_tokens,
               (unsigned long long)d->cross[p], (unsigned long long)s->econn);
        for (uint32_t k = 0; k < NC_N; k++)
            printf(",\"%s\":%llu", NC_JSON[k], (unsigned long long)d->nc[p][k]);
        printf("}");
    }
    printf("],\"hit_tokens\":%llu,\"cross_node_hit_tokens\":%llu,\"verified_bytes\":%llu,"
           "\"mismatches\":%llu,\"failures\":%llu,\"nodes_killed\":1,\"redis_failovers\":1}\n",
           (unsigned long long)t->hit_tokens, (unsigned long long)cross,
           (unsigned long long)t->verified_bytes, (unsigned long long)t->mismatches,
           (unsigned long long)t->failures);
}

/* Why phase p's nodes pulled nothing, as far as their counters tell. */
static void why_no_pulls(const cdemo *d, uint32_t p)
{
    fprintf(stderr, "kvtier demo --cluster: phase %u (%s): the nodes' pulls:", p, PHASE_NAMES[p]);
    for (uint32_t k = 0; k < NC_N; k++)
        fprintf(stderr, " %s %llu", NC_JSON[k], (unsigned long long)d->nc[p][k]);
    fprintf(stderr, "\n");
}

static int verdict(const cdemo *d, const cmsg *t)
{
    const char *bad = NULL;
    if (t->mismatches) bad = "loaded bytes differ from what was stored";
    else if (t->failures) bad = "requests failed other than by a dead node's KVT_ECONN";
    else if (!t->verified_bytes) bad = "nothing was loaded";
    else if (!d->cross[2]) bad = "no cross-node hits behind the random router";
    else if (!d->cross[4]) bad = "no cross-node hits after node 1's restart";
    else if (!d->sum[5].hit_tokens) bad = "no hits while the Redis primary was failing over";
    else if (!d->cross[6]) bad = "no cross-node hits after the failover";
    if (bad) fprintf(stderr, "kvtier demo --cluster: FAILED: %s\n", bad);
    for (uint32_t p = 2; bad && p <= NUM_PHASES; p += 2)
        if (!d->cross[p]) why_no_pulls(d, p);
    return bad ? 1 : 0;
}

static void print_tail(const char *what, const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) return;
    char buf[2048];
    fseek(f, 0, SEEK_END);
    long end = ftell(f);
    fseek(f, end > (long)sizeof buf ? end - (long)sizeof buf : 0, SEEK_SET);
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    fprintf(stderr, "--- the end of %s's log:\n", what);
    fwrite(buf, 1, n, stderr);
}

int kvt_demo_cluster(bool json)
{
    cdemo d = {.json = json};
    static char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) return fail("cannot find this program");
    self[n] = '\0';
    d.self = self;
    const char *base = getenv("TMPDIR");
    snprintf(d.dir, sizeof d.dir, "%s/kvtier-cl-XXXXXX", base && *base ? base : "/tmp");
    if (!mkdtemp(d.dir)) return fprintf(stderr, "kvtier demo --cluster: mkdtemp: %s\n", strerror(errno)), 1;
    snprintf(d.redis_log, sizeof d.redis_log, "%s/redis.log", d.dir);
    for (uint32_t i = 0; i < NODES; i++) {
        snprintf(d.node[i].sock, sizeof d.node[i].sock, "%s/node%u.sock", d.dir, i);
        snprintf(d.node[i].log, sizeof d.node[i].log, "%s/node%u.log", d.dir, i);
    }
    d.redis_port = cp_free_port();
    d.replica_port = cp_free_port();
    d.sentinel_port = cp_free_port();
    signal(SIGPIPE, SIG_IGN);
    uint64_t t0 = kvt__now_ns();
    int rc = run(&d);
    for (uint32_t i = 0; i < ENGINES; i++) {
        if (d.eng[i] <= 0) continue;
        uint8_t zero = 0;
        if (rc || write(d.to[i], &zero, 1) != 1) kill(d.eng[i], SIGKILL);
        close(d.to[i]);
        close(d.from[i]);
        waitpid(d.eng[i], NULL, 0);
    }
    for (uint32_t i = 0; i < NODES; i++) cp_kill_wait(&d.node[i].pid, SIGTERM);
    cp_kill_wait(&d.sentinel, SIGTERM);
    cp_kill_wait(&d.replica, SIGTERM);
    cp_kill_wait(&d.redis, SIGTERM);
    cmsg t;
    uint64_t cross;
    totals(&d, &t, &cross);
    if (!rc) {
        if (json) report_json(&d, &t, cross);
        else report_text(&d, &t, cross);
        rc = verdict(&d, &t);
        if (!json) printf("  %.1f s; %s\n", (double)(kvt__now_ns() - t0) / 1e9, rc ? "FAILED" : "ok");
    }
    if (rc) {
        for (uint32_t i = 0; i < NODES; i++) print_tail(d.node[i].sock, d.node[i].log);
        print_tail("redis", d.redis_log);
    }
    remove_tree(d.dir);
    return rc;
}
