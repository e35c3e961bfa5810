/* bench_pd.c - `kvtier bench pd [--json] [--mib N] [--rounds N]`: the
 * prefill -> decode hand-off on 127.0.0.1 (bootstrap + one sender + one
 * receiver, identical geometry, checksums on) over TCP, against a raw TCP
 * stream of the same engine buffers; and over UCX (UCX_TLS=tcp), against a
 * raw UCX tag stream of the same buffers (bench_ucx_raw.c) and ucx_perftest
 * (tag_bw, same UCX_TLS) when the binary is present, with the raw UCX
 * stream run from one cache-hot buffer as perftest runs (which splits the
 * gap to perftest into what the memory costs UCX and what kvtier costs);
 * plus one core's XXH3 and frame tags (AES-256-GMAC) over those buffers. --secret: the
 * hand-offs share a secret, so frames are authenticated (pd/mac.h) instead
 * of checksummed. Rounds interleave all of them;
 * medians are reported. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sodium.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>
#include "bench.h"
#include "bench_util.h"
#include "bench_ucx_raw.h"
#include "cli_util.h"
#include "pd/mac.h"
#include "pd/xfer.h"
#include "kvtier.h"
#include "util/clock.h"
#include "util/hash.h"

#define CHUNK (4u << 20) /* a send() or recv() of the raw stream */
#define MAX_BUFS (KVT_MAX_LAYERS * KVT_MAX_COMPONENTS)
_Static_assert(MAX_BUFS <= 2048, "raw_bufs holds every engine buffer");

/* raw_bufs (bench_ucx_raw.h): the engine buffers a raw stream moves, the
 * same memory the hand-off moves (same pages, same page size, same cache
 * state), prefill's into decode's. */
typedef struct raw_arg {
    int fd;
    const raw_bufs *b;
    int ok;
} raw_arg;

static void *raw_reader(void *p)
{
    raw_arg *a = p;
    for (int i = 0; i < a->b->n; i++)
        for (uint64_t got = 0; got < a->b->len[i];) {
            uint64_t k = a->b->len[i] - got < CHUNK ? a->b->len[i] - got : CHUNK;
            ssize_t n = recv(a->fd, a->b->dst[i] + got, (size_t)k, 0);
            if (n <= 0) return NULL;
            got += (uint64_t)n;
        }
    a->ok = 1;
    return NULL;
}

static int raw_send_all(int fd, const raw_bufs *b)
{
    for (int i = 0; i < b->n; i++)
        for (uint64_t sent = 0; sent < b->len[i];) {
            uint64_t k = b->len[i] - sent < CHUNK ? b->len[i] - sent : CHUNK;
            ssize_t n = send(fd, b->src[i] + sent, (size_t)k, 0);
            if (n <= 0) return -1;
            sent += (uint64_t)n;
        }
    return 0;
}

/* A connected loopback pair with the socket buffers kvtier's streams use;
 * a send or recv that moves nothing for 10 s fails (nothing waits forever). */
static int raw_pair(int *c, int *s)
{
    int l = socket(AF_INET, SOCK_STREAM, 0), one = 1, buf = 4 << 20;
    struct timeval limit = {10, 0};
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof sa;
    *c = *s = -1;
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (l < 0 || bind(l, (struct sockaddr *)&sa, sizeof sa) || listen(l, 1) ||
        getsockname(l, (struct sockaddr *)&sa, &sl) || (*c = socket(AF_INET, SOCK_STREAM, 0)) < 0 ||
        connect(*c, (struct sockaddr *)&sa, sizeof sa) || (*s = accept(l, NULL, NULL)) < 0) {
        if (l >= 0) close(l);
        return -1;
    }
    close(l);
    for (int k = 0; k < 2; k++) {
        int fd = k ? *s : *c;
        setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof limit);
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
    }
    return 0;
}

/* A raw loopback TCP stream of the prefill engine's buffers into the decode
 * engine's: no framing, no checksums, one writer and one reader thread. */
