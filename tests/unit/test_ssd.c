/* test_ssd.c - the SSD block store: round trips, checksums, restart
 * recovery, geometry refusal, faults, bad directories, locking, striping,
 * capacity and sync deadlines; each on both backends. */
#include <sys/statvfs.h>

#include "test_ssd_util.h"

#include <limits.h>
#include "store/ssd_internal.h"

#define BLOCK 10000u /* not a multiple of 4096: slots are padded to 12288 */

static void test_round_trip(void **state)
{
    const char *io = test_io(state);
    char dir[PATH_MAX];
    tmp_dir(dir, sizeof dir);
    kvt_ssd_params p = test_params(dir, io, BLOCK, 16);
    kvt_ssd *s = NULL;
    assert_ok(kvt__ssd_open(&s, &p));
    assert_string_equal(kvt__ssd_backend(s), strcmp(io, "uring") == 0 ? "io_uring" : "threads");
    assert_int_equal(kvt__ssd_blocks_total(s), 16);
    uint8_t *w = aligned_buf(BLOCK), *r = aligned_buf(BLOCK);
    for (uint32_t i = 0; i < 8; i++) {
        uint32_t slot = kvt__ssd_alloc(s);
        assert_int_equal(slot, i);
        fill(w, BLOCK, i);
        assert_ok(write_sync(s, slot, w, test_key(i), test_key(0), false));
    }
    for (uint32_t i = 0; i < 8; i++) {
        fill(w, BLOCK, i);
        memset(r, 0, BLOCK);
        assert_ok(read_sync(s, i, r, test_key(i)));
        assert_memory_equal(r, w, BLOCK);
    }
    kvt_ssd_stats st;
    kvt__ssd_stats(s, &st);
    assert_int_equal(st.writes, 8);
    assert_int_equal(st.reads, 8);
    assert_int_equal(st.write_bytes, 8ull * BLOCK);
    assert_true(st.journal_records >= 8);
    assert_ok(kvt__ssd_sync(s, kvt__deadline_ns(1000)));
    kvt__ssd_close(s);
    free(w);
    free(r);
    rm_rf(dir);
}

static void corrupt_file(const char *dir, const char *name, uint64_t off)
{
    char path[PATH_MAX];
    join_path(path, sizeof path, dir, name);
    int fd = open(path, O_RDWR);
    assert_true(fd >= 0);
    uint8_t b = 0;
    assert_int_equal(pread(fd, &b, 1, (off_t)off), 1);
    b ^= 0xff;
    assert_int_equal(pwrite(fd, &b, 1, (off_t)off), 1);
    fsync(fd);
    close(fd);
}

static void test_checksum(void **state)
{
    const char *io = test_io(state);
    char dir[PATH_MAX];
    tmp_dir(dir, sizeof dir);
    kvt_ssd_params p = test_params(dir, io, BLOCK, 4);
    kvt_ssd *s = NULL;
    assert_ok(kvt__ssd_open(&s, &p));
    uint8_t *w = aligned_buf(BLOCK), *r = aligned_buf(BLOCK);
    fill(w, BLOCK, 7);
    for (uint32_t i = 0; i < 2; i++) {
        assert_int_equal(kvt__ssd_alloc(s), i);
        assert_ok(write_sync(s, i, w, test_key(i), test_key(0), false));
    }
    /* On disk: one byte of slot 1 flipped behind the store's back. */
    corrupt_file(dir, KVT_SSD_DATA_NAME, 12288 + 5000);
    assert_status(read_sync(s, 1, r, test_key(1)), KVT_ECORRUPT);
    assert_ok(read_sync(s, 0, r, test_key(0)));
    /* Injected: the next read returns a flipped byte; the one after is fine. */
    kvt__ssd_inject(s, KVT_SSD_FAULT_CORRUPT, false, 0);
    assert_status(read_sync(s, 0, r, test_key(0)), KVT_ECORRUPT);
    assert_ok(read_sync(s, 0, r, test_key(0)));
    assert_memory_equal(r, w, BLOCK);
    /* The right bytes under another key are corrupt too. */
    assert_status(read_sync(s, 0, r, test_key(1)), KVT_ECORRUPT);
    kvt_ssd_stats st;
    kvt__ssd_stats(s, &st);
    assert_int_equal(st.corrupt_reads, 3);
    kvt__ssd_close(s);
    free(w);
    free(r);
    rm_rf(dir);
}

