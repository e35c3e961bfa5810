/* conn.c - one thread per link does all of that link's I/O: control frames
 * queued by other threads, the sender's data batches, reading frames, the
 * heartbeat, and the liveness check (a peer silent for peer_timeout_ms is
 * dead and its rooms fail). Also the endpoint's service thread: accepting
 * (senders) and room deadlines (both). */
#include "pd/ep.h"
#include "pd/hasher.h"

#include <fcntl.h>
#include <stdio.h>
#include <sys/socket.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "util/clock.h"
#include "util/err.h"

kvt_status pd_conn_new(pd_ep *ep, kvt_stream *s, pd_conn **out)
{
    pd_conn *c = calloc(1, sizeof *c);
    if (!c) return kvt__fail(KVT_ENOMEM, "pd: out of memory for a connection");
    if (pipe2(c->wake, O_NONBLOCK | O_CLOEXEC) != 0) {
        free(c);
        return kvt__fail(KVT_ESYS, "pd: pipe2 failed");
    }
    c->ep = ep;
    c->s = s;
    c->max_frame = ep->net.max_frame; /* until the handshake says the peer's */
    pthread_mutex_init(&c->qmu, NULL);
    c->last_rx = c->last_tx = kvt__now_ns();
    *out = c;
    return KVT_OK;
}

void pd_conn_free(pd_conn *c)
{
    if (!c) return;
    if (c->started) pthread_join(c->th, NULL);
    pd_hasher_stop(c->hasher);
    kvt__stream_destroy(c->s);
    pd_mac_free(c->mac);
    close(c->wake[0]);
    close(c->wake[1]);
    for (pd_frame *f = c->qhead; f;) {
        pd_frame *n = f->next;
        free(f);
        f = n;
    }
    for (pd_job *j = c->jobs; j;) {
        pd_job *n = j->next;
        pd_room_unref(j->room);
        free(j);
        j = n;
    }
    pd_desc_free(&c->peer);
    pd_plan_free(&c->plan);
    pd_iovs_free(&c->iov);
    pd_hashes_free(&c->hs);
    free(c->sums);
    free(c->body);
    pthread_mutex_destroy(&c->qmu);
    free(c);
}

kvt_status pd_conn_start(pd_conn *c, void *(*fn)(void *))
{
    if (pthread_create(&c->th, NULL, fn, c) != 0)
        return kvt__fail(KVT_ESYS, "pd: cannot start a connection thread");
    c->started = true;
    return KVT_OK;
}

uint64_t pd_conn_deadline(const pd_conn *c)
{
    return kvt__deadline_ns(c->ep->net.peer_timeout_ms);
}

uint64_t pd_conn_land_deadline(const pd_conn *c)
{
    return kvt__deadline_ns((int64_t)c->ep->net.peer_timeout_ms * (PD_LAND_FACTOR - 2));
}

pd_mac_dir *pd_conn_data_mac(pd_conn *c)
{
    if (!c->mac) return NULL;
    return c->ep->role == PD_ROLE_PREFILL ? &c->mac->tx : &c->mac->rx;
}

static void mac_piece(void *arg, const uint8_t *p, size_t n)
{
    pd_mac_body(arg, p, n);
}

/* On an authenticated link a chunk goes into the frame's tag instead of
 * the page checksums (mac.h: the tag covers every byte). */
kvt_status pd_conn_hash(pd_conn *c, const pd_xfer *x, uint32_t e, uint32_t ja, uint32_t jb,
                        uint32_t base)
{
    pd_mac_dir *md = pd_conn_data_mac(c);
    if (c->ep->hash_thread && !c->hasher && !c->hasher_failed) {
        /* once per link; a link that cannot have one hashes here */
        c->hasher_failed = pd_hasher_start(&c->hasher, &c->hs, c->name) != KVT_OK;
        if (c->hasher_failed) pd_log("%s: %s; checksums stay on the link's thread", c->name, kvt_last_error());
    }
    if (!c->hasher) {
        if (md) pd_xfer_walk_entry(x, e, ja, jb, mac_piece, md);
        else pd_xfer_hash_entry(x, e, ja, jb, base, &c->hs);
        return KVT_OK;
    }
    pd_hash_chunk k = {*x, e, ja, jb, base, md ? mac_piece : NULL, md};
    return pd_hasher_submit(c->hasher, &k, pd_conn_deadline(c));
}

