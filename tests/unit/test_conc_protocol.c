/* test_conc_protocol.c - the rank-group protocol's promises when ranks run
 * freely (issue 13): no barrier between iterations, each rank steps as soon
 * as its previous step returned. Three ranks (tp3) as threads, each with the
 * real connector over its own kvt_cache, on the inproc, tcp (loopback,
 * ranks as threads), ucx (the tcp transport's links moved onto UCX tag
 * messages, UCX_TLS=tcp on loopback) and callback transports. Every step each rank queues a
 * store of a new rid, so every applied step emits a STORE event. Cases:
 *  stall: the leader stalls 3T before step 3; the members time out and
 *         abort; the leader must not apply step 3 (no event of step 3 on
 *         any rank, its step returns EABORTED naming the members' abort);
 *  skew:  rank 2 skips step 4; every rank aborts at step 4, naming rank 2
 *         and both step numbers, and no rank completes more than 3 steps;
 *  depth1 (inproc, queue depth 1): as stall, but the members' ABORT finds
 *         their queue to the leader full: it must still go out at once (the
 *         control lane), so members return by 2T and the leader names them;
 *  kill:  rank 2 dies at step 4 (its links close on tcp); every surviving
 *         rank's diagnostic names rank 2, in the step and in the reform
 *         that follows;
 *  late:  the leader reaches the handshake 3.2T late (formation timeout
 *         left at its default): every rank fails or every rank forms,
 *         never a split (case 3);
 *  drift: after 2 steps rank 2 makes one extra reform attempt alone (it
 *         fails), then every rank reforms: all converge on epoch 2 and
 *         step on (case 4);
 *  replace: rank 2 dies at step 4 and a fresh rank 2 (epoch 0) creates its
 *         group while the survivors reform: all form epoch 2, learned by
 *         the newcomer in the handshake, and step on (case 4).
 * Invariant everywhere: the events of the steps a rank completed are the
 * same on every rank. */
#include "test_group_util.h"

#include "connector/conn.h"
#include "group/group.h"
#include "net/net.h"

#define RANKS 3
#define T_MS 1000 /* wide: TSan on 2 loaded cores */
#define NSTEPS 8
#define MAX_EV 64

typedef enum transport { TR_INPROC, TR_TCP, TR_CALLBACK, TR_UCX } transport;

/* tcp and ucx: a hub and sockets (ucx moves the traffic after the join). */
static bool hubbed(transport tr)
{
    return tr == TR_TCP || tr == TR_UCX;
}

static kvt_net_transport wire(transport tr)
{
    return tr == TR_UCX ? KVT_NET_UCX : KVT_NET_TCP;
}
typedef enum scenario { SC_STALL, SC_SKEW, SC_DEPTH1, SC_KILL, SC_LATE, SC_DRIFT,
                        SC_REPLACE } scenario;

typedef struct rank_ctx {
    kvt_config *cfg;
    kvt_geometry *geo;
    kvt_emu *emu;
    kvt_cache *cache;
    kvt_net *inner, *net; /* callback: net calls into inner (inproc) */
    kvt_group *g;
    kvt_conn *conn;
    kvt_conn_event ev[MAX_EV];
    uint32_t nev;
    int done;             /* steps that returned OK */
    kvt_status st;        /* the first failing step's status */
    uint64_t fail_ms;     /* how long that step took */
    kvt_status reform_st, create_st, solo_st;
    uint64_t epoch;       /* the group's epoch at the end */
    bool fresh;           /* a replacement process: proposes epoch 0 */
    uint64_t solo_ms;     /* drift: how long rank 2's lone reform took */
    char diag[KVT_ERRMSG_MAX], reform_msg[KVT_ERRMSG_MAX], fail[512];
} rank_ctx;

typedef struct world {
    transport tr;
    scenario sc;
    kvt_fabric *fab;
    kvt_net *hub; /* tcp: rank 0's endpoint, bound before the threads start */
    uint16_t port;
    int solo_over; /* drift: rank 2's lone reform has returned (atomic) */
    rank_ctx rc[RANKS];
} world;

