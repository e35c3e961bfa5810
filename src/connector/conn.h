/* conn.h - the multi-rank connector's state. Each rank keeps what it queued
 * since its last step (pending lookups and stores), the tasks it launched on
 * the leader's word (running), its own ended tasks not yet reported (done)
 * and the events for the engine. The sync leader additionally tracks every
 * launched operation until all ranks reported its result (awaiting). */
#ifndef KVT_CONNECTOR_CONN_H
#define KVT_CONNECTOR_CONN_H

#include <pthread.h>
#include <stdbool.h>
#include "connector/wire.h"
#include "group/group.h"
#include "util/vec.h"

/* Layer-completion counters the leader hands out round-robin (engines keep
 * that many event slots, as SGLang's layer_done_counter does). */
#define KVT_CONN_COUNTERS 4

typedef struct pend_lookup {
    uint64_t rid, digest;
    kvt_task_id task; /* 0: nothing matched locally */
    uint32_t local_tokens;
    uint32_t *tokens, num_tokens; /* a copy of the request, to truncate */
    uint8_t *ns;
    uint32_t ns_len;
    uint32_t *pages, num_pages;
    bool load, layerwise, decided;
} pend_lookup;

typedef struct pend_store {
    uint64_t rid, digest;
    kvt_task_id task; /* 0: this rank already holds every block */
    uint32_t num_tokens;
    uint32_t *pages, num_pages;
    bool decided;
} pend_store;

typedef struct running_task {
    uint64_t rid;
    uint32_t kind;
    kvt_task_id task;
} running_task;

typedef struct awaiting {
    uint64_t rid;
    uint32_t kind, reported, rank, tokens;
    uint32_t counter; /* loads: the layer counter it holds until its result */
    int32_t status;
    uint64_t mask[KVT_NET_MAX_RANKS / 64];
} awaiting;

#define VEC(T) struct { T *p; uint32_t n, cap; }

typedef struct leader_state {
    VEC(awaiting) aw;
    uint64_t generation;
    kvt_buf down;
} leader_state;

struct kvt_conn {
    kvt_group *g;
    kvt_cache *cache;
    pthread_mutex_t mu; /* guards everything below against kvt_conn_wait_layer */
    VEC(pend_lookup) lk;
    VEC(pend_store) st;
    VEC(running_task) run;
    VEC(kvt_result_rec) done;
    VEC(kvt_conn_event) ev;
    bool reset_req, aborted;
    kvt_buf up;
    leader_state *L; /* sync leader only */
};

/* Grows a VEC to hold need elements: KVT_OK or KVT_ENOMEM (util/vec.h). */
#define VEC_RESERVE(v, need) kvt__grow32((void **)&(v).p, &(v).cap, (need), sizeof *(v).p, "kvt_conn")

/* step.c */
kvt_status kvt__conn_poll_locked(kvt_conn *c, uint32_t *ended);
/* Cancels every queued and running task and waits (bounded) until none
 * touches the engine's pages: KVT_ETIMEDOUT if some still do. */
kvt_status kvt__conn_cancel_all(kvt_conn *c);
kvt_status kvt__conn_push_event(kvt_conn *c, const kvt_conn_event *e);
kvt_status kvt__conn_push_done(kvt_conn *c, uint64_t rid, uint32_t kind, kvt_status st,
                               uint32_t tokens);
void kvt__pend_lookup_free(pend_lookup *p);
void kvt__pend_store_free(pend_store *p);

/* leader.c: turns every rank's UP into the one DOWN. */
kvt_status kvt__conn_decide(kvt_conn *c, const kvt_up_view *ups, kvt_buf *down);
void kvt__leader_clear(leader_state *L);

#endif
