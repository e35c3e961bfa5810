/* handshake.c - forming the group. Members send HELLO; the sync leader
 * compares every field with its own (geometry: with the first rank of the
 * same PP stage, since stages hold different layers) and answers every
 * member with WELCOME or with REFUSE carrying the first difference, so all
 * ranks fail with the same message naming the ranks and the field. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "group/group.h"
#include "util/clock.h"
#include "util/config.h"

typedef struct verdict {
    kvt_status status;
    char text[KVT_NOTE_TEXT_MAX];
} verdict;

static void my_hello(const kvt_group *g, kvt_hello *h)
{
    *h = (kvt_hello){g->lib_version, g->p.pp, g->p.cp, g->p.tp, g->rank, g->pp_rank,
                     g->cp_rank, g->tp_rank, (uint32_t)g->role, g->p.geometry_digest,
                     g->p.config_digest, g->epoch};
}

static void refuse(verdict *v, kvt_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void refuse(verdict *v, kvt_status st, const char *fmt, ...)
{
    if (v->status != KVT_OK) return; /* the first difference is reported */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(v->text, sizeof v->text, fmt, ap);
    va_end(ap);
    v->status = st;
}

static void compare_roles(const kvt_group *g, const kvt_hello *h, uint32_t r, verdict *v)
{
    uint32_t tp = g->p.tp, cp = g->p.cp;
    uint32_t pr = r / (cp * tp), cr = r / tp % cp, tr = r % tp;
    uint32_t role = r == 0 ? KVT_ROLE_SYNC_LEADER
                  : (cr == 0 && tr == 0) ? KVT_ROLE_STAGE_LEADER : KVT_ROLE_MEMBER;
    if (h->rank != r || h->pp_rank != pr || h->cp_rank != cr || h->tp_rank != tr ||
        h->role != role)
        refuse(v, KVT_EINVAL, "role table: rank %u says it is rank %u pp%u cp%u tp%u role %u; "
               "rank 0 places it at pp%u cp%u tp%u role %u", r, h->rank, h->pp_rank,
               h->cp_rank, h->tp_rank, h->role, pr, cr, tr, role);
}

static void compare(const kvt_group *g, const kvt_hello *h, uint32_t r, uint64_t *stage_geo,
                    uint32_t *stage_first, verdict *v)
{
    const kvt_hello *m = NULL;
    kvt_hello mine;
    my_hello(g, &mine);
    m = &mine;
    if (h->lib_version != m->lib_version)
        refuse(v, KVT_EVERSION, "rank %u runs library version %u.%u.%u, rank 0 %u.%u.%u", r,
               h->lib_version >> 16, h->lib_version >> 8 & 255, h->lib_version & 255,
               m->lib_version >> 16, m->lib_version >> 8 & 255, m->lib_version & 255);
    if (h->pp != m->pp || h->cp != m->cp || h->tp != m->tp)
        refuse(v, KVT_EINVAL, "rank %u has geometry pp%u x cp%u x tp%u, rank 0 pp%u x cp%u x tp%u",
               r, h->pp, h->cp, h->tp, m->pp, m->cp, m->tp);
    compare_roles(g, h, r, v);
    if (h->epoch != m->epoch)
        refuse(v, KVT_ESTATE, "rank %u is at epoch %llu, rank 0 at %llu", r,
               (unsigned long long)h->epoch, (unsigned long long)m->epoch);
    if (h->config_digest != m->config_digest) {
        char which[160];
        size_t n = kvt__config_digest_diff(h->config_digest, m->config_digest, which, sizeof which);
        refuse(v, KVT_EINVAL, "rank %u's configuration differs from rank 0's in %s%s "
               "(configuration digest %016llx, rank 0 %016llx; rank-local options such as "
               "ssd_dirs are not compared)", r, n == 1 ? "option " : n ? "one of the options " : "",
               n ? which : "an option the digests cannot name (compare kvtier config --dump)",
               (unsigned long long)h->config_digest, (unsigned long long)m->config_digest);
    }
    uint32_t st = r / (g->p.cp * g->p.tp);
    if (st >= g->p.pp) return; /* already refused on the role table */
    if (stage_first[st] == UINT32_MAX) {
        stage_first[st] = r;
        stage_geo[st] = h->geometry_digest;
    } else if (h->geometry_digest != stage_geo[st]) {
        refuse(v, KVT_EGEOMETRY, "rank %u has KV geometry digest %016llx, rank %u of the same "
               "pipeline stage %u has %016llx", r, (unsigned long long)h->geometry_digest,
               stage_first[st], st, (unsigned long long)stage_geo[st]);
    }
}