static double raw_tcp_gbps(const raw_bufs *b)
{
    int c, s;
    if (raw_pair(&c, &s)) return -1;
    uint64_t bytes = 0;
    for (int i = 0; i < b->n; i++) bytes += b->len[i];
    raw_arg a = {s, b, 0};
    pthread_t th;
    uint64_t t0 = kvt__now_ns();
    if (pthread_create(&th, NULL, raw_reader, &a)) {
        close(c);
        close(s);
        return -1;
    }
    int st = raw_send_all(c, b);
    if (st) shutdown(c, SHUT_WR); /* the reader sees the end instead of waiting */
    pthread_join(th, NULL);
    double secs = (double)(kvt__now_ns() - t0) / 1e9;
    close(c);
    close(s);
    return st || !a.ok ? -1 : (double)bytes / secs / 1e9;
}

typedef struct pd_bench {
    kvt_pd_bootstrap *bs;
    kvt_pd_sender *s;
    kvt_pd_receiver *r;
    kvt_geometry *geo;
    kvt_emu *pe, *de;
    uint32_t *pages, np, ntok;
    uint32_t *tokens;
    kvt_request req;
    raw_bufs raw; /* the same engine buffers, for the raw stream */
} pd_bench;

static void raw_from_engines(raw_bufs *r, const kvt_engine_memory *src, const kvt_engine_memory *dst)
{
    r->n = 0;
    if (src->base) {
        *r = (raw_bufs){1, {src->base}, {dst->base}, {src->buffer_bytes[0]}};
        return;
    }
    for (int u = 0; u < MAX_BUFS; u++)
        if (src->layer_bases[u]) {
            r->src[r->n] = src->layer_bases[u];
            r->dst[r->n] = dst->layer_bases[u];
            r->len[r->n++] = src->buffer_bytes[u];
        }
}

/* The prefill pages hold real KV (the emulated engine's content), as after a
 * prefill: calloc'd pages would all map the kernel's zero page, so the
 * sender would hash and send from one cache-hot 4 KiB page. */
static int pd_fill(pd_bench *b)
{
    b->tokens = malloc((size_t)b->ntok * sizeof *b->tokens);
    if (!b->tokens) return -1;
    for (uint32_t t = 0; t < b->ntok; t++) b->tokens[t] = t * 2654435761u;
    b->req = (kvt_request){b->tokens, b->ntok, "bench", 5};
    return kvt_emu_fill(b->pe, &b->req, 0, b->ntok, b->pages, b->np) ? -1 : 0;
}

/* The decode pages hold what the prefill pages held (once per transport). */
static int pd_verify(pd_bench *b)
{
    kvt_verify_result vr;
    if (kvt_emu_verify(b->de, &b->req, 0, b->ntok, b->pages, b->np, &vr) || vr.mismatches) {
        fprintf(stderr, "kvtier bench pd: the decode pages differ from the prefill pages\n");
        return -1;
    }
    return 0;
}

/* --checksum-threads: the hand-offs' kvt_pd_params.checksum_threads (-1,
 * 0, 1), named by CHECKSUM_THREADS[value + 1]. */
static int32_t g_checksum_threads;
static const char *const CHECKSUM_THREADS[3] = {"off", "auto", "on"};
static const char *checksum_threads_name(void)
{
    return CHECKSUM_THREADS[g_checksum_threads + 1];
}

/* Sets g_checksum_threads from its name; false when s names none. */
static bool checksum_threads_arg(const char *s)
{
    for (int32_t v = -1; v <= 1; v++)
        if (!strcmp(s, CHECKSUM_THREADS[v + 1])) {
            g_checksum_threads = v;
            return true;
        }
    return false;
}

/* --secret: the hand-offs share a secret, so every frame is authenticated
 * (pd/mac.h: AES-256-GMAC over every byte instead of XXH3 checksums). */
