/* config.c - the public kvt_config_* functions over one declarative table.
 *
 * Each row of OPTIONS names an option, its type, its default (as a string:
 * kvt_config_create parses it, so the table is the only place a default is
 * written), its help text and where its typed value lives in
 * kvt_config_values. The environment variable is "KVTIER_" + the name in
 * upper case; the row macros spell both so the strings are static.
 *
 * kvt_config_get formats sizes as the exact number of bytes, a bare
 * decimal integer ("1073741824", not "1GiB"), so a value read back always
 * parses to the same bytes; enums as their canonical (lower-case) name;
 * booleans as "true" or "false".
 */
#include "util/config.h"

#include <assert.h>
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>
#include "util/err.h"
#include "util/file.h"
#include "util/hash.h"
#include "util/parse.h"

extern char **environ;

/* KVTIER_* variables that are read elsewhere and are not options; every
 * other KVTIER_* variable must name an option (a typo is an error). An
 * option of the same name wins (remove the entry here when adding one).
 *   KVTIER_TEST_TMP  scratch directory of the test suite.
 *   KVTIER_LOG       log destination: stderr (default), off, or a file to
 *                    append to (src/util/log.c).
 *   KVTIER_LOG_FORMAT  text (default), json or plain (src/util/log.c).
 *   KVTIER_PD_QUIET  silences the PD endpoints' log lines (src/pd).
 *   KVTIER_PD_CHECKSUM_THREADS  1/0: what checksum_threads = 0 (auto) means
 *                    for PD endpoints (src/pd/hasher.c).
 *   KVTIER_LIB, KVTIER_SANITIZE  the Python binding: which libkvtier.so to
 *                    load, and whether it is a sanitizer build.
 *   KVTIER_CUDART, KVTIER_CUDA_COPY  which CUDA runtime to load and which
 *                    copy mode to use (src/cuda, docs/gpu.md).
 *   KVTIER_TEST_FAKE_CUDA  the GPU check runs over the fake runtime.
 * tests/env_names.sh checks that every KVTIER_ name the sources and docs
 * mention is accepted here or is an option. */
static const char *const NON_OPTION_ENV[] = {
    "KVTIER_TEST_TMP", "KVTIER_LOG",     "KVTIER_LOG_FORMAT", "KVTIER_PD_QUIET",
    "KVTIER_PD_CHECKSUM_THREADS", "KVTIER_LIB", "KVTIER_SANITIZE", "KVTIER_CUDART",
    "KVTIER_CUDA_COPY", "KVTIER_TEST_FAKE_CUDA"};

#define ENV_PREFIX "KVTIER_"
#define MAX_FILE_BYTES (1u << 20)
/* JSON numbers are doubles: integers beyond 2^53 are not exact. */
#define MAX_JSON_INTEGER 9007199254740992.0

typedef enum opt_type { OPT_SIZE, OPT_UINT, OPT_ENUM, OPT_BOOL, OPT_STRING } opt_type;

typedef struct opt_def {
    const char *name;
    const char *env;
    opt_type type;
    const char *def;
    const char *help;
    size_t offset; /* of the field in kvt_config_values */
    size_t width;  /* its size: uint64_t or uint32_t for size/uint/enum, bool for
                      bool, a char array for string (the longest value is width - 1) */
    uint64_t min, max;         /* size and uint: inclusive bounds */
    const char *const *choices; /* enum: NULL-terminated names, index = value */
    bool rank_local; /* may differ between the ranks of a group (a local path, a
                        thread count, a log level): left out of kvt_config_digest */
} opt_def;

/* Every row says whether the ranks of a group must agree on it. */
#define AGREE false
#define RANK_LOCAL true

static const char *const EVICTION_NAMES[] = {"lru", "lfu", NULL}; /* kvt_evict_policy */
static const char *const IO_NAMES[] = {"auto", "uring", "threads", NULL};
static const char *const TRANSPORT_NAMES[] = {"tcp", "ucx", NULL}; /* KVT_CLUSTER_TCP, _UCX */
static const char *const LOG_LEVEL_NAMES[] = {"error", "warn", "info", "debug", NULL};

#define FIELD_(f) .offset = offsetof(kvt_config_values, f), \
                  .width = sizeof(((kvt_config_values *)0)->f)
#define ROW_(f, ENVNAME, sc, t, d, h) \
    .name = #f, .env = ENV_PREFIX #ENVNAME, .type = t, .def = d, .help = h, FIELD_(f), \
    .rank_local = sc
/* uint help texts end with the bounds, stringified from the same tokens. */
#define SIZE_OPT(f, ENVNAME, sc, d, lo, hi, h) \
    {ROW_(f, ENVNAME, sc, OPT_SIZE, d, h), .min = lo, .max = hi}
