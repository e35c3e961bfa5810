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
#include "metrics/metrics.h"
#include "util/err.h"

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

static void srv_metrics(kvt_mbuf *b, void *arg);

/* server_socket_group, server_namespaces and server_secret_file. */
static kvt_status security(kvt_server *s)
{
    kvt_status st = KVT_OK;
    if (s->cfg.server_socket_group[0]) {
        st = kvt__srv_group(s->cfg.server_socket_group, &s->group);
        s->grouped = st == KVT_OK;
    }
    if (!st && (st = kvt__srv_ns_parse(s->cfg.server_namespaces, &s->ns)))
        kvt__wrap_error(st, "kvt_server_create");
    if (!st && sodium_init() < 0)
        st = kvt__fail(KVT_ESYS, "kvt_server_create: libsodium failed to initialise");
    if (!st && s->cfg.server_secret_file[0])
        st = kvt__srv_secret_load(s->cfg.server_secret_file, "kvt_server_create: "
                                  "server_secret_file", &s->secret, &s->secret_len);
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
    char lock[sizeof s->path + 8];
    snprintf(lock, sizeof lock, "%s.lock", s->path);
    char what[sizeof s->path + 16];
    snprintf(what, sizeof what, "socket %s", s->path);
    kvt_status st = security(s);
    if (st) return st;
    if ((st = take_lock(lock, what, &s->lock_fd))) return st;
    if ((st = lock_ssd_dirs(s))) return st;
    if ((st = kvt_geometry_clone(geo, &s->geo))) return st;
    if ((st = kvt__cache_create_ex(&s->cache, cfg, geo, true))) return st;
    kvt__cache_ext_shm(s->cache, &s->shm);
    kvt__metrics_cache_set_extra(s->cache, srv_metrics, s);
    /* One core is left to the clients and connections: a check that takes
     * every core makes their next wake-up wait for it. */
    long cpus = sysconf(_SC_NPROCESSORS_ONLN) - 1;
    s->verify_threads = cpus < 1                        ? 1
                        : cpus > KVT_SRV_VERIFY_THREADS ? KVT_SRV_VERIFY_THREADS
                                                        : (uint32_t)cpus;
    if (pipe2(s->stop_pipe, O_CLOEXEC | O_NONBLOCK) != 0)
        return kvt__fail(KVT_ESYS, "%s: pipe: %s", fn, strerror(errno));
    return listen_on(s);
}

/* The server's families on the cache's /metrics (docs/metrics.md): clients
 * attached and the index entries each client process's tasks pin. */
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
}

kvt_status kvt_server_create(kvt_server **out, const kvt_config *cfg, const kvt_geometry *geo)
{
    static const char fn[] = "kvt_server_create";
    kvt__clear_error();
    KVT_CHECK_NOT_NULL(out, fn);
    KVT_CHECK_NOT_NULL(cfg, fn);
    KVT_CHECK_NOT_NULL(geo, fn);
    kvt_server *s = calloc(1, sizeof *s);
    if (!s) return kvt__fail(KVT_ENOMEM, "%s: out of memory", fn);
    s->listen_fd = s->lock_fd = s->stop_pipe[0] = s->stop_pipe[1] = -1;
    pthread_mutex_init(&s->mu, NULL);
    kvt_status st = build(s, cfg, geo);
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

void kvt__srv_fence_add(kvt_server *s, pid_t pid, uint64_t session, uint32_t *slots,
                        uint32_t n)
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
        if (f) kvt__cache_ext_release(s->cache, slots, n);
        free(slots);
        free(f);
        return;
    }
    *f = (kvt_srv_fence){pid, session, pidfd, slots, n, NULL};
    pthread_mutex_lock(&s->mu);
    f->next = s->fences;
    s->fences = f;
    pthread_mutex_unlock(&s->mu);
}

static void fence_free(kvt_server *s, kvt_srv_fence *f)
{
    kvt__cache_ext_release(s->cache, f->slots, f->n);
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
        fence_free(s, f);
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
        fence_free(s, f);
    }
    pthread_mutex_unlock(&s->mu);
}