/* Leader: one HELLO from member r, or a refusal naming why not. */
static void take_hello(kvt_group *g, uint32_t r, uint64_t dl, uint64_t *sg, uint32_t *sf,
                       verdict *v)
{
    for (;;) {
        kvt_frame f;
        kvt_status st = kvt__net_recv(g->net, r, &g->rx, dl);
        if (st == KVT_ETIMEDOUT) {
            refuse(v, st, "rank %u sent no hello within the deadline: %s", r, kvt_last_error());
            return;
        }
        if (st != KVT_OK) { /* interrupted (kvt_net_interrupt), or the link is gone */
            refuse(v, st == KVT_ECANCELED ? KVT_ECANCELED : KVT_ECONN,
                   "stopped waiting for rank %u's hello: %s", r, kvt_last_error());
            return;
        }
        st = kvt__frame_decode(g->rx.p, g->rx.len, g->proto_version, &f);
        if (st == KVT_EVERSION) {
            refuse(v, KVT_EVERSION, "rank %u speaks protocol version %u, rank 0 version %u", r,
                   f.version, g->proto_version);
            return;
        }
        if (st == KVT_OK && f.epoch < g->epoch) continue; /* stale */
        kvt_hello h;
        if (st == KVT_OK && (f.channel != KVT_CH_HANDSHAKE || f.op != KVT_OP_HELLO ||
                             f.sender != r || f.seq != 0))
            st = kvt__fail(KVT_EPROTO, "expected seq 0 op HELLO on channel handshake, received "
                           "seq %llu op %s on channel %s", (unsigned long long)f.seq,
                           kvt__op_name(f.op), kvt__channel_name(f.channel));
        if (st == KVT_OK) st = kvt__hello_decode(f.payload, f.len, &h);
        if (st != KVT_OK) {
            refuse(v, KVT_EPROTO, "rank %u: bad hello: %s", r, kvt_last_error());
            return;
        }
        compare(g, &h, r, sg, sf, v);
        return;
    }
}

static kvt_status lead(kvt_group *g, int64_t timeout_ms)
{
    verdict v = {KVT_OK, ""};
    uint64_t *sg = calloc(g->p.pp, sizeof *sg);
    uint32_t *sf = malloc(g->p.pp * sizeof *sf);
    if (!sg || !sf) {
        free(sg);
        free(sf);
        return kvt__fail(KVT_ENOMEM, "kvt_group handshake: out of memory");
    }
    for (uint32_t s = 0; s < g->p.pp; s++) sf[s] = UINT32_MAX;
    sf[0] = 0;
    sg[0] = g->p.geometry_digest;
    uint64_t dl = kvt__deadline_ns(2 * timeout_ms);
    for (uint32_t r = 1; r < g->ranks; r++) take_hello(g, r, dl, sg, sf, &v);
    free(sg);
    free(sf);
    uint8_t note[4 + KVT_NOTE_TEXT_MAX];
    size_t n = kvt__note_encode(note, sizeof note, (uint32_t)-v.status, v.text);
    uint64_t sdl = kvt__deadline_ns(timeout_ms);
    for (uint32_t r = 1; r < g->ranks; r++)
        (void)kvt__group_send(g, r, KVT_CH_HANDSHAKE, v.status ? KVT_OP_REFUSE : KVT_OP_WELCOME,
                              note, n, sdl);
    if (v.status != KVT_OK)
        return kvt__fail(v.status, "kvt_group: refused to form epoch %llu: %s",
                         (unsigned long long)g->epoch, v.text);
    return KVT_OK;
}

