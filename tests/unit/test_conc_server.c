/* test_conc_server.c - the node server with real processes: a server
 * process, engine processes attached as clients, SIGKILLs. Every loaded
 * byte is verified against the emulated engine. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sodium.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/un.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <sys/wait.h>
#include <grp.h>
#include <dirent.h>
#include <time.h>
#include <unistd.h>

#include "support.h"
#include "cache/cache.h"
#include "net/stream.h"
#include "server/proto.h"
#include "server/server.h"
#include "util/clock.h"
#include "util/err.h"
#include "util/file.h"

#define LAYERS 4
#define TPP 16
#define BLOCKS 8
#define NTOK (BLOCKS * TPP + 1) /* 8 full blocks and the last token */
#define PAGES 64
#define TIMEOUT_MS 3000

static char g_dir[256];

static kvt_geometry *geo_heads(uint32_t heads)
{
    return kvt_test_geometry(LAYERS, heads, 16, TPP, KVT_LAYOUT_LAYER_FIRST);
}

static void sock_path(char *out, size_t n, const char *name)
{
    snprintf(out, n, "%s/%s", g_dir, name);
}

static void make_dir(void)
{
    const char *base = getenv("KVTIER_TEST_TMP");
    if (!base) base = "/tmp";
    mkdir(base, 0700);
    snprintf(g_dir, sizeof g_dir, "%s/srvXXXXXX", base);
    assert_non_null(mkdtemp(g_dir));
    kvt_test_dir_track(g_dir);
}

/* Waits for pid to exit within ms; returns its exit code, or -signal; kills
 * it and fails the test when it overstays. */
static int reap(pid_t pid, int ms)
{
    for (int i = 0; i < ms; i++) {
        int ws = 0;
        pid_t r = waitpid(pid, &ws, WNOHANG);
        if (r == pid) return WIFEXITED(ws) ? WEXITSTATUS(ws) : -WTERMSIG(ws);
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    fail_msg("process %ld did not end within %d ms", (long)pid, ms);
    return -1;
}

/* ------------------------------------------------------------------ */
/* A server process                                                   */

/* The server process's log lines, through kvt_set_log_handler, appended to
 * g_log_path when it is set. */
static char g_log_path[320];
static void log_to_file(void *user, kvt_log_level level, const char *line)
{
    (void)user;
    FILE *f = fopen(g_log_path, "a");
    if (!f) return;
    fprintf(f, "%d %s\n", (int)level, line);
    fclose(f);
}

/* Extra options of the next servers made: "name", "value", ..., NULL. */
static const char *const *g_opts;
/* The next servers are made with no geometry: they serve any. */
static bool g_any_geometry;

static kvt_status make_server(kvt_server **out, const char *path, const char *ssd_dir)
{
    kvt_config *cfg = NULL;
    kvt_status st = kvt_config_create(&cfg);
    if (!st) st = kvt_config_set(cfg, "server_socket", path);
    if (!st) st = kvt_config_set(cfg, "cpu_capacity", "4MiB");
    if (!st) st = kvt_config_set(cfg, "huge_pages", "false");
    if (!st) st = kvt_config_set(cfg, "block_tokens", "16");
    if (!st && ssd_dir) st = kvt_config_set(cfg, "ssd_dirs", ssd_dir);
    if (!st && ssd_dir) st = kvt_config_set(cfg, "ssd_capacity", "8MiB");
    for (int i = 0; !st && g_opts && g_opts[i]; i += 2) st = kvt_config_set(cfg, g_opts[i], g_opts[i + 1]);
    kvt_geometry *g = g_any_geometry ? NULL : geo_heads(2);
    if (!st) st = kvt_server_create(out, cfg, g);
    kvt_geometry_destroy(g);
    kvt_config_destroy(cfg);
    return st;
}

/* Forks a server on path (kvt_test_server_fork: killed by the teardown
 * kvt_test_servers_kill if a test fails); returns once it listens. */
typedef struct srv_args {
    const char *path, *ssd_dir;
} srv_args;

/* When set, the next server process may open only this many descriptors
 * more than it holds once it listens (RLIMIT_NOFILE). */
static unsigned g_fd_slack;

static unsigned open_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    unsigned n = 0;
    for (struct dirent *e; d && (e = readdir(d));) n += e->d_name[0] != '.';
    if (d) closedir(d);
    return n;
}

static kvt_status make_in_child(kvt_server **out, void *arg)
{
    const srv_args *a = arg;
    if (g_log_path[0] && g_fd_slack) { /* the default logger's stderr: no open per line */
        int fd = open(g_log_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
        if (fd < 0 || dup2(fd, STDERR_FILENO) < 0) return kvt__fail(KVT_ESYS, "log file");
        close(fd);
    } else if (g_log_path[0]) {
        kvt_set_log_handler(log_to_file, NULL);
    }
    kvt_status st = make_server(out, a->path, a->ssd_dir);
    if (!st && g_fd_slack) {
        struct rlimit rl = {open_fds() + g_fd_slack, open_fds() + g_fd_slack};
        if (setrlimit(RLIMIT_NOFILE, &rl) != 0) st = kvt__fail(KVT_ESYS, "setrlimit");
    }
    return st;
}

static pid_t start_server(const char *path, const char *ssd_dir)
{
    srv_args a = {path, ssd_dir};
    return kvt_test_server_fork(make_in_child, &a);
}

/* SIGTERM must stop a server cleanly and quickly. */
static void stop_server(pid_t pid, const char *path)
{
    kvt_test_server_forget(pid);
    uint64_t t0 = kvt__now_ns();
    kill(pid, SIGTERM);
    assert_int_equal(reap(pid, 5000), 0);
    assert_true(kvt__now_ns() - t0 < 5000000000ull);
    assert_int_not_equal(access(path, F_OK), 0); /* socket removed */
}

/* ------------------------------------------------------------------ */
/* An engine process                                                  */

typedef struct engine {
    kvt_client *cl;
    kvt_emu *emu;
    kvt_geometry *geo;
    uint32_t pages[PAGES];
} engine;

/* The engines this process has open: a test that fails midway (cmocka
 * longjmps out of it) leaves its clients attached, with their threads, and
 * every later test would then refuse to fork (kvt_test_fork). The teardown
 * closes them, so one failure reports once instead of cascading. */
#define MAX_OPEN 64
static engine g_open[MAX_OPEN];

static void engine_track(const engine *e, bool open)
{
    for (int i = 0; i < MAX_OPEN; i++)
        if (open ? g_open[i].cl == NULL : g_open[i].cl == e->cl) {
            if (open) g_open[i] = *e;
            else memset(&g_open[i], 0, sizeof g_open[i]);
            return;
        }
}

/* An engine whose client calls have timeout_ms as their deadline. */
static kvt_status engine_open_t(engine *e, const char *path, uint32_t heads, int64_t timeout_ms)
{
    memset(e, 0, sizeof *e);
    e->geo = geo_heads(heads);
    for (uint32_t i = 0; i < PAGES; i++) e->pages[i] = (i * 7) % PAGES; /* scattered */
    kvt_status st = kvt_client_attach(&e->cl, path, e->geo, timeout_ms);
    if (st) return st;
    kvt_engine_memory mem;
    st = kvt_emu_create(&e->emu, e->geo, PAGES);
    engine_track(e, true);
    if (st) return st;
    if ((st = kvt_emu_memory(e->emu, &mem))) return st;
    return kvt_client_register_memory(e->cl, &mem);
}

static kvt_status engine_open(engine *e, const char *path, uint32_t heads)
{
    return engine_open_t(e, path, heads, TIMEOUT_MS);
}

static void engine_close(engine *e)
{
    engine_track(e, false);
    kvt_client_detach(e->cl);
    kvt_emu_destroy(e->emu);
    kvt_geometry_destroy(e->geo);
}

/* Teardown: the engines a failed test left open, then its servers. */
static int close_and_kill(void **state)
{
    for (int i = 0; i < MAX_OPEN; i++)
        if (g_open[i].cl) {
            engine e = g_open[i]; /* engine_close clears the slot */
            engine_close(&e);
        }
    return kvt_test_servers_kill(state);
}

static void request(kvt_request *r, uint32_t *tokens, uint64_t seed)
{
    kvt_test_tokens(tokens, NTOK, seed);
    kvt_request q = {tokens, NTOK, "tenant", 6};
    *r = q;
}

/* Stores the request's blocks this process was asked to; *stored gets the
 * tokens it stored (0 when someone else owns them). */
static kvt_status engine_store(engine *e, const kvt_request *r, uint32_t *stored)
{
    kvt_store_plan p;
    kvt_status st = kvt_client_prepare_store(e->cl, r, &p);
    if (st) return st;
    *stored = 0;
    if (!p.task) return KVT_OK;
    if ((st = kvt_emu_fill(e->emu, r, 0, r->num_tokens, e->pages, PAGES))) return st;
    if ((st = kvt_client_launch(e->cl, p.task, e->pages, PAGES))) return st;
    kvt_task_result res;
    if ((st = kvt_client_wait(e->cl, p.task, TIMEOUT_MS, &res))) return st;
    if (res.status) return kvt__fail(res.status, "store result %s", kvt_status_name(res.status));
    *stored = p.num_tokens;
    /* Other clients see a store once the server checked it, which this
     * client's next call waits for (kvtier.h): the tests that look it up
     * from another client right after need that, not a race. */
    kvt_cache_stats cs;
    return kvt_client_stats(e->cl, &cs);
}

/* Loads the cached prefix into poisoned pages and verifies every byte;
 * *matched gets the tokens loaded. */
static kvt_status engine_load(engine *e, const kvt_request *r, uint32_t *matched)
{
    kvt_match m;
    kvt_status st = kvt_client_lookup(e->cl, r, &m);
    if (st) return st;
    *matched = m.matched_tokens;
    if (!m.task) return KVT_OK;
    if ((st = kvt_emu_poison(e->emu, e->pages, PAGES))) return st;
    if ((st = kvt_client_launch(e->cl, m.task, e->pages, PAGES))) return st;
    if ((st = kvt_client_wait_layer(e->cl, m.task, LAYERS - 1, TIMEOUT_MS))) return st;
    kvt_task_result res;
    if ((st = kvt_client_wait(e->cl, m.task, TIMEOUT_MS, &res))) return st;
    if (res.status) return kvt__fail(res.status, "load result %s", kvt_status_name(res.status));
    kvt_verify_result v;
    if ((st = kvt_emu_verify(e->emu, r, 0, m.matched_tokens, e->pages, PAGES, &v))) return st;
    if (v.mismatches || v.bytes_checked == 0)
        return kvt__fail(KVT_ECORRUPT, "%llu of %llu bytes differ (token %u layer %u)",
                         (unsigned long long)v.mismatches, (unsigned long long)v.bytes_checked,
                         v.first_bad_token, v.first_bad_layer);
    /* A load's wait returns once its copy ended; its END (which counts it
     * in the server's stats and releases its pins) follows, and this
     * client's next call waits for it: a test that reads the stats from
     * another connection right after needs that, not a race (fresh-check
     * run 36: loaded_blocks 0 in test_tier_stats_read_only). */
    kvt_cache_stats cs;
    return kvt_client_stats(e->cl, &cs);
}

/* Runs fn in a child process; returns the child's pid. The child exits 0
 * on success, 1 (with the message on stderr) otherwise. */
typedef kvt_status (*child_fn)(const char *path, void *arg);
static pid_t spawn(child_fn fn, const char *path, void *arg)
{
    pid_t pid = kvt_test_fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        kvt_status st = fn(path, arg);
        if (st) fprintf(stderr, "child %ld: %s: %s\n", (long)getpid(), kvt_status_name(st),
                        kvt_last_error());
        _exit(st ? 1 : 0);
    }
    return pid;
}

/* The whole of a test whose one child does the checking: a server of its
 * own on socket `name`, the child against it, a clean stop. */
static void child_against_server(const char *name, child_fn fn, void *arg)
{
    make_dir();
    char path[300];
    sock_path(path, sizeof path, name);
    pid_t srv = start_server(path, NULL);
    assert_int_equal(reap(spawn(fn, path, arg), 20000), 0);
    stop_server(srv, path);
}

static kvt_status child_store(const char *path, void *arg)
{
    uint64_t seed = *(uint64_t *)arg;
    engine e;
    kvt_status st = engine_open(&e, path, 2);
    uint32_t tokens[NTOK], stored = 0;
    kvt_request r;
    request(&r, tokens, seed);
    if (!st) st = engine_store(&e, &r, &stored);
    if (!st && stored != BLOCKS * TPP)
        st = kvt__fail(KVT_EINVAL, "stored %u tokens, want %u", stored, BLOCKS * TPP);
    engine_close(&e);
    return st;
}

static kvt_status child_load(const char *path, void *arg)
{
    uint64_t seed = *(uint64_t *)arg;
    engine e;
    kvt_status st = engine_open(&e, path, 2);
    uint32_t tokens[NTOK], matched = 0;
    kvt_request r;
    request(&r, tokens, seed);
    uint32_t peeked = 0;
    if (!st) st = kvt_client_peek(e.cl, &r, &peeked); /* as the lookup after it */
    if (!st && peeked != BLOCKS * TPP)
        st = kvt__fail(KVT_ENOTFOUND, "peeked %u tokens, want %u", peeked, BLOCKS * TPP);
    if (!st) st = engine_load(&e, &r, &matched);
    if (!st && matched != BLOCKS * TPP)
        st = kvt__fail(KVT_ENOTFOUND, "matched %u tokens, want %u", matched, BLOCKS * TPP);
    engine_close(&e);
    return st;
}

/* An engine of kv_heads heads (and, with block_tokens, asking for that
 * block size) against a server of any geometry: it must first miss
 * (want_first 0) or hit want_first tokens, byte-verified, then store what
 * it missed and find all of it, byte for byte. */
typedef struct geo_step {
    uint64_t seed;
    uint32_t heads, block_tokens, want_first;
} geo_step;

static kvt_status child_geo_step(const char *path, void *arg)
{
    const geo_step *g = arg;
    char bt[16];
    snprintf(bt, sizeof bt, "%u", g->block_tokens);
    if (g->block_tokens) setenv("KVTIER_BLOCK_TOKENS", bt, 1);
    engine e;
    kvt_status st = engine_open(&e, path, g->heads);
    uint32_t tokens[NTOK], matched = 0, stored = 0;
    kvt_request r;
    request(&r, tokens, g->seed);
    if (!st) st = engine_load(&e, &r, &matched);
    if (!st && matched != g->want_first)
        st = kvt__fail(KVT_EINVAL, "heads %u, block_tokens %u: first lookup matched %u tokens, "
                       "want %u", g->heads, g->block_tokens, matched, g->want_first);
    if (!st) st = engine_store(&e, &r, &stored);
    if (!st) st = engine_load(&e, &r, &matched);
    if (!st && matched != BLOCKS * TPP)
        st = kvt__fail(KVT_EINVAL, "heads %u: after its store matched %u tokens, want %u",
                       g->heads, matched, BLOCKS * TPP);
    engine_close(&e);
    return st;
}

/* An attach that must be refused with want, its message holding text. */
typedef struct geo_refusal {
    uint32_t heads;
    kvt_status want;
    const char *text;
} geo_refusal;

static kvt_status child_geo_refused(const char *path, void *arg)
{
    const geo_refusal *g = arg;
    engine e;
    kvt_status st = engine_open(&e, path, g->heads);
    kvt_status out = KVT_OK;
    if (st != g->want || !strstr(kvt_last_error(), g->text))
        out = kvt__fail(KVT_EINVAL, "heads %u: attach gave %s (%s), want %s naming \"%s\"",
                        g->heads, kvt_status_name(st), kvt_last_error(),
                        kvt_status_name(g->want), g->text);
    engine_close(&e);
    return out;
}

/* ------------------------------------------------------------------ */
/* Tests                                                              */

/* Client A stores from one process, then client B, another process, loads
 * the same prefix through the shared tier, byte for byte. */
static void test_store_in_a_load_in_b(void **state)
{
    (void)state;
    make_dir();
    char path[300];
    sock_path(path, sizeof path, "s.sock");
    pid_t srv = start_server(path, NULL);
    struct stat sb;
    assert_int_equal(stat(path, &sb), 0);
    assert_int_equal(sb.st_mode & 0777, 0600);
    uint64_t seed = 11;
    assert_int_equal(reap(spawn(child_store, path, &seed), 20000), 0);
    assert_int_equal(reap(spawn(child_load, path, &seed), 20000), 0);
    assert_int_equal(reap(spawn(child_load, path, &seed), 20000), 0);
    stop_server(srv, path);
}

/* Attach and detach go through the library's logger at info, naming the
 * client's pid and uid; a handler set with kvt_set_log_handler gets them. */
static void test_attach_detach_logged(void **state)
{
    (void)state;
    make_dir();
    char path[300];
    sock_path(path, sizeof path, "l.sock");
    snprintf(g_log_path, sizeof g_log_path, "%s/server.log", g_dir);
    static const char *const opts[] = {"log_level", "info", NULL};
    g_opts = opts;
    pid_t srv = start_server(path, NULL);
    g_opts = NULL;
    g_log_path[0] = '\0';
    uint64_t seed = 12;
    pid_t kid = spawn(child_store, path, &seed);
    assert_int_equal(reap(kid, 20000), 0);
    char want_a[128], want_d[128], log[8192] = "";
    snprintf(want_a, sizeof want_a, "%d server: client pid %ld (uid %ld) attached",
             (int)KVT_LOG_INFO, (long)kid, (long)getuid());
    snprintf(want_d, sizeof want_d, "%d server: client pid %ld (uid %ld) detached",
             (int)KVT_LOG_INFO, (long)kid, (long)getuid());
    char file[340];
    snprintf(file, sizeof file, "%s/server.log", g_dir);
    for (int i = 0; i < 2000 && !strstr(log, want_d); i++) { /* detach is logged async */
        FILE *f = fopen(file, "r");
        if (f) {
            size_t n = fread(log, 1, sizeof log - 1, f);
            log[n] = '\0';
            fclose(f);
        }
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    if (!strstr(log, want_a) || !strstr(log, want_d))
        fail_msg("log lacks \"%s\" or \"%s\":\n%s", want_a, want_d, log);
    stop_server(srv, path);
}

/* ------------------------------------------------------------------ */
/* Metrics from the server                                            */

static uint16_t free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    socklen_t len = sizeof a;
    assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    close(fd);
    return ntohs(a.sin_port);
}

/* GET /metrics on 127.0.0.1:port; the body into buf. */
static void scrape(uint16_t port, char *buf, size_t cap)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    const char req[] = "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    assert_int_equal(write(fd, req, sizeof req - 1), (ssize_t)(sizeof req - 1));
    size_t len = 0;
    ssize_t got;
    while (len + 1 < cap && (got = read(fd, buf + len, cap - 1 - len)) > 0) len += (size_t)got;
    close(fd);
    buf[len] = '\0';
    assert_non_null(strstr(buf, "200 OK"));
}

