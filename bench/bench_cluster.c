/* bench_cluster.c - `kvtier bench cluster [--json] [--rounds N] [--mib M]`:
 * the cluster tier (docs/cluster.md) against this host's own limits, in the
 * same run:
 *  - pull: a redis-server and two `kvtier serve` nodes (llama3-8b, TP 1:
 *    2 MiB blocks) on loopback; each round stores M MiB of a new prompt
 *    through node A, then a lookup of it on node B, which pulls every block
 *    from A (directory lookup, FETCH, checksums on both ends, the store
 *    into B's tier), timed from the client; the blocks are then loaded and
 *    byte-verified (untimed). Against: a raw TCP stream of the same bytes
 *    over loopback between two threads of this process, landed in a
 *    buffer as large as the pull's, the better of reading straight into
 *    it and reading through 256 KiB then copying (pull_ratio, the issue's
 *    target >= 0.8).
 *  - directory: block lookups per second through the directory code (one
 *    pipelined round trip per 64 blocks, as a lookup of a 64-block prefix
 *    does) against redis-benchmark's HGETALL with the same pipeline depth
 *    on the same server (directory_ratio).
 *  - events: KV events (src/events, docs/events.md) per second: an index
 *    commits BC_EV_BLOCKS blocks in 16-block chains and then evicts them,
 *    its observer feeding a real publisher (the one `kvtier serve` runs);
 *    a ZeroMQ SUB socket in this process decodes every batch (msgpack) and
 *    counts the block hashes of its BlockStored and BlockRemoved events,
 *    timed from the first change to the last one received (events_per_s:
 *    block changes per second; none may be dropped).
 * Each figure is min/median/max over the rounds. */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <hiredis/hiredis.h>
#include <msgpack.h>
#include <zmq.h>

#include "bench.h"
#include "bench_util.h"
#include "cli_util.h"
#include "cluster/dir.h"
#include "cluster_procs.h"
#include "events/events.h"
#include "index/index.h"
#include "kvtier.h"
#include "util/clock.h"
#include "util/err.h"

#define BC_MAX_ROUNDS 100
#define BC_PIPE 64      /* blocks per directory round trip */
#define BC_CALL_MS 30000

/* The raw stream's memory, kept across rounds as a node keeps its tier
 * (the first round lands in fresh pages, later ones in the same pages). */
#define RAW_BOUNCE (256u << 10)
typedef struct raw_bufs {
    uint8_t *tx, *rx, *bounce; /* len, len, RAW_BOUNCE bytes */
    size_t len;
} raw_bufs;

typedef struct bc {
    const char *self;
    char dir[256], log[300], sock[2][300];
    pid_t redis, node[2];
    uint16_t redis_port;
    uint32_t rounds, mib;
    /* pulls: [0] the first, into node B's empty tier (its pages backed as
     * they arrive); [1, rounds] the timed rounds, each into slots the
     * previous round's blocks are evicted from (a node that has been
     * serving: B's tier holds one round) */
    double pull[BC_MAX_ROUNDS + 1], raw[BC_MAX_ROUNDS + 1], ratio[BC_MAX_ROUNDS + 1];
    double raw_direct[BC_MAX_ROUNDS + 1], raw_bounced[BC_MAX_ROUNDS + 1]; /* raw: the better */
    raw_bufs raw_mem;
    double dir_rate[BC_MAX_ROUNDS], bench_rate[BC_MAX_ROUNDS], dir_ratio[BC_MAX_ROUNDS];
    double events_rate[BC_MAX_ROUNDS];
    uint64_t verified, mismatches, block_bytes;
    double dir_bytes_per_block; /* Redis used_memory per entry published (sizing) */
} bc;

static int bfail(const char *what)
{
    fprintf(stderr, "kvtier bench cluster: %s\n", what);
    return 1;
}

/* ------------------------------------------------------------------ */
/* The raw stream: the same bytes over loopback TCP, two threads      */

typedef struct raw_side {
    int fd;
    uint8_t *buf;
    size_t len, chunk;
} raw_side;

