/* bench_pd.c - `kvtier bench pd [--json] [--mib N]`: the prefill -> decode
 * hand-off over TCP on 127.0.0.1 (bootstrap + one sender + one receiver,
 * identical geometry, checksums on), against a raw TCP socket stream of the
 * same bytes in the same run; and ucx_perftest (tag_bw, UCX_TLS=tcp, 1 MiB)
 * as the UCX limit when the binary is present, against the same hand-off with
 * its data path on UCX (UCX_TLS=tcp, like the baseline). */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include "bench.h"
#include "kvtier.h"
#include "util/clock.h"

#define CHUNK (8u << 20)

typedef struct raw_arg {
    int fd;
    uint8_t *buf;
    uint64_t bytes;
} raw_arg;

static void *raw_reader(void *p)
{
    raw_arg *a = p;
    uint64_t got = 0;
    while (got < a->bytes) {
        ssize_t n = recv(a->fd, a->buf + (got % (64u << 20)) / CHUNK * CHUNK, CHUNK, 0);
        if (n <= 0) break;
        got += (uint64_t)n;
    }
    return NULL;
}

/* A raw loopback TCP stream: write `bytes` from a 64 MiB buffer, read into another. */
static double raw_tcp_gbps(uint64_t bytes)
{
    int l = socket(AF_INET, SOCK_STREAM, 0), one = 1, buf = 4 << 20;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof sa;
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(l, (struct sockaddr *)&sa, sizeof sa) || listen(l, 1) || getsockname(l, (struct sockaddr *)&sa, &sl))
        return 0;
    int c = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(c, (struct sockaddr *)&sa, sizeof sa)) return 0;
    int s = accept(l, NULL, NULL);
    for (int k = 0; k < 2; k++) { /* the same socket buffers kvtier's streams use */
        int fd = k ? s : c;
        setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
    }
    uint8_t *src = malloc(64u << 20), *dst = malloc(64u << 20);
    memset(src, 1, 64u << 20);
    memset(dst, 0, 64u << 20);
    raw_arg a = {s, dst, bytes};
    pthread_t th;
    uint64_t t0 = kvt__now_ns();
    pthread_create(&th, NULL, raw_reader, &a);
    for (uint64_t sent = 0; sent < bytes;) {
        ssize_t n = send(c, src + (sent % (64u << 20)) / CHUNK * CHUNK, CHUNK, 0);
        if (n <= 0) break;
        sent += (uint64_t)n;
    }
    pthread_join(th, NULL);
    double secs = (double)(kvt__now_ns() - t0) / 1e9;
    close(c);
    close(s);
    close(l);
    free(src);
    free(dst);
    return (double)bytes / secs / 1e9;
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
} pd_bench;

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

