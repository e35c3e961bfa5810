/* server.c - the node server: create, run, stop, destroy (kvt_server_* in
 * kvtier.h; docs/server.md). One thread accepts; one thread per attached
 * client serves its requests (conn.c), so a slow client stalls only itself. */
#include "server/server.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include "cache/cache.h"
#include "cache/observe.h"
#include "cache/quota.h"
#include "cache/share.h"
#include "index/index.h"
#include "metrics/metrics.h"
#include "util/err.h"
#include "util/file.h"
#include "layout/layout.h"
#include "util/clock.h"
#include "util/hash.h"
#include "util/log.h"

/* Takes the lock file at path, writing our pid into it; when another
 * process holds it, KVT_EBUSY naming that process's pid and what. */
static kvt_status take_lock(const char *path, const char *what, int *out)
{
    static const char fn[] = "kvt_server_create";
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0)
        return kvt__fail(KVT_ESYS, "%s: cannot open lock file %s: %s", fn, path, strerror(errno));
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        char buf[32] = {0};
        ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
        close(fd);
        long pid = n > 0 ? strtol(buf, NULL, 10) : 0;
        return kvt__fail(KVT_EBUSY, "%s: %s is held by another kvtier server (pid %ld, lock "
                         "file %s)", fn, what, pid, path);
    }
    char buf[32];
    int len = snprintf(buf, sizeof buf, "%ld\n", (long)getpid());
    if (ftruncate(fd, 0) != 0 || pwrite(fd, buf, (size_t)len, 0) != len) {
        int e = errno;
        close(fd);
        return kvt__fail(KVT_ESYS, "%s: cannot write lock file %s: %s", fn, path, strerror(e));
    }
    *out = fd;
    return KVT_OK;
}

/* Each SSD directory gets a server lock naming its holder, on top of the
 * store's own lock (which refuses any second user but cannot say who). */
static kvt_status lock_ssd_dirs(kvt_server *s)
{
    char dirs[sizeof s->cfg.ssd_dirs];
    snprintf(dirs, sizeof dirs, "%s", s->cfg.ssd_dirs);
    char *save = NULL;
    for (char *d = strtok_r(dirs, ",", &save); d; d = strtok_r(NULL, ",", &save)) {
        if (!*d) continue;
        if (s->num_ssd_locks == KVT_SRV_MAX_SSD_LOCKS)
            return kvt__fail(KVT_EINVAL, "kvt_server_create: more than %u ssd_dirs",
                             KVT_SRV_MAX_SSD_LOCKS);
        mkdir(d, 0700); /* the store creates it too; an error shows below */
        char path[1100], what[1100];
        snprintf(path, sizeof path, "%s/kvtier.server.lock", d);
        snprintf(what, sizeof what, "SSD directory %s", d);
        kvt_status st = take_lock(path, what, &s->ssd_lock_fds[s->num_ssd_locks]);
        if (st) return st;
        s->num_ssd_locks++;
    }
    return KVT_OK;
}

static kvt_status listen_on(kvt_server *s)
{
    static const char fn[] = "kvt_server_create";
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof a.sun_path, "%s", s->path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return kvt__fail(KVT_ESYS, "%s: socket: %s", fn, strerror(errno));
    /* We hold the lock: a socket file left at the path is a dead server's. */
    unlink(s->path);
    /* Created 0600, only this user may attach, or 0660 owned by
     * server_socket_group: Linux gives the socket file the socket inode's
     * mode (less the umask), so no process-wide umask change is needed; the
     * chmod after bind is belt and braces (and the group's mode needs it
     * after the chown). */
    mode_t mode = s->grouped ? 0660 : 0600;
    int rc = fchmod(fd, s->grouped ? 0600 : mode);
    if (rc == 0) rc = bind(fd, (struct sockaddr *)&a, sizeof a);
    int e = errno;
    if (rc == 0 && s->grouped && chown(s->path, (uid_t)-1, s->group) != 0) e = errno, rc = -1;
    if (rc == 0 && chmod(s->path, mode) != 0) e = errno, rc = -1;
    if (rc != 0 || listen(fd, 128) != 0) {
        if (rc == 0) e = errno;
        close(fd);
        return kvt__fail(KVT_ESYS, "%s: cannot listen on %s: %s", fn, s->path, strerror(e));
    }
    s->listen_fd = fd;
    return KVT_OK;
}

/* events_endpoint: one publisher for every shard's index. */
static kvt_status start_events(kvt_server *s)
{
    kvt_events_config ec = {s->cfg.events_endpoint, s->cfg.events_replay_endpoint,
                            s->cfg.events_topic, s->cfg.events_dp_rank,
                            s->cfg.events_buffer_steps, NULL, 0, s->cfg.events_insecure,
                            s->cfg.ssd_dirs[0] != '\0', s->max_shards > 1};
    uint8_t *secret = NULL;
    kvt_status st = KVT_OK;
    if (s->cfg.events_secret_file[0])
        st = kvt__srv_secret_load(s->cfg.events_secret_file, "kvt_server_create: "
                                  "events_secret_file", &secret, &ec.secret_len);
    ec.secret = secret;
    bool has_secret = secret != NULL;
    if (!st) st = kvt__events_start(&s->events, &ec);
    kvt__srv_secret_free(secret, ec.secret_len);
    if (st) return kvt__wrap_error(st, "kvt_server_create");
    bool here = !kvt__events_endpoint_check(ec.endpoint, "events_endpoint", false) &&
                (!ec.replay_endpoint[0] ||
                 !kvt__events_endpoint_check(ec.replay_endpoint, "events_replay_endpoint", false));
    kvt__clear_error(); /* the checks above only ask */
    if (!has_secret && !here)
        kvt__log(KVT_LOG_WARN, "events: %s%s%s is off this host with no secret "
                 "(events_insecure): anyone who reaches it reads which blocks this node holds",
                 ec.endpoint, ec.replay_endpoint[0] ? " / " : "", ec.replay_endpoint);
    else if (has_secret)
        kvt__log(KVT_LOG_INFO, "events: CURVE on %s%s%s, keys from events_secret_file",
                 ec.endpoint, ec.replay_endpoint[0] ? " / " : "", ec.replay_endpoint);
    return KVT_OK;
}

