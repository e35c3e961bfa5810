/* ssd_internal.h - the SSD store's private state, shared by ssd.c (open,
 * close, directories), ssd_io.c (the write/read path and group commit),
 * ssd_journal.c (journal append, replay, compaction) and ssd_fsck.c. */
#ifndef KVT_STORE_SSD_INTERNAL_H
#define KVT_STORE_SSD_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include "store/io.h"
#include "store/ssd.h"
#include "store/ssd_format.h"

#define KVT_SSD_META_NAME "kvtier.meta"
#define KVT_SSD_DATA_NAME "kvtier.data"
#define KVT_SSD_JOURNAL_NAME "kvtier.journal"
#define KVT_SSD_JOURNAL_TMP "kvtier.journal.tmp"
#define KVT_SSD_META_TMP "kvtier.meta.tmp"
/* Records buffered per directory before a journal pwrite (256 KiB). */
#define KVT_SSD_JBUF_RECS 4096u

/* What a slot holds: the caller-side table (written by write/free under the
 * cache's ordering) and the commit thread's durable table share the type. */
typedef struct kvt_ssd_slot {
    kvt_hash128 key, parent;
    uint64_t csum;
    uint8_t has_parent, live;
} kvt_ssd_slot;

typedef struct ssd_dir {
    char *path;
    int dir_fd;   /* holds the flock */
    int data_fd;  /* O_DIRECT */
    int jfd;      /* journal, appended by the commit thread only */
    kvt_ssd_meta meta;
    /* Commit thread only: */
    uint64_t jrecords;    /* records in the journal file (next seq) */
    uint64_t jlive;       /* live PUTs */
    uint8_t *jbuf;        /* KVT_SSD_JBUF_RECS records being appended */
    uint32_t jbuf_n;
    uint64_t jbuf_seq0;   /* seq of jbuf[0] */
    bool compact_now;     /* the journal holds damaged records: rewrite it */
    bool touched;         /* has writes in the current commit round */
    bool sparse;          /* a budgeted store's: the data file is not preallocated */
    kvt_status fail;      /* of the current commit round */
} ssd_dir;

typedef struct ssd_req {
    kvt_io_req io; /* first: the backend hands back &io */
    _Atomic uint32_t next_free;
    bool write, flip; /* flip: injected corruption of a read */
    uint32_t slot, gen;
    bool journaled; /* a PUT record for it is in this round's journal buffer */
    kvt_hash128 key, parent;
    bool has_parent;
    uint64_t csum;
    kvt_status early; /* != KVT_OK: fail without I/O (the backend runs a NOP) */
    kvt_ssd_done_fn done;
    void *arg;
    struct ssd_req *next_commit;
} ssd_req;

struct kvt_ssd {
    ssd_dir *dirs;
    uint32_t ndirs, total;
    uint64_t block_bytes, slot_bytes;
    char describe[KVT_SSD_DESCRIBE_MAX];
    /* Open only: a changed ssd_capacity (see resize_dir in ssd.c). */
    uint64_t resized_from;  /* the total the old metadata named; 0: unchanged */
    uint32_t resize_dropped; /* blocks in slots past a shrunk end */

    /* Caller side (under the cache's lock for alloc/free/recover). */
    kvt_ssd_slot *slots;
    uint32_t *free_stack, nfree;
    uint8_t *allocated;
    _Atomic uint32_t *gen; /* bumped by free: a write submitted before it is not journaled */
    bool recovered;
    /* A budgeted store (kvt_ssd_params.budget): free_stack holds backed
     * slots only; holes[0, nholes) are free slots without disk (handed out
     * by alloc when the budget has room). backed[g]: g has disk and budget. */
    kvt_pool_budget *budget;
    uint8_t *backed;
    uint32_t *holes, nholes, nbacked;

    /* Commit thread side. */
    kvt_ssd_slot *durable;

    /* Requests: a lock-free stack of indices, tagged against ABA. */
    ssd_req *reqs;
    uint32_t nreq;
    _Atomic uint64_t free_top;

