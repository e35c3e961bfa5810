/* pull.h - the peer pull protocol (docs/cluster.md): a node that finds a
 * request's next blocks on a peer asks the peer for them over an
 * authenticated TCP stream (src/net, realm kvt__auth_cluster) and stores
 * them into its own CPU tier.
 *
 * One exchange, after the handshake, any number of times per connection:
 *   FETCH (puller -> peer): a 32-byte header
 *     u32 magic "KVCP", u16 version, u16 op (1), u64 space (the geometry
 *     and block size: the server shard's fingerprint), u32 first, u32
 *     count (blocks [first, first + count) of the request), u32 req_len,
 *     u32 reserved (0)
 *   then req_len bytes: the request as the node server's protocol encodes
 *   it (server/proto.h kvt__srv_req_encode: namespace, tokens or keys).
 *   ANSWER (peer -> puller): a 24-byte header
 *     u32 magic, i32 status (KVT_OK, or why nothing follows), u32 n (the
 *     leading blocks of those asked the peer holds and sends, <= count),
 *     u32 reserved, u64 block_bytes (the peer's; must be the puller's)
 *   then the n blocks' bytes, then n checksums (u64: kvt__pull_sum of
 *   block first + i's layer checksums): a trailer, so the puller checks
 *   each block as it lands, while the bytes are in cache.
 *   REPORT (puller -> peer, after an ANSWER whose blocks failed their
 *   checksums): the FETCH header with op 2 and the same request, blocks
 *   [first, first + count) being the run that failed. The peer hashes
 *   those it holds again against its records and drops the ones that
 *   differ (so a puller can never make it drop a good block), and answers
 *   an ANSWER header with n = the blocks it dropped, nothing after it.
 *   Without it a block that changed in the holder's tier stayed there,
 *   published, and every peer's pull of it failed until a local load
 *   happened to find it.
 *   UCX (puller -> peer, the link's first frame when the puller's
 *   cluster_transport is ucx): the header with op 3 and space, first,
 *   count and req_len 0, no body. The peer answers an ANSWER header:
 *   KVT_OK, then both move the link onto UCX (net/stream.h,
 *   kvt__stream_ucx_upgrade: the peer as the server side) and the puller
 *   sends 8 bytes the peer echoes (UCX wires up at a first message); or
 *   KVT_EUNSUPPORTED (its cluster_transport is tcp, or UCX cannot start
 *   there) and the link goes on over TCP.
 * Integers are little-endian. The peer pins the blocks while it sends. */
#ifndef KVT_CLUSTER_PULL_H
#define KVT_CLUSTER_PULL_H

#include <stdint.h>
#include "kvtier.h"

#define KVT_PULL_MAGIC 0x5043564bu /* "KVCP" */
/* 2: checksums after the blocks; 3: of the layer checksums; 4: REPORT */
#define KVT_PULL_VERSION 4
#define KVT_PULL_FETCH 1
#define KVT_PULL_REPORT 2
#define KVT_PULL_UCX 3
#define KVT_PULL_REQ_HDR 32
#define KVT_PULL_REP_HDR 24
#define KVT_PULL_MAX_REQ (64u << 20) /* a request's bytes (16M tokens), at most */
#define KVT_PULL_MAX_BLOCKS 4096     /* blocks one FETCH may ask for */

typedef struct kvt_pull_fetch {
    uint16_t op; /* KVT_PULL_FETCH or KVT_PULL_REPORT */
    uint64_t space;
    uint32_t first, count, req_len;
} kvt_pull_fetch;

typedef struct kvt_pull_answer {
    int32_t status;
    uint32_t n;
    uint64_t block_bytes;
} kvt_pull_answer;

void kvt__pull_fetch_encode(uint8_t out[KVT_PULL_REQ_HDR], const kvt_pull_fetch *f);
/* KVT_EPROTO (magic, op not one of the three; for FETCH and REPORT count
 * 0 or above KVT_PULL_MAX_BLOCKS, req_len 0 or above KVT_PULL_MAX_REQ; for
 * UCX any field but op not 0; reserved not 0), KVT_EVERSION; the message
 * names the field and who sent it (from). */
kvt_status kvt__pull_fetch_decode(const uint8_t in[KVT_PULL_REQ_HDR], const char *from,
                                  kvt_pull_fetch *out);
void kvt__pull_answer_encode(uint8_t out[KVT_PULL_REP_HDR], const kvt_pull_answer *a);
/* Checks the answer against what was asked: n <= count, block_bytes equal
 * to ours when n > 0, status a kvtier status and n 0 unless it is KVT_OK.
 * KVT_EPROTO/KVT_EVERSION naming the field and from. */
kvt_status kvt__pull_answer_decode(const uint8_t in[KVT_PULL_REP_HDR], uint32_t count,
                                   uint64_t block_bytes, const char *from,
                                   kvt_pull_answer *out);
/* The checksum of block number idx (first + i) of an answer: XXH3-64 of
 * the block's layer checksums (the node server's, server/sums.c: what the
 * block was stored with), seeded with idx. The holder sends its records,
 * so a block that changed in its tier since its store fails at the
 * puller, who hashes each layer as it lands (and records what it
 * verified). */
uint64_t kvt__pull_sum(const uint64_t *layer_sums, uint32_t num_layers, uint32_t idx);

#endif
