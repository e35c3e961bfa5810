/* fuzz_server_frames.c - kvt__srv_recv_frame, the node server's and its
 * clients' frame reader, on arbitrary bytes from the other end of a Unix
 * stream socket pair (fuzz_server_proto decodes the header and payloads,
 * but not this reader: partial headers, a length the bytes do not hold, a
 * peer that closes mid-frame). The first input byte picks the path with
 * file-descriptor passing (recvmsg, as the client reads HELLO's reply) or
 * without; the rest is what the peer wrote before closing. Beyond "no
 * crash, leak or UB": every frame read is one the header decoder accepts
 * with exactly its payload, and the stream then ends in KVT_ECONN (the
 * peer closed), KVT_EPROTO or KVT_EVERSION (a bad header), never a hang
 * (each read has a deadline, and the bytes are all written first). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include "server/proto.h"
#include "util/clock.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 || size > 65536) return 0; /* within the socket's buffer: written whole */
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) != 0) return 0;
    int big = 1 << 20;
    setsockopt(sv[1], SOL_SOCKET, SO_SNDBUF, &big, sizeof big);
    setsockopt(sv[0], SOL_SOCKET, SO_RCVBUF, &big, sizeof big);
    const uint8_t *p = data + 1;
    size_t left = size - 1;
    while (left) {
        ssize_t n = write(sv[1], p, left);
        if (n <= 0) abort(); /* the buffer holds 64 KiB */
        p += n;
        left -= (size_t)n;
    }
    close(sv[1]);
    bool with_fd = data[0] & 1;
    size_t consumed = 0;
    for (;;) {
        kvt_srv_hdr h;
        uint8_t *payload = NULL;
        int fd = -1;
        kvt_status st = kvt__srv_recv_frame(sv[0], &h, &payload, with_fd ? &fd : NULL,
                                            kvt__deadline_ns(1000));
        if (st) {
            if (st != KVT_ECONN && st != KVT_EPROTO && st != KVT_EVERSION) abort();
            if (payload || fd != -1) abort();
            break;
        }
        kvt_srv_hdr again;
        if (consumed + KVT_SRV_HDR + h.len > size - 1) abort(); /* read past what was sent */
        if (kvt__srv_hdr_decode(data + 1 + consumed, &again) != KVT_OK || again.len != h.len ||
            again.op != h.op)
            abort();
        if ((h.len == 0) != (payload == NULL)) abort();
        if (h.len && memcmp(payload, data + 1 + consumed + KVT_SRV_HDR, h.len) != 0) abort();
        if (fd != -1) abort(); /* nothing was passed */
        consumed += KVT_SRV_HDR + h.len;
        free(payload);
    }
    close(sv[0]);
    return 0;
}
