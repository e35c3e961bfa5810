/* fuzz_ucx_stream.c - what the UCX stream (src/net/stream_ucx.c) decodes
 * from its peer, over real UCX (UCX_TLS=tcp, UCX_NET_DEVICES=lo, set before
 * UCX is first loaded): the worker address swapped at the upgrade, and the
 * tag messages every later read consumes. Both come from whoever passed the
 * TCP handshake (anyone, when no secret is set), so a malformed or hostile
 * peer must only ever get an error and a broken stream.
 *
 * Input: byte 0 picks the mode (bit 0).
 *
 * Mode A (bit 0 clear): the address exchange. The rest of the input (at most
 * 68 KiB) is what the peer sends on an accepted loopback TCP connection
 * (write side then shut) while kvt__stream_ucx_upgrade runs on it with a
 * 50 ms deadline: ux_swap_addr's u32 little-endian length (0 and lengths
 * over UX_MAX_ADDR, 64 KiB, refused), then the body it reads (a cut one
 * fails). The upgrade must fail, leaving the TCP stream to its caller (then
 * destroyed), never crash, hang or leak. A body read whole would go to
 * ucp_ep_create, whose address unpacker (UCX 1.13.1) aborts the process on
 * a malformed address (address.c:1051 "Assertion `*addr_version ==
 * UCP_OBJECT_VERSION_V2' failed", for a first byte whose low nibble is not
 * 0 or 1: the 5 bytes 01 00 00 00 02 after the handshake do it) and takes
 * no length. So by default a body is always cut one byte short: the fuzzer
 * explores kvtier's own length-prefix paths (empty, cut header, zero and
 * oversized lengths, cut bodies). FUZZ_UCX_RAW_ADDR set in the environment
 * passes bodies whole, to reproduce that or once the address is checked.
 *
 * Mode B (bit 0 set): the message stream. A pair of UCX streams made once
 * per process the way PD makes them (kvt__stream_connect / _accept, the
 * secretless handshake, both sides upgrading at once): the peer's side runs
 * on a helper thread, which drives its worker while the fuzzed side reads.
 * The input gives the messages the peer sends and the reads the fuzzed side
 * makes with its own iovec pieces, each a recvv or recvv_landed with a 5 s
 * deadline. The peer sends each message as exactly one tag message
 * (kvt__stream_ucx_send_msg, a test hook: a real peer's sendv never sends
 * one over 1 MiB, a hostile one may), or all of them as the iovecs of one
 * real sendv (or sendv_async and flush), which cuts and gathers them into
 * its own messages.
 *   byte 0: bit 1 reads with recvv_landed (else recvv); bit 2 calls wait()
 *     before every read; bit 3 ends with an over-read of 1 + x bytes past
 *     the last one sent (not with an unread tail or a dying peer); bits 4-5:
 *     1 the peer dies after x messages (its socket shut, nothing more sent;
 *     one message at a time), 2 it leaves once it has sent (its farewell,
 *     then its stream destroyed), 3 an unread tail (no last read below: the
 *     messages the reads do not take, each cut to 4 KiB, stay unread until
 *     the pair is destroyed; not with sendv); bit 6 or 7 the peer sends by
 *     sendv, bit 7 by sendv_async.
 *   byte 1: how many messages (& 31); byte 2: how many reads (& 15), and
 *     x (>> 4).
 *   then 2 bytes per message: its length code (below).
 *   then per read: a byte (bits 0-2: pieces - 1; bit 3: the wait() before
 *     it with a readable wake fd; bit 4: it waits 1 ms, else 0) and 2 bytes
 *     per piece: its length code.
 *   the rest: the content pool, repeated over the bytes sent and XORed with
 *     a fixed pseudo-random stream, so that misplaced bytes always differ.
 * A length code v (u16 LE) is v & 0x3fff times 1, 64 or 128 for v >> 14 of
 * 0, 1, 2 (up to 2 MiB), and for 3 one of 16 sizes at the stream's
 * boundaries (DIRECT_MIN 128 KiB, CHUNK = STAGE_MAX 1 MiB, 2 MiB, ...) plus
 * (v >> 4 & 63) - 32. Messages past 6 MiB in all are dropped; reads are cut
 * to the bytes sent, and a last read (one piece) takes what they left.
 *
 * The harness models the sender's sendv and the reader as stream_ucx.c
 * documents them (a message that fits the current piece lands there, any
 * other is staged whole, one over STAGE_MAX that would be staged is
 * refused) and checks, aborting on any difference: a read the model says
 * succeeds does, its pieces then hold exactly the next bytes sent, in
 * order, and the guard bytes around each piece are untouched; recvv_landed
 * reports growing counts, each covering bytes already right, the last one
 * all of them; the read that must stage a message over 1 MiB fails with
 * KVT_EPROTO and the stream is broken (a read fails at once with
 * KVT_ECONN, wait() says HUP); wait() says READABLE (always, with staged
 * bytes unread), IDLE or, with the wake fd, WOKEN, and HUP only once the
 * peer left with every byte read (or died); once every byte sent is read
 * it says IDLE (no phantom message), or HUP if the peer left; an over-read
 * times out (2 ms), or fails with KVT_ECONN once the peer left (what it
 * sent before its farewell is still read first). With a dying peer a read
 * gets the right bytes or KVT_ECONN (then the stream is broken), never
 * bytes the peer did not send. The peer sends only what the reads take (up
 * to the refused message; zero-length ones at the end before an over-read;
 * the unread tail), so no send waits on a reader that will never take it.
 * A pair that broke, lost its peer or may hold unread messages is replaced
 * (the new pair made before the old is destroyed, both sides at once, so
 * UCX's context stays up; the destroy discards what is unread); the last
 * pair is destroyed at exit, for the leak check. FUZZ_UCX_TRACE set prints
 * each input's outcome. */
