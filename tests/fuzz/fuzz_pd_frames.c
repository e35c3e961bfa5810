/* fuzz_pd_frames.c - PD link frames as a peer sends them, through the real
 * frame handlers of both endpoint roles. Every byte a decode rank sends a
 * prefill rank (and back) is decoded by pd_conn_read and handled by the
 * endpoint's frame hook (sender.c / receiver.c): room page tables, DATA
 * batches landing straight in engine pages with their checksum trailer,
 * DONE/DONE_ACK, FAIL/ABORT notes. A hostile or broken peer must not be
 * able to write outside a room's pages, fail another peer's room, leak a
 * room reference, or stall a link thread.
 *
 * Input: byte 0 picks the mode, the rest is what the peer sends.
 *   mode & 3 == 0: a SENDER endpoint (prefill TP 1) over fake links from
 *     decode TP 2 ranks: sender_frame (on_room, add_target, maybe_start,
 *     on_done_ack, on_fail, on_abort_ack), sender_work (DATA batches and
 *     DONE, sent into the void) and sender_dead at the link's end.
 *   mode & 3 == 1: a RECEIVER endpoint (decode TP 1) over fake links from
 *     prefill TP 2 ranks: receiver_frame (on_data, land, hash_landed,
 *     read_trailer, drain, on_done, on_fail), receiver_sent, receiver_dead.
 *   mode & 3 == 2: the answer a decode rank's REGISTER (or any bootstrap
 *     request) reads back: pd_bootstrap_call_ex (bs_call) and the checks
 *     register_peer makes on the OK body.
 *   mode & 3 == 3: a real sender (kvt_pd_sender_create, registered with a
 *     real bootstrap service) over TCP: the bytes follow a (secretless)
 *     authentication on its data port, so they reach the static handshake
 *     (REGISTER: pd_desc_decode, pd_plan_compute, agree_max_frame, the
 *     REFUSE path) and then pd_conn_main with the real link thread. This
 *     mode runs on the sender's threads, so its coverage depends on timing.
 *   mode & 4 (modes 0, 1): two links instead of one; a frame goes to link
 *     (byte 44 of its header & 1), the header's reserved word, which the
 *     decoder ignores (a real peer sends 0 there: link 0).
 *   mode & 8 (modes 0-2): the links are authenticated (pd/mac.h) with a
 *     known session key, and the harness tags the input's frames as a peer
 *     holding that key would (header tag, body or DATA payload, body tag;
 *     frame by frame, per link), so inputs get past the tag checks into the
 *     handlers; a header whose flags have bit 15 set gets a wrong header
 *     tag, one with bit 14 a wrong body tag, to reach the refusals too.
 *   mode >> 4: how many bytes one receive lands at a time (recvv_landed:
 *     the receiver hashes, or tags, each chunk as it lands),
 *     16 << (mode >> 4 & 7).
 *
 * Between frames the input may hold 8-byte engine records, "KENG", op,
 * room, a, b: what the engine of the fuzzed endpoint does at that point
 * through the public API (op & 3: 0 kvt_pd_sender_room / kvt_pd_receiver_room
 * with num_tokens 1 + a % 48 and prefix b % num_tokens, 1 kvt_pd_sender_send
 * of 1 + a % 48 tokens / kvt_pd_room_info_get, 2 abort, 3 clear), so rooms
 * reach every state.
 *
 * The endpoints of modes 0-2 are built with pd_ep_init (no threads, no
 * sockets); their hooks are the real ones, read from a sender and a receiver
 * created once at start. Everything per input (links, rooms, queued
 * frames) is freed at its end; frames the handlers send go nowhere (the
 * fake stream's sends succeed). Every receive is served from the input and
 * never waits: past its end the link is lost (KVT_ECONN), as when a peer
 * hangs up. The engine API calls take the endpoint inside a public handle;
 * both handles start with their pd_ep (checked at start), so the fuzzer
 * hands them a zeroed block that starts with its own endpoint. */
#include <poll.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include "kvtier.h"
#include "net/stream.h"
#include "pd/bootstrap.h"
#include "pd/desc.h"
#include "pd/ep.h"
#include "pd/wire.h"
#include "pd/xfer.h"
#include "util/clock.h"
#include "util/err.h"

