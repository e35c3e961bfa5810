/* tiers.c - CPU slot ownership, the CLOCK that frees CPU copies of blocks
 * durable on the SSD, write-through to the SSD and read-back from it. See
 * tiers.h for the policy. */
#include "cache/tiers.h"
#include "cache/tasks.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cache/observe.h"
#include "cache/quota.h"
#include "cache/share.h"
#include "util/clock.h"

enum { SSD_NONE = 0, SSD_WRITING = 1, SSD_DURABLE = 2, SSD_LOST = 3, SSD_REPAIRING = 4 };

/* The context of one SSD I/O. One per CPU slot: a slot is the source of at
 * most one write (its entry is pinned meanwhile) or the target of at most
 * one read (it was free when reserved), so contexts never collide. */
typedef struct kvt_io_ctx {
    kvt_cache *cache;
    uint32_t slot;
    uint32_t entry; /* write: the entry being copied */
    kvt_task *task; /* read: the load waiting for it */
    uint32_t block; /* read: the block's index in the task */
} kvt_io_ctx;

typedef struct kvt_read_op {
    kvt_task *task;
    uint32_t block;
} kvt_read_op;

static void finish_reads(kvt_cache *c, kvt_task *t);

/* ------------------------------------------------------------------ */
/* CPU slots                                                          */

static void free_cpu_slot(kvt_cache *c, uint32_t slot)
{
    c->cpu_owner[slot] = KVT_INDEX_NONE;
    c->cpu_ref[slot] = 0;
    kvt__pool_free(c->pool, slot);
}

void kvt__tiers_removed(kvt_cache *c, const uint32_t *ids, const uint32_t *cpu_slots, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        if (cpu_slots[i] != KVT_POOL_NONE) free_cpu_slot(c, cpu_slots[i]);
        if (!c->ssd) continue;
        uint32_t id = ids[i];
        if (c->ssd_slot[id] != KVT_SSD_NONE) kvt__ssd_free(c->ssd, c->ssd_slot[id]);
        c->ssd_slot[id] = KVT_SSD_NONE;
        c->ssd_state[id] = SSD_NONE;
    }
}

/* observe.h: a CPU copy, a durable SSD copy. */
uint8_t kvt__cache_tiers_of(const kvt_cache *c, uint32_t id)
{
    uint8_t t = kvt__index_payload(c->index, id) != KVT_POOL_NONE ? KVT_CACHE_TIER_CPU : 0;
    if (c->ssd_state && c->ssd_state[id] == SSD_DURABLE) t |= KVT_CACHE_TIER_DISK;
    return t;
}

/* One CLOCK sweep step: drops the CPU copy of an unpinned block whose SSD
 * copy is durable and that was not used since the hand last passed. At most
 * two turns, so it ends even when nothing qualifies. */
static uint32_t clock_take(kvt_cache *c)
{
    for (uint32_t step = 0; step < 2 * c->cpu_blocks; step++) {
        uint32_t slot = c->clock_hand;
        c->clock_hand = (c->clock_hand + 1) % c->cpu_blocks;
        uint32_t id = c->cpu_owner[slot];
        if (id == KVT_INDEX_NONE || kvt__index_pins(c->index, id) != 0) continue;
        if (kvt__index_payload(c->index, id) != slot) { /* stale owner: never act on it */
            c->cpu_owner[slot] = KVT_INDEX_NONE;
            continue;
        }
        uint8_t state = c->ssd_state[id];
        if (state != SSD_DURABLE && state != SSD_NONE) continue;
        if (c->cpu_ref[slot]) {
            c->cpu_ref[slot] = 0;
            continue;
        }
        if (state == SSD_DURABLE) { /* the SSD keeps it */
            kvt__index_set_payload(c->index, id, KVT_POOL_NONE);
            kvt__index_notify(c->index, KVT_INDEX_CPU_REMOVED, &id, 1);
            c->stats.cpu_dropped_blocks++;
        } else if (kvt__index_remove_candidate(c->index, id)) {
            /* Its SSD write failed: a cold leaf leaves the cache. */
            c->stats.evicted_blocks++;
        } else {
            continue; /* a middle block: never removed */
        }
        c->cpu_owner[slot] = KVT_INDEX_NONE;
        return slot;
    }
    return KVT_POOL_NONE;
}

/* Removes up to want cold leaves from the index (and every tier). */
static uint32_t evict_leaves(kvt_cache *c, uint32_t want)
{
    uint32_t ids[64], slots[64];
    if (want > 64) want = 64;
    uint32_t n = kvt__index_evict_ids(c->index, want, ids, slots);
    kvt__tiers_removed(c, ids, slots, n);
    c->stats.evicted_blocks += n;
    return n;
}

typedef struct owned_by {
    const kvt_pool *pool;
    uint8_t owner;
} owned_by;

static bool is_owned_by(uint32_t slot, void *arg)
{
    const owned_by *o = arg;
    return slot != KVT_POOL_NONE && kvt__pool_owner(o->pool, slot) == o->owner;
}

