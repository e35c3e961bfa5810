/* ops.c - the engine's calls: lookup, prepare_store, launch, wait, cancel,
 * poll. Each takes the cache mutex once; hashing happens before it. */
#include <stdlib.h>
#include <string.h>

#include "cache/cache.h"
#include "cache/quota.h"
#include "cache/tasks.h"
#include "cache/tiers.h"
#include "cuda/cuda.h"
#include "util/clock.h"

/* Requests longer than this are refused: 16 M tokens is far beyond any
 * context window and keeps every size computation inside 32 bits. */

#define KVT_REQ_ALL (KVT_REQ_INDEPENDENT_KEYS | KVT_REQ_VISIBLE_AT_END)

static kvt_status check_keys(const char *fn, const kvt_request *r, uint32_t block_tokens)
{
    KVT_CHECK_ARG((r->flags & ~KVT_REQ_ALL) == 0, "%s: req->flags is 0x%x; 0x%x "
                  "are not KVT_REQ_* bits", fn, r->flags, r->flags & ~KVT_REQ_ALL);
    KVT_CHECK_ARG(r->tokens == NULL, "%s: req->keys and req->tokens are both set; a request "
                  "names its blocks by tokens or by keys, not both", fn);
    KVT_CHECK_ARG(r->num_keys <= KVT_MAX_KEYS, "%s: num_keys is %u (at most %u)", fn,
                  r->num_keys, KVT_MAX_KEYS);
    uint64_t covered = (uint64_t)r->num_keys * block_tokens;
    KVT_CHECK_ARG(covered <= KVT_MAX_REQUEST_TOKENS, "%s: num_keys is %u, which at %u tokens per "
                  "block is %llu tokens (at most %u)", fn, r->num_keys, block_tokens,
                  (unsigned long long)covered, KVT_MAX_REQUEST_TOKENS);
    KVT_CHECK_ARG(r->num_tokens == 0 || r->num_tokens == covered, "%s: num_tokens is %u but a "
                  "keyed request covers num_keys * block_tokens = %llu tokens (give 0 or that)",
                  fn, r->num_tokens, (unsigned long long)covered);
    for (uint32_t i = 0; i < r->num_keys; i++) {
        KVT_CHECK_ARG(r->keys[i].data != NULL, "%s: req->keys[%u].data is NULL", fn, i);
        KVT_CHECK_ARG(r->keys[i].len >= 1 && r->keys[i].len <= KVT_MAX_KEY_LEN,
                      "%s: req->keys[%u].len is %u (1..%u bytes)", fn, i, r->keys[i].len,
                      KVT_MAX_KEY_LEN);
    }
    return KVT_OK;
}

kvt_status kvt__request_check(const char *fn, const kvt_request *r, uint32_t block_tokens)
{
    KVT_CHECK_NOT_NULL_AS(r, "req", fn);
    KVT_CHECK_ARG(r->ns != NULL || r->ns_len == 0, "%s: req->ns is NULL but ns_len is %u", fn,
                  r->ns_len);
    KVT_CHECK_ARG(r->ns_len <= KVT_MAX_NS_LEN, "%s: ns_len is %u (at most %u bytes)", fn,
                  r->ns_len, KVT_MAX_NS_LEN);
    if (r->keys) return check_keys(fn, r, block_tokens);
    KVT_CHECK_ARG(r->num_keys == 0, "%s: req->keys is NULL but num_keys is %u", fn, r->num_keys);
    KVT_CHECK_ARG((r->flags & ~KVT_REQ_VISIBLE_AT_END) == 0, "%s: req->flags is 0x%x, but "
                  "flags other than KVT_REQ_VISIBLE_AT_END apply to keyed requests and "
                  "req->keys is NULL", fn, r->flags);
    KVT_CHECK_ARG(r->tokens != NULL || r->num_tokens == 0, "%s: req->tokens is NULL but "
                  "num_tokens is %u", fn, r->num_tokens);
    KVT_CHECK_ARG(r->num_tokens <= KVT_MAX_REQUEST_TOKENS, "%s: num_tokens is %u (at most %u)",
                  fn, r->num_tokens, KVT_MAX_REQUEST_TOKENS);
    return KVT_OK;
}

/* Tokens the request covers: its tokens, or a block per key. */
uint32_t kvt__request_tokens(const kvt_cache *c, const kvt_request *r)
{
    return r->keys ? r->num_keys * c->cfg.block_tokens : r->num_tokens;
}

/* Hashes of the request's first max blocks (validated request). */
uint32_t kvt__request_hashes(const kvt_cache *c, const kvt_request *r, kvt_hash128 *out,
                             uint32_t max)
{
    if (r->keys && (r->flags & KVT_REQ_INDEPENDENT_KEYS))
        return kvt__key_roots(r->keys, r->num_keys, r->ns, r->ns_len, out, max);
    if (r->keys) return kvt__key_hashes(r->keys, r->num_keys, r->ns, r->ns_len, out, max);
    return kvt__block_hashes(r->tokens, r->num_tokens, c->cfg.block_tokens, r->ns, r->ns_len,
                             out, max);
}

/* Per-call scratch: one allocation per request, never per block. */
typedef struct scratch {
    kvt_hash128 *hashes;
    uint32_t *ids, *slots, *evicted;
    uint8_t owner; /* the store's quota owner (quota.h), 0 for none */
    bool uncounted; /* a peer's lookup (kvt__cache_lookup_for_peer): not this node's hit */
} scratch;

