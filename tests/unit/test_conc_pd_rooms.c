/* test_conc_pd_rooms.c - room lifetimes on the decode side against a
 * scripted prefill rank (it registers with the real bootstrap service and
 * speaks the wire protocol by hand, so a test decides exactly which frames
 * arrive and when):
 *   - a reopened room id never takes a late batch or DONE of the earlier
 *     opening (room generations);
 *   - once clear or abort returns, nothing writes into the room's pages,
 *     and poll does not say FAILED while a batch is still landing;
 *   - a DATA whose checksum trailer claims more pages than max_frame / 8
 *     drops the link before anything of it is read;
 * and, against real senders: max_frame is agreed per link (a decode page
 * above it is refused at registration; smaller frames still move every
 * byte), one decode link cannot fill a sender's room table, and a decode
 * rank reconnects to a prefill rank that restarted. */
#include <pthread.h>
#include <time.h>
#include <unistd.h>
#include "pd_harness.h"
#include "net/stream.h"
#include "pd/bootstrap.h"
#include "pd/ep.h"
#include "pd/xfer.h"
#include "util/clock.h"

static const pd_model mha = {.layers = 2, .heads = 4, .head_dim = 32};
static const pd_side_cfg c1 = {.tp = 1, .dcp = 1, .tpp = 16, .layout = KVT_LAYOUT_LAYER_FIRST, .model = &mha};
#define NTOK 40u

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000};
    nanosleep(&ts, NULL);
}

/* ---- a scripted prefill rank ---- */

typedef struct fake_prefill {
    pd_rank a, b;      /* the same pages filled with request A / request B */
    kvt_page_map *map_a, *map_b;
    uint32_t *tok_a;
    kvt_request req_a;
    pd_desc desc, peer;
    pd_plan plan;
    int lfd;
    uint16_t port;
    kvt_stream *s;
    pd_iovs iov;
    uint8_t trailer[8 * 64]; /* the last DATA's checksums, sent after its payload */
} fake_prefill;

typedef struct dec_arg {
    pd_cluster *cl;
    kvt_status st;
} dec_arg;

static void *make_decoder(void *p)
{
    dec_arg *a = p;
    a->st = pd_cluster_decoder(a->cl, 0);
    return NULL;
}

static kvt_page_map *map_of(pd_rank *r)
{
    kvt_engine_memory mem;
    kvt_page_map *m = calloc(1, sizeof *m);
    assert_ok(kvt_emu_memory(r->emu, &mem));
    assert_ok(kvt__page_map_init(m, r->geo, &mem));
    return m;
}

/* Reads the next frame that is not a ping; its body (if any) into *body. */
static pd_hdr fake_read(fake_prefill *f, uint8_t **body)
{
    for (;;) {
        uint8_t hb[PD_HDR_LEN];
        pd_hdr h;
        assert_ok(kvt__stream_recv(f->s, hb, sizeof hb, kvt__deadline_ns(5000)));
        assert_true(pd_hdr_decode(&h, hb));
        uint8_t *b = malloc(h.body_len + 1);
        if (h.body_len) assert_ok(kvt__stream_recv(f->s, b, h.body_len, kvt__deadline_ns(5000)));
        b[h.body_len] = 0;
        if (h.type == PD_F_PING) {
            free(b);
            continue;
        }
        if (body) *body = b;
        else free(b);
        return h;
    }
}

/* One frame: header, body (h.body_len bytes), then the payload iovecs. */
static void fake_send(fake_prefill *f, pd_hdr h, const void *body, const struct iovec *pay, int npay)
{
    uint8_t hb[PD_HDR_LEN];
    pd_hdr_encode(&h, hb);
    struct iovec v[2] = {{hb, PD_HDR_LEN}, {(void *)body, h.body_len}};
    assert_ok(f->s->ops->sendv(f->s, v, h.body_len ? 2 : 1, kvt__deadline_ns(2000)));
    if (npay) assert_ok(f->s->ops->sendv(f->s, pay, npay, kvt__deadline_ns(2000)));
}

/* Registers with the bootstrap service, accepts the decode rank the cluster
 * creates and answers its REGISTER. */
