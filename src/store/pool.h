/* pool.h - the CPU tier: fixed-size blocks in one prefaulted mapping.
 * Huge pages are used when the system has them (MAP_HUGETLB, else
 * transparent huge pages via madvise). The free list is an array stack made
 * at create time, so alloc/free never allocate. Not thread-safe: the cache
 * manager serialises alloc and free with its lock; block memory itself is
 * read and written by transfer workers without any lock. */
#ifndef KVT_STORE_POOL_H
#define KVT_STORE_POOL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include "kvtier.h"

#define KVT_POOL_NONE UINT32_MAX

typedef struct kvt_pool kvt_pool;

/* floor(capacity_bytes / block_bytes) blocks (at least 1, at most 2^31);
 * blocks sit kvt__pool_stride() apart, so the mapping may exceed
 * capacity_bytes by up to 4095 bytes per block when block_bytes is not a
 * multiple of 4096 (real geometries' blocks are).
 * KVT_EINVAL if capacity holds no block, KVT_ENOMEM if the mapping fails. */
kvt_status kvt__pool_create(kvt_pool **out, uint64_t capacity_bytes, uint64_t block_bytes,
                            bool try_huge_pages);
/* The same pool in a memfd mapped MAP_SHARED, so other processes can map
 * the blocks (the node server hands the fd to its clients). Block i lies at
 * offset i * stride of the fd. */
kvt_status kvt__pool_create_shared(kvt_pool **out, uint64_t capacity_bytes,
                                   uint64_t block_bytes, bool try_huge_pages);
/* A byte budget several budgeted pools draw on: the node server's one
 * cpu_capacity shared by the tiers of every geometry it serves. A budgeted
 * pool's slot has memory behind it ("backed") only while the pool holds
 * budget for it; used never exceeds limit. Thread-safe (one atomic). */
typedef struct kvt_pool_budget {
    _Atomic uint64_t used;
    uint64_t limit;
} kvt_pool_budget;
/* Charges bytes when they fit under limit (false, nothing charged, when
 * not); uncharge gives them back. Also the SSD tier's (store/ssd.h). */
bool kvt__budget_charge(kvt_pool_budget *b, uint64_t bytes);
void kvt__budget_uncharge(kvt_pool_budget *b, uint64_t bytes);

/* A shared pool of capacity_bytes of address space (its memfd is sparse:
 * nothing is prefaulted) whose slots are backed on first allocation, each
 * charging stride bytes to budget, and given back by kvt__pool_release.
 * Huge pages: shmem THP where the kernel allows (never hugetlb, whose
 * pages are reserved whole at mmap). The budget must outlive the pool. */
kvt_status kvt__pool_create_budgeted(kvt_pool **out, uint64_t capacity_bytes,
                                     uint64_t block_bytes, bool try_huge_pages,
                                     kvt_pool_budget *budget);
/* Gives up to max free backed slots' memory back to the system (a hole
 * punched in the memfd) and their bytes back to the budget; returns how
 * many. 0 for a pool without a budget. A syscall per slot: for moving
 * capacity between pools under pressure, never per transfer. */
uint32_t kvt__pool_release(kvt_pool *pool, uint32_t max);
/* Backs and maps, in this process, the n slots at byte offsets off[i] of
 * a shared pool (allocated, about to be written by this process) before
 * they are written: one madvise(MADV_POPULATE_WRITE) per run of adjacent
 * slots instead of a page fault per 4 KiB page (512 per 2 MiB block, each
 * a costly trap under a VM's shadow paging: docs/cluster.md, Performance).
 * Slots mapped here already (populated before and not punched since by
 * kvt__pool_release, or prefaulted at create) are skipped: walking their
 * page tables again cost 2-3 ms per 64 MiB. Advice only: a kernel without
 * it (before 5.14) leaves the pages to fault in. Not thread-safe for one
 * slot; distinct slots from distinct threads are fine. */
