/* receiver.c - a decode rank. At create it looks the prefill topology up,
 * connects to the prefill ranks it needs (those that feed it, or whose
 * dummy it is) and registers. Rooms send their page table to each; DATA is
 * read straight into the engine's pages and every page's checksum checked;
 * the room is SUCCESS when every peer said DONE with all pages verified. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sodium.h>
#include "pd/bootstrap.h"
#include "pd/ep.h"
#include "util/clock.h"
#include "util/err.h"

#define REDIAL_MIN_MS 100  /* first retry after a link to a prefill rank died */
#define REDIAL_MAX_MS 2000 /* backoff cap: a restarted prefill rank is found within this */
#define REDIAL_TIMEOUT_MS 1000 /* one attempt's deadline (the service thread waits on it) */

struct kvt_pd_receiver {
    pd_ep ep;
    char bs_host[64];
    uint16_t bs_port;
    uint64_t redial_at[PD_MAX_CONNS]; /* next attempt per dead link (0: none due) */
    uint32_t redial_ms[PD_MAX_CONNS];
    pthread_t redial_th; /* its own thread: an attempt may block up to REDIAL_TIMEOUT_MS, */
    bool redial_started; /* which must not delay the service thread's room deadlines */
    atomic_bool redial_stop;
};

static pd_xfer room_xfer(pd_conn *c, pd_room *r)
{
    return (pd_xfer){&c->plan, r->prefix, r->ntok, r->dst_pages, r->n_dst, c->ep->map, PD_SIDE_DST};
}

/* A DATA frame's tag (authenticated links, mac.h), into c->tag. */
static kvt_status read_tag(pd_conn *c, uint64_t dl)
{
    kvt_status st = kvt__stream_recv(c->s, c->tag, sizeof c->tag, dl);
    if (st) return kvt__fail(st, "%s: DATA tag %s", c->name, st == KVT_ETIMEDOUT ? "timed out" : "lost");
    return KVT_OK;
}

static kvt_status data_tag_failed(pd_conn *c, const pd_hdr *h)
{
    return kvt__fail(KVT_EAUTH, "%s: authentication failed for DATA of room %llu, decode pages [%u, %u): %s",
                     c->name, (unsigned long long)h->room, h->a0, h->a0 + h->a1, PD_MAC_WHY);
}

/* The deadline of a landing's next read: the peer timeout from now, never
 * past the landing's bound hard. */
static uint64_t step_deadline(const pd_conn *c, uint64_t hard)
{
    uint64_t step = pd_conn_deadline(c);
    return step < hard ? step : hard;
}

/* A batch nobody wants (payload and trailer: n bytes): read in step, under
 * the bounds a landing has (a slow link that keeps moving is not dropped);
 * on an authenticated link its tag is still checked, so even a late batch
 * cannot be forged. */
static kvt_status drain(pd_conn *c, const pd_hdr *h, uint64_t n)
{
    static _Thread_local uint8_t sink[1 << 14]; /* write-only scratch, per link thread */
    uint64_t hard = pd_conn_land_deadline(c);
    pd_mac_dir *md = pd_conn_data_mac(c);
    while (n) {
        size_t k = n > sizeof sink ? sizeof sink : (size_t)n;
        kvt_status st = kvt__stream_recv(c->s, sink, k, step_deadline(c, hard));
        if (st) return kvt__fail(st, "%s: truncated payload", c->name);
        if (md) pd_mac_body(md, sink, k);
        n -= k;
    }
    c->last_rx = kvt__now_ns();
    if (!md) return KVT_OK;
    kvt_status st = read_tag(c, step_deadline(c, hard));
    if (!st && !pd_mac_end_ok(md, c->tag)) st = data_tag_failed(c, h);
    return st;
}

static void fail_corrupt(pd_conn *c, pd_room *r, uint32_t page)
{
    pd_ep *ep = c->ep;
    pthread_mutex_lock(&ep->mu);
    if (pd_room_fail(ep, r, KVT_ECORRUPT, "decode page %u from %s failed its checksum", page, c->name))
        pd_room_notify(ep, r, UINT32_MAX);
    pthread_mutex_unlock(&ep->mu);
}

/* A batch's pages hashed chunk by chunk (pd_xfer_chunk_end) as its bytes
 * land, in wire order. */
typedef struct land_hash {
    pd_conn *c;
    const pd_xfer *x;
    uint32_t j0, j1, e, ja; /* the next chunk starts at entry e, page ja */
    size_t hashed;          /* the batch's bytes hashed so far */
    kvt_status st;          /* a chunk the checksum thread could not take: hashing stopped */
} land_hash;

