/* xfer.c - canonical piece order -> iovecs, and per-page checksums. */
#include "pd/xfer.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack: no malloc per page */
#include <xxhash.h>
#include "util/err.h"
#include "util/hash.h"
#include "util/vec.h"

void pd_iovs_free(pd_iovs *v)
{
    free(v->v);
    *v = (pd_iovs){0};
}

/* First local decode token whose global index is >= g0. */
static uint32_t local_at(const pd_plan *p, uint32_t g0)
{
    return g0 > p->dcp_k ? (g0 - p->dcp_k + p->dcp_n - 1) / p->dcp_n : 0;
}

void pd_xfer_page_range(const pd_xfer *x, uint32_t *first, uint32_t *end)
{
    const pd_plan *p = x->plan;
    uint32_t lt0 = local_at(p, x->prefix), lt1 = local_at(p, x->ntok);
    if (!p->feeds || lt1 <= lt0) {
        *first = *end = 0;
        return;
    }
    *first = lt0 / p->dst_tpp;
    *end = (lt1 + p->dst_tpp - 1) / p->dst_tpp;
}

static void page_tokens(const pd_xfer *x, uint32_t j, uint32_t *a, uint32_t *b)
{
    const pd_plan *p = x->plan;
    uint32_t lt0 = local_at(p, x->prefix), lt1 = local_at(p, x->ntok);
    uint32_t s = j * p->dst_tpp, e = s + p->dst_tpp;
    *a = s > lt0 ? s : lt0;
    *b = e < lt1 ? e : lt1;
    if (*b < *a) *b = *a;
}

uint64_t pd_xfer_page_bytes(const pd_xfer *x, uint32_t j)
{
    uint32_t a, b;
    page_tokens(x, j, &a, &b);
    return (uint64_t)(b - a) * x->plan->bytes_per_token;
}

static kvt_status grow(pd_iovs *v)
{
    void *p = v->v;
    kvt_status st = kvt__grow32(&p, &v->cap, v->cap + 1, sizeof *v->v, "pd xfer: iovecs");
    v->v = p;
    return st;
}

static kvt_status push(pd_iovs *v, uint8_t *addr, uint32_t len, bool may_merge)
{
    if (may_merge && v->n > 0) {
        struct iovec *last = &v->v[v->n - 1];
        if ((uint8_t *)last->iov_base + last->iov_len == addr) {
            last->iov_len += len;
            v->bytes += len;
            return KVT_OK;
        }
    }
    if (v->n == v->cap) {
        kvt_status st = grow(v);
        if (st) return st;
    }
    v->v[v->n++] = (struct iovec){addr, len};
    v->bytes += len;
    return KVT_OK;
}

static uint8_t *piece_addr(const pd_xfer *x, const pd_slice *s, uint32_t lt)
{
    const pd_plan *p = x->plan;
    if (x->side == PD_SIDE_DST) {
        uint32_t page = x->pages[lt / p->dst_tpp];
        return kvt__token_addr(x->map, s->unit, page, lt % p->dst_tpp) + s->dst_off;
    }
    uint32_t g = lt * p->dcp_n + p->dcp_k, sl = g / p->src_n;
    uint32_t page = x->pages[sl / p->src_tpp];
    return kvt__token_addr(x->map, s->unit, page, sl % p->src_tpp) + s->src_off;
}

/* Appends entry e's pieces of pages [j0, j1), merging adjacent ones. */
static kvt_status push_entry(const pd_xfer *x, uint32_t e, uint32_t j0, uint32_t j1, pd_iovs *v)
{
    const pd_slice *s = &x->plan->slices[e];
    if (!s->len) return KVT_OK;
    for (uint32_t j = j0; j < j1; j++) {
        uint32_t a, b;
        page_tokens(x, j, &a, &b);
        for (uint32_t lt = a; lt < b; lt++) {
            kvt_status st = push(v, piece_addr(x, s, lt), s->len, true);
            if (st) return st;
        }
    }
    return KVT_OK;
}

kvt_status pd_xfer_iov_append(const pd_xfer *x, uint32_t e, uint32_t j0, uint32_t j1, pd_iovs *v)
{
    return push_entry(x, e, j0, j1, v);
}

