/* The Prometheus endpoint (src/metrics): a cache started with metrics_port
 * is scraped over loopback after real stores, lookups and loads, and the
 * figures must have moved by exactly what those calls did; the SSD tier's
 * figures after a warm restart; latency histograms recorded by concurrent
 * threads while a scraper reads them; the address and port rules; 404 and
 * 405 for anything but GET /metrics; the node server's families.
 *
 * `test_conc_metrics --dump` prints one exposition (SSD tier, every family,
 * the server's families) for tests/promtool_metrics.sh. */
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "cache/cache.h"
#include "cache/quota.h"
#include "metrics/metrics.h"
#include "support.h"

#define WAIT_MS 20000
#define BT 8
#define TOKENS 33 /* 4 full blocks + 1 */
#define BLOCKS 4

/* ------------------------------------------------------------------ */
/* A tiny HTTP client                                                 */

typedef struct http_reply {
    int code;
    char *head; /* status line and headers */
    char *body;
} http_reply;

static void reply_free(http_reply *r)
{
    free(r->head);
    r->head = r->body = NULL;
}

static http_reply http(uint16_t port, const char *method, const char *path)
{
    http_reply r = {0};
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    char req[256];
    int n = snprintf(req, sizeof req, "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close"
                     "\r\nContent-Length: 0\r\n\r\n", method, path);
    assert_int_equal(write(fd, req, (size_t)n), n);
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (len + 1 >= cap) buf = realloc(buf, cap *= 2);
        ssize_t got = read(fd, buf + len, cap - len - 1);
        assert_true(got >= 0);
        if (got == 0) break;
        len += (size_t)got;
    }
    close(fd);
    buf[len] = '\0';
    assert_int_equal(sscanf(buf, "HTTP/1.%*d %d", &r.code), 1);
    char *sep = strstr(buf, "\r\n\r\n");
    assert_non_null(sep);
    *sep = '\0';
    r.head = buf;
    r.body = sep + 4;
    return r;
}

/* The value of one series ("name" or "name{labels}"), or -1 if absent. */
static double series(const char *body, const char *name)
{
    size_t n = strlen(name);
    for (const char *p = body; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
        if (strncmp(p, name, n) == 0 && p[n] == ' ') return strtod(p + n + 1, NULL);
    return -1;
}

static void expect(const char *body, const char *name, double want)
{
    double got = series(body, name);
    if (got != want) fail_msg("%s is %g, want %g\n---\n%s", name, got, want, body);
}

/* A TCP port nothing listens on now (bind to port 0, read it, close). */
static uint16_t free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    socklen_t len = sizeof a;
    assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    close(fd);
    return ntohs(a.sin_port);
}

/* ------------------------------------------------------------------ */
/* A cache with the emulated engine                                   */

typedef struct env {
    kvt_geometry *geo;
    kvt_config *cfg;
    kvt_cache *cache;
    kvt_emu *emu;
    uint64_t block_bytes;
    uint16_t port;
    char dir[256];
} env;

static void make_dir(env *e)
{
    const char *base = getenv("KVTIER_TEST_TMP");
    if (!base || !*base) base = "/tmp";
    char cmd[300];
    snprintf(cmd, sizeof cmd, "mkdir -p %s", base);
    assert_int_equal(system(cmd), 0);
    snprintf(e->dir, sizeof e->dir, "%s/metrics-XXXXXX", base);
    assert_non_null(mkdtemp(e->dir));
}