#define QUOTA_VISIT 128 /* candidates looked at for the owner's coldest block */
#define QUOTA_SCAN 1024 /* CPU slots swept for an owner's copy the SSD holds */

/* Gives up the CPU copy (in slot) of block id, which the SSD holds. */
static void drop_cpu_copy(kvt_cache *c, uint32_t id, uint32_t slot)
{
    kvt__index_set_payload(c->index, id, KVT_POOL_NONE);
    kvt__index_notify(c->index, KVT_INDEX_CPU_REMOVED, &id, 1);
    free_cpu_slot(c, slot);
    c->stats.cpu_dropped_blocks++;
}

/* An owner's CPU copies that the SSD holds durably are often not among the
 * coldest candidates (only a chain's last block is a candidate; SSD-only
 * blocks fill the cold end): a bounded sweep from the CLOCK hand drops the
 * first unpinned one. */
static bool drop_owner_copy(kvt_cache *c, uint8_t owner)
{
    for (uint32_t step = 0; step < QUOTA_SCAN && step < c->cpu_blocks; step++) {
        uint32_t slot = (c->clock_hand + step) % c->cpu_blocks;
        uint32_t id = c->cpu_owner[slot];
        if (id == KVT_INDEX_NONE || kvt__index_pins(c->index, id) != 0) continue;
        if (kvt__index_payload(c->index, id) != slot || c->ssd_state[id] != SSD_DURABLE ||
            kvt__pool_owner(c->pool, slot) != owner)
            continue;
        drop_cpu_copy(c, id, slot);
        return true;
    }
    return false;
}

uint32_t kvt__tiers_owner_coldest(const kvt_cache *c, uint8_t owner)
{
    owned_by o = {c->pool, owner};
    return kvt__index_coldest_where(c->index, is_owned_by, &o, QUOTA_VISIT);
}

/* tiers.h. Its coldest block among the QUOTA_VISIT coldest candidates,
 * failing that, with an SSD tier, one of its copies the SSD holds
 * (drop_owner_copy). */
bool kvt__tiers_owner_room(kvt_cache *c, uint8_t owner)
{
    uint32_t id = kvt__tiers_owner_coldest(c, owner);
    if (id == KVT_INDEX_NONE) {
        if (!c->ssd || !drop_owner_copy(c, owner)) return false;
    } else if (c->ssd && c->ssd_state[id] == SSD_DURABLE) {
        drop_cpu_copy(c, id, kvt__index_payload(c->index, id));
    } else {
        uint32_t slot = kvt__index_payload(c->index, id);
        if (!kvt__index_remove_candidate(c->index, id)) return false;
        kvt__tiers_removed(c, &id, &slot, 1);
        c->stats.evicted_blocks++;
    }
    c->quota->evicted[owner]++;
    return true;
}

/* Room under the owner's quota for one more block of c: its blocks give
 * up CPU copies until there is (in another geometry, one block may be
 * smaller than c's). False when none is left to give up. */
#define QUOTA_GIVE_UPS 1024 /* copies given up for one block: bounds the time under c->mu */

static bool quota_room(kvt_cache *c, uint8_t owner)
{
    for (uint32_t i = 0; !kvt__pool_quota_room(c->pool, owner); i++)
        if (i == QUOTA_GIVE_UPS ||
            !(c->share ? kvt__share_owner_room(c, owner) : kvt__tiers_owner_room(c, owner)))
            return false;
    return true;
}

#define RECLAIM_TRIES 4 /* another member may take the budget a reclaim freed */

/* CPU slots come from the free list, then from CPU copies the SSD holds
 * too. Without an SSD tier, cold leaves are evicted. With one, a block
 * without a durable SSD copy is never thrown out to make CPU room (the SSD
 * would keep it): the store gets fewer blocks instead.
 * An owner at its quota (quota.h) makes room from its own blocks only,
 * with a share in whichever geometry holds its coldest (its quota counts
 * its bytes in every one). */
uint32_t kvt__tiers_reserve_cpu(kvt_cache *c, uint32_t want, uint32_t *slots, uint8_t owner)
{
    uint32_t got = 0, tries = 0;
    bool from_others = false;
    while (got < want) {
        if (!quota_room(c, owner)) {
            c->quota->limited[owner] += want - got;
            break;
        }
        uint32_t slot = kvt__pool_alloc_for(c->pool, owner, false);
        if (slot == KVT_POOL_NONE && c->share && tries < RECLAIM_TRIES) {
            tries++;
            if (kvt__share_reclaim(c, want - got)) continue;
            tries = RECLAIM_TRIES; /* this cache's own blocks are the coldest */
        }
        if (slot == KVT_POOL_NONE && c->ssd && (slot = clock_take(c)) != KVT_POOL_NONE)
            kvt__pool_set_owner(c->pool, slot, owner); /* its charge moves to the new owner */
        if (slot != KVT_POOL_NONE) {
            slots[got++] = slot;
        } else if (c->share && c->ssd && !from_others) {
            from_others = true; /* nothing of mine to drop: see kvt__share_reclaim_others */
            if (kvt__share_reclaim_others(c, want - got) == 0) break;
        } else if ((c->ssd && !c->ssd_writes_off) || evict_leaves(c, want - got) == 0) {
            break;
        }
    }
    return got;
}