static void fake_start(fake_prefill *f, pd_cluster *cl)
{
    setenv("KVTIER_PD_QUIET", "1", 0);
    cl->dc = c1;
    cl->ntok = NTOK;
    cl->tokens = calloc(NTOK, sizeof *cl->tokens);
    kvt_test_tokens(cl->tokens, NTOK, 7);
    cl->req = (kvt_request){cl->tokens, NTOK, "ns", 2};
    if (!cl->net.peer_timeout_ms) cl->net.peer_timeout_ms = 10000; /* the script pings only by answering */
    assert_ok(kvt_pd_bootstrap_create(&cl->bs, &cl->net));
    assert_ok(kvt_pd_bootstrap_port(cl->bs, &cl->port));
    cl->ndec = 1;
    cl->dec = calloc(1, sizeof *cl->dec);

    f->tok_a = calloc(NTOK, sizeof *f->tok_a);
    kvt_test_tokens(f->tok_a, NTOK, 99);
    f->req_a = (kvt_request){f->tok_a, NTOK, "ns", 2};
    pd_rank_init(&f->a, &c1, 0, 0, NTOK);
    pd_rank_init(&f->b, &c1, 0, 0, NTOK);
    assert_ok(kvt_emu_fill(f->a.emu, &f->req_a, 0, NTOK, f->a.pages, f->a.num_pages));
    assert_ok(kvt_emu_fill(f->b.emu, &cl->req, 0, NTOK, f->b.pages, f->b.num_pages));
    f->map_a = map_of(&f->a);
    f->map_b = map_of(&f->b);
    assert_ok(pd_desc_from_geometry(&f->desc, f->a.geo, &f->a.rank, PD_ROLE_PREFILL));

    assert_ok(kvt__stream_listen("127.0.0.1", 0, &f->lfd, &f->port));
    kvt_stream *bs;
    kvt_stream_auth auth = {NULL, 0, "scripted prefill"};
    assert_ok(kvt__stream_connect("127.0.0.1", cl->port, &auth, kvt__deadline_ns(2000), &bs));
    size_t dlen = pd_desc_wire_size(&f->desc);
    uint8_t *body = calloc(1, dlen + 66 + PD_BS_TOKEN_LEN); /* desc, address, no token */
    pd_desc_encode(&f->desc, body);
    pd_put16(body + dlen, f->port);
    memcpy(body + dlen + 2, "127.0.0.1", 9);
    pd_hdr h = {.type = PD_F_REG_PREFILL, .body_len = (uint32_t)(dlen + 66 + PD_BS_TOKEN_LEN)};
    kvt_pd_net_params net = {.max_frame = 64u << 20};
    assert_ok(pd_bootstrap_call(bs, NULL, &h, body, &net, kvt__deadline_ns(2000), "scripted prefill"));
    kvt__stream_destroy(bs);
    free(body);

    pthread_t th;
    dec_arg da = {cl, KVT_OK};
    assert_int_equal(pthread_create(&th, NULL, make_decoder, &da), 0);
    assert_ok(kvt__stream_accept(f->lfd, kvt__deadline_ns(5000), &f->s));
    assert_ok(kvt__stream_auth_server(f->s->fd, &auth, kvt__deadline_ns(2000)));
    uint8_t *reg;
    pd_hdr rh = fake_read(f, &reg);
    assert_int_equal(rh.type, PD_F_REGISTER);
    size_t used;
    assert_ok(pd_desc_decode(&f->peer, reg, rh.body_len, &used));
    assert_int_equal(rh.body_len - used, 4); /* the decode rank's max_frame */
    free(reg);
    assert_ok(pd_plan_compute(&f->plan, &f->desc, &f->peer));
    uint8_t mf[4];
    pd_put32(mf, 64u << 20);
    pd_hdr ok = {.type = PD_F_OK, .body_len = 4};
    fake_send(f, ok, mf, NULL, 0);
    pthread_join(th, NULL);
    assert_ok(da.st);
}

static void fake_stop(fake_prefill *f, pd_cluster *cl)
{
    pd_cluster_stop(cl);
    kvt__stream_destroy(f->s);
    close(f->lfd);
    free(f->map_a);
    free(f->map_b);
    pd_rank_free(&f->a);
    pd_rank_free(&f->b);
    free(f->tok_a);
    pd_desc_free(&f->desc);
    pd_desc_free(&f->peer);
    pd_plan_free(&f->plan);
    pd_iovs_free(&f->iov);
}

/* The whole room's DATA from request A's or B's pages, like a sender:
 * one batch (header, payload, then a checksum per decode page: wire.h).
 * `cut` > 0: only the header and the first `cut` payload bytes go now; the
 * rest and the checksums are returned in *rest for the caller to send. */
