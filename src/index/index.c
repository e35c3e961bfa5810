/* index.c - the prefix index: 128-bit block hash -> entry, plus eviction.
 *
 * Memory per block of capacity n (max_blocks), at any n:
 *   entries  48 B   dense array of kvt_entry; free ones chain through .parent
 *   table    8 B x ceil(4n/3) slots = 10.7 B   (load factor <= 0.75)
 *   heap     4 B   eviction candidates (entry ids)
 *   total   ~62.7 B per block, plus a fixed header; all of it mapped in
 *           create (anonymous mmap, huge pages advised), none later.
 *
 * Hash table: open addressing with linear probing. A slot is a u64,
 * tag << 32 | (id + 1), 0 = empty; tag = bits 32..63 of the hash, so a
 * probe rejects almost every foreign slot without touching its entry. The
 * home slot is a "fastrange" reduction of the hash's low 32 bits,
 * (lo32 * nslots) >> 32, so the table need not be a power of two and its
 * size (and the load bound) is exact. Deletion shifts the following run
 * back (no tombstones), so probe lengths are those of a table that never
 * saw a delete. Expected probes at load a <= 0.75 (Knuth): a hit
 * (1 + 1/(1-a))/2 <= 2.5 slots, a miss (1 + 1/(1-a)^2)/2 <= 8.5 slots, eight
 * slots to a cache line.
 *
 * Eviction: a binary min-heap holds exactly the candidates: READY entries
 * with no pins and no children. Keys (all unique, so the order is total and
 * reproducible):
 *   LRU  tick, the index clock at the last touch (insert or match);
 *   LFU  (freq, tick): freq counts touches, saturating at 65535; every
 *        max_blocks touched blocks all counts halve ("decay") and the heap
 *        is rebuilt - O(entries) once per max_blocks touches, so O(1)
 *        amortised per touch - so old popularity fades.
 * The clock advances by one per touched block (u64: never wraps).
 *
 * Complexity: match/probe O(k) for k blocks walked, + O(log n) per touched
 * heap member (at most the last block of a chain is one); insert, commit,
 * abort, pin, unpin O(1) + O(log n) per heap update; evict O(log n) per
 * entry.
 */
#include "index/index.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

enum { KVT_E_FREE = 0, KVT_E_PENDING = 1, KVT_E_READY = 2 };

typedef struct kvt_entry {
    kvt_hash128 key;
    uint64_t tick;     /* index clock at the last touch */
    uint32_t parent;   /* entry id or KVT_INDEX_NONE; next free id when FREE */
    uint32_t payload;  /* the caller's (CPU slot) */
    uint32_t children; /* entries whose parent this is, PENDING or READY */
    uint32_t pins;     /* the insert pin + the caller's pins */
    uint32_t heap_pos; /* index in heap, KVT_INDEX_NONE when not a candidate */
    uint16_t freq;     /* LFU touch count, saturating, halved by decay */
    uint8_t state;     /* KVT_E_* */
    uint8_t tag;       /* the caller's (the store's quota owner) */
} kvt_entry;

_Static_assert(sizeof(kvt_entry) == 48, "kvt_entry is 48 bytes: see the memory budget");

#define KVT_INDEX_MAX_BLOCKS (1u << 31)
#define KVT_HUGE_PAGE ((size_t)2 << 20)

struct kvt_index {
    kvt_entry *entries;   /* cap entries; [0, high) have been handed out */
    uint64_t *table;      /* nslots slots */
    uint32_t *heap;       /* heap_len candidate ids */
    size_t entries_bytes, table_bytes, heap_bytes;
    uint32_t cap;
    uint32_t nslots;
    uint32_t count;       /* live entries */
    uint32_t high;        /* high-water mark of entry ids */
    uint32_t free_head;   /* freed ids, chained through .parent */
    uint32_t heap_len;
    kvt_evict_policy policy;
    uint64_t clock;       /* advances one per touched block */
    _Atomic uint64_t *shared_clock; /* instead of clock, when set */
    uint64_t decay_touches; /* LFU: touches since the last decay */
    kvt_index_observer observe; /* told of commits and removals, or NULL */
    void *observe_arg;
};

static inline uint64_t next_tick(kvt_index *idx)
{
    if (idx->shared_clock) return atomic_fetch_add_explicit(idx->shared_clock, 1, memory_order_relaxed) + 1;
    return ++idx->clock;
}

