/* demo_server.c - `kvtier demo --server`: the node cache in use.
 *
 * A `kvtier serve` process (its own temporary socket and SSD directory) and
 * two engine instances of TP 2, A and B, as four client processes. Each rank
 * serves the same requests as its peer rank (as TP ranks do) with its own
 * heads' KV, in its own namespace ("rank0", "rank1"), so rank r of A and
 * rank r of B share prefixes. Per request, as an engine: lookup, load the
 * cached prefix into poisoned pages and verify every byte, compute the rest
 * (the emulator), store it. The phases:
 *   1 A serves requests over 4 system prompts (it stores them);
 *   2 B serves other users of the same system prompts: hits across processes;
 *   3 A and B serve; B (both ranks) is SIGKILLed mid-run;
 *   4 B is restarted (new processes) and serves: hits after its restart;
 *   5 the server is stopped and restarted on the same SSD directory while A
 *     and B serve: their calls give KVT_ECONN (they recompute and retry), they
 *     re-attach on their own, and hit what the old server stored (warm SSD).
 * Any byte that differs, any failure other than KVT_ECONN, or a phase
 * without the hits it is there to show fails the demo (exit 1). */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli_util.h"
#include "cmds.h"
#include "kvtier.h"
#include "util/clock.h"

#define NUM_SYS 4        /* system prompts */
#define SYS_TOKENS 1024  /* tokens of each */
#define USER_MAX 256     /* a user's turn: 32..USER_MAX tokens */
#define PHASE_REQS 8     /* requests a rank serves per phase (phase 3: twice) */
#define CALL_MS 2000     /* every client call's deadline */
#define WAIT_MS 20000    /* a copy, a phase, a server start: bounded */
#define RETRY_MS 15000   /* a request retried across a server restart */
#define NUM_PHASES 5
#define STOP_MS 60000    /* the server's server_stop_ms: its SSD flush at SIGTERM */

typedef enum { MSG_PROGRESS = 1, MSG_DONE = 2 } msg_type;

/* A worker's report to the demo, over a pipe. */
typedef struct wmsg {
    uint32_t type, phase;
    uint64_t requests, lookup_tokens, hit_tokens, verified_bytes, mismatches;
    uint64_t econn, failures;
    uint64_t ssd_hit_tokens, recovered_blocks; /* the server's, at the phase's end */
} wmsg;

typedef struct worker {
    pid_t pid;
    int to, from; /* pipes: phase numbers down, wmsgs up */
    char inst;
    uint32_t rank;
} worker;

typedef struct sdemo {
    const char *self, *model;
    bool json;
    char dir[256], sock[300], ssd[300], log[300];
    pid_t server;
    worker w[4]; /* A0 A1 B0 B1 */
    wmsg sum[NUM_PHASES + 1][2]; /* [phase][instance] */
    uint32_t killed;
} sdemo;

/* ------------------------------------------------------------------ */
/* The engine rank (a child process)                                  */

typedef struct rank {
    kvt_client *cl;
    kvt_emu *emu;
    uint32_t *pages, num_pages;
    char ns[8];
    wmsg m;
    bool reattach_seen;
} rank;

static uint64_t mix(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}

/* Request idx of a phase: system prompt idx % NUM_SYS, then a user turn
 * that depends on the instance, phase and index (both ranks agree). */
static uint32_t make_request(uint32_t *tokens, char inst, uint32_t phase, uint32_t idx)
{
    uint32_t sys = idx % NUM_SYS, n = 0;
    for (uint32_t i = 0; i < SYS_TOKENS; i++) tokens[n++] = (uint32_t)(mix(1000 + sys * 7919 + i) % 32000);
    uint64_t seed = mix(((uint64_t)inst << 40) ^ ((uint64_t)phase << 20) ^ idx);
    uint32_t user = 32 + (uint32_t)(seed % (USER_MAX - 32));
    for (uint32_t i = 0; i < user; i++) tokens[n++] = (uint32_t)(mix(seed + i) % 32000);
    return n;
}

/* Loads the matched prefix and verifies it; returns the tokens reused (0
 * when the load failed: the engine recomputes). */
