/* sender.c - a prefill rank. Decode ranks connect to its listener,
 * authenticate and register their descriptor (refused on the spot, with the
 * plan's message, when it cannot be converted; other peers are untouched).
 * Each room waits for the page tables of every decode rank that needs this
 * rank and for the engine's send(), then each target's link thread streams
 * DATA batches (<= 8 MiB, one checksum per decode page) and DONE. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <sodium.h>
#include "pd/bootstrap.h"
#include "pd/ep.h"
#include "util/clock.h"
#include "util/err.h"
#include "util/sync.h"
#include "util/vec.h"

struct kvt_pd_sender {
    pd_ep ep;
    char bs_host[64];     /* the bootstrap service (copied from the params) */
    uint16_t bs_port;
    uint32_t lease_ms;    /* from its OK (0: its entries never lapse) */
    uint8_t bs_token[PD_BS_TOKEN_LEN]; /* the entry's, from the OK (bootstrap.h); renew thread
                                        * and create only, then destroy after the join */
    bool registered;      /* destroy unregisters */
    pthread_t renew_th;   /* renews the lease every lease_ms / 3 */
    bool renew_started;
    bool renew_stop;      /* guarded by renew_mu */
    pthread_mutex_t renew_mu;
    pthread_cond_t renew_cv;
};

static void wake(pd_conn *c)
{
    char b = 1;
    ssize_t w = write(c->wake[1], &b, 1);
    (void)w;
}

/* Starts the transfer once everything is in (ep->mu held). */
static void maybe_start(pd_ep *ep, pd_room *r)
{
    if (!r->claimed || !r->have_input || r->ntargets < r->expected || r->ntargets == 0 ||
        r->started || pd_room_terminal(r))
        return;
    if (r->src_ntok != r->ntok) {
        pd_room_fail(ep, r, KVT_EINVAL, "prefill sent %u tokens, decode expects %u", r->src_ntok, r->ntok);
        pd_room_notify(ep, r, UINT32_MAX);
        return;
    }
    r->started = true;
    pd_room_advance(ep, r, KVT_PD_TRANSFERRING);
    for (uint32_t i = 0; i < r->ntargets; i++) {
        pd_conn *c = ep->conns[r->targets[i].conn];
        pd_job *j = calloc(1, sizeof *j);
        if (!j) {
            pd_room_fail(ep, r, KVT_ENOMEM, "out of memory starting the transfer");
            pd_room_notify(ep, r, UINT32_MAX);
            return;
        }
        j->room = r;
        j->target = i;
        j->gen = r->targets[i].gen;
        r->refs++;
        if (c->jobs_tail) c->jobs_tail->next = j;
        else c->jobs = j;
        c->jobs_tail = j;
        wake(c);
    }
}

static pd_target *target_of(pd_room *r, uint32_t conn)
{
    for (uint32_t i = 0; i < r->ntargets; i++)
        if (r->targets[i].conn == conn) return &r->targets[i];
    return NULL;
}

/* The target a frame of link c is about: NULL when the room is gone or the
 * frame belongs to another opening of it (a late frame; dropped). */
static pd_target *frame_target(pd_room *r, const pd_conn *c, const pd_hdr *h)
{
    pd_target *t = r ? target_of(r, c->idx) : NULL;
    return t && t->gen == h->gen ? t : NULL;
}

/* The room failed on a ROOM frame: its targets hear it (with their own
 * generations), and so does the opening that caused it, which is not a
 * target yet (ep->mu held). */
static void fail_opening(pd_ep *ep, pd_conn *c, pd_room *r, const pd_hdr *h)
{
    pd_room_notify(ep, r, UINT32_MAX);
    pd_target *t = target_of(r, c->idx);
    if (!t || t->gen != h->gen) pd_conn_queue_msg(c, PD_F_FAIL, h->room, h->gen, r->err, r->msg);
}

static kvt_status add_target(pd_ep *ep, pd_conn *c, pd_room *r, const pd_hdr *h, uint32_t ntok,
                             uint32_t np, const uint8_t *pages)
{
    if (r->started || (r->ntargets && (r->expected != h->a0 || r->prefix != h->a1 || r->ntok != ntok))) {
        pd_room_fail(ep, r, KVT_EPROTO, "decode ranks disagree on room %llu (expected %u/%u, prefix %u/%u, tokens %u/%u)",
                     (unsigned long long)r->id, r->expected, h->a0, r->prefix, h->a1, r->ntok, ntok);
        fail_opening(ep, c, r, h);
        return KVT_OK;
    }
    if (target_of(r, c->idx)) {
        pd_room_fail(ep, r, KVT_EPROTO, "%s opened room %llu twice", c->name, (unsigned long long)r->id);
        fail_opening(ep, c, r, h);
        return KVT_OK;
    }
    void *tp = r->targets;
    kvt_status gst = kvt__grow32(&tp, &r->tcap, r->ntargets + 1, sizeof *r->targets, "pd sender: room targets");
    r->targets = tp;
    if (gst) return gst;
    pd_target t = {.conn = c->idx, .gen = h->gen, .num_pages = np, .pages = malloc((size_t)np * 4 + 4)};
    if (!t.pages) return kvt__fail(KVT_ENOMEM, "pd sender: out of memory");
    for (uint32_t i = 0; i < np; i++) t.pages[i] = pd_get32(pages + 4 * (size_t)i);
    r->targets[r->ntargets++] = t;
    r->expected = h->a0;
    r->prefix = h->a1;
    r->ntok = ntok;
    if (r->claimed && r->ntargets == r->expected) pd_room_advance(ep, r, KVT_PD_WAITING_FOR_INPUT);
    maybe_start(ep, r);
    return KVT_OK;
}

/* Decode ranks are told apart by their address and registered position:
 * every link of one (reconnects, or a stranger dialling many times) shares
 * one budget of unclaimed rooms. ep->mu held; `registered` is set under it
 * after host and peer are final. */