#define UINT_OPT(f, ENVNAME, sc, d, lo, hi, h) \
    {ROW_(f, ENVNAME, sc, OPT_UINT, #d, h " (" #lo ".." #hi ")"), .min = lo, .max = hi}
#define ENUM_OPT(f, ENVNAME, sc, d, names, h) \
    {ROW_(f, ENVNAME, sc, OPT_ENUM, d, h), .choices = names}
#define BOOL_OPT(f, ENVNAME, sc, d, h) {ROW_(f, ENVNAME, sc, OPT_BOOL, d, h)}
#define STRING_OPT(f, ENVNAME, sc, d, h) {ROW_(f, ENVNAME, sc, OPT_STRING, d, h)}

static const opt_def OPTIONS[] = {
    SIZE_OPT(cpu_capacity, CPU_CAPACITY, AGREE, "1GiB", 4096, 1ull << 50,
             "bytes of host memory for the CPU tier (4KiB..1024TiB)"),
    UINT_OPT(block_tokens, BLOCK_TOKENS, AGREE, 16, 1, 1048576,
             "tokens per cache block; a multiple of the geometry's tokens_per_page"),
    UINT_OPT(workers, WORKERS, RANK_LOCAL, 2, 1, 64, "transfer threads"),
    UINT_OPT(max_tasks, MAX_TASKS, AGREE, 4096, 16, 1048576,
             "tasks planned, running or not yet reported, at most"),
    UINT_OPT(plan_ttl_ms, PLAN_TTL_MS, AGREE, 30000, 1, 86400000,
             "a looked-up or prepared task never launched is released after this many ms"),
    ENUM_OPT(eviction, EVICTION, AGREE, "lru", EVICTION_NAMES,
             "eviction policy: lru (least recently used) or lfu (least frequently used)"),
    BOOL_OPT(huge_pages, HUGE_PAGES, RANK_LOCAL, "true", "try huge pages for the CPU tier"),
    BOOL_OPT(memory_check, MEMORY_CHECK, RANK_LOCAL, "true",
             "refuse a cpu_capacity above what the machine can give now (MemAvailable plus free "
             "huge pages), which would bring the OOM killer while the tier is prefaulted"),
    STRING_OPT(ssd_dirs, SSD_DIRS, RANK_LOCAL, "",
               "comma-separated SSD tier directories, one per device; empty: no SSD tier"),
    SIZE_OPT(ssd_capacity, SSD_CAPACITY, AGREE, "16GiB", 4096, 1ull << 50,
             "bytes of the SSD tier over all its directories (4KiB..1024TiB); a change keeps "
             "its blocks (a smaller one drops those past its new end)"),
    BOOL_OPT(ssd_fresh, SSD_FRESH, RANK_LOCAL, "false",
             "wipe an SSD directory written for another geometry instead of refusing it"),
    ENUM_OPT(io, IO, RANK_LOCAL, "auto", IO_NAMES,
             "SSD I/O backend: auto (io_uring if the kernel allows it), uring or threads"),
    UINT_OPT(ssd_queue_depth, SSD_QUEUE_DEPTH, RANK_LOCAL, 64, 1, 4096, "SSD I/O queue depth"),
    ENUM_OPT(log_level, LOG_LEVEL, RANK_LOCAL, "warn", LOG_LEVEL_NAMES,
             "messages at this level and above are logged: error, warn, info or debug"),
    /* The Prometheus endpoint (src/metrics, docs/metrics.md): keep these together. */
    UINT_OPT(metrics_port, METRICS_PORT, RANK_LOCAL, 0, 0, 65535,
             "TCP port of the Prometheus endpoint GET /metrics; 0: off"),
    STRING_OPT(metrics_addr, METRICS_ADDR, RANK_LOCAL, "127.0.0.1",
               "numeric IPv4 or IPv6 address the metrics endpoint binds; a non-loopback "
               "address is refused unless metrics_insecure is true"),
    BOOL_OPT(metrics_insecure, METRICS_INSECURE, RANK_LOCAL, "false",
             "let metrics_addr be a non-loopback address (the endpoint has no authentication)"),
    /* The node server (kvtier serve, docs/server.md): keep these together. */
    STRING_OPT(server_socket, SERVER_SOCKET, RANK_LOCAL, "",
               "the node server's Unix socket path (kvtier serve; clients attach to it)"),
    UINT_OPT(server_stop_ms, SERVER_STOP_MS, RANK_LOCAL, 5000, 1, 600000,
             "a stopping server waits this many ms at most for pending SSD writes"),
    UINT_OPT(server_max_clients, SERVER_MAX_CLIENTS, RANK_LOCAL, 64, 1, 4096,
             "clients attached to the node server at once, at most"),
    UINT_OPT(server_max_geometries, SERVER_MAX_GEOMETRIES, RANK_LOCAL, 0, 0, 64,
             "geometries (model, TP slice, dtype, page and block size) one node server holds "
             "at once, each in its own share of cpu_capacity and ssd_capacity "
             "(capacity / this); 0: 1 when the server is started with a geometry (--model), "
             "else 4"),
    UINT_OPT(server_client_tasks, SERVER_CLIENT_TASKS, RANK_LOCAL, 1024, 1, 1048576,
             "tasks one client may hold planned or running on the node server"),
    STRING_OPT(server_socket_group, SERVER_SOCKET_GROUP, RANK_LOCAL, "",
               "a group: the server's socket is created 0660 owned by it, and its members may "
               "attach; empty: 0600, only the server's user"),
    STRING_OPT(server_namespaces, SERVER_NAMESPACES, RANK_LOCAL, "",
               "namespaces each client may use: rules WHO=NS[,NS...] separated by ';', WHO "
               "uid:N, gid:N or *, NS a namespace, - the default (empty) one, * any; empty: "
               "no restriction"),
    STRING_OPT(server_quotas, SERVER_QUOTAS, RANK_LOCAL, "",
               "CPU tier bytes each namespace prefix may hold: rules PREFIX=SIZE separated by "
               "';', the longest matching prefix wins, - the default (empty) namespace, * all "
               "others together; a namespace at its quota evicts its own coldest blocks; "
               "empty: no quotas"),
    STRING_OPT(events_endpoint, EVENTS_ENDPOINT, RANK_LOCAL, "",
               "KV events in vLLM's format (docs/events.md): the ZeroMQ PUB endpoint the node "
               "server binds, tcp://127.0.0.1:PORT, tcp://[::1]:PORT or ipc://PATH (any "
               "tcp://HOST:PORT with events_secret_file or events_insecure); empty: off"),
    STRING_OPT(events_replay_endpoint, EVENTS_REPLAY_ENDPOINT, RANK_LOCAL, "",
               "the ROUTER endpoint that replays buffered event batches from a sequence number "
               "(the same rule); empty: none"),
    STRING_OPT(events_topic, EVENTS_TOPIC, RANK_LOCAL, "",
               "the topic frame of every event message"),
    UINT_OPT(events_buffer_steps, EVENTS_BUFFER_STEPS, RANK_LOCAL, 10000, 1, 1000000,
             "event batches kept for replay"),
    UINT_OPT(events_dp_rank, EVENTS_DP_RANK, RANK_LOCAL, 0, 0, 65535,
             "data_parallel_rank in every event batch"),
    STRING_OPT(events_secret_file, EVENTS_SECRET_FILE, RANK_LOCAL, "",
               "a file of 16..1024 secret bytes: the events sockets speak ZeroMQ CURVE with keys "
               "derived from it and let in only subscribers holding it (kvtier events "
               "--secret-file); then the endpoints may be off this host; empty: no secret"),
    BOOL_OPT(events_insecure, EVENTS_INSECURE, RANK_LOCAL, "false",
             "let the events endpoints be off this host without a secret (for a router that "
             "cannot speak CURVE: anyone who reaches them reads which blocks this node holds)"),
    /* The cluster tier (src/cluster, docs/cluster.md): keep these together. */
    STRING_OPT(cluster_redis, CLUSTER_REDIS, RANK_LOCAL, "",
               "the cluster directory: host:port of one Redis, sentinel://H:P[,H:P]/NAME (the "
               "primary those Sentinels name) or cluster://H:P[,H:P] (Redis Cluster); empty: "
               "no cluster tier (kvtier serve joins one when it is set)"),
    STRING_OPT(cluster_node, CLUSTER_NODE, RANK_LOCAL, "",
               "this node's id in the cluster ([A-Za-z0-9._-], at most 63 bytes); empty: the "
               "host name"),
    STRING_OPT(cluster_listen, CLUSTER_LISTEN, RANK_LOCAL, "127.0.0.1:0",
               "IPv4 host:port where this node serves its blocks to peers (port 0: any free "
               "one); a non-loopback host requires cluster_secret_file"),
    STRING_OPT(cluster_advertise, CLUSTER_ADVERTISE, RANK_LOCAL, "",
               "host:port peers reach cluster_listen at; empty: cluster_listen's"),
    STRING_OPT(cluster_secret_file, CLUSTER_SECRET_FILE, RANK_LOCAL, "",
               "a file of 16..1024 bytes, the same on every node: peers prove they hold it "
               "(HMAC-SHA256) before a block moves; empty: none (loopback only)"),
    STRING_OPT(cluster_redis_password_file, CLUSTER_REDIS_PASSWORD_FILE, RANK_LOCAL, "",
               "a file holding the directory Redis's password (requirepass), one line: every "
               "connection to it AUTHs first; empty: no AUTH (a Redis off loopback is then "
               "warned about)"),
    STRING_OPT(cluster_redis_user, CLUSTER_REDIS_USER, RANK_LOCAL, "",
               "the Redis ACL user (Redis 6+) the directory AUTHs as, with the password in "
               "cluster_redis_password_file; empty: the default user (requirepass)"),
    STRING_OPT(cluster_sentinel_password_file, CLUSTER_SENTINEL_PASSWORD_FILE, RANK_LOCAL, "",
               "a file holding the Sentinels' own password (their requirepass), one line, "
               "for a sentinel:// cluster_redis; empty: the sentinels want none"),
    UINT_OPT(cluster_lease_ms, CLUSTER_LEASE_MS, RANK_LOCAL, 10000, 100, 3600000,
             "a node's directory entries are trusted this many ms after its last renewal"),
    UINT_OPT(cluster_pull_ms, CLUSTER_PULL_MS, RANK_LOCAL, 2000, 10, 600000,
             "deadline of one pull from a peer (directory lookup, connect, transfer); a pull "
             "past it is a miss"),
    UINT_OPT(cluster_prefill_tps, CLUSTER_PREFILL_TPS, RANK_LOCAL, 20000, 1, 100000000,
             "the engine's prefill rate in tokens/s: a pull that would take longer than "
             "recomputing its tokens at this rate is not started"),
    UINT_OPT(cluster_serve_max, CLUSTER_SERVE_MAX, RANK_LOCAL, 8, 1, 1024,
             "pulls this node serves to peers at once (each pins its blocks while it runs)"),
    UINT_OPT(cluster_serve_mib_s, CLUSTER_SERVE_MIB_S, RANK_LOCAL, 0, 0, 1048576,
             "MiB per second this node sends to peers, over every pull it serves; 0: no "
             "limit (the link's)"),
    ENUM_OPT(cluster_transport, CLUSTER_TRANSPORT, RANK_LOCAL, "tcp", TRANSPORT_NAMES,
             "how pulls move blocks: tcp, or ucx (each link asks the peer to move onto UCX "
             "after the handshake, UCX_TLS and friends from the environment; a peer whose "
             "cluster_transport is tcp answers no, and that link stays on TCP)"),
    STRING_OPT(server_secret_file, SERVER_SECRET_FILE, RANK_LOCAL, "",
               "a file of 16..1024 bytes every client of the node server must prove it holds "
               "(HMAC-SHA256 challenge at attach); clients read it from "
               "KVTIER_SERVER_SECRET_FILE; empty: no secret"),
    UINT_OPT(server_copy_ms, SERVER_COPY_MS, RANK_LOCAL, 30000, 100, 3600000,
             "a client's launched copy must end within this many ms, else the server cuts the "
             "client off and releases its pins"),
    UINT_OPT(server_read_ms, SERVER_READ_MS, RANK_LOCAL, 30000, 100, 3600000,
             "bound on one load's SSD reads through the node server: the server waits this "
             "many ms at most for them when it releases the task, and a client (reading "
             "KVTIER_SERVER_READ_MS) ends a load still pending after this long with "
             "KVT_ETIMEDOUT"),
    UINT_OPT(server_spin_us, SERVER_SPIN_US, RANK_LOCAL, 50, 0, 1000,
             "microseconds the node server's connection threads wait for a client's next "
             "message, and a client (reading KVTIER_SERVER_SPIN_US) for a reply, by polling "
             "before they sleep: a round trip without two thread wake-ups, for at most this "
             "much CPU per call; 0: never poll"),
};

#define NUM_OPTIONS (sizeof OPTIONS / sizeof OPTIONS[0])

static const char *type_name(opt_type t)
{
    switch (t) {
    case OPT_SIZE: return "size";
    case OPT_UINT: return "uint";
    case OPT_ENUM: return "enum";
    case OPT_BOOL: return "bool";
    case OPT_STRING: return "string";
    }
    return "?";
}

/* ------------------------------------------------------------------ */
/* Lookup and suggestions                                             */
/* ------------------------------------------------------------------ */

static const opt_def *find_by_name(const char *name)
{
    for (size_t i = 0; i < NUM_OPTIONS; i++)
        if (strcmp(OPTIONS[i].name, name) == 0) return &OPTIONS[i];
    return NULL;
}

/* Levenshtein distance, or SIZE_MAX for strings too long to be a typo of
 * an option (the row buffer is bounded). */
#define EDIT_MAX_LEN 64
static size_t edit_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    if (la > EDIT_MAX_LEN || lb > EDIT_MAX_LEN) return SIZE_MAX;
    size_t row[EDIT_MAX_LEN + 1];
    for (size_t j = 0; j <= lb; j++) row[j] = j;
    for (size_t i = 1; i <= la; i++) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t up = row[j];
            size_t best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best) best = up + 1;
            if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[lb];
}

