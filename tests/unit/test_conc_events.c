/* test_conc_events.c - the KV events publisher (src/events) fed by two
 * indexes committing and evicting from two threads at once (its queue has
 * many producers: each geometry's index under its own cache lock), read
 * by a ZeroMQ SUB socket and decoded with msgpack-c here: every block
 * committed arrives once in a BlockStored chain of the right size, every
 * one evicted in a BlockRemoved, the first batch is AllBlocksCleared, and
 * the sequence numbers have no gap. And one index's tier changes (CPU and
 * DISK copies gained and lost) and a token request's token_ids, event by
 * event. Runs under TSan (label concurrent). */
#include "support.h"

#include <msgpack.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "events/events.h"
#include "index/index.h"

#define CHAINS 200
#define CHAIN 5

typedef struct feeder {
    kvt_index *idx;
    kvt_events_src src;
    uint64_t salt;
    uint32_t chains; /* 0: CHAINS */
    bool bad; /* cmocka's asserts belong to the test's thread */
} feeder;

/* f's chains committed, one BlockStored chain each; false on a failure. */
static bool feed_commit(feeder *f)
{
    const uint32_t chains = f->chains ? f->chains : CHAINS;
    for (uint32_t c = 0; c < chains; c++) {
        uint32_t parent = KVT_INDEX_NONE, ids[CHAIN];
        for (uint32_t b = 0; b < CHAIN; b++) {
            kvt_hash128 h = {f->salt ^ ((uint64_t)c << 8 | b), f->salt + c};
            if (kvt__index_insert(f->idx, parent, h, b, &ids[b]) != KVT_OK) return false;
            parent = ids[b];
        }
        kvt__index_commit(f->idx, ids, CHAIN);
    }
    return true;
}

/* count of f's blocks evicted (at least; in batches of up to 64), leaves
 * first, in BlockRemoved. */
static bool feed_evict_some(feeder *f, uint32_t count)
{
    uint32_t ids[64], slots[64];
    uint32_t left = count;
    while (left) {
        uint32_t n = kvt__index_evict_ids(f->idx, left < 64 ? left : 64, ids, slots);
        if (n == 0) return false;
        left -= n < left ? n : left;
    }
    return true;
}

/* Every block of f evicted. */
static bool feed_evict(feeder *f)
{
    return feed_evict_some(f, (f->chains ? f->chains : CHAINS) * CHAIN);
}

static void *feed(void *arg)
{
    feeder *f = arg;
    f->bad = !feed_commit(f) || !feed_evict(f);
    return NULL;
}

typedef struct tally {
    uint64_t stored, removed, cleared, batches, next_seq, chains, first_seq;
    bool bad;
} tally;

static const msgpack_object *at(const msgpack_object *a, uint32_t i)
{
    return a->type == MSGPACK_OBJECT_ARRAY && i < a->via.array.size ? &a->via.array.ptr[i] : NULL;
}

static bool tag_is(const msgpack_object *o, const char *s)
{
    return o && o->type == MSGPACK_OBJECT_STR && o->via.str.size == strlen(s) &&
           !memcmp(o->via.str.ptr, s, o->via.str.size);
}

static void count_batch(tally *t, const void *p, size_t n)
{
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    if (msgpack_unpack_next(&u, p, n, NULL) != MSGPACK_UNPACK_SUCCESS) t->bad = true;
    const msgpack_object *b = &u.data, *evs = at(b, 1), *rank = at(b, 2);
    if (!at(b, 0) || at(b, 0)->type != MSGPACK_OBJECT_FLOAT64 || !evs || !rank ||
        rank->type != MSGPACK_OBJECT_POSITIVE_INTEGER || rank->via.u64 != 7)
        t->bad = true;
    for (uint32_t i = 0; evs && i < evs->via.array.size; i++) {
        const msgpack_object *e = at(evs, i), *hs = at(e, 1);
        if (tag_is(at(e, 0), "AllBlocksCleared")) {
            t->cleared++;
        } else if (tag_is(at(e, 0), "BlockStored") && hs && e->via.array.size == 8) {
            t->stored += hs->via.array.size;
            t->chains += at(e, 2)->type == MSGPACK_OBJECT_NIL;
            if (at(e, 4)->via.u64 != 16 || !tag_is(at(e, 6), "CPU")) t->bad = true;
        } else if (tag_is(at(e, 0), "BlockRemoved") && hs && e->via.array.size == 3) {
            t->removed += hs->via.array.size;
        } else {
            t->bad = true;
        }
    }
    msgpack_unpacked_destroy(&u);
}

/* Connects s (of ctx) to ep and returns once its ZMTP handshake ended, as
 * a socket monitor reports it: succeeded, or (want_ok false) failed or cut
 * off; then gives a SUB's subscription, sent right after the handshake, a
 * moment to reach the PUB. A SUB that joins late misses what came before,
 * and the fixed sleeps this replaced raced the connect on a loaded host. */