#include <fcntl.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include "net/stream.h"
#include "util/clock.h"
#include "util/err.h"

#define ADDR_INPUT_MAX ((68u << 10) + 4)
#define UX_MAX_ADDR (64u << 10) /* stream_ucx.c: the longest worker address it takes */
#define STAGE_MAX (1u << 20) /* stream_ucx.c: the longest message it stages */
#define MSG_MAX ((2u << 20) + 64)
#define TOTAL_MAX (6u << 20)
#define MAX_MSGS 31 /* more than RINFLIGHT (16): a full window of zero-copy receives */
#define MAX_WIRE 128 /* the messages a sendv of MAX_MSGS makes */
#define DIRECT_MIN (128u << 10) /* stream_ucx.c: sendv sends pieces this big straight */
#define CHUNK (1u << 20)        /* stream_ucx.c: the most one message of a sendv holds */
#define MAX_READS 15
#define MAX_PIECES 8
#define GUARD 64
#define GUARD_BYTE 0xA5
#define READ_MS 5000
#define OVERREAD_MS 2

/* LeakSanitizer (clang 14, glibc 2.36) mis-sizes the dynamic TLS blocks of
 * dlopen()ed libraries (UCX's) in threads that use them and crashes scanning
 * one ("Tracer caught signal 11" after "DTLS 5 at 0x0002000000c7-..." with
 * LSAN_OPTIONS=log_threads=1; the sendv_async seed did it): thread-local
 * storage is not scanned in this target. What only TLS then holds, glibc's
 * dlopen/dlerror state and UCX's own, is suppressed by the library it is
 * allocated for (a frame in ld.so, or in UCX's libraries: the dlerror
 * record of a failed dlopen is allocated in libc, called from UCX's module
 * loader); kvtier keeps no heap pointer in TLS. */
const char *__lsan_default_options(void);
const char *__lsan_default_options(void)
{
    return "use_tls=0";
}
/* Whole stacks for every allocation (the slow unwinder, from .eh_frame):
 * the fast one stops at the first frame of a library built without frame
 * pointers (glibc, ld.so, UCX), so a leak glibc makes for UCX (the dlerror
 * record of a failed optional-module dlopen, say) would show only libc and
 * match nothing. With whole stacks every suppression below names a library
 * (a module, never a function): function names need a symbolizer and libc's
 * debug symbols, which a fresh machine lacks, and scripts/run-fuzzers.sh
 * runs every target unsymbolized so this holds on every machine. */
const char *__asan_default_options(void);
const char *__asan_default_options(void)
{
    return "fast_unwind_on_malloc=0";
}
const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void)
{
    return "leak:ld-linux\nleak:libucs.so\nleak:libucp.so\nleak:libuct.so\n";
}

static void die(const char *what)
{
    fprintf(stderr, "fuzz_ucx_stream: %s (last error: %s)\n", what, kvt_last_error());
    abort();
}
#define CHECK(c) ((c) ? (void)0 : die("check failed: " #c))

/* ---- the helper thread: the sending side of the pair ---- */

