/* cache.h - cache manager internals (the public calls are kvt_cache_* in
 * kvtier.h). One mutex guards the index, the pool's free list and the task
 * table; it is taken once per engine call and once per ended task, never per
 * block. Transfer workers copy without it.
 *
 * Task life: FREE -> PLANNED (lookup / prepare_store: blocks pinned or
 * pending) -> RUNNING (launch: submitted to the transfer engine) -> ENDED
 * (result kept) -> FREE once the result is reported by wait or poll and no
 * thread still waits on it. PLANNED tasks expire after plan_ttl_ms. */
#ifndef KVT_CACHE_CACHE_H
#define KVT_CACHE_CACHE_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "index/index.h"
#include "kvtier.h"
#include "layout/layout.h"
#include "store/pool.h"
#include "store/ssd.h"
#include "util/config.h"
#include "util/err.h"
#include "util/latency.h"
#include "util/sync.h"
#include "xfer/xfer.h"

typedef enum kvt_task_state {
    KVT_TS_FREE = 0,
    KVT_TS_PLANNED,
    KVT_TS_RUNNING,
    KVT_TS_ENDED,
} kvt_task_state;

typedef struct kvt_task kvt_task;
struct kvt_task {
    kvt_task_id id;
    kvt_task_kind kind;
    kvt_task_state state;
    kvt_status result;
    uint32_t first_token, num_tokens, num_blocks;
    uint32_t num_pinned; /* load: entries pinned (num_blocks may shrink below it) */
    uint64_t plan_deadline_ns;
    uint32_t *entries;  /* index entry per block */
    uint8_t **blocks;   /* pool block address per block */
    uint32_t *pages;    /* engine pages, num_blocks * pages_per_block */
    uint32_t *tmp_slots; /* load: CPU slot read into from the SSD, or KVT_POOL_NONE */
    uint32_t num_repair; /* store: leading entries re-filled after their data was lost */
    uint32_t reads_left; /* load: SSD reads not yet landed */
    uint32_t first_bad;  /* load: first block whose read failed (num_blocks if none) */
    kvt_status bad_status;
    bool reading;        /* load: waiting for SSD reads before the transfer */
    bool cancel_asked;
    bool launched;
    uint64_t launch_ns; /* when launched (0: not yet): load/store latency */
    bool external;      /* launched by kvt__cache_ext_launch: another process
                           copies; never on the transfer engine (external.h) */
    bool for_peer;      /* load: a peer node's pull (kvt__cache_lookup_for_peer):
                           not counted in this cache's lookups, hits or loads */
    bool keep_blocks;   /* store cut off (kvt__cache_ext_cut): rolled back, but
                           its blocks stay out of the pool; the caller frees them */
    uint32_t refs;      /* threads inside wait_layer on this task */
    bool reported;      /* result handed out; free when refs reaches 0 */
    kvt_xfer_task xt;
    kvt_task *prev, *next; /* planned list, or ended (unreported) list */
    struct kvt_cache *cache;
};

typedef struct kvt_task_list {
    kvt_task *head, *tail;
} kvt_task_list;

struct kvt_cache {
    pthread_mutex_t mu;
    pthread_cond_t ended_cv; /* broadcast when a task ends */
    kvt_config_values cfg;
    kvt_geometry *geo;
    uint32_t pages_per_block;
    uint64_t block_bytes;
    kvt_pool *pool;
    kvt_index *index;
    kvt_xfer *xfer;
    struct kvt_share *share; /* the capacity shared with other caches (share.h), or NULL */
    kvt_pool_budget *ssd_budget; /* the share's SSD byte budget for the SSD tier, or NULL */
    struct kvt_quota *quota; /* byte quotas by namespace (quota.h), or NULL; set before use */
    bool memory_registered;
    kvt_page_map map;
    /* Engine memory on a CUDA device (docs/gpu.md): the copy backend, and
     * per task slot num_layers CUDA events (created by the workers on first
     * use, reused by later tasks of the slot). NULL for host memory. */
    struct kvt_cuda_backend *cuda;
    void **cuda_events;

    kvt_task *tasks;      /* max_tasks slots */
    uint32_t *free_slots; /* stack of free slot numbers */
    uint32_t num_free;
    uint64_t *slot_gen;   /* per slot: times reused, for unique ids */
    kvt_task_list planned, ended;
    uint32_t in_flight;   /* PLANNED + RUNNING */

