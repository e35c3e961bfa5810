/* sock.c - TCP socket set-up for every kvtier link (sock.h). */
#include "net/sock.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include "net/fdio.h"
#include "util/err.h"

#define SOCK_BUF (4 << 20)
/* Connections the kernel queues before we accept: a group of up to 256
 * ranks joining at once, or a burst of decode ranks, plus strangers. */
#define BACKLOG 128

kvt_status kvt__sock_addr(const char *host, uint16_t port, struct sockaddr_in *sa, const char *who)
{
    memset(sa, 0, sizeof *sa);
    sa->sin_family = AF_INET;
    sa->sin_port = htons(port);
    if (inet_pton(AF_INET, host ? host : "127.0.0.1", &sa->sin_addr) != 1)
        return kvt__fail(KVT_EINVAL, "%s: host \"%s\" is not a numeric IPv4 address", who, host);
    return KVT_OK;
}

kvt_status kvt__sock_listen(const char *host, uint16_t port, const char *who, int *fd_out,
                            uint16_t *port_out)
{
    struct sockaddr_in sa;
    kvt_status st = kvt__sock_addr(host, port, &sa, who);
    if (st) return st;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return kvt__fail(KVT_ESYS, "%s: socket: %s", who, strerror(errno));
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    socklen_t sl = sizeof sa;
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(fd, BACKLOG) != 0 ||
        getsockname(fd, (struct sockaddr *)&sa, &sl) != 0) {
        int e = errno;
        close(fd);
        return kvt__fail(KVT_ESYS, "%s: bind/listen on %s:%u: %s", who, host ? host : "127.0.0.1",
                         port, strerror(e));
    }
    *fd_out = fd;
    *port_out = ntohs(sa.sin_port);
    return KVT_OK;
}

void kvt__sock_tune(int fd, bool big)
{
    int one = 1, buf = SOCK_BUF;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (big) {
        setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
    }
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
}

int kvt__sock_accept(int lfd, bool big, char peer[KVT_SOCK_PEER_MAX])
{
    struct sockaddr_in sa;
    socklen_t sl = sizeof sa;
    int fd = accept4(lfd, (struct sockaddr *)&sa, &sl, SOCK_CLOEXEC);
    if (fd < 0) return -1;
    kvt__sock_tune(fd, big);
    if (peer) {
        char ip[INET_ADDRSTRLEN] = "?";
        inet_ntop(AF_INET, &sa.sin_addr, ip, sizeof ip);
        snprintf(peer, KVT_SOCK_PEER_MAX, "%s:%u", ip, ntohs(sa.sin_port));
    }
    return fd;
}

int kvt__sock_open(bool big)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd >= 0) kvt__sock_tune(fd, big);
    return fd;
}

/* connect() on a non-blocking socket: 0, or the errno it left. */
static int start_connect(int fd, const struct sockaddr_in *sa)
{
    return connect(fd, (const struct sockaddr *)sa, sizeof *sa) == 0 ? 0 : errno;
}

/* Waits for a connect that started with error e: KVT_OK or KVT_ECONN. */
static kvt_status finish_connect(int fd, int e, uint64_t deadline_ns)
{
    if (e == EINPROGRESS && kvt__fd_wait(fd, POLLOUT, deadline_ns) == KVT_OK) {
        int err = 0;
        socklen_t el = sizeof err;
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el);
        e = err;
    }
    return e == 0 ? KVT_OK : KVT_ECONN;
}

kvt_status kvt__sock_connect_fd(int fd, const struct sockaddr_in *sa, uint64_t deadline_ns,
                                bool (*started)(void *arg), void *arg)
{
    int e = start_connect(fd, sa);
    if (!started(arg)) return KVT_ECANCELED;
    return finish_connect(fd, e, deadline_ns);
}

kvt_status kvt__sock_dial(const struct sockaddr_in *sa, bool big, uint64_t deadline_ns, int *fd_out)
{
    int fd = kvt__sock_open(big);
    if (fd < 0) return kvt__fail(KVT_ESYS, "socket: %s", strerror(errno));
    kvt_status st = finish_connect(fd, start_connect(fd, sa), deadline_ns);
    if (st) {
        close(fd);
        return st;
    }
    *fd_out = fd;
    return KVT_OK;
}
