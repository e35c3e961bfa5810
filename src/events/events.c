/* events.c - the KV events publisher (events.h, docs/events.md). */
#include "events/events.h"

#include <msgpack.h>
#include <pthread.h>
#include <sodium.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "store/pool.h"
#include "util/err.h"
#include "util/log.h"

enum { REC_STORED = 1, REC_REMOVED = 2, REC_CLEARED = 3 };
enum { MEDIUM_CPU = 1, MEDIUM_DISK = 2 }; /* bits: a removal may leave both tiers */

/* One block's change, queued by the observer: stored into one tier
 * (medium one bit), or removed from the tiers in medium. */
typedef struct ev_rec {
    uint8_t kind, medium, has_parent;
    uint32_t block_tokens;
    kvt_hash128 key, parent;
} ev_rec;

/* Records [i, j) of a pass that make one event (those of them in medium). */
typedef struct ev_span {
    uint32_t i, j;
    uint8_t medium;
} ev_span;

/* A queue cell: a change and its turn (Vyukov's bounded queue). */
typedef struct ev_cell {
    _Atomic uint64_t seq;
    ev_rec rec;
} ev_cell;

#define QUEUE_CAP (1u << 16) /* blocks queued between two passes of the thread */
#define PASS_MAX 4096u       /* blocks per batch */
#define EVENT_MAX 512u       /* block hashes per BlockStored/BlockRemoved */
#define POLL_MS 10           /* the thread's pass period when idle */
#define REPLAY_BYTES (64u << 20) /* the replay buffer's bound, whatever buffer_steps says */
#define NAME_MAX_LEN 64         /* engine keys longer than this are published by kvtier id */
#define NAMES_MAX (1u << 20)    /* names kept at most: 88 MiB */
#define NAME_PROBES 16
#define TOK_RING (1u << 16)     /* token requests' blocks whose tokens wait for their commit */
#define TOK_BYTES (64u << 20)   /* their tokens' bytes at most (older ones go first) */
#define TOK_NIL UINT32_MAX

/* The tokens of a block a token request is storing (kvt__events_tokens),
 * until its BlockStored takes them: a ring of records, oldest reused
 * first, found by hash through chained buckets. */
typedef struct ev_tok {
    kvt_hash128 h;
    uint32_t *t; /* NULL: free */
    uint32_t n;
    uint32_t next; /* the bucket's next record */
} ev_tok;

/* How many indexes hold a block in each tier (kvt_events_config.counted):
 * open addressing, linear probing; empty when both counts are 0. */
typedef struct ev_count {
    kvt_hash128 h;
    uint32_t cpu, disk;
} ev_count;

#define COUNT_MIN_CAP 4096u

typedef struct ev_name {
    kvt_hash128 h;
    uint8_t len; /* 0: empty slot */
    uint8_t b[NAME_MAX_LEN];
} ev_name;

typedef struct replay_ent {
    uint64_t seq;
    void *payload;
    size_t len;
} replay_ent;

/* A socket file an ipc:// endpoint's bind made, removed at stop (libzmq
 * leaves it behind): by inode, so a file another process bound at the
 * same path since (a bind replaces the file) is left alone. */
typedef struct ev_ipc_file {
    char path[108]; /* sun_path's size; "" when none */
    dev_t dev;
    ino_t ino;
} ev_ipc_file;

struct kvt_events {
    void *ctx, *pub, *replay;
    ev_ipc_file ipc[2]; /* the PUB's and the replay ROUTER's */
    void *zap;                 /* with a secret: the ZAP handler (REP) */
    uint8_t client_key[32];    /* the one CURVE client key it lets in */
    _Atomic uint64_t zap_refused; /* kvt__events_stats reads it from other threads */
    uint64_t zap_logged_ns;
    char topic[256];
    size_t topic_len;
    uint32_t dp_rank;
    bool disk_tokens;      /* kvt_events_config's */
    ev_cell *q;
    _Atomic uint64_t head; /* producers */
    uint64_t tail;         /* the thread */
    replay_ent *buf;       /* buffer_steps batches, oldest at buf_first */
    uint32_t buf_cap, buf_first, buf_n;
    size_t buf_bytes; /* payload bytes kept, at most REPLAY_BYTES */
    uint64_t next_seq;
    pthread_t thread;
    atomic_bool stop;
    bool cleared_pending; /* AllBlocksCleared first */
    _Atomic uint64_t batches, events, blocks, dropped, replays;
    /* The engine's own key of each keyed block (kvt__events_name), so a
     * router that computes the engine's block hashes matches the events.
     * A block's id is a function of its namespace and its chain of keys,
     * so a name never goes stale and is never removed; past NAMES_MAX the
     * table overwrites (that block is then published by its kvtier id). */
    pthread_mutex_t names_mu;
    struct ev_name *names;
    uint32_t names_cap, names_n;
    /* Tokens of blocks being stored (kvt__events_tokens), under tok_mu;
     * allocated at the first call. */
    pthread_mutex_t tok_mu;
    ev_tok *tok;
    uint32_t *tok_bucket; /* TOK_RING heads */
    uint32_t tok_next;    /* the ring's next record to use */
    size_t tok_bytes;
    /* The publishing thread's pass: its records, each one's tokens
     * (pass_tok_n[i] at pass_tok_off[i] of pass_tok; 0: none) and events. */
    ev_rec pass[PASS_MAX];
    uint32_t pass_tok_off[PASS_MAX], pass_tok_n[PASS_MAX];
    uint32_t *pass_tok;
    size_t pass_tok_cap;
    ev_span spans[2 * PASS_MAX];
    /* counted: the publishing thread's own table (no lock); NULL with
     * counted off, or after it could not grow (then uncounted, logged). */
    bool counted;
    ev_count *cnt;
    uint32_t cnt_cap, cnt_n;
};

/* ---- the queue: many producers (each under its own cache lock), one consumer ---- */

