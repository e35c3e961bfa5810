/* ssd.h - the SSD tier's block store: fixed-size block slots in
 * pre-allocated files (one per cache directory, one directory per device,
 * blocks striped across them), O_DIRECT I/O through an io backend (io_uring
 * or a pread/pwrite thread pool, behind an ops table), and a metadata journal
 * that makes the store survive restarts and crashes.
 *
 * What the store promises:
 *  - A write's done callback reports KVT_OK only once the block's data and
 *    its journal record are durable (fdatasync'd): after a crash or SIGKILL,
 *    every block reported durable (and not freed since) is recovered.
 *  - Every block carries an XXH3 checksum, verified on every read: a
 *    mismatch (torn write, bit rot, a slot overwritten before a crash) is
 *    KVT_ECORRUPT, never data.
 *  - A directory written for another geometry digest or block size is
 *    refused at open with a message naming the field and both values,
 *    unless fresh is set (then it is wiped and started empty).
 *
 * Threading: alloc/free/recover are called under the cache's lock (not
 * thread-safe among themselves). write/read may be called from any thread;
 * done callbacks run on the store's completion thread, never inside
 * kvt__ssd_write/read, and must not call back into the store's write/read
 * while holding a lock the store's thread could need (they may take the
 * cache lock). */
#ifndef KVT_STORE_SSD_H
#define KVT_STORE_SSD_H

#include <stdbool.h>
#include <stdint.h>

#include "kvtier.h"
#include "store/pool.h"
#include "util/hash.h"

#define KVT_SSD_NONE UINT32_MAX

typedef struct kvt_ssd kvt_ssd;

typedef struct kvt_ssd_params {
    const char *dirs;         /* comma-separated directories, one per device; created if absent */
    uint64_t capacity_bytes;  /* total over all directories; never exceeded */
    uint64_t block_bytes;     /* bytes of one block (the cache's block size) */
    uint64_t digest;          /* geometry + block size digest stored in the metadata */
    const char *describe;     /* e.g. "8 layers, 16 KiB/token, 16 tokens/block": stored,
                                 quoted in mismatch messages */
    bool fresh;               /* wipe a mismatching or damaged directory instead of refusing */
    const char *io;           /* "auto" (io_uring if it works, else threads), "uring", "threads";
                                 "auto" or NULL defers to $KVTIER_IO when that is set */
    uint32_t queue_depth;     /* in-flight I/Os per backend, e.g. 64 */
    void *register_base;      /* optional: memory that buffers come from (the CPU pool), */
    uint64_t register_len;    /* registered with io_uring when the memlock limit allows */
    /* Optional: a byte budget this store shares with others (the node
     * server's one ssd_capacity over the tiers of every geometry it serves).
     * The data files are then sparse (capacity_bytes is address space: the
     * most this store may use); a slot takes disk, and slot_bytes of the
     * budget, when first allocated, and gives both back through
     * kvt__ssd_release. Recovered blocks are charged at open even past the
     * limit (no block is dropped for it); the other slots' disk is punched
     * out. The free space check at open asks for the budget's room, not
     * capacity_bytes. Must outlive the store. */
    kvt_pool_budget *budget;
} kvt_ssd_params;

/* Opens (creating or recovering) the store. KVT_EINVAL for bad params,
 * KVT_EIO/KVT_ESYS for a missing or read-only directory (message names the
 * path and errno text), KVT_EGEOMETRY for a directory of another geometry. */
kvt_status kvt__ssd_open(kvt_ssd **out, const kvt_ssd_params *p);
/* Waits for in-flight I/O (their callbacks run), syncs the journal, closes. */
void kvt__ssd_close(kvt_ssd *s);

uint32_t kvt__ssd_blocks_total(const kvt_ssd *s);
/* Free, or freed and on their way back; with a budget, plus the unbacked
 * slots its room would back now. */
uint32_t kvt__ssd_blocks_free(const kvt_ssd *s);
uint64_t kvt__ssd_slot_bytes(const kvt_ssd *s); /* block_bytes rounded up to 4096 */
/* Slots holding a block or being written (neither free nor unbacked). */
uint32_t kvt__ssd_blocks_used(const kvt_ssd *s);
/* With a budget: slots with disk behind them (used or free). */
uint32_t kvt__ssd_blocks_backed(const kvt_ssd *s);
const char *kvt__ssd_backend(const kvt_ssd *s); /* "io_uring" or "threads" */

/* Calls fn for every block recovered from the journal at open, parents
 * before children; returns the count. Call once, right after open. */
typedef void (*kvt_ssd_recover_fn)(void *arg, uint32_t slot, kvt_hash128 key,
                                   kvt_hash128 parent, bool has_parent);
uint32_t kvt__ssd_recover(kvt_ssd *s, kvt_ssd_recover_fn fn, void *arg);

uint32_t kvt__ssd_alloc(kvt_ssd *s);            /* KVT_SSD_NONE when full */
void kvt__ssd_free(kvt_ssd *s, uint32_t slot);  /* forgets the slot's block (journaled lazily) */
/* A freed slot is handed out again only once its DEL record is durable (a
 * commit round later), so kvt__ssd_alloc may say full while frees are on
 * their way back (kvt__ssd_blocks_free counts them). Waits, asking for a
 * round at once, until one is ready: true; false when none is coming (their
 * DELs failed: those slots stay out of use) or at deadline_ns. Call without
 * any lock a done callback takes. */
bool kvt__ssd_wait_reclaim(kvt_ssd *s, uint64_t deadline_ns);
/* Asks the commit thread for a round now (frees journaled sooner than its
 * idle tick); never waits. */