static bool same_identity(const pd_conn *a, const pd_conn *b)
{
    return a->registered && b->registered && strcmp(a->host, b->host) == 0 &&
           a->peer.tp_rank == b->peer.tp_rank && a->peer.tp_size == b->peer.tp_size &&
           a->peer.dcp_rank == b->peer.dcp_rank && a->peer.dcp_size == b->peer.dcp_size;
}

static uint32_t identity_unclaimed(const pd_ep *ep, const pd_conn *c)
{
    uint32_t n = c->unclaimed; /* its own, registered or not */
    for (uint32_t i = 0; i < ep->nconns; i++)
        if (ep->conns[i] && ep->conns[i] != c && same_identity(ep->conns[i], c)) n += ep->conns[i]->unclaimed;
    return n;
}

/* The decode identity holding the most unclaimed rooms, for messages
 * (ep->mu held): "decode tp0/1 dcp0/1 at 10.0.0.5 (4096)", or "none". */
static void top_opener(const pd_ep *ep, char *out, size_t n)
{
    const pd_conn *top = NULL;
    uint32_t most = 0;
    for (uint32_t i = 0; i < ep->nconns; i++) {
        const pd_conn *c = ep->conns[i];
        uint32_t k = c && c->unclaimed ? identity_unclaimed(ep, c) : 0;
        if (k > most) {
            most = k;
            top = c;
        }
    }
    if (!top) snprintf(out, n, "none");
    else snprintf(out, n, "decode tp%u/%u dcp%u/%u at %s (%u)", top->peer.tp_rank, top->peer.tp_size,
                  top->peer.dcp_rank, top->peer.dcp_size, top->host, most);
}

/* Why the room table is full, naming whose rooms fill it (ep->mu held). */
static kvt_status table_full(const pd_ep *ep, const char *who)
{
    char top[160];
    top_opener(ep, top, sizeof top);
    return kvt__fail(KVT_EFULL,
                     "%s: this prefill rank holds %u rooms (the limit): %u opened or claimed by its engine "
                     "and not cleared (kvt_pd_sender_clear), %u opened by decode ranks and not claimed "
                     "(most: %s)",
                     who, ep->nrooms, ep->nrooms - ep->unclaimed, ep->unclaimed, top);
}

/* A room a decode rank opened before the engine claimed it: bounded per
 * decode identity (PD_MAX_UNCLAIMED over all its links) and in all
 * (PD_MAX_UNCLAIMED_ALL), so neither a runaway decode rank nor many
 * strangers can fill the table the engine needs (ep->mu held). */
static kvt_status add_unclaimed(pd_ep *ep, pd_conn *c, uint64_t id, pd_room **out)
{
    uint32_t mine = identity_unclaimed(ep, c);
    if (mine >= PD_MAX_UNCLAIMED)
        return kvt__fail(KVT_EFULL,
                         "%s has %u rooms open that this prefill rank's engine has not claimed (the limit per "
                         "decode rank, over all its links)",
                         c->name, mine);
    if (ep->unclaimed >= PD_MAX_UNCLAIMED_ALL) {
        char top[160];
        top_opener(ep, top, sizeof top);
        return kvt__fail(KVT_EFULL,
                         "this prefill rank holds %u rooms decode ranks opened and its engine has not claimed "
                         "(the limit for all decode ranks; most: %s)",
                         ep->unclaimed, top);
    }
    kvt_status st = pd_room_add(ep, id, out);
    if (st == KVT_EFULL) return table_full(ep, c->name);
    if (st) return st;
    (*out)->opener = c->idx;
    c->unclaimed++;
    ep->unclaimed++;
    return KVT_OK;
}

static kvt_status on_room(pd_conn *c, const pd_hdr *h)
{
    pd_ep *ep = c->ep;
    if (h->body_len < 8) return kvt__fail(KVT_EPROTO, "%s: ROOM frame of %u bytes", c->name, h->body_len);
    uint32_t ntok = pd_get32(c->body), np = pd_get32(c->body + 4);
    if ((uint64_t)np * 4 + 8 != h->body_len || h->a0 == 0 || h->a0 > PD_MAX_RANKS ||
        h->a1 > ntok)
        return kvt__fail(KVT_EPROTO, "%s: malformed ROOM frame (pages %u, body %u, expected %u, prefix %u)",
                         c->name, np, h->body_len, h->a0, h->a1);
    uint64_t need = ((uint64_t)pd_plan_local_tokens(&c->plan, ntok) + c->plan.dst_tpp - 1) / c->plan.dst_tpp;
    if (np < need) {
        pd_conn_queue_msg(c, PD_F_FAIL, h->room, h->gen, KVT_EINVAL, "page table too short for the tokens");
        return KVT_OK;
    }
    pthread_mutex_lock(&ep->mu);
    c->used_ns = kvt__now_ns();
    pd_room *r = pd_room_find(ep, h->room);
    kvt_status st = KVT_OK;
    if (r && !r->claimed && pd_room_terminal(r) && !frame_target(r, c, h)) {
        pd_room_remove(ep, r); /* a failed opening nobody claimed: the id is reused */
        r = NULL;
    }
    if (!r) st = add_unclaimed(ep, c, h->room, &r);
    if (st) {
        pthread_mutex_unlock(&ep->mu);
        pd_conn_queue_msg(c, PD_F_FAIL, h->room, h->gen, st, kvt_last_error());
        return KVT_OK;
    }
    if (pd_room_terminal(r)) {
        /* The id is reused before this side's engine cleared the room. */
        char msg[PD_MSG + 160];
        snprintf(msg, sizeof msg,
                 "room %llu not yet cleared by the prefill engine (kvt_pd_sender_clear) before its reuse; it ended %s%s%s",
                 (unsigned long long)r->id, kvt_pd_poll_name(r->state), r->msg[0] ? ": " : "", r->msg);
        pd_conn_queue_msg(c, PD_F_FAIL, h->room, h->gen, KVT_ESTATE, msg);
    }
    else st = add_target(ep, c, r, h, ntok, np, c->body + 8);
    pthread_mutex_unlock(&ep->mu);
    return st;
}


