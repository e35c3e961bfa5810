/* bench_index.c - `kvtier bench index [--json] [--blocks N] [--policy lru|lfu]`
 *
 * Builds an index of N blocks (default 10,000,000) as 64-block chains from
 * distinct roots, inserted interleaved (block j of every chain, then block
 * j + 1), so a chain's entries lie far apart in memory as after long churn.
 * Then, on one thread:
 *   lookups   random full-chain kvt__index_match with touch, one lookup
 *             counted per block matched (after a warm-up);
 *   machine   the machine's own limit for the same access pattern: random
 *             independent 8-byte reads over a buffer as large as the index,
 *             prefetched 16 at a time (a lookup needs two: its table slot
 *             and its entry; machine_ratio = 2 * lookups / reads);
 *             lookups and machine reads take turns over --rounds rounds
 *             (default 5), each round's ratio within the round, reported
 *             as min/median/max (the target reads the median);
 *   evictions kvt__index_evict in batches of 64 over a tenth of the blocks.
 * Prints a report, or with --json one JSON object on stdout. Progress of the
 * long build goes to stderr when it is a terminal.
 */
#include "bench.h"
#include "bench_util.h"
#include "cli_util.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "index/index.h"
#include "util/clock.h"
#include "util/hash.h"

#define BI_CHAIN 64u
#define BI_BLOCK_TOKENS 16u
#define BI_TARGET_LOOKUPS 10e6 /* docs/design.md: >= 10M lookups/s at 100M blocks */
#define BI_TARGET_BYTES 48.0    /* and <= 48 bytes per block */
#define BI_MAX_ROUNDS 64
#define BI_WARMUP_NS 300000000ull
#define BI_MEASURE_NS 2000000000ull

typedef struct bi_opts {
    bool json;
    uint32_t blocks, rounds;
    kvt_evict_policy policy;
} bi_opts;

typedef struct bi_result {
    uint64_t memory_bytes;
    double hash_blocks_per_s, insert_per_s, lookups_per_s, evict_per_s;
    double machine_reads_per_s;
    uint64_t lookups, evicted;
    uint32_t rounds;
    double round_lookups[BI_MAX_ROUNDS], round_reads[BI_MAX_ROUNDS], round_ratio[BI_MAX_ROUNDS];
} bi_result;

static void bi_usage(FILE *f)
{
    fprintf(f, "usage: kvtier bench index [--json] [--blocks N] [--policy lru|lfu] [--rounds N]\n"
               "  --blocks N   blocks to index (default 10000000, at most 2^31)\n"
               "  --rounds N   lookup and machine rounds taking turns (1..64, default 5)\n"
               "  --policy P   eviction policy, lru (default) or lfu\n"
               "  --json       print one JSON object on stdout\n");
}

/* argv[0] may be the subcommand's name ("index"); options follow. Returns
 * -1 to go on, else the exit code. */
static int bi_parse(int argc, char **argv, bi_opts *o)
{
    static const char *const takes_value[] = {"--blocks", "--rounds", "--policy", NULL};
    *o = (bi_opts){.json = false, .blocks = 10000000, .policy = KVT_EVICT_LRU, .rounds = 5};
    int i = argc > 0 && argv[0][0] != '-' ? 1 : 0;
    for (; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--json") == 0) {
            o->json = true;
        } else if (strcmp(a, "--blocks") == 0 && i + 1 < argc) {
            char *end;
            unsigned long long v = strtoull(argv[++i], &end, 10);
            if (*argv[i] == '\0' || *end != '\0' || v == 0 || v > (1ull << 31)) {
                fprintf(stderr, "kvtier bench index: --blocks %s: want 1 .. 2147483648\n",
                        argv[i]);
                return 2;
            }
            o->blocks = (uint32_t)v;
        } else if (strcmp(a, "--rounds") == 0 && i + 1 < argc) {
            char *end;
            unsigned long v = strtoul(argv[++i], &end, 10);
            if (*argv[i] == '\0' || *end != '\0' || v == 0 || v > BI_MAX_ROUNDS) {
                fprintf(stderr, "kvtier bench index: --rounds %s: want 1 .. %d\n", argv[i],
                        BI_MAX_ROUNDS);
                return 2;
            }
            o->rounds = (uint32_t)v;
        } else if (strcmp(a, "--policy") == 0 && i + 1 < argc) {
            const char *p = argv[++i];
            if (strcmp(p, "lru") == 0) {
                o->policy = KVT_EVICT_LRU;
            } else if (strcmp(p, "lfu") == 0) {
                o->policy = KVT_EVICT_LFU;
            } else {
                fprintf(stderr, "kvtier bench index: --policy %s: want lru or lfu\n", p);
                return 2;
            }
        } else if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            bi_usage(stdout);
            return 0;
        } else {
            return cli_bad_arg("bench index", a, cli_arg_in(a, takes_value));
        }
    }
    return -1;
}

