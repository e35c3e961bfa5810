/* test_ssd_journal.c - the SSD store's journal: recovery from a journal cut
 * at every byte of its last record or garbled, compaction, and fsck (check
 * and repair); each on both backends. */
#include "test_ssd_util.h"

#include <limits.h>
#include "store/ssd_internal.h"

#define BLOCK 8192u
#define NBLK 5u

static uint32_t count_cb;
static void count_recovered(void *arg, uint32_t slot, kvt_hash128 key, kvt_hash128 parent,
                            bool has_parent)
{
    (void)arg; (void)slot; (void)key; (void)parent; (void)has_parent;
    count_cb++;
}

static uint32_t reopen_count(const kvt_ssd_params *p)
{
    kvt_ssd *s = NULL;
    assert_ok(kvt__ssd_open(&s, p));
    count_cb = 0;
    uint32_t n = kvt__ssd_recover(s, count_recovered, NULL);
    assert_int_equal(n, count_cb);
    kvt__ssd_close(s);
    return n;
}

static void write_blocks(const kvt_ssd_params *p, uint32_t n, uint64_t seed)
{
    kvt_ssd *s = NULL;
    assert_ok(kvt__ssd_open(&s, p));
    uint8_t *w = aligned_buf(BLOCK);
    for (uint32_t i = 0; i < n; i++) {
        uint32_t slot = kvt__ssd_alloc(s);
        assert_true(slot != KVT_SSD_NONE);
        fill(w, BLOCK, seed + i);
        assert_ok(write_sync(s, slot, w, test_key(seed + i), test_key(0), false));
    }
    kvt__ssd_close(s);
    free(w);
}

static uint8_t *read_whole(const char *dir, const char *name, uint64_t *len)
{
    char path[PATH_MAX];
    join_path(path, sizeof path, dir, name);
    int fd = open(path, O_RDONLY);
    assert_true(fd >= 0);
    struct stat st;
    assert_int_equal(fstat(fd, &st), 0);
    uint8_t *b = malloc((size_t)st.st_size + 1);
    assert_int_equal(pread(fd, b, (size_t)st.st_size, 0), st.st_size);
    close(fd);
    *len = (uint64_t)st.st_size;
    return b;
}

static void write_whole(const char *dir, const char *name, const uint8_t *b, uint64_t len)
{
    char path[PATH_MAX];
    join_path(path, sizeof path, dir, name);
    int fd = open(path, O_WRONLY | O_TRUNC);
    assert_true(fd >= 0);
    assert_int_equal(pwrite(fd, b, len, 0), (ssize_t)len);
    close(fd);
}

static void corrupt_byte(const char *dir, const char *name, uint64_t off)
{
    uint64_t len = 0;
    uint8_t *b = read_whole(dir, name, &len);
    assert_true(off < len);
    b[off] ^= 0x01;
    write_whole(dir, name, b, len);
    free(b);
}

/* Cut at every byte of the last record: the first NBLK-1 blocks survive
 * (all NBLK with the record whole), and the store keeps working after. */
static void test_truncated_tail(void **state)
{
    const char *io = test_io(state);
    char dir[PATH_MAX];
    tmp_dir(dir, sizeof dir);
    kvt_ssd_params p = test_params(dir, io, BLOCK, 16);
    write_blocks(&p, NBLK, 10);
    uint64_t len = 0;
    uint8_t *j = read_whole(dir, KVT_SSD_JOURNAL_NAME, &len);
    assert_int_equal(len, NBLK * KVT_SSD_REC_BYTES);
    for (uint64_t cut = len - KVT_SSD_REC_BYTES; cut <= len; cut++) {
        write_whole(dir, KVT_SSD_JOURNAL_NAME, j, cut);
        assert_int_equal(reopen_count(&p), cut == len ? NBLK : NBLK - 1);
    }
    /* After a cut, new writes append past the good prefix and survive. */
    write_whole(dir, KVT_SSD_JOURNAL_NAME, j, len - 7);
    write_blocks(&p, 2, 50);
    assert_int_equal(reopen_count(&p), NBLK - 1 + 2);
    free(j);
    rm_rf(dir);
}

/* A garbled record costs that record only: the records before and after it
 * are kept (issue 14 item 9: one damaged record used to drop every later
 * one); junk after the last record costs nothing; neither crashes. */