static void remove_dir(const char *dir)
{
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

/* A cache of cpu_blocks (and ssd_blocks on e->dir when nonzero) serving
 * metrics on a free loopback port. */
static void open_cache(env *e, uint32_t cpu_blocks, uint32_t ssd_blocks)
{
    e->geo = kvt_test_geometry(2, 2, 64, 4, KVT_LAYOUT_LAYER_FIRST);
    assert_non_null(e->geo);
    kvt_geometry_info info;
    assert_ok(kvt_geometry_info_get(e->geo, &info));
    e->block_bytes = info.bytes_per_token * BT;
    char v[64];
    assert_ok(kvt_config_create(&e->cfg));
    snprintf(v, sizeof v, "%llu", (unsigned long long)(cpu_blocks * e->block_bytes));
    assert_ok(kvt_config_set(e->cfg, "cpu_capacity", v));
    if (ssd_blocks) {
        snprintf(v, sizeof v, "%llu", (unsigned long long)(ssd_blocks * e->block_bytes));
        assert_ok(kvt_config_set(e->cfg, "ssd_capacity", v));
        assert_ok(kvt_config_set(e->cfg, "ssd_dirs", e->dir));
        assert_ok(kvt_config_set(e->cfg, "io", "threads"));
    }
    assert_ok(kvt_config_set(e->cfg, "block_tokens", "8"));
    assert_ok(kvt_config_set(e->cfg, "huge_pages", "false"));
    /* Another process may take the free port first: try a few. */
    kvt_status st = KVT_EBUSY;
    for (int tries = 0; tries < 5 && st == KVT_EBUSY; tries++) {
        e->port = free_port();
        snprintf(v, sizeof v, "%u", (unsigned)e->port);
        assert_ok(kvt_config_set(e->cfg, "metrics_port", v));
        st = kvt_cache_create(&e->cache, e->cfg, e->geo);
    }
    assert_ok(st);
    assert_int_equal(kvt__metrics_cache_port(e->cache), e->port);
    assert_ok(kvt_emu_create(&e->emu, e->geo, 256));
    kvt_engine_memory mem;
    assert_ok(kvt_emu_memory(e->emu, &mem));
    assert_ok(kvt_cache_register_memory(e->cache, &mem));
}

static void close_cache(env *e)
{
    kvt_cache_destroy(e->cache);
    kvt_emu_destroy(e->emu);
    kvt_config_destroy(e->cfg);
    kvt_geometry_destroy(e->geo);
    e->cache = NULL;
    e->emu = NULL;
    e->cfg = NULL;
    e->geo = NULL;
}

static void request(uint32_t *tokens, uint32_t seed, kvt_request *r)
{
    kvt_test_tokens(tokens, TOKENS, seed);
    kvt_request x = {.tokens = tokens, .num_tokens = TOKENS};
    *r = x;
}

static void store(env *e, const kvt_request *r)
{
    uint32_t pages[16];
    for (uint32_t i = 0; i < 16; i++) pages[i] = i;
    assert_ok(kvt_emu_fill(e->emu, r, 0, r->num_tokens, pages, 9));
    kvt_store_plan p;
    assert_ok(kvt_cache_prepare_store(e->cache, r, &p));
    assert_true(p.task != 0);
    assert_int_equal(p.num_tokens, BLOCKS * BT);
    assert_ok(kvt_cache_launch(e->cache, p.task, pages, 9));
    kvt_task_result res;
    assert_ok(kvt_cache_wait(e->cache, p.task, WAIT_MS, &res));
    assert_int_equal(res.status, KVT_OK);
}

/* Looks r up and loads what matched (byte-checked); returns the tokens matched. */
static uint32_t load(env *e, const kvt_request *r, uint32_t page_base)
{
    uint32_t pages[16];
    for (uint32_t i = 0; i < 16; i++) pages[i] = page_base + i;
    kvt_match m;
    assert_ok(kvt_cache_lookup(e->cache, r, &m));
    if (!m.task) return 0;
    assert_ok(kvt_emu_poison(e->emu, pages, 9));
    assert_ok(kvt_cache_launch(e->cache, m.task, pages, 9));
    kvt_task_result res;
    assert_ok(kvt_cache_wait(e->cache, m.task, WAIT_MS, &res));
    assert_int_equal(res.status, KVT_OK);
    kvt_verify_result v;
    assert_ok(kvt_emu_verify(e->emu, r, 0, m.matched_tokens, pages, 9, &v));
    assert_int_equal(v.mismatches, 0);
    return m.matched_tokens;
}

/* Every histogram's buckets are cumulative and end in +Inf == _count. */
static void check_histogram(const char *body, const char *name, double want_count)
{
    char s[160];
    double prev = 0;
    for (unsigned i = 0; i < KVT_LAT_BOUNDS; i++) {
        snprintf(s, sizeof s, "%s_bucket{le=\"%s\"}", name, kvt__lat_bound_le[i]);
        double v = series(body, s);
        assert_true(v >= prev);
        prev = v;
    }
    snprintf(s, sizeof s, "%s_bucket{le=\"+Inf\"}", name);
    expect(body, s, want_count);
    assert_true(prev <= want_count);
    snprintf(s, sizeof s, "%s_count", name);
    expect(body, s, want_count);
    snprintf(s, sizeof s, "%s_sum", name);
    double sum = series(body, s);
    assert_true(sum >= 0);
    if (want_count > 0) assert_true(sum > 0);
}

/* ------------------------------------------------------------------ */
/* Tests                                                              */

static void test_scrape_cpu_tier(void **state)
{
    (void)state;
    env e = {0};
    open_cache(&e, 64, 0);
    http_reply r0 = http(e.port, "GET", "/metrics");
    assert_int_equal(r0.code, 200);
    assert_non_null(strstr(r0.head, "text/plain; version=0.0.4"));
    expect(r0.body, "kvtier_lookups_total", 0);
    expect(r0.body, "kvtier_lookup_duration_seconds_count", 0);
    reply_free(&r0);

    uint32_t ta[TOKENS], tb[TOKENS];
    kvt_request a, b;
    request(ta, 1, &a);
    request(tb, 2, &b);
    store(&e, &a);
    uint32_t hit = load(&e, &a, 32);          /* matches all 4 blocks */
    assert_int_equal(hit, BLOCKS * BT);
    assert_int_equal(load(&e, &b, 64), 0);    /* matches nothing */

    http_reply r = http(e.port, "GET", "/metrics");
    assert_int_equal(r.code, 200);
    const char *m = r.body;
    double bb = (double)e.block_bytes;
    expect(m, "kvtier_lookups_total", 2);
    expect(m, "kvtier_lookup_tokens_total", 2 * TOKENS);
    expect(m, "kvtier_hit_tokens_total{tier=\"cpu\"}", hit);
    expect(m, "kvtier_miss_tokens_total{tier=\"cpu\"}", 2 * TOKENS - hit);
    expect(m, "kvtier_hit_tokens_total{tier=\"ssd\"}", -1); /* no SSD tier: no series */
    expect(m, "kvtier_stores_total", 1);
    expect(m, "kvtier_stored_blocks_total", BLOCKS);
    expect(m, "kvtier_loads_total", 1);
    expect(m, "kvtier_loaded_blocks_total", BLOCKS);
    expect(m, "kvtier_tier_in_bytes_total{tier=\"cpu\"}", BLOCKS * bb);
    expect(m, "kvtier_tier_out_bytes_total{tier=\"cpu\"}", BLOCKS * bb);
    expect(m, "kvtier_tier_used_blocks{tier=\"cpu\"}", BLOCKS);
    expect(m, "kvtier_tier_capacity_blocks{tier=\"cpu\"}", 64);
    expect(m, "kvtier_block_bytes", bb);
    expect(m, "kvtier_index_blocks", BLOCKS);
    expect(m, "kvtier_tasks_in_flight", 0);
    expect(m, "kvtier_evicted_blocks_total", 0);
    expect(m, "kvtier_corrupt_blocks_total", 0);
    expect(m, "kvtier_tasks_failed_total", 0);
    check_histogram(m, "kvtier_lookup_duration_seconds", 2);
    check_histogram(m, "kvtier_load_duration_seconds", 1);
    check_histogram(m, "kvtier_store_duration_seconds", 1);
    assert_null(strstr(m, "kvtier_ssd_"));
    assert_null(strstr(m, "kvtier_clients_attached")); /* the server's, not the cache's */
    expect(m, "kvtier_build_info{version=\"" KVT_VERSION_STRING "\"}", 1);
    reply_free(&r);

    /* A cancelled plan counts as cancelled, not as a load. */
    kvt_match mt;
    assert_ok(kvt_cache_lookup(e.cache, &a, &mt));
    assert_ok(kvt_cache_cancel(e.cache, mt.task));
    r = http(e.port, "GET", "/metrics?ignored=1");
    assert_int_equal(r.code, 200);
    expect(r.body, "kvtier_tasks_cancelled_total", 1);
    expect(r.body, "kvtier_loads_total", 1);
    expect(r.body, "kvtier_lookups_total", 3);
    expect(r.body, "kvtier_hit_tokens_total{tier=\"cpu\"}", 2 * hit);
    check_histogram(r.body, "kvtier_load_duration_seconds", 1);
    reply_free(&r);
    close_cache(&e);
}

/* A warm restart: every block of the request is on the SSD only, so the
 * whole hit is the SSD's and every byte of it was read back. */
static void test_scrape_ssd_tier(void **state)
{
    (void)state;
    env e = {0};
    make_dir(&e);
    uint32_t ta[TOKENS];
    kvt_request a;
    request(ta, 7, &a);
    open_cache(&e, 16, 64);
    store(&e, &a);
    assert_ok(kvt_cache_flush(e.cache, WAIT_MS));
    http_reply r = http(e.port, "GET", "/metrics");
    double bb = (double)e.block_bytes;
    expect(r.body, "kvtier_ssd_written_blocks_total", BLOCKS);
    expect(r.body, "kvtier_tier_in_bytes_total{tier=\"ssd\"}", BLOCKS * bb);
    expect(r.body, "kvtier_ssd_queue_depth{op=\"write\"}", 0);
    expect(r.body, "kvtier_ssd_queue_depth{op=\"read\"}", 0);
    expect(r.body, "kvtier_ssd_writes_off", 0);
    reply_free(&r);
    r = http(e.port, "GET", "/healthz"); /* every tier works */
    assert_int_equal(r.code, 200);
    assert_string_equal(r.body, "ok\n");
    reply_free(&r);
    close_cache(&e);

    open_cache(&e, 16, 64);
    uint32_t hit = load(&e, &a, 32);
    assert_int_equal(hit, BLOCKS * BT);
    r = http(e.port, "GET", "/metrics");
    const char *m = r.body;
    expect(m, "kvtier_recovered_blocks_total", BLOCKS);
    expect(m, "kvtier_hit_tokens_total{tier=\"ssd\"}", hit);
    expect(m, "kvtier_hit_tokens_total{tier=\"cpu\"}", 0);
    expect(m, "kvtier_miss_tokens_total{tier=\"cpu\"}", TOKENS);
    expect(m, "kvtier_miss_tokens_total{tier=\"ssd\"}", TOKENS - hit);
    expect(m, "kvtier_ssd_read_blocks_total", BLOCKS);
    expect(m, "kvtier_tier_out_bytes_total{tier=\"ssd\"}", BLOCKS * bb);
    expect(m, "kvtier_tier_in_bytes_total{tier=\"cpu\"}", BLOCKS * bb); /* read back */
    expect(m, "kvtier_tier_out_bytes_total{tier=\"cpu\"}", BLOCKS * bb); /* to the engine */
    expect(m, "kvtier_tier_used_blocks{tier=\"ssd\"}", BLOCKS);
    expect(m, "kvtier_tier_capacity_blocks{tier=\"ssd\"}", 64);
    expect(m, "kvtier_ssd_errors_total{op=\"read\"}", 0);
    expect(m, "kvtier_ssd_errors_total{op=\"write\"}", 0);
    expect(m, "kvtier_ssd_queue_depth{op=\"read\"}", 0);
    check_histogram(m, "kvtier_load_duration_seconds", 1);
    reply_free(&r);
    close_cache(&e);
    remove_dir(e.dir);
}

static void test_refuses_other_requests(void **state)
{
    (void)state;
    env e = {0};
    open_cache(&e, 16, 0);
    static const char *const methods[] = {"POST", "PUT", "DELETE", "HEAD", "OPTIONS"};
    for (unsigned i = 0; i < sizeof methods / sizeof methods[0]; i++) {
        http_reply r = http(e.port, methods[i], "/metrics");
        if (r.code != 405) fail_msg("%s /metrics gave %d, want 405", methods[i], r.code);
        assert_non_null(strstr(r.head, "Allow: GET"));
        reply_free(&r);
    }
    static const char *const paths[] = {"/", "/metric", "/metrics/", "/metricsx", "/x/metrics"};
    for (unsigned i = 0; i < sizeof paths / sizeof paths[0]; i++) {
        http_reply r = http(e.port, "GET", paths[i]);
        if (r.code != 404) fail_msg("GET %s gave %d, want 404", paths[i], r.code);
        reply_free(&r);
    }
    http_reply r = http(e.port, "POST", "/other");
    assert_int_equal(r.code, 404);
    reply_free(&r);
    r = http(e.port, "POST", "/healthz");
    assert_int_equal(r.code, 405);
    reply_free(&r);
    r = http(e.port, "GET", "/healthz");
    assert_int_equal(r.code, 200);
    reply_free(&r);
    close_cache(&e);
}

static kvt_status create_with(const char *addr, const char *port, const char *insecure)
{
    kvt_geometry *g = kvt_test_geometry(2, 2, 64, 4, KVT_LAYOUT_LAYER_FIRST);
    kvt_config *cfg = NULL;
    assert_ok(kvt_config_create(&cfg));
    assert_ok(kvt_config_set(cfg, "cpu_capacity", "1MiB"));
    assert_ok(kvt_config_set(cfg, "block_tokens", "8"));
    assert_ok(kvt_config_set(cfg, "huge_pages", "false"));
    assert_ok(kvt_config_set(cfg, "metrics_addr", addr));
    assert_ok(kvt_config_set(cfg, "metrics_port", port));
    assert_ok(kvt_config_set(cfg, "metrics_insecure", insecure));
    kvt_cache *c = NULL;
    kvt_status st = kvt_cache_create(&c, cfg, g);
    kvt_cache_destroy(c);
    kvt_config_destroy(cfg);
    kvt_geometry_destroy(g);
    return st;
}

static int open_fds(void)
{
    int n = 0;
    for (int fd = 0; fd < 4096; fd++) n += fcntl(fd, F_GETFD) != -1;
    return n;
}

static void test_address_rules(void **state)
{
    (void)state;
    int fds = open_fds();
    char port[16];
    snprintf(port, sizeof port, "%u", (unsigned)free_port());
    /* Off by default: the default config serves nothing. */
    kvt_config *cfg = NULL;
    assert_ok(kvt_config_create(&cfg));
    char v[64];
    assert_ok(kvt_config_get(cfg, "metrics_port", v, sizeof v));
    assert_string_equal(v, "0");
    assert_ok(kvt_config_get(cfg, "metrics_addr", v, sizeof v));
    assert_string_equal(v, "127.0.0.1");
    assert_status(kvt_config_set(cfg, "metrics_port", "65536"), KVT_EINVAL);
    kvt_config_destroy(cfg);

    assert_status(create_with("0.0.0.0", port, "false"), KVT_EINVAL);
    assert_non_null(strstr(kvt_last_error(), "metrics_insecure"));
    assert_status(create_with("10.1.2.3", port, "false"), KVT_EINVAL);
    assert_status(create_with("::", port, "false"), KVT_EINVAL);
    assert_status(create_with("localhost", port, "false"), KVT_EINVAL);
    assert_non_null(strstr(kvt_last_error(), "not a numeric"));
    assert_ok(create_with("127.0.0.1", port, "false"));
    assert_ok(create_with("0.0.0.0", port, "true"));

    /* A port taken: KVT_EBUSY naming it. */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(fd, 1), 0);
    socklen_t len = sizeof a;
    assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    snprintf(port, sizeof port, "%u", (unsigned)ntohs(a.sin_port));
    assert_status(create_with("127.0.0.1", port, "false"), KVT_EBUSY);
    assert_non_null(strstr(kvt_last_error(), port));
    close(fd);
    /* Every refusal and every stop closed its sockets. */
    assert_int_equal(open_fds(), fds);
}