static void bi_progress(const char *phase, uint64_t done, uint64_t total)
{
    static int last = -1;
    if (!isatty(STDERR_FILENO)) return;
    int pct = total ? (int)(done * 100 / total) : 100;
    if (pct == last && done != total) return;
    last = done == total ? -1 : pct;
    fprintf(stderr, "\rindex bench: %-10s %3d%% (%llu/%llu blocks)%s", phase, pct,
            (unsigned long long)done, (unsigned long long)total, done == total ? "\n" : "");
    fflush(stderr);
}

static uint32_t bi_chain_len(uint32_t blocks, uint32_t c)
{
    uint32_t first = c * BI_CHAIN;
    return blocks - first < BI_CHAIN ? blocks - first : BI_CHAIN;
}

/* The block hashes of every chain: chain c's tokens come from seed c. */
static kvt_hash128 *bi_make_hashes(uint32_t blocks, uint32_t chains, bi_result *r)
{
    kvt_hash128 *h = malloc((size_t)blocks * sizeof *h);
    if (h == NULL) return NULL;
    uint32_t tokens[BI_CHAIN * BI_BLOCK_TOKENS];
    uint64_t t0 = kvt__now_ns();
    for (uint32_t c = 0; c < chains; c++) {
        uint64_t st = 0x6b7674ull ^ ((uint64_t)c << 20);
        for (uint32_t i = 0; i < BI_CHAIN * BI_BLOCK_TOKENS; i++)
            tokens[i] = (uint32_t)(kvt__splitmix64(&st) % 128000);
        uint32_t len = bi_chain_len(blocks, c);
        kvt__block_hashes(tokens, len * BI_BLOCK_TOKENS, BI_BLOCK_TOKENS, "bench", 5,
                          h + (size_t)c * BI_CHAIN, len);
        if (c % 1024 == 0) bi_progress("hashing", (uint64_t)c * BI_CHAIN, blocks);
    }
    bi_progress("hashing", blocks, blocks);
    r->hash_blocks_per_s = blocks / ((kvt__now_ns() - t0) / 1e9);
    return h;
}

static int bi_build(kvt_index *idx, const kvt_hash128 *h, uint32_t blocks, uint32_t chains,
                    bi_result *r)
{
    uint32_t *prev = malloc((size_t)chains * sizeof *prev);
    if (prev == NULL) return -1;
    uint64_t done = 0, t0 = kvt__now_ns();
    for (uint32_t j = 0; j < BI_CHAIN; j++) {
        for (uint32_t c = 0; c < chains; c++) {
            if (j >= bi_chain_len(blocks, c)) continue;
            uint32_t b = c * BI_CHAIN + j, id;
            if (kvt__index_insert(idx, j == 0 ? KVT_INDEX_NONE : prev[c], h[b], b, &id) != KVT_OK) {
                free(prev);
                return -1;
            }
            kvt__index_commit(idx, &id, 1);
            prev[c] = id;
            if (++done % 65536 == 0) bi_progress("inserting", done, blocks);
        }
    }
    bi_progress("inserting", blocks, blocks);
    r->insert_per_s = blocks / ((kvt__now_ns() - t0) / 1e9);
    free(prev);
    return 0;
}

/* Random full-chain matches for ns nanoseconds; returns blocks matched, or
 * UINT64_MAX if a match came up short (a bug). */
static uint64_t bi_lookups(kvt_index *idx, const kvt_hash128 *h, uint32_t blocks,
                           uint32_t chains, uint64_t ns, uint64_t *rng, uint64_t *elapsed)
{
    uint32_t ids[BI_CHAIN];
    uint64_t n = 0, t0 = kvt__now_ns(), now = t0;
    for (uint32_t it = 0;; it++) {
        if ((it & 255) == 0 && (now = kvt__now_ns()) - t0 >= ns) break;
        uint32_t c = (uint32_t)(kvt__splitmix64(rng) % chains);
        uint32_t len = bi_chain_len(blocks, c);
        uint32_t k = kvt__index_match(idx, h + (size_t)c * BI_CHAIN, len, ids, true);
        if (k != len) return UINT64_MAX;
        n += k;
    }
    *elapsed = now - t0;
    return n;
}

/* A buffer as large as the index for the machine's reads, faulted in;
 * NULL when there is no memory for it. */
