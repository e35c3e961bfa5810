#include "support.h"

#include <dirent.h>
#include <fcntl.h>
#include <ftw.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "net/stream.h"
#include "util/clock.h"
#include "util/hash.h"

kvt_geometry *kvt_test_geometry(uint32_t layers, uint32_t heads, uint32_t head_dim,
                                uint32_t tokens_per_page, kvt_layout layout)
{
    kvt_geometry *g = NULL;
    if (kvt_geometry_create(&g, layers, tokens_per_page, layout) != KVT_OK) return NULL;
    kvt_layer_spec s = {.num_components = 2,
                        .component = {{heads, head_dim, 2}, {heads, head_dim, 2}}};
    if (kvt_geometry_set_layers(g, 0, layers, &s) != KVT_OK) {
        kvt_geometry_destroy(g);
        return NULL;
    }
    return g;
}

kvt_geometry *kvt_test_small_geo(void)
{
    kvt_geometry *g = kvt_test_geometry(KVT_TEST_SMALL_LAYERS, 2, 8, KVT_TEST_SMALL_TPP,
                                        KVT_LAYOUT_LAYER_FIRST);
    assert_non_null(g);
    return g;
}

kvt_config *kvt_test_small_config(const char *ssd_dir)
{
    kvt_config *cfg = NULL;
    assert_ok(kvt_config_create(&cfg));
    assert_ok(kvt_config_set(cfg, "cpu_capacity", "256KiB"));
    assert_ok(kvt_config_set(cfg, "huge_pages", "false"));
    assert_ok(kvt_config_set(cfg, "block_tokens", "4"));
    assert_ok(kvt_config_set(cfg, "workers", "1"));
    assert_ok(kvt_config_set(cfg, "max_tasks", "16"));
    if (ssd_dir) {
        assert_ok(kvt_config_set(cfg, "ssd_dirs", ssd_dir));
        assert_ok(kvt_config_set(cfg, "ssd_capacity", "256KiB"));
    }
    return cfg;
}

void kvt_test_tokens(uint32_t *tokens, uint32_t n, uint64_t seed)
{
    uint64_t st = seed;
    for (uint32_t i = 0; i < n; i++) tokens[i] = (uint32_t)(kvt__splitmix64(&st) % 128000);
}

void kvt_test_cache_fx_init(kvt_test_cache_fx *f, kvt_config *cfg)
{
    memset(f, 0, sizeof *f);
    f->cfg = cfg;
    f->geo = kvt_test_small_geo();
    assert_ok(kvt_cache_create(&f->cache, f->cfg, f->geo));
    assert_ok(kvt_emu_create(&f->emu, f->geo, KVT_TEST_SMALL_PAGES));
    assert_ok(kvt_emu_memory(f->emu, &f->mem));
    assert_ok(kvt_cache_register_memory(f->cache, &f->mem));
    kvt_test_tokens(f->tokens, 13, 99);
    f->req = (kvt_request){f->tokens, 13, "ns", 2};
    for (uint32_t i = 0; i < 4; i++) f->pages[i] = 2 * i + 1;
    assert_ok(kvt_emu_fill(f->emu, &f->req, 0, 13, f->pages, 4));
}

void kvt_test_cache_fx_fini(kvt_test_cache_fx *f)
{
    kvt_cache_destroy(f->cache);
    kvt_emu_destroy(f->emu);
    kvt_geometry_destroy(f->geo);
    kvt_config_destroy(f->cfg);
}

atomic_int kvt_test_soft_failures;

void kvt_test_check_err(const char *expr, const char *file, int line, kvt_status got,
                        kvt_status want, const char *const *needles)
{
    const char *msg = kvt_last_error();
    if (got != want) {
        print_error("%s:%d: %s returned %s (\"%s\"), want %s\n", file, line, expr,
                    kvt_status_name(got), msg, kvt_status_name(want));
        atomic_fetch_add(&kvt_test_soft_failures, 1);
        return;
    }
    if (msg == NULL || msg[0] == '\0') {
        print_error("%s:%d: %s: kvt_last_error() is empty\n", file, line, expr);
        atomic_fetch_add(&kvt_test_soft_failures, 1);
        return;
    }
    for (const char *const *n = needles; *n; n++) {
        if (!strstr(msg, *n)) {
            print_error("%s:%d: %s: message \"%s\" lacks \"%s\"\n", file, line, expr, msg, *n);
            atomic_fetch_add(&kvt_test_soft_failures, 1);
        }
    }
}