/* The value of the series named exactly name (labels included), or -1. */
static double series(const char *body, const char *name)
{
    size_t n = strlen(name);
    for (const char *p = body; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
        if (strncmp(p, name, n) == 0 && p[n] == ' ') return strtod(p + n + 1, NULL);
    return -1;
}

/* Scrapes until the series reads want (2 s at most): gauges of a client
 * that just left drop when its connection thread ends, which is async. */
static void scrape_until(uint16_t port, char *body, size_t size, const char *name, double want)
{
    for (int i = 0; i < 2000; i++) {
        scrape(port, body, size);
        if (series(body, name) == want) return;
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
}

static void expect_series(const char *body, const char *name, double want)
{
    double got = series(body, name);
    if (got != want) fail_msg("%s is %g, want %g\n---\n%s", name, got, want, body);
}

/* Looks up seed 13's prefix (8 blocks pinned by the plan), tells the parent
 * on up, waits for a byte on down, then cancels and detaches. */
typedef struct pin_arg {
    int up, down;         /* the child's ends */
    int parent_up, parent_down; /* closed in the child: if the parent dies, read sees EOF */
} pin_arg;

static kvt_status child_pin(const char *path, void *arg)
{
    pin_arg *a = arg;
    close(a->parent_up);
    close(a->parent_down);
    engine e;
    kvt_status st = engine_open(&e, path, 2);
    uint32_t tokens[NTOK];
    kvt_request r;
    request(&r, tokens, 13);
    kvt_match m = {0};
    if (!st) st = kvt_client_lookup(e.cl, &r, &m);
    if (!st && m.matched_tokens != BLOCKS * TPP)
        st = kvt__fail(KVT_ENOTFOUND, "matched %u tokens", m.matched_tokens);
    char c = st ? 'x' : 'p';
    if (write(a->up, &c, 1) != 1) st = KVT_ESYS;
    if (read(a->down, &c, 1) != 1) st = KVT_ESYS;
    if (!st) st = kvt_client_cancel(e.cl, m.task);
    engine_close(&e);
    return st;
}

/* A scrape of the server's cache endpoint while a client is attached shows
 * kvtier_clients_attached 1 and the entries its lookup pins under its pid;
 * external stores land in the store latency histogram (launch_ns). */
static void test_metrics_clients_and_pins(void **state)
{
    (void)state;
    make_dir();
    char path[300], port_s[16];
    sock_path(path, sizeof path, "m.sock");
    uint16_t port = free_port();
    snprintf(port_s, sizeof port_s, "%u", port);
    const char *const opts[] = {"metrics_port", port_s, NULL};
    g_opts = opts;
    pid_t srv = start_server(path, NULL);
    g_opts = NULL;
    uint64_t seed = 13;
    assert_int_equal(reap(spawn(child_store, path, &seed), 20000), 0);
    static char body[1 << 17];
    int up[2], down[2];
    assert_int_equal(pipe(up), 0);
    assert_int_equal(pipe(down), 0);
    pin_arg a = {up[1], down[0], up[0], down[1]};
    pid_t kid = spawn(child_pin, path, &a);
    char c = 0;
    assert_int_equal(read(up[0], &c, 1), 1);
    assert_int_equal(c, 'p');
    /* The storing child's connection may still be ending. */
    scrape_until(port, body, sizeof body, "kvtier_clients_attached", 1);
    char name[64];
    snprintf(name, sizeof name, "kvtier_client_pins{pid=\"%ld\"}", (long)kid);
    expect_series(body, "kvtier_clients_attached", 1);
    expect_series(body, name, BLOCKS);
    expect_series(body, "kvtier_store_duration_seconds_count", 1);
    assert_int_equal(write(down[1], &c, 1), 1);
    assert_int_equal(reap(kid, 20000), 0);
    /* Detached: the gauge falls back (the connection thread ends async). */
    scrape_until(port, body, sizeof body, "kvtier_clients_attached", 0);
    expect_series(body, "kvtier_clients_attached", 0);
    assert_true(series(body, name) < 0); /* no series for a gone client */
    close(up[0]);
    close(up[1]);
    close(down[0]);
    close(down[1]);
    stop_server(srv, path);
}

/* A geometry other than the server's is refused at attach, naming the field. */
static void test_geometry_mismatch_refused(void **state)
{
    (void)state;
    make_dir();
    char path[300];
    sock_path(path, sizeof path, "g.sock");
    pid_t srv = start_server(path, NULL);
    kvt_geometry *g = geo_heads(4);
    kvt_client *cl = NULL;
    assert_status(kvt_client_attach(&cl, path, g, TIMEOUT_MS), KVT_EGEOMETRY);
    assert_null(cl);
    assert_non_null(strstr(kvt_last_error(), "kv_heads"));
    kvt_geometry_destroy(g);
    stop_server(srv, path);
}

/* A second server on the same socket, or on the same SSD directory, is
 * refused with a message naming the holder's pid. */
static void test_second_server_refused(void **state)
{
    (void)state;
    make_dir();
    char path[300], path2[300], ssd[300], want[64];
    sock_path(path, sizeof path, "d.sock");
    sock_path(path2, sizeof path2, "d2.sock");
    sock_path(ssd, sizeof ssd, "ssd");
    pid_t srv = start_server(path, ssd);
    snprintf(want, sizeof want, "pid %ld", (long)srv);
    kvt_server *s = NULL;
    assert_status(make_server(&s, path, NULL), KVT_EBUSY);
    assert_non_null(strstr(kvt_last_error(), want));
    assert_non_null(strstr(kvt_last_error(), path));
    assert_status(make_server(&s, path2, ssd), KVT_EBUSY);
    assert_non_null(strstr(kvt_last_error(), want));
    assert_non_null(strstr(kvt_last_error(), "SSD directory"));
    assert_null(s);
    stop_server(srv, path);
}

/* Several processes store the same prefix at once: exactly one owns each
 * block, then everything loads back. */
static kvt_status child_race_store(const char *path, void *arg)
{
    int *fds = arg; /* [0]: go pipe (read), [1]: result pipe (write) */
    engine e;
    kvt_status st = engine_open(&e, path, 2);
    uint32_t tokens[NTOK], stored = 0;
    kvt_request r;
    request(&r, tokens, 77);
    char go;
    if (!st && read(fds[0], &go, 1) != 1) st = kvt__fail(KVT_ESYS, "no go");
    if (!st) st = engine_store(&e, &r, &stored);
    if (write(fds[1], &stored, sizeof stored) != sizeof stored) st = KVT_ESYS;
    engine_close(&e);
    return st;
}

static void test_same_prefix_one_owner(void **state)
{
    (void)state;
    make_dir();
    char path[300];
    sock_path(path, sizeof path, "r.sock");
    pid_t srv = start_server(path, NULL);
    enum { N = 4 };
    int go[2], res[2];
    assert_int_equal(pipe(go), 0);
    assert_int_equal(pipe(res), 0);
    int fds[2] = {go[0], res[1]};
    pid_t kids[N];
    for (int i = 0; i < N; i++) kids[i] = spawn(child_race_store, path, fds);
    struct timespec ts = {0, 200 * 1000000L}; /* let them attach */
    nanosleep(&ts, NULL);
    char gos[N] = {0};
    assert_int_equal(write(go[1], gos, N), N);
    uint32_t total = 0, owners = 0;
    for (int i = 0; i < N; i++) {
        uint32_t s = 0;
        assert_int_equal(read(res[0], &s, sizeof s), (ssize_t)sizeof s);
        total += s;
        owners += s > 0;
    }
    for (int i = 0; i < N; i++) assert_int_equal(reap(kids[i], 20000), 0);
    assert_int_equal(total, BLOCKS * TPP);
    assert_true(owners >= 1);
    uint64_t seed = 77;
    assert_int_equal(reap(spawn(child_load, path, &seed), 20000), 0);
    for (int i = 0; i < 2; i++) {
        close(go[i]);
        close(res[i]);
    }
    stop_server(srv, path);
}

/* A raw client (the wire protocol by hand) launches a store, writes half of
 * its blocks and is SIGKILLed: the blocks never become visible and the
 * server released the plan at once, so another client stores the prefix
 * in full. The same raw client variant that claims wrong checksums has its
 * store committed, and every load of it fails (check_lie_never_served). */
typedef struct raw_arg {
    int ready; /* pipe to tell the parent the half-store is done */
    bool lie;  /* send END OK with bad checksums instead of dying */
    bool load; /* launch a load of seed 99's prefix instead, then wait to die */
} raw_arg;

static kvt_status raw_rt(int fd, uint16_t op, const kvt_srv_buf *b, uint8_t **rep, uint32_t *len,
                         int *fd_got)
{
    uint64_t dl = kvt__deadline_ns(TIMEOUT_MS);
    kvt_status st = kvt__srv_send_frame(fd, op, 0, b->p, b->len, -1, dl);
    kvt_srv_hdr h;
    if (!st) st = kvt__srv_recv_frame(fd, &h, rep, fd_got, dl);
    if (!st) *len = h.len; /* a failure's message too */
    if (!st && h.status) st = (kvt_status)h.status;
    return st;
}

/* A raw connection past the server's handshake (no secret), or -1. */
static int raw_connect(const char *path)
{
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
    kvt_stream_auth a = {.who = "raw client", .realm = &kvt__auth_server};
    if (sodium_init() < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0 ||
        kvt__stream_auth_client(fd, &a, kvt__deadline_ns(TIMEOUT_MS)) != KVT_OK) {
        close(fd);
        return -1;
    }
    return fd;
}

static kvt_status raw_stats(int fd, kvt_cache_stats *cs)
{
    kvt_srv_buf b = {0};
    uint8_t *p = NULL;
    uint32_t len = 0;
    kvt_status st = raw_rt(fd, KVT_SRV_STATS, &b, &p, &len, NULL);
    if (!st) st = kvt__srv_stats_decode(p, len, cs);
    free(p);
    return st;
}

/* A raw client past HELLO (two heads), the tier mapped into *tier. */
static kvt_status raw_attach(const char *path, kvt_geometry *g, int *fd, uint8_t **tier,
                             kvt_srv_hello_rep *h)
{
    if ((*fd = raw_connect(path)) < 0) return KVT_ECONN;
    kvt_srv_buf b = {0};
    uint8_t *p = NULL;
    uint32_t len = 0;
    int shm = -1;
    kvt__srv_hello_encode(&b, (uint32_t)getpid(), g, 0);
    kvt_status st = raw_rt(*fd, KVT_SRV_HELLO, &b, &p, &len, &shm);
    kvt__srv_buf_free(&b);
    if (!st) st = kvt__srv_hello_rep_decode(p, len, h);
    free(p);
    if (st) return st;
    *tier = mmap(NULL, h->map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, shm, 0);
    close(shm);
    return *tier == MAP_FAILED ? KVT_ESYS : KVT_OK;
}

/* A raw plan of seed 99's whole prefix (op: KVT_SRV_LOOKUP, a load; or
 * KVT_SRV_PREPARE, a store) and its LAUNCH on fd: the reply (offsets, and
 * a load's recorded layer checksums) in *l, its buffer in *rep (the caller
 * frees it), the task in *task for its END. */
static kvt_status raw_plan_launch(int fd, uint16_t op, uint64_t *task, kvt_srv_launch_rep *l,
                                  uint8_t **rep)
{
    uint32_t tokens[NTOK], first = 0, n = 0;
    kvt_request r;
    request(&r, tokens, 99);
    kvt_srv_buf b = {0};
    uint8_t *p = NULL;
    uint32_t len = 0;
    kvt__srv_req_encode(&b, &r);
    kvt_status st = raw_rt(fd, op, &b, &p, &len, NULL);
    kvt__srv_buf_free(&b);
    if (!st) st = kvt__srv_task_rep_decode(p, len, task, &first, &n);
    free(p);
    uint32_t planned = op == KVT_SRV_LOOKUP ? first : n; /* a lookup's first: its match */
    if (!st && planned != BLOCKS * TPP) st = kvt__fail(KVT_ENOTFOUND, "planned %u tokens", planned);
    if (st) return st;
    kvt__srv_id_encode(&b, *task);
    st = raw_rt(fd, KVT_SRV_LAUNCH, &b, rep, &len, NULL);
    kvt__srv_buf_free(&b);
    if (!st) st = kvt__srv_launch_rep_decode(*rep, len, l);
    return st;
}

static kvt_status raw_load_launch(int fd, uint64_t *task, kvt_srv_launch_rep *l, uint8_t **rep)
{
    kvt_status st = raw_plan_launch(fd, KVT_SRV_LOOKUP, task, l, rep);
    if (!st && (l->num_blocks != BLOCKS || l->num_layers != LAYERS))
        st = kvt__fail(KVT_EPROTO, "%u blocks of %u layers", l->num_blocks, l->num_layers);
    return st;
}

static kvt_status raw_end(int fd, uint64_t task, kvt_status status)
{
    kvt_srv_buf b = {0};
    uint8_t *p = NULL;
    uint32_t len = 0;
    kvt__srv_end_encode(&b, task, status, NULL, 0, 0);
    kvt_status st = raw_rt(fd, KVT_SRV_END, &b, &p, &len, NULL);
    kvt__srv_buf_free(&b);
    free(p);
    return st;
}

/* The server records the layer checksums a store's client took in its
 * copy (fused with it), and a load's LAUNCH reply carries them: here they
 * equal the tier's bytes hashed again, independently. Then one byte of
 * layer 2 of the last block changes in the tier, long after the store
 * committed (a stray write): the engine's load of the prefix fails with
 * KVT_ECORRUPT and never reports layer 2 landed; the server then drops
 * that block, so the next lookup matches the blocks before it (loaded
 * byte for byte), and a store of the prefix puts it back. */
static kvt_status scribbled_block(const char *path, engine *e, kvt_geometry *g)
{
    uint32_t tokens[NTOK], stored = 0, matched = 0;
    kvt_request r;
    request(&r, tokens, 99);
    int fd = -1;
    uint8_t *tier = NULL, *rep = NULL;
    kvt_srv_hello_rep h;
    kvt_srv_launch_rep l;
    uint64_t task = 0, mine[LAYERS];
    kvt_status st = engine_store(e, &r, &stored);
    if (!st && stored != BLOCKS * TPP) st = kvt__fail(KVT_EPROTO, "stored %u", stored);
    if (!st) st = raw_attach(path, g, &fd, &tier, &h);
    if (!st) st = raw_load_launch(fd, &task, &l, &rep);
    for (uint32_t i = 0; !st && i < BLOCKS; i++) {
        kvt__srv_layer_sums(tier + kvt__srv_get64(l.offsets + 8 * i), g, h.block_tokens, mine);
        for (uint32_t k = 0; k < LAYERS; k++)
            if (mine[k] != kvt__srv_get64(l.sums + 8 * ((size_t)i * LAYERS + k)))
                st = kvt__fail(KVT_ECORRUPT, "block %u layer %u: recorded checksum unlike "
                               "the tier's bytes", i, k);
    }
    if (!st) {
        uint8_t *last = tier + kvt__srv_get64(l.offsets + 8 * (BLOCKS - 1));
        last[kvt__geo_block_offset(g, h.block_tokens, 2, 0) + 1] ^= 0x5a;
        st = raw_end(fd, task, KVT_OK);
    }
    free(rep);
    kvt_match m = {0};
    if (!st) st = kvt_client_lookup(e->cl, &r, &m);
    if (!st && (m.matched_tokens != BLOCKS * TPP || !m.task))
        st = kvt__fail(KVT_ENOTFOUND, "the stored prefix matched %u", m.matched_tokens);
    if (!st) st = kvt_emu_poison(e->emu, e->pages, PAGES);
    if (!st) st = kvt_client_launch(e->cl, m.task, e->pages, PAGES);
    kvt_status w2 = st ? st : kvt_client_wait_layer(e->cl, m.task, 2, TIMEOUT_MS);
    kvt_task_result res = {0};
    if (!st) st = kvt_client_wait(e->cl, m.task, TIMEOUT_MS, &res);
    if (!st && (w2 != KVT_ECORRUPT || res.status != KVT_ECORRUPT))
        st = kvt__fail(KVT_EPROTO, "the scribbled load: layer 2 %s, result %s",
                       kvt_status_name(w2), kvt_status_name(res.status));
    kvt_cache_stats cs = {0};
    if (!st) st = kvt_client_stats(e->cl, &cs);
    if (!st && cs.corrupt_blocks != 1)
        st = kvt__fail(KVT_EPROTO, "corrupt_blocks %llu after one changed block",
                       (unsigned long long)cs.corrupt_blocks);
    if (!st) st = engine_load(e, &r, &matched);
    if (!st && matched != (BLOCKS - 1) * TPP)
        st = kvt__fail(KVT_EPROTO, "after the failed load %u tokens match", matched);
    if (!st) st = engine_store(e, &r, &stored);
    if (!st && stored != TPP) st = kvt__fail(KVT_EPROTO, "the re-store stored %u", stored);
    if (!st) st = engine_load(e, &r, &matched);
    if (!st && matched != BLOCKS * TPP) st = kvt__fail(KVT_EPROTO, "then %u match", matched);
    if (fd >= 0) close(fd);
    return st;
}

static kvt_status child_scribbled_block(const char *path, void *arg)
{
    (void)arg;
    kvt_geometry *g = geo_heads(2);
    engine e;
    kvt_status st = engine_open(&e, path, 2);
    if (!st) st = scribbled_block(path, &e, g);
    engine_close(&e);
    kvt_geometry_destroy(g);
    return st;
}

static void test_scribbled_block_never_served(void **state)
{
    (void)state;
    child_against_server("v.sock", child_scribbled_block, NULL);
}

static kvt_status child_raw_store(const char *path, void *arg)
{
    raw_arg *a = arg;
    kvt_geometry *g = geo_heads(2);
    int fd = -1;
    uint8_t *tier = NULL, *p = NULL;
    kvt_srv_hello_rep h;
    kvt_srv_launch_rep l;
    kvt_srv_buf b = {0};
    uint32_t len = 0;
    uint64_t task = 0;
    kvt_status st = raw_attach(path, g, &fd, &tier, &h);
    if (!st) st = raw_plan_launch(fd, a->load ? KVT_SRV_LOOKUP : KVT_SRV_PREPARE, &task, &l, &p);
    if (st) return st;
    for (uint32_t i = 0; i < l.num_blocks / 2 && !a->load; i++)
        memset(tier + kvt__srv_get64(l.offsets + 8 * i), 0xab, h.block_bytes);
    if (a->lie) {
        uint64_t sums[BLOCKS * LAYERS] = {0};
        kvt__srv_end_encode(&b, task, KVT_OK, sums, l.num_blocks, LAYERS);
        free(p);
        uint8_t *q = NULL;
        st = raw_rt(fd, KVT_SRV_END, &b, &q, &len, NULL);
        kvt__srv_buf_free(&b);
        kvt_task_result res = {0};
        if (!st) st = kvt__srv_result_decode(q, len, &res);
        free(q);
        if (st) return st;
        /* END commits with the checksums the client sent (docs/server.md,
         * Integrity): the loads check them (check_lie_never_served). */
        if (res.status != KVT_OK)
            return kvt__fail(KVT_EPROTO, "END's result is %s", kvt_status_name(res.status));
        kvt_cache_stats cs;
        if ((st = raw_stats(fd, &cs))) return st;
        return cs.failed_tasks == 0 && cs.tasks_in_flight == 0
                   ? KVT_OK
                   : kvt__fail(KVT_EPROTO, "after END: %llu failed tasks, %llu in flight",
                               (unsigned long long)cs.failed_tasks,
                               (unsigned long long)cs.tasks_in_flight);
    }
    char c = 1;
    if (write(a->ready, &c, 1) != 1) return KVT_ESYS;
    for (;;) pause(); /* killed here, mid-store */
}

/* Until the server's stats satisfy ok (10 s at most, failing then): what a
 * server thread does after a client's close is seen from outside this way. */
static void stats_until(engine *e, bool (*ok)(const kvt_cache_stats *, uint64_t), uint64_t arg)
{
    kvt_cache_stats cs = {0};
    for (int i = 0; i < 1000; i++) {
        assert_ok(kvt_client_stats(e->cl, &cs));
        if (ok(&cs, arg)) return;
        struct timespec ts = {0, 10 * 1000000L};
        nanosleep(&ts, NULL);
    }
    fail_msg("stats never reached the state: %llu tasks in flight, %llu CPU blocks used",
             (unsigned long long)cs.tasks_in_flight, (unsigned long long)cs.cpu_blocks_used);
}

static bool no_tasks(const kvt_cache_stats *s, uint64_t arg)
{
    (void)arg;
    return s->tasks_in_flight == 0;
}

static void check_no_visible_then_store(const char *path)
{
    engine e;
    assert_ok(engine_open(&e, path, 2));
    uint32_t tokens[NTOK], matched = 99, stored = 0;
    kvt_request r;
    request(&r, tokens, 99);
    /* The dead client's plan is gone once the server's thread took the
     * close: at once on a quiet host, later under TSan on a loaded one (a
     * fixed 50 ms wait raced it). */
    stats_until(&e, no_tasks, 0);
    assert_ok(engine_load(&e, &r, &matched));
    assert_int_equal(matched, 0); /* nothing of the half-written store is visible */
    assert_ok(engine_store(&e, &r, &stored));
    assert_int_equal(stored, BLOCKS * TPP);
    assert_ok(engine_load(&e, &r, &matched));
    assert_int_equal(matched, BLOCKS * TPP);
    engine_close(&e);
}

static void test_sigkill_mid_store(void **state)
{
    (void)state;
    make_dir();
    char path[300];
    sock_path(path, sizeof path, "k.sock");
    pid_t srv = start_server(path, NULL);
    int ready[2];
    assert_int_equal(pipe(ready), 0);
    raw_arg a = {ready[1], false, false};
    pid_t kid = spawn(child_raw_store, path, &a);
    close(ready[1]); /* a child that fails closes the pipe: read gives 0 */
    char c;
    assert_int_equal(read(ready[0], &c, 1), 1);
    kill(kid, SIGKILL);
    assert_int_equal(reap(kid, 5000), -SIGKILL);
    close(ready[0]);
    pid_t chk = kvt_test_fork(); /* it waits for the server to drop the dead client */
    if (chk == 0) {
        check_no_visible_then_store(path);
        _exit(0);
    }
    assert_int_equal(reap(chk, 20000), 0);
    stop_server(srv, path);
}

/* A client SIGKILLed mid-load loses its pins at once: the server ends its
 * task (nothing in flight), and the prefix still loads, byte for byte. */
static void test_sigkill_mid_load(void **state)
{
    (void)state;
    make_dir();
    char path[300];
    sock_path(path, sizeof path, "l.sock");
    pid_t srv = start_server(path, NULL);
    uint64_t seed = 99;
    assert_int_equal(reap(spawn(child_store, path, &seed), 20000), 0);
    int ready[2];
    assert_int_equal(pipe(ready), 0);
    raw_arg a = {ready[1], false, true};
    pid_t kid = spawn(child_raw_store, path, &a);
    close(ready[1]); /* a child that fails closes the pipe: read gives 0 */
    char c;
    assert_int_equal(read(ready[0], &c, 1), 1);
    kill(kid, SIGKILL);
    assert_int_equal(reap(kid, 5000), -SIGKILL);
    close(ready[0]);
    assert_int_equal(reap(spawn(child_load, path, &seed), 20000), 0);
    engine e;
    assert_ok(engine_open(&e, path, 2));
    stats_until(&e, no_tasks, 0); /* the server took the dead client's close */
    kvt_cache_stats cs;
    assert_ok(kvt_client_stats(e.cl, &cs));
    assert_int_equal(cs.cancelled_tasks, 1); /* the dead client's load */
    engine_close(&e);
    stop_server(srv, path);
}

/* After a store whose client claimed checksums its blocks do not have
 * (half of them written, every checksum 0): the prefix is found, but its
 * load fails with KVT_ECORRUPT and reports no layer landed; the server
 * drops the chain, and a store then puts the prefix back, byte for byte. */
static void check_lie_never_served(const char *path)
{
    engine e;
    assert_ok(engine_open(&e, path, 2));
    uint32_t tokens[NTOK], matched = 99, stored = 0;
    kvt_request r;
    request(&r, tokens, 99);
    kvt_match m;
    assert_ok(kvt_client_lookup(e.cl, &r, &m));
    assert_int_equal(m.matched_tokens, BLOCKS * TPP);
    assert_ok(kvt_emu_poison(e.emu, e.pages, PAGES));
    assert_ok(kvt_client_launch(e.cl, m.task, e.pages, PAGES));
    assert_status(kvt_client_wait_layer(e.cl, m.task, 0, TIMEOUT_MS), KVT_ECORRUPT);
    kvt_task_result res;
    assert_ok(kvt_client_wait(e.cl, m.task, TIMEOUT_MS, &res));
    assert_int_equal(res.status, KVT_ECORRUPT);
    assert_ok(engine_load(&e, &r, &matched));
    assert_int_equal(matched, 0);
    assert_ok(engine_store(&e, &r, &stored));
    assert_int_equal(stored, BLOCKS * TPP);
    assert_ok(engine_load(&e, &r, &matched));
    assert_int_equal(matched, BLOCKS * TPP);
    engine_close(&e);
}

static void test_bad_checksum_never_served(void **state)
{
    (void)state;
    make_dir();
    char path[300];
    sock_path(path, sizeof path, "c.sock");
    pid_t srv = start_server(path, NULL);
    raw_arg a = {-1, true, false};
    assert_int_equal(reap(spawn(child_raw_store, path, &a), 20000), 0);
    pid_t chk = kvt_test_fork();
    if (chk == 0) {
        check_lie_never_served(path);
        _exit(0);
    }
    assert_int_equal(reap(chk, 20000), 0);
    stop_server(srv, path);
}

/* The server dies (SIGKILL) or hangs (SIGSTOP): client calls return
 * KVT_ECONN naming the socket within their deadline. Each wall-clock bound
 * is set against what the bug would take, not against a tight fixed time:
 * a dead server is timed on a client whose deadline is DEAD_TIMEOUT_MS
 * (waiting on the dead socket costs that much, a legitimate call nothing);
 * a hung one on a client whose deadline is HUNG_TIMEOUT_MS (the call takes
 * one deadline; a second one, a retry, is the bug). */
#define DEAD_TIMEOUT_MS 20000
#define DEAD_BOUND_MS 8000ull
#define HUNG_TIMEOUT_MS 5000
static void test_server_killed_econn(void **state)
{
    (void)state;
    make_dir();
    char path[300], path2[300];
    sock_path(path, sizeof path, "x.sock");
    sock_path(path2, sizeof path2, "y.sock");
    pid_t srv = start_server(path, NULL);
    pid_t srv2 = start_server(path2, NULL);
    engine e, e2;
    assert_ok(engine_open_t(&e, path, 2, DEAD_TIMEOUT_MS));
    uint32_t tokens[NTOK], stored = 0, matched = 0;
    kvt_request r;
    request(&r, tokens, 5);
    assert_ok(engine_store(&e, &r, &stored));
    kvt_test_server_forget(srv);
    kill(srv, SIGKILL);
    assert_int_equal(reap(srv, 5000), -SIGKILL);
    uint64_t t0 = kvt__now_ns();
    assert_status(engine_load(&e, &r, &matched), KVT_ECONN);
    assert_non_null(strstr(kvt_last_error(), path));
    assert_status(engine_load(&e, &r, &matched), KVT_ECONN); /* and stays so */
    /* The kernel closed the dead server's sockets: EOF, then one refused
     * re-attach, at once. A call that waits on the dead server instead
     * takes its deadline (20 s) or more; 8 s is far from both (it was one
     * 3 s deadline for the two calls, all of it a loaded machine's). */
    uint64_t dead_ms = (kvt__now_ns() - t0) / 1000000;
    if (dead_ms >= DEAD_BOUND_MS)
        fail_msg("two calls on a killed server took %llu ms (deadline %d ms): one waited on it",
                 (unsigned long long)dead_ms, DEAD_TIMEOUT_MS);
    engine_close(&e);

    /* A hung server: the call's deadline, then KVT_ECONN. */
    assert_ok(engine_open_t(&e2, path2, 2, HUNG_TIMEOUT_MS));
    kill(srv2, SIGSTOP);
    int ws = 0; /* SIGSTOP lands asynchronously: wait until it is stopped */
    assert_int_equal(waitpid(srv2, &ws, WUNTRACED), srv2);
    assert_true(WIFSTOPPED(ws));
    t0 = kvt__now_ns();
    assert_status(engine_load(&e2, &r, &matched), KVT_ECONN);
    uint64_t el = (kvt__now_ns() - t0) / 1000000;
    /* One deadline: not sooner, and less than two, which is what a call
     * that retries (re-attaching to the stopped server, whose listen queue
     * accepts it) would take. That leaves a loaded machine 4.9 s past the
     * deadline to notice it (the bound was T + 2 s on T = 3 s). */
    if (el < HUNG_TIMEOUT_MS - 50 || el >= 2 * HUNG_TIMEOUT_MS - 100)
        fail_msg("a call on a hung server took %llu ms (its deadline: %d ms)", (unsigned long long)el,
                 HUNG_TIMEOUT_MS);
    assert_non_null(strstr(kvt_last_error(), path2));
    kvt_test_server_forget(srv2);
    kill(srv2, SIGKILL);
    kill(srv2, SIGCONT);
    reap(srv2, 5000);
    engine_close(&e2);
    /* No server at all: attach gives KVT_ECONN naming the socket in time. */
    kvt_client *cl = NULL;
    kvt_geometry *g = geo_heads(2);
    t0 = kvt__now_ns();
    assert_status(kvt_client_attach(&cl, path, g, 300), KVT_ECONN);
    /* Retried every 10 ms until its 300 ms deadline; a retry loop that
     * misses its deadline never ends. 5 s (was 2 s) fails that and leaves
     * a loaded machine seconds for a 300 ms loop. */
    uint64_t attach_ms = (kvt__now_ns() - t0) / 1000000;
    if (attach_ms >= 5000)
        fail_msg("attach with a 300 ms deadline to no server took %llu ms", (unsigned long long)attach_ms);
    assert_non_null(strstr(kvt_last_error(), path));
    kvt_geometry_destroy(g);
}

/* A server stopped with SIGTERM flushes its SSD writes; a new server on the
 * same SSD directory comes back warm and serves the prefix, byte for byte. */
static void test_restart_warm_from_ssd(void **state)
{
    (void)state;
    make_dir();
    char path[300], ssd[300];
    sock_path(path, sizeof path, "w.sock");
    sock_path(ssd, sizeof ssd, "ssd");
    pid_t srv = start_server(path, ssd);
    uint64_t seed = 23;
    assert_int_equal(reap(spawn(child_store, path, &seed), 20000), 0);
    pid_t fl = kvt_test_fork();
    if (fl == 0) { /* a client can wait for durability too */
        engine e;
        kvt_cache_stats cs;
        if (engine_open(&e, path, 2) || kvt_client_flush(e.cl, 10000) ||
            kvt_client_stats(e.cl, &cs) || cs.ssd_written_blocks != BLOCKS)
            _exit(1);
        engine_close(&e);
        _exit(0);
    }
    assert_int_equal(reap(fl, 20000), 0);
    stop_server(srv, path);
    srv = start_server(path, ssd);
    assert_int_equal(reap(spawn(child_load, path, &seed), 20000), 0);
    engine e;
    assert_ok(engine_open(&e, path, 2));
    kvt_cache_stats cs;
    assert_ok(kvt_client_stats(e.cl, &cs));
    assert_int_equal(cs.recovered_blocks, BLOCKS);
    assert_int_equal(cs.ssd_hit_tokens, BLOCKS * TPP); /* read back through the server */
    engine_close(&e);
    stop_server(srv, path);
}

/* Flips one byte of block `block`'s first layer in dir/kvtier.data, found
 * by its bytes (the engine's layer 0 K page that block was stored from). */
static void spoil_ssd_block(const char *dir, engine *e, uint32_t block)
{
    kvt_engine_memory mem;
    assert_ok(kvt_emu_memory(e->emu, &mem));
    const uint64_t page_bytes = mem.buffer_bytes[0] / PAGES;
    const uint8_t *needle = (const uint8_t *)mem.layer_bases[0] + e->pages[block] * page_bytes;
    char file[400];
    snprintf(file, sizeof file, "%s/kvtier.data", dir);
    FILE *f = fopen(file, "r+b");
    assert_non_null(f);
    assert_int_equal(fseek(f, 0, SEEK_END), 0);
    long size = ftell(f);
    assert_true(size > 0);
    uint8_t *data = malloc((size_t)size);
    assert_non_null(data);
    rewind(f);
    assert_int_equal(fread(data, 1, (size_t)size, f), (size_t)size);
    long at = -1;
    for (long i = 0; i + 64 <= size; i++)
        if (memcmp(data + i, needle, 64) == 0) {
            assert_true(at < 0); /* found once */
            at = i;
        }
    assert_true(at >= 0);
    assert_int_equal(fseek(f, at + 5, SEEK_SET), 0);
    assert_int_equal(fputc(data[at + 5] ^ 0xff, f), data[at + 5] ^ 0xff);
    fclose(f);
    free(data);
}

/* Stores a request, spoils its SSD copy of block `bad`, restarts the
 * server from SSD and launches a load of the request into poisoned pages;
 * returns the server's pid. */
static pid_t launch_with_bad_ssd_block(const char *path, const char *ssd, engine *e, kvt_request *r,
                                       uint32_t *tokens, uint32_t bad, kvt_match *m)
{
    make_dir();
    pid_t srv = start_server(path, ssd);
    assert_ok(engine_open(e, path, 2));
    uint32_t n = 0;
    request(r, tokens, 29);
    assert_ok(engine_store(e, r, &n));
    assert_int_equal(n, BLOCKS * TPP);
    assert_ok(kvt_client_flush(e->cl, 10000));
    stop_server(srv, path);
    spoil_ssd_block(ssd, e, bad);
    engine_close(e);
    srv = start_server(path, ssd);
    assert_ok(engine_open(e, path, 2));
    assert_ok(kvt_client_lookup(e->cl, r, m));
    assert_int_equal(m->matched_tokens, BLOCKS * TPP);
    assert_ok(kvt_emu_poison(e->emu, e->pages, PAGES));
    assert_ok(kvt_client_launch(e->cl, m->task, e->pages, PAGES));
    return srv;
}

/* A load through a server whose SSD copy of block 3 went bad is cut short
 * there, and its result says so as an in-process load's does: KVT_ECORRUPT,
 * the 3 blocks that landed (byte for byte), nothing written past them.
 * (The client reports a load when its copy ends, before the server answers
 * its END: the result is built from what LAUNCH said.) */
static void test_load_cut_by_corrupt_ssd_block(void **state)
{
    (void)state;
    char path[300], ssd[300];
    sock_path(path, sizeof path, "cc.sock");
    sock_path(ssd, sizeof ssd, "ssd");
    engine e;
    uint32_t tokens[NTOK];
    kvt_request r;
    kvt_match m;
    pid_t srv = launch_with_bad_ssd_block(path, ssd, &e, &r, tokens, 3, &m);
    /* Every layer wait says why and what to recompute, while the copy of
     * blocks 0-2 runs and after it (as kvt_cache_wait_layer does); before,
     * the first said OK and the second gave no advice. */
    char advice[96];
    snprintf(advice, sizeof advice, "only tokens [0, %u) will land; recompute the rest", 3 * TPP);
    for (uint32_t layer = 0; layer < 2; layer++) {
        assert_status(kvt_client_wait_layer(e.cl, m.task, layer, TIMEOUT_MS), KVT_ECORRUPT);
        if (!strstr(kvt_last_error(), advice)) fail_msg("layer %u: %s", layer, kvt_last_error());
    }
    kvt_task_result res;
    assert_ok(kvt_client_wait(e.cl, m.task, TIMEOUT_MS, &res));
    assert_int_equal(res.status, KVT_ECORRUPT);
    assert_int_equal(res.kind, KVT_TASK_LOAD);
    assert_int_equal(res.first_token, 0);
    assert_int_equal(res.num_tokens, 3 * TPP);
    kvt_cache_stats cs;
    assert_ok(kvt_client_stats(e.cl, &cs));
    assert_int_equal(res.bytes, 3 * cs.block_bytes);
    assert_int_equal(cs.tasks_in_flight, 0); /* its END reached the server */
    kvt_verify_result v;
    assert_ok(kvt_emu_verify(e.emu, &r, 0, 3 * TPP, e.pages, PAGES, &v));
    assert_int_equal(v.mismatches, 0);
    assert_true(v.bytes_checked > 0);
    assert_ok(kvt_emu_verify(e.emu, &r, 3 * TPP, 4 * TPP, e.pages, PAGES, &v));
    assert_true(v.mismatches > 0); /* block 3's pages still hold the poison */
    engine_close(&e);
    stop_server(srv, path);
}

/* Block 0's SSD copy bad: the load ends before a copy, and the pending
 * launch's poll carries the read's KVT_ECORRUPT (a task's result, in a
 * LAUNCH reply), which the client takes as the load's result (regression:
 * c2d5f3e's answers.h did not list a task's results for LAUNCH, so the
 * client called it a protocol error, KVT_EPROTO). Nothing is written. */
static void test_load_of_corrupt_first_ssd_block(void **state)
{
    (void)state;
    char path[300], ssd[300];
    sock_path(path, sizeof path, "c0.sock");
    sock_path(ssd, sizeof ssd, "ssd0");
    engine e;
    uint32_t tokens[NTOK];
    kvt_request r;
    kvt_match m;
    pid_t srv = launch_with_bad_ssd_block(path, ssd, &e, &r, tokens, 0, &m);
    kvt_task_result res;
    assert_ok(kvt_client_wait(e.cl, m.task, TIMEOUT_MS, &res));
    if (res.status != KVT_ECORRUPT) fail_msg("load ended %s, want KVT_ECORRUPT", kvt_status_name(res.status));
    assert_int_equal(res.num_tokens, 0);
    kvt_verify_result v;
    assert_ok(kvt_emu_verify(e.emu, &r, 0, TPP, e.pages, PAGES, &v));
    assert_true(v.mismatches > 0); /* block 0's pages still hold the poison */
    engine_close(&e);
    stop_server(srv, path);
}

/* Waits (bounded) until the server's SSD has a read held; true if so. */
static bool read_held(kvt_ssd *ssd)
{
    for (int i = 0; i < 5000 && kvt__ssd_reads_held(ssd) == 0; i++) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    return kvt__ssd_reads_held(ssd) > 0;
}

static void *run_server(void *arg)
{
    kvt_server_run(arg);
    return NULL;
}

/* A load whose blocks are on SSD only (a restarted server) does not block
 * its launch: with the server's SSD reads held, launch returns, the
 * client's other calls still answer, wait and wait_layer time out by their
 * deadline; released, the load completes and every byte is verified. A
 * pending load cancelled ends KVT_ECANCELED and releases its blocks. */
static void test_ssd_load_launch_async(void **state)
{
    (void)state;
    make_dir();
    char path[300], ssd[300];
    sock_path(path, sizeof path, "a.sock");
    sock_path(ssd, sizeof ssd, "ssd");
    pid_t srv = start_server(path, ssd);
    uint64_t seeds[2] = {31, 32};
    for (int i = 0; i < 2; i++) assert_int_equal(reap(spawn(child_store, path, &seeds[i]), 20000), 0);
    stop_server(srv, path); /* SIGTERM flushes the SSD writes */

    kvt_server *s = NULL;
    assert_ok(make_server(&s, path, ssd));
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, run_server, s), 0);
    engine e;
    assert_ok(engine_open(&e, path, 2));
    uint32_t tokens[NTOK];
    kvt_request r;
    request(&r, tokens, 31);
    kvt_match m;
    assert_ok(kvt_client_lookup(e.cl, &r, &m));
    assert_int_equal(m.matched_tokens, BLOCKS * TPP); /* recovered: on SSD only */
    assert_ok(kvt_emu_poison(e.emu, e.pages, PAGES));
    kvt__ssd_hold_reads(kvt__srv_shard_first(s)->cache->ssd, true);
    assert_ok(kvt_client_launch(e.cl, m.task, e.pages, PAGES));
    assert_true(read_held(kvt__srv_shard_first(s)->cache->ssd)); /* launch returned before the reads ended */
    kvt_cache_stats cs;
    assert_ok(kvt_client_stats(e.cl, &cs)); /* the control path is not blocked */
    assert_int_equal(cs.tasks_in_flight, 1);
    kvt_task_result res;
    assert_status(kvt_client_wait(e.cl, m.task, 0, &res), KVT_ETIMEDOUT);
    assert_status(kvt_client_wait_layer(e.cl, m.task, 0, 20), KVT_ETIMEDOUT);
    uint32_t n = 9;
    assert_ok(kvt_client_poll(e.cl, &res, 1, &n));
    assert_int_equal(n, 0);
    kvt__ssd_hold_reads(kvt__srv_shard_first(s)->cache->ssd, false);
    assert_ok(kvt_client_wait_layer(e.cl, m.task, LAYERS - 1, TIMEOUT_MS));
    assert_ok(kvt_client_wait(e.cl, m.task, TIMEOUT_MS, &res));
    assert_ok(res.status);
    assert_int_equal(res.num_tokens, BLOCKS * TPP);
    kvt_verify_result v;
    assert_ok(kvt_emu_verify(e.emu, &r, 0, BLOCKS * TPP, e.pages, PAGES, &v));
    assert_int_equal(v.mismatches, 0);
    assert_true(v.bytes_checked > 0);

    /* Cancelled while pending: KVT_ECANCELED once the reads end, no pins left. */
    request(&r, tokens, 32);
    assert_ok(kvt_client_lookup(e.cl, &r, &m));
    assert_int_equal(m.matched_tokens, BLOCKS * TPP);
    kvt__ssd_hold_reads(kvt__srv_shard_first(s)->cache->ssd, true);
    assert_ok(kvt_client_launch(e.cl, m.task, e.pages, PAGES));
    assert_true(read_held(kvt__srv_shard_first(s)->cache->ssd));
    assert_ok(kvt_client_cancel(e.cl, m.task));
    kvt__ssd_hold_reads(kvt__srv_shard_first(s)->cache->ssd, false);
    assert_ok(kvt_client_wait(e.cl, m.task, TIMEOUT_MS, &res));
    assert_int_equal(res.status, KVT_ECANCELED);
    assert_ok(kvt_client_stats(e.cl, &cs));
    assert_int_equal(cs.tasks_in_flight, 0);
    uint32_t matched = 0;
    assert_ok(engine_load(&e, &r, &matched)); /* and it still loads, byte for byte */
    assert_int_equal(matched, BLOCKS * TPP);
    engine_close(&e);
    kvt_server_stop(s);
    pthread_join(th, NULL);
    kvt_server_destroy(s);
}