static bool g_secret;
static const char BENCH_SECRET[] = "kvtier bench pd shared secret";

static int pd_setup(pd_bench *b, uint32_t mib, kvt_pd_transport tr)
{
    kvt_pd_net_params net = {.transport = tr};
    if (g_secret) {
        net.secret = BENCH_SECRET;
        net.secret_len = sizeof BENCH_SECRET - 1;
    }
    uint16_t port;
    if (kvt_geometry_preset(&b->geo, "llama3-8b", 16, 1)) return -1;
    kvt_geometry_info gi;
    kvt_geometry_info_get(b->geo, &gi);
    b->ntok = (uint32_t)(((uint64_t)mib << 20) / gi.bytes_per_token);
    b->np = (b->ntok + 15) / 16;
    b->pages = malloc(b->np * sizeof *b->pages);
    for (uint32_t i = 0; i < b->np; i++) b->pages[i] = i;
    if (kvt_emu_create(&b->pe, b->geo, b->np) || kvt_emu_create(&b->de, b->geo, b->np)) return -1;
    if (pd_fill(b)) return -1;
    if (kvt_pd_bootstrap_create(&b->bs, &net) || kvt_pd_bootstrap_port(b->bs, &port)) return -1;
    kvt_engine_memory pm, dm;
    kvt_emu_memory(b->pe, &pm);
    kvt_emu_memory(b->de, &dm);
    raw_from_engines(&b->raw, &pm, &dm);
    kvt_pd_params p = {.net = net, .bootstrap_port = port, .rank = {.tp_size = 1, .dcp_size = 1}, .geo = b->geo,
                       .mem = &pm, .checksum_threads = g_checksum_threads};
    if (kvt_pd_sender_create(&b->s, &p)) return -1;
    p.mem = &dm;
    return kvt_pd_receiver_create(&b->r, &p) ? -1 : 0;
}

static double pd_run(pd_bench *b, uint64_t room)
{
    kvt_pd_room_params rp = {b->pages, b->np, b->ntok, 0};
    kvt_pd_poll st;
    uint64_t t0 = kvt__now_ns();
    if (kvt_pd_receiver_room(b->r, room, &rp) || kvt_pd_sender_room(b->s, room) ||
        kvt_pd_sender_send(b->s, room, b->pages, b->np, b->ntok) ||
        kvt_pd_receiver_wait(b->r, room, 60000, &st) || st != KVT_PD_SUCCESS)
        return 0;
    double secs = (double)(kvt__now_ns() - t0) / 1e9;
    kvt_pd_room_info info;
    kvt_pd_room_info_get(NULL, b->r, room, &info);
    kvt_pd_receiver_clear(b->r, room);
    kvt_pd_sender_wait(b->s, room, 10000, &st);
    kvt_pd_sender_clear(b->s, room);
    return (double)info.bytes / secs / 1e9;
}

static void pd_teardown(pd_bench *b)
{
    kvt_pd_receiver_destroy(b->r);
    kvt_pd_sender_destroy(b->s);
    kvt_pd_bootstrap_destroy(b->bs);
    kvt_emu_destroy(b->pe);
    kvt_emu_destroy(b->de);
    kvt_geometry_destroy(b->geo);
    free(b->pages);
    free(b->tokens);
}

/* ucx_perftest tag_bw over UCX_TLS=tls on loopback; < 0 when absent. What
 * it measures: one direction, 2000 messages of 1 MiB from one 1 MiB buffer
 * (cache-hot) into another, receives pre-posted, no checksums. */