static uint32_t load(rank *r, const kvt_request *req, const kvt_match *m)
{
    kvt_emu_poison(r->emu, r->pages, r->num_pages);
    kvt_task_result res = {0};
    kvt_status st = kvt_client_launch(r->cl, m->task, r->pages, r->num_pages);
    if (!st) st = kvt_client_wait(r->cl, m->task, WAIT_MS, &res);
    if (!st) st = res.status;
    if (st) {
        if (st == KVT_ECONN) r->m.econn++;
        else r->m.failures++, fprintf(stderr, "kvtier demo: rank %s: load: %s\n", r->ns, kvt_last_error());
        kvt_client_cancel(r->cl, m->task);
        return 0;
    }
    kvt_verify_result v;
    if (kvt_emu_verify(r->emu, req, 0, m->matched_tokens, r->pages, r->num_pages, &v)) {
        r->m.failures++;
        return 0;
    }
    r->m.verified_bytes += v.bytes_checked;
    r->m.mismatches += v.mismatches;
    if (v.mismatches)
        fprintf(stderr, "kvtier demo: MISMATCH in %s: %llu bytes differ, first at token %u\n",
                r->ns, (unsigned long long)v.mismatches, v.first_bad_token);
    return m->matched_tokens;
}

static kvt_status store(rank *r, const kvt_request *req)
{
    kvt_store_plan p;
    kvt_status st = kvt_client_prepare_store(r->cl, req, &p);
    if (st || !p.task) return st;
    kvt_task_result res = {0};
    st = kvt_client_launch(r->cl, p.task, r->pages, r->num_pages);
    if (!st) st = kvt_client_wait(r->cl, p.task, WAIT_MS, &res);
    return st ? st : res.status;
}

/* One request as an engine serves it. KVT_ECONN: the server was away (the
 * caller retries); anything else is counted. */
static kvt_status serve_one(rank *r, const kvt_request *req)
{
    kvt_match m;
    kvt_status st = kvt_client_lookup(r->cl, req, &m);
    if (st) return st;
    uint32_t reuse = m.task ? load(r, req, &m) : 0;
    kvt_emu_fill(r->emu, req, reuse, req->num_tokens - reuse, r->pages, r->num_pages);
    r->m.requests++;
    r->m.lookup_tokens += req->num_tokens;
    r->m.hit_tokens += reuse;
    st = store(r, req);
    if (st == KVT_ECONN) r->m.econn++;
    else if (st) r->m.failures++, fprintf(stderr, "kvtier demo: rank %s: store: %s\n", r->ns, kvt_last_error());
    return KVT_OK;
}

static void run_phase(rank *r, char inst, uint32_t phase, int out)
{
    memset(&r->m, 0, sizeof r->m);
    r->m.phase = phase;
    uint32_t n = phase == 3 ? 2 * PHASE_REQS : PHASE_REQS;
    uint32_t tokens[SYS_TOKENS + USER_MAX];
    for (uint32_t i = 0; i < n; i++) {
        kvt_request req = {.tokens = tokens, .num_tokens = make_request(tokens, inst, phase, i),
                           .ns = r->ns, .ns_len = (uint32_t)strlen(r->ns)};
        uint64_t until = kvt__now_ns() + (uint64_t)RETRY_MS * 1000000ull;
        kvt_status st;
        /* Across a server restart: each try fails fast (KVT_ECONN), the
         * client re-attaches on its own (backoff <= 1 s). */
        while ((st = serve_one(r, &req)) == KVT_ECONN && kvt__now_ns() < until) {
            r->m.econn++;
            struct timespec ts = {0, 50 * 1000000L};
            nanosleep(&ts, NULL);
        }
        if (st) r->m.failures++, fprintf(stderr, "kvtier demo: rank %s: %s\n", r->ns, kvt_last_error());
        wmsg p = {.type = MSG_PROGRESS, .phase = phase};
        if (write(out, &p, sizeof p) != sizeof p) _exit(3);
    }
    kvt_cache_stats cs;
    if (kvt_client_stats(r->cl, &cs) == KVT_OK) {
        r->m.ssd_hit_tokens = cs.ssd_hit_tokens;
        r->m.recovered_blocks = cs.recovered_blocks;
    }
    r->m.type = MSG_DONE;
    if (write(out, &r->m, sizeof r->m) != sizeof r->m) _exit(3);
}