/* The option whose name (or env variable, when env) is nearest to s, if
 * it is near enough to be a plausible typo; else NULL. */
static const opt_def *suggest(const char *s, bool env)
{
    const opt_def *best = NULL;
    size_t best_d = SIZE_MAX;
    for (size_t i = 0; i < NUM_OPTIONS; i++) {
        size_t d = edit_distance(s, env ? OPTIONS[i].env : OPTIONS[i].name);
        if (d < best_d) {
            best_d = d;
            best = &OPTIONS[i];
        }
    }
    size_t len = strlen(s);
    size_t limit = len < 6 ? 1 : len < 12 ? 2 : 3;
    return best_d <= limit ? best : NULL;
}

static kvt_status fail_unknown(const char *ctx, const char *name)
{
    const opt_def *s = suggest(name, false);
    if (s)
        return kvt__fail(KVT_EINVAL, "%s: unknown option \"%s\" (did you mean \"%s\"?)", ctx,
                         name, s->name);
    return kvt__fail(KVT_EINVAL, "%s: unknown option \"%s\" (kvtier config --dump lists them)",
                     ctx, name);
}

/* ------------------------------------------------------------------ */
/* Typed values                                                       */
/* ------------------------------------------------------------------ */

static void store_uint(kvt_config_values *v, const opt_def *o, uint64_t x)
{
    char *p = (char *)v + o->offset;
    if (o->width == sizeof(uint64_t)) {
        uint64_t w = x;
        memcpy(p, &w, sizeof w);
    } else {
        uint32_t w = (uint32_t)x; /* callers bound x to the field */
        memcpy(p, &w, sizeof w);
    }
}