static kvt_status verdict_of(kvt_group *g, const kvt_frame *f)
{
    uint32_t word = 0;
    char text[KVT_NOTE_TEXT_MAX + 1];
    if (f->channel != KVT_CH_HANDSHAKE || f->seq != 0 || f->sender != 0 ||
        (f->op != KVT_OP_WELCOME && f->op != KVT_OP_REFUSE))
        return kvt__fail(KVT_EPROTO, "kvt_group: rank %u expected seq 0 op WELCOME or REFUSE "
                         "from rank 0 on channel handshake, received seq %llu op %s on channel %s",
                         g->rank, (unsigned long long)f->seq, kvt__op_name(f->op),
                         kvt__channel_name(f->channel));
    if (kvt__note_decode(f->payload, f->len, &word, text, sizeof text) != KVT_OK)
        return kvt__fail(KVT_EPROTO, "kvt_group: rank %u: unreadable verdict", g->rank);
    if (f->op == KVT_OP_WELCOME) return KVT_OK;
    kvt_status st = kvt__peer_failure(-(int64_t)(int32_t)word); /* 64-bit: -INT32_MIN must not overflow */
    return kvt__fail(st, "kvt_group: refused to form epoch %llu: %s",
                     (unsigned long long)g->epoch, text);
}

static kvt_status join(kvt_group *g, int64_t timeout_ms)
{
    kvt_hello h;
    uint8_t buf[KVT_HELLO_LEN];
    my_hello(g, &h);
    kvt__hello_encode(buf, &h);
    kvt_status st = kvt__group_send(g, 0, KVT_CH_HANDSHAKE, KVT_OP_HELLO, buf, sizeof buf,
                                    kvt__deadline_ns(timeout_ms));
    if (st != KVT_OK) return st;
    uint64_t dl = kvt__deadline_ns(3 * timeout_ms);
    for (;;) {
        kvt_frame f;
        st = kvt__net_recv(g->net, 0, &g->rx, dl);
        if (st != KVT_OK)
            return kvt__fail(st, "kvt_group: rank %u got no verdict from rank 0 on channel "
                             "handshake (expected seq 0 op WELCOME): %s", g->rank,
                             kvt_last_error());
        st = kvt__frame_decode(g->rx.p, g->rx.len, g->proto_version, &f);
        if (st == KVT_EVERSION)
            return kvt__fail(st, "kvt_group: rank 0 speaks protocol version %u, rank %u "
                             "version %u", f.version, g->rank, g->proto_version);
        if (st != KVT_OK) return st;
        if (f.epoch < g->epoch) continue; /* stale */
        return verdict_of(g, &f);
    }
}

kvt_status kvt__group_handshake(kvt_group *g, int64_t timeout_ms)
{
    memset(g->tx_seq, 0, sizeof *g->tx_seq * g->ranks * KVT_CH_COUNT);
    memset(g->rx_seq, 0, sizeof *g->rx_seq * g->ranks * KVT_CH_COUNT);
    g->aborted = false;
    g->formed = false;
    g->steps = 0;
    g->diag[0] = '\0';
    kvt_status st = KVT_OK;
    if (g->ranks > 1) st = kvt__group_is_leader(g) ? lead(g, timeout_ms) : join(g, timeout_ms);
    if (st != KVT_OK) {
        snprintf(g->diag, sizeof g->diag, "%s", kvt_last_error());
        g->aborted = true;
        return st;
    }
    g->formed = true;
    return KVT_OK;
}
