/* external.h - tasks whose bytes another process moves (the node server,
 * src/server). The cache still decides, pins, evicts and does SSD I/O; the
 * client process copies between its engine pages and the CPU tier, which
 * lives in a memfd it maps (kvt__cache_create_ex(shared)).
 *
 * An external task is planned as usual (kvt_cache_lookup /
 * kvt_cache_prepare_store, so it expires after plan_ttl_ms while
 * unlaunched), then:
 *   kvt__cache_ext_launch  PLANNED -> RUNNING; a load's SSD reads are
 *                          waited for until a deadline (the node server
 *                          passes none and asks again later with
 *                          kvt__cache_ext_offsets, so no caller blocks on
 *                          the SSD); gives the blocks' memfd offsets;
 *   (the client copies)
 *   kvt__cache_ext_end     ends it with the client's status: a store's
 *                          entries become READY only on KVT_OK (the caller
 *                          recorded the blocks' checksums first), else they
 *                          are rolled back; a load's pins are released;
 *                          the result is reported here (never to wait/poll).
 * kvt__cache_ext_abort ends an external task in any state (the client went
 * away). Thread-safe like every cache call. */
#ifndef KVT_CACHE_EXTERNAL_H
#define KVT_CACHE_EXTERNAL_H

#include <stdbool.h>
#include <stdint.h>
#include "kvtier.h"
#include "util/hash.h"

typedef struct kvt_ext_shm {
    int fd;              /* the CPU tier's memfd (owned by the cache) */
    uint8_t *base;       /* the cache's own mapping of it */
    uint64_t map_bytes;  /* its size */
    uint64_t stride;     /* distance between blocks */
    uint64_t block_bytes;
    uint32_t block_tokens;
    uint32_t num_blocks;
    const char *pages;   /* what backs it: "hugetlb", "thp" or "4k" */
    bool sparse;         /* backed slot by slot as they are first written (a
                          * budgeted pool): a mapping must not populate it */
} kvt_ext_shm;

/* The shared CPU tier of a cache made with shared = true (its only caller,
 * the node server, makes its cache so: a failure here could never happen,
 * and kvt_server_create's status list would name one). */
void kvt__cache_ext_shm(kvt_cache *c, kvt_ext_shm *out);

typedef struct kvt_ext_launch {
    kvt_task_kind kind;
    uint32_t first_token, num_tokens; /* may shrink for a load (lost blocks) */
    uint32_t num_blocks;
    kvt_status bad_status;            /* why a load shrank, else KVT_OK */
    bool reading;                     /* SSD reads still running at the deadline:
                                         no offsets yet (num_blocks 0) */
} kvt_ext_launch;

/* Launches planned task id externally; offsets (room for max) get each
 * block's byte offset in the memfd. Waits for a load's SSD reads until
 * deadline_ns; still reading then: KVT_OK with out->reading set and no
 * offsets (the task stays RUNNING: kvt__cache_ext_offsets later, or abort
 * it). A task that already ended (expired, cancelled, every block lost)
 * is reported and freed here and its status returned. */
kvt_status kvt__cache_ext_launch(kvt_cache *c, kvt_task_id id, uint64_t deadline_ns,
                                 uint64_t *offsets, uint32_t max, kvt_ext_launch *out);
/* The offsets of a task kvt__cache_ext_launch left reading: waits for its
 * SSD reads until deadline_ns (a deadline already passed: just looks), then
 * as kvt__cache_ext_launch: out->reading while still reading, the offsets
 * once read, or the status of a task that ended meanwhile (every block
 * lost: reported and freed). */
kvt_status kvt__cache_ext_offsets(kvt_cache *c, kvt_task_id id, uint64_t deadline_ns,
                                  uint64_t *offsets, uint32_t max, kvt_ext_launch *out);
/* The index keys and entry ids of launched task id's blocks (as many as
 * its offsets), into keys and ids (room for max each): what the node
 * server records each block's checksums under (an entry keeps its id
 * while its block moves between the CPU and SSD tiers). KVT_ENOTFOUND,
 * KVT_ESTATE (not launched, or its reads still run), KVT_EINVAL (more
 * than max blocks). */