static void fake_data(fake_prefill *f, uint64_t room, uint32_t gen, bool from_a, uint64_t cut,
                      struct iovec *rest, int *nrest)
{
    pd_rank *src = from_a ? &f->a : &f->b;
    pd_xfer x = {&f->plan, 0, NTOK, src->pages, src->num_pages, from_a ? f->map_a : f->map_b, PD_SIDE_SRC};
    uint32_t j0, j1;
    pd_xfer_page_range(&x, &j0, &j1);
    assert_ok(pd_xfer_iov(&x, j0, j1, &f->iov));
    uint64_t sums[64];
    assert_true(j1 - j0 <= 64);
    pd_xfer_hash(&x, j0, j1, sums);
    pd_hdr h = {.type = PD_F_DATA, .room = room, .gen = gen, .a0 = j0, .a1 = j1 - j0,
                .payload_len = f->iov.bytes};
    for (uint32_t i = 0; i < j1 - j0; i++) pd_put64(f->trailer + 8 * i, sums[i]);
    struct iovec trailer = {f->trailer, 8 * (size_t)(j1 - j0)};
    if (!cut) {
        fake_send(f, h, NULL, f->iov.v, (int)f->iov.n);
        assert_ok(f->s->ops->sendv(f->s, &trailer, 1, kvt__deadline_ns(2000)));
        return;
    }
    /* split the payload at byte `cut` */
    struct iovec first[64];
    int nf = 0, nr = 0;
    uint64_t left = cut;
    assert_true(f->iov.n < 64);
    for (uint32_t i = 0; i < f->iov.n; i++) {
        struct iovec v = f->iov.v[i];
        if (left >= v.iov_len) {
            first[nf++] = v;
            left -= v.iov_len;
        } else if (left) {
            first[nf++] = (struct iovec){v.iov_base, left};
            rest[nr++] = (struct iovec){(uint8_t *)v.iov_base + left, v.iov_len - left};
            left = 0;
        } else {
            rest[nr++] = v;
        }
    }
    rest[nr++] = trailer;
    fake_send(f, h, NULL, first, nf); /* the header announces the whole batch */
    *nrest = nr;
}

static void fake_done(fake_prefill *f, uint64_t room, uint32_t gen)
{
    pd_xfer x = {&f->plan, 0, NTOK, f->b.pages, f->b.num_pages, f->map_b, PD_SIDE_SRC};
    uint32_t j0, j1;
    pd_xfer_page_range(&x, &j0, &j1);
    pd_hdr h = {.type = PD_F_DONE, .room = room, .gen = gen, .a0 = j1 - j0};
    fake_send(f, h, NULL, NULL, 0);
}

/* Mismatching (token, entry) pairs of the decode pages against request r. */
static uint64_t verify_against(pd_cluster *cl, const kvt_request *r)
{
    kvt_request keep = cl->req;
    cl->req = *r;
    uint64_t bad = pd_verify(cl, 0);
    cl->req = keep;
    return bad;
}

/* Opens room on the decode rank with page table pages[n]. */
static void open_pages(pd_cluster *cl, uint64_t room, uint32_t *pages, uint32_t n)
{
    kvt_pd_room_params rp = {pages, n, NTOK, 0};
    assert_ok(kvt_pd_receiver_room(cl->dec[0].r, room, &rp));
}

static void open_room(pd_cluster *cl, uint64_t room)
{
    open_pages(cl, room, cl->dec[0].pages, cl->dec[0].num_pages);
}

/* Engines reuse room ids. Request A's room 5 is cleared and reopened for
 * request B while A's batch and DONE are still on the wire: they must be
 * dropped (regression: the late batch landed in B's pages and A's DONE
 * completed B's room with A's KV), and B's own transfer then succeeds. */