static bool push(kvt_events *ev, const ev_rec *r)
{
    uint64_t pos = atomic_load_explicit(&ev->head, memory_order_relaxed);
    for (;;) {
        ev_cell *c = &ev->q[pos & (QUEUE_CAP - 1)];
        uint64_t seq = atomic_load_explicit(&c->seq, memory_order_acquire);
        int64_t dif = (int64_t)(seq - pos);
        if (dif == 0) {
            if (atomic_compare_exchange_weak_explicit(&ev->head, &pos, pos + 1,
                                                      memory_order_relaxed, memory_order_relaxed)) {
                c->rec = *r;
                atomic_store_explicit(&c->seq, pos + 1, memory_order_release);
                return true;
            }
        } else if (dif < 0) {
            return false; /* full */
        } else {
            pos = atomic_load_explicit(&ev->head, memory_order_relaxed);
        }
    }
}

static bool pop(kvt_events *ev, ev_rec *out)
{
    ev_cell *c = &ev->q[ev->tail & (QUEUE_CAP - 1)];
    if (atomic_load_explicit(&c->seq, memory_order_acquire) != ev->tail + 1) return false;
    *out = c->rec;
    atomic_store_explicit(&c->seq, ev->tail + QUEUE_CAP, memory_order_release);
    ev->tail++;
    return true;
}

static void queue_rec(kvt_events *ev, const ev_rec *r)
{
    if (!push(ev, r)) atomic_fetch_add(&ev->dropped, 1);
}

void kvt__events_observe(void *arg, kvt_index_event e, const kvt_index *idx, const uint32_t *ids,
                         uint32_t n)
{
    kvt_events_src *src = arg;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t id = ids[i];
        uint8_t kind = REC_STORED, media;
        switch (e) {
        case KVT_INDEX_STORED:
        case KVT_INDEX_REMOVED: /* every tier the block is in (or leaves) */
            kind = e == KVT_INDEX_STORED ? REC_STORED : REC_REMOVED;
            media = src->tiers ? src->tiers(src->tiers_arg, id)
                    : kvt__index_payload(idx, id) != KVT_POOL_NONE ? MEDIUM_CPU : MEDIUM_DISK;
            break;
        case KVT_INDEX_CPU_STORED: media = MEDIUM_CPU; break;
        case KVT_INDEX_DISK_STORED: media = MEDIUM_DISK; break;
        case KVT_INDEX_CPU_REMOVED: kind = REC_REMOVED, media = MEDIUM_CPU; break;
        case KVT_INDEX_DISK_REMOVED: kind = REC_REMOVED, media = MEDIUM_DISK; break;
        default: continue;
        }
        media &= MEDIUM_CPU | MEDIUM_DISK;
        if (!media) continue; /* in no tier (lost): announced already as it left */
        ev_rec r = {.kind = kind, .medium = media, .block_tokens = src->block_tokens,
                    .key = kvt__index_key(idx, id)};
        if (kind == REC_REMOVED) {
            queue_rec(src->ev, &r);
            continue;
        }
        uint32_t p = kvt__index_parent(idx, id);
        r.has_parent = p != KVT_INDEX_NONE;
        if (r.has_parent) r.parent = kvt__index_key(idx, p);
        for (uint8_t m = MEDIUM_CPU; m <= MEDIUM_DISK; m <<= 1) { /* one record per tier */
            if (!(media & m)) continue;
            r.medium = m;
            queue_rec(src->ev, &r);
        }
    }
}

/* ---- engine keys as block names ---- */

static uint32_t name_home(kvt_hash128 h, uint32_t cap)
{
    return (uint32_t)(h.lo ^ (h.hi >> 7)) & (cap - 1);
}

static void name_put(ev_name *t, uint32_t cap, kvt_hash128 h, const void *b, uint8_t len)
{
    uint32_t home = name_home(h, cap), j = home;
    for (uint32_t k = 0; k < NAME_PROBES; k++, j = (j + 1) & (cap - 1))
        if (!t[j].len || (t[j].h.lo == h.lo && t[j].h.hi == h.hi)) break;
    if (t[j].len && !(t[j].h.lo == h.lo && t[j].h.hi == h.hi)) j = home; /* full run: replace */
    t[j].h = h;
    t[j].len = len;
    memcpy(t[j].b, b, len);
}

/* Doubles the table while under NAMES_MAX; false when it cannot. */
static bool names_grow(kvt_events *ev)
{
    uint32_t cap = ev->names_cap ? ev->names_cap * 2 : 4096;
    if (cap > NAMES_MAX) return false;
    ev_name *t = calloc(cap, sizeof *t);
    if (!t) return false;
    for (uint32_t i = 0; i < ev->names_cap; i++)
        if (ev->names[i].len) name_put(t, cap, ev->names[i].h, ev->names[i].b, ev->names[i].len);
    free(ev->names);
    ev->names = t;
    ev->names_cap = cap;
    return true;
}

void kvt__events_name(kvt_events *ev, const kvt_hash128 *h, const kvt_key *keys, uint32_t n)
{
    if (!ev) return;
    pthread_mutex_lock(&ev->names_mu);
    for (uint32_t i = 0; i < n; i++) {
        if (!keys[i].len || keys[i].len > NAME_MAX_LEN) continue;
        if ((ev->names_n + 1) * 2 > ev->names_cap && !names_grow(ev) && !ev->names_cap) break;
        name_put(ev->names, ev->names_cap, h[i], keys[i].data, (uint8_t)keys[i].len);
        ev->names_n += ev->names_n < ev->names_cap; /* an upper bound once it replaces */
    }
    pthread_mutex_unlock(&ev->names_mu);
}

/* The engine's key of h into b (NAME_MAX_LEN bytes): its length, 0 when
 * h has none. */
static uint8_t name_of(kvt_events *ev, kvt_hash128 h, uint8_t *b)
{
    uint8_t len = 0;
    pthread_mutex_lock(&ev->names_mu);
    for (uint32_t k = 0, j = ev->names_cap ? name_home(h, ev->names_cap) : 0;
         ev->names_cap && k < NAME_PROBES && ev->names[j].len; k++, j = (j + 1) & (ev->names_cap - 1))
        if (ev->names[j].h.lo == h.lo && ev->names[j].h.hi == h.hi) {
            len = ev->names[j].len;
            memcpy(b, ev->names[j].b, len);
            break;
        }
    pthread_mutex_unlock(&ev->names_mu);
    return len;
}