static void on_done_ack(pd_conn *c, const pd_hdr *h)
{
    pd_ep *ep = c->ep;
    pthread_mutex_lock(&ep->mu);
    pd_room *r = pd_room_find(ep, h->room);
    pd_target *t = r && !pd_room_terminal(r) ? frame_target(r, c, h) : NULL;
    if (t && h->status != KVT_OK) {
        pd_room_fail(ep, r, kvt__peer_failure(h->status), "%s refused the transfer: %s", c->name, (char *)c->body);
        pd_room_notify(ep, r, c->idx);
    } else if (t && !t->done && !t->done_sent) {
        /* Success only after this side sent everything: an early ack is a
         * broken or hostile peer, never a finished transfer. */
        pd_room_fail(ep, r, KVT_EPROTO, "%s acknowledged room %llu before it was sent", c->name,
                     (unsigned long long)r->id);
        pd_room_notify(ep, r, c->idx);
    } else if (t && !t->done) {
        t->done = true;
        if (++r->acked == r->ntargets) pd_room_advance(ep, r, KVT_PD_SUCCESS);
    }
    pthread_mutex_unlock(&ep->mu);
}

static void on_fail(pd_conn *c, const pd_hdr *h, bool abort)
{
    pd_ep *ep = c->ep;
    pthread_mutex_lock(&ep->mu);
    pd_room *r = pd_room_find(ep, h->room);
    kvt_status st = abort ? KVT_EABORTED : kvt__peer_failure(h->status);
    if (frame_target(r, c, h) && pd_room_fail(ep, r, st, "%s %s: %s", c->name, abort ? "aborted" : "failed",
                                              (char *)c->body))
        pd_room_notify(ep, r, c->idx);
    pthread_mutex_unlock(&ep->mu);
    if (abort) pd_conn_queue_msg(c, PD_F_ABORT_ACK, h->room, h->gen, KVT_OK, NULL);
}

static void on_abort_ack(pd_conn *c, const pd_hdr *h)
{
    pthread_mutex_lock(&c->ep->mu);
    pd_room *r = pd_room_find(c->ep, h->room);
    if (frame_target(r, c, h)) r->abort_acks++;
    pthread_mutex_unlock(&c->ep->mu);
}

static kvt_status sender_frame(pd_conn *c, const pd_hdr *h)
{
    switch (h->type) {
    case PD_F_ROOM: return on_room(c, h);
    case PD_F_DONE_ACK: on_done_ack(c, h); return KVT_OK;
    case PD_F_FAIL: on_fail(c, h, false); return KVT_OK;
    case PD_F_ABORT: on_fail(c, h, true); return KVT_OK;
    case PD_F_ABORT_ACK: on_abort_ack(c, h); return KVT_OK;
    case PD_F_PING: return KVT_OK;
    default: return kvt__fail(KVT_EPROTO, "%s: unexpected frame type %u", c->name, h->type);
    }
}

/* Pages [next, j1) for one DATA frame: up to PD_BATCH_BYTES (PD_BATCH_BYTES_UCX
 * over UCX: longer coalesced runs per entry; at least one page). */
static uint32_t batch_end(const pd_conn *c, const pd_xfer *x, uint32_t next, uint32_t end)
{
    uint64_t bytes = 0, max_pages = pd_batch_max_pages(c);
    uint64_t cap = c->s->ops->sendv_async ? PD_BATCH_BYTES_UCX : PD_BATCH_BYTES;
    uint32_t j = next;
    while (j < end && j - next < max_pages) {
        uint64_t b = pd_xfer_page_bytes(x, j);
        if (bytes && (bytes + b > cap || bytes + b > c->max_frame)) break;
        bytes += b;
        j++;
    }
    return j;
}

/* One part of a DATA frame: over a stream with sendv_async it stays in
 * flight while the next chunk is hashed (its engine pages stay put while
 * the job holds the room; pieces under 64 KiB, the header and a short
 * trailer included, are copied: stream.h); wait: a plain send. DONE,
 * control frames and pings are plain sends, which wait for all of it. */
static kvt_status send_part(pd_conn *c, const struct iovec *v, int n, bool wait)
{
    const kvt_stream_ops *ops = c->s->ops;
    bool async = ops->sendv_async && !wait;
    kvt_status st = (async ? ops->sendv_async : ops->sendv)(c->s, v, n, pd_conn_deadline(c));
    if (st) return kvt__fail(st, "%s: peer not reading (DATA %s)", c->name,
                             st == KVT_ETIMEDOUT ? "timed out" : "failed");
    c->last_tx = kvt__now_ns();
    return KVT_OK;
}

/* The payload of pages [j0, j1) a chunk at a time (wire.h: entry-major),
 * each hashed into its pages' states just before it is sent: the hash
 * pulls the chunk into cache for the transport's copy, and the chunks
 * before it move meanwhile. The receiver cuts the same chunks. A send
 * gathers chunks of consecutive entries up to PD_CHUNK_BYTES: with many
 * layers and few pages a batch, one entry's chunk is only a few pages'
 * pieces (32 KiB each for Llama-3-8B), and a syscall or message per piece
 * cost a third of TCP's throughput. */
static kvt_status send_chunks(pd_conn *c, const pd_xfer *x, uint32_t j0, uint32_t j1)
{
    c->iov.n = 0;
    c->iov.bytes = 0;
    for (uint32_t e = 0; e < x->plan->num_slices; e++) {
        for (uint32_t ja = j0, jb; ja < j1; ja = jb) {
            jb = pd_xfer_chunk_end(x, e, ja, j1, PD_CHUNK_BYTES);
            kvt_status st = pd_xfer_iov_append(x, e, ja, jb, &c->iov);
            if (st) return st;
            st = pd_conn_hash(c, x, e, ja, jb, j0);
            if (st) return st;
            if (c->iov.bytes < PD_CHUNK_BYTES) continue;
            st = send_part(c, c->iov.v, (int)c->iov.n, false);
            c->iov.n = 0;
            c->iov.bytes = 0;
            if (st) return st;
        }
    }
    return c->iov.n ? send_part(c, c->iov.v, (int)c->iov.n, false) : KVT_OK;
}