static double ucx_perftest_gbps(const char *tls)
{
    const unsigned msg = 1u << 20, count = 2000;
    if (access("/usr/bin/ucx_perftest", X_OK) != 0) return -1;
    char cmd[512];
    /* the client retries until the server listens (slow to start on a busy machine) */
    snprintf(cmd, sizeof cmd,
             "UCX_TLS=%s timeout 30 ucx_perftest -t tag_bw -s %u -n %u -p 13399 >/dev/null 2>&1 & "
             "for i in 1 2 3 4 5 6 7 8 9 10; do sleep 0.3; r=$(UCX_TLS=%s timeout 30 ucx_perftest -t tag_bw "
             "-s %u -n %u -p 13399 127.0.0.1 2>/dev/null | awk '/Final:/ {print $6}'); [ -n \"$r\" ] && break; "
             "done; echo \"$r\"; wait", tls, msg, count, tls, msg, count);
    FILE *f = popen(cmd, "r");
    if (!f) return -1;
    double mbs = -1;
    if (fscanf(f, "%lf", &mbs) != 1) mbs = -1;
    pclose(f);
    return mbs < 0 ? -1 : mbs * 1048576.0 / 1e9;
}

/* One round: each measurement right after the other, so the machine's
 * drift (this VM's memory bandwidth swings 2-4x within minutes) hits the
 * hand-off and its limit alike and each ratio is taken within its round. */
typedef struct pd_round {
    double tcp, raw, ucx, raw_ucx, raw_hot, perf, hash, mac;
} pd_round;

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The median of the values picked out of the rounds that measured one
 * (a perftest run can fail on a busy machine); -1 when none did. */
static double median_of(const pd_round *r, int n, double (*pick)(const pd_round *))
{
    double v[64];
    int k = 0;
    for (int i = 0; i < n; i++)
        if (pick(&r[i]) >= 0) v[k++] = pick(&r[i]);
    if (!k) return -1;
    qsort(v, (size_t)k, sizeof *v, cmp_double);
    return k % 2 ? v[k / 2] : (v[k / 2 - 1] + v[k / 2]) / 2;
}

/* min/median/max of the values picked out of the rounds (-1: not measured). */
static stat3 stat_of(const pd_round *r, int n, double (*pick)(const pd_round *))
{
    double v[64];
    int k = 0;
    for (int i = 0; i < n && k < 64; i++) v[k++] = pick(&r[i]);
    return stat3_of(v, (uint32_t)k);
}

static double pick_tcp(const pd_round *r) { return r->tcp; }
static double pick_raw(const pd_round *r) { return r->raw; }
static double pick_ucx(const pd_round *r) { return r->ucx; }
static double pick_raw_ucx(const pd_round *r) { return r->raw_ucx; }
static double pick_hash(const pd_round *r) { return r->hash; }
static double pick_mac(const pd_round *r) { return r->mac; }
static double pick_perf(const pd_round *r) { return r->perf; }
static double pick_tcp_ratio(const pd_round *r) { return r->raw > 0 ? r->tcp / r->raw : -1; }
static double pick_raw_ucx_ratio(const pd_round *r) { return r->raw_ucx > 0 ? r->ucx / r->raw_ucx : -1; }
static double pick_ucx_ratio(const pd_round *r) { return r->perf > 0 ? r->ucx / r->perf : -1; }
static double pick_raw_hot(const pd_round *r) { return r->raw_hot; }
static double pick_ceiling(const pd_round *r) { return r->perf > 0 && r->raw_ucx > 0 ? r->raw_ucx / r->perf : -1; }
static double pick_hot_ratio(const pd_round *r) { return r->perf > 0 && r->raw_hot > 0 ? r->raw_hot / r->perf : -1; }

/* Runs a raw stream into wiped decode buffers; its figure counts only if
 * it moved every byte (they then equal the prefill buffers again). */
static double raw_checked(const raw_bufs *b, double (*stream)(const raw_bufs *), const char *what)
{
    for (int i = 0; i < b->n; i++) memset(b->dst[i], 0, (size_t)b->len[i]);
    double gbps = stream(b);
    for (int i = 0; gbps > 0 && i < b->n; i++)
        if (memcmp(b->src[i], b->dst[i], (size_t)b->len[i])) {
            fprintf(stderr, "kvtier bench pd: the raw %s stream left buffer %d wrong; not counted\n", what, i);
            return -1;
        }
    return gbps;
}

