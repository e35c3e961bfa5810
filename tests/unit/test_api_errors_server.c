/* test_api_errors_server.c - the node server's and its clients' statuses,
 * and the cache's CUDA layer events, each from a real cause (see
 * test_api_errors.c for the argument checks; scripts/status_map.py
 * --coverage reads every test_api_errors*.c):
 *  - SSD writes held (kvt__ssd_hold_writes, as a slow device): a client's
 *    flush and the server's stop both pass their deadline (KVT_ETIMEDOUT);
 *  - SSD reads held (kvt__ssd_hold_reads) on a server reopened on those
 *    blocks: a client's launched load pends, so its wait_layer times out
 *    (and with no thread to finish it, the launch fails: KVT_ESYS);
 *  - server_secret_file and server_namespaces: KVT_EAUTH at attach and at
 *    lookup / prepare_store / peek;
 *  - over the fake CUDA runtime (tests/fake_cudart.c; ctest sets
 *    KVTIER_CUDART): kvt_cache_layer_event and kvt_cache_stream_wait_layer
 *    on an unknown, a planned, a reading and a loaded task, and a stream
 *    the runtime refuses; kvt_cache_register_memory of device memory when
 *    the CPU tier cannot be pinned or an allocation fails;
 *  - a child denied io_uring (seccomp, as in a container) with the SSD
 *    tier's io option forcing it: KVT_EUNSUPPORTED at cache and server create;
 *  - a metrics endpoint at an address no interface has: KVT_ESYS;
 *  - a fake server answering a plan, a peek, or the cancel of a planned
 *    task, with what no server gives: KVT_EPROTO; one that holds its
 *    answer to END: a store and a load are reported at their copy's end.
 * Every wait is bounded; a held read or write is released by the test (and
 * by the SSD tier itself after 10 s, so a failing test hangs nothing). */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>

#include "support.h"
#include "cache/cache.h"
#include "cuda/cuda.h"
#include "cuda/cudart.h"
#include "net/stream.h"
#include "server/proto.h"
#include "server/server.h"
#include "store/pool.h"
#include "store/ssd.h"
#include "util/clock.h"

#define WAIT_MS 10000
/* 2 layers x (K, V) x 2 heads x 8 dims x 2 bytes, 4 tokens per page. */
/* kvt_test_small_geo's (support.h): 2 layers, 4 tokens per page. */
#define T_LAYERS KVT_TEST_SMALL_LAYERS
#define T_TPP KVT_TEST_SMALL_TPP
#define T_PAGES KVT_TEST_SMALL_PAGES
#define T_TOKENS 13u /* 3 full blocks of 4 tokens */

/* Allocation failure in this thread: the test links with --wrap=malloc,
 * calloc and realloc (tests/CMakeLists.txt); the allocation that finds the
 * countdown at 0 fails (-1: none does). */
static _Thread_local long alloc_countdown = -1;
void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t size);
void *__real_realloc(void *p, size_t n);
static int alloc_fails(void)
{
    return alloc_countdown >= 0 && alloc_countdown-- == 0;
}
void *__wrap_malloc(size_t n) { return alloc_fails() ? NULL : __real_malloc(n); }
void *__wrap_calloc(size_t n, size_t size) { return alloc_fails() ? NULL : __real_calloc(n, size); }
void *__wrap_realloc(void *p, size_t n) { return alloc_fails() ? NULL : __real_realloc(p, n); }

/* Thread creation failing in this thread (--wrap=pthread_create): the next
 * one fails with EAGAIN, as at the process's thread limit. */
static _Thread_local int thread_fails;
static atomic_int threads_failed; /* how many have failed so far */
int __real_pthread_create(pthread_t *t, const pthread_attr_t *a, void *(*f)(void *), void *arg);
int __wrap_pthread_create(pthread_t *t, const pthread_attr_t *a, void *(*f)(void *), void *arg)
{
    if (thread_fails) {
        thread_fails = 0;
        atomic_fetch_add(&threads_failed, 1);
        return EAGAIN;
    }
    return __real_pthread_create(t, a, f, arg);
}

/* ------------------------------------------------------------------ */
/* Fixtures                                                            */

/* A test's scratch directory (kvt_test_mkdtemp(tag)) and the paths in it
 * the tests use: the SSD tier's directory and the server's socket. */
typedef struct scratch {
    char dir[200], ssd[240], sock[240];
} scratch;

static void scratch_init(scratch *s, const char *tag)
{
    kvt_test_mkdtemp(s->dir, sizeof s->dir, tag);
    snprintf(s->ssd, sizeof s->ssd, "%s/ssd", s->dir);
    snprintf(s->sock, sizeof s->sock, "%s/s.sock", s->dir);
}

/* The request every test stores: T_TOKENS tokens in namespace "ns", its
 * KV filled into pages 1, 3, 5, 7 of an emulated engine. */
typedef struct engine {
    kvt_emu *emu;
    kvt_engine_memory mem;
    uint32_t tokens[T_TOKENS], pages[4];
    kvt_request req;
} engine;

static void engine_init(engine *e, const kvt_geometry *g)
{
    memset(e, 0, sizeof *e);
    assert_ok(kvt_emu_create(&e->emu, g, T_PAGES));
    assert_ok(kvt_emu_memory(e->emu, &e->mem));
    kvt_test_tokens(e->tokens, T_TOKENS, 77);
    e->req = (kvt_request){e->tokens, T_TOKENS, "ns", 2};
    for (uint32_t i = 0; i < 4; i++) e->pages[i] = 2 * i + 1;
    assert_ok(kvt_emu_fill(e->emu, &e->req, 0, T_TOKENS, e->pages, 4));
}

/* A server on its own thread. */
typedef struct srv_fx {
    kvt_server *srv;
    pthread_t th;
    kvt_status run_st;
} srv_fx;

static void *srv_run(void *p)
{
    srv_fx *f = p;
    f->run_st = kvt_server_run(f->srv);
    return NULL;
}

/* ------------------------------------------------------------------ */
/* SSD writes held: a client's flush, then the server's stop, time out  */

typedef struct writer {
    kvt_server *srv;
    const char *sock;
    const kvt_geometry *geo;
    engine *e; /* made by the main thread: cmocka's asserts are its own */
} writer;

/* The client side of test_held_writes, on its own thread while the main
 * thread runs the server: stores the request with the server's SSD writes
 * held, checks kvt_client_flush's deadline, then stops the server. */
