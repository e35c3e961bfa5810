/* share.h - one CPU capacity for several caches: the node server's tiers of
 * different geometries (docs/server.md "Any model").
 *
 * A share holds the byte budget every member's pool draws on (a member's
 * memfd is address space only; a slot is backed when first allocated and
 * given back with a punched hole), and one index clock, so the members'
 * blocks compare by recency (LRU) or (use count, recency) (LFU). A member
 * out of free slots with the budget spent calls kvt__share_reclaim, which
 * takes memory from the others: first their free backed slots (memory no
 * block uses), then blocks of the member whose coldest block is colder than
 * the caller's own coldest; when the caller's own is the coldest, it
 * evicts its own (kvt__tiers_reserve_cpu's usual path). So one busy
 * geometry can use the whole capacity, and a new one still gets room.
 * The SSD capacity is shared the same way (kvt__share_ssd_reclaim): each
 * member's SSD store is sparse and draws on the share's SSD budget.
 *
 * Locking: the caller holds its cache mutex; reclaim takes the share's
 * mutex, then the others' cache mutexes with trylock only, so no lock
 * order between members exists and none can deadlock. A member busy under
 * its own mutex is tried again by the CPU reclaim for up to 2 ms over one
 * call (share.c BUSY_WAIT_NS), then skipped; the SSD side reports it as
 * pending at once, so its caller waits with its mutex dropped instead of
 * evicting its own; the quota's owner room skips it. Members join after their cache is
 * built and leave first thing in kvt_cache_destroy, under the share mutex. */
#ifndef KVT_CACHE_SHARE_H
#define KVT_CACHE_SHARE_H

#include <stdint.h>

#include "cache/cache.h"
#include "store/pool.h"

typedef struct kvt_share kvt_share;

/* capacity_bytes: the CPU budget; ssd_bytes: the SSD budget the members'
 * SSD tiers share (0: they have none). KVT_EINVAL for a capacity of 0;
 * KVT_ENOMEM. */
kvt_status kvt__share_create(kvt_share **out, uint64_t capacity_bytes, uint64_t ssd_bytes);
/* After every member cache was destroyed. NULL is a no-op. */
void kvt__share_destroy(kvt_share *sh);
/* kvt_cache_create with its CPU tier a budgeted memfd of this share
 * (cfg's cpu_capacity is the most this cache may use: normally the share's
 * capacity), its index on the share's clock, and the cache a member.
 * Returns what kvt_cache_create returns. */
kvt_status kvt__cache_create_shared(kvt_cache **out, const kvt_config *cfg,
                                    const kvt_geometry *geo, kvt_share *sh);
/* Called by a member (its mutex held) whose pool gives no slot: frees up
 * to want of its slots' worth of budget elsewhere. Returns slots' worth
 * freed (the caller's next allocation may still lose them to another
 * member: retry a bounded number of times); 0 when the caller should evict
 * its own blocks instead. */
uint32_t kvt__share_reclaim(kvt_cache *c, uint32_t want);
/* The same, taking from the other members whichever block is coldest: for
 * a member with an SSD tier whose own coldest blocks hold no CPU copy it
 * could drop (they live on the SSD only), so "my coldest is the coldest"
 * says nothing about CPU room; without this, its loads from the SSD found
 * no CPU slot once the others filled the budget. */
uint32_t kvt__share_reclaim_others(kvt_cache *c, uint32_t want);
/* Called by a member (its mutex held) whose owner is at its quota: the
 * owner's coldest block over every member (its quota counts its bytes in
 * all of them) gives up its CPU copy (kvt__tiers_owner_room there); when
 * no member shows one among its coldest candidates, the first member that
 * can give up any of the owner's copies does, the caller first. Members
 * busy under their own mutex are skipped, as in reclaim. True when room
 * was made: the quota has it for the caller's next block (the memory may
 * still need kvt__share_reclaim). */
bool kvt__share_owner_room(kvt_cache *c, uint8_t owner);
/* The SSD side of kvt__share_reclaim, for a member (its mutex held) whose
 * SSD store gives no slot: takes up to want of its slots' worth of disk
 * from the others' free backed slots (punched out: returns the slots'
 * worth freed, the caller's next alloc may use them). When that is not
 * enough and another member's coldest block is colder than the caller's,
 * that member evicts its coldest leaves; their slots come back only after
 * its commit round, so *pending says "wait a little and call again" (the
 * caller drops its mutex meanwhile); so it does when a member stayed busy.
 * 0 without pending: evict your own. */
uint32_t kvt__share_ssd_reclaim(kvt_cache *c, uint32_t want, bool *pending);
/* kvt_cache_destroy: leaves the share (no reclaim touches c after). */
void kvt__share_leave(kvt_cache *c);
/* For kvt__cache_create_shared: the budget its pool is made with, and
 * joining once the cache is built (KVT_EFULL past the bound). */
kvt_pool_budget *kvt__share_budget(kvt_share *sh);
/* The SSD budget its members' SSD tiers are opened with; NULL for none. */
kvt_pool_budget *kvt__share_ssd_budget(kvt_share *sh);
uint64_t kvt__share_ssd_used(const kvt_share *sh);
kvt_status kvt__share_join(kvt_share *sh, kvt_cache *c);
uint64_t kvt__share_used(const kvt_share *sh);
uint64_t kvt__share_capacity(const kvt_share *sh);

#endif