/* The node server's families, through kvt__metrics_http_* directly. */
typedef struct srv_view {
    kvt_metrics_client clients[3];
    uint32_t n;
    kvt_quota *quota;
} srv_view;

static void srv_extra(kvt_mbuf *b, void *arg)
{
    const srv_view *v = arg;
    kvt__metrics_clients(b, v->clients, v->n);
    kvt__metrics_quotas(b, v->quota);
}

/* server_quotas of two rules, one prefix needing escapes, with use. */
static void two_quotas(kvt_quota *q)
{
    assert_ok(kvt__quota_parse("team \"a\"\\x=1MiB; -=64KiB", "server_quotas", q));
    atomic_store(&q->pool.used[1], 12288);
    atomic_store(&q->limited[1], 3);
    atomic_store(&q->evicted[2], 5);
}

static void test_server_families(void **state)
{
    (void)state;
    env e = {0};
    open_cache(&e, 16, 0);
    kvt_metrics_http *h = NULL;
    assert_ok(kvt__metrics_http_start("test", "::1", 0, false, e.cache, &h));
    uint16_t port = kvt__metrics_http_port(h);
    assert_true(port != 0);
    kvt_quota q;
    two_quotas(&q);
    srv_view v = {{{4242, 3}, {17, 5}, {4242, 4}}, 3, &q};
    kvt__metrics_http_set_extra(h, srv_extra, &v);
    /* IPv6 loopback: talk to it by its v4 twin? No: connect over ::1. */
    int fd = socket(AF_INET6, SOCK_STREAM, 0);
    struct sockaddr_in6 a6 = {.sin6_family = AF_INET6, .sin6_port = htons(port),
                              .sin6_addr = IN6ADDR_LOOPBACK_INIT};
    assert_int_equal(connect(fd, (struct sockaddr *)&a6, sizeof a6), 0);
    const char req[] = "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    assert_int_equal(write(fd, req, sizeof req - 1), (ssize_t)(sizeof req - 1));
    static char buf[1 << 17];
    size_t len = 0;
    ssize_t got;
    while ((got = read(fd, buf + len, sizeof buf - 1 - len)) > 0) len += (size_t)got;
    close(fd);
    buf[len] = '\0';
    assert_non_null(strstr(buf, "200 OK"));
    const char *body = strstr(buf, "\r\n\r\n") + 4;
    expect(body, "kvtier_clients_attached", 3);
    expect(body, "kvtier_client_pins{pid=\"4242\"}", 7); /* one series per pid */
    expect(body, "kvtier_client_pins{pid=\"17\"}", 5);
    expect(body, "kvtier_lookups_total", 0);
    expect(body, "kvtier_quota_bytes{prefix=\"team \\\"a\\\"\\\\x\"}", 1 << 20);
    expect(body, "kvtier_quota_bytes{prefix=\"-\"}", 65536);
    expect(body, "kvtier_quota_used_bytes{prefix=\"team \\\"a\\\"\\\\x\"}", 12288);
    expect(body, "kvtier_quota_limited_blocks_total{prefix=\"team \\\"a\\\"\\\\x\"}", 3);
    expect(body, "kvtier_quota_evicted_blocks_total{prefix=\"-\"}", 5);
    kvt__metrics_http_set_extra(h, NULL, NULL);
    kvt__metrics_http_stop(h);
    /* The cache's own endpoint has no server families. */
    http_reply r = http(e.port, "GET", "/metrics");
    assert_null(strstr(r.body, "kvtier_clients_attached"));
    reply_free(&r);
    close_cache(&e);
}