static kvt_status scratch_alloc(scratch *s, uint32_t n)
{
    size_t bytes = (size_t)n * (sizeof(kvt_hash128) + 3 * sizeof(uint32_t));
    s->hashes = malloc(bytes ? bytes : 1);
    if (!s->hashes) return kvt__fail(KVT_ENOMEM, "no memory to hash %u blocks", n);
    s->ids = (uint32_t *)(s->hashes + n);
    s->slots = s->ids + n;
    s->evicted = s->slots + n;
    return KVT_OK;
}

/* ------------------------------------------------------------------ */
/* Ending tasks                                                       */

static void count_end(kvt_cache *c, const kvt_task *t, kvt_status st)
{
    if (t->for_peer) return; /* the cluster counts what it serves */
    if (st == KVT_OK && t->state == KVT_TS_RUNNING) {
        uint64_t bytes = (uint64_t)t->num_blocks * c->block_bytes;
        if (t->launch_ns)
            kvt__lat_record(t->kind == KVT_TASK_STORE ? &c->lat_store : &c->lat_load,
                            kvt__now_ns() - t->launch_ns);
        if (t->kind == KVT_TASK_STORE) {
            c->stats.stores++;
            c->stats.stored_blocks += t->num_blocks;
            c->stats.stored_bytes += bytes;
        } else {
            c->stats.loads++;
            c->stats.loaded_blocks += t->num_blocks;
            c->stats.loaded_bytes += bytes;
        }
    } else if (st == KVT_ECANCELED) {
        c->stats.cancelled_tasks++;
    } else if (st == KVT_ETIMEDOUT && t->state == KVT_TS_PLANNED) {
        c->stats.expired_tasks++;
    } else if (st != KVT_OK) {
        c->stats.failed_tasks++;
    }
}

/* Commits or rolls back the task's index entries, then parks its result on
 * the ended list for wait or poll. A store that did not succeed leaves no
 * trace: its pending entries go and their blocks return to the pool. */
static void end_store(kvt_cache *c, kvt_task *t, kvt_status st)
{
    uint32_t r = t->num_repair, fresh = t->num_blocks - r;
    kvt__tiers_repair_end(c, t, st == KVT_OK);
    kvt__index_unpin(c->index, t->entries, r);
    if (st == KVT_OK) {
        kvt__index_commit(c->index, t->entries + r, fresh);
        kvt__tiers_committed(c, t->entries, t->num_blocks);
        return;
    }
    for (uint32_t i = r; i < t->num_blocks && !t->keep_blocks; i++)
        kvt__pool_free(c->pool, kvt__index_payload(c->index, t->entries[i]));
    kvt__index_abort(c->index, t->entries + r, fresh);
}

void kvt__cache_end_task(kvt_cache *c, kvt_task *t, kvt_status st)
{
    /* A load cut short by a lost block reports why, with the tokens that
     * did land. Any other failed load reports none: its copy failed or
     * stopped somewhere (a cancel, a bad checksum a client found), so no
     * page of it can be trusted (before, it reported every planned token,
     * which an engine took as landed). */
    bool cut = st == KVT_OK && t->bad_status != KVT_OK;
    if (cut) st = t->bad_status;
    if (st != KVT_OK && !cut && t->kind == KVT_TASK_LOAD) t->num_tokens = 0;
    st = kvt__task_status(st);
    count_end(c, t, st);
    if (t->kind == KVT_TASK_STORE) {
        end_store(c, t, st);
    } else {
        kvt__index_unpin(c->index, t->entries, t->num_pinned);
        kvt__tiers_load_ended(c, t);
    }
    t->result = st;
    t->state = KVT_TS_ENDED;
    c->in_flight--;
    kvt__list_push(&c->ended, t);
    pthread_cond_broadcast(&c->ended_cv);
}

static void on_xfer_done(kvt_xfer_task *xt, kvt_status st)
{
    kvt_task *t = xt->user;
    kvt_cache *c = t->cache;
    pthread_mutex_lock(&c->mu);
    kvt__cache_end_task(c, t, st);
    pthread_mutex_unlock(&c->mu);
}

/* Releases planned tasks whose launch never came (an engine that dropped a
 * request must not pin blocks forever). */
static void expire_plans(kvt_cache *c)
{
    uint64_t now = kvt__now_ns();
    while (c->planned.head && c->planned.head->plan_deadline_ns <= now) {
        kvt_task *t = c->planned.head;
        kvt__list_remove(&c->planned, t);
        kvt__cache_end_task(c, t, KVT_ETIMEDOUT);
    }
}

static void report(kvt_cache *c, kvt_task *t, kvt_task_result *out)
{
    kvt_task_result r = {
        .task = t->id, .kind = t->kind, .status = t->result,
        .first_token = t->first_token, .num_tokens = t->num_tokens,
        .bytes = (uint64_t)(t->num_tokens / c->cfg.block_tokens) * c->block_bytes,
    };
    *out = r;
    kvt__list_remove(&c->ended, t);
    t->reported = true;
    if (t->refs == 0) kvt__task_free(c, t);
}

static void plan(kvt_cache *c, kvt_task *t, uint32_t first_token)
{
    t->first_token = first_token;
    t->num_tokens = t->num_blocks * c->cfg.block_tokens;
    t->plan_deadline_ns = kvt__now_ns() + (uint64_t)c->cfg.plan_ttl_ms * 1000000ull;
    kvt__list_push(&c->planned, t);
}

/* ------------------------------------------------------------------ */
/* Lookup                                                             */