/* recvv_landed's callback: hashes (pd_conn_hash) every chunk wholly within
 * the first n bytes, while it is still in cache and the receives after it
 * are posted. */
static void hash_landed(void *arg, size_t n)
{
    land_hash *h = arg;
    while (!h->st && h->e < h->x->plan->num_slices) {
        if (h->ja == h->j1) {
            h->e++;
            h->ja = h->j0;
            continue;
        }
        uint32_t jb = pd_xfer_chunk_end(h->x, h->e, h->ja, h->j1, PD_CHUNK_BYTES);
        size_t len = 0;
        for (uint32_t j = h->ja; j < jb; j++) len += pd_xfer_entry_bytes(h->x, h->e, j);
        if (h->hashed + len > n) return;
        h->st = pd_conn_hash(h->c, h->x, h->e, h->ja, jb, h->j0);
        h->hashed += len;
        h->ja = jb;
    }
}

/* The batch's checksums, from the trailer that follows its payload. */
static kvt_status read_trailer(pd_conn *c, uint32_t np, uint64_t dl)
{
    if (np > c->sums_cap) { /* grown once to the largest batch (np <= max_frame / 8) */
        uint64_t *s = realloc(c->sums, np * sizeof *s);
        if (!s) return kvt__fail(KVT_ENOMEM, "pd receiver: out of memory");
        c->sums = s;
        c->sums_cap = np;
    }
    kvt_status st = kvt__stream_recv(c->s, c->sums, (size_t)np * 8, dl);
    if (st) return kvt__fail(st, "%s: checksums %s", c->name, st == KVT_ETIMEDOUT ? "timed out" : "lost");
    return KVT_OK;
}

/* Lands a DATA batch (payload, then checksum trailer: wire.h) into the
 * room's pages, hashing each chunk as it lands, then checks every page; a
 * mismatch fails the room ECORRUPT (never Success) and, the whole frame
 * having been read, the link stays in step. */
static kvt_status land(pd_conn *c, pd_room *r, const pd_hdr *h)
{
    pd_xfer x = room_xfer(c, r);
    uint32_t np = h->a1, j0 = h->a0;
    kvt_status st = pd_xfer_iov(&x, j0, j0 + np, &c->iov);
    if (st) return st;
    if (c->iov.bytes != h->payload_len)
        return kvt__fail(KVT_EPROTO, "%s: DATA of %llu bytes for pages that hold %llu", c->name,
                         (unsigned long long)h->payload_len, (unsigned long long)c->iov.bytes);
    pd_mac_dir *md = pd_conn_data_mac(c); /* then the tag covers the batch, not checksums (mac.h) */
    st = md ? KVT_OK : pd_hashes_begin(&c->hs, np);
    if (st) return st;
    land_hash lh = {c, &x, j0, j0 + np, 0, j0, 0, KVT_OK};
    /* payload and trailer within one landing bound (ep.h, PD_LAND_FACTOR),
     * failing sooner on a peer silent for its timeout */
    uint64_t hard = pd_conn_land_deadline(c);
    st = kvt__stream_recvv_landed(c->s, c->iov.v, (int)c->iov.n, hard,
                                  (uint64_t)c->ep->net.peer_timeout_ms * 1000000u, hash_landed, &lh);
    if (st) st = kvt__fail(st, "%s: payload %s", c->name, st == KVT_ETIMEDOUT ? "timed out" : "lost");
    else hash_landed(&lh, c->iov.bytes); /* every byte is in: no chunk stays unhashed, whatever the stream told */
    if (!st) /* while a checksum thread finishes the last chunks */
        st = md ? read_tag(c, step_deadline(c, hard)) : read_trailer(c, np, step_deadline(c, hard));
    uint32_t stall = atomic_load(&c->ep->stall_landing_ms);
    if (stall) nanosleep(&(struct timespec){stall / 1000, (long)(stall % 1000) * 1000000L}, NULL);
    /* every chunk hashed, failed or not: the room's pages may go back to the
     * engine once this returns */
    kvt_status hashed = pd_conn_hashed(c);
    if (!st) st = lh.st ? lh.st : hashed;
    if (st) return st;
    c->last_rx = kvt__now_ns();
    if (md && !pd_mac_end_ok(md, c->tag)) return data_tag_failed(c, h); /* the link dies: nothing it says is trusted */
    for (uint32_t i = 0; md == NULL && i < np; i++)
        if (pd_hashes_digest(&c->hs, i) != pd_get64((const uint8_t *)&c->sums[i])) {
            fail_corrupt(c, r, j0 + i);
            return KVT_OK;
        }
    pthread_mutex_lock(&c->ep->mu);
    r->next_page[c->idx] = j0 + np;
    r->bytes += h->payload_len;
    pthread_mutex_unlock(&c->ep->mu);
    return KVT_OK;
}