/* ------------------------------------------------------------------ */
/* Memory                                                             */
/* ------------------------------------------------------------------ */

/* Zeroed anonymous memory. Large regions start on a 2 MiB boundary and
 * are advised for transparent huge pages: random probes over hundreds of
 * MiB otherwise miss the TLB on nearly every access. */
static void *kvt__map(size_t bytes)
{
    if (bytes < KVT_HUGE_PAGE) {
        void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        return p == MAP_FAILED ? NULL : p;
    }
    size_t span = bytes + KVT_HUGE_PAGE;
    uint8_t *p = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
    uintptr_t a = ((uintptr_t)p + KVT_HUGE_PAGE - 1) & ~(uintptr_t)(KVT_HUGE_PAGE - 1);
    uint8_t *aligned = (uint8_t *)a;
    size_t head = (size_t)(aligned - p);
    size_t tail_start = (head + bytes + 4095) & ~(size_t)4095;
    if (head > 0) munmap(p, head);
    if (tail_start < span) munmap(p + tail_start, span - tail_start);
    (void)madvise(aligned, bytes, MADV_HUGEPAGE); /* advice only; fine if refused */
    return aligned;
}

static void kvt__unmap(void *p, size_t bytes)
{
    if (p != NULL) munmap(p, bytes);
}

/* ------------------------------------------------------------------ */
/* Hash table                                                         */
/* ------------------------------------------------------------------ */

static inline uint32_t kvt__home(const kvt_index *x, kvt_hash128 h)
{
    return (uint32_t)(((uint64_t)(uint32_t)h.lo * x->nslots) >> 32);
}

static inline uint32_t kvt__tag(kvt_hash128 h)
{
    return (uint32_t)(h.lo >> 32);
}

static inline uint32_t kvt__next(const kvt_index *x, uint32_t i)
{
    return ++i == x->nslots ? 0 : i;
}

/* Probe distance from slot a forward to slot b. */
static inline uint32_t kvt__dist(const kvt_index *x, uint32_t a, uint32_t b)
{
    return b >= a ? b - a : b + (x->nslots - a);
}

/* The entry id of h, probing from slot i on; KVT_INDEX_NONE if absent. */
static uint32_t kvt__find_from(const kvt_index *x, kvt_hash128 h, uint32_t i)
{
    uint32_t tag = kvt__tag(h);
    for (;;) {
        uint64_t s = x->table[i];
        if (s == 0) return KVT_INDEX_NONE;
        if ((uint32_t)(s >> 32) == tag) {
            uint32_t id = (uint32_t)s - 1;
            if (kvt__hash_eq(x->entries[id].key, h)) return id;
        }
        i = kvt__next(x, i);
    }
}

static inline uint32_t kvt__find(const kvt_index *x, kvt_hash128 h)
{
    return kvt__find_from(x, h, kvt__home(x, h));
}

/* h must be absent; the load bound guarantees an empty slot. */
static void kvt__table_put(kvt_index *x, kvt_hash128 h, uint32_t id)
{
    uint32_t i = kvt__home(x, h);
    while (x->table[i] != 0) i = kvt__next(x, i);
    x->table[i] = (uint64_t)kvt__tag(h) << 32 | ((uint64_t)id + 1);
}

/* Removes id's slot and shifts the rest of its run back over the hole: an
 * element at j (home k) may fill the hole at i when i lies on its probe
 * path k..j, i.e. dist(k, j) >= dist(i, j). */
static void kvt__table_del(kvt_index *x, uint32_t id)
{
    uint32_t i = kvt__home(x, x->entries[id].key);
    while ((uint32_t)x->table[i] != id + 1) {
        assert(x->table[i] != 0);
        i = kvt__next(x, i);
    }
    for (;;) {
        uint32_t j = i;
        uint64_t s;
        for (;;) {
            j = kvt__next(x, j);
            s = x->table[j];
            if (s == 0) {
                x->table[i] = 0;
                return;
            }
            uint32_t k = kvt__home(x, x->entries[(uint32_t)s - 1].key);
            if (kvt__dist(x, k, j) >= kvt__dist(x, i, j)) break;
        }
        x->table[i] = s;
        i = j;
    }
}

/* ------------------------------------------------------------------ */
/* Eviction heap                                                      */
/* ------------------------------------------------------------------ */

