/* Regressions found by a review of the connector (2 ranks as threads over
 * inproc, tp2; every wait bounded):
 *  A: an extra rank-local poll on one rank must not change what
 *     kvt_conn_wait_layer answers there;
 *  B: a second store of a rid whose first is still running is refused
 *     (KVT_EBUSY) instead of being confused with it, so STORE_DONE never
 *     comes while pages are still being read, and no wrong byte is stored;
 *  C: a reset returns only after cancelled transfers stopped writing the
 *     engine's pages, so recomputed KV is never overwritten. */
#include <stdarg.h>
#include "support.h"
#include "test_group_util.h"
#include "connector/conn.h"
#include "group/group.h"

#define RANKS 2
/* T: a step waits for the other rank up to 2T; scenario A holds one rank
 * 300 ms plus a load under TSan on a loaded CI machine before it steps */
#define T_MS 5000
#define NTOK 2048
#define PT 16
#define NPG (NTOK / PT)
typedef struct rc_t {
    uint32_t rank;
    kvt_config *cfg; kvt_geometry *geo; kvt_emu *emu; kvt_cache *cache;
    kvt_net *net; kvt_group *g; kvt_conn *conn;
    kvt_conn_event ev[256]; uint32_t nev;
    uint64_t step_no;         /* the engine's iteration counter */
    char log[4096];
    int checked;              /* the scenario reached its check */
    kvt_status wait_layer_st; /* A */
    int running_at_done;      /* B */
    uint64_t bad_bytes;       /* B: loaded back wrong; C: overwritten */
} rc_t;
static kvt_fabric *fab;
static rc_t rcs[RANKS];
static int scenario;
static void L(rc_t *rc, const char *fmt, ...)
{
    va_list ap; va_start(ap, fmt);
    size_t n = strlen(rc->log);
    vsnprintf(rc->log + n, sizeof rc->log - n, fmt, ap);
    va_end(ap);
}
#define OK(x) do { kvt_status s_ = (x); if (s_) { L(rc, "rank %u: %s -> %s: %s\n", rc->rank, #x, kvt_status_name(s_), kvt_last_error()); return; } } while (0)

static kvt_status step(rc_t *rc)
{
    kvt_status st = kvt_conn_step(rc->conn, ++rc->step_no);
    if (st) { L(rc, "rank %u: step -> %s: %s\n", rc->rank, kvt_status_name(st), kvt_group_diagnostic(rc->g)); return st; }
    uint32_t n = 0;
    kvt_conn_events(rc->conn, rc->ev + rc->nev, 256 - rc->nev, &n);
    for (uint32_t i = 0; i < n; i++) {
        kvt_conn_event *e = &rc->ev[rc->nev + i];
        L(rc, "rank %u: step %llu ev rid %llu kind %d %s tokens %u\n", rc->rank,
          (unsigned long long)rc->g->steps, (unsigned long long)e->rid, e->kind, kvt_status_name(e->status), e->tokens);
    }
    rc->nev += n;
    return st;
}
static int has(rc_t *rc, uint64_t rid, int kind, uint32_t from)
{
    for (uint32_t i = from; i < rc->nev; i++) if (rc->ev[i].rid == rid && (int)rc->ev[i].kind == kind) return (int)i;
    return -1;
}
static int store_running(rc_t *rc, uint64_t rid)
{
    int n = 0;
    pthread_mutex_lock(&rc->conn->mu);
    for (uint32_t i = 0; i < rc->conn->run.n; i++) n += rc->conn->run.p[i].rid == rid && rc->conn->run.p[i].kind == KVT_TASK_STORE;
    pthread_mutex_unlock(&rc->conn->mu);
    return n;
}

static uint32_t tok[NTOK + 16], tok2[NTOK + 16];
static void setup(rc_t *rc)
{
    OK(kvt_config_create(&rc->cfg));
    OK(kvt_config_set(rc->cfg, "cpu_capacity", "160MiB"));
    OK(kvt_config_set(rc->cfg, "block_tokens", "16"));
    rc->geo = kvt_test_geometry(2, 32, 128, PT, KVT_LAYOUT_LAYER_FIRST);
    OK(kvt_emu_create(&rc->emu, rc->geo, 2 * NPG + 2));
    OK(kvt_emu_set_first_head(rc->emu, 0));
    OK(kvt_cache_create(&rc->cache, rc->cfg, rc->geo));
    kvt_engine_memory mem; OK(kvt_emu_memory(rc->emu, &mem));
    OK(kvt_cache_register_memory(rc->cache, &mem));
    kvt_geometry_info gi; OK(kvt_geometry_info_get(rc->geo, &gi));
    uint64_t cd; OK(kvt_config_digest(rc->cfg, &cd));
    OK(kvt_net_inproc_create(&rc->net, fab, rc->rank));
    kvt_group_params p = {1, 1, 2, gi.digest, cd, T_MS, 1};
    OK(kvt_group_create(&rc->g, rc->net, &p));
    OK(kvt_conn_create(&rc->conn, rc->g, rc->cache));
}