static void test_garbled(void **state)
{
    const char *io = test_io(state);
    char dir[PATH_MAX];
    tmp_dir(dir, sizeof dir);
    kvt_ssd_params p = test_params(dir, io, BLOCK, 16);
    write_blocks(&p, NBLK, 20);
    uint64_t len = 0;
    uint8_t *j = read_whole(dir, KVT_SSD_JOURNAL_NAME, &len);
    for (uint32_t rec = 0; rec < NBLK; rec++) {
        for (uint32_t byte = 0; byte < KVT_SSD_REC_BYTES; byte += 9) {
            uint8_t *g = malloc(len);
            memcpy(g, j, len);
            g[rec * KVT_SSD_REC_BYTES + byte] ^= 0x10;
            write_whole(dir, KVT_SSD_JOURNAL_NAME, g, len);
            assert_int_equal(reopen_count(&p), NBLK - 1);
            free(g);
        }
    }
    /* A record copied to another place fails its sequence number there. */
    uint8_t *g = malloc(len + 100);
    memcpy(g, j, len);
    memcpy(g + KVT_SSD_REC_BYTES, j + 2 * KVT_SSD_REC_BYTES, KVT_SSD_REC_BYTES);
    write_whole(dir, KVT_SSD_JOURNAL_NAME, g, len);
    assert_int_equal(reopen_count(&p), NBLK - 1);
    memcpy(g, j, len);
    memset(g + len, 0xa5, 100);
    write_whole(dir, KVT_SSD_JOURNAL_NAME, g, len + 100);
    assert_int_equal(reopen_count(&p), NBLK);
    free(g);
    free(j);
    rm_rf(dir);
}

/* Issue 14 item 9: a damaged record amid 40 keeps the 39 others (the old
 * scan kept the 10 before it); fsck counts the damaged record and the
 * blocks it cuts off; the store's first commit round compacts it away and
 * later writes append after the last good record. */
static void test_damaged_middle(void **state)
{
    const char *io = test_io(state);
    char dir[PATH_MAX];
    tmp_dir(dir, sizeof dir);
    kvt_ssd_params p = test_params(dir, io, BLOCK, 64);
    write_blocks(&p, 40, 300);
    corrupt_byte(dir, KVT_SSD_JOURNAL_NAME, 10 * KVT_SSD_REC_BYTES + 20);
    kvt_ssd_fsck_report rep;
    assert_ok(kvt__ssd_fsck(dir, false, &rep));
    assert_int_equal(rep.records, 39);
    assert_int_equal(rep.bad_records, 1);
    assert_int_equal(rep.skipped_records, 1);
    assert_int_equal(rep.blocks, 39);
    assert_int_equal(rep.orphan_blocks, 0); /* test blocks have no parents */
    assert_false(rep.journal_truncated);
    assert_int_equal(reopen_count(&p), 39);
    uint64_t len = 0;
    uint8_t *damaged = read_whole(dir, KVT_SSD_JOURNAL_NAME, &len);
    assert_ok(kvt__ssd_fsck(dir, true, &rep)); /* --repair drops the damaged record */
    assert_true(rep.repaired);
    assert_ok(kvt__ssd_fsck(dir, false, &rep));
    assert_int_equal(rep.records, 39);
    assert_int_equal(rep.bad_records, 0);
    write_whole(dir, KVT_SSD_JOURNAL_NAME, damaged, len); /* and once more for the store */
    free(damaged);
    write_blocks(&p, 3, 900); /* a commit round: compacts the damaged record away */
    assert_ok(kvt__ssd_fsck(dir, false, &rep));
    assert_int_equal(rep.records, 42);
    assert_int_equal(rep.bad_records, 0);
    assert_int_equal(reopen_count(&p), 42);
    rm_rf(dir);
}

/* Issue 14 item 10: a data file cut short loses the blocks past its end,
 * dropped at open (not read back later as blocks that failed their
 * checksum); one that is a FIFO or a directory is refused by name. */
