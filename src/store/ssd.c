/* ssd.c - the SSD store: parameters, directories (lock, metadata, data
 * file, journal replay), slot allocation and recovery order (see ssd.h).
 * The data path is in ssd_io.c, the journal in ssd_journal.c.
 *
 * Each directory holds kvtier.meta (written last, via tmp + rename, so a
 * directory without it is simply new), kvtier.data (fallocated slots of
 * round_up(block_bytes, 4096), opened O_DIRECT) and kvtier.journal. Store
 * slot g lives in directory g % ndirs at local slot g / ndirs.
 *
 * Backend choice: params->io names it; "auto" (or NULL) defers to the
 * KVTIER_IO environment variable when set, else probes io_uring and falls
 * back to the thread pool. */
#include "store/ssd_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>
#include "util/clock.h"
#include "util/err.h"
#include "util/file.h"
#include "util/sync.h"

#define QD_MAX 4096u
#define NREQ_MIN 1024u

static uint64_t round_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

/* ---- parameters ------------------------------------------------------ */

static kvt_status check_params(const kvt_ssd_params *p, uint64_t *total)
{
    const char *fn = "kvt__ssd_open";
    KVT_CHECK_NOT_NULL(p, fn);
    KVT_CHECK_ARG(p->dirs && *p->dirs, "%s: dirs is empty", fn);
    KVT_CHECK_ARG(p->block_bytes > 0 && p->block_bytes <= KVT_SSD_MAX_BLOCK,
                  "%s: block_bytes %llu is not in 1..%llu", fn,
                  (unsigned long long)p->block_bytes, KVT_SSD_MAX_BLOCK);
    KVT_CHECK_ARG(p->queue_depth >= 1 && p->queue_depth <= QD_MAX,
                  "%s: queue_depth %u is not in 1..%u", fn, p->queue_depth, QD_MAX);
    KVT_CHECK_ARG(!p->describe || strlen(p->describe) < KVT_SSD_DESCRIBE_MAX,
                  "%s: describe is %zu bytes, at most %u", fn, strlen(p->describe),
                  KVT_SSD_DESCRIBE_MAX - 1);
    KVT_CHECK_ARG((p->register_base == NULL) == (p->register_len == 0),
                  "%s: register_base %p and register_len %llu must be set together", fn,
                  p->register_base, (unsigned long long)p->register_len);
    uint64_t slot_bytes = round_up(p->block_bytes, KVT_SSD_SLOT_ALIGN);
    uint64_t n = p->capacity_bytes / slot_bytes;
    KVT_CHECK_ARG(n > 0, "%s: capacity_bytes %llu holds no block of %llu bytes (slot %llu)", fn,
                  (unsigned long long)p->capacity_bytes, (unsigned long long)p->block_bytes,
                  (unsigned long long)slot_bytes);
    *total = n < KVT_SSD_MAX_SLOTS ? n : KVT_SSD_MAX_SLOTS;
    return KVT_OK;
}

static kvt_status split_dirs(kvt_ssd *s, const char *list)
{
    const char *fn = "kvt__ssd_open";
    uint32_t n = 1;
    for (const char *c = list; *c; c++) n += *c == ',';
    KVT_CHECK_ARG(n <= KVT_SSD_MAX_DIRS, "%s: %u directories, at most %u", fn, n, KVT_SSD_MAX_DIRS);
    s->dirs = calloc(n, sizeof *s->dirs);
    if (!s->dirs) return kvt__fail(KVT_ENOMEM, "%s: out of memory", fn);
    for (uint32_t i = 0; i < n; i++) s->dirs[i].dir_fd = s->dirs[i].data_fd = s->dirs[i].jfd = -1;
    s->ndirs = n;
    const char *start = list;
    for (uint32_t i = 0; i < n; i++) {
        const char *end = strchr(start, ',');
        size_t len = end ? (size_t)(end - start) : strlen(start);
        KVT_CHECK_ARG(len > 0 && len < PATH_MAX, "%s: directory %u of \"%s\" is %s", fn, i, list,
                      len ? "too long" : "empty");
        s->dirs[i].path = strndup(start, len);
        if (!s->dirs[i].path) return kvt__fail(KVT_ENOMEM, "%s: out of memory", fn);
        for (uint32_t j = 0; j < i; j++)
            KVT_CHECK_ARG(strcmp(s->dirs[j].path, s->dirs[i].path) != 0,
                          "%s: directory \"%s\" is listed twice", fn, s->dirs[i].path);
        start = end ? end + 1 : start + len;
    }
    return KVT_OK;
}