uint64_t pd_xfer_entry_bytes(const pd_xfer *x, uint32_t e, uint32_t j)
{
    uint32_t a, b;
    page_tokens(x, j, &a, &b);
    return (uint64_t)(b - a) * x->plan->slices[e].len;
}

uint32_t pd_xfer_chunk_end(const pd_xfer *x, uint32_t e, uint32_t j, uint32_t j1, uint64_t target)
{
    for (uint64_t bytes = 0; j < j1 && bytes < target; j++) bytes += pd_xfer_entry_bytes(x, e, j);
    return j;
}

kvt_status pd_xfer_iov(const pd_xfer *x, uint32_t j0, uint32_t j1, pd_iovs *v)
{
    /* Entry-major over the batch (entry -> page -> token), merging every
     * adjacent piece: with a layout that keeps one entry's pages side by
     * side (layer-first, consecutive page ids), a batch's pages coalesce
     * into one run per entry, long enough to go zero-copy on both ends. */
    v->n = 0;
    v->bytes = 0;
    for (uint32_t e = 0; e < x->plan->num_slices; e++) {
        kvt_status st = push_entry(x, e, j0, j1, v);
        if (st) return st;
    }
    return KVT_OK;
}

/* XXH3-64 streaming: the AVX2 build (util/hash_avx2.c) when the CPU has
 * AVX2, else libxxhash. Both give the same values. */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
static bool use_avx2(void) { return kvt__hash_avx2(); }
#define H_RESET(s) (avx2 ? kvt__xxh3_avx2_reset(s) : (void)XXH3_64bits_reset(s))
#define H_UPDATE(s, p, n) (avx2 ? kvt__xxh3_avx2_update(s, p, n) : (void)XXH3_64bits_update(s, p, n))
#define H_DIGEST(s) (avx2 ? kvt__xxh3_avx2_digest(s) : XXH3_64bits_digest(s))
#else
static bool use_avx2(void) { return false; }
#define H_RESET(s) ((void)XXH3_64bits_reset(s))
#define H_UPDATE(s, p, n) ((void)XXH3_64bits_update(s, p, n))
#define H_DIGEST(s) XXH3_64bits_digest(s)
#endif

void pd_xfer_hash(const pd_xfer *x, uint32_t j0, uint32_t j1, uint64_t *out)
{
    XXH3_state_t st;
    bool avx2 = use_avx2();
    (void)avx2;
    for (uint32_t j = j0; j < j1; j++) {
        uint32_t a, b;
        page_tokens(x, j, &a, &b);
        H_RESET(&st);
        const uint8_t *run = NULL; /* adjacent pieces hash as one update */
        size_t rl = 0;
        for (uint32_t e = 0; e < x->plan->num_slices; e++) {
            const pd_slice *s = &x->plan->slices[e];
            if (!s->len) continue;
            for (uint32_t lt = a; lt < b; lt++) {
                const uint8_t *p = piece_addr(x, s, lt);
                if (run && run + rl == p) {
                    rl += s->len;
                    continue;
                }
                if (rl) H_UPDATE(&st, run, rl);
                run = p;
                rl = s->len;
            }
        }
        if (rl) H_UPDATE(&st, run, rl);
        out[j - j0] = H_DIGEST(&st);
    }
}

void pd_hashes_free(pd_hashes *h)
{
    free(h->st);
    *h = (pd_hashes){0};
}

kvt_status pd_hashes_begin(pd_hashes *h, uint32_t n)
{
    if (n > h->cap) { /* doubling: a link settles at its largest batch after a few grows */
        uint32_t cap = h->cap * 2 > n ? h->cap * 2 : n;
        void *p = NULL; /* aligned: the AVX2 code loads the accumulators aligned */
        if (posix_memalign(&p, 64, (size_t)cap * sizeof(XXH3_state_t)))
            return kvt__fail(KVT_ENOMEM, "pd xfer: out of memory for %u hash states", cap);
        free(h->st);
        h->st = p;
        h->cap = cap;
    }
    bool avx2 = use_avx2();
    (void)avx2;
    XXH3_state_t *st = h->st;
    for (uint32_t i = 0; i < n; i++) H_RESET(&st[i]);
    h->n = n;
    return KVT_OK;
}

uint64_t pd_hashes_digest(pd_hashes *h, uint32_t i)
{
    bool avx2 = use_avx2();
    (void)avx2;
    return H_DIGEST(&((XXH3_state_t *)h->st)[i]);
}

