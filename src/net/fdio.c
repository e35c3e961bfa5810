/* fdio.c - deadline-bounded I/O on non-blocking sockets, shared by the
 * rank mesh (tcp.c) and the client/server streams (stream_tcp.c). */
#include "net/fdio.h"

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include "util/clock.h"

static int ms_until(uint64_t deadline_ns)
{
    uint64_t now = kvt__now_ns();
    if (now >= deadline_ns) return 0;
    uint64_t ms = (deadline_ns - now + 999999) / 1000000;
    return ms > 3600000 ? 3600000 : (int)ms;
}

kvt_status kvt__fd_wait(int fd, short ev, uint64_t deadline_ns)
{
    for (;;) {
        struct pollfd p = {fd, ev, 0};
        int rc = poll(&p, 1, ms_until(deadline_ns));
        if (rc > 0) return (p.revents & (ev | POLLHUP | POLLERR)) ? KVT_OK : KVT_ECONN;
        if (rc == 0) return KVT_ETIMEDOUT;
        if (errno != EINTR) return KVT_ECONN;
    }
}

void kvt__fd_spin(int fd, uint32_t us)
{
    uint64_t end = kvt__now_ns() + (uint64_t)us * 1000;
    do {
        struct pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, 0) > 0) return;
    } while (kvt__now_ns() < end);
}

/* Advances iov past n bytes. */
static void advance(struct iovec **iov, int *cnt, size_t n)
{
    while (*cnt > 0 && n >= (*iov)->iov_len) {
        n -= (*iov)->iov_len;
        (*iov)++;
        (*cnt)--;
    }
    if (*cnt > 0 && n) {
        (*iov)->iov_base = (uint8_t *)(*iov)->iov_base + n;
        (*iov)->iov_len -= n;
    }
}

/* How many of iov's first entries (at most IOV_MAX) one call moves when it
 * moves at most max bytes: *asked gets those bytes, *last the length the
 * last entry has for the call (cut when the bound falls inside it). */
static int io_span(const struct iovec *iov, int cnt, size_t max, size_t *asked, size_t *last)
{
    size_t sum = 0;
    int k = 0;
    while (k < cnt && k < IOV_MAX) {
        if (iov[k].iov_len >= max - sum) {
            *asked = max;
            *last = max - sum;
            return k + 1;
        }
        sum += iov[k++].iov_len;
    }
    *asked = sum;
    *last = iov[k - 1].iov_len;
    return k;
}

/* Sets how many bytes must be queued before the socket reads as readable
 * (poll, wake-ups); returns whether it was set. */
static int set_lowat(int fd, size_t bytes)
{
    int v = bytes > INT_MAX ? INT_MAX : (int)bytes;
    return setsockopt(fd, SOL_SOCKET, SO_RCVLOWAT, &v, sizeof v) == 0;
}

/* Bytes waiting to be read on fd (0 when it cannot tell). */
static int queued(int fd)
{
    int n = 0;
    return ioctl(fd, FIONREAD, &n) == 0 && n > 0 ? n : 0;
}

/* A read's bounds: hard_ns for all of it and, with idle_ns > 0, idle_ns
 * without a byte arriving (a slow link that keeps moving is not a dead
 * one). moved_ns: when bytes last arrived; seen: the bytes that waited
 * below SO_RCVLOWAT at the last look. */
typedef struct read_bound {
    uint64_t hard_ns, idle_ns, moved_ns;
    int seen;
} read_bound;

static uint64_t bound_deadline(const read_bound *b)
{
    if (!b->idle_ns || b->moved_ns + b->idle_ns >= b->hard_ns) return b->hard_ns;
    return b->moved_ns + b->idle_ns;
}

/* Waits for fd to be readable (with a raised SO_RCVLOWAT: that many bytes)
 * within b. With an idle bound it looks every quarter of it at the bytes
 * waiting below the mark: more than at the last look is bytes arriving, so
 * a slow peer is not taken for a silent one, and a silent one is found
 * within 1.25 x idle_ns of its last byte. */
