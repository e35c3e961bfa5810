/* ssd_journal.c - the SSD store's journal: replay at open, group-commit
 * append, compaction (see ssd_internal.h, ssd_format.h for the records).
 *
 * Appends go through a per-directory buffer of KVT_SSD_JBUF_RECS records,
 * written with pwrite at seq * 64 and made durable with one fdatasync per
 * commit round. A round that fails leaves jrecords where it was and cuts
 * the file back to it, so records of a failed round never outlive it in
 * sequence. Compaction rewrites the live PUTs when the file holds more than
 * twice the live records (plus COMPACT_SLACK, so small journals do not
 * churn). */
#include "store/ssd_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "util/err.h"
#include "util/file.h"

#define COMPACT_SLACK 1024u

kvt_status kvt__ssd_read_file(int dir_fd, const char *dir, const char *name, uint64_t max,
                              uint8_t **out, uint64_t *len)
{
    mode_t mode = 0;
    int fd = kvt__open_regular(dir_fd, name, O_RDONLY, &mode);
    if (fd == KVT_NOT_REGULAR)
        return kvt__fail(KVT_EINVAL, "%s/%s is %s, not a regular file", dir, name,
                         kvt__file_kind(mode));
    if (fd < 0 && errno == ENOENT) return KVT_ENOTFOUND;
    if (fd < 0) return kvt__fail(KVT_EIO, "%s/%s: open: %s", dir, name, strerror(errno));
    struct stat stbuf;
    if (fstat(fd, &stbuf) != 0) {
        int e = errno;
        close(fd);
        return kvt__fail(KVT_EIO, "%s/%s: fstat: %s", dir, name, strerror(e));
    }
    uint64_t n = (uint64_t)stbuf.st_size < max ? (uint64_t)stbuf.st_size : max;
    uint8_t *buf = malloc(n ? n : 1);
    if (!buf) {
        close(fd);
        return kvt__fail(KVT_ENOMEM, "%s/%s: %llu bytes: out of memory", dir, name,
                         (unsigned long long)n);
    }
    uint64_t got = 0;
    while (got < n) {
        ssize_t r = pread(fd, buf + got, n - got, (off_t)got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        got += (uint64_t)r;
    }
    close(fd);
    *out = buf;
    *len = got;
    return KVT_OK;
}

typedef struct replay_ctx {
    kvt_ssd *s;
    uint32_t d;
    uint32_t keep;   /* local slots kept: dir->meta.slots */
    uint8_t *beyond; /* per local slot keep..was_slots-1: live at the end of the replay */
} replay_ctx;

static void replay_one(void *arg, const kvt_ssd_rec *r)
{
    replay_ctx *c = arg;
    /* With the same ndirs, local slot l >= keep is exactly store slot
     * g >= total: past a shrunk end, tracked only to count what is dropped. */
    if (r->slot >= c->keep) {
        if (c->beyond) c->beyond[r->slot - c->keep] = r->type == KVT_SSD_REC_PUT;
        return;
    }
    uint64_t g = (uint64_t)r->slot * c->s->ndirs + c->d;
    if (g >= c->s->total) return; /* the scan bounds slot; this is belt and braces */
    kvt_ssd_slot *e = &c->s->durable[g];
    if (r->type == KVT_SSD_REC_DEL) {
        e->live = 0;
        return;
    }
    e->key = r->key;
    e->parent = r->parent;
    e->has_parent = (uint8_t)r->has_parent;
    e->csum = r->csum;
    e->live = 1;
}

/* Largest journal the store can produce between compactions, with room to
 * spare; anything beyond is garbage and is treated as a torn tail. */
static uint64_t journal_max_bytes(const kvt_ssd *s, uint32_t slots)
{
    return (4ull * slots + 2ull * s->nreq + 2ull * KVT_SSD_JBUF_RECS + 8192) * KVT_SSD_REC_BYTES;
}

kvt_status kvt__ssd_journal_load(kvt_ssd *s, uint32_t d, uint32_t was_slots, kvt_ssd_scan *scan,
                                 uint32_t *dropped)
{
    ssd_dir *dir = &s->dirs[d];
    uint32_t keep = dir->meta.slots;
    uint8_t *buf = NULL;
    uint64_t len = 0;
    kvt_status st = kvt__ssd_read_file(dir->dir_fd, dir->path, KVT_SSD_JOURNAL_NAME,
                                       journal_max_bytes(s, was_slots > keep ? was_slots : keep),
                                       &buf, &len);
    /* No journal yet is an empty one (len stays 0): ENOTFOUND is not passed on. */
    if (st != KVT_OK && st != KVT_ENOTFOUND) return st;
    replay_ctx c = {s, d, keep, NULL};
    if (was_slots > keep && !(c.beyond = calloc(was_slots - keep, 1))) {
        free(buf);
        return kvt__fail(KVT_ENOMEM, "%s/%s: replaying %u slots: out of memory", dir->path,
                         KVT_SSD_JOURNAL_NAME, was_slots);
    }
    /* Bounded by the slots the journal was written for: a record naming a
     * slot past a shrunk end is valid, not damage (it is dropped below). */
    kvt__ssd_journal_scan(buf, len, dir->meta.epoch, was_slots, replay_one, &c, scan);
    free(buf);
    *dropped = 0;
    for (uint32_t i = 0; c.beyond && i < was_slots - keep; i++) *dropped += c.beyond[i];
    free(c.beyond);
    dir->jrecords = scan->good_bytes / KVT_SSD_REC_BYTES;
    /* Damaged records kept in the middle are rewritten away by the first
     * compaction, so they are not counted again at the next start. */
    dir->compact_now = scan->skipped_records > 0;
    dir->jlive = 0;
    for (uint64_t g = d; g < s->total; g += s->ndirs) dir->jlive += s->durable[g].live;
    /* Cut the torn tail now: later appends reuse its sequence numbers, and a
     * stale record that happened to validate there must never follow them. */
    struct stat stbuf;
    if (fstat(dir->jfd, &stbuf) == 0 && (uint64_t)stbuf.st_size != scan->good_bytes) {
        if (ftruncate(dir->jfd, (off_t)scan->good_bytes) != 0 || fdatasync(dir->jfd) != 0)
            return kvt__fail(KVT_EIO, "%s/%s: truncating a torn tail: %s", dir->path,
                             KVT_SSD_JOURNAL_NAME, strerror(errno));
    }
    return KVT_OK;
}

static bool pwrite_all(int fd, const uint8_t *p, uint64_t n, uint64_t off)
{
    while (n > 0) {
        ssize_t w = pwrite(fd, p, n, (off_t)off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return false;
        p += w, n -= (uint64_t)w, off += (uint64_t)w;
    }
    return true;
}

/* An injected journal write failure (kvt__ssd_inject_journal): its errno, or 0. */
static int journal_fault(kvt_ssd *s)
{
    int err = atomic_load_explicit(&s->jinject_err, memory_order_relaxed);
    if (err == 0 || atomic_fetch_sub(&s->jinject_skip, 1) > 0) return 0;
    if (atomic_fetch_sub(&s->jinject_left, 1) <= 1) atomic_store(&s->jinject_err, 0);
    return err;
}

static void jbuf_flush(kvt_ssd *s, ssd_dir *dir)
{
    if (dir->jbuf_n == 0) return;
    if (dir->fail == KVT_OK) {
        int err = journal_fault(s);
        errno = 0;
        if (err || !pwrite_all(dir->jfd, dir->jbuf, (uint64_t)dir->jbuf_n * KVT_SSD_REC_BYTES,
                               dir->jbuf_seq0 * KVT_SSD_REC_BYTES))
            dir->fail = kvt__ssd_note_failure(s, err ? err : errno, dir->path,
                                              KVT_SSD_JOURNAL_NAME, err ? "write (injected)"
                                                                        : "write");
    }
    dir->jbuf_seq0 += dir->jbuf_n;
    dir->jbuf_n = 0;
}

void kvt__ssd_journal_add(kvt_ssd *s, ssd_dir *dir, const kvt_ssd_rec *r)
{
    if (dir->jbuf_n == KVT_SSD_JBUF_RECS) jbuf_flush(s, dir);
    kvt_ssd_rec rec = *r;
    rec.seq = dir->jbuf_seq0 + dir->jbuf_n;
    kvt__ssd_rec_encode(&rec, dir->meta.epoch, dir->jbuf + (size_t)dir->jbuf_n * KVT_SSD_REC_BYTES);
    dir->jbuf_n++;
}

void kvt__ssd_journal_commit(kvt_ssd *s, ssd_dir *dir)
{
    jbuf_flush(s, dir);
    if (dir->jbuf_seq0 == dir->jrecords) return;
    if (dir->fail == KVT_OK && fdatasync(dir->jfd) != 0)
        dir->fail = kvt__ssd_note_failure(s, errno, dir->path, KVT_SSD_JOURNAL_NAME, "fdatasync");
    if (dir->fail == KVT_OK) {
        atomic_fetch_add(&s->st_jrecs, dir->jbuf_seq0 - dir->jrecords);
        dir->jrecords = dir->jbuf_seq0;
        return;
    }
    /* Best effort: the next round rewrites from jrecords anyway. */
    if (ftruncate(dir->jfd, (off_t)(dir->jrecords * KVT_SSD_REC_BYTES)) != 0) { /* reported as EIO */ }
    dir->jbuf_seq0 = dir->jrecords;
}

kvt_status kvt__ssd_journal_rewrite(int dir_fd, const char *path, uint64_t epoch,
                                    const uint8_t *recs, uint64_t n, int *new_fd)
{
    (void)epoch;
    int fd = openat(dir_fd, KVT_SSD_JOURNAL_TMP, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return kvt__fail(KVT_EIO, "%s/%s: %s", path, KVT_SSD_JOURNAL_TMP, strerror(errno));
    bool ok = pwrite_all(fd, recs, n * KVT_SSD_REC_BYTES, 0) && fdatasync(fd) == 0 &&
              renameat(dir_fd, KVT_SSD_JOURNAL_TMP, dir_fd, KVT_SSD_JOURNAL_NAME) == 0 &&
              fsync(dir_fd) == 0;
    if (!ok) {
        int e = errno;
        close(fd);
        unlinkat(dir_fd, KVT_SSD_JOURNAL_TMP, 0);
        return kvt__fail(KVT_EIO, "%s: rewriting the journal: %s", path, strerror(e));
    }
    *new_fd = fd;
    return KVT_OK;
}

void kvt__ssd_journal_maybe_compact(kvt_ssd *s, uint32_t d)
{
    ssd_dir *dir = &s->dirs[d];
    if (!dir->compact_now && dir->jrecords <= 2 * dir->jlive + COMPACT_SLACK) return;
    uint8_t *recs = malloc((size_t)(dir->jlive ? dir->jlive : 1) * KVT_SSD_REC_BYTES);
    if (!recs) return; /* retried after the next round */
    uint64_t n = 0;
    for (uint64_t g = d; g < s->total && n < dir->jlive; g += s->ndirs) {
        const kvt_ssd_slot *e = &s->durable[g];
        if (!e->live) continue;
        kvt_ssd_rec r = {.type = KVT_SSD_REC_PUT, .has_parent = e->has_parent,
                         .slot = (uint32_t)(g / s->ndirs), .seq = n, .key = e->key,
                         .parent = e->parent, .csum = e->csum};
        kvt__ssd_rec_encode(&r, dir->meta.epoch, recs + n * KVT_SSD_REC_BYTES);
        n++;
    }
    int fd = -1;
    if (kvt__ssd_journal_rewrite(dir->dir_fd, dir->path, dir->meta.epoch, recs, n, &fd) == KVT_OK) {
        close(dir->jfd);
        dir->jfd = fd;
        dir->jrecords = n;
        dir->compact_now = false;
        atomic_fetch_add(&s->st_compactions, 1);
    }
    free(recs);
}
