/* metrics.h - Prometheus text exposition (format 0.0.4) of a cache's
 * counters, and an HTTP endpoint (libmicrohttpd) serving it at GET /metrics.
 *
 * This layer sits above src/cache: it reads a kvt_cache through
 * kvt__cache_observe (cache/observe.h); the cache never calls it. The
 * layers above start the endpoint when metrics_port != 0 and stop it
 * (kvt__metrics_cache_start / _stop): kvt_cache_create and
 * kvt_cache_destroy (src/api/cache.c), so an engine gets metrics without the
 * node server, and the node server's tier of one geometry. The server adds its own
 * families (clients attached, pins per client) to that same endpoint with
 * kvt__metrics_cache_set_extra. docs/metrics.md lists every metric.
 *
 * Nothing here is on the data path: a scrape takes the cache mutex twice,
 * briefly, and reads the latency histograms without it. */
#ifndef KVT_METRICS_METRICS_H
#define KVT_METRICS_METRICS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvtier.h"
#include "util/latency.h"

/* ------------------------------------------------------------------ */
/* The exposition buffer                                              */

/* A growing text buffer; on allocation failure it stops growing and
 * remembers it (render then fails with KVT_ENOMEM). */
typedef struct kvt_mbuf {
    char *data; /* NUL-terminated; malloc'd */
    size_t len, cap;
    bool failed;
} kvt_mbuf;

void kvt__mbuf_free(kvt_mbuf *b);
void kvt__mbuf_printf(kvt_mbuf *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* One family: its HELP and TYPE lines (type "counter", "gauge",
 * "histogram"). Write every sample of the family right after it. */
void kvt__metrics_family(kvt_mbuf *b, const char *name, const char *type, const char *help);
/* One sample: name{labels} value. labels is NULL or the text between the
 * braces, e.g. "tier=\"cpu\"" (values already escaped). */
void kvt__metrics_u64(kvt_mbuf *b, const char *name, const char *labels, uint64_t v);
/* A whole histogram family in seconds: cumulative _bucket{le=...} lines
 * (+Inf last), _sum and _count. */
void kvt__metrics_histogram(kvt_mbuf *b, const char *name, const char *help,
                            const kvt_lat_snapshot *s);

/* ------------------------------------------------------------------ */
/* Rendering                                                          */

/* The server_quotas families, one sample per rule labelled prefix="...":
 * kvtier_quota_bytes, kvtier_quota_used_bytes and the blocks limited and
 * evicted. Nothing for NULL or no rules. */
struct kvt_quota;
void kvt__metrics_quotas(kvt_mbuf *b, const struct kvt_quota *q);

/* Called at the end of a render to add families (the node server's). */
typedef void (*kvt_metrics_extra_fn)(kvt_mbuf *b, void *arg);

/* Appends the cache's families to b, then extra's (extra may be NULL).
 * KVT_ENOMEM if the buffer could not grow. */
kvt_status kvt__metrics_render(kvt_mbuf *b, kvt_cache *c, kvt_metrics_extra_fn extra, void *arg);

/* The families of several caches (the node server's tiers, one per
 * geometry), each sample labelled with labels[i] (the text between braces,
 * e.g. geometry="g0123..."), every family declared once; then extra's.
 * KVT_ENOMEM; a cache's observation failing. */
kvt_status kvt__metrics_render_multi(kvt_mbuf *b, kvt_cache *const *caches,
                                     const char *const *labels, uint32_t n,
                                     kvt_metrics_extra_fn extra, void *arg);

/* The node server's families, ready-made for an extra callback:
 * kvtier_clients_attached (gauge) and kvtier_client_pins{pid="..."}
 * (gauge: index entries pinned by the client's tasks). Clients of the same
 * pid are summed into one sample (a series must not repeat). */
typedef struct kvt_metrics_client {
    int64_t pid;
    uint64_t pins;
} kvt_metrics_client;
void kvt__metrics_clients(kvt_mbuf *b, const kvt_metrics_client *clients, uint32_t n);

/* ------------------------------------------------------------------ */
/* The HTTP endpoint                                                  */

typedef struct kvt_metrics_http kvt_metrics_http;

/* Serves GET /metrics for cache c on addr:port (numeric IPv4 or IPv6;
 * port 0 picks a free port: see kvt__metrics_http_port). A non-loopback
 * addr is refused (KVT_EINVAL, naming metrics_insecure) unless insecure.
 * Any other path is 404, any other method on /metrics 405. fn names the
 * caller in error messages. */
kvt_status kvt__metrics_http_start(const char *fn, const char *addr, uint32_t port, bool insecure,
                                   kvt_cache *c, kvt_metrics_http **out);
/* The same for several caches, found at each scrape: sources fills caches
 * and labels (room for max; labels as kvt__metrics_render_multi takes
 * them) and returns how many. The node server, one tier per geometry. */
typedef uint32_t (*kvt_metrics_sources_fn)(void *arg, kvt_cache **caches, const char **labels,
                                           uint32_t max);
kvt_status kvt__metrics_http_start_sources(const char *fn, const char *addr, uint32_t port,
                                           bool insecure, kvt_metrics_sources_fn sources,
                                           void *arg, kvt_metrics_http **out);
uint16_t kvt__metrics_http_port(const kvt_metrics_http *h);
/* Sets (or clears, with NULL) the families added after the cache's. Once
 * it returns, no scrape still uses the previous extra or arg. */
void kvt__metrics_http_set_extra(kvt_metrics_http *h, kvt_metrics_extra_fn extra, void *arg);
/* Stops serving; waits for a scrape in progress. NULL is a no-op. */
void kvt__metrics_http_stop(kvt_metrics_http *h);

/* The cache's own endpoint, from its metrics_port, metrics_addr and
 * metrics_insecure options: started once the cache is complete, stopped
 * before any of it is freed (src/api/cache.c, src/server). */
kvt_status kvt__metrics_cache_start(kvt_cache *c);
void kvt__metrics_cache_stop(kvt_cache *c);
/* The node server: add its families to the cache's endpoint (a no-op when
 * metrics_port is 0). Clear it (NULL) before freeing what arg points to. */
void kvt__metrics_cache_set_extra(kvt_cache *c, kvt_metrics_extra_fn extra, void *arg);
/* The cache's endpoint port (0: none). */
uint16_t kvt__metrics_cache_port(const kvt_cache *c);

#endif