static pthread_t g_thr;
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cv = PTHREAD_COND_INITIALIZER;
static void (*g_job)(void *);
static void *g_job_arg;
static bool g_job_done = true, g_quit;

static void *helper(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&g_mu);
    for (;;) {
        while (!g_job && !g_quit) pthread_cond_wait(&g_cv, &g_mu);
        if (!g_job) break;
        void (*fn)(void *) = g_job;
        pthread_mutex_unlock(&g_mu);
        fn(g_job_arg);
        pthread_mutex_lock(&g_mu);
        g_job = NULL;
        g_job_done = true;
        pthread_cond_broadcast(&g_cv);
    }
    pthread_mutex_unlock(&g_mu);
    return NULL;
}

static void job_start(void (*fn)(void *), void *arg)
{
    pthread_mutex_lock(&g_mu);
    CHECK(g_job_done);
    g_job = fn;
    g_job_arg = arg;
    g_job_done = false;
    pthread_cond_broadcast(&g_cv);
    pthread_mutex_unlock(&g_mu);
}

static void job_wait(void)
{
    pthread_mutex_lock(&g_mu);
    while (!g_job_done) pthread_cond_wait(&g_cv, &g_mu);
    pthread_mutex_unlock(&g_mu);
}

/* ---- the pair ---- */

static int g_lfd = -1;
static uint16_t g_port;
static kvt_stream *g_tx, *g_rx; /* the peer (helper thread's) and the fuzzed reader */
static int g_wake[2] = {-1, -1}; /* a pipe kept readable: wait()'s wake fd */
static uint8_t *g_exp;           /* the bytes sent, in order */
static uint8_t *g_noise;         /* TOTAL_MAX fixed pseudo-random bytes */
static uint8_t *g_rbuf;          /* the reader's pieces, with guards */
static bool g_verbose;           /* FUZZ_UCX_TRACE set: each input's outcome */
static bool g_raw_addr;          /* FUZZ_UCX_RAW_ADDR set: mode A's bodies go to UCX whole */

static void connect_job(void *arg)
{
    kvt_stream **out = arg;
    kvt_stream_auth a = {NULL, 0, "fuzz ucx peer"};
    uint64_t dl = kvt__deadline_ns(10000);
    kvt_stream *s = NULL;
    *out = NULL;
    if (kvt__stream_connect("127.0.0.1", g_port, &a, dl, &s) != KVT_OK) return;
    if (kvt__stream_ucx_upgrade(&s, 0, dl) != KVT_OK) {
        kvt__stream_destroy(s);
        return;
    }
    *out = s;
}

static void pair_new(kvt_stream **tx, kvt_stream **rx)
{
    static kvt_stream *made;
    job_start(connect_job, &made);
    kvt_stream_auth a = {NULL, 0, "fuzz ucx reader"};
    uint64_t dl = kvt__deadline_ns(10000);
    kvt_stream *s = NULL;
    if (kvt__stream_accept(g_lfd, dl, &s) != KVT_OK) die("pair: accept");
    if (kvt__stream_auth_server(s->fd, &a, dl) != KVT_OK) die("pair: handshake");
    if (kvt__stream_ucx_upgrade(&s, 1, dl) != KVT_OK) die("pair: upgrade");
    job_wait();
    if (!made) die("pair: the peer's side");
    *tx = made;
    *rx = s;
}

static void destroy_job(void *arg)
{
    kvt__stream_destroy(arg);
}

/* A new pair first, then the old one goes: the UCP context (refcounted by
 * streams) stays up, so UCX is not initialised again. */
static void pair_replace(void)
{
    kvt_stream *tx, *rx;
    uint64_t t0 = kvt__now_ns();
    pair_new(&tx, &rx);
    job_start(destroy_job, g_tx); /* its close and the reader's answer each other */
    kvt__stream_destroy(g_rx);
    job_wait();
    if (g_verbose) fprintf(stderr, "  pair replaced in %.1f ms\n", (kvt__now_ns() - t0) / 1e6);
    g_tx = tx;
    g_rx = rx;
}

