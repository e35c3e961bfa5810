/* index.c - the prefix index: 128-bit block hash -> entry, plus eviction.
 *
 * Memory per block of capacity n (max_blocks), at any n:
 *   entries  32 B   kvt_entry, what lookups, touches, pins and the heap use,
 *                   32-byte aligned: one cache line holds two, none spans two
 *   cold      6 B   kvt_cold, the same id's parent, tag and high pin bits;
 *                   free ids chain through .parent
 *   table    4 B x ceil(4n/3) slots = 5.33 B   (load factor <= 0.75)
 *   heap     4 B   eviction candidates (entry ids)
 *   total   ~47.3 B per block, plus a fixed header; all of it mapped in
 *           create (anonymous mmap, huge pages advised), none later.
 * A lookup of k blocks touches k table lines (a few more where a run
 * crosses a line) and k entry lines; a touch writes those entry lines.
 *
 * Hash table: open addressing with linear probing. A slot is a u32,
 * tag | (id + 1), 0 = empty: the low id_bits bits hold id + 1 (id_bits =
 * the bits of max_blocks), the high 32 - id_bits bits hold the same bits of
 * the hash's bits 32..63 (5 bits at 100M blocks, 27 at 16), so a probe
 * rejects most foreign slots without touching their entries (at 100M
 * blocks, 31 in 32). The home slot is a "fastrange" reduction of the hash's
 * low 32 bits, (lo32 * nslots) >> 32, so the table need not be a power of
 * two and its size (and the load bound) is exact. Deletion shifts the
 * following run back (no tombstones), so probe lengths are those of a table
 * that never saw a delete. Expected probes at load a <= 0.75 (Knuth): a hit
 * (1 + 1/(1-a))/2 <= 2.5 slots, a miss (1 + 1/(1-a)^2)/2 <= 8.5 slots,
 * sixteen slots to a cache line.
 *
 * Eviction: a binary min-heap holds exactly the candidates: READY entries
 * with no pins and no children. Keys (ties broken by entry id, so the order
 * is total and reproducible):
 *   LRU  tick, the index clock at the last touch (insert or match);
 *   LFU  (freq, tick): freq counts touches, saturating at 65535; every
 *        max_blocks touched blocks all counts halve ("decay") and the heap
 *        is rebuilt - O(entries) once per max_blocks touches, so O(1)
 *        amortised per touch - so old popularity fades.
 * The clock advances by one per touched block (u64: never wraps).
 *
 * Bounds the 32-byte entry introduces, each checked where it could bite:
 *  - tick: an entry keeps its last touch as a u32 offset from idx->epoch.
 *    When the clock gets more than 2^32 - 1 ticks past the epoch, the epoch
 *    moves up to 2^31 ticks behind the clock (kvt__rebase: O(entries) once
 *    per 2^31 or more ticks) and offsets below the new epoch become 0. So
 *    the order is exact among entries touched in the last 2^31 ticks
 *    (about 21 touches of every block of a 100M-block index); an entry
 *    untouched for longer ranks as touched at the epoch: colder than any of
 *    those, and among such entries by (freq for LFU, then) id.
 *    kvt__index_age and _coldest report epoch + offset.
 *  - pins: 14 bits in the entry (lo) and 8 in kvt_cold (hi), pins = hi *
 *    KVT_PINS_STEP + lo, kept so that hi > 0 only with lo > KVT_PINS_LOW:
 *    so lo is 0 exactly when pins is, and pin and unpin touch the cold part
 *    only when lo would pass 16383 (hi up, lo down by the step) or, with hi
 *    > 0, drop to KVT_PINS_LOW (the reverse). At most 255 * 8192 + 16383 =
 *    KVT_INDEX_MAX_PINS = 2105343; kvt__index_pin refuses (KVT_EFULL,
 *    nothing pinned) rather than overflow. The cache pins a block once per
 *    task (max_tasks <= 1048576, util/config.c) plus a store's and an SSD
 *    write's pin, so it cannot get there.
 *  - children and the heap position share one u32 (link): a candidate has
 *    no children, so link is KVT_LINK_HEAP | heap position for a candidate
 *    and the child count for anyone else. Both are below max_blocks <= 2^31,
 *    so bit 31 is free for the flag.
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

#define KVT_LINK_HEAP 0x80000000u /* link: a candidate, heap position below */