static void reopened_room_ignores_late_frames(void **state)
{
    (void)state;
    pd_cluster cl = {0};
    fake_prefill f = {0};
    fake_start(&f, &cl);
    open_room(&cl, 5);
    pd_hdr r1 = fake_read(&f, NULL);
    assert_int_equal(r1.type, PD_F_ROOM);
    assert_ok(kvt_pd_receiver_clear(cl.dec[0].r, 5));
    open_room(&cl, 5);
    pd_hdr fail = fake_read(&f, NULL), r2 = fake_read(&f, NULL);
    assert_int_equal(fail.type, PD_F_FAIL);
    assert_int_equal(fail.gen, r1.gen);
    assert_int_equal(r2.type, PD_F_ROOM);
    assert_int_not_equal(r2.gen, r1.gen);

    /* the first opening's frames, late: a FAIL, a full batch, its DONE */
    pd_hdr late_fail = {.type = PD_F_FAIL, .room = 5, .gen = r1.gen, .status = KVT_ECONN};
    fake_send(&f, late_fail, NULL, NULL, 0);
    fake_data(&f, 5, r1.gen, true, 0, NULL, NULL);
    fake_done(&f, 5, r1.gen);
    pd_hdr ack = fake_read(&f, NULL);
    assert_int_equal(ack.type, PD_F_DONE_ACK);
    assert_int_equal(ack.gen, r1.gen);
    assert_int_not_equal(ack.status, KVT_OK); /* "cleared or reopened" */
    kvt_pd_poll st;
    assert_ok(kvt_pd_receiver_poll(cl.dec[0].r, 5, &st));
    assert_true(st != KVT_PD_SUCCESS && st != KVT_PD_FAILED);
    uint64_t entries = 2 * 2 * NTOK;
    assert_int_equal(verify_against(&cl, &f.req_a), entries); /* nothing of A landed */

    fake_data(&f, 5, r2.gen, false, 0, NULL, NULL);
    fake_done(&f, 5, r2.gen);
    ack = fake_read(&f, NULL);
    assert_int_equal(ack.type, PD_F_DONE_ACK);
    assert_int_equal(ack.status, KVT_OK);
    assert_ok(kvt_pd_receiver_wait(cl.dec[0].r, 5, 5000, &st));
    assert_int_equal(st, KVT_PD_SUCCESS);
    assert_int_equal(pd_verify(&cl, 0), 0);
    fake_stop(&f, &cl);
}

typedef struct call_arg {
    kvt_pd_receiver *r;
    bool abort;
    atomic_bool returned;
    atomic_bool *rest_sent;
    bool rest_was_sent;
    kvt_status st;
} call_arg;

static void *clear_or_abort(void *p)
{
    call_arg *a = p;
    a->st = a->abort ? kvt_pd_receiver_abort(a->r, 5, "test") : kvt_pd_receiver_clear(a->r, 5);
    a->rest_was_sent = atomic_load(a->rest_sent);
    atomic_store(&a->returned, true);
    return NULL;
}

/* A batch is half way into the room's pages when the engine clears (or
 * aborts) it: the call returns only after that batch stopped writing, and
 * meanwhile poll does not say FAILED (regression: clear returned at once
 * and the link thread kept writing into pages the engine had reused). */
static void landing_batch(bool abort)
{
    pd_cluster cl = {0};
    fake_prefill f = {0};
    fake_start(&f, &cl);
    open_room(&cl, 5);
    pd_hdr r1 = fake_read(&f, NULL);
    struct iovec rest[64];
    int nrest = 0;
    fake_data(&f, 5, r1.gen, false, 4096, rest, &nrest);
    kvt_pd_poll st = KVT_PD_BOOTSTRAPPING;
    /* normally a few ms; 10 s: CI runs this under TSan on 2 loaded cores */
    for (uint64_t dl = kvt__deadline_ns(10000); st != KVT_PD_TRANSFERRING && kvt__now_ns() < dl;) {
        assert_ok(kvt_pd_receiver_poll(cl.dec[0].r, 5, &st));
        if (st != KVT_PD_TRANSFERRING) sleep_ms(2);
    }
    assert_int_equal(st, KVT_PD_TRANSFERRING);

    atomic_bool rest_sent = false;
    call_arg a = {.r = cl.dec[0].r, .abort = abort, .rest_sent = &rest_sent};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, clear_or_abort, &a), 0);
    sleep_ms(200);
    assert_false(atomic_load(&a.returned));
    if (abort) { /* failed, but a batch still lands: not FAILED yet */
        assert_ok(kvt_pd_receiver_poll(cl.dec[0].r, 5, &st));
        assert_int_equal(st, KVT_PD_TRANSFERRING);
    }
    atomic_store(&rest_sent, true);
    assert_int_equal(kvt__stream_fd_io(f.s->fd, rest, nrest, kvt__deadline_ns(2000), 1), KVT_OK);
    pthread_join(th, NULL);
    assert_ok(a.st);
    assert_true(a.rest_was_sent);
    if (abort) {
        assert_ok(kvt_pd_receiver_poll(cl.dec[0].r, 5, &st));
        assert_int_equal(st, KVT_PD_FAILED);
    } else {
        assert_int_equal(kvt_pd_receiver_poll(cl.dec[0].r, 5, &st), KVT_ENOTFOUND);
    }
    fake_stop(&f, &cl);
}