/* server_quotas: one kvt_quota every shard's cache charges. */
static kvt_status make_quota(kvt_server *s)
{
    s->quota = malloc(sizeof *s->quota);
    if (!s->quota) return kvt__fail(KVT_ENOMEM, "kvt_server_create: out of memory");
    kvt_status st = kvt__quota_parse(s->cfg.server_quotas, "server_quotas", s->quota);
    if (st) kvt__wrap_error(st, "kvt_server_create");
    return st;
}

/* server_socket_group, server_namespaces, server_quotas and server_secret_file. */
static kvt_status security(kvt_server *s)
{
    kvt_status st = KVT_OK;
    if (s->cfg.server_socket_group[0]) {
        st = kvt__srv_group(s->cfg.server_socket_group, &s->group);
        s->grouped = st == KVT_OK;
    }
    if (!st && (st = kvt__srv_ns_parse(s->cfg.server_namespaces, &s->ns)))
        kvt__wrap_error(st, "kvt_server_create");
    if (!st && s->cfg.server_quotas[0]) st = make_quota(s);
    if (!st && s->cfg.events_endpoint[0]) st = start_events(s);
    if (!st && sodium_init() < 0)
        st = kvt__fail(KVT_ESYS, "kvt_server_create: libsodium failed to initialise");
    if (!st && s->cfg.server_secret_file[0])
        st = kvt__srv_secret_load(s->cfg.server_secret_file, "kvt_server_create: "
                                  "server_secret_file", &s->secret, &s->secret_len);
    return st;
}

/* ------------------------------------------------------------------ */
/* Shards: one tier per geometry                                      */

/* The block size a client gets when it asks for none: the block_tokens
 * option, rounded up to a whole number of the geometry's pages. */
static uint32_t default_block_tokens(const kvt_server *s, const kvt_geometry *geo)
{
    uint32_t tpp = geo->tokens_per_page ? geo->tokens_per_page : 1;
    return (s->cfg.block_tokens + tpp - 1) / tpp * tpp;
}

static kvt_status fingerprint(const kvt_geometry *geo, uint32_t bt, uint64_t *out)
{
    kvt_srv_buf b = {0};
    kvt_status st = kvt__srv_hello_encode(&b, 0, geo, bt);
    if (!st) *out = kvt__hash64(b.p, b.len, 0x6b767467656f6du);
    kvt__srv_buf_free(&b);
    return st;
}

/* The shard's options: with one geometry the server's own (SSD directories
 * as given, so a server of one model keeps its data where it always was,
 * and its cache serves metrics_port); with several, the whole cpu_capacity
 * and ssd_capacity (shared with the other geometries through s->share:
 * cache/share.h; cpu_capacity checked against the machine once, at server
 * create), its SSD data in a subdirectory named by its id, and no endpoint
 * (the server's own serves every shard: start_metrics). */
static kvt_status shard_config(const kvt_server *s, const kvt_srv_shard *sh, kvt_config *out)
{
    out->v = s->cfg;
    out->v.block_tokens = sh->block_tokens;
    if (s->max_shards == 1) return KVT_OK;
    out->v.metrics_port = 0;
    out->v.memory_check = false;
    char dirs[sizeof s->cfg.ssd_dirs], *save = NULL;
    snprintf(dirs, sizeof dirs, "%s", s->cfg.ssd_dirs);
    size_t used = 0;
    out->v.ssd_dirs[0] = '\0';
    for (char *d = strtok_r(dirs, ",", &save); d; d = strtok_r(NULL, ",", &save)) {
        if (!*d) continue;
        int n = snprintf(out->v.ssd_dirs + used, sizeof out->v.ssd_dirs - used, "%s%s/%s",
                         used ? "," : "", d, sh->id);
        if (n < 0 || (size_t)n >= sizeof out->v.ssd_dirs - used)
            return kvt__fail(KVT_EINVAL, "kvt_server: ssd_dirs \"%s\" with a geometry "
                             "subdirectory (%s) is longer than %zu bytes", s->cfg.ssd_dirs,
                             sh->id, sizeof out->v.ssd_dirs - 1);
        used += (size_t)n;
    }
    return KVT_OK;
}

static void srv_metrics(kvt_mbuf *b, void *arg);

/* Each shard index's one observer: the KV events publisher and the hooks'
 * (kvt__srv_set_hooks). While the hooks are being set on a shard whose
 * events heard its blocks already, its replay goes to the hooks only. */
static void shard_observe(void *arg, kvt_index_event e, const kvt_index *idx, const uint32_t *ids,
                          uint32_t n)
{
    kvt_srv_shard *sh = arg;
    kvt_server *s = sh->server;
    if (sh->events.ev && !sh->replay_to_hooks) kvt__events_observe(&sh->events, e, idx, ids, n);
    if (s->hooks.observe) s->hooks.observe(s->hooks.arg, sh, e, idx, ids, n);
}

/* The events' tier query (events.h kvt_events_src): the shard cache's. */
static uint8_t shard_tiers(const void *cache, uint32_t id)
{
    return kvt__cache_tiers_of(cache, id);
}

static void shard_free(kvt_srv_shard *sh)
{
    if (!sh) return;
    if (sh->cache) kvt__cache_observe_index(sh->cache, NULL, NULL);
    if (sh->cache) kvt__metrics_cache_set_extra(sh->cache, NULL, NULL);
    if (sh->cache) kvt__metrics_cache_stop(sh->cache); /* a scrape reads what goes next */
    kvt__cache_destroy(sh->cache);
    if (sh->roots.limit) kvt__srv_roots_free(&sh->roots);
    kvt__srv_sums_destroy(&sh->sums);
    kvt_geometry_destroy(sh->geo);
    free(sh);
}

