/* bench_ssd.c - `kvtier bench ssd [--json] [--dir D] [--size-mb N]
 * [--block-kb K] [--io auto|uring|threads]`.
 *
 * Writes N MiB (default 1024) of blocks (default 2 MiB) through the SSD
 * store and reads them back, against the machine's own limit measured in
 * the same run on the same directory: sequential O_DIRECT io_uring I/O of
 * the same bytes in 1 MiB requests at queue depth 32 (a minimal liburing
 * loop, what fio does). Store writes include what makes them durable: the
 * checksum, the data fdatasync, the journal append and its fdatasync; the
 * raw write pass ends with one fdatasync. Store reads verify every block's
 * checksum. Everything is O_DIRECT, so reads hit the device, not the page
 * cache. Passes are interleaved (raw, store, raw, store) so drift on a
 * noisy disk hits both alike, and the median of REPS is reported (the best
 * of REPS favours whichever pass got lucky once).
 * write_ratio = write_gbps / raw_write_gbps (read likewise); target >= 0.9.
 * Where fio is installed (scripts/deps.sh installs it), fio itself runs
 * the same passes in each round (io_uring engine, O_DIRECT, 1 MiB at QD 32,
 * the write pass ending in one fsync, a file of its own in the same
 * directory): fio_write_ratio = write_gbps / fio_write_gbps, so the figure
 * does not rest on this file's raw loop alone. Without fio those keys are
 * null and the text says so.
 * Runs in a fresh temporary directory (under --dir, else $TMPDIR or /tmp)
 * that it removes. */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <cjson/cJSON.h>
#include <liburing.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include "bench.h"
#include "bench_util.h"
#include "cli_util.h"
#include "store/ssd.h"
#include "util/clock.h"
#include "util/parse.h"
#include "util/sync.h"

#define REPS 3
#define RAW_QD 32u
#define RAW_CHUNK (1u << 20)
#define INFLIGHT_BYTES (128ull << 20) /* store requests the bench keeps outstanding */
#define STORE_QD 32u /* device queue depth of the store: as many requests as the raw loop */
#define WAIT_NS (60ull * 1000000000ull)

typedef struct bargs {
    bool json;
    const char *dir, *io;
    uint64_t size_mb, block_kb;
} bargs;

typedef struct bench {
    uint64_t bytes, block;
    uint32_t nblocks, nbufs;
    uint8_t *mem; /* nbufs blocks, also the raw loop's buffers */
    uint64_t mem_len;
    char work[PATH_MAX], store_dir[PATH_MAX + 16], raw_path[PATH_MAX + 16], fio_path[PATH_MAX + 16];
    kvt_ssd *s;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint32_t *free_bufs, nfree, done, errors;
    struct buf_ctx { struct bench *b; uint32_t idx; } *ctx;
} bench;

static int parse(bargs *a, int argc, char **argv)
{
    static const char *const takes_value[] = {"--dir", "--io", "--size-mb", "--block-kb", NULL};
    *a = (bargs){false, NULL, "auto", 1024, 2048};
    for (int i = 1; i < argc; i++) {
        const char *s = argv[i];
        bool more = i + 1 < argc;
        if (strcmp(s, "--json") == 0) a->json = true;
        else if (strcmp(s, "--dir") == 0 && more) a->dir = argv[++i];
        else if (strcmp(s, "--io") == 0 && more) a->io = argv[++i];
        else if (strcmp(s, "--size-mb") == 0 && more) {
            if (!kvt__parse_u64(argv[++i], &a->size_mb) || a->size_mb < 16 || a->size_mb > (1u << 20)) {
                fprintf(stderr, "bench ssd: --size-mb \"%s\" is not in 16..1048576\n", argv[i]);
                return 2;
            }
        } else if (strcmp(s, "--block-kb") == 0 && more) {
            if (!kvt__parse_u64(argv[++i], &a->block_kb) || a->block_kb < 4 || a->block_kb > 65536 ||
                a->block_kb % 4) {
                fprintf(stderr, "bench ssd: --block-kb \"%s\" is not a multiple of 4 in 4..65536\n", argv[i]);
                return 2;
            }
        } else if (strcmp(s, "--help") == 0 || strcmp(s, "-h") == 0) {
            printf("usage: kvtier bench ssd [--json] [--dir D] [--size-mb N] [--block-kb K] "
                   "[--io auto|uring|threads]\n");
            return 0;
        } else {
            return cli_bad_arg("bench ssd", s, cli_arg_in(s, takes_value));
        }
    }
    return -1;
}

static int rm_one(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb; (void)flag; (void)ftw;
    return remove(p);
}

/* ---- raw io_uring loop ----------------------------------------------- */