#define LAYERS 2
#define HEADS 4      /* KV heads of the model in total */
#define HEAD_DIM 8
#define ENGINE_PAGES 96
#define MAX_FRAME (64u << 10)
#define MAX_TOK 48
#define ENG_MAGIC "KENG"
#define ENG_LEN 8
#define BOX_BYTES (sizeof(pd_ep) + (64u << 10)) /* room for the rest of a handle */

/* ---- the fake stream: receives are served from the input ---- */

typedef struct feed {
    const uint8_t *p;
    size_t n, off;
    size_t piece; /* bytes one landed receive moves at a time */
} feed;

typedef struct fake_stream {
    kvt_stream base;
    feed *f;
} fake_stream;

static size_t take(feed *f, void *dst, size_t want)
{
    size_t k = f->n - f->off < want ? f->n - f->off : want;
    if (k) memcpy(dst, f->p + f->off, k);
    f->off += k;
    return k;
}

static kvt_status fs_sendv(kvt_stream *s, const struct iovec *iov, int cnt, uint64_t dl)
{
    (void)s, (void)iov, (void)cnt, (void)dl;
    return KVT_OK;
}

static kvt_status fs_recvv(kvt_stream *s, const struct iovec *iov, int cnt, uint64_t dl)
{
    (void)dl;
    feed *f = ((fake_stream *)s)->f;
    for (int i = 0; i < cnt; i++)
        if (take(f, iov[i].iov_base, iov[i].iov_len) < iov[i].iov_len) return KVT_ECONN;
    return KVT_OK;
}

static kvt_status fs_recvv_landed(kvt_stream *s, const struct iovec *iov, int cnt, uint64_t dl,
                                  uint64_t idle_ns, void (*landed)(void *arg, size_t n), void *arg)
{
    (void)dl, (void)idle_ns;
    feed *f = ((fake_stream *)s)->f;
    size_t total = 0;
    for (int i = 0; i < cnt; i++) {
        for (size_t done = 0; done < iov[i].iov_len;) {
            size_t want = iov[i].iov_len - done < f->piece ? iov[i].iov_len - done : f->piece;
            size_t k = take(f, (uint8_t *)iov[i].iov_base + done, want);
            done += k;
            total += k;
            if (k) landed(arg, total);
            if (k < want) return KVT_ECONN;
        }
    }
    return KVT_OK;
}

static int fs_wait(kvt_stream *s, int wake_fd, int timeout_ms)
{
    (void)s, (void)wake_fd, (void)timeout_ms;
    return KVT_STREAM_HUP;
}

static void fs_destroy(kvt_stream *s) { free(s); }

static const kvt_stream_ops fake_ops = {"fuzz", fs_sendv, fs_recvv, fs_wait, fs_destroy,
                                        NULL, NULL, NULL, fs_recvv_landed};

static kvt_stream *fake_stream_new(feed *f)
{
    fake_stream *s = calloc(1, sizeof *s);
    if (!s) abort();
    s->base.ops = &fake_ops;
    s->base.fd = -1;
    s->f = f;
    return &s->base;
}

/* ---- tagging an input as a peer holding the key does (mode & 8) ---- */

static const uint8_t KEY[PD_SESSION_KEY_LEN] = "fuzz_pd_frames known session key";

typedef struct buf {
    uint8_t *p;
    size_t n, cap;
} buf;

static void put(buf *b, const void *p, size_t n)
{
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2;
        b->p = realloc(b->p, b->cap);
        if (!b->p) abort();
    }
    memcpy(b->p + b->n, p, n);
    b->n += n;
}

/* The input p[0, n) with every frame tagged by peer[link] (the link as
 * run_links routes it); engine records and a truncated tail pass as they
 * are. The caller frees out->p. */