static void test_data_file_damaged(void **state)
{
    const char *io = test_io(state);
    char dir[PATH_MAX], data[PATH_MAX + 32];
    tmp_dir(dir, sizeof dir);
    snprintf(data, sizeof data, "%s/%s", dir, KVT_SSD_DATA_NAME);
    kvt_ssd_params p = test_params(dir, io, BLOCK, 16);
    write_blocks(&p, 6, 400);
    assert_int_equal(truncate(data, 4 * BLOCK), 0);
    kvt_ssd *s = NULL;
    assert_ok(kvt__ssd_open(&s, &p));
    count_cb = 0;
    assert_int_equal(kvt__ssd_recover(s, count_recovered, NULL), 4);
    uint8_t *w = aligned_buf(BLOCK), *r = aligned_buf(BLOCK);
    for (uint32_t i = 0; i < 4; i++) {
        fill(w, BLOCK, 400 + i);
        assert_ok(read_sync(s, i, r, test_key(400 + i)));
        assert_memory_equal(r, w, BLOCK);
    }
    kvt_ssd_stats st;
    kvt__ssd_stats(s, &st);
    assert_int_equal(st.corrupt_reads, 0);
    kvt__ssd_close(s);
    free(w);
    free(r);
    assert_int_equal(unlink(data), 0);
    assert_int_equal(mkfifo(data, 0644), 0);
    assert_status(kvt__ssd_open(&s, &p), KVT_EINVAL);
    assert_non_null(strstr(kvt_last_error(), "kvtier.data is a FIFO, not a regular file"));
    assert_int_equal(unlink(data), 0);
    assert_int_equal(mkdir(data, 0755), 0);
    assert_status(kvt__ssd_open(&s, &p), KVT_EINVAL);
    assert_non_null(strstr(kvt_last_error(), "kvtier.data is a directory"));
    rm_rf(dir);
}

/* 20 live blocks rewritten over and over: the journal is compacted (more
 * than once) and a restart still finds every live block with its data. */
static void test_compaction(void **state)
{
    const char *io = test_io(state);
    char dir[PATH_MAX];
    tmp_dir(dir, sizeof dir);
    kvt_ssd_params p = test_params(dir, io, BLOCK, 32);
    kvt_ssd *s = NULL;
    assert_ok(kvt__ssd_open(&s, &p));
    uint8_t *w = aligned_buf(BLOCK), *r = aligned_buf(BLOCK);
    uint32_t slot[20];
    uint64_t ver[20];
    for (uint32_t i = 0; i < 20; i++) {
        slot[i] = kvt__ssd_alloc(s);
        ver[i] = i;
        fill(w, BLOCK, ver[i]);
        assert_ok(write_sync(s, slot[i], w, test_key(ver[i]), test_key(0), false));
    }
    for (uint32_t round = 0; round < 1500; round++) {
        uint32_t i = round % 20;
        kvt__ssd_free(s, slot[i]);
        slot[i] = kvt__ssd_alloc(s);
        ver[i] += 20;
        fill(w, BLOCK, ver[i]);
        assert_ok(write_sync(s, slot[i], w, test_key(ver[i]), test_key(0), false));
    }
    kvt_ssd_stats st;
    kvt__ssd_stats(s, &st);
    assert_true(st.journal_compactions >= 1);
    kvt__ssd_close(s);
    uint64_t len = 0;
    free(read_whole(dir, KVT_SSD_JOURNAL_NAME, &len));
    assert_true(len <= (2 * 20 + 1024 + 64) * KVT_SSD_REC_BYTES);
    assert_ok(kvt__ssd_open(&s, &p));
    assert_int_equal(kvt__ssd_recover(s, count_recovered, NULL), 20);
    for (uint32_t i = 0; i < 20; i++) {
        fill(w, BLOCK, ver[i]);
        assert_ok(read_sync(s, slot[i], r, test_key(ver[i])));
        assert_memory_equal(r, w, BLOCK);
    }
    kvt__ssd_close(s);
    free(w);
    free(r);
    rm_rf(dir);
}