static kvt_status shard_create(kvt_server *s, const kvt_geometry *geo, uint32_t bt,
                               uint64_t fp, kvt_srv_shard **out)
{
    kvt_srv_shard *sh = calloc(1, sizeof *sh);
    if (!sh) return kvt__fail(KVT_ENOMEM, "kvt_server: out of memory");
    sh->server = s;
    sh->block_tokens = bt;
    sh->fingerprint = fp;
    snprintf(sh->id, sizeof sh->id, "g%016llx", (unsigned long long)fp);
    snprintf(sh->label, sizeof sh->label, "geometry=\"%s\"", sh->id);
    kvt_config cfg;
    kvt_status st = shard_config(s, sh, &cfg);
    if (!st) st = kvt_geometry_clone(geo, &sh->geo);
    if (!st) st = s->share ? kvt__cache_create_shared(&sh->cache, &cfg, geo, s->share)
                           : kvt__cache_create_ex(&sh->cache, &cfg, geo, true);
    /* With one geometry the tier's cache serves metrics_port (shard_config);
     * last, since a scrape may come at once and reads the whole cache. */
    if (!st) st = kvt__metrics_cache_start(sh->cache);
    if (st) {
        if (s->max_shards > 1) {
            char what[160];
            snprintf(what, sizeof what, "the tier of geometry %s (cpu_capacity %llu bytes, shared "
                     "by every geometry; block_tokens %u)", sh->id,
                     (unsigned long long)cfg.v.cpu_capacity, bt);
            kvt__wrap_error(st, what);
        }
        shard_free(sh);
        return st;
    }
    kvt__cache_ext_shm(sh->cache, &sh->shm);
    st = kvt__srv_sums_init(&sh->sums, kvt__cache_ext_entries(sh->cache), geo->num_layers);
    if (st) {
        shard_free(sh);
        return st;
    }
    kvt__srv_roots_init(&sh->roots, kvt__index_capacity(sh->cache->index));
    if (s->quota) kvt__cache_set_quota(sh->cache, s->quota); /* before any client has it */
    if (s->events) sh->events = (kvt_events_src){s->events, bt, shard_tiers, sh->cache};
    if (s->events || s->hooks.observe) kvt__cache_observe_index(sh->cache, shard_observe, sh);
    if (s->max_shards == 1) kvt__metrics_cache_set_extra(sh->cache, srv_metrics, s);
    *out = sh;
    return KVT_OK;
}

/* Several geometries draw on one cpu_capacity. Their tiers are backed as
 * they fill, so the machine is checked here, once, for the total (as
 * kvt_cache_create checks a tier it prefaults). */

static kvt_status make_share(kvt_server *s)
{
    uint64_t avail = s->cfg.memory_check ? kvt__mem_available() : 0;
    if (avail && s->cfg.cpu_capacity > avail)
        return kvt__fail(KVT_ENOMEM, "kvt_server_create: cpu_capacity is %llu bytes, more than "
                         "this machine can give now (%llu bytes: MemAvailable plus free huge "
                         "pages); lower cpu_capacity, or set memory_check=false to try anyway",
                         (unsigned long long)s->cfg.cpu_capacity, (unsigned long long)avail);
    kvt_status st = s->cfg.ssd_dirs[0]
                        ? kvt__srv_check_ssd_space(s->cfg.ssd_dirs, s->cfg.ssd_capacity)
                        : KVT_OK;
    if (st) return st;
    return kvt__share_create(&s->share, s->cfg.cpu_capacity,
                             s->cfg.ssd_dirs[0] ? s->cfg.ssd_capacity : 0);
}

uint32_t kvt__srv_quota_usage(const kvt_server *s, kvt_srv_quota *out)
{
    const kvt_quota *q = s->quota;
    uint32_t n = q ? q->n : 0;
    for (uint32_t i = 0; i < n; i++) {
        kvt_srv_quota *o = &out[i];
        snprintf(o->prefix, sizeof o->prefix, "%s", q->rule[i].prefix);
        o->limit = q->pool.limit[i + 1];
        o->used = atomic_load(&q->pool.used[i + 1]);
        o->limited = atomic_load(&q->limited[i + 1]);
        o->evicted = atomic_load(&q->evicted[i + 1]);
    }
    return n;
}

kvt_status kvt__srv_geo_fingerprint(const kvt_server *s, const kvt_geometry *geo,
                                    uint32_t block_tokens, uint64_t *out)
{
    return fingerprint(geo, block_tokens ? block_tokens : default_block_tokens(s, geo), out);
}

kvt_srv_shard *kvt__srv_shard_first(kvt_server *s)
{
    return atomic_load(&s->nshards) ? s->shards[0] : NULL;
}

kvt_srv_shard *kvt__srv_shard_by_fp(kvt_server *s, uint64_t fp)
{
    uint32_t n = atomic_load(&s->nshards);
    for (uint32_t i = 0; i < n; i++)
        if (s->shards[i]->fingerprint == fp) return s->shards[i];
    return NULL;
}

/* Under shard_mu, so no shard is being made meanwhile: one made later
 * sets the observer itself (shard_create). */
void kvt__srv_drop_corrupt(kvt_srv_shard *sh, const kvt_hash128 *bad, uint32_t nbad,
                           const char *who)
{
    uint32_t removed = 0, kept = 0;
    kvt__cache_ext_count_corrupt(sh->cache, nbad);
    if (nbad) (void)kvt__cache_ext_clear(sh->cache, bad, nbad, &removed, &kept);
    kvt__srv_log(KVT_LOG_WARN, "%s found %u block(s) of geometry %s unlike the checksums they "
                 "were stored with (changed in the tier after their store); %u block(s) "
                 "removed with the chains below them, %u kept (pinned); the engine recomputes "
                 "them", who, nbad, sh->id, removed, kept);
}

