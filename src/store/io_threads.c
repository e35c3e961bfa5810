/* io_threads.c - the pread/pwrite thread-pool backend (see io.h), used when
 * io_uring is unavailable or KVTIER_IO=threads. One FIFO under a mutex;
 * queue_depth bounds the workers (at most THREADS_MAX: each is one blocking
 * I/O in flight, and more threads than that buy nothing on one device but
 * cost stacks). */
#include "store/io.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>
#include "util/clock.h"
#include "util/err.h"
#include "util/sync.h"

#define THREADS_MAX 32u
#define IDLE_WAIT_NS 200000000ull /* workers re-check stop at this period */

struct kvt_io {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    kvt_io_req *head, *tail;
    bool stop;
    uint32_t nthreads;
    pthread_t th[THREADS_MAX];
    kvt_io_complete_fn complete;
    void *ctx;
};

/* Transfers all of r or stops at the first error or zero-byte transfer:
 * res is then what moved (short) or -errno. */
static void do_io(kvt_io_req *r)
{
    uint64_t done = 0;
    while (done < r->len) {
        uint8_t *p = (uint8_t *)r->buf + done;
        size_t n = r->len - done;
        off_t off = (off_t)(r->off + done);
        ssize_t got = r->op == KVT_IO_WRITE ? pwrite(r->fd, p, n, off) : pread(r->fd, p, n, off);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) {
            r->res = -errno;
            return;
        }
        if (got == 0) break;
        done += (uint64_t)got;
    }
    r->res = (int64_t)done;
}

static kvt_io_req *next_req(kvt_io *io)
{
    pthread_mutex_lock(&io->mu);
    while (!io->head && !io->stop)
        kvt__cond_wait_until(&io->cv, &io->mu, kvt__now_ns() + IDLE_WAIT_NS);
    kvt_io_req *r = io->head;
    if (r) {
        io->head = r->next;
        if (!io->head) io->tail = NULL;
    }
    pthread_mutex_unlock(&io->mu);
    return r;
}

static void *worker(void *arg)
{
    kvt_io *io = arg;
    kvt_io_req *r;
    while ((r = next_req(io)) != NULL) {
        if (r->op == KVT_IO_NOP)
            r->res = 0;
        else
            do_io(r);
        io->complete(io->ctx, &r, 1);
    }
    return NULL;
}

static void threads_submit(kvt_io *io, kvt_io_req *r)
{
    r->next = NULL;
    pthread_mutex_lock(&io->mu);
    if (io->tail)
        io->tail->next = r;
    else
        io->head = r;
    io->tail = r;
    pthread_cond_signal(&io->cv);
    pthread_mutex_unlock(&io->mu);
}

static void threads_destroy(kvt_io *io)
{
    if (!io) return;
    pthread_mutex_lock(&io->mu);
    io->stop = true;
    pthread_cond_broadcast(&io->cv);
    pthread_mutex_unlock(&io->mu);
    for (uint32_t i = 0; i < io->nthreads; i++) pthread_join(io->th[i], NULL);
    pthread_cond_destroy(&io->cv);
    pthread_mutex_destroy(&io->mu);
    free(io);
}

static kvt_status threads_create(kvt_io **out, const kvt_io_cfg *cfg)
{
    kvt_io *io = calloc(1, sizeof *io);
    if (!io) return kvt__fail(KVT_ENOMEM, "io threads: out of memory");
    pthread_mutex_init(&io->mu, NULL);
    int rc = kvt__cond_init(&io->cv);
    if (rc != 0) {
        pthread_mutex_destroy(&io->mu);
        free(io);
        return kvt__fail(KVT_ESYS, "io threads: pthread_cond_init: errno %d", rc);
    }
    io->complete = cfg->complete;
    io->ctx = cfg->ctx;
    uint32_t want = cfg->queue_depth < THREADS_MAX ? cfg->queue_depth : THREADS_MAX;
    for (; io->nthreads < want; io->nthreads++) {
        rc = pthread_create(&io->th[io->nthreads], NULL, worker, io);
        if (rc != 0) break;
    }
    if (io->nthreads == 0) {
        threads_destroy(io);
        return kvt__fail(KVT_ESYS, "io threads: pthread_create: errno %d", rc);
    }
    *out = io;
    return KVT_OK;
}

const kvt_io_ops kvt__io_threads_ops = {
    .name = "threads",
    .create = threads_create,
    .submit = threads_submit,
    .destroy = threads_destroy,
};