/* One core's XXH3 throughput over the prefill engine's buffers (read from
 * memory, as a sender's hash does): what a checksum costs per byte. */
static double hash_gbps(const raw_bufs *b)
{
    uint64_t t0 = kvt__now_ns(), bytes = 0, sink = 0;
    for (int i = 0; i < b->n; i++) {
        for (uint64_t off = 0; off < b->len[i]; off += 1u << 20) {
            uint64_t k = b->len[i] - off < (1u << 20) ? b->len[i] - off : (1u << 20);
            sink ^= kvt__hash64(b->src[i] + off, (size_t)k, 0); /* the data path's XXH3 build */
        }
        bytes += b->len[i];
    }
    double secs = (double)(kvt__now_ns() - t0) / 1e9;
    return sink == 42 ? 0 : (double)bytes / secs / 1e9; /* sink: keep the loop */
}

/* One core's frame tags (pd/mac.h: AES-256-GMAC, the code a link runs)
 * over the same buffers, one frame a buffer: what authenticating costs per
 * byte. -1 when a tag could not be made. */
static double mac_gbps(const raw_bufs *b)
{
    static const uint8_t session[PD_SESSION_KEY_LEN] = {1};
    uint8_t hb[PD_HDR_LEN] = {0}, tag[PD_TAG_LEN], sink = 0;
    pd_mac *m = NULL;
    if (pd_mac_new(&m, session, true) != KVT_OK) return -1;
    uint64_t t0 = kvt__now_ns(), bytes = 0;
    for (int i = 0; i < b->n; i++) {
        pd_mac_head(&m->tx, hb, tag);
        for (uint64_t off = 0; off < b->len[i]; off += 1u << 20) {
            uint64_t k = b->len[i] - off < (1u << 20) ? b->len[i] - off : (1u << 20);
            pd_mac_body(&m->tx, b->src[i] + off, (size_t)k);
        }
        pd_mac_end(&m->tx, tag);
        sink ^= tag[0];
        bytes += b->len[i];
    }
    double secs = (double)(kvt__now_ns() - t0) / 1e9;
    bool broken = m->tx.broken;
    pd_mac_free(m);
    if (broken) return -1;
    return sink == 42 && bytes == 1 ? 0 : (double)bytes / secs / 1e9; /* sink: keep the loop */
}

/* The raw UCX stream as perftest runs it: every message from one cache-hot
 * 1 MiB buffer into another (as many messages as the hand-off's bytes).
 * Next to perftest it shows how close the raw stream's harness comes to
 * perftest's; next to the stream of the engine buffers, what moving them
 * from and into memory costs UCX itself. */
static double raw_hot_ucx_gbps(const raw_bufs *engine)
{
    static raw_bufs hot; /* ~50 KiB: not on the stack */
    uint64_t bytes = 0;
    for (int i = 0; i < engine->n; i++) bytes += engine->len[i];
    uint8_t *src = malloc(1u << 20), *dst = malloc(1u << 20);
    double gbps = -1;
    if (src && dst) {
        memset(src, 0x5a, 1u << 20);
        memset(dst, 0, 1u << 20);
        hot.n = (int)(bytes >> 20) < 2048 ? (int)(bytes >> 20) : 2048;
        for (int i = 0; i < hot.n; i++) {
            hot.src[i] = src;
            hot.dst[i] = dst;
            hot.len[i] = 1u << 20;
        }
        gbps = kvt_bench_raw_ucx_gbps(&hot);
        if (gbps > 0 && memcmp(src, dst, 1u << 20)) gbps = -1; /* it moved nothing: not counted */
    }
    free(src);
    free(dst);
    return gbps;
}

static int pd_recheck(pd_bench *b)
{
    for (int i = 0; i < b->raw.n; i++) memset(b->raw.dst[i], 0, (size_t)b->raw.len[i]);
    return pd_run(b, 2) <= 0 || pd_verify(b) ? -1 : 0;
}