#define TRY(rc, call)                                                               \
    do {                                                                            \
        kvt_status s_ = (call);                                                     \
        if (s_ != KVT_OK) {                                                         \
            snprintf((rc)->fail, sizeof (rc)->fail, "%s gave %s: %s", #call,        \
                     kvt_status_name(s_), kvt_last_error());                        \
            return s_;                                                              \
        }                                                                           \
    } while (0)

/* The engine's own p2p, lent through callbacks: here an inproc endpoint. */
static kvt_status cb_send(void *ctx, uint32_t peer, const void *buf, size_t len, int64_t ms)
{
    return kvt__net_send(ctx, peer, buf, len, NULL, 0, kvt__deadline_ns(ms));
}

static kvt_status cb_recv(void *ctx, uint32_t peer, void *buf, size_t cap, size_t *len,
                          int64_t ms)
{
    kvt_buf b = {0};
    kvt_status st = kvt__net_recv(ctx, peer, &b, kvt__deadline_ns(ms));
    if (st == KVT_OK && b.len > cap) st = KVT_EPROTO;
    if (st == KVT_OK) {
        memcpy(buf, b.p, b.len);
        *len = b.len;
    }
    kvt__buf_free(&b);
    return st;
}

static kvt_status open_net(world *w, uint32_t rank, rank_ctx *rc)
{
    if (hubbed(w->tr)) {
        if (rank == 0) rc->net = w->hub;
        kvt_net_tcp_params p = {rank, RANKS, "127.0.0.1", w->port, NULL, 0, 0, wire(w->tr)};
        if (rank != 0) TRY(rc, kvt_net_tcp_create(&rc->net, &p));
        TRY(rc, kvt_net_connect(rc->net, 20 * T_MS));
        return KVT_OK;
    }
    TRY(rc, kvt_net_inproc_create(w->tr == TR_CALLBACK ? &rc->inner : &rc->net, w->fab, rank));
    if (w->tr == TR_CALLBACK) {
        kvt_net_callbacks cb = {rc->inner, cb_send, cb_recv};
        TRY(rc, kvt_net_callback_create(&rc->net, rank, RANKS, &cb, 0));
    }
    return KVT_OK;
}

static kvt_status setup(world *w, uint32_t rank, rank_ctx *rc)
{
    TRY(rc, kvt_config_create(&rc->cfg));
    TRY(rc, kvt_config_set(rc->cfg, "cpu_capacity", "4MiB"));
    TRY(rc, kvt_config_set(rc->cfg, "block_tokens", "16"));
    rc->geo = kvt_test_geometry(2, 1, 16, 16, KVT_LAYOUT_LAYER_FIRST);
    if (!rc->geo) return KVT_ENOMEM;
    TRY(rc, kvt_emu_create(&rc->emu, rc->geo, 32));
    TRY(rc, kvt_cache_create(&rc->cache, rc->cfg, rc->geo));
    kvt_engine_memory mem;
    TRY(rc, kvt_emu_memory(rc->emu, &mem));
    TRY(rc, kvt_cache_register_memory(rc->cache, &mem));
    kvt_geometry_info gi;
    TRY(rc, kvt_geometry_info_get(rc->geo, &gi));
    uint64_t cd;
    TRY(rc, kvt_config_digest(rc->cfg, &cd));
    TRY(rc, open_net(w, rank, rc));
    /* late: the leader reaches the handshake 3.2T after the members; a
     * replacement proposes epoch 0 (it knows nothing) */
    if (w->sc == SC_LATE && rank == 0) tg_sleep_ms(16 * T_MS / 5);
    kvt_group_params p = {1, 1, RANKS, gi.digest, cd, T_MS, rc->fresh ? 0 : 1};
    rc->create_st = kvt_group_create(&rc->g, rc->net, &p);
    if (rc->create_st != KVT_OK) {
        snprintf(rc->diag, sizeof rc->diag, "%s", kvt_last_error());
        if (w->sc == SC_LATE) return rc->create_st;
        TRY(rc, rc->create_st);
    }
    TRY(rc, kvt_conn_create(&rc->conn, rc->g, rc->cache));
    return KVT_OK;
}

