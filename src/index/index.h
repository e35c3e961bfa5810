/* index.h - the prefix index: chained block hashes -> cached blocks.
 *
 * Block i of a request is identified by h_i = H(h_{i-1} || tokens of block
 * i), h_{-1} = H(namespace), so a block's hash commits to every earlier token
 * and to the namespace. Entries form a forest (each entry's parent is the
 * previous block of its prefix). Invariants the index keeps:
 *  - An entry's parent is present for as long as the entry is (eviction takes
 *    leaves only, so a cached prefix never loses a middle block).
 *  - Only READY entries are matched by kvt__index_match; PENDING entries
 *    (a store in flight) are invisible to loads.
 *  - Pinned entries (pins > 0) are never evicted.
 * Not thread-safe: the cache manager serialises calls with its lock. No
 * call allocates memory after create; every call is O(blocks touched) plus
 * O(log n) per eviction-heap update, amortised: a touch may pay O(entries)
 * once per max_blocks touches (LFU decay) or per 2^31 ticks (tick rebase).
 */
#ifndef KVT_INDEX_INDEX_H
#define KVT_INDEX_INDEX_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include "kvtier.h"
#include "util/hash.h"

#define KVT_INDEX_NONE UINT32_MAX

typedef enum kvt_evict_policy {
    KVT_EVICT_LRU = 0, /* least recently used leaf first */
    KVT_EVICT_LFU = 1, /* least frequently used leaf first; counts decay */
} kvt_evict_policy;

typedef struct kvt_index kvt_index;

/* Block hashes of the full blocks of tokens: writes min(num_tokens /
 * block_tokens, max_out) hashes to out and returns that count. */
uint32_t kvt__block_hashes(const uint32_t *tokens, uint32_t num_tokens, uint32_t block_tokens,
                           const void *ns, uint32_t ns_len, kvt_hash128 *out, uint32_t max_out);

/* Block hashes of a keyed request (the caller validated every key): writes
 * min(num_keys, max_out) hashes to out and returns that count. A keyed chain
 * never shares a hash with a token chain. */
uint32_t kvt__key_hashes(const kvt_key *keys, uint32_t num_keys, const void *ns, uint32_t ns_len,
                         kvt_hash128 *out, uint32_t max_out);

/* The same for independent keys (KVT_REQ_INDEPENDENT_KEYS): each hash is
 * that of a one-key request of its key. */
uint32_t kvt__key_roots(const kvt_key *keys, uint32_t num_keys, const void *ns, uint32_t ns_len,
                        kvt_hash128 *out, uint32_t max_out);

/* An index for at most max_blocks entries (1 .. 2^31). */
kvt_status kvt__index_create(kvt_index **out, uint32_t max_blocks, kvt_evict_policy policy);
void kvt__index_destroy(kvt_index *idx);

/* Longest prefix of h[0..n) whose entries are all READY. Writes their entry
 * ids to ids[0..k) and returns k. When touch is true, the matched entries
 * count as used now (recency / frequency for eviction). */
uint32_t kvt__index_match(kvt_index *idx, const kvt_hash128 *h, uint32_t n, uint32_t *ids,
                          bool touch);

typedef enum kvt_index_stop {
    KVT_STOP_END = 0,     /* all n present and READY */
    KVT_STOP_ABSENT = 1,  /* h[k] is not in the index */
    KVT_STOP_PENDING = 2, /* h[k] is being stored (PENDING) */
} kvt_index_stop;

/* Like kvt__index_match without touching, and also says why the walk
 * stopped at k (the return value). For store planning. */
uint32_t kvt__index_probe(kvt_index *idx, const kvt_hash128 *h, uint32_t n, uint32_t *ids,
                          kvt_index_stop *stop);

/* Inserts a PENDING entry with one pin, child of parent (KVT_INDEX_NONE for
 * a first block). payload is the caller's (the CPU slot). KVT_EFULL when
 * max_blocks entries exist; KVT_EINVAL if h is already present. */
kvt_status kvt__index_insert(kvt_index *idx, uint32_t parent, kvt_hash128 h, uint32_t payload,
                             uint32_t *id_out);
/* Marks PENDING entries READY and drops the insert pin. */
void kvt__index_commit(kvt_index *idx, const uint32_t *ids, uint32_t n);
/* Removes PENDING entries inserted by one store (given in prefix order; they
 * are removed tail first). Their payloads are the caller's to free. */
void kvt__index_abort(kvt_index *idx, const uint32_t *ids, uint32_t n);

/* Pins an entry holds at most (the insert pin and the caller's; index.c:
 * the pin bound). The cache pins a block once per task in flight that uses
 * it, plus a store's and an SSD write's pin: its max_tasks (at most
 * 1048576) keeps it out of reach. */
#define KVT_INDEX_MAX_PINS 2105343u
/* Pins ids[0..n) once each (an id given twice is pinned twice). KVT_EFULL,
 * with nothing pinned, when that would take one past KVT_INDEX_MAX_PINS. */
kvt_status kvt__index_pin(kvt_index *idx, const uint32_t *ids, uint32_t n);
void kvt__index_unpin(kvt_index *idx, const uint32_t *ids, uint32_t n);

/* Evicts up to want READY, unpinned entries that have no children, in
 * policy order (a parent becomes a candidate once its last child goes).
 * Writes the evicted entries' payloads to payloads_out and returns how many. */
