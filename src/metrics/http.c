/* http.c - GET /metrics over HTTP with libmicrohttpd (metrics.h).
 *
 * We bind the listening socket ourselves (so a bind failure names errno and
 * a port of 0 can be read back) and hand it to MHD, which serves it from
 * one internal thread. Each scrape renders into a fresh buffer that MHD
 * frees after sending. A mutex held across render makes set_extra and stop
 * wait for a scrape in progress; the data path never takes it. */
#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "cache/cache.h"
#include "cache/observe.h"
#include "metrics/metrics.h"
#include "util/err.h"
#include "util/parse.h"

#define CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"
#define MAX_CONNECTIONS 16
#define CONNECTION_TIMEOUT_S 10

#define MAX_SOURCES 64

struct kvt_metrics_http {
    struct MHD_Daemon *daemon;
    kvt_cache *cache;               /* one cache, or NULL: sources */
    kvt_metrics_sources_fn sources; /* several, labelled (the node server's tiers) */
    void *sources_arg;
    uint16_t port;
    pthread_mutex_t mu; /* guards extra and arg; held across a render */
    kvt_metrics_extra_fn extra;
    void *arg;
};

static enum MHD_Result reply(struct MHD_Connection *conn, unsigned code, char *body, size_t len,
                             bool must_free, bool allow_get)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(
        len, body, must_free ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_PERSISTENT);
    if (!r) {
        if (must_free) free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE,
                            code == MHD_HTTP_OK ? CONTENT_TYPE : "text/plain; charset=utf-8");
    if (allow_get) MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, "GET");
    enum MHD_Result ret = MHD_queue_response(conn, code, r);
    MHD_destroy_response(r);
    return ret;
}

/* GET /healthz: 200 "ok" while every tier works, else 503 naming what
 * does not (a load balancer or systemd watchdog reads the code). */
static enum MHD_Result healthz(struct MHD_Connection *conn, kvt_metrics_http *h)
{
    static char ok[] = "ok\n";
    static char ssd_off[] = "unhealthy: the SSD tier stopped taking writes (out of space or I/O "
                            "errors: see kvtier_ssd_errors_total and the log)\n";
    static char failed[] = "unhealthy: the cache could not be read\n";
    kvt_cache *caches[MAX_SOURCES];
    const char *labels[MAX_SOURCES];
    pthread_mutex_lock(&h->mu);
    uint32_t n = h->cache ? 1 : h->sources(h->sources_arg, caches, labels, MAX_SOURCES);
    if (h->cache) caches[0] = h->cache;
    kvt_status st = KVT_OK;
    bool off = false;
    for (uint32_t i = 0; i < n && !st; i++) {
        kvt_cache_observed o;
        st = kvt__cache_observe(caches[i], &o);
        off = off || (!st && o.ssd_writes_off);
    }
    pthread_mutex_unlock(&h->mu);
    if (st) return reply(conn, MHD_HTTP_SERVICE_UNAVAILABLE, failed, sizeof failed - 1, false, false);
    if (off)
        return reply(conn, MHD_HTTP_SERVICE_UNAVAILABLE, ssd_off, sizeof ssd_off - 1, false, false);
    return reply(conn, MHD_HTTP_OK, ok, sizeof ok - 1, false, false);
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *conn, const char *url,
                              const char *method, const char *version, const char *upload_data,
                              size_t *upload_data_size, void **con_cls)
{
    static char not_found[] = "not found: only GET /metrics and GET /healthz are served\n";
    static char not_allowed[] = "method not allowed: only GET is served\n";
    static char failed[] = "rendering the metrics failed\n";
    kvt_metrics_http *h = cls;
    bool health = strcmp(url, "/healthz") == 0;
    if (strcmp(url, "/metrics") != 0 && !health)
        return reply(conn, MHD_HTTP_NOT_FOUND, not_found, sizeof not_found - 1, false, false);
    if (strcmp(method, MHD_HTTP_METHOD_GET) != 0)
        return reply(conn, MHD_HTTP_METHOD_NOT_ALLOWED, not_allowed, sizeof not_allowed - 1,
                     false, true);
    if (health) return healthz(conn, h);
    kvt_mbuf b = {0};
    pthread_mutex_lock(&h->mu);
    kvt_status st;
    if (h->cache) {
        st = kvt__metrics_render(&b, h->cache, h->extra, h->arg);
    } else {
        kvt_cache *caches[MAX_SOURCES];
        const char *labels[MAX_SOURCES];
        uint32_t n = h->sources(h->sources_arg, caches, labels, MAX_SOURCES);
        st = kvt__metrics_render_multi(&b, caches, labels, n, h->extra, h->arg);
    }
    pthread_mutex_unlock(&h->mu);
    if (st) {
        kvt__mbuf_free(&b);
        return reply(conn, MHD_HTTP_INTERNAL_SERVER_ERROR, failed, sizeof failed - 1, false,
                     false);
    }
    return reply(conn, MHD_HTTP_OK, b.data, b.len, true, false);
}

