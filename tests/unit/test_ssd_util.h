/* test_ssd_util.h - helpers the SSD store tests share (header-only: each
 * test file is its own executable). Every test runs once per backend: its
 * cmocka state is the io name ("uring" or "threads"); uring is skipped only
 * where io_uring cannot be set up on the machine. */
#ifndef KVT_TESTS_SSD_UTIL_H
#define KVT_TESTS_SSD_UTIL_H

#include "support.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "store/io.h"
#include "store/ssd.h"
#include "store/ssd_format.h"
#include "util/clock.h"
#include "util/sync.h"

#define SSD_TESTS(fn) cmocka_unit_test_prestate(fn, "uring"), cmocka_unit_test_prestate(fn, "threads")
#define WAIT_MS 20000

static inline const char *test_io(void **state)
{
    const char *io = *state;
    if (strcmp(io, "uring") == 0 && !kvt__io_uring_probe()) skip();
    return io;
}

/* A fresh directory under $KVTIER_TEST_TMP (or /tmp); out holds PATH_MAX. */
static inline void tmp_dir(char *out, size_t cap)
{
    const char *base = getenv("KVTIER_TEST_TMP");
    if (!base || !*base) base = "/tmp";
    mkdir(base, 0755);
    snprintf(out, cap, "%s/ssdtest.XXXXXX", base);
    assert_non_null(mkdtemp(out));
}

static inline int rm_one(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb; (void)flag; (void)ftw;
    return remove(p);
}
static inline void rm_rf(const char *path) { nftw(path, rm_one, 16, FTW_DEPTH | FTW_PHYS); }

typedef struct op {
    pthread_mutex_t *mu;
    pthread_cond_t *cv;
    bool fin;
    kvt_status st;
} op;

typedef struct waiter {
    pthread_mutex_t mu;
    pthread_cond_t cv;
} waiter;

static inline void waiter_init(waiter *w)
{
    pthread_mutex_init(&w->mu, NULL);
    assert_int_equal(kvt__cond_init(&w->cv), 0);
}
static inline void waiter_fini(waiter *w)
{
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
}
static inline void op_init(op *o, waiter *w) { *o = (op){&w->mu, &w->cv, false, KVT_OK}; }

static inline void op_done(void *arg, kvt_status st)
{
    op *o = arg;
    pthread_mutex_lock(o->mu);
    o->fin = true;
    o->st = st;
    pthread_cond_broadcast(o->cv);
    pthread_mutex_unlock(o->mu);
}

static inline kvt_status op_wait(op *o)
{
    uint64_t deadline = kvt__deadline_ns(WAIT_MS);
    pthread_mutex_lock(o->mu);
    while (!o->fin && kvt__cond_wait_until(o->cv, o->mu, deadline)) {}
    bool fin = o->fin;
    kvt_status st = o->st;
    pthread_mutex_unlock(o->mu);
    if (!fin) fail_msg("an ssd operation did not complete in %d ms", WAIT_MS);
    return st;
}

static inline kvt_ssd_params test_params(const char *dirs, const char *io, uint64_t block_bytes,
                                         uint32_t slots)
{
    uint64_t slot = (block_bytes + 4095) / 4096 * 4096;
    return (kvt_ssd_params){.dirs = dirs, .capacity_bytes = slot * slots, .block_bytes = block_bytes,
                            .digest = 0x1234, .describe = "test geometry A", .io = io,
                            .queue_depth = 8};
}

static inline kvt_hash128 test_key(uint64_t i) { return (kvt_hash128){i * 0x9e3779b97f4a7c15ull + 1, i}; }

static inline void *aligned_buf(uint64_t bytes)
{
    void *p = NULL;
    assert_int_equal(posix_memalign(&p, 4096, (bytes + 4095) / 4096 * 4096), 0);
    memset(p, 0, (bytes + 4095) / 4096 * 4096);
    return p;
}

static inline void fill(void *buf, uint64_t bytes, uint64_t seed)
{
    uint64_t st = seed;
    uint8_t *p = buf;
    for (uint64_t i = 0; i < bytes; i += 8) {
        uint64_t v = kvt__splitmix64(&st);
        memcpy(p + i, &v, bytes - i < 8 ? bytes - i : 8);
    }
}

static inline kvt_status write_sync(kvt_ssd *s, uint32_t slot, const void *buf, kvt_hash128 key,
                                    kvt_hash128 parent, bool has_parent)
{
    waiter w;
    waiter_init(&w);
    op o;
    op_init(&o, &w);
    kvt_status st = kvt__ssd_write(s, slot, buf, key, parent, has_parent, op_done, &o);
    if (st == KVT_OK) st = op_wait(&o);
    waiter_fini(&w);
    return st;
}

static inline kvt_status read_sync(kvt_ssd *s, uint32_t slot, void *buf, kvt_hash128 key)
{
    waiter w;
    waiter_init(&w);
    op o;
    op_init(&o, &w);
    kvt_status st = kvt__ssd_read(s, slot, buf, key, op_done, &o);
    if (st == KVT_OK) st = op_wait(&o);
    waiter_fini(&w);
    return st;
}

static inline void join_path(char *out, size_t cap, const char *dir, const char *name)
{
    int n = snprintf(out, cap, "%s/%s", dir, name);
    assert_true(n > 0 && (size_t)n < cap);
}

#endif