kvt_status pd_conn_hashed(pd_conn *c)
{
    return c->hasher ? pd_hasher_drain(c->hasher, pd_conn_deadline(c)) : KVT_OK;
}

void pd_conn_queue(pd_conn *c, const pd_hdr *h, const void *body, size_t blen)
{
    pd_frame *f = malloc(sizeof *f + PD_HDR_LEN + blen);
    if (!f) return; /* the room's deadline still bounds it */
    pd_hdr hh = *h;
    hh.body_len = (uint32_t)blen;
    pd_hdr_encode(&hh, f->data);
    if (blen) memcpy(f->data + PD_HDR_LEN, body, blen);
    f->len = PD_HDR_LEN + blen;
    f->type = h->type;
    f->room = h->room;
    f->gen = h->gen;
    f->next = NULL;
    pthread_mutex_lock(&c->qmu);
    if (c->qtail) c->qtail->next = f;
    else c->qhead = f;
    c->qtail = f;
    c->qlen++;
    pthread_mutex_unlock(&c->qmu);
    char b = 1;
    ssize_t w = write(c->wake[1], &b, 1); /* full pipe: a wakeup is already pending */
    (void)w;
}

void pd_conn_queue_msg(pd_conn *c, uint16_t type, uint64_t room, uint32_t gen, kvt_status st,
                       const char *msg)
{
    pd_hdr h = {.type = type, .room = room, .status = st, .gen = gen};
    pd_conn_queue(c, &h, msg, msg ? strlen(msg) : 0);
}

kvt_status pd_conn_send(pd_conn *c, const pd_hdr *h, const void *body, size_t blen)
{
    uint8_t hb[PD_HDR_LEN];
    pd_hdr hh = *h;
    hh.body_len = (uint32_t)blen;
    pd_hdr_encode(&hh, hb);
    kvt_status st = pd_mac_send(c->mac, c->s, hb, body, blen, pd_conn_deadline(c), false);
    if (!st) c->last_tx = kvt__now_ns();
    return st;
}

static kvt_status reserve_body(pd_conn *c, size_t n)
{
    if (n <= c->body_cap) return KVT_OK;
    uint8_t *b = realloc(c->body, n);
    if (!b) return kvt__fail(KVT_ENOMEM, "pd: out of memory for a %zu-byte frame", n);
    c->body = b;
    c->body_cap = n;
    return KVT_OK;
}

kvt_status pd_conn_read(pd_conn *c, pd_hdr *h, uint64_t dl)
{
    uint8_t hb[PD_HDR_LEN];
    kvt_status st = pd_mac_recv_head(c->mac, c->s, hb, dl);
    if (st == KVT_EAUTH) return kvt__wrap_error(st, c->name);
    if (st) return kvt__fail(st, "%s: %s reading a frame header", c->name,
                             st == KVT_ETIMEDOUT ? "timed out" : "link lost");
    char why[160];
    /* another wire version is a version refusal (EVERSION), as the bootstrap
     * calls and rank groups say; anything else is no PD frame */
    if (!pd_hdr_decode(h, hb))
        return kvt__fail(pd_magic_other_version(hb) ? KVT_EVERSION : KVT_EPROTO, "%s: %s", c->name,
                         pd_magic_why(hb, why, sizeof why));
    if (h->body_len > c->ep->net.max_frame || h->payload_len > c->ep->net.max_frame)
        return kvt__fail(KVT_EPROTO, "%s: frame of %u + %llu bytes exceeds max_frame %u", c->name,
                         h->body_len, (unsigned long long)h->payload_len, c->ep->net.max_frame);
    if (c->mac && h->type == PD_F_DATA && h->body_len) /* its one tag follows the payload */
        return kvt__fail(KVT_EPROTO, "%s: DATA with a %u-byte body", c->name, h->body_len);
    st = reserve_body(c, (size_t)h->body_len + 1);
    if (!st) st = pd_mac_recv_body(c->mac, c->s, c->body, h->body_len, dl);
    if (st == KVT_EAUTH) return kvt__wrap_error(st, c->name);
    if (st) return kvt__fail(st, "%s: truncated frame body", c->name);
    c->body[h->body_len] = 0; /* messages in bodies are read as strings */
    c->last_rx = kvt__now_ns();
    return KVT_OK;
}

