/* render.c - the Prometheus text exposition of a cache (metrics.h).
 * docs/metrics.md says what every family means; keep the two in step. */
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache/observe.h"
#include "cache/quota.h"
#include "metrics/metrics.h"
#include "util/err.h"

/* ------------------------------------------------------------------ */
/* Buffer                                                             */

void kvt__mbuf_free(kvt_mbuf *b)
{
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}

static bool mbuf_reserve(kvt_mbuf *b, size_t more)
{
    if (b->failed) return false;
    if (b->len + more + 1 <= b->cap) return true;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + more + 1) cap *= 2;
    char *d = realloc(b->data, cap);
    if (!d) {
        b->failed = true;
        return false;
    }
    b->data = d;
    b->cap = cap;
    return true;
}

void kvt__mbuf_printf(kvt_mbuf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0 || !mbuf_reserve(b, (size_t)n)) {
        b->failed = true;
        return;
    }
    va_start(ap, fmt);
    vsnprintf(b->data + b->len, b->cap - b->len, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

/* ------------------------------------------------------------------ */
/* Families and samples                                               */

void kvt__metrics_family(kvt_mbuf *b, const char *name, const char *type, const char *help)
{
    kvt__mbuf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

void kvt__metrics_u64(kvt_mbuf *b, const char *name, const char *labels, uint64_t v)
{
    if (labels && *labels)
        kvt__mbuf_printf(b, "%s{%s} %llu\n", name, labels, (unsigned long long)v);
    else
        kvt__mbuf_printf(b, "%s %llu\n", name, (unsigned long long)v);
}

void kvt__metrics_histogram(kvt_mbuf *b, const char *name, const char *help,
                            const kvt_lat_snapshot *s)
{
    kvt__metrics_family(b, name, "histogram", help);
    uint64_t cum = 0;
    for (unsigned i = 0; i < KVT_LAT_BOUNDS; i++) {
        cum += s->bucket[i];
        kvt__mbuf_printf(b, "%s_bucket{le=\"%s\"} %llu\n", name, kvt__lat_bound_le[i],
                         (unsigned long long)cum);
    }
    cum += s->bucket[KVT_LAT_BOUNDS];
    kvt__mbuf_printf(b, "%s_bucket{le=\"+Inf\"} %llu\n", name, (unsigned long long)cum);
    /* Nanoseconds to seconds, exactly: whole seconds and nine decimals. */
    kvt__mbuf_printf(b, "%s_sum %llu.%09llu\n", name, (unsigned long long)(s->sum_ns / 1000000000ull),
                     (unsigned long long)(s->sum_ns % 1000000000ull));
    kvt__mbuf_printf(b, "%s_count %llu\n", name, (unsigned long long)cum);
}

/* A family with one unlabelled sample. */
static void one(kvt_mbuf *b, const char *name, const char *type, const char *help, uint64_t v)
{
    kvt__metrics_family(b, name, type, help);
    kvt__metrics_u64(b, name, NULL, v);
}

/* A family with a sample per tier (the SSD's only when there is one). */
static void per_tier(kvt_mbuf *b, bool ssd, const char *name, const char *type,
                     const char *help, uint64_t cpu, uint64_t ssd_v)
{
    kvt__metrics_family(b, name, type, help);
    kvt__metrics_u64(b, name, "tier=\"cpu\"", cpu);
    if (ssd) kvt__metrics_u64(b, name, "tier=\"ssd\"", ssd_v);
}

/* ------------------------------------------------------------------ */
/* The cache                                                          */

static void render_cache(kvt_mbuf *b, const kvt_cache_observed *o)
{
    const kvt_cache_stats *s = &o->stats;
    bool ssd = o->has_ssd;
    uint64_t bb = s->block_bytes;
    uint64_t cpu_hit = s->hit_tokens - s->ssd_hit_tokens;

    one(b, "kvtier_lookups_total", "counter", "Lookups answered (kvt_cache_lookup calls that "
        "succeeded).", s->lookups);
    one(b, "kvtier_lookup_tokens_total", "counter", "Tokens of the requests looked up.",
        s->lookup_tokens);
    per_tier(b, ssd, "kvtier_hit_tokens_total", "counter",
             "Tokens a lookup matched, by the tier they are served from (ssd: read back "
             "from the SSD tier).", cpu_hit, s->ssd_hit_tokens);
    per_tier(b, ssd, "kvtier_miss_tokens_total", "counter",
             "Tokens looked up that the tier did not serve (cpu: not matched in the CPU "
             "tier; ssd: matched in neither tier, so the engine computes them).",
             s->lookup_tokens - cpu_hit, s->lookup_tokens - s->hit_tokens);
    per_tier(b, ssd, "kvtier_tier_in_bytes_total", "counter",
             "Bytes written into the tier (cpu: stores from the engine and blocks read "
             "back from the SSD; ssd: blocks written through from the CPU tier).",
             s->stored_bytes + s->ssd_read_blocks * bb, s->ssd_written_blocks * bb);
    per_tier(b, ssd, "kvtier_tier_out_bytes_total", "counter",
             "Bytes the tier served (cpu: loads into the engine; ssd: blocks read back "
             "into the CPU tier).", s->loaded_bytes, s->ssd_read_blocks * bb);
    one(b, "kvtier_stores_total", "counter", "Store tasks that succeeded.", s->stores);
    one(b, "kvtier_stored_blocks_total", "counter", "Blocks stored by store tasks that "
        "succeeded.", s->stored_blocks);
    one(b, "kvtier_loads_total", "counter", "Load tasks that succeeded.", s->loads);
    one(b, "kvtier_loaded_blocks_total", "counter", "Blocks loaded by load tasks that "
        "succeeded.", s->loaded_blocks);
    one(b, "kvtier_tasks_failed_total", "counter", "Tasks that ended with an error (not "
        "cancelled, not expired).", s->failed_tasks);
    one(b, "kvtier_tasks_cancelled_total", "counter", "Tasks cancelled.", s->cancelled_tasks);
    one(b, "kvtier_tasks_expired_total", "counter", "Tasks released because they were not "
        "launched within plan_ttl_ms.", s->expired_tasks);
    one(b, "kvtier_evicted_blocks_total", "counter", "Blocks removed from the cache (from "
        "every tier).", s->evicted_blocks);
    one(b, "kvtier_cpu_dropped_blocks_total", "counter", "CPU copies dropped to make room "
        "while their durable SSD copy stays.", s->cpu_dropped_blocks);
    one(b, "kvtier_corrupt_blocks_total", "counter", "Blocks that failed their checksum "
        "when read back from the SSD or loaded through the node server: dropped, never "
        "served.", s->corrupt_blocks);
    if (ssd) {
        one(b, "kvtier_ssd_written_blocks_total", "counter", "Blocks written to the SSD tier.",
            s->ssd_written_blocks);
        one(b, "kvtier_ssd_read_blocks_total", "counter", "Blocks read back from the SSD "
            "tier.", s->ssd_read_blocks);
        kvt__metrics_family(b, "kvtier_ssd_errors_total", "counter",
                            "SSD I/O that failed (corrupt blocks are counted apart).");
        kvt__metrics_u64(b, "kvtier_ssd_errors_total", "op=\"read\"", s->ssd_read_errors);
        kvt__metrics_u64(b, "kvtier_ssd_errors_total", "op=\"write\"", s->ssd_write_errors);
        kvt__metrics_family(b, "kvtier_ssd_queue_depth", "gauge",
                            "SSD operations queued or in flight.");
        kvt__metrics_u64(b, "kvtier_ssd_queue_depth", "op=\"read\"", o->ssd_read_queue);
        kvt__metrics_u64(b, "kvtier_ssd_queue_depth", "op=\"write\"", o->ssd_write_queue);
        one(b, "kvtier_recovered_blocks_total", "counter", "Blocks found in the SSD tier's "
            "journal when the cache was created.", s->recovered_blocks);
    }
    per_tier(b, ssd, "kvtier_tier_capacity_blocks", "gauge", "Blocks the tier can hold.",
             s->cpu_blocks_total, s->ssd_blocks_total);
    per_tier(b, ssd, "kvtier_tier_used_blocks", "gauge", "Blocks the tier holds now.",
             s->cpu_blocks_used, s->ssd_blocks_used);
    one(b, "kvtier_block_bytes", "gauge", "Bytes of KV in one cache block.", bb);
    one(b, "kvtier_index_blocks", "gauge", "Blocks in the prefix index.", s->index_blocks);
    one(b, "kvtier_index_memory_bytes", "gauge", "Bytes of memory the prefix index uses.",
        s->index_bytes);
    one(b, "kvtier_tasks_in_flight", "gauge", "Tasks planned or running.", s->tasks_in_flight);
    kvt__metrics_histogram(b, "kvtier_lookup_duration_seconds",
                           "Time kvt_cache_lookup took (hashing included), lookups that "
                           "succeeded.", &o->lookup);
    kvt__metrics_histogram(b, "kvtier_load_duration_seconds",
                           "Time from launch to end of load tasks that succeeded.", &o->load);
    kvt__metrics_histogram(b, "kvtier_store_duration_seconds",
                           "Time from launch to end of store tasks that succeeded.", &o->store);
}

/* The cache families (build info first), no extra. */
static kvt_status render_one(kvt_mbuf *b, kvt_cache *c)
{
    kvt_cache_observed o;
    kvt_status st = kvt__cache_observe(c, &o);
    if (st) return st;
    kvt__metrics_family(b, "kvtier_build_info", "gauge",
                        "Always 1; the library's version in its label, to join on.");
    kvt__metrics_u64(b, "kvtier_build_info", "version=\"" KVT_VERSION_STRING "\"", 1);
    render_cache(b, &o);
    if (o.has_ssd)
        one(b, "kvtier_ssd_writes_off", "gauge", "1 when the SSD tier stopped taking writes (out "
            "of space or I/O errors): new blocks are no longer made durable.", o.ssd_writes_off);
    return KVT_OK;
}

/* One family of a rendered text: its HELP/TYPE lines and its samples. */
typedef struct fam {
    const char *name; /* into the text, up to name_len */
    size_t name_len;
    const char *head, *samples, *end; /* head..samples: HELP, TYPE; samples..end */
} fam;

/* Splits text (NUL-terminated, lines ending '\n') into families; returns
 * how many (at most max). */
static uint32_t split_families(const char *text, fam *f, uint32_t max)
{
    uint32_t n = 0;
    for (const char *p = text; *p;) {
        const char *eol = strchr(p, '\n');
        const char *next = eol ? eol + 1 : p + strlen(p);
        if (!strncmp(p, "# HELP ", 7) && n < max) {
            if (n) f[n - 1].end = p;
            const char *nm = p + 7, *sp = strchr(nm, ' ');
            f[n] = (fam){nm, sp ? (size_t)(sp - nm) : 0, p, NULL, NULL};
            n++;
        } else if (n && !f[n - 1].samples && strncmp(p, "# ", 2) != 0) {
            f[n - 1].samples = p;
        }
        p = next;
    }
    if (n) f[n - 1].end = text + strlen(text);
    for (uint32_t i = 0; i < n; i++)
        if (!f[i].samples) f[i].samples = f[i].end;
    return n;
}

/* A family's samples with label (name="value") added first to each. */
static void labelled_samples(kvt_mbuf *b, const fam *f, const char *label)
{
    for (const char *p = f->samples; p < f->end;) {
        const char *eol = memchr(p, '\n', (size_t)(f->end - p));
        const char *next = eol ? eol + 1 : f->end;
        size_t metric = strcspn(p, "{ ");
        if (p[metric] == '{')
            kvt__mbuf_printf(b, "%.*s{%s,%.*s", (int)metric, p, label,
                             (int)(next - p - (ptrdiff_t)metric - 1), p + metric + 1);
        else
            kvt__mbuf_printf(b, "%.*s{%s}%.*s", (int)metric, p, label,
                             (int)(next - p - (ptrdiff_t)metric), p + metric);
        p = next;
    }
}

#define MAX_FAMILIES 96

kvt_status kvt__metrics_render_multi(kvt_mbuf *b, kvt_cache *const *caches,
                                     const char *const *labels, uint32_t n,
                                     kvt_metrics_extra_fn extra, void *arg)
{
    kvt_mbuf *parts = calloc(n ? n : 1, sizeof *parts);
    fam *f = calloc((size_t)(n ? n : 1) * MAX_FAMILIES, sizeof *f);
    uint32_t *nf = calloc(n ? n : 1, sizeof *nf);
    kvt_status st = parts && f && nf ? KVT_OK
                                     : kvt__fail(KVT_ENOMEM, "metrics: out of memory rendering");
    for (uint32_t i = 0; !st && i < n; i++) {
        st = render_one(&parts[i], caches[i]);
        if (!st && parts[i].failed) st = kvt__fail(KVT_ENOMEM, "metrics: out of memory rendering");
        if (!st) nf[i] = split_families(parts[i].data, f + (size_t)i * MAX_FAMILIES, MAX_FAMILIES);
    }
    /* Every family once, in order of first appearance, then each source's
     * samples of it. */
    for (uint32_t i = 0; !st && i < n; i++)
        for (uint32_t k = 0; k < nf[i]; k++) {
            const fam *x = &f[(size_t)i * MAX_FAMILIES + k];
            bool seen = false;
            for (uint32_t j = 0; j < i && !seen; j++)
                for (uint32_t m = 0; m < nf[j] && !seen; m++) {
                    const fam *y = &f[(size_t)j * MAX_FAMILIES + m];
                    seen = y->name_len == x->name_len && !memcmp(y->name, x->name, x->name_len);
                }
            if (seen) continue;
            kvt__mbuf_printf(b, "%.*s", (int)(x->samples - x->head), x->head);
            for (uint32_t j = i; j < n; j++)
                for (uint32_t m = 0; m < nf[j]; m++) {
                    const fam *y = &f[(size_t)j * MAX_FAMILIES + m];
                    if (y->name_len == x->name_len && !memcmp(y->name, x->name, x->name_len))
                        labelled_samples(b, y, labels[j]);
                }
        }
    for (uint32_t i = 0; parts && i < n; i++) kvt__mbuf_free(&parts[i]);
    free(parts);
    free(f);
    free(nf);
    if (st) return st;
    if (extra) extra(b, arg);
    if (b->failed) return kvt__fail(KVT_ENOMEM, "metrics: out of memory rendering the exposition");
    return KVT_OK;
}

kvt_status kvt__metrics_render(kvt_mbuf *b, kvt_cache *c, kvt_metrics_extra_fn extra, void *arg)
{
    kvt_status st = render_one(b, c);
    if (st) return st;
    if (extra) extra(b, arg);
    if (b->failed) return kvt__fail(KVT_ENOMEM, "metrics: out of memory rendering the exposition");
    return KVT_OK;
}

/* ------------------------------------------------------------------ */
/* The node server's families                                         */

static int by_pid(const void *a, const void *b)
{
    int64_t x = ((const kvt_metrics_client *)a)->pid, y = ((const kvt_metrics_client *)b)->pid;
    return (x > y) - (x < y);
}

void kvt__metrics_clients(kvt_mbuf *b, const kvt_metrics_client *clients, uint32_t n)
{
    one(b, "kvtier_clients_attached", "gauge", "Clients (engine processes or ranks) attached to the node server.",
        n);
    kvt__metrics_family(b, "kvtier_client_pins", "gauge",
                        "Index entries pinned by the tasks of the clients of one process.");
    if (n == 0) return;
    kvt_metrics_client *v = malloc((size_t)n * sizeof *v);
    if (!v) {
        b->failed = true;
        return;
    }
    memcpy(v, clients, (size_t)n * sizeof *v);
    qsort(v, n, sizeof *v, by_pid);
    for (uint32_t i = 0; i < n;) {
        uint64_t pins = 0;
        uint32_t j = i;
        for (; j < n && v[j].pid == v[i].pid; j++) pins += v[j].pins;
        char labels[40];
        snprintf(labels, sizeof labels, "pid=\"%lld\"", (long long)v[i].pid);
        kvt__metrics_u64(b, "kvtier_client_pins", labels, pins);
        i = j;
    }
    free(v);
}

/* ------------------------------------------------------------------ */
/* Quotas by namespace prefix (server_quotas)                         */

/* prefix="<rule's prefix>", escaped as the exposition format asks. */
static void prefix_label(char *out, size_t cap, const char *prefix)
{
    size_t o = snprintf(out, cap, "prefix=\"");
    for (const char *p = prefix; *p && o + 4 < cap; p++) {
        if (*p == '\\' || *p == '"') out[o++] = '\\';
        if (*p == '\n') {
            out[o++] = '\\';
            out[o++] = 'n';
        } else {
            out[o++] = *p;
        }
    }
    snprintf(out + o, cap - o, "\"");
}

void kvt__metrics_quotas(kvt_mbuf *b, const kvt_quota *q)
{
    if (!q || q->n == 0) return;
    static const struct {
        const char *name, *type, *help;
    } fams[] = {
        {"kvtier_quota_bytes", "gauge", "CPU tier bytes a namespace prefix may hold (server_quotas)."},
        {"kvtier_quota_used_bytes", "gauge", "CPU tier bytes the namespaces of a prefix hold now."},
        {"kvtier_quota_limited_blocks_total", "counter",
         "Blocks a store or load did not get because its prefix was at its quota."},
        {"kvtier_quota_evicted_blocks_total", "counter",
         "Own blocks a prefix at its quota gave up (evicted, or CPU copy dropped) to make room."},
    };
    char label[2 * KVT_QUOTA_PREFIX_MAX + 16];
    for (size_t f = 0; f < sizeof fams / sizeof fams[0]; f++) {
        kvt__metrics_family(b, fams[f].name, fams[f].type, fams[f].help);
        for (uint32_t i = 1; i <= q->n; i++) {
            uint64_t v = f == 0 ? q->pool.limit[i]
                       : f == 1 ? atomic_load(&q->pool.used[i])
                       : f == 2 ? atomic_load(&q->limited[i])
                                : atomic_load(&q->evicted[i]);
            prefix_label(label, sizeof label, q->rule[i - 1].prefix);
            kvt__metrics_u64(b, fams[f].name, label, v);
        }
    }
}