/* This process's threads: their ids into ids (at most max); how many. */
static uint32_t thread_ids(long *ids, uint32_t max)
{
    DIR *d = opendir("/proc/self/task");
    assert_non_null(d);
    uint32_t n = 0;
    for (struct dirent *de; (de = readdir(d)) && n < max;)
        if (de->d_name[0] != '.') ids[n++] = atol(de->d_name);
    closedir(d);
    return n;
}

/* Threads named "kvt-xfer..." (a transfer engine's copy threads) that are
 * not among old[0..n_old). */
static uint32_t new_copy_threads(const long *old, uint32_t n_old)
{
    long ids[256];
    uint32_t n = thread_ids(ids, 256), found = 0;
    for (uint32_t i = 0; i < n; i++) {
        bool seen = false;
        for (uint32_t j = 0; j < n_old && !seen; j++) seen = ids[i] == old[j];
        char path[64], name[32] = {0};
        snprintf(path, sizeof path, "/proc/self/task/%ld/comm", ids[i]);
        FILE *f = seen ? NULL : fopen(path, "r");
        if (!f) continue; /* seen before, or just ended */
        found += fgets(name, sizeof name, f) && strncmp(name, "kvt-xfer", 8) == 0;
        fclose(f);
    }
    return found;
}

/* server_read_ms bounds a load whose SSD reads never end: the client
 * (KVTIER_SERVER_READ_MS) ends the pending load KVT_ETIMEDOUT after it, and
 * the server (server_read_ms) answers the CANCEL that follows within it
 * too, so the connection stays good. The default 30 s would outlast the
 * 5 s wait below. */
