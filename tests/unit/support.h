/* support.h - helpers shared by the unit tests (cmocka). */
#ifndef KVT_TESTS_SUPPORT_H
#define KVT_TESTS_SUPPORT_H

#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/resource.h>
#include <sys/types.h>
#include <cmocka.h>
#include "kvtier.h"

/* Asserts a kvtier call returned want, printing kvt_last_error() if not. */
#define assert_status(call, want)                                                   \
    do {                                                                            \
        kvt_status st_ = (call);                                                    \
        if (st_ != (want))                                                          \
            fail_msg("%s returned %s (%s), want %s", #call, kvt_status_name(st_),   \
                     kvt_last_error(), kvt_status_name(want));                      \
    } while (0)
#define assert_ok(call) assert_status(call, KVT_OK)

/* Error-path checks that report every mismatch and go on (the
 * test_api_errors*.c files; scripts/status_map.py --coverage reads them):
 * EXPECT_ERR(call, KVT_X, needle...) checks the status, that
 * kvt_last_error() is non-empty and that it holds every needle (at least
 * one); EXPECT_OK(call) checks KVT_OK. Each mismatch is printed and
 * counted; END_CHECKS() fails the test when any was. */
extern atomic_int kvt_test_soft_failures; /* any thread may check */
void kvt_test_check_err(const char *expr, const char *file, int line, kvt_status got,
                        kvt_status want, const char *const *needles);

