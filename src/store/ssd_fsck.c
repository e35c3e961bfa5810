/* ssd_fsck.c - kvt__ssd_fsck: checks a cache directory set without changing
 * it: each directory's metadata, its journal (valid prefix, bad and torn
 * records) and the checksum of every block the journal holds, read with
 * O_DIRECT so the device is checked, not the page cache. Takes no lock and
 * opens everything read-only, so it is safe beside a running store (a block
 * being rewritten at that moment may show as bad). repair takes the
 * directory lock (KVT_EBUSY while a store holds it) and rewrites the
 * journal with the good records whose blocks verify. */
#include "store/ssd_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include "util/err.h"
#include "util/file.h"

typedef struct fsck_dir {
    const char *path;
    int dir_fd, data_fd;
    uint64_t data_bytes; /* the data file's size */
    kvt_ssd_meta meta;
    kvt_ssd_slot *tab; /* replayed journal, by local slot */
    uint8_t *good;     /* per local slot: live and verified */
} fsck_dir;

/* Every block the journals hold, over all directories, for the orphan
 * count: a verified block whose parent (or an ancestor) is lost can never be
 * matched again, since a lookup walks the chain from its first block. */
typedef struct fsck_blk {
    kvt_hash128 key, parent;
    uint8_t has_parent, good;
} fsck_blk;

typedef struct fsck_blks {
    fsck_blk *v;
    uint32_t n, cap;
} fsck_blks;

static bool blks_push(fsck_blks *b, const kvt_ssd_slot *e, bool good)
{
    if (b->n == b->cap) {
        uint32_t cap = b->cap ? 2 * b->cap : 1024;
        fsck_blk *v = realloc(b->v, (size_t)cap * sizeof *v);
        if (!v) return false;
        b->v = v, b->cap = cap;
    }
    b->v[b->n++] = (fsck_blk){e->key, e->parent, e->has_parent, good};
    return true;
}

enum { O_UNKNOWN, O_VISITING, O_REACHABLE, O_ORPHAN };

static uint32_t blk_find(const fsck_blks *b, const uint32_t *map, uint32_t mask, kvt_hash128 key)
{
    for (uint32_t h = (uint32_t)key.lo & mask; map[h] != UINT32_MAX; h = (h + 1) & mask)
        if (kvt__hash_eq(b->v[map[h]].key, key)) return map[h];
    return UINT32_MAX;
}

/* Verified blocks whose chain to a root passes a block that is not there or
 * not verified (a cycle, only in a forged journal, counts as broken). */
static kvt_status count_orphans(const fsck_blks *b, uint32_t *out)
{
    *out = 0;
    if (b->n == 0) return KVT_OK;
    uint32_t cap = 2;
    while (cap < 2ull * b->n) cap *= 2;
    uint32_t *map = malloc((size_t)cap * sizeof *map);
    uint32_t *path = malloc((size_t)b->n * sizeof *path);
    uint8_t *state = calloc(b->n, 1);
    if (!map || !path || !state) {
        free(map), free(path), free(state);
        return kvt__fail(KVT_ENOMEM, "fsck: out of memory");
    }
    memset(map, 0xff, (size_t)cap * sizeof *map);
    for (uint32_t i = 0; i < b->n; i++) {
        uint32_t h = (uint32_t)b->v[i].key.lo & (cap - 1);
        while (map[h] != UINT32_MAX) h = (h + 1) & (cap - 1);
        map[h] = i;
    }
    for (uint32_t i = 0; i < b->n; i++) {
        uint32_t len = 0, cur = i;
        uint8_t verdict = O_REACHABLE;
        while (state[cur] == O_UNKNOWN) {
            const fsck_blk *x = &b->v[cur];
            if (!x->good) {
                verdict = O_ORPHAN;
                break;
            }
            state[cur] = O_VISITING;
            path[len++] = cur;
            if (!x->has_parent) break;
            uint32_t p = blk_find(b, map, cap - 1, x->parent);
            if (p == UINT32_MAX) {
                verdict = O_ORPHAN;
                break;
            }
            cur = p;
        }
        if (state[cur] == O_VISITING && len && b->v[path[len - 1]].has_parent) verdict = O_ORPHAN;
        else if (state[cur] == O_ORPHAN || state[cur] == O_REACHABLE) verdict = state[cur];
        while (len > 0) state[path[--len]] = verdict;
    }
    for (uint32_t i = 0; i < b->n; i++) *out += b->v[i].good && state[i] == O_ORPHAN;
    free(map), free(path), free(state);
    return KVT_OK;
}