static kvt_status wait_readable(int fd, read_bound *b)
{
    for (;;) {
        uint64_t dl = bound_deadline(b);
        if (!b->idle_ns) return kvt__fd_wait(fd, POLLIN, dl);
        uint64_t slice = kvt__now_ns() + b->idle_ns / 4;
        kvt_status st = kvt__fd_wait(fd, POLLIN, slice < dl ? slice : dl);
        if (st != KVT_ETIMEDOUT) return st;
        int q = queued(fd);
        uint64_t now = kvt__now_ns();
        if (q > b->seen) {
            b->seen = q;
            b->moved_ns = now;
        }
        if (now >= bound_deadline(b)) return KVT_ETIMEDOUT;
    }
}

/* Moves all of iov through fd within b, at most max_call bytes a syscall.
 * Reading, landed (if any) hears the bytes landed so far after each readv;
 * with lowat, a dry socket first raises SO_RCVLOWAT to the rest of the read
 * (<= max_call: bytes the peer is sending anyway), so it wakes for a useful
 * amount, not per segment (*lowat: it was raised). Writing (hard_ns only),
 * a short write means the socket buffer is full: it sleeps until the
 * kernel reports it half drained (POLLOUT) rather than retry at once and
 * copy a few segments per syscall while the reader, maybe on the same
 * core, is still catching up. */
static kvt_status fd_loop(int fd, struct iovec *iov, int cnt, read_bound *b, int writing,
                          size_t max_call, void (*landed)(void *arg, size_t n), void *arg, int *lowat)
{
    size_t total = 0, left = 0;
    for (int i = 0; i < cnt; i++) left += iov[i].iov_len;
    while (cnt > 0 && iov->iov_len == 0) { iov++; cnt--; }
    while (cnt > 0) {
        size_t asked, last;
        int k = io_span(iov, cnt, max_call, &asked, &last);
        size_t full = iov[k - 1].iov_len;
        iov[k - 1].iov_len = last;
        ssize_t n;
        if (writing) {
            struct msghdr m = {.msg_iov = iov, .msg_iovlen = (size_t)k};
            n = sendmsg(fd, &m, MSG_NOSIGNAL);
        } else {
            n = readv(fd, iov, k);
        }
        iov[k - 1].iov_len = full;
        if (n > 0) {
            advance(&iov, &cnt, (size_t)n);
            while (cnt > 0 && iov->iov_len == 0) { iov++; cnt--; }
            total += (size_t)n;
            left -= (size_t)n;
            if (b->idle_ns) {
                b->moved_ns = kvt__now_ns();
                b->seen = 0;
            }
            if (landed) landed(arg, total);
            if (writing && cnt > 0 && (size_t)n < asked) {
                kvt_status st = kvt__fd_wait(fd, POLLOUT, b->hard_ns);
                if (st != KVT_OK) return st;
            }
            continue;
        }
        if (n == 0 && !writing) return KVT_ECONN;
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return KVT_ECONN;
        if (lowat && !writing) *lowat |= set_lowat(fd, left < max_call ? left : max_call);
        kvt_status st = writing ? kvt__fd_wait(fd, POLLOUT, b->hard_ns) : wait_readable(fd, b);
        if (st != KVT_OK) return st;
    }
    return KVT_OK;
}

kvt_status kvt__fd_io(int fd, struct iovec *iov, int cnt, uint64_t deadline_ns, int writing)
{
    read_bound b = {deadline_ns, 0, 0, 0};
    return fd_loop(fd, iov, cnt, &b, writing, SIZE_MAX, NULL, NULL, NULL);
}

kvt_status kvt__fd_readv_landed(int fd, struct iovec *iov, int cnt, uint64_t deadline_ns, uint64_t idle_ns,
                                size_t max_read, void (*landed)(void *arg, size_t n), void *arg)
{
    int lowat = 0;
    read_bound b = {deadline_ns, idle_ns, kvt__now_ns(), 0};
    kvt_status st = fd_loop(fd, iov, cnt, &b, 0, max_read, landed, arg, &lowat);
    if (lowat) set_lowat(fd, 1); /* the next frame header is 48 bytes: back to the default */
    return st;
}