static uint64_t load_uint(const kvt_config_values *v, const opt_def *o)
{
    const char *p = (const char *)v + o->offset;
    if (o->width == sizeof(uint64_t)) {
        uint64_t w;
        memcpy(&w, p, sizeof w);
        return w;
    }
    uint32_t w;
    memcpy(&w, p, sizeof w);
    return w;
}

static void choices_text(const opt_def *o, char *buf, size_t len)
{
    size_t used = 0;
    buf[0] = '\0';
    for (size_t i = 0; o->choices[i] && used < len; i++) {
        int n = snprintf(buf + used, len - used, "%s%s", i ? ", " : "", o->choices[i]);
        if (n < 0) break;
        used += (size_t)n;
    }
}

/* Parses value for option o into v. ctx starts the message ("kvt_config_set"). */
static kvt_status apply(kvt_config_values *v, const opt_def *o, const char *value,
                        const char *ctx)
{
    uint64_t x;
    switch (o->type) {
    case OPT_SIZE:
        if (!kvt__parse_size(value, &x))
            return kvt__fail(KVT_EINVAL,
                             "%s: option \"%s\": \"%s\" is not a size (bytes, optionally "
                             "with a suffix K, M, G, T, KiB, MiB, GiB, TiB, KB, MB, GB, TB)",
                             ctx, o->name, value);
        if (x < o->min || x > o->max)
            return kvt__fail(KVT_EINVAL,
                             "%s: option \"%s\": \"%s\" is out of range (must be %llu..%llu "
                             "bytes)", ctx, o->name, value, (unsigned long long)o->min,
                             (unsigned long long)o->max);
        store_uint(v, o, x);
        return KVT_OK;
    case OPT_UINT:
        if (!kvt__parse_u64(value, &x))
            return kvt__fail(KVT_EINVAL,
                             "%s: option \"%s\": \"%s\" is not an unsigned decimal integer "
                             "(must be %llu..%llu)", ctx, o->name, value,
                             (unsigned long long)o->min, (unsigned long long)o->max);
        if (x < o->min || x > o->max)
            return kvt__fail(KVT_EINVAL,
                             "%s: option \"%s\": \"%s\" is out of range (must be %llu..%llu)",
                             ctx, o->name, value, (unsigned long long)o->min,
                             (unsigned long long)o->max);
        store_uint(v, o, x);
        return KVT_OK;
    case OPT_ENUM:
        /* Case-insensitive, like booleans and size suffixes. */
        for (uint32_t i = 0; o->choices[i]; i++) {
            if (strcasecmp(value, o->choices[i]) == 0) {
                store_uint(v, o, i);
                return KVT_OK;
            }
        }
        {
            char list[128];
            choices_text(o, list, sizeof list);
            return kvt__fail(KVT_EINVAL, "%s: option \"%s\": \"%s\" is not one of %s", ctx,
                             o->name, value, list);
        }
    case OPT_BOOL: {
        bool b;
        if (!kvt__parse_bool(value, &b))
            return kvt__fail(KVT_EINVAL,
                             "%s: option \"%s\": \"%s\" is not a boolean (true, false, 1, 0, "
                             "yes, no, on, off)", ctx, o->name, value);
        memcpy((char *)v + o->offset, &b, sizeof b);
        return KVT_OK;
    }
    case OPT_STRING: {
        size_t len = strlen(value);
        if (len >= o->width)
            return kvt__fail(KVT_EINVAL, "%s: option \"%s\": \"%.40s...\" is %zu bytes long (at "
                             "most %zu)", ctx, o->name, value, len, o->width - 1);
        memcpy((char *)v + o->offset, value, len + 1);
        return KVT_OK;
    }
    }
    return kvt__fail(KVT_EINVAL, "%s: option \"%s\" has no type", ctx, o->name);
}