/* Sets up one transport's hand-off and checks a warm-up room byte for byte. */
static int pd_open(pd_bench *b, uint32_t mib, kvt_pd_transport tr)
{
    if (pd_setup(b, mib, tr)) {
        fprintf(stderr, "kvtier bench pd: %s setup failed: %s\n", tr == KVT_PD_UCX ? "UCX" : "TCP",
                kvt_last_error());
        return -1;
    }
    /* warm-up: first touch of the decode pages; then they must match */
    return pd_run(b, 1) <= 0 || pd_verify(b) ? -1 : 0;
}

static void fmt_num(char *buf, size_t n, double v)
{
    if (v < 0) snprintf(buf, n, "null");
    else snprintf(buf, n, "%.3f", v);
}

/* A median or a value as JSON: null when not measured. */
#define NUM(buf, v) (fmt_num(buf, sizeof buf, v), buf)

static void print_json(uint32_t mib, const char *tls, const pd_round *r, int n)
{
    char a[32], b[32], c[32], d[32], e[32], f[32], g[32], h[32], k[32], m[32], o[32], q[32], w[32];
    printf("{\"mib\": %u, \"rounds\": %d, \"cpus\": %ld, \"secret\": %s, \"mac_gbps\": %s, \"checksum_threads\": \"%s\", \"hash_gbps\": %s, \"tcp_gbps\": %s, \"raw_tcp_gbps\": %s, \"tcp_ratio\": %s, "
           "\"ucx_gbps\": %s, \"ucx_tls\": \"%s\", \"raw_ucx_gbps\": %s, \"ucx_raw_ratio\": %s, "
           "\"ucx_perftest_gbps\": %s, \"ucx_ratio\": %s, \"raw_ucx_hot_gbps\": %s, "
           "\"raw_ucx_hot_perftest_ratio\": %s, \"raw_ucx_perftest_ratio\": %s, \"per_round\": [",
           mib, n, sysconf(_SC_NPROCESSORS_ONLN), g_secret ? "true" : "false", NUM(w, median_of(r, n, pick_mac)),
           checksum_threads_name(), NUM(k, median_of(r, n, pick_hash)), NUM(a, median_of(r, n, pick_tcp)), NUM(b, median_of(r, n, pick_raw)),
           NUM(c, median_of(r, n, pick_tcp_ratio)), NUM(d, median_of(r, n, pick_ucx)), tls,
           NUM(e, median_of(r, n, pick_raw_ucx)), NUM(f, median_of(r, n, pick_raw_ucx_ratio)),
           NUM(g, median_of(r, n, pick_perf)), NUM(h, median_of(r, n, pick_ucx_ratio)),
           NUM(m, median_of(r, n, pick_raw_hot)), NUM(o, median_of(r, n, pick_hot_ratio)),
           NUM(q, median_of(r, n, pick_ceiling)));
    for (int i = 0; i < n; i++)
        printf("%s{\"tcp_gbps\": %s, \"raw_tcp_gbps\": %s, \"ucx_gbps\": %s, \"raw_ucx_gbps\": %s, "
               "\"raw_ucx_hot_gbps\": %s, \"ucx_perftest_gbps\": %s}", i ? ", " : "", NUM(a, r[i].tcp),
               NUM(b, r[i].raw), NUM(c, r[i].ucx), NUM(d, r[i].raw_ucx), NUM(m, r[i].raw_hot), NUM(e, r[i].perf));
    printf("], \"rounds_stat\": {");
    stat3_json("mac_gbps", stat_of(r, n, pick_mac), true);
    stat3_json("tcp_gbps", stat_of(r, n, pick_tcp), true);
    stat3_json("tcp_ratio", stat_of(r, n, pick_tcp_ratio), true);
    stat3_json("ucx_raw_ratio", stat_of(r, n, pick_raw_ucx_ratio), true);
    stat3_json("ucx_ratio", stat_of(r, n, pick_ucx_ratio), false);
    printf("}, ");
    bench_host_json(false);
    printf("}\n");
}

