/* bench_copy.c - `kvtier bench copy [--json] [--threads N] [--size-mb M]`.
 *
 * Moves M MiB (default 256) between an engine buffer and cache blocks
 * through the real transfer engine (gather = store, scatter = load), with
 * 1 worker and with N workers (default 2), and measures the machine's own
 * limit in the same run: a plain memcpy loop over the SAME chunk list, in
 * the same order, on 1 and on N threads. Geometry: 32 layers, K and V,
 * 8 heads x 128 dim x 2 bytes (llama3-8b at tp 1), block 16 tokens, engine
 * pages in shuffled order (a real page table is not sorted). The headline
 * uses 16 tokens per page (32 KiB chunks); 4 and 1 tokens per page (8 KiB,
 * 2 KiB chunks) are reported too.
 *
 * Memory is prefaulted (the pool touches every page) and each figure is the
 * median of REPS timed runs after a warm-up; engine and memcpy runs are
 * interleaved so drift on a noisy VM hits both alike.
 * ratio = min(gather, scatter) / memcpy, where memcpy is the faster of the
 * two chunk lists (strict); ratio_gather / ratio_scatter compare each
 * direction with memcpy over its own list. A store copies into the tier
 * with streaming stores (util/copy.h), so the gather list is also copied
 * that way in the same run: stream_gather_gbps, and ratio_gather_stream =
 * gather / that (the machine's limit for a store). A store through the node
 * server also checksums each block's layers in the same pass (kvt_hash_copy,
 * the engine's layer_sums): summed_gather_gbps, and ratio_summed_stream =
 * that / the streaming copy, same run. scaling_2t = min(gather_2t,
 * scatter_2t) / min(gather, scatter).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "bench.h"
#include "bench_util.h"
#include "cli_util.h"
#include "layout/layout.h"
#include "store/pool.h"
#include "util/clock.h"
#include "util/copy.h"
#include "util/hash.h"
#include "util/sync.h"
#include "xfer/xfer.h"

#define LAYERS 32
#define HEADS 8
#define HEAD_DIM 128
#define ELEM 2
#define BLOCK_TOKENS 16
#define REPS 11
#define MAX_THREADS 64

typedef struct setup {
    kvt_geometry *geo;
    uint32_t tpp, ppb, nblocks, npages;
    kvt_pool *engine_pool; /* one block: the engine's buffers */
    kvt_pool *pool;        /* the cache blocks */
    kvt_page_map *map;
    uint8_t **blocks;
    uint32_t *pages;
    uint64_t *sums; /* nblocks x LAYERS: a summed gather's layer_sums */
    kvt_copy_chunk *chunks[3]; /* [dir]: engine-order chunk list */
    uint32_t layer_first_chunk[LAYERS + 1];
    uint64_t bytes; /* per transfer */
} setup;

typedef struct done_sig {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done;
    kvt_status st;
} done_sig;

static void on_done(kvt_xfer_task *t, kvt_status st)
{
    done_sig *d = t->user;
    pthread_mutex_lock(&d->mu);
    d->done = true;
    d->st = st;
    pthread_cond_signal(&d->cv);
    pthread_mutex_unlock(&d->mu);
}

static void setup_free(setup *s)
{
    free(s->chunks[KVT_XFER_GATHER]);
    free(s->chunks[KVT_XFER_SCATTER]);
    free(s->pages);
    free(s->sums);
    free(s->blocks);
    free(s->map);
    kvt__pool_destroy(s->pool);
    kvt__pool_destroy(s->engine_pool);
    kvt_geometry_destroy(s->geo);
    memset(s, 0, sizeof *s);
}

/* The chunk list exactly as the workers build it: layer, block, component,
 * page (no merging happens: pages are shuffled). */