/* Formats o's value in v; returns the length snprintf would need. */
static int format_value(const kvt_config_values *v, const opt_def *o, char *buf, size_t len)
{
    switch (o->type) {
    case OPT_SIZE:
    case OPT_UINT:
        return snprintf(buf, len, "%llu", (unsigned long long)load_uint(v, o));
    case OPT_ENUM:
        return snprintf(buf, len, "%s", o->choices[load_uint(v, o)]);
    case OPT_BOOL: {
        bool b;
        memcpy(&b, (const char *)v + o->offset, sizeof b);
        return snprintf(buf, len, "%s", b ? "true" : "false");
    }
    case OPT_STRING:
        return snprintf(buf, len, "%s", (const char *)v + o->offset);
    }
    return snprintf(buf, len, "?");
}

/* ------------------------------------------------------------------ */
/* Create, set, get, table                                            */
/* ------------------------------------------------------------------ */

/* A row whose field cannot hold its type is a bug in the table above;
 * checked on every create so a new row is caught by the first test. */
static bool row_fits(const opt_def *o)
{
    switch (o->type) {
    case OPT_SIZE:
    case OPT_UINT:
        return (o->width == 8 || (o->width == 4 && o->max <= UINT32_MAX)) && o->min <= o->max;
    case OPT_ENUM:
        return (o->width == 4 || o->width == 8) && o->choices && o->choices[0];
    case OPT_BOOL:
        return o->width == sizeof(bool);
    case OPT_STRING:
        return o->width >= 2; /* a char array, not a pointer: see kvt_config_values */
    }
    return false;
}

static kvt_status set_defaults(kvt_config_values *v)
{
    memset(v, 0, sizeof *v);
    for (size_t i = 0; i < NUM_OPTIONS; i++) {
        if (!row_fits(&OPTIONS[i]))
            return kvt__fail(KVT_EINVAL, "kvt_config_create: option \"%s\": its field does "
                             "not fit its type (a bug in the option table)", OPTIONS[i].name);
        /* A default that does not parse is a bug in the table above. */
        kvt_status st = apply(v, &OPTIONS[i], OPTIONS[i].def, "kvt_config_create: default");
        if (st) return st;
    }
    return KVT_OK;
}

kvt_status kvt_config_create(kvt_config **out)
{
    KVT_CHECK_NOT_NULL(out, "kvt_config_create");
    kvt__clear_error();
    kvt_config *cfg = calloc(1, sizeof *cfg);
    if (!cfg) return kvt__fail(KVT_ENOMEM, "kvt_config_create: out of memory");
    kvt_status st = set_defaults(&cfg->v);
    if (st) {
        free(cfg);
        return st;
    }
    *out = cfg;
    return KVT_OK;
}

void kvt_config_destroy(kvt_config *cfg) { free(cfg); }

kvt_status kvt_config_set(kvt_config *cfg, const char *name, const char *value)
{
    static const char fn[] = "kvt_config_set";
    KVT_CHECK_NOT_NULL(cfg, fn);
    KVT_CHECK_NOT_NULL(name, fn);
    KVT_CHECK_NOT_NULL(value, fn);
    kvt__clear_error();
    const opt_def *o = find_by_name(name);
    if (!o) return fail_unknown(fn, name);
    /* apply() writes only on success, so cfg is unchanged on error. */
    return apply(&cfg->v, o, value, fn);
}

kvt_status kvt_config_get(const kvt_config *cfg, const char *name, char *buf, size_t buf_len)
{
    static const char fn[] = "kvt_config_get";
    KVT_CHECK_NOT_NULL(cfg, fn);
    KVT_CHECK_NOT_NULL(name, fn);
    KVT_CHECK_NOT_NULL(buf, fn);
    kvt__clear_error();
    const opt_def *o = find_by_name(name);
    if (!o) return fail_unknown(fn, name);
    int n = format_value(&cfg->v, o, NULL, 0);
    if (n < 0) return kvt__fail(KVT_EINVAL, "%s: option \"%s\" cannot be formatted", fn, name);
    if ((size_t)n >= buf_len)
        return kvt__fail(KVT_EINVAL, "%s: buf_len is %zu; option \"%s\" needs %d bytes", fn,
                         buf_len, name, n + 1);
    format_value(&cfg->v, o, buf, buf_len);
    return KVT_OK;
}