/* Sequential 1 MiB O_DIRECT requests at QD 32 over bytes; GB/s or < 0. */
static double raw_pass(bench *b, bool write)
{
    int fd = open(b->raw_path, O_RDWR | O_DIRECT | O_CREAT, 0644);
    if (fd < 0) return -1;
    struct io_uring ring;
    if (io_uring_queue_init(RAW_QD, &ring, 0) < 0) {
        close(fd);
        return -1;
    }
    uint64_t next = 0, done = 0, t0 = kvt__now_ns();
    uint32_t inflight = 0;
    bool ok = true;
    while (ok && done < b->bytes) {
        while (inflight < RAW_QD && next < b->bytes) {
            struct io_uring_sqe *sqe = io_uring_get_sqe(&ring);
            uint8_t *buf = b->mem + (size_t)(inflight % RAW_QD) * RAW_CHUNK;
            if (write) io_uring_prep_write(sqe, fd, buf, RAW_CHUNK, next);
            else io_uring_prep_read(sqe, fd, buf, RAW_CHUNK, next);
            next += RAW_CHUNK;
            inflight++;
        }
        struct io_uring_cqe *cqe;
        if (io_uring_submit_and_wait(&ring, 1) < 0 || io_uring_wait_cqe(&ring, &cqe) < 0) break;
        ok = cqe->res == (int)RAW_CHUNK;
        io_uring_cqe_seen(&ring, cqe);
        inflight--;
        done += RAW_CHUNK;
    }
    if (write && ok) ok = fdatasync(fd) == 0;
    double secs = (double)(kvt__now_ns() - t0) / 1e9;
    io_uring_queue_exit(&ring);
    close(fd);
    return ok && done >= b->bytes ? (double)b->bytes / secs / 1e9 : -1;
}

/* ---- fio, where installed -------------------------------------------- */

#define FIO_SECS 120 /* a pass's bound (timeout(1) kills fio past it) */

/* fio's bandwidth in GB/s from its JSON report (jobs[0].write or .read
 * bw_bytes); < 0 when the report is missing or not fio's. */
static double fio_report_gbps(const char *path, bool write)
{
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char *text = malloc(1 << 20);
    size_t n = text ? fread(text, 1, (1 << 20) - 1, f) : 0;
    fclose(f);
    if (!text) return -1;
    text[n] = 0;
    /* fio may print notes before the JSON object */
    cJSON *j = cJSON_Parse(strchr(text, '{') ? strchr(text, '{') : text);
    free(text);
    cJSON *job = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "jobs"), 0);
    cJSON *bw = cJSON_GetObjectItem(cJSON_GetObjectItem(job, write ? "write" : "read"), "bw_bytes");
    double gbps = cJSON_IsNumber(bw) && bw->valuedouble > 0 ? bw->valuedouble / 1e9 : -1;
    cJSON_Delete(j);
    return gbps;
}

/* One fio pass over the same bytes as raw_pass; GB/s, or < 0 when fio is
 * absent or failed. Run through the shell as the other benches run their
 * yardsticks (ucx_perftest, redis-benchmark), bounded by timeout(1). */
static double fio_pass(bench *b, bool write)
{
    if (system("command -v fio >/dev/null 2>&1") != 0) return -1;
    char out[PATH_MAX + 32], cmd[3 * PATH_MAX + 512];
    snprintf(out, sizeof out, "%s/fio.json", b->work);
    snprintf(cmd, sizeof cmd,
             "timeout %d fio --name=kvtier-bench --filename='%s' --rw=%s --bs=%u --iodepth=%u "
             "--ioengine=io_uring --direct=1 --size=%llu %s --output-format=json "
             "--output='%s' >/dev/null 2>&1",
             FIO_SECS, b->fio_path, write ? "write" : "read", RAW_CHUNK, RAW_QD,
             (unsigned long long)b->bytes, write ? "--end_fsync=1" : "", out);
    if (system(cmd) != 0) return -1;
    return fio_report_gbps(out, write);
}

/* ---- through the store ----------------------------------------------- */

static void on_done(void *arg, kvt_status st)
{
    struct buf_ctx *c = arg;
    bench *b = c->b;
    pthread_mutex_lock(&b->mu);
    b->free_bufs[b->nfree++] = c->idx;
    b->done++;
    b->errors += st != KVT_OK;
    pthread_cond_signal(&b->cv);
    pthread_mutex_unlock(&b->mu);
}

/* A free buffer, waiting for one (bounded) when all are in flight. */
static bool take_buf(bench *b, uint32_t *idx)
{
    uint64_t deadline = kvt__now_ns() + WAIT_NS;
    pthread_mutex_lock(&b->mu);
    while (b->nfree == 0 && kvt__cond_wait_until(&b->cv, &b->mu, deadline)) {}
    bool ok = b->nfree > 0;
    if (ok) *idx = b->free_bufs[--b->nfree];
    pthread_mutex_unlock(&b->mu);
    return ok;
}