static int build_chunks(setup *s, kvt_xfer_dir dir)
{
    uint64_t n = (uint64_t)LAYERS * s->nblocks * 2 * s->ppb;
    kvt_copy_chunk *c = malloc(n * sizeof *c);
    if (!c) return -1;
    uint64_t k = 0;
    for (uint32_t l = 0; l < LAYERS; l++) {
        s->layer_first_chunk[l] = (uint32_t)k;
        for (uint32_t b = 0; b < s->nblocks; b++)
            for (uint32_t comp = 0; comp < 2; comp++) {
                uint64_t len = kvt__geo_token_bytes(s->geo, l, comp) * s->tpp;
                uint8_t *blk = s->blocks[b] + kvt__geo_block_offset(s->geo, BLOCK_TOKENS, l, comp);
                for (uint32_t j = 0; j < s->ppb; j++) {
                    uint8_t *eng = kvt__page_addr(s->map, KVT_UNIT(l, comp),
                                                  s->pages[b * s->ppb + j]);
                    uint8_t *cache = blk + j * len;
                    c[k++] = dir == KVT_XFER_GATHER
                                 ? (kvt_copy_chunk){cache, eng, len}
                                 : (kvt_copy_chunk){eng, cache, len};
                }
            }
    }
    s->layer_first_chunk[LAYERS] = (uint32_t)k;
    s->chunks[dir] = c;
    return 0;
}

static int setup_init(setup *s, uint32_t tpp, uint64_t size_mb)
{
    memset(s, 0, sizeof *s);
    s->tpp = tpp;
    s->ppb = BLOCK_TOKENS / tpp;
    if (kvt_geometry_create(&s->geo, LAYERS, tpp, KVT_LAYOUT_LAYER_FIRST) != KVT_OK) goto fail;
    kvt_layer_spec spec = {.num_components = 2,
                           .component = {{HEADS, HEAD_DIM, ELEM}, {HEADS, HEAD_DIM, ELEM}}};
    if (kvt_geometry_set_layers(s->geo, 0, LAYERS, &spec) != KVT_OK) goto fail;
    uint64_t block_bytes = kvt__geo_bytes_per_token(s->geo) * BLOCK_TOKENS;
    uint64_t nb = (size_mb << 20) / block_bytes;
    s->nblocks = nb ? (uint32_t)nb : 1;
    s->npages = s->nblocks * s->ppb;
    s->bytes = (uint64_t)s->nblocks * block_bytes;
    if (kvt__pool_create(&s->engine_pool, s->bytes, s->bytes, true) != KVT_OK) goto fail;
    if (kvt__pool_create(&s->pool, s->bytes, block_bytes, true) != KVT_OK) goto fail;
    uint8_t *eng = kvt__pool_block(s->engine_pool, kvt__pool_alloc(s->engine_pool));
    void *bases[LAYERS * KVT_MAX_COMPONENTS];
    uint64_t off = 0;
    for (uint32_t u = 0; u < LAYERS * KVT_MAX_COMPONENTS; u++) {
        bases[u] = eng + off;
        off += (uint64_t)HEADS * HEAD_DIM * ELEM * tpp * s->npages;
    }
    kvt_engine_memory mem = {.num_pages = s->npages, .base = eng, .layer_bases = bases};
    s->map = malloc(sizeof *s->map);
    s->blocks = malloc(s->nblocks * sizeof *s->blocks);
    s->pages = malloc(s->npages * sizeof *s->pages);
    s->sums = malloc((size_t)s->nblocks * LAYERS * sizeof *s->sums);
    if (!s->map || !s->blocks || !s->pages || !s->sums) goto fail;
    if (kvt__page_map_init(s->map, s->geo, &mem) != KVT_OK) goto fail;
    for (uint32_t b = 0; b < s->nblocks; b++) s->blocks[b] = kvt__pool_block(s->pool, kvt__pool_alloc(s->pool));
    uint64_t rng = 7;
    for (uint32_t i = 0; i < s->npages; i++) s->pages[i] = i;
    for (uint32_t i = s->npages - 1; i > 0; i--) {
        uint32_t j = (uint32_t)(kvt__splitmix64(&rng) % (i + 1));
        uint32_t t = s->pages[i];
        s->pages[i] = s->pages[j];
        s->pages[j] = t;
    }
    memset(eng, 0x5a, s->bytes);
    if (build_chunks(s, KVT_XFER_GATHER) || build_chunks(s, KVT_XFER_SCATTER)) goto fail;
    return 0;
fail:
    fprintf(stderr, "bench copy: setup failed: %s\n", kvt_last_error());
    setup_free(s);
    return -1;
}