typedef struct rec_log {
    uint32_t n;
    uint32_t slot[64];
    kvt_hash128 key[64], parent[64];
    bool has_parent[64];
} rec_log;

static void log_recovered(void *arg, uint32_t slot, kvt_hash128 key, kvt_hash128 parent,
                          bool has_parent)
{
    rec_log *l = arg;
    assert_true(l->n < 64);
    l->slot[l->n] = slot;
    l->key[l->n] = key;
    l->parent[l->n] = parent;
    l->has_parent[l->n] = has_parent;
    l->n++;
}

static int log_find(const rec_log *l, kvt_hash128 key)
{
    for (uint32_t i = 0; i < l->n; i++)
        if (kvt__hash_eq(l->key[i], key)) return (int)i;
    return -1;
}

/* A chain k1 <- k2 <- ... <- k12 written child-first into slots striped
 * over two directories; three freed. A restart recovers exactly the other
 * nine, each after its parent, with their data. */
static void test_restart(void **state)
{
    const char *io = test_io(state);
    char a[PATH_MAX], b[PATH_MAX], dirs[2 * PATH_MAX + 2];
    tmp_dir(a, sizeof a);
    tmp_dir(b, sizeof b);
    snprintf(dirs, sizeof dirs, "%s,%s", a, b);
    kvt_ssd_params p = test_params(dirs, io, BLOCK, 32);
    kvt_ssd *s = NULL;
    assert_ok(kvt__ssd_open(&s, &p));
    uint8_t *w = aligned_buf(BLOCK), *r = aligned_buf(BLOCK);
    uint32_t slot_of[13];
    for (uint32_t i = 12; i >= 1; i--) {
        slot_of[i] = kvt__ssd_alloc(s);
        fill(w, BLOCK, 100 + i);
        assert_ok(write_sync(s, slot_of[i], w, test_key(i), test_key(i - 1), i > 1));
    }
    /* Free 3, 7 and 12: 4..6 become roots' children of a missing parent. */
    kvt__ssd_free(s, slot_of[3]);
    kvt__ssd_free(s, slot_of[7]);
    kvt__ssd_free(s, slot_of[12]);
    kvt__ssd_close(s);

    assert_ok(kvt__ssd_open(&s, &p));
    assert_int_equal(kvt__ssd_blocks_free(s), 32 - 9);
    rec_log log = {0};
    assert_int_equal(kvt__ssd_recover(s, log_recovered, &log), 9);
    for (uint32_t i = 1; i <= 12; i++) {
        int at = log_find(&log, test_key(i));
        if (i == 3 || i == 7 || i == 12) {
            assert_int_equal(at, -1);
            continue;
        }
        assert_true(at >= 0);
        assert_int_equal(log.slot[at], slot_of[i]);
        assert_int_equal(log.has_parent[at], i > 1);
        int parent_at = log_find(&log, test_key(i - 1));
        if (parent_at >= 0) assert_true(parent_at < at);
        fill(w, BLOCK, 100 + i);
        assert_ok(read_sync(s, slot_of[i], r, test_key(i)));
        assert_memory_equal(r, w, BLOCK);
    }
    /* Slots in use stay allocated; the freed ones are handed out again. */
    uint32_t got = 0;
    while (kvt__ssd_alloc(s) != KVT_SSD_NONE) got++;
    assert_int_equal(got, 23);
    kvt__ssd_close(s);
    free(w);
    free(r);
    rm_rf(a);
    rm_rf(b);
}