static void teardown(rank_ctx *rc)
{
    kvt_conn_destroy(rc->conn);
    kvt_group_destroy(rc->g);
    kvt_net_destroy(rc->net);
    kvt_net_destroy(rc->inner);
    kvt_cache_destroy(rc->cache);
    kvt_emu_destroy(rc->emu);
    kvt_geometry_destroy(rc->geo);
    kvt_config_destroy(rc->cfg);
    rc->conn = NULL;
    rc->g = NULL;
    rc->net = rc->inner = NULL;
}

/* Queues a store of rid k (one block, page k % 32) and steps k. */
static kvt_status step(rank_ctx *rc, uint64_t k)
{
    uint32_t tok[16], page = (uint32_t)(k % 32);
    kvt_test_tokens(tok, 16, k);
    kvt_request req = {tok, 16, "ns", 2};
    kvt_status st = kvt_conn_store(rc->conn, k, &req, &page, 1);
    uint64_t t0 = kvt__now_ns();
    if (st == KVT_OK) st = kvt_conn_step(rc->conn, k);
    if (st != KVT_OK) {
        rc->st = st;
        rc->fail_ms = (kvt__now_ns() - t0) / 1000000;
        snprintf(rc->diag, sizeof rc->diag, "%s", kvt_group_diagnostic(rc->g));
        return st;
    }
    uint32_t n = 0;
    kvt_conn_events(rc->conn, rc->ev + rc->nev, MAX_EV - rc->nev, &n);
    rc->nev += n;
    rc->done++;
    return KVT_OK;
}

static void end_epoch(rank_ctx *rc)
{
    kvt_group_info gi;
    if (rc->g && kvt_group_info_get(rc->g, &gi) == KVT_OK) rc->epoch = gi.epoch;
}

/* Reform, then steps from..NSTEPS; the events before are forgotten. */
static void reform_and_step(rank_ctx *rc, int64_t timeout_ms, uint64_t from)
{
    rc->reform_st = kvt_conn_reform(rc->conn, timeout_ms);
    snprintf(rc->reform_msg, sizeof rc->reform_msg, "%s", kvt_last_error());
    rc->nev = 0;
    rc->done = 0;
    if (rc->reform_st == KVT_OK)
        for (uint64_t k = from; k <= NSTEPS; k++)
            if (step(rc, k) != KVT_OK) break;
    end_epoch(rc);
}

/* Case 4: one extra, failed reform attempt on rank 2 (the others are not
 * reforming yet), then a reform on every rank. */
static void drift_main(uint32_t rank, world *w, rank_ctx *rc)
{
    for (uint64_t k = 1; k <= 2; k++)
        if (step(rc, k) != KVT_OK) {
            if (rank == 2) __atomic_store_n(&w->solo_over, 1, __ATOMIC_RELEASE);
            return;
        }
    if (rank == 2) {
        uint64_t t0 = kvt__now_ns();
        rc->solo_st = kvt_conn_reform(rc->conn, T_MS);
        rc->solo_ms = (kvt__now_ns() - t0) / 1000000;
        __atomic_store_n(&w->solo_over, 1, __ATOMIC_RELEASE);
    } else {
        /* Rank 2's attempt is normally over after 8T/5; the others also
         * wait for it to have returned (20 s at most), so that on a slow
         * machine they still do not join it. */
        tg_sleep_ms(8 * T_MS / 5);
        for (uint64_t dl = kvt__deadline_ns(20 * T_MS);
             !__atomic_load_n(&w->solo_over, __ATOMIC_ACQUIRE) && kvt__now_ns() < dl;)
            tg_sleep_ms(10);
    }
    reform_and_step(rc, 4 * T_MS, 3);
}

/* Case 4: rank 2 dies at step 4; a fresh process takes its place (epoch 0)
 * and creates its group while the survivors fail step 4 and reform. */