size_t kvt_config_option_count(void) { return NUM_OPTIONS; }

kvt_status kvt_config_option(size_t index, kvt_option_info *out)
{
    KVT_CHECK_NOT_NULL(out, "kvt_config_option");
    KVT_CHECK_ARG(index < NUM_OPTIONS, "kvt_config_option: index %zu is out of range (%zu options)",
                  index, NUM_OPTIONS);
    kvt__clear_error();
    const opt_def *o = &OPTIONS[index];
    kvt_option_info info = {
        .name = o->name,
        .env = o->env,
        .type = type_name(o->type),
        .default_value = o->def,
        .help = o->help,
    };
    *out = info;
    return KVT_OK;
}

/* ------------------------------------------------------------------ */
/* Digest                                                             */
/* ------------------------------------------------------------------ */

/* kvt_config_digest covers the options the ranks of a group must agree on
 * (rank_local false in OPTIONS), in two halves:
 *  - the high 32 bits hash every such option's name and canonical value (as
 *    kvt_config_get prints it), so any difference shows;
 *  - the low 32 bits hold one field per such option (DIGEST_FIELDS of them,
 *    32 / DIGEST_FIELDS bits each), a hash of that option alone, so the rank
 *    that compares two digests can name the option that differs
 *    (kvt__config_digest_diff) without any more bytes on the wire. With 6
 *    such options a field has 5 bits: two values of one option share their
 *    field once in 32 (it is a hash), and then that difference goes
 *    unnamed, though never unnoticed (the high half differs); the diff says
 *    so rather than naming nothing. Naming every difference would take the
 *    values themselves on the wire. Both ends run the same library version
 *    (the group checks it first), so they agree on the fields. */
#define DIGEST_SEED 0x636f6e666967ull
#define DIGEST_VALUE_MAX 2048

static size_t digest_fields(void)
{
    size_t n = 0;
    for (size_t i = 0; i < NUM_OPTIONS; i++) n += !OPTIONS[i].rank_local;
    return n == 0 ? 1 : n > 32 ? 32 : n;
}

kvt_status kvt_config_digest(const kvt_config *cfg, uint64_t *out)
{
    KVT_CHECK_NOT_NULL(cfg, "kvt_config_digest");
    KVT_CHECK_NOT_NULL(out, "kvt_config_digest");
    size_t fields = digest_fields(), bits = 32 / fields, j = 0;
    uint64_t all = DIGEST_SEED, low = 0, mask = (1ull << bits) - 1;
    for (size_t i = 0; i < NUM_OPTIONS; i++) {
        const opt_def *o = &OPTIONS[i];
        if (o->rank_local) continue;
        char val[DIGEST_VALUE_MAX];
        int n = format_value(&cfg->v, o, val, sizeof val);
        if (n < 0 || (size_t)n >= sizeof val) /* a row wider than DIGEST_VALUE_MAX: a bug */
            return kvt__fail(KVT_EINVAL, "kvt_config_digest: option \"%s\" cannot be formatted "
                             "in %d bytes", o->name, DIGEST_VALUE_MAX);
        uint64_t one = kvt__hash64(o->name, strlen(o->name) + 1, DIGEST_SEED);
        one = kvt__hash64(val, (size_t)n + 1, one);
        all = kvt__hash64(&one, sizeof one, all);
        size_t f = j++ % fields;
        low ^= (one & mask) << (f * bits);
    }
    *out = (all & 0xffffffff00000000ull) | low;
    kvt__clear_error();
    return KVT_OK;
}

size_t kvt__config_digest_diff(uint64_t a, uint64_t b, char *buf, size_t len)
{
    size_t fields = digest_fields(), bits = 32 / fields, j = 0, named = 0, used = 0;
    uint64_t mask = (1ull << bits) - 1;
    if (len) buf[0] = '\0';
    for (size_t i = 0; i < NUM_OPTIONS; i++) {
        if (OPTIONS[i].rank_local) continue;
        size_t f = j++ % fields;
        if (((a >> (f * bits)) & mask) == ((b >> (f * bits)) & mask)) continue;
        int n = snprintf(buf + used, len > used ? len - used : 0, "%s\"%s\"",
                         named ? " or " : "", OPTIONS[i].name);
        if (n > 0) used += (size_t)n;
        named++;
    }
    if (!named && a != b && len) /* the differing option's field collided (1 in 2^bits) */
        snprintf(buf, len, "an option the digest cannot tell (each option's part of it is %zu bits, so one "
                 "difference in %u hides there): compare `kvtier config --dump` on both ranks", bits,
                 1u << bits);
    if (used >= len && len) buf[len - 1] = '\0';
    return named;
}

/* ------------------------------------------------------------------ */
/* JSON                                                               */
/* ------------------------------------------------------------------ */

static bool is_json_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

static kvt_status fail_at(const char *ctx, const char *json, size_t len, size_t off,
                          const char *what)
{
    unsigned line = 1, col = 1;
    for (size_t i = 0; i < off && i < len; i++) {
        if (json[i] == '\n') {
            line++;
            col = 1;
        } else {
            col++;
        }
    }
    size_t rest = off;
    while (rest < len && is_json_space(json[rest])) rest++;
    if (rest >= len)
        return kvt__fail(KVT_EINVAL, "%s: %s at line %u, column %u (byte %zu, the end of the text)",
                         ctx, what, line, col, off);
    /* Quote the rest of that line (a little), unprintable bytes as '?'. */
    char near[24];
    size_t n = 0;
    for (size_t i = off; i < len && json[i] != '\n' && n < sizeof near - 1; i++, n++)
        near[n] = json[i] >= 0x20 && json[i] < 0x7f ? json[i] : '?';
    near[n] = '\0';
    return kvt__fail(KVT_EINVAL, "%s: %s at line %u, column %u (byte %zu, near '%s')", ctx, what,
                     line, col, off, near);
}