/* kvt__index_pin's KVT_EFULL: a block would pass KVT_INDEX_MAX_PINS. A
 * block is pinned once per task (max_tasks <= 1048576) plus a store's and
 * an SSD write's pin, so this is a bug; cheap to refuse where nothing is
 * done yet, and worth naming. */
static kvt_status pins_full(const char *fn)
{
    return kvt__fail(KVT_EFULL, "%s: a block would hold more than %u pins (the index's bound; "
                     "max_tasks keeps below it): a bug", fn, KVT_INDEX_MAX_PINS);
}

/* A load task for the k matched entries in ids, pinned; blocks without a
 * CPU copy are read back from the SSD. *out is NULL when none can load. */
static kvt_status plan_load(kvt_cache *c, const uint32_t *ids, uint32_t k, bool counted,
                            kvt_task **out)
{
    kvt_task *t = NULL;
    kvt_status st = kvt__task_new(c, KVT_TASK_LOAD, k, &t);
    if (st) return st;
    memcpy(t->entries, ids, (size_t)k * sizeof *ids);
    if (kvt__index_pin(c->index, t->entries, k) != KVT_OK) { /* nothing pinned */
        c->in_flight--;
        kvt__task_free(c, t);
        return pins_full("kvt_cache_lookup");
    }
    t->num_pinned = k;
    uint32_t usable = kvt__tiers_plan_load(c, t);
    if (usable == 0) {
        kvt__index_unpin(c->index, t->entries, k);
        kvt__tiers_load_ended(c, t);
        c->in_flight--;
        kvt__task_free(c, t);
        *out = NULL;
        return KVT_OK;
    }
    t->num_blocks = usable;
    for (uint32_t i = 0; i < usable; i++) {
        uint32_t slot = t->tmp_slots[i];
        if (slot == KVT_POOL_NONE) slot = kvt__index_payload(c->index, ids[i]);
        else if (counted) c->stats.ssd_hit_tokens += c->cfg.block_tokens;
        t->blocks[i] = kvt__pool_block(c->pool, slot);
    }
    plan(c, t, 0);
    *out = t;
    return KVT_OK;
}

static kvt_status lookup_locked(kvt_cache *c, const kvt_request *req, scratch *s, uint32_t n,
                                kvt_match *out)
{
    expire_plans(c);
    uint32_t k = kvt__index_match(c->index, s->hashes, n, s->ids, true);
    bool busy;
    k = kvt__tiers_first_lost(c, s->ids, k, &busy);
    kvt__tiers_touch(c, s->ids, k);
    if (!s->uncounted) {
        c->stats.lookups++;
        c->stats.lookup_tokens += kvt__request_tokens(c, req);
    }
    kvt_match m = {0, 0};
    kvt_task *t = NULL;
    if (k > 0) {
        kvt_status st = plan_load(c, s->ids, k, !s->uncounted, &t);
        if (st) return st;
    }
    if (t) {
        m.task = t->id;
        m.matched_tokens = t->num_tokens;
        t->for_peer = s->uncounted;
        if (!s->uncounted) c->stats.hit_tokens += t->num_tokens;
    }
    *out = m;
    return KVT_OK;
}

/* Checks req and hashes its loadable blocks into *s (one allocation per
 * request): *n of them. The last token is always computed by the engine (it
 * yields the next token's logits), so only blocks ending before it can be
 * loaded. A keyed request names complete pages only: every key may match. */
static kvt_status hash_loadable(kvt_cache *c, const char *fn, const kvt_request *req, scratch *s,
                                uint32_t *n)
{
    kvt_status st = kvt__request_check(fn, req, c->cfg.block_tokens);
    if (st) return st;
    uint32_t loadable = req->num_keys;
    if (!req->keys) loadable = req->num_tokens ? (req->num_tokens - 1) / c->cfg.block_tokens : 0;
    if ((st = scratch_alloc(s, loadable))) return st;
    *n = kvt__request_hashes(c, req, s->hashes, loadable);
    return KVT_OK;
}

static kvt_status lookup(kvt_cache *c, const char *fn, const kvt_request *req, kvt_match *out,
                        bool uncounted)
{
    kvt__clear_error();
    KVT_CHECK_NOT_NULL_AS(c, "cache", fn);
    KVT_CHECK_NOT_NULL(out, fn);
    uint64_t t0 = kvt__now_ns(); /* vDSO clock: no syscall */
    scratch s = {.uncounted = uncounted};
    uint32_t n = 0;
    kvt_status st = hash_loadable(c, fn, req, &s, &n);
    if (st) return kvt__cache_fail(c, st);
    pthread_mutex_lock(&c->mu);
    st = lookup_locked(c, req, &s, n, out);
    pthread_mutex_unlock(&c->mu);
    free(s.hashes);
    if (st) return kvt__cache_fail(c, st);
    if (!uncounted) kvt__lat_record(&c->lat_lookup, kvt__now_ns() - t0);
    return KVT_OK;
}

kvt_status kvt_cache_lookup(kvt_cache *c, const kvt_request *req, kvt_match *out)
{
    return lookup(c, "kvt_cache_lookup", req, out, false);
}

kvt_status kvt__cache_lookup_for_peer(kvt_cache *c, const kvt_request *req, kvt_match *out)
{
    return lookup(c, "kvt__cache_lookup_for_peer", req, out, true);
}

/* lookup_locked's answer without its effects: the same index walk, stopped
 * at the same lost block and at the first block a load could not take now
 * (no CPU copy, not durable on the SSD); no touch, pin, task or count. */
