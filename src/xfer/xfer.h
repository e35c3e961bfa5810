/* xfer.h - the transfer engine: worker threads that move KV between the
 * engine's pages and cache blocks.
 *
 * A task is cut into units of one layer (all of the task's blocks for that
 * layer), handed out in layer order, so a layerwise load can release layer L
 * to the forward pass as soon as layers 0..L have landed. Workers take units
 * from the oldest task first; two workers share one task's layers. The copy
 * itself goes through an ops table (host memcpy now; a CUDA or other backend
 * provides its own table without touching callers). Per unit a worker builds
 * a chunk list in a buffer it owns and calls ops->copy once: no allocation,
 * no lock and no syscall per block.
 */
#ifndef KVT_XFER_XFER_H
#define KVT_XFER_XFER_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include "kvtier.h"
#include "layout/layout.h"
#include "util/copy.h" /* kvt_copy_chunk */


typedef struct kvt_copy_ops {
    const char *name;
    /* Copies n chunks. Returns KVT_OK or an error (KVT_EIO...). */
    kvt_status (*copy)(void *ctx, const kvt_copy_chunk *chunks, uint32_t n);
    void *ctx;
    /* Optional, for asynchronous backends (cuda); when copy_async is set,
     * the engine uses these three instead of copy. *wctx is the worker's own
     * state (NULL at first; the backend creates it on the worker thread and
     * worker_exit frees it). Per unit (one layer, one direction) the worker
     * calls copy_async once per buffer of chunks (once per unit unless it
     * has more than 512 chunks; the chunks may be reused after the call),
     * then record(event) (event: the task's event for the layer, or NULL),
     * then sync, which waits for everything enqueued. sync is called after
     * a failed copy_async too. */
    kvt_status (*copy_async)(void *ctx, void **wctx, int dir, const kvt_copy_chunk *chunks,
                             uint32_t n);
    kvt_status (*record)(void *ctx, void **wctx, void **event);
    kvt_status (*sync)(void *ctx, void **wctx);
    void (*worker_exit)(void *ctx, void *wctx);
    /* copy is a plain memcpy (no side effects): a store may then copy into
     * the tier itself, with streaming stores (util/copy.h), and while
     * hashing when it checksums its blocks (kvt_hash_copy), instead of
     * calling copy. */
    bool plain_memcpy;
} kvt_copy_ops;

/* memcpy on the host. */
extern const kvt_copy_ops kvt__host_copy_ops;

typedef enum kvt_xfer_dir {
    KVT_XFER_GATHER = 1,  /* engine pages -> cache blocks (a store) */
    KVT_XFER_SCATTER = 2, /* cache blocks -> engine pages (a load) */
} kvt_xfer_dir;

typedef struct kvt_xfer_task kvt_xfer_task;

struct kvt_xfer_task {
    /* Filled in by the submitter; read-only while the task runs. */
    kvt_xfer_dir dir;
    const kvt_geometry *geo;
    const kvt_page_map *map;
    uint32_t block_tokens;     /* a multiple of geo->tokens_per_page */
    uint32_t num_blocks;
    uint8_t *const *blocks;    /* num_blocks block addresses */
    const uint32_t *pages;     /* num_blocks * (block_tokens / tokens_per_page)
                                  engine pages, block 0's pages first; in a
                                  SCATTER, KVT_PAGE_SKIP pages are not copied */
    /* Called once, by a worker, when the task ends (all layers copied, or
     * cancelled, or failed); status says which. No xfer lock is held. */
    void (*on_done)(kvt_xfer_task *task, kvt_status status);
    void *user;
    /* Optional (asynchronous backends): num_layers event slots, passed to
     * ops->record per layer (the backend may create the event in a NULL
     * slot). NULL: no events. */
    void **layer_events;
    /* Optional, gather only: num_blocks x num_layers slots; the worker that
     * copies layer l of block b writes layer_sums[b * num_layers + l] =
     * kvt__hash64(that layer's bytes in the block, seed l): with a host
     * copy right after the copy, while they are in its cache; with
     * asynchronous ops (CUDA) after the unit's sync, one pass over the
     * landed bytes (the node server's client checksums its stores so).
     * Slots of layers not copied (a failed or cancelled task) are unset. */
    uint64_t *layer_sums;
    /* Optional, scatter only: num_blocks x num_layers checksums as
     * layer_sums holds them, taken when the blocks were stored. Each
     * layer's part of each block is hashed as it is copied out (host
     * copies: in the same pass; asynchronous ops: one pass over the block
     * part before it is enqueued) and a part unlike its checksum fails the
     * task with KVT_ECORRUPT: the layer is never reported landed. */
    const uint64_t *expect_sums;

    /* Owned by the engine. */
    uint32_t next_layer;          /* next unit to hand out (under lock) */
    uint32_t units_running;       /* units handed out, not finished */
    uint32_t layers_ready;        /* layers [0, layers_ready) have landed */
    uint8_t layer_done[KVT_MAX_LAYERS];
    uint8_t layer_recorded[KVT_MAX_LAYERS]; /* async ops: event recorded */
    atomic_int cancel;            /* 1: stop at the next unit */
    kvt_status status;            /* first error seen */
    bool ended;
    kvt_xfer_task *next;          /* queue link */
};

typedef struct kvt_xfer kvt_xfer;

/* workers: 1..64. Each worker owns a buffer of 512 chunks; a unit with more
 * chunks is copied in several ops->copy calls.
 *
 * Task lifetime: the task's memory must stay valid until on_done has
 * returned AND every kvt__xfer_wait_layer / kvt__xfer_cancel call on it has
 * returned. on_done always runs on a worker thread (never inside submit or
 * cancel); a submit that fails never calls it. A layer reported landed by
 * wait_layer stays landed even if the task later fails or is cancelled. */
kvt_status kvt__xfer_create(kvt_xfer **out, uint32_t workers, const kvt_copy_ops *ops);
/* Cancels queued tasks (their on_done runs with KVT_ECANCELED), waits for
 * running units, joins the workers. */
void kvt__xfer_destroy(kvt_xfer *x);
/* Queues a task; its memory stays valid until on_done returns. */
kvt_status kvt__xfer_submit(kvt_xfer *x, kvt_xfer_task *task);
/* Asks a task to stop at its next layer boundary; on_done follows with
 * KVT_ECANCELED (unless it already ended). Safe from any thread while the
 * task's memory is valid. */
void kvt__xfer_cancel(kvt_xfer *x, kvt_xfer_task *task);
/* Waits until layers [0, layer] landed or the task ended, or until
 * deadline_ns. KVT_OK, KVT_ETIMEDOUT, or the task's error status. */
kvt_status kvt__xfer_wait_layer(kvt_xfer *x, kvt_xfer_task *task, uint32_t layer,
                                uint64_t deadline_ns);
uint32_t kvt__xfer_workers(const kvt_xfer *x);
/* Replaces the copy ops; only before the first submit (KVT_ESTATE after).
 * The cache switches to the CUDA backend when device memory is registered. */
kvt_status kvt__xfer_set_ops(kvt_xfer *x, const kvt_copy_ops *ops);
/* Async ops: waits until layer's copies are enqueued and its event recorded
 * (task->layer_events[layer] is then set), or the layer landed, or the task
 * ended, or deadline_ns. KVT_OK, KVT_ETIMEDOUT or the task's error. */
kvt_status kvt__xfer_wait_recorded(kvt_xfer *x, kvt_xfer_task *task, uint32_t layer,
                                   uint64_t deadline_ns);

#endif