void kvt__srv_set_hooks(kvt_server *s, const kvt_srv_hooks *h)
{
    pthread_mutex_lock(&s->shard_mu);
    uint32_t n = atomic_load(&s->nshards);
    for (uint32_t i = 0; i < n; i++) kvt__cache_observe_index(s->shards[i]->cache, NULL, NULL);
    pthread_mutex_lock(&s->hooks_mu);
    s->hooks = h ? *h : (kvt_srv_hooks){0};
    pthread_mutex_unlock(&s->hooks_mu);
    for (uint32_t i = 0; i < n; i++) {
        kvt_srv_shard *sh = s->shards[i];
        if (!sh->events.ev && !s->hooks.observe) continue;
        sh->replay_to_hooks = true; /* the events publisher heard these blocks already */
        kvt__cache_observe_index(sh->cache, shard_observe, sh);
        sh->replay_to_hooks = false;
    }
    pthread_mutex_unlock(&s->shard_mu);
}

static kvt_srv_shard *shard_find(kvt_server *s, const kvt_geometry *geo, uint32_t bt,
                                 uint64_t fp)
{
    uint32_t n = atomic_load(&s->nshards);
    for (uint32_t i = 0; i < n; i++) {
        kvt_srv_shard *sh = s->shards[i];
        if (sh->fingerprint == fp && sh->block_tokens == bt &&
            kvt_geometry_compare(sh->geo, geo) == KVT_OK)
            return sh;
    }
    return NULL;
}

/* A server of one declared geometry refuses another naming the first field
 * that differs, as a server of one model always did. */
static kvt_status other_geometry(kvt_server *s, const kvt_geometry *geo, uint32_t bt)
{
    kvt_status st = kvt_geometry_compare(s->declared, geo);
    if (st == KVT_OK)
        st = kvt__fail(KVT_EGEOMETRY, "block_tokens %u vs %u", s->shards[0]->block_tokens, bt);
    return kvt__wrap_error(st, "the client's geometry differs from the server's (server vs "
                           "client; a server holds several with server_max_geometries)");
}

/* "SSD tier 512 blocks in DIR (io_uring), 37 recovered" or "no SSD tier":
 * the start banner says what each tier holds after a restart. */
static void ssd_banner(const kvt_srv_shard *sh, char *out, size_t cap)
{
    kvt_cache_stats st;
    if (kvt_cache_stats_get(sh->cache, &st) != KVT_OK || st.ssd_blocks_total == 0) {
        snprintf(out, cap, "no SSD tier");
        return;
    }
    snprintf(out, cap, "SSD tier %s%llu blocks in %s (%s), %llu recovered",
             sh->cache->ssd_budget ? "up to " : "", (unsigned long long)st.ssd_blocks_total,
             sh->cache->cfg.ssd_dirs,
             kvt__ssd_backend(sh->cache->ssd), (unsigned long long)st.recovered_blocks);
}

kvt_status kvt__srv_shard_get(kvt_server *s, const kvt_geometry *geo, uint32_t block_tokens,
                              kvt_srv_shard **out)
{
    uint32_t bt = block_tokens ? block_tokens : default_block_tokens(s, geo);
    uint64_t fp;
    kvt_status st = fingerprint(geo, bt, &fp);
    if (st) return st;
    kvt_srv_shard *sh = shard_find(s, geo, bt, fp);
    if (sh) {
        kvt__clear_error();
        *out = sh;
        return KVT_OK;
    }
    pthread_mutex_lock(&s->shard_mu);
    uint32_t n = atomic_load(&s->nshards);
    if (!(sh = shard_find(s, geo, bt, fp))) {
        if (n == s->max_shards && s->declared && s->max_shards == 1)
            st = other_geometry(s, geo, bt);
        else if (n == s->max_shards)
            st = kvt__fail(KVT_EFULL, "the server holds %u geometr%s already "
                           "(server_max_geometries=%u); this one (%u layers, %u tokens per "
                           "page, block_tokens %u) is not among them: start the server with "
                           "a larger server_max_geometries", n, n == 1 ? "y" : "ies",
                           s->max_shards, geo->num_layers, geo->tokens_per_page, bt);
        else if (!(st = shard_create(s, geo, bt, fp, &sh))) {
            s->shards[n] = sh;
            atomic_store(&s->nshards, n + 1);
            char ssd[PATH_MAX + 96];
            ssd_banner(sh, ssd, sizeof ssd);
            kvt__srv_log(KVT_LOG_INFO, "geometry %s: %u layers, %llu bytes per token, %u tokens "
                         "per page, block_tokens %u: CPU tier %s%u blocks of %llu bytes (%s pages)"
                         ", %s [%u of at most %u geometries]", sh->id, geo->num_layers,
                         (unsigned long long)kvt__geo_bytes_per_token(geo),
                         geo->tokens_per_page, bt, s->share ? "up to " : "", sh->shm.num_blocks,
                         (unsigned long long)sh->shm.block_bytes, sh->shm.pages, ssd, n + 1,
                         s->max_shards);
        }
    }
    pthread_mutex_unlock(&s->shard_mu);
    if (!st) *out = sh;
    return st;
}

/* The server's /metrics: every tier made so far, labelled by geometry. */
static uint32_t metrics_sources(void *arg, kvt_cache **caches, const char **labels, uint32_t max)
{
    kvt_server *s = arg;
    uint32_t n = atomic_load(&s->nshards);
    if (n > max) n = max;
    for (uint32_t i = 0; i < n; i++) {
        caches[i] = s->shards[i]->cache;
        labels[i] = s->shards[i]->label;
    }
    return n;
}