static void teardown(void)
{
    job_start(destroy_job, g_tx);
    kvt__stream_destroy(g_rx);
    job_wait();
    g_tx = g_rx = NULL;
    pthread_mutex_lock(&g_mu);
    g_quit = true;
    pthread_cond_broadcast(&g_cv);
    pthread_mutex_unlock(&g_mu);
    pthread_join(g_thr, NULL);
    close(g_lfd);
    close(g_wake[0]);
    close(g_wake[1]);
    free(g_exp);
    free(g_noise);
    free(g_rbuf);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    setenv("UCX_TLS", "tcp", 1);
    setenv("UCX_NET_DEVICES", "lo", 1); /* 127.0.0.1 only */
    setenv("UCX_WARN_UNUSED_ENV_VARS", "n", 0);
    g_verbose = getenv("FUZZ_UCX_TRACE") != NULL;
    g_raw_addr = getenv("FUZZ_UCX_RAW_ADDR") != NULL;
    if (kvt__stream_listen("127.0.0.1", 0, &g_lfd, &g_port) != KVT_OK) die("listen");
    if (pipe(g_wake) != 0 || write(g_wake[1], "w", 1) != 1) die("pipe");
    g_exp = malloc(TOTAL_MAX);
    g_noise = malloc(TOTAL_MAX);
    g_rbuf = malloc(TOTAL_MAX + (MAX_PIECES + 1) * GUARD);
    if (!g_exp || !g_noise || !g_rbuf) die("out of memory");
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < TOTAL_MAX; i += 8) { /* xorshift64 */
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        memcpy(g_noise + i, &x, 8);
    }
    if (pthread_create(&g_thr, NULL, helper, NULL) != 0) die("pthread_create");
    pair_new(&g_tx, &g_rx);
    atexit(teardown);
    return 0;
}

/* ---- mode A: the address exchange ---- */

static void run_addr(const uint8_t *p, size_t n)
{
    if (n > ADDR_INPUT_MAX) n = ADDR_INPUT_MAX;
    if (!g_raw_addr && n > 4) { /* a body UCX would unpack is always cut short */
        uint32_t len = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
        if (len >= 1 && len <= UX_MAX_ADDR && n - 4 >= len) n = 4 + len - 1;
    }
    int c = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    CHECK(c >= 0);
    int big = 1 << 20;
    setsockopt(c, SOL_SOCKET, SO_SNDBUF, &big, sizeof big);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(g_port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(c, (struct sockaddr *)&sa, sizeof sa) != 0) die("mode A: connect");
    kvt_stream *s = NULL;
    if (kvt__stream_accept(g_lfd, kvt__deadline_ns(5000), &s) != KVT_OK) die("mode A: accept");
    fcntl(c, F_SETFL, fcntl(c, F_GETFL) | O_NONBLOCK);
    for (size_t off = 0; off < n;) { /* a smaller socket buffer than asked for cuts the input */
        ssize_t w = write(c, p + off, n - off);
        if (w <= 0) break;
        off += (size_t)w;
    }
    shutdown(c, SHUT_WR);
    kvt_status st = kvt__stream_ucx_upgrade(&s, 1, kvt__deadline_ns(50));
    if (g_verbose) fprintf(stderr, "mode A: %zu bytes: %s\n", n, st ? kvt_last_error() : "upgraded");
    CHECK(strcmp(s->ops->name, st ? "tcp" : "ucx") == 0);
    kvt__stream_destroy(s);
    struct linger l = {1, 0}; /* no TIME_WAIT left behind per input */
    setsockopt(c, SOL_SOCKET, SO_LINGER, &l, sizeof l);
    close(c);
}

/* ---- mode B: the message stream ---- */

typedef struct rd {
    uint8_t hdr;
    int np;
    size_t piece[MAX_PIECES];
    size_t bytes;      /* their sum */
    size_t at;         /* its first byte's offset in the bytes sent */
    size_t stage_left; /* model: staged bytes unread before it */
    bool fails;        /* model: it must fail with KVT_EPROTO */
} rd;

typedef struct plan {
    bool landed, waits, overread, hangup, dies, unread, sendv, async;
    unsigned x;                      /* byte 2 >> 4 */
    size_t nin, in_len[MAX_MSGS];    /* the input's messages (sendv: its iovecs) */
    size_t nmsg, len[MAX_WIRE];      /* the messages on the wire */
    size_t total;                    /* their bytes */
    int nread;                       /* with the last read */
    rd r[MAX_READS + 1];
    bool broken;      /* model: a read fails */
    size_t consumed;  /* model: the messages the reads take */
    size_t stage_end; /* model: staged bytes unread after the last read */
    size_t nsend;     /* the messages sent (not with sendv: all) */
    size_t avail;     /* bytes the peer sends before it dies (all, when it does not) */
} plan;