/* The part of an entry that lookups, touches, pins, the heap and payload
 * reads use: 32 bytes, so a lookup reads one cache line per block. */
typedef struct __attribute__((aligned(32))) kvt_entry {
    kvt_hash128 key;
    uint32_t tick;          /* clock at the last touch, minus idx->epoch */
    uint32_t link;          /* KVT_LINK_HEAP | heap index, or the child count */
    uint32_t payload;       /* the caller's (CPU slot) */
    uint16_t freq;          /* LFU touch count, saturating, halved by decay */
    unsigned pins_lo : 14;  /* see pins above: 0 exactly when unpinned */
    unsigned state : 2;     /* KVT_E_* */
} kvt_entry;

/* The rest, in an array of its own: eviction, insert and the tag read it. */
typedef struct __attribute__((packed, aligned(2))) kvt_cold {
    uint32_t parent;        /* entry id or KVT_INDEX_NONE; next free id when FREE */
    uint8_t tag;            /* the caller's (the store's quota owner) */
    uint8_t pins_hi;        /* see pins above */
} kvt_cold;

#define KVT_PINS_LO_MAX 16383u /* 14 bits */
#define KVT_PINS_STEP 8192u
#define KVT_PINS_LOW 4096u /* hi > 0 only with lo above this */
#define KVT_PINS_HI_MAX 255u
_Static_assert(sizeof(kvt_entry) == 32, "kvt_entry is 32 bytes: see the memory budget");
_Static_assert(sizeof(kvt_cold) == 6, "kvt_cold is 6 bytes: see the memory budget");
_Static_assert(KVT_INDEX_MAX_PINS == KVT_PINS_HI_MAX * KVT_PINS_STEP + KVT_PINS_LO_MAX,
               "the pin bound is what the split count holds");
_Static_assert(KVT_PINS_LO_MAX + 1 - KVT_PINS_STEP > KVT_PINS_LOW &&
                   KVT_PINS_LOW + KVT_PINS_STEP <= KVT_PINS_LO_MAX,
               "a carry or a borrow keeps lo above KVT_PINS_LOW and within 14 bits");

#define KVT_INDEX_MAX_BLOCKS (1u << 31)
#define KVT_HUGE_PAGE ((size_t)2 << 20)
#define KVT_TICK_WINDOW ((uint64_t)1 << 31) /* exact recency kept at a rebase */

struct kvt_index {
    kvt_entry *entries;   /* cap entries; [0, high) have been handed out */
    kvt_cold *cold;       /* cap, the same ids */
    uint32_t *table;      /* nslots slots */
    uint32_t *heap;       /* heap_len candidate ids */
    size_t entries_bytes, cold_bytes, table_bytes, heap_bytes;
    uint32_t cap;
    uint32_t nslots;
    uint32_t id_mask;     /* slot bits holding id + 1; the rest is the tag */
    uint32_t count;       /* live entries */
    uint32_t high;        /* high-water mark of entry ids */
    uint32_t free_head;   /* freed ids, chained through cold .parent */
    uint32_t heap_len;
    kvt_evict_policy policy;
    uint64_t clock;       /* advances one per touched block */
    uint64_t epoch;       /* entry ticks count from here */
    _Atomic uint64_t *shared_clock; /* instead of clock, when set */
    uint64_t decay_touches; /* LFU: touches since the last decay */
    kvt_index_observer observe; /* told of commits and removals, or NULL */
    void *observe_arg;
};

static void kvt__heapify(kvt_index *x);

/* ------------------------------------------------------------------ */
/* Ticks                                                              */
/* ------------------------------------------------------------------ */