#define KVT_TEST_MAX_DIRS 64
static char g_dirs[KVT_TEST_MAX_DIRS][256];
static int g_ndirs;
static pid_t g_dirs_owner;

void kvt_test_dir_track(const char *path)
{
    if (!g_dirs_owner) g_dirs_owner = getpid();
    if (getpid() != g_dirs_owner || g_ndirs == KVT_TEST_MAX_DIRS) return; /* kept */
    snprintf(g_dirs[g_ndirs++], sizeof g_dirs[0], "%s", path);
}

static int rm_one(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(p);
}

int kvt_test_dirs_done(int rc)
{
    if (getpid() != g_dirs_owner) return rc;
    for (int i = 0; i < g_ndirs; i++) {
        if (rc == 0)
            nftw(g_dirs[i], rm_one, 16, FTW_DEPTH | FTW_PHYS);
        else
            fprintf(stderr, "a test failed: its scratch directory is kept: %s\n", g_dirs[i]);
    }
    return rc;
}

void kvt_test_mkdtemp(char *out, size_t len, const char *prefix)
{
    const char *base = getenv("KVTIER_TEST_TMP");
    if (!base) base = "/tmp";
    mkdir(base, 0700);
    snprintf(out, len, "%s/%sXXXXXX", base, prefix);
    assert_non_null(mkdtemp(out));
    kvt_test_dir_track(out);
}

void kvt_test_inproc_pair(kvt_fabric **fab, kvt_net *n[2])
{
    assert_ok(kvt_fabric_create(fab, 2, 16));
    assert_ok(kvt_net_inproc_create(&n[0], *fab, 0));
    assert_ok(kvt_net_inproc_create(&n[1], *fab, 1));
}

void kvt_test_inproc_pair_destroy(kvt_fabric *fab, kvt_net *n[2])
{
    kvt_net_destroy(n[0]);
    kvt_net_destroy(n[1]);
    kvt_fabric_destroy(fab);
}

void kvt_test_nofile_low(struct rlimit *old)
{
    assert_int_equal(getrlimit(RLIMIT_NOFILE, old), 0);
    int probe = open("/dev/null", O_RDONLY | O_CLOEXEC);
    assert_true(probe >= 0);
    close(probe);
    struct rlimit low = *old;
    low.rlim_cur = (rlim_t)probe;
    assert_int_equal(setrlimit(RLIMIT_NOFILE, &low), 0);
}

static void *hub_wait_main(void *arg)
{
    kvt_test_hub_wait *w = arg;
    w->st = kvt_net_connect(w->hub, w->ms);
    return NULL;
}

void kvt_test_hub_wait_start(kvt_test_hub_wait *w, kvt_net *hub, int64_t ms)
{
    *w = (kvt_test_hub_wait){.hub = hub, .ms = ms, .st = KVT_OK};
    assert_int_equal(pthread_create(&w->th, NULL, hub_wait_main, w), 0);
}

kvt_status kvt_test_hub_wait_join(kvt_test_hub_wait *w)
{
    pthread_join(w->th, NULL);
    return w->st;
}

static void *fake_srv_main(void *arg)
{
    kvt_test_fake_srv *s = arg;
    while (!atomic_load(&s->stop)) {
        struct pollfd pf = {s->lfd, POLLIN, 0};
        if (poll(&pf, 1, 20) <= 0) continue;
        int fd = accept4(s->lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) continue;
        /* every attach opens with the server realm's handshake (no secret) */
        kvt_stream_auth a = {.who = "fake server", .realm = &kvt__auth_server};
        if (kvt__stream_auth_server(fd, &a, kvt__deadline_ns(2000)) == KVT_OK) s->serve(s->arg, fd);
        close(fd);
    }
    return NULL;
}