kvt_status kvt_cache_peek(kvt_cache *c, const kvt_request *req, uint32_t *matched_tokens)
{
    static const char fn[] = "kvt_cache_peek";
    kvt__clear_error();
    KVT_CHECK_NOT_NULL_AS(c, "cache", fn);
    KVT_CHECK_NOT_NULL_AS(matched_tokens, "matched_tokens", fn);
    scratch s = {0};
    uint32_t n = 0;
    kvt_status st = hash_loadable(c, fn, req, &s, &n);
    if (st) return kvt__cache_fail(c, st);
    pthread_mutex_lock(&c->mu);
    uint32_t k = kvt__index_match(c->index, s.hashes, n, s.ids, false);
    bool busy;
    k = kvt__tiers_first_lost(c, s.ids, k, &busy);
    k = kvt__tiers_loadable(c, s.ids, k);
    pthread_mutex_unlock(&c->mu);
    free(s.hashes);
    *matched_tokens = k * c->cfg.block_tokens;
    return KVT_OK;
}

/* ------------------------------------------------------------------ */
/* Store planning                                                     */

/* What a store of n blocks must write, given the index walk: blocks
 * [first, k) are cached but lost (re-filled), [k, n) are new; roots: each
 * new block has no parent (independent keys). */
typedef struct store_span {
    uint32_t first, k, n;
    bool nothing, roots;
} store_span;

/* Independent keys: the new run [k, n) ends before the first key after k
 * that is cached or being stored, as a chained request's would end there
 * had its prefix been stored, and before a key repeated within the run
 * (one block is inserted once). O(n - k) hash lookups, and a table of the
 * run's hashes (one allocation per request; without memory the run is key
 * k alone). */
static uint32_t roots_end(kvt_cache *c, const scratch *s, uint32_t k, uint32_t n)
{
    uint32_t size = 16;
    while (size < 2 * (n - k)) size *= 2;
    uint32_t *seen = calloc(size, sizeof *seen); /* index + 1 of a run key; 0 empty */
    if (!seen) return k + 1;
    uint32_t end = n;
    for (uint32_t j = k; j < n && end == n; j++) {
        uint32_t id, slot = (uint32_t)s->hashes[j].lo & (size - 1);
        kvt_index_stop stop;
        if (j > k && (kvt__index_probe(c->index, s->hashes + j, 1, &id, &stop) ||
                      stop == KVT_STOP_PENDING))
            end = j;
        for (; end == n && seen[slot]; slot = (slot + 1) & (size - 1))
            if (kvt__hash_eq(s->hashes[seen[slot] - 1], s->hashes[j])) end = j;
        if (end == n) seen[slot] = j + 1;
    }
    free(seen);
    return end;
}

static store_span plan_span(kvt_cache *c, scratch *s, uint32_t n, bool roots)
{
    kvt_index_stop stop;
    uint32_t k = kvt__index_probe(c->index, s->hashes, n, s->ids, &stop);
    bool busy;
    uint32_t first = kvt__tiers_first_lost(c, s->ids, k, &busy);
    store_span sp = {first, k, n, false, roots};
    /* Blocks another task is storing are not stored twice; nor is what
     * follows them, so every pending chain has a single owner. */
    if (busy) sp.k = sp.n = first;
    else if (stop == KVT_STOP_PENDING) sp.n = k;
    else if (roots && k < n) sp.n = roots_end(c, s, k, n);
    sp.nothing = sp.first == sp.n;
    return sp;
}

/* Inserts the new blocks [k, k + fresh) as PENDING after the re-filled ones. */
static kvt_status fill_store_task(kvt_cache *c, kvt_task *t, const scratch *s,
                                  const store_span *sp)
{
    uint32_t r = t->num_repair;
    for (uint32_t i = 0; i < r; i++) {
        t->entries[i] = s->ids[sp->first + i];
        kvt__index_set_tag(c->index, t->entries[i], s->owner);
        t->tmp_slots[i] = s->slots[i];
        t->blocks[i] = kvt__pool_block(c->pool, s->slots[i]);
    }
    uint32_t parent = sp->k && !sp->roots ? s->ids[sp->k - 1] : KVT_INDEX_NONE;
    for (uint32_t i = r; i < t->num_blocks; i++) {
        kvt_status st = kvt__index_insert(c->index, parent, s->hashes[sp->k + i - r], s->slots[i],
                                          &t->entries[i]);
        if (st) {
            kvt__index_abort(c->index, t->entries + r, i - r);
            return st;
        }
        kvt__index_set_tag(c->index, t->entries[i], s->owner);
        t->blocks[i] = kvt__pool_block(c->pool, s->slots[i]);
        if (!sp->roots) parent = t->entries[i];
    }
    kvt__tiers_repair_begin(c, t->entries, r);
    return KVT_OK;
}