static void test_fsck(void **state)
{
    const char *io = test_io(state);
    char a[PATH_MAX], b[PATH_MAX], dirs[2 * PATH_MAX + 2];
    tmp_dir(a, sizeof a);
    tmp_dir(b, sizeof b);
    snprintf(dirs, sizeof dirs, "%s,%s", a, b);
    kvt_ssd_params p = test_params(dirs, io, BLOCK, 16);
    write_blocks(&p, 6, 30); /* slots 0..5: a holds 0, 2, 4 and b holds 1, 3, 5 */
    kvt_ssd_fsck_report rep;
    assert_ok(kvt__ssd_fsck(dirs, false, &rep));
    assert_int_equal(rep.blocks, 6);
    assert_int_equal(rep.bad_blocks, 0);
    assert_int_equal(rep.bad_records, 0);
    assert_int_equal(rep.slots_total, 16);
    assert_int_equal(rep.digest, 0x1234);
    assert_int_equal(rep.block_bytes, BLOCK);
    assert_string_equal(rep.describe, "test geometry A");
    assert_false(rep.journal_truncated);

    /* b's local slot 1 (store slot 3) damaged, a's journal torn mid-record. */
    corrupt_byte(b, KVT_SSD_DATA_NAME, BLOCK + 100);
    uint64_t len = 0;
    uint8_t *j = read_whole(a, KVT_SSD_JOURNAL_NAME, &len);
    write_whole(a, KVT_SSD_JOURNAL_NAME, j, len - 10);
    free(j);
    assert_ok(kvt__ssd_fsck(dirs, false, &rep));
    assert_int_equal(rep.blocks, 5);
    assert_int_equal(rep.bad_blocks, 1);
    assert_true(rep.journal_truncated);
    assert_false(rep.repaired);
    assert_ok(kvt__ssd_fsck(dirs, false, &rep)); /* read-only: same answer */
    assert_int_equal(rep.bad_blocks, 1);

    /* Repair is refused while a store holds the directories. */
    kvt_ssd *s = NULL;
    assert_ok(kvt__ssd_open(&s, &p)); /* truncates a's torn tail itself */
    assert_status(kvt__ssd_fsck(dirs, true, &rep), KVT_EBUSY);
    assert_non_null(strstr(kvt_last_error(), "in use"));
    assert_ok(kvt__ssd_fsck(dirs, false, &rep)); /* checking is fine meanwhile */
    kvt__ssd_close(s);
    assert_ok(kvt__ssd_fsck(dirs, true, &rep));
    assert_true(rep.repaired);
    assert_ok(kvt__ssd_fsck(dirs, false, &rep));
    assert_int_equal(rep.blocks, 4);
    assert_int_equal(rep.bad_blocks, 0);
    assert_false(rep.journal_truncated);
    assert_int_equal(reopen_count(&p), 4);

    /* Not a cache directory, or listed in the wrong order. */
    char wrong[2 * PATH_MAX + 2];
    snprintf(wrong, sizeof wrong, "%s,%s", b, a);
    assert_status(kvt__ssd_fsck(wrong, false, &rep), KVT_EGEOMETRY);
    /* Issue 14 item 10: a data file shorter than its metadata's slots, a
     * directory, missing, or a FIFO in a file's place: each named for what
     * it is (they used to read "data failed its checksum", or hang). */
    char data_b[PATH_MAX + 32], meta_b[PATH_MAX + 32];
    snprintf(data_b, sizeof data_b, "%s/%s", b, KVT_SSD_DATA_NAME);
    snprintf(meta_b, sizeof meta_b, "%s/%s", b, KVT_SSD_META_NAME);
    assert_int_equal(truncate(data_b, BLOCK), 0); /* keeps b's local slot 0 (store slot 1) */
    assert_ok(kvt__ssd_fsck(dirs, false, &rep));
    assert_true(rep.data_truncated);
    assert_int_equal(rep.data_bytes, BLOCK);
    assert_int_equal(rep.missing_blocks, 1); /* store slot 5; 3 was dropped by the repair */
    assert_int_equal(rep.bad_blocks, 0);
    assert_int_equal(unlink(data_b), 0);
    assert_status(kvt__ssd_fsck(dirs, false, &rep), KVT_ENOTFOUND);
    assert_non_null(strstr(kvt_last_error(), "kvtier.data is missing"));
    assert_int_equal(mkdir(data_b, 0755), 0);
    assert_status(kvt__ssd_fsck(dirs, false, &rep), KVT_EINVAL);
    assert_non_null(strstr(kvt_last_error(), "is a directory, not a regular file"));
    assert_int_equal(rmdir(data_b), 0);
    assert_int_equal(mkfifo(data_b, 0644), 0);
    assert_status(kvt__ssd_fsck(dirs, false, &rep), KVT_EINVAL);
    assert_non_null(strstr(kvt_last_error(), "is a FIFO"));
    assert_int_equal(unlink(meta_b), 0);
    assert_int_equal(mkfifo(meta_b, 0644), 0);
    assert_status(kvt__ssd_fsck(dirs, false, &rep), KVT_EINVAL); /* never waits for a writer */
    assert_non_null(strstr(kvt_last_error(), "kvtier.meta is a FIFO"));
    rm_rf(a);
    assert_status(kvt__ssd_fsck(dirs, false, &rep), KVT_EIO);
    assert_non_null(strstr(kvt_last_error(), a));
    assert_status(kvt__ssd_fsck("", false, &rep), KVT_EINVAL);
    rm_rf(b);
}