static void test_read_bound_option(void **state)
{
    (void)state;
    make_dir();
    char path[300], ssd[300];
    sock_path(path, sizeof path, "b.sock");
    sock_path(ssd, sizeof ssd, "ssd");
    pid_t srv = start_server(path, ssd);
    uint64_t seed = 33;
    assert_int_equal(reap(spawn(child_store, path, &seed), 20000), 0);
    stop_server(srv, path); /* SIGTERM flushes the SSD writes */
    /* and a server that never polls (server_spin_us 0) */
    static const char *const opts[] = {"server_read_ms", "300", "server_spin_us", "0", NULL};
    g_opts = opts;
    kvt_server *s = NULL;
    assert_ok(make_server(&s, path, ssd));
    g_opts = NULL;
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, run_server, s), 0);
    engine e;
    assert_int_equal(setenv("KVTIER_SERVER_READ_MS", "nope", 1), 0);
    assert_status(engine_open(&e, path, 2), KVT_EINVAL); /* parsed by the option table */
    assert_non_null(strstr(kvt_last_error(), "KVTIER_SERVER_READ_MS"));
    engine_close(&e);
    assert_int_equal(setenv("KVTIER_SERVER_READ_MS", "300", 1), 0);
    assert_int_equal(setenv("KVTIER_SERVER_SPIN_US", "1001", 1), 0);
    assert_status(engine_open(&e, path, 2), KVT_EINVAL);
    assert_non_null(strstr(kvt_last_error(), "kvt_client_attach: KVTIER_SERVER_SPIN_US: "));
    assert_non_null(strstr(kvt_last_error(), "out of range (must be 0..1000)"));
    engine_close(&e);
    assert_int_equal(setenv("KVTIER_SERVER_SPIN_US", "0", 1), 0); /* a client that never polls */
    /* The client's copy threads: the workers option, from KVTIER_WORKERS. */
    assert_int_equal(setenv("KVTIER_WORKERS", "0", 1), 0);
    kvt_status refused = engine_open(&e, path, 2);
    unsetenv("KVTIER_WORKERS"); /* before an assert can fail: later tests attach */
    assert_status(refused, KVT_EINVAL);
    assert_non_null(strstr(kvt_last_error(), "kvt_client_attach: KVTIER_WORKERS: "));
    engine_close(&e);
    assert_int_equal(setenv("KVTIER_WORKERS", "3", 1), 0);
    long old[256];
    uint32_t n_old = thread_ids(old, 256);
    kvt_status opened = engine_open(&e, path, 2);
    unsetenv("KVTIER_WORKERS");
    assert_ok(opened);
    /* (each names itself when it starts: give them 2 s) */
    for (int i = 0; i < 2000 && new_copy_threads(old, n_old) < 3; i++) usleep(1000);
    assert_int_equal(new_copy_threads(old, n_old), 3);
    engine_close(&e);
    assert_ok(engine_open(&e, path, 2));
    unsetenv("KVTIER_SERVER_READ_MS");
    unsetenv("KVTIER_SERVER_SPIN_US");
    uint32_t tokens[NTOK];
    kvt_request r;
    request(&r, tokens, 33);
    kvt_match m;
    assert_ok(kvt_client_lookup(e.cl, &r, &m));
    assert_int_equal(m.matched_tokens, BLOCKS * TPP); /* on SSD only */
    kvt__ssd_hold_reads(kvt__srv_shard_first(s)->cache->ssd, true);
    assert_ok(kvt_client_launch(e.cl, m.task, e.pages, PAGES));
    assert_true(read_held(kvt__srv_shard_first(s)->cache->ssd));
    kvt_task_result res;
    uint64_t t0 = kvt__now_ns();
    assert_ok(kvt_client_wait(e.cl, m.task, 5000, &res));
    assert_int_equal(res.status, KVT_ETIMEDOUT);
    assert_true(kvt__now_ns() - t0 < 4000000000ull);
    kvt_cache_stats cs;
    assert_ok(kvt_client_stats(e.cl, &cs)); /* the connection survived the CANCEL */
    kvt__ssd_hold_reads(kvt__srv_shard_first(s)->cache->ssd, false);
    uint32_t matched = 0;
    assert_ok(engine_load(&e, &r, &matched)); /* released, it loads byte for byte */
    assert_int_equal(matched, BLOCKS * TPP);
    engine_close(&e);
    kvt_server_stop(s);
    pthread_join(th, NULL);
    kvt_server_destroy(s);
}

/* The LAUNCH reply's flags: PENDING carries no offsets; a pending reply
 * with offsets, or an unknown flag, is refused (a client never trusts a
 * server's reply). */
static void test_launch_reply_flags(void **state)
{
    (void)state;
    kvt_srv_buf b = {0};
    kvt_srv_launch_rep r = {KVT_TASK_LOAD, 0, 0, 0, KVT_OK, KVT_SRV_LAUNCH_PENDING, NULL, 0,
                            NULL};
    kvt__srv_launch_rep_encode(&b, &r, NULL, NULL);
    kvt_srv_launch_rep got;
    assert_ok(kvt__srv_launch_rep_decode(b.p, b.len, &got));
    assert_int_equal(got.flags, KVT_SRV_LAUNCH_PENDING);
    assert_int_equal(got.num_blocks, 0);
    kvt__srv_buf_free(&b);
    uint64_t off[1] = {0}, sums[2] = {1, 2};
    kvt_srv_launch_rep bad = {KVT_TASK_LOAD, 0, 16, 1, KVT_OK, KVT_SRV_LAUNCH_PENDING, NULL, 2,
                              NULL};
    kvt__srv_launch_rep_encode(&b, &bad, off, sums);
    assert_status(kvt__srv_launch_rep_decode(b.p, b.len, &got), KVT_EPROTO);
    assert_non_null(strstr(kvt_last_error(), "pending"));
    kvt__srv_buf_free(&b);
    bad.flags = 2;
    kvt__srv_launch_rep_encode(&b, &bad, off, sums);
    assert_status(kvt__srv_launch_rep_decode(b.p, b.len, &got), KVT_EPROTO);
    assert_non_null(strstr(kvt_last_error(), "flags"));
    kvt__srv_buf_free(&b);
    /* A load's reply carries every block's layer checksums; one without
     * them, or a store's with them, is refused. */
    bad.flags = 0;
    kvt__srv_launch_rep_encode(&b, &bad, off, sums);
    assert_ok(kvt__srv_launch_rep_decode(b.p, b.len, &got));
    assert_int_equal(got.num_layers, 2);
    assert_int_equal(kvt__srv_get64(got.sums + 8), 2);
    kvt__srv_buf_free(&b);
    bad.num_layers = 0;
    kvt__srv_launch_rep_encode(&b, &bad, off, NULL);
    assert_status(kvt__srv_launch_rep_decode(b.p, b.len, &got), KVT_EPROTO);
    assert_non_null(strstr(kvt_last_error(), "without their checksums"));
    kvt__srv_buf_free(&b);
    bad.kind = KVT_TASK_STORE;
    bad.num_layers = 2;
    kvt__srv_launch_rep_encode(&b, &bad, off, sums);
    assert_status(kvt__srv_launch_rep_decode(b.p, b.len, &got), KVT_EPROTO);
    assert_non_null(strstr(kvt_last_error(), "a store with 2 layer checksums"));
    kvt__srv_buf_free(&b);
}

/* A client that plans and never launches: its plans expire after
 * plan_ttl_ms (launch then gives KVT_ETIMEDOUT), and it holds at most
 * server_client_tasks of them (KVT_EFULL) until they expire. */
static void test_plans_expire_and_quota(void **state)
{
    (void)state;
    make_dir();
    char path[300];
    sock_path(path, sizeof path, "q.sock");
    static const char *const opts[] = {"plan_ttl_ms", "200", "server_client_tasks", "2", NULL};
    g_opts = opts;
    pid_t srv = start_server(path, NULL);
    g_opts = NULL;
    uint64_t seed = 31;
    assert_int_equal(reap(spawn(child_store, path, &seed), 20000), 0);
    engine e;
    assert_ok(engine_open(&e, path, 2));
    uint32_t tokens[NTOK];
    kvt_request r;
    request(&r, tokens, seed);
    kvt_match m1, m2, m3;
    assert_ok(kvt_client_lookup(e.cl, &r, &m1));
    assert_ok(kvt_client_lookup(e.cl, &r, &m2));
    assert_int_equal(m2.matched_tokens, BLOCKS * TPP);
    assert_status(kvt_client_lookup(e.cl, &r, &m3), KVT_EFULL);
    struct timespec ts = {0, 300 * 1000000L};
    nanosleep(&ts, NULL);
    assert_status(kvt_client_launch(e.cl, m1.task, e.pages, PAGES), KVT_ETIMEDOUT);
    assert_ok(kvt_client_lookup(e.cl, &r, &m3)); /* m2 was swept at the quota */
    assert_ok(kvt_client_cancel(e.cl, m3.task));
    kvt_task_result res;
    assert_ok(kvt_client_wait(e.cl, m3.task, 0, &res));
    assert_int_equal(res.status, KVT_ECANCELED);
    kvt_cache_stats cs;
    assert_ok(kvt_client_stats(e.cl, &cs));
    assert_int_equal(cs.tasks_in_flight, 0);
    engine_close(&e);
    stop_server(srv, path);
}

/* kvt_client_peek pins nothing and makes no task: with room for 12 blocks,
 * a peeked 8-block prefix A still gives 4 blocks to another client's store
 * of B (had the peek pinned A, B could store only 4 and the store fails);
 * peeks count no lookup and pass the task quota a lookup is refused at. */
static void test_peek_pins_nothing(void **state)
{
    (void)state;
    make_dir();
    char path[300], cap[32];
    sock_path(path, sizeof path, "pk.sock");
    kvt_geometry *g = geo_heads(2);
    kvt_geometry_info info;
    assert_ok(kvt_geometry_info_get(g, &info));
    kvt_geometry_destroy(g);
    snprintf(cap, sizeof cap, "%llu", (unsigned long long)(12 * TPP * info.bytes_per_token));
    const char *const opts[] = {"cpu_capacity", cap, "server_client_tasks", "1", NULL};
    g_opts = opts;
    pid_t srv = start_server(path, NULL);
    g_opts = NULL;
    uint64_t seed_a = 41, seed_b = 42;
    assert_int_equal(reap(spawn(child_store, path, &seed_a), 20000), 0);
    engine e;
    assert_ok(engine_open(&e, path, 2));
    uint32_t ta[NTOK], tb[NTOK], peeked = 0;
    kvt_request ra, rb;
    request(&ra, ta, seed_a);
    request(&rb, tb, seed_b);
    kvt_cache_stats before, after;
    assert_ok(kvt_client_stats(e.cl, &before));
    for (int i = 0; i < 3; i++) {
        assert_ok(kvt_client_peek(e.cl, &ra, &peeked));
        assert_int_equal(peeked, BLOCKS * TPP);
    }
    assert_ok(kvt_client_stats(e.cl, &after));
    assert_int_equal(after.lookups, before.lookups);
    assert_int_equal(after.tasks_in_flight, 0);
    /* Another client stores B: a connection of its own (not a forked
     * process: this one runs client threads already, and TSan cannot fork
     * a threaded process). */
    engine e2;
    uint32_t stored = 0;
    assert_ok(engine_open(&e2, path, 2));
    assert_ok(engine_store(&e2, &rb, &stored));
    assert_int_equal(stored, BLOCKS * TPP);
    engine_close(&e2);
    assert_ok(kvt_client_peek(e.cl, &ra, &peeked)); /* A lost its tail to B */
    assert_int_equal(peeked, 4 * TPP);
    kvt_match m, m2;
    assert_ok(kvt_client_lookup(e.cl, &rb, &m)); /* the quota's one task */
    assert_int_equal(m.matched_tokens, BLOCKS * TPP);
    assert_status(kvt_client_lookup(e.cl, &ra, &m2), KVT_EFULL);
    assert_ok(kvt_client_peek(e.cl, &ra, &peeked)); /* no task: no quota */
    assert_int_equal(peeked, 4 * TPP);
    assert_ok(kvt_client_cancel(e.cl, m.task));
    kvt_task_result res;
    assert_ok(kvt_client_wait(e.cl, m.task, 0, &res));
    uint32_t matched = 0;
    assert_ok(engine_load(&e, &ra, &matched)); /* byte-verified */
    assert_int_equal(matched, 4 * TPP);
    engine_close(&e);
    stop_server(srv, path);
}

/* A client outlives its server: calls give KVT_ECONN while it is gone, and
 * once a new server listens on the socket the client re-attaches on its own
 * (bounded backoff) and works again, byte for byte. */
static kvt_status child_outlive(const char *path, void *arg)
{
    int *fds = arg; /* [0]: from the parent, [1]: to the parent */
    engine e;
    kvt_status st = engine_open(&e, path, 2);
    uint32_t tokens[NTOK], stored = 0, matched = 0;
    kvt_request r;
    request(&r, tokens, 41);
    if (!st) st = engine_store(&e, &r, &stored);
    char c = 1;
    if (!st && (write(fds[1], &c, 1) != 1 || read(fds[0], &c, 1) != 1)) st = KVT_ESYS;
    /* The server was killed. */
    if (!st && engine_load(&e, &r, &matched) != KVT_ECONN)
        st = kvt__fail(KVT_EINVAL, "a call to a dead server did not give KVT_ECONN");
    if (!st && strstr(kvt_last_error(), path) == NULL)
        st = kvt__fail(KVT_EINVAL, "KVT_ECONN does not name the socket: %s", kvt_last_error());
    if (!st && (write(fds[1], &c, 1) != 1 || read(fds[0], &c, 1) != 1)) st = KVT_ESYS;
    /* A new server listens: retry until the client is back (backoff <= 1 s). */
    uint64_t until = kvt__now_ns() + 5000000000ull;
    kvt_status got = KVT_ECONN;
    while (!st && got == KVT_ECONN && kvt__now_ns() < until) {
        got = engine_load(&e, &r, &matched);
        struct timespec ts = {0, 20 * 1000000L};
        if (got == KVT_ECONN) nanosleep(&ts, NULL);
    }
    if (!st && got) st = kvt__fail(got, "no re-attach: %s", kvt_last_error());
    if (!st && matched != 0) st = kvt__fail(KVT_EINVAL, "the new server knew %u tokens", matched);
    if (!st) st = engine_store(&e, &r, &stored);
    if (!st) st = engine_load(&e, &r, &matched);
    if (!st && matched != BLOCKS * TPP) st = kvt__fail(KVT_EINVAL, "matched %u", matched);
    engine_close(&e);
    return st;
}

static void test_client_reattaches(void **state)
{
    (void)state;
    make_dir();
    char path[300];
    sock_path(path, sizeof path, "a.sock");
    pid_t srv = start_server(path, NULL);
    int down[2], up[2];
    assert_int_equal(pipe(down), 0);
    assert_int_equal(pipe(up), 0);
    int fds[2] = {down[0], up[1]};
    pid_t kid = spawn(child_outlive, path, fds);
    close(up[1]);
    char c = 0;
    assert_int_equal(read(up[0], &c, 1), 1); /* stored */
    kvt_test_server_forget(srv);
    kill(srv, SIGKILL);
    assert_int_equal(reap(srv, 5000), -SIGKILL);
    assert_int_equal(write(down[1], &c, 1), 1);
    assert_int_equal(read(up[0], &c, 1), 1); /* saw KVT_ECONN */
    srv = start_server(path, NULL);
    assert_int_equal(write(down[1], &c, 1), 1);
    assert_int_equal(reap(kid, 20000), 0);
    close(down[0]);
    close(down[1]);
    close(up[0]);
    stop_server(srv, path);
}

/* Keyed requests (the wire's form 1): the engine names each block by its
 * own key (SGLang's page hash). Process A stores 8 blocks under keys; process
 * B, another process, looks the keys up and loads them byte for byte; a
 * token request over the same tokens, or the keys in another namespace,
 * find nothing (a keyed chain never meets a token chain). */
typedef struct keyed_chain {
    char text[BLOCKS][32];
    kvt_key keys[BLOCKS];
    uint32_t tokens[NTOK];
} keyed_chain;

static void keyed_make(keyed_chain *c, uint64_t seed)
{
    kvt_test_tokens(c->tokens, NTOK, seed);
    for (uint32_t i = 0; i < BLOCKS; i++) {
        snprintf(c->text[i], sizeof c->text[i], "page-%llu-%u", (unsigned long long)seed, i);
        c->keys[i] = (kvt_key){c->text[i], (uint32_t)strlen(c->text[i])};
    }
}

static kvt_status child_keyed_store(const char *path, void *arg)
{
    keyed_chain c;
    keyed_make(&c, *(uint64_t *)arg);
    engine e;
    kvt_status st = engine_open(&e, path, 2);
    kvt_request t = {c.tokens, BLOCKS * TPP, NULL, 0};
    /* Visible at end: this process exits next and the loading one comes
     * right after; a plain store is visible only after the server's check,
     * which nothing here would wait for (the load then raced it and missed
     * when a busy machine starved the idle-priority check). */
    kvt_request r = {.ns = "tenant", .ns_len = 6, .keys = c.keys, .num_keys = BLOCKS,
                     .flags = KVT_REQ_VISIBLE_AT_END};
    kvt_store_plan p = {0};
    if (!st) st = kvt_client_prepare_store(e.cl, &r, &p);
    if (!st && (p.task == 0 || p.first_token != 0 || p.num_tokens != BLOCKS * TPP))
        st = kvt__fail(KVT_EINVAL, "keyed plan: task %llu tokens [%u, +%u), want [0, +%u)",
                       (unsigned long long)p.task, p.first_token, p.num_tokens, BLOCKS * TPP);
    if (!st) st = kvt_emu_fill(e.emu, &t, 0, BLOCKS * TPP, e.pages, PAGES);
    if (!st) st = kvt_client_launch(e.cl, p.task, e.pages, PAGES);
    kvt_task_result res = {0};
    if (!st) st = kvt_client_wait(e.cl, p.task, TIMEOUT_MS, &res);
    if (!st && res.status) st = kvt__fail(res.status, "keyed store result %s",
                                          kvt_status_name(res.status));
    /* The client checks a request as the cache does before a round trip. */
    if (!st) {
        c.keys[3].len = 0;
        kvt_status bad = kvt_client_lookup(e.cl, &r, &(kvt_match){0});
        c.keys[3].len = (uint32_t)strlen(c.text[3]);
        if (bad != KVT_EINVAL || !strstr(kvt_last_error(), "kvt_client_lookup: req->keys[3].len"))
            st = kvt__fail(KVT_EPROTO, "a zero-length key gave %s: %s", kvt_status_name(bad),
                           kvt_last_error());
    }
    engine_close(&e);
    return st;
}

static kvt_status child_keyed_load(const char *path, void *arg)
{
    keyed_chain c;
    keyed_make(&c, *(uint64_t *)arg);
    engine e;
    kvt_status st = engine_open(&e, path, 2);
    kvt_request t = {c.tokens, BLOCKS * TPP, NULL, 0};
    kvt_request r = {.ns = "tenant", .ns_len = 6, .keys = c.keys, .num_keys = BLOCKS};
    kvt_match m = {0};
    uint32_t peeked = 0;
    if (!st) st = kvt_client_peek(e.cl, &r, &peeked); /* every key, as the lookup */
    if (!st && peeked != BLOCKS * TPP)
        st = kvt__fail(KVT_ENOTFOUND, "keyed peek matched %u tokens, want %u", peeked,
                       BLOCKS * TPP);
    if (!st) st = kvt_client_lookup(e.cl, &r, &m);
    if (!st && (m.task == 0 || m.matched_tokens != BLOCKS * TPP))
        st = kvt__fail(KVT_ENOTFOUND, "keyed lookup matched %u tokens, want %u",
                       m.matched_tokens, BLOCKS * TPP);
    if (!st) st = kvt_emu_poison(e.emu, e.pages, PAGES);
    if (!st) st = kvt_client_launch(e.cl, m.task, e.pages, PAGES);
    kvt_task_result res = {0};
    if (!st) st = kvt_client_wait(e.cl, m.task, TIMEOUT_MS, &res);
    if (!st && res.status) st = kvt__fail(res.status, "keyed load result %s",
                                          kvt_status_name(res.status));
    kvt_verify_result v = {0};
    if (!st) st = kvt_emu_verify(e.emu, &t, 0, BLOCKS * TPP, e.pages, PAGES, &v);
    if (!st && (v.mismatches || v.bytes_checked == 0))
        st = kvt__fail(KVT_ECORRUPT, "keyed load: %llu of %llu bytes differ",
                       (unsigned long long)v.mismatches, (unsigned long long)v.bytes_checked);
    /* Another namespace, and a token request over the same tokens, miss. */
    kvt_request other = r;
    other.ns = "other";
    other.ns_len = 5;
    kvt_request tok = {c.tokens, NTOK, "tenant", 6};
    kvt_match m2 = {0}, m3 = {0};
    if (!st) st = kvt_client_lookup(e.cl, &other, &m2);
    if (!st) st = kvt_client_lookup(e.cl, &tok, &m3);
    if (!st && (m2.matched_tokens || m3.matched_tokens))
        st = kvt__fail(KVT_EPROTO, "other namespace matched %u, token request matched %u",
                       m2.matched_tokens, m3.matched_tokens);
    uint32_t p2 = 77, p3 = 77;
    if (!st) st = kvt_client_peek(e.cl, &other, &p2);
    if (!st) st = kvt_client_peek(e.cl, &tok, &p3);
    if (!st && (p2 || p3))
        st = kvt__fail(KVT_EPROTO, "other namespace peeked %u, token request peeked %u", p2,
                       p3);
    engine_close(&e);
    return st;
}

static void test_keyed_store_in_a_load_in_b(void **state)
{
    (void)state;
    make_dir();
    char path[300];
    sock_path(path, sizeof path, "kk.sock");
    pid_t srv = start_server(path, NULL);
    uint64_t seed = 77;
    assert_int_equal(reap(spawn(child_keyed_store, path, &seed), 20000), 0);
    assert_int_equal(reap(spawn(child_keyed_load, path, &seed), 20000), 0);
    stop_server(srv, path);
}

/* A keyed frame the client library would never send (a key over the cache's
 * 256-byte bound, within the wire's) is refused with KVT_EINVAL naming the
 * key, and the connection stays up. */