static kvt_status prepare_locked(kvt_cache *c, scratch *s, uint32_t n, bool roots,
                                 kvt_store_plan *out)
{
    expire_plans(c);
    store_span sp = plan_span(c, s, n, roots);
    if (!sp.nothing && kvt__tiers_wait_room(c, sp.n - sp.first))
        sp = plan_span(c, s, n, roots); /* the lock was released while waiting */
    kvt_store_plan p = {0, sp.first * c->cfg.block_tokens, 0};
    if (sp.nothing) {
        *out = p;
        return KVT_OK;
    }
    /* Pin the prefix being extended (and blocks being re-filled) so making
     * room cannot evict them. */
    uint32_t pin_from = sp.first ? sp.first - 1 : 0, pinned = sp.k - pin_from;
    if (kvt__index_pin(c->index, s->ids + pin_from, pinned) != KVT_OK)
        return pins_full("kvt_cache_prepare_store"); /* nothing reserved yet */
    uint32_t repair = sp.k - sp.first;
    uint32_t got = kvt__tiers_reserve_cpu(c, sp.n - sp.first, s->slots, s->owner);
    kvt_status st = KVT_OK;
    kvt_task *t = NULL;
    /* Re-filled blocks come first: all of them, or no store at all. */
    if (got > 0 && got >= repair) st = kvt__task_new(c, KVT_TASK_STORE, got, &t);
    if (t) {
        t->num_repair = repair;
        st = fill_store_task(c, t, s, &sp);
        /* The task's own pins. Cannot fail (pins_full: max_tasks keeps every
         * block below KVT_INDEX_MAX_PINS); undoing the inserts here would not
         * be cheap. */
        if (!st) (void)kvt__index_pin(c->index, t->entries, repair);
    }
    kvt__index_unpin(c->index, s->ids + pin_from, pinned);
    if (st || !t) {
        /* Nothing was inserted or marked: the reserved slots go back. */
        for (uint32_t i = 0; i < got; i++) kvt__pool_free(c->pool, s->slots[i]);
        if (t) {
            c->in_flight--;
            kvt__task_free(c, t);
        }
        if (st) return st;
        *out = p; /* everything evictable is pinned by loads in flight: nothing now */
        return KVT_OK;
    }
    plan(c, t, sp.first * c->cfg.block_tokens);
    p.task = t->id;
    p.num_tokens = t->num_tokens;
    *out = p;
    return KVT_OK;
}

kvt_status kvt_cache_prepare_store(kvt_cache *c, const kvt_request *req, kvt_store_plan *out)
{
    static const char fn[] = "kvt_cache_prepare_store";
    kvt__clear_error();
    KVT_CHECK_NOT_NULL_AS(c, "cache", fn);
    KVT_CHECK_NOT_NULL(out, fn);
    kvt_status st = kvt__request_check(fn, req, c->cfg.block_tokens);
    if (st) return kvt__cache_fail(c, st);
    uint32_t full = kvt__request_tokens(c, req) / c->cfg.block_tokens;
    scratch s = {0};
    if ((st = scratch_alloc(&s, full))) return kvt__cache_fail(c, st);
    uint32_t n = kvt__request_hashes(c, req, s.hashes, full);
    s.owner = kvt__quota_owner(c->quota, req->ns, req->ns_len);
    pthread_mutex_lock(&c->mu);
    st = prepare_locked(c, &s, n, (req->flags & KVT_REQ_INDEPENDENT_KEYS) != 0, out);
    pthread_mutex_unlock(&c->mu);
    free(s.hashes);
    return st ? kvt__cache_fail(c, st) : KVT_OK;
}

/* ------------------------------------------------------------------ */
/* Launch                                                             */

static kvt_status find_task(kvt_cache *c, const char *fn, kvt_task_id id, kvt_task **out)
{
    kvt_task *t = kvt__task_find(c, id);
    if (!t)
        return kvt__fail(KVT_ENOTFOUND, "%s: task %llu is unknown or its result was already "
                         "reported", fn, (unsigned long long)id);
    *out = t;
    return KVT_OK;
}

static kvt_status check_pages(kvt_cache *c, const kvt_task *t, const uint32_t *pages,
                              uint32_t num_pages)
{
    static const char fn[] = "kvt_cache_launch";
    uint32_t first = t->first_token / c->geo->tokens_per_page;
    uint32_t end = first + t->num_blocks * c->pages_per_block;
    KVT_CHECK_ARG(pages != NULL, "%s: pages is NULL", fn);
    KVT_CHECK_ARG(num_pages >= end, "%s: task %llu moves tokens [%u, %u), which needs pages[0..%u) "
                  "but num_pages is %u", fn, (unsigned long long)t->id, t->first_token,
                  t->first_token + t->num_tokens, end, num_pages);
    for (uint32_t i = first; i < end; i++) {
        if (pages[i] == KVT_PAGE_SKIP && t->kind == KVT_TASK_LOAD) continue;
        KVT_CHECK_ARG(pages[i] != KVT_PAGE_SKIP, "%s: pages[%u] is KVT_PAGE_SKIP in store task "
                      "%llu; a store copies whole blocks (only a load may skip pages)", fn, i,
                      (unsigned long long)t->id);
        KVT_CHECK_ARG(pages[i] < c->map.num_pages, "%s: pages[%u] is %u but the engine "
                      "registered %u pages", fn, i, pages[i], c->map.num_pages);
    }
    return KVT_OK;
}