static inline bool kvt__before(const kvt_index *x, uint32_t a, uint32_t b)
{
    const kvt_entry *ea = &x->entries[a], *eb = &x->entries[b];
    if (x->policy == KVT_EVICT_LFU && ea->freq != eb->freq) return ea->freq < eb->freq;
    return ea->tick < eb->tick;
}

static inline void kvt__heap_set(kvt_index *x, uint32_t pos, uint32_t id)
{
    x->heap[pos] = id;
    x->entries[id].heap_pos = pos;
}

static void kvt__sift_up(kvt_index *x, uint32_t pos)
{
    uint32_t id = x->heap[pos];
    while (pos > 0) {
        uint32_t up = (pos - 1) / 2;
        if (!kvt__before(x, id, x->heap[up])) break;
        kvt__heap_set(x, pos, x->heap[up]);
        pos = up;
    }
    kvt__heap_set(x, pos, id);
}

static void kvt__sift_down(kvt_index *x, uint32_t pos)
{
    uint32_t id = x->heap[pos];
    for (;;) {
        uint32_t c = 2 * pos + 1;
        if (c >= x->heap_len) break;
        if (c + 1 < x->heap_len && kvt__before(x, x->heap[c + 1], x->heap[c])) c++;
        if (!kvt__before(x, x->heap[c], id)) break;
        kvt__heap_set(x, pos, x->heap[c]);
        pos = c;
    }
    kvt__heap_set(x, pos, id);
}

static void kvt__heap_push(kvt_index *x, uint32_t id)
{
    assert(x->entries[id].heap_pos == KVT_INDEX_NONE && x->heap_len < x->cap);
    uint32_t pos = x->heap_len++;
    kvt__heap_set(x, pos, id);
    kvt__sift_up(x, pos);
}

static void kvt__heap_remove(kvt_index *x, uint32_t id)
{
    uint32_t pos = x->entries[id].heap_pos;
    assert(pos < x->heap_len && x->heap[pos] == id);
    x->entries[id].heap_pos = KVT_INDEX_NONE;
    uint32_t last = x->heap[--x->heap_len];
    if (pos == x->heap_len) return;
    kvt__heap_set(x, pos, last);
    kvt__sift_up(x, pos);
    kvt__sift_down(x, x->entries[last].heap_pos);
}

/* Makes id a candidate if it now qualifies (READY, unpinned, no children). */
static void kvt__maybe_candidate(kvt_index *x, uint32_t id)
{
    const kvt_entry *e = &x->entries[id];
    if (e->state == KVT_E_READY && e->pins == 0 && e->children == 0 &&
        e->heap_pos == KVT_INDEX_NONE)
        kvt__heap_push(x, id);
}

/* LFU aging: halve every count, then restore the heap order (halving can
 * turn (freq, tick) order around for counts that become equal). */
static void kvt__decay(kvt_index *x)
{
    for (uint32_t id = 0; id < x->high; id++)
        if (x->entries[id].state != KVT_E_FREE) x->entries[id].freq >>= 1;
    for (uint32_t pos = x->heap_len / 2; pos-- > 0;) kvt__sift_down(x, pos);
    x->decay_touches = 0;
}

/* ------------------------------------------------------------------ */
/* Entries                                                            */
/* ------------------------------------------------------------------ */

static uint32_t kvt__entry_alloc(kvt_index *x)
{
    uint32_t id;
    if (x->free_head != KVT_INDEX_NONE) {
        id = x->free_head;
        x->free_head = x->entries[id].parent;
    } else {
        id = x->high++;
    }
    x->count++;
    return id;
}

static void kvt__entry_free(kvt_index *x, uint32_t id)
{
    kvt_entry *e = &x->entries[id];
    e->state = KVT_E_FREE;
    e->parent = x->free_head;
    x->free_head = id;
    x->count--;
}

static inline bool kvt__live(const kvt_index *x, uint32_t id)
{
    return id < x->high && x->entries[id].state != KVT_E_FREE;
}

/* Unlinks a childless entry from table, parent and storage. */
static void kvt__entry_remove(kvt_index *x, uint32_t id)
{
    kvt_entry *e = &x->entries[id];
    assert(e->children == 0 && e->heap_pos == KVT_INDEX_NONE);
    /* Only what was announced leaves: a PENDING entry never was. */
    if (x->observe && e->state == KVT_E_READY) x->observe(x->observe_arg, KVT_INDEX_REMOVED, x, &id, 1);
    uint32_t parent = e->parent;
    kvt__table_del(x, id);
    kvt__entry_free(x, id);
    if (parent != KVT_INDEX_NONE) {
        kvt_entry *p = &x->entries[parent];
        assert(p->state != KVT_E_FREE && p->children > 0);
        if (--p->children == 0) kvt__maybe_candidate(x, parent);
    }
}

