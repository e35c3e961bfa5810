/* fuzz_server_proto.c - every decoder of the node server's control protocol,
 * both directions (a client or a server may be hostile): the frame header,
 * HELLO and its reply, requests (token and keyed forms: LOOKUP, PREPARE and
 * PEEK carry one), task replies (LOOKUP's, PREPARE's, PEEK's), task ids,
 * LAUNCH replies, END, results and stats, STATS_ALL's tiers, CLEAR and
 * PEEK_MANY (both ways). The first byte picks the decoder;
 * what decodes is encoded again and must decode to the same. Headers of
 * every op are seeded by seeds_group (hdr_op*). */
#include <assert.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "server/proto.h"

static void hello(const uint8_t *p, size_t n)
{
    kvt_srv_hello h;
    if (kvt__srv_hello_decode(p, n, false, &h) != KVT_OK) return;
    kvt_srv_buf b = {0};
    if (kvt__srv_hello_encode(&b, h.pid, h.geo, h.block_tokens) == KVT_OK) {
        kvt_srv_hello h2;
        assert(b.len == n && memcmp(b.p, p, n) == 0);
        if (kvt__srv_hello_decode(b.p, b.len, false, &h2) == KVT_OK) {
            assert(kvt_geometry_compare(h.geo, h2.geo) == KVT_OK);
            assert(h2.block_tokens == h.block_tokens);
            kvt_geometry_destroy(h2.geo);
        }
    }
    kvt__srv_buf_free(&b);
    kvt_geometry_destroy(h.geo);
}

static void request(const uint8_t *p, size_t n)
{
    kvt_srv_req q;
    if (kvt__srv_req_decode(p, n, &q) != KVT_OK) return;
    kvt_request r = {.ns = q.ns, .ns_len = q.ns_len};
    if (q.form == 0) {
        r.tokens = q.tokens;
        r.num_tokens = q.count;
    } else {
        /* Every decoded key lies inside the frame and within the bound. */
        for (uint32_t i = 0; i < q.count; i++) {
            const uint8_t *d = q.keys[i].data;
            assert(q.keys[i].len >= 1 && q.keys[i].len <= KVT_SRV_MAX_KEY);
            assert(d >= p && d + q.keys[i].len <= p + n);
            (void)d;
        }
        r.keys = q.keys ? q.keys : (const kvt_key *)"";
        r.num_keys = q.count;
        r.flags = q.form == 2 ? KVT_REQ_INDEPENDENT_KEYS : 0;
    }
    kvt_srv_buf b = {0};
    if (kvt__srv_req_encode(&b, &r) == KVT_OK) {
        kvt_srv_req q2;
        assert(b.len == n); /* same layout; only padding bytes may differ */
        if (kvt__srv_req_decode(b.p, b.len, &q2) == KVT_OK) {
            assert(q2.form == q.form && q2.count == q.count && q2.ns_len == q.ns_len);
            assert(q.ns_len == 0 || memcmp(q2.ns, q.ns, q.ns_len) == 0);
            if (q.form == 0) {
                assert(q.count == 0 || memcmp(q2.tokens, q.tokens, (size_t)q.count * 4) == 0);
            } else {
                for (uint32_t i = 0; i < q.count; i++) {
                    assert(q2.keys[i].len == q.keys[i].len);
                    assert(memcmp(q2.keys[i].data, q.keys[i].data, q.keys[i].len) == 0);
                }
            }
            free(q2.tokens);
            free(q2.keys);
        } else {
            assert(0 && "a re-encoded request must decode");
        }
    }
    kvt__srv_buf_free(&b);
    free(q.tokens);
    free(q.keys);
}

static void launch_rep(const uint8_t *p, size_t n)
{
    kvt_srv_launch_rep l;
    if (kvt__srv_launch_rep_decode(p, n, &l) != KVT_OK) return;
    uint64_t sum = 0;
    for (uint32_t i = 0; i < l.num_blocks; i++) sum += kvt__srv_get64(l.offsets + 8 * (size_t)i);
    for (size_t i = 0; i < (size_t)l.num_blocks * l.num_layers; i++)
        sum += kvt__srv_get64(l.sums + 8 * i); /* every checksum the decoder admitted */
    (void)sum;
}