/* One member "key": item of the top-level object, applied to v. */
static kvt_status apply_json_member(kvt_config_values *v, const cJSON *item, const char *ctx,
                                    bool *seen)
{
    const char *key = item->string;
    const opt_def *o = find_by_name(key);
    if (!o) return fail_unknown(ctx, key);
    size_t idx = (size_t)(o - OPTIONS);
    if (seen[idx])
        return kvt__fail(KVT_EINVAL, "%s: option \"%s\" appears more than once", ctx, key);
    seen[idx] = true;

    char num[32];
    const char *value;
    if (cJSON_IsString(item)) {
        value = item->valuestring;
    } else if (cJSON_IsBool(item)) {
        if (o->type != OPT_BOOL)
            return kvt__fail(KVT_EINVAL, "%s: option \"%s\" is a %s, not a boolean", ctx, key,
                             type_name(o->type));
        value = cJSON_IsTrue(item) ? "true" : "false";
    } else if (cJSON_IsNumber(item)) {
        if (o->type != OPT_SIZE && o->type != OPT_UINT)
            return kvt__fail(KVT_EINVAL, "%s: option \"%s\" is a%s %s, not a number%s", ctx, key,
                             o->type == OPT_ENUM ? "n" : "", type_name(o->type),
                             o->type == OPT_STRING ? "" : " (use a string)");
        double d = item->valuedouble;
        if (!(d >= 0 && d <= MAX_JSON_INTEGER && d == floor(d)))
            return kvt__fail(KVT_EINVAL,
                             "%s: option \"%s\": %g is not a non-negative integer up to 2^53 "
                             "(use a string for sizes with a suffix)", ctx, key, d);
        snprintf(num, sizeof num, "%llu", (unsigned long long)d);
        value = num;
    } else {
        const char *kind = cJSON_IsNull(item) ? "null" : cJSON_IsArray(item) ? "an array"
                           : cJSON_IsObject(item) ? "an object" : "not a value";
        return kvt__fail(KVT_EINVAL, "%s: option \"%s\" is %s (want a string, number or boolean)",
                         ctx, key, kind);
    }
    return apply(v, o, value, ctx);
}

/* Parses json and applies it to v (a scratch copy: partial on error). */
static kvt_status apply_json(kvt_config_values *v, const char *json, size_t len, const char *ctx)
{
    if (len == 0) return kvt__fail(KVT_EINVAL, "%s: the JSON text is empty", ctx);
    size_t nul = kvt__json_find_nul(json, len);
    if (nul != SIZE_MAX)
        return fail_at(ctx, json, len, nul,
                       "a NUL character (raw or \\u0000) would cut a value short");
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(json, len, &end, 0);
    if (!root) {
        size_t off = end && end >= json && end <= json + len ? (size_t)(end - json) : 0;
        return fail_at(ctx, json, len, off, "invalid JSON");
    }
    kvt_status st = KVT_OK;
    size_t off = end && end >= json && end <= json + len ? (size_t)(end - json) : len;
    while (off < len && is_json_space(json[off])) off++;
    if (off < len) {
        st = fail_at(ctx, json, len, off, "unexpected text after the JSON value");
        goto out;
    }
    if (!cJSON_IsObject(root)) {
        st = kvt__fail(KVT_EINVAL, "%s: the JSON text must be an object {\"option\": value, ...}",
                       ctx);
        goto out;
    }
    bool seen[NUM_OPTIONS] = {false};
    const cJSON *item;
    cJSON_ArrayForEach(item, root) {
        st = apply_json_member(v, item, ctx, seen);
        if (st) goto out;
    }
out:
    cJSON_Delete(root);
    return st;
}

kvt_status kvt_config_load_json(kvt_config *cfg, const char *json, size_t len)
{
    static const char fn[] = "kvt_config_load_json";
    KVT_CHECK_NOT_NULL(cfg, fn);
    KVT_CHECK_NOT_NULL(json, fn);
    kvt__clear_error();
    kvt_config_values tmp = cfg->v;
    kvt_status st = apply_json(&tmp, json, len, fn);
    if (st) return st;
    cfg->v = tmp;
    return KVT_OK;
}

/* strerror_r is the GNU variant under _GNU_SOURCE, the XSI one otherwise. */
static const char *errtext_gnu(char *r, char *buf) { (void)buf; return r; }
static const char *errtext_xsi(int r, char *buf) { return r == 0 ? buf : "unknown error"; }
#define ERRTEXT(e, buf)                                                       \
    _Generic(strerror_r((e), (buf), sizeof(buf)), char *: errtext_gnu,       \
             int: errtext_xsi)(strerror_r((e), (buf), sizeof(buf)), (buf))

/* Reads at most MAX_FILE_BYTES of path into a malloc'd buffer. */
static kvt_status read_file(const char *fn, const char *path, char **out, size_t *out_len)
{
    char eb[128];
    mode_t mode = 0;
    int fd = kvt__open_regular(AT_FDCWD, path, O_RDONLY, &mode);
    if (fd == KVT_NOT_REGULAR)
        return kvt__fail(KVT_EINVAL, "%s: \"%s\" is %s, not a regular file", fn, path,
                         kvt__file_kind(mode));
    if (fd < 0) {
        int e = errno;
        return kvt__fail(e == ENOENT ? KVT_ENOTFOUND : KVT_EIO, "%s: cannot open \"%s\": %s",
                         fn, path, ERRTEXT(e, eb));
    }
    kvt_status st = KVT_OK;
    char *buf = malloc(MAX_FILE_BYTES + 1);
    size_t used = 0;
    if (!buf) {
        st = kvt__fail(KVT_ENOMEM, "%s: out of memory reading \"%s\"", fn, path);
        goto fail_close;
    }
    /* Read one byte past the limit to tell "exactly at" from "over". */
    while (used <= MAX_FILE_BYTES) {
        ssize_t n = read(fd, buf + used, MAX_FILE_BYTES + 1 - used);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            int e = errno;
            st = kvt__fail(KVT_EIO, "%s: cannot read \"%s\": %s", fn, path, ERRTEXT(e, eb));
            goto fail_free;
        }
        if (n == 0) break;
        used += (size_t)n;
    }
    if (used > MAX_FILE_BYTES) {
        st = kvt__fail(KVT_EINVAL, "%s: \"%s\" is larger than %u bytes", fn, path,
                       MAX_FILE_BYTES);
        goto fail_free;
    }
    close(fd);
    *out = buf;
    *out_len = used;
    return KVT_OK;