void kvt__pool_populate(kvt_pool *pool, const uint64_t *off, uint32_t n);
/* The same for one range [p, p + len) (p page-aligned) of pages that are
 * all backed already; on a kernel without MADV_POPULATE_WRITE it reads
 * one byte of each page instead (mapped, read-only, as MAP_POPULATE). */
void kvt__pool_populate_write(void *p, size_t len);
/* Slots with memory behind them (all of them without a budget). */
uint32_t kvt__pool_blocks_backed(const kvt_pool *pool);
/* Free backed slots (those kvt__pool_release can give back). */
uint32_t kvt__pool_blocks_free_backed(const kvt_pool *pool);
bool kvt__pool_budgeted(const kvt_pool *pool);

/* The memfd of a shared pool (owned by the pool), else -1. */
int kvt__pool_fd(const kvt_pool *pool);
/* Bytes of the mapping (of the memfd for a shared pool). */
uint64_t kvt__pool_map_bytes(const kvt_pool *pool);
/* Block 0's address. */
uint8_t *kvt__pool_base(const kvt_pool *pool);
void kvt__pool_destroy(kvt_pool *pool);

uint32_t kvt__pool_alloc(kvt_pool *pool); /* KVT_POOL_NONE when none is free */
void kvt__pool_free(kvt_pool *pool, uint32_t slot);

/* Byte quotas on a pool's slots by owner (the node server's tenants:
 * namespace prefixes). Every allocated slot carries an owner, 0 meaning
 * none (no quota); owner o's slots charge block_bytes each to used[o],
 * taken back when the slot is freed. Several pools may share one (the
 * server's geometries). Thread-safe (atomics); must outlive the pools. */
#define KVT_POOL_MAX_OWNERS 32u
typedef struct kvt_pool_quotas {
    uint64_t limit[KVT_POOL_MAX_OWNERS + 1]; /* bytes; [0] unused */
    _Atomic uint64_t used[KVT_POOL_MAX_OWNERS + 1];
} kvt_pool_quotas;

/* Set once, before the first allocation; NULL: none. */
void kvt__pool_set_quotas(kvt_pool *pool, kvt_pool_quotas *q);
/* kvt__pool_alloc for owner (0: none); KVT_POOL_NONE also when a block
 * more would take owner past its quota and enforce is set. */
uint32_t kvt__pool_alloc_for(kvt_pool *pool, uint8_t owner, bool enforce);
/* False when one block more would take owner past its quota. */
bool kvt__pool_quota_room(const kvt_pool *pool, uint8_t owner);
/* An allocated slot's owner, and a change of it (its charge moves). */
uint8_t kvt__pool_owner(const kvt_pool *pool, uint32_t slot);
void kvt__pool_set_owner(kvt_pool *pool, uint32_t slot, uint8_t owner);
uint8_t *kvt__pool_block(const kvt_pool *pool, uint32_t slot);
uint32_t kvt__pool_blocks_total(const kvt_pool *pool);
/* Free slots: free backed ones plus, with a budget, unbacked ones the
 * budget could back now. */
uint32_t kvt__pool_blocks_free(const kvt_pool *pool);
uint64_t kvt__pool_block_bytes(const kvt_pool *pool);
/* Distance between consecutive blocks: block_bytes rounded up to 4096, so
 * every block is page-aligned for O_DIRECT. */
uint64_t kvt__pool_stride(const kvt_pool *pool);
/* "hugetlb", "thp" or "4k": what backs the mapping. */
const char *kvt__pool_page_kind(const kvt_pool *pool);
/* Maps len bytes of the shared tier's memfd read-write at a 2 MiB aligned
 * address with MADV_HUGEPAGE, so its huge pages (hugetlb, or shmem THP) map
 * whole; populate: MAP_POPULATE. The cache and an attached client map it
 * so. MAP_FAILED (errno set) on failure; munmap(m, len) undoes it. */
void *kvt__pool_map_shared(int fd, size_t len, bool populate);

#endif
