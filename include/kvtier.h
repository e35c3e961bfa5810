/*
 * kvtier.h - the whole public C API of kvtier, a KV-cache offload and
 * transfer engine for LLM inference.
 *
 * Conventions (they hold for every function below unless it says otherwise):
 *  - Every function that can fail returns a kvt_status. KVT_OK is 0, errors
 *    are negative. kvt_strerror() names the class of error; kvt_last_error()
 *    gives the calling thread's message for its most recent failure, naming
 *    the argument, field or peer that was wrong.
 *  - Out-parameters are written only on success.
 *  - Handles are opaque. X_create() hands out a handle the caller owns;
 *    X_destroy(NULL) is a no-op. A handle may not be used after destroy.
 *  - Arguments are always validated (NULL, zero, oversized, mismatched
 *    geometry): bad input returns KVT_EINVAL or KVT_EGEOMETRY with a message;
 *    nothing user-supplied is asserted.
 *  - Pointers passed in are only borrowed for the duration of the call,
 *    except where a function states otherwise (engine memory).
 *  - Above each function that returns a kvt_status, a "Returns:" line lists
 *    every status it can return; the text beside it says when. The lists
 *    are derived from the source (scripts/status_map.py follows every call
 *    a function can make) and a test fails when one goes stale; a listed
 *    status may be unreachable on some paths (the list is a superset).
 *
 * Compiles as C11 and as C++ (extern "C").
 *
 * Every declaration in this header, and nothing else, is exported from
 * libkvtier.so: the library is built with -fvisibility=hidden and the
 * declarations below sit inside a visibility push(default).
 */
#ifndef KVTIER_H
#define KVTIER_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif
#if defined(__GNUC__)
#pragma GCC visibility push(default)
#endif

/* ------------------------------------------------------------------ */
/* Version                                                            */
/* ------------------------------------------------------------------ */

#define KVT_VERSION_MAJOR 0
#define KVT_VERSION_MINOR 1
#define KVT_VERSION_PATCH 0
#define KVT_VERSION_STRING "0.1.0"
/* (major << 16) | (minor << 8) | patch, as kvt_version() returns it. */
#define KVT_VERSION_HEX \
    ((KVT_VERSION_MAJOR << 16) | (KVT_VERSION_MINOR << 8) | KVT_VERSION_PATCH)

/* The version of the library actually loaded (may differ from the header). */
unsigned kvt_version(void);
const char *kvt_version_string(void);

/* sizeof(the public struct named name, e.g. "kvt_engine_memory"), or 0 for
 * an unknown name: bindings that mirror structs (ctypes, cffi) check their
 * layout against the loaded library with it. */
size_t kvt_abi_struct_size(const char *name);

/* ------------------------------------------------------------------ */
/* Status                                                             */
/* ------------------------------------------------------------------ */

/* X(name, value, description): one table yields the enum, kvt_strerror and
 * kvt_status_name, so they can never disagree. Values are stable ABI. */
#define KVT_STATUS_MAP(X)                                                  \
    X(OK, 0, "success")                                                    \
    X(EINVAL, -1, "invalid argument")                                      \
    X(ENOMEM, -2, "out of memory")                                         \
    X(ENOTFOUND, -3, "not found")                                          \
    X(EAGAIN, -4, "not ready yet, try again")                              \
    X(ETIMEDOUT, -5, "deadline expired")                                   \
    X(ECANCELED, -6, "cancelled")                                          \
    X(EIO, -7, "I/O error")                                                \
    X(ENOSPC, -8, "no space left in the tier")                             \
    X(EGEOMETRY, -9, "KV geometry mismatch")                               \
    X(ESTATE, -10, "operation not valid in the current state")             \
    X(EBUSY, -11, "resource busy")                                         \
    X(EFULL, -12, "table or queue full")                                   \
    X(ECORRUPT, -13, "data failed its checksum")                           \
    X(EUNSUPPORTED, -14, "not supported")                                  \
    X(ESYS, -15, "system call failed")                                     \
    X(EPROTO, -16, "protocol violation")                                   \
    X(ECONN, -17, "connection failed or lost")                             \
    X(EABORTED, -18, "group or transfer aborted")                          \
    X(EAUTH, -19, "peer failed authentication")                            \
    X(EVERSION, -20, "version mismatch")

typedef enum kvt_status {
#define KVT_STATUS_ENUM_(name, value, text) KVT_##name = value,
    KVT_STATUS_MAP(KVT_STATUS_ENUM_)
#undef KVT_STATUS_ENUM_
} kvt_status;

/* A static description of the status class; never NULL (unknown codes
 * give "unknown status"). */
const char *kvt_strerror(kvt_status status);
/* The symbolic name, e.g. "KVT_EINVAL"; never NULL. */
const char *kvt_status_name(kvt_status status);
/* The calling thread's message for its most recent failed kvtier call, e.g.
 * "kvt_geometry_set_layer: layer 3 V: head_dim is 0". Empty string if none.
 * Valid until the next kvtier call on this thread. Never NULL. */
const char *kvt_last_error(void);

/* ------------------------------------------------------------------ */
/* Logging                                                            */
/* ------------------------------------------------------------------ */

/* kvtier logs events nobody called about (a refused connection, a dropped
 * link, an SSD tier that stops taking writes): one process-wide logger.
 * Lines as severe as the threshold or more are written to stderr as
 * "kvtier: <level>: <line>", unless a handler is set. The environment sets
 * the start: KVTIER_LOG_LEVEL (error|warn|info|debug, default warn) and
 * KVTIER_LOG (stderr, off, or a file path to append to), read at the first
 * line. The threshold then follows kvt_set_log_level and the log_level
 * option of the config each kvt_cache_create is given. */
typedef enum kvt_log_level {
    KVT_LOG_ERROR = 0,
    KVT_LOG_WARN = 1,
    KVT_LOG_INFO = 2,
    KVT_LOG_DEBUG = 3
} kvt_log_level;

/* Called once per line: line has no trailing newline and is valid only
 * during the call (at most 1023 bytes). Called from whichever kvtier or
 * engine thread logs, possibly from several at once: it must be
 * thread-safe, should return quickly, and must not call kvt_set_log_handler
 * (that deadlocks) or any function that may log. */
typedef void (*kvt_log_fn)(void *user, kvt_log_level level, const char *line);

/* Routes every line to fn(user, ...) instead of the default destination;
 * fn NULL restores it. Any thread, any time. Once it returns, the previous
 * handler is not running and is never called again, so its user data may
 * be freed. user is borrowed until then. Returns KVT_OK. */
/* Returns: KVT_OK. */
kvt_status kvt_set_log_handler(kvt_log_fn fn, void *user);
/* Sets the threshold. Returns KVT_OK, or KVT_EINVAL for a value outside
 * KVT_LOG_ERROR..KVT_LOG_DEBUG. */
/* Returns: KVT_OK, KVT_EINVAL. */
kvt_status kvt_set_log_level(kvt_log_level level);

/* ------------------------------------------------------------------ */
/* Configuration                                                      */
/* ------------------------------------------------------------------ */

/* One table of options. Each has a name ("cpu_capacity"), a default, a help
 * text and an environment variable (KVTIER_CPU_CAPACITY). Values are strings
 * parsed per option: sizes take suffixes K, M, G, KiB, MiB, GiB ("2GiB"). */
typedef struct kvt_config kvt_config;

typedef struct kvt_option_info {
    const char *name;       /* "cpu_capacity" */
    const char *env;        /* "KVTIER_CPU_CAPACITY" */
    const char *type;       /* "size", "uint", "enum", "bool", "string" */
    const char *default_value;
    const char *help;
} kvt_option_info;

/* A config with every option at its default. The caller owns *out. */
/* Returns: KVT_OK, KVT_EINVAL, KVT_ENOMEM. */
kvt_status kvt_config_create(kvt_config **out);
void kvt_config_destroy(kvt_config *cfg);
/* Sets one option from its string form; the value is validated now. */
/* Returns: KVT_OK, KVT_EINVAL. */
kvt_status kvt_config_set(kvt_config *cfg, const char *name, const char *value);
/* Copies the option's current value, as a string, into buf (NUL-terminated).
 * KVT_EINVAL if buf is too small. */
/* Returns: KVT_OK, KVT_EINVAL. */
kvt_status kvt_config_get(const kvt_config *cfg, const char *name, char *buf,
                          size_t buf_len);
/* Applies a JSON object {"name": value, ...} (values: strings, numbers or
 * booleans). All-or-nothing: on error cfg is unchanged. KVT_OK; KVT_EINVAL
 * (cfg or json NULL, empty or invalid JSON, a NUL inside a string, an
 * unknown or repeated option, a value of the wrong type or out of range). */
/* Returns: KVT_OK, KVT_EINVAL. */
kvt_status kvt_config_load_json(kvt_config *cfg, const char *json, size_t len);
/* Reads a file holding such a JSON object. KVT_OK; KVT_EINVAL (as
 * kvt_config_load_json; path NULL; not a regular file - a FIFO is refused,
 * never waited on; larger than 1 MiB); KVT_ENOTFOUND (no such file);
 * KVT_EIO (cannot open or read it); KVT_ENOMEM. */
/* Returns: KVT_OK, KVT_EINVAL, KVT_ENOMEM, KVT_ENOTFOUND, KVT_EIO. */
kvt_status kvt_config_load_file(kvt_config *cfg, const char *path);
/* Applies every KVTIER_* variable that names an option. An unknown KVTIER_*
 * variable is an error (a typo must not be ignored silently). */
/* Returns: KVT_OK, KVT_EINVAL. */
kvt_status kvt_config_load_env(kvt_config *cfg);
/* The option table: kvt_config_option(i) for i < kvt_config_option_count(). */
size_t kvt_config_option_count(void);
/* Returns: KVT_OK, KVT_EINVAL. */
kvt_status kvt_config_option(size_t index, kvt_option_info *out);

/* ------------------------------------------------------------------ */
/* KV geometry                                                        */
/* ------------------------------------------------------------------ */

/* How the engine lays out its paged KV memory.
 *  LAYER_FIRST: one buffer per layer per component (SGLang, vLLM):
 *               buffer[layer][component] = page 0, page 1, ...
 *  PAGE_FIRST:  one buffer of pages; each page holds every layer and
 *               component in order (layer 0 K, layer 0 V, layer 1 K, ...).
 * Within a page, data is token-major: token 0 (all heads), token 1, ... */
typedef enum kvt_layout {
    KVT_LAYOUT_LAYER_FIRST = 0,
    KVT_LAYOUT_PAGE_FIRST = 1
} kvt_layout;

/* K and V, or one component for MLA (latent KV). */
#define KVT_MAX_COMPONENTS 2
#define KVT_MAX_LAYERS 1024

typedef struct kvt_component_spec {
    uint32_t kv_heads;  /* KV heads held by this rank */
    uint32_t head_dim;  /* elements per head */
    uint32_t elem_size; /* bytes per element: 1, 2, 4 or 8 */
} kvt_component_spec;

typedef struct kvt_layer_spec {
    uint32_t num_components; /* 2 (K, V) or 1 (MLA) */
    kvt_component_spec component[KVT_MAX_COMPONENTS];
} kvt_layer_spec;

typedef struct kvt_geometry kvt_geometry;

/* A geometry of num_layers layers, all unset, tokens_per_page tokens per
 * engine page. The caller owns *out. */
/* Returns: KVT_OK, KVT_EINVAL, KVT_ENOMEM. */
kvt_status kvt_geometry_create(kvt_geometry **out, uint32_t num_layers,
                               uint32_t tokens_per_page, kvt_layout layout);
/* A geometry for a known model at tensor-parallel size tp (KV heads are
 * divided across ranks; MLA is replicated). Names: "llama3-8b",
 * "llama3-70b", "deepseek-v3", "tiny" (4 layers, for tests). bf16. */
/* Returns: KVT_OK, KVT_EINVAL, KVT_ENOMEM. */
kvt_status kvt_geometry_preset(kvt_geometry **out, const char *name,
                               uint32_t tokens_per_page, uint32_t tp);
void kvt_geometry_destroy(kvt_geometry *geo);
/* A deep copy. The caller owns *out. */
/* Returns: KVT_OK, KVT_EINVAL, KVT_ENOMEM. */
kvt_status kvt_geometry_clone(const kvt_geometry *geo, kvt_geometry **out);
/* Describes one layer; layers may differ (hybrid and draft models). */
/* Returns: KVT_OK, KVT_EINVAL. */
kvt_status kvt_geometry_set_layer(kvt_geometry *geo, uint32_t layer,
                                  const kvt_layer_spec *spec);
/* Describes layers [first, first + count) identically. */
/* Returns: KVT_OK, KVT_EINVAL. */
kvt_status kvt_geometry_set_layers(kvt_geometry *geo, uint32_t first,
                                   uint32_t count, const kvt_layer_spec *spec);
