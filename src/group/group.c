/* group.c - rank group lifetime, framed exchange and abort. The state
 * machine (docs/protocol.md): FORMING -> READY -> ABORTED -> (reform)
 * FORMING. Every receive has a deadline; every failure of a receive ends
 * the epoch for the whole group (a stream with one lost or extra frame
 * cannot be trusted again, so it is never resynchronised). */
#include "group/group.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "util/clock.h"
#include "util/hash.h"

static const char *role_name(kvt_group_role r)
{
    return r == KVT_ROLE_SYNC_LEADER ? "sync leader"
         : r == KVT_ROLE_STAGE_LEADER ? "stage leader" : "member";
}

const char *kvt__rank_str(const kvt_group *g, uint32_t rank, char *buf, size_t cap)
{
    uint32_t tp = g->p.tp, cp = g->p.cp;
    /* The return value is looked at so that GCC's -O3 truncation check
     * (a Release build's -Werror) accepts a cut label: it is only a label. */
    if (snprintf(buf, cap, "rank %u (pp%u cp%u tp%u)", rank, rank / (cp * tp), rank / tp % cp,
                 rank % tp) < 0 && cap > 0)
        buf[0] = '\0';
    return buf;
}

static uint64_t *seq_slot(uint64_t *tab, uint32_t peer, uint32_t ch)
{
    return &tab[(size_t)peer * KVT_CH_COUNT + ch];
}

kvt_status kvt__group_send(kvt_group *g, uint32_t peer, uint32_t ch, uint32_t op,
                           const void *payload, size_t len, uint64_t deadline_ns)
{
    uint8_t hdr[KVT_FRAME_HDR];
    uint64_t *seq = seq_slot(g->tx_seq, peer, ch);
    kvt_frame f = {.version = g->proto_version, .op = (uint16_t)op, .epoch = g->epoch,
                   .seq = *seq, .channel = ch, .sender = g->rank, .receiver = peer,
                   .len = (uint32_t)len};
    kvt__frame_encode(hdr, &f, payload);
    (*seq)++;
    if (ch == KVT_CH_CONTROL) /* never behind unread data: docs/protocol.md, "Abort" */
        return kvt__net_send_ctl(g->net, peer, hdr, sizeof hdr, payload, len, deadline_ns);
    return kvt__net_send(g->net, peer, hdr, sizeof hdr, payload, len, deadline_ns);
}

/* Tells the others, best effort by one shared deadline T. */
static void notify(kvt_group *g, uint32_t except, uint32_t origin, const char *text)
{
    uint8_t note[4 + KVT_NOTE_TEXT_MAX];
    size_t n = kvt__note_encode(note, sizeof note, origin, text);
    uint64_t dl = kvt__deadline_ns(g->p.timeout_ms);
    if (!kvt__group_is_leader(g)) {
        if (except != 0) (void)kvt__group_send(g, 0, KVT_CH_CONTROL, KVT_OP_ABORT, note, n, dl);
        return;
    }
    for (uint32_t r = 1; r < g->ranks; r++)
        if (r != except) (void)kvt__group_send(g, r, KVT_CH_CONTROL, KVT_OP_ABORT, note, n, dl);
}

static kvt_status abort_with(kvt_group *g, uint32_t except, uint32_t origin, const char *text)
{
    if (!g->aborted) {
        g->aborted = true;
        snprintf(g->diag, sizeof g->diag, "%s", text);
        notify(g, except, origin, text);
    }
    return kvt__fail(KVT_EABORTED, "%s", g->diag);
}