/* The decoders on their own: round trips and rejections. */
static void test_format(void **state)
{
    (void)state;
    kvt_ssd_meta m = {.version = KVT_SSD_FORMAT_VERSION, .dir_index = 1, .ndirs = 2,
                      .total_slots = 7, .slots = 3, .digest = 42, .block_bytes = 5000,
                      .slot_bytes = 8192, .epoch = 99};
    snprintf(m.describe, sizeof m.describe, "hello");
    uint8_t buf[KVT_SSD_META_BYTES];
    kvt__ssd_meta_encode(&m, buf);
    kvt_ssd_meta out;
    assert_ok(kvt__ssd_meta_decode(buf, sizeof buf, &out));
    assert_int_equal(out.digest, 42);
    assert_string_equal(out.describe, "hello");
    assert_status(kvt__ssd_meta_decode(buf, sizeof buf - 1, &out), KVT_ECORRUPT);
    m.slots = 4; /* 7 over 2 directories gives directory 1 three */
    kvt__ssd_meta_encode(&m, buf);
    assert_status(kvt__ssd_meta_decode(buf, sizeof buf, &out), KVT_ECORRUPT);
    assert_non_null(strstr(kvt_last_error(), "slots"));

    kvt_ssd_rec r = {.type = KVT_SSD_REC_PUT, .has_parent = 1, .slot = 2, .seq = 0,
                     .key = test_key(5), .parent = test_key(4), .csum = 77};
    uint8_t rb[KVT_SSD_REC_BYTES];
    kvt__ssd_rec_encode(&r, 99, rb);
    kvt_ssd_rec back;
    assert_true(kvt__ssd_rec_decode(rb, 99, &back));
    assert_true(kvt__hash_eq(back.parent, r.parent));
    assert_false(kvt__ssd_rec_decode(rb, 98, &back)); /* another store's epoch */
    kvt_ssd_scan sc;
    kvt__ssd_journal_scan(rb, sizeof rb, 99, 2, NULL, NULL, &sc); /* slot 2 of 2: invalid */
    assert_int_equal(sc.good_records, 0);
    assert_int_equal(sc.bad_records, 1);
    assert_true(sc.torn);
}

/* Issue 24 item 4: a freed slot was handed out again before its DEL record
 * was durable. When that commit round failed (a full disk: ENOSPC), the
 * journal kept the old block's PUT while the slot already held new bytes:
 * fsck found bad blocks after every recovery. Now a slot is reused only once
 * the journal no longer names its old block; a DEL that cannot be written
 * keeps the slot (and its intact old block) out of use. */
static void test_failed_round_keeps_freed_slots(void **state)
{
    const char *io = test_io(state);
    char dir[PATH_MAX];
    tmp_dir(dir, sizeof dir);
    kvt_ssd_params p = test_params(dir, io, BLOCK, 8);
    kvt_ssd *s = NULL;
    assert_ok(kvt__ssd_open(&s, &p));
    uint8_t *w = aligned_buf(BLOCK), *r = aligned_buf(BLOCK);
    uint32_t slot[8];
    for (uint32_t i = 0; i < 8; i++) {
        slot[i] = kvt__ssd_alloc(s);
        fill(w, BLOCK, 500 + i);
        assert_ok(write_sync(s, slot[i], w, test_key(500 + i), test_key(0), false));
    }
    assert_int_equal(kvt__ssd_alloc(s), KVT_SSD_NONE);

    /* The healthy path: a freed slot comes back once its DEL is durable. */
    kvt__ssd_free(s, slot[0]);
    assert_int_equal(kvt__ssd_blocks_free(s), 1);
    assert_true(kvt__ssd_wait_reclaim(s, kvt__deadline_ns(WAIT_MS)));
    assert_int_equal(kvt__ssd_alloc(s), slot[0]);
    fill(w, BLOCK, 600);
    assert_ok(write_sync(s, slot[0], w, test_key(600), test_key(0), false));

    /* The full disk: every journal write fails from here on. */
    kvt__ssd_inject_journal(s, ENOSPC, 0, UINT32_MAX);
    for (uint32_t i = 1; i < 4; i++) kvt__ssd_free(s, slot[i]);
    assert_false(kvt__ssd_wait_reclaim(s, kvt__deadline_ns(WAIT_MS)));
    for (uint32_t k = 0; k < 3; k++) {
        uint32_t got = kvt__ssd_alloc(s);
        if (got == KVT_SSD_NONE) continue;
        fill(w, BLOCK, 700 + k); /* before the fix: overwrote a block the journal still named */
        assert_status(write_sync(s, got, w, test_key(700 + k), test_key(0), false), KVT_ENOSPC);
    }
    assert_int_equal(kvt__ssd_alloc(s), KVT_SSD_NONE);
    kvt__ssd_inject_journal(s, 0, 0, 0);
    kvt__ssd_close(s);

    kvt_ssd_fsck_report rep;
    assert_ok(kvt__ssd_fsck(dir, false, &rep));
    assert_int_equal(rep.bad_blocks, 0);
    assert_int_equal(rep.bad_records, 0);
    assert_int_equal(rep.blocks, 8); /* 1..3 are still journaled, with their own bytes */
    assert_ok(kvt__ssd_open(&s, &p));
    assert_int_equal(kvt__ssd_recover(s, count_recovered, NULL), 8);
    for (uint32_t i = 0; i < 8; i++) {
        uint64_t seed = i == 0 ? 600 : 500 + i;
        fill(w, BLOCK, seed);
        assert_ok(read_sync(s, slot[i], r, test_key(seed)));
        assert_memory_equal(r, w, BLOCK);
    }
    kvt__ssd_close(s);
    free(w);
    free(r);
    rm_rf(dir);
}