fail_free:
    free(buf);
fail_close:
    close(fd);
    return st;
}

kvt_status kvt_config_load_file(kvt_config *cfg, const char *path)
{
    static const char fn[] = "kvt_config_load_file";
    KVT_CHECK_NOT_NULL(cfg, fn);
    KVT_CHECK_NOT_NULL(path, fn);
    kvt__clear_error();
    char *text = NULL;
    size_t len = 0;
    kvt_status st = read_file(fn, path, &text, &len);
    if (st) return st;
    char ctx[KVT_ERRMSG_MAX / 2];
    snprintf(ctx, sizeof ctx, "%s: %s", fn, path);
    kvt_config_values tmp = cfg->v;
    st = apply_json(&tmp, text, len, ctx);
    free(text);
    if (st) return st;
    cfg->v = tmp;
    return KVT_OK;
}

/* ------------------------------------------------------------------ */
/* Environment                                                        */
/* ------------------------------------------------------------------ */

static bool is_non_option_env(const char *name, size_t len)
{
    for (size_t i = 0; i < sizeof NON_OPTION_ENV / sizeof NON_OPTION_ENV[0]; i++)
        if (strlen(NON_OPTION_ENV[i]) == len && memcmp(NON_OPTION_ENV[i], name, len) == 0)
            return true;
    return false;
}

static const opt_def *find_by_env(const char *name, size_t len)
{
    for (size_t i = 0; i < NUM_OPTIONS; i++)
        if (strlen(OPTIONS[i].env) == len && memcmp(OPTIONS[i].env, name, len) == 0)
            return &OPTIONS[i];
    return NULL;
}

/* One "KVTIER_X=value" entry of the environment. */
static kvt_status apply_env_entry(kvt_config_values *v, const char *entry)
{
    static const char fn[] = "kvt_config_load_env";
    const char *eq = strchr(entry, '=');
    size_t len = eq ? (size_t)(eq - entry) : strlen(entry);
    const char *value = eq ? eq + 1 : "";
    const opt_def *o = find_by_env(entry, len);
    if (!o && is_non_option_env(entry, len)) return KVT_OK;
    if (!o) {
        char name[EDIT_MAX_LEN + 1];
        int n = len > EDIT_MAX_LEN ? EDIT_MAX_LEN : (int)len;
        snprintf(name, sizeof name, "%.*s", n, entry);
        const opt_def *s = len <= EDIT_MAX_LEN ? suggest(name, true) : NULL;
        if (s)
            return kvt__fail(KVT_EINVAL, "%s: %.*s is not a kvtier option (did you mean %s?)",
                             fn, (int)len, entry, s->env);
        return kvt__fail(KVT_EINVAL,
                         "%s: %.*s is not a kvtier option (kvtier config --dump lists them; "
                         "unset it if it is meant for something else)", fn, (int)len, entry);
    }
    char ctx[64];
    snprintf(ctx, sizeof ctx, "%s: %s", fn, o->env);
    return apply(v, o, value, ctx);
}

/* Reads environ: like getenv, not safe against a concurrent setenv. */
kvt_status kvt_config_load_env(kvt_config *cfg)
{
    KVT_CHECK_NOT_NULL(cfg, "kvt_config_load_env");
    kvt__clear_error();
    kvt_config_values tmp = cfg->v;
    for (char **e = environ; e && *e; e++) {
        if (strncmp(*e, ENV_PREFIX, sizeof ENV_PREFIX - 1) != 0) continue;
        kvt_status st = apply_env_entry(&tmp, *e);
        if (st) return st;
    }
    cfg->v = tmp;
    return KVT_OK;
}

/* ------------------------------------------------------------------ */
/* The environment read outside the option table                      */
/* ------------------------------------------------------------------ */

/* Variables of other software the library reads (only to word a message). */
static const char *const FOREIGN_ENV[] = {"UCX_TLS"};

const char *kvt__config_env(const char *name)
{
    size_t len = strlen(name);
    bool known = find_by_env(name, len) || is_non_option_env(name, len);
    for (size_t i = 0; !known && i < sizeof FOREIGN_ENV / sizeof FOREIGN_ENV[0]; i++)
        known = strcmp(FOREIGN_ENV[i], name) == 0;
    assert(known && "every variable the library reads is declared in util/config.c");
    return known ? getenv(name) : NULL;
}

bool kvt__config_log_env(kvt_log_level *level, const char **dest, char *note, size_t note_len)
{
    *dest = getenv("KVTIER_LOG");
    const opt_def *o = find_by_name("log_level");
    const char *v = getenv(o->env);
    if (!v || !*v) return true;
    for (size_t i = 0; o->choices[i]; i++) {
        if (strcasecmp(v, o->choices[i]) == 0) {
            *level = (kvt_log_level)i;
            return true;
        }
    }
    snprintf(note, note_len, "%s=\"%.40s\" is not error, warn, info or debug", o->env, v);
    return false;
}