void kvt_test_fake_srv_start(kvt_test_fake_srv *s, const char *tag,
                             void (*serve)(void *arg, int fd), void *arg)
{
    memset(s, 0, sizeof *s);
    s->serve = serve;
    s->arg = arg;
    kvt_test_mkdtemp(s->dir, sizeof s->dir, tag);
    snprintf(s->sock, sizeof s->sock, "%s/fake.sock", s->dir);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    assert_true(strlen(s->sock) < sizeof a.sun_path);
    memcpy(a.sun_path, s->sock, strlen(s->sock) + 1);
    s->lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(s->lfd >= 0);
    assert_int_equal(bind(s->lfd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(s->lfd, 4), 0);
    assert_int_equal(pthread_create(&s->th, NULL, fake_srv_main, s), 0);
}

void kvt_test_fake_srv_stop(kvt_test_fake_srv *s)
{
    atomic_store(&s->stop, true);
    pthread_join(s->th, NULL);
    close(s->lfd);
    unlink(s->sock);
}

unsigned kvt_test_thread_count(void)
{
    DIR *d = opendir("/proc/self/task");
    assert_non_null(d);
    unsigned n = 0;
    for (struct dirent *e; (e = readdir(d));)
        if (e->d_name[0] != '.') n++;
    closedir(d);
    return n;
}

#if defined(__SANITIZE_THREAD__)
#define KVT_TEST_RUNTIME_THREADS 1u
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define KVT_TEST_RUNTIME_THREADS 1u
#endif
#endif
#ifndef KVT_TEST_RUNTIME_THREADS
#define KVT_TEST_RUNTIME_THREADS 0u
#endif

pid_t kvt_test_fork(void)
{
    unsigned n = kvt_test_thread_count();
    for (int i = 0; i < 200 && n > 1 + KVT_TEST_RUNTIME_THREADS; i++) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
        n = kvt_test_thread_count();
    }
    if (n > 1 + KVT_TEST_RUNTIME_THREADS)
        fail_msg("kvt_test_fork: this process runs %u threads; a child forked now can block "
                 "forever in the sanitizer's allocator: fork before creating a cache, client, "
                 "server or net",
                 n - KVT_TEST_RUNTIME_THREADS);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    return pid;
}

#define KVT_TEST_MAX_SERVERS 16
static pid_t g_servers[KVT_TEST_MAX_SERVERS];
static int g_nservers;
static kvt_server *g_child_server; /* in a forked server process */

static void on_term(int sig)
{
    (void)sig;
    kvt_server_stop(g_child_server);
}

static _Noreturn void server_child(int fd, kvt_test_make_server make, void *arg)
{
    sigset_t term, old;
    sigemptyset(&term);
    sigaddset(&term, SIGTERM);
    sigprocmask(SIG_BLOCK, &term, &old);
    signal(SIGTERM, on_term);
    kvt_status st = make(&g_child_server, arg);
    int32_t v = st;
    if (st) fprintf(stderr, "server: %s\n", kvt_last_error());
    if (write(fd, &v, sizeof v) != sizeof v) _exit(3);
    if (st) _exit(2);
    close(fd);
    signal(SIGPIPE, SIG_IGN);
    sigprocmask(SIG_SETMASK, &old, NULL);
    st = kvt_server_run(g_child_server);
    kvt_server_destroy(g_child_server);
    _exit(st ? 1 : 0);
}

pid_t kvt_test_server_fork(kvt_test_make_server make, void *arg)
{
    int p[2];
    assert_int_equal(pipe(p), 0);
    pid_t pid = kvt_test_fork();
    if (pid == 0) {
        close(p[0]);
        server_child(p[1], make, arg);
    }
    close(p[1]);
    if (g_nservers < KVT_TEST_MAX_SERVERS) g_servers[g_nservers++] = pid;
    int32_t v = -99;
    assert_int_equal(read(p[0], &v, sizeof v), (ssize_t)sizeof v);
    close(p[0]);
    assert_int_equal(v, KVT_OK);
    return pid;
}

void kvt_test_child_track(pid_t pid)
{
    if (g_nservers < KVT_TEST_MAX_SERVERS) g_servers[g_nservers++] = pid;
}

void kvt_test_server_forget(pid_t pid)
{
    for (int i = 0; i < g_nservers; i++)
        if (g_servers[i] == pid) g_servers[i--] = g_servers[--g_nservers];
}