/* KVT_OK when every layer is set and sane; else KVT_EINVAL with a message
 * naming the layer and field ("layer 3 V: head_dim is 0"). */
/* Returns: KVT_OK, KVT_EINVAL. */
kvt_status kvt_geometry_validate(const kvt_geometry *geo);

typedef struct kvt_geometry_info {
    uint32_t num_layers;
    uint32_t tokens_per_page;
    kvt_layout layout;
    uint64_t bytes_per_token; /* all layers and components */
    uint64_t bytes_per_page;  /* bytes_per_token * tokens_per_page */
    uint64_t digest;          /* equal digests <=> equal geometries */
} kvt_geometry_info;

/* Derived sizes of a validated geometry. */
/* Returns: KVT_OK, KVT_EINVAL. */
kvt_status kvt_geometry_info_get(const kvt_geometry *geo, kvt_geometry_info *out);
/* The description of one layer (as set, or as a preset made it). */
/* Returns: KVT_OK, KVT_EINVAL. */
kvt_status kvt_geometry_layer(const kvt_geometry *geo, uint32_t layer, kvt_layer_spec *out);
/* Bytes one token occupies in one layer's component (heads*head_dim*elem). */
/* Returns: KVT_OK, KVT_EINVAL. */
kvt_status kvt_geometry_token_bytes(const kvt_geometry *geo, uint32_t layer,
                                    uint32_t component, uint64_t *out);
/* KVT_OK if equal; else KVT_EGEOMETRY naming the first field that differs
 * with both values ("layer 5 K: kv_heads 8 vs 4"). */
/* Returns: KVT_OK, KVT_EINVAL, KVT_EGEOMETRY. */
kvt_status kvt_geometry_compare(const kvt_geometry *a, const kvt_geometry *b);

/* ------------------------------------------------------------------ */
/* Requests and engine memory                                         */
/* ------------------------------------------------------------------ */

/* One block's key, chosen by the engine (its page or block hash: SGLang's
 * page hash string, vLLM's block hash bytes): 1..KVT_MAX_KEY_LEN bytes,
 * borrowed for the call. */
#define KVT_MAX_KEY_LEN 256u
/* At most this many keys per request (and num_keys * block_tokens must stay
 * within 2^24 tokens, the bound of a token request). */
#define KVT_MAX_KEYS (1u << 20)

typedef struct kvt_key {
    const void *data;
    uint32_t len;
} kvt_key;

/* A request's blocks and its namespace. The namespace (LoRA id, cache salt,
 * model id; any bytes) is hashed into every block, so requests in different
 * namespaces never share cached KV.
 *
 * Token request (keys NULL): the blocks are cut from tokens, block_tokens
 * tokens each.
 *
 * Keyed request (keys non-NULL): the request names its blocks by the
 * engine's keys instead; key i covers block i, i.e. tokens
 * [i * block_tokens, (i + 1) * block_tokens). tokens must be NULL and
 * num_tokens 0 or num_keys * block_tokens. Block i's identity chains
 * (namespace, block i-1's identity, key i's bytes), so key i's parent is key
 * i-1 and prefix-safe eviction, namespaces, single-owner stores and every
 * other guarantee of token requests hold. A keyed chain never meets a token
 * chain, even with equal bytes. Unlike a token request, a keyed lookup may
 * match every key: the engine keyed only complete pages and there is no
 * "last token" to leave it. A zeroed struct's new fields make a token
 * request, so code written before keys existed is unchanged.
 *
 * Independent keys (flags KVT_REQ_INDEPENDENT_KEYS; keyed requests only):
 * every key is a root of its own. Block i's identity is (namespace, key
 * i's bytes), exactly that of a one-key request of key i, whatever keys
 * come before it in this request. For engines whose keys already commit to
 * their whole prefix and that ask from any page of a sequence (SGLang's
 * HiCache page hashes): many pages in one call instead of a call per page.
 * lookup and peek match the leading run of stored keys; prepare_store plans
 * the keys from the first one not stored up to the next one that is stored
 * or being stored by another task, or repeats a key of the plan
 * (first_token / num_tokens say which;
 * ask again with the keys after the plan for the rest), each block with no
 * parent, so eviction may take any of them first. */
#define KVT_REQ_INDEPENDENT_KEYS 1u
/* Visible at end (flags KVT_REQ_VISIBLE_AT_END; token or keyed requests;
 * prepare_store only, ignored elsewhere): the store's wait and poll report
 * it done only once any other client can look its blocks up. Through a
 * node server the result then comes with the server's answer to the
 * task's end (one round trip: the server commits the blocks there);
 * without it a store is reported as soon as this client's copy ended, and
 * becomes visible to others when the server takes its end, which this
 * client's next call follows. In process a store is visible when it ends
 * either way. */
#define KVT_REQ_VISIBLE_AT_END 2u

/* Bounds of a request, refused above with KVT_EINVAL naming them. */
#define KVT_MAX_REQUEST_TOKENS (1u << 24) /* num_tokens of a token request */
#define KVT_MAX_NS_LEN 4096u              /* ns_len */

typedef struct kvt_request {
    const uint32_t *tokens;
    uint32_t num_tokens; /* at most KVT_MAX_REQUEST_TOKENS */
    const void *ns; /* may be NULL when ns_len is 0 */
    uint32_t ns_len; /* at most KVT_MAX_NS_LEN */
    const kvt_key *keys; /* non-NULL: a keyed request (see above) */
    uint32_t num_keys;
    uint32_t flags; /* KVT_REQ_*, or 0 (see above) */
} kvt_request;

/* The engine's paged KV buffers. kvtier keeps the pointers (not the
 * memory) until the cache is destroyed; the engine keeps the memory valid
 * that long.
 *  LAYER_FIRST: layer_bases[layer * KVT_MAX_COMPONENTS + component] points
 *               at that layer's component buffer of num_pages pages.
 *  PAGE_FIRST:  base points at num_pages pages of bytes_per_page each.
 * buffer_bytes (optional, strongly recommended): the size of each buffer,
 * indexed like layer_bases (PAGE_FIRST: buffer_bytes[0] for base). With it,
 * registration refuses buffers too small for num_pages pages of the cache's
 * geometry (KVT_EGEOMETRY naming the layer), instead of letting a transfer
 * write past them.
 *  Strided (page_strides non-NULL; any geometry layout): the engine's own
 *               strides, for layouts the two above do not describe, with no
 *               copy: SGLang's page_first host pool (every layer's token t
 *               side by side) and page_first_direct (page-major, then
 *               layer), or a view of any page-major or token-major tensor.
 *               For each unit u = layer * KVT_MAX_COMPONENTS + component,
 *               token t of page p starts at
 *                 layer_bases[u] + p * page_strides[u] + t * token_strides[u]
 *               and holds that unit's token bytes (kv_heads x head_dim x
 *               elem_size) contiguously. token_strides NULL: the tokens of
 *               a page are contiguous. buffer_bytes[u] then bounds the bytes
 *               from layer_bases[u] ((num_pages - 1) x page stride +
 *               (tokens_per_page - 1) x token stride + token bytes). A stride
 *               below the token bytes is refused (KVT_EINVAL); that units or
 *               pages do not overlap otherwise is the engine's promise. */
/* Where engine memory lives. A zeroed struct is host memory, so code
 * written before device memory existed is unchanged. */
typedef enum kvt_memory_kind {
    KVT_MEMORY_HOST = 0, /* the CPU copies (memcpy) */
    KVT_MEMORY_CUDA = 1, /* CUDA device memory of device `device` (docs/gpu.md) */
} kvt_memory_kind;

/* KVT_MEMORY_CUDA: every buffer is device memory on CUDA device `device`
 * (the ordinal as the CUDA runtime counts it, honouring
 * CUDA_VISIBLE_DEVICES). kvtier loads the CUDA runtime at run time
 * (dlopen libcudart.so.13 or .12; KVTIER_CUDART names another file), never
 * at link time. Registration fails with KVT_EUNSUPPORTED saying which part
 * is missing when the runtime cannot be loaded or no device is usable, and
 * with KVT_EINVAL when a buffer is not device memory of that device. Host
 * memory registration never touches CUDA. With device memory, the CPU tier
 * is pinned (cudaHostRegister) and copies run on CUDA streams owned by the
 * transfer workers; kvt_cache_layer_event gives a load's per-layer events. */
typedef struct kvt_engine_memory {
    uint32_t num_pages;
    void *base;
    void *const *layer_bases;
    const uint64_t *buffer_bytes;
    kvt_memory_kind kind; /* KVT_MEMORY_HOST (0) or KVT_MEMORY_CUDA */
    int32_t device;       /* KVT_MEMORY_CUDA: the device ordinal; else 0 */
    const uint64_t *page_strides;  /* optional: strided buffers (above) */
    const uint64_t *token_strides; /* optional, with page_strides */
} kvt_engine_memory;

/* ------------------------------------------------------------------ */
/* Cache manager                                                      */
/* ------------------------------------------------------------------ */

/* The calls an engine makes. Thread-safe: any thread may call any function
 * on one cache concurrently, except kvt_cache_destroy, which must not race
 * with any other call on that cache (it frees what they use).
 *
 * Load:  kvt_cache_lookup -> kvt_cache_launch(pages) -> kvt_cache_wait_layer
 *        per layer (optional) -> kvt_cache_wait (or kvt_cache_poll).
 * Store: kvt_cache_prepare_store -> kvt_cache_launch(pages) -> wait or poll.
 * A task that is looked up or prepared but never launched is released by
 * kvt_cache_cancel, or expires after the plan_ttl_ms option.
 * Every task's result is reported exactly once, by wait or by poll. */
typedef struct kvt_cache kvt_cache;
typedef uint64_t kvt_task_id; /* 0 is never a task */

typedef enum kvt_task_kind { KVT_TASK_LOAD = 1, KVT_TASK_STORE = 2 } kvt_task_kind;

/* Copies cfg and geo (both may be destroyed afterwards). Allocates and
 * prefaults the CPU tier now; with ssd_dirs set, opens the SSD tier and
 * recovers the blocks a previous run left there (a directory written for
 * another geometry is refused with KVT_EGEOMETRY naming the field, unless
 * ssd_fresh); with metrics_port set, serves /metrics. The caller owns
 * *out. Refusals name the option and the numbers: KVT_ENOMEM when
 * cpu_capacity is more than the machine can give now (MemAvailable plus
 * free huge pages; memory_check=false skips the check); KVT_ENOSPC when
 * an SSD directory's filesystem cannot hold ssd_capacity (nothing is left
 * behind); KVT_EBUSY when an SSD directory is held by another process (its
 * pid named) or metrics_port is taken; KVT_ECORRUPT when a directory's
 * metadata cannot be read back (ssd_fresh=true starts it over);
 * KVT_EUNSUPPORTED for io=io_uring where the kernel refuses io_uring;
 * KVT_EIO when the SSD journal cannot be written. */
/* Returns: KVT_OK, KVT_EINVAL, KVT_ENOMEM, KVT_EIO, KVT_ENOSPC, KVT_EGEOMETRY, KVT_EBUSY, KVT_ECORRUPT, KVT_EUNSUPPORTED, KVT_ESYS. */
kvt_status kvt_cache_create(kvt_cache **out, const kvt_config *cfg,
                            const kvt_geometry *geo);
/* Cancels every task, waits for the workers, frees the tiers. */
void kvt_cache_destroy(kvt_cache *cache);
/* Tells the cache where the engine's pages are; required before the first
 * launch, allowed once. See kvt_engine_memory for the lifetime. */
/* Returns: KVT_OK, KVT_EINVAL, KVT_ENOMEM, KVT_EGEOMETRY, KVT_ESTATE, KVT_EUNSUPPORTED, KVT_ESYS. */
kvt_status kvt_cache_register_memory(kvt_cache *cache, const kvt_engine_memory *mem);

typedef struct kvt_match {
    kvt_task_id task;        /* 0 when nothing matched */
    uint32_t matched_tokens; /* tokens [0, matched_tokens) can be loaded */
} kvt_match;

/* Finds the longest cached prefix of req. When it is non-empty, its blocks
 * are pinned (never evicted) until the load task ends. matched_tokens is a
 * multiple of the block_tokens option and, for a token request, less than
 * num_tokens (the last token is always left to the engine to compute); a
 * keyed request may match all num_keys * block_tokens tokens. Errors:
 * KVT_EINVAL for a bad request (naming the field, and for keys the index:
 * "req->keys[3].len is 0 (1..256 bytes)"). */
/* Returns: KVT_OK, KVT_EINVAL, KVT_ENOMEM, KVT_EFULL. */
kvt_status kvt_cache_lookup(kvt_cache *cache, const kvt_request *req, kvt_match *out);