static kvt_status launch_locked(kvt_cache *c, kvt_task_id id, const uint32_t *pages,
                                uint32_t num_pages)
{
    static const char fn[] = "kvt_cache_launch";
    expire_plans(c);
    kvt_task *t = NULL;
    kvt_status st = find_task(c, fn, id, &t);
    if (st) return st;
    if (t->state == KVT_TS_ENDED && t->result == KVT_ETIMEDOUT && !t->launched)
        return kvt__fail(KVT_ETIMEDOUT, "%s: task %llu expired unlaunched after plan_ttl_ms "
                         "(%u ms); look it up again", fn, (unsigned long long)id,
                         c->cfg.plan_ttl_ms);
    if (t->state != KVT_TS_PLANNED)
        return kvt__fail(KVT_ESTATE, "%s: task %llu was already launched", fn,
                         (unsigned long long)id);
    if (!c->memory_registered)
        return kvt__fail(KVT_ESTATE, "%s: no engine memory registered (call "
                         "kvt_cache_register_memory first)", fn);
    if ((st = check_pages(c, t, pages, num_pages))) return st;
    uint32_t first = t->first_token / c->geo->tokens_per_page;
    memcpy(t->pages, pages + first, (size_t)t->num_blocks * c->pages_per_block * sizeof *pages);
    memset(&t->xt, 0, sizeof t->xt);
    t->xt.dir = t->kind == KVT_TASK_STORE ? KVT_XFER_GATHER : KVT_XFER_SCATTER;
    t->xt.geo = c->geo;
    t->xt.map = &c->map;
    t->xt.block_tokens = c->cfg.block_tokens;
    t->xt.num_blocks = t->num_blocks;
    t->xt.blocks = t->blocks;
    t->xt.pages = t->pages;
    t->xt.on_done = on_xfer_done;
    t->xt.user = t;
    if (c->cuda_events && t->kind == KVT_TASK_LOAD)
        t->xt.layer_events = &c->cuda_events[(size_t)(t - c->tasks) * c->geo->num_layers];
    kvt__list_remove(&c->planned, t);
    t->state = KVT_TS_RUNNING;
    t->launched = true;
    t->launch_ns = kvt__now_ns();
    st = t->kind == KVT_TASK_LOAD ? kvt__tiers_start_load(c, t) : kvt__xfer_submit(c->xfer, &t->xt);
    if (st) kvt__cache_end_task(c, t, st);
    return st;
}

kvt_status kvt_cache_launch(kvt_cache *c, kvt_task_id id, const uint32_t *pages,
                            uint32_t num_pages)
{
    kvt__clear_error();
    KVT_CHECK_NOT_NULL_AS(c, "cache", "kvt_cache_launch");
    pthread_mutex_lock(&c->mu);
    kvt_status st = launch_locked(c, id, pages, num_pages);
    pthread_mutex_unlock(&c->mu);
    return st ? kvt__cache_fail(c, st) : KVT_OK;
}

/* ------------------------------------------------------------------ */
/* Waiting, cancelling, polling                                       */

static void unref(kvt_cache *c, kvt_task *t)
{
    if (--t->refs == 0 && t->reported) kvt__task_free(c, t);
}

static kvt_status wait_locked(kvt_cache *c, const char *fn, kvt_task_id id, int64_t timeout_ms,
                              kvt_task_result *out)
{
    expire_plans(c);
    kvt_task *t = NULL;
    kvt_status st = find_task(c, fn, id, &t);
    if (st) return st;
    if (t->state == KVT_TS_PLANNED)
        return kvt__fail(KVT_ESTATE, "%s: task %llu was never launched (launch or cancel it)",
                         fn, (unsigned long long)id);
    uint64_t deadline = kvt__deadline_ns(timeout_ms);
    t->refs++; /* keeps the slot ours while the mutex is released */
    while (t->state == KVT_TS_RUNNING && !t->reported)
        if (!kvt__cond_wait_until(&c->ended_cv, &c->mu, deadline)) break;
    if (t->reported) st = kvt__fail(KVT_ENOTFOUND, "%s: task %llu was reported to another "
                                    "caller meanwhile", fn, (unsigned long long)id);
    else if (t->state != KVT_TS_ENDED)
        st = kvt__fail(KVT_ETIMEDOUT, "%s: task %llu still running after %lld ms", fn,
                       (unsigned long long)id, (long long)timeout_ms);
    else
        report(c, t, out);
    unref(c, t);
    return st;
}

/* kvt_cache_wait and kvt_cache_try_wait, their messages under fn. */
static kvt_status wait_as(const char *fn, kvt_cache *c, kvt_task_id id, int64_t timeout_ms,
                          kvt_task_result *out)
{
    kvt__clear_error();
    KVT_CHECK_NOT_NULL_AS(c, "cache", fn);
    KVT_CHECK_NOT_NULL(out, fn);
    KVT_CHECK_ARG(timeout_ms >= 0, "%s: timeout_ms is %lld; every wait needs a deadline (use 0 "
                  "to poll)", fn, (long long)timeout_ms);
    pthread_mutex_lock(&c->mu);
    kvt_status st = wait_locked(c, fn, id, timeout_ms, out);
    pthread_mutex_unlock(&c->mu);
    return st ? kvt__cache_fail(c, st) : KVT_OK;
}

kvt_status kvt_cache_wait(kvt_cache *c, kvt_task_id id, int64_t timeout_ms, kvt_task_result *out)
{
    return wait_as("kvt_cache_wait", c, id, timeout_ms, out);
}

kvt_status kvt_cache_try_wait(kvt_cache *c, kvt_task_id id, kvt_task_result *out)
{
    kvt_status st = wait_as("kvt_cache_try_wait", c, id, 0, out);
    if (st != KVT_ETIMEDOUT) return st;
    kvt__fail(KVT_EAGAIN, "kvt_cache_try_wait: task %llu is still running", (unsigned long long)id);
    return kvt__cache_fail(c, KVT_EAGAIN);
}

/* Some blocks of load `t` failed their read: no layer of it is whole, so the
 * engine must not run on it (kvt_cache_wait reports how many tokens did land).
 * Said the same way whether the load is still running or already ended. */
static kvt_status bad_read_fail(const kvt_cache *c, const kvt_task *t, const char *fn,
                                kvt_task_id id)
{
    uint32_t good_tokens = t->first_bad * c->cfg.block_tokens;
    return kvt__fail(t->bad_status, "%s: task %llu: blocks from token %u on could not be "
                     "read back (%s); only tokens [0, %u) will land; recompute the rest",
                     fn, (unsigned long long)id, good_tokens, kvt_status_name(t->bad_status),
                     good_tokens);
}

