/* desc.h - KV descriptors and transfer plans (pure functions, no I/O).
 *
 * A descriptor lists every (layer, component) "entry" of one rank with what
 * a peer needs to convert: bytes per token, heads and head offset held by
 * this rank, element size, whether the entry is replicated across TP (MLA),
 * how many consecutive TP ranks hold the same heads (GQA with fewer KV heads
 * than TP), plus the rank's page size, layout, TP and DCP position. A plan is
 * computed from a (prefill, decode) pair of descriptors and says, per entry,
 * which byte slice of a prefill token goes where in a decode token, and how
 * global tokens map to the decode rank's local tokens (DCP). */
#ifndef KVT_PD_DESC_H
#define KVT_PD_DESC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "kvtier.h"

#define PD_MAX_ENTRIES (KVT_MAX_LAYERS * KVT_MAX_COMPONENTS)
#define PD_MAX_TP 1024
/* ranks of one side, tp_size x dcp_size: bounds what one descriptor can make
 * a peer compute (topology checks plan against every position) */
#define PD_MAX_RANKS 1024
#define PD_ROLE_PREFILL 1
#define PD_ROLE_DECODE 2

typedef struct pd_entry {
    uint32_t layer, comp;
    uint32_t token_bytes; /* bytes of one token on this rank */
    uint32_t heads;       /* heads on this rank */
    uint32_t head_offset; /* first global head on this rank (0 when replicated):
                             (tp_rank / replicas) * heads */
    uint32_t elem_size;
    uint32_t replicated;  /* 1: MLA, every TP rank holds the same bytes */
    uint32_t replicas;    /* MHA: consecutive TP ranks holding these heads
                             (1: split; n > 1 divides tp_size: GQA with
                             fewer KV heads than TP); MLA: 1 */
} pd_entry;

typedef struct pd_desc {
    uint32_t role;
    uint32_t tokens_per_page, layout;
    uint32_t tp_size, tp_rank, dcp_size, dcp_rank;
    uint32_t num_entries;
    pd_entry *entries;
} pd_desc;

/* Builds the descriptor of geo at rank (validated). The caller frees with
 * pd_desc_free. */
kvt_status pd_desc_from_geometry(pd_desc *out, const kvt_geometry *geo,
                                 const kvt_pd_rank *rank, uint32_t role);
kvt_status pd_desc_copy(pd_desc *out, const pd_desc *in);
/* The same rank family at another position (decode ranks are homogeneous). */
kvt_status pd_desc_at(pd_desc *out, const pd_desc *in, uint32_t tp_rank, uint32_t dcp_rank);
void pd_desc_free(pd_desc *d);

/* Wire form: little-endian u32 fields. Encoded size of d. */
size_t pd_desc_wire_size(const pd_desc *d);
void pd_desc_encode(const pd_desc *d, uint8_t *out);
/* Decodes and validates every field; *used gets the bytes consumed.
 * KVT_EPROTO with a message on anything malformed. Never reads past len. */
kvt_status pd_desc_decode(pd_desc *out, const uint8_t *p, size_t len, size_t *used);

/* A bootstrap TOPO answer (docs/pd.md): u32 n (1..PD_MAX_RANKS), then n
 * prefill descriptors, each followed by u16 port and host[64]. */
typedef struct pd_topo_entry {
    pd_desc desc;
    char host[65]; /* NUL-terminated */
    uint16_t port;
} pd_topo_entry;

/* Decodes a TOPO body into *out (n entries, freed with pd_topo_free);
 * KVT_EPROTO naming the entry on anything malformed. */
kvt_status pd_topo_decode(const uint8_t *b, uint32_t len, pd_topo_entry **out, uint32_t *n_out);
void pd_topo_free(pd_topo_entry *e, uint32_t n);

/* One entry's move: bytes [src_off, src_off + len) of a prefill token go
 * to [dst_off, dst_off + len) of the decode token. len 0: nothing. */
typedef struct pd_slice {
    uint32_t unit;     /* KVT_UNIT(layer, comp) */
    uint32_t src_off, dst_off, len;
    uint32_t src_tb, dst_tb; /* token bytes on each side */
} pd_slice;

typedef struct pd_plan {
    uint32_t num_slices;
    pd_slice *slices;
    uint32_t src_tpp, dst_tpp;
    uint32_t dcp_n, dcp_k;   /* decode holds global tokens g with g % n == k,
                                at local index g / n */
    uint32_t src_n;          /* prefill holds g at local index g / src_n
                                (src_n is 1 or equal to dcp_n) */
    bool feeds;              /* some slice is non-empty */
    uint64_t bytes_per_token;/* sum of slice lens */
} pd_plan;

/* Computes the plan of (src prefill, dst decode). KVT_EGEOMETRY or
 * KVT_EUNSUPPORTED with a message naming the entry, the field and both
 * values when the pair cannot be converted. An MHA entry whose prefill
 * heads are replicated on n ranks is fed to decode TP rank t only by the
 * replica with tp_rank % n == t % n (one source per head; consecutive
 * decode ranks pull from different replicas). */
kvt_status pd_plan_compute(pd_plan *out, const pd_desc *src, const pd_desc *dst);
void pd_plan_free(pd_plan *p);

/* Local decode tokens of a request of ntok global tokens. */
static inline uint32_t pd_plan_local_tokens(const pd_plan *p, uint32_t ntok)
{
    return ntok > p->dcp_k ? (ntok - p->dcp_k + p->dcp_n - 1) / p->dcp_n : 0;
}

/* Feeding: decode rank (tp, dcp) of family dec is fed by prefill rank src.
 * For the room handshake every prefill rank must hear from at least one
 * decode rank; a prefill rank nobody needs hears from its "dummy" decode
 * rank. pd_topo_* compute those sets from descriptors alone. */
bool pd_topo_feeds(const pd_desc *src, const pd_desc *dst);
/* How many decode ranks will open each room on prefill rank src. */
kvt_status pd_topo_expected(const pd_desc *src, const pd_desc *dec, uint32_t *out);
/* Whether decode rank dst must talk to prefill rank src (feeds or dummy). */
kvt_status pd_topo_talks(const pd_desc *src, const pd_desc *dst, bool *out);
/* Refuses (with the plan's message) a decode rank that cannot be converted
 * from a prefill rank of its DCP position; KVT_OK for unrelated pairs. */
kvt_status pd_topo_check(const pd_desc *src, const pd_desc *dst);

#endif