uint32_t kvt__tiers_give_back(kvt_cache *c, uint32_t want)
{
    uint32_t n = kvt__pool_release(c->pool, want);
    while (n < want) {
        uint32_t slot = c->ssd ? clock_take(c) : KVT_POOL_NONE;
        if (slot != KVT_POOL_NONE) {
            free_cpu_slot(c, slot);
        } else if ((c->ssd && !c->ssd_writes_off) || evict_leaves(c, want - n) == 0) {
            break; /* as reserve_cpu: a block the SSD would keep is not thrown out */
        }
        uint32_t r = kvt__pool_release(c->pool, want - n);
        if (r == 0) break; /* the kernel kept the memory: stop, do not evict more */
        n += r;
    }
    return n;
}

uint32_t kvt__tiers_give_back_ssd(kvt_cache *c, uint32_t want)
{
    uint32_t n = c->ssd ? evict_leaves(c, want) : 0;
    if (n) kvt__ssd_flush_frees(c->ssd);
    return n;
}

#define STORE_ROOM_WAIT_MS 2000

bool kvt__tiers_wait_room(kvt_cache *c, uint32_t want)
{
    bool waited = false;
    if (!c->ssd) return false;
    /* clock_take may remove a cold leaf whose SSD write failed, and that
     * leaf may be the prefix the caller is about to extend. */
    uint64_t evicted = c->stats.evicted_blocks;
    if (want > c->cpu_blocks) want = c->cpu_blocks;
    uint64_t deadline = kvt__now_ns() + STORE_ROOM_WAIT_MS * 1000000ull;
    while (c->ssd && kvt__pool_blocks_free(c->pool) < want) {
        uint32_t slot = clock_take(c);
        if (slot != KVT_POOL_NONE) {
            free_cpu_slot(c, slot);
            continue;
        }
        if (c->ssd_pending == 0) break;
        waited = true;
        if (!kvt__cond_wait_until(&c->flush_cv, &c->mu, deadline)) break;
    }
    return waited || c->stats.evicted_blocks != evicted;
}

void kvt__tiers_touch(kvt_cache *c, const uint32_t *ids, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        uint32_t slot = kvt__index_payload(c->index, ids[i]);
        if (slot != KVT_POOL_NONE) c->cpu_ref[slot] = 1;
    }
}

/* ------------------------------------------------------------------ */
/* Write-through                                                      */

void kvt__tiers_committed(kvt_cache *c, const uint32_t *ids, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        uint32_t slot = kvt__index_payload(c->index, ids[i]);
        if (slot == KVT_POOL_NONE) continue; /* kept its SSD copy (see repair_end) */
        c->cpu_owner[slot] = ids[i];
        c->cpu_ref[slot] = 1;
        /* Only new data is written: a block already on the SSD stays there. */
        if (!c->ssd || c->ssd_writes_off || c->ssd_state[ids[i]] != SSD_NONE) continue;
        /* The pin keeps the entry and its CPU slot until the copy is done.
         * Cannot fail: one write pin on top of at most max_tasks (<= 1048576)
         * task pins stays below KVT_INDEX_MAX_PINS (index.h). */
        (void)kvt__index_pin(c->index, &ids[i], 1);
        c->ssd_state[ids[i]] = SSD_WRITING;
        c->write_q[(c->wq_head + c->wq_len++) % c->cpu_blocks] = ids[i];
        c->ssd_pending++;
    }
    if (c->ssd && n) pthread_cond_signal(&c->mover_cv);
}

/* The one line a cache writes when its SSD tier stops taking writes. A
 * single function, so a logging layer can take it over. */
static void tiers_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void tiers_log(const char *fmt, ...)
{
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "kvtier: %s\n", line);
}

/* A write failed for a reason that will not go away by itself (a full or
 * failing filesystem): stop writing, say so once (mutex held). */
static void stop_ssd_writes(kvt_cache *c, kvt_status st)
{
    if (c->ssd_writes_off) return;
    c->ssd_writes_off = true;
    char why[256];
    if (kvt__ssd_first_failure(c->ssd, why, sizeof why) == KVT_OK)
        snprintf(why, sizeof why, "a write failed: %s", kvt_strerror(st));
    tiers_log("SSD tier: %s; it takes no more writes for the life of this cache: new blocks "
              "stay in the CPU tier only, blocks already on the SSD are still served", why);
}