static int pd_setup(pd_bench *b, uint32_t mib, kvt_pd_transport tr)
{
    kvt_pd_net_params net = {.transport = tr};
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
    kvt_pd_params p = {.net = net, .bootstrap_port = port, .rank = {.tp_size = 1, .dcp_size = 1}, .geo = b->geo, .mem = &pm};
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
static double ucx_perftest_gbps(const char *tls, unsigned msg_mib, unsigned count)
{
    if (access("/usr/bin/ucx_perftest", X_OK) != 0) return -1;
    char cmd[512];
    snprintf(cmd, sizeof cmd,
             "UCX_TLS=%s timeout 30 ucx_perftest -t tag_bw -s %u -n %u -p 13399 >/dev/null 2>&1 & "
             "sleep 1; UCX_TLS=%s timeout 30 ucx_perftest -t tag_bw -s %u -n %u -p 13399 127.0.0.1 "
             "2>/dev/null | awk '/Final:/ {print $6}'; wait", tls, msg_mib << 20, count, tls, msg_mib << 20, count);
    FILE *f = popen(cmd, "r");
    if (!f) return -1;
    double mbs = -1;
    if (fscanf(f, "%lf", &mbs) != 1) mbs = -1;
    pclose(f);
    return mbs < 0 ? -1 : mbs * 1048576.0 / 1e9;
}

/* Best of three hand-offs (after a warm-up room) over one transport; with
 * raw != NULL, a raw TCP stream of the same bytes after each. */
static int pd_measure(uint32_t mib, kvt_pd_transport tr, double *best, double *raw)
{
    pd_bench b = {0};
    if (pd_setup(&b, mib, tr)) {
        fprintf(stderr, "kvtier bench pd: %s setup failed: %s\n", tr == KVT_PD_UCX ? "UCX" : "TCP",
                kvt_last_error());
        pd_teardown(&b);
        return -1;
    }
    /* warm-up: first touch of the decode pages; then they must match */
    if (pd_run(&b, 1) <= 0 || pd_verify(&b)) {
        pd_teardown(&b);
        return -1;
    }
    for (int i = 0; i < 3; i++) {
        double t = pd_run(&b, 10 + (uint64_t)i);
        *best = t > *best ? t : *best;
        if (raw) {
            double r = raw_tcp_gbps((uint64_t)mib << 20);
            *raw = r > *raw ? r : *raw;
        }
    }
    pd_teardown(&b);
    return 0;
}

int kvt_bench_pd_main(int argc, char **argv)
{
    int json = 0, ucx_only = 0;
    uint32_t mib = 512;
    const char *tls = "tcp"; /* the baseline's transport, for the ratio */
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) json = 1;
        else if (!strcmp(argv[i], "--mib") && i + 1 < argc) mib = (uint32_t)atoi(argv[++i]);
        else if (!strcmp(argv[i], "--ucx-only")) ucx_only = 1; /* profiling: the UCX hand-off alone */
        else if (!strcmp(argv[i], "--ucx-tls") && i + 1 < argc && strlen(argv[i + 1]) < 64 &&
                 strspn(argv[i + 1], "abcdefghijklmnopqrstuvwxyz0123456789_,") == strlen(argv[i + 1]))
            tls = argv[++i]; /* it goes into perftest's shell command */
        else {
            fprintf(stderr, "usage: kvtier bench pd [--json] [--mib N] [--ucx-only] [--ucx-tls TLS]\n");
            return 2;
        }
    }
    if (mib < 16 || mib > 4096) mib = 512;
    setenv("KVTIER_PD_QUIET", "1", 0);
    double tcp = 0, raw = 0, ucx = 0;
    if (!ucx_only && pd_measure(mib, KVT_PD_TCP, &tcp, &raw)) return 1;
    setenv("UCX_TLS", tls, 1); /* perftest runs with the same */
    if (pd_measure(mib, KVT_PD_UCX, &ucx, NULL)) return 1;
    /* perftest twice: its usual 1 MiB messages from one cache-hot buffer
     * (ucx_perftest_gbps, the headline limit), and 64 MiB messages (the
     * hand-off's batch size), whose buffers, like the hand-off's 512 MiB of
     * pages, do not fit in cache (ucx_perftest_64mib_gbps). */
    double perf = ucx_only ? -1 : ucx_perftest_gbps(tls, 1, 2000);
    double cold = ucx_only ? -1 : ucx_perftest_gbps(tls, 64, 32);
    char perf_s[32], cold_s[32];
    if (perf < 0) snprintf(perf_s, sizeof perf_s, "null");
    else snprintf(perf_s, sizeof perf_s, "%.3f", perf);
    if (cold < 0) snprintf(cold_s, sizeof cold_s, "null");
    else snprintf(cold_s, sizeof cold_s, "%.3f", cold);
    if (json)
        printf("{\"mib\": %u, \"tcp_gbps\": %.3f, \"raw_tcp_gbps\": %.3f, \"tcp_ratio\": %.3f, "
               "\"ucx_gbps\": %.3f, \"ucx_tls\": \"%s\", \"ucx_perftest_gbps\": %s, \"ucx_ratio\": %.3f, "
               "\"ucx_perftest_64mib_gbps\": %s, \"ucx_ratio_64mib\": %.3f}\n",
               mib, tcp, raw, raw > 0 ? tcp / raw : 0, ucx, tls, perf_s, perf > 0 ? ucx / perf : 0, cold_s,
               cold > 0 ? ucx / cold : 0);
    else
        printf("pd over TCP: %.2f GB/s, raw TCP stream %.2f GB/s (%.2fx); pd over UCX (UCX_TLS=%s): %.2f GB/s, "
               "ucx_perftest tag_bw 1 MiB: %s GB/s (%.2fx), 64 MiB: %s GB/s (%.2fx)\n",
               tcp, raw, raw > 0 ? tcp / raw : 0, tls, ucx, perf_s, perf > 0 ? ucx / perf : 0, cold_s,
               cold > 0 ? ucx / cold : 0);
    return (tcp > 0 || ucx_only) && ucx > 0 ? 0 : 1;
}