static void connect_joined(void *ctx, void *s, const char *ep, bool want_ok)
{
    static int n;
    char mon_ep[64];
    snprintf(mon_ep, sizeof mon_ep, "inproc://kvt-test-monitor-%d", n++);
    const int ended = ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                      ZMQ_EVENT_HANDSHAKE_FAILED_AUTH | ZMQ_EVENT_DISCONNECTED;
    assert_int_equal(zmq_socket_monitor(s, mon_ep, ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ended), 0);
    void *mon = zmq_socket(ctx, ZMQ_PAIR);
    zmq_setsockopt(mon, ZMQ_RCVTIMEO, &(int){10000}, sizeof(int));
    assert_int_equal(zmq_connect(mon, mon_ep), 0);
    assert_int_equal(zmq_connect(s, ep), 0);
    for (;;) {
        uint8_t ev[6]; /* the event (16 bits) and its value (32) */
        char addr[256];
        int more = 0;
        size_t ml = sizeof more;
        if (zmq_recv(mon, ev, sizeof ev, 0) < 0)
            fail_msg("no ZMTP handshake with %s within 10 s", ep);
        zmq_getsockopt(mon, ZMQ_RCVMORE, &more, &ml);
        if (more) (void)zmq_recv(mon, addr, sizeof addr, 0); /* the endpoint */
        uint16_t e;
        memcpy(&e, ev, sizeof e);
        if ((e == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) == want_ok) break;
    }
    zmq_socket_monitor(s, NULL, 0);
    zmq_close(mon);
    usleep(100000);
}

/* Stops ev and checks the ipc:// socket files its binds made are gone
 * (libzmq leaves them: a stopped node left one per endpoint in /tmp). */
static void stop_and_check_files(kvt_events *ev, const char *ep, const char *rep)
{
    assert_int_equal(access(ep + 6, F_OK), 0);
    if (rep) assert_int_equal(access(rep + 6, F_OK), 0);
    kvt__events_stop(ev);
    assert_int_not_equal(access(ep + 6, F_OK), 0);
    if (rep) assert_int_not_equal(access(rep + 6, F_OK), 0);
}

