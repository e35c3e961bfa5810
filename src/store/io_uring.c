/* io_uring.c - the io_uring backend (see io.h) through liburing.
 *
 * Submitters (any thread) prepare SQEs and submit under one mutex while
 * fewer than queue_depth requests are in flight; beyond that, requests wait
 * in an overflow FIFO and the reaper refills the ring from it in one batched
 * io_uring_submit per harvest. The reaper thread waits for CQEs with a
 * timeout (IORING_FEAT_EXT_ARG: the wait never touches the SQ, so it may run
 * beside submitters), harvests them in batches, and takes the mutex before it
 * touches any request, which also orders the submitter's writes to the
 * request before the reaper's reads (the kernel's hand-off is invisible to
 * TSan).
 *
 * Registered buffers: the range cfg->reg_base/len is registered in 1 GiB
 * pieces (the kernel's limit per buffer) when the memlock limit allows;
 * requests inside a piece use READ_FIXED/WRITE_FIXED, others plain ops. */
#include "store/io.h"

#include <errno.h>
#include <liburing.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include "util/err.h"

#define REG_PIECE (1ull << 30)
#define REG_MAX_PIECES 1024u
#define REAP_WAIT_NS 100000000ll /* reaper re-checks stop at this period */
#define QD_MAX 4096u

struct kvt_io {
    struct io_uring ring;
    pthread_mutex_t mu;
    uint32_t qd, inflight;
    kvt_io_req *ovf_head, *ovf_tail;
    bool unsubmitted; /* SQEs prepared but not yet accepted by the kernel */
    uint8_t *reg_base;
    uint64_t reg_len;
    bool registered;
    atomic_bool stop;
    pthread_t reaper;
    bool reaper_started;
    kvt_io_complete_fn complete;
    void *ctx;
    uint32_t harvest_cap;
    struct io_uring_cqe **cqes;
    kvt_io_req **done;
    int64_t *res;
};

static int reg_index(const kvt_io *io, const kvt_io_req *r)
{
    if (!io->registered) return -1;
    uint8_t *b = r->buf;
    if (b < io->reg_base || (uint64_t)(b - io->reg_base) + r->len > io->reg_len) return -1;
    uint64_t off = (uint64_t)(b - io->reg_base);
    if (off / REG_PIECE != (off + r->len - 1) / REG_PIECE) return -1; /* straddles pieces */
    return (int)(off / REG_PIECE);
}

/* Needs mu; an SQE is always free because inflight < qd <= SQ entries. */
static void prep(kvt_io *io, kvt_io_req *r)
{
    struct io_uring_sqe *sqe = io_uring_get_sqe(&io->ring);
    int idx = reg_index(io, r);
    if (r->op == KVT_IO_NOP)
        io_uring_prep_nop(sqe);
    else if (r->op == KVT_IO_READ && idx >= 0)
        io_uring_prep_read_fixed(sqe, r->fd, r->buf, r->len, r->off, idx);
    else if (r->op == KVT_IO_READ)
        io_uring_prep_read(sqe, r->fd, r->buf, r->len, r->off);
    else if (idx >= 0)
        io_uring_prep_write_fixed(sqe, r->fd, r->buf, r->len, r->off, idx);
    else
        io_uring_prep_write(sqe, r->fd, r->buf, r->len, r->off);
    io_uring_sqe_set_data(sqe, r);
    io->inflight++;
}

/* Needs mu. A failed submit leaves the SQEs in the ring; the reaper retries
 * on its next pass. */
static void flush_locked(kvt_io *io)
{
    int rc = io_uring_submit(&io->ring);
    io->unsubmitted = rc < 0 || io_uring_sq_ready(&io->ring) > 0;
}

static void refill_locked(kvt_io *io)
{
    bool any = io->unsubmitted;
    while (io->ovf_head && io->inflight < io->qd) {
        kvt_io_req *r = io->ovf_head;
        io->ovf_head = r->next;
        if (!io->ovf_head) io->ovf_tail = NULL;
        prep(io, r);
        any = true;
    }
    if (any) flush_locked(io);
}

static void uring_submit(kvt_io *io, kvt_io_req *r)
{
    r->next = NULL;
    pthread_mutex_lock(&io->mu);
    if (io->inflight < io->qd && !io->ovf_head) {
        prep(io, r);
        flush_locked(io);
    } else if (io->ovf_tail) {
        io->ovf_tail->next = r;
        io->ovf_tail = r;
    } else {
        io->ovf_head = io->ovf_tail = r;
    }
    pthread_mutex_unlock(&io->mu);
}

static uint32_t harvest(kvt_io *io)
{
    uint32_t n = io_uring_peek_batch_cqe(&io->ring, io->cqes, io->harvest_cap);
    for (uint32_t i = 0; i < n; i++) {
        io->done[i] = io_uring_cqe_get_data(io->cqes[i]);
        io->res[i] = io->cqes[i]->res;
    }
    io_uring_cq_advance(&io->ring, n);
    return n;
}