/* ------------------------------------------------------------------ */
/* Address and socket                                                 */

typedef struct bind_addr {
    struct sockaddr_storage ss;
    socklen_t len;
} bind_addr;

static kvt_status parse_addr(const char *fn, const char *addr, uint32_t port, bind_addr *out)
{
    memset(out, 0, sizeof *out);
    struct sockaddr_in *v4 = (struct sockaddr_in *)&out->ss;
    struct sockaddr_in6 *v6 = (struct sockaddr_in6 *)&out->ss;
    if (inet_pton(AF_INET, addr, &v4->sin_addr) == 1) {
        v4->sin_family = AF_INET;
        v4->sin_port = htons((uint16_t)port);
        out->len = sizeof *v4;
        return KVT_OK;
    }
    if (inet_pton(AF_INET6, addr, &v6->sin6_addr) == 1) {
        v6->sin6_family = AF_INET6;
        v6->sin6_port = htons((uint16_t)port);
        out->len = sizeof *v6;
        return KVT_OK;
    }
    return kvt__fail(KVT_EINVAL, "%s: metrics_addr \"%s\" is not a numeric IPv4 or IPv6 "
                     "address (host names are not resolved)", fn, addr);
}

/* strerror, thread-safe (GNU strerror_r: _GNU_SOURCE is set for the build). */
typedef struct errbuf {
    char s[128];
} errbuf;
static errbuf errtext(int e)
{
    errbuf b;
    const char *m = strerror_r(e, b.s, sizeof b.s);
    if (m != b.s) snprintf(b.s, sizeof b.s, "%s", m);
    return b;
}