static kvt_status child_keyed_raw(const char *path, void *arg)
{
    (void)arg;
    int fd = raw_connect(path);
    if (fd < 0) return KVT_ECONN;
    kvt_geometry *g = geo_heads(2);
    kvt_srv_buf b = {0};
    uint8_t *p = NULL;
    uint32_t len = 0;
    int shm = -1;
    kvt__srv_hello_encode(&b, (uint32_t)getpid(), g, 0);
    kvt_status st = raw_rt(fd, KVT_SRV_HELLO, &b, &p, &len, &shm);
    free(p);
    kvt__srv_buf_free(&b);
    kvt_geometry_destroy(g);
    if (shm >= 0) close(shm);
    if (st) return st;
    static char big[600];
    memset(big, 'k', sizeof big);
    len = 0;
    kvt__srv_put32(&b, 1); /* form: keys */
    kvt__srv_put32(&b, 0); /* no namespace */
    kvt__srv_put32(&b, 2);
    kvt__srv_put32(&b, 3);
    kvt__srv_put_bytes(&b, "abc", 3);
    kvt__srv_put32(&b, sizeof big);
    kvt__srv_put_bytes(&b, big, sizeof big);
    p = NULL;
    st = raw_rt(fd, KVT_SRV_LOOKUP, &b, &p, &len, NULL);
    kvt__srv_buf_free(&b);
    char msg[KVT_SRV_MAX_ERRMSG + 1] = "";
    if (p && len <= KVT_SRV_MAX_ERRMSG) memcpy(msg, p, len);
    bool named = strstr(msg, "keys[1].len is 600") != NULL;
    if (!named) fprintf(stderr, "server said: %s\n", msg);
    free(p);
    if (st != KVT_EINVAL || !named)
        return kvt__fail(KVT_EPROTO, "a 600-byte key gave %s", kvt_status_name(st));
    p = NULL;
    st = raw_rt(fd, KVT_SRV_STATS, &b, &p, &len, NULL); /* still attached */
    free(p);
    close(fd);
    return st;
}

static void test_keyed_bad_key_refused(void **state)
{
    (void)state;
    child_against_server("kb.sock", child_keyed_raw, NULL);
}

/* ------------------------------------------------------------------ */
/* Security: socket group, peer credentials, namespaces, secret       */

#define NOBODY 65534
#define DAEMON_GID 1

/* A directory every user may traverse (the uid tests' clients are nobody). */
static void make_open_dir(void)
{
    snprintf(g_dir, sizeof g_dir, "/tmp/srvXXXXXX");
    assert_non_null(mkdtemp(g_dir));
    kvt_test_dir_track(g_dir);
    assert_int_equal(chmod(g_dir, 0711), 0);
}

typedef struct as_user {
    uid_t uid;
    gid_t gid;
    const char *ns;       /* the namespace to store and load in */
    kvt_status want;      /* what attach or the first plan gives */
    const char *want_msg; /* in its message */
} as_user;

/* As arg's uid/gid: attach, store and load in arg->ns; the first failure
 * must be arg->want with want_msg in its message (KVT_OK: all works). */
static kvt_status child_as_user(const char *path, void *arg)
{
    const as_user *u = arg;
    if (setgroups(0, NULL) || setgid(u->gid) || setuid(u->uid))
        return kvt__fail(KVT_ESYS, "cannot become uid %ld", (long)u->uid);
    engine e;
    uint32_t tokens[NTOK], n = 0;
    kvt_request r;
    request(&r, tokens, 77);
    r.ns = u->ns;
    r.ns_len = (uint32_t)strlen(u->ns);
    kvt_status st = engine_open(&e, path, 2);
    if (!st) st = engine_store(&e, &r, &n);
    if (!st) st = engine_load(&e, &r, &n);
    if (!st && n != BLOCKS * TPP) st = kvt__fail(KVT_EINVAL, "loaded %u tokens", n);
    if (e.cl) engine_close(&e);
    if (st != u->want)
        return kvt__fail(KVT_EINVAL, "got %s (%s), want %s", kvt_status_name(st),
                         kvt_last_error(), kvt_status_name(u->want));
    if (st && u->want_msg && !strstr(kvt_last_error(), u->want_msg))
        return kvt__fail(KVT_EINVAL, "message lacks \"%s\": %s", u->want_msg, kvt_last_error());
    return KVT_OK;
}

/* server_socket_group: the socket is 0660 owned by the group; its members
 * attach, others are refused by the socket's mode (KVT_EAUTH naming the
 * socket) and, should the mode be widened behind the server's back, by
 * SO_PEERCRED; a group that does not exist is refused at create. */
static void test_socket_group(void **state)
{
    (void)state;
    if (geteuid() != 0) skip(); /* needs to run clients as other users */
    make_open_dir();
    char path[300], want[400];
    sock_path(path, sizeof path, "g.sock");
    static const char *const bad[] = {"server_socket_group", "no-such-group-kvt", NULL};
    g_opts = bad;
    kvt_server *s = NULL;
    assert_status(make_server(&s, path, NULL), KVT_EINVAL);
    assert_non_null(strstr(kvt_last_error(), "\"no-such-group-kvt\" is not a group"));
    static const char *const opts[] = {"server_socket_group", "daemon", NULL};
    g_opts = opts;
    snprintf(g_log_path, sizeof g_log_path, "%s/server.log", g_dir);
    pid_t srv = start_server(path, NULL);
    g_opts = NULL;
    g_log_path[0] = '\0';
    struct stat sb;
    assert_int_equal(stat(path, &sb), 0);
    assert_int_equal(sb.st_mode & 0777, 0660);
    assert_int_equal(sb.st_gid, DAEMON_GID);
    as_user member = {NOBODY, DAEMON_GID, "tenant", KVT_OK, NULL};
    assert_int_equal(reap(spawn(child_as_user, path, &member), 20000), 0);
    snprintf(want, sizeof want, "kvtier server at %s: permission denied (uid %d", path, NOBODY);
    as_user other = {NOBODY, NOBODY, "tenant", KVT_EAUTH, want};
    assert_int_equal(reap(spawn(child_as_user, path, &other), 20000), 0);
    /* The mode widened: the server's own check refuses and logs the peer,
     * and tells the client so (KVT_EAUTH, not the closed socket that read
     * like a full or dead server: issue 24 item 7). */
    assert_int_equal(chmod(path, 0666), 0);
    as_user widened = {NOBODY, NOBODY, "tenant", KVT_EAUTH,
                       "refused: this client's user is not admitted"};
    pid_t kid = spawn(child_as_user, path, &widened);
    assert_int_equal(reap(kid, 20000), 0);
    char file[340], log[8192] = "";
    snprintf(file, sizeof file, "%s/server.log", g_dir);
    snprintf(want, sizeof want, "refused client pid %ld: uid %d is neither this server's (0) "
             "nor root, nor in server_socket_group daemon", (long)kid, NOBODY);
    FILE *f = fopen(file, "r");
    assert_non_null(f);
    log[fread(log, 1, sizeof log - 1, f)] = '\0';
    fclose(f);
    if (!strstr(log, want)) fail_msg("log lacks \"%s\":\n%s", want, log);
    stop_server(srv, path);
}

/* server_namespaces: each client uses only the namespaces a rule matching
 * its uid or groups lists; another gives KVT_EAUTH naming the namespace and
 * the client's pid and uid. A malformed rule is refused at create. */
static kvt_status child_ns_refused(const char *path, void *arg)
{
    (void)arg;
    engine e;
    uint32_t tokens[NTOK];
    kvt_request r;
    request(&r, tokens, 78);
    r.ns = "other";
    r.ns_len = 5;
    kvt_status st = engine_open(&e, path, 2);
    kvt_match m;
    kvt_store_plan p;
    char want[160];
    snprintf(want, sizeof want, "namespace \"other\" is not allowed for client pid %ld (uid %ld",
             (long)getpid(), (long)getuid());
    if (!st && kvt_client_lookup(e.cl, &r, &m) != KVT_EAUTH)
        st = kvt__fail(KVT_EINVAL, "lookup in \"other\" was not refused: %s", kvt_last_error());
    if (!st && !strstr(kvt_last_error(), want))
        st = kvt__fail(KVT_EINVAL, "lookup refusal lacks \"%s\": %s", want, kvt_last_error());
    if (!st && kvt_client_prepare_store(e.cl, &r, &p) != KVT_EAUTH)
        st = kvt__fail(KVT_EINVAL, "store in \"other\" was not refused: %s", kvt_last_error());
    uint32_t peeked = 77;
    if (!st && kvt_client_peek(e.cl, &r, &peeked) != KVT_EAUTH)
        st = kvt__fail(KVT_EINVAL, "peek in \"other\" was not refused: %s", kvt_last_error());
    if (!st && (!strstr(kvt_last_error(), want) || peeked != 77))
        st = kvt__fail(KVT_EINVAL, "peek refusal lacks \"%s\" (or wrote %u): %s", want,
                       peeked, kvt_last_error());
    uint32_t removed = 0, kept = 0;
    if (!st && kvt_client_clear(e.cl, "other", 5, &removed, &kept) != KVT_EAUTH)
        st = kvt__fail(KVT_EINVAL, "clear of \"other\" was not refused: %s", kvt_last_error());
    kvt_request two[2] = {r, r};
    two[1].ns = NULL;
    two[1].ns_len = 0;
    uint32_t got[2] = {9, 9};
    kvt_status sts[2] = {KVT_OK, KVT_OK};
    if (!st) st = kvt_client_peek_many(e.cl, two, 2, got, sts);
    if (!st && (sts[0] != KVT_EAUTH || sts[1] != KVT_OK || got[0] != 0))
        st = kvt__fail(KVT_EINVAL, "peek_many: entry 0 %s (%u), entry 1 %s",
                       kvt_status_name(sts[0]), got[0], kvt_status_name(sts[1]));
    uint32_t n = 0;
    r.ns = NULL; /* the default namespace: listed as "-" */
    r.ns_len = 0;
    if (!st) st = engine_store(&e, &r, &n);
    if (!st) st = engine_load(&e, &r, &n);
    engine_close(&e);
    return st;
}

static void test_namespace_rules(void **state)
{
    (void)state;
    if (geteuid() != 0) skip();
    make_open_dir();
    char path[300], want[200];
    sock_path(path, sizeof path, "n.sock");
    static const char *const bad[] = {"server_namespaces", "uid:x=a", NULL};
    g_opts = bad;
    kvt_server *s = NULL;
    assert_status(make_server(&s, path, NULL), KVT_EINVAL);
    assert_non_null(strstr(kvt_last_error(), "server_namespaces: \"uid:x\" is not uid:N"));
    static const char *const opts[] = {"server_socket_group", "daemon", "server_namespaces",
                                       "uid:0=tenant,-; gid:1=shared", NULL};
    g_opts = opts;
    pid_t srv = start_server(path, NULL);
    g_opts = NULL;
    as_user root_ok = {0, 0, "tenant", KVT_OK, NULL};
    assert_int_equal(reap(spawn(child_as_user, path, &root_ok), 20000), 0);
    assert_int_equal(reap(spawn(child_ns_refused, path, NULL), 20000), 0);
    as_user member_ok = {NOBODY, DAEMON_GID, "shared", KVT_OK, NULL};
    assert_int_equal(reap(spawn(child_as_user, path, &member_ok), 20000), 0);
    snprintf(want, sizeof want, "namespace \"tenant\" is not allowed for client pid");
    as_user member_no = {NOBODY, DAEMON_GID, "tenant", KVT_EAUTH, want};
    assert_int_equal(reap(spawn(child_as_user, path, &member_no), 20000), 0);
    stop_server(srv, path);
}

/* server_secret_file: clients prove the secret at attach (mutual
 * HMAC-SHA256): without it, or with another, attach gives KVT_EAUTH saying
 * which; with it, everything works. A short secret is refused at create. */