static void *raw_send(void *arg)
{
    raw_side *s = arg;
    for (size_t off = 0; off < s->len;) {
        size_t n = s->len - off < s->chunk ? s->len - off : s->chunk;
        ssize_t w = send(s->fd, s->buf + off, n, MSG_NOSIGNAL);
        if (w <= 0) break;
        off += (size_t)w;
    }
    return NULL;
}

/* GB/s of len bytes from one thread to another over a loopback socket
 * pair of TCP, landed in a buffer as large as the pull's target: read
 * straight into it (bounced false), or read through RAW_BOUNCE bytes (the
 * size the pull reads through) and copied into it, which the VM this was
 * built on runs faster (docs/cluster.md, Performance). */
static double raw_stream(const raw_bufs *m, bool bounced)
{
    uint16_t port = cp_free_port();
    int l = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), c = -1, a = -1;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    size_t len = m->len;
    double gbps = -1;
    if (l >= 0 && !bind(l, (struct sockaddr *)&sa, sizeof sa) && !listen(l, 1) &&
        (c = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) >= 0 &&
        !connect(c, (struct sockaddr *)&sa, sizeof sa) && (a = accept(l, NULL, NULL)) >= 0) {
        raw_side s = {c, m->tx, len, 1u << 20};
        pthread_t t;
        uint64_t t0 = kvt__now_ns();
        if (!pthread_create(&t, NULL, raw_send, &s)) {
            size_t got = 0;
            ssize_t r;
            while (got < len) {
                size_t want = len - got;
                if (bounced && want > RAW_BOUNCE) want = RAW_BOUNCE;
                if ((r = recv(a, bounced ? m->bounce : m->rx + got, want, 0)) <= 0) break;
                if (bounced) memcpy(m->rx + got, m->bounce, (size_t)r);
                got += (size_t)r;
            }
            pthread_join(t, NULL);
            if (got == len) gbps = (double)len / (double)(kvt__now_ns() - t0);
        }
    }
    if (a >= 0) close(a);
    if (c >= 0) close(c);
    if (l >= 0) close(l);
    return gbps;
}

/* ------------------------------------------------------------------ */
/* The directory: ours against redis-benchmark                        */

/* redis-benchmark's HGETALL requests per second at pipeline BC_PIPE, one
 * client, on key (a hash the directory wrote). */
static double redis_benchmark(const bc *b, const char *key)
{
    char port[16], out[300], cmd[1024];
    snprintf(port, sizeof port, "%u", b->redis_port);
    snprintf(out, sizeof out, "%s/redis-benchmark.csv", b->dir);
    snprintf(cmd, sizeof cmd, "redis-benchmark -h 127.0.0.1 -p %s -c 1 -P %d -n 200000 --csv "
             "HGETALL '%s' > '%s' 2>/dev/null", port, BC_PIPE, key, out);
    if (system(cmd) != 0) return -1;
    FILE *f = fopen(out, "r");
    if (!f) return -1;
    char line[512];
    double rps = -1;
    while (fgets(line, sizeof line, f)) {
        char *p = strstr(line, "\",\"");
        if (!strncmp(line, "\"HGETALL", 8) && p) rps = strtod(p + 3, NULL);
    }
    fclose(f);
    return rps;
}

/* Block lookups per second through kvt__dir_lookup, BC_PIPE blocks a call
 * (every one held by a live node), for about a second. */
static double dir_rate(kvt_dir *d, const kvt_hash128 *h)
{
    kvt_dir_holder who[BC_PIPE];
    uint64_t t0 = kvt__now_ns(), blocks = 0;
    while (kvt__now_ns() - t0 < 1000000000ull) {
        uint32_t found = 0;
        if (kvt__dir_lookup(d, 1, h, BC_PIPE, who, &found) || found != BC_PIPE) return -1;
        blocks += found;
    }
    return (double)blocks * 1e9 / (double)(kvt__now_ns() - t0);
}