static void test_two_indexes_at_once(void **state)
{
    (void)state;
    char ep[128], rep[128];
    snprintf(ep, sizeof ep, "ipc:///tmp/kvt-events-%ld", (long)getpid());
    snprintf(rep, sizeof rep, "ipc:///tmp/kvt-events-replay-%ld", (long)getpid());
    kvt_events *ev = NULL;
    kvt_events_config cfg = {ep, rep, "t", 7, 1000};
    assert_int_equal(kvt__events_start(&ev, &cfg), KVT_OK);
    void *ctx = zmq_ctx_new(), *sub = zmq_socket(ctx, ZMQ_SUB);
    assert_int_equal(zmq_setsockopt(sub, ZMQ_SUBSCRIBE, "", 0), 0);
    connect_joined(ctx, sub, ep, true); /* subscribed before anything is sent */
    feeder f[2];
    pthread_t th[2];
    for (int i = 0; i < 2; i++) {
        assert_int_equal(kvt__index_create(&f[i].idx, CHAINS * CHAIN, KVT_EVICT_LRU), KVT_OK);
        f[i].src = (kvt_events_src){ev, 16};
        f[i].salt = 0x1000u * (uint64_t)(i + 1);
        f[i].chains = 0;
        f[i].bad = false;
        kvt__index_set_observer(f[i].idx, kvt__events_observe, &f[i].src);
        assert_int_equal(pthread_create(&th[i], NULL, feed, &f[i]), 0);
    }
    for (int i = 0; i < 2; i++) {
        pthread_join(th[i], NULL);
        assert_false(f[i].bad);
    }
    tally t = {0};
    /* The loop ends when every removal came; a timeout only ends it when
     * the publisher stalls this long (a loaded machine stalls it for
     * hundreds of ms: 200 here made the replay look longer than the live
     * stream). */
    int timeout = 10000;
    zmq_setsockopt(sub, ZMQ_RCVTIMEO, &timeout, sizeof timeout);
    while (t.removed < 2u * CHAINS * CHAIN && !t.bad) {
        char topic[8], seq[8];
        static char payload[1 << 20];
        if (zmq_recv(sub, topic, sizeof topic, 0) < 0) break;
        assert_int_equal(zmq_recv(sub, seq, sizeof seq, 0), 8);
        int n = zmq_recv(sub, payload, sizeof payload, 0);
        assert_true(n > 0 && n <= (int)sizeof payload);
        uint64_t s = 0;
        for (int i = 0; i < 8; i++) s = s << 8 | (uint8_t)seq[i];
        /* A subscriber may join after the first batches (a PUB's slow
         * joiner: the replay below has them); from its first on, no gap. */
        if (t.batches && s != t.next_seq)
            fail_msg("sequence %llu after %llu", (unsigned long long)s,
                     (unsigned long long)(t.next_seq - 1));
        if (!t.batches) t.first_seq = s;
        t.next_seq = s + 1;
        count_batch(&t, payload, (size_t)n);
        t.batches++;
    }
    /* The replay from 0: every batch, the first AllBlocksCleared. */
    void *dealer = zmq_socket(ctx, ZMQ_DEALER);
    assert_int_equal(zmq_connect(dealer, rep), 0);
    zmq_setsockopt(dealer, ZMQ_RCVTIMEO, &(int){5000}, sizeof(int));
    uint8_t zero[8] = {0};
    assert_int_equal(zmq_send(dealer, "", 0, ZMQ_SNDMORE), 0);
    assert_int_equal(zmq_send(dealer, zero, 8, 0), 8);
    tally all = {0};
    uint64_t replayed = 0;
    for (uint64_t want = 0;; want++) {
        char empty[1], seq[8];
        static char payload[1 << 20];
        assert_int_equal(zmq_recv(dealer, empty, sizeof empty, 0), 0);
        assert_int_equal(zmq_recv(dealer, seq, sizeof seq, 0), 8);
        int n = zmq_recv(dealer, payload, sizeof payload, 0);
        if (!memcmp(seq, "\xff\xff\xff\xff\xff\xff\xff\xff", 8)) {
            assert_int_equal(n, 0);
            replayed = want;
            if (want != t.next_seq) /* every batch published, none more */
                fail_msg("replay holds %llu batches, the subscriber saw up to %llu (stored %llu "
                         "removed %llu in the replay)", (unsigned long long)want,
                         (unsigned long long)t.next_seq, (unsigned long long)all.stored,
                         (unsigned long long)all.removed);
            break;
        }
        uint64_t s = 0;
        for (int i = 0; i < 8; i++) s = s << 8 | (uint8_t)seq[i];
        assert_int_equal(s, want);
        count_batch(&all, payload, (size_t)n);
        if (want == 0 && all.cleared != 1) fail_msg("batch 0 is not AllBlocksCleared");
    }
    zmq_close(dealer);
    /* Read after the replay: the publishing thread counts a batch just
     * after sending it, so a subscriber can hold the last batch before its
     * count (ASan on a loaded host: 2 counted, 3 received); the replay is
     * answered by that thread after its pass, so every count is in. */
    kvt_events_stats es;
    kvt__events_stats(ev, &es);
    t.cleared = all.cleared;
    if (all.stored != 2u * CHAINS * CHAIN || all.removed != 2u * CHAINS * CHAIN)
        fail_msg("replayed: stored=%llu removed=%llu", (unsigned long long)all.stored,
                 (unsigned long long)all.removed);
    /* A subscriber that joined late (its first batch is not 0: the
     * subscription reached the PUB after the 300 ms above, on a loaded
     * machine) saw a gap-free tail; the replay above holds the rest. */
    bool whole = t.first_seq == 0;
    if (t.bad || t.cleared != 1 || es.dropped ||
        (whole && (t.stored != 2u * CHAINS * CHAIN || t.removed != 2u * CHAINS * CHAIN ||
                   t.chains != 2u * CHAINS)))
        fail_msg("bad=%d cleared=%llu stored=%llu removed=%llu chains=%llu dropped=%llu", t.bad,
                 (unsigned long long)t.cleared, (unsigned long long)t.stored,
                 (unsigned long long)t.removed, (unsigned long long)t.chains,
                 (unsigned long long)es.dropped);
    assert_int_equal(es.batches, replayed);
    for (int i = 0; i < 2; i++) {
        kvt__index_set_observer(f[i].idx, NULL, NULL);
        kvt__index_destroy(f[i].idx);
    }
    zmq_close(sub);
    zmq_ctx_term(ctx);
    stop_and_check_files(ev, ep, rep);
}

/* ---- tiers and tokens ---- */

#define TT_BT 4

typedef struct tt_state {
    uint8_t tiers[16]; /* the test's tiers of each entry id (bit 1 CPU, 2 DISK) */
} tt_state;

static uint8_t tt_tiers(const void *arg, uint32_t id)
{
    return ((const tt_state *)arg)->tiers[id];
}

static void hash_bytes(kvt_hash128 h, uint8_t b[16])
{
    for (int i = 0; i < 8; i++) {
        b[i] = (uint8_t)(h.hi >> (56 - 8 * i));
        b[8 + i] = (uint8_t)(h.lo >> (56 - 8 * i));
    }
}

/* What one step's events said, merged (the publisher may cut a step's
 * records into two batches): their block hashes, token_ids and the first
 * one's parent. */
typedef struct tt_seen {
    uint32_t nh, ntok, events;
    uint8_t h[8][16];
    uint32_t tok[32];
    bool has_parent;
    uint8_t parent[16];
} tt_seen;

/* Receives until `want` hashes came in tag events of medium; any other
 * event (but AllBlocksCleared) fails. Every BlockStored's token_ids are
 * none or block_size per block. */