static void fsck_replay(void *arg, const kvt_ssd_rec *r)
{
    kvt_ssd_slot *e = &((kvt_ssd_slot *)arg)[r->slot];
    if (r->type == KVT_SSD_REC_DEL) {
        e->live = 0;
        return;
    }
    *e = (kvt_ssd_slot){r->key, r->parent, r->csum, (uint8_t)r->has_parent, 1};
}

static kvt_status fsck_meta(fsck_dir *f, uint32_t index, uint32_t ndirs, kvt_ssd_fsck_report *rep)
{
    uint8_t *buf = NULL;
    uint64_t len = 0;
    kvt_status st = kvt__ssd_read_file(f->dir_fd, f->path, KVT_SSD_META_NAME, 4096, &buf, &len);
    if (st == KVT_ENOTFOUND)
        return kvt__fail(KVT_ENOTFOUND, "fsck: %s has no %s: not a kvtier cache directory", f->path,
                         KVT_SSD_META_NAME);
    if (st != KVT_OK) return st;
    st = kvt__ssd_meta_decode(buf, len, &f->meta);
    free(buf);
    if (st != KVT_OK) {
        char why[KVT_ERRMSG_MAX];
        snprintf(why, sizeof why, "%s", kvt_last_error());
        return kvt__fail(KVT_ECORRUPT, "fsck: %s/%s: %s", f->path, KVT_SSD_META_NAME, why);
    }
    /* The data file: opened without blocking (a FIFO planted there never
     * gets a writer) and refused unless it is a regular file. One shorter
     * than the metadata's slots is not refused: the blocks past its end are
     * reported missing and the rest checked. */
    mode_t mode = 0;
    f->data_fd = kvt__open_regular(f->dir_fd, KVT_SSD_DATA_NAME, O_RDONLY | O_DIRECT, &mode);
    if (f->data_fd == -1 && errno == EINVAL)
        f->data_fd = kvt__open_regular(f->dir_fd, KVT_SSD_DATA_NAME, O_RDONLY, &mode);
    if (f->data_fd == KVT_NOT_REGULAR)
        return kvt__fail(KVT_EINVAL, "fsck: %s/%s is %s, not a regular file", f->path,
                         KVT_SSD_DATA_NAME, kvt__file_kind(mode));
    if (f->data_fd < 0 && errno == ENOENT)
        return kvt__fail(KVT_ENOTFOUND, "fsck: %s/%s is missing (the metadata names %u slots of "
                         "%llu bytes); every block of this directory is lost", f->path,
                         KVT_SSD_DATA_NAME, f->meta.slots, (unsigned long long)f->meta.slot_bytes);
    if (f->data_fd < 0)
        return kvt__fail(KVT_EIO, "fsck: %s/%s: %s", f->path, KVT_SSD_DATA_NAME, strerror(errno));
    struct stat ds;
    if (fstat(f->data_fd, &ds) != 0)
        return kvt__fail(KVT_EIO, "fsck: %s/%s: fstat: %s", f->path, KVT_SSD_DATA_NAME,
                         strerror(errno));
    f->data_bytes = (uint64_t)ds.st_size;
    uint64_t need = (uint64_t)f->meta.slots * f->meta.slot_bytes;
    if (f->data_bytes < need) {
        rep->data_truncated = true;
        rep->data_bytes = f->data_bytes;
        rep->data_bytes_needed = need;
    }
    if (f->meta.ndirs != ndirs || f->meta.dir_index != index)
        return kvt__fail(KVT_EGEOMETRY, "fsck: %s is directory %u of %u in its metadata, but "
                         "listed as %u of %u", f->path, f->meta.dir_index, f->meta.ndirs, index,
                         ndirs);
    if (index == 0) {
        rep->digest = f->meta.digest;
        rep->block_bytes = f->meta.block_bytes;
        snprintf(rep->describe, sizeof rep->describe, "%s", f->meta.describe);
    } else if (f->meta.digest != rep->digest || f->meta.block_bytes != rep->block_bytes) {
        return kvt__fail(KVT_EGEOMETRY, "fsck: %s has digest 0x%016llx / block_bytes %llu, the "
                         "first directory 0x%016llx / %llu", f->path,
                         (unsigned long long)f->meta.digest, (unsigned long long)f->meta.block_bytes,
                         (unsigned long long)rep->digest, (unsigned long long)rep->block_bytes);
    }
    rep->slots_total += f->meta.slots;
    return KVT_OK;
}