/* How many tokens kvt_cache_lookup would match for req now, with nothing
 * pinned, touched, planned or counted (no task, no stats; for a scheduler
 * that only asks, e.g. vLLM's get_num_new_matched_tokens, SGLang's
 * batch_exists). Same request checks and matched-token rule as lookup: a
 * multiple of block_tokens, for a token request less than num_tokens, for a
 * keyed one up to num_keys * block_tokens. The answer may be stale by the
 * time a later lookup runs: the blocks are not pinned, so eviction (or a
 * failed read) may shorten that lookup's match, and a lookup that finds no
 * CPU slot to read SSD blocks into matches fewer; plan with the lookup's
 * matched_tokens. Thread-safe like every kvt_cache_* call. Errors: KVT_EINVAL
 * for a bad request (as lookup) or NULL argument, KVT_ENOMEM. */
/* Returns: KVT_OK, KVT_EINVAL, KVT_ENOMEM. */
kvt_status kvt_cache_peek(kvt_cache *cache, const kvt_request *req, uint32_t *matched_tokens);

typedef struct kvt_store_plan {
    kvt_task_id task;     /* 0 when there is nothing to store */
    uint32_t first_token; /* store tokens [first_token, first_token + num_tokens) */
    uint32_t num_tokens;  /* a multiple of block_tokens; may be 0 */
} kvt_store_plan;

/* Plans the store of req's full blocks that the cache lacks, making room by
 * eviction. Tokens already cached, or being stored by another task, are not
 * stored again. The blocks are invisible to lookups until the store task
 * succeeds; a cancelled or failed store leaves no trace. */
/* Returns: KVT_OK, KVT_EINVAL, KVT_ENOMEM, KVT_EFULL. */
kvt_status kvt_cache_prepare_store(kvt_cache *cache, const kvt_request *req,
                                   kvt_store_plan *out);

/* A page-table entry that a load leaves alone (see kvt_cache_launch). */
#define KVT_PAGE_SKIP UINT32_MAX

/* Starts a looked-up or prepared task. pages is the request's page table:
 * pages[i] is the engine page holding tokens [i*tokens_per_page, ...).
 * It must cover the task's token range; it is copied, not kept.
 * For a load, pages[i] == KVT_PAGE_SKIP copies nothing into that page: the
 * engine keeps its own bytes there (tokens it computed already, or a page
 * another request shares), since a load always starts at block 0. The
 * blocks are still looked up, pinned and counted in the result; only the
 * copy into the skipped pages is left out. A store copies whole blocks, so
 * KVT_PAGE_SKIP in a store's range is KVT_EINVAL. */
/* Returns: KVT_OK, KVT_EINVAL, KVT_ENOTFOUND, KVT_ETIMEDOUT, KVT_ESTATE. */
kvt_status kvt_cache_launch(kvt_cache *cache, kvt_task_id task,
                            const uint32_t *pages, uint32_t num_pages);

typedef struct kvt_task_result {
    kvt_task_id task;
    kvt_task_kind kind;
    /* What the task ended with, one of: KVT_OK; KVT_ETIMEDOUT (its plan
     * expired, or its copy passed its deadline); KVT_ECANCELED; KVT_EIO
     * (an SSD read or a CUDA copy failed, or any failure without a status
     * of its own here); KVT_ECORRUPT (a block failed its checksum: recompute
     * from there); KVT_ENOMEM; KVT_EPROTO (a store whose checksums the
     * node server could not take); KVT_ECONN (kvt_client_*: the server was
     * lost). A load cut short (a block lost on the way) reports why, with
     * the tokens that landed in num_tokens; any other failed load reports
     * num_tokens 0 and bytes 0: none of its pages is to be trusted. */
    kvt_status status;
    uint32_t first_token;
    uint32_t num_tokens;
    uint64_t bytes;
} kvt_task_result;

/* Waits until the task ends or timeout_ms passes (0: do not wait; negative
 * is invalid: every wait has a deadline). On KVT_OK *out holds the task's
 * result (whose own status may be an error) and the task is forgotten.
 * KVT_ETIMEDOUT: still running. KVT_ENOTFOUND: unknown or already reported. */
/* Returns: KVT_OK, KVT_EINVAL, KVT_ENOTFOUND, KVT_ETIMEDOUT, KVT_ESTATE. */
kvt_status kvt_cache_wait(kvt_cache *cache, kvt_task_id task, int64_t timeout_ms,
                          kvt_task_result *out);
/* kvt_cache_wait with timeout 0: KVT_EAGAIN while the task runs. */
/* Returns: KVT_OK, KVT_EINVAL, KVT_ENOTFOUND, KVT_EAGAIN, KVT_ESTATE. */
kvt_status kvt_cache_try_wait(kvt_cache *cache, kvt_task_id task, kvt_task_result *out);
/* For a launched load: waits until layers [0, layer] have landed in the
 * engine's pages, so the forward pass can run layer `layer`. KVT_OK also
 * when the task ended; a failed task gives its error (one of
 * kvt_task_result.status's). */
/* Returns: KVT_OK, KVT_EINVAL, KVT_ENOMEM, KVT_ENOTFOUND, KVT_ETIMEDOUT, KVT_ECANCELED, KVT_EIO, KVT_ESTATE, KVT_ECORRUPT, KVT_EPROTO, KVT_ECONN. */
kvt_status kvt_cache_wait_layer(kvt_cache *cache, kvt_task_id task, uint32_t layer,
                                int64_t timeout_ms);
/* For a launched load on CUDA device memory: the CUDA event (a cudaEvent_t,
 * as void *) that completes when layer `layer`'s copies into the engine's
 * pages have landed. The engine's stream waits on it
 * (cudaStreamWaitEvent(stream, (cudaEvent_t)ev, 0)) instead of a CPU thread
 * blocking in kvt_cache_wait_layer (which keeps working). Blocks only until
 * the layer's copies are enqueued and the event recorded (or timeout_ms).
 * The event belongs to the cache: never destroy it, and enqueue the wait
 * before the task's result is reported (wait or poll), after which the
 * event is reused. KVT_EUNSUPPORTED when the cache's engine memory is host
 * memory; a task that ended with an error gives that error. */
/* Returns: KVT_OK, KVT_EINVAL, KVT_ENOMEM, KVT_ENOTFOUND, KVT_ETIMEDOUT, KVT_ECANCELED, KVT_EIO, KVT_ESTATE, KVT_ECORRUPT, KVT_EUNSUPPORTED, KVT_EPROTO, KVT_ECONN. */
kvt_status kvt_cache_layer_event(kvt_cache *cache, kvt_task_id task, uint32_t layer,
                                 int64_t timeout_ms, void **event);
/* kvt_cache_layer_event, then cudaStreamWaitEvent(stream, event, 0) through
 * kvtier's own CUDA runtime: the engine's stream (a cudaStream_t as void *;
 * NULL is the legacy default stream) waits for layer `layer` without the
 * engine loading CUDA itself (Python: Cache.stream_wait_layer with
 * torch.cuda.current_stream().cuda_stream). Same errors as
 * kvt_cache_layer_event, and KVT_EIO naming the CUDA error. */
/* Returns: KVT_OK, KVT_EINVAL, KVT_ENOMEM, KVT_ENOTFOUND, KVT_ETIMEDOUT, KVT_ECANCELED, KVT_EIO, KVT_ESTATE, KVT_ECORRUPT, KVT_EUNSUPPORTED, KVT_EPROTO, KVT_ECONN. */
kvt_status kvt_cache_stream_wait_layer(kvt_cache *cache, kvt_task_id task, uint32_t layer,
                                       void *stream, int64_t timeout_ms);
/* Cancels a task. A planned task is released at once; a running one stops
 * at its next layer boundary. Its result (KVT_ECANCELED) is still reported
 * once. A cancelled load leaves the engine pages undefined. */
/* Returns: KVT_OK, KVT_EINVAL, KVT_ENOTFOUND. */
kvt_status kvt_cache_cancel(kvt_cache *cache, kvt_task_id task);
/* Reports up to max ended tasks not yet reported, oldest first, in out;
 * *count gets how many. Never blocks. */
/* Returns: KVT_OK, KVT_EINVAL. */
kvt_status kvt_cache_poll(kvt_cache *cache, kvt_task_result *out, uint32_t max,
                          uint32_t *count);

typedef struct kvt_cache_stats {
    uint64_t lookups, lookup_tokens;
    uint64_t hit_tokens;     /* tokens matched, all tiers */
    uint64_t ssd_hit_tokens; /* of hit_tokens, those read back from the SSD tier */
    uint64_t stores, stored_blocks, stored_bytes;
    uint64_t loads, loaded_blocks, loaded_bytes;
    uint64_t evicted_blocks;     /* removed from the cache (every tier) */
    uint64_t cpu_dropped_blocks; /* CPU copies dropped, SSD copy kept */
    uint64_t failed_tasks, cancelled_tasks, expired_tasks;
    uint64_t cpu_blocks_used, cpu_blocks_total, block_bytes;
    uint64_t ssd_blocks_used, ssd_blocks_total;
    uint64_t ssd_written_blocks, ssd_read_blocks, ssd_write_errors, ssd_read_errors;
    uint64_t corrupt_blocks;     /* failed their checksum on an SSD read or a client's load
                                    through the node server: dropped, never served */
    uint64_t recovered_blocks;   /* found in the SSD tier's journal at create */
    uint64_t index_blocks, index_bytes;
    uint64_t tasks_in_flight;
} kvt_cache_stats;

/* Returns: KVT_OK, KVT_EINVAL. */
kvt_status kvt_cache_stats_get(kvt_cache *cache, kvt_cache_stats *out);
/* Waits until every block stored so far has a durable SSD copy (or its
 * write failed), or timeout_ms passes: KVT_OK or KVT_ETIMEDOUT. Returns at
 * once without an SSD tier. Under continuous stores it waits for the tier to
 * drain, so bound it with the timeout. */
/* Returns: KVT_OK, KVT_EINVAL, KVT_ETIMEDOUT. */
kvt_status kvt_cache_flush(kvt_cache *cache, int64_t timeout_ms);
/* The cache's last failure message, whichever thread failed: a copy
 * owned by the calling thread, valid until this thread's next
 * kvt_cache_last_error. kvt_last_error() gives the calling thread's own
 * last failure, which is what threaded code wants. */
const char *kvt_cache_last_error(const kvt_cache *cache);

/* ------------------------------------------------------------------ */
/* Node server and its clients                                        */
/* ------------------------------------------------------------------ */

/* One cache per node that engine processes attach to (docs/server.md).
 * The server owns the CPU tier (in shared memory), the SSD tier, the index,
 * eviction and the SSD mover; it listens on a Unix socket (the
 * server_socket option). A client maps the CPU tier and moves bytes between
 * its engine pages and the tier with its own copy threads; the server only
 * decides, pins, evicts and checks. One socket round trip per call, never
 * per block. */
typedef struct kvt_server kvt_server;
typedef struct kvt_client kvt_client;

/* Creates the server: the listening socket at the server_socket option
 * and, for geo (a declared geometry), its shared CPU tier (memfd) and SSD
 * tier when ssd_dirs is set (recovering what a previous server left). geo
 * NULL: the server serves any geometry, taking each client's at attach;
 * each geometry (with its block size) gets a tier of its own, made at its
 * first attach, drawing on the one cpu_capacity and ssd_capacity every
 * geometry shares (the coldest blocks across them are evicted first), its
 * SSD data in a subdirectory of each ssd_dirs entry named by the
 * geometry's fingerprint; blocks of two geometries never meet. server_max_geometries (default 4 with geo NULL, 1 with a geo)
 * bounds how many. The socket is created with mode 0600 (only
 * this user's processes may attach; peers of another uid are refused, by
 * SO_PEERCRED), or 0660 owned by server_socket_group (its members attach
 * too). With server_secret_file every client proves the secret at attach;
 * server_namespaces restricts the namespaces each uid or group may use
 * (docs/server.md, Security). cfg and geo are copied.
 * KVT_EINVAL: bad argument, server_socket empty or too long, no such
 * server_socket_group, a malformed server_namespaces rule, a secret file
 * that is missing or not 16..1024 bytes.
 * KVT_EBUSY: another server holds the socket or an SSD directory (the
 * message names its pid), or metrics_port is taken. KVT_EGEOMETRY: an SSD
 * directory was written for another geometry. KVT_ENOMEM (cpu_capacity
 * over what the machine can give now), KVT_ENOSPC, KVT_ECORRUPT,
 * KVT_EUNSUPPORTED and KVT_EIO as for kvt_cache_create; KVT_ESYS. The
 * caller owns *out. */
/* Returns: KVT_OK, KVT_EINVAL, KVT_ENOMEM, KVT_EIO, KVT_ENOSPC, KVT_EGEOMETRY, KVT_EBUSY, KVT_EFULL, KVT_ECORRUPT, KVT_EUNSUPPORTED, KVT_ESYS. */
kvt_status kvt_server_create(kvt_server **out, const kvt_config *cfg, const kvt_geometry *geo);
/* Serves clients on the calling thread until kvt_server_stop; then
 * disconnects every client (their tasks are cancelled, pins released),
 * waits up to server_stop_ms for SSD writes to become durable, and returns
 * KVT_OK (or KVT_ETIMEDOUT when writes were still pending at that bound).
 * KVT_ESTATE: already running or already stopped. */