/* Redis's used_memory (INFO memory), or 0. */
static uint64_t redis_used_memory(uint16_t port)
{
    struct timeval tv = {5, 0};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", port, tv);
    redisReply *r = c && !c->err ? redisCommand(c, "INFO memory") : NULL;
    uint64_t v = 0;
    const char *p = r && r->type == REDIS_REPLY_STRING ? strstr(r->str, "used_memory:") : NULL;
    if (p) v = strtoull(p + 12, NULL, 10);
    if (r) freeReplyObject(r);
    if (c) redisFree(c);
    return v;
}

/* Directory bytes per block held (docs/cluster.md, Sizing): Redis's
 * memory growth over 20000 entries of one holder, 2 MiB blocks' worth. */
#define BC_SIZING 20000
static kvt_status directory_sizing(bc *b, kvt_dir *holder)
{
    uint64_t before = redis_used_memory(b->redis_port);
    kvt_hash128 h[512];
    kvt_status st = KVT_OK;
    uint32_t done = 0;
    for (; done < BC_SIZING && !st; done += 512) {
        for (uint32_t j = 0; j < 512; j++)
            h[j] = (kvt_hash128){0x5151000000000000ull + done + j, done * 31ull + j};
        st = kvt__dir_publish(holder, 2, h, 512);
    }
    uint64_t after = redis_used_memory(b->redis_port);
    b->dir_bytes_per_block = st || !before || after < before ? -1
                           : (double)(after - before) / (double)done;
    return st;
}

static int bench_directory(bc *b)
{
    char redis[64];
    snprintf(redis, sizeof redis, "127.0.0.1:%u", b->redis_port);
    kvt_dir_config hc = {.redis = redis, .prefix = "kvtbench:", .node = "holder",
                         .advertise = "127.0.0.1:1", .lease_ms = 600000, .timeout_ms = 5000};
    kvt_dir_config lc = hc;
    lc.node = "looker";
    kvt_dir *holder = NULL, *looker = NULL;
    kvt_hash128 h[BC_PIPE];
    for (uint32_t i = 0; i < BC_PIPE; i++) h[i] = (kvt_hash128){0x1234 + i, 0x9876ull * (i + 1)};
    kvt_status st = kvt__dir_open(&holder, &hc);
    if (!st) st = kvt__dir_open(&looker, &lc);
    if (!st) st = kvt__dir_publish(holder, 1, h, BC_PIPE);
    if (!st) st = directory_sizing(b, holder);
    char key[128];
    snprintf(key, sizeof key, "kvtbench:b:%016x:%016llx%016llx", 1, (unsigned long long)h[0].hi,
             (unsigned long long)h[0].lo);
    for (uint32_t r = 0; !st && r < b->rounds; r++) {
        b->dir_rate[r] = dir_rate(looker, h);
        b->bench_rate[r] = redis_benchmark(b, key);
        b->dir_ratio[r] = b->dir_rate[r] > 0 && b->bench_rate[r] > 0 ? b->dir_rate[r] / b->bench_rate[r] : -1;
    }
    if (st) fprintf(stderr, "kvtier bench cluster: directory: %s\n", kvt_last_error());
    kvt__dir_close(looker);
    kvt__dir_close(holder);
    return st ? 1 : 0;
}

/* ------------------------------------------------------------------ */
/* KV events: a real publisher to a real subscriber                   */

#define BC_EV_BLOCKS 100000u /* committed, then evicted: twice this many changes a round */
#define BC_EV_CHAIN 16u
#define BC_EV_AHEAD 32768u   /* changes queued beyond those published (the queue holds 65536) */

typedef struct ev_sub {
    void *sock;
    uint64_t want, got, last_ns; /* block hashes to receive, received, when the last came */
    bool bad;
} ev_sub;

