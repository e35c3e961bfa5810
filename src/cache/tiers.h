/* tiers.h - the tiers under the index: the CPU pool and, when configured,
 * the SSD store.
 *
 * The tiers are inclusive and the SSD is written through: a store completes
 * for the engine once its blocks are in the CPU tier; a mover thread then
 * copies each block to the SSD in the background. A block whose SSD copy is
 * durable can leave the CPU tier for free (its CPU slot is simply reused,
 * chosen by a CLOCK sweep), so making room in the CPU tier never waits for a
 * write-back; a block that is on the SSD only is read back into a CPU slot
 * when a load needs it, inside the load task. Eviction from the SSD tier
 * removes the block from the index (leaves only, as always). Why inclusive:
 * every block that ever completed a store has (or is getting) a durable copy,
 * so a restart finds it, and the CPU tier is a cache of the SSD rather than a
 * separate level that must be drained into it.
 *
 * All functions are called with the cache mutex held unless they say
 * otherwise. */
#ifndef KVT_CACHE_TIERS_H
#define KVT_CACHE_TIERS_H

#include "cache/cache.h"

/* Opens the SSD store when ssd_dirs is set, rebuilds the index from its
 * journal and starts the mover thread. Called from create, no lock held. */
kvt_status kvt__tiers_open(kvt_cache *c);
/* Destroying a cache: tiers_stop stops the mover (queued writes are
 * dropped, queued reads fail) and closes the SSD store once its in-flight
 * I/O has called back; the transfer engine is destroyed next (its last
 * callbacks still use the tier tables); then tiers_free. No lock held. */
void kvt__tiers_stop(kvt_cache *c);
void kvt__tiers_free(kvt_cache *c);

/* Up to want free CPU slots into slots: the free list first, then CPU copies
 * of blocks that are durable on the SSD (CLOCK), then whole cold leaves
 * (with an SSD tier only once it stopped taking writes). The slots are
 * charged to owner (0: none); an owner at its quota frees its own coldest
 * block first, or gets no more slots. */
uint32_t kvt__tiers_reserve_cpu(kvt_cache *c, uint32_t want, uint32_t *slots, uint8_t owner);
/* A budgeted pool (cache/share.h) gives up to want slots' memory back to
 * the share: free backed slots first, then CPU copies the SSD keeps, then
 * (as reserve_cpu) cold leaves. Returns slots given back. */
uint32_t kvt__tiers_give_back(kvt_cache *c, uint32_t want);
/* The SSD side of the same (c->mu held): evicts up to want of c's coldest
 * leaves and asks the store to journal their frees now; their slots come
 * back free after that round, for kvt__ssd_release. Returns leaves evicted. */
uint32_t kvt__tiers_give_back_ssd(kvt_cache *c, uint32_t want);
/* Room for one more block of an owner at its quota (quota.h), c->mu held:
 * one of its blocks in c gives up its CPU copy (kept on the SSD when
 * durable there, else evicted). False when c holds none it can give up. */
bool kvt__tiers_owner_room(kvt_cache *c, uint8_t owner);
/* The owner's coldest block among c's coldest eviction candidates (a
 * bounded look), KVT_INDEX_NONE when none; c->mu held. */
uint32_t kvt__tiers_owner_coldest(const kvt_cache *c, uint8_t owner);
/* With an SSD tier: when fewer than want CPU slots are free and SSD writes
 * are in flight, waits (boundedly: STORE_ROOM_WAIT_MS) for them to land and
 * frees the CPU copies they make droppable, so a burst of stores is slowed
 * down rather than evicting what the SSD would have kept. want is capped
 * at the CPU tier's size. */
/* true if it released the lock or removed entries from the index: the
 * caller's view of the index is stale then and must be taken again. */
bool kvt__tiers_wait_room(kvt_cache *c, uint32_t want);
/* A store's blocks became READY in their CPU slots: record the owners and
 * queue their SSD copies. */
void kvt__tiers_committed(kvt_cache *c, const uint32_t *ids, uint32_t n);
/* Recently used: the CLOCK keeps these CPU copies a round longer. */
void kvt__tiers_touch(kvt_cache *c, const uint32_t *ids, uint32_t n);
/* Entries left the index: release their SSD slots and CPU ownership. */
void kvt__tiers_removed(kvt_cache *c, const uint32_t *ids, const uint32_t *cpu_slots, uint32_t n);

/* Prepares a planned load: blocks without a CPU copy get a CPU slot to read
 * into. Returns how many leading blocks can be loaded (<= t->num_blocks). */
uint32_t kvt__tiers_plan_load(kvt_cache *c, kvt_task *t);
/* How many leading blocks of ids[0..n) a load could take now, reserving
 * nothing: those with a CPU copy or durable on the SSD (kvt_cache_peek). */
uint32_t kvt__tiers_loadable(const kvt_cache *c, const uint32_t *ids, uint32_t n);
/* Starts a launched load: SSD reads first when any are needed (the transfer
 * starts when they land), else the transfer at once. */
kvt_status kvt__tiers_start_load(kvt_cache *c, kvt_task *t);
/* A load ended: returns CPU slots the task held for itself. */
void kvt__tiers_load_ended(kvt_cache *c, kvt_task *t);

/* Lost blocks (a read found them corrupt): the index keeps their entries,
 * loads stop before them, and the next store of their prefix re-fills them.
 * first_lost: the first of ids[0..n) that is lost (n if none); *busy when
 * another store is re-filling it already. */
uint32_t kvt__tiers_first_lost(kvt_cache *c, const uint32_t *ids, uint32_t n, bool *busy);
void kvt__tiers_repair_begin(kvt_cache *c, const uint32_t *ids, uint32_t n);
/* The store re-filling t's first num_repair entries ended: ok gives them
 * their new CPU slots, else they stay lost and the slots are freed. */
void kvt__tiers_repair_end(kvt_cache *c, kvt_task *t, bool ok);

/* Waits (cache mutex held, released while waiting) until every SSD write
 * queued or in flight has finished, or until deadline_ns. */
kvt_status kvt__tiers_flush(kvt_cache *c, uint64_t deadline_ns);

#endif