/* ---- the engine ---- */

static double run_engine(setup *s, kvt_xfer *x, kvt_xfer_dir dir, uint64_t *sums)
{
    done_sig d = {.done = false};
    pthread_mutex_init(&d.mu, NULL);
    kvt__cond_init(&d.cv);
    kvt_xfer_task t;
    memset(&t, 0, sizeof t);
    t.dir = dir;
    t.geo = s->geo;
    t.map = s->map;
    t.block_tokens = BLOCK_TOKENS;
    t.num_blocks = s->nblocks;
    t.blocks = s->blocks;
    t.pages = s->pages;
    t.layer_sums = sums;
    t.on_done = on_done;
    t.user = &d;
    uint64_t t0 = kvt__now_ns();
    if (kvt__xfer_submit(x, &t) != KVT_OK) return -1;
    uint64_t dl = kvt__deadline_ns(60000);
    pthread_mutex_lock(&d.mu);
    while (!d.done && kvt__now_ns() < dl) kvt__cond_wait_until(&d.cv, &d.mu, dl);
    bool ok = d.done && d.st == KVT_OK;
    pthread_mutex_unlock(&d.mu);
    uint64_t el = kvt__now_ns() - t0;
    pthread_cond_destroy(&d.cv);
    pthread_mutex_destroy(&d.mu);
    return ok ? (double)s->bytes / (double)el : -1; /* bytes/ns = GB/s */
}

/* ---- the baseline: memcpy over the same chunks ---- */

/* Helper threads live as long as one measure(), like the engine's workers,
 * so thread creation is in neither figure. */
typedef struct mc_pool {
    const setup *s;
    uint32_t threads;
    kvt_xfer_dir dir; /* 0: exit */
    bool stream;      /* kvt__copy_stream instead of memcpy */
    pthread_barrier_t start, end;
    pthread_t th[MAX_THREADS];
    uint32_t index[MAX_THREADS];
} mc_pool;

static mc_pool mcp;

/* Layers i, i + threads, ...: how units spread over the workers. */
static void mc_share(uint32_t i)
{
    const setup *s = mcp.s;
    const kvt_copy_chunk *c = s->chunks[mcp.dir];
    for (uint32_t l = i; l < LAYERS; l += mcp.threads)
        for (uint32_t k = s->layer_first_chunk[l]; k < s->layer_first_chunk[l + 1]; k++) {
            if (mcp.stream) kvt__copy_stream(c[k].dst, c[k].src, c[k].len);
            else memcpy(c[k].dst, c[k].src, c[k].len);
        }
    if (mcp.stream) kvt__copy_stream_fence();
}

static void *mc_main(void *p)
{
    uint32_t i = *(uint32_t *)p;
    for (;;) {
        pthread_barrier_wait(&mcp.start);
        if (mcp.dir == 0) return NULL;
        mc_share(i);
        pthread_barrier_wait(&mcp.end);
    }
}

static int mc_start(const setup *s, uint32_t threads)
{
    mcp.s = s;
    mcp.threads = threads;
    mcp.dir = 0;
    pthread_barrier_init(&mcp.start, NULL, threads);
    pthread_barrier_init(&mcp.end, NULL, threads);
    for (uint32_t i = 1; i < threads; i++) {
        mcp.index[i] = i;
        if (pthread_create(&mcp.th[i], NULL, mc_main, &mcp.index[i])) return -1; /* fatal */
    }
    return 0;
}

