/* group.h - rank group internals: the handshake, framed point-to-point
 * exchange with per-channel sequence numbers, the step exchange and the
 * group abort. Layering: net <- group <- connector. */
#ifndef KVT_GROUP_GROUP_H
#define KVT_GROUP_GROUP_H

#include <stdbool.h>
#include <stdint.h>
#include "group/frame.h"
#include "net/net.h"
#include "util/err.h"

/* Test hooks: pretend to be another build. Zero fields mean "the real one". */
typedef struct kvt_group_overrides {
    uint16_t proto_version;
    uint32_t lib_version;
} kvt_group_overrides;

struct kvt_group {
    kvt_net *net;
    kvt_group_params p;
    uint32_t rank, ranks, pp_rank, cp_rank, tp_rank;
    kvt_group_role role;
    uint16_t proto_version;
    uint32_t lib_version;
    uint64_t epoch;      /* the last epoch this rank formed (agreed in the handshake) */
    uint64_t attempt;    /* the last formation attempt id this rank used */
    uint64_t propose;    /* the epoch this rank proposes in the formation under way */
    uint64_t steps;      /* exchanges completed in this epoch */
    uint64_t step_no;    /* the engine's number of the step in progress */
    bool formed, aborted;
    uint64_t *tx_seq, *rx_seq; /* [peer * KVT_CH_COUNT + channel] */
    kvt_buf rx;                /* the last received message */
    kvt_buf tx;                /* a step payload behind its step number */
    kvt_buf *ups;              /* leader: each member's STEP_UP payload */
    kvt_buf *stash;            /* leader: a HELLO a member sent while the leader
                                  stepped (it re-forms, or is a replacement
                                  process), kept for the next formation */
    uint64_t *hello_att;       /* leader: the attempt id of the last HELLO taken
                                  from each member; a repeat of it (a duplicated
                                  frame) is dropped, never answered again */
    char diag[KVT_ERRMSG_MAX];
};

kvt_status kvt__group_create_ex(kvt_group **out, kvt_net *net, const kvt_group_params *p,
                                const kvt_group_overrides *ov);

/* Sends one frame to peer on ch by deadline_ns, with the next sequence
 * number of (peer, ch). */
kvt_status kvt__group_send(kvt_group *g, uint32_t peer, uint32_t ch, uint32_t op,
                           const void *payload, size_t len, uint64_t deadline_ns);
/* Receives the next frame from peer and checks it is (epoch, ch, next seq,
 * op, sender, receiver); frames of older epochs are dropped. An ABORT frame
 * aborts this rank with the sender's reason. Any other failure aborts the
 * group with a diagnostic (rank, channel, expected vs received seq and op).
 * On KVT_OK *f points into g->rx (valid until the next receive). */
kvt_status kvt__group_recv(kvt_group *g, uint32_t peer, uint32_t ch, uint32_t op,
                           uint64_t deadline_ns, kvt_frame *f);

/* Records the abort (first reason wins), tells the others (leader: every
 * member but `except`; member: the leader) and returns KVT_EABORTED. */
kvt_status kvt__group_abortf(kvt_group *g, uint32_t except, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* The step exchange (docs/protocol.md, "Step"), for the engine's step
 * number `step`, which every payload carries:
 *  - member: step_member() sends UP and receives the leader's DOWN (*down
 *    points into the group's buffer until the next call); the connector
 *    checks that it can apply it, acks (step_ack), then applies it. A
 *    member that cannot apply it aborts instead, and its ABORT takes the
 *    ACK's place on the link.
 *  - leader: gather() fills g->ups[r] for every member r and refuses a
 *    member whose step number differs from the leader's (naming the rank
 *    and both numbers); bcast() sends the one DOWN; commit() waits for
 *    every member's ACK. Only then does the leader apply the DOWN itself,
 *    so it never applies a decision a member did not accept.
 * Deadlines: the leader's gather T, its commit T; a member's wait 2T, so
 * the leader's precise diagnostic reaches members before they time out. */
kvt_status kvt__group_step_member(kvt_group *g, uint64_t step, const void *up, size_t up_len,
                                  const uint8_t **down, size_t *down_len);
kvt_status kvt__group_step_ack(kvt_group *g);
kvt_status kvt__group_gather(kvt_group *g, uint64_t step);
kvt_status kvt__group_bcast(kvt_group *g, const void *down, size_t len);
kvt_status kvt__group_commit(kvt_group *g);

/* The two-phase handshake (handshake.c; docs/protocol.md, "Formation"),
 * run by create and reform, bounded by budget_ms from t0_ns. `propose` is
 * the epoch this rank proposes (create: params.epoch or 1; reform: its last
 * formed epoch + 1); the leader agrees on the largest proposal and every
 * rank adopts it only once formed, so failed attempts change nothing. A
 * leader given pre_st != KVT_OK (e.g. a rank that did not reconnect) still
 * answers the members' HELLOs, with a REFUSE carrying pre_why, so every rank
 * fails naming that rank. */
kvt_status kvt__group_form(kvt_group *g, int64_t budget_ms, uint64_t t0_ns, uint64_t propose,
                           kvt_status pre_st, const char *pre_why);

static inline bool kvt__group_is_leader(const kvt_group *g) { return g->rank == 0; }

/* "rank 3 (pp1 cp0 tp1)" into buf. */
const char *kvt__rank_str(const kvt_group *g, uint32_t rank, char *buf, size_t cap);

#endif