    /* Tiers (see tiers.h). Per CPU slot: owner entry, CLOCK bit, I/O
     * context. Per index entry: SSD slot and state. */
    kvt_ssd *ssd;
    uint32_t cpu_blocks;
    uint32_t *cpu_owner;
    uint8_t *cpu_ref;
    uint32_t clock_hand;
    struct kvt_io_ctx *io_ctx;
    uint32_t *ssd_slot;
    uint8_t *ssd_state;
    /* The mover thread: queued SSD writes (entry ids) and reads. */
    pthread_t mover;
    bool mover_running, mover_stop, mover_cv_ready;
    pthread_cond_t mover_cv, flush_cv;
    uint32_t *write_q;
    uint32_t wq_head, wq_len;
    struct kvt_read_op *read_q;
    uint32_t rq_head, rq_len;
    uint32_t ssd_pending; /* SSD writes queued or in flight */
    /* Set (once, logged once) when an SSD write fails with ENOSPC or EIO:
     * the tier takes no more writes, keeps serving what it holds, and the
     * CPU tier evicts cold leaves as it does without an SSD tier. */
    bool ssd_writes_off;
    /* SSD slots whose read failed, freed by the mover thread: only it
     * submits reads, so a slot is never freed under a read being submitted. */
    uint32_t *ssd_free_q;
    uint32_t sfq_len;

    uint32_t ssd_reads_pending; /* SSD reads queued or in flight */

    kvt_cache_stats stats;
    /* Latency histograms (src/metrics): recorded with atomics, outside or
     * inside the mutex alike; lookups always, loads and stores that
     * succeeded, from launch to end. */
    kvt_lat_hist lat_lookup, lat_load, lat_store;
    /* GET /metrics when metrics_port != 0: set and cleared by src/metrics
     * for the layer above that starts it; the cache never touches it. */
    struct kvt_metrics_http *metrics_http;
    pthread_mutex_t err_mu;
    char last_error[KVT_ERRMSG_MAX];
};

/* Requests (token or keyed; ops.c), shared with whatever serves requests
 * on the cache's behalf (the node server), so both validate and hash alike.
 * check: KVT_OK or KVT_EINVAL with a message naming fn, the field and, for
 * keys, the index. tokens: tokens the request covers. hashes: the chained
 * hashes of its first min(blocks, max) full blocks; returns that count. */
kvt_status kvt__request_check(const char *fn, const kvt_request *r, uint32_t block_tokens);
uint32_t kvt__request_tokens(const kvt_cache *c, const kvt_request *r);
uint32_t kvt__request_hashes(const kvt_cache *c, const kvt_request *r, kvt_hash128 *out,
                             uint32_t max);
/* Sets (NULL: clears) the observer of c's index (index.h), under c's
 * lock: the KV events publisher, set from above. */
void kvt__cache_observe_index(kvt_cache *c, kvt_index_observer fn, void *arg);
/* Byte quotas by namespace prefix for c's CPU tier (the caller's; it
 * outlives c). Before c's first store or load, never changed after. */
void kvt__cache_set_quota(kvt_cache *c, struct kvt_quota *q);
/* kvt_cache_create without its metrics endpoint (the layer above starts
 * it: src/api/cache.c, src/server); shared puts the CPU tier in a memfd
 * (cache/external.h). */
kvt_status kvt__cache_create_ex(kvt_cache **out, const kvt_config *cfg, const kvt_geometry *geo,
                                bool shared);
/* kvt_cache_destroy without the endpoint: whoever started it stops it
 * first, since a scrape reads everything this frees. NULL is a no-op. */
void kvt__cache_destroy(kvt_cache *c);

/* kvt_cache_lookup for a peer node's pull (src/cluster): the same match,
 * touch and pinned load task, but nothing counted in c's lookups, hits,
 * SSD hits, loads or lookup latency (those are this node's engines'; the
 * cluster counts what it serves). */
kvt_status kvt__cache_lookup_for_peer(kvt_cache *c, const kvt_request *req, kvt_match *out);

/* Pages of the engine memory registered with c (kvt_cache_register_memory),
 * or 0 before it was: for checks up front by the layers above. */
uint32_t kvt__cache_engine_pages(kvt_cache *c);

/* Copies the thread's last error into the cache's message; returns st. */
kvt_status kvt__cache_fail(const kvt_cache *c, kvt_status st);

#endif