/* "  what: v GB/s", then the limit and the ratio when it was measured. */
static void print_line(const char *what, double v, const char *limit, double lv, double ratio)
{
    if (v < 0) return;
    printf("  %s: %.2f GB/s", what, v);
    if (lv >= 0) printf("; %s: %.2f GB/s; ratio %.2f", limit, lv, ratio);
    printf("\n");
}

static void print_text(const char *tls, const pd_round *r, int n)
{
    char ucx[64];
    double v = median_of(r, n, pick_ucx);
    snprintf(ucx, sizeof ucx, "pd over UCX (UCX_TLS=%s)", tls);
    printf("medians of %d rounds (each ratio taken within its round; %s; checksum threads: %s, %ld CPUs):\n",
           n, g_secret ? "with a secret: frames authenticated" : "no secret: frames checksummed",
           checksum_threads_name(), sysconf(_SC_NPROCESSORS_ONLN));
    if (median_of(r, n, pick_mac) >= 0)
        printf("  frame tags (AES-256-GMAC, one core, the same buffers from memory): %.2f GB/s\n", median_of(r, n, pick_mac));
    if (median_of(r, n, pick_hash) >= 0)
        printf("  checksums (XXH3, one core, the same buffers from memory): %.2f GB/s\n", median_of(r, n, pick_hash));
    print_line("pd over TCP", median_of(r, n, pick_tcp), "raw TCP stream of the same buffers",
               median_of(r, n, pick_raw), median_of(r, n, pick_tcp_ratio));
    print_line(ucx, v, "raw UCX tag stream of the same buffers", median_of(r, n, pick_raw_ucx),
               median_of(r, n, pick_raw_ucx_ratio));
    if (v >= 0 && median_of(r, n, pick_perf) >= 0) {
        printf("  %*s  ucx_perftest tag_bw 1 MiB: %.2f GB/s; ratio %.2f\n", (int)strlen(ucx), "",
               median_of(r, n, pick_perf), median_of(r, n, pick_ucx_ratio));
        /* what UCX itself reaches on this memory, against perftest: no
         * hand-off of these buffers can be expected above it */
        printf("  raw UCX stream / ucx_perftest: %.2f over the engine buffers, %.2f from one cache-hot "
               "1 MiB buffer (%.2f GB/s)\n", median_of(r, n, pick_ceiling), median_of(r, n, pick_hot_ratio),
               median_of(r, n, pick_raw_hot));
    }
}

static int usage(void)
{
    fprintf(stderr, "usage: kvtier bench pd [--json] [--mib 16..4096] [--rounds 1..64] [--only tcp|ucx] [--ucx-tls TLS]\n"
                    "                       [--checksum-threads on|off|auto] [--secret]\n");
    return 2;
}

/* Which parts run: both hand-offs and their limits, or (profiling) one
 * hand-off alone. */
enum { RUN_ALL, RUN_TCP, RUN_UCX };