static void tag_input(const uint8_t *p, size_t n, pd_mac **peer, int nconns, buf *out)
{
    for (size_t off = 0; off < n;) {
        const uint8_t *at = p + off;
        size_t left = n - off;
        if (left >= ENG_LEN && memcmp(at, ENG_MAGIC, 4) == 0) {
            put(out, at, ENG_LEN);
            off += ENG_LEN;
            continue;
        }
        if (left < PD_HDR_LEN) {
            put(out, at, left);
            break;
        }
        pd_mac_dir *d = &peer[nconns == 2 && left > 44 ? at[44] & 1 : 0]->tx;
        pd_hdr h;
        pd_hdr_decode(&h, at);
        uint8_t tag[PD_TAG_LEN];
        pd_mac_head(d, at, tag);
        tag[0] ^= (h.flags >> 15) & 1;
        put(out, at, PD_HDR_LEN);
        put(out, tag, sizeof tag);
        off += PD_HDR_LEN;
        bool data = h.type == PD_F_DATA;
        uint64_t rest = data ? h.payload_len : h.body_len, take = rest < n - off ? rest : n - off;
        put(out, p + off, (size_t)take);
        pd_mac_body(d, p + off, (size_t)take);
        off += (size_t)take;
        if (take == rest && (data || rest)) {
            pd_mac_end(d, tag);
            tag[0] ^= (h.flags >> 14) & 1;
            put(out, tag, sizeof tag);
        }
    }
}

/* ---- setup ---- */

static kvt_geometry *make_geo(uint32_t heads, uint32_t tpp, kvt_layout lay)
{
    kvt_geometry *g = NULL;
    kvt_layer_spec s = {.num_components = 2};
    s.component[0] = s.component[1] = (kvt_component_spec){heads, HEAD_DIM, 2};
    if (kvt_geometry_create(&g, LAYERS, tpp, lay) || kvt_geometry_set_layers(g, 0, LAYERS, &s)) abort();
    return g;
}

/* One fuzzed endpoint: its handle-sized block, engine memory, and the
 * descriptors of the two peers its links come from. */
typedef struct side {
    void *box; /* starts with the pd_ep */
    pd_ep *ep;
    kvt_emu *emu;
    kvt_geometry *geo;
    pd_desc peer[2];
} side;

static side S, R;             /* the sender and receiver endpoints */
static kvt_pd_bootstrap *g_bs; /* mode 3 */
static kvt_pd_sender *g_snd;
static uint16_t g_snd_port;
static bool g_trace;          /* FUZZ_PD_TRACE set: print each input's outcome */
static uint32_t src_pages[MAX_TOK], dst_pages[MAX_TOK]; /* the engines' page tables */

