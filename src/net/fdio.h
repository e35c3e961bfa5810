/* fdio.h - deadline-bounded waits and I/O on non-blocking sockets. */
#ifndef KVT_NET_FDIO_H
#define KVT_NET_FDIO_H

#include <stdint.h>
#include <sys/uio.h>
#include "kvtier.h"

/* Waits for ev (POLLIN/POLLOUT) on fd until deadline_ns: KVT_OK,
 * KVT_ETIMEDOUT, or KVT_ECONN when the socket failed or hung up. */
kvt_status kvt__fd_wait(int fd, short ev, uint64_t deadline_ns);
/* Polls fd for input without sleeping for up to us microseconds, ending
 * as soon as it is readable (or hung up); the caller's wait follows. */
void kvt__fd_spin(int fd, uint32_t us);
/* Moves all of iov (mutated while advancing) through fd, IOV_MAX at a time,
 * by deadline_ns: KVT_OK, KVT_ETIMEDOUT, or KVT_ECONN (error or orderly
 * close while reading). */
kvt_status kvt__fd_io(int fd, struct iovec *iov, int cnt, uint64_t deadline_ns, int writing);
/* Reads all of iov (mutated) like kvt__fd_io, at most max_read bytes a
 * readv, and after each readv calls landed(arg, n) with n the bytes landed
 * so far, so the caller works on them while they are in cache. KVT_ETIMEDOUT
 * at deadline_ns, or (idle_ns > 0) once no byte arrived for idle_ns (found
 * within 1.25 x idle_ns: bytes below a raised SO_RCVLOWAT are counted at
 * quarter-idle looks). */
kvt_status kvt__fd_readv_landed(int fd, struct iovec *iov, int cnt, uint64_t deadline_ns, uint64_t idle_ns,
                                size_t max_read, void (*landed)(void *arg, size_t n), void *arg);

#endif