static kvt_status rank_open(rank *r, const sdemo *d, uint32_t idx)
{
    snprintf(r->ns, sizeof r->ns, "rank%u", idx);
    kvt_geometry *geo = NULL;
    kvt_status st = kvt_geometry_preset(&geo, d->model, 16, 2);
    kvt_layer_spec l;
    if (!st) st = kvt_geometry_layer(geo, 0, &l);
    if (!st) st = kvt_client_attach(&r->cl, d->sock, geo, CALL_MS);
    r->num_pages = (SYS_TOKENS + USER_MAX) / 16 + 1;
    if (!st) st = kvt_emu_create(&r->emu, geo, r->num_pages);
    /* This rank holds global heads [idx * h, (idx + 1) * h). */
    if (!st) st = kvt_emu_set_first_head(r->emu, idx * l.component[0].kv_heads);
    kvt_engine_memory mem;
    if (!st) st = kvt_emu_memory(r->emu, &mem);
    if (!st) st = kvt_client_register_memory(r->cl, &mem);
    kvt_geometry_destroy(geo);
    r->pages = calloc(r->num_pages, sizeof *r->pages);
    if (!st && !r->pages) st = KVT_ENOMEM;
    for (uint32_t i = 0; r->pages && i < r->num_pages; i++) r->pages[i] = r->num_pages - 1 - i;
    return st;
}

static void worker_main(const sdemo *d, char inst, uint32_t idx, int in, int out)
{
    rank r = {0};
    kvt_status st = rank_open(&r, d, idx);
    if (st) {
        fprintf(stderr, "kvtier demo: rank %c%u: %s: %s\n", inst, idx, kvt_status_name(st),
                kvt_last_error());
        _exit(1);
    }
    uint8_t phase;
    while (read(in, &phase, 1) == 1 && phase != 0) run_phase(&r, inst, phase, out);
    kvt_client_detach(r.cl);
    kvt_emu_destroy(r.emu);
    free(r.pages);
    _exit(0);
}

/* ------------------------------------------------------------------ */
/* The demo (parent): processes and phases                            */

static int fail(sdemo *d, const char *what)
{
    fprintf(stderr, "kvtier demo --server: %s (server log: %s)\n", what, d->log);
    return 1;
}

/* Starts `kvtier serve` on the demo's socket and SSD directory; returns
 * once it listens (or 1). */
static int start_server(sdemo *d)
{
    pid_t pid = fork();
    if (pid < 0) return fail(d, "fork failed");
    if (pid == 0) {
        int fd = open(d->log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
        if (fd >= 0) dup2(fd, STDERR_FILENO);
        char ssd[320];
        snprintf(ssd, sizeof ssd, "ssd_dirs=%s", d->ssd);
        char stop_ms[40];
        snprintf(stop_ms, sizeof stop_ms, "server_stop_ms=%d", STOP_MS);
        execl(d->self, "kvtier", "serve", "--socket", d->sock, "--model", d->model, "--tp", "2",
              "--set", "cpu_capacity=256MiB", "--set", "huge_pages=false", "--set", ssd,
              "--set", "ssd_capacity=1GiB", "--set", stop_ms, (char *)NULL);
        _exit(127);
    }
    d->server = pid;
    uint64_t until = kvt__now_ns() + (uint64_t)WAIT_MS * 1000000ull;
    struct stat sb;
    while (stat(d->sock, &sb) != 0 || !S_ISSOCK(sb.st_mode)) {
        if (waitpid(pid, NULL, WNOHANG) == pid || kvt__now_ns() > until) {
            d->server = 0;
            return fail(d, "the server did not start");
        }
        struct timespec ts = {0, 20 * 1000000L};
        nanosleep(&ts, NULL);
    }
    return 0;
}

/* SIGTERM: the server flushes its SSD writes (server_stop_ms is generous:
 * the restart must come back warm even on a loaded machine) and exits 0. */
static int stop_server(sdemo *d)
{
    if (!d->server) return 0;
    kill(d->server, SIGTERM);
    int ws = 0;
    uint64_t until = kvt__now_ns() + (uint64_t)(STOP_MS + WAIT_MS) * 1000000ull;
    while (waitpid(d->server, &ws, WNOHANG) == 0) {
        if (kvt__now_ns() > until) {
            kill(d->server, SIGKILL);
            waitpid(d->server, &ws, 0);
            break;
        }
        struct timespec ts = {0, 10 * 1000000L};
        nanosleep(&ts, NULL);
    }
    d->server = 0;
    return WIFEXITED(ws) && WEXITSTATUS(ws) == 0 ? 0 : fail(d, "the server did not stop cleanly");
}

static int spawn_worker(sdemo *d, uint32_t i)
{
    int down[2], up[2];
    if (pipe2(down, O_CLOEXEC) || pipe2(up, O_CLOEXEC)) return fail(d, "pipe failed");
    worker *w = &d->w[i];
    w->inst = i < 2 ? 'A' : 'B';
    w->rank = i % 2;
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) return fail(d, "fork failed");
    if (pid == 0) {
        close(down[1]);
        close(up[0]);
        worker_main(d, w->inst, w->rank, down[0], up[1]);
    }
    close(down[0]);
    close(up[1]);
    w->pid = pid;
    w->to = down[1];
    w->from = up[0];
    return 0;
}

