/* xfer.h - one room's transfer between one (prefill, decode) pair, as
 * scatter/gather lists over engine memory.
 *
 * Each decode page's bytes (in page order: entries, then the page's tokens)
 * carry one XXH3-64. A DATA batch of decode pages [j0, j1) moves its bytes
 * entry-major (entry, then page, then token): both sides walk that order
 * and turn it into their own iovec list, merging adjacent pieces, so the
 * sender writes straight from its pages and the receiver reads straight
 * into its pages (no staging copy), and one entry's pages that sit side by
 * side in memory travel as one long run. */
#ifndef KVT_PD_XFER_H
#define KVT_PD_XFER_H

#include <sys/uio.h>
#include "layout/layout.h"
#include "pd/desc.h"

enum { PD_SIDE_SRC = 0, PD_SIDE_DST = 1 };

typedef struct pd_xfer {
    const pd_plan *plan;
    uint32_t prefix, ntok;  /* global tokens [prefix, ntok) move */
    const uint32_t *pages;  /* this side's page table */
    uint32_t num_pages;
    const kvt_page_map *map;
    int side;
} pd_xfer;

typedef struct pd_iovs {
    struct iovec *v;
    uint32_t n, cap;
    uint64_t bytes;
} pd_iovs;

void pd_iovs_free(pd_iovs *v);

/* Decode pages [*first, *end) that hold any moving token. */
void pd_xfer_page_range(const pd_xfer *x, uint32_t *first, uint32_t *end);
/* Payload bytes of decode page j. */
uint64_t pd_xfer_page_bytes(const pd_xfer *x, uint32_t j);
/* Builds this side's iovecs of decode pages [j0, j1), entry-major. */
kvt_status pd_xfer_iov(const pd_xfer *x, uint32_t j0, uint32_t j1, pd_iovs *out);
/* XXH3-64 of each decode page of [j0, j1) over this side's memory, in page
 * order (out[j - j0]); independent of the batch's wire order. */
void pd_xfer_hash(const pd_xfer *x, uint32_t j0, uint32_t j1, uint64_t *out);
/* One streaming XXH3 state per page of a batch, so a batch can be hashed in
 * its wire order (entry-major) a chunk at a time, just before it is sent or
 * just after it lands, while the chunk is in cache: each page is still
 * hashed over its bytes in page order (entry after entry), so the digests
 * equal pd_xfer_hash's. Grown once to the largest batch; never per chunk. */
typedef struct pd_hashes {
    void *st; /* cap XXH3_state_t, 64-byte aligned */
    uint32_t n, cap;
} pd_hashes;

void pd_hashes_free(pd_hashes *h);
/* Resets n states, one per page of a batch (state i: its i-th page);
 * grows the array only past the largest batch so far. */
kvt_status pd_hashes_begin(pd_hashes *h, uint32_t n);
/* The digest of the batch's i-th page (after all its entries were hashed). */
uint64_t pd_hashes_digest(pd_hashes *h, uint32_t i);

/* A chunk: entry e's pieces of decode pages [j, *end), at least `target`
 * bytes unless the batch ends at j1 (both sides cut the same chunks). */
uint32_t pd_xfer_chunk_end(const pd_xfer *x, uint32_t e, uint32_t j, uint32_t j1, uint64_t target);
/* Bytes of entry e in decode page j. */
uint64_t pd_xfer_entry_bytes(const pd_xfer *x, uint32_t e, uint32_t j);
/* Appends entry e's iovecs of decode pages [j0, j1) to out (the first
 * merges with out's last when adjacent in memory). */
kvt_status pd_xfer_iov_append(const pd_xfer *x, uint32_t e, uint32_t j0, uint32_t j1, pd_iovs *out);
/* Hashes entry e's pieces of decode pages [j0, j1) into h's states
 * (state j - base), from this side's memory. */
void pd_xfer_hash_entry(const pd_xfer *x, uint32_t e, uint32_t j0, uint32_t j1, uint32_t base, pd_hashes *h);
/* Entry e's pieces of pages [j0, j1) in wire order (page, then token),
 * adjacent ones merged, each passed to fn: the bytes a frame's tag covers
 * (pd/mac.h), on both sides in the same order. */
void pd_xfer_walk_entry(const pd_xfer *x, uint32_t e, uint32_t j0, uint32_t j1,
                        void (*fn)(void *arg, const uint8_t *p, size_t n), void *arg);

/* Checks a page table covers the side's tokens of [0, ntok) and indexes
 * only existing pages; KVT_EINVAL with a message (fn names the caller). */
kvt_status pd_xfer_check_pages(const pd_plan *plan, int side, uint32_t ntok, const uint32_t *pages,
                               uint32_t num_pages, uint32_t tpp, uint32_t engine_pages,
                               const char *fn);

#endif
