/* hasher.h - a link's checksum thread: hashes the chunks of a DATA batch
 * its link hands it, in order, into the batch's page states, so that the
 * link's own thread only moves bytes (kvt_pd_params.checksum_threads).
 *
 * One producer (the link's thread) and one consumer (the hasher) over a
 * fixed ring: submitting a chunk takes no lock and allocates nothing (a
 * lock is taken only to wake a hasher that fell asleep, after a few
 * microseconds with nothing to do). The link waits for the ring to drain before it reads the
 * digests, before it resets the states for the next batch, and before a
 * batch's pages may go back to the engine: on success and on failure. */
#ifndef KVT_PD_HASHER_H
#define KVT_PD_HASHER_H

#include "pd/xfer.h"

typedef struct pd_hasher pd_hasher;

/* One chunk: entry e's pieces of decode pages [ja, jb) into the states of
 * hs (state j - base). x is copied; what it points to (plan, page table,
 * page map) and the pages' memory must stay until a drain returns. */
typedef struct pd_hash_chunk {
    pd_xfer x;
    uint32_t e, ja, jb, base;
    /* Set (an authenticated link, pd/mac.h): the chunk's bytes go to
     * fn(arg, ...) in wire order (pd_xfer_walk_entry) instead of hs. */
    void (*fn)(void *arg, const uint8_t *p, size_t n);
    void *arg;
} pd_hash_chunk;

/* Starts a hasher feeding hs (the link's batch states). name: for errors. */
kvt_status pd_hasher_start(pd_hasher **out, pd_hashes *hs, const char *name);
/* Waits for the queued chunks (bounded), then stops and joins the thread. NULL: no-op. */
void pd_hasher_stop(pd_hasher *h);
/* Queues one chunk; waits for room while the ring is full, until
 * deadline_ns (KVT_ETIMEDOUT: the hasher did not keep up). */
kvt_status pd_hasher_submit(pd_hasher *h, const pd_hash_chunk *c, uint64_t deadline_ns);
/* Waits until every queued chunk is hashed (their states are then the
 * caller's to read or reset), until deadline_ns (KVT_ETIMEDOUT). */
kvt_status pd_hasher_drain(pd_hasher *h, uint64_t deadline_ns);
/* Whether checksums go to a thread of their own when params ask for auto
 * (0): on hosts with at least PD_HASH_AUTO_CPUS online CPUs, unless the
 * environment's KVTIER_PD_CHECKSUM_THREADS is "1" (yes) or "0" (no). */
#define PD_HASH_AUTO_CPUS 8
bool pd_hash_thread_auto(void);

#endif