static uint64_t *bi_machine_buffer(uint64_t bytes, size_t *n)
{
    *n = (size_t)(bytes / sizeof(uint64_t));
    uint64_t *buf = mmap(NULL, *n * sizeof *buf, PROT_READ | PROT_WRITE,
                         MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (buf == MAP_FAILED) return NULL;
    (void)madvise(buf, *n * sizeof *buf, MADV_HUGEPAGE);
    for (size_t i = 0; i < *n; i += 512) buf[i] = i; /* fault it in */
    return buf;
}

/* The machine's rate of random independent 8-byte reads over buf[0..n)
 * for ns nanoseconds, in prefetched batches of 16 (kvt__index_match keeps
 * about as many misses in flight). */
static double bi_machine_reads(const uint64_t *buf, size_t n, uint64_t ns, uint64_t *rng)
{
    uint64_t sum = 0, reads = 0, t0 = kvt__now_ns(), now = t0;
    size_t at[16];
    for (uint32_t it = 0;; it++) {
        if ((it & 63) == 0 && (now = kvt__now_ns()) - t0 >= ns) break;
        for (int i = 0; i < 16; i++) {
            at[i] = (size_t)((kvt__splitmix64(rng) >> 11) % n);
            __builtin_prefetch(&buf[at[i]]);
        }
        for (int i = 0; i < 16; i++) sum += buf[at[i]];
        reads += 16;
    }
    volatile uint64_t sink = sum;
    (void)sink;
    return reads / ((now - t0) / 1e9);
}

/* Lookups and machine reads taking turns, o->rounds times; the headline
 * figures are the medians. Returns -1 when a chain did not match in full. */
static int bi_rounds(const bi_opts *o, kvt_index *idx, const kvt_hash128 *h, uint32_t chains,
                     bi_result *r)
{
    size_t n = 0;
    uint64_t *buf = bi_machine_buffer(r->memory_bytes, &n), rng = 42, elapsed = 0;
    if (!buf) return -1;
    uint64_t per = BI_MEASURE_NS / o->rounds > 200000000ull ? BI_MEASURE_NS / o->rounds : 200000000ull;
    int rc = bi_lookups(idx, h, o->blocks, chains, BI_WARMUP_NS, &rng, &elapsed) == UINT64_MAX ? -1 : 0;
    for (uint32_t i = 0; rc == 0 && i < o->rounds; i++) {
        uint64_t got = bi_lookups(idx, h, o->blocks, chains, per, &rng, &elapsed);
        if (got == UINT64_MAX) {
            rc = -1;
            break;
        }
        r->lookups += got;
        r->round_lookups[i] = got / (elapsed / 1e9);
        r->round_reads[i] = bi_machine_reads(buf, n, per / 2, &rng);
        r->round_ratio[i] = r->round_reads[i] > 0 ? 2 * r->round_lookups[i] / r->round_reads[i] : 0;
    }
    munmap(buf, n * sizeof *buf);
    r->rounds = o->rounds;
    r->lookups_per_s = stat3_of(r->round_lookups, r->rounds).med;
    r->machine_reads_per_s = stat3_of(r->round_reads, r->rounds).med;
    return rc;
}

static int bi_evict(kvt_index *idx, uint32_t blocks, bi_result *r)
{
    uint32_t want = blocks / 10 > 0 ? blocks / 10 : 1, pl[64];
    uint64_t t0 = kvt__now_ns();
    while (r->evicted < want) {
        uint32_t batch = want - r->evicted < 64 ? (uint32_t)(want - r->evicted) : 64;
        uint32_t got = kvt__index_evict(idx, batch, pl);
        if (got == 0) return -1;
        r->evicted += got;
    }
    r->evict_per_s = r->evicted / ((kvt__now_ns() - t0) / 1e9);
    return 0;
}

static void bi_report(const bi_opts *o, const bi_result *r)
{
    double per_block = (double)r->memory_bytes / o->blocks;
    const char *policy = o->policy == KVT_EVICT_LFU ? "lfu" : "lru";
    stat3 ratio3 = stat3_of(r->round_ratio, r->rounds);
    double ratio = ratio3.med;
    bool met = r->lookups_per_s >= BI_TARGET_LOOKUPS && per_block <= BI_TARGET_BYTES;
    if (!o->json) {
        printf("kvtier bench index: %u blocks in %u-block chains, policy %s\n", o->blocks,
               BI_CHAIN, policy);
        printf("  memory        %.1f MiB, %.2f bytes per block (target %.0f)\n",
               r->memory_bytes / 1048576.0, per_block, BI_TARGET_BYTES);
        printf("  hashing       %.2f M blocks/s (%u tokens per block)\n",
               r->hash_blocks_per_s / 1e6, BI_BLOCK_TOKENS);
        printf("  insert+commit %.2f M blocks/s\n", r->insert_per_s / 1e6);
        printf("  lookups       %.2f M blocks/s (median of %u rounds), %.1f ns per block (target "
               "%.0f M/s): %s\n", r->lookups_per_s / 1e6, r->rounds, 1e9 / r->lookups_per_s,
               BI_TARGET_LOOKUPS / 1e6, r->lookups_per_s >= BI_TARGET_LOOKUPS ? "ok" : "BELOW TARGET");
        printf("  machine       %.2f M random reads/s over as much memory; a lookup needs 2: "
               "%.0f%% of the machine's limit (rounds %.0f%%..%.0f%%)\n",
               r->machine_reads_per_s / 1e6, 100 * ratio, 100 * ratio3.min, 100 * ratio3.max);
        printf("  evictions     %.2f M blocks/s\n", r->evict_per_s / 1e6);
        bench_host_text(stdout);
        return;
    }
    cJSON *j = cJSON_CreateObject();
    cJSON_AddNumberToObject(j, "blocks", o->blocks);
    cJSON_AddStringToObject(j, "policy", policy);
    cJSON_AddNumberToObject(j, "chain_blocks", BI_CHAIN);
    cJSON_AddNumberToObject(j, "block_tokens", BI_BLOCK_TOKENS);
    cJSON_AddNumberToObject(j, "memory_bytes", (double)r->memory_bytes);
    cJSON_AddNumberToObject(j, "bytes_per_block", per_block);
    cJSON_AddNumberToObject(j, "hash_blocks_per_s", r->hash_blocks_per_s);
    cJSON_AddNumberToObject(j, "insert_per_s", r->insert_per_s);
    cJSON_AddNumberToObject(j, "lookups_per_s", r->lookups_per_s);
    cJSON_AddNumberToObject(j, "lookup_ns", 1e9 / r->lookups_per_s);
    cJSON_AddNumberToObject(j, "machine_random_reads_per_s", r->machine_reads_per_s);
    cJSON_AddNumberToObject(j, "machine_ratio", ratio);
    cJSON_AddNumberToObject(j, "evict_per_s", r->evict_per_s);
    cJSON_AddNumberToObject(j, "rounds", r->rounds);
    cJSON_AddNumberToObject(j, "target_lookups_per_s", BI_TARGET_LOOKUPS);
    cJSON_AddNumberToObject(j, "target_bytes_per_block", BI_TARGET_BYTES);
    cJSON_AddBoolToObject(j, "meets_target", met);
    char *s = cJSON_PrintUnformatted(j);
    if (s != NULL) { /* the rounds and the host as every bench prints them */
        s[strlen(s) - 1] = '\0';
        printf("%s, ", s);
        stat3_json("lookups_per_s_rounds", stat3_of(r->round_lookups, r->rounds), true);
        stat3_json("machine_reads_per_s_rounds", stat3_of(r->round_reads, r->rounds), true);
        stat3_json("machine_ratio_rounds", ratio3, true);
        bench_host_json(false);
        printf("}\n");
    }
    cJSON_free(s);
    cJSON_Delete(j);
}

int kvt_bench_index_main(int argc, char **argv)
{
    bi_opts o;
    int rc = bi_parse(argc, argv, &o);
    if (rc >= 0) return rc;
    uint32_t chains = (uint32_t)(((uint64_t)o.blocks + BI_CHAIN - 1) / BI_CHAIN);
    bi_result r = {0};
    kvt_index *idx = NULL;
    kvt_hash128 *h = bi_make_hashes(o.blocks, chains, &r);
    if (h == NULL) {
        fprintf(stderr, "kvtier bench index: out of memory for %u hashes\n", o.blocks);
        return 1;
    }
    kvt_status st = kvt__index_create(&idx, o.blocks, o.policy);
    if (st != KVT_OK) {
        fprintf(stderr, "kvtier bench index: index of %u blocks: %s\n", o.blocks, kvt_strerror(st));
        free(h);
        return 1;
    }
    r.memory_bytes = kvt__index_memory_bytes(idx);
    rc = 1;
    if (bi_build(idx, h, o.blocks, chains, &r) != 0) {
        fprintf(stderr, "kvtier bench index: insert failed\n");
        goto out;
    }
    if (bi_rounds(&o, idx, h, chains, &r) != 0) {
        fprintf(stderr, "kvtier bench index: a cached chain did not match in full (or no memory "
                "for the machine's buffer)\n");
        goto out;
    }
    if (bi_evict(idx, o.blocks, &r) != 0) {
        fprintf(stderr, "kvtier bench index: eviction stopped early\n");
        goto out;
    }
    bi_report(&o, &r);
    rc = 0;
out:
    kvt__index_destroy(idx);
    free(h);
    return rc;
}