#define UNREAD_MSG_MAX 4096 /* an unread tail's messages: eager, never waiting on the reader */

typedef struct cursor {
    const uint8_t *p;
    size_t n;
} cursor;

static unsigned get8(cursor *c)
{
    if (!c->n) return 0;
    c->n--;
    return *c->p++;
}

static size_t len_code(cursor *c)
{
    static const size_t edge[16] = {0,       64,      4096,    8192,    16384,   65536,   131072,  131072,
                                    262144,  524288,  1048576, 1048576, 1048576, 1572864, 2097152, 2097152};
    unsigned v = get8(c);
    v |= get8(c) << 8;
    unsigned x = v & 0x3fff;
    size_t n;
    switch (v >> 14) {
    case 0: n = x; break;
    case 1: n = (size_t)x * 64; break;
    case 2: n = (size_t)x * 128; break;
    default: {
        long e = (long)edge[x & 15] + (long)((x >> 4) & 63) - 32;
        n = e < 0 ? 0 : (size_t)e;
    }
    }
    return n > MSG_MAX ? MSG_MAX : n;
}

/* The messages one sendv of the input's messages (as iovecs) puts on the
 * wire, as stream_ucx.c's header documents it: pieces of DIRECT_MIN or
 * more straight from memory, CHUNK at a time; smaller ones gathered into
 * CHUNK-byte messages, sent before a direct piece and at the end. */
static void wire_of_sendv(plan *pl)
{
    size_t gl = 0;
    pl->nmsg = 0;
    for (size_t i = 0; i < pl->nin; i++) {
        size_t n = pl->in_len[i];
        if (n >= DIRECT_MIN) {
            if (gl) pl->len[pl->nmsg++] = gl;
            gl = 0;
            for (size_t off = 0; off < n; off += CHUNK) pl->len[pl->nmsg++] = n - off < CHUNK ? n - off : CHUNK;
            continue;
        }
        while (n) {
            size_t k = CHUNK - gl < n ? CHUNK - gl : n;
            gl += k, n -= k;
            if (gl == CHUNK) pl->len[pl->nmsg++] = gl, gl = 0;
        }
    }
    if (gl) pl->len[pl->nmsg++] = gl;
}

/* The reader as stream_ucx.c's header documents it, on sizes: a message
 * that fits the current piece lands there, any other is staged whole, and
 * one over STAGE_MAX that would be staged is refused. */
static void model(plan *pl)
{
    size_t mi = 0, stage = 0;
    for (int ri = 0; ri < pl->nread && !pl->broken; ri++) {
        rd *r = &pl->r[ri];
        r->stage_left = stage;
        size_t cur[MAX_PIECES];
        int np = r->np, k = 0;
        memcpy(cur, r->piece, sizeof cur);
        size_t want = r->bytes;
        while (k < np && cur[k] == 0) k++;
        for (;;) {
            while (k < np && stage) { /* unstage */
                size_t t = stage < cur[k] ? stage : cur[k];
                stage -= t, cur[k] -= t, want -= t;
                while (k < np && cur[k] == 0) k++;
            }
            if (!want) break;
            CHECK(mi < pl->nmsg); /* the reads never ask more than is sent */
            size_t len = pl->len[mi++];
            if (len == 0) continue;
            if (len <= cur[k]) { /* zero copy */
                cur[k] -= len, want -= len;
                while (k < np && cur[k] == 0) k++;
            } else if (len > STAGE_MAX) {
                r->fails = pl->broken = true;
                break;
            } else {
                stage = len;
            }
        }
    }
    pl->consumed = mi;
    pl->stage_end = stage;
    /* Sent: what the reads take (up to the refused message: a broken
     * reader takes no more, and a send the reader never matches would wait
     * out its deadline); all, with sendv (its messages are never refused,
     * the reads take them all), an unread tail (left behind, small) or a
     * healthy over-read (it takes the zero-length ones at the end). */
    CHECK(!pl->sendv || !pl->broken);
    pl->nsend = pl->sendv || pl->unread || (pl->overread && !pl->broken) ? pl->nmsg : mi;
    if (pl->unread)
        for (size_t i = mi; i < pl->nmsg; i++)
            if (pl->len[i] > UNREAD_MSG_MAX) pl->len[i] = UNREAD_MSG_MAX;
    pl->avail = 0;
    for (size_t i = 0; i < pl->nsend && !(pl->dies && i == pl->x); i++) pl->avail += pl->len[i];
}

