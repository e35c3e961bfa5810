/* proto.h - the node server's control protocol over its Unix socket.
 *
 * Every message is a frame: a 16-byte header then len bytes of payload.
 *   u32 magic "KVTS", u16 op, u16 version, u32 len, i32 status
 * Requests carry status 0; a reply has op | KVT_SRV_REPLY and either status
 * 0 and the op's payload, or a failure status and a message (at most
 * KVT_SRV_MAX_ERRMSG bytes, not NUL-terminated). Integers are host order
 * (both ends share one kernel). Payloads, by op:
 *   HELLO    req: u32 proto, u32 pid, u32 num_layers, u32 tokens_per_page,
 *                 u32 layout, u32 block_tokens (0: the server's choice, else a
 *                 multiple of tokens_per_page), per layer: u32 ncomp, ncomp x
 *                 (u32 kv_heads, u32 head_dim, u32 elem_size). The geometry
 *                 and block_tokens pick the server's tier for this client
 *                 (one per geometry, created at its first HELLO)
 *            rep: u64 map_bytes, u64 stride, u64 block_bytes, u32 block_tokens,
 *                 u32 num_blocks, u32 server_pid, u32 flags; the CPU tier's
 *                 memfd rides on the reply's first byte (SCM_RIGHTS). flags
 *                 SPARSE: the tier is backed slot by slot as slots are first
 *                 written (geometries sharing one cpu_capacity): a client
 *                 maps it without populating (a populate would back all of
 *                 it); other bits are ignored (a later server's hints)
 *   LOOKUP   req: a request (below)   rep: u64 task, u32 matched_tokens, u32 0
 *   PREPARE  req: a request           rep: u64 task, u32 first_token, u32 num_tokens
 *   LAUNCH   req: u64 task            rep: u32 kind, u32 first_token, u32 num_tokens,
 *                 u32 num_blocks, i32 bad_status, u32 flags, u64 offset[num_blocks],
 *                 u32 num_layers, u64 sum[num_blocks * num_layers] (a load's: each
 *                 block's layer checksums as stored, block 0's first; a store's:
 *                 num_layers 0): the client checks its copy against them
 *            flags PENDING: a load's SSD reads are still running (num_blocks 0);
 *            the server never waits for them: the client sends LAUNCH for the
 *            same task again (a poll, answered at once) until it gets offsets
 *   END      req: u64 task, i32 status, u32 n, u32 num_layers,
 *                 u64 checksum[n * num_layers] (a store that copied well: each
 *                 block's layer checksums, taken in the copy's pass, n =
 *                 num_blocks; else n = num_layers = 0); a store commits here
 *            rep: u64 task, u32 kind, i32 status, u32 first_token,
 *                 u32 num_tokens, u64 bytes
 *   CANCEL   req: u64 task            rep: empty
 *   STATS    req: empty               rep: u32 n, u32 0, u64 field[n] (kvt_cache_stats order)
 *   FLUSH    req: u64 timeout_ms      rep: empty (or KVT_ETIMEDOUT)
 *   GEOMETRY req: empty               rep: the server's geometry as a HELLO
 *                 request (proto, server pid, layers..., its block_tokens): the
 *                 declared one, else the first a client attached with (or
 *                 KVT_EGEOMETRY when none did yet); allowed only before
 *                 HELLO, so a client that knows only the socket (kvtier stats,
 *                 kvt_client_attach with geo NULL) can attach
 *   SESSION  req: u64 session, u32 flags, u32 0 (a task reply's layout), right
 *                 after HELLO: the client handle's session key (random, kept
 *                 across its re-attaches); flags RESUMED: its copies of earlier
 *                 connections have stopped, so the server frees the store
 *                 blocks it fenced when it cut off this pid's session
 *            rep: u64 0, u32 blocks freed, u32 0
 *   PEEK     req: a request           rep: u64 0, u32 matched_tokens, u32 0
 *            (kvt_cache_peek: LOOKUP's answer with nothing pinned, no task)
 *   STATS_ALL req: empty (every tier), or a geometry as a HELLO request (its
 *                 block_tokens ignored): only that geometry's tiers, or
 *                 KVT_ENOTFOUND naming it and the ones held. Allowed before
 *                 HELLO too: it never makes a tier (kvtier stats)
 *            rep: u32 n, u32 nfields, n x (u64 fingerprint, u32 num_layers,
 *                 u32 tokens_per_page, u32 block_tokens, u32 0,
 *                 u64 bytes_per_token, u64 field[nfields] (kvt_cache_stats order)),
 *                 then u32 nq, nq x (u32 len, prefix bytes padded to 4,
 *                 u64 limit, used, limited, evicted): server_quotas' rules,
 *                 then the server itself: u32 nfields, u64 field[nfields]
 *                 (kvt_srv_info order: pid, uptime_ms, clients,
 *                 max_clients, geometries, max_geometries, cpu_capacity,
 *                 metrics_port; an older reader skips fields it does not
 *                 know), u32 len, its version string padded to 4
 *   END_SYNC req/rep: as END, for a store planned KVT_REQ_VISIBLE_AT_END
 *                 (the client waits for this answer before it reports the
 *                 store; END's may be reported before the answer comes)
 *   CLEAR    req: u32 0, u32 ns_len, ns bytes padded to 4
 *            rep: u64 0, u32 blocks removed, u32 blocks kept (pinned: loads or
 *                 SSD writes in flight, or with a store in flight below them)
 *   PEEK_MANY req: u32 n (<= KVT_SRV_MAX_PEEKS), u32 0, n x (u32 len, a request
 *                 of len bytes, as PEEK's)
 *            rep: u32 n, u32 0, n x (i32 status, u32 matched_tokens): each
 *                 request's PEEK answer (a refused namespace: KVT_EAUTH for
 *                 that entry only)
 * A request is: u32 form, u32 ns_len, ns bytes padded to 4, u32 count, then
 *   form 0 (tokens): u32 token[count];
 *   form 1 (keys):   count x (u32 len, len bytes padded to 4), len <= KVT_SRV_MAX_KEY;
 *   form 2 (independent keys, KVT_REQ_INDEPENDENT_KEYS): as form 1.
 *   The keyed form carries kvt_request.keys; the server's cache checks
 *   them further (kvt__request_check: KVT_MAX_KEY_LEN, KVT_MAX_KEYS).
 * Decoders never trust a length: every one is bounded before use. */