static void replace_main(uint32_t rank, world *w, rank_ctx *rc)
{
    for (uint64_t k = 1; k <= NSTEPS; k++) {
        if (rank == 2 && k == 4) {
            teardown(rc);
            memset(rc, 0, sizeof *rc);
            rc->fresh = true;
            if (setup(w, rank, rc) != KVT_OK) return;
            rc->reform_st = KVT_OK;
            for (uint64_t j = 5; j <= NSTEPS; j++)
                if (step(rc, j) != KVT_OK) break;
            end_epoch(rc);
            return;
        }
        if (step(rc, k) != KVT_OK) break;
    }
    reform_and_step(rc, 6 * T_MS, 5);
}

static void rank_main(uint32_t rank, void *arg)
{
    world *w = arg;
    rank_ctx *rc = &w->rc[rank];
    if (setup(w, rank, rc) != KVT_OK || w->sc == SC_LATE) {
        if (w->sc == SC_LATE && rc->create_st == KVT_OK)
            for (uint64_t k = 1; k <= 2; k++)
                if (step(rc, k) != KVT_OK) break;
        teardown(rc);
        return;
    }
    if (w->sc == SC_DRIFT || w->sc == SC_REPLACE) {
        (w->sc == SC_DRIFT ? drift_main : replace_main)(rank, w, rc);
        teardown(rc);
        return;
    }
    bool stall = w->sc == SC_STALL || w->sc == SC_DEPTH1;
    for (uint64_t k = 1; k <= NSTEPS; k++) {
        if (w->sc == SC_SKEW && rank == 2 && k == 4) continue; /* the engine skipped it */
        if (w->sc == SC_KILL && rank == 2 && k == 4) {
            teardown(rc); /* gone: on tcp its links close */
            return;
        }
        if (stall && rank == 0 && k == 3) tg_sleep_ms((w->sc == SC_DEPTH1 ? 4 : 3) * T_MS);
        if (step(rc, k) != KVT_OK) break;
    }
    if (w->sc == SC_KILL) {
        rc->reform_st = kvt_conn_reform(rc->conn, 2 * T_MS);
        snprintf(rc->reform_msg, sizeof rc->reform_msg, "%s", kvt_last_error());
    }
    teardown(rc);
}

static void run_world(transport tr, scenario sc, world *w)
{
    memset(w, 0, sizeof *w);
    w->tr = tr;
    w->sc = sc;
    if (hubbed(tr)) {
        kvt_net_tcp_params p = {0, RANKS, NULL, 0, NULL, 0, 0, wire(tr)};
        assert_ok(kvt_net_tcp_create(&w->hub, &p));
        assert_ok(kvt_net_tcp_port(w->hub, &w->port));
    } else {
        assert_ok(kvt_fabric_create(&w->fab, RANKS, sc == SC_DEPTH1 ? 1 : 16));
    }
    tg_run_ranks(RANKS, rank_main, w);
    kvt_fabric_destroy(w->fab);
    for (uint32_t r = 0; r < RANKS; r++)
        if (w->rc[r].fail[0]) fail_msg("rank %u: %s", r, w->rc[r].fail);
}

static const char *tr_name(transport tr)
{
    return tr == TR_TCP ? "tcp" : tr == TR_UCX ? "ucx" : tr == TR_CALLBACK ? "callback" : "inproc";
}

static bool ev_equal(const kvt_conn_event *a, const kvt_conn_event *b)
{
    return a->rid == b->rid && a->kind == b->kind && a->status == b->status &&
           a->tokens == b->tokens && a->rank == b->rank && a->counter == b->counter &&
           a->generation == b->generation && a->step == b->step;
}

/* The events of the steps a rank completed are those of every rank (field
 * by field: the struct has padding). */