static void test_buckets(void **state)
{
    (void)state;
    assert_int_equal(kvt__lat_bucket(0), 0);
    assert_int_equal(kvt__lat_bucket(1000), 0);     /* le is inclusive */
    assert_int_equal(kvt__lat_bucket(1001), 1);
    assert_int_equal(kvt__lat_bucket(10000000000ull), KVT_LAT_BOUNDS - 1);
    assert_int_equal(kvt__lat_bucket(10000000001ull), KVT_LAT_BOUNDS);
    for (unsigned i = 1; i < KVT_LAT_BOUNDS; i++) {
        assert_true(kvt__lat_bound_ns[i] > kvt__lat_bound_ns[i - 1]);
        /* The label says the same bound in seconds. */
        assert_true(strtod(kvt__lat_bound_le[i], NULL) * 1e9 - (double)kvt__lat_bound_ns[i] < 1);
        assert_true((double)kvt__lat_bound_ns[i] - strtod(kvt__lat_bound_le[i], NULL) * 1e9 < 1);
    }
    static kvt_lat_hist h;
    kvt__lat_record(&h, 1500);
    kvt__lat_record(&h, 3000000000ull);
    kvt_lat_snapshot s;
    kvt__lat_snapshot(&h, &s);
    assert_int_equal(s.count, 2);
    assert_int_equal(s.sum_ns, 3000001500ull);
    assert_int_equal(s.bucket[1], 1);
    kvt_mbuf b = {0};
    kvt__metrics_histogram(&b, "x_seconds", "help", &s);
    assert_false(b.failed);
    expect(b.data, "x_seconds_bucket{le=\"1e-06\"}", 0);
    expect(b.data, "x_seconds_bucket{le=\"2.5e-06\"}", 1);
    expect(b.data, "x_seconds_bucket{le=\"2.5\"}", 1);
    expect(b.data, "x_seconds_bucket{le=\"5\"}", 2);
    expect(b.data, "x_seconds_bucket{le=\"+Inf\"}", 2);
    assert_non_null(strstr(b.data, "x_seconds_sum 3.000001500\n"));
    kvt__mbuf_free(&b);
}