static void test_geometry_mismatch(void **state)
{
    const char *io = test_io(state);
    char dir[PATH_MAX];
    tmp_dir(dir, sizeof dir);
    kvt_ssd_params p = test_params(dir, io, BLOCK, 8);
    kvt_ssd *s = NULL;
    assert_ok(kvt__ssd_open(&s, &p));
    uint8_t *w = aligned_buf(BLOCK);
    assert_int_equal(kvt__ssd_alloc(s), 0);
    assert_ok(write_sync(s, 0, w, test_key(1), test_key(0), false));
    kvt__ssd_close(s);

    kvt_ssd_params q = p;
    q.digest = 0x9999;
    q.describe = "test geometry B";
    assert_status(kvt__ssd_open(&s, &q), KVT_EGEOMETRY);
    const char *msg = kvt_last_error();
    assert_non_null(strstr(msg, "geometry digest"));
    assert_non_null(strstr(msg, "0x0000000000001234"));
    assert_non_null(strstr(msg, "0x0000000000009999"));
    assert_non_null(strstr(msg, "\"test geometry A\""));
    assert_non_null(strstr(msg, "\"test geometry B\""));
    assert_non_null(strstr(msg, dir));

    q = p;
    q.block_bytes = BLOCK + 1;
    assert_status(kvt__ssd_open(&s, &q), KVT_EGEOMETRY);
    assert_non_null(strstr(kvt_last_error(), "block_bytes"));
    assert_non_null(strstr(kvt_last_error(), "10000"));
    assert_non_null(strstr(kvt_last_error(), "10001"));

    /* A changed capacity alone opens in place, keeping the block (the
     * resize tests in test_ssd_journal.c cover it). */
    rec_log log = {0};
    q = p;
    q.capacity_bytes *= 2;
    assert_ok(kvt__ssd_open(&s, &q));
    assert_int_equal(kvt__ssd_recover(s, log_recovered, &log), 1);
    kvt__ssd_close(s);

    /* The same geometry still opens with its block; fresh wipes a mismatch. */
    assert_ok(kvt__ssd_open(&s, &p));
    assert_int_equal(kvt__ssd_recover(s, log_recovered, &log), 1);
    kvt__ssd_close(s);
    q = p;
    q.digest = 0x9999;
    q.fresh = true;
    assert_ok(kvt__ssd_open(&s, &q));
    assert_int_equal(kvt__ssd_recover(s, log_recovered, &log), 0);
    assert_int_equal(kvt__ssd_blocks_free(s), 8);
    kvt__ssd_close(s);
    assert_status(kvt__ssd_open(&s, &p), KVT_EGEOMETRY); /* now it is B's */

    /* Damaged metadata: refused as corrupt, wiped when fresh. */
    corrupt_file(dir, KVT_SSD_META_NAME, 40);
    q.fresh = false;
    assert_status(kvt__ssd_open(&s, &q), KVT_ECORRUPT);
    assert_non_null(strstr(kvt_last_error(), KVT_SSD_META_NAME));
    q.fresh = true;
    assert_ok(kvt__ssd_open(&s, &q));
    kvt__ssd_close(s);
    free(w);
    rm_rf(dir);
}

typedef struct fault_case {
    kvt_ssd_fault kind;
    bool on_write;
    kvt_status want;
} fault_case;

static void test_faults(void **state)
{
    const char *io = test_io(state);
    char dir[PATH_MAX];
    tmp_dir(dir, sizeof dir);
    kvt_ssd_params p = test_params(dir, io, BLOCK, 16);
    kvt_ssd *s = NULL;
    assert_ok(kvt__ssd_open(&s, &p));
    uint8_t *w = aligned_buf(BLOCK), *r = aligned_buf(BLOCK);
    static const fault_case cases[] = {
        {KVT_SSD_FAULT_ENOSPC, true, KVT_ENOSPC}, {KVT_SSD_FAULT_EIO, true, KVT_EIO},
        {KVT_SSD_FAULT_SHORT, true, KVT_EIO},     {KVT_SSD_FAULT_EIO, false, KVT_EIO},
        {KVT_SSD_FAULT_SHORT, false, KVT_EIO},    {KVT_SSD_FAULT_CORRUPT, false, KVT_ECORRUPT},
    };
    uint32_t key = 1;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        uint32_t slot = kvt__ssd_alloc(s);
        fill(w, BLOCK, key);
        /* nth = 1: the first I/O passes, the second fails, the third passes. */
        kvt__ssd_inject(s, cases[c].kind, cases[c].on_write, 1);
        if (cases[c].on_write) {
            assert_ok(write_sync(s, slot, w, test_key(key), test_key(0), false));
            assert_status(write_sync(s, slot, w, test_key(key), test_key(0), false), cases[c].want);
            assert_ok(write_sync(s, slot, w, test_key(key), test_key(0), false));
        } else {
            assert_ok(write_sync(s, slot, w, test_key(key), test_key(0), false));
            assert_ok(read_sync(s, slot, r, test_key(key)));
            assert_status(read_sync(s, slot, r, test_key(key)), cases[c].want);
            assert_ok(read_sync(s, slot, r, test_key(key)));
        }
        assert_ok(read_sync(s, slot, r, test_key(key)));
        assert_memory_equal(r, w, BLOCK);
        key++;
    }
    /* A write that failed into a fresh slot is not recovered. */
    uint32_t slot = kvt__ssd_alloc(s);
    kvt__ssd_inject(s, KVT_SSD_FAULT_EIO, true, 0);
    assert_status(write_sync(s, slot, w, test_key(99), test_key(0), false), KVT_EIO);
    kvt_ssd_stats st;
    kvt__ssd_stats(s, &st);
    assert_int_equal(st.write_errors, 4);
    assert_int_equal(st.read_errors, 2);
    kvt__ssd_close(s);
    rec_log log = {0};
    assert_ok(kvt__ssd_open(&s, &p));
    assert_int_equal(kvt__ssd_recover(s, log_recovered, &log), 6);
    assert_int_equal(log_find(&log, test_key(99)), -1);
    kvt__ssd_close(s);
    free(w);
    free(r);
    rm_rf(dir);
}