static void *held_writes_client(void *arg)
{
    writer *w = arg;
    engine *e = w->e;
    kvt_client *cl = NULL;
    kvt_status st = kvt_client_attach(&cl, w->sock, w->geo, WAIT_MS);
    if (st == KVT_OK) st = kvt_client_register_memory(cl, &e->mem);
    kvt_store_plan p = {0};
    kvt_task_result r = {0};
    kvt__ssd_hold_writes(kvt__srv_shard_first(w->srv)->cache->ssd, true);
    if (st == KVT_OK) st = kvt_client_prepare_store(cl, &e->req, &p);
    if (st == KVT_OK) st = kvt_client_launch(cl, p.task, e->pages, 4);
    if (st == KVT_OK) st = kvt_client_wait(cl, p.task, WAIT_MS, &r);
    if (st != KVT_OK || r.status != KVT_OK || p.num_tokens != 12) {
        print_error("store through the server: %s (%s), result %s, %u tokens planned\n",
                    kvt_status_name(st), kvt_last_error(), kvt_status_name(r.status),
                    p.num_tokens);
        atomic_fetch_add(&kvt_test_soft_failures, 1);
    } else {
        /* The server's cache waits 0 ms for the held write-through. */
        EXPECT_ERR(kvt_client_flush(cl, 0), KVT_ETIMEDOUT, "kvt_client_flush",
                   "SSD writes still pending");
    }
    kvt_client_detach(cl);
    kvt_server_stop(w->srv);
    return NULL;
}

/* A stopping server waits server_stop_ms for SSD writes to become durable:
 * held, they are still pending at that bound. */
static void test_held_writes(void **state)
{
    (void)state;
    scratch sd;
    scratch_init(&sd, "apisrvw");
    kvt_config *cfg = kvt_test_small_config(sd.ssd);
    assert_ok(kvt_config_set(cfg, "server_socket", sd.sock));
    assert_ok(kvt_config_set(cfg, "server_stop_ms", "1"));
    kvt_geometry *g = kvt_test_small_geo();
    kvt_server *srv = NULL;
    assert_ok(kvt_server_create(&srv, cfg, g));
    engine e;
    engine_init(&e, g);
    writer w = {srv, sd.sock, g, &e};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, held_writes_client, &w), 0);
    EXPECT_ERR(kvt_server_run(srv), KVT_ETIMEDOUT, "SSD writes still pending");
    pthread_join(th, NULL);
    kvt__ssd_hold_writes(kvt__srv_shard_first(srv)->cache->ssd, false);
    kvt_server_destroy(srv);
    kvt_emu_destroy(e.emu);
    kvt_config_destroy(cfg);
    kvt_geometry_destroy(g);
    END_CHECKS();
}

/* ------------------------------------------------------------------ */
/* SSD reads held, a secret, namespaces                                 */

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    assert_int_equal(fputs(text, f) >= 0, 1);
    assert_int_equal(fclose(f), 0);
    assert_int_equal(chmod(path, 0600), 0);
}

/* Stores the request through a cache on ssd, durably (then closed). */
static void store_on_ssd(const char *ssd, const kvt_geometry *g, engine *e)
{
    kvt_config *cfg = kvt_test_small_config(ssd);
    kvt_cache *c = NULL;
    assert_ok(kvt_cache_create(&c, cfg, g));
    assert_ok(kvt_cache_register_memory(c, &e->mem));
    kvt_store_plan p;
    kvt_task_result r;
    assert_ok(kvt_cache_prepare_store(c, &e->req, &p));
    assert_int_equal(p.num_tokens, 12);
    assert_ok(kvt_cache_launch(c, p.task, e->pages, 4));
    assert_ok(kvt_cache_wait(c, p.task, WAIT_MS, &r));
    assert_int_equal(r.status, KVT_OK);
    assert_ok(kvt_cache_flush(c, WAIT_MS));
    kvt_cache_destroy(c);
    kvt_config_destroy(cfg);
}

/* Releases the SSD tier's held reads (arg) once a thread creation failed
 * (at most 10 s later either way). */
static void *release_reads(void *arg)
{
    for (int i = 0; i < 10000 && atomic_load(&threads_failed) == 0; i++)
        nanosleep(&(struct timespec){0, 1000000}, NULL);
    kvt__ssd_hold_reads(arg, false);
    return NULL;
}

/* A server reopened on an SSD directory holding the request's blocks (the
 * CPU tier starts empty), with a secret and namespace rules. */
static void test_server_reads_auth(void **state)
{
    (void)state;
    scratch sd;
    scratch_init(&sd, "apisrvr");
    char secret[240];
    snprintf(secret, sizeof secret, "%s/secret", sd.dir);
    write_file(secret, "0123456789abcdef-the-node-secret");
    kvt_geometry *g = kvt_test_small_geo();
    engine e;
    engine_init(&e, g);
    store_on_ssd(sd.ssd, g, &e);

    kvt_config *cfg = kvt_test_small_config(sd.ssd);
    assert_ok(kvt_config_set(cfg, "server_socket", sd.sock));
    assert_ok(kvt_config_set(cfg, "server_secret_file", secret));
    assert_ok(kvt_config_set(cfg, "server_namespaces", "*=ns,-"));
    srv_fx f = {0};
    assert_ok(kvt_server_create(&f.srv, cfg, g));
    assert_int_equal(pthread_create(&f.th, NULL, srv_run, &f), 0);

    /* The server wants the secret; this client has none. */
    kvt_client *cl = NULL;
    unsetenv("KVTIER_SERVER_SECRET_FILE");
    EXPECT_ERR(kvt_client_attach(&cl, sd.sock, g, WAIT_MS), KVT_EAUTH, "kvt_client_attach", sd.sock,
               "secret");
    assert_null(cl);
    setenv("KVTIER_SERVER_SECRET_FILE", secret, 1);
    EXPECT_OK(kvt_client_attach(&cl, sd.sock, g, WAIT_MS));
    unsetenv("KVTIER_SERVER_SECRET_FILE");
    assert_non_null(cl);
    assert_ok(kvt_client_register_memory(cl, &e.mem));

    /* A namespace no rule gives this client. */
    kvt_request evil = {e.tokens, T_TOKENS, "evil", 4};
    kvt_match m = {0, 0};
    kvt_store_plan p = {0};
    EXPECT_ERR(kvt_client_lookup(cl, &evil, &m), KVT_EAUTH, "kvt_client_lookup",
               "namespace \"evil\" is not allowed");
    EXPECT_ERR(kvt_client_prepare_store(cl, &evil, &p), KVT_EAUTH, "kvt_client_prepare_store",
               "namespace \"evil\" is not allowed");
    uint32_t peeked = 77;
    EXPECT_ERR(kvt_client_peek(cl, &evil, &peeked), KVT_EAUTH, "kvt_client_peek",
               "namespace \"evil\" is not allowed");
    assert_int_equal(peeked, 77);
    /* On the SSD only: a load would read them back, so a peek counts them. */
    EXPECT_OK(kvt_client_peek(cl, &e.req, &peeked));
    assert_int_equal(peeked, 12);

    /* The blocks are on the SSD only and their reads are held: the load's
     * launch pends, and no layer can have landed at a 0 ms deadline. */
    kvt__ssd_hold_reads(kvt__srv_shard_first(f.srv)->cache->ssd, true);
    uint32_t load_pages[4] = {0, 2, 4, 6};
    assert_ok(kvt_emu_poison(e.emu, load_pages, 4));
    assert_ok(kvt_client_lookup(cl, &e.req, &m));
    assert_int_equal(m.matched_tokens, 12);
    EXPECT_OK(kvt_client_launch(cl, m.task, load_pages, 4));
    EXPECT_ERR(kvt_client_wait_layer(cl, m.task, 0, 0), KVT_ETIMEDOUT, "kvt_client_wait_layer",
               "still read from SSD");

    /* A second client's first pending load starts its launcher thread:
     * when that cannot start, the launch fails and the server drops the
     * task (the server's cancel waits for its reads: a helper releases
     * them once the thread creation failed). */
    kvt_client *cl2 = NULL;
    setenv("KVTIER_SERVER_SECRET_FILE", secret, 1);
    assert_ok(kvt_client_attach(&cl2, sd.sock, g, WAIT_MS));
    unsetenv("KVTIER_SERVER_SECRET_FILE");
    assert_ok(kvt_client_register_memory(cl2, &e.mem));
    kvt_match m2;
    assert_ok(kvt_client_lookup(cl2, &e.req, &m2));
    assert_int_equal(m2.matched_tokens, 12);
    pthread_t rel;
    assert_int_equal(pthread_create(&rel, NULL, release_reads, kvt__srv_shard_first(f.srv)->cache->ssd), 0);
    thread_fails = 1;
    EXPECT_ERR(kvt_client_launch(cl2, m2.task, load_pages, 4), KVT_ESYS, "kvt_client_launch",
               "no thread");
    thread_fails = 0;
    pthread_join(rel, NULL);
    kvt_client_detach(cl2);

    EXPECT_OK(kvt_client_wait_layer(cl, m.task, T_LAYERS - 1, WAIT_MS));
    kvt_task_result r;
    assert_ok(kvt_client_wait(cl, m.task, WAIT_MS, &r));
    assert_int_equal(r.status, KVT_OK);
    kvt_verify_result v;
    assert_ok(kvt_emu_verify(e.emu, &e.req, 0, 12, load_pages, 4, &v));
    assert_true(v.bytes_checked > 0);
    assert_int_equal(v.mismatches, 0);

    kvt_client_detach(cl);
    kvt_server_stop(f.srv);
    pthread_join(f.th, NULL);
    assert_ok(f.run_st);
    kvt_server_destroy(f.srv);
    kvt_config_destroy(cfg);
    kvt_emu_destroy(e.emu);
    kvt_geometry_destroy(g);
    END_CHECKS();
}