void pd_xfer_hash_entry(const pd_xfer *x, uint32_t e, uint32_t j0, uint32_t j1, uint32_t base, pd_hashes *h)
{
    const pd_slice *s = &x->plan->slices[e];
    bool avx2 = use_avx2();
    (void)avx2;
    if (!s->len) return;
    for (uint32_t j = j0; j < j1; j++) {
        XXH3_state_t *st = &((XXH3_state_t *)h->st)[j - base];
        uint32_t a, b;
        page_tokens(x, j, &a, &b);
        const uint8_t *run = NULL; /* adjacent tokens hash as one update */
        size_t rl = 0;
        for (uint32_t lt = a; lt < b; lt++) {
            const uint8_t *p = piece_addr(x, s, lt);
            if (run && run + rl == p) {
                rl += s->len;
                continue;
            }
            if (rl) H_UPDATE(st, run, rl);
            run = p;
            rl = s->len;
        }
        if (rl) H_UPDATE(st, run, rl);
    }
}

void pd_xfer_walk_entry(const pd_xfer *x, uint32_t e, uint32_t j0, uint32_t j1,
                        void (*fn)(void *arg, const uint8_t *p, size_t n), void *arg)
{
    const pd_slice *s = &x->plan->slices[e];
    if (!s->len) return;
    const uint8_t *run = NULL; /* adjacent pieces go as one run */
    size_t rl = 0;
    for (uint32_t j = j0; j < j1; j++) {
        uint32_t a, b;
        page_tokens(x, j, &a, &b);
        for (uint32_t lt = a; lt < b; lt++) {
            const uint8_t *p = piece_addr(x, s, lt);
            if (run && run + rl == p) {
                rl += s->len;
                continue;
            }
            if (rl) fn(arg, run, rl);
            run = p;
            rl = s->len;
        }
    }
    if (rl) fn(arg, run, rl);
}

/* A decode page table that names one page twice would land two pages'
 * bytes in one place; a checksum taken as the first lands could then pass
 * for bytes the second overwrote. Refused (not the data path: room open). */
static kvt_status no_repeats(const uint32_t *pages, uint64_t n, uint32_t engine_pages, const char *fn)
{
    uint8_t *seen = calloc((size_t)engine_pages / 8 + 1, 1);
    if (!seen) return kvt__fail(KVT_ENOMEM, "%s: out of memory", fn);
    kvt_status st = KVT_OK;
    for (uint64_t i = 0; i < n && !st; i++) {
        uint32_t p = pages[i];
        if (seen[p / 8] & (1u << (p % 8)))
            st = kvt__fail(KVT_EINVAL, "%s: pages[%llu] is %u, which an earlier entry already names", fn,
                           (unsigned long long)i, p);
        seen[p / 8] |= (uint8_t)(1u << (p % 8));
    }
    free(seen);
    return st;
}

kvt_status pd_xfer_check_pages(const pd_plan *plan, int side, uint32_t ntok, const uint32_t *pages,
                               uint32_t num_pages, uint32_t tpp, uint32_t engine_pages,
                               const char *fn)
{
    uint32_t local = side == PD_SIDE_DST ? pd_plan_local_tokens(plan, ntok)
                     : plan->src_n == 1  ? ntok
                                         : (ntok > plan->dcp_k ? (ntok - plan->dcp_k + plan->src_n - 1) / plan->src_n : 0);
    uint64_t need = ((uint64_t)local + tpp - 1) / tpp;
    KVT_CHECK_ARG(num_pages >= need, "%s: %u pages of %u tokens cannot hold %u tokens (need %llu pages)",
                  fn, num_pages, tpp, local, (unsigned long long)need);
    /* NULL only with no pages at all: the table is copied whole, needed or not. */
    KVT_CHECK_ARG(pages != NULL || num_pages == 0, "%s: pages is NULL (num_pages %u)", fn,
                  num_pages);
    for (uint64_t i = 0; i < need; i++)
        KVT_CHECK_ARG(pages[i] < engine_pages, "%s: pages[%llu] is %u, the engine has %u pages",
                      fn, (unsigned long long)i, pages[i], engine_pages);
    return side == PD_SIDE_DST ? no_repeats(pages, need, engine_pages, fn) : KVT_OK;
}