/* ---- token requests' tokens, from their store to their BlockStored ---- */

static uint32_t tok_home(kvt_hash128 h)
{
    return (uint32_t)(h.lo ^ (h.hi >> 11)) & (TOK_RING - 1);
}

/* The record of h, or TOK_NIL; *prev its predecessor in the bucket. */
static uint32_t tok_find(const kvt_events *ev, kvt_hash128 h, uint32_t *prev)
{
    *prev = TOK_NIL;
    for (uint32_t k = ev->tok_bucket[tok_home(h)]; k != TOK_NIL; *prev = k, k = ev->tok[k].next)
        if (ev->tok[k].h.lo == h.lo && ev->tok[k].h.hi == h.hi) return k;
    return TOK_NIL;
}

static void tok_drop(kvt_events *ev, uint32_t k, uint32_t prev)
{
    ev_tok *t = &ev->tok[k];
    if (prev == TOK_NIL) ev->tok_bucket[tok_home(t->h)] = t->next;
    else ev->tok[prev].next = t->next;
    ev->tok_bytes -= (size_t)t->n * sizeof *t->t;
    free(t->t);
    t->t = NULL;
    t->n = 0;
}

/* Frees record k if it is used (the ring reuses it). */
static void tok_evict(kvt_events *ev, uint32_t k)
{
    uint32_t prev;
    if (ev->tok[k].t && tok_find(ev, ev->tok[k].h, &prev) == k) tok_drop(ev, k, prev);
}

static bool tok_alloc(kvt_events *ev)
{
    if (ev->tok) return true;
    ev->tok = calloc(TOK_RING, sizeof *ev->tok);
    ev->tok_bucket = malloc(TOK_RING * sizeof *ev->tok_bucket);
    if (!ev->tok || !ev->tok_bucket) {
        free(ev->tok);
        free(ev->tok_bucket);
        ev->tok = NULL;
        ev->tok_bucket = NULL;
        return false;
    }
    for (uint32_t i = 0; i < TOK_RING; i++) ev->tok_bucket[i] = TOK_NIL;
    return true;
}

void kvt__events_tokens(kvt_events *ev, const kvt_hash128 *h, const uint32_t *tokens, uint32_t n,
                        uint32_t block_tokens)
{
    size_t bytes = (size_t)block_tokens * sizeof *tokens;
    if (!ev || !n || !block_tokens || bytes > TOK_BYTES) return;
    pthread_mutex_lock(&ev->tok_mu);
    for (uint32_t i = 0; i < n && tok_alloc(ev); i++) {
        uint32_t prev;
        if (tok_find(ev, h[i], &prev) != TOK_NIL) continue; /* a block's tokens never change */
        uint32_t k = ev->tok_next;
        ev->tok_next = (k + 1) & (TOK_RING - 1);
        tok_evict(ev, k);
        /* The oldest records go until the tokens fit. */
        for (uint32_t j = ev->tok_next; ev->tok_bytes + bytes > TOK_BYTES && j != k;
             j = (j + 1) & (TOK_RING - 1))
            tok_evict(ev, j);
        uint32_t *t = malloc(bytes);
        if (!t) break; /* their BlockStored then carries no token_ids */
        memcpy(t, tokens + (size_t)i * block_tokens, bytes);
        uint32_t home = tok_home(h[i]);
        ev->tok[k] = (ev_tok){h[i], t, block_tokens, ev->tok_bucket[home]};
        ev->tok_bucket[home] = k;
        ev->tok_bytes += bytes;
    }
    pthread_mutex_unlock(&ev->tok_mu);
}

/* The pass's records' tokens: a BlockStored into the CPU tier takes the
 * tokens its store left; with disk_tokens so does the block's BlockStored
 * into the SSD tier, which then lets them go (the block's later
 * BlockStored, as a read back, carry none). */
static void take_tokens(kvt_events *ev, uint32_t n)
{
    size_t used = 0;
    pthread_mutex_lock(&ev->tok_mu);
    for (uint32_t i = 0; i < n; i++) {
        const ev_rec *r = &ev->pass[i];
        ev->pass_tok_n[i] = 0;
        uint32_t prev, k;
        bool disk = r->medium == MEDIUM_DISK;
        if (!ev->tok || r->kind != REC_STORED || (r->medium != MEDIUM_CPU && !disk) ||
            (disk && !ev->disk_tokens) || (k = tok_find(ev, r->key, &prev)) == TOK_NIL)
            continue;
        uint32_t tn = ev->tok[k].n;
        if (tn == r->block_tokens && used + tn > ev->pass_tok_cap) {
            size_t cap = ev->pass_tok_cap ? ev->pass_tok_cap : 4096;
            while (cap < used + tn) cap *= 2;
            uint32_t *b = realloc(ev->pass_tok, cap * sizeof *b);
            if (b) {
                ev->pass_tok = b;
                ev->pass_tok_cap = cap;
            }
        }
        if (tn == r->block_tokens && used + tn <= ev->pass_tok_cap) {
            memcpy(ev->pass_tok + used, ev->tok[k].t, (size_t)tn * sizeof *ev->pass_tok);
            ev->pass_tok_off[i] = (uint32_t)used;
            ev->pass_tok_n[i] = tn;
            used += tn;
        }
        if (disk || !ev->disk_tokens) tok_drop(ev, k, prev);
    }
    pthread_mutex_unlock(&ev->tok_mu);
}

/* ---- encoding: vLLM's EventBatch, array-like ---- */

/* A block as a router knows it: the engine's key when the block was stored
 * by a keyed request (bytes), else kvtier's 16-byte id. */