/* Threads look up while a scraper reads: every lookup lands in the
 * histogram exactly once, and no scrape sees a count beyond the lookups. */
#define LOOKUP_THREADS 3
#define LOOKUPS_EACH 300

typedef struct conc_arg {
    env *e;
    const kvt_request *req;
} conc_arg;

static void *lookup_thread(void *p)
{
    conc_arg *a = p;
    for (int i = 0; i < LOOKUPS_EACH; i++) {
        kvt_match m;
        if (kvt_cache_lookup(a->e->cache, a->req, &m) != KVT_OK) return (void *)1;
        if (m.task && kvt_cache_cancel(a->e->cache, m.task) != KVT_OK) return (void *)1;
        kvt_task_result res;
        if (m.task && kvt_cache_wait(a->e->cache, m.task, WAIT_MS, &res) != KVT_OK)
            return (void *)1;
    }
    return NULL;
}

static void test_concurrent_recording(void **state)
{
    (void)state;
    env e = {0};
    open_cache(&e, 64, 0);
    uint32_t ta[TOKENS];
    kvt_request a;
    request(ta, 3, &a);
    store(&e, &a);
    pthread_t th[LOOKUP_THREADS];
    conc_arg arg = {&e, &a};
    for (int i = 0; i < LOOKUP_THREADS; i++)
        assert_int_equal(pthread_create(&th[i], NULL, lookup_thread, &arg), 0);
    double last = 0;
    for (int i = 0; i < 10; i++) {
        http_reply r = http(e.port, "GET", "/metrics");
        assert_int_equal(r.code, 200);
        double n = series(r.body, "kvtier_lookup_duration_seconds_count");
        assert_true(n >= last && n <= LOOKUP_THREADS * LOOKUPS_EACH);
        last = n;
        reply_free(&r);
    }
    for (int i = 0; i < LOOKUP_THREADS; i++) {
        void *ret;
        pthread_join(th[i], &ret);
        assert_null(ret);
    }
    http_reply r = http(e.port, "GET", "/metrics");
    double n = LOOKUP_THREADS * LOOKUPS_EACH;
    expect(r.body, "kvtier_lookups_total", n);
    check_histogram(r.body, "kvtier_lookup_duration_seconds", n);
    expect(r.body, "kvtier_hit_tokens_total{tier=\"cpu\"}", n * BLOCKS * BT);
    expect(r.body, "kvtier_tasks_cancelled_total", n);
    reply_free(&r);
    close_cache(&e);
}

