/* server.h - node server internals shared by server.c and conn.c. */
#ifndef KVT_SERVER_SERVER_H
#define KVT_SERVER_SERVER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <sys/types.h>

#include "cache/external.h"
#include "events/events.h"
#include "kvtier.h"
#include "server/auth.h"
#include "server/proto.h"
#include "util/config.h"
#include "util/hash.h"

#define KVT_SRV_MAX_SSD_LOCKS 16
#define KVT_SRV_MAX_GEOMETRIES 64 /* server_max_geometries' bound */
/* Connections accepted but not attached yet (handshake and HELLO to come)
 * have a budget of their own, apart from server_max_clients: a new one
 * past it pushes out the oldest, and each must attach within
 * KVT_SRV_ATTACH_MS. So silent connections cost their own slots, never an
 * engine's attach (a local handshake takes microseconds). */
#define KVT_SRV_MAX_PENDING 16
#define KVT_SRV_ATTACH_MS 10000

typedef struct kvt_srv_task {
    kvt_task_id id;
    bool launched;
    bool pending;      /* launched, its SSD reads still running: no offsets yet */
    kvt_task_kind kind;
    uint32_t num_blocks;
    uint32_t first_token; /* launched: as the cache launched it */
    uint32_t pins;     /* index entries the task pins (its planned blocks) */
    uint64_t *offsets; /* launched: each block's memfd offset */
    kvt_hash128 *keys; /* launched: each block's index key (in the same allocation) */
    uint32_t *ids;     /* launched: each block's index entry (in the same allocation) */
    uint64_t launched_ns; /* the client must END it by this + server_copy_ms */
} kvt_srv_task;

/* One geometry's tier: the cache (index, CPU pool in a memfd, SSD tier in a
 * subdirectory of each ssd_dirs entry named by id) that every client
 * attaching with this geometry and block size shares. A server holds up to
 * server_max_geometries of them, each created at the first HELLO that needs
 * it (or at start for the declared geometry) and kept until the server is
 * destroyed; blocks of different geometries never meet (different caches,
 * different memfds). */
/* Which namespace stored each chain, so CLEAR can find a namespace's
 * blocks: the index keys blocks by chained hashes seeded with the
 * namespace and keeps no namespace, but every block lies below its chain's
 * first block (its root), and the root's hash is tied to one namespace. So
 * the server records (root hash, namespace hash) at each PREPARE that made
 * a store task: one block hash and one table insert per store request, not
 * per block (independent keys, KVT_REQ_INDEPENDENT_KEYS, are each a root:
 * one per stored block there). Bound: at most 2 x the index's capacity
 * records (min 1024), 40 bytes each with the table; reaching it drops
 * records whose root left the index (eviction), which are never more than
 * the index holds. Records are not persisted: blocks recovered from SSD
 * after a restart belong to no namespace until stored again (docs/server.md). */
typedef struct kvt_srv_root {
    kvt_hash128 root, ns;
} kvt_srv_root;
typedef struct kvt_srv_roots {
    pthread_mutex_t mu;
    kvt_srv_root *v;
    uint32_t n, cap, limit;
    uint32_t *table; /* open addressing over v by root: index + 1, 0 empty */
    uint32_t tcap;   /* a power of two, >= 2 * cap */
} kvt_srv_roots;

/* The layer checksums each block of a tier was stored with, by index
 * entry, and the block (index key) they describe (sums.c). */
typedef struct kvt_srv_sums {
    pthread_mutex_t mu;
    bool ready;       /* initialised */
    uint32_t entries, layers;
    kvt_hash128 *key; /* per entry: the block its sums are of (zero: none yet) */
    uint64_t *sum;    /* per entry, layers XXH3-64s (layer l's bytes seeded with l) */
} kvt_srv_sums;

typedef struct kvt_srv_shard {
    struct kvt_server *server;
    kvt_geometry *geo;
    uint32_t block_tokens;
    uint64_t fingerprint; /* of the geometry and block_tokens (HELLO encoding) */
    char id[24];          /* "g" + 16 hex digits of it: SSD subdirectory, logs */
    char label[40];       /* geometry="<id>": its samples' label on /metrics */
    kvt_cache *cache;
    kvt_ext_shm shm;
    kvt_srv_roots roots; /* nsroots.c */
    kvt_srv_sums sums;   /* sums.c */
    kvt_events_src events; /* its index's observer's argument, when events are on */
    bool replay_to_hooks;  /* observer being (re)set for the hooks: events heard it already */
} kvt_srv_shard;