static void pack_hash(kvt_events *ev, msgpack_packer *pk, kvt_hash128 h)
{
    uint8_t name[NAME_MAX_LEN], len = name_of(ev, h, name);
    if (len) {
        msgpack_pack_bin(pk, len);
        msgpack_pack_bin_body(pk, name, len);
        return;
    }
    uint8_t b[16];
    for (int i = 0; i < 8; i++) {
        b[i] = (uint8_t)(h.hi >> (56 - 8 * i));
        b[8 + i] = (uint8_t)(h.lo >> (56 - 8 * i));
    }
    msgpack_pack_bin(pk, sizeof b);
    msgpack_pack_bin_body(pk, b, sizeof b);
}

static void pack_str(msgpack_packer *pk, const char *s)
{
    msgpack_pack_str(pk, strlen(s));
    msgpack_pack_str_body(pk, s, strlen(s));
}

static bool hash_eq(kvt_hash128 a, kvt_hash128 b) { return a.lo == b.lo && a.hi == b.hi; }

/* The pass's n records as events into ev->spans; returns how many. A run
 * of removals (any tiers: a router's view of one block in one tier
 * changes once in it) makes one BlockRemoved per tier; a BlockStored's
 * records share the tier, block size and whether their tokens are known,
 * each the parent of the next (vLLM's block_hashes are a chain below
 * parent_block_hash). */
static uint32_t make_spans(kvt_events *ev, uint32_t n)
{
    const ev_rec *r = ev->pass;
    uint32_t k = 0;
    for (uint32_t i = 0, j; i < n; i = j) {
        j = i + 1;
        if (r[i].kind == REC_CLEARED) {
            ev->spans[k++] = (ev_span){i, j, 0};
            continue;
        }
        if (r[i].kind == REC_REMOVED) {
            uint8_t m = r[i].medium;
            while (j < n && j - i < EVENT_MAX && r[j].kind == REC_REMOVED) m |= r[j++].medium;
            for (uint8_t b = MEDIUM_CPU; b <= MEDIUM_DISK; b <<= 1)
                if (m & b) ev->spans[k++] = (ev_span){i, j, b};
            continue;
        }
        while (j < n && j - i < EVENT_MAX && r[j].kind == REC_STORED &&
               r[j].medium == r[i].medium && r[j].block_tokens == r[i].block_tokens &&
               !ev->pass_tok_n[j] == !ev->pass_tok_n[i] && r[j].has_parent &&
               hash_eq(r[j].parent, r[j - 1].key))
            j++;
        ev->spans[k++] = (ev_span){i, j, r[i].medium};
    }
    return k;
}

/* ["BlockStored", block_hashes, parent_block_hash, token_ids, block_size,
 *  lora_id, medium, lora_name], ["BlockRemoved", block_hashes, medium],
 * ["AllBlocksCleared"]. Returns the block hashes packed. */