/* With several geometries the server serves metrics_port itself (the
 * tiers' caches serve none), its families after every tier's. */
static kvt_status start_metrics(kvt_server *s)
{
    if (!s->cfg.metrics_port || s->max_shards == 1) return KVT_OK;
    kvt_status st = kvt__metrics_http_start_sources("kvt_server_create", s->cfg.metrics_addr,
                                                    s->cfg.metrics_port, s->cfg.metrics_insecure,
                                                    metrics_sources, s, &s->metrics);
    if (!st) kvt__metrics_http_set_extra(s->metrics, srv_metrics, s);
    return st;
}

static kvt_status build(kvt_server *s, const kvt_config *cfg, const kvt_geometry *geo)
{
    static const char fn[] = "kvt_server_create";
    s->cfg = *kvt__config_values(cfg);
    if (!s->cfg.server_socket[0])
        return kvt__fail(KVT_EINVAL, "%s: the server_socket option is empty (set the socket "
                         "path)", fn);
    struct sockaddr_un a;
    if (strlen(s->cfg.server_socket) >= sizeof a.sun_path)
        return kvt__fail(KVT_EINVAL, "%s: server_socket \"%s\" is longer than %zu bytes", fn,
                         s->cfg.server_socket, sizeof a.sun_path - 1);
    snprintf(s->path, sizeof s->path, "%s", s->cfg.server_socket);
    s->max_shards = s->cfg.server_max_geometries ? s->cfg.server_max_geometries
                    : geo                        ? 1
                                                 : 4;
    char lock[sizeof s->path + 8];
    snprintf(lock, sizeof lock, "%s.lock", s->path);
    char what[sizeof s->path + 16];
    snprintf(what, sizeof what, "socket %s", s->path);
    /* As kvt_cache_create does; a server of any geometry makes no cache yet. */
    kvt_status st = kvt__log_set_level((kvt_log_level)s->cfg.log_level, fn);
    if (!st) st = security(s);
    if (st) return st;
    if ((st = take_lock(lock, what, &s->lock_fd))) return st;
    if ((st = lock_ssd_dirs(s))) return st;
    if (s->max_shards > 1 && (st = make_share(s))) return st;
    if (geo) {
        kvt_srv_shard *sh;
        if ((st = kvt_geometry_clone(geo, &s->declared))) return st;
        if ((st = kvt__srv_shard_get(s, geo, s->cfg.block_tokens, &sh))) return st;
    }
    if (pipe2(s->stop_pipe, O_CLOEXEC | O_NONBLOCK) != 0)
        return kvt__fail(KVT_ESYS, "%s: pipe: %s", fn, strerror(errno));
    if ((st = start_metrics(s))) return st;
    return listen_on(s);
}

/* The server's families on the cache's /metrics (docs/metrics.md): clients
 * attached and the index entries each client process's tasks pin. */
/* The KV events publisher's counters (docs/metrics.md). */
static void srv_events_metrics(kvt_mbuf *b, const kvt_events *ev)
{
    kvt_events_stats es;
    kvt__events_stats(ev, &es);
    static const struct {
        const char *name, *help;
    } rows[] = {
        {"kvtier_events_batches_total", "KV event batches published."},
        {"kvtier_events_total", "KV events (BlockStored, BlockRemoved, AllBlocksCleared) published."},
        {"kvtier_events_blocks_total", "Block hashes in the published events."},
        {"kvtier_events_dropped_blocks_total", "Block changes not published: the queue was full."},
        {"kvtier_events_replays_total", "Replay requests answered."},
        {"kvtier_events_refused_subscribers_total",
         "CURVE handshakes the events' ZAP handler refused (not the events_secret_file's key)."},
    };
    const uint64_t v[] = {es.batches, es.events, es.blocks, es.dropped, es.replays, es.refused};
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        kvt__metrics_family(b, rows[i].name, "counter", rows[i].help);
        kvt__metrics_u64(b, rows[i].name, NULL, v[i]);
    }
}

/* The capacities every geometry shares (cache/share.h), per tier. */
static void share_metrics(kvt_mbuf *b, kvt_share *sh)
{
    kvt__metrics_family(b, "kvtier_shared_capacity_bytes", "gauge",
                        "Bytes of a tier the geometries of this server share (cpu_capacity, "
                        "ssd_capacity).");
    kvt__metrics_u64(b, "kvtier_shared_capacity_bytes", "tier=\"cpu\"", kvt__share_capacity(sh));
    kvt_pool_budget *ssd = kvt__share_ssd_budget(sh);
    if (ssd) kvt__metrics_u64(b, "kvtier_shared_capacity_bytes", "tier=\"ssd\"", ssd->limit);
    kvt__metrics_family(b, "kvtier_shared_used_bytes", "gauge",
                        "Bytes of a shared tier the geometries hold now (memory or disk behind "
                        "their slots).");
    kvt__metrics_u64(b, "kvtier_shared_used_bytes", "tier=\"cpu\"", kvt__share_used(sh));
    if (ssd) kvt__metrics_u64(b, "kvtier_shared_used_bytes", "tier=\"ssd\"", kvt__share_ssd_used(sh));
}

static void srv_metrics(kvt_mbuf *b, void *arg)
{
    kvt_server *s = arg;
    pthread_mutex_lock(&s->mu);
    kvt_metrics_client *v = calloc(s->nconns ? s->nconns : 1, sizeof *v);
    uint32_t n = 0;
    for (kvt_srv_conn *c = s->conns; v && c; c = c->next)
        if (!atomic_load(&c->finished))
            v[n++] = (kvt_metrics_client){c->pid, (uint64_t)atomic_load(&c->pins)};
    pthread_mutex_unlock(&s->mu);
    if (v) kvt__metrics_clients(b, v, n);
    else b->failed = true;
    free(v);
    kvt__metrics_quotas(b, s->quota);
    if (s->share) share_metrics(b, s->share);
    if (s->events) srv_events_metrics(b, s->events);
    pthread_mutex_lock(&s->hooks_mu);
    if (s->hooks.metrics) s->hooks.metrics(s->hooks.arg, b);
    pthread_mutex_unlock(&s->hooks_mu);
}