static kvt_status alloc_tables(kvt_ssd *s, uint32_t qd)
{
    uint32_t t = s->total;
    s->nreq = 4 * qd > NREQ_MIN ? 4 * qd : NREQ_MIN;
    s->slots = calloc(t, sizeof *s->slots);
    s->durable = calloc(t, sizeof *s->durable);
    s->free_stack = calloc(t, sizeof *s->free_stack);
    s->allocated = calloc(t, 1);
    s->gen = calloc(t, sizeof *s->gen);
    s->dels = calloc(t, sizeof *s->dels);
    s->dels_commit = calloc(t, sizeof *s->dels_commit);
    s->released = calloc(t, sizeof *s->released);
    s->reclaim = calloc(t, sizeof *s->reclaim);
    s->inflight = calloc(t, sizeof *s->inflight);
    s->reqs = calloc(s->nreq, sizeof *s->reqs);
    if (s->budget) {
        s->backed = calloc(t, 1);
        s->holes = calloc(t, sizeof *s->holes);
    }
    bool ok = s->slots && s->durable && s->free_stack && s->allocated && s->gen && s->dels &&
              s->dels_commit && s->released && s->reclaim && s->inflight && s->reqs &&
              (!s->budget || (s->backed && s->holes));
    for (uint32_t d = 0; ok && d < s->ndirs; d++) {
        s->dirs[d].jbuf = malloc((size_t)KVT_SSD_JBUF_RECS * KVT_SSD_REC_BYTES);
        ok = s->dirs[d].jbuf != NULL;
    }
    if (!ok) return kvt__fail(KVT_ENOMEM, "kvt__ssd_open: tables for %u slots: out of memory", t);
    return KVT_OK;
}

/* ---- directories ----------------------------------------------------- */

static kvt_status sys_fail(const char *path, const char *what, int e)
{
    return kvt__fail(KVT_EIO, "kvt__ssd_open: cache directory %s: %s: %s", path, what, strerror(e));
}

static kvt_status lock_dir(ssd_dir *dir)
{
    if (mkdir(dir->path, 0755) != 0 && errno != EEXIST) return sys_fail(dir->path, "mkdir", errno);
    dir->dir_fd = open(dir->path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dir->dir_fd < 0) return sys_fail(dir->path, "open", errno);
    if (flock(dir->dir_fd, LOCK_EX | LOCK_NB) != 0) {
        if (errno == EWOULDBLOCK)
            return kvt__fail(KVT_EBUSY, "kvt__ssd_open: cache directory %s is in use by another "
                             "kvtier store (it holds the directory's lock)", dir->path);
        return sys_fail(dir->path, "flock", errno);
    }
    return KVT_OK;
}