/* ------------------------------------------------------------------ */
/* The interface                                                      */
/* ------------------------------------------------------------------ */

void kvt__index_share_clock(kvt_index *idx, _Atomic uint64_t *clock)
{
    idx->shared_clock = clock;
}

bool kvt__index_coldest(const kvt_index *idx, uint16_t *freq, uint64_t *tick)
{
    if (idx->heap_len == 0) return false;
    const kvt_entry *e = &idx->entries[idx->heap[0]];
    *freq = idx->policy == KVT_EVICT_LFU ? e->freq : 0;
    *tick = e->tick;
    return true;
}

void kvt__index_age(const kvt_index *idx, uint32_t id, uint16_t *freq, uint64_t *tick)
{
    assert(kvt__live(idx, id));
    const kvt_entry *e = &idx->entries[id];
    *freq = idx->policy == KVT_EVICT_LFU ? e->freq : 0;
    *tick = e->tick;
}

uint32_t kvt__index_coldest_where(const kvt_index *idx, bool (*want)(uint32_t payload, void *arg),
                                  void *arg, uint32_t max_visit)
{
    /* Best-first over the heap: a node is colder than its children, so
     * candidates come out coldest first. The frontier holds at most one
     * node more than were visited. */
    enum { MAX_VISIT = 128 };
    uint32_t frontier[MAX_VISIT + 1], nf = 0;
    if (max_visit > MAX_VISIT) max_visit = MAX_VISIT;
    if (idx->heap_len) frontier[nf++] = 0;
    for (uint32_t v = 0; v < max_visit && nf; v++) {
        uint32_t best = 0;
        for (uint32_t i = 1; i < nf; i++)
            if (kvt__before(idx, idx->heap[frontier[i]], idx->heap[frontier[best]])) best = i;
        uint32_t pos = frontier[best];
        frontier[best] = frontier[--nf];
        uint32_t id = idx->heap[pos];
        if (want(idx->entries[id].payload, arg)) return id;
        for (uint32_t c = 2 * pos + 1; c <= 2 * pos + 2 && c < idx->heap_len; c++)
            if (nf < MAX_VISIT + 1) frontier[nf++] = c;
    }
    return KVT_INDEX_NONE;
}

uint8_t kvt__index_tag(const kvt_index *idx, uint32_t id)
{
    assert(kvt__live(idx, id));
    return idx->entries[id].tag;
}

void kvt__index_set_tag(kvt_index *idx, uint32_t id, uint8_t tag)
{
    assert(kvt__live(idx, id));
    idx->entries[id].tag = tag;
}

kvt_status kvt__index_create(kvt_index **out, uint32_t max_blocks, kvt_evict_policy policy)
{
    if (out == NULL || max_blocks == 0 || max_blocks > KVT_INDEX_MAX_BLOCKS ||
        (policy != KVT_EVICT_LRU && policy != KVT_EVICT_LFU))
        return KVT_EINVAL;
    kvt_index *x = calloc(1, sizeof *x);
    if (x == NULL) return KVT_ENOMEM;
    x->cap = max_blocks;
    x->nslots = (uint32_t)(((uint64_t)max_blocks * 4 + 2) / 3); /* ceil(4n/3) > n */
    x->policy = policy;
    x->free_head = KVT_INDEX_NONE;
    x->entries_bytes = (size_t)max_blocks * sizeof(kvt_entry);
    x->table_bytes = (size_t)x->nslots * sizeof(uint64_t);
    x->heap_bytes = (size_t)max_blocks * sizeof(uint32_t);
    x->entries = kvt__map(x->entries_bytes);
    x->table = kvt__map(x->table_bytes);
    x->heap = kvt__map(x->heap_bytes);
    if (x->entries == NULL || x->table == NULL || x->heap == NULL) {
        kvt__index_destroy(x);
        return KVT_ENOMEM;
    }
    *out = x;
    return KVT_OK;
}