static void tt_recv(void *sub, const char *tag, const char *medium, uint32_t want, tt_seen *out)
{
    static char payload[1 << 16];
    memset(out, 0, sizeof *out);
    while (out->nh < want) {
        char topic[8], seq[8];
        if (zmq_recv(sub, topic, sizeof topic, 0) < 0)
            fail_msg("no %s %s within 10 s (%u of %u blocks)", tag, medium, out->nh, want);
        assert_int_equal(zmq_recv(sub, seq, sizeof seq, 0), 8);
        int n = zmq_recv(sub, payload, sizeof payload, 0);
        assert_true(n > 0 && n <= (int)sizeof payload);
        msgpack_unpacked u;
        msgpack_unpacked_init(&u);
        assert_int_equal(msgpack_unpack_next(&u, payload, (size_t)n, NULL), MSGPACK_UNPACK_SUCCESS);
        const msgpack_object *evs = at(&u.data, 1);
        assert_non_null(evs);
        for (uint32_t i = 0; i < evs->via.array.size; i++) {
            const msgpack_object *e = at(evs, i), *hs = at(e, 1);
            if (tag_is(at(e, 0), "AllBlocksCleared")) continue;
            bool stored = tag_is(at(e, 0), "BlockStored");
            if (!tag_is(at(e, 0), tag) || !tag_is(at(e, stored ? 6 : 2), medium))
                fail_msg("an event that is not %s %s", tag, medium);
            assert_int_equal(e->via.array.size, stored ? 8 : 3);
            assert_true(out->nh + hs->via.array.size <= 8);
            for (uint32_t k = 0; k < hs->via.array.size; k++) {
                assert_int_equal(at(hs, k)->via.bin.size, 16);
                memcpy(out->h[out->nh++], at(hs, k)->via.bin.ptr, 16);
            }
            if (stored) {
                const msgpack_object *p = at(e, 2), *t = at(e, 3);
                if (!out->events++) {
                    out->has_parent = p->type == MSGPACK_OBJECT_BIN;
                    if (out->has_parent) memcpy(out->parent, p->via.bin.ptr, 16);
                }
                assert_true(t->via.array.size == 0 ||
                            t->via.array.size == TT_BT * hs->via.array.size);
                assert_true(out->ntok + t->via.array.size <= 32);
                for (uint32_t k = 0; k < t->via.array.size; k++)
                    out->tok[out->ntok++] = (uint32_t)at(t, k)->via.u64;
                assert_int_equal(at(e, 4)->via.u64, TT_BT);
            }
        }
        msgpack_unpacked_destroy(&u);
    }
}

/* The hashes seen are exactly h[ids[0..n)], in order. */
static void tt_expect(const tt_seen *s, const kvt_hash128 *h, const uint32_t *ids, uint32_t n)
{
    assert_int_equal(s->nh, n);
    for (uint32_t i = 0; i < n; i++) {
        uint8_t b[16];
        hash_bytes(h[ids[i]], b);
        assert_memory_equal(s->h[i], b, 16);
    }
}

/* A chain stored into the CPU tier (its tokens told at store), made
 * durable on the SSD, two CPU copies dropped, then every block removed;
 * and a chain whose first block's tokens alone are known. disk_tokens (a
 * server with an SSD tier): the BlockStored DISK carries the tokens too. */