/* The page checksums that trail the payload (wire.h), little-endian. */
static kvt_status send_trailer(pd_conn *c, uint32_t np)
{
    for (uint32_t p = 0; p < np; p++) pd_put64((uint8_t *)&c->sums[p], pd_hashes_digest(&c->hs, p));
    if (++c->batches == c->ep->corrupt_batch) c->sums[c->ep->corrupt_index % np] ^= 1; /* test hook */
    struct iovec v = {c->sums, (size_t)np * 8};
    /* async copies it only when short; a longer one must not be reused
     * under the transport by the next batch */
    return send_part(c, &v, 1, v.iov_len >= (64u << 10));
}

/* An authenticated link's DATA tag, in place of the trailer (mac.h). */
static kvt_status send_tag(pd_conn *c, pd_mac_dir *md)
{
    pd_mac_end(md, c->tag);
    if (md->broken) return kvt__fail(KVT_ESYS, "%s: OpenSSL failed computing a DATA tag; the link stops", c->name);
    if (++c->batches == c->ep->corrupt_batch) c->tag[c->ep->corrupt_index % PD_TAG_LEN] ^= 1; /* test hook */
    struct iovec v = {c->tag, sizeof c->tag};
    return send_part(c, &v, 1, false);
}

/* One DATA frame: header, payload chunk by chunk, checksum trailer (or,
 * on an authenticated link, header tag, payload, tag: mac.h). */
static kvt_status send_batch(pd_conn *c, pd_job *j, const pd_xfer *x)
{
    uint32_t j0 = j->next_page, j1 = batch_end(c, x, j0, j->end_page), np = j1 - j0;
    uint64_t bytes = 0;
    for (uint32_t p = j0; p < j1; p++) bytes += pd_xfer_page_bytes(x, p);
    if (np > c->sums_cap) {
        uint64_t *s = realloc(c->sums, np * sizeof *s);
        if (!s) return kvt__fail(KVT_ENOMEM, "pd sender: out of memory");
        c->sums = s;
        c->sums_cap = np;
    }
    pd_mac_dir *md = pd_conn_data_mac(c);
    kvt_status st = md ? KVT_OK : pd_hashes_begin(&c->hs, np);
    if (st) return st;
    uint8_t hb[PD_HDR_LEN], htag[PD_TAG_LEN];
    pd_hdr h = {.type = PD_F_DATA, .room = j->room->id, .a0 = j0, .a1 = np, .payload_len = bytes,
                .gen = j->gen};
    pd_hdr_encode(&h, hb);
    if (md) pd_mac_head(md, hb, htag);
    struct iovec v[2] = {{hb, sizeof hb}, {htag, sizeof htag}};
    st = send_part(c, v, md ? 2 : 1, false);
    if (!st) st = send_chunks(c, x, j0, j1);
    /* every chunk hashed, failed or not: the room's pages are not read after this returns */
    kvt_status hashed = pd_conn_hashed(c);
    if (!st) st = hashed;
    if (!st) st = md ? send_tag(c, md) : send_trailer(c, np);
    if (st) return st;
    /* The peer took the batch, each send within the peer timeout: it is
     * reading. Its link thread sends no ping while it lands a batch, which
     * may take longer than the peer timeout on a slow link (receiver.c
     * land: PD_LAND_FACTOR), so this is its sign of life, not its last
     * ping; a frozen peer still fails the next send once the socket's
     * buffers are full. */
    c->last_rx = kvt__now_ns();
    pthread_mutex_lock(&c->ep->mu);
    j->room->bytes += bytes;
    pthread_mutex_unlock(&c->ep->mu);
    j->next_page = j1;
    return KVT_OK;
}

static void pop_job(pd_conn *c)
{
    pd_job *j = c->jobs;
    c->jobs = j->next;
    if (!c->jobs) c->jobs_tail = NULL;
    pd_room_unref(j->room);
    free(j);
}

static kvt_status sender_work(pd_conn *c, bool *busy)
{
    pd_ep *ep = c->ep;
    pthread_mutex_lock(&ep->mu);
    pd_job *j = c->jobs;
    if (j && (j->room->cleared || pd_room_terminal(j->room))) {
        if (j->begun && c->s->ops->flush) {
            /* its last batches may still be moving from the room's pages */
            pthread_mutex_unlock(&ep->mu);
            kvt_status st = c->s->ops->flush(c->s, pd_conn_deadline(c));
            if (st) return kvt__fail(st, "%s: peer not reading (DATA %s)", c->name,
                                     st == KVT_ETIMEDOUT ? "timed out" : "failed");
            pthread_mutex_lock(&ep->mu);
            j = c->jobs; /* only this thread pops jobs */
        }
        pop_job(c);
        j = NULL;
    }
    *busy = c->jobs != NULL;
    pd_room *r = j ? j->room : NULL;
    pd_xfer x = {0};
    if (r)
        x = (pd_xfer){&c->plan, r->prefix, r->ntok, r->src_pages, r->n_src, ep->map, PD_SIDE_SRC};
    pthread_mutex_unlock(&ep->mu);
    if (!j) return KVT_OK;
    if (!j->begun) {
        pd_xfer_page_range(&x, &j->first_page, &j->end_page);
        j->next_page = j->first_page;
        j->begun = true;
    }
    if (j->next_page < j->end_page) return send_batch(c, j, &x);
    pd_hdr h = {.type = PD_F_DONE, .room = r->id, .a0 = j->end_page - j->first_page, .gen = j->gen};
    kvt_status st = pd_conn_send(c, &h, NULL, 0);
    pthread_mutex_lock(&ep->mu);
    pd_target *t = st == KVT_OK ? target_of(r, c->idx) : NULL;
    if (t) t->done_sent = true; /* before this link's thread reads the ack */
    pop_job(c);
    *busy = c->jobs != NULL;
    pthread_mutex_unlock(&ep->mu);
    return st;
}