/* Hooks set from above (src/cluster: the server knows nothing of it) with
 * kvt__srv_set_hooks before kvt_server_run. observe hears every shard
 * index's events (index.h: STORED/REMOVED and its tiers' changes, under
 * the cache's lock: it only queues). fill is called when a LOOKUP, PEEK or PEEK_MANY of req on
 * sh matched fewer than all of req's full blocks (matched tokens): it may
 * store more of req's blocks into sh's tier (a pull from a peer) within
 * its own deadline, and returns true when it did, so the server asks its
 * cache again. Both run on the calling connection's thread; metrics on a
 * scrape's. */
struct kvt_mbuf;
typedef struct kvt_srv_hooks {
    void *arg;
    void (*observe)(void *arg, kvt_srv_shard *sh, kvt_index_event e, const kvt_index *idx,
                    const uint32_t *ids, uint32_t n);
    bool (*fill)(void *arg, kvt_srv_shard *sh, const kvt_request *req, uint32_t matched);
    /* appends its families to a /metrics scrape of the server (NULL: none) */
    void (*metrics)(void *arg, struct kvt_mbuf *b);
    /* kvt_server_destroy's first step while the hooks are set: whoever set
     * them stops using the server (threads joined, hooks cleared) */
    void (*server_gone)(void *arg);
} kvt_srv_hooks;

/* CPU blocks of stores cut off from a client still alive (it maps the tier
 * and may write into them late): back to the pool once its process exits. */
typedef struct kvt_srv_fence {
    kvt_srv_shard *shard; /* whose pool the slots are */
    pid_t pid;
    uint64_t session; /* the client handle's (SESSION), 0 if it sent none */
    int pidfd; /* readable once pid exited */
    uint32_t *slots, n;
    struct kvt_srv_fence *next;
} kvt_srv_fence;

typedef struct kvt_srv_conn kvt_srv_conn;
struct kvt_srv_conn {
    struct kvt_server *srv;
    kvt_srv_shard *sh; /* the tier of this client's geometry, from HELLO on */
    int fd;
    pid_t pid;
    uid_t uid;
    uint64_t session; /* from SESSION, 0 until then */
    kvt_srv_peer peer; /* SO_PEERCRED and SO_PEERGROUPS at accept */
    pthread_t thread;
    atomic_bool finished;
    bool attached;         /* HELLO answered; guarded by the server's mu */
    atomic_bool pushed_out; /* shut by make_room_locked (logged there, not again) */
    bool watcher;          /* asked GEOMETRY first (kvtier stats): attach/detach at debug */
    bool not_admitted;     /* its uid is refused: told so in the handshake, then closed */
    uint64_t accepted_ns;  /* it must attach by this + KVT_SRV_ATTACH_MS */
    kvt_srv_task *tasks; /* this client's planned and launched tasks */
    uint32_t ntasks, cap;
    atomic_uint_fast64_t pins; /* sum of tasks[].pins, read by a metrics scrape */
    kvt_srv_conn *next;
};

struct kvt_server {
    kvt_config_values cfg;
    kvt_geometry *declared; /* kvt_server_create's geo (its shard is shards[0]), or NULL */
    pthread_mutex_t shard_mu; /* guards creating shards (slow: a tier is prefaulted) */
    kvt_srv_shard *shards[KVT_SRV_MAX_GEOMETRIES];
    _Atomic uint32_t nshards; /* published after the shard is complete */
    uint32_t max_shards;      /* server_max_geometries, resolved */
    struct kvt_share *share;  /* one cpu_capacity for every shard, when max_shards > 1 */
    struct kvt_metrics_http *metrics; /* the server's own /metrics over every shard, when
                                       * metrics_port is set and it holds several geometries */
    char path[sizeof(((kvt_config_values *)0)->server_socket)];
    int listen_fd, lock_fd, stop_pipe[2];
    int ssd_lock_fds[KVT_SRV_MAX_SSD_LOCKS];
    uint32_t num_ssd_locks;
    bool grouped; /* server_socket_group set: socket 0660, its members attach */
    gid_t group;
    kvt_srv_ns_rules ns; /* server_namespaces */
    struct kvt_quota *quota; /* server_quotas, every shard's; NULL without rules */
    kvt_events *events;      /* events_endpoint's publisher, or NULL */
    kvt_srv_hooks hooks;     /* kvt__srv_set_hooks's; zero: none */
    pthread_mutex_t hooks_mu; /* hooks' writes, and a scrape's call of hooks.metrics (the
                               * metrics thread runs while the hooks are set or cleared) */
    uint8_t *secret;     /* server_secret_file's bytes (sodium_malloc), or NULL */
    size_t secret_len;
    atomic_int state; /* 0 created, 1 running, 2 stopped */
    uint64_t created_ns; /* kvt__now_ns() at create: the uptime kvtier stats shows */
    pthread_mutex_t mu; /* guards conns and fences */
    kvt_srv_conn *conns;
    uint32_t nconns;
    kvt_srv_fence *fences;
    bool accept_starved; /* the last accept failed for want of descriptors (accept thread) */
    uint64_t pending_dropped, pending_log_ns; /* make_room_locked's, under mu */
};