static void parse(const uint8_t *data, size_t size, plan *pl, cursor *pool)
{
    memset(pl, 0, sizeof *pl);
    cursor c = {data, size};
    uint8_t mode = (uint8_t)get8(&c);
    unsigned tail = (mode >> 4) & 3;
    pl->landed = mode & 2;
    pl->waits = mode & 4;
    pl->dies = tail == 1;
    pl->hangup = tail == 2;
    pl->sendv = (mode & 0xc0) && !pl->dies;
    pl->async = pl->sendv && (mode & 0x80);
    pl->unread = tail == 3 && !pl->sendv;
    pl->overread = (mode & 8) && !pl->unread && !pl->dies;
    size_t nm = get8(&c) & 31;
    unsigned b2 = get8(&c);
    int nr = (int)(b2 & 15);
    pl->x = b2 >> 4;
    for (size_t i = 0; i < nm; i++) {
        size_t l = len_code(&c);
        if (pl->total + l > TOTAL_MAX) continue; /* dropped */
        pl->in_len[pl->nin++] = l;
        pl->total += l;
    }
    if (pl->sendv) {
        wire_of_sendv(pl);
    } else {
        memcpy(pl->len, pl->in_len, pl->nin * sizeof *pl->len);
        pl->nmsg = pl->nin;
    }
    size_t left = pl->total;
    for (int i = 0; i < nr; i++) {
        rd *r = &pl->r[pl->nread++];
        r->hdr = (uint8_t)get8(&c);
        r->np = (r->hdr & 7) + 1;
        r->at = pl->total - left;
        for (int j = 0; j < r->np; j++) {
            size_t l = len_code(&c);
            if (l > left) l = left;
            r->piece[j] = l;
            r->bytes += l;
            left -= l;
        }
    }
    if (left && !pl->unread) { /* the last read takes the rest */
        rd *r = &pl->r[pl->nread++];
        r->np = 1;
        r->at = pl->total - left;
        r->piece[0] = r->bytes = left;
    }
    *pool = c;
}

typedef struct send_job {
    const plan *pl;
    kvt_status st;
    bool hung_up; /* the peer's stream is gone */
} send_job;

/* The peer: the messages, each as one tag message or all as one sendv (or
 * sendv_async and flush); then, leaving, its farewell (every message
 * delivered) and its stream destroyed; or, dying, its socket shut after x
 * messages and no more sent. */
static void send_msgs(void *arg)
{
    send_job *j = arg;
    const plan *pl = j->pl;
    uint64_t dl = kvt__deadline_ns(READ_MS);
    j->st = KVT_OK;
    if (pl->sendv) {
        struct iovec iov[MAX_MSGS];
        size_t off = 0;
        for (size_t i = 0; i < pl->nin; i++) {
            iov[i] = (struct iovec){g_exp + off, pl->in_len[i]};
            off += pl->in_len[i];
        }
        if (!pl->async) j->st = g_tx->ops->sendv(g_tx, iov, (int)pl->nin, dl);
        else if (!(j->st = g_tx->ops->sendv_async(g_tx, iov, (int)pl->nin, dl)))
            j->st = g_tx->ops->flush(g_tx, dl);
    } else {
        size_t off = 0;
        for (size_t i = 0; i < pl->nsend && !j->st; i++) {
            if (pl->dies && i == pl->x) break;
            j->st = kvt__stream_ucx_send_msg(g_tx, g_exp + off, pl->len[i], dl);
            off += pl->len[i];
        }
    }
    if (pl->dies) shutdown(g_tx->fd, SHUT_RDWR); /* as a killed process's socket */
    if (!j->st && pl->hangup && !pl->broken) {
        g_tx->ops->farewell(g_tx, dl);
        kvt__stream_destroy(g_tx);
        j->hung_up = true;
    }
}

/* Waits for the peer's job while driving the reader's worker (as a link
 * thread's wait() does), so that a peer closing its endpoint is answered. */
static void job_wait_driving(kvt_stream *s)
{
    for (;;) {
        pthread_mutex_lock(&g_mu);
        bool done = g_job_done;
        pthread_mutex_unlock(&g_mu);
        if (done) return;
        (void)s->ops->wait(s, -1, 1);
    }
}

