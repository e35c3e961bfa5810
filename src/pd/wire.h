/* wire.h - little-endian field helpers and the frame header shared by the
 * bootstrap service, the sender and the receiver. Every frame is a fixed
 * 48-byte header and a body of body_len bytes (checked against the
 * endpoint's max_frame before anything is allocated). DATA frames carry no
 * body; after the header come the payload, payload_len bytes (same bound),
 * then a trailer of a1 x u64 page checksums (a1 * 8 <= max_frame, checked
 * before anything is read or drained). With a secret, tags frame every
 * header and body, and DATA carries its tag instead of the trailer (mac.h).
 *
 * Room frames carry the room's generation (gen): the decode rank numbers
 * every opening of a room, the prefill rank echoes the number in all it
 * sends for it, and both sides drop frames of another generation. Engines
 * reuse room ids; without it a late DATA batch of a cleared request could
 * land in the pages of the next request with the same id. */
#ifndef KVT_PD_WIRE_H
#define KVT_PD_WIRE_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include "util/le.h"

/* "KPD" and the wire version ('2': room generations, checksums after the
 * payload; '3': with a secret, every frame tagged and DATA without XXH3
 * trailer; '4': those tags are AES-256-GMAC, pd/mac.h). Peers of other versions are told apart from garbage
 * so the message can say to upgrade both sides together (the handshake,
 * net/stream_auth.c, refuses them first, naming both versions). */
#define PD_MAGIC 0x3444504bu /* "KPD4" */
#define PD_WIRE_VERSION 4
#define PD_HDR_LEN 48

enum pd_frame_type {
    /* bootstrap service */
    PD_F_REG_PREFILL = 1, /* body: desc, u16 port, host[64]; registers or renews
                             a lease: OK a0 = lease in ms (the entry lapses that
                             long after its last REG_PREFILL; 0: never) */
    PD_F_LOOKUP = 2,      /* body: decode desc */
    PD_F_TOPO = 3,        /* body: u32 n, n x (desc, u16 port, host[64]) of live entries */
    PD_F_OK = 4,
    PD_F_REFUSE = 5,      /* status: kvt_status; body: message */
    PD_F_RETRY = 6,       /* lookup: not every prefill rank holds a live lease;
                             body: "2 of 4 prefill ranks registered; missing ..." */
    PD_F_UNREG_PREFILL = 7, /* body: as REG_PREFILL; removes the entry of that
                               tp/dcp rank if its address matches too: OK a0 =
                               entries removed (0 or 1) */
    /* sender <-> receiver */
    PD_F_REGISTER = 10,   /* body: decode desc, u32 max_frame; answered with OK
                             (body: u32 the sender's max_frame) or REFUSE */
    PD_F_ROOM = 11,       /* room, gen; a0 = expected, a1 = prefix; body: u32 ntok, u32 n, pages */
    PD_F_DATA = 12,       /* room, gen; a0 = first page, a1 = n pages; no body; payload
                           * (payload_len bytes), then n x u64 XXH3 (one per page):
                           * they trail the payload so each side hashes a chunk
                           * while it is in cache, as it goes out or lands */
    PD_F_DONE = 13,       /* room, gen; a0 = pages sent */
    PD_F_DONE_ACK = 14,   /* room, gen; status */
    PD_F_FAIL = 15,       /* room, gen; status; body: message */
    PD_F_ABORT = 16,      /* room, gen; body: reason */
    PD_F_ABORT_ACK = 17,  /* room, gen */
    PD_F_PING = 18
};

typedef struct pd_hdr {
    uint32_t magic;
    uint16_t type, flags;
    uint64_t room;
    uint32_t a0, a1;
    int32_t status;
    uint32_t body_len;
    uint64_t payload_len;
    uint32_t gen; /* room frames: the room's generation (see above) */
} pd_hdr;

/* The PD code's names for util/le.h's helpers. */
#define pd_put16 kvt__put16
#define pd_put32 kvt__put32
#define pd_put64 kvt__put64
#define pd_get16 kvt__get16
#define pd_get32 kvt__get32
#define pd_get64 kvt__get64

static inline void pd_hdr_encode(const pd_hdr *h, uint8_t *o)
{
    pd_put32(o, PD_MAGIC);
    pd_put16(o + 4, h->type);
    pd_put16(o + 6, h->flags);
    pd_put64(o + 8, h->room);
    pd_put32(o + 16, h->a0);
    pd_put32(o + 20, h->a1);
    pd_put32(o + 24, (uint32_t)h->status);
    pd_put32(o + 28, h->body_len);
    pd_put64(o + 32, h->payload_len);
    pd_put32(o + 40, h->gen);
    pd_put32(o + 44, 0); /* reserved */
}

/* 0 when the magic is wrong. */
static inline int pd_hdr_decode(pd_hdr *h, const uint8_t *p)
{
    h->magic = pd_get32(p);
    h->type = pd_get16(p + 4);
    h->flags = pd_get16(p + 6);
    h->room = pd_get64(p + 8);
    h->a0 = pd_get32(p + 16);
    h->a1 = pd_get32(p + 20);
    h->status = (int32_t)pd_get32(p + 24);
    h->body_len = pd_get32(p + 28);
    h->payload_len = pd_get64(p + 32);
    h->gen = pd_get32(p + 40);
    return h->magic == PD_MAGIC;
}

/* Why a header was refused, for messages: another version of this
 * protocol, or not this protocol at all. */
/* A frame magic of another PD wire version ("KPD" and a digit, not ours). */
static inline bool pd_magic_other_version(const uint8_t *p)
{
    return p[0] == 'K' && p[1] == 'P' && p[2] == 'D' && p[3] >= '0' && p[3] <= '9' &&
           p[3] != '0' + PD_WIRE_VERSION;
}

static inline const char *pd_magic_why(const uint8_t *p, char *buf, size_t n)
{
    if (pd_magic_other_version(p))
        snprintf(buf, n, "the peer speaks PD wire version %c, this library %d: upgrade prefill, decode and "
                 "bootstrap together", p[3], PD_WIRE_VERSION);
    else
        snprintf(buf, n, "bad frame magic (not a kvtier PD peer)");
    return buf;
}


#endif