void kvt__index_destroy(kvt_index *idx)
{
    if (idx == NULL) return;
    kvt__unmap(idx->entries, idx->entries_bytes);
    kvt__unmap(idx->table, idx->table_bytes);
    kvt__unmap(idx->heap, idx->heap_bytes);
    free(idx);
}

/* Walks h[0..n) while every block is present and READY, software
 * pipelined so that a walk of k blocks overlaps its 2k cache misses instead
 * of taking them in a row: while block i is verified, the entry of block
 * i + D is prefetched (its slot found by tag) and the table slot of block
 * i + 2D is prefetched. */
#define KVT_WALK_AHEAD 16u /* D: about as many misses in flight as a core keeps */
#define KVT_WALK_RING 64u  /* > 2D, a power of two */

static inline void kvt__walk_find_slot(const kvt_index *x, kvt_hash128 h, uint32_t *slot,
                                       uint32_t *cand)
{
    /* First slot of the run whose tag matches: almost always the entry. */
    uint32_t tag = kvt__tag(h), j = *slot;
    uint64_t s;
    while ((s = x->table[j]) != 0 && (uint32_t)(s >> 32) != tag) j = kvt__next(x, j);
    *slot = j;
    *cand = s == 0 ? KVT_INDEX_NONE : (uint32_t)s - 1;
    if (s != 0) { /* a 48-byte entry may straddle two lines */
        __builtin_prefetch(&x->entries[*cand]);
        __builtin_prefetch((const char *)&x->entries[*cand] + sizeof(kvt_entry) - 1);
    }
}

static uint32_t kvt__walk(const kvt_index *x, const kvt_hash128 *h, uint32_t n, uint32_t *ids,
                          kvt_index_stop *stop)
{
    uint32_t slot[KVT_WALK_RING], cand[KVT_WALK_RING];
    const uint32_t d = KVT_WALK_AHEAD, mask = KVT_WALK_RING - 1;
    for (uint32_t i = 0; i < n && i < 2 * d; i++) {
        slot[i] = kvt__home(x, h[i]);
        __builtin_prefetch(&x->table[slot[i]]);
    }
    for (uint32_t i = 0; i < n && i < d; i++) kvt__walk_find_slot(x, h[i], &slot[i], &cand[i]);
    for (uint32_t i = 0; i < n; i++) {
        if (i + 2 * d < n) {
            uint32_t r = (i + 2 * d) & mask;
            slot[r] = kvt__home(x, h[i + 2 * d]);
            __builtin_prefetch(&x->table[slot[r]]);
        }
        if (i + d < n) {
            uint32_t r = (i + d) & mask;
            kvt__walk_find_slot(x, h[i + d], &slot[r], &cand[r]);
        }
        uint32_t id = cand[i & mask];
        if (id != KVT_INDEX_NONE && !kvt__hash_eq(x->entries[id].key, h[i]))
            id = kvt__find_from(x, h[i], kvt__next(x, slot[i & mask])); /* tag collision */
        if (id == KVT_INDEX_NONE) {
            *stop = KVT_STOP_ABSENT;
            return i;
        }
        if (x->entries[id].state != KVT_E_READY) {
            *stop = KVT_STOP_PENDING;
            return i;
        }
        ids[i] = id;
    }
    *stop = KVT_STOP_END;
    return n;
}

uint32_t kvt__index_match(kvt_index *idx, const kvt_hash128 *h, uint32_t n, uint32_t *ids,
                          bool touch)
{
    kvt_index_stop stop;
    uint32_t k = kvt__walk(idx, h, n, ids, &stop);
    if (!touch || k == 0) return k;
    for (uint32_t i = 0; i < k; i++) {
        kvt_entry *e = &idx->entries[ids[i]];
        e->tick = next_tick(idx);
        if (idx->policy == KVT_EVICT_LFU && e->freq < UINT16_MAX) e->freq++;
        if (e->heap_pos != KVT_INDEX_NONE) kvt__sift_down(idx, e->heap_pos); /* key grew */
    }
    if (idx->policy == KVT_EVICT_LFU) {
        idx->decay_touches += k;
        if (idx->decay_touches >= idx->cap) kvt__decay(idx);
    }
    return k;
}

uint32_t kvt__index_probe(kvt_index *idx, const kvt_hash128 *h, uint32_t n, uint32_t *ids,
                          kvt_index_stop *stop)
{
    kvt_index_stop s;
    uint32_t k = kvt__walk(idx, h, n, ids, &s);
    if (stop != NULL) *stop = s;
    return k;
}