static void *reaper(void *arg)
{
    kvt_io *io = arg;
    while (!atomic_load(&io->stop)) {
        struct io_uring_cqe *cqe = NULL;
        struct __kernel_timespec ts = {0, REAP_WAIT_NS};
        int rc = io_uring_wait_cqe_timeout(&io->ring, &cqe, &ts);
        uint32_t n = rc == 0 ? harvest(io) : 0;
        pthread_mutex_lock(&io->mu);
        for (uint32_t i = 0; i < n; i++) io->done[i]->res = io->res[i];
        io->inflight -= n;
        refill_locked(io);
        pthread_mutex_unlock(&io->mu);
        if (n) io->complete(io->ctx, io->done, n);
    }
    return NULL;
}

static void register_buffers(kvt_io *io, const kvt_io_cfg *cfg)
{
    if (!cfg->reg_base || cfg->reg_len == 0) return;
    uint64_t pieces = (cfg->reg_len + REG_PIECE - 1) / REG_PIECE;
    if (pieces > REG_MAX_PIECES) return;
    struct iovec iov[REG_MAX_PIECES];
    for (uint64_t i = 0; i < pieces; i++) {
        iov[i].iov_base = (uint8_t *)cfg->reg_base + i * REG_PIECE;
        uint64_t rest = cfg->reg_len - i * REG_PIECE;
        iov[i].iov_len = rest < REG_PIECE ? rest : REG_PIECE;
    }
    /* ENOMEM under a small memlock limit: plain (unregistered) I/O works. */
    if (io_uring_register_buffers(&io->ring, iov, (unsigned)pieces) != 0) return;
    io->registered = true;
    io->reg_base = cfg->reg_base;
    io->reg_len = cfg->reg_len;
}

static void uring_destroy(kvt_io *io)
{
    if (!io) return;
    atomic_store(&io->stop, true);
    if (io->reaper_started) pthread_join(io->reaper, NULL);
    io_uring_queue_exit(&io->ring);
    pthread_mutex_destroy(&io->mu);
    free(io->cqes);
    free(io->done);
    free(io->res);
    free(io);
}

static kvt_status uring_create(kvt_io **out, const kvt_io_cfg *cfg)
{
    if (cfg->queue_depth == 0 || cfg->queue_depth > QD_MAX)
        return kvt__fail(KVT_EINVAL, "io_uring: queue_depth %u is not in 1..%u",
                         cfg->queue_depth, QD_MAX);
    kvt_io *io = calloc(1, sizeof *io);
    if (!io) return kvt__fail(KVT_ENOMEM, "io_uring: out of memory");
    int rc = io_uring_queue_init(cfg->queue_depth, &io->ring, 0);
    if (rc < 0) {
        free(io);
        return kvt__fail(KVT_EUNSUPPORTED, "io_uring_queue_init(%u): %s", cfg->queue_depth,
                         strerror(-rc));
    }
    pthread_mutex_init(&io->mu, NULL);
    io->qd = cfg->queue_depth;
    io->complete = cfg->complete;
    io->ctx = cfg->ctx;
    io->harvest_cap = io->ring.cq.ring_entries;
    io->cqes = calloc(io->harvest_cap, sizeof *io->cqes);
    io->done = calloc(io->harvest_cap, sizeof *io->done);
    io->res = calloc(io->harvest_cap, sizeof *io->res);
    if (!io->cqes || !io->done || !io->res) {
        uring_destroy(io);
        return kvt__fail(KVT_ENOMEM, "io_uring: out of memory");
    }
    if (!(io->ring.features & IORING_FEAT_EXT_ARG)) {
        uring_destroy(io);
        return kvt__fail(KVT_EUNSUPPORTED, "io_uring: kernel lacks IORING_FEAT_EXT_ARG (5.11+)");
    }
    register_buffers(io, cfg);
    rc = pthread_create(&io->reaper, NULL, reaper, io);
    if (rc != 0) {
        uring_destroy(io);
        return kvt__fail(KVT_ESYS, "io_uring: pthread_create: %s", strerror(rc));
    }
    io->reaper_started = true;
    *out = io;
    return KVT_OK;
}

bool kvt__io_uring_registered(const kvt_io *io) { return io && io->registered; }

bool kvt__io_uring_probe(void)
{
    struct io_uring ring;
    if (io_uring_queue_init(4, &ring, 0) < 0) return false;
    bool ok = (ring.features & IORING_FEAT_EXT_ARG) != 0;
    struct io_uring_probe *pr = io_uring_get_probe_ring(&ring);
    ok = ok && pr && io_uring_opcode_supported(pr, IORING_OP_READ) &&
         io_uring_opcode_supported(pr, IORING_OP_WRITE);
    if (pr) io_uring_free_probe(pr);
    struct io_uring_sqe *sqe = io_uring_get_sqe(&ring);
    struct io_uring_cqe *cqe = NULL;
    if (ok && sqe) {
        io_uring_prep_nop(sqe);
        ok = io_uring_submit_and_wait(&ring, 1) == 1 && io_uring_peek_cqe(&ring, &cqe) == 0 &&
             cqe->res == 0;
    }
    io_uring_queue_exit(&ring);
    return ok;
}

const kvt_io_ops kvt__io_uring_ops = {
    .name = "io_uring",
    .create = uring_create,
    .submit = uring_submit,
    .destroy = uring_destroy,
};