static kvt_status fsck_journal(fsck_dir *f, kvt_ssd_fsck_report *rep)
{
    uint64_t max = (8ull * f->meta.slots + 65536) * KVT_SSD_REC_BYTES;
    uint8_t *buf = NULL;
    uint64_t len = 0;
    kvt_status st = kvt__ssd_read_file(f->dir_fd, f->path, KVT_SSD_JOURNAL_NAME, max, &buf, &len);
    if (st == KVT_ENOTFOUND) len = 0, st = KVT_OK;
    if (st != KVT_OK) return st;
    kvt_ssd_scan sc;
    kvt__ssd_journal_scan(buf, len, f->meta.epoch, f->meta.slots, fsck_replay, f->tab, &sc);
    free(buf);
    rep->records += sc.good_records;
    rep->bad_records += sc.bad_records;
    rep->skipped_records += sc.skipped_records;
    rep->journal_truncated |= sc.torn;
    return KVT_OK;
}

static kvt_status fsck_blocks(fsck_dir *f, kvt_ssd_fsck_report *rep)
{
    void *buf = NULL;
    if (posix_memalign(&buf, KVT_SSD_SLOT_ALIGN, f->meta.slot_bytes) != 0)
        return kvt__fail(KVT_ENOMEM, "fsck: out of memory");
    for (uint32_t i = 0; i < f->meta.slots; i++) {
        const kvt_ssd_slot *e = &f->tab[i];
        if (!e->live) continue;
        rep->blocks++;
        uint64_t off = (uint64_t)i * f->meta.slot_bytes;
        if (off + f->meta.slot_bytes > f->data_bytes) {
            rep->missing_blocks++; /* past the end of a truncated data file */
            continue;
        }
        ssize_t n = pread(f->data_fd, buf, f->meta.slot_bytes, (off_t)off);
        bool ok = n == (ssize_t)f->meta.slot_bytes &&
                  kvt__ssd_block_csum(buf, f->meta.block_bytes, e->key) == e->csum;
        f->good[i] = ok;
        rep->bad_blocks += !ok;
    }
    free(buf);
    return KVT_OK;
}

static kvt_status fsck_repair(fsck_dir *f, kvt_ssd_fsck_report *rep)
{
    uint8_t *recs = malloc(((size_t)f->meta.slots + 1) * KVT_SSD_REC_BYTES);
    if (!recs) return kvt__fail(KVT_ENOMEM, "fsck: out of memory");
    uint64_t n = 0;
    for (uint32_t i = 0; i < f->meta.slots; i++) {
        const kvt_ssd_slot *e = &f->tab[i];
        if (!e->live || !f->good[i]) continue;
        kvt_ssd_rec r = {.type = KVT_SSD_REC_PUT, .has_parent = e->has_parent, .slot = i,
                         .seq = n, .key = e->key, .parent = e->parent, .csum = e->csum};
        kvt__ssd_rec_encode(&r, f->meta.epoch, recs + n * KVT_SSD_REC_BYTES);
        n++;
    }
    int fd = -1;
    kvt_status st = kvt__ssd_journal_rewrite(f->dir_fd, f->path, f->meta.epoch, recs, n, &fd);
    free(recs);
    if (st != KVT_OK) return st;
    close(fd);
    rep->repaired = true;
    return KVT_OK;
}