static uint32_t pack_event(kvt_events *ev, msgpack_packer *pk, const ev_span *sp)
{
    static const char *const medium[] = {NULL, "CPU", "DISK"};
    const ev_rec *r = ev->pass + sp->i;
    uint32_t n = sp->j - sp->i, hashes = 0;
    if (r[0].kind == REC_CLEARED) {
        msgpack_pack_array(pk, 1);
        pack_str(pk, "AllBlocksCleared");
        return 0;
    }
    bool stored = r[0].kind == REC_STORED;
    msgpack_pack_array(pk, stored ? 8 : 3);
    pack_str(pk, stored ? "BlockStored" : "BlockRemoved");
    for (uint32_t i = 0; i < n; i++) hashes += (r[i].medium & sp->medium) != 0;
    msgpack_pack_array(pk, hashes);
    for (uint32_t i = 0; i < n; i++)
        if (r[i].medium & sp->medium) pack_hash(ev, pk, r[i].key);
    if (stored) {
        if (r[0].has_parent) pack_hash(ev, pk, r[0].parent);
        else msgpack_pack_nil(pk);
        /* token_ids: the blocks' tokens when their store told them */
        const uint32_t *tn = ev->pass_tok_n + sp->i;
        uint32_t total = 0;
        for (uint32_t i = 0; i < n; i++) total += tn[i];
        msgpack_pack_array(pk, total);
        for (uint32_t i = 0; i < n; i++)
            for (uint32_t t = 0; t < tn[i]; t++)
                msgpack_pack_uint32(pk, ev->pass_tok[ev->pass_tok_off[sp->i + i] + t]);
        msgpack_pack_uint32(pk, r[0].block_tokens);
        msgpack_pack_nil(pk); /* lora_id */
    }
    pack_str(pk, medium[sp->medium]);
    if (stored) msgpack_pack_nil(pk); /* lora_name */
    return hashes;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* [ts, events, data_parallel_rank] of the pass's n records into sb.
 * Returns the events; *hashes gets the block hashes in them. */
static uint32_t pack_batch(kvt_events *ev, uint32_t n, msgpack_sbuffer *sb, uint64_t *hashes)
{
    uint32_t events = make_spans(ev, n);
    msgpack_packer pk;
    msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
    msgpack_pack_array(&pk, 3);
    msgpack_pack_double(&pk, now_s());
    msgpack_pack_array(&pk, events);
    *hashes = 0;
    for (uint32_t e = 0; e < events; e++) *hashes += pack_event(ev, &pk, &ev->spans[e]);
    msgpack_pack_uint32(&pk, ev->dp_rank);
    return events;
}

/* ---- publishing and replay ---- */

static void be64(uint8_t out[8], uint64_t v)
{
    for (int i = 0; i < 8; i++) out[i] = (uint8_t)(v >> (56 - 8 * i));
}

static void keep(kvt_events *ev, uint64_t seq, msgpack_sbuffer *sb)
{
    while (ev->buf_n && (ev->buf_n == ev->buf_cap || ev->buf_bytes + sb->size > REPLAY_BYTES)) {
        replay_ent *old = &ev->buf[ev->buf_first]; /* the oldest goes */
        ev->buf_bytes -= old->len;
        free(old->payload);
        ev->buf_first = (ev->buf_first + 1) % ev->buf_cap;
        ev->buf_n--;
    }
    replay_ent *e = &ev->buf[(ev->buf_first + ev->buf_n) % ev->buf_cap];
    e->seq = seq;
    e->len = sb->size;
    e->payload = msgpack_sbuffer_release(sb); /* sb is empty again */
    if (e->payload) {
        ev->buf_n++;
        ev->buf_bytes += e->len;
    }
}

static void publish(kvt_events *ev, uint32_t n)
{
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    uint64_t hashes;
    uint32_t events = pack_batch(ev, n, &sb, &hashes);
    uint8_t seq[8];
    uint64_t s = ev->next_seq++;
    be64(seq, s);
    /* A PUB socket drops at its high-water mark rather than block. */
    zmq_send(ev->pub, ev->topic, ev->topic_len, ZMQ_SNDMORE);
    zmq_send(ev->pub, seq, sizeof seq, ZMQ_SNDMORE);
    zmq_send(ev->pub, sb.data, sb.size, 0);
    atomic_fetch_add(&ev->batches, 1);
    atomic_fetch_add(&ev->events, events);
    atomic_fetch_add(&ev->blocks, hashes);
    keep(ev, s, &sb);
    msgpack_sbuffer_destroy(&sb);
}

kvt_status kvt__events_replay_decode(const uint8_t *p, size_t n, uint64_t *start)
{
    if (n != 8) return kvt__fail(KVT_EPROTO, "events replay: a start sequence of %zu bytes, not 8", n);
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v = v << 8 | p[i];
    *start = v;
    return KVT_OK;
}

/* One frame into buf (at most cap bytes kept); its length, -1 on error;
 * *more whether frames follow. */
static int recv_frame(void *sock, void *buf, size_t cap, bool *more)
{
    int len = zmq_recv(sock, buf, cap, ZMQ_DONTWAIT);
    int m = 0;
    size_t ml = sizeof m;
    *more = len >= 0 && zmq_getsockopt(sock, ZMQ_RCVMORE, &m, &ml) == 0 && m;
    return len;
}

/* [identity, "", start_seq] in: every kept batch from start_seq as
 * [identity, "", seq, payload], then [identity, "", -1, ""]. A malformed
 * request is read to its end and dropped. */
static void serve_replay(kvt_events *ev)
{
    uint8_t id[256], frames[3][16];
    int len[3] = {0};
    bool more = true;
    int n = 0;
    while (more) {
        uint8_t *dst = n == 0 ? id : frames[n < 3 ? n : 2];
        int l = recv_frame(ev->replay, dst, n == 0 ? sizeof id : sizeof frames[0], &more);
        if (l < 0) return;
        if (n < 3) len[n] = l;
        n++;
    }
    uint64_t start = 0;
    if (n != 3 || len[0] > (int)sizeof id || len[1] != 0 ||
        kvt__events_replay_decode(frames[2], (size_t)len[2], &start) != KVT_OK) {
        KVT_LOG(KVT_LOG_WARN, "kvtier events: a replay request of %d frames was not "
                "[identity, \"\", 8-byte start sequence]; ignored", n);
        return;
    }
    uint8_t seq[8];
    for (uint32_t i = 0; i < ev->buf_n; i++) {
        const replay_ent *e = &ev->buf[(ev->buf_first + i) % ev->buf_cap];
        if (e->seq < start) continue;
        be64(seq, e->seq);
        zmq_send(ev->replay, id, (size_t)len[0], ZMQ_SNDMORE);
        zmq_send(ev->replay, "", 0, ZMQ_SNDMORE);
        zmq_send(ev->replay, seq, sizeof seq, ZMQ_SNDMORE);
        zmq_send(ev->replay, e->payload, e->len, 0);
    }
    be64(seq, UINT64_MAX); /* -1 as 8 bytes big-endian */
    zmq_send(ev->replay, id, (size_t)len[0], ZMQ_SNDMORE);
    zmq_send(ev->replay, "", 0, ZMQ_SNDMORE);
    zmq_send(ev->replay, seq, sizeof seq, ZMQ_SNDMORE);
    zmq_send(ev->replay, "", 0, 0);
    atomic_fetch_add(&ev->replays, 1);
}

/* ZAP (ZeroMQ RFC 27): a CURVE handshake on either socket asks here;
 * only the client key derived from the secret is let in. A request is
 * [version, request id, domain, address, identity, mechanism, key]; the
 * answer [version, request id, status, text, user id, metadata]. Refusals
 * are logged at most once per 10 s (a refused SUB reconnects every 100 ms). */
static void serve_zap(kvt_events *ev)
{
    uint8_t f[7][64];
    int len[7] = {0};
    bool more = true;
    int n = 0;
    while (more) {
        int l = recv_frame(ev->zap, f[n < 7 ? n : 6], sizeof f[0], &more);
        if (l < 0) return;
        if (n < 7) len[n] = l;
        n++;
    }
    bool ok = n == 7 && len[5] == 5 && !memcmp(f[5], "CURVE", 5) && len[6] == 32 &&
              sodium_memcmp(f[6], ev->client_key, 32) == 0;
    const char *status = ok ? "200" : "400";
    const char *text = ok ? "OK" : "not the client key events_secret_file gives";
    zmq_send(ev->zap, "1.0", 3, ZMQ_SNDMORE);
    zmq_send(ev->zap, f[1], n > 1 && len[1] <= 64 ? (size_t)len[1] : 0, ZMQ_SNDMORE);
    zmq_send(ev->zap, status, 3, ZMQ_SNDMORE);
    zmq_send(ev->zap, text, strlen(text), ZMQ_SNDMORE);
    zmq_send(ev->zap, "", 0, ZMQ_SNDMORE);
    zmq_send(ev->zap, "", 0, 0);
    if (ok) return;
    uint64_t refused = atomic_fetch_add(&ev->zap_refused, 1) + 1;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    uint64_t now = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
    if (ev->zap_logged_ns && now - ev->zap_logged_ns < 10000000000ull) return;
    ev->zap_logged_ns = now;
    char addr[65] = "";
    if (n > 3 && len[3] > 0 && len[3] < 64) memcpy(addr, f[3], (size_t)len[3]);
    KVT_LOG(KVT_LOG_WARN, "kvtier events: refused a subscriber from %s (%llu so far): it did "
            "not present the client key events_secret_file gives (docs/events.md, Security)",
            addr[0] ? addr : "an unknown address", (unsigned long long)refused);
}

/* ---- counting: one stream for several indexes ---- */

static uint32_t count_home(kvt_hash128 h, uint32_t cap) { return (uint32_t)(h.lo ^ h.hi >> 7) & (cap - 1); }

static bool count_empty(const ev_count *c) { return c->cpu == 0 && c->disk == 0; }

/* The slot of h, or the empty slot where it would go. */
static uint32_t count_slot(const kvt_events *ev, kvt_hash128 h)
{
    uint32_t i = count_home(h, ev->cnt_cap);
    while (!count_empty(&ev->cnt[i]) && !hash_eq(ev->cnt[i].h, h)) i = (i + 1) & (ev->cnt_cap - 1);
    return i;
}

/* Doubles the table (at 3/4 full); false when out of memory. */
static bool count_grow(kvt_events *ev)
{
    uint32_t cap = ev->cnt_cap ? 2 * ev->cnt_cap : COUNT_MIN_CAP;
    ev_count *old = ev->cnt, *t = calloc(cap, sizeof *t);
    if (!t || cap == 0) {
        free(t);
        return false;
    }
    uint32_t old_cap = ev->cnt_cap;
    ev->cnt = t;
    ev->cnt_cap = cap;
    for (uint32_t i = 0; i < old_cap; i++)
        if (!count_empty(&old[i])) ev->cnt[count_slot(ev, old[i].h)] = old[i];
    free(old);
    return true;
}

/* Removes slot i, shifting back the entries its emptiness would hide. */
static void count_remove(kvt_events *ev, uint32_t i)
{
    uint32_t mask = ev->cnt_cap - 1;
    for (uint32_t j = (i + 1) & mask; !count_empty(&ev->cnt[j]); j = (j + 1) & mask) {
        uint32_t home = count_home(ev->cnt[j].h, ev->cnt_cap);
        /* j may move to i when its home is not within (i, j] cyclically */
        if (((j - home) & mask) >= ((j - i) & mask)) {
            ev->cnt[i] = ev->cnt[j];
            i = j;
        }
    }
    ev->cnt[i] = (ev_count){0};
    ev->cnt_n--;
}

/* Forgets every count (AllBlocksCleared, or counting given up). */
static void count_forget(kvt_events *ev)
{
    free(ev->cnt);
    ev->cnt = NULL;
    ev->cnt_cap = ev->cnt_n = 0;
}

/* Applies record r to the counts; returns the tiers whose change a router
 * should hear (r's tiers where the count went 0 -> 1 or 1 -> 0). */
static uint8_t count_apply(kvt_events *ev, const ev_rec *r)
{
    if (r->kind == REC_STORED && ev->cnt_n + 1 > ev->cnt_cap / 4 * 3 && !count_grow(ev)) {
        KVT_LOG(KVT_LOG_WARN, "events: out of memory counting %u blocks over the geometries; "
                "announcing every geometry's copies from now on", ev->cnt_n);
        count_forget(ev);
        ev->counted = false;
        return r->medium;
    }
    if (!ev->cnt) return r->medium; /* a removal before any store: nothing counted */
    uint32_t i = count_slot(ev, r->key);
    ev_count *c = &ev->cnt[i];
    if (r->kind == REC_STORED) {
        if (count_empty(c)) {
            c->h = r->key;
            ev->cnt_n++;
        }
        uint32_t *k = r->medium == MEDIUM_CPU ? &c->cpu : &c->disk;
        return (*k)++ == 0 ? r->medium : 0;
    }
    bool held = !count_empty(c);
    uint8_t heard = 0;
    for (uint8_t b = MEDIUM_CPU; b <= MEDIUM_DISK; b <<= 1) {
        if (!(r->medium & b)) continue;
        uint32_t *k = b == MEDIUM_CPU ? &c->cpu : &c->disk;
        /* one the table never saw (dropped from a full queue): say it */
        if (*k == 0 || --*k == 0) heard |= b;
    }
    if (held && count_empty(c)) count_remove(ev, i);
    return heard;
}

/* The pass's n records with what other indexes already announced taken
 * out (counted streams); returns how many are left. Counting may turn off
 * part-way (out of memory): the records after that are all kept. */
static uint32_t count_pass(kvt_events *ev, uint32_t n)
{
    uint32_t k = 0;
    for (uint32_t i = 0; i < n; i++) {
        ev_rec r = ev->pass[i];
        if (!ev->counted) {
        } else if (r.kind == REC_CLEARED) {
            count_forget(ev);
        } else if (!(r.medium = count_apply(ev, &r))) {
            continue;
        }
        ev->pass[k++] = r;
    }
    return k;
}

/* Drains the queue into batches of at most PASS_MAX blocks. */
static bool drain(kvt_events *ev)
{
    uint32_t n = 0;
    if (ev->cleared_pending) {
        ev->pass[n++] = (ev_rec){.kind = REC_CLEARED};
        ev->cleared_pending = false;
    }
    while (n < PASS_MAX && pop(ev, &ev->pass[n])) n++;
    bool full = n == PASS_MAX;
    if (ev->counted) n = count_pass(ev, n);
    take_tokens(ev, n);
    if (n) publish(ev, n);
    return full;
}

static void *events_main(void *arg)
{
    kvt_events *ev = arg;
    uint64_t stop_ns = 0;
    for (;;) {
        zmq_pollitem_t it[2];
        int n = 0;
        if (ev->replay) it[n++] = (zmq_pollitem_t){ev->replay, 0, ZMQ_POLLIN, 0};
        if (ev->zap) it[n++] = (zmq_pollitem_t){ev->zap, 0, ZMQ_POLLIN, 0};
        if (n) {
            if (zmq_poll(it, n, POLL_MS) > 0)
                for (int i = 0; i < n; i++)
                    if (it[i].revents & ZMQ_POLLIN) {
                        if (it[i].socket == ev->replay) serve_replay(ev);
                        else serve_zap(ev);
                    }
        } else {
            struct timespec ts = {0, POLL_MS * 1000000L};
            nanosleep(&ts, NULL);
        }
        while (drain(ev)) {}
        if (atomic_load(&ev->stop)) {
            struct timespec ts;
            clock_gettime(CLOCK_MONOTONIC, &ts);
            uint64_t t = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
            if (!stop_ns) stop_ns = t;
            /* What producers queued before stop is out; a second at most. */
            if (atomic_load(&ev->head) == ev->tail || t - stop_ns > 1000000000ull) break;
        }
    }
    return NULL;
}

/* ---- set-up ---- */

/* tcp://HOST:PORT with a non-empty host and a numeric port. */
static bool tcp_endpoint(const char *ep)
{
    if (strncmp(ep, "tcp://", 6)) return false;
    const char *colon = strrchr(ep + 6, ':');
    return colon && colon > ep + 6 && colon[1] && strspn(colon + 1, "0123456789") == strlen(colon + 1);
}

kvt_status kvt__events_endpoint_check(const char *ep, const char *opt, bool anywhere)
{
    static const char *const ok[] = {"tcp://127.0.0.1:", "tcp://localhost:", "tcp://[::1]:"};
    if (!strncmp(ep, "ipc://", 6) && ep[6]) return KVT_OK;
    if (anywhere && tcp_endpoint(ep)) return KVT_OK;
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        size_t l = strlen(ok[i]);
        if (!strncmp(ep, ok[i], l) && ep[l] && strspn(ep + l, "0123456789") == strlen(ep + l))
            return KVT_OK;
    }
    if (anywhere)
        return kvt__fail(KVT_EINVAL, "%s is \"%s\": give tcp://HOST:PORT or ipc://PATH", opt, ep);
    return kvt__fail(KVT_EINVAL, "%s is \"%s\": give tcp://127.0.0.1:PORT, tcp://[::1]:PORT or "
                     "ipc://PATH. The events name every block this node holds, so an endpoint "
                     "off this host needs events_secret_file (ZeroMQ CURVE; docs/events.md, "
                     "Security), or events_insecure=true for a router that cannot do CURVE",
                     opt, ep);
}