static void write_done(void *arg, kvt_status st)
{
    kvt_io_ctx *x = arg;
    kvt_cache *c = x->cache;
    pthread_mutex_lock(&c->mu);
    uint32_t id = x->entry;
    if (st == KVT_OK) {
        c->ssd_state[id] = SSD_DURABLE;
        kvt__index_notify(c->index, KVT_INDEX_DISK_STORED, &id, 1);
        c->stats.ssd_written_blocks++;
    } else {
        kvt__ssd_free(c->ssd, c->ssd_slot[id]);
        c->ssd_slot[id] = KVT_SSD_NONE;
        c->ssd_state[id] = SSD_NONE;
        c->stats.ssd_write_errors++;
        if (st == KVT_ENOSPC || st == KVT_EIO) stop_ssd_writes(c, st);
    }
    kvt__index_unpin(c->index, &id, 1);
    --c->ssd_pending;
    pthread_cond_broadcast(&c->flush_cv); /* flush and wait_room re-check */
    pthread_mutex_unlock(&c->mu);
}

#define RECLAIM_WAIT_MS 2000

/* Leaves evicted at once when the SSD tier is full: a freed slot is usable
 * only after a commit round makes its DEL durable, so freeing a few per
 * round keeps a steady stream of writes from waiting on every block. */
static uint32_t reclaim_batch(const kvt_cache *c)
{
    uint32_t n = kvt__ssd_blocks_total(c->ssd) / 64;
    return n < 1 ? 1 : n > 32 ? 32 : n;
}

/* Picks an SSD slot for a write (mutex held), evicting cold leaves from the
 * SSD tier when it is full and waiting, without the mutex (the store's
 * rounds call back into the cache), for their slots to come back.
 * KVT_SSD_NONE when everything left is pinned or no freed slot comes back
 * in time (the journal cannot be written). */
#define SHARE_POLL_NS 1000000ull /* waiting on another tier's commit round */

/* A tier sharing its SSD budget (cache/share.h) first takes disk from the
 * other geometries: true to try the allocation again (after waiting for
 * another tier's frees, up to *deadline), false to evict its own. */
static bool ssd_from_share(kvt_cache *c, uint64_t *deadline)
{
    bool pending = false;
    if (!c->ssd_budget) return false;
    if (kvt__share_ssd_reclaim(c, reclaim_batch(c), &pending) > 0) return true;
    if (!pending) return false;
    if (*deadline == 0) *deadline = kvt__deadline_ns(RECLAIM_WAIT_MS);
    if (kvt__now_ns() >= *deadline) return false;
    struct timespec ts = kvt__ns_to_timespec(SHARE_POLL_NS);
    pthread_mutex_unlock(&c->mu);
    nanosleep(&ts, NULL);
    pthread_mutex_lock(&c->mu);
    return true;
}

static uint32_t ssd_slot_for(kvt_cache *c)
{
    uint64_t share_deadline = 0;
    for (;;) {
        uint32_t slot = kvt__ssd_alloc(c->ssd);
        if (slot != KVT_SSD_NONE) return slot;
        if (kvt__ssd_blocks_free(c->ssd) == 0) {
            if (ssd_from_share(c, &share_deadline)) continue;
            if (evict_leaves(c, reclaim_batch(c)) == 0) return KVT_SSD_NONE;
            continue; /* the evicted leaves may have had no SSD copy */
        }
        pthread_mutex_unlock(&c->mu);
        bool back = kvt__ssd_wait_reclaim(c->ssd, kvt__deadline_ns(RECLAIM_WAIT_MS));
        pthread_mutex_lock(&c->mu);
        if (!back) return KVT_SSD_NONE;
    }
}

/* Takes one queued write (mutex held); fills *x for submission outside the
 * lock. false when the write was dropped (no SSD room). */
static bool take_write(kvt_cache *c, kvt_io_ctx **out, kvt_hash128 *key, kvt_hash128 *parent,
                       bool *has_parent, uint32_t *ssd_slot)
{
    uint32_t id = c->write_q[c->wq_head];
    c->wq_head = (c->wq_head + 1) % c->cpu_blocks;
    c->wq_len--;
    uint32_t slot = c->ssd_writes_off ? KVT_SSD_NONE : ssd_slot_for(c);
    if (slot == KVT_SSD_NONE) {
        c->ssd_state[id] = SSD_NONE;
        c->stats.ssd_write_errors += !c->ssd_writes_off; /* dropped, not failed, once off */
        kvt__index_unpin(c->index, &id, 1);
        --c->ssd_pending;
        pthread_cond_broadcast(&c->flush_cv);
        return false;
    }
    c->ssd_slot[id] = slot;
    uint32_t cpu = kvt__index_payload(c->index, id);
    kvt_io_ctx *x = &c->io_ctx[cpu];
    x->entry = id;
    *key = kvt__index_key(c->index, id);
    uint32_t p = kvt__index_parent(c->index, id);
    *has_parent = p != KVT_INDEX_NONE;
    if (*has_parent) *parent = kvt__index_key(c->index, p);
    *ssd_slot = slot;
    *out = x;
    return true;
}

/* ------------------------------------------------------------------ */
/* Read-back                                                          */

