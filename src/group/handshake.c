/* handshake.c - forming the group in two phases (docs/protocol.md,
 * "Formation"). Members send HELLO (with a fresh attempt id and the epoch
 * they propose); the sync leader compares every field with its own
 * (geometry: with the first rank of the same PP stage, since stages hold
 * different layers) and answers every member with WELCOME (carrying the
 * agreed epoch: the largest proposal) or with REFUSE carrying the first
 * difference. A welcomed member answers JOIN; only when every member joined
 * does the leader send FORMED, and a member counts itself formed only on
 * FORMED. A member that gives up (its deadline) says GIVEUP, which the
 * leader reads in the place of its JOIN, so the leader then refuses
 * everyone: the group forms on every rank or on none (up to the one window
 * docs/protocol.md states). Every answer echoes the member's attempt id, so
 * answers to an abandoned attempt are recognised and dropped. */
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
                     g->p.config_digest, g->propose, g->attempt};
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
    if (h->config_digest != m->config_digest) {
        char which[160];
        size_t n = kvt__config_digest_diff(h->config_digest, m->config_digest, which, sizeof which);
        refuse(v, KVT_EINVAL, "rank %u's configuration differs from rank 0's in %s%s "
               "(configuration digest %016llx, rank 0 %016llx; rank-local options such as "
               "ssd_dirs are not compared)", r, n == 1 ? "option " : n ? "one of the options " : "",
               which, /* kvt__config_digest_diff says it in words when it cannot name one */
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

/* One handshake frame from peer by dl: frames of other channels (left over
 * from an earlier epoch) are dropped; the payload must start with the
 * attempt id (*att). KVT_EVERSION keeps f's header for the message. */
static kvt_status hs_recv(kvt_group *g, uint32_t peer, uint64_t dl, kvt_frame *f, uint64_t *att)
{
    for (;;) {
        kvt_status st = KVT_OK;
        if (g->stash && g->stash[peer].len) { /* a HELLO the step path kept */
            kvt_buf t = g->rx;
            g->rx = g->stash[peer];
            g->stash[peer] = t;
            g->stash[peer].len = 0;
        } else {
            st = kvt__net_recv(g->net, peer, &g->rx, dl);
        }
        if (st != KVT_OK) return st;
        st = kvt__frame_decode(g->rx.p, g->rx.len, g->proto_version, f);
        if (st != KVT_OK) return st;
        if (f->channel != KVT_CH_HANDSHAKE) continue; /* stale */
        if (f->sender != peer || f->receiver != g->rank || f->len < 8)
            return kvt__fail(KVT_EPROTO, "expected a handshake frame from rank %u to rank %u with "
                             "an attempt id, received op %s from rank %u to rank %u, %u bytes",
                             peer, g->rank, kvt__op_name(f->op), f->sender, f->receiver, f->len);
        *att = kvt__get64(f->payload);
        return KVT_OK;
    }
}

/* A handshake frame: seq 0, header epoch = this rank's proposal, payload =
 * attempt id, then a u64 (epoch) or a note, or nothing. */
static kvt_status hs_send(kvt_group *g, uint32_t peer, uint32_t op, uint64_t att,
                          const uint8_t *extra, size_t n, uint64_t dl)
{
    uint8_t buf[8 + 4 + KVT_NOTE_TEXT_MAX + KVT_HELLO_LEN];
    kvt__put64(buf, att);
    if (n) memcpy(buf + 8, extra, n);
    uint64_t epoch = g->epoch;
    g->epoch = g->propose;
    g->tx_seq[(size_t)peer * KVT_CH_COUNT + KVT_CH_HANDSHAKE] = 0;
    kvt_status st = kvt__group_send(g, peer, KVT_CH_HANDSHAKE, op, buf, 8 + n, dl);
    g->epoch = epoch;
    return st;
}

static void send_note(kvt_group *g, uint32_t peer, uint32_t op, uint64_t att, uint32_t word,
                      const char *text, uint64_t dl)
{
    uint8_t note[4 + KVT_NOTE_TEXT_MAX];
    size_t n = kvt__note_encode(note, sizeof note, word, text);
    (void)hs_send(g, peer, op, att, note, n, dl);
}

static void send_epoch(kvt_group *g, uint32_t peer, uint32_t op, uint64_t att, uint64_t epoch,
                       uint64_t dl)
{
    uint8_t e[8];
    kvt__put64(e, epoch);
    (void)hs_send(g, peer, op, att, e, 8, dl);
}

typedef struct hs_member {
    uint64_t att;   /* the attempt id of the HELLO being answered; 0: none */
    uint64_t epoch; /* its proposal */
} hs_member;

/* Leader: checks one HELLO frame from member r. */
static void take_hello_frame(kvt_group *g, uint32_t r, const kvt_frame *f, uint64_t *sg,
                             uint32_t *sf, hs_member *m, verdict *v)
{
    kvt_hello h;
    if (f->seq != 0 || kvt__hello_decode(f->payload + 8, f->len - 8, &h) != KVT_OK) {
        refuse(v, KVT_EPROTO, "rank %u: bad hello: %s", r, kvt_last_error());
        return;
    }
    m->att = h.attempt;
    m->epoch = h.epoch;
    g->hello_att[r] = h.attempt;
    compare(g, &h, r, sg, sf, v);
}

/* Leader: one HELLO from member r by dl, or a refusal naming why not.
 * JOINs and GIVEUPs of attempts that are over are dropped. */
static void take_hello(kvt_group *g, uint32_t r, uint64_t dl, uint64_t *sg, uint32_t *sf,
                       hs_member *m, verdict *v)
{
    for (;;) {
        kvt_frame f;
        uint64_t att;
        kvt_status st = hs_recv(g, r, dl, &f, &att);
        if (st == KVT_ETIMEDOUT) {
            refuse(v, st, "rank %u sent no hello within the deadline: %s", r, kvt_last_error());
            return;
        }
        if (st == KVT_EVERSION) {
            refuse(v, KVT_EVERSION, "rank %u speaks protocol version %u, rank 0 version %u", r,
                   f.version, g->proto_version);
            return;
        }
        if (st == KVT_ECANCELED || st == KVT_ECONN) { /* interrupted, or the link is gone */
            refuse(v, st, "stopped waiting for rank %u's hello: %s", r, kvt_last_error());
            return;
        }
        if (st != KVT_OK) {
            refuse(v, KVT_EPROTO, "rank %u: bad hello: %s", r, kvt_last_error());
            return;
        }
        if (f.op == KVT_OP_JOIN || f.op == KVT_OP_GIVEUP) continue; /* an attempt that is over */
        if (f.op == KVT_OP_HELLO && att == g->hello_att[r]) continue; /* a repeat (below) */
        if (f.op != KVT_OP_HELLO) {
            refuse(v, KVT_EPROTO, "rank %u: expected op HELLO on channel handshake, received op %s",
                   r, kvt__op_name(f.op));
            return;
        }
        take_hello_frame(g, r, &f, sg, sf, m, v);
        return;
    }
}

/* Leader, phase 2: member r's JOIN for the attempt it was welcomed to. A
 * GIVEUP of that attempt followed by a fresh HELLO (the member retried) is
 * answered with a new WELCOME for the same epoch, so a member's abandoned
 * attempt does not keep a later formation from converging. */
static void take_join(kvt_group *g, uint32_t r, uint64_t dl, uint64_t epoch, uint64_t *sg,
                      uint32_t *sf, hs_member *m, verdict *v)
{
    char gave_up[KVT_NOTE_TEXT_MAX + 1] = "";
    for (;;) {
        kvt_frame f;
        uint64_t att;
        kvt_status st = hs_recv(g, r, dl, &f, &att);
        if (st != KVT_OK) {
            if (gave_up[0])
                refuse(v, KVT_ETIMEDOUT, "rank %u gave up forming: %s", r, gave_up);
            else
                refuse(v, st == KVT_ETIMEDOUT || st == KVT_ECONN || st == KVT_ECANCELED ? st
                                                                                       : KVT_EPROTO,
                       "rank %u did not join epoch %llu: %s", r, (unsigned long long)epoch,
                       kvt_last_error());
            return;
        }
        if (f.op == KVT_OP_JOIN && att == m->att) return;
        if (f.op == KVT_OP_GIVEUP && att == m->att) {
            uint32_t w;
            if (kvt__note_decode(f.payload + 8, f.len - 8, &w, gave_up, sizeof gave_up) != KVT_OK)
                snprintf(gave_up, sizeof gave_up, "(unreadable reason)");
            m->att = 0;
            continue; /* it may have retried: its next HELLO follows */
        }
        /* A repeat of a HELLO already taken (a duplicated frame): answering
         * it again could pair it with that attempt's stale JOIN at the next
         * formation and form without the member (docs/model/formation.pml). */
        if (f.op == KVT_OP_HELLO && att == g->hello_att[r]) continue;
        if (f.op == KVT_OP_HELLO) {
            verdict hv = {KVT_OK, ""};
            uint32_t first = sf[r / (g->p.cp * g->p.tp)];
            if (first == r) sf[r / (g->p.cp * g->p.tp)] = UINT32_MAX; /* compare afresh */
            take_hello_frame(g, r, &f, sg, sf, m, &hv);
            if (hv.status == KVT_OK && m->epoch > epoch)
                refuse(&hv, KVT_ESTATE, "rank %u proposed epoch %llu after epoch %llu was agreed",
                       r, (unsigned long long)m->epoch, (unsigned long long)epoch);
            if (hv.status != KVT_OK) {
                refuse(v, hv.status, "%s", hv.text);
                return;
            }
            gave_up[0] = '\0';
            send_epoch(g, r, KVT_OP_WELCOME, m->att, epoch, dl);
            continue;
        }
        /* a JOIN or GIVEUP of an attempt that is over: dropped */
    }
}

static kvt_status lead(kvt_group *g, int64_t budget_ms, uint64_t t0, kvt_status pre_st,
                       const char *pre_why)
{
    verdict v = {KVT_OK, ""};
    if (pre_st != KVT_OK) refuse(&v, pre_st, "%s", pre_why);
    uint64_t *sg = calloc(g->p.pp, sizeof *sg);
    uint32_t *sf = malloc(g->p.pp * sizeof *sf);
    hs_member *m = calloc(g->ranks, sizeof *m);
    if (!sg || !sf || !m) {
        free(sg);
        free(sf);
        free(m);
        return kvt__fail(KVT_ENOMEM, "kvt_group handshake: out of memory");
    }
    for (uint32_t s = 0; s < g->p.pp; s++) sf[s] = UINT32_MAX;
    sf[0] = 0;
    sg[0] = g->p.geometry_digest;
    uint64_t budget = (uint64_t)budget_ms * 1000000ull;
    uint64_t hello_dl = t0 + budget / 2, end = t0 + budget;
    /* Phase 1: every HELLO by B/2. */
    for (uint32_t r = 1; r < g->ranks; r++) take_hello(g, r, hello_dl, sg, sf, &m[r], &v);
    uint64_t epoch = g->propose;
    for (uint32_t r = 1; r < g->ranks; r++)
        if (m[r].att && m[r].epoch > epoch) epoch = m[r].epoch;
    /* Phase 2: WELCOME with the agreed epoch, every JOIN within B/8. */
    if (v.status == KVT_OK) {
        for (uint32_t r = 1; r < g->ranks; r++)
            send_epoch(g, r, KVT_OP_WELCOME, m[r].att, epoch, end);
        uint64_t join_dl = kvt__now_ns() + budget / 8;
        for (uint32_t r = 1; r < g->ranks && v.status == KVT_OK; r++)
            take_join(g, r, join_dl, epoch, sg, sf, &m[r], &v);
    }
    free(sg);
    free(sf);
    /* Commit: FORMED to all, or REFUSE to all. A member whose HELLO the
     * leader does not hold gets a REFUSE for attempt 0, which it drops (it
     * cannot tell it from an old one) unless the frame's protocol version
     * already tells it why. */
    for (uint32_t r = 1; r < g->ranks; r++) {
        if (v.status == KVT_OK)
            send_epoch(g, r, KVT_OP_FORMED, m[r].att, epoch, end);
        else
            send_note(g, r, KVT_OP_REFUSE, m[r].att, (uint32_t)-v.status, v.text, end);
    }
    free(m);
    if (v.status != KVT_OK)
        return kvt__fail(v.status, "kvt_group: refused to form epoch %llu: %s",
                         (unsigned long long)epoch, v.text);
    g->epoch = epoch;
    return KVT_OK;
}

static kvt_status refused(kvt_group *g, const kvt_frame *f)
{
    uint32_t word = 0;
    char text[KVT_NOTE_TEXT_MAX + 1];
    if (kvt__note_decode(f->payload + 8, f->len - 8, &word, text, sizeof text) != KVT_OK)
        return kvt__fail(KVT_EPROTO, "kvt_group: rank %u: unreadable verdict", g->rank);
    kvt_status st = kvt__peer_failure(-(int64_t)(int32_t)word); /* 64-bit: -INT32_MIN must not overflow */
    return kvt__fail(st, "kvt_group: refused to form epoch %llu: %s",
                     (unsigned long long)f->epoch, text);
}

/* Member: the leader's answer to attempt att: op WELCOME or FORMED (*epoch
 * set), or a failure (REFUSE, the deadline, a lost link). Answers to other
 * attempts are dropped. */
static kvt_status await(kvt_group *g, uint64_t att, uint32_t want, uint64_t dl, uint64_t *epoch)
{
    for (;;) {
        kvt_frame f;
        uint64_t a;
        kvt_status st = hs_recv(g, 0, dl, &f, &a);
        if (st == KVT_EVERSION)
            return kvt__fail(st, "kvt_group: rank 0 speaks protocol version %u, rank %u "
                             "version %u", f.version, g->rank, g->proto_version);
        if (st != KVT_OK)
            return kvt__fail(st, "kvt_group: rank %u got no verdict from rank 0 on channel "
                             "handshake (expected op %s): %s", g->rank, kvt__op_name(want),
                             kvt_last_error());
        if (a != att) continue; /* an answer to an attempt this rank abandoned */
        if (want == KVT_OP_FORMED && f.op == KVT_OP_WELCOME) continue;
        /* ^ a repeat of this attempt's WELCOME (a duplicated frame, or a
         * duplicated HELLO the leader welcomed again, always to the same
         * epoch): failing here split the formation (docs/model/formation.pml) */
        if (f.op == KVT_OP_REFUSE) return refused(g, &f);
        if (f.op == want && f.len == 16) {
            *epoch = kvt__get64(f.payload + 8);
            return KVT_OK;
        }
        return kvt__fail(KVT_EPROTO, "kvt_group: rank %u expected op %s or REFUSE from rank 0 "
                         "on channel handshake, received op %s (%u bytes)", g->rank,
                         kvt__op_name(want), kvt__op_name(f.op), f.len);
    }
}

/* Member: tells the leader it abandoned attempt att (best effort, B/8). */
static void give_up(kvt_group *g, uint64_t att, uint64_t budget)
{
    char why[KVT_NOTE_TEXT_MAX];
    snprintf(why, sizeof why, "%s", kvt_last_error());
    send_note(g, 0, KVT_OP_GIVEUP, att, 0, why, kvt__now_ns() + budget / 8);
    kvt__fail(KVT_ETIMEDOUT, "%s", why); /* keep the reason as this rank's error */
}

static kvt_status join(kvt_group *g, int64_t budget_ms, uint64_t t0)
{
    uint64_t budget = (uint64_t)budget_ms * 1000000ull;
    uint64_t welcome_dl = t0 + budget / 4 * 3, end = t0 + budget;
    uint64_t epoch = 0, formed = 0;
    for (;;) {
        uint64_t att = ++g->attempt;
        kvt_hello h;
        uint8_t buf[KVT_HELLO_LEN];
        my_hello(g, &h);
        kvt__hello_encode(buf, &h);
        kvt_status st = hs_send(g, 0, KVT_OP_HELLO, att, buf, sizeof buf, welcome_dl);
        if (st == KVT_OK) st = await(g, att, KVT_OP_WELCOME, welcome_dl, &epoch);
        if (st == KVT_ECONN && kvt__now_ns() < welcome_dl) {
            /* The link was lost (over TCP: a replaced hub whose first accept was
             * the dying listener's): connect again and retry within the deadline. */
            kvt_status cs = kvt__net_connect(g->net, welcome_dl);
            if (cs == KVT_OK) continue;
            return cs;
        }
        if (st == KVT_ETIMEDOUT) {
            give_up(g, att, budget);
            return KVT_ETIMEDOUT;
        }
        if (st != KVT_OK) return st;
        st = hs_send(g, 0, KVT_OP_JOIN, att, NULL, 0, end);
        if (st == KVT_OK) st = await(g, att, KVT_OP_FORMED, end, &formed);
        if (st == KVT_ETIMEDOUT) give_up(g, att, budget);
        if (st != KVT_OK) return st;
        if (formed != epoch)
            return kvt__fail(KVT_EPROTO, "kvt_group: rank %u was welcomed to epoch %llu, "
                             "formed at %llu", g->rank, (unsigned long long)epoch,
                             (unsigned long long)formed);
        g->epoch = epoch;
        return KVT_OK;
    }
}

kvt_status kvt__group_form(kvt_group *g, int64_t budget_ms, uint64_t t0_ns, uint64_t propose,
                           kvt_status pre_st, const char *pre_why)
{
    memset(g->tx_seq, 0, sizeof *g->tx_seq * g->ranks * KVT_CH_COUNT);
    memset(g->rx_seq, 0, sizeof *g->rx_seq * g->ranks * KVT_CH_COUNT);
    g->aborted = false;
    g->formed = false;
    g->steps = 0;
    g->diag[0] = '\0';
    g->propose = propose;
    kvt_status st = pre_st;
    if (kvt__group_is_leader(g))
        st = g->ranks > 1 ? lead(g, budget_ms, t0_ns, pre_st, pre_why)
           : pre_st != KVT_OK ? kvt__fail(pre_st, "%s", pre_why) : KVT_OK;
    else if (st == KVT_OK)
        st = join(g, budget_ms, t0_ns);
    else
        kvt__fail(pre_st, "%s", pre_why);
    if (g->ranks == 1 && st == KVT_OK) g->epoch = propose;
    if (st != KVT_OK) {
        snprintf(g->diag, sizeof g->diag, "%s", kvt_last_error());
        g->aborted = true;
        return st;
    }
    memset(g->tx_seq, 0, sizeof *g->tx_seq * g->ranks * KVT_CH_COUNT);
    g->formed = true;
    return KVT_OK;
}