/* ------------------------------------------------------------------ */
/* CUDA layer events, over the fake runtime                             */

/* "Device" copies of the engine's buffers (the fake runtime's device
 * memory is host memory it tracks as device memory). */
typedef struct dev_mem {
    kvt_engine_memory mem;
    void *bufs[KVT_MAX_LAYERS * KVT_MAX_COMPONENTS];
    uint64_t bytes[KVT_MAX_LAYERS * KVT_MAX_COMPONENTS];
} dev_mem;

static void dev_alloc(const kvt_cuda_api *api, dev_mem *d, const kvt_engine_memory *host)
{
    memset(d, 0, sizeof *d);
    d->mem = *host;
    d->mem.kind = KVT_MEMORY_CUDA;
    d->mem.device = 0;
    assert_null(host->base); /* layer-first: one buffer per (layer, component) */
    for (uint32_t u = 0; u < KVT_MAX_LAYERS * KVT_MAX_COMPONENTS; u++) {
        if (!host->layer_bases[u]) continue;
        d->bytes[u] = host->buffer_bytes[u];
        assert_int_equal(api->Malloc(&d->bufs[u], d->bytes[u]), 0);
        assert_int_equal(api->Memcpy(d->bufs[u], host->layer_bases[u], d->bytes[u],
                                     KVT_CU_MEMCPY_H2D), 0);
    }
    d->mem.layer_bases = d->bufs;
    d->mem.buffer_bytes = d->bytes;
}

/* The fake CUDA runtime ctest points KVTIER_CUDART at; the test fails
 * without it (a device test that skips here would pass unseen). */
static const kvt_cuda_api *fake_cuda_api(void)
{
    const char *why = NULL;
    const kvt_cuda_api *api = kvt__cuda_load(&why);
    if (!api || !getenv("KVTIER_CUDART"))
        fail_msg("this test runs over tests/fake_cudart.c (KVTIER_CUDART, set by ctest): %s",
                 why ? why : "KVTIER_CUDART is not set");
    return api;
}

static void dev_free(const kvt_cuda_api *api, dev_mem *d)
{
    for (uint32_t u = 0; u < KVT_MAX_LAYERS * KVT_MAX_COMPONENTS; u++)
        if (d->bufs[u]) api->Free(d->bufs[u]);
}

/* The request's blocks on the SSD only (reads held, then released), the
 * engine's pages in (fake) device memory. */
static void test_layer_events(void **state)
{
    (void)state;
    const kvt_cuda_api *api = fake_cuda_api();
    scratch sd;
    scratch_init(&sd, "apicuda");
    kvt_geometry *g = kvt_test_small_geo();
    engine e;
    engine_init(&e, g);
    store_on_ssd(sd.ssd, g, &e);

    kvt_config *cfg = kvt_test_small_config(sd.ssd);
    kvt_cache *c = NULL;
    assert_ok(kvt_cache_create(&c, cfg, g));
    dev_mem d;
    dev_alloc(api, &d, &e.mem);
    /* The CPU tier already pinned (by someone else in this process): the
     * runtime refuses to pin it again (cudaErrorHostMemoryAlreadyRegistered). */
    void *tier = kvt__pool_block(c->pool, 0);
    size_t tier_len = (size_t)kvt__pool_blocks_total(c->pool) * kvt__pool_stride(c->pool);
    assert_int_equal(api->HostRegister(tier, tier_len, 0), 0);
    EXPECT_ERR(kvt_cache_register_memory(c, &d.mem), KVT_ESYS, "kvt_cache_register_memory",
               "cudaHostRegister", "712");
    assert_int_equal(api->HostUnregister(tier), 0);
    /* No memory for the registration's tables. */
    alloc_countdown = 0;
    EXPECT_ERR(kvt_cache_register_memory(c, &d.mem), KVT_ENOMEM, "kvt_cache_register_memory",
               "out of memory");
    alloc_countdown = -1;
    EXPECT_OK(kvt_cache_register_memory(c, &d.mem));
    void *ev = NULL;
    EXPECT_ERR(kvt_cache_layer_event(c, 987654, 0, 0, &ev), KVT_ENOTFOUND,
               "kvt_cache_layer_event", "987654");
    EXPECT_ERR(kvt_cache_stream_wait_layer(c, 987654, 0, NULL, 0), KVT_ENOTFOUND,
               "kvt_cache_stream_wait_layer", "987654");

    kvt__ssd_hold_reads(c->ssd, true);
    kvt_match m;
    assert_ok(kvt_cache_lookup(c, &e.req, &m));
    assert_int_equal(m.matched_tokens, 12);
    EXPECT_ERR(kvt_cache_layer_event(c, m.task, 0, 0, &ev), KVT_ESTATE, "kvt_cache_layer_event",
               "never launched");
    EXPECT_ERR(kvt_cache_stream_wait_layer(c, m.task, 0, NULL, 0), KVT_ESTATE,
               "kvt_cache_stream_wait_layer", "never launched");
    uint32_t load_pages[4] = {0, 2, 4, 6};
    assert_ok(kvt_cache_launch(c, m.task, load_pages, 4));
    EXPECT_ERR(kvt_cache_layer_event(c, m.task, 0, 0, &ev), KVT_ETIMEDOUT,
               "kvt_cache_layer_event", "not enqueued");
    EXPECT_ERR(kvt_cache_stream_wait_layer(c, m.task, 1, NULL, 0), KVT_ETIMEDOUT,
               "kvt_cache_stream_wait_layer", "not enqueued");
    kvt__ssd_hold_reads(c->ssd, false);
    EXPECT_OK(kvt_cache_layer_event(c, m.task, 0, WAIT_MS, &ev));
    assert_non_null(ev);
    EXPECT_OK(kvt_cache_stream_wait_layer(c, m.task, 1, NULL, WAIT_MS));
    /* A stream the engine already destroyed: the runtime refuses the wait
     * (cudaErrorInvalidResourceHandle). */
    void *gone = NULL;
    assert_int_equal(api->StreamCreateWithFlags(&gone, KVT_CU_STREAM_NON_BLOCKING), 0);
    assert_int_equal(api->StreamDestroy(gone), 0);
    EXPECT_ERR(kvt_cache_stream_wait_layer(c, m.task, 1, gone, WAIT_MS), KVT_EIO,
               "kvt_cache_stream_wait_layer", "cudaStreamWaitEvent", "400");
    kvt_task_result r;
    assert_ok(kvt_cache_wait(c, m.task, WAIT_MS, &r));
    assert_int_equal(r.status, KVT_OK);
    assert_int_equal(r.num_tokens, 12);

    kvt_cache_destroy(c);
    dev_free(api, &d);
    kvt_config_destroy(cfg);
    kvt_emu_destroy(e.emu);
    kvt_geometry_destroy(g);
    END_CHECKS();
}