static void side_init(side *sd, int role, kvt_geometry *geo, kvt_geometry *peer_geo, uint32_t peer_tp)
{
    sd->geo = geo;
    kvt_engine_memory mem;
    if (kvt_emu_create(&sd->emu, geo, ENGINE_PAGES) || kvt_emu_memory(sd->emu, &mem)) abort();
    sd->box = calloc(1, BOX_BYTES);
    sd->ep = sd->box;
    kvt_pd_params p = {.net = {.max_frame = MAX_FRAME, .peer_timeout_ms = 50, .heartbeat_ms = 10},
                       .bootstrap_port = 1, .rank = {1, 0, 1, 0, 0}, .geo = geo, .mem = &mem};
    if (pd_ep_init(sd->ep, &p, role, "fuzz") != KVT_OK) abort();
    int peer_role = role == PD_ROLE_PREFILL ? PD_ROLE_DECODE : PD_ROLE_PREFILL;
    for (uint32_t i = 0; i < 2; i++) {
        kvt_pd_rank rk = {peer_tp, i, 1, 0, 0};
        if (pd_desc_from_geometry(&sd->peer[i], peer_geo, &rk, (uint32_t)peer_role)) abort();
    }
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    setenv("KVTIER_PD_QUIET", "1", 0);
    g_trace = getenv("FUZZ_PD_TRACE") != NULL;
    /* prefill pages of 4 tokens, layer-first; decode pages of 2, page-first */
    kvt_geometry *pre1 = make_geo(HEADS, 4, KVT_LAYOUT_LAYER_FIRST), *pre2 = make_geo(HEADS / 2, 4, KVT_LAYOUT_LAYER_FIRST);
    kvt_geometry *dec1 = make_geo(HEADS, 2, KVT_LAYOUT_PAGE_FIRST), *dec2 = make_geo(HEADS / 2, 2, KVT_LAYOUT_PAGE_FIRST);

    /* A real service, prefill rank and decode rank: the hooks, and mode 3. */
    kvt_pd_net_params bn = {.peer_timeout_ms = 60000};
    if (kvt_pd_bootstrap_create(&g_bs, &bn)) abort();
    uint16_t bport;
    kvt_pd_bootstrap_port(g_bs, &bport);
    static kvt_emu *se, *re;
    kvt_engine_memory sm, rm;
    if (kvt_emu_create(&se, pre1, ENGINE_PAGES) || kvt_emu_memory(se, &sm)) abort();
    if (kvt_emu_create(&re, dec1, ENGINE_PAGES) || kvt_emu_memory(re, &rm)) abort();
    kvt_pd_params sp = {.net = {.max_frame = MAX_FRAME, .peer_timeout_ms = 1000},
                        .bootstrap_port = bport, .rank = {1, 0, 1, 0, 0}, .geo = pre1, .mem = &sm,
                        .bootstrap_timeout_ms = 20, .waiting_timeout_ms = 20, .transfer_timeout_ms = 200};
    kvt_pd_params rp = sp;
    rp.geo = dec1;
    rp.mem = &rm;
    kvt_pd_receiver *rcv = NULL;
    if (kvt_pd_sender_create(&g_snd, &sp) || kvt_pd_receiver_create(&rcv, &rp)) {
        fprintf(stderr, "fuzz_pd_frames: setup: %s\n", kvt_last_error());
        abort();
    }
    kvt_pd_sender_port(g_snd, &g_snd_port);

    side_init(&S, PD_ROLE_PREFILL, pre1, dec2, 2);
    side_init(&R, PD_ROLE_DECODE, dec1, pre2, 2);
    S.ep->hooks = pd_sender_ep(g_snd)->hooks;
    R.ep->hooks = pd_receiver_ep(rcv)->hooks;
    kvt_pd_receiver_destroy(rcv);
    /* the public calls below find the endpoint at the start of the handle */
    if (pd_sender_ep((kvt_pd_sender *)S.box) != S.ep || pd_receiver_ep((kvt_pd_receiver *)R.box) != R.ep) abort();
    kvt_geometry_destroy(pre2);
    kvt_geometry_destroy(dec2);
    for (uint32_t i = 0; i < MAX_TOK; i++) { /* scattered engine pages */
        src_pages[i] = ENGINE_PAGES - 1 - 2 * i;
        dst_pages[i] = ENGINE_PAGES - 1 - i;
    }
    return 0;
}

/* ---- one input on a fuzzed endpoint ---- */

static void flush_queue(pd_conn *c)
{
    char b[64];
    while (read(c->wake[0], b, sizeof b) > 0) {
    }
    for (;;) {
        pd_frame *f = pd_conn_pop_frame(c);
        if (!f) return;
        if (c->ep->hooks->sent) c->ep->hooks->sent(c, f); /* it went out */
        free(f);
    }
}

/* The link dies as pd_conn_main ends it. */
static void kill_link(pd_conn *c, kvt_status st)
{
    char why[KVT_ERRMSG_MAX];
    snprintf(why, sizeof why, "%s", kvt_last_error());
    atomic_store(&c->dead, true);
    pthread_mutex_lock(&c->ep->mu);
    c->ep->hooks->dead(c, st, why);
    pthread_mutex_unlock(&c->ep->mu);
}

/* What the link threads do between frames: send what is queued, and on a
 * sender the data work (DATA batches, DONE), bounded. */
static void link_work(pd_conn **c, int n)
{
    for (int i = 0; i < n; i++) {
        if (atomic_load(&c[i]->dead)) continue;
        flush_queue(c[i]);
        for (int k = 0; c[i]->ep->hooks->work && k < 256; k++) {
            bool busy = false;
            kvt_status st = c[i]->ep->hooks->work(c[i], &busy);
            if (st) {
                kill_link(c[i], st);
                break;
            }
            flush_queue(c[i]);
            if (!busy) break;
        }
    }
}