/* Lays a read's pieces out in g_rbuf, each after a guard. */
static int lay_out(const rd *r, struct iovec *iov)
{
    uint8_t *p = g_rbuf;
    memset(p, GUARD_BYTE, GUARD);
    for (int i = 0; i < r->np; i++) {
        p += GUARD;
        iov[i] = (struct iovec){p, r->piece[i]};
        memset(p, 0, r->piece[i]);
        p += r->piece[i];
        memset(p, GUARD_BYTE, GUARD);
    }
    return r->np;
}

static void check_guards(const rd *r)
{
    const uint8_t *p = g_rbuf;
    for (int i = 0; i <= r->np; i++) {
        for (int g = 0; g < GUARD; g++)
            if (p[g] != GUARD_BYTE) die("a byte landed outside the reader's pieces");
        if (i < r->np) p += GUARD + r->piece[i];
    }
}

typedef struct landed_chk {
    const struct iovec *iov;
    int cnt;
    const uint8_t *exp;
    size_t total, last;
} landed_chk;

static void on_landed(void *arg, size_t n)
{
    landed_chk *l = arg;
    if (n <= l->last || n > l->total) die("landed: counts must grow, within the read");
    size_t base = 0;
    for (int i = 0; i < l->cnt && base < n; i++) {
        size_t a = l->last > base ? l->last - base : 0, e = n - base;
        if (e > l->iov[i].iov_len) e = l->iov[i].iov_len;
        if (a < e && memcmp((uint8_t *)l->iov[i].iov_base + a, l->exp + base + a, e - a) != 0)
            die("landed: bytes reported landed differ from the bytes sent");
        base += l->iov[i].iov_len;
    }
    l->last = n;
}

/* wait() before a read: HUP only once the peer is gone with every byte it
 * sent read, or once it died; true on HUP (the stream is broken then). */
static bool check_wait(const plan *pl, const rd *r, kvt_stream *s)
{
    bool woke = r->hdr & 8;
    int w = s->ops->wait(s, woke ? g_wake[0] : -1, (r->hdr & 16) ? 1 : 0);
    if (w == KVT_STREAM_HUP && !pl->dies && r->at < pl->avail) die("wait: HUP with bytes sent still unread");
    if (w == KVT_STREAM_WOKEN && !woke) die("wait: WOKEN without a wake fd");
    if (r->stage_left && w != KVT_STREAM_READABLE) die("wait: staged bytes unread, yet not READABLE");
    return w == KVT_STREAM_HUP;
}

static void check_broken(kvt_stream *s)
{
    uint8_t b;
    if (kvt__stream_recv(s, &b, 1, kvt__deadline_ns(READ_MS)) != KVT_ECONN)
        die("a read on a broken stream must fail at once with KVT_ECONN");
    if (s->ops->wait(s, -1, 0) != KVT_STREAM_HUP) die("wait on a broken stream must say HUP");
}

static void overread(kvt_stream *s, size_t n, kvt_status want)
{
    rd r = {.np = 1, .piece = {n}};
    struct iovec iov[1];
    lay_out(&r, iov);
    kvt_status st = s->ops->recvv(s, iov, 1, kvt__deadline_ns(want == KVT_ECONN ? READ_MS : OVERREAD_MS));
    check_guards(&r);
    if (st != want) die("a read past every byte sent did not fail as it should");
}

