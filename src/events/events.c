/* events.c - the KV events publisher (events.h, docs/events.md). */
#include "events/events.h"

#include <msgpack.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

#include "store/pool.h"
#include "util/err.h"
#include "util/log.h"

enum { REC_STORED = 1, REC_REMOVED = 2, REC_CLEARED = 3 };
enum { MEDIUM_NONE = 0, MEDIUM_CPU = 1, MEDIUM_DISK = 2 };

/* One block's change, queued by the observer. */
typedef struct ev_rec {
    uint8_t kind, medium, has_parent;
    uint32_t block_tokens;
    kvt_hash128 key, parent;
} ev_rec;

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

struct kvt_events {
    void *ctx, *pub, *replay;
    char topic[256];
    size_t topic_len;
    uint32_t dp_rank;
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
    ev_rec pass[PASS_MAX];
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

void kvt__events_observe(void *arg, kvt_index_event e, const kvt_index *idx, const uint32_t *ids,
                         uint32_t n)
{
    kvt_events_src *src = arg;
    for (uint32_t i = 0; i < n; i++) {
        ev_rec r = {.kind = e == KVT_INDEX_STORED ? REC_STORED : REC_REMOVED,
                    .block_tokens = src->block_tokens,
                    .key = kvt__index_key(idx, ids[i])};
        if (e == KVT_INDEX_STORED) {
            uint32_t p = kvt__index_parent(idx, ids[i]);
            r.has_parent = p != KVT_INDEX_NONE;
            if (r.has_parent) r.parent = kvt__index_key(idx, p);
            r.medium = kvt__index_payload(idx, ids[i]) != KVT_POOL_NONE ? MEDIUM_CPU : MEDIUM_DISK;
        }
        if (!push(src->ev, &r)) atomic_fetch_add(&src->ev->dropped, 1);
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

/* Records [i, end) that make one event: the same kind, medium and block
 * size; a BlockStored's blocks each the parent of the next (vLLM's
 * block_hashes are a chain below parent_block_hash). */
static uint32_t event_end(const ev_rec *r, uint32_t i, uint32_t n)
{
    uint32_t j = i + 1;
    if (r[i].kind == REC_CLEARED) return j;
    while (j < n && j - i < EVENT_MAX && r[j].kind == r[i].kind && r[j].medium == r[i].medium &&
           r[j].block_tokens == r[i].block_tokens &&
           (r[i].kind == REC_REMOVED || (r[j].has_parent && hash_eq(r[j].parent, r[j - 1].key))))
        j++;
    return j;
}

/* ["BlockStored", block_hashes, parent_block_hash, token_ids, block_size,
 *  lora_id, medium, lora_name], ["BlockRemoved", block_hashes, medium],
 * ["AllBlocksCleared"]. */
static void pack_event(kvt_events *ev, msgpack_packer *pk, const ev_rec *r, uint32_t n)
{
    static const char *const medium[] = {NULL, "CPU", "DISK"};
    if (r[0].kind == REC_CLEARED) {
        msgpack_pack_array(pk, 1);
        pack_str(pk, "AllBlocksCleared");
        return;
    }
    bool stored = r[0].kind == REC_STORED;
    msgpack_pack_array(pk, stored ? 8 : 3);
    pack_str(pk, stored ? "BlockStored" : "BlockRemoved");
    msgpack_pack_array(pk, n);
    for (uint32_t i = 0; i < n; i++) pack_hash(ev, pk, r[i].key);
    if (stored) {
        if (r[0].has_parent) pack_hash(ev, pk, r[0].parent);
        else msgpack_pack_nil(pk);
        msgpack_pack_array(pk, 0); /* token_ids: kvtier's blocks are named by hash */
        msgpack_pack_uint32(pk, r[0].block_tokens);
        msgpack_pack_nil(pk); /* lora_id */
    }
    if (r[0].medium) pack_str(pk, medium[r[0].medium]);
    else msgpack_pack_nil(pk); /* removed from every tier of this node */
    if (stored) msgpack_pack_nil(pk); /* lora_name */
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* [ts, events, data_parallel_rank] of r[0..n) into sb. Returns events. */
static uint32_t pack_batch(kvt_events *ev, const ev_rec *r, uint32_t n, msgpack_sbuffer *sb)
{
    uint32_t events = 0;
    for (uint32_t i = 0; i < n; i = event_end(r, i, n)) events++;
    msgpack_packer pk;
    msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
    msgpack_pack_array(&pk, 3);
    msgpack_pack_double(&pk, now_s());
    msgpack_pack_array(&pk, events);
    for (uint32_t i = 0, j; i < n; i = j) {
        j = event_end(r, i, n);
        pack_event(ev, &pk, r + i, j - i);
    }
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

static void publish(kvt_events *ev, const ev_rec *r, uint32_t n)
{
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    uint32_t events = pack_batch(ev, r, n, &sb);
    uint8_t seq[8];
    uint64_t s = ev->next_seq++;
    be64(seq, s);
    /* A PUB socket drops at its high-water mark rather than block. */
    zmq_send(ev->pub, ev->topic, ev->topic_len, ZMQ_SNDMORE);
    zmq_send(ev->pub, seq, sizeof seq, ZMQ_SNDMORE);
    zmq_send(ev->pub, sb.data, sb.size, 0);
    atomic_fetch_add(&ev->batches, 1);
    atomic_fetch_add(&ev->events, events);
    for (uint32_t i = 0; i < n; i++) atomic_fetch_add(&ev->blocks, r[i].kind != REC_CLEARED);
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

/* Drains the queue into batches of at most PASS_MAX blocks. */
static bool drain(kvt_events *ev)
{
    uint32_t n = 0;
    if (ev->cleared_pending) {
        ev->pass[n++] = (ev_rec){.kind = REC_CLEARED};
        ev->cleared_pending = false;
    }
    while (n < PASS_MAX && pop(ev, &ev->pass[n])) n++;
    if (n) publish(ev, ev->pass, n);
    return n == PASS_MAX;
}

static void *events_main(void *arg)
{
    kvt_events *ev = arg;
    uint64_t stop_ns = 0;
    for (;;) {
        zmq_pollitem_t it = {ev->replay, 0, ZMQ_POLLIN, 0};
        if (ev->replay) {
            if (zmq_poll(&it, 1, POLL_MS) > 0 && (it.revents & ZMQ_POLLIN)) serve_replay(ev);
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

kvt_status kvt__events_endpoint_check(const char *ep, const char *opt)
{
    static const char *const ok[] = {"tcp://127.0.0.1:", "tcp://localhost:", "tcp://[::1]:"};
    if (!strncmp(ep, "ipc://", 6) && ep[6]) return KVT_OK;
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        size_t l = strlen(ok[i]);
        if (!strncmp(ep, ok[i], l) && ep[l] && strspn(ep + l, "0123456789") == strlen(ep + l))
            return KVT_OK;
    }
    return kvt__fail(KVT_EINVAL, "%s is \"%s\": give tcp://127.0.0.1:PORT, tcp://[::1]:PORT or "
                     "ipc://PATH. The events name every block this node holds and ZeroMQ here "
                     "carries no secret, so they stay on this host (forward them, e.g. over an "
                     "SSH tunnel, to a router elsewhere)", opt, ep);
}

static kvt_status bind_sock(void *ctx, int type, const char *ep, const char *opt, void **out)
{
    void *s = zmq_socket(ctx, type);
    if (!s) return kvt__fail(KVT_ESYS, "%s: zmq_socket: %s", opt, zmq_strerror(zmq_errno()));
    int linger = 0, hwm = 100000;
    zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof linger);
    if (type == ZMQ_PUB) zmq_setsockopt(s, ZMQ_SNDHWM, &hwm, sizeof hwm);
    if (zmq_bind(s, ep) != 0) {
        kvt_status st = kvt__fail(KVT_EBUSY, "%s: cannot bind %s: %s", opt, ep,
                                  zmq_strerror(zmq_errno()));
        zmq_close(s);
        return st;
    }
    *out = s;
    return KVT_OK;
}

static void events_free(kvt_events *ev)
{
    if (ev->pub) zmq_close(ev->pub);
    if (ev->replay) zmq_close(ev->replay);
    if (ev->ctx) zmq_ctx_term(ev->ctx);
    for (uint32_t i = 0; ev->buf && i < ev->buf_n; i++)
        free(ev->buf[(ev->buf_first + i) % ev->buf_cap].payload);
    free(ev->buf);
    free(ev->q);
    free(ev->names);
    pthread_mutex_destroy(&ev->names_mu);
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
    kvt_status st = kvt__events_endpoint_check(cfg->endpoint, "events_endpoint");
    if (!st && cfg->replay_endpoint && cfg->replay_endpoint[0])
        st = kvt__events_endpoint_check(cfg->replay_endpoint, "events_replay_endpoint");
    if (st) return st;
    kvt_events *ev = calloc(1, sizeof *ev);
    if (!ev) return kvt__fail(KVT_ENOMEM, "events: out of memory");
    pthread_mutex_init(&ev->names_mu, NULL);
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
    ev->cleared_pending = true;
    st = bind_sock(ev->ctx, ZMQ_PUB, cfg->endpoint, "events_endpoint", &ev->pub);
    if (!st && cfg->replay_endpoint && cfg->replay_endpoint[0])
        st = bind_sock(ev->ctx, ZMQ_ROUTER, cfg->replay_endpoint, "events_replay_endpoint",
                       &ev->replay);
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
}