/* Returns: KVT_OK, KVT_EINVAL, KVT_ETIMEDOUT, KVT_ESTATE, KVT_ESYS. */
kvt_status kvt_server_run(kvt_server *srv);
/* Asks run to return. Async-signal-safe (it writes one byte to a pipe), so
 * a SIGTERM/SIGINT handler may call it; also safe from any thread, and
 * before run (run then returns at once). */
void kvt_server_stop(kvt_server *srv);
/* Stops (as kvt_server_stop) if running, then frees everything and removes
 * the socket file. Must not race with a run still in progress: call it
 * after run returned. NULL is a no-op. */
void kvt_server_destroy(kvt_server *srv);

/* One tier of a node server: a geometry with its block size
 * (kvt_server_tier_stats). */
typedef struct kvt_tier_stats {
    char geometry[24];        /* "g" and 16 hex digits: the tier's id in the server's
                               * log lines, SSD subdirectory and metrics label */
    uint32_t num_layers;
    uint32_t tokens_per_page;
    uint32_t block_tokens;
    uint64_t bytes_per_token;
    kvt_cache_stats stats;    /* that tier's alone */
} kvt_tier_stats;

/* The figures of the tiers the server at socket_path holds, one per
 * geometry (and block size), in one round trip on a connection of its own
 * that never attaches: it makes no tier, maps nothing and needs no
 * geometry (kvtier stats). geo NULL: every tier; else that geometry's
 * tiers only (any block size), and KVT_ENOTFOUND when the server holds
 * none, the message naming the geometry's id and the ids it holds. Writes
 * min(*count, max) tiers to out (NULL when max is 0); *count gets how many
 * matched (0 on a server of any geometry before its first attach).
 * timeout_ms (> 0) bounds connecting (a server not listening yet is
 * waited for) and the answer. KVT_ECONN: no server answered in time;
 * KVT_EAUTH, KVT_EVERSION, KVT_EPROTO, KVT_ESYS as for kvt_client_attach;
 * KVT_EINVAL, KVT_EGEOMETRY: a bad argument or geo; KVT_ENOMEM. */
/* Returns: KVT_OK, KVT_EINVAL, KVT_ENOMEM, KVT_ENOTFOUND, KVT_EGEOMETRY, KVT_ESYS, KVT_EPROTO, KVT_ECONN, KVT_EAUTH, KVT_EVERSION. */
kvt_status kvt_server_tier_stats(const char *socket_path, const kvt_geometry *geo,
                                 int64_t timeout_ms, kvt_tier_stats *out, uint32_t max,
                                 uint32_t *count);

/* A node server as a whole (kvt_server_info_get; kvtier stats' header). */
typedef struct kvt_server_info {
    char version[32];            /* the server's kvt_version_string() */
    uint32_t pid;
    uint32_t clients;            /* engine clients attached now (not watchers) */
    uint32_t max_clients;        /* server_max_clients */
    uint32_t geometries;         /* tiers it holds now, one per geometry and block size */
    uint32_t max_geometries;     /* server_max_geometries, resolved */
    uint32_t metrics_port;       /* its /metrics port, 0 when none */
    uint32_t quotas;             /* server_quotas rules (kvt_server_quotas) */
    uint64_t uptime_ms;          /* since kvt_server_create */
    uint64_t cpu_capacity_bytes; /* cpu_capacity, shared by its geometries */
} kvt_server_info;

/* The server at socket_path as a whole, in one round trip on a
 * connection of its own that never attaches (as kvt_server_tier_stats).
 * timeout_ms (> 0) bounds connecting and the answer. KVT_ECONN: no server
 * answered in time; KVT_EAUTH, KVT_EVERSION, KVT_EPROTO, KVT_ESYS as for
 * kvt_client_attach; KVT_EINVAL: a bad argument; KVT_ENOMEM. Thread-safe. */
/* Returns: KVT_OK, KVT_EINVAL, KVT_ENOMEM, KVT_ENOTFOUND, KVT_EGEOMETRY, KVT_ESYS, KVT_EPROTO, KVT_ECONN, KVT_EAUTH, KVT_EVERSION. */
kvt_status kvt_server_info_get(const char *socket_path, int64_t timeout_ms, kvt_server_info *out);

/* One rule of a node server's server_quotas and its use now
 * (kvt_server_quotas). */
typedef struct kvt_quota_usage {
    char prefix[256];        /* the rule's namespace prefix; "-" the default (empty)
                              * namespace, "*" every namespace no other rule matches */
    uint64_t limit_bytes;    /* CPU tier bytes its namespaces may hold */
    uint64_t used_bytes;     /* CPU tier bytes they hold now, over every geometry */
    uint64_t limited_blocks; /* blocks a store or SSD read-back did not get at the quota */
    uint64_t evicted_blocks; /* own coldest blocks given up to make room */
} kvt_quota_usage;

/* The server_quotas rules of the server at socket_path and their use, in
 * one round trip on a connection of its own that never attaches (as
 * kvt_server_tier_stats). Writes min(*count, max) rules to out (NULL when
 * max is 0); *count gets how many the server has (0: no quotas).
 * KVT_ECONN: no server answered in time; KVT_EAUTH, KVT_EVERSION,
 * KVT_EPROTO, KVT_ESYS as for kvt_client_attach; KVT_EINVAL: a bad
 * argument; KVT_ENOMEM. */
/* Returns: KVT_OK, KVT_EINVAL, KVT_ENOMEM, KVT_ENOTFOUND, KVT_EGEOMETRY, KVT_ESYS, KVT_EPROTO, KVT_ECONN, KVT_EAUTH, KVT_EVERSION. */
kvt_status kvt_server_quotas(const char *socket_path, int64_t timeout_ms, kvt_quota_usage *out,
                             uint32_t max, uint32_t *count);

/* The three readings above as one (kvtier stats' report): the server's
 * own figures, its tiers (of geo, or all, as kvt_server_tier_stats) and
 * its quota rules, from one STATS_ALL round trip on a connection of its
 * own that never attaches, so they agree with each other (info->geometries
 * counts every tier, geo or not; info->quotas equals *quota_count). Each
 * part is optional: info NULL, or an array NULL with its max 0 (its count
 * may then be NULL too). Writes min(*tier_count, max_tiers) tiers and
 * min(*quota_count, max_quotas) rules; the counts get how many the server
 * has. timeout_ms (> 0) bounds connecting (a server not listening yet is
 * waited for) and the answer. KVT_ENOTFOUND: geo given and the server
 * holds none of its tiers (the message names the ids it holds);
 * KVT_ECONN: no server answered in time; KVT_EAUTH, KVT_EVERSION,
 * KVT_EPROTO, KVT_ESYS as for kvt_client_attach; KVT_EINVAL,
 * KVT_EGEOMETRY: a bad argument or geo; KVT_ENOMEM. Thread-safe. */
/* Returns: KVT_OK, KVT_EINVAL, KVT_ENOMEM, KVT_ENOTFOUND, KVT_EGEOMETRY, KVT_ESYS, KVT_EPROTO, KVT_ECONN, KVT_EAUTH, KVT_EVERSION. */
kvt_status kvt_server_snapshot(const char *socket_path, const kvt_geometry *geo,
                               int64_t timeout_ms, kvt_server_info *info, kvt_tier_stats *tiers,
                               uint32_t max_tiers, uint32_t *tier_count, kvt_quota_usage *quotas,
                               uint32_t max_quotas, uint32_t *quota_count);

/* ------------------------------------------------------------------ */
/* Cluster tier (docs/cluster.md)                                     */
/* ------------------------------------------------------------------ */

/* A node server's membership of a cluster: it publishes the blocks it
 * holds to a Redis directory (cluster_redis), serves them to peers on
 * cluster_listen (authenticated with cluster_secret_file), and a lookup
 * that misses locally pulls the request's next blocks from the peer that
 * holds them into this node's CPU tier (each pull bounded by
 * cluster_pull_ms; a failed, slow or corrupt pull is a miss). */
typedef struct kvt_cluster kvt_cluster;

/* What a node's cluster tier did since it joined. */
typedef struct kvt_cluster_counters {
    uint64_t pulls;          /* pulls that stored blocks here */
    uint64_t pulled_blocks, pulled_bytes;
    uint64_t pull_failed;    /* pulls that failed (a miss each): peer lost, deadline, ... */
    uint64_t pull_corrupt;   /* of those, blocks that failed their checksum */
    uint64_t pull_skipped;   /* not started: recomputing was faster (cluster_prefill_tps) */
    uint64_t stale;          /* directory entries whose holder no longer had the block */
    uint64_t served, served_blocks; /* pulls this node answered for peers, their blocks */
    uint64_t refused;        /* peers refused: no secret, or cluster_serve_max busy */
    uint64_t dir_lookups, dir_errors; /* directory lookups; failed directory calls */
    uint64_t published, unpublished;  /* block entries written, removed */
    uint64_t queue_dropped;  /* index changes not published (queue full, no memory) */
    uint64_t epoch;          /* this node's epoch: one more at each start */
    uint64_t directory_up;   /* 1 while Redis answers */
    uint64_t pull_bytes_per_s; /* measured pull bandwidth, net of the fixed cost per pull; 0 before one */
    uint64_t publish_backlog;  /* index changes queued or being written to the directory
                                * (every held block while a reconnect republishes): with
                                * directory_up, 0 means peers can find all it stored */
    uint64_t pull_raced;     /* pulls dropped because this node's own clients were storing
                              * the same blocks meanwhile (not failures: those stores
                              * serve them; not in pull_failed) */
    uint64_t dir_redirects;  /* MOVED/ASK answers the directory followed (Redis Cluster
                              * moving slots: a resharding shows here, not as errors) */
} kvt_cluster_counters;

/* Joins srv (made by kvt_server_create, not yet run) to the cluster its
 * options name: cluster_redis (required), cluster_redis_password_file,
 * cluster_redis_user, cluster_sentinel_password_file, cluster_node, cluster_listen, cluster_advertise, cluster_secret_file, cluster_lease_ms,
 * cluster_pull_ms, cluster_prefill_tps, cluster_serve_max, cluster_serve_mib_s,
 * cluster_transport (ucx: UCX's context is made here; UCX unable to start
 * is logged and the node pulls and serves over TCP). Bumps the
 * node's epoch in the directory (entries of its earlier life are never
 * trusted), publishes what the server holds already (recovered from SSD)
 * and starts its threads. KVT_EINVAL: cluster_redis empty, a malformed
 * option (named), or a cluster_listen off loopback without
 * cluster_secret_file, or a password file that cannot be read or is
 * malformed (named), or cluster_redis_user set without a password file
 * or holding a space; KVT_EAUTH: Redis wants a password and none was set,
 * or refused the one in cluster_redis_password_file (as cluster_redis_user
 * when set), or denies that user the directory's keys or commands (NOPERM),
 * or a sentinel wants or refuses cluster_sentinel_password_file (the
 * message says which); KVT_ESTATE: srv already runs, or already joined;
 * KVT_EIO/KVT_EPROTO: Redis answered an error or something unexpected
 * (quoted); KVT_EFULL: a Redis Cluster of more than 64 primaries;
 * KVT_ESYS: cluster_listen cannot be bound (why). A Redis that does not
 * answer (within half of cluster_pull_ms, at most 1 s) is no error: the
 * node serves its local tiers, logs one line, and joins (a new epoch, its
 * holdings published) when Redis answers, retried with backoff up to 5 s.
 * *out is written on KVT_OK only: a refused call, a second join refused
 * with KVT_ESTATE included, leaves it as it was (so passing the joined
 * cluster's handle again keeps it). The caller owns *out: leave after
 * kvt_server_run returned and before kvt_server_destroy. A
 * kvt_server_destroy while still joined stops the cluster first (its
 * threads joined, its lease deleted, a warning logged); kvt_cluster_leave
 * then only frees cl, and kvt_cluster_stats still reads its counters until
 * then. */
/* Returns: KVT_OK, KVT_EINVAL, KVT_ENOMEM, KVT_EIO, KVT_ESTATE, KVT_EFULL, KVT_ESYS, KVT_EPROTO, KVT_ECONN, KVT_EAUTH. */
kvt_status kvt_cluster_join(kvt_server *srv, kvt_cluster **out);
/* Stops serving peers, deletes this node's lease in the directory (its
 * entries stop being trusted at once) and frees cl. NULL: no-op. */
void kvt_cluster_leave(kvt_cluster *cl);
/* A snapshot of cl's counters. Thread-safe. KVT_EINVAL for NULL. */
/* Returns: KVT_OK, KVT_EINVAL. */
kvt_status kvt_cluster_stats(const kvt_cluster *cl, kvt_cluster_counters *out);