/* Measures `rounds` rounds over hand-offs opened once per transport. */
static int pd_rounds(uint32_t mib, int rounds, int only, const char *tls, pd_round *out)
{
    pd_bench tcp = {0}, ucx = {0};
    bool do_tcp = only != RUN_UCX, do_ucx = only != RUN_TCP, limits = only == RUN_ALL;
    int rc = -1;
    if (do_tcp && pd_open(&tcp, mib, KVT_PD_TCP)) goto done;
    setenv("UCX_TLS", tls, 1); /* perftest runs with the same */
    if (do_ucx && pd_open(&ucx, mib, KVT_PD_UCX)) goto done;
    for (int i = 0; i < rounds; i++) {
        pd_round *r = &out[i];
        *r = (pd_round){-1, -1, -1, -1, -1, -1, -1, -1};
        if (do_tcp) r->tcp = pd_run(&tcp, 10 + (uint64_t)i);
        if (limits) r->raw = raw_checked(&tcp.raw, raw_tcp_gbps, "TCP");
        if (limits) r->hash = hash_gbps(&tcp.raw);
        if (limits) r->mac = mac_gbps(&tcp.raw);
        if (do_ucx) r->ucx = pd_run(&ucx, 10 + (uint64_t)i);
        if (limits) {
            r->raw_ucx = raw_checked(&ucx.raw, kvt_bench_raw_ucx_gbps, "UCX");
            r->raw_hot = raw_hot_ucx_gbps(&ucx.raw);
            r->perf = ucx_perftest_gbps(tls);
        }
        if ((do_tcp && r->tcp <= 0) || (do_ucx && r->ucx <= 0)) {
            fprintf(stderr, "kvtier bench pd: round %d: a hand-off failed: %s\n", i + 1, kvt_last_error());
            goto done;
        }
        char t[6][16];
        double v[6] = {r->tcp, r->raw, r->ucx, r->raw_ucx, r->raw_hot, r->perf};
        for (int k = 0; k < 6; k++) {
            if (v[k] < 0) snprintf(t[k], sizeof t[k], "-");
            else snprintf(t[k], sizeof t[k], "%.2f", v[k]);
        }
        fprintf(stderr, "kvtier bench pd: round %d/%d (GB/s): tcp %s raw %s | ucx %s raw %s raw-hot %s perftest %s\n",
                i + 1, rounds, t[0], t[1], t[2], t[3], t[4], t[5]);
    }
    /* the raw stream wrote the decode pages too: wipe them, hand off once
     * more over each transport and check every byte again */
    rc = (do_tcp && pd_recheck(&tcp)) || (do_ucx && pd_recheck(&ucx)) ? -1 : 0;
done:
    pd_teardown(&tcp);
    pd_teardown(&ucx);
    return rc;
}

int kvt_bench_pd_main(int argc, char **argv)
{
    int json = 0, only = RUN_ALL, rounds = 7;
    uint32_t mib = 512;
    const char *tls = "tcp"; /* the baseline's transport, for the ratio */
    static const char *const takes_value[] = {"--mib", "--rounds", "--only", "--checksum-threads",
                                              "--ucx-tls", NULL};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        uint64_t n = 0;
        if (!strcmp(a, "--json")) { json = 1; continue; }
        if (!strcmp(a, "--secret")) { g_secret = true; continue; }
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) return usage();
        if (!cli_arg_in(a, takes_value)) return cli_bad_arg("bench pd", a, false);
        if (!v) return cli_bad_arg("bench pd", a, true);
        i++;
        bool num = demo_parse_u64(v, &n);
        if (!strcmp(a, "--mib") && num && n >= 16 && n <= 4096) mib = (uint32_t)n;
        else if (!strcmp(a, "--rounds") && num && n >= 1 && n <= 64) rounds = (int)n;
        else if (!strcmp(a, "--only") && !strcmp(v, "tcp"))
            only = RUN_TCP; /* profiling: one hand-off alone, no limits */
        else if (!strcmp(a, "--only") && !strcmp(v, "ucx")) only = RUN_UCX;
        else if (!strcmp(a, "--checksum-threads") && checksum_threads_arg(v)) {}
        else if (!strcmp(a, "--ucx-tls") && strlen(v) < 64 &&
                 strspn(v, "abcdefghijklmnopqrstuvwxyz0123456789_,") == strlen(v))
            tls = v; /* it goes into perftest's shell command */
        else return cli_bad_value("bench pd", a, v);
    }
    setenv("KVTIER_PD_QUIET", "1", 0);
    pd_round r[64];
    if (pd_rounds(mib, rounds, only, tls, r)) return 1;
    if (json) print_json(mib, tls, r, rounds);
    else print_text(tls, r, rounds);
    return 0;
}