uint32_t kvt__index_evict(kvt_index *idx, uint32_t want, uint32_t *payloads_out);

/* Like kvt__index_evict, and also writes the removed entries' ids (valid
 * only to index the caller's per-entry tables until the next insert). */
uint32_t kvt__index_evict_ids(kvt_index *idx, uint32_t want, uint32_t *ids_out,
                              uint32_t *payloads_out);

uint32_t kvt__index_payload(const kvt_index *idx, uint32_t id);
/* Changes a live entry's payload (its CPU slot, or none after the tier
 * dropped it). */
void kvt__index_set_payload(kvt_index *idx, uint32_t id, uint32_t payload);
uint32_t kvt__index_pins(const kvt_index *idx, uint32_t id);
kvt_hash128 kvt__index_key(const kvt_index *idx, uint32_t id);
uint32_t kvt__index_parent(const kvt_index *idx, uint32_t id); /* KVT_INDEX_NONE for a root */
/* Removes entry id if it is an eviction candidate (READY, unpinned, no
 * children); true when it did. */
bool kvt__index_remove_candidate(kvt_index *idx, uint32_t id);
/* Several indexes on one clock (a server's geometries sharing a capacity),
 * so their ticks compare: each touch takes its tick from *clock
 * (atomically). Set before the first insert; the clock outlives idx. */
void kvt__index_share_clock(kvt_index *idx, _Atomic uint64_t *clock);
/* The next eviction candidate's key: false when there is none. LRU: freq
 * is 0 and tick its last touch; LFU: its (freq, tick). Smaller is colder.
 * Exact for an entry touched since the index's epoch, which stays at least
 * 2^31 ticks back; one untouched since before it reports the epoch, still
 * colder than any exact one (index.c: the tick bound). */
bool kvt__index_coldest(const kvt_index *idx, uint16_t *freq, uint64_t *tick);
/* Entry id's eviction key, as kvt__index_coldest gives the coldest's. */
void kvt__index_age(const kvt_index *idx, uint32_t id, uint16_t *freq, uint64_t *tick);
/* The coldest eviction candidate whose payload want() accepts, looking at
 * no more than max_visit (at most 128) candidates coldest first;
 * KVT_INDEX_NONE when none of those is. */
uint32_t kvt__index_coldest_where(const kvt_index *idx, bool (*want)(uint32_t payload, void *arg),
                                  void *arg, uint32_t max_visit);
/* Told of every entry that became READY (kvt__index_commit: ids[0..n), in
 * the order committed) and of every READY entry about to be removed (its
 * key, payload and the caller's per-entry state still as they were; n is
 * 1), under whatever serialises the index's callers. Set from above (the KV events publisher); it must not call
 * back into the index except to read (kvt__index_key, _parent,
 * _payload). */
typedef enum {
    KVT_INDEX_STORED = 1,
    KVT_INDEX_REMOVED = 2,
    /* A READY entry that stays in the index gained or lost its copy in one
     * tier (the cache's tiers tell it through kvt__index_notify, under the
     * same lock): a CPU copy read back from the SSD / dropped while the
     * SSD keeps the block; an SSD copy made durable / found lost. */
    KVT_INDEX_CPU_STORED = 3,
    KVT_INDEX_CPU_REMOVED = 4,
    KVT_INDEX_DISK_STORED = 5,
    KVT_INDEX_DISK_REMOVED = 6,
} kvt_index_event;
typedef void (*kvt_index_observer)(void *arg, kvt_index_event ev, const kvt_index *idx,
                                   const uint32_t *ids, uint32_t n);
/* Sets (or with NULL clears) the observer, first telling it of every READY
 * entry as STORED (blocks recovered before it was set). */
void kvt__index_set_observer(kvt_index *idx, kvt_index_observer fn, void *arg);
/* Tells the observer, if one is set, of a tier change e (one of the
 * KVT_INDEX_CPU_ / _DISK_ events) of READY entries ids[0..n). */
void kvt__index_notify(const kvt_index *idx, kvt_index_event e, const uint32_t *ids, uint32_t n);
/* A byte of the caller's per entry (0 at insert): the quota owner. */
uint8_t kvt__index_tag(const kvt_index *idx, uint32_t id);
void kvt__index_set_tag(kvt_index *idx, uint32_t id, uint8_t tag);
/* The entry of hash h in any state, or KVT_INDEX_NONE. */
uint32_t kvt__index_find(const kvt_index *idx, kvt_hash128 h);
/* Entry ids are below this; kvt__index_live says which are in use (a scan). */
uint32_t kvt__index_high(const kvt_index *idx);
bool kvt__index_live(const kvt_index *idx, uint32_t id);
uint32_t kvt__index_count(const kvt_index *idx);     /* entries, READY or PENDING */
uint32_t kvt__index_capacity(const kvt_index *idx);  /* max_blocks */
/* Bytes of memory the index holds (entries, hash table, heap), for stats:
 * under 48 per block (index.c). */
uint64_t kvt__index_memory_bytes(const kvt_index *idx);
/* Entries kvt__index_evict could take right now (READY, unpinned, no
 * children); more become candidates as their children go. */
uint32_t kvt__index_evictable(const kvt_index *idx);
/* Verifies every internal invariant (table, parents, child counts, heap
 * membership and order, free list) in O(entries + slots). For tests and
 * debugging only: it allocates scratch memory. */
bool kvt__index_check(const kvt_index *idx);

#endif