static uint32_t sender_dead(pd_conn *c, kvt_status st, const char *why)
{
    pd_ep *ep = c->ep;
    uint32_t n = 0;
    while (c->jobs) pop_job(c);
    for (uint32_t b = 0; b < PD_ROOM_BUCKETS; b++)
        for (pd_room *r = ep->buckets[b]; r; r = r->next)
        {
            /* A decode rank that already acknowledged its part may go away:
             * only rooms still waiting on this link fail. */
            pd_target *t = target_of(r, c->idx);
            if (t && !t->done && pd_room_fail(ep, r, st, "%s lost: %s", c->name, why)) {
                pd_room_notify(ep, r, c->idx);
                n++;
            }
            /* Rooms this link opened that the engine never claimed stop
             * counting against its decode identity now, not when they
             * are dropped a while after failing: the rank's next link
             * must not hear "has N rooms open" for a link that is gone. */
            if (r->opener == c->idx && !r->claimed) pd_room_unclaimed_done(ep, r);
        }
    return n;
}

static const pd_ep_hooks sender_hooks = {sender_frame, sender_work, sender_dead, NULL};

/* Both sides bound what they read by their own max_frame: the link sends
 * nothing above the smaller, and a decode page (the smallest unit a DATA
 * frame moves) must fit in it, which is refused now rather than killing the
 * link at the first transfer. */
static kvt_status agree_max_frame(pd_conn *c, uint32_t peer_max)
{
    uint32_t own = c->ep->net.max_frame;
    if (peer_max < 4096)
        return kvt__fail(KVT_EPROTO, "the decode rank's max_frame is %u (below 4096)", peer_max);
    c->max_frame = peer_max < own ? peer_max : own;
    uint64_t page = (uint64_t)c->plan.dst_tpp * c->plan.bytes_per_token;
    if (page > c->max_frame)
        return kvt__fail(KVT_EGEOMETRY,
                         "a decode page carries %llu bytes from this prefill rank, above max_frame %u (prefill %u, decode %u); raise max_frame on both sides",
                         (unsigned long long)page, c->max_frame, own, peer_max);
    return KVT_OK;
}

/* The handshake of a new link: authenticate, then the decode rank's
 * registration, refused with the plan's message when not convertible. */
static kvt_status handshake(pd_conn *c)
{
    pd_ep *ep = c->ep;
    uint32_t greet = ep->net.peer_timeout_ms < PD_GREET_MS ? ep->net.peer_timeout_ms : PD_GREET_MS;
    uint8_t key[PD_SESSION_KEY_LEN];
    kvt_stream_auth a = ep->auth;
    a.session_key = key;
    kvt_status st = kvt__stream_auth_server(c->s->fd, &a, kvt__deadline_ns(greet));
    if (!st && ep->secret) st = pd_mac_new(&c->mac, key, true);
    sodium_memzero(key, sizeof key);
    if (st) return st;
    uint64_t dl = pd_conn_deadline(c);
    if (ep->net.transport == KVT_PD_UCX && (st = kvt__stream_ucx_upgrade(&c->s, 1, dl)) != KVT_OK)
        return st;
    pd_hdr h;
    st = pd_conn_read(c, &h, dl);
    if (st) return st;
    if (h.type != PD_F_REGISTER)
        return kvt__fail(KVT_EPROTO, "expected REGISTER, got frame type %u", h.type);
    size_t used;
    st = pd_desc_decode(&c->peer, c->body, h.body_len, &used);
    if (!st && (c->peer.role != PD_ROLE_DECODE || h.body_len - used != 4))
        st = kvt__fail(KVT_EPROTO, "malformed REGISTER (role %u, %zu bytes after the descriptor)", c->peer.role,
                       h.body_len - used);
    if (!st) st = pd_plan_compute(&c->plan, &ep->desc, &c->peer);
    if (!st) st = agree_max_frame(c, pd_get32(c->body + used));
    if (st) {
        char msg[KVT_ERRMSG_MAX];
        snprintf(msg, sizeof msg, "%s", kvt_last_error());
        pd_hdr r = {.type = PD_F_REFUSE, .status = st};
        (void)pd_conn_send(c, &r, msg, strlen(msg));
        return kvt__fail(st, "%s", msg);
    }
    c->has_plan = true;
    snprintf(c->name, sizeof c->name, "decode tp%u/%u dcp%u/%u at %s", c->peer.tp_rank, c->peer.tp_size,
             c->peer.dcp_rank, c->peer.dcp_size, c->addr);
    uint8_t mf[4];
    pd_put32(mf, ep->net.max_frame);
    pd_hdr ok = {.type = PD_F_OK};
    return pd_conn_send(c, &ok, mf, sizeof mf);
}

static void *sender_conn_main(void *arg)
{
    pd_conn *c = arg;
    kvt_status st = handshake(c);
    if (st && atomic_load(&c->evicted)) {
        pd_log("pd sender: dropped %s: not registered after %llu ms while %u unregistered connections "
               "were open (the limit; the oldest makes room)", c->name,
               (unsigned long long)((kvt__now_ns() - c->accepted_ns) / 1000000), PD_MAX_GREETING);
        atomic_store(&c->dead, true);
        atomic_store(&c->finished, true);
        return NULL;
    }
    if (st) {
        pd_log("pd sender: refused %s: %s", c->name, kvt_last_error());
        shutdown(c->s->fd, SHUT_RDWR); /* the stranger learns now; the slot is reused later */
        atomic_store(&c->dead, true);
        atomic_store(&c->finished, true);
        return NULL;
    }
    pthread_mutex_lock(&c->ep->mu);
    c->registered = true;
    c->used_ns = kvt__now_ns();
    pthread_mutex_unlock(&c->ep->mu);
    return pd_conn_main(c);
}