static void mc_stop(void)
{
    mcp.dir = 0;
    if (mcp.threads > 1) pthread_barrier_wait(&mcp.start);
    for (uint32_t i = 1; i < mcp.threads; i++) pthread_join(mcp.th[i], NULL);
    pthread_barrier_destroy(&mcp.start);
    pthread_barrier_destroy(&mcp.end);
}

static double run_memcpy(const setup *s, kvt_xfer_dir dir, bool stream)
{
    uint64_t t0 = kvt__now_ns();
    mcp.dir = dir;
    mcp.stream = stream;
    if (mcp.threads > 1) pthread_barrier_wait(&mcp.start);
    mc_share(0);
    if (mcp.threads > 1) pthread_barrier_wait(&mcp.end);
    return (double)s->bytes / (double)(kvt__now_ns() - t0);
}

/* ---- driver ---- */

typedef struct result {
    double g, sc, mg, ms; /* engine gather/scatter, memcpy gather/scatter list */
    double sg;            /* streaming copy of the gather list */
    double cg;            /* engine gather with checksums (layer_sums) */
    stat3 ratio;          /* each round's min(gather, scatter) / max(memcpy g/s) */
} result;

static int measure(setup *s, uint32_t threads, result *out)
{
    kvt_xfer *x = NULL;
    if (kvt__xfer_create(&x, threads, &kvt__host_copy_ops) != KVT_OK) {
        fprintf(stderr, "bench copy: %s\n", kvt_last_error());
        return -1;
    }
    if (mc_start(s, threads)) {
        fprintf(stderr, "bench copy: pthread_create failed\n");
        return -1;
    }
    double v[6][REPS], ratio[REPS];
    int rc = 0;
    for (int r = -1; r < REPS && rc == 0; r++) { /* r = -1: warm-up */
        double m0 = run_memcpy(s, KVT_XFER_GATHER, false);
        double e0 = run_engine(s, x, KVT_XFER_GATHER, NULL);
        double s0 = run_memcpy(s, KVT_XFER_GATHER, true);
        double c0 = run_engine(s, x, KVT_XFER_GATHER, s->sums);
        double m1 = run_memcpy(s, KVT_XFER_SCATTER, false);
        double e1 = run_engine(s, x, KVT_XFER_SCATTER, NULL);
        if (m0 < 0 || e0 < 0 || m1 < 0 || e1 < 0 || c0 < 0) rc = -1;
        if (r < 0) continue;
        v[0][r] = e0, v[1][r] = e1, v[2][r] = m0, v[3][r] = m1, v[4][r] = s0, v[5][r] = c0;
        ratio[r] = (e0 < e1 ? e0 : e1) / (m0 > m1 ? m0 : m1);
    }
    mc_stop();
    kvt__xfer_destroy(x);
    if (rc) {
        fprintf(stderr, "bench copy: a run failed\n");
        return -1;
    }
    *out = (result){median_of_values(v[0], REPS), median_of_values(v[1], REPS),
                     median_of_values(v[2], REPS), median_of_values(v[3], REPS),
                     median_of_values(v[4], REPS), median_of_values(v[5], REPS),
                     stat3_of(ratio, REPS)};
    return 0;
}

static double dmin(double a, double b) { return a < b ? a : b; }
static double dmax(double a, double b) { return a > b ? a : b; }

static int usage(void)
{
    fprintf(stderr, "usage: kvtier bench copy [--json] [--threads N] [--size-mb M]\n"
                    "       kvtier bench copy --device cuda [--json] [--threads N] [--size-mb M] "
                    "[--mode all|auto|batch|kernel|memcpy]\n"
                    "  --threads N  workers for the multi-thread run (2..64, default 2)\n"
                    "  --size-mb M  MiB moved per transfer (8..65536, default 256)\n");
    return 2;
}