/* ------------------------------------------------------------------ */
/* A server answering what no request of that kind gets                 */

/* A fake server at a Unix socket: attach as a real one (a memfd tier for
 * small_geo), a LOOKUP answered with a planned task or with plan_status,
 * a CANCEL with cancel_status. */
typedef struct fake_srv {
    kvt_test_fake_srv s; /* the socket and its thread (support.h) */
    _Atomic int plan_status, cancel_status;
    _Atomic int hello_status, other_status; /* 0: a HELLO as a server's; other ops KVT_EINVAL */
    _Atomic uint64_t peek_task; /* a PEEK's answer carries it (a server's: 0) */
    uint64_t next_task;
} fake_srv;

static void fake_answer(int fd, uint16_t op, kvt_status st, const kvt_srv_buf *b, int fd_pass)
{
    static const char msg[] = "the fake server says so";
    const void *p = st ? (const void *)msg : b ? (const void *)b->p : NULL;
    uint32_t len = st ? (uint32_t)strlen(msg) : b ? (uint32_t)b->len : 0;
    (void)kvt__srv_send_frame(fd, op | KVT_SRV_REPLY, st, p, len, fd_pass, kvt__deadline_ns(1000));
}

/* Answers HELLO and SESSION as a server does (HELLO: a 4 KiB memfd tier
 * for small_geo, 128 bytes a token, blocks of T_TPP tokens at a 512-byte
 * stride); false for any other op. */
static bool fake_attach_answer(int fd, uint16_t op)
{
    kvt_srv_buf b = {0};
    if (op == KVT_SRV_HELLO) {
        kvt_srv_hello_rep r = {4096, 512, 128 * T_TPP, T_TPP, 8, (uint32_t)getpid()};
        kvt__srv_hello_rep_encode(&b, &r);
        int mfd = memfd_create("kvtier-fake-tier", MFD_CLOEXEC);
        if (mfd >= 0 && ftruncate(mfd, 4096) == 0) fake_answer(fd, op, KVT_OK, &b, mfd);
        if (mfd >= 0) close(mfd);
    } else if (op == KVT_SRV_SESSION) { /* part of every attach: taken */
        kvt__srv_task_rep_encode(&b, 0, 0, 0);
        fake_answer(fd, op, KVT_OK, &b, -1);
    }
    kvt__srv_buf_free(&b);
    return op == KVT_SRV_HELLO || op == KVT_SRV_SESSION;
}

static void fake_serve(void *arg, int fd)
{
    fake_srv *f = arg;
    kvt_srv_hdr h;
    uint8_t *p = NULL;
    while (kvt__srv_recv_frame(fd, &h, &p, NULL, kvt__deadline_ns(2000)) == KVT_OK) {
        free(p);
        p = NULL;
        if (h.op == KVT_SRV_HELLO && atomic_load(&f->hello_status)) {
            fake_answer(fd, h.op, atomic_load(&f->hello_status), NULL, -1);
            continue;
        }
        if (fake_attach_answer(fd, h.op)) continue;
        kvt_srv_buf b = {0};
        int other = atomic_load(&f->other_status);
        if (h.op == KVT_SRV_PEEK && !atomic_load(&f->plan_status)) {
            kvt__srv_task_rep_encode(&b, atomic_load(&f->peek_task), T_TPP, 0);
            fake_answer(fd, h.op, KVT_OK, &b, -1);
        } else if (h.op == KVT_SRV_LOOKUP && !atomic_load(&f->plan_status)) {
            kvt__srv_task_rep_encode(&b, ++f->next_task, T_TPP, 0);
            fake_answer(fd, h.op, KVT_OK, &b, -1);
        } else if (h.op == KVT_SRV_LOOKUP || h.op == KVT_SRV_PEEK) {
            fake_answer(fd, h.op, atomic_load(&f->plan_status), NULL, -1);
        } else {
            fake_answer(fd, h.op, h.op == KVT_SRV_CANCEL ? atomic_load(&f->cancel_status)
                                                          : other ? other : KVT_EINVAL, NULL, -1);
        }
        kvt__srv_buf_free(&b);
    }
}

/* Warn and info lines the library logs while a test runs
 * (kvt_set_log_handler), each after "W " or "I ". */
static char logged[8192];
static pthread_mutex_t logged_mu = PTHREAD_MUTEX_INITIALIZER; /* the server thread logs too */
static void keep_lines(void *user, kvt_log_level level, const char *line)
{
    (void)user;
    pthread_mutex_lock(&logged_mu);
    if ((level == KVT_LOG_WARN || level == KVT_LOG_INFO) &&
        strlen(logged) + strlen(line) + 4 < sizeof logged) {
        strcat(logged, level == KVT_LOG_WARN ? "W " : "I ");
        strcat(logged, line);
        strcat(logged, "\n");
    }
    pthread_mutex_unlock(&logged_mu);
}

/* Device page p of unit u against the emulated engine's host page q. */
static void expect_dev_page(const dev_mem *d, const kvt_engine_memory *host, uint32_t p,
                            uint32_t q)
{
    for (uint32_t u = 0; u < KVT_MAX_LAYERS * KVT_MAX_COMPONENTS; u++) {
        if (!d->bufs[u]) continue;
        uint64_t pb = d->bytes[u] / host->num_pages;
        assert_memory_equal((uint8_t *)d->bufs[u] + p * pb,
                            (const uint8_t *)host->layer_bases[u] + q * pb, pb);
    }
}