static void engine_op(side *sd, bool sender, const uint8_t *r)
{
    uint8_t op = r[4] & 3, a = r[6], b = r[7];
    uint64_t room = r[5];
    uint32_t ntok = 1 + a % MAX_TOK;
    if (sender) {
        kvt_pd_sender *s = sd->box;
        if (op == 0) (void)kvt_pd_sender_room(s, room);
        else if (op == 1) (void)kvt_pd_sender_send(s, room, src_pages, (ntok + 3) / 4, ntok);
        else if (op == 2) (void)kvt_pd_sender_abort(s, room, "fuzz");
        else (void)kvt_pd_sender_clear(s, room);
    } else {
        kvt_pd_receiver *rc = sd->box;
        if (op == 0) {
            kvt_pd_room_params p = {dst_pages, (ntok + 1) / 2 + (b >> 6), ntok, b % ntok};
            (void)kvt_pd_receiver_room(rc, room, &p);
        } else if (op == 1) {
            kvt_pd_room_info info;
            (void)kvt_pd_room_info_get(NULL, rc, room, &info);
        } else if (op == 2) (void)kvt_pd_receiver_abort(rc, room, "fuzz");
        else (void)kvt_pd_receiver_clear(rc, room);
    }
}

static void trace_rooms(pd_ep *ep)
{
    for (uint32_t b = 0; b < PD_ROOM_BUCKETS; b++)
        for (pd_room *r = ep->buckets[b]; r; r = r->next)
            fprintf(stderr, "  room %llu: %s bytes %llu%s%s\n", (unsigned long long)r->id,
                    kvt_pd_poll_name(r->state), (unsigned long long)r->bytes, r->msg[0] ? ": " : "", r->msg);
}

static void run_links(side *sd, bool sender, int nconns, feed *f, bool mac)
{
    pd_ep *ep = sd->ep;
    pd_conn *c[2] = {NULL, NULL};
    pd_mac *peer[2] = {NULL, NULL};
    buf tagged = {0};
    if (mac) { /* the fuzzed end accepted the links when it is the sender */
        for (int i = 0; i < nconns; i++)
            if (pd_mac_new(&peer[i], KEY, !sender)) abort();
        tag_input(f->p, f->n, peer, nconns, &tagged);
        *f = (feed){tagged.p, tagged.n, 0, f->piece};
    }
    for (int i = 0; i < nconns; i++) {
        if (pd_conn_new(ep, fake_stream_new(f), &c[i]) != KVT_OK) abort();
        if (mac && pd_mac_new(&c[i]->mac, KEY, sender)) abort();
        c[i]->idx = (uint32_t)i;
        c[i]->registered = true;
        if (pd_desc_copy(&c[i]->peer, &sd->peer[i])) abort();
        kvt_status st = sender ? pd_plan_compute(&c[i]->plan, &ep->desc, &c[i]->peer)
                               : pd_plan_compute(&c[i]->plan, &c[i]->peer, &ep->desc);
        if (!st && !sender) st = pd_topo_expected(&c[i]->peer, &ep->desc, &c[i]->expected);
        if (st) {
            fprintf(stderr, "fuzz_pd_frames: plan: %s\n", kvt_last_error());
            abort();
        }
        c[i]->has_plan = true;
        snprintf(c[i]->name, sizeof c[i]->name, "fuzz link %d", i);
        ep->conns[i] = c[i];
    }
    ep->nconns = (uint32_t)nconns;

    int frames = 0;
    while (f->off < f->n) {
        const uint8_t *at = f->p + f->off;
        size_t left = f->n - f->off;
        if (left >= ENG_LEN && memcmp(at, ENG_MAGIC, 4) == 0) {
            engine_op(sd, sender, at);
            f->off += ENG_LEN;
        } else {
            pd_conn *x = c[nconns == 2 && left > 44 ? at[44] & 1 : 0];
            if (atomic_load(&x->dead)) break;
            pd_hdr h;
            kvt_status st = pd_conn_read(x, &h, pd_conn_deadline(x));
            if (!st) st = ep->hooks->frame(x, &h);
            if (st) { /* the link dies; the other one (if any) goes on */
                if (g_trace) fprintf(stderr, "  link %u: %s\n", x->idx, kvt_last_error());
                kill_link(x, st);
            }
            frames++;
        }
        link_work(c, nconns);
    }
    if (g_trace) {
        fprintf(stderr, "fuzz_pd_frames: %s, %d frames\n", sender ? "sender" : "receiver", frames);
        trace_rooms(ep);
    }
    /* the peer hung up: every link still up is lost */
    for (int i = 0; i < nconns; i++) {
        if (atomic_load(&c[i]->dead)) continue;
        kvt__fail(KVT_ECONN, "%s: link closed", c[i]->name);
        kill_link(c[i], KVT_ECONN);
    }
    for (int i = 0; i < nconns; i++) {
        flush_queue(c[i]);
        pd_conn_free(c[i]);
        ep->conns[i] = NULL;
    }
    ep->nconns = 0;
    /* every room goes: their only references are the table's now */
    for (uint32_t b = 0; b < PD_ROOM_BUCKETS; b++) {
        for (pd_room *r = ep->buckets[b], *n; r; r = n) {
            n = r->next;
            if (r->refs != 1) {
                fprintf(stderr, "fuzz_pd_frames: room %llu still has %d references after its links were freed\n",
                        (unsigned long long)r->id, r->refs);
                abort();
            }
            pd_room_unref(r);
        }
        ep->buckets[b] = NULL;
    }
    ep->nrooms = 0;
    ep->next_gen = 0;
    for (int i = 0; i < nconns; i++) pd_mac_free(peer[i]);
    free(tagged.p);
}