static uint32_t multi_sources(void *arg, kvt_cache **caches, const char **labels, uint32_t max)
{
    env *const *e = arg;
    static const char *const names[2] = {"geometry=\"gA\"", "geometry=\"gB\""};
    uint32_t n = max < 2 ? max : 2;
    for (uint32_t i = 0; i < n; i++) {
        caches[i] = e[i]->cache;
        labels[i] = names[i];
    }
    return n;
}

/* A node server of several geometries: one exposition, every family
 * declared once, each tier's samples labelled geometry="...", with its
 * own values; /healthz looks at every tier. */
static void test_multi_geometry_scrape(void **state)
{
    (void)state;
    env a = {0}, b = {0};
    open_cache(&a, 16, 0);
    open_cache(&b, 16, 0);
    uint32_t ta[TOKENS];
    kvt_request ra;
    request(ta, 31, &ra);
    store(&a, &ra);
    load(&a, &ra, 32);
    env *both[2] = {&a, &b};
    kvt_metrics_http *h = NULL;
    assert_ok(kvt__metrics_http_start_sources("test", "127.0.0.1", 0, false, multi_sources, both,
                                              &h));
    http_reply r = http(kvt__metrics_http_port(h), "GET", "/metrics");
    assert_int_equal(r.code, 200);
    expect(r.body, "kvtier_loads_total{geometry=\"gA\"}", 1);
    expect(r.body, "kvtier_loads_total{geometry=\"gB\"}", 0);
    expect(r.body, "kvtier_tier_capacity_blocks{geometry=\"gB\",tier=\"cpu\"}", 16);
    expect(r.body, "kvtier_load_duration_seconds_count{geometry=\"gA\"}", 1);
    expect(r.body, "kvtier_load_duration_seconds_bucket{geometry=\"gB\",le=\"+Inf\"}", 0);
    expect(r.body, "kvtier_build_info{geometry=\"gA\",version=\"" KVT_VERSION_STRING "\"}", 1);
    for (const char *p = r.body; (p = strstr(p, "# TYPE ")) != NULL; p++) {
        const char *eol = strchr(p, '\n');
        char line[160];
        snprintf(line, sizeof line, "%.*s\n", (int)(eol - p), p);
        const char *again = strstr(eol, line);
        if (again) fail_msg("declared twice: %s", line);
    }
    assert_null(strstr(r.body, "\nkvtier_loads_total ")); /* no unlabelled sample */
    reply_free(&r);
    r = http(kvt__metrics_http_port(h), "GET", "/healthz");
    assert_int_equal(r.code, 200);
    reply_free(&r);
    kvt__metrics_http_stop(h);
    close_cache(&b);
    close_cache(&a);
}