static void test_bad_directories(void **state)
{
    const char *io = test_io(state);
    char dir[PATH_MAX], path[PATH_MAX + 64];
    tmp_dir(dir, sizeof dir);
    kvt_ssd *s = NULL;
    /* A missing parent: not created recursively, a clear error. */
    snprintf(path, sizeof path, "%s/no/such/dir", dir);
    kvt_ssd_params p = test_params(path, io, BLOCK, 4);
    assert_status(kvt__ssd_open(&s, &p), KVT_EIO);
    assert_non_null(strstr(kvt_last_error(), path));
    assert_non_null(strstr(kvt_last_error(), strerror(ENOENT)));
    /* A path under a regular file fails for root too (ENOTDIR). */
    snprintf(path, sizeof path, "%s/file", dir);
    int fd = open(path, O_CREAT | O_WRONLY, 0644);
    assert_true(fd >= 0);
    close(fd);
    snprintf(path, sizeof path, "%s/file/sub", dir);
    p.dirs = path;
    assert_status(kvt__ssd_open(&s, &p), KVT_EIO);
    assert_non_null(strstr(kvt_last_error(), path));
    assert_non_null(strstr(kvt_last_error(), strerror(ENOTDIR)));
    /* A read-only directory (meaningful only without root's override). */
    if (geteuid() != 0) {
        snprintf(path, sizeof path, "%s/ro", dir);
        assert_int_equal(mkdir(path, 0555), 0);
        assert_status(kvt__ssd_open(&s, &p), KVT_EIO);
        assert_non_null(strstr(kvt_last_error(), path));
        chmod(path, 0755);
    }
    rm_rf(dir);
}

static void test_lock(void **state)
{
    const char *io = test_io(state);
    char dir[PATH_MAX];
    tmp_dir(dir, sizeof dir);
    kvt_ssd_params p = test_params(dir, io, BLOCK, 4);
    kvt_ssd *s = NULL, *t = NULL;
    assert_ok(kvt__ssd_open(&s, &p));
    assert_status(kvt__ssd_open(&t, &p), KVT_EBUSY);
    assert_non_null(strstr(kvt_last_error(), dir));
    assert_null(t);
    kvt__ssd_close(s);
    assert_ok(kvt__ssd_open(&t, &p));
    kvt__ssd_close(t);
    rm_rf(dir);
}

static uint64_t file_size(const char *dir, const char *name)
{
    char path[PATH_MAX];
    join_path(path, sizeof path, dir, name);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    return (uint64_t)st.st_size;
}

/* 10 slots over 3 directories: 4 + 3 + 3, slot g in directory g % 3; the
 * data files add up to exactly 10 slots, under the capacity. */
