/* pool.c - the CPU tier's block pool (see pool.h).
 *
 * Layout: one mapping, block i at base + i * stride. stride is block_bytes
 * rounded up to 4096, so every block starts page aligned (O_DIRECT reads and
 * writes of whole blocks need 512- or 4096-byte aligned buffers) and no two
 * blocks share a page. block_bytes itself stays exact: a block is
 * block_bytes long, the tail of its stride is padding. Capacity is counted
 * in block_bytes as the header promises, so when block_bytes is not a
 * multiple of 4096 the mapping is larger than capacity_bytes by at most
 * 4095 bytes per block (real KV geometries give multiples of 4096).
 *
 * Backing, tried in order when huge pages are wanted:
 *  "hugetlb": MAP_HUGETLB with 2 MiB pages, populated at mmap time (fails at
 *             once when the system has too few reserved huge pages);
 *  "thp":     a 2 MiB aligned anonymous mapping with MADV_HUGEPAGE, when the
 *             kernel's THP mode is not "never";
 *  "4k":      plain anonymous memory.
 * Every page is touched once at create time, so no first-touch fault (which
 * runs at 1-2 GB/s here) ever lands on the transfer path.
 */
#include "store/pool.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include "util/clock.h"
#include "util/err.h"
#include "util/log.h"

#define POOL_ALIGN 4096ull
#define HUGE_2M (2ull << 20)
#define POOL_MAX_BLOCKS (1ull << 31)

struct kvt_pool {
    uint8_t *base;        /* first block */
    void *map;            /* what munmap takes */
    size_t map_bytes;
    uint64_t block_bytes; /* exact, as asked */
    uint64_t stride;      /* round_up(block_bytes, 4096) */
    uint32_t total;
    uint32_t nfree;
    uint32_t *free_stack; /* free_stack[0, nfree) are free backed slots */
    uint32_t *cold_stack; /* budgeted: cold_stack[0, ncold) are free unbacked slots */
    uint32_t ncold;
    kvt_pool_budget *budget; /* NULL: every slot backed from create */
    kvt_pool_quotas *quotas; /* NULL: owners are not charged */
    uint8_t *in_use;      /* per slot: 0 free, else 1 + its owner */
    uint8_t *mapped;      /* per slot: 1 while its pages are mapped in this process
                           * (prefaulted, or kvt__pool_populate); a punched hole
                           * (kvt__pool_release) unmaps them everywhere */
    const char *kind;
    int fd;               /* the memfd behind a shared pool, else -1 */
};

static uint64_t round_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

/* A THP sysfs mode line ("always [madvise] never"; its selected mode is
 * bracketed): usable when readable and neither off-mode is selected. A
 * NULL off2 checks only off1. The lines are well under 128 bytes. */
static bool thp_mode_usable(const char *path, const char *off1, const char *off2)
{
    FILE *f = fopen(path, "r");
    if (!f) return false;
    char buf[128] = {0};
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    return n > 0 && !strstr(buf, off1) && !(off2 && strstr(buf, off2));
}

/* THP mode "always [madvise] never": usable unless "[never]" is selected. */
static bool thp_available(void)
{
    return thp_mode_usable("/sys/kernel/mm/transparent_hugepage/enabled", "[never]", NULL);
}

#define PREFAULT_CHUNK (64ull << 20)          /* the clock is read once per chunk */
#define PREFAULT_REPORT_NS 2000000000ull      /* a progress line at most this often */

/* Touches one byte per 4 KiB page of [p, p + len) so each is faulted in
 * now: write stores a 0 (backing a page of a fresh range), a read leaves
 * the data as it is (a range that holds blocks already). */
static void touch_pages(uint8_t *p, size_t len, bool write)
{
    volatile uint8_t *v = p;
    for (size_t off = 0; off < len; off += POOL_ALIGN) {
        if (write) v[off] = 0;
        else (void)v[off];
    }
}

/* Writes one byte per 4 KiB page so the kernel backs the whole range now.
 * A large tier takes seconds (2 GiB of 4 KiB pages: 14-18 s on a VM), so
 * past 2 s an info line says how far it is every 2 s, and one says when it
 * is done: a silent start reads as a hang. */