    /* Group commit: completed writes and pending frees, under cmu. */
    pthread_mutex_t cmu;
    pthread_cond_t ccv; /* wakes the commit thread */
    pthread_cond_t dcv; /* wakes sync/close waiters */
    ssd_req *cq_head, *cq_tail;
    uint32_t *dels, ndels;       /* frees not yet journaled */
    uint32_t *dels_commit;       /* the commit thread's copy */
    bool stop, flush_dels, busy; /* busy: a commit round is running */
    /* Reclaim: a freed slot is handed out again only once the journal no
     * longer names its old block (its DEL is durable, or it never had a
     * PUT) and no I/O on it is in flight; until then a crash or a failed
     * round would leave a PUT naming overwritten bytes. released: ready for
     * kvt__ssd_alloc (moved to free_stack when that runs dry). reclaiming:
     * freed slots not yet in free_stack, less those whose DEL could not be
     * written (they stay out of use, their old block intact and journaled). */
    uint32_t *released, nreleased;
    _Atomic uint32_t reclaiming;
    uint32_t *reclaim;           /* the commit thread's round list */
    _Atomic uint16_t *inflight;  /* per slot: I/Os submitted and not completed */
    pthread_t commit_th;
    bool commit_started;

    _Atomic uint64_t writes_submitted, writes_finished, outstanding;

    const kvt_io_ops *ops;
    kvt_io *io;

    _Atomic int inject_kind[2];      /* [on_write] */
    _Atomic int jinject_err;         /* kvt__ssd_inject_journal */
    _Atomic bool hold_reads;         /* kvt__ssd_hold_reads */
    _Atomic uint32_t reads_held;
    _Atomic bool hold_writes;        /* kvt__ssd_hold_writes */
    _Atomic int64_t jinject_skip, jinject_left;

    /* The first write failure (kvt__ssd_first_failure): claimed by a CAS on
     * fail_state (0 none, 1 being written, 2 set), so the first writer wins. */
    _Atomic int fail_state;
    kvt_status fail_status;
    char fail_why[256];
    _Atomic int64_t inject_count[2];

    _Atomic uint64_t st_writes, st_write_bytes, st_reads, st_read_bytes;
    _Atomic uint64_t st_write_errors, st_read_errors, st_corrupt, st_jrecs, st_compactions;
    _Atomic uint64_t st_withheld; /* slots kept out of use: their DEL failed */
};

static inline ssd_dir *kvt__ssd_dir_of(kvt_ssd *s, uint32_t slot) { return &s->dirs[slot % s->ndirs]; }
static inline uint32_t kvt__ssd_local(const kvt_ssd *s, uint32_t slot) { return slot / s->ndirs; }

/* ssd_io.c */
/* Records the first write failure (see kvt__ssd_first_failure); returns the
 * status for err (KVT_ENOSPC for ENOSPC, EDQUOT, EFBIG; else KVT_EIO). */
kvt_status kvt__ssd_note_failure(kvt_ssd *s, int err, const char *dir, const char *name,
                                 const char *what);
kvt_status kvt__ssd_io_start(kvt_ssd *s, const kvt_ssd_params *p);
void kvt__ssd_io_stop(kvt_ssd *s);
void kvt__ssd_io_complete(void *ctx, kvt_io_req **reqs, uint32_t n);

/* ssd_journal.c */
/* Reads and replays d's journal into s->durable, truncating a torn tail and
 * counting what it found. was_slots is the slot count of the metadata on
 * disk, which the journal was written under (the scan's bound); when it is
 * more than dir->meta.slots (a shrunk ssd_capacity), the blocks live in
 * local slots past the new end are not replayed and *dropped counts them. */
kvt_status kvt__ssd_journal_load(kvt_ssd *s, uint32_t d, uint32_t was_slots, kvt_ssd_scan *scan,
                                 uint32_t *dropped);
void kvt__ssd_journal_add(kvt_ssd *s, ssd_dir *dir, const kvt_ssd_rec *r);
/* Writes buffered records and fdatasyncs the journal; sets dir->fail. */
void kvt__ssd_journal_commit(kvt_ssd *s, ssd_dir *dir);
void kvt__ssd_journal_maybe_compact(kvt_ssd *s, uint32_t d);
/* Writes recs (n PUT records of table) as d's new journal via tmp + fsync +
 * rename + directory fsync. Used by compaction and fsck --repair. */
kvt_status kvt__ssd_journal_rewrite(int dir_fd, const char *path, uint64_t epoch,
                                    const uint8_t *recs, uint64_t n, int *new_fd);
/* Reads a whole file (at most max bytes) into a malloc'd buffer. KVT_OK;
 * KVT_ENOTFOUND (no message) when it does not exist; KVT_EINVAL when it is
 * not a regular file (a FIFO is never waited on); KVT_EIO; KVT_ENOMEM. */
kvt_status kvt__ssd_read_file(int dir_fd, const char *dir, const char *name, uint64_t max,
                              uint8_t **out, uint64_t *len);

#endif
