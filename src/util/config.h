/* config.h - the option table behind kvt_config_*. One row per option:
 * name, type, default, help; environment variable KVTIER_<NAME upper>.
 * Other layers read typed values through kvt__config_values(). Later
 * issues add rows (and fields) here; nothing else has to change. */
#ifndef KVT_UTIL_CONFIG_H
#define KVT_UTIL_CONFIG_H

#include <stdbool.h>
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
    char ssd_dirs[1024];    /* "ssd_dirs", string, default "": comma-separated SSD tier
                               directories, one per device; empty = no SSD tier */
    uint64_t ssd_capacity;  /* "ssd_capacity", size, default "16GiB": SSD tier bytes over all dirs */
    bool ssd_fresh;         /* "ssd_fresh", bool, default false: wipe a directory written for
                               another geometry instead of refusing it */
    uint32_t io;            /* "io", enum "auto"|"uring"|"threads", default "auto" (env KVTIER_IO) */
    uint32_t ssd_queue_depth; /* "ssd_queue_depth", uint 1..4096, default 64 */
    uint32_t log_level;     /* "log_level", enum "error"|"warn"|"info"|"debug", default "warn" (0..3) */
    /* The node server (src/server, docs/server.md); one block, kept together. */
    char server_socket[108]; /* "server_socket", string, default "": Unix socket path */
    uint32_t server_stop_ms; /* "server_stop_ms", uint, default 5000: bound on a clean stop */
    uint32_t server_max_clients; /* "server_max_clients", uint, default 64 */
    uint32_t server_client_tasks; /* "server_client_tasks", uint, default 1024: per-client quota */
} kvt_config_values;

struct kvt_config {
    kvt_config_values v;
};

static inline const kvt_config_values *kvt__config_values(const kvt_config *cfg)
{
    return &cfg->v;
}

#endif