pd_frame *pd_conn_pop_frame(pd_conn *c)
{
    pthread_mutex_lock(&c->qmu);
    pd_frame *f = c->qhead;
    if (f) {
        c->qhead = f->next;
        if (!c->qhead) c->qtail = NULL;
        c->qlen--;
    }
    pthread_mutex_unlock(&c->qmu);
    return f;
}

static kvt_status flush_queue(pd_conn *c)
{
    for (;;) {
        pd_frame *f = pd_conn_pop_frame(c);
        if (!f) return KVT_OK;
        kvt_status st = pd_mac_send(c->mac, c->s, f->data, f->data + PD_HDR_LEN, f->len - PD_HDR_LEN,
                                    pd_conn_deadline(c), false);
        if (!st) {
            c->last_tx = kvt__now_ns();
            if (c->ep->hooks->sent) c->ep->hooks->sent(c, f);
        }
        free(f);
        if (st) return kvt__fail(st, "%s: peer not reading (send %s)", c->name,
                                 st == KVT_ETIMEDOUT ? "timed out" : "failed");
    }
}

static void drain_wake(pd_conn *c)
{
    char b[64];
    while (read(c->wake[0], b, sizeof b) > 0) {
    }
}

static kvt_status housekeeping(pd_conn *c)
{
    uint64_t now = kvt__now_ns();
    const kvt_pd_net_params *n = &c->ep->net;
    if (now - c->last_rx > (uint64_t)n->peer_timeout_ms * 1000000ull)
        return kvt__fail(KVT_ECONN, "%s: silent for %u ms", c->name, n->peer_timeout_ms);
    if (now - c->last_tx >= (uint64_t)n->heartbeat_ms * 1000000ull) {
        pd_hdr h = {.type = PD_F_PING};
        return pd_conn_send(c, &h, NULL, 0);
    }
    return KVT_OK;
}

static kvt_status step(pd_conn *c)
{
    pd_ep *ep = c->ep;
    kvt_status st = flush_queue(c);
    bool busy = false;
    if (!st && ep->hooks->work) st = ep->hooks->work(c, &busy);
    if (st) return st;
    int w = c->s->ops->wait(c->s, c->wake[0], busy ? 0 : (int)ep->net.heartbeat_ms);
    if (w == KVT_STREAM_HUP) return kvt__fail(KVT_ECONN, "%s: link closed", c->name);
    if (w == KVT_STREAM_WOKEN) drain_wake(c);
    if (w == KVT_STREAM_READABLE) {
        pd_hdr h;
        st = pd_conn_read(c, &h, pd_conn_deadline(c));
        if (!st) st = ep->hooks->frame(c, &h);
        if (st) return st;
    }
    return housekeeping(c);
}

void *pd_conn_main(void *arg)
{
    pd_conn *c = arg;
    pd_ep *ep = c->ep;
    kvt_status st = KVT_OK;
    while (!atomic_load(&ep->stop) && !st) st = step(c);
    /* Stopping: frames already queued (a DONE_ACK behind a Success the
     * engine saw) still go out, boundedly, before the socket closes;
     * otherwise the peer would fail a room this side reported done. */
    if (!st) (void)flush_queue(c);
    if (!st && c->s->ops->farewell) c->s->ops->farewell(c->s, kvt__deadline_ns(500));
    atomic_store(&c->dead, true);
    if (c->s) shutdown(c->s->fd, SHUT_RDWR); /* the peer learns at once, not after its timeout */
    if (st && !atomic_load(&ep->stop)) {
        char why[KVT_ERRMSG_MAX];
        snprintf(why, sizeof why, "%s", kvt_last_error());
        pthread_mutex_lock(&ep->mu);
        uint32_t failed = ep->hooks->dead(c, st, why);
        pthread_mutex_unlock(&ep->mu);
        /* A peer that finished and went away is routine; say so plainly. */
        if (failed) pd_log("pd: link %s dropped, %u room(s) failed: %s", c->name, failed, why);
        else if (st == KVT_ECONN) pd_log("pd: link %s closed by the peer (no room in flight)", c->name);
        else pd_log("pd: link %s dropped (no room in flight): %s", c->name, why);
    }
    atomic_store(&c->finished, true);
    return NULL;
}