static kvt_status on_data(pd_conn *c, const pd_hdr *h)
{
    pd_ep *ep = c->ep;
    /* The checksum trailer (a1 x u64, wire.h) is bounded like a body before
     * a byte of the batch is read, drained or landed. */
    uint32_t max_pages = pd_batch_max_pages(c);
    if (h->a1 == 0 || h->a1 > max_pages || h->body_len != 0)
        return kvt__fail(KVT_EPROTO, "%s: DATA with %u pages (at most %u) and a %u-byte body", c->name,
                         h->a1, max_pages, h->body_len);
    pthread_mutex_lock(&ep->mu);
    pd_room *r = pd_room_find(ep, h->room);
    if (!r || r->gen != h->gen || pd_room_terminal(r)) {
        pthread_mutex_unlock(&ep->mu);
        /* a late batch of a finished or reopened room: payload and trailer
         * both, so the next frame header is read in step */
        return drain(c, h, h->payload_len + (c->mac ? 0 : 8ull * h->a1));
    }
    pd_xfer x = room_xfer(c, r);
    uint32_t first, end;
    pd_xfer_page_range(&x, &first, &end);
    if (h->a0 != r->next_page[c->idx] || (uint64_t)h->a0 + h->a1 > end) {
        pthread_mutex_unlock(&ep->mu);
        return kvt__fail(KVT_EPROTO, "%s: DATA pages [%u, %u) but expected page %u of [%u, %u)", c->name,
                         h->a0, h->a0 + h->a1, r->next_page[c->idx], first, end);
    }
    r->refs++;
    r->landing++;
    pd_room_advance(ep, r, KVT_PD_TRANSFERRING);
    pthread_mutex_unlock(&ep->mu);
    kvt_status st = land(c, r, h);
    if (st) {
        /* The link dies. Close the stream now: a receive the transport
         * still holds (UCX) must not write into these pages once the
         * landing count says they are the engine's again. */
        kvt__stream_destroy(c->s);
        c->s = NULL;
    }
    pthread_mutex_lock(&ep->mu);
    if (--r->landing == 0) pthread_cond_broadcast(&ep->cv); /* clear/abort/wait may be waiting */
    pd_room_unref(r);
    pthread_mutex_unlock(&ep->mu);
    return st;
}

static void on_done(pd_conn *c, const pd_hdr *h)
{
    pd_ep *ep = c->ep;
    kvt_status st = KVT_OK;
    const char *msg = NULL;
    pthread_mutex_lock(&ep->mu);
    pd_room *r = pd_room_find(ep, h->room);
    if (!r || r->gen != h->gen) {
        st = KVT_ENOTFOUND;
        msg = "room unknown on the decode rank (cleared or reopened)";
    } else if (pd_room_terminal(r)) {
        st = r->state == KVT_PD_SUCCESS ? KVT_OK : r->err;
        msg = r->msg;
    } else {
        pd_xfer x = room_xfer(c, r);
        uint32_t first, end;
        pd_xfer_page_range(&x, &first, &end);
        if (r->next_page[c->idx] != end || r->peer_done[c->idx]) {
            pd_room_fail(ep, r, KVT_EPROTO, "%s said DONE at page %u of [%u, %u)", c->name,
                         r->next_page[c->idx], first, end);
            pd_room_notify(ep, r, c->idx);
            st = KVT_EPROTO;
            msg = r->msg;
        } else {
            r->peer_done[c->idx] = 1;
            if (++r->ndone == ep->nconns) pd_room_advance(ep, r, KVT_PD_SUCCESS);
        }
    }
    pd_conn_queue_msg(c, PD_F_DONE_ACK, h->room, h->gen, st, msg);
    pthread_mutex_unlock(&ep->mu);
}

