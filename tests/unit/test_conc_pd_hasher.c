/* test_conc_pd_hasher.c - a link's checksum thread (pd/hasher.c) on its
 * own: thousands of one-page chunks through its 256-slot ring (it wraps,
 * and the producer waits for room), chunks submitted after the hasher fell
 * asleep (the wake-up), and a stop with chunks still queued. The digests
 * must equal the inline, page-whole hash (pd_xfer_hash) of the same pages. */
#include <stdlib.h>
#include <time.h>
#include "support.h"
#include "pd/desc.h"
#include "pd/hasher.h"
#include "pd/xfer.h"
#include "util/clock.h"

#define PAGES 96u /* llama3-8b, 16 tokens a page: 64 entries x 96 pages = 6144 chunks */

typedef struct fixture {
    kvt_geometry *geo;
    kvt_emu *emu;
    kvt_page_map map;
    pd_desc src, dst;
    pd_plan plan;
    uint32_t pages[PAGES], tokens[PAGES * 16];
    pd_xfer x;
} fixture;

static void setup(fixture *f)
{
    assert_ok(kvt_geometry_preset(&f->geo, "llama3-8b", 16, 1));
    assert_ok(kvt_emu_create(&f->emu, f->geo, PAGES + 7));
    for (uint32_t i = 0; i < PAGES; i++) f->pages[i] = (i * 37 + 5) % (PAGES + 7); /* scattered */
    kvt_test_tokens(f->tokens, PAGES * 16, 7);
    kvt_request req = {f->tokens, PAGES * 16, "h", 1};
    assert_ok(kvt_emu_fill(f->emu, &req, 0, PAGES * 16, f->pages, PAGES));
    kvt_engine_memory mem;
    assert_ok(kvt_emu_memory(f->emu, &mem));
    assert_ok(kvt__page_map_init(&f->map, f->geo, &mem));
    kvt_pd_rank rk = {1, 0, 1, 0, 0};
    assert_ok(pd_desc_from_geometry(&f->src, f->geo, &rk, PD_ROLE_PREFILL));
    assert_ok(pd_desc_from_geometry(&f->dst, f->geo, &rk, PD_ROLE_DECODE));
    assert_ok(pd_plan_compute(&f->plan, &f->src, &f->dst));
    f->x = (pd_xfer){&f->plan, 0, PAGES * 16, f->pages, PAGES, &f->map, PD_SIDE_SRC};
}

static void teardown(fixture *f)
{
    pd_plan_free(&f->plan);
    pd_desc_free(&f->src);
    pd_desc_free(&f->dst);
    kvt_emu_destroy(f->emu);
    kvt_geometry_destroy(f->geo);
}

/* Submits pages [j0, j1) of every entry, one page per chunk, entry-major
 * (the wire order), into states based at j0. */
static void submit_all(fixture *f, pd_hasher *h, uint32_t j0, uint32_t j1)
{
    for (uint32_t e = 0; e < f->plan.num_slices; e++)
        for (uint32_t j = j0; j < j1; j++) {
            pd_hash_chunk c = {f->x, e, j, j + 1, j0};
            assert_ok(pd_hasher_submit(h, &c, kvt__deadline_ns(30000)));
        }
}

static void expect_digests(fixture *f, pd_hashes *hs, uint32_t j0, uint32_t j1)
{
    uint64_t want[PAGES];
    pd_xfer_hash(&f->x, j0, j1, want);
    for (uint32_t j = j0; j < j1; j++) assert_int_equal(pd_hashes_digest(hs, j - j0), want[j - j0]);
}

static void ring_wraps_and_digests_match(void **state)
{
    (void)state;
    fixture f = {0};
    setup(&f);
    assert_true(f.plan.num_slices * PAGES > 4 * 256); /* the ring wraps several times */
    pd_hashes hs = {0};
    pd_hasher *h = NULL;
    assert_ok(pd_hasher_start(&h, &hs, "test link"));
    for (int batch = 0; batch < 3; batch++) { /* batches of different sizes, states reset between */
        uint32_t j0 = batch == 1 ? 10 : 0, j1 = batch == 2 ? PAGES : 60;
        assert_ok(pd_hashes_begin(&hs, j1 - j0));
        submit_all(&f, h, j0, j1);
        assert_ok(pd_hasher_drain(h, kvt__deadline_ns(30000)));
        expect_digests(&f, &hs, j0, j1);
    }
    /* idle long enough to sleep (256 polls), then fed again */
    struct timespec ts = {0, 100 * 1000000};
    nanosleep(&ts, NULL);
    assert_ok(pd_hashes_begin(&hs, 4));
    submit_all(&f, h, 0, 4);
    assert_ok(pd_hasher_drain(h, kvt__deadline_ns(30000)));
    expect_digests(&f, &hs, 0, 4);
    /* a stop with chunks queued hashes them first (the pages stay valid until it returns) */
    assert_ok(pd_hashes_begin(&hs, PAGES));
    submit_all(&f, h, 0, PAGES);
    pd_hasher_stop(h);
    expect_digests(&f, &hs, 0, PAGES);
    pd_hasher_stop(NULL);
    pd_hashes_free(&hs);
    teardown(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(ring_wraps_and_digests_match),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