/* Engine memory on a (fake) CUDA device through a node server. A server
 * for any model shares cpu_capacity across geometries: its tier is sparse,
 * and pinning it would back all of it and keep pages the server punches
 * out for another geometry (stale bytes on a later load). So the client
 * pins only a tier backed whole (server_max_geometries=1) and says at info
 * why a shared one is not pinned; either way a store from device pages
 * and a load into others move every byte. */
static void test_cuda_pins_only_a_tier_backed_whole(void **state)
{
    (void)state;
    const kvt_cuda_api *api = fake_cuda_api();
    kvt_geometry *g = kvt_test_small_geo();
    engine e;
    engine_init(&e, g);
    dev_mem d;
    dev_alloc(api, &d, &e.mem);
    for (int whole = 0; whole < 2; whole++) {
        scratch sd;
        scratch_init(&sd, whole ? "apicudaone" : "apicudashare");
        kvt_config *cfg = kvt_test_small_config(NULL);
        assert_ok(kvt_config_set(cfg, "server_socket", sd.sock));
        if (whole) assert_ok(kvt_config_set(cfg, "server_max_geometries", "1"));
        srv_fx f = {0};
        assert_ok(kvt_server_create(&f.srv, cfg, NULL)); /* any model */
        assert_int_equal(pthread_create(&f.th, NULL, srv_run, &f), 0);
        kvt_client *cl = NULL;
        assert_ok(kvt_client_attach(&cl, sd.sock, g, WAIT_MS));
        logged[0] = 0;
        assert_ok(kvt_set_log_level(KVT_LOG_INFO));
        assert_ok(kvt_set_log_handler(keep_lines, NULL));
        EXPECT_OK(kvt_client_register_memory(cl, &d.mem));
        assert_ok(kvt_set_log_handler(NULL, NULL));
        assert_ok(kvt_set_log_level(KVT_LOG_WARN));
        uint64_t tier_bytes = 0;
        void *tier = kvt__client_tier(cl, &tier_bytes);
        assert_non_null(tier);
        kvt_cu_ptr_attr_buf a;
        memset(&a, 0, sizeof a);
        assert_int_equal(api->PointerGetAttributes(&a, tier), 0);
        assert_null(strstr(logged, "W "));
        if (whole) {
            assert_int_equal(a.a.type, KVT_CU_MEMTYPE_HOST); /* pinned */
            assert_null(strstr(logged, "not pinned"));
        } else {
            assert_int_equal(a.a.type, KVT_CU_MEMTYPE_UNREGISTERED);
            assert_non_null(strstr(logged, "I kvt_client_register_memory: the server shares "
                                           "cpu_capacity across geometries"));
            assert_non_null(strstr(logged, "not pinned"));
            assert_non_null(strstr(logged, "--model"));
        }
        /* Store the 3 whole blocks from device pages 1, 3, 5; load them
         * into 0, 2, 4. */
        kvt_store_plan plan;
        assert_ok(kvt_client_prepare_store(cl, &e.req, &plan));
        assert_int_equal(plan.first_token, 0);
        assert_int_equal(plan.num_tokens, 12);
        assert_ok(kvt_client_launch(cl, plan.task, e.pages, 3));
        kvt_task_result r;
        assert_ok(kvt_client_wait(cl, plan.task, WAIT_MS, &r));
        assert_int_equal(r.status, KVT_OK);
        for (uint32_t u = 0; u < KVT_MAX_LAYERS * KVT_MAX_COMPONENTS; u++)
            if (d.bufs[u]) {
                uint64_t pb = d.bytes[u] / e.mem.num_pages;
                for (uint32_t p = 0; p < 6; p += 2) memset((uint8_t *)d.bufs[u] + p * pb, 0x5a, pb);
            }
        kvt_match m;
        assert_ok(kvt_client_lookup(cl, &e.req, &m));
        assert_int_equal(m.matched_tokens, 12);
        uint32_t load_pages[3] = {0, 2, 4};
        assert_ok(kvt_client_launch(cl, m.task, load_pages, 3));
        assert_ok(kvt_client_wait(cl, m.task, WAIT_MS, &r));
        assert_int_equal(r.status, KVT_OK);
        assert_int_equal(r.num_tokens, 12);
        for (uint32_t i = 0; i < 3; i++) expect_dev_page(&d, &e.mem, load_pages[i], e.pages[i]);
        kvt_client_detach(cl);
        kvt_server_stop(f.srv);
        pthread_join(f.th, NULL);
        assert_ok(f.run_st);
        kvt_server_destroy(f.srv);
        kvt_config_destroy(cfg);
    }
    dev_free(api, &d);
    kvt_emu_destroy(e.emu);
    kvt_geometry_destroy(g);
    END_CHECKS();
}

/* The client refuses an answer no server gives to that request (the
 * protocol is broken): a plan answered KVT_ETIMEDOUT (kvt_cache_lookup
 * never times out), the cancel of a planned task answered KVT_ETIMEDOUT
 * (only a launched task's SSD reads can outlast the server's bound), a
 * FLUSH or HELLO answered with a status its handler never answers. */