static void end_worker(worker *w, int sig)
{
    if (w->pid <= 0) return;
    if (sig) kill(w->pid, sig);
    else {
        uint8_t zero = 0;
        if (write(w->to, &zero, 1) != 1) kill(w->pid, SIGKILL);
    }
    close(w->to);
    close(w->from);
    waitpid(w->pid, NULL, 0);
    w->pid = 0;
}

/* The next message of worker w, within WAIT_MS; false if it died. */
static bool next_msg(worker *w, wmsg *m)
{
    struct pollfd p = {w->from, POLLIN, 0};
    if (poll(&p, 1, WAIT_MS) != 1) return false;
    return read(w->from, m, sizeof *m) == (ssize_t)sizeof *m;
}

static int send_phase(sdemo *d, uint32_t first, uint32_t n, uint8_t phase)
{
    for (uint32_t i = first; i < first + n; i++)
        if (write(d->w[i].to, &phase, 1) != 1) return fail(d, "a rank process went away");
    return 0;
}

/* Collects the DONE of workers [first, first + n) into the phase's sums. */
static int collect(sdemo *d, uint32_t first, uint32_t n, uint32_t phase)
{
    for (uint32_t i = first; i < first + n; i++) {
        wmsg m;
        do {
            if (!next_msg(&d->w[i], &m)) return fail(d, "a rank process died or stalled");
        } while (m.type != MSG_DONE);
        wmsg *s = &d->sum[phase][d->w[i].inst - 'A'];
        s->phase = phase;
        s->requests += m.requests, s->lookup_tokens += m.lookup_tokens;
        s->hit_tokens += m.hit_tokens, s->verified_bytes += m.verified_bytes;
        s->mismatches += m.mismatches, s->econn += m.econn, s->failures += m.failures;
        s->ssd_hit_tokens = m.ssd_hit_tokens, s->recovered_blocks = m.recovered_blocks;
    }
    return 0;
}

/* Phase 3: A serves; B is SIGKILLed (both ranks) after 3 of its requests. */
static int phase_kill(sdemo *d)
{
    if (send_phase(d, 0, 4, 3)) return 1;
    for (uint32_t i = 2; i < 4; i++) {
        wmsg m;
        for (int done = 0; done < 3;)
            if (!next_msg(&d->w[i], &m)) return fail(d, "instance B stalled before the kill");
            else done += m.type == MSG_PROGRESS;
    }
    end_worker(&d->w[2], SIGKILL);
    end_worker(&d->w[3], SIGKILL);
    d->killed = 2;
    if (collect(d, 0, 2, 3)) return 1;
    return spawn_worker(d, 2) || spawn_worker(d, 3);
}

