/* events.h - KV events in vLLM's wire format (docs/events.md): every
 * block a node's index commits or removes, and every copy of one its tiers
 * (CPU, SSD: vLLM's medium "CPU", "DISK") gain or drop, is published on a ZeroMQ PUB
 * socket as vLLM's ZmqEventPublisher does (multipart: topic, sequence
 * number as 8 bytes big-endian, a msgpack EventBatch encoded array-like
 * [ts, events, data_parallel_rank]), with a ROUTER socket that replays the
 * buffered batches from a sequence number. KV-aware routers (llm-d,
 * Dynamo) read these to route a request to where its prefix is.
 *
 * Layers: above index (the index's observer) and store (KVT_POOL_NONE);
 * the node server starts it and sets it on each geometry's index. The
 * observer runs under the caller's cache lock: it only appends to a
 * bounded lock-free queue (a full queue drops, counted); one thread
 * encodes, publishes and answers replays. */
#ifndef KVT_EVENTS_EVENTS_H
#define KVT_EVENTS_EVENTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "index/index.h"
#include "kvtier.h"

typedef struct kvt_events kvt_events;

typedef struct kvt_events_config {
    const char *endpoint;        /* PUB, bound: tcp://127.0.0.1:PORT, tcp://[::1]:PORT, ipc://PATH */
    const char *replay_endpoint; /* ROUTER, bound, the same rule; NULL or "": none */
    const char *topic;           /* the first frame of every message; NULL: "" */
    uint32_t dp_rank;            /* data_parallel_rank in every batch */
    uint32_t buffer_steps;       /* batches kept for replay (>= 1) */
    /* events_secret_file's bytes (16..1024; NULL: none): both sockets are
     * ZeroMQ CURVE servers whose keys, and the one client key they let in
     * (checked by a ZAP handler), derive from it (kvt__events_curve_keys),
     * and the endpoints may be anywhere. Copied at start. */
    const uint8_t *secret;
    size_t secret_len;
    bool insecure; /* events_insecure: an endpoint off this host without a secret */
    /* the blocks also become durable on an SSD tier: a token store's
     * tokens are kept for the BlockStored "DISK" too, not only "CPU" */
    bool disk_tokens;
    /* several indexes (a server's geometries) publish here, and a block's
     * hash does not say which one holds it: announce a block into a tier
     * when the first of them holds it there and remove it when the last
     * lets go, counting per hash and tier, so the stream stays a set */
    bool counted;
} kvt_events_config;

/* The CURVE keys a secret gives, as Z85 text (40 characters and a NUL):
 * each secret key is BLAKE2b-256 of a label and the secret
 * ("kvtier-events-server\0" or "kvtier-events-client\0" followed by the
 * secret's bytes), each public key Curve25519 of it. A subscriber sets
 * ZMQ_CURVE_SERVERKEY = server_public and its own ZMQ_CURVE_PUBLICKEY /
 * SECRETKEY = client_public / client_secret (docs/events.md shows the
 * same in Python). KVT_EINVAL for a secret outside 16..1024 bytes;
 * KVT_ESYS when libzmq has no CURVE. */
typedef struct kvt_events_keys {
    char server_public[41], server_secret[41], client_public[41], client_secret[41];
} kvt_events_keys;
kvt_status kvt__events_curve_keys(const uint8_t *secret, size_t len, kvt_events_keys *out);

/* Binds the sockets and starts the publishing thread, which first
 * publishes AllBlocksCleared (this node's earlier life is gone). KVT_EINVAL
 * for an endpoint not confined to this host without a secret or insecure
 * (the events name every block the node holds) naming the option;
 * KVT_EBUSY when it cannot bind (the message says why); KVT_ENOMEM;
 * KVT_ESYS. */
kvt_status kvt__events_start(kvt_events **out, const kvt_events_config *cfg);
/* Publishes what is queued (for at most a second), stops the thread,
 * closes the sockets. After every observer using it was cleared. NULL: no-op. */
void kvt__events_stop(kvt_events *ev);

/* The index observer's argument, one per index (a geometry's tier). */
typedef struct kvt_events_src {
    kvt_events *ev;
    uint32_t block_tokens; /* block_size in the events */
    /* The tiers that hold entry id now (cache/observe.h kvt__cache_tiers_of:
     * bit 1 CPU, bit 2 DISK), asked under the index's lock at each STORED
     * and REMOVED; NULL: CPU when its payload is a pool slot, else DISK. */
    uint8_t (*tiers)(const void *tiers_arg, uint32_t id);
    const void *tiers_arg;
} kvt_events_src;
/* kvt_index_observer: arg is a kvt_events_src. STORED: BlockStored in
 * each tier the block is in; REMOVED: BlockRemoved from each it leaves;
 * the tier events (index.h KVT_INDEX_CPU_ / _DISK_): that tier's
 * BlockStored or BlockRemoved. */
void kvt__events_observe(void *arg, kvt_index_event e, const kvt_index *idx, const uint32_t *ids,
                         uint32_t n);

/* Names blocks h[0..n) by the engine's keys (a keyed store request's,
 * before its blocks commit): their events then carry the key bytes
 * instead of kvtier's ids, as the engine (vLLM's block hashes, SGLang's
 * page hashes) names them. Keys over 64 bytes are skipped. Any thread;
 * ev NULL: no-op. */
void kvt__events_name(kvt_events *ev, const kvt_hash128 *h, const kvt_key *keys, uint32_t n);

/* Blocks h[0..n) of a token store request are its tokens[i * block_tokens
 * .. (i + 1) * block_tokens) (before they commit): each one's BlockStored
 * into the CPU tier carries them as token_ids (and, with disk_tokens, its
 * BlockStored into the SSD tier too), once per tier. Kept until then, at
 * most 65536 blocks' and 64 MiB of tokens (older ones go first: a store
 * that never commits leaves nothing for long). Any thread; ev NULL: no-op. */
void kvt__events_tokens(kvt_events *ev, const kvt_hash128 *h, const uint32_t *tokens, uint32_t n,
                        uint32_t block_tokens);

typedef struct kvt_events_stats {
    uint64_t batches;  /* published */
    uint64_t events;   /* BlockStored/BlockRemoved/AllBlocksCleared in them */
    uint64_t blocks;   /* block hashes in them */
    uint64_t dropped;  /* blocks not published: the queue was full */
    uint64_t replays;  /* replay requests answered */
    uint64_t refused;  /* CURVE handshakes the ZAP handler refused */
} kvt_events_stats;
void kvt__events_stats(const kvt_events *ev, kvt_events_stats *out);

/* A replay request's last frame: the start sequence number, 8 bytes
 * big-endian. KVT_EPROTO for any other length. */
kvt_status kvt__events_replay_decode(const uint8_t *p, size_t n, uint64_t *start);
/* KVT_OK when ep is tcp:// on 127.0.0.1, localhost or [::1] with a port,
 * or ipc://PATH; with anywhere (a secret, or events_insecure) also any
 * tcp://HOST:PORT; else KVT_EINVAL naming opt and ep. */
kvt_status kvt__events_endpoint_check(const char *ep, const char *opt, bool anywhere);

#endif