static void test_client_refuses_answers(void **state)
{
    (void)state;
    fake_srv f;
    memset(&f, 0, sizeof f);
    kvt_test_fake_srv_start(&f.s, "apifake", fake_serve, &f);

    kvt_geometry *g = kvt_test_small_geo();
    kvt_client *cl = NULL;
    assert_ok(kvt_client_attach(&cl, f.s.sock, g, WAIT_MS));
    uint32_t tokens[2 * T_TPP];
    kvt_test_tokens(tokens, 2 * T_TPP, 5);
    kvt_request req = {tokens, 2 * T_TPP, NULL, 0};
    kvt_match m = {0, 0};
    atomic_store(&f.plan_status, KVT_ETIMEDOUT);
    EXPECT_ERR(kvt_client_lookup(cl, &req, &m), KVT_EPROTO, "kvt_client_lookup",
               "answered a LOOKUP with KVT_ETIMEDOUT", "the fake server says so");
    /* A peek makes no task: no quota, so KVT_EFULL is no answer to it;
     * nor is a task id. */
    uint32_t peeked = 77;
    atomic_store(&f.plan_status, KVT_EFULL);
    EXPECT_ERR(kvt_client_peek(cl, &req, &peeked), KVT_EPROTO, "kvt_client_peek",
               "answered a PEEK with KVT_EFULL", "the fake server says so");
    atomic_store(&f.plan_status, KVT_OK);
    atomic_store(&f.peek_task, 9);
    EXPECT_ERR(kvt_client_peek(cl, &req, &peeked), KVT_EPROTO, "kvt_client_peek",
               "answered a peek with task 9");
    assert_int_equal(peeked, 77);
    atomic_store(&f.peek_task, 0);
    EXPECT_OK(kvt_client_peek(cl, &req, &peeked));
    assert_int_equal(peeked, T_TPP);
    assert_ok(kvt_client_lookup(cl, &req, &m));
    assert_true(m.task != 0);
    atomic_store(&f.cancel_status, KVT_ETIMEDOUT);
    EXPECT_ERR(kvt_client_cancel(cl, m.task), KVT_EPROTO, "kvt_client_cancel",
               "answered the cancel of a planned task with KVT_ETIMEDOUT");
    /* An expired plan (the server no longer has it) is cancelled. */
    assert_ok(kvt_client_lookup(cl, &req, &m));
    atomic_store(&f.cancel_status, KVT_ENOTFOUND);
    EXPECT_OK(kvt_client_cancel(cl, m.task));
    /* Every request's failure is checked against what the server's handler
     * of it can answer (answers.h, generated from src/server/conn.c): a
     * FLUSH is never answered KVT_EABORTED, and it is answered KVT_EINVAL
     * (regression: any known status passed through to the caller). */
    atomic_store(&f.other_status, KVT_EABORTED);
    EXPECT_ERR(kvt_client_flush(cl, WAIT_MS), KVT_EPROTO, "kvt_client_flush",
               "answered a FLUSH with KVT_EABORTED", "no kvtier server answers it with",
               "the fake server says so");
    atomic_store(&f.other_status, KVT_EINVAL);
    EXPECT_ERR(kvt_client_flush(cl, WAIT_MS), KVT_EINVAL, "kvt_client_flush", "the fake server says so");
    kvt_client_detach(cl);
    cl = NULL;
    /* ... and so is an attach's HELLO */
    atomic_store(&f.hello_status, KVT_EABORTED);
    EXPECT_ERR(kvt_client_attach(&cl, f.s.sock, g, WAIT_MS), KVT_EPROTO, "kvt_client_attach",
               "answered a HELLO with KVT_EABORTED", "the fake server says so");
    assert_null(cl);
    atomic_store(&f.hello_status, KVT_EGEOMETRY);
    EXPECT_ERR(kvt_client_attach(&cl, f.s.sock, g, WAIT_MS), KVT_EGEOMETRY, "kvt_client_attach",
               "the fake server says so");
    assert_null(cl);
    atomic_store(&f.hello_status, 0);
    assert_ok(kvt_client_attach(&cl, f.s.sock, g, WAIT_MS));

    kvt_client_detach(cl);
    kvt_test_fake_srv_stop(&f.s);
    kvt_geometry_destroy(g);
    END_CHECKS();
}

/* A fake server that plans and launches one store (task 1) and one load
 * (task 2), each of tokens [0, 2 T_TPP) in the blocks at tier offsets 0
 * and 512, and answers the n-th END only once the test released n (or
 * after 5 s). */
typedef struct held_end_srv {
    kvt_test_fake_srv s;
    _Atomic int ends, released;
    uint64_t sums[2 * 2]; /* the store's END's layer checksums (2 blocks, 2 layers) */
    _Atomic bool cut_corrupt; /* the load's LAUNCH: cut to block 0 (KVT_EIO), whose sums are wrong */
} held_end_srv;

static void held_end_serve(void *arg, int fd)
{
    held_end_srv *f = arg;
    kvt_srv_hdr h;
    uint8_t *p = NULL;
    while (kvt__srv_recv_frame(fd, &h, &p, NULL, kvt__deadline_ns(10000)) == KVT_OK) {
        uint64_t id = 0;
        if (h.op == KVT_SRV_LAUNCH && kvt__srv_id_decode(p, h.len, &id)) id = 0;
        kvt_srv_end e = {0};
        if (h.op == KVT_SRV_END && kvt__srv_end_decode(p, h.len, &e)) e.status = KVT_EPROTO;
        if (h.op == KVT_SRV_END && e.n * e.num_layers == 4)
            for (uint32_t i = 0; i < 4; i++) f->sums[i] = kvt__srv_get64(e.checksums + 8 * i);
        free(p);
        p = NULL;
        if (fake_attach_answer(fd, h.op)) continue;
        kvt_srv_buf b = {0};
        if (h.op == KVT_SRV_PREPARE || h.op == KVT_SRV_LOOKUP) {
            kvt__srv_task_rep_encode(&b, h.op == KVT_SRV_PREPARE ? 1 : 2,
                                     h.op == KVT_SRV_PREPARE ? 0 : 2 * T_TPP,
                                     h.op == KVT_SRV_PREPARE ? 2 * T_TPP : 0);
            fake_answer(fd, h.op, KVT_OK, &b, -1);
        } else if (h.op == KVT_SRV_LAUNCH && (id == 1 || id == 2)) {
            static const uint64_t offs[2] = {0, 512};
            kvt_task_kind kind = id == 1 ? KVT_TASK_STORE : KVT_TASK_LOAD;
            kvt_srv_launch_rep r = {(uint32_t)kind, 0, 2 * T_TPP, 2, KVT_OK, 0, NULL,
                                    kind == KVT_TASK_LOAD ? 2 : 0, NULL};
            uint64_t bad[2] = {f->sums[0] ^ 1, f->sums[1] ^ 1};
            bool cut = kind == KVT_TASK_LOAD && atomic_load(&f->cut_corrupt);
            if (cut) {
                r.num_tokens = T_TPP;
                r.num_blocks = 1;
                r.bad_status = KVT_EIO;
            }
            kvt__srv_launch_rep_encode(&b, &r, offs, cut ? bad : f->sums); /* the load's: the store's */
            fake_answer(fd, h.op, KVT_OK, &b, -1);
        } else if (h.op == KVT_SRV_END) {
            int n = atomic_fetch_add(&f->ends, 1) + 1;
            for (int i = 0; i < 500 && atomic_load(&f->released) < n; i++) usleep(10000);
            /* a server's verdict: the client's copy status (a failed one lands nothing) */
            kvt_task_result r = {(uint64_t)n, n == 1 ? KVT_TASK_STORE : KVT_TASK_LOAD, e.status,
                                 0, e.status ? 0 : 2 * T_TPP, e.status ? 0 : 2 * 128 * T_TPP};
            kvt__srv_result_encode(&b, &r);
            fake_answer(fd, h.op, KVT_OK, &b, -1);
        } else {
            fake_answer(fd, h.op, KVT_EINVAL, NULL, -1);
        }
        kvt__srv_buf_free(&b);
    }
}

/* Waits (5 s at most) until the fake server has taken n ENDs. */
static void ends_taken(held_end_srv *f, int n)
{
    for (int i = 0; i < 500 && atomic_load(&f->ends) < n; i++) usleep(10000);
    assert_int_equal(atomic_load(&f->ends), n);
}

/* A task's wait returns when its copy ended (a store's pages are free, a
 * load's hold the KV, as in process), not when the server answers its END:
 * here the server holds each answer until the task was reported (before,
 * the wait returned only with END's answer: wait(2 s) gave KVT_ETIMEDOUT).
 * END still goes out first, before this client's next request. */