static kvt_status write_meta(ssd_dir *dir)
{
    uint8_t buf[KVT_SSD_META_BYTES];
    kvt__ssd_meta_encode(&dir->meta, buf);
    int fd = openat(dir->dir_fd, KVT_SSD_META_TMP, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return sys_fail(dir->path, KVT_SSD_META_TMP, errno);
    bool ok = pwrite(fd, buf, sizeof buf, 0) == (ssize_t)sizeof buf && fsync(fd) == 0;
    int e = errno;
    close(fd);
    if (!ok) return sys_fail(dir->path, "writing " KVT_SSD_META_TMP, e);
    if (renameat(dir->dir_fd, KVT_SSD_META_TMP, dir->dir_fd, KVT_SSD_META_NAME) != 0 ||
        fsync(dir->dir_fd) != 0)
        return sys_fail(dir->path, "renaming " KVT_SSD_META_TMP, errno);
    return KVT_OK;
}

static kvt_status open_data(ssd_dir *dir, int extra_flags)
{
    struct stat st;
    if (fstatat(dir->dir_fd, KVT_SSD_DATA_NAME, &st, 0) == 0 && !S_ISREG(st.st_mode))
        return kvt__fail(KVT_EINVAL, "kvt__ssd_open: cache directory %s: %s is %s, not a regular "
                         "file", dir->path, KVT_SSD_DATA_NAME, kvt__file_kind(st.st_mode));
    dir->data_fd = openat(dir->dir_fd, KVT_SSD_DATA_NAME,
                          O_RDWR | O_DIRECT | O_CLOEXEC | extra_flags, 0644);
    if (dir->data_fd >= 0) return KVT_OK;
    if (errno == EINVAL)
        return kvt__fail(KVT_EIO, "kvt__ssd_open: cache directory %s: its filesystem does not "
                         "support O_DIRECT", dir->path);
    return sys_fail(dir->path, KVT_SSD_DATA_NAME, errno);
}

/* Pre-allocates the data file, so a full disk shows at open, not mid-run.
 * The filesystem's free space is checked first (statvfs): a capacity it
 * cannot hold is refused naming both numbers before a byte is written,
 * and a failed growth is undone (the file keeps its old size). A sparse
 * (budgeted) store's file only takes its size here: its slots take disk
 * as they are used, and check_budget_space checks the room. */
static kvt_status size_data(ssd_dir *dir)
{
    struct stat st;
    off_t want = (off_t)((uint64_t)dir->meta.slots * dir->meta.slot_bytes);
    if (fstat(dir->data_fd, &st) != 0) return sys_fail(dir->path, "fstat", errno);
    if (dir->sparse) {
        if (st.st_size == want || ftruncate(dir->data_fd, want) == 0) return KVT_OK;
        return sys_fail(dir->path, "ftruncate", errno);
    }
    if (st.st_size >= want) return KVT_OK;
    uint64_t need = (uint64_t)(want - st.st_size);
    struct statvfs vfs;
    if (fstatvfs(dir->data_fd, &vfs) == 0 && need > (uint64_t)vfs.f_bavail * vfs.f_frsize)
        return kvt__fail(KVT_ENOSPC, "kvt__ssd_open: cache directory %s: no space for its "
                         "share of ssd_capacity: it needs %llu more bytes (%lld in all), its "
                         "filesystem has %llu bytes free: lower ssd_capacity or free space",
                         dir->path, (unsigned long long)need, (long long)want,
                         (unsigned long long)vfs.f_bavail * vfs.f_frsize);
    int rc = fallocate(dir->data_fd, 0, 0, want);
    if (rc != 0 && errno == EOPNOTSUPP) rc = ftruncate(dir->data_fd, want);
    if (rc == 0) return KVT_OK;
    int e = errno;
    if (ftruncate(dir->data_fd, st.st_size) != 0) { /* best effort: the check above passed */ }
    if (e == ENOSPC)
        return kvt__fail(KVT_ENOSPC, "kvt__ssd_open: cache directory %s: no space for %lld "
                         "bytes of slots", dir->path, (long long)want);
    return sys_fail(dir->path, "fallocate", e);
}

static kvt_status create_dir(ssd_dir *dir)
{
    /* Metadata goes first and comes back last: a crash mid-way leaves a
     * directory without it, which the next open starts afresh. */
    if (unlinkat(dir->dir_fd, KVT_SSD_META_NAME, 0) != 0 && errno != ENOENT)
        return sys_fail(dir->path, "removing " KVT_SSD_META_NAME, errno);
    if (getrandom(&dir->meta.epoch, sizeof dir->meta.epoch, 0) != sizeof dir->meta.epoch)
        dir->meta.epoch = kvt__now_ns() ^ ((uint64_t)getpid() << 32);
    kvt_status st = open_data(dir, O_CREAT | O_TRUNC);
    if (st == KVT_OK && (st = size_data(dir)) != KVT_OK)
        unlinkat(dir->dir_fd, KVT_SSD_DATA_NAME, 0); /* no data file is left half made */
    if (st != KVT_OK) return st;
    dir->jfd = openat(dir->dir_fd, KVT_SSD_JOURNAL_NAME, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (dir->jfd < 0) return sys_fail(dir->path, KVT_SSD_JOURNAL_NAME, errno);
    if (fsync(dir->data_fd) != 0 || fsync(dir->jfd) != 0) return sys_fail(dir->path, "fsync", errno);
    return write_meta(dir);
}

static kvt_status mismatch(const ssd_dir *dir, const kvt_ssd_meta *have, const char *field,
                           const char *was, const char *want)
{
    return kvt__fail(KVT_EGEOMETRY, "kvt__ssd_open: cache directory %s: %s differs: it was written "
                     "with %s (\"%s\"), this store has %s (\"%s\"); set ssd_fresh=true to wipe it "
                     "(its blocks are lost)",
                     dir->path, field, was, have->describe, want, dir->meta.describe);
}

/* KVT_OK when have (on disk) matches dir->meta (wanted), else EGEOMETRY.
 * The slot count alone may differ (a changed ssd_capacity, see resize_dir):
 * with the same ndirs and dir_index, local slot l of this directory is store
 * slot l * ndirs + dir_index under either total. */
static kvt_status compare_meta(const ssd_dir *dir, const kvt_ssd_meta *have)
{
    char a[96], b[96];
    const kvt_ssd_meta *w = &dir->meta;
    if (have->digest != w->digest) {
        snprintf(a, sizeof a, "0x%016llx", (unsigned long long)have->digest);
        snprintf(b, sizeof b, "0x%016llx", (unsigned long long)w->digest);
        return mismatch(dir, have, "geometry digest", a, b);
    }
    if (have->block_bytes != w->block_bytes) {
        snprintf(a, sizeof a, "%llu", (unsigned long long)have->block_bytes);
        snprintf(b, sizeof b, "%llu", (unsigned long long)w->block_bytes);
        return mismatch(dir, have, "block_bytes", a, b);
    }
    if (have->ndirs != w->ndirs || have->dir_index != w->dir_index) {
        snprintf(a, sizeof a, "directory %u of %u, %u of %llu slots", have->dir_index,
                 have->ndirs, have->slots, (unsigned long long)have->total_slots);
        snprintf(b, sizeof b, "directory %u of %u, %u of %llu slots", w->dir_index, w->ndirs,
                 w->slots, (unsigned long long)w->total_slots);
        return mismatch(dir, have, "slot layout", a, b);
    }
    return KVT_OK;
}

/* Blocks the journal holds past the end of a data file that was cut short
 * (data_bytes) are gone: size_data refilled that range with zeros. They are
 * dropped now, said once, rather than each read later as a block that
 * "failed its checksum". */
static void drop_past_end(kvt_ssd *s, uint32_t d, uint64_t data_bytes)
{
    ssd_dir *dir = &s->dirs[d];
    uint32_t lost = 0;
    for (uint64_t g = d; g < s->total; g += s->ndirs) {
        uint64_t end = (g / s->ndirs + 1) * s->slot_bytes;
        if (end <= data_bytes || !s->durable[g].live) continue;
        s->durable[g].live = 0;
        dir->jlive--;
        lost++;
    }
    if (lost == 0) return;
    dir->compact_now = true; /* their PUT records go at the first commit round */
    fprintf(stderr, "kvtier: SSD tier: %s/%s was cut to %llu bytes (its slots need %llu): the %u "
            "blocks past its end are lost\n", dir->path, KVT_SSD_DATA_NAME,
            (unsigned long long)data_bytes, (unsigned long long)dir->meta.slots * s->slot_bytes,
            lost);
}

/* The directory's slot count changed with ssd_capacity (compare_meta lets
 * nothing else differ); its journal is loaded. Every step leaves a state the
 * next open accepts, whichever metadata a crash leaves on disk:
 * - growing: the data file has grown and is fsynced (attach_dir) before the
 *   metadata names the new slots; a crash before leaves the old metadata,
 *   which still matches the journal (a longer data file is harmless).
 * - shrinking: the journal is rewritten first with the kept blocks only,
 *   then the metadata, then the data file is cut (best effort: a longer one
 *   is harmless). Metadata first would leave records naming slots past its
 *   new count, which kvt__ssd_journal_scan takes for damage (fsck's
 *   bad_records; at the tail, cut as torn). */
static kvt_status resize_dir(kvt_ssd *s, uint32_t d, const kvt_ssd_meta *have, uint32_t dropped)
{
    ssd_dir *dir = &s->dirs[d];
    bool shrink = dir->meta.slots < have->slots;
    if (shrink) {
        dir->compact_now = true;
        kvt__ssd_journal_maybe_compact(s, d);
        if (dir->compact_now)
            return kvt__fail(KVT_EIO, "kvt__ssd_open: cache directory %s: rewriting %s for %u "
                             "slots (ssd_capacity shrank from %llu slots) failed: %s", dir->path,
                             KVT_SSD_JOURNAL_NAME, dir->meta.slots,
                             (unsigned long long)have->total_slots, kvt_last_error());
    }
    kvt_status st = write_meta(dir);
    if (st != KVT_OK) return st;
    off_t want = (off_t)((uint64_t)dir->meta.slots * dir->meta.slot_bytes);
    if (shrink && ftruncate(dir->data_fd, want) != 0) { /* best effort, see above */ }
    s->resized_from = have->total_slots;
    s->resize_dropped += dropped;
    return KVT_OK;
}

static kvt_status attach_dir(kvt_ssd *s, uint32_t d, const kvt_ssd_meta *have)
{
    ssd_dir *dir = &s->dirs[d];
    dir->meta.epoch = have->epoch;
    bool grow = dir->meta.slots > have->slots;
    kvt_status st = open_data(dir, 0);
    struct stat ds;
    if (st == KVT_OK && fstat(dir->data_fd, &ds) != 0) st = sys_fail(dir->path, "fstat", errno);
    if (st == KVT_OK) st = size_data(dir);
    /* A grown file's size must be durable before the metadata names it. */
    if (st == KVT_OK && grow && fsync(dir->data_fd) != 0)
        st = sys_fail(dir->path, "fsync", errno);
    if (st != KVT_OK) return st;
    dir->jfd = openat(dir->dir_fd, KVT_SSD_JOURNAL_NAME, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (dir->jfd < 0) return sys_fail(dir->path, KVT_SSD_JOURNAL_NAME, errno);
    kvt_ssd_scan scan;
    uint32_t dropped = 0;
    st = kvt__ssd_journal_load(s, d, have->slots, &scan, &dropped);
    if (st != KVT_OK) return st;
    drop_past_end(s, d, (uint64_t)ds.st_size);
    return have->slots == dir->meta.slots ? KVT_OK : resize_dir(s, d, have, dropped);
}

static kvt_status open_dir(kvt_ssd *s, uint32_t d, const kvt_ssd_params *p)
{
    ssd_dir *dir = &s->dirs[d];
    kvt_status st = lock_dir(dir);
    if (st != KVT_OK) return st;
    dir->meta = (kvt_ssd_meta){.version = KVT_SSD_FORMAT_VERSION, .dir_index = d,
                               .ndirs = s->ndirs, .total_slots = s->total,
                               .slots = kvt__ssd_dir_slots(s->total, s->ndirs, d),
                               .digest = p->digest, .block_bytes = s->block_bytes,
                               .slot_bytes = s->slot_bytes};
    memcpy(dir->meta.describe, s->describe, sizeof s->describe);
    dir->sparse = s->budget != NULL;
    uint8_t *buf = NULL;
    uint64_t len = 0;
    st = kvt__ssd_read_file(dir->dir_fd, dir->path, KVT_SSD_META_NAME, 4096, &buf, &len);
    if (st == KVT_ENOTFOUND) return create_dir(dir);
    if (st != KVT_OK) return st;
    kvt_ssd_meta have;
    st = kvt__ssd_meta_decode(buf, len, &have);
    free(buf);
    if (st != KVT_OK && !p->fresh) {
        char why[KVT_ERRMSG_MAX];
        snprintf(why, sizeof why, "%s", kvt_last_error());
        return kvt__fail(KVT_ECORRUPT, "kvt__ssd_open: cache directory %s: %s: %s; set "
                         "ssd_fresh=true to wipe it (its blocks are lost)", dir->path,
                         KVT_SSD_META_NAME, why);
    }
    if (st == KVT_OK) st = compare_meta(dir, &have);
    if (st == KVT_OK) return attach_dir(s, d, &have);
    return p->fresh ? create_dir(dir) : st;
}

/* ---- open / close ---------------------------------------------------- */

static void build_caller_tables(kvt_ssd *s)
{
    for (uint32_t g = s->total; g-- > 0;) {
        s->slots[g] = s->durable[g];
        s->allocated[g] = s->durable[g].live;
        if (s->durable[g].live && s->budget) s->backed[g] = 1, s->nbacked++;
        else if (!s->durable[g].live && s->budget) s->holes[s->nholes++] = g;
        else if (!s->durable[g].live) s->free_stack[s->nfree++] = g; /* alloc pops low slots first */
    }
    if (s->budget) atomic_fetch_add(&s->budget->used, (uint64_t)s->nbacked * s->slot_bytes);
}

static int punch(const ssd_dir *dir, uint64_t off, uint64_t len)
{
    return fallocate(dir->data_fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)off,
                     (off_t)len);
}

/* A budgeted store's directory written before (by a store without a
 * budget, or before a crash) may have disk behind slots no block uses:
 * punched out at open, a run of free local slots per call, so the budget
 * counts what is on disk. */
static kvt_status punch_free_runs(kvt_ssd *s, uint32_t d)
{
    ssd_dir *dir = &s->dirs[d];
    struct stat st;
    if (fstat(dir->data_fd, &st) != 0) return sys_fail(dir->path, "fstat", errno);
    if (st.st_blocks == 0) return KVT_OK; /* all hole already: a new file */
    uint32_t n = dir->meta.slots, run = 0;
    for (uint32_t l = 0; l <= n; l++) {
        bool is_free = l < n && !s->durable[(uint64_t)l * s->ndirs + d].live;
        if (is_free) {
            run++;
            continue;
        }
        if (run && punch(dir, (uint64_t)(l - run) * s->slot_bytes, (uint64_t)run * s->slot_bytes))
            return errno == EOPNOTSUPP
                ? kvt__fail(KVT_EUNSUPPORTED, "kvt__ssd_open: cache directory %s: its filesystem "
                            "cannot punch holes (fallocate PUNCH_HOLE), which a shared SSD "
                            "capacity needs", dir->path)
                : sys_fail(dir->path, "fallocate(PUNCH_HOLE)", errno);
        run = 0;
    }
    return KVT_OK;
}

/* A budgeted store's free space check: each directory's filesystem must
 * hold its part of the budget's room (what every store sharing it may
 * still take), not capacity_bytes. */
static kvt_status check_budget_space(kvt_ssd *s)
{
    uint64_t used = atomic_load(&s->budget->used), limit = s->budget->limit;
    uint64_t room = used < limit ? limit - used : 0, per_dir = (room + s->ndirs - 1) / s->ndirs;
    for (uint32_t d = 0; d < s->ndirs; d++) {
        struct statvfs vfs;
        ssd_dir *dir = &s->dirs[d];
        if (fstatvfs(dir->data_fd, &vfs) != 0) continue;
        uint64_t free_bytes = (uint64_t)vfs.f_bavail * vfs.f_frsize;
        if (per_dir > free_bytes)
            return kvt__fail(KVT_ENOSPC, "kvt__ssd_open: cache directory %s: no space for its "
                             "share of ssd_capacity: it may take %llu more bytes (the %llu of "
                             "ssd_capacity not yet used, over %u directories), its filesystem has "
                             "%llu bytes free: lower ssd_capacity or free space", dir->path,
                             (unsigned long long)per_dir, (unsigned long long)room, s->ndirs,
                             (unsigned long long)free_bytes);
    }
    return KVT_OK;
}

static kvt_status setup_budget(kvt_ssd *s)
{
    kvt_status st = KVT_OK;
    for (uint32_t d = 0; st == KVT_OK && d < s->ndirs; d++) st = punch_free_runs(s, d);
    return st == KVT_OK ? check_budget_space(s) : st;
}

/* One line per open whose ssd_capacity changed, after every directory. */
static void log_resize(const kvt_ssd *s, const char *dirs)
{
    if (s->resized_from == 0) return;
    uint32_t kept = 0;
    for (uint32_t g = 0; g < s->total; g++) kept += s->durable[g].live;
    if (s->resized_from < s->total)
        fprintf(stderr, "kvtier: SSD tier: %s grew from %llu to %u slots (ssd_capacity changed) "
                "and kept %u blocks\n", dirs, (unsigned long long)s->resized_from, s->total, kept);
    else
        fprintf(stderr, "kvtier: SSD tier: %s shrank from %llu to %u slots (ssd_capacity "
                "changed): dropped %u blocks in the slots past its new end, kept %u\n", dirs,
                (unsigned long long)s->resized_from, s->total, s->resize_dropped, kept);
}

static kvt_status init_sync(kvt_ssd *s)
{
    pthread_mutex_init(&s->cmu, NULL);
    if (kvt__cond_init(&s->ccv) != 0 || kvt__cond_init(&s->dcv) != 0)
        return kvt__fail(KVT_ESYS, "kvt__ssd_open: pthread_cond_init failed");
    return KVT_OK;
}

kvt_status kvt__ssd_open(kvt_ssd **out, const kvt_ssd_params *p)
{
    KVT_CHECK_NOT_NULL(out, "kvt__ssd_open");
    uint64_t total = 0;
    kvt_status st = check_params(p, &total);
    if (st != KVT_OK) return st;
    kvt_ssd *s = calloc(1, sizeof *s);
    if (!s) return kvt__fail(KVT_ENOMEM, "kvt__ssd_open: out of memory");
    s->total = (uint32_t)total;
    s->block_bytes = p->block_bytes;
    s->slot_bytes = round_up(p->block_bytes, KVT_SSD_SLOT_ALIGN);
    s->budget = p->budget;
    snprintf(s->describe, sizeof s->describe, "%s", p->describe ? p->describe : "");
    st = init_sync(s);
    if (st == KVT_OK) st = split_dirs(s, p->dirs);
    if (st == KVT_OK && s->ndirs > s->total)
        st = kvt__fail(KVT_EINVAL, "kvt__ssd_open: capacity_bytes %llu holds %u slots, fewer "
                       "than the %u directories", (unsigned long long)p->capacity_bytes,
                       s->total, s->ndirs);
    if (st == KVT_OK) st = alloc_tables(s, p->queue_depth);
    for (uint32_t d = 0; st == KVT_OK && d < s->ndirs; d++) st = open_dir(s, d, p);
    if (st == KVT_OK) log_resize(s, p->dirs);
    if (st == KVT_OK) build_caller_tables(s);
    if (st == KVT_OK && s->budget) st = setup_budget(s);
    if (st == KVT_OK) st = kvt__ssd_io_start(s, p);
    if (st != KVT_OK) {
        char keep[KVT_ERRMSG_MAX];
        snprintf(keep, sizeof keep, "%s", kvt_last_error());
        kvt__ssd_close(s);
        return kvt__fail(st, "%s", keep);
    }
    *out = s;
    return KVT_OK;
}

void kvt__ssd_close(kvt_ssd *s)
{
    if (!s) return;
    kvt__ssd_io_stop(s);
    for (uint32_t d = 0; d < s->ndirs && s->dirs; d++) {
        ssd_dir *dir = &s->dirs[d];
        if (dir->jfd >= 0) close(dir->jfd);
        if (dir->data_fd >= 0) close(dir->data_fd);
        if (dir->dir_fd >= 0) close(dir->dir_fd); /* drops the lock */
        free(dir->jbuf);
        free(dir->path);
    }
    free(s->dirs);
    free(s->slots);
    free(s->durable);
    free(s->free_stack);
    free(s->allocated);
    free(s->gen);
    free(s->dels);
    free(s->dels_commit);
    free(s->released);
    free(s->reclaim);
    free((void *)s->inflight);
    free(s->reqs);
    if (s->budget) kvt__budget_uncharge(s->budget, (uint64_t)s->nbacked * s->slot_bytes);
    free(s->backed);
    free(s->holes);
    pthread_cond_destroy(&s->ccv);
    pthread_cond_destroy(&s->dcv);
    pthread_mutex_destroy(&s->cmu);
    free(s);
}

/* ---- slots ----------------------------------------------------------- */

uint32_t kvt__ssd_blocks_total(const kvt_ssd *s) { return s ? s->total : 0; }
uint32_t kvt__ssd_blocks_free(const kvt_ssd *s)
{
    kvt_ssd *m = (kvt_ssd *)s; /* atomics: loads through a non-const pointer */
    if (!m) return 0;
    uint32_t n = m->nfree + atomic_load_explicit(&m->reclaiming, memory_order_relaxed);
    if (!m->budget) return n;
    uint64_t used = atomic_load(&m->budget->used), limit = m->budget->limit;
    uint64_t room = used < limit ? (limit - used) / m->slot_bytes : 0;
    return n + (uint32_t)(room < m->nholes ? room : m->nholes);
}
uint64_t kvt__ssd_slot_bytes(const kvt_ssd *s) { return s ? s->slot_bytes : 0; }
uint32_t kvt__ssd_blocks_used(const kvt_ssd *s)
{
    kvt_ssd *m = (kvt_ssd *)s;
    return m ? m->total - m->nfree - m->nholes -
                   atomic_load_explicit(&m->reclaiming, memory_order_relaxed)
             : 0;
}
uint32_t kvt__ssd_blocks_backed(const kvt_ssd *s) { return !s ? 0 : s->budget ? s->nbacked : s->total; }
const char *kvt__ssd_backend(const kvt_ssd *s) { return s && s->ops ? s->ops->name : "none"; }

/* Refills the free stack from the released slots: one lock per refill. */
static void take_released(kvt_ssd *s)
{
    pthread_mutex_lock(&s->cmu);
    uint32_t n = s->nreleased;
    memcpy(s->free_stack + s->nfree, s->released, (size_t)n * sizeof *s->released);
    s->nfree += n;
    s->nreleased = 0;
    atomic_fetch_sub(&s->reclaiming, n);
    pthread_mutex_unlock(&s->cmu);
}

uint32_t kvt__ssd_alloc(kvt_ssd *s)
{
    if (s && s->nfree == 0 && atomic_load_explicit(&s->reclaiming, memory_order_relaxed))
        take_released(s);
    if (!s) return KVT_SSD_NONE;
    uint32_t slot;
    if (s->nfree > 0) {
        slot = s->free_stack[--s->nfree];
    } else if (s->nholes > 0 && kvt__budget_charge(s->budget, s->slot_bytes)) {
        slot = s->holes[--s->nholes];
        s->backed[slot] = 1;
        s->nbacked++;
    } else {
        return KVT_SSD_NONE;
    }
    s->allocated[slot] = 1;
    return slot;
}

uint32_t kvt__ssd_release(kvt_ssd *s, uint32_t max)
{
    if (!s || !s->budget) return 0;
    if (s->nfree < max && atomic_load_explicit(&s->reclaiming, memory_order_relaxed))
        take_released(s);
    uint32_t n = 0;
    while (n < max && s->nfree > 0) {
        uint32_t slot = s->free_stack[s->nfree - 1];
        /* Free and reclaimed: no I/O on it is in flight and the journal
         * names no block in it. A filesystem that cannot punch keeps the
         * slot backed and charged. */
        if (punch(kvt__ssd_dir_of(s, slot), (uint64_t)kvt__ssd_local(s, slot) * s->slot_bytes,
                  s->slot_bytes) != 0)
            break;
        s->nfree--;
        s->backed[slot] = 0;
        s->nbacked--;
        s->holes[s->nholes++] = slot;
        kvt__budget_uncharge(s->budget, s->slot_bytes);
        n++;
    }
    return n;
}