/* Attaches to the server at socket_path: retries connecting until
 * timeout_ms (> 0) passes (so a client may start before its server), sends
 * geo, maps the shared CPU tier of that geometry. timeout_ms is also the
 * deadline of every later call on this client. A server of one declared
 * geometry takes only that one; a server of any geometry takes any, making
 * its tier at the first attach (KVT_EFULL when it holds
 * server_max_geometries others; KVT_EINVAL, naming both sizes, when a block
 * is larger than the tier's share; what making a tier can fail with:
 * KVT_EIO, KVT_ENOSPC, KVT_EBUSY, KVT_ECORRUPT, KVT_EUNSUPPORTED). The
 * block size is the server's block_tokens rounded up to whole pages, or
 * KVTIER_BLOCK_TOKENS when set in this process's environment. geo NULL
 * takes the server's declared geometry, or the first one attached (a
 * client that only watches, e.g. kvtier stats, needs to know nothing but
 * the socket; KVT_EGEOMETRY before any).
 * KVT_ECONN: no server answered at socket_path in time (the message names
 * it). KVT_EGEOMETRY: geo differs (the message names the field and both
 * values). KVT_EAUTH: the socket's mode refused this process, or the
 * secret handshake failed (the server wants a secret this client lacks, or
 * the two hold different ones: the client's is read from the file named by
 * KVTIER_SERVER_SECRET_FILE, the server_secret_file option's variable).
 * KVT_EVERSION, KVT_EPROTO, KVT_ESYS, KVT_ENOMEM, KVT_EINVAL.
 * The caller owns *out. */
/* Returns: KVT_OK, KVT_EINVAL, KVT_ENOMEM, KVT_EIO, KVT_ENOSPC, KVT_EGEOMETRY, KVT_EBUSY, KVT_EFULL, KVT_ECORRUPT, KVT_EUNSUPPORTED, KVT_ESYS, KVT_EPROTO, KVT_ECONN, KVT_EAUTH, KVT_EVERSION. */
kvt_status kvt_client_attach(kvt_client **out, const char *socket_path,
                             const kvt_geometry *geo, int64_t timeout_ms);
/* Cancels this client's tasks (the server releases their pins), waits for
 * its copy threads, waits (at most the attach's timeout_ms) for the server
 * to finish checking the last store whose wait returned, so every other
 * client finds it once detach returns, then unmaps the tier and closes the
 * socket. NULL is a no-op. */
void kvt_client_detach(kvt_client *cl);

/* The calls below mirror kvt_cache_* (same arguments, semantics, result
 * reporting and error rules) with these differences:
 *  - every call has the attach deadline for its round trip to the server;
 *    a server that died or stopped answering gives KVT_ECONN naming the
 *    socket; later calls re-attach on their own (one connect per backoff,
 *    10 ms doubling to 1 s, once no copy of this client is running), and
 *    give KVT_ECONN until one succeeds; tasks planned before the loss give
 *    KVT_ECONN at launch (look them up again: the new server may be cold);
 *    a malformed reply gives KVT_EPROTO and drops the connection likewise;
 *    an answer no server gives to that request (a lookup answered
 *    KVT_ETIMEDOUT) gives KVT_EPROTO too, keeping the connection;
 *  - a launched task's copy runs on this client's threads; its result is
 *    reported when the copy ended (a store's pages are free, a load's hold
 *    the KV, as in process; a load cut short by blocks the server could
 *    not read reports why, with the tokens that landed), and its end goes
 *    to the server right after, before any later request of this client
 *    (a connection already cut off or lost reports KVT_ECONN instead);
 *  - kvt_client_launch of a load whose blocks sit on the server's SSD tier
 *    returns at once; the copy starts when the server has read them back
 *    (wait, wait_layer and poll see it end as for any load; cancel ends it
 *    KVT_ECANCELED; reads not done within server_read_ms, 30 s, read from
 *    KVTIER_SERVER_READ_MS at attach, end it KVT_ETIMEDOUT);
 *  - lookup, peek and prepare_store in a namespace the server's server_namespaces
 *    does not allow this client give KVT_EAUTH naming it (and the client's
 *    pid and uid); past its server_client_tasks quota, KVT_EFULL;
 *  - a store sends the server each block's layer checksums, taken in the
 *    copy's pass, and is committed when the server takes its end (this
 *    client's next call follows that, so after it every client sees the
 *    store); a store the server does not commit (the server is lost before
 *    its end arrives) is never visible, as if evicted at once: the client
 *    logs it (warn);
 *  - a load checks every layer of every block against the checksums it
 *    was stored with, in its copy's pass, and reports a layer landed only
 *    when all its blocks match: bytes that changed in the tier after their
 *    store (a stray or torn write) fail the load with KVT_ECORRUPT (wait,
 *    wait_layer and poll report it; the engine recomputes), logged at warn
 *    naming the block and layer, and the server drops those blocks;
 *  - each call polls the socket for its reply for up to server_spin_us
 *    (50 us, read from KVTIER_SERVER_SPIN_US at attach) before it sleeps;
 *  - the client's own copy threads are the workers option (2, read from
 *    KVTIER_WORKERS at attach; a bad value is KVT_EINVAL naming it);
 *  - a client cut off mid-copy (server_copy_ms) gets the store blocks the
 *    server held back from it freed when it re-attaches;
 *  - results are reported by this client's wait or poll only for tasks it
 *    launched or cancelled; a planned task the server expired reports
 *    KVT_ETIMEDOUT at launch.
 * Thread-safe: any thread may call any kvt_client_* function except detach
 * concurrently on one client (round trips are serialised on its socket). */
/* KVT_MEMORY_CUDA (docs/gpu.md): as kvt_cache_register_memory, the runtime
 * and every buffer checked, then the mapping of the server's CPU tier is
 * pinned (cudaHostRegister; again after a re-attach maps a new one) and the
 * client's copies run on CUDA streams of its transfer threads. No layer
 * events: kvt_client_wait_layer returns once the layer's copies completed
 * on those streams. KVT_ECONN when the server is not attached (nothing
 * mapped to pin), KVT_ESYS when cudaHostRegister fails. */
/* Returns: KVT_OK, KVT_EINVAL, KVT_ENOMEM, KVT_EGEOMETRY, KVT_ESTATE, KVT_EFULL, KVT_EUNSUPPORTED, KVT_ESYS, KVT_ECONN. */
kvt_status kvt_client_register_memory(kvt_client *cl, const kvt_engine_memory *mem);
/* Returns: KVT_OK, KVT_EINVAL, KVT_ENOMEM, KVT_EFULL, KVT_EPROTO, KVT_ECONN, KVT_EAUTH, KVT_EVERSION. */
kvt_status kvt_client_lookup(kvt_client *cl, const kvt_request *req, kvt_match *out);
/* kvt_cache_peek on the server, one round trip: nothing pinned, no task
 * (so no server_client_tasks quota, no cancel to send). A namespace this
 * client may not use gives KVT_EAUTH as for lookup; a lost server
 * KVT_ECONN naming the socket. The answer may be stale by the next lookup. */
/* Returns: KVT_OK, KVT_EINVAL, KVT_ENOMEM, KVT_EPROTO, KVT_ECONN, KVT_EAUTH, KVT_EVERSION. */
kvt_status kvt_client_peek(kvt_client *cl, const kvt_request *req, uint32_t *matched_tokens);
/* kvt_client_peek of n requests (1..4096, e.g. one prompt's blocks in each
 * TP rank's namespace) in one round trip: matched_tokens[i] and status[i]
 * per request, status[i] being what kvt_client_peek would return for it
 * (KVT_OK, or KVT_EAUTH for a namespace this client may not use, KVT_EINVAL
 * or KVT_ENOMEM from the server's cache; matched_tokens[i] 0 then). The
 * call itself fails only as a whole: KVT_EINVAL for a bad argument or a
 * request the cache would refuse (named by index, before any round trip),
 * KVT_ENOMEM, KVT_EPROTO, KVT_ECONN, KVT_EVERSION. */
/* Returns: KVT_OK, KVT_EINVAL, KVT_ENOMEM, KVT_EPROTO, KVT_ECONN, KVT_EAUTH, KVT_EVERSION. */
kvt_status kvt_client_peek_many(kvt_client *cl, const kvt_request *reqs, uint32_t n,
                                uint32_t *matched_tokens, kvt_status *status);
/* Returns: KVT_OK, KVT_EINVAL, KVT_ENOMEM, KVT_EFULL, KVT_EPROTO, KVT_ECONN, KVT_EAUTH, KVT_EVERSION. */
kvt_status kvt_client_prepare_store(kvt_client *cl, const kvt_request *req,
                                    kvt_store_plan *out);
/* Returns: KVT_OK, KVT_EINVAL, KVT_ENOMEM, KVT_ENOTFOUND, KVT_ETIMEDOUT, KVT_ECANCELED, KVT_ESTATE, KVT_ECORRUPT, KVT_ESYS, KVT_EPROTO, KVT_ECONN, KVT_EVERSION. */
kvt_status kvt_client_launch(kvt_client *cl, kvt_task_id task, const uint32_t *pages,
                             uint32_t num_pages);
/* Returns: KVT_OK, KVT_EINVAL, KVT_ENOMEM, KVT_ENOTFOUND, KVT_ETIMEDOUT, KVT_ECANCELED, KVT_EIO, KVT_ESTATE, KVT_ECORRUPT, KVT_EPROTO, KVT_ECONN. */
kvt_status kvt_client_wait_layer(kvt_client *cl, kvt_task_id task, uint32_t layer,
                                 int64_t timeout_ms);
/* Returns: KVT_OK, KVT_EINVAL, KVT_ENOTFOUND, KVT_ETIMEDOUT, KVT_ESTATE. */
kvt_status kvt_client_wait(kvt_client *cl, kvt_task_id task, int64_t timeout_ms,
                           kvt_task_result *out);
/* Returns: KVT_OK, KVT_EINVAL. */
kvt_status kvt_client_poll(kvt_client *cl, kvt_task_result *out, uint32_t max,
                           uint32_t *count);
/* Returns: KVT_OK, KVT_EINVAL, KVT_ENOMEM, KVT_ENOTFOUND, KVT_EPROTO, KVT_ECONN, KVT_EVERSION. */
kvt_status kvt_client_cancel(kvt_client *cl, kvt_task_id task);
/* The server's kvt_cache_stats (every client's traffic together). */
/* Returns: KVT_OK, KVT_EINVAL, KVT_ENOMEM, KVT_EPROTO, KVT_ECONN, KVT_EVERSION. */
kvt_status kvt_client_stats(kvt_client *cl, kvt_cache_stats *out);
/* Removes from the server's tier of this client's geometry every block
 * stored under namespace ns (ns_len bytes; NULL/0: the default namespace),
 * from the CPU and the SSD tier, by any client of that geometry (an
 * engine's flush_cache). SSD writes of fresh stores are waited for first
 * (up to 2 s); blocks pinned now (loads in flight, a store in flight
 * below them) stay and are counted in *kept (a later clear takes them).
 * *removed gets the blocks removed. Blocks a restarted server recovered
 * from SSD belong to no namespace until stored again: not removed. A
 * namespace the server's server_namespaces does not allow this client
 * gives KVT_EAUTH naming it; a lost server KVT_ECONN; KVT_EINVAL,
 * KVT_ENOMEM, KVT_EPROTO, KVT_EVERSION as for kvt_client_peek. */
/* Returns: KVT_OK, KVT_EINVAL, KVT_ENOMEM, KVT_EPROTO, KVT_ECONN, KVT_EAUTH, KVT_EVERSION. */
kvt_status kvt_client_clear(kvt_client *cl, const void *ns, uint32_t ns_len, uint32_t *removed,
                            uint32_t *kept);
/* kvt_cache_flush on the server: every block stored so far (by any client)
 * durable on the SSD tier, or KVT_ETIMEDOUT after timeout_ms (0..600000). */
/* Returns: KVT_OK, KVT_EINVAL, KVT_ENOMEM, KVT_ETIMEDOUT, KVT_EPROTO, KVT_ECONN, KVT_EVERSION. */
kvt_status kvt_client_flush(kvt_client *cl, int64_t timeout_ms);

/* ------------------------------------------------------------------ */
/* Emulated engine (test and demo support)                            */
/* ------------------------------------------------------------------ */

/* Paged KV buffers in host memory for a geometry. fill() writes the KV
 * "computed" for a token as a pure function of (namespace, the token's
 * whole prefix, layer, component, head), so any byte loaded later can be
 * checked by verify(). */
typedef struct kvt_emu kvt_emu;

typedef struct kvt_verify_result {
    uint64_t bytes_checked;
    uint64_t mismatches;     /* bytes that differ */
    uint32_t first_bad_token; /* valid when mismatches > 0 */
    uint32_t first_bad_layer;
} kvt_verify_result;