static void run_msgs(const uint8_t *data, size_t size)
{
    plan pl;
    cursor pool;
    parse(data, size, &pl, &pool);
    model(&pl);
    /* the bytes sent: the pool repeated, XOR the noise */
    size_t total = 0;
    for (size_t i = 0; i < pl.nsend; i++) total += pl.len[i];
    if (pool.n) {
        for (size_t off = 0; off < total; off += pool.n)
            memcpy(g_exp + off, pool.p, total - off < pool.n ? total - off : pool.n);
        for (size_t i = 0; i < total; i++) g_exp[i] ^= g_noise[i];
    } else {
        memcpy(g_exp, g_noise, total);
    }

    uint64_t t0 = kvt__now_ns();
    send_job sj = {&pl, KVT_OK, false};
    job_start(send_msgs, &sj);
    kvt_stream *s = g_rx;
    int done = 0;
    bool gone = false;  /* wait() said HUP: the peer left (or died) */
    bool lost = false;  /* a read failed as the peer died */
    for (int ri = 0; ri < pl.nread && !lost; ri++, done++) {
        const rd *r = &pl.r[ri];
        struct iovec iov[MAX_PIECES];
        int cnt = lay_out(r, iov);
        if (pl.waits && !gone) gone = check_wait(&pl, r, s);
        if (gone) { /* every byte read (or the peer died): the reads that follow fail */
            if ((r->bytes && !pl.dies) || s->ops->recvv(s, iov, cnt, kvt__deadline_ns(READ_MS)) != KVT_ECONN)
                die("a read after wait() said HUP did not fail with KVT_ECONN");
            continue;
        }
        landed_chk lc = {iov, cnt, g_exp + r->at, r->bytes, 0};
        uint64_t dl = kvt__deadline_ns(READ_MS);
        kvt_status st = pl.landed ? kvt__stream_recvv_landed(s, iov, cnt, dl, 0, on_landed, &lc)
                                  : s->ops->recvv(s, iov, cnt, dl);
        check_guards(r);
        if (pl.dies && st == KVT_ECONN) { /* the peer died; what it sent before may or may not be read */
            check_broken(s);
            lost = true;
            continue;
        }
        if (r->fails) {
            if (st != KVT_EPROTO) die("a staged message over STAGE_MAX was not refused with KVT_EPROTO");
            check_broken(s);
            done++;
            break;
        }
        if (st) die("a read the model says succeeds failed");
        if (r->at + r->bytes > pl.avail) die("a read succeeded past the bytes sent");
        if (pl.landed && r->bytes && lc.last != r->bytes) die("landed: the last count is not the whole read");
        size_t at = r->at;
        for (int i = 0; i < cnt; i++) {
            if (memcmp(iov[i].iov_base, g_exp + at, iov[i].iov_len) != 0)
                die("the bytes read differ from the bytes sent");
            at += iov[i].iov_len;
        }
    }
    /* An over-read: more than was sent. With the peer leaving, it runs while
     * the peer says farewell (its flush needs this worker driven: the
     * zero-length messages at the end wait unread until the over-read takes
     * them) and fails once the peer is gone; else it runs once every send
     * is done (so no zero-length message comes after it) and times out. */
    bool over = !pl.broken && pl.overread, over_hup = over && pl.hangup;
    size_t over_n = 1 + pl.x;
    if (over_hup) overread(s, over_n, KVT_ECONN);
    job_wait_driving(s);
    if (sj.hung_up) g_tx = NULL;
    if (!pl.broken && !pl.dies && sj.st) die("the peer's send failed on a healthy stream");
    if (over_hup && !sj.hung_up) die("the peer did not leave");
    /* Replaced: a pair that broke or lost its peer, or that may hold
     * unread messages (an unread tail; zero-length ones an over-read that
     * timed out may have missed, still on their way) */
    bool replace = pl.broken || pl.dies || sj.st || sj.hung_up || pl.consumed < pl.nsend || pl.stage_end;
    if (over && !over_hup) {
        overread(s, over_n, KVT_ETIMEDOUT);
        if (s->ops->wait(s, -1, 0) == KVT_STREAM_HUP) replace = true;
    }
    if (!over && !pl.broken && !pl.unread && !pl.dies) {
        /* every byte sent was read: nothing more, and a gone peer is seen */
        int w = s->ops->wait(s, -1, sj.hung_up ? READ_MS : 0);
        if (w != (sj.hung_up ? KVT_STREAM_HUP : KVT_STREAM_IDLE))
            die("wait: once every byte sent was read, not IDLE (HUP with the peer gone)");
    }
    if (!pl.broken && !pl.dies && pl.stage_end && s->ops->wait(s, -1, 0) != KVT_STREAM_READABLE)
        die("wait: staged bytes unread, yet not READABLE");
    if (g_verbose)
        fprintf(stderr, "mode B: %zu messages%s (%zu on the wire, %zu bytes, %zu sent), %d reads%s%s%s%s%s: %s, %.1f ms\n",
                pl.nin, pl.sendv ? (pl.async ? " by sendv_async" : " by sendv") : "", pl.nmsg, pl.total, pl.nsend,
                done, pl.landed ? " landed" : "", pl.overread ? " +over-read" : "", pl.unread ? " +unread tail" : "",
                sj.hung_up ? " +peer left" : "", pl.dies ? " +peer died" : "",
                pl.broken ? "refused" : lost || (gone && pl.dies) ? "lost" : "ok", (kvt__now_ns() - t0) / 1e6);
    if (replace) pair_replace();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    if (data[0] & 1) run_msgs(data, size);
    else run_addr(data + 1, size - 1);
    kvt__clear_error();
    return 0;
}