static void accept_one(kvt_server *s)
{
    int fd = accept4(s->listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) return;
    kvt_srv_peer cr;
    if (kvt__srv_peer(fd, &cr)) {
        kvt__srv_log(KVT_LOG_WARN, "refused a client: %s", kvt_last_error());
        close(fd);
        return;
    }
    /* The socket's mode already keeps others out; this holds even if the
     * file's mode or owner was changed behind the server's back. */
    if (cr.uid != geteuid() && cr.uid != 0 &&
        !(s->grouped && kvt__srv_peer_in_group(&cr, s->group))) {
        kvt__srv_log(KVT_LOG_WARN, "refused client pid %ld: uid %ld is neither this server's "
                     "(%ld) nor root%s%s", (long)cr.pid, (long)cr.uid, (long)geteuid(),
                     s->grouped ? ", nor in server_socket_group " : "",
                     s->grouped ? s->cfg.server_socket_group : "");
        close(fd);
        return;
    }
    pthread_mutex_lock(&s->mu);
    bool full = s->nconns >= s->cfg.server_max_clients;
    pthread_mutex_unlock(&s->mu);
    if (full) {
        kvt__srv_log(KVT_LOG_WARN, "refused client pid %ld: server_max_clients (%u) attached",
                     (long)cr.pid, s->cfg.server_max_clients);
        close(fd);
        return;
    }
    kvt_srv_conn *c = calloc(1, sizeof *c);
    if (!c) {
        close(fd);
        return;
    }
    c->srv = s;
    c->fd = fd;
    c->pid = cr.pid;
    c->uid = cr.uid;
    c->peer = cr;
    atomic_init(&c->finished, false);
    atomic_init(&c->pins, 0);
    if (pthread_create(&c->thread, NULL, kvt__srv_conn_main, c) != 0) {
        kvt__srv_log(KVT_LOG_WARN, "refused client pid %ld: no thread", (long)cr.pid);
        close(fd);
        free(c);
        return;
    }
    pthread_mutex_lock(&s->mu);
    c->next = s->conns;
    s->conns = c;
    s->nconns++;
    pthread_mutex_unlock(&s->mu);
}

kvt_status kvt_server_run(kvt_server *s)
{
    static const char fn[] = "kvt_server_run";
    kvt__clear_error();
    KVT_CHECK_NOT_NULL_AS(s, "srv", fn);
    int expect = 0;
    if (!atomic_compare_exchange_strong(&s->state, &expect, 1))
        return kvt__fail(KVT_ESTATE, "%s: the server is already running or stopped", fn);
    kvt__srv_log(KVT_LOG_INFO, "serving on %s (pid %ld, CPU tier %u blocks of %llu bytes, %s "
                 "pages)", s->path, (long)getpid(), s->shm.num_blocks,
                 (unsigned long long)s->shm.block_bytes, s->shm.pages);
    if (!strcmp(s->shm.pages, "4k"))
        kvt__srv_log(KVT_LOG_INFO, "the CPU tier has 4 KiB pages (no huge pages reserved, shmem "
                     "THP off): clients store slower (docs/server.md, Performance)");
    for (;;) {
        struct pollfd p[2] = {{s->listen_fd, POLLIN, 0}, {s->stop_pipe[0], POLLIN, 0}};
        int rc = poll(p, 2, 200);
        if (rc < 0 && errno != EINTR) break;
        if (p[1].revents) break;
        if (rc > 0 && (p[0].revents & POLLIN)) accept_one(s);
        reap_conns(s, false);
        kvt__srv_fences_reap(s, false);
    }
    /* Stop: no new clients, every client's tasks released, then a bounded
     * wait for SSD writes to become durable. */
    close(s->listen_fd);
    s->listen_fd = -1;
    unlink(s->path);
    reap_conns(s, true);
    kvt_status st = kvt_cache_flush(s->cache, s->cfg.server_stop_ms);
    atomic_store(&s->state, 2);
    kvt__srv_log(st ? KVT_LOG_WARN : KVT_LOG_INFO, "stopped%s",
                 st ? " (SSD writes still pending at server_stop_ms)" : "");
    return st;
}

void kvt_server_destroy(kvt_server *s)
{
    if (!s) return;
    if (atomic_load(&s->state) == 0) atomic_store(&s->state, 2);
    if (s->listen_fd >= 0) {
        close(s->listen_fd);
        unlink(s->path);
    }
    /* No scrape may walk the connections once they are freed. */
    if (s->cache) kvt__metrics_cache_set_extra(s->cache, NULL, NULL);
    reap_conns(s, true);
    if (s->cache) kvt__srv_fences_reap(s, true);
    kvt_cache_destroy(s->cache);
    kvt_geometry_destroy(s->geo);
    for (uint32_t i = 0; i < s->num_ssd_locks; i++) close(s->ssd_lock_fds[i]);
    if (s->lock_fd >= 0) close(s->lock_fd);
    if (s->stop_pipe[0] >= 0) close(s->stop_pipe[0]);
    if (s->stop_pipe[1] >= 0) close(s->stop_pipe[1]);
    kvt__srv_ns_free(&s->ns);
    kvt__srv_secret_free(s->secret, s->secret_len);
    pthread_mutex_destroy(&s->mu);
    free(s);
}