void kvt_test_server_stop(pid_t pid, int64_t ms)
{
    kvt_test_server_forget(pid);
    kill(pid, SIGTERM);
    int ws = 0;
    for (int64_t i = 0; i < ms; i++) {
        if (waitpid(pid, &ws, WNOHANG) == pid) {
            if (!WIFEXITED(ws) || WEXITSTATUS(ws) != 0)
                fail_msg("server %d ended with wait status 0x%x", (int)pid, ws);
            return;
        }
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    fail_msg("server %d did not stop within %lld ms of SIGTERM", (int)pid, (long long)ms);
}

int kvt_test_servers_kill(void **state)
{
    (void)state;
    for (int i = 0; i < g_nservers; i++) {
        kill(g_servers[i], SIGKILL);
        kill(g_servers[i], SIGCONT);
        waitpid(g_servers[i], NULL, 0);
    }
    g_nservers = 0;
    return 0;
}

void kvt_test_pd_fx_init(kvt_test_pd_fx *x, uint32_t connect_timeout_ms,
                         uint32_t peer_timeout_ms)
{
    setenv("KVTIER_PD_QUIET", "1", 0);
    memset(x, 0, sizeof *x);
    x->g = kvt_test_small_geo();
    assert_ok(kvt_emu_create(&x->pe, x->g, KVT_TEST_SMALL_PAGES));
    assert_ok(kvt_emu_create(&x->de, x->g, KVT_TEST_SMALL_PAGES));
    assert_ok(kvt_emu_memory(x->pe, &x->pmem));
    assert_ok(kvt_emu_memory(x->de, &x->dmem));
    assert_ok(kvt_pd_bootstrap_create(&x->bs, &(kvt_pd_net_params){0}));
    uint16_t port = 0;
    assert_ok(kvt_pd_bootstrap_port(x->bs, &port));
    x->p = (kvt_pd_params){.bootstrap_port = port, .rank = {.tp_size = 1}, .geo = x->g,
                           .mem = &x->pmem, .connect_timeout_ms = connect_timeout_ms,
                           .net = {.peer_timeout_ms = peer_timeout_ms}};
}

void kvt_test_pd_fx_fini(kvt_test_pd_fx *x)
{
    kvt_pd_bootstrap_destroy(x->bs);
    kvt_emu_destroy(x->de);
    kvt_emu_destroy(x->pe);
    kvt_geometry_destroy(x->g);
}

/* ---- a cache or a client, the same calls ---- */

kvt_status kvt_test_lookup(const kvt_test_side *s, const kvt_request *r, kvt_match *m)
{
    return s->cache ? kvt_cache_lookup(s->cache, r, m) : kvt_client_lookup(s->cl, r, m);
}

kvt_status kvt_test_peek(const kvt_test_side *s, const kvt_request *r, uint32_t *tokens)
{
    return s->cache ? kvt_cache_peek(s->cache, r, tokens) : kvt_client_peek(s->cl, r, tokens);
}

kvt_status kvt_test_prepare(const kvt_test_side *s, const kvt_request *r, kvt_store_plan *p)
{
    return s->cache ? kvt_cache_prepare_store(s->cache, r, p)
                    : kvt_client_prepare_store(s->cl, r, p);
}

kvt_status kvt_test_launch(const kvt_test_side *s, kvt_task_id t, const uint32_t *pages,
                           uint32_t n)
{
    return s->cache ? kvt_cache_launch(s->cache, t, pages, n) : kvt_client_launch(s->cl, t, pages, n);
}

kvt_status kvt_test_wait(const kvt_test_side *s, kvt_task_id t, int64_t ms, kvt_task_result *res)
{
    return s->cache ? kvt_cache_wait(s->cache, t, ms, res) : kvt_client_wait(s->cl, t, ms, res);
}

kvt_status kvt_test_wait_layer(const kvt_test_side *s, kvt_task_id t, uint32_t layer, int64_t ms)
{
    return s->cache ? kvt_cache_wait_layer(s->cache, t, layer, ms)
                    : kvt_client_wait_layer(s->cl, t, layer, ms);
}

kvt_status kvt_test_cancel(const kvt_test_side *s, kvt_task_id t)
{
    return s->cache ? kvt_cache_cancel(s->cache, t) : kvt_client_cancel(s->cl, t);
}