static void on_fail(pd_conn *c, const pd_hdr *h, bool abort)
{
    pd_ep *ep = c->ep;
    pthread_mutex_lock(&ep->mu);
    pd_room *r = pd_room_find(ep, h->room);
    kvt_status st = abort ? KVT_EABORTED : kvt__peer_failure(h->status);
    if (r && r->gen == h->gen && /* news of an earlier opening is not about this one */
        pd_room_fail(ep, r, st, "%s %s: %s", c->name, abort ? "aborted" : "failed", (char *)c->body))
        pd_room_notify(ep, r, c->idx);
    pthread_mutex_unlock(&ep->mu);
    if (abort) pd_conn_queue_msg(c, PD_F_ABORT_ACK, h->room, h->gen, KVT_OK, NULL);
}

static kvt_status receiver_frame(pd_conn *c, const pd_hdr *h)
{
    switch (h->type) {
    case PD_F_DATA: return on_data(c, h);
    case PD_F_DONE: on_done(c, h); return KVT_OK;
    case PD_F_FAIL: on_fail(c, h, false); return KVT_OK;
    case PD_F_ABORT: on_fail(c, h, true); return KVT_OK;
    case PD_F_ABORT_ACK: {
        pthread_mutex_lock(&c->ep->mu);
        pd_room *r = pd_room_find(c->ep, h->room);
        if (r && r->gen == h->gen) r->abort_acks++;
        pthread_mutex_unlock(&c->ep->mu);
        return KVT_OK;
    }
    case PD_F_PING: return KVT_OK;
    default: return kvt__fail(KVT_EPROTO, "%s: unexpected frame type %u", c->name, h->type);
    }
}

static uint32_t receiver_dead(pd_conn *c, kvt_status st, const char *why)
{
    pd_ep *ep = c->ep;
    uint32_t n = 0;
    for (uint32_t b = 0; b < PD_ROOM_BUCKETS; b++)
        for (pd_room *r = ep->buckets[b]; r; r = r->next)
            /* A prefill rank that said DONE with every page verified may
             * exit: its part of the room stays completed, and only rooms
             * still waiting on this link fail. */
            if (!(r->peer_done && r->peer_done[c->idx]) &&
                pd_room_fail(ep, r, st, "%s lost: %s", c->name, why)) {
                pd_room_notify(ep, r, c->idx);
                n++;
            }
    return n;
}

static void receiver_sent(pd_conn *c, const pd_frame *f)
{
    if (f->type != PD_F_ROOM) return;
    pd_ep *ep = c->ep;
    pthread_mutex_lock(&ep->mu);
    pd_room *r = pd_room_find(ep, f->room);
    if (r && r->gen == f->gen && ++r->sent_reqs == ep->nconns) pd_room_advance(ep, r, KVT_PD_WAITING_FOR_INPUT);
    pthread_mutex_unlock(&ep->mu);
}

static const pd_ep_hooks receiver_hooks = {receiver_frame, NULL, receiver_dead, receiver_sent};

/* ---- setup: lookup, connect, register ---- */

static kvt_status lookup_once(pd_ep *ep, const char *host, uint16_t port, uint64_t dl, uint8_t **t,
                              uint32_t *tlen)
{
    return pd_bootstrap_lookup(&ep->net, &ep->auth, host, port, &ep->desc, dl, t, tlen);
}

/* Asks until the service has every prefill rank this rank needs, or dl.
 * Once the service has answered RETRY, a later failure at the deadline (a
 * last attempt with no time left to finish its handshake) reports the
 * ranks still missing, not the attempt's own symptom. */
static kvt_status lookup(pd_ep *ep, const kvt_pd_params *p, uint64_t dl, uint8_t **t, uint32_t *tlen)
{
    char retry[KVT_ERRMSG_MAX] = "";
    for (;;) {
        kvt_status st = lookup_once(ep, p->bootstrap_host, p->bootstrap_port, dl, t, tlen);
        if (st == KVT_OK) return st;
        /* EAGAIN is never passed on: it is retried, then reported as ETIMEDOUT */
        if (st != KVT_EAGAIN && (!retry[0] || kvt__now_ns() < dl)) return st;
        if (st == KVT_EAGAIN) snprintf(retry, sizeof retry, "%s", kvt_last_error());
        if (kvt__now_ns() >= dl) /* the service's RETRY names the prefill ranks still missing */
            return kvt__fail(KVT_ETIMEDOUT, "pd receiver: the prefill topology was still incomplete at the deadline (%s)",
                             retry);
        struct timespec ts = {0, 20 * 1000000};
        nanosleep(&ts, NULL);
    }
}

/* REGISTER: our descriptor and max_frame; the OK carries the sender's, and
 * the link uses the smaller (the sender refuses a decode page above it). */