uint32_t kvt__tiers_plan_load(kvt_cache *c, kvt_task *t)
{
    uint32_t i = 0;
    t->reads_left = 0;
    for (; i < t->num_blocks; i++) {
        uint32_t id = t->entries[i];
        if (kvt__index_payload(c->index, id) != KVT_POOL_NONE) continue;
        /* No CPU copy: it must be durable on the SSD, or the load ends here. */
        if (!c->ssd || c->ssd_state[id] != SSD_DURABLE) break;
        uint32_t slot;
        if (kvt__tiers_reserve_cpu(c, 1, &slot, kvt__index_tag(c->index, id)) == 0) break;
        t->tmp_slots[i] = slot;
        t->reads_left++;
    }
    return i;
}

uint32_t kvt__tiers_loadable(const kvt_cache *c, const uint32_t *ids, uint32_t n)
{
    uint32_t i = 0;
    while (i < n && (kvt__index_payload(c->index, ids[i]) != KVT_POOL_NONE ||
                     (c->ssd && c->ssd_state[ids[i]] == SSD_DURABLE)))
        i++;
    return i;
}

/* Pushes the task's reads to the mover. */
static void queue_reads(kvt_cache *c, kvt_task *t)
{
    for (uint32_t i = 0; i < t->num_blocks; i++) {
        if (t->tmp_slots[i] == KVT_POOL_NONE) continue;
        kvt_read_op op = {t, i};
        c->read_q[(c->rq_head + c->rq_len++) % c->cpu_blocks] = op;
        c->ssd_reads_pending++;
    }
    pthread_cond_signal(&c->mover_cv);
}

kvt_status kvt__tiers_start_load(kvt_cache *c, kvt_task *t)
{
    if (t->reads_left == 0) return kvt__xfer_submit(c->xfer, &t->xt);
    t->reading = true;
    queue_reads(c, t);
    return KVT_OK;
}

void kvt__tiers_load_ended(kvt_cache *c, kvt_task *t)
{
    /* num_pinned, not num_blocks: a load cut short still holds its slots. */
    for (uint32_t i = 0; i < t->num_pinned; i++) {
        uint32_t slot = t->tmp_slots[i];
        if (slot != KVT_POOL_NONE && c->cpu_owner[slot] == KVT_INDEX_NONE) free_cpu_slot(c, slot);
        t->tmp_slots[i] = KVT_POOL_NONE;
    }
}

/* A read landed: the block's CPU copy is back (promote the slot to the
 * entry unless another load already did), or the block is lost. */
static void read_done(void *arg, kvt_status st)
{
    kvt_io_ctx *x = arg;
    kvt_cache *c = x->cache;
    pthread_mutex_lock(&c->mu);
    kvt_task *t = x->task;
    uint32_t id = t->entries[x->block];
    c->ssd_reads_pending--;
    if (st == KVT_OK) {
        c->stats.ssd_read_blocks++;
        if (kvt__index_payload(c->index, id) == KVT_POOL_NONE) {
            kvt__index_set_payload(c->index, id, x->slot);
            kvt__index_notify(c->index, KVT_INDEX_CPU_STORED, &id, 1);
            c->cpu_owner[x->slot] = id;
            c->cpu_ref[x->slot] = 1;
            /* A concurrent load's read of it failed first: this copy is good. */
            if (c->ssd_state[id] == SSD_LOST) c->ssd_state[id] = SSD_NONE;
        }
    } else {
        /* Never handed to the engine: the load stops before this block, and
         * the block is forgotten until a store fills it again. */
        if (st == KVT_ECORRUPT) c->stats.corrupt_blocks++;
        else c->stats.ssd_read_errors++;
        if (c->ssd_state[id] == SSD_DURABLE) {
            /* Another load may be submitting a read of this slot right now:
             * the mover frees it between batches (see drain_frees). */
            c->ssd_free_q[c->sfq_len++] = c->ssd_slot[id];
            pthread_cond_signal(&c->mover_cv);
            c->ssd_slot[id] = KVT_SSD_NONE;
            /* Another load may have brought a good copy back meanwhile: then
             * that copy stays and only the SSD's is gone. */
            bool in_cpu = kvt__index_payload(c->index, id) != KVT_POOL_NONE;
            c->ssd_state[id] = in_cpu ? SSD_NONE : SSD_LOST;
            kvt__index_notify(c->index, KVT_INDEX_DISK_REMOVED, &id, 1);
        }
        if (x->block < t->first_bad) {
            t->first_bad = x->block;
            t->bad_status = kvt__task_status(st); /* EAGAIN, say: never "try again" */
        }
    }
    if (--t->reads_left == 0) finish_reads(c, t);
    pthread_mutex_unlock(&c->mu);
}

/* ------------------------------------------------------------------ */
/* The mover thread                                                   */

typedef struct io_batch {
    kvt_io_ctx *ctx[32];
    kvt_hash128 key[32], parent[32];
    bool has_parent[32], is_write[32];
    uint32_t ssd_slot[32];
    uint8_t *buf[32];
    uint32_t n;
} io_batch;

