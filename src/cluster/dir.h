/* dir.h - the cluster directory: which node servers hold which blocks, in
 * Redis (docs/cluster.md). Layers: above util and net's deadlines; used by
 * src/cluster/cluster.c only.
 *
 * Keys (every one starts with the configured prefix, default "kvt:"):
 *   <p>e:<node>                 INCR'd once per start: the node's epoch
 *   <p>n:<node>                 "<epoch> <host:port>", PX lease_ms: the
 *                               node's lease; renewed every lease_ms/3
 *   <p>b:<space>:<hash>         HASH node -> "<epoch> <tier>" (tier "cpu":
 *                               the holder has a CPU copy; "ssd": its SSD
 *                               only), PEXPIRE 4 x lease_ms, re-set by
 *                               each holder's batched renewal and when
 *                               the block's tier changes. Record version
 *                               2; version 1's "<epoch>" (no tier) is still
 *                               read, as tier unknown.
 * <space> is 16 hex digits naming the geometry and block size (a server
 * shard's fingerprint); <hash> is the block's 128-bit chained hash in 32
 * hex digits, which commits to the namespace (tenant, model, LoRA) the
 * request was hashed under, so blocks of different namespaces or
 * geometries never share a key. A holder is trusted only while its lease
 * exists with the epoch the entry names: a restarted node (new epoch)
 * never vouches for its earlier life's entries.
 *
 * Thread-safety: every call may come from any thread; a lookup (engine
 * connection threads) never waits behind a publish batch longer than one
 * Redis round trip. Every call is bounded by timeout_ms per round trip.
 *
 * Failure: a call that cannot reach Redis returns KVT_ECONN (or
 * KVT_ETIMEDOUT) at once while the directory is down; it logs one line
 * when it goes down and one when it is back, and reconnects with backoff
 * (100 ms doubling to 5 s) on later calls, never in a loop of its own.
 * kvt__dir_generation() changes at each reconnect: the caller republishes
 * its holdings then (Redis may have lost them). */
#ifndef KVT_CLUSTER_DIR_H
#define KVT_CLUSTER_DIR_H

#include <stdbool.h>
#include <stdint.h>
#include "kvtier.h"
#include "util/hash.h"

typedef struct kvt_dir kvt_dir;

#define KVT_DIR_NODE_MAX 64 /* node id bytes, with its NUL */
#define KVT_DIR_ADDR_MAX 64 /* "host:port", with its NUL */
#define KVT_DIR_PASSWORD_MAX 512 /* Redis AUTH password bytes */
#define KVT_DIR_USER_MAX 128     /* Redis ACL user name bytes */

typedef struct kvt_dir_config {
    /* "host:port" (one Redis), "sentinel://h1:p1,h2:p2/<master name>"
     * (the primary Sentinel names, followed across failover) or
     * "cluster://h1:p1,h2:p2" (Redis Cluster: keys routed by slot, MOVED
     * and ASK followed, one pipeline per shard). */
    const char *redis;
    const char *password;   /* Redis AUTH; NULL or "": none */
    const char *user;       /* Redis ACL user for AUTH (needs password); NULL or "": the default */
    const char *sentinel_password; /* AUTH to the sentinels (their requirepass); NULL or "": none */
    const char *prefix;     /* key prefix; NULL: "kvt:" */
    const char *node;       /* this node's id: [A-Za-z0-9._-], 1..63 bytes */
    const char *advertise;  /* "host:port" where peers pull from this node (NULL if watch_only) */
    uint32_t lease_ms;      /* >= 100 */
    uint32_t timeout_ms;    /* one round trip's deadline, >= 1 */
    bool watch_only;        /* a reader (kvtier cluster status): no epoch, no lease */
} kvt_dir_config;

/* Reads a Redis password file (cluster_redis_password_file; the CLI's
 * --redis-password-file) into out: a regular file of 1..512 bytes, its one
 * trailing newline dropped, no NUL and no other line break in it (Redis
 * requirepass). who names the option in messages. KVT_EINVAL naming the
 * file and what is wrong. */
kvt_status kvt__dir_password_load(const char *path, const char *who,
                                  char out[KVT_DIR_PASSWORD_MAX + 1]);

/* Parses a cluster_redis value (host:port, sentinel://host:port[,...]/name
 * or cluster://host:port[,...]) as kvt__dir_open does, connecting nowhere:
 * KVT_EINVAL naming what is wrong (fuzz_options). */
kvt_status kvt__dir_check_redis(const char *redis);

/* Connects, INCRs the node's epoch and writes its lease. KVT_EINVAL for a
 * bad config (the message names the field); KVT_ECONN/KVT_ETIMEDOUT when
 * Redis cannot be reached by then (the message names the address);
 * KVT_ENOMEM. */
kvt_status kvt__dir_open(kvt_dir **out, const kvt_dir_config *cfg);
/* Deletes this node's lease (a clean leave: its entries stop being
 * trusted at once) when Redis answers within timeout_ms, then frees. */
void kvt__dir_close(kvt_dir *d);

uint64_t kvt__dir_epoch(const kvt_dir *d);
/* Bumped at every successful reconnect (starts at 1 after open). */
uint64_t kvt__dir_generation(const kvt_dir *d);
/* MOVED and ASK answers followed since open (Redis Cluster moving slots). */
uint64_t kvt__dir_redirects(const kvt_dir *d);
bool kvt__dir_up(const kvt_dir *d);