static kvt_status register_peer(pd_ep *ep, pd_conn *c, uint64_t dl)
{
    size_t n = pd_desc_wire_size(&ep->desc);
    uint8_t *body = malloc(n + 4), *ok = NULL;
    uint32_t oklen = 0;
    if (!body) return kvt__fail(KVT_ENOMEM, "pd receiver: out of memory");
    pd_desc_encode(&ep->desc, body);
    pd_put32(body + n, ep->net.max_frame);
    pd_hdr h = {.type = PD_F_REGISTER, .body_len = (uint32_t)n + 4};
    kvt_status st = pd_bootstrap_call_ex(c->s, c->mac, &h, body, &ep->net, dl, c->name, &ok, &oklen);
    free(body);
    /* RETRY is the bootstrap service's answer to lookups: a prefill rank
     * that sends it breaks the protocol (no "try again" comes of it) */
    if (st == KVT_EAGAIN) return pd_retry_refused(c->name, "the prefill rank");
    if (st != KVT_OK) return st;
    uint32_t peer_max = oklen == 4 ? pd_get32(ok) : 0;
    free(ok);
    if (peer_max < 4096)
        return kvt__fail(KVT_EPROTO, "%s: malformed registration answer (%u bytes, max_frame %u)", c->name, oklen,
                         peer_max);
    if (peer_max < c->max_frame) c->max_frame = peer_max;
    return KVT_OK;
}

/* A registered link to prefill rank t, not yet installed or started. */
static kvt_status dial_peer(pd_ep *ep, const pd_topo_entry *t, uint64_t dl, pd_conn **out)
{
    kvt_stream *s;
    pd_conn *c = NULL;
    kvt_stream_auth a = ep->auth;
    uint8_t key[PD_SESSION_KEY_LEN];
    a.who = "pd receiver -> sender";
    a.session_key = key;
    kvt_status st = kvt__stream_connect(t->host, t->port, &a, dl, &s);
    if (st) return st;
    if (ep->net.transport == KVT_PD_UCX) st = kvt__stream_ucx_upgrade(&s, 0, dl);
    if (!st) st = pd_conn_new(ep, s, &c);
    if (st) {
        kvt__stream_destroy(s);
        sodium_memzero(key, sizeof key);
        return st;
    }
    if (ep->secret) st = pd_mac_new(&c->mac, key, false);
    sodium_memzero(key, sizeof key);
    snprintf(c->name, sizeof c->name, "prefill tp%u/%u dcp%u/%u at %s:%u", t->desc.tp_rank,
             t->desc.tp_size, t->desc.dcp_rank, t->desc.dcp_size, t->host, (unsigned)t->port);
    if (!st) st = pd_desc_copy(&c->peer, &t->desc);
    if (!st) st = pd_plan_compute(&c->plan, &c->peer, &ep->desc);
    if (!st) st = pd_topo_expected(&c->peer, &ep->desc, &c->expected);
    if (!st) st = register_peer(ep, c, dl);
    if (st) pd_conn_free(c);
    else *out = c;
    return st;
}

/* Dials prefill rank t until dl: a sender that drops the connection
 * before the handshake is done (it evicts the oldest unregistered
 * connections when strangers crowd it, or is restarting) is tried again,
 * every 20 ms growing to 500 ms. A refusal (secret, plan) is final. */
static kvt_status connect_peer(pd_ep *ep, const pd_topo_entry *t, uint64_t dl)
{
    pd_conn *c;
    uint32_t wait_ms = 20;
    kvt_status st;
    while ((st = dial_peer(ep, t, dl, &c)) == KVT_ECONN && kvt__now_ns() + wait_ms * 1000000ull < dl) {
        struct timespec ts = {0, (long)wait_ms * 1000000};
        nanosleep(&ts, NULL);
        wait_ms = wait_ms * 2 > 500 ? 500 : wait_ms * 2;
    }
    if (st) return st;
    c->idx = ep->nconns;
    ep->conns[ep->nconns++] = c;
    return KVT_OK;
}