/* Frees the SSD slots of failed reads (mutex held, on the mover thread). */
static void drain_frees(kvt_cache *c)
{
    while (c->sfq_len > 0) kvt__ssd_free(c->ssd, c->ssd_free_q[--c->sfq_len]);
}

static void take_batch(kvt_cache *c, io_batch *b)
{
    drain_frees(c);
    b->n = 0;
    while (b->n < 32 && c->wq_len > 0) {
        uint32_t i = b->n;
        if (!take_write(c, &b->ctx[i], &b->key[i], &b->parent[i], &b->has_parent[i], &b->ssd_slot[i]))
            continue;
        b->buf[i] = kvt__pool_block(c->pool, b->ctx[i]->slot);
        b->is_write[i] = true;
        b->n++;
    }
    while (b->n < 32 && c->rq_len > 0) {
        kvt_read_op op = c->read_q[c->rq_head];
        c->rq_head = (c->rq_head + 1) % c->cpu_blocks;
        c->rq_len--;
        uint32_t i = b->n++, slot = op.task->tmp_slots[op.block], id = op.task->entries[op.block];
        kvt_io_ctx *x = &c->io_ctx[slot];
        x->task = op.task;
        x->block = op.block;
        b->ctx[i] = x;
        b->key[i] = kvt__index_key(c->index, id);
        b->ssd_slot[i] = c->ssd_slot[id];
        b->buf[i] = kvt__pool_block(c->pool, slot);
        b->is_write[i] = false;
    }
}

static kvt_status submit_one(kvt_cache *c, io_batch *b, uint32_t i)
{
    if (b->is_write[i])
        return kvt__ssd_write(c->ssd, b->ssd_slot[i], b->buf[i], b->key[i], b->parent[i],
                              b->has_parent[i], write_done, b->ctx[i]);
    return kvt__ssd_read(c->ssd, b->ssd_slot[i], b->buf[i], b->key[i], read_done, b->ctx[i]);
}

static void submit_batch(kvt_cache *c, io_batch *b)
{
    for (uint32_t i = 0; i < b->n; i++) {
        kvt_status st = submit_one(c, b, i);
        /* The store's request slots are all in flight: wait for some to
         * finish (at most ~2 s) rather than fail the copy. */
        for (int tries = 0; st == KVT_EAGAIN && tries < 2000; tries++) {
            struct timespec ts = {0, 1000000};
            nanosleep(&ts, NULL);
            st = submit_one(c, b, i);
        }
        if (st == KVT_OK) continue;
        /* Not submitted: complete it here as failed, as the store would. */
        (b->is_write[i] ? write_done : read_done)(b->ctx[i], st);
    }
}

static void *mover_main(void *arg)
{
    kvt_cache *c = arg;
    io_batch *b = calloc(1, sizeof *b);
    pthread_mutex_lock(&c->mu);
    while (b && !c->mover_stop) {
        if (c->wq_len == 0 && c->rq_len == 0) {
            drain_frees(c);
            /* Bounded sleep: a lost wakeup costs at most 100 ms, never a hang. */
            kvt__cond_wait_until(&c->mover_cv, &c->mu, kvt__now_ns() + 100000000ull);
            continue;
        }
        take_batch(c, b);
        pthread_mutex_unlock(&c->mu);
        submit_batch(c, b);
        pthread_mutex_lock(&c->mu);
    }
    pthread_mutex_unlock(&c->mu);
    free(b);
    return NULL;
}

/* ------------------------------------------------------------------ */
/* Open, recover, close                                               */

static void recovered(void *arg, uint32_t slot, kvt_hash128 key, kvt_hash128 parent,
                      bool has_parent)
{
    kvt_cache *c = arg;
    uint32_t pid = KVT_INDEX_NONE, id;
    kvt_index_stop stop;
    if (has_parent && (kvt__index_probe(c->index, &parent, 1, &pid, &stop) != 1)) {
        kvt__ssd_free(c->ssd, slot); /* an orphan can never be matched */
        return;
    }
    if (kvt__index_insert(c->index, pid, key, KVT_POOL_NONE, &id) != KVT_OK) {
        kvt__ssd_free(c->ssd, slot);
        return;
    }
    c->ssd_slot[id] = slot;
    c->ssd_state[id] = SSD_DURABLE; /* before the commit: an observer sees it durable */
    kvt__index_commit(c->index, &id, 1);
    c->stats.recovered_blocks++;
}

