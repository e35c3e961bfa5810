/* sock.h - the one place TCP sockets are set up: address parsing, the
 * listener, accepting and dialling, with the options every kvtier link
 * wants. Used by the rank-group transport (tcp.c) and the PD streams
 * (stream_tcp.c); the bytes then move through fdio.h and the handshake is
 * stream_auth.c's. */
#ifndef KVT_NET_SOCK_H
#define KVT_NET_SOCK_H

#include <netinet/in.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "kvtier.h"

/* "a.b.c.d:port" with room for the NUL. */
#define KVT_SOCK_PEER_MAX (INET_ADDRSTRLEN + 8)

/* host (numeric IPv4; NULL: "127.0.0.1") and port as an address.
 * KVT_EINVAL naming who and the host. */
kvt_status kvt__sock_addr(const char *host, uint16_t port, struct sockaddr_in *sa, const char *who);
/* A non-blocking listener on host:port (port 0: ephemeral); *port_out gets
 * the bound port. KVT_EINVAL (host) or KVT_ESYS naming who and the address. */
kvt_status kvt__sock_listen(const char *host, uint16_t port, const char *who, int *fd_out,
                            uint16_t *port_out);
/* Options of a connected socket: non-blocking, TCP_NODELAY (control frames
 * are small and latency bound; Nagle would add up to 40 ms an exchange),
 * and with big, 4 MiB socket buffers (fewer wake-ups on a data path). */
void kvt__sock_tune(int fd, bool big);
/* One pending connection from lfd, tuned, or -1 (none: EAGAIN; errors
 * read the same, the next poll tells again). peer (may be NULL) gets
 * "ip:port" for messages that name who connected. */
int kvt__sock_accept(int lfd, bool big, char peer[KVT_SOCK_PEER_MAX]);
/* A fresh, tuned TCP socket for kvt__sock_connect_fd; -1 with errno. */
int kvt__sock_open(bool big);
/* Connects fd to sa by deadline_ns: KVT_OK, or KVT_ECONN (refused, or not
 * by the deadline: the caller retries or gives up). started runs once the
 * connect is under way and may cancel it (KVT_ECANCELED): a
 * socket registered for interruption only then can be woken by shutdown().
 * fd stays the caller's either way. */
kvt_status kvt__sock_connect_fd(int fd, const struct sockaddr_in *sa, uint64_t deadline_ns,
                                bool (*started)(void *arg), void *arg);
/* kvt__sock_open then kvt__sock_connect_fd, closing the socket on failure:
 * KVT_OK (*fd_out set), KVT_ECONN, or KVT_ESYS (no socket, with a message). */
kvt_status kvt__sock_dial(const struct sockaddr_in *sa, bool big, uint64_t deadline_ns, int *fd_out);

#endif