#define EXPECT_ERR(call, want, ...)                                               \
    do {                                                                          \
        const char *const needles_[] = {__VA_ARGS__, NULL};                       \
        kvt_test_check_err(#call, __FILE__, __LINE__, (call), (want), needles_);  \
    } while (0)

#define EXPECT_OK(call)                                                           \
    do {                                                                          \
        kvt_status st_ = (call);                                                  \
        if (st_ != KVT_OK) {                                                      \
            print_error("%s:%d: %s returned %s (%s), want KVT_OK\n", __FILE__,    \
                        __LINE__, #call, kvt_status_name(st_), kvt_last_error()); \
            atomic_fetch_add(&kvt_test_soft_failures, 1);                         \
        }                                                                         \
    } while (0)

#define END_CHECKS()                                                              \
    do {                                                                          \
        int n_ = atomic_exchange(&kvt_test_soft_failures, 0);                     \
        if (n_) fail_msg("%d check(s) failed (see above)", n_);                   \
    } while (0)

/* A small uniform geometry: layers x (K,V) x heads x head_dim, 2-byte elems. */
kvt_geometry *kvt_test_geometry(uint32_t layers, uint32_t heads, uint32_t head_dim,
                                uint32_t tokens_per_page, kvt_layout layout);
/* The small geometry the API error tests share: KVT_TEST_SMALL_LAYERS
 * layers x (K, V) x 2 heads x 8 dims x 2 bytes, KVT_TEST_SMALL_TPP tokens a
 * page (128 bytes a token), layer-first; their emulated engines hold
 * KVT_TEST_SMALL_PAGES pages. Fails the test if it cannot be made. */
#define KVT_TEST_SMALL_LAYERS 2u
#define KVT_TEST_SMALL_TPP 4u
#define KVT_TEST_SMALL_PAGES 8u
kvt_geometry *kvt_test_small_geo(void);
/* A config for small, fast caches (256 KiB CPU tier, no huge pages, blocks
 * of 4 tokens, 1 worker, 16 tasks); ssd_dir: the SSD tier's directory
 * (256 KiB) or NULL for none. Fails the test on any error. */
kvt_config *kvt_test_small_config(const char *ssd_dir);
/* Deterministic token ids: tokens[i] = f(seed, i). */
void kvt_test_tokens(uint32_t *tokens, uint32_t n, uint64_t seed);

/* A PD set-up for the error tests: a bootstrap service on an ephemeral
 * port, kvt_test_small_geo, an emulated engine of KVT_TEST_SMALL_PAGES
 * pages per side (pe/pmem: prefill, de/dmem: decode) and params for one
 * rank of TP 1 naming the prefill memory (a test sets p.mem = &dmem for a
 * receiver). kvt_test_pd_fx_fini frees what init made. */
typedef struct kvt_test_pd_fx {
    kvt_geometry *g;
    kvt_emu *pe, *de;
    kvt_engine_memory pmem, dmem;
    kvt_pd_bootstrap *bs;
    kvt_pd_params p;
} kvt_test_pd_fx;
void kvt_test_pd_fx_init(kvt_test_pd_fx *x, uint32_t connect_timeout_ms,
                         uint32_t peer_timeout_ms);
void kvt_test_pd_fx_fini(kvt_test_pd_fx *x);

/* A cache over an emulated engine of KVT_TEST_SMALL_PAGES pages of
 * kvt_test_small_geo, its memory registered, and one request of 13
 * tokens (namespace "ns": 3 full blocks of 4) filled into pages 1, 3, 5,
 * 7. kvt_test_cache_fx_init takes cfg (kvt_test_small_config or a test's
 * own) and fails the test on any error; kvt_test_cache_fx_fini frees all. */
typedef struct kvt_test_cache_fx {
    kvt_config *cfg;
    kvt_geometry *geo;
    kvt_emu *emu;
    kvt_engine_memory mem;
    kvt_cache *cache;
    uint32_t tokens[13];
    kvt_request req;
    uint32_t pages[4];
} kvt_test_cache_fx;
void kvt_test_cache_fx_init(kvt_test_cache_fx *f, kvt_config *cfg);
void kvt_test_cache_fx_fini(kvt_test_cache_fx *f);

/* Scratch directories a test program made (at most 64 are tracked): when
 * every test passed, kvt_test_dirs_done removes them; when one failed it
 * keeps them for the post-mortem and names them on stderr. Call it last in
 * main with the result of cmocka_run_group_tests; returns rc. Only the
 * process that first tracked a directory removes anything (forked children
 * never do). */
void kvt_test_dir_track(const char *path);
int kvt_test_dirs_done(int rc);

/* A fresh scratch directory <$KVTIER_TEST_TMP or /tmp>/<prefix>XXXXXX,
 * tracked (removed when every test passed). */
void kvt_test_mkdtemp(char *out, size_t len, const char *prefix);

/* Two in-process ranks, n[0] and n[1], over one new fabric of 16 slots;
 * kvt_test_inproc_pair_destroy frees all three. */
void kvt_test_inproc_pair(kvt_fabric **fab, kvt_net *n[2]);
void kvt_test_inproc_pair_destroy(kvt_fabric *fab, kvt_net *n[2]);

/* No descriptor left: makes the lowest free descriptor the soft
 * RLIMIT_NOFILE, so the next socket() or open() fails with EMFILE; the
 * limit it replaced goes to *old (restore it with setrlimit). */
void kvt_test_nofile_low(struct rlimit *old);

/* A TCP hub waiting in kvt_net_connect(hub, ms) on a thread of its own
 * while the test connects (or fails to connect) a member:
 * kvt_test_hub_wait_start starts it, kvt_test_hub_wait_join joins it and
 * returns that kvt_net_connect's status for the test to check. */
typedef struct kvt_test_hub_wait {
    kvt_net *hub;
    int64_t ms;
    kvt_status st;
    pthread_t th;
} kvt_test_hub_wait;
void kvt_test_hub_wait_start(kvt_test_hub_wait *w, kvt_net *hub, int64_t ms);
kvt_status kvt_test_hub_wait_join(kvt_test_hub_wait *w);

/* A fake kvtier server for client tests: a Unix socket <dir>/fake.sock in
 * a fresh scratch directory (kvt_test_mkdtemp(tag)) and a thread that
 * accepts one connection at a time (polling 20 ms for stop), passes the
 * server realm's handshake (no secret, 2 s), hands the connection to
 * serve(arg, fd) and closes it when serve returns. kvt_test_fake_srv_stop
 * ends the thread, closes and unlinks the socket. */
typedef struct kvt_test_fake_srv {
    char dir[200], sock[240];
    int lfd;
    atomic_bool stop;
    pthread_t th;
    void (*serve)(void *arg, int fd);
    void *arg;
} kvt_test_fake_srv;
void kvt_test_fake_srv_start(kvt_test_fake_srv *s, const char *tag,
                             void (*serve)(void *arg, int fd), void *arg);
void kvt_test_fake_srv_stop(kvt_test_fake_srv *s);

/* A cache in this process or a client of a node server (exactly one set):
 * the same calls on either, so one test body runs both ways. */
typedef struct kvt_test_side {
    kvt_cache *cache;
    kvt_client *cl;
} kvt_test_side;
kvt_status kvt_test_lookup(const kvt_test_side *s, const kvt_request *r, kvt_match *m);
kvt_status kvt_test_peek(const kvt_test_side *s, const kvt_request *r, uint32_t *tokens);
kvt_status kvt_test_prepare(const kvt_test_side *s, const kvt_request *r, kvt_store_plan *p);
kvt_status kvt_test_launch(const kvt_test_side *s, kvt_task_id t, const uint32_t *pages,
                           uint32_t n);
kvt_status kvt_test_wait(const kvt_test_side *s, kvt_task_id t, int64_t ms, kvt_task_result *res);
kvt_status kvt_test_wait_layer(const kvt_test_side *s, kvt_task_id t, uint32_t layer, int64_t ms);
kvt_status kvt_test_cancel(const kvt_test_side *s, kvt_task_id t);

/* fork() for tests. Fails the test, naming the thread count, when this
 * process runs more than one thread: a sanitizer runtime (GCC 12's libasan)
 * does not lock its allocator around fork(), so a child forked while another
 * thread held that lock blocks forever at its first allocation (about one
 * ASan run in eight hung that way). Fork first, then create caches, clients
 * and servers. A thread that was just joined may linger in /proc/self/task
 * for a moment, so the count is retried for up to 200 ms. Under TSan its own
 * background thread (which its fork handling stops) is not counted. Flushes
 * stdio first so nothing buffered is written twice. */
pid_t kvt_test_fork(void);
/* The threads of this process, from /proc/self/task. */
unsigned kvt_test_thread_count(void);

/* Server processes for tests. kvt_test_server_fork forks a child that calls
 * make(&srv, arg), reports its status through a pipe and then runs the
 * server until SIGTERM (kvt_server_stop; SIGTERM is held back until there
 * is a server to stop). It returns the child's pid once the server listens,
 * and fails the test when make failed. Every forked server is remembered
 * until it is stopped: kvt_test_servers_kill (a cmocka teardown) kills and
 * reaps the rest, so a failed test never leaves one running.
 * kvt_test_server_stop sends SIGTERM and fails the test unless the server
 * exits with status 0 within ms. */
typedef kvt_status (*kvt_test_make_server)(kvt_server **out, void *arg);
pid_t kvt_test_server_fork(kvt_test_make_server make, void *arg);
void kvt_test_server_stop(pid_t pid, int64_t ms);
/* For a test that ends a server itself (SIGKILL, a crash): not killed by
 * kvt_test_servers_kill any more. */
void kvt_test_server_forget(pid_t pid);
/* Any other child that must not outlive a failed test (a hostile peer
 * paused until killed): kvt_test_servers_kill kills and reaps it too. */
void kvt_test_child_track(pid_t pid);
int kvt_test_servers_kill(void **state);

#endif