static void test_tasks_end_before_end_answer(void **state)
{
    (void)state;
    held_end_srv f;
    memset(&f, 0, sizeof f);
    kvt_test_fake_srv_start(&f.s, "apiheld", held_end_serve, &f);
    kvt_geometry *g = kvt_test_small_geo();
    engine e;
    engine_init(&e, g);
    kvt_client *cl = NULL;
    assert_ok(kvt_client_attach(&cl, f.s.sock, g, WAIT_MS));
    assert_ok(kvt_client_register_memory(cl, &e.mem));
    kvt_store_plan p = {0};
    assert_ok(kvt_client_prepare_store(cl, &e.req, &p));
    assert_int_equal(p.task, 1);
    assert_ok(kvt_client_launch(cl, p.task, e.pages, 4));
    kvt_task_result res = {0};
    EXPECT_OK(kvt_client_wait(cl, p.task, 2000, &res)); /* END is held for 5 s */
    assert_int_equal(res.status, KVT_OK);
    assert_int_equal(res.kind, KVT_TASK_STORE);
    assert_int_equal(res.num_tokens, 2 * T_TPP);
    assert_int_equal(res.bytes, 2 * 128 * T_TPP);
    ends_taken(&f, 1);
    atomic_store(&f.released, 1);
    /* The load reads back what the store wrote into the fake's tier. */
    assert_ok(kvt_emu_poison(e.emu, e.pages, 4));
    kvt_match m = {0};
    assert_ok(kvt_client_lookup(cl, &e.req, &m));
    assert_int_equal(m.task, 2);
    assert_ok(kvt_client_launch(cl, m.task, e.pages, 4));
    EXPECT_OK(kvt_client_wait(cl, m.task, 2000, &res));
    assert_int_equal(res.status, KVT_OK);
    assert_int_equal(res.kind, KVT_TASK_LOAD);
    assert_int_equal(res.num_tokens, 2 * T_TPP);
    kvt_verify_result v;
    assert_ok(kvt_emu_verify(e.emu, &e.req, 0, 2 * T_TPP, e.pages, 4, &v));
    assert_int_equal(v.mismatches, 0);
    assert_true(v.bytes_checked > 0);
    ends_taken(&f, 2);
    atomic_store(&f.released, 2);
    kvt_client_detach(cl);
    kvt_test_fake_srv_stop(&f.s);
    kvt_emu_destroy(e.emu);
    kvt_geometry_destroy(g);
    END_CHECKS();
}

/* A load the server cut short (block 1 could not be read back: KVT_EIO)
 * whose prefix then failed its checksums: once it ended, a layer wait says
 * it ended KVT_ECORRUPT, not the cut's "only tokens [0, N) will land"
 * (regression, de87935: the cut's advice came for any end of a cut load,
 * so the engine took the corrupt prefix as landed). */
static void test_cut_load_that_failed_says_why(void **state)
{
    (void)state;
    held_end_srv f;
    memset(&f, 0, sizeof f);
    atomic_store(&f.released, 100); /* no END answer is held */
    kvt_test_fake_srv_start(&f.s, "apicut", held_end_serve, &f);
    kvt_geometry *g = kvt_test_small_geo();
    engine e;
    engine_init(&e, g);
    kvt_client *cl = NULL;
    assert_ok(kvt_client_attach(&cl, f.s.sock, g, WAIT_MS));
    assert_ok(kvt_client_register_memory(cl, &e.mem));
    kvt_store_plan p = {0};
    assert_ok(kvt_client_prepare_store(cl, &e.req, &p));
    assert_ok(kvt_client_launch(cl, p.task, e.pages, 4));
    kvt_task_result res = {0};
    assert_ok(kvt_client_wait(cl, p.task, WAIT_MS, &res));
    assert_int_equal(res.status, KVT_OK);
    ends_taken(&f, 1);
    atomic_store(&f.cut_corrupt, true);
    kvt_match m = {0};
    assert_ok(kvt_client_lookup(cl, &e.req, &m));
    assert_ok(kvt_client_launch(cl, m.task, e.pages, 4));
    ends_taken(&f, 2); /* END goes out once the copy ended */
    EXPECT_ERR(kvt_client_wait_layer(cl, m.task, 0, WAIT_MS), KVT_ECORRUPT, "kvt_client_wait_layer",
               "ended with KVT_ECORRUPT");
    assert_null(strstr(kvt_last_error(), "will land"));
    assert_ok(kvt_client_wait(cl, m.task, WAIT_MS, &res));
    assert_int_equal(res.status, KVT_ECORRUPT);
    assert_int_equal(res.num_tokens, 0); /* a failed load lands nothing */
    kvt_client_detach(cl);
    kvt_test_fake_srv_stop(&f.s);
    kvt_emu_destroy(e.emu);
    kvt_geometry_destroy(g);
    END_CHECKS();
}

/* ------------------------------------------------------------------ */
/* The metrics endpoint at an address of no interface here              */

/* 192.0.2.1 (TEST-NET-1, RFC 5737: assigned to no host) with
 * metrics_insecure: the bind fails (EADDRNOTAVAIL), and the cache is not
 * created. */
static void test_metrics_unlistenable(void **state)
{
    (void)state;
    kvt_geometry *g = kvt_test_small_geo();
    kvt_config *cfg = kvt_test_small_config(NULL);
    assert_ok(kvt_config_set(cfg, "metrics_addr", "192.0.2.1"));
    assert_ok(kvt_config_set(cfg, "metrics_insecure", "true"));
    assert_ok(kvt_config_set(cfg, "metrics_port", "9109"));
    kvt_cache *c = NULL;
    EXPECT_ERR(kvt_cache_create(&c, cfg, g), KVT_ESYS, "kvt_cache_create", "metrics endpoint",
               "192.0.2.1");
    assert_null(c);
    kvt_config_destroy(cfg);
    kvt_geometry_destroy(g);
    END_CHECKS();
}

/* ------------------------------------------------------------------ */
/* The cluster tier's join: every refusal names what is wrong          */

/* A server made for the join (not run): cluster options set by the caller. */
static kvt_server *cluster_server(const scratch *sd, const char *const *opts)
{
    kvt_config *cfg = kvt_test_small_config(NULL);
    assert_ok(kvt_config_set(cfg, "server_socket", sd->sock));
    for (uint32_t i = 0; opts[i]; i += 2) assert_ok(kvt_config_set(cfg, opts[i], opts[i + 1]));
    kvt_geometry *g = kvt_test_small_geo();
    kvt_server *s = NULL;
    assert_ok(kvt_server_create(&s, cfg, g));
    kvt_config_destroy(cfg);
    kvt_geometry_destroy(g);
    return s;
}