kvt_status kvt_server_create(kvt_server **out, const kvt_config *cfg, const kvt_geometry *geo)
{
    static const char fn[] = "kvt_server_create";
    kvt__clear_error();
    KVT_CHECK_NOT_NULL(out, fn);
    KVT_CHECK_NOT_NULL(cfg, fn);
    kvt_status st = geo ? kvt_geometry_validate(geo) : KVT_OK; /* NULL: any geometry */
    if (st) return kvt__wrap_error(st, "kvt_server_create: geo");
    kvt_server *s = calloc(1, sizeof *s);
    if (!s) return kvt__fail(KVT_ENOMEM, "%s: out of memory", fn);
    s->listen_fd = s->lock_fd = s->stop_pipe[0] = s->stop_pipe[1] = -1;
    s->created_ns = kvt__now_ns();
    pthread_mutex_init(&s->mu, NULL);
    pthread_mutex_init(&s->shard_mu, NULL);
    pthread_mutex_init(&s->hooks_mu, NULL);
    st = build(s, cfg, geo);
    if (st) {
        if (s->listen_fd >= 0) unlink(s->path);
        kvt_server_destroy(s);
        return st;
    }
    *out = s;
    return KVT_OK;
}

void kvt_server_stop(kvt_server *s)
{
    if (!s) return;
    char b = 1;
    ssize_t n = write(s->stop_pipe[1], &b, 1); /* async-signal-safe */
    (void)n;
}

/* Joins the threads of clients that went away. */
static void reap_conns(kvt_server *s, bool all)
{
    pthread_mutex_lock(&s->mu);
    kvt_srv_conn **pp = &s->conns;
    while (*pp) {
        kvt_srv_conn *c = *pp;
        if (all) shutdown(c->fd, SHUT_RDWR); /* its thread sees the close at once */
        if (!all && !atomic_load(&c->finished)) {
            pp = &c->next;
            continue;
        }
        *pp = c->next;
        s->nconns--;
        pthread_mutex_unlock(&s->mu);
        pthread_join(c->thread, NULL);
        close(c->fd);
        free(c);
        pthread_mutex_lock(&s->mu);
    }
    pthread_mutex_unlock(&s->mu);
}

void kvt__srv_fence_add(kvt_server *s, kvt_srv_shard *sh, pid_t pid, uint64_t session,
                        uint32_t *slots, uint32_t n)
{
    kvt_srv_fence *f = n ? calloc(1, sizeof *f) : NULL;
    int pidfd = f ? (int)syscall(SYS_pidfd_open, pid, 0) : -1;
    if (f && pidfd < 0 && errno != ESRCH) {
        /* No way to tell when it exits (kernel < 5.3): the blocks stay out
         * of the pool until the server stops, which is safe. */
        kvt__srv_log(KVT_LOG_WARN, "client pid %ld: pidfd_open: %s; its %u cut-off store "
                     "blocks stay reserved until the server stops", (long)pid, strerror(errno),
                     n);
    }
    if (!f || (pidfd < 0 && errno == ESRCH)) { /* gone already (or no memory: then leak) */
        if (f) kvt__cache_ext_release(sh->cache, slots, n);
        free(slots);
        free(f);
        return;
    }
    *f = (kvt_srv_fence){sh, pid, session, pidfd, slots, n, NULL};
    pthread_mutex_lock(&s->mu);
    f->next = s->fences;
    s->fences = f;
    pthread_mutex_unlock(&s->mu);
}

static void fence_free(kvt_srv_fence *f)
{
    kvt__cache_ext_release(f->shard->cache, f->slots, f->n);
    if (f->pidfd >= 0) close(f->pidfd);
    free(f->slots);
    free(f);
}

uint32_t kvt__srv_fences_release(kvt_server *s, pid_t pid, uint64_t session)
{
    uint32_t n = 0;
    pthread_mutex_lock(&s->mu);
    for (kvt_srv_fence **pp = &s->fences; *pp;) {
        kvt_srv_fence *f = *pp;
        if (f->pid != pid || f->session != session || !session) {
            pp = &f->next;
            continue;
        }
        *pp = f->next;
        n += f->n;
        fence_free(f);
    }
    pthread_mutex_unlock(&s->mu);
    if (n)
        kvt__srv_log(KVT_LOG_INFO, "client pid %ld re-attached with its earlier copies stopped: "
                     "its %u cut-off store blocks are free again", (long)pid, n);
    return n;
}

void kvt__srv_fences_reap(kvt_server *s, bool all)
{
    pthread_mutex_lock(&s->mu);
    for (kvt_srv_fence **pp = &s->fences; *pp;) {
        kvt_srv_fence *f = *pp;
        struct pollfd p = {f->pidfd, POLLIN, 0};
        bool gone = f->pidfd >= 0 && poll(&p, 1, 0) == 1;
        if (!gone && !all) {
            pp = &f->next;
            continue;
        }
        *pp = f->next;
        if (gone)
            kvt__srv_log(KVT_LOG_INFO, "client pid %ld exited: its %u cut-off store blocks are "
                         "free again", (long)f->pid, f->n);
        fence_free(f);
    }
    pthread_mutex_unlock(&s->mu);
}

/* Clients attached (HELLO answered, not gone); s->mu held. */
static uint32_t attached_locked(const kvt_server *s)
{
    uint32_t n = 0;
    for (const kvt_srv_conn *c = s->conns; c; c = c->next)
        n += c->attached && !atomic_load(&c->finished);
    return n;
}