/* stderr of the calls between capture_begin and capture_end, for the one
 * line a resize logs. The returned buffer is malloc'd and NUL-terminated. */
typedef struct capture {
    int saved, fd;
    char path[PATH_MAX];
} capture;

static void capture_begin(capture *c)
{
    tmp_dir(c->path, sizeof c->path);
    strncat(c->path, "/stderr", sizeof c->path - strlen(c->path) - 1);
    fflush(stderr);
    c->saved = dup(2);
    c->fd = open(c->path, O_RDWR | O_CREAT | O_TRUNC, 0644);
    assert_true(c->saved >= 0 && c->fd >= 0);
    assert_true(dup2(c->fd, 2) == 2);
}

static char *capture_end(capture *c)
{
    fflush(stderr);
    assert_true(dup2(c->saved, 2) == 2);
    close(c->saved);
    struct stat st;
    assert_int_equal(fstat(c->fd, &st), 0);
    char *out = calloc(1, (size_t)st.st_size + 1);
    assert_int_equal(pread(c->fd, out, (size_t)st.st_size, 0), st.st_size);
    close(c->fd);
    unlink(c->path);
    *strrchr(c->path, '/') = '\0';
    rmdir(c->path);
    return out;
}

static uint32_t lines_of(const char *s)
{
    uint32_t n = 0;
    for (; *s; s++) n += *s == '\n';
    return n;
}

static uint64_t data_size(const char *dir)
{
    char path[PATH_MAX];
    join_path(path, sizeof path, dir, KVT_SSD_DATA_NAME);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    return (uint64_t)st.st_size;
}

#define RS_MAX 16u
/* The blocks a resize test expects: slot[i] holds seed[i] while live[i]. */
typedef struct rs_blocks {
    uint32_t n, slot[RS_MAX];
    uint64_t seed[RS_MAX];
    bool live[RS_MAX];
} rs_blocks;

static void rs_write(kvt_ssd *s, rs_blocks *b, uint32_t slot, uint64_t seed)
{
    uint8_t *w = aligned_buf(BLOCK);
    fill(w, BLOCK, seed);
    assert_ok(write_sync(s, slot, w, test_key(seed), test_key(0), false));
    assert_true(b->n < RS_MAX);
    b->slot[b->n] = slot, b->seed[b->n] = seed, b->live[b->n] = true;
    b->n++;
    free(w);
}

/* Every live block is recovered in its slot and its bytes read back. */
static void rs_verify(kvt_ssd *s, const rs_blocks *b)
{
    uint32_t want = 0;
    for (uint32_t i = 0; i < b->n; i++) want += b->live[i];
    count_cb = 0;
    assert_int_equal(kvt__ssd_recover(s, count_recovered, NULL), want);
    uint8_t *w = aligned_buf(BLOCK), *r = aligned_buf(BLOCK);
    for (uint32_t i = 0; i < b->n; i++) {
        if (!b->live[i]) continue;
        fill(w, BLOCK, b->seed[i]);
        memset(r, 0, BLOCK);
        assert_ok(read_sync(s, b->slot[i], r, test_key(b->seed[i])));
        assert_memory_equal(r, w, BLOCK);
    }
    free(w);
    free(r);
}

static void rs_fsck_clean(const char *dirs, uint32_t blocks, uint32_t slots)
{
    kvt_ssd_fsck_report rep;
    assert_ok(kvt__ssd_fsck(dirs, false, &rep));
    assert_int_equal(rep.blocks, blocks);
    assert_int_equal(rep.slots_total, slots);
    assert_int_equal(rep.bad_blocks, 0);
    assert_int_equal(rep.bad_records, 0);
    assert_int_equal(rep.skipped_records, 0);
    assert_int_equal(rep.missing_blocks, 0);
    assert_false(rep.journal_truncated);
    assert_false(rep.data_truncated);
}