static void same_events(world *w, uint32_t a, uint32_t b)
{
    rank_ctx *x = &w->rc[a], *y = &w->rc[b];
    uint32_t n = x->nev < y->nev ? x->nev : y->nev;
    for (uint32_t i = 0; i < n; i++)
        if (!ev_equal(&x->ev[i], &y->ev[i]))
            fail_msg("%s: rank %u's event %u (rid %llu kind %d status %d tokens %u rank %u "
                     "step %llu) differs from rank %u's (rid %llu kind %d status %d tokens %u "
                     "rank %u step %llu)", tr_name(w->tr), a, i,
                     (unsigned long long)x->ev[i].rid, x->ev[i].kind, x->ev[i].status,
                     x->ev[i].tokens, x->ev[i].rank, (unsigned long long)x->ev[i].step, b,
                     (unsigned long long)y->ev[i].rid, y->ev[i].kind, y->ev[i].status,
                     y->ev[i].tokens, y->ev[i].rank, (unsigned long long)y->ev[i].step);
}

static void expect_diag(world *w, uint32_t r, const char *needle)
{
    if (!strstr(w->rc[r].diag, needle))
        fail_msg("%s: rank %u: \"%s\" lacks \"%s\"", tr_name(w->tr), r, w->rc[r].diag, needle);
}

/* Case 1: the leader never applies a step its members aborted. */
static void stall_case(transport tr)
{
    world w;
    run_world(tr, SC_STALL, &w);
    for (uint32_t r = 0; r < RANKS; r++) {
        rank_ctx *rc = &w.rc[r];
        if (rc->done != 2 || rc->st != KVT_EABORTED)
            fail_msg("%s: rank %u completed %d steps (%s: %s), want 2 then EABORTED",
                     tr_name(tr), r, rc->done, kvt_status_name(rc->st), rc->diag);
        for (uint32_t i = 0; i < rc->nev; i++)
            if (rc->ev[i].step >= 3)
                fail_msg("%s: rank %u applied step %llu", tr_name(tr), r,
                         (unsigned long long)rc->ev[i].step);
    }
    /* Over UCX the members' exit (after their abort) may fail the
     * leader's send of step 3 at their hang-up before it reads their ABORT
     * (TCP buffers that send): the leader then names the lost rank. */
    if (tr == TR_UCX && strstr(w.rc[0].diag, "could not send step 3 to rank "))
        expect_diag(&w, 0, "lost");
    else
        expect_diag(&w, 0, "group aborted by rank ");
    same_events(&w, 0, 1);
    same_events(&w, 0, 2);
}

static void test_stall_inproc(void **s) { (void)s; stall_case(TR_INPROC); }
static void test_stall_tcp(void **s) { (void)s; stall_case(TR_TCP); }
static void test_stall_ucx(void **s) { (void)s; stall_case(TR_UCX); }
static void test_stall_callback(void **s) { (void)s; stall_case(TR_CALLBACK); }

/* Case 2: a skipped step is caught at that step although nothing else
 * keeps the ranks in lockstep. */
static void skew_case(transport tr)
{
    world w;
    run_world(tr, SC_SKEW, &w);
    for (uint32_t r = 0; r < RANKS; r++) {
        if (w.rc[r].done != 3 || w.rc[r].st != KVT_EABORTED)
            fail_msg("%s: rank %u completed %d steps (%s: %s), want 3 then EABORTED",
                     tr_name(tr), r, w.rc[r].done, kvt_status_name(w.rc[r].st), w.rc[r].diag);
        expect_diag(&w, r, "step skew: rank 2 (pp0 cp0 tp2) calls step 5 while rank 0 (pp0 "
                           "cp0 tp0) calls step 4");
    }
    same_events(&w, 0, 1);
    same_events(&w, 0, 2);
}

static void test_skew_inproc(void **s) { (void)s; skew_case(TR_INPROC); }
static void test_skew_tcp(void **s) { (void)s; skew_case(TR_TCP); }
static void test_skew_ucx(void **s) { (void)s; skew_case(TR_UCX); }
static void test_skew_callback(void **s) { (void)s; skew_case(TR_CALLBACK); }

