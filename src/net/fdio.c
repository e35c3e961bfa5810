/* fdio.c - deadline-bounded I/O on non-blocking sockets, shared by the
 * rank mesh (tcp.c) and the client/server streams (stream_tcp.c). */
#include "net/fdio.h"

#include <errno.h>
#include <limits.h>
#include <poll.h>
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

kvt_status kvt__fd_io(int fd, struct iovec *iov, int cnt, uint64_t deadline_ns, int writing)
{
    while (cnt > 0 && iov->iov_len == 0) { iov++; cnt--; }
    while (cnt > 0) {
        int k = cnt > IOV_MAX ? IOV_MAX : cnt;
        ssize_t n;
        if (writing) {
            struct msghdr m = {.msg_iov = iov, .msg_iovlen = (size_t)k};
            n = sendmsg(fd, &m, MSG_NOSIGNAL);
        } else {
            n = readv(fd, iov, k);
        }
        if (n > 0) {
            size_t asked = 0;
            for (int i = 0; i < k; i++) asked += iov[i].iov_len;
            advance(&iov, &cnt, (size_t)n);
            while (cnt > 0 && iov->iov_len == 0) { iov++; cnt--; }
            /* A short write means the socket buffer is full: sleep until the
             * kernel reports it half drained (POLLOUT) rather than retry at
             * once and copy a few segments per syscall while the reader,
             * maybe on the same core, is still catching up. */
            if (writing && cnt > 0 && (size_t)n < asked) {
                kvt_status st = kvt__fd_wait(fd, POLLOUT, deadline_ns);
                if (st != KVT_OK) return st;
            }
            continue;
        }
        if (n == 0 && !writing) return KVT_ECONN;
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return KVT_ECONN;
        kvt_status st = kvt__fd_wait(fd, writing ? POLLOUT : POLLIN, deadline_ns);
        if (st != KVT_OK) return st;
    }
    return KVT_OK;
}


/* How many of iov's first entries one readv takes to read at most max
 * bytes; *cut > 0: the last of them is cut to that length for the call. */
static int read_span(const struct iovec *iov, int cnt, size_t max, size_t *cut)
{
    size_t sum = 0;
    int k = 0;
    *cut = 0;
    while (k < cnt && k < IOV_MAX) {
        if (sum + iov[k].iov_len >= max) {
            *cut = max - sum;
            return k + 1;
        }
        sum += iov[k++].iov_len;
    }
    return k;
}

/* Sets how many bytes must be queued before the socket reads as readable
 * (poll, wake-ups); returns whether it was set. */
static int set_lowat(int fd, size_t bytes)
{
    int v = bytes > INT_MAX ? INT_MAX : (int)bytes;
    return setsockopt(fd, SOL_SOCKET, SO_RCVLOWAT, &v, sizeof v) == 0;
}

static kvt_status readv_landed(int fd, struct iovec *iov, int cnt, uint64_t deadline_ns, size_t max_read,
                               void (*landed)(void *arg, size_t n), void *arg, int *lowat);

kvt_status kvt__fd_readv_landed(int fd, struct iovec *iov, int cnt, uint64_t deadline_ns, size_t max_read,
                                void (*landed)(void *arg, size_t n), void *arg)
{
    int lowat = 0;
    kvt_status st = readv_landed(fd, iov, cnt, deadline_ns, max_read, landed, arg, &lowat);
    if (lowat) set_lowat(fd, 1); /* the next frame header is 48 bytes: back to the default */
    return st;
}

/* When the queue runs dry, waits for up to max_read bytes (never more than
 * the rest of this read, which the peer is sending) to be queued, not for
 * the first segment: a wake-up and a readv per ~64 KiB cost more than the
 * copy on a small VM. */
static kvt_status readv_landed(int fd, struct iovec *iov, int cnt, uint64_t deadline_ns, size_t max_read,
                               void (*landed)(void *arg, size_t n), void *arg, int *lowat)
{
    size_t total = 0, left = 0;
    for (int i = 0; i < cnt; i++) left += iov[i].iov_len;
    while (cnt > 0 && iov->iov_len == 0) { iov++; cnt--; }
    while (cnt > 0) {
        size_t cut, full;
        int k = read_span(iov, cnt, max_read, &cut);
        full = iov[k - 1].iov_len;
        if (cut) iov[k - 1].iov_len = cut;
        ssize_t n = readv(fd, iov, k);
        iov[k - 1].iov_len = full;
        if (n > 0) {
            advance(&iov, &cnt, (size_t)n);
            while (cnt > 0 && iov->iov_len == 0) { iov++; cnt--; }
            total += (size_t)n;
            left -= (size_t)n;
            landed(arg, total);
            continue;
        }
        if (n == 0) return KVT_ECONN;
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) return KVT_ECONN;
        *lowat |= set_lowat(fd, left < max_read ? left : max_read);
        kvt_status st = kvt__fd_wait(fd, POLLIN, deadline_ns);
        if (st != KVT_OK) return st;
    }
    return KVT_OK;
}