/* The block hashes of the BlockStored/BlockRemoved events of one batch. */
static uint64_t batch_hashes(const void *p, size_t n, bool *bad)
{
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    uint64_t k = 0;
    if (msgpack_unpack_next(&u, p, n, NULL) != MSGPACK_UNPACK_SUCCESS ||
        u.data.type != MSGPACK_OBJECT_ARRAY || u.data.via.array.size != 3 ||
        u.data.via.array.ptr[1].type != MSGPACK_OBJECT_ARRAY) {
        *bad = true;
    } else {
        const msgpack_object_array *evs = &u.data.via.array.ptr[1].via.array;
        for (uint32_t i = 0; i < evs->size; i++) {
            const msgpack_object *e = &evs->ptr[i];
            if (e->type == MSGPACK_OBJECT_ARRAY && e->via.array.size >= 3 &&
                e->via.array.ptr[1].type == MSGPACK_OBJECT_ARRAY)
                k += e->via.array.ptr[1].via.array.size;
        }
    }
    msgpack_unpacked_destroy(&u);
    return k;
}

static void *ev_recv_main(void *arg)
{
    ev_sub *s = arg;
    static char payload[8 << 20];
    while (s->got < s->want) {
        char topic[64], seq[8];
        if (zmq_recv(s->sock, topic, sizeof topic, 0) < 0 ||
            zmq_recv(s->sock, seq, sizeof seq, 0) != 8) {
            s->bad = true; /* nothing for 10 s */
            break;
        }
        int n = zmq_recv(s->sock, payload, sizeof payload, 0);
        if (n < 0 || n > (int)sizeof payload) {
            s->bad = true;
            break;
        }
        s->got += batch_hashes(payload, (size_t)n, &s->bad);
        s->last_ns = kvt__now_ns();
    }
    return NULL;
}