static void end(const uint8_t *p, size_t n)
{
    kvt_srv_end e;
    if (kvt__srv_end_decode(p, n, &e) != KVT_OK) return;
    for (size_t i = 0; i < (size_t)e.n * e.num_layers; i++)
        (void)kvt__srv_get64(e.checksums + 8 * i);
}

static void tiers(const uint8_t *p, size_t n)
{
    kvt_srv_tier t[4];
    kvt_srv_quota q[4];
    kvt_srv_info info;
    uint32_t count = 0, nq = 0;
    if (kvt__srv_tiers_decode(p, n, t, 4, &count, q, 4, &nq, &info) != KVT_OK) return;
    assert(count <= KVT_SRV_MAX_TIERS && nq <= KVT_SRV_MAX_QUOTAS);
    assert(strlen(info.version) <= KVT_SRV_VERSION_MAX);
    for (const char *v = info.version; *v; v++) assert(*v >= 0x20 && *v < 0x7f);
    for (uint32_t i = 0; i < nq && i < 4; i++) assert(strlen(q[i].prefix) <= KVT_SRV_QUOTA_PREFIX);
}

static void clear(const uint8_t *p, size_t n)
{
    const uint8_t *ns = NULL;
    uint32_t len = 0;
    if (kvt__srv_clear_decode(p, n, &ns, &len) != KVT_OK) return;
    assert(len <= KVT_SRV_MAX_NS && (len == 0 || (ns >= p && ns + len <= p + n)));
    kvt_srv_buf b = {0};
    assert(kvt__srv_clear_encode(&b, ns, len) == KVT_OK && b.len == n);
    kvt__srv_buf_free(&b);
}

/* PEEK_MANY: the frame, then each request in it as the server decodes it. */
static void peek_many(const uint8_t *p, size_t n)
{
    kvt_srv_span *sp = NULL;
    uint32_t count = 0;
    if (kvt__srv_peek_many_decode(p, n, &sp, &count) != KVT_OK) return;
    assert(count <= KVT_SRV_MAX_PEEKS);
    for (uint32_t i = 0; i < count; i++) {
        assert(sp[i].p >= p && sp[i].p + sp[i].len <= p + n);
        request(sp[i].p, sp[i].len);
    }
    free(sp);
}

static void peek_answers(const uint8_t *p, size_t n)
{
    if (n < 4) return;
    uint32_t want;
    memcpy(&want, p, 4);
    if (want > 64) return;
    int32_t st[64];
    uint32_t m[64];
    (void)kvt__srv_peek_answers_decode(p, n, want, st, m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    uint8_t which = data[0];
    const uint8_t *p = data + 1;
    size_t n = size - 1;
    uint64_t task;
    uint32_t a, c;
    switch (which % 14) { /* FLUSH carries a task-id-shaped u64: case 5; CLEAR's reply
                           * and STATS_ALL's filter (a HELLO) are cases 4 and 1 */
    case 0:
        if (n >= KVT_SRV_HDR) {
            kvt_srv_hdr h;
            (void)kvt__srv_hdr_decode(p, &h);
        }
        break;
    case 1: hello(p, n); break;
    case 2: {
        kvt_srv_hello_rep r;
        (void)kvt__srv_hello_rep_decode(p, n, &r);
        break;
    }
    case 3: request(p, n); break;
    case 4: (void)kvt__srv_task_rep_decode(p, n, &task, &a, &c); break;
    case 5: (void)kvt__srv_id_decode(p, n, &task); break;
    case 6: launch_rep(p, n); break;
    case 7: end(p, n); break;
    case 8: {
        kvt_task_result r;
        (void)kvt__srv_result_decode(p, n, &r);
        break;
    }
    case 9: {
        kvt_cache_stats s;
        (void)kvt__srv_stats_decode(p, n, &s);
        break;
    }
    case 10: tiers(p, n); break;
    case 11: clear(p, n); break;
    case 12: peek_many(p, n); break;
    case 13: peek_answers(p, n); break;
    }
    return 0;
}