static void pages_from(uint32_t *pg, uint32_t first, uint32_t n) { for (uint32_t i = 0; i < n; i++) pg[i] = first + i; }

/* A: an extra rank-local poll on one rank changes what wait_layer says. */
static void sc_a(rc_t *rc)
{
    uint32_t pg[NPG + 1], pg2[NPG + 1];
    pages_from(pg, 0, NPG + 1); pages_from(pg2, NPG, NPG + 1);
    kvt_request req = {tok, NTOK, "ns", 2}, req2 = {tok, NTOK + 1, "ns", 2};
    OK(kvt_emu_fill(rc->emu, &req, 0, NTOK, pg, NPG));
    OK(kvt_conn_store(rc->conn, 1, &req, pg, NPG));
    for (int i = 0; i < 10000 && has(rc, 1, KVT_EV_STORE_DONE, 0) < 0; i++) { if (step(rc)) return; tg_sleep_ms(1); }
    uint32_t local;
    OK(kvt_conn_lookup(rc->conn, 2, &req2, &local));
    OK(kvt_conn_load(rc->conn, 2, pg2, NPG + 1, 1));
    if (step(rc)) return;
    if (rc->rank == 1) { tg_sleep_ms(300); L(rc, "rank 1: run.n before poll %u\n", rc->conn->run.n); uint32_t e = 0; OK(kvt_conn_poll(rc->conn, &e)); L(rc, "rank 1: extra poll collected %u, run.n %u done.n %u\n", e, rc->conn->run.n, rc->conn->done.n); }
    kvt_status st = kvt_conn_wait_layer(rc->conn, 2, 0, 20000);
    L(rc, "rank %u: wait_layer(rid 2, layer 0) -> %s %s\n", rc->rank, kvt_status_name(st), st ? kvt_last_error() : "");
    rc->wait_layer_st = st;
    rc->checked = 1;
    for (int i = 0; i < 10000 && has(rc, 2, KVT_EV_LOAD_DONE, 0) < 0; i++) { if (step(rc)) return; tg_sleep_ms(1); }
}

/* B: two stores of one (live) rid in consecutive steps. */
static void sc_b(rc_t *rc)
{
    uint32_t pg[NPG];
    pages_from(pg, 0, NPG);
    kvt_request req = {tok2, NTOK, "ns", 2};
    OK(kvt_emu_fill(rc->emu, &req, 0, NTOK, pg, NPG));
    OK(kvt_conn_store(rc->conn, 5, &req, pg, NPG));
    if (step(rc)) return;                 /* STORE #1 decided + launched */
    OK(kvt_conn_store(rc->conn, 5, &req, pg, NPG)); /* chunked prefill: store again */
    if (step(rc)) return;                 /* STORE #2 decided */
    int d = -1;
    for (int i = 0; i < 10000 && (d = has(rc, 5, KVT_EV_STORE_DONE, 0)) < 0; i++) { if (step(rc)) return; tg_sleep_ms(1); }
    if (d < 0) { L(rc, "rank %u: no STORE_DONE\n", rc->rank); return; }
    rc->running_at_done = store_running(rc, 5);
    L(rc, "rank %u: first STORE_DONE rid 5 (%s, tokens %u) while %d store task(s) of rid 5 still running\n",
      rc->rank, kvt_status_name(rc->ev[d].status), rc->ev[d].tokens, rc->running_at_done);
    /* The engine believes the store finished and reuses the pages. */
    OK(kvt_emu_poison(rc->emu, pg, NPG));
    for (int i = 0; i < 10000 && has(rc, 5, KVT_EV_STORE_DONE, (uint32_t)d + 1) < 0; i++) { if (step(rc)) return; tg_sleep_ms(1); }
    /* Load it back and verify. */
    uint32_t pg2[NPG + 1]; pages_from(pg2, NPG, NPG + 1);
    kvt_request req2 = {tok2, NTOK + 1, "ns", 2};
    uint32_t local;
    OK(kvt_conn_lookup(rc->conn, 6, &req2, &local));
    OK(kvt_conn_load(rc->conn, 6, pg2, NPG + 1, 0));
    if (step(rc)) return;
    int e = -1;
    for (int i = 0; i < 10000 && (e = has(rc, 6, KVT_EV_LOAD_DONE, 0)) < 0; i++) { if (step(rc)) return; tg_sleep_ms(1); }
    if (e < 0 || rc->ev[e].status) { L(rc, "rank %u: load 6 failed\n", rc->rank); return; }
    kvt_verify_result v;
    OK(kvt_emu_verify(rc->emu, &req, 0, rc->ev[e].tokens, pg2, NPG + 1, &v));
    L(rc, "rank %u: loaded %u tokens back, %llu mismatching bytes\n", rc->rank, rc->ev[e].tokens, (unsigned long long)v.mismatches);
    rc->bad_bytes = v.mismatches;
    rc->checked = 1;
}