/* A server log line ("server: ...") through the library's logger
 * (util/log.h: kvt_set_log_handler, KVTIER_LOG, log_level): refusals and
 * dropped clients at warn, attach, detach, start and stop at info. */
void kvt__srv_log(kvt_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Layer l's checksum of a block: XXH3-64 of the layer's bytes in the
 * block seeded with l (the transfer engine's layer_sums and expect_sums).
 * kvt__srv_layer_sums: every layer of the block at `block` into out.
 * kvt__srv_layer_sum: layer l's alone; kvt__srv_layer_end: the offset in
 * the block just past layer l's bytes (a receive into the block may hash
 * layer l once that much of the block has landed). */
void kvt__srv_layer_sums(const uint8_t *block, const kvt_geometry *g, uint32_t block_tokens,
                         uint64_t *out);
uint64_t kvt__srv_layer_sum(const uint8_t *block, const kvt_geometry *g, uint32_t block_tokens,
                            uint32_t l);
uint64_t kvt__srv_layer_end(const kvt_geometry *g, uint32_t block_tokens, uint32_t l);
/* sums.c, for a tier whose index has `entries` entries. init: KVT_ENOMEM,
 * KVT_ESYS. max_blocks: the most blocks one task may have for its sums to
 * fit one frame (requests are cut to it). put records a committed store's
 * sums for its blocks' entries ids and keys (n blocks, n * layers u64s on
 * the wire, unaligned). get fills out (n * layers) for a load's blocks,
 * hashing those with no record of their key from base + offsets[i] and
 * recording them (returns how many it hashed). */
kvt_status kvt__srv_sums_init(kvt_srv_sums *s, uint32_t entries, uint32_t layers);
void kvt__srv_sums_destroy(kvt_srv_sums *s);
uint32_t kvt__srv_sums_max_blocks(uint32_t layers);
void kvt__srv_sums_put(kvt_srv_sums *s, const uint32_t *ids, const kvt_hash128 *keys,
                       uint32_t n, const uint8_t *sums);
/* The same from an aligned array (a pull's verified sums, src/cluster). */
void kvt__srv_sums_put64(kvt_srv_sums *s, const uint32_t *ids, const kvt_hash128 *keys,
                         uint32_t n, const uint64_t *sums);
uint32_t kvt__srv_sums_get(kvt_srv_sums *s, const uint8_t *base, const kvt_geometry *g,
                           uint32_t block_tokens, const uint64_t *offsets, const uint32_t *ids,
                           const kvt_hash128 *keys, uint32_t n, uint64_t *out);
/* The blocks (n, as for get) whose bytes at base + offsets[i] no longer
 * hash to their record: their keys into bad (room for n); returns how
 * many. One pass over the blocks: for a load found corrupt (conn.c) or a
 * peer's report of a pull that was (src/cluster), never the data path. 0
 * when out of memory (nothing is dropped on a guess). */
uint32_t kvt__srv_sums_check(kvt_srv_sums *s, const uint8_t *base, const kvt_geometry *g,
                             uint32_t block_tokens, const uint64_t *offsets, const uint32_t *ids,
                             const kvt_hash128 *keys, uint32_t n, kvt_hash128 *bad);
/* Drops blocks found changed in sh's tier (kvt__srv_sums_check) with the
 * chains below them, counts them in corrupt_blocks and logs it, naming who
 * found them. */
void kvt__srv_drop_corrupt(kvt_srv_shard *sh, const kvt_hash128 *bad, uint32_t nbad,
                           const char *who);
/* Keeps a cut-off client's store blocks (slots, n; taken over) until its
 * process pid exits or its session re-attaches with its copies stopped
 * (fences_release: the blocks freed); fences_reap (all: at destroy)
 * returns those of exited processes. server.c. */
void kvt__srv_fence_add(kvt_server *s, kvt_srv_shard *sh, pid_t pid, uint64_t session,
                        uint32_t *slots, uint32_t n);
uint32_t kvt__srv_fences_release(kvt_server *s, pid_t pid, uint64_t session);
void kvt__srv_fences_reap(kvt_server *s, bool all);
/* The tier for geometry geo with block_tokens (0: the server's choice):
 * the existing one, else a new one while fewer than server_max_geometries
 * exist. KVT_EFULL naming server_max_geometries; what kvt_cache_create
 * returns (a block larger than the tier's share: KVT_EINVAL naming both
 * sizes). server.c. */
kvt_status kvt__srv_shard_get(kvt_server *s, const kvt_geometry *geo, uint32_t block_tokens,
                              kvt_srv_shard **out);
/* The fingerprint of geometry geo with block_tokens (0: the server's
 * choice for it), as a tier of it would be named ("g%016llx"). */
/* The server's server_quotas rules and their use now into out (room for
 * KVT_SRV_MAX_QUOTAS); returns how many. */
uint32_t kvt__srv_quota_usage(const kvt_server *s, kvt_srv_quota *out);
kvt_status kvt__srv_geo_fingerprint(const kvt_server *s, const kvt_geometry *geo,
                                    uint32_t block_tokens, uint64_t *out);
/* The first shard (the declared geometry's, else the first attached), or
 * NULL while there is none. */
kvt_srv_shard *kvt__srv_shard_first(kvt_server *s);
/* nsroots.c: the record (init at shard creation, free at its end), adding
 * a store request's roots (n hashes of namespace ns), and CLEAR of a
 * namespace: every unpinned block of its chains removed (*removed), the
 * pinned ones kept (*kept) and still recorded. */
void kvt__srv_roots_init(kvt_srv_roots *r, uint32_t index_capacity);
void kvt__srv_roots_free(kvt_srv_roots *r);
void kvt__srv_roots_add(kvt_srv_shard *sh, const void *ns, uint32_t ns_len,
                        const kvt_hash128 *roots, uint32_t n);
kvt_status kvt__srv_roots_clear(kvt_srv_shard *sh, const void *ns, uint32_t ns_len,
                                uint32_t *removed, uint32_t *kept);
/* At HELLO: counts c as attached unless server_max_clients are
 * (KVT_EFULL naming it). server.c. */
kvt_status kvt__srv_conn_attach(kvt_server *s, kvt_srv_conn *c);
/* Requests this client has sent to its server so far, each one round trip
 * (one frame out, its reply back): every call's, the END a copy thread
 * sends when a launched task's copy ended, and attach's (HELLO, SESSION,
 * ...). Thread-safe; read under the client's socket lock, so an END whose
 * task a wait already reported is counted (client.c). `kvtier bench
 * engine` counts an engine's round trips per batch with it. */
uint64_t kvt__client_requests(kvt_client *cl);
/* This client's mapping of the server's CPU tier (NULL before attach),
 * *bytes its length. `kvtier bench engine` touches it to time a process's
 * first touch of the tier apart from the stores. client.c. */
void *kvt__client_tier(kvt_client *cl, uint64_t *bytes);
/* Sets the hooks (copied; NULL clears them) before kvt_server_run: each
 * existing shard's blocks are told to observe as STORED first. The hooks'
 * arg must outlive the server's run, or be cleared after it. server.c. */
void kvt__srv_set_hooks(kvt_server *s, const kvt_srv_hooks *h);
/* The shard of fingerprint fp, or NULL (any thread; shards live until the
 * server is destroyed). server.c. */
kvt_srv_shard *kvt__srv_shard_by_fp(kvt_server *s, uint64_t fp);
/* The thread serving one attached client (conn.c). */
void *kvt__srv_conn_main(void *arg);
/* space.c: a server of any geometry, at create: each of ssd_dirs' file
 * systems holds its share of ssd_capacity (free space plus what the
 * geometries' data files there hold already). KVT_ENOSPC naming the
 * directory and both numbers. */
kvt_status kvt__srv_check_ssd_space(const char *ssd_dirs, uint64_t ssd_capacity);
/* space.c: the disk the geometries' data files under dir
 * (dir/g<fingerprint>/kvtier.data) hold: theirs to reuse, so the check
 * counts it as room; tests read it to bound the SSD tier's real use. 0
 * when dir cannot be read. */
uint64_t kvt__srv_ssd_held(const char *dir);

#endif