static void clear_waits_for_landing_batch(void **state)
{
    (void)state;
    landing_batch(false);
}

static void abort_waits_for_landing_batch(void **state)
{
    (void)state;
    landing_batch(true);
}

/* DONE of room 5's opening gen: acknowledged OK, the room ends Success
 * and the decode pages hold the request's KV, byte for byte. */
static void done_succeeds(fake_prefill *f, pd_cluster *cl, uint32_t gen)
{
    fake_done(f, 5, gen);
    pd_hdr ack = fake_read(f, NULL);
    assert_int_equal(ack.type, PD_F_DONE_ACK);
    assert_int_equal(ack.status, KVT_OK);
    kvt_pd_poll st;
    assert_ok(kvt_pd_receiver_wait(cl->dec[0].r, 5, 5000, &st));
    assert_int_equal(st, KVT_PD_SUCCESS);
    assert_int_equal(pd_verify(cl, 0), 0);
}

/* Sends rest[] (mutated) in `pieces` pieces, gap_ms before each. */
static void send_slowly(fake_prefill *f, struct iovec *rest, int nrest, int pieces, int gap_ms)
{
    size_t left = 0;
    for (int i = 0; i < nrest; i++) left += rest[i].iov_len;
    size_t piece = left / (size_t)pieces + 1;
    for (int i = 0; i < nrest;) { /* piece bytes of rest[] at a time */
        sleep_ms(gap_ms);
        struct iovec v[64];
        int n = 0;
        for (size_t want = piece; want && i < nrest; n++) {
            size_t k = rest[i].iov_len < want ? rest[i].iov_len : want;
            v[n] = (struct iovec){rest[i].iov_base, k};
            want -= k;
            rest[i].iov_base = (uint8_t *)rest[i].iov_base + k;
            rest[i].iov_len -= k;
            if (rest[i].iov_len == 0) i++;
        }
        assert_ok(kvt__stream_fd_io(f->s->fd, v, n, kvt__deadline_ns(2000), 1));
    }
}

/* A batch on a slow link that keeps moving lands, even when it takes
 * longer than peer_timeout_ms in all (regression: the whole payload had to
 * arrive within peer_timeout_ms of its header, so a 64 MiB UCX batch
 * failed "payload timed out" while bytes flowed, under sanitizer load).
 * Here the rest of the batch goes out in 6 pieces 250 ms apart (about
 * 1.5 s; peer timeout 1 s, payload bound 2 x 1 s); the room ends Success
 * with every byte right. */
static void slow_batch_lands_while_bytes_flow(void **state)
{
    (void)state;
    pd_cluster cl = {.net = {.peer_timeout_ms = 1000}};
    fake_prefill f = {0};
    fake_start(&f, &cl);
    open_room(&cl, 5);
    pd_hdr r1 = fake_read(&f, NULL);
    struct iovec rest[64];
    int nrest = 0;
    fake_data(&f, 5, r1.gen, false, 4096, rest, &nrest);
    uint64_t t0 = kvt__now_ns();
    send_slowly(&f, rest, nrest, 6, 250);
    uint64_t ms = (kvt__now_ns() - t0) / 1000000;
    assert_true(ms > 1000); /* it did take longer than the peer timeout */
    done_succeeds(&f, &cl, r1.gen);
    fake_stop(&f, &cl);
}

/* A late batch (of a cleared opening) arriving slowly is drained under
 * the same bounds, and the link stays for the reopened room (regression:
 * the drain had one peer timeout for the whole batch, and the link was
 * dropped mid-drain). */
static void slow_late_batch_drained(void **state)
{
    (void)state;
    pd_cluster cl = {.net = {.peer_timeout_ms = 1000}};
    fake_prefill f = {0};
    fake_start(&f, &cl);
    open_room(&cl, 5);
    pd_hdr r1 = fake_read(&f, NULL);
    assert_int_equal(r1.type, PD_F_ROOM);
    assert_ok(kvt_pd_receiver_clear(cl.dec[0].r, 5));
    pd_hdr fail = fake_read(&f, NULL);
    assert_int_equal(fail.type, PD_F_FAIL);
    struct iovec rest[64];
    int nrest = 0;
    fake_data(&f, 5, r1.gen, true, 4096, rest, &nrest); /* the cleared opening's */
    send_slowly(&f, rest, nrest, 6, 250);
    open_room(&cl, 5);
    pd_hdr r2 = fake_read(&f, NULL);
    assert_int_equal(r2.type, PD_F_ROOM);
    fake_data(&f, 5, r2.gen, false, 0, NULL, NULL);
    done_succeeds(&f, &cl, r2.gen);
    fake_stop(&f, &cl);
}