static kvt_status connect_all(pd_ep *ep, const kvt_pd_params *p, uint64_t dl)
{
    uint8_t *tb = NULL;
    uint32_t tlen = 0, n = 0;
    pd_topo_entry *t = NULL;
    kvt_status st = lookup(ep, p, dl, &tb, &tlen);
    if (!st) st = pd_topo_decode(tb, tlen, &t, &n);
    free(tb);
    for (uint32_t i = 0; !st && i < n; i++) st = pd_topo_check(&t[i].desc, &ep->desc);
    for (uint32_t i = 0; !st && i < n; i++) {
        bool talk;
        st = pd_topo_talks(&t[i].desc, &ep->desc, &talk);
        if (!st && talk && ep->nconns == PD_MAX_CONNS)
            st = kvt__fail(KVT_EFULL, "pd receiver: more than %u prefill peers", PD_MAX_CONNS);
        if (!st && talk) st = connect_peer(ep, &t[i], dl);
    }
    if (!st && ep->nconns == 0) st = kvt__fail(KVT_EGEOMETRY, "pd receiver: no prefill rank feeds this rank");
    pd_topo_free(t, n);
    return st;
}

/* ---- reconnecting: a prefill rank that restarts (anywhere the bootstrap
 * service says) is found again; the link's rooms failed when it died ---- */

/* Looks prefill rank (tp_rank, dcp_rank) of the dead link i up again and
 * dials it; installs and starts the new link on success. */
static kvt_status redial(kvt_pd_receiver *rc, uint32_t i)
{
    pd_ep *ep = &rc->ep;
    pd_conn *old = ep->conns[i], *c = NULL; /* only this thread replaces links */
    uint64_t dl = kvt__deadline_ns(REDIAL_TIMEOUT_MS);
    uint8_t *tb = NULL;
    uint32_t tlen = 0, n = 0;
    pd_topo_entry *t = NULL, *mine = NULL;
    kvt_status st = lookup_once(ep, rc->bs_host, rc->bs_port, dl, &tb, &tlen);
    if (!st) st = pd_topo_decode(tb, tlen, &t, &n);
    free(tb);
    for (uint32_t k = 0; !st && k < n; k++)
        if (t[k].desc.tp_rank == old->peer.tp_rank && t[k].desc.dcp_rank == old->peer.dcp_rank) mine = &t[k];
    if (!st && !mine) st = kvt__fail(KVT_ENOTFOUND, "%s is not registered with the bootstrap service", old->name);
    if (!st) st = pd_topo_check(&mine->desc, &ep->desc);
    if (!st) st = dial_peer(ep, mine, dl, &c);
    pd_topo_free(t, n);
    if (st) return st;
    pthread_mutex_lock(&ep->mu);
    c->idx = i;
    ep->conns[i] = c;
    pthread_mutex_unlock(&ep->mu);
    if (pd_conn_start(c, pd_conn_main) != KVT_OK) {
        atomic_store(&c->dead, true);
        atomic_store(&c->finished, true); /* tried again at the next backoff */
    }
    pd_conn_free(old); /* its thread has finished */
    return KVT_OK;
}

/* One pass over the links: dead ones are redialled with exponential backoff. */
static void redial_pass(kvt_pd_receiver *rc)
{
    pd_ep *ep = &rc->ep;
    for (uint32_t i = 0; i < ep->nconns && !atomic_load(&rc->redial_stop); i++) {
        uint64_t now = kvt__now_ns();
        if (!atomic_load(&ep->conns[i]->finished)) {
            rc->redial_at[i] = 0;
            continue;
        }
        if (!rc->redial_at[i]) {
            rc->redial_ms[i] = REDIAL_MIN_MS;
            rc->redial_at[i] = now + REDIAL_MIN_MS * 1000000ull;
            continue;
        }
        if (now < rc->redial_at[i]) continue;
        char name[sizeof ep->conns[i]->name];
        snprintf(name, sizeof name, "%s", ep->conns[i]->name);
        if (redial(rc, i) == KVT_OK) {
            pd_log("pd receiver: reconnected to %s", name);
            rc->redial_at[i] = 0;
            continue;
        }
        if (rc->redial_ms[i] == REDIAL_MIN_MS) /* the first failure only: no log flood */
            pd_log("pd receiver: cannot reconnect to %s yet (retrying every <= %u ms): %s", name,
                   REDIAL_MAX_MS, kvt_last_error());
        rc->redial_ms[i] = rc->redial_ms[i] * 2 > REDIAL_MAX_MS ? REDIAL_MAX_MS : rc->redial_ms[i] * 2;
        rc->redial_at[i] = kvt__now_ns() + rc->redial_ms[i] * 1000000ull;
    }
}

static void *redial_main(void *arg)
{
    kvt_pd_receiver *rc = arg;
    while (!atomic_load(&rc->redial_stop)) {
        struct timespec ts = {0, 10 * 1000000};
        nanosleep(&ts, NULL);
        redial_pass(rc);
    }
    return NULL;
}