void kvt__ssd_flush_frees(kvt_ssd *s);
/* With a budget (else 0): gives up to max free backed slots' disk back to
 * the filesystem (a punched hole) and their bytes back to the budget, freed
 * slots whose DEL is durable included; returns how many. Under the cache's
 * lock, as alloc. A syscall per slot: for moving capacity between stores
 * under pressure, never per transfer. */
uint32_t kvt__ssd_release(kvt_ssd *s, uint32_t max);

typedef void (*kvt_ssd_done_fn)(void *arg, kvt_status st);
/* write/read return KVT_OK when the I/O is queued, and then done is called
 * exactly once; any other return (KVT_EINVAL: bad argument, slot not
 * allocated or buffer misaligned; KVT_EAGAIN: all max(4 * queue_depth, 1024)
 * request slots are in flight, retry after completions) means done is never
 * called. A write whose slot is freed while it is in flight completes with
 * KVT_ECANCELED and is not journaled. */
/* Writes block_bytes from buf (4096-byte aligned, readable up to the next
 * 4096 multiple) to slot; done(arg, KVT_OK) once durable, or an error
 * (KVT_ENOSPC, KVT_EIO) after which the slot holds nothing. */
kvt_status kvt__ssd_write(kvt_ssd *s, uint32_t slot, const void *buf, kvt_hash128 key,
                          kvt_hash128 parent, bool has_parent, kvt_ssd_done_fn done, void *arg);
/* Reads slot into buf (aligned as for write) and verifies the checksum and
 * that the slot holds key: done(arg, KVT_OK), KVT_ECORRUPT or KVT_EIO. */
kvt_status kvt__ssd_read(kvt_ssd *s, uint32_t slot, void *buf, kvt_hash128 key,
                         kvt_ssd_done_fn done, void *arg);
/* Blocks until every write submitted so far has completed (durable or
 * failed), or deadline_ns: KVT_OK or KVT_ETIMEDOUT. (Counted: with other
 * threads writing meanwhile it waits for as many completions.) */
kvt_status kvt__ssd_sync(kvt_ssd *s, uint64_t deadline_ns);

/* Fault injection for tests: the n-th I/O from now (0 = next) of the given
 * direction fails as kind says. */
typedef enum kvt_ssd_fault {
    KVT_SSD_FAULT_NONE = 0,
    KVT_SSD_FAULT_ENOSPC,      /* write fails with ENOSPC */
    KVT_SSD_FAULT_EIO,         /* read or write fails with EIO */
    KVT_SSD_FAULT_SHORT,       /* read or write transfers half the bytes */
    KVT_SSD_FAULT_CORRUPT,     /* a read returns one flipped byte */
} kvt_ssd_fault;
void kvt__ssd_inject(kvt_ssd *s, kvt_ssd_fault kind, bool on_write, uint32_t nth);
/* For tests: while hold is set, every read's completion waits (each at most
 * 10 s), as a slow device would; kvt__ssd_reads_held counts the waiting. */
void kvt__ssd_hold_reads(kvt_ssd *s, bool hold);
/* For tests: while hold is set, every write's completion waits the same way
 * (each at most 10 s): writes stay pending, as on a slow device. */
void kvt__ssd_hold_writes(kvt_ssd *s, bool hold);
uint32_t kvt__ssd_reads_held(kvt_ssd *s);
/* Fault injection for tests: from the nth journal write on (0 = the next),
 * count journal writes fail with errno err (ENOSPC, EIO), as a full or
 * failing filesystem would; count 0 clears it. */
void kvt__ssd_inject_journal(kvt_ssd *s, int err, uint32_t nth, uint32_t count);

/* The first write failure the store met (a data write, a data or journal
 * fdatasync, a journal write): KVT_ENOSPC (the filesystem is full: ENOSPC,
 * EDQUOT, EFBIG) or KVT_EIO, with what failed in why ("DIR/kvtier.journal:
 * write: No space left on device"); KVT_OK when none. Any thread. */
kvt_status kvt__ssd_first_failure(const kvt_ssd *s, char *why, size_t why_len);

typedef struct kvt_ssd_stats {
    uint64_t writes, write_bytes, reads, read_bytes;
    uint64_t write_errors, read_errors, corrupt_reads;
    uint64_t journal_records, journal_compactions;
    uint64_t withheld_slots; /* freed, but their DEL failed: out of use until restart */
} kvt_ssd_stats;
void kvt__ssd_stats(const kvt_ssd *s, kvt_ssd_stats *out);

/* fsck: checks a cache directory set without changing it (safe while the
 * directory is in use): metadata, journal records, and every journaled
 * block's checksum. repair=true (only when not in use) rewrites the journal
 * keeping the good records. */
typedef struct kvt_ssd_fsck_report {
    uint64_t digest, block_bytes;
    char describe[256];
    uint32_t slots_total, blocks, bad_blocks, bad_records;
    uint32_t records;          /* valid journal records */
    uint32_t skipped_records;  /* damaged records amid valid ones (of bad_records): skipped,
                                  each lost the one block it described, if any */
    uint32_t missing_blocks;   /* blocks the journal holds past the end of a truncated
                                  data file (of blocks; not counted in bad_blocks) */
    uint32_t orphan_blocks;    /* verified blocks that can never be matched again: a block
                                  before them in their prefix is bad, missing or gone */
    bool journal_truncated; /* a torn tail record was found */
    bool data_truncated;    /* a data file is shorter than its slots: data_bytes of
                               data_bytes_needed (the last such directory) */
    uint64_t data_bytes, data_bytes_needed;
    bool repaired;
} kvt_ssd_fsck_report;
kvt_status kvt__ssd_fsck(const char *dirs, bool repair, kvt_ssd_fsck_report *out);

#endif