/* The checks every per-layer call on load `id` makes: the task exists, is a
 * launched load, and has this layer. `what` names what its layers carry. */
static kvt_status find_launched_load(kvt_cache *c, const char *fn, kvt_task_id id,
                                     uint32_t layer, const char *what, kvt_task **out)
{
    kvt_task *t = NULL;
    kvt_status st = find_task(c, fn, id, &t);
    if (st) return st;
    if (t->kind != KVT_TASK_LOAD)
        return kvt__fail(KVT_EINVAL, "%s: task %llu is a store; only loads have %s", fn,
                         (unsigned long long)id, what);
    if (layer >= c->geo->num_layers)
        return kvt__fail(KVT_EINVAL, "%s: layer %u is out of range (%u layers)", fn, layer,
                         c->geo->num_layers);
    if (t->state == KVT_TS_PLANNED)
        return kvt__fail(KVT_ESTATE, "%s: task %llu was never launched", fn, (unsigned long long)id);
    /* Ended unlaunched: its plan expired or was cancelled. Its result would
     * read as this wait timing out, or as a load that failed. */
    if (!t->launched)
        return kvt__fail(KVT_ESTATE, "%s: task %llu was never launched (%s before its launch)",
                         fn, (unsigned long long)id,
                         t->result == KVT_ETIMEDOUT ? "its plan expired after plan_ttl_ms"
                                                    : "it was cancelled");
    *out = t;
    return KVT_OK;
}

typedef kvt_status (*layer_waiter)(kvt_xfer *x, kvt_xfer_task *task, uint32_t layer,
                                   uint64_t deadline_ns);

/* With c->mu held (dropped while blocked): waits until layer `layer` of the
 * running load t is past `wait` (landed, or its copies enqueued). Blocks
 * read back from the SSD land before any layer moves; a failed read answers
 * as bad_read_fail, and *said tells the caller that message is final. */
static kvt_status wait_running_layer(kvt_cache *c, kvt_task *t, const char *fn, kvt_task_id id,
                                     uint32_t layer, uint64_t deadline, layer_waiter wait,
                                     bool *said)
{
    kvt_status st;
    *said = false;
    t->refs++;
    while (t->reading && kvt__cond_wait_until(&c->ended_cv, &c->mu, deadline)) {}
    if (t->reading) {
        st = KVT_ETIMEDOUT;
    } else if (t->bad_status != KVT_OK) {
        st = bad_read_fail(c, t, fn, id);
        *said = true;
    } else if (t->state == KVT_TS_ENDED) {
        st = t->result;
    } else {
        pthread_mutex_unlock(&c->mu);
        st = wait(c->xfer, &t->xt, layer, deadline);
        pthread_mutex_lock(&c->mu);
        if (st != KVT_ETIMEDOUT) st = kvt__task_status(st); /* the copy's failure, as its result */
    }
    unref(c, t);
    return st;
}

/* The message of a per-layer wait that did not succeed (`past`: what the
 * layer was waited for, "loaded" or "enqueued"). */
static kvt_status task_ended_fail(kvt_status st, const char *fn, kvt_task_id id)
{
    return kvt__fail(st, "%s: task %llu ended with %s", fn, (unsigned long long)id,
                     kvt_status_name(st));
}

static kvt_status layer_wait_fail(kvt_status st, const char *fn, kvt_task_id id, uint32_t layer,
                                  const char *past, int64_t timeout_ms)
{
    if (st == KVT_ETIMEDOUT)
        return kvt__fail(st, "%s: layer %u of task %llu not %s after %lld ms", fn, layer,
                         (unsigned long long)id, past, (long long)timeout_ms);
    return task_ended_fail(st, fn, id);
}

static kvt_status wait_layer_locked(kvt_cache *c, kvt_task_id id, uint32_t layer,
                                    int64_t timeout_ms)
{
    static const char fn[] = "kvt_cache_wait_layer";
    kvt_task *t = NULL;
    kvt_status st = find_launched_load(c, fn, id, layer, "layers", &t);
    if (st) return st;
    if (t->state == KVT_TS_ENDED) {
        if (t->result == KVT_OK) return KVT_OK;
        if (t->bad_status != KVT_OK) return bad_read_fail(c, t, fn, id);
        return task_ended_fail(t->result, fn, id);
    }
    bool said;
    st = wait_running_layer(c, t, fn, id, layer, kvt__deadline_ns(timeout_ms),
                            kvt__xfer_wait_layer, &said);
    if (st == KVT_OK || said) return st;
    return layer_wait_fail(st, fn, id, layer, "loaded", timeout_ms);
}

kvt_status kvt_cache_wait_layer(kvt_cache *c, kvt_task_id id, uint32_t layer, int64_t timeout_ms)
{
    static const char fn[] = "kvt_cache_wait_layer";
    kvt__clear_error();
    KVT_CHECK_NOT_NULL_AS(c, "cache", fn);
    KVT_CHECK_ARG(timeout_ms >= 0, "%s: timeout_ms is %lld; every wait needs a deadline", fn,
                  (long long)timeout_ms);
    pthread_mutex_lock(&c->mu);
    kvt_status st = wait_layer_locked(c, id, layer, timeout_ms);
    pthread_mutex_unlock(&c->mu);
    return st ? kvt__cache_fail(c, st) : KVT_OK;
}

/* fn: the public function whose message this is (layer_event or
 * stream_wait_layer: each names itself). */