static void prefault(uint8_t *p, size_t len)
{
    uint64_t start = kvt__now_ns(), next = start + PREFAULT_REPORT_NS;
    bool reported = false;
    for (size_t chunk = 0; chunk < len; chunk += PREFAULT_CHUNK) {
        size_t end = len - chunk < PREFAULT_CHUNK ? len : chunk + PREFAULT_CHUNK;
        touch_pages(p + chunk, end - chunk, true);
        uint64_t now = kvt__now_ns();
        if (now < next || end == len) continue;
        KVT_LOG(KVT_LOG_INFO, "CPU tier: backing its memory: %.1f of %.1f GiB (%.0f%%)",
                (double)end / (1u << 30), (double)len / (1u << 30), 100.0 * (double)end / (double)len);
        reported = true;
        next = now + PREFAULT_REPORT_NS;
    }
    if (reported)
        KVT_LOG(KVT_LOG_INFO, "CPU tier: %.1f GiB backed in %.1f s", (double)len / (1u << 30),
                (double)(kvt__now_ns() - start) / 1e9);
}

static bool map_hugetlb(kvt_pool *p, size_t need)
{
    size_t len = round_up(need, HUGE_2M);
    void *m = mmap(NULL, len, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB | MAP_POPULATE, -1, 0);
    if (m == MAP_FAILED) return false;
    p->map = m;
    p->map_bytes = len;
    p->base = m;
    p->kind = "hugetlb";
    return true;
}

/* Over-maps by 2 MiB and trims, so the blocks start on a 2 MiB boundary and
 * THP can back all of them. */