/* C: a reset (or abort) cancels a running load and returns at once; the
 * engine writes its pages; the cancelled transfer keeps writing them. */
static void sc_c(rc_t *rc)
{
    uint32_t pg[NPG + 1], pg2[NPG + 1];
    pages_from(pg, 0, NPG + 1); pages_from(pg2, NPG, NPG + 1);
    kvt_request req = {tok, NTOK, "ns", 2}, req2 = {tok, NTOK + 1, "ns", 2};
    kvt_request other = {tok2, NTOK, "ns", 2};
    OK(kvt_emu_fill(rc->emu, &req, 0, NTOK, pg, NPG));
    OK(kvt_conn_store(rc->conn, 1, &req, pg, NPG));
    for (int i = 0; i < 10000 && has(rc, 1, KVT_EV_STORE_DONE, 0) < 0; i++) { if (step(rc)) return; tg_sleep_ms(1); }
    uint32_t local;
    OK(kvt_conn_lookup(rc->conn, 2, &req2, &local));
    OK(kvt_conn_load(rc->conn, 2, pg2, NPG + 1, 1));
    if (step(rc)) return; /* LOAD launched */
    OK(kvt_conn_reset(rc->conn));
    if (step(rc)) return; /* RESET: everything cancelled */
    /* recompute into the pages */
    OK(kvt_emu_fill(rc->emu, &other, 0, NTOK, pg2, NPG));
    tg_sleep_ms(300);
    kvt_verify_result v;
    OK(kvt_emu_verify(rc->emu, &other, 0, NTOK, pg2, NPG, &v));
    L(rc, "rank %u: after RESET and recompute, %llu bytes of the recomputed pages were overwritten (first bad token %u layer %u)\n",
      rc->rank, (unsigned long long)v.mismatches, v.first_bad_token, v.first_bad_layer);
    rc->bad_bytes = v.mismatches;
    rc->checked = 1;
}

static void *rank_main(void *p)
{
    rc_t *rc = p;
    setup(rc);
    if (rc->conn) {
        if (scenario == 0) sc_a(rc); else if (scenario == 1) sc_b(rc); else sc_c(rc);
    }
    kvt_conn_destroy(rc->conn); kvt_group_destroy(rc->g); kvt_net_destroy(rc->net);
    kvt_cache_destroy(rc->cache); kvt_emu_destroy(rc->emu); kvt_geometry_destroy(rc->geo); kvt_config_destroy(rc->cfg);
    return NULL;
}

static void run(int which)
{
    scenario = which;
    kvt_test_tokens(tok, NTOK + 16, 7);
    kvt_test_tokens(tok2, NTOK + 16, 9);
    assert_int_equal(kvt_fabric_create(&fab, RANKS, 64), KVT_OK);
    pthread_t th[RANKS];
    for (uint32_t r = 0; r < RANKS; r++) {
        memset(&rcs[r], 0, sizeof rcs[r]);
        rcs[r].rank = r;
        assert_int_equal(pthread_create(&th[r], NULL, rank_main, &rcs[r]), 0);
    }
    for (uint32_t r = 0; r < RANKS; r++) pthread_join(th[r], NULL);
    kvt_fabric_destroy(fab);
    for (uint32_t r = 0; r < RANKS; r++)
        if (!rcs[r].checked) fail_msg("rank %u did not reach its check:\n%s", r, rcs[r].log);
}

static void test_conc_poll_does_not_change_wait_layer(void **state)
{
    (void)state;
    run(0);
    for (uint32_t r = 0; r < RANKS; r++)
        if (rcs[r].wait_layer_st != KVT_OK) fail_msg("%s", rcs[r].log);
}

static void test_conc_second_store_of_a_rid_waits(void **state)
{
    (void)state;
    run(1);
    for (uint32_t r = 0; r < RANKS; r++)
        if (rcs[r].running_at_done || rcs[r].bad_bytes) fail_msg("%s", rcs[r].log);
}

static void test_conc_reset_waits_for_transfers(void **state)
{
    (void)state;
    run(2);
    for (uint32_t r = 0; r < RANKS; r++)
        if (rcs[r].bad_bytes) fail_msg("%s", rcs[r].log);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_conc_poll_does_not_change_wait_layer),
        cmocka_unit_test(test_conc_second_store_of_a_rid_waits),
        cmocka_unit_test(test_conc_reset_waits_for_transfers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