/* Issue 24: a changed ssd_capacity was refused ("slot layout differs") and
 * only ssd_fresh=true, which wipes every block, let the store open. Now the
 * tier grows and shrinks in place: with the same directories, local slot l
 * of directory d keeps its meaning, so growing keeps every block and
 * shrinking drops only those in slots past the new end. */
static void resize_case(const char *io, const char *dirs, char (*dir)[PATH_MAX], uint32_t ndirs)
{
    kvt_ssd_params small = test_params(dirs, io, BLOCK, 16);
    kvt_ssd_params big = test_params(dirs, io, BLOCK, 40);
    kvt_ssd_params tiny = test_params(dirs, io, BLOCK, 10);
    rs_blocks b = {0};
    kvt_ssd *s = NULL;
    assert_ok(kvt__ssd_open(&s, &small));
    for (uint32_t i = 0; i < 12; i++) rs_write(s, &b, kvt__ssd_alloc(s), 100 + i);
    assert_int_equal(b.slot[11], 11);
    kvt__ssd_free(s, b.slot[8]); /* its DEL, like its PUT, names a slot kept by the shrink */
    b.live[8] = false;
    kvt__ssd_free(s, b.slot[10]); /* a PUT and a DEL past the shrunk end */
    b.live[10] = false;
    kvt__ssd_close(s);

    /* Grow 16 -> 40: every block back, the new slots usable. */
    capture c;
    capture_begin(&c);
    kvt_status st = kvt__ssd_open(&s, &big);
    char *log = capture_end(&c);
    if (st != KVT_OK) fail_msg("grow refused: %s", kvt_last_error());
    assert_int_equal(kvt__ssd_blocks_total(s), 40);
    assert_int_equal(lines_of(log), 1);
    assert_non_null(strstr(log, "kvtier: SSD tier: "));
    assert_non_null(strstr(log, "grew from 16 to 40 slots"));
    assert_non_null(strstr(log, "kept 10 blocks"));
    free(log);
    for (uint32_t i = 0; i < ndirs; i++) assert_int_equal(data_size(dir[i]), 40 / ndirs * 8192);
    rs_verify(s, &b);
    assert_int_equal(kvt__ssd_blocks_free(s), 30);
    uint32_t got[30];
    for (uint32_t i = 0; i < 30; i++) got[i] = kvt__ssd_alloc(s);
    assert_int_equal(kvt__ssd_alloc(s), KVT_SSD_NONE);
    assert_int_equal(got[29], 39);
    rs_write(s, &b, 39, 200); /* the last new slot */
    rs_write(s, &b, 17, 201); /* two more new slots, both past the shrink below */
    rs_write(s, &b, 16, 202);
    kvt__ssd_close(s);
    rs_fsck_clean(dirs, 13, 40);
    assert_ok(kvt__ssd_open(&s, &big));
    rs_verify(s, &b);
    kvt__ssd_close(s);

    /* Shrink 40 -> 10: slots 0..9 kept (0..7 and 9; 8 was freed), the
     * blocks in 11, 16, 17 and 39 dropped. */
    capture_begin(&c);
    st = kvt__ssd_open(&s, &tiny);
    log = capture_end(&c);
    if (st != KVT_OK) fail_msg("shrink refused: %s", kvt_last_error());
    assert_int_equal(kvt__ssd_blocks_total(s), 10);
    assert_int_equal(lines_of(log), 1);
    assert_non_null(strstr(log, "shrank from 40 to 10 slots"));
    assert_non_null(strstr(log, "dropped 4 blocks"));
    assert_non_null(strstr(log, "kept 9"));
    free(log);
    for (uint32_t i = 0; i < b.n; i++) b.live[i] = b.live[i] && b.slot[i] < 10;
    rs_verify(s, &b);
    assert_int_equal(kvt__ssd_blocks_free(s), 1);
    kvt__ssd_close(s);
    for (uint32_t i = 0; i < ndirs; i++) assert_int_equal(data_size(dir[i]), 10 / ndirs * 8192);
    rs_fsck_clean(dirs, 9, 10);

    /* The same size again: the same blocks, nothing said. */
    capture_begin(&c);
    st = kvt__ssd_open(&s, &tiny);
    log = capture_end(&c);
    assert_ok(st);
    assert_string_equal(log, "");
    free(log);
    rs_verify(s, &b);
    kvt__ssd_close(s);
    rs_fsck_clean(dirs, 9, 10);
}

