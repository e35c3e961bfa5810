/* config.h - the option table behind kvt_config_*. One row per option:
 * name, type, default, help; environment variable KVTIER_<NAME upper>.
 * Other layers read typed values through kvt__config_values(). Later
 * issues add rows (and fields) here; nothing else has to change. */
#ifndef KVT_UTIL_CONFIG_H
#define KVT_UTIL_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "kvtier.h"

typedef struct kvt_config_values {
    uint64_t cpu_capacity;  /* "cpu_capacity", size, default "1GiB": CPU tier bytes */
    uint32_t block_tokens;  /* "block_tokens", uint, default 16: tokens per cache block
                               (must be a multiple of the geometry's tokens_per_page) */
    uint32_t workers;       /* "workers", uint 1..64, default 2: transfer threads */
    uint32_t max_tasks;     /* "max_tasks", uint 16..1048576, default 4096: tasks
                               planned, running or not yet reported */
    uint32_t plan_ttl_ms;   /* "plan_ttl_ms", uint, default 30000: a looked-up or
                               prepared task never launched is released after this */
    uint32_t eviction;      /* "eviction", enum "lru"|"lfu", default "lru" (kvt_evict_policy) */
    bool huge_pages;        /* "huge_pages", bool, default true: try huge pages for the CPU tier */
    bool memory_check;      /* "memory_check", bool, default true: cpu_capacity <= MemAvailable */
    char ssd_dirs[1024];    /* "ssd_dirs", string, default "": comma-separated SSD tier
                               directories, one per device; empty = no SSD tier */
    uint64_t ssd_capacity;  /* "ssd_capacity", size, default "16GiB": SSD tier bytes over all dirs */
    bool ssd_fresh;         /* "ssd_fresh", bool, default false: wipe a directory written for
                               another geometry instead of refusing it */
    uint32_t io;            /* "io", enum "auto"|"uring"|"threads", default "auto" (env KVTIER_IO) */
    uint32_t ssd_queue_depth; /* "ssd_queue_depth", uint 1..4096, default 64 */
    uint32_t log_level;     /* "log_level", enum "error"|"warn"|"info"|"debug", default "warn" (0..3) */
    /* The Prometheus endpoint (src/metrics, docs/metrics.md); one block, kept together. */
    uint32_t metrics_port;  /* "metrics_port", uint 0..65535, default 0 (off) */
    char metrics_addr[64];  /* "metrics_addr", string, default "127.0.0.1": numeric address */
    bool metrics_insecure;  /* "metrics_insecure", bool, default false: allow non-loopback */
    /* The node server (src/server, docs/server.md); one block, kept together. */
    char server_socket[108]; /* "server_socket", string, default "": Unix socket path */
    uint32_t server_stop_ms; /* "server_stop_ms", uint, default 5000: bound on a clean stop */
    uint32_t server_max_clients; /* "server_max_clients", uint, default 64 */
    uint32_t server_max_geometries; /* "server_max_geometries", uint 0..64, default 0 (auto) */
    uint32_t server_client_tasks; /* "server_client_tasks", uint, default 1024: per-client quota */
    char server_socket_group[64]; /* "server_socket_group", string, default "": socket 0660 with it */
    char server_namespaces[1024]; /* "server_namespaces", string, default "": per-client rules */
    char server_quotas[2048]; /* "server_quotas", string, default "": CPU bytes per namespace prefix */
    char events_endpoint[256]; /* "events_endpoint", string, default "": KV events PUB (off) */
    char events_replay_endpoint[256]; /* "events_replay_endpoint", string, default "": replay ROUTER */
    char events_topic[256];    /* "events_topic", string, default "": each message's first frame */
    uint32_t events_buffer_steps; /* "events_buffer_steps", uint, default 10000: batches kept */
    uint32_t events_dp_rank;   /* "events_dp_rank", uint, default 0: data_parallel_rank */
    char events_secret_file[256]; /* "events_secret_file", string, default "": CURVE keys' secret */
    bool events_insecure;      /* "events_insecure", bool, default false: off-host, no secret */
    char cluster_redis[512];   /* "cluster_redis", string, default "": directory (off) */
    char cluster_node[64];     /* "cluster_node", string, default "": the host name */
    char cluster_listen[128];  /* "cluster_listen", string, default "127.0.0.1:0" */
    char cluster_advertise[128]; /* "cluster_advertise", string, default "": cluster_listen's */
    char cluster_secret_file[256]; /* "cluster_secret_file", string, default "": none */
    char cluster_redis_password_file[256]; /* "cluster_redis_password_file", string, default "": no AUTH */
    char cluster_redis_user[256]; /* "cluster_redis_user", string, default "": the default user */
    char cluster_sentinel_password_file[256]; /* "cluster_sentinel_password_file", string, default "" */
    uint32_t cluster_lease_ms;  /* "cluster_lease_ms", uint, default 10000 */
    uint32_t cluster_pull_ms;   /* "cluster_pull_ms", uint, default 2000 */
    uint32_t cluster_prefill_tps; /* "cluster_prefill_tps", uint, default 20000 */
    uint32_t cluster_serve_max; /* "cluster_serve_max", uint, default 8 */
    uint32_t cluster_serve_mib_s; /* "cluster_serve_mib_s", uint, default 0 (no limit) */
    uint32_t cluster_transport; /* "cluster_transport", enum "tcp"|"ucx", default "tcp" */
    char server_secret_file[256]; /* "server_secret_file", string, default "": attach secret */
    uint32_t server_copy_ms; /* "server_copy_ms", uint, default 30000: a launched copy's deadline */
    uint32_t server_read_ms; /* "server_read_ms", uint, default 30000: a load's SSD reads' bound */
    uint32_t server_spin_us; /* "server_spin_us", uint, default 50: poll before sleeping */
} kvt_config_values;

struct kvt_config {
    kvt_config_values v;
};

/* Names the options (those the ranks of a group must agree on) whose part
 * of two kvt_config_digest values differs, as "\"block_tokens\"" (or
 * "\"a\" or \"b\"") into buf; returns how many it named. 0 when the
 * digests differ but no option's part does (a field collision, 1 in 32):
 * buf then says so in words ("an option the digest cannot tell ..."). */
size_t kvt__config_digest_diff(uint64_t a, uint64_t b, char *buf, size_t len);

static inline const kvt_config_values *kvt__config_values(const kvt_config *cfg)
{
    return &cfg->v;
}

/* getenv(name) for a variable declared here: an option's KVTIER_ name, one
 * of the other KVTIER_ variables listed in config.c, or a foreign one the
 * library reads (UCX_TLS). Every variable the library reads goes through
 * this, so the list in config.c is complete (asserted). */
const char *kvt__config_env(const char *name);

/* The logger's environment (util/log.c): KVTIER_LOG_LEVEL read as the
 * log_level option reads it (sets *level only when set and valid) and
 * KVTIER_LOG (*dest, NULL when unset). false, with a note, when
 * KVTIER_LOG_LEVEL is not a level. Sets no thread error message. */
bool kvt__config_log_env(kvt_log_level *level, const char **dest, char *note, size_t note_len);

#endif