static void test_striping_capacity(void **state)
{
    const char *io = test_io(state);
    char d[3][PATH_MAX], dirs[3 * PATH_MAX + 3];
    for (int i = 0; i < 3; i++) tmp_dir(d[i], sizeof d[i]);
    snprintf(dirs, sizeof dirs, "%s,%s,%s", d[0], d[1], d[2]);
    kvt_ssd_params p = test_params(dirs, io, BLOCK, 10);
    p.capacity_bytes += 12287; /* not one slot more */
    kvt_ssd *s = NULL;
    assert_ok(kvt__ssd_open(&s, &p));
    assert_int_equal(kvt__ssd_blocks_total(s), 10);
    assert_int_equal(file_size(d[0], KVT_SSD_DATA_NAME), 4 * 12288);
    assert_int_equal(file_size(d[1], KVT_SSD_DATA_NAME), 3 * 12288);
    assert_int_equal(file_size(d[2], KVT_SSD_DATA_NAME), 3 * 12288);
    uint8_t *w = aligned_buf(BLOCK), *r = aligned_buf(BLOCK);
    for (uint32_t i = 0; i < 10; i++) {
        assert_int_equal(kvt__ssd_alloc(s), i);
        fill(w, BLOCK, i);
        assert_ok(write_sync(s, i, w, test_key(i), test_key(0), false));
    }
    assert_int_equal(kvt__ssd_alloc(s), KVT_SSD_NONE);
    assert_int_equal(kvt__ssd_blocks_free(s), 0);
    kvt__ssd_close(s);
    /* Slot 4 is directory 1's local slot 1: check the bytes are there. */
    char path[PATH_MAX];
    join_path(path, sizeof path, d[1], KVT_SSD_DATA_NAME);
    int fd = open(path, O_RDONLY);
    assert_true(fd >= 0);
    assert_int_equal(pread(fd, r, BLOCK, 12288), BLOCK);
    close(fd);
    fill(w, BLOCK, 4);
    assert_memory_equal(r, w, BLOCK);
    /* Capacity below one slot, or fewer slots than directories: EINVAL. */
    p.capacity_bytes = 12287;
    assert_status(kvt__ssd_open(&s, &p), KVT_EINVAL);
    assert_non_null(strstr(kvt_last_error(), "12287"));
    p.capacity_bytes = 2 * 12288;
    assert_status(kvt__ssd_open(&s, &p), KVT_EINVAL);
    free(w);
    free(r);
    for (int i = 0; i < 3; i++) rm_rf(d[i]);
}

typedef struct gate {
    waiter w;
    bool open, entered;
} gate;

static void gated_done(void *arg, kvt_status st)
{
    gate *g = arg;
    (void)st;
    uint64_t deadline = kvt__deadline_ns(WAIT_MS);
    pthread_mutex_lock(&g->w.mu);
    g->entered = true;
    pthread_cond_broadcast(&g->w.cv);
    while (!g->open && kvt__cond_wait_until(&g->w.cv, &g->w.mu, deadline)) {}
    pthread_mutex_unlock(&g->w.mu);
}

/* A done callback held shut keeps its write unfinished: sync times out at
 * its deadline, then succeeds once the callback returns. */
static void test_sync_deadline(void **state)
{
    const char *io = test_io(state);
    char dir[PATH_MAX];
    tmp_dir(dir, sizeof dir);
    kvt_ssd_params p = test_params(dir, io, BLOCK, 4);
    kvt_ssd *s = NULL;
    assert_ok(kvt__ssd_open(&s, &p));
    assert_ok(kvt__ssd_sync(s, kvt__now_ns())); /* nothing in flight */
    uint8_t *w = aligned_buf(BLOCK);
    gate g = {0};
    waiter_init(&g.w);
    assert_int_equal(kvt__ssd_alloc(s), 0);
    assert_ok(kvt__ssd_write(s, 0, w, test_key(1), test_key(0), false, gated_done, &g));
    uint64_t t0 = kvt__now_ns();
    assert_status(kvt__ssd_sync(s, t0 + 50000000ull), KVT_ETIMEDOUT);
    assert_true(kvt__now_ns() - t0 >= 50000000ull);
    assert_non_null(strstr(kvt_last_error(), "in flight"));
    pthread_mutex_lock(&g.w.mu);
    g.open = true;
    pthread_cond_broadcast(&g.w.cv);
    pthread_mutex_unlock(&g.w.mu);
    assert_ok(kvt__ssd_sync(s, kvt__deadline_ns(WAIT_MS)));
    kvt__ssd_close(s);
    waiter_fini(&g.w);
    free(w);
    rm_rf(dir);
}

static void never_done(void *arg, kvt_status st) { (void)arg; (void)st; fail_msg("done called"); }