static void test_cluster_join_refusals(void **state)
{
    (void)state;
    scratch sd;
    scratch_init(&sd, "apicluster");
    /* a refused join writes nothing to *out (kvtier.h: out-parameters are
     * written only on success) */
    kvt_cluster *cl = (kvt_cluster *)(uintptr_t)1;
    EXPECT_ERR(kvt_cluster_join(NULL, &cl), KVT_EINVAL, "kvt_cluster_join", "srv is NULL");
    assert_ptr_equal(cl, (kvt_cluster *)(uintptr_t)1);
    cl = NULL;
    kvt_cluster_counters cc;
    EXPECT_ERR(kvt_cluster_stats(NULL, &cc), KVT_EINVAL, "kvt_cluster_stats", "cl");
    kvt_cluster_leave(NULL);

    const char *none[] = {NULL};
    kvt_server *s = cluster_server(&sd, none);
    EXPECT_ERR(kvt_cluster_join(s, NULL), KVT_EINVAL, "kvt_cluster_join", "out is NULL");
    EXPECT_ERR(kvt_cluster_join(s, &cl), KVT_EINVAL, "kvt_cluster_join", "cluster_redis");
    kvt_server_destroy(s);

    /* off loopback without a secret: refused before anything listens */
    const char *open_net[] = {"cluster_redis", "127.0.0.1:1", "cluster_listen", "0.0.0.0:0", NULL};
    s = cluster_server(&sd, open_net);
    EXPECT_ERR(kvt_cluster_join(s, &cl), KVT_EINVAL, "kvt_cluster_join", "cluster_secret_file",
               "0.0.0.0:0");
    kvt_server_destroy(s);

    const char *bad_listen[] = {"cluster_redis", "127.0.0.1:1", "cluster_listen", "nowhere", NULL};
    s = cluster_server(&sd, bad_listen);
    EXPECT_ERR(kvt_cluster_join(s, &cl), KVT_EINVAL, "cluster_listen", "nowhere");
    kvt_server_destroy(s);

    const char *bad_node[] = {"cluster_redis", "127.0.0.1:1", "cluster_node", "a b", NULL};
    s = cluster_server(&sd, bad_node);
    EXPECT_ERR(kvt_cluster_join(s, &cl), KVT_EINVAL, "node", "a b");
    kvt_server_destroy(s);

    /* no Redis there: not an error (the node serves its local tiers and
     * joins when Redis answers), within the pull deadline */
    const char *no_redis[] = {"cluster_redis", "127.0.0.1:1", "cluster_node", "n1", NULL};
    s = cluster_server(&sd, no_redis);
    uint64_t t0 = kvt__now_ns();
    assert_ok(kvt_cluster_join(s, &cl));
    assert_true(kvt__now_ns() - t0 < 5000000000ull);
    assert_non_null(cl);
    assert_ok(kvt_cluster_stats(cl, &cc));
    assert_int_equal(cc.directory_up, 0);
    assert_int_equal(cc.epoch, 0);
    /* joining again through the same handle is refused and keeps it:
     * before, the refusal set cl to NULL and the joined cluster could no
     * longer be left (its threads ran on, its memory leaked) */
    kvt_cluster *joined = cl;
    EXPECT_ERR(kvt_cluster_join(s, &cl), KVT_ESTATE, "kvt_cluster_join", "already");
    assert_ptr_equal(cl, joined);
    assert_ok(kvt_cluster_stats(cl, &cc));
    kvt_cluster_leave(cl);
    kvt_server_destroy(s);
    /* the server destroyed first: the cluster stops before it goes (its
     * threads read the server: under ASan a use after free before), its
     * counters still read, and leave then only frees it */
    s = cluster_server(&sd, no_redis);
    assert_ok(kvt_cluster_join(s, &cl));
    kvt_server_destroy(s);
    assert_ok(kvt_cluster_stats(cl, &cc));
    assert_int_equal(cc.directory_up, 0);
    kvt_cluster_leave(cl);
    END_CHECKS();
}

/* ------------------------------------------------------------------ */
/* No io_uring: the SSD tier told to use it cannot start                */

#if defined(__x86_64__)
#define SECCOMP_ARCH AUDIT_ARCH_X86_64
#elif defined(__aarch64__)
#define SECCOMP_ARCH AUDIT_ARCH_AARCH64
#endif

/* Denies io_uring_setup to this process (ENOSYS), as a container's seccomp
 * policy does (Docker's default one among them). Irrevocable: a child's. */
static int deny_io_uring(void)
{
    struct sock_filter f[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SECCOMP_ARCH, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_io_uring_setup, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ENOSYS),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog prog = {(unsigned short)(sizeof f / sizeof f[0]), f};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return -1;
    return prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog);
}

/* In a child without io_uring, the io option "uring" (the SSD tier's I/O
 * forced to io_uring, not picked by probing): the cache and the server refuse to
 * start, naming io_uring. The child's failed checks are its exit status. */
static void test_no_io_uring(void **state)
{
    (void)state;
    scratch sd;
    scratch_init(&sd, "apiuring");
    kvt_geometry *g = kvt_test_small_geo();
    kvt_config *cfg = kvt_test_small_config(sd.ssd);
    kvt_config *scfg = kvt_test_small_config(sd.ssd);
    assert_ok(kvt_config_set(cfg, "io", "uring"));
    assert_ok(kvt_config_set(scfg, "io", "uring"));
    assert_ok(kvt_config_set(scfg, "server_socket", sd.sock));
    fflush(NULL);
    pid_t pid = kvt_test_fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        if (deny_io_uring() != 0) {
            print_error("seccomp: %s\n", strerror(errno));
            _exit(100);
        }
        kvt_cache *c = NULL;
        kvt_server *srv = NULL;
        EXPECT_ERR(kvt_cache_create(&c, cfg, g), KVT_EUNSUPPORTED, "io option",
                   "io_uring_queue_init", "Function not implemented");
        EXPECT_ERR(kvt_server_create(&srv, scfg, g), KVT_EUNSUPPORTED, "io option",
                   "io_uring_queue_init", "Function not implemented");
        _exit(atomic_load(&kvt_test_soft_failures));
    }
    int ws = 0;
    pid_t got = 0;
    for (int i = 0; i < 20000 && (got = waitpid(pid, &ws, WNOHANG)) == 0; i++) /* 20 s */
        nanosleep(&(struct timespec){0, 1000000}, NULL);
    if (got == 0) {
        kill(pid, SIGKILL);
        waitpid(pid, &ws, 0);
        fail_msg("the child without io_uring did not end within 20 s");
    }
    assert_int_equal(got, pid);
    assert_true(WIFEXITED(ws));
    assert_int_equal(WEXITSTATUS(ws), 0);
    kvt_config_destroy(scfg);
    kvt_config_destroy(cfg);
    kvt_geometry_destroy(g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_held_writes),
        cmocka_unit_test(test_server_reads_auth),
        cmocka_unit_test(test_layer_events),
        cmocka_unit_test(test_cuda_pins_only_a_tier_backed_whole),
        cmocka_unit_test(test_no_io_uring),
        cmocka_unit_test(test_cluster_join_refusals),
        cmocka_unit_test(test_metrics_unlistenable),
        cmocka_unit_test(test_client_refuses_answers),
        cmocka_unit_test(test_tasks_end_before_end_answer),
        cmocka_unit_test(test_cut_load_that_failed_says_why),
    };
    return kvt_test_dirs_done(cmocka_run_group_tests(tests, NULL, NULL));
}