static kvt_status child_with_secret(const char *path, void *arg)
{
    const as_user *u = arg; /* ns: the secret file, or "" for none */
    if (*u->ns) setenv("KVTIER_SERVER_SECRET_FILE", u->ns, 1);
    else unsetenv("KVTIER_SERVER_SECRET_FILE");
    as_user me = {getuid(), getgid(), "tenant", u->want, u->want_msg};
    /* (setuid to ourselves is a no-op) */
    return child_as_user(path, &me);
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void test_secret(void **state)
{
    (void)state;
    make_dir();
    char path[300], good[300], other[300], shorty[300];
    sock_path(path, sizeof path, "k.sock");
    sock_path(good, sizeof good, "good.key");
    sock_path(other, sizeof other, "other.key");
    sock_path(shorty, sizeof shorty, "short.key");
    write_file(good, "0123456789abcdef-the-node-secret");
    write_file(other, "0123456789abcdef-another-secret!");
    write_file(shorty, "too short");
    const char *bad[] = {"server_secret_file", shorty, NULL};
    g_opts = bad;
    kvt_server *s = NULL;
    assert_status(make_server(&s, path, NULL), KVT_EINVAL);
    assert_non_null(strstr(kvt_last_error(), "holds 9 bytes (16..1024)"));
    const char *opts[] = {"server_secret_file", good, NULL};
    g_opts = opts;
    pid_t srv = start_server(path, NULL);
    g_opts = NULL;
    as_user with = {0, 0, good, KVT_OK, NULL};
    assert_int_equal(reap(spawn(child_with_secret, path, &with), 20000), 0);
    as_user none = {0, 0, "", KVT_EAUTH, "requires a shared secret the client lacks"};
    assert_int_equal(reap(spawn(child_with_secret, path, &none), 20000), 0);
    as_user wrong = {0, 0, other, KVT_EAUTH, "different secrets"};
    assert_int_equal(reap(spawn(child_with_secret, path, &wrong), 20000), 0);
    stop_server(srv, path);
    /* A client holding a secret refuses a server that cannot prove it. */
    srv = start_server(path, NULL);
    assert_int_equal(reap(spawn(child_with_secret, path, &wrong), 20000), 0);
    stop_server(srv, path);
}

/* ------------------------------------------------------------------ */
/* A client that stops copying                                        */

/* Polls the server's stats until ok(stats) or 10 s (then fails). */
static bool blocks_used(const kvt_cache_stats *s, uint64_t want)
{
    return s->cpu_blocks_used == want;
}

static void read_log(char *log, size_t cap)
{
    char file[340];
    snprintf(file, sizeof file, "%s/server.log", g_dir);
    FILE *f = fopen(file, "r");
    assert_non_null(f);
    log[fread(log, 1, cap - 1, f)] = '\0';
    fclose(f);
}

/* A real client process launches a store, writes half of it and stops (it
 * stays alive, its socket open): after server_copy_ms the server cuts it
 * off - its pins and pending chain released while it lives, so another
 * client stores and loads the same prefix, byte for byte, unstalled - and
 * keeps the cut store's blocks out of the pool until the process exits (it
 * still maps them). A stuck loader likewise loses its pins. */
static void test_stuck_client_cut_off(void **state)
{
    (void)state;
    make_dir();
    char path[300], want[200], log[16384];
    sock_path(path, sizeof path, "t.sock");
    snprintf(g_log_path, sizeof g_log_path, "%s/server.log", g_dir);
    static const char *const opts[] = {"server_copy_ms", "300", "log_level", "info", NULL};
    g_opts = opts;
    pid_t srv = start_server(path, NULL);
    g_opts = NULL;
    g_log_path[0] = '\0';
    int ready[2];
    assert_int_equal(pipe(ready), 0);
    raw_arg a = {ready[1], false, false};
    pid_t stuck = spawn(child_raw_store, path, &a);
    char c;
    assert_int_equal(read(ready[0], &c, 1), 1); /* launched, half written, stuck */
    /* (The parent forks only while it holds no client: no threads.) */
    engine e;
    assert_ok(engine_open(&e, path, 2));
    stats_until(&e, no_tasks, 0);
    engine_close(&e);
    pid_t chk = kvt_test_fork(); /* while the stuck client lives */
    if (chk == 0) {
        check_no_visible_then_store(path);
        _exit(0);
    }
    assert_int_equal(reap(chk, 20000), 0);
    /* Its 8 blocks fenced beside the 8 just stored, until it exits. */
    assert_ok(engine_open(&e, path, 2));
    stats_until(&e, blocks_used, 2 * BLOCKS);
    assert_int_equal(kill(stuck, 0), 0); /* still alive */
    read_log(log, sizeof log);
    snprintf(want, sizeof want, "client pid %ld (uid %ld) cut off: 1 launched task(s) not ended "
             "within server_copy_ms (300 ms); pins released, 8 store blocks held", (long)stuck,
             (long)getuid());
    if (!strstr(log, want)) fail_msg("log lacks \"%s\":\n%s", want, log);
    kill(stuck, SIGKILL);
    assert_int_equal(reap(stuck, 5000), -SIGKILL);
    stats_until(&e, blocks_used, BLOCKS);
    engine_close(&e);
    /* A stuck loader: pinned blocks released while it lives. */
    raw_arg l = {ready[1], false, true};
    pid_t loader = spawn(child_raw_store, path, &l);
    assert_int_equal(read(ready[0], &c, 1), 1);
    assert_ok(engine_open(&e, path, 2));
    stats_until(&e, no_tasks, 0);
    uint32_t tokens[NTOK], matched = 0;
    kvt_request r;
    request(&r, tokens, 99);
    assert_ok(engine_load(&e, &r, &matched));
    assert_int_equal(matched, BLOCKS * TPP);
    assert_int_equal(kill(loader, 0), 0);
    kill(loader, SIGKILL);
    assert_int_equal(reap(loader, 5000), -SIGKILL);
    close(ready[0]);
    close(ready[1]);
    engine_close(&e);
    stop_server(srv, path);
}

/* ------------------------------------------------------------------ */
/* The server killed in the middle of a load                          */

/* The engine's pages of the mid-load client: one mmap per buffer, so they
 * can be write-protected; the first write of the load's copy then faults
 * and the SIGSEGV handler holds that copy thread until the parent killed
 * the server - a load in flight when the server dies, every time. */
#define MAX_BUFS (LAYERS * KVT_MAX_COMPONENTS)
static void *g_buf[MAX_BUFS];
static size_t g_buf_len[MAX_BUFS];
static int g_notify = -1, g_go = -1;

static void protect(int prot)
{
    for (int i = 0; i < MAX_BUFS; i++)
        if (g_buf[i]) mprotect(g_buf[i], g_buf_len[i], prot);
}

/* The parent's next word to the child's main thread: its first non-zero
 * byte on g_go. The parent releases held copy threads with zero bytes, one
 * per thread that may be held, and fewer are held than it sends: a plain
 * read here took a leftover zero and ran ahead (test_reattach_frees_fenced
 * _blocks then saw the fence freed before it checked it was held: a fresh
 * chroot's ASan run, 2026-12-06). */
static bool parent_says(void)
{
    char c = 0;
    while (c == 0)
        if (read(g_go, &c, 1) != 1) return false;
    return true;
}

static void on_segv(int sig, siginfo_t *si, void *uc)
{
    (void)sig, (void)si, (void)uc;
    char c = 'f';
    if (write(g_notify, &c, 1) != 1 || read(g_go, &c, 1) != 1) _exit(4);
    protect(PROT_READ | PROT_WRITE); /* the faulting write then runs again */
}

/* Own buffers shaped like the emulator's (its layout is the reference). */
static kvt_status own_memory(engine *e, kvt_engine_memory *mem, void **bases)
{
    kvt_engine_memory ref;
    kvt_status st = kvt_emu_memory(e->emu, &ref);
    if (st) return st;
    for (int i = 0; i < MAX_BUFS; i++) {
        if (!ref.layer_bases[i]) continue;
        g_buf_len[i] = (ref.buffer_bytes[i] + 4095) & ~(size_t)4095;
        g_buf[i] = mmap(NULL, g_buf_len[i], PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                        -1, 0);
        if (g_buf[i] == MAP_FAILED) return KVT_ESYS;
        bases[i] = g_buf[i];
    }
    *mem = ref;
    mem->layer_bases = bases;
    return KVT_OK;
}

static kvt_status child_midload(const char *path, void *arg)
{
    int *fds = arg; /* [0] go (from the parent), [1] notify (to it) */
    g_go = fds[0];
    g_notify = fds[1];
    engine e = {0};
    e.geo = geo_heads(2);
    for (uint32_t i = 0; i < PAGES; i++) e.pages[i] = i;
    static void *bases[MAX_BUFS];
    kvt_engine_memory mem;
    kvt_status st = kvt_client_attach(&e.cl, path, e.geo, TIMEOUT_MS);
    if (!st) st = kvt_emu_create(&e.emu, e.geo, PAGES);
    if (!st) st = own_memory(&e, &mem, bases);
    if (!st) st = kvt_client_register_memory(e.cl, &mem);
    uint32_t tokens[NTOK];
    kvt_request r;
    request(&r, tokens, 5);
    kvt_match m = {0};
    if (!st) st = kvt_client_lookup(e.cl, &r, &m);
    if (!st && m.matched_tokens != BLOCKS * TPP) st = kvt__fail(KVT_EINVAL, "matched %u", m.matched_tokens);
    struct sigaction sa = {.sa_sigaction = on_segv, .sa_flags = SA_SIGINFO};
    sigaction(SIGSEGV, &sa, NULL);
    protect(PROT_READ);
    if (!st) st = kvt_client_launch(e.cl, m.task, e.pages, PAGES);
    /* The copy faults, the parent kills the server, the copy resumes. */
    kvt_task_result res = {0};
    uint64_t t0 = kvt__now_ns();
    if (!st) st = kvt_client_wait(e.cl, m.task, 2 * TIMEOUT_MS, &res);
    if (!st && res.status != KVT_ECONN)
        st = kvt__fail(KVT_EINVAL, "the load in flight ended with %s, not KVT_ECONN",
                       kvt_status_name(res.status));
    /* What did land came from the still-mapped tier: byte for byte right
     * (checked in the emulator's own buffers), though reported failed. */
    kvt_engine_memory ref;
    kvt_verify_result v = {0};
    if (!st) st = kvt_emu_memory(e.emu, &ref);
    for (int i = 0; !st && i < MAX_BUFS; i++)
        if (g_buf[i]) memcpy(ref.layer_bases[i], g_buf[i], ref.buffer_bytes[i]);
    if (!st) st = kvt_emu_verify(e.emu, &r, 0, BLOCKS * TPP, e.pages, PAGES, &v);
    if (!st && (v.mismatches || !v.bytes_checked))
        st = kvt__fail(KVT_ECORRUPT, "%llu of %llu bytes differ", (unsigned long long)v.mismatches,
                       (unsigned long long)v.bytes_checked);
    /* Every later call: KVT_ECONN naming the socket, within its deadline. */
    kvt_cache_stats cs;
    kvt_match m2;
    if (!st && kvt_client_lookup(e.cl, &r, &m2) != KVT_ECONN)
        st = kvt__fail(KVT_EINVAL, "lookup after the kill gave no KVT_ECONN: %s", kvt_last_error());
    if (!st && !strstr(kvt_last_error(), path))
        st = kvt__fail(KVT_EINVAL, "KVT_ECONN does not name the socket: %s", kvt_last_error());
    if (!st && kvt_client_stats(e.cl, &cs) != KVT_ECONN)
        st = kvt__fail(KVT_EINVAL, "stats after the kill gave no KVT_ECONN");
    if (!st && kvt__now_ns() - t0 > 2ull * TIMEOUT_MS * 1000000ull)
        st = kvt__fail(KVT_EINVAL, "KVT_ECONN came after the calls' deadline");
    char c = 'k';
    if (!st && (write(g_notify, &c, 1) != 1 || !parent_says())) st = KVT_ESYS;
    /* The server is back (cold): the client re-attaches on its own. */
    uint64_t until = kvt__now_ns() + 5000000000ull;
    kvt_status got = KVT_ECONN;
    while (!st && got == KVT_ECONN && kvt__now_ns() < until) {
        got = kvt_client_lookup(e.cl, &r, &m2);
        struct timespec ts = {0, 20 * 1000000L};
        if (got == KVT_ECONN) nanosleep(&ts, NULL);
    }
    if (!st && got) st = kvt__fail(got, "no re-attach: %s", kvt_last_error());
    if (!st && m2.matched_tokens != 0) st = kvt__fail(KVT_EINVAL, "a cold server matched %u", m2.matched_tokens);
    if (!st && m2.task) st = kvt_client_cancel(e.cl, m2.task);
    kvt_client_detach(e.cl);
    e.cl = NULL;
    /* The same memory through a fresh engine: store and load, byte for byte. */
    engine f;
    uint32_t n = 0;
    if (!st) st = engine_open(&f, path, 2);
    if (!st) st = engine_store(&f, &r, &n);
    if (!st) st = engine_load(&f, &r, &n);
    if (!st && n != BLOCKS * TPP) st = kvt__fail(KVT_EINVAL, "loaded %u tokens", n);
    if (f.cl) engine_close(&f);
    kvt_emu_destroy(e.emu);
    kvt_geometry_destroy(e.geo);
    return st;
}

/* A server SIGKILLed while a client's load is copying: the load ends with
 * KVT_ECONN (the engine recomputes: nothing it loaded is served as good),
 * every later call gives KVT_ECONN naming the socket within its deadline,
 * and the client re-attaches on its own to the restarted server. */
static void test_server_killed_mid_load(void **state)
{
    (void)state;
    make_dir();
    char path[300];
    sock_path(path, sizeof path, "m.sock");
    pid_t srv = start_server(path, NULL);
    uint64_t seed = 5;
    assert_int_equal(reap(spawn(child_store, path, &seed), 20000), 0);
    int down[2], up[2];
    assert_int_equal(pipe(down), 0);
    assert_int_equal(pipe(up), 0);
    int fds[2] = {down[0], up[1]};
    pid_t kid = spawn(child_midload, path, fds);
    close(up[1]);
    char c = 0;
    assert_int_equal(read(up[0], &c, 1), 1); /* the copy is held mid-load */
    assert_int_equal(c, 'f');
    kvt_test_server_forget(srv);
    kill(srv, SIGKILL);
    assert_int_equal(reap(srv, 5000), -SIGKILL);
    char go[8] = {0}; /* one per copy thread that may be held */
    assert_int_equal(write(down[1], go, sizeof go), (ssize_t)sizeof go);
    do assert_int_equal(read(up[0], &c, 1), 1); /* saw KVT_ECONN everywhere */
    while (c == 'f');
    assert_int_equal(c, 'k');
    srv = start_server(path, NULL);
    assert_int_equal(write(down[1], &c, 1), 1);
    assert_int_equal(reap(kid, 20000), 0);
    close(down[0]);
    close(down[1]);
    close(up[0]);
    stop_server(srv, path);
}

/* A client cut off mid-store (its copy held past server_copy_ms) whose
 * copy then ends and which re-attaches: its SESSION says its copies have
 * stopped, so the server frees the blocks it fenced at once (the process
 * still lives), and a store and load through the same handle come out
 * byte for byte. */
static kvt_status child_cut_reattach(const char *path, void *arg)
{
    int *fds = arg; /* [0] go (from the parent), [1] notify (to it) */
    g_go = fds[0];
    g_notify = fds[1];
    engine e = {0};
    e.geo = geo_heads(2);
    for (uint32_t i = 0; i < PAGES; i++) e.pages[i] = i;
    static void *bases[MAX_BUFS];
    kvt_engine_memory mem, ref;
    kvt_status st = kvt_client_attach(&e.cl, path, e.geo, TIMEOUT_MS);
    if (!st) st = kvt_emu_create(&e.emu, e.geo, PAGES);
    if (!st) st = own_memory(&e, &mem, bases);
    if (!st) st = kvt_client_register_memory(e.cl, &mem);
    uint32_t tokens[NTOK], n = 0;
    kvt_request r;
    request(&r, tokens, 7);
    if (!st) st = kvt_emu_fill(e.emu, &r, 0, NTOK, e.pages, PAGES);
    if (!st) st = kvt_emu_memory(e.emu, &ref);
    for (int i = 0; !st && i < MAX_BUFS; i++) /* the engine's bytes, in the client's pages */
        if (g_buf[i]) memcpy(g_buf[i], ref.layer_bases[i], ref.buffer_bytes[i]);
    kvt_store_plan p = {0};
    if (!st) st = kvt_client_prepare_store(e.cl, &r, &p);
    struct sigaction sa = {.sa_sigaction = on_segv, .sa_flags = SA_SIGINFO};
    sigaction(SIGSEGV, &sa, NULL);
    protect(PROT_NONE); /* the store's copy reads them: held there */
    if (!st) st = kvt_client_launch(e.cl, p.task, e.pages, PAGES);
    kvt_task_result res = {0};
    if (!st) st = kvt_client_wait(e.cl, p.task, 4 * TIMEOUT_MS, &res);
    if (!st && res.status != KVT_ECONN)
        st = kvt__fail(KVT_EINVAL, "the cut-off store ended with %s, not KVT_ECONN",
                       kvt_status_name(res.status));
    char c = 'k';
    if (!st && (write(g_notify, &c, 1) != 1 || !parent_says())) st = KVT_ESYS;
    /* Re-attach (a later call does it, after its backoff). */
    kvt_cache_stats cs = {0};
    kvt_status got = KVT_ECONN;
    uint64_t until = kvt__now_ns() + 5000000000ull;
    while (!st && got == KVT_ECONN && kvt__now_ns() < until) {
        got = kvt_client_stats(e.cl, &cs);
        struct timespec ts = {0, 20 * 1000000L};
        if (got == KVT_ECONN) nanosleep(&ts, NULL);
    }
    if (!st && got) st = kvt__fail(got, "no re-attach: %s", kvt_last_error());
    if (!st && (cs.cpu_blocks_used != 0 || cs.tasks_in_flight != 0))
        st = kvt__fail(KVT_EINVAL, "after the re-attach: %llu CPU blocks used, %llu tasks",
                       (unsigned long long)cs.cpu_blocks_used,
                       (unsigned long long)cs.tasks_in_flight);
    if (!st) st = engine_store(&e, &r, &n); /* its pages still hold the request's bytes */
    if (!st && n != BLOCKS * TPP) st = kvt__fail(KVT_EINVAL, "stored %u tokens", n);
    if (!st) st = kvt_client_stats(e.cl, &cs);
    if (!st && cs.cpu_blocks_used != BLOCKS)
        st = kvt__fail(KVT_EINVAL, "%llu CPU blocks used after the store",
                       (unsigned long long)cs.cpu_blocks_used);
    kvt_client_detach(e.cl);
    kvt_emu_destroy(e.emu);
    kvt_geometry_destroy(e.geo);
    return st;
}

static void test_reattach_frees_fenced_blocks(void **state)
{
    (void)state;
    make_dir();
    char path[300];
    sock_path(path, sizeof path, "f.sock");
    static const char *const opts[] = {"server_copy_ms", "300", NULL};
    g_opts = opts;
    pid_t srv = start_server(path, NULL);
    g_opts = NULL;
    int down[2], up[2];
    assert_int_equal(pipe(down), 0);
    assert_int_equal(pipe(up), 0);
    int fds[2] = {down[0], up[1]};
    pid_t kid = spawn(child_cut_reattach, path, fds);
    close(up[1]);
    char c = 0;
    assert_int_equal(read(up[0], &c, 1), 1); /* the store's copy is held */
    assert_int_equal(c, 'f');
    engine e; /* (the parent forks no more: it may hold a client now) */
    assert_ok(engine_open(&e, path, 2));
    stats_until(&e, no_tasks, 0);               /* cut off */
    stats_until(&e, blocks_used, BLOCKS);       /* its blocks fenced */
    char go[8] = {0}; /* one per copy thread that may be held */
    assert_int_equal(write(down[1], go, sizeof go), (ssize_t)sizeof go);
    do assert_int_equal(read(up[0], &c, 1), 1); /* its store ended KVT_ECONN */
    while (c == 'f');
    assert_int_equal(c, 'k');
    kvt_cache_stats cs;
    assert_ok(kvt_client_stats(e.cl, &cs));
    assert_int_equal(cs.cpu_blocks_used, BLOCKS); /* still fenced: it lives, not re-attached */
    assert_int_equal(kill(kid, 0), 0);
    assert_int_equal(write(down[1], &c, 1), 1);
    assert_int_equal(reap(kid, 20000), 0);
    uint32_t tokens[NTOK], matched = 0;
    kvt_request r;
    request(&r, tokens, 7);
    assert_ok(engine_load(&e, &r, &matched)); /* byte for byte */
    assert_int_equal(matched, BLOCKS * TPP);
    engine_close(&e);
    close(down[0]);
    close(down[1]);
    close(up[0]);
    stop_server(srv, path);
}

/* One decoder reads a client's HELLO and the server's GEOMETRY reply; a
 * version mismatch must name the side that sent the bytes. */
static void test_hello_version_names_sender(void **state)
{
    (void)state;
    kvt_geometry *g = geo_heads(2);
    kvt_srv_buf b = {0};
    assert_ok(kvt__srv_hello_encode(&b, 1, g, 0));
    uint32_t bad = KVT_SRV_VERSION + 1;
    memcpy(b.p, &bad, 4); /* the version is the first word */
    kvt_srv_hello h;
    assert_status(kvt__srv_hello_decode(b.p, b.len, false, &h), KVT_EVERSION);
    assert_non_null(strstr(kvt_last_error(), "hello: client speaks protocol"));
    assert_status(kvt__srv_hello_decode(b.p, b.len, true, &h), KVT_EVERSION);
    assert_non_null(strstr(kvt_last_error(), "geometry: server speaks protocol"));
    kvt__srv_buf_free(&b);
    kvt_geometry_destroy(g);
}

/* A server started with no geometry serves each engine's own: engines of
 * 2 and 4 kv heads (two TP slices of one model) and one asking for 32-token
 * blocks each get a tier of their own, the same tokens never hit another
 * geometry's bytes, other processes of a geometry hit its blocks (byte
 * for byte), a block larger than a tier's share is refused naming both
 * sizes, a geometry past server_max_geometries is refused naming the
 * option, and after a restart each geometry's SSD tier comes back warm. */
static void test_any_geometry(void **state)
{
    (void)state;
    make_dir();
    char path[300], ssd[300];
    sock_path(path, sizeof path, "any.sock");
    sock_path(ssd, sizeof ssd, "ssd");
    static const char *const opts[] = {"server_max_geometries", "3", NULL};
    g_opts = opts;
    g_any_geometry = true;
    pid_t srv = start_server(path, ssd);
    const uint32_t all = BLOCKS * TPP;
    geo_step a = {51, 2, 0, 0}, b = {51, 4, 0, 0}, c = {51, 2, 32, 0};
    assert_int_equal(reap(spawn(child_geo_step, path, &a), 20000), 0);
    assert_int_equal(reap(spawn(child_geo_step, path, &b), 20000), 0); /* A's tokens: a miss */
    geo_step a2 = {51, 2, 0, all}, b2 = {51, 4, 0, all};
    assert_int_equal(reap(spawn(child_geo_step, path, &a2), 20000), 0);
    assert_int_equal(reap(spawn(child_geo_step, path, &b2), 20000), 0);
    /* 4 MiB / 3 per tier; 2048 heads make 16 MiB blocks. */
    geo_refusal big = {2048, KVT_EINVAL, "bytes"};
    assert_int_equal(reap(spawn(child_geo_refused, path, &big), 20000), 0);
    assert_int_equal(reap(spawn(child_geo_step, path, &c), 20000), 0);
    geo_refusal fourth = {8, KVT_EFULL, "server_max_geometries=3"};
    assert_int_equal(reap(spawn(child_geo_refused, path, &fourth), 20000), 0);
    stop_server(srv, path);
    srv = start_server(path, ssd);
    g_opts = NULL;
    g_any_geometry = false;
    geo_step a3 = {51, 2, 0, all}, b3 = {51, 4, 0, all}, c3 = {51, 2, 32, all};
    assert_int_equal(reap(spawn(child_geo_step, path, &b3), 20000), 0);
    assert_int_equal(reap(spawn(child_geo_step, path, &a3), 20000), 0);
    assert_int_equal(reap(spawn(child_geo_step, path, &c3), 20000), 0);
    stop_server(srv, path);
}

/* Tokens of request seed loaded (byte-verified) by e. */
static uint32_t loaded(engine *e, uint64_t seed)
{
    uint32_t tokens[NTOK], matched = 0;
    kvt_request r;
    request(&r, tokens, seed);
    assert_ok(engine_load(e, &r, &matched));
    return matched;
}

static void store_seed(engine *e, uint64_t seed)
{
    uint32_t tokens[NTOK], stored = 0;
    kvt_request r;
    request(&r, tokens, seed);
    assert_ok(engine_store(e, &r, &stored));
    assert_int_equal(stored, BLOCKS * TPP);
}

/* A server of any geometry shares one cpu_capacity among them: one
 * geometry alone may fill far more than 1/server_max_geometries of it (40
 * requests of 8 KiB blocks: 2.5 of 4 MiB, with 4 geometries allowed), and a
 * second geometry's stores take the coldest blocks of the first (requests
 * it loaded last stay whole), never pushing the two past cpu_capacity.
 * Every loaded byte is verified. */
static void test_shared_capacity(void **state)
{
    (void)state;
    make_dir();
    char path[300];
    sock_path(path, sizeof path, "share.sock");
    g_any_geometry = true;
    pid_t srv = start_server(path, NULL);
    g_any_geometry = false;
    engine a, b; /* the parent forks no more: it may hold clients now */
    assert_ok(engine_open(&a, path, 2)); /* 8 KiB blocks */
    enum { A_REQS = 40, OLD = 8, B_REQS = 16 };
    for (uint64_t i = 1; i <= A_REQS; i++) store_seed(&a, 1000 + i);
    for (uint64_t i = 1; i <= A_REQS; i++)
        if (loaded(&a, 1000 + i) != BLOCKS * TPP)
            fail_msg("geometry A's request %llu of %u lost blocks with nobody else on the server"
                     " (a 1/N share of cpu_capacity, not all of it?)", (unsigned long long)i,
                     A_REQS);
    for (uint64_t i = OLD + 1; i <= A_REQS; i++) loaded(&a, 1000 + i); /* the first OLD go cold */
    assert_ok(engine_open(&b, path, 4)); /* 16 KiB blocks: 16 x 128 KiB = 2 MiB */
    for (uint64_t i = 1; i <= B_REQS; i++) store_seed(&b, 2000 + i);
    for (uint64_t i = 1; i <= B_REQS; i++) assert_int_equal(loaded(&b, 2000 + i), BLOCKS * TPP);
    for (uint64_t i = OLD + 1; i <= A_REQS; i++)
        if (loaded(&a, 1000 + i) != BLOCKS * TPP)
            fail_msg("A's request %llu, loaded after its first %u, lost blocks to B while "
                     "colder ones were there", (unsigned long long)i, OLD);
    uint32_t old = 0;
    for (uint64_t i = 1; i <= OLD; i++) old += loaded(&a, 1000 + i);
    assert_true(old < OLD * BLOCKS * TPP); /* B took room: from the coldest */
    kvt_cache_stats sa, sb;
    assert_ok(kvt_client_stats(a.cl, &sa));
    assert_ok(kvt_client_stats(b.cl, &sb));
    uint64_t used = sa.cpu_blocks_used * sa.block_bytes + sb.cpu_blocks_used * sb.block_bytes;
    if (used > (4u << 20))
        fail_msg("the geometries hold %llu bytes together, over cpu_capacity (4 MiB)",
                 (unsigned long long)used);
    assert_true(sa.evicted_blocks > 0);
    engine_close(&a);
    engine_close(&b);
    stop_server(srv, path);
}

/* Bytes of memory behind process pid's CPU tier memfds (what their pages
 * use now: st_blocks of each "memfd:kvtier-cpu-tier" it holds open). */
static uint64_t tier_backed_bytes(pid_t pid)
{
    char dir[64];
    snprintf(dir, sizeof dir, "/proc/%ld/fd", (long)pid);
    DIR *d = opendir(dir);
    assert_non_null(d);
    uint64_t sum = 0;
    for (struct dirent *e; (e = readdir(d));) {
        char p[600], link[256];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        ssize_t n = readlink(p, link, sizeof link - 1);
        if (n <= 0) continue;
        link[n] = 0;
        if (strstr(link, "memfd:kvtier-cpu-tier")) sum += kvt__disk_bytes(p);
    }
    closedir(d);
    return sum;
}

/* A server for any geometry backs its shared tier slot by slot; a client's
 * attach must not back it all. Before, the client mapped the tier with
 * MAP_POPULATE, whose read faults allocate every page of a shmem hole: the
 * whole cpu_capacity was in memory at the first attach, once per geometry,
 * past what cpu_capacity promises. */
static void test_attach_leaves_shared_tier_sparse(void **state)
{
    (void)state;
    make_dir();
    char path[300];
    sock_path(path, sizeof path, "sparse.sock");
    g_any_geometry = true;
    pid_t srv = start_server(path, NULL);
    g_any_geometry = false;
    engine a, b; /* the parent forks no more: it may hold clients now */
    assert_ok(engine_open(&a, path, 2)); /* 8 KiB blocks */
    assert_ok(engine_open(&b, path, 4)); /* 16 KiB blocks: a second tier */
    uint64_t attached = tier_backed_bytes(srv);
    if (attached > (256u << 10))
        fail_msg("two attaches backed %llu bytes of the tiers (cpu_capacity 4 MiB, nothing "
                 "stored yet)", (unsigned long long)attached);
    store_seed(&a, 77);
    assert_int_equal(loaded(&a, 77), BLOCKS * TPP);
    uint64_t stored = tier_backed_bytes(srv);
    assert_true(stored >= attached + BLOCKS * 8192u); /* the store's slots are backed */
    assert_true(stored < (1u << 20));
    engine_close(&a);
    engine_close(&b);
    stop_server(srv, path);
}

/* A worker that stores and detaches: its store is checked by the server
 * after END was answered, so detach settles it (one STATS round trip), and
 * another client finds every block the moment detach has returned, even
 * when the check is slow (here 300 ms: a starved idle-priority thread).
 * Before, the store became visible only when the check ended, after the
 * worker was gone: the lookup below found nothing. */
static kvt_status child_store_detach(const char *path, void *arg)
{
    uint64_t seed = *(uint64_t *)arg;
    engine e;
    kvt_status st = engine_open(&e, path, 2);
    uint32_t tokens[NTOK];
    kvt_request r;
    request(&r, tokens, seed);
    kvt_store_plan p = {0};
    if (!st) st = kvt_client_prepare_store(e.cl, &r, &p);
    if (!st && !p.task) st = kvt__fail(KVT_ESTATE, "nothing to store");
    if (!st) st = kvt_emu_fill(e.emu, &r, 0, r.num_tokens, e.pages, PAGES);
    if (!st) st = kvt_client_launch(e.cl, p.task, e.pages, PAGES);
    kvt_task_result res = {0};
    if (!st) st = kvt_client_wait(e.cl, p.task, TIMEOUT_MS, &res);
    if (!st && res.status) st = res.status;
    engine_close(&e); /* no other call first: detach itself must settle the last END */
    return st;
}

static void test_detach_settles_last_store(void **state)
{
    (void)state;
    make_dir();
    char path[300];
    sock_path(path, sizeof path, "settle.sock");
    pid_t srv = start_server(path, NULL);
    uint64_t seed = 77;
    assert_int_equal(reap(spawn(child_store_detach, path, &seed), 20000), 0);
    engine e;
    assert_ok(engine_open(&e, path, 2));
    uint32_t tokens[NTOK];
    kvt_request r;
    request(&r, tokens, seed);
    kvt_match m;
    assert_ok(kvt_client_lookup(e.cl, &r, &m));
    if (m.matched_tokens != BLOCKS * TPP)
        fail_msg("a store whose client detached matched %u of %u tokens right after the detach",
                 m.matched_tokens, BLOCKS * TPP);
    if (m.task) assert_ok(kvt_client_cancel(e.cl, m.task));
    engine_close(&e);
    stop_server(srv, path);
}

/* A server of any geometry whose ssd_capacity its disk cannot hold is
 * refused at start, naming both numbers (before, only the first attach of
 * a geometry found out, and one that fit its share fit nothing more). */
static void test_shared_ssd_beyond_free_space(void **state)
{
    (void)state;
    make_dir();
    char path[300], ssd[300], cap[32];
    sock_path(path, sizeof path, "space.sock");
    sock_path(ssd, sizeof ssd, "ssd");
    assert_int_equal(mkdir(ssd, 0700), 0);
    struct statvfs vfs;
    assert_int_equal(statvfs(ssd, &vfs), 0);
    snprintf(cap, sizeof cap, "%llu", (unsigned long long)vfs.f_bavail * vfs.f_frsize + (64ull << 30));
    const char *const opts[] = {"ssd_capacity", cap, NULL};
    g_opts = opts;
    g_any_geometry = true;
    kvt_server *s = NULL;
    kvt_status st = make_server(&s, path, ssd);
    g_any_geometry = false;
    g_opts = NULL;
    assert_status(st, KVT_ENOSPC);
    assert_non_null(strstr(kvt_last_error(), "lower ssd_capacity or free space"));
    assert_non_null(strstr(kvt_last_error(), cap));
    assert_null(s);
}

/* The SSD tier is shared the same way as the CPU tier: one geometry alone
 * keeps far more than 1/server_max_geometries of ssd_capacity (80 requests
 * of 8 KiB blocks, 5 MiB, past a 2 MiB CPU tier: each geometry had 2 MiB of
 * the 8 MiB before), a second geometry's 5 MiB take the first one's coldest
 * blocks, and the data files never hold more disk than ssd_capacity
 * together. Every load is byte-verified, most of them read back from the
 * SSD into CPU room the other geometry held (both failed before: A had no
 * CPU copy of its own to drop, and io_uring wrote punched-out pages). */
static void test_shared_ssd(void **state)
{
    (void)state;
    make_dir();
    char path[300], ssd[300];
    sock_path(path, sizeof path, "sssd.sock");
    sock_path(ssd, sizeof ssd, "ssd");
    static const char *const opts[] = {"cpu_capacity", "2MiB", NULL};
    g_opts = opts;
    g_any_geometry = true;
    pid_t srv = start_server(path, ssd);
    g_any_geometry = false;
    g_opts = NULL;
    engine a, b;
    assert_ok(engine_open(&a, path, 2)); /* 8 KiB blocks: 64 KiB a request */
    enum { A_REQS = 80, OLD = 40, B_REQS = 40 };
    /* A flush every 8 requests (1 MiB): the SSD writer keeps up however
     * slow the host (TSan beside a make test), so no store finds the 2 MiB
     * CPU tier full of blocks still waiting for their writes. */
    for (uint64_t i = 1; i <= A_REQS; i++) {
        store_seed(&a, 5000 + i);
        if (i % 8 == 0) assert_ok(kvt_client_flush(a.cl, 20000));
    }
    assert_ok(kvt_client_flush(a.cl, 20000));
    kvt_cache_stats sa, sb;
    assert_ok(kvt_client_stats(a.cl, &sa));
    if (sa.ssd_blocks_used * sa.block_bytes <= (2u << 20))
        fail_msg("geometry A alone keeps %llu bytes on the SSD: no more than a 1/4 share of "
                 "ssd_capacity (8 MiB)", (unsigned long long)(sa.ssd_blocks_used * sa.block_bytes));
    for (uint64_t i = 1; i <= A_REQS; i++)
        if (loaded(&a, 5000 + i) != BLOCKS * TPP)
            fail_msg("geometry A's request %llu of %u lost blocks with nobody else on the server",
                     (unsigned long long)i, A_REQS);
    assert_ok(kvt_client_stats(a.cl, &sa));
    assert_true(sa.ssd_hit_tokens > 0); /* past the CPU tier: read back from the SSD */
    for (uint64_t i = OLD + 1; i <= A_REQS; i++) loaded(&a, 5000 + i); /* the first OLD go cold */

    assert_ok(engine_open(&b, path, 4)); /* 16 KiB blocks: 128 KiB a request, 5 MiB in all */
    for (uint64_t i = 1; i <= B_REQS; i++) {
        store_seed(&b, 6000 + i);
        if (i % 4 == 0) assert_ok(kvt_client_flush(b.cl, 20000)); /* 512 KiB */
    }
    assert_ok(kvt_client_flush(b.cl, 20000));
    for (uint64_t i = 1; i <= B_REQS; i++) {
        uint32_t got = loaded(&b, 6000 + i);
        if (got == BLOCKS * TPP) continue;
        assert_ok(kvt_client_stats(a.cl, &sa));
        assert_ok(kvt_client_stats(b.cl, &sb));
        fail_msg("geometry B's request %llu loaded %u of %u tokens; A: ssd used %llu written "
                 "%llu write errors %llu evicted %llu cpu dropped %llu; B: ssd used %llu "
                 "written %llu write errors %llu evicted %llu cpu dropped %llu",
                 (unsigned long long)i, got, BLOCKS * TPP,
                 (unsigned long long)sa.ssd_blocks_used, (unsigned long long)sa.ssd_written_blocks,
                 (unsigned long long)sa.ssd_write_errors, (unsigned long long)sa.evicted_blocks,
                 (unsigned long long)sa.cpu_dropped_blocks,
                 (unsigned long long)sb.ssd_blocks_used, (unsigned long long)sb.ssd_written_blocks,
                 (unsigned long long)sb.ssd_write_errors, (unsigned long long)sb.evicted_blocks,
                 (unsigned long long)sb.cpu_dropped_blocks);
    }
    assert_ok(kvt_client_stats(a.cl, &sa));
    assert_ok(kvt_client_stats(b.cl, &sb));
    uint64_t used = sa.ssd_blocks_used * sa.block_bytes + sb.ssd_blocks_used * sb.block_bytes;
    if (used > (8u << 20))
        fail_msg("the geometries keep %llu bytes on the SSD together, over ssd_capacity (8 MiB)",
                 (unsigned long long)used);
    if (sb.ssd_blocks_used * sb.block_bytes < (2u << 20))
        fail_msg("geometry B got %llu bytes of SSD for its 5 MiB",
                 (unsigned long long)(sb.ssd_blocks_used * sb.block_bytes));
    uint64_t disk = kvt__srv_ssd_held(ssd); /* the data files of every geometry */
    assert_true(disk > 0); /* B's blocks at least: ssd and its g... files were read */
    if (disk > (8u << 20) + (256u << 10))
        fail_msg("the data files hold %llu bytes of disk, over ssd_capacity (8 MiB)",
                 (unsigned long long)disk);
    uint32_t old = 0;
    for (uint64_t i = 1; i <= OLD; i++) old += loaded(&a, 5000 + i);
    assert_true(old < OLD * BLOCKS * TPP); /* B's room came from A's coldest */
    for (uint64_t i = A_REQS - 8; i <= A_REQS; i++)
        if (loaded(&a, 5000 + i) != BLOCKS * TPP)
            fail_msg("A's recent request %llu lost blocks to B while colder ones were there "
                     "(A: %llu evicted, %llu SSD write errors; B: %llu evicted, %llu errors; "
                     "old %u)", (unsigned long long)i, (unsigned long long)sa.evicted_blocks,
                     (unsigned long long)sa.ssd_write_errors,
                     (unsigned long long)sb.evicted_blocks,
                     (unsigned long long)sb.ssd_write_errors, old);
    engine_close(&a);
    engine_close(&b);
    stop_server(srv, path);
}

/* Request seed in namespace ns: tokens it loaded (byte-verified) by e, or
 * stored. */
static uint32_t loaded_ns(engine *e, uint64_t seed, const char *ns)
{
    uint32_t tokens[NTOK], matched = 0;
    kvt_request r;
    request(&r, tokens, seed);
    r.ns = ns;
    r.ns_len = (uint32_t)strlen(ns);
    assert_ok(engine_load(e, &r, &matched));
    return matched;
}

static uint32_t stored_ns(engine *e, uint64_t seed, const char *ns)
{
    uint32_t tokens[NTOK], stored = 0;
    kvt_request r;
    request(&r, tokens, seed);
    r.ns = ns;
    r.ns_len = (uint32_t)strlen(ns);
    assert_ok(engine_store(e, &r, &stored));
    return stored;
}

/* server_quotas: a namespace prefix at its quota makes room from its own
 * coldest blocks, never from another namespace's. A busy tenant storing
 * 2.5x the capacity (8 KiB blocks, 1 MiB) leaves a quiet tenant's prefixes
 * whole and keeps its own most recent ones; every loaded byte verified.
 * Malformed rules are refused naming the rule. */
static void test_quota_by_namespace(void **state)
{
    (void)state;
    make_dir();
    char path[300];
    sock_path(path, sizeof path, "quota.sock");
    static const char *const bad[] = {"server_quotas", "busy=0", NULL};
    g_opts = bad;
    kvt_server *s = NULL;
    assert_status(make_server(&s, path, NULL), KVT_EINVAL);
    assert_non_null(strstr(kvt_last_error(), "server_quotas: rule \"busy=0\": \"0\" is not a size"));
    static const char *const opts[] = {"cpu_capacity", "1MiB", "server_quotas",
                                       " busy = 256KiB ; busy-other=1MiB; -=64KiB", NULL};
    g_opts = opts;
    pid_t srv = start_server(path, NULL);
    g_opts = NULL;
    engine e;
    assert_ok(engine_open(&e, path, 2));
    enum { QUIET = 8, BUSY = 20, KEEP = 4 }; /* quota: 32 blocks = 4 requests */
    for (uint64_t i = 0; i < QUIET; i++) assert_int_equal(stored_ns(&e, 3000 + i, "quiet"), BLOCKS * TPP);
    for (uint64_t i = 0; i < BUSY; i++) stored_ns(&e, 4000 + i, "busy-7");
    for (uint64_t i = 0; i < QUIET; i++)
        if (loaded_ns(&e, 3000 + i, "quiet") != BLOCKS * TPP)
            fail_msg("the quiet namespace's request %llu lost blocks to a namespace over its "
                     "quota", (unsigned long long)i);
    for (uint64_t i = BUSY - KEEP; i < BUSY; i++)
        if (loaded_ns(&e, 4000 + i, "busy-7") != BLOCKS * TPP)
            fail_msg("busy's request %llu of %u, among its last %u, is not whole: a namespace at "
                     "its quota should evict its own coldest first", (unsigned long long)i, BUSY,
                     KEEP);
    assert_int_equal(loaded_ns(&e, 4000, "busy-7"), 0); /* its coldest went */
    kvt_cache_stats cs;
    assert_ok(kvt_client_stats(e.cl, &cs));
    if (cs.cpu_blocks_used > QUIET * BLOCKS + 32)
        fail_msg("%llu blocks held: the busy namespace went past its 32-block quota",
                 (unsigned long long)cs.cpu_blocks_used);
    /* What kvtier stats shows: each rule's use, without attaching. */
    kvt_quota_usage q[4];
    uint32_t nq = 0;
    assert_ok(kvt_server_quotas(path, TIMEOUT_MS, q, 4, &nq));
    assert_int_equal(nq, 3);
    assert_string_equal(q[0].prefix, "busy");
    assert_string_equal(q[2].prefix, "-");
    assert_int_equal(q[0].limit_bytes, 256 << 10);
    assert_int_equal(q[0].used_bytes, 256 << 10); /* full: it made room from its own */
    assert_int_equal(q[0].evicted_blocks, (BUSY - KEEP) * BLOCKS);
    assert_int_equal(q[1].used_bytes, 0);
    /* The same in kvtier stats' one reading, the header agreeing. */
    kvt_quota_usage q2[2];
    kvt_server_info si;
    uint32_t nq2 = 0;
    assert_ok(kvt_server_snapshot(path, NULL, TIMEOUT_MS, &si, NULL, 0, NULL, q2, 2, &nq2));
    assert_int_equal(nq2, 3); /* how many it has; two written */
    assert_int_equal(si.quotas, 3);
    assert_string_equal(q2[0].prefix, "busy");
    assert_int_equal(q2[0].used_bytes, 256 << 10);
    assert_int_equal(q2[0].evicted_blocks, (BUSY - KEEP) * BLOCKS);
    assert_status(kvt_server_quotas(path, 0, q, 4, &nq), KVT_EINVAL);
    assert_non_null(strstr(kvt_last_error(), "kvt_server_quotas: timeout_ms is 0"));
    engine_close(&e);
    stop_server(srv, path);
}

/* server_quotas with an SSD tier: a busy namespace at its quota gives up
 * CPU copies of its own blocks the SSD holds (its chains' middle blocks,
 * which are never eviction candidates), so its stores are not cut short
 * and every one of its requests still loads whole, from the SSD where its
 * copy went; the quiet namespace keeps its CPU copies (no SSD hit). */
static void test_quota_with_ssd(void **state)
{
    (void)state;
    make_dir();
    char path[300], ssd[300];
    sock_path(path, sizeof path, "qssd.sock");
    sock_path(ssd, sizeof ssd, "ssd");
    static const char *const opts[] = {"cpu_capacity", "1MiB", "server_quotas", "busy=256KiB",
                                       NULL};
    g_opts = opts;
    pid_t srv = start_server(path, ssd);
    g_opts = NULL;
    engine e;
    assert_ok(engine_open(&e, path, 2));
    enum { QUIET = 8, BUSY = 12 };
    for (uint64_t i = 0; i < QUIET; i++) assert_int_equal(stored_ns(&e, 5000 + i, "quiet"), BLOCKS * TPP);
    assert_ok(kvt_client_flush(e.cl, TIMEOUT_MS));
    for (uint64_t i = 0; i < BUSY; i++) {
        if (stored_ns(&e, 6000 + i, "busy-1") != BLOCKS * TPP)
            fail_msg("busy's store %llu was cut short: its copies on the SSD could have made "
                     "room", (unsigned long long)i);
        assert_ok(kvt_client_flush(e.cl, TIMEOUT_MS)); /* durable: its copies may go */
    }
    kvt_cache_stats before, after;
    assert_ok(kvt_client_stats(e.cl, &before));
    for (uint64_t i = 0; i < QUIET; i++) assert_int_equal(loaded_ns(&e, 5000 + i, "quiet"), BLOCKS * TPP);
    assert_ok(kvt_client_stats(e.cl, &after));
    assert_int_equal(after.ssd_hit_tokens, before.ssd_hit_tokens); /* quiet: all from CPU */
    for (uint64_t i = 0; i < BUSY; i++) assert_int_equal(loaded_ns(&e, 6000 + i, "busy-1"), BLOCKS * TPP);
    kvt_quota_usage q;
    uint32_t nq = 0;
    assert_ok(kvt_server_quotas(path, TIMEOUT_MS, &q, 1, &nq));
    assert_true(q.used_bytes <= q.limit_bytes);
    assert_int_equal(q.limited_blocks, 0);
    assert_true(q.evicted_blocks > 0);
    engine_close(&e);
    stop_server(srv, path);
}

/* server_quotas across geometries: a namespace's quota counts its bytes
 * in every geometry, so it makes room from its own blocks in any of them.
 * busy fills its 256 KiB in geometry A (8 KiB blocks), then stores in
 * geometry B (16 KiB blocks), where it holds nothing yet: B's stores are
 * whole (its coldest blocks in A went), byte-verified, and busy stays at
 * its quota; the quiet namespace loses nothing. */
static void test_quota_across_geometries(void **state)
{
    (void)state;
    make_dir();
    char path[300];
    sock_path(path, sizeof path, "qgeo.sock");
    static const char *const opts[] = {"cpu_capacity", "4MiB", "server_quotas", "busy=256KiB",
                                       NULL};
    g_opts = opts;
    g_any_geometry = true;
    pid_t srv = start_server(path, NULL);
    g_any_geometry = false;
    g_opts = NULL;
    engine a, b;
    assert_ok(engine_open(&a, path, 2)); /* 64 KiB a request: the quota holds 4 */
    enum { QUIET = 4, A_BUSY = 4, B_BUSY = 2 };
    for (uint64_t i = 0; i < QUIET; i++) assert_int_equal(stored_ns(&a, 7000 + i, "quiet"), BLOCKS * TPP);
    for (uint64_t i = 0; i < A_BUSY; i++) assert_int_equal(stored_ns(&a, 7100 + i, "busy"), BLOCKS * TPP);
    assert_ok(engine_open(&b, path, 4)); /* 128 KiB a request */
    for (uint64_t i = 0; i < B_BUSY; i++)
        if (stored_ns(&b, 7200 + i, "busy") != BLOCKS * TPP)
            fail_msg("busy's store %llu in geometry B was cut short: its blocks in geometry A "
                     "count against its quota and could have made room", (unsigned long long)i);
    for (uint64_t i = 0; i < B_BUSY; i++) assert_int_equal(loaded_ns(&b, 7200 + i, "busy"), BLOCKS * TPP);
    for (uint64_t i = 0; i < QUIET; i++) assert_int_equal(loaded_ns(&a, 7000 + i, "quiet"), BLOCKS * TPP);
    uint32_t in_a = 0;
    for (uint64_t i = 0; i < A_BUSY; i++) in_a += loaded_ns(&a, 7100 + i, "busy");
    kvt_quota_usage q;
    uint32_t nq = 0;
    assert_ok(kvt_server_quotas(path, TIMEOUT_MS, &q, 1, &nq));
    assert_int_equal(in_a, 0); /* B's 256 KiB took all of A's */
    assert_int_equal(q.used_bytes, 256 << 10);
    assert_int_equal(q.limited_blocks, 0);
    assert_int_equal(q.evicted_blocks, A_BUSY * BLOCKS);
    engine_close(&a);
    engine_close(&b);
    stop_server(srv, path);
}

/* KVT_REQ_VISIBLE_AT_END: a store's wait returns with the server's
 * verdict, once every other client can find its blocks: three round trips
 * (PREPARE, LAUNCH, END_SYNC), all of them made by the time the wait
 * returns (a store without the flag is reported as soon as its copy ends,
 * its END still to go), no publishing call after. Another client's lookup
 * right after the wait loads every block, byte-verified, and the server's
 * stored count (read on a connection of its own) already holds them. */
static void test_visible_at_end(void **state)
{
    (void)state;
    make_dir();
    char path[300];
    sock_path(path, sizeof path, "vis.sock");
    pid_t srv = start_server(path, NULL);
    engine a, b;
    assert_ok(engine_open(&a, path, 2));
    assert_ok(engine_open(&b, path, 2));
    for (uint64_t seed = 70; seed < 76; seed++) {
        uint32_t tokens[NTOK];
        kvt_request r;
        request(&r, tokens, seed);
        r.flags = KVT_REQ_VISIBLE_AT_END;
        uint64_t before = kvt__client_requests(a.cl);
        kvt_store_plan p;
        assert_ok(kvt_client_prepare_store(a.cl, &r, &p));
        assert_int_equal(p.num_tokens, BLOCKS * TPP);
        assert_ok(kvt_emu_fill(a.emu, &r, 0, r.num_tokens, a.pages, PAGES));
        assert_ok(kvt_client_launch(a.cl, p.task, a.pages, PAGES));
        kvt_task_result res;
        assert_ok(kvt_client_wait(a.cl, p.task, TIMEOUT_MS, &res));
        assert_ok(res.status);
        assert_int_equal(kvt__client_requests(a.cl) - before, 3);
        kvt_tier_stats t;
        uint32_t n = 0;
        assert_ok(kvt_server_tier_stats(path, NULL, TIMEOUT_MS, &t, 1, &n));
        assert_int_equal(t.stats.stored_blocks, (seed - 69) * BLOCKS);
        uint32_t matched = 0;
        r.flags = 0;
        assert_ok(engine_load(&b, &r, &matched));
        assert_int_equal(matched, BLOCKS * TPP);
    }
    engine_close(&a);
    engine_close(&b);
    stop_server(srv, path);
}

/* kvt_server_tier_stats reads only: naming a geometry the server does not
 * hold is KVT_ENOTFOUND naming it and the held ones, and makes no tier
 * (kvtier stats --model used to attach, making one); every tier's figures
 * come apart, by geometry. */
static void test_tier_stats_read_only(void **state)
{
    (void)state;
    make_dir();
    char path[300];
    sock_path(path, sizeof path, "ts.sock");
    g_any_geometry = true;
    pid_t srv = start_server(path, NULL);
    g_any_geometry = false;
    kvt_geometry *g2 = geo_heads(2), *g8 = geo_heads(8);
    kvt_tier_stats t[4];
    uint32_t n = 99;
    assert_status(kvt_server_tier_stats(path, g2, TIMEOUT_MS, t, 4, &n), KVT_ENOTFOUND);
    assert_non_null(strstr(kvt_last_error(), "the server holds no tier for geometry g"));
    assert_non_null(strstr(kvt_last_error(), "it holds: none"));
    assert_ok(kvt_server_tier_stats(path, NULL, TIMEOUT_MS, t, 4, &n));
    assert_int_equal(n, 0); /* the question made no tier */
    /* The server as a whole (kvtier stats' header): asking attaches no
     * client either. */
    kvt_server_info si;
    assert_ok(kvt_server_info_get(path, TIMEOUT_MS, &si));
    assert_string_equal(si.version, KVT_VERSION_STRING);
    assert_int_equal(si.pid, srv);
    assert_int_equal(si.clients, 0);
    assert_int_equal(si.geometries, 0);
    assert_true(si.max_clients >= 1 && si.max_geometries >= 2 && si.cpu_capacity_bytes > 0);
    uint64_t up0 = si.uptime_ms;
    assert_true(up0 < 600000);
    engine a, b;
    assert_ok(engine_open(&a, path, 2));
    assert_ok(engine_open(&b, path, 4));
    assert_ok(kvt_server_info_get(path, TIMEOUT_MS, &si));
    assert_int_equal(si.clients, 2);
    assert_int_equal(si.geometries, 2);
    assert_true(si.uptime_ms >= up0);
    assert_status(kvt_server_info_get(path, 0, &si), KVT_EINVAL);
    assert_non_null(strstr(kvt_last_error(), "kvt_server_info_get: timeout_ms is 0"));
    assert_status(kvt_server_info_get(path, TIMEOUT_MS, NULL), KVT_EINVAL);
    uint32_t tokens[NTOK], stored = 0;
    kvt_request r;
    request(&r, tokens, 61);
    assert_ok(engine_store(&a, &r, &stored));
    assert_int_equal(stored, BLOCKS * TPP);
    uint32_t matched = 0;
    assert_ok(engine_load(&a, &r, &matched));
    assert_int_equal(matched, BLOCKS * TPP);
    assert_ok(kvt_server_tier_stats(path, NULL, TIMEOUT_MS, t, 4, &n));
    assert_int_equal(n, 2);
    kvt_geometry_info info;
    assert_ok(kvt_geometry_info_get(a.geo, &info));
    int ia = t[0].bytes_per_token == info.bytes_per_token ? 0 : 1;
    assert_int_equal(t[ia].bytes_per_token, info.bytes_per_token);
    assert_int_equal(t[ia].num_layers, LAYERS);
    assert_int_equal(t[ia].block_tokens, TPP);
    assert_int_equal(t[ia].stats.stored_blocks, BLOCKS);
    assert_int_equal(t[ia].stats.loaded_blocks, BLOCKS);
    assert_int_equal(t[ia].stats.cpu_blocks_used, BLOCKS);
    assert_int_equal(t[1 - ia].stats.stored_blocks, 0);
    assert_int_equal(t[1 - ia].stats.lookups, 0);
    assert_int_equal(strlen(t[ia].geometry), 17);
    assert_true(t[ia].geometry[0] == 'g' && strcmp(t[0].geometry, t[1].geometry) != 0);
    /* One geometry's tier; one not held names both that are. */
    kvt_tier_stats one;
    assert_ok(kvt_server_tier_stats(path, g2, TIMEOUT_MS, &one, 1, &n));
    assert_int_equal(n, 1);
    assert_string_equal(one.geometry, t[ia].geometry);
    assert_status(kvt_server_tier_stats(path, g8, TIMEOUT_MS, NULL, 0, &n), KVT_ENOTFOUND);
    assert_non_null(strstr(kvt_last_error(), t[0].geometry));
    assert_non_null(strstr(kvt_last_error(), t[1].geometry));
    assert_ok(kvt_server_tier_stats(path, NULL, TIMEOUT_MS, NULL, 0, &n));
    assert_int_equal(n, 2);
    /* All three as one reading (kvtier stats' report): the same tiers,
     * the header counting every tier even when one geometry is asked for,
     * and each part optional. */
    kvt_tier_stats s2[4];
    kvt_quota_usage q[2];
    uint32_t ns = 99, nq = 99;
    memset(&si, 0, sizeof si);
    assert_ok(kvt_server_snapshot(path, NULL, TIMEOUT_MS, &si, s2, 4, &ns, q, 2, &nq));
    assert_int_equal(ns, 2);
    assert_int_equal(nq, 0);
    assert_int_equal(si.geometries, 2);
    assert_int_equal(si.clients, 2);
    assert_int_equal(si.pid, srv);
    assert_int_equal(si.quotas, 0);
    assert_string_equal(s2[ia].geometry, t[ia].geometry);
    assert_int_equal(s2[ia].stats.stored_blocks, BLOCKS);
    assert_int_equal(s2[ia].stats.loaded_blocks, BLOCKS);
    assert_ok(kvt_server_snapshot(path, g2, TIMEOUT_MS, &si, s2, 4, &ns, NULL, 0, NULL));
    assert_int_equal(ns, 1);
    assert_string_equal(s2[0].geometry, t[ia].geometry);
    assert_int_equal(si.geometries, 2);
    assert_ok(kvt_server_snapshot(path, NULL, TIMEOUT_MS, &si, NULL, 0, NULL, NULL, 0, NULL));
    assert_int_equal(si.clients, 2);
    assert_status(kvt_server_snapshot(path, g8, TIMEOUT_MS, &si, NULL, 0, NULL, NULL, 0, NULL),
                  KVT_ENOTFOUND);
    assert_non_null(strstr(kvt_last_error(), t[0].geometry));
    assert_status(kvt_server_snapshot(path, NULL, TIMEOUT_MS, NULL, s2, 4, NULL, NULL, 0, NULL),
                  KVT_EINVAL);
    assert_non_null(strstr(kvt_last_error(),
                           "kvt_server_snapshot: tier_count is NULL but max_tiers is 4"));
    assert_status(kvt_server_snapshot(path, NULL, TIMEOUT_MS, NULL, NULL, 0, NULL, NULL, 2, &nq),
                  KVT_EINVAL);
    assert_non_null(strstr(kvt_last_error(),
                           "kvt_server_snapshot: quotas is NULL but max_quotas is 2"));
    assert_status(kvt_server_snapshot(NULL, NULL, TIMEOUT_MS, &si, NULL, 0, NULL, NULL, 0, NULL),
                  KVT_EINVAL);
    assert_non_null(strstr(kvt_last_error(), "kvt_server_snapshot"));
    engine_close(&a);
    engine_close(&b);
    kvt_geometry_destroy(g2);
    kvt_geometry_destroy(g8);
    stop_server(srv, path);
}

/* CLEAR removes one namespace's blocks from both tiers: its lookups miss
 * after, another namespace's still hit, byte-verified; a namespace with
 * nothing stored removes nothing. */
static void test_clear_namespace(void **state)
{
    (void)state;
    make_dir();
    char path[300], ssd[300];
    sock_path(path, sizeof path, "cl.sock");
    sock_path(ssd, sizeof ssd, "ssd");
    pid_t srv = start_server(path, ssd);
    engine e;
    assert_ok(engine_open(&e, path, 2));
    uint32_t ta[NTOK], tb[NTOK], tc[NTOK], stored = 0, matched = 0, removed = 9, kept = 9;
    kvt_request ra, rb, rc;
    request(&ra, ta, 71); /* "tenant" */
    request(&rb, tb, 72);
    rb.ns = "other";
    rb.ns_len = 5;
    request(&rc, tc, 73); /* "tenant" too: a second chain */
    assert_ok(engine_store(&e, &ra, &stored));
    assert_ok(engine_store(&e, &rb, &stored));
    assert_ok(engine_store(&e, &rc, &stored));
    assert_ok(kvt_client_flush(e.cl, TIMEOUT_MS));
    kvt_cache_stats before, after;
    assert_ok(kvt_client_stats(e.cl, &before));
    assert_int_equal(before.ssd_blocks_used, 3 * BLOCKS);
    /* PEEK_MANY: each request's peek in one round trip, the same answers. */
    uint32_t td[NTOK], got[4], one = 0;
    kvt_request rd, many[4];
    request(&rd, td, 74); /* never stored */
    many[0] = ra, many[1] = rb, many[2] = rd, many[3] = rb;
    many[3].num_tokens = 3 * TPP + 5;
    kvt_status sts[4];
    assert_ok(kvt_client_peek_many(e.cl, many, 4, got, sts));
    for (int i = 0; i < 4; i++) {
        assert_int_equal(sts[i], KVT_OK);
        assert_ok(kvt_client_peek(e.cl, &many[i], &one));
        assert_int_equal(got[i], one);
    }
    assert_int_equal(got[0], BLOCKS * TPP);
    assert_int_equal(got[2], 0);
    assert_int_equal(got[3], 3 * TPP);
    assert_status(kvt_client_peek_many(e.cl, many, 0, got, sts), KVT_EINVAL);
    assert_ok(kvt_client_clear(e.cl, "nobody", 6, &removed, &kept));
    assert_int_equal(removed, 0);
    assert_int_equal(kept, 0);
    assert_ok(kvt_client_clear(e.cl, "tenant", 6, &removed, &kept));
    assert_int_equal(removed, 2 * BLOCKS);
    assert_int_equal(kept, 0);
    assert_ok(kvt_client_stats(e.cl, &after));
    assert_int_equal(after.index_blocks, BLOCKS);
    assert_int_equal(after.cpu_blocks_used, BLOCKS);
    assert_int_equal(after.ssd_blocks_used, BLOCKS);
    assert_ok(kvt_client_peek(e.cl, &ra, &matched));
    assert_int_equal(matched, 0);
    assert_ok(kvt_client_peek(e.cl, &rc, &matched));
    assert_int_equal(matched, 0);
    assert_ok(engine_load(&e, &rb, &matched)); /* byte-verified */
    assert_int_equal(matched, BLOCKS * TPP);
    /* Stored again, it is found again (and cleared again). */
    assert_ok(engine_store(&e, &ra, &stored));
    assert_int_equal(stored, BLOCKS * TPP);
    assert_ok(engine_load(&e, &ra, &matched));
    assert_int_equal(matched, BLOCKS * TPP);
    assert_ok(kvt_client_clear(e.cl, "tenant", 6, &removed, &kept));
    assert_int_equal(removed + kept, BLOCKS);
    engine_close(&e);
    stop_server(srv, path);
    /* After a restart "other" is warm from SSD, "tenant" stays gone. */
    srv = start_server(path, ssd);
    assert_ok(engine_open(&e, path, 2));
    assert_ok(kvt_client_peek(e.cl, &rc, &matched));
    assert_int_equal(matched, 0);
    assert_ok(engine_load(&e, &rb, &matched));
    assert_int_equal(matched, BLOCKS * TPP);
    engine_close(&e);
    stop_server(srv, path);
}

/* CPU ticks (user + system) process pid has used. */
static unsigned long long cpu_ticks(pid_t pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%ld/stat", (long)pid);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *p = strrchr(buf, ')'); /* the comm field may hold spaces */
    assert_non_null(p);
    unsigned long long ut = 0, st = 0;
    assert_int_equal(sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut,
                            &st), 2);
    return ut + st;
}