/* One Z85 key pair: the secret key BLAKE2b-256(label NUL secret). */
static bool derive_pair(const char *label, const uint8_t *secret, size_t len, char pub[41],
                        char sec[41])
{
    uint8_t sk[32];
    crypto_generichash_state st;
    crypto_generichash_init(&st, NULL, 0, sizeof sk);
    crypto_generichash_update(&st, (const uint8_t *)label, strlen(label) + 1);
    crypto_generichash_update(&st, secret, len);
    crypto_generichash_final(&st, sk, sizeof sk);
    bool ok = zmq_z85_encode(sec, sk, sizeof sk) != NULL && zmq_curve_public(pub, sec) == 0;
    sodium_memzero(sk, sizeof sk);
    return ok;
}

kvt_status kvt__events_curve_keys(const uint8_t *secret, size_t len, kvt_events_keys *out)
{
    KVT_CHECK_NOT_NULL(secret, "kvt__events_curve_keys");
    KVT_CHECK_NOT_NULL(out, "kvt__events_curve_keys");
    KVT_CHECK_ARG(len >= 16 && len <= 1024, "the events secret is %zu bytes (16..1024)", len);
    if (!zmq_has("curve"))
        return kvt__fail(KVT_ESYS, "events_secret_file: this libzmq has no CURVE (built without "
                         "libsodium)");
    if (!derive_pair("kvtier-events-server", secret, len, out->server_public, out->server_secret) ||
        !derive_pair("kvtier-events-client", secret, len, out->client_public, out->client_secret))
        return kvt__fail(KVT_ESYS, "events_secret_file: libzmq could not make the CURVE keys");
    return KVT_OK;
}