#ifndef KVT_SERVER_PROTO_H
#define KVT_SERVER_PROTO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "kvtier.h"

#define KVT_SRV_MAGIC 0x5354564bu /* "KVTS" */
#define KVT_SRV_VERSION 6u /* 2: SESSION and PEEK; 3: request form 2 (independent keys);
                            * 4: HELLO's block_tokens (any geometry per client);
                            * 5: layer checksums in END and in a load's LAUNCH reply;
                            * 6: the server's own figures in STATS_ALL's reply.
                            * A peer of another version is refused with KVT_EVERSION. */
#define KVT_SRV_HDR 16u
#define KVT_SRV_REPLY 0x8000u
#define KVT_SRV_MAX_MSG (16u << 20)      /* bound on one payload */
#define KVT_SRV_MAX_TOKENS (1u << 22)    /* tokens (or keys) in one request */
#define KVT_SRV_MAX_NS 4096u
#define KVT_SRV_MAX_KEY 1024u
#define KVT_SRV_MAX_ERRMSG 512u
#define KVT_SRV_MAX_BLOCKS (1u << 22)    /* blocks in one task */
#define KVT_SRV_MAX_BLOCK_TOKENS (1u << 20) /* HELLO's block_tokens */

typedef enum kvt_srv_op {
    KVT_SRV_HELLO = 1,
    KVT_SRV_LOOKUP = 2,
    KVT_SRV_PREPARE = 3,
    KVT_SRV_LAUNCH = 4,
    KVT_SRV_END = 5,
    KVT_SRV_CANCEL = 6,
    KVT_SRV_STATS = 7,
    KVT_SRV_FLUSH = 8,
    KVT_SRV_GEOMETRY = 9,
    KVT_SRV_SESSION = 10,
    KVT_SRV_PEEK = 11,
    KVT_SRV_STATS_ALL = 12,
    KVT_SRV_CLEAR = 13,
    KVT_SRV_PEEK_MANY = 14,
    KVT_SRV_END_SYNC = 15,
} kvt_srv_op;

/* The op's name ("LOOKUP"; "an unknown op" for none), for messages. */
const char *kvt__srv_op_name(uint16_t op);

#define KVT_SRV_MAX_TIERS 64    /* tiers in a STATS_ALL reply (server_max_geometries' bound) */
#define KVT_SRV_MAX_PEEKS 4096u /* requests in one PEEK_MANY */

/* SESSION's flag: the client's copies of earlier connections have stopped
 * and it dropped their mapping of the tier. */
#define KVT_SRV_SESSION_RESUMED 1u

typedef struct kvt_srv_hdr {
    uint32_t magic;
    uint16_t op, version;
    uint32_t len;
    int32_t status;
} kvt_srv_hdr;

/* A growable encode buffer; oom latches. */
typedef struct kvt_srv_buf {
    uint8_t *p;
    size_t len, cap;
    bool oom;
} kvt_srv_buf;