/* A server out of descriptors (clients waiting in the backlog it cannot
 * accept) backs off instead of spinning in its accept loop at full CPU,
 * logs why once, and still stops on SIGTERM. */
static void test_out_of_descriptors_no_spin(void **state)
{
    (void)state;
    make_dir();
    char path[300];
    sock_path(path, sizeof path, "fd.sock");
    snprintf(g_log_path, sizeof g_log_path, "%s/server.log", g_dir);
    g_fd_slack = 2;
    pid_t srv = start_server(path, NULL);
    g_fd_slack = 0;
    g_log_path[0] = '\0';
    int fds[8];
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    assert_true(strlen(path) < sizeof a.sun_path);
    memcpy(a.sun_path, path, strlen(path) + 1);
    for (int i = 0; i < 8; i++) { /* 2 accepted, the rest wait in the backlog */
        fds[i] = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        assert_true(fds[i] >= 0);
        assert_int_equal(connect(fds[i], (struct sockaddr *)&a, sizeof a), 0);
    }
    struct timespec settle = {0, 200 * 1000000L}, second = {1, 0};
    nanosleep(&settle, NULL);
    unsigned long long t0 = cpu_ticks(srv);
    nanosleep(&second, NULL);
    unsigned long long used = cpu_ticks(srv) - t0;
    long hz = sysconf(_SC_CLK_TCK);
    if (used * 5 > (unsigned long long)hz) /* a spinning loop uses about a core */
        fail_msg("the server used %llu of %ld CPU ticks in 1 s with clients it cannot accept",
                 used, hz);
    char log[8192] = {0};
    char lp[320];
    snprintf(lp, sizeof lp, "%s/server.log", g_dir);
    FILE *f = fopen(lp, "r");
    assert_non_null(f);
    size_t n = fread(log, 1, sizeof log - 1, f);
    fclose(f);
    log[n] = '\0';
    assert_non_null(strstr(log, "cannot accept clients: Too many open files"));
    assert_null(strstr(strstr(log, "cannot accept clients") + 1, "cannot accept clients"));
    for (int i = 0; i < 8; i++) close(fds[i]);
    stop_server(srv, path);
}