/* Phase 5: the server restarts under A and B. */
static int phase_restart(sdemo *d)
{
    if (stop_server(d)) return 1;
    if (send_phase(d, 0, 4, 5)) return 1;
    struct timespec ts = {0, 300 * 1000000L}; /* they meet a dead socket meanwhile */
    nanosleep(&ts, NULL);
    if (start_server(d)) return 1;
    return collect(d, 0, 4, 5);
}

static int run(sdemo *d)
{
    if (start_server(d)) return 1;
    for (uint32_t i = 0; i < 4; i++)
        if (spawn_worker(d, i)) return 1;
    if (send_phase(d, 0, 2, 1) || collect(d, 0, 2, 1)) return 1;
    if (send_phase(d, 2, 2, 2) || collect(d, 2, 2, 2)) return 1;
    if (phase_kill(d)) return 1;
    if (send_phase(d, 2, 2, 4) || collect(d, 2, 2, 4)) return 1;
    return phase_restart(d);
}

/* ------------------------------------------------------------------ */
/* The report                                                         */

static const char *const PHASE_NAMES[NUM_PHASES + 1] = {
    "", "A stores system prompts", "B, another process", "B SIGKILLed mid-run",
    "B restarted", "server restarted",
};

static void totals(const sdemo *d, wmsg *t)
{
    memset(t, 0, sizeof *t);
    for (uint32_t p = 1; p <= NUM_PHASES; p++)
        for (int i = 0; i < 2; i++) {
            const wmsg *s = &d->sum[p][i];
            t->requests += s->requests, t->verified_bytes += s->verified_bytes;
            t->mismatches += s->mismatches, t->failures += s->failures, t->econn += s->econn;
        }
}

static void report_text(const sdemo *d, const wmsg *t)
{
    printf("kvtier demo --server: 1 server, 2 engine instances x TP 2 = 4 client processes\n");
    printf("  %-26s %-4s %8s %12s %12s %6s\n", "phase", "inst", "requests", "lookup tok",
           "hit tok", "ECONN");
    for (uint32_t p = 1; p <= NUM_PHASES; p++)
        for (int i = 0; i < 2; i++) {
            const wmsg *s = &d->sum[p][i];
            if (!s->requests) continue;
            printf("  %-26s %-4c %8llu %12llu %12llu %6llu\n", PHASE_NAMES[p], 'A' + i,
                   (unsigned long long)s->requests, (unsigned long long)s->lookup_tokens,
                   (unsigned long long)s->hit_tokens, (unsigned long long)s->econn);
        }
    const wmsg *r = &d->sum[5][0];
    printf("  hits across processes (B on A's prefixes): %llu tokens\n",
           (unsigned long long)d->sum[2][1].hit_tokens);
    printf("  hits after B's restart: %llu tokens; after the server's: %llu tokens "
           "(%llu recovered blocks, %llu tokens read from SSD)\n",
           (unsigned long long)d->sum[4][1].hit_tokens,
           (unsigned long long)(d->sum[5][0].hit_tokens + d->sum[5][1].hit_tokens),
           (unsigned long long)r->recovered_blocks, (unsigned long long)r->ssd_hit_tokens);
    printf("  processes SIGKILLed: %u; loaded bytes verified: %llu, mismatches: %llu, "
           "failures: %llu\n", d->killed, (unsigned long long)t->verified_bytes,
           (unsigned long long)t->mismatches, (unsigned long long)t->failures);
}