static kvt_status layer_event_locked(kvt_cache *c, const char *fn, kvt_task_id id,
                                     uint32_t layer, int64_t timeout_ms, void **event)
{
    if (!c->cuda_events)
        return kvt__fail(KVT_EUNSUPPORTED, "%s: the engine memory is %s; layer events exist only "
                         "for CUDA device memory (use kvt_cache_wait_layer)", fn,
                         c->memory_registered ? "host memory" : "not registered yet");
    kvt_task *t = NULL;
    kvt_status st = find_launched_load(c, fn, id, layer, "layer events", &t);
    if (st) return st;
    void **slot = &c->cuda_events[(size_t)(t - c->tasks) * c->geo->num_layers + layer];
    if (t->state == KVT_TS_ENDED) {
        if (t->result != KVT_OK) return task_ended_fail(t->result, fn, id);
        *event = *slot; /* recorded, and complete */
        return KVT_OK;
    }
    bool said;
    st = wait_running_layer(c, t, fn, id, layer, kvt__deadline_ns(timeout_ms),
                            kvt__xfer_wait_recorded, &said);
    /* Still under c->mu since the wait: the slot is this task's. */
    if (st == KVT_OK) *event = *slot;
    if (st == KVT_OK || said) return st;
    return layer_wait_fail(st, fn, id, layer, "enqueued", timeout_ms);
}

kvt_status kvt_cache_layer_event(kvt_cache *c, kvt_task_id id, uint32_t layer,
                                 int64_t timeout_ms, void **event)
{
    static const char fn[] = "kvt_cache_layer_event";
    kvt__clear_error();
    KVT_CHECK_NOT_NULL_AS(c, "cache", fn);
    KVT_CHECK_NOT_NULL(event, fn);
    KVT_CHECK_ARG(timeout_ms >= 0, "%s: timeout_ms is %lld; every wait needs a deadline", fn,
                  (long long)timeout_ms);
    void *ev = NULL; /* *event written only on success (kvtier.h) */
    pthread_mutex_lock(&c->mu);
    kvt_status st = layer_event_locked(c, fn, id, layer, timeout_ms, &ev);
    pthread_mutex_unlock(&c->mu);
    if (!st) *event = ev;
    return st ? kvt__cache_fail(c, st) : KVT_OK;
}

kvt_status kvt_cache_stream_wait_layer(kvt_cache *c, kvt_task_id id, uint32_t layer,
                                       void *stream, int64_t timeout_ms)
{
    static const char fn[] = "kvt_cache_stream_wait_layer";
    kvt__clear_error();
    KVT_CHECK_NOT_NULL_AS(c, "cache", fn);
    KVT_CHECK_ARG(timeout_ms >= 0, "%s: timeout_ms is %lld; every wait needs a deadline", fn,
                  (long long)timeout_ms);
    void *ev = NULL;
    pthread_mutex_lock(&c->mu);
    kvt_status st = layer_event_locked(c, fn, id, layer, timeout_ms, &ev);
    pthread_mutex_unlock(&c->mu);
    /* c->cuda is set once at registration, before any task exists. */
    if (!st) st = kvt__cuda_backend_stream_wait(c->cuda, fn, stream, ev);
    return st ? kvt__cache_fail(c, st) : KVT_OK;
}

kvt_status kvt_cache_cancel(kvt_cache *c, kvt_task_id id)
{
    kvt__clear_error();
    KVT_CHECK_NOT_NULL_AS(c, "cache", "kvt_cache_cancel");
    pthread_mutex_lock(&c->mu);
    kvt_task *t = NULL;
    kvt_status st = find_task(c, "kvt_cache_cancel", id, &t);
    if (!st && t->state == KVT_TS_PLANNED) {
        kvt__list_remove(&c->planned, t);
        kvt__cache_end_task(c, t, KVT_ECANCELED);
    } else if (!st && t->state == KVT_TS_RUNNING) {
        t->cancel_asked = true; /* honoured when its SSD reads land */
        if (!t->reading && !t->external) kvt__xfer_cancel(c->xfer, &t->xt);
    }
    pthread_mutex_unlock(&c->mu);
    return st ? kvt__cache_fail(c, st) : KVT_OK;
}

kvt_status kvt_cache_poll(kvt_cache *c, kvt_task_result *out, uint32_t max, uint32_t *count)
{
    static const char fn[] = "kvt_cache_poll";
    kvt__clear_error();
    KVT_CHECK_NOT_NULL_AS(c, "cache", fn);
    KVT_CHECK_NOT_NULL(count, fn);
    KVT_CHECK_ARG(out != NULL || max == 0, "%s: out is NULL but max is %u", fn, max);
    pthread_mutex_lock(&c->mu);
    expire_plans(c);
    uint32_t n = 0;
    while (n < max && c->ended.head) report(c, c->ended.head, &out[n++]);
    pthread_mutex_unlock(&c->mu);
    *count = n;
    return KVT_OK;
}

kvt_status kvt_cache_flush(kvt_cache *c, int64_t timeout_ms)
{
    static const char fn[] = "kvt_cache_flush";
    kvt__clear_error();
    KVT_CHECK_NOT_NULL_AS(c, "cache", fn);
    KVT_CHECK_ARG(timeout_ms >= 0, "%s: timeout_ms is %lld; every wait needs a deadline", fn,
                  (long long)timeout_ms);
    pthread_mutex_lock(&c->mu);
    kvt_status st = kvt__tiers_flush(c, kvt__deadline_ns(timeout_ms));
    pthread_mutex_unlock(&c->mu);
    return st ? kvt__cache_fail(c, st) : KVT_OK;
}