/* Case 5: with queue depth 1 the members' ABORT meets their unread STEP_UP;
 * it must not wait for room (T) or be dropped. A member's step ends at its
 * own deadline, 2T after its UP (sent after the step's clock starts); an
 * ABORT that waited for room added T, so such a member returned after 3T
 * at the earliest: below 3T is the bound (it was 2.5T, half a second over
 * the deadline, which a TSan build on a loaded machine could miss). The
 * ABORT's delivery itself shows in the leader's diagnostic. */
static void test_abort_depth1_inproc(void **s)
{
    (void)s;
    world w;
    run_world(TR_INPROC, SC_DEPTH1, &w);
    for (uint32_t r = 1; r < RANKS; r++)
        if (w.rc[r].st != KVT_EABORTED || w.rc[r].fail_ms >= 3 * T_MS)
            fail_msg("rank %u: step 3 gave %s after %llu ms, want EABORTED before 3T "
                     "(2T: its deadline; 3T: its ABORT waited for room)", r,
                     kvt_status_name(w.rc[r].st), (unsigned long long)w.rc[r].fail_ms);
    assert_int_equal(w.rc[0].st, KVT_EABORTED);
    expect_diag(&w, 0, "group aborted by rank ");
}

/* Case 6: every surviving rank names the dead one, in the step and in the
 * reform that follows. */
static void kill_case(transport tr)
{
    world w;
    run_world(tr, SC_KILL, &w);
    for (uint32_t r = 0; r < 2; r++) {
        rank_ctx *rc = &w.rc[r];
        if (rc->done != 3 || rc->st != KVT_EABORTED)
            fail_msg("%s: rank %u completed %d steps (%s: %s), want 3 then EABORTED",
                     tr_name(tr), r, rc->done, kvt_status_name(rc->st), rc->diag);
        expect_diag(&w, r, "rank 2 (pp0 cp0 tp2)");
        if (rc->reform_st == KVT_OK || !strstr(rc->reform_msg, "rank 2"))
            fail_msg("%s: rank %u's reform gave %s: \"%s\", want a failure naming rank 2",
                     tr_name(tr), r, kvt_status_name(rc->reform_st), rc->reform_msg);
    }
    same_events(&w, 0, 1);
}

static void test_kill_inproc(void **s) { (void)s; kill_case(TR_INPROC); }
static void test_kill_tcp(void **s) { (void)s; kill_case(TR_TCP); }
static void test_kill_ucx(void **s) { (void)s; kill_case(TR_UCX); }
static void test_kill_callback(void **s) { (void)s; kill_case(TR_CALLBACK); }

/* Case 3: a leader 3.2T late at the handshake. Before two-phase formation
 * the members gave up at 3T and the leader, reading their HELLOs, formed
 * alone (tcp: likewise; a late member could form with the hub alone). */
static void late_case(transport tr)
{
    world w;
    run_world(tr, SC_LATE, &w);
    int formed = 0;
    for (uint32_t r = 0; r < RANKS; r++) formed += w.rc[r].create_st == KVT_OK;
    if (formed != 0 && formed != RANKS)
        fail_msg("%s: split formation: rank 0 %s (%s), rank 1 %s (%s), rank 2 %s (%s)",
                 tr_name(tr), kvt_status_name(w.rc[0].create_st), w.rc[0].diag,
                 kvt_status_name(w.rc[1].create_st), w.rc[1].diag,
                 kvt_status_name(w.rc[2].create_st), w.rc[2].diag);
    for (uint32_t r = 0; r < RANKS && formed; r++)
        if (w.rc[r].done != 2)
            fail_msg("%s: rank %u formed but completed %d steps: %s", tr_name(tr), r,
                     w.rc[r].done, w.rc[r].diag);
}

static void test_late_inproc(void **s) { (void)s; late_case(TR_INPROC); }
static void test_late_tcp(void **s) { (void)s; late_case(TR_TCP); }
static void test_late_ucx(void **s) { (void)s; late_case(TR_UCX); }
static void test_late_callback(void **s) { (void)s; late_case(TR_CALLBACK); }

/* After the reform every rank is at the same epoch (2), stepped every step
 * from `from` on, with the same events. */