static uint64_t mix64(uint64_t x) /* splitmix64's finalizer */
{
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* Commits BC_EV_BLOCKS blocks in chains (no faster than the publisher
 * takes them: a full queue would drop), then evicts every one. */
static kvt_status ev_feed(kvt_events *ev, kvt_index *idx, uint32_t round)
{
    kvt_events_stats es;
    uint64_t fed = 0;
    for (uint32_t c = 0; c < BC_EV_BLOCKS / BC_EV_CHAIN; c++) {
        uint32_t ids[BC_EV_CHAIN], parent = KVT_INDEX_NONE;
        for (uint32_t b = 0; b < BC_EV_CHAIN; b++) {
            uint64_t x = ((uint64_t)round << 40) | ((uint64_t)c << 8) | b;
            kvt_hash128 h = {mix64(x), mix64(~x)}; /* spread as real block hashes are */
            kvt_status st = kvt__index_insert(idx, parent, h, b, &ids[b]);
            if (st) return st;
            parent = ids[b];
        }
        kvt__index_commit(idx, ids, BC_EV_CHAIN);
        fed += BC_EV_CHAIN;
        for (kvt__events_stats(ev, &es); fed > es.blocks + BC_EV_AHEAD; kvt__events_stats(ev, &es))
            nanosleep(&(struct timespec){0, 100000}, NULL);
    }
    uint32_t ids[64], slots[64], n;
    while ((n = kvt__index_evict_ids(idx, 64, ids, slots)) > 0) {
        fed += n;
        for (kvt__events_stats(ev, &es); fed > es.blocks + BC_EV_AHEAD; kvt__events_stats(ev, &es))
            nanosleep(&(struct timespec){0, 100000}, NULL);
    }
    return KVT_OK;
}

/* One round: block changes per second from the index to the subscriber. */
static double events_round(const bc *b, uint32_t round)
{
    char ep[300];
    snprintf(ep, sizeof ep, "ipc://%s/events-%u", b->dir, round);
    kvt_events *ev = NULL;
    kvt_events_config cfg = {ep, NULL, "bench", 0, 16};
    kvt_index *idx = NULL;
    void *ctx = zmq_ctx_new(), *sock = ctx ? zmq_socket(ctx, ZMQ_SUB) : NULL;
    double rate = -1;
    int tmo = 10000, hwm = 0; /* no receive high-water mark: the bench counts every batch */
    if (!sock || kvt__events_start(&ev, &cfg) ||
        kvt__index_create(&idx, BC_EV_BLOCKS, KVT_EVICT_LRU) ||
        zmq_setsockopt(sock, ZMQ_SUBSCRIBE, "", 0) || zmq_setsockopt(sock, ZMQ_RCVTIMEO, &tmo, sizeof tmo) ||
        zmq_setsockopt(sock, ZMQ_RCVHWM, &hwm, sizeof hwm) || zmq_connect(sock, ep))
        goto out;
    /* The subscription reaches the PUB asynchronously: wait for the first
     * batch (AllBlocksCleared, published once the thread starts) or any. */
    nanosleep(&(struct timespec){0, 300 * 1000000L}, NULL);
    kvt_events_src src = {ev, BC_EV_CHAIN, NULL, NULL};
    kvt__index_set_observer(idx, kvt__events_observe, &src);
    ev_sub s = {sock, 2ull * BC_EV_BLOCKS, 0, 0, false};
    pthread_t t;
    if (pthread_create(&t, NULL, ev_recv_main, &s)) goto out;
    uint64_t t0 = kvt__now_ns();
    kvt_status st = ev_feed(ev, idx, round);
    pthread_join(t, NULL);
    kvt_events_stats es;
    kvt__events_stats(ev, &es);
    if (!st && !s.bad && s.got == s.want && !es.dropped && s.last_ns > t0)
        rate = (double)s.got * 1e9 / (double)(s.last_ns - t0);
    else
        fprintf(stderr, "kvtier bench cluster: events: %llu of %llu block changes received, %llu "
                "dropped%s\n", (unsigned long long)s.got, (unsigned long long)s.want,
                (unsigned long long)es.dropped, s.bad ? ", a batch missing or malformed" : "");
    kvt__index_set_observer(idx, NULL, NULL);
out:
    if (sock) zmq_close(sock);
    if (ctx) zmq_ctx_term(ctx);
    kvt__events_stop(ev);
    kvt__index_destroy(idx);
    return rate;
}

static int bench_events(bc *b)
{
    for (uint32_t r = 0; r < b->rounds; r++)
        if ((b->events_rate[r] = events_round(b, r)) <= 0) return bfail("events: a round failed");
    return 0;
}

/* ------------------------------------------------------------------ */
/* Pulls through two nodes                                            */

static int start_nodes(bc *b)
{
    for (int i = 0; i < 2; i++) {
        char redis[64], name[32], log[320];
        snprintf(redis, sizeof redis, "cluster_redis=127.0.0.1:%u", b->redis_port);
        snprintf(name, sizeof name, "cluster_node=bench%d", i);
        snprintf(b->sock[i], sizeof b->sock[i], "%s/node%d.sock", b->dir, i);
        snprintf(log, sizeof log, "%s/node%d.log", b->dir, i);
        char cap[64]; /* one round and 4 blocks: each round evicts the last */
        snprintf(cap, sizeof cap, "cpu_capacity=%uMiB", b->mib + 8);
        char *argv[] = {(char *)b->self, "serve", "--socket", b->sock[i], "--set", cap,
                        "--set", "block_tokens=16", "--set", redis, "--set", name,
                        "--set", "cluster_pull_ms=60000", "--set", "cluster_prefill_tps=1", NULL};
        b->node[i] = cp_spawn_logged(log, argv);
        if (b->node[i] < 0 || !cp_wait_file(b->sock[i], b->node[i], BC_CALL_MS))
            return bfail("a node did not start (its log is in the bench's directory)");
    }
    return 0;
}

typedef struct engine {
    kvt_client *cl;
    kvt_emu *emu;
    uint32_t *pages, num_pages;
} engine;

static kvt_status engine_open(engine *e, const char *sock, uint32_t pages)
{
    kvt_geometry *geo = NULL;
    kvt_status st = kvt_geometry_preset(&geo, "llama3-8b", 16, 1);
    if (!st) st = kvt_client_attach(&e->cl, sock, geo, BC_CALL_MS);
    if (!st) st = kvt_emu_create(&e->emu, geo, pages);
    kvt_engine_memory mem;
    if (!st) st = kvt_emu_memory(e->emu, &mem);
    if (!st) st = kvt_client_register_memory(e->cl, &mem);
    kvt_geometry_destroy(geo);
    e->num_pages = pages;
    e->pages = calloc(pages, sizeof *e->pages);
    if (!st && !e->pages) st = KVT_ENOMEM;
    for (uint32_t i = 0; e->pages && i < pages; i++) e->pages[i] = i;
    return st;
}

static void engine_close(engine *e)
{
    kvt_client_detach(e->cl);
    kvt_emu_destroy(e->emu);
    free(e->pages);
}

static kvt_status run_task(engine *e, kvt_task_id task)
{
    kvt_task_result res = {0};
    kvt_status st = kvt_client_launch(e->cl, task, e->pages, e->num_pages);
    if (!st) st = kvt_client_wait(e->cl, task, BC_CALL_MS, &res);
    return st ? st : res.status;
}

/* One round: store on A, time B's lookup (the pull), verify B's load. */
static kvt_status pull_round(bc *b, engine *a, engine *bn, uint32_t r, uint32_t *tok, uint32_t n)
{
    char ns[32];
    snprintf(ns, sizeof ns, "round%u", r);
    for (uint32_t i = 0; i < n; i++) tok[i] = (r * 7919 + i * 31) % 32000;
    kvt_request req = {.tokens = tok, .num_tokens = n, .ns = ns, .ns_len = (uint32_t)strlen(ns),
                       .flags = KVT_REQ_VISIBLE_AT_END};
    kvt_store_plan p;
    kvt_status st = kvt_emu_fill(a->emu, &req, 0, n, a->pages, a->num_pages);
    if (!st) st = kvt_client_prepare_store(a->cl, &req, &p);
    if (!st && p.task) st = run_task(a, p.task);
    if (st) return st;
    req.flags = 0;
    struct timespec ts = {0, 200 * 1000000L}; /* A publishes within its 20 ms batching */
    nanosleep(&ts, NULL);
    uint64_t t0 = kvt__now_ns();
    kvt_match m;
    st = kvt_client_lookup(bn->cl, &req, &m);
    uint64_t ns_taken = kvt__now_ns() - t0;
    if (st) return st;
    uint64_t bytes = (uint64_t)(m.matched_tokens / 16) * b->block_bytes;
    if (!m.task || m.matched_tokens < n - 16)
        return kvt__fail(KVT_ENOTFOUND, "node B matched %u of %u tokens: the pull did not happen",
                         m.matched_tokens, n);
    b->pull[r] = (double)bytes / (double)ns_taken;
    kvt_emu_poison(bn->emu, bn->pages, bn->num_pages);
    st = run_task(bn, m.task);
    kvt_verify_result v;
    if (!st) st = kvt_emu_verify(bn->emu, &req, 0, m.matched_tokens, bn->pages, bn->num_pages, &v);
    if (!st) b->verified += v.bytes_checked, b->mismatches += v.mismatches;
    if (bytes != b->raw_mem.len)
        return kvt__fail(KVT_EINVAL, "bench cluster: round %u pulled %llu bytes, not %zu", r,
                         (unsigned long long)bytes, b->raw_mem.len);
    b->raw_direct[r] = raw_stream(&b->raw_mem, false);
    b->raw_bounced[r] = raw_stream(&b->raw_mem, true);
    b->raw[r] = b->raw_direct[r] > b->raw_bounced[r] ? b->raw_direct[r] : b->raw_bounced[r];
    b->ratio[r] = b->raw[r] > 0 ? b->pull[r] / b->raw[r] : -1;
    return st;
}

static int bench_pulls(bc *b)
{
    uint32_t blocks = b->mib / 2, n = blocks * 16 + 1;
    b->block_bytes = 2u << 20;
    engine a = {0}, bn = {0};
    uint32_t *tok = malloc((size_t)n * sizeof *tok);
    raw_bufs *m = &b->raw_mem;
    m->len = (size_t)blocks * b->block_bytes;
    m->tx = malloc(m->len), m->rx = malloc(m->len), m->bounce = malloc(RAW_BOUNCE);
    kvt_status st = tok && m->tx && m->rx && m->bounce ? KVT_OK : KVT_ENOMEM;
    if (!st) memset(m->tx, 0x5a, m->len);
    if (!st) st = engine_open(&a, b->sock[0], blocks + 1);
    if (!st) st = engine_open(&bn, b->sock[1], blocks + 1);
    for (uint32_t r = 0; !st && r <= b->rounds; r++) st = pull_round(b, &a, &bn, r, tok, n);
    if (st) fprintf(stderr, "kvtier bench cluster: pull: %s: %s\n", kvt_status_name(st), kvt_last_error());
    if (a.cl) engine_close(&a);
    if (bn.cl) engine_close(&bn);
    free(tok);
    free(m->tx), free(m->rx), free(m->bounce);
    return st ? 1 : 0;
}

/* ------------------------------------------------------------------ */
/* The report                                                         */

static void json_stat(const char *name, const double *v, uint32_t n, bool comma)
{
    stat3_json(name, stat3_of(v, n), comma);
}

static void report(const bc *b, bool json)
{
    uint32_t n = b->rounds;
    if (json) {
        printf("{\"rounds\": %u, \"mib_per_round\": %u, \"block_bytes\": %llu, \"pipeline\": %d, ",
               n, b->mib, (unsigned long long)b->block_bytes, BC_PIPE);
        json_stat("pull_gbps", b->pull + 1, n, true);
        json_stat("raw_stream_gbps", b->raw + 1, n, true);
        json_stat("raw_direct_gbps", b->raw_direct + 1, n, true);
        json_stat("raw_bounced_gbps", b->raw_bounced + 1, n, true);
        json_stat("pull_ratio", b->ratio + 1, n, true);
        printf("\"first_pull_gbps\": %.3f, \"first_pull_ratio\": %.3f, ", b->pull[0], b->ratio[0]);
        json_stat("directory_lookups_per_s", b->dir_rate, n, true);
        json_stat("redis_benchmark_hgetall_per_s", b->bench_rate, n, true);
        json_stat("directory_ratio", b->dir_ratio, n, true);
        json_stat("events_per_s", b->events_rate, n, true);
        printf("\"directory_bytes_per_block\": %.1f, ", b->dir_bytes_per_block);
        printf("\"verified_bytes\": %llu, \"mismatches\": %llu, ", (unsigned long long)b->verified,
               (unsigned long long)b->mismatches);
        bench_host_json(false);
        printf("}\n");
        return;
    }
    stat3 s[6] = {stat3_of(b->pull + 1, n), stat3_of(b->raw + 1, n), stat3_of(b->ratio + 1, n),
                  stat3_of(b->dir_rate, n), stat3_of(b->bench_rate, n), stat3_of(b->dir_ratio, n)};
    double p[3] = {s[0].min, s[0].med, s[0].max}, w[3] = {s[1].min, s[1].med, s[1].max},
           r[3] = {s[2].min, s[2].med, s[2].max}, d[3] = {s[3].min, s[3].med, s[3].max},
           q[3] = {s[4].min, s[4].med, s[4].max}, x[3] = {s[5].min, s[5].med, s[5].max};
    printf("kvtier bench cluster: %u rounds of %u MiB (2 MiB blocks), %ld CPUs; min / median / max\n",
           n, b->mib, sysconf(_SC_NPROCESSORS_ONLN));
    printf("  pull (lookup on B of what A holds;\n   B's tier full: evicts to take it)  %6.2f / %6.2f / %6.2f GB/s\n", p[0], p[1], p[2]);
    printf("  raw TCP stream, same bytes          %6.2f / %6.2f / %6.2f GB/s (the better of:)\n", w[0], w[1], w[2]);
    stat3 rd = stat3_of(b->raw_direct + 1, n), rb = stat3_of(b->raw_bounced + 1, n);
    printf("    read straight into the target     %6.2f / %6.2f / %6.2f GB/s\n", rd.min, rd.med, rd.max);
    printf("    read via 256 KiB, then copied     %6.2f / %6.2f / %6.2f GB/s\n", rb.min, rb.med, rb.max);
    printf("  pull_ratio                          %6.2f / %6.2f / %6.2f (target >= 0.8)\n", r[0], r[1], r[2]);
    printf("  first pull, into B's empty tier     %6.2f GB/s, ratio %.2f (pages backed as they arrive)\n",
           b->pull[0], b->ratio[0]);
    printf("  directory lookups (pipeline %d)     %8.0f / %8.0f / %8.0f blocks/s\n", BC_PIPE, d[0], d[1], d[2]);
    printf("  redis-benchmark HGETALL -P %d       %8.0f / %8.0f / %8.0f per s\n", BC_PIPE, q[0], q[1], q[2]);
    printf("  directory_ratio                     %6.2f / %6.2f / %6.2f\n", x[0], x[1], x[2]);
    stat3 ev = stat3_of(b->events_rate, n);
    printf("  KV events (block changes to a SUB) %8.0f / %8.0f / %8.0f per s\n", ev.min, ev.med,
           ev.max);
    printf("  directory memory per block held    %.0f bytes (Redis used_memory over %d entries)\n",
           b->dir_bytes_per_block, BC_SIZING);
    printf("  pulled bytes verified: %llu, mismatches: %llu\n", (unsigned long long)b->verified,
           (unsigned long long)b->mismatches);
    bench_host_text(stdout);
}

static int usage(void)
{
    fprintf(stderr, "usage: kvtier bench cluster [--json] [--rounds N] [--mib M]\n"
                    "  --rounds N  measured rounds (1..%d, default 5)\n"
                    "  --mib M     MiB pulled per round (2..4096, even; default 64)\n", BC_MAX_ROUNDS);
    return 2;
}

int kvt_bench_cluster_main(int argc, char **argv)
{
    bc b = {.rounds = 5, .mib = 64};
    bool json = false;
    static const char *const takes_value[] = {"--rounds", "--mib", NULL};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        uint64_t n;
        if (!strcmp(a, "--json")) { json = true; continue; }
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) return usage();
        if (!cli_arg_in(a, takes_value)) return cli_bad_arg("bench cluster", a, false);
        if (!v) return cli_bad_arg("bench cluster", a, true);
        i++;
        if (!strcmp(a, "--rounds") && demo_parse_u64(v, &n) && n >= 1 && n <= BC_MAX_ROUNDS)
            b.rounds = (uint32_t)n;
        else if (!strcmp(a, "--mib") && demo_parse_u64(v, &n) && n >= 2 && n <= 4096 && n % 2 == 0)
            b.mib = (uint32_t)n;
        else return cli_bad_value("bench cluster", a, v);
    }
    static char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) return bfail("cannot find this program");
    self[n] = 0;
    b.self = self;
    const char *base = getenv("TMPDIR");
    snprintf(b.dir, sizeof b.dir, "%s/kvtier-bcl-XXXXXX", base && *base ? base : "/tmp");
    if (!mkdtemp(b.dir)) return bfail("mkdtemp failed");
    snprintf(b.log, sizeof b.log, "%s/redis.log", b.dir);
    signal(SIGPIPE, SIG_IGN);
    b.redis_port = cp_free_port();
    b.redis = cp_start_redis(b.dir, b.redis_port, b.log);
    /* processes first (fork), then this process's threads (clients) */
    int rc = b.redis > 0 ? 0 : 1;
    if (!rc) rc = start_nodes(&b) ? 1 : 0;
    if (!rc) rc = bench_directory(&b);
    if (!rc) rc = bench_pulls(&b);
    if (!rc) rc = bench_events(&b);
    if (!rc && b.mismatches) rc = bfail("pulled bytes differ from what was stored");
    if (!rc) report(&b, json);
    for (int i = 0; i < 2; i++) cp_kill_wait(&b.node[i], SIGTERM);
    cp_kill_wait(&b.redis, SIGTERM);
    remove_tree(b.dir);
    return rc;
}