static void tiers_and_tokens(bool disk_tokens)
{
    char ep[128];
    snprintf(ep, sizeof ep, "ipc:///tmp/kvt-events-tt-%ld", (long)getpid());
    kvt_events *ev = NULL;
    kvt_events_config cfg = {ep, NULL, NULL, 0, 100};
    cfg.disk_tokens = disk_tokens;
    assert_int_equal(kvt__events_start(&ev, &cfg), KVT_OK);
    void *ctx = zmq_ctx_new(), *sub = zmq_socket(ctx, ZMQ_SUB);
    assert_int_equal(zmq_setsockopt(sub, ZMQ_SUBSCRIBE, "", 0), 0);
    zmq_setsockopt(sub, ZMQ_RCVTIMEO, &(int){10000}, sizeof(int));
    connect_joined(ctx, sub, ep, true);
    kvt_index *idx;
    assert_int_equal(kvt__index_create(&idx, 16, KVT_EVICT_LRU), KVT_OK);
    tt_state st = {{0}};
    kvt_events_src src = {ev, TT_BT, tt_tiers, &st};
    kvt__index_set_observer(idx, kvt__events_observe, &src);
    kvt_hash128 h[5] = {{1, 10}, {2, 20}, {3, 30}, {4, 40}, {5, 50}};
    uint32_t id[5], tok[5 * TT_BT];
    for (uint32_t i = 0; i < 5 * TT_BT; i++) tok[i] = 1000 + i;
    for (uint32_t i = 0; i < 5; i++) {
        uint32_t parent = i == 0 || i == 3 ? KVT_INDEX_NONE : id[i - 1];
        assert_int_equal(kvt__index_insert(idx, parent, h[i], i, &id[i]), KVT_OK);
        st.tiers[id[i]] = 1; /* CPU */
    }
    kvt__events_tokens(ev, h, tok, 3, TT_BT);                 /* chain 0..2: every block's */
    kvt__events_tokens(ev, &h[3], tok + 3 * TT_BT, 1, TT_BT); /* chain 3..4: the first's */
    tt_seen s;
    kvt__index_commit(idx, id, 3);
    tt_recv(sub, "BlockStored", "CPU", 3, &s);
    tt_expect(&s, h, (uint32_t[]){0, 1, 2}, 3);
    assert_false(s.has_parent);
    assert_int_equal(s.ntok, 3 * TT_BT);
    assert_memory_equal(s.tok, tok, sizeof(uint32_t) * 3 * TT_BT);
    kvt__index_commit(idx, id + 3, 2);
    tt_recv(sub, "BlockStored", "CPU", 2, &s); /* two events: block 4's tokens are unknown */
    tt_expect(&s, h, (uint32_t[]){3, 4}, 2);
    assert_int_equal(s.events, 2);
    assert_int_equal(s.ntok, TT_BT);
    assert_memory_equal(s.tok, tok + 3 * TT_BT, sizeof(uint32_t) * TT_BT);
    /* durable on the SSD: BlockStored DISK, with the tokens when the
     * publisher keeps them for it, else none (the CPU one took them) */
    for (uint32_t i = 0; i < 3; i++) st.tiers[id[i]] |= 2;
    kvt__index_notify(idx, KVT_INDEX_DISK_STORED, id, 3);
    tt_recv(sub, "BlockStored", "DISK", 3, &s);
    tt_expect(&s, h, (uint32_t[]){0, 1, 2}, 3);
    assert_int_equal(s.ntok, disk_tokens ? 3 * TT_BT : 0);
    if (disk_tokens) assert_memory_equal(s.tok, tok, sizeof(uint32_t) * 3 * TT_BT);
    /* blocks 1 and 2 leave the CPU tier, the SSD keeps them */
    st.tiers[id[1]] = st.tiers[id[2]] = 2;
    kvt__index_notify(idx, KVT_INDEX_CPU_REMOVED, id + 1, 2);
    tt_recv(sub, "BlockRemoved", "CPU", 2, &s);
    tt_expect(&s, h, (uint32_t[]){1, 2}, 2);
    /* every block removed, leaves first: each from the tiers it is in (a
     * run of removals: one BlockRemoved per tier) */
    for (uint32_t i = 5; i-- > 0;) assert_true(kvt__index_remove_candidate(idx, id[i]));
    tt_seen cpu = {0}, disk = {0};
    for (int k = 0; k < 6 && (cpu.nh < 3 || disk.nh < 3); k++) { /* in one batch or a few */
        char topic[8], seq[8];
        static char payload[1 << 16];
        assert_true(zmq_recv(sub, topic, sizeof topic, 0) >= 0);
        assert_int_equal(zmq_recv(sub, seq, sizeof seq, 0), 8);
        int n = zmq_recv(sub, payload, sizeof payload, 0);
        msgpack_unpacked u;
        msgpack_unpacked_init(&u);
        assert_int_equal(msgpack_unpack_next(&u, payload, (size_t)n, NULL), MSGPACK_UNPACK_SUCCESS);
        const msgpack_object *evs = at(&u.data, 1);
        for (uint32_t i = 0; i < evs->via.array.size; i++) {
            const msgpack_object *e = at(evs, i), *hs = at(e, 1);
            assert_true(tag_is(at(e, 0), "BlockRemoved"));
            tt_seen *into = tag_is(at(e, 2), "CPU") ? &cpu : &disk;
            assert_true(tag_is(at(e, 2), "CPU") || tag_is(at(e, 2), "DISK"));
            for (uint32_t j = 0; j < hs->via.array.size && into->nh < 8; j++)
                memcpy(into->h[into->nh++], at(hs, j)->via.bin.ptr, 16);
        }
        msgpack_unpacked_destroy(&u);
    }
    tt_expect(&cpu, h, (uint32_t[]){4, 3, 0}, 3);
    tt_expect(&disk, h, (uint32_t[]){2, 1, 0}, 3);
    kvt_events_stats es;
    kvt__events_stats(ev, &es);
    assert_int_equal(es.dropped, 0);
    kvt__index_set_observer(idx, NULL, NULL);
    kvt__index_destroy(idx);
    zmq_close(sub);
    zmq_ctx_term(ctx);
    stop_and_check_files(ev, ep, NULL);
}

static void test_tiers_and_tokens(void **state)
{
    (void)state;
    tiers_and_tokens(false);
}

static void test_tiers_and_tokens_disk(void **state)
{
    (void)state;
    tiers_and_tokens(true);
}

/* Every block hash of a counted stream's events, in order, against the
 * set a router keeps: a BlockStored of a hash it holds, or a BlockRemoved
 * of one it does not, is a failure; returns how many are held at the end
 * and counts the announcements. */
typedef struct held_set {
    uint8_t (*h)[16];
    bool *in;
    uint32_t n, cap;
    uint64_t stored, removed;
    char why[160];
} held_set;