static bool wait_all(bench *b)
{
    uint64_t deadline = kvt__now_ns() + WAIT_NS;
    pthread_mutex_lock(&b->mu);
    while (b->done < b->nblocks && kvt__cond_wait_until(&b->cv, &b->mu, deadline)) {}
    bool ok = b->done == b->nblocks && b->errors == 0;
    pthread_mutex_unlock(&b->mu);
    return ok;
}

static kvt_hash128 key_of(uint32_t i) { return (kvt_hash128){0x5eed0000ull + i, ~(uint64_t)i}; }

static double store_pass(bench *b, bool write)
{
    b->done = b->errors = 0;
    uint64_t t0 = kvt__now_ns();
    for (uint32_t i = 0; i < b->nblocks; i++) {
        uint32_t idx;
        if (!take_buf(b, &idx)) return -1;
        void *buf = b->mem + (size_t)idx * b->block;
        kvt_status st;
        do {
            st = write ? kvt__ssd_write(b->s, i, buf, key_of(i), key_of(i - 1), i > 0, on_done, &b->ctx[idx])
                       : kvt__ssd_read(b->s, i, buf, key_of(i), on_done, &b->ctx[idx]);
        } while (st == KVT_EAGAIN);
        if (st != KVT_OK) return -1;
    }
    if (!wait_all(b)) return -1;
    return (double)b->bytes / ((double)(kvt__now_ns() - t0) / 1e9) / 1e9;
}

/* ---- setup ------------------------------------------------------------ */