void kvt__srv_buf_free(kvt_srv_buf *b);
void kvt__srv_put32(kvt_srv_buf *b, uint32_t v);
void kvt__srv_put64(kvt_srv_buf *b, uint64_t v);
void kvt__srv_put_bytes(kvt_srv_buf *b, const void *p, size_t n); /* padded to 4 */

/* Header: encode into 16 bytes; decode checks magic, version and len bound
 * (KVT_EPROTO with a message naming the field). */
void kvt__srv_hdr_encode(uint8_t out[KVT_SRV_HDR], uint16_t op, uint32_t len, int32_t status);
kvt_status kvt__srv_hdr_decode(const uint8_t in[KVT_SRV_HDR], kvt_srv_hdr *out);

/* HELLO */
typedef struct kvt_srv_hello {
    uint32_t proto, pid;
    uint32_t block_tokens; /* 0: the server's choice */
    kvt_geometry *geo; /* owned by the caller after a successful decode */
} kvt_srv_hello;
kvt_status kvt__srv_hello_encode(kvt_srv_buf *b, uint32_t pid, const kvt_geometry *geo,
                                 uint32_t block_tokens);
/* from_server: the bytes are the server's GEOMETRY reply (names the sender in
 * errors), else a client's HELLO. */
kvt_status kvt__srv_hello_decode(const uint8_t *p, size_t len, bool from_server,
                                 kvt_srv_hello *out);

#define KVT_SRV_TIER_SPARSE 1u
typedef struct kvt_srv_hello_rep {
    uint64_t map_bytes, stride, block_bytes;
    uint32_t block_tokens, num_blocks, server_pid;
    uint32_t flags; /* KVT_SRV_TIER_* */
} kvt_srv_hello_rep;
void kvt__srv_hello_rep_encode(kvt_srv_buf *b, const kvt_srv_hello_rep *r);
kvt_status kvt__srv_hello_rep_decode(const uint8_t *p, size_t len, kvt_srv_hello_rep *out);

/* Requests (LOOKUP, PREPARE, PEEK). Decoded tokens are copied into *tokens
 * (form 0); decoded keys are a malloc'd array *keys whose data point into p
 * (form 1), so p must outlive them. The caller frees tokens and keys; ns
 * points into p. */
typedef struct kvt_srv_req {
    uint32_t form;  /* 0 tokens, 1 keys, 2 independent keys */
    const void *ns;
    uint32_t ns_len;
    uint32_t count;
    uint32_t *tokens; /* form 0: count tokens, malloc'd */
    kvt_key *keys;    /* forms 1, 2: count keys, malloc'd, data into the frame */
} kvt_srv_req;
kvt_status kvt__srv_req_encode(kvt_srv_buf *b, const kvt_request *req);
kvt_status kvt__srv_req_decode(const uint8_t *p, size_t len, kvt_srv_req *out);

/* Two fixed replies */
void kvt__srv_task_rep_encode(kvt_srv_buf *b, uint64_t task, uint32_t a, uint32_t c);
kvt_status kvt__srv_task_rep_decode(const uint8_t *p, size_t len, uint64_t *task, uint32_t *a,
                                    uint32_t *c);
/* LAUNCH, CANCEL requests: one task id */
void kvt__srv_id_encode(kvt_srv_buf *b, uint64_t task);
kvt_status kvt__srv_id_decode(const uint8_t *p, size_t len, uint64_t *task);

#define KVT_SRV_LAUNCH_PENDING 1u

typedef struct kvt_srv_launch_rep {
    uint32_t kind, first_token, num_tokens, num_blocks;
    int32_t bad_status;
    uint32_t flags; /* KVT_SRV_LAUNCH_PENDING or 0 */
    const uint8_t *offsets; /* num_blocks u64s, unaligned: read with kvt__srv_get64 */
    uint32_t num_layers;    /* a load's: layers per block in sums; a store's: 0 */
    const uint8_t *sums;    /* a load's num_blocks * num_layers u64s (block 0's layers
                             * first): what each layer of each block was stored with */
} kvt_srv_launch_rep;
/* sums: NULL with r->num_layers 0 */
void kvt__srv_launch_rep_encode(kvt_srv_buf *b, const kvt_srv_launch_rep *r,
                                const uint64_t *offsets, const uint64_t *sums);
kvt_status kvt__srv_launch_rep_decode(const uint8_t *p, size_t len, kvt_srv_launch_rep *out);

/* A store's END carries the layer checksums of each block its client
 * copied (n blocks x num_layers, block 0's first); a load's none (0, 0). */
typedef struct kvt_srv_end {
    uint64_t task;
    int32_t status;
    uint32_t n, num_layers;
    const uint8_t *checksums; /* n * num_layers u64s */
} kvt_srv_end;
void kvt__srv_end_encode(kvt_srv_buf *b, uint64_t task, int32_t status, const uint64_t *sums,
                         uint32_t n, uint32_t num_layers);