static void held_apply(held_set *hs, const msgpack_object *e)
{
    const msgpack_object *list = at(e, 1);
    bool store = tag_is(at(e, 0), "BlockStored");
    if (!store && !tag_is(at(e, 0), "BlockRemoved")) return;
    for (uint32_t i = 0; list && i < list->via.array.size; i++) {
        const msgpack_object *o = &list->via.array.ptr[i];
        if (o->type != MSGPACK_OBJECT_BIN || o->via.bin.size != 16) {
            snprintf(hs->why, sizeof hs->why, "a hash that is not 16 bytes");
            return;
        }
        uint32_t k = 0;
        while (k < hs->n && memcmp(hs->h[k], o->via.bin.ptr, 16)) k++;
        if (k == hs->n) {
            if (hs->n == hs->cap) {
                snprintf(hs->why, sizeof hs->why, "more hashes than blocks fed");
                return;
            }
            memcpy(hs->h[hs->n++], o->via.bin.ptr, 16);
        }
        if (hs->in[k] == store && !hs->why[0])
            snprintf(hs->why, sizeof hs->why, "hash %u %s while %s", k,
                     store ? "announced" : "removed", store ? "held" : "not held");
        hs->in[k] = store;
        *(store ? &hs->stored : &hs->removed) += 1;
    }
}

/* Two indexes (two geometries of one server) holding the same hashes, on a
 * counted stream: a router's set stays true (never announced while held,
 * never removed while not), each block announced once and removed once,
 * when the last index lets go. Enough blocks that the count table grows
 * past its first size and removes under collisions. */
static void test_counted_stream_is_a_set(void **state)
{
    (void)state;
    enum { MANY = 1000 }; /* chains: 5000 blocks */
    char ep[128], rep[128];
    snprintf(ep, sizeof ep, "ipc:///tmp/kvt-events-c-%ld", (long)getpid());
    snprintf(rep, sizeof rep, "ipc:///tmp/kvt-events-c-replay-%ld", (long)getpid());
    kvt_events *ev = NULL;
    kvt_events_config cfg = {ep, rep, "t", 7, 100000};
    cfg.counted = true;
    assert_int_equal(kvt__events_start(&ev, &cfg), KVT_OK);
    feeder f[2];
    for (int i = 0; i < 2; i++) {
        assert_int_equal(kvt__index_create(&f[i].idx, MANY * CHAIN, KVT_EVICT_LRU), KVT_OK);
        f[i].src = (kvt_events_src){ev, 16};
        f[i].salt = 0x5000u; /* the same blocks in both */
        f[i].chains = MANY;
        kvt__index_set_observer(f[i].idx, kvt__events_observe, &f[i].src);
    }
    /* Both hold every block before either lets go: each is announced once,
     * and removed once, when the second index evicts it. The first half
     * goes from both (counts 2 -> 1 -> 0: entries leave the table between
     * ones still counted 2), then the rest from both, so an entry a bad
     * removal hid would be announced removed while the other index holds it. */
    const uint32_t half = MANY * CHAIN / 2;
    assert_true(feed_commit(&f[0]));
    assert_true(feed_commit(&f[1]));
    assert_true(feed_evict_some(&f[0], half));
    assert_true(feed_evict_some(&f[1], half));
    assert_true(feed_evict_some(&f[0], MANY * CHAIN - half));
    assert_true(feed_evict_some(&f[1], MANY * CHAIN - half));
    /* Read the replay from 0 until it holds every change (the thread
     * publishes every 10 ms; 10 s at most on a loaded host). */
    static uint8_t hashes[MANY * CHAIN][16];
    static bool in[MANY * CHAIN];
    held_set hs;
    void *ctx = zmq_ctx_new();
    uint32_t still = 0;
    for (int tries = 0; tries < 100; tries++) {
        memset(in, 0, sizeof in);
        hs = (held_set){hashes, in, 0, MANY * CHAIN, 0, 0, ""};
        void *dealer = zmq_socket(ctx, ZMQ_DEALER);
        zmq_setsockopt(dealer, ZMQ_RCVTIMEO, &(int){5000}, sizeof(int));
        zmq_setsockopt(dealer, ZMQ_LINGER, &(int){0}, sizeof(int));
        assert_int_equal(zmq_connect(dealer, rep), 0);
        uint8_t zero[8] = {0};
        assert_int_equal(zmq_send(dealer, "", 0, ZMQ_SNDMORE), 0);
        assert_int_equal(zmq_send(dealer, zero, 8, 0), 8);
        for (;;) {
            char empty[1], seq[8];
            static char payload[1 << 20];
            assert_int_equal(zmq_recv(dealer, empty, sizeof empty, 0), 0);
            assert_int_equal(zmq_recv(dealer, seq, sizeof seq, 0), 8);
            int n = zmq_recv(dealer, payload, sizeof payload, 0);
            if (!memcmp(seq, "\xff\xff\xff\xff\xff\xff\xff\xff", 8)) break;
            assert_true(n > 0 && n <= (int)sizeof payload);
            msgpack_unpacked u;
            msgpack_unpacked_init(&u);
            assert_int_equal(msgpack_unpack_next(&u, payload, (size_t)n, NULL),
                             MSGPACK_UNPACK_SUCCESS);
            const msgpack_object *evs = at(&u.data, 1);
            for (uint32_t i = 0; evs && i < evs->via.array.size; i++)
                held_apply(&hs, at(evs, i));
            msgpack_unpacked_destroy(&u);
        }
        zmq_close(dealer);
        if (hs.why[0]) fail_msg("%s (stored %llu, removed %llu)", hs.why,
                                (unsigned long long)hs.stored, (unsigned long long)hs.removed);
        still = 0;
        for (uint32_t k = 0; k < hs.n; k++) still += in[k];
        if (hs.n == MANY * CHAIN && still == 0) break;
        usleep(100000);
    }
    kvt_events_stats es;
    kvt__events_stats(ev, &es);
    if (hs.n != MANY * CHAIN || still || es.dropped)
        fail_msg("%u of %u blocks announced, %u still held at the end, %llu dropped", hs.n,
                 MANY * CHAIN, still, (unsigned long long)es.dropped);
    /* Both indexes stored every block: without counting, twice as many. */
    assert_int_equal(hs.stored, MANY * CHAIN);
    assert_int_equal(hs.removed, MANY * CHAIN);
    for (int i = 0; i < 2; i++) {
        kvt__index_set_observer(f[i].idx, NULL, NULL);
        kvt__index_destroy(f[i].idx);
    }
    zmq_ctx_term(ctx);
    stop_and_check_files(ev, ep, rep);
}