/* Before a new connection: with KVT_SRV_MAX_PENDING connections still not
 * attached, the oldest is shut (its thread sees the close and ends), so
 * connections that never attach cannot keep an engine out. s->mu held. */
static void make_room_locked(kvt_server *s)
{
    uint32_t pending = 0;
    kvt_srv_conn *oldest = NULL;
    for (kvt_srv_conn *c = s->conns; c; c = c->next) {
        if (c->attached || atomic_load(&c->finished) || atomic_load(&c->pushed_out)) continue;
        pending++;
        if (!oldest || c->accepted_ns < oldest->accepted_ns) oldest = c;
    }
    if (pending < KVT_SRV_MAX_PENDING || !oldest) return;
    atomic_store(&oldest->pushed_out, true);
    shutdown(oldest->fd, SHUT_RDWR);
    uint64_t now = kvt__now_ns();
    s->pending_dropped++;
    if (now - s->pending_log_ns > 1000000000ull) { /* at most a line a second */
        kvt__srv_log(KVT_LOG_WARN, "%u connections had not attached, so the oldest (pid %ld, "
                     "%llu ms old) was dropped for a new one (%llu dropped so far)",
                     pending, (long)oldest->pid,
                     (unsigned long long)((now - oldest->accepted_ns) / 1000000u),
                     (unsigned long long)s->pending_dropped);
        s->pending_log_ns = now;
    }
}

kvt_status kvt__srv_conn_attach(kvt_server *s, kvt_srv_conn *c)
{
    pthread_mutex_lock(&s->mu);
    uint32_t n = attached_locked(s);
    bool full = n >= s->cfg.server_max_clients;
    if (!full) c->attached = true;
    pthread_mutex_unlock(&s->mu);
    if (!full) return KVT_OK;
    return kvt__fail(KVT_EFULL, "the server has server_max_clients (%u) clients attached",
                     s->cfg.server_max_clients);
}

/* Out of descriptors (EMFILE, ENFILE) or kernel memory, a pending client
 * stays in the backlog and the socket stays readable: the accept loop
 * waits this long before trying again instead of spinning at full CPU. */
#define ACCEPT_BACKOFF_MS 100

/* Accepts one client; false when accepting failed for want of resources
 * (the caller backs off). */
static bool accept_one(kvt_server *s)
{
    int fd = accept4(s->listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
        bool starved = errno == EMFILE || errno == ENFILE || errno == ENOBUFS ||
                       errno == ENOMEM;
        if (starved && !s->accept_starved)
            kvt__srv_log(KVT_LOG_WARN, "cannot accept clients: %s (%u attached); retrying "
                         "every %d ms (raise the open-files limit, ulimit -n)", strerror(errno),
                         s->nconns, ACCEPT_BACKOFF_MS);
        s->accept_starved = starved;
        return !starved;
    }
    s->accept_starved = false;
    kvt_srv_peer cr;
    if (kvt__srv_peer(fd, &cr)) {
        kvt__srv_log(KVT_LOG_WARN, "refused a client: %s", kvt_last_error());
        close(fd);
        return true;
    }
    /* The socket's mode already keeps others out; this holds even if the
     * file's mode or owner was changed behind the server's back. */
    /* Such a client is answered KVT_EAUTH in the handshake (its own
     * pending slot, as any connection's), not a closed socket that reads
     * like a full or dead server. */
    bool admitted = cr.uid == geteuid() || cr.uid == 0 ||
                    (s->grouped && kvt__srv_peer_in_group(&cr, s->group));
    if (!admitted)
        kvt__srv_log(KVT_LOG_WARN, "refused client pid %ld: uid %ld is neither this server's "
                     "(%ld) nor root%s%s", (long)cr.pid, (long)cr.uid, (long)geteuid(),
                     s->grouped ? ", nor in server_socket_group " : "",
                     s->grouped ? s->cfg.server_socket_group : "");
    /* A full server still takes the connection (within the pending
     * budget): its HELLO is answered KVT_EFULL naming server_max_clients,
     * which a client can tell from a refusal by uid. */
    pthread_mutex_lock(&s->mu);
    make_room_locked(s);
    pthread_mutex_unlock(&s->mu);
    kvt_srv_conn *c = calloc(1, sizeof *c);
    if (!c) {
        close(fd);
        return true;
    }
    c->srv = s;
    c->fd = fd;
    c->pid = cr.pid;
    c->uid = cr.uid;
    c->peer = cr;
    c->not_admitted = !admitted;
    c->accepted_ns = kvt__now_ns();
    atomic_init(&c->finished, false);
    atomic_init(&c->pushed_out, false);
    atomic_init(&c->pins, 0);
    if (pthread_create(&c->thread, NULL, kvt__srv_conn_main, c) != 0) {
        kvt__srv_log(KVT_LOG_WARN, "refused client pid %ld: no thread", (long)cr.pid);
        close(fd);
        free(c);
        return true;
    }
    pthread_mutex_lock(&s->mu);
    c->next = s->conns;
    s->conns = c;
    s->nconns++;
    pthread_mutex_unlock(&s->mu);
    return true;
}

/* Where /metrics is served (the server's own endpoint with several
 * geometries, else its one tier's), or that it is off. */
static void metrics_banner(kvt_server *s, char *out, size_t cap)
{
    kvt_srv_shard *first = kvt__srv_shard_first(s);
    struct kvt_metrics_http *h = s->metrics ? s->metrics : first ? first->cache->metrics_http : NULL;
    if (!h) {
        snprintf(out, cap, "no metrics endpoint (metrics_port=0)");
        return;
    }
    snprintf(out, cap, "metrics on http://%s:%u/metrics", s->cfg.metrics_addr,
             (unsigned)kvt__metrics_http_port(h));
}

