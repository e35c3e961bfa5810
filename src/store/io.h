/* io.h - the SSD store's I/O backends behind one ops table: io_uring
 * (liburing) and a pread/pwrite thread pool. A backend moves bytes and
 * reports each request's result (bytes transferred or -errno) to the
 * store's complete function on a backend thread; checksums, journaling and
 * fault injection live in the store, so both backends get them alike. */
#ifndef KVT_STORE_IO_H
#define KVT_STORE_IO_H

#include <stdbool.h>
#include <stdint.h>
#include "kvtier.h"

typedef enum kvt_io_op { KVT_IO_NOP = 0, KVT_IO_READ, KVT_IO_WRITE } kvt_io_op;

/* Owned by the store (preallocated); the backend links it into its queues
 * through next and writes res. Valid from submit until complete returns. */
typedef struct kvt_io_req {
    struct kvt_io_req *next;
    kvt_io_op op;
    int fd;
    void *buf;
    uint32_t len;
    uint64_t off;
    int64_t res; /* bytes transferred, or -errno; NOP: 0 */
} kvt_io_req;

/* Called on a backend thread with n finished requests (n >= 1). */
typedef void (*kvt_io_complete_fn)(void *ctx, kvt_io_req **reqs, uint32_t n);

typedef struct kvt_io_cfg {
    uint32_t queue_depth;     /* requests in flight at the device, >= 1 */
    void *reg_base;           /* optional registered-buffer range (io_uring) */
    uint64_t reg_len;
    kvt_io_complete_fn complete;
    void *ctx;
} kvt_io_cfg;

typedef struct kvt_io kvt_io;

typedef struct kvt_io_ops {
    const char *name; /* "io_uring" or "threads" */
    kvt_status (*create)(kvt_io **out, const kvt_io_cfg *cfg);
    /* Queues r; never fails (errors come back as r->res). Any thread. */
    void (*submit)(kvt_io *io, kvt_io_req *r);
    /* Stops the backend's threads. The caller has waited for every request
     * to complete first. */
    void (*destroy)(kvt_io *io);
} kvt_io_ops;

extern const kvt_io_ops kvt__io_uring_ops;
extern const kvt_io_ops kvt__io_threads_ops;

/* true when io_uring works here: a ring can be set up and a NOP completes. */
bool kvt__io_uring_probe(void);
/* true when the last io_uring backend created registered its buffers. */
bool kvt__io_uring_registered(const kvt_io *io);

#endif