static void test_bad_config(void **state)
{
    (void)state;
    kvt_events *ev = NULL;
    kvt_events_config cfg = {"tcp://0.0.0.0:5557", NULL, NULL, 0, 10};
    assert_int_equal(kvt__events_start(&ev, &cfg), KVT_EINVAL);
    assert_non_null(strstr(kvt_last_error(), "events_endpoint is \"tcp://0.0.0.0:5557\""));
    assert_non_null(strstr(kvt_last_error(), "events_secret_file"));
    cfg.endpoint = "tcp://127.0.0.1:5557";
    cfg.replay_endpoint = "tcp://10.0.0.1:5558";
    assert_int_equal(kvt__events_start(&ev, &cfg), KVT_EINVAL);
    assert_non_null(strstr(kvt_last_error(), "events_replay_endpoint"));
    cfg.replay_endpoint = NULL;
    cfg.buffer_steps = 0;
    assert_int_equal(kvt__events_start(&ev, &cfg), KVT_EINVAL);
    assert_null(ev);
    uint64_t s = 0;
    assert_int_equal(kvt__events_replay_decode((const uint8_t *)"1234567", 7, &s), KVT_EPROTO);
    assert_int_equal(kvt__events_replay_decode((const uint8_t *)"\0\0\0\0\0\0\1\2", 8, &s), KVT_OK);
    assert_int_equal(s, 258);
}

/* A SUB or DEALER on ep speaking CURVE with k's client keys (k NULL:
 * plain ZeroMQ), receiving for at most ms per message. */
/* A socket of ctx connected to ep with keys k (NULL: plain); a SUB's
 * handshake waited for: let in when let_in, refused otherwise. */
static void *curve_sock(void *ctx, int type, const char *ep, const kvt_events_keys *k, int ms,
                        bool let_in)
{
    void *s = zmq_socket(ctx, type);
    zmq_setsockopt(s, ZMQ_LINGER, &(int){0}, sizeof(int));
    zmq_setsockopt(s, ZMQ_RCVTIMEO, &ms, sizeof ms);
    if (type == ZMQ_SUB) zmq_setsockopt(s, ZMQ_SUBSCRIBE, "", 0);
    if (k) {
        assert_int_equal(zmq_setsockopt(s, ZMQ_CURVE_SERVERKEY, k->server_public, 40), 0);
        assert_int_equal(zmq_setsockopt(s, ZMQ_CURVE_PUBLICKEY, k->client_public, 40), 0);
        assert_int_equal(zmq_setsockopt(s, ZMQ_CURVE_SECRETKEY, k->client_secret, 40), 0);
    }
    if (type == ZMQ_SUB) connect_joined(ctx, s, ep, let_in);
    else assert_int_equal(zmq_connect(s, ep), 0);
    return s;
}

/* Messages s receives before its timeout, reading each to its last frame. */
static int messages_in(void *s)
{
    static char buf[1 << 16];
    int got = 0, more = 0;
    size_t ml = sizeof more;
    while (zmq_recv(s, buf, sizeof buf, 0) >= 0) {
        zmq_getsockopt(s, ZMQ_RCVMORE, &more, &ml);
        if (!more) got++;
    }
    return got;
}

/* events_secret_file: both sockets are CURVE servers; only a subscriber
 * holding the secret's client keys gets the live stream and the replay.
 * One with another secret's keys, or none, gets nothing (its handshake is
 * refused by the ZAP handler, or never completes). The same secret gives
 * the same keys (a router derives them as `kvtier events` does), and a
 * secret lets the endpoints off this host. */