static void test_bad_args(void **state)
{
    const char *io = test_io(state);
    char dir[PATH_MAX];
    tmp_dir(dir, sizeof dir);
    kvt_ssd *s = NULL;
    kvt_ssd_params p = test_params(dir, io, 0, 4);
    assert_status(kvt__ssd_open(&s, &p), KVT_EINVAL);
    assert_non_null(strstr(kvt_last_error(), "block_bytes 0"));
    p = test_params(dir, io, BLOCK, 4);
    p.queue_depth = 0;
    assert_status(kvt__ssd_open(&s, &p), KVT_EINVAL);
    assert_non_null(strstr(kvt_last_error(), "queue_depth 0"));
    p = test_params(dir, "bogus", BLOCK, 4);
    assert_status(kvt__ssd_open(&s, &p), KVT_EINVAL);
    assert_non_null(strstr(kvt_last_error(), "\"bogus\""));
    char twice[2 * PATH_MAX + 2];
    snprintf(twice, sizeof twice, "%s,%s", dir, dir);
    p = test_params(twice, io, BLOCK, 4);
    assert_status(kvt__ssd_open(&s, &p), KVT_EINVAL);
    assert_non_null(strstr(kvt_last_error(), "twice"));
    p = test_params(dir, io, BLOCK, 4);
    assert_status(kvt__ssd_open(NULL, &p), KVT_EINVAL);
    assert_status(kvt__ssd_open(&s, NULL), KVT_EINVAL);

    assert_ok(kvt__ssd_open(&s, &p));
    uint8_t *w = aligned_buf(BLOCK + 4096);
    kvt_hash128 k = test_key(1);
    assert_status(kvt__ssd_write(s, 0, w, k, k, false, never_done, NULL), KVT_EINVAL);
    assert_non_null(strstr(kvt_last_error(), "not allocated"));
    assert_int_equal(kvt__ssd_alloc(s), 0);
    assert_status(kvt__ssd_write(s, 0, w + 512, k, k, false, never_done, NULL), KVT_EINVAL);
    assert_non_null(strstr(kvt_last_error(), "aligned"));
    assert_status(kvt__ssd_write(s, 4, w, k, k, false, never_done, NULL), KVT_EINVAL);
    assert_non_null(strstr(kvt_last_error(), "slot 4"));
    assert_status(kvt__ssd_read(s, 0, w, k, NULL, NULL), KVT_EINVAL);
    /* A slot never written reads as corrupt, through done. */
    assert_status(read_sync(s, 0, w, k), KVT_ECORRUPT);
    kvt__ssd_free(s, 3); /* not allocated: ignored */
    kvt__ssd_close(s);
    kvt__ssd_close(NULL);
    free(w);
    rm_rf(dir);
}

/* An SSD tier larger than its filesystem's free space is refused before a
 * byte is written, naming both numbers, and leaves no data file behind
 * (it used to fill the disk and leave a partial file). */
static void test_capacity_beyond_free_space(void **state)
{
    const char *io = test_io(state);
    char dir[PATH_MAX];
    tmp_dir(dir, sizeof dir);
    struct statvfs vfs;
    assert_int_equal(statvfs(dir, &vfs), 0);
    uint64_t block = 64ull << 20, avail = (uint64_t)vfs.f_bavail * vfs.f_frsize;
    uint32_t slots = (uint32_t)(avail / block + 64); /* 4 GiB more than is free */
    kvt_ssd_params p = test_params(dir, io, block, slots);
    kvt_ssd *s = NULL;
    assert_status(kvt__ssd_open(&s, &p), KVT_ENOSPC);
    assert_non_null(strstr(kvt_last_error(), "bytes free: lower ssd_capacity or free space"));
    assert_non_null(strstr(kvt_last_error(), dir));
    char data[PATH_MAX + 32];
    snprintf(data, sizeof data, "%s/kvtier.data", dir);
    assert_int_not_equal(access(data, F_OK), 0);
    rm_rf(dir);
}

/* A grow the filesystem cannot hold is refused like a new tier that large,
 * before the metadata names the new slots: the old size still opens with
 * its block. */
static void test_grow_beyond_free_space(void **state)
{
    const char *io = test_io(state);
    char dir[PATH_MAX];
    tmp_dir(dir, sizeof dir);
    uint64_t block = 64ull << 20;
    kvt_ssd_params p = test_params(dir, io, block, 1);
    kvt_ssd *s = NULL;
    assert_ok(kvt__ssd_open(&s, &p));
    uint8_t *w = aligned_buf(block), *r = aligned_buf(block);
    fill(w, block, 77);
    assert_int_equal(kvt__ssd_alloc(s), 0);
    assert_ok(write_sync(s, 0, w, test_key(77), test_key(0), false));
    kvt__ssd_close(s);
    struct statvfs vfs;
    assert_int_equal(statvfs(dir, &vfs), 0);
    kvt_ssd_params q = p;
    q.capacity_bytes = ((uint64_t)vfs.f_bavail * vfs.f_frsize / block + 64) * block;
    assert_status(kvt__ssd_open(&s, &q), KVT_ENOSPC);
    assert_non_null(strstr(kvt_last_error(), "lower ssd_capacity or free space"));
    assert_int_equal(file_size(dir, KVT_SSD_DATA_NAME), block);
    assert_ok(kvt__ssd_open(&s, &p));
    rec_log log = {0};
    assert_int_equal(kvt__ssd_recover(s, log_recovered, &log), 1);
    assert_ok(read_sync(s, 0, r, test_key(77)));
    assert_memory_equal(r, w, block);
    kvt__ssd_close(s);
    free(w);
    free(r);
    rm_rf(dir);
}