/* A DATA frame's checksum trailer (8 bytes a page, after the payload) is
 * bounded by max_frame before anything is read: a stale batch claiming
 * more pages than max_frame / 8 drops the link at once with EPROTO
 * (regression guard: draining it would read 64 MiB that never come, and
 * the room would fail only when the peer timed out, 30 s here: far beyond
 * the 10 s bound, wide for TSan on 2 loaded cores). */
static void data_trailer_over_max_frame_drops_link(void **state)
{
    (void)state;
    pd_cluster cl = {.net = {.peer_timeout_ms = 30000}};
    fake_prefill f = {0};
    fake_start(&f, &cl);
    open_room(&cl, 5);
    pd_hdr r1 = fake_read(&f, NULL);
    uint64_t t0 = kvt__now_ns();
    pd_hdr h = {.type = PD_F_DATA, .room = 5, .gen = r1.gen + 1, /* another opening's: drained */
                .a0 = 0, .a1 = (64u << 20) / 8 + 1, .payload_len = 4096};
    fake_send(&f, h, NULL, NULL, 0);
    kvt_pd_poll st;
    assert_ok(kvt_pd_receiver_wait(cl.dec[0].r, 5, 15000, &st));
    assert_int_equal(st, KVT_PD_FAILED);
    assert_true(kvt__now_ns() - t0 < 10000000000ull);
    kvt_pd_room_info i;
    assert_ok(kvt_pd_room_info_get(NULL, cl.dec[0].r, 5, &i));
    assert_int_equal(i.error, KVT_EPROTO);
    assert_non_null(strstr(i.message, "DATA with 8388609 pages"));
    fake_stop(&f, &cl);
}

/* A ROOM frame of a cleared opening that goes out after the id was
 * reopened must not count for the new opening (regression: the new room
 * read WaitingForInput before its own page table was sent). The link
 * thread is held between the two ROOM frames by 32 MiB page tables the
 * scripted prefill reads only later. */
static void stale_room_frame_advances_reopened_room(void **state)
{
    (void)state;
    /* The script never pings, and pushing 32 MiB page tables through it
     * under ASan on a loaded 2-core machine took past 10 s: the link must
     * not time out while the test holds it on purpose. */
    pd_cluster cl = {.net = {.peer_timeout_ms = 60000}};
    fake_prefill f = {0};
    fake_start(&f, &cl);
    uint32_t n = 8u << 20;
    uint32_t *big = calloc(n, 4);
    memcpy(big, cl.dec[0].pages, cl.dec[0].num_pages * 4);
    open_pages(&cl, 1, big, n);  /* link thread now blocked sending it */
    open_room(&cl, 5);         /* opening a */
    assert_ok(kvt_pd_receiver_clear(cl.dec[0].r, 5));
    open_pages(&cl, 2, big, n);  /* blocks the link thread again */
    open_room(&cl, 5);         /* opening b: queued behind room 2 */
    uint8_t *b;
    pd_hdr h1 = fake_read(&f, &b); free(b);
    pd_hdr h5 = fake_read(&f, &b); free(b);
    pd_hdr hf = fake_read(&f, &b); free(b);
    assert_int_equal(h1.room, 1);
    assert_int_equal(h5.type, PD_F_ROOM);
    assert_int_equal(h5.room, 5);
    assert_int_equal(hf.type, PD_F_FAIL);
    sleep_ms(300); /* room 2's 32 MiB frame cannot go out: opening b's ROOM is still queued */
    kvt_pd_poll st;
    assert_ok(kvt_pd_receiver_poll(cl.dec[0].r, 5, &st));
    pd_hdr h2 = fake_read(&f, &b); free(b);
    pd_hdr h5b = fake_read(&f, &b); free(b);
    assert_int_equal(h2.room, 2);
    assert_int_equal(h5b.room, 5);
    assert_int_not_equal(h5b.gen, h5.gen);
    free(big);
    assert_int_equal(st, KVT_PD_BOOTSTRAPPING);
    fake_stop(&f, &cl);
}

/* ---- max_frame, against real senders ---- */