/* Moves the epoch to KVT_TICK_WINDOW ticks before now (see the bounds
 * above): offsets shrink by the move, those older than the new epoch
 * become 0, and the heap is rebuilt (ties now go by id). */
static void kvt__rebase(kvt_index *x, uint64_t now)
{
    assert(now - x->epoch > UINT32_MAX);
    uint64_t epoch = now - KVT_TICK_WINDOW, delta = epoch - x->epoch;
    for (uint32_t id = 0; id < x->high; id++) {
        kvt_entry *e = &x->entries[id];
        e->tick = e->tick > delta ? (uint32_t)(e->tick - delta) : 0;
    }
    x->epoch = epoch;
    kvt__heapify(x);
}

/* A fresh tick for a touch, as an offset from the (maybe moved) epoch. */
static inline uint32_t kvt__stamp(kvt_index *x)
{
    uint64_t now = x->shared_clock
                       ? atomic_fetch_add_explicit(x->shared_clock, 1, memory_order_relaxed) + 1
                       : ++x->clock;
    assert(now >= x->epoch); /* a shared clock is set before the first insert */
    if (__builtin_expect(now - x->epoch > UINT32_MAX, 0)) kvt__rebase(x, now);
    return (uint32_t)(now - x->epoch);
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

/* The slot bits above id_mask that h's slot carries. */
static inline uint32_t kvt__tag(const kvt_index *x, kvt_hash128 h)
{
    return (uint32_t)(h.lo >> 32) & ~x->id_mask;
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
    uint32_t tag = kvt__tag(x, h);
    for (;;) {
        uint32_t s = x->table[i];
        if (s == 0) return KVT_INDEX_NONE;
        if ((s & ~x->id_mask) == tag) {
            uint32_t id = (s & x->id_mask) - 1;
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
    x->table[i] = kvt__tag(x, h) | (id + 1);
}

/* Removes id's slot and shifts the rest of its run back over the hole: an
 * element at j (home k) may fill the hole at i when i lies on its probe
 * path k..j, i.e. dist(k, j) >= dist(i, j). */
static void kvt__table_del(kvt_index *x, uint32_t id)
{
    uint32_t i = kvt__home(x, x->entries[id].key);
    while ((x->table[i] & x->id_mask) != id + 1) {
        assert(x->table[i] != 0);
        i = kvt__next(x, i);
    }
    for (;;) {
        uint32_t j = i;
        uint32_t s;
        for (;;) {
            j = kvt__next(x, j);
            s = x->table[j];
            if (s == 0) {
                x->table[i] = 0;
                return;
            }
            uint32_t k = kvt__home(x, x->entries[(s & x->id_mask) - 1].key);
            if (kvt__dist(x, k, j) >= kvt__dist(x, i, j)) break;
        }
        x->table[i] = s;
        i = j;
    }
}

/* ------------------------------------------------------------------ */
/* Eviction heap                                                      */
/* ------------------------------------------------------------------ */

static inline bool kvt__in_heap(const kvt_entry *e)
{
    return (e->link & KVT_LINK_HEAP) != 0;
}

static inline uint32_t kvt__children(const kvt_entry *e)
{
    return kvt__in_heap(e) ? 0 : e->link;
}

static inline bool kvt__before(const kvt_index *x, uint32_t a, uint32_t b)
{
    const kvt_entry *ea = &x->entries[a], *eb = &x->entries[b];
    if (x->policy == KVT_EVICT_LFU && ea->freq != eb->freq) return ea->freq < eb->freq;
    if (ea->tick != eb->tick) return ea->tick < eb->tick;
    return a < b; /* equal ticks only after a rebase clamped them */
}

static inline void kvt__heap_set(kvt_index *x, uint32_t pos, uint32_t id)
{
    x->heap[pos] = id;
    x->entries[id].link = KVT_LINK_HEAP | pos;
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

/* Restores the heap order after keys changed all over (decay, rebase). */
static void kvt__heapify(kvt_index *x)
{
    for (uint32_t pos = x->heap_len / 2; pos-- > 0;) kvt__sift_down(x, pos);
}

static void kvt__heap_push(kvt_index *x, uint32_t id)
{
    assert(x->entries[id].link == 0 && x->heap_len < x->cap);
    uint32_t pos = x->heap_len++;
    kvt__heap_set(x, pos, id);
    kvt__sift_up(x, pos);
}

/* Takes id out of the heap; its link becomes a child count of 0. */
static void kvt__heap_remove(kvt_index *x, uint32_t id)
{
    uint32_t pos = x->entries[id].link & ~KVT_LINK_HEAP;
    assert(kvt__in_heap(&x->entries[id]) && pos < x->heap_len && x->heap[pos] == id);
    x->entries[id].link = 0;
    uint32_t last = x->heap[--x->heap_len];
    if (pos == x->heap_len) return;
    kvt__heap_set(x, pos, last);
    kvt__sift_up(x, pos);
    kvt__sift_down(x, x->entries[last].link & ~KVT_LINK_HEAP);
}

/* Makes id a candidate if it now qualifies (READY, unpinned, no children). */
static void kvt__maybe_candidate(kvt_index *x, uint32_t id)
{
    const kvt_entry *e = &x->entries[id];
    if (e->state == KVT_E_READY && e->pins_lo == 0 && e->link == 0) kvt__heap_push(x, id);
}

/* LFU aging: halve every count, then restore the heap order (halving can
 * turn (freq, tick) order around for counts that become equal). */
static void kvt__decay(kvt_index *x)
{
    for (uint32_t id = 0; id < x->high; id++)
        if (x->entries[id].state != KVT_E_FREE) x->entries[id].freq >>= 1;
    kvt__heapify(x);
    x->decay_touches = 0;
}

/* ------------------------------------------------------------------ */
/* Pins (the split count: see the bounds above)                       */
/* ------------------------------------------------------------------ */

/* One more pin on id; false (nothing changed) at KVT_INDEX_MAX_PINS. */
static inline bool kvt__pins_inc(kvt_index *x, uint32_t id)
{
    kvt_entry *e = &x->entries[id];
    if (e->pins_lo < KVT_PINS_LO_MAX) {
        e->pins_lo++;
        return true;
    }
    kvt_cold *c = &x->cold[id];
    if (c->pins_hi == KVT_PINS_HI_MAX) return false;
    c->pins_hi++;
    e->pins_lo = KVT_PINS_LO_MAX + 1 - KVT_PINS_STEP;
    return true;
}

/* One pin less on id (it has one); returns pins_lo, 0 when none are left. */
static inline uint32_t kvt__pins_dec(kvt_index *x, uint32_t id)
{
    kvt_entry *e = &x->entries[id];
    assert(e->pins_lo > 0);
    if (e->pins_lo == KVT_PINS_LOW + 1 && x->cold[id].pins_hi > 0) {
        x->cold[id].pins_hi--;
        e->pins_lo = KVT_PINS_LOW + KVT_PINS_STEP;
    } else {
        e->pins_lo--;
    }
    return e->pins_lo;
}

/* ------------------------------------------------------------------ */
/* Entries                                                            */
/* ------------------------------------------------------------------ */

static uint32_t kvt__entry_alloc(kvt_index *x)
{
    uint32_t id;
    if (x->free_head != KVT_INDEX_NONE) {
        id = x->free_head;
        x->free_head = x->cold[id].parent;
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
    x->cold[id].parent = x->free_head;
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
    assert(e->link == 0); /* no children, not in the heap */
    /* Only what was announced leaves: a PENDING entry never was. */
    if (x->observe && e->state == KVT_E_READY) x->observe(x->observe_arg, KVT_INDEX_REMOVED, x, &id, 1);
    uint32_t parent = x->cold[id].parent;
    kvt__table_del(x, id);
    kvt__entry_free(x, id);
    if (parent != KVT_INDEX_NONE) {
        kvt_entry *p = &x->entries[parent];
        assert(p->state != KVT_E_FREE && !kvt__in_heap(p) && p->link > 0);
        if (--p->link == 0) kvt__maybe_candidate(x, parent);
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
    kvt__index_age(idx, idx->heap[0], freq, tick);
    return true;
}

void kvt__index_age(const kvt_index *idx, uint32_t id, uint16_t *freq, uint64_t *tick)
{
    assert(kvt__live(idx, id));
    const kvt_entry *e = &idx->entries[id];
    *freq = idx->policy == KVT_EVICT_LFU ? e->freq : 0;
    *tick = idx->epoch + e->tick;
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
    return idx->cold[id].tag;
}

void kvt__index_set_tag(kvt_index *idx, uint32_t id, uint8_t tag)
{
    assert(kvt__live(idx, id));
    idx->cold[id].tag = tag;
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
    /* A slot holds id + 1 <= max_blocks in the low bits (all 32 at 2^31). */
    uint32_t id_bits = 32 - (uint32_t)__builtin_clz(max_blocks);
    x->id_mask = id_bits == 32 ? UINT32_MAX : (1u << id_bits) - 1;
    x->policy = policy;
    x->free_head = KVT_INDEX_NONE;
    x->entries_bytes = (size_t)max_blocks * sizeof(kvt_entry);
    x->cold_bytes = (size_t)max_blocks * sizeof(kvt_cold);
    x->table_bytes = (size_t)x->nslots * sizeof(uint32_t);
    x->heap_bytes = (size_t)max_blocks * sizeof(uint32_t);
    x->entries = kvt__map(x->entries_bytes); /* page aligned: 32 too */
    x->cold = kvt__map(x->cold_bytes);
    x->table = kvt__map(x->table_bytes);
    x->heap = kvt__map(x->heap_bytes);
    if (x->entries == NULL || x->cold == NULL || x->table == NULL || x->heap == NULL) {
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
    kvt__unmap(idx->cold, idx->cold_bytes);
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
    uint32_t tag = kvt__tag(x, h), j = *slot, s;
    while ((s = x->table[j]) != 0 && (s & ~x->id_mask) != tag) j = kvt__next(x, j);
    *slot = j;
    *cand = s == 0 ? KVT_INDEX_NONE : (s & x->id_mask) - 1;
    if (s != 0) __builtin_prefetch(&x->entries[*cand]);
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
        e->tick = kvt__stamp(idx);
        if (idx->policy == KVT_EVICT_LFU && e->freq < UINT16_MAX) e->freq++;
        if (kvt__in_heap(e)) kvt__sift_down(idx, e->link & ~KVT_LINK_HEAP); /* key grew */
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
    uint32_t tick = kvt__stamp(idx); /* before the entry exists: a rebase skips it */
    uint32_t id = kvt__entry_alloc(idx);
    kvt_entry *e = &idx->entries[id];
    *e = (kvt_entry){.key = h,
                     .tick = tick,
                     .link = 0,
                     .payload = payload,
                     .freq = 1,
                     .pins_lo = 1,
                     .state = KVT_E_PENDING};
    idx->cold[id] = (kvt_cold){.parent = parent, .tag = 0, .pins_hi = 0};
    kvt__table_put(idx, h, id);
    if (parent != KVT_INDEX_NONE) {
        kvt_entry *p = &idx->entries[parent];
        if (kvt__in_heap(p)) kvt__heap_remove(idx, parent); /* its first child */
        assert(p->link < KVT_LINK_HEAP - 1);
        p->link++;
    }
    if (id_out != NULL) *id_out = id;
    return KVT_OK;
}

void kvt__index_commit(kvt_index *idx, const uint32_t *ids, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        kvt_entry *e = &idx->entries[ids[i]];
        assert(kvt__live(idx, ids[i]) && e->state == KVT_E_PENDING && e->pins_lo > 0);
        e->state = KVT_E_READY;
        kvt__pins_dec(idx, ids[i]);
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

kvt_status kvt__index_pin(kvt_index *idx, const uint32_t *ids, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        kvt_entry *e = &idx->entries[ids[i]];
        assert(kvt__live(idx, ids[i]));
        if (!kvt__pins_inc(idx, ids[i])) {
            kvt__index_unpin(idx, ids, i); /* all or nothing */
            return KVT_EFULL;
        }
        if (kvt__in_heap(e)) kvt__heap_remove(idx, ids[i]); /* its first pin */
    }
    return KVT_OK;
}

void kvt__index_unpin(kvt_index *idx, const uint32_t *ids, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        assert(kvt__live(idx, ids[i]) && idx->entries[ids[i]].pins_lo > 0);
        if (kvt__pins_dec(idx, ids[i]) == 0) kvt__maybe_candidate(idx, ids[i]);
    }
}

uint32_t kvt__index_evict_ids(kvt_index *idx, uint32_t want, uint32_t *ids_out,
                              uint32_t *payloads_out)
{
    uint32_t got = 0;
    while (got < want && idx->heap_len > 0) {
        uint32_t id = idx->heap[0];
        kvt_entry *e = &idx->entries[id];
        assert(e->state == KVT_E_READY && e->pins_lo == 0);
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
    uint32_t lo = idx->entries[id].pins_lo; /* the cold part only when pinned */
    return lo == 0 ? 0 : idx->cold[id].pins_hi * KVT_PINS_STEP + lo;
}

kvt_hash128 kvt__index_key(const kvt_index *idx, uint32_t id)
{
    assert(kvt__live(idx, id));
    return idx->entries[id].key;
}

uint32_t kvt__index_parent(const kvt_index *idx, uint32_t id)
{
    assert(kvt__live(idx, id));
    return idx->cold[id].parent;
}

bool kvt__index_remove_candidate(kvt_index *idx, uint32_t id)
{
    assert(kvt__live(idx, id));
    if (!kvt__in_heap(&idx->entries[id])) return false;
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
    return sizeof *idx + idx->entries_bytes + idx->cold_bytes + idx->table_bytes + idx->heap_bytes;
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
        const kvt_cold *c = &x->cold[id];
        if (c->parent != KVT_INDEX_NONE) {
            KVT_CHECK_(kvt__live(x, c->parent)); /* a prefix never loses a block */
            children[c->parent]++;
        }
        KVT_CHECK_(c->pins_hi == 0 || e->pins_lo > KVT_PINS_LOW); /* see pins */
        bool cand = e->state == KVT_E_READY && e->pins_lo == 0 && kvt__children(e) == 0;
        KVT_CHECK_(cand == kvt__in_heap(e));
        if (cand) {
            uint32_t pos = e->link & ~KVT_LINK_HEAP;
            candidates++;
            KVT_CHECK_(pos < x->heap_len && x->heap[pos] == id);
        }
        if (e->state == KVT_E_PENDING) KVT_CHECK_(e->pins_lo > 0);
    }
    for (uint32_t id = 0; id < x->high; id++)
        if (x->entries[id].state != KVT_E_FREE)
            KVT_CHECK_(kvt__children(&x->entries[id]) == children[id]);
    KVT_CHECK_(live == x->count && candidates == x->heap_len);
    for (uint32_t pos = 1; pos < x->heap_len; pos++)
        KVT_CHECK_(!kvt__before(x, x->heap[pos], x->heap[(pos - 1) / 2]));
    uint32_t used = 0;
    for (uint32_t i = 0; i < x->nslots; i++) {
        uint32_t s = x->table[i];
        if (s == 0) continue;
        used++;
        uint32_t id = (s & x->id_mask) - 1; /* a live entry, tagged with its own hash */
        KVT_CHECK_(kvt__live(x, id) && (s & ~x->id_mask) == kvt__tag(x, x->entries[id].key));
    }
    KVT_CHECK_(used == x->count);
    uint32_t freed = 0;
    for (uint32_t f = x->free_head; f != KVT_INDEX_NONE && freed <= x->high;
         f = x->cold[f].parent)
        freed++;
    KVT_CHECK_(freed + x->count == x->high);
#undef KVT_CHECK_
done:
    free(children);
    return ok;
}