static int setup(bench *b, const bargs *a)
{
    b->block = a->block_kb << 10;
    b->nblocks = (uint32_t)((a->size_mb << 20) / b->block);
    b->bytes = (uint64_t)b->nblocks * b->block;
    b->nbufs = (uint32_t)(INFLIGHT_BYTES / b->block);
    if (b->nbufs < 8) b->nbufs = 8;
    if (b->nbufs > b->nblocks) b->nbufs = b->nblocks;
    b->mem_len = (uint64_t)b->nbufs * b->block;
    if (b->mem_len < (uint64_t)RAW_QD * RAW_CHUNK) b->mem_len = (uint64_t)RAW_QD * RAW_CHUNK;
    b->mem = mmap(NULL, b->mem_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (b->mem == MAP_FAILED) return fprintf(stderr, "bench ssd: mmap: %s\n", strerror(errno)), 1;
    uint64_t st = 42;
    for (uint64_t i = 0; i < b->mem_len / 8; i++) ((uint64_t *)b->mem)[i] = kvt__splitmix64(&st);
    b->free_bufs = calloc(b->nbufs, sizeof *b->free_bufs);
    b->ctx = calloc(b->nbufs, sizeof *b->ctx);
    if (!b->free_bufs || !b->ctx) return fprintf(stderr, "bench ssd: out of memory\n"), 1;
    for (uint32_t i = 0; i < b->nbufs; i++) {
        b->free_bufs[b->nfree++] = i;
        b->ctx[i] = (struct buf_ctx){b, i};
    }
    pthread_mutex_init(&b->mu, NULL);
    kvt__cond_init(&b->cv);
    const char *parent = a->dir ? a->dir : getenv("TMPDIR");
    snprintf(b->work, sizeof b->work, "%s/kvtier-bench-ssd.XXXXXX", parent && *parent ? parent : "/tmp");
    if (!mkdtemp(b->work)) return fprintf(stderr, "bench ssd: mkdtemp %s: %s\n", b->work, strerror(errno)), 1;
    snprintf(b->store_dir, sizeof b->store_dir, "%s/store", b->work);
    snprintf(b->raw_path, sizeof b->raw_path, "%s/raw", b->work);
    snprintf(b->fio_path, sizeof b->fio_path, "%s/fio", b->work);
    int fd = open(b->raw_path, O_RDWR | O_CREAT, 0644);
    if (fd < 0 || fallocate(fd, 0, 0, (off_t)b->bytes) != 0) {
        fprintf(stderr, "bench ssd: %s: %s\n", b->raw_path, strerror(errno));
        if (fd >= 0) close(fd);
        return 1;
    }
    close(fd);
    kvt_ssd_params p = {.dirs = b->store_dir, .capacity_bytes = b->bytes, .block_bytes = b->block,
                        .digest = 1, .describe = "bench ssd", .io = a->io, .fresh = true,
                        .queue_depth = STORE_QD,
                        .register_base = b->mem, .register_len = b->mem_len};
    if (kvt__ssd_open(&b->s, &p) != KVT_OK)
        return fprintf(stderr, "bench ssd: open: %s\n", kvt_last_error()), 1;
    for (uint32_t i = 0; i < b->nblocks; i++) kvt__ssd_alloc(b->s);
    return 0;
}

static void teardown(bench *b)
{
    kvt__ssd_close(b->s);
    if (b->work[0]) nftw(b->work, rm_one, 16, FTW_DEPTH | FTW_PHYS);
    if (b->mem && b->mem != MAP_FAILED) munmap(b->mem, b->mem_len);
    free(b->free_bufs);
    free(b->ctx);
}

int kvt_bench_ssd_main(int argc, char **argv)
{
    bargs a;
    int rc = parse(&a, argc, argv);
    if (rc >= 0) return rc;
    bench b;
    memset(&b, 0, sizeof b);
    rc = setup(&b, &a);
    double v[6][REPS]; /* raw write, store write, raw read, store read, fio write, fio read */
    bool fio = system("command -v fio >/dev/null 2>&1") == 0;
    for (int rep = 0; rc == 0 && rep < REPS; rep++) {
        v[4][rep] = fio ? fio_pass(&b, true) : -1;
        v[0][rep] = raw_pass(&b, true);
        v[1][rep] = store_pass(&b, true);
        v[5][rep] = fio ? fio_pass(&b, false) : -1;
        v[2][rep] = raw_pass(&b, false);
        v[3][rep] = store_pass(&b, false);
        if (v[0][rep] < 0 || v[1][rep] < 0 || v[2][rep] < 0 || v[3][rep] < 0) {
            fprintf(stderr, "bench ssd: an I/O pass failed: %s\n", kvt_last_error());
            rc = 1;
        }
        if (fio && (v[4][rep] < 0 || v[5][rep] < 0)) {
            fprintf(stderr, "bench ssd: a fio pass failed (fio is installed: run it by hand on "
                            "%s to see why)\n", b.work);
            rc = 1;
        }
    }
    double rw = 0, w = 0, rr = 0, r = 0;
    if (rc == 0) {
        rw = median_of_values(v[0], REPS);
        w = median_of_values(v[1], REPS);
        rr = median_of_values(v[2], REPS);
        r = median_of_values(v[3], REPS);
    }
    double fw = rc == 0 && fio ? median_of_values(v[4], REPS) : -1;
    double fr = rc == 0 && fio ? median_of_values(v[5], REPS) : -1;
    double wr[REPS], rdr[REPS]; /* each round's ratios: the raw pass right before it */
    for (int rep = 0; rc == 0 && rep < REPS; rep++) {
        wr[rep] = v[1][rep] / v[0][rep];
        rdr[rep] = v[3][rep] / v[2][rep];
    }
    if (rc == 0 && a.json) {
        printf("{\"write_gbps\": %.3f, \"read_gbps\": %.3f, \"raw_write_gbps\": %.3f, "
               "\"raw_read_gbps\": %.3f, \"write_ratio\": %.3f, \"read_ratio\": %.3f, "
               "\"backend\": \"%s\", \"block_bytes\": %llu, \"bytes\": %llu, "
               "\"stat\": \"median of %d\", ",
               w, r, rw, rr, w / rw, r / rr, kvt__ssd_backend(b.s), (unsigned long long)b.block,
               (unsigned long long)b.bytes, REPS);
        if (fio)
            printf("\"fio_write_gbps\": %.3f, \"fio_read_gbps\": %.3f, \"fio_write_ratio\": %.3f, "
                   "\"fio_read_ratio\": %.3f, ", fw, fr, w / fw, r / fr);
        else
            printf("\"fio_write_gbps\": null, \"fio_read_gbps\": null, \"fio_write_ratio\": null, "
                   "\"fio_read_ratio\": null, \"fio\": \"not installed\", ");
        stat3_json("write_ratio_rounds", stat3_of(wr, REPS), true);
        stat3_json("read_ratio_rounds", stat3_of(rdr, REPS), true);
        bench_host_json(false);
        printf("}\n");
    } else if (rc == 0) {
        printf("ssd tier (%s, %llu KiB blocks, %llu MiB, O_DIRECT)\n"
               "  write %.2f GB/s   raw io_uring QD%u 1 MiB %.2f GB/s   ratio %.2f\n"
               "  read  %.2f GB/s   raw io_uring QD%u 1 MiB %.2f GB/s   ratio %.2f\n",
               kvt__ssd_backend(b.s), (unsigned long long)(b.block >> 10),
               (unsigned long long)(b.bytes >> 20), w, RAW_QD, rw, w / rw, r, RAW_QD, rr, r / rr);
        if (fio)
            printf("  fio io_uring QD%u 1 MiB: write %.2f GB/s (ratio %.2f), read %.2f GB/s (ratio %.2f)\n",
                   RAW_QD, fw, w / fw, fr, r / fr);
        else
            printf("  fio: not installed (scripts/deps.sh installs it), no fio yardstick\n");
        bench_host_text(stdout);
    }
    teardown(&b);
    return rc;
}