/* Bytes of disk behind dir's data file (st_blocks). */
static uint64_t data_disk_bytes(const char *dir)
{
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/%s", dir, KVT_SSD_DATA_NAME);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    return (uint64_t)st.st_blocks * 512u;
}

#define SLOT 12288u /* BLOCK's slot */

/* Two stores on one byte budget (the node server's ssd_capacity over its
 * geometries): each may use all of it, together never more. A slot takes
 * disk when first allocated; kvt__ssd_release punches free slots out and
 * gives their bytes to the other store; a reopen charges what it recovers
 * and punches out what no block uses. Every kept block reads back intact. */
static void test_shared_budget(void **state)
{
    const char *io = test_io(state);
    char a[PATH_MAX], b[PATH_MAX];
    tmp_dir(a, sizeof a);
    tmp_dir(b, sizeof b);
    kvt_pool_budget budget = {.limit = 8ull * SLOT};
    kvt_ssd_params pa = test_params(a, io, BLOCK, 16), pb = test_params(b, io, BLOCK, 16);
    pa.budget = pb.budget = &budget;
    kvt_ssd *sa = NULL, *sb = NULL;
    assert_ok(kvt__ssd_open(&sa, &pa));
    assert_ok(kvt__ssd_open(&sb, &pb));
    assert_int_equal(kvt__ssd_blocks_total(sa), 16);
    assert_int_equal(kvt__ssd_blocks_free(sa), 8); /* the budget's room, not 16 */
    assert_int_equal(data_disk_bytes(a), 0);       /* sparse until used */
    uint8_t *w = aligned_buf(BLOCK), *r = aligned_buf(BLOCK);
    uint32_t slot[8];
    for (uint32_t i = 0; i < 8; i++) {
        slot[i] = kvt__ssd_alloc(sa);
        assert_int_not_equal(slot[i], KVT_SSD_NONE);
        fill(w, BLOCK, 500 + i);
        assert_ok(write_sync(sa, slot[i], w, test_key(500 + i), test_key(0), false));
    }
    assert_int_equal(kvt__ssd_alloc(sa), KVT_SSD_NONE); /* A has the whole budget */
    assert_int_equal(kvt__ssd_alloc(sb), KVT_SSD_NONE); /* and B none of it */
    assert_int_equal(kvt__ssd_blocks_free(sb), 0);
    assert_int_equal(atomic_load(&budget.used), 8ull * SLOT);
    assert_true(data_disk_bytes(a) >= 8ull * SLOT);
    assert_int_equal(kvt__ssd_release(sa, 4), 0); /* nothing free to give */

    kvt__ssd_free(sa, slot[2]);
    kvt__ssd_free(sa, slot[5]);
    assert_true(kvt__ssd_wait_reclaim(sa, kvt__deadline_ns(WAIT_MS)));
    uint64_t before = data_disk_bytes(a);
    assert_int_equal(kvt__ssd_release(sa, 4), 2);
    assert_int_equal(atomic_load(&budget.used), 6ull * SLOT);
    assert_int_equal(data_disk_bytes(a), before - 2ull * SLOT);
    assert_int_equal(kvt__ssd_blocks_used(sa), 6);
    uint32_t b0 = kvt__ssd_alloc(sb), b1 = kvt__ssd_alloc(sb);
    assert_int_not_equal(b0, KVT_SSD_NONE);
    assert_int_not_equal(b1, KVT_SSD_NONE);
    assert_int_equal(kvt__ssd_alloc(sb), KVT_SSD_NONE);
    fill(w, BLOCK, 900);
    assert_ok(write_sync(sb, b0, w, test_key(900), test_key(0), false));
    for (uint32_t i = 0; i < 8; i++) { /* the punched slots' neighbours are intact */
        if (i == 2 || i == 5) continue;
        fill(w, BLOCK, 500 + i);
        assert_ok(read_sync(sa, slot[i], r, test_key(500 + i)));
        assert_memory_equal(r, w, BLOCK);
    }

    /* A restart of A while B holds 2 slots: its 6 blocks are charged again. */
    kvt__ssd_close(sa);
    assert_int_equal(atomic_load(&budget.used), 2ull * SLOT);
    assert_ok(kvt__ssd_open(&sa, &pa));
    rec_log log = {0};
    assert_int_equal(kvt__ssd_recover(sa, log_recovered, &log), 6);
    assert_int_equal(atomic_load(&budget.used), 8ull * SLOT);
    assert_int_equal(kvt__ssd_alloc(sa), KVT_SSD_NONE);
    fill(w, BLOCK, 507);
    assert_ok(read_sync(sa, slot[7], r, test_key(507)));
    assert_memory_equal(r, w, BLOCK);
    kvt__ssd_close(sa);
    kvt__ssd_close(sb);
    assert_int_equal(atomic_load(&budget.used), 0);

    /* A directory a store without a budget preallocated: reopened on a
     * budget, the slots no block uses give their disk back. */
    char c[PATH_MAX];
    tmp_dir(c, sizeof c);
    kvt_ssd_params plain = test_params(c, io, BLOCK, 16), pc = plain;
    pc.budget = &budget;
    assert_ok(kvt__ssd_open(&sb, &plain));
    assert_true(data_disk_bytes(c) >= 16ull * SLOT);
    assert_int_equal(kvt__ssd_alloc(sb), 0);
    fill(w, BLOCK, 901);
    assert_ok(write_sync(sb, 0, w, test_key(901), test_key(0), false));
    kvt__ssd_close(sb);
    assert_ok(kvt__ssd_open(&sb, &pc));
    assert_int_equal(kvt__ssd_recover(sb, log_recovered, &log), 1);
    assert_true(data_disk_bytes(c) < 4ull * SLOT);
    assert_int_equal(atomic_load(&budget.used), 1ull * SLOT);
    assert_ok(read_sync(sb, 0, r, test_key(901)));
    assert_memory_equal(r, w, BLOCK);
    kvt__ssd_close(sb);
    free(w);
    free(r);
    rm_rf(a);
    rm_rf(b);
    rm_rf(c);
}