/* A free slot: a new one, or one whose refused stranger has finished. */
/* True while some room still names link slot idx as a target. */
static bool slot_referenced(pd_ep *ep, uint32_t idx)
{
    for (uint32_t b = 0; b < PD_ROOM_BUCKETS; b++)
        for (pd_room *r = ep->buckets[b]; r; r = r->next)
            if (target_of(r, idx)) return true;
    return false;
}

/* A slot for a new link: a dead link's (its thread joined, socket closed)
 * once no room names it any more, so decode ranks that restart or reconnect
 * never exhaust the table; else a fresh one. */
static int free_slot(pd_ep *ep)
{
    for (uint32_t i = 0; i < ep->nconns; i++) {
        pd_conn *c = ep->conns[i];
        if (atomic_load(&c->finished) && (!c->registered || !slot_referenced(ep, i))) {
            pd_conn_free(c);
            ep->conns[i] = NULL;
            return (int)i;
        }
    }
    return ep->nconns < PD_MAX_CONNS ? (int)ep->nconns++ : -1;
}

/* Shuts link c down to make room (ep->mu held): its thread ends on its own
 * and the slot is free once it has (free_slot). */
static void evict(pd_conn *c)
{
    atomic_store(&c->evicted, true);
    shutdown(c->fd, SHUT_RDWR);
}

/* Unregistered connections hold at most PD_MAX_GREETING slots: at the
 * limit the oldest goes, so silent strangers cost their own slots and
 * never lock decode ranks out (ep->mu held). */
static void greeting_budget(pd_ep *ep)
{
    pd_conn *oldest = NULL;
    uint32_t n = 0;
    for (uint32_t i = 0; i < ep->nconns; i++) {
        pd_conn *c = ep->conns[i];
        if (!c || c->registered || atomic_load(&c->finished) || atomic_load(&c->evicted)) continue;
        n++;
        if (!oldest || c->accepted_ns < oldest->accepted_ns) oldest = c;
    }
    if (n >= PD_MAX_GREETING) evict(oldest);
}

/* Every slot is taken: evicts the registered link that carries no room and
 * has opened none for longest (a decode rank that only pings), and
 * returns it, or NULL when every link carries a room (ep->mu held). */
static pd_conn *evict_idle(pd_ep *ep)
{
    bool busy[PD_MAX_CONNS] = {0};
    for (uint32_t b = 0; b < PD_ROOM_BUCKETS; b++)
        for (pd_room *r = ep->buckets[b]; r; r = r->next)
            for (uint32_t i = 0; i < r->ntargets; i++) busy[r->targets[i].conn] = true;
    pd_conn *v = NULL;
    for (uint32_t i = 0; i < ep->nconns; i++) {
        pd_conn *c = ep->conns[i];
        if (!c || !c->registered || busy[i] || c->unclaimed || atomic_load(&c->finished) ||
            atomic_load(&c->evicted))
            continue;
        if (!v || c->used_ns < v->used_ns) v = c;
    }
    if (v) evict(v);
    return v;
}

/* A slot for c (ep->mu held, may drop it while an evicted link ends):
 * free, or freed by evicting an idle link; -1 if none within 500 ms. */
static int take_slot(pd_ep *ep, const pd_conn *c)
{
    int slot = free_slot(ep);
    if (slot >= 0) return slot;
    pd_conn *v = evict_idle(ep);
    if (!v) return -1;
    pd_log("pd sender: dropped idle link %s (no room for %llu ms) for a connection from %s: all %u link "
           "slots were in use", v->name, (unsigned long long)((kvt__now_ns() - v->used_ns) / 1000000), c->addr,
           PD_MAX_CONNS);
    uint64_t dl = kvt__deadline_ns(500);
    while ((slot = free_slot(ep)) < 0 && kvt__now_ns() < dl && !atomic_load(&ep->stop)) {
        pthread_mutex_unlock(&ep->mu);
        struct timespec ts = {0, 2 * 1000000};
        nanosleep(&ts, NULL);
        pthread_mutex_lock(&ep->mu);
    }
    return slot;
}

static void accept_tick(pd_ep *ep)
{
    kvt_stream *s;
    if (kvt__stream_accept(ep->lfd, kvt__deadline_ns(10), &s) != KVT_OK) return;
    pd_conn *c = NULL;
    if (pd_conn_new(ep, s, &c) != KVT_OK) {
        kvt__stream_destroy(s);
        return;
    }
    pd_peer_addr(s->fd, c->host, sizeof c->host, c->addr, sizeof c->addr);
    c->fd = s->fd;
    c->accepted_ns = kvt__now_ns();
    pthread_mutex_lock(&ep->mu);
    greeting_budget(ep);
    int slot = take_slot(ep, c);
    if (slot < 0) {
        pthread_mutex_unlock(&ep->mu);
        pd_log("pd sender: refused a connection from %s: all %u link slots carry rooms", c->addr, PD_MAX_CONNS);
        pd_conn_free(c);
        return;
    }
    c->idx = (uint32_t)slot;
    snprintf(c->name, sizeof c->name, "unregistered peer %s", c->addr);
    ep->conns[slot] = c;
    if (pd_conn_start(c, sender_conn_main) != KVT_OK) atomic_store(&c->finished, true);
    pthread_mutex_unlock(&ep->mu);
}

/* ---- public API ---- */

/* Registers this rank's lease. Live registrations of another TP/DCP
 * configuration (KVT_EBUSY) lapse unless renewed: retried until dl. */
#define REGISTER_RETRY_NS 200000000ull /* between tries while the name is held */
#define REGISTER_TRY_NS 1000000000ull  /* left for a retry, or its EBUSY is the answer */

