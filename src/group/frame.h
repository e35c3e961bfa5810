/* frame.h - the group's wire format (docs/protocol.md). Every message is a
 * 48-byte little-endian header and a payload:
 *   0 magic "KVTG"  4 version u16  6 op u16  8 epoch u64  16 seq u64
 *   24 channel u32  28 sender u32  32 receiver u32  36 len u32
 *   40 checksum u64 = XXH3-64 of the payload seeded with XXH3-64 of bytes 0..39
 * The layout of bytes 0..7 never changes between protocol versions, so a
 * rank can always tell "another version" from "garbage". */
#ifndef KVT_GROUP_FRAME_H
#define KVT_GROUP_FRAME_H

#include <stddef.h>
#include <stdint.h>
#include "kvtier.h"
#include "util/le.h"

#define KVT_FRAME_MAGIC 0x4754564bu /* "KVTG" */
/* 2: STEP_UP / STEP_DOWN carry the engine's step number, STEP_ACK commits.
 * 3: two-phase formation (JOIN, FORMED, GIVEUP; attempt ids), leader-agreed
 *    epochs. */
#define KVT_PROTO_VERSION 3
#define KVT_FRAME_HDR 48

typedef enum kvt_channel {
    KVT_CH_HANDSHAKE = 1,
    KVT_CH_STEP = 2,
    KVT_CH_CONTROL = 3,
    KVT_CH_COUNT = 4 /* channels are 1..KVT_CH_COUNT-1 */
} kvt_channel;

typedef enum kvt_op {
    KVT_OP_HELLO = 1,     /* member -> leader, handshake */
    KVT_OP_WELCOME = 2,   /* leader -> member: the group formed */
    KVT_OP_REFUSE = 3,    /* leader -> member: it did not; payload: status, text */
    KVT_OP_STEP_UP = 4,   /* member -> leader: what the member queued this step */
    KVT_OP_STEP_DOWN = 5, /* leader -> member: the decisions of this step */
    KVT_OP_ABORT = 6,     /* either way, any time: payload: origin rank, text */
    KVT_OP_STEP_ACK = 7,  /* member -> leader: it applied this step's DOWN */
    KVT_OP_JOIN = 8,      /* member -> leader: it accepts the WELCOME (formation's phase 1) */
    KVT_OP_FORMED = 9,    /* leader -> member: every member joined: the group formed */
    KVT_OP_GIVEUP = 10,   /* member -> leader: it abandoned this formation attempt */
    KVT_OP_MAX = 11
} kvt_op;

typedef struct kvt_frame {
    uint16_t version, op;
    uint64_t epoch, seq;
    uint32_t channel, sender, receiver, len;
    uint64_t checksum;
    const uint8_t *payload; /* points into the decoded buffer */
} kvt_frame;

/* Writes the header for payload (len bytes) into hdr, checksum included. */
void kvt__frame_encode(uint8_t hdr[KVT_FRAME_HDR], const kvt_frame *f, const void *payload);
/* Parses and checks a received message: size, magic, length, op, channel,
 * checksum (KVT_EPROTO or KVT_ECORRUPT with a message). A version other than
 * `version` gives KVT_EVERSION with *out filled (so the sender is known).
 * Sender, receiver, epoch and sequence are the caller's to check. */
kvt_status kvt__frame_decode(const uint8_t *buf, size_t len, uint16_t version, kvt_frame *out);

const char *kvt__op_name(uint32_t op);
const char *kvt__channel_name(uint32_t ch);

/* Every STEP_UP, STEP_DOWN and STEP_ACK payload starts with the engine's
 * step number (u64), then the connector's bytes. */
#define KVT_STEP_HEAD 8

/* The handshake's HELLO payload. */
typedef struct kvt_hello {
    uint32_t lib_version;
    uint32_t pp, cp, tp;
    uint32_t rank, pp_rank, cp_rank, tp_rank, role;
    uint64_t geometry_digest, config_digest, epoch; /* epoch: the one it proposes */
    uint64_t attempt; /* the member's formation attempt, echoed by every answer */
} kvt_hello;

#define KVT_HELLO_LEN 72
void kvt__hello_encode(uint8_t out[KVT_HELLO_LEN], const kvt_hello *h);
kvt_status kvt__hello_decode(const uint8_t *p, size_t len, kvt_hello *out);

/* REFUSE and ABORT payloads: a u32 (status or origin rank) and text. The
 * text is copied NUL-terminated into text (cap bytes), truncated if needed. */
#define KVT_NOTE_TEXT_MAX 400
size_t kvt__note_encode(uint8_t *out, size_t cap, uint32_t word, const char *text);
kvt_status kvt__note_decode(const uint8_t *p, size_t len, uint32_t *word, char *text,
                            size_t cap);

#endif