/* On a budget, the free space check asks for the budget's room: a store
 * whose budget is larger than the filesystem's free space is refused naming
 * both numbers, even though its sparse file takes nothing yet. */
static void test_budget_beyond_free_space(void **state)
{
    const char *io = test_io(state);
    char dir[PATH_MAX];
    tmp_dir(dir, sizeof dir);
    struct statvfs vfs;
    assert_int_equal(statvfs(dir, &vfs), 0);
    uint64_t block = 64ull << 20, avail = (uint64_t)vfs.f_bavail * vfs.f_frsize;
    uint32_t slots = (uint32_t)(avail / block + 64);
    kvt_pool_budget budget = {.limit = (uint64_t)slots * block};
    kvt_ssd_params p = test_params(dir, io, block, slots);
    p.budget = &budget;
    kvt_ssd *s = NULL;
    assert_status(kvt__ssd_open(&s, &p), KVT_ENOSPC);
    assert_non_null(strstr(kvt_last_error(), "bytes free: lower ssd_capacity or free space"));
    assert_non_null(strstr(kvt_last_error(), "of ssd_capacity not yet used"));
    assert_int_equal(atomic_load(&budget.used), 0);
    budget.used = budget.limit - 2 * block; /* the others use all but 2 blocks: room enough */
    assert_ok(kvt__ssd_open(&s, &p));
    kvt__ssd_close(s);
    assert_int_equal(atomic_load(&budget.used), budget.limit - 2 * block);
    rm_rf(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        SSD_TESTS(test_round_trip),      SSD_TESTS(test_checksum),
        SSD_TESTS(test_restart),         SSD_TESTS(test_geometry_mismatch),
        SSD_TESTS(test_faults),          SSD_TESTS(test_bad_directories),
        SSD_TESTS(test_lock),            SSD_TESTS(test_striping_capacity),
        SSD_TESTS(test_sync_deadline),   SSD_TESTS(test_bad_args),
        SSD_TESTS(test_capacity_beyond_free_space),
        SSD_TESTS(test_grow_beyond_free_space),
        SSD_TESTS(test_shared_budget),
        SSD_TESTS(test_budget_beyond_free_space),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