kvt_status kvt_server_run(kvt_server *s)
{
    static const char fn[] = "kvt_server_run";
    kvt__clear_error();
    KVT_CHECK_NOT_NULL_AS(s, "srv", fn);
    int expect = 0;
    if (!atomic_compare_exchange_strong(&s->state, &expect, 1))
        return kvt__fail(KVT_ESTATE, "%s: the server is already running or stopped", fn);
    kvt_srv_shard *first = kvt__srv_shard_first(s);
    char metrics[160], ssd[32];
    metrics_banner(s, metrics, sizeof metrics);
    snprintf(ssd, sizeof ssd, "%llu bytes", (unsigned long long)s->cfg.ssd_capacity);
    if (first)
        kvt__srv_log(KVT_LOG_INFO, "serving on %s (pid %ld, version %s, geometry %s: CPU tier %u "
                     "blocks of %llu bytes, %s pages; up to %u geometries; %s)", s->path,
                     (long)getpid(), kvt_version_string(), first->id, first->shm.num_blocks,
                     (unsigned long long)first->shm.block_bytes, first->shm.pages,
                     s->max_shards, metrics);
    else
        kvt__srv_log(KVT_LOG_INFO, "serving on %s (pid %ld, version %s; any geometry, up to %u "
                     "at once, sharing %llu bytes of CPU tier%s%s%s%s (coldest blocks evicted "
                     "across them): a tier is made at the first attach of its geometry; %s)",
                     s->path, (long)getpid(), kvt_version_string(), s->max_shards,
                     (unsigned long long)s->cfg.cpu_capacity,
                     s->cfg.ssd_dirs[0] ? " and " : "", s->cfg.ssd_dirs[0] ? ssd : "",
                     s->cfg.ssd_dirs[0] ? " of SSD tier under " : "", s->cfg.ssd_dirs, metrics);
    if (s->events)
        kvt__srv_log(KVT_LOG_INFO, "KV events (vLLM's format, docs/events.md) on %s%s%s, topic "
                     "\"%s\"", s->cfg.events_endpoint,
                     s->cfg.events_replay_endpoint[0] ? ", replay on " : " (no replay endpoint)",
                     s->cfg.events_replay_endpoint, s->cfg.events_topic);
    if (first && !strcmp(first->shm.pages, "4k"))
        kvt__srv_log(KVT_LOG_INFO, "the CPU tier has 4 KiB pages (no huge pages reserved, shmem "
                     "THP off): clients store slower (docs/server.md, Performance)");
    for (;;) {
        struct pollfd p[2] = {{s->listen_fd, POLLIN, 0}, {s->stop_pipe[0], POLLIN, 0}};
        int rc = poll(p, 2, 200);
        if (rc < 0 && errno != EINTR) break;
        if (p[1].revents) break;
        if (rc > 0 && (p[0].revents & POLLIN) && !accept_one(s)) {
            struct pollfd stop = {s->stop_pipe[0], POLLIN, 0};
            if (poll(&stop, 1, ACCEPT_BACKOFF_MS) > 0) break;
        }
        reap_conns(s, false);
        kvt__srv_fences_reap(s, false);
    }
    /* Stop: no new clients, every client's tasks released, then a bounded
     * wait for SSD writes to become durable. */
    close(s->listen_fd);
    s->listen_fd = -1;
    unlink(s->path);
    reap_conns(s, true);
    kvt_status st = KVT_OK;
    uint64_t until = kvt__deadline_ns(s->cfg.server_stop_ms);
    for (uint32_t i = 0; i < atomic_load(&s->nshards); i++) {
        uint64_t now = kvt__now_ns();
        int64_t left = until > now ? (int64_t)((until - now) / 1000000u) : 0;
        kvt_status f = kvt_cache_flush(s->shards[i]->cache, left);
        if (!st) st = f;
    }
    atomic_store(&s->state, 2);
    kvt__srv_log(st ? KVT_LOG_WARN : KVT_LOG_INFO, "stopped%s",
                 st ? " (SSD writes still pending at server_stop_ms)" : "");
    return st;
}

void kvt_server_destroy(kvt_server *s)
{
    if (!s) return;
    pthread_mutex_lock(&s->hooks_mu);
    kvt_srv_hooks h = s->hooks;
    pthread_mutex_unlock(&s->hooks_mu);
    if (h.server_gone) h.server_gone(h.arg); /* a cluster still joined: it stops first */
    if (atomic_load(&s->state) == 0) atomic_store(&s->state, 2);
    if (s->listen_fd >= 0) {
        close(s->listen_fd);
        unlink(s->path);
    }
    /* No scrape may walk the connections once they are freed. */
    kvt_srv_shard *first = kvt__srv_shard_first(s);
    if (first) kvt__metrics_cache_set_extra(first->cache, NULL, NULL);
    kvt__metrics_http_stop(s->metrics); /* no scrape walks the shards from here */
    s->metrics = NULL;
    reap_conns(s, true);
    kvt__srv_fences_reap(s, true);
    for (uint32_t i = 0; i < atomic_load(&s->nshards); i++) shard_free(s->shards[i]);
    kvt__share_destroy(s->share); /* after every member */
    free(s->quota);              /* after every member too */
    kvt__events_stop(s->events); /* no index observes it any more */
    kvt_geometry_destroy(s->declared);
    for (uint32_t i = 0; i < s->num_ssd_locks; i++) close(s->ssd_lock_fds[i]);
    if (s->lock_fd >= 0) close(s->lock_fd);
    if (s->stop_pipe[0] >= 0) close(s->stop_pipe[0]);
    if (s->stop_pipe[1] >= 0) close(s->stop_pipe[1]);
    kvt__srv_ns_free(&s->ns);
    kvt__srv_secret_free(s->secret, s->secret_len);
    pthread_mutex_destroy(&s->mu);
    pthread_mutex_destroy(&s->shard_mu);
    pthread_mutex_destroy(&s->hooks_mu);
    free(s);
}