static void expect_converged(world *w, const char *what, uint32_t steps)
{
    for (uint32_t r = 0; r < RANKS; r++) {
        rank_ctx *rc = &w->rc[r];
        if (rc->reform_st != KVT_OK || rc->epoch != 2 || rc->done != (int)steps)
            fail_msg("%s: %s: rank %u: reform %s (%s), epoch %llu, %d steps (%s: %s); want OK, "
                     "epoch 2, %u steps", tr_name(w->tr), what, r,
                     kvt_status_name(rc->reform_st), rc->reform_msg,
                     (unsigned long long)rc->epoch, rc->done, kvt_status_name(rc->st), rc->diag,
                     steps);
    }
    same_events(w, 0, 1);
    same_events(w, 0, 2);
}

static void drift_case(transport tr)
{
    world w;
    run_world(tr, SC_DRIFT, &w);
    if (w.rc[2].solo_st == KVT_OK) fail_msg("%s: rank 2's reform alone succeeded", tr_name(tr));
    /* reform's bound: its timeout B, + B/8 to send its GIVEUP. The old
     * reform could block 3B; 2B still tells the two apart and leaves 7B/8
     * for a TSan build on a loaded machine (B/8 + 250 ms, which a stall of
     * a quarter second could fail, did not). */
    if (w.rc[2].solo_ms >= 2 * T_MS)
        fail_msg("%s: rank 2's reform (timeout %d ms) took %llu ms", tr_name(tr), T_MS,
                 (unsigned long long)w.rc[2].solo_ms);
    expect_converged(&w, "drift", NSTEPS - 2);
}

static void test_drift_inproc(void **s) { (void)s; drift_case(TR_INPROC); }
static void test_drift_tcp(void **s) { (void)s; drift_case(TR_TCP); }
static void test_drift_ucx(void **s) { (void)s; drift_case(TR_UCX); }
static void test_drift_callback(void **s) { (void)s; drift_case(TR_CALLBACK); }

static void replace_case(transport tr)
{
    world w;
    run_world(tr, SC_REPLACE, &w);
    expect_converged(&w, "replace", NSTEPS - 4);
}

static void test_replace_inproc(void **s) { (void)s; replace_case(TR_INPROC); }
static void test_replace_tcp(void **s) { (void)s; replace_case(TR_TCP); }
static void test_replace_ucx(void **s) { (void)s; replace_case(TR_UCX); }
static void test_replace_callback(void **s) { (void)s; replace_case(TR_CALLBACK); }

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stall_inproc),  cmocka_unit_test(test_stall_tcp),
        cmocka_unit_test(test_stall_callback), cmocka_unit_test(test_skew_inproc),
        cmocka_unit_test(test_skew_tcp),      cmocka_unit_test(test_skew_callback),
        cmocka_unit_test(test_abort_depth1_inproc), cmocka_unit_test(test_kill_inproc),
        cmocka_unit_test(test_kill_tcp),      cmocka_unit_test(test_kill_callback),
        cmocka_unit_test(test_late_inproc),   cmocka_unit_test(test_late_tcp),
        cmocka_unit_test(test_late_callback), cmocka_unit_test(test_drift_inproc),
        cmocka_unit_test(test_drift_tcp),     cmocka_unit_test(test_drift_callback),
        cmocka_unit_test(test_replace_inproc), cmocka_unit_test(test_replace_tcp),
        cmocka_unit_test(test_replace_callback),
        cmocka_unit_test(test_stall_ucx),     cmocka_unit_test(test_skew_ucx),
        cmocka_unit_test(test_kill_ucx),      cmocka_unit_test(test_late_ucx),
        cmocka_unit_test(test_drift_ucx),     cmocka_unit_test(test_replace_ucx),
    };
    /* ucx: loopback over UCX's tcp transport (set before the first UCX
     * link: the UCP context reads them once) */
    setenv("UCX_TLS", "tcp", 0);
    setenv("UCX_NET_DEVICES", "lo", 0);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