static void test_secret_lets_only_its_holder_in(void **state)
{
    (void)state;
    const uint8_t secret[] = "events secret of 32 bytes, test!", other[] = "another secret, also 32 bytes ok";
    kvt_events_keys k, k2, wrong;
    assert_int_equal(kvt__events_curve_keys(secret, 32, &k), KVT_OK);
    assert_int_equal(kvt__events_curve_keys(secret, 32, &k2), KVT_OK);
    assert_int_equal(kvt__events_curve_keys(other, 32, &wrong), KVT_OK);
    assert_memory_equal(&k, &k2, sizeof k);
    assert_int_equal(strlen(k.server_public), 40);
    assert_string_not_equal(k.server_public, wrong.server_public);
    assert_string_not_equal(k.client_public, k.server_public);
    assert_int_equal(kvt__events_curve_keys(secret, 15, &k2), KVT_EINVAL);
    assert_int_equal(kvt__events_endpoint_check("tcp://0.0.0.0:5557", "events_endpoint", true), KVT_OK);
    assert_int_equal(kvt__events_endpoint_check("tcp://10.1.2.3:", "events_endpoint", true), KVT_EINVAL);
    assert_int_equal(kvt__events_endpoint_check("udp://10.1.2.3:9", "events_endpoint", true), KVT_EINVAL);

    char ep[128], rep[128];
    snprintf(ep, sizeof ep, "ipc:///tmp/kvt-events-curve-%ld", (long)getpid());
    snprintf(rep, sizeof rep, "ipc:///tmp/kvt-events-curve-replay-%ld", (long)getpid());
    kvt_events *ev = NULL;
    kvt_events_config cfg = {ep, rep, "", 0, 100, secret, 32, false};
    assert_int_equal(kvt__events_start(&ev, &cfg), KVT_OK);
    void *ctx = zmq_ctx_new();
    void *good = curve_sock(ctx, ZMQ_SUB, ep, &k, 5000, true);
    void *bad = curve_sock(ctx, ZMQ_SUB, ep, &wrong, 1000, false);
    void *plain = curve_sock(ctx, ZMQ_SUB, ep, NULL, 1000, false);
    /* one who learnt the server's public key but holds no secret: only the
     * ZAP handler keeps it out */
    kvt_events_keys stranger = wrong;
    memcpy(stranger.server_public, k.server_public, sizeof k.server_public);
    void *nosy = curve_sock(ctx, ZMQ_SUB, ep, &stranger, 1000, false);

    kvt_index *idx = NULL;
    assert_int_equal(kvt__index_create(&idx, 16, KVT_EVICT_LRU), KVT_OK);
    kvt_events_src src = {ev, 16, NULL, NULL};
    kvt__index_set_observer(idx, kvt__events_observe, &src);
    uint32_t id;
    assert_int_equal(kvt__index_insert(idx, KVT_INDEX_NONE, (kvt_hash128){1, 2}, 0, &id), KVT_OK);
    kvt__index_commit(idx, &id, 1); /* one BlockStored batch, published live */

    char topic[8];
    assert_true(zmq_recv(good, topic, sizeof topic, 0) >= 0); /* the holder hears it */
    assert_int_equal(messages_in(bad), 0);
    assert_int_equal(messages_in(plain), 0);
    assert_int_equal(messages_in(nosy), 0);
    kvt_events_stats es;
    kvt__events_stats(ev, &es);
    assert_true(es.refused >= 1); /* nosy's handshake (plain and bad never reach ZAP) */

    /* The replay: the holder gets every kept batch and the end marker;
     * the others no answer at all. */
    uint8_t from[8] = {0};
    void *d[4] = {curve_sock(ctx, ZMQ_DEALER, rep, &k, 5000, true),
                  curve_sock(ctx, ZMQ_DEALER, rep, &wrong, 1000, false),
                  curve_sock(ctx, ZMQ_DEALER, rep, NULL, 1000, false),
                  curve_sock(ctx, ZMQ_DEALER, rep, &stranger, 1000, false)};
    for (int i = 0; i < 4; i++) {
        zmq_send(d[i], "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT);
        zmq_send(d[i], from, 8, ZMQ_DONTWAIT);
    }
    assert_true(messages_in(d[0]) >= 2); /* AllBlocksCleared, BlockStored, the end */
    assert_int_equal(messages_in(d[1]), 0);
    assert_int_equal(messages_in(d[2]), 0);
    assert_int_equal(messages_in(d[3]), 0);

    for (int i = 0; i < 4; i++) zmq_close(d[i]);
    zmq_close(nosy);
    zmq_close(good);
    zmq_close(bad);
    zmq_close(plain);
    zmq_ctx_term(ctx);
    kvt__index_set_observer(idx, NULL, NULL);
    stop_and_check_files(ev, ep, rep);
    kvt__index_destroy(idx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_two_indexes_at_once),
        cmocka_unit_test(test_tiers_and_tokens),
        cmocka_unit_test(test_tiers_and_tokens_disk),
        cmocka_unit_test(test_counted_stream_is_a_set),
        cmocka_unit_test(test_bad_config),
        cmocka_unit_test(test_secret_lets_only_its_holder_in),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