kvt_status kvt__index_insert(kvt_index *idx, uint32_t parent, kvt_hash128 h, uint32_t payload,
                             uint32_t *id_out)
{
    assert(parent == KVT_INDEX_NONE || kvt__live(idx, parent));
    if (kvt__find(idx, h) != KVT_INDEX_NONE) return KVT_EINVAL;
    if (idx->count == idx->cap) return KVT_EFULL;
    uint32_t id = kvt__entry_alloc(idx);
    kvt_entry *e = &idx->entries[id];
    *e = (kvt_entry){.key = h,
                     .tick = next_tick(idx),
                     .parent = parent,
                     .payload = payload,
                     .children = 0,
                     .pins = 1,
                     .heap_pos = KVT_INDEX_NONE,
                     .freq = 1,
                     .state = KVT_E_PENDING};
    kvt__table_put(idx, h, id);
    if (parent != KVT_INDEX_NONE) {
        kvt_entry *p = &idx->entries[parent];
        if (p->children++ == 0 && p->heap_pos != KVT_INDEX_NONE) kvt__heap_remove(idx, parent);
    }
    if (id_out != NULL) *id_out = id;
    return KVT_OK;
}

void kvt__index_commit(kvt_index *idx, const uint32_t *ids, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        kvt_entry *e = &idx->entries[ids[i]];
        assert(kvt__live(idx, ids[i]) && e->state == KVT_E_PENDING && e->pins > 0);
        e->state = KVT_E_READY;
        e->pins--;
        kvt__maybe_candidate(idx, ids[i]);
    }
    if (idx->observe && n) idx->observe(idx->observe_arg, KVT_INDEX_STORED, idx, ids, n);
}

void kvt__index_set_observer(kvt_index *idx, kvt_index_observer fn, void *arg)
{
    idx->observe = fn;
    idx->observe_arg = arg;
    if (!fn) return;
    for (uint32_t id = 0; id < idx->high; id++) /* what it holds already (recovered) */
        if (kvt__live(idx, id) && idx->entries[id].state == KVT_E_READY)
            fn(arg, KVT_INDEX_STORED, idx, &id, 1);
}

void kvt__index_notify(const kvt_index *idx, kvt_index_event e, const uint32_t *ids, uint32_t n)
{
    if (idx->observe && n) idx->observe(idx->observe_arg, e, idx, ids, n);
}

void kvt__index_abort(kvt_index *idx, const uint32_t *ids, uint32_t n)
{
    for (uint32_t i = n; i-- > 0;) {
        assert(kvt__live(idx, ids[i]) && idx->entries[ids[i]].state == KVT_E_PENDING);
        kvt__entry_remove(idx, ids[i]);
    }
}

void kvt__index_pin(kvt_index *idx, const uint32_t *ids, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        kvt_entry *e = &idx->entries[ids[i]];
        assert(kvt__live(idx, ids[i]) && e->pins < UINT32_MAX);
        if (e->pins++ == 0 && e->heap_pos != KVT_INDEX_NONE) kvt__heap_remove(idx, ids[i]);
    }
}

void kvt__index_unpin(kvt_index *idx, const uint32_t *ids, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        kvt_entry *e = &idx->entries[ids[i]];
        assert(kvt__live(idx, ids[i]) && e->pins > 0);
        if (--e->pins == 0) kvt__maybe_candidate(idx, ids[i]);
    }
}

uint32_t kvt__index_evict_ids(kvt_index *idx, uint32_t want, uint32_t *ids_out,
                              uint32_t *payloads_out)
{
    uint32_t got = 0;
    while (got < want && idx->heap_len > 0) {
        uint32_t id = idx->heap[0];
        kvt_entry *e = &idx->entries[id];
        assert(e->state == KVT_E_READY && e->pins == 0 && e->children == 0);
        kvt__heap_remove(idx, id);
        if (ids_out != NULL) ids_out[got] = id;
        if (payloads_out != NULL) payloads_out[got] = e->payload;
        got++;
        kvt__entry_remove(idx, id); /* may make the parent a candidate */
    }
    return got;
}

uint32_t kvt__index_evict(kvt_index *idx, uint32_t want, uint32_t *payloads_out)
{
    return kvt__index_evict_ids(idx, want, NULL, payloads_out);
}

uint32_t kvt__index_payload(const kvt_index *idx, uint32_t id)
{
    assert(kvt__live(idx, id));
    return idx->entries[id].payload;
}