/* A name another live sender holds is retried (its lease may lapse) while
 * a whole try still fits before dl: a retry started with a few ms left
 * would fail on its deadline (KVT_ECONN or KVT_ETIMEDOUT) on a slow
 * machine, hiding the real answer, KVT_EBUSY. */
static kvt_status register_lease(kvt_pd_sender *s, uint64_t dl)
{
    pd_ep *ep = &s->ep;
    for (;;) {
        kvt_status st = pd_bootstrap_register(&ep->net, &ep->auth, s->bs_host, s->bs_port, &ep->desc,
                                              ep->bind_host, ep->port, dl, s->bs_token, &s->lease_ms);
        if (st != KVT_EBUSY || kvt__now_ns() + REGISTER_RETRY_NS + REGISTER_TRY_NS >= dl)
            return st;
        struct timespec ts = kvt__ns_to_timespec(REGISTER_RETRY_NS);
        nanosleep(&ts, NULL);
    }
}

/* Renews the lease every lease_ms / 3 (after a failure, every lease_ms / 6),
 * each try bounded by 1 s, on its own thread: an unreachable bootstrap
 * service never stalls the service thread's accepts and room deadlines. */
static void *renew_main(void *arg)
{
    kvt_pd_sender *s = arg;
    pd_ep *ep = &s->ep;
    uint64_t period = (uint64_t)s->lease_ms * 1000000ull / 3, next = kvt__now_ns() + period;
    uint32_t try_ms = s->lease_ms / 3 < 1000 ? s->lease_ms / 3 : 1000;
    bool failing = false;
    pthread_mutex_lock(&s->renew_mu);
    while (!s->renew_stop) {
        if (kvt__now_ns() < next) {
            kvt__cond_wait_until(&s->renew_cv, &s->renew_mu, next);
            continue;
        }
        pthread_mutex_unlock(&s->renew_mu);
        kvt_status st = pd_bootstrap_register(&ep->net, &ep->auth, s->bs_host, s->bs_port, &ep->desc,
                                              ep->bind_host, ep->port, kvt__deadline_ns(try_ms),
                                              s->bs_token, NULL);
        if (st)
            pd_log("pd sender: renewing the bootstrap lease failed (next try in %u ms; the entry lapses %u ms after the last renewal): %s",
                   s->lease_ms / 6, s->lease_ms, kvt_last_error());
        else if (failing)
            pd_log("pd sender: bootstrap lease renewed again");
        failing = st != KVT_OK;
        pthread_mutex_lock(&s->renew_mu);
        next = kvt__now_ns() + (failing ? period / 2 : period);
    }
    pthread_mutex_unlock(&s->renew_mu);
    return NULL;
}

kvt_status kvt_pd_sender_create(kvt_pd_sender **out, const kvt_pd_params *p)
{
    static const char fn[] = "kvt_pd_sender_create";
    KVT_CHECK_NOT_NULL(out, fn);
    kvt_pd_sender *s = calloc(1, sizeof *s);
    if (!s) return kvt__fail(KVT_ENOMEM, "%s: out of memory", fn);
    pthread_mutex_init(&s->renew_mu, NULL);
    kvt__cond_init(&s->renew_cv);
    s->ep.hooks = &sender_hooks;
    kvt_status st = pd_ep_init(&s->ep, p, PD_ROLE_PREFILL, fn);
    if (!st && p->bootstrap_host && strlen(p->bootstrap_host) >= sizeof s->bs_host)
        st = kvt__fail(KVT_EINVAL, "%s: bootstrap_host is too long", fn);
    if (!st) {
        snprintf(s->bs_host, sizeof s->bs_host, "%s", p->bootstrap_host ? p->bootstrap_host : "127.0.0.1");
        s->bs_port = p->bootstrap_port;
    }
    if (!st && (st = kvt__stream_listen(s->ep.bind_host, s->ep.net.port, &s->ep.lfd, &s->ep.port)))
        kvt__wrap_error(st, fn); /* the refusal names the call */
    uint64_t dl = kvt__deadline_ns(p && p->connect_timeout_ms ? p->connect_timeout_ms : 10000);
    if (!st) st = pd_ep_start_service_tick(&s->ep, accept_tick);
    if (!st) st = register_lease(s, dl);
    if (!st) s->registered = true;
    if (!st && s->lease_ms) {
        if (pthread_create(&s->renew_th, NULL, renew_main, s) != 0)
            st = kvt__fail(KVT_ESYS, "%s: cannot start a thread", fn);
        else
            s->renew_started = true;
    }
    if (st) {
        char msg[KVT_ERRMSG_MAX];
        snprintf(msg, sizeof msg, "%s", kvt_last_error());
        kvt_pd_sender_destroy(s);
        /* Name the function the user called unless the message does. */
        if (strncmp(msg, fn, sizeof fn - 1) == 0) return kvt__fail(st, "%s", msg);
        return kvt__fail(st, "%s: %s", fn, msg);
    }
    *out = s;
    kvt__clear_error();
    return KVT_OK;
}

kvt_status kvt_pd_sender_port(const kvt_pd_sender *s, uint16_t *out)
{
    KVT_CHECK_NOT_NULL(s, "kvt_pd_sender_port");
    KVT_CHECK_NOT_NULL(out, "kvt_pd_sender_port");
    *out = s->ep.port;
    return KVT_OK;
}

kvt_status kvt_pd_sender_room(kvt_pd_sender *s, uint64_t room)
{
    static const char fn[] = "kvt_pd_sender_room";
    KVT_CHECK_NOT_NULL(s, fn);
    pd_ep *ep = &s->ep;
    pthread_mutex_lock(&ep->mu);
    pd_room *r = pd_room_find(ep, room);
    kvt_status st = KVT_OK;
    if (r && r->claimed)
        st = kvt__fail(KVT_EBUSY, "%s: room %llu is already open; clear it first", fn, (unsigned long long)room);
    else if (!r && (st = pd_room_add(ep, room, &r)) == KVT_EFULL)
        st = table_full(ep, fn);
    else if (st)
        kvt__wrap_error(st, fn); /* pd_room_add's ENOMEM: name the call */
    if (!st) {
        r->claimed = true;
        pd_room_unclaimed_done(ep, r);
        if (r->ntargets && r->ntargets == r->expected) pd_room_advance(ep, r, KVT_PD_WAITING_FOR_INPUT);
    }
    pthread_mutex_unlock(&ep->mu);
    return st;
}