/* --dump: one exposition with every family, for promtool. */
static int dump(void)
{
    env e = {0};
    make_dir(&e);
    uint32_t ta[TOKENS], tb[TOKENS];
    kvt_request a, b;
    request(ta, 11, &a);
    request(tb, 12, &b);
    open_cache(&e, 16, 64);
    store(&e, &a);
    load(&e, &a, 32);
    load(&e, &b, 64);
    assert_ok(kvt_cache_flush(e.cache, WAIT_MS));
    /* As a node server of two geometries renders it: a tier with an SSD
     * and one without, labelled, then the server's families. */
    env e2 = {0};
    open_cache(&e2, 16, 0);
    load(&e2, &a, 0);
    kvt_quota q;
    two_quotas(&q);
    srv_view v = {{{4242, 3}, {17, 5}, {4242, 4}}, 3, &q};
    kvt_mbuf buf = {0};
    kvt_cache *caches[2] = {e.cache, e2.cache};
    const char *labels[2] = {"geometry=\"g00000000000000aa\"", "geometry=\"g00000000000000bb\""};
    assert_ok(kvt__metrics_render_multi(&buf, caches, labels, 2, srv_extra, &v));
    fwrite(buf.data, 1, buf.len, stdout);
    kvt__mbuf_free(&buf);
    close_cache(&e2);
    close_cache(&e);
    remove_dir(e.dir);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "--dump") == 0) return dump();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_multi_geometry_scrape),
        cmocka_unit_test(test_buckets),
        cmocka_unit_test(test_scrape_cpu_tier),
        cmocka_unit_test(test_scrape_ssd_tier),
        cmocka_unit_test(test_refuses_other_requests),
        cmocka_unit_test(test_address_rules),
        cmocka_unit_test(test_server_families),
        cmocka_unit_test(test_concurrent_recording),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