/* Returns: KVT_OK, KVT_EINVAL, KVT_ENOMEM. */
kvt_status kvt_emu_create(kvt_emu **out, const kvt_geometry *geo, uint32_t num_pages);
void kvt_emu_destroy(kvt_emu *emu);
/* Makes this emulated rank hold global heads [first_head, first_head +
 * kv_heads) of every layer, as a tensor-parallel rank does (default 0), so
 * ranks of different TP sizes agree on every head's bytes. */
/* Returns: KVT_OK, KVT_EINVAL. */
kvt_status kvt_emu_set_first_head(kvt_emu *emu, uint32_t first_head);
/* The bytes fill() writes for one token of one (layer, component): len must
 * be kv_heads * head_dim * elem_size of that layer's component. */
/* Returns: KVT_OK, KVT_EINVAL. */
kvt_status kvt_emu_token_kv(const kvt_emu *emu, const kvt_request *req, uint32_t token,
                            uint32_t layer, uint32_t component, void *out, size_t len);
/* The buffers, ready for kvt_cache_register_memory. Valid until destroy. */
/* Returns: KVT_OK, KVT_EINVAL. */
kvt_status kvt_emu_memory(kvt_emu *emu, kvt_engine_memory *out);
/* Computes tokens [first, first + count) of req into the pages of the
 * request's page table (as for kvt_cache_launch). */
/* Returns: KVT_OK, KVT_EINVAL. */
kvt_status kvt_emu_fill(kvt_emu *emu, const kvt_request *req, uint32_t first,
                        uint32_t count, const uint32_t *pages, uint32_t num_pages);
/* Checks tokens [first, first + count) against what fill would write. */
/* Returns: KVT_OK, KVT_EINVAL, KVT_ENOMEM. */
kvt_status kvt_emu_verify(const kvt_emu *emu, const kvt_request *req, uint32_t first,
                          uint32_t count, const uint32_t *pages, uint32_t num_pages,
                          kvt_verify_result *out);
/* Overwrites pages with a poison pattern (a load that misses shows up). */
/* Returns: KVT_OK, KVT_EINVAL. */
kvt_status kvt_emu_poison(kvt_emu *emu, const uint32_t *pages, uint32_t num_pages);

/* ------------------------------------------------------------------ */
/* Rank groups and the multi-rank connector                           */
/* ------------------------------------------------------------------ */

/* Layers: transport (kvt_net) <- rank group (kvt_group) <- connector
 * (kvt_conn, over one kvt_cache per rank). docs/protocol.md gives the wire
 * format, the state machine and why call-count asymmetry cannot
 * desynchronise the ranks.
 *
 * Threading: a kvt_net, kvt_group and kvt_conn are each driven by one thread
 * at a time (the rank's scheduler thread); only kvt_conn_wait_layer and
 * kvt_net_interrupt may be called from another thread. */

/* --- Transports --- */

/* One rank's endpoint: ordered, message-oriented point-to-point links to
 * the other ranks. Every receive has a deadline. */
typedef struct kvt_net kvt_net;
/* The shared state of in-process ranks (ranks as threads of one process). */
typedef struct kvt_fabric kvt_fabric;

#define KVT_NET_MAX_RANKS 256
/* Default and hard upper bound of one message (frame) in bytes. */
#define KVT_NET_DEFAULT_MAX_MSG (4u << 20)
#define KVT_NET_LIMIT_MAX_MSG (64u << 20)

/* Bounded queues between `ranks` in-process ranks, at most `depth` (1..4096)
 * messages per ordered pair. The caller owns *out and destroys it after
 * every kvt_net made from it. */
/* Returns: KVT_OK, KVT_EINVAL, KVT_ENOMEM. */
kvt_status kvt_fabric_create(kvt_fabric **out, uint32_t ranks, uint32_t depth);
void kvt_fabric_destroy(kvt_fabric *fab);
/* Rank `rank`'s endpoint on fab (one per rank). fab must outlive it. */
/* Returns: KVT_OK, KVT_EINVAL, KVT_ENOMEM. */
kvt_status kvt_net_inproc_create(kvt_net **out, kvt_fabric *fab, uint32_t rank);

/* Where a TCP net's messages move once a rank has joined. */
typedef enum kvt_net_transport {
    KVT_NET_TCP = 0, /* the authenticated TCP connection itself */
    KVT_NET_UCX = 1  /* UCX tag messages (UCX_TLS picks tcp, shm, rdma...); the
                        TCP connection stays open as the liveness signal */
} kvt_net_transport;

/* TCP between processes: a star around rank 0 (the hub), which is the only
 * rank that listens; every other rank connects to it and passes the same
 * handshake PD endpoints use. Messages between two non-hub ranks are
 * KVT_EUNSUPPORTED (the group protocol never needs them). */
typedef struct kvt_net_tcp_params {
    uint32_t rank, ranks;
    const char *host;     /* hub's numeric IPv4 address; NULL: "127.0.0.1" */
    uint16_t port;        /* hub's port; 0 on the hub: an ephemeral port */
    const void *secret;   /* NULL: no authentication; else every peer must */
    size_t secret_len;    /* prove it holds these 16..1024 bytes (HMAC-SHA256) */
    uint32_t max_msg;     /* 0: KVT_NET_DEFAULT_MAX_MSG; larger frames refused */
    kvt_net_transport transport; /* 0: KVT_NET_TCP; every rank the same */
    uint32_t allow_insecure; /* 0 (default): a hub whose host is not 127.x
                                needs a secret (KVT_EINVAL otherwise: anyone
                                who reaches the port could join as a rank);
                                1: no secret on a trusted network */
} kvt_net_tcp_params;

/* Creates the endpoint; the hub binds and listens now (so its port can be
 * read before the others start). The caller owns *out. KVT_EINVAL also
 * when the hub would listen beyond loopback with neither secret nor
 * allow_insecure. */
/* Returns: KVT_OK, KVT_EINVAL, KVT_ENOMEM, KVT_ESYS. */
kvt_status kvt_net_tcp_create(kvt_net **out, const kvt_net_tcp_params *params);
/* The hub's bound port (useful with port 0). KVT_EINVAL on a non-hub. */
/* Returns: KVT_OK, KVT_EINVAL. */
kvt_status kvt_net_tcp_port(const kvt_net *net, uint16_t *out);
/* Establishes the links within timeout_ms (> 0). The hub accepts until all
 * ranks - 1 peers have authenticated; a stranger (bad or missing proof,
 * unknown or duplicate rank) is refused, logged to stderr and does not count.
 * Other ranks retry connecting until the deadline. KVT_EAUTH: this rank's
 * proof or the hub's was refused; KVT_EVERSION: the hub speaks another
 * handshake version (the message names both). With KVT_NET_UCX, each link then moves
 * onto UCX: KVT_EUNSUPPORTED when UCX cannot start (libucp missing, or
 * UCX_TLS names nothing usable), KVT_EPROTO when the peer's worker address
 * is malformed. No-op for inproc and callback endpoints. */
/* Returns: KVT_OK, KVT_EINVAL, KVT_ENOMEM, KVT_ETIMEDOUT, KVT_ECANCELED, KVT_EUNSUPPORTED, KVT_ESYS, KVT_EPROTO, KVT_ECONN, KVT_EAUTH, KVT_EVERSION. */
kvt_status kvt_net_connect(kvt_net *net, int64_t timeout_ms);

/* An engine lends its own point-to-point send/receive (e.g. the CPU process
 * group it already has), so kvtier opens no sockets inside the engine.
 * send must deliver len bytes to peer as one message, in order; recv must
 * return exactly one whole message from peer into buf (at most cap bytes,
 * else KVT_EPROTO) within timeout_ms, else KVT_ETIMEDOUT. Both may be called
 * only from the thread driving the group. */
typedef struct kvt_net_callbacks {
    void *ctx;
    kvt_status (*send)(void *ctx, uint32_t peer, const void *buf, size_t len,
                       int64_t timeout_ms);
    kvt_status (*recv)(void *ctx, uint32_t peer, void *buf, size_t cap, size_t *len,
                       int64_t timeout_ms);
} kvt_net_callbacks;

/* Called by a send or recv callback that fails, before it returns the
 * status: its own words (at most 255 bytes kept; NULL clears), which the
 * error kvtier reports then carries after "the engine's send failed" or
 * "... recv failed" (kvt_last_error). Thread-local, like kvt_last_error:
 * it must be called on the thread that runs the callback. */
void kvt_net_callback_error(const char *msg);

/* cb is copied; cb->ctx must stay valid until destroy. max_msg 0: default. */
/* Returns: KVT_OK, KVT_EINVAL, KVT_ENOMEM. */
kvt_status kvt_net_callback_create(kvt_net **out, uint32_t rank, uint32_t ranks,
                                   const kvt_net_callbacks *cb, uint32_t max_msg);
/* Closes the links (TCP sockets). NULL is a no-op. */
void kvt_net_destroy(kvt_net *net);
/* Thread-safe, unlike every other call on a net: ends the waits in progress
 * on this net (inside kvt_net_*, kvt_group_* and kvt_conn_* calls over it)
 * within milliseconds, and fails every later exchange at once, with
 * KVT_ECANCELED ("interrupted"). For shutting a rank down from another
 * thread (the binding's close, a signal-handling thread): afterwards the
 * net, and the group and connector over it, are only good for destroy,
 * once the interrupted calls returned. Callback transports: a wait inside
 * the engine's own callback still ends at that callback's deadline.
 * Idempotent. */
/* Returns: KVT_OK, KVT_EINVAL. */
kvt_status kvt_net_interrupt(kvt_net *net);

/* --- Rank groups --- */

/* pp x cp x tp ranks; rank = (pp_rank * cp + cp_rank) * tp + tp_rank.
 * Roles: the sync leader is rank 0 (pp0/cp0/tp0) and decides; each stage's
 * (cp0, tp0) rank is that stage's leader; the rest are CP/TP members. */
typedef struct kvt_group kvt_group;

typedef enum kvt_group_role {
    KVT_ROLE_SYNC_LEADER = 1,
    KVT_ROLE_STAGE_LEADER = 2,
    KVT_ROLE_MEMBER = 3
} kvt_group_role;

typedef struct kvt_group_params {
    uint32_t pp, cp, tp;      /* pp * cp * tp must equal the net's ranks */
    uint64_t geometry_digest; /* this rank's kvt_geometry_info.digest; equal
                                 within each PP stage (stages may differ) */
    uint64_t config_digest;   /* equal on every rank (see kvt_config_digest) */
    int64_t timeout_ms;       /* every exchange's deadline T, 1..600000; an
                                 abort reaches every rank within 2T */
    uint64_t epoch;           /* the epoch this rank proposes, >= 1; 0 means 1.
                                 The group forms at the largest proposal
                                 (a replacement process passes 0 and learns
                                 the group's epoch in the handshake) */
    int64_t formation_timeout_ms; /* bound B of the handshake, 0..2400000;
                                 0 means 4 x timeout_ms. The sync leader
                                 waits B/2 for the HELLOs; a member waits
                                 3B/4 for its WELCOME. Every rank returns
                                 within B (+ B/8 to tell the leader it gave
                                 up) */
} kvt_group_params;

/* Forms the group: the startup handshake compares protocol version, library
 * version, pp/cp/tp, geometry digest (per stage), configuration digest and
 * role table of every rank with the sync leader's, and refuses on any
 * difference (KVT_EVERSION, KVT_EGEOMETRY or KVT_EINVAL, every rank getting
 * the same message naming the ranks and the field). Two-phase: the group
 * forms on every rank or on none (docs/protocol.md, "Formation"), within
 * params.formation_timeout_ms.
 * net is borrowed and must outlive the group. The caller owns *out. */
/* Returns: KVT_OK, KVT_EINVAL, KVT_ENOMEM, KVT_ETIMEDOUT, KVT_ECANCELED, KVT_ESTATE, KVT_ECORRUPT, KVT_EUNSUPPORTED, KVT_ESYS, KVT_EPROTO, KVT_ECONN, KVT_EAUTH, KVT_EVERSION. */
kvt_status kvt_group_create(kvt_group **out, kvt_net *net, const kvt_group_params *params);
/* NULL is a no-op. Does not destroy the net. */
void kvt_group_destroy(kvt_group *group);
/* Aborts the group now: tells the leader (from a member) or every member
 * (from the leader), best effort within T. reason may be NULL. Later
 * exchanges return KVT_EABORTED until kvt_group_reform. Idempotent. */
/* Returns: KVT_OK, KVT_EINVAL. */
kvt_status kvt_group_abort(kvt_group *group, const char *reason);
/* Re-forms an aborted (or healthy) group: every rank must call it (a
 * replacement process calls kvt_group_create instead); the epoch is agreed
 * in the handshake (the largest of every rank's last formed epoch + 1), so
 * a failed attempt changes nothing and a retry on every rank converges.
 * Frames of older epochs are discarded. Returns within timeout_ms (+ 1/8 of
 * it to tell the leader it gave up); it is the formation budget B. */