static bool map_thp(kvt_pool *p, size_t need)
{
    size_t len = round_up(need, HUGE_2M);
    if (len > SIZE_MAX - HUGE_2M) return false;
    uint8_t *m = mmap(NULL, len + HUGE_2M, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return false;
    uintptr_t start = round_up((uintptr_t)m, HUGE_2M);
    size_t head = start - (uintptr_t)m;
    size_t tail = HUGE_2M - head;
    if (head) munmap(m, head);
    if (tail) munmap((uint8_t *)start + len, tail);
    p->map = (void *)start;
    p->map_bytes = len;
    p->base = (uint8_t *)start;
    if (madvise(p->map, len, MADV_HUGEPAGE) != 0) {
        munmap(p->map, len);
        return false;
    }
    p->kind = "thp";
    prefault(p->base, len);
    return true;
}

static bool map_4k(kvt_pool *p, size_t need)
{
    void *m = mmap(NULL, need, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (m == MAP_FAILED) return false;
    p->map = m;
    p->map_bytes = need;
    p->base = m;
    p->kind = "4k";
    /* MAP_POPULATE is best effort; touching makes sure. */
    prefault(p->base, need);
    return true;
}

/* Shared memory (shmem) THP: shmem_enabled "always [within_size] advise
 * never deny force"; usable with MADV_HUGEPAGE unless never or deny. */
static bool shmem_thp_available(void)
{
    return thp_mode_usable("/sys/kernel/mm/transparent_hugepage/shmem_enabled", "[never]",
                           "[deny]");
}

void *kvt__pool_map_shared(int fd, size_t len, bool populate)
{
    /* Reserve 2 MiB more, then place the file on a 2 MiB boundary inside,
     * so huge pages of the file can be mapped whole (PMD) in every process
     * that maps it this way. */
    if (len > SIZE_MAX - HUGE_2M) return MAP_FAILED;
    uint8_t *r = mmap(NULL, len + HUGE_2M, PROT_NONE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (r == MAP_FAILED) return MAP_FAILED;
    uint8_t *start = (uint8_t *)round_up((uintptr_t)r, HUGE_2M);
    void *m = mmap(start, len, PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_FIXED | (populate ? MAP_POPULATE : 0), fd, 0);
    if (m == MAP_FAILED) {
        int e = errno;
        munmap(r, len + HUGE_2M);
        errno = e;
        return MAP_FAILED;
    }
    if (start > r) munmap(r, (size_t)(start - r));
    size_t tail = (size_t)(r + len + HUGE_2M - (start + len));
    if (tail) munmap(start + len, tail);
    (void)madvise(m, len, MADV_HUGEPAGE); /* advice: 4 KiB pages work too */
    return m;
}

/* A memfd of len bytes mapped MAP_SHARED into p (hugetlb: MFD_HUGETLB, and
 * populated, since its pages are reserved whole anyway); errno kept on
 * failure. */
static bool open_memfd(kvt_pool *p, size_t len, bool hugetlb, const char *kind)
{
    int fd = memfd_create("kvtier-cpu-tier", MFD_CLOEXEC | (hugetlb ? MFD_HUGETLB : 0));
    if (fd < 0) return false;
    void *m = MAP_FAILED;
    if (ftruncate(fd, (off_t)len) == 0) m = kvt__pool_map_shared(fd, len, hugetlb);
    if (m == MAP_FAILED) {
        int e = errno;
        close(fd);
        errno = e;
        return false;
    }
    p->fd = fd;
    p->map = m;
    p->map_bytes = len;
    p->base = m;
    p->kind = kind;
    return true;
}

/* A memfd other processes can map (the node server's CPU tier), of len
 * bytes, mapped MAP_SHARED and prefaulted. kind: "hugetlb" (MFD_HUGETLB),
 * "thp" (shmem with MADV_HUGEPAGE: huge where the kernel allows) or "4k". */
static bool map_memfd_one(kvt_pool *p, size_t len, const char *kind)
{
    bool hugetlb = !strcmp(kind, "hugetlb");
    if (!open_memfd(p, len, hugetlb, kind)) return false;
    prefault(p->base, len); /* thp: the first write of each 2 MiB allocates it huge */
    return true;
}

/* A budgeted pool's memfd: the whole size as address space, nothing backed
 * (no prefault, no populate); each slot is backed by its first write. */
static bool map_memfd_sparse(kvt_pool *p, size_t need, bool try_huge_pages)
{
    bool thp = try_huge_pages && shmem_thp_available();
    return open_memfd(p, thp ? round_up(need, HUGE_2M) : need, false, thp ? "thp" : "4k");
}

/* Huge pages when the system reserved enough of them (the mapping fails at
 * once otherwise), else shmem THP where the kernel allows it, else 4 KiB
 * pages (on a VM under shadow paging, 3-10x slower to write: docs/server.md). */
static bool map_memfd(kvt_pool *p, size_t need, bool try_huge_pages)
{
    size_t huge = round_up(need, HUGE_2M);
    if (try_huge_pages && map_memfd_one(p, huge, "hugetlb")) return true;
    if (try_huge_pages && shmem_thp_available() && map_memfd_one(p, huge, "thp")) return true;
    return map_memfd_one(p, need, "4k");
}

typedef enum pool_mode { POOL_PRIVATE, POOL_SHARED, POOL_BUDGETED } pool_mode;

static kvt_status pool_create(kvt_pool **out, uint64_t capacity_bytes, uint64_t block_bytes,
                              bool try_huge_pages, pool_mode mode)
{
    const char *fn = mode == POOL_PRIVATE  ? "kvt__pool_create"
                     : mode == POOL_SHARED ? "kvt__pool_create_shared"
                                           : "kvt__pool_create_budgeted";
    bool shared = mode != POOL_PRIVATE;
    KVT_CHECK_NOT_NULL(out, fn);
    KVT_CHECK_ARG(block_bytes > 0, "%s: block_bytes is 0", fn);
    KVT_CHECK_ARG(block_bytes <= (1ull << 40), "%s: block_bytes %llu is over 1 TiB", fn,
                  (unsigned long long)block_bytes);
    KVT_CHECK_ARG(capacity_bytes >= block_bytes,
                  "%s: capacity_bytes %llu holds no block of %llu bytes", fn,
                  (unsigned long long)capacity_bytes, (unsigned long long)block_bytes);
    uint64_t blocks = capacity_bytes / block_bytes;
    if (blocks > POOL_MAX_BLOCKS) blocks = POOL_MAX_BLOCKS;
    uint64_t stride = round_up(block_bytes, POOL_ALIGN);
    if (blocks > (uint64_t)(SIZE_MAX / 2) / stride)
        return kvt__fail(KVT_ENOMEM, "%s: %llu blocks of stride %llu overflow the address space",
                         fn, (unsigned long long)blocks, (unsigned long long)stride);
    size_t need = (size_t)(blocks * stride);

    kvt_pool *p = calloc(1, sizeof *p);
    if (!p) goto fail_nomem;
    p->block_bytes = block_bytes;
    p->stride = stride;
    p->fd = -1;
    p->total = (uint32_t)blocks;
    p->free_stack = malloc(blocks * sizeof *p->free_stack);
    p->in_use = calloc(blocks, 1);
    p->mapped = calloc(blocks, 1);
    if (!p->free_stack || !p->in_use || !p->mapped) goto fail_free;

    bool mapped = false;
    if (shared) {
        bool ok = mode == POOL_BUDGETED ? map_memfd_sparse(p, need, try_huge_pages)
                                        : map_memfd(p, need, try_huge_pages);
        if (!ok) {
            int e = errno;
            free(p->free_stack);
            free(p->in_use);
            free(p->mapped);
            free(p);
            return kvt__fail(KVT_ENOMEM, "%s: shared memory (memfd) of %zu bytes failed: %s",
                             fn, need, strerror(e));
        }
        mapped = true;
    }
    if (!mapped && try_huge_pages) mapped = map_hugetlb(p, need);
    if (!mapped && try_huge_pages && thp_available()) mapped = map_thp(p, need);
    if (!mapped) mapped = map_4k(p, need);
    if (!mapped) {
        int e = errno;
        free(p->free_stack);
        free(p->in_use);
        free(p->mapped);
        free(p);
        return kvt__fail(KVT_ENOMEM, "%s: mmap of %zu bytes (%llu blocks of %llu) failed: %s",
                         fn, need, (unsigned long long)blocks,
                         (unsigned long long)block_bytes, strerror(e));
    }
    /* Every mapping but a budgeted pool's sparse one was prefaulted here. */
    if (mode != POOL_BUDGETED) memset(p->mapped, 1, (size_t)blocks);
    /* Slot 0 on top: allocation order 0, 1, 2... (low addresses first). */
    for (uint32_t i = 0; i < p->total; i++) p->free_stack[i] = p->total - 1 - i;
    p->nfree = p->total;
    *out = p;
    return KVT_OK;

fail_free:
    free(p->free_stack);
    free(p->in_use);
    free(p->mapped);
    free(p);
fail_nomem:
    return kvt__fail(KVT_ENOMEM, "%s: out of memory for the free list of %llu blocks", fn,
                     (unsigned long long)blocks);
}

bool kvt__budget_charge(kvt_pool_budget *b, uint64_t bytes)
{
    uint64_t used = atomic_load(&b->used);
    do {
        if (used > b->limit || bytes > b->limit - used) return false;
    } while (!atomic_compare_exchange_weak(&b->used, &used, used + bytes));
    return true;
}

void kvt__budget_uncharge(kvt_pool_budget *b, uint64_t bytes)
{
    atomic_fetch_sub(&b->used, bytes);
}

kvt_status kvt__pool_create_budgeted(kvt_pool **out, uint64_t capacity_bytes,
                                     uint64_t block_bytes, bool try_huge_pages,
                                     kvt_pool_budget *budget)
{
    KVT_CHECK_NOT_NULL(budget, "kvt__pool_create_budgeted");
    KVT_CHECK_NOT_NULL(out, "kvt__pool_create_budgeted");
    kvt_pool *p = NULL;
    kvt_status st = pool_create(&p, capacity_bytes, block_bytes, try_huge_pages, POOL_BUDGETED);
    if (st) return st;
    p->cold_stack = malloc((size_t)p->total * sizeof *p->cold_stack);
    if (!p->cold_stack) {
        kvt__pool_destroy(p);
        return kvt__fail(KVT_ENOMEM, "kvt__pool_create_budgeted: out of memory for %u slots",
                         p->total);
    }
    /* Nothing backed yet: every slot is cold, slot 0 on top. */
    memcpy(p->cold_stack, p->free_stack, (size_t)p->total * sizeof *p->cold_stack);
    p->ncold = p->total;
    p->nfree = 0;
    p->budget = budget;
    *out = p;
    return KVT_OK;
}

kvt_status kvt__pool_create(kvt_pool **out, uint64_t capacity_bytes, uint64_t block_bytes,
                            bool try_huge_pages)
{
    return pool_create(out, capacity_bytes, block_bytes, try_huge_pages, POOL_PRIVATE);
}

kvt_status kvt__pool_create_shared(kvt_pool **out, uint64_t capacity_bytes,
                                   uint64_t block_bytes, bool try_huge_pages)
{
    return pool_create(out, capacity_bytes, block_bytes, try_huge_pages, POOL_SHARED);
}

int kvt__pool_fd(const kvt_pool *pool) { return pool->fd; }
uint64_t kvt__pool_map_bytes(const kvt_pool *pool) { return pool->map_bytes; }
uint8_t *kvt__pool_base(const kvt_pool *pool) { return pool->base; }

static void owner_charge(kvt_pool *pool, uint8_t owner, bool add)
{
    if (!owner || !pool->quotas) return;
    if (add) atomic_fetch_add(&pool->quotas->used[owner], pool->block_bytes);
    else atomic_fetch_sub(&pool->quotas->used[owner], pool->block_bytes);
}

void kvt__pool_destroy(kvt_pool *pool)
{
    if (!pool) return;
    munmap(pool->map, pool->map_bytes);
    if (pool->fd >= 0) close(pool->fd);
    if (pool->budget) kvt__budget_uncharge(pool->budget, (uint64_t)kvt__pool_blocks_backed(pool) * pool->stride);
    for (uint32_t i = 0; pool->quotas && i < pool->total; i++)
        if (pool->in_use[i]) owner_charge(pool, (uint8_t)(pool->in_use[i] - 1), false);
    free(pool->free_stack);
    free(pool->cold_stack);
    free(pool->in_use);
    free(pool->mapped);
    free(pool);
}

void kvt__pool_set_quotas(kvt_pool *pool, kvt_pool_quotas *q) { pool->quotas = q; }

bool kvt__pool_quota_room(const kvt_pool *pool, uint8_t owner)
{
    if (!owner || !pool->quotas || !pool->quotas->limit[owner]) return true;
    return atomic_load(&pool->quotas->used[owner]) + pool->block_bytes <=
           pool->quotas->limit[owner];
}

uint32_t kvt__pool_alloc_for(kvt_pool *pool, uint8_t owner, bool enforce)
{
    assert(owner <= KVT_POOL_MAX_OWNERS);
    if (enforce && !kvt__pool_quota_room(pool, owner)) return KVT_POOL_NONE;
    uint32_t slot;
    if (pool->nfree) slot = pool->free_stack[--pool->nfree];
    else if (pool->ncold && kvt__budget_charge(pool->budget, pool->stride))
        slot = pool->cold_stack[--pool->ncold];
    else return KVT_POOL_NONE;
    assert(!pool->in_use[slot]);
    pool->in_use[slot] = (uint8_t)(1 + owner);
    owner_charge(pool, owner, true);
    return slot;
}

uint32_t kvt__pool_alloc(kvt_pool *pool) { return kvt__pool_alloc_for(pool, 0, false); }

void kvt__pool_free(kvt_pool *pool, uint32_t slot)
{
    assert(slot < pool->total);
    assert(pool->in_use[slot] && "double free of a pool block");
    assert(pool->nfree < pool->total);
    owner_charge(pool, (uint8_t)(pool->in_use[slot] - 1), false);
    pool->in_use[slot] = 0;
    pool->free_stack[pool->nfree++] = slot;
}

uint8_t kvt__pool_owner(const kvt_pool *pool, uint32_t slot)
{
    assert(slot < pool->total && pool->in_use[slot]);
    return (uint8_t)(pool->in_use[slot] - 1);
}

void kvt__pool_set_owner(kvt_pool *pool, uint32_t slot, uint8_t owner)
{
    assert(slot < pool->total && pool->in_use[slot] && owner <= KVT_POOL_MAX_OWNERS);
    owner_charge(pool, (uint8_t)(pool->in_use[slot] - 1), false);
    pool->in_use[slot] = (uint8_t)(1 + owner);
    owner_charge(pool, owner, true);
}

uint8_t *kvt__pool_block(const kvt_pool *pool, uint32_t slot)
{
    assert(slot < pool->total);
    return pool->base + (uint64_t)slot * pool->stride;
}

uint32_t kvt__pool_blocks_total(const kvt_pool *pool) { return pool->total; }
uint32_t kvt__pool_blocks_free(const kvt_pool *pool)
{
    if (!pool->budget) return pool->nfree;
    uint64_t used = atomic_load(&pool->budget->used);
    uint64_t room = used < pool->budget->limit ? (pool->budget->limit - used) / pool->stride : 0;
    return pool->nfree + (uint32_t)(room < pool->ncold ? room : pool->ncold);
}

uint32_t kvt__pool_blocks_backed(const kvt_pool *pool) { return pool->total - pool->ncold; }
uint32_t kvt__pool_blocks_free_backed(const kvt_pool *pool) { return pool->nfree; }
bool kvt__pool_budgeted(const kvt_pool *pool) { return pool->budget != NULL; }

uint32_t kvt__pool_release(kvt_pool *pool, uint32_t max)
{
    if (!pool->budget) return 0;
    uint32_t n = 0;
    while (n < max && pool->nfree) {
        uint32_t slot = pool->free_stack[pool->nfree - 1];
        /* Punching the hole frees the pages in every process that maps the
         * memfd; a kernel that cannot keeps the slot backed and charged. */
        if (fallocate(pool->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                      (off_t)((uint64_t)slot * pool->stride), (off_t)pool->stride) != 0)
            break;
        pool->nfree--;
        pool->mapped[slot] = 0;
        pool->cold_stack[pool->ncold++] = slot;
        kvt__budget_uncharge(pool->budget, pool->stride);
        n++;
    }
    return n;
}
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14 (uapi asm-generic/mman-common.h) */
#endif

void kvt__pool_populate_write(void *p, size_t len)
{
    if (madvise(p, len, MADV_POPULATE_WRITE) == 0) return;
    touch_pages(p, len, false); /* reads: the pages hold blocks that a 0 would clobber */
}

static uint32_t slot_at(const kvt_pool *pool, uint64_t off)
{
    assert(off % pool->stride == 0 && off / pool->stride < pool->total);
    return (uint32_t)(off / pool->stride);
}

void kvt__pool_populate(kvt_pool *pool, const uint64_t *off, uint32_t n)
{
    for (uint32_t i = 0; i < n;) {
        if (pool->mapped[slot_at(pool, off[i])]) {
            i++;
            continue;
        }
        uint32_t j = i + 1;
        while (j < n && off[j] == off[j - 1] + pool->stride && !pool->mapped[slot_at(pool, off[j])])
            j++;
        /* advice: a kernel without it (before 5.14) faults the pages in as
         * they are written, which maps them all the same */
        (void)madvise(pool->base + off[i], (size_t)(off[j - 1] - off[i] + pool->block_bytes),
                      MADV_POPULATE_WRITE);
        for (uint32_t k = i; k < j; k++) pool->mapped[slot_at(pool, off[k])] = 1;
        i = j;
    }
}

uint64_t kvt__pool_block_bytes(const kvt_pool *pool) { return pool->block_bytes; }
const char *kvt__pool_page_kind(const kvt_pool *pool) { return pool->kind; }

/* Distance between consecutive blocks: block_bytes rounded up to 4096, so
 * a whole-block O_DIRECT transfer may use stride bytes (the padding is
 * part of the mapping). Not yet declared in pool.h: src/cache/tiers.c
 * calls it; the header owner adds
 *     uint64_t kvt__pool_stride(const kvt_pool *pool);  */
uint64_t kvt__pool_stride(const kvt_pool *pool) { return pool->stride; }