static kvt_status listen_on(const char *fn, const char *addr, const bind_addr *a, int *out)
{
    int fd = socket(a->ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return kvt__fail(KVT_ESYS, "%s: metrics endpoint: socket: %s", fn, errtext(errno).s);
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (a->ss.ss_family == AF_INET6) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
    unsigned port = ntohs(a->ss.ss_family == AF_INET ? ((const struct sockaddr_in *)&a->ss)->sin_port
                                                     : ((const struct sockaddr_in6 *)&a->ss)->sin6_port);
    if (bind(fd, (const struct sockaddr *)&a->ss, a->len) != 0 || listen(fd, 64) != 0) {
        int e = errno;
        close(fd);
        return kvt__fail(e == EADDRINUSE ? KVT_EBUSY : KVT_ESYS,
                         "%s: metrics endpoint: cannot listen on %s port %u: %s (metrics_addr, "
                         "metrics_port)", fn, addr, port, errtext(e).s);
    }
    *out = fd;
    return KVT_OK;
}

static uint16_t bound_port(int fd)
{
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    if (getsockname(fd, (struct sockaddr *)&ss, &len) != 0) return 0;
    if (ss.ss_family == AF_INET) return ntohs(((struct sockaddr_in *)&ss)->sin_port);
    return ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
}

/* ------------------------------------------------------------------ */
/* Start and stop                                                     */

static kvt_status start(const char *fn, const char *addr, uint32_t port, bool insecure,
                        kvt_cache *c, kvt_metrics_sources_fn sources, void *sources_arg,
                        kvt_metrics_http **out);

kvt_status kvt__metrics_http_start(const char *fn, const char *addr, uint32_t port, bool insecure,
                                   kvt_cache *c, kvt_metrics_http **out)
{
    return start(fn, addr, port, insecure, c, NULL, NULL, out);
}

kvt_status kvt__metrics_http_start_sources(const char *fn, const char *addr, uint32_t port,
                                           bool insecure, kvt_metrics_sources_fn sources,
                                           void *arg, kvt_metrics_http **out)
{
    return start(fn, addr, port, insecure, NULL, sources, arg, out);
}

static kvt_status start(const char *fn, const char *addr, uint32_t port, bool insecure,
                        kvt_cache *c, kvt_metrics_sources_fn sources, void *sources_arg,
                        kvt_metrics_http **out)
{
    if (port > 65535) return kvt__fail(KVT_EINVAL, "%s: metrics_port %u is not a TCP port", fn, port);
    bind_addr a;
    kvt_status st = parse_addr(fn, addr, port, &a);
    if (st) return st;
    if (!kvt__host_is_loopback(addr) && !insecure) /* addr is numeric: parse_addr */
        return kvt__fail(KVT_EINVAL, "%s: metrics_addr \"%s\" is not a loopback address; the "
                         "metrics endpoint has no authentication, so serving it beyond this "
                         "host needs metrics_insecure=true (or keep 127.0.0.1 and put a proxy "
                         "in front)", fn, addr);
    kvt_metrics_http *h = calloc(1, sizeof *h);
    if (!h) return kvt__fail(KVT_ENOMEM, "%s: out of memory for the metrics endpoint", fn);
    pthread_mutex_init(&h->mu, NULL);
    h->cache = c;
    h->sources = sources;
    h->sources_arg = sources_arg;
    int fd = -1;
    if ((st = listen_on(fn, addr, &a, &fd))) goto fail;
    h->port = bound_port(fd);
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO;
    if (a.ss.ss_family == AF_INET6) flags |= MHD_USE_IPv6;
    h->daemon = MHD_start_daemon(flags, 0, NULL, NULL, handle, h,
                                 MHD_OPTION_LISTEN_SOCKET, (MHD_socket)fd,
                                 MHD_OPTION_CONNECTION_LIMIT, (unsigned)MAX_CONNECTIONS,
                                 MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)CONNECTION_TIMEOUT_S,
                                 MHD_OPTION_END);
    if (!h->daemon) {
        close(fd);
        st = kvt__fail(KVT_ESYS, "%s: metrics endpoint: libmicrohttpd could not start on %s "
                       "port %u", fn, addr, (unsigned)h->port);
        goto fail;
    }
    *out = h;
    return KVT_OK;
fail:
    pthread_mutex_destroy(&h->mu);
    free(h);
    return st;
}

uint16_t kvt__metrics_http_port(const kvt_metrics_http *h) { return h ? h->port : 0; }

void kvt__metrics_http_set_extra(kvt_metrics_http *h, kvt_metrics_extra_fn extra, void *arg)
{
    if (!h) return;
    pthread_mutex_lock(&h->mu);
    h->extra = extra;
    h->arg = arg;
    pthread_mutex_unlock(&h->mu);
}

void kvt__metrics_http_stop(kvt_metrics_http *h)
{
    if (!h) return;
    MHD_stop_daemon(h->daemon); /* joins its thread; closes the listening socket */
    pthread_mutex_destroy(&h->mu);
    free(h);
}

/* ------------------------------------------------------------------ */
/* The cache's own endpoint                                           */

kvt_status kvt__metrics_cache_start(kvt_cache *c)
{
    if (c->cfg.metrics_port == 0) return KVT_OK;
    return kvt__metrics_http_start("kvt_cache_create", c->cfg.metrics_addr, c->cfg.metrics_port,
                                   c->cfg.metrics_insecure, c, &c->metrics_http);
}

void kvt__metrics_cache_stop(kvt_cache *c)
{
    kvt__metrics_http_stop(c->metrics_http);
    c->metrics_http = NULL;
}

void kvt__metrics_cache_set_extra(kvt_cache *c, kvt_metrics_extra_fn extra, void *arg)
{
    kvt__metrics_http_set_extra(c->metrics_http, extra, arg);
}

uint16_t kvt__metrics_cache_port(const kvt_cache *c) { return kvt__metrics_http_port(c->metrics_http); }