kvt_status kvt__group_abortf(kvt_group *g, uint32_t except, const char *fmt, ...)
{
    char text[KVT_ERRMSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    return abort_with(g, except, g->rank, text);
}

/* peer: the link it came on, which names a sender whose reason is garbled
 * (its frame's own sender field may be as garbled). */
static kvt_status remote_abort(kvt_group *g, const kvt_frame *f, uint32_t peer)
{
    uint32_t origin = 0;
    char text[KVT_NOTE_TEXT_MAX + 1];
    char full[KVT_ERRMSG_MAX];
    if (kvt__note_decode(f->payload, f->len, &origin, text, sizeof text) != KVT_OK) {
        /* Who it came from is all that is known: the sender is named, not
         * the origin field's default (rank 0). */
        origin = peer;
        snprintf(text, sizeof text, "group aborted (epoch %llu): rank %u sent an abort whose "
                 "reason could not be read (%u bytes)", (unsigned long long)g->epoch, origin,
                 (unsigned)f->len);
    }
    snprintf(full, sizeof full, "group aborted by rank %u (epoch %llu): %s", origin,
             (unsigned long long)g->epoch, text);
    /* The leader relays to everyone else; the origin already knows. */
    return abort_with(g, f->sender, origin, strncmp(text, "group aborted", 13) ? full : text);
}

/* Names what was expected from whom, for every receive-side diagnostic. */
static int expect_str(kvt_group *g, uint32_t peer, uint32_t ch, uint32_t op, char *buf,
                      size_t cap)
{
    char me[48], them[48];
    return snprintf(buf, cap, "epoch %llu: %s, %s, from %s on channel %s: expected seq %llu op %s",
                    (unsigned long long)g->epoch, kvt__rank_str(g, g->rank, me, sizeof me),
                    role_name(g->role), kvt__rank_str(g, peer, them, sizeof them),
                    kvt__channel_name(ch), (unsigned long long)*seq_slot(g->rx_seq, peer, ch),
                    kvt__op_name(op));
}

static kvt_status recv_failed(kvt_group *g, uint32_t peer, uint32_t ch, uint32_t op,
                              kvt_status st)
{
    char exp[256];
    expect_str(g, peer, ch, op, exp, sizeof exp);
    if (st == KVT_ETIMEDOUT)
        return kvt__group_abortf(g, UINT32_MAX, "%s, received nothing within the deadline (%lld ms)",
                                 exp, (long long)g->p.timeout_ms);
    if (st == KVT_ECONN)
        return kvt__group_abortf(g, peer, "%s, lost the rank: %s", exp, kvt_last_error());
    if (st == KVT_ECANCELED) /* this rank's net was interrupted: nothing was received */
        return kvt__group_abortf(g, UINT32_MAX, "%s, stopped waiting: %s", exp, kvt_last_error());
    return kvt__group_abortf(g, UINT32_MAX, "%s, received an invalid frame: %s", exp,
                             kvt_last_error());
}

static kvt_status check_frame(kvt_group *g, uint32_t peer, uint32_t ch, uint32_t op,
                              const kvt_frame *f)
{
    uint64_t want = *seq_slot(g->rx_seq, peer, ch);
    if (f->epoch == g->epoch && f->sender == peer && f->receiver == g->rank &&
        f->channel == ch && f->seq == want && f->op == op)
        return KVT_OK;
    char exp[256];
    expect_str(g, peer, ch, op, exp, sizeof exp);
    return kvt__group_abortf(g, UINT32_MAX, "%s, received seq %llu op %s on channel %s "
                             "(epoch %llu, sender %u, receiver %u)", exp,
                             (unsigned long long)f->seq, kvt__op_name(f->op),
                             kvt__channel_name(f->channel), (unsigned long long)f->epoch,
                             f->sender, f->receiver);
}

kvt_status kvt__group_recv(kvt_group *g, uint32_t peer, uint32_t ch, uint32_t op,
                           uint64_t deadline_ns, kvt_frame *f)
{
    if (g->aborted) return kvt__fail(KVT_EABORTED, "%s", g->diag);
    for (;;) {
        kvt_status st = kvt__net_recv(g->net, peer, &g->rx, deadline_ns);
        if (st == KVT_OK) st = kvt__frame_decode(g->rx.p, g->rx.len, g->proto_version, f);
        if (st != KVT_OK) return recv_failed(g, peer, ch, op, st);
        if (g->stash && f->channel == KVT_CH_HANDSHAKE && f->op == KVT_OP_HELLO) {
            /* The member re-forms (or a replacement process joins) while the
             * leader still steps: this epoch is over for it, and its HELLO is
             * kept for the formation that follows (whatever its epoch). */
            kvt_buf t = g->stash[peer];
            g->stash[peer] = g->rx;
            g->rx = t;
            g->rx.len = 0;
            char exp[256];
            expect_str(g, peer, ch, op, exp, sizeof exp);
            return kvt__group_abortf(g, UINT32_MAX, "%s, received op HELLO: the rank re-forms "
                                     "or was replaced", exp);
        }
        if (f->epoch < g->epoch) continue; /* left over from an aborted epoch */
        if (f->op == KVT_OP_ABORT && f->channel == KVT_CH_CONTROL && f->epoch == g->epoch)
            return remote_abort(g, f, peer);
        st = check_frame(g, peer, ch, op, f);
        if (st != KVT_OK) return st;
        (*seq_slot(g->rx_seq, peer, ch))++;
        return KVT_OK;
    }
}

/* Sends a step payload: the engine's step number, then the connector's bytes. */
static kvt_status send_step(kvt_group *g, uint32_t peer, uint32_t op, const void *p, size_t len,
                            uint64_t deadline_ns)
{
    kvt_status st = kvt__buf_reserve(&g->tx, KVT_STEP_HEAD + len);
    if (st != KVT_OK) return st;
    kvt__put64(g->tx.p, g->step_no);
    if (len) memcpy(g->tx.p + KVT_STEP_HEAD, p, len);
    return kvt__group_send(g, peer, KVT_CH_STEP, op, g->tx.p, KVT_STEP_HEAD + len, deadline_ns);
}

/* Receives a step frame from peer and checks that it is for this rank's
 * step number: a rank that skipped or added a step is caught at the step
 * where it happened, whether or not the ranks run in lockstep. On KVT_OK
 * f's payload is the connector's bytes (the step number stripped). */
static kvt_status recv_step(kvt_group *g, uint32_t peer, uint32_t op, uint64_t deadline_ns,
                            kvt_frame *f)
{
    kvt_status st = kvt__group_recv(g, peer, KVT_CH_STEP, op, deadline_ns, f);
    if (st != KVT_OK) return st;
    char me[48], them[48];
    if (f->len < KVT_STEP_HEAD)
        return kvt__group_abortf(g, UINT32_MAX, "epoch %llu: %s sent %s %s of %u bytes, without "
                                 "its step number", (unsigned long long)g->epoch,
                                 kvt__rank_str(g, peer, them, sizeof them),
                                 kvt__op_name(op), kvt__rank_str(g, g->rank, me, sizeof me),
                                 f->len);
    uint64_t n = kvt__get64(f->payload);
    if (n != g->step_no)
        return kvt__group_abortf(g, UINT32_MAX, "epoch %llu: step skew: %s calls step %llu "
                                 "while %s calls step %llu (seen in %s); every rank must pass "
                                 "the same step number", (unsigned long long)g->epoch,
                                 kvt__rank_str(g, peer, them, sizeof them), (unsigned long long)n,
                                 kvt__rank_str(g, g->rank, me, sizeof me),
                                 (unsigned long long)g->step_no, kvt__op_name(op));
    f->payload += KVT_STEP_HEAD;
    f->len -= KVT_STEP_HEAD;
    return KVT_OK;
}

kvt_status kvt__group_step_member(kvt_group *g, uint64_t step, const void *up, size_t up_len,
                                  const uint8_t **down, size_t *down_len)
{
    if (g->aborted) return kvt__fail(KVT_EABORTED, "%s", g->diag);
    g->step_no = step;
    kvt_status st = send_step(g, 0, KVT_OP_STEP_UP, up, up_len, kvt__deadline_ns(g->p.timeout_ms));
    if (st != KVT_OK)
        return kvt__group_abortf(g, 0, "epoch %llu: rank %u could not send step %llu to the "
                                 "sync leader: %s", (unsigned long long)g->epoch, g->rank,
                                 (unsigned long long)step, kvt_last_error());
    kvt_frame f;
    st = recv_step(g, 0, KVT_OP_STEP_DOWN, kvt__deadline_ns(2 * g->p.timeout_ms), &f);
    if (st != KVT_OK) return st;
    *down = f.payload;
    *down_len = f.len;
    return KVT_OK;
}

kvt_status kvt__group_step_ack(kvt_group *g)
{
    if (g->aborted) return kvt__fail(KVT_EABORTED, "%s", g->diag);
    kvt_status st = send_step(g, 0, KVT_OP_STEP_ACK, NULL, 0, kvt__deadline_ns(g->p.timeout_ms));
    if (st != KVT_OK)
        return kvt__group_abortf(g, 0, "epoch %llu: rank %u could not acknowledge step %llu to "
                                 "the sync leader: %s", (unsigned long long)g->epoch, g->rank,
                                 (unsigned long long)g->step_no, kvt_last_error());
    g->steps++;
    return KVT_OK;
}

kvt_status kvt__group_gather(kvt_group *g, uint64_t step)
{
    if (g->aborted) return kvt__fail(KVT_EABORTED, "%s", g->diag);
    g->step_no = step;
    uint64_t dl = kvt__deadline_ns(g->p.timeout_ms);
    for (uint32_t r = 1; r < g->ranks; r++) {
        kvt_frame f;
        kvt_status st = recv_step(g, r, KVT_OP_STEP_UP, dl, &f);
        if (st == KVT_OK) st = kvt__buf_reserve(&g->ups[r], f.len ? f.len : 1);
        if (st != KVT_OK) return g->aborted ? st : kvt__group_abortf(g, UINT32_MAX, "%s",
                                                                     kvt_last_error());
        memcpy(g->ups[r].p, f.payload, f.len);
        g->ups[r].len = f.len;
    }
    return KVT_OK;
}

kvt_status kvt__group_bcast(kvt_group *g, const void *down, size_t len)
{
    if (g->aborted) return kvt__fail(KVT_EABORTED, "%s", g->diag);
    uint64_t dl = kvt__deadline_ns(g->p.timeout_ms);
    for (uint32_t r = 1; r < g->ranks; r++) {
        kvt_status st = send_step(g, r, KVT_OP_STEP_DOWN, down, len, dl);
        if (st != KVT_OK)
            return kvt__group_abortf(g, r, "epoch %llu: the sync leader could not send step "
                                     "%llu to rank %u: %s", (unsigned long long)g->epoch,
                                     (unsigned long long)g->step_no, r, kvt_last_error());
    }
    return KVT_OK;
}

/* An ABORT a member sent after its STEP_UP (it timed out, or could not
 * apply the DOWN) arrives here in place of its ACK: the abort wins, and
 * the leader ends the epoch without applying the step. */
kvt_status kvt__group_commit(kvt_group *g)
{
    if (g->aborted) return kvt__fail(KVT_EABORTED, "%s", g->diag);
    uint64_t dl = kvt__deadline_ns(g->p.timeout_ms);
    for (uint32_t r = 1; r < g->ranks; r++) {
        kvt_frame f;
        kvt_status st = recv_step(g, r, KVT_OP_STEP_ACK, dl, &f);
        if (st != KVT_OK) return st;
    }
    g->steps++;
    return KVT_OK;
}