static void report_json(const sdemo *d, const wmsg *t)
{
    printf("{\"processes\":4,\"killed\":%u,\"phases\":[", d->killed);
    for (uint32_t p = 1; p <= NUM_PHASES; p++)
        for (int i = 0; i < 2; i++) {
            const wmsg *s = &d->sum[p][i];
            if (!s->requests) continue;
            printf("%s{\"phase\":%u,\"instance\":\"%c\",\"requests\":%llu,\"lookup_tokens\":%llu,"
                   "\"hit_tokens\":%llu,\"econn\":%llu}", p == 1 && i == 0 ? "" : ",", p, 'A' + i,
                   (unsigned long long)s->requests, (unsigned long long)s->lookup_tokens,
                   (unsigned long long)s->hit_tokens, (unsigned long long)s->econn);
        }
    printf("],\"cross_process_hit_tokens\":%llu,\"instance_restart_hit_tokens\":%llu,"
           "\"server_restart_hit_tokens\":%llu,\"server_restart_econn\":%llu,"
           "\"recovered_blocks\":%llu,\"ssd_hit_tokens\":%llu,\"verified_bytes\":%llu,"
           "\"mismatches\":%llu,\"failures\":%llu}\n",
           (unsigned long long)d->sum[2][1].hit_tokens, (unsigned long long)d->sum[4][1].hit_tokens,
           (unsigned long long)(d->sum[5][0].hit_tokens + d->sum[5][1].hit_tokens),
           (unsigned long long)(d->sum[5][0].econn + d->sum[5][1].econn),
           (unsigned long long)d->sum[5][0].recovered_blocks,
           (unsigned long long)d->sum[5][0].ssd_hit_tokens, (unsigned long long)t->verified_bytes,
           (unsigned long long)t->mismatches, (unsigned long long)t->failures);
}

/* What the demo is there to show, checked. */
static int verdict(const sdemo *d, const wmsg *t)
{
    const char *bad = NULL;
    if (t->mismatches) bad = "loaded bytes differ from what was stored";
    else if (t->failures) bad = "requests failed other than by KVT_ECONN";
    else if (!t->verified_bytes) bad = "nothing was loaded";
    else if (!d->sum[2][1].hit_tokens) bad = "B did not hit what A stored";
    else if (!d->sum[4][1].hit_tokens) bad = "B did not hit after its restart";
    else if (!d->sum[5][0].hit_tokens || !d->sum[5][1].hit_tokens)
        bad = "no hits after the server's restart";
    else if (!d->sum[5][0].econn) bad = "A never saw the server go away";
    else if (!d->sum[5][0].recovered_blocks) bad = "the restarted server recovered nothing";
    if (bad) fprintf(stderr, "kvtier demo --server: FAILED: %s\n", bad);
    return bad ? 1 : 0;
}

/* On a failure: the end of the server's log, for the diagnosis. */
static void print_tail(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) return;
    char buf[4096];
    fseek(f, 0, SEEK_END);
    long end = ftell(f);
    fseek(f, end > (long)sizeof buf ? end - (long)sizeof buf : 0, SEEK_SET);
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    fprintf(stderr, "--- the end of the server's log:\n");
    fwrite(buf, 1, n, stderr);
}

int kvt_demo_server(const char *model, bool json)
{
    sdemo d = {.model = model, .json = json};
    static char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) return fprintf(stderr, "kvtier demo --server: cannot find this program\n"), 1;
    self[n] = '\0';
    d.self = self;
    const char *base = getenv("TMPDIR");
    snprintf(d.dir, sizeof d.dir, "%s/kvtier-srv-XXXXXX", base && *base ? base : "/tmp");
    if (!mkdtemp(d.dir)) return fprintf(stderr, "kvtier demo --server: mkdtemp: %s\n", strerror(errno)), 1;
    snprintf(d.sock, sizeof d.sock, "%s/node.sock", d.dir);
    snprintf(d.ssd, sizeof d.ssd, "%s/ssd", d.dir);
    snprintf(d.log, sizeof d.log, "%s/server.log", d.dir);
    signal(SIGPIPE, SIG_IGN);
    uint64_t t0 = kvt__now_ns();
    int rc = run(&d);
    for (uint32_t i = 0; i < 4; i++) end_worker(&d.w[i], rc ? SIGKILL : 0);
    if (stop_server(&d)) rc = 1;
    wmsg t;
    totals(&d, &t);
    if (!rc) {
        if (json) report_json(&d, &t);
        else report_text(&d, &t);
        rc = verdict(&d, &t);
        if (!json) printf("  %.1f s; %s\n", (double)(kvt__now_ns() - t0) / 1e9, rc ? "FAILED" : "ok");
    }
    if (rc) print_tail(d.log);
    remove_tree(d.dir);
    return rc;
}