/* A CURVE server socket whose handshakes go to the ZAP handler. */
static kvt_status curve_server(void *s, const kvt_events_keys *k, const char *opt)
{
    int one = 1;
    if (zmq_setsockopt(s, ZMQ_CURVE_SERVER, &one, sizeof one) != 0 ||
        zmq_setsockopt(s, ZMQ_CURVE_SECRETKEY, k->server_secret, 40) != 0 ||
        zmq_setsockopt(s, ZMQ_ZAP_DOMAIN, "kvtier-events", 13) != 0)
        return kvt__fail(KVT_ESYS, "%s: CURVE: %s", opt, zmq_strerror(zmq_errno()));
    return KVT_OK;
}

/* Remembers the socket file ep's bind made, when ep is ipc://. */
static void ipc_remember(ev_ipc_file *f, const char *ep)
{
    struct stat sb;
    if (strncmp(ep, "ipc://", 6) || strlen(ep + 6) >= sizeof f->path || stat(ep + 6, &sb))
        return;
    memcpy(f->path, ep + 6, strlen(ep + 6) + 1);
    f->dev = sb.st_dev;
    f->ino = sb.st_ino;
}

static void ipc_remove(const ev_ipc_file *f)
{
    struct stat sb;
    if (f->path[0] && !stat(f->path, &sb) && sb.st_dev == f->dev && sb.st_ino == f->ino)
        unlink(f->path);
}

static kvt_status bind_sock(void *ctx, int type, const char *ep, const char *opt,
                            const kvt_events_keys *keys, void **out, ev_ipc_file *file)
{
    void *s = zmq_socket(ctx, type);
    if (!s) return kvt__fail(KVT_ESYS, "%s: zmq_socket: %s", opt, zmq_strerror(zmq_errno()));
    int linger = 0, hwm = 100000;
    zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof linger);
    if (type == ZMQ_PUB) zmq_setsockopt(s, ZMQ_SNDHWM, &hwm, sizeof hwm);
    kvt_status st = keys ? curve_server(s, keys, opt) : KVT_OK;
    if (!st && zmq_bind(s, ep) != 0)
        st = kvt__fail(KVT_EBUSY, "%s: cannot bind %s: %s", opt, ep, zmq_strerror(zmq_errno()));
    if (st) {
        zmq_close(s);
        return st;
    }
    ipc_remember(file, ep);
    *out = s;
    return KVT_OK;
}