/* Returns: KVT_OK, KVT_EINVAL, KVT_ENOMEM, KVT_ETIMEDOUT, KVT_ECANCELED, KVT_ESTATE, KVT_ECORRUPT, KVT_EUNSUPPORTED, KVT_ESYS, KVT_EPROTO, KVT_ECONN, KVT_EAUTH, KVT_EVERSION. */
kvt_status kvt_group_reform(kvt_group *group, int64_t timeout_ms);

typedef struct kvt_group_info {
    uint32_t rank, ranks;
    uint32_t pp_rank, cp_rank, tp_rank;
    kvt_group_role role;
    uint64_t epoch;
    uint64_t steps;  /* exchanges completed in this epoch */
    int aborted;     /* 1 after an abort, until reform */
} kvt_group_info;

/* Returns: KVT_OK, KVT_EINVAL. */
kvt_status kvt_group_info_get(const kvt_group *group, kvt_group_info *out);
/* Why the group aborted or refused to form, naming the rank, channel,
 * expected and received sequence and op; "" while healthy. Never NULL.
 * Valid until the next call on the group. */
const char *kvt_group_diagnostic(const kvt_group *group);
/* A digest of the options every rank of a group must agree on, for
 * kvt_group_params.config_digest: cpu_capacity, block_tokens, max_tasks,
 * plan_ttl_ms, eviction, ssd_capacity. Rank-local options (ssd_dirs,
 * ssd_fresh, io, ssd_queue_depth, workers, huge_pages, log_level) are left
 * out. Group formation refuses a rank whose digest differs from rank 0's,
 * naming the option. KVT_OK; KVT_EINVAL (cfg or out NULL). */
/* Returns: KVT_OK, KVT_EINVAL. */
kvt_status kvt_config_digest(const kvt_config *cfg, uint64_t *out);

/* --- The multi-rank connector --- */

/* Every rank has its own kvt_cache over its own engine memory (its heads,
 * its layers). The engine queues rank-local calls (lookup, load, store,
 * reset) during a scheduler iteration; ONE collective kvt_conn_step per
 * iteration carries them to the sync leader, which decides for all ranks
 * (agreed prefix = minimum over ranks; an op goes ahead only if every rank
 * queued it for the same request bytes; layer counter and generation) and
 * ships the decisions and the group-wide task results back. What a rank
 * queued is data in that one message, never a message of its own, so an
 * extra or missing call on one rank cannot shift the stream.
 *
 * Request ids (rid) are the engine's, unique among a rank's live requests.
 * The connector owns its cache's task reporting: the engine must not call
 * kvt_cache_wait/poll/cancel on it directly. */
typedef struct kvt_conn kvt_conn;

/* group and cache are borrowed and must outlive the connector. */
/* Returns: KVT_OK, KVT_EINVAL, KVT_ENOMEM. */
kvt_status kvt_conn_create(kvt_conn **out, kvt_group *group, kvt_cache *cache);
/* Cancels this rank's tasks and releases their pins. NULL is a no-op. */
void kvt_conn_destroy(kvt_conn *conn);

/* Rank-local: looks req up in this rank's cache now (pinning the match) and
 * queues it for the next step. *local_tokens (may be NULL) gets this rank's
 * match; the agreed one comes with the step. req is copied. */
/* Returns: KVT_OK, KVT_EINVAL, KVT_ENOMEM, KVT_EFULL, KVT_EABORTED. */
kvt_status kvt_conn_lookup(kvt_conn *conn, uint64_t rid, const kvt_request *req,
                           uint32_t *local_tokens);
/* Rank-local: this rank has pages for rid's looked-up prefix and wants it
 * loaded (layerwise: the engine will call kvt_conn_wait_layer). Not calling
 * it (e.g. a failed allocation) makes the step refuse the load on every
 * rank. pages is copied; once the cache has engine memory registered, a
 * page index past it is KVT_EINVAL here, naming it. */
/* Returns: KVT_OK, KVT_EINVAL, KVT_ENOMEM, KVT_EABORTED. */
kvt_status kvt_conn_load(kvt_conn *conn, uint64_t rid, const uint32_t *pages,
                         uint32_t num_pages, int layerwise);
/* Rank-local: plans the store of req's blocks this rank lacks and queues it;
 * it starts only if every rank queued the same request. req, pages copied
 * (page indices checked as kvt_conn_load's).
 * While a load (or store) of a rid has no group result yet, the step refuses
 * another load (or store) of that rid with KVT_EBUSY on every rank, and a
 * load is refused the same way when every layer counter is held: keep the
 * pages until the STORE_DONE / LOAD_DONE event. */
/* Returns: KVT_OK, KVT_EINVAL, KVT_ENOMEM, KVT_EFULL, KVT_EABORTED. */
kvt_status kvt_conn_store(kvt_conn *conn, uint64_t rid, const kvt_request *req,
                          const uint32_t *pages, uint32_t num_pages);
/* Rank-local: asks for a group-wide reset at the next step (every rank's
 * tasks are cancelled there and then). */
/* Returns: KVT_OK, KVT_EINVAL, KVT_EABORTED. */
kvt_status kvt_conn_reset(kvt_conn *conn);
/* Rank-local and never on the wire: collects this rank's ended tasks (to be
 * reported at the next step). Any number of calls, on any rank, e.g. from an
 * eviction path under memory pressure. *ended (may be NULL) gets how many. */
/* Returns: KVT_OK, KVT_EINVAL. */
kvt_status kvt_conn_poll(kvt_conn *conn, uint32_t *ended);
/* Rank-local: waits until layers [0, layer] of rid's running load landed. */
/* Returns: KVT_OK, KVT_EINVAL, KVT_ENOMEM, KVT_ENOTFOUND, KVT_ETIMEDOUT, KVT_ECANCELED, KVT_EIO, KVT_ECORRUPT, KVT_EPROTO, KVT_ECONN. */
kvt_status kvt_conn_wait_layer(kvt_conn *conn, uint64_t rid, uint32_t layer,
                               int64_t timeout_ms);

typedef enum kvt_conn_event_kind {
    KVT_EV_LOAD = 1,       /* decision: load of rid started (status OK) or refused */
    KVT_EV_STORE = 2,      /* decision: store of rid started or refused */
    KVT_EV_LOAD_DONE = 3,  /* group result of a load: OK only if every rank loaded */
    KVT_EV_STORE_DONE = 4, /* group result of a store */
    KVT_EV_RESET = 5       /* every rank's tasks were cancelled */
} kvt_conn_event_kind;

typedef struct kvt_conn_event {
    uint64_t rid;
    kvt_conn_event_kind kind;
    kvt_status status;    /* KVT_OK; refused: KVT_ECANCELED (a rank did not queue
                             it or gave no pages), KVT_EPROTO (ranks named other
                             request bytes), KVT_ENOTFOUND (empty agreed prefix);
                             DONE: the first rank's error */
    uint32_t tokens;      /* LOAD: agreed prefix; DONE: tokens done on every rank */
    uint32_t rank;        /* when status != OK: the first rank that caused it */
    uint32_t counter;     /* LOAD: the leader's layer-completion counter id */
    uint64_t generation;  /* LOAD: the leader's generation for that counter */
    uint64_t step;        /* the engine's step number of the step that emitted it */
} kvt_conn_event;

/* The collective: every rank calls it once per scheduler iteration (queued
 * nothing is fine) with the engine's iteration number `step` (e.g. the
 * forward-step counter SGLang and vLLM keep), which must be the same on
 * every rank for the same iteration; numbers need not be contiguous. Then
 * the events of this step are read with kvt_conn_events (each carries
 * `step`). The sync leader applies a step only after every member
 * acknowledged that it will (docs/protocol.md, "Step"). What the main
 * statuses mean:
 *  KVT_OK       the step's decisions were applied on this rank; if this is
 *               the sync leader, on every rank.
 *  KVT_EINVAL   conn is NULL.
 *  KVT_EABORTED the epoch ended (kvt_group_diagnostic names the rank and
 *               why: a rank passed another step number - "step skew: rank
 *               2 (pp1 cp0 tp0) calls step 8 while rank 0 ... calls step
 *               7" - a lost or silent rank, a corrupt frame, an abort
 *               raised by a rank); this rank's tasks were cancelled and
 *               their pins released, and none of this step's events are
 *               delivered; the engine recomputes and may call
 *               kvt_conn_reform. */
/* Returns: KVT_OK, KVT_EINVAL, KVT_EABORTED. */
kvt_status kvt_conn_step(kvt_conn *conn, uint64_t step);
/* Copies up to max of the pending events, oldest first; *count gets how many. */
/* Returns: KVT_OK, KVT_EINVAL. */
kvt_status kvt_conn_events(kvt_conn *conn, kvt_conn_event *out, uint32_t max,
                           uint32_t *count);
/* Re-forms the group under a new epoch (every rank) and clears the state. */
/* Returns: KVT_OK, KVT_EINVAL, KVT_ENOMEM, KVT_ETIMEDOUT, KVT_ECANCELED, KVT_ESTATE, KVT_ECORRUPT, KVT_EUNSUPPORTED, KVT_ESYS, KVT_EPROTO, KVT_ECONN, KVT_EAUTH, KVT_EVERSION. */
kvt_status kvt_conn_reform(kvt_conn *conn, int64_t timeout_ms);

/* ------------------------------------------------------------------ */
/* Prefill -> decode transfer                                         */
/* ------------------------------------------------------------------ */

/* docs/pd.md gives the bootstrap protocol, the geometry rules and the room
 * state machine. Three roles:
 *  - a bootstrap service: a directory; prefill ranks register their KV
 *    descriptor and data address, decode ranks look up the prefill topology;
 *  - a sender (one per prefill rank): listens; decode ranks connect, send
 *    their complete per-entry descriptor (refused at once, with a message,
 *    when it cannot be converted) and then per-request rooms;
 *  - a receiver (one per decode rank): connects to the prefill ranks that
 *    feed it and receives KV straight into its engine pages.
 * Every page carries an XXH3 checksum the receiver verifies. Every room
 * state has a deadline; a silent peer fails its rooms after peer_timeout_ms.
 * Threading: every kvt_pd_* function is thread-safe, except the *_destroy
 * calls, which must not race with any other call on the same handle. */
typedef struct kvt_pd_bootstrap kvt_pd_bootstrap;
typedef struct kvt_pd_sender kvt_pd_sender;
typedef struct kvt_pd_receiver kvt_pd_receiver;

/* Room states, numerically equal to SGLang's KVPoll. A room only moves
 * forward; FAILED overrides anything but SUCCESS; a cleared room is gone and
 * no late message brings it back. */
typedef enum kvt_pd_poll {
    KVT_PD_FAILED = 0,
    KVT_PD_BOOTSTRAPPING = 1,
    KVT_PD_WAITING_FOR_INPUT = 2,
    KVT_PD_TRANSFERRING = 3,
    KVT_PD_SUCCESS = 4
} kvt_pd_poll;
/* "Failed", "Bootstrapping", "WaitingForInput", "Transferring", "Success"
 * (SGLang's names); "unknown" for any other value. Static storage. */
const char *kvt_pd_poll_name(kvt_pd_poll state);

typedef enum kvt_pd_transport {
    KVT_PD_TCP = 0, /* data over the authenticated TCP connection */
    KVT_PD_UCX = 1  /* data over UCX tag messages (UCX_TLS picks tcp, shm...) */
} kvt_pd_transport;

/* Network settings of any endpoint. Zero fields take the defaults. */
typedef struct kvt_pd_net_params {
    const char *bind_host;    /* numeric IPv4 to listen on; NULL: "127.0.0.1" */
    uint16_t port;            /* 0: an ephemeral port */
    const void *secret;       /* NULL: open; else 16..1024 bytes every peer must */
    size_t secret_len;        /* prove it holds (mutual HMAC-SHA256 challenge),
                                 and every frame after it is authenticated
                                 (AES-256-GMAC per frame, keyed per connection and
                                 direction; docs/pd.md) */
    uint32_t max_frame;       /* bound on one frame's body; 0: 64 MiB (max 256 MiB) */
    kvt_pd_transport transport;
    uint32_t heartbeat_ms;    /* idle links send a ping this often; 0: 100 */
    uint32_t peer_timeout_ms; /* silence that declares a peer dead; 0: 3000 */
    uint32_t allow_insecure;  /* 0 (default): a bootstrap service or sender whose
                                 bind_host is not a 127.x address refuses to
                                 start without a secret (KVT_EINVAL): anyone who
                                 reaches it could register a prefill position,
                                 read the topology or feed decode ranks bytes.
                                 1: start anyway (a trusted, isolated network) */
} kvt_pd_net_params;