void kvt__index_set_payload(kvt_index *idx, uint32_t id, uint32_t payload)
{
    assert(kvt__live(idx, id));
    idx->entries[id].payload = payload;
}

uint32_t kvt__index_pins(const kvt_index *idx, uint32_t id)
{
    assert(kvt__live(idx, id));
    return idx->entries[id].pins;
}

kvt_hash128 kvt__index_key(const kvt_index *idx, uint32_t id)
{
    assert(kvt__live(idx, id));
    return idx->entries[id].key;
}

uint32_t kvt__index_parent(const kvt_index *idx, uint32_t id)
{
    assert(kvt__live(idx, id));
    return idx->entries[id].parent;
}

bool kvt__index_remove_candidate(kvt_index *idx, uint32_t id)
{
    assert(kvt__live(idx, id));
    kvt_entry *e = &idx->entries[id];
    if (e->heap_pos == KVT_INDEX_NONE) return false;
    kvt__heap_remove(idx, id);
    kvt__entry_remove(idx, id);
    return true;
}

uint32_t kvt__index_find(const kvt_index *idx, kvt_hash128 h)
{
    return kvt__find(idx, h);
}

uint32_t kvt__index_high(const kvt_index *idx)
{
    return idx->high;
}

bool kvt__index_live(const kvt_index *idx, uint32_t id)
{
    return kvt__live(idx, id);
}

uint32_t kvt__index_count(const kvt_index *idx)
{
    return idx->count;
}

uint32_t kvt__index_capacity(const kvt_index *idx)
{
    return idx->cap;
}

uint32_t kvt__index_evictable(const kvt_index *idx)
{
    return idx->heap_len;
}

uint64_t kvt__index_memory_bytes(const kvt_index *idx)
{
    return sizeof *idx + idx->entries_bytes + idx->table_bytes + idx->heap_bytes;
}

/* ------------------------------------------------------------------ */
/* Self-check (tests)                                                 */
/* ------------------------------------------------------------------ */

bool kvt__index_check(const kvt_index *idx)
{
    const kvt_index *x = idx;
    uint32_t *children = calloc(x->high > 0 ? x->high : 1, sizeof *children);
    if (children == NULL) return false;
    bool ok = true;
    uint32_t live = 0, candidates = 0;
#define KVT_CHECK_(cond)    \
    do {                    \
        if (!(cond)) {      \
            ok = false;     \
            goto done;      \
        }                   \
    } while (0)
    for (uint32_t id = 0; id < x->high; id++) {
        const kvt_entry *e = &x->entries[id];
        if (e->state == KVT_E_FREE) continue;
        live++;
        KVT_CHECK_(e->state == KVT_E_PENDING || e->state == KVT_E_READY);
        KVT_CHECK_(kvt__find(x, e->key) == id);
        if (e->parent != KVT_INDEX_NONE) {
            KVT_CHECK_(kvt__live(x, e->parent)); /* a prefix never loses a block */
            children[e->parent]++;
        }
        bool cand = e->state == KVT_E_READY && e->pins == 0 && e->children == 0;
        KVT_CHECK_(cand == (e->heap_pos != KVT_INDEX_NONE));
        if (cand) {
            candidates++;
            KVT_CHECK_(e->heap_pos < x->heap_len && x->heap[e->heap_pos] == id);
        }
        if (e->state == KVT_E_PENDING) KVT_CHECK_(e->pins > 0);
    }
    for (uint32_t id = 0; id < x->high; id++)
        if (x->entries[id].state != KVT_E_FREE) KVT_CHECK_(x->entries[id].children == children[id]);
    KVT_CHECK_(live == x->count && candidates == x->heap_len);
    for (uint32_t pos = 1; pos < x->heap_len; pos++)
        KVT_CHECK_(!kvt__before(x, x->heap[pos], x->heap[(pos - 1) / 2]));
    uint32_t used = 0;
    for (uint32_t i = 0; i < x->nslots; i++) used += x->table[i] != 0;
    KVT_CHECK_(used == x->count);
    uint32_t freed = 0;
    for (uint32_t f = x->free_head; f != KVT_INDEX_NONE && freed <= x->high;
         f = x->entries[f].parent)
        freed++;
    KVT_CHECK_(freed + x->count == x->high);
#undef KVT_CHECK_
done:
    free(children);
    return ok;
}