static bool parse_u32(const char *s, uint32_t lo, uint32_t hi, uint32_t *out)
{
    char *end;
    unsigned long v = strtoul(s, &end, 10);
    if (!*s || *end || v < lo || v > hi) return false;
    *out = (uint32_t)v;
    return true;
}

int kvt_bench_copy_main(int argc, char **argv)
{
    bool json = false;
    uint32_t threads = 2, size_mb = 256;
    for (int i = 0; i + 1 < argc; i++) /* the device path: bench_copy_cuda.c */
        if (!strcmp(argv[i], "--device") && !strcmp(argv[i + 1], "cuda"))
            return kvt_bench_copy_cuda_main(argc, argv);
    static const char *const takes_value[] = {"--threads", "--size-mb", "--device", NULL};
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--json")) { json = true; continue; }
        if (!strcmp(a, "copy") && i == 0) continue; /* tolerate being handed the subcommand name */
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) return usage();
        if (!cli_arg_in(a, takes_value)) return cli_bad_arg("bench copy", a, false);
        if (!v) return cli_bad_arg("bench copy", a, true);
        i++;
        bool ok = !strcmp(a, "--threads")   ? parse_u32(v, 2, MAX_THREADS, &threads)
                  : !strcmp(a, "--size-mb") ? parse_u32(v, 8, 65536, &size_mb)
                                            : false; /* a --device other than cuda */
        if (!ok) return cli_bad_value("bench copy", a, v);
    }

    static const uint32_t tpps[] = {16, 4, 1};
    enum { NCFG = sizeof tpps / sizeof tpps[0] };
    result r1[NCFG], rn[NCFG];
    uint64_t chunk[NCFG];
    const char *kind = "?";
    for (int k = 0; k < NCFG; k++) {
        setup s;
        if (setup_init(&s, tpps[k], size_mb)) return 1;
        kind = kvt__pool_page_kind(s.pool);
        chunk[k] = (uint64_t)HEADS * HEAD_DIM * ELEM * tpps[k];
        int rc = measure(&s, 1, &r1[k]);
        if (!rc) rc = measure(&s, threads, &rn[k]);
        setup_free(&s);
        if (rc) return 1;
    }

    const result *a = &r1[0], *b = &rn[0];
    double mc1 = dmax(a->mg, a->ms), mcn = dmax(b->mg, b->ms);
    double ratio = dmin(a->g, a->sc) / mc1;
    double ratio_n = dmin(b->g, b->sc) / mcn;
    double scaling = dmin(b->g, b->sc) / dmin(a->g, a->sc);
    if (json) {
        printf("{\"chunk_bytes\": %llu, \"size_mb\": %u, \"threads\": %u, \"pages\": \"%s\", \"stat\": \"median of %d\", "
               "\"gather_gbps\": %.2f, \"scatter_gbps\": %.2f, \"memcpy_gbps\": %.2f, "
               "\"memcpy_gather_gbps\": %.2f, \"memcpy_scatter_gbps\": %.2f, \"ratio\": %.3f, "
               "\"ratio_gather\": %.3f, \"ratio_scatter\": %.3f, "
               "\"gather_gbps_2t\": %.2f, \"scatter_gbps_2t\": %.2f, \"memcpy_gbps_2t\": %.2f, "
               "\"ratio_2t\": %.3f, \"scaling_2t\": %.3f, \"memcpy_scaling_2t\": %.3f, "
               "\"stream_gather_gbps\": %.2f, \"ratio_gather_stream\": %.3f, "
               "\"stream_gather_gbps_2t\": %.2f, \"ratio_gather_stream_2t\": %.3f, "
               "\"summed_gather_gbps\": %.2f, \"ratio_summed_stream\": %.3f, "
               "\"summed_gather_gbps_2t\": %.2f, \"ratio_summed_stream_2t\": %.3f, ",
               (unsigned long long)chunk[0], size_mb, threads, kind, REPS, a->g, a->sc, mc1, a->mg,
               a->ms, ratio, a->g / a->mg, a->sc / a->ms, b->g, b->sc, mcn, ratio_n, scaling,
               mcn / mc1, a->sg, a->g / a->sg, b->sg, b->g / b->sg, a->cg, a->cg / a->sg, b->cg,
               b->cg / b->sg);
        stat3_json("ratio_rounds", a->ratio, true);
        stat3_json("ratio_2t_rounds", b->ratio, true);
        bench_host_json(true);
        printf("\"by_chunk\": [");
        for (int k = 0; k < NCFG; k++)
            printf("%s{\"chunk_bytes\": %llu, \"gather_gbps\": %.2f, \"scatter_gbps\": %.2f, "
                   "\"memcpy_gbps\": %.2f, \"ratio\": %.3f, \"gather_gbps_2t\": %.2f, "
                   "\"scatter_gbps_2t\": %.2f, \"memcpy_gbps_2t\": %.2f}",
                   k ? ", " : "", (unsigned long long)chunk[k], r1[k].g, r1[k].sc,
                   dmax(r1[k].mg, r1[k].ms), dmin(r1[k].g, r1[k].sc) / dmax(r1[k].mg, r1[k].ms),
                   rn[k].g, rn[k].sc, dmax(rn[k].mg, rn[k].ms));
        printf("]}\n");
        return 0;
    }
    printf("kvtier bench copy: %u layers x (K,V) x %u heads x %u dim x %u B, block %u tokens,\n"
           "%u MiB per transfer, pages shuffled, memory prefaulted (%s), median of %d runs.\n"
           "GB/s; memcpy = one memcpy per chunk over the same chunk list (gather list / scatter list)\n\n",
           LAYERS, HEADS, HEAD_DIM, ELEM, BLOCK_TOKENS, size_mb, kind, REPS);
    printf("%-8s %-8s %8s %8s %17s %7s\n", "chunk", "threads", "gather", "scatter", "memcpy g/s", "ratio");
    for (int k = 0; k < NCFG; k++) {
        for (int n = 0; n < 2; n++) {
            const result *r = n ? &rn[k] : &r1[k];
            char cb[32];
            snprintf(cb, sizeof cb, "%llu KiB", (unsigned long long)chunk[k] >> 10);
            printf("%-8s %-8u %8.2f %8.2f %8.2f/%8.2f %7.3f\n", n ? "" : cb, n ? threads : 1,
                   r->g, r->sc, r->mg, r->ms, dmin(r->g, r->sc) / dmax(r->mg, r->ms));
        }
    }
    printf("\n%llu KiB chunks: ratio %.3f (1 thread), %.3f (%u threads); scaling to %u threads "
           "%.2fx (memcpy %.2fx)\n"
           "gather (a store: streaming stores into the tier) against the same streaming copy "
           "of its list: %.2f / %.2f GB/s = %.3f (1 thread), %.2f / %.2f = %.3f (%u threads)\n"
           "gather with each block's checksums in the same pass (a store through the node "
           "server) against that streaming copy: %.2f / %.2f = %.3f (1 thread), %.2f / %.2f = "
           "%.3f (%u threads)\n",
           (unsigned long long)chunk[0] >> 10, ratio, ratio_n, threads, threads, scaling,
           mcn / mc1, a->g, a->sg, a->g / a->sg, b->g, b->sg, b->g / b->sg, threads, a->cg,
           a->sg, a->cg / a->sg, b->cg, b->sg, b->cg / b->sg, threads);
    printf("ratio over the %d rounds (1 thread): min %.3f, median %.3f, max %.3f\n", REPS,
           a->ratio.min, a->ratio.med, a->ratio.max);
    bench_host_text(stdout);
    return 0;
}