kvt_status kvt_pd_receiver_create(kvt_pd_receiver **out, const kvt_pd_params *p)
{
    static const char fn[] = "kvt_pd_receiver_create";
    KVT_CHECK_NOT_NULL(out, fn);
    kvt_pd_receiver *r = calloc(1, sizeof *r);
    if (!r) return kvt__fail(KVT_ENOMEM, "%s: out of memory", fn);
    r->ep.hooks = &receiver_hooks;
    kvt_status st = pd_ep_init(&r->ep, p, PD_ROLE_DECODE, fn);
    uint64_t dl = kvt__deadline_ns(p && p->connect_timeout_ms ? p->connect_timeout_ms : 10000);
    if (!st) {
        snprintf(r->bs_host, sizeof r->bs_host, "%s", p->bootstrap_host ? p->bootstrap_host : "127.0.0.1");
        r->bs_port = p->bootstrap_port;
        st = connect_all(&r->ep, p, dl);
    }
    for (uint32_t i = 0; !st && i < r->ep.nconns; i++) st = pd_conn_start(r->ep.conns[i], pd_conn_main);
    if (!st) st = pd_ep_start_service_tick(&r->ep, NULL);
    if (!st && pthread_create(&r->redial_th, NULL, redial_main, r) != 0)
        st = kvt__fail(KVT_ESYS, "%s: cannot start a thread", fn);
    else if (!st)
        r->redial_started = true;
    if (st) {
        char msg[KVT_ERRMSG_MAX];
        snprintf(msg, sizeof msg, "%s", kvt_last_error());
        kvt_pd_receiver_destroy(r);
        /* Name the function the user called unless the message does. */
        if (strncmp(msg, fn, sizeof fn - 1) == 0) return kvt__fail(st, "%s", msg);
        return kvt__fail(st, "%s: %s", fn, msg);
    }
    *out = r;
    kvt__clear_error();
    return KVT_OK;
}

static kvt_status room_arrays(pd_room *r, const kvt_pd_room_params *p, uint32_t npeers, const char *fn)
{
    r->dst_pages = malloc((size_t)p->num_pages * 4 + 4);
    r->next_page = calloc(npeers, sizeof *r->next_page);
    r->peer_done = calloc(npeers, 1);
    if (!r->dst_pages || !r->next_page || !r->peer_done) return kvt__fail(KVT_ENOMEM, "%s: out of memory", fn);
    if (p->num_pages) memcpy(r->dst_pages, p->pages, (size_t)p->num_pages * 4);
    r->n_dst = p->num_pages;
    r->ntok = p->num_tokens;
    r->prefix = p->prefix_tokens;
    return KVT_OK;
}

/* Queues the page table to every peer (ep->mu held). */
static kvt_status open_room(pd_ep *ep, pd_room *r, const kvt_pd_room_params *p)
{
    size_t blen = 8 + (size_t)p->num_pages * 4;
    uint8_t *body = malloc(blen);
    if (!body) return kvt__fail(KVT_ENOMEM, "kvt_pd_receiver_room: out of memory");
    pd_put32(body, p->num_tokens);
    pd_put32(body + 4, p->num_pages);
    for (uint32_t i = 0; i < p->num_pages; i++) pd_put32(body + 8 + 4 * (size_t)i, p->pages[i]);
    int down = -1;
    for (uint32_t i = 0; i < ep->nconns; i++) {
        pd_conn *c = ep->conns[i];
        pd_xfer x = {&c->plan, r->prefix, r->ntok, r->dst_pages, r->n_dst, ep->map, PD_SIDE_DST};
        uint32_t end;
        pd_xfer_page_range(&x, &r->next_page[i], &end);
        pd_hdr h = {.type = PD_F_ROOM, .room = r->id, .a0 = c->expected, .a1 = p->prefix_tokens, .gen = r->gen};
        if (atomic_load(&c->dead)) down = (int)i;
        else pd_conn_queue(c, &h, body, blen);
    }
    /* after every ROOM frame: a peer hears FAIL only about a room it knows */
    if (down >= 0 && pd_room_fail(ep, r, KVT_ECONN, "%s is down (reconnecting)", ep->conns[down]->name))
        pd_room_notify(ep, r, UINT32_MAX);
    free(body);
    return KVT_OK;
}

/* The page table against every link's max_frame and the plan (ep->mu
 * held: a reconnect may replace a link and its plan). */