static kvt_status check_src_pages(const pd_ep *ep, const uint32_t *pages, uint32_t np, uint32_t ntok,
                                  const char *fn)
{
    const pd_desc *d = &ep->desc;
    uint32_t local = d->dcp_size == 1 ? ntok
                     : ntok > d->dcp_rank ? (ntok - d->dcp_rank + d->dcp_size - 1) / d->dcp_size : 0;
    uint64_t need = ((uint64_t)local + d->tokens_per_page - 1) / d->tokens_per_page;
    KVT_CHECK_ARG(np >= need, "%s: %u pages of %u tokens cannot hold %u tokens (need %llu)", fn, np,
                  d->tokens_per_page, local, (unsigned long long)need);
    /* NULL only with no pages at all: set_input copies the table whole. */
    KVT_CHECK_ARG(pages || np == 0, "%s: pages is NULL (num_pages %u)", fn, np);
    for (uint64_t i = 0; i < need; i++)
        KVT_CHECK_ARG(pages[i] < ep->engine_pages, "%s: pages[%llu] is %u, the engine has %u pages", fn,
                      (unsigned long long)i, pages[i], ep->engine_pages);
    return KVT_OK;
}

static kvt_status set_input(pd_ep *ep, pd_room *r, const uint32_t *pages, uint32_t np, uint32_t ntok,
                            const char *fn)
{
    if (pd_room_terminal(r) || r->have_input)
        return kvt__fail(KVT_ESTATE, "%s: room %llu is %s%s%s", fn, (unsigned long long)r->id,
                         r->have_input ? "already sending" : "finished", r->msg[0] ? ": " : "", r->msg);
    r->src_pages = malloc((size_t)np * 4 + 4);
    if (!r->src_pages) return kvt__fail(KVT_ENOMEM, "%s: out of memory", fn);
    if (np) memcpy(r->src_pages, pages, (size_t)np * 4);
    r->n_src = np;
    r->src_ntok = ntok;
    r->have_input = true;
    maybe_start(ep, r);
    return KVT_OK;
}

kvt_status kvt_pd_sender_send(kvt_pd_sender *s, uint64_t room, const uint32_t *pages,
                              uint32_t num_pages, uint32_t num_tokens)
{
    static const char fn[] = "kvt_pd_sender_send";
    KVT_CHECK_NOT_NULL(s, fn);
    KVT_CHECK_ARG(num_tokens > 0, "%s: num_tokens is 0", fn);
    kvt_status st = check_src_pages(&s->ep, pages, num_pages, num_tokens, fn);
    if (st) return st;
    pthread_mutex_lock(&s->ep.mu);
    pd_room *r = pd_room_find(&s->ep, room);
    if (!r || !r->claimed)
        st = kvt__fail(KVT_ENOTFOUND, "%s: room %llu is not open (call kvt_pd_sender_room first)", fn,
                       (unsigned long long)room);
    else
        st = set_input(&s->ep, r, pages, num_pages, num_tokens, fn);
    pthread_mutex_unlock(&s->ep.mu);
    return st;
}

kvt_status kvt_pd_sender_poll(kvt_pd_sender *s, uint64_t room, kvt_pd_poll *out)
{
    KVT_CHECK_NOT_NULL(s, "kvt_pd_sender_poll");
    return pd_ep_poll(&s->ep, room, out, "kvt_pd_sender_poll");
}

kvt_status kvt_pd_sender_wait(kvt_pd_sender *s, uint64_t room, int64_t timeout_ms, kvt_pd_poll *out)
{
    KVT_CHECK_NOT_NULL(s, "kvt_pd_sender_wait");
    return pd_ep_wait(&s->ep, room, timeout_ms, out, "kvt_pd_sender_wait");
}

kvt_status kvt_pd_sender_abort(kvt_pd_sender *s, uint64_t room, const char *reason)
{
    KVT_CHECK_NOT_NULL(s, "kvt_pd_sender_abort");
    return pd_ep_abort(&s->ep, room, reason, "kvt_pd_sender_abort");
}

kvt_status kvt_pd_sender_clear(kvt_pd_sender *s, uint64_t room)
{
    KVT_CHECK_NOT_NULL(s, "kvt_pd_sender_clear");
    return pd_ep_clear(&s->ep, room, "kvt_pd_sender_clear");
}

void kvt_pd_sender_destroy(kvt_pd_sender *s)
{
    if (!s) return;
    if (s->renew_started) {
        pthread_mutex_lock(&s->renew_mu);
        s->renew_stop = true;
        pthread_cond_broadcast(&s->renew_cv);
        pthread_mutex_unlock(&s->renew_mu);
        pthread_join(s->renew_th, NULL);
    }
    /* Best effort, while this rank still holds its port (so the entry is
     * ours): decode ranks stop finding it now, not when its lease lapses.
     * Normally a few ms; bounded so a dead service holds destroy up to 1 s. */
    if (s->registered)
        (void)pd_bootstrap_unregister(&s->ep.net, &s->ep.auth, s->bs_host, s->bs_port, &s->ep.desc,
                                      s->ep.bind_host, s->ep.port, kvt__deadline_ns(1000),
                                      s->bs_token, NULL);
    pd_ep_stop(&s->ep);
    pd_ep_fini(&s->ep);
    pthread_mutex_destroy(&s->renew_mu);
    pthread_cond_destroy(&s->renew_cv);
    free(s);
}

pd_ep *pd_sender_ep(kvt_pd_sender *s) { return &s->ep; }