/* Mode 2: a bootstrap answer as the receiver's registration reads it. */
static void run_answer(feed *f, bool mac)
{
    pd_mac *m = NULL, *peer = NULL;
    buf tagged = {0};
    if (mac) { /* a decode rank's REGISTER on an authenticated link */
        if (pd_mac_new(&m, KEY, false) || pd_mac_new(&peer, KEY, true)) abort();
        tag_input(f->p, f->n, &peer, 1, &tagged);
        *f = (feed){tagged.p, tagged.n, 0, f->piece};
    }
    kvt_stream *s = fake_stream_new(f);
    pd_hdr h = {.type = PD_F_REGISTER, .body_len = 4};
    uint8_t body[4] = {0, 0, 1, 0}, *ok = NULL;
    uint32_t oklen = 0;
    kvt_pd_net_params net = {.max_frame = MAX_FRAME};
    kvt_status st = pd_bootstrap_call_ex(s, m, &h, body, &net, kvt__deadline_ns(50), "fuzz", &ok, &oklen);
    if (!st && oklen == 4 && pd_get32(ok) < 4096) st = KVT_EPROTO; /* register_peer's check */
    if (!st && ok && ok[oklen] != 0) abort(); /* answers are NUL-terminated for messages */
    free(ok);
    kvt__stream_destroy(s);
    pd_mac_free(m);
    pd_mac_free(peer);
    free(tagged.p);
}

/* Mode 3: the bytes go to the real sender's data port after authentication. */
static void run_real_sender(const uint8_t *p, size_t n)
{
    kvt_stream_auth a = {NULL, 0, "fuzz"};
    kvt_stream *s = NULL;
    uint64_t dl = kvt__deadline_ns(2000);
    if (kvt__stream_connect("127.0.0.1", g_snd_port, &a, dl, &s) != KVT_OK) return;
    if (!n || kvt__stream_send(s, p, n, dl) == KVT_OK) {
        shutdown(s->fd, SHUT_WR);
        /* until the sender closes: it refused, or its link thread ended at
         * our hang-up (it shuts the socket down either way) */
        uint8_t sink[4096];
        for (;;) {
            if (kvt__fd_wait(s->fd, POLLIN, dl) != KVT_OK) break;
            ssize_t r = read(s->fd, sink, sizeof sink);
            if (r <= 0) break;
        }
    }
    kvt__stream_destroy(s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    uint8_t mode = data[0];
    feed f = {data + 1, size - 1, 0, (size_t)16 << ((mode >> 4) & 7)};
    switch (mode & 3) {
    case 0: run_links(&S, true, mode & 4 ? 2 : 1, &f, mode & 8); break;
    case 1: run_links(&R, false, mode & 4 ? 2 : 1, &f, mode & 8); break;
    case 2: run_answer(&f, mode & 8); break;
    default: run_real_sender(f.p, f.n); break;
    }
    kvt__clear_error();
    return 0;
}