/* Which tier of its holder a block entry names (dir_entry_decode). */
enum { KVT_DIR_TIER_UNKNOWN = 0, KVT_DIR_TIER_CPU = 1, KVT_DIR_TIER_SSD = 2 };

/* This node holds h[0..n) of space: HSET node "<epoch> cpu" + PEXPIRE for
 * each, one pipelined round trip per 512 blocks. */
kvt_status kvt__dir_publish(kvt_dir *d, uint64_t space, const kvt_hash128 *h, uint32_t n);
/* The same with each block's tier: tier[i] KVT_DIR_TIER_CPU or _SSD (NULL:
 * every one CPU; anything else is taken as CPU). */
kvt_status kvt__dir_publish_tiers(kvt_dir *d, uint64_t space, const kvt_hash128 *h,
                                  const uint8_t *tier, uint32_t n);
/* This node no longer holds them: HDEL node. */
kvt_status kvt__dir_unpublish(kvt_dir *d, uint64_t space, const kvt_hash128 *h, uint32_t n);
/* Renews the lease (and, with n > 0, the entries h[0..n) of space as
 * kvt__dir_publish does). The caller renews every lease_ms/3. */
kvt_status kvt__dir_renew(kvt_dir *d, uint64_t space, const kvt_hash128 *h, uint32_t n);
kvt_status kvt__dir_renew_tiers(kvt_dir *d, uint64_t space, const kvt_hash128 *h,
                                const uint8_t *tier, uint32_t n);

typedef struct kvt_dir_holder {
    char node[KVT_DIR_NODE_MAX]; /* "" when no live holder other than this node */
    char addr[KVT_DIR_ADDR_MAX];
    uint64_t epoch;
    uint8_t tier; /* KVT_DIR_TIER_*: where the holder keeps the block */
} kvt_dir_holder;

/* For each of h[0..n) (a chain's next blocks, in order): one live holder
 * other than this node, or node "" when there is none. Stops at the first
 * block without one: *found is the count of leading blocks that have one
 * (out[0..*found) filled). One pipelined round trip for the block keys
 * plus one for the leases of holders not seen within lease_ms/4. Where
 * several hold a block, prefers the holder of the previous block (so a
 * run comes from one peer), then the lowest node id. */
kvt_status kvt__dir_lookup(kvt_dir *d, uint64_t space, const kvt_hash128 *h, uint32_t n,
                           kvt_dir_holder *out, uint32_t *found);
/* (Where several hold a block and the previous block's holder is not one
 * of them, a holder with a CPU copy comes before those with the SSD only,
 * which must read it back before they can send it.) */
/* Removes node's entry for h (a pull found it does not hold it). */
kvt_status kvt__dir_forget(kvt_dir *d, uint64_t space, const kvt_hash128 *h, const char *node);

/* What a node holds: blocks and bytes over every geometry, and of those
 * blocks how many have a CPU copy and how many a durable SSD copy (a block
 * may have both). tiers: the value carried the last two (version 2). */
typedef struct kvt_dir_holding {
    uint64_t blocks, bytes, cpu_blocks, ssd_blocks;
    bool tiers;
} kvt_dir_holding;

/* What this node holds now, for `kvtier cluster status`: <p>h:<node> =
 * "<blocks> <bytes> <cpu_blocks> <ssd_blocks>", PX 2 x lease_ms; the
 * caller writes it with each lease renewal. */
kvt_status kvt__dir_set_holding(kvt_dir *d, const kvt_dir_holding *h);

typedef struct kvt_dir_node {
    char node[KVT_DIR_NODE_MAX];
    char addr[KVT_DIR_ADDR_MAX];
    uint64_t epoch;
    int64_t lease_left_ms; /* PTTL of its lease */
    kvt_dir_holding held;  /* its last kvt__dir_set_holding (zero before one) */
} kvt_dir_node;
/* The nodes whose leases exist now (SCAN <p>n:*), at most max into out;
 * *n gets how many exist. For `kvtier cluster status`. */
kvt_status kvt__dir_nodes(kvt_dir *d, kvt_dir_node *out, uint32_t max, uint32_t *n);
/* What the directory is connected to, for status: "redis 127.0.0.1:6379",
 * "sentinel primary mymaster at 127.0.0.1:6380", "cluster of 3 primaries". */
void kvt__dir_topology(kvt_dir *d, char *buf, size_t len);

/* Decoders of what Redis hands back (fuzz targets: tests/fuzz/fuzz_dir.c).
 * A lease value "<epoch> <host:port>": KVT_EPROTO for anything else. */
kvt_status kvt__dir_lease_decode(const char *s, size_t len, uint64_t *epoch, char *addr,
                                 size_t addr_len);
/* A holding value "<blocks> <bytes> <cpu_blocks> <ssd_blocks>" (version
 * 2: out->tiers set) or "<blocks> <bytes>" (version 1), each decimal and
 * < 2^63, one space apart: KVT_EPROTO for anything else. */
kvt_status kvt__dir_holding_decode(const char *s, size_t len, kvt_dir_holding *out);
/* A decimal number, no sign, < 2^63 (an epoch): KVT_EPROTO else. */
kvt_status kvt__dir_epoch_decode(const char *s, size_t len, uint64_t *epoch);
/* A block entry's value: "<epoch> cpu" or "<epoch> ssd" (version 2), or
 * "<epoch>" (version 1: *tier KVT_DIR_TIER_UNKNOWN). KVT_EPROTO else. */
kvt_status kvt__dir_entry_decode(const char *s, size_t len, uint64_t *epoch, uint8_t *tier);

#endif