static kvt_status alloc_tier_arrays(kvt_cache *c, uint32_t index_cap)
{
    c->cpu_blocks = kvt__pool_blocks_total(c->pool);
    c->cpu_owner = malloc((size_t)c->cpu_blocks * sizeof *c->cpu_owner);
    c->cpu_ref = calloc(c->cpu_blocks, 1);
    c->io_ctx = calloc(c->cpu_blocks, sizeof *c->io_ctx);
    if (!c->cpu_owner || !c->cpu_ref || !c->io_ctx) goto nomem;
    for (uint32_t i = 0; i < c->cpu_blocks; i++) {
        c->cpu_owner[i] = KVT_INDEX_NONE;
        c->io_ctx[i].cache = c;
        c->io_ctx[i].slot = i;
    }
    if (!c->ssd) return KVT_OK;
    c->ssd_slot = malloc((size_t)index_cap * sizeof *c->ssd_slot);
    c->ssd_state = calloc(index_cap, 1);
    c->write_q = malloc((size_t)c->cpu_blocks * sizeof *c->write_q);
    c->read_q = malloc((size_t)c->cpu_blocks * sizeof *c->read_q);
    c->ssd_free_q = malloc((size_t)c->cpu_blocks * sizeof *c->ssd_free_q);
    if (!c->ssd_slot || !c->ssd_state || !c->write_q || !c->read_q || !c->ssd_free_q) goto nomem;
    for (uint32_t i = 0; i < index_cap; i++) c->ssd_slot[i] = KVT_SSD_NONE;
    return KVT_OK;
nomem:
    return kvt__fail(KVT_ENOMEM, "kvt_cache_create: no memory for the tier tables");
}

static kvt_status open_ssd(kvt_cache *c)
{
    char describe[160];
    snprintf(describe, sizeof describe, "%u layers, %llu bytes/token, %u tokens/block",
             c->geo->num_layers, (unsigned long long)kvt__geo_bytes_per_token(c->geo),
             c->cfg.block_tokens);
    kvt_geometry_info info;
    kvt_status st = kvt_geometry_info_get(c->geo, &info);
    if (st) return st;
    static const char *io_names[] = {"auto", "uring", "threads"};
    bool budgeted = kvt__pool_budgeted(c->pool);
    kvt_ssd_params p = {
        .dirs = c->cfg.ssd_dirs,
        .capacity_bytes = c->cfg.ssd_capacity,
        .block_bytes = c->block_bytes,
        .digest = kvt__hash64(&c->cfg.block_tokens, sizeof c->cfg.block_tokens, info.digest),
        .describe = describe,
        .fresh = c->cfg.ssd_fresh,
        .io = io_names[c->cfg.io < 3 ? c->cfg.io : 0],
        .queue_depth = c->cfg.ssd_queue_depth,
        /* A budgeted pool's memory is not registered with io_uring: fixed
         * buffers pin the pages they cover (all of a sparse memfd, the whole
         * cpu_capacity per geometry), and a slot punched out and backed
         * again would have the device read and write the old pinned pages
         * (test_shared_ssd read back blocks that failed their checksum). */
        .register_base = budgeted ? NULL : kvt__pool_block(c->pool, 0),
        .register_len = budgeted ? 0 : (uint64_t)kvt__pool_blocks_total(c->pool) *
                                           kvt__pool_stride(c->pool),
        .budget = c->ssd_budget,
    };
    return kvt__ssd_open(&c->ssd, &p);
}

kvt_status kvt__tiers_open(kvt_cache *c)
{
    kvt_status st = KVT_OK;
    if (c->cfg.ssd_dirs[0] != '\0') st = open_ssd(c);
    uint32_t cpu = kvt__pool_blocks_total(c->pool);
    uint32_t ssd = c->ssd ? kvt__ssd_blocks_total(c->ssd) : 0;
    /* Every block is on the SSD or on its way there, plus the CPU tier's. */
    if (!st) st = kvt__index_create(&c->index, cpu + ssd, (kvt_evict_policy)c->cfg.eviction);
    if (!st) st = alloc_tier_arrays(c, cpu + ssd);
    if (st || !c->ssd) return st;
    kvt__ssd_recover(c->ssd, recovered, c);
    if (kvt__cond_init(&c->mover_cv) || kvt__cond_init(&c->flush_cv))
        return kvt__fail(KVT_ESYS, "kvt_cache_create: cannot create the SSD tier's condvars");
    c->mover_cv_ready = true;
    if (pthread_create(&c->mover, NULL, mover_main, c))
        return kvt__fail(KVT_ESYS, "kvt_cache_create: cannot start the SSD mover thread");
    c->mover_running = true;
    return KVT_OK;
}

/* Fails reads still queued (their tasks end without data). */
static void drop_queued(kvt_cache *c)
{
    drain_frees(c);
    while (c->rq_len > 0) {
        kvt_read_op op = c->read_q[c->rq_head];
        c->rq_head = (c->rq_head + 1) % c->cpu_blocks;
        c->rq_len--;
        kvt_task *t = op.task;
        c->ssd_reads_pending--;
        if (op.block < t->first_bad) {
            t->first_bad = op.block;
            t->bad_status = KVT_ECANCELED;
        }
        if (--t->reads_left == 0) finish_reads(c, t);
    }
    while (c->wq_len > 0) {
        uint32_t id = c->write_q[c->wq_head];
        c->wq_head = (c->wq_head + 1) % c->cpu_blocks;
        c->wq_len--;
        c->ssd_state[id] = SSD_NONE;
        kvt__index_unpin(c->index, &id, 1);
        c->ssd_pending--;
    }
}