/* The ZAP handler's socket, bound before any CURVE socket (libzmq lets
 * every handshake in while no handler is bound). */
static kvt_status start_zap(kvt_events *ev, const kvt_events_keys *k)
{
    if (zmq_z85_decode(ev->client_key, k->client_public) == NULL)
        return kvt__fail(KVT_ESYS, "events: the derived client key does not decode");
    ev->zap = zmq_socket(ev->ctx, ZMQ_REP);
    int linger = 0;
    if (ev->zap) zmq_setsockopt(ev->zap, ZMQ_LINGER, &linger, sizeof linger);
    if (!ev->zap || zmq_bind(ev->zap, "inproc://zeromq.zap.01") != 0)
        return kvt__fail(KVT_ESYS, "events: the ZAP handler: %s", zmq_strerror(zmq_errno()));
    return KVT_OK;
}

static void events_free(kvt_events *ev)
{
    if (ev->pub) zmq_close(ev->pub);
    if (ev->replay) zmq_close(ev->replay);
    if (ev->zap) zmq_close(ev->zap);
    if (ev->ctx) zmq_ctx_term(ev->ctx);
    for (int i = 0; i < 2; i++) ipc_remove(&ev->ipc[i]);
    for (uint32_t i = 0; ev->buf && i < ev->buf_n; i++)
        free(ev->buf[(ev->buf_first + i) % ev->buf_cap].payload);
    free(ev->buf);
    free(ev->q);
    free(ev->names);
    pthread_mutex_destroy(&ev->names_mu);
    for (uint32_t i = 0; ev->tok && i < TOK_RING; i++) free(ev->tok[i].t);
    free(ev->tok);
    free(ev->tok_bucket);
    free(ev->pass_tok);
    free(ev->cnt);
    pthread_mutex_destroy(&ev->tok_mu);
    free(ev);
}

kvt_status kvt__events_start(kvt_events **out, const kvt_events_config *cfg)
{
    KVT_CHECK_NOT_NULL(out, "kvt__events_start");
    KVT_CHECK_NOT_NULL(cfg, "kvt__events_start");
    KVT_CHECK_NOT_NULL(cfg->endpoint, "kvt__events_start");
    KVT_CHECK_ARG(cfg->buffer_steps >= 1, "events_buffer_steps is 0 (at least 1)");
    const char *topic = cfg->topic ? cfg->topic : "";
    KVT_CHECK_ARG(strlen(topic) < 256, "events_topic is %zu bytes (at most 255)", strlen(topic));
    bool anywhere = cfg->secret || cfg->insecure;
    kvt_status st = kvt__events_endpoint_check(cfg->endpoint, "events_endpoint", anywhere);
    if (!st && cfg->replay_endpoint && cfg->replay_endpoint[0])
        st = kvt__events_endpoint_check(cfg->replay_endpoint, "events_replay_endpoint", anywhere);
    kvt_events_keys keys;
    if (!st && cfg->secret) st = kvt__events_curve_keys(cfg->secret, cfg->secret_len, &keys);
    if (st) return st;
    kvt_events *ev = calloc(1, sizeof *ev);
    if (!ev) return kvt__fail(KVT_ENOMEM, "events: out of memory");
    pthread_mutex_init(&ev->names_mu, NULL);
    pthread_mutex_init(&ev->tok_mu, NULL);
    ev->q = calloc(QUEUE_CAP, sizeof *ev->q);
    ev->buf = calloc(cfg->buffer_steps, sizeof *ev->buf);
    ev->buf_cap = cfg->buffer_steps;
    ev->ctx = zmq_ctx_new();
    if (!ev->q || !ev->buf || !ev->ctx) {
        events_free(ev);
        return kvt__fail(KVT_ENOMEM, "events: out of memory");
    }
    for (uint32_t i = 0; i < QUEUE_CAP; i++) atomic_init(&ev->q[i].seq, i);
    memcpy(ev->topic, topic, strlen(topic));
    ev->topic_len = strlen(topic);
    ev->dp_rank = cfg->dp_rank;
    ev->disk_tokens = cfg->disk_tokens;
    ev->counted = cfg->counted;
    ev->cleared_pending = true;
    const kvt_events_keys *k = cfg->secret ? &keys : NULL;
    st = k ? start_zap(ev, k) : KVT_OK;
    if (!st) st = bind_sock(ev->ctx, ZMQ_PUB, cfg->endpoint, "events_endpoint", k, &ev->pub,
                             &ev->ipc[0]);
    if (!st && cfg->replay_endpoint && cfg->replay_endpoint[0])
        st = bind_sock(ev->ctx, ZMQ_ROUTER, cfg->replay_endpoint, "events_replay_endpoint", k,
                       &ev->replay, &ev->ipc[1]);
    sodium_memzero(&keys, sizeof keys);
    if (!st && pthread_create(&ev->thread, NULL, events_main, ev) != 0)
        st = kvt__fail(KVT_ESYS, "events: pthread_create failed");
    if (st) {
        events_free(ev);
        return st;
    }
    *out = ev;
    return KVT_OK;
}

void kvt__events_stop(kvt_events *ev)
{
    if (!ev) return;
    atomic_store(&ev->stop, true);
    pthread_join(ev->thread, NULL);
    events_free(ev);
}

void kvt__events_stats(const kvt_events *ev, kvt_events_stats *out)
{
    out->batches = atomic_load(&ev->batches);
    out->events = atomic_load(&ev->events);
    out->blocks = atomic_load(&ev->blocks);
    out->dropped = atomic_load(&ev->dropped);
    out->replays = atomic_load(&ev->replays);
    out->refused = atomic_load(&ev->zap_refused);
}