/* A local process that opens connections and says nothing. */
static kvt_status child_silent_conns(const char *path, void *arg)
{
    int ready = *(int *)arg;
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    memcpy(a.sun_path, path, strlen(path) + 1);
    for (int i = 0; i < 64; i++) {
        int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0)
            return kvt__fail(KVT_ESYS, "silent connection %d: %s", i, strerror(errno));
    }
    if (write(ready, "r", 1) != 1) return KVT_ESYS;
    pause(); /* holds them until SIGKILLed */
    return KVT_OK;
}

/* 64 connections that never attach (server_max_clients is 64) cost their
 * own small budget, not the engines' slots: an engine attaches, stores
 * and loads byte for byte while they stay open. */
static void test_silent_connections_do_not_lock_out(void **state)
{
    (void)state;
    make_dir();
    char path[300];
    sock_path(path, sizeof path, "silent.sock");
    pid_t srv = start_server(path, NULL);
    int ready[2];
    assert_int_equal(pipe(ready), 0);
    pid_t silent = spawn(child_silent_conns, path, &ready[1]);
    kvt_test_child_track(silent);
    close(ready[1]);
    char c;
    assert_int_equal(read(ready[0], &c, 1), 1);
    close(ready[0]);
    uint64_t seed = 77;
    assert_int_equal(reap(spawn(child_store, path, &seed), 20000), 0);
    assert_int_equal(reap(spawn(child_load, path, &seed), 20000), 0);
    kvt_test_server_forget(silent);
    kill(silent, SIGKILL);
    assert_int_equal(reap(silent, 5000), -SIGKILL);
    stop_server(srv, path);
}

/* A client past server_max_clients hears why: KVT_EFULL naming the
 * option, not the ECONN a refused stranger gets. */
static kvt_status child_full_refused(const char *path, void *arg)
{
    (void)arg;
    engine e;
    kvt_status st = engine_open(&e, path, 2);
    kvt_status out = KVT_OK;
    if (st != KVT_EFULL || !strstr(kvt_last_error(), "server_max_clients (1)"))
        out = kvt__fail(KVT_EINVAL, "second client: %s (%s), want KVT_EFULL naming "
                        "server_max_clients (1)", kvt_status_name(st), kvt_last_error());
    engine_close(&e);
    return out;
}

static void test_full_server_says_so(void **state)
{
    (void)state;
    make_dir();
    char path[300];
    sock_path(path, sizeof path, "full.sock");
    static const char *const opts[] = {"server_max_clients", "1", NULL};
    g_opts = opts;
    pid_t srv = start_server(path, NULL);
    g_opts = NULL;
    int ready[2];
    assert_int_equal(pipe(ready), 0);
    raw_arg a = {ready[1], false, false};
    pid_t holder = spawn(child_raw_store, path, &a); /* attached, then stuck */
    kvt_test_child_track(holder);
    close(ready[1]);
    char c;
    assert_int_equal(read(ready[0], &c, 1), 1);
    close(ready[0]);
    assert_int_equal(reap(spawn(child_full_refused, path, NULL), 20000), 0);
    kvt_test_server_forget(holder);
    kill(holder, SIGKILL);
    assert_int_equal(reap(holder, 5000), -SIGKILL);
    stop_server(srv, path);
}

/* A client speaking another protocol version is answered with this
 * server's version and KVT_EVERSION naming both, not a closed socket a
 * client would take for a dead server (KVT_ECONN). */
static void test_other_version_answered(void **state)
{
    (void)state;
    make_dir();
    char path[300];
    sock_path(path, sizeof path, "ver.sock");
    pid_t srv = start_server(path, NULL);
    int fd = raw_connect(path);
    assert_true(fd >= 0);
    uint8_t h[KVT_SRV_HDR];
    kvt__srv_hdr_encode(h, KVT_SRV_HELLO, 0, 0);
    uint16_t v = KVT_SRV_VERSION + 1;
    memcpy(h + 6, &v, sizeof v);
    assert_int_equal(write(fd, h, sizeof h), (ssize_t)sizeof h);
    kvt_srv_hdr r;
    uint8_t *msg = NULL;
    assert_ok(kvt__srv_recv_frame(fd, &r, &msg, NULL, kvt__deadline_ns(TIMEOUT_MS)));
    assert_int_equal(r.status, KVT_EVERSION);
    assert_non_null(msg);
    char text[KVT_SRV_MAX_ERRMSG + 1] = {0};
    memcpy(text, msg, r.len < KVT_SRV_MAX_ERRMSG ? r.len : KVT_SRV_MAX_ERRMSG);
    char want[64];
    snprintf(want, sizeof want, "protocol version %u", KVT_SRV_VERSION + 1);
    if (!strstr(text, want) || !strstr(text, "upgrade the client and the server together"))
        fail_msg("the answer: %s", text);
    free(msg);
    close(fd);
    stop_server(srv, path);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_store_in_a_load_in_b, close_and_kill),
        cmocka_unit_test_teardown(test_attach_detach_logged, close_and_kill),
        cmocka_unit_test_teardown(test_metrics_clients_and_pins, close_and_kill),
        cmocka_unit_test_teardown(test_geometry_mismatch_refused, close_and_kill),
        cmocka_unit_test_teardown(test_second_server_refused, close_and_kill),
        cmocka_unit_test_teardown(test_same_prefix_one_owner, close_and_kill),
        cmocka_unit_test_teardown(test_sigkill_mid_store, close_and_kill),
        cmocka_unit_test_teardown(test_sigkill_mid_load, close_and_kill),
        cmocka_unit_test_teardown(test_bad_checksum_never_served, close_and_kill),
        cmocka_unit_test_teardown(test_scribbled_block_never_served, close_and_kill),
        cmocka_unit_test_teardown(test_server_killed_econn, close_and_kill),
        cmocka_unit_test_teardown(test_restart_warm_from_ssd, close_and_kill),
        cmocka_unit_test_teardown(test_load_cut_by_corrupt_ssd_block, close_and_kill),
        cmocka_unit_test_teardown(test_load_of_corrupt_first_ssd_block, close_and_kill),
        cmocka_unit_test_teardown(test_ssd_load_launch_async, close_and_kill),
        cmocka_unit_test_teardown(test_read_bound_option, close_and_kill),
        cmocka_unit_test(test_launch_reply_flags),
        cmocka_unit_test(test_hello_version_names_sender),
        cmocka_unit_test_teardown(test_plans_expire_and_quota, close_and_kill),
        cmocka_unit_test_teardown(test_peek_pins_nothing, close_and_kill),
        cmocka_unit_test_teardown(test_client_reattaches, close_and_kill),
        cmocka_unit_test_teardown(test_keyed_store_in_a_load_in_b, close_and_kill),
        cmocka_unit_test_teardown(test_keyed_bad_key_refused, close_and_kill),
        cmocka_unit_test_teardown(test_socket_group, close_and_kill),
        cmocka_unit_test_teardown(test_namespace_rules, close_and_kill),
        cmocka_unit_test_teardown(test_secret, close_and_kill),
        cmocka_unit_test_teardown(test_stuck_client_cut_off, close_and_kill),
        cmocka_unit_test_teardown(test_server_killed_mid_load, close_and_kill),
        cmocka_unit_test_teardown(test_reattach_frees_fenced_blocks, close_and_kill),
        cmocka_unit_test_teardown(test_any_geometry, close_and_kill),
        cmocka_unit_test_teardown(test_shared_capacity, close_and_kill),
        cmocka_unit_test_teardown(test_attach_leaves_shared_tier_sparse, close_and_kill),
        cmocka_unit_test_teardown(test_shared_ssd, close_and_kill),
        cmocka_unit_test_teardown(test_detach_settles_last_store, close_and_kill),
        cmocka_unit_test_teardown(test_shared_ssd_beyond_free_space, close_and_kill),
        cmocka_unit_test_teardown(test_tier_stats_read_only, close_and_kill),
        cmocka_unit_test_teardown(test_quota_by_namespace, close_and_kill),
        cmocka_unit_test_teardown(test_visible_at_end, close_and_kill),
        cmocka_unit_test_teardown(test_quota_with_ssd, close_and_kill),
        cmocka_unit_test_teardown(test_quota_across_geometries, close_and_kill),
        cmocka_unit_test_teardown(test_clear_namespace, close_and_kill),
        cmocka_unit_test_teardown(test_out_of_descriptors_no_spin, close_and_kill),
        cmocka_unit_test_teardown(test_silent_connections_do_not_lock_out, close_and_kill),
        cmocka_unit_test_teardown(test_full_server_says_so, close_and_kill),
        cmocka_unit_test_teardown(test_other_version_answered, close_and_kill),
    };
    return kvt_test_dirs_done(cmocka_run_group_tests(tests, NULL, NULL));
}