kvt_status kvt__cache_ext_keys(kvt_cache *c, kvt_task_id id, kvt_hash128 *keys, uint32_t *ids,
                               uint32_t max);
/* Backs and maps, in this process, the CPU-tier slots at offsets (n of
 * them, from kvt__cache_ext_launch of a store that this process writes
 * itself: src/cluster's pulls) before they are written; slots this
 * process mapped before are skipped (kvt__pool_populate). */
void kvt__cache_ext_populate(kvt_cache *c, const uint64_t *offsets, uint32_t n);
/* The index's capacity: entry ids are below it. */
uint32_t kvt__cache_ext_entries(kvt_cache *c);

/* What a launch of up to n blocks reports, in one allocation (freed with
 * free(b->offsets)): offsets for kvt__cache_ext_launch, keys and ids for
 * kvt__cache_ext_keys, and extra u64s per block for the caller's own
 * (a pull's layer checksums). KVT_ENOMEM (what names the caller). */
typedef struct kvt_ext_blocks {
    uint64_t *offsets;
    kvt_hash128 *keys;
    uint64_t *extra; /* n * extra_per_block; NULL when 0 */
    uint32_t *ids;
} kvt_ext_blocks;
kvt_status kvt__ext_blocks_alloc(kvt_ext_blocks *b, uint32_t n, uint32_t extra_per_block,
                                 const char *what);
/* Counts n blocks a client's load found unlike their stored checksums in
 * corrupt_blocks (the node server drops them with kvt__cache_ext_clear). */
void kvt__cache_ext_count_corrupt(kvt_cache *c, uint32_t n);
/* Ends a launched external task with st (KVT_OK: the copy succeeded) and
 * reports its result into *out. */
kvt_status kvt__cache_ext_end(kvt_cache *c, kvt_task_id id, kvt_status st,
                              kvt_task_result *out);
/* Ends task id whatever its state (planned, launched, reading: then waits
 * for the reads until deadline_ns) and forgets its result. */
kvt_status kvt__cache_ext_abort(kvt_cache *c, kvt_task_id id, uint64_t deadline_ns);

/* Cuts off launched external task id whose client stopped copying (the
 * server's copy deadline): ends it (a load unpinned, a store rolled back,
 * never visible) but a store's blocks stay out of the pool, since the
 * client still maps them and may write late: their slots go to slots (room
 * for max >= the task's blocks; *n gets the count) until
 * kvt__cache_ext_release, once that process is gone. A task in another
 * state is aborted as kvt__cache_ext_abort does (*n = 0). */
kvt_status kvt__cache_ext_cut(kvt_cache *c, kvt_task_id id, uint32_t *slots, uint32_t max,
                              uint32_t *n);
/* Returns blocks kept by kvt__cache_ext_cut to the pool. */
void kvt__cache_ext_release(kvt_cache *c, const uint32_t *slots, uint32_t n);

/* True (and the task reaped) when planned task id is gone: expired after
 * plan_ttl_ms, or unknown. False while it is planned or launched. */
bool kvt__cache_ext_expired(kvt_cache *c, kvt_task_id id);

/* Which of roots[0..n) (first blocks' hashes) are in the index now. */
void kvt__cache_ext_roots_live(kvt_cache *c, const kvt_hash128 *roots, uint32_t n, bool *live);
/* Removes every entry at or below the roots (the chains they start: one
 * namespace's, node server CLEAR) from the index and both tiers, leaves
 * first; an entry that cannot go now (pinned: a load or an SSD write in
 * flight; a store in flight, or such an entry, below it) stays and is
 * counted in *kept. O(entries of the index) with one scratch allocation:
 * for an operator's clear, not the data path. KVT_ENOMEM. */
kvt_status kvt__cache_ext_clear(kvt_cache *c, const kvt_hash128 *roots, uint32_t n,
                                uint32_t *removed, uint32_t *kept);

#endif