static kvt_status check_room(pd_ep *ep, const kvt_pd_room_params *p, const char *fn)
{
    uint32_t max_frame = ep->net.max_frame;
    for (uint32_t i = 0; i < ep->nconns; i++)
        if (ep->conns[i]->max_frame < max_frame) max_frame = ep->conns[i]->max_frame;
    KVT_CHECK_ARG((uint64_t)p->num_pages * 4 + 8 <= max_frame,
                  "%s: a page table of %u pages exceeds max_frame %u (the smaller of both sides')", fn,
                  p->num_pages, max_frame);
    return pd_xfer_check_pages(&ep->conns[0]->plan, PD_SIDE_DST, p->num_tokens, p->pages, p->num_pages,
                               ep->desc.tokens_per_page, ep->engine_pages, fn);
}

kvt_status kvt_pd_receiver_room(kvt_pd_receiver *rc, uint64_t room, const kvt_pd_room_params *p)
{
    static const char fn[] = "kvt_pd_receiver_room";
    KVT_CHECK_NOT_NULL_AS(rc, "r", fn);
    KVT_CHECK_NOT_NULL_AS(p, "params", fn);
    KVT_CHECK_ARG(p->num_tokens > 0 && p->prefix_tokens < p->num_tokens,
                  "%s: prefix_tokens %u must be below num_tokens %u (> 0)", fn, p->prefix_tokens, p->num_tokens);
    pd_ep *ep = &rc->ep;
    pthread_mutex_lock(&ep->mu);
    kvt_status st = check_room(ep, p, fn);
    pd_room *r = st ? NULL : pd_room_find(ep, room);
    if (r) st = kvt__fail(KVT_EBUSY, "%s: room %llu is already open; clear it first", fn, (unsigned long long)room);
    if (!st && (st = pd_room_add(ep, room, &r))) kvt__wrap_error(st, fn); /* EFULL, ENOMEM: name the call */
    if (!st) {
        r->claimed = true;
        if (++ep->next_gen == 0) ep->next_gen = 1; /* 0 is no opening */
        r->gen = ep->next_gen;
        st = room_arrays(r, p, ep->nconns, fn);
        if (!st) st = open_room(ep, r, p);
        if (st) pd_room_remove(ep, r);
    }
    pthread_mutex_unlock(&ep->mu);
    return st;
}

kvt_status kvt_pd_receiver_poll(kvt_pd_receiver *r, uint64_t room, kvt_pd_poll *out)
{
    KVT_CHECK_NOT_NULL(r, "kvt_pd_receiver_poll");
    return pd_ep_poll(&r->ep, room, out, "kvt_pd_receiver_poll");
}

kvt_status kvt_pd_receiver_wait(kvt_pd_receiver *r, uint64_t room, int64_t timeout_ms, kvt_pd_poll *out)
{
    KVT_CHECK_NOT_NULL(r, "kvt_pd_receiver_wait");
    return pd_ep_wait(&r->ep, room, timeout_ms, out, "kvt_pd_receiver_wait");
}

kvt_status kvt_pd_receiver_abort(kvt_pd_receiver *r, uint64_t room, const char *reason)
{
    KVT_CHECK_NOT_NULL(r, "kvt_pd_receiver_abort");
    return pd_ep_abort(&r->ep, room, reason, "kvt_pd_receiver_abort");
}

kvt_status kvt_pd_receiver_clear(kvt_pd_receiver *r, uint64_t room)
{
    KVT_CHECK_NOT_NULL(r, "kvt_pd_receiver_clear");
    return pd_ep_clear(&r->ep, room, "kvt_pd_receiver_clear");
}

void kvt_pd_receiver_destroy(kvt_pd_receiver *r)
{
    if (!r) return;
    atomic_store(&r->redial_stop, true); /* first: it installs links pd_ep_stop joins */
    if (r->redial_started) pthread_join(r->redial_th, NULL);
    pd_ep_stop(&r->ep);
    pd_ep_fini(&r->ep);
    free(r);
}

pd_ep *pd_receiver_ep(kvt_pd_receiver *r) { return &r->ep; }

kvt_status kvt_pd_room_info_get(kvt_pd_sender *s, kvt_pd_receiver *r, uint64_t room, kvt_pd_room_info *out)
{
    static const char fn[] = "kvt_pd_room_info_get";
    KVT_CHECK_ARG((s != NULL) != (r != NULL), "%s: pass exactly one of sender and receiver", fn);
    return pd_ep_info(s ? pd_sender_ep(s) : &r->ep, room, out, fn);
}