/* A decode rank whose max_frame is below one decode page (16 KiB here) is
 * refused at registration with both values (regression: the first DATA
 * frame killed the link); one whose max_frame is smaller than the sender's
 * but holds a page gets every byte in frames it accepts. */
static void max_frame_agreed_per_link(void **state)
{
    (void)state;
    pd_cluster cl = {0};
    pd_cluster_start(&cl, &c1, &c1, 400); /* senders: max_frame 64 MiB */
    cl.net.max_frame = 4096;
    cl.ndec = 1;
    cl.dec = calloc(1, sizeof *cl.dec);
    assert_int_equal(pd_cluster_decoder(&cl, 0), KVT_EGEOMETRY);
    assert_non_null(strstr(kvt_last_error(), "a decode page carries 16384 bytes"));
    assert_non_null(strstr(kvt_last_error(), "decode 4096"));
    pd_rank_free(&cl.dec[0]);
    memset(&cl.dec[0], 0, sizeof cl.dec[0]);

    cl.net.max_frame = 32768; /* two pages a frame; 25 pages move */
    assert_ok(pd_cluster_decoder(&cl, 0));
    pd_open_room(&cl, 9, 0);
    pd_expect_room(&cl, 9, KVT_PD_SUCCESS);
    assert_int_equal(pd_verify(&cl, 0), 0);
    pd_cluster_stop(&cl);
}

/* ---- the room table ---- */

/* One decode link opening rooms the prefill engine never claims fills at
 * most PD_MAX_UNCLAIMED entries; the next is refused with EFULL, and a
 * well-behaved decode rank still gets its transfer. The flooder claims
 * decode position tp1/2: the budget is per decode identity (address and
 * position), and as tp0/1 on this host it would share the good rank's. */
static void unclaimed_rooms_bounded_per_link(void **state)
{
    (void)state;
    pd_cluster cl = {0};
    pd_cluster_start(&cl, &c1, &c1, NTOK);
    uint16_t port;
    assert_ok(kvt_pd_sender_port(cl.pre[0].s, &port));
    kvt_stream *s;
    kvt_stream_auth auth = {NULL, 0, "flooding decode"};
    assert_ok(kvt__stream_connect("127.0.0.1", port, &auth, kvt__deadline_ns(2000), &s));
    pd_desc d;
    kvt_pd_rank rk = {.tp_size = 2, .tp_rank = 1, .dcp_size = 1};
    kvt_geometry *g2 = pd_model_geo(c1.model, 2, c1.tpp, c1.layout);
    assert_ok(pd_desc_from_geometry(&d, g2, &rk, PD_ROLE_DECODE));
    kvt_geometry_destroy(g2);
    size_t n = pd_desc_wire_size(&d) + 4;
    uint8_t *reg = malloc(n);
    pd_desc_encode(&d, reg);
    pd_put32(reg + n - 4, 64u << 20);
    uint8_t hb[PD_HDR_LEN];
    pd_hdr h = {.type = PD_F_REGISTER, .body_len = (uint32_t)n};
    pd_hdr_encode(&h, hb);
    assert_ok(kvt__stream_send(s, hb, sizeof hb, kvt__deadline_ns(1000)));
    assert_ok(kvt__stream_send(s, reg, n, kvt__deadline_ns(1000)));
    uint8_t ok[PD_HDR_LEN + 4];
    assert_ok(kvt__stream_recv(s, ok, sizeof ok, kvt__deadline_ns(2000)));
    assert_true(pd_hdr_decode(&h, ok));
    assert_int_equal(h.type, PD_F_OK);

    uint8_t room[8 + 4 * 3] = {0};
    pd_put32(room, NTOK);
    pd_put32(room + 4, 3);
    for (uint32_t i = 0; i <= PD_MAX_UNCLAIMED; i++) {
        pd_hdr rh = {.type = PD_F_ROOM, .room = 1000 + i, .gen = 1, .a0 = 1, .body_len = sizeof room};
        pd_hdr_encode(&rh, hb);
        assert_ok(kvt__stream_send(s, hb, sizeof hb, kvt__deadline_ns(2000)));
        assert_ok(kvt__stream_send(s, room, sizeof room, kvt__deadline_ns(2000)));
    }
    /* the answer: one FAIL, for the room past the limit */
    bool refused = false;
    uint64_t dl = kvt__deadline_ns(5000);
    while (!refused && kvt__now_ns() < dl) {
        assert_ok(kvt__stream_recv(s, hb, sizeof hb, dl));
        assert_true(pd_hdr_decode(&h, hb));
        char msg[512] = {0};
        assert_true(h.body_len < sizeof msg);
        if (h.body_len) assert_ok(kvt__stream_recv(s, msg, h.body_len, dl));
        if (h.type != PD_F_FAIL) continue;
        assert_int_equal(h.room, 1000 + PD_MAX_UNCLAIMED);
        assert_int_equal(h.status, KVT_EFULL);
        assert_non_null(strstr(msg, "not claimed"));
        refused = true;
    }
    assert_true(refused);

    pd_cluster_decoders(&cl);
    pd_open_room(&cl, 7, 0);
    pd_expect_room(&cl, 7, KVT_PD_SUCCESS);
    assert_int_equal(pd_verify(&cl, 0), 0);
    kvt__stream_destroy(s);
    free(reg);
    pd_desc_free(&d);
    pd_cluster_stop(&cl);
}