kvt_status kvt__srv_end_decode(const uint8_t *p, size_t len, kvt_srv_end *out);

void kvt__srv_result_encode(kvt_srv_buf *b, const kvt_task_result *r);
kvt_status kvt__srv_result_decode(const uint8_t *p, size_t len, kvt_task_result *out);

void kvt__srv_stats_encode(kvt_srv_buf *b, const kvt_cache_stats *s);
kvt_status kvt__srv_stats_decode(const uint8_t *p, size_t len, kvt_cache_stats *out);

/* STATS_ALL's reply: one tier (a geometry with its block size) each. */
typedef struct kvt_srv_tier {
    uint64_t fingerprint;
    uint32_t num_layers, tokens_per_page, block_tokens;
    uint64_t bytes_per_token;
    kvt_cache_stats stats;
} kvt_srv_tier;
/* Then the server's server_quotas rules and their use (kvt_quota_usage). */
#define KVT_SRV_MAX_QUOTAS 32     /* = KVT_POOL_MAX_OWNERS */
#define KVT_SRV_QUOTA_PREFIX 255  /* bytes of a rule's prefix on the wire */
typedef struct kvt_srv_quota {
    char prefix[KVT_SRV_QUOTA_PREFIX + 1];
    uint64_t limit, used, limited, evicted;
} kvt_srv_quota;
/* Then the server as a whole (kvt_server_info): version, pid, uptime and
 * the clients attached now (kvtier stats' header line). */
#define KVT_SRV_VERSION_MAX 31 /* bytes of the version string on the wire */
typedef struct kvt_srv_info {
    uint64_t pid, uptime_ms, clients, max_clients, geometries, max_geometries, cpu_capacity,
        metrics_port;
    char version[KVT_SRV_VERSION_MAX + 1];
} kvt_srv_info;
void kvt__srv_tiers_encode(kvt_srv_buf *b, const kvt_srv_tier *t, uint32_t n,
                           const kvt_srv_quota *q, uint32_t nq, const kvt_srv_info *info);
/* Writes min(n, max) tiers to out, *n the count the reply holds; the
 * same for the quotas (qout NULL: not kept); the server's own figures
 * into info (NULL: not kept). */
kvt_status kvt__srv_tiers_decode(const uint8_t *p, size_t len, kvt_srv_tier *out, uint32_t max,
                                 uint32_t *n, kvt_srv_quota *qout, uint32_t qmax, uint32_t *nq,
                                 kvt_srv_info *info);

/* CLEAR: a namespace (ns points into p). */
kvt_status kvt__srv_clear_encode(kvt_srv_buf *b, const void *ns, uint32_t ns_len);
kvt_status kvt__srv_clear_decode(const uint8_t *p, size_t len, const uint8_t **ns,
                                 uint32_t *ns_len);

/* PEEK_MANY: n requests. The decoder gives each request's bytes (into p),
 * each decoded by kvt__srv_req_decode as the server answers it. */
typedef struct kvt_srv_span {
    const uint8_t *p;
    uint32_t len;
} kvt_srv_span;
kvt_status kvt__srv_peek_many_encode(kvt_srv_buf *b, const kvt_request *reqs, uint32_t n);
/* *spans: malloc'd (the caller frees), n entries. */
kvt_status kvt__srv_peek_many_decode(const uint8_t *p, size_t len, kvt_srv_span **spans,
                                     uint32_t *n);
void kvt__srv_peek_answers_encode(kvt_srv_buf *b, const int32_t *status, const uint32_t *matched,
                                  uint32_t n);
/* Exactly n answers expected (the requests sent). */
kvt_status kvt__srv_peek_answers_decode(const uint8_t *p, size_t len, uint32_t n,
                                        int32_t *status, uint32_t *matched);

uint64_t kvt__srv_get64(const uint8_t *p);

/* Frames over a non-blocking socket, each by deadline_ns. send_frame may
 * pass fd_pass (>= 0) with the first byte. recv_frame allocates *payload
 * (NULL when len is 0; the caller frees it); *fd_got (may be NULL) gets a
 * passed fd or -1. KVT_ECONN (closed, failed), KVT_ETIMEDOUT, KVT_EPROTO,
 * KVT_ENOMEM. */
kvt_status kvt__srv_send_frame(int fd, uint16_t op, int32_t status, const void *payload,
                               size_t len, int fd_pass, uint64_t deadline_ns);
kvt_status kvt__srv_recv_frame(int fd, kvt_srv_hdr *hdr, uint8_t **payload, int *fd_got,
                               uint64_t deadline_ns);

#endif