/* Where a rank sits: tensor parallel and decode context parallel (DCP: token
 * i lives on DCP rank i % dcp_size at local index i / dcp_size). Prefill
 * ranks normally have dcp_size 1. Layers of 2 components (K, V) are MHA:
 * their heads are split across TP ranks (rank r holds heads [r*kv_heads,
 * (r+1)*kv_heads)); layers of 1 component are MLA: replicated.
 * GQA with fewer KV heads than TP: kv_head_replicas n > 1 consecutive TP
 * ranks hold the same heads (as SGLang and vLLM place them: 4 KV heads at
 * TP 8 is kv_heads 1 per rank, n = 2, rank r holds head r / 2); then rank r
 * holds heads [(r/n)*kv_heads, (r/n+1)*kv_heads) and n must divide tp_size.
 * Each decode rank receives its heads once, from one prefill replica. */
typedef struct kvt_pd_rank {
    uint32_t tp_size, tp_rank;
    uint32_t dcp_size, dcp_rank; /* 0, 0 mean 1, 0 */
    uint32_t kv_head_replicas;   /* 0 or 1: KV heads split across TP; n > 1: n
                                    consecutive TP ranks hold the same heads
                                    (MHA layers only; MLA is always replicated) */
} kvt_pd_rank;

typedef struct kvt_pd_params {
    kvt_pd_net_params net;       /* sender: its data listener; receiver: secret,
                                    transport and timeouts apply */
    const char *bootstrap_host;  /* NULL: "127.0.0.1" */
    uint16_t bootstrap_port;     /* required */
    kvt_pd_rank rank;
    const kvt_geometry *geo;     /* copied */
    const kvt_engine_memory *mem;/* pointers kept until destroy (as for the cache) */
    uint32_t bootstrap_timeout_ms; /* deadline of BOOTSTRAPPING; 0: 30000 */
    uint32_t waiting_timeout_ms;   /* deadline of WAITING_FOR_INPUT; 0: 30000 */
    uint32_t transfer_timeout_ms;  /* deadline of TRANSFERRING; 0: 60000 */
    uint32_t connect_timeout_ms;   /* create's own deadline; 0: 10000 */
    int32_t checksum_threads;      /* where each link computes its page checksums:
                                      1, on a thread of its own, so the link's
                                      thread only moves bytes (faster where cores
                                      are spare: ~15% of a saturated link's CPU);
                                      -1, on the link's thread (no extra thread);
                                      0, auto: 1 on hosts with >= 8 online CPUs
                                      (env KVTIER_PD_CHECKSUM_THREADS=1/0 overrides) */
} kvt_pd_params;

/* Starts the bootstrap service (a listener and its threads). params is
 * copied. The caller owns *out. Without a secret, a live registration of a
 * prefill position is never handed to another address before its lease
 * lapses or it unregisters (only from the host that registered it).
 * Returns KVT_OK; KVT_EINVAL (a NULL argument, a params field out of range,
 * or bind_host beyond 127.x with neither secret nor allow_insecure);
 * KVT_ENOMEM; KVT_ESYS (bind/listen or a thread failed). */
/* Returns: KVT_OK, KVT_EINVAL, KVT_ENOMEM, KVT_ESYS. */
kvt_status kvt_pd_bootstrap_create(kvt_pd_bootstrap **out, const kvt_pd_net_params *params);
/* Returns: KVT_OK, KVT_EINVAL. */
kvt_status kvt_pd_bootstrap_port(const kvt_pd_bootstrap *bs, uint16_t *out);
typedef struct kvt_pd_bootstrap_stats {
    uint32_t prefill_ranks;  /* registered now */
    uint64_t lookups;        /* answered with a topology */
    uint64_t refused;        /* strangers, bad frames and refused registrations */
} kvt_pd_bootstrap_stats;
/* Returns: KVT_OK, KVT_EINVAL. */
kvt_status kvt_pd_bootstrap_stats_get(kvt_pd_bootstrap *bs, kvt_pd_bootstrap_stats *out);
/* Stops and joins its threads (each ends within its frame deadline). */
void kvt_pd_bootstrap_destroy(kvt_pd_bootstrap *bs);

/* A prefill rank: listens, registers with the bootstrap service within
 * connect_timeout_ms. The caller owns *out. Returns KVT_OK; KVT_EINVAL
 * (arguments, as for the bootstrap service: a listener beyond 127.x needs a
 * secret or allow_insecure); KVT_EGEOMETRY (geometry and rank disagree);
 * KVT_ENOMEM; KVT_ESYS; KVT_EBUSY (the service holds live registrations of
 * another TP/DCP configuration, or, without a secret, this position at
 * another address: retried until the deadline, the message says until
 * when); KVT_EFULL; KVT_EAUTH (secrets differ); KVT_ECONN / KVT_ETIMEDOUT
 * (the service did not answer); KVT_EPROTO (it answered garbage, or refused
 * with a status no PD peer refuses with).
 * Connections that have not registered share 16 link slots (the oldest is
 * dropped for a newer one) and must authenticate within
 * min(peer_timeout_ms, 2 s); when all 256 are in use, the link idle
 * longest that carries no room is dropped for a newcomer. */
/* Returns: KVT_OK, KVT_EINVAL, KVT_ENOMEM, KVT_ETIMEDOUT, KVT_EGEOMETRY, KVT_EBUSY, KVT_EFULL, KVT_EUNSUPPORTED, KVT_ESYS, KVT_EPROTO, KVT_ECONN, KVT_EAUTH, KVT_EVERSION. */
kvt_status kvt_pd_sender_create(kvt_pd_sender **out, const kvt_pd_params *params);
/* Returns: KVT_OK, KVT_EINVAL. */
kvt_status kvt_pd_sender_port(const kvt_pd_sender *s, uint16_t *out);
/* Claims a room (the engine has a request with this bootstrap room). It is
 * BOOTSTRAPPING until every decode rank that needs this prefill rank sent
 * its page table, then WAITING_FOR_INPUT. Returns KVT_OK; KVT_EINVAL (s is
 * NULL); KVT_EBUSY (already claimed); KVT_ENOMEM; KVT_EFULL (65536 rooms
 * are open: the message says how many this engine holds uncleared and how
 * many decode ranks opened unclaimed, and whose; decode ranks may hold at
 * most 4096 unclaimed rooms each, over all their links, and 32768 in all,
 * so the engine always has half the table). */
/* Returns: KVT_OK, KVT_EINVAL, KVT_ENOMEM, KVT_EBUSY, KVT_EFULL. */
kvt_status kvt_pd_sender_room(kvt_pd_sender *s, uint64_t room);
/* Hands the room's KV over: pages[i] holds tokens [i*tokens_per_page, ...)
 * of the request's num_tokens tokens; copied. The transfer starts once the
 * decode side's page tables are in; the pages must keep their content until
 * the room is SUCCESS or FAILED. */
/* Returns: KVT_OK, KVT_EINVAL, KVT_ENOMEM, KVT_ENOTFOUND, KVT_ESTATE. */
kvt_status kvt_pd_sender_send(kvt_pd_sender *s, uint64_t room, const uint32_t *pages,
                              uint32_t num_pages, uint32_t num_tokens);
/* Returns: KVT_OK, KVT_EINVAL, KVT_ENOTFOUND. */
kvt_status kvt_pd_sender_poll(kvt_pd_sender *s, uint64_t room, kvt_pd_poll *out);
/* Waits until the room is SUCCESS or FAILED or timeout_ms (>= 0) passes
 * (then KVT_ETIMEDOUT); *out gets the state either way. */
/* Returns: KVT_OK, KVT_EINVAL, KVT_ENOTFOUND, KVT_ETIMEDOUT. */
kvt_status kvt_pd_sender_wait(kvt_pd_sender *s, uint64_t room, int64_t timeout_ms,
                              kvt_pd_poll *out);
/* Fails the room now and tells every peer of it; each acknowledges
 * (kvt_pd_room_info.abort_acks). reason may be NULL. */
/* Returns: KVT_OK, KVT_EINVAL, KVT_ENOTFOUND. */
kvt_status kvt_pd_sender_abort(kvt_pd_sender *s, uint64_t room, const char *reason);
/* Forgets the room (any state); late messages about it are ignored. */
/* Returns: KVT_OK, KVT_EINVAL, KVT_ENOTFOUND. */
kvt_status kvt_pd_sender_clear(kvt_pd_sender *s, uint64_t room);
void kvt_pd_sender_destroy(kvt_pd_sender *s);

typedef struct kvt_pd_room_params {
    const uint32_t *pages;   /* this rank's page table (copied): with DCP, of
                                its local tokens i / dcp_size */
    uint32_t num_pages;
    uint32_t num_tokens;     /* the request's tokens (global) */
    uint32_t prefix_tokens;  /* tokens [0, prefix) already here: not sent */
} kvt_pd_room_params;

/* A decode rank: looks the prefill topology up (retrying until every
 * prefill rank it needs registered), connects to the prefill ranks that
 * feed it (redialling one that drops the connection before the handshake
 * ends) and registers its descriptor, all within connect_timeout_ms.
 * Returns KVT_OK; KVT_EINVAL (arguments); KVT_EGEOMETRY with a message
 * naming the entry, field and both values when a pair cannot be converted;
 * KVT_ETIMEDOUT naming the prefill ranks still missing at the deadline;
 * KVT_EAUTH (secrets differ); KVT_ECONN (a peer unreachable until the
 * deadline); KVT_EPROTO; KVT_EFULL (more than 256 prefill peers);
 * KVT_ENOMEM; KVT_ESYS; or the status the service or a prefill rank refused
 * with (one of KVT_EINVAL, KVT_ENOMEM, KVT_EBUSY, KVT_EFULL, KVT_EGEOMETRY,
 * KVT_EUNSUPPORTED, KVT_EPROTO, KVT_EAUTH, KVT_EVERSION; any other refusal
 * is KVT_EPROTO, as for the sender). A link that dies is redialled in the
 * background; a room whose part from that prefill rank was done (DONE,
 * every page verified) does not fail with it (docs/pd.md). */
/* Returns: KVT_OK, KVT_EINVAL, KVT_ENOMEM, KVT_ETIMEDOUT, KVT_EGEOMETRY, KVT_EBUSY, KVT_EFULL, KVT_EUNSUPPORTED, KVT_ESYS, KVT_EPROTO, KVT_ECONN, KVT_EAUTH, KVT_EVERSION. */
kvt_status kvt_pd_receiver_create(kvt_pd_receiver **out, const kvt_pd_params *params);
/* Opens a room and sends its page table to the prefill ranks. The page
 * table must name each engine page once (KVT_EINVAL otherwise); room ids
 * may be reused once both sides cleared the room. */
/* Returns: KVT_OK, KVT_EINVAL, KVT_ENOMEM, KVT_EBUSY, KVT_EFULL. */
kvt_status kvt_pd_receiver_room(kvt_pd_receiver *r, uint64_t room,
                                const kvt_pd_room_params *params);
/* Returns: KVT_OK, KVT_EINVAL, KVT_ENOTFOUND. */
kvt_status kvt_pd_receiver_poll(kvt_pd_receiver *r, uint64_t room, kvt_pd_poll *out);
/* Returns: KVT_OK, KVT_EINVAL, KVT_ENOTFOUND, KVT_ETIMEDOUT. */
kvt_status kvt_pd_receiver_wait(kvt_pd_receiver *r, uint64_t room, int64_t timeout_ms,
                                kvt_pd_poll *out);
/* Returns: KVT_OK, KVT_EINVAL, KVT_ENOTFOUND, KVT_ETIMEDOUT. */
kvt_status kvt_pd_receiver_abort(kvt_pd_receiver *r, uint64_t room, const char *reason);
/* Returns: KVT_OK, KVT_EINVAL, KVT_ENOTFOUND, KVT_ETIMEDOUT. */
kvt_status kvt_pd_receiver_clear(kvt_pd_receiver *r, uint64_t room);
void kvt_pd_receiver_destroy(kvt_pd_receiver *r);

typedef struct kvt_pd_room_info {
    kvt_pd_poll state;
    kvt_status error;       /* why it FAILED: ETIMEDOUT, ECONN, ECORRUPT, EABORTED,
                               EAUTH (a frame failed authentication: altered in
                               transit, with a secret set), EVERSION (the link
                               met a peer of another PD wire version)... */
    char message[160];      /* FAILED: the reason in words; while live, what the room
                               waits for ("1 of 2 decode ranks opened the room"); "" once
                               SUCCESS */
    uint64_t bytes;         /* payload bytes moved so far */
    uint32_t abort_acks;    /* peers that acknowledged our abort */
    uint32_t peers;         /* peers this room involves */
} kvt_pd_room_info;
/* Details of a room; exactly one of s, r is non-NULL. */
/* Returns: KVT_OK, KVT_EINVAL, KVT_ENOTFOUND. */
kvt_status kvt_pd_room_info_get(kvt_pd_sender *s, kvt_pd_receiver *r, uint64_t room,
                                kvt_pd_room_info *out);

#if defined(__GNUC__)
#pragma GCC visibility pop
#endif
#ifdef __cplusplus
}
#endif
#endif /* KVTIER_H */