/* ---- reconnecting ---- */

/* A prefill rank restarts (on another port): the decode rank's link dies,
 * the room it carried fails, and the decode rank finds the new process
 * through the bootstrap service by itself; the next room moves every byte
 * (regression: a dead link stayed down until the decode rank restarted). */
static void decode_reconnects_to_restarted_prefill(void **state)
{
    (void)state;
    pd_cluster cl = {0};
    pd_cluster_start(&cl, &c1, &c1, NTOK);
    pd_cluster_decoders(&cl);
    kvt_pd_room_params rp = {cl.dec[0].pages, cl.dec[0].num_pages, NTOK, 0};
    assert_ok(kvt_pd_receiver_room(cl.dec[0].r, 3, &rp));
    uint16_t old_port;
    assert_ok(kvt_pd_sender_port(cl.pre[0].s, &old_port));
    kvt_pd_sender_destroy(cl.pre[0].s);
    cl.pre[0].s = NULL;
    kvt_pd_poll st;
    assert_ok(kvt_pd_receiver_wait(cl.dec[0].r, 3, 5000, &st));
    assert_int_equal(st, KVT_PD_FAILED);
    assert_ok(kvt_pd_receiver_clear(cl.dec[0].r, 3));

    kvt_engine_memory mem;
    kvt_pd_params p = pd_params(&cl, &cl.pre[0], &mem);
    assert_ok(kvt_pd_sender_create(&cl.pre[0].s, &p));
    uint16_t new_port;
    assert_ok(kvt_pd_sender_port(cl.pre[0].s, &new_port));
    /* rooms opened before the link is back fail at once ("down"): retry,
     * for 10 s (the redial backoff grows to 2 s; TSan on 2 loaded cores) */
    bool up = false;
    for (uint64_t dl = kvt__deadline_ns(10000); !up && kvt__now_ns() < dl;) {
        assert_ok(kvt_pd_receiver_room(cl.dec[0].r, 4, &rp));
        assert_ok(kvt_pd_receiver_poll(cl.dec[0].r, 4, &st));
        up = st != KVT_PD_FAILED;
        if (!up) {
            kvt_pd_room_info info;
            assert_ok(kvt_pd_room_info_get(NULL, cl.dec[0].r, 4, &info));
            assert_non_null(strstr(info.message, "down"));
            assert_ok(kvt_pd_receiver_clear(cl.dec[0].r, 4));
            sleep_ms(50);
        }
    }
    assert_true(up);
    assert_ok(kvt_pd_sender_room(cl.pre[0].s, 4));
    assert_ok(kvt_pd_sender_send(cl.pre[0].s, 4, cl.pre[0].pages, cl.pre[0].num_pages, NTOK));
    pd_expect_room(&cl, 4, KVT_PD_SUCCESS);
    assert_int_equal(pd_verify(&cl, 0), 0);
    (void)old_port;
    (void)new_port;
    pd_cluster_stop(&cl);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(reopened_room_ignores_late_frames),
        cmocka_unit_test(clear_waits_for_landing_batch),
        cmocka_unit_test(abort_waits_for_landing_batch),
        cmocka_unit_test(slow_batch_lands_while_bytes_flow),
        cmocka_unit_test(slow_late_batch_drained),
        cmocka_unit_test(data_trailer_over_max_frame_drops_link),
        cmocka_unit_test(stale_room_frame_advances_reopened_room),
        cmocka_unit_test(max_frame_agreed_per_link),
        cmocka_unit_test(unclaimed_rooms_bounded_per_link),
        cmocka_unit_test(decode_reconnects_to_restarted_prefill),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