static kvt_status fsck_one(const char *path, uint32_t index, uint32_t ndirs, bool repair,
                           kvt_ssd_fsck_report *rep, fsck_blks *blks)
{
    fsck_dir f = {.path = path, .dir_fd = -1, .data_fd = -1};
    f.dir_fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (f.dir_fd < 0) return kvt__fail(KVT_EIO, "fsck: %s: %s", path, strerror(errno));
    kvt_status st = KVT_OK;
    if (repair && flock(f.dir_fd, LOCK_EX | LOCK_NB) != 0)
        st = kvt__fail(KVT_EBUSY, "fsck: %s is in use by a running store; --repair needs it idle",
                       path);
    if (st == KVT_OK) st = fsck_meta(&f, index, ndirs, rep);
    if (st == KVT_OK) {
        f.tab = calloc(f.meta.slots, sizeof *f.tab);
        f.good = calloc(f.meta.slots, 1);
        if (!f.tab || !f.good) st = kvt__fail(KVT_ENOMEM, "fsck: out of memory");
    }
    uint32_t bad_before = rep->bad_blocks, missing_before = rep->missing_blocks;
    uint32_t skipped_before = rep->skipped_records;
    bool torn_before = rep->journal_truncated;
    rep->journal_truncated = false;
    if (st == KVT_OK) st = fsck_journal(&f, rep);
    if (st == KVT_OK) st = fsck_blocks(&f, rep);
    bool damaged = rep->journal_truncated || rep->bad_blocks > bad_before ||
                   rep->missing_blocks > missing_before || rep->skipped_records > skipped_before;
    rep->journal_truncated |= torn_before;
    for (uint32_t i = 0; st == KVT_OK && i < f.meta.slots; i++)
        if (f.tab[i].live && !blks_push(blks, &f.tab[i], f.good[i]))
            st = kvt__fail(KVT_ENOMEM, "fsck: out of memory");
    if (st == KVT_OK && repair && damaged) st = fsck_repair(&f, rep);
    free(f.tab);
    free(f.good);
    if (f.data_fd >= 0) close(f.data_fd);
    close(f.dir_fd); /* drops the lock */
    return st;
}

kvt_status kvt__ssd_fsck(const char *dirs, bool repair, kvt_ssd_fsck_report *out)
{
    KVT_CHECK_ARG(dirs && *dirs, "kvt__ssd_fsck: dirs is empty");
    KVT_CHECK_NOT_NULL(out, "kvt__ssd_fsck");
    uint32_t ndirs = 1;
    for (const char *c = dirs; *c; c++) ndirs += *c == ',';
    KVT_CHECK_ARG(ndirs <= KVT_SSD_MAX_DIRS, "kvt__ssd_fsck: %u directories, at most %u", ndirs,
                  KVT_SSD_MAX_DIRS);
    kvt_ssd_fsck_report rep;
    memset(&rep, 0, sizeof rep);
    const char *start = dirs;
    fsck_blks blks = {NULL, 0, 0};
    kvt_status st = KVT_OK;
    for (uint32_t i = 0; i < ndirs && st == KVT_OK; i++) {
        const char *end = strchr(start, ',');
        size_t len = end ? (size_t)(end - start) : strlen(start);
        char path[PATH_MAX];
        if (len == 0 || len >= sizeof path) {
            st = kvt__fail(KVT_EINVAL, "kvt__ssd_fsck: directory %u of \"%s\" is %s", i, dirs,
                           len ? "too long" : "empty");
            break;
        }
        memcpy(path, start, len);
        path[len] = '\0';
        st = fsck_one(path, i, ndirs, repair, &rep, &blks);
        start = end ? end + 1 : start + len;
    }
    if (st == KVT_OK) st = count_orphans(&blks, &rep.orphan_blocks);
    free(blks.v);
    if (st == KVT_OK) *out = rep;
    return st;
}