void kvt__tiers_stop(kvt_cache *c)
{
    if (c->mover_running) {
        pthread_mutex_lock(&c->mu);
        c->mover_stop = true;
        pthread_cond_signal(&c->mover_cv);
        pthread_mutex_unlock(&c->mu);
        pthread_join(c->mover, NULL);
        c->mover_running = false;
        pthread_mutex_lock(&c->mu);
        drop_queued(c);
        pthread_mutex_unlock(&c->mu);
    }
    /* From here no block is queued for the SSD (tiers_committed sees no
     * store) and nothing calls into it; closing it runs the callbacks of
     * in-flight I/O, which take c->mu and find c->ssd gone. */
    pthread_mutex_lock(&c->mu);
    kvt_ssd *ssd = c->ssd;
    c->ssd = NULL;
    pthread_mutex_unlock(&c->mu);
    kvt__ssd_close(ssd);
}

void kvt__tiers_free(kvt_cache *c)
{
    if (c->mover_cv_ready) {
        pthread_cond_destroy(&c->mover_cv);
        pthread_cond_destroy(&c->flush_cv);
    }
    free(c->cpu_owner);
    free(c->cpu_ref);
    free(c->io_ctx);
    free(c->ssd_slot);
    free(c->ssd_state);
    free(c->write_q);
    free(c->read_q);
    free(c->ssd_free_q);
}

kvt_status kvt__tiers_flush(kvt_cache *c, uint64_t deadline_ns)
{
    while (c->ssd && c->ssd_pending > 0)
        if (!kvt__cond_wait_until(&c->flush_cv, &c->mu, deadline_ns)) break;
    if (c->ssd && c->ssd_pending > 0)
        return kvt__fail(KVT_ETIMEDOUT, "kvt_cache_flush: %u SSD writes still pending at the "
                         "deadline", c->ssd_pending);
    return KVT_OK;
}

/* All reads of a load landed (or failed): start the transfer of the blocks
 * before the first failure, or end the task. Defined here, used by
 * read_done; the ending itself is the cache's (ops.c). */
void kvt__cache_end_task(kvt_cache *c, kvt_task *t, kvt_status st);

static void finish_reads(kvt_cache *c, kvt_task *t)
{
    t->reading = false;
    pthread_cond_broadcast(&c->ended_cv); /* wait_layer callers re-check the stage */
    if (t->cancel_asked) {
        kvt__cache_end_task(c, t, KVT_ECANCELED);
        return;
    }
    if (t->first_bad < t->num_blocks) {
        /* A shorter load: blocks from the first bad one on are not moved. */
        t->num_blocks = t->xt.num_blocks = t->first_bad;
        t->num_tokens = t->num_blocks * c->cfg.block_tokens;
    }
    if (t->num_blocks == 0) {
        kvt__cache_end_task(c, t, t->bad_status);
        return;
    }
    if (t->external) return; /* another process copies (cache/external.h) */
    kvt_status st = kvt__xfer_submit(c->xfer, &t->xt);
    if (st) kvt__cache_end_task(c, t, st);
}

/* ------------------------------------------------------------------ */
/* Lost blocks                                                        */

uint32_t kvt__tiers_first_lost(kvt_cache *c, const uint32_t *ids, uint32_t n, bool *busy)
{
    *busy = false;
    if (!c->ssd) return n;
    for (uint32_t i = 0; i < n; i++) {
        uint8_t s = c->ssd_state[ids[i]];
        if (s == SSD_REPAIRING) *busy = true;
        if (s == SSD_LOST || s == SSD_REPAIRING) return i;
    }
    return n;
}

/* Blocks between the first lost one and the end of the cached prefix are
 * gathered again (a store moves a contiguous range), but only the lost ones
 * take the new data; the others keep theirs, which a concurrent load may be
 * reading. */
void kvt__tiers_repair_begin(kvt_cache *c, const uint32_t *ids, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        if (c->ssd_state[ids[i]] == SSD_LOST) c->ssd_state[ids[i]] = SSD_REPAIRING;
}

void kvt__tiers_repair_end(kvt_cache *c, kvt_task *t, bool ok)
{
    for (uint32_t i = 0; i < t->num_repair; i++) {
        uint32_t id = t->entries[i], slot = t->tmp_slots[i];
        t->tmp_slots[i] = KVT_POOL_NONE;
        if (c->ssd_state[id] != SSD_REPAIRING) {
            if (!t->keep_blocks) kvt__pool_free(c->pool, slot);
            continue;
        }
        if (!ok) {
            c->ssd_state[id] = SSD_LOST;
            if (!t->keep_blocks) kvt__pool_free(c->pool, slot); /* else the cutter's */
            continue;
        }
        c->ssd_state[id] = SSD_NONE;
        if (kvt__index_payload(c->index, id) != KVT_POOL_NONE) {
            kvt__pool_free(c->pool, slot); /* it has a copy already: keep that one */
            continue;
        }
        kvt__index_set_payload(c->index, id, slot);
        kvt__index_notify(c->index, KVT_INDEX_CPU_STORED, &id, 1);
    }
}