static void test_resize_keeps_blocks(void **state)
{
    const char *io = test_io(state);
    char d[1][PATH_MAX];
    tmp_dir(d[0], sizeof d[0]);
    resize_case(io, d[0], d, 1);
    rm_rf(d[0]);
}

/* Two directories: slot g in directory g % 2 at local slot g / 2. */
static void test_resize_two_dirs(void **state)
{
    const char *io = test_io(state);
    char d[2][PATH_MAX], dirs[2 * PATH_MAX + 2];
    tmp_dir(d[0], sizeof d[0]);
    tmp_dir(d[1], sizeof d[1]);
    snprintf(dirs, sizeof dirs, "%s,%s", d[0], d[1]);
    resize_case(io, dirs, d, 2);
    rm_rf(d[0]);
    rm_rf(d[1]);
}

/* What still cannot change in place is refused, and every refusal names
 * the way out, ssd_fresh=true (damaged metadata used to say only "open it
 * fresh", which is no option anyone can set). */
static void test_resize_refusals_name_fresh(void **state)
{
    const char *io = test_io(state);
    char a[PATH_MAX], b[PATH_MAX], ab[2 * PATH_MAX + 2], ba[2 * PATH_MAX + 2];
    tmp_dir(a, sizeof a);
    tmp_dir(b, sizeof b);
    snprintf(ab, sizeof ab, "%s,%s", a, b);
    snprintf(ba, sizeof ba, "%s,%s", b, a);
    kvt_ssd_params one = test_params(a, io, BLOCK, 16);
    kvt_ssd_params two = test_params(ab, io, BLOCK, 16);
    write_blocks(&one, 3, 40);
    kvt_ssd *s = NULL;
    assert_status(kvt__ssd_open(&s, &two), KVT_EGEOMETRY); /* ndirs 1 -> 2 */
    assert_non_null(strstr(kvt_last_error(), "ssd_fresh=true"));
    assert_non_null(strstr(kvt_last_error(), a));
    two.capacity_bytes *= 2; /* with a capacity change too */
    assert_status(kvt__ssd_open(&s, &two), KVT_EGEOMETRY);
    assert_non_null(strstr(kvt_last_error(), "ssd_fresh=true"));
    kvt_ssd_params q = one;
    q.capacity_bytes *= 2;
    q.digest = 0x9999;
    assert_status(kvt__ssd_open(&s, &q), KVT_EGEOMETRY);
    assert_non_null(strstr(kvt_last_error(), "geometry digest"));
    assert_non_null(strstr(kvt_last_error(), "ssd_fresh=true"));
    q = one;
    q.capacity_bytes /= 2;
    q.block_bytes = BLOCK - 1;
    assert_status(kvt__ssd_open(&s, &q), KVT_EGEOMETRY);
    assert_non_null(strstr(kvt_last_error(), "block_bytes"));
    assert_non_null(strstr(kvt_last_error(), "ssd_fresh=true"));
    assert_int_equal(reopen_count(&one), 3); /* refusals change nothing */

    /* Two directories listed the other way round: dir_index differs. */
    rm_rf(a);
    tmp_dir(a, sizeof a);
    snprintf(ab, sizeof ab, "%s,%s", a, b);
    snprintf(ba, sizeof ba, "%s,%s", b, a);
    two = test_params(ab, io, BLOCK, 16);
    kvt_ssd_params swapped = test_params(ba, io, BLOCK, 32);
    write_blocks(&two, 4, 50);
    assert_status(kvt__ssd_open(&s, &swapped), KVT_EGEOMETRY);
    assert_non_null(strstr(kvt_last_error(), "ssd_fresh=true"));
    assert_int_equal(reopen_count(&two), 4);

    /* Damaged metadata. */
    corrupt_byte(a, KVT_SSD_META_NAME, 40);
    assert_status(kvt__ssd_open(&s, &two), KVT_ECORRUPT);
    assert_non_null(strstr(kvt_last_error(), KVT_SSD_META_NAME));
    assert_non_null(strstr(kvt_last_error(), "ssd_fresh=true"));
    rm_rf(a);
    rm_rf(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        SSD_TESTS(test_truncated_tail), SSD_TESTS(test_garbled), SSD_TESTS(test_damaged_middle),
        SSD_TESTS(test_data_file_damaged), SSD_TESTS(test_compaction),
        SSD_TESTS(test_fsck), cmocka_unit_test(test_format),
        SSD_TESTS(test_failed_round_keeps_freed_slots),
        SSD_TESTS(test_resize_keeps_blocks), SSD_TESTS(test_resize_two_dirs),
        SSD_TESTS(test_resize_refusals_name_fresh),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
